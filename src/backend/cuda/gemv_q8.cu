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
 * That is v1. v3 (gemv_q8v3_kernel below: the same unit decoders and
 * arithmetic, two rows per warp, PDL-aware) takes the layer matmuls and v1
 * the vocab-wide lm_head and Q6_K (mf_cu_gemv_v3_wanted, the rule measured
 * on the H200; tune gemv=v1=1 / _V3=1 pick one everywhere), for the
 * single GEMV and the multi-weight launches alike.
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
#include "backend/cuda/gemv_q8.cuh"
#include "backend/cuda/norm.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/q8w.cuh"

#define Q8_U 2

/* ---- activation quantization ------------------------------------------------------- */

/* (q8_unit, the quantization of one 32-element unit, is in gemv_q8.cuh) */

static __global__ void __launch_bounds__(256)
q8_quant_kernel(const float *__restrict__ x, int8_t *__restrict__ xq, float *__restrict__ xd,
                int32_t *__restrict__ xs, int64_t n_units_total) {
    mf_pdl_wait();
    mf_pdl_trigger();
    const int64_t u = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    const bool valid = u < n_units_total;
    const float v = x[(valid ? u : 0) * 32 + lane]; /* rows are whole units: n_in % 32 == 0 */
    q8_unit(v, lane, valid, xq + u * 32, xd + u, xs + u);
}

/* The RMSNorm of each activation row (as norm.cu: sum of squares in double,
 * y = x * sc * w) folded into the quantization: grid (n_units / 8, nt),
 * warp w of block b quantizes unit 8 b + w. Every block recomputes its
 * row's sum of squares exactly as a one-block-per-row kernel does (256 threads, the same per-thread order, the same shuffle and
 * part[] order), so the scale and every output byte are bitwise the same;
 * each thread keeps its own element from that pass (element 256 b + tid is
 * its pass-b read), so the row is read once per block and the weight before
 * the PDL wait. Launch latency for a one-token row drops from ~4 serial unit
 * rounds to one. The row pass issues a thread's loads together (mf_row_ss)
 * and the own element is picked from those registers after the reduction
 * (which keeps the loads one batch). */
static __global__ void __launch_bounds__(256)
q8_norm_quant_wide_kernel(const float *__restrict__ x, const float *__restrict__ w, float eps, int64_t n_in,
                          int8_t *__restrict__ xq, float *__restrict__ xd, int32_t *__restrict__ xs) {
    const int64_t me = (int64_t)blockIdx.x * 256 + threadIdx.x;
    const float wv = w && me < n_in ? w[me] : 1.0f;
    mf_pdl_wait();
    mf_pdl_trigger();
    __shared__ double part[8];
    const int64_t t = blockIdx.y;
    const float *xr = x + t * n_in;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float mine = 0.0f, v[MF_LAT_E];
    const double ss = mf_row_ss<MF_LAT_E>(xr, n_in, threadIdx.x, 256, v);
    const float sc = mf_rms_scale(ss, part, 8, n_in, eps);
    const int64_t n_units = n_in / 32, u = (int64_t)blockIdx.x * 8 + warp;
    if (u >= n_units) /* a whole warp: no shuffle is left short */
        return;
    /* element me is this thread's pass-blockIdx.x element */
    mine = blockIdx.x < MF_LAT_E ? mf_lat_pick(v, (int)blockIdx.x, 0.0f) : xr[me];
    const float y = w ? mine * sc * wv : mine * sc;
    const int64_t gu = t * n_units + u;
    q8_unit(y, lane, true, xq + gu * 32, xd + gu, xs + gu);
}

/* The one-block-per-row form of the norm-quant (for nt > 65535 rows, past
 * the wide form's grid), bitwise equal to it: the same 256 threads and
 * per-thread element order (mf_row_ss), so the same scale; a thread's row
 * loads are issued MF_LAT_E at once. In the
 * one-block form element tid + 256 k is unit warp + 8 k's lane element, so
 * the quantization runs from the registers. Weights are read before the PDL
 * wait. */
static __global__ void __launch_bounds__(256)
q8_norm_quant_lat_kernel(const float *__restrict__ x, const float *__restrict__ w, float eps, int64_t n_in,
                         int8_t *__restrict__ xq, float *__restrict__ xd, int32_t *__restrict__ xs) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    float wv[MF_LAT_E];
#pragma unroll
    for (int k = 0; k < MF_LAT_E; k++) {
        const int64_t i = tid + (int64_t)k * 256;
        wv[k] = w && i < n_in ? w[i] : 1.0f;
    }
    mf_pdl_wait();
    mf_pdl_trigger();
    __shared__ double part[8];
    const int64_t t = blockIdx.x;
    const float *xr = x + t * n_in;
    float v[MF_LAT_E];
    const double ss = mf_row_ss<MF_LAT_E>(xr, n_in, tid, 256, v);
    const float sc = mf_rms_scale(ss, part, 8, n_in, eps);
    const int64_t n_units = n_in / 32;
#pragma unroll
    for (int k = 0; k < MF_LAT_E; k++) {
        const int64_t u = warp + 8 * k; /* whole warps: the shuffles need every lane */
        if (u < n_units) {
            const float y = w ? v[k] * sc * wv[k] : v[k] * sc;
            const int64_t gu = t * n_units + u;
            q8_unit(y, lane, true, xq + gu * 32, xd + gu, xs + gu);
        }
    }
    for (int64_t u = warp + 8 * MF_LAT_E; u < n_units; u += 8) { /* rows past the registers */
        const int64_t i = u * 32 + lane;
        const float y = w ? xr[i] * sc * w[i] : xr[i] * sc;
        const int64_t gu = t * n_units + u;
        q8_unit(y, lane, true, xq + gu * 32, xd + gu, xs + gu);
    }
}

static int64_t q8_quant_launches; /* mf_cu_q8_quant_count */

extern "C" int64_t mf_cu_q8_quant_count(void) {
    return q8_quant_launches;
}

/* The activation quantization of `total` units (q8_quant_kernel). */
static cudaError_t launch_quant(const float *x, int8_t *xq, float *xd, int32_t *xs, int64_t total, bool pdl,
                                cudaStream_t s) {
    q8_quant_launches++;
    return mf_launch(q8_quant_kernel, dim3((unsigned)((total + 7) / 8)), dim3(256), 0, s, pdl, x, xq, xd, xs,
                     total);
}

/* The RMSNorm'ed quantization of nt rows of n_in (the wide kernel while
 * the rows fit its grid). */
static cudaError_t launch_norm_quant(const float *x, const float *w, float eps, int64_t n_in, int64_t nt,
                                     int8_t *xq, float *xd, int32_t *xs, bool pdl, cudaStream_t s) {
    if (nt <= 65535)
        return mf_launch(q8_norm_quant_wide_kernel, dim3((unsigned)((n_in / 32 + 7) / 8), (unsigned)nt), dim3(256), 0, s, pdl, x, w, eps, n_in, xq,
                         xd, xs);
    return mf_launch(q8_norm_quant_lat_kernel, dim3((unsigned)nt), dim3(256), 0, s, pdl, x, w, eps, n_in, xq, xd, xs);
}

extern "C" cudaError_t mf_cu_q8_quant_rows(const float *x, const float *w, float eps, int norm, int64_t n_in,
                                           int64_t nt, void *q8, int pdl, cudaStream_t s) {
    if (nt <= 0 || n_in <= 0 || n_in % 32 != 0)
        return cudaErrorInvalidValue;
    int8_t *xq = (int8_t *)q8;
    float *xd = (float *)(xq + nt * n_in);
    int32_t *xs = (int32_t *)(xd + nt * (n_in / 32));
    return norm ? launch_norm_quant(x, w, eps, n_in, nt, xq, xd, xs, pdl != 0, s)
                : launch_quant(x, xq, xd, xs, nt * (n_in / 32), pdl != 0, s);
}

/* The activation input of one int8 GEMV call: the f32 rows, the global
 * scratch, and whether the quantization has been launched yet (q8_src_ready
 * launches it before the call's first GEMV launch). */
typedef struct q8_src {
    const float *x, *nw;
    float eps;
    int norm;
    bool quantized;
    bool pdl;
    int8_t *xq;
    float *xd;
    int32_t *xs;
    int64_t n_in, nt;
} q8_src;

static cudaError_t q8_src_ready(q8_src *in, cudaStream_t s) {
    if (in->quantized)
        return cudaSuccess;
    in->quantized = true;
    return in->norm ? launch_norm_quant(in->x, in->nw, in->eps, in->n_in, in->nt, in->xq, in->xd, in->xs, in->pdl, s)
                    : launch_quant(in->x, in->xq, in->xd, in->xs, in->nt * (in->n_in / 32), in->pdl, s);
}

static bool q8_overlap(const void *a, size_t an, const void *b, size_t bn) {
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return a && b && x < y + bn && y < x + an;
}

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
                    /* q8_unit_dot's arithmetic, written out: this load order
                     * is the code the H200 runs validated and timed */
                    int s0, s1;
                    q8_unit_isum(q[k], a, c, s0, s1);
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

template <int T> static cudaError_t launch_q8(const mf_cu_matmul_args *a, q8_src *in, cudaStream_t s) {
    const int64_t n_units = a->n_in / 32;
    int8_t *xq = in->xq;
    float *xd = in->xd;
    int32_t *xs = in->xs;
    /* warps per row: enough warps in flight for narrow outputs (k/v
     * projections), never more than the row has 32-unit groups for */
    int ks = 1;
    while (ks < Q8_WARPS && a->n_out * ks < 16384 && n_units >= 64 * (int64_t)ks)
        ks *= 2;
    const int rpb = Q8_WARPS / ks;
    dim3 grid((unsigned)((a->n_out + rpb - 1) / rpb), 1);
    const uint8_t *w = (const uint8_t *)a->w;
    if (a->nt > 1)
        grid.y = (unsigned)((a->nt + 7) / 8);
    if (const cudaError_t qe = q8_src_ready(in, s))
        return qe;
    void (*k)(const uint8_t *, uint64_t, const int8_t *, const float *, const int32_t *, const float *, float *,
              int64_t, int64_t, int64_t, int) = a->nt == 1 ? gemv_q8_kernel<T, 1> : gemv_q8_kernel<T, 8>;
    k<<<grid, 32 * Q8_WARPS, 0, s>>>(w, a->row_bytes, xq, xd, xs, a->bias, a->y, a->n_in, a->n_out, a->nt, ks);
    return cudaGetLastError();
}

/* ---- the multi-weight v1 GEMV ---------------------------------------------------------- */

/* Grid: x = groups of (Q8_WARPS / ks) rows of the joint row space (SWIGLU:
 * of weight 0), y = token groups of NT. */
template <int T, int NT, bool SWIGLU>
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
    const uint8_t *row0 = p.w[wi] + (uint64_t)o * p.row_bytes[wi];
    const uint8_t *row1 = p.w[SWIGLU ? 1 : wi] + (uint64_t)o * p.row_bytes[SWIGLU ? 1 : wi];
    if (valid) /* an invalid warp still reaches the __syncthreads in q8_reduce */
        q8_row_dot<T, NT>(row0, xq, xd, xs, n_units, t0, ntok, kp, ks, lane, acc);
    if (SWIGLU && valid)
        q8_row_dot<T, NT>(row1, xq, xd, xs, n_units, t0, ntok, kp, ks, lane, acc2);
    q8_reduce<NT>(acc, part[0], lane, warp, ks);
    if (SWIGLU)
        q8_reduce<NT>(acc2, part[1], lane, warp, ks);
    if (!valid || lane != 0 || kp != 0)
        return;
    if (SWIGLU)
        q8_swiglu_store<NT>(p, o, acc, acc2, t0, ntok);
    else
        q8_row_store<NT>(p, wi, o, acc, t0, ntok);
}

template <int T, bool SWIGLU>
static cudaError_t launch_q8_multi(const q8_multi *p, q8_src *in, int64_t n_in, int64_t nt, cudaStream_t s) {
    const int8_t *xq = in->xq;
    const float *xd = in->xd;
    const int32_t *xs = in->xs;
    const int64_t n_units = n_in / 32;
    const int64_t rows = SWIGLU ? p->n_out[0] : p->start[p->n_w];
    int ks = 1;
    while (ks < Q8_WARPS && rows * ks < 16384 && n_units >= 64 * (int64_t)ks)
        ks *= 2;
    const int rpb = Q8_WARPS / ks;
    dim3 grid((unsigned)((rows + rpb - 1) / rpb), 1);
    if (nt > 1)
        grid.y = (unsigned)((nt + 7) / 8);
    if (const cudaError_t qe = q8_src_ready(in, s))
        return qe;
    void (*k)(q8_multi, const int8_t *, const float *, const int32_t *, int64_t, int64_t, int) =
        nt == 1 ? gemv_q8_multi_kernel<T, 1, SWIGLU> : gemv_q8_multi_kernel<T, 8, SWIGLU>;
    k<<<grid, 32 * Q8_WARPS, 0, s>>>(*p, xq, xd, xs, n_in, nt, ks);
    return cudaGetLastError();
}

/* ---- GEMV v3 (the layer matmuls; tune gemv=v1=1 restores the kernels above) ---- */

/* Why a third kernel. v1 keeps the weight bytes it waits for in registers:
 * two units per lane, decoded, is ~36 warps x 2 units x ~20 bytes = ~23 to
 * 36 KB in flight per SM, at or under Little's law for ~4.3 TB/s (~36 KB
 * per SM at ~1 us), and a wider register window spills (measured: 4 units x
 * 2 rows needs > 80 registers for the K-quants). And each row re-reads its
 * activation unit (32 int8 + d + sums = 40 bytes), more than the weight
 * unit itself (18 bytes for Q4_K, 26 for Q6_K).
 *
 * So v3 (1) consumes one 32-unit group (1024 elements) of each of its rows
 * an iteration; (2) gives a warp R = 2 rows (two consecutive rows of the
 * joint row space, or the gate and up rows of one SwiGLU output) so every
 * activation load feeds both; (3) with PDL, lanes 0..R-1 ask L2 for the
 * first group (TMA bulk prefetch, cp.async.bulk.prefetch.L2, sm_90) before
 * mf_pdl_wait() (weights are never written by a kernel), so it streams in
 * while the kernel before still runs (prefetching groups further ahead
 * measured slower, docs/PERF.md); (4) at nt == 1 issues the activation
 * loads before the weight loads, so the two latencies overlap. The
 * arithmetic per unit is v1's exactly (8 dp4a, the half sums, one fma per
 * unit and token); only the f32 summation order across warps can differ.
 * Grid: x = groups of (Q8_WARPS / ks) row pairs, y = token groups of NT;
 * ks warps split a row pair's 32-unit groups (warp kp takes groups kp,
 * kp + ks, ...) when there are few row pairs. */
#define Q8V3_R Q8_PAIR_R

/* bytes [s, e) of a weight into L2, widened to 16-byte bounds (a weight's
 * upload is 256-byte aligned and padded, so the widening stays inside it) */
static __device__ __forceinline__ void q8v3_prefetch(const uint8_t *s, const uint8_t *e) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const size_t a = __cvta_generic_to_global(s) & ~(size_t)15;
    const size_t b = (__cvta_generic_to_global(e) + 15) & ~(size_t)15;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"((uint32_t)(b - a)));
#else
    (void)s;
    (void)e;
#endif
}

/* Registers: at 64 (8 blocks per SM) the K-quants from Q3_K on spill at
 * nt 1 (two rows of raw words for their funnel-shift decode), so they get
 * 80 (6 blocks); nt 8 keeps 8 accumulators per row (4 blocks). */
template <int T, int NT, bool SWIGLU>
static __global__ void __launch_bounds__(32 * Q8_WARPS, NT == 1 ? (T >= MF_TYPE_Q3_K && T <= MF_TYPE_Q6_K ? 6 : 8) : 4)
gemv_q8v3_kernel(q8_multi p, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                 const int32_t *__restrict__ xs, int64_t n_in, int64_t nt, int ks) {
    constexpr int R = Q8V3_R;
    __shared__ float part[Q8_WARPS][R * NT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t g = (int64_t)blockIdx.x * (Q8_WARPS / ks) + warp / ks;
    const int kp = warp % ks;
    const int64_t t0 = (int64_t)blockIdx.y * NT;
    const int64_t n_units = n_in / 32, n_grp = (n_units + 31) / 32;
    const int ntok = (int)min((int64_t)NT, nt - t0);
    const int64_t total = SWIGLU ? p.n_out[0] : p.start[p.n_w];

    const uint8_t *row[R], *end[R];
    uint32_t gb[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        int w;
        const int64_t o = q8_pair_row<SWIGLU>(p, g, r, total, &w);
        row[r] = p.w[w] + (uint64_t)(o < 0 ? 0 : o) * p.row_bytes[w]; /* past the end: row 0, no store */
        end[r] = row[r] + p.row_bytes[w];
        /* a 32-unit group is 1024 elements: row_bytes * 32 / n_units bytes, exact for every type */
        gb[r] = (uint32_t)(p.row_bytes[w] * 32 / (uint64_t)n_units);
    }
    /* row r's first group, by lane r (TMA bulk): weights only, allowed
     * before the wait */
    if (kp < n_grp) {
#pragma unroll
        for (int r = 0; r < R; r++)
            if (lane == r) {
                const uint8_t *s = row[r] + (uint64_t)kp * gb[r];
                const uint8_t *e = s + gb[r] < end[r] ? s + gb[r] : end[r];
                q8v3_prefetch(s, e);
            }
    }
    mf_pdl_wait();
    mf_pdl_trigger();

    float acc[R * NT];
#pragma unroll
    for (int i = 0; i < R * NT; i++)
        acc[i] = 0.0f;
    /* the dot loop over activations xq / xd / xs whose token 0 is tx */
    auto dots = [&](const int8_t *__restrict__ qx, const float *__restrict__ qd, const int32_t *__restrict__ qs,
                    int64_t tx) {
        int64_t u = 32 * (int64_t)kp + lane;
        for (int64_t i = 0; kp + i * ks < n_grp; i++, u += 32 * (int64_t)ks) { /* warp-uniform */
            if (u >= n_units)
                continue;
            int4 a0 = {}, c0 = {};
            int32_t hs0 = 0;
            float dx0 = 0.0f;
            if constexpr (NT == 1) { /* the activation in flight together with the weights */
                const int64_t xu = tx * n_units + u;
                const int4 *xp = (const int4 *)(qx + xu * 32);
                a0 = xp[0];
                c0 = xp[1];
                hs0 = qs[xu];
                dx0 = qd[xu];
            }
            uint32_t q[R][8];
            float2 dm[R][2];
#pragma unroll
            for (int r = 0; r < R; r++)
                q8w<T>::unit(row[r], u, q[r], dm[r]);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < ntok) {
                    int4 a = a0, c = c0;
                    int32_t hs = hs0;
                    float dx = dx0;
                    if constexpr (NT != 1) {
                        const int64_t xu = (tx + t) * n_units + u;
                        const int4 *xp = (const int4 *)(qx + xu * 32);
                        a = xp[0];
                        c = xp[1];
                        hs = qs[xu];
                        dx = qd[xu];
                    }
                    const float sx0 = (float)(int16_t)(hs & 0xffff), sx1 = (float)(int16_t)(hs >> 16);
#pragma unroll
                    for (int r = 0; r < R; r++)
                        acc[r * NT + t] += dx * q8_unit_dot(q[r], a, c, dm[r], sx0, sx1);
                }
            }
        }
    };
    dots(xq, xd, xs, t0);
    q8_reduce<R * NT>(acc, part, lane, warp, ks);
    if (lane != 0 || kp != 0)
        return;
    q8_pair_store<SWIGLU, NT>(p, g, total, acc, t0, ntok);
}

static_assert(MF_TYPE_Q6_K < MF_CU_OCC_INST, "mf_cu_gemv_occ.v3 holds every v3 type");

/* Blocks per SM of each v3 kernel into o->v3 (mf_cu_gemv_occupancy). */
template <int T> static void q8v3_occupancy(mf_cu_gemv_occ *o) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_q8v3_kernel<T, 1, false>, 32 * Q8_WARPS, 0) == cudaSuccess)
        o->v3[T][0][0] = n;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_q8v3_kernel<T, 8, false>, 32 * Q8_WARPS, 0) == cudaSuccess)
        o->v3[T][1][0] = n;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_q8v3_kernel<T, 1, true>, 32 * Q8_WARPS, 0) == cudaSuccess)
        o->v3[T][0][1] = n;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_q8v3_kernel<T, 8, true>, 32 * Q8_WARPS, 0) == cudaSuccess)
        o->v3[T][1][1] = n;
}

/* ks (warps per row pair, each taking every ks-th 32-unit group): doubled
 * while every warp still gets a group and the grid still fits one wave of
 * resident blocks. A second, partial wave would run a whole block lifetime
 * (a whole row) at low parallelism; one wave of fewer, longer warps keeps
 * the prefetched stream going instead. Narrow outputs (k/v, the 0.5B
 * projections) get more warps per row, wide ones (FFN, lm_head: many
 * waves anyway) one. */
template <int T, bool SWIGLU>
static cudaError_t launch_q8v3(const mf_cu_gemv_tune *g, const q8_multi *p, q8_src *in, int64_t n_in, int64_t nt,
                               cudaStream_t s) {
    const int8_t *xq = in->xq;
    const float *xd = in->xd;
    const int32_t *xs = in->xs;
    const int64_t n_units = n_in / 32, n_grp = (n_units + 31) / 32;
    const int64_t rows = SWIGLU ? p->n_out[0] : p->start[p->n_w];
    const int64_t pairs = SWIGLU ? rows : (rows + Q8V3_R - 1) / Q8V3_R;
    const int bps = g->occ ? g->occ->v3[T][nt > 1][SWIGLU] : 0;
    const int64_t wave = (int64_t)(g->sms > 0 ? g->sms : 1) * (bps > 0 ? bps : 6);
    int ks = 1;
    while (ks < Q8_WARPS && n_grp >= 2 * ks && (pairs * 2 * ks + Q8_WARPS - 1) / Q8_WARPS <= wave)
        ks *= 2;
    const int ppb = Q8_WARPS / ks;
    dim3 grid((unsigned)((pairs + ppb - 1) / ppb), 1);
    if (nt > 1)
        grid.y = (unsigned)((nt + 7) / 8);
    if (const cudaError_t qe = q8_src_ready(in, s))
        return qe;
    if (nt == 1)
        return mf_launch(gemv_q8v3_kernel<T, 1, SWIGLU>, grid, dim3(32 * Q8_WARPS), 0, s, g->pdl, *p, xq, xd, xs,
                         n_in, nt, ks);
    return mf_launch(gemv_q8v3_kernel<T, 8, SWIGLU>, grid, dim3(32 * Q8_WARPS), 0, s, g->pdl, *p, xq, xd, xs, n_in,
                     nt, ks);
}

#define MF_CU_FOR_EACH_Q8_WTYPE(X) \
    X(MF_TYPE_Q4_0) X(MF_TYPE_Q4_1) X(MF_TYPE_Q5_0) X(MF_TYPE_Q5_1) X(MF_TYPE_Q8_0) \
    X(MF_TYPE_Q2_K) X(MF_TYPE_Q3_K) X(MF_TYPE_Q4_K) X(MF_TYPE_Q5_K) X(MF_TYPE_Q6_K)

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

/* The auto rule, from the H200 runs of docs/PERF.md (ops bench, v1 vs
 * v3 without prefetch, and minfer bench end to end, PDL on): v3 is faster
 * on the layer matmuls (qwen2-0.5B tg128 1,221 t/s all-v3 vs 1,127 all-v1;
 * 7B Q4_K_M 328 with this rule vs 271 all-v1 and 319 all-v3), v1 on
 * vocab-wide outputs (lm_head Q4_0 97 vs 119 us) and on Q6_K (35 vs 41 us
 * for 18944 -> 3584). n_in is kept in the signature for the next rule. */
extern "C" int mf_cu_gemv_v3_wanted(uint32_t wtype, int64_t n_in, int64_t rows) {
    (void)n_in;
    return rows <= 65536 && wtype != MF_TYPE_Q6_K;
}

extern "C" cudaError_t mf_cu_gemv_q8(const mf_cu_matmul_args *a, cudaStream_t s) {
    if (!a->q8 || a->nt <= 0 || a->nt > 8 || !mf_cu_q8_supported(a->wtype, a->n_in))
        return cudaErrorInvalidValue;
    const bool v4 = a->nt == 1 && mf_cu_q8v4_u(&a->gt, a->wtype, a->n_out, a->n_in) > 0;
    if (v4 || (!a->gemv_v1 && (!a->gemv_auto || mf_cu_gemv_v3_wanted(a->wtype, a->n_in, a->n_out)))) {
        /* v3: one weight through the multi launcher (same quantization) */
        mf_cu_q8_multi_args m;
        memset(&m, 0, sizeof m);
        m.n_w = 1;
        m.x = a->x;
        m.n_in = a->n_in;
        m.nt = a->nt;
        m.q8 = a->q8;
        m.wtype[0] = a->wtype;
        m.w[0] = a->w;
        m.row_bytes[0] = a->row_bytes;
        m.bias[0] = a->bias;
        m.y[0] = a->y;
        m.n_out[0] = a->n_out;
        m.gemv_auto = a->gemv_auto;
        m.gt = a->gt;
        return mf_cu_gemv_q8_multi(&m, s);
    }
    q8_src in;
    memset(&in, 0, sizeof in);
    in.x = a->x;
    in.pdl = a->gt.pdl != 0;
    in.n_in = a->n_in;
    in.nt = a->nt;
    in.xq = (int8_t *)a->q8;
    in.xd = (float *)(in.xq + a->nt * a->n_in);
    in.xs = (int32_t *)(in.xd + a->nt * (a->n_in / 32));
    switch (a->wtype) {
#define MF_CASE(T) \
    case T:        \
        return launch_q8<T>(a, &in, s);
        MF_CU_FOR_EACH_Q8_WTYPE(MF_CASE)
#undef MF_CASE
    default:
        return cudaErrorInvalidValue;
    }
}

/* The launch description of the args' weights first .. end - 1 (one row
 * space; entries past them are left as they are). */
static void q8_run(const mf_cu_q8_multi_args *a, int first, int end, q8_multi *p) {
    p->n_w = end - first;
    p->start[0] = 0;
    for (int k = 0; k < p->n_w; k++) {
        p->w[k] = (const uint8_t *)a->w[first + k];
        p->row_bytes[k] = a->row_bytes[first + k];
        p->bias[k] = a->bias[first + k];
        p->res[k] = a->res[first + k];
        p->y[k] = a->y[first + k];
        p->n_out[k] = a->n_out[first + k];
        p->start[k + 1] = p->start[k] + p->n_out[k];
    }
}

/* tune qkv_mix: weights in exactly two runs of different types (Q/K
 * of one, V of another), both on the v4 GEMV with a mixed-type kernel for
 * the pair: one launch instead of two (each row's bits unchanged, see
 * mf_cu_q8v4_launch_mix). *done = false (nothing launched) when it does
 * not apply. */
static cudaError_t q8_mix_launch(const mf_cu_q8_multi_args *a, q8_src *in, bool *done, cudaStream_t s) {
    *done = false;
    if (!a->qkv_mix || a->swiglu || a->nt != 1 || a->n_w < 2)
        return cudaSuccess;
    int cut = 1;
    while (cut < a->n_w && a->wtype[cut] == a->wtype[0])
        cut++;
    if (cut == a->n_w)
        return cudaSuccess; /* one type: one launch anyway */
    for (int i = cut + 1; i < a->n_w; i++)
        if (a->wtype[i] != a->wtype[cut])
            return cudaSuccess;
    q8_multi pa, pb;
    memset(&pa, 0, sizeof pa);
    memset(&pb, 0, sizeof pb);
    q8_run(a, 0, cut, &pa);
    q8_run(a, cut, a->n_w, &pb);
    const int ua = mf_cu_q8v4_u(&a->gt, a->wtype[0], pa.start[pa.n_w], a->n_in);
    const int ub = mf_cu_q8v4_u(&a->gt, a->wtype[cut], pb.start[pb.n_w], a->n_in);
    if (!mf_cu_q8v4_mix_supported(&a->gt, a->wtype[0], ua, a->wtype[cut], ub))
        return cudaSuccess;
    *done = true;
    cudaError_t e = q8_src_ready(in, s);
    if (e == cudaSuccess)
        e = mf_cu_q8v4_launch_mix(&a->gt, &pa, a->wtype[0], ua, &pb, a->wtype[cut], ub, in->xq, in->xd, in->xs,
                                  a->n_in, s);
    return e;
}

/* FFN_Q8B's rule: the launch mf_cu_gemv_q8_multi would make is the v4
 * SwiGLU GEMV with one slice in flight and one warp per output, which the
 * block-local kernel reproduces bit for bit (mf_cu_q8v4_swq8_ok adds the
 * types and the size rule). */
extern "C" int mf_cu_gemv_q8_ffn_q8b_ok(const mf_cu_q8_multi_args *a) {
    if (!a->swiglu || a->n_w != 2 || a->nt != 1 || a->wtype[1] != a->wtype[0] ||
        a->n_out[1] != a->n_out[0] || a->res[0] || a->res[1] || !mf_cu_q8_supported(a->wtype[0], a->n_in))
        return 0;
    const int u = mf_cu_q8v4_u(&a->gt, a->wtype[0], 2 * a->n_out[0], a->n_in);
    return u > 0 && mf_cu_q8v4_swq8_ok(&a->gt, a->wtype[0], u, a->n_out[0], a->n_in);
}

/* tune zc's rule: the launch mf_cu_gemv_q8_multi would make
 * is the v4 GEMV of one weight, one token, one slice in flight and one
 * warp per row pair, which the ZC instance runs with the same plan (so the
 * same bits); mf_cu_q8v4_zc_ok adds the types. */
extern "C" int mf_cu_gemv_q8_zc_ok(const mf_cu_q8_multi_args *a) {
    if (a->swiglu || a->n_w != 1 || a->nt != 1 || a->res[0] || a->q8out ||
        !mf_cu_q8_supported(a->wtype[0], a->n_in)) /* no ZC form of FFN_Q8B */
        return 0;
    const int u = mf_cu_q8v4_u(&a->gt, a->wtype[0], a->n_out[0], a->n_in);
    return u > 0 && mf_cu_q8v4_zc_ok(&a->gt, a->wtype[0], u, a->n_out[0], a->n_in);
}

/* The one-run v4 launches beside the plain path (FFN_Q8B's block-local
 * gate/up, the ZC lm_head): p = weights [0, nw) of a as one run, and x
 * quantized the way the plain v4 launch has it (the quantize kernel if x is
 * not ready). */
static cudaError_t q8_v4_one_run(const mf_cu_q8_multi_args *a, q8_src *in, int nw, q8_multi *p, cudaStream_t s) {
    memset(p, 0, sizeof *p);
    q8_run(a, 0, nw, p);
    return q8_src_ready(in, s);
}

/* The fused path: one quantization of x, then one launch over every weight
 * when they share a type (else one launch per weight on the same quantized
 * activations; or one for two runs of types, q8_mix_launch). */
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
    q8_src in; /* quantized before the first launch (or already, x_q8_ready) */
    memset(&in, 0, sizeof in);
    in.x = a->x;
    in.nw = a->norm ? a->norm_w : NULL;
    in.eps = a->norm_eps;
    in.norm = a->norm;
    in.quantized = a->x_q8_ready != 0;
    in.pdl = a->gt.pdl != 0;
    in.n_in = a->n_in;
    in.nt = a->nt;
    in.xq = (int8_t *)a->q8;
    in.xd = (float *)(in.xq + a->nt * a->n_in);
    in.xs = (int32_t *)(in.xd + a->nt * (a->n_in / 32));
    if (a->q8out) { /* tune ffn_q8b: the SwiGLU GEMV that also writes the down GEMV's int8 input */
        if (!mf_cu_gemv_q8_ffn_q8b_ok(a) || a->y_host ||
            q8_overlap(a->q8out, mf_cu_q8_bytes(a->n_out[0], 1), a->q8, mf_cu_q8_bytes(a->n_in, 1)))
            return cudaErrorInvalidValue;
        q8_multi p;
        cudaError_t e = q8_v4_one_run(a, &in, 2, &p, s);
        if (e == cudaSuccess)
            e = mf_cu_q8v4_swq8_launch(&a->gt, &p, a->wtype[0], in.xq, in.xd, in.xs, a->n_in, a->q8out, s);
        return e != cudaSuccess ? e : cudaGetLastError();
    }
    if (a->y_host) { /* tune zc: y also into mapped host memory, by the v4 epilogue */
        if (!mf_cu_gemv_q8_zc_ok(a) || ((uintptr_t)a->y_host & 31))
            return cudaErrorInvalidValue;
        q8_multi p;
        cudaError_t e = q8_v4_one_run(a, &in, 1, &p, s);
        if (e == cudaSuccess)
            e = mf_cu_q8v4_launch_zc(&a->gt, &p, a->wtype[0], in.xq, in.xd, in.xs, a->n_in, a->y_host, s);
        return e != cudaSuccess ? e : cudaGetLastError();
    }
    bool mixed;
    if (const cudaError_t me = q8_mix_launch(a, &in, &mixed, s))
        return me;
    if (mixed)
        return cudaGetLastError();
    q8_multi p;
    memset(&p, 0, sizeof p);
    int first = 0;
    for (int i = 0; i <= a->n_w; i++) {
        /* a group of consecutive weights of one type becomes one launch */
        if (i < a->n_w && a->wtype[i] == a->wtype[first])
            continue;
        q8_run(a, first, i, &p);
        cudaError_t e = cudaErrorInvalidValue;
        const int u4 = a->nt == 1 ? mf_cu_q8v4_u(&a->gt, a->wtype[first],
                                                 a->swiglu ? 2 * p.n_out[0] : p.start[p.n_w], a->n_in)
                                  : 0;
        if (u4 > 0) { /* the v4 GEMV */
            if ((e = q8_src_ready(&in, s)) != cudaSuccess ||
                (e = mf_cu_q8v4_launch(&a->gt, &p, a->wtype[first], a->swiglu != 0, u4, in.xq, in.xd, in.xs, a->n_in,
                                       s)) != cudaSuccess)
                return e;
            first = i;
            continue;
        }
        const bool v3 = !a->gemv_v1 &&
                        (!a->gemv_auto || mf_cu_gemv_v3_wanted(a->wtype[first], a->n_in, p.start[p.n_w]));
        switch (v3 ? a->wtype[first] : 0xffffffffu) { /* the v3 row-pair GEMV */
#define MF_CASE(T)                                                                          \
    case T:                                                                                 \
        e = a->swiglu ? launch_q8v3<T, true>(&a->gt, &p, &in, a->n_in, a->nt, s)     \
                      : launch_q8v3<T, false>(&a->gt, &p, &in, a->n_in, a->nt, s);   \
        break;
            MF_CU_FOR_EACH_Q8_WTYPE(MF_CASE)
#undef MF_CASE
        default:
            break;
        }
        switch (v3 ? 0xffffffffu : a->wtype[first]) {
#define MF_CASE(T)                                                                          \
    case T:                                                                                 \
        e = a->swiglu ? launch_q8_multi<T, true>(&p, &in, a->n_in, a->nt, s)         \
                      : launch_q8_multi<T, false>(&p, &in, a->n_in, a->nt, s);       \
        break;
            MF_CU_FOR_EACH_Q8_WTYPE(MF_CASE)
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
    MF_PROBE(q8_norm_quant_lat_kernel, 256);
    MF_PROBE(q8_norm_quant_wide_kernel, 256);
#define MF_CASE(T)                                                 \
    MF_PROBE((gemv_q8_kernel<T, 1>), 32 * Q8_WARPS);               \
    MF_PROBE((gemv_q8_kernel<T, 8>), 32 * Q8_WARPS);               \
    MF_PROBE((gemv_q8_multi_kernel<T, 1, false>), 32 * Q8_WARPS);  \
    MF_PROBE((gemv_q8_multi_kernel<T, 8, false>), 32 * Q8_WARPS);  \
    MF_PROBE((gemv_q8_multi_kernel<T, 1, true>), 32 * Q8_WARPS);   \
    MF_PROBE((gemv_q8_multi_kernel<T, 8, true>), 32 * Q8_WARPS);   \
    MF_PROBE((gemv_q8v3_kernel<T, 1, false>), 32 * Q8_WARPS);      \
    MF_PROBE((gemv_q8v3_kernel<T, 8, false>), 32 * Q8_WARPS);      \
    MF_PROBE((gemv_q8v3_kernel<T, 1, true>), 32 * Q8_WARPS);       \
    MF_PROBE((gemv_q8v3_kernel<T, 8, true>), 32 * Q8_WARPS);
    MF_CU_FOR_EACH_Q8_WTYPE(MF_CASE)
#undef MF_CASE
    return cudaSuccess;
}

extern "C" void mf_cu_gemv_occupancy(mf_cu_gemv_occ *o) {
    memset(o, 0, sizeof *o);
#define MF_CASE(T) q8v3_occupancy<T>(o);
    MF_CU_FOR_EACH_Q8_WTYPE(MF_CASE)
#undef MF_CASE
    mf_cu_q8v4_occupancy(o);
}
