/* probe.cuh - helper for the start-up kernel probes (cuda_args.h). */
#ifndef MF_CUDA_PROBE_CUH
#define MF_CUDA_PROBE_CUH

#include <cuda_runtime.h>

static inline cudaError_t mf_probe_one(const void *fn, const char *name, int threads,
                                       size_t smem_limit, const char **bad) {
    cudaFuncAttributes at;
    cudaError_t e = cudaFuncGetAttributes(&at, fn);
    if (e == cudaSuccess && (at.sharedSizeBytes > smem_limit || at.maxThreadsPerBlock < threads))
        e = cudaErrorInvalidConfiguration;
    if (e != cudaSuccess)
        *bad = name;
    return e;
}

#define MF_PROBE(fn, threads)                                                         \
    do {                                                                              \
        cudaError_t e_ = mf_probe_one((const void *)(fn), #fn, (threads), smem_limit, bad); \
        if (e_ != cudaSuccess)                                                        \
            return e_;                                                                \
    } while (0)

#endif
