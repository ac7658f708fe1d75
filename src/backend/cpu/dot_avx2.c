/* dot_avx2.c - AVX2 + FMA + F16C dot products and activation quantizers.
 *
 * Compiled with -mavx2 -mfma -mf16c; reached only through mf_cpu_dot_get /
 * mf_cpu_quantize_act after the cpuid check. Integer kernels multiply
 * unsigned weight levels by signed activation levels with maddubs (pairs into
 * int16, never saturating for our ranges: 2 * 63 * 127 < 32767) and widen with
 * madd; signed x signed uses the sign trick (|w| * sign(a, w)). Per-block
 * float scaling accumulates in 8 lanes, summed once at the end. The
 * quantizers reproduce the scalar bytes exactly (same float operations, the
 * same rounding rules). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/avx2_inline.h"
#include "backend/cpu/kernels_isa.h"

/* ==== helpers ============================================================== */

/* signed bytes x signed bytes -> 8 int32 sums of 4 products */
static inline __m256i mad_i8i8(__m256i x, __m256i y) {
    return mad_u8i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* Bit j of the 32-bit mask -> byte j = 0xff, else 0. Byte j is first given
 * the mask byte j / 8 (shuffle within each 128-bit half: half 0 reads bytes
 * 0/1, half 1 bytes 2/3) and then tested against bit j % 8. */
static inline __m256i bits_to_bytes(uint32_t m) {
    const __m256i idx = _mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll, 0x0303030303030303ll);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m), idx);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

static inline uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ==== float dots =========================================================== */

static float tail_f32(const float *w, const float *a, int64_t i, int64_t n) {
    float s = 0;
    for (; i < n; i++)
        s += w[i] * a[i];
    return s;
}

static void dot_f32(int64_t n, float *s, const void *vw, const void *va) {
    const float *w = vw, *a = va;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(a + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(a + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(a + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(a + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(a + i), acc0);
    acc0 = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
    *s = hsum_ps(acc0) + tail_f32(w, a, i, n);
}

static void dot_f16(int64_t n, float *s, const void *vw, const void *va) {
    const uint16_t *w = vw;
    const float *a = va;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t i = 0;
#define LD16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(LD16(w + i), _mm256_loadu_ps(a + i), acc0);
        acc1 = _mm256_fmadd_ps(LD16(w + i + 8), _mm256_loadu_ps(a + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(LD16(w + i + 16), _mm256_loadu_ps(a + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(LD16(w + i + 24), _mm256_loadu_ps(a + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(LD16(w + i), _mm256_loadu_ps(a + i), acc0);
#undef LD16
    acc0 = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
    float t = 0;
    for (; i < n; i++)
        t += h2f(w[i]) * a[i];
    *s = hsum_ps(acc0) + t;
}

static void dot_bf16(int64_t n, float *s, const void *vw, const void *va) {
    const uint16_t *w = vw;
    const float *a = va;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    int64_t i = 0;
#define LDB(p) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(LDB(w + i), _mm256_loadu_ps(a + i), acc0);
        acc1 = _mm256_fmadd_ps(LDB(w + i + 8), _mm256_loadu_ps(a + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(LDB(w + i), _mm256_loadu_ps(a + i), acc0);
#undef LDB
    float t = 0;
    for (; i < n; i++)
        t += mf_bf16_to_fp32(w[i]) * a[i];
    *s = hsum_ps(_mm256_add_ps(acc0, acc1)) + t;
}

/* ==== 32-element blocks ===================================================== */

static void dot_q4_0(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q4_0 *w = vw;
    const mf_block_q8_0 *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / MF_QK4_0; b++) {
        const __m256i q = _mm256_sub_epi8(nibbles32(w[b].qs), _mm256_set1_epi8(8));
        const __m256i p = mad_i8i8(q, _mm256_loadu_si256((const __m256i *)a[b].qs));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(h2f(w[b].d) * h2f(a[b].d)), acc);
    }
    *s = hsum_ps(acc);
}

static void dot_q4_1(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q4_1 *w = vw;
    const mf_block_q8_1 *a = va;
    __m256 acc = _mm256_setzero_ps();
    float sm = 0;
    for (int64_t b = 0; b < n / MF_QK4_1; b++) {
        const __m256i p = mad_u8i8(nibbles32(w[b].qs), _mm256_loadu_si256((const __m256i *)a[b].qs));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(h2f(w[b].d) * h2f(a[b].d)), acc);
        sm += h2f(w[b].m) * h2f(a[b].s);
    }
    *s = hsum_ps(acc) + sm;
}

/* One weight row against up to four activation rows (a, a + a_row, ...):
 * the weight block is unpacked once for all of them, and each token's
 * arithmetic is the one-token kernel's, in its order, so s[t * ldy] has
 * the bits dot_q4_0 / dot_q4_1 gives that token alone. */
static void dotn_q4_0(int64_t n, float *s, int64_t ldy, const void *vw, const void *va, size_t a_row,
                      int nt) {
    const mf_block_q4_0 *w = vw;
    const mf_block_q8_0 *a[4];
    __m256 acc[4];
    for (int t = 0; t < nt; t++) {
        a[t] = (const mf_block_q8_0 *)((const uint8_t *)va + (size_t)t * a_row);
        acc[t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < n / MF_QK4_0; b++) {
        const __m256i q = _mm256_sub_epi8(nibbles32(w[b].qs), _mm256_set1_epi8(8));
        const __m256i aq = _mm256_sign_epi8(q, q);
        const float dw = h2f(w[b].d);
        for (int t = 0; t < nt; t++) {
            const __m256i y = _mm256_loadu_si256((const __m256i *)a[t][b].qs);
            const __m256i p = mad_u8i8(aq, _mm256_sign_epi8(y, q));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * h2f(a[t][b].d)), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++)
        s[t * ldy] = hsum_ps(acc[t]);
}

static void dotn_q4_1(int64_t n, float *s, int64_t ldy, const void *vw, const void *va, size_t a_row,
                      int nt) {
    const mf_block_q4_1 *w = vw;
    const mf_block_q8_1 *a[4];
    __m256 acc[4];
    float sm[4];
    for (int t = 0; t < nt; t++) {
        a[t] = (const mf_block_q8_1 *)((const uint8_t *)va + (size_t)t * a_row);
        acc[t] = _mm256_setzero_ps();
        sm[t] = 0;
    }
    for (int64_t b = 0; b < n / MF_QK4_1; b++) {
        const __m256i q = nibbles32(w[b].qs);
        const float dw = h2f(w[b].d), mw = h2f(w[b].m);
        for (int t = 0; t < nt; t++) {
            const __m256i p = mad_u8i8(q, _mm256_loadu_si256((const __m256i *)a[t][b].qs));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * h2f(a[t][b].d)), acc[t]);
            sm[t] += mw * h2f(a[t][b].s);
        }
    }
    for (int t = 0; t < nt; t++)
        s[t * ldy] = hsum_ps(acc[t]) + sm[t];
}

static void dotn_q8_0(int64_t n, float *s, int64_t ldy, const void *vw, const void *va, size_t a_row,
                      int nt) {
    const mf_block_q8_0 *w = vw;
    const mf_block_q8_0 *a[4];
    __m256 acc[4];
    for (int t = 0; t < nt; t++) {
        a[t] = (const mf_block_q8_0 *)((const uint8_t *)va + (size_t)t * a_row);
        acc[t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < n / MF_QK8_0; b++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)w[b].qs);
        const __m256i aq = _mm256_sign_epi8(q, q);
        const float dw = h2f(w[b].d);
        for (int t = 0; t < nt; t++) {
            const __m256i y = _mm256_loadu_si256((const __m256i *)a[t][b].qs);
            const __m256i p = mad_u8i8(aq, _mm256_sign_epi8(y, q));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * h2f(a[t][b].d)), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++)
        s[t * ldy] = hsum_ps(acc[t]);
}

mf_vec_dotn_fn mf_cpu_dotn_avx2(uint32_t wtype) {
    switch (wtype) {
    case MF_TYPE_Q4_0: return dotn_q4_0;
    case MF_TYPE_Q4_1: return dotn_q4_1;
    case MF_TYPE_Q8_0: return dotn_q8_0;
    default: return NULL;
    }
}

/* ==== four rows at a time, one token (decode) ================================ */

/* The one-row kernels above carry one fma chain through the blocks, one
 * 4-cycle link per 32 elements: on a Zen 3 core that caps Q4_0 near 13 GB/s,
 * under what two cores can stream. These run four rows at once, each with
 * its own chain, sharing the activation loads. Every row's int32 lanes are
 * the same exact integers as the one-row kernel's (element 4i..4i+3 of the
 * block in lane i, nibbles32's layout) and its accumulator sees the same
 * fmas in the same block order, so the bits equal dot_q4_0 / dot_q5_0 /
 * dot_q8_0 row by row, whichever rows a thread's tile groups. The offset
 * types take their levels unsigned (maddubs) and subtract off * (the lane's
 * activation sum) once per block for the four rows: integer arithmetic, so
 * the lanes are unchanged. Four short streams lose the hardware prefetchers
 * (as on the AVX-512 kernels), so the loop requests the group two ahead,
 * spread evenly over its blocks. */

#ifndef DOT4_PF_GROUPS
#define DOT4_PF_GROUPS 2 /* how many four-row groups ahead the loop prefetches */
#endif

/* f16 scale at p, broadcast and converted to 8 floats (exact, as h2f) */
static inline __m256 bcast_h2f(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_set1_epi16((short)*p));
}

#define DOT4_AVX2(NAME, WT, LEVELS, OFF)                                                            \
    static void NAME(int64_t n, float *s, const void *vw, size_t w_row, const void *va, const float *ad,  \
                     const int32_t *as) {                                                           \
        (void)ad;                                                                                   \
        (void)as;                                                                                   \
        const WT *w[4];                                                                             \
        for (int r = 0; r < 4; r++)                                                                 \
            w[r] = (const WT *)((const uint8_t *)vw + (size_t)r * w_row);                           \
        const mf_block_q8_0 *a = va;                                                                \
        const int64_t nb = n / 32;                                                                  \
        const size_t span = 4 * w_row;                                                              \
        const uint8_t *pf = (const uint8_t *)vw + DOT4_PF_GROUPS * span;                            \
        size_t pf_done = 0;                                                                         \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;                   \
        for (int64_t b = 0; b < nb; b++) {                                                          \
            for (const size_t want = (size_t)(b + 1) * span / (size_t)nb; pf_done < want; pf_done += 64) \
                _mm_prefetch((const char *)pf + pf_done, _MM_HINT_T0);                              \
            const __m256i y = _mm256_loadu_si256((const __m256i *)a[b].qs);                         \
            const __m256 da = bcast_h2f(&a[b].d);                                                   \
            const __m256i off = OFF ? mad_u8i8(_mm256_set1_epi8(OFF), y) : _mm256_setzero_si256(); \
            __m256i p0, p1, p2, p3;                                                                 \
            LEVELS(w[0], b, y, off, p0);                                                            \
            LEVELS(w[1], b, y, off, p1);                                                            \
            LEVELS(w[2], b, y, off, p2);                                                            \
            LEVELS(w[3], b, y, off, p3);                                                            \
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_mul_ps(bcast_h2f(&w[0][b].d), da), acc0); \
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_mul_ps(bcast_h2f(&w[1][b].d), da), acc1); \
            acc2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p2), _mm256_mul_ps(bcast_h2f(&w[2][b].d), da), acc2); \
            acc3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p3), _mm256_mul_ps(bcast_h2f(&w[3][b].d), da), acc3); \
        }                                                                                           \
        s[0] = hsum_ps(acc0);                                                                       \
        s[1] = hsum_ps(acc1);                                                                       \
        s[2] = hsum_ps(acc2);                                                                       \
        s[3] = hsum_ps(acc3);                                                                       \
    }

/* p = the int32 lanes of (levels - off) x y for block b of row w */
#define LV4_Q4_0(w, b, y, off, p) (p) = _mm256_sub_epi32(mad_u8i8(nibbles32((w)[b].qs), (y)), (off))
#define LV4_Q5_0(w, b, y, off, p)                                                                   \
    do {                                                                                            \
        const __m256i hi_ = _mm256_and_si256(bits_to_bytes(load_u32((w)[b].qh)), _mm256_set1_epi8(0x10)); \
        (p) = _mm256_sub_epi32(mad_u8i8(_mm256_or_si256(nibbles32((w)[b].qs), hi_), (y)), (off));  \
    } while (0)
#define LV4_Q8_0(w, b, y, off, p) ((void)(off), (p) = mad_i8i8(_mm256_loadu_si256((const __m256i *)(w)[b].qs), (y)))

DOT4_AVX2(dot4_q4_0, mf_block_q4_0, LV4_Q4_0, 8)
DOT4_AVX2(dot4_q5_0, mf_block_q5_0, LV4_Q5_0, 16)
DOT4_AVX2(dot4_q8_0, mf_block_q8_0, LV4_Q8_0, 0)

mf_vec_dot4_fn mf_cpu_dot4_avx2(uint32_t wtype) {
    switch (wtype) {
    case MF_TYPE_Q4_0: return dot4_q4_0;
    case MF_TYPE_Q5_0: return dot4_q5_0;
    case MF_TYPE_Q8_0: return dot4_q8_0;
    default: return NULL;
    }
}

static void dot_q5_0(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q5_0 *w = vw;
    const mf_block_q8_0 *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / MF_QK5_0; b++) {
        const __m256i hi = _mm256_and_si256(bits_to_bytes(load_u32(w[b].qh)), _mm256_set1_epi8(0x10));
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(nibbles32(w[b].qs), hi), _mm256_set1_epi8(16));
        const __m256i p = mad_i8i8(q, _mm256_loadu_si256((const __m256i *)a[b].qs));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(h2f(w[b].d) * h2f(a[b].d)), acc);
    }
    *s = hsum_ps(acc);
}

static void dot_q5_1(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q5_1 *w = vw;
    const mf_block_q8_1 *a = va;
    __m256 acc = _mm256_setzero_ps();
    float sm = 0;
    for (int64_t b = 0; b < n / MF_QK5_1; b++) {
        const __m256i hi = _mm256_and_si256(bits_to_bytes(load_u32(w[b].qh)), _mm256_set1_epi8(0x10));
        const __m256i q = _mm256_or_si256(nibbles32(w[b].qs), hi);
        const __m256i p = mad_u8i8(q, _mm256_loadu_si256((const __m256i *)a[b].qs));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(h2f(w[b].d) * h2f(a[b].d)), acc);
        sm += h2f(w[b].m) * h2f(a[b].s);
    }
    *s = hsum_ps(acc) + sm;
}

static void dot_q8_0(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q8_0 *w = vw;
    const mf_block_q8_0 *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / MF_QK8_0; b++) {
        const __m256i p = mad_i8i8(_mm256_loadu_si256((const __m256i *)w[b].qs),
                                   _mm256_loadu_si256((const __m256i *)a[b].qs));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(h2f(w[b].d) * h2f(a[b].d)), acc);
    }
    *s = hsum_ps(acc);
}

/* ==== K-quants =============================================================== */

/* 32 unsigned levels x 32 activations with one int16 scale per 16 elements:
 * int32 lanes 0-3 carry elements 0-15 times sc0, lanes 4-7 elements 16-31
 * times sc1. */
static inline __m256i mad_scaled16(__m256i u, __m256i a, int sc0, int sc1) {
    const __m256i sc = _mm256_set_m128i(_mm_set1_epi16((short)sc1), _mm_set1_epi16((short)sc0));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), sc);
}

static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

static void dot_q2_K(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q2_K *w = vw;
    const mf_block_q8_K *a = va;
    const __m256i m3 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    float sm = 0;
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        const uint8_t *sc = w[b].scales;
        int summs = 0;
        for (int j = 0; j < 16; j++)
            summs += (sc[j] >> 4) * a[b].bsums[j];
        __m256i isum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q = load256(w[b].qs + 32 * h);
            for (int g = 0; g < 4; g++) {
                const __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * g), m3);
                const int j = 8 * h + 2 * g;
                isum = _mm256_add_epi32(isum, mad_scaled16(u, load256(a[b].qs + 128 * h + 32 * g), sc[j] & 0x0f,
                                                           sc[j + 1] & 0x0f));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(a[b].d * h2f(w[b].d)), acc);
        sm += a[b].d * h2f(w[b].dmin) * (float)summs;
    }
    *s = hsum_ps(acc) - sm;
}

static void dot_q3_K(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q3_K *w = vw;
    const mf_block_q8_K *a = va;
    const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        int sc[16];
        const uint8_t *ps = w[b].scales;
        for (int j = 0; j < 16; j++) {
            const int lo = j < 8 ? (ps[j] & 0x0f) : (ps[j - 8] >> 4);
            sc[j] = (lo | (((ps[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
        }
        /* q = u - 4 with u = q2 | 4 * hbit in [0, 7]: sum q*a = sum u*a - 4 sum a */
        int corr = 0;
        for (int j = 0; j < 16; j++)
            corr += sc[j] * a[b].bsums[j];
        const __m256i hm = load256(w[b].hmask);
        __m256i isum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q = load256(w[b].qs + 32 * h);
            for (int g = 0; g < 4; g++) {
                const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + g)));
                const __m256i hb = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), four);
                const __m256i u = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * g), m3), hb);
                const int j = 8 * h + 2 * g;
                isum = _mm256_add_epi32(isum, mad_scaled16(u, load256(a[b].qs + 128 * h + 32 * g), sc[j], sc[j + 1]));
            }
        }
        const int total = hsum_epi32(isum) - 4 * corr;
        sum += a[b].d * h2f(w[b].d) * (float)total;
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

/* The 6-bit scales (bytes 0-7 of *sc) and mins (*mn) of a Q4_K/Q5_K block,
 * four at a time with 32-bit word operations (the values k4_unpack gives). */
static inline void k4_unpack8(const uint8_t s[12], uint64_t *sc, uint64_t *mn) {
    uint32_t u0, u1, u2;
    memcpy(&u0, s, 4);
    memcpy(&u1, s + 4, 4);
    memcpy(&u2, s + 8, 4);
    const uint32_t lo6 = 0x3f3f3f3f, lo4 = 0x0f0f0f0f, lo2 = 0x03030303;
    const uint32_t sc47 = (u2 & lo4) | (((u0 >> 6) & lo2) << 4);
    const uint32_t m47 = ((u2 >> 4) & lo4) | (((u1 >> 6) & lo2) << 4);
    *sc = (u0 & lo6) | (uint64_t)sc47 << 32;
    *mn = (u1 & lo6) | (uint64_t)m47 << 32;
}

/* int16 lane k of v (k < 8, both 128-bit halves of v equal) in every lane */
static inline __m256i bcast16(__m256i v, int k) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(((2 * k + 1) << 8) | (2 * k))));
}

/* Scales, mins and the min correction come out of vector integer ops, not
 * a scalar loop per block: the integers, the lanes and the float operations
 * are the ones of the plain form (per 32 elements madd(maddubs(levels, a),
 * scale), fma per block, the min term in a float chain), so the result has
 * the same bits, at about twice the speed on one Zen 3 core. */
static void dot_q4_K(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q4_K *w = vw;
    const mf_block_q8_K *a = va;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc = _mm256_setzero_ps();
    float sm = 0;
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        uint64_t scb, mnb;
        k4_unpack8(w[b].scales, &scb, &mnb);
        /* summ = sum_j m[j] * (bsums[2j] + bsums[2j+1]): each min twice, one madd */
        const __m128i mb = _mm_cvtsi64_si128((long long)mnb);
        const __m256i m2 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mb, mb));
        const int summ = hsum_epi32(_mm256_madd_epi16(m2, load256(a[b].bsums)));
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)scb)));
        __m256i isum = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            const __m256i q = load256(w[b].qs + 32 * p);
            const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load256(a[b].qs + 64 * p)),
                                                            bcast16(sc16, 2 * p)));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load256(a[b].qs + 64 * p + 32)),
                                                            bcast16(sc16, 2 * p + 1)));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(a[b].d * h2f(w[b].d)), acc);
        sm += a[b].d * h2f(w[b].dmin) * (float)summ;
    }
    *s = hsum_ps(acc) - sm;
}

static void dot_q5_K(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q5_K *w = vw;
    const mf_block_q8_K *a = va;
    const __m256i m4 = _mm256_set1_epi8(0x0f), b5 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    float sm = 0;
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        int sc[8], m[8], summ = 0;
        k4_unpack(w[b].scales, sc, m);
        for (int j = 0; j < 8; j++)
            summ += m[j] * (a[b].bsums[2 * j] + a[b].bsums[2 * j + 1]);
        const __m256i qh = load256(w[b].qh);
        __m256i isum = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            const __m256i q = load256(w[b].qs + 32 * p);
            const __m256i bl = _mm256_set1_epi8((char)(1 << (2 * p))), bh = _mm256_set1_epi8((char)(2 << (2 * p)));
            const __m256i hl = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bl), bl), b5);
            const __m256i hh = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bh), bh), b5);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), hl);
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), hh);
            isum = _mm256_add_epi32(isum, mad_scaled16(lo, load256(a[b].qs + 64 * p), sc[2 * p], sc[2 * p]));
            isum = _mm256_add_epi32(isum, mad_scaled16(hi, load256(a[b].qs + 64 * p + 32), sc[2 * p + 1], sc[2 * p + 1]));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(a[b].d * h2f(w[b].d)), acc);
        sm += a[b].d * h2f(w[b].dmin) * (float)summ;
    }
    *s = hsum_ps(acc) - sm;
}

/* As dot_q4_K: the sixteen signed scales widened once per block, each
 * half's pair broadcast by a shuffle, the bias term one madd; same lanes,
 * integers and float operations as the plain form, so the same bits. */
static void dot_q6_K(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q6_K *w = vw;
    const mf_block_q8_K *a = va;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[b].scales));
        /* levels are stored biased by 32: sum (q-32)*a = sum q*a - 32 sum a */
        const int corr = hsum_epi32(_mm256_madd_epi16(sc16, load256(a[b].bsums)));
        __m256i isum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            /* scales 8h..8h+7 in both halves: the low half of a group takes
             * scale j = 8h + 2g, the high half j + 1 */
            const __m256i sh = h ? _mm256_permute2x128_si256(sc16, sc16, 0x11)
                                 : _mm256_permute2x128_si256(sc16, sc16, 0x00);
            const __m256i l0 = load256(w[b].ql + 64 * h), l1 = load256(w[b].ql + 64 * h + 32);
            const __m256i qh = load256(w[b].qh + 32 * h);
            const __m256i lo[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                                   _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
            for (int g = 0; g < 4; g++) {
                const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), m3), 4);
                const __m256i u = _mm256_or_si256(lo[g], hi);
                const __m256i idx = _mm256_set_m128i(_mm_set1_epi16((short)(((4 * g + 3) << 8) | (4 * g + 2))),
                                                     _mm_set1_epi16((short)(((4 * g + 1) << 8) | (4 * g))));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(u, load256(a[b].qs + 128 * h + 32 * g)),
                                                                _mm256_shuffle_epi8(sh, idx)));
            }
        }
        const int total = hsum_epi32(isum) - 32 * corr;
        sum += a[b].d * h2f(w[b].d) * (float)total;
    }
    *s = sum;
}

/* ==== activation quantizers ================================================== */

/* roundf (half away from zero) of 8 floats, exactly: truncate, then step one
 * away from zero when the dropped fraction is >= 0.5 (the subtraction is
 * exact for |v| < 2^23). */
static inline __m256 round_away(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    const __m256 step = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    return _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), step));
}

static inline float hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* 32 int32 in four vectors -> 32 int8 in element order. */
static inline __m256i pack32(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
    const __m256i p01 = _mm256_packs_epi32(i0, i1), p23 = _mm256_packs_epi32(i2, i3);
    const __m256i p = _mm256_packs_epi16(p01, p23);
    /* packs interleave the 128-bit halves: 0 2 4 6 1 3 5 7 in dwords */
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* One 32-block to levels with roundf(x * id); stores d as f16 in *dh and as
 * float in *df, returns the level sum. */
static inline int q8_block(const float *x, int8_t *qs, uint16_t *dh, float *df) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 v[4];
    __m256 mx = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        mx = _mm256_max_ps(mx, _mm256_and_ps(v[k], abs_mask));
    }
    const float d = hmax_ps(mx) / 127;
    const float id = d ? 1.0f / d : 0.0f;
    *dh = mf_fp32_to_fp16(d);
    *df = d;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    for (int k = 0; k < 4; k++)
        q[k] = _mm256_cvtps_epi32(round_away(_mm256_mul_ps(v[k], vid)));
    _mm256_storeu_si256((__m256i *)qs, pack32(q[0], q[1], q[2], q[3]));
    return hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
}

static void quant_q8_0(const float *x, void *vy, int64_t n) {
    mf_block_q8_0 *y = vy;
    float d;
    for (int64_t b = 0; b < n / MF_QK8_0; b++)
        q8_block(x + 32 * b, y[b].qs, &y[b].d, &d);
}

static void quant_q8_1(const float *x, void *vy, int64_t n) {
    mf_block_q8_1 *y = vy;
    for (int64_t b = 0; b < n / MF_QK8_1; b++) {
        float d;
        const int sum = q8_block(x + 32 * b, y[b].qs, &y[b].d, &d);
        y[b].s = mf_fp32_to_fp16((float)sum * d);
    }
}

static void quant_q8_K(const float *x, void *vy, int64_t n) {
    mf_block_q8_K *y = vy;
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < n / MF_QK_K; b++, x += MF_QK_K) {
        __m256 mx = _mm256_setzero_ps();
        for (int k = 0; k < 32; k++)
            mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(x + 8 * k), abs_mask));
        const float amax = hmax_ps(mx);
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
        const __m256 vs = _mm256_set1_ps(iscale);
        const __m256i lim = _mm256_set1_epi32(127);
        for (int k = 0; k < 8; k++) {
            __m256i q[4];
            for (int i = 0; i < 4; i++) /* round half to even: the default MXCSR mode */
                q[i] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * k + 8 * i), vs)), lim);
            _mm256_storeu_si256((__m256i *)(y[b].qs + 32 * k), pack32(q[0], q[1], q[2], q[3]));
            y[b].bsums[2 * k] = (int16_t)hsum_epi32(_mm256_add_epi32(q[0], q[1]));
            y[b].bsums[2 * k + 1] = (int16_t)hsum_epi32(_mm256_add_epi32(q[2], q[3]));
        }
        y[b].d = 1 / iscale;
    }
}

bool mf_cpu_quantize_act_avx2(uint32_t act_type, const float *x, void *y, int64_t n) {
    switch (act_type) {
    case MF_TYPE_Q8_0: quant_q8_0(x, y, n); return true;
    case MF_TYPE_Q8_1: quant_q8_1(x, y, n); return true;
    case MF_TYPE_Q8_K: quant_q8_K(x, y, n); return true;
    default: return false;
    }
}

static const mf_cpu_dot dots_avx2[MF_TYPE_COUNT] = {
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

const mf_cpu_dot *mf_cpu_dot_avx2(uint32_t wtype) {
    if (wtype >= MF_TYPE_COUNT || !dots_avx2[wtype].dot)
        return NULL;
    return &dots_avx2[wtype];
}
