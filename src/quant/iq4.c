/* iq4.c - IQ4_NL and IQ4_XS: reference quantizers and dequantizers.
 *
 * Both store 4-bit indices into the fixed codebook mf_iq4_values. The
 * quantizer for a group of 32 tries a set of candidate scales (the group's
 * largest-magnitude value mapped onto codebook levels near either end),
 * picks for each the nearest level per element, keeps the candidate with the
 * least squared error and finally refits the scale by least squares for the
 * chosen indices. IQ4_XS then stores each sub-block scale as a 6-bit multiple
 * of one f16 super-block scale and picks the indices again for the scale it
 * really stores. */
#include <math.h>
#include <string.h>

#include "base/base.h"
#include "quant/iq4.h"
#include "quant/quant.h"

const int8_t mf_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                  1,    13,   25,  38,  53,  69,  89,  113};

/* Index of the codebook level nearest to v (v in codebook units). */
static int nearest(float v) {
    if (v <= mf_iq4_values[0])
        return 0;
    if (v >= mf_iq4_values[15])
        return 15;
    int lo = 0, hi = 15; /* values[lo] <= v < values[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (v < mf_iq4_values[mid])
            hi = mid;
        else
            lo = mid;
    }
    return v - mf_iq4_values[lo] < mf_iq4_values[hi] - v ? lo : hi;
}

/* Indices for x[0..32) at scale d; returns the squared error. */
static double assign(const float *x, float d, uint8_t *idx) {
    double err = 0;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++) {
        idx[j] = (uint8_t)(d != 0 ? nearest(x[j] * id) : 8);
        double e = (double)x[j] - (double)d * mf_iq4_values[idx[j]];
        err += e * e;
    }
    return err;
}

/* The best scale for a group of 32 (see the file comment); idx gets the
 * indices for it. */
static float group_scale(const float *x, uint8_t *idx) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    if (amax == 0) {
        memset(idx, 8, 32); /* level 1: d = 0 makes every weight 0 */
        return 0;
    }
    float best_d = 0;
    double best = INFINITY;
    uint8_t cand[32];
    /* max onto the negative end (-127 ... -83) or the positive end (113 ... 69) */
    for (int k = 0; k < 12; k++) {
        float level = k < 6 ? (float)mf_iq4_values[0] + 8.0f * (float)k
                            : (float)mf_iq4_values[15] - 8.0f * (float)(k - 6);
        float d = max / level;
        double err = assign(x, d, cand);
        if (err < best) {
            best = err;
            best_d = d;
            memcpy(idx, cand, 32);
        }
    }
    /* least-squares refit for the chosen indices, kept only if it helps */
    double xv = 0, vv = 0;
    for (int j = 0; j < 32; j++) {
        xv += (double)x[j] * mf_iq4_values[idx[j]];
        vv += (double)mf_iq4_values[idx[j]] * mf_iq4_values[idx[j]];
    }
    if (vv > 0) {
        float d = (float)(xv / vv);
        if (assign(x, d, cand) < best) {
            best_d = d;
            memcpy(idx, cand, 32);
        }
    }
    return best_d;
}

static void pack(const uint8_t *idx, uint8_t *qs) {
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)(idx[j] | (idx[j + 16] << 4));
}

void mf_iq4_nl_from_float(const float *x, void *vy, int64_t n) {
    mf_block_iq4_nl *y = vy;
    uint8_t idx[32];
    for (int64_t b = 0; b < n / MF_QK4_NL; b++, x += MF_QK4_NL) {
        float d = group_scale(x, idx);
        y[b].d = mf_fp32_to_fp16(d);
        /* the indices again for the scale as stored (f16) */
        assign(x, mf_fp16_to_fp32(y[b].d), idx);
        pack(idx, y[b].qs);
    }
}

void mf_iq4_nl_to_float(const void *vx, float *y, int64_t n) {
    const mf_block_iq4_nl *x = vx;
    for (int64_t b = 0; b < n / MF_QK4_NL; b++, y += MF_QK4_NL) {
        const float d = mf_fp16_to_fp32(x[b].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)mf_iq4_values[x[b].qs[j] & 0xF];
            y[j + 16] = d * (float)mf_iq4_values[x[b].qs[j] >> 4];
        }
    }
}

int mf_iq4_xs_scale(const mf_block_iq4_xs *x, int ib) {
    int lo = (x->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
    int hi = (x->scales_h >> (2 * ib)) & 3;
    return (lo | (hi << 4)) - 32;
}

void mf_iq4_xs_from_float(const float *x, void *vy, int64_t n) {
    mf_block_iq4_xs *y = vy;
    uint8_t idx[32];
    for (int64_t b = 0; b < n / MF_QK_K; b++, x += MF_QK_K) {
        float sc[8], amax = 0, max = 0;
        for (int ib = 0; ib < 8; ib++) {
            sc[ib] = group_scale(x + 32 * ib, idx);
            if (fabsf(sc[ib]) > amax) {
                amax = fabsf(sc[ib]);
                max = sc[ib];
            }
        }
        /* the largest scale becomes -32 steps of d, so every scale fits [-32, 31] */
        float d = amax > 0 ? max / -32.0f : 0.0f;
        y[b].d = mf_fp32_to_fp16(d);
        d = mf_fp16_to_fp32(y[b].d);
        y[b].scales_h = 0;
        memset(y[b].scales_l, 0, sizeof y[b].scales_l);
        for (int ib = 0; ib < 8; ib++) {
            int l = d != 0 ? (int)lrintf(sc[ib] / d) : 0;
            l = l < -32 ? -32 : l > 31 ? 31 : l;
            const int ls = l + 32;
            y[b].scales_l[ib / 2] |= (uint8_t)((ls & 0xF) << (4 * (ib % 2)));
            y[b].scales_h |= (uint16_t)((ls >> 4) << (2 * ib));
            assign(x + 32 * ib, d * (float)l, idx);
            pack(idx, y[b].qs + 16 * ib);
        }
    }
}

void mf_iq4_xs_to_float(const void *vx, float *y, int64_t n) {
    const mf_block_iq4_xs *x = vx;
    for (int64_t b = 0; b < n / MF_QK_K; b++) {
        const float d = mf_fp16_to_fp32(x[b].d);
        for (int ib = 0; ib < 8; ib++, y += 32) {
            const float dl = d * (float)mf_iq4_xs_scale(&x[b], ib);
            const uint8_t *qs = x[b].qs + 16 * ib;
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)mf_iq4_values[qs[j] & 0xF];
                y[j + 16] = dl * (float)mf_iq4_values[qs[j] >> 4];
            }
        }
    }
}
