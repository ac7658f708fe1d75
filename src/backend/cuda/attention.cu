/* attention.cu - causal GQA attention over the KV cache, online softmax.
 *
 * One block of MF_ATTN_WARPS warps per (token, query head). Warp w walks the
 * cache rows r = w, w + W, ... of [0, n_past + t]: the lanes split the head
 * dims (lane, lane + 32, ...), the score is a shuffle reduction, and each
 * warp keeps its own running max m, normalizer l and output accumulator
 * (rescaled when m grows). The warps' partial states are merged through
 * shared memory at the end. q is staged in shared memory before any write,
 * so out may equal q. Every thread reaches the one barrier. */
#include <math.h>

#include "backend/cuda/cuda_args.h"
#include "backend/cuda/kv.cuh"

#define MF_ATTN_WARPS 4
#define MF_ATTN_PER_LANE (MF_CU_ATTN_MAX_HEAD_DIM / 32)

static __global__ void __launch_bounds__(32 * MF_ATTN_WARPS) attn_kernel(mf_cu_attn_args a) {
    __shared__ float qs[MF_CU_ATTN_MAX_HEAD_DIM];
    __shared__ float sacc[MF_ATTN_WARPS][MF_CU_ATTN_MAX_HEAD_DIM];
    __shared__ float sm[MF_ATTN_WARPS], sl[MF_ATTN_WARPS];

    const int64_t t = blockIdx.x / a.n_head;
    const int h = (int)(blockIdx.x % a.n_head);
    const int hd = a.head_dim;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t kv_dim = (int64_t)a.n_head_kv * hd;
    const int64_t e0 = (int64_t)(h / (a.n_head / a.n_head_kv)) * hd;
    const uint64_t rb = mf_kv_row_bytes(a.kv_type, kv_dim);
    const int64_t n_kv = (a.n_past_dev ? (int64_t)*a.n_past_dev : a.n_past) + t + 1;

    const float *q = a.q + (t * a.n_head + h) * (int64_t)hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x)
        qs[d] = q[d];
    __syncthreads();

    float qv[MF_ATTN_PER_LANE], acc[MF_ATTN_PER_LANE];
#pragma unroll
    for (int i = 0; i < MF_ATTN_PER_LANE; i++) {
        const int d = lane + 32 * i;
        qv[i] = d < hd ? qs[d] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const uint8_t *kb = (const uint8_t *)a.k, *vb = (const uint8_t *)a.v;
    for (int64_t r = warp; r < n_kv; r += MF_ATTN_WARPS) {
        const uint8_t *krow = kb + (uint64_t)r * rb;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < MF_ATTN_PER_LANE; i++) {
            const int d = lane + 32 * i;
            if (d < hd)
                s += qv[i] * mf_kv_get(a.kv_type, krow, e0 + d);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, off);
        s *= a.scale;
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn); /* 0 on the first row (m = -inf) */
        const float p = expf(s - mn);
        l = l * corr + p;
        const uint8_t *vrow = vb + (uint64_t)r * rb;
#pragma unroll
        for (int i = 0; i < MF_ATTN_PER_LANE; i++) {
            const int d = lane + 32 * i;
            const float v = d < hd ? mf_kv_get(a.kv_type, vrow, e0 + d) : 0.0f;
            acc[i] = acc[i] * corr + p * v;
        }
        m = mn;
    }
#pragma unroll
    for (int i = 0; i < MF_ATTN_PER_LANE; i++) {
        const int d = lane + 32 * i;
        if (d < hd)
            sacc[warp][d] = acc[i];
    }
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < MF_ATTN_WARPS; w++)
        M = fmaxf(M, sm[w]);
    float L = 0.0f, f[MF_ATTN_WARPS];
#pragma unroll
    for (int w = 0; w < MF_ATTN_WARPS; w++) {
        f[w] = sl[w] > 0.0f ? expf(sm[w] - M) : 0.0f; /* a warp with no rows adds nothing */
        L += sl[w] * f[w];
    }
    const float inv = 1.0f / L;
    float *o = a.out + (t * a.n_head + h) * (int64_t)hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < MF_ATTN_WARPS; w++)
            s += f[w] > 0.0f ? sacc[w][d] * f[w] : 0.0f;
        o[d] = s * inv;
    }
}

/* ---- flash prefill (tune attn_prefill) ------------------------------------------ */

/* One block of FA_WARPS warps per (query head, tile of FA_BQ tokens): the
 * tile's q rows are staged in shared memory, then the cache rows
 * [0, last position of the tile] are walked in tiles of FA_BK rows, each
 * K/V tile decoded once into shared memory (rows padded to hd + 1 floats:
 * lane j reads row j's elements without bank conflicts) and used by all the
 * tile's queries, instead of every query rescanning its causal prefix.
 * Warp w owns queries w, w + FA_WARPS, ...; per query and K tile, lane j
 * scores row j (a full dot over hd from shared memory), the warp takes the
 * tile max and the online-softmax rescale, and the accumulator (lane owns
 * dims lane + 32 i) adds p_j V_j with p_j broadcast by shuffle. Rows past a
 * query's position score -inf; a tile with none left for a query is
 * skipped for it. head_dim <= FA_MAX_HD. out may equal q (q is staged
 * before any write and each block writes only the rows it read). */
#define FA_WARPS 4
#define FA_BQ 16
#define FA_BK 32
#define FA_MAX_HD 128
#define FA_PER_LANE (FA_MAX_HD / 32)
static_assert(FA_BK == 32, "lane j scores K row j of the tile");
static_assert(FA_BQ % FA_WARPS == 0, "whole queries per warp");

static __global__ void __launch_bounds__(32 * FA_WARPS) attn_flash_kernel(mf_cu_attn_args a) {
    extern __shared__ float fsm[];
    const int hd = a.head_dim, ld = hd + 1;
    float *qs = fsm;                 /* FA_BQ x ld */
    float *ks = qs + FA_BQ * ld;     /* FA_BK x ld */
    float *vs = ks + FA_BK * ld;     /* FA_BK x ld */
    const int h = blockIdx.x;
    const int64_t tq0 = (int64_t)blockIdx.y * FA_BQ;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t kv_dim = (int64_t)a.n_head_kv * hd;
    const int64_t e0 = (int64_t)(h / (a.n_head / a.n_head_kv)) * hd;
    const uint64_t rb = mf_kv_row_bytes(a.kv_type, kv_dim);
    const int64_t n_past = a.n_past_dev ? (int64_t)*a.n_past_dev : a.n_past;
    const int nq = (int)min((int64_t)FA_BQ, a.nt - tq0);
    const int64_t n_rows = n_past + tq0 + nq; /* rows [0, last position of the tile] */

    for (int i = threadIdx.x; i < FA_BQ * hd; i += blockDim.x) {
        const int qi = i / hd, d = i % hd;
        qs[qi * ld + d] = qi < nq ? a.q[((tq0 + qi) * a.n_head + h) * (int64_t)hd + d] : 0.0f;
    }
    float acc[FA_BQ / FA_WARPS][FA_PER_LANE], m[FA_BQ / FA_WARPS], l[FA_BQ / FA_WARPS];
#pragma unroll
    for (int k = 0; k < FA_BQ / FA_WARPS; k++) {
        m[k] = -INFINITY;
        l[k] = 0.0f;
#pragma unroll
        for (int i = 0; i < FA_PER_LANE; i++)
            acc[k][i] = 0.0f;
    }
    const uint8_t *kb = (const uint8_t *)a.k, *vb = (const uint8_t *)a.v;
    for (int64_t r0 = 0; r0 < n_rows; r0 += FA_BK) {
        __syncthreads(); /* the previous tile's readers are done (and q is staged) */
        for (int i = threadIdx.x; i < FA_BK * hd; i += blockDim.x) {
            const int j = i / hd, d = i % hd;
            const int64_t r = r0 + j;
            float kv = 0.0f, vv = 0.0f;
            if (r < n_rows) {
                kv = mf_kv_get(a.kv_type, kb + (uint64_t)r * rb, e0 + d);
                vv = mf_kv_get(a.kv_type, vb + (uint64_t)r * rb, e0 + d);
            }
            ks[j * ld + d] = kv;
            vs[j * ld + d] = vv;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < FA_BQ / FA_WARPS; k++) {
            const int qi = warp + FA_WARPS * k;
            if (qi >= nq)
                continue;
            const int64_t pos = n_past + tq0 + qi;
            if (r0 > pos)
                continue; /* every row of this tile is in the query's future */
            const float *qr = qs + qi * ld, *kr = ks + lane * ld;
            float s = 0.0f;
            for (int d = 0; d < hd; d++)
                s += qr[d] * kr[d];
            s = r0 + lane <= pos ? s * a.scale : -INFINITY;
            float mt = s;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
            const float mn = fmaxf(m[k], mt); /* finite: row r0 <= pos is in the tile */
            const float corr = expf(m[k] - mn);
            const float p = expf(s - mn);
            float ps = p;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                ps += __shfl_xor_sync(0xffffffffu, ps, off);
            l[k] = l[k] * corr + ps;
#pragma unroll
            for (int i = 0; i < FA_PER_LANE; i++)
                acc[k][i] *= corr;
            for (int j = 0; j < FA_BK; j++) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
                for (int i = 0; i < FA_PER_LANE; i++) {
                    const int d = lane + 32 * i;
                    if (d < hd)
                        acc[k][i] += pj * vs[j * ld + d];
                }
            }
            m[k] = mn;
        }
    }
#pragma unroll
    for (int k = 0; k < FA_BQ / FA_WARPS; k++) {
        const int qi = warp + FA_WARPS * k;
        if (qi >= nq)
            continue;
        const float inv = 1.0f / l[k];
        float *o = a.out + ((tq0 + qi) * a.n_head + h) * (int64_t)hd;
#pragma unroll
        for (int i = 0; i < FA_PER_LANE; i++) {
            const int d = lane + 32 * i;
            if (d < hd)
                o[d] = acc[k][i] * inv;
        }
    }
}

static size_t flash_smem(int hd) {
    return (size_t)(FA_BQ + 2 * FA_BK) * (size_t)(hd + 1) * sizeof(float);
}

extern "C" int mf_cu_attn_flash_ok(int32_t head_dim, int64_t nt) {
    return head_dim > 0 && head_dim <= FA_MAX_HD && nt > 8;
}

extern "C" cudaError_t mf_cu_attn(const mf_cu_attn_args *a, cudaStream_t s) {
    const int64_t blocks = a->nt * a->n_head;
    if (blocks <= 0)
        return cudaSuccess;
    if (a->tc && mf_cu_attn_mma_ok(a)) /* tensor-core flash prefill (attn_prefill_mma.cu) */
        return mf_cu_attn_mma(a, s);
    if (a->flash) {
        if (!mf_cu_attn_flash_ok(a->head_dim, a->nt))
            return cudaErrorInvalidValue;
        const dim3 grid((unsigned)a->n_head, (unsigned)((a->nt + FA_BQ - 1) / FA_BQ));
        attn_flash_kernel<<<grid, 32 * FA_WARPS, flash_smem(a->head_dim), s>>>(*a);
        return cudaGetLastError();
    }
    if (a->part && mf_cu_attn_decode_bytes(a)) /* split-KV flash decode (attn_decode.cu) */
        return mf_cu_attn_decode(a, s);
    attn_kernel<<<(unsigned)blocks, 32 * MF_ATTN_WARPS, 0, s>>>(*a);
    return cudaGetLastError();
}

#include "backend/cuda/probe.cuh"

extern "C" cudaError_t mf_cu_probe_attn(size_t smem_limit, const char **bad) {
    MF_PROBE(attn_kernel, 32 * MF_ATTN_WARPS);
    MF_PROBE(attn_flash_kernel, 32 * FA_WARPS);
    if (flash_smem(FA_MAX_HD) > smem_limit) { /* dynamic: not in the probe's static count */
        *bad = "attn_flash_kernel (dynamic shared memory)";
        return cudaErrorInvalidConfiguration;
    }
    return mf_cu_attn_mma_setup(bad); /* opts its kernels into > 48 KiB of shared memory */
}
