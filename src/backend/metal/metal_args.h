/* metal_args.h - the argument structs shared by the host (C) and the kernels
 * (MSL): one struct per kernel family, passed with setBytes as
 * `constant mf_mtl_<op>_args &a [[buffer(n)]]`.
 *
 * Fixed-width fields only, ordered so that no padding is needed: 64-bit
 * fields first, then 32-bit. The C side checks every size with
 * _Static_assert, so a field added on one side only is a compile error on the
 * host and a "constant argument larger than the bytes bound" fault in the
 * emulator. */
#ifndef MF_METAL_ARGS_H
#define MF_METAL_ARGS_H

#ifdef __METAL_VERSION__
#include <metal_stdlib>
#else
#include <stdint.h>
#endif

/* Elementwise and copies over n elements (ADD, MUL, SCALE, SILU, SWIGLU,
 * COPY). MUL broadcasts src1 when n1 < n (index i % n1). */
typedef struct mf_mtl_ew_args {
    int64_t n;
    int64_t n1;
    float s;
    uint32_t pad0;
} mf_mtl_ew_args;

/* A strided 2-D copy: rows of `width` floats, dst row r at r * dst_stride,
 * src row r at src_off + r * src_stride (VIEW, row select, copy_in). */
typedef struct mf_mtl_copy_args {
    int64_t rows;
    int64_t width;
    int64_t src_stride;
    int64_t dst_stride;
    int64_t src_off;
} mf_mtl_copy_args;

/* PERMUTE: output axis d walks the source with stride st[d]. */
typedef struct mf_mtl_permute_args {
    int64_t ne[4];
    int64_t st[4];
} mf_mtl_permute_args;

/* RMSNORM / QKNORM: rows of width w; has_w: a weight of w floats. */
typedef struct mf_mtl_norm_args {
    int64_t rows;
    int32_t w;
    float eps;
    int32_t has_w;
    uint32_t pad0;
} mf_mtl_norm_args;

/* ROPE on nt tokens of n_head heads (row stride = n_head * head_dim).
 * inv_ln_theta_2 = -2 ln(theta) / n_rot: pair i turns by
 * pos * freq_scale * exp(i * inv_ln_theta_2). */
typedef struct mf_mtl_rope_args {
    int32_t nt;
    int32_t n_head;
    int32_t head_dim;
    int32_t n_rot;
    int32_t neox;
    float freq_scale;
    float log_theta_step;
    uint32_t pad0;
} mf_mtl_rope_args;

/* GETROWS mode 0: rows of width d from a weight of n_rows rows of row_bytes
 * bytes each, at ids (int32). Out-of-range ids write zeros and set *bad. */
typedef struct mf_mtl_getrows_args {
    int64_t row_bytes;
    int64_t n_rows;
    int32_t d;
    int32_t nt;
} mf_mtl_getrows_args;

/* MATMUL: y[t * n_out + o] = sum_k W[o, k] x[t * k_in + k] (+ bias[o] when
 * has_bias). W rows are row_bytes apart; k_in is a multiple of 32. */
typedef struct mf_mtl_mm_args {
    int64_t row_bytes;
    int32_t n_in;
    int32_t n_out;
    int32_t nt;
    int32_t has_bias;
} mf_mtl_mm_args;

/* The fused decode GEMVs: up to three weights of one type and one K, rows
 * n0, n1, n2 (FFN: n0 = n1, gate and up); bit j of has_bias: weight j has a
 * bias of its rows. */
typedef struct mf_mtl_mm3_args {
    int64_t row_bytes;
    int32_t n_in;
    int32_t n0;
    int32_t n1;
    int32_t n2;
    int32_t nt;
    int32_t has_bias;
} mf_mtl_mm3_args;

/* KV store / load: rows of kv_dim elements, row_bytes apart in the cache;
 * store writes src rows t at cache rows pos0 + t. */
typedef struct mf_mtl_kv_args {
    int64_t row_bytes;
    int32_t kv_dim;
    int32_t pos0;
    int32_t nt;
    uint32_t pad0;
} mf_mtl_kv_args;

/* ATTN: nt query rows of n_head heads at positions n_past + t over the
 * layer's cache (row_bytes apart, kv_dim = n_head_kv * head_dim). The KV
 * range [0, n_past + t] of each query is cut into chunks of `chunk`
 * positions; pass 1 writes per (token, head, chunk) partials (max, sum,
 * head_dim accumulators), pass 2 combines them. */
typedef struct mf_mtl_attn_args {
    int64_t row_bytes;
    int32_t nt;
    int32_t n_past;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t chunk;
    int32_t n_chunks;
    float scale;
} mf_mtl_attn_args;

/* ATTN_PAGED (paged.metal): nt tokens of n_head heads, each over its own
 * sequence's positions [0, pos] in a pool of block_size-row blocks (rows
 * row_bytes apart, kv_dim = n_head_kv * head_dim); the batch buffer's layout
 * is paged.metal's (n_seqs sequences). */
typedef struct mf_mtl_paged_args {
    int64_t row_bytes;
    int32_t nt;
    int32_t n_seqs;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t kv_dim;
    int32_t block_size;
    float scale;
} mf_mtl_paged_args;

#ifndef __METAL_VERSION__
_Static_assert(sizeof(mf_mtl_ew_args) == 24, "ew args");
_Static_assert(sizeof(mf_mtl_copy_args) == 40, "copy args");
_Static_assert(sizeof(mf_mtl_permute_args) == 64, "permute args");
_Static_assert(sizeof(mf_mtl_norm_args) == 24, "norm args");
_Static_assert(sizeof(mf_mtl_rope_args) == 32, "rope args");
_Static_assert(sizeof(mf_mtl_getrows_args) == 24, "getrows args");
_Static_assert(sizeof(mf_mtl_mm_args) == 24, "mm args");
_Static_assert(sizeof(mf_mtl_mm3_args) == 32, "mm3 args");
_Static_assert(sizeof(mf_mtl_kv_args) == 24, "kv args");
_Static_assert(sizeof(mf_mtl_attn_args) == 40, "attn args");
_Static_assert(sizeof(mf_mtl_paged_args) == 40, "paged args");
#endif

#endif
