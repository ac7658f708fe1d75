/* rope.cu - rotary position embedding, NORMAL (adjacent pairs) and NEOX
 * (halves) modes.
 *
 * One block per (token, head). Pair i rotates by pos * freq_scale *
 * theta^(-2i/n_rot) (rope.cuh: the angle in double, as the CPU does, so
 * long contexts keep their phase). y may equal x. */
#include "backend/cuda/cuda_args.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rope.cuh"

static __global__ void rope_kernel(mf_cu_rope_args a) {
    mf_pdl_wait();
    mf_pdl_trigger();
    mf_rope_head(a, blockIdx.x / a.n_head, (int)(blockIdx.x % a.n_head));
}

extern "C" cudaError_t mf_cu_rope(const mf_cu_rope_args *a, cudaStream_t s) {
    const int64_t blocks = a->nt * a->n_head;
    if (blocks <= 0)
        return cudaSuccess;
    return mf_launch(rope_kernel, dim3((unsigned)blocks), dim3(64), 0, s, a->pdl, *a);
}

#include "backend/cuda/probe.cuh"

extern "C" cudaError_t mf_cu_probe_rope(size_t smem_limit, const char **bad) {
    MF_PROBE(rope_kernel, 64);
    return cudaSuccess;
}
