/* gemv_q8.cuh - what the int8 decode GEMV kernels share: the multi-weight
 * launch description, the cross-warp reduction, and the v4 launcher
 * (gemv_q8v4.cu) that gemv_q8.cu dispatches to. */
#ifndef MF_CUDA_GEMV_Q8_CUH
#define MF_CUDA_GEMV_Q8_CUH

#include <stdint.h>

#include <cuda_runtime.h>

#define Q8_WARPS 4

/* Per-launch description of up to 3 weights of one type sharing the input:
 * the rows of all weights form one row space (start[i] = first row of
 * weight i), so Q, K and V (or gate and up) are one launch after one
 * activation quantization. SWIGLU: two weights of n_out rows, and row o
 * computes both dots and writes y[0] = silu(W0 x) * (W1 x). */
typedef struct q8_multi {
    const uint8_t *w[3];
    uint64_t row_bytes[3];
    const float *bias[3];
    const float *res[3]; /* residual added in the epilogue; may equal y */
    float *y[3];
    int64_t n_out[3];
    int64_t start[4];
    int32_t n_w;
} q8_multi;

/* One 32-element unit from one warp, v being this lane's element: q =
 * rint(v / d), d = amax / 127, and the two 16-lane half sums of q packed as
 * int16 pairs. Every lane must call it (the shuffles); only when `store`
 * does the warp write q (xq, 32 bytes), d (*xd) and the sums (*xs). Here
 * rather than in gemv_q8.cu so that a kernel elsewhere quantizing its output
 * as a by-product can be bitwise the separate quantize kernel. */
static __device__ __forceinline__ void q8_unit(float v, int lane, bool store, int8_t *xq, float *xd,
                                               int32_t *xs) {
    float amax = fabsf(v);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = __float2int_rn(v * id);
    int s = q;
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) /* sums within each 16-lane half */
        s += __shfl_xor_sync(0xffffffffu, s, off);
    const int s_hi = __shfl_sync(0xffffffffu, s, 16);
    if (store) {
        xq[lane] = (int8_t)q;
        if (lane == 0) {
            *xd = d;
            *xs = (int32_t)(((uint32_t)s & 0xffffu) | ((uint32_t)s_hi << 16));
        }
    }
}

/* q8_unit's arithmetic over a unit held by 8 lanes x 4 elements (o; the
 * unit's lanes are an aligned group of 8): amax, d = amax / 127, id, q =
 * rint(v id), the two 16-element sums, bitwise q8_unit's. Every lane of the
 * warp must call it (the shuffles); when ok the lane writes its 4 values at
 * element e of xq (e % 4 == 0) and the group's first lane d and the sums at
 * unit e / 32. The attention kernels quantize their output rows with it. */
static __device__ __forceinline__ void q8_unit8x4(float4 o, bool ok, int lane, int64_t e, int8_t *xq, float *xd,
                                                  int32_t *xs) {
    float amax = fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w)));
#pragma unroll
    for (int off = 4; off > 0; off >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off, 8));
    const float dq = amax / 127.0f;
    const float id = dq != 0.0f ? 1.0f / dq : 0.0f;
    const int q0 = __float2int_rn(o.x * id), q1 = __float2int_rn(o.y * id);
    const int q2 = __float2int_rn(o.z * id), q3 = __float2int_rn(o.w * id);
    int sum = q0 + q1 + q2 + q3;
    sum += __shfl_xor_sync(0xffffffffu, sum, 1, 8); /* lanes 0-3: elements 0-15 */
    sum += __shfl_xor_sync(0xffffffffu, sum, 2, 8);
    const int s_hi = __shfl_sync(0xffffffffu, sum, 4, 8);
    if (ok) {
        *(uint32_t *)(xq + e) = ((uint32_t)q0 & 0xffu) | ((uint32_t)q1 & 0xffu) << 8 |
                                ((uint32_t)q2 & 0xffu) << 16 | ((uint32_t)q3 & 0xffu) << 24;
        if ((lane & 7) == 0) {
            xd[e / 32] = dq;
            xs[e / 32] = (int32_t)(((uint32_t)sum & 0xffffu) | ((uint32_t)s_hi << 16));
        }
    }
}

/* Sums acc over the warp's lanes, then over the ks warps of the row through
 * part (which the caller owns; one __syncthreads inside, reached by every
 * thread of the block). The row's first warp ends with the totals in acc. */
template <int NT>
static __device__ __forceinline__ void q8_reduce(float *acc, float (*part)[NT], int lane, int warp,
                                                 int ks) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = acc[t];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, off);
        acc[t] = s;
    }
    if (ks > 1) {
        if (lane == 0)
#pragma unroll
            for (int t = 0; t < NT; t++)
                part[warp][t] = acc[t];
        __syncthreads();
        if (warp % ks == 0)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float s = 0.0f;
                for (int k = 0; k < ks; k++)
                    s += part[warp + k][t];
                acc[t] = s;
            }
    }
}

/* Rows per warp of the v3 and v4 GEMVs: a row pair of the joint row space,
 * or the gate and up rows of one SwiGLU output. */
#define Q8_PAIR_R 2

/* Row r of row pair g: its weight *w and the row within it, or -1 past the
 * end of the row space (total rows; SWIGLU: r picks gate or up). Called
 * again in the epilogue rather than kept live in registers through the
 * loop. */
template <bool SWIGLU>
static __device__ __forceinline__ int64_t q8_pair_row(const q8_multi &p, int64_t g, int r, int64_t total, int *w) {
    const int64_t rr = SWIGLU ? g : g * Q8_PAIR_R + r;
    int k = SWIGLU ? r : 0;
    if (rr >= total) {
        *w = k;
        return -1;
    }
    if (!SWIGLU)
        while (k + 1 < p.n_w && rr >= p.start[k + 1])
            k++;
    *w = k;
    return SWIGLU ? rr : rr - p.start[k];
}

/* The store of row pair g's sums acc[r * NT + t] (row r, token t0 + t,
 * t < ntok): bias, then the residual (x + Wa, the ADD's order) or, SWIGLU,
 * y[0] = silu(gate + b0) * (up + b1). */
/* The store of one output row o (weight w) for tokens t0 .. t0 + ntok - 1
 * from sums acc[t]: bias, then the residual in the ADD's order (x + Wa). */
template <int NT>
static __device__ __forceinline__ void q8_row_store(const q8_multi &p, int w, int64_t o, const float *acc, int64_t t0,
                                                    int ntok) {
    const float b = p.bias[w] ? p.bias[w][o] : 0.0f;
    const float *res = p.res[w];
#pragma unroll
    for (int t = 0; t < NT; t++)
        if (t < ntok) {
            const int64_t i = (t0 + t) * p.n_out[w] + o;
            p.y[w][i] = res ? res[i] + (acc[t] + b) : acc[t] + b;
        }
}

/* SWIGLU's store of output o: y[0] = silu(gate + b0) * (up + b1) from the
 * sums g[t], u[t]. */
template <int NT>
static __device__ __forceinline__ void q8_swiglu_store(const q8_multi &p, int64_t o, const float *g, const float *u,
                                                       int64_t t0, int ntok) {
    const float bg = p.bias[0] ? p.bias[0][o] : 0.0f, bu = p.bias[1] ? p.bias[1][o] : 0.0f;
#pragma unroll
    for (int t = 0; t < NT; t++)
        if (t < ntok) {
            const float gt = g[t] + bg;
            p.y[0][(t0 + t) * p.n_out[0] + o] = gt / (1.0f + expf(-gt)) * (u[t] + bu);
        }
}

template <bool SWIGLU, int NT>
static __device__ __forceinline__ void q8_pair_store(const q8_multi &p, int64_t g, int64_t total, const float *acc,
                                                     int64_t t0, int ntok) {
    if constexpr (SWIGLU) {
        int w;
        const int64_t o = q8_pair_row<SWIGLU>(p, g, 0, total, &w);
        if (o >= 0)
            q8_swiglu_store<NT>(p, o, acc, acc + NT, t0, ntok);
    } else {
#pragma unroll
        for (int r = 0; r < Q8_PAIR_R; r++) {
            int w;
            const int64_t o = q8_pair_row<SWIGLU>(p, g, r, total, &w);
            if (o >= 0)
                q8_row_store<NT>(p, w, o, acc + r * NT, t0, ntok);
        }
    }
}

/* The v4 GEMV (gemv_q8v4.cu) of one token: p's weights (all of type wtype)
 * against the quantized activation (xq, xd, xs of n_in), u weight slices per
 * lane in flight (1 or 2), planned with g's device numbers.
 * cudaErrorNotSupported when wtype or u has no v4 kernel (the caller then
 * takes v3). */
cudaError_t mf_cu_q8v4_launch(const mf_cu_gemv_tune *g, const q8_multi *p, uint32_t wtype, bool swiglu, int u,
                              const int8_t *xq, const float *xd, const int32_t *xs, int64_t n_in, cudaStream_t s);
/* The v4 GEMV of two runs of weights of different types (pa: ta with u
 * slices ua, pb: tb, ub; each run's weights of one type) against the same
 * quantized activation, in one launch (tune qkv_mix): every output
 * row bitwise what mf_cu_q8v4_launch(pa, ta, ua) and (pb, tb, ub) write.
 * mf_cu_q8v4_mix_supported says whether the pair has a kernel (ua == ub ==
 * 1, a type pair of the K-quant mixes, see V4_FOR_EACH_MIX); the launch
 * returns cudaErrorNotSupported otherwise. No SwiGLU. */
int mf_cu_q8v4_mix_supported(const mf_cu_gemv_tune *g, uint32_t ta, int ua, uint32_t tb, int ub);
cudaError_t mf_cu_q8v4_launch_mix(const mf_cu_gemv_tune *g, const q8_multi *pa, uint32_t ta, int ua,
                                  const q8_multi *pb, uint32_t tb, int ub, const int8_t *xq, const float *xd,
                                  const int32_t *xs, int64_t n_in, cudaStream_t s);
/* tune zc: the v4 GEMV of p (one weight of wtype, one token,
 * one slice in flight, no residual) whose epilogue also stores every row
 * into yh, a device alias of mapped pinned host memory (32-byte aligned),
 * in whole 32-byte lines; y bitwise what mf_cu_q8v4_launch(p, wtype, false,
 * 1) writes, and yh the same floats once the launch has completed.
 * cudaErrorNotSupported where mf_cu_q8v4_zc_ok (cuda_args.h) says no. */
cudaError_t mf_cu_q8v4_launch_zc(const mf_cu_gemv_tune *g, const q8_multi *p, uint32_t wtype, const int8_t *xq,
                                 const float *xd, const int32_t *xs, int64_t n_in, float *yh, cudaStream_t s);
/* Fills the v4 part of the occupancy table (mf_cu_gemv_occupancy). */
void mf_cu_q8v4_occupancy(mf_cu_gemv_occ *o);
int mf_cu_q8v4_supported(uint32_t wtype);
/* tune ffn_q8b: the v4 SwiGLU GEMV of p (gate, up of n_out rows, one
 * type wtype) with one slice in flight, a block per 32 consecutive outputs,
 * writing y[0] bitwise as mf_cu_q8v4_launch(p, wtype, true, 1) does and its
 * int8 quantization into q8out (mf_cu_q8_bytes(n_out, 1) layout, bitwise
 * q8_quant_kernel's). cudaErrorNotSupported where mf_cu_q8v4_swq8_ok
 * (cuda_args.h) says no. */
cudaError_t mf_cu_q8v4_swq8_launch(const mf_cu_gemv_tune *g, const q8_multi *p, uint32_t wtype, const int8_t *xq,
                                   const float *xd, const int32_t *xs, int64_t n_in, void *q8out, cudaStream_t s);

#endif
