/* norm.cu - RMSNorm (and QkNorm, the same kernel on head_dim rows).
 *
 * One block per row. The sum of squares is accumulated in double (an
 * 18944-wide row of large activations loses digits in a float running sum,
 * the CPU does the same) and reduced by warp shuffles then shared memory;
 * each thread rereads and writes only its own elements, so y may equal x. */
#include "backend/cuda/cuda_args.h"

static __global__ void rmsnorm_kernel(const float *x, const float *__restrict__ w, float *y, int64_t n,
                               float eps) {
    __shared__ double part[32];
    const int64_t r = blockIdx.x;
    const float *xr = x + r * n;
    float *yr = y + r * n;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        ss += (double)xr[i] * (double)xr[i];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, off);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
    if (lane == 0)
        part[warp] = ss;
    __syncthreads();
    double tot = 0.0;
    for (int i = 0; i < nw; i++)
        tot += part[i];
    const float sc = (float)(1.0 / sqrt(tot / (double)n + (double)eps));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = w ? xr[i] * sc * w[i] : xr[i] * sc;
}

extern "C" cudaError_t mf_cu_rmsnorm(const mf_cu_norm_args *a, cudaStream_t s) {
    if (a->nrows <= 0)
        return cudaSuccess;
    int threads = a->n >= 1024 ? 256 : a->n >= 256 ? 128 : 32;
    rmsnorm_kernel<<<(unsigned)a->nrows, threads, 0, s>>>(a->x, a->w, a->y, a->n, a->eps);
    return cudaGetLastError();
}

#include "backend/cuda/probe.cuh"

extern "C" cudaError_t mf_cu_probe_norm(size_t smem_limit, const char **bad) {
    MF_PROBE(rmsnorm_kernel, 256);
    return cudaSuccess;
}
