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
 *     thread accumulates an 8 x 4 register tile (SIMT tier, f32 exact).
 *   TC GEMM (prefill, the default for nt > MF_GEMV_T): the same loader, but
 *     the W tile is dequantized to f16 and the activations are converted to
 *     f16 in shared memory; four warps each run a 32 x 32 sub-tile through
 *     the tensor cores (wmma m16n16k16, f16 in, f32 accumulate). Operand
 *     rounding to f16 costs about 3e-4 relative error per dot product (the
 *     tier's tolerance is 3e-3, documented in docs/GPU-TESTS.md);
 *     tune mm=simt=1 (host side) selects the SIMT tier instead.
 * Above those, for nt >= tune mma_min_nt (default 64; force_gemm 3
 * at any nt) with n_in % 8 == 0 on an sm_80+ device, the call goes to the
 * mma tier (gemm_mma.cu: W dequantized to f16 once per call in bounded
 * chunks, x to f16, a pipelined mma.sync GEMM) when the caller supplied its
 * scratch; the dequant costs 2 bytes written + read per weight element, so
 * it only pays over enough tokens (below the threshold the TC tier above
 * stays). tune mm=wmma=1 keeps the TC tier for every nt > 8 (mode 3
 * without a usable mma tier also falls back to the TC tier).
 * For nt <= 8 on quantized weights with a q8 scratch, auto mode hands the
 * call to the int8 GEMV (gemv_q8.cu); this file's GEMV is then the f32
 * reference tier (mode -1, tune gemv_q8=0=1, float weights).
 * Accumulation is f32. Out-of-range rows/tokens compute on clamped indices
 * and skip only their stores (no early return before a barrier). */
#include "backend/cuda/cuda_args.h"
#include "backend/cuda/dequant.cuh"

#include <mma.h>

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

/* The GEMM loaders' K step: unit u of the row dequantized, or zeros past
 * the row's last unit (the second unit of the final K step when n_in is not
 * a multiple of 64), so the tile's tail adds nothing. */
template <int T>
static __device__ __forceinline__ void gemm_load_unit(const uint8_t *lrow, int64_t u, int64_t n_units,
                                                      int64_t n_in, float *wv) {
    if (u < n_units) {
        mf_deq<T>::unit(lrow, u, n_in, wv);
    } else {
#pragma unroll
        for (int i = 0; i < 32; i++)
            wv[i] = 0.0f;
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
        gemm_load_unit<T>(lrow, u, n_units, n_in, wv);
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


#define MF_TC_BM 64           /* outputs per TC tile */
#define MF_TC_BN 64           /* tokens per TC tile */
#define MF_TC_BK 64           /* K step: two 32-element units per output row */
#define MF_TC_LD (MF_TC_BK + 8) /* halves per smem row: 144 bytes, 16-byte aligned, skewed banks */
#define MF_TC_LDC (MF_TC_BM + 4) /* floats per column of the output staging tile */

/* Contract as gemm_kernel. Loader roles as there: thread tid dequantizes
 * unit (tid & 1) of output row (tid >> 1) per K step; the activations tile
 * (64 tokens x 64 k) is read as float4 where the row is 16-byte aligned.
 * Warp w owns outputs [32 (w >> 1), +32) x tokens [32 (w & 1), +32) as 2 x 2
 * wmma accumulators. The result goes through shared memory (column = token)
 * so the global stores are coalesced along outputs and the edges are
 * bounds-checked; every thread reaches every barrier. */
template <int T>
static __global__ void __launch_bounds__(MF_GEMM_THREADS)
tc_gemm_kernel(const uint8_t *__restrict__ w, uint64_t row_bytes, const float *__restrict__ x,
               const float *__restrict__ bias, float *__restrict__ y, int64_t n_in, int64_t n_out,
               int64_t nt) {
    using namespace nvcuda;
    __shared__ __align__(32) half sw[MF_TC_BM * MF_TC_LD];
    __shared__ __align__(32) half sx[MF_TC_BN * MF_TC_LD];
    __shared__ __align__(32) float sc[MF_TC_BN * MF_TC_LDC];
    const int tid = threadIdx.x, warp = tid >> 5;
    const int64_t o0 = (int64_t)blockIdx.x * MF_TC_BM;
    const int64_t t0 = (int64_t)blockIdx.y * MF_TC_BN;
    const int64_t n_units = (n_in + 31) / 32;
    const int lr = tid >> 1, lu = tid & 1;
    const uint8_t *lrow = w + (uint64_t)min(o0 + lr, n_out - 1) * row_bytes;
    const int wm = warp >> 1, wn = warp & 1;
    const bool x_vec = (n_in & 3) == 0 && (((uintptr_t)x) & 15) == 0;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::fill_fragment(acc[i][j], 0.0f);

    for (int64_t k0 = 0; k0 < n_in; k0 += MF_TC_BK) {
        const int64_t u = k0 / 32 + lu;
        float wv[32];
        gemm_load_unit<T>(lrow, u, n_units, n_in, wv);
        uint4 *dst = (uint4 *)(sw + lr * MF_TC_LD + 32 * lu);
#pragma unroll
        for (int q = 0; q < 4; q++)
            dst[q] = mf_f16x8(wv + 8 * q);
#pragma unroll 4
        for (int idx = tid; idx < MF_TC_BN * (MF_TC_BK / 4); idx += MF_GEMM_THREADS) {
            const int tt = idx / (MF_TC_BK / 4), kq = idx % (MF_TC_BK / 4);
            const int64_t t = t0 + tt, k = k0 + 4 * kq;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (t < nt) {
                const float *xr = x + t * n_in + k;
                if (x_vec && k + 3 < n_in) {
                    v = *(const float4 *)xr;
                } else {
                    v.x = k < n_in ? xr[0] : 0.0f;
                    v.y = k + 1 < n_in ? xr[1] : 0.0f;
                    v.z = k + 2 < n_in ? xr[2] : 0.0f;
                    v.w = k + 3 < n_in ? xr[3] : 0.0f;
                }
            }
            half2 *xd = (half2 *)(sx + tt * MF_TC_LD + 4 * kq);
            xd[0] = __floats2half2_rn(v.x, v.y);
            xd[1] = __floats2half2_rn(v.z, v.w);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < MF_TC_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb[2];
#pragma unroll
            for (int i = 0; i < 2; i++)
                wmma::load_matrix_sync(fa[i], sw + (wm * 32 + 16 * i) * MF_TC_LD + kk, MF_TC_LD);
#pragma unroll
            for (int j = 0; j < 2; j++)
                wmma::load_matrix_sync(fb[j], sx + (wn * 32 + 16 * j) * MF_TC_LD + kk, MF_TC_LD);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++)
                    wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads(); /* the tiles are overwritten by the next K step */
    }
    /* sc[t][o]: element (output row o, token col t) of a col-major C */
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(sc + (wn * 32 + 16 * j) * MF_TC_LDC + wm * 32 + 16 * i, acc[i][j],
                                    MF_TC_LDC, wmma::mem_col_major);
    __syncthreads();
    for (int idx = tid; idx < MF_TC_BM * MF_TC_BN; idx += MF_GEMM_THREADS) {
        const int tt = idx / MF_TC_BM, oo = idx % MF_TC_BM;
        const int64_t o = o0 + oo, t = t0 + tt;
        if (o < n_out && t < nt)
            y[t * n_out + o] = sc[tt * MF_TC_LDC + oo] + (bias ? bias[o] : 0.0f);
    }
}

template <int T> static cudaError_t launch_matmul(const mf_cu_matmul_args *a, cudaStream_t s) {
    const int mode = a->force_gemm;
    if (mf_cu_mma_wanted(a)) {
        if (a->xf16)
            return mf_cu_gemm_mma(a, s);
        if (mode == 3)
            return cudaErrorInvalidValue; /* forced without its scratch */
    }
    const bool gemm = mode > 0 || (mode == 0 && a->nt > MF_GEMV_T);
    if (mode == -2 || (mode == 0 && !gemm && a->q8 && mf_cu_q8_supported(a->wtype, a->n_in)))
        return mf_cu_gemv_q8(a, s);
    const bool tc = mode >= 2 || (mode == 0 && !a->no_tc);
    const uint8_t *w = (const uint8_t *)a->w;
    if (gemm && tc) {
        dim3 grid((unsigned)((a->n_out + MF_TC_BM - 1) / MF_TC_BM),
                  (unsigned)((a->nt + MF_TC_BN - 1) / MF_TC_BN));
        tc_gemm_kernel<T><<<grid, MF_GEMM_THREADS, 0, s>>>(w, a->row_bytes, a->x, a->bias, a->y,
                                                           a->n_in, a->n_out, a->nt);
    } else if (gemm) {
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
    MF_PROBE(gemm_kernel<T>, MF_GEMM_THREADS);          \
    MF_PROBE(tc_gemm_kernel<T>, MF_GEMM_THREADS);
    MF_CU_FOR_EACH_WTYPE(MF_CASE)
#undef MF_CASE
    return mf_cu_probe_mma(smem_limit, bad);
}
