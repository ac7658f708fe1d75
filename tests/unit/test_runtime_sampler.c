/* test_runtime_sampler.c - the sampler: greedy, the exact candidate sets of
 * top-k / top-p / min-p on hand-made logits, penalties, seeding, and the
 * sampled distribution against softmax. */
#include <math.h>
#include <stdint.h>

#include "mf_test.h"
#include "runtime/runtime.h"

/* Test-local PRNG for random logits (independent of the sampler's). */
static uint64_t rs = 0x1234567887654321ull;
static float rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((rs >> 11) * (1.0 / 9007199254740992.0));
}

static minfer_sampler_options plain(void) {
    minfer_sampler_options o;
    minfer_sampler_options_default(&o);
    o.temp = 1.0f;
    o.top_k = 0;
    o.top_p = 1.0f;
    o.min_p = 0.0f;
    o.seed = 42;
    return o;
}

/* Survivor ids of the filter chain, in the order the sampler ranks them. */
static int32_t survivors(const minfer_sampler_options *o, const float *lg, int32_t n,
                         int32_t *ids, float *ps) {
    minfer_sampler *s = minfer_sampler_new(o);
    mf_cand c[64];
    int32_t k = mf_sampler_candidates(s, lg, n, c);
    for (int32_t i = 0; i < k; i++) {
        ids[i] = c[i].id;
        if (ps)
            ps[i] = c[i].p;
    }
    minfer_sampler_free(s);
    return k;
}

MF_TEST(greedy_is_argmax) {
    minfer_sampler_options o = plain();
    o.temp = 0;
    minfer_sampler *s = minfer_sampler_new(&o);
    static float lg[5000];
    for (int rep = 0; rep < 50; rep++) {
        int32_t n = 10 + (int32_t)(rnd() * 4990), best = 0;
        for (int32_t i = 0; i < n; i++) {
            lg[i] = 20 * rnd() - 10;
            if (lg[i] > lg[best])
                best = i;
        }
        CHECK_EQ_INT(minfer_sampler_sample(s, lg, n), best);
    }
    minfer_sampler_free(s);
}

/* probabilities 0.5, 0.3, 0.15, 0.05 at ids 2, 0, 3, 1 (shuffled on purpose) */
static const float P4[4] = {0.3f, 0.05f, 0.5f, 0.15f};

static void logits_of(const float *p, int n, float *lg) {
    for (int i = 0; i < n; i++)
        lg[i] = logf(p[i]) + 3.0f; /* a shift must not matter */
}

MF_TEST(top_k_keeps_the_k_largest) {
    const float lg[6] = {1, 5, 3, 4, 2, -1};
    minfer_sampler_options o = plain();
    int32_t ids[8];
    float ps[8];
    o.top_k = 2;
    CHECK_EQ_INT(survivors(&o, lg, 6, ids, ps), 2);
    CHECK_EQ_INT(ids[0], 1);
    CHECK_EQ_INT(ids[1], 3);
    CHECK_NEAR(ps[0], 1.0 / (1.0 + exp(-1.0)), 1e-5); /* softmax over the two */
    o.top_k = 5;
    CHECK_EQ_INT(survivors(&o, lg, 6, ids, NULL), 5);
    for (int i = 0; i < 5; i++)
        CHECK(ids[i] != 5);
    o.top_k = 100; /* larger than the vocab: everything */
    CHECK_EQ_INT(survivors(&o, lg, 6, ids, NULL), 6);
}

MF_TEST(top_p_keeps_the_smallest_covering_prefix) {
    float lg[4];
    logits_of(P4, 4, lg);
    minfer_sampler_options o = plain();
    int32_t ids[8];
    o.top_p = 0.9f; /* 0.5 + 0.3 = 0.8 < 0.9 <= 0.95 */
    CHECK_EQ_INT(survivors(&o, lg, 4, ids, NULL), 3);
    CHECK_EQ_INT(ids[0], 2);
    CHECK_EQ_INT(ids[1], 0);
    CHECK_EQ_INT(ids[2], 3);
    o.top_p = 0.79f;
    CHECK_EQ_INT(survivors(&o, lg, 4, ids, NULL), 2);
    o.top_p = 0.45f;
    CHECK_EQ_INT(survivors(&o, lg, 4, ids, NULL), 1);
    CHECK_EQ_INT(ids[0], 2);
    o.top_p = 0.99f;
    CHECK_EQ_INT(survivors(&o, lg, 4, ids, NULL), 4);
}

MF_TEST(min_p_keeps_relative_to_the_best) {
    float lg[4];
    logits_of(P4, 4, lg);
    minfer_sampler_options o = plain();
    int32_t ids[8];
    o.min_p = 0.2f; /* threshold 0.1: 0.5 0.3 0.15 */
    CHECK_EQ_INT(survivors(&o, lg, 4, ids, NULL), 3);
    CHECK(ids[0] == 2 && ids[1] == 0 && ids[2] == 3);
    o.min_p = 0.58f; /* 0.29: 0.5 0.3 */
    CHECK_EQ_INT(survivors(&o, lg, 4, ids, NULL), 2);
    o.min_p = 0.62f; /* 0.31: 0.5 */
    CHECK_EQ_INT(survivors(&o, lg, 4, ids, NULL), 1);
    o.min_p = 0.09f; /* 0.045: all four */
    CHECK_EQ_INT(survivors(&o, lg, 4, ids, NULL), 4);
}

MF_TEST(filters_chain_in_order) {
    float lg[4];
    logits_of(P4, 4, lg);
    minfer_sampler_options o = plain();
    int32_t ids[8];
    float ps[8];
    /* top-k 3 renormalises to .526 .316 .158: top-p 0.8 then needs two */
    o.top_k = 3;
    o.top_p = 0.8f;
    CHECK_EQ_INT(survivors(&o, lg, 4, ids, ps), 2);
    CHECK_NEAR(ps[0], 0.5 / 0.8, 1e-5);
    CHECK_NEAR(ps[1], 0.3 / 0.8, 1e-5);
    /* without top-k, 0.5 + 0.3 = 0.8 < 0.81: the third is needed */
    o.top_k = 0;
    o.top_p = 0.81f;
    CHECK_EQ_INT(survivors(&o, lg, 4, ids, NULL), 3);
}

MF_TEST(penalties_change_what_they_should) {
    const float lg[5] = {4.0f, -2.0f, 1.0f, 0.5f, 3.0f};
    minfer_sampler_options o = plain();
    o.repeat_penalty = 2.0f;
    o.repeat_last_n = 3;
    minfer_sampler *s = minfer_sampler_new(&o);
    mf_cand c[5];
    minfer_sampler_accept(s, 4); /* falls out of the 3-token window */
    minfer_sampler_accept(s, 0);
    minfer_sampler_accept(s, 1);
    minfer_sampler_accept(s, 0);
    int32_t k = mf_sampler_candidates(s, lg, 5, c);
    CHECK_EQ_INT(k, 5);
    float got[5];
    for (int i = 0; i < k; i++)
        got[c[i].id] = c[i].logit;
    CHECK_NEAR(got[0], 2.0, 1e-6);  /* positive: divided */
    CHECK_NEAR(got[1], -4.0, 1e-6); /* negative: multiplied */
    CHECK_NEAR(got[2], 1.0, 1e-6);
    CHECK_NEAR(got[3], 0.5, 1e-6);
    CHECK_NEAR(got[4], 3.0, 1e-6);  /* outside the window */
    /* greedy now prefers token 4 over the penalised 0 */
    minfer_sampler_free(s);
    o.temp = 0;
    s = minfer_sampler_new(&o);
    CHECK_EQ_INT(minfer_sampler_sample(s, lg, 5), 0);
    minfer_sampler_accept(s, 0);
    CHECK_EQ_INT(minfer_sampler_sample(s, lg, 5), 4);
    minfer_sampler_free(s);

    o = plain();
    o.presence_penalty = 0.5f;
    o.frequency_penalty = 0.25f;
    s = minfer_sampler_new(&o);
    for (int i = 0; i < 3; i++)
        minfer_sampler_accept(s, 2);
    minfer_sampler_accept(s, 3);
    k = mf_sampler_candidates(s, lg, 5, c);
    for (int i = 0; i < k; i++)
        got[c[i].id] = c[i].logit;
    CHECK_NEAR(got[2], 1.0 - 0.5 - 3 * 0.25, 1e-6);
    CHECK_NEAR(got[3], 0.5 - 0.5 - 0.25, 1e-6);
    CHECK_NEAR(got[0], 4.0, 1e-6);
    minfer_sampler_free(s);
}

static void sequence(uint64_t seed, const float *lg, int32_t n, int32_t *out, int len) {
    minfer_sampler_options o = plain();
    o.seed = seed;
    minfer_sampler *s = minfer_sampler_new(&o);
    for (int i = 0; i < len; i++)
        out[i] = minfer_sampler_sample(s, lg, n);
    minfer_sampler_free(s);
}

MF_TEST(seed_determines_the_sequence) {
    float lg[50];
    for (int i = 0; i < 50; i++)
        lg[i] = 3 * rnd();
    int32_t a[300], b[300], c[300];
    sequence(7, lg, 50, a, 300);
    sequence(7, lg, 50, b, 300);
    sequence(8, lg, 50, c, 300);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);
    int diff = 0;
    for (int i = 0; i < 300; i++)
        diff += a[i] != c[i];
    CHECK_MSG(diff > 100, "only %d of 300 differ", diff);
}

/* 4294967295 is an ordinary seed (only MINFER_SEED_RANDOM means random):
 * two samplers seeded with it draw the same sequence. Random seeding makes
 * two sequences of 300 draws over 50 tokens agree with odds near zero. */
MF_TEST(seed_uint32_max_is_not_random) {
    float lg[50];
    for (int i = 0; i < 50; i++)
        lg[i] = 3 * rnd();
    int32_t a[300], b[300];
    sequence(4294967295ull, lg, 50, a, 300);
    sequence(4294967295ull, lg, 50, b, 300);
    CHECK(memcmp(a, b, sizeof a) == 0);
    sequence(MINFER_SEED_RANDOM, lg, 50, a, 300);
    sequence(MINFER_SEED_RANDOM, lg, 50, b, 300);
    CHECK(memcmp(a, b, sizeof a) != 0);
}

/* Frequencies of 20000 draws against softmax(logits / temp). */
static void check_distribution(float temp) {
    enum { N = 8, DRAWS = 20000 };
    float lg[N];
    for (int i = 0; i < N; i++)
        lg[i] = 2.5f * rnd();
    minfer_sampler_options o = plain();
    o.temp = temp;
    o.seed = 1234;
    minfer_sampler *s = minfer_sampler_new(&o);
    int hist[N] = {0};
    for (int i = 0; i < DRAWS; i++) {
        int32_t t = minfer_sampler_sample(s, lg, N);
        CHECK(t >= 0 && t < N);
        if (t >= 0 && t < N)
            hist[t]++;
    }
    minfer_sampler_free(s);
    double z = 0, p[N];
    for (int i = 0; i < N; i++)
        z += (p[i] = exp(lg[i] / temp));
    for (int i = 0; i < N; i++)
        CHECK_NEAR((double)hist[i] / DRAWS, p[i] / z, 0.02);
}

MF_TEST(distribution_matches_softmax) {
    check_distribution(1.0f);
    check_distribution(0.5f);
}

MF_TEST(defaults_are_documented_values) {
    minfer_sampler_options o;
    minfer_sampler_options_default(&o);
    CHECK_NEAR(o.temp, 0.8, 1e-7);
    CHECK_EQ_INT(o.top_k, 40);
    CHECK_NEAR(o.top_p, 0.95, 1e-7);
    CHECK_NEAR(o.min_p, 0.05, 1e-7);
    CHECK_NEAR(o.repeat_penalty, 1.0, 0);
    CHECK_EQ_INT(o.repeat_last_n, 64);
}

MF_TEST_MAIN(MF_T(greedy_is_argmax), MF_T(top_k_keeps_the_k_largest),
             MF_T(top_p_keeps_the_smallest_covering_prefix), MF_T(min_p_keeps_relative_to_the_best),
             MF_T(filters_chain_in_order), MF_T(penalties_change_what_they_should),
             MF_T(seed_determines_the_sequence), MF_T(seed_uint32_max_is_not_random), MF_T(distribution_matches_softmax),
             MF_T(defaults_are_documented_values))
