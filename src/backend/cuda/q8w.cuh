/* q8w.cuh - the int8 GEMVs' weight unit decoders and unit dot product,
 * (gemv_q8.cu's v1 and v3 kernels).
 *
 * q8w<T>::unit decodes 32-element unit u of a row of type T (blocks from
 * `row`; a K-quant unit is sub-block u % 8 of super-block u / 8) into 32
 * small integers q_w packed 4 per word (byte l = element l) and, for each
 * 16-element half h, (d_h, m_h) with w_l = d_h q_w,l + m_h. Weight bytes that
 * are only 2-byte aligned in their block (18-, 22-, 34-, 110-, 210-byte
 * blocks) are read as aligned 32-bit words and realigned with a funnel
 * shift; the extra word stays inside the block or the weight's padding. */
#ifndef MF_CUDA_Q8W_CUH
#define MF_CUDA_Q8W_CUH

#include <stdint.h>

#include "backend/cuda/dequant.cuh"

/* NW words from p, where p is 2-byte aligned (A = 2) or 4-byte aligned. */
template <int A, int NW>
static __device__ __forceinline__ void ld_words(const uint8_t *p, uint32_t *w) {
    if (A >= 4) {
#pragma unroll
        for (int i = 0; i < NW; i++)
            w[i] = ((const uint32_t *)p)[i];
        return;
    }
    const uintptr_t a = (uintptr_t)p;
    const uint32_t *b = (const uint32_t *)(a & ~(uintptr_t)3);
    uint32_t r[NW + 1];
#pragma unroll
    for (int i = 0; i < NW; i++)
        r[i] = b[i];
    if (a & 2) {
        r[NW] = b[NW];
#pragma unroll
        for (int i = 0; i < NW; i++)
            w[i] = __funnelshift_r(r[i], r[i + 1], 16);
    } else {
#pragma unroll
        for (int i = 0; i < NW; i++)
            w[i] = r[i];
    }
}

/* A block of 2 + 4 NWQ bytes or fewer at a 2-byte aligned address blk (Q4_0,
 * Q5_0, Q8_0: a 16-bit d, then the rest): NWQ + 1 aligned words cover it at
 * either alignment, so they are loaded once and every part comes out of
 * registers, the same instructions on every lane (no branch on the
 * alignment, no separate load of d): w[m] = block bytes 2 + 4m .. 5 + 4m,
 * *d16 = bytes 0-1. With sh = 0 or 16 (blk % 4 == 0 or 2), bytes 2 + 4m..
 * are word m shifted right by sh + 16; at 32, __funnelshift_rc gives word
 * m + 1 whole. The words read past the block (at most 2 bytes on either
 * side) lie in the same aligned words as block bytes, so in the allocation. */
template <int NWQ>
static __device__ __forceinline__ void ld_block2(const uint8_t *blk, uint32_t *w, uint32_t *d16) {
    const uintptr_t a = (uintptr_t)blk;
    const uint32_t *b = (const uint32_t *)(a & ~(uintptr_t)3);
    const uint32_t sh = (uint32_t)(a & 2) * 8u;
    uint32_t r[NWQ + 1];
#pragma unroll
    for (int i = 0; i <= NWQ; i++)
        r[i] = b[i];
    *d16 = (r[0] >> sh) & 0xffffu;
#pragma unroll
    for (int m = 0; m < NWQ; m++)
        w[m] = __funnelshift_rc(r[m], r[m + 1], sh + 16u);
}

template <int NW> static __device__ __forceinline__ void ld16(const uint8_t *p, uint32_t *w) {
#pragma unroll
    for (int i = 0; i < NW / 4; i++) {
        const uint4 v = ((const uint4 *)p)[i];
        w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
    }
}

/* bits 4i .. 4i+3 of h, one per byte, at bit position `at` of each byte: one
 * multiply puts copies of the 4 bits at shifts at, at + 7, at + 14 and at +
 * 21 (non-overlapping fields, so no carries), and the mask keeps bit j of
 * the j-th copy, i.e. bit `at` of byte j. Three instructions (extract,
 * multiply, and) where the and/shift/or form took about ten; the same bits. */
static __device__ __forceinline__ uint32_t spread4(uint32_t h, int i, int at) {
    const uint32_t b = (h >> (4 * i)) & 0xfu;
    return (b * (0x00204081u << at)) & (0x01010101u << at);
}

/* The 8 words of weight integers of a unit's 16 nibble bytes w (Q4 / Q5
 * qs): low nibbles (elements 0-15) into q[0..3], high nibbles (16-31) into
 * q[4..7]; with H each byte also gets its fifth bit from h (Q5 qh). h by
 * reference: by value nvcc 13 swapped the operands of an `or` in one
 * decoder (same bits, other PTX). */
template <bool H>
static __device__ __forceinline__ void q8_nibbles(const uint32_t *w, const uint32_t &h, uint32_t *q) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if constexpr (H) {
            q[i] = (w[i] & 0x0f0f0f0fu) | spread4(h, i, 4);
            q[i + 4] = ((w[i] >> 4) & 0x0f0f0f0fu) | spread4(h, i + 4, 4);
        } else {
            q[i] = w[i] & 0x0f0f0f0fu;
            q[i + 4] = (w[i] >> 4) & 0x0f0f0f0fu;
        }
    }
}

template <int T> struct q8w;

template <> struct q8w<MF_TYPE_Q4_0> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        uint32_t w[4], d16; /* 18-byte blocks: d, qs */
        ld_block2<4>(row + (uint64_t)u * sizeof(mf_block_q4_0), w, &d16);
        q8_nibbles<false>(w, 0, q);
        const float d = mf_h2f((uint16_t)d16);
        dm[0] = dm[1] = make_float2(d, -8.0f * d);
    }
};

template <> struct q8w<MF_TYPE_Q4_1> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        const mf_block_q4_1 *b = (const mf_block_q4_1 *)row + u;
        uint32_t w[4];
        ld_words<4, 4>(b->qs, w); /* 20-byte blocks, qs at 4 */
        q8_nibbles<false>(w, 0, q);
        dm[0] = dm[1] = make_float2(mf_h2f(b->d), mf_h2f(b->m));
    }
};

template <> struct q8w<MF_TYPE_Q5_0> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        uint32_t w[5], d16; /* 22-byte blocks: d, qh, qs */
        ld_block2<5>(row + (uint64_t)u * sizeof(mf_block_q5_0), w, &d16);
        q8_nibbles<true>(w + 1, w[0], q);
        const float d = mf_h2f((uint16_t)d16);
        dm[0] = dm[1] = make_float2(d, -16.0f * d);
    }
};

template <> struct q8w<MF_TYPE_Q5_1> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        const mf_block_q5_1 *b = (const mf_block_q5_1 *)row + u;
        uint32_t w[4], h;
        ld_words<4, 4>(b->qs, w); /* 24-byte blocks: qh at 4, qs at 8 */
        ld_words<4, 1>(b->qh, &h);
        q8_nibbles<true>(w, h, q);
        dm[0] = dm[1] = make_float2(mf_h2f(b->d), mf_h2f(b->m));
    }
};

template <> struct q8w<MF_TYPE_Q8_0> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        uint32_t d16; /* 34-byte blocks: d, qs */
        ld_block2<8>(row + (uint64_t)u * sizeof(mf_block_q8_0), q, &d16);
        dm[0] = dm[1] = make_float2(mf_h2f((uint16_t)d16), 0.0f);
    }
};

/* K-quants: unit u is sub-block j = u % 8 of super-block u / 8 (as dequant.cuh) */
template <> struct q8w<MF_TYPE_Q2_K> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        const mf_block_q2_K *b = (const mf_block_q2_K *)row + u / 8;
        const int j = (int)(u % 8);
        uint32_t w[8];
        ld_words<4, 8>(b->qs + 32 * (j / 4), w); /* 84-byte blocks, qs at 16 */
        const int shift = 2 * (j % 4);
#pragma unroll
        for (int i = 0; i < 8; i++)
            q[i] = (w[i] >> shift) & 0x03030303u;
        const float d = mf_h2f(b->d), dmin = mf_h2f(b->dmin);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint8_t sc = b->scales[2 * j + h];
            dm[h] = make_float2(d * (float)(sc & 0x0f), -dmin * (float)(sc >> 4));
        }
    }
};

template <> struct q8w<MF_TYPE_Q3_K> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        const mf_block_q3_K *b = (const mf_block_q3_K *)row + u / 8;
        const int j = (int)(u % 8);
        uint32_t w[8], hm[8];
        ld_words<2, 8>(b->qs + 32 * (j / 4), w); /* 110-byte blocks */
        ld_words<2, 8>(b->hmask, hm);
        const int shift = 2 * (j % 4);
        /* v = low2 - 4 * !hbit  ==  (low2 + 4 * hbit) - 4 */
#pragma unroll
        for (int i = 0; i < 8; i++)
            q[i] = ((w[i] >> shift) & 0x03030303u) | (((hm[i] >> j) & 0x01010101u) << 2);
        const float d = mf_h2f(b->d);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float dl = d * (float)mf_deq<MF_TYPE_Q3_K>::scale(b->scales, 2 * j + h);
            dm[h] = make_float2(dl, -4.0f * dl);
        }
    }
};

template <> struct q8w<MF_TYPE_Q4_K> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        const mf_block_q4_K *b = (const mf_block_q4_K *)row + u / 8;
        const int j = (int)(u % 8);
        uint32_t w[8];
        ld16<8>(b->qs + 32 * (j / 2), w); /* 144-byte blocks, qs at 16 */
        const int shift = 4 * (j % 2);
#pragma unroll
        for (int i = 0; i < 8; i++)
            q[i] = (w[i] >> shift) & 0x0f0f0f0fu;
        int sc, m;
        mf_k4_scale_min(b->scales, j, &sc, &m);
        dm[0] = dm[1] = make_float2(mf_h2f(b->d) * (float)sc, -mf_h2f(b->dmin) * (float)m);
    }
};

template <> struct q8w<MF_TYPE_Q5_K> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        const mf_block_q5_K *b = (const mf_block_q5_K *)row + u / 8;
        const int j = (int)(u % 8);
        uint32_t w[8], hw[8];
        ld16<8>(b->qs + 32 * (j / 2), w); /* 176-byte blocks: qh at 16, qs at 48 */
        ld16<8>(b->qh, hw);
        const int shift = 4 * (j % 2);
#pragma unroll
        for (int i = 0; i < 8; i++)
            q[i] = ((w[i] >> shift) & 0x0f0f0f0fu) | (((hw[i] >> j) & 0x01010101u) << 4);
        int sc, m;
        mf_k4_scale_min(b->scales, j, &sc, &m);
        dm[0] = dm[1] = make_float2(mf_h2f(b->d) * (float)sc, -mf_h2f(b->dmin) * (float)m);
    }
};

template <> struct q8w<MF_TYPE_Q6_K> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        const mf_block_q6_K *b = (const mf_block_q6_K *)row + u / 8;
        const int j = (int)(u % 8);
        const int half = j / 4, g = j % 4;
        uint32_t lw[8], hw[8];
        ld_words<2, 8>(b->ql + 64 * half + 32 * (g & 1), lw); /* 210-byte blocks */
        ld_words<2, 8>(b->qh + 32 * half, hw);
        const int lshift = 4 * (g >> 1), hshift = 2 * g;
#pragma unroll
        for (int i = 0; i < 8; i++)
            q[i] = ((lw[i] >> lshift) & 0x0f0f0f0fu) | (((hw[i] >> hshift) & 0x03030303u) << 4);
        const float d = mf_h2f(b->d);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float dl = d * (float)b->scales[2 * j + h];
            dm[h] = make_float2(dl, -32.0f * dl);
        }
    }
};

/* The integer part of a unit's dot: the half sums s0 (weight integers
 * q[0..3] . activation int8 a, elements 0-15) and s1 (q[4..7] . c,
 * elements 16-31), each one dp4a chain in element order. */
static __device__ __forceinline__ void q8_unit_isum(const uint32_t *q, int4 a, int4 c, int &s0, int &s1) {
    s0 = __dp4a((int)q[0], a.x, 0);
    s0 = __dp4a((int)q[1], a.y, s0);
    s0 = __dp4a((int)q[2], a.z, s0);
    s0 = __dp4a((int)q[3], a.w, s0);
    s1 = __dp4a((int)q[4], c.x, 0);
    s1 = __dp4a((int)q[5], c.y, s1);
    s1 = __dp4a((int)q[6], c.z, s1);
    s1 = __dp4a((int)q[7], c.w, s1);
}

/* One unit's contribution for one token: q (8 words of weight integers) dot
 * the activation's 32 int8 (a: elements 0-15, c: 16-31), scaled per half,
 * plus the offsets times the activation half sums sx0 / sx1. The caller
 * multiplies by the activation unit's scale. */
static __device__ __forceinline__ float q8_unit_dot(const uint32_t *q, int4 a, int4 c, const float2 *m,
                                                    float sx0, float sx1) {
    int s0, s1;
    q8_unit_isum(q, a, c, s0, s1);
    return m[0].x * (float)s0 + m[0].y * sx0 + m[1].x * (float)s1 + m[1].y * sx1;
}

/* One unit's activation for the v4 GEMV's early-load instances (E, see
 * gemv_q8v4.cu): its 32 int8 (a: elements 0-15, c: 16-31), its two
 * 16-element sums (xs, low / high half) and its scale (xd), loaded with the
 * batch's weight bytes, before anything waits. */
struct q8_act {
    int4 a, c;
    int32_t hs;
    float d;
};

static __device__ __forceinline__ void q8_act_fetch(int64_t k, const int8_t *__restrict__ xq,
                                                    const float *__restrict__ xd, const int32_t *__restrict__ xs,
                                                    q8_act &x) {
    const int4 *xp = (const int4 *)(xq + k * 32);
    x.a = xp[0];
    x.c = xp[1];
    x.hs = xs[k];
    x.d = xd[k];
}

#endif
