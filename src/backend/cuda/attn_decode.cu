/* attn_decode.cu - split-KV flash decode attention (forwards of nt <= 8).
 *
 * The old decode kernel (attention.cu attn_kernel) gives one block to each
 * (token, query head): 28 blocks for the 7B on 132 SMs, each warp walking a
 * quarter of the causal range one dependent row at a time, and every K/V row
 * read once per query head of its GQA group. Here:
 *
 *   grid = (KV head, split, token), 4 warps per block. A block takes the
 *   whole GQA group (G <= 8 query heads, padded to 8) of its KV head and a
 *   contiguous chunk of the token's causal range [0, n_past + t], so each
 *   K/V row is fetched once per group. In a warp, LPR = hd / 8 lanes share
 *   one row (8 contiguous elements a lane: one 16-byte load for f16), so a
 *   warp covers RPW = 32 / LPR rows per step and DA_NB steps per batch; the
 *   batch's K and V loads are all issued before the first use. The 8 partial
 *   dot products of a lane (one per query head) are reduced over the row's
 *   LPR lanes by a halving exchange (8 -> 4 -> 2 -> 1 values: 8 shuffles in
 *   all instead of 8 x 4), which leaves lane j holding the score of head
 *   j / (LPR / 8). The online softmax runs once per batch (one rescale per
 *   batch, max shared by the warp's rows, in the log2 domain: q carries
 *   scale * log2 e), and P.V accumulates in f32 with each lane owning its 8
 *   dims for all 8 heads. The 4 warps merge through shared memory and the
 *   block writes unnormalized partials (m, l, acc[hd]) per (token, query
 *   head, split) to scratch; attn_decode_combine (a second, small kernel)
 *   merges the non-empty splits and normalizes.
 *
 * Why a second kernel rather than "the last block combines": it keeps no
 * state between launches (an arrival counter would have to start at zero in
 * freshly grown scratch and be reset inside every replayed graph), the result
 * does not depend on block arrival order, and with PDL its launch overlaps
 * the tail of the split kernel. The first objection is gone now: the backend
 * owns zeroed counters (cuda_backend.c counters()) and the kernel leaves
 * them zeroed. On the H200 a decode kernel costs >= 2-3 us in a PDL chain
 * even when nearly empty, so tune attn_decode=one (a.cnt set; the backend's
 * default while the context is at most 384 tokens: the last block merges
 * the active splits alone, 32 of them at depth 1000 cost +3.9 us over the
 * second kernel, docs/PERF.md) drops the second kernel: the
 * non-empty split blocks of a (token, KV head) count arrivals after writing
 * their partials; the last one reads all partials of the group (__ldcg,
 * after a fence) and merges them with exactly the combine's arithmetic in
 * the combine's order (da_combine_group), so the output is bitwise the
 * two-kernel one whatever the arrival order, then resets the counter. With
 * a.q8out it also writes the int8 quantization of its heads' output rows
 * (q8_unit's arithmetic, gemv_q8.cu), which saves the o GEMV's quantize
 * kernel too.
 *
 * Graph replay: the split count (grid and scratch size) depends only on nt,
 * n_head_kv and the cache capacity n_ctx (mf_cu_attn_decode_bytes), never on
 * n_past; each block derives its chunk from n_past (read from n_past_dev when
 * set) and a block whose chunk is empty writes the neutral partial m = -inf,
 * l = 0 (the combine needs only the non-empty ones: it derives their count
 * from n_past the same way). Both kernels go through mf_launch and wait
 * (mf_pdl_wait) before any read of q/K/V/partials and any write. out may
 * equal q: q is only read by the split kernel, out only written by the
 * combine, which runs after it (one-kernel: by the last block of the group,
 * after every block that reads those q rows has arrived). */
#include <math.h>

#include "backend/cuda/cuda_args.h"
#include "backend/cuda/gemv_q8.cuh"
#include "backend/cuda/kv.cuh"
#include "backend/cuda/pdl.cuh"

#define DA_WARPS 4
#define DA_G 8               /* query heads per block (a GQA group, padded) */
#define DA_NB 4              /* row steps per batch */
#define DA_MAX_NT 8
#define DA_MAX_SPLIT 128
#define DA_MIN_CHUNK 32      /* rows; chunks are multiples of this */
#define DA_TARGET_BLOCKS 264 /* about 2 blocks per SM on a 132-SM H200 */
#define DA_LOG2E 1.4426950408889634f
#define DC_THREADS 512       /* combine kernels: threads per (query head, token) */
#define DCL_ML (DA_MAX_SPLIT / 32)

enum { DA_F32, DA_F16, DA_Q8 };

/* 8 consecutive elements of a cache row as fetched: loads are issued for a
 * whole batch first and converted when used. */
template <int KVT> struct da_raw;
template <> struct da_raw<DA_F32> {
    float4 a, b;
};
template <> struct da_raw<DA_F16> {
    uint4 a;
};
template <> struct da_raw<DA_Q8> {
    unsigned short q[4], d;
};

/* Elements [e, e + 8) of the head slice starting at `s` (e % 8 == 0). A q8_0
 * slice is 2-byte aligned at best (34-byte blocks), hence the short loads. */
static __device__ __forceinline__ da_raw<DA_F32> da_load(const uint8_t *s, int e, da_raw<DA_F32> *) {
    const float4 *p = (const float4 *)(s + 4 * e);
    return {__ldg(p), __ldg(p + 1)};
}
static __device__ __forceinline__ da_raw<DA_F16> da_load(const uint8_t *s, int e, da_raw<DA_F16> *) {
    return {__ldg((const uint4 *)(s + 2 * e))};
}
static __device__ __forceinline__ da_raw<DA_Q8> da_load(const uint8_t *s, int e, da_raw<DA_Q8> *) {
    const uint8_t *blk = s + (e / MF_QK8_0) * sizeof(mf_block_q8_0);
    const unsigned short *qs = (const unsigned short *)(blk + 2 + e % MF_QK8_0);
    da_raw<DA_Q8> r;
#pragma unroll
    for (int i = 0; i < 4; i++)
        r.q[i] = __ldg(qs + i);
    r.d = __ldg((const unsigned short *)blk);
    return r;
}

static __device__ __forceinline__ void da_cvt(const da_raw<DA_F32> &r, float f[8]) {
    f[0] = r.a.x, f[1] = r.a.y, f[2] = r.a.z, f[3] = r.a.w;
    f[4] = r.b.x, f[5] = r.b.y, f[6] = r.b.z, f[7] = r.b.w;
}
static __device__ __forceinline__ void da_cvt(const da_raw<DA_F16> &r, float f[8]) {
    const unsigned w[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __half2 h;
        memcpy(&h, &w[i], 4);
        const float2 x = __half22float2(h);
        f[2 * i] = x.x;
        f[2 * i + 1] = x.y;
    }
}
static __device__ __forceinline__ void da_cvt(const da_raw<DA_Q8> &r, float f[8]) {
    const float d = __half2float(__ushort_as_half(r.d));
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = d * (float)(signed char)(r.q[i] & 0xff);
        f[2 * i + 1] = d * (float)(signed char)(r.q[i] >> 8);
    }
}

/* Sum over the LPR lanes of a row of v[0..7] (one value per query head),
 * returned to lane j (j = lane % LPR) for head j / (LPR / 8): each halving
 * step keeps the half of the values this lane's bit selects and adds the
 * partner's copy of the same half. */
template <int LPR>
static __device__ __forceinline__ float da_reduce8(const float v[8], int j) {
    constexpr int o1 = LPR / 2, o2 = LPR / 4, o3 = LPR / 8;
    float w4[4], w2[2];
    bool hi = (j & o1) != 0;
#pragma unroll
    for (int k = 0; k < 4; k++)
        w4[k] = (hi ? v[k + 4] : v[k]) + __shfl_xor_sync(0xffffffffu, hi ? v[k] : v[k + 4], o1);
    hi = (j & o2) != 0;
#pragma unroll
    for (int k = 0; k < 2; k++)
        w2[k] = (hi ? w4[k + 2] : w4[k]) + __shfl_xor_sync(0xffffffffu, hi ? w4[k] : w4[k + 2], o2);
    hi = (j & o3) != 0;
    float w = (hi ? w2[1] : w2[0]) + __shfl_xor_sync(0xffffffffu, hi ? w2[0] : w2[1], o3);
#pragma unroll
    for (int off = o3 / 2; off > 0; off >>= 1)
        w += __shfl_xor_sync(0xffffffffu, w, off);
    return w;
}

/* Rows per split of the causal range [0, n_kv): ceil(n_kv / n_split), at
 * least DA_MIN_CHUNK, rounded up to a multiple of it. Split s takes
 * [s * chunk, min((s + 1) * chunk, n_kv)): the splits below
 * ceil(n_kv / chunk) have rows, the rest are empty. */
static __device__ __forceinline__ int64_t da_chunk(int64_t n_kv, int n_split) {
    const int64_t chunk = (n_kv + n_split - 1) / n_split;
    return (max(chunk, (int64_t)DA_MIN_CHUNK) + DA_MIN_CHUNK - 1) / DA_MIN_CHUNK * DA_MIN_CHUNK;
}

/* da_chunk in 32-bit arithmetic where n_kv allows (the same value): the
 * 64-bit division is a long subroutine on the path to the first K load. */
static __device__ __forceinline__ int64_t da_chunk32(int64_t n_kv, int n_split) {
    if (n_kv > (int64_t)(0x7fffffff - n_split))
        return da_chunk(n_kv, n_split);
    const int chunk = ((int)n_kv + n_split - 1) / n_split;
    return (max(chunk, DA_MIN_CHUNK) + DA_MIN_CHUNK - 1) / DA_MIN_CHUNK * DA_MIN_CHUNK;
}

template <int HD>
static __device__ void da_combine_group(const mf_cu_attn_args &a, int n_split, int64_t t, int kvh, int G,
                                        int n_act, float *s_w);

/* The split kernel (see the file comment). part: acc[(t * n_head + h) *
 * n_split + s][hd], then (m, l) pairs at the same index.
 * LAT (f32 and f16 caches): without it the kernel is three dependent round
 * trips before any math -- n_past_dev, then q (its loads sit behind the
 * empty-chunk exit, which needs n_past), then K/V (issued after q is
 * scaled, which waits for q). With LAT q is loaded with n_past, right after
 * the wait, and the chunk is divided in 32 bits: two round trips, the
 * partials bitwise the same. The q8_0 cache keeps the three. */
template <int HD, int KVT>
static __global__ void __launch_bounds__(32 * DA_WARPS) attn_decode_kernel(mf_cu_attn_args a, int n_split) {
    constexpr bool LAT = KVT != DA_Q8;
    constexpr int LPR = HD / 8, RPW = 32 / LPR, SUB = LPR / 8, BR = DA_NB * RPW;
    static_assert(LPR >= 8 && LPR <= 32 && 32 % LPR == 0, "8 elements a lane, whole rows per warp");
    __shared__ __align__(16) float s_acc[DA_WARPS][DA_G][HD]; /* float4 stores */
    __shared__ float s_m[DA_WARPS][DA_G], s_l[DA_WARPS][DA_G];

    mf_pdl_wait();
    mf_pdl_trigger(); /* the combine may be scheduled; it waits for this grid to finish */
    const int kvh = blockIdx.x, split = blockIdx.y;
    const int64_t t = blockIdx.z;
    const int G = a.n_head / a.n_head_kv;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rg = lane / LPR, j = lane % LPR;
    const float *qb = a.q + (t * a.n_head + (int64_t)kvh * G) * HD + 8 * j;
    float4 qv[LAT ? DA_G : 1][2]; /* LAT: q as loaded, before n_past is known */
    if (LAT)
#pragma unroll
        for (int g = 0; g < DA_G; g++) {
            qv[g][0] = qv[g][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (g < G) {
                qv[g][0] = *(const float4 *)(qb + g * HD);
                qv[g][1] = *(const float4 *)(qb + g * HD + 4);
            }
        }
    const int64_t n_kv = (a.n_past_dev ? (int64_t)*a.n_past_dev : a.n_past) + t + 1;
    const int64_t chunk = LAT ? da_chunk32(n_kv, n_split) : da_chunk(n_kv, n_split);
    const int64_t r0 = (int64_t)split * chunk, r1 = min(r0 + chunk, n_kv);
    const int64_t p0 = (t * a.n_head + (int64_t)kvh * G) * n_split + split; /* head g: p0 + g * n_split */
    float *pacc = a.part, *pml = a.part + a.nt * a.n_head * (int64_t)n_split * HD;
    if (r0 >= r1) {
        if ((int)threadIdx.x < G) {
            pml[2 * (p0 + (int64_t)threadIdx.x * n_split)] = -INFINITY;
            pml[2 * (p0 + (int64_t)threadIdx.x * n_split) + 1] = 0.0f;
        }
        return;
    }

    float q[DA_G][8];
    {
        const float qs = a.scale * DA_LOG2E;
#pragma unroll
        for (int g = 0; g < DA_G; g++) {
            float4 x0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x1 = x0;
            if (LAT) {
                x0 = qv[LAT ? g : 0][0];
                x1 = qv[LAT ? g : 0][1];
            } else if (g < G) {
                x0 = *(const float4 *)(qb + g * HD);
                x1 = *(const float4 *)(qb + g * HD + 4);
            }
            q[g][0] = x0.x * qs, q[g][1] = x0.y * qs, q[g][2] = x0.z * qs, q[g][3] = x0.w * qs;
            q[g][4] = x1.x * qs, q[g][5] = x1.y * qs, q[g][6] = x1.z * qs, q[g][7] = x1.w * qs;
        }
    }
    float acc[DA_G][8];
#pragma unroll
    for (int g = 0; g < DA_G; g++)
#pragma unroll
        for (int k = 0; k < 8; k++)
            acc[g][k] = 0.0f;
    float m = -INFINITY, l = 0.0f; /* of head j / SUB: m shared by the warp, l this lane's rows */

    const uint64_t rb = mf_kv_row_bytes(a.kv_type, (int64_t)a.n_head_kv * HD);
    const uint64_t so = mf_kv_row_bytes(a.kv_type, (int64_t)kvh * HD); /* the head's slice */
    const uint8_t *kb = (const uint8_t *)a.k + so, *vb = (const uint8_t *)a.v + so;
    for (int64_t b0 = r0 + (int64_t)warp * BR; b0 < r1; b0 += (int64_t)DA_WARPS * BR) {
        da_raw<KVT> kr[DA_NB], vr[DA_NB];
#pragma unroll
        for (int i = 0; i < DA_NB; i++) {
            const int64_t r = min(b0 + i * RPW + rg, r1 - 1); /* past r1: a valid row, masked below */
            kr[i] = da_load(kb + (uint64_t)r * rb, 8 * j, (da_raw<KVT> *)0);
        }
#pragma unroll
        for (int i = 0; i < DA_NB; i++) {
            const int64_t r = min(b0 + i * RPW + rg, r1 - 1);
            vr[i] = da_load(vb + (uint64_t)r * rb, 8 * j, (da_raw<KVT> *)0);
        }
        float s[DA_NB], mt = -INFINITY;
#pragma unroll
        for (int i = 0; i < DA_NB; i++) {
            float kf[8], dot[DA_G];
            da_cvt(kr[i], kf);
#pragma unroll
            for (int g = 0; g < DA_G; g++) {
                float d = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++)
                    d = fmaf(q[g][k], kf[k], d);
                dot[g] = d;
            }
            const float sc = da_reduce8<LPR>(dot, j);
            s[i] = b0 + i * RPW + rg < r1 ? sc : -INFINITY;
            mt = fmaxf(mt, s[i]);
        }
#pragma unroll
        for (int off = LPR; off < 32; off <<= 1)
            mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
        const float mn = fmaxf(m, mt); /* finite: row b0 < r1 is in the batch */
        const float corr = exp2f(m - mn); /* 0 on the first batch (m = -inf) */
        float p[DA_NB], ps = 0.0f;
#pragma unroll
        for (int i = 0; i < DA_NB; i++) {
            p[i] = exp2f(s[i] - mn);
            ps += p[i];
        }
        l = l * corr + ps;
        m = mn;
#pragma unroll
        for (int g = 0; g < DA_G; g++) {
            const float c = __shfl_sync(0xffffffffu, corr, g * SUB);
#pragma unroll
            for (int k = 0; k < 8; k++)
                acc[g][k] *= c;
        }
#pragma unroll
        for (int i = 0; i < DA_NB; i++) {
            float vf[8];
            da_cvt(vr[i], vf);
#pragma unroll
            for (int g = 0; g < DA_G; g++) {
                const float pg = __shfl_sync(0xffffffffu, p[i], rg * LPR + g * SUB);
                if (g < G) {
#pragma unroll
                    for (int k = 0; k < 8; k++)
                        acc[g][k] = fmaf(pg, vf[k], acc[g][k]);
                }
            }
        }
    }

    /* the warp's row groups share m: plain sums merge them */
#pragma unroll
    for (int off = LPR; off < 32; off <<= 1) {
        l += __shfl_xor_sync(0xffffffffu, l, off);
#pragma unroll
        for (int g = 0; g < DA_G; g++)
#pragma unroll
            for (int k = 0; k < 8; k++)
                acc[g][k] += __shfl_xor_sync(0xffffffffu, acc[g][k], off);
    }
    if (lane < LPR) {
#pragma unroll
        for (int g = 0; g < DA_G; g++) {
            *(float4 *)&s_acc[warp][g][8 * j] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
            *(float4 *)&s_acc[warp][g][8 * j + 4] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
        }
        if (j % SUB == 0) {
            s_m[warp][j / SUB] = m; /* a warp without rows: m = -inf, l = 0 */
            s_l[warp][j / SUB] = l;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * HD; i += 32 * DA_WARPS) {
        const int g = i / HD, d = i % HD;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < DA_WARPS; w++)
            M = fmaxf(M, s_m[w][g]); /* finite: warp 0 had rows */
        float L = 0.0f, o = 0.0f;
#pragma unroll
        for (int w = 0; w < DA_WARPS; w++) {
            const float f = s_l[w][g] > 0.0f ? exp2f(s_m[w][g] - M) : 0.0f;
            L += f * s_l[w][g];
            o += f * s_acc[w][g][d];
        }
        const int64_t pi = p0 + (int64_t)g * n_split;
        pacc[pi * HD + d] = o;
        if (d == 0) {
            pml[2 * pi] = M;
            pml[2 * pi + 1] = L;
        }
    }
    if (a.cnt) { /* tune attn_decode=one: the group's last non-empty block combines */
        __shared__ int s_last;
        const int n_act = (int)((n_kv + chunk - 1) / chunk); /* the non-empty splits: split < n_act */
        int32_t *cnt = a.cnt + t * a.n_head_kv + kvh;
        __threadfence(); /* this thread's partials, before the block's arrival */
        __syncthreads(); /* also: every s_acc read above is done (da_combine_group reuses it) */
        if (threadIdx.x == 0)
            s_last = atomicAdd(cnt, 1) == n_act - 1;
        __syncthreads();
        if (!s_last)
            return;
        __threadfence(); /* the other blocks' partials, seen through their arrivals */
        da_combine_group<HD>(a, n_split, t, kvh, G, n_act, &s_acc[0][0][0]);
        if (threadIdx.x == 0)
            *cnt = 0; /* every block of the group has arrived: nobody touches it again this launch */
    }
}

/* The combine's max M of the splits' m and sum L of exp2(m_s - M) l_s over
 * one warp, lane l holding splits l, l + 32, ... (wm, wl; -inf / 0 past
 * n_act), in one fixed order of lanes and shuffles, so the combine kernel
 * and the split kernel's last block get bitwise the same M and L. With W,
 * w[w0 + s] receives split s's weight exp2(m_s - M). */
template <bool W>
static __device__ __forceinline__ void dc_max_sum(const float (&wm)[DCL_ML], const float (&wl)[DCL_ML], int n_act,
                                                  int lane, float *M_out, float *L_out, float *w, int w0) {
    float M = -INFINITY;
#pragma unroll
    for (int k = 0; k < DCL_ML; k++)
        M = fmaxf(M, wm[k]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off)); /* finite: split 0 has rows */
    float L = 0.0f;
#pragma unroll
    for (int k = 0; k < DCL_ML; k++)
        if (lane + 32 * k < n_act) {
            const float e = exp2f(wm[k] - M);
            if (W)
                w[w0 + lane + 32 * k] = e;
            L += e * wl[k];
        }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        L += __shfl_xor_sync(0xffffffffu, L, off);
    *M_out = M;
    *L_out = L;
}

/* The combine of the G query heads of KV head kvh, token t, by the split
 * kernel's last block (tune attn_decode=one), bitwise attn_decode_combine_lat:
 * warp w takes heads w, w + 4: the max and the weighted sum of l in
 * combine_lat's lane order and shuffle tree (so L is its L), the weights
 * exp2f(m_s - M) into s_w (its per-thread w, the same value); then thread
 * item (g, 4 dims) sums acc_s * w_s of split s into accumulator s % P (P =
 * 512 / hd: the combine's thread group of split s, in the same increasing
 * order), adds the P sums in order from 0.0f and divides by L. With
 * a.q8out, the 8 items of a 32-element unit (units never straddle a head:
 * hd % 32 == 0) quantize it as q8_unit does: amax, d = amax / 127, id, q =
 * rint(v id), the two 16-element sums. s_w: DA_G * DA_MAX_SPLIT floats of
 * the kernel's (now unused) s_acc. Partials are read with __ldcg (written
 * by other blocks of this launch: L2, not a stale L1). */
template <int HD>
static __device__ void da_combine_group(const mf_cu_attn_args &a, int n_split, int64_t t, int kvh, int G,
                                        int n_act, float *s_w) {
    constexpr int P = DC_THREADS / HD, D4 = HD / 4;
    static_assert(DC_THREADS % HD == 0 && D4 % 8 == 0, "whole combine groups, whole q8 units");
    static_assert(DA_G * DA_MAX_SPLIT <= DA_WARPS * DA_G * HD, "s_w fits in the split kernel's s_acc");
    __shared__ float s_L[DA_G];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float *pacc = a.part, *pml = a.part + a.nt * a.n_head * (int64_t)n_split * HD;
    const int64_t base0 = (t * a.n_head + (int64_t)kvh * G) * n_split; /* head g: base0 + g * n_split */
    for (int g = warp; g < G; g += DA_WARPS) {
        const int64_t base = base0 + (int64_t)g * n_split;
        float wm[DCL_ML], wl[DCL_ML];
#pragma unroll
        for (int k = 0; k < DCL_ML; k++) {
            const int s = lane + 32 * k;
            wm[k] = s < n_act ? __ldcg(pml + 2 * (base + s)) : -INFINITY;
            wl[k] = s < n_act ? __ldcg(pml + 2 * (base + s) + 1) : 0.0f;
        }
        float M, L;
        dc_max_sum<true>(wm, wl, n_act, lane, &M, &L, s_w, g * DA_MAX_SPLIT);
        if (lane == 0)
            s_L[g] = L;
    }
    __syncthreads();
    const int64_t n_in = (int64_t)a.n_head * HD;
    int8_t *xq = (int8_t *)a.q8out;
    float *xd = xq ? (float *)(xq + a.nt * n_in) : NULL;
    int32_t *xs = xq ? (int32_t *)(xd + a.nt * (n_in / 32)) : NULL;
    const int n_items = G * D4; /* a multiple of 8: the units' lanes are all in or all out */
    for (int i0 = 0; i0 < n_items; i0 += 32 * DA_WARPS) { /* block-uniform: the q8 shuffles see whole warps */
        const int i = i0 + (int)threadIdx.x;
        const bool ok = i < n_items;
        const int g = ok ? i / D4 : 0, d = 4 * (i % D4);
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (ok) {
            const float *pa = pacc + (base0 + (int64_t)g * n_split) * HD + d;
            const float *sw = s_w + g * DA_MAX_SPLIT;
            float4 acc[P];
#pragma unroll
            for (int p = 0; p < P; p++)
                acc[p] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 2
            for (int s0 = 0; s0 < n_act; s0 += P)
#pragma unroll
                for (int p = 0; p < P; p++)
                    if (s0 + p < n_act) {
                        const float w = sw[s0 + p];
                        const float4 v = __ldcg((const float4 *)(pa + (int64_t)(s0 + p) * HD));
                        acc[p].x += w * v.x;
                        acc[p].y += w * v.y;
                        acc[p].z += w * v.z;
                        acc[p].w += w * v.w;
                    }
#pragma unroll
            for (int p = 0; p < P; p++) {
                o.x += acc[p].x;
                o.y += acc[p].y;
                o.z += acc[p].z;
                o.w += acc[p].w;
            }
            const float L = s_L[g];
            o = make_float4(o.x / L, o.y / L, o.z / L, o.w / L);
            *(float4 *)(a.out + (t * a.n_head + (int64_t)kvh * G + g) * HD + d) = o;
        }
        if (xq) /* the unit's 8 lanes x 4 elements */
            q8_unit8x4(o, ok, lane, t * n_in + ((int64_t)kvh * G + g) * HD + d, xq, xd, xs);
    }
}

/* The combine's end: thread (part, d)'s sum over its splits (acc) added
 * over the P parts in order from 0.0f and divided by L, into out's head h
 * of token t (one barrier: every thread of the block calls it; L by
 * reference, so a shared total is read after the barrier, as before). */
static __device__ __forceinline__ void dc_out(const mf_cu_attn_args &a, float *s_red, float acc, int hd, int P,
                                              int64_t t, int h, const float &L) {
    s_red[threadIdx.x] = acc;
    __syncthreads();
    if ((int)threadIdx.x < hd) {
        float o = 0.0f;
        for (int k = 0; k < P; k++)
            o += s_red[k * hd + threadIdx.x];
        a.out[(t * a.n_head + h) * (int64_t)hd + threadIdx.x] = o / L;
    }
}

/* out[t, h] = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s over the
 * splits of (t, h) that saw rows (s < ceil(n_kv / chunk)), one block of
 * DC_THREADS per (query head, token). The straightforward form is a
 * chain of round trips: warp 0 loads the m's (max), loads them again with
 * the l's (weights into s_w), a barrier, then every thread loads its acc
 * values, a barrier, the store. Here every thread issues all its loads at
 * once after the wait -- its acc values and m's (splits part + k P, the
 * first DCL_E in registers) and the whole (m, l) list in warp 0's lane order
 * -- and every warp replays warp 0's max and weighted-l sum (same lane
 * order, same shuffle tree: the same L in every warp), so the weights need
 * no shared array and no barrier; each thread's weight exp2f(m_s - M) and
 * its acc sum are the straightforward form's expressions in its order
 * (that form measured slower with bitwise the same output, docs/PERF.md
 * "Row-kernel generations"). One barrier (the P-way sum) remains. */
#define DCL_E 8
static __global__ void __launch_bounds__(DC_THREADS) attn_decode_combine_lat(mf_cu_attn_args a, int n_split) {
    __shared__ float s_red[DC_THREADS];
    mf_pdl_wait();
    mf_pdl_trigger();
    const int h = blockIdx.x, hd = a.head_dim, lane = threadIdx.x & 31;
    const int64_t t = blockIdx.y;
    const int64_t n_kv = (a.n_past_dev ? (int64_t)*a.n_past_dev : a.n_past) + t + 1;
    const int64_t chunk = da_chunk32(n_kv, n_split);
    const int n_act = n_kv <= (int64_t)(0x7fffffff - chunk) ? ((int)n_kv + (int)chunk - 1) / (int)chunk
                                                             : (int)((n_kv + chunk - 1) / chunk); /* 1 .. n_split */
    const int64_t base = (t * a.n_head + h) * n_split;
    const float *pacc = a.part, *pml = a.part + a.nt * a.n_head * (int64_t)n_split * hd;
    const int P = DC_THREADS / hd, part = threadIdx.x / hd, d = threadIdx.x % hd;
    float pv[DCL_E], pm[DCL_E], wm[DCL_ML], wl[DCL_ML];
#pragma unroll
    for (int k = 0; k < DCL_E; k++) {
        const int s = part + k * P;
        pv[k] = s < n_act ? pacc[(base + s) * hd + d] : 0.0f;
        pm[k] = s < n_act ? pml[2 * (base + s)] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < DCL_ML; k++) {
        const int s = lane + 32 * k;
        wm[k] = s < n_act ? pml[2 * (base + s)] : -INFINITY;
        wl[k] = s < n_act ? pml[2 * (base + s) + 1] : 0.0f;
    }
    float M, L;
    dc_max_sum<false>(wm, wl, n_act, lane, &M, &L, (float *)0, 0);
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < DCL_E; k++)
        if (part + k * P < n_act) {
            const float w = exp2f(pm[k] - M);
            acc += w * pv[k];
        }
    for (int s = part + DCL_E * P; s < n_act; s += P) { /* splits past the registers */
        const float w = exp2f(pml[2 * (base + s)] - M);
        acc += w * pacc[(base + s) * hd + d];
    }
    dc_out(a, s_red, acc, hd, P, t, h, L);
}

static int da_kvt(uint32_t kv_type) {
    return kv_type == MF_TYPE_F32 ? DA_F32 : kv_type == MF_TYPE_F16 ? DA_F16 : kv_type == MF_TYPE_Q8_0 ? DA_Q8 : -1;
}

/* The split count for a's shape, 0 when this path does not take it. A
 * function of nt, n_head_kv and n_ctx only (never n_past when n_past_dev is
 * set): about DA_TARGET_BLOCKS blocks, at most one split per DA_MIN_CHUNK
 * rows of the cache. */
static int da_splits(const mf_cu_attn_args *a) {
    if (a->nt < 1 || a->nt > DA_MAX_NT || (a->head_dim != 64 && a->head_dim != 128) || a->n_head_kv <= 0 ||
        a->n_head % a->n_head_kv || a->n_head / a->n_head_kv > DA_G || da_kvt(a->kv_type) < 0)
        return 0;
    const int64_t per = (int64_t)a->n_head_kv * a->nt;
    int64_t want = (DA_TARGET_BLOCKS + per - 1) / per;
    const int64_t rows = a->n_ctx > 0     ? (int64_t)a->n_ctx
                         : a->n_past_dev ? (int64_t)DA_MAX_SPLIT * DA_MIN_CHUNK
                                         : a->n_past + a->nt;
    const int64_t cap = (rows + DA_MIN_CHUNK - 1) / DA_MIN_CHUNK;
    want = want < cap ? want : cap;
    return (int)(want < 1 ? 1 : want > DA_MAX_SPLIT ? DA_MAX_SPLIT : want);
}

extern "C" size_t mf_cu_attn_decode_bytes(const mf_cu_attn_args *a) {
    const int n_split = da_splits(a);
    return n_split ? (size_t)(a->nt * a->n_head * n_split) * (size_t)(a->head_dim + 2) * sizeof(float) : 0;
}

extern "C" cudaError_t mf_cu_attn_decode(const mf_cu_attn_args *a, cudaStream_t s) {
    const int n_split = da_splits(a);
    if (!n_split || !a->part || (a->q8out && (!a->cnt || a->head_dim % 32)))
        return cudaErrorInvalidValue;
    const dim3 grid((unsigned)a->n_head_kv, (unsigned)n_split, (unsigned)a->nt), block(32 * DA_WARPS);
    const int kvt = da_kvt(a->kv_type);
    void (*k)(mf_cu_attn_args, int) =
        a->head_dim == 64 ? (kvt == DA_F32   ? attn_decode_kernel<64, DA_F32>
                             : kvt == DA_F16 ? attn_decode_kernel<64, DA_F16>
                                             : attn_decode_kernel<64, DA_Q8>)
                          : (kvt == DA_F32   ? attn_decode_kernel<128, DA_F32>
                             : kvt == DA_F16 ? attn_decode_kernel<128, DA_F16>
                                             : attn_decode_kernel<128, DA_Q8>);
    cudaError_t e = mf_launch(k, grid, block, 0, s, a->pdl, *a, n_split);
    if (e != cudaSuccess || a->cnt) /* tune attn_decode=one: the split kernel combined */
        return e;
    return mf_launch(attn_decode_combine_lat, dim3((unsigned)a->n_head, (unsigned)a->nt), dim3(DC_THREADS), 0, s, a->pdl,
                     *a, n_split);
}

#include "backend/cuda/probe.cuh"

extern "C" cudaError_t mf_cu_probe_attn_decode(size_t smem_limit, const char **bad) {
    MF_PROBE((attn_decode_kernel<64, DA_F32>), 32 * DA_WARPS);
    MF_PROBE((attn_decode_kernel<64, DA_F16>), 32 * DA_WARPS);
    MF_PROBE((attn_decode_kernel<64, DA_Q8>), 32 * DA_WARPS);
    MF_PROBE((attn_decode_kernel<128, DA_F32>), 32 * DA_WARPS);
    MF_PROBE((attn_decode_kernel<128, DA_F16>), 32 * DA_WARPS);
    MF_PROBE((attn_decode_kernel<128, DA_Q8>), 32 * DA_WARPS);
    MF_PROBE(attn_decode_combine_lat, DC_THREADS);
    return cudaSuccess;
}
