/* norm.cu - RMSNorm (and QkNorm, the same kernel on head_dim rows).
 *
 * One block per row. The sum of squares is accumulated in double (an
 * 18944-wide row of large activations loses digits in a float running sum,
 * the CPU does the same) and reduced by warp shuffles then shared memory;
 * each thread rereads and writes only its own elements, so y may equal x.
 *
 * Wide path (decode): with few rows
 * one block per row leaves the GPU idle and the kernel is one long latency
 * chain. rmsnorm_wide_kernel runs grid (n / threads, rows): every block
 * recomputes its row's sum of squares with the same thread count and the
 * same per-thread order as the one-block kernel (so the scale, and every
 * output, is bitwise the same), then writes only its own `threads`
 * elements, whose x it kept from that pass. Other blocks still read the
 * whole row while one writes, so the host takes it only when y does not
 * overlap x. The extra row reads are L2 hits (3.5-20 KB per row). */
#include "backend/cuda/cuda_args.h"
#include "backend/cuda/norm.cuh"
#include "backend/cuda/pdl.cuh"

/* A thread's row loads are issued MF_LAT_E at once (mf_row_ss) instead of
 * one dependent round trip per element; the older strided-loop kernels
 * gave bitwise the same outputs and were slower (docs/PERF.md,
 * "Row-kernel generations"). */

/* Block (c, r): elements [c * blockDim.x, (c + 1) * blockDim.x) of row r.
 * The weight is read before the PDL wait (no kernel writes it). The row
 * pass issues a thread's loads together (mf_row_ss), and the thread's own
 * element is picked from those registers after the reduction (that keeps
 * them live, so the loads stay one batch). */
static __global__ void rmsnorm_wide_kernel(const float *__restrict__ x, const float *__restrict__ w,
                                           float *__restrict__ y, int64_t n, float eps) {
    const int64_t me = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const float wv = w && me < n ? w[me] : 1.0f;
    mf_pdl_wait();
    mf_pdl_trigger();
    __shared__ double part[32];
    const int64_t r = blockIdx.y;
    const float *xr = x + r * n;
    float mine = 0.0f, v[MF_LAT_E];
    const double ss = mf_row_ss<MF_LAT_E>(xr, n, threadIdx.x, blockDim.x, v);
    const float sc = mf_rms_scale(ss, part, (blockDim.x + 31) >> 5, n, eps);
    /* element me is this thread's pass-blockIdx.x element */
    mine = blockIdx.x < MF_LAT_E ? mf_lat_pick(v, (int)blockIdx.x, 0.0f) : me < n ? xr[me] : 0.0f;
    if (me < n)
        y[r * n + me] = w ? mine * sc * wv : mine * sc;
}

/* One block per row (many rows, or y overlapping x). The one-block form keeps
 * its first MF_LAT_E elements in registers for the second pass, so x is
 * read once up to MF_LAT_E * blockDim.x (4096 at 256 threads) and each
 * thread writes only elements it read itself: y may equal x (the in-place
 * final norm). The weight is read before the PDL wait. */
static __global__ void __launch_bounds__(256) rmsnorm_lat_kernel(const float *x, const float *__restrict__ w,
                                                                 float *y, int64_t n, float eps) {
    const int64_t r = blockIdx.x;
    const int tid = threadIdx.x, nthr = blockDim.x;
    float wv[MF_LAT_E];
#pragma unroll
    for (int k = 0; k < MF_LAT_E; k++) {
        const int64_t i = tid + (int64_t)k * nthr;
        wv[k] = w && i < n ? w[i] : 1.0f;
    }
    mf_pdl_wait();
    mf_pdl_trigger();
    __shared__ double part[32];
    const float *xr = x + r * n;
    float *yr = y + r * n;
    float v[MF_LAT_E];
    const double ss = mf_row_ss<MF_LAT_E>(xr, n, tid, nthr, v);
    const float sc = mf_rms_scale(ss, part, (nthr + 31) >> 5, n, eps);
#pragma unroll
    for (int k = 0; k < MF_LAT_E; k++) {
        const int64_t i = tid + (int64_t)k * nthr;
        if (i < n)
            yr[i] = w ? v[k] * sc * wv[k] : v[k] * sc;
    }
    for (int64_t i = tid + (int64_t)MF_LAT_E * nthr; i < n; i += nthr) /* rows past the registers */
        yr[i] = w ? xr[i] * sc * w[i] : xr[i] * sc;
}

/* Rows up to which the wide kernel is taken: past it the one-block grid
 * fills the GPU and the repeated row reads would only add L2 traffic. */
#define WIDE_MAX_ROWS 64

extern "C" cudaError_t mf_cu_rmsnorm(const mf_cu_norm_args *a, cudaStream_t s) {
    if (a->nrows <= 0)
        return cudaSuccess;
    const int threads = a->n >= 1024 ? 256 : a->n >= 256 ? 128 : 32;
    const int64_t total = a->n * a->nrows;
    const bool apart = a->y + total <= a->x || a->x + total <= a->y;
    if (a->nrows <= WIDE_MAX_ROWS && apart && a->n > threads) {
        const dim3 grid((unsigned)((a->n + threads - 1) / threads), (unsigned)a->nrows);
        return mf_launch(rmsnorm_wide_kernel, grid, dim3(threads), 0, s, a->pdl, a->x, a->w, a->y, a->n, a->eps);
    }
    return mf_launch(rmsnorm_lat_kernel, dim3((unsigned)a->nrows), dim3(threads), 0, s, a->pdl, a->x, a->w, a->y,
                     a->n, a->eps);
}

#include "backend/cuda/probe.cuh"

extern "C" cudaError_t mf_cu_probe_norm(size_t smem_limit, const char **bad) {
    MF_PROBE(rmsnorm_lat_kernel, 256);
    MF_PROBE(rmsnorm_wide_kernel, 256);
    return cudaSuccess;
}
