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

/* QkNorm's scale 1 / sqrt(sum(x^2) / hd + eps) of one head row, computed by
 * one warp from each lane's partial double sum ss (lane l: elements l,
 * l + 32, ... in increasing order): the shuffle tree, then lane 0's total
 * for every lane (the one-warp rmsnorm's part[0], no barrier). ropestore.cu's
 * per-head norms and attn_short.cu's fused prologue all end here, so the
 * q / k they produce are bitwise equal. Every lane of the warp must call it.
 * eps by reference: read where it is used, after the shuffles, as the
 * kernels read their kernel-argument eps before this was shared (by value
 * the load moves ahead of the shuffles and their PTX changes). */
static __device__ __forceinline__ float mf_head_rms_scale(double ss, int hd, const float &eps) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    double tot = 0.0;
    tot += __shfl_sync(0xffffffffu, ss, 0);
    return (float)(1.0 / sqrt(tot / (double)hd + (double)eps));
}

/* mf_head_rms_scale from the lane's elements held in registers, xs[j] =
 * x[lane + 32 j] (0 past the row: adds +0). */
template <int NJ>
static __device__ __forceinline__ float mf_head_rms_scale_lanes(const float (&xs)[NJ], int hd, const float &eps) {
    double ss = 0.0;
#pragma unroll
    for (int j = 0; j < NJ; j++)
        ss += (double)xs[j] * (double)xs[j];
    return mf_head_rms_scale(ss, hd, eps);
}

/* Elements a thread keeps in registers in the row kernels' first pass:
 * 16 x 256 threads covers a 4096-wide row (3584 for the 7B) in one pass. */
#define MF_LAT_E 16

/* The row kernels' first pass: this thread's partial sum of squares of
 * xr[tid + k * nthr], k = 0, 1, ... in increasing k -- the order of the
 * strided loops `for (i = tid; i < n; i += nthr) ss += x_i * x_i` -- so the
 * result is bitwise theirs (a lane past n adds (+0) * (+0), which leaves a
 * non-negative sum unchanged). The loads are issued E at a time, all before
 * the first add: the strided loop is a chain of dependent round trips (one
 * per element), this is one per E elements. v[k] keeps element
 * tid + k * nthr for k < E (0 past n), for a second pass from registers. */
template <int E>
static __device__ __forceinline__ double mf_row_ss(const float *xr, int64_t n, int tid, int nthr, float (&v)[E]) {
    double ss = 0.0;
    const float *p = xr + tid;
    const int64_t left = n - tid; /* element tid + j of the row exists when j < left */
#pragma unroll
    for (int k = 0; k < E; k++)
        v[k] = (int64_t)k * nthr < left ? p[(int64_t)k * nthr] : 0.0f;
#pragma unroll
    for (int k = 0; k < E; k++)
        ss += (double)v[k] * (double)v[k];
    for (int64_t i0 = tid + (int64_t)E * nthr; i0 < n; i0 += (int64_t)E * nthr) {
        float u[E];
#pragma unroll
        for (int k = 0; k < E; k++) {
            const int64_t i = i0 + (int64_t)k * nthr;
            u[k] = i < n ? xr[i] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < E; k++)
            ss += (double)u[k] * (double)u[k];
    }
    return ss;
}

/* v[k] for the block-uniform k < E, else `other` -- the wide kernels take
 * their own element from mf_row_ss's registers. Selecting after the row's
 * reduction keeps all E values live until then, which is what makes the
 * compiler issue the E loads together (a register it may recycle early
 * turns the batch back into several round trips). */
template <int E>
static __device__ __forceinline__ float mf_lat_pick(const float (&v)[E], int k, float other) {
    float r = other;
#pragma unroll
    for (int j = 0; j < E; j++)
        r = j == k ? v[j] : r;
    return r;
}

#endif
