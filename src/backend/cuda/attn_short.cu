/* attn_short.cu - decode attention for short contexts in one pass
 * (tune attn_decode=short; the backend takes it only where the one-kernel
 * split-KV decode, tune attn_decode=one, would run: n_past + nt <= 384).
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
 *   once; 4 with tune short_warps=4, the first design: 128 rows a pass,
 *   deeper contexts pay one more load round trip a pass). Thread tid < hd / 4
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
#include "backend/cuda/kv.cuh"
#include "backend/cuda/norm.cuh"
#include "backend/cuda/pdl.cuh"
#include "quant/quant.h"

#define AS_WARPS_DEF 12 /* warps a block: 384 rows in one pass (the backend's short range) */
#define AS_LOG2E 1.4426950408889634f
#define AS_MAX_NT 8
#define AS_MAX_G 8

/* One V row's share of P.V: p times the lane's DPL elements into the even
 * (acc0) or odd (acc1) row accumulator (two chains, rows alternating). */
template <int DPL>
static __device__ __forceinline__ void as_pv(float p, const float *vf, int odd, float *acc0, float *acc1) {
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        if (odd)
            acc1[i] = fmaf(p, vf[i], acc1[i]);
        else
            acc0[i] = fmaf(p, vf[i], acc0[i]);
    }
}

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

/* ---- tune short_rope: rope (+ QkNorm) and the K/V store inside the kernel ----
 *
 * asr_prologue: with one token the rope-store launch between the QKV GEMV
 * and this kernel (ropestore.cu) is folded in. The block's last six warps
 * (6-11: at depths below 192 they hold no rows, so the first tile's K/V
 * loads of warps 0-5 are not delayed) take roles, 64 threads each, as
 * rope_store_head_lat_kernel's 64-thread blocks do: warps 6-7 the block's q
 * head, 8-9 its KV head's k, 10-11 that head's v (head_dim <= 128: thread i
 * owns pair i and the dims n_rot + i, n_rot + i + 64 past the rotation). Each role warp replays the QkNorm sum
 * in rs_norm_head's lane order (no broadcast, no barrier), the pow of its
 * pair runs before the PDL wait (it reads only arguments), the rotation is
 * mf_rope_head's expression and the cache elements are the kv.cuh writers',
 * so q (times scale log2 e, as attn_short scales the q it reads), K and V
 * are bitwise what rope_store + attn_short see. q goes to s_q; K and V,
 * rounded to the cache type, to s_kc / s_vc (every block of the group
 * computes them: no block waits on another), and the first query head of
 * each group (h % G == 0) also writes them into cache row n_past. The
 * barrier that publishes s_q publishes these too. The tile loop reads no
 * cache row >= n_past (the loads clamp to n_past - 1): the current row's
 * score is s_cur (computed once, below) and its V, like that of the masked
 * rows past it, which attn_short reads as row n_past, comes from s_vc.
 * Nothing is written to the rope-store's q / k outputs (the backend only
 * takes this where nothing reads them). */
#define ASR_T0 (32 * (AS_WARPS_DEF - 6)) /* the roles' first thread: the block's last six warps */

/* The thread's role (0 q, 1 k, 2 v, 3 none) and index in it. */
static __device__ __forceinline__ int asr_role(int &i) {
    const int rt = (int)threadIdx.x - ASR_T0;
    i = rt & 63;
    return rt < 0 ? 3 : rt >> 6;
}

template <bool ROPE>
struct asr_pre {};
template <>
struct asr_pre<true> {
    double pw;     /* theta^(-2i / n_rot) of the thread's pair */
    float wp[2];   /* norm weights of the pair's two elements, of the two rest dims */
    float wr[2];
};
template <int HD, bool ROPE>
struct asr_in {};
template <int HD>
struct asr_in<HD, true> {
    float xp[2];      /* the pair (q / k roles) */
    float xr[2];      /* dims n_rot + i + 64 k (q / k), or v elements i + 64 k (v role) */
    float xs[HD / 32]; /* the norm's lane order: elements lane + 32 j */
    int32_t praw;     /* the position as loaded (r.pos or r.pos0_dev) */
};

/* Thread i's elements of a head row p (its values, or the QkNorm weights
 * that scale them): pair i into xp when i < half = n_rot / 2 (NEOX: i and
 * i + n_rot / 2, else 2i and 2i + 1), the dims n_rot + i + 64 k past the
 * rotation into xr[k]; slots it has no element for are left as they are. */
template <int HD>
static __device__ __forceinline__ void asr_gather(const float *p, int i, int n_rot, int half, bool neox,
                                                  float (&xp)[2], float (&xr)[2]) {
    if (i < half) {
        xp[0] = p[neox ? i : 2 * i];
        xp[1] = p[neox ? i + half : 2 * i + 1];
    }
#pragma unroll
    for (int k = 0; k < 2; k++)
        if (n_rot + i + 64 * k < HD)
            xr[k] = p[n_rot + i + 64 * k];
}

/* Before the PDL wait: arguments and weights only. */
template <int HD>
static __device__ __forceinline__ void asr_prewait(const mf_cu_rope_store_args &r, asr_pre<true> &pre) {
    int i;
    const int role = asr_role(i);
    pre.pw = 0.0;
    pre.wp[0] = pre.wp[1] = pre.wr[0] = pre.wr[1] = 1.0f;
    if (role >= 2)
        return;
    const int n_rot = role ? r.rk.n_rot : r.rq.n_rot, half = n_rot / 2;
    const bool neox = ((role ? r.rk.mode : r.rq.mode) & 2) != 0;
    if (i < half)
        pre.pw = pow((double)(role ? r.rk.theta : r.rq.theta), -2.0 * i / (double)n_rot);
    const float *nw = role ? r.k_norm : r.q_norm;
    if (nw)
        asr_gather<HD>(nw, i, n_rot, half, neox, pre.wp, pre.wr);
}

/* After the wait: every global read of the roles at once (one round trip). */
template <int HD>
static __device__ __forceinline__ void asr_load(const mf_cu_rope_store_args &r, int h, int kvh,
                                                const asr_pre<true> &pre, asr_in<HD, true> &in) {
    int i;
    const int role = asr_role(i), lane = threadIdx.x & 31;
    in.xp[0] = in.xp[1] = in.xr[0] = in.xr[1] = 0.0f;
#pragma unroll
    for (int j = 0; j < HD / 32; j++)
        in.xs[j] = 0.0f;
    in.praw = 0;
    if (role == 2) {
        const float *src = r.vs.src + (int64_t)kvh * HD;
#pragma unroll
        for (int k = 0; k < 2; k++)
            if (i + 64 * k < HD)
                in.xr[k] = src[i + 64 * k];
        return;
    }
    if (role > 2)
        return;
    const int n_rot = role ? r.rk.n_rot : r.rq.n_rot, half = n_rot / 2;
    const bool neox = ((role ? r.rk.mode : r.rq.mode) & 2) != 0;
    const float *xv = role ? r.rk.x + (int64_t)kvh * HD : r.rq.x + (int64_t)h * HD;
    asr_gather<HD>(xv, i, n_rot, half, neox, in.xp, in.xr);
    if (role ? r.k_norm : r.q_norm)
#pragma unroll
        for (int j = 0; j < HD / 32; j++)
            in.xs[j] = xv[lane + 32 * j];
    const int32_t *pos = role ? r.rk.pos : r.rq.pos, *pd = role ? r.rk.pos0_dev : r.rq.pos0_dev;
    const int32_t *pa = pos ? pos : pd;
    if (pa)
        in.praw = *pa;
}

/* Element e of the current row into s (shared, the cache's element type)
 * and, when row is non-NULL, into the cache row (mf_kv_put). */
template <bool F16>
static __device__ __forceinline__ void asr_put(unsigned *s, uint8_t *row, int64_t e0, int e, float v) {
    if constexpr (F16)
        ((__half *)s)[e] = __float2half_rn(v);
    else
        ((float *)s)[e] = v;
    if (row)
        mf_kv_put(F16 ? MF_TYPE_F16 : MF_TYPE_F32, row, e0 + e, v);
}

/* The roles' arithmetic and writes (see above); before the block's barrier. */
template <int HD, bool F16>
static __device__ __forceinline__ void asr_finish(const mf_cu_attn_args &a, const mf_cu_rope_store_args &r, int h,
                                                  int kvh, int np, const asr_pre<true> &pre,
                                                  const asr_in<HD, true> &in, float *s_q, unsigned *s_kc,
                                                  unsigned *s_vc, float *s_cur) {
    int i;
    const int role = asr_role(i);
    if (role > 2)
        return;
    constexpr int ES = F16 ? 2 : 4;
    /* the group's first query head stores the row (rope_store's row pos0 is n_past: the backend checks) */
    uint8_t *krow = NULL, *vrow = NULL;
    if (h % (a.n_head / a.n_head_kv) == 0) {
        krow = (uint8_t *)r.ks.cache + (uint64_t)np * a.n_head_kv * HD * ES;
        vrow = (uint8_t *)r.vs.cache + (uint64_t)np * a.n_head_kv * HD * ES;
    }
    const int64_t e0 = (int64_t)kvh * HD;
    if (role == 2) {
#pragma unroll
        for (int k = 0; k < 2; k++)
            if (i + 64 * k < HD)
                asr_put<F16>(s_vc, vrow, e0, i + 64 * k, in.xr[k]);
        return;
    }
    const int n_rot = role ? r.rk.n_rot : r.rq.n_rot, half = n_rot / 2;
    const bool neox = ((role ? r.rk.mode : r.rq.mode) & 2) != 0;
    float x0 = in.xp[0], x1 = in.xp[1], xr0 = in.xr[0], xr1 = in.xr[1];
    if (role ? r.k_norm : r.q_norm) { /* rs_norm_head's scale, in its lane order */
        const float sc = mf_head_rms_scale_lanes(in.xs, HD, r.norm_eps);
        x0 = x0 * sc * pre.wp[0];
        x1 = x1 * sc * pre.wp[1];
        xr0 = xr0 * sc * pre.wr[0];
        xr1 = xr1 * sc * pre.wr[1];
    }
    const float qs = a.scale * AS_LOG2E;
    if (i < half) {
        const bool pos = role ? r.rk.pos != NULL : r.rq.pos != NULL;
        const bool pdev = role ? r.rk.pos0_dev != NULL : r.rq.pos0_dev != NULL;
        const int64_t pos0 = role ? r.rk.pos0 : r.rq.pos0;
        const double p = (double)(pos ? (int64_t)in.praw : (pdev ? (int64_t)in.praw : pos0));
        const double ang = p * (double)(role ? r.rk.freq_scale : r.rq.freq_scale) * pre.pw;
        double sd, cd;
        sincos(ang, &sd, &cd);
        const float si = (float)sd, co = (float)cd;
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        const float y0 = x0 * co - x1 * si, y1 = x0 * si + x1 * co;
        if (role == 0) {
            s_q[i0] = y0 * qs;
            s_q[i1] = y1 * qs;
        } else {
            asr_put<F16>(s_kc, krow, e0, i0, y0);
            asr_put<F16>(s_kc, krow, e0, i1, y1);
        }
    }
    const float xr[2] = {xr0, xr1};
#pragma unroll
    for (int k = 0; k < 2; k++) { /* dims past n_rot: copied (normalized with QkNorm) */
        const int d = n_rot + i + 64 * k;
        if (d < HD) {
            if (role == 0)
                s_q[d] = xr[k] * qs;
            else
                asr_put<F16>(s_kc, krow, e0, d, xr[k]);
        }
    }
    /* The current row's score, q . K as the tile loop computes a lane's row
     * (chain e % 4 over e in order, then (d0 + d1) + (d2 + d3)), by the
     * first q warp once the q and k warps have written s_q / s_kc (named
     * barrier 1, their 128 threads): the loop then needs no K from shared
     * memory (a per-lane K select there cost ~30 registers). */
    asm volatile("bar.sync 1, 128;" ::: "memory");
    if (threadIdx.x < ASR_T0 + 32) {
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
        for (int e = 0; e < HD; e += 4) {
            const float4 qv = ((const float4 *)s_q)[e / 4];
            float kf[4];
            if constexpr (F16) {
                const __half *kh = (const __half *)s_kc + e;
                kf[0] = __half2float(kh[0]), kf[1] = __half2float(kh[1]);
                kf[2] = __half2float(kh[2]), kf[3] = __half2float(kh[3]);
            } else {
                const float4 k4 = ((const float4 *)s_kc)[e / 4];
                kf[0] = k4.x, kf[1] = k4.y, kf[2] = k4.z, kf[3] = k4.w;
            }
            c[0] = fmaf(qv.x, kf[0], c[0]);
            c[1] = fmaf(qv.y, kf[1], c[1]);
            c[2] = fmaf(qv.z, kf[2], c[2]);
            c[3] = fmaf(qv.w, kf[3], c[3]);
        }
        if (threadIdx.x == ASR_T0)
            *s_cur = (c[0] + c[1]) + (c[2] + c[3]);
    }
}

/* See the file comment. VG: V rows a lane holds at once (32: the whole
 * warp tile, issued with K; 8 for f32 hd 128, whose K row alone is 128
 * registers: 8 rows at a time, each group loaded after the last is used;
 * that K row is also held in two halves, KH). f32 caches are the tests'
 * and the fallback's; f16 is what decode runs on. ROPE (ra non-NULL, nt 1):
 * the short-rope variant (asr_prologue above): q, the current row's score
 * and V come from the raw QKV output through shared memory; rows >= n_past
 * (the current one and the clamped ones past it) take those instead of the
 * cache. */
/* tune attn_pf (args field no_pf): before the PDL wait, lane l
 * of warp w asks L2 for cache rows 32 w + l's K and V slices of the block's
 * KV head (RB bytes each), rows before n_past only: earlier forwards wrote
 * those, so nothing this forward writes is touched, and a prefetch is a hint
 * (no register waits on it, no fault). By the time the wait returns, the
 * first tile's loads find L2 instead of HBM: the weights streamed since the
 * last token evict the cache rows. n_past_dev is read early: it was written
 * (by the input slots' copy kernel or the host's upload) before the
 * forward's third kernel, and in a PDL chain a kernel starts only after the
 * one two before it completed; at worst a stale value misdirects a hint. */
template <int RB>
static __device__ __forceinline__ void as_prefetch(const mf_cu_attn_args &a) {
    const int np = a.n_past_dev ? *a.n_past_dev : (int)a.n_past;
    const int row = 32 * (int)(threadIdx.x >> 5) + (int)(threadIdx.x & 31);
    if (row >= np || (a.n_ctx > 0 && row >= a.n_ctx))
        return;
    const int kvh = (int)blockIdx.x / (a.n_head / a.n_head_kv);
    const uint64_t off = (uint64_t)row * a.n_head_kv * RB + (uint64_t)kvh * RB;
#pragma unroll
    for (int o = 0; o < RB; o += 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global((const uint8_t *)a.k + off + o)));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global((const uint8_t *)a.v + off + o)));
    }
}

template <int HD, bool F16, int NW, bool ROPE>
static __device__ __forceinline__ void as_body(const mf_cu_attn_args &a, const mf_cu_rope_store_args *ra, int pf) {
    constexpr int ES = F16 ? 2 : 4;          /* element bytes */
    constexpr int KW = HD * ES / 4;          /* words of a K row slice */
    constexpr int KH = F16 || HD == 64 ? KW : KW / 2; /* words of it held at once */
    constexpr int DPL = HD / 32;             /* P.V: dims a lane */
    constexpr int VW = DPL * ES / 4;         /* words of a lane's V elements of a row */
    constexpr int VG = F16 || HD == 64 ? 32 : 8;
    constexpr int D4 = HD / 4;               /* float4 items of a head's output */
    static_assert(KH % 4 == 0 && KW % KH == 0 && (VW == 1 || VW == 2 || VW == 4) && 32 % VG == 0, "load shapes");
    static_assert(D4 <= 32 && D4 % 8 == 0, "warp 0 writes the head, whole q8 units");
    static_assert(!ROPE || (NW == AS_WARPS_DEF && HD <= 128), "the short-rope roles: 6 warps, a pair and 2 rest dims a thread");
    __shared__ __align__(16) float s_q[HD];
    __shared__ __align__(16) float s_acc[NW][HD];
    __shared__ float s_m[NW], s_l[NW];
    /* ROPE: the current K and V rows of the block's KV head as the cache holds them */
    __shared__ __align__(16) unsigned s_kc[ROPE ? KW : 1], s_vc[ROPE ? KW : 1];
    __shared__ float s_cur; /* ROPE: the current row's score */

    asr_pre<ROPE> pre;
    if constexpr (ROPE)
        asr_prewait<HD>(*ra, pre);
    if (pf)
        as_prefetch<HD * ES>(a);
    mf_pdl_wait();
    mf_pdl_trigger(); /* the o GEMV may be scheduled; it waits for this grid to finish */
    const int h = blockIdx.x, t = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kvh = h / (a.n_head / a.n_head_kv);
    const int64_t qo = ((int64_t)t * a.n_head + h) * HD; /* q, out: this block's row */
    float4 q4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (!ROPE && (int)threadIdx.x < D4)
        q4 = ((const float4 *)(a.q + qo))[threadIdx.x];
    const int np = a.n_past_dev ? *a.n_past_dev : (int)a.n_past;
    const int n_kv = np + t + 1;
    asr_in<HD, ROPE> in;
    if constexpr (ROPE)
        asr_load<HD>(*ra, h, kvh, pre, in);
    /* the last row read from the cache: ROPE never reads row n_past there (the
     * first block of the group is writing it; those rows come from s_kc / s_vc) */
    const int last = ROPE ? max(np - 1, 0) : n_kv - 1;

    const uint64_t rb = (uint64_t)a.n_head_kv * HD * ES; /* cache row bytes */
    const uint8_t *kb = (const uint8_t *)a.k + (uint64_t)kvh * HD * ES;
    const uint8_t *vb = (const uint8_t *)a.v + (uint64_t)kvh * HD * ES + (uint64_t)lane * DPL * ES;
    unsigned kw[KH], vw[VG][VW];
    if constexpr (ROPE) /* before the loads below: they would be live across the double sincos */
        asr_finish<HD, F16>(a, *ra, h, kvh, np, pre, in, s_q, s_kc, s_vc, &s_cur);
    if (32 * warp < n_kv) { /* the first tile's loads, before the barrier (rows past n_kv: the last row) */
        as_ld<KH>(kb + (uint64_t)min(32 * warp + lane, last) * rb, kw);
#pragma unroll
        for (int r = 0; r < VG; r++)
            as_ld<VW>(vb + (uint64_t)min(32 * warp + r, last) * rb, vw[r]);
    }
    if (!ROPE && (int)threadIdx.x < D4) {
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
            as_ld<KH>(kb + (uint64_t)min(w0 + lane, last) * rb, kw);
#pragma unroll
            for (int r = 0; r < VG; r++)
                as_ld<VW>(vb + (uint64_t)min(w0 + r, last) * rb, vw[r]);
        }
        /* ROPE: only the warp tile that reaches row n_past takes the V copy */
        const bool cur = ROPE && w0 + 31 >= np;
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int k0 = 0; k0 < KW; k0 += KH) {
            if (k0) /* f32 hd 128: the row's second half */
                as_ld<KH>(kb + (uint64_t)min(w0 + lane, last) * rb + 4 * k0, kw);
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
        float s = w0 + lane < n_kv ? (d[0] + d[1]) + (d[2] + d[3]) : -INFINITY;
        if constexpr (ROPE)
            if (w0 + lane == np) /* the current row: its score from the prologue (rows past it: -inf) */
                s = s_cur;
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
                    as_ld<VW>(vb + (uint64_t)min(w0 + g0 + r, last) * rb, vw[r]);
            if (ROPE && cur) { /* rows >= n_past: V from s_vc (a copy of the loop below: a select
                                  of vw after the loads cost ~30 registers, and a shared lambda for
                                  the two made ptxas spill 84 bytes in the 168-register rope kernel) */
#pragma unroll
                for (int r = 0; r < VG; r++) {
                    const float pr = __shfl_sync(0xffffffffu, p, g0 + r);
                    float vf[DPL];
                    unsigned vv[VW];
#pragma unroll
                    for (int i = 0; i < VW; i++)
                        vv[i] = w0 + g0 + r >= np ? s_vc[lane * VW + i] : vw[r][i];
                    as_cvt<F16, VW>(vv, vf);
                    as_pv<DPL>(pr, vf, r & 1, acc0, acc1);
                }
                continue;
            }
#pragma unroll
            for (int r = 0; r < VG; r++) {
                const float pr = __shfl_sync(0xffffffffu, p, g0 + r);
                float vf[DPL];
                as_cvt<F16, VW>(vw[r], vf);
                as_pv<DPL>(pr, vf, r & 1, acc0, acc1);
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

template <int HD, bool F16, int NW>
static __global__ void __launch_bounds__(32 * NW) attn_short_kernel(mf_cu_attn_args a, int pf) {
    as_body<HD, F16, NW, false>(a, nullptr, pf);
}

/* tune short_rope: the default 12 warps only (the roles take six) */
template <int HD, bool F16>
static __global__ void __launch_bounds__(32 * AS_WARPS_DEF) attn_short_rope_kernel(mf_cu_attn_args a,
                                                                                 mf_cu_rope_store_args r, int pf) {
    as_body<HD, F16, AS_WARPS_DEF, true>(a, &r, pf);
}

extern "C" int mf_cu_attn_short_ok(const mf_cu_attn_args *a) {
    const uintptr_t al = (uintptr_t)a->q | (uintptr_t)a->out | (uintptr_t)a->k | (uintptr_t)a->v;
    return a->nt >= 1 && a->nt <= AS_MAX_NT && (a->head_dim == 64 || a->head_dim == 128) && a->n_head_kv > 0 &&
           a->n_head % a->n_head_kv == 0 && a->n_head / a->n_head_kv <= AS_MAX_G &&
           (a->kv_type == MF_TYPE_F32 || a->kv_type == MF_TYPE_F16) && (al & 15) == 0 &&
           ((uintptr_t)a->q8out & 3) == 0 && (a->n_past_dev || a->n_past + a->nt <= 0x7fffffff);
}

extern "C" cudaError_t mf_cu_attn_short(const mf_cu_attn_args *a, cudaStream_t s) {
    if (!mf_cu_attn_short_ok(a) || (a->short_warps != 0 && a->short_warps != 4 && a->short_warps != AS_WARPS_DEF))
        return cudaErrorInvalidValue;
    const bool f16 = a->kv_type == MF_TYPE_F16, w4 = a->short_warps == 4;
    void (*k)(mf_cu_attn_args, int) =
        w4 ? (a->head_dim == 64 ? (f16 ? attn_short_kernel<64, true, 4> : attn_short_kernel<64, false, 4>)
                                : (f16 ? attn_short_kernel<128, true, 4> : attn_short_kernel<128, false, 4>))
        : a->head_dim == 64
            ? (f16 ? attn_short_kernel<64, true, AS_WARPS_DEF> : attn_short_kernel<64, false, AS_WARPS_DEF>)
            : (f16 ? attn_short_kernel<128, true, AS_WARPS_DEF> : attn_short_kernel<128, false, AS_WARPS_DEF>);
    return mf_launch(k, dim3((unsigned)a->n_head, (unsigned)a->nt), dim3(32 * (w4 ? 4 : AS_WARPS_DEF)), 0, s,
                     a->pdl, *a, (int)!a->no_pf);
}

/* The rope-store r describes what the fused kernel folds in: one token,
 * the attention's heads and head_dim, K roped in place (rk.x == rk.y ==
 * ks.src), stores into a's caches at a's row n_past (the same device
 * pointer, or the same value), both norms or none. */
extern "C" int mf_cu_attn_short_rope_ok(const mf_cu_attn_args *a, const mf_cu_rope_store_args *r) {
    mf_cu_attn_args b = *a;
    b.q = r->rq.x; /* the kernel reads the raw q; a->q is not read */
    const mf_cu_rope_args *ro[2] = {&r->rq, &r->rk};
    for (int i = 0; i < 2; i++)
        if (ro[i]->nt != 1 || ro[i]->head_dim != a->head_dim || ro[i]->n_rot <= 0 || ro[i]->n_rot % 2 ||
            ro[i]->n_rot > a->head_dim || !ro[i]->x)
            return 0;
    const mf_cu_kv_args *kv[2] = {&r->ks, &r->vs};
    for (int i = 0; i < 2; i++)
        if (kv[i]->nt != 1 || kv[i]->kv_type != a->kv_type || kv[i]->kv_dim != (int64_t)a->n_head_kv * a->head_dim ||
            kv[i]->pos0_dev != a->n_past_dev || (!a->n_past_dev && kv[i]->pos0 != a->n_past) || !kv[i]->src)
            return 0;
    return a->nt == 1 && mf_cu_attn_short_ok(&b) && r->rq.n_head == a->n_head && r->rk.n_head == a->n_head_kv &&
           r->rk.x == r->rk.y && r->ks.src == r->rk.x && r->ks.cache == a->k && r->vs.cache == a->v &&
           !r->q_norm == !r->k_norm && ((uintptr_t)r->rq.x & 3) == 0;
}

extern "C" cudaError_t mf_cu_attn_short_rope(const mf_cu_attn_args *a, const mf_cu_rope_store_args *r,
                                             cudaStream_t s) {
    if (!mf_cu_attn_short_rope_ok(a, r))
        return cudaErrorInvalidValue;
    const bool f16 = a->kv_type == MF_TYPE_F16;
    void (*k)(mf_cu_attn_args, mf_cu_rope_store_args, int) =
        a->head_dim == 64 ? (f16 ? attn_short_rope_kernel<64, true> : attn_short_rope_kernel<64, false>)
                          : (f16 ? attn_short_rope_kernel<128, true> : attn_short_rope_kernel<128, false>);
    return mf_launch(k, dim3((unsigned)a->n_head, 1), dim3(32 * AS_WARPS_DEF), 0, s, a->pdl, *a, *r,
                     (int)!a->no_pf);
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
    MF_PROBE((attn_short_rope_kernel<64, false>), 32 * AS_WARPS_DEF);
    MF_PROBE((attn_short_rope_kernel<64, true>), 32 * AS_WARPS_DEF);
    MF_PROBE((attn_short_rope_kernel<128, false>), 32 * AS_WARPS_DEF);
    MF_PROBE((attn_short_rope_kernel<128, true>), 32 * AS_WARPS_DEF);
    return cudaSuccess;
}
