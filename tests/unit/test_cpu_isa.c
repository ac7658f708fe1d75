/* test_cpu_isa.c - the per-ISA kernels at their edges, on whatever CPU runs
 * this (x86: AVX2/AVX-512; aarch64 natively or under qemu: NEON).
 *
 * test_cpu_kernels.c compares every ISA dot with its scalar twin at real model
 * widths; this file covers what those widths miss:
 *   - ISA detection and clamping: the best ISA is one the CPU runs, an ISA of
 *     another architecture falls back to scalar, MINFER_CPU_ISA=scalar lowers
 *     it, and MINFER_TEST_EXPECT_ISA (set by scripts/test-arm64.sh per qemu CPU
 *     model) pins what the detection must find;
 *   - quantizer rounding ties (Q8_0/Q8_1 round half away from zero, Q8_K half
 *     to even), saturation, zero and sign-anchored blocks: bytes equal to the
 *     scalar quantizer and to hand-computed levels;
 *   - float dots at every tail length (n not a multiple of the vector width);
 *   - quantized dots at one, two and three blocks (unrolled loops and their
 *     remainders), with random bytes and with saturated levels. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels_isa.h"
#include "mf_test.h"

static uint64_t rng_state = 0x6a09e667f3bcc909ull;
static uint64_t rng_u64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float rng_uniform(void) { return (float)((rng_u64() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

/* The non-scalar ISAs this CPU runs, in enum order; returns the count. */
static int native_isas(mf_cpu_isa out[MF_ISA_COUNT]) {
    int k = 0;
    for (int i = MF_ISA_SCALAR + 1; i < MF_ISA_COUNT; i++)
        if (mf_cpu_isa_clamp((mf_cpu_isa)i) == (mf_cpu_isa)i)
            out[k++] = (mf_cpu_isa)i;
    return k;
}

MF_TEST(isa_detection_and_clamp) {
    const mf_cpu_isa hw = mf_cpu_isa_clamp(MF_ISA_COUNT);
    const char *expect = getenv("MINFER_TEST_EXPECT_ISA");
    mf_cpu_isa_set_cap(NULL);
    CHECK_EQ_INT(mf_cpu_isa_best(), hw);
    CHECK_EQ_INT(mf_cpu_isa_clamp(MF_ISA_SCALAR), MF_ISA_SCALAR);
    if (expect && *expect)
        CHECK_MSG(strcmp(mf_cpu_isa_name(hw), expect) == 0, "detected %s, expected %s", mf_cpu_isa_name(hw),
                  expect);
    for (int i = 0; i < MF_ISA_COUNT; i++) {
        const mf_cpu_isa c = mf_cpu_isa_clamp((mf_cpu_isa)i);
        CHECK_MSG(c <= (mf_cpu_isa)i, "%s clamps up to %s", mf_cpu_isa_name((mf_cpu_isa)i),
                  mf_cpu_isa_name(c));
#if MF_CPU_X86
        CHECK(c != MF_ISA_NEON);
#elif MF_CPU_ARM
        CHECK(c == MF_ISA_SCALAR || c == MF_ISA_NEON);
        if (i != MF_ISA_NEON) /* an x86 ISA requested on ARM: the scalar kernel */
            CHECK(mf_cpu_dot_get(MF_TYPE_Q4_K, (mf_cpu_isa)i) == mf_cpu_dot_scalar(MF_TYPE_Q4_K));
#endif
    }
    if (hw != MF_ISA_SCALAR) { /* the best ISA has its own kernels, scalar keeps its twin */
        CHECK(mf_cpu_dot_get(MF_TYPE_Q4_0, hw) != mf_cpu_dot_scalar(MF_TYPE_Q4_0));
        CHECK(mf_cpu_dot_get(MF_TYPE_Q4_0, MF_ISA_SCALAR) == mf_cpu_dot_scalar(MF_TYPE_Q4_0));
    }
    /* the cap (the options' cpu_isa, MINFER_CPU_ISA) lowers, never raises */
    mf_cpu_isa_set_cap("scalar");
    CHECK_EQ_INT(mf_cpu_isa_best(), MF_ISA_SCALAR);
    CHECK_EQ_INT(mf_cpu_isa_default(), MF_ISA_SCALAR);
    mf_cpu_isa_set_cap(mf_cpu_isa_name(hw));
    CHECK_EQ_INT(mf_cpu_isa_best(), hw);
    mf_cpu_isa_set_cap("avx512");
    CHECK(mf_cpu_isa_best() <= hw);
    mf_cpu_isa_set_cap("scalar");
    mf_cpu_isa_set_cap("quantum"); /* unknown: warns, no cap */
    CHECK_EQ_INT(mf_cpu_isa_best(), hw);
    CHECK_EQ_INT(mf_cpu_isa_default(), hw);
    mf_cpu_isa_set_cap(NULL);
    printf("  detected %s\n", mf_cpu_isa_name(hw));
}

/* ==== quantizers ============================================================ */

/* Quantizes x with scalar and every native ISA; each must match scalar byte
 * for byte. The scalar bytes land in ref. */
static void quant_all(uint32_t act, const float *x, int64_t n, void *ref, const char *what) {
    const size_t rs = mf_type_row_size(act, n);
    uint8_t *y = malloc(rs);
    mf_cpu_quantize_act(act, x, ref, n, MF_ISA_SCALAR);
    mf_cpu_isa isas[MF_ISA_COUNT];
    const int ni = native_isas(isas);
    for (int k = 0; k < ni; k++) {
        memset(y, 0xa5, rs);
        mf_cpu_quantize_act(act, x, y, n, isas[k]);
        size_t at = 0;
        while (at < rs && y[at] == ((uint8_t *)ref)[at])
            at++;
        CHECK_MSG(at == rs, "%s %s: %s differs from scalar at byte %zu of %zu", mf_type_name(act), what,
                  mf_cpu_isa_name(isas[k]), at, rs);
    }
    free(y);
}

MF_TEST(quant_q8_0_ties_and_edges) {
    const uint32_t acts[2] = {MF_TYPE_Q8_0, MF_TYPE_Q8_1};
    float x[4 * 32];
    for (int k = 0; k < 2; k++) {
        /* block 0: amax 127 so d = 1 and id = 1: every x.5 is an exact tie */
        for (int j = 0; j < 32; j++)
            x[j] = (float)(j - 16) + 0.5f;
        x[31] = 127.0f;
        /* block 1: all zero; block 2: random; block 3: one huge outlier */
        for (int j = 0; j < 32; j++) {
            x[32 + j] = 0.0f;
            x[64 + j] = rng_uniform() * 3.0f;
            x[96 + j] = rng_uniform() * 1e-3f;
        }
        x[96 + 7] = -5e4f;
        mf_block_q8_1 r1[4];
        mf_block_q8_0 r0[4];
        void *ref = acts[k] == MF_TYPE_Q8_0 ? (void *)r0 : (void *)r1;
        quant_all(acts[k], x, 128, ref, "ties/zero/outlier");
        const int8_t *q0 = acts[k] == MF_TYPE_Q8_0 ? r0[0].qs : r1[0].qs;
        const int8_t *q2 = acts[k] == MF_TYPE_Q8_0 ? r0[1].qs : r1[1].qs;
        const int8_t *q3 = acts[k] == MF_TYPE_Q8_0 ? r0[3].qs : r1[3].qs;
        CHECK_EQ_INT(q0[0], -16); /* -15.5 -> -16: away from zero */
        CHECK_EQ_INT(q0[16], 1);  /* 0.5 -> 1 */
        CHECK_EQ_INT(q0[17], 2);  /* 1.5 -> 2 */
        CHECK_EQ_INT(q0[18], 3);  /* 2.5 -> 3 (half-even would give 2) */
        CHECK_EQ_INT(q0[31], 127);
        int nz = 0;
        for (int j = 0; j < 32; j++)
            nz += q2[j] != 0;
        CHECK_EQ_INT(nz, 0);
        CHECK_EQ_INT(q3[7], -127);
    }
}

MF_TEST(quant_q8_K_ties_and_edges) {
    const int64_t n = 4 * 256;
    float *x = malloc(sizeof(float) * n);
    /* block 0: the signed extreme is -127, so iscale = 1 and x.5 is a tie */
    for (int j = 0; j < 256; j++)
        x[j] = (float)((j % 200) - 100) + 0.5f;
    x[3] = -127.0f;
    /* block 1: zeros; block 2: positive extreme (iscale < 0, levels flip); block
     * 3: values equal in magnitude, the first one decides the sign */
    for (int j = 0; j < 256; j++) {
        x[256 + j] = 0.0f;
        x[512 + j] = rng_uniform() * 7.0f;
        x[768 + j] = (j & 1) ? 2.0f : -2.0f;
    }
    x[512 + 200] = 9.0f;
    mf_block_q8_K r[4];
    quant_all(MF_TYPE_Q8_K, x, n, r, "ties/zero/sign");
    CHECK_EQ_INT(r[0].qs[3], -127);
    CHECK_EQ_INT(r[0].qs[100], 0);  /* 0.5 -> 0: half to even */
    CHECK_EQ_INT(r[0].qs[101], 2);  /* 1.5 -> 2 */
    CHECK_EQ_INT(r[0].qs[102], 2);  /* 2.5 -> 2 */
    CHECK_EQ_INT(r[0].qs[99], 0);   /* -0.5 -> -0 */
    CHECK_NEAR(r[0].d, 1.0f, 0);
    CHECK_EQ_INT(r[1].d == 0.0f && r[1].bsums[5] == 0 && r[1].qs[17] == 0, 1);
    CHECK_EQ_INT(r[2].qs[200], -127);
    CHECK_EQ_INT(r[3].qs[0], -127); /* x[0] = -2 is the anchor: -127, and +2 -> 127 */
    CHECK_EQ_INT(r[3].qs[1], 127);
    for (int b = 0; b < 4; b++)
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++)
                s += r[b].qs[16 * j + l];
            CHECK_EQ_INT(r[b].bsums[j], s);
        }
    free(x);
}

/* ==== dots ================================================================== */

/* ISA dot vs scalar dot on the same bytes, relative to the size of the
 * products (as in test_cpu_kernels.c). */
static void compare_dot(uint32_t wt, const void *w, const void *a, int64_t n, const char *what) {
    const mf_cpu_dot *d0 = mf_cpu_dot_scalar(wt);
    float *wf = malloc(sizeof(float) * (size_t)n), *af = malloc(sizeof(float) * (size_t)n);
    mf_dequantize_rows(wt, w, wf, 1, n);
    mf_dequantize_rows(d0->act_type, a, af, 1, n);
    double as = 0;
    for (int64_t i = 0; i < n; i++)
        as += fabs((double)wf[i] * af[i]);
    float s0 = NAN;
    d0->dot(n, &s0, w, a);
    mf_cpu_isa isas[MF_ISA_COUNT];
    const int ni = native_isas(isas);
    for (int k = 0; k < ni; k++) {
        const mf_cpu_dot *d1 = mf_cpu_dot_get(wt, isas[k]);
        CHECK(d1 && d1->act_type == d0->act_type);
        if (!d1)
            continue;
        float s1 = NAN;
        d1->dot(n, &s1, w, a);
        const double tol = 1e-5 * fmax(fabs(s0), as / sqrt((double)n)) + 1e-30;
        CHECK_MSG(fabs((double)s1 - s0) <= tol, "%s %s n=%lld %s: %.9g vs scalar %.9g", mf_cpu_isa_name(isas[k]),
                  mf_type_name(wt), (long long)n, what, s1, s0);
    }
    free(wf);
    free(af);
}

MF_TEST(float_dot_tails) {
    const uint32_t types[3] = {MF_TYPE_F32, MF_TYPE_F16, MF_TYPE_BF16};
    float x[1100], wf[1100];
    uint8_t w[1100 * 4];
    for (int i = 0; i < 1100; i++) {
        x[i] = rng_uniform() * 2.0f;
        wf[i] = rng_uniform() * 0.1f;
    }
    int cases = 0;
    for (int t = 0; t < 3; t++) {
        mf_quantize_rows(types[t], wf, w, 1, 1100);
        for (int64_t n = 1; n <= 1100; n += n < 70 ? 1 : 97) {
            compare_dot(types[t], w, x, n, "tail");
            cases++;
        }
    }
    printf("  %d float dot lengths\n", cases);
}

/* The f16 scale fields of each block set to sane magnitudes (random or
 * saturated bits would make NaNs and infinities); levels, 6-bit scales and
 * masks keep whatever bytes they have. */
static void set_scales(uint32_t type, uint8_t *p, int64_t n) {
    const mf_type_traits *t = mf_type_get(type);
    for (int64_t b = 0; b < n / t->block_size; b++) {
        uint8_t *blk = p + (size_t)b * t->type_size;
        const uint16_t d = mf_fp32_to_fp16(0.002f + 0.01f * rng_uniform());
        const uint16_t m = mf_fp32_to_fp16(0.003f * rng_uniform());
        switch (type) {
        case MF_TYPE_Q4_0: ((mf_block_q4_0 *)blk)->d = d; break;
        case MF_TYPE_Q5_0: ((mf_block_q5_0 *)blk)->d = d; break;
        case MF_TYPE_Q8_0: ((mf_block_q8_0 *)blk)->d = d; break;
        case MF_TYPE_Q4_1: ((mf_block_q4_1 *)blk)->d = d; ((mf_block_q4_1 *)blk)->m = m; break;
        case MF_TYPE_Q5_1: ((mf_block_q5_1 *)blk)->d = d; ((mf_block_q5_1 *)blk)->m = m; break;
        case MF_TYPE_Q2_K: ((mf_block_q2_K *)blk)->d = d; ((mf_block_q2_K *)blk)->dmin = m; break;
        case MF_TYPE_Q3_K: ((mf_block_q3_K *)blk)->d = d; break;
        case MF_TYPE_Q4_K: ((mf_block_q4_K *)blk)->d = d; ((mf_block_q4_K *)blk)->dmin = m; break;
        case MF_TYPE_Q5_K: ((mf_block_q5_K *)blk)->d = d; ((mf_block_q5_K *)blk)->dmin = m; break;
        case MF_TYPE_Q6_K: ((mf_block_q6_K *)blk)->d = d; break;
        default: MF_ASSERT(!"not a quantized weight type");
        }
    }
}

/* Weight bytes for three modes: 0 random bits; 1 every byte 0xff (top
 * levels, all high bits and masks set, largest 6-bit scales); 2 every byte
 * 0x80 (lowest levels: -128 for Q8_0, -8 for Q4_0, -32 for Q6_K). */
static void make_blocks(uint32_t type, uint8_t *p, int64_t n, int mode) {
    const size_t sz = mf_type_row_size(type, n);
    for (size_t i = 0; i < sz; i++)
        p[i] = mode == 0 ? (uint8_t)rng_u64() : mode == 1 ? 0xff : 0x80;
    set_scales(type, p, n);
}

MF_TEST(quant_dot_block_counts) {
    const uint32_t types[] = {MF_TYPE_Q4_0, MF_TYPE_Q4_1, MF_TYPE_Q5_0, MF_TYPE_Q5_1, MF_TYPE_Q8_0,
                              MF_TYPE_Q2_K, MF_TYPE_Q3_K, MF_TYPE_Q4_K, MF_TYPE_Q5_K, MF_TYPE_Q6_K};
    static const char *mode_name[3] = {"random", "saturated 0xff", "saturated 0x80"};
    int cases = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t wt = types[ti];
        const uint32_t act = mf_cpu_act_type(wt);
        const int64_t bs = mf_type_get(wt)->block_size;
        for (int64_t nb = 1; nb <= 5; nb++) { /* the 2-way unrolled loops and their remainder */
            const int64_t n = nb * bs;
            uint8_t *w = malloc(mf_type_row_size(wt, n)), *a = malloc(mf_type_row_size(act, n));
            float *x = malloc(sizeof(float) * (size_t)n);
            for (int mode = 0; mode < 3; mode++) {
                make_blocks(wt, w, n, mode);
                /* random activations, or all at the top level with alternating
                 * sign, so every int8 product is as large as it gets */
                for (int64_t i = 0; i < n; i++)
                    x[i] = mode == 0 ? rng_uniform() * 4.0f : ((i & 1) ? 3.0f : -3.0f);
                quant_all(act, x, n, a, "dot input");
                compare_dot(wt, w, a, n, mode_name[mode]);
                cases++;
            }
            free(w);
            free(a);
            free(x);
        }
    }
    printf("  %d quantized dot cases\n", cases);
}

MF_TEST_MAIN(MF_T(isa_detection_and_clamp), MF_T(quant_q8_0_ties_and_edges), MF_T(quant_q8_K_ties_and_edges),
             MF_T(float_dot_tails), MF_T(quant_dot_block_counts))
