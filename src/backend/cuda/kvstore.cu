/* kvstore.cu - KV cache rows: store (f32 copy, f16 round-to-nearest-even,
 * q8_0 with the CPU's rounding: d = amax / 127, q = roundf(x / d)) and load
 * back as f32. Rows are positions: row pos0 + t receives source row t. */
#include <math.h>

#include "backend/cuda/cuda_args.h"
#include "backend/cuda/kv.cuh"
#include "backend/cuda/pdl.cuh"

static __global__ void kv_store_kernel(mf_cu_kv_args a) {
    mf_pdl_wait();
    mf_pdl_trigger();
    const int64_t t = blockIdx.y;
    const float *src = a.src + t * a.kv_dim;
    uint8_t *row = mf_kv_store_row(a, t);
    if (a.kv_type == MF_TYPE_Q8_0) {
        /* one warp per 32-element block; every lane of a warp stays to the
         * shuffles, out-of-range warps compute on block 0 and skip stores */
        const int64_t nb = a.kv_dim / MF_QK8_0;
        const int64_t b = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
        const int lane = threadIdx.x & 31;
        const bool valid = b < nb;
        mf_kv_put_q8_block(row, b, lane, src[(valid ? b : 0) * MF_QK8_0 + lane], valid);
        return;
    }
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.kv_dim)
        return;
    mf_kv_put(a.kv_type, row, i, src[i]);
}

extern "C" cudaError_t mf_cu_kv_store(const mf_cu_kv_args *a, cudaStream_t s) {
    if (a->nt <= 0)
        return cudaSuccess;
    const int64_t per = a->kv_type == MF_TYPE_Q8_0 ? (a->kv_dim / MF_QK8_0) * 32 : a->kv_dim;
    dim3 grid((unsigned)((per + 255) / 256), (unsigned)a->nt);
    return mf_launch(kv_store_kernel, grid, dim3(256), 0, s, a->pdl, *a);
}

static __global__ void kv_load_kernel(mf_cu_kv_args a) {
    mf_pdl_wait();
    mf_pdl_trigger();
    const int64_t r = blockIdx.x; /* rows on x: n_ctx may pass the 65535 limit of y */
    const uint8_t *row = (const uint8_t *)a.cache + (uint64_t)r * mf_kv_row_bytes(a.kv_type, a.kv_dim);
    for (int64_t i = threadIdx.x; i < a.kv_dim; i += blockDim.x)
        a.dst[r * a.kv_dim + i] = mf_kv_get(a.kv_type, row, i);
}

/* Loads rows [0, a->nt) (nt counts rows here). */
extern "C" cudaError_t mf_cu_kv_load(const mf_cu_kv_args *a, cudaStream_t s) {
    if (a->nt <= 0)
        return cudaSuccess;
    return mf_launch(kv_load_kernel, dim3((unsigned)a->nt), dim3(256), 0, s, a->pdl, *a);
}

#include "backend/cuda/probe.cuh"

extern "C" cudaError_t mf_cu_probe_kv(size_t smem_limit, const char **bad) {
    MF_PROBE(kv_store_kernel, 256);
    MF_PROBE(kv_load_kernel, 256);
    return cudaSuccess;
}
