/* quant.c - type traits and reference (de)quantizers for every weight type.
 *
 * Bit compatibility with the GGUF ecosystem is the contract: a row quantized
 * here is byte-identical to what the ggml reference quantizers (and gguf-py,
 * where it has a quantizer) write, and dequantizing gives identical floats.
 * That pins the arithmetic down to the operation: the same float32 operations
 * in the same order, round-half-away (roundf) where ggml uses roundf, the
 * round-half-even magic-number trick where ggml uses nearest_int, truncating
 * casts where ggml truncates. Fused multiply-add would change results, so
 * contraction is turned off for this file (gcc's ISO C mode, -std=c11, already
 * does). Packing shifts go through unsigned: same low bits as ggml's int
 * shifts, without the undefined behaviour of shifting a negative level. */
#include "quant/quant.h"
#include "quant/iq4.h"

#include <math.h>
#include <string.h>
#include <strings.h>

#include "base/base.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- small helpers -------------------------------------------------------- */

static inline float h2f(uint16_t h) { return mf_fp16_to_fp32(h); }
static inline uint16_t f2h(float f) { return mf_fp32_to_fp16(f); }

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

/* Round to nearest, ties to even, the way ggml's K-quant searches do it:
 * adding 1.5 * 2^23 leaves the rounded integer in the low mantissa bits.
 * Only meaningful for |v| < 2^22; larger inputs give the same (meaningless
 * but deterministic) answer as ggml, which matters for byte equality. */
static inline int nearest_int(float v) {
    float t = v + 12582912.0f;
    uint32_t u;
    memcpy(&u, &t, sizeof u);
    return (int)(u & 0x007fffffu) - 0x00400000;
}

/* Below this magnitude a K-quant group counts as all zeros (ggml's value). */
#define GROUP_MAX_EPS 1e-15f

/* ==== plain types ========================================================= */

static void f32_to_float(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}
static void f32_from_float(const float *src, void *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void f16_to_float(const void *src, float *dst, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = mf_fp16_to_fp32(h[i]);
}
static void f16_from_float(const float *src, void *dst, int64_t n) {
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++)
        h[i] = mf_fp32_to_fp16(src[i]);
}

static void bf16_to_float(const void *src, float *dst, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = mf_bf16_to_fp32(h[i]);
}
static void bf16_from_float(const float *src, void *dst, int64_t n) {
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++)
        h[i] = mf_fp32_to_bf16(src[i]);
}

/* Integer and f64 tensors appear in GGUF files (token type tables, masks);
 * reading them as floats is a plain value conversion. */
#define MF_PLAIN_TO_FLOAT(fname, ctype)                                  \
    static void fname(const void *src, float *dst, int64_t n) {          \
        const uint8_t *p = src;                                          \
        for (int64_t i = 0; i < n; i++) {                                \
            ctype v;                                                     \
            memcpy(&v, p + (size_t)i * sizeof v, sizeof v);              \
            dst[i] = (float)v;                                           \
        }                                                                \
    }
MF_PLAIN_TO_FLOAT(i8_to_float, int8_t)
MF_PLAIN_TO_FLOAT(i16_to_float, int16_t)
MF_PLAIN_TO_FLOAT(i32_to_float, int32_t)
MF_PLAIN_TO_FLOAT(i64_to_float, int64_t)
MF_PLAIN_TO_FLOAT(f64_to_float, double)

/* ==== 32-element block formats ============================================ */

/* Signed value of the element of largest magnitude (the first one on ties),
 * the anchor of the symmetric formats. */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static void q4_0_from_float(const float *x, void *vy, int64_t n) {
    mf_block_q4_0 *y = vy;
    for (int64_t b = 0; b < n / MF_QK4_0; b++, x += MF_QK4_0) {
        /* the extreme value maps to q = 0 exactly: d = max / -8 */
        const float d = signed_absmax(x, MF_QK4_0) / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[b].d = f2h(d);
        for (int j = 0; j < MF_QK4_0 / 2; j++) {
            int lo = imin(15, (int)(x[j] * id + 8.5f));
            int hi = imin(15, (int)(x[j + MF_QK4_0 / 2] * id + 8.5f));
            y[b].qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

static void q4_0_to_float(const void *vx, float *y, int64_t n) {
    const mf_block_q4_0 *x = vx;
    for (int64_t b = 0; b < n / MF_QK4_0; b++, y += MF_QK4_0) {
        const float d = h2f(x[b].d);
        for (int j = 0; j < MF_QK4_0 / 2; j++) {
            y[j] = (float)((x[b].qs[j] & 0x0f) - 8) * d;
            y[j + MF_QK4_0 / 2] = (float)((x[b].qs[j] >> 4) - 8) * d;
        }
    }
}

/* min and max of n floats (ggml starts from +-FLT_MAX; same result). */
static void min_max(const float *x, int n, float *mn, float *mx) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < n; j++) {
        if (x[j] < lo)
            lo = x[j];
        if (x[j] > hi)
            hi = x[j];
    }
    *mn = lo;
    *mx = hi;
}

static void q4_1_from_float(const float *x, void *vy, int64_t n) {
    mf_block_q4_1 *y = vy;
    for (int64_t b = 0; b < n / MF_QK4_1; b++, x += MF_QK4_1) {
        float mn, mx;
        min_max(x, MF_QK4_1, &mn, &mx);
        const float d = (mx - mn) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        y[b].d = f2h(d);
        y[b].m = f2h(mn);
        for (int j = 0; j < MF_QK4_1 / 2; j++) {
            int lo = imin(15, (int)((x[j] - mn) * id + 0.5f));
            int hi = imin(15, (int)((x[j + MF_QK4_1 / 2] - mn) * id + 0.5f));
            y[b].qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

static void q4_1_to_float(const void *vx, float *y, int64_t n) {
    const mf_block_q4_1 *x = vx;
    for (int64_t b = 0; b < n / MF_QK4_1; b++, y += MF_QK4_1) {
        const float d = h2f(x[b].d), m = h2f(x[b].m);
        for (int j = 0; j < MF_QK4_1 / 2; j++) {
            y[j] = (float)(x[b].qs[j] & 0x0f) * d + m;
            y[j + MF_QK4_1 / 2] = (float)(x[b].qs[j] >> 4) * d + m;
        }
    }
}

/* Packs 32 five-bit values: low nibbles into qs (j and j+16 share a byte),
 * fifth bits into the little-endian 32-bit mask qh (bit j = element j). */
static void pack_q5(const int *q, uint8_t qs[16], uint8_t qh[4]) {
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
        h |= (uint32_t)((q[j] >> 4) & 1) << j;
        h |= (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
    }
    for (int k = 0; k < 4; k++)
        qh[k] = (uint8_t)(h >> (8 * k));
}

static int unpack_q5(const uint8_t qs[16], const uint8_t qh[4], int j) {
    uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    int lo = j < 16 ? (qs[j] & 0x0f) : (qs[j - 16] >> 4);
    return lo | (int)(((h >> j) & 1) << 4);
}

static void q5_0_from_float(const float *x, void *vy, int64_t n) {
    mf_block_q5_0 *y = vy;
    int q[MF_QK5_0];
    for (int64_t b = 0; b < n / MF_QK5_0; b++, x += MF_QK5_0) {
        const float d = signed_absmax(x, MF_QK5_0) / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[b].d = f2h(d);
        for (int j = 0; j < MF_QK5_0; j++)
            q[j] = imin(31, (int)(x[j] * id + 16.5f));
        pack_q5(q, y[b].qs, y[b].qh);
    }
}

static void q5_0_to_float(const void *vx, float *y, int64_t n) {
    const mf_block_q5_0 *x = vx;
    for (int64_t b = 0; b < n / MF_QK5_0; b++, y += MF_QK5_0) {
        const float d = h2f(x[b].d);
        for (int j = 0; j < MF_QK5_0; j++)
            y[j] = (float)(unpack_q5(x[b].qs, x[b].qh, j) - 16) * d;
    }
}

static void q5_1_from_float(const float *x, void *vy, int64_t n) {
    mf_block_q5_1 *y = vy;
    int q[MF_QK5_1];
    for (int64_t b = 0; b < n / MF_QK5_1; b++, x += MF_QK5_1) {
        float mn, mx;
        min_max(x, MF_QK5_1, &mn, &mx);
        const float d = (mx - mn) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        y[b].d = f2h(d);
        y[b].m = f2h(mn);
        for (int j = 0; j < MF_QK5_1; j++)
            q[j] = imin(31, (int)((x[j] - mn) * id + 0.5f));
        pack_q5(q, y[b].qs, y[b].qh);
    }
}

static void q5_1_to_float(const void *vx, float *y, int64_t n) {
    const mf_block_q5_1 *x = vx;
    for (int64_t b = 0; b < n / MF_QK5_1; b++, y += MF_QK5_1) {
        const float d = h2f(x[b].d), m = h2f(x[b].m);
        for (int j = 0; j < MF_QK5_1; j++)
            y[j] = (float)unpack_q5(x[b].qs, x[b].qh, j) * d + m;
    }
}

static float absmax(const float *x, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    return amax;
}

_Static_assert(MF_QK8_0 == 32 && MF_QK8_1 == 32, "q8_block assumes 32-element blocks");

/* The 32 int8 levels of one Q8_0 / Q8_1 block: qs = round(x / d) with
 * d = absmax / 127. Returns d unrounded (Q8_1's s is computed from it) and
 * the sum of the levels in *sum. */
static float q8_block(const float *x, int8_t qs[32], int *sum) {
    const float d = absmax(x, 32) / 127;
    const float id = d ? 1.0f / d : 0.0f;
    int s = 0;
    for (int j = 0; j < 32; j++) {
        qs[j] = (int8_t)roundf(x[j] * id);
        s += qs[j];
    }
    *sum = s;
    return d;
}

static void q8_block_to_float(uint16_t d16, const int8_t qs[32], float *y) {
    const float d = h2f(d16);
    for (int j = 0; j < 32; j++)
        y[j] = (float)qs[j] * d;
}

static void q8_0_from_float(const float *x, void *vy, int64_t n) {
    mf_block_q8_0 *y = vy;
    int sum;
    for (int64_t b = 0; b < n / MF_QK8_0; b++, x += MF_QK8_0)
        y[b].d = f2h(q8_block(x, y[b].qs, &sum));
}

static void q8_0_to_float(const void *vx, float *y, int64_t n) {
    const mf_block_q8_0 *x = vx;
    for (int64_t b = 0; b < n / MF_QK8_0; b++, y += MF_QK8_0)
        q8_block_to_float(x[b].d, x[b].qs, y);
}

/* Q8_1 also stores s = d * sum(q) (rounded to f16) for the q4_1/q5_1 dots. */
static void q8_1_from_float(const float *x, void *vy, int64_t n) {
    mf_block_q8_1 *y = vy;
    int sum;
    for (int64_t b = 0; b < n / MF_QK8_1; b++, x += MF_QK8_1) {
        const float d = q8_block(x, y[b].qs, &sum);
        y[b].d = f2h(d);
        y[b].s = f2h((float)sum * d);
    }
}

static void q8_1_to_float(const void *vx, float *y, int64_t n) {
    const mf_block_q8_1 *x = vx;
    for (int64_t b = 0; b < n / MF_QK8_1; b++, y += MF_QK8_1)
        q8_block_to_float(x[b].d, x[b].qs, y);
}

/* ==== K-quant searches ===================================================== */

/* Asymmetric quantization of n values to [0, nmax] with x ~ scale * L - min,
 * minimizing the weighted error (absolute when use_mad, else squared). Starts
 * from the plain min/max fit, then tries nstep+1 scales around it, each refit
 * by weighted least squares for (scale, min). Writes the levels to L (Laux is
 * scratch), the positive offset to *the_min, and returns the scale. This is
 * ggml's make_qkx2_quants, operation for operation. */
static float qkx2_search(int n, int nmax, const float *x, const float *w, uint8_t *L,
                         float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                         int use_mad) {
    float mn = x[0], mx = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < mn)
            mn = x[i];
        if (x[i] > mx)
            mx = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (mn > 0)
        mn = 0;
    if (mx == mn) {
        memset(L, 0, (size_t)n);
        *the_min = -mn;
        return 0.0f;
    }
    float iscale = nmax / (mx - mn);
    float scale = 1 / iscale;
    float best_err = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * (x[i] - mn));
        L[i] = (uint8_t)imax(0, imin(nmax, l));
        float diff = scale * L[i] + mn - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_err += w[i] * diff;
    }
    if (nstep < 1) {
        *the_min = -mn;
        return scale;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (mx - mn);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = imax(0, imin(nmax, nearest_int(iscale * (x[i] - mn))));
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float err = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                err += w[i] * diff;
            }
            if (err < best_err) {
                memcpy(L, Laux, (size_t)n);
                best_err = err;
                scale = this_scale;
                mn = this_min;
            }
        }
    }
    *the_min = -mn;
    return scale;
}

/* Symmetric levels l = clamp(nearest(iscale * x), -nmax, nmax - 1) of n
 * values and their x^2-weighted sums: *sumlx = sum(w x l), *suml2 =
 * sum(w l^2), w = x^2, accumulated in element order. When L is non-NULL it
 * receives l + bias. */
static void sym_levels(int n, int nmax, float iscale, const float *x, int8_t *L, int bias,
                       float *sumlx, float *suml2) {
    float slx = 0, sl2 = 0;
    for (int i = 0; i < n; i++) {
        int l = imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[i])));
        if (L)
            L[i] = (int8_t)(l + bias);
        float w = x[i] * x[i];
        slx += w * x[i] * l;
        sl2 += w * l * l;
    }
    *sumlx = slx;
    *suml2 = sl2;
}

/* Symmetric quantization to [-nmax, nmax-1] for Q3_K (ggml's make_q3_quants
 * with do_rmse): start from scale max/-nmax, then up to 5 passes of
 * coordinate descent on each level under the x^2-weighted least-squares
 * scale. L gets level + nmax; returns the scale. */
static float q3_search(int n, int nmax, const float *x, int8_t *L) {
    const float max = signed_absmax(x, n);
    if (fabsf(max) < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float sumlx, suml2;
    sym_levels(n, nmax, -nmax / max, x, L, 0, &sumlx, &suml2);
    for (int itry = 0; itry < 5; itry++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int nl = imax(-nmax, imin(nmax - 1, nearest_int(x[i] * sl2 / slx)));
                if (nl != L[i]) {
                    slx += w * x[i] * nl;
                    sl2 += w * nl * nl;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)nl;
                        sumlx = slx;
                        suml2 = sl2;
                        changed++;
                    }
                }
            }
        }
        if (!changed)
            break;
    }
    for (int i = 0; i < n; i++)
        L[i] = (int8_t)(L[i] + nmax);
    return sumlx / suml2;
}

/* Symmetric quantization to [-nmax, nmax-1] for Q6_K (ggml's make_qx_quants
 * with rmse_type 1 and no importance weights): the x^2-weighted least-squares
 * scale of the best of 19 trial scales -(nmax + 0.1 k)/max, k in -9..9. L gets
 * level + nmax; returns the scale. */
static float qx_search(int n, int nmax, const float *x, int8_t *L) {
    const float max = signed_absmax(x, n);
    if (fabsf(max) < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float sumlx, suml2;
    sym_levels(n, nmax, -nmax / max, x, L, nmax, &sumlx, &suml2);
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        const float iscale = -(nmax + 0.1f * is) / max;
        sym_levels(n, nmax, iscale, x, NULL, 0, &sumlx, &suml2);
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            sym_levels(n, nmax, iscale, x, L, nmax, &sumlx, &suml2); /* same sums, now with L */
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* ==== K-quant formats ====================================================== */

/* Low two bits of 256 levels into 64 bytes, as Q2_K and Q3_K store them:
 * byte l of each 32-byte run holds elements l, l+32, l+64, l+96. */
static void pack_2bit(const uint8_t L[MF_QK_K], uint8_t qs[MF_QK_K / 4]) {
    for (int j = 0; j < MF_QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

/* Q2_K: 16 groups of 16, each with a 4-bit scale and 4-bit min. */
static void q2_K_from_float(const float *x, void *vy, int64_t n) {
    mf_block_q2_K *y = vy;
    uint8_t L[MF_QK_K], Laux[16];
    float w[16], mins[MF_QK_K / 16], scales[MF_QK_K / 16];
    for (int64_t b = 0; b < n / MF_QK_K; b++, x += MF_QK_K) {
        float max_scale = 0, max_min = 0; /* scales and mins are >= 0 here */
        for (int j = 0; j < MF_QK_K / 16; j++) {
            for (int l = 0; l < 16; l++)
                w[l] = fabsf(x[16 * j + l]);
            scales[j] = qkx2_search(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, 1);
            if (scales[j] > max_scale)
                max_scale = scales[j];
            if (mins[j] > max_min)
                max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = 15.0f / max_scale;
            for (int j = 0; j < MF_QK_K / 16; j++)
                y[b].scales[j] = (uint8_t)nearest_int(iscale * scales[j]);
            y[b].d = f2h(max_scale / 15.0f);
        } else {
            memset(y[b].scales, 0, sizeof y[b].scales);
            y[b].d = f2h(0.0f);
        }
        if (max_min > 0) {
            const float iscale = 15.0f / max_min;
            for (int j = 0; j < MF_QK_K / 16; j++)
                y[b].scales[j] |= (uint8_t)((unsigned)nearest_int(iscale * mins[j]) << 4);
            y[b].dmin = f2h(max_min / 15.0f);
        } else {
            y[b].dmin = f2h(0.0f);
        }
        /* requantize against the rounded scales; a group whose scale rounds
         * to zero keeps the levels of its search */
        for (int j = 0; j < MF_QK_K / 16; j++) {
            const float d = h2f(y[b].d) * (y[b].scales[j] & 0x0f);
            if (!d)
                continue;
            const float dm = h2f(y[b].dmin) * (y[b].scales[j] >> 4);
            for (int l = 0; l < 16; l++) {
                int q = nearest_int((x[16 * j + l] + dm) / d);
                L[16 * j + l] = (uint8_t)imax(0, imin(3, q));
            }
        }
        pack_2bit(L, y[b].qs);
    }
}

static void q2_K_to_float(const void *vx, float *y, int64_t n) {
    const mf_block_q2_K *x = vx;
    for (int64_t b = 0; b < n / MF_QK_K; b++, y += MF_QK_K) {
        const float d = h2f(x[b].d), dmin = h2f(x[b].dmin);
        for (int e = 0; e < MF_QK_K; e++) {
            const uint8_t sc = x[b].scales[e / 16];
            const float dl = d * (float)(sc & 0x0f), ml = dmin * (float)(sc >> 4);
            const int q = (x[b].qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
            y[e] = dl * (float)q - ml;
        }
    }
}

/* 6-bit signed (biased by 32) scale j of a Q3_K block: low 4 bits in bytes
 * 0..7 (two per byte), high 2 bits in bytes 8..11 (four per byte). */
static int q3_K_scale(const uint8_t s[12], int j) {
    int lo = j < 8 ? (s[j] & 0x0f) : (s[j - 8] >> 4);
    int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

static void q3_K_from_float(const float *x, void *vy, int64_t n) {
    mf_block_q3_K *y = vy;
    int8_t L[MF_QK_K];
    float scales[MF_QK_K / 16];
    for (int64_t b = 0; b < n / MF_QK_K; b++, x += MF_QK_K) {
        for (int j = 0; j < MF_QK_K / 16; j++)
            scales[j] = q3_search(16, 4, x + 16 * j, L + 16 * j);
        const float max_scale = signed_absmax(scales, MF_QK_K / 16);
        memset(y[b].scales, 0, sizeof y[b].scales);
        if (max_scale) {
            const float iscale = -32.0f / max_scale;
            for (int j = 0; j < MF_QK_K / 16; j++) {
                int l = imax(-32, imin(31, nearest_int(iscale * scales[j]))) + 32;
                if (j < 8)
                    y[b].scales[j] = (uint8_t)(l & 0x0f);
                else
                    y[b].scales[j - 8] |= (uint8_t)((l & 0x0f) << 4);
                y[b].scales[8 + j % 4] |= (uint8_t)(((unsigned)l >> 4) << (2 * (j / 4)));
            }
            y[b].d = f2h(1 / iscale);
        } else {
            y[b].d = f2h(0.0f);
        }
        for (int j = 0; j < MF_QK_K / 16; j++) {
            const float d = h2f(y[b].d) * (float)q3_K_scale(y[b].scales, j);
            if (!d)
                continue;
            for (int l = 0; l < 16; l++) {
                int q = imax(-4, imin(3, nearest_int(x[16 * j + l] / d)));
                L[16 * j + l] = (int8_t)(q + 4);
            }
        }
        /* third bit of element e: bit e/32 of hmask[e%32]; the low two bits
         * pack like Q2_K */
        memset(y[b].hmask, 0, sizeof y[b].hmask);
        for (int e = 0; e < MF_QK_K; e++) {
            if (L[e] > 3) {
                y[b].hmask[e % 32] |= (uint8_t)(1u << (e / 32));
                L[e] = (int8_t)(L[e] - 4);
            }
        }
        pack_2bit((const uint8_t *)L, y[b].qs); /* levels are 0..3 by now */
    }
}

static void q3_K_to_float(const void *vx, float *y, int64_t n) {
    const mf_block_q3_K *x = vx;
    for (int64_t b = 0; b < n / MF_QK_K; b++, y += MF_QK_K) {
        const float d = h2f(x[b].d);
        for (int e = 0; e < MF_QK_K; e++) {
            const float dl = d * (float)q3_K_scale(x[b].scales, e / 16);
            int q = (x[b].qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
            if (!((x[b].hmask[e % 32] >> (e / 32)) & 1))
                q -= 4;
            y[e] = dl * (float)q;
        }
    }
}

/* 6-bit scale and min of group j (0..7) of a Q4_K/Q5_K block: groups 0..3
 * live in the low 6 bits of bytes 0..3 (scale) and 4..7 (min); groups 4..7
 * take their low 4 bits from bytes 8..11 and their top 2 bits from the spare
 * top bits of bytes 0..7. */
static void k4_scale_min(const uint8_t s[12], int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Shared front half of Q4_K and Q5_K: per group of 32 a weighted qkx2 search
 * (weights rms + |x|), then the 6-bit scales/mins packed into y_scales and the
 * super-block scales; finally every level recomputed against the rounded
 * scales. L receives levels in [0, nmax]. */
static void k4_quantize_levels(const float *x, int nmax, float rmin, int nstep, uint8_t s[12],
                               uint16_t *yd, uint16_t *ydmin, uint8_t L[MF_QK_K]) {
    uint8_t Laux[32];
    float w[32], mins[MF_QK_K / 32], scales[MF_QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < MF_QK_K / 32; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++)
            sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++)
            w[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = qkx2_search(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, 0);
        if (scales[j] > max_scale)
            max_scale = scales[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    for (int j = 0; j < MF_QK_K / 32; j++) {
        int ls = imin(63, nearest_int(inv_scale * scales[j]));
        int lm = imin(63, nearest_int(inv_min * mins[j]));
        if (j < 4) {
            s[j] = (uint8_t)ls;
            s[j + 4] = (uint8_t)lm;
        } else {
            s[j + 4] = (uint8_t)((ls & 0x0f) | ((lm & 0x0f) << 4));
            s[j - 4] |= (uint8_t)(((unsigned)ls >> 4) << 6);
            s[j] |= (uint8_t)(((unsigned)lm >> 4) << 6);
        }
    }
    *yd = f2h(max_scale / 63.0f);
    *ydmin = f2h(max_min / 63.0f);
    for (int j = 0; j < MF_QK_K / 32; j++) {
        int sc, m;
        k4_scale_min(s, j, &sc, &m);
        const float d = h2f(*yd) * (float)sc;
        if (!d)
            continue;
        const float dm = h2f(*ydmin) * (float)m;
        for (int l = 0; l < 32; l++) {
            int q = nearest_int((x[32 * j + l] + dm) / d);
            L[32 * j + l] = (uint8_t)imax(0, imin(nmax, q));
        }
    }
}

/* Low nibbles of 256 levels into 128 bytes, as Q4_K and Q5_K store them: in
 * each 64-element chunk byte l = element l (low) | element l+32 (high). */
static void pack_k4_nibbles(const uint8_t L[MF_QK_K], uint8_t qs[MF_QK_K / 2]) {
    for (int j = 0; j < MF_QK_K; j += 64)
        for (int l = 0; l < 32; l++)
            qs[j / 2 + l] = (uint8_t)((L[j + l] & 0x0f) | ((L[j + l + 32] & 0x0f) << 4));
}

/* Dequantizes one Q4_K (qh NULL) or Q5_K block: level = nibble | fifth bit
 * (bit j of qh[l] for group j), value = d * scale * level - dmin * min. */
static void k4_block_to_float(uint16_t d16, uint16_t dmin16, const uint8_t s[12], const uint8_t *qs,
                              const uint8_t *qh, float *y) {
    const float d = h2f(d16), dmin = h2f(dmin16);
    for (int j = 0; j < MF_QK_K / 32; j++) {
        int sc, m;
        k4_scale_min(s, j, &sc, &m);
        const float d1 = d * (float)sc, m1 = dmin * (float)m;
        const uint8_t *q = qs + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        for (int l = 0; l < 32; l++) {
            int v = (q[l] >> shift) & 0x0f;
            if (qh)
                v |= ((qh[l] >> j) & 1) << 4;
            y[32 * j + l] = d1 * (float)v - m1;
        }
    }
}

static void q4_K_from_float(const float *x, void *vy, int64_t n) {
    mf_block_q4_K *y = vy;
    uint8_t L[MF_QK_K];
    for (int64_t b = 0; b < n / MF_QK_K; b++, x += MF_QK_K) {
        k4_quantize_levels(x, 15, -1.0f, 20, y[b].scales, &y[b].d, &y[b].dmin, L);
        pack_k4_nibbles(L, y[b].qs);
    }
}

static void q4_K_to_float(const void *vx, float *y, int64_t n) {
    const mf_block_q4_K *x = vx;
    for (int64_t b = 0; b < n / MF_QK_K; b++, y += MF_QK_K)
        k4_block_to_float(x[b].d, x[b].dmin, x[b].scales, x[b].qs, NULL, y);
}

static void q5_K_from_float(const float *x, void *vy, int64_t n) {
    mf_block_q5_K *y = vy;
    uint8_t L[MF_QK_K];
    for (int64_t b = 0; b < n / MF_QK_K; b++, x += MF_QK_K) {
        k4_quantize_levels(x, 31, -0.5f, 15, y[b].scales, &y[b].d, &y[b].dmin, L);
        /* low nibbles as Q4_K; fifth bit of element e: bit e/32 of qh[e%32] */
        memset(y[b].qh, 0, sizeof y[b].qh);
        for (int e = 0; e < MF_QK_K; e++)
            if (L[e] > 15)
                y[b].qh[e % 32] |= (uint8_t)(1u << (e / 32));
        pack_k4_nibbles(L, y[b].qs);
    }
}

static void q5_K_to_float(const void *vx, float *y, int64_t n) {
    const mf_block_q5_K *x = vx;
    for (int64_t b = 0; b < n / MF_QK_K; b++, y += MF_QK_K)
        k4_block_to_float(x[b].d, x[b].dmin, x[b].scales, x[b].qs, x[b].qh, y);
}

/* Q6_K: 16 groups of 16 with int8 scales; level e splits into 4 low bits in
 * ql and 2 high bits in qh (see q6_K_level). */
static void q6_K_from_float(const float *x, void *vy, int64_t n) {
    mf_block_q6_K *y = vy;
    int8_t L[MF_QK_K];
    float scales[MF_QK_K / 16];
    for (int64_t b = 0; b < n / MF_QK_K; b++, x += MF_QK_K) {
        for (int j = 0; j < MF_QK_K / 16; j++)
            scales[j] = qx_search(16, 32, x + 16 * j, L + 16 * j);
        const float max_scale = signed_absmax(scales, MF_QK_K / 16);
        if (fabsf(max_scale) < GROUP_MAX_EPS) {
            memset(&y[b], 0, sizeof y[b]);
            y[b].d = f2h(0.0f);
            continue;
        }
        const float iscale = -128.0f / max_scale;
        y[b].d = f2h(1 / iscale);
        for (int j = 0; j < MF_QK_K / 16; j++)
            y[b].scales[j] = (int8_t)imin(127, nearest_int(iscale * scales[j]));
        for (int j = 0; j < MF_QK_K / 16; j++) {
            const float d = h2f(y[b].d) * (float)y[b].scales[j];
            if (!d)
                continue;
            for (int l = 0; l < 16; l++) {
                int q = imax(-32, imin(31, nearest_int(x[16 * j + l] / d)));
                L[16 * j + l] = (int8_t)(q + 32);
            }
        }
        /* per 128 elements: ql[l] = e(l) | e(l+64) << 4, ql[l+32] = e(l+32) |
         * e(l+96) << 4; qh[l] = top bits of e(l), e(l+32), e(l+64), e(l+96) */
        uint8_t *ql = y[b].ql, *qh = y[b].qh;
        for (int j = 0; j < MF_QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                const int a = L[j + l], c = L[j + l + 32], e = L[j + l + 64], f = L[j + l + 96];
                ql[l] = (uint8_t)((a & 0x0f) | ((e & 0x0f) << 4));
                ql[l + 32] = (uint8_t)((c & 0x0f) | ((f & 0x0f) << 4));
                qh[l] = (uint8_t)((a >> 4) | ((c >> 4) << 2) | ((e >> 4) << 4) | ((f >> 4) << 6));
            }
        }
    }
}

/* Level (0..63) of element e of a Q6_K block. */
static int q6_K_level(const mf_block_q6_K *x, int e) {
    const int half = e / 128, r = e % 128, g = r / 32, l = r % 32;
    const int lo = (x->ql[64 * half + l + 32 * (g & 1)] >> (4 * (g >> 1))) & 0x0f;
    const int hi = (x->qh[32 * half + l] >> (2 * g)) & 3;
    return lo | (hi << 4);
}

static void q6_K_to_float(const void *vx, float *y, int64_t n) {
    const mf_block_q6_K *x = vx;
    for (int64_t b = 0; b < n / MF_QK_K; b++, y += MF_QK_K) {
        const float d = h2f(x[b].d);
        for (int e = 0; e < MF_QK_K; e++)
            y[e] = d * (float)x[b].scales[e / 16] * (float)(q6_K_level(&x[b], e) - 32);
    }
}

/* Q8_K: float scale, 256 int8 levels and the 16-element level sums that the
 * K-quant dot products use for the min terms. */
static void q8_K_from_float(const float *x, void *vy, int64_t n) {
    mf_block_q8_K *y = vy;
    for (int64_t b = 0; b < n / MF_QK_K; b++, x += MF_QK_K) {
        const float max = signed_absmax(x, MF_QK_K);
        if (!max) {
            memset(&y[b], 0, sizeof y[b]); /* ggml leaves bsums unset; we zero them */
            continue;
        }
        /* -127 rather than -128 so that every level fits the symmetric
         * int8 range the SIMD dot products assume */
        const float iscale = -127.0f / max;
        for (int j = 0; j < MF_QK_K; j++)
            y[b].qs[j] = (int8_t)imin(127, nearest_int(iscale * x[j]));
        for (int j = 0; j < MF_QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++)
                sum += y[b].qs[16 * j + l];
            y[b].bsums[j] = (int16_t)sum;
        }
        y[b].d = 1 / iscale;
    }
}

static void q8_K_to_float(const void *vx, float *y, int64_t n) {
    const mf_block_q8_K *x = vx;
    for (int64_t b = 0; b < n / MF_QK_K; b++, y += MF_QK_K)
        for (int j = 0; j < MF_QK_K; j++)
            y[j] = x[b].d * (float)x[b].qs[j];
}

/* ==== traits table ========================================================== */

static const mf_type_traits type_traits[MF_TYPE_COUNT] = {
    [MF_TYPE_F32] = {"f32", 1, 4, 0, f32_to_float, f32_from_float},
    [MF_TYPE_F16] = {"f16", 1, 2, 0, f16_to_float, f16_from_float},
    [MF_TYPE_BF16] = {"bf16", 1, 2, 0, bf16_to_float, bf16_from_float},
    [MF_TYPE_Q4_0] = {"q4_0", MF_QK4_0, sizeof(mf_block_q4_0), 1, q4_0_to_float, q4_0_from_float},
    [MF_TYPE_Q4_1] = {"q4_1", MF_QK4_1, sizeof(mf_block_q4_1), 1, q4_1_to_float, q4_1_from_float},
    [MF_TYPE_Q5_0] = {"q5_0", MF_QK5_0, sizeof(mf_block_q5_0), 1, q5_0_to_float, q5_0_from_float},
    [MF_TYPE_Q5_1] = {"q5_1", MF_QK5_1, sizeof(mf_block_q5_1), 1, q5_1_to_float, q5_1_from_float},
    [MF_TYPE_Q8_0] = {"q8_0", MF_QK8_0, sizeof(mf_block_q8_0), 1, q8_0_to_float, q8_0_from_float},
    [MF_TYPE_Q8_1] = {"q8_1", MF_QK8_1, sizeof(mf_block_q8_1), 1, q8_1_to_float, q8_1_from_float},
    [MF_TYPE_Q2_K] = {"q2_K", MF_QK_K, sizeof(mf_block_q2_K), 1, q2_K_to_float, q2_K_from_float},
    [MF_TYPE_Q3_K] = {"q3_K", MF_QK_K, sizeof(mf_block_q3_K), 1, q3_K_to_float, q3_K_from_float},
    [MF_TYPE_Q4_K] = {"q4_K", MF_QK_K, sizeof(mf_block_q4_K), 1, q4_K_to_float, q4_K_from_float},
    [MF_TYPE_Q5_K] = {"q5_K", MF_QK_K, sizeof(mf_block_q5_K), 1, q5_K_to_float, q5_K_from_float},
    [MF_TYPE_Q6_K] = {"q6_K", MF_QK_K, sizeof(mf_block_q6_K), 1, q6_K_to_float, q6_K_from_float},
    [MF_TYPE_Q8_K] = {"q8_K", MF_QK_K, sizeof(mf_block_q8_K), 1, q8_K_to_float, q8_K_from_float},
    [MF_TYPE_IQ4_NL] = {"iq4_nl", MF_QK4_NL, sizeof(mf_block_iq4_nl), 1, mf_iq4_nl_to_float,
                        mf_iq4_nl_from_float},
    [MF_TYPE_IQ4_XS] = {"iq4_xs", MF_QK_K, sizeof(mf_block_iq4_xs), 1, mf_iq4_xs_to_float,
                        mf_iq4_xs_from_float},
    [MF_TYPE_I8] = {"i8", 1, 1, 0, i8_to_float, NULL},
    [MF_TYPE_I16] = {"i16", 1, 2, 0, i16_to_float, NULL},
    [MF_TYPE_I32] = {"i32", 1, 4, 0, i32_to_float, NULL},
    [MF_TYPE_I64] = {"i64", 1, 8, 0, i64_to_float, NULL},
    [MF_TYPE_F64] = {"f64", 1, 8, 0, f64_to_float, NULL},
};

/* ==== public API ============================================================ */

const mf_type_traits *mf_type_get(uint32_t type) {
    if (type >= MF_TYPE_COUNT || !type_traits[type].name)
        return NULL;
    return &type_traits[type];
}

const char *mf_type_name(uint32_t type) {
    const mf_type_traits *t = mf_type_get(type);
    return t ? t->name : "unknown";
}

int mf_type_from_name(const char *name) {
    if (!name)
        return -1;
    for (int i = 0; i < MF_TYPE_COUNT; i++)
        if (type_traits[i].name && strcasecmp(type_traits[i].name, name) == 0)
            return i;
    return -1;
}

size_t mf_type_row_size(uint32_t type, int64_t n) {
    const mf_type_traits *t = mf_type_get(type);
    if (!t || n < 0 || n % t->block_size != 0)
        return 0;
    return (size_t)(n / t->block_size) * t->type_size;
}

int mf_kv_type_ok(uint32_t type) {
    return type == MF_TYPE_F32 || type == MF_TYPE_F16 || type == MF_TYPE_Q8_0 || type == MF_TYPE_Q4_0 ||
           type == MF_TYPE_Q4_1 || type == MF_TYPE_Q5_0 || type == MF_TYPE_Q5_1;
}

int mf_type_is_weight(uint32_t type) {
    switch (type) {
    case MF_TYPE_F32: case MF_TYPE_F16: case MF_TYPE_BF16:
    case MF_TYPE_Q4_0: case MF_TYPE_Q4_1: case MF_TYPE_Q5_0: case MF_TYPE_Q5_1: case MF_TYPE_Q8_0:
    case MF_TYPE_Q2_K: case MF_TYPE_Q3_K: case MF_TYPE_Q4_K: case MF_TYPE_Q5_K: case MF_TYPE_Q6_K:
    case MF_TYPE_IQ4_NL: case MF_TYPE_IQ4_XS:
        return 1;
    default:
        return 0;
    }
}

/* Rows are contiguous: row r of the quantized side starts at r * row_size. The
 * caller guarantees a known type with a converter and whole blocks per row. */
void mf_dequantize_rows(uint32_t type, const void *src, float *dst, int64_t nrows, int64_t n_per_row) {
    const mf_type_traits *t = mf_type_get(type);
    MF_ASSERT(t && t->to_float);
    MF_ASSERT(n_per_row >= 0 && n_per_row % t->block_size == 0);
    const size_t rs = mf_type_row_size(type, n_per_row);
    for (int64_t r = 0; r < nrows; r++)
        t->to_float((const uint8_t *)src + (size_t)r * rs, dst + r * n_per_row, n_per_row);
}

void mf_quantize_rows(uint32_t type, const float *src, void *dst, int64_t nrows, int64_t n_per_row) {
    const mf_type_traits *t = mf_type_get(type);
    MF_ASSERT(t && t->from_float);
    MF_ASSERT(n_per_row >= 0 && n_per_row % t->block_size == 0);
    const size_t rs = mf_type_row_size(type, n_per_row);
    for (int64_t r = 0; r < nrows; r++)
        t->from_float(src + r * n_per_row, (uint8_t *)dst + (size_t)r * rs, n_per_row);
}

/* llama_ftype numbers as GGUF files carry them in general.file_type. */
const char *mf_ftype_name(uint32_t ftype) {
    static const char *const names[] = {
        [0] = "F32",     [1] = "F16",     [2] = "Q4_0",    [3] = "Q4_1",    [7] = "Q8_0",
        [8] = "Q5_0",    [9] = "Q5_1",    [10] = "Q2_K",   [11] = "Q3_K_S", [12] = "Q3_K_M",
        [13] = "Q3_K_L", [14] = "Q4_K_S", [15] = "Q4_K_M", [16] = "Q5_K_S", [17] = "Q5_K_M",
        [18] = "Q6_K",   [25] = "IQ4_NL", [30] = "IQ4_XS", [32] = "BF16",
    };
    return ftype < sizeof names / sizeof names[0] ? names[ftype] : NULL;
}
