/* ropestore.cu - the attention-input tail of FUSED_QKV as one launch
 * (MINFER_CUDA_FUSE_ROPE): RoPE of Q into the output, RoPE of K in place,
 * and the K and V rows stored into the cache, instead of four launches.
 *
 * Grid (nt, 3): block (t, 0) ropes Q row t, (t, 1) ropes K row t and then
 * stores it (a __syncthreads orders the in-place rotation before the reads
 * of the store: global writes of a block are visible to the block after
 * it), (t, 2) stores V row t. The rotation (angle and sin/cos in double)
 * is rope.cu's and the store is kvstore.cu's (the kv.cuh writers), so the
 * results are bitwise the unfused path's. */
#include <math.h>

#include "backend/cuda/cuda_args.h"
#include "backend/cuda/kv.cuh"

#define RS_THREADS 256

/* Row t of a (all heads), pairs spread over the block's threads. */
static __device__ void rs_rope_row(const mf_cu_rope_args &a, int64_t t) {
    const double p = a.pos ? (double)a.pos[t] : (double)((a.pos0_dev ? (int64_t)*a.pos0_dev : a.pos0) + t);
    const int half = a.n_rot / 2;
    const bool neox = (a.mode & 2) != 0;
    const float *xr = a.x + t * a.n_head * (int64_t)a.head_dim;
    float *yr = a.y + t * a.n_head * (int64_t)a.head_dim;
    for (int k = threadIdx.x; k < a.n_head * half; k += blockDim.x) {
        const int h = k / half, i = k % half;
        const double ang = p * (double)a.freq_scale * pow((double)a.theta, -2.0 * i / (double)a.n_rot);
        double sd, cd;
        sincos(ang, &sd, &cd);
        const float si = (float)sd, co = (float)cd;
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        const float *xv = xr + (int64_t)h * a.head_dim;
        float *yv = yr + (int64_t)h * a.head_dim;
        const float x0 = xv[i0], x1 = xv[i1];
        yv[i0] = x0 * co - x1 * si;
        yv[i1] = x0 * si + x1 * co;
    }
    const int rest = a.head_dim - a.n_rot;
    if (xr != yr && rest > 0)
        for (int k = threadIdx.x; k < a.n_head * rest; k += blockDim.x) {
            const int64_t e = (int64_t)(k / rest) * a.head_dim + a.n_rot + k % rest;
            yr[e] = xr[e];
        }
}

/* Source row t into cache row pos0 + t. */
static __device__ void rs_store_row(const mf_cu_kv_args &a, int64_t t) {
    const float *src = a.src + t * a.kv_dim;
    uint8_t *row = mf_kv_store_row(a, t);
    if (a.kv_type == MF_TYPE_Q8_0) {
        const int64_t nb = a.kv_dim / MF_QK8_0;
        const int lane = threadIdx.x & 31;
        /* whole warps per block of 32: the shuffles need every lane */
        for (int64_t b = threadIdx.x >> 5; b < nb; b += blockDim.x / 32)
            mf_kv_put_q8_block(row, b, lane, src[b * MF_QK8_0 + lane], true);
        return;
    }
    for (int64_t i = threadIdx.x; i < a.kv_dim; i += blockDim.x)
        mf_kv_put(a.kv_type, row, i, src[i]);
}

static __global__ void __launch_bounds__(RS_THREADS) rope_store_kernel(mf_cu_rope_store_args a) {
    const int64_t t = blockIdx.x;
    if (blockIdx.y == 0) {
        rs_rope_row(a.rq, t);
    } else if (blockIdx.y == 1) {
        rs_rope_row(a.rk, t);
        __syncthreads();
        rs_store_row(a.ks, t);
    } else {
        rs_store_row(a.vs, t);
    }
}

extern "C" cudaError_t mf_cu_rope_store(const mf_cu_rope_store_args *a, cudaStream_t s) {
    const int64_t nt = a->rq.nt;
    if (nt <= 0)
        return cudaSuccess;
    if (a->rk.nt != nt || a->ks.nt != nt || a->vs.nt != nt || a->rk.x != a->rk.y || a->ks.src != a->rk.y ||
        nt > 65535 * 1024LL)
        return cudaErrorInvalidValue;
    rope_store_kernel<<<dim3((unsigned)nt, 3), RS_THREADS, 0, s>>>(*a);
    return cudaGetLastError();
}

#include "backend/cuda/probe.cuh"

extern "C" cudaError_t mf_cu_probe_rope_store(size_t smem_limit, const char **bad) {
    MF_PROBE(rope_store_kernel, RS_THREADS);
    return cudaSuccess;
}
