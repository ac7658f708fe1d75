/* test_runtime_kvtypes.c - KV cache types through the C API on SmolLM2:
 * separate K and V types (cache_type / cache_type_v), the 4/5-bit block
 * types, the memory they take, and attention with flash attention off
 * (the unfused form) against the fused kernel, for a session and for
 * minfer_multi (ATTN_PAGED). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_test.h"
#include "minfer.h"

static minfer_model *model;
static int32_t n_vocab;

enum { N_PROMPT = 24, N_GEN = 12, CTX = 64 };

static minfer_session *session(const char *ck, const char *cv, bool fa_off, char *err, size_t errlen) {
    minfer_session_options o;
    minfer_session_options_default(&o);
    o.n_ctx = CTX;
    o.cache_type = ck;
    o.cache_type_v = cv;
    o.flash_attn_off = fa_off;
    return minfer_session_new(model, &o, err, errlen);
}

static int32_t argmax(const float *a) {
    int32_t k = 0;
    for (int32_t i = 1; i < n_vocab; i++)
        if (a[i] > a[k])
            k = i;
    return k;
}

/* The prompt's tokens, then N_GEN greedy steps: the generated ids and the
 * logits of every step (N_GEN + 1 rows: after the prompt, after each token). */
static int greedy(minfer_session *s, int32_t *gen, float *logits) {
    static const char prompt[] = "The capital of France is Paris. The capital of Germany is Berlin. The capital of";
    int32_t toks[64];
    const int32_t n = (int32_t)minfer_tokenize(model, prompt, strlen(prompt), true, false, toks, 64);
    char err[512];
    if (n <= 0 || n > 40 || minfer_prefill(s, toks, n, err, sizeof err)) {
        printf("  prefill: %s\n", err);
        return -1;
    }
    for (int i = 0; i < N_GEN; i++) {
        memcpy(logits + (size_t)i * n_vocab, minfer_logits(s), sizeof(float) * (size_t)n_vocab);
        gen[i] = argmax(minfer_logits(s));
        if (minfer_decode(s, gen[i], err, sizeof err)) {
            printf("  decode: %s\n", err);
            return -1;
        }
    }
    memcpy(logits + (size_t)N_GEN * n_vocab, minfer_logits(s), sizeof(float) * (size_t)n_vocab);
    return 0;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static double mean_diff(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += fabs((double)a[i] - b[i]);
    return s / (double)n;
}

MF_TEST(mixed_types_memory_and_names) {
    char err[512] = "";
    struct {
        const char *k, *v;
        uint64_t row_k, row_v; /* bytes of a 192-wide row */
    } cs[] = {
        {"q8_0", "f16", 6 * 34, 192 * 2}, {"q4_0", NULL, 6 * 18, 6 * 18}, {"q5_1", "q4_1", 6 * 24, 6 * 20},
        {"f32", "q5_0", 192 * 4, 6 * 22}, {NULL, "q8_0", 192 * 4, 6 * 34},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        minfer_session *s = session(cs[i].k, cs[i].v, false, err, sizeof err);
        CHECK_MSG(s != NULL, "%s/%s: %s", cs[i].k, cs[i].v, err);
        if (!s)
            continue;
        /* 30 layers x 64 rows x (K row + V row) */
        CHECK_EQ_INT(minfer_session_kv_bytes(s), 30ull * CTX * (cs[i].row_k + cs[i].row_v));
        minfer_session_free(s);
    }
    CHECK(session("q4_z", NULL, false, err, sizeof err) == NULL);
    CHECK_STR_CONTAINS(err, "K cache type 'q4_z'");
    CHECK(session("f16", "q3_K", false, err, sizeof err) == NULL);
    CHECK_STR_CONTAINS(err, "V cache type 'q3_K'");
}

/* Greedy tokens of each cache type pair against f32: the block types round
 * K/V by up to one quantization step, which moves logits but (on this
 * prompt, whose continuation is not a near tie) not the first tokens. */
MF_TEST(greedy_tokens_per_type) {
    const size_t nl = (size_t)(N_GEN + 1) * (size_t)n_vocab;
    float *base = malloc(nl * sizeof *base), *got = malloc(nl * sizeof *got);
    int32_t g0[N_GEN], g1[N_GEN];
    char err[512] = "";
    minfer_session *s = session("f32", NULL, false, err, sizeof err);
    CHECK_MSG(s != NULL, "%s", err);
    if (!s || greedy(s, g0, base)) {
        CHECK(0);
        goto out;
    }
    minfer_session_free(s);
    s = NULL;
    /* Measured (x86-64, 2 threads): f16 10 tokens, max 0.98, mean 0.15; q8_0
     * 12, 1.2, 0.16; q5_0 10, 4.8, 0.6; q5_1/q8_0 12, 3.3, 0.65; f16/q4_0 12,
     * 1.95, 0.38. Any perturbation of the K/V flips some int8 roundings of
     * the activations the matmuls quantize, hence the floor near 0.1 even for
     * f16; a cache read wrong (a block of another head, V in K's type) gives
     * means of several logits and other tokens at once. */
    struct {
        const char *k, *v;
        int same;         /* leading greedy tokens equal to f32's */
        double max, mean; /* |logit - f32 logit| over the steps with equal history */
    } cs[] = {
        {"f16", NULL, 8, 2.5, 0.3},  {"q8_0", NULL, 8, 2.5, 0.4}, {"q8_0", "f16", 8, 2.5, 0.4},
        {"q5_0", NULL, 6, 8, 1.2},   {"q5_1", "q8_0", 6, 8, 1.2}, {"f16", "q4_0", 3, 8, 1.2},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        s = session(cs[i].k, cs[i].v, false, err, sizeof err);
        CHECK_MSG(s != NULL, "%s", err);
        if (!s || greedy(s, g1, got)) {
            CHECK(0);
            goto out;
        }
        int same = 0;
        while (same < N_GEN && g1[same] == g0[same])
            same++;
        /* logits rows 0..same saw the same tokens */
        const size_t nv = (size_t)(same + 1) * (size_t)n_vocab;
        const double d = max_diff(base, got, nv), md = mean_diff(base, got, nv);
        printf("  K %s V %s: %d of %d greedy tokens equal, logit difference max %.3g mean %.3g\n", cs[i].k,
               cs[i].v ? cs[i].v : cs[i].k, same, N_GEN, d, md);
        CHECK_MSG(same >= cs[i].same, "K %s V %s: only %d tokens equal", cs[i].k, cs[i].v ? cs[i].v : "", same);
        CHECK_MSG(d <= cs[i].max && md <= cs[i].mean && d > 0, "K %s: logit difference max %.3g mean %.3g",
                  cs[i].k, d, md);
        minfer_session_free(s);
        s = NULL;
    }
out:
    minfer_session_free(s);
    free(base);
    free(got);
}

/* -fa off: the same math in another order (scores materialized, softmax,
 * then V; the kernels agree to 3e-7 in the op suite), so the same greedy
 * tokens and logits within the int8-activation floor (measured max 0.72,
 * mean 0.10 for f32; 1.5 / 0.2 for q8_0 K + q4_1 V), for an f32 cache and a
 * mixed quantized one. */
MF_TEST(flash_attn_off_matches_fused) {
    const size_t nl = (size_t)(N_GEN + 1) * (size_t)n_vocab;
    float *on = malloc(nl * sizeof *on), *off = malloc(nl * sizeof *off);
    int32_t g0[N_GEN], g1[N_GEN];
    char err[512] = "";
    const char *types[][2] = {{"f32", NULL}, {"q8_0", "q4_1"}};
    for (int t = 0; t < 2; t++) {
        minfer_session *a = session(types[t][0], types[t][1], false, err, sizeof err);
        minfer_session *b = a ? session(types[t][0], types[t][1], true, err, sizeof err) : NULL;
        CHECK_MSG(a && b, "%s", err);
        if (a && b && greedy(a, g0, on) == 0 && greedy(b, g1, off) == 0) {
            const double d = max_diff(on, off, nl), md = mean_diff(on, off, nl);
            printf("  K %s: -fa off vs on: logit difference max %.3g mean %.3g\n", types[t][0], d, md);
            CHECK(memcmp(g0, g1, sizeof g0) == 0);
            CHECK_MSG(d < 2.5 && md < 0.3, "logit difference max %.3g mean %.3g", d, md);
        } else {
            CHECK(0);
        }
        minfer_session_free(a);
        minfer_session_free(b);
    }
    free(on);
    free(off);
}

/* The multi-sequence path (ATTN_PAGED): two sequences in one batch, fused
 * vs unfused and K/V types mixed, each sequence's logits close to a plain
 * session's (fused: measured equal; unfused: max 0.42, mean 0.07); then a
 * fork's copy-on-write of a block of K and V rows of different sizes. */
MF_TEST(multi_unfused_and_mixed) {
    char err[512] = "";
    int32_t toks[2][6] = {{1, 504, 3458, 282, 4649, 314}, {1, 339, 1105, 2111, 30, 1345}};
    float *ref = malloc(2 * (size_t)n_vocab * sizeof *ref);
    for (int q = 0; q < 2; q++) {
        minfer_session *s = session("q8_0", "f16", false, err, sizeof err);
        CHECK_MSG(s && minfer_prefill(s, toks[q], 6, err, sizeof err) == 0, "%s", err);
        if (s)
            memcpy(ref + (size_t)q * n_vocab, minfer_logits(s), sizeof(float) * (size_t)n_vocab);
        minfer_session_free(s);
    }
    for (int fa = 0; fa < 2; fa++) {
        minfer_multi_options o;
        minfer_multi_options_default(&o);
        o.n_ctx = CTX;
        o.n_seq_max = 3;
        o.cache_type = "q8_0";
        o.cache_type_v = "f16";
        o.flash_attn_off = fa;
        minfer_multi *mm = minfer_multi_new(model, &o, err, sizeof err);
        CHECK_MSG(mm != NULL, "%s", err);
        if (!mm)
            continue;
        int32_t seq[12], pos[12], all[12];
        int32_t ids[2] = {minfer_seq_new(mm, err, sizeof err), minfer_seq_new(mm, err, sizeof err)};
        for (int i = 0; i < 12; i++) {
            seq[i] = ids[i / 6];
            pos[i] = i % 6;
            all[i] = toks[i / 6][i % 6];
        }
        const minfer_batch b = {.n_tokens = 12, .token = all, .seq_id = seq, .pos = pos, .logits = NULL};
        CHECK_MSG(minfer_multi_decode(mm, &b, err, sizeof err) == 0, "%s", err);
        for (int q = 0; q < 2; q++) {
            const float *lg = minfer_multi_logits(mm, 6 * q + 5);
            CHECK(lg != NULL);
            if (!lg)
                continue;
            const double d = max_diff(lg, ref + (size_t)q * n_vocab, (size_t)n_vocab);
            const double md = mean_diff(lg, ref + (size_t)q * n_vocab, (size_t)n_vocab);
            printf("  multi%s seq %d vs session: logit difference max %.3g mean %.3g\n", fa ? " -fa off" : "", q,
                   d, md);
            CHECK_MSG(d < 1.5 && md < 0.2, "difference max %.3g mean %.3g", d, md);
        }
        /* copy-on-write: a fork shares seq 0's block; its next token copies
         * the block's rows (K and V rows of different sizes) first */
        const int32_t fk = minfer_seq_fork(mm, ids[0], 6, err, sizeof err);
        CHECK_MSG(fk >= 0, "%s", err);
        const int32_t nt = 339, p6 = 6;
        const minfer_batch b2 = {.n_tokens = 1, .token = &nt, .seq_id = &fk, .pos = &p6, .logits = NULL};
        const minfer_batch b3 = {.n_tokens = 1, .token = &nt, .seq_id = &ids[0], .pos = &p6, .logits = NULL};
        float *fl = malloc((size_t)n_vocab * sizeof *fl);
        if (fk >= 0 && minfer_multi_decode(mm, &b2, err, sizeof err) == 0 && minfer_multi_logits(mm, 0)) {
            memcpy(fl, minfer_multi_logits(mm, 0), sizeof(float) * (size_t)n_vocab);
            /* the source sequence, untouched by the fork's write, gives the same next logits */
            CHECK_MSG(minfer_multi_decode(mm, &b3, err, sizeof err) == 0, "%s", err);
            const float *sl = minfer_multi_logits(mm, 0);
            CHECK(sl && max_diff(fl, sl, (size_t)n_vocab) == 0);
        } else {
            CHECK_MSG(0, "fork decode: %s", err);
        }
        free(fl);
        minfer_multi_free(mm);
    }
    free(ref);
}

static void setup(void) {
    const char *p = getenv("MINFER_MODEL");
    if (!p)
        return;
    minfer_model_options o;
    minfer_model_options_default(&o);
    o.path = p;
    o.n_threads = 2;
    char err[512];
    model = minfer_model_load(&o, err, sizeof err);
    if (!model)
        fprintf(stderr, "cannot load %s: %s\n", p, err);
    else
        n_vocab = minfer_model_n_vocab(model);
}

static const mf_test_entry tests[] = {MF_T(mixed_types_memory_and_names), MF_T(greedy_tokens_per_type),
                                      MF_T(flash_attn_off_matches_fused), MF_T(multi_unfused_and_mixed)};

int main(int argc, char **argv) {
    setup();
    if (!model) {
        printf("skip: no model (set MINFER_MODEL)\n");
        return getenv("MINFER_MODEL") ? 1 : 0;
    }
    int rc = mf_test_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    minfer_model_free(model);
    return rc;
}
