/* matmul.cu - y = W x (+ bias) for every weight type, f32 activations.
 *
 * Two kernels per weight type, both dequantizing W on the fly with
 * mf_deq<T>::unit (dequant.cuh):
 *   GEMV (decode, few tokens): one warp per output row; lane i takes units
 *     i, i+32, ... of the row (adjacent lanes read adjacent blocks, so a warp
 *     streams one contiguous span of the row per step), dots each dequantized
 *     unit with up to MF_GEMV_T token rows, and the warp reduces by shuffles.
 *     The weight is read once per MF_GEMV_T tokens.
 *   GEMM (prefill): a 64 (outputs) x 64 (tokens) tile per 128-thread block;
 *     per K step of 64 every thread dequantizes one 32-element unit of W into
 *     shared memory, the block stages the matching activations, then each
 *     thread accumulates an 8 x 4 register tile. Tensor cores come later.
 * Accumulation is f32. Out-of-range rows/tokens compute on clamped indices
 * and skip only their stores (no early return before a barrier). */
#include "backend/cuda/cuda_args.h"
#include "backend/cuda/dequant.cuh"

#define MF_GEMV_T 8        /* tokens per GEMV warp */
#define MF_GEMV_WARPS 4    /* output rows per GEMV block */
#define MF_GEMM_TO 64      /* outputs per GEMM tile */
#define MF_GEMM_TT 64      /* tokens per GEMM tile */
#define MF_GEMM_TK 64      /* K step (two units) */
#define MF_GEMM_THREADS 128

template <int T>
static __global__ void __launch_bounds__(32 * MF_GEMV_WARPS)
gemv_kernel(const uint8_t *__restrict__ w, uint64_t row_bytes, const float *__restrict__ x,
            const float *__restrict__ bias, float *__restrict__ y, int64_t n_in, int64_t n_out,
            int64_t nt) {
    const int lane = threadIdx.x & 31;
    const int64_t o = (int64_t)blockIdx.x * MF_GEMV_WARPS + (threadIdx.x >> 5);
    const int64_t t0 = (int64_t)blockIdx.y * MF_GEMV_T;
    const bool valid = o < n_out;
    const uint8_t *row = w + (uint64_t)(valid ? o : 0) * row_bytes;
    const int64_t n_units = (n_in + 31) / 32;
    const int ntok = (int)min((int64_t)MF_GEMV_T, nt - t0);

    float acc[MF_GEMV_T];
#pragma unroll
    for (int t = 0; t < MF_GEMV_T; t++)
        acc[t] = 0.0f;

    for (int64_t u = lane; u < n_units; u += 32) {
        float wv[32];
        mf_deq<T>::unit(row, u, n_in, wv);
        const int64_t k0 = 32 * u;
        const int kn = (int)min((int64_t)32, n_in - k0);
#pragma unroll
        for (int t = 0; t < MF_GEMV_T; t++) {
            if (t < ntok) {
                const float *xr = x + (t0 + t) * n_in + k0;
                float s = 0.0f;
                if (kn == 32 && (((uintptr_t)xr) & 15) == 0) {
                    const float4 *x4 = (const float4 *)xr;
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        const float4 v = x4[i];
                        s += wv[4 * i] * v.x + wv[4 * i + 1] * v.y + wv[4 * i + 2] * v.z +
                             wv[4 * i + 3] * v.w;
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < 32; i++)
                        if (i < kn)
                            s += wv[i] * xr[i];
                }
                acc[t] += s;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MF_GEMV_T; t++) {
        float s = acc[t];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, off);
        acc[t] = s;
    }
    if (valid && lane == 0) {
        const float b = bias ? bias[o] : 0.0f;
#pragma unroll
        for (int t = 0; t < MF_GEMV_T; t++)
            if (t < ntok)
                y[(t0 + t) * n_out + o] = acc[t] + b;
    }
}

template <int T>
static __global__ void __launch_bounds__(MF_GEMM_THREADS)
gemm_kernel(const uint8_t *__restrict__ w, uint64_t row_bytes, const float *__restrict__ x,
            const float *__restrict__ bias, float *__restrict__ y, int64_t n_in, int64_t n_out,
            int64_t nt) {
    /* k-major tiles, padded by one float so the transposed stores spread
     * over the banks */
    __shared__ float ws[MF_GEMM_TK][MF_GEMM_TO + 1];
    __shared__ float xs[MF_GEMM_TK][MF_GEMM_TT + 1];
    const int tid = threadIdx.x;
    const int64_t o0 = (int64_t)blockIdx.x * MF_GEMM_TO;
    const int64_t t0 = (int64_t)blockIdx.y * MF_GEMM_TT;
    const int64_t n_units = (n_in + 31) / 32;

    /* loader role: row lr of the tile, unit lu (0/1) of the K step */
    const int lr = tid >> 1, lu = tid & 1;
    const int64_t lo = min(o0 + lr, n_out - 1);
    const uint8_t *lrow = w + (uint64_t)lo * row_bytes;
    /* compute role: outputs co*8 + i, tokens ct*4 + j */
    const int co = tid / 16, ct = tid % 16;

    float acc[8][4];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            acc[i][j] = 0.0f;

    for (int64_t k0 = 0; k0 < n_in; k0 += MF_GEMM_TK) {
        const int64_t u = k0 / 32 + lu;
        float wv[32];
        if (u < n_units) {
            mf_deq<T>::unit(lrow, u, n_in, wv);
        } else {
#pragma unroll
            for (int i = 0; i < 32; i++)
                wv[i] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 32; i++)
            ws[32 * lu + i][lr] = wv[i];
        for (int idx = tid; idx < MF_GEMM_TT * MF_GEMM_TK; idx += MF_GEMM_THREADS) {
            const int tt = idx / MF_GEMM_TK, kk = idx % MF_GEMM_TK;
            const int64_t t = t0 + tt, k = k0 + kk;
            xs[kk][tt] = (t < nt && k < n_in) ? x[t * n_in + k] : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < MF_GEMM_TK; kk++) {
            float a[8], b[4];
#pragma unroll
            for (int i = 0; i < 8; i++)
                a[i] = ws[kk][co * 8 + i];
#pragma unroll
            for (int j = 0; j < 4; j++)
                b[j] = xs[kk][ct * 4 + j];
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] += a[i] * b[j];
        }
        __syncthreads(); /* the tiles are overwritten by the next K step */
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int64_t o = o0 + co * 8 + i;
        if (o < n_out) {
            const float bo = bias ? bias[o] : 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int64_t t = t0 + ct * 4 + j;
                if (t < nt)
                    y[t * n_out + o] = acc[i][j] + bo;
            }
        }
    }
}

template <int T> static cudaError_t launch_matmul(const mf_cu_matmul_args *a, cudaStream_t s) {
    const bool gemm = a->force_gemm > 0 || (a->force_gemm == 0 && a->nt > MF_GEMV_T);
    const uint8_t *w = (const uint8_t *)a->w;
    if (gemm) {
        dim3 grid((unsigned)((a->n_out + MF_GEMM_TO - 1) / MF_GEMM_TO),
                  (unsigned)((a->nt + MF_GEMM_TT - 1) / MF_GEMM_TT));
        gemm_kernel<T><<<grid, MF_GEMM_THREADS, 0, s>>>(w, a->row_bytes, a->x, a->bias, a->y,
                                                        a->n_in, a->n_out, a->nt);
    } else {
        dim3 grid((unsigned)((a->n_out + MF_GEMV_WARPS - 1) / MF_GEMV_WARPS),
                  (unsigned)((a->nt + MF_GEMV_T - 1) / MF_GEMV_T));
        gemv_kernel<T><<<grid, 32 * MF_GEMV_WARPS, 0, s>>>(w, a->row_bytes, a->x, a->bias, a->y,
                                                           a->n_in, a->n_out, a->nt);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t mf_cu_matmul(const mf_cu_matmul_args *a, cudaStream_t s) {
    switch (a->wtype) {
#define MF_CASE(T) \
    case T:        \
        return launch_matmul<T>(a, s);
        MF_CU_FOR_EACH_WTYPE(MF_CASE)
#undef MF_CASE
    default:
        return cudaErrorInvalidValue;
    }
}

extern "C" int mf_cu_type_supported(uint32_t wtype) {
    switch (wtype) {
#define MF_CASE(T) case T:
        MF_CU_FOR_EACH_WTYPE(MF_CASE)
#undef MF_CASE
        return 1;
    default:
        return 0;
    }
}

#include "backend/cuda/probe.cuh"

extern "C" cudaError_t mf_cu_probe_matmul(size_t smem_limit, const char **bad) {
#define MF_CASE(T)                                      \
    MF_PROBE(gemv_kernel<T>, 32 * MF_GEMV_WARPS);       \
    MF_PROBE(gemm_kernel<T>, MF_GEMM_THREADS);
    MF_CU_FOR_EACH_WTYPE(MF_CASE)
#undef MF_CASE
    return cudaSuccess;
}
