/* slot_copy.cu - the input slots' copy (tune slots=1): one
 * block moves a recorded forward's small inputs (token ids, positions,
 * n_past) from the mapped pinned slots into their device buffers, the first
 * kernel of the forward and so of its CUDA graph. It replaces a host copy
 * call per input (the slowest host calls of a decode step) and the chain of
 * copy-engine operations they made on the GPU. */
#include "backend/cuda/cuda_args.h"
#include "backend/cuda/pdl.cuh"

#define SLOT_THREADS (MF_CU_SLOT_BYTES / 16)

/* Every used 16-byte word of the slots is read at once (one PCIe round
 * trip, not one per write), with loads that skip the caches: the host
 * rewrites the slots between replays of the same graph. */
static __global__ void __launch_bounds__(SLOT_THREADS) slot_copy_kernel(mf_cu_slot_args a) {
    __shared__ uint4 buf[SLOT_THREADS];
    mf_pdl_wait();
    mf_pdl_trigger();
    const unsigned t = threadIdx.x;
    if (16 * t < a.used)
        buf[t] = __ldcv((const uint4 *)a.src + t);
    __syncthreads();
    const uint8_t *b = (const uint8_t *)buf;
    for (int i = 0; i < a.n; i++)
        for (uint32_t j = t; j < a.len[i]; j += SLOT_THREADS)
            ((uint8_t *)a.dst[i])[j] = b[a.off[i] + j];
}

extern "C" cudaError_t mf_cu_slot_copy(const mf_cu_slot_args *a, cudaStream_t s) {
    if (a->n <= 0)
        return cudaSuccess;
    if (a->n > MF_CU_SLOT_N || a->used > MF_CU_SLOT_BYTES || ((uintptr_t)a->src & 15))
        return cudaErrorInvalidValue;
    for (int i = 0; i < a->n; i++)
        if (a->off[i] > a->used || a->len[i] > a->used - a->off[i])
            return cudaErrorInvalidValue;
    return mf_launch(slot_copy_kernel, dim3(1), dim3(SLOT_THREADS), 0, s, a->pdl, *a);
}
