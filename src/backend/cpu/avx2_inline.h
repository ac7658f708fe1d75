/* avx2_inline.h - private to src/backend/cpu: the small AVX2 helpers the
 * AVX2 kernel files share (dot_avx2.c, gemm_avx2.c, dot_iq4_avx2.c). One
 * definition, so the batched tile and the one-token dots reduce in the same
 * order and stay bit-equal. Include only from files compiled with -mavx2
 * -mfma -mf16c. */
#ifndef MF_CPU_AVX2_INLINE_H
#define MF_CPU_AVX2_INLINE_H

#include <immintrin.h>
#include <stdint.h>

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* unsigned bytes x signed bytes -> 8 int32 sums of 4 products */
static inline __m256i mad_u8i8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* 16 packed nibble bytes -> 32 bytes: low nibbles first, then high nibbles
 * (element j and j + 16 of a 32-block share byte j). */
static inline __m256i nibbles32(const uint8_t *qs) {
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    const __m256i b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0f));
}

#endif
