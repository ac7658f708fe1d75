/* cuda_args.h - kernel argument structs of the CUDA backend, declared once.
 *
 * Included by the host code (cuda_backend.c, plain C) and by every kernel
 * file (.cu, C++), so the two sides cannot disagree on a field. Each kernel
 * family exports one C-callable launcher, mf_cu_<family>(args, stream), which
 * enqueues its kernel(s) on the stream and returns cudaGetLastError() of the
 * launch (never waits). Pointers are device pointers; shapes are element
 * counts; a row is ne[0] contiguous elements. */
#ifndef MF_CUDA_ARGS_H
#define MF_CUDA_ARGS_H

#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime_api.h>

#ifndef __cplusplus /* the host side (the .cu files never see the tuning) */
#include "backend/cuda/cuda_tune.h"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Device-side fault report: the first kernel that sees an impossible value
 * (a token id past the vocabulary) writes it here; synchronize reads it back
 * and fails naming the node. code 0 = no fault. */
typedef struct mf_cu_fault {
    int32_t code;   /* mf_cu_fault_code */
    int32_t node;   /* graph node index that launched the kernel */
    int64_t value;  /* the offending value */
    int64_t limit;  /* the bound it broke */
} mf_cu_fault;

enum mf_cu_fault_code { MF_CU_FAULT_NONE = 0, MF_CU_FAULT_TOKEN_ID = 1 };

/* Resident blocks per SM of the int8 GEMV kernels (v3: [type][nt > 1]
 * [swiglu]; v4: [instance][U index][swiglu], v4e: the early-load
 * instances [instance][U index], mix: the mixed-type instances [mix][E],
 * zc: the ZC instances), measured once at start by mf_cu_gemv_occupancy
 * and owned by the backend; a 0 entry means not measured (the launchers
 * then assume 4 or 6). */
#define MF_CU_OCC_INST 16 /* >= the v4 instance count (gemv_q8v4.cu checks) */
typedef struct mf_cu_gemv_occ {
    int32_t v3[MF_CU_OCC_INST][2][2];
    int32_t v4[MF_CU_OCC_INST][2][2];
    int32_t v4e[MF_CU_OCC_INST][2];
    int32_t mix[4][2];
    int32_t zc[MF_CU_OCC_INST];
} mf_cu_gemv_occ;
void mf_cu_gemv_occupancy(mf_cu_gemv_occ *o);

/* The int8 GEMV's launch choices, from the tuning (cuda_tune.h; the host
 * resolves each "-1: the rule" to the value named here) and the device. */
typedef struct mf_cu_gemv_tune {
    int32_t v4;         /* nt == 1, the v4 GEMV: -1 where mf_cu_q8v4_u's rule takes it, 1 / 2 slices
                           per lane in flight everywhere it can, 0 off */
    int32_t v4_q6k;     /* Q6_K on the v4 slice decoder: 0 off (the unit decoder), 1 / 2 slices, 3 the
                           rule (2 for rows of >= 4096 in a weight of <= 4 MiB, else 1) */
    int32_t v4_big_mib; /* Q4_K weights of at least this many MiB take 2 slices (0: always) */
    int32_t v4_early;   /* the early-load instances: 0 never, 1 always, 2 launches of <= 4 MiB */
    int32_t v4_pf;      /* pre-wait L2 prefetch: 0 none, 1 first batch, 2 first row group, 3 2 for
                           launches of <= 4 MiB, else 1 */
    int32_t sms;        /* the device's multiprocessors (one wave = sms x resident blocks) */
    int32_t pdl;        /* the launches with programmatic dependent launch (tune pdl; pdl.cuh) */
    const mf_cu_gemv_occ *occ; /* NULL: not measured */
} mf_cu_gemv_tune;

#ifndef __cplusplus
/* The GEMV choices of tuning t on a device whose occupancy table is occ:
 * each "-1: the rule" of t as the value the kernels read as their rule. */
static inline mf_cu_gemv_tune mf_cu_gemv_tune_of(const mf_cuda_tune *t, const mf_cu_gemv_occ *occ) {
    mf_cu_gemv_tune g;
    g.v4 = t->v4;
    g.v4_q6k = t->v4_q6k < 0 ? 3 : t->v4_q6k;
    g.v4_big_mib = t->v4_big_mib;
    g.v4_early = t->v4_early < 0 ? 2 : t->v4_early;
    g.v4_pf = t->v4_pf < 0 ? 3 : t->v4_pf;
    g.sms = t->sm_count;
    g.pdl = t->pdl;
    g.occ = occ;
    return g;
}
#endif

/* y[t, o] = sum_i W[o, i] x[t, i] (+ bias[o]):  W (n_in, n_out) of wtype,
 * x (n_in, nt) f32, y (n_out, nt) f32. y must not alias x. */
typedef struct mf_cu_matmul_args {
    uint32_t wtype;
    const void *w;          /* n_out rows of row_bytes */
    uint64_t row_bytes;
    const float *x;
    const float *bias;      /* NULL: none */
    float *y;
    int64_t n_in, n_out, nt;
    int32_t force_gemm;     /* tests: 3 mma GEMM, 2 TC GEMM, 1 SIMT GEMM, -1 f32 GEMV, -2 int8 GEMV,
                               0 choose by nt (int8 GEMV for nt <= 8 when q8 is set) */
    int32_t no_tc;          /* tune mm=simt: the SIMT tier for nt > 8 */
    void *q8;               /* scratch of mf_cu_q8_bytes(n_in, nt) for the int8 GEMV; NULL: f32 GEMV */
    /* the mma prefill tier (gemm_mma.cu), taken when mf_cu_mma_wanted */
    int32_t no_mma;         /* tune mm=wmma: the wmma tier for every nt > 8 */
    int32_t mma_min_nt;     /* auto takes the mma tier from this many tokens (0: 64) */
    int32_t x_ready;        /* xf16 already holds this x as f16 (fused QKV / FFN group) */
    uint64_t wchunk_bytes;  /* f16 weight rows per dequant + GEMM chunk, bytes (0: 320 MiB) */
    void *wf16;             /* scratch of mf_cu_mma_scratch's w_bytes (f16 weight chunk, split-K partials) */
    void *xf16;             /* scratch of its x_bytes */
    int32_t gemv_v1;        /* tune gemv=v1: the int8 GEMV on the v1 kernels (else v3) */
    int32_t gemv_auto;      /* v3 only where it measured faster (mf_cu_gemv_v3_wanted) */
    mf_cu_gemv_tune gt;     /* the int8 GEMV's choices */
    int32_t no_split;       /* tune mma_split=0: no split-K in the mma tier */
    int32_t sms;            /* multiprocessors (the mma tier's split-K rule) */
} mf_cu_matmul_args;
cudaError_t mf_cu_matmul(const mf_cu_matmul_args *a, cudaStream_t s);

/* The mma tier (gemm_mma.cu): whether a call takes it (force_gemm 3, or
 * auto at nt >= mma_min_nt without no_mma / no_tc; n_in % 8 == 0 and a
 * device that passed mf_cu_probe_mma), the scratch it needs, and the
 * launcher (dequantize W to f16 per chunk, x to f16, mma.sync GEMM). */
int mf_cu_mma_wanted(const mf_cu_matmul_args *a);
void mf_cu_mma_scratch(const mf_cu_matmul_args *a, size_t *w_bytes, size_t *x_bytes);
cudaError_t mf_cu_gemm_mma(const mf_cu_matmul_args *a, cudaStream_t s);
cudaError_t mf_cu_probe_mma(size_t smem_limit, const char **bad);
/* One mma GEMM over several weights sharing x (n_in, nt): swiglu 0, n_w 3
 * (fused QKV): y[i] (n_out[i] x nt) = W_i x + bias[i], the three weights
 * (any supported types) dequantized into one scratch; swiglu 1, n_w 2
 * (fused FFN): y[0] (n_out[0] x nt) = silu(W0 x + b0) * (W1 x + b1), gate
 * and up rows interleaved in the scratch (n_out[0] == n_out[1], % 8 == 0).
 * _ok: the shapes and types are served (the caller decides the tier with
 * mf_cu_mma_wanted per weight); _scratch: wf16 / xf16 bytes. */
typedef struct mf_cu_mma_multi_args {
    int32_t n_w, swiglu;
    uint32_t wtype[3];
    const void *w[3];
    uint64_t row_bytes[3];
    const float *bias[3];   /* NULL: none */
    float *y[3];
    int64_t n_out[3];
    const float *x;
    int64_t n_in, nt;
    int32_t x_ready;        /* xf16 already holds x as f16 */
    uint64_t wchunk_bytes;  /* 0: the tier's default */
    void *wf16, *xf16;
    int32_t sms;            /* multiprocessors */
} mf_cu_mma_multi_args;
int mf_cu_mma_multi_ok(const mf_cu_mma_multi_args *a);
void mf_cu_mma_multi_scratch(const mf_cu_mma_multi_args *a, size_t *w_bytes, size_t *x_bytes);
cudaError_t mf_cu_gemm_mma_multi(const mf_cu_mma_multi_args *a, cudaStream_t s);
/* Benchmarks: the mma tier's dequantizer alone, W (rows x row_bytes) to f16 dst[rows][n_in]. */
cudaError_t mf_cu_mma_dequant(uint32_t wtype, const void *w, uint64_t row_bytes, int64_t n_in, int64_t rows,
                              void *dst, cudaStream_t s);

/* The int8 decode GEMV (gemv_q8.cu): activations quantized to int8 per
 * 32-element unit into a->q8, then dp4a against the weight's integers.
 * Needs a quantized weight type with n_in % 32 == 0 and nt <= 8. */
int mf_cu_q8_supported(uint32_t wtype, int64_t n_in);
cudaError_t mf_cu_gemv_q8(const mf_cu_matmul_args *a, cudaStream_t s);
/* The fused decode GEMV (tune fuse_gemv): n_w (1..3) weights sharing
 * the input x (n_in, nt <= 8) -> y[i] (n_out[i], nt), one activation
 * quantization into q8 and one GEMV launch per run of equal weight types
 * (Q/K/V of one type: 2 kernels instead of 6). swiglu (n_w == 2, one type,
 * equal n_out): y[0] = silu(W0 x + b0) * (W1 x + b1), y[1] unused (gate/up
 * plus the SwiGLU: 2 kernels instead of 5). res[i] adds a residual in the
 * epilogue (tune fuse_add: MATMUL + ADD as one GEMV). y may alias x
 * (the GEMV reads only the quantized copy). */
typedef struct mf_cu_q8_multi_args {
    int32_t n_w;
    int32_t swiglu;
    const float *x;
    int64_t n_in, nt;
    void *q8; /* scratch of mf_cu_q8_bytes(n_in, nt) */
    uint32_t wtype[3];
    const void *w[3];
    uint64_t row_bytes[3];
    const float *bias[3]; /* NULL: none */
    const float *res[3];  /* NULL: none; else y[i] += res[i] (n_out[i], nt; may equal y[i]) */
    int32_t norm;         /* 1: x is RMSNorm'ed (norm_w, norm_eps) while it is quantized
                             (tune fuse_norm: the norm node is not launched) */
    const float *norm_w;  /* n_in weights; NULL: none */
    float norm_eps;
    int32_t gemv_v1;      /* tune gemv=v1: the v1 kernels (else the v3 row-pair GEMV) */
    int32_t gemv_auto;    /* v3 only where it measured faster (mf_cu_gemv_v3_wanted) */
    mf_cu_gemv_tune gt;   /* as mf_cu_matmul_args.gt */
    int32_t x_q8_ready;   /* q8 already holds x quantized (RMSNorm'ed first with norm): the kernel
                             before wrote it as a by-product; no quantize launch */
    int32_t qkv_mix;      /* tune qkv_mix=1: weights in two runs of different types (Q/K and V of a
                             K-quant mix's use_more_bits layers) as one v4 launch where a mixed-type kernel
                             exists (mf_cu_q8v4_mix_supported), bitwise the two launches; 0: one per run */
    float *y[3];
    int64_t n_out[3];
    void *q8out;          /* tune ffn_q8b: swiglu at nt 1 also writes y[0]'s int8 quantization here
                             (mf_cu_q8_bytes(n_out[0], 1), bitwise the quantize kernel's; must not overlap
                             q8), by the block-local SwiGLU GEMV; only where mf_cu_gemv_q8_ffn_q8b_ok says
                             so (else the launch fails); NULL: the plain launches */
    float *y_host;        /* tune zc: a device alias of mapped pinned host memory (32-byte
                             aligned) that also receives y[0], written by the v4 GEMV's epilogue in whole
                             32-byte lines; only where mf_cu_gemv_q8_zc_ok says so (else the launch fails);
                             NULL: today's launches */
} mf_cu_q8_multi_args;
cudaError_t mf_cu_gemv_q8_multi(const mf_cu_q8_multi_args *a, cudaStream_t s);
/* Whether mf_cu_gemv_q8_multi(a) can also write the int8 h into a->q8out
 * (a->q8out itself not looked at): swiglu, nt 1, gate/up of
 * one type on the v4 GEMV with one slice in flight and one warp per output
 * (mf_cu_q8v4_swq8_ok: Q4_0 / Q5_0 / Q8_0 / Q4_K / Q6_K, n_out % 32 == 0,
 * n_in <= 2048). */
int mf_cu_gemv_q8_ffn_q8b_ok(const mf_cu_q8_multi_args *a);
/* Whether mf_cu_gemv_q8_multi(a) can also write y[0] into a->y_host
 * (a->y_host itself not looked at): one weight, nt 1, no swiglu or
 * residual, the v4 GEMV with one slice in flight and one warp per row
 * pair (mf_cu_q8v4_zc_ok: Q4_0 / Q5_0 / Q8_0, their plane copies, Q6_K on
 * the slice decoder); not with q8out set (no ZC form of FFN_Q8B: the
 * launch fails). */
int mf_cu_gemv_q8_zc_ok(const mf_cu_q8_multi_args *a);
/* Host counts for tests (a captured launch counts once, replays not): the
 * quantize kernel launches of the int8 GEMVs (q8_quant_kernel, not the
 * norm-quant) and the block-local SwiGLU GEMV launches (FFN_Q8B). */
int64_t mf_cu_q8_quant_count(void);
int64_t mf_cu_q8v4_swq8_count(void);
static inline size_t mf_cu_q8_bytes(int64_t n_in, int64_t nt) {
    /* int8 values, then a float scale and an int32 of two half sums per unit */
    return (size_t)(nt * n_in) + (size_t)(nt * (n_in / 32)) * 8 + 256;
}

/* nrows rows of n: y = x / sqrt(mean(x^2) + eps) * w (w has n elements, NULL:
 * no weight). QkNorm is this with n = head_dim. y may equal x. */
typedef struct mf_cu_norm_args {
    const float *x;
    const float *w;
    float *y;
    int64_t n, nrows;
    float eps;
    int32_t pdl;    /* launched with programmatic dependent launch (tune pdl; pdl.cuh) */
} mf_cu_norm_args;
cudaError_t mf_cu_rmsnorm(const mf_cu_norm_args *a, cudaStream_t s);

/* RoPE of nt rows of n_head heads of head_dim at positions pos[t] (device
 * I32), or pos0 + t when pos is NULL. y may equal x; dims >= n_rot copied. */
typedef struct mf_cu_rope_args {
    const float *x;
    float *y;
    const int32_t *pos;
    int64_t pos0;
    const int32_t *pos0_dev; /* non-NULL: pos0 is read from here (CUDA graph replay) */
    int64_t nt;
    int32_t n_head, head_dim, n_rot, mode;
    float theta, freq_scale;
    int32_t pdl;    /* launched with programmatic dependent launch (tune pdl; pdl.cuh) */
} mf_cu_rope_args;
cudaError_t mf_cu_rope(const mf_cu_rope_args *a, cudaStream_t s);

/* Elementwise ops over n elements (y may equal a or b). ADD and MUL with b_n < n
 * broadcasts b (b_n elements, a row) along a. */
enum mf_cu_ew_op {
    MF_CU_EW_ADD,
    MF_CU_EW_MUL,
    MF_CU_EW_SCALE,
    MF_CU_EW_SILU,
    MF_CU_EW_SWIGLU, /* silu(a) * b */
    MF_CU_EW_COPY,
};
typedef struct mf_cu_ew_args {
    int32_t op;
    const float *a, *b;
    float *y;
    int64_t n, b_n;
    float s;
    int32_t pdl;    /* launched with programmatic dependent launch (tune pdl; pdl.cuh) */
} mf_cu_ew_args;
cudaError_t mf_cu_elementwise(const mf_cu_ew_args *a, cudaStream_t s);

/* Row softmax of x * scale, nrows rows of n (y may equal x). */
typedef struct mf_cu_softmax_args {
    const float *x;
    float *y;
    int64_t n, nrows;
    float scale;
    int32_t pdl;    /* launched with programmatic dependent launch (tune pdl; pdl.cuh) */
} mf_cu_softmax_args;
cudaError_t mf_cu_softmax(const mf_cu_softmax_args *a, cudaStream_t s);

/* Generic strided 4-d copy of 4-byte elements: y[i0,i1,i2,i3] (contiguous,
 * shape ne) = x[i0*st[0] + i1*st[1] + i2*st[2] + i3*st[3]]. VIEW, PERMUTE and
 * row select are this. y must not alias x. */
typedef struct mf_cu_copy_args {
    const void *x;
    void *y;
    int64_t ne[4];
    int64_t st[4];
    int32_t pdl;    /* launched with programmatic dependent launch (tune pdl; pdl.cuh) */
} mf_cu_copy_args;
cudaError_t mf_cu_copy4d(const mf_cu_copy_args *a, cudaStream_t s);

/* tune slots=1: copies n writes of the slots (the mapped
 * pinned block whose device alias is src; bytes [0, used) hold them, 16-byte
 * aligned) to their device addresses: write i is len[i] bytes at src +
 * off[i] for dst[i]. One block; reads the slots when it runs (a graph
 * replay copies what the host wrote last). */
#define MF_CU_SLOT_N 8
#define MF_CU_SLOT_BYTES 4096
typedef struct mf_cu_slot_args {
    const void *src;
    uint32_t used;
    int32_t n;
    void *dst[MF_CU_SLOT_N];
    uint32_t off[MF_CU_SLOT_N], len[MF_CU_SLOT_N];
    int32_t pdl;    /* launched with programmatic dependent launch (tune pdl; pdl.cuh) */
} mf_cu_slot_args;
cudaError_t mf_cu_slot_copy(const mf_cu_slot_args *a, cudaStream_t s);

/* Embedding gather: y[t] = dequant(W row ids[t]), W n_rows rows of n of
 * wtype. An id outside [0, n_rows) writes NaN and reports a fault. */
typedef struct mf_cu_getrows_args {
    uint32_t wtype;
    const void *w;
    uint64_t row_bytes;
    int64_t n, n_rows;
    const int32_t *ids;
    int64_t nt;
    float *y;
    mf_cu_fault *fault;
    int32_t node;
    int32_t pdl;    /* launched with programmatic dependent launch (tune pdl; pdl.cuh) */
} mf_cu_getrows_args;
cudaError_t mf_cu_getrows(const mf_cu_getrows_args *a, cudaStream_t s);

/* KV cache rows: store nt rows of kv_dim floats at rows [pos0, pos0 + nt) of a
 * region of kv_type (f32, f16, q8_0); load rows [0, n) as floats. */
typedef struct mf_cu_kv_args {
    uint32_t kv_type;
    void *cache;
    int64_t kv_dim;
    int64_t pos0, nt;
    const int32_t *pos0_dev; /* non-NULL: pos0 is read from here (CUDA graph replay) */
    const float *src; /* store */
    float *dst;       /* load */
    int32_t pdl;    /* launched with programmatic dependent launch (tune pdl; pdl.cuh) */
} mf_cu_kv_args;
cudaError_t mf_cu_kv_store(const mf_cu_kv_args *a, cudaStream_t s);
cudaError_t mf_cu_kv_load(const mf_cu_kv_args *a, cudaStream_t s);

/* RoPE of Q (rq: x -> y) and of K in place (rk: x == y), then the K rows
 * (ks.src == rk.y) and V rows (vs) stored into the cache: the tail of
 * FUSED_QKV in one launch (tune fuse_rope), bitwise equal to
 * mf_cu_rope x2 + mf_cu_kv_store x2. All four describe the same nt. */
typedef struct mf_cu_rope_store_args {
    mf_cu_rope_args rq, rk;
    mf_cu_kv_args ks, vs;
    /* both non-NULL: first RMSNorm every Q head (rq.x, in place) and K head
     * (rows of head_dim, these weights, norm_eps): Qwen3's QkNorm, bitwise
     * mf_cu_rmsnorm's; NULL: none */
    const float *q_norm, *k_norm;
    float norm_eps;
} mf_cu_rope_store_args;
cudaError_t mf_cu_rope_store(const mf_cu_rope_store_args *a, cudaStream_t s);

/* Causal GQA attention over the cache: token t at position n_past + t
 * attends to rows [0, n_past + t]; q/out nt rows of n_head * head_dim; head
 * h reads KV head h / (n_head / n_head_kv). out may equal q. */
#define MF_CU_ATTN_MAX_HEAD_DIM 256
typedef struct mf_cu_attn_args {
    const float *q;
    float *out;
    const void *k, *v;
    uint32_t kv_type;
    int64_t nt, n_past;
    const int32_t *n_past_dev; /* non-NULL: n_past is read from here (CUDA graph replay) */
    int32_t n_head, n_head_kv, head_dim;
    float scale;
    int32_t flash; /* tune attn_prefill: the query-tiled kernel (mf_cu_attn_flash_ok) */
    int32_t n_ctx; /* cache rows: fixes the split-KV decode's split count; 0: unknown */
    float *part;   /* scratch of mf_cu_attn_decode_bytes(): the split-KV decode path; NULL: off */
    int32_t tc;    /* tensor-core prefill (mf_cu_attn_mma_ok); tune attn_prefill=flash=1 clears it */
    int32_t *cnt;  /* split-KV decode, tune attn_decode=one: nt * n_head_kv zeroed counters (left
                      zeroed); the last block of each (token, KV head) combines, no second
                      kernel. NULL: the combine kernel */
    void *q8out;   /* with cnt: also the int8 quantization of out (mf_cu_q8_bytes(n_head *
                      head_dim, nt) layout, bitwise the quantize kernel's); NULL: none */
    int32_t short_warps; /* tune short_warps: the short-context kernel's warps a block, 12 (0) or 4 */
    int32_t no_pf; /* tune attn_pf=0: the short-context kernels do not ask L2 for the cache rows
                      of earlier forwards before their PDL wait (0: they do, the default; the
                      same bits either way) */
    int32_t pdl;    /* launched with programmatic dependent launch (tune pdl; pdl.cuh) */
} mf_cu_attn_args;
cudaError_t mf_cu_attn(const mf_cu_attn_args *a, cudaStream_t s);
/* Whether the flash-prefill kernel takes this shape: head_dim <= 128, nt > 8. */
int mf_cu_attn_flash_ok(int32_t head_dim, int64_t nt);
/* Split-KV flash decode (attn_decode.cu; tune attn_decode=block=1 turns
 * it off): nt <= 8, head_dim 64 or 128, at most 8 query heads per KV head,
 * f32/f16/q8_0 cache. Returns the scratch bytes a->part needs, 0 when the
 * shape is not taken; a function of nt, n_head, n_head_kv, head_dim and
 * n_ctx only (not n_past), so a captured graph stays valid. mf_cu_attn takes
 * this path when a->part is set and the shape fits. */
size_t mf_cu_attn_decode_bytes(const mf_cu_attn_args *a);
cudaError_t mf_cu_attn_decode(const mf_cu_attn_args *a, cudaStream_t s);
/* Short-context decode attention in one kernel, no scratch (attn_short.cu;
 * tune attn_decode=short=1, the backend takes it where the one-kernel
 * split-KV decode would run): a block per (query head, token), nt <= 8,
 * head_dim 64 or 128, <= 8 query heads per KV head, f32/f16 cache, q/out/k/v
 * 16-byte aligned; a->part and a->cnt are ignored, a->q8out (if set) gets
 * the int8 quantization of out (mf_cu_q8_bytes layout, bitwise the quantize
 * kernel's). Correct at any depth, meant for <= 384 rows: a->short_warps
 * warps a block, 12 (0: the default; 32 rows a warp, so 384 in one pass) or
 * 4 (128 rows a pass); another value: cudaErrorInvalidValue. _ok: whether
 * it takes a's shape. */
int mf_cu_attn_short_ok(const mf_cu_attn_args *a);
cudaError_t mf_cu_attn_short(const mf_cu_attn_args *a, cudaStream_t s);
/* tune short_rope (attn_short.cu): mf_cu_attn_short (12 warps) with
 * the rope-store r of the token folded in, one token: the kernel reads the
 * raw q (r->rq.x; a->q is not read), QkNorms (r->q_norm / k_norm) and ropes
 * q of its head and K of its KV head, and the first query head of each
 * group stores that K and V (r->vs.src) into cache row n_past; every
 * output, the cache rows included, bitwise rope_store + attn_short's.
 * Nothing is written to r->rq.y, r->rk.y or r->rq.x. _ok: whether it takes
 * (a, r): f32 / f16 caches, r's heads, head_dim, caches and row a's. */
int mf_cu_attn_short_rope_ok(const mf_cu_attn_args *a, const mf_cu_rope_store_args *r);
cudaError_t mf_cu_attn_short_rope(const mf_cu_attn_args *a, const mf_cu_rope_store_args *r, cudaStream_t s);
/* Tensor-core flash prefill (attn_prefill_mma.cu): nt > 8, head_dim 64 or
 * 128, f32/f16/q8_0 cache, q/out/k/v 16-byte aligned, a device of cc >= 8.0
 * (recorded by mf_cu_attn_mma_setup, which mf_cu_probe_attn calls). mf_cu_attn
 * takes it before the SIMT kernels when a->tc is set and the shape fits. */
int mf_cu_attn_mma_ok(const mf_cu_attn_args *a);
cudaError_t mf_cu_attn_mma(const mf_cu_attn_args *a, cudaStream_t s);
cudaError_t mf_cu_attn_mma_setup(const char **bad);

/* Built with MINFER_CUDA_KTIME (MF_KTIME) only: prints the kernel timeline
 * recorded in mf_pdl_wait (pdl.cuh) to f and empties it; cu_free calls it
 * with the device idle. Not defined without the option. */
void mf_cu_ktime_dump(FILE *f);
/* Whether the v3 GEMV takes a launch of `rows` output rows of n_in inputs of
 * wtype under the auto rule (docs/PERF.md: with PDL on, v3 wins on
 * the layer matmuls; v1 on the vocab-wide lm_head and on Q6_K). */
int mf_cu_gemv_v3_wanted(uint32_t wtype, int64_t n_in, int64_t rows);
/* Slices in flight for a one-token GEMV over `rows` weight rows of n_in
 * (gate and up both counted for SwiGLU) of wtype under g (g->v4: -1 the
 * auto rule, 0 off, 1 / 2 forced); 0: not v4 (gemv_q8v4.cu). */
int mf_cu_q8v4_u(const mf_cu_gemv_tune *g, uint32_t wtype, int64_t rows, int64_t n_in);
/* tune zc: whether a single-weight, non-SwiGLU v4 launch of
 * u slices over `rows` rows of wtype has a ZC instance (the epilogue that
 * also stores the rows into mapped host memory) with the plain launch's
 * plan: u 1, ks 1, an instance of ZC_FOR_EACH_INST (gemv_q8v4.cu). _count:
 * ZC launches so far (host count; a captured launch counts once). */
int mf_cu_q8v4_zc_ok(const mf_cu_gemv_tune *g, uint32_t wtype, int u, int64_t rows, int64_t n_in);
int64_t mf_cu_q8v4_zc_count(void);
/* Launches of the mixed-type v4 GEMV so far (tune qkv_mix; host
 * count, for tests: a captured launch counts once, its replays not). */
int64_t mf_cu_q8v4_mix_count(void);
/* The FFN_Q8B kernel's rule for a SwiGLU GEMV of n_out outputs over n_in
 * with u slices in flight (gemv_q8v4.cu, see mf_cu_gemv_q8_ffn_q8b_ok). */
int mf_cu_q8v4_swq8_ok(const mf_cu_gemv_tune *g, uint32_t wtype, int u, int64_t n_out, int64_t n_in);

/* Test entry: the int8 GEMV's activation quantization alone, nt rows of n_in
 * (n_in % 32 == 0) into q8 (mf_cu_q8_bytes layout), RMSNorm'ed by w (NULL:
 * none) and eps first when norm; pdl as the args' pdl fields. */
cudaError_t mf_cu_q8_quant_rows(const float *x, const float *w, float eps, int norm, int64_t n_in, int64_t nt,
                                void *q8, int pdl, cudaStream_t s);

/* Weight types with a matmul / getrows kernel. */
int mf_cu_type_supported(uint32_t wtype);

/* Start-up probes, one per kernel file: resolve every kernel of the family on
 * the current device (cudaFuncGetAttributes) and check its static shared
 * memory against smem_limit and its launch width against the kernel's
 * limit. On failure *bad names the kernel. A kernel image missing for this
 * GPU fails here, at start, not at the first token. */
cudaError_t mf_cu_probe_matmul(size_t smem_limit, const char **bad);
cudaError_t mf_cu_probe_norm(size_t smem_limit, const char **bad);
cudaError_t mf_cu_probe_rope(size_t smem_limit, const char **bad);
cudaError_t mf_cu_probe_elementwise(size_t smem_limit, const char **bad);
cudaError_t mf_cu_probe_getrows(size_t smem_limit, const char **bad);
cudaError_t mf_cu_probe_kv(size_t smem_limit, const char **bad);
cudaError_t mf_cu_probe_attn(size_t smem_limit, const char **bad);
cudaError_t mf_cu_probe_attn_decode(size_t smem_limit, const char **bad);
cudaError_t mf_cu_probe_attn_short(size_t smem_limit, const char **bad);
cudaError_t mf_cu_probe_gemv_q8(size_t smem_limit, const char **bad);
cudaError_t mf_cu_probe_rope_store(size_t smem_limit, const char **bad);

#ifdef __cplusplus
}
#endif

#endif
