/* kernels.h - CPU math kernels, free of any graph or backend notion.
 *
 * The CPU backend (cpu_backend.c) maps graph nodes onto these. Matmuls quantize
 * the activations once per call to the weight type's activation format (Q8_0
 * for the 32-blocks, Q8_K for K-quants, F32/F16 for float weights) so the inner
 * loop is an integer dot product; each dot product has a portable scalar
 * version and per-ISA versions chosen at run time (cpuid), and the scalar twin
 * stays callable for tests. Rows of the weight are split across the pool. */
#ifndef MF_CPU_KERNELS_H
#define MF_CPU_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "quant/quant.h"

typedef enum mf_cpu_isa {
    MF_ISA_SCALAR = 0,
    MF_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    MF_ISA_AVX512 = 2, /* F/BW/VL/VNNI */
    MF_ISA_NEON = 3,   /* ARMv8.2 dotprod */
    MF_ISA_COUNT
} mf_cpu_isa;

/* The best ISA this CPU runs, lowered by the cap. */
mf_cpu_isa mf_cpu_isa_best(void);
/* Caps the ISA at the one named (scalar|avx2|avx512|neon: the options'
 * cpu_isa, MINFER_CPU_ISA); NULL or "": no cap; an unknown name warns and
 * leaves no cap. Never raises it past what the hardware runs. */
void mf_cpu_isa_set_cap(const char *name);
const char *mf_cpu_isa_name(mf_cpu_isa isa);

/* s = dot(weight row of wtype, activation row of act_type), n elements. */
typedef void (*mf_vec_dot_fn)(int64_t n, float *s, const void *w, const void *a);

typedef struct mf_cpu_dot {
    uint32_t act_type;   /* MF_TYPE_Q8_0, MF_TYPE_Q8_K, MF_TYPE_F32 ... */
    mf_vec_dot_fn dot;
} mf_cpu_dot;

/* The dot kernel for weight type wtype on isa (falls back to the best lower ISA
 * that has one, ending at scalar); NULL when wtype is not a weight type. */
const mf_cpu_dot *mf_cpu_dot_get(uint32_t wtype, mf_cpu_isa isa);
/* Quantizes n floats to act_type (a row for the dot kernels). */
void mf_cpu_quantize_act(uint32_t act_type, const float *x, void *y, int64_t n, mf_cpu_isa isa);

/* ---- the CPU context: thread pool + scratch --------------------------------------- */

/* One caller thread at a time per context (the pool and the scratch are shared
 * by its calls); separate contexts are independent. */
typedef struct mf_cpu_ctx mf_cpu_ctx;

mf_cpu_ctx *mf_cpu_ctx_new(int n_threads); /* <= 0: all cores */
void mf_cpu_ctx_free(mf_cpu_ctx *c);
int mf_cpu_ctx_threads(const mf_cpu_ctx *c);
mf_pool *mf_cpu_ctx_pool(mf_cpu_ctx *c);
void mf_cpu_ctx_set_isa(mf_cpu_ctx *c, mf_cpu_isa isa); /* tests: force the scalar twin */
mf_cpu_isa mf_cpu_ctx_isa(const mf_cpu_ctx *c);

/* y[t, o] = sum_i W[o, i] x[t, i]: W has n_out rows of n_in elements of wtype,
 * x is nt rows of n_in floats, y nt rows of n_out floats (y may not alias x). */
void mf_cpu_matmul(mf_cpu_ctx *c, uint32_t wtype, const void *w, int64_t n_in, int64_t n_out,
                   const float *x, int64_t nt, float *y);

/* Several matmuls over the same input in one parallel region (fused QKV,
 * gate|up): the activations are quantized once per distinct act_type. */
typedef struct mf_cpu_mm {
    uint32_t wtype;
    const void *w;
    int64_t n_out;
    float *y;            /* nt rows of n_out */
} mf_cpu_mm;
void mf_cpu_matmul_multi(mf_cpu_ctx *c, const mf_cpu_mm *mm, int n_mm, int64_t n_in,
                         const float *x, int64_t nt);

/* ---- elementwise and row ops (in place allowed: y may equal x) ------------------- */

/* nrows rows of n: y = x / sqrt(mean(x^2) + eps) * w (w NULL: no weight); the
 * mean of squares is accumulated in double. c NULL: runs on the calling thread. */
void mf_cpu_rmsnorm(mf_cpu_ctx *c, const float *x, const float *w, float *y, int64_t n,
                    int64_t nrows, float eps);
/* nt rows of n_head heads of head_dim, rotated at positions pos[t] (c may be
 * NULL; the rotation runs on the calling thread); mode takes
 * the mf_rope_mode values (0 NORMAL: pairs (2i, 2i+1); 2 NEOX: (i, i + n_rot/2)). */
void mf_cpu_rope(mf_cpu_ctx *c, float *x, int64_t nt, int32_t n_head, int32_t head_dim,
                 int32_t n_rot, const int32_t *pos, int32_t mode, float theta, float freq_scale);
void mf_cpu_add(const float *a, const float *b, float *y, int64_t n);
void mf_cpu_mul(const float *a, const float *b, float *y, int64_t n);
void mf_cpu_scale(const float *a, float s, float *y, int64_t n);
void mf_cpu_silu(const float *a, float *y, int64_t n);
void mf_cpu_swiglu(const float *gate, const float *up, float *y, int64_t n);
/* mf_cpu_swiglu split across c's pool when n is large (same bits; c NULL or
 * small n: the calling thread). */
void mf_cpu_swiglu_mt(mf_cpu_ctx *c, const float *gate, const float *up, float *y, int64_t n);
void mf_cpu_softmax(float *x, int64_t n, float scale); /* one row, in place */

/* ---- KV cache and attention -------------------------------------------------------- */

/* Writes nt rows of kv_dim floats at rows [pos0, pos0 + nt) of a cache region
 * of kv_type (mf_kv_type_ok: f32, f16, or a 32-element block type q8_0 /
 * q4_0 / q4_1 / q5_0 / q5_1, then kv_dim % 32 == 0). */
void mf_cpu_kv_store(uint32_t kv_type, void *cache, int64_t kv_dim, int64_t pos0,
                     const float *src, int64_t nt);
/* Reads rows [0, n) of a cache region as floats. */
void mf_cpu_kv_load(uint32_t kv_type, const void *cache, int64_t kv_dim, int64_t n, float *dst);
/* Elements [e0, e0 + len) of row r as floats (block types: e0 and len whole blocks). */
void mf_cpu_kv_slice(uint32_t kv_type, const void *cache, int64_t kv_dim, int64_t r, int64_t e0,
                     int64_t len, float *dst);

/* Causal GQA attention: token t of the batch sits at position n_past + t and
 * attends to cache rows [0, n_past + t]. q and out are nt rows of
 * n_head * head_dim; head h reads KV head h / (n_head / n_head_kv). */
void mf_cpu_attn(mf_cpu_ctx *c, const float *q, int64_t nt, int32_t n_head, int32_t n_head_kv,
                 int32_t head_dim, const void *k_cache, const void *v_cache, uint32_t k_type,
                 uint32_t v_type, int64_t n_past, float scale, bool unfused, float *out);

/* Attention without the fused kernel (-fa off): token t reads rows
 * [0, tn[t]) of K at tk[t] / V at tv[t]. Consecutive tokens with the same
 * K/V form a run; per (run, KV head) the K and V slices are dequantized,
 * the score matrix (run tokens x query heads of the group, n_kv columns,
 * masked past each token's tn) is computed, softmaxed row by row, then
 * multiplied by V. f32 throughout; independent of the thread count. */
void mf_cpu_attn_unfused(mf_cpu_ctx *c, const float *q, int64_t nt, int32_t n_head, int32_t n_head_kv,
                         int32_t head_dim, const void *const *tk, const void *const *tv, const int64_t *tn,
                         uint32_t k_type, uint32_t v_type, float scale, float *out);

/* The sequences of a paged forward (backend.h's mf_kv_batch, as the kernels
 * see it): token t of sequence seq[t] at position pos[t]; sequence s's
 * position p is KV row tables[s][p / block_size] * block_size + p % block_size. */
typedef struct mf_cpu_paged {
    const int32_t *seq, *pos;
    int32_t n_seqs;
    const int32_t *const *tables;
    int32_t block_size;
} mf_cpu_paged;

/* Stores each token's K/V row (k_new, v_new: nt rows of kv_dim) at its slot,
 * then attention as mf_cpu_attn per token over its own sequence's positions
 * [0, pos[t]]. A token's result is bitwise the one it gets in any other
 * batch (the same per-(token, head) work on the same row values). */
void mf_cpu_attn_paged(mf_cpu_ctx *c, const mf_cpu_paged *pg, const float *q, const float *k_new,
                       const float *v_new, int64_t nt, int32_t n_head, int32_t n_head_kv,
                       int32_t head_dim, void *k_cache, void *v_cache, uint32_t k_type,
                       uint32_t v_type, float scale, bool unfused, float *out);

#endif
