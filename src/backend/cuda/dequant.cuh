/* dequant.cuh - on-device dequantization of GGUF weight rows, one type per
 * specialization of mf_deq<TYPE>.
 *
 * Every type is read in "units" of 32 consecutive elements of a row: a unit
 * is a whole block of the 32-element formats (Q4_0 .. Q8_0), an eighth of a
 * 256-element super-block of the K-quants (Q2_K .. Q6_K), and 32 plain
 * values of F32/F16/BF16. unit(row, u, n, out) writes elements
 * [32u, 32u + 32) of the row to out[0..31]; n (the row length) only matters
 * to the float types, whose rows need not be a multiple of 32 (elements past
 * n read as 0). The arithmetic is quant.c's to_float, so the GPU sees the
 * very floats the float64 host reference sees. Layouts come from blocks.h. */
#ifndef MF_CUDA_DEQUANT_CUH
#define MF_CUDA_DEQUANT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "quant/blocks.h"
#include "quant/quant.h"

static __device__ __forceinline__ float mf_h2f(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}

/* 8 floats rounded to f16, packed for one 16-byte store (the tensor-core
 * tiers' operand layout: element 2i in the low half of word i). */
static __device__ __forceinline__ uint4 mf_f16x8(const float *f) {
    union { uint4 v; half2 h[4]; } c;
#pragma unroll
    for (int i = 0; i < 4; i++)
        c.h[i] = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
    return c.v;
}

/* Loads NW 32-bit words of quant bytes from p with the widest accesses the
 * format's alignment A (16, 4 or 2 bytes: known per block layout, given that
 * weight rows start 256-byte aligned and row_bytes keeps block boundaries)
 * allows: one or two 16-byte loads instead of 32 byte loads per unit. Byte l
 * is then MF_QB(w, l). */
template <int A, int NW>
static __device__ __forceinline__ void mf_ldw(const uint8_t *p, uint32_t *w) {
    if (A == 16) {
#pragma unroll
        for (int i = 0; i < NW / 4; i++) {
            const uint4 v = ((const uint4 *)p)[i];
            w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
        }
    } else if (A == 4) {
#pragma unroll
        for (int i = 0; i < NW; i++)
            w[i] = ((const uint32_t *)p)[i];
    } else {
        const uint16_t *h = (const uint16_t *)p;
#pragma unroll
        for (int i = 0; i < NW; i++)
            w[i] = (uint32_t)h[2 * i] | (uint32_t)h[2 * i + 1] << 16;
    }
}
#define MF_QB(w, l) (((w)[(l) >> 2] >> (8 * ((l) & 3))) & 0xffu)

template <int T> struct mf_deq;

template <> struct mf_deq<MF_TYPE_F32> {
    static constexpr bool is_float = true;
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t n, float *o) {
        const float *r = (const float *)row + 32 * u;
        const int64_t lim = n - 32 * u;
        if (lim >= 32) {
            const float4 *r4 = (const float4 *)r; /* rows of F32 weights are 16-byte aligned when n % 4 == 0 */
            if ((((uintptr_t)r) & 15) == 0) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    float4 v = r4[i];
                    o[4 * i] = v.x; o[4 * i + 1] = v.y; o[4 * i + 2] = v.z; o[4 * i + 3] = v.w;
                }
                return;
            }
        }
#pragma unroll
        for (int i = 0; i < 32; i++)
            o[i] = i < lim ? r[i] : 0.0f;
    }
};

template <> struct mf_deq<MF_TYPE_F16> {
    static constexpr bool is_float = true;
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t n, float *o) {
        const uint16_t *r = (const uint16_t *)row + 32 * u;
        const int64_t lim = n - 32 * u;
#pragma unroll
        for (int i = 0; i < 32; i++)
            o[i] = i < lim ? mf_h2f(r[i]) : 0.0f;
    }
};

template <> struct mf_deq<MF_TYPE_BF16> {
    static constexpr bool is_float = true;
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t n, float *o) {
        const uint16_t *r = (const uint16_t *)row + 32 * u;
        const int64_t lim = n - 32 * u;
#pragma unroll
        for (int i = 0; i < 32; i++)
            o[i] = i < lim ? __uint_as_float((uint32_t)r[i] << 16) : 0.0f;
    }
};

template <> struct mf_deq<MF_TYPE_Q4_0> {
    static constexpr bool is_float = false;
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t n, float *o) {
        const mf_block_q4_0 *b = (const mf_block_q4_0 *)row + u;
        const float d = mf_h2f(b->d);
        uint32_t qw[4];
        mf_ldw<2, 4>(b->qs, qw); /* 18-byte blocks: 2-byte alignment */
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int q = (int)MF_QB(qw, j);
            o[j] = (float)((q & 0x0f) - 8) * d;
            o[j + 16] = (float)((q >> 4) - 8) * d;
        }
    }
};

template <> struct mf_deq<MF_TYPE_Q4_1> {
    static constexpr bool is_float = false;
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t n, float *o) {
        const mf_block_q4_1 *b = (const mf_block_q4_1 *)row + u;
        const float d = mf_h2f(b->d), m = mf_h2f(b->m);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int q = b->qs[j];
            o[j] = (float)(q & 0x0f) * d + m;
            o[j + 16] = (float)(q >> 4) * d + m;
        }
    }
};

static __device__ __forceinline__ uint32_t mf_qh32(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

template <> struct mf_deq<MF_TYPE_Q5_0> {
    static constexpr bool is_float = false;
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t n, float *o) {
        const mf_block_q5_0 *b = (const mf_block_q5_0 *)row + u;
        const float d = mf_h2f(b->d);
        const uint32_t h = mf_qh32(b->qh);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int q = b->qs[j];
            o[j] = (float)(((q & 0x0f) | (int)((h >> j) & 1) << 4) - 16) * d;
            o[j + 16] = (float)(((q >> 4) | (int)((h >> (j + 16)) & 1) << 4) - 16) * d;
        }
    }
};

template <> struct mf_deq<MF_TYPE_Q5_1> {
    static constexpr bool is_float = false;
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t n, float *o) {
        const mf_block_q5_1 *b = (const mf_block_q5_1 *)row + u;
        const float d = mf_h2f(b->d), m = mf_h2f(b->m);
        const uint32_t h = mf_qh32(b->qh);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int q = b->qs[j];
            o[j] = (float)((q & 0x0f) | (int)((h >> j) & 1) << 4) * d + m;
            o[j + 16] = (float)((q >> 4) | (int)((h >> (j + 16)) & 1) << 4) * d + m;
        }
    }
};

template <> struct mf_deq<MF_TYPE_Q8_0> {
    static constexpr bool is_float = false;
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t n, float *o) {
        const mf_block_q8_0 *b = (const mf_block_q8_0 *)row + u;
        const float d = mf_h2f(b->d);
        uint32_t qw[8];
        mf_ldw<2, 8>((const uint8_t *)b->qs, qw); /* 34-byte blocks: 2-byte alignment */
#pragma unroll
        for (int j = 0; j < 32; j++)
            o[j] = (float)(int8_t)MF_QB(qw, j) * d;
    }
};

/* K-quants: unit u is sub-block j = u % 8 of super-block u / 8; element l of
 * the unit is element e = 32 j + l of the super-block. */
template <> struct mf_deq<MF_TYPE_Q2_K> {
    static constexpr bool is_float = false;
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t n, float *o) {
        const mf_block_q2_K *b = (const mf_block_q2_K *)row + u / 8;
        const int j = (int)(u % 8);
        const float d = mf_h2f(b->d), dmin = mf_h2f(b->dmin);
        const uint8_t *q = b->qs + 32 * (j / 4);
        const int shift = 2 * (j % 4);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint8_t sc = b->scales[2 * j + h];
            const float dl = d * (float)(sc & 0x0f), ml = dmin * (float)(sc >> 4);
#pragma unroll
            for (int l = 16 * h; l < 16 * h + 16; l++)
                o[l] = dl * (float)((q[l] >> shift) & 3) - ml;
        }
    }
};

template <> struct mf_deq<MF_TYPE_Q3_K> {
    static constexpr bool is_float = false;
    static __device__ __forceinline__ int scale(const uint8_t *s, int j) {
        const int lo = j < 8 ? (s[j] & 0x0f) : (s[j - 8] >> 4);
        const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        return (lo | (hi << 4)) - 32;
    }
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t n, float *o) {
        const mf_block_q3_K *b = (const mf_block_q3_K *)row + u / 8;
        const int j = (int)(u % 8);
        const float d = mf_h2f(b->d);
        const uint8_t *q = b->qs + 32 * (j / 4);
        const int shift = 2 * (j % 4);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float dl = d * (float)scale(b->scales, 2 * j + h);
#pragma unroll
            for (int l = 16 * h; l < 16 * h + 16; l++) {
                int v = (q[l] >> shift) & 3;
                if (!((b->hmask[l] >> j) & 1))
                    v -= 4;
                o[l] = dl * (float)v;
            }
        }
    }
};

static __device__ __forceinline__ void mf_k4_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

template <> struct mf_deq<MF_TYPE_Q4_K> {
    static constexpr bool is_float = false;
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t n, float *o) {
        const mf_block_q4_K *b = (const mf_block_q4_K *)row + u / 8;
        const int j = (int)(u % 8);
        int sc, m;
        mf_k4_scale_min(b->scales, j, &sc, &m);
        const float d1 = mf_h2f(b->d) * (float)sc, m1 = mf_h2f(b->dmin) * (float)m;
        uint32_t qw[8];
        mf_ldw<16, 8>(b->qs + 32 * (j / 2), qw); /* 144-byte blocks, qs at 16 */
        const int shift = 4 * (j % 2);
#pragma unroll
        for (int l = 0; l < 32; l++)
            o[l] = d1 * (float)((MF_QB(qw, l) >> shift) & 0x0f) - m1;
    }
};

template <> struct mf_deq<MF_TYPE_Q5_K> {
    static constexpr bool is_float = false;
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t n, float *o) {
        const mf_block_q5_K *b = (const mf_block_q5_K *)row + u / 8;
        const int j = (int)(u % 8);
        int sc, m;
        mf_k4_scale_min(b->scales, j, &sc, &m);
        const float d1 = mf_h2f(b->d) * (float)sc, m1 = mf_h2f(b->dmin) * (float)m;
        const uint8_t *q = b->qs + 32 * (j / 2);
        const int shift = 4 * (j % 2);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int v = ((q[l] >> shift) & 0x0f) | (((b->qh[l] >> j) & 1) << 4);
            o[l] = d1 * (float)v - m1;
        }
    }
};

template <> struct mf_deq<MF_TYPE_Q6_K> {
    static constexpr bool is_float = false;
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t n, float *o) {
        const mf_block_q6_K *b = (const mf_block_q6_K *)row + u / 8;
        const int j = (int)(u % 8);
        const int half = j / 4, g = j % 4;
        const float d = mf_h2f(b->d);
        uint32_t lw[8], hw[8]; /* 210-byte blocks: 2-byte alignment */
        mf_ldw<2, 8>(b->ql + 64 * half + 32 * (g & 1), lw);
        mf_ldw<2, 8>(b->qh + 32 * half, hw);
        const int lshift = 4 * (g >> 1), hshift = 2 * g;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float dl = d * (float)b->scales[2 * j + h];
#pragma unroll
            for (int l = 16 * h; l < 16 * h + 16; l++) {
                const int v = (int)((MF_QB(lw, l) >> lshift) & 0x0f) | (int)(((MF_QB(hw, l) >> hshift) & 3) << 4);
                o[l] = dl * (float)(v - 32);
            }
        }
    }
};

/* Calls F<T>::run(args...) for the runtime type id t; returns false when t has
 * no specialization (the caller reports it). Keeps the per-type switch in one
 * place for every kernel family that dequantizes. */
#define MF_CU_FOR_EACH_WTYPE(X) \
    X(MF_TYPE_F32) X(MF_TYPE_F16) X(MF_TYPE_BF16) X(MF_TYPE_Q4_0) X(MF_TYPE_Q4_1) \
    X(MF_TYPE_Q5_0) X(MF_TYPE_Q5_1) X(MF_TYPE_Q8_0) X(MF_TYPE_Q2_K) X(MF_TYPE_Q3_K) \
    X(MF_TYPE_Q4_K) X(MF_TYPE_Q5_K) X(MF_TYPE_Q6_K)

#endif
