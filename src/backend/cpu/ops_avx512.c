/* ops_avx512.c - AVX-512 versions of the row ops and of attention's inner
 * loops: exp, silu / swiglu, rmsnorm, and one (token, KV head) group of
 * attention over an f32 or f16 cache.
 *
 * Compiled with the AVX-512 flags; reached from ops.c / attn.c only after
 * the cpuid check. These are not bit-equal to the portable versions (a
 * polynomial exp instead of libm's, other summation orders): each is tested
 * against float64 references within a few float ulps. Every result is still
 * computed by one thread in a fixed order, so it does not depend on the
 * thread count. */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/kernels_isa.h"

/* ==== exp ===================================================================== */

/* e^x for 16 floats, max error ~2 ulp over the float range: x = n ln2 + r
 * with |r| <= ln2/2 (ln2 split in two for an exact n ln2_hi), e^r by its
 * degree-7 Taylor polynomial (truncation < 2^-27), then scalef by 2^n, which
 * also gives 0 for very negative x and inf past 88.72. NaN stays NaN. */
static inline __m512 exp512(__m512 x) {
    /* e^-110 is below the smallest denormal and e^89 above FLT_MAX: the clamp
     * keeps n finite; x second, because max/min return it when it is NaN */
    x = _mm512_max_ps(_mm512_set1_ps(-110.0f), x);
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), x);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

static inline __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
}

void mf_cpu_exp_avx512(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, exp512(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

/* ==== silu / swiglu ============================================================ */

static inline __m512 silu512(__m512 g) {
    const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

void mf_cpu_silu_avx512(const float *a, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, silu512(_mm512_maskz_loadu_ps(m, a + i)));
    }
}

void mf_cpu_swiglu_avx512(const float *gate, const float *up, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 s = silu512(_mm512_maskz_loadu_ps(m, gate + i));
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, up + i)));
    }
}

/* ==== rmsnorm ================================================================== */

/* One row: the mean of squares in double (two 8-lane accumulators), then
 * y = (x * r) * w in the scalar version's order. */
void mf_cpu_rmsnorm_row_avx512(const float *x, const float *w, float *y, int64_t n, float eps) {
    __m512d s0 = _mm512_setzero_pd(), s1 = s0;
    for (int64_t i = 0; i < n; i += 16) {
        const __m512 v = _mm512_maskz_loadu_ps(tail_mask(n - i), x + i);
        const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        s0 = _mm512_fmadd_pd(lo, lo, s0);
        s1 = _mm512_fmadd_pd(hi, hi, s1);
    }
    const double ss = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    const __m512 r = _mm512_set1_ps((float)(1.0 / sqrt(ss / (double)n + (double)eps)));
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), r);
        if (w)
            v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

/* ==== attention: one token, one KV head, its group of query heads ============== */

#define AG_MAX 8 /* query heads per register block */

/* 16 lanes of cache row p (f32 or f16) at element e */
static inline __m512 kv_load16(const void *p, bool f16, int64_t e) {
    if (f16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + e)));
    return _mm512_loadu_ps((const float *)p + e);
}

/* The 4 horizontal sums of a0..a3 in the low 4 lanes. */
static inline __m128 hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    const __m512 u = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))),
                                   _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))));
    /* lane group k of u holds the 4 partial sums over elements 4k..4k+3 of each 16 */
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(u), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(u), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* sc[h * ld + r] = scale * q_h . k_r for the nh heads at q (hd floats
 * apart) and rows [r0, r1) of the cache (rows rb bytes apart, this KV head's
 * elements from e0); keys four at a time. */
static void attn_scores(const float *q, int nh, int64_t hd, const uint8_t *kc, size_t rb, bool f16, int64_t e0,
                        int64_t n_kv, float scale, float *sc, int64_t ld) {
    int64_t r = 0;
    for (; r + 4 <= n_kv; r += 4) {
        const uint8_t *k0 = kc + (size_t)r * rb;
        for (int h = 0; h < nh; h++) {
            const float *qh = q + h * hd;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t i = 0; i < hd; i += 16) {
                const __m512 qv = _mm512_loadu_ps(qh + i);
                a0 = _mm512_fmadd_ps(qv, kv_load16(k0, f16, e0 + i), a0);
                a1 = _mm512_fmadd_ps(qv, kv_load16(k0 + rb, f16, e0 + i), a1);
                a2 = _mm512_fmadd_ps(qv, kv_load16(k0 + 2 * rb, f16, e0 + i), a2);
                a3 = _mm512_fmadd_ps(qv, kv_load16(k0 + 3 * rb, f16, e0 + i), a3);
            }
            _mm_storeu_ps(sc + h * ld + r, _mm_mul_ps(hsum4(a0, a1, a2, a3), _mm_set1_ps(scale)));
        }
    }
    for (; r < n_kv; r++) {
        const uint8_t *k0 = kc + (size_t)r * rb;
        for (int h = 0; h < nh; h++) {
            __m512 a0 = _mm512_setzero_ps();
            for (int64_t i = 0; i < hd; i += 16)
                a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + h * hd + i), kv_load16(k0, f16, e0 + i), a0);
            sc[h * ld + r] = _mm512_reduce_add_ps(a0) * scale;
        }
    }
}

/* out_h[c..c+16) = sum_r p_h[r] v_r[c..c+16) for NH heads: a register per head. */
static inline __attribute__((always_inline)) void attn_pv(int NH, const float *p, int64_t ld, const uint8_t *vc,
                                                          size_t rb, bool f16, int64_t e, int64_t n_kv,
                                                          float *out, int64_t hd) {
    __m512 acc[AG_MAX];
    for (int h = 0; h < NH; h++)
        acc[h] = _mm512_setzero_ps();
    for (int64_t r = 0; r < n_kv; r++) {
        const __m512 v = kv_load16(vc + (size_t)r * rb, f16, e);
        for (int h = 0; h < NH; h++)
            acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(p[h * ld + r]), v, acc[h]);
    }
    for (int h = 0; h < NH; h++)
        _mm512_storeu_ps(out + h * hd, acc[h]);
}

/* Attention of one token for the n_q query heads that share one KV head:
 * q and out hold n_q rows of hd floats (hd % 16 == 0), the cache rows are rb
 * bytes apart (f32 or f16) with this KV head at element e0, the token sees
 * rows [0, n_kv). scr holds n_q * ld floats, ld >= n_kv. */
void mf_cpu_attn_group_avx512(const float *q, int n_q, int64_t hd, const void *k, const void *v, bool f16,
                              size_t rb, int64_t e0, int64_t n_kv, float scale, float *out, float *scr,
                              int64_t ld) {
    for (int h0 = 0; h0 < n_q; h0 += AG_MAX) {
        const int nh = n_q - h0 < AG_MAX ? n_q - h0 : AG_MAX;
        attn_scores(q + h0 * hd, nh, hd, k, rb, f16, e0, n_kv, scale, scr, ld);
        float inv[AG_MAX];
        for (int h = 0; h < nh; h++) {
            float *s = scr + h * ld;
            __m512 mx = _mm512_set1_ps(-INFINITY);
            for (int64_t r = 0; r < n_kv; r += 16)
                mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail_mask(n_kv - r), s + r));
            const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
            __m512 sum = _mm512_setzero_ps();
            for (int64_t r = 0; r < n_kv; r += 16) {
                const __mmask16 tm = tail_mask(n_kv - r);
                const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tm, s + r), m));
                _mm512_mask_storeu_ps(s + r, tm, e);
                sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(tm, e));
            }
            inv[h] = 1.0f / _mm512_reduce_add_ps(sum);
        }
        float *o = out + h0 * hd;
        for (int64_t c = 0; c < hd; c += 16) {
            switch (nh) {
            case 1: attn_pv(1, scr, ld, v, rb, f16, e0 + c, n_kv, o + c, hd); break;
            case 2: attn_pv(2, scr, ld, v, rb, f16, e0 + c, n_kv, o + c, hd); break;
            case 3: attn_pv(3, scr, ld, v, rb, f16, e0 + c, n_kv, o + c, hd); break;
            case 4: attn_pv(4, scr, ld, v, rb, f16, e0 + c, n_kv, o + c, hd); break;
            case 5: attn_pv(5, scr, ld, v, rb, f16, e0 + c, n_kv, o + c, hd); break;
            case 6: attn_pv(6, scr, ld, v, rb, f16, e0 + c, n_kv, o + c, hd); break;
            case 7: attn_pv(7, scr, ld, v, rb, f16, e0 + c, n_kv, o + c, hd); break;
            default: attn_pv(8, scr, ld, v, rb, f16, e0 + c, n_kv, o + c, hd); break;
            }
        }
        for (int h = 0; h < nh; h++)
            for (int64_t c = 0; c < hd; c += 16)
                _mm512_storeu_ps(o + h * hd + c, _mm512_mul_ps(_mm512_loadu_ps(o + h * hd + c), _mm512_set1_ps(inv[h])));
    }
}
