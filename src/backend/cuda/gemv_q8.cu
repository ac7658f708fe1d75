/* gemv_q8.cu - decode GEMV (nt <= 8) on int8: y = W x (+ bias) for the
 * quantized weight types, with the activations quantized once per call.
 *
 * Step 1 (q8_quant_kernel): every 32-element unit of every activation row
 * becomes 32 int8 q = rint(x / d), d = amax / 127 (one warp per unit), plus
 * d and the two 16-element sums of q (the weight formats with an offset need
 * them). Layout in the caller's scratch (mf_cu_q8_bytes): nt rows of n_in
 * int8, then nt * n_in / 32 floats d, then as many int32 holding the two
 * int16 half sums.
 *
 * Step 2 (gemv_q8_kernel): each weight type decodes unit u of a row into 32
 * small integers q_w (packed 4 per word, byte l = element l) and two pairs
 * (d_h, m_h) for the halves h = 0, 1 with w_l = d_h q_w,l + m_h. Then
 *   sum_l w_l x_l ~= d_x * sum_h (d_h * dp4a(q_w, q_x)_h + m_h * sumq_x,h)
 * so the inner loop is 8 dp4a per unit and token, no per-element float
 * work. A block is 4 warps; `ks` warps (1, 2 or 4) share one row, each
 * taking every ks-th group of 32 units (enough warps in flight when n_out is
 * small), and every lane decodes U = 2 units before it uses either (two
 * independent loads in flight). Warp sums are reduced by shuffles, then
 * across the ks warps through shared memory.
 *
 * Accuracy: the only error beyond f32 accumulation is the activation
 * rounding, |x - d q| <= d / 2 = amax_unit / 254 per element, so
 * |y - y_f32| <= sum_units amax_unit / 254 * sum_{l in unit} |w_l| (the
 * bound tests/cuda/test_cuda_ops.c checks per output).
 *
 * Weight quant bytes are 2-byte aligned in several formats (18-, 22-, 34-,
 * 110-, 210-byte blocks); they are read as aligned 32-bit words and
 * realigned with a funnel shift (one extra word only when misaligned, which
 * stays inside the block or the weight's 256-byte padding). */
#include <string.h>

#include "backend/cuda/cuda_args.h"
#include "backend/cuda/dequant.cuh"

#define Q8_WARPS 4
#define Q8_U 2

/* ---- activation quantization ------------------------------------------------------- */

static __global__ void __launch_bounds__(256)
q8_quant_kernel(const float *__restrict__ x, int8_t *__restrict__ xq, float *__restrict__ xd,
                int32_t *__restrict__ xs, int64_t n_units_total) {
    const int64_t u = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    const bool valid = u < n_units_total;
    const float v = x[(valid ? u : 0) * 32 + lane]; /* rows are whole units: n_in % 32 == 0 */
    float amax = fabsf(v);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = __float2int_rn(v * id);
    int s = q;
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) /* sums within each 16-lane half */
        s += __shfl_xor_sync(0xffffffffu, s, off);
    const int s_hi = __shfl_sync(0xffffffffu, s, 16);
    if (valid) {
        xq[u * 32 + lane] = (int8_t)q;
        if (lane == 0) {
            xd[u] = d;
            xs[u] = (int32_t)(((uint32_t)s & 0xffffu) | ((uint32_t)s_hi << 16));
        }
    }
}

/* The RMSNorm of each activation row (as norm.cu: sum of squares in double,
 * y = x * sc * w) folded into the quantization above: one block per token
 * row, then each warp quantizes whole units of the normed row. */
static __global__ void __launch_bounds__(256)
q8_norm_quant_kernel(const float *__restrict__ x, const float *__restrict__ w, float eps, int64_t n_in,
                     int8_t *__restrict__ xq, float *__restrict__ xd, int32_t *__restrict__ xs) {
    __shared__ double part[8];
    const int64_t t = blockIdx.x;
    const float *xr = x + t * n_in;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < n_in; i += blockDim.x)
        ss += (double)xr[i] * (double)xr[i];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if (lane == 0)
        part[warp] = ss;
    __syncthreads();
    double tot = 0.0;
    for (int i = 0; i < 8; i++)
        tot += part[i];
    const float sc = (float)(1.0 / sqrt(tot / (double)n_in + (double)eps));
    const int64_t n_units = n_in / 32;
    for (int64_t u = warp; u < n_units; u += 8) { /* whole warps: the shuffles need every lane */
        const int64_t i = u * 32 + lane;
        const float v = w ? xr[i] * sc * w[i] : xr[i] * sc;
        float amax = fabsf(v);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const int q = __float2int_rn(v * id);
        int s = q;
#pragma unroll
        for (int off = 8; off > 0; off >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, off);
        const int s_hi = __shfl_sync(0xffffffffu, s, 16);
        const int64_t gu = t * n_units + u;
        xq[gu * 32 + lane] = (int8_t)q;
        if (lane == 0) {
            xd[gu] = d;
            xs[gu] = (int32_t)(((uint32_t)s & 0xffffu) | ((uint32_t)s_hi << 16));
        }
    }
}

/* ---- weight unit decoders ------------------------------------------------------------- */

/* NW words from p, where p is 2-byte aligned (A = 2) or 4-byte aligned. */
template <int A, int NW>
static __device__ __forceinline__ void ld_words(const uint8_t *p, uint32_t *w) {
    if (A >= 4) {
#pragma unroll
        for (int i = 0; i < NW; i++)
            w[i] = ((const uint32_t *)p)[i];
        return;
    }
    const uintptr_t a = (uintptr_t)p;
    const uint32_t *b = (const uint32_t *)(a & ~(uintptr_t)3);
    uint32_t r[NW + 1];
#pragma unroll
    for (int i = 0; i < NW; i++)
        r[i] = b[i];
    if (a & 2) {
        r[NW] = b[NW];
#pragma unroll
        for (int i = 0; i < NW; i++)
            w[i] = __funnelshift_r(r[i], r[i + 1], 16);
    } else {
#pragma unroll
        for (int i = 0; i < NW; i++)
            w[i] = r[i];
    }
}

template <int NW> static __device__ __forceinline__ void ld16(const uint8_t *p, uint32_t *w) {
#pragma unroll
    for (int i = 0; i < NW / 4; i++) {
        const uint4 v = ((const uint4 *)p)[i];
        w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
    }
}

/* bits 4i .. 4i+3 of h, one per byte, at bit position `at` of each byte */
static __device__ __forceinline__ uint32_t spread4(uint32_t h, int i, int at) {
    const uint32_t b = (h >> (4 * i)) & 0xfu;
    return ((b & 1u) | ((b & 2u) << 7) | ((b & 4u) << 14) | ((b & 8u) << 21)) << at;
}

template <int T> struct q8w;

template <> struct q8w<MF_TYPE_Q4_0> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        const mf_block_q4_0 *b = (const mf_block_q4_0 *)row + u;
        uint32_t w[4];
        ld_words<2, 4>(b->qs, w);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            q[i] = w[i] & 0x0f0f0f0fu;
            q[i + 4] = (w[i] >> 4) & 0x0f0f0f0fu;
        }
        const float d = mf_h2f(b->d);
        dm[0] = dm[1] = make_float2(d, -8.0f * d);
    }
};

template <> struct q8w<MF_TYPE_Q4_1> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        const mf_block_q4_1 *b = (const mf_block_q4_1 *)row + u;
        uint32_t w[4];
        ld_words<4, 4>(b->qs, w); /* 20-byte blocks, qs at 4 */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            q[i] = w[i] & 0x0f0f0f0fu;
            q[i + 4] = (w[i] >> 4) & 0x0f0f0f0fu;
        }
        dm[0] = dm[1] = make_float2(mf_h2f(b->d), mf_h2f(b->m));
    }
};

template <> struct q8w<MF_TYPE_Q5_0> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        const mf_block_q5_0 *b = (const mf_block_q5_0 *)row + u;
        uint32_t w[4], h;
        ld_words<2, 4>(b->qs, w);
        ld_words<2, 1>(b->qh, &h);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            q[i] = (w[i] & 0x0f0f0f0fu) | spread4(h, i, 4);
            q[i + 4] = ((w[i] >> 4) & 0x0f0f0f0fu) | spread4(h, i + 4, 4);
        }
        const float d = mf_h2f(b->d);
        dm[0] = dm[1] = make_float2(d, -16.0f * d);
    }
};

template <> struct q8w<MF_TYPE_Q5_1> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        const mf_block_q5_1 *b = (const mf_block_q5_1 *)row + u;
        uint32_t w[4], h;
        ld_words<4, 4>(b->qs, w); /* 24-byte blocks: qh at 4, qs at 8 */
        ld_words<4, 1>(b->qh, &h);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            q[i] = (w[i] & 0x0f0f0f0fu) | spread4(h, i, 4);
            q[i + 4] = ((w[i] >> 4) & 0x0f0f0f0fu) | spread4(h, i + 4, 4);
        }
        dm[0] = dm[1] = make_float2(mf_h2f(b->d), mf_h2f(b->m));
    }
};

template <> struct q8w<MF_TYPE_Q8_0> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        const mf_block_q8_0 *b = (const mf_block_q8_0 *)row + u;
        ld_words<2, 8>((const uint8_t *)b->qs, q);
        dm[0] = dm[1] = make_float2(mf_h2f(b->d), 0.0f);
    }
};

/* K-quants: unit u is sub-block j = u % 8 of super-block u / 8 (as dequant.cuh) */
template <> struct q8w<MF_TYPE_Q2_K> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        const mf_block_q2_K *b = (const mf_block_q2_K *)row + u / 8;
        const int j = (int)(u % 8);
        uint32_t w[8];
        ld_words<4, 8>(b->qs + 32 * (j / 4), w); /* 84-byte blocks, qs at 16 */
        const int shift = 2 * (j % 4);
#pragma unroll
        for (int i = 0; i < 8; i++)
            q[i] = (w[i] >> shift) & 0x03030303u;
        const float d = mf_h2f(b->d), dmin = mf_h2f(b->dmin);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint8_t sc = b->scales[2 * j + h];
            dm[h] = make_float2(d * (float)(sc & 0x0f), -dmin * (float)(sc >> 4));
        }
    }
};

template <> struct q8w<MF_TYPE_Q3_K> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        const mf_block_q3_K *b = (const mf_block_q3_K *)row + u / 8;
        const int j = (int)(u % 8);
        uint32_t w[8], hm[8];
        ld_words<2, 8>(b->qs + 32 * (j / 4), w); /* 110-byte blocks */
        ld_words<2, 8>(b->hmask, hm);
        const int shift = 2 * (j % 4);
        /* v = low2 - 4 * !hbit  ==  (low2 + 4 * hbit) - 4 */
#pragma unroll
        for (int i = 0; i < 8; i++)
            q[i] = ((w[i] >> shift) & 0x03030303u) | (((hm[i] >> j) & 0x01010101u) << 2);
        const float d = mf_h2f(b->d);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float dl = d * (float)mf_deq<MF_TYPE_Q3_K>::scale(b->scales, 2 * j + h);
            dm[h] = make_float2(dl, -4.0f * dl);
        }
    }
};

template <> struct q8w<MF_TYPE_Q4_K> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        const mf_block_q4_K *b = (const mf_block_q4_K *)row + u / 8;
        const int j = (int)(u % 8);
        uint32_t w[8];
        ld16<8>(b->qs + 32 * (j / 2), w); /* 144-byte blocks, qs at 16 */
        const int shift = 4 * (j % 2);
#pragma unroll
        for (int i = 0; i < 8; i++)
            q[i] = (w[i] >> shift) & 0x0f0f0f0fu;
        int sc, m;
        mf_k4_scale_min(b->scales, j, &sc, &m);
        dm[0] = dm[1] = make_float2(mf_h2f(b->d) * (float)sc, -mf_h2f(b->dmin) * (float)m);
    }
};

template <> struct q8w<MF_TYPE_Q5_K> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        const mf_block_q5_K *b = (const mf_block_q5_K *)row + u / 8;
        const int j = (int)(u % 8);
        uint32_t w[8], hw[8];
        ld16<8>(b->qs + 32 * (j / 2), w); /* 176-byte blocks: qh at 16, qs at 48 */
        ld16<8>(b->qh, hw);
        const int shift = 4 * (j % 2);
#pragma unroll
        for (int i = 0; i < 8; i++)
            q[i] = ((w[i] >> shift) & 0x0f0f0f0fu) | (((hw[i] >> j) & 0x01010101u) << 4);
        int sc, m;
        mf_k4_scale_min(b->scales, j, &sc, &m);
        dm[0] = dm[1] = make_float2(mf_h2f(b->d) * (float)sc, -mf_h2f(b->dmin) * (float)m);
    }
};

template <> struct q8w<MF_TYPE_Q6_K> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, uint32_t *q, float2 *dm) {
        const mf_block_q6_K *b = (const mf_block_q6_K *)row + u / 8;
        const int j = (int)(u % 8);
        const int half = j / 4, g = j % 4;
        uint32_t lw[8], hw[8];
        ld_words<2, 8>(b->ql + 64 * half + 32 * (g & 1), lw); /* 210-byte blocks */
        ld_words<2, 8>(b->qh + 32 * half, hw);
        const int lshift = 4 * (g >> 1), hshift = 2 * g;
#pragma unroll
        for (int i = 0; i < 8; i++)
            q[i] = ((lw[i] >> lshift) & 0x0f0f0f0fu) | (((hw[i] >> hshift) & 0x03030303u) << 4);
        const float d = mf_h2f(b->d);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float dl = d * (float)b->scales[2 * j + h];
            dm[h] = make_float2(dl, -32.0f * dl);
        }
    }
};

/* ---- the GEMV --------------------------------------------------------------------------- */

/* One warp's partial dot products of `row` (units kp*32+lane, stepping by
 * 32*ks) with NT tokens from t0 (ntok valid), accumulated into acc. Shared
 * by gemv_q8_kernel and gemv_q8_multi_kernel. */
template <int T, int NT>
static __device__ __forceinline__ void q8_row_dot(const uint8_t *row, const int8_t *__restrict__ xq,
                                                  const float *__restrict__ xd,
                                                  const int32_t *__restrict__ xs, int64_t n_units,
                                                  int64_t t0, int ntok, int kp, int ks, int lane,
                                                  float *acc) {
    const int64_t step = 32 * (int64_t)ks;
    for (int64_t u0 = 32 * (int64_t)kp + lane; u0 < n_units; u0 += step * Q8_U) {
        uint32_t q[Q8_U][8];
        float2 dm[Q8_U][2];
#pragma unroll
        for (int k = 0; k < Q8_U; k++) {
            const int64_t u = u0 + k * step;
            /* a unit past the row decodes unit u0 again and is skipped below */
            q8w<T>::unit(row, u < n_units ? u : u0, q[k], dm[k]);
        }
#pragma unroll
        for (int k = 0; k < Q8_U; k++) {
            const int64_t u = u0 + k * step;
            if (u >= n_units)
                break;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < ntok) {
                    const int64_t xu = (t0 + t) * n_units + u;
                    const int4 *xp = (const int4 *)(xq + xu * 32);
                    const int4 a = xp[0], c = xp[1];
                    int s0 = __dp4a((int)q[k][0], a.x, 0);
                    s0 = __dp4a((int)q[k][1], a.y, s0);
                    s0 = __dp4a((int)q[k][2], a.z, s0);
                    s0 = __dp4a((int)q[k][3], a.w, s0);
                    int s1 = __dp4a((int)q[k][4], c.x, 0);
                    s1 = __dp4a((int)q[k][5], c.y, s1);
                    s1 = __dp4a((int)q[k][6], c.z, s1);
                    s1 = __dp4a((int)q[k][7], c.w, s1);
                    const int32_t hs = xs[xu];
                    const float sx0 = (float)(int16_t)(hs & 0xffff), sx1 = (float)(int16_t)(hs >> 16);
                    const float r = dm[k][0].x * (float)s0 + dm[k][0].y * sx0 + dm[k][1].x * (float)s1 +
                                    dm[k][1].y * sx1;
                    acc[t] += xd[xu] * r;
                }
            }
        }
    }
}

/* Sums acc over the warp's lanes, then over the ks warps of the row through
 * part (which the caller owns; one __syncthreads inside, reached by every
 * thread of the block). The row's first warp ends with the totals in acc. */
template <int NT>
static __device__ __forceinline__ void q8_reduce(float *acc, float (*part)[NT], int lane, int warp,
                                                 int ks) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = acc[t];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, off);
        acc[t] = s;
    }
    if (ks > 1) {
        if (lane == 0)
#pragma unroll
            for (int t = 0; t < NT; t++)
                part[warp][t] = acc[t];
        __syncthreads();
        if (warp % ks == 0)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float s = 0.0f;
                for (int k = 0; k < ks; k++)
                    s += part[warp + k][t];
                acc[t] = s;
            }
    }
}

/* NT: tokens per launch row of the grid (1, or 8 with the tail predicated).
 * Grid: x = row groups of (Q8_WARPS / ks) rows, y = token groups of NT. */
template <int T, int NT>
static __global__ void __launch_bounds__(32 * Q8_WARPS)
gemv_q8_kernel(const uint8_t *__restrict__ w, uint64_t row_bytes, const int8_t *__restrict__ xq,
               const float *__restrict__ xd, const int32_t *__restrict__ xs,
               const float *__restrict__ bias, float *__restrict__ y, int64_t n_in, int64_t n_out,
               int64_t nt, int ks) {
    __shared__ float part[Q8_WARPS][NT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rpb = Q8_WARPS / ks;
    const int64_t o = (int64_t)blockIdx.x * rpb + warp / ks;
    const int kp = warp % ks;
    const int64_t t0 = (int64_t)blockIdx.y * NT;
    const bool valid = o < n_out;
    const uint8_t *row = w + (uint64_t)(valid ? o : 0) * row_bytes;
    const int64_t n_units = n_in / 32;
    const int ntok = (int)min((int64_t)NT, nt - t0);

    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;

    /* an invalid warp computes on row 0, stores nothing, and still reaches
     * the __syncthreads in q8_reduce */
    q8_row_dot<T, NT>(row, xq, xd, xs, n_units, t0, ntok, kp, ks, lane, acc);
    q8_reduce<NT>(acc, part, lane, warp, ks);
    if (kp != 0)
        return;
    if (valid && lane == 0) {
        const float b = bias ? bias[o] : 0.0f;
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < ntok)
                y[(t0 + t) * n_out + o] = acc[t] + b;
    }
}

template <int T> static cudaError_t launch_q8(const mf_cu_matmul_args *a, cudaStream_t s) {
    const int64_t n_units = a->n_in / 32;
    int8_t *xq = (int8_t *)a->q8;
    float *xd = (float *)(xq + a->nt * a->n_in);
    int32_t *xs = (int32_t *)(xd + a->nt * n_units);
    const int64_t total = a->nt * n_units;
    q8_quant_kernel<<<(unsigned)((total + 7) / 8), 256, 0, s>>>(a->x, xq, xd, xs, total);
    /* warps per row: enough warps in flight for narrow outputs (k/v
     * projections), never more than the row has 32-unit groups for */
    int ks = 1;
    while (ks < Q8_WARPS && a->n_out * ks < 16384 && n_units >= 64 * (int64_t)ks)
        ks *= 2;
    const int rpb = Q8_WARPS / ks;
    dim3 grid((unsigned)((a->n_out + rpb - 1) / rpb), 1);
    const uint8_t *w = (const uint8_t *)a->w;
    if (a->nt == 1) {
        gemv_q8_kernel<T, 1><<<grid, 32 * Q8_WARPS, 0, s>>>(w, a->row_bytes, xq, xd, xs, a->bias, a->y,
                                                           a->n_in, a->n_out, a->nt, ks);
    } else {
        grid.y = (unsigned)((a->nt + 7) / 8);
        gemv_q8_kernel<T, 8><<<grid, 32 * Q8_WARPS, 0, s>>>(w, a->row_bytes, xq, xd, xs, a->bias, a->y,
                                                           a->n_in, a->n_out, a->nt, ks);
    }
    return cudaGetLastError();
}

/* ---- the fused multi-weight GEMV (MINFER_CUDA_FUSE_GEMV) ------------------------------ */

/* Per-launch description of up to 3 weights of one type sharing the input:
 * the rows of all weights form one row space (start[i] = first row of
 * weight i), so Q, K and V (or gate and up) are one launch after one
 * activation quantization. SWIGLU: two weights of n_out rows, and row o
 * computes both dots and writes y[0] = silu(W0 x) * (W1 x). */
typedef struct q8_multi {
    const uint8_t *w[3];
    uint64_t row_bytes[3];
    const float *bias[3];
    const float *res[3]; /* residual added in the epilogue; may equal y */
    float *y[3];
    int64_t n_out[3];
    int64_t start[4];
    int32_t n_w;
} q8_multi;

/* Q4_K, paired (MINFER_CUDA_GEMV_V2): units 2p and 2p+1 of a super-block
 * are the low and high nibbles of the same 32 qs bytes, so each lane takes
 * pair p, loads the 32 bytes once (two 16-byte loads) and runs both units'
 * dp4a from them: half the weight loads and scale decodes of q8_row_dot,
 * and two pairs (four units) in flight per lane. Same arithmetic per unit. */
template <int NT>
static __device__ __forceinline__ void q4k_pair_dot(const uint8_t *row, const int8_t *__restrict__ xq,
                                                    const float *__restrict__ xd,
                                                    const int32_t *__restrict__ xs, int64_t n_units,
                                                    int64_t t0, int ntok, int kp, int ks, int lane,
                                                    float *acc) {
    const int64_t n_pairs = n_units / 2; /* n_in % 256 == 0: whole super-blocks */
    const int64_t step = 32 * (int64_t)ks;
    for (int64_t p0 = 32 * (int64_t)kp + lane; p0 < n_pairs; p0 += step * 2) {
        uint32_t w[2][8];
        float2 dm[2][2]; /* [pair in flight][unit of the pair] */
#pragma unroll
        for (int k = 0; k < 2; k++) {
            int64_t pp = p0 + k * step;
            pp = pp < n_pairs ? pp : p0; /* decoded again and skipped below */
            const mf_block_q4_K *b = (const mf_block_q4_K *)row + pp / 4;
            const int jp = (int)(pp % 4);
            ld16<8>(b->qs + 32 * jp, w[k]);
            const float d = mf_h2f(b->d), dmin = mf_h2f(b->dmin);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int sc, m;
                mf_k4_scale_min(b->scales, 2 * jp + h, &sc, &m);
                dm[k][h] = make_float2(d * (float)sc, -dmin * (float)m);
            }
        }
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int64_t pp = p0 + k * step;
            if (pp >= n_pairs)
                break;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < ntok) {
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int64_t xu = (t0 + t) * n_units + 2 * pp + h;
                        const int4 *xp = (const int4 *)(xq + xu * 32);
                        const int4 a = xp[0], c = xp[1];
                        const int sh = 4 * h;
                        int s = __dp4a((int)((w[k][0] >> sh) & 0x0f0f0f0fu), a.x, 0);
                        s = __dp4a((int)((w[k][1] >> sh) & 0x0f0f0f0fu), a.y, s);
                        s = __dp4a((int)((w[k][2] >> sh) & 0x0f0f0f0fu), a.z, s);
                        s = __dp4a((int)((w[k][3] >> sh) & 0x0f0f0f0fu), a.w, s);
                        s = __dp4a((int)((w[k][4] >> sh) & 0x0f0f0f0fu), c.x, s);
                        s = __dp4a((int)((w[k][5] >> sh) & 0x0f0f0f0fu), c.y, s);
                        s = __dp4a((int)((w[k][6] >> sh) & 0x0f0f0f0fu), c.z, s);
                        s = __dp4a((int)((w[k][7] >> sh) & 0x0f0f0f0fu), c.w, s);
                        const int32_t hs = xs[xu];
                        const float sx = (float)(int16_t)(hs & 0xffff) + (float)(int16_t)(hs >> 16);
                        acc[t] += xd[xu] * (dm[k][h].x * (float)s + dm[k][h].y * sx);
                    }
                }
            }
        }
    }
}

/* Grid: x = groups of (Q8_WARPS / ks) rows of the joint row space (SWIGLU:
 * of weight 0), y = token groups of NT. */
template <int T, int NT, bool V2>
static __device__ __forceinline__ void q8_dot_any(const uint8_t *row, const int8_t *xq, const float *xd,
                                                  const int32_t *xs, int64_t n_units, int64_t t0, int ntok,
                                                  int kp, int ks, int lane, float *acc) {
    if constexpr (V2)
        q4k_pair_dot<NT>(row, xq, xd, xs, n_units, t0, ntok, kp, ks, lane, acc);
    else
        q8_row_dot<T, NT>(row, xq, xd, xs, n_units, t0, ntok, kp, ks, lane, acc);
}

template <int T, int NT, bool SWIGLU, bool V2>
static __global__ void __launch_bounds__(32 * Q8_WARPS)
gemv_q8_multi_kernel(q8_multi p, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                     const int32_t *__restrict__ xs, int64_t n_in, int64_t nt, int ks) {
    __shared__ float part[2][Q8_WARPS][NT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rpb = Q8_WARPS / ks;
    const int64_t r = (int64_t)blockIdx.x * rpb + warp / ks;
    const int kp = warp % ks;
    const int64_t t0 = (int64_t)blockIdx.y * NT;
    const int64_t n_units = n_in / 32;
    const int ntok = (int)min((int64_t)NT, nt - t0);
    const bool valid = r < p.start[p.n_w];
    int wi = 0;
    while (wi + 1 < p.n_w && r >= p.start[wi + 1])
        wi++;
    const int64_t o = valid ? r - p.start[wi] : 0;

    float acc[NT], acc2[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = acc2[t] = 0.0f;
    if (valid) /* an invalid warp still reaches the __syncthreads in q8_reduce */
        q8_dot_any<T, NT, V2>(p.w[wi] + (uint64_t)o * p.row_bytes[wi], xq, xd, xs, n_units, t0, ntok, kp,
                              ks, lane, acc);
    if (SWIGLU && valid)
        q8_dot_any<T, NT, V2>(p.w[1] + (uint64_t)o * p.row_bytes[1], xq, xd, xs, n_units, t0, ntok, kp, ks,
                              lane, acc2);
    q8_reduce<NT>(acc, part[0], lane, warp, ks);
    if (SWIGLU)
        q8_reduce<NT>(acc2, part[1], lane, warp, ks);
    if (!valid || lane != 0 || kp != 0)
        return;
    if (SWIGLU) {
        const float bg = p.bias[0] ? p.bias[0][o] : 0.0f, bu = p.bias[1] ? p.bias[1][o] : 0.0f;
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < ntok) {
                const float g = acc[t] + bg;
                p.y[0][(t0 + t) * p.n_out[0] + o] = g / (1.0f + expf(-g)) * (acc2[t] + bu);
            }
        return;
    }
    const float b = p.bias[wi] ? p.bias[wi][o] : 0.0f;
    const float *res = p.res[wi];
#pragma unroll
    for (int t = 0; t < NT; t++)
        if (t < ntok) {
            const int64_t i = (t0 + t) * p.n_out[wi] + o;
            p.y[wi][i] = res ? res[i] + (acc[t] + b) : acc[t] + b; /* the ADD's order: x + Wa */
        }
}

template <int T, bool SWIGLU, bool V2>
static cudaError_t launch_q8_multi(const q8_multi *p, const int8_t *xq, const float *xd,
                                   const int32_t *xs, int64_t n_in, int64_t nt, cudaStream_t s) {
    const int64_t n_units = n_in / 32;
    const int64_t rows = SWIGLU ? p->n_out[0] : p->start[p->n_w];
    int ks = 1;
    while (ks < Q8_WARPS && rows * ks < 16384 && n_units >= 64 * (int64_t)ks)
        ks *= 2;
    const int rpb = Q8_WARPS / ks;
    dim3 grid((unsigned)((rows + rpb - 1) / rpb), 1);
    if (nt == 1) {
        gemv_q8_multi_kernel<T, 1, SWIGLU, V2><<<grid, 32 * Q8_WARPS, 0, s>>>(*p, xq, xd, xs, n_in, nt, ks);
    } else {
        grid.y = (unsigned)((nt + 7) / 8);
        gemv_q8_multi_kernel<T, 8, SWIGLU, V2><<<grid, 32 * Q8_WARPS, 0, s>>>(*p, xq, xd, xs, n_in, nt, ks);
    }
    return cudaGetLastError();
}

#define MF_CU_FOR_EACH_Q8_WTYPE(X) \
    X(MF_TYPE_Q4_0) X(MF_TYPE_Q4_1) X(MF_TYPE_Q5_0) X(MF_TYPE_Q5_1) X(MF_TYPE_Q8_0) \
    X(MF_TYPE_Q2_K) X(MF_TYPE_Q3_K) X(MF_TYPE_Q4_K) X(MF_TYPE_Q5_K) X(MF_TYPE_Q6_K)
#define MF_CU_FOR_EACH_Q8_WTYPE_BUT_Q4_K(X) \
    X(MF_TYPE_Q4_0) X(MF_TYPE_Q4_1) X(MF_TYPE_Q5_0) X(MF_TYPE_Q5_1) X(MF_TYPE_Q8_0) \
    X(MF_TYPE_Q2_K) X(MF_TYPE_Q3_K) X(MF_TYPE_Q5_K) X(MF_TYPE_Q6_K)

extern "C" int mf_cu_q8_supported(uint32_t wtype, int64_t n_in) {
    if (n_in <= 0 || n_in % 32 != 0)
        return 0;
    switch (wtype) {
#define MF_CASE(T) case T:
        MF_CU_FOR_EACH_Q8_WTYPE(MF_CASE)
#undef MF_CASE
        return 1;
    default:
        return 0;
    }
}

extern "C" cudaError_t mf_cu_gemv_q8(const mf_cu_matmul_args *a, cudaStream_t s) {
    if (!a->q8 || a->nt <= 0 || a->nt > 8 || !mf_cu_q8_supported(a->wtype, a->n_in))
        return cudaErrorInvalidValue;
    switch (a->wtype) {
#define MF_CASE(T) \
    case T:        \
        return launch_q8<T>(a, s);
        MF_CU_FOR_EACH_Q8_WTYPE(MF_CASE)
#undef MF_CASE
    default:
        return cudaErrorInvalidValue;
    }
}

/* The fused path: one quantization of x, then one launch over every weight
 * when they share a type (else one launch per weight on the same quantized
 * activations). */
extern "C" cudaError_t mf_cu_gemv_q8_multi(const mf_cu_q8_multi_args *a, cudaStream_t s) {
    if (!a->q8 || a->nt <= 0 || a->nt > 8 || a->n_w < 1 || a->n_w > 3 || (a->swiglu && a->n_w != 2))
        return cudaErrorInvalidValue;
    bool same = true;
    for (int i = 0; i < a->n_w; i++) {
        if (!mf_cu_q8_supported(a->wtype[i], a->n_in) || a->n_out[i] <= 0)
            return cudaErrorInvalidValue;
        same = same && a->wtype[i] == a->wtype[0];
    }
    if (a->swiglu && (!same || a->n_out[1] != a->n_out[0] || a->res[0] || a->res[1]))
        return cudaErrorInvalidValue;
    const int64_t n_units = a->n_in / 32;
    int8_t *xq = (int8_t *)a->q8;
    float *xd = (float *)(xq + a->nt * a->n_in);
    int32_t *xs = (int32_t *)(xd + a->nt * n_units);
    const int64_t total = a->nt * n_units;
    if (a->norm)
        q8_norm_quant_kernel<<<(unsigned)a->nt, 256, 0, s>>>(a->x, a->norm_w, a->norm_eps, a->n_in, xq, xd, xs);
    else
        q8_quant_kernel<<<(unsigned)((total + 7) / 8), 256, 0, s>>>(a->x, xq, xd, xs, total);
    q8_multi p;
    memset(&p, 0, sizeof p);
    int first = 0;
    for (int i = 0; i <= a->n_w; i++) {
        /* a group of consecutive weights of one type becomes one launch */
        if (i < a->n_w && a->wtype[i] == a->wtype[first])
            continue;
        p.n_w = i - first;
        p.start[0] = 0;
        for (int k = 0; k < p.n_w; k++) {
            p.w[k] = (const uint8_t *)a->w[first + k];
            p.row_bytes[k] = a->row_bytes[first + k];
            p.bias[k] = a->bias[first + k];
            p.res[k] = a->res[first + k];
            p.y[k] = a->y[first + k];
            p.n_out[k] = a->n_out[first + k];
            p.start[k + 1] = p.start[k] + p.n_out[k];
        }
        cudaError_t e = cudaErrorInvalidValue;
        switch (a->wtype[first]) {
#define MF_CASE(T)                                                                          \
    case T:                                                                                 \
        e = a->swiglu ? launch_q8_multi<T, true, false>(&p, xq, xd, xs, a->n_in, a->nt, s)  \
                      : launch_q8_multi<T, false, false>(&p, xq, xd, xs, a->n_in, a->nt, s); \
        break;
        case MF_TYPE_Q4_K: /* the paired-unit GEMV when asked (MINFER_CUDA_GEMV_V2) */
            if (a->v2)
                e = a->swiglu ? launch_q8_multi<MF_TYPE_Q4_K, true, true>(&p, xq, xd, xs, a->n_in, a->nt, s)
                              : launch_q8_multi<MF_TYPE_Q4_K, false, true>(&p, xq, xd, xs, a->n_in, a->nt, s);
            else
                e = a->swiglu ? launch_q8_multi<MF_TYPE_Q4_K, true, false>(&p, xq, xd, xs, a->n_in, a->nt, s)
                              : launch_q8_multi<MF_TYPE_Q4_K, false, false>(&p, xq, xd, xs, a->n_in, a->nt, s);
            break;
            MF_CU_FOR_EACH_Q8_WTYPE_BUT_Q4_K(MF_CASE)
#undef MF_CASE
        default:
            break;
        }
        if (e != cudaSuccess)
            return e;
        first = i;
    }
    return cudaGetLastError();
}

#include "backend/cuda/probe.cuh"

extern "C" cudaError_t mf_cu_probe_gemv_q8(size_t smem_limit, const char **bad) {
    MF_PROBE(q8_quant_kernel, 256);
    MF_PROBE(q8_norm_quant_kernel, 256);
#define MF_CASE(T)                                     \
    MF_PROBE((gemv_q8_kernel<T, 1>), 32 * Q8_WARPS);   \
    MF_PROBE((gemv_q8_kernel<T, 8>), 32 * Q8_WARPS);             \
    MF_PROBE((gemv_q8_multi_kernel<T, 1, false, false>), 32 * Q8_WARPS); \
    MF_PROBE((gemv_q8_multi_kernel<T, 8, false, false>), 32 * Q8_WARPS); \
    MF_PROBE((gemv_q8_multi_kernel<T, 1, true, false>), 32 * Q8_WARPS);  \
    MF_PROBE((gemv_q8_multi_kernel<T, 8, true, false>), 32 * Q8_WARPS);
    MF_CU_FOR_EACH_Q8_WTYPE(MF_CASE)
#undef MF_CASE
    MF_PROBE((gemv_q8_multi_kernel<MF_TYPE_Q4_K, 1, false, true>), 32 * Q8_WARPS);
    MF_PROBE((gemv_q8_multi_kernel<MF_TYPE_Q4_K, 8, false, true>), 32 * Q8_WARPS);
    MF_PROBE((gemv_q8_multi_kernel<MF_TYPE_Q4_K, 1, true, true>), 32 * Q8_WARPS);
    MF_PROBE((gemv_q8_multi_kernel<MF_TYPE_Q4_K, 8, true, true>), 32 * Q8_WARPS);
    return cudaSuccess;
}
