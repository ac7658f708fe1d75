/* jinja_value.c - the arena, template values, and their text forms: Python's
 * str()/repr() (what Jinja prints) and JSON in and out. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/jinja.h"

/* ---- arena ---------------------------------------------------------------- */

typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} arena_block;

struct mf_arena {
    arena_block *head;
};

mf_arena *mf_arena_new(void) { return mf_calloc(1, sizeof(mf_arena)); }

void mf_arena_free(mf_arena *a) {
    if (!a)
        return;
    for (arena_block *b = a->head, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    free(a);
}

void *mf_arena_alloc(mf_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    arena_block *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        b = mf_malloc(sizeof *b + cap);
        b->cap = cap;
        b->used = 0;
        b->next = a->head;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

char *mf_arena_strndup(mf_arena *a, const char *s, size_t n) {
    char *p = mf_arena_alloc(a, n + 1);
    if (n)
        memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* ---- values ---------------------------------------------------------------- */

mf_jv mf_jv_str(mf_arena *a, const char *s, size_t n) {
    return (mf_jv){.t = MF_JV_STR, .u.s = {mf_arena_strndup(a, s, n), n}};
}

mf_jv mf_jv_cstr(mf_arena *a, const char *s) { return mf_jv_str(a, s, strlen(s)); }

mf_jv mf_jv_list(mf_arena *a) {
    return (mf_jv){.t = MF_JV_LIST, .u.l = mf_arena_alloc(a, sizeof(mf_jlist))};
}

mf_jv mf_jv_dict(mf_arena *a) {
    return (mf_jv){.t = MF_JV_DICT, .u.d = mf_arena_alloc(a, sizeof(mf_jdict))};
}

void mf_jv_list_push(mf_arena *a, mf_jv list, mf_jv v) {
    mf_jlist *l = list.u.l;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        mf_jv *nv = mf_arena_alloc(a, cap * sizeof *nv);
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

void mf_jv_dict_set(mf_arena *a, mf_jv dict, mf_jv key, mf_jv v) {
    mf_jdict *d = dict.u.d;
    for (size_t i = 0; i < d->n; i++)
        if (mf_jv_equal(d->k[i], key)) {
            d->v[i] = v;
            return;
        }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        mf_jv *nk = mf_arena_alloc(a, cap * sizeof *nk), *nv = mf_arena_alloc(a, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = key;
    d->v[d->n++] = v;
}

void mf_jv_dict_setc(mf_arena *a, mf_jv dict, const char *key, mf_jv v) {
    mf_jv_dict_set(a, dict, mf_jv_cstr(a, key), v);
}

mf_jv mf_jv_dict_get(mf_jv dict, const char *key, size_t klen) {
    if (dict.t != MF_JV_DICT)
        return mf_jv_undef();
    const mf_jdict *d = dict.u.d;
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == MF_JV_STR && d->k[i].u.s.n == klen && !memcmp(d->k[i].u.s.p, key, klen))
            return d->v[i];
    return mf_jv_undef();
}

bool mf_jv_truthy(mf_jv v) {
    switch ((mf_jv_type)v.t) {
    case MF_JV_UNDEF:
    case MF_JV_NONE: return false;
    case MF_JV_BOOL: return v.u.b;
    case MF_JV_INT: return v.u.i != 0;
    case MF_JV_FLOAT: return v.u.f != 0.0;
    case MF_JV_STR: return v.u.s.n > 0;
    case MF_JV_LIST: return v.u.l->n > 0;
    case MF_JV_DICT: return v.u.d->n > 0;
    case MF_JV_FUNC: return true;
    }
    return false;
}

static bool is_num(mf_jv v) { return v.t == MF_JV_INT || v.t == MF_JV_FLOAT || v.t == MF_JV_BOOL; }

static double num_of(mf_jv v) {
    return v.t == MF_JV_FLOAT ? v.u.f : v.t == MF_JV_INT ? (double)v.u.i : (double)v.u.b;
}

bool mf_jv_equal(mf_jv a, mf_jv b) {
    if (is_num(a) && is_num(b)) {
        if (a.t != MF_JV_FLOAT && b.t != MF_JV_FLOAT)
            return (a.t == MF_JV_INT ? a.u.i : a.u.b) == (b.t == MF_JV_INT ? b.u.i : b.u.b);
        return num_of(a) == num_of(b);
    }
    if (a.t != b.t)
        return false;
    switch ((mf_jv_type)a.t) {
    case MF_JV_UNDEF:
    case MF_JV_NONE: return true;
    case MF_JV_STR: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
    case MF_JV_LIST:
        if (a.u.l->n != b.u.l->n)
            return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!mf_jv_equal(a.u.l->v[i], b.u.l->v[i]))
                return false;
        return true;
    case MF_JV_DICT:
        if (a.u.d->n != b.u.d->n)
            return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            bool found = false;
            for (size_t j = 0; j < b.u.d->n && !found; j++)
                if (mf_jv_equal(a.u.d->k[i], b.u.d->k[j]))
                    found = mf_jv_equal(a.u.d->v[i], b.u.d->v[j]) || (j = b.u.d->n, false);
            if (!found)
                return false;
        }
        return true;
    case MF_JV_FUNC: return a.u.fn == b.u.fn;
    default: return false;
    }
}

/* ---- text forms ------------------------------------------------------------------- */

void mf_jbuf_add(mf_jbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = mf_realloc(b->p, b->cap);
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void mf_jbuf_adds(mf_jbuf *b, const char *s) { mf_jbuf_add(b, s, strlen(s)); }

/* Python's float repr: the shortest digits that round-trip, with ".0" for
 * integral values and an exponent from 1e16 up or below 1e-4. */
static void add_float(mf_jbuf *b, double f, bool json) {
    char tmp[40];
    if (isnan(f)) {
        mf_jbuf_adds(b, json ? "NaN" : "nan");
        return;
    }
    if (isinf(f)) {
        mf_jbuf_adds(b, f > 0 ? (json ? "Infinity" : "inf") : (json ? "-Infinity" : "-inf"));
        return;
    }
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f)
            break;
    }
    /* tmp holds d.ddde[+-]XX with prec digits; lay it out as Python does. */
    snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
    char digits[24];
    int nd = 0, exp10;
    const char *p = tmp;
    bool neg = *p == '-';
    if (neg)
        p++;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    if (neg)
        mf_jbuf_add(b, "-", 1);
    if (exp10 >= 16 || exp10 < -4) {
        mf_jbuf_add(b, digits, 1);
        if (nd > 1) {
            mf_jbuf_add(b, ".", 1);
            mf_jbuf_add(b, digits + 1, (size_t)nd - 1);
        }
        snprintf(tmp, sizeof tmp, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
        mf_jbuf_adds(b, tmp);
    } else if (exp10 < 0) {
        mf_jbuf_adds(b, "0.");
        for (int i = 0; i < -exp10 - 1; i++)
            mf_jbuf_add(b, "0", 1);
        mf_jbuf_add(b, digits, (size_t)nd);
    } else {
        for (int i = 0; i <= exp10; i++)
            mf_jbuf_add(b, i < nd ? &digits[i] : "0", 1);
        mf_jbuf_add(b, ".", 1);
        if (nd > exp10 + 1)
            mf_jbuf_add(b, digits + exp10 + 1, (size_t)(nd - exp10 - 1));
        else
            mf_jbuf_add(b, "0", 1);
    }
}

/* Python's repr of a str: single quotes unless the text has ' and no ". */
static void add_repr_str(mf_jbuf *b, const char *s, size_t n) {
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    mf_jbuf_add(b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[8];
        if (c == (unsigned char)q || c == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)c;
            mf_jbuf_add(b, tmp, 2);
        } else if (c == '\n') {
            mf_jbuf_adds(b, "\\n");
        } else if (c == '\r') {
            mf_jbuf_adds(b, "\\r");
        } else if (c == '\t') {
            mf_jbuf_adds(b, "\\t");
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(tmp, sizeof tmp, "\\x%02x", c);
            mf_jbuf_adds(b, tmp);
        } else {
            mf_jbuf_add(b, (const char *)&s[i], 1);
        }
    }
    mf_jbuf_add(b, &q, 1);
}

static void add_repr(mf_jbuf *b, mf_jv v) {
    if (v.t == MF_JV_STR)
        add_repr_str(b, v.u.s.p, v.u.s.n);
    else
        mf_jv_to_str(b, v);
}

void mf_jv_to_str(mf_jbuf *b, mf_jv v) {
    char tmp[32];
    switch ((mf_jv_type)v.t) {
    case MF_JV_UNDEF: mf_jbuf_add(b, "", 0); break;
    case MF_JV_NONE: mf_jbuf_adds(b, "None"); break;
    case MF_JV_BOOL: mf_jbuf_adds(b, v.u.b ? "True" : "False"); break;
    case MF_JV_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v.u.i);
        mf_jbuf_adds(b, tmp);
        break;
    case MF_JV_FLOAT: add_float(b, v.u.f, false); break;
    case MF_JV_STR: mf_jbuf_add(b, v.u.s.p, v.u.s.n); break;
    case MF_JV_LIST:
        mf_jbuf_add(b, "[", 1);
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                mf_jbuf_add(b, ", ", 2);
            add_repr(b, v.u.l->v[i]);
        }
        mf_jbuf_add(b, "]", 1);
        break;
    case MF_JV_DICT:
        mf_jbuf_add(b, "{", 1);
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i)
                mf_jbuf_add(b, ", ", 2);
            add_repr(b, v.u.d->k[i]);
            mf_jbuf_add(b, ": ", 2);
            add_repr(b, v.u.d->v[i]);
        }
        mf_jbuf_add(b, "}", 1);
        break;
    case MF_JV_FUNC: mf_jbuf_adds(b, "<function>"); break;
    }
}

static void add_json_str(mf_jbuf *b, const char *s, size_t n) {
    mf_jbuf_add(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(tmp, sizeof tmp, "\\u%04x", c);
                esc = tmp;
            }
        }
        if (esc) {
            mf_jbuf_add(b, s + run, i - run);
            mf_jbuf_adds(b, esc);
            run = i + 1;
        }
    }
    mf_jbuf_add(b, s + run, n - run);
    mf_jbuf_add(b, "\"", 1);
}

static void newline_indent(mf_jbuf *b, int indent, int level) {
    mf_jbuf_add(b, "\n", 1);
    for (int i = 0; i < indent * level; i++)
        mf_jbuf_add(b, " ", 1);
}

static int cmp_key_str(const void *x, const void *y) {
    const mf_jv *a = *(const mf_jv *const *)x, *c = *(const mf_jv *const *)y;
    size_t n = a->u.s.n < c->u.s.n ? a->u.s.n : c->u.s.n;
    int r = memcmp(a->u.s.p, c->u.s.p, n);
    return r ? r : (a->u.s.n > c->u.s.n) - (a->u.s.n < c->u.s.n);
}

static int to_json(mf_jbuf *b, mf_jv v, int indent, bool sort_keys, int level, mf_error *err) {
    char tmp[32];
    switch ((mf_jv_type)v.t) {
    case MF_JV_UNDEF: return mf_errorf(err, "tojson: an undefined value is not JSON serializable");
    case MF_JV_FUNC: return mf_errorf(err, "tojson: a function is not JSON serializable");
    case MF_JV_NONE: mf_jbuf_adds(b, "null"); return 0;
    case MF_JV_BOOL: mf_jbuf_adds(b, v.u.b ? "true" : "false"); return 0;
    case MF_JV_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v.u.i);
        mf_jbuf_adds(b, tmp);
        return 0;
    case MF_JV_FLOAT: add_float(b, v.u.f, true); return 0;
    case MF_JV_STR: add_json_str(b, v.u.s.p, v.u.s.n); return 0;
    case MF_JV_LIST:
        if (!v.u.l->n) {
            mf_jbuf_adds(b, "[]");
            return 0;
        }
        mf_jbuf_add(b, "[", 1);
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                mf_jbuf_adds(b, indent >= 0 ? "," : ", ");
            if (indent >= 0)
                newline_indent(b, indent, level + 1);
            if (to_json(b, v.u.l->v[i], indent, sort_keys, level + 1, err))
                return -1;
        }
        if (indent >= 0)
            newline_indent(b, indent, level);
        mf_jbuf_add(b, "]", 1);
        return 0;
    case MF_JV_DICT: {
        const mf_jdict *d = v.u.d;
        if (!d->n) {
            mf_jbuf_adds(b, "{}");
            return 0;
        }
        const mf_jv **order = mf_malloc(d->n * sizeof *order);
        bool all_str = true;
        for (size_t i = 0; i < d->n; i++) {
            order[i] = &d->k[i];
            all_str &= d->k[i].t == MF_JV_STR;
        }
        if (sort_keys && all_str)
            qsort(order, d->n, sizeof *order, cmp_key_str);
        mf_jbuf_add(b, "{", 1);
        int rc = 0;
        for (size_t i = 0; i < d->n && !rc; i++) {
            size_t k = (size_t)(order[i] - d->k);
            if (i)
                mf_jbuf_adds(b, indent >= 0 ? "," : ", ");
            if (indent >= 0)
                newline_indent(b, indent, level + 1);
            mf_jv key = d->k[k];
            if (key.t == MF_JV_STR) {
                add_json_str(b, key.u.s.p, key.u.s.n);
            } else {
                mf_jbuf kb = {0};
                mf_jv_to_str(&kb, key);
                add_json_str(b, kb.p ? kb.p : "", kb.n);
                free(kb.p);
            }
            mf_jbuf_adds(b, ": ");
            rc = to_json(b, d->v[k], indent, sort_keys, level + 1, err);
        }
        free(order);
        if (rc)
            return -1;
        if (indent >= 0)
            newline_indent(b, indent, level);
        mf_jbuf_add(b, "}", 1);
        return 0;
    }
    }
    return 0;
}

int mf_jv_to_json(mf_jbuf *b, mf_jv v, int indent, bool sort_keys, mf_error *err) {
    mf_jbuf_add(b, "", 0);
    return to_json(b, v, indent, sort_keys, 0, err);
}

/* ---- JSON parsing ------------------------------------------------------------------ */

typedef struct jparse {
    mf_arena *a;
    const char *s;
    size_t n, i;
    mf_error *err;
} jparse;

static void jp_ws(jparse *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' ||
                           p->s[p->i] == '\r'))
        p->i++;
}

static int jp_fail(jparse *p, const char *what) {
    return mf_errorf(p->err, "json: %s at byte %zu", what, p->i);
}

static int hex4(const char *s, uint32_t *out) {
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static size_t utf8_put(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int jp_string(jparse *p, mf_jv *out) {
    p->i++; /* opening quote */
    mf_jbuf b = {0};
    mf_jbuf_add(&b, "", 0);
    while (p->i < p->n && p->s[p->i] != '"') {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c < 0x20) {
            free(b.p);
            return jp_fail(p, "control character in a string");
        }
        if (c != '\\') {
            size_t j = p->i;
            while (j < p->n && p->s[j] != '"' && p->s[j] != '\\' && (unsigned char)p->s[j] >= 0x20)
                j++;
            mf_jbuf_add(&b, p->s + p->i, j - p->i);
            p->i = j;
            continue;
        }
        if (p->i + 1 >= p->n)
            break;
        char e = p->s[++p->i], o[4];
        p->i++;
        switch (e) {
        case '"': mf_jbuf_add(&b, "\"", 1); break;
        case '\\': mf_jbuf_add(&b, "\\", 1); break;
        case '/': mf_jbuf_add(&b, "/", 1); break;
        case 'b': mf_jbuf_add(&b, "\b", 1); break;
        case 'f': mf_jbuf_add(&b, "\f", 1); break;
        case 'n': mf_jbuf_add(&b, "\n", 1); break;
        case 'r': mf_jbuf_add(&b, "\r", 1); break;
        case 't': mf_jbuf_add(&b, "\t", 1); break;
        case 'u': {
            uint32_t cp, lo;
            if (p->i + 4 > p->n || hex4(p->s + p->i, &cp)) {
                free(b.p);
                return jp_fail(p, "bad \\u escape");
            }
            p->i += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && p->i + 6 <= p->n && p->s[p->i] == '\\' &&
                p->s[p->i + 1] == 'u' && !hex4(p->s + p->i + 2, &lo) && lo >= 0xDC00 &&
                lo < 0xE000) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p->i += 6;
            } else if (cp >= 0xD800 && cp < 0xE000) {
                cp = 0xFFFD;
            }
            mf_jbuf_add(&b, o, utf8_put(o, cp));
            break;
        }
        default: free(b.p); return jp_fail(p, "bad escape");
        }
    }
    if (p->i >= p->n) {
        free(b.p);
        return jp_fail(p, "unterminated string");
    }
    p->i++;
    *out = mf_jv_str(p->a, b.p, b.n);
    free(b.p);
    return 0;
}

static int jp_value(jparse *p, mf_jv *out, int depth) {
    jp_ws(p);
    if (p->i >= p->n)
        return jp_fail(p, "unexpected end");
    if (depth > 128)
        return jp_fail(p, "nesting deeper than 128");
    char c = p->s[p->i];
    if (c == '"')
        return jp_string(p, out);
    if (c == '[') {
        p->i++;
        *out = mf_jv_list(p->a);
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == ']') {
            p->i++;
            return 0;
        }
        for (;;) {
            mf_jv v;
            if (jp_value(p, &v, depth + 1))
                return -1;
            mf_jv_list_push(p->a, *out, v);
            jp_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == ']') {
                p->i++;
                return 0;
            }
            return jp_fail(p, "expected ',' or ']'");
        }
    }
    if (c == '{') {
        p->i++;
        *out = mf_jv_dict(p->a);
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == '}') {
            p->i++;
            return 0;
        }
        for (;;) {
            mf_jv k, v;
            jp_ws(p);
            if (p->i >= p->n || p->s[p->i] != '"')
                return jp_fail(p, "expected a string key");
            if (jp_string(p, &k))
                return -1;
            jp_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':')
                return jp_fail(p, "expected ':'");
            p->i++;
            if (jp_value(p, &v, depth + 1))
                return -1;
            mf_jv_dict_set(p->a, *out, k, v);
            jp_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == '}') {
                p->i++;
                return 0;
            }
            return jp_fail(p, "expected ',' or '}'");
        }
    }
    static const struct {
        const char *w;
        uint8_t t;
        bool b;
    } words[] = {{"true", MF_JV_BOOL, true}, {"false", MF_JV_BOOL, false}, {"null", MF_JV_NONE, 0}};
    for (size_t k = 0; k < 3; k++) {
        size_t l = strlen(words[k].w);
        if (p->n - p->i >= l && !memcmp(p->s + p->i, words[k].w, l)) {
            p->i += l;
            *out = words[k].t == MF_JV_BOOL ? mf_jv_bool(words[k].b) : mf_jv_none();
            return 0;
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        size_t j = p->i;
        bool integral = true;
        if (p->s[j] == '-')
            j++;
        if (j >= p->n || !(p->s[j] >= '0' && p->s[j] <= '9'))
            return jp_fail(p, "bad number");
        if (p->s[j] == '0' && j + 1 < p->n && p->s[j + 1] >= '0' && p->s[j + 1] <= '9')
            return jp_fail(p, "leading zero in a number");
        while (j < p->n && p->s[j] >= '0' && p->s[j] <= '9')
            j++;
        if (j < p->n && p->s[j] == '.') {
            integral = false;
            j++;
            if (j >= p->n || !(p->s[j] >= '0' && p->s[j] <= '9'))
                return jp_fail(p, "bad number");
            while (j < p->n && p->s[j] >= '0' && p->s[j] <= '9')
                j++;
        }
        if (j < p->n && (p->s[j] == 'e' || p->s[j] == 'E')) {
            integral = false;
            j++;
            if (j < p->n && (p->s[j] == '+' || p->s[j] == '-'))
                j++;
            if (j >= p->n || !(p->s[j] >= '0' && p->s[j] <= '9'))
                return jp_fail(p, "bad number");
            while (j < p->n && p->s[j] >= '0' && p->s[j] <= '9')
                j++;
        }
        char tmp[64];
        size_t l = j - p->i;
        if (l >= sizeof tmp)
            return jp_fail(p, "number longer than 63 characters");
        memcpy(tmp, p->s + p->i, l);
        tmp[l] = 0;
        p->i = j;
        if (integral) {
            char *end;
            long long v = strtoll(tmp, &end, 10);
            if (*end == 0 && !(v == LLONG_MAX || v == LLONG_MIN)) {
                *out = mf_jv_int(v);
                return 0;
            }
        }
        *out = mf_jv_float(strtod(tmp, NULL));
        return 0;
    }
    return jp_fail(p, "unexpected character");
}

int mf_jv_parse_json(mf_arena *a, const char *s, size_t n, mf_jv *out, mf_error *err) {
    jparse p = {.a = a, .s = s, .n = n, .err = err};
    if (jp_value(&p, out, 0))
        return -1;
    jp_ws(&p);
    if (p.i != n)
        return jp_fail(&p, "trailing characters");
    return 0;
}
