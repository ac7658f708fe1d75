/* dot_iq4_avx2.c - AVX2 dot products for the IQ4_NL and IQ4_XS weights.
 *
 * Compiled with -mavx2 -mfma -mf16c; reached through mf_cpu_dot_get after
 * the cpuid check. The 4-bit indices are turned into their codebook levels
 * with one byte shuffle (the 16 levels fit a 128-bit table), multiplied by
 * the int8 activations with the sign trick (|w| * sign(a, w), maddubs: at
 * most 2 * 127 * 127 < 32767 per int16 pair) and summed exactly in int32.
 * The float part (one fmaf per block, in block order) is the scalar
 * kernel's, so the result is bit-equal to it (tests/unit/test_cpu_kernels.c
 * checks). */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/avx2_inline.h"
#include "backend/cpu/kernels_isa.h"
#include "quant/blocks.h"
#include "quant/quant.h"

/* The codebook in both 128-bit lanes, for _mm256_shuffle_epi8. */
static inline __m256i levels_table(void) {
    const __m128i t = _mm_loadu_si128((const __m128i *)mf_iq4_values);
    return _mm256_set_m128i(t, t);
}

/* 16 bytes of packed indices -> the 32 levels of elements 0..31 (element j
 * in the low nibble of byte j, element j + 16 in its high nibble). */
static inline __m256i levels32(__m256i table, const uint8_t *qs) {
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    const __m256i b = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0f));
    return _mm256_shuffle_epi8(table, b);
}

/* 8 int32 partial sums of the 32 products of signed w and a. */
static inline __m256i dot32(__m256i w, const int8_t *a) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)a);
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

static void dot_iq4_nl(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_iq4_nl *w = vw;
    const mf_block_q8_0 *a = va;
    const __m256i table = levels_table();
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK4_NL; b++) {
        const int isum = hsum_epi32(dot32(levels32(table, w[b].qs), a[b].qs));
        sum = fmaf((float)isum, h2f(w[b].d) * h2f(a[b].d), sum);
    }
    *s = sum;
}

static void dot_iq4_xs(int64_t n, float *s, const void *vw, const void *va) {
    const mf_block_iq4_xs *w = vw;
    const mf_block_q8_K *a = va;
    const __m256i table = levels_table();
    float sum = 0;
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        __m256i acc = _mm256_setzero_si256();
        const unsigned sh = w[b].scales_h;
        for (int ib = 0; ib < 8; ib++) {
            const int ls = ((w[b].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
            const __m256i sub = dot32(levels32(table, w[b].qs + 16 * ib), a[b].qs + 32 * ib);
            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(sub, _mm256_set1_epi32(ls - 32)));
        }
        sum = fmaf((float)hsum_epi32(acc), h2f(w[b].d) * a[b].d, sum);
    }
    *s = sum;
}

static const mf_cpu_dot dot_iq4_nl_avx2 = {MF_TYPE_Q8_0, dot_iq4_nl};
static const mf_cpu_dot dot_iq4_xs_avx2 = {MF_TYPE_Q8_K, dot_iq4_xs};

const mf_cpu_dot *mf_cpu_dot_iq4_avx2(uint32_t wtype) {
    if (wtype == MF_TYPE_IQ4_NL)
        return &dot_iq4_nl_avx2;
    if (wtype == MF_TYPE_IQ4_XS)
        return &dot_iq4_xs_avx2;
    return NULL;
}
