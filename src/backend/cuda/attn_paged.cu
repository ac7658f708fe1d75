/* attn_paged.cu - ATTN_PAGED's kernels (paged.h): the scattered K/V store,
 * the tiled attention over a sequence's blocks and the split combine.
 *
 * Attention: a block of 8 warps per (work item, KV head). The item's query
 * rows (its tokens x the KV group's heads, at most 32) sit in shared memory,
 * pre-scaled by scale * log2(e); each warp owns up to 4 rows with their
 * online-softmax state (max, sum, output slice of head_dim / 32 per lane)
 * in registers. The KV range is walked in chunks of 32 positions converted
 * to f32 in shared memory (K rows padded by one float so lane j reading
 * row j is conflict-free): lane j scores position j, the warp takes max and
 * sum by shuffles, and the output accumulates p_j * V[j] with p_j broadcast
 * from lane j. f32 throughout; exp2 of log2-domain scores. */
#include <math.h>

#include "backend/cuda/kv.cuh"
#include "backend/cuda/paged.h"
#include "backend/cuda/pdl.cuh"

#define PG_WARPS 8
#define PG_RW (MF_CU_PAGED_ROWS / PG_WARPS) /* rows a warp owns */

static __device__ __forceinline__ int64_t pg_row(const int32_t *blk, int32_t bs, int32_t p) {
    return (int64_t)blk[p / bs] * bs + p % bs;
}

/* Token blockIdx.x's K (blockIdx.y 0) or V row into its slot. */
static __global__ void pg_store_kernel(mf_cu_paged_args a) {
    mf_pdl_wait();
    mf_pdl_trigger();
    const int32_t t = blockIdx.x;
    const int64_t kvd = (int64_t)a.n_head_kv * a.head_dim;
    const int32_t s = a.tok[t], p = a.tok[a.nt + t];
    const int64_t r = pg_row(a.blocks + a.seq_off[s], a.block_size, p);
    const float *src = (blockIdx.y ? a.v_new : a.k_new) + (int64_t)t * kvd;
    uint8_t *row = (uint8_t *)(blockIdx.y ? a.v : a.k) + (uint64_t)r * mf_kv_row_bytes(a.kv_type, kvd);
    if (a.kv_type == MF_TYPE_Q8_0) { /* a warp per 32-element block, warp-uniform loop */
        const int lane = threadIdx.x & 31;
        for (int64_t b = threadIdx.x >> 5; b < kvd / MF_QK8_0; b += blockDim.x >> 5)
            mf_kv_put_q8_block(row, b, lane, src[b * MF_QK8_0 + lane], true);
        return;
    }
    for (int64_t i = threadIdx.x; i < kvd; i += blockDim.x)
        mf_kv_put(a.kv_type, row, i, src[i]);
}

template <int D>
static __global__ void __launch_bounds__(PG_WARPS * 32) pg_attn_kernel(mf_cu_paged_args a) {
    mf_pdl_wait();
    mf_pdl_trigger();
    constexpr int E = D / 32, C = MF_CU_PAGED_CHUNK;
    extern __shared__ float sm[];
    float *sq = sm;                           /* [32][D] */
    float *sk = sq + MF_CU_PAGED_ROWS * D;    /* [C][D + 1] */
    float *sv = sk + C * (D + 1);             /* [C][D] */
    const int32_t *it = a.items + (int64_t)blockIdx.x * MF_CU_PAGED_ITEM;
    const int32_t t0 = it[0], ntl = it[1], kv0 = it[2], kv1 = it[3], prow = it[4];
    const int32_t kvh = blockIdx.y, gqa = a.n_head / a.n_head_kv, R = ntl * gqa;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int32_t *blk = a.blocks + a.seq_off[a.tok[t0]];
    const float qs = a.scale * 1.4426950408889634f;
    for (int i = threadIdx.x; i < R * D; i += blockDim.x) {
        const int r = i / D, d = i % D;
        const int64_t t = t0 + r / gqa, h = (int64_t)kvh * gqa + r % gqa;
        sq[i] = a.q[(t * a.n_head + h) * D + d] * qs;
    }
    float m[PG_RW], l[PG_RW], o[PG_RW][E];
    int32_t rpos[PG_RW];
#pragma unroll
    for (int rr = 0; rr < PG_RW; rr++) {
        const int row = warp + PG_WARPS * rr;
        rpos[rr] = row < R ? a.tok[a.nt + t0 + row / gqa] : -1;
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++)
            o[rr][e] = 0.0f;
    }
    const int64_t kvd = (int64_t)a.n_head_kv * D;
    const uint64_t rb = mf_kv_row_bytes(a.kv_type, kvd);
    const uint8_t *kc = (const uint8_t *)a.k, *vc = (const uint8_t *)a.v;
    for (int32_t c0 = kv0; c0 < kv1; c0 += C) {
        __syncthreads(); /* the previous chunk is consumed (and q is in place) */
        for (int i = threadIdx.x; i < C * D; i += blockDim.x) {
            const int j = i / D, d = i % D;
            const int32_t p = c0 + j;
            float kx = 0.0f, vx = 0.0f;
            if (p < kv1) {
                const uint64_t off = (uint64_t)pg_row(blk, a.block_size, p) * rb;
                kx = mf_kv_get(a.kv_type, kc + off, (int64_t)kvh * D + d);
                vx = mf_kv_get(a.kv_type, vc + off, (int64_t)kvh * D + d);
            }
            sk[j * (D + 1) + d] = kx;
            sv[j * D + d] = vx;
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < PG_RW; rr++) {
            const int row = warp + PG_WARPS * rr; /* warp-uniform */
            if (row >= R || c0 > rpos[rr])
                continue;
            const float *qr = sq + row * D, *kr = sk + lane * (D + 1);
            float s = 0.0f;
#pragma unroll 16
            for (int d = 0; d < D; d++)
                s = fmaf(qr[d], kr[d], s);
            const int32_t p = c0 + lane;
            const bool ok = p < kv1 && p <= rpos[rr];
            s = ok ? s : -INFINITY;
            float mx = s;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float mn = fmaxf(m[rr], mx); /* finite: position c0 <= rpos is valid */
            const float corr = exp2f(m[rr] - mn);
            const float pe = ok ? exp2f(s - mn) : 0.0f;
            float ps = pe;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                ps += __shfl_xor_sync(0xffffffffu, ps, off);
            l[rr] = l[rr] * corr + ps;
            m[rr] = mn;
#pragma unroll
            for (int e = 0; e < E; e++)
                o[rr][e] *= corr;
#pragma unroll 8
            for (int j = 0; j < C; j++) {
                const float pj = __shfl_sync(0xffffffffu, pe, j);
#pragma unroll
                for (int e = 0; e < E; e++)
                    o[rr][e] = fmaf(pj, sv[j * D + lane + 32 * e], o[rr][e]);
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < PG_RW; rr++) {
        const int row = warp + PG_WARPS * rr;
        if (row >= R)
            continue;
        const int64_t t = t0 + row / gqa, h = (int64_t)kvh * gqa + row % gqa;
        if (prow < 0) {
            const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
#pragma unroll
            for (int e = 0; e < E; e++)
                a.out[(t * a.n_head + h) * D + lane + 32 * e] = o[rr][e] * inv;
        } else {
            float *pp = a.part + ((int64_t)(prow + row / gqa) * a.n_head + h) * (D + 2);
#pragma unroll
            for (int e = 0; e < E; e++)
                pp[2 + lane + 32 * e] = o[rr][e];
            if (lane == 0) {
                pp[0] = m[rr];
                pp[1] = l[rr];
            }
        }
    }
}

/* A warp per (token blockIdx.x, head): the token's split partials merged
 * (tokens without partials wrote their output already). */
static __global__ void pg_combine_kernel(mf_cu_paged_args a) {
    mf_pdl_wait();
    mf_pdl_trigger();
    const int32_t t = blockIdx.x, h = blockIdx.y * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const int32_t row = a.tok[2 * a.nt + t], ns = a.tok[3 * a.nt + t], stride = a.tok[4 * a.nt + t];
    if (row < 0 || h >= a.n_head)
        return;
    const int32_t D = a.head_dim;
    const float *p0 = a.part + ((int64_t)row * a.n_head + h) * (D + 2);
    const int64_t ks = (int64_t)stride * a.n_head * (D + 2); /* floats from one split to the next */
    float M = -INFINITY;
    for (int32_t k = 0; k < ns; k++)
        M = fmaxf(M, p0[k * ks]);
    float L = 0.0f;
    for (int32_t k = 0; k < ns; k++)
        L += p0[k * ks] == -INFINITY ? 0.0f : exp2f(p0[k * ks] - M) * p0[k * ks + 1];
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int32_t d = lane; d < D; d += 32) {
        float acc = 0.0f;
        for (int32_t k = 0; k < ns; k++)
            if (p0[k * ks] != -INFINITY)
                acc = fmaf(exp2f(p0[k * ks] - M), p0[k * ks + 2 + d], acc);
        a.out[((int64_t)t * a.n_head + h) * D + d] = acc * inv;
    }
}

template <int D>
static cudaError_t pg_attn_launch(const mf_cu_paged_args *a, cudaStream_t s) {
    const size_t smem = (size_t)(MF_CU_PAGED_ROWS * D + MF_CU_PAGED_CHUNK * (2 * D + 1)) * sizeof(float);
    static bool attr = false; /* once per kernel: the dynamic shared memory above 48 KiB */
    if (!attr) {
        cudaError_t e = cudaFuncSetAttribute(pg_attn_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem);
        if (e != cudaSuccess)
            return e;
        attr = true;
    }
    return mf_launch(pg_attn_kernel<D>, dim3((unsigned)a->n_items, (unsigned)a->n_head_kv), dim3(PG_WARPS * 32),
                     smem, s, false, *a);
}

extern "C" int mf_cu_attn_paged_ok(int32_t head_dim, int32_t gqa) {
    return (head_dim == 64 || head_dim == 128 || head_dim == 256) && gqa >= 1 && gqa <= MF_CU_PAGED_ROWS;
}

extern "C" cudaError_t mf_cu_attn_paged(const mf_cu_paged_args *a, cudaStream_t s) {
    if (a->nt <= 0)
        return cudaSuccess;
    if (!mf_cu_attn_paged_ok(a->head_dim, a->n_head_kv > 0 ? a->n_head / a->n_head_kv : 0) || a->n_items <= 0)
        return cudaErrorInvalidValue;
    cudaError_t e = mf_launch(pg_store_kernel, dim3((unsigned)a->nt, 2), dim3(256), 0, s, false, *a);
    if (e != cudaSuccess)
        return e;
    e = a->head_dim == 64 ? pg_attn_launch<64>(a, s) : a->head_dim == 128 ? pg_attn_launch<128>(a, s)
                                                                           : pg_attn_launch<256>(a, s);
    if (e != cudaSuccess || !a->part)
        return e;
    return mf_launch(pg_combine_kernel, dim3((unsigned)a->nt, (unsigned)((a->n_head + 3) / 4)), dim3(128), 0, s,
                     false, *a);
}
