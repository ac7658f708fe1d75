/* gmatch.c - the grammar matcher: a set of pushdown stacks of element
 * positions. Each stack's top is a character element the next code point
 * must match; below it are the positions to continue at once the rules
 * above finish. Advancing over a code point keeps the stacks whose top
 * matches, steps past it and expands references until every top is a
 * character element again (an empty stack: the input is complete). */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_impl.h"

#define MAX_STACKS 2048
#define MAX_DEPTH 4096

static bool class_has(const mf_grammar *g, int32_t ci, uint32_t cp) {
    const gclass *c = &g->classes[ci];
    const uint32_t *r = g->ranges + c->off;
    bool in = false;
    for (int32_t k = 0; k < c->n && !in; k++)
        in = cp >= r[2 * k] && cp <= r[2 * k + 1];
    return c->neg ? !in : in;
}

/* Some code point in [lo, hi] is in the class. */
static bool class_meets(const mf_grammar *g, int32_t ci, uint32_t lo, uint32_t hi) {
    const gclass *c = &g->classes[ci];
    const uint32_t *r = g->ranges + c->off;
    if (c->neg) { /* unless the excluded ranges cover [lo, hi] entirely */
        uint32_t at = lo;
        for (bool moved = true; moved && at <= hi;) {
            moved = false;
            for (int32_t k = 0; k < c->n; k++)
                if (at >= r[2 * k] && at <= r[2 * k + 1]) {
                    if (r[2 * k + 1] >= hi)
                        return false;
                    at = r[2 * k + 1] + 1;
                    moved = true;
                }
        }
        return true;
    }
    for (int32_t k = 0; k < c->n; k++)
        if (r[2 * k] <= hi && r[2 * k + 1] >= lo)
            return true;
    return false;
}

/* ---- stack sets ------------------------------------------------------------------ */

typedef struct expander {
    const mf_grammar *g;
    mf_gstate *out;
    int32_t *tmp;     /* scratch for stacks being built */
    size_t tmp_n, tmp_cap;
    bool overflow;
} expander;

static void set_reserve(mf_gstate *st, size_t more) {
    if (st->n + more > st->cap) {
        st->cap = (st->n + more) * 2 + 64;
        st->buf = mf_realloc(st->buf, st->cap * sizeof *st->buf);
    }
}

static void add_stack(expander *X, const int32_t *s, int32_t len) {
    mf_gstate *o = X->out;
    for (size_t i = 0; i < o->n; i += (size_t)o->buf[i] + 1)
        if (o->buf[i] == len && (!len || !memcmp(o->buf + i + 1, s, (size_t)len * sizeof *s)))
            return;
    if (o->n_stacks >= MAX_STACKS) {
        X->overflow = true;
        return;
    }
    set_reserve(o, (size_t)len + 1);
    o->buf[o->n++] = len;
    if (len)
        memcpy(o->buf + o->n, s, (size_t)len * sizeof *s);
    o->n += (size_t)len;
    o->n_stacks++;
}

/* The stack base[0..len) with position pos pushed, expanded until its top
 * is a character element (or it is empty). base lives in X->tmp. */
static void expand(expander *X, size_t base, int32_t len, int32_t pos, int depth) {
    const mf_grammar *g = X->g;
    if (depth > MAX_DEPTH || X->overflow) {
        X->overflow = true;
        return;
    }
    switch (g->el[pos].kind) {
    case GE_END:
        if (!len)
            add_stack(X, NULL, 0);
        else
            expand(X, base, len - 1, X->tmp[base + (size_t)len - 1], depth + 1);
        return;
    case GE_CHAR: {
        /* copy base + [pos] to the top of tmp, then into the set */
        size_t at = X->tmp_n;
        if (at + (size_t)len + 1 > X->tmp_cap) {
            X->tmp_cap = (at + (size_t)len + 1) * 2;
            X->tmp = mf_realloc(X->tmp, X->tmp_cap * sizeof *X->tmp);
        }
        memmove(X->tmp + at, X->tmp + base, (size_t)len * sizeof *X->tmp);
        X->tmp[at + (size_t)len] = pos;
        add_stack(X, X->tmp + at, len + 1);
        return;
    }
    default: {
        int32_t r = g->el[pos].arg;
        /* a private copy of base + [pos + 1]: deeper pops must not see writes */
        size_t at = X->tmp_n;
        if (at + (size_t)len + 1 > X->tmp_cap) {
            X->tmp_cap = (at + (size_t)len + 1) * 2 + 64;
            X->tmp = mf_realloc(X->tmp, X->tmp_cap * sizeof *X->tmp);
        }
        memmove(X->tmp + at, X->tmp + base, (size_t)len * sizeof *X->tmp);
        X->tmp[at + (size_t)len] = pos + 1;
        X->tmp_n = at + (size_t)len + 1;
        for (int32_t a = g->rule_alt0[r]; a < g->rule_alt0[r + 1]; a++)
            expand(X, at, len + 1, g->alts[a], depth + 1);
        X->tmp_n = at;
    }
    }
}

static _Thread_local int32_t *tl_tmp;
static _Thread_local size_t tl_cap;

static void expander_init(expander *X, const mf_grammar *g, mf_gstate *out) {
    *X = (expander){.g = g, .out = out, .tmp = tl_tmp, .tmp_cap = tl_cap};
    out->n = 0;
    out->n_stacks = 0;
}

static void expander_done(expander *X) {
    tl_tmp = X->tmp;
    tl_cap = X->tmp_cap;
}

/* Loads stack s (len ints) into tmp at 0 for expansion. */
static void load_base(expander *X, const int32_t *s, int32_t len) {
    if ((size_t)len + 1 > X->tmp_cap) {
        X->tmp_cap = ((size_t)len + 1) * 2 + 64;
        X->tmp = mf_realloc(X->tmp, X->tmp_cap * sizeof *X->tmp);
    }
    memcpy(X->tmp, s, (size_t)len * sizeof *s);
    X->tmp_n = (size_t)len;
}

int mf_gstate_init(const mf_grammar *g, mf_gstate *st, mf_error *err) {
    memset(st, 0, sizeof *st);
    expander X;
    expander_init(&X, g, st);
    X.tmp_n = 0;
    for (int32_t a = g->rule_alt0[g->root]; a < g->rule_alt0[g->root + 1]; a++)
        expand(&X, 0, 0, g->alts[a], 0);
    expander_done(&X);
    if (X.overflow)
        return mf_errorf(err, "grammar: more than %d parse stacks at the start (too ambiguous)",
                         MAX_STACKS);
    return 0;
}

void mf_gstate_free(mf_gstate *st) {
    free(st->buf);
    memset(st, 0, sizeof *st);
}

void mf_gstate_copy(mf_gstate *dst, const mf_gstate *src) {
    int32_t *buf = dst->buf;
    size_t cap = dst->cap;
    if (cap < src->n) {
        cap = src->n + 64;
        buf = mf_realloc(buf, cap * sizeof *buf);
    }
    if (src->n)
        memcpy(buf, src->buf, src->n * sizeof *buf);
    *dst = *src;
    dst->buf = buf;
    dst->cap = cap;
}

/* Advances in over code point cp into out (stacks whose top matches). */
static bool step(const mf_grammar *g, const mf_gstate *in, uint32_t cp, mf_gstate *out) {
    expander X;
    expander_init(&X, g, out);
    for (size_t i = 0; i < in->n; i += (size_t)in->buf[i] + 1) {
        int32_t len = in->buf[i];
        if (!len)
            continue;
        int32_t top = in->buf[i + (size_t)len];
        if (!class_has(g, g->el[top].arg, cp))
            continue;
        load_base(&X, in->buf + i + 1, len - 1);
        expand(&X, 0, len - 1, top + 1, 0);
    }
    expander_done(&X);
    return out->n_stacks > 0 && !X.overflow;
}

/* Could some stack take a code point in [lo, hi]? */
static bool feasible(const mf_grammar *g, const mf_gstate *st, uint32_t lo, uint32_t hi) {
    for (size_t i = 0; i < st->n; i += (size_t)st->buf[i] + 1) {
        int32_t len = st->buf[i];
        if (len && class_meets(g, g->el[st->buf[i + (size_t)len]].arg, lo, hi))
            return true;
    }
    return false;
}

/* The smallest code point a UTF-8 sequence of len bytes may encode. */
static uint32_t min_cp(int len) { return len == 2 ? 0x80 : len == 3 ? 0x800 : len == 4 ? 0x10000 : 0; }

/* Scratch states reused across calls on one thread (masking a vocabulary
 * advances tens of thousands of times per token). */
static _Thread_local mf_gstate tl_a, tl_b;

bool mf_gstate_advance(const mf_grammar *g, mf_gstate *st, const char *bytes, size_t n) {
    mf_gstate_copy(&tl_a, st);
    mf_gstate *a = &tl_a, *b = &tl_b;
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        uint8_t c = (uint8_t)bytes[i];
        if (a->need) {
            if ((c & 0xC0) != 0x80) {
                ok = false;
                break;
            }
            a->cp = (a->cp << 6) | (c & 0x3F);
            a->have++;
            if (--a->need)
                continue;
            /* overlong forms and surrogates are not UTF-8 (E0 81 AC is no 'l') */
            if (a->cp < min_cp(a->have) || (a->cp >= 0xD800 && a->cp < 0xE000) || a->cp > 0x10FFFF) {
                ok = false;
                break;
            }
        } else if (c < 0x80) {
            a->cp = c;
        } else {
            int len = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
            if (!len || c == 0xC0 || c == 0xC1 || c > 0xF4) {
                ok = false;
                break;
            }
            a->cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
            a->need = (uint8_t)(len - 1);
            a->have = 1;
            continue;
        }
        uint32_t cp = a->cp;
        a->have = 0;
        if (!step(g, a, cp, b)) {
            ok = false;
            break;
        }
        b->cp = 0;
        b->need = 0;
        b->have = 0;
        mf_gstate *t = a;
        a = b;
        b = t;
    }
    if (ok && a->need) { /* an unfinished character: is any completion possible? */
        uint32_t lo = a->cp << (6 * a->need), hi = lo | ((1u << (6 * a->need)) - 1);
        uint32_t mn = min_cp(a->have + a->need);
        ok = hi >= mn && feasible(g, a, lo > mn ? lo : mn, hi > 0x10FFFF ? 0x10FFFF : hi);
    }
    if (ok)
        mf_gstate_copy(st, a);
    return ok;
}

bool mf_gstate_accepts(const mf_grammar *g, const mf_gstate *st, const char *bytes, size_t n,
                       mf_gstate *tmp) {
    mf_gstate_copy(tmp, st);
    return mf_gstate_advance(g, tmp, bytes, n);
}

bool mf_gstate_done(const mf_gstate *st) {
    if (st->need)
        return false;
    for (size_t i = 0; i < st->n; i += (size_t)st->buf[i] + 1)
        if (!st->buf[i])
            return true;
    return false;
}

bool mf_gstate_finished(const mf_gstate *st) {
    return mf_gstate_done(st) && st->n_stacks == 1;
}

void mf_gstate_first_bytes(const mf_grammar *g, const mf_gstate *st, uint8_t out[256]) {
    if (st->need) { /* inside a character: leave the check to the full advance */
        memset(out, 1, 256);
        return;
    }
    for (int b = 0; b < 256; b++) {
        uint32_t lo, hi;
        if (b < 0x80) {
            lo = hi = (uint32_t)b;
        } else if (b >= 0xC2 && b <= 0xDF) {
            lo = (uint32_t)(b & 0x1F) << 6;
            hi = lo | 0x3F;
        } else if (b >= 0xE0 && b <= 0xEF) {
            lo = (uint32_t)(b & 0x0F) << 12;
            hi = lo | 0xFFF;
            lo = lo < 0x800 ? 0x800 : lo;
        } else if (b >= 0xF0 && b <= 0xF4) {
            lo = (uint32_t)(b & 0x07) << 18;
            hi = lo | 0x3FFFF;
            lo = lo < 0x10000 ? 0x10000 : lo;
            hi = hi > 0x10FFFF ? 0x10FFFF : hi;
        } else {
            out[b] = 0;
            continue;
        }
        out[b] = feasible(g, st, lo, hi);
    }
}
