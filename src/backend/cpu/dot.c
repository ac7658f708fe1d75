/* dot.c - portable scalar dot products for every weight type, the ISA
 * detection, and the dispatcher that picks a kernel per (type, ISA).
 *
 * Each scalar kernel decodes the weight block exactly as quant.c's
 * dequantizer does and sums integer products per sub-block before scaling, the
 * way the SIMD versions do, so scalar and SIMD differ only in the order of the
 * float additions across blocks. Q4_0/Q5_0/Q8_0/Q4_K/Q6_K fix that order too: the
 * canonical s = fma((float)isum_b, dw_b * da_b, s) over blocks, which the
 * AVX-512 dot and multi-token kernels reproduce bit for bit. The activation formats follow the GGUF
 * ecosystem: Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 (which carries d * sum(q)) for
 * Q4_1/Q5_1, Q8_K (which carries 16-element sums) for the K-quants, and plain
 * f32 for F32/F16/BF16 weights. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "backend/cpu/kernels_isa.h"
#include "quant/iq4.h"

#if MF_CPU_ARM && defined(__linux__) /* [neon] HWCAP bits for isa_hw */
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDHP
#define HWCAP_ASIMDHP (1ul << 10)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1ul << 20)
#endif
#endif

#if MF_CPU_X86
#include <cpuid.h>
#endif

static inline float h2f(uint16_t h) { return mf_fp16_to_fp32(h); }

/* ==== ISA detection ====================================================== */

/* What the hardware runs, ignoring the cap (MINFER_CPU_ISA): the ceiling for any
 * request, so no caller can reach an instruction the CPU lacks. */
static mf_cpu_isa isa_hw(void) {
#if MF_CPU_X86
    __builtin_cpu_init();
    /* clang 14 has no "f16c" feature string: CPUID.1:ECX bit 29 */
    unsigned eax, ebx, ecx = 0, edx;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vnni"))
        return MF_ISA_AVX512;
    if (avx2)
        return MF_ISA_AVX2;
#elif MF_CPU_ARM && defined(__linux__)
    /* [neon] dot_neon.c issues sdot (ASIMDDP) and is built with +fp16 (ASIMDHP) */
    const unsigned long caps = getauxval(AT_HWCAP);
    if ((caps & HWCAP_ASIMDDP) && (caps & HWCAP_ASIMDHP))
        return MF_ISA_NEON;
#elif MF_CPU_ARM && defined(__APPLE__)
    return MF_ISA_NEON; /* [neon] every arm64 Mac (M1 on) has FEAT_DotProd and FEAT_FP16 */
#endif
    return MF_ISA_SCALAR;
}

mf_cpu_isa mf_cpu_isa_clamp(mf_cpu_isa isa) {
    static _Atomic int hw_cached = -1; /* every thread computes the same value */
    int hw = atomic_load_explicit(&hw_cached, memory_order_relaxed);
    if (hw < 0) {
        hw = (int)isa_hw();
        atomic_store_explicit(&hw_cached, hw, memory_order_relaxed);
    }
#if MF_CPU_ARM /* [neon] an x86 ISA, or NEON on a CPU without dotprod, is scalar here */
    if ((int)isa >= MF_ISA_COUNT)
        isa = (mf_cpu_isa)hw;
    else if (isa != MF_ISA_SCALAR && (int)isa != hw)
        isa = MF_ISA_SCALAR;
#else
    if ((int)isa > hw || isa == MF_ISA_NEON)
        isa = (mf_cpu_isa)hw;
#endif
    return isa;
}

const char *mf_cpu_isa_name(mf_cpu_isa isa) {
    switch (isa) {
    case MF_ISA_SCALAR: return "scalar";
    case MF_ISA_AVX2: return "avx2";
    case MF_ISA_AVX512: return "avx512";
    case MF_ISA_NEON: return "neon";
    default: return "unknown";
    }
}

/* The cap set from the options (MF_ISA_COUNT: none) and the default it
 * gives, recomputed after every change of the cap. */
static _Atomic int isa_cap = MF_ISA_COUNT;
static _Atomic int isa_cached = -1; /* every thread computes the same value */

void mf_cpu_isa_set_cap(const char *want) {
    int cap = MF_ISA_COUNT;
    if (want && *want) {
        for (int i = 0; i < MF_ISA_COUNT && cap == MF_ISA_COUNT; i++)
            if (strcmp(want, mf_cpu_isa_name((mf_cpu_isa)i)) == 0)
                cap = i;
        if (cap == MF_ISA_COUNT)
            mf_log(MF_LOG_WARN, "MINFER_CPU_ISA='%s' is not one of scalar|avx2|avx512|neon; using %s", want,
                   mf_cpu_isa_name(mf_cpu_isa_clamp(MF_ISA_COUNT)));
    }
    atomic_store_explicit(&isa_cap, cap, memory_order_relaxed);
    atomic_store_explicit(&isa_cached, -1, memory_order_relaxed);
}

mf_cpu_isa mf_cpu_isa_best(void) {
    mf_cpu_isa best = mf_cpu_isa_clamp(MF_ISA_COUNT);
    const int cap = atomic_load_explicit(&isa_cap, memory_order_relaxed);
    if (cap < MF_ISA_COUNT)
        return mf_cpu_isa_clamp((mf_cpu_isa)cap < best ? (mf_cpu_isa)cap : best);
    return best;
}

mf_cpu_isa mf_cpu_isa_default(void) {
    int v = atomic_load_explicit(&isa_cached, memory_order_relaxed);
    if (v < 0) {
        v = (int)mf_cpu_isa_best();
        atomic_store_explicit(&isa_cached, v, memory_order_relaxed);
    }
    return (mf_cpu_isa)v;
}

/* ==== float dots ========================================================== */

float mf_cpu_dot_f32(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += a[i + k] * b[i + k];
    for (int k = 0; i < n; i++, k++)
        acc[k] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static void dot_f32(int64_t n, float *s, const void *w, const void *a) {
    *s = mf_cpu_dot_f32(w, a, n);
}

static void dot_f16(int64_t n, float *s, const void *vw, const void *va) {
    const uint16_t *w = vw;
    const float *a = va;
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += h2f(w[i + k]) * a[i + k];
    for (int k = 0; i < n; i++, k++)
        acc[k] += h2f(w[i]) * a[i];
    *s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static void dot_bf16(int64_t n, float *s, const void *vw, const void *va) {
    const uint16_t *w = vw;
    const float *a = va;
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += mf_bf16_to_fp32(w[i + k]) * a[i + k];
    for (int k = 0; i < n; i++, k++)
        acc[k] += mf_bf16_to_fp32(w[i]) * a[i];
    *s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* ==== 32-element blocks ==================================================== */

static void dot_q4_0(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q4_0 *w = vw;
    const mf_block_q8_0 *a = va;
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK4_0; b++) {
        int sumi = 0;
        for (int j = 0; j < MF_QK4_0 / 2; j++) {
            sumi += ((w[b].qs[j] & 0x0f) - 8) * a[b].qs[j];
            sumi += ((w[b].qs[j] >> 4) - 8) * a[b].qs[j + MF_QK4_0 / 2];
        }
        sum = fmaf((float)sumi, h2f(w[b].d) * h2f(a[b].d), sum);
    }
    *s = sum;
}

static void dot_q4_1(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q4_1 *w = vw;
    const mf_block_q8_1 *a = va;
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK4_1; b++) {
        int sumi = 0;
        for (int j = 0; j < MF_QK4_1 / 2; j++) {
            sumi += (w[b].qs[j] & 0x0f) * a[b].qs[j];
            sumi += (w[b].qs[j] >> 4) * a[b].qs[j + MF_QK4_1 / 2];
        }
        sum += (float)sumi * (h2f(w[b].d) * h2f(a[b].d)) + h2f(w[b].m) * h2f(a[b].s);
    }
    *s = sum;
}

static inline uint32_t load_u32(const uint8_t p[4]) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void dot_q5_0(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q5_0 *w = vw;
    const mf_block_q8_0 *a = va;
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK5_0; b++) {
        const uint32_t qh = load_u32(w[b].qh);
        int sumi = 0;
        for (int j = 0; j < MF_QK5_0 / 2; j++) {
            const int lo = (w[b].qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
            const int hi = (w[b].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            sumi += (lo - 16) * a[b].qs[j] + (hi - 16) * a[b].qs[j + MF_QK5_0 / 2];
        }
        sum = fmaf((float)sumi, h2f(w[b].d) * h2f(a[b].d), sum);
    }
    *s = sum;
}

static void dot_q5_1(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q5_1 *w = vw;
    const mf_block_q8_1 *a = va;
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK5_1; b++) {
        const uint32_t qh = load_u32(w[b].qh);
        int sumi = 0;
        for (int j = 0; j < MF_QK5_1 / 2; j++) {
            const int lo = (w[b].qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
            const int hi = (w[b].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            sumi += lo * a[b].qs[j] + hi * a[b].qs[j + MF_QK5_1 / 2];
        }
        sum += (float)sumi * (h2f(w[b].d) * h2f(a[b].d)) + h2f(w[b].m) * h2f(a[b].s);
    }
    *s = sum;
}

static void dot_q8_0(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q8_0 *w = vw;
    const mf_block_q8_0 *a = va;
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK8_0; b++) {
        int sumi = 0;
        for (int j = 0; j < MF_QK8_0; j++)
            sumi += w[b].qs[j] * a[b].qs[j];
        sum = fmaf((float)sumi, h2f(w[b].d) * h2f(a[b].d), sum);
    }
    *s = sum;
}

/* ==== K-quants (super-blocks of 256 against Q8_K) ========================== */

/* 2-bit level of element e (0..255) in the shared Q2_K/Q3_K packing: four
 * 32-element groups per 32 bytes, group g of a 128-half at bit 2g. */
static inline int k_q2(const uint8_t *qs, int e) {
    return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

static void dot_q2_K(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q2_K *w = vw;
    const mf_block_q8_K *a = va;
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        int isum = 0, summs = 0;
        for (int j = 0; j < MF_QK_K / 16; j++) {
            int sumi = 0;
            for (int e = 16 * j; e < 16 * j + 16; e++)
                sumi += k_q2(w[b].qs, e) * a[b].qs[e];
            isum += (w[b].scales[j] & 0x0f) * sumi;
            summs += (w[b].scales[j] >> 4) * a[b].bsums[j];
        }
        const float dall = a[b].d * h2f(w[b].d), dmin = a[b].d * h2f(w[b].dmin);
        sum += dall * (float)isum - dmin * (float)summs;
    }
    *s = sum;
}

/* Signed 6-bit scale j (0..15) of a Q3_K block (stored biased by 32). */
static inline int q3_K_scale(const uint8_t sc[12], int j) {
    const int lo = j < 8 ? (sc[j] & 0x0f) : (sc[j - 8] >> 4);
    const int hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

static void dot_q3_K(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q3_K *w = vw;
    const mf_block_q8_K *a = va;
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        int isum = 0;
        for (int j = 0; j < MF_QK_K / 16; j++) {
            int sumi = 0;
            for (int e = 16 * j; e < 16 * j + 16; e++) {
                int q = k_q2(w[b].qs, e);
                if (!((w[b].hmask[e % 32] >> (e / 32)) & 1))
                    q -= 4;
                sumi += q * a[b].qs[e];
            }
            isum += q3_K_scale(w[b].scales, j) * sumi;
        }
        sum += a[b].d * h2f(w[b].d) * (float)isum;
    }
    *s = sum;
}

/* 6-bit scale and min of 32-group j (0..7) of a Q4_K/Q5_K block. */
static inline void k4_scale_min(const uint8_t s[12], int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static void dot_q4_K(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q4_K *w = vw;
    const mf_block_q8_K *a = va;
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        int isum = 0, summ = 0;
        for (int j = 0; j < MF_QK_K / 32; j++) {
            int sc, m, sumi = 0;
            k4_scale_min(w[b].scales, j, &sc, &m);
            const uint8_t *q = w[b].qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            for (int l = 0; l < 32; l++)
                sumi += ((q[l] >> shift) & 0x0f) * a[b].qs[32 * j + l];
            isum += sc * sumi;
            summ += m * (a[b].bsums[2 * j] + a[b].bsums[2 * j + 1]);
        }
        sum = fmaf((float)isum, h2f(w[b].d) * a[b].d, sum); /* canonical order, as Q4_0 */
        sum = fmaf(-(float)summ, h2f(w[b].dmin) * a[b].d, sum);
    }
    *s = sum;
}

static void dot_q5_K(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q5_K *w = vw;
    const mf_block_q8_K *a = va;
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        int isum = 0, summ = 0;
        for (int j = 0; j < MF_QK_K / 32; j++) {
            int sc, m, sumi = 0;
            k4_scale_min(w[b].scales, j, &sc, &m);
            const uint8_t *q = w[b].qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            for (int l = 0; l < 32; l++) {
                const int v = ((q[l] >> shift) & 0x0f) | (((w[b].qh[l] >> j) & 1) << 4);
                sumi += v * a[b].qs[32 * j + l];
            }
            isum += sc * sumi;
            summ += m * (a[b].bsums[2 * j] + a[b].bsums[2 * j + 1]);
        }
        sum += a[b].d * h2f(w[b].d) * (float)isum - a[b].d * h2f(w[b].dmin) * (float)summ;
    }
    *s = sum;
}

/* Level (0..63) of element e of a Q6_K block: per 128-half, 32-group g takes
 * its low nibble from ql (groups 0/1 low nibbles, 2/3 high nibbles) and its two
 * high bits from qh at bit 2g. */
static inline int q6_K_level(const mf_block_q6_K *x, int e) {
    const int half = e / 128, r = e % 128, g = r / 32, l = r % 32;
    const int lo = (x->ql[64 * half + l + 32 * (g & 1)] >> (4 * (g >> 1))) & 0x0f;
    const int hi = (x->qh[32 * half + l] >> (2 * g)) & 3;
    return lo | (hi << 4);
}

static void dot_q6_K(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q6_K *w = vw;
    const mf_block_q8_K *a = va;
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        int isum = 0;
        for (int j = 0; j < MF_QK_K / 16; j++) {
            int sumi = 0;
            for (int e = 16 * j; e < 16 * j + 16; e++)
                sumi += (q6_K_level(&w[b], e) - 32) * a[b].qs[e];
            isum += w[b].scales[j] * sumi;
        }
        sum = fmaf((float)isum, h2f(w[b].d) * a[b].d, sum); /* canonical order, as Q4_0 */
    }
    *s = sum;
}

/* ==== tables and dispatch ================================================== */

/* IQ4_NL x Q8_0: both blocks are 32 wide; the codebook levels are integers,
 * so the block's products sum exactly before the two scales. */
static void dot_iq4_nl(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_iq4_nl *w = vw;
    const mf_block_q8_0 *a = va;
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK4_NL; b++) {
        int isum = 0;
        for (int j = 0; j < 16; j++)
            isum += mf_iq4_values[w[b].qs[j] & 0xF] * a[b].qs[j] +
                    mf_iq4_values[w[b].qs[j] >> 4] * a[b].qs[j + 16];
        sum = fmaf((float)isum, h2f(w[b].d) * h2f(a[b].d), sum);
    }
    *s = sum;
}

/* IQ4_XS x Q8_K: one integer sum per 32-element sub-block, times its 6-bit
 * scale, then the super-block scales. */
static void dot_iq4_xs(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_iq4_xs *w = vw;
    const mf_block_q8_K *a = va;
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        int isum = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *qs = w[b].qs + 16 * ib;
            const int8_t *q8 = a[b].qs + 32 * ib;
            int sub = 0;
            for (int j = 0; j < 16; j++)
                sub += mf_iq4_values[qs[j] & 0xF] * q8[j] + mf_iq4_values[qs[j] >> 4] * q8[j + 16];
            isum += mf_iq4_xs_scale(&w[b], ib) * sub;
        }
        sum = fmaf((float)isum, h2f(w[b].d) * a[b].d, sum);
    }
    *s = sum;
}

static const mf_cpu_dot dots_scalar[MF_TYPE_COUNT] = {
    [MF_TYPE_F32] = {MF_TYPE_F32, dot_f32},
    [MF_TYPE_F16] = {MF_TYPE_F32, dot_f16},
    [MF_TYPE_BF16] = {MF_TYPE_F32, dot_bf16},
    [MF_TYPE_Q4_0] = {MF_TYPE_Q8_0, dot_q4_0},
    [MF_TYPE_Q4_1] = {MF_TYPE_Q8_1, dot_q4_1},
    [MF_TYPE_Q5_0] = {MF_TYPE_Q8_0, dot_q5_0},
    [MF_TYPE_Q5_1] = {MF_TYPE_Q8_1, dot_q5_1},
    [MF_TYPE_Q8_0] = {MF_TYPE_Q8_0, dot_q8_0},
    [MF_TYPE_Q2_K] = {MF_TYPE_Q8_K, dot_q2_K},
    [MF_TYPE_Q3_K] = {MF_TYPE_Q8_K, dot_q3_K},
    [MF_TYPE_Q4_K] = {MF_TYPE_Q8_K, dot_q4_K},
    [MF_TYPE_Q5_K] = {MF_TYPE_Q8_K, dot_q5_K},
    [MF_TYPE_Q6_K] = {MF_TYPE_Q8_K, dot_q6_K},
    [MF_TYPE_IQ4_NL] = {MF_TYPE_Q8_0, dot_iq4_nl},
    [MF_TYPE_IQ4_XS] = {MF_TYPE_Q8_K, dot_iq4_xs},
};

const mf_cpu_dot *mf_cpu_dot_scalar(uint32_t wtype) {
    if (wtype >= MF_TYPE_COUNT || !dots_scalar[wtype].dot)
        return NULL;
    return &dots_scalar[wtype];
}

uint32_t mf_cpu_act_type(uint32_t wtype) {
    const mf_cpu_dot *d = mf_cpu_dot_scalar(wtype);
    return d ? d->act_type : MF_TYPE_COUNT;
}

const mf_cpu_dot *mf_cpu_dot_get(uint32_t wtype, mf_cpu_isa isa) {
    const mf_cpu_dot *d = NULL;
    isa = mf_cpu_isa_clamp(isa);
#if MF_CPU_X86
    if (isa >= MF_ISA_AVX512)
        d = mf_cpu_dot_avx512(wtype);
    if (!d && isa >= MF_ISA_AVX2)
        d = mf_cpu_dot_avx2(wtype);
    if (!d && isa >= MF_ISA_AVX2)
        d = mf_cpu_dot_iq4_avx2(wtype);
#endif
#if MF_CPU_ARM /* [neon] */
    if (isa == MF_ISA_NEON)
        d = mf_cpu_dot_neon(wtype);
#endif
    return d ? d : mf_cpu_dot_scalar(wtype);
}
