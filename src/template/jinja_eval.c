/* jinja_eval.c - renders a parsed template: scopes, statements, operators
 * with Python's semantics, attribute/item lookup as jinja2's getattr /
 * getitem, the globals (raise_exception, namespace, range). Filters, tests
 * and methods live in jinja_builtins.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/jinja_eval.h"

/* Chat templates run a few thousand statements; a template that loops for
 * hundreds of millions or writes gigabytes is broken or hostile. */
#define MAX_STEPS 20000000
#define MAX_OUTPUT (64u << 20)

/* ---- scopes -------------------------------------------------------------------- */

static jscope *scope_new(jctx *X, jscope *parent) {
    jscope *s = mf_arena_alloc(X->a, sizeof *s);
    s->parent = parent;
    return s;
}

static void scope_set(jctx *X, jscope *s, const char *name, mf_jv v) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) {
            s->vals[i] = v;
            return;
        }
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        const char **nn = mf_arena_alloc(X->a, (size_t)cap * sizeof *nn);
        mf_jv *nv = mf_arena_alloc(X->a, (size_t)cap * sizeof *nv);
        if (s->n) {
            memcpy(nn, s->names, (size_t)s->n * sizeof *nn);
            memcpy(nv, s->vals, (size_t)s->n * sizeof *nv);
        }
        s->names = nn;
        s->vals = nv;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n++] = v;
}

static mf_jv scope_get(const jscope *s, const char *name) {
    for (; s; s = s->parent)
        for (int i = 0; i < s->n; i++)
            if (!strcmp(s->names[i], name))
                return s->vals[i];
    return mf_jv_undef();
}

int mf_jx_fail(jctx *X, const jnode *at, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return mf_errorf(X->err, "template: %d:%d: %s", at ? at->line : 0, at ? at->col : 0, msg);
}

const char *mf_jx_type_name(mf_jv v) {
    static const char *const names[] = {"undefined", "none", "bool", "int", "float", "string",
                                        "list", "dict", "function"};
    return v.t < sizeof names / sizeof *names ? names[v.t] : "?";
}

/* ---- UTF-8 code points (Python indexes strings by code point) --------------------- */

size_t mf_jx_cp_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* Byte offset of code point k (k <= count). */
size_t mf_jx_cp_offset(const char *s, size_t n, size_t k) {
    size_t c = 0, i = 0;
    for (; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (c == k)
                return i;
            c++;
        }
    return n;
}

/* ---- lookups ---------------------------------------------------------------------------- */

mf_jv mf_jx_getattr(jctx *X, mf_jv obj, const char *name) {
    if (obj.t == MF_JV_DICT) {
        if (!obj.u.d->is_ns && mf_jx_is_method(obj, name)) {
            mf_jfunc *f = mf_arena_alloc(X->a, sizeof *f);
            f->kind = JF_METHOD;
            f->self = obj;
            f->name = name;
            return (mf_jv){.t = MF_JV_FUNC, .u.fn = f};
        }
        return mf_jv_dict_get(obj, name, strlen(name));
    }
    if (mf_jx_is_method(obj, name)) {
        mf_jfunc *f = mf_arena_alloc(X->a, sizeof *f);
        f->kind = JF_METHOD;
        f->self = obj;
        f->name = name;
        return (mf_jv){.t = MF_JV_FUNC, .u.fn = f};
    }
    return mf_jv_undef();
}

static int norm_index(int64_t i, size_t n, size_t *out) {
    if (i < 0)
        i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n)
        return -1;
    *out = (size_t)i;
    return 0;
}

static int getitem(jctx *X, const jnode *at, mf_jv obj, mf_jv key, mf_jv *out) {
    size_t k;
    *out = mf_jv_undef();
    if (obj.t == MF_JV_UNDEF)
        return mf_jx_fail(X, at, "cannot index an undefined value");
    if (obj.t == MF_JV_DICT) {
        for (size_t i = 0; i < obj.u.d->n; i++)
            if (mf_jv_equal(obj.u.d->k[i], key)) {
                *out = obj.u.d->v[i];
                return 0;
            }
        if (key.t == MF_JV_STR)
            *out = mf_jx_getattr(X, obj, mf_arena_strndup(X->a, key.u.s.p, key.u.s.n));
        return 0;
    }
    if ((key.t == MF_JV_INT || key.t == MF_JV_BOOL) && obj.t == MF_JV_LIST) {
        if (!norm_index(key.t == MF_JV_INT ? key.u.i : key.u.b, obj.u.l->n, &k))
            *out = obj.u.l->v[k];
        return 0;
    }
    if ((key.t == MF_JV_INT || key.t == MF_JV_BOOL) && obj.t == MF_JV_STR) {
        size_t n = mf_jx_cp_count(obj.u.s.p, obj.u.s.n);
        if (!norm_index(key.t == MF_JV_INT ? key.u.i : key.u.b, n, &k)) {
            size_t b0 = mf_jx_cp_offset(obj.u.s.p, obj.u.s.n, k),
                   b1 = mf_jx_cp_offset(obj.u.s.p, obj.u.s.n, k + 1);
            *out = mf_jv_str(X->a, obj.u.s.p + b0, b1 - b0);
        }
        return 0;
    }
    if (key.t == MF_JV_STR)
        *out = mf_jx_getattr(X, obj, mf_arena_strndup(X->a, key.u.s.p, key.u.s.n));
    return 0;
}

/* Python slice bounds over n items. */
static void slice_bounds(int64_t n, bool has_a, int64_t a, bool has_b, int64_t b, int64_t step,
                         int64_t *start, int64_t *stop) {
    if (step > 0) {
        *start = !has_a ? 0 : a < 0 ? (a + n < 0 ? 0 : a + n) : (a > n ? n : a);
        *stop = !has_b ? n : b < 0 ? (b + n < 0 ? 0 : b + n) : (b > n ? n : b);
    } else {
        *start = !has_a ? n - 1 : a < 0 ? (a + n < 0 ? -1 : a + n) : (a >= n ? n - 1 : a);
        *stop = !has_b ? -1 : b < 0 ? (b + n < 0 ? -1 : b + n) : (b >= n ? n - 1 : b);
    }
}

static int eval_slice(jctx *X, const jnode *n, mf_jv obj, mf_jv *out) {
    mf_jv part[3] = {mf_jv_none(), mf_jv_none(), mf_jv_none()};
    const jnode *pn[3] = {n->b, n->c, n->d};
    for (int i = 0; i < 3; i++) {
        if (pn[i] && mf_jx_eval(X, pn[i], &part[i]))
            return -1;
        if (part[i].t != MF_JV_NONE && part[i].t != MF_JV_INT)
            return mf_jx_fail(X, n, "slice indices must be integers, not %s", mf_jx_type_name(part[i]));
    }
    int64_t step = part[2].t == MF_JV_INT ? part[2].u.i : 1;
    if (step == 0)
        return mf_jx_fail(X, n, "slice step cannot be zero");
    if (obj.t != MF_JV_LIST && obj.t != MF_JV_STR)
        return mf_jx_fail(X, n, "cannot slice a %s", mf_jx_type_name(obj));
    size_t cnt = obj.t == MF_JV_LIST ? obj.u.l->n : mf_jx_cp_count(obj.u.s.p, obj.u.s.n);
    int64_t start, stop;
    slice_bounds((int64_t)cnt, part[0].t == MF_JV_INT, part[0].u.i, part[1].t == MF_JV_INT,
                 part[1].u.i, step, &start, &stop);
    if (obj.t == MF_JV_LIST) {
        *out = mf_jv_list(X->a);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
            mf_jv_list_push(X->a, *out, obj.u.l->v[i]);
        return 0;
    }
    mf_jbuf b = {0};
    mf_jbuf_add(&b, "", 0);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        size_t b0 = mf_jx_cp_offset(obj.u.s.p, obj.u.s.n, (size_t)i),
               b1 = mf_jx_cp_offset(obj.u.s.p, obj.u.s.n, (size_t)i + 1);
        mf_jbuf_add(&b, obj.u.s.p + b0, b1 - b0);
    }
    *out = mf_jv_str(X->a, b.p, b.n);
    free(b.p);
    return 0;
}

/* ---- operators -------------------------------------------------------------------------- */

static bool numeric(mf_jv v) { return v.t == MF_JV_INT || v.t == MF_JV_FLOAT || v.t == MF_JV_BOOL; }
static double as_f(mf_jv v) {
    return v.t == MF_JV_FLOAT ? v.u.f : v.t == MF_JV_INT ? (double)v.u.i : (double)v.u.b;
}
static int64_t as_i(mf_jv v) { return v.t == MF_JV_INT ? v.u.i : v.t == MF_JV_BOOL ? v.u.b : (int64_t)v.u.f; }

mf_jv mf_jx_to_str(jctx *X, mf_jv v) {
    if (v.t == MF_JV_STR)
        return v;
    mf_jbuf b = {0};
    mf_jbuf_add(&b, "", 0);
    mf_jv_to_str(&b, v);
    mf_jv r = mf_jv_str(X->a, b.p, b.n);
    free(b.p);
    return r;
}

static int compare(jctx *X, const jnode *at, mf_jv a, mf_jv b, int *out) {
    if (numeric(a) && numeric(b)) {
        double x = as_f(a), y = as_f(b);
        if (a.t != MF_JV_FLOAT && b.t != MF_JV_FLOAT)
            *out = (as_i(a) > as_i(b)) - (as_i(a) < as_i(b));
        else
            *out = (x > y) - (x < y);
        return 0;
    }
    if (a.t == MF_JV_STR && b.t == MF_JV_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int r = memcmp(a.u.s.p, b.u.s.p, n);
        *out = r ? (r > 0) - (r < 0) : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
        return 0;
    }
    return mf_jx_fail(X, at, "cannot order %s and %s", mf_jx_type_name(a), mf_jx_type_name(b));
}

int mf_jx_contains(jctx *X, const jnode *at, mf_jv hay, mf_jv needle, bool *out) {
    *out = false;
    switch ((mf_jv_type)hay.t) {
    case MF_JV_STR:
        if (needle.t != MF_JV_STR)
            return mf_jx_fail(X, at, "'in <string>' needs a string on the left, not %s",
                              mf_jx_type_name(needle));
        if (!needle.u.s.n) {
            *out = true;
            return 0;
        }
        for (size_t i = 0; i + needle.u.s.n <= hay.u.s.n; i++)
            if (!memcmp(hay.u.s.p + i, needle.u.s.p, needle.u.s.n)) {
                *out = true;
                break;
            }
        return 0;
    case MF_JV_LIST:
        for (size_t i = 0; i < hay.u.l->n && !*out; i++)
            *out = mf_jv_equal(hay.u.l->v[i], needle);
        return 0;
    case MF_JV_DICT:
        for (size_t i = 0; i < hay.u.d->n && !*out; i++)
            *out = mf_jv_equal(hay.u.d->k[i], needle);
        return 0;
    case MF_JV_UNDEF: return 0;
    default: return mf_jx_fail(X, at, "'in' needs a container, not %s", mf_jx_type_name(hay));
    }
}

static int arith(jctx *X, const jnode *n, int op, mf_jv a, mf_jv b, mf_jv *out) {
    if (a.t == MF_JV_UNDEF || b.t == MF_JV_UNDEF)
        return mf_jx_fail(X, n, "an undefined value in arithmetic");
    if (op == OP_ADD && a.t == MF_JV_STR && b.t == MF_JV_STR) {
        char *p = mf_arena_alloc(X->a, a.u.s.n + b.u.s.n + 1);
        memcpy(p, a.u.s.p, a.u.s.n);
        memcpy(p + a.u.s.n, b.u.s.p, b.u.s.n);
        *out = (mf_jv){.t = MF_JV_STR, .u.s = {p, a.u.s.n + b.u.s.n}};
        return 0;
    }
    if (op == OP_ADD && a.t == MF_JV_LIST && b.t == MF_JV_LIST) {
        *out = mf_jv_list(X->a);
        for (size_t i = 0; i < a.u.l->n; i++)
            mf_jv_list_push(X->a, *out, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++)
            mf_jv_list_push(X->a, *out, b.u.l->v[i]);
        return 0;
    }
    if (op == OP_MUL && ((a.t == MF_JV_STR && b.t == MF_JV_INT) || (a.t == MF_JV_INT && b.t == MF_JV_STR))) {
        mf_jv s = a.t == MF_JV_STR ? a : b;
        int64_t k = a.t == MF_JV_INT ? a.u.i : b.u.i;
        mf_jbuf buf = {0};
        mf_jbuf_add(&buf, "", 0);
        for (int64_t i = 0; i < k && buf.n < (1u << 24); i++)
            mf_jbuf_add(&buf, s.u.s.p, s.u.s.n);
        *out = mf_jv_str(X->a, buf.p, buf.n);
        free(buf.p);
        return 0;
    }
    if (!numeric(a) || !numeric(b))
        return mf_jx_fail(X, n, "unsupported operand types for arithmetic: %s and %s",
                          mf_jx_type_name(a), mf_jx_type_name(b));
    bool fl = a.t == MF_JV_FLOAT || b.t == MF_JV_FLOAT;
    if (op == OP_DIV) {
        if (as_f(b) == 0.0)
            return mf_jx_fail(X, n, "division by zero");
        *out = mf_jv_float(as_f(a) / as_f(b));
        return 0;
    }
    if (fl) {
        double x = as_f(a), y = as_f(b), r = 0;
        switch (op) {
        case OP_ADD: r = x + y; break;
        case OP_SUB: r = x - y; break;
        case OP_MUL: r = x * y; break;
        case OP_POW: r = pow(x, y); break;
        case OP_FDIV:
        case OP_MOD:
            if (y == 0.0)
                return mf_jx_fail(X, n, "division by zero");
            r = op == OP_FDIV ? floor(x / y) : x - floor(x / y) * y;
            break;
        }
        *out = mf_jv_float(r);
        return 0;
    }
    int64_t x = as_i(a), y = as_i(b), r = 0;
    switch (op) {
    case OP_ADD: r = x + y; break;
    case OP_SUB: r = x - y; break;
    case OP_MUL: r = x * y; break;
    case OP_POW:
        if (y < 0) {
            *out = mf_jv_float(pow((double)x, (double)y));
            return 0;
        }
        r = 1;
        for (int64_t i = 0; i < y && i < 64; i++)
            r *= x;
        break;
    case OP_FDIV:
    case OP_MOD: {
        if (y == 0)
            return mf_jx_fail(X, n, "integer division or modulo by zero");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) { /* Python floors */
            q--;
            m += y;
        }
        r = op == OP_FDIV ? q : m;
        break;
    }
    }
    *out = mf_jv_int(r);
    return 0;
}

/* ---- calls ------------------------------------------------------------------------------- */

int mf_jx_eval_args(jctx *X, const jnode *n, jargs *A) {
    memset(A, 0, sizeof *A);
    if (n->n_args > JX_MAX_ARGS || n->n_kw > JX_MAX_ARGS)
        return mf_jx_fail(X, n, "more than %d arguments", JX_MAX_ARGS);
    for (int i = 0; i < n->n_args; i++)
        if (mf_jx_eval(X, n->args[i], &A->pos[A->n_pos++]))
            return -1;
    for (int i = 0; i < n->n_kw; i++) {
        A->kwn[i] = n->kwn[i];
        if (mf_jx_eval(X, n->kwv[i], &A->kwv[A->n_kw++]))
            return -1;
    }
    return 0;
}

/* Argument i by position or by name, or undefined. */
mf_jv mf_jx_arg(const jargs *A, int i, const char *name) {
    if (i >= 0 && i < A->n_pos)
        return A->pos[i];
    for (int k = 0; name && k < A->n_kw; k++)
        if (!strcmp(A->kwn[k], name))
            return A->kwv[k];
    return mf_jv_undef();
}

static int render_body(jctx *X, jnode *const *body, int n, jscope *sc);

/* caller: the body of a {% call %} block, as the macro's `caller` (or undefined). */
static int call_macro(jctx *X, const jnode *at, const mf_jfunc *f, const jargs *A, mf_jv caller,
                      mf_jv *out) {
    const jnode *m = f->macro;
    if (A->n_pos > m->n_kw)
        return mf_jx_fail(X, at, "macro '%s' takes %d arguments, %d given", m->name, m->n_kw, A->n_pos);
    for (int k = 0; k < A->n_kw; k++) {
        int i = 0;
        while (i < m->n_kw && strcmp(m->kwn[i], A->kwn[k]))
            i++;
        if (i == m->n_kw)
            return mf_jx_fail(X, at, "macro '%s' takes no argument '%s'", m->name, A->kwn[k]);
    }
    if (X->depth > 64)
        return mf_jx_fail(X, at, "macro calls nested deeper than 64");
    jscope *sc = scope_new(X, f->scope ? f->scope : X->top);
    if (caller.t != MF_JV_UNDEF)
        scope_set(X, sc, "caller", caller);
    for (int i = 0; i < m->n_kw; i++) {
        mf_jv v = mf_jx_arg(A, i, m->kwn[i]);
        if (v.t == MF_JV_UNDEF && m->kwv[i] && mf_jx_eval(X, m->kwv[i], &v))
            return -1;
        scope_set(X, sc, m->kwn[i], v);
    }
    mf_jbuf saved = X->out;
    X->out = (mf_jbuf){0};
    mf_jbuf_add(&X->out, "", 0);
    X->depth++;
    jscope *saved_sc = X->cur;
    int rc = render_body(X, m->body, m->n_body, sc);
    X->cur = saved_sc;
    X->depth--;
    mf_jbuf mine = X->out;
    X->out = saved;
    if (rc < 0) {
        free(mine.p);
        return -1;
    }
    *out = mf_jv_str(X->a, mine.p, mine.n);
    free(mine.p);
    return 0;
}

/* The key under which a recursive loop's `loop` holds its callable: no
 * attribute or subscript a template writes reaches it. */
#define LOOP_CALL "\x01" "call"

static int run_for(jctx *X, const jnode *n, jscope *sc, mf_jv it, int depth);

/* loop(x): the loop's body over x one level deeper, as a string. */
static int call_loop(jctx *X, const jnode *at, const mf_jfunc *f, const jargs *A, mf_jv *out) {
    if (A->n_pos != 1 || A->n_kw)
        return mf_jx_fail(X, at, "loop() takes one iterable");
    if (X->depth > 64)
        return mf_jx_fail(X, at, "recursive loop calls nested deeper than 64");
    mf_jbuf saved = X->out;
    X->out = (mf_jbuf){0};
    mf_jbuf_add(&X->out, "", 0);
    X->depth++;
    jscope *saved_sc = X->cur;
    int rc = run_for(X, f->macro, f->scope, A->pos[0], f->depth + 1);
    X->cur = saved_sc;
    X->depth--;
    mf_jbuf mine = X->out;
    X->out = saved;
    if (rc < 0) {
        free(mine.p);
        return -1;
    }
    *out = mf_jv_str(X->a, mine.p, mine.n);
    free(mine.p);
    return 0;
}

static int call_global(jctx *X, const jnode *at, const mf_jfunc *f, const jargs *A, mf_jv *out) {
    const char *g = f->name;
    if (!strcmp(g, "raise_exception")) {
        mf_jv m = mf_jx_to_str(X, mf_jx_arg(A, 0, "message"));
        return mf_jx_fail(X, at, "raise_exception: %.*s", (int)m.u.s.n, m.u.s.p);
    }
    if (!strcmp(g, "namespace") || !strcmp(g, "dict")) {
        *out = mf_jv_dict(X->a);
        out->u.d->is_ns = g[0] == 'n';
        if (A->n_pos == 1 && A->pos[0].t == MF_JV_DICT)
            for (size_t i = 0; i < A->pos[0].u.d->n; i++)
                mf_jv_dict_set(X->a, *out, A->pos[0].u.d->k[i], A->pos[0].u.d->v[i]);
        for (int i = 0; i < A->n_kw; i++)
            mf_jv_dict_setc(X->a, *out, A->kwn[i], A->kwv[i]);
        return 0;
    }
    if (!strcmp(g, "range")) {
        int64_t a = 0, b, s = 1;
        for (int i = 0; i < A->n_pos; i++)
            if (A->pos[i].t != MF_JV_INT)
                return mf_jx_fail(X, at, "range() needs integers");
        if (A->n_pos == 1) {
            b = A->pos[0].u.i;
        } else if (A->n_pos >= 2) {
            a = A->pos[0].u.i;
            b = A->pos[1].u.i;
            if (A->n_pos == 3)
                s = A->pos[2].u.i;
        } else {
            return mf_jx_fail(X, at, "range() needs 1 to 3 arguments");
        }
        if (s == 0)
            return mf_jx_fail(X, at, "range() step cannot be zero");
        *out = mf_jv_list(X->a);
        for (int64_t i = a, k = 0; s > 0 ? i < b : i > b; i += s, k++) {
            if (k >= 100000)
                return mf_jx_fail(X, at, "range() of more than 100000 items");
            mf_jv_list_push(X->a, *out, mf_jv_int(i));
        }
        return 0;
    }
    return mf_jx_fail(X, at, "unknown function '%s'", g);
}

static int eval_call(jctx *X, const jnode *n, mf_jv *out) {
    mf_jv fn;
    if (mf_jx_eval(X, n->a, &fn))
        return -1;
    if (fn.t == MF_JV_DICT && fn.u.d->is_ns) { /* loop(x) in a recursive for */
        mf_jv lf = mf_jv_dict_get(fn, LOOP_CALL, strlen(LOOP_CALL));
        if (lf.t == MF_JV_FUNC)
            fn = lf;
    }
    if (fn.t != MF_JV_FUNC) {
        if (n->a->kind == J_NAME)
            return mf_jx_fail(X, n, "'%s' is %s, not a function", n->a->name, mf_jx_type_name(fn));
        if (n->a->kind == J_ATTR)
            return mf_jx_fail(X, n, "%s has no method '%s'", "the value", n->a->name);
        return mf_jx_fail(X, n, "%s is not callable", mf_jx_type_name(fn));
    }
    jargs A;
    if (mf_jx_eval_args(X, n, &A))
        return -1;
    switch (fn.u.fn->kind) {
    case JF_MACRO: return call_macro(X, n, fn.u.fn, &A, mf_jv_undef(), out);
    case JF_LOOP: return call_loop(X, n, fn.u.fn, &A, out);
    case JF_GLOBAL: return call_global(X, n, fn.u.fn, &A, out);
    case JF_METHOD: return mf_jx_call_method(X, n, fn.u.fn->self, fn.u.fn->name, &A, out);
    }
    return mf_jx_fail(X, n, "bad function");
}

/* ---- expressions ------------------------------------------------------------------------- */

int mf_jx_eval(jctx *X, const jnode *n, mf_jv *out) {
    mf_jv a, b;
    switch (n->kind) {
    case J_LIT: *out = n->lit; return 0;
    case J_NAME:
        *out = scope_get(X->cur, n->name);
        return 0;
    case J_ATTR:
        if (mf_jx_eval(X, n->a, &a))
            return -1;
        if (a.t == MF_JV_UNDEF)
            return mf_jx_fail(X, n, "undefined value has no attribute '%s'", n->name);
        *out = mf_jx_getattr(X, a, n->name);
        return 0;
    case J_ITEM:
        if (mf_jx_eval(X, n->a, &a) || mf_jx_eval(X, n->b, &b))
            return -1;
        return getitem(X, n, a, b, out);
    case J_SLICE:
        if (mf_jx_eval(X, n->a, &a))
            return -1;
        return eval_slice(X, n, a, out);
    case J_CALL: return eval_call(X, n, out);
    case J_FILTER: {
        if (mf_jx_eval(X, n->a, &a))
            return -1;
        jargs A;
        if (mf_jx_eval_args(X, n, &A))
            return -1;
        return mf_jx_filter(X, n, n->name, a, &A, out);
    }
    case J_TEST: {
        if (mf_jx_eval(X, n->a, &a))
            return -1;
        jargs A;
        if (mf_jx_eval_args(X, n, &A))
            return -1;
        bool r;
        if (mf_jx_test(X, n, n->name, a, &A, &r))
            return -1;
        *out = mf_jv_bool(n->op ? !r : r);
        return 0;
    }
    case J_NEG:
        if (mf_jx_eval(X, n->a, &a))
            return -1;
        if (a.t == MF_JV_INT || a.t == MF_JV_BOOL)
            *out = mf_jv_int(-as_i(a));
        else if (a.t == MF_JV_FLOAT)
            *out = mf_jv_float(-a.u.f);
        else
            return mf_jx_fail(X, n, "cannot negate %s", mf_jx_type_name(a));
        return 0;
    case J_NOT:
        if (mf_jx_eval(X, n->a, &a))
            return -1;
        *out = mf_jv_bool(!mf_jv_truthy(a));
        return 0;
    case J_AND:
        if (mf_jx_eval(X, n->a, &a))
            return -1;
        if (!mf_jv_truthy(a)) {
            *out = a;
            return 0;
        }
        return mf_jx_eval(X, n->b, out);
    case J_OR:
        if (mf_jx_eval(X, n->a, &a))
            return -1;
        if (mf_jv_truthy(a)) {
            *out = a;
            return 0;
        }
        return mf_jx_eval(X, n->b, out);
    case J_COND:
        if (mf_jx_eval(X, n->a, &a))
            return -1;
        if (mf_jv_truthy(a))
            return mf_jx_eval(X, n->b, out);
        if (n->c)
            return mf_jx_eval(X, n->c, out);
        *out = mf_jv_undef();
        return 0;
    case J_LISTLIT:
        *out = mf_jv_list(X->a);
        for (int i = 0; i < n->n_args; i++) {
            if (mf_jx_eval(X, n->args[i], &a))
                return -1;
            mf_jv_list_push(X->a, *out, a);
        }
        return 0;
    case J_DICTLIT:
        *out = mf_jv_dict(X->a);
        for (int i = 0; i < n->n_args; i++) {
            if (mf_jx_eval(X, n->args[i], &a) || mf_jx_eval(X, n->kwv[i], &b))
                return -1;
            mf_jv_dict_set(X->a, *out, a, b);
        }
        return 0;
    case J_BIN: {
        if (mf_jx_eval(X, n->a, &a) || mf_jx_eval(X, n->b, &b))
            return -1;
        int c = 0;
        bool in;
        switch (n->op) {
        case OP_EQ: *out = mf_jv_bool(mf_jv_equal(a, b)); return 0;
        case OP_NE: *out = mf_jv_bool(!mf_jv_equal(a, b)); return 0;
        case OP_LT:
        case OP_LE:
        case OP_GT:
        case OP_GE:
            if (compare(X, n, a, b, &c))
                return -1;
            *out = mf_jv_bool(n->op == OP_LT ? c < 0 : n->op == OP_LE ? c <= 0
                              : n->op == OP_GT ? c > 0 : c >= 0);
            return 0;
        case OP_IN:
        case OP_NOTIN:
            if (mf_jx_contains(X, n, b, a, &in))
                return -1;
            *out = mf_jv_bool(n->op == OP_IN ? in : !in);
            return 0;
        case OP_CAT: {
            mf_jv x = mf_jx_to_str(X, a), y = mf_jx_to_str(X, b);
            return arith(X, n, OP_ADD, x, y, out);
        }
        default: return arith(X, n, n->op, a, b, out);
        }
    }
    default: return mf_jx_fail(X, n, "not an expression");
    }
}

/* ---- statements ---------------------------------------------------------------------------- */

enum { FLOW_OK = 0, FLOW_BREAK = 1, FLOW_CONTINUE = 2 };

static int assign_targets(jctx *X, const jnode *n, jscope *sc, mf_jv v) {
    if (n->n_names == 1) {
        scope_set(X, sc, n->names[0], v);
        return 0;
    }
    if (v.t != MF_JV_LIST || v.u.l->n != (size_t)n->n_names)
        return mf_jx_fail(X, n, "cannot unpack %s into %d names", mf_jx_type_name(v), n->n_names);
    for (int i = 0; i < n->n_names; i++)
        scope_set(X, sc, n->names[i], v.u.l->v[i]);
    return 0;
}

static int run_for(jctx *X, const jnode *n, jscope *sc, mf_jv it, int depth) {
    mf_jv items;
    if (it.t == MF_JV_DICT) {
        items = mf_jv_list(X->a);
        for (size_t i = 0; i < it.u.d->n; i++)
            mf_jv_list_push(X->a, items, it.u.d->k[i]);
    } else if (it.t == MF_JV_STR) {
        items = mf_jv_list(X->a);
        for (size_t i = 0; i < it.u.s.n;) {
            size_t j = i + 1;
            while (j < it.u.s.n && ((unsigned char)it.u.s.p[j] & 0xC0) == 0x80)
                j++;
            mf_jv_list_push(X->a, items, mf_jv_str(X->a, it.u.s.p + i, j - i));
            i = j;
        }
    } else if (it.t == MF_JV_LIST) {
        items = it;
    } else if (it.t == MF_JV_UNDEF) {
        items = mf_jv_list(X->a);
    } else {
        return mf_jx_fail(X, n, "cannot loop over %s", mf_jx_type_name(it));
    }
    jscope *ls = scope_new(X, sc);
    if (n->c) { /* for x in y if cond: the filter runs first, loop.* counts survivors */
        mf_jv kept = mf_jv_list(X->a);
        for (size_t i = 0; i < items.u.l->n; i++) {
            if (assign_targets(X, n, ls, items.u.l->v[i]))
                return -1;
            mf_jv c;
            jscope *saved = X->cur;
            X->cur = ls;
            int rc = mf_jx_eval(X, n->c, &c);
            X->cur = saved;
            if (rc)
                return -1;
            if (mf_jv_truthy(c))
                mf_jv_list_push(X->a, kept, items.u.l->v[i]);
        }
        items = kept;
    }
    size_t cnt = items.u.l->n;
    if (!cnt)
        return render_body(X, n->els, n->n_els, sc);
    for (size_t i = 0; i < cnt; i++) {
        if (++X->steps > MAX_STEPS)
            return mf_jx_fail(X, n, "the template ran more than %d statements", MAX_STEPS);
        if (assign_targets(X, n, ls, items.u.l->v[i]))
            return -1;
        mf_jv loop = mf_jv_dict(X->a);
        mf_jv_dict_setc(X->a, loop, "index", mf_jv_int((int64_t)i + 1));
        mf_jv_dict_setc(X->a, loop, "index0", mf_jv_int((int64_t)i));
        mf_jv_dict_setc(X->a, loop, "revindex", mf_jv_int((int64_t)(cnt - i)));
        mf_jv_dict_setc(X->a, loop, "revindex0", mf_jv_int((int64_t)(cnt - i - 1)));
        mf_jv_dict_setc(X->a, loop, "first", mf_jv_bool(i == 0));
        mf_jv_dict_setc(X->a, loop, "last", mf_jv_bool(i + 1 == cnt));
        mf_jv_dict_setc(X->a, loop, "length", mf_jv_int((int64_t)cnt));
        mf_jv_dict_setc(X->a, loop, "depth", mf_jv_int(depth));
        mf_jv_dict_setc(X->a, loop, "depth0", mf_jv_int(depth - 1));
        mf_jv_dict_setc(X->a, loop, "previtem", i ? items.u.l->v[i - 1] : mf_jv_undef());
        mf_jv_dict_setc(X->a, loop, "nextitem", i + 1 < cnt ? items.u.l->v[i + 1] : mf_jv_undef());
        loop.u.d->is_ns = true; /* no dict methods on loop */
        if (n->op) {
            mf_jfunc *f = mf_arena_alloc(X->a, sizeof *f);
            *f = (mf_jfunc){.kind = JF_LOOP, .name = "loop", .macro = n, .scope = sc, .depth = depth};
            mf_jv_dict_setc(X->a, loop, LOOP_CALL, (mf_jv){.t = MF_JV_FUNC, .u.fn = f});
        }
        scope_set(X, ls, "loop", loop);
        int rc = render_body(X, n->body, n->n_body, ls);
        if (rc < 0)
            return -1;
        if (rc == FLOW_BREAK)
            break;
    }
    return 0;
}

static int render_for(jctx *X, const jnode *n, jscope *sc) {
    mf_jv it;
    if (mf_jx_eval(X, n->b, &it))
        return -1;
    return run_for(X, n, sc, it, 1);
}

/* {% call(params) m(args) %}body{% endcall %}: m(args) with `caller` the
 * body as a macro closing over the call's scope. */
static int render_callblock(jctx *X, const jnode *n, jscope *sc) {
    mf_jv fn;
    if (mf_jx_eval(X, n->a->a, &fn))
        return -1;
    if (fn.t != MF_JV_FUNC || fn.u.fn->kind != JF_MACRO)
        return mf_jx_fail(X, n, "a call block needs a macro, not %s", mf_jx_type_name(fn));
    jargs A;
    if (mf_jx_eval_args(X, n->a, &A))
        return -1;
    mf_jfunc *cf = mf_arena_alloc(X->a, sizeof *cf);
    *cf = (mf_jfunc){.kind = JF_MACRO, .name = "caller", .macro = n->d, .scope = sc};
    mf_jv v;
    if (call_macro(X, n, fn.u.fn, &A, (mf_jv){.t = MF_JV_FUNC, .u.fn = cf}, &v))
        return -1;
    X->cur = sc;
    mf_jv_to_str(&X->out, v);
    return 0;
}

static int render_node(jctx *X, const jnode *n, jscope *sc) {
    mf_jv v;
    X->cur = sc;
    if (++X->steps > MAX_STEPS)
        return mf_jx_fail(X, n, "the template ran more than %d statements", MAX_STEPS);
    if (X->out.n > MAX_OUTPUT)
        return mf_jx_fail(X, n, "the output passed %u MiB", MAX_OUTPUT >> 20);
    switch (n->kind) {
    case J_TEXT: mf_jbuf_add(&X->out, n->lit.u.s.p, n->lit.u.s.n); return 0;
    case J_OUT:
        if (mf_jx_eval(X, n->a, &v))
            return -1;
        mf_jv_to_str(&X->out, v);
        return 0;
    case J_IF:
        if (mf_jx_eval(X, n->a, &v))
            return -1;
        return mf_jv_truthy(v) ? render_body(X, n->body, n->n_body, sc)
                               : render_body(X, n->els, n->n_els, sc);
    case J_FOR: return render_for(X, n, sc);
    case J_CALLBLOCK: return render_callblock(X, n, sc);
    case J_SET:
        if (mf_jx_eval(X, n->b, &v))
            return -1;
        if (n->a) {
            mf_jv ns = scope_get(sc, n->a->a->name);
            if (ns.t != MF_JV_DICT || !ns.u.d->is_ns)
                return mf_jx_fail(X, n, "cannot assign attribute '%s' on %s (only a namespace())",
                                  n->a->name, mf_jx_type_name(ns));
            mf_jv_dict_setc(X->a, ns, n->a->name, v);
            return 0;
        }
        return assign_targets(X, n, sc, v);
    case J_SETBLOCK: {
        mf_jbuf saved = X->out;
        X->out = (mf_jbuf){0};
        mf_jbuf_add(&X->out, "", 0);
        int rc = render_body(X, n->body, n->n_body, sc);
        mf_jbuf mine = X->out;
        X->out = saved;
        if (rc < 0) {
            free(mine.p);
            return -1;
        }
        scope_set(X, sc, n->names[0], mf_jv_str(X->a, mine.p, mine.n));
        free(mine.p);
        return 0;
    }
    case J_MACRO: {
        mf_jfunc *f = mf_arena_alloc(X->a, sizeof *f);
        f->kind = JF_MACRO;
        f->macro = n;
        f->name = n->name;
        scope_set(X, sc, n->name, (mf_jv){.t = MF_JV_FUNC, .u.fn = f});
        return 0;
    }
    case J_BREAK: return FLOW_BREAK;
    case J_CONTINUE: return FLOW_CONTINUE;
    case J_BLOCK: return render_body(X, n->body, n->n_body, sc);
    default: return mf_jx_fail(X, n, "not a statement");
    }
}

static int render_body(jctx *X, jnode *const *body, int n, jscope *sc) {
    for (int i = 0; i < n; i++) {
        int rc = render_node(X, body[i], sc);
        if (rc)
            return rc;
    }
    return 0;
}

static void add_global(jctx *X, const char *name) {
    mf_jfunc *f = mf_arena_alloc(X->a, sizeof *f);
    f->kind = JF_GLOBAL;
    f->name = name;
    scope_set(X, X->root, name, (mf_jv){.t = MF_JV_FUNC, .u.fn = f});
}

int mf_jinja_render(const mf_jinja *t, mf_jv ctx, char **out, size_t *out_len, mf_error *err) {
    jctx X = {.a = mf_arena_new(), .err = err};
    *out = NULL;
    X.root = scope_new(&X, NULL);
    add_global(&X, "raise_exception");
    add_global(&X, "namespace");
    add_global(&X, "range");
    add_global(&X, "dict");
    if (ctx.t == MF_JV_DICT)
        for (size_t i = 0; i < ctx.u.d->n; i++)
            if (ctx.u.d->k[i].t == MF_JV_STR)
                scope_set(&X, X.root, ctx.u.d->k[i].u.s.p, ctx.u.d->v[i]);
    /* Template-level sets go to a scope of their own so they shadow the context. */
    jscope *top = scope_new(&X, X.root);
    X.top = top;
    mf_jbuf_add(&X.out, "", 0);
    int rc = render_body(&X, t->body, t->n_body, top);
    mf_arena_free(X.a);
    if (rc < 0) {
        free(X.out.p);
        return -1;
    }
    *out = X.out.p;
    *out_len = X.out.n;
    return 0;
}
