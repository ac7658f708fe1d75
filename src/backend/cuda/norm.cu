/* norm.cu - RMSNorm (and QkNorm, the same kernel on head_dim rows).
 *
 * One block per row. The sum of squares is accumulated in double (an
 * 18944-wide row of large activations loses digits in a float running sum,
 * the CPU does the same) and reduced by warp shuffles then shared memory;
 * each thread rereads and writes only its own elements, so y may equal x.
 *
 * Wide path (decode; MINFER_CUDA_NO_WIDE_NORM=1 turns it off): with few rows
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

/* the kill switches of the wide decode kernels (mf_cu_set_wide) */
int mf_cu_wide_norm = 1;
int mf_cu_wide_rope = 1;

extern "C" void mf_cu_set_wide(int norm, int rope) {
    mf_cu_wide_norm = norm != 0;
    mf_cu_wide_rope = rope != 0;
}

/* The decode row kernels without serial load chains (the *_lat kernels in
 * norm.cu, gemv_q8.cu, ropestore.cu, attn_decode.cu; bitwise the older
 * ones, which only the op tests still select, through mf_cu_set_lat). */
int mf_cu_lat = 1;

extern "C" void mf_cu_set_lat(int on) {
    mf_cu_lat = on != 0;
}

static __global__ void rmsnorm_kernel(const float *x, const float *__restrict__ w, float *y, int64_t n,
                               float eps) {
    mf_pdl_wait();
    mf_pdl_trigger();
    __shared__ double part[32];
    const int64_t r = blockIdx.x;
    const float *xr = x + r * n;
    float *yr = y + r * n;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        ss += (double)xr[i] * (double)xr[i];
    const float sc = mf_rms_scale(ss, part, (blockDim.x + 31) >> 5, n, eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = w ? xr[i] * sc * w[i] : xr[i] * sc;
}

/* Block (c, r): elements [c * blockDim.x, (c + 1) * blockDim.x) of row r.
 * The weight is read before the PDL wait (no kernel writes it). LAT (the
 * MINFER_CUDA_LAT form, bitwise equal): the row pass issues a thread's loads
 * together (mf_row_ss) instead of one dependent round trip per element, and
 * the thread's own element is picked from those registers after the
 * reduction (that keeps them live, so the loads stay one batch). */
template <bool LAT>
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
    const double ss = mf_wide_row_ss<LAT>(xr, n, me, blockDim.x, v, &mine);
    const float sc = mf_rms_scale(ss, part, (blockDim.x + 31) >> 5, n, eps);
    if constexpr (LAT) /* element me is this thread's pass-blockIdx.x element */
        mine = blockIdx.x < MF_LAT_E ? mf_lat_pick(v, (int)blockIdx.x, 0.0f) : me < n ? xr[me] : 0.0f;
    if (me < n)
        y[r * n + me] = w ? mine * sc * wv : mine * sc;
}

/* The MINFER_CUDA_LAT form of rmsnorm_kernel, bitwise equal to it
 * (same threads, same per-thread element order through mf_row_ss, same
 * mf_rms_scale): the row's loads are issued MF_LAT_E per thread at once
 * instead of one dependent round trip per element. The one-block form keeps
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
    if (mf_cu_wide_norm && a->nrows <= WIDE_MAX_ROWS && apart && a->n > threads) {
        const dim3 grid((unsigned)((a->n + threads - 1) / threads), (unsigned)a->nrows);
        return mf_launch(mf_cu_lat ? rmsnorm_wide_kernel<true> : rmsnorm_wide_kernel<false>, grid, dim3(threads), 0, s,
                         a->x, a->w, a->y, a->n, a->eps);
    }
    return mf_launch(mf_cu_lat ? rmsnorm_lat_kernel : rmsnorm_kernel, dim3((unsigned)a->nrows), dim3(threads), 0,
                     s, a->x, a->w, a->y, a->n, a->eps);
}

#include "backend/cuda/probe.cuh"

extern "C" cudaError_t mf_cu_probe_norm(size_t smem_limit, const char **bad) {
    MF_PROBE(rmsnorm_kernel, 256);
    MF_PROBE(rmsnorm_wide_kernel<false>, 256);
    MF_PROBE(rmsnorm_lat_kernel, 256);
    MF_PROBE(rmsnorm_wide_kernel<true>, 256);
    return cudaSuccess;
}
