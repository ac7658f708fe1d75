/* elementwise.cu - add, mul (with one-row broadcast), scale, silu, swiglu,
 * copy; row softmax; the strided 4-d copy behind VIEW, PERMUTE and row
 * select. Elementwise kernels read and write element i in one thread, so
 * they run in place; the 4-d copy needs distinct buffers (the host checks). */
#include <math.h>

#include "backend/cuda/cuda_args.h"
#include "backend/cuda/pdl.cuh"

static __global__ void ew_kernel(mf_cu_ew_args a) {
    mf_pdl_wait();
    mf_pdl_trigger();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride) {
        const float x = a.a[i];
        float r;
        switch (a.op) {
        case MF_CU_EW_ADD: r = x + a.b[a.b_n < a.n ? i % a.b_n : i]; break;
        case MF_CU_EW_MUL: r = x * a.b[a.b_n < a.n ? i % a.b_n : i]; break;
        case MF_CU_EW_SCALE: r = x * a.s; break;
        case MF_CU_EW_SILU: r = x / (1.0f + expf(-x)); break;
        case MF_CU_EW_SWIGLU: r = x / (1.0f + expf(-x)) * a.b[i]; break;
        default: r = x; break;
        }
        a.y[i] = r;
    }
}

static unsigned ew_blocks(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

extern "C" cudaError_t mf_cu_elementwise(const mf_cu_ew_args *a, cudaStream_t s) {
    if (a->n <= 0)
        return cudaSuccess;
    return mf_launch(ew_kernel, dim3(ew_blocks(a->n)), dim3(256), 0, s, a->pdl, *a);
}

/* Block-wide reduction (sum or max) of one float per thread; every thread
 * gets the result. Two barriers: the scratch is reused by the next call. */
static __device__ float block_reduce(float v, bool is_max, float *scr) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float o = __shfl_xor_sync(0xffffffffu, v, off);
        v = is_max ? fmaxf(v, o) : v + o;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0)
        scr[warp] = v;
    __syncthreads();
    float r = scr[0];
    for (int i = 1; i < nw; i++)
        r = is_max ? fmaxf(r, scr[i]) : r + scr[i];
    return r;
}

static __global__ void softmax_kernel(const float *x, float *y, int64_t n, float scale) {
    mf_pdl_wait();
    mf_pdl_trigger();
    __shared__ float scr[32];
    const float *xr = x + (int64_t)blockIdx.x * n;
    float *yr = y + (int64_t)blockIdx.x * n;
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        mx = fmaxf(mx, xr[i] * scale);
    mx = block_reduce(mx, true, scr);
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = expf(xr[i] * scale - mx);
        yr[i] = e;
        sum += e;
    }
    sum = block_reduce(sum, false, scr);
    const float inv = 1.0f / sum;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] *= inv;
}

extern "C" cudaError_t mf_cu_softmax(const mf_cu_softmax_args *a, cudaStream_t s) {
    if (a->nrows <= 0 || a->n <= 0)
        return cudaSuccess;
    return mf_launch(softmax_kernel, dim3((unsigned)a->nrows), dim3(256), 0, s, a->pdl, a->x, a->y, a->n,
                     a->scale);
}

static __global__ void copy4d_kernel(mf_cu_copy_args a, int64_t total) {
    mf_pdl_wait();
    mf_pdl_trigger();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const uint32_t *x = (const uint32_t *)a.x;
    uint32_t *y = (uint32_t *)a.y;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        int64_t r = i;
        const int64_t i0 = r % a.ne[0];
        r /= a.ne[0];
        const int64_t i1 = r % a.ne[1];
        r /= a.ne[1];
        const int64_t i2 = r % a.ne[2];
        const int64_t i3 = r / a.ne[2];
        y[i] = x[i0 * a.st[0] + i1 * a.st[1] + i2 * a.st[2] + i3 * a.st[3]];
    }
}

extern "C" cudaError_t mf_cu_copy4d(const mf_cu_copy_args *a, cudaStream_t s) {
    const int64_t total = a->ne[0] * a->ne[1] * a->ne[2] * a->ne[3];
    if (total <= 0)
        return cudaSuccess;
    return mf_launch(copy4d_kernel, dim3(ew_blocks(total)), dim3(256), 0, s, a->pdl, *a, total);
}

#include "backend/cuda/probe.cuh"

extern "C" cudaError_t mf_cu_probe_elementwise(size_t smem_limit, const char **bad) {
    MF_PROBE(ew_kernel, 256);
    MF_PROBE(softmax_kernel, 256);
    MF_PROBE(copy4d_kernel, 256);
    return cudaSuccess;
}
