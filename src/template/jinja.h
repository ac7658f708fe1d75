/* jinja.h - a Jinja2 subset for the chat templates GGUF files ship
 * (tokenizer.chat_template), and the JSON-like values it renders.
 *
 * The dialect is what Hugging Face's apply_chat_template runs: an
 * ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
 * loopcontrols extension (break/continue), a tojson filter that writes
 * json.dumps(ensure_ascii=False) text, and a raise_exception global. Output
 * is meant to be byte-identical to jinja2's for the templates we test
 * (tests/py/test_template_jinja2.py).
 *
 * Values: undefined, none, bool, int, float, string (UTF-8 bytes), list,
 * dict (insertion-ordered), and callables (macros, builtins, bound methods).
 * Every value lives in an arena owned by one render (or one JSON parse), so
 * nothing is reference counted and one free releases it all.
 *
 * Errors are values: "template: LINE:COL: what" naming the place in the
 * template source. */
#ifndef MF_JINJA_H
#define MF_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

/* ---- arena ---------------------------------------------------------------- */

typedef struct mf_arena mf_arena;
mf_arena *mf_arena_new(void);
void mf_arena_free(mf_arena *a);
void *mf_arena_alloc(mf_arena *a, size_t n); /* zeroed, 16-byte aligned */
char *mf_arena_strndup(mf_arena *a, const char *s, size_t n);

/* ---- values ---------------------------------------------------------------- */

typedef enum mf_jv_type {
    MF_JV_UNDEF,
    MF_JV_NONE,
    MF_JV_BOOL,
    MF_JV_INT,
    MF_JV_FLOAT,
    MF_JV_STR,
    MF_JV_LIST,
    MF_JV_DICT,
    MF_JV_FUNC,
} mf_jv_type;

typedef struct mf_jlist mf_jlist;
typedef struct mf_jdict mf_jdict;
typedef struct mf_jfunc mf_jfunc;

typedef struct mf_jv {
    uint8_t t;            /* mf_jv_type */
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        mf_jlist *l;
        mf_jdict *d;
        mf_jfunc *fn;
    } u;
} mf_jv;

struct mf_jlist {
    mf_jv *v;
    size_t n, cap;
};

struct mf_jdict {
    mf_jv *k, *v;         /* keys are strings in practice; compared by value */
    size_t n, cap;
    bool is_ns;           /* namespace(): attributes may be assigned */
};

static inline mf_jv mf_jv_undef(void) { return (mf_jv){.t = MF_JV_UNDEF}; }
static inline mf_jv mf_jv_none(void) { return (mf_jv){.t = MF_JV_NONE}; }
static inline mf_jv mf_jv_bool(bool b) { return (mf_jv){.t = MF_JV_BOOL, .u.b = b}; }
static inline mf_jv mf_jv_int(int64_t i) { return (mf_jv){.t = MF_JV_INT, .u.i = i}; }
static inline mf_jv mf_jv_float(double f) { return (mf_jv){.t = MF_JV_FLOAT, .u.f = f}; }
mf_jv mf_jv_str(mf_arena *a, const char *s, size_t n); /* copies */
mf_jv mf_jv_cstr(mf_arena *a, const char *s);
mf_jv mf_jv_list(mf_arena *a);
mf_jv mf_jv_dict(mf_arena *a);
void mf_jv_list_push(mf_arena *a, mf_jv list, mf_jv v);
/* Sets key (replacing an existing entry in place). */
void mf_jv_dict_set(mf_arena *a, mf_jv dict, mf_jv key, mf_jv v);
void mf_jv_dict_setc(mf_arena *a, mf_jv dict, const char *key, mf_jv v);
/* The entry's value, or undefined. */
mf_jv mf_jv_dict_get(mf_jv dict, const char *key, size_t klen);

bool mf_jv_truthy(mf_jv v);
bool mf_jv_equal(mf_jv a, mf_jv b);

/* ---- text forms ------------------------------------------------------------------- */

/* A growing byte string; p is NUL-terminated once anything was added. */
typedef struct mf_jbuf {
    char *p;
    size_t n, cap;
} mf_jbuf;
void mf_jbuf_add(mf_jbuf *b, const char *s, size_t n);
void mf_jbuf_adds(mf_jbuf *b, const char *s);

/* Python's str(v) (what {{ v }} prints): None, True, 1.5, ['a', 1], {'k': 2}. */
void mf_jv_to_str(mf_jbuf *b, mf_jv v);
/* json.dumps(v, ensure_ascii=False, indent=indent (<0: none), sort_keys).
 * Fails on undefined or a callable. */
int mf_jv_to_json(mf_jbuf *b, mf_jv v, int indent, bool sort_keys, mf_error *err);
/* Parses JSON text (strict; depth <= 128) into values in a. Integers without
 * fraction or exponent that fit int64 become ints, other numbers floats. */
int mf_jv_parse_json(mf_arena *a, const char *s, size_t n, mf_jv *out, mf_error *err);

/* ---- templates --------------------------------------------------------------------- */

typedef struct mf_jinja mf_jinja;

/* Parses a template. Fails with "template: LINE:COL: ..." on a syntax error,
 * an unknown tag or an unclosed block. */
int mf_jinja_parse(const char *src, size_t len, mf_jinja **out, mf_error *err);
void mf_jinja_free(mf_jinja *t);
/* Renders with the variables of ctx (a dict: messages, tools,
 * add_generation_prompt, bos_token, ...). Returns a malloc'd string (*out,
 * length *out_len) or fails with the place and the problem
 * ("template: 3:12: raise_exception: System role not supported"). */
int mf_jinja_render(const mf_jinja *t, mf_jv ctx, char **out, size_t *out_len, mf_error *err);

#endif
