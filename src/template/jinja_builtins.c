/* jinja_builtins.c - the methods (str.strip, dict.items, ...), filters and
 * tests chat templates call, with Python's / jinja2's semantics. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/jinja_eval.h"

static bool py_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' ||
           (c >= 0x1c && c <= 0x1f);
}

static mf_jv sub(jctx *X, mf_jv s, size_t b, size_t e) { return mf_jv_str(X->a, s.u.s.p + b, e - b); }

/* str.strip family: chars NULL = whitespace. */
static mf_jv strip(jctx *X, mf_jv s, mf_jv chars, bool left, bool right) {
    size_t b = 0, e = s.u.s.n;
    bool ws = chars.t != MF_JV_STR;
#define IN_SET(c) (ws ? py_space(c) : memchr(chars.u.s.p, (c), chars.u.s.n) != NULL)
    while (left && b < e && IN_SET(s.u.s.p[b]))
        b++;
    while (right && e > b && IN_SET(s.u.s.p[e - 1]))
        e--;
#undef IN_SET
    return sub(X, s, b, e);
}

static bool prefix_of(mf_jv s, mf_jv p, bool suffix) {
    if (p.t != MF_JV_STR || p.u.s.n > s.u.s.n)
        return false;
    const char *at = suffix ? s.u.s.p + s.u.s.n - p.u.s.n : s.u.s.p;
    return !memcmp(at, p.u.s.p, p.u.s.n);
}

static mf_jv case_map(jctx *X, mf_jv s, int mode) { /* 0 lower, 1 upper, 2 title, 3 capitalize */
    char *p = mf_arena_strndup(X->a, s.u.s.p, s.u.s.n);
    bool start = true;
    for (size_t i = 0; i < s.u.s.n; i++) {
        char c = p[i];
        bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        bool up = mode == 1 || ((mode == 2 || mode == 3) && start && alpha);
        if (mode == 3 && i > 0)
            up = false;
        if (up && c >= 'a' && c <= 'z')
            p[i] = (char)(c - 32);
        else if (!up && mode != 1 && c >= 'A' && c <= 'Z')
            p[i] = (char)(c + 32);
        if (mode == 2)
            start = !alpha && !((unsigned char)c >= 0x80);
        else if (mode == 3)
            start = false;
    }
    return (mf_jv){.t = MF_JV_STR, .u.s = {p, s.u.s.n}};
}

static mf_jv replace(jctx *X, mf_jv s, mf_jv from, mf_jv to, int64_t count) {
    mf_jbuf b = {0};
    mf_jbuf_add(&b, "", 0);
    size_t i = 0;
    int64_t done = 0;
    if (!from.u.s.n) { /* Python inserts `to` between every character */
        for (size_t k = 0; k <= s.u.s.n; k++) {
            if ((count < 0 || done < count) && (k == s.u.s.n || ((unsigned char)s.u.s.p[k] & 0xC0) != 0x80)) {
                mf_jbuf_add(&b, to.u.s.p, to.u.s.n);
                done++;
            }
            if (k < s.u.s.n)
                mf_jbuf_add(&b, s.u.s.p + k, 1);
        }
    } else {
        while (i < s.u.s.n) {
            if ((count < 0 || done < count) && i + from.u.s.n <= s.u.s.n &&
                !memcmp(s.u.s.p + i, from.u.s.p, from.u.s.n)) {
                mf_jbuf_add(&b, to.u.s.p, to.u.s.n);
                i += from.u.s.n;
                done++;
            } else {
                mf_jbuf_add(&b, s.u.s.p + i, 1);
                i++;
            }
        }
    }
    mf_jv r = mf_jv_str(X->a, b.p, b.n);
    free(b.p);
    return r;
}

static int split(jctx *X, const jnode *at, mf_jv s, mf_jv sep, int64_t maxsplit, mf_jv *out) {
    *out = mf_jv_list(X->a);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, i = 0;
    int64_t k = 0;
    if (sep.t != MF_JV_STR) { /* runs of whitespace, no empty strings */
        for (;;) {
            while (i < n && py_space(p[i]))
                i++;
            if (i >= n)
                return 0;
            if (maxsplit >= 0 && k >= maxsplit) {
                size_t e = n;
                while (e > i && py_space(p[e - 1]))
                    e--;
                mf_jv_list_push(X->a, *out, sub(X, s, i, e));
                return 0;
            }
            size_t j = i;
            while (j < n && !py_space(p[j]))
                j++;
            mf_jv_list_push(X->a, *out, sub(X, s, i, j));
            k++;
            i = j;
        }
    }
    if (!sep.u.s.n)
        return mf_jx_fail(X, at, "split: empty separator");
    size_t start = 0;
    for (i = 0; i + sep.u.s.n <= n;) {
        if ((maxsplit < 0 || k < maxsplit) && !memcmp(p + i, sep.u.s.p, sep.u.s.n)) {
            mf_jv_list_push(X->a, *out, sub(X, s, start, i));
            k++;
            i += sep.u.s.n;
            start = i;
        } else {
            i++;
        }
    }
    mf_jv_list_push(X->a, *out, sub(X, s, start, n));
    return 0;
}

static const char *const str_methods[] = {"strip", "lstrip", "rstrip", "startswith", "endswith",
                                          "split", "upper", "lower", "title", "capitalize",
                                          "replace", "find", "count", "join", "splitlines", NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", NULL};

static bool in_list(const char *const *l, const char *name) {
    for (; *l; l++)
        if (!strcmp(*l, name))
            return true;
    return false;
}

bool mf_jx_is_method(mf_jv obj, const char *name) {
    if (obj.t == MF_JV_STR)
        return in_list(str_methods, name);
    if (obj.t == MF_JV_DICT)
        return in_list(dict_methods, name);
    return false;
}

static int need_str(jctx *X, const jnode *at, mf_jv v, const char *what) {
    if (v.t != MF_JV_STR)
        return mf_jx_fail(X, at, "%s needs a string argument, not %s", what, mf_jx_type_name(v));
    return 0;
}

static mf_jv items_of(jctx *X, mf_jv d) {
    mf_jv l = mf_jv_list(X->a);
    for (size_t i = 0; i < d.u.d->n; i++) {
        mf_jv pair = mf_jv_list(X->a);
        mf_jv_list_push(X->a, pair, d.u.d->k[i]);
        mf_jv_list_push(X->a, pair, d.u.d->v[i]);
        mf_jv_list_push(X->a, l, pair);
    }
    return l;
}

static int join(jctx *X, mf_jv seq, mf_jv sep, mf_jv attr, mf_jv *out) {
    mf_jbuf b = {0};
    mf_jbuf_add(&b, "", 0);
    if (seq.t == MF_JV_LIST) {
        for (size_t i = 0; i < seq.u.l->n; i++) {
            if (i && sep.t == MF_JV_STR)
                mf_jbuf_add(&b, sep.u.s.p, sep.u.s.n);
            mf_jv v = seq.u.l->v[i];
            if (attr.t == MF_JV_STR)
                v = mf_jx_getattr(X, v, mf_arena_strndup(X->a, attr.u.s.p, attr.u.s.n));
            mf_jv_to_str(&b, v);
        }
    } else if (seq.t == MF_JV_STR) {
        for (size_t i = 0; i < seq.u.s.n;) {
            size_t j = i + 1;
            while (j < seq.u.s.n && ((unsigned char)seq.u.s.p[j] & 0xC0) == 0x80)
                j++;
            if (i && sep.t == MF_JV_STR)
                mf_jbuf_add(&b, sep.u.s.p, sep.u.s.n);
            mf_jbuf_add(&b, seq.u.s.p + i, j - i);
            i = j;
        }
    }
    *out = mf_jv_str(X->a, b.p, b.n);
    free(b.p);
    return 0;
}

int mf_jx_call_method(jctx *X, const jnode *at, mf_jv self, const char *m, const jargs *A,
                      mf_jv *out) {
    mf_jv a0 = mf_jx_arg(A, 0, NULL), a1 = mf_jx_arg(A, 1, NULL);
    if (self.t == MF_JV_DICT) {
        if (!strcmp(m, "items")) {
            *out = items_of(X, self);
        } else if (!strcmp(m, "keys") || !strcmp(m, "values")) {
            *out = mf_jv_list(X->a);
            for (size_t i = 0; i < self.u.d->n; i++)
                mf_jv_list_push(X->a, *out, m[0] == 'k' ? self.u.d->k[i] : self.u.d->v[i]);
        } else { /* get */
            *out = a1.t == MF_JV_UNDEF ? mf_jv_none() : a1;
            for (size_t i = 0; i < self.u.d->n; i++)
                if (mf_jv_equal(self.u.d->k[i], a0)) {
                    *out = self.u.d->v[i];
                    break;
                }
        }
        return 0;
    }
    /* string methods */
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        *out = strip(X, self, a0, m[0] != 'r', m[0] != 'l');
        return 0;
    }
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        bool suf = m[0] == 'e', r = false;
        if (a0.t == MF_JV_LIST) {
            for (size_t i = 0; i < a0.u.l->n && !r; i++)
                r = prefix_of(self, a0.u.l->v[i], suf);
        } else {
            if (need_str(X, at, a0, m))
                return -1;
            r = prefix_of(self, a0, suf);
        }
        *out = mf_jv_bool(r);
        return 0;
    }
    if (!strcmp(m, "split")) {
        mf_jv sep = mf_jx_arg(A, 0, "sep"), mx = mf_jx_arg(A, 1, "maxsplit");
        return split(X, at, self, sep, mx.t == MF_JV_INT ? mx.u.i : -1, out);
    }
    if (!strcmp(m, "splitlines")) {
        mf_jv nl = mf_jv_str(X->a, "\n", 1);
        mf_jv s = self;
        if (s.u.s.n && s.u.s.p[s.u.s.n - 1] == '\n')
            s.u.s.n--;
        if (!self.u.s.n) {
            *out = mf_jv_list(X->a);
            return 0;
        }
        return split(X, at, s, nl, -1, out);
    }
    if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") || !strcmp(m, "capitalize")) {
        *out = case_map(X, self, m[0] == 'l' ? 0 : m[0] == 'u' ? 1 : m[0] == 't' ? 2 : 3);
        return 0;
    }
    if (!strcmp(m, "replace")) {
        mf_jv cnt = mf_jx_arg(A, 2, "count");
        if (need_str(X, at, a0, "replace") || need_str(X, at, a1, "replace"))
            return -1;
        *out = replace(X, self, a0, a1, cnt.t == MF_JV_INT ? cnt.u.i : -1);
        return 0;
    }
    if (!strcmp(m, "find") || !strcmp(m, "count")) {
        if (need_str(X, at, a0, m))
            return -1;
        int64_t pos = -1, c = 0;
        for (size_t i = 0; i + a0.u.s.n <= self.u.s.n;) {
            if (!memcmp(self.u.s.p + i, a0.u.s.p, a0.u.s.n)) {
                if (pos < 0)
                    pos = (int64_t)mf_jx_cp_count(self.u.s.p, i);
                c++;
                i += a0.u.s.n ? a0.u.s.n : 1;
            } else {
                i++;
            }
        }
        *out = mf_jv_int(m[0] == 'f' ? pos : c);
        return 0;
    }
    if (!strcmp(m, "join"))
        return join(X, a0, self, mf_jv_undef(), out);
    return mf_jx_fail(X, at, "unknown method '%s'", m);
}

/* ---- filters ------------------------------------------------------------------------------ */

static int length_of(jctx *X, const jnode *at, mf_jv v, int64_t *n) {
    switch ((mf_jv_type)v.t) {
    case MF_JV_STR: *n = (int64_t)mf_jx_cp_count(v.u.s.p, v.u.s.n); return 0;
    case MF_JV_LIST: *n = (int64_t)v.u.l->n; return 0;
    case MF_JV_DICT: *n = (int64_t)v.u.d->n; return 0;
    case MF_JV_UNDEF: *n = 0; return 0;
    default: return mf_jx_fail(X, at, "length of %s", mf_jx_type_name(v));
    }
}

/* Items of a sequence for list / select / map: a list as is, dict keys,
 * string characters. */
static int as_list(jctx *X, const jnode *at, mf_jv v, mf_jv *out) {
    if (v.t == MF_JV_LIST) {
        *out = v;
        return 0;
    }
    *out = mf_jv_list(X->a);
    if (v.t == MF_JV_DICT) {
        for (size_t i = 0; i < v.u.d->n; i++)
            mf_jv_list_push(X->a, *out, v.u.d->k[i]);
        return 0;
    }
    if (v.t == MF_JV_STR) {
        for (size_t i = 0; i < v.u.s.n;) {
            size_t j = i + 1;
            while (j < v.u.s.n && ((unsigned char)v.u.s.p[j] & 0xC0) == 0x80)
                j++;
            mf_jv_list_push(X->a, *out, mf_jv_str(X->a, v.u.s.p + i, j - i));
            i = j;
        }
        return 0;
    }
    if (v.t == MF_JV_UNDEF)
        return 0;
    return mf_jx_fail(X, at, "%s is not iterable", mf_jx_type_name(v));
}

static mf_jv attr_path(jctx *X, mf_jv v, mf_jv attr) {
    if (attr.t == MF_JV_INT)
        return v.t == MF_JV_LIST && attr.u.i >= 0 && (size_t)attr.u.i < v.u.l->n ? v.u.l->v[attr.u.i]
                                                                               : mf_jv_undef();
    if (attr.t != MF_JV_STR)
        return mf_jv_undef();
    /* "a.b" walks nested attributes, as jinja2's make_attrgetter does */
    size_t i = 0;
    while (i <= attr.u.s.n) {
        size_t j = i;
        while (j < attr.u.s.n && attr.u.s.p[j] != '.')
            j++;
        char *part = mf_arena_strndup(X->a, attr.u.s.p + i, j - i);
        mf_jv k = mf_jv_cstr(X->a, part);
        mf_jv r = mf_jv_undef();
        if (v.t == MF_JV_DICT) {
            for (size_t q = 0; q < v.u.d->n; q++)
                if (mf_jv_equal(v.u.d->k[q], k)) {
                    r = v.u.d->v[q];
                    break;
                }
            if (r.t == MF_JV_UNDEF)
                r = mf_jx_getattr(X, v, part);
        } else if (v.t != MF_JV_UNDEF) {
            r = mf_jx_getattr(X, v, part);
        }
        v = r;
        i = j + 1;
    }
    return v;
}

static int select_items(jctx *X, const jnode *at, mf_jv seq, const jargs *A, bool by_attr,
                        bool keep_true, mf_jv *out) {
    mf_jv l;
    if (as_list(X, at, seq, &l))
        return -1;
    *out = mf_jv_list(X->a);
    int first_test = by_attr ? 1 : 0;
    mf_jv tname = mf_jx_arg(A, first_test, NULL);
    jargs targs = {0};
    for (int i = first_test + 1; i < A->n_pos; i++)
        targs.pos[targs.n_pos++] = A->pos[i];
    for (size_t i = 0; i < l.u.l->n; i++) {
        mf_jv item = l.u.l->v[i];
        mf_jv v = by_attr ? attr_path(X, item, A->pos[0]) : item;
        bool r;
        if (tname.t == MF_JV_STR) {
            if (mf_jx_test(X, at, mf_arena_strndup(X->a, tname.u.s.p, tname.u.s.n), v, &targs, &r))
                return -1;
        } else {
            r = mf_jv_truthy(v);
        }
        if (r == keep_true)
            mf_jv_list_push(X->a, *out, item);
    }
    return 0;
}

static int indent(jctx *X, mf_jv s, mf_jv width, bool first, bool blank, mf_jv *out) {
    mf_jbuf ind = {0};
    mf_jbuf_add(&ind, "", 0);
    if (width.t == MF_JV_STR)
        mf_jbuf_add(&ind, width.u.s.p, width.u.s.n);
    else
        for (int64_t i = 0; i < (width.t == MF_JV_INT ? width.u.i : 4) && i < 256; i++)
            mf_jbuf_add(&ind, " ", 1);
    mf_jbuf b = {0};
    mf_jbuf_add(&b, "", 0);
    if (first)
        mf_jbuf_add(&b, ind.p, ind.n);
    /* lines of s + "\n" (jinja2's splitlines quirk): the final empty line drops */
    size_t i = 0, line = 0;
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    while (i <= n) {
        size_t j = i;
        while (j < n && p[j] != '\n')
            j++;
        if (j >= n && i >= n && line > 0)
            break;
        if (line > 0) {
            mf_jbuf_add(&b, "\n", 1);
            if (blank || j > i)
                mf_jbuf_add(&b, ind.p, ind.n);
        }
        mf_jbuf_add(&b, p + i, j - i);
        line++;
        i = j + 1;
        if (j >= n)
            break;
    }
    *out = mf_jv_str(X->a, b.p, b.n);
    free(b.p);
    free(ind.p);
    return 0;
}

int mf_jx_filter(jctx *X, const jnode *at, const char *f, mf_jv v, const jargs *A, mf_jv *out) {
    mf_jv a0 = mf_jx_arg(A, 0, NULL);
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        mf_jv def = mf_jx_arg(A, 0, "default_value"), boolean = mf_jx_arg(A, 1, "boolean");
        if (def.t == MF_JV_UNDEF)
            def = mf_jv_str(X->a, "", 0);
        bool use = v.t == MF_JV_UNDEF || (mf_jv_truthy(boolean) && !mf_jv_truthy(v));
        *out = use ? def : v;
        return 0;
    }
    if (!strcmp(f, "tojson")) {
        mf_jv ind = mf_jx_arg(A, 0, "indent"), sk = mf_jx_arg(A, 1, "sort_keys");
        mf_jbuf b = {0};
        if (mf_jv_to_json(&b, v, ind.t == MF_JV_INT ? (int)ind.u.i : -1, mf_jv_truthy(sk), X->err)) {
            free(b.p);
            char msg[300];
            snprintf(msg, sizeof msg, "%s", X->err->msg);
            return mf_jx_fail(X, at, "%s", msg);
        }
        *out = mf_jv_str(X->a, b.p, b.n);
        free(b.p);
        return 0;
    }
    if (!strcmp(f, "safe") || !strcmp(f, "string") || !strcmp(f, "e") || !strcmp(f, "escape")) {
        *out = mf_jx_to_str(X, v);
        return 0;
    }
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        int64_t n = 0;
        if (length_of(X, at, v, &n))
            return -1;
        *out = mf_jv_int(n);
        return 0;
    }
    if (!strcmp(f, "list")) {
        mf_jv l;
        if (as_list(X, at, v, &l))
            return -1;
        *out = mf_jv_list(X->a);
        for (size_t i = 0; i < l.u.l->n; i++)
            mf_jv_list_push(X->a, *out, l.u.l->v[i]);
        return 0;
    }
    if (!strcmp(f, "items")) {
        if (v.t == MF_JV_UNDEF) {
            *out = mf_jv_list(X->a);
            return 0;
        }
        if (v.t != MF_JV_DICT)
            return mf_jx_fail(X, at, "items needs a dict, not %s", mf_jx_type_name(v));
        *out = items_of(X, v);
        return 0;
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        mf_jv l;
        if (as_list(X, at, v, &l))
            return -1;
        *out = !l.u.l->n ? mf_jv_undef() : f[0] == 'f' ? l.u.l->v[0] : l.u.l->v[l.u.l->n - 1];
        return 0;
    }
    if (!strcmp(f, "reverse")) {
        if (v.t == MF_JV_STR) {
            mf_jv l;
            as_list(X, at, v, &l);
            mf_jbuf b = {0};
            mf_jbuf_add(&b, "", 0);
            for (size_t i = l.u.l->n; i-- > 0;)
                mf_jbuf_add(&b, l.u.l->v[i].u.s.p, l.u.l->v[i].u.s.n);
            *out = mf_jv_str(X->a, b.p, b.n);
            free(b.p);
            return 0;
        }
        mf_jv l;
        if (as_list(X, at, v, &l))
            return -1;
        *out = mf_jv_list(X->a);
        for (size_t i = l.u.l->n; i-- > 0;)
            mf_jv_list_push(X->a, *out, l.u.l->v[i]);
        return 0;
    }
    if (!strcmp(f, "join")) {
        mf_jv sep = mf_jx_arg(A, 0, "d"), attr = mf_jx_arg(A, 1, "attribute");
        if (sep.t == MF_JV_UNDEF)
            sep = mf_jv_str(X->a, "", 0);
        mf_jv l;
        if (as_list(X, at, v, &l))
            return -1;
        return join(X, l, sep, attr, out);
    }
    if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr") || !strcmp(f, "select") ||
        !strcmp(f, "reject")) {
        bool by_attr = strstr(f, "attr") != NULL;
        if (by_attr && A->n_pos < 1)
            return mf_jx_fail(X, at, "%s needs an attribute name", f);
        return select_items(X, at, v, A, by_attr, f[0] == 's', out);
    }
    if (!strcmp(f, "map")) {
        mf_jv attr = mf_jx_arg(A, -1, "attribute"), def = mf_jx_arg(A, -1, "default");
        mf_jv l;
        if (as_list(X, at, v, &l))
            return -1;
        *out = mf_jv_list(X->a);
        for (size_t i = 0; i < l.u.l->n; i++) {
            mf_jv r;
            if (attr.t != MF_JV_UNDEF) {
                r = attr_path(X, l.u.l->v[i], attr);
                if (r.t == MF_JV_UNDEF && def.t != MF_JV_UNDEF)
                    r = def;
            } else if (a0.t == MF_JV_STR) {
                jargs rest = {0};
                for (int k = 1; k < A->n_pos; k++)
                    rest.pos[rest.n_pos++] = A->pos[k];
                if (mf_jx_filter(X, at, mf_arena_strndup(X->a, a0.u.s.p, a0.u.s.n), l.u.l->v[i],
                                 &rest, &r))
                    return -1;
            } else {
                return mf_jx_fail(X, at, "map needs a filter name or attribute=");
            }
            mf_jv_list_push(X->a, *out, r);
        }
        return 0;
    }
    if (!strcmp(f, "int")) {
        if (v.t == MF_JV_INT) {
            *out = v;
        } else if (v.t == MF_JV_FLOAT) {
            *out = mf_jv_int((int64_t)v.u.f);
        } else if (v.t == MF_JV_BOOL) {
            *out = mf_jv_int(v.u.b);
        } else if (v.t == MF_JV_STR) {
            char *s = mf_arena_strndup(X->a, v.u.s.p, v.u.s.n), *e;
            long long r = strtoll(s, &e, 10);
            *out = mf_jv_int(*s && !*e ? r : 0);
        } else {
            *out = mf_jv_int(0);
        }
        return 0;
    }
    if (!strcmp(f, "float")) {
        if (v.t == MF_JV_STR) {
            char *s = mf_arena_strndup(X->a, v.u.s.p, v.u.s.n), *e;
            double r = strtod(s, &e);
            *out = mf_jv_float(*s && !*e ? r : 0.0);
        } else {
            *out = mf_jv_float(v.t == MF_JV_FLOAT ? v.u.f : v.t == MF_JV_INT ? (double)v.u.i
                               : v.t == MF_JV_BOOL ? v.u.b : 0.0);
        }
        return 0;
    }
    if (!strcmp(f, "abs")) {
        if (v.t == MF_JV_INT)
            *out = mf_jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        else if (v.t == MF_JV_FLOAT)
            *out = mf_jv_float(fabs(v.u.f));
        else
            return mf_jx_fail(X, at, "abs of %s", mf_jx_type_name(v));
        return 0;
    }
    /* string filters */
    if (!strcmp(f, "trim") || !strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "capitalize") ||
        !strcmp(f, "title") || !strcmp(f, "replace") || !strcmp(f, "indent")) {
        mf_jv s = mf_jx_to_str(X, v);
        if (!strcmp(f, "trim")) {
            *out = strip(X, s, mf_jx_arg(A, 0, "chars"), true, true);
        } else if (!strcmp(f, "replace")) {
            mf_jv from = mf_jx_to_str(X, a0), to = mf_jx_to_str(X, mf_jx_arg(A, 1, NULL)),
                  cnt = mf_jx_arg(A, 2, "count");
            *out = replace(X, s, from, to, cnt.t == MF_JV_INT ? cnt.u.i : -1);
        } else if (!strcmp(f, "indent")) {
            return indent(X, s, mf_jx_arg(A, 0, "width"), mf_jv_truthy(mf_jx_arg(A, 1, "first")),
                          mf_jv_truthy(mf_jx_arg(A, 2, "blank")), out);
        } else {
            *out = case_map(X, s, f[0] == 'l' ? 0 : f[0] == 'u' ? 1 : f[0] == 't' ? 2 : 3);
        }
        return 0;
    }
    return mf_jx_fail(X, at, "unknown filter '%s'", f);
}

/* ---- tests -------------------------------------------------------------------------------------- */

int mf_jx_test(jctx *X, const jnode *at, const char *t, mf_jv v, const jargs *A, bool *out) {
    mf_jv a0 = mf_jx_arg(A, 0, NULL);
    int c;
    if (!strcmp(t, "defined")) *out = v.t != MF_JV_UNDEF;
    else if (!strcmp(t, "undefined")) *out = v.t == MF_JV_UNDEF;
    else if (!strcmp(t, "none")) *out = v.t == MF_JV_NONE;
    else if (!strcmp(t, "boolean")) *out = v.t == MF_JV_BOOL;
    else if (!strcmp(t, "true")) *out = v.t == MF_JV_BOOL && v.u.b;
    else if (!strcmp(t, "false")) *out = v.t == MF_JV_BOOL && !v.u.b;
    else if (!strcmp(t, "string")) *out = v.t == MF_JV_STR;
    else if (!strcmp(t, "mapping")) *out = v.t == MF_JV_DICT;
    else if (!strcmp(t, "number")) *out = v.t == MF_JV_INT || v.t == MF_JV_FLOAT || v.t == MF_JV_BOOL;
    else if (!strcmp(t, "integer")) *out = v.t == MF_JV_INT;
    else if (!strcmp(t, "float")) *out = v.t == MF_JV_FLOAT;
    else if (!strcmp(t, "iterable"))
        *out = v.t == MF_JV_STR || v.t == MF_JV_LIST || v.t == MF_JV_DICT || v.t == MF_JV_UNDEF;
    else if (!strcmp(t, "sequence")) *out = v.t == MF_JV_STR || v.t == MF_JV_LIST || v.t == MF_JV_DICT;
    else if (!strcmp(t, "callable")) *out = v.t == MF_JV_FUNC;
    else if (!strcmp(t, "equalto") || !strcmp(t, "eq") || !strcmp(t, "==") || !strcmp(t, "sameas"))
        *out = mf_jv_equal(v, a0);
    else if (!strcmp(t, "ne") || !strcmp(t, "!=")) *out = !mf_jv_equal(v, a0);
    else if (!strcmp(t, "lt") || !strcmp(t, "le") || !strcmp(t, "gt") || !strcmp(t, "ge") ||
             !strcmp(t, "lessthan") || !strcmp(t, "greaterthan")) {
        bool num = (v.t == MF_JV_INT || v.t == MF_JV_FLOAT) && (a0.t == MF_JV_INT || a0.t == MF_JV_FLOAT);
        if (num) {
            double x = v.t == MF_JV_INT ? (double)v.u.i : v.u.f, y = a0.t == MF_JV_INT ? (double)a0.u.i : a0.u.f;
            c = (x > y) - (x < y);
        } else if (v.t == MF_JV_STR && a0.t == MF_JV_STR) {
            size_t n = v.u.s.n < a0.u.s.n ? v.u.s.n : a0.u.s.n;
            int r = memcmp(v.u.s.p, a0.u.s.p, n);
            c = r ? (r > 0) - (r < 0) : (v.u.s.n > a0.u.s.n) - (v.u.s.n < a0.u.s.n);
        } else {
            return mf_jx_fail(X, at, "test '%s' cannot order %s and %s", t, mf_jx_type_name(v),
                              mf_jx_type_name(a0));
        }
        *out = t[0] == 'l' ? (t[1] == 'e' && t[2] == 0 ? c <= 0 : c < 0)
                           : (t[1] == 'e' && t[2] == 0 ? c >= 0 : c > 0);
    } else if (!strcmp(t, "in")) {
        return mf_jx_contains(X, at, a0, v, out);
    } else if (!strcmp(t, "odd") || !strcmp(t, "even") || !strcmp(t, "divisibleby")) {
        if (v.t != MF_JV_INT)
            return mf_jx_fail(X, at, "test '%s' needs an integer, not %s", t, mf_jx_type_name(v));
        int64_t d = t[0] == 'd' ? (a0.t == MF_JV_INT ? a0.u.i : 0) : 2;
        if (!d)
            return mf_jx_fail(X, at, "divisibleby 0");
        bool div = v.u.i % d == 0;
        *out = t[0] == 'o' ? !div : div;
    } else if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        if (v.t != MF_JV_STR) {
            *out = false;
            return 0;
        }
        bool ok = true, any = false;
        for (size_t i = 0; i < v.u.s.n; i++) {
            char ch = v.u.s.p[i];
            if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')) {
                any = true;
                if ((t[0] == 'l') != (ch >= 'a' && ch <= 'z'))
                    ok = false;
            }
        }
        *out = ok && any;
    } else {
        return mf_jx_fail(X, at, "unknown test '%s'", t);
    }
    return 0;
}
