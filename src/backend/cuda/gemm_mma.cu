/* gemm_mma.cu - the prefill GEMM tier at tensor-core speed (sm_80+).
 *
 * y[t][o] = sum_k x[t][k] W[o][k] (+ bias[o]) in three steps, for nt >= the
 * tier's threshold (tune mma_min_nt, default 64) or force_gemm 3:
 *   1. dequant_f16_kernel<T>: W rows [r0, r0 + rows) dequantized with
 *      mf_deq<T>::unit into an f16 row-major scratch [rows][n_in]. One
 *      thread per 32-element unit; when n_in % 32 == 0 the block's 256
 *      units are one contiguous 16 KiB span of the scratch, staged in
 *      shared memory and stored as consecutive 16-byte words. F16 weights
 *      (16-byte aligned) are read in place, no copy. Memory-bound: reads
 *      the quant bytes (0.56 B/element for Q4_K), writes 2 B/element.
 *   2. x_f16_kernel: x (nt x n_in f32) to f16 once per call (or once per
 *      fused QKV / FFN group: x_ready).
 *   3. mma_gemm_kernel<BM, BN, WM, WN, EPI>: both operands K-major ("TN"); tiles
 *      of BM outputs x BN tokens x 32 k, cp.async (16-byte, .cg, zero-fill
 *      past the edges) into a 4-stage ring of shared-memory tiles whose rows
 *      are padded to 40 halves (80 bytes: the 8 rows an ldmatrix phase reads
 *      land in 8 distinct 16-byte bank groups, and so do the cp.async
 *      stores), ldmatrix.x4 fragments, mma.sync m16n8k16 f16 x f16 -> f32.
 *      The epilogue adds the bias and stores straight from the accumulator
 *      fragments: one warp store covers 8 consecutive outputs x 4 tokens,
 *      i.e. four full 32-byte sectors. Two configs: 128x128 with 8 warps
 *      (warp tile 64x32) when it gives at least 3/4 of a wave of blocks,
 *      else 64x64 with 4 warps (warp tile 32x32), so the 0.5B shapes
 *      (n_out 128 .. 4864 at nt 512) still spread over the SMs. blockIdx.x
 *      walks the token tiles, so the blocks that share a weight tile (the
 *      big operand) are scheduled together.
 *      The big tile is mma_gemm64_kernel where the device gives it its
 *      shared memory (108 KiB; else the 128x128 tile above): warp tile
 *      64x64 (8 ldmatrix per 32 mma instead of 6 per 16), copy roles and
 *      their bounds fixed before the k loop (the 64x32 kernel spends ~500
 *      instructions of 64-bit address math per 32 mma), fragments
 *      double-buffered in registers, 128x128 / 4 warps / BK 64 / 3 stages.
 *      Same epilogues. (The other tile configs measured slower, docs/PERF.md
 *      "MMA tile configs".)
 *      Split-K (EPI_PLAIN, i.e. single matmuls): when the chosen config's
 *      grid fills at most half a wave, blockIdx.z takes a k range and the
 *      f32 partials (in the weight scratch, after the f16 chunk) are summed
 *      in a fixed order by splitk_reduce_kernel, which adds the bias: the
 *      result does not depend on scheduling (tune mma_split=0=1 off).
 * The weight is processed in chunks of whole rows of at most wchunk_bytes of
 * f16 (default 320 MiB: the 7B lm_head would be 1.09 GB; every other 7B
 * weight, and gate+up fused, fits one chunk: a chunked GEMM pays one more
 * partial wave per chunk), one dequant + GEMM per chunk.
 * Fused forms (mf_cu_gemm_mma_multi, tune mma_fuse=0=1 off):
 * FUSED_QKV dequantizes q, k, v (each its own type) into consecutive rows of
 * one scratch and runs ONE GEMM whose epilogue (EPI_ROUTE) sends each row to
 * its output with its bias; FUSED_FFN dequantizes gate and up with their
 * rows interleaved in 8-row groups (dq_row), so each thread's m16n8
 * accumulator holds gate (c0 c1) and up (c2 c3) of the same output and
 * tokens, and the epilogue (EPI_SWIGLU) writes silu(gate) * up straight to
 * the node's output: no gate/up buffers, no SWIGLU launch.
 * Requires n_in % 8 == 0 (16-byte rows) and a device of cc >= 8.0 with the
 * opt-in shared memory for the big config (checked by mf_cu_probe_mma);
 * otherwise launch_matmul keeps the wmma tier. Accuracy: both operands
 * rounded to f16 (as the wmma tier), f32 accumulation. */
#include "backend/cuda/cuda_args.h"
#include "backend/cuda/dequant.cuh"

#define MMA_BK 32                 /* k per pipeline stage */
#define MMA_LDS (MMA_BK + 8)      /* halves per shared row: 80 bytes */
#define MMA_STAGES 4
#define MMA_DQ_THREADS 256
#define MMA_X_THREADS 256
#define MMA_DEFAULT_MIN_NT 64
#define MMA_DEFAULT_CHUNK ((uint64_t)320 << 20) /* 7B: every weight, and gate+up fused, one chunk (not lm_head) */
#define MMA_SPLIT_MIN_K 1024
#define MMA_MAX_SPLIT 4
#define MMA_MAX_CHUNK_ROWS ((int64_t)1 << 21) /* keeps gridDim.y <= 32768 */

static int g_mma_ok = -1; /* set by mf_cu_probe_mma: 1 usable, 0 not (cc < 8.0, smem) */
static int g_c2_ok;        /* set by mf_cu_probe_mma: the 64x64-warp big tile's shared memory fits */

template <int BM, int BN, int WM = 0, int WN = 0> static constexpr size_t mma_smem_bytes() {
    return (size_t)MMA_STAGES * (BM + BN) * MMA_LDS * sizeof(half);
}

/* ---- step 1: dequantize W rows to f16 ---------------------------------------------------- */

/* Scratch row of source row j: j + off, or with il (the fused gate/up
 * GEMM) row j of the pair's gate (off 0) or up (off 8) weight in the
 * interleave of 8-row groups: 16 (j / 8) + off + j % 8. */
static __device__ __forceinline__ int64_t dq_row(int64_t j, int64_t off, int il) {
    return il ? 2 * j - (j & 7) + off : j + off;
}

/* Contract: rows j in [0, rows) of the chunk starting at w (rows of
 * row_bytes) into f16 scratch row dq_row(j, dst_off, il) of dst (rows of
 * n_in). n_units = ceil(n_in / 32); thread g of the grid takes unit
 * g % n_units of row g / n_units. staged (n_in % 32 == 0): the
 * block's output is contiguous, so it goes through shared memory and out as
 * coalesced 16-byte words; else (float types with n_in % 32 != 0) each
 * thread stores its unit's in-row 8-element groups directly. */
template <int T>
static __global__ void __launch_bounds__(MMA_DQ_THREADS)
dequant_f16_kernel(const uint8_t *__restrict__ w, uint64_t row_bytes, half *__restrict__ dst,
                   int64_t n_in, int64_t rows, int staged, int64_t dst_off, int il) {
    __shared__ __align__(16) half sh[MMA_DQ_THREADS * MMA_LDS];
    const int64_t n_units = (n_in + 31) / 32;
    const int64_t total = rows * n_units;
    const int64_t g0 = (int64_t)blockIdx.x * MMA_DQ_THREADS;
    const int64_t g = g0 + threadIdx.x;
    /* 32-bit division where the unit count fits (every real shape): the 64-bit
     * one is a long instruction sequence, paid per thread and per store */
    const bool d32 = total <= (int64_t)0xffffffff;
    const int64_t row = d32 ? (int64_t)((uint32_t)g / (uint32_t)n_units) : g / n_units;
    const int64_t u = g - row * n_units;
    uint4 pk[4] = {};
    if (g < total) {
        float f[32];
        mf_deq<T>::unit(w + (uint64_t)row * row_bytes, u, n_in, f);
#pragma unroll
        for (int q = 0; q < 4; q++)
            pk[q] = mf_f16x8(f + 8 * q);
    }
    if (!staged) {
        if (g < total) {
            half *d = dst + (uint64_t)dq_row(row, dst_off, il) * (uint64_t)n_in + 32 * u;
#pragma unroll
            for (int q = 0; q < 4; q++)
                if (32 * u + 8 * q < n_in)
                    ((uint4 *)d)[q] = pk[q];
        }
        return;
    }
    uint4 *s = (uint4 *)(sh + threadIdx.x * MMA_LDS);
#pragma unroll
    for (int q = 0; q < 4; q++)
        s[q] = pk[q];
    __syncthreads();
    const int64_t n_here = min((int64_t)MMA_DQ_THREADS, total - g0);
    /* unit gg of row j = gg / n_units lands at dq_row(j) * n_in + 32 (gg % n_units)
     * = 32 gg + (dq_row(j) - j) n_in: contiguous unless interleaved */
    if (!il) {
        uint4 *d = (uint4 *)(dst + (uint64_t)dst_off * (uint64_t)n_in + (uint64_t)g0 * 32);
        for (int c = threadIdx.x; c < 4 * n_here; c += MMA_DQ_THREADS)
            d[c] = *(const uint4 *)(sh + (c >> 2) * MMA_LDS + 8 * (c & 3));
    } else {
        for (int c = threadIdx.x; c < 4 * n_here; c += MMA_DQ_THREADS) {
            const int64_t gg = g0 + (c >> 2);
            const int64_t j = d32 ? (int64_t)((uint32_t)gg / (uint32_t)n_units) : gg / n_units;
            uint4 *d = (uint4 *)(dst + (uint64_t)(dq_row(j, dst_off, il) - j) * (uint64_t)n_in +
                                 (uint64_t)gg * 32 + 8 * (c & 3));
            *d = *(const uint4 *)(sh + (c >> 2) * MMA_LDS + 8 * (c & 3));
        }
    }
}

/* ---- step 2: activations to f16 ------------------------------------------------------------- */

/* n8 groups of 8 floats of x to 8 halves of xh; vec: x is 16-byte aligned. */
static __global__ void __launch_bounds__(MMA_X_THREADS)
x_f16_kernel(const float *__restrict__ x, half *__restrict__ xh, int64_t n8, int vec) {
    for (int64_t i = (int64_t)blockIdx.x * MMA_X_THREADS + threadIdx.x; i < n8;
         i += (int64_t)gridDim.x * MMA_X_THREADS) {
        float v[8];
        if (vec) {
            const float4 a = ((const float4 *)x)[2 * i], b = ((const float4 *)x)[2 * i + 1];
            v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
            v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++)
                v[j] = x[8 * i + j];
        }
        union { uint4 u; half2 h[4]; } c;
#pragma unroll
        for (int j = 0; j < 4; j++)
            c.h[j] = __floats2half2_rn(v[2 * j], v[2 * j + 1]);
        ((uint4 *)xh)[i] = c.u;
    }
}

/* ---- step 3: the GEMM ------------------------------------------------------------------------ */

static __device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, zero-filled when !valid (src-size 0: nothing is
 * read, src only has to be a valid address). */
static __device__ __forceinline__ void cp16(uint32_t dst, const void *src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0));
#endif
}

static __device__ __forceinline__ void cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N> static __device__ __forceinline__ void cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

static __device__ __forceinline__ void ldm_x4(uint32_t addr, uint32_t r[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}

static __device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

/* Where the GEMM's rows go. EPI_PLAIN: row o to y[0][t ld[0] + o] (+ bias[0][o]);
 * blockIdx.z (split-K) adds z zstride to y[0] (bias then NULL: the reduce adds
 * it). EPI_ROUTE (fused QKV): rows [0, end[0]) to y[0], [end[0], end[1]) to
 * y[1], the rest to y[2], each relative to its segment start, with its own
 * bias and ld. EPI_SWIGLU (fused gate/up): rows interleaved in 8-row groups
 * (dq_row il): y[0][t ld[0] + f] = silu(gate_f + bias[0][f]) (up_f + bias[1][f]). */
enum { EPI_PLAIN, EPI_ROUTE, EPI_SWIGLU };
struct mma_epi {
    float *y[3];
    const float *bias[3];
    int64_t ld[3];
    int64_t end[2];
    int64_t zstride;
};

/* Stores a warp's (16 MI) x (8 NI) accumulator tile, rows from ob0 (a
 * multiple of 16), tokens from tb0, through epilogue EPI (mma_epi above);
 * rows >= n_out and tokens >= nt are skipped. Shared by every GEMM config:
 * only the m16n8 fragment layout matters (c0 c1: row g, c2 c3: row g + 8),
 * which is what EPI_SWIGLU's 8-row gate/up interleave relies on. */
template <int EPI, int MI, int NI>
static __device__ __forceinline__ void mma_epilogue(const float (&acc)[MI][NI][4], int64_t ob0, int64_t tb0,
                                                    int64_t n_out, int64_t nt, const mma_epi &ep, int lane) {
    /* c0 c1: output row g, tokens 2q, 2q + 1; c2 c3: output row g + 8 */
    const int g = lane >> 2, q = lane & 3;
    if constexpr (EPI == EPI_SWIGLU) {
        /* rows ob .. ob + 15 (ob % 16 == 0): gate then up of outputs ob / 2 + [0, 8) */
        float *y = ep.y[0];
        const int64_t ld = ep.ld[0];
#pragma unroll
        for (int i = 0; i < MI; i++) {
            const int64_t ob = ob0 + 16 * i;
            if (ob >= n_out)
                continue;
            const int64_t f = ob / 2 + g;
            const float bg = ep.bias[0] ? ep.bias[0][f] : 0.0f, bu = ep.bias[1] ? ep.bias[1][f] : 0.0f;
#pragma unroll
            for (int j = 0; j < NI; j++) {
                const int64_t t = tb0 + 8 * j + 2 * q;
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    if (t + e < nt) {
                        const float gv = acc[i][j][e] + bg;
                        y[(t + e) * ld + f] = gv / (1.0f + expf(-gv)) * (acc[i][j][2 + e] + bu);
                    }
                }
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < MI; i++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t o = ob0 + 16 * i + g + 8 * h;
                if (o >= n_out)
                    continue;
                /* selects, not a dynamic index: the parameter struct stays out of local memory */
                float *y = ep.y[0] + (int64_t)blockIdx.z * ep.zstride;
                const float *bp = ep.bias[0];
                int64_t ld = ep.ld[0], oo = o;
                if (EPI == EPI_ROUTE && o >= ep.end[0]) {
                    const bool v = o >= ep.end[1];
                    y = v ? ep.y[2] : ep.y[1];
                    bp = v ? ep.bias[2] : ep.bias[1];
                    ld = v ? ep.ld[2] : ep.ld[1];
                    oo = o - (v ? ep.end[1] : ep.end[0]);
                }
                const float b = bp ? bp[oo] : 0.0f;
#pragma unroll
                for (int j = 0; j < NI; j++) {
                    const int64_t t = tb0 + 8 * j + 2 * q;
                    if (t < nt)
                        y[t * ld + oo] = acc[i][j][2 * h] + b;
                    if (t + 1 < nt)
                        y[(t + 1) * ld + oo] = acc[i][j][2 * h + 1] + b;
                }
            }
        }
    }
}

/* Contract: for o < n_out, t < nt: acc(o, t) = sum_k x[t][k] w[o][k] over the
 * k range [z k_len, min(n_in, (z + 1) k_len)) of split z = blockIdx.z, stored
 * through the epilogue EPI (above). w (n_out rows) and x (nt rows) f16
 * row-major with row stride n_in, n_in % 8 == 0, k_len % 32 == 0, both
 * 16-byte aligned. Block (bx, by) computes tokens [BN bx, +BN) x outputs
 * [BM by, +BM); warp (wm, wn) of the (BM/WM) x (BN/WN) grid a WM x WN sub-tile
 * as (WM/16) x (WN/8) m16n8 accumulators. Rows past the edges load as zeros
 * and are not stored; every thread reaches every barrier. */
template <int BM, int BN, int WM, int WN, int EPI>
static __global__ void __launch_bounds__(32 * (BM / WM) * (BN / WN))
mma_gemm_kernel(const half *__restrict__ w, const half *__restrict__ x, int64_t n_in, int64_t k_len,
                int64_t n_out, int64_t nt, mma_epi ep) {
    constexpr int NTH = 32 * (BM / WM) * (BN / WN);
    constexpr int MI = WM / 16, NI = WN / 8;
    static_assert(NI % 2 == 0, "B fragments load two n8 tiles per ldmatrix.x4");
    extern __shared__ __align__(16) unsigned char mma_smem[];
    half *sa = (half *)mma_smem;                         /* [STAGES][BM][LDS] */
    half *sb = sa + (size_t)MMA_STAGES * BM * MMA_LDS;   /* [STAGES][BN][LDS] */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm0 = (warp / (BN / WN)) * WM, wn0 = (warp % (BN / WN)) * WN;
    const int64_t t0 = (int64_t)blockIdx.x * BN, o0 = (int64_t)blockIdx.y * BM;
    const int64_t kz = (int64_t)blockIdx.z * k_len;
    const int64_t kend = n_in - kz < k_len ? n_in - kz : k_len; /* k extent of this split */
    const uint64_t ldk = (uint64_t)n_in;
    w += kz;
    x += kz;
    const int64_t ktiles = (kend + MMA_BK - 1) / MMA_BK;

    /* one stage: BM + BN rows of 4 16-byte chunks */
    auto load = [&](int stage, int64_t kt) {
        const int64_t k0 = kt * MMA_BK;
#pragma unroll
        for (int i = tid; i < BM * 4; i += NTH) {
            const int r = i >> 2, c = i & 3;
            const int64_t o = o0 + r, k = k0 + 8 * c;
            const bool ok = o < n_out && k < kend;
            const half *src = ok ? w + (uint64_t)o * ldk + k : w;
            cp16(smem_u32(sa + ((size_t)stage * BM + r) * MMA_LDS + 8 * c), src, ok);
        }
#pragma unroll
        for (int i = tid; i < BN * 4; i += NTH) {
            const int r = i >> 2, c = i & 3;
            const int64_t t = t0 + r, k = k0 + 8 * c;
            const bool ok = t < nt && k < kend;
            const half *src = ok ? x + (uint64_t)t * ldk + k : x;
            cp16(smem_u32(sb + ((size_t)stage * BN + r) * MMA_LDS + 8 * c), src, ok);
        }
    };

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                acc[i][j][q] = 0.0f;

#pragma unroll
    for (int s = 0; s < MMA_STAGES - 1; s++) {
        if (s < ktiles)
            load(s, s);
        cp_commit(); /* empty groups keep the wait count uniform */
    }
    /* ldmatrix lane roles: matrix lane >> 3, row lane & 7 of it */
    const int lm = lane >> 3, lr = lane & 7;
    const int a_row = (lm & 1) * 8 + lr, a_col = (lm >> 1) * 8; /* a0..a3: (r, k) (r+8, k) (r, k+8) (r+8, k+8) */
    const int b_row = (lm >> 1) * 8 + lr, b_col = (lm & 1) * 8; /* b0 b1 of n-tile j, then of j + 1 */

    for (int64_t kt = 0; kt < ktiles; kt++) {
        cp_wait<MMA_STAGES - 2>();
        __syncthreads(); /* tile kt landed for all; stage (kt - 1) % STAGES is free */
        const int64_t kn = kt + MMA_STAGES - 1;
        if (kn < ktiles)
            load((int)(kn % MMA_STAGES), kn);
        cp_commit();
        const int st = (int)(kt % MMA_STAGES);
        const half *as = sa + (size_t)st * BM * MMA_LDS;
        const half *bs = sb + (size_t)st * BN * MMA_LDS;
#pragma unroll
        for (int kk = 0; kk < MMA_BK; kk += 16) {
            uint32_t af[MI][4], bf[NI][2];
#pragma unroll
            for (int i = 0; i < MI; i++)
                ldm_x4(smem_u32(as + (wm0 + 16 * i + a_row) * MMA_LDS + kk + a_col), af[i]);
#pragma unroll
            for (int j = 0; j < NI; j += 2) {
                uint32_t r[4];
                ldm_x4(smem_u32(bs + (wn0 + 8 * j + b_row) * MMA_LDS + kk + b_col), r);
                bf[j][0] = r[0];
                bf[j][1] = r[1];
                bf[j + 1][0] = r[2];
                bf[j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < NI; j++)
                    mma16816(acc[i][j], af[i], bf[j][0], bf[j][1]);
        }
    }
    cp_wait<0>(); /* nothing useful is in flight, but leave no copy behind */
    mma_epilogue<EPI, MI, NI>(acc, o0 + wm0, t0 + wn0, n_out, nt, ep, lane);
}

/* Contract as mma_gemm_kernel (k_len % BK == 0), the big tile: every warp owns a 64x64 sub-tile (4 x 8
 * m16n8 accumulators: 8 ldmatrix.x4 feed 32 mma per k16 step, against 6 for
 * 16 in the 64x32 warp tile, so the shared-memory traffic per mma drops by a
 * third), the (BM / 64) x (BN / 64) warps of a block cover BM outputs x BN
 * tokens, k advances BK per stage of a STAGES-deep cp.async ring (rows padded
 * to BK + 8 halves: an 8-row ldmatrix phase and a row's cp.async stores fall
 * in distinct 16-byte bank groups for BK 32 and 64 alike), MINB blocks per
 * SM. Each thread's copy roles (one 16-byte column, rows every RPI) and
 * their row bounds are fixed before the k loop; the k16 fragments are
 * double-buffered in registers so ldmatrix of step s + 1 overlaps the mma
 * of step s. */
template <int BM, int BN, int BK, int STAGES, int MINB, int EPI>
static __global__ void __launch_bounds__(32 * (BM / 64) * (BN / 64), MINB)
mma_gemm64_kernel(const half *__restrict__ w, const half *__restrict__ x, int64_t n_in, int64_t k_len,
                  int64_t n_out, int64_t nt, mma_epi ep) {
    constexpr int WGN = BN / 64, NTH = 32 * (BM / 64) * WGN;
    constexpr int MI = 4, NI = 8, KS = BK / 16;
    constexpr int LDS = BK + 8;    /* halves per shared row */
    constexpr int CPR = BK / 8;    /* 16-byte chunks per row */
    constexpr int RPI = NTH / CPR; /* rows one copy pass covers */
    constexpr uint32_t ROWB = LDS * 2, A_ST = BM * ROWB, B_ST = BN * ROWB;
    static_assert(BM % RPI == 0 && BN % RPI == 0 && BM / RPI <= 32 && BN / RPI <= 32, "copy roles");
    static_assert((BK == 32 || BK == 64) && STAGES >= 2, "k tile");
    extern __shared__ __align__(16) unsigned char mma_smem[];
    const uint32_t sa = smem_u32(mma_smem), sb = sa + STAGES * A_ST;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm0 = (warp / WGN) * 64, wn0 = (warp % WGN) * 64;
    const int64_t t0 = (int64_t)blockIdx.x * BN, o0 = (int64_t)blockIdx.y * BM;
    const int64_t kz = (int64_t)blockIdx.z * k_len;
    const int64_t kend = n_in - kz < k_len ? n_in - kz : k_len;
    const uint64_t ldk = (uint64_t)n_in;
    w += kz;
    x += kz;
    const int ktiles = (int)((kend + BK - 1) / BK);

    /* copy roles: column lc of rows lr0 + RPI it; rows past n_out / nt are
     * zero-filled from a valid dummy address. BK 64: an 8-lane phase stores
     * one row's 128 contiguous bytes; BK 32 (80-byte rows): one column of 8
     * rows (16-byte groups 5 r + c mod 8, all distinct), which row-major
     * roles would not give (rows r, r + 1 of a phase collide) */
    const int lc = CPR == 4 ? (tid >> 3) & 3 : tid % CPR;
    const int lr0 = CPR == 4 ? (tid >> 5) * 8 + (tid & 7) : tid / CPR;
    uint32_t amask = 0, bmask = 0;
#pragma unroll
    for (int it = 0; it < BM / RPI; it++)
        amask |= (uint32_t)(o0 + lr0 + RPI * it < n_out) << it;
#pragma unroll
    for (int it = 0; it < BN / RPI; it++)
        bmask |= (uint32_t)(t0 + lr0 + RPI * it < nt) << it;
    const half *wsrc = w + (uint64_t)(o0 + lr0) * ldk + 8 * lc;
    const half *xsrc = x + (uint64_t)(t0 + lr0) * ldk + 8 * lc;
    const uint64_t rstep = (uint64_t)RPI * ldk;
    const uint32_t sdst = (uint32_t)lr0 * ROWB + 16 * lc;
    auto load = [&](int stage, int kt) {
        const int64_t k0 = (int64_t)kt * BK;
        const bool kok = k0 + 8 * lc < kend;
        const uint32_t da = sa + stage * A_ST + sdst, db = sb + stage * B_ST + sdst;
#pragma unroll
        for (int it = 0; it < BM / RPI; it++) {
            const bool ok = kok && ((amask >> it) & 1);
            cp16(da + it * RPI * ROWB, ok ? wsrc + it * rstep + k0 : w, ok);
        }
#pragma unroll
        for (int it = 0; it < BN / RPI; it++) {
            const bool ok = kok && ((bmask >> it) & 1);
            cp16(db + it * RPI * ROWB, ok ? xsrc + it * rstep + k0 : x, ok);
        }
    };

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                acc[i][j][q] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < ktiles)
            load(s, s);
        cp_commit(); /* empty groups keep the wait count uniform */
    }
    /* ldmatrix lane roles as in mma_gemm_kernel, folded into byte offsets */
    const int lm = lane >> 3, lr = lane & 7;
    const uint32_t a_off = (uint32_t)(wm0 + (lm & 1) * 8 + lr) * ROWB + (lm >> 1) * 16;
    const uint32_t b_off = (uint32_t)(wn0 + (lm >> 1) * 8 + lr) * ROWB + (lm & 1) * 16;
    uint32_t af[2][MI][4], bf[2][NI][2];
    auto frags = [&](int buf, uint32_t as, uint32_t bs, int ks) {
#pragma unroll
        for (int i = 0; i < MI; i++)
            ldm_x4(as + 16 * i * ROWB + 32 * ks, af[buf][i]);
#pragma unroll
        for (int j = 0; j < NI; j += 2) {
            uint32_t r[4];
            ldm_x4(bs + 8 * j * ROWB + 32 * ks, r);
            bf[buf][j][0] = r[0];
            bf[buf][j][1] = r[1];
            bf[buf][j + 1][0] = r[2];
            bf[buf][j + 1][1] = r[3];
        }
    };

    int st = 0, ld_st = STAGES - 1;
    for (int kt = 0; kt < ktiles; kt++) {
        cp_wait<STAGES - 2>();
        __syncthreads(); /* tile kt landed for all; stage ld_st (read at kt - 1) is free */
        if (kt + STAGES - 1 < ktiles)
            load(ld_st, kt + STAGES - 1);
        cp_commit();
        ld_st = ld_st + 1 == STAGES ? 0 : ld_st + 1;
        const uint32_t as = sa + st * A_ST + a_off, bs = sb + st * B_ST + b_off;
        frags(0, as, bs, 0);
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            if (ks + 1 < KS)
                frags((ks + 1) & 1, as, bs, ks + 1);
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < NI; j++)
                    mma16816(acc[i][j], af[ks & 1][i], bf[ks & 1][j][0], bf[ks & 1][j][1]);
        }
        st = st + 1 == STAGES ? 0 : st + 1;
    }
    cp_wait<0>();
    mma_epilogue<EPI, MI, NI>(acc, o0 + wm0, t0 + wn0, n_out, nt, ep, lane);
}

/* Split-K: y[t ldy + o] = sum_{z < split} part[z][t][o] (in order: the
 * result does not depend on scheduling) + bias[o], o < rows, t < nt. */
static __global__ void __launch_bounds__(MMA_X_THREADS)
splitk_reduce_kernel(const float *__restrict__ part, int split, const float *__restrict__ bias,
                     float *__restrict__ y, int64_t rows, int64_t nt, int64_t ldy) {
    const int64_t n = rows * nt;
    for (int64_t i = (int64_t)blockIdx.x * MMA_X_THREADS + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * MMA_X_THREADS) {
        const int64_t t = i / rows, o = i - t * rows;
        float v = bias ? bias[o] : 0.0f;
        for (int z = 0; z < split; z++)
            v += part[(int64_t)z * n + i];
        y[t * ldy + o] = v;
    }
}

#define MMA_BIG 128, 128, 64, 32
#define MMA_SMALL 64, 64, 32, 32
/* The big tile on mma_gemm64_kernel (BM, BN, BK, STAGES, MINB): 128x128, 4
 * warps of 64x64, BK 64, 3 stages, 108 KiB, 2 blocks/SM. */
#define MMA_C2 128, 128, 64, 3, 2

template <int BM, int BN, int BK, int STAGES, int MINB> static constexpr size_t mma64_smem() {
    return (size_t)STAGES * (BM + BN) * (BK + 8) * sizeof(half);
}
template <int BM, int BN, int BK, int STAGES, int MINB> static constexpr int mma64_threads() {
    return 32 * (BM / 64) * (BN / 64);
}

/* ---- host side ------------------------------------------------------------------------------ */

static bool w_in_place(const mf_cu_matmul_args *a) {
    return a->wtype == MF_TYPE_F16 && (((uintptr_t)a->w) & 15) == 0;
}

static uint64_t chunk_limit(uint64_t wchunk_bytes) {
    return wchunk_bytes ? wchunk_bytes : MMA_DEFAULT_CHUNK;
}

/* Rows per dequant + GEMM chunk: at most wchunk_bytes of f16 (at least one
 * 128-row tile), the chunks balanced and rounded up to 128 rows. */
static int64_t chunk_rows(const mf_cu_matmul_args *a) {
    if (w_in_place(a))
        return a->n_out;
    const uint64_t limit = chunk_limit(a->wchunk_bytes);
    int64_t max_rows = (int64_t)(limit / ((uint64_t)a->n_in * 2)) / 128 * 128;
    max_rows = max_rows < 128 ? 128 : max_rows > MMA_MAX_CHUNK_ROWS ? MMA_MAX_CHUNK_ROWS : max_rows;
    const int64_t n_chunks = (a->n_out + max_rows - 1) / max_rows;
    const int64_t rows = ((a->n_out + n_chunks - 1) / n_chunks + 127) / 128 * 128;
    return rows < a->n_out ? rows : a->n_out;
}

/* The GEMM tile of a (rows x nt x n_in) product on sms SMs: 128x128
 * (MMA_C2, or MMA_BIG where the device cannot run it) when it gives at
 * least 3/4 of a wave of blocks, else 64x64. Split-K (may_split) when the
 * grid fills at most half a wave (blocks per SM: 2 big, 5 small): enough
 * splits to fill about one wave, at most MMA_MAX_SPLIT, each at least
 * MMA_SPLIT_MIN_K deep (the partials' traffic stays small next to the
 * GEMM). */
enum { MMA_K_SMALL, MMA_K_BIG, MMA_K_C2 };
struct gemm_plan {
    int kind; /* MMA_K_* */
    int split;
};

static int plan_bm(int kind) {
    return kind == MMA_K_SMALL ? 64 : 128;
}
static int plan_bn(int kind) {
    return kind == MMA_K_SMALL ? 64 : 128;
}
static int plan_bk(int kind) {
    return kind == MMA_K_C2 ? 64 : MMA_BK;
}
static int plan_per_sm(int kind) {
    return kind == MMA_K_SMALL ? 5 : 2;
}

static gemm_plan plan_gemm(int64_t rows, int64_t nt, int64_t n_in, bool may_split, int sms) {
    gemm_plan p;
    sms = sms > 0 ? sms : 1;
    const int64_t big_blocks = ((rows + 127) / 128) * ((nt + 127) / 128);
    const bool big = 4 * big_blocks >= 3 * (int64_t)sms;
    p.kind = big ? (g_c2_ok ? MMA_K_C2 : MMA_K_BIG) : MMA_K_SMALL;
    const int64_t bm = plan_bm(p.kind), bn = plan_bn(p.kind);
    const int64_t blocks = ((rows + bm - 1) / bm) * ((nt + bn - 1) / bn);
    const int64_t wave = (int64_t)sms * plan_per_sm(p.kind);
    p.split = 1;
    if (may_split && 2 * blocks <= wave) {
        int64_t sp = wave / blocks;
        sp = sp > MMA_MAX_SPLIT ? MMA_MAX_SPLIT : sp;
        while (sp > 1 && n_in / sp < MMA_SPLIT_MIN_K)
            sp--;
        p.split = (int)sp;
    }
    return p;
}

/* k per split: a multiple of the k tile bk; every split is non-empty since
 * n_in / split >= MMA_SPLIT_MIN_K (>> (split - 1) bk). */
static int64_t split_klen(int64_t n_in, int split, int64_t bk) {
    return split <= 1 ? n_in : ((n_in + split - 1) / split + bk - 1) / bk * bk;
}

static size_t align256(size_t n) {
    return (n + 255) / 256 * 256;
}

/* Bytes of f32 split-K partials the chunks of a single matmul need. */
static size_t partial_bytes(const mf_cu_matmul_args *a, int64_t crows) {
    if (a->no_split)
        return 0;
    size_t most = 0;
    const int64_t last = a->n_out - (a->n_out - 1) / crows * crows;
    const int64_t cand[2] = {crows, last};
    for (int i = 0; i < 2; i++) {
        const gemm_plan p = plan_gemm(cand[i], a->nt, a->n_in, true, a->sms);
        const size_t b = p.split > 1 ? (size_t)p.split * (size_t)cand[i] * (size_t)a->nt * 4 : 0;
        most = b > most ? b : most;
    }
    return most;
}

extern "C" int mf_cu_mma_wanted(const mf_cu_matmul_args *a) {
    if (g_mma_ok != 1 || a->n_in <= 0 || a->n_in % 8 || a->nt <= 0 || a->n_out <= 0 ||
        !mf_cu_type_supported(a->wtype))
        return 0;
    if (a->force_gemm == 3)
        return 1;
    if (a->force_gemm != 0 || a->no_mma || a->no_tc)
        return 0;
    const int64_t min_nt = a->mma_min_nt > 0 ? a->mma_min_nt : MMA_DEFAULT_MIN_NT;
    return a->nt > 8 && a->nt >= min_nt;
}

/* w_bytes: the f16 weight chunk (none for an F16 weight used in place),
 * then, 256-byte aligned, the split-K partials. */
extern "C" void mf_cu_mma_scratch(const mf_cu_matmul_args *a, size_t *w_bytes, size_t *x_bytes) {
    const int64_t crows = chunk_rows(a);
    const size_t wb = w_in_place(a) ? 0 : align256((size_t)crows * (size_t)a->n_in * 2);
    *w_bytes = wb + partial_bytes(a, crows);
    *x_bytes = (size_t)a->nt * (size_t)a->n_in * 2;
}

/* One GEMM of `rows` weight rows through epilogue EPI with plan p; with
 * p.split > 1 (EPI_PLAIN only) into the f32 partials `part` (split x nt x
 * rows), then reduced into ep.y[0] (ld ep.ld[0], + ep.bias[0]). */
template <int EPI>
static cudaError_t gemm_run(const half *w, const half *x, int64_t n_in, int64_t rows, int64_t nt, mma_epi ep,
                            gemm_plan p, float *part, int sms, cudaStream_t s) {
    mma_epi e = ep;
    if (p.split > 1) {
        if (EPI != EPI_PLAIN || !part)
            return cudaErrorInvalidValue;
        e.y[0] = part;
        e.bias[0] = NULL;
        e.ld[0] = rows;
        e.zstride = rows * nt;
    }
    const int64_t k_len = split_klen(n_in, p.split, plan_bk(p.kind));
    const int64_t bm = plan_bm(p.kind), bn = plan_bn(p.kind);
    const dim3 grid((unsigned)((nt + bn - 1) / bn), (unsigned)((rows + bm - 1) / bm), (unsigned)p.split);
    switch (p.kind) {
    case MMA_K_BIG:
        mma_gemm_kernel<MMA_BIG, EPI><<<grid, 256, mma_smem_bytes<MMA_BIG>(), s>>>(w, x, n_in, k_len, rows, nt, e);
        break;
    case MMA_K_SMALL:
        mma_gemm_kernel<MMA_SMALL, EPI><<<grid, 128, mma_smem_bytes<MMA_SMALL>(), s>>>(w, x, n_in, k_len, rows, nt,
                                                                                       e);
        break;
    case MMA_K_C2:
        mma_gemm64_kernel<MMA_C2, EPI><<<grid, mma64_threads<MMA_C2>(), mma64_smem<MMA_C2>(), s>>>(
            w, x, n_in, k_len, rows, nt, e);
        break;
    default:
        return cudaErrorInvalidValue;
    }
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess || p.split <= 1)
        return err;
    int64_t blocks = (rows * nt + MMA_X_THREADS - 1) / MMA_X_THREADS;
    blocks = blocks > 8 * (int64_t)sms ? 8 * (int64_t)sms : blocks;
    splitk_reduce_kernel<<<(unsigned)blocks, MMA_X_THREADS, 0, s>>>(part, p.split, ep.bias[0], ep.y[0], rows, nt,
                                                                    ep.ld[0]);
    return cudaGetLastError();
}

template <int T>
static cudaError_t dequant_launch(const uint8_t *w, uint64_t row_bytes, half *dst, int64_t n_in, int64_t rows,
                                  int64_t dst_off, int il, cudaStream_t s) {
    const int64_t units = rows * ((n_in + 31) / 32);
    dequant_f16_kernel<T><<<(unsigned)((units + MMA_DQ_THREADS - 1) / MMA_DQ_THREADS), MMA_DQ_THREADS, 0, s>>>(
        w, row_bytes, dst, n_in, rows, n_in % 32 == 0, dst_off, il);
    return cudaGetLastError();
}

/* rows of weight w (type t) into scratch rows dq_row(j, dst_off, il) of dst. */
static cudaError_t dequant_any(uint32_t t, const void *w, uint64_t row_bytes, half *dst, int64_t n_in, int64_t rows,
                               int64_t dst_off, int il, cudaStream_t s) {
    switch (t) {
#define MF_CASE(T) \
    case T:        \
        return dequant_launch<T>((const uint8_t *)w, row_bytes, dst, n_in, rows, dst_off, il, s);
        MF_CU_FOR_EACH_WTYPE(MF_CASE)
#undef MF_CASE
    default:
        return cudaErrorInvalidValue;
    }
}

/* Benchmarks: W (rows of row_bytes) dequantized to f16 dst[rows][n_in], as step 1. */
extern "C" cudaError_t mf_cu_mma_dequant(uint32_t wtype, const void *w, uint64_t row_bytes, int64_t n_in,
                                         int64_t rows, void *dst, cudaStream_t s) {
    if (g_mma_ok != 1 || !mf_cu_type_supported(wtype) || n_in <= 0 || n_in % 8 || rows <= 0)
        return cudaErrorInvalidValue;
    return dequant_any(wtype, w, row_bytes, (half *)dst, n_in, rows, 0, 0, s);
}

static cudaError_t x_convert(const float *x, void *xf16, int64_t nt, int64_t n_in, int sms, cudaStream_t s) {
    const int64_t n8 = nt * n_in / 8;
    int64_t blocks = (n8 + MMA_X_THREADS - 1) / MMA_X_THREADS;
    sms = sms > 0 ? sms : 1;
    blocks = blocks > 8 * (int64_t)sms ? 8 * (int64_t)sms : blocks;
    x_f16_kernel<<<(unsigned)blocks, MMA_X_THREADS, 0, s>>>(x, (half *)xf16, n8, (((uintptr_t)x) & 15) == 0);
    return cudaGetLastError();
}

extern "C" cudaError_t mf_cu_gemm_mma(const mf_cu_matmul_args *a, cudaStream_t s) {
    const bool in_place = w_in_place(a);
    if (!a->xf16 || (!in_place && !a->wf16) || !mf_cu_mma_wanted(a))
        return cudaErrorInvalidValue;
    if (!a->x_ready) {
        cudaError_t e = x_convert(a->x, a->xf16, a->nt, a->n_in, a->sms, s);
        if (e != cudaSuccess)
            return e;
    }
    const int64_t crows = chunk_rows(a);
    float *part = NULL;
    if (partial_bytes(a, crows)) {
        if (!a->wf16)
            return cudaErrorInvalidValue;
        part = (float *)((char *)a->wf16 + (in_place ? 0 : align256((size_t)crows * (size_t)a->n_in * 2)));
    }
    for (int64_t r0 = 0; r0 < a->n_out; r0 += crows) {
        const int64_t rows = a->n_out - r0 < crows ? a->n_out - r0 : crows;
        const half *w = (const half *)a->wf16;
        if (in_place) {
            w = (const half *)((const uint8_t *)a->w + (uint64_t)r0 * a->row_bytes);
        } else {
            cudaError_t e = dequant_any(a->wtype, (const uint8_t *)a->w + (uint64_t)r0 * a->row_bytes, a->row_bytes,
                                        (half *)a->wf16, a->n_in, rows, 0, 0, s);
            if (e != cudaSuccess)
                return e;
        }
        mma_epi ep = {};
        ep.y[0] = a->y + r0;
        ep.bias[0] = a->bias ? a->bias + r0 : NULL;
        ep.ld[0] = a->n_out;
        const gemm_plan p = plan_gemm(rows, a->nt, a->n_in, !a->no_split, a->sms);
        cudaError_t e = gemm_run<EPI_PLAIN>(w, (const half *)a->xf16, a->n_in, rows, a->nt, ep, p, part, a->sms, s);
        if (e != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

/* ---- fused QKV / gate+up: one GEMM over several weights ---------------------------------- */

/* Gate/up outputs per chunk of the fused FFN: 2 f rows of f16 per output
 * within the chunk limit, multiples of 64, balanced. */
static int64_t ffn_chunk(const mf_cu_mma_multi_args *a) {
    const int64_t nf = a->n_out[0];
    int64_t most = (int64_t)(chunk_limit(a->wchunk_bytes) / ((uint64_t)a->n_in * 4)) / 64 * 64;
    most = most < 64 ? 64 : most > MMA_MAX_CHUNK_ROWS / 2 ? MMA_MAX_CHUNK_ROWS / 2 : most;
    const int64_t n_chunks = (nf + most - 1) / most;
    const int64_t f = ((nf + n_chunks - 1) / n_chunks + 63) / 64 * 64;
    return f < nf ? f : nf;
}

extern "C" int mf_cu_mma_multi_ok(const mf_cu_mma_multi_args *a) {
    if (g_mma_ok != 1 || a->n_in <= 0 || a->n_in % 8 || a->nt <= 0 || a->n_w != (a->swiglu ? 2 : 3))
        return 0;
    int64_t rows = 0;
    for (int i = 0; i < a->n_w; i++) {
        if (!mf_cu_type_supported(a->wtype[i]) || a->n_out[i] <= 0 || !a->w[i] || !a->y[i])
            return 0;
        rows += a->n_out[i];
    }
    if (a->swiglu)
        return a->n_out[0] == a->n_out[1] && a->n_out[0] % 8 == 0;
    return rows <= MMA_MAX_CHUNK_ROWS &&
           (uint64_t)rows * (uint64_t)a->n_in * 2 <= chunk_limit(a->wchunk_bytes);
}

extern "C" void mf_cu_mma_multi_scratch(const mf_cu_mma_multi_args *a, size_t *w_bytes, size_t *x_bytes) {
    int64_t rows = 0;
    if (a->swiglu)
        rows = 2 * ffn_chunk(a);
    else
        for (int i = 0; i < a->n_w && i < 3; i++)
            rows += a->n_out[i];
    *w_bytes = (size_t)rows * (size_t)a->n_in * 2;
    *x_bytes = (size_t)a->nt * (size_t)a->n_in * 2;
}

extern "C" cudaError_t mf_cu_gemm_mma_multi(const mf_cu_mma_multi_args *a, cudaStream_t s) {
    if (!mf_cu_mma_multi_ok(a) || !a->wf16 || !a->xf16)
        return cudaErrorInvalidValue;
    cudaError_t e = cudaSuccess;
    if (!a->x_ready && (e = x_convert(a->x, a->xf16, a->nt, a->n_in, a->sms, s)) != cudaSuccess)
        return e;
    half *wf = (half *)a->wf16;
    const half *xh = (const half *)a->xf16;
    if (!a->swiglu) {
        mma_epi ep = {};
        int64_t off = 0;
        for (int i = 0; i < 3; i++) {
            if ((e = dequant_any(a->wtype[i], a->w[i], a->row_bytes[i], wf, a->n_in, a->n_out[i], off, 0, s)) !=
                cudaSuccess)
                return e;
            ep.y[i] = a->y[i];
            ep.bias[i] = a->bias[i];
            ep.ld[i] = a->n_out[i];
            off += a->n_out[i];
            if (i < 2)
                ep.end[i] = off;
        }
        return gemm_run<EPI_ROUTE>(wf, xh, a->n_in, off, a->nt, ep,
                                   plan_gemm(off, a->nt, a->n_in, false, a->sms), NULL, a->sms, s);
    }
    const int64_t nf = a->n_out[0], fc = ffn_chunk(a);
    for (int64_t f0 = 0; f0 < nf; f0 += fc) {
        const int64_t fr = nf - f0 < fc ? nf - f0 : fc;
        for (int i = 0; i < 2; i++)
            if ((e = dequant_any(a->wtype[i], (const uint8_t *)a->w[i] + (uint64_t)f0 * a->row_bytes[i],
                                 a->row_bytes[i], wf, a->n_in, fr, 8 * i, 1, s)) != cudaSuccess)
                return e;
        mma_epi ep = {};
        ep.y[0] = a->y[0] + f0;
        ep.ld[0] = nf;
        ep.bias[0] = a->bias[0] ? a->bias[0] + f0 : NULL;
        ep.bias[1] = a->bias[1] ? a->bias[1] + f0 : NULL;
        const gemm_plan p = plan_gemm(2 * fr, a->nt, a->n_in, false, a->sms);
        if ((e = gemm_run<EPI_SWIGLU>(wf, xh, a->n_in, 2 * fr, a->nt, ep, p, NULL, a->sms, s)) != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

#include "backend/cuda/probe.cuh"

/* The 64x64-warp big tile: its three epilogue instances must resolve (an
 * error, as for every kernel); whether the device gives them their shared
 * memory (and the max-shared carveout, for 2 blocks per SM) decides
 * g_c2_ok: without it plan_gemm takes the 128x128 tile, never an error. */
template <int BM, int BN, int BK, int STAGES, int MINB>
static cudaError_t cfg_setup(int optin, size_t smem_limit, const char **bad) {
    const void *fn[3] = {(const void *)mma_gemm64_kernel<BM, BN, BK, STAGES, MINB, EPI_PLAIN>,
                         (const void *)mma_gemm64_kernel<BM, BN, BK, STAGES, MINB, EPI_ROUTE>,
                         (const void *)mma_gemm64_kernel<BM, BN, BK, STAGES, MINB, EPI_SWIGLU>};
    const int threads = mma64_threads<BM, BN, BK, STAGES, MINB>();
    const size_t smem = mma64_smem<BM, BN, BK, STAGES, MINB>();
    bool ok = (size_t)optin >= smem;
    for (int i = 0; i < 3; i++) {
        const cudaError_t e = mf_probe_one(fn[i], "mma_gemm64_kernel", threads, smem_limit, bad);
        if (e != cudaSuccess)
            return e;
        ok = ok && cudaFuncSetAttribute(fn[i], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess &&
             cudaFuncSetAttribute(fn[i], cudaFuncAttributePreferredSharedMemoryCarveout,
                                  (int)cudaSharedmemCarveoutMaxShared) == cudaSuccess;
    }
    cudaGetLastError();
    g_c2_ok = ok;
    return cudaSuccess;
}

/* Resolves the kernels, raises the dynamic shared-memory limit of the GEMM
 * configs and decides whether the tier is usable on this device (cc >= 8.0:
 * cp.async, ldmatrix and m16n8k16 need sm_80; opt-in shared memory for the
 * big config). A device without it keeps the wmma tier: not an error. */
extern "C" cudaError_t mf_cu_probe_mma(size_t smem_limit, const char **bad) {
    int dev = 0, major = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
        cudaGetLastError();
        g_mma_ok = 0;
        return cudaSuccess;
    }
    if (major < 8 || (size_t)optin < mma_smem_bytes<MMA_BIG>()) {
        g_mma_ok = 0;
        return cudaSuccess;
    }
#define MF_CASE(T) MF_PROBE(dequant_f16_kernel<T>, MMA_DQ_THREADS);
    MF_CU_FOR_EACH_WTYPE(MF_CASE)
#undef MF_CASE
    MF_PROBE(x_f16_kernel, MMA_X_THREADS);
    MF_PROBE(splitk_reduce_kernel, MMA_X_THREADS);
#define MF_GEMM_CASE(EPI)                                                                              \
    MF_PROBE((mma_gemm_kernel<MMA_BIG, EPI>), 256);                                                    \
    MF_PROBE((mma_gemm_kernel<MMA_SMALL, EPI>), 128);                                                  \
    if (e == cudaSuccess)                                                                              \
        e = cudaFuncSetAttribute((const void *)mma_gemm_kernel<MMA_BIG, EPI>,                          \
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)mma_smem_bytes<MMA_BIG>()); \
    if (e == cudaSuccess)                                                                              \
        e = cudaFuncSetAttribute((const void *)mma_gemm_kernel<MMA_SMALL, EPI>,                        \
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,                          \
                                 (int)mma_smem_bytes<MMA_SMALL>());
    cudaError_t e = cudaSuccess;
    MF_GEMM_CASE(EPI_PLAIN)
    MF_GEMM_CASE(EPI_ROUTE)
    MF_GEMM_CASE(EPI_SWIGLU)
#undef MF_GEMM_CASE
    if (e != cudaSuccess) {
        *bad = "mma_gemm_kernel (dynamic shared memory)";
        return e;
    }
    /* the 64x64-warp big tile: a device that cannot give it its shared
     * memory (or carveout) keeps the 128x128 tile, never an error */
    const cudaError_t ce = cfg_setup<MMA_C2>(optin, smem_limit, bad);
    if (ce != cudaSuccess)
        return ce;
    g_mma_ok = 1;
    return cudaSuccess;
}
