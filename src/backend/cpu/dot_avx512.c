/* dot_avx512.c - AVX-512 (F/BW/VL/DQ + VNNI) dot products.
 *
 * Compiled with the AVX-512 flags; reached only through mf_cpu_dot_get after
 * the cpuid check. The 32-element block types take two blocks per 512-bit
 * register and multiply with VNNI dpbusd (unsigned x signed bytes summed four
 * at a time into int32, no saturation): signed weight levels are offset into
 * unsigned ones and the offset times the activation sum (itself a dpbusd) is
 * subtracted. The K-quants with per-16/32 scales use 512-bit maddubs + madd
 * against a scale vector, 64 elements per step. Types without a version here
 * (Q2_K, Q3_K) fall back to the AVX2 kernels; activations are quantized by the
 * AVX2 code (the bytes are the same on every ISA). */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/kernels_isa.h"

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

static inline uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ==== float dots ============================================================ */

static void dot_f32(int64_t n, float *s, const void *vw, const void *va) {
    const float *w = vw, *a = va;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(a + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(a + i + 16), acc1);
    }
    if (i < n) { /* masked tail: lanes past n read nothing */
        const int64_t r = n - i;
        const __mmask16 m0 = r >= 16 ? 0xffff : (__mmask16)((1u << r) - 1);
        const __mmask16 m1 = r <= 16 ? 0 : (__mmask16)((1u << (r - 16)) - 1);
        acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m0, w + i), _mm512_maskz_loadu_ps(m0, a + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m1, w + i + 16), _mm512_maskz_loadu_ps(m1, a + i + 16), acc1);
    }
    *s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

static void dot_f16(int64_t n, float *s, const void *vw, const void *va) {
    const uint16_t *w = vw;
    const float *a = va;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    int64_t i = 0;
#define LD16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(LD16(w + i), _mm512_loadu_ps(a + i), acc0);
        acc1 = _mm512_fmadd_ps(LD16(w + i + 16), _mm512_loadu_ps(a + i + 16), acc1);
    }
#undef LD16
    for (; i < n; i += 16) {
        const int64_t r = n - i;
        const __mmask16 m = r >= 16 ? 0xffff : (__mmask16)((1u << r) - 1);
        const __m512 wv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w + i));
        acc0 = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, a + i), acc0);
    }
    *s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

static void dot_bf16(int64_t n, float *s, const void *vw, const void *va) {
    const uint16_t *w = vw;
    const float *a = va;
    __m512 acc0 = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const int64_t r = n - i;
        const __mmask16 m = r >= 16 ? 0xffff : (__mmask16)((1u << r) - 1);
        const __m512i wi = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, w + i)), 16);
        acc0 = _mm512_fmadd_ps(_mm512_castsi512_ps(wi), _mm512_maskz_loadu_ps(m, a + i), acc0);
    }
    *s = _mm512_reduce_add_ps(acc0);
}

/* ==== 32-element blocks, two per register ==================================== */

static inline __m512i join256(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

static inline __m512 join_ps(float lo, float hi) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(lo)), _mm256_set1_ps(hi), 1);
}

static inline __m256i nibbles32(const uint8_t *qs) {
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0f));
}

/* bit j of m -> byte j = 0x10, else 0 (the fifth bit of Q5 levels) */
static inline __m256i fifth_bits(uint32_t m) {
    return _mm256_maskz_mov_epi8((__mmask32)m, _mm256_set1_epi8(0x10));
}

/* sum_k (u_k - off) * y_k per 4 elements, u unsigned: dpbusd(u, y) - off*dpbusd(1, y) */
static inline __m512i dp_offset(__m512i u, __m512i y, int off) {
    const __m512i z = _mm512_setzero_si512();
    const __m512i p = _mm512_dpbusd_epi32(z, u, y);
    if (!off)
        return p;
    return _mm512_sub_epi32(p, _mm512_dpbusd_epi32(z, _mm512_set1_epi8((char)off), y));
}

static inline __m256i dp_offset256(__m256i u, __m256i y, int off) {
    const __m256i z = _mm256_setzero_si256();
    const __m256i p = _mm256_dpbusd_epi32(z, u, y);
    if (!off)
        return p;
    return _mm256_sub_epi32(p, _mm256_dpbusd_epi32(z, _mm256_set1_epi8((char)off), y));
}

/* The block loop shared by Q4_0/Q4_1/Q5_0/Q5_1/Q8_0: levels(w, b) gives the
 * 32 unsigned levels of block b, off the offset that makes them signed, and
 * MINTERM(w, a, b) the m * s term of the Q8_1-paired types (0 for the others). */
#define DOT_BLOCK32(NAME, WT, AT, LEVELS, OFF, MINTERM)                                          \
    static void NAME(int64_t n, float *s, const void *vw, const void *va) {                     \
        const WT *w = vw;                                                                       \
        const AT *a = va;                                                                       \
        const int64_t nb = n / 32;                                                              \
        __m512 acc = _mm512_setzero_ps();                                                       \
        float sm = 0;                                                                           \
        int64_t b = 0;                                                                          \
        for (; b + 2 <= nb; b += 2) {                                                           \
            const __m512i u = join256(LEVELS(w, b), LEVELS(w, b + 1));                          \
            const __m512i y = join256(_mm256_loadu_si256((const __m256i *)a[b].qs),             \
                                      _mm256_loadu_si256((const __m256i *)a[b + 1].qs));        \
            const __m512 d = join_ps(h2f(w[b].d) * h2f(a[b].d), h2f(w[b + 1].d) * h2f(a[b + 1].d)); \
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp_offset(u, y, OFF)), d, acc);           \
            sm += MINTERM(w, a, b) + MINTERM(w, a, b + 1);                                      \
        }                                                                                       \
        float tail = 0;                                                                         \
        if (b < nb) {                                                                           \
            const __m256i p = dp_offset256(LEVELS(w, b), _mm256_loadu_si256((const __m256i *)a[b].qs), OFF); \
            const __m256 pf = _mm256_cvtepi32_ps(p);                                            \
            __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(pf), _mm256_extractf128_ps(pf, 1));   \
            t4 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));                                         \
            t4 = _mm_add_ss(t4, _mm_movehdup_ps(t4));                                           \
            tail = _mm_cvtss_f32(t4) * (h2f(w[b].d) * h2f(a[b].d));                              \
            tail += MINTERM(w, a, b);                                                           \
        }                                                                                       \
        *s = _mm512_reduce_add_ps(acc) + sm + tail;                                             \
    }

#define LV_Q4(w, b) nibbles32(w[b].qs)
#define LV_Q5(w, b) _mm256_or_si256(nibbles32(w[b].qs), fifth_bits(load_u32(w[b].qh)))
#define LV_Q8(w, b) _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)w[b].qs), _mm256_set1_epi8((char)0x80))

#define MIN_S(w, a, b) (h2f(w[b].m) * h2f(a[b].s))
/* Q4_0/Q5_0/Q8_0 keep dot.c's canonical order, so this single-row kernel, the
 * multi-token tiles of gemm_avx512.c and the scalar twin agree bit for bit:
 * an exact integer sum per block, then s = fma(isum, dw * da, s) in block
 * order (a dependency chain, but the matmul runs these through the tiles). */
#define DOT_CANON(NAME, WT, LEVELS, OFF)                                                         \
    static void NAME(int64_t n, float *s, const void *vw, const void *va) {                     \
        const WT *w = vw;                                                                       \
        const mf_block_q8_0 *a = va;                                                            \
        __m128 sum = _mm_setzero_ps();                                                          \
        for (int64_t b = 0; b < n / 32; b++) {                                                  \
            const __m256i p = dp_offset256(LEVELS(w, b), _mm256_loadu_si256((const __m256i *)a[b].qs), OFF); \
            __m128i q = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1)); \
            q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0x4e));                                   \
            q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0xb1));                                   \
            const float d = h2f(w[b].d) * h2f(a[b].d);                                          \
            sum = _mm_fmadd_ss(_mm_cvtepi32_ps(q), _mm_set_ss(d), sum);                         \
        }                                                                                       \
        *s = _mm_cvtss_f32(sum);                                                                \
    }

DOT_CANON(dot_q4_0, mf_block_q4_0, LV_Q4, 8)
DOT_CANON(dot_q5_0, mf_block_q5_0, LV_Q5, 16)
DOT_CANON(dot_q8_0, mf_block_q8_0, LV_Q8, 128)
DOT_BLOCK32(dot_q4_1, mf_block_q4_1, mf_block_q8_1, LV_Q4, 0, MIN_S)
DOT_BLOCK32(dot_q5_1, mf_block_q5_1, mf_block_q8_1, LV_Q5, 0, MIN_S)

/* ==== four rows at a time, one token (decode) ================================== */

/* The one-row DOT_CANON kernels run a serial fma chain, one 4-cycle link per
 * block, and that chain, not memory, bounds them (~12 GB/s per core for
 * Q4_0). These take four rows at once: the four chains advance in one
 * 128-bit fma, each row's integer block sums come out of one shared
 * transpose-reduce, and the activation bytes are loaded once for the four.
 * Four rows are four short streams the hardware prefetchers lose track of
 * (DRAM-resident q8_0 fell from 34 to 23 GB/s on 2 threads), so the loop
 * prefetches the group after the next one linearly, one slice per block
 * pair (two groups ahead measured ~5 % better than one for Q4_0).
 * Each lane still computes s = fma((float)isum_b, dw_b * da_b, s) over the
 * blocks in order, so the bits equal the one-row kernels and the scalar
 * twin. ad / as: the activation blocks' scales as floats and level sums. */

/* per 128-bit lane k of the result: the sums of lane group k of p0..p3 */
static inline __m512i hsum4_epi32(__m512i p0, __m512i p1, __m512i p2, __m512i p3) {
    const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(p0, p1), _mm512_unpackhi_epi32(p0, p1));
    const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(p2, p3), _mm512_unpackhi_epi32(p2, p3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
}

#define DOT4_CANON(NAME, WT, LV2, SPLIT, SH)                                                           \
    static void NAME(int64_t n, float *s, const void *vw, size_t w_row, const void *va, const float *ad, \
                     const int32_t *as) {                                                          \
        const WT *w0 = vw, *w1 = (const WT *)((const uint8_t *)vw + w_row);                       \
        const WT *w2 = (const WT *)((const uint8_t *)vw + 2 * w_row);                             \
        const WT *w3 = (const WT *)((const uint8_t *)vw + 3 * w_row);                             \
        const mf_block_q8_0 *a = va;                                                              \
        const int64_t nb = n / 32;                                                                \
        const __m512i z = _mm512_setzero_si512();                                                 \
        __m128 acc = _mm_setzero_ps();                                                            \
        /* two groups ahead for short rows, one for long ones (> 2 KB) */                         \
        const char *pf = (const char *)vw + (w_row > 2048 ? 4 : 8) * w_row;                         \
        const size_t pf_step = ((4 * w_row) / (size_t)((nb + 1) / 2) + 63) & ~(size_t)63;         \
        for (int64_t b = 0; b < nb; b += 2, pf += pf_step) {                                      \
            for (size_t o = 0; o < pf_step; o += 64)                                              \
                _mm_prefetch(pf + o, _MM_HINT_T0);                                                \
            const bool two = b + 1 < nb;                                                          \
            const int64_t b1 = two ? b + 1 : b;                                                   \
            __m512i y = join256(_mm256_loadu_si256((const __m256i *)a[b].qs),                      \
                                _mm256_loadu_si256((const __m256i *)a[b1].qs));                    \
            if (!two) /* odd block count: the second half multiplies zeros */                      \
                y = _mm512_inserti64x4(y, _mm256_setzero_si256(), 1);                             \
            if (SPLIT) /* 16-byte lanes (b 0-15, b+1 0-15, b 16-31, b+1 16-31), as LV2 gives */   \
                y = _mm512_shuffle_i32x4(y, y, _MM_SHUFFLE(3, 1, 2, 0));                          \
            const __m512i p0 = _mm512_dpbusd_epi32(z, LV2(w0, b, b1), y);                         \
            const __m512i p1 = _mm512_dpbusd_epi32(z, LV2(w1, b, b1), y);                         \
            const __m512i p2 = _mm512_dpbusd_epi32(z, LV2(w2, b, b1), y);                         \
            const __m512i p3 = _mm512_dpbusd_epi32(z, LV2(w3, b, b1), y);                         \
            const __m512i u = hsum4_epi32(p0, p1, p2, p3);                                        \
            /* lane 0 then: block b's four rows, lane 1 (SPLIT) or 2: block b+1's */              \
            const __m512i t = _mm512_add_epi32(u, SPLIT ? _mm512_shuffle_i32x4(u, u, _MM_SHUFFLE(1, 0, 3, 2)) \
                                                        : _mm512_shuffle_i32x4(u, u, _MM_SHUFFLE(2, 3, 0, 1))); \
            const __m256 dw = _mm256_cvtph_ps(_mm_setr_epi16((short)w0[b].d, (short)w1[b].d,      \
                (short)w2[b].d, (short)w3[b].d, (short)w0[b1].d, (short)w1[b1].d, (short)w2[b1].d, \
                (short)w3[b1].d));                                                               \
            const __m256 d = _mm256_mul_ps(dw, _mm256_set_m128(_mm_set1_ps(ad[b1]), _mm_set1_ps(ad[b]))); \
            const __m128i i0 = _mm_sub_epi32(_mm512_castsi512_si128(t), _mm_set1_epi32(as[b] * (1 << SH))); \
            acc = _mm_fmadd_ps(_mm_cvtepi32_ps(i0), _mm256_castps256_ps128(d), acc);              \
            if (two) {                                                                            \
                const __m128i i1 = _mm_sub_epi32(SPLIT ? _mm512_extracti32x4_epi32(t, 1) : _mm512_extracti32x4_epi32(t, 2), \
                                                 _mm_set1_epi32(as[b1] * (1 << SH)));                                  \
                acc = _mm_fmadd_ps(_mm_cvtepi32_ps(i1), _mm256_extractf128_ps(d, 1), acc);        \
            }                                                                                     \
        }                                                                                         \
        _mm_storeu_ps(s, acc);                                                                    \
    }

/* Q4_0: both blocks' 16 nibble bytes in one register, split once into low
 * and high nibbles (elements 0-15 and 16-31 of each block): five
 * instructions per row and block pair instead of nine. */
static inline __m512i lv2_q4(const mf_block_q4_0 *w, int64_t b, int64_t b1) {
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)w[b].qs)),
                                              _mm_loadu_si128((const __m128i *)w[b1].qs), 1);
    return _mm512_and_si512(join256(v, _mm256_srli_epi16(v, 4)), _mm512_set1_epi8(0x0f));
}
#define LV2_Q5(w, b, b1) join256(LV_Q5(w, b), LV_Q5(w, b1))
#define LV2_Q8(w, b, b1) join256(LV_Q8(w, b), LV_Q8(w, b1))

DOT4_CANON(dot4_q4_0, mf_block_q4_0, lv2_q4, 1, 3)
DOT4_CANON(dot4_q5_0, mf_block_q5_0, LV2_Q5, 0, 4)
DOT4_CANON(dot4_q8_0, mf_block_q8_0, LV2_Q8, 0, 7)

mf_vec_dot4_fn mf_cpu_dot4_avx512(uint32_t wtype) {
    switch (wtype) {
    case MF_TYPE_Q4_0: return dot4_q4_0;
    case MF_TYPE_Q5_0: return dot4_q5_0;
    case MF_TYPE_Q8_0: return dot4_q8_0;
    default: return NULL;
    }
}

/* ad[b] = the f16 scale of block b as a float, as[b] = the sum of its levels. */
void mf_cpu_q8_0_aux_avx512(const void *vblk, int64_t nb, float *ad, int32_t *as) {
    const mf_block_q8_0 *blk = vblk;
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int64_t b = 0; b < nb; b++) {
        /* sum(q) = sum(q ^ 0x80 as unsigned) - 32 * 128 */
        const __m256i u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)blk[b].qs), flip);
        const __m256i sad = _mm256_sad_epu8(u, _mm256_setzero_si256());
        const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
        as[b] = (int32_t)(_mm_cvtsi128_si32(h) + _mm_extract_epi32(h, 2)) - 32 * 128;
        ad[b] = h2f(blk[b].d);
    }
}

/* ==== K-quants ================================================================ */

/* 64 unsigned levels x 64 activations with one int16 scale per 16 elements
 * (scale vector sv: int16 lanes 8k..8k+7 hold the scale of elements 16k..). */
static inline __m512i mad_scaled(__m512i u, __m512i a, __m512i sv) {
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, a), sv);
}

static inline void k4_unpack(const uint8_t s[12], int sc[8], int m[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 6) << 4);
        m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
}

/* int16 scale vector for 64 elements in two 32-groups with scales s0, s1 */
static inline __m512i scales_2x32(int s0, int s1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)s0)), _mm256_set1_epi16((short)s1), 1);
}

/* The 6-bit scales (sc) and mins (m) of the 8 groups of a Q4_K/Q5_K block, as
 * 8 bytes each, decoded with 32-bit word arithmetic (the scalar twin's
 * k4_scale_min per group, all eight at once). */
static inline void k4_scales8(const uint8_t s[12], uint64_t *sc, uint64_t *m) {
    const uint32_t w0 = load_u32(s), w1 = load_u32(s + 4), w2 = load_u32(s + 8);
    *sc = (w0 & 0x3f3f3f3fu) | (uint64_t)((w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u)) << 32;
    *m = (w1 & 0x3f3f3f3fu) | (uint64_t)(((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u)) << 32;
}

/* sum_j m_j * (bsums[2j] + bsums[2j+1]) over the 8 groups */
static inline int k4_summ(uint64_t m, const int16_t *bsums) {
    const __m128i mv = _mm_cvtsi64_si128((long long)m);
    const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv));
    const __m256i p = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bsums), m16);
    __m128i q = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0x4e));
    q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0xb1));
    return _mm_cvtsi128_si32(q);
}

static void dot_q4_K(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q4_K *w = vw;
    const mf_block_q8_K *a = va;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    /* int16 lanes 0-15 <- scale 2p, lanes 16-31 <- scale 2p+1 */
    __m512i idx[4];
    for (int p = 0; p < 4; p++)
        idx[p] = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * p)), _mm256_set1_epi16((short)(2 * p + 1)), 1);
    __m128 acc = _mm_setzero_ps();
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        uint64_t sc8, m8;
        k4_scales8(w[b].scales, &sc8, &m8);
        const int summ = k4_summ(m8, a[b].bsums);
        const __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
        __m512i isum = _mm512_setzero_si512();
        for (int p = 0; p < 4; p++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(w[b].qs + 32 * p));
            const __m512i u = _mm512_and_si512(join256(q, _mm256_srli_epi16(q, 4)), m4);
            const __m512i y = _mm512_loadu_si512(a[b].qs + 64 * p);
            isum = _mm512_add_epi32(isum, mad_scaled(u, y, _mm512_permutexvar_epi16(idx[p], sc16)));
        }
        /* dot.c's canonical order (the multi-token tiles give the same bits) */
        const __m128 is = _mm_cvtepi32_ps(_mm_cvtsi32_si128(_mm512_reduce_add_epi32(isum)));
        acc = _mm_fmadd_ss(is, _mm_set_ss(h2f(w[b].d) * a[b].d), acc);
        acc = _mm_fnmadd_ss(_mm_cvtepi32_ps(_mm_cvtsi32_si128(summ)), _mm_set_ss(h2f(w[b].dmin) * a[b].d), acc);
    }
    *s = _mm_cvtss_f32(acc);
}

static void dot_q5_K(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q5_K *w = vw;
    const mf_block_q8_K *a = va;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512 acc = _mm512_setzero_ps();
    float sm = 0;
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        int sc[8], m[8], summ = 0;
        k4_unpack(w[b].scales, sc, m);
        for (int j = 0; j < 8; j++)
            summ += m[j] * (a[b].bsums[2 * j] + a[b].bsums[2 * j + 1]);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)w[b].qh);
        __m512i isum = _mm512_setzero_si512();
        for (int p = 0; p < 4; p++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(w[b].qs + 32 * p));
            __m512i u = _mm512_and_si512(join256(q, _mm256_srli_epi16(q, 4)), m4);
            /* fifth bit of group j = bit j of qh[l]: groups 2p and 2p+1 here */
            const __mmask32 hl = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << (2 * p))));
            const __mmask32 hh = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(2 << (2 * p))));
            u = _mm512_or_si512(u, join256(_mm256_maskz_mov_epi8(hl, _mm256_set1_epi8(0x10)),
                                           _mm256_maskz_mov_epi8(hh, _mm256_set1_epi8(0x10))));
            const __m512i y = _mm512_loadu_si512(a[b].qs + 64 * p);
            isum = _mm512_add_epi32(isum, mad_scaled(u, y, scales_2x32(sc[2 * p], sc[2 * p + 1])));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(a[b].d * h2f(w[b].d)), acc);
        sm += a[b].d * h2f(w[b].dmin) * (float)summ;
    }
    *s = _mm512_reduce_add_ps(acc) - sm;
}

static void dot_q6_K(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_q6_K *w = vw;
    const mf_block_q8_K *a = va;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
    /* int16 lane i of the scale vector for chunk c (64 elements) = scale 4c + i/8 */
    const __m512i idx0 = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2,
                                          1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    __m128 sum = _mm_setzero_ps();
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        const int8_t *sc = w[b].scales;
        int corr = 0; /* levels are biased by 32 */
        for (int j = 0; j < 16; j++)
            corr += sc[j] * a[b].bsums[j];
        const __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc)));
        __m512i isum = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(w[b].ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(w[b].ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(w[b].qh + 32 * h));
            /* groups g = 0..3 of this half: low nibble source and high-bit shift */
            const __m256i g0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
            const __m256i g1 = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
            const __m256i g2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
            const __m256i g3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
            const __m512i u01 = join256(g0, g1), u23 = join256(g2, g3);
            const __m512i sv01 = _mm512_permutexvar_epi16(_mm512_add_epi16(idx0, _mm512_set1_epi16((short)(8 * h))), sc16);
            const __m512i sv23 = _mm512_permutexvar_epi16(_mm512_add_epi16(idx0, _mm512_set1_epi16((short)(8 * h + 4))), sc16);
            isum = _mm512_add_epi32(isum, mad_scaled(u01, _mm512_loadu_si512(a[b].qs + 128 * h), sv01));
            isum = _mm512_add_epi32(isum, mad_scaled(u23, _mm512_loadu_si512(a[b].qs + 128 * h + 64), sv23));
        }
        const __m128 is = _mm_cvtepi32_ps(_mm_cvtsi32_si128(_mm512_reduce_add_epi32(isum) - 32 * corr));
        sum = _mm_fmadd_ss(is, _mm_set_ss(h2f(w[b].d) * a[b].d), sum); /* dot.c's canonical order */
    }
    *s = _mm_cvtss_f32(sum);
}

/* ==== tables ===================================================================== */

static const mf_cpu_dot dots_avx512[MF_TYPE_COUNT] = {
    [MF_TYPE_F32] = {MF_TYPE_F32, dot_f32},
    [MF_TYPE_F16] = {MF_TYPE_F32, dot_f16},
    [MF_TYPE_BF16] = {MF_TYPE_F32, dot_bf16},
    [MF_TYPE_Q4_0] = {MF_TYPE_Q8_0, dot_q4_0},
    [MF_TYPE_Q4_1] = {MF_TYPE_Q8_1, dot_q4_1},
    [MF_TYPE_Q5_0] = {MF_TYPE_Q8_0, dot_q5_0},
    [MF_TYPE_Q5_1] = {MF_TYPE_Q8_1, dot_q5_1},
    [MF_TYPE_Q8_0] = {MF_TYPE_Q8_0, dot_q8_0},
    [MF_TYPE_Q4_K] = {MF_TYPE_Q8_K, dot_q4_K},
    [MF_TYPE_Q5_K] = {MF_TYPE_Q8_K, dot_q5_K},
    [MF_TYPE_Q6_K] = {MF_TYPE_Q8_K, dot_q6_K},
};

const mf_cpu_dot *mf_cpu_dot_avx512(uint32_t wtype) {
    if (wtype >= MF_TYPE_COUNT || !dots_avx512[wtype].dot)
        return NULL;
    return &dots_avx512[wtype];
}

bool mf_cpu_quantize_act_avx512(uint32_t act_type, const float *x, void *y, int64_t n) {
    return mf_cpu_quantize_act_avx2(act_type, x, y, n);
}
