/* attn_prefill_mma.cu - causal GQA prefill attention on the tensor cores
 * (FlashAttention-2 style), head_dim 64 and 128, f32 / f16 / q8_0 KV cache.
 *
 * One block of 4 warps per (query head, tile of 64 queries); warp w owns the
 * tile's query rows 16 w .. 16 w + 15. The q rows are converted to f16 once
 * and kept in registers as mma A fragments. The cache rows [0, last position
 * of the tile] are walked in tiles of 64 rows; per tile each warp computes
 * S = Q K^T (mma.sync m16n8k16, f16 in, f32 accumulate, K fragments by
 * ldmatrix), scales by scale * log2(e), masks only where a row of the tile
 * can lie in a query's future (the diagonal tiles), updates the running row
 * max and sum in registers (a row's 64 scores are spread over the 4 lanes of
 * a quad: two xor shuffles), rounds P to f16 in registers and reuses it as
 * the A operand of O += P V (V fragments by ldmatrix.trans). A tile wholly in
 * the future of a warp's 16 rows is skipped by that warp; the block stops at
 * its last query's position. The normalizer sums the f16-rounded P, so O / l
 * is an exact convex combination of the rounded weights.
 *
 * K/V staging (shared memory, rows padded to hd + 8 halves so the 8 row
 * addresses of an ldmatrix hit distinct banks):
 *   f16 cache: cp.async 16-byte copies straight into two alternating tiles;
 *     tile j + 1 is in flight while tile j is computed.
 *   f32 / q8_0: cp.async of the raw row bytes (16-byte chunks for f32, 4 for
 *     the 34-byte q8_0 blocks) into one raw tile while the previous tile is
 *     computed, then a shared-to-shared conversion to f16 (q8_0: d * q in
 *     f32, rounded once, as kv.cuh's mf_kv_get then f16).
 * Rows past the last needed one are zero-filled, never read (they may lie
 * past n_ctx, and a stale V row could hold a NaN that 0 * NaN would spread).
 * q is staged through a K tile before the first barrier; each block reads
 * and writes only its own (token, head) rows, so out may equal q.
 *
 * Error: f16 operands (q, K, V, P) each carry a relative rounding of 2^-11;
 * the test bound is derived in tests/cuda/test_cuda_ops.c (family preattn).
 * Needs sm_80 (mma m16n8k16, cp.async); mf_cu_attn_mma_setup records whether
 * the device has it, and mf_cu_attn_mma_ok refuses the shape otherwise. */
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_args.h"
#include "quant/blocks.h"
#include "quant/quant.h"

#define AM_BQ 64      /* queries per block */
#define AM_BK 64      /* cache rows per tile */
#define AM_THREADS 128
#define AM_Q8_BLK 34  /* bytes of one q8_0 block: f16 d + 32 int8 */

static_assert(sizeof(mf_block_q8_0) == AM_Q8_BLK, "q8_0 block layout");

enum { AM_F32 = 0, AM_F16 = 1, AM_Q8 = 2 };

/* Bytes of one raw cache-row slice (hd elements) as staged. */
template <int HD, int KVT> struct am_cfg {
    static constexpr int LD = HD + 8;                /* halves per padded f16 row */
    static constexpr int TILE = AM_BK * LD;          /* halves per f16 tile */
    static constexpr int RAW_ROW = KVT == AM_F32 ? HD * 4 : KVT == AM_Q8 ? HD / 32 * AM_Q8_BLK : LD * 2;
    static constexpr int RAW_TILE = AM_BK * RAW_ROW; /* bytes of one raw K (or V) tile */
    /* f16: two K/V tile pairs; else one f16 pair + one raw pair */
    static constexpr size_t SMEM = KVT == AM_F16 ? (size_t)4 * TILE * 2 : (size_t)2 * TILE * 2 + 2 * (size_t)RAW_TILE;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define AM_HAVE_MMA 1
#else
#define AM_HAVE_MMA 0
#endif

static __device__ __forceinline__ uint32_t am_smem(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void am_ldsm_x4(uint32_t r[4], const void *p) {
#if AM_HAVE_MMA
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(am_smem(p))
                 : "memory");
#endif
}

static __device__ __forceinline__ void am_ldsm_x4_t(uint32_t r[4], const void *p) {
#if AM_HAVE_MMA
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(am_smem(p))
                 : "memory");
#endif
}

/* c += a b for one 16x8 f32 tile: a 16x16 f16 (row), b 16x8 f16 (col). */
static __device__ __forceinline__ void am_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if AM_HAVE_MMA
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

template <int BYTES> static __device__ __forceinline__ void am_cp_async(void *dst, const void *src) {
#if AM_HAVE_MMA
    if (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(am_smem(dst)), "l"(src) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(am_smem(dst)), "l"(src) : "memory");
#endif
}

static __device__ __forceinline__ void am_cp_commit(void) {
#if AM_HAVE_MMA
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

static __device__ __forceinline__ void am_cp_wait_all(void) {
#if AM_HAVE_MMA
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}

static __device__ __forceinline__ uint32_t am_h2u(__half2 h) {
    union {
        __half2 h;
        uint32_t u;
    } c;
    c.h = h;
    return c.u;
}

/* Issues the copies of cache rows r0 .. r0 + 63 (K and V, this head's slice)
 * into the raw tiles dk / dv; rows >= n_rows become zeros. */
template <int HD, int KVT>
static __device__ __forceinline__ void am_load_raw(const uint8_t *kb, const uint8_t *vb, uint64_t rb, int64_t e0,
                                                   int64_t r0, int64_t n_rows, uint8_t *dk, uint8_t *dv) {
    typedef am_cfg<HD, KVT> C;
    constexpr int CH = KVT == AM_Q8 ? 4 : 16;             /* bytes per copy */
    constexpr int SLICE = KVT == AM_F32 ? HD * 4 : KVT == AM_Q8 ? HD / 32 * AM_Q8_BLK : HD * 2;
    constexpr int CPR = SLICE / CH;                       /* copies per row */
    const uint64_t soff = KVT == AM_F32 ? (uint64_t)e0 * 4 : KVT == AM_Q8 ? (uint64_t)(e0 / 32) * AM_Q8_BLK
                                                                           : (uint64_t)e0 * 2;
    for (int i = threadIdx.x; i < AM_BK * CPR; i += AM_THREADS) {
        const int j = i / CPR, c = i % CPR;
        const int64_t r = r0 + j;
        const int doff = j * C::RAW_ROW + c * CH;
        if (r < n_rows) {
            const uint64_t g = (uint64_t)r * rb + soff + (uint64_t)c * CH;
            am_cp_async<CH>(dk + doff, kb + g);
            am_cp_async<CH>(dv + doff, vb + g);
        } else if (CH == 16) {
            *(uint4 *)(dk + doff) = make_uint4(0, 0, 0, 0);
            *(uint4 *)(dv + doff) = make_uint4(0, 0, 0, 0);
        } else {
            *(uint32_t *)(dk + doff) = 0;
            *(uint32_t *)(dv + doff) = 0;
        }
    }
}

/* 8 elements (row j, elements 8 c .. 8 c + 7) of a raw f32 / q8_0 tile as
 * 8 halves. */
template <int HD, int KVT> static __device__ __forceinline__ uint4 am_cvt8(const uint8_t *raw, int j, int c) {
    typedef am_cfg<HD, KVT> C;
    float f[8];
    if (KVT == AM_F32) {
        const float4 *p = (const float4 *)(raw + j * C::RAW_ROW + c * 32);
        const float4 x = p[0], y = p[1];
        f[0] = x.x, f[1] = x.y, f[2] = x.z, f[3] = x.w, f[4] = y.x, f[5] = y.y, f[6] = y.z, f[7] = y.w;
    } else {
        const uint8_t *blk = raw + j * C::RAW_ROW + (8 * c / 32) * AM_Q8_BLK;
        const float d = __half2float(__ushort_as_half(*(const unsigned short *)blk));
        const int8_t *q = (const int8_t *)(blk + 2 + (8 * c) % 32);
#pragma unroll
        for (int k = 0; k < 8; k++)
            f[k] = d * (float)q[k];
    }
    uint4 u;
    u.x = am_h2u(__floats2half2_rn(f[0], f[1]));
    u.y = am_h2u(__floats2half2_rn(f[2], f[3]));
    u.z = am_h2u(__floats2half2_rn(f[4], f[5]));
    u.w = am_h2u(__floats2half2_rn(f[6], f[7]));
    return u;
}

template <int HD, int KVT>
static __global__ void __launch_bounds__(AM_THREADS, 2) attn_mma_kernel(mf_cu_attn_args a) {
#if AM_HAVE_MMA
    typedef am_cfg<HD, KVT> C;
    constexpr int LD = C::LD, TILE = C::TILE, NKC = HD / 16, NDB = HD / 8;
    extern __shared__ __align__(16) unsigned char am_smem_raw[];
    half *const sh = (half *)am_smem_raw;
    /* f16: pair b at sh + 2 b TILE (K) and + TILE (V); q staged in pair 1's K.
     * else: the f16 pair at sh, the raw pair after it; q staged in the f16 K. */
    half *const qstage = KVT == AM_F16 ? sh + 2 * TILE : sh;
    uint8_t *const raw = (uint8_t *)(sh + 2 * TILE);

    const int h = blockIdx.y;
    const int64_t tq0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * AM_BQ; /* the longest tiles start first */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tg = lane & 3;
    const int64_t kv_dim = (int64_t)a.n_head_kv * HD;
    const int64_t e0 = (int64_t)(h / (a.n_head / a.n_head_kv)) * HD;
    const uint64_t rb = KVT == AM_F32 ? (uint64_t)kv_dim * 4
                        : KVT == AM_F16 ? (uint64_t)kv_dim * 2
                                        : (uint64_t)(kv_dim / 32) * AM_Q8_BLK;
    const int64_t n_past = a.n_past_dev ? (int64_t)*a.n_past_dev : a.n_past;
    const int nq = (int)min((int64_t)AM_BQ, a.nt - tq0);
    const int64_t n_rows = n_past + tq0 + nq; /* cache rows [0, last position of the tile] */
    const int n_tiles = (int)((n_rows + AM_BK - 1) / AM_BK);
    const uint8_t *kb = (const uint8_t *)a.k, *vb = (const uint8_t *)a.v;

    /* tile 0 in flight while q is staged */
    uint8_t *const d0 = KVT == AM_F16 ? (uint8_t *)sh : raw;
    am_load_raw<HD, KVT>(kb, vb, rb, e0, 0, n_rows, d0, d0 + (KVT == AM_F16 ? TILE * 2 : C::RAW_TILE));
    am_cp_commit();
    for (int i = threadIdx.x; i < AM_BQ * HD / 4; i += AM_THREADS) {
        const int qi = i / (HD / 4), c = i % (HD / 4);
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (qi < nq)
            v = *(const float4 *)(a.q + ((tq0 + qi) * a.n_head + h) * (int64_t)HD + 4 * c);
        uint2 u;
        u.x = am_h2u(__floats2half2_rn(v.x, v.y));
        u.y = am_h2u(__floats2half2_rn(v.z, v.w));
        *(uint2 *)(qstage + qi * LD + 4 * c) = u;
    }
    __syncthreads();
    uint32_t qf[NKC][4];
#pragma unroll
    for (int kc = 0; kc < NKC; kc++)
        am_ldsm_x4(qf[kc], qstage + (16 * warp + (lane & 15)) * LD + 16 * kc + 8 * (lane >> 4));

    float o[NDB][4];
#pragma unroll
    for (int d = 0; d < NDB; d++)
        o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const float sl2 = a.scale * 1.4426950408889634f; /* exp(x) = exp2(x log2 e) */
    const bool warp_live = 16 * warp < nq;
    const int64_t pos0 = n_past + tq0 + 16 * warp + g; /* position of row g; row g + 8 is pos0 + 8 */

    for (int jt = 0; jt < n_tiles; jt++) {
        const int64_t r0 = (int64_t)jt * AM_BK;
        am_cp_wait_all();
        __syncthreads(); /* tile jt landed for every thread; tile jt - 1's readers are done */
        const half *ks, *vs;
        if (KVT == AM_F16) {
            ks = sh + 2 * (jt & 1) * TILE;
            vs = ks + TILE;
        } else {
            for (int i = threadIdx.x; i < AM_BK * HD / 8; i += AM_THREADS) {
                const int j = i / (HD / 8), c = i % (HD / 8);
                *(uint4 *)(sh + j * LD + 8 * c) = am_cvt8<HD, KVT>(raw, j, c);
                *(uint4 *)(sh + TILE + j * LD + 8 * c) = am_cvt8<HD, KVT>(raw + C::RAW_TILE, j, c);
            }
            __syncthreads(); /* the f16 tile is ready and the raw tile free */
            ks = sh;
            vs = sh + TILE;
        }
        if (jt + 1 < n_tiles) {
            uint8_t *dk = KVT == AM_F16 ? (uint8_t *)(sh + 2 * ((jt + 1) & 1) * TILE) : raw;
            am_load_raw<HD, KVT>(kb, vb, rb, e0, r0 + AM_BK, n_rows, dk,
                                 dk + (KVT == AM_F16 ? TILE * 2 : C::RAW_TILE));
            am_cp_commit();
        }
        /* warp-uniform: a warp with no live rows, or a tile wholly in the
         * future of its 16 rows, computes nothing (it still reaches every
         * barrier) */
        if (!warp_live || r0 > pos0 + 15 - g)
            continue;

        float s[8][4];
#pragma unroll
        for (int i = 0; i < 8; i++)
            s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < NKC; kc++) {
#pragma unroll
            for (int nb = 0; nb < 4; nb++) {
                uint32_t b[4];
                am_ldsm_x4(b, ks + (16 * nb + (lane & 7) + 8 * (lane >> 4)) * LD + 16 * kc + 8 * ((lane >> 3) & 1));
                am_mma(s[2 * nb], qf[kc], b[0], b[1]);
                am_mma(s[2 * nb + 1], qf[kc], b[2], b[3]);
            }
        }
        /* scale, and mask where a column can be in a row's future: column
         * r0 + 8 i + 2 tg + (c & 1) against row position pos0 (+ 8) */
        const bool diag = r0 + AM_BK - 1 > pos0 - g;
        const int lim0 = (int)max((int64_t)-1, min((int64_t)AM_BK, pos0 - r0));
        const int lim1 = (int)max((int64_t)-1, min((int64_t)AM_BK, pos0 + 8 - r0));
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int i = 0; i < 8; i++) {
#pragma unroll
            for (int c = 0; c < 4; c++) {
                float v = s[i][c] * sl2;
                if (diag && 8 * i + 2 * tg + (c & 1) > (c < 2 ? lim0 : lim1))
                    v = -INFINITY;
                s[i][c] = v;
            }
            mx0 = fmaxf(mx0, fmaxf(s[i][0], s[i][1]));
            mx1 = fmaxf(mx1, fmaxf(s[i][2], s[i][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        /* finite: tile 0 comes first and row 0 is in every query's past */
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        const float c0 = exp2f(m0 - mn0), c1 = exp2f(m1 - mn1); /* 0 on the first tile */
        m0 = mn0;
        m1 = mn1;
        l0 *= c0;
        l1 *= c1;
#pragma unroll
        for (int d = 0; d < NDB; d++) {
            o[d][0] *= c0;
            o[d][1] *= c0;
            o[d][2] *= c1;
            o[d][3] *= c1;
        }
        /* P in f16 as the A fragments of P V: k chunk kk covers score
         * n-blocks 2 kk (a0 row g, a1 row g + 8) and 2 kk + 1 (a2, a3) */
        uint32_t pa[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const float *sv = s[2 * kk + hf];
                const __half2 p0 = __floats2half2_rn(exp2f(sv[0] - mn0), exp2f(sv[1] - mn0));
                const __half2 p1 = __floats2half2_rn(exp2f(sv[2] - mn1), exp2f(sv[3] - mn1));
                const float2 f0 = __half22float2(p0), f1 = __half22float2(p1);
                l0 += f0.x + f0.y;
                l1 += f1.x + f1.y;
                pa[kk][2 * hf] = am_h2u(p0);
                pa[kk][2 * hf + 1] = am_h2u(p1);
            }
        }
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
#pragma unroll
            for (int db = 0; db < HD / 16; db++) {
                uint32_t b[4];
                am_ldsm_x4_t(b, vs + (16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 16 * db + 8 * (lane >> 4));
                am_mma(o[2 * db], pa[kk], b[0], b[1]);
                am_mma(o[2 * db + 1], pa[kk], b[2], b[3]);
            }
        }
    }

    if (warp_live) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        const float i0 = 1.0f / l0, i1 = 1.0f / l1;
        const int row0 = 16 * warp + g, row1 = row0 + 8;
        if (row0 < nq) {
            float *op = a.out + ((tq0 + row0) * a.n_head + h) * (int64_t)HD + 2 * tg;
#pragma unroll
            for (int d = 0; d < NDB; d++)
                *(float2 *)(op + 8 * d) = make_float2(o[d][0] * i0, o[d][1] * i0);
        }
        if (row1 < nq) {
            float *op = a.out + ((tq0 + row1) * a.n_head + h) * (int64_t)HD + 2 * tg;
#pragma unroll
            for (int d = 0; d < NDB; d++)
                *(float2 *)(op + 8 * d) = make_float2(o[d][2] * i1, o[d][3] * i1);
        }
    }
#else
    (void)a;
    __trap(); /* never launched: mf_cu_attn_mma_ok needs cc >= 8.0 */
#endif
}

/* ---- host ---------------------------------------------------------------------------------- */

typedef void (*am_kernel_fn)(mf_cu_attn_args);
static const am_kernel_fn am_kernels[2][3] = {
    {attn_mma_kernel<64, AM_F32>, attn_mma_kernel<64, AM_F16>, attn_mma_kernel<64, AM_Q8>},
    {attn_mma_kernel<128, AM_F32>, attn_mma_kernel<128, AM_F16>, attn_mma_kernel<128, AM_Q8>},
};
static const size_t am_smem_bytes[2][3] = {
    {am_cfg<64, AM_F32>::SMEM, am_cfg<64, AM_F16>::SMEM, am_cfg<64, AM_Q8>::SMEM},
    {am_cfg<128, AM_F32>::SMEM, am_cfg<128, AM_F16>::SMEM, am_cfg<128, AM_Q8>::SMEM},
};
static const char *const am_names[2][3] = {
    {"attn_mma_kernel<64,f32>", "attn_mma_kernel<64,f16>", "attn_mma_kernel<64,q8_0>"},
    {"attn_mma_kernel<128,f32>", "attn_mma_kernel<128,f16>", "attn_mma_kernel<128,q8_0>"},
};

static int am_usable; /* set by mf_cu_attn_mma_setup: cc >= 8.0 and every kernel configured */

static int am_kvt(uint32_t kv_type) {
    return kv_type == MF_TYPE_F32 ? AM_F32 : kv_type == MF_TYPE_F16 ? AM_F16 : kv_type == MF_TYPE_Q8_0 ? AM_Q8 : -1;
}

extern "C" cudaError_t mf_cu_attn_mma_setup(const char **bad) {
    am_usable = 0;
    int dev = 0, major = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e != cudaSuccess || major < 8)
        return e; /* before sm_80: the SIMT kernels serve every shape */
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 3; k++) {
            e = cudaFuncSetAttribute((const void *)am_kernels[i][k], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)am_smem_bytes[i][k]);
            if (e != cudaSuccess) {
                *bad = am_names[i][k];
                return e;
            }
        }
    am_usable = 1;
    return cudaSuccess;
}

extern "C" int mf_cu_attn_mma_ok(const mf_cu_attn_args *a) {
    const uintptr_t align = (uintptr_t)a->q | (uintptr_t)a->out | (uintptr_t)a->k | (uintptr_t)a->v;
    return am_usable && a->nt > 8 && (a->head_dim == 64 || a->head_dim == 128) && am_kvt(a->kv_type) >= 0 &&
           a->n_head_kv > 0 && a->n_head % a->n_head_kv == 0 && (align & 15) == 0;
}

extern "C" cudaError_t mf_cu_attn_mma(const mf_cu_attn_args *a, cudaStream_t s) {
    if (!mf_cu_attn_mma_ok(a))
        return cudaErrorInvalidValue;
    const int i = a->head_dim == 128, k = am_kvt(a->kv_type);
    const dim3 grid((unsigned)((a->nt + AM_BQ - 1) / AM_BQ), (unsigned)a->n_head);
    am_kernels[i][k]<<<grid, AM_THREADS, am_smem_bytes[i][k], s>>>(*a);
    return cudaGetLastError();
}
