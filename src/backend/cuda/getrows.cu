/* getrows.cu - embedding gather for every weight type: y[t] = dequant(W row
 * ids[t]). One block per token; threads take 32-element units of the row.
 * An id outside the table cannot be refused before launch (it lives on the
 * device), so the kernel writes NaN for that row and records the first such
 * id in the fault word, which synchronize turns into an error. */
#include <math.h>

#include "backend/cuda/cuda_args.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/pdl.cuh"

template <int T>
static __global__ void getrows_kernel(const uint8_t *__restrict__ w, uint64_t row_bytes, int64_t n,
                               int64_t n_rows, const int32_t *__restrict__ ids, float *y,
                               mf_cu_fault *fault, int32_t node) {
    mf_pdl_wait();
    mf_pdl_trigger();
    const int64_t t = blockIdx.x;
    const int64_t id = ids[t];
    float *yr = y + t * n;
    if (id < 0 || id >= n_rows) {
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            yr[i] = NAN;
        if (threadIdx.x == 0 && fault && atomicCAS(&fault->code, 0, -1) == 0) {
            fault->node = node;
            fault->value = id;
            fault->limit = n_rows;
            __threadfence();
            atomicExch(&fault->code, MF_CU_FAULT_TOKEN_ID);
        }
        return; /* no barrier in this kernel: a whole block leaving is safe */
    }
    const uint8_t *row = w + (uint64_t)id * row_bytes;
    const int64_t n_units = (n + 31) / 32;
    for (int64_t u = threadIdx.x; u < n_units; u += blockDim.x) {
        float v[32];
        mf_deq<T>::unit(row, u, n, v);
        const int64_t k0 = 32 * u;
#pragma unroll
        for (int i = 0; i < 32; i++)
            if (k0 + i < n)
                yr[k0 + i] = v[i];
    }
}

extern "C" cudaError_t mf_cu_getrows(const mf_cu_getrows_args *a, cudaStream_t s) {
    if (a->nt <= 0)
        return cudaSuccess;
    const uint8_t *w = (const uint8_t *)a->w;
    switch (a->wtype) {
#define MF_CASE(T)                                                                               \
    case T:                                                                                      \
        return mf_launch(getrows_kernel<T>, dim3((unsigned)a->nt), dim3(128), 0, s, a->pdl, w, a->row_bytes, a->n, \
                         a->n_rows, a->ids, a->y, a->fault, a->node);
        MF_CU_FOR_EACH_WTYPE(MF_CASE)
#undef MF_CASE
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

#include "backend/cuda/probe.cuh"

extern "C" cudaError_t mf_cu_probe_getrows(size_t smem_limit, const char **bad) {
#define MF_CASE(T) MF_PROBE(getrows_kernel<T>, 128);
    MF_CU_FOR_EACH_WTYPE(MF_CASE)
#undef MF_CASE
    return cudaSuccess;
}
