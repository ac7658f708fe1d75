/* gemv_wide.cu - the long-row int8 decode GEMV (n_in >= 2048: the 4B/7B
 * shapes) for Q4_0, Q8_0, Q4_K and Q6_K weights, taken by gemv_q8.cu's
 * launchers (under the auto rule for launches of >= 16 M weights only, see
 * mf_cu_gemv_wide_wanted) when MINFER_CUDA_GEMV_WIDE=1. Opt-in: on the H200
 * it streamed at 1.0-1.7 TB/s where v1/v3 reach 2.0-2.3 (docs/PERF.md entry
 * 12: the per-warp shared-memory ring costs more than the coalescing buys).
 *
 * Why another kernel. v1/v3 decode a unit per lane straight from global
 * memory: a warp's load instruction touches 32 units ~18-34 bytes apart
 * (2-byte aligned for Q4_0/Q8_0/Q6_K, so 4-byte loads plus funnel shifts),
 * and the bytes in flight are bounded by the registers that receive them.
 * Measured on the H200 they stream 1.5-1.9 TB/s on the 7B layer shapes
 * while the same v1 kernel reaches 3-3.9 TB/s when the grid is huge.
 *
 * Here the weights go global -> shared memory with cp.async (16-byte,
 * L2-only, evict-first), so the loads are fully coalesced 16-byte chunks of
 * the contiguous block stream and the bytes in flight cost no registers:
 * every warp owns a ring of S slots, one slot = one 32-unit group of its
 * row (R = 2 rows for SwiGLU: gate and up), copied as the 16-byte-aligned
 * span that covers it, so the slot keeps the global address modulo 16 and
 * the format's own alignment. A warp issues group k + S - 1 before it
 * computes group k (S = 6: five groups in flight, 2.9 KB per warp for Q4_K,
 * 5.4 KB for Q8_0; SwiGLU S = 4: three pairs, 3.5-6.5 KB; ~90-170 KB per
 * SM), and its stream runs across row boundaries without a bubble.
 * Warp w of a grid of W warps takes rows w, w + W, ...; the grid is one wave
 * of resident blocks sized so that every warp gets the same row count.
 * With PDL the first S - 1 groups are requested before mf_pdl_wait()
 * (weights are never written by a kernel). The activations (the q8 scratch
 * of gemv_q8.cu: nt rows of int8, then the unit scales, then the half sums)
 * are copied whole into shared memory once per block when they fit.
 *
 * Arithmetic: lane l decodes unit l of the group from shared memory with the
 * same per-unit integer decode as gemv_q8.cu's q8w<T> and the same float
 * expression (d_h * dp4a + m_h * sum per half, one fma per unit and token),
 * then the warp's xor-shuffle sum: lane l accumulates units l, l + 32, ...
 * in order, as v1 does with one warp per row, so only the f32 summation
 * order across warps (v1 ks > 1, v3) can differ. */
#include <string.h>

#include "backend/cuda/cuda_args.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/q8w.cuh"

#define GW_WARPS 8
/* ring slots per warp: 6 for one row (5 groups in flight), 4 for SwiGLU's
 * two (3 x 2) */
#define GW_S(R) ((R) == 1 ? 6 : 4)
#define GW_SMEM_MAX (100 * 1024) /* two blocks per SM at least */

static int gw_on = 0;      /* mf_cu_set_gemv_wide (backend creation) */
static int gw_no_stage = 0; /* its bit 2 (bench only): activations read from global, never staged */
static int gw_sms = 132;
static int gw_ready = 0;
static int gw_smem_max = 0; /* dynamic shared memory the kernels may take (0: not usable) */
static long long gw_count = 0;

/* Per type: block bytes and units per block; a 32-unit group is whole
 * blocks (G bytes) and its slot holds the 16-byte-aligned span around it. */
template <int T> struct gw_fmt;
template <> struct gw_fmt<MF_TYPE_Q4_0> { static constexpr int bb = 18, upb = 1; };
template <> struct gw_fmt<MF_TYPE_Q8_0> { static constexpr int bb = 34, upb = 1; };
template <> struct gw_fmt<MF_TYPE_Q4_K> { static constexpr int bb = 144, upb = 8; };
template <> struct gw_fmt<MF_TYPE_Q6_K> { static constexpr int bb = 210, upb = 8; };
template <int T> struct gw_geo {
    static constexpr int G = 32 / gw_fmt<T>::upb * gw_fmt<T>::bb;
    static constexpr int SLOT = (G + 15 + 15) / 16 * 16;
};

/* The unit decoders are q8w.cuh's q8w<T>, reading a group's slot in shared
 * memory (every format's 2-byte-aligned reads stay inside the slot's
 * 16-byte-aligned span). */

/* ---- the kernel ------------------------------------------------------------------------- */

/* Up to 3 weights of one type as one row space (start[i]: first row of
 * weight i), or SWIGLU: weights 0 (gate) and 1 (up) of n_out[0] rows. */
typedef struct gw_multi {
    const uint8_t *w[3];
    uint64_t row_bytes[3];
    const float *bias[3];
    const float *res[3];
    float *y[3];
    int64_t n_out[3];
    int64_t start[4];
    int32_t n_w;
} gw_multi;

/* Row rr of the row space, part r (SWIGLU: 0 gate, 1 up): its weight in *wi
 * and the row within that weight. rr < rows. */
template <bool SWIGLU>
static __device__ __forceinline__ int64_t gw_row(const gw_multi &p, int64_t rr, int r, int *wi) {
    if (SWIGLU) {
        *wi = r;
        return rr;
    }
    int k = 0;
    while (k + 1 < p.n_w && rr >= p.start[k + 1])
        k++;
    *wi = k;
    return rr - p.start[k];
}

/* 16 bytes global -> shared, L2 only, with the evict-first policy pol
 * (sm_80+: cp.async; before that a plain copy, and commit / wait are no-ops) */
static __device__ __forceinline__ void gw_cp16(uint8_t *dst, const uint8_t *src, uint64_t pol) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(__cvta_generic_to_global(src)), "l"(pol)
                 : "memory");
#else
    (void)pol;
    *(int4 *)dst = *(const int4 *)src;
#endif
}
static __device__ __forceinline__ uint64_t gw_policy() {
    uint64_t pol = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
    return pol;
}
static __device__ __forceinline__ void gw_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N> static __device__ __forceinline__ void gw_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

/* NT: 1, or 8 with nt 2..8 predicated (one token group: nt <= 8).
 * Dynamic shared memory: GW_WARPS rings of S x R slots, then, when
 * stage_x, the q8 activations of all nt rows (xbytes, the scratch layout). */
template <int T, int NT, bool SWIGLU>
static __global__ void __launch_bounds__(32 * GW_WARPS, NT == 1 ? 4 : 2)
gemv_wide_kernel(gw_multi p, const int8_t *__restrict__ xq, int64_t n_in, int64_t nt, int stage_x,
                 int64_t xbytes) {
    constexpr int R = SWIGLU ? 2 : 1;
    constexpr int G = gw_geo<T>::G, SLOT = gw_geo<T>::SLOT;
    constexpr int BB = gw_fmt<T>::bb, UPB = gw_fmt<T>::upb;
    extern __shared__ __align__(16) uint8_t gw_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int S = GW_S(R);
    uint8_t *ring = gw_smem + warp * (S * R * SLOT);
    const int n_units = (int)(n_in / 32), n_grp = (n_units + 31) / 32;
    const int64_t row_len = (int64_t)(n_units / UPB) * BB; /* quant bytes of a row */
    const int64_t rows = SWIGLU ? p.n_out[0] : p.start[p.n_w];
    const int64_t W = (int64_t)gridDim.x * GW_WARPS, wg = (int64_t)blockIdx.x * GW_WARPS + warp;
    const int n_items = (int)(wg < rows ? (rows - wg + W - 1) / W : 0) * n_grp; /* a few rows per warp */
    const int ntok = (int)min((int64_t)NT, nt);
    const uint64_t pol = gw_policy();

    /* item k = (row wg + (k / n_grp) W, group k % n_grp) into slot k % S;
     * always one commit group per call, empty past the end */
    auto issue = [&](int k) {
        if (k < n_items) {
            const int64_t rr = wg + (int64_t)(k / n_grp) * W;
            const int g = k % n_grp;
#pragma unroll
            for (int r = 0; r < R; r++) {
                int wi;
                const int64_t o = gw_row<SWIGLU>(p, rr, r, &wi);
                const uint8_t *row = p.w[wi] + (uint64_t)o * p.row_bytes[wi];
                const int64_t off = (int64_t)g * G;
                const uint8_t *src = row + off;
                const int len = (int)min((int64_t)G, row_len - off);
                const uint8_t *a = (const uint8_t *)((uintptr_t)src & ~(uintptr_t)15);
                const int n16 = (int)(((uintptr_t)src + len + 15 - (uintptr_t)a) >> 4);
                uint8_t *dst = ring + ((k % S) * R + r) * SLOT;
                for (int c = lane; c < n16; c += 32)
                    gw_cp16(dst + 16 * c, a + 16 * c, pol);
            }
        }
        gw_commit();
    };
    for (int k = 0; k < S - 1; k++) /* weights only: allowed before the wait */
        issue(k);
    mf_pdl_wait();
    mf_pdl_trigger();

    const int8_t *sq = xq;
    if (stage_x) { /* block-uniform; the whole scratch (+ its slack) as 16-byte words */
        uint8_t *xs_s = gw_smem + GW_WARPS * S * R * SLOT;
        const int64_t n16 = (xbytes + 15) / 16;
        for (int64_t i = threadIdx.x; i < n16; i += blockDim.x)
            ((int4 *)xs_s)[i] = ((const int4 *)xq)[i];
        __syncthreads();
        sq = (const int8_t *)xs_s;
    }
    const float *sd = (const float *)(sq + nt * n_in);
    const int32_t *ss = (const int32_t *)(sd + nt * n_units);

    float acc[R * NT];
#pragma unroll
    for (int i = 0; i < R * NT; i++)
        acc[i] = 0.0f;
    for (int k = 0; k < n_items; k++) {
        issue(k + S - 1);
        gw_wait<S - 1>(); /* this lane's copies of item k have landed */
        __syncwarp();        /* ... and every other lane's */
        const int64_t rr = wg + (int64_t)(k / n_grp) * W;
        const int g = k % n_grp;
        const int u = g * 32 + lane;
        if (u < n_units) {
            uint32_t q[R][8];
            float2 dm[R][2];
#pragma unroll
            for (int r = 0; r < R; r++) {
                int wi;
                const int64_t o = gw_row<SWIGLU>(p, rr, r, &wi);
                const uintptr_t src = (uintptr_t)(p.w[wi] + (uint64_t)o * p.row_bytes[wi] + (int64_t)g * G);
                const uint8_t *grp = ring + ((k % S) * R + r) * SLOT + (src & 15);
                q8w<T>::unit(grp, lane, q[r], dm[r]);
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < ntok) {
                    const int64_t xu = (int64_t)t * n_units + u;
                    const int4 *xp = (const int4 *)(sq + xu * 32);
                    const int4 a = xp[0], c = xp[1];
                    const int32_t hs = ss[xu];
                    const float dx = sd[xu];
                    const float sx0 = (float)(int16_t)(hs & 0xffff), sx1 = (float)(int16_t)(hs >> 16);
#pragma unroll
                    for (int r = 0; r < R; r++)
                        acc[r * NT + t] += dx * q8_unit_dot(q[r], a, c, dm[r], sx0, sx1);
                }
            }
        }
        __syncwarp(); /* the slot is refilled by the next iteration's issue */
        if (g != n_grp - 1)
            continue;
        /* the row is done: warp sum (v1's shuffle order), lane 0 stores */
#pragma unroll
        for (int i = 0; i < R * NT; i++) {
            float s = acc[i];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                s += __shfl_xor_sync(0xffffffffu, s, off);
            acc[i] = s;
        }
        if (lane == 0) {
            int wi;
            const int64_t o = gw_row<SWIGLU>(p, rr, 0, &wi);
            if constexpr (SWIGLU) {
                const float bg = p.bias[0] ? p.bias[0][o] : 0.0f, bu = p.bias[1] ? p.bias[1][o] : 0.0f;
#pragma unroll
                for (int t = 0; t < NT; t++)
                    if (t < ntok) {
                        const float gt = acc[t] + bg;
                        p.y[0][t * p.n_out[0] + o] = gt / (1.0f + expf(-gt)) * (acc[NT + t] + bu);
                    }
            } else {
                const float b = p.bias[wi] ? p.bias[wi][o] : 0.0f;
                const float *res = p.res[wi];
#pragma unroll
                for (int t = 0; t < NT; t++)
                    if (t < ntok) {
                        const int64_t i = t * p.n_out[wi] + o;
                        p.y[wi][i] = res ? res[i] + (acc[t] + b) : acc[t] + b; /* x + Wa, as v1 */
                    }
            }
        }
#pragma unroll
        for (int i = 0; i < R * NT; i++)
            acc[i] = 0.0f;
    }
}

/* ---- launch ----------------------------------------------------------------------------- */

#define GW_FOR_EACH_TYPE(X) X(MF_TYPE_Q4_0) X(MF_TYPE_Q8_0) X(MF_TYPE_Q4_K) X(MF_TYPE_Q6_K)

/* Lets every instantiation take GW_SMEM_MAX of dynamic shared memory and
 * records the SM count. Once; not a stream operation. */
static void gw_setup(void) {
    if (gw_ready)
        return;
    gw_ready = 1;
#define GW_ATTR(T)                                                                                          \
    cudaFuncSetAttribute(gemv_wide_kernel<T, 1, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, GW_SMEM_MAX); \
    cudaFuncSetAttribute(gemv_wide_kernel<T, 8, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, GW_SMEM_MAX); \
    cudaFuncSetAttribute(gemv_wide_kernel<T, 1, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, GW_SMEM_MAX);  \
    cudaFuncSetAttribute(gemv_wide_kernel<T, 8, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, GW_SMEM_MAX);
    GW_FOR_EACH_TYPE(GW_ATTR)
#undef GW_ATTR
    int dev = 0, sms = 0, optin = 0;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && sms > 0)
        gw_sms = sms;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        optin = 0;
    /* every ring must fit (Q8_0 SwiGLU: 70.6 KB), else the kernels stay unused */
    const cudaError_t e = cudaGetLastError(); /* a refused attribute (or query) is not left pending */
    gw_smem_max = optin >= GW_SMEM_MAX && e == cudaSuccess ? GW_SMEM_MAX : 0;
}

/* Grid: one wave of resident blocks, shrunk so that every warp gets the
 * same number of rows (k = rows per warp, blocks = rows / (8 k)). */
template <int T, int NT, bool SWIGLU>
static cudaError_t gw_launch(const gw_multi *p, const int8_t *xq, int64_t n_in, int64_t nt, cudaStream_t s) {
    const int R = SWIGLU ? 2 : 1;
    const int64_t rows = SWIGLU ? p->n_out[0] : p->start[p->n_w];
    const size_t ring = (size_t)GW_WARPS * GW_S(R) * R * gw_geo<T>::SLOT;
    const int64_t xbytes = nt * n_in + nt * (n_in / 32) * 8;
    const size_t xpad = (size_t)(xbytes + 15) / 16 * 16;
    const bool stage = !gw_no_stage && ring + xpad <= (size_t)gw_smem_max;
    const size_t smem = ring + (stage ? xpad : 0);
    /* blocks per SM, cached per instantiation for its last 4 shared-memory
     * sizes (a model alternates a few row lengths) */
    static size_t c_smem[4];
    static int c_bps[4], c_next;
    int bps = 0;
    for (int i = 0; i < 4 && !bps; i++)
        if (c_smem[i] == smem)
            bps = c_bps[i];
    if (!bps) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, gemv_wide_kernel<T, NT, SWIGLU>, 32 * GW_WARPS,
                                                          smem) != cudaSuccess)
            cudaGetLastError();
        bps = bps < 1 ? 1 : bps;
        c_smem[c_next] = smem;
        c_bps[c_next] = bps;
        c_next = (c_next + 1) % 4;
    }
    const int64_t per = (int64_t)GW_WARPS * gw_sms * bps; /* warps of one wave */
    const int64_t k = (rows + per - 1) / per;
    const int64_t blocks = (rows + GW_WARPS * k - 1) / (GW_WARPS * k);
    gw_count++;
    return mf_launch(gemv_wide_kernel<T, NT, SWIGLU>, dim3((unsigned)blocks), dim3(32 * GW_WARPS), smem, s, *p, xq,
                     n_in, nt, stage ? 1 : 0, xbytes);
}

extern "C" void mf_cu_set_gemv_wide(int on) {
    gw_on = (on & 1) != 0;
    gw_no_stage = (on & 2) != 0;
    if (gw_on)
        gw_setup();
}

extern "C" long long mf_cu_gemv_wide_count(void) {
    return gw_count;
}

/* The selection rule: rows of >= 2048 inputs of the four types, nt <= 8;
 * under the auto rule only launches of >= GW_AUTO_MIN weights (7B: gate/up,
 * down, lm_head, FUSED_QKV's 4608 rows; qwen3-4B gate/up and down), where
 * the weight stream dominates. The smaller ones (7B Wo 3584 x 3584, k/v,
 * 0.5B down 4864 -> 896) are latency-bound and keep v3, which can take
 * gemv_q8.cu's quantizing prologue (one launch less) that this kernel
 * lacks; not measured yet: the bench prints every shape. */
#define GW_AUTO_MIN (16 * 1000 * 1000)
extern "C" int mf_cu_gemv_wide_wanted(uint32_t wtype, int64_t n_in, int64_t nt, int64_t rows, int auto_rule) {
    if (!gw_on || !gw_smem_max || n_in < 2048 || nt < 1 || nt > 8 || (auto_rule && rows * n_in < GW_AUTO_MIN))
        return 0;
    switch (wtype) {
    case MF_TYPE_Q4_0:
    case MF_TYPE_Q8_0:
        return n_in % 32 == 0;
    case MF_TYPE_Q4_K:
    case MF_TYPE_Q6_K:
        return n_in % 256 == 0;
    default:
        return 0;
    }
}

extern "C" cudaError_t mf_cu_gemv_wide(const mf_cu_q8_multi_args *a, int first, int n, cudaStream_t s) {
    if (!a->q8 || first < 0 || n < 1 || first + n > a->n_w || n > 3 || a->nt < 1 || a->nt > 8 ||
        (a->swiglu && (first != 0 || n != 2)))
        return cudaErrorInvalidValue;
    const uint32_t t = a->wtype[first];
    for (int i = first; i < first + n; i++)
        if (a->wtype[i] != t || !mf_cu_gemv_wide_wanted(t, a->n_in, a->nt, a->n_out[i], 0) || a->n_out[i] <= 0 ||
            a->row_bytes[i] != a->row_bytes[first])
            return cudaErrorInvalidValue;
    gw_setup();
    gw_multi p;
    memset(&p, 0, sizeof p);
    p.n_w = n;
    for (int k = 0; k < n; k++) {
        p.w[k] = (const uint8_t *)a->w[first + k];
        p.row_bytes[k] = a->row_bytes[first + k];
        p.bias[k] = a->bias[first + k];
        p.res[k] = a->res[first + k];
        p.y[k] = a->y[first + k];
        p.n_out[k] = a->n_out[first + k];
        p.start[k + 1] = p.start[k] + p.n_out[k];
    }
    const int8_t *xq = (const int8_t *)a->q8;
    const bool one = a->nt == 1, sw = a->swiglu != 0;
    switch (t) {
#define GW_CASE(T)                                                                   \
    case T:                                                                          \
        if (sw)                                                                      \
            return one ? gw_launch<T, 1, true>(&p, xq, a->n_in, a->nt, s)            \
                       : gw_launch<T, 8, true>(&p, xq, a->n_in, a->nt, s);           \
        return one ? gw_launch<T, 1, false>(&p, xq, a->n_in, a->nt, s)               \
                   : gw_launch<T, 8, false>(&p, xq, a->n_in, a->nt, s);
        GW_FOR_EACH_TYPE(GW_CASE)
#undef GW_CASE
    default:
        return cudaErrorInvalidValue;
    }
}
