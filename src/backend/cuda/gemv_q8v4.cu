/* gemv_q8v4.cu - the decode GEMV (one token) with U weight slices per lane
 * in flight, grid-stride over row pairs, the first weight lines prefetched
 * into L2 before the PDL wait.
 *
 * Why. v3 (gemv_q8.cu) keeps one 32-element unit per lane and row in flight
 * (two rows per warp): ~1.1 KB per warp, ~27 KB per SM at its occupancy,
 * while Little's law for ~4 TB/s at ~0.8 us of loaded DRAM latency wants
 * ~25-30 KB per SM *all the time*; with the load -> compute -> load chain of
 * each warp the average is about half that, and the 7B GEMVs stream at
 * 1.2-2.1 TB/s (docs/PERF.md). And its Q4_K unit decode loads
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
 * tune v4=U (U = 1 or 2; 0 turns it off; cuda_backend.c).
 * U = 4 measured slower (-11 % on qwen2-7B tg128: the registers of 16 raw
 * slices cost occupancy) and was dropped. */
#include "backend/cuda/cuda_args.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/gemv_q8.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/q8w.cuh"

#define V4_R Q8_PAIR_R
/* The loop with the next batch in flight while this one is computed: Q4_K,
 * and Q6_K on the slice decoder at two slices (the auto rule gives those
 * only to small weights with long rows, the 0.5B down GEMV, where a warp's
 * second batch otherwise waits for a whole round trip of its own: Nsight
 * Compute, docs/PERF.md, 85 % of cycles with no eligible warp). */
#define V4_PIPE(T, U) ((T) == MF_TYPE_Q4_K || ((T) == V4_Q6K_SLICE && (U) == 2))

/* Slice k of a row: the weight bytes (fetch, loads only) and its dot with
 * the activation (dot, after the loads land). Default: slice = unit k. The
 * unit decoders (this one and the plane copies') also have the activation
 * apart: afetch (loads only) and dot_x, for the early-load instances (E). */
template <int T> struct v4s {
    struct raw {
        uint32_t q[8];
        float2 dm[2];
    };
    typedef q8_act act;
    static __device__ __forceinline__ void fetch(const uint8_t *row, int64_t k, raw &r) {
        q8w<T>::unit(row, k, r.q, r.dm);
    }
    static __device__ __forceinline__ float dot(const raw &r, int64_t k, const int8_t *__restrict__ xq,
                                                const float *__restrict__ xd, const int32_t *__restrict__ xs) {
        const int4 *xp = (const int4 *)(xq + k * 32);
        const int32_t hs = xs[k];
        return xd[k] * q8_unit_dot(r.q, xp[0], xp[1], r.dm, (float)(int16_t)(hs & 0xffff), (float)(int16_t)(hs >> 16));
    }
    static __device__ __forceinline__ void afetch(int64_t k, const int8_t *__restrict__ xq,
                                                  const float *__restrict__ xd, const int32_t *__restrict__ xs,
                                                  act &x) {
        q8_act_fetch(k, xq, xd, xs, x);
    }
    static __device__ __forceinline__ float dot_x(const raw &r, const act &x) {
        return x.d * q8_unit_dot(r.q, x.a, x.c, r.dm, (float)(int16_t)(x.hs & 0xffff), (float)(int16_t)(x.hs >> 16));
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

/* The Q6_K slice decoder (tune v4_q6k, default 1, see
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

#define V4_N_INST (V4_Q6K_SLICE + 1)
/* Instances with the early-load form (E): the unit decoders on the
 * one-batch loop (not the K-quant slice decoders: Q4_K runs pipelined, and
 * the two-slice Q6_K there lost 0.37 us a layer with it, H200) */
#define V4_HAS_E(T, U) ((T) != MF_TYPE_Q4_K && (T) != V4_Q6K_SLICE && !V4_PIPE(T, U))

/* Offset in its row of the bytes of unit k that the pre-wait prefetch asks
 * L2 for: unit k's share of the row. */
template <int T> static __device__ __forceinline__ uint64_t v4_pf_off(uint64_t row_bytes, int64_t k, int64_t n) {
    return row_bytes * (uint64_t)k / (uint64_t)n;
}

/* tune zc: the epilogue of row group g of a launch of one
 * weight with one warp per row pair (ks 1, so the group is rows 8g ..
 * 8g + 7): each warp stores its pair's rows into y as q8_row_store does for
 * one token without a residual (acc + bias: the same expression, so the
 * same bits) and stages them in zs; after one __syncthreads lanes 0 and 1
 * of warp 0 store the group's 32 bytes into yh (mapped pinned host memory,
 * 32-byte aligned) with one 16-byte store each, one instruction, so a whole
 * line crosses PCIe as one write rather than eight 4-byte ones. A ragged
 * last group goes row by row. zs alternates between two slots: the slot
 * written for group g + 2 is only written after every warp has passed
 * group g + 1's barrier, which warp 0 reaches after reading group g's. */
static __device__ __forceinline__ void v4_zc_store(const q8_multi &p, int64_t g, int64_t total, const float *acc,
                                                   int lane, int warp, float *__restrict__ yh, float *zs) {
    constexpr int GR = Q8_WARPS * V4_R; /* rows a group */
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < V4_R; r++) {
            const int64_t o = (g * Q8_WARPS + warp) * V4_R + r;
            if (o < total) {
                const float b = p.bias[0] ? p.bias[0][o] : 0.0f;
                const float v = acc[r] + b;
                p.y[0][o] = v;
                zs[warp * V4_R + r] = v;
            }
        }
    __syncthreads();
    const int64_t o0 = g * GR, n = total - o0;
    if (warp == 0) {
        if (n >= GR) {
            if (lane < GR / 4)
                reinterpret_cast<float4 *>(yh + o0)[lane] = reinterpret_cast<const float4 *>(zs)[lane];
        } else if (lane < n) {
            yh[o0 + lane] = zs[lane];
        }
    }
}

/* The epilogue's loads for row pair g of a plain (no SwiGLU) launch: each
 * row's bias and residual element (q8_row_store's, one token), issued when
 * the pair's group starts (E instances), so the store after the reduction
 * does not wait a round trip for them; the residual was written before this
 * kernel's PDL wait and no other block writes row g's outputs, so reading
 * it early reads the same value (also where y is the residual itself). */
struct v4_epi {
    float b[V4_R], x[V4_R];
};
static __device__ __forceinline__ void v4_epi_fetch(const q8_multi &p, int64_t g, int64_t total, v4_epi &e) {
#pragma unroll
    for (int r = 0; r < V4_R; r++) {
        int w;
        const int64_t o = q8_pair_row<false>(p, g, r, total, &w);
        e.b[r] = o >= 0 && p.bias[w] ? p.bias[w][o] : 0.0f;
        e.x[r] = o >= 0 && p.res[w] ? p.res[w][o] : 0.0f;
    }
}
/* q8_pair_store<false, 1>(p, g, total, acc, 0, 1) with the loads of e: the
 * same expression, so the same bits */
static __device__ __forceinline__ void v4_epi_store(const q8_multi &p, int64_t g, int64_t total, const float *acc,
                                                    const v4_epi &e) {
#pragma unroll
    for (int r = 0; r < V4_R; r++) {
        int w;
        const int64_t o = q8_pair_row<false>(p, g, r, total, &w);
        if (o >= 0)
            p.y[w][o] = p.res[w] ? e.x[r] + (acc[r] + e.b[r]) : acc[r] + e.b[r];
    }
}

/* Grid: x = blocks looping over groups of (Q8_WARPS / ks) row pairs (n_grp
 * groups; block-uniform trip count, so every warp reaches q8_reduce's
 * barrier once per group); ks warps share a row pair, warp kp taking slice
 * batches kp, kp + ks, ... of 32 U slices. Software-pipelined: a warp's
 * batches form one stream across its row pairs, and for Q4_K and the
 * two-slice Q6_K (V4_PIPE) the loads of the next batch (in this row pair or
 * the next one) are issued before the current batch is computed, so a warp
 * always has weight bytes in flight. The other types measured faster without (H200, PERF.md entry
 * 13: their decoders keep more registers per slice, and the second buffer
 * costs them occupancy), so they load the next batch after the current one.
 * v4_rows is that loop for block bx of a grid of gx blocks (the single-type
 * kernel: blockIdx.x of gridDim.x; the mixed-type kernel: its blocks split
 * into one such grid per weight type); part is the block's reduction buffer.
 * E (tune v4_early; unit decoders on the one-batch loop, plain
 * launches): a batch's activation is loaded with its weight bytes, in the
 * block before the loop body that uses them, and the epilogue's bias and
 * residual when the group starts. Left to the compiler (SASS, nvcc 13.0
 * sm_90), the one-block form issues some loads (the second row, d, xd)
 * only after the first dp4a has waited for the rest, and the store waits
 * for the residual after the reduction: one or two more round trips. Same
 * expressions, same bits; more registers. */
template <int T, int U, bool SWIGLU, bool ZC = false, bool E = false>
static __device__ __forceinline__ void v4_rows(const q8_multi &p, const int8_t *__restrict__ xq,
                                               const float *__restrict__ xd, const int32_t *__restrict__ xs,
                                               int64_t n_in, int ks, int64_t n_grp, int pf, float (*part)[V4_R],
                                               unsigned bx, unsigned gx, float *yh = nullptr,
                                               float (*zst)[Q8_WARPS * V4_R] = nullptr) {
    static_assert(!ZC || (U == 1 && !SWIGLU), "tune zc: one slice, one weight");
    static_assert(!E || (V4_HAS_E(T, U) && !SWIGLU && !ZC), "the early-load form: unit decoders, plain launches");
    constexpr int R = V4_R;
    typedef typename v4s<T>::raw raw;
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
    [[maybe_unused]] int zslot = 0; /* ZC: the staging slot of this group (two, alternating) */
    [[maybe_unused]] v4_epi epi;
    auto finish = [&](int64_t bg, float *acc) {
        q8_reduce<R>(acc, part, lane, warp, ks);
        if constexpr (ZC) {
            v4_zc_store(p, bg, total, acc, lane, warp, yh, zst[zslot ^= 1]);
        } else if (lane == 0 && kp == 0) {
            if constexpr (E)
                v4_epi_store(p, bg * ppb + warp / ks, total, acc, epi);
            else
                q8_pair_store<SWIGLU, 1>(p, bg * ppb + warp / ks, total, acc, 0, 1);
        }
        if (ks > 1) /* part[] is rewritten by the next group's reduction */
            __syncthreads();
    };
    /* Only an L2 prefetch before the wait, no load: issuing this kernel's
     * first weight loads (into registers) before griddepcontrol.wait made
     * one step of a PDL chain (norm-quant -> FFN GEMV -> quant -> down GEMV,
     * with or without graphs) come out NaN on the H200, and waiting first
     * fixed it (docs/PERF.md; the cause was not pinned down). The
     * prefetch (tune v4_pf, default on) measured +4.5 % on
     * qwen2-7B Q4_0 tg128 and neutral on Q4_K_M. */
    /* the first batch's lines (pf 1), or with one slice in flight every
     * batch of the first row group (pf 2), into L2 while the kernel before
     * ends (two-slice instances keep the one-batch form: the loop cost them
     * registers and spills, and the auto rule gives pf 2 only to the small
     * launches, which run one slice) */
    if (pf && busy && bx < n_grp)
#pragma unroll
        for (int r = 0; r < R; r++) {
            int w;
            const int64_t o = q8_pair_row<SWIGLU>(p, bx * ppb + warp / ks, r, total, &w);
            const uint8_t *rw = p.w[w] + (uint64_t)(o < 0 ? 0 : o) * p.row_bytes[w];
            if constexpr (U == 1) {
                for (int64_t k = first + lane; k < n_units; k += step) {
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(
                        __cvta_generic_to_global(rw + v4_pf_off<T>(p.row_bytes[w], k, n_units))));
                    if (pf < 2)
                        break;
                }
            } else {
#pragma unroll
                for (int j = 0; j < U; j++) {
                    const int64_t k = first + 32 * j + lane;
                    if (k < n_units)
                        asm volatile("prefetch.global.L2 [%0];" ::"l"(
                            __cvta_generic_to_global(rw + v4_pf_off<T>(p.row_bytes[w], k, n_units))));
                }
            }
        }
    mf_pdl_wait();
    mf_pdl_trigger();
    const uint8_t *row[R];
    if constexpr (E) {
        typedef typename v4s<T>::act act;
        raw wr[U][R];
        act xa[U];
        auto fetch_e = [&](int64_t base) { /* the weights and the activation: loads only */
            fetch(row, base, wr);
#pragma unroll
            for (int j = 0; j < U; j++) {
                const int64_t k = base + 32 * j + lane;
                v4s<T>::afetch(k < n_units ? k : n_units - 1, xq, xd, xs, xa[j]);
            }
        };
        for (int64_t bg = bx; bg < n_grp; bg += gx) {
            rows_of(bg, row);
            if (kp == 0) /* the warp that stores */
                v4_epi_fetch(p, bg * ppb + warp / ks, total, epi);
            float acc[R] = {};
            int64_t base = first;
            if (base < n_units) /* warp-uniform */
                fetch_e(base);
            while (base < n_units) {
#pragma unroll
                for (int j = 0; j < U; j++) {
                    const int64_t k = base + 32 * j + lane;
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        const float v = v4s<T>::dot_x(wr[j][r], xa[j]);
                        acc[r] += k < n_units ? v : 0.0f;
                    }
                }
                base += step;
                if (base < n_units)
                    fetch_e(base);
            }
            finish(bg, acc);
        }
        return;
    }
    if constexpr (!V4_PIPE(T, U)) { /* one batch in flight at a time */
        for (int64_t bg = bx; bg < n_grp; bg += gx) {
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
    int64_t bg = bx, base = first;
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
                nbg = bg + gx;
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
        bg += gx;
        if (busy)
#pragma unroll
            for (int r = 0; r < R; r++)
                row[r] = nrow[r];
    }
}

template <int T, int U, bool SWIGLU, bool E = false>
static __global__ void __launch_bounds__(32 * Q8_WARPS)
gemv_q8v4_kernel(q8_multi p, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                 const int32_t *__restrict__ xs, int64_t n_in, int ks, int64_t n_grp, int pf) {
    __shared__ float part[Q8_WARPS][V4_R];
    v4_rows<T, U, SWIGLU, false, E>(p, xq, xd, xs, n_in, ks, n_grp, pf, part, blockIdx.x, gridDim.x);
}

/* tune zc: the single-weight, one-slice, one-warp-per-row-pair
 * instance whose epilogue also writes the rows into yh (v4_zc_store). */
template <int T>
static __global__ void __launch_bounds__(32 * Q8_WARPS)
gemv_q8v4_zc_kernel(q8_multi p, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                    const int32_t *__restrict__ xs, int64_t n_in, int ks, int64_t n_grp, int pf,
                    float *__restrict__ yh) {
    __shared__ float part[Q8_WARPS][V4_R];
    __shared__ __align__(16) float zst[2][Q8_WARPS * V4_R];
    v4_rows<T, 1, false, true>(p, xq, xd, xs, n_in, ks, n_grp, pf, part, blockIdx.x, gridDim.x, yh, zst);
}

/* Two runs of weights of different types sharing the input (Q/K of one
 * type, V of another: the use_more_bits layers of the K-quant mixes) in one
 * launch (tune qkv_mix): blocks [0, nba) are run a's grid (pa, type
 * TA), the rest run b's (pb, TB), each block running the single-type loop
 * of its run with the ks and group count that run's own launch would take
 * (v4_plan). A row's slices, warps and reduction are then exactly those of
 * the separate launches, so are its bits; the kernel only removes the
 * second launch (and its wait for the first) from the chain. One slice in
 * flight, no SwiGLU: the only form the QKV of those models takes. */
template <int TA, int TB, bool E = false>
static __global__ void __launch_bounds__(32 * Q8_WARPS)
gemv_q8v4_mix_kernel(q8_multi pa, q8_multi pb, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                     const int32_t *__restrict__ xs, int64_t n_in, int ksa, int ksb, int64_t n_grpa, int64_t n_grpb,
                     unsigned nba, int pf) {
    __shared__ float part[Q8_WARPS][V4_R];
    if (blockIdx.x < nba) /* block-uniform */
        v4_rows<TA, 1, false, false, E>(pa, xq, xd, xs, n_in, ksa, n_grpa, pf, part, blockIdx.x, nba);
    else
        v4_rows<TB, 1, false, false, E>(pb, xq, xd, xs, n_in, ksb, n_grpb, pf, part, blockIdx.x - nba,
                                        gridDim.x - nba);
}

#define V4_FOR_EACH_TYPE(X) X(MF_TYPE_Q4_0) X(MF_TYPE_Q5_0) X(MF_TYPE_Q8_0) X(MF_TYPE_Q4_K) X(MF_TYPE_Q6_K)

static_assert(V4_N_INST <= MF_CU_OCC_INST, "mf_cu_gemv_occ holds every v4 instance");

/* A wave of resident blocks: the device's SMs x the measured blocks per SM
 * (bps, 0: not measured, then `dflt`). */
static int64_t v4_wave(const mf_cu_gemv_tune *g, int bps, int dflt) {
    return (int64_t)(g->sms > 0 ? g->sms : 1) * (bps > 0 ? bps : dflt);
}
#define V4_OCC(g, f) ((g)->occ ? (g)->occ->f : 0)
#define V4_PF_ALL_BYTES ((uint64_t)4 << 20)

static uint64_t v4_bytes(const q8_multi *p, bool sw) {
    uint64_t b = 0;
    for (int i = 0; i < p->n_w; i++)
        b += (uint64_t)(sw ? p->n_out[0] : p->start[i + 1] - p->start[i]) * p->row_bytes[i];
    return b;
}

/* The kernels' pf for a launch of p: under 3 (auto), every batch of the
 * first row group (2) when the launch's weights are at most 4 MiB (the 0.5B
 * down GEMV: +1.9 % tg on the 0.5B Q4_0), else the first batch (1): the 7B
 * GEMVs lost 7 % with every batch (H200). */
static int v4_pf_of(const mf_cu_gemv_tune *g, const q8_multi *p, bool sw) {
    if (g->v4_pf != 3)
        return g->v4_pf;
    return v4_bytes(p, sw) <= V4_PF_ALL_BYTES ? 2 : 1;
}

/* Whether a plain launch of b weight bytes takes its E instance: under 2
 * (auto) the latency-bound launches of <= 4 MiB (the 0.5B's) */
static bool v4_early_of(const mf_cu_gemv_tune *g, uint64_t b) {
    return g->v4_early == 1 || (g->v4_early == 2 && b <= V4_PF_ALL_BYTES);
}
/* tune v4_q6k=3 (auto, the default): two slices in flight for
 * a Q6_K weight of <= 4 MiB with rows of >= 4096 (the 0.5B down GEMV, 896 x
 * 4864: 5.5 -> 5.4 us a layer; H200, docs/PERF.md: 0.5B Q4_K_M tg128
 * 1,731.9 with =1 -> 1,755.0), one elsewhere. Two everywhere lost 3.5 % on
 * the 7B and 5 % on the 4B: a small V (the 7B's 512 x 3584) with two slices
 * loses its mixed QKV launch, which has one-slice instances only. */
#define V4_Q6K_U2_BYTES ((uint64_t)4 << 20)
#define V4_Q6K_U2_MIN_IN 4096

static int v4_ui(int u) {
    return u == 2 ? 1 : 0;
}

/* The grid of instance <T, U, SW> over p: warps per row pair *ks, row
 * groups *n_grp, and the block count it returns (at most one wave). The
 * mixed-type launch plans each run with it too: ks fixes a row's summation
 * order, so both launch forms must take the same. */
template <int T, int U, bool SW, bool E = false>
static int64_t v4_plan(const mf_cu_gemv_tune *g, const q8_multi *p, int64_t n_in, int *ks_out, int64_t *n_grp) {
    const int64_t n_units = n_in / 32;
    const int64_t rows = SW ? p->n_out[0] : p->start[p->n_w];
    const int64_t pairs = SW ? rows : (rows + V4_R - 1) / V4_R;
    const int bps = E ? V4_OCC(g, v4e[T][v4_ui(U)]) : V4_OCC(g, v4[T][v4_ui(U)][SW]);
    const int64_t wave = v4_wave(g, bps, 4);
    /* ks by the plain instance's wave: an E one (maybe more blocks a SM)
     * sums a row in the same order */
    const int64_t kwave = v4_wave(g, V4_OCC(g, v4[T][v4_ui(U)][SW]), 4);
    /* more warps per row pair while each still gets a batch of 32 U slices
     * and the blocks still fit one wave */
    int ks = 1;
    while (ks < Q8_WARPS && n_units >= (int64_t)64 * U * ks &&
           (pairs * 2 * ks + Q8_WARPS - 1) / Q8_WARPS <= kwave)
        ks *= 2;
    *ks_out = ks;
    *n_grp = (pairs + Q8_WARPS / ks - 1) / (Q8_WARPS / ks);
    return *n_grp < wave ? *n_grp : wave;
}

template <int T, int U, bool SW, bool E = false>
static cudaError_t v4_go(const mf_cu_gemv_tune *g, const q8_multi *p, const int8_t *xq, const float *xd,
                         const int32_t *xs, int64_t n_in, cudaStream_t s) {
    if constexpr (!E && !SW && V4_HAS_E(T, U))
        if (v4_early_of(g, v4_bytes(p, false)))
            return v4_go<T, U, SW, true>(g, p, xq, xd, xs, n_in, s);
    int ks;
    int64_t n_grp;
    const int64_t blocks = v4_plan<T, U, SW, E>(g, p, n_in, &ks, &n_grp);
    return mf_launch(gemv_q8v4_kernel<T, U, SW, E>, dim3((unsigned)blocks), dim3(32 * Q8_WARPS), 0, s, g->pdl, *p,
                     xq, xd, xs, n_in, ks, n_grp, v4_pf_of(g, p, SW));
}

/* The type pairs with a mixed-type kernel (instance ids: V4_Q6K_SLICE for
 * Q6_K on the slice decoder), from tools/quant_mix.c's rules for the QKV of
 * Q4_K_M / Q5_K_M (V Q6_K in the use_more_bits layers) and Q3_K_M (V Q4_K /
 * Q5_K), with the fallbacks of a row that is not a multiple of 256 (Q4_K ->
 * Q5_0, Q6_K -> Q8_0, Q3_K -> Q4_0, Q5_K -> Q5_1). Only the pairs with a v4
 * decoder on both sides: Q4_K + Q6_K (7B, 4B Q4_K_M), Q5_0 + Q8_0 (0.5B
 * Q4_K_M), Q4_0 + Q5_0 (0.5B Q3_K_M); Q5_K_M, Q4_K_S and the Q5_1 / Q5_K /
 * Q3_K sides have no v4 kernel at all. */
#define V4_FOR_EACH_MIX(X) \
    X(0, MF_TYPE_Q4_K, V4_Q6K_SLICE) X(1, MF_TYPE_Q5_0, MF_TYPE_Q8_0) X(2, MF_TYPE_Q4_0, MF_TYPE_Q5_0)
#define V4_N_MIX 3
static_assert(V4_N_MIX <= 4, "mf_cu_gemv_occ.mix holds every mixed instance");
static int64_t v4_mix_launches;  /* mf_cu_q8v4_mix_count */

/* Run a (pa, instance ia) and run b in one launch: each run's grid as its
 * own launch would plan it, the two together cut to one wave of the mixed
 * instance (each keeps at least one block; a block loops over its run's
 * groups, so the cut changes no result). */
template <int TA, int TB, bool E = false>
static cudaError_t v4_go_mix(const mf_cu_gemv_tune *g, const q8_multi *pa, const q8_multi *pb, int mi,
                             const int8_t *xq, const float *xd, const int32_t *xs, int64_t n_in, cudaStream_t s) {
    if constexpr (!E && V4_HAS_E(TA, 1) && V4_HAS_E(TB, 1)) /* the E form by the two runs' bytes together */
        if (v4_early_of(g, v4_bytes(pa, false) + v4_bytes(pb, false)))
            return v4_go_mix<TA, TB, true>(g, pa, pb, mi, xq, xd, xs, n_in, s);
    int ksa, ksb;
    int64_t ga, gb;
    int64_t ba = v4_plan<TA, 1, false, E>(g, pa, n_in, &ksa, &ga);
    int64_t bb = v4_plan<TB, 1, false, E>(g, pb, n_in, &ksb, &gb);
    const int64_t wave = v4_wave(g, V4_OCC(g, mix[mi][E]), 4);
    if (ba + bb > wave && wave >= 2) {
        const int64_t a = wave * ba / (ba + bb);
        ba = a < 1 ? 1 : a > wave - 1 ? wave - 1 : a;
        bb = wave - ba;
    }
    const cudaError_t e = mf_launch(gemv_q8v4_mix_kernel<TA, TB, E>, dim3((unsigned)(ba + bb)), dim3(32 * Q8_WARPS), 0,
                                    s, g->pdl, *pa, *pb, xq, xd, xs, n_in, ksa, ksb, ga, gb, (unsigned)ba, v4_pf_of(g, pa, false));
    v4_mix_launches += e == cudaSuccess;
    return e;
}

int64_t mf_cu_q8v4_mix_count(void) {
    return v4_mix_launches;
}

template <int T>
static cudaError_t v4_type(const mf_cu_gemv_tune *g, const q8_multi *p, bool sw, int u, const int8_t *xq,
                           const float *xd, const int32_t *xs, int64_t n_in, cudaStream_t s) {
    switch (u) {
    case 1:
        return sw ? v4_go<T, 1, true>(g, p, xq, xd, xs, n_in, s) : v4_go<T, 1, false>(g, p, xq, xd, xs, n_in, s);
    case 2:
        return sw ? v4_go<T, 2, true>(g, p, xq, xd, xs, n_in, s) : v4_go<T, 2, false>(g, p, xq, xd, xs, n_in, s);
    default:
        return cudaErrorNotSupported;
    }
}

/* The auto rule (mode -1), from the H200 kernel timings of docs/PERF.md entry
 * 13 (gemv bench, weights streamed from HBM): Q4_K with two slices in
 * flight (its pipelined loop; 7-17 % under v3 on the 7B shapes), the other
 * types one (Q4_0 / Q8_0 / Q6_K layer matmuls 5-20 % under v3 / v1), except
 * the vocab-wide Q6_K lm_head where v1 stays faster (177 vs 190 us) than the
 * generic unit decoder. tune v4_q6k=1 (default) sends every Q6_K
 * GEMV, the lm_head included, to the slice decoder with one slice in flight
 * (=2: two; =0: the generic decoder and the v1 lm_head): H200, PERF.md entry
 * 14: lm_head 175 (v1) -> 161 us, 7B down 26.2 -> 25.1 us, qwen2-7B Q4_K_M
 * tg128 378.3 -> 381.2. */
int mf_cu_q8v4_u(const mf_cu_gemv_tune *g, uint32_t wtype, int64_t rows, int64_t n_in) {
    if (g->v4 == 0 || !mf_cu_q8v4_supported(wtype))
        return 0;
    if (g->v4 > 0)
        return g->v4;
    if (wtype == MF_TYPE_Q6_K && g->v4_q6k == 3) /* auto: two slices for long rows of a small weight */
        return n_in >= V4_Q6K_U2_MIN_IN && (double)rows * (double)(n_in / 256) * 210.0 <= (double)V4_Q6K_U2_BYTES
                   ? 2
                   : 1;
    if (wtype == MF_TYPE_Q6_K && g->v4_q6k)
        return g->v4_q6k;
    if (wtype == MF_TYPE_Q6_K && rows > 65536)
        return 0;
    if (wtype != MF_TYPE_Q4_K)
        return 1;
    /* Q4_K: two slices (the pipelined 116-register loop) only for a weight
     * of >= g->v4_big_mib MiB (32; tune v4_big, 0: always); smaller ones keep more blocks resident with one (H200,
     * docs/PERF.md: 7B gate+up 76 MB 34.9 (u2) vs 36.6 us, down 38 MB
     * 18.0 vs 21.4; 7B q+k+v 9 MB 10.0 vs 8.5, 4B gate+up 28 MB 20.7 vs
     * 17.6, 4B down 14 MB 10.6 vs 9.9) */
    const double bytes = (double)rows * (double)(n_in / 256) * 144.0;
    return bytes >= (double)g->v4_big_mib * 1024 * 1024 ? 2 : 1;
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

cudaError_t mf_cu_q8v4_launch(const mf_cu_gemv_tune *g, const q8_multi *p, uint32_t wtype, bool swiglu, int u,
                              const int8_t *xq, const float *xd, const int32_t *xs, int64_t n_in, cudaStream_t s) {
    if (wtype == MF_TYPE_Q6_K && g->v4_q6k)
        return v4_type<V4_Q6K_SLICE>(g, p, swiglu, u, xq, xd, xs, n_in, s);
    switch (wtype) {
#define MF_CASE(T) \
    case T:        \
        return v4_type<T>(g, p, swiglu, u, xq, xd, xs, n_in, s);
        V4_FOR_EACH_TYPE(MF_CASE)
#undef MF_CASE
    default:
        return cudaErrorNotSupported;
    }
}

/* The instance id weight type wtype runs on (Q6_K: the slice decoder while
 * tune v4_q6k is on). */
static int v4_inst(const mf_cu_gemv_tune *g, uint32_t wtype) {
    return wtype == MF_TYPE_Q6_K && g->v4_q6k ? V4_Q6K_SLICE : (int)wtype;
}

/* The warps per row pair (ks) v4_plan gives a launch of u slices on
 * instance inst over `rows` rows of one weight (swiglu false) or `rows`
 * outputs of a gate/up pair (swiglu true); 0: no v4 instance. A row's
 * summation order is fixed by (u, ks) alone. */
static int v4_plan_ks(const mf_cu_gemv_tune *g, int inst, int u, bool swiglu, int64_t rows, int64_t n_in) {
    q8_multi p = {};
    p.n_w = swiglu ? 2 : 1;
    p.n_out[0] = rows;
    p.start[1] = rows;
    if (swiglu) {
        p.n_out[1] = rows;
        p.start[2] = 2 * rows;
    }
    int ks = 0;
    int64_t n_grp;
    switch (inst) {
#define MF_CASE(I)                                                                         \
    case I:                                                                                \
        if (u == 1)                                                                        \
            swiglu ? (void)v4_plan<I, 1, true>(g, &p, n_in, &ks, &n_grp)                   \
                   : (void)v4_plan<I, 1, false>(g, &p, n_in, &ks, &n_grp);                 \
        else                                                                               \
            swiglu ? (void)v4_plan<I, 2, true>(g, &p, n_in, &ks, &n_grp)                   \
                   : (void)v4_plan<I, 2, false>(g, &p, n_in, &ks, &n_grp);                 \
        break;
        V4_FOR_EACH_TYPE(MF_CASE)
        MF_CASE(V4_Q6K_SLICE)
#undef MF_CASE
    default:
        return 0;
    }
    return ks;
}

/* ---- tune zc: the lm_head GEMV also writes the logits into host memory ---- */

/* The instances with a ZC kernel: the block decoders of the
 * types a vocab-wide head takes at one slice in flight under the auto rule
 * (Q8_0, Q4_0, Q5_0; Q6_K on the slice decoder). A Q4_K head (two slices
 * from 32 MiB) or Q6_K on the unit decoder keeps the copy. */
#define ZC_FOR_EACH_INST(X) X(MF_TYPE_Q4_0) X(MF_TYPE_Q5_0) X(MF_TYPE_Q8_0) X(V4_Q6K_SLICE)

static int64_t v4_zc_launches;   /* mf_cu_q8v4_zc_count */

static bool v4_zc_inst(int i) {
    switch (i) {
#define MF_CASE(I) case I:
        ZC_FOR_EACH_INST(MF_CASE)
#undef MF_CASE
        return true;
    default:
        return false;
    }
}

int mf_cu_q8v4_zc_ok(const mf_cu_gemv_tune *g, uint32_t wtype, int u, int64_t rows, int64_t n_in) {
    return u == 1 && rows > 0 && n_in > 0 && v4_zc_inst(v4_inst(g, wtype)) &&
           v4_plan_ks(g, v4_inst(g, wtype), 1, false, rows, n_in) == 1;
}

int64_t mf_cu_q8v4_zc_count(void) {
    return v4_zc_launches;
}

/* The ZC launch of p (one weight, no residual): the plan of the plain
 * one-slice launch (ks 1, the same row groups; only the wave is the ZC
 * instance's own). */
template <int T>
static cudaError_t v4_go_zc(const mf_cu_gemv_tune *g, const q8_multi *p, const int8_t *xq, const float *xd,
                            const int32_t *xs, int64_t n_in, float *yh, cudaStream_t s) {
    int ks;
    int64_t n_grp;
    int64_t blocks = v4_plan<T, 1, false>(g, p, n_in, &ks, &n_grp);
    if (ks != 1)
        return cudaErrorNotSupported;
    const int64_t wave = v4_wave(g, V4_OCC(g, zc[T]), 4);
    blocks = n_grp < wave ? n_grp : wave;
    return mf_launch(gemv_q8v4_zc_kernel<T>, dim3((unsigned)blocks), dim3(32 * Q8_WARPS), 0, s, g->pdl, *p, xq, xd, xs,
                     n_in, ks, n_grp, v4_pf_of(g, p, false), yh);
}

cudaError_t mf_cu_q8v4_launch_zc(const mf_cu_gemv_tune *g, const q8_multi *p, uint32_t wtype, const int8_t *xq,
                                 const float *xd, const int32_t *xs, int64_t n_in, float *yh, cudaStream_t s) {
    const int64_t rows = p->start[1];
    if (p->n_w != 1 || p->res[0] || !yh || ((uintptr_t)yh & 31) || !mf_cu_q8v4_zc_ok(g, wtype, 1, rows, n_in))
        return cudaErrorNotSupported;
    cudaError_t e = cudaErrorNotSupported;
    switch (v4_inst(g, wtype)) {
#define MF_CASE(I)                                        \
    case I:                                               \
        e = v4_go_zc<I>(g, p, xq, xd, xs, n_in, yh, s);   \
        break;
        ZC_FOR_EACH_INST(MF_CASE)
#undef MF_CASE
    default:
        break;
    }
    v4_zc_launches += e == cudaSuccess;
    return e;
}

/* The mixed instance of instances ia and ib in either order (*swap: ib is
 * its first type), or -1. */
static int v4_mix_find(int ia, int ib, bool *swap) {
#define MF_CASE(I, A, B)                     \
    if (ia == (A) && ib == (B)) {            \
        *swap = false;                       \
        return I;                            \
    }                                        \
    if (ia == (B) && ib == (A)) {            \
        *swap = true;                        \
        return I;                            \
    }
    V4_FOR_EACH_MIX(MF_CASE)
#undef MF_CASE
    return -1;
}

int mf_cu_q8v4_mix_supported(const mf_cu_gemv_tune *g, uint32_t ta, int ua, uint32_t tb, int ub) {
    bool swap;
    return ua == 1 && ub == 1 && v4_mix_find(v4_inst(g, ta), v4_inst(g, tb), &swap) >= 0;
}

cudaError_t mf_cu_q8v4_launch_mix(const mf_cu_gemv_tune *g, const q8_multi *pa, uint32_t ta, int ua,
                                  const q8_multi *pb, uint32_t tb, int ub, const int8_t *xq, const float *xd,
                                  const int32_t *xs, int64_t n_in, cudaStream_t s) {
    bool swap = false;
    int mi = -1;
    if (ua == 1 && ub == 1)
        mi = v4_mix_find(v4_inst(g, ta), v4_inst(g, tb), &swap);
    if (swap) { /* the instance's first type is run b's */
        const q8_multi *t = pa;
        pa = pb;
        pb = t;
    }
    cudaError_t e = cudaErrorNotSupported;
    switch (mi) {
#define MF_CASE(I, A, B) \
    case I:              \
        e = v4_go_mix<A, B>(g, pa, pb, I, xq, xd, xs, n_in, s); \
        break;
        V4_FOR_EACH_MIX(MF_CASE)
#undef MF_CASE
    default:
        break;
    }
    return e;
}

template <int T, int U> static void v4_occ(mf_cu_gemv_occ *o) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_q8v4_kernel<T, U, false>, 32 * Q8_WARPS, 0) ==
        cudaSuccess)
        o->v4[T][v4_ui(U)][0] = n;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_q8v4_kernel<T, U, true>, 32 * Q8_WARPS, 0) ==
        cudaSuccess)
        o->v4[T][v4_ui(U)][1] = n;
    if constexpr (V4_HAS_E(T, U))
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_q8v4_kernel<T, U, false, true>, 32 * Q8_WARPS,
                                                          0) == cudaSuccess)
            o->v4e[T][v4_ui(U)] = n;
}

void mf_cu_q8v4_occupancy(mf_cu_gemv_occ *o) {
#define MF_CASE(T) v4_occ<T, 1>(o); v4_occ<T, 2>(o);
    V4_FOR_EACH_TYPE(MF_CASE)
    MF_CASE(V4_Q6K_SLICE)
#undef MF_CASE
    int n = 0;
#define MF_CASE(I, A, B)                                                                                 \
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_q8v4_mix_kernel<A, B>, 32 * Q8_WARPS, 0) == \
        cudaSuccess)                                                                                     \
        o->mix[I][0] = n;                                                                                \
    if (V4_HAS_E(A, 1) && V4_HAS_E(B, 1) &&                                                              \
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(                                                   \
            &n, gemv_q8v4_mix_kernel<A, B, V4_HAS_E(A, 1) && V4_HAS_E(B, 1)>, 32 * Q8_WARPS, 0) ==       \
            cudaSuccess)                                                                                 \
        o->mix[I][1] = n;
    V4_FOR_EACH_MIX(MF_CASE)
#undef MF_CASE
#define MF_CASE(I)                                                                                          \
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_q8v4_zc_kernel<I>, 32 * Q8_WARPS, 0) == cudaSuccess) \
        o->zc[I] = n;
    ZC_FOR_EACH_INST(MF_CASE)
#undef MF_CASE
}

/* ---- tune ffn_q8b: the SwiGLU GEMV also writes the down GEMV's int8 input ---- */

/* Why. In a decode layer the gate/up + SwiGLU GEMV is followed by a
 * quantize kernel (q8_quant_kernel, ~1.7 us on the critical path of the
 * replayed 0.5B graph, docs/PERF.md) whose only job is to turn h into
 * the down GEMV's int8 input. The earlier fold (MINFER_CUDA_FFN_Q8, entry
 * 14) let the warp that completed a 32-row unit quantize it, behind a
 * __threadfence + atomic per row: every warp stalled on it. Here a block
 * owns one whole unit, 32 consecutive outputs (SWQ_WARPS warps x SWQ_OPW
 * outputs), so the quantization needs one __syncthreads and nothing
 * across blocks.
 *
 * Bits. Each output is computed exactly as the v4 SwiGLU instance with one
 * slice in flight and one warp per row pair (ks 1, which the rule checks
 * with v4_plan) computes it: lane l sums the dots of slices l, l + 32, ...
 * of the gate row and of the up row in that order (v4s<T>::fetch / dot,
 * the slice index clamped and the value dropped past the row), the butterfly
 * of q8_reduce, then q8_swiglu_store's f32 expression. So h is bitwise the
 * v4 kernel's, and warp 0's q8_unit over the block's 32 h values (from
 * shared memory) is bitwise q8_quant_kernel's over the same 32 floats.
 * The four (gate, up) row pairs of a warp are all loaded before any is
 * computed: 8 slices a lane in flight (the v4 kernel keeps 2 a warp and
 * relies on more warps). n_out / 32 blocks of 256 threads: 152 for the
 * 0.5B's 4864, one wave on 132 SMs at 2 blocks a SM. */
#define SWQ_MAX_IN 2048  /* the size rule: n_in up to this (0.5B / 1.5B gate/up: latency-bound) */

/* The block form (H200, docs/PERF.md, "FFN_Q8B forms"): 8 warps x 4
 * consecutive outputs, a warp's 4 outputs in two rounds of 2 (4 rows in
 * flight), under (256, 3): 64 / 76 / 68 / 80 registers a thread (Q4_0 /
 * Q5_0 / Q4_K / Q6_K slice, ptxas -v, nvcc 13.0 sm_90), 3 blocks a SM, so
 * the 1.5B's 280 blocks are one wave on 132 SMs. The form with all 4
 * outputs in flight made the down GEMV after it slower (its PDL-launched
 * blocks become resident only in the registers this kernel leaves free). */
#define SWQ_WARPS 8
#define SWQ_OPW 4 /* consecutive outputs a warp: SWQ_WARPS * SWQ_OPW = 32, one int8 unit */
#define SWQ_G 2   /* of them loaded before any is computed */
#define SWQ_MINB 3

/* NW warps x OPW consecutive outputs (NW * OPW = 32: the block's int8
 * unit), G of them (2 G rows) loaded before any is computed (OPW / G
 * rounds a warp). */
template <int T, int NW, int OPW, int G>
static __device__ __forceinline__ void swq8_body(const q8_multi &p, const int8_t *__restrict__ xq,
                                                 const float *__restrict__ xd, const int32_t *__restrict__ xs,
                                                 int64_t n_in, int pf, int8_t *__restrict__ oq,
                                                 float *__restrict__ od, int32_t *__restrict__ os, float *hs) {
    static_assert(NW * OPW == 32 && OPW % G == 0, "a block owns one 32-value int8 unit");
    typedef typename v4s<T>::raw raw;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t n_units = n_in / 32;
    const int64_t o0 = (int64_t)blockIdx.x * 32 + warp * OPW; /* n_out % 32 == 0: every row exists */
    const uint8_t *row[OPW][2];
#pragma unroll
    for (int i = 0; i < OPW; i++)
#pragma unroll
        for (int r = 0; r < 2; r++)
            row[i][r] = p.w[r] + (uint64_t)(o0 + i) * p.row_bytes[r];
    if (pf && lane < n_units) /* the first batch's lines into L2 only (see the note in v4_rows) */
#pragma unroll
        for (int i = 0; i < OPW; i++)
#pragma unroll
            for (int r = 0; r < 2; r++)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(
                    __cvta_generic_to_global(row[i][r] + v4_pf_off<T>(p.row_bytes[r], lane, n_units))));
    mf_pdl_wait();
    mf_pdl_trigger();
    float acc[OPW][2] = {};
#pragma unroll
    for (int g0 = 0; g0 < OPW; g0 += G) /* an output's sum runs over its slices in the same order every form */
        for (int64_t base = 0; base < n_units; base += 32) { /* warp-uniform */
            const int64_t k = base + lane;
            const int64_t kk = k < n_units ? k : n_units - 1; /* read again, not added */
            raw wr[G][2];
#pragma unroll
            for (int i = 0; i < G; i++)
#pragma unroll
                for (int r = 0; r < 2; r++)
                    v4s<T>::fetch(row[g0 + i][r], kk, wr[i][r]);
#pragma unroll
            for (int i = 0; i < G; i++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const float v = v4s<T>::dot(wr[i][r], kk, xq, xd, xs);
                    acc[g0 + i][r] += k < n_units ? v : 0.0f;
                }
        }
#pragma unroll
    for (int i = 0; i < OPW; i++)
#pragma unroll
        for (int r = 0; r < 2; r++) { /* q8_reduce's butterfly: every lane ends with the same bits */
            float s = acc[i][r];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                s += __shfl_xor_sync(0xffffffffu, s, off);
            acc[i][r] = s;
        }
    float g = acc[0][0], u = acc[0][1]; /* lane i < OPW stores output o0 + i */
#pragma unroll
    for (int i = 1; i < OPW; i++)
        if (lane == i) {
            g = acc[i][0];
            u = acc[i][1];
        }
    if (lane < OPW) { /* q8_swiglu_store's expression */
        const int64_t o = o0 + lane;
        const float bg = p.bias[0] ? p.bias[0][o] : 0.0f, bu = p.bias[1] ? p.bias[1][o] : 0.0f;
        const float gt = g + bg;
        const float h = gt / (1.0f + expf(-gt)) * (u + bu);
        p.y[0][o] = h;
        hs[warp * OPW + lane] = h;
    }
    __syncthreads();
    if (warp == 0) /* q8_quant_kernel's unit blockIdx.x of h */
        q8_unit(hs[lane], lane, true, oq + (int64_t)blockIdx.x * 32, od + blockIdx.x, os + blockIdx.x);
}

template <int T, int NW, int OPW, int G, int MINB>
static __global__ void __launch_bounds__(32 * NW, MINB)
gemv_q8v4_swq8_kernel(q8_multi p, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                      const int32_t *__restrict__ xs, int64_t n_in, int pf, int8_t *__restrict__ oq,
                      float *__restrict__ od, int32_t *__restrict__ os) {
    __shared__ float hs[32];
    swq8_body<T, NW, OPW, G>(p, xq, xd, xs, n_in, pf, oq, od, os, hs);
}

#define SWQ_FOR_EACH_INST(X) \
    X(MF_TYPE_Q4_0) X(MF_TYPE_Q5_0) X(MF_TYPE_Q8_0) X(MF_TYPE_Q4_K) X(MF_TYPE_Q6_K) X(V4_Q6K_SLICE)

static int64_t v4_swq8_launches; /* mf_cu_q8v4_swq8_count */

int mf_cu_q8v4_swq8_ok(const mf_cu_gemv_tune *g, uint32_t wtype, int u, int64_t n_out, int64_t n_in) {
    if (u != 1 || n_out <= 0 || n_out % 32 != 0 || n_out / 32 > 0x7fffffff || n_in <= 0 || n_in % 32 != 0 ||
        n_in > SWQ_MAX_IN)
        return 0;
    /* the v4 SwiGLU launch's plan of these rows: one warp per output (ks 1) */
    return v4_plan_ks(g, v4_inst(g, wtype), 1, true, n_out, n_in) == 1;
}

#define SWQ_KERNEL(I) gemv_q8v4_swq8_kernel<I, SWQ_WARPS, SWQ_OPW, SWQ_G, SWQ_MINB>

cudaError_t mf_cu_q8v4_swq8_launch(const mf_cu_gemv_tune *g, const q8_multi *p, uint32_t wtype, const int8_t *xq,
                                   const float *xd, const int32_t *xs, int64_t n_in, void *q8out, cudaStream_t s) {
    const int64_t n_out = p->n_out[0], nb = n_out / 32;
    if (p->n_w != 2 || p->n_out[1] != n_out || !q8out ||
        !mf_cu_q8v4_swq8_ok(g, wtype, 1, n_out, n_in))
        return cudaErrorNotSupported;
    int8_t *oq = (int8_t *)q8out; /* mf_cu_q8_bytes(n_out, 1) layout */
    float *od = (float *)(oq + n_out);
    int32_t *os = (int32_t *)(od + nb);
    cudaError_t e = cudaErrorNotSupported;
    switch (v4_inst(g, wtype)) {
#define MF_CASE(I)                                                          \
    case I:                                                                 \
        e = mf_launch(SWQ_KERNEL(I), dim3((unsigned)nb), dim3(32 * SWQ_WARPS), 0, s, g->pdl, *p, xq, xd, xs, n_in, \
                      g->v4_pf, oq, od, os);                                \
        break;
        SWQ_FOR_EACH_INST(MF_CASE)
#undef MF_CASE
    default:
        break;
    }
    v4_swq8_launches += e == cudaSuccess;
    return e;
}

int64_t mf_cu_q8v4_swq8_count(void) {
    return v4_swq8_launches;
}
