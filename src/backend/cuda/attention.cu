/* attention.cu - causal GQA attention over the KV cache, online softmax.
 *
 * One block of MF_ATTN_WARPS warps per (token, query head). Warp w walks the
 * cache rows r = w, w + W, ... of [0, n_past + t]: the lanes split the head
 * dims (lane, lane + 32, ...), the score is a shuffle reduction, and each
 * warp keeps its own running max m, normalizer l and output accumulator
 * (rescaled when m grows). The warps' partial states are merged through
 * shared memory at the end. q is staged in shared memory before any write,
 * so out may equal q. Every thread reaches the one barrier. */
#include <math.h>

#include "backend/cuda/cuda_args.h"
#include "backend/cuda/kv.cuh"

#define MF_ATTN_WARPS 4
#define MF_ATTN_PER_LANE (MF_CU_ATTN_MAX_HEAD_DIM / 32)

static __global__ void __launch_bounds__(32 * MF_ATTN_WARPS) attn_kernel(mf_cu_attn_args a) {
    __shared__ float qs[MF_CU_ATTN_MAX_HEAD_DIM];
    __shared__ float sacc[MF_ATTN_WARPS][MF_CU_ATTN_MAX_HEAD_DIM];
    __shared__ float sm[MF_ATTN_WARPS], sl[MF_ATTN_WARPS];

    const int64_t t = blockIdx.x / a.n_head;
    const int h = (int)(blockIdx.x % a.n_head);
    const int hd = a.head_dim;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t kv_dim = (int64_t)a.n_head_kv * hd;
    const int64_t e0 = (int64_t)(h / (a.n_head / a.n_head_kv)) * hd;
    const uint64_t rb = mf_kv_row_bytes(a.kv_type, kv_dim);
    const int64_t n_kv = (a.n_past_dev ? (int64_t)*a.n_past_dev : a.n_past) + t + 1;

    const float *q = a.q + (t * a.n_head + h) * (int64_t)hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x)
        qs[d] = q[d];
    __syncthreads();

    float qv[MF_ATTN_PER_LANE], acc[MF_ATTN_PER_LANE];
#pragma unroll
    for (int i = 0; i < MF_ATTN_PER_LANE; i++) {
        const int d = lane + 32 * i;
        qv[i] = d < hd ? qs[d] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const uint8_t *kb = (const uint8_t *)a.k, *vb = (const uint8_t *)a.v;
    for (int64_t r = warp; r < n_kv; r += MF_ATTN_WARPS) {
        const uint8_t *krow = kb + (uint64_t)r * rb;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < MF_ATTN_PER_LANE; i++) {
            const int d = lane + 32 * i;
            if (d < hd)
                s += qv[i] * mf_kv_get(a.kv_type, krow, e0 + d);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, off);
        s *= a.scale;
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn); /* 0 on the first row (m = -inf) */
        const float p = expf(s - mn);
        l = l * corr + p;
        const uint8_t *vrow = vb + (uint64_t)r * rb;
#pragma unroll
        for (int i = 0; i < MF_ATTN_PER_LANE; i++) {
            const int d = lane + 32 * i;
            const float v = d < hd ? mf_kv_get(a.kv_type, vrow, e0 + d) : 0.0f;
            acc[i] = acc[i] * corr + p * v;
        }
        m = mn;
    }
#pragma unroll
    for (int i = 0; i < MF_ATTN_PER_LANE; i++) {
        const int d = lane + 32 * i;
        if (d < hd)
            sacc[warp][d] = acc[i];
    }
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < MF_ATTN_WARPS; w++)
        M = fmaxf(M, sm[w]);
    float L = 0.0f, f[MF_ATTN_WARPS];
#pragma unroll
    for (int w = 0; w < MF_ATTN_WARPS; w++) {
        f[w] = sl[w] > 0.0f ? expf(sm[w] - M) : 0.0f; /* a warp with no rows adds nothing */
        L += sl[w] * f[w];
    }
    const float inv = 1.0f / L;
    float *o = a.out + (t * a.n_head + h) * (int64_t)hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < MF_ATTN_WARPS; w++)
            s += f[w] > 0.0f ? sacc[w][d] * f[w] : 0.0f;
        o[d] = s * inv;
    }
}

extern "C" cudaError_t mf_cu_attn(const mf_cu_attn_args *a, cudaStream_t s) {
    const int64_t blocks = a->nt * a->n_head;
    if (blocks <= 0)
        return cudaSuccess;
    attn_kernel<<<(unsigned)blocks, 32 * MF_ATTN_WARPS, 0, s>>>(*a);
    return cudaGetLastError();
}

#include "backend/cuda/probe.cuh"

extern "C" cudaError_t mf_cu_probe_attn(size_t smem_limit, const char **bad) {
    MF_PROBE(attn_kernel, 32 * MF_ATTN_WARPS);
    return cudaSuccess;
}
