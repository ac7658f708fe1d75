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
 * Q4_K and Q6_K tiles work the same way over the 8 groups of a super-block,
 * with the sub-block scales applied in int32 and the min / bias terms as
 * int16 pair dots (vpdpwssd) against the activation block sums.
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
            i0[t] = i1[t] = _mm512_set1_epi32(-(as[t][b] * (1 << sh)));
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

/* ==== K-quants: Q4_K and Q6_K against Q8_K =================================== */

/* A packed super-block: the 8 groups of 32 elements transposed like a 32-block
 * above, then per row (int32 lanes, two row groups of 16): the sub-block
 * scales, int16 pairs for the correction term (Q4_K: mins (m_2i, m_2i+1);
 * Q6_K: scales (sc_2i, sc_2i+1)) and the float d and dmin. */
#define KB_LEVELS (8 * PB_LEVELS)
#define KB_SCALES KB_LEVELS                      /* int32 [16][32] */
#define KB_PAIRS (KB_SCALES + 16 * 32 * 4)       /* int32 [8][32] */
#define KB_D (KB_PAIRS + 8 * 32 * 4)             /* float [32] */
#define KB_DMIN (KB_D + 32 * 4)                  /* float [32] */
#define KB_BYTES (KB_DMIN + 32 * 4)
#define MKK_TOKENS 4

/* 32 levels (element order 32j..32j+31) of group j of a K-quant block. */
static inline __m256i lv_k(uint32_t wtype, const uint8_t *blk, int j) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    if (wtype == MF_TYPE_Q4_K) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(((const mf_block_q4_K *)blk)->qs + 32 * (j / 2)));
        return _mm256_and_si256(j % 2 ? _mm256_srli_epi16(q, 4) : q, m4);
    }
    const mf_block_q6_K *x = (const mf_block_q6_K *)blk;
    const int h = j / 4, g = j % 4;
    const __m256i l = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32 * (g & 1)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
    const __m256i lo = _mm256_and_si256(g >> 1 ? _mm256_srli_epi16(l, 4) : l, m4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), _mm256_set1_epi8(3));
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
}

static void pack_panel_k(uint32_t wtype, const uint8_t *const rowp[PANEL_ROWS], int64_t b0, int64_t b1,
                         uint8_t *dst) {
    const size_t bb = wtype == MF_TYPE_Q4_K ? sizeof(mf_block_q4_K) : sizeof(mf_block_q6_K);
    for (int64_t b = b0; b < b1; b++, dst += KB_BYTES) {
        const size_t o = (size_t)b * bb;
        for (int j = 0; j < 8; j++)
            for (int g = 0; g < 2; g++) {
                __m512i p[8], s[8];
                for (int i = 0; i < 8; i++)
                    p[i] = join256(lv_k(wtype, rowp[16 * g + i] + o, j), lv_k(wtype, rowp[16 * g + i + 8] + o, j));
                transpose16x8(p, s);
                for (int k = 0; k < 8; k++)
                    _mm512_store_si512((__m512i *)(dst + PB_LEVELS * j + 128 * k + 64 * g), s[k]);
            }
        int32_t *sc = (int32_t *)(dst + KB_SCALES), *pr = (int32_t *)(dst + KB_PAIRS);
        float *d = (float *)(dst + KB_D), *dm = (float *)(dst + KB_DMIN);
        for (int r = 0; r < PANEL_ROWS; r++) {
            if (wtype == MF_TYPE_Q4_K) {
                const mf_block_q4_K *x = (const mf_block_q4_K *)(rowp[r] + o);
                int scv[8], mv[8];
                for (int j = 0; j < 4; j++) {
                    scv[j] = x->scales[j] & 63;
                    mv[j] = x->scales[j + 4] & 63;
                    scv[j + 4] = (x->scales[j + 8] & 0x0f) | ((x->scales[j] >> 6) << 4);
                    mv[j + 4] = (x->scales[j + 8] >> 4) | ((x->scales[j + 4] >> 6) << 4);
                }
                for (int j = 0; j < 8; j++)
                    sc[32 * j + r] = scv[j];
                for (int i = 0; i < 4; i++)
                    pr[32 * i + r] = (int32_t)((uint32_t)mv[2 * i] | (uint32_t)mv[2 * i + 1] << 16);
                d[r] = _cvtsh_ss(x->d);
                dm[r] = _cvtsh_ss(x->dmin);
            } else {
                const mf_block_q6_K *x = (const mf_block_q6_K *)(rowp[r] + o);
                for (int j = 0; j < 16; j++)
                    sc[32 * j + r] = x->scales[j];
                for (int i = 0; i < 8; i++)
                    pr[32 * i + r] = (int32_t)((uint32_t)(uint16_t)x->scales[2 * i] |
                                               (uint32_t)(uint16_t)x->scales[2 * i + 1] << 16);
                d[r] = _cvtsh_ss(x->d);
                dm[r] = 0;
            }
        }
    }
}

/* int16 pair i of the 32-sums of a Q8_K block (Q4_K mins pair with these). */
static inline int32_t bsum32_pair(const mf_block_q8_K *a, int i) {
    const int lo = a->bsums[4 * i] + a->bsums[4 * i + 1], hi = a->bsums[4 * i + 2] + a->bsums[4 * i + 3];
    return (int32_t)((uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16);
}

/* acc[t][32] over super-blocks [0, nb) of the packed panel; a[t] points at
 * token t's first Q8_K block. Canonical numerics (dot.c): Q4_K
 * s = fma(isum, dw*da, s), s = fma(-summ, dmin*da, s); Q6_K
 * s = fma(isum - 32 * sum_j sc_j bsum_j, dw*da, s). */
static inline __attribute__((always_inline)) void mkk(const uint8_t *pp, int64_t nb, const mf_block_q8_K *const *a,
                                                      int T, bool q6, float *acc) {
    const int kps = q6 ? 4 : 8; /* k steps per sub-block scale */
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = pp + (size_t)b * KB_BYTES;
        __m512i is0[MKK_TOKENS], is1[MKK_TOKENS];
        for (int t = 0; t < T; t++)
            is0[t] = is1[t] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++)
            for (int ks = 0; ks < 8; ks += kps) {
                __m512i ia0[MKK_TOKENS], ia1[MKK_TOKENS];
                for (int t = 0; t < T; t++)
                    ia0[t] = ia1[t] = _mm512_setzero_si512();
                for (int k = ks; k < ks + kps; k++) {
                    const __m512i w0 = _mm512_load_si512((const __m512i *)(pb + PB_LEVELS * j + 128 * k));
                    const __m512i w1 = _mm512_load_si512((const __m512i *)(pb + PB_LEVELS * j + 128 * k + 64));
                    for (int t = 0; t < T; t++) {
                        const __m512i av = _mm512_set1_epi32((int)load_u32((const uint8_t *)a[t][b].qs + 32 * j + 4 * k));
                        ia0[t] = _mm512_dpbusd_epi32(ia0[t], w0, av);
                        ia1[t] = _mm512_dpbusd_epi32(ia1[t], w1, av);
                    }
                }
                const int js = q6 ? 2 * j + ks / 4 : j;
                const __m512i sc0 = _mm512_load_si512((const __m512i *)(pb + KB_SCALES + 128 * js));
                const __m512i sc1 = _mm512_load_si512((const __m512i *)(pb + KB_SCALES + 128 * js + 64));
                for (int t = 0; t < T; t++) {
                    is0[t] = _mm512_add_epi32(is0[t], _mm512_mullo_epi32(ia0[t], sc0));
                    is1[t] = _mm512_add_epi32(is1[t], _mm512_mullo_epi32(ia1[t], sc1));
                }
            }
        const __m512 d0 = _mm512_load_ps((const float *)(pb + KB_D)), d1 = _mm512_load_ps((const float *)(pb + KB_D) + 16);
        for (int t = 0; t < T; t++) {
            __m512i c0 = _mm512_setzero_si512(), c1 = c0;
            for (int i = 0; i < (q6 ? 8 : 4); i++) {
                const __m512i bp = _mm512_set1_epi32(q6 ? (int)load_u32((const uint8_t *)&a[t][b].bsums[2 * i])
                                                        : bsum32_pair(&a[t][b], i));
                c0 = _mm512_dpwssd_epi32(c0, _mm512_load_si512((const __m512i *)(pb + KB_PAIRS + 128 * i)), bp);
                c1 = _mm512_dpwssd_epi32(c1, _mm512_load_si512((const __m512i *)(pb + KB_PAIRS + 128 * i + 64)), bp);
            }
            const __m512 dv = _mm512_set1_ps(a[t][b].d);
            __m512 f0 = _mm512_loadu_ps(acc + 32 * t), f1 = _mm512_loadu_ps(acc + 32 * t + 16);
            if (q6) {
                f0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(is0[t], _mm512_slli_epi32(c0, 5))),
                                     _mm512_mul_ps(d0, dv), f0);
                f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(is1[t], _mm512_slli_epi32(c1, 5))),
                                     _mm512_mul_ps(d1, dv), f1);
            } else {
                const __m512 m0 = _mm512_load_ps((const float *)(pb + KB_DMIN));
                const __m512 m1 = _mm512_load_ps((const float *)(pb + KB_DMIN) + 16);
                f0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is0[t]), _mm512_mul_ps(d0, dv), f0);
                f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is1[t]), _mm512_mul_ps(d1, dv), f1);
                f0 = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(c0), _mm512_mul_ps(m0, dv), f0);
                f1 = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(c1), _mm512_mul_ps(m1, dv), f1);
            }
            _mm512_storeu_ps(acc + 32 * t, f0);
            _mm512_storeu_ps(acc + 32 * t + 16, f1);
        }
    }
}

static void mkk_any(const uint8_t *pp, int64_t nb, const mf_block_q8_K *const *a, int T, bool q6, float *acc) {
    if (q6) {
        switch (T) {
        case 1: mkk(pp, nb, a, 1, true, acc); break;
        case 2: mkk(pp, nb, a, 2, true, acc); break;
        case 3: mkk(pp, nb, a, 3, true, acc); break;
        default: mkk(pp, nb, a, 4, true, acc); break;
        }
    } else {
        switch (T) {
        case 1: mkk(pp, nb, a, 1, false, acc); break;
        case 2: mkk(pp, nb, a, 2, false, acc); break;
        case 3: mkk(pp, nb, a, 3, false, acc); break;
        default: mkk(pp, nb, a, 4, false, acc); break;
        }
    }
}

/* The next tile's weights (g->pf) go to L2 in even shares, one per group of
 * tok tokens, so the pack of that tile reads L2 instead of stalling on DRAM
 * (pp128, 2 threads, interleaved: 1.5B Q4_K_M +4-5 %). next_pf issues the share
 * starting at byte at and returns where the next share starts. */
static size_t next_pf_step(const mf_cpu_gemm_tile *g, int tok) {
    const int64_t n_grp = (g->nt + tok - 1) / tok;
    return g->pf ? ((g->pf_bytes / (size_t)n_grp) + 63) & ~(size_t)63 : 0;
}

static inline size_t next_pf(const mf_cpu_gemm_tile *g, size_t at, size_t step) {
    for (const size_t end = at + step; at < end && at < g->pf_bytes; at += 64)
        _mm_prefetch((const char *)(g->pf + at), _MM_HINT_T1);
    return at;
}

static void gemm_k(const mf_cpu_gemm_tile *g) {
    const int64_t nb = g->n_in / MF_QK_K;
    const bool q6 = g->wtype == MF_TYPE_Q6_K;
    const uint8_t *rowp[PANEL_ROWS];
    for (int r = 0; r < PANEL_ROWS; r++)
        rowp[r] = g->w + (size_t)(r < g->rows ? r : g->rows - 1) * g->w_row;
    const size_t span = (size_t)g->rows * g->w_row;
    for (size_t o = 0; o < span; o += 64)
        _mm_prefetch((const char *)(g->w + o), _MM_HINT_T0);
    uint8_t *pp = (uint8_t *)(((uintptr_t)g->scratch + 63) & ~(uintptr_t)63);
    pack_panel_k(g->wtype, rowp, 0, nb, pp);
    const __mmask16 m0 = g->rows >= 16 ? 0xffff : (__mmask16)((1u << g->rows) - 1);
    const __mmask16 m1 = g->rows >= 32 ? 0xffff : g->rows <= 16 ? 0 : (__mmask16)((1u << (g->rows - 16)) - 1);
    float acc[MKK_TOKENS * PANEL_ROWS];
    const mf_block_q8_K *a[MKK_TOKENS];
    const size_t pf_step = next_pf_step(g, MKK_TOKENS);
    size_t pf_at = 0;
    for (int64_t t0 = 0; t0 < g->nt; t0 += MKK_TOKENS) {
        const int T = (int)(g->nt - t0 < MKK_TOKENS ? g->nt - t0 : MKK_TOKENS);
        pf_at = next_pf(g, pf_at, pf_step);
        memset(acc, 0, sizeof acc);
        for (int t = 0; t < T; t++)
            a[t] = (const mf_block_q8_K *)(g->act + (size_t)(t0 + t) * g->a_row);
        mkk_any(pp, nb, a, T, q6, acc);
        for (int t = 0; t < T; t++) {
            float *y = g->y + (t0 + t) * g->ldy;
            _mm512_mask_storeu_ps(y, m0, _mm512_loadu_ps(acc + 32 * t));
            _mm512_mask_storeu_ps(y + 16, m1, _mm512_loadu_ps(acc + 32 * t + 16));
        }
    }
}

/* ==== the tile ================================================================ */

size_t mf_cpu_gemm_scratch(uint32_t wtype, int64_t n_in) {
    if (wtype == MF_TYPE_Q4_K || wtype == MF_TYPE_Q6_K)
        return (size_t)(n_in / MF_QK_K) * KB_BYTES + 64;
    return (size_t)(n_in / 32) * PB_BYTES + 64;
}

bool mf_cpu_gemm_supported(uint32_t wtype) {
    return wtype == MF_TYPE_Q4_0 || wtype == MF_TYPE_Q5_0 || wtype == MF_TYPE_Q8_0 || wtype == MF_TYPE_Q4_K ||
           wtype == MF_TYPE_Q6_K;
}

void mf_cpu_gemm_avx512(const mf_cpu_gemm_tile *g) {
    if (g->wtype == MF_TYPE_Q4_K || g->wtype == MF_TYPE_Q6_K) {
        gemm_k(g);
        return;
    }
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
    const size_t pf_step = next_pf_step(g, MK_TOKENS);
    size_t pf_at = 0;
    for (int64_t t0 = 0; t0 < g->nt; t0 += MK_TOKENS) {
        const int T = (int)(g->nt - t0 < MK_TOKENS ? g->nt - t0 : MK_TOKENS);
        pf_at = next_pf(g, pf_at, pf_step);
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
