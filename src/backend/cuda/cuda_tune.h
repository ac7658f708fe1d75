/* cuda_tune.h - the one place that chooses the CUDA backend's kernels.
 *
 * mf_cuda_tune holds every kernel-choice number of the backend: the device
 * properties read at start (compute capability, SM count, shared memory per
 * block) and the choices made from them. mf_cuda_tune_defaults fills it for
 * a device; mf_cuda_tune_parse then applies a tuning string, the
 * experiments' one door (MINFER_CUDA_TUNE, read by the runtime, passed in
 * mf_cuda_options.tune), e.g. "gemv=v3,attn_decode=split,pdl=0". Each key
 * is listed with its values by mf_cuda_tune_help; docs/ENV.md has the table
 * and docs/PERF.md the measurement behind each default.
 *
 * The selector functions (mf_cuda_sel_*) are pure: the tuning plus the
 * shape of one node in, an enum out. Pure C (no CUDA headers), so the parser
 * and the selectors are unit-tested on machines without a GPU. */
#ifndef MF_CUDA_TUNE_H
#define MF_CUDA_TUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

/* Which matmul family a node of nt tokens takes (mf_cuda_sel_matmul). */
typedef enum {
    MF_CU_MM_GEMV_F32 = 0, /* f32-activation GEMV (the reference tier, nt <= 8) */
    MF_CU_MM_GEMV_Q8,      /* int8-activation dp4a GEMV (nt <= 8): the default for decode */
    MF_CU_MM_SIMT,         /* f32 SIMT GEMM */
    MF_CU_MM_WMMA,         /* f16 wmma tensor-core GEMM */
    MF_CU_MM_MMA,          /* dequant to f16 + cp.async / ldmatrix / mma.sync GEMM */
} mf_cu_mm_kind;

/* Which int8 GEMV generation (mf_cuda_sel_gemv). */
typedef enum {
    MF_CU_GEMV_V1 = 0, /* warp per row, any nt <= 8 */
    MF_CU_GEMV_V3,     /* the block-tiled kernel for nt 2..8 */
    MF_CU_GEMV_V4,     /* the one-token slice kernel (gemv_q8v4.cu) */
} mf_cu_gemv_kind;

/* Decode attention (nt <= 8) (mf_cuda_sel_attn_decode). */
typedef enum {
    MF_CU_AD_BLOCK = 0, /* one block per (token, query head) */
    MF_CU_AD_SPLIT,     /* split-KV flash decode + combine kernel */
    MF_CU_AD_ONE,       /* split-KV, the last block of a group combines (one kernel) */
    MF_CU_AD_SHORT,     /* short-context kernel (attn_short.cu), 12 warps a block */
} mf_cu_ad_kind;

/* Prefill attention (nt > 8) (mf_cuda_sel_attn_prefill). */
typedef enum {
    MF_CU_AP_SIMT = 0, /* one block per (token, head) */
    MF_CU_AP_FLASH,    /* query-tiled online softmax, SIMT */
    MF_CU_AP_MMA,      /* tensor-core flash (attn_prefill_mma.cu) */
} mf_cu_ap_kind;

/* Tests: a forced matmul family instead of the rule (tune key "force"). */
typedef enum {
    MF_CU_FORCE_NONE = 0,
    MF_CU_FORCE_SIMT = 1,
    MF_CU_FORCE_WMMA = 2,
    MF_CU_FORCE_MMA = 3,
    MF_CU_FORCE_GEMV_F32 = -1,
    MF_CU_FORCE_GEMV_Q8 = -2,
} mf_cu_force;

typedef struct mf_cuda_tune {
    /* the device, read at start (cudaGetDeviceProperties) */
    int cc;                /* compute capability, 10 * major + minor */
    int sm_count;          /* multiprocessors */
    size_t smem_per_block; /* bytes of shared memory a block may use */

    /* matmul */
    int force;          /* mf_cu_force (tests) */
    int mm_prefill;     /* mf_cu_mm_kind for nt > 8: MMA (default), WMMA or SIMT */
    int mma_min_nt;     /* the mma tier from this many tokens (default 64) */
    int paged_mma_min_nt; /* ... in a paged forward (many sequences; default 9) */
    int mma_fuse;       /* prefill QKV / gate+up as one mma GEMM each */
    int mma_split;      /* split-K for grids under half a wave */
    uint64_t mma_chunk; /* f16 weight bytes per dequant + GEMM chunk (0: 320 MiB; tests shrink it) */
    int gemv_q8;        /* decode GEMVs on int8 activations (0: the f32 reference tier) */
    int gemv;           /* -1 the measured rule; MF_CU_GEMV_V1 / V3: that generation everywhere */
    int v4;             /* one-token v4 GEMV: -1 its rule, 1 / 2 slices in flight everywhere, 0 off */
    int v4_q6k;         /* Q6_K on the v4 slice decoder: -1 rule (2 slices for small wide-row weights) */
    int v4_big_mib;     /* Q4_K weights from this size take 2 slices in flight */
    int v4_early;       /* early-load instances: -1 rule (launches <= 4 MiB), 0 never, 1 always */
    int v4_pf;          /* L2 prefetch before the PDL wait: -1 rule, 0 none, 1 first batch, 2 first group */
    int qkv_mix;        /* a QKV whose V type differs as one v4 launch */
    int ffn_q8b;        /* the SwiGLU GEMV also writes the down GEMV's int8 input */
    int fuse_gemv;      /* QKV / gate+up as one int8 GEMV launch (measured no gain: off) */

    /* attention */
    int attn_prefill;     /* mf_cu_ap_kind */
    int attn_decode;      /* mf_cu_ad_kind: the kernel while the context is short */
    int64_t attn_one_max; /* ONE / SHORT only while n_past + nt <= this (then SPLIT) */
    int short_rope;       /* one-token rope-store folded into the short attention */
    int attn_pf;          /* short attention prefetches old K/V rows before its PDL wait */
    int short_w4;         /* the short attention with 4 warps a block instead of 12 */

    /* launches and copies */
    int pdl;   /* programmatic dependent launch */
    int zc;    /* the one-token lm_head stores the logits into the host block itself */
    int slots; /* a recorded forward's small inputs through pinned slots, one copy kernel */
    int repeat; /* a replayed forward takes its calls from the recorded build */

    /* fusions the backend plans over a split (off together with mf_cuda_options.fuse) */
    int fuse_rope; /* FUSED_QKV's rope + K/V store as one kernel */
    int fuse_add;  /* MATMUL + the residual ADD as one GEMV */
    int fuse_norm; /* RMSNORM folded into the next fused node's quantization */
    int norm_mm;   /* ... and into a plain MATMUL's (the output norm -> lm_head) */
} mf_cuda_tune;

/* The defaults for a device of compute capability cc (10 * major + minor)
 * with sm_count SMs and smem_per_block bytes of shared memory a block. */
void mf_cuda_tune_defaults(mf_cuda_tune *t, int cc, int sm_count, size_t smem_per_block);

/* Applies "key=value[,key=value...]" on top of *t (NULL or "" changes
 * nothing). On an unknown key or a bad value returns -1 with err naming the
 * key, the value and what it accepts; *t is then unchanged. */
int mf_cuda_tune_parse(mf_cuda_tune *t, const char *s, mf_error *err);

/* One line per key: "key=values  meaning" (for docs and --help). */
const char *mf_cuda_tune_help(void);

/* The backend-side fusions off (mf_cuda_options.fuse false). */
void mf_cuda_tune_no_fusions(mf_cuda_tune *t);

/* ---- selectors (pure) ---- */

/* The matmul family for nt tokens of a weight whose int8 GEMV exists
 * (q8_ok: type and n_in have an int8 decoder). */
mf_cu_mm_kind mf_cuda_sel_matmul(const mf_cuda_tune *t, int64_t nt, bool q8_ok);

/* Decode attention at context n_ctx (n_past + nt) when the short kernel
 * fits the shape (short_ok). */
mf_cu_ad_kind mf_cuda_sel_attn_decode(const mf_cuda_tune *t, int64_t n_ctx, bool short_ok);


#endif
