/* kv.cuh - reading one element of a KV cache row (f32, f16 or q8_0), shared
 * by the KV load and attention kernels. A q8_0 row is kv_dim / 32 blocks. */
#ifndef MF_CUDA_KV_CUH
#define MF_CUDA_KV_CUH

#include <cuda_fp16.h>
#include <stdint.h>

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

#endif
