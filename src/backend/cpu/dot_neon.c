/* dot_neon.c - ARMv8.2 NEON + dotprod dot products and activation quantizers.
 *
 * Compiled with -march=armv8.2-a+dotprod+fp16 on aarch64 only; reached only
 * through mf_cpu_dot_get / mf_cpu_quantize_act after the HWCAP check in dot.c
 * said the CPU has ASIMDDP and ASIMDHP. Every integer kernel feeds signed
 * bytes to sdot (vdotq_s32: four int8 x int8 products summed into each int32
 * lane). Weight levels are made signed before the dot (Q4_0 - 8, Q5_0 - 16,
 * Q3_K - 4, Q6_K - 32), or are unsigned levels below 64 that read the same as
 * int8, so no bias correction through the activation sums is needed except
 * where the format itself carries a min (Q4_1/Q5_1 through s, Q2_K/Q4_K/Q5_K
 * through bsums). The 32-block kernels scale per block in float lanes; the
 * K-quant kernels keep each super-block's sub-block sums in int32 and scale
 * once per super-block, in the same float order as the scalar twin. The
 * quantizers reproduce the scalar bytes exactly: same float operations, FCVTAS
 * (ties away, as roundf) for Q8_0/Q8_1, FCVTNS (ties to even) for Q8_K, and
 * fmaxnm so a NaN is ignored the way fmaxf ignores it. */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/kernels_isa.h"

/* ==== helpers ============================================================== */

static inline float h2f(uint16_t h) {
    __fp16 f;
    memcpy(&f, &h, sizeof f);
    return (float)f; /* FCVT: exact for every f16 value */
}

static inline uint32_t load_u32(const uint8_t p[4]) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline int8x16_t s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

/* sdot of two 16-byte halves against 32 activation bytes. */
static inline int32x4_t dot32(int8x16_t w0, int8x16_t w1, const int8_t *a) {
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, vld1q_s8(a)), w1, vld1q_s8(a + 16));
}

static inline int32x4_t dot16(int8x16_t w, const int8_t *a) { return vdotq_s32(vdupq_n_s32(0), w, vld1q_s8(a)); }

/* Bits 0..15 of m -> 0x10 in byte i where bit i is set, else 0 (the fifth
 * bit of a Q5 level). */
static inline uint8x16_t bit5_bytes(uint32_t m) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t v = vcombine_u8(vdup_n_u8((uint8_t)m), vdup_n_u8((uint8_t)(m >> 8)));
    return vandq_u8(vtstq_u8(v, vld1q_u8(bit)), vdupq_n_u8(0x10));
}

/* (v >> sh) & mask for a shift known only at run time (USHL by -sh). */
static inline uint8x16_t shr_and(uint8x16_t v, int sh, uint8_t mask) {
    return vandq_u8(vshlq_u8(v, vdupq_n_s8((int8_t)-sh)), vdupq_n_u8(mask));
}

/* ==== float dots =========================================================== */

static void dot_f32(int64_t n, float *s, const void *vw, const void *va) {
    const float *w = vw, *a = va;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = vfmaq_f32(acc0, vld1q_f32(w + i), vld1q_f32(a + i));
        acc1 = vfmaq_f32(acc1, vld1q_f32(w + i + 4), vld1q_f32(a + i + 4));
        acc2 = vfmaq_f32(acc2, vld1q_f32(w + i + 8), vld1q_f32(a + i + 8));
        acc3 = vfmaq_f32(acc3, vld1q_f32(w + i + 12), vld1q_f32(a + i + 12));
    }
    for (; i + 4 <= n; i += 4)
        acc0 = vfmaq_f32(acc0, vld1q_f32(w + i), vld1q_f32(a + i));
    float t = 0;
    for (; i < n; i++)
        t += w[i] * a[i];
    *s = vaddvq_f32(vaddq_f32(vaddq_f32(acc0, acc1), vaddq_f32(acc2, acc3))) + t;
}

static void dot_f16(int64_t n, float *s, const void *vw, const void *va) {
    const uint16_t *w = vw;
    const float *a = va;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const float16x8_t h0 = vreinterpretq_f16_u16(vld1q_u16(w + i));
        const float16x8_t h1 = vreinterpretq_f16_u16(vld1q_u16(w + i + 8));
        acc0 = vfmaq_f32(acc0, vcvt_f32_f16(vget_low_f16(h0)), vld1q_f32(a + i));
        acc1 = vfmaq_f32(acc1, vcvt_high_f32_f16(h0), vld1q_f32(a + i + 4));
        acc2 = vfmaq_f32(acc2, vcvt_f32_f16(vget_low_f16(h1)), vld1q_f32(a + i + 8));
        acc3 = vfmaq_f32(acc3, vcvt_high_f32_f16(h1), vld1q_f32(a + i + 12));
    }
    for (; i + 4 <= n; i += 4)
        acc0 = vfmaq_f32(acc0, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(w + i))), vld1q_f32(a + i));
    float t = 0;
    for (; i < n; i++)
        t += h2f(w[i]) * a[i];
    *s = vaddvq_f32(vaddq_f32(vaddq_f32(acc0, acc1), vaddq_f32(acc2, acc3))) + t;
}

static void dot_bf16(int64_t n, float *s, const void *vw, const void *va) {
    const uint16_t *w = vw;
    const float *a = va;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint16x8_t b = vld1q_u16(w + i); /* bf16 is the top half of an f32 */
        acc0 = vfmaq_f32(acc0, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(b), 16)), vld1q_f32(a + i));
        acc1 = vfmaq_f32(acc1, vreinterpretq_f32_u32(vshll_high_n_u16(b, 16)), vld1q_f32(a + i + 4));
    }
    float t = 0;
    for (; i < n; i++)
        t += mf_bf16_to_fp32(w[i]) * a[i];
    *s = vaddvq_f32(vaddq_f32(acc0, acc1)) + t;
}

/* ==== 32-element blocks ===================================================== */

/* Each helper returns the block's integer dot in four lanes; the loops keep
 * two float accumulators so consecutive blocks do not wait on each other. */

static inline int32x4_t q4_0_dot(const mf_block_q4_0 *w, const mf_block_q8_0 *a) {
    const uint8x16_t q = vld1q_u8(w->qs);
    const int8x16_t eight = vdupq_n_s8(8);
    const int8x16_t lo = vsubq_s8(s8(vandq_u8(q, vdupq_n_u8(0x0f))), eight);
    const int8x16_t hi = vsubq_s8(s8(vshrq_n_u8(q, 4)), eight);
    return dot32(lo, hi, a->qs);
}

static void dot_q4_0(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q4_0 *w = vw;
    const mf_block_q8_0 *a = va;
    const int64_t nb = n / MF_QK4_0;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(q4_0_dot(&w[b], &a[b])), h2f(w[b].d) * h2f(a[b].d));
        acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(q4_0_dot(&w[b + 1], &a[b + 1])), h2f(w[b + 1].d) * h2f(a[b + 1].d));
    }
    if (b < nb)
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(q4_0_dot(&w[b], &a[b])), h2f(w[b].d) * h2f(a[b].d));
    *s = vaddvq_f32(vaddq_f32(acc0, acc1));
}

static inline int32x4_t q4_1_dot(const mf_block_q4_1 *w, const mf_block_q8_1 *a) {
    const uint8x16_t q = vld1q_u8(w->qs);
    return dot32(s8(vandq_u8(q, vdupq_n_u8(0x0f))), s8(vshrq_n_u8(q, 4)), a->qs);
}

static void dot_q4_1(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q4_1 *w = vw;
    const mf_block_q8_1 *a = va;
    const int64_t nb = n / MF_QK4_1;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;
    float sm = 0;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(q4_1_dot(&w[b], &a[b])), h2f(w[b].d) * h2f(a[b].d));
        acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(q4_1_dot(&w[b + 1], &a[b + 1])), h2f(w[b + 1].d) * h2f(a[b + 1].d));
        sm += h2f(w[b].m) * h2f(a[b].s) + h2f(w[b + 1].m) * h2f(a[b + 1].s);
    }
    if (b < nb) {
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(q4_1_dot(&w[b], &a[b])), h2f(w[b].d) * h2f(a[b].d));
        sm += h2f(w[b].m) * h2f(a[b].s);
    }
    *s = vaddvq_f32(vaddq_f32(acc0, acc1)) + sm;
}

/* Q5 levels: the low nibbles of qs[j] are elements j, the high nibbles
 * elements j + 16; bit j of qh is the fifth bit of element j. */
static inline int32x4_t q5_dot(const uint8_t qs[16], uint32_t qh, const int8_t *a, uint8_t bias) {
    const uint8x16_t q = vld1q_u8(qs), vb = vdupq_n_u8(bias);
    const uint8x16_t lo = vorrq_u8(vandq_u8(q, vdupq_n_u8(0x0f)), bit5_bytes(qh));
    const uint8x16_t hi = vorrq_u8(vshrq_n_u8(q, 4), bit5_bytes(qh >> 16));
    return dot32(vsubq_s8(s8(lo), s8(vb)), vsubq_s8(s8(hi), s8(vb)), a);
}

static void dot_q5_0(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q5_0 *w = vw;
    const mf_block_q8_0 *a = va;
    const int64_t nb = n / MF_QK5_0;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        const int32x4_t p0 = q5_dot(w[b].qs, load_u32(w[b].qh), a[b].qs, 16);
        const int32x4_t p1 = q5_dot(w[b + 1].qs, load_u32(w[b + 1].qh), a[b + 1].qs, 16);
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), h2f(w[b].d) * h2f(a[b].d));
        acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(p1), h2f(w[b + 1].d) * h2f(a[b + 1].d));
    }
    if (b < nb) {
        const int32x4_t p0 = q5_dot(w[b].qs, load_u32(w[b].qh), a[b].qs, 16);
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), h2f(w[b].d) * h2f(a[b].d));
    }
    *s = vaddvq_f32(vaddq_f32(acc0, acc1));
}

static void dot_q5_1(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q5_1 *w = vw;
    const mf_block_q8_1 *a = va;
    const int64_t nb = n / MF_QK5_1;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;
    float sm = 0;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        const int32x4_t p0 = q5_dot(w[b].qs, load_u32(w[b].qh), a[b].qs, 0);
        const int32x4_t p1 = q5_dot(w[b + 1].qs, load_u32(w[b + 1].qh), a[b + 1].qs, 0);
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), h2f(w[b].d) * h2f(a[b].d));
        acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(p1), h2f(w[b + 1].d) * h2f(a[b + 1].d));
        sm += h2f(w[b].m) * h2f(a[b].s) + h2f(w[b + 1].m) * h2f(a[b + 1].s);
    }
    if (b < nb) {
        const int32x4_t p0 = q5_dot(w[b].qs, load_u32(w[b].qh), a[b].qs, 0);
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), h2f(w[b].d) * h2f(a[b].d));
        sm += h2f(w[b].m) * h2f(a[b].s);
    }
    *s = vaddvq_f32(vaddq_f32(acc0, acc1)) + sm;
}

static void dot_q8_0(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q8_0 *w = vw;
    const mf_block_q8_0 *a = va;
    const int64_t nb = n / MF_QK8_0;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        const int32x4_t p0 = dot32(vld1q_s8(w[b].qs), vld1q_s8(w[b].qs + 16), a[b].qs);
        const int32x4_t p1 = dot32(vld1q_s8(w[b + 1].qs), vld1q_s8(w[b + 1].qs + 16), a[b + 1].qs);
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), h2f(w[b].d) * h2f(a[b].d));
        acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(p1), h2f(w[b + 1].d) * h2f(a[b + 1].d));
    }
    if (b < nb) {
        const int32x4_t p0 = dot32(vld1q_s8(w[b].qs), vld1q_s8(w[b].qs + 16), a[b].qs);
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), h2f(w[b].d) * h2f(a[b].d));
    }
    *s = vaddvq_f32(vaddq_f32(acc0, acc1));
}

/* ==== K-quants (super-blocks of 256 against Q8_K) ============================ */

/* Element e of a super-block sits, for Q2_K/Q3_K/Q6_K, in half h = e / 128,
 * 32-group g = (e % 128) / 32, lane l = e % 32; 16-element sub-block
 * j = 8h + 2g (+1 for l >= 16). The loops below walk (h, g) and handle the
 * two 16-lane halves of each group with their own scale. */

static void dot_q2_K(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q2_K *w = vw;
    const mf_block_q8_K *a = va;
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        const uint8_t *sc = w[b].scales;
        /* sum over sub-blocks of min_j * bsums_j, in int16 x int16 -> int32 */
        const uint8x16_t scv = vld1q_u8(sc), mins = vshrq_n_u8(scv, 4);
        const int16x8_t m0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins)));
        const int16x8_t m1 = vreinterpretq_s16_u16(vmovl_high_u8(mins));
        const int16x8_t bs0 = vld1q_s16(a[b].bsums), bs1 = vld1q_s16(a[b].bsums + 8);
        int32x4_t ms = vmull_s16(vget_low_s16(m0), vget_low_s16(bs0));
        ms = vmlal_high_s16(ms, m0, bs0);
        ms = vmlal_s16(ms, vget_low_s16(m1), vget_low_s16(bs1));
        ms = vmlal_high_s16(ms, m1, bs1);
        const int summs = vaddvq_s32(ms);

        int32x4_t isum = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            const uint8x16_t q0 = vld1q_u8(w[b].qs + 32 * h), q1 = vld1q_u8(w[b].qs + 32 * h + 16);
            const int8_t *aq = a[b].qs + 128 * h;
            for (int g = 0; g < 4; g++) {
                const int j = 8 * h + 2 * g;
                isum = vmlaq_n_s32(isum, dot16(s8(shr_and(q0, 2 * g, 3)), aq + 32 * g), sc[j] & 0x0f);
                isum = vmlaq_n_s32(isum, dot16(s8(shr_and(q1, 2 * g, 3)), aq + 32 * g + 16), sc[j + 1] & 0x0f);
            }
        }
        const float dall = a[b].d * h2f(w[b].d), dmin = a[b].d * h2f(w[b].dmin);
        sum += dall * (float)vaddvq_s32(isum) - dmin * (float)summs;
    }
    *s = sum;
}

static void dot_q3_K(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q3_K *w = vw;
    const mf_block_q8_K *a = va;
    const int8x16_t four = vdupq_n_s8(4);
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        int sc[16];
        const uint8_t *ps = w[b].scales;
        for (int j = 0; j < 16; j++) { /* 6-bit scales biased by 32: 4 low bits, then 2 high */
            const int lo = j < 8 ? (ps[j] & 0x0f) : (ps[j - 8] >> 4);
            sc[j] = (lo | (((ps[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
        }
        const uint8x16_t hm0 = vld1q_u8(w[b].hmask), hm1 = vld1q_u8(w[b].hmask + 16);
        int32x4_t isum = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            const uint8x16_t q0 = vld1q_u8(w[b].qs + 32 * h), q1 = vld1q_u8(w[b].qs + 32 * h + 16);
            const int8_t *aq = a[b].qs + 128 * h;
            for (int g = 0; g < 4; g++) {
                /* level = q2 + 4 * hbit - 4, in [-4, 3] */
                const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << (4 * h + g)));
                const uint8x16_t h0 = vandq_u8(vtstq_u8(hm0, bit), vdupq_n_u8(4));
                const uint8x16_t h1 = vandq_u8(vtstq_u8(hm1, bit), vdupq_n_u8(4));
                const int8x16_t v0 = vsubq_s8(s8(vorrq_u8(shr_and(q0, 2 * g, 3), h0)), four);
                const int8x16_t v1 = vsubq_s8(s8(vorrq_u8(shr_and(q1, 2 * g, 3), h1)), four);
                const int j = 8 * h + 2 * g;
                isum = vmlaq_n_s32(isum, dot16(v0, aq + 32 * g), sc[j]);
                isum = vmlaq_n_s32(isum, dot16(v1, aq + 32 * g + 16), sc[j + 1]);
            }
        }
        sum += a[b].d * h2f(w[b].d) * (float)vaddvq_s32(isum);
    }
    *s = sum;
}

/* Unpacks the 6-bit scales and mins of the 8 groups of a Q4_K/Q5_K block. */
static inline void k4_unpack(const uint8_t s[12], int sc[8], int m[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 6) << 4);
        m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
}

/* Q4_K/Q5_K: 32-group j covers elements 32j..32j+31; groups 2p and 2p+1
 * share the 32 bytes qs[32p..], low and high nibbles. */
static void dot_q4_K(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q4_K *w = vw;
    const mf_block_q8_K *a = va;
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        int sc[8], m[8], summ = 0;
        k4_unpack(w[b].scales, sc, m);
        for (int j = 0; j < 8; j++)
            summ += m[j] * (a[b].bsums[2 * j] + a[b].bsums[2 * j + 1]);
        int32x4_t isum = vdupq_n_s32(0);
        for (int p = 0; p < 4; p++) {
            const uint8x16_t q0 = vld1q_u8(w[b].qs + 32 * p), q1 = vld1q_u8(w[b].qs + 32 * p + 16);
            const int8_t *aq = a[b].qs + 64 * p;
            const int32x4_t lo = dot32(s8(vandq_u8(q0, m4)), s8(vandq_u8(q1, m4)), aq);
            const int32x4_t hi = dot32(s8(vshrq_n_u8(q0, 4)), s8(vshrq_n_u8(q1, 4)), aq + 32);
            isum = vmlaq_n_s32(isum, lo, sc[2 * p]);
            isum = vmlaq_n_s32(isum, hi, sc[2 * p + 1]);
        }
        sum += a[b].d * h2f(w[b].d) * (float)vaddvq_s32(isum) - a[b].d * h2f(w[b].dmin) * (float)summ;
    }
    *s = sum;
}

static void dot_q5_K(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q5_K *w = vw;
    const mf_block_q8_K *a = va;
    const uint8x16_t m4 = vdupq_n_u8(0x0f), b5 = vdupq_n_u8(0x10);
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        int sc[8], m[8], summ = 0;
        k4_unpack(w[b].scales, sc, m);
        for (int j = 0; j < 8; j++)
            summ += m[j] * (a[b].bsums[2 * j] + a[b].bsums[2 * j + 1]);
        /* bit j of qh[l] is the fifth bit of element 32j + l */
        const uint8x16_t qh0 = vld1q_u8(w[b].qh), qh1 = vld1q_u8(w[b].qh + 16);
        int32x4_t isum = vdupq_n_s32(0);
        for (int p = 0; p < 4; p++) {
            const uint8x16_t q0 = vld1q_u8(w[b].qs + 32 * p), q1 = vld1q_u8(w[b].qs + 32 * p + 16);
            const uint8x16_t bl = vdupq_n_u8((uint8_t)(1u << (2 * p))), bh = vdupq_n_u8((uint8_t)(2u << (2 * p)));
            const int8_t *aq = a[b].qs + 64 * p;
            const uint8x16_t l0 = vorrq_u8(vandq_u8(q0, m4), vandq_u8(vtstq_u8(qh0, bl), b5));
            const uint8x16_t l1 = vorrq_u8(vandq_u8(q1, m4), vandq_u8(vtstq_u8(qh1, bl), b5));
            const uint8x16_t u0 = vorrq_u8(vshrq_n_u8(q0, 4), vandq_u8(vtstq_u8(qh0, bh), b5));
            const uint8x16_t u1 = vorrq_u8(vshrq_n_u8(q1, 4), vandq_u8(vtstq_u8(qh1, bh), b5));
            isum = vmlaq_n_s32(isum, dot32(s8(l0), s8(l1), aq), sc[2 * p]);
            isum = vmlaq_n_s32(isum, dot32(s8(u0), s8(u1), aq + 32), sc[2 * p + 1]);
        }
        sum += a[b].d * h2f(w[b].d) * (float)vaddvq_s32(isum) - a[b].d * h2f(w[b].dmin) * (float)summ;
    }
    *s = sum;
}

/* Q6_K: in half h, group g takes its low nibble from ql[64h + l + 32 (g & 1)]
 * (low nibble for g < 2, high for g >= 2) and its two high bits from
 * qh[32h + l] at bit 2g; levels are biased by 32. */
static void dot_q6_K(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q6_K *w = vw;
    const mf_block_q8_K *a = va;
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    const int8x16_t bias = vdupq_n_s8(32);
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        const int8_t *sc = w[b].scales;
        int32x4_t isum = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w[b].ql + 64 * h;
            const uint8x16_t l[4] = {vld1q_u8(ql), vld1q_u8(ql + 16), vld1q_u8(ql + 32), vld1q_u8(ql + 48)};
            const uint8x16_t qh0 = vld1q_u8(w[b].qh + 32 * h), qh1 = vld1q_u8(w[b].qh + 32 * h + 16);
            const int8_t *aq = a[b].qs + 128 * h;
            for (int g = 0; g < 4; g++) {
                const uint8x16_t src0 = l[2 * (g & 1)], src1 = l[2 * (g & 1) + 1];
                const uint8x16_t lo0 = g < 2 ? vandq_u8(src0, m4) : vshrq_n_u8(src0, 4);
                const uint8x16_t lo1 = g < 2 ? vandq_u8(src1, m4) : vshrq_n_u8(src1, 4);
                const uint8x16_t hi0 = vshlq_n_u8(shr_and(qh0, 2 * g, 3), 4);
                const uint8x16_t hi1 = vshlq_n_u8(shr_and(qh1, 2 * g, 3), 4);
                const int8x16_t v0 = vsubq_s8(s8(vorrq_u8(lo0, hi0)), bias);
                const int8x16_t v1 = vsubq_s8(s8(vorrq_u8(lo1, hi1)), bias);
                const int j = 8 * h + 2 * g;
                isum = vmlaq_n_s32(isum, dot16(v0, aq + 32 * g), sc[j]);
                isum = vmlaq_n_s32(isum, dot16(v1, aq + 32 * g + 16), sc[j + 1]);
            }
        }
        sum += a[b].d * h2f(w[b].d) * (float)vaddvq_s32(isum);
    }
    *s = sum;
}

/* ==== activation quantizers ================================================== */

/* 16 int32 in four vectors -> 16 int8 in element order (values fit). */
static inline int8x16_t narrow16(int32x4_t q0, int32x4_t q1, int32x4_t q2, int32x4_t q3) {
    const int16x8_t h0 = vcombine_s16(vmovn_s32(q0), vmovn_s32(q1));
    const int16x8_t h1 = vcombine_s16(vmovn_s32(q2), vmovn_s32(q3));
    return vcombine_s8(vmovn_s16(h0), vmovn_s16(h1));
}

/* One 32-block to levels roundf(x * id); stores d as f16 in *dh and returns
 * d as float in *df and the level sum. */
static inline int q8_block(const float *x, int8_t *qs, uint16_t *dh, float *df) {
    float32x4_t v[8];
    float32x4_t mx = vdupq_n_f32(0);
    for (int k = 0; k < 8; k++) {
        v[k] = vld1q_f32(x + 4 * k);
        mx = vmaxnmq_f32(mx, vabsq_f32(v[k]));
    }
    const float d = vmaxnmvq_f32(mx) / 127;
    const float id = d ? 1.0f / d : 0.0f;
    *dh = mf_fp32_to_fp16(d);
    *df = d;
    int32x4_t q[8];
    for (int k = 0; k < 8; k++)
        q[k] = vcvtaq_s32_f32(vmulq_n_f32(v[k], id));
    vst1q_s8(qs, narrow16(q[0], q[1], q[2], q[3]));
    vst1q_s8(qs + 16, narrow16(q[4], q[5], q[6], q[7]));
    const int32x4_t t = vaddq_s32(vaddq_s32(vaddq_s32(q[0], q[1]), vaddq_s32(q[2], q[3])),
                                  vaddq_s32(vaddq_s32(q[4], q[5]), vaddq_s32(q[6], q[7])));
    return vaddvq_s32(t);
}

static void quant_q8_0(const float *x, void *vy, int64_t n) {
    mf_block_q8_0 *y = vy;
    for (int64_t b = 0; b < n / MF_QK8_0; b++) {
        float d;
        q8_block(x + MF_QK8_0 * b, y[b].qs, &y[b].d, &d);
    }
}

static void quant_q8_1(const float *x, void *vy, int64_t n) {
    mf_block_q8_1 *y = vy;
    for (int64_t b = 0; b < n / MF_QK8_1; b++) {
        float d;
        const int sum = q8_block(x + MF_QK8_1 * b, y[b].qs, &y[b].d, &d);
        y[b].s = mf_fp32_to_fp16((float)sum * d);
    }
}

static void quant_q8_K(const float *x, void *vy, int64_t n) {
    mf_block_q8_K *y = vy;
    for (int64_t b = 0; b < n / MF_QK_K; b++, x += MF_QK_K) {
        float32x4_t mx = vdupq_n_f32(0);
        for (int k = 0; k < MF_QK_K / 4; k++)
            mx = vmaxnmq_f32(mx, vabsq_f32(vld1q_f32(x + 4 * k)));
        const float amax = vmaxnmvq_f32(mx);
        if (!amax) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        float max = 0; /* the first element of largest magnitude, with its sign */
        for (int j = 0; j < MF_QK_K; j++)
            if (fabsf(x[j]) == amax) {
                max = x[j];
                break;
            }
        const float iscale = -127.0f / max;
        const int32x4_t lim = vdupq_n_s32(127);
        for (int k = 0; k < MF_QK_K / 16; k++) {
            int32x4_t q[4];
            for (int i = 0; i < 4; i++)
                q[i] = vminq_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 16 * k + 4 * i), iscale)), lim);
            vst1q_s8(y[b].qs + 16 * k, narrow16(q[0], q[1], q[2], q[3]));
            y[b].bsums[k] = (int16_t)vaddvq_s32(vaddq_s32(vaddq_s32(q[0], q[1]), vaddq_s32(q[2], q[3])));
        }
        y[b].d = 1 / iscale;
    }
}

bool mf_cpu_quantize_act_neon(uint32_t act_type, const float *x, void *y, int64_t n) {
    switch (act_type) {
    case MF_TYPE_Q8_0: quant_q8_0(x, y, n); return true;
    case MF_TYPE_Q8_1: quant_q8_1(x, y, n); return true;
    case MF_TYPE_Q8_K: quant_q8_K(x, y, n); return true;
    default: return false;
    }
}

static const mf_cpu_dot dots_neon[MF_TYPE_COUNT] = {
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
};

const mf_cpu_dot *mf_cpu_dot_neon(uint32_t wtype) {
    if (wtype >= MF_TYPE_COUNT || !dots_neon[wtype].dot)
        return NULL;
    return &dots_neon[wtype];
}
