/* test_quant_roundtrip.c - reference quantize/dequantize round trips and the
 * traits table.
 *
 * Error bounds are relative RMS, rms(x - deq(q(x))) / rms(x), per type and
 * per distribution, over rows of 256, 1024 and 4096 elements. They sit a
 * little above what these quantizers measurably reach (the test prints the
 * worst it saw), so a broken scale, a swapped nibble or a lost high bit fails:
 *
 *   type          gauss / uniform / tiny (sd 1e-3)   outliers (1/64 at 5..10, rest sd 0.02)
 *   f16           0.03 %                             0.03 %
 *   bf16          0.25 %                             0.25 %
 *   q8_0, q8_1    0.7 %                              1.6 %
 *   q8_K          0.9 %                              2.5 %
 *   q6_K          2.5 %                              2.5 %
 *   q5_0/1, q5_K  5.2 %                              6.5 %
 *   q4_0          10.5 %                             12 %
 *   q4_1, q4_K    9.5 %                              12 %
 *   q3_K          18 %                               8 %
 *   q2_K          35 %                               45 %
 *   iq4_nl/xs     8.5 %                              6 %
 *   f32 exact.
 *
 * Values around 1e-6 ("underflow") put the f16 block scales into the
 * subnormal range, where every GGUF format loses its precision by design
 * (q8_0 rounds d to zero, q4_K's scales get inflated); those rows are only
 * checked for finite output.
 *
 * Bit compatibility with gguf-py is tests/py/test_quant_gguf.py's job. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/base.h"
#include "mf_test.h"
#include "quant/quant.h"

/* ---- deterministic random numbers --------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_u64(void) {
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static float rng_uniform(void) { return (float)((rng_u64() >> 40) + 0.5) / 16777216.0f; } /* (0,1) */

static float rng_gauss(void) {
    float u = rng_uniform(), v = rng_uniform();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

enum { DIST_GAUSS, DIST_UNIFORM, DIST_OUTLIERS, DIST_TINY, DIST_UNDERFLOW, DIST_COUNT };
static const char *dist_name[DIST_COUNT] = {"gauss", "uniform", "outliers", "tiny", "underflow"};

static void fill(float *x, int64_t n, int dist) {
    for (int64_t i = 0; i < n; i++) {
        switch (dist) {
        case DIST_GAUSS: x[i] = rng_gauss(); break;
        case DIST_UNIFORM: x[i] = -2.0f + 5.0f * rng_uniform(); break; /* off-centre on purpose */
        case DIST_OUTLIERS:
            x[i] = 0.02f * rng_gauss();
            if (rng_u64() % 64 == 0)
                x[i] = (rng_u64() & 1 ? 5.0f : -5.0f) * (1.0f + rng_uniform());
            break;
        case DIST_TINY: x[i] = 1e-3f * rng_gauss(); break;
        default: x[i] = 1e-6f * rng_gauss(); break;
        }
    }
}

/* ---- per-type expectations ------------------------------------------------- */

typedef struct {
    mf_type type;
    double bound;          /* rel RMS for gauss, uniform, tiny */
    double bound_outliers; /* rel RMS for the outlier mix */
} type_case;

static const type_case cases[] = {
    {MF_TYPE_F32, 0.0, 0.0},        {MF_TYPE_F16, 0.0003, 0.0003},  {MF_TYPE_BF16, 0.0025, 0.0025},
    {MF_TYPE_Q8_0, 0.007, 0.016},   {MF_TYPE_Q8_1, 0.007, 0.016},   {MF_TYPE_Q8_K, 0.009, 0.025},
    {MF_TYPE_Q6_K, 0.025, 0.025},   {MF_TYPE_Q5_0, 0.052, 0.065},   {MF_TYPE_Q5_1, 0.052, 0.065},
    {MF_TYPE_Q5_K, 0.052, 0.065},   {MF_TYPE_Q4_0, 0.105, 0.12},    {MF_TYPE_Q4_1, 0.095, 0.12},
    {MF_TYPE_Q4_K, 0.095, 0.12},    {MF_TYPE_Q3_K, 0.18, 0.08},     {MF_TYPE_Q2_K, 0.35, 0.45},
    {MF_TYPE_IQ4_NL, 0.085, 0.06},  {MF_TYPE_IQ4_XS, 0.085, 0.06},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

/* quantize + dequantize nrows rows of n; returns rel RMS error, counts NaNs */
static double round_trip(mf_type t, const float *x, float *y, int64_t nrows, int64_t n, int *n_nonfinite) {
    size_t rs = mf_type_row_size(t, n);
    uint8_t *q = mf_malloc(rs * (size_t)nrows);
    mf_quantize_rows(t, x, q, nrows, n);
    mf_dequantize_rows(t, q, y, nrows, n);
    free(q);
    double se = 0, sx = 0;
    for (int64_t i = 0; i < nrows * n; i++) {
        if (!isfinite(y[i]))
            (*n_nonfinite)++;
        double e = (double)y[i] - (double)x[i];
        se += e * e;
        sx += (double)x[i] * x[i];
    }
    return sx > 0 ? sqrt(se / sx) : sqrt(se);
}

/* ---- tests ------------------------------------------------------------------ */

MF_TEST(test_error_bounds) {
    static const int64_t widths[] = {256, 1024, 4096};
    const int64_t nrows = 4, maxn = 4096;
    float *x = mf_malloc(sizeof(float) * (size_t)(nrows * maxn));
    float *y = mf_malloc(sizeof(float) * (size_t)(nrows * maxn));
    for (int c = 0; c < N_CASES; c++) {
        const mf_type t = cases[c].type;
        double worst[DIST_COUNT] = {0};
        for (int d = 0; d < DIST_COUNT; d++) {
            for (int w = 0; w < 3; w++) {
                const int64_t n = widths[w];
                fill(x, nrows * n, d);
                int bad = 0;
                double e = round_trip(t, x, y, nrows, n, &bad);
                double bound = d == DIST_OUTLIERS ? cases[c].bound_outliers : cases[c].bound;
                CHECK_MSG(bad == 0, "%s/%s/%lld: %d non-finite outputs", mf_type_name(t), dist_name[d],
                          (long long)n, bad);
                CHECK_MSG(d == DIST_UNDERFLOW || e <= bound, "%s/%s/%lld: rel rms %.5f > bound %.5f", mf_type_name(t), dist_name[d],
                          (long long)n, e, bound);
                if (e > worst[d])
                    worst[d] = e;
            }
        }
        printf("  %-5s rel rms: gauss %.5f uniform %.5f outliers %.5f tiny %.5f (underflow %.3f)\n",
               mf_type_name(t), worst[0], worst[1], worst[2], worst[3], worst[4]);
    }
    free(x);
    free(y);
}

/* A quantizer that ignored its input would pass an RMS bound on tiny data;
 * check that the error really shrinks with the bit width on the same data. */
MF_TEST(test_error_ordering) {
    const int64_t n = 4096;
    float *x = mf_malloc(sizeof(float) * n), *y = mf_malloc(sizeof(float) * n);
    fill(x, n, DIST_GAUSS);
    const mf_type order[] = {MF_TYPE_Q2_K, MF_TYPE_Q3_K, MF_TYPE_Q4_K, MF_TYPE_Q5_K, MF_TYPE_Q6_K, MF_TYPE_Q8_0};
    double prev = 1e9;
    for (int i = 0; i < 6; i++) {
        int bad = 0;
        double e = round_trip(order[i], x, y, 1, n, &bad);
        CHECK_MSG(e < prev, "%s error %.5f not below the previous type's %.5f", mf_type_name(order[i]), e, prev);
        CHECK(e > 0); /* a lossy format is never exact on gaussian data */
        prev = e;
    }
    free(x);
    free(y);
}

MF_TEST(test_f32_exact) {
    const int64_t n = 1000;
    float x[1000], y[1000];
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_gauss() * powf(10.0f, (float)(i % 20) - 10.0f);
    int bad = 0;
    round_trip(MF_TYPE_F32, x, y, 1, n, &bad);
    CHECK(memcmp(x, y, sizeof x) == 0);
    CHECK_EQ_INT(mf_type_row_size(MF_TYPE_F32, n), 4 * n);
}

/* Every finite half / bfloat16 survives float and back bit for bit; values
 * half-way between two halves round to the even one. */
MF_TEST(test_f16_bf16_exact) {
    int mism_h = 0, mism_b = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        uint16_t h = (uint16_t)b, back;
        float f;
        if ((h & 0x7c00) != 0x7c00) {
            mf_dequantize_rows(MF_TYPE_F16, &h, &f, 1, 1);
            mf_quantize_rows(MF_TYPE_F16, &f, &back, 1, 1);
            mism_h += back != h;
        }
        if ((h & 0x7f80) != 0x7f80) {
            mf_dequantize_rows(MF_TYPE_BF16, &h, &f, 1, 1);
            mf_quantize_rows(MF_TYPE_BF16, &f, &back, 1, 1);
            mism_b += back != h;
        }
    }
    CHECK_EQ_INT(mism_h, 0);
    CHECK_EQ_INT(mism_b, 0);
    /* 1 + 2^-11 is half-way between 1 and 1 + 2^-10: ties to even (1.0);
     * 1 + 3 * 2^-11 ties up to 1 + 2^-9 */
    float tie[2] = {1.0f + 1.0f / 2048.0f, 1.0f + 3.0f / 2048.0f};
    uint16_t h2[2];
    mf_quantize_rows(MF_TYPE_F16, tie, h2, 1, 2);
    CHECK_EQ_INT(h2[0], 0x3c00);
    CHECK_EQ_INT(h2[1], 0x3c02);
    float big = 70000.0f;
    mf_quantize_rows(MF_TYPE_F16, &big, h2, 1, 1);
    CHECK_EQ_INT(h2[0], 0x7c00); /* overflow to inf, like numpy and ggml */
    float btie[2] = {1.0f + 1.0f / 256.0f, 1.0f + 3.0f / 256.0f};
    mf_quantize_rows(MF_TYPE_BF16, btie, h2, 1, 2);
    CHECK_EQ_INT(h2[0], 0x3f80);
    CHECK_EQ_INT(h2[1], 0x3f82);
}

/* All-zero and constant blocks: zeros come back as zeros, constants come back
 * finite and close, never NaN (a 0/0 in a scale would show here). */
MF_TEST(test_special_blocks) {
    const int64_t n = 512;
    float x[512], y[512];
    for (int c = 0; c < N_CASES; c++) {
        const mf_type t = cases[c].type;
        memset(x, 0, sizeof x);
        int bad = 0;
        round_trip(t, x, y, 1, n, &bad);
        int nonzero = 0;
        for (int i = 0; i < n; i++)
            nonzero += y[i] != 0.0f;
        CHECK_MSG(bad == 0 && nonzero == 0, "%s: zeros gave %d non-zero, %d non-finite", mf_type_name(t), nonzero,
                  bad);
        for (int i = 0; i < n; i++)
            x[i] = 0.37f;
        double e = round_trip(t, x, y, 1, n, &bad);
        CHECK_MSG(bad == 0 && e < 0.02, "%s: constant block rel err %.4f, %d non-finite", mf_type_name(t), e, bad);
        for (int i = 0; i < n; i++)
            x[i] = (i % 256) == 17 ? -4.0f : 0.0f; /* one spike per super-block */
        e = round_trip(t, x, y, 1, n, &bad);
        CHECK_MSG(bad == 0 && e < 0.05, "%s: single spike rel err %.4f, %d non-finite", mf_type_name(t), e, bad);
    }
}

/* Multi-row calls lay rows out at row_size strides and give the same bytes as
 * one call per row. */
MF_TEST(test_rows_layout) {
    const int64_t n = 512, nrows = 3;
    float x[3 * 512];
    fill(x, n * nrows, DIST_GAUSS);
    for (int c = 0; c < N_CASES; c++) {
        const mf_type t = cases[c].type;
        size_t rs = mf_type_row_size(t, n);
        uint8_t *all = mf_malloc(rs * nrows), *one = mf_malloc(rs * nrows);
        mf_quantize_rows(t, x, all, nrows, n);
        for (int64_t r = 0; r < nrows; r++)
            mf_quantize_rows(t, x + r * n, one + r * rs, 1, n);
        CHECK_MSG(memcmp(all, one, rs * nrows) == 0, "%s: multi-row bytes differ", mf_type_name(t));
        free(all);
        free(one);
    }
}

/* Activation formats carry derived fields the dot products trust. */
MF_TEST(test_activation_fields) {
    float x[256];
    fill(x, 256, DIST_UNIFORM);
    mf_block_q8_K k;
    mf_quantize_rows(MF_TYPE_Q8_K, x, &k, 1, 256);
    for (int j = 0; j < 16; j++) {
        int s = 0;
        for (int l = 0; l < 16; l++)
            s += k.qs[16 * j + l];
        CHECK_EQ_INT(k.bsums[j], s);
    }
    mf_block_q8_1 b[8];
    mf_quantize_rows(MF_TYPE_Q8_1, x, b, 1, 256);
    for (int i = 0; i < 8; i++) {
        int s = 0;
        for (int l = 0; l < 32; l++)
            s += b[i].qs[l];
        float d = mf_fp16_to_fp32(b[i].d), sf = mf_fp16_to_fp32(b[i].s);
        CHECK_NEAR(sf, s * d, fabsf(s * d) * 2e-3f + 1e-6f);
    }
}

MF_TEST(test_traits) {
    static const struct {
        mf_type t;
        int64_t bs;
        size_t ts;
    } want[] = {
        {MF_TYPE_F32, 1, 4},
        {MF_TYPE_F16, 1, 2},
        {MF_TYPE_BF16, 1, 2},
        {MF_TYPE_Q4_0, 32, sizeof(mf_block_q4_0)},
        {MF_TYPE_Q4_1, 32, sizeof(mf_block_q4_1)},
        {MF_TYPE_Q5_0, 32, sizeof(mf_block_q5_0)},
        {MF_TYPE_Q5_1, 32, sizeof(mf_block_q5_1)},
        {MF_TYPE_Q8_0, 32, sizeof(mf_block_q8_0)},
        {MF_TYPE_Q8_1, 32, sizeof(mf_block_q8_1)},
        {MF_TYPE_Q2_K, 256, sizeof(mf_block_q2_K)},
        {MF_TYPE_Q3_K, 256, sizeof(mf_block_q3_K)},
        {MF_TYPE_Q4_K, 256, sizeof(mf_block_q4_K)},
        {MF_TYPE_Q5_K, 256, sizeof(mf_block_q5_K)},
        {MF_TYPE_Q6_K, 256, sizeof(mf_block_q6_K)},
        {MF_TYPE_Q8_K, 256, sizeof(mf_block_q8_K)},
        {MF_TYPE_IQ4_NL, 32, sizeof(mf_block_iq4_nl)},
        {MF_TYPE_IQ4_XS, 256, sizeof(mf_block_iq4_xs)},
    };
    /* the GGUF ecosystem's byte counts, independent of blocks.h */
    static const size_t gguf_sizes[] = {4, 2, 2, 18, 20, 22, 24, 34, 36, 84, 110, 144, 176, 210, 292, 18, 136};
    for (int i = 0; i < (int)(sizeof want / sizeof want[0]); i++) {
        const mf_type_traits *tr = mf_type_get(want[i].t);
        CHECK_MSG(tr != NULL, "type %d missing", (int)want[i].t);
        if (!tr)
            continue;
        CHECK_EQ_INT(tr->block_size, want[i].bs);
        CHECK_EQ_INT(tr->type_size, want[i].ts);
        CHECK_EQ_INT(tr->type_size, gguf_sizes[i]);
        CHECK(tr->to_float != NULL && tr->from_float != NULL);
        CHECK_EQ_INT(tr->is_quantized, want[i].bs > 1);
        CHECK_EQ_INT(mf_type_row_size(want[i].t, 4096), 4096 / want[i].bs * want[i].ts);
        if (want[i].bs > 1)
            CHECK_EQ_INT(mf_type_row_size(want[i].t, want[i].bs + 1), 0);
    }
    /* names: unique, round-trip, case-insensitive */
    int known = 0;
    for (uint32_t t = 0; t < MF_TYPE_COUNT + 5; t++) {
        const mf_type_traits *tr = mf_type_get(t);
        if (!tr) {
            CHECK_MSG(strcmp(mf_type_name(t), "unknown") == 0, "id %u named %s", t, mf_type_name(t));
            CHECK_EQ_INT(mf_type_row_size(t, 256), 0);
            continue;
        }
        known++;
        CHECK_EQ_INT(mf_type_from_name(mf_type_name(t)), t);
        for (uint32_t u = 0; u < t; u++)
            if (mf_type_get(u))
                CHECK_MSG(strcmp(mf_type_name(u), mf_type_name(t)) != 0, "ids %u and %u share a name", u, t);
    }
    CHECK_EQ_INT(known, 22);
    CHECK_EQ_INT(mf_type_from_name("Q4_K"), MF_TYPE_Q4_K);
    CHECK_EQ_INT(mf_type_from_name("Q8_0"), MF_TYPE_Q8_0);
    CHECK_EQ_INT(mf_type_from_name("F16"), MF_TYPE_F16);
    CHECK_EQ_INT(mf_type_from_name("BF16"), MF_TYPE_BF16);
    CHECK_EQ_INT(mf_type_from_name("q4"), -1);
    CHECK_EQ_INT(mf_type_from_name(""), -1);
    CHECK_EQ_INT(mf_type_from_name(NULL), -1);
    CHECK(mf_type_get(MF_TYPE_COUNT) == NULL);
    CHECK(mf_type_get(4) == NULL); /* ids 4 and 5 are retired q4_2 / q4_3 */
    CHECK(mf_type_get(0xffffffffu) == NULL);
    CHECK_EQ_INT(mf_type_row_size(MF_TYPE_Q4_0, -32), 0);
    /* weights vs activation-only / non-float types */
    CHECK(mf_type_is_weight(MF_TYPE_Q4_K) && mf_type_is_weight(MF_TYPE_BF16) && mf_type_is_weight(MF_TYPE_Q8_0));
    CHECK(!mf_type_is_weight(MF_TYPE_Q8_K) && !mf_type_is_weight(MF_TYPE_Q8_1) && !mf_type_is_weight(MF_TYPE_I32));
    const mf_type_traits *i32 = mf_type_get(MF_TYPE_I32);
    CHECK(i32 && i32->type_size == 4 && i32->from_float == NULL);
    int32_t iv[3] = {-7, 0, 123456};
    float fv[3];
    mf_dequantize_rows(MF_TYPE_I32, iv, fv, 1, 3);
    CHECK(fv[0] == -7.0f && fv[1] == 0.0f && fv[2] == 123456.0f);
}

/* Layout spot checks written from the format description, independent of the
 * dequantizers: a Q4_0 block with d = 1 and nibble j = j % 16 decodes element
 * j to (j % 16) - 8 and element j + 16 to the high nibble. */
MF_TEST(test_hand_blocks) {
    mf_block_q4_0 b4;
    b4.d = mf_fp32_to_fp16(0.5f);
    for (int j = 0; j < 16; j++)
        b4.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    float y[256];
    mf_dequantize_rows(MF_TYPE_Q4_0, &b4, y, 1, 32);
    for (int j = 0; j < 16; j++) {
        CHECK_NEAR(y[j], 0.5f * (j - 8), 0);
        CHECK_NEAR(y[j + 16], 0.5f * (7 - j), 0);
    }
    /* Q5_0: qh bit j is element j's fifth bit */
    mf_block_q5_0 b5;
    memset(&b5, 0, sizeof b5);
    b5.d = mf_fp32_to_fp16(1.0f);
    b5.qh[2] = 0x01; /* element 16 gets +16 */
    mf_dequantize_rows(MF_TYPE_Q5_0, &b5, y, 1, 32);
    CHECK_NEAR(y[16], 0.0f, 0);
    CHECK_NEAR(y[0], -16.0f, 0);
    /* Q6_K: d = 1, scale[1] = 2, level of element 16 = 63 (ql low nibble 15 of
     * byte 16, qh bits 0-1 of byte 16 = 3) -> 2 * (63 - 32) = 62 */
    mf_block_q6_K b6;
    memset(&b6, 0, sizeof b6);
    b6.d = mf_fp32_to_fp16(1.0f);
    for (int j = 0; j < 16; j++)
        b6.scales[j] = 1;
    b6.scales[1] = 2;
    b6.ql[16] = 0x0f;
    b6.qh[16] = 0x03;
    mf_dequantize_rows(MF_TYPE_Q6_K, &b6, y, 1, 256);
    CHECK_NEAR(y[16], 62.0f, 0);
    CHECK_NEAR(y[0], -32.0f, 0);
    CHECK_NEAR(y[17], -64.0f, 0);
}

MF_TEST_MAIN(MF_T(test_traits), MF_T(test_error_bounds), MF_T(test_error_ordering), MF_T(test_f32_exact),
             MF_T(test_f16_bf16_exact), MF_T(test_special_blocks), MF_T(test_rows_layout),
             MF_T(test_activation_fields), MF_T(test_hand_blocks))
