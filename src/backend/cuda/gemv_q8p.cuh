/* gemv_q8p.cuh - the int8 GEMV's quantizing prologue: each GEMV block
 * quantizes (and RMSNorms) its own activation rows into shared memory.
 * Shared by the v1 / v3 kernels (gemv_q8.cu, MINFER_CUDA_GEMV_PROLOGUE) and
 * the v4 kernel (gemv_q8v4.cu, MINFER_CUDA_GEMV_V4_PRO), so both produce
 * bitwise the bytes of the separate quantize / norm-quant kernels. */
#ifndef MF_CUDA_GEMV_Q8P_CUH
#define MF_CUDA_GEMV_Q8P_CUH

#include <stdint.h>

#include <cuda_runtime.h>

#include "backend/cuda/gemv_q8.cuh"

/* Why. At 0.5B widths a decode GEMV is latency, not bytes (~3 us), and the
 * separate q8_quant / q8_norm_quant launch before it costs as much again
 * (>= 2.5 us even nearly empty). So a GEMV block can quantize its own
 * tokens' activation rows into shared memory (and RMSNorm them first), one
 * barrier, then run the usual dp4a over shared memory. The price is
 * redundant work: every block reads the rows (blocks x ntb x n_in x 4 bytes
 * of L2 reads in all); mf_cu_q8_prologue_rule bounds it per SM.
 *
 * Exactness: the int8 values, d and the half sums are bitwise those of
 * q8_quant_kernel / q8_norm_quant_kernel. A unit is 8 lanes x 4 elements
 * here instead of 32 x 1, but amax (a max) and the half sums (integers) do
 * not depend on the order, and d = amax / 127, id = 1 / d, q = rint(v * id)
 * are the same expressions. The norm's double sum of squares replays the
 * 256-thread kernel exactly: thread tid of the 128 plays threads tid and
 * tid + 128 (the same per-thread element order, the same 32-lane shuffle
 * tree, part[0..7] summed in the same order), so the float scale is equal.
 *
 * Shared layout (dynamic, q8p_bytes): part[8][8] doubles, 8 float scales,
 * then ntok rows of n_in int8, ntok * n_in / 32 floats d, as many int32 half
 * sums (the global scratch layout for ntok tokens). */
typedef struct q8_pro {
    const float *x; /* the f32 rows (token t0 + t at x + (t0 + t) * n_in); NULL: no prologue */
    const float *w; /* RMSNorm weight, NULL: none (or no norm) */
    float eps;
    int32_t norm;
} q8_pro;

#define Q8P_HDR 576
#define Q8P_SMEM_MAX (47 * 1024) /* under the 48 KiB a launch gets without opting in, with the static part[] */
#define Q8P_SM_BYTES (128 * 1024)

extern __shared__ __align__(16) uint8_t q8p_buf[];

static inline size_t q8p_bytes(int64_t n_in, int64_t ntb) {
    return Q8P_HDR + (size_t)ntb * (size_t)n_in + (size_t)ntb * (size_t)(n_in / 32) * 8;
}

/* Fills the shared layout above with tokens t0 .. t0 + ntok - 1 of p.x; every
 * thread of the 128 calls it (two barriers, or one without the norm), after
 * mf_pdl_wait. Returns the shared activation pointers through xq / xd / xs
 * (indexed from token 0 = t0). */
static __device__ __forceinline__ void q8_prologue(const q8_pro &p, int64_t n_in, int64_t t0, int ntok) {
    double (*part)[8] = (double (*)[8])q8p_buf;
    float *scs = (float *)(q8p_buf + 512);
    int8_t *sq = (int8_t *)(q8p_buf + Q8P_HDR);
    const int64_t n_units = n_in / 32;
    float *sd = (float *)(sq + ntok * n_in);
    int32_t *ssum = (int32_t *)(sd + ntok * n_units);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (p.norm) {
        for (int t = 0; t < ntok; t++) {
            const float *xr = p.x + (t0 + t) * n_in;
            double a = 0.0, b = 0.0; /* threads tid and tid + 128 of the 256-thread kernel */
            for (int64_t i = tid; i < n_in; i += 256)
                a += (double)xr[i] * (double)xr[i];
            for (int64_t i = tid + 128; i < n_in; i += 256)
                b += (double)xr[i] * (double)xr[i];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                a += __shfl_xor_sync(0xffffffffu, a, off);
                b += __shfl_xor_sync(0xffffffffu, b, off);
            }
            if (lane == 0) {
                part[t][warp] = a;
                part[t][warp + 4] = b;
            }
        }
        __syncthreads();
        if (tid < ntok) {
            double tot = 0.0;
            for (int i = 0; i < 8; i++)
                tot += part[tid][i];
            scs[tid] = (float)(1.0 / sqrt(tot / (double)n_in + (double)p.eps));
        }
        __syncthreads();
    }
    /* 8 lanes x 4 elements per unit, 16 units per round; warp-uniform trip
     * count (the shuffles need every lane) */
    const int total = ntok * (int)n_units, nu = (int)n_units; /* 32-bit: at most 8 x 1184 units (47 KiB) */
    const int j = lane & 7;
#pragma unroll 1
    for (int base = 4 * warp; base < total; base += 16) {
        const int uu = base + (lane >> 3);
        const bool ok = uu < total;
        const int t = ok ? uu / nu : 0;
        const int64_t i = (int64_t)(ok ? uu - t * nu : 0) * 32 + 4 * j;
        float4 v = *(const float4 *)(p.x + (t0 + t) * n_in + i);
        if (p.norm) {
            const float sc = scs[t];
            if (p.w) {
                const float4 wv = *(const float4 *)(p.w + i);
                v = make_float4(v.x * sc * wv.x, v.y * sc * wv.y, v.z * sc * wv.z, v.w * sc * wv.w);
            } else {
                v = make_float4(v.x * sc, v.y * sc, v.z * sc, v.w * sc);
            }
        }
        float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
        for (int off = 1; off < 8; off <<= 1)
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const int q0 = __float2int_rn(v.x * id), q1 = __float2int_rn(v.y * id);
        const int q2 = __float2int_rn(v.z * id), q3 = __float2int_rn(v.w * id);
        int s = q0 + q1 + q2 + q3;
        s += __shfl_xor_sync(0xffffffffu, s, 1); /* lanes 0-3 of the unit: elements 0-15 */
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        const int s_hi = __shfl_sync(0xffffffffu, s, (lane & ~7) + 4);
        if (ok) {
            ((uint32_t *)sq)[uu * 8 + j] = (uint32_t)(uint8_t)q0 | (uint32_t)(uint8_t)q1 << 8 |
                                           (uint32_t)(uint8_t)q2 << 16 | (uint32_t)(uint8_t)q3 << 24;
            if (j == 0) {
                sd[uu] = d;
                ssum[uu] = (int32_t)(((uint32_t)s & 0xffffu) | ((uint32_t)s_hi << 16));
            }
        }
    }
    __syncthreads();
}

/* The shared activation copy of q8_prologue for ntok tokens. */
static __device__ __forceinline__ void q8p_ptrs(int64_t n_in, int ntok, const int8_t **xq, const float **xd,
                                                const int32_t **xs) {
    const int8_t *sq = (const int8_t *)(q8p_buf + Q8P_HDR);
    *xq = sq;
    *xd = (const float *)(sq + ntok * n_in);
    *xs = (const int32_t *)(*xd + ntok * (n_in / 32));
}


/* q8_prologue for one token, the v4 GEMV's form (MINFER_CUDA_GEMV_V4_PRO):
 * the same bytes -- each thread's two partial sums of squares over the same
 * elements in the same order (past the row it adds (+0)^2, which leaves a
 * non-negative sum unchanged), the same shuffle tree and part[] order, the
 * same unit arithmetic -- with fewer dependent round trips before the
 * first dot: a thread issues its norm-pass loads for both of its roles
 * Q8P_E1 at a time before adding them (q8_prologue's strided loops wait on
 * ~n_in / 512 round trips, 7 at 3584), and every thread sums part[]
 * itself (one barrier less). The unit loop stays unroll 1: unrolled twice,
 * the PRO instances went from 40-56 to 48-64 registers (-Xptxas -v). */
#define Q8P_E1 8
static __device__ __forceinline__ void q8_prologue_one(const q8_pro &p, int64_t n_in) {
    double *part = (double *)q8p_buf;
    int8_t *sq = (int8_t *)(q8p_buf + Q8P_HDR);
    const int64_t n_units = n_in / 32;
    float *sd = (float *)(sq + n_in);
    int32_t *ssum = (int32_t *)(sd + n_units);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float sc = 1.0f;
    if (p.norm) {
        double a = 0.0, b = 0.0; /* threads tid and tid + 128 of the 256-thread kernel */
        for (int64_t i0 = tid; i0 < n_in; i0 += (int64_t)256 * Q8P_E1) {
            float va[Q8P_E1], vb[Q8P_E1];
#pragma unroll
            for (int k = 0; k < Q8P_E1; k++) {
                const int64_t i = i0 + (int64_t)256 * k;
                va[k] = i < n_in ? p.x[i] : 0.0f;
                vb[k] = i + 128 < n_in ? p.x[i + 128] : 0.0f;
            }
#pragma unroll
            for (int k = 0; k < Q8P_E1; k++)
                a += (double)va[k] * (double)va[k];
#pragma unroll
            for (int k = 0; k < Q8P_E1; k++)
                b += (double)vb[k] * (double)vb[k];
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            a += __shfl_xor_sync(0xffffffffu, a, off);
            b += __shfl_xor_sync(0xffffffffu, b, off);
        }
        if (lane == 0) {
            part[warp] = a;
            part[warp + 4] = b;
        }
        __syncthreads();
        double tot = 0.0;
        for (int i = 0; i < 8; i++)
            tot += part[i];
        sc = (float)(1.0 / sqrt(tot / (double)n_in + (double)p.eps));
    }
    const int total = (int)n_units; /* at most 1184 units (47 KiB) */
    const int j = lane & 7;
#pragma unroll 1
    for (int base = 4 * warp; base < total; base += 16) { /* warp-uniform: the shuffles need every lane */
        const int uu = base + (lane >> 3);
        const bool ok = uu < total;
        const int64_t i = (int64_t)(ok ? uu : 0) * 32 + 4 * j;
        float4 v = *(const float4 *)(p.x + i);
        if (p.norm) {
            if (p.w) {
                const float4 wv = *(const float4 *)(p.w + i);
                v = make_float4(v.x * sc * wv.x, v.y * sc * wv.y, v.z * sc * wv.z, v.w * sc * wv.w);
            } else {
                v = make_float4(v.x * sc, v.y * sc, v.z * sc, v.w * sc);
            }
        }
        float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
        for (int off = 1; off < 8; off <<= 1)
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const int q0 = __float2int_rn(v.x * id), q1 = __float2int_rn(v.y * id);
        const int q2 = __float2int_rn(v.z * id), q3 = __float2int_rn(v.w * id);
        int s = q0 + q1 + q2 + q3;
        s += __shfl_xor_sync(0xffffffffu, s, 1); /* lanes 0-3 of the unit: elements 0-15 */
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        const int s_hi = __shfl_sync(0xffffffffu, s, (lane & ~7) + 4);
        if (ok) {
            ((uint32_t *)sq)[uu * 8 + j] = (uint32_t)(uint8_t)q0 | (uint32_t)(uint8_t)q1 << 8 |
                                           (uint32_t)(uint8_t)q2 << 16 | (uint32_t)(uint8_t)q3 << 24;
            if (j == 0) {
                sd[uu] = d;
                ssum[uu] = (int32_t)(((uint32_t)s & 0xffffu) | ((uint32_t)s_hi << 16));
            }
        }
    }
    __syncthreads();
}

/* The v4 GEMV (mf_cu_q8v4_launch) with the quantizing prologue: every block
 * builds the int8 activation from pro->x (RMSNorm'ed with pro->norm) in
 * shared memory after the PDL wait, so no quantize kernel runs before it.
 * Bitwise the outputs of the separate quantization + mf_cu_q8v4_launch with
 * the same u (and rp: the rope epilogue as mf_cu_q8v4_launch takes it).
 * cudaErrorNotSupported where it has no instance (types and u of
 * mf_cu_q8v4_pro_ok) or the shared copy does not fit: the caller then
 * quantizes separately. */
int mf_cu_q8v4_pro_ok(uint32_t wtype, int u, int64_t n_in);
cudaError_t mf_cu_q8v4_launch_pro(const q8_multi *p, uint32_t wtype, bool swiglu, int u, const q8_pro *pro,
                                  int64_t n_in, const q8_rope *rp, cudaStream_t s);

#endif
