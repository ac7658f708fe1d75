/* test_cuda_multi.c - many sequences in one forward on CUDA (minfer_multi,
 * the ATTN_PAGED kernels inside a whole model), end to end:
 *   - 4 sequences prefilled in one batch and decoded together give, step by
 *     step, the logits each gets run alone (B = 1) within LOGIT_TOL of the
 *     logits' range, and the same greedy tokens (a step whose top-2 margin
 *     alone is below the measured difference would be a tie: reported, and
 *     the test fails only if that happens on more than one step in all);
 *   - the paged forward agrees with the single-sequence session on CUDA
 *     (different kernels: fused QKV, the decode attention) within LOGIT_TOL;
 *   - a fork's copy-on-write (mf_engine_kv_copy_rows on CUDA buffers):
 *     parent and child appended different tokens in one batch give each the
 *     logits of a fresh sequence with that history.
 * The matmuls and the session's attention run on their f32 tiers and the KV
 * cache is f32 (MINFER_CUDA_TUNE force=gemv_f32,attn_prefill=simt unless
 * the caller sets it): the default tiers round activations to int8 or f16
 * depending on the token count, which moves synthetic logits by ~1%
 * between a batch and a lone sequence whatever the attention does, so only
 * the f32 tiers isolate the paged path.
 *   test_cuda_multi MODEL.gguf   (77: no CUDA device) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "minfer.h"

enum { NS = 4, STEPS = 12, MAXP = 200 };
#define LOGIT_TOL 5e-4 /* of the largest |logit| (+ 1e-3): f32 paths that split and sum differently */

static minfer_model *model;
static int32_t n_vocab;
static int fails;

#define FAILF(...)                   \
    do {                             \
        printf("FAIL: " __VA_ARGS__); \
        printf("\n");                \
        fails++;                     \
    } while (0)

static minfer_multi *multi(int32_t n_seq) {
    minfer_multi_options o;
    minfer_multi_options_default(&o);
    o.n_ctx = 512;
    o.n_seq_max = n_seq;
    o.block_size = 16;
    o.n_batch = 512;
    o.prompt_cache = false;
    o.cache_type = "f32";
    char err[512];
    minfer_multi *m = minfer_multi_new(model, &o, err, sizeof err);
    if (!m)
        FAILF("minfer_multi_new: %s", err);
    return m;
}

static int32_t argmax(const float *a, float *margin) {
    int32_t k = 0, k2 = -1;
    for (int32_t i = 1; i < n_vocab; i++)
        if (a[i] > a[k]) {
            k2 = k;
            k = i;
        } else if (k2 < 0 || a[i] > a[k2]) {
            k2 = i;
        }
    if (margin)
        *margin = a[k] - a[k2];
    return k;
}

/* max |a - b| and the tolerance for it */
static double diff(const float *a, const float *b, double *tol) {
    double d = 0, mx = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        mx = fmax(mx, fabs((double)a[i]));
    }
    *tol = LOGIT_TOL * mx + 1e-3;
    return isnan(d) ? INFINITY : d;
}

static int32_t prompt(int i, int32_t *t) {
    static const int32_t len[NS] = {7, 37, 130, 20}; /* block edges crossed while decoding */
    for (int32_t k = 0; k < len[i]; k++)
        t[k] = 100 + (i * 977 + k * 131) % (n_vocab - 200);
    return len[i];
}

/* Sequences which[0..n) prefilled in one batch, then STEPS - 1 greedy steps
 * together; logits[i][s] and toks[i][s] (s = 0: after the prompt). force:
 * the tokens fed are force's instead of the run's own argmax. */
static int run(const int *which, int n, float *logits, int32_t *toks, const int32_t *force) {
    minfer_multi *m = multi(NS);
    if (!m)
        return -1;
    char err[512];
    int32_t sid[NS], tok[NS * MAXP], seq[NS * MAXP], pos[NS * MAXP], last[NS], nt = 0;
    for (int i = 0; i < n; i++) {
        sid[i] = minfer_seq_new(m, err, sizeof err);
        int32_t p[MAXP], len = prompt(which[i], p);
        for (int32_t k = 0; k < len; k++) {
            tok[nt] = p[k];
            seq[nt] = sid[i];
            pos[nt] = k;
            nt++;
        }
        last[i] = nt - 1;
    }
    minfer_batch b = {.n_tokens = nt, .token = tok, .seq_id = seq, .pos = pos};
    if (minfer_multi_decode(m, &b, err, sizeof err)) {
        FAILF("prefill: %s", err);
        minfer_multi_free(m);
        return -1;
    }
    for (int s = 0; s < STEPS; s++) {
        int32_t t2[NS], p2[NS];
        for (int i = 0; i < n; i++) {
            const float *lg = minfer_multi_logits(m, s == 0 ? last[i] : i);
            const size_t o = (size_t)which[i] * STEPS + (size_t)s;
            memcpy(logits + o * (size_t)n_vocab, lg, (size_t)n_vocab * sizeof *lg);
            toks[o] = argmax(lg, NULL);
            t2[i] = force ? force[o] : toks[o];
            p2[i] = minfer_seq_len(m, sid[i]);
        }
        if (s == STEPS - 1)
            break;
        minfer_batch d = {.n_tokens = n, .token = t2, .seq_id = sid, .pos = p2};
        if (minfer_multi_decode(m, &d, err, sizeof err)) {
            FAILF("decode step %d: %s", s, err);
            minfer_multi_free(m);
            return -1;
        }
    }
    minfer_multi_free(m);
    return 0;
}

static void batch_equals_alone(void) {
    const size_t per = (size_t)STEPS * (size_t)n_vocab;
    float *alone = malloc(NS * per * sizeof(float)), *batch = malloc(NS * per * sizeof(float));
    int32_t ta[NS * STEPS], tb[NS * STEPS];
    for (int i = 0; i < NS; i++)
        if (run((int[]){i}, 1, alone, ta, NULL))
            goto out;
    if (run((int[]){0, 1, 2, 3}, NS, batch, tb, ta)) /* fed the alone tokens: same histories */
        goto out;
    int ties = 0;
    double worst = 0;
    for (int i = 0; i < NS; i++)
        for (int s = 0; s < STEPS; s++) {
            const size_t o = (size_t)i * STEPS + (size_t)s;
            double tol, d = diff(alone + o * n_vocab, batch + o * n_vocab, &tol);
            worst = fmax(worst, d / tol);
            if (!(d <= tol))
                FAILF("sequence %d step %d: batch logits differ from alone by %g (tolerance %g)", i, s, d, tol);
            float margin;
            argmax(alone + o * n_vocab, &margin);
            if (ta[o] != tb[o]) {
                if (margin > d)
                    FAILF("sequence %d step %d: greedy token %d batched, %d alone (margin %g > diff %g)", i, s,
                          tb[o], ta[o], margin, d);
                else
                    printf("tie: sequence %d step %d: top-2 margin %g <= diff %g\n", i, s, margin, d);
                ties++;
            }
        }
    if (ties > 1)
        FAILF("%d greedy tokens differ (ties), at most 1 allowed", ties);
    printf("batch_equals_alone: %d sequences x %d steps, %d greedy tokens differ, worst diff / tol %.3f\n", NS,
           STEPS, ties, worst);
out:
    free(alone);
    free(batch);
}

static void paged_agrees_with_session(void) {
    char err[512];
    minfer_session_options so;
    minfer_session_options_default(&so);
    so.n_ctx = 512;
    so.cache_type = "f32";
    minfer_session *s = minfer_session_new(model, &so, err, sizeof err);
    minfer_multi *m = multi(2);
    if (!s || !m) {
        FAILF("session / multi: %s", err);
        goto out;
    }
    int32_t p[MAXP], len = prompt(2, p);
    int32_t sq = minfer_seq_new(m, err, sizeof err), seq[MAXP], pos[MAXP];
    for (int32_t k = 0; k < len; k++) {
        seq[k] = sq;
        pos[k] = k;
    }
    minfer_batch b = {.n_tokens = len, .token = p, .seq_id = seq, .pos = pos};
    if (minfer_prefill(s, p, len, err, sizeof err) || minfer_multi_decode(m, &b, err, sizeof err)) {
        FAILF("prefill: %s", err);
        goto out;
    }
    double worst = 0;
    for (int step = 0; step < 8; step++) {
        const float *a = minfer_logits(s), *c = minfer_multi_logits(m, step == 0 ? len - 1 : 0);
        double tol, d = diff(a, c, &tol);
        worst = fmax(worst, d / tol);
        if (!(d <= tol))
            FAILF("step %d: paged vs session max |diff| %g (tolerance %g)", step, d, tol);
        int32_t t = argmax(a, NULL), ps = len + step;
        minfer_batch d1 = {.n_tokens = 1, .token = &t, .seq_id = &sq, .pos = &ps};
        if (minfer_decode(s, t, err, sizeof err) || minfer_multi_decode(m, &d1, err, sizeof err)) {
            FAILF("decode: %s", err);
            goto out;
        }
    }
    printf("paged_agrees_with_session: 8 steps, worst diff / tol %.3f\n", worst);
out:
    minfer_multi_free(m);
    minfer_session_free(s);
}

static int fresh_logits(const int32_t *toks, int32_t n, float *out) {
    char err[256];
    minfer_multi *m = multi(1);
    if (!m)
        return -1;
    int32_t sq = minfer_seq_new(m, err, sizeof err), seq[64], pos[64];
    for (int32_t k = 0; k < n; k++) {
        seq[k] = sq;
        pos[k] = k;
    }
    minfer_batch b = {.n_tokens = n, .token = toks, .seq_id = seq, .pos = pos};
    const int rc = minfer_multi_decode(m, &b, err, sizeof err);
    if (rc)
        FAILF("fresh: %s", err);
    else
        memcpy(out, minfer_multi_logits(m, n - 1), (size_t)n_vocab * sizeof *out);
    minfer_multi_free(m);
    return rc;
}

static void fork_copy_on_write(void) {
    char err[256];
    int32_t t[21];
    for (int k = 0; k < 20; k++)
        t[k] = 300 + 17 * k;
    float *want_a = malloc((size_t)n_vocab * 4), *want_b = malloc((size_t)n_vocab * 4);
    int32_t ta[21], tb[21];
    memcpy(ta, t, 20 * 4);
    memcpy(tb, t, 20 * 4);
    ta[20] = 1111;
    tb[20] = 2222;
    minfer_multi *m = NULL;
    if (fresh_logits(ta, 21, want_a) || fresh_logits(tb, 21, want_b) || !(m = multi(2)))
        goto out;
    int32_t a = minfer_seq_new(m, err, sizeof err), seq[20], pos[20];
    for (int k = 0; k < 20; k++) {
        seq[k] = a;
        pos[k] = k;
    }
    minfer_batch pb = {.n_tokens = 20, .token = t, .seq_id = seq, .pos = pos};
    int32_t b = -1;
    if (minfer_multi_decode(m, &pb, err, sizeof err) || (b = minfer_seq_fork(m, a, 20, err, sizeof err)) < 0) {
        FAILF("fork: %s", err);
        goto out;
    }
    /* both write into the shared partial block: each gets its own copy */
    minfer_batch d = {.n_tokens = 2, .token = (int32_t[]){2222, 1111}, .seq_id = (int32_t[]){b, a},
                      .pos = (int32_t[]){20, 20}};
    if (minfer_multi_decode(m, &d, err, sizeof err)) {
        FAILF("decode after fork: %s", err);
        goto out;
    }
    double tol, db = diff(want_b, minfer_multi_logits(m, 0), &tol), da = diff(want_a, minfer_multi_logits(m, 1), &tol);
    if (!(db <= tol) || !(da <= tol))
        FAILF("fork: child diff %g, parent diff %g vs fresh sequences (tolerance %g)", db, da, tol);
    else
        printf("fork_copy_on_write: child diff %g, parent diff %g (tolerance %g)\n", db, da, tol);
out:
    minfer_multi_free(m);
    free(want_a);
    free(want_b);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_cuda_multi MODEL.gguf\n");
        return 2;
    }
    if (!minfer_build_has_device("cuda")) {
        printf("test_cuda_multi: no CUDA in this build\n");
        return 77;
    }
    setenv("MINFER_CUDA_TUNE", "force=gemv_f32,attn_prefill=simt", 0);
    printf("test_cuda_multi: MINFER_CUDA_TUNE=%s\n", getenv("MINFER_CUDA_TUNE"));
    minfer_model_options o;
    minfer_model_options_default(&o);
    o.path = argv[1];
    o.device = "cuda";
    char err[512];
    model = minfer_model_load(&o, err, sizeof err);
    if (!model) {
        printf("test_cuda_multi: cannot load %s on cuda: %s\n", argv[1], err);
        return strstr(err, "device") || strstr(err, "cuda") ? 77 : 1;
    }
    n_vocab = minfer_model_n_vocab(model);
    printf("test_cuda_multi: %s\n", minfer_model_device_desc(model));
    batch_equals_alone();
    paged_agrees_with_session();
    fork_copy_on_write();
    minfer_model_free(model);
    printf("test_cuda_multi: %s\n", fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
