/* gen.c - the CLI's generation loop (see gen.h). */
#include "gen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "json.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int32_t *mf_gen_tokenize(const minfer_model *m, const char *text, bool add_special, int64_t *n) {
    size_t len = strlen(text);
    int64_t cap = (int64_t)len + 8;
    int32_t *t = malloc((size_t)cap * sizeof *t);
    if (!t)
        return NULL;
    int64_t k = minfer_tokenize(m, text, len, add_special, true, t, cap);
    if (k > cap) {
        int32_t *nt = realloc(t, (size_t)k * sizeof *t);
        if (!nt) {
            free(t);
            return NULL;
        }
        t = nt;
        cap = k;
        k = minfer_tokenize(m, text, len, add_special, true, t, cap);
    }
    if (k < 0 || k > cap) {
        free(t);
        return NULL;
    }
    *n = k;
    return t;
}

/* The loop's state: the tokens in the context (for a shift), the bytes of a
 * character not yet complete, and the recent output (for reverse prompts). */
typedef struct gen_state {
    int32_t *ctx;
    int64_t n_ctx_toks, cap_ctx;
    char pend[16];
    size_t n_pend;
    char tail[512];
    size_t n_tail;
} gen_state;

static void remember(gen_state *g, const int32_t *t, int64_t n) {
    if (g->n_ctx_toks + n > g->cap_ctx) {
        int64_t cap = (g->n_ctx_toks + n) * 2 + 64;
        int32_t *nc = realloc(g->ctx, (size_t)cap * sizeof *nc);
        if (!nc)
            return; /* the shift then keeps less history; never wrong text */
        g->ctx = nc;
        g->cap_ctx = cap;
    }
    memcpy(g->ctx + g->n_ctx_toks, t, (size_t)n * sizeof *t);
    g->n_ctx_toks += n;
}

/* Appends text to the reverse-prompt window; true when a reverse prompt now
 * occurs in the part that the new text could have completed. */
static bool tail_push(gen_state *g, const mf_gen_opts *o, const char *text, size_t len) {
    if (len >= sizeof g->tail) {
        text += len - (sizeof g->tail - 1);
        len = sizeof g->tail - 1;
    }
    if (g->n_tail + len >= sizeof g->tail) {
        size_t drop = g->n_tail + len - (sizeof g->tail - 1);
        memmove(g->tail, g->tail + drop, g->n_tail - drop);
        g->n_tail -= drop;
    }
    memcpy(g->tail + g->n_tail, text, len);
    g->n_tail += len;
    g->tail[g->n_tail] = 0;
    for (int i = 0; i < o->n_rev; i++) {
        size_t rl = strlen(o->rev[i]);
        size_t win = rl + len;
        const char *from = g->tail + (g->n_tail > win ? g->n_tail - win : 0);
        if (rl && strstr(from, o->rev[i]))
            return true;
    }
    return false;
}

/* True when s[0..n) (n < 4) can still become one valid character. */
static bool incomplete_char(const unsigned char *s, size_t n) {
    size_t need = s[0] >= 0xC2 && s[0] <= 0xDF ? 2 : s[0] >= 0xE0 && s[0] <= 0xEF ? 3
                : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : 0;
    if (need == 0 || n >= need)
        return false;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80)
            return false;
    return true;
}

/* Emits the whole characters of the pending bytes plus piece (of any
 * length); bytes that can never become a valid character come out as U+FFFD
 * rather than stalling, a character's first bytes wait for the rest. */
static bool emit(gen_state *g, const mf_gen_opts *o, const char *piece, size_t len) {
    char in_s[sizeof g->pend + 512], out_s[3 * sizeof in_s];
    const size_t n = g->n_pend + len;
    char *in = n <= sizeof in_s ? in_s : malloc(n);
    char *out = n <= sizeof in_s ? out_s : malloc(3 * n);
    bool hit = false;
    if (!in || !out)
        goto done; /* out of memory: the piece is lost, never cut mid-character */
    memcpy(in, g->pend, g->n_pend);
    memcpy(in + g->n_pend, piece, len);
    size_t pos = 0, k = 0;
    g->n_pend = 0;
    while (pos < n) {
        size_t ok = mf_utf8_valid_prefix(in + pos, n - pos);
        memcpy(out + k, in + pos, ok);
        k += ok;
        pos += ok;
        if (pos == n)
            break;
        if (n - pos < 4 && incomplete_char((const unsigned char *)in + pos, n - pos)) {
            memcpy(g->pend, in + pos, n - pos);
            g->n_pend = n - pos;
            break;
        }
        memcpy(out + k, "\xEF\xBF\xBD", 3);
        k += 3;
        pos++;
    }
    if (k) {
        o->out(o->user, out, k);
        hit = tail_push(g, o, out, k);
    }
done:
    if (in != in_s)
        free(in);
    if (out != out_s)
        free(out);
    return hit;
}

/* Keeps the first n_keep tokens and the newer half of the rest, and runs them
 * through an emptied context. */
static int shift(minfer_model *m, minfer_session *s, gen_state *g, int32_t n_keep, char *err,
                 size_t errlen) {
    int64_t keep = n_keep;
    if (g->n_ctx_toks > 0 && g->ctx[0] == minfer_token_bos(m) && keep < 1)
        keep = 1;
    if (keep > g->n_ctx_toks)
        keep = g->n_ctx_toks;
    int64_t left = g->n_ctx_toks - keep, discard = left / 2;
    if (discard == 0) {
        snprintf(err, errlen, "context shift: nothing to discard (n_keep %d of %lld tokens)",
                 n_keep, (long long)g->n_ctx_toks);
        return -1;
    }
    memmove(g->ctx + keep, g->ctx + keep + discard, (size_t)(left - discard) * sizeof *g->ctx);
    g->n_ctx_toks -= discard;
    minfer_session_reset(s);
    return minfer_prefill(s, g->ctx, (int32_t)g->n_ctx_toks, err, errlen);
}

/* Long prompts go in slices of n_batch with a progress line, so a person at
 * a terminal sees a multi-second prefill move. */
static int prefill(minfer_session *s, const int32_t *t, int64_t n, const mf_gen_opts *o, char *err,
                   size_t errlen) {
    int64_t step = o->n_batch > 0 ? o->n_batch : 512;
    if (!o->progress || n <= 2 * step)
        return minfer_prefill(s, t, (int32_t)n, err, errlen);
    for (int64_t i = 0; i < n; i += step) {
        int64_t k = n - i < step ? n - i : step;
        fprintf(stderr, "\rprefill %lld/%lld tokens", (long long)i, (long long)n);
        if (minfer_prefill(s, t + i, (int32_t)k, err, errlen)) {
            fputc('\n', stderr);
            return -1;
        }
    }
    fprintf(stderr, "\rprefill %lld/%lld tokens\n", (long long)n, (long long)n);
    return 0;
}

int mf_gen_run(minfer_model *m, minfer_session *s, minfer_sampler *smp, const char *prompt,
               const mf_gen_opts *o, mf_gen_result *r, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    const int32_t nv = minfer_model_n_vocab(m);
    gen_state g = {0};
    int32_t *toks = NULL;
    float *masked = NULL;
    int rc = -1;
    const bool cont = (!prompt || !*prompt) && minfer_session_n_past(s) > 0;
    if (!cont) {
        int64_t n = 0;
        toks = mf_gen_tokenize(m, prompt ? prompt : "", minfer_session_n_past(s) == 0, &n);
        if (!toks) {
            snprintf(err, errlen, "cannot tokenize the prompt");
            goto done;
        }
        if (n == 0) {
            snprintf(err, errlen, "the prompt has no tokens");
            goto done;
        }
        if (minfer_session_n_past(s) + n > minfer_session_n_ctx(s)) {
            snprintf(err, errlen,
                     "prompt of %lld tokens does not fit the context (%d of n_ctx %d in use)",
                     (long long)n, minfer_session_n_past(s), minfer_session_n_ctx(s));
            goto done;
        }
        if (o->verbose_prompt) {
            fprintf(stderr, "prompt: %lld tokens\n", (long long)n);
            for (int64_t i = 0; i < n; i++) {
                char piece[256];
                int32_t k = minfer_token_to_piece(m, toks[i], piece, sizeof piece - 1);
                piece[k > 0 && k < (int32_t)sizeof piece ? k : 0] = 0;
                fprintf(stderr, "%6d -> '%s'\n", toks[i], piece);
            }
        }
        r->n_prompt = (int32_t)n;
        double t0 = now_ms();
        if (prefill(s, toks, n, o, err, errlen))
            goto done;
        r->prompt_ms = now_ms() - t0;
        if (smp)
            for (int64_t i = 0; i < n; i++)
                minfer_sampler_accept(smp, toks[i]);
        if (o->n_keep >= -1)
            remember(&g, toks, n);
    }
    if (o->ignore_eos && !(masked = malloc((size_t)nv * sizeof *masked))) {
        snprintf(err, errlen, "out of memory for %d logits", nv);
        goto done;
    }
    const int32_t n_keep = o->n_keep == -1 ? r->n_prompt : o->n_keep;
    double t1 = now_ms();
    while (o->n_predict < 0 || r->n_generated < o->n_predict) {
        if (o->stop && *o->stop) {
            r->interrupted = true;
            break;
        }
        const float *lg = minfer_logits(s);
        for (int32_t i = 0; i < nv; i++)
            if (!isfinite(lg[i])) {
                snprintf(err, errlen,
                         "logits are not finite at position %d (the logit of token %d is %g)",
                         minfer_session_n_past(s) - 1, i, (double)lg[i]);
                goto done;
            }
        if (masked) {
            memcpy(masked, lg, (size_t)nv * sizeof *masked);
            for (int32_t i = 0; i < nv; i++)
                if (minfer_token_is_eog(m, i))
                    masked[i] = -INFINITY;
            lg = masked;
        }
        int32_t tok = 0;
        if (smp)
            tok = minfer_sampler_sample(smp, lg, nv);
        else
            for (int32_t i = 1; i < nv; i++)
                if (lg[i] > lg[tok])
                    tok = i;
        if (tok < 0 || tok >= nv) {
            snprintf(err, errlen, "sampler returned token %d (n_vocab %d)", tok, nv);
            goto done;
        }
        if (!o->ignore_eos && minfer_token_is_eog(m, tok)) {
            r->stopped_eog = true;
            break;
        }
        if (smp)
            minfer_sampler_accept(smp, tok);
        r->n_generated++;
        if (minfer_session_n_past(s) >= minfer_session_n_ctx(s)) {
            if (o->n_keep < -1) {
                r->stopped_ctx = true;
            } else {
                if (shift(m, s, &g, n_keep, err, errlen))
                    goto done;
                r->n_shifts++;
            }
        }
        if (!r->stopped_ctx) {
            if (minfer_decode(s, tok, err, errlen))
                goto done;
            if (o->n_keep >= -1)
                remember(&g, &tok, 1);
        }
        char small[512], *piece = small;
        int32_t k = minfer_token_to_piece(m, tok, small, sizeof small);
        if (k > (int32_t)sizeof small && (piece = malloc((size_t)k)) != NULL)
            k = minfer_token_to_piece(m, tok, piece, (size_t)k); /* a long piece, whole */
        if (k < 0 || !piece) {
            k = 0;
            piece = small;
        }
        const bool hit = emit(&g, o, piece, (size_t)k);
        if (piece != small)
            free(piece);
        if (hit && o->n_rev) {
            r->stopped_rev = true;
            break;
        }
        if (r->stopped_ctx)
            break;
    }
    r->gen_ms = now_ms() - t1;
    /* an incomplete last character (the token limit cut it): its bytes are
     * dropped, never shown as a U+FFFD the model did not produce */
    rc = 0;
done:
    free(masked);
    free(toks);
    free(g.ctx);
    return rc;
}
