/* sampler.c - token sampling: penalties over a window of recent tokens, then
 * top-k -> top-p -> min-p -> temperature -> a draw from a seeded PRNG
 * (xoshiro256**), or greedy argmax when temp <= 0.
 *
 * The filter order matches what users of llama.cpp expect from the same
 * flags: top-p and min-p see the distribution at temperature 1, and the
 * temperature only reshapes the survivors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "grammar/grammar.h"
#include "runtime/runtime.h"

#define SEED_RANDOM UINT64_MAX
#define WINDOW_UNLIMITED 8192 /* repeat_last_n = -1 */

struct minfer_sampler {
    minfer_sampler_options o;
    uint64_t rng[4];
    int32_t *hist;       /* ring of the last `cap` accepted tokens */
    int32_t cap, n_hist, head;
    int32_t *scratch;    /* [cap] sorted copy of the window */
    mf_cand *cand;       /* [n_cand] */
    int32_t n_cand;
    struct sgrammar *gr; /* grammar constraint, or NULL */
};

/* A grammar constraint: the compiled grammar, the match state after the
 * tokens sampled so far, and every token's bytes (as the detokenizer
 * writes them), so a candidate is checked by advancing a copy of the state
 * over its piece. End-of-generation tokens are allowed only in a complete
 * state; tokens with no bytes (control tokens) never. */
typedef struct sgrammar {
    mf_grammar *g;
    mf_gstate st, tmp;
    uint8_t first[256];  /* mf_gstate_first_bytes of st */
    char *pieces;
    uint32_t *off;       /* [n_vocab + 1] */
    uint8_t *eog;        /* [n_vocab] */
    int32_t n_vocab;
    float *masked;       /* [n_vocab] logits with disallowed tokens at -inf */
    bool stuck;          /* the last sample found no allowed token */
} sgrammar;

/* ---- PRNG ------------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4]) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(minfer_sampler *s) {
    return (double)(xoshiro_next(s->rng) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- options, lifetime -------------------------------------------------------------- */

void minfer_sampler_options_default(minfer_sampler_options *o) {
    *o = (minfer_sampler_options){.temp = 0.8f,
                                  .top_k = 40,
                                  .top_p = 0.95f,
                                  .min_p = 0.05f,
                                  .repeat_penalty = 1.0f,
                                  .repeat_last_n = 64,
                                  .presence_penalty = 0.0f,
                                  .frequency_penalty = 0.0f,
                                  .seed = SEED_RANDOM};
}

minfer_sampler *minfer_sampler_new(const minfer_sampler_options *o) {
    minfer_sampler *s = mf_calloc(1, sizeof *s);
    if (o)
        s->o = *o;
    else
        minfer_sampler_options_default(&s->o);
    uint64_t seed = s->o.seed;
    if (seed == SEED_RANDOM) /* the one sentinel: 4294967295 is an ordinary seed */
        seed = mf_time_ns() ^ (uint64_t)(uintptr_t)s;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&seed);
    s->cap = s->o.repeat_last_n > 0 ? s->o.repeat_last_n
             : s->o.repeat_last_n < 0 ? WINDOW_UNLIMITED : 0;
    if (s->cap) {
        s->hist = mf_malloc((size_t)s->cap * sizeof *s->hist);
        s->scratch = mf_malloc((size_t)s->cap * sizeof *s->scratch);
    }
    return s;
}

static void sgrammar_free(sgrammar *gr) {
    if (!gr)
        return;
    mf_grammar_free(gr->g);
    mf_gstate_free(&gr->st);
    mf_gstate_free(&gr->tmp);
    free(gr->pieces);
    free(gr->off);
    free(gr->eog);
    free(gr->masked);
    free(gr);
}

void minfer_sampler_free(minfer_sampler *s) {
    if (!s)
        return;
    sgrammar_free(s->gr);
    free(s->hist);
    free(s->scratch);
    free(s->cand);
    free(s);
}

void minfer_sampler_accept(minfer_sampler *s, int32_t token) {
    if (!s->cap)
        return;
    s->hist[s->head] = token;
    s->head = (s->head + 1) % s->cap;
    if (s->n_hist < s->cap)
        s->n_hist++;
}

/* ---- penalties ------------------------------------------------------------------------ */

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Adjusts cand[id].logit (cand indexed by token id) for each distinct token of
 * the window: repeat penalty divides a positive logit / multiplies a negative
 * one; presence subtracts once, frequency per occurrence. */
static void apply_penalties(minfer_sampler *s, mf_cand *cand, int32_t n_vocab) {
    const minfer_sampler_options *o = &s->o;
    if (!s->n_hist || (o->repeat_penalty == 1.0f && o->presence_penalty == 0.0f &&
                       o->frequency_penalty == 0.0f))
        return;
    memcpy(s->scratch, s->hist, (size_t)s->n_hist * sizeof *s->hist);
    qsort(s->scratch, (size_t)s->n_hist, sizeof *s->scratch, cmp_i32);
    for (int32_t i = 0; i < s->n_hist;) {
        int32_t id = s->scratch[i], c = 0;
        while (i < s->n_hist && s->scratch[i] == id) {
            i++;
            c++;
        }
        if (id < 0 || id >= n_vocab)
            continue;
        float *l = &cand[id].logit;
        if (o->repeat_penalty != 1.0f && o->repeat_penalty > 0.0f)
            *l = *l > 0 ? *l / o->repeat_penalty : *l * o->repeat_penalty;
        *l -= (float)c * o->frequency_penalty + o->presence_penalty;
    }
}

/* ---- filters ---------------------------------------------------------------------------- */

/* Candidate order: higher logit first, lower id on ties (deterministic). */
static bool better(const mf_cand *a, const mf_cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cmp_cand(const void *a, const void *b) {
    const mf_cand *x = a, *y = b;
    return better(x, y) ? -1 : better(y, x) ? 1 : 0;
}

/* Min-heap on `better` of size k: the root is the worst kept candidate. */
static void heap_down(mf_cand *h, int32_t k, int32_t i) {
    for (;;) {
        int32_t w = i, l = 2 * i + 1, r = l + 1;
        if (l < k && better(&h[w], &h[l]))
            w = l;
        if (r < k && better(&h[w], &h[r]))
            w = r;
        if (w == i)
            return;
        mf_cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Moves the k best of c[0..n) into c[0..k) (unsorted). */
static void top_k_select(mf_cand *c, int32_t n, int32_t k) {
    for (int32_t i = k / 2 - 1; i >= 0; i--)
        heap_down(c, k, i);
    for (int32_t i = k; i < n; i++)
        if (better(&c[i], &c[0])) {
            c[0] = c[i];
            heap_down(c, k, 0);
        }
}

/* p = softmax(logit) over c[0..n); returns the max logit. */
static float softmax(mf_cand *c, int32_t n) {
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        mx = c[i].logit > mx ? c[i].logit : mx;
    double sum = 0;
    for (int32_t i = 0; i < n; i++)
        sum += (c[i].p = expf(c[i].logit - mx));
    for (int32_t i = 0; i < n; i++)
        c[i].p = (float)(c[i].p / sum);
    return mx;
}

/* The filter chain into c (room for n_vocab); sort_all: leave the survivors
 * sorted even when no filter needed an order. Returns the survivor count. */
static int32_t filter(minfer_sampler *s, const float *logits, int32_t n_vocab, mf_cand *c,
                      bool sort_all) {
    const minfer_sampler_options *o = &s->o;
    for (int32_t i = 0; i < n_vocab; i++)
        c[i] = (mf_cand){.id = i, .logit = logits[i]};
    apply_penalties(s, c, n_vocab);
    int32_t n = n_vocab;
    bool sorted = false;
    if (o->top_k > 0 && o->top_k < n) {
        top_k_select(c, n, o->top_k);
        n = o->top_k;
    }
    if (o->top_p < 1.0f) {
        qsort(c, (size_t)n, sizeof *c, cmp_cand);
        sorted = true;
        softmax(c, n);
        double cum = 0;
        int32_t keep = n;
        for (int32_t i = 0; i < n; i++) {
            cum += c[i].p;
            if (cum >= o->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (o->min_p > 0.0f && n > 1) {
        float mx = -INFINITY;
        for (int32_t i = 0; i < n; i++)
            mx = c[i].logit > mx ? c[i].logit : mx;
        /* p_i >= min_p * p_max  <=>  logit_i >= max + log(min_p) */
        float lim = mx + logf(o->min_p);
        int32_t k = 0;
        for (int32_t i = 0; i < n; i++)
            if (c[i].logit >= lim)
                c[k++] = c[i];
        n = k;
    }
    if (sort_all && !sorted)
        qsort(c, (size_t)n, sizeof *c, cmp_cand);
    softmax(c, n);
    return n;
}

int32_t mf_sampler_candidates(minfer_sampler *s, const float *logits, int32_t n_vocab,
                              mf_cand *out) {
    return filter(s, logits, n_vocab, out, true);
}

/* ---- sampling ------------------------------------------------------------------------------ */

static void ensure_cand(minfer_sampler *s, int32_t n_vocab) {
    if (s->n_cand < n_vocab) {
        free(s->cand);
        s->cand = mf_malloc((size_t)n_vocab * sizeof *s->cand);
        s->n_cand = n_vocab;
    }
}

/* ---- grammar ------------------------------------------------------------------------------- */

static bool allowed(sgrammar *gr, int32_t id) {
    if (id < 0 || id >= gr->n_vocab)
        return false;
    if (gr->eog[id])
        return mf_gstate_done(&gr->st);
    uint32_t a = gr->off[id], n = gr->off[id + 1] - a;
    if (!n || !gr->first[(uint8_t)gr->pieces[a]])
        return false;
    return mf_gstate_accepts(gr->g, &gr->st, gr->pieces + a, n, &gr->tmp);
}

/* Logits with every token the grammar does not allow at -inf; false when
 * no token is allowed. */
static bool mask_all(sgrammar *gr, const float *logits, int32_t n_vocab) {
    bool any = false;
    for (int32_t i = 0; i < n_vocab; i++) {
        bool ok = i < gr->n_vocab && allowed(gr, i);
        gr->masked[i] = ok ? logits[i] : -INFINITY;
        any |= ok;
    }
    return any;
}

static void grammar_take(sgrammar *gr, int32_t id) {
    if (!gr->eog[id]) {
        uint32_t a = gr->off[id];
        mf_gstate_advance(gr->g, &gr->st, gr->pieces + a, gr->off[id + 1] - a);
    }
    mf_gstate_first_bytes(gr->g, &gr->st, gr->first);
}

static int set_grammar(minfer_sampler *s, const minfer_model *m, const char *gbnf, mf_error *e) {
    mf_grammar *g;
    if (mf_grammar_parse(gbnf, strlen(gbnf), "root", &g, e))
        return -1;
    sgrammar *gr = mf_calloc(1, sizeof *gr);
    gr->g = g;
    if (mf_gstate_init(g, &gr->st, e)) {
        sgrammar_free(gr);
        return -1;
    }
    const int32_t nv = mf_tokenizer_n_vocab(m->tok);
    gr->n_vocab = nv;
    gr->off = mf_malloc(((size_t)nv + 1) * sizeof *gr->off);
    gr->eog = mf_calloc((size_t)nv, 1);
    gr->masked = mf_malloc((size_t)m->m->hp.n_vocab * sizeof *gr->masked);
    size_t cap = (size_t)nv * 8 + 64, used = 0;
    gr->pieces = mf_malloc(cap);
    char buf[512];
    for (int32_t i = 0; i < nv; i++) {
        gr->off[i] = (uint32_t)used;
        gr->eog[i] = mf_token_is_eog(m->tok, i);
        int k = mf_token_to_piece(m->tok, i, false, buf, sizeof buf);
        if (k < 0 || (size_t)k > sizeof buf)
            k = 0; /* a piece longer than any grammar step we check is never allowed */
        if (used + (size_t)k > cap) {
            cap = (used + (size_t)k) * 2;
            gr->pieces = mf_realloc(gr->pieces, cap);
        }
        memcpy(gr->pieces + used, buf, (size_t)k);
        used += (size_t)k;
    }
    gr->off[nv] = (uint32_t)used;
    mf_gstate_first_bytes(g, &gr->st, gr->first);
    sgrammar_free(s->gr);
    s->gr = gr;
    return 0;
}

int minfer_sampler_set_grammar(minfer_sampler *s, const minfer_model *m, const char *gbnf,
                               char *err, size_t errlen) {
    mf_error e;
    if (!gbnf || !*gbnf) {
        sgrammar_free(s->gr);
        s->gr = NULL;
        return 0;
    }
    if (set_grammar(s, m, gbnf, &e)) {
        if (err && errlen)
            snprintf(err, errlen, "%s", e.msg);
        return -1;
    }
    return 0;
}

char *minfer_json_schema_to_grammar(const char *schema, char *err, size_t errlen) {
    mf_error e;
    char *g = schema && *schema ? mf_json_schema_to_gbnf(schema, strlen(schema), &e)
                                : mf_strdup(mf_grammar_json_object_gbnf());
    if (!g && err && errlen)
        snprintf(err, errlen, "%s", e.msg);
    return g;
}

int minfer_sampler_set_json_schema(minfer_sampler *s, const minfer_model *m, const char *schema,
                                   char *err, size_t errlen) {
    char *g = minfer_json_schema_to_grammar(schema, err, errlen);
    if (!g)
        return -1;
    int rc = minfer_sampler_set_grammar(s, m, g, err, errlen);
    free(g);
    return rc;
}

bool mf_sampler_grammar_stuck(const minfer_sampler *s) { return s->gr && s->gr->stuck; }

static int32_t sample_unconstrained(minfer_sampler *s, const float *logits, int32_t n_vocab);

/* Greedy: the best candidates in order until one fits; after a few misses
 * the whole vocabulary is masked once. Sampling: draw, and only when the
 * draw does not fit mask and draw again from the allowed tokens. */
static int32_t sample_constrained(minfer_sampler *s, const float *logits, int32_t n_vocab) {
    sgrammar *gr = s->gr;
    int32_t tok = -1;
    gr->stuck = false;
    if (s->o.temp <= 0.0f) {
        ensure_cand(s, n_vocab);
        mf_cand *c = s->cand;
        for (int32_t i = 0; i < n_vocab; i++)
            c[i] = (mf_cand){.id = i, .logit = logits[i]};
        apply_penalties(s, c, n_vocab);
        for (int tries = 0; tries < 16 && tok < 0; tries++) {
            int32_t best = -1;
            for (int32_t i = 0; i < n_vocab; i++)
                if (c[i].logit > -INFINITY && (best < 0 || c[i].logit > c[best].logit))
                    best = i;
            if (best < 0)
                break;
            if (allowed(gr, best))
                tok = best;
            else
                c[best].logit = -INFINITY;
        }
        if (tok < 0) {
            if (!mask_all(gr, logits, n_vocab)) {
                gr->stuck = true;
                return -1;
            }
            for (int32_t i = 0; i < n_vocab; i++)
                if (gr->masked[i] > -INFINITY && c[i].logit > -INFINITY &&
                    (tok < 0 || c[i].logit > c[tok].logit))
                    tok = i;
            if (tok < 0) /* every allowed token was among the rejected: take the best allowed */
                for (int32_t i = 0; i < n_vocab; i++)
                    if (gr->masked[i] > -INFINITY && (tok < 0 || gr->masked[i] > gr->masked[tok]))
                        tok = i;
        }
    } else {
        tok = sample_unconstrained(s, logits, n_vocab);
        if (!allowed(gr, tok)) {
            if (!mask_all(gr, logits, n_vocab)) {
                gr->stuck = true;
                return -1;
            }
            tok = sample_unconstrained(s, gr->masked, n_vocab);
        }
    }
    grammar_take(gr, tok);
    return tok;
}

int32_t minfer_sampler_sample(minfer_sampler *s, const float *logits, int32_t n_vocab) {
    if (n_vocab <= 0 || !logits)
        return -1;
    if (s->gr)
        return sample_constrained(s, logits, n_vocab);
    return sample_unconstrained(s, logits, n_vocab);
}

static int32_t sample_unconstrained(minfer_sampler *s, const float *logits, int32_t n_vocab) {
    ensure_cand(s, n_vocab);
    mf_cand *c = s->cand;
    if (s->o.temp <= 0.0f) {
        for (int32_t i = 0; i < n_vocab; i++)
            c[i] = (mf_cand){.id = i, .logit = logits[i]};
        apply_penalties(s, c, n_vocab);
        int32_t best = 0;
        for (int32_t i = 1; i < n_vocab; i++)
            if (c[i].logit > c[best].logit)
                best = i;
        return best;
    }
    int32_t n = filter(s, logits, n_vocab, c, false);
    /* Temperature reshapes the survivors: p ~ exp((l - max) / temp). */
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        mx = c[i].logit > mx ? c[i].logit : mx;
    double sum = 0;
    for (int32_t i = 0; i < n; i++)
        sum += (c[i].p = expf((c[i].logit - mx) / s->o.temp));
    double u = rng_uniform(s) * sum, acc = 0;
    for (int32_t i = 0; i < n; i++) {
        acc += c[i].p;
        if (u < acc)
            return c[i].id;
    }
    return c[n - 1].id; /* u landed on the rounding tail */
}
