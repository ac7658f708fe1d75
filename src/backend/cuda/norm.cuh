/* norm.cuh - the RMS scale of a row, shared by the RMSNorm kernels (norm.cu)
 * and the RMSNorm + int8 quantize kernels (gemv_q8.cu), so every kernel that
 * norms a row computes bitwise the same scale from the same partial sums. */
#ifndef MF_CUDA_NORM_CUH
#define MF_CUDA_NORM_CUH

#include <stdint.h>

/* 1 / sqrt(sum(x^2) / n + eps) from each thread's partial double sum ss:
 * warp shuffles, then the block's nw warps through part (one barrier, which
 * every thread of the block must reach). Double, as the CPU: an 18944-wide
 * row of large activations loses digits in a float running sum. */
static __device__ __forceinline__ float mf_rms_scale(double ss, double *part, int nw, int64_t n, float eps) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = ss;
    __syncthreads();
    double tot = 0.0;
    for (int i = 0; i < nw; i++)
        tot += part[i];
    return (float)(1.0 / sqrt(tot / (double)n + (double)eps));
}

#endif
