/* paged.h - the paged-attention kernels (attn_paged.cu) as the executor of
 * ATTN_PAGED (cuda_op_paged.c) calls them: many sequences in one forward,
 * each token's K/V stored into its sequence's block-paged slot, then causal
 * GQA attention of each token over its own sequence's blocks.
 *
 * The forward's batch lives in one device int32 buffer, uploaded once per
 * forward (cuda_op_paged.c builds it):
 *   tok     5 x nt, field-major: seq, pos, partial row (-1: none), splits,
 *           split stride (partial row of split k = row + k * stride)
 *   seq_off per sequence: where its block ids start in blocks
 *   blocks  the block ids covering each batch sequence's positions
 *   items   MF_CU_PAGED_ITEM ints each: first token, tokens, kv0, kv1 (the
 *           KV positions [kv0, kv1) it reads), partial row of its first
 *           token (-1: it writes the final output)
 * A work item is a run of consecutive tokens of one sequence (a tile of at
 * most MF_CU_PAGED_ROWS / gqa tokens) and one KV range; the kernel runs one
 * block per (item, KV head), every query head of that KV group in the
 * block, so each K/V row is read once per tile. Items of a split tile write
 * (max, sum, unnormalized output) partials that a combine kernel merges. */
#ifndef MF_CUDA_PAGED_H
#define MF_CUDA_PAGED_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MF_CU_PAGED_ROWS 32 /* query rows (token x head of one KV group) of a work item */
#define MF_CU_PAGED_CHUNK 32 /* KV positions per shared-memory chunk */
#define MF_CU_PAGED_ITEM 5  /* ints per work item */

typedef struct mf_cu_paged_args {
    const float *q;            /* nt rows of n_head * head_dim */
    const float *k_new, *v_new; /* nt rows of kv_dim: stored first */
    float *out;                /* like q; may equal q */
    void *k, *v;               /* the layer's pool regions (rows of kv_type) */
    uint32_t kv_type;          /* MF_TYPE_F32, F16 or Q8_0 */
    int32_t nt, n_head, n_head_kv, head_dim, block_size;
    float scale;
    const int32_t *tok, *seq_off, *blocks, *items; /* the batch buffer (above) */
    int32_t n_items;
    float *part;               /* partial rows x n_head x (head_dim + 2); NULL when no item splits */
} mf_cu_paged_args;

/* Whether the kernels take head_dim and n_head / n_head_kv (gqa). */
int mf_cu_attn_paged_ok(int32_t head_dim, int32_t gqa);
/* Store, attention, and (part set) the combine, enqueued on s. */
cudaError_t mf_cu_attn_paged(const mf_cu_paged_args *a, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
