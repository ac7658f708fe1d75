/* attn_short.cu - decode attention for short contexts in one pass
 * (MINFER_CUDA_ATTN_SHORT; the backend takes it only where the one-kernel
 * split-KV decode, MINFER_CUDA_ATTN_ONE, would run: n_past + nt <= 384).
 *
 * The split-KV kernel (attn_decode.cu) is built for long contexts: a block
 * per (KV head, split) loads a batch of rows for the whole GQA group, then
 * ~200 shuffles of the 8-head accumulators, a shared-memory merge, partial
 * writes, a fence and an arrival counter, and the last block reads every
 * partial back and combines. At a few hundred rows that chain of dependent
 * steps (~8 us a layer on the H200) dwarfs the work (<= 384 rows x 2 x
 * hd x 2 bytes a KV head). Here there is nothing to combine across blocks:
 *
 *   grid = (query head, token), NW warps (12 by default: the backend's
 *   384-row range in one pass, so every K/V load of the block is issued at
 *   once; 4 on request, the brief's design: 128 rows a pass, deeper
 *   contexts pay one more load round trip a pass). Thread tid < hd / 4
 *   loads a float4 of q (scaled by scale * log2 e: softmax in the log2
 *   domain, as the split kernel) into shared memory. The causal range
 *   [0, n_kv) is walked in tiles of 32 NW rows: lane l of warp w owns row
 *   tile + 32 w + l and computes its full dot with q (16-byte K loads of
 *   its row, q broadcast from shared memory, 4 independent FMA chains),
 *   then the warp takes the max (5 shuffles), rescales (online softmax
 *   across tiles) and does P.V with lanes over dims (hd / 32 a lane:
 *   coalesced V loads of the warp's 32 rows), p broadcast by __shfl_sync.
 *   The first tile's K and V loads are issued right after n_past is known,
 *   before the barrier that publishes q. The NW warps' (m, l, acc[hd]) merge through shared memory
 *   and warp 0 normalizes, writes out and, with a.q8out, the int8 input of
 *   the o GEMV with q8_unit's arithmetic (gemv_q8.cuh; the same code as
 *   attn_decode.cu's da_combine_group), so the backend's q8_produced marker
 *   holds. No scratch, no counters, no second kernel.
 *
 * Every K/V row is read once per query head (G times per KV head, the
 * repeats from L2): at <= 384 rows that is <= 384 x 2 x 256 bytes a block
 * (f16, hd 128), far below what the latency chain costs. The kernel is
 * correct at any depth (the tile loop just runs longer); the backend keeps
 * it to the short contexts it is meant for.
 *
 * Graph replay: the grid depends only on n_head and nt; n_past is read from
 * n_past_dev when set. PDL: every thread waits (mf_pdl_wait) before reading
 * q, K, V or n_past_dev and before any write. out may equal q: a block reads
 * its own q row (only it) into shared memory before the barrier and writes
 * the same row after it. */
#include <math.h>
#include <string.h>

#include <cuda_fp16.h>

#include "backend/cuda/cuda_args.h"
#include "backend/cuda/gemv_q8.cuh"
#include "backend/cuda/pdl.cuh"
#include "quant/quant.h"

#define AS_WARPS_DEF 12 /* warps a block: 384 rows in one pass (the backend's short range) */
#define AS_LOG2E 1.4426950408889634f
#define AS_MAX_NT 8
#define AS_MAX_G 8

/* NW 32-bit words from p (16-byte aligned when NW >= 4, 8 when NW == 2):
 * K rows (NW = hd * element bytes / 4) and a lane's V elements of a row. */
template <int NW>
static __device__ __forceinline__ void as_ld(const uint8_t *p, unsigned w[NW]) {
    if constexpr (NW == 1) {
        w[0] = __ldg((const unsigned *)p);
    } else if constexpr (NW == 2) {
        const uint2 x = __ldg((const uint2 *)p);
        w[0] = x.x, w[1] = x.y;
    } else {
        static_assert(NW % 4 == 0, "whole 16-byte loads");
#pragma unroll
        for (int i = 0; i < NW / 4; i++) {
            const uint4 x = __ldg((const uint4 *)p + i);
            w[4 * i] = x.x, w[4 * i + 1] = x.y, w[4 * i + 2] = x.z, w[4 * i + 3] = x.w;
        }
    }
}

/* The elements of NW words: 2 a word (f16) or 1 (f32). */
template <bool F16, int NW>
static __device__ __forceinline__ void as_cvt(const unsigned w[NW], float f[F16 ? 2 * NW : NW]) {
#pragma unroll
    for (int i = 0; i < NW; i++) {
        if constexpr (F16) {
            __half2 h;
            memcpy(&h, &w[i], 4);
            const float2 x = __half22float2(h);
            f[2 * i] = x.x, f[2 * i + 1] = x.y;
        } else {
            f[i] = __uint_as_float(w[i]);
        }
    }
}

/* See the file comment. VG: V rows a lane holds at once (32: the whole
 * warp tile, issued with K; 8 for f32 hd 128, whose K row alone is 128
 * registers: 8 rows at a time, each group loaded after the last is used;
 * that K row is also held in two halves, KH). f32 caches are the tests'
 * and the fallback's; f16 is what decode runs on. */
template <int HD, bool F16, int NW>
static __global__ void __launch_bounds__(32 * NW) attn_short_kernel(mf_cu_attn_args a) {
    constexpr int ES = F16 ? 2 : 4;          /* element bytes */
    constexpr int KW = HD * ES / 4;          /* words of a K row slice */
    constexpr int KH = F16 || HD == 64 ? KW : KW / 2; /* words of it held at once */
    constexpr int DPL = HD / 32;             /* P.V: dims a lane */
    constexpr int VW = DPL * ES / 4;         /* words of a lane's V elements of a row */
    constexpr int VG = F16 || HD == 64 ? 32 : 8;
    constexpr int D4 = HD / 4;               /* float4 items of a head's output */
    static_assert(KH % 4 == 0 && KW % KH == 0 && (VW == 1 || VW == 2 || VW == 4) && 32 % VG == 0, "load shapes");
    static_assert(D4 <= 32 && D4 % 8 == 0, "warp 0 writes the head, whole q8 units");
    __shared__ __align__(16) float s_q[HD];
    __shared__ __align__(16) float s_acc[NW][HD];
    __shared__ float s_m[NW], s_l[NW];

    mf_pdl_wait();
    mf_pdl_trigger(); /* the o GEMV may be scheduled; it waits for this grid to finish */
    const int h = blockIdx.x, t = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kvh = h / (a.n_head / a.n_head_kv);
    const int64_t qo = ((int64_t)t * a.n_head + h) * HD; /* q, out: this block's row */
    float4 q4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if ((int)threadIdx.x < D4)
        q4 = ((const float4 *)(a.q + qo))[threadIdx.x];
    const int n_kv = (a.n_past_dev ? *a.n_past_dev : (int)a.n_past) + t + 1;

    const uint64_t rb = (uint64_t)a.n_head_kv * HD * ES; /* cache row bytes */
    const uint8_t *kb = (const uint8_t *)a.k + (uint64_t)kvh * HD * ES;
    const uint8_t *vb = (const uint8_t *)a.v + (uint64_t)kvh * HD * ES + (uint64_t)lane * DPL * ES;
    unsigned kw[KH], vw[VG][VW];
    if (32 * warp < n_kv) { /* the first tile's loads, before the barrier (rows past n_kv: the last row) */
        as_ld<KH>(kb + (uint64_t)min(32 * warp + lane, n_kv - 1) * rb, kw);
#pragma unroll
        for (int r = 0; r < VG; r++)
            as_ld<VW>(vb + (uint64_t)min(32 * warp + r, n_kv - 1) * rb, vw[r]);
    }
    if ((int)threadIdx.x < D4) {
        const float qs = a.scale * AS_LOG2E;
        ((float4 *)s_q)[threadIdx.x] = make_float4(q4.x * qs, q4.y * qs, q4.z * qs, q4.w * qs);
    }
    __syncthreads();

    float m = -INFINITY, l = 0.0f; /* m: the warp's running max; l: this lane's rows */
    float acc0[DPL], acc1[DPL];    /* even / odd rows: two FMA chains */
#pragma unroll
    for (int i = 0; i < DPL; i++)
        acc0[i] = acc1[i] = 0.0f;
    for (int tile = 0; tile + 32 * warp < n_kv; tile += 32 * NW) { /* warp-uniform */
        const int w0 = tile + 32 * warp;
        if (tile) {
            as_ld<KH>(kb + (uint64_t)min(w0 + lane, n_kv - 1) * rb, kw);
#pragma unroll
            for (int r = 0; r < VG; r++)
                as_ld<VW>(vb + (uint64_t)min(w0 + r, n_kv - 1) * rb, vw[r]);
        }
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int k0 = 0; k0 < KW; k0 += KH) {
            if (k0) /* f32 hd 128: the row's second half */
                as_ld<KH>(kb + (uint64_t)min(w0 + lane, n_kv - 1) * rb + 4 * k0, kw);
#pragma unroll
            for (int c = 0; c < KH / 4; c++) { /* one 16-byte load: 8 (f16) or 4 (f32) elements */
                constexpr int E = F16 ? 8 : 4;
                float kf[E];
                as_cvt<F16, 4>(kw + 4 * c, kf);
#pragma unroll
                for (int j = 0; j < E / 4; j++) {
                    const float4 qv = ((const float4 *)s_q)[(k0 + 4 * c) / 4 * (E / 4) + j];
                    d[0] = fmaf(qv.x, kf[4 * j], d[0]);
                    d[1] = fmaf(qv.y, kf[4 * j + 1], d[1]);
                    d[2] = fmaf(qv.z, kf[4 * j + 2], d[2]);
                    d[3] = fmaf(qv.w, kf[4 * j + 3], d[3]);
                }
            }
        }
        const float s = w0 + lane < n_kv ? (d[0] + d[1]) + (d[2] + d[3]) : -INFINITY;
        float mt = s;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
        const float mn = fmaxf(m, mt);    /* finite: row w0 < n_kv is lane 0's */
        const float corr = exp2f(m - mn); /* 0 on the first tile */
        const float p = exp2f(s - mn);    /* 0 past n_kv */
        l = l * corr + p;
        m = mn;
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            acc0[i] *= corr;
            acc1[i] *= corr;
        }
#pragma unroll
        for (int g0 = 0; g0 < 32; g0 += VG) {
            if (g0)
#pragma unroll
                for (int r = 0; r < VG; r++)
                    as_ld<VW>(vb + (uint64_t)min(w0 + g0 + r, n_kv - 1) * rb, vw[r]);
#pragma unroll
            for (int r = 0; r < VG; r++) {
                const float pr = __shfl_sync(0xffffffffu, p, g0 + r);
                float vf[DPL];
                as_cvt<F16, VW>(vw[r], vf);
#pragma unroll
                for (int i = 0; i < DPL; i++) {
                    if (r & 1)
                        acc1[i] = fmaf(pr, vf[i], acc1[i]);
                    else
                        acc0[i] = fmaf(pr, vf[i], acc0[i]);
                }
            }
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        l += __shfl_xor_sync(0xffffffffu, l, off);
    if (lane == 0) {
        s_m[warp] = m; /* -inf, l = 0, acc = 0: a warp without rows */
        s_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < DPL; i++)
        s_acc[warp][lane * DPL + i] = acc0[i] + acc1[i];
    __syncthreads();
    if (warp)
        return;

    /* warp 0: lane < D4 owns dims [4 lane, 4 lane + 4); the others shadow a
     * valid item so the q8 shuffles see whole warps */
    const bool ok = lane < D4;
    const int dd = 4 * (lane % D4);
    float M = s_m[0];
#pragma unroll
    for (int w = 1; w < NW; w++)
        M = fmaxf(M, s_m[w]); /* finite: warp 0 has row 0 */
    float L = 0.0f;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < NW; w++) {
        const float wt = exp2f(s_m[w] - M);
        const float4 v = *(const float4 *)&s_acc[w][dd];
        L = fmaf(wt, s_l[w], L);
        o.x = fmaf(wt, v.x, o.x);
        o.y = fmaf(wt, v.y, o.y);
        o.z = fmaf(wt, v.z, o.z);
        o.w = fmaf(wt, v.w, o.w);
    }
    o = make_float4(o.x / L, o.y / L, o.z / L, o.w / L);
    if (ok)
        *(float4 *)(a.out + qo + dd) = o;
    if (a.q8out) { /* the unit's 8 lanes x 4 elements, as the one-kernel decode writes them */
        const int64_t n_in = (int64_t)a.n_head * HD;
        int8_t *xq = (int8_t *)a.q8out;
        float *xd = (float *)(xq + a.nt * n_in);
        q8_unit8x4(o, ok, lane, qo + dd, xq, xd, (int32_t *)(xd + a.nt * (n_in / 32)));
    }
}

extern "C" int mf_cu_attn_short_ok(const mf_cu_attn_args *a) {
    const uintptr_t al = (uintptr_t)a->q | (uintptr_t)a->out | (uintptr_t)a->k | (uintptr_t)a->v;
    return a->nt >= 1 && a->nt <= AS_MAX_NT && (a->head_dim == 64 || a->head_dim == 128) && a->n_head_kv > 0 &&
           a->n_head % a->n_head_kv == 0 && a->n_head / a->n_head_kv <= AS_MAX_G &&
           (a->kv_type == MF_TYPE_F32 || a->kv_type == MF_TYPE_F16) && (al & 15) == 0 &&
           ((uintptr_t)a->q8out & 3) == 0 && (a->n_past_dev || a->n_past + a->nt <= 0x7fffffff);
}

/* The kernel for a's shape and NW warps a block. */
template <int NW>
static void (*as_pick(const mf_cu_attn_args *a))(mf_cu_attn_args) {
    const bool f16 = a->kv_type == MF_TYPE_F16;
    return a->head_dim == 64 ? (f16 ? attn_short_kernel<64, true, NW> : attn_short_kernel<64, false, NW>)
                             : (f16 ? attn_short_kernel<128, true, NW> : attn_short_kernel<128, false, NW>);
}

extern "C" cudaError_t mf_cu_attn_short(const mf_cu_attn_args *a, int warps, cudaStream_t s) {
    if (!mf_cu_attn_short_ok(a) || (warps != 0 && warps != 4 && warps != AS_WARPS_DEF))
        return cudaErrorInvalidValue;
    const int nw = warps ? warps : AS_WARPS_DEF;
    return mf_launch(nw == 4 ? as_pick<4>(a) : as_pick<AS_WARPS_DEF>(a), dim3((unsigned)a->n_head, (unsigned)a->nt),
                     dim3(32 * nw), 0, s, *a);
}

#include "backend/cuda/probe.cuh"

extern "C" cudaError_t mf_cu_probe_attn_short(size_t smem_limit, const char **bad) {
    MF_PROBE((attn_short_kernel<64, false, 4>), 32 * 4);
    MF_PROBE((attn_short_kernel<64, true, 4>), 32 * 4);
    MF_PROBE((attn_short_kernel<128, false, 4>), 32 * 4);
    MF_PROBE((attn_short_kernel<128, true, 4>), 32 * 4);
    MF_PROBE((attn_short_kernel<64, false, AS_WARPS_DEF>), 32 * AS_WARPS_DEF);
    MF_PROBE((attn_short_kernel<64, true, AS_WARPS_DEF>), 32 * AS_WARPS_DEF);
    MF_PROBE((attn_short_kernel<128, false, AS_WARPS_DEF>), 32 * AS_WARPS_DEF);
    MF_PROBE((attn_short_kernel<128, true, AS_WARPS_DEF>), 32 * AS_WARPS_DEF);
    return cudaSuccess;
}
