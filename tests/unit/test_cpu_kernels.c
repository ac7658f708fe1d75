/* test_cpu_kernels.c - dot kernels, activation quantizers and the matmul.
 *
 * - every weight type's scalar dot against a float64 dot of the dequantized
 *   weight and dequantized activation, at the real model widths;
 * - every ISA kernel the CPU runs against its scalar twin on the same bytes,
 *   and every ISA activation quantizer byte-equal to the scalar one;
 * - the matmul against a float64 reference (dequantized W, unquantized x)
 *   within the activation-quantization bound, bitwise equal across thread
 *   counts, with odd row counts and several token counts. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_isa.h"
#include "mf_test.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_u64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float rng_uniform(void) { return (float)((rng_u64() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

/* Random floats with a varying scale along the row, so block scales differ,
 * and an occasional outlier as in real activations. */
static void rand_floats(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) {
        float s = scale * (1.0f + 3.0f * (float)((i / 64) % 5) / 4.0f);
        x[i] = rng_uniform() * s;
        if (rng_u64() % 97 == 0)
            x[i] *= 6.0f;
    }
}

static const uint32_t weight_types[] = {MF_TYPE_F32,  MF_TYPE_F16,  MF_TYPE_BF16, MF_TYPE_Q4_0, MF_TYPE_Q4_1,
                                        MF_TYPE_Q5_0, MF_TYPE_Q5_1, MF_TYPE_Q8_0, MF_TYPE_Q2_K, MF_TYPE_Q3_K,
                                        MF_TYPE_Q4_K, MF_TYPE_Q5_K, MF_TYPE_Q6_K, MF_TYPE_IQ4_NL,
                                        MF_TYPE_IQ4_XS};
#define N_WTYPES (int)(sizeof weight_types / sizeof weight_types[0])
static const int64_t widths[] = {896, 1536, 3584, 4864, 8960, 18944};
#define N_WIDTHS (int)(sizeof widths / sizeof widths[0])

static uint16_t rand_half(float lo, float hi) {
    return mf_fp32_to_fp16(lo + (hi - lo) * (rng_uniform() * 0.5f + 0.5f));
}

/* Random valid bytes for n elements of a quantized type: every bit pattern
 * of levels, scales and masks, with the f16 super-scales set to sane values
 * (random bits would make NaNs). Covers codes our quantizer never emits. */
static void rand_blocks(uint32_t type, void *dst, int64_t n) {
    const mf_type_traits *t = mf_type_get(type);
    const int64_t nb = n / t->block_size;
    uint8_t *p = dst;
    for (size_t i = 0; i < (size_t)nb * t->type_size; i++)
        p[i] = (uint8_t)rng_u64();
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = p + (size_t)b * t->type_size;
        switch (type) {
        case MF_TYPE_Q4_0: case MF_TYPE_Q5_0: case MF_TYPE_Q8_0:
            ((mf_block_q4_0 *)blk)->d = rand_half(-0.02f, 0.02f);
            break;
        case MF_TYPE_Q4_1: case MF_TYPE_Q5_1:
            ((mf_block_q4_1 *)blk)->d = rand_half(0.001f, 0.02f);
            ((mf_block_q4_1 *)blk)->m = rand_half(-0.2f, 0.0f);
            break;
        case MF_TYPE_Q2_K:
            ((mf_block_q2_K *)blk)->d = rand_half(0.001f, 0.01f);
            ((mf_block_q2_K *)blk)->dmin = rand_half(0.001f, 0.01f);
            break;
        case MF_TYPE_Q3_K: ((mf_block_q3_K *)blk)->d = rand_half(-0.01f, 0.01f); break;
        case MF_TYPE_Q4_K:
            ((mf_block_q4_K *)blk)->d = rand_half(0.0005f, 0.002f);
            ((mf_block_q4_K *)blk)->dmin = rand_half(0.0005f, 0.002f);
            break;
        case MF_TYPE_Q5_K:
            ((mf_block_q5_K *)blk)->d = rand_half(0.0005f, 0.002f);
            ((mf_block_q5_K *)blk)->dmin = rand_half(0.0005f, 0.002f);
            break;
        case MF_TYPE_Q6_K: ((mf_block_q6_K *)blk)->d = rand_half(-0.001f, 0.001f); break;
        case MF_TYPE_IQ4_NL: ((mf_block_iq4_nl *)blk)->d = rand_half(-0.002f, 0.002f); break;
        case MF_TYPE_IQ4_XS: ((mf_block_iq4_xs *)blk)->d = rand_half(-0.0002f, 0.0002f); break;
        default: break;
        }
    }
}

/* A weight row of type wtype: quantized random floats or random valid bytes. */
static void make_weights(uint32_t wtype, void *w, int64_t n, int64_t rows, bool raw_bytes) {
    if (raw_bytes && mf_type_get(wtype)->is_quantized) {
        rand_blocks(wtype, w, n * rows);
        return;
    }
    float *f = malloc(sizeof(float) * (size_t)(n * rows));
    rand_floats(f, n * rows, 0.05f);
    mf_quantize_rows(wtype, f, w, rows, n);
    free(f);
}

static bool block_divides(uint32_t type, int64_t n) { return n % mf_type_get(type)->block_size == 0; }

/* The dequantized activation, and the exact dot the kernel is meant to
 * compute in float64. For the Q8_1 formats the kernel uses the stored
 * f16 s = d * sum(q) instead of the sum of the dequantized levels; that
 * rounding is added to *extra_tol. */
static double ref_dot(uint32_t wtype, const void *w, uint32_t act, const void *a, int64_t n, double *abs_sum,
                      double *extra_tol) {
    float *wf = malloc(sizeof(float) * (size_t)n), *af = malloc(sizeof(float) * (size_t)n);
    mf_dequantize_rows(wtype, w, wf, 1, n);
    mf_dequantize_rows(act, a, af, 1, n);
    double s = 0, as = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)wf[i] * af[i];
        as += fabs((double)wf[i] * af[i]);
    }
    *extra_tol = 0;
    if (act == MF_TYPE_Q8_1) {
        const mf_block_q8_1 *ab = a;
        for (int64_t b = 0; b < n / 32; b++) {
            const uint16_t mh = wtype == MF_TYPE_Q4_1 ? ((const mf_block_q4_1 *)w)[b].m
                                                      : ((const mf_block_q5_1 *)w)[b].m;
            *extra_tol += fabs(mf_fp16_to_fp32(mh)) * fabs(mf_fp16_to_fp32(ab[b].s)) * (1.0 / 1024);
        }
    }
    *abs_sum = as;
    free(wf);
    free(af);
    return s;
}

MF_TEST(scalar_dot_vs_f64) {
    for (int ti = 0; ti < N_WTYPES; ti++) {
        const uint32_t wt = weight_types[ti];
        const mf_cpu_dot *d = mf_cpu_dot_get(wt, MF_ISA_SCALAR);
        CHECK(d != NULL);
        if (!d)
            continue;
        for (int wi = 0; wi < N_WIDTHS; wi++) {
            const int64_t n = widths[wi];
            if (!block_divides(wt, n))
                continue;
            for (int raw = 0; raw < 2; raw++) {
                void *w = malloc(mf_type_row_size(wt, n));
                void *a = malloc(mf_type_row_size(d->act_type, n) + 16);
                float *x = malloc(sizeof(float) * (size_t)n);
                make_weights(wt, w, n, 1, raw);
                rand_floats(x, n, 1.0f);
                mf_cpu_quantize_act(d->act_type, x, a, n, MF_ISA_SCALAR);
                float s = NAN;
                d->dot(n, &s, w, a);
                double as, extra;
                const double ref = ref_dot(wt, w, d->act_type, a, n, &as, &extra);
                CHECK_MSG(fabs(s - ref) <= 2e-6 * as + extra, "%s n=%lld raw=%d: %.9g vs %.9g (sum|wa| %.3g)",
                          mf_type_name(wt), (long long)n, raw, s, ref, as);
                free(w);
                free(a);
                free(x);
            }
        }
    }
}

/* A broken quantizer that the dot test would not catch (the reference reads
 * the same activation bytes) is caught here: the levels must be the
 * reference rounding of x. */
MF_TEST(act_quant_matches_reference) {
    const uint32_t acts[] = {MF_TYPE_Q8_0, MF_TYPE_Q8_1, MF_TYPE_Q8_K};
    const int64_t n = 4864;
    float *x = malloc(sizeof(float) * n), *back = malloc(sizeof(float) * n);
    uint8_t *a = malloc(mf_type_row_size(MF_TYPE_Q8_0, n) * 2 + 4096), *r = malloc(mf_type_row_size(MF_TYPE_Q8_0, n) * 2 + 4096);
    rand_floats(x, n, 2.0f);
    x[5] = 0.0f; /* exact zero and a tie case */
    for (int k = 0; k < 3; k++) {
        const size_t rs = mf_type_row_size(acts[k], n);
        mf_cpu_quantize_act(acts[k], x, a, n, MF_ISA_SCALAR);
        if (acts[k] != MF_TYPE_Q8_K) {
            mf_quantize_rows(acts[k], x, r, 1, n); /* quant module's reference */
            CHECK_MSG(memcmp(a, r, rs) == 0, "%s differs from mf_quantize_rows", mf_type_name(acts[k]));
        }
        mf_dequantize_rows(acts[k], a, back, 1, n);
        double maxerr = 0, amax = 0;
        for (int64_t i = 0; i < n; i++) {
            maxerr = fmax(maxerr, fabs(back[i] - x[i]));
            amax = fmax(amax, fabs(x[i]));
        }
        /* half a level plus the f16 rounding of d across 127 levels */
        CHECK_MSG(maxerr <= amax / 127 * 0.57, "%s max err %g (amax %g)", mf_type_name(acts[k]), maxerr, amax);
        for (int isa = MF_ISA_AVX2; isa < MF_ISA_COUNT; isa++) { /* [neon] every ISA, NEON included */
            if ((int)mf_cpu_isa_best() < isa)
                continue;
            mf_cpu_quantize_act(acts[k], x, r, n, (mf_cpu_isa)isa);
            CHECK_MSG(memcmp(a, r, rs) == 0, "%s: %s quantizer differs from scalar", mf_type_name(acts[k]),
                      mf_cpu_isa_name((mf_cpu_isa)isa));
        }
    }
    /* Q8_K anchors on the signed extreme: that element is exactly -127 */
    {
        float z[256];
        rand_floats(z, 256, 1.0f);
        z[77] = 30.0f; /* above every random value */
        mf_block_q8_K b;
        mf_cpu_quantize_act(MF_TYPE_Q8_K, z, &b, 256, MF_ISA_SCALAR);
        CHECK_EQ_INT(b.qs[77], -127);
        CHECK_NEAR(b.d, -30.0f / 127.0f, 1e-8);
        int s = 0;
        for (int l = 0; l < 16; l++)
            s += b.qs[16 + l];
        CHECK_EQ_INT(b.bsums[1], s);
    }
    free(x);
    free(back);
    free(a);
    free(r);
}

/* The IQ4 AVX2 kernels sum exactly in integers and keep the scalar float
 * order, so they must equal the scalar ones bit for bit: random indices and
 * scales (raw bytes), and activations at +-127 everywhere (the largest
 * int16 pair sums the sign trick makes). */
MF_TEST(iq4_avx2_bit_equal) {
#if MF_CPU_X86
    if ((int)mf_cpu_isa_best() < MF_ISA_AVX2) {
        printf("  (avx2 not available here)\n");
        return;
    }
    const uint32_t types[2] = {MF_TYPE_IQ4_NL, MF_TYPE_IQ4_XS};
    int compared = 0;
    for (int ti = 0; ti < 2; ti++) {
        const mf_cpu_dot *d0 = mf_cpu_dot_get(types[ti], MF_ISA_SCALAR);
        const mf_cpu_dot *d1 = mf_cpu_dot_iq4_avx2(types[ti]);
        CHECK(d1 && d1->dot != d0->dot && d1->act_type == d0->act_type);
        CHECK(mf_cpu_dot_get(types[ti], MF_ISA_AVX2) == d1);
        if (!d1)
            continue;
        for (int rep = 0; rep < 60; rep++) {
            const int64_t n = 256 * (1 + rep % 7);
            void *w = malloc(mf_type_row_size(types[ti], n));
            void *a = malloc(mf_type_row_size(d0->act_type, n) + 16);
            float *x = malloc(sizeof(float) * (size_t)n);
            make_weights(types[ti], w, n, 1, rep % 3 != 0);
            if (rep % 5 == 4) /* every activation level at its extreme */
                for (int64_t i = 0; i < n; i++)
                    x[i] = (rng_u64() & 1) ? 1.0f : -1.0f;
            else
                rand_floats(x, n, 1.0f);
            mf_cpu_quantize_act(d0->act_type, x, a, n, MF_ISA_SCALAR);
            float s0 = NAN, s1 = NAN;
            d0->dot(n, &s0, w, a);
            d1->dot(n, &s1, w, a);
            CHECK_MSG(memcmp(&s0, &s1, sizeof s0) == 0, "%s n=%lld rep %d: avx2 %.9g vs scalar %.9g",
                      mf_type_name(types[ti]), (long long)n, rep, s1, s0);
            compared++;
            free(w);
            free(a);
            free(x);
        }
    }
    printf("  %d IQ4 rows bit-equal to scalar\n", compared);
#endif
}

MF_TEST(isa_dot_vs_scalar) {
    int tested = 0;
    for (int isa = MF_ISA_AVX2; isa < MF_ISA_COUNT; isa++) { /* [neon] every ISA, NEON included */
        if ((int)mf_cpu_isa_best() < isa) {
            printf("  (%s not available here)\n", mf_cpu_isa_name((mf_cpu_isa)isa));
            continue;
        }
        for (int ti = 0; ti < N_WTYPES; ti++) {
            const uint32_t wt = weight_types[ti];
            const mf_cpu_dot *d0 = mf_cpu_dot_get(wt, MF_ISA_SCALAR);
            const mf_cpu_dot *d1 = mf_cpu_dot_get(wt, (mf_cpu_isa)isa);
            const mf_cpu_dot *below = mf_cpu_dot_get(wt, (mf_cpu_isa)(isa - 1));
            CHECK(d1 && d1->act_type == d0->act_type);
            if (!d1 || d1->dot == d0->dot || d1->dot == below->dot)
                continue; /* a fallback: tested at its own ISA */
            tested++;
            for (int wi = 0; wi < N_WIDTHS; wi++) {
                const int64_t n = widths[wi];
                if (!block_divides(wt, n))
                    continue;
                for (int raw = 0; raw < 2; raw++) {
                    void *w = malloc(mf_type_row_size(wt, n));
                    void *a = malloc(mf_type_row_size(d0->act_type, n) + 16);
                    float *x = malloc(sizeof(float) * (size_t)n);
                    make_weights(wt, w, n, 1, raw);
                    rand_floats(x, n, 1.0f);
                    mf_cpu_quantize_act(d0->act_type, x, a, n, MF_ISA_SCALAR);
                    float s0 = NAN, s1 = NAN;
                    d0->dot(n, &s0, w, a);
                    d1->dot(n, &s1, w, a);
                    double as, extra;
                    ref_dot(wt, w, d0->act_type, a, n, &as, &extra);
                    const double mag = fmax(fabs(s0), as / sqrt((double)n));
                    CHECK_MSG(fabs(s1 - s0) <= 1e-5 * mag, "%s %s n=%lld raw=%d: %.9g vs scalar %.9g",
                              mf_cpu_isa_name((mf_cpu_isa)isa), mf_type_name(wt), (long long)n, raw, s1, s0);
                    free(w);
                    free(a);
                    free(x);
                }
            }
        }
    }
    printf("  %d ISA kernels compared with their scalar twins\n", tested);
}

/* ==== matmul ================================================================ */

/* Checks y (nt x n_out) against float64 W_deq x within the bound that the
 * activation quantization allows: per element sum_i |w_i| * err_i where err_i
 * is 0.57 of a level of x's block (half a level + f16 rounding of d). */
static int check_matmul(uint32_t wt, const void *w, int64_t n_in, int64_t n_out, const float *x, int64_t nt,
                        const float *y) {
    const uint32_t act = mf_cpu_dot_get(wt, MF_ISA_SCALAR)->act_type;
    const int64_t bs = act == MF_TYPE_F32 ? 1 : mf_type_get(act)->block_size;
    float *wf = malloc(sizeof(float) * (size_t)(n_in * n_out));
    float *lvl = malloc(sizeof(float) * (size_t)(n_in * nt));
    mf_dequantize_rows(wt, w, wf, n_out, n_in);
    for (int64_t t = 0; t < nt; t++)
        for (int64_t b = 0; b < n_in / bs; b++) {
            float amax = 0;
            for (int64_t i = 0; i < bs; i++)
                amax = fmaxf(amax, fabsf(x[t * n_in + b * bs + i]));
            for (int64_t i = 0; i < bs; i++)
                lvl[t * n_in + b * bs + i] = act == MF_TYPE_F32 ? 0.0f : amax / 127 * 0.57f;
        }
    int bad = 0;
    for (int64_t t = 0; t < nt; t++)
        for (int64_t o = 0; o < n_out; o++) {
            double ref = 0, as = 0, qb = 0;
            for (int64_t i = 0; i < n_in; i++) {
                const double wv = wf[o * n_in + i], xv = x[t * n_in + i];
                ref += wv * xv;
                as += fabs(wv * xv);
                qb += fabs(wv) * lvl[t * n_in + i];
            }
            /* the Q8_1 s term rounds d*sum(q) to f16: bounded by 2^-11 of sum|w|*|x| terms */
            const double tol = qb + 3e-6 * as + (act == MF_TYPE_Q8_1 ? as * (1.0 / 512) : 0);
            const float v = y[t * n_out + o];
            if (!(fabs(v - ref) <= tol)) {
                if (bad++ < 3)
                    fprintf(stderr, "  %s y[%lld][%lld] = %.9g, ref %.9g, tol %.3g\n", mf_type_name(wt),
                            (long long)t, (long long)o, v, ref, tol);
            }
        }
    free(wf);
    free(lvl);
    return bad;
}

MF_TEST(matmul_vs_f64_and_threads) {
    const int64_t n_in = 512, outs[] = {1, 7, 61}, nts[] = {1, 3, 7, 64};
    mf_cpu_ctx *c1 = mf_cpu_ctx_new(1), *c2 = mf_cpu_ctx_new(2), *c3 = mf_cpu_ctx_new(3);
    CHECK(c1 && c2 && c3);
    for (int ti = 0; ti < N_WTYPES; ti++) {
        const uint32_t wt = weight_types[ti];
        for (int oi = 0; oi < 3; oi++)
            for (int ni = 0; ni < 4; ni++) {
                const int64_t n_out = outs[oi], nt = nts[ni];
                void *w = malloc(mf_type_row_size(wt, n_in) * (size_t)n_out);
                float *x = malloc(sizeof(float) * (size_t)(n_in * nt));
                float *y1 = malloc(sizeof(float) * (size_t)(n_out * nt));
                float *y2 = malloc(sizeof(float) * (size_t)(n_out * nt));
                float *y3 = malloc(sizeof(float) * (size_t)(n_out * nt));
                make_weights(wt, w, n_in, n_out, false);
                rand_floats(x, n_in * nt, 1.0f);
                for (int64_t i = 0; i < n_out * nt; i++)
                    y1[i] = y2[i] = y3[i] = NAN; /* poison: every element must be written */
                mf_cpu_matmul(c1, wt, w, n_in, n_out, x, nt, y1);
                mf_cpu_matmul(c2, wt, w, n_in, n_out, x, nt, y2);
                mf_cpu_matmul(c3, wt, w, n_in, n_out, x, nt, y3);
                const int bad = check_matmul(wt, w, n_in, n_out, x, nt, y1);
                CHECK_MSG(bad == 0, "%s n_out=%lld nt=%lld: %d elements off", mf_type_name(wt),
                          (long long)n_out, (long long)nt, bad);
                CHECK_MSG(memcmp(y1, y2, sizeof(float) * (size_t)(n_out * nt)) == 0 &&
                              memcmp(y1, y3, sizeof(float) * (size_t)(n_out * nt)) == 0,
                          "%s n_out=%lld nt=%lld: 1, 2 and 3 threads differ", mf_type_name(wt),
                          (long long)n_out, (long long)nt);
                free(w);
                free(x);
                free(y1);
                free(y2);
                free(y3);
            }
    }
    mf_cpu_ctx_free(c1);
    mf_cpu_ctx_free(c2);
    mf_cpu_ctx_free(c3);
}

/* Larger shapes: each output equals its dot kernel exactly (so no tile or
 * register-blocked path computes anything else), and the scalar context is
 * close to the best ISA. */
MF_TEST(matmul_equals_dot_real_width) {
    const int64_t n_in = 1536, n_out = 37, nt = 21;
    mf_cpu_ctx *c = mf_cpu_ctx_new(2);
    for (int ti = 0; ti < N_WTYPES; ti++) {
        const uint32_t wt = weight_types[ti];
        const mf_cpu_dot *d = mf_cpu_dot_get(wt, mf_cpu_ctx_isa(c));
        const size_t wr = mf_type_row_size(wt, n_in), ar = mf_type_row_size(d->act_type, n_in);
        uint8_t *w = malloc(wr * n_out), *a = malloc(ar * nt);
        float *x = malloc(sizeof(float) * n_in * nt), *y = malloc(sizeof(float) * n_out * nt);
        make_weights(wt, w, n_in, n_out, true);
        rand_floats(x, n_in * nt, 3.0f);
        mf_cpu_matmul(c, wt, w, n_in, n_out, x, nt, y);
        int bad = 0;
        for (int64_t t = 0; t < nt; t++) {
            mf_cpu_quantize_act(d->act_type, x + t * n_in, a + t * ar, n_in, MF_ISA_SCALAR);
            for (int64_t o = 0; o < n_out; o++) {
                float s;
                d->dot(n_in, &s, w + o * wr, a + t * ar);
                bad += memcmp(&s, &y[t * n_out + o], sizeof s) != 0;
            }
        }
        CHECK_MSG(bad == 0, "%s: %d matmul outputs differ from the dot kernel", mf_type_name(wt), bad);
        free(w);
        free(a);
        free(x);
        free(y);
    }
    mf_cpu_ctx_free(c);
}

MF_TEST(matmul_multi_equals_single) {
    const int64_t n_in = 768, nt = 5;
    const uint32_t types[3] = {MF_TYPE_Q4_0, MF_TYPE_Q4_K, MF_TYPE_F16};
    const int64_t outs[3] = {33, 17, 9};
    mf_cpu_ctx *c = mf_cpu_ctx_new(2);
    void *w[3];
    float *ym[3], *ys[3];
    mf_cpu_mm mm[3];
    float *x = malloc(sizeof(float) * n_in * nt);
    rand_floats(x, n_in * nt, 1.0f);
    for (int i = 0; i < 3; i++) {
        w[i] = malloc(mf_type_row_size(types[i], n_in) * outs[i]);
        make_weights(types[i], w[i], n_in, outs[i], false);
        ym[i] = malloc(sizeof(float) * outs[i] * nt);
        ys[i] = malloc(sizeof(float) * outs[i] * nt);
        mm[i] = (mf_cpu_mm){.wtype = types[i], .w = w[i], .n_out = outs[i], .y = ym[i]};
        mf_cpu_matmul(c, types[i], w[i], n_in, outs[i], x, nt, ys[i]);
    }
    mf_cpu_matmul_multi(c, mm, 3, n_in, x, nt);
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(memcmp(ym[i], ys[i], sizeof(float) * outs[i] * nt) == 0, "part %d (%s) differs", i,
                  mf_type_name(types[i]));
        free(w[i]);
        free(ym[i]);
        free(ys[i]);
    }
    free(x);
    mf_cpu_ctx_free(c);
}

/* The multi-token AVX-512 tiles (Q4_0/Q5_0/Q8_0/Q4_K/Q6_K) and the one-token
 * dots keep dot.c's canonical float order: at the real widths, with row
 * counts that leave partial 32-row panels and token counts that leave every
 * microkernel remainder, the best-ISA matmul equals the scalar twin bit for
 * bit, on 1 and 2 threads. */
MF_TEST(tiles_equal_scalar_twin_bits) {
    const uint32_t types[] = {MF_TYPE_Q4_0, MF_TYPE_Q5_0, MF_TYPE_Q8_0, MF_TYPE_Q4_K, MF_TYPE_Q6_K};
    const int64_t outs[] = {45, 3, 70};
    const int64_t nts[] = {1, 2, 5, 13, 131};
    mf_cpu_ctx *cs = mf_cpu_ctx_new(1), *c1 = mf_cpu_ctx_new(1), *c2 = mf_cpu_ctx_new(2);
    mf_cpu_ctx_set_isa(cs, MF_ISA_SCALAR);
    int cases = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t wi = 0; wi < N_WIDTHS; wi++) {
            const uint32_t wt = types[ti];
            const int64_t n_in = widths[wi];
            if (!block_divides(wt, n_in))
                continue;
            const int64_t n_out = outs[(ti + wi) % 3], nt = nts[(ti * 2 + wi) % 5];
            if (n_in > 4864 && nt > 13)
                continue; /* the scalar reference is slow */
            void *w = malloc(mf_type_row_size(wt, n_in) * (size_t)n_out);
            float *x = malloc(sizeof(float) * (size_t)(n_in * nt));
            float *ys = malloc(sizeof(float) * (size_t)(n_out * nt)), *y1 = malloc(sizeof(float) * (size_t)(n_out * nt));
            float *y2 = malloc(sizeof(float) * (size_t)(n_out * nt));
            make_weights(wt, w, n_in, n_out, false);
            rand_floats(x, n_in * nt, 2.0f);
            mf_cpu_matmul(cs, wt, w, n_in, n_out, x, nt, ys);
            mf_cpu_matmul(c1, wt, w, n_in, n_out, x, nt, y1);
            mf_cpu_matmul(c2, wt, w, n_in, n_out, x, nt, y2);
            /* only the AVX-512 kernels promise the canonical order; other
             * ISAs (NEON, AVX2) keep their own: there, thread-count
             * independence bit for bit and closeness to the scalar twin */
            const bool canon = mf_cpu_ctx_isa(c1) == MF_ISA_AVX512;
            int bad = 0;
            for (int64_t i = 0; i < n_out * nt; i++) {
                const bool same = canon ? memcmp(&ys[i], &y1[i], sizeof(float)) == 0
                                        : fabsf(ys[i] - y1[i]) <= 1e-4f * (1.0f + fabsf(ys[i]));
                bad += !same || memcmp(&y1[i], &y2[i], sizeof(float)) != 0;
            }
            CHECK_MSG(bad == 0, "%s n_in=%lld n_out=%lld nt=%lld: %d outputs differ from the scalar twin",
                      mf_type_name(wt), (long long)n_in, (long long)n_out, (long long)nt, bad);
            cases++;
            free(w);
            free(x);
            free(ys);
            free(y1);
            free(y2);
        }
    printf("  %d shapes %s the scalar twin (isa %s)\n", cases,
           mf_cpu_ctx_isa(c1) == MF_ISA_AVX512 ? "bit-identical to" : "thread-independent and close to",
           mf_cpu_isa_name(mf_cpu_ctx_isa(c1)));
    mf_cpu_ctx_free(cs);
    mf_cpu_ctx_free(c1);
    mf_cpu_ctx_free(c2);
}

#if defined(__x86_64__)
/* The four-row decode kernels (dot_avx512.c) equal the scalar twin bit for
 * bit on every row, at the real widths and at odd block counts (the
 * zero-padded last pair), with random valid bytes and quantized floats; the
 * vectorized Q8_0 block sums equal a scalar loop. */
MF_TEST(dot4_equals_scalar_bits) {
    if (mf_cpu_isa_best() < MF_ISA_AVX512) {
        printf("  (avx512 not available here)\n");
        return;
    }
    const uint32_t types[] = {MF_TYPE_Q4_0, MF_TYPE_Q5_0, MF_TYPE_Q8_0};
    const int64_t ns[] = {32, 96, 896, 1536, 3584, 4864, 4896, 8960, 18944};
    int cases = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            const uint32_t wt = types[ti];
            const int64_t n = ns[ni], nb = n / 32;
            const mf_vec_dot4_fn d4 = mf_cpu_dot4_avx512(wt);
            const mf_cpu_dot *d0 = mf_cpu_dot_get(wt, MF_ISA_SCALAR);
            CHECK(d4 != NULL);
            if (!d4)
                continue;
            const size_t wr = mf_type_row_size(wt, n);
            uint8_t *w = malloc(wr * 4), *a = malloc(mf_type_row_size(MF_TYPE_Q8_0, n));
            float *x = malloc(sizeof(float) * (size_t)n), *ad = malloc(sizeof(float) * (size_t)nb);
            int32_t *as = malloc(sizeof(int32_t) * (size_t)nb);
            make_weights(wt, w, n, 4, ni % 2 == 1);
            rand_floats(x, n, 2.0f);
            mf_cpu_quantize_act(MF_TYPE_Q8_0, x, a, n, MF_ISA_SCALAR);
            mf_cpu_q8_0_aux_avx512(a, nb, ad, as);
            const mf_block_q8_0 *ab = (const mf_block_q8_0 *)a;
            for (int64_t b = 0; b < nb; b++) {
                int sum = 0;
                for (int e = 0; e < 32; e++)
                    sum += ab[b].qs[e];
                CHECK(as[b] == sum && ad[b] == mf_fp16_to_fp32(ab[b].d));
            }
            float s4[4], s1;
            d4(n, s4, w, wr, a, ad, as);
            for (int r = 0; r < 4; r++) {
                d0->dot(n, &s1, w + (size_t)r * wr, a);
                CHECK_MSG(memcmp(&s1, &s4[r], sizeof s1) == 0, "%s n=%lld row %d: %.9g vs scalar %.9g",
                          mf_type_name(wt), (long long)n, r, s4[r], s1);
            }
            cases++;
            free(w);
            free(a);
            free(x);
            free(ad);
            free(as);
        }
    printf("  %d four-row cases bit-identical to the scalar twin\n", cases);
}

/* The AVX2 four-row decode kernels equal the AVX2 one-row kernel bit for
 * bit on every row (so a thread's grouping of rows never shows in the
 * result), with random valid bytes (q8_0 weights include -128) and
 * quantized activations, at the real widths and a single block. */
MF_TEST(dot4_avx2_equals_one_row_bits) {
    if (mf_cpu_isa_best() < MF_ISA_AVX2) {
        printf("  (avx2 not available here)\n");
        return;
    }
    const uint32_t types[] = {MF_TYPE_Q4_0, MF_TYPE_Q5_0, MF_TYPE_Q8_0};
    const int64_t ns[] = {32, 96, 896, 1536, 3584, 4864, 8960, 18944};
    int cases = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            const uint32_t wt = types[ti];
            const int64_t n = ns[ni];
            const mf_vec_dot4_fn d4 = mf_cpu_dot4_avx2(wt);
            const mf_cpu_dot *d1 = mf_cpu_dot_avx2(wt);
            CHECK(d4 != NULL && d1 != NULL);
            if (!d4 || !d1)
                continue;
            const size_t wr = mf_type_row_size(wt, n);
            uint8_t *w = malloc(wr * 4), *a = malloc(mf_type_row_size(MF_TYPE_Q8_0, n));
            float *x = malloc(sizeof(float) * (size_t)n);
            make_weights(wt, w, n, 4, ni % 2 == 0);
            rand_floats(x, n, 3.0f);
            mf_cpu_quantize_act(MF_TYPE_Q8_0, x, a, n, MF_ISA_AVX2);
            float s4[4] = {0}, s1;
            d4(n, s4, w, wr, a, NULL, NULL);
            for (int r = 0; r < 4; r++) {
                d1->dot(n, &s1, w + (size_t)r * wr, a);
                CHECK_MSG(memcmp(&s1, &s4[r], sizeof s1) == 0 && s1 != 0, "%s n=%lld row %d: %.9g vs one-row %.9g",
                          mf_type_name(wt), (long long)n, r, s4[r], s1);
            }
            cases++;
            free(w);
            free(a);
            free(x);
        }
    printf("  %d four-row AVX2 cases bit-identical to the one-row kernel\n", cases);
}
#endif

MF_TEST(dot_get_rejects_non_weights) {
    CHECK(mf_cpu_dot_get(MF_TYPE_Q8_K, MF_ISA_SCALAR) == NULL);
    CHECK(mf_cpu_dot_get(MF_TYPE_I32, mf_cpu_isa_best()) == NULL);
    CHECK(mf_cpu_dot_get(1000, MF_ISA_SCALAR) == NULL);
    CHECK(mf_cpu_dot_get(MF_TYPE_Q4_K, mf_cpu_isa_best())->act_type == MF_TYPE_Q8_K);
    printf("  best ISA here: %s\n", mf_cpu_isa_name(mf_cpu_isa_best()));
}

MF_TEST_MAIN(MF_T(scalar_dot_vs_f64), MF_T(act_quant_matches_reference), MF_T(isa_dot_vs_scalar), MF_T(iq4_avx2_bit_equal),
             MF_T(matmul_vs_f64_and_threads), MF_T(matmul_equals_dot_real_width), MF_T(matmul_multi_equals_single),
             MF_T(tiles_equal_scalar_twin_bits),
#if defined(__x86_64__)
             MF_T(dot4_equals_scalar_bits), MF_T(dot4_avx2_equals_one_row_bits),
#endif
             MF_T(dot_get_rejects_non_weights))
