/* json.c - strict, bounded JSON reader and a small writer (see json.h). */
#include "json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- UTF-8 ------------------------------------------------------------------- */

/* Length (1..4) of the valid UTF-8 sequence at s[0..n), storing its code
 * point, or 0 when the bytes there are not valid UTF-8 (overlong forms,
 * surrogates and code points above U+10FFFF are invalid). */
static size_t utf8_decode(const unsigned char *s, size_t n, unsigned *cp) {
    unsigned c = s[0];
    size_t k;
    unsigned v, min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if ((c & 0xE0) == 0xC0) {
        k = 2, v = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        k = 3, v = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        k = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (n < k)
        return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return k;
}

size_t mf_utf8_valid_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    unsigned cp;
    while (i < n) {
        size_t k = utf8_decode(u + i, n - i, &cp);
        if (!k)
            break;
        i += k;
    }
    return i;
}

/* ---- writer -------------------------------------------------------------------- */

static void sbuf_reserve(mf_sbuf *b, size_t extra) {
    MF_ASSERT(extra < SIZE_MAX / 2 - b->n);
    if (b->n + extra + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1)
        cap *= 2;
    b->p = mf_realloc(b->p, cap);
    b->cap = cap;
}

void mf_sbuf_add(mf_sbuf *b, const char *s, size_t n) {
    sbuf_reserve(b, n);
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void mf_sbuf_puts(mf_sbuf *b, const char *s) {
    mf_sbuf_add(b, s, strlen(s));
}

void mf_sbuf_printf(mf_sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    MF_ASSERT(k >= 0);
    sbuf_reserve(b, (size_t)k);
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

void mf_sbuf_free(mf_sbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

void mf_json_write(mf_sbuf *b, const mf_json *v) {
    switch (v->type) {
    case MF_JSON_NULL:
        mf_sbuf_puts(b, "null");
        break;
    case MF_JSON_BOOL:
        mf_sbuf_puts(b, v->boolean ? "true" : "false");
        break;
    case MF_JSON_NUMBER:
        if (v->integral && v->number >= -9007199254740992.0 && v->number <= 9007199254740992.0)
            mf_sbuf_printf(b, "%lld", (long long)v->number);
        else
            mf_sbuf_printf(b, "%.17g", v->number);
        break;
    case MF_JSON_STRING:
        mf_json_add_string(b, v->str, v->len);
        break;
    case MF_JSON_ARRAY:
    case MF_JSON_OBJECT:
        mf_sbuf_puts(b, v->type == MF_JSON_ARRAY ? "[" : "{");
        for (size_t i = 0; i < v->n; i++) {
            if (i)
                mf_sbuf_puts(b, ",");
            if (v->type == MF_JSON_OBJECT) {
                mf_json_add_string(b, v->kids[i].key, v->kids[i].key_len);
                mf_sbuf_puts(b, ":");
            }
            mf_json_write(b, &v->kids[i]);
        }
        mf_sbuf_puts(b, v->type == MF_JSON_ARRAY ? "]" : "}");
        break;
    }
}

void mf_json_add_string(mf_sbuf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    mf_sbuf_add(b, "\"", 1);
    size_t i = 0;
    while (i < n) {
        /* Copy the longest run that needs no escaping in one go. */
        size_t j = i;
        unsigned cp;
        size_t k = 0;
        while (j < n && u[j] >= 0x20 && u[j] != '"' && u[j] != '\\' &&
               (k = utf8_decode(u + j, n - j, &cp)) != 0)
            j += k;
        mf_sbuf_add(b, s + i, j - i);
        i = j;
        if (i >= n)
            break;
        unsigned char c = u[i];
        switch (c) {
        case '"': mf_sbuf_add(b, "\\\"", 2); break;
        case '\\': mf_sbuf_add(b, "\\\\", 2); break;
        case '\n': mf_sbuf_add(b, "\\n", 2); break;
        case '\r': mf_sbuf_add(b, "\\r", 2); break;
        case '\t': mf_sbuf_add(b, "\\t", 2); break;
        case '\b': mf_sbuf_add(b, "\\b", 2); break;
        case '\f': mf_sbuf_add(b, "\\f", 2); break;
        default:
            if (c < 0x20)
                mf_sbuf_printf(b, "\\u%04x", c);
            else
                mf_sbuf_add(b, "\xEF\xBF\xBD", 3); /* a byte that starts no valid sequence */
        }
        i++;
    }
    mf_sbuf_add(b, "\"", 1);
}

/* ---- reader -------------------------------------------------------------------- */

typedef struct parser {
    const unsigned char *s;
    size_t n, pos;
    size_t nodes;
    mf_error *err;
    bool failed;
} parser;

static int fail(parser *p, const char *what) {
    if (!p->failed) {
        p->failed = true;
        if (p->pos >= p->n)
            mf_errorf(p->err, "byte %zu (end of input): %s", p->pos, what);
        else
            mf_errorf(p->err, "byte %zu: %s", p->pos, what);
    }
    return -1;
}

static void skip_ws(parser *p) {
    while (p->pos < p->n && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' ||
                             p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
        p->pos++;
}

static void free_node(mf_json *v) {
    free(v->key);
    free(v->str);
    for (size_t i = 0; i < v->n; i++)
        free_node(&v->kids[i]);
    free(v->kids);
}

void mf_json_free(mf_json *v) {
    if (!v)
        return;
    free_node(v);
    free(v);
}

static int hex4(parser *p, unsigned *out) {
    if (p->n - p->pos < 4)
        return fail(p, "truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = p->s[p->pos + (size_t)i], d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return fail(p, "bad hex digit in \\u escape");
        v = v * 16 + d;
    }
    p->pos += 4;
    *out = v;
    return 0;
}

static void put_utf8(mf_sbuf *b, unsigned cp) {
    char t[4];
    size_t k;
    if (cp < 0x80) {
        t[0] = (char)cp, k = 1;
    } else if (cp < 0x800) {
        t[0] = (char)(0xC0 | (cp >> 6)), t[1] = (char)(0x80 | (cp & 0x3F)), k = 2;
    } else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12)), t[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[2] = (char)(0x80 | (cp & 0x3F)), k = 3;
    } else {
        t[0] = (char)(0xF0 | (cp >> 18)), t[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), t[3] = (char)(0x80 | (cp & 0x3F)), k = 4;
    }
    mf_sbuf_add(b, t, k);
}

/* Reads a string whose opening quote is at pos; on success *out owns a
 * NUL-terminated copy of its decoded bytes. */
static int parse_string(parser *p, char **out, size_t *out_len) {
    mf_sbuf b = {0};
    p->pos++; /* the opening quote */
    mf_sbuf_add(&b, "", 0);
    for (;;) {
        if (p->pos >= p->n) {
            mf_sbuf_free(&b);
            return fail(p, "unterminated string");
        }
        unsigned c = p->s[p->pos];
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20) {
            mf_sbuf_free(&b);
            return fail(p, "control character inside a string (escape it)");
        }
        if (c == '\\') {
            p->pos++;
            if (p->pos >= p->n) {
                mf_sbuf_free(&b);
                return fail(p, "unterminated escape");
            }
            unsigned e = p->s[p->pos++];
            const char *simple = NULL;
            switch (e) {
            case '"': simple = "\""; break;
            case '\\': simple = "\\"; break;
            case '/': simple = "/"; break;
            case 'b': simple = "\b"; break;
            case 'f': simple = "\f"; break;
            case 'n': simple = "\n"; break;
            case 'r': simple = "\r"; break;
            case 't': simple = "\t"; break;
            case 'u': break;
            default:
                p->pos--;
                mf_sbuf_free(&b);
                return fail(p, "unknown escape in a string");
            }
            if (simple) {
                mf_sbuf_add(&b, simple, 1);
                continue;
            }
            unsigned cp, lo;
            if (hex4(p, &cp)) {
                mf_sbuf_free(&b);
                return -1;
            }
            if (cp >= 0xDC00 && cp <= 0xDFFF) {
                mf_sbuf_free(&b);
                return fail(p, "unpaired low surrogate in a \\u escape");
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (p->n - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
                    mf_sbuf_free(&b);
                    return fail(p, "high surrogate not followed by a \\u low surrogate");
                }
                p->pos += 2;
                if (hex4(p, &lo)) {
                    mf_sbuf_free(&b);
                    return -1;
                }
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    mf_sbuf_free(&b);
                    return fail(p, "high surrogate not followed by a low surrogate");
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            put_utf8(&b, cp);
            continue;
        }
        unsigned cp;
        size_t k = utf8_decode(p->s + p->pos, p->n - p->pos, &cp);
        if (!k) {
            mf_sbuf_free(&b);
            return fail(p, "invalid UTF-8 inside a string");
        }
        mf_sbuf_add(&b, (const char *)p->s + p->pos, k);
        p->pos += k;
    }
    *out = b.p;
    *out_len = b.n;
    return 0;
}

static int parse_number(parser *p, mf_json *v) {
    size_t start = p->pos;
    const unsigned char *s = p->s;
    size_t i = p->pos, n = p->n;
    bool integral = true;
#define DIGIT(k) ((k) < n && s[k] >= '0' && s[k] <= '9')
    if (i < n && s[i] == '-')
        i++;
    if (!DIGIT(i)) {
        p->pos = i;
        return fail(p, "expected a digit");
    }
    if (s[i] == '0') {
        i++;
        if (DIGIT(i)) {
            p->pos = i;
            return fail(p, "leading zero in a number");
        }
    } else {
        while (DIGIT(i))
            i++;
    }
    if (i < n && s[i] == '.') {
        integral = false;
        i++;
        if (!DIGIT(i)) {
            p->pos = i;
            return fail(p, "expected a digit after '.'");
        }
        while (DIGIT(i))
            i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        integral = false;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        if (!DIGIT(i)) {
            p->pos = i;
            return fail(p, "expected a digit in the exponent");
        }
        while (DIGIT(i))
            i++;
    }
#undef DIGIT
    char buf[128];
    if (i - start >= sizeof buf)
        return fail(p, "number longer than 127 characters");
    memcpy(buf, s + start, i - start);
    buf[i - start] = 0;
    double d = strtod(buf, NULL);
    if (!isfinite(d))
        return fail(p, "number out of range");
    v->type = MF_JSON_NUMBER;
    v->number = d;
    v->integral = integral;
    p->pos = i;
    return 0;
}

static bool match_word(parser *p, const char *w) {
    size_t k = strlen(w);
    if (p->n - p->pos < k || memcmp(p->s + p->pos, w, k) != 0)
        return false;
    p->pos += k;
    return true;
}

/* Appends a zeroed node to the kids of v (an array or object). */
static mf_json *add_kid(mf_json *v, size_t *cap) {
    if (v->n == *cap) {
        *cap = *cap ? *cap * 2 : 4;
        v->kids = mf_realloc(v->kids, *cap * sizeof *v->kids);
    }
    mf_json *k = &v->kids[v->n++];
    memset(k, 0, sizeof *k);
    return k;
}

static int parse_value(parser *p, mf_json *v, int depth) {
    skip_ws(p);
    if (++p->nodes > MF_JSON_MAX_NODES)
        return fail(p, "more than 200000 values");
    if (p->pos >= p->n)
        return fail(p, "expected a value");
    unsigned c = p->s[p->pos];
    if (c == '{' || c == '[') {
        if (depth >= MF_JSON_MAX_DEPTH)
            return fail(p, "nesting deeper than 64 levels");
        bool obj = c == '{';
        char close = obj ? '}' : ']';
        v->type = obj ? MF_JSON_OBJECT : MF_JSON_ARRAY;
        p->pos++;
        size_t cap = 0;
        skip_ws(p);
        if (p->pos < p->n && p->s[p->pos] == close) {
            p->pos++;
            return 0;
        }
        for (;;) {
            skip_ws(p);
            char *key = NULL;
            size_t key_len = 0;
            if (obj) {
                if (p->pos >= p->n || p->s[p->pos] != '"')
                    return fail(p, "expected a string key in an object");
                if (parse_string(p, &key, &key_len))
                    return -1;
                skip_ws(p);
                if (p->pos >= p->n || p->s[p->pos] != ':') {
                    free(key);
                    return fail(p, "expected ':' after an object key");
                }
                p->pos++;
            }
            mf_json *k = add_kid(v, &cap);
            k->key = key;
            k->key_len = key_len;
            if (parse_value(p, k, depth + 1))
                return -1;
            skip_ws(p);
            if (p->pos < p->n && p->s[p->pos] == ',') {
                p->pos++;
                continue;
            }
            if (p->pos < p->n && p->s[p->pos] == close) {
                p->pos++;
                return 0;
            }
            return fail(p, obj ? "expected ',' or '}' in an object" : "expected ',' or ']' in an array");
        }
    }
    if (c == '"') {
        v->type = MF_JSON_STRING;
        return parse_string(p, &v->str, &v->len);
    }
    if (c == '-' || (c >= '0' && c <= '9'))
        return parse_number(p, v);
    if (match_word(p, "true")) {
        v->type = MF_JSON_BOOL;
        v->boolean = true;
        return 0;
    }
    if (match_word(p, "false")) {
        v->type = MF_JSON_BOOL;
        return 0;
    }
    if (match_word(p, "null")) {
        v->type = MF_JSON_NULL;
        return 0;
    }
    return fail(p, "expected a value");
}

mf_json *mf_json_parse(const char *text, size_t len, mf_error *err) {
    parser p = {.s = (const unsigned char *)text, .n = len, .err = err};
    mf_json *v = mf_calloc(1, sizeof *v);
    if (parse_value(&p, v, 0) == 0) {
        skip_ws(&p);
        if (p.pos == p.n)
            return v;
        fail(&p, "unexpected text after the value");
    }
    mf_json_free(v);
    return NULL;
}

const mf_json *mf_json_get(const mf_json *obj, const char *key) {
    if (!obj || obj->type != MF_JSON_OBJECT)
        return NULL;
    size_t k = strlen(key);
    for (size_t i = obj->n; i-- > 0;)
        if (obj->kids[i].key_len == k && memcmp(obj->kids[i].key, key, k) == 0)
            return &obj->kids[i];
    return NULL;
}

const char *mf_json_type_name(mf_json_type t) {
    switch (t) {
    case MF_JSON_NULL: return "null";
    case MF_JSON_BOOL: return "boolean";
    case MF_JSON_NUMBER: return "number";
    case MF_JSON_STRING: return "string";
    case MF_JSON_ARRAY: return "array";
    case MF_JSON_OBJECT: return "object";
    }
    return "?";
}
