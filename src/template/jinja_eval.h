/* jinja_eval.h - the evaluator's state and the builtins' entry points,
 * shared by jinja_eval.c and jinja_builtins.c. Private to src/template. */
#ifndef MF_JINJA_EVAL_H
#define MF_JINJA_EVAL_H

#include <stdarg.h>

#include "template/jinja_impl.h"

typedef enum jfunc_kind { JF_MACRO, JF_GLOBAL, JF_METHOD, JF_LOOP } jfunc_kind;

typedef struct jscope jscope;

struct mf_jfunc {
    jfunc_kind kind;
    const char *name;     /* global or method name */
    const jnode *macro;   /* JF_MACRO: the macro; JF_LOOP: the recursive for */
    mf_jv self;           /* JF_METHOD: the object */
    jscope *scope;        /* JF_MACRO: the scope it closes over (NULL: the
                             template's); JF_LOOP: the scope around the for */
    int depth;            /* JF_LOOP: loop.depth of the loop it belongs to */
};

struct jscope {
    jscope *parent;
    const char **names;
    mf_jv *vals;
    int n, cap;
};

typedef struct jctx {
    mf_arena *a;          /* every value made while rendering */
    mf_error *err;
    mf_jbuf out;
    jscope *root, *top, *cur;
    int depth;
    int64_t steps;        /* statements run: a budget against runaway loops */
} jctx;

#define JX_MAX_ARGS 8
typedef struct jargs {
    mf_jv pos[JX_MAX_ARGS];
    int n_pos;
    const char *kwn[JX_MAX_ARGS];
    mf_jv kwv[JX_MAX_ARGS];
    int n_kw;
} jargs;

int mf_jx_fail(jctx *X, const jnode *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
const char *mf_jx_type_name(mf_jv v);
int mf_jx_eval(jctx *X, const jnode *n, mf_jv *out);
int mf_jx_eval_args(jctx *X, const jnode *n, jargs *A);
mf_jv mf_jx_arg(const jargs *A, int i, const char *name);
mf_jv mf_jx_to_str(jctx *X, mf_jv v);
mf_jv mf_jx_getattr(jctx *X, mf_jv obj, const char *name);
int mf_jx_contains(jctx *X, const jnode *at, mf_jv hay, mf_jv needle, bool *out);
size_t mf_jx_cp_count(const char *s, size_t n);
size_t mf_jx_cp_offset(const char *s, size_t n, size_t k);

/* jinja_builtins.c */
bool mf_jx_is_method(mf_jv obj, const char *name);
int mf_jx_call_method(jctx *X, const jnode *at, mf_jv self, const char *name, const jargs *A,
                      mf_jv *out);
int mf_jx_filter(jctx *X, const jnode *at, const char *name, mf_jv v, const jargs *A, mf_jv *out);
int mf_jx_test(jctx *X, const jnode *at, const char *name, mf_jv v, const jargs *A, bool *out);

#endif
