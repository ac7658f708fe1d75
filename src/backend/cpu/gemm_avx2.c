/* gemm_avx2.c - multi-token tiles on AVX2: a block of weight rows of Q4_0,
 * Q4_1 or Q8_0 against up to MF_GEMM_AVX2_TOKS tokens of Q8_0 / Q8_1
 * activations (batched decode, prefill tiles).
 *
 * Every (row, token) output carries the bits of the one-token dot of
 * dot_avx2.c, so a sequence decoded in a batch gets the logits it gets
 * alone: each pair keeps that kernel's eight float lanes and its order per
 * block (int32 lanes of four products, converted, times the float product
 * dw * da, fused into the pair's accumulator; one horizontal sum at the
 * end). What the tile saves is the rest of the one-token kernel's work: a
 * weight block is unpacked once for eight tokens, the activation scales
 * are converted once per tile instead of once per row, the eight scale
 * products of a block come from one vector multiply and reach each token
 * as a broadcast load, and the eight accumulators stay in registers across
 * the whole row. */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/avx2_inline.h"
#include "backend/cpu/kernels_isa.h"

#define GROUP 8 /* tokens sharing one unpacked weight block */

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* One weight row of signed 32-element blocks (levels q, scale dw per
 * block; Q4_0 and Q8_0) times T tokens. a: token 0's Q8_0 row, the others
 * a_row bytes apart; da[8 b + t]: token t's block-b scale as a float. */
#define SIGNED_ROW(name, wblock, LEVELS)                                                                    \
    static ALWAYS_INLINE void name(int64_t nb, const wblock *w, const uint8_t *a, size_t a_row,             \
                                   const float *da, float *y, int64_t ldy, const int T) {                  \
        __m256 acc[GROUP];                                                                                  \
        _Alignas(32) float sc[GROUP];                                                                       \
        for (int t = 0; t < T; t++)                                                                         \
            acc[t] = _mm256_setzero_ps();                                                                   \
        for (int64_t b = 0; b < nb; b++) {                                                                  \
            const __m256i q = LEVELS;                                                                       \
            const __m256i aq = _mm256_sign_epi8(q, q);                                                      \
            _mm256_store_ps(sc, _mm256_mul_ps(_mm256_set1_ps(h2f(w[b].d)), _mm256_load_ps(da + GROUP * b))); \
            for (int t = 0; t < T; t++) {                                                                   \
                const mf_block_q8_0 *x = (const mf_block_q8_0 *)(a + (size_t)t * a_row) + b;              \
                const __m256i p = mad_u8i8(aq, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)x->qs), q)); \
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&sc[t]), acc[t]);      \
            }                                                                                               \
        }                                                                                                   \
        for (int t = 0; t < T; t++)                                                                         \
            y[t * ldy] = hsum_ps(acc[t]);                                                                   \
    }

SIGNED_ROW(row_q4_0, mf_block_q4_0, _mm256_sub_epi8(nibbles32(w[b].qs), _mm256_set1_epi8(8)))
SIGNED_ROW(row_q8_0, mf_block_q8_0, _mm256_loadu_si256((const __m256i *)w[b].qs))

/* Q4_1: unsigned levels, so no sign step. The offset term m * s of the
 * eight tokens is one C expression on a vector type, written as the
 * one-token kernel writes it for a scalar (sm += mw * sa): the compiler
 * contracts both into an fma or neither, so each lane keeps that kernel's
 * bits under either compiler's default (sa: the activation block sums as
 * floats, laid out like da). */
typedef float v8f __attribute__((vector_size(32)));

static ALWAYS_INLINE void row_q4_1(int64_t nb, const mf_block_q4_1 *w, const uint8_t *a, size_t a_row,
                                   const float *da, const float *sa, float *y, int64_t ldy, const int T) {
    __m256 acc[GROUP];
    v8f sm = {0};
    _Alignas(32) float sc[GROUP];
    for (int t = 0; t < T; t++)
        acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m256i q = nibbles32(w[b].qs);
        const float mw = h2f(w[b].m);
        const v8f mwv = {mw, mw, mw, mw, mw, mw, mw, mw};
        _mm256_store_ps(sc, _mm256_mul_ps(_mm256_set1_ps(h2f(w[b].d)), _mm256_load_ps(da + GROUP * b)));
        for (int t = 0; t < T; t++) {
            const mf_block_q8_1 *x = (const mf_block_q8_1 *)(a + (size_t)t * a_row) + b;
            const __m256i p = mad_u8i8(q, _mm256_loadu_si256((const __m256i *)x->qs));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&sc[t]), acc[t]);
        }
        v8f sav;
        memcpy(&sav, sa + GROUP * b, sizeof sav);
        sm += mwv * sav;
    }
    for (int t = 0; t < T; t++)
        y[t * ldy] = hsum_ps(acc[t]) + sm[t];
}

/* The rows of a tile for one group of T tokens: T is a constant in each
 * case, so the token loops unroll and the accumulators live in registers. */
#define ROWS_FOR_T(fn, wblock, ...)                                                                     \
    switch (T) {                                                                                        \
    case 1: for (int64_t r = 0; r < rows; r++) fn(nb, (const wblock *)(w + r * w_row), __VA_ARGS__, y + r, ldy, 1); break; \
    case 2: for (int64_t r = 0; r < rows; r++) fn(nb, (const wblock *)(w + r * w_row), __VA_ARGS__, y + r, ldy, 2); break; \
    case 3: for (int64_t r = 0; r < rows; r++) fn(nb, (const wblock *)(w + r * w_row), __VA_ARGS__, y + r, ldy, 3); break; \
    case 4: for (int64_t r = 0; r < rows; r++) fn(nb, (const wblock *)(w + r * w_row), __VA_ARGS__, y + r, ldy, 4); break; \
    case 5: for (int64_t r = 0; r < rows; r++) fn(nb, (const wblock *)(w + r * w_row), __VA_ARGS__, y + r, ldy, 5); break; \
    case 6: for (int64_t r = 0; r < rows; r++) fn(nb, (const wblock *)(w + r * w_row), __VA_ARGS__, y + r, ldy, 6); break; \
    case 7: for (int64_t r = 0; r < rows; r++) fn(nb, (const wblock *)(w + r * w_row), __VA_ARGS__, y + r, ldy, 7); break; \
    default: for (int64_t r = 0; r < rows; r++) fn(nb, (const wblock *)(w + r * w_row), __VA_ARGS__, y + r, ldy, 8); break; \
    }

/* Token t's block scales (and for Q8_1 its block sums) into column t of
 * the [block][GROUP] tables; unused columns are zero. */
static void fill_scales(int64_t nb, const uint8_t *a, size_t a_row, int T, bool q8_1, float *da, float *sa) {
    for (int64_t b = 0; b < nb; b++)
        for (int t = 0; t < GROUP; t++) {
            float d = 0, s = 0;
            if (t < T) {
                if (q8_1) {
                    const mf_block_q8_1 *x = (const mf_block_q8_1 *)(a + (size_t)t * a_row) + b;
                    d = h2f(x->d);
                    s = h2f(x->s);
                } else {
                    d = h2f(((const mf_block_q8_0 *)(a + (size_t)t * a_row) + b)->d);
                }
            }
            da[GROUP * b + t] = d;
            if (q8_1)
                sa[GROUP * b + t] = s;
        }
}

/* The tile of a signed block type: tokens in groups of GROUP, each group's
 * activation scales converted once, then every row against the group. */
#define SIGNED_TILE(name, row, wblock, QK)                                                                  \
    static void name(const mf_cpu_avx2_tile *g) {                                                           \
        const int64_t nb = g->n_in / QK;                                                                    \
        const uint8_t *w = g->w;                                                                            \
        const size_t w_row = g->w_row;                                                                      \
        const int64_t rows = g->rows, ldy = g->ldy;                                                         \
        for (int64_t t0 = 0; t0 < g->nt; t0 += GROUP) {                                                     \
            const int T = g->nt - t0 < GROUP ? (int)(g->nt - t0) : GROUP;                                   \
            const uint8_t *a = g->act + (size_t)t0 * g->a_row;                                              \
            float *y = g->y + t0 * ldy;                                                                     \
            fill_scales(nb, a, g->a_row, T, false, g->scratch, NULL);                                       \
            ROWS_FOR_T(row, wblock, a, g->a_row, g->scratch)                                                \
        }                                                                                                   \
    }
SIGNED_TILE(tile_q4_0, row_q4_0, mf_block_q4_0, MF_QK4_0)
SIGNED_TILE(tile_q8_0, row_q8_0, mf_block_q8_0, MF_QK8_0)

static void tile_q4_1(const mf_cpu_avx2_tile *g) {
    const int64_t nb = g->n_in / MF_QK4_1;
    const uint8_t *w = g->w;
    const size_t w_row = g->w_row;
    const int64_t rows = g->rows, ldy = g->ldy;
    float *da = g->scratch, *sa = g->scratch + GROUP * nb;
    for (int64_t t0 = 0; t0 < g->nt; t0 += GROUP) {
        const int T = g->nt - t0 < GROUP ? (int)(g->nt - t0) : GROUP;
        const uint8_t *a = g->act + (size_t)t0 * g->a_row;
        float *y = g->y + t0 * ldy;
        fill_scales(nb, a, g->a_row, T, true, da, sa);
        ROWS_FOR_T(row_q4_1, mf_block_q4_1, a, g->a_row, da, sa)
    }
}

mf_cpu_avx2_tile_fn mf_cpu_avx2_tile_get(uint32_t wtype) {
    switch (wtype) {
    case MF_TYPE_Q4_0: return tile_q4_0;
    case MF_TYPE_Q4_1: return tile_q4_1;
    case MF_TYPE_Q8_0: return tile_q8_0;
    default: return NULL;
    }
}

size_t mf_cpu_avx2_tile_scratch(int64_t n_in) {
    return 2 * (size_t)GROUP * (size_t)(n_in / 32) * sizeof(float);
}
