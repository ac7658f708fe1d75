/* gemm_avx512.c - register-blocked multi-token matmul for the Q8_0-paired
 * weight types (Q4_0, Q5_0, Q8_0) with AVX-512 VNNI.
 *
 * A tile is a panel of 32 weight rows times any number of tokens. The panel is
 * unpacked once into unsigned levels laid out "row per int32 lane": for each
 * 32-block and each 4-element step k, two 64-byte vectors hold elements
 * 4k..4k+3 of rows 0-15 and 16-31. One vpdpbusd against the broadcast 4
 * activation bytes of a token then advances 16 row dots at once, so each
 * unpacked weight byte is reused for every token from L1/L2, and the
 * per-block float work (convert, scale, fma) is one vector op per 16 rows.
 *
 * Numerics are the canonical ones of dot.c's scalar twins, bit for bit: each
 * block's integer sum is exact, (levels - off) . q = dpbusd - off * sum(q),
 * and the row accumulates s = fma((float)isum_b, dw_b * da_b, s) over blocks
 * in order. So the result does not depend on the tile, the token grouping or
 * the thread count, and equals the single-row dot kernels here and in dot.c. */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/kernels_isa.h"

#define PANEL_ROWS 32
#define PB_LEVELS 1024                   /* 8 steps x 2 row groups x 64 bytes */
#define PB_BYTES (PB_LEVELS + 32 * 4)    /* + 32 float row scales */
#define MK_TOKENS 6                      /* tokens per microkernel call */
#define DECODE_CHUNK 8                   /* blocks packed at a time for few tokens */

static inline uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline __m512i join256(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* ==== unpacking one row-block into 32 unsigned levels ======================== */

static inline __m256i lv_q4_0(const uint8_t *blk) {
    const __m128i t = _mm_loadu_si128((const __m128i *)(blk + 2));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0f));
}

static inline __m256i lv_q5_0(const uint8_t *blk) {
    const __m128i t = _mm_loadu_si128((const __m128i *)(blk + 6));
    const __m256i lo = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0f));
    return _mm256_or_si256(lo, _mm256_maskz_mov_epi8((__mmask32)load_u32(blk + 2), _mm256_set1_epi8(0x10)));
}

static inline __m256i lv_q8_0(const uint8_t *blk) {
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)), _mm256_set1_epi8((char)0x80));
}

/* Levels of row r's block and the offset that makes them signed. */
static inline __m256i lv_get(uint32_t wtype, const uint8_t *blk) {
    switch (wtype) {
    case MF_TYPE_Q4_0: return lv_q4_0(blk);
    case MF_TYPE_Q5_0: return lv_q5_0(blk);
    default: return lv_q8_0(blk);
    }
}

static int lv_shift(uint32_t wtype) { /* log2 of the level offset */
    return wtype == MF_TYPE_Q4_0 ? 3 : wtype == MF_TYPE_Q5_0 ? 4 : 7;
}

static size_t blk_bytes(uint32_t wtype) {
    return wtype == MF_TYPE_Q4_0 ? sizeof(mf_block_q4_0)
           : wtype == MF_TYPE_Q5_0 ? sizeof(mf_block_q5_0)
                                   : sizeof(mf_block_q8_0);
}

/* ==== packing: 16x8 int32 transpose ========================================== */

/* p[i] holds rows i (lanes 0-7) and i+8 (lanes 8-15), int32 k = 0..7 each;
 * out[k] gets lane r = int32 k of row r. Three levels of two-source
 * permutes; the index vectors were derived by tracking (row, k) per lane. */
static inline void transpose16x8(const __m512i p[8], __m512i out[8]) {
    const __m512i i1a = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    const __m512i i2a = _mm512_setr_epi32(0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
    const __m512i i3a = _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    const __m512i i1b = _mm512_add_epi32(i1a, _mm512_set1_epi32(4));
    const __m512i i2b = _mm512_add_epi32(i2a, _mm512_set1_epi32(2));
    const __m512i i3b = _mm512_add_epi32(i3a, _mm512_set1_epi32(1));
    __m512i q[4][2], r[2][2][2];
    for (int i = 0; i < 4; i++) {
        q[i][0] = _mm512_permutex2var_epi32(p[i], i1a, p[i + 4]);
        q[i][1] = _mm512_permutex2var_epi32(p[i], i1b, p[i + 4]);
    }
    for (int i = 0; i < 2; i++)
        for (int h = 0; h < 2; h++) {
            r[i][h][0] = _mm512_permutex2var_epi32(q[i][h], i2a, q[i + 2][h]);
            r[i][h][1] = _mm512_permutex2var_epi32(q[i][h], i2b, q[i + 2][h]);
        }
    for (int h = 0; h < 2; h++)
        for (int g = 0; g < 2; g++) {
            out[4 * h + 2 * g] = _mm512_permutex2var_epi32(r[0][h][g], i3a, r[1][h][g]);
            out[4 * h + 2 * g + 1] = _mm512_permutex2var_epi32(r[0][h][g], i3b, r[1][h][g]);
        }
}

/* Packs blocks [b0, b1) of the panel whose rows start at rowp[0..31] (rows
 * past the matrix repeat its last row; their outputs are never stored). */
static void pack_panel(uint32_t wtype, const uint8_t *const rowp[PANEL_ROWS], const __m512i off[2], int64_t b0,
                       int64_t b1, uint8_t *dst) {
    const size_t bb = blk_bytes(wtype);
    for (int64_t b = b0; b < b1; b++, dst += PB_BYTES) {
        const size_t o = (size_t)b * bb;
        for (int g = 0; g < 2; g++) {
            __m512i p[8], s[8];
            for (int i = 0; i < 8; i++)
                p[i] = join256(lv_get(wtype, rowp[16 * g + i] + o), lv_get(wtype, rowp[16 * g + i + 8] + o));
            transpose16x8(p, s);
            for (int k = 0; k < 8; k++)
                _mm512_store_si512((__m512i *)(dst + 128 * k + 64 * g), s[k]);
            /* the f16 scale sits at the start of every block of these types */
            const __m512i d = _mm512_i32gather_epi32(off[g], (const void *)(rowp[0] + o), 1);
            const __m256i h = _mm512_cvtepi32_epi16(d);
            _mm512_store_ps((float *)(dst + PB_LEVELS) + 16 * g, _mm512_cvtph_ps(h));
        }
    }
}

/* ==== the microkernel: 32 rows x T tokens over nb packed blocks ============== */

/* acc[t][32] += the rows' dots with token t over blocks [0, nb) of the packed
 * panel pp; a[t] points at token t's Q8_0 blocks (same block index as pp's
 * first), ad/as at its float scales and level sums. */
static inline __attribute__((always_inline)) void mk(const uint8_t *pp, int64_t nb, const uint8_t *const *a,
                                                     const float *const *ad, const int32_t *const *as, int T,
                                                     int sh, float *acc) {
    __m512 f0[MK_TOKENS], f1[MK_TOKENS];
    for (int t = 0; t < T; t++) {
        f0[t] = _mm512_loadu_ps(acc + 32 * t);
        f1[t] = _mm512_loadu_ps(acc + 32 * t + 16);
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = pp + (size_t)b * PB_BYTES;
        __m512i i0[MK_TOKENS], i1[MK_TOKENS];
        for (int t = 0; t < T; t++)
            i0[t] = i1[t] = _mm512_set1_epi32(-(as[t][b] << sh));
        for (int k = 0; k < 8; k++) {
            const __m512i w0 = _mm512_load_si512((const __m512i *)(pb + 128 * k));
            const __m512i w1 = _mm512_load_si512((const __m512i *)(pb + 128 * k + 64));
            for (int t = 0; t < T; t++) {
                const __m512i av = _mm512_set1_epi32((int)load_u32(a[t] + (size_t)b * sizeof(mf_block_q8_0) + 2 + 4 * k));
                i0[t] = _mm512_dpbusd_epi32(i0[t], w0, av);
                i1[t] = _mm512_dpbusd_epi32(i1[t], w1, av);
            }
        }
        const __m512 s0 = _mm512_load_ps((const float *)(pb + PB_LEVELS));
        const __m512 s1 = _mm512_load_ps((const float *)(pb + PB_LEVELS) + 16);
        for (int t = 0; t < T; t++) {
            const __m512 dv = _mm512_set1_ps(ad[t][b]);
            f0[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0[t]), _mm512_mul_ps(s0, dv), f0[t]);
            f1[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1[t]), _mm512_mul_ps(s1, dv), f1[t]);
        }
    }
    for (int t = 0; t < T; t++) {
        _mm512_storeu_ps(acc + 32 * t, f0[t]);
        _mm512_storeu_ps(acc + 32 * t + 16, f1[t]);
    }
}

static void mk_any(const uint8_t *pp, int64_t nb, const uint8_t *const *a, const float *const *ad,
                   const int32_t *const *as, int T, int sh, float *acc) {
    switch (T) {
    case 1: mk(pp, nb, a, ad, as, 1, sh, acc); break;
    case 2: mk(pp, nb, a, ad, as, 2, sh, acc); break;
    case 3: mk(pp, nb, a, ad, as, 3, sh, acc); break;
    case 4: mk(pp, nb, a, ad, as, 4, sh, acc); break;
    case 5: mk(pp, nb, a, ad, as, 5, sh, acc); break;
    default: mk(pp, nb, a, ad, as, 6, sh, acc); break;
    }
}

/* ==== the tile ================================================================ */

size_t mf_cpu_gemm_scratch(int64_t n_in) {
    return (size_t)(n_in / 32) * PB_BYTES + 64;
}

bool mf_cpu_gemm_supported(uint32_t wtype) {
    return wtype == MF_TYPE_Q4_0 || wtype == MF_TYPE_Q5_0 || wtype == MF_TYPE_Q8_0;
}

void mf_cpu_gemm_avx512(const mf_cpu_gemm_tile *g) {
    const int64_t nb = g->n_in / 32;
    const int sh = lv_shift(g->wtype);
    const uint8_t *rowp[PANEL_ROWS];
    int32_t offs[PANEL_ROWS];
    for (int r = 0; r < PANEL_ROWS; r++) {
        const int64_t rr = r < g->rows ? r : g->rows - 1;
        rowp[r] = g->w + (size_t)rr * g->w_row;
        offs[r] = (int32_t)((size_t)rr * g->w_row);
    }
    const __m512i off[2] = {_mm512_loadu_si512(offs), _mm512_loadu_si512(offs + 16)};
    uint8_t *pp = (uint8_t *)(((uintptr_t)g->scratch + 63) & ~(uintptr_t)63);
    const __mmask16 m0 = g->rows >= 16 ? 0xffff : (__mmask16)((1u << g->rows) - 1);
    const __mmask16 m1 = g->rows >= 32 ? 0xffff : g->rows <= 16 ? 0 : (__mmask16)((1u << (g->rows - 16)) - 1);
    float acc[MK_TOKENS * PANEL_ROWS];
    const uint8_t *a[MK_TOKENS];
    const float *ad[MK_TOKENS];
    const int32_t *as[MK_TOKENS];

    /* The panel's rows are one contiguous region, but packing walks it block
     * by block across 32 rows: 32 interleaved streams that the hardware
     * prefetchers do not follow (decode ran at a third of the bandwidth).
     * One linear prefetch sweep first turns it into a single stream. */
    const size_t span = (size_t)g->rows * g->w_row;
    for (size_t o = 0; o < span; o += 64)
        _mm_prefetch((const char *)(g->w + o), _MM_HINT_T0);
    const bool whole = g->nt > MK_TOKENS; /* else stream the panel through L1 in chunks */
    if (whole)
        pack_panel(g->wtype, rowp, off, 0, nb, pp);
    for (int64_t t0 = 0; t0 < g->nt; t0 += MK_TOKENS) {
        const int T = (int)(g->nt - t0 < MK_TOKENS ? g->nt - t0 : MK_TOKENS);
        memset(acc, 0, sizeof(float) * PANEL_ROWS * (size_t)T);
        for (int64_t b0 = 0; b0 < nb; b0 += whole ? nb : DECODE_CHUNK) {
            const int64_t b1 = whole || b0 + DECODE_CHUNK > nb ? nb : b0 + DECODE_CHUNK;
            if (!whole)
                pack_panel(g->wtype, rowp, off, b0, b1, pp);
            for (int t = 0; t < T; t++) {
                a[t] = g->act + (size_t)(t0 + t) * g->a_row + (size_t)b0 * sizeof(mf_block_q8_0);
                ad[t] = g->ad + (t0 + t) * nb + b0;
                as[t] = g->as + (t0 + t) * nb + b0;
            }
            mk_any(whole ? pp + (size_t)b0 * PB_BYTES : pp, b1 - b0, a, ad, as, T, sh, acc);
        }
        for (int t = 0; t < T; t++) {
            float *y = g->y + (t0 + t) * g->ldy;
            _mm512_mask_storeu_ps(y, m0, _mm512_loadu_ps(acc + 32 * t));
            _mm512_mask_storeu_ps(y + 16, m1, _mm512_loadu_ps(acc + 32 * t + 16));
        }
    }
}
