/* kv.cuh - reading one element of a KV cache row (f32, f16 or q8_0), shared
 * by the KV load and attention kernels, and writing one, shared by the KV
 * store and the fused rope-store kernels (so their rounding cannot drift
 * apart). A q8_0 row is kv_dim / 32 blocks. */
#ifndef MF_CUDA_KV_CUH
#define MF_CUDA_KV_CUH

#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_args.h"
#include "quant/blocks.h"
#include "quant/quant.h"

static __device__ __forceinline__ uint64_t mf_kv_row_bytes(uint32_t kv_type, int64_t kv_dim) {
    return kv_type == MF_TYPE_F32   ? (uint64_t)kv_dim * 4
           : kv_type == MF_TYPE_F16 ? (uint64_t)kv_dim * 2
                                    : (uint64_t)(kv_dim / MF_QK8_0) * sizeof(mf_block_q8_0);
}

/* Element e of a row starting at `row`. */
static __device__ __forceinline__ float mf_kv_get(uint32_t kv_type, const uint8_t *row, int64_t e) {
    if (kv_type == MF_TYPE_F32)
        return ((const float *)row)[e];
    if (kv_type == MF_TYPE_F16)
        return __half2float(((const __half *)row)[e]);
    const mf_block_q8_0 *b = (const mf_block_q8_0 *)row + e / MF_QK8_0;
    return __half2float(__ushort_as_half(b->d)) * (float)b->qs[e % MF_QK8_0];
}

/* The cache row that source row t of a store goes to: row pos0 + t, pos0
 * read from the device when given (CUDA graph replay). */
static __device__ __forceinline__ uint8_t *mf_kv_store_row(const mf_cu_kv_args &a, int64_t t) {
    const int64_t pos0 = a.pos0_dev ? (int64_t)*a.pos0_dev : a.pos0;
    return (uint8_t *)a.cache + (uint64_t)(pos0 + t) * mf_kv_row_bytes(a.kv_type, a.kv_dim);
}

/* Element i of an f32 or f16 row: a copy, or f16 round-to-nearest-even. */
static __device__ __forceinline__ void mf_kv_put(uint32_t kv_type, uint8_t *row, int64_t i, float v) {
    if (kv_type == MF_TYPE_F32)
        ((float *)row)[i] = v;
    else
        ((__half *)row)[i] = __float2half_rn(v);
}

/* q8_0 block b of a row from one warp, x being this lane's element, with
 * the CPU's rounding: d = amax / 127, q = roundf(x / d). Every lane of the
 * warp must call it (the amax is a shuffle); only when `store` does the
 * warp write the block. */
static __device__ __forceinline__ void mf_kv_put_q8_block(uint8_t *row, int64_t b, int lane, float x,
                                                          bool store) {
    float amax = fabsf(x);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (store) {
        mf_block_q8_0 *blk = (mf_block_q8_0 *)row + b;
        blk->qs[lane] = (int8_t)roundf(x * id);
        if (lane == 0)
            blk->d = __half_as_ushort(__float2half_rn(d));
    }
}

#endif
