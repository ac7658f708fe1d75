/* gemv_q8v4.cu - the decode GEMV (one token) with U weight slices per lane
 * in flight, grid-stride over row pairs, the first weight lines prefetched
 * into L2 before the PDL wait.
 *
 * Why. v3 (gemv_q8.cu) keeps one 32-element unit per lane and row in flight
 * (two rows per warp): ~1.1 KB per warp, ~27 KB per SM at its occupancy,
 * while Little's law for ~4 TB/s at ~0.8 us of loaded DRAM latency wants
 * ~25-30 KB per SM *all the time*; with the load -> compute -> load chain of
 * each warp the average is about half that, and the 7B GEMVs stream at
 * 1.2-2.1 TB/s (docs/PERF.md entries 10-12). And its Q4_K unit decode loads
 * the 32 qs bytes two units share, so every byte crosses L1 twice.
 *
 * So v4: (1) a "slice" is 32 elements a lane reads with one aligned 16-byte
 * load where the format allows: for Q4_K, qs chunk c (0..7) of a super-block
 * holds elements 16h..16h+15 (h = c % 2) of sub-blocks 2g and 2g+1 (g =
 * c / 2) in its low and high nibbles, so a lane reads 16 qs bytes plus the
 * 16-byte block header (d, dmin, scales: the 8 lanes of a super-block read
 * the same header, one L1 request) and uses every nibble it loaded; other
 * types keep the unit decoders of q8w.cuh (slice = unit); (2) every lane
 * issues the loads of U slices of both rows before it computes any of them;
 * (3) the grid is at most one wave of resident blocks, each looping over
 * row pairs (no half-empty last wave on the FFN's 18944 rows); (4) before
 * mf_pdl_wait() a block only asks L2 for the lines of its first batch
 * (prefetch.global.L2, no register is written): it loads nothing until the
 * kernel before has finished (see the note above the wait).
 * The arithmetic per 16-element half is v3's (dp4a, the half sums, the
 * per-unit activation scale): only the f32 summation order differs.
 * Taken for nt == 1 by the rule of mf_cu_q8v4_u (default), or forced with
 * MINFER_CUDA_GEMV_V4=U (U = 1 or 2; 0 turns it off; cuda_backend.c).
 * U = 4 measured slower (-11 % on qwen2-7B tg128: the registers of 16 raw
 * slices cost occupancy) and was dropped. */
#include "backend/cuda/cuda_args.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/gemv_q8.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/q8w.cuh"

#define V4_R Q8_PAIR_R
#define V4_PIPE(T) ((T) == MF_TYPE_Q4_K) /* next batch in flight while this one is computed */

/* Slice k of a row: the weight bytes (fetch, loads only) and its dot with
 * the activation (dot, after the loads land). Default: slice = unit k. */
template <int T> struct v4s {
    struct raw {
        uint32_t q[8];
        float2 dm[2];
    };
    static __device__ __forceinline__ void fetch(const uint8_t *row, int64_t k, raw &r) {
        q8w<T>::unit(row, k, r.q, r.dm);
    }
    static __device__ __forceinline__ float dot(const raw &r, int64_t k, const int8_t *__restrict__ xq,
                                                const float *__restrict__ xd, const int32_t *__restrict__ xs) {
        const int4 *xp = (const int4 *)(xq + k * 32);
        const int32_t hs = xs[k];
        return xd[k] * q8_unit_dot(r.q, xp[0], xp[1], r.dm, (float)(int16_t)(hs & 0xffff), (float)(int16_t)(hs >> 16));
    }
};

/* dp4a of four unsigned weight bytes with four signed activation bytes */
static __device__ __forceinline__ int v4_dp4a_us(uint32_t w, int x, int acc) {
    int r;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(w), "r"(x), "r"(acc));
    return r;
}

/* Q4_K's 6-bit scales and mins of sub-blocks j and j + 1 (j even) from the
 * 12 scale bytes held as words s0 (bytes 0-3), s1 (4-7), s2 (8-11): the
 * layout of mf_k4_scale_min, without branches (j differs across a warp's
 * lanes). */
static __device__ __forceinline__ void v4_k4_scale_min2(uint32_t s0, uint32_t s1, uint32_t s2, int j, int *sc,
                                                        int *m) {
    const int sh = 8 * (j & 3); /* bytes e = j & 3 and e + 1 of each word */
    const uint32_t b0 = (s0 >> sh) & 0xffffu, b1 = (s1 >> sh) & 0xffffu, b2 = (s2 >> sh) & 0xffffu;
    uint32_t vs, vm; /* two 8-bit lanes: sub-block j in bits 0-7, j + 1 in bits 8-15 */
    if (j < 4) {
        vs = b0 & 0x3f3fu;
        vm = b1 & 0x3f3fu;
    } else {
        vs = (b2 & 0x0f0fu) | ((b0 >> 2) & 0x3030u);
        vm = ((b2 >> 4) & 0x0f0fu) | ((b1 >> 2) & 0x3030u);
    }
    sc[0] = (int)(vs & 0xffu);
    sc[1] = (int)(vs >> 8);
    m[0] = (int)(vm & 0xffu);
    m[1] = (int)(vm >> 8);
}

template <> struct v4s<MF_TYPE_Q4_K> {
    struct raw {
        uint4 qs, hd;
    };
    /* 144-byte super-blocks (16-byte multiples; rows and uploads 16-byte aligned) */
    static __device__ __forceinline__ void fetch(const uint8_t *row, int64_t k, raw &r) {
        const uint8_t *sb = row + (k >> 3) * 144;
        r.hd = *(const uint4 *)sb;
        r.qs = *(const uint4 *)(sb + 16 + 16 * (k & 7));
    }
    /* The high nibbles stay in place (bits 4-7: 16 q) and go through an
     * unsigned x signed dp4a, so the 1/16 is folded into the sub-block's
     * scale; the scale and min products stay integer until one convert. */
    static __device__ __forceinline__ float dot(const raw &r, int64_t k, const int8_t *__restrict__ xq,
                                                const float *__restrict__ xd, const int32_t *__restrict__ xs) {
        const int c = (int)(k & 7), g = c >> 1, h = c & 1;
        const int64_t ua = (k & ~(int64_t)7) + 2 * g; /* activation units of sub-blocks 2g and 2g + 1 */
        const int4 a = *(const int4 *)(xq + ua * 32 + 16 * h);
        const int4 b = *(const int4 *)(xq + (ua + 1) * 32 + 16 * h);
        const uint32_t lo = 0x0f0f0f0fu, hi = 0xf0f0f0f0u;
        int sa = v4_dp4a_us(r.qs.x & lo, a.x, 0);
        sa = v4_dp4a_us(r.qs.y & lo, a.y, sa);
        sa = v4_dp4a_us(r.qs.z & lo, a.z, sa);
        sa = v4_dp4a_us(r.qs.w & lo, a.w, sa);
        int sb = v4_dp4a_us(r.qs.x & hi, b.x, 0); /* 16 x the dot */
        sb = v4_dp4a_us(r.qs.y & hi, b.y, sb);
        sb = v4_dp4a_us(r.qs.z & hi, b.z, sb);
        sb = v4_dp4a_us(r.qs.w & hi, b.w, sb);
        const int sxa = (int)(int16_t)(xs[ua] >> (16 * h)), sxb = (int)(int16_t)(xs[ua + 1] >> (16 * h));
        int sc[2], m[2];
        v4_k4_scale_min2(r.hd.y, r.hd.z, r.hd.w, 2 * g, sc, m);
        const float d = mf_h2f((uint16_t)(r.hd.x & 0xffffu)), dmin = mf_h2f((uint16_t)(r.hd.x >> 16));
        const float ta = d * (float)(sa * sc[0]) - dmin * (float)(m[0] * sxa);
        const float tb = (0.0625f * d) * (float)(sb * sc[1]) - dmin * (float)(m[1] * sxb);
        return xd[ua] * ta + xd[ua + 1] * tb;
    }
};

/* The Q6_K slice decoder (MINFER_CUDA_GEMV_V4_Q6K, default 1, see
 * mf_cu_q8v4_u; it has its own instance id so =0 keeps the unit decoder). A 210-byte super-block is two 128-element halves of ql[64]
 * (element l and l + 64 in the low / high nibble of byte l, l + 32 and
 * l + 96 in byte l + 32) and qh[32] (2 bits each of l, l + 32, l + 64,
 * l + 96 in byte l). Slice k is part i = k % 4 of half (k / 4) % 2 of
 * super-block k / 8: l in [8i, 8i + 8) of all four 32-element groups, i.e.
 * the 8 bytes ql[8i..], ql[32 + 8i..], qh[8i..] of that half, every bit of
 * which it uses (the unit decoder reads 32 ql + 32 qh bytes for 32
 * elements and uses a half / a quarter of their bits). Each 8-element
 * piece lies in one 16-element scale group. Super-blocks, hence the
 * pieces, are only 2-byte aligned (210 = 2 x 105; rows are not padded), so
 * each piece is 3 aligned words funnel-shifted by 0 or 16 bits (the shift
 * of the super-block, same for all pieces); the scales are 4 signed-byte
 * loads (no extraction), d one 16-bit load. The -32 offset: see dot(). */
#define V4_Q6K_SLICE (MF_TYPE_Q6_K + 1) /* instance id of Q6_K on this decoder (Q8_K has no v4 kernel) */

template <> struct v4s<V4_Q6K_SLICE> {
    struct raw {
        uint32_t w[9]; /* ql[8i..], ql[32 + 8i..], qh[8i..]: 3 words each from the aligned-down address */
        int sc[4];     /* the scales of the four pieces */
        uint32_t dsh;  /* d (f16) | the funnel shift << 16 */
    };
    static __device__ __forceinline__ void fetch(const uint8_t *row, int64_t k, raw &r) {
        const uint32_t k32 = (uint32_t)k; /* n_in < 2^31: 32-bit offsets within the row */
        const uint8_t *sb = row + (k32 >> 3) * 210u;
        const int h = (int)(k32 >> 2) & 1, i = (int)k32 & 3;
        const uint32_t a2 = (uint32_t)(uintptr_t)sb & 2u;
        const uint32_t *b = (const uint32_t *)(sb - a2); /* aligned down, still a global pointer */
        const int ql = 16 * h + 2 * i, qh = 32 + 8 * h + 2 * i; /* word offsets */
#pragma unroll
        for (int j = 0; j < 3; j++) {
            r.w[j] = b[ql + j];
            r.w[3 + j] = b[ql + 8 + j];
            r.w[6 + j] = b[qh + j];
        }
        const int8_t *sc = (const int8_t *)sb + 192 + 8 * h + (i >> 1);
#pragma unroll
        for (int p = 0; p < 4; p++)
            r.sc[p] = sc[2 * p];
        r.dsh = (uint32_t)*(const uint16_t *)(sb + 208) | a2 << 19;
    }
    /* The offset: lanes i and i ^ 1 share their pieces' scales, d and
     * activation units and together cover each piece's 16-element
     * activation half, whose sum s16 the quantization stored (xs); so the
     * even lane adds -32 s16 for both (the pair is in one batch, counted or
     * dropped together) and the odd lane nothing. That part, like every
     * activation load, depends on k only: plain loads and integer ops the
     * compiler shares between the two rows of a pair. */
    static __device__ __forceinline__ float dot(const raw &r, int64_t k, const int8_t *__restrict__ xq,
                                                const float *__restrict__ xd, const int32_t *__restrict__ xs) {
        const uint32_t kb = (uint32_t)k & ~3u; /* activation units kb + p, bytes 8i.. of each */
        const int i = (int)k & 3;
        const int2 *xp = (const int2 *)(xq + (kb * 32u + 8u * (uint32_t)i));
        /* kb % 4 == 0, n_in % 256 == 0 and cudaMalloc'd q8 buffers: 16-byte aligned */
        const float4 dx = *(const float4 *)(xd + kb);
        const int4 hs = *(const int4 *)(xs + kb);
        const int off = i & 1 ? 0 : -32, hsh = 16 * (i >> 1);
        int acc[4] = {off * (int)(int16_t)(hs.x >> hsh), off * (int)(int16_t)(hs.y >> hsh),
                      off * (int)(int16_t)(hs.z >> hsh), off * (int)(int16_t)(hs.w >> hsh)};
        int2 x[4];
#pragma unroll
        for (int p = 0; p < 4; p++)
            x[p] = xp[4 * p];
        const uint32_t sh = r.dsh >> 16, m4 = 0x0f0f0f0fu, m2 = 0x30303030u;
#pragma unroll
        for (int j = 0; j < 2; j++) { /* word j of each piece: elements l = 8i + 4j .. 8i + 4j + 3 */
            const uint32_t L = __funnelshift_r(r.w[j], r.w[j + 1], sh);
            const uint32_t M = __funnelshift_r(r.w[3 + j], r.w[4 + j], sh);
            const uint32_t H = __funnelshift_r(r.w[6 + j], r.w[7 + j], sh);
            const uint32_t q0 = (L & m4) | ((H << 4) & m2), q1 = (M & m4) | ((H << 2) & m2);
            const uint32_t q2 = ((L >> 4) & m4) | (H & m2), q3 = ((M >> 4) & m4) | ((H >> 2) & m2);
            acc[0] = v4_dp4a_us(q0, j ? x[0].y : x[0].x, acc[0]);
            acc[1] = v4_dp4a_us(q1, j ? x[1].y : x[1].x, acc[1]);
            acc[2] = v4_dp4a_us(q2, j ? x[2].y : x[2].x, acc[2]);
            acc[3] = v4_dp4a_us(q3, j ? x[3].y : x[3].x, acc[3]);
        }
        const float t = dx.x * (float)(acc[0] * r.sc[0]) + dx.y * (float)(acc[1] * r.sc[1]) +
                        dx.z * (float)(acc[2] * r.sc[2]) + dx.w * (float)(acc[3] * r.sc[3]);
        return mf_h2f((uint16_t)(r.dsh & 0xffffu)) * t;
    }
};

/* Grid: x = blocks looping over groups of (Q8_WARPS / ks) row pairs (n_grp
 * groups; block-uniform trip count, so every warp reaches q8_reduce's
 * barrier once per group); ks warps share a row pair, warp kp taking slice
 * batches kp, kp + ks, ... of 32 U slices. Software-pipelined: a warp's
 * batches form one stream across its row pairs, and for Q4_K (V4_PIPE)
 * the loads of the next batch (in this row pair or the next one) are issued
 * before the current batch is computed, so a warp always has weight bytes
 * in flight. The other types measured faster without (H200, PERF.md entry
 * 13: their decoders keep more registers per slice, and the second buffer
 * costs them occupancy), so they load the next batch after the current one. */
template <int T, int U, bool SWIGLU>
static __global__ void __launch_bounds__(32 * Q8_WARPS)
gemv_q8v4_kernel(q8_multi p, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                 const int32_t *__restrict__ xs, int64_t n_in, int ks, int64_t n_grp, int pf) {
    constexpr int R = V4_R;
    typedef typename v4s<T>::raw raw;
    __shared__ float part[Q8_WARPS][R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kp = warp % ks, ppb = Q8_WARPS / ks;
    const int64_t n_units = n_in / 32;
    const int64_t total = SWIGLU ? p.n_out[0] : p.start[p.n_w];
    const int64_t step = (int64_t)32 * U * ks, first = (int64_t)kp * 32 * U;
    const bool busy = first < n_units; /* else this warp only joins the reductions */
    auto rows_of = [&](int64_t bg, const uint8_t **row) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            int w;
            const int64_t o = q8_pair_row<SWIGLU>(p, bg * ppb + warp / ks, r, total, &w);
            row[r] = p.w[w] + (uint64_t)(o < 0 ? 0 : o) * p.row_bytes[w]; /* past the end: row 0, no store */
        }
    };
    auto fetch = [&](const uint8_t *const *row, int64_t base, raw (*wr)[R]) {
#pragma unroll
        for (int j = 0; j < U; j++) {
            int64_t k = base + 32 * j + lane;
            k = k < n_units ? k : n_units - 1; /* read again, not added */
#pragma unroll
            for (int r = 0; r < R; r++)
                v4s<T>::fetch(row[r], k, wr[j][r]);
        }
    };
    auto dots = [&](const raw (*wr)[R], int64_t base, float *acc) {
#pragma unroll
        for (int j = 0; j < U; j++) {
            const int64_t k = base + 32 * j + lane;
            const int64_t kk = k < n_units ? k : n_units - 1;
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float v = v4s<T>::dot(wr[j][r], kk, xq, xd, xs);
                acc[r] += k < n_units ? v : 0.0f;
            }
        }
    };
    /* the row pair's sums across its ks warps, then bias / residual / SwiGLU and the store */
    auto finish = [&](int64_t bg, float *acc) {
        q8_reduce<R>(acc, part, lane, warp, ks);
        if (lane == 0 && kp == 0)
            q8_pair_store<SWIGLU, 1>(p, bg * ppb + warp / ks, total, acc, 0, 1);
        if (ks > 1) /* part[] is rewritten by the next group's reduction */
            __syncthreads();
    };
    /* Only an L2 prefetch before the wait, no load: issuing this kernel's
     * first weight loads (into registers) before griddepcontrol.wait made
     * one step of a PDL chain (norm-quant -> FFN GEMV -> quant -> down GEMV,
     * with or without graphs) come out NaN on the H200, and waiting first
     * fixed it (PERF.md entry 13; the cause was not pinned down). The
     * prefetch (MINFER_CUDA_GEMV_V4_PF, default on) measured +4.5 % on
     * qwen2-7B Q4_0 tg128 and neutral on Q4_K_M. */
    if (pf && busy && blockIdx.x < n_grp) /* the first batch's lines into L2 while the kernel before ends */
#pragma unroll
        for (int r = 0; r < R; r++) {
            int w;
            const int64_t o = q8_pair_row<SWIGLU>(p, blockIdx.x * ppb + warp / ks, r, total, &w);
            const uint8_t *rw = p.w[w] + (uint64_t)(o < 0 ? 0 : o) * p.row_bytes[w];
#pragma unroll
            for (int j = 0; j < U; j++) {
                const int64_t k = first + 32 * j + lane;
                if (k < n_units)
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(
                        __cvta_generic_to_global(rw + p.row_bytes[w] * (uint64_t)k / (uint64_t)n_units)));
            }
        }
    mf_pdl_wait();
    mf_pdl_trigger();
    const uint8_t *row[R];
    if constexpr (!V4_PIPE(T)) { /* one batch in flight at a time */
        for (int64_t bg = blockIdx.x; bg < n_grp; bg += gridDim.x) {
            rows_of(bg, row);
            float acc[R] = {};
            for (int64_t base = first; base < n_units; base += step) { /* warp-uniform */
                raw wr[U][R];
                fetch(row, base, wr);
                dots(wr, base, acc);
            }
            finish(bg, acc);
        }
        return;
    }
    int64_t bg = blockIdx.x, base = first;
    raw cur[U][R];
    rows_of(bg, row);
    if (busy && bg < n_grp)
        fetch(row, base, cur);
    while (bg < n_grp) { /* block-uniform */
        float acc[R] = {};
        int64_t nbg = bg;
        const uint8_t *nrow[R];
        while (busy) { /* warp-uniform: the batches of row group bg, the next batch loaded first */
            int64_t nbase = base + step;
            nbg = bg;
            if (nbase >= n_units) {
                nbase = first;
                nbg = bg + gridDim.x;
            }
            if (nbg != bg)
                rows_of(nbg, nrow);
            else
#pragma unroll
                for (int r = 0; r < R; r++)
                    nrow[r] = row[r];
            raw nxt[U][R];
            if (nbg < n_grp)
                fetch(nrow, nbase, nxt);
            dots(cur, base, acc);
#pragma unroll
            for (int j = 0; j < U; j++)
#pragma unroll
                for (int r = 0; r < R; r++)
                    cur[j][r] = nxt[j][r];
            base = nbase;
            if (nbg != bg)
                break;
        }
        finish(bg, acc);
        bg += gridDim.x;
        if (busy)
#pragma unroll
            for (int r = 0; r < R; r++)
                row[r] = nrow[r];
    }
}

#define V4_FOR_EACH_TYPE(X) X(MF_TYPE_Q4_0) X(MF_TYPE_Q5_0) X(MF_TYPE_Q8_0) X(MF_TYPE_Q4_K) X(MF_TYPE_Q6_K)

/* Resident blocks per SM of each instance (mf_cu_q8v4_probe), [type][U index][swiglu]. */
static int v4_bps[V4_Q6K_SLICE + 1][2][2];
static int v4_sms = 132;
static int v4_pf = 1; /* mf_cu_set_gemv_v4_pf (MINFER_CUDA_GEMV_V4_PF) */
static int v4_big_mib = 32; /* mf_cu_set_gemv_v4_big (MINFER_CUDA_GEMV_V4_BIG): Q4_K weights from this many MiB take U 2 */
static int v4_q6k = 1; /* mf_cu_set_gemv_v4_q6k (MINFER_CUDA_GEMV_V4_Q6K): Q6_K on v4s<V4_Q6K_SLICE>, the rule's U */

static int v4_ui(int u) {
    return u == 2 ? 1 : 0;
}

template <int T, int U, bool SW> static cudaError_t v4_go(const q8_multi *p, const int8_t *xq, const float *xd,
                                                          const int32_t *xs, int64_t n_in, cudaStream_t s) {
    const int64_t n_units = n_in / 32;
    const int64_t rows = SW ? p->n_out[0] : p->start[p->n_w];
    const int64_t pairs = SW ? rows : (rows + V4_R - 1) / V4_R;
    const int bps = v4_bps[T][v4_ui(U)][SW];
    const int64_t wave = (int64_t)v4_sms * (bps > 0 ? bps : 4);
    /* more warps per row pair while each still gets a batch of 32 U slices
     * and the blocks still fit one wave */
    int ks = 1;
    while (ks < Q8_WARPS && n_units >= (int64_t)64 * U * ks &&
           (pairs * 2 * ks + Q8_WARPS - 1) / Q8_WARPS <= wave)
        ks *= 2;
    const int64_t n_grp = (pairs + Q8_WARPS / ks - 1) / (Q8_WARPS / ks);
    const int64_t blocks = n_grp < wave ? n_grp : wave;
    return mf_launch(gemv_q8v4_kernel<T, U, SW>, dim3((unsigned)blocks), dim3(32 * Q8_WARPS), 0, s, *p, xq, xd, xs,
                     n_in, ks, n_grp, v4_pf);
}

template <int T>
static cudaError_t v4_type(const q8_multi *p, bool sw, int u, const int8_t *xq, const float *xd, const int32_t *xs,
                           int64_t n_in, cudaStream_t s) {
    switch (u) {
    case 1:
        return sw ? v4_go<T, 1, true>(p, xq, xd, xs, n_in, s) : v4_go<T, 1, false>(p, xq, xd, xs, n_in, s);
    case 2:
        return sw ? v4_go<T, 2, true>(p, xq, xd, xs, n_in, s) : v4_go<T, 2, false>(p, xq, xd, xs, n_in, s);
    default:
        return cudaErrorNotSupported;
    }
}

/* The auto rule (mode -1), from the H200 kernel timings of docs/PERF.md entry
 * 13 (gemv bench, weights streamed from HBM): Q4_K with two slices in
 * flight (its pipelined loop; 7-17 % under v3 on the 7B shapes), the other
 * types one (Q4_0 / Q8_0 / Q6_K layer matmuls 5-20 % under v3 / v1), except
 * the vocab-wide Q6_K lm_head where v1 stays faster (177 vs 190 us) than the
 * generic unit decoder. MINFER_CUDA_GEMV_V4_Q6K=1 (default) sends every Q6_K
 * GEMV, the lm_head included, to the slice decoder with one slice in flight
 * (=2: two; =0: the generic decoder and the v1 lm_head): H200, PERF.md entry
 * 14: lm_head 175 (v1) -> 161 us, 7B down 26.2 -> 25.1 us, qwen2-7B Q4_K_M
 * tg128 378.3 -> 381.2. */
int mf_cu_q8v4_u(int mode, uint32_t wtype, int64_t rows, int64_t n_in) {
    if (mode == 0 || !mf_cu_q8v4_supported(wtype))
        return 0;
    if (mode > 0)
        return mode;
    if (wtype == MF_TYPE_Q6_K && v4_q6k)
        return v4_q6k;
    if (wtype == MF_TYPE_Q6_K && rows > 65536)
        return 0;
    if (wtype != MF_TYPE_Q4_K)
        return 1;
    /* Q4_K: two slices (the pipelined 116-register loop) only for a weight
     * of >= v4_big_mib MiB (32; MINFER_CUDA_GEMV_V4_BIG, 0: always); smaller ones keep more blocks resident with one (H200,
     * PERF.md entry 14: 7B gate+up 76 MB 34.9 (u2) vs 36.6 us, down 38 MB
     * 18.0 vs 21.4; 7B q+k+v 9 MB 10.0 vs 8.5, 4B gate+up 28 MB 20.7 vs
     * 17.6, 4B down 14 MB 10.6 vs 9.9) */
    const double bytes = (double)rows * (double)(n_in / 256) * 144.0;
    return bytes >= (double)v4_big_mib * 1024 * 1024 ? 2 : 1;
}

int mf_cu_q8v4_supported(uint32_t wtype) {
    switch (wtype) {
#define MF_CASE(T) case T:
        V4_FOR_EACH_TYPE(MF_CASE)
#undef MF_CASE
        return 1;
    default:
        return 0;
    }
}

cudaError_t mf_cu_q8v4_launch(const q8_multi *p, uint32_t wtype, bool swiglu, int u, const int8_t *xq,
                              const float *xd, const int32_t *xs, int64_t n_in, cudaStream_t s) {
    if (wtype == MF_TYPE_Q6_K && v4_q6k)
        return v4_type<V4_Q6K_SLICE>(p, swiglu, u, xq, xd, xs, n_in, s);
    switch (wtype) {
#define MF_CASE(T) \
    case T:        \
        return v4_type<T>(p, swiglu, u, xq, xd, xs, n_in, s);
        V4_FOR_EACH_TYPE(MF_CASE)
#undef MF_CASE
    default:
        return cudaErrorNotSupported;
    }
}

template <int T, int U> static void v4_occ() {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_q8v4_kernel<T, U, false>, 32 * Q8_WARPS, 0) ==
        cudaSuccess)
        v4_bps[T][v4_ui(U)][0] = n;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_q8v4_kernel<T, U, true>, 32 * Q8_WARPS, 0) ==
        cudaSuccess)
        v4_bps[T][v4_ui(U)][1] = n;
}

void mf_cu_set_gemv_v4_pf(int on) {
    v4_pf = on != 0;
}

void mf_cu_set_gemv_v4_big(int mib) {
    v4_big_mib = mib < 0 ? 32 : mib;
}

void mf_cu_set_gemv_v4_q6k(int u) {
    v4_q6k = u == 2 ? 2 : u != 0;
}

void mf_cu_q8v4_probe(int sms) {
    if (sms > 0)
        v4_sms = sms;
#define MF_CASE(T) v4_occ<T, 1>(); v4_occ<T, 2>();
    V4_FOR_EACH_TYPE(MF_CASE)
    MF_CASE(V4_Q6K_SLICE)
#undef MF_CASE
}
