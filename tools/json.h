/* json.h - a small JSON reader (a tree) and writer, for `minfer serve`.
 *
 * The reader takes untrusted bytes: it is strict RFC 8259 (no comments, no
 * trailing commas, no NaN), bounded (nesting depth, node count, number
 * length) and reports the first problem as one line naming the byte offset.
 * Strings come out as NUL-terminated UTF-8 with their length (a "\u0000"
 * escape makes len > strlen, so callers that need C strings check for it).
 *
 * The writer appends to a growable byte buffer; mf_json_add_string always
 * produces valid JSON text, even from bytes that are not valid UTF-8 (each
 * bad byte becomes U+FFFD). */
#ifndef MF_TOOLS_JSON_H
#define MF_TOOLS_JSON_H

#include <stdbool.h>
#include <stddef.h>

#include "base/base.h"

#define MF_JSON_MAX_DEPTH 64       /* nested arrays/objects */
#define MF_JSON_MAX_NODES 200000   /* values in one document */

typedef enum mf_json_type {
    MF_JSON_NULL,
    MF_JSON_BOOL,
    MF_JSON_NUMBER,
    MF_JSON_STRING,
    MF_JSON_ARRAY,
    MF_JSON_OBJECT,
} mf_json_type;

typedef struct mf_json mf_json;
struct mf_json {
    mf_json_type type;
    char *key;          /* member name when the parent is an object, else NULL */
    size_t key_len;
    bool boolean;       /* BOOL */
    double number;      /* NUMBER */
    bool integral;      /* NUMBER written without fraction or exponent */
    char *str;          /* STRING: UTF-8, NUL-terminated */
    size_t len;
    mf_json *kids;      /* ARRAY elements / OBJECT members, in document order */
    size_t n;
};

/* Parses the whole of text[0..len): one value, optional whitespace around it.
 * Returns a tree to free with mf_json_free, or NULL with err set to a line
 * like "byte 17: expected ':' after an object key". */
mf_json *mf_json_parse(const char *text, size_t len, mf_error *err);
void mf_json_free(mf_json *v);

/* The member of obj named key (the last one when the name repeats), or NULL
 * when obj is not an object or has no such member. */
const mf_json *mf_json_get(const mf_json *obj, const char *key);
/* "null", "boolean", "number", "string", "array", "object". */
const char *mf_json_type_name(mf_json_type t);

/* ---- writer ---------------------------------------------------------------- */

/* A growable byte buffer; p is NUL-terminated whenever n > 0. Zero-init it. */
typedef struct mf_sbuf {
    char *p;
    size_t n, cap;
} mf_sbuf;

void mf_sbuf_add(mf_sbuf *b, const char *s, size_t n);
void mf_sbuf_puts(mf_sbuf *b, const char *s);
void mf_sbuf_printf(mf_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void mf_sbuf_free(mf_sbuf *b);

/* Appends s[0..n) as a quoted JSON string: '"' and '\' escaped, control
 * characters as \n, \t, ... or \u00XX, invalid UTF-8 bytes as U+FFFD. */
void mf_json_add_string(mf_sbuf *b, const char *s, size_t n);

/* Appends v as compact JSON text (integral numbers up to 2^53 without an
 * exponent, others as %.17g): what mf_json_parse reads back to the same
 * tree. */
void mf_json_write(mf_sbuf *b, const mf_json *v);

/* Length of the longest prefix of s[0..n) that is whole, valid UTF-8. */
size_t mf_utf8_valid_prefix(const char *s, size_t n);

#endif
