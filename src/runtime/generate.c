/* generate.c - the decode loop: tokenize, prefill, then sample / stream /
 * decode one token at a time until n_predict, an end-of-generation token, a
 * full context, or the callback says stop. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

/* Tokens of text (BOS as the tokenizer wants when add_special). Returns a
 * malloc'd array and its count in *n, or NULL with err set. */
static int32_t *tokenize_all(const minfer_model *mm, const char *text, bool add_special,
                             int64_t *n, mf_error *err) {
    size_t len = strlen(text);
    int64_t cap = (int64_t)len + 8;
    int32_t *toks = mf_malloc((size_t)cap * sizeof *toks);
    int64_t k = mf_tokenize(mm->tok, text, len, add_special, true, toks, cap, err);
    if (k > cap) {
        toks = mf_realloc(toks, (size_t)k * sizeof *toks);
        cap = k;
        k = mf_tokenize(mm->tok, text, len, add_special, true, toks, cap, err);
    }
    if (k < 0 || k > cap) {
        free(toks);
        if (k >= 0)
            mf_errorf(err, "generate: tokenizer returned %lld tokens for a buffer of %lld",
                      (long long)k, (long long)cap);
        return NULL;
    }
    *n = k;
    return toks;
}

/* Index of the first NaN or infinite value of x[0..n), or -1. */
static int32_t first_non_finite(const float *x, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return i;
    return -1;
}

int minfer_generate(minfer_session *s, minfer_sampler *smp, const char *prompt, int32_t n_predict,
                    minfer_token_fn cb, void *user, minfer_generate_stats *stats, char *err,
                    size_t errlen) {
    mf_error e = {{0}};
    const minfer_model *mm = s->model;
    const int32_t n_vocab = mm->m->hp.n_vocab;
    minfer_generate_stats st = {.weight_bytes = mm->m->weight_bytes};
    int32_t *toks = NULL;
    char *text = NULL;
    int rc = -1;
    if (n_predict < -1) {
        mf_errorf(&e, "generate: n_predict %d (-1 means unlimited)", n_predict);
        goto done;
    }
    int64_t n = 0;
    char msg[512];
    const bool cont = (!prompt || !*prompt) && s->n_past > 0 && s->n_logits > 0;
    if (!cont) {
        /* BOS belongs only at the start of a context, not before a later turn. */
        toks = tokenize_all(mm, prompt ? prompt : "", s->n_past == 0, &n, &e);
        if (!toks)
            goto done;
        if (n == 0) {
            mf_errorf(&e, "generate: the prompt has no tokens");
            goto done;
        }
        if (s->n_past + n > s->n_ctx) {
            mf_errorf(&e, "prompt of %lld tokens does not fit the context (%d of n_ctx %d in use)",
                      (long long)n, s->n_past, s->n_ctx);
            goto done;
        }
        st.n_prompt = (int32_t)n;
        uint64_t t0 = mf_time_ns();
        if (minfer_prefill(s, toks, (int32_t)n, msg, sizeof msg)) {
            mf_errorf(&e, "%s", msg);
            goto done;
        }
        st.prompt_ms = (double)(mf_time_ns() - t0) / 1e6;
        if (smp)
            for (int64_t i = 0; i < n; i++)
                minfer_sampler_accept(smp, toks[i]);
    }

    mf_detok dt;
    mf_detok_init(&dt);
    /* Sized from the vocabulary's longest piece, so no token's text is cut. */
    size_t text_cap = mf_detok_max_bytes(mm->tok);
    text = mf_malloc(text_cap);
    uint64_t t1 = mf_time_ns();
    while (n_predict < 0 || st.n_generated < n_predict) {
        const float *lg = minfer_logits(s);
        /* NaN/Inf logits (broken weights, an overflowing kernel) would make
         * every sampler pick garbage or nothing; stop with the position. */
        int32_t bad = first_non_finite(lg, n_vocab);
        if (bad >= 0) {
            mf_errorf(&e, "logits are not finite at position %d (the logit of token %d is %g)",
                      s->n_past - 1, bad, (double)lg[bad]);
            goto done;
        }
        int32_t tok;
        if (smp) {
            tok = minfer_sampler_sample(smp, lg, n_vocab);
        } else {
            tok = 0;
            for (int32_t i = 1; i < n_vocab; i++)
                if (lg[i] > lg[tok])
                    tok = i;
        }
        if (tok < 0 && smp && mf_sampler_grammar_stuck(smp)) {
            mf_errorf(&e, "generate: no token can continue the output under the grammar "
                          "(after %d generated tokens)", st.n_generated);
            goto done;
        }
        if (tok < 0 || tok >= n_vocab) {
            mf_errorf(&e, "generate: sampler returned token %d (n_vocab %d)", tok, n_vocab);
            goto done;
        }
        if (mf_token_is_eog(mm->tok, tok)) {
            st.stopped_eog = true;
            break;
        }
        if (smp)
            minfer_sampler_accept(smp, tok);
        size_t k = mf_detok_push(mm->tok, &dt, tok, text, text_cap);
        MF_ASSERT(k <= text_cap); /* mf_detok_max_bytes bounds every push */
        st.n_generated++;
        /* Every emitted token goes into the KV cache, so a later turn (chat)
         * continues from exactly the text shown. */
        if (s->n_past >= s->n_ctx) {
            st.stopped_ctx = true;
        } else if (minfer_decode(s, tok, msg, sizeof msg)) {
            mf_errorf(&e, "%s", msg);
            goto done;
        }
        if (cb && !cb(user, tok, text, k))
            break;
        if (st.stopped_ctx)
            break;
    }
    st.gen_ms = (double)(mf_time_ns() - t1) / 1e6;
    /* A character still incomplete here was cut by the limit (or the model
     * stopped inside it): its held bytes are dropped rather than shown as a
     * U+FFFD the model never produced: dt is simply not flushed. */
    rc = 0;
done:
    free(text);
    free(toks);
    if (stats)
        *stats = st;
    if (rc && err && errlen)
        snprintf(err, errlen, "%s", e.msg);
    return rc;
}
