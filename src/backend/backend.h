/* backend.h - the backend contract (DESIGN.md §3, seed §2.1).
 *
 * A backend is an executor: it owns a pool of buffers and knows how to run
 * graph ops on one piece of hardware. Every backend (cpu, ref, cuda, metal)
 * implements mf_backend_ops and includes this header, so signature drift is a
 * compile error.
 *
 * Rules:
 *  - Buffers are int32 ids into the backend's own pool, never raw pointers
 *    across the seam. An output id may equal an input id (liveness reuse):
 *    every op must work in place.
 *  - supports_op / supports_fused are asked at build time; a refusal is not an
 *    error, it makes a split. execute_node on a node supports_op refused, a
 *    missing weight or bad metadata is an error naming the node and numbers —
 *    never a silent fallback.
 *  - execute_node encodes/launches and may return before the work is done;
 *    synchronize is the (bounded) wait, called at every split end.
 *  - alloc_fresh buffers are never handed out again by alloc_buffer until
 *    freed (split-boundary staging). */
#ifndef MF_BACKEND_H
#define MF_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "ir/graph.h"

typedef struct mf_backend mf_backend;

typedef enum mf_fused_kind {
    MF_FUSE_QKV,          /* FUSED_QKV */
    MF_FUSE_QKV_NORM,     /* FUSED_QKV_NORM */
    MF_FUSE_FFN,          /* FUSED_FFN */
    MF_FUSE_QKV_EPILOGUE, /* QKV_BIAS_ROPE_STORE */
    MF_FUSE_SWIGLU,       /* fusion pass: SILU + MUL -> SWIGLU */
    MF_FUSE_COUNT
} mf_fused_kind;

/* A layer's two persistent KV regions (ids in the executing backend's pool),
 * -1 for nodes outside attention. Layout of a region: n_ctx rows of kv_dim
 * elements of kv_type (f32, f16 or q8_0 blocks), row r = position r. */
typedef struct mf_kv_pair {
    int32_t k, v;
} mf_kv_pair;

/* Per-forward values that do not change the graph (so a cached graph stays
 * valid): where this batch starts in the KV cache, and a hint.
 * The hint: right after this forward the engine reads out_bytes from offset
 * 0 of node out_node's buffer into out_host (read_host); out_host NULL when
 * it will not (no logits wanted, another kind of read). A backend may fill
 * out_host early (CUDA: the lm_head writes the logits there itself,
 * MINFER_CUDA_LOGITS_ZC, or copies its rows while later rows are computed,
 * MINFER_CUDA_LOGITS_CHUNKS) but must still honor any read_host as the
 * contract says; backends that do not care ignore the hint. */
typedef struct mf_exec_args {
    int32_t n_past;   /* position of the first token of the batch */
    int32_t n_tokens; /* tokens in the batch (== graph params n_tokens) */
    int32_t n_ctx;
    uint32_t kv_type;
    void *out_host;    /* the hint (above); NULL: none */
    int32_t out_node;  /* the output node (valid with out_host) */
    size_t out_bytes;  /* bytes the engine reads from offset 0 */
} mf_exec_args;

typedef struct mf_backend_ops {
    const char *(*name)(const mf_backend *b);
    bool (*supports_op)(const mf_backend *b, const mf_node *node);
    bool (*supports_fused)(const mf_backend *b, mf_fused_kind kind);

    /* Buffer pool (sizes in bytes). alloc_buffer may recycle a freed buffer of
     * the same size; alloc_fresh never does. Return the id or -1 (err set). */
    int32_t (*alloc_buffer)(mf_backend *b, size_t nbytes, mf_error *err);
    void (*free_buffer)(mf_backend *b, int32_t id);
    int32_t (*alloc_fresh)(mf_backend *b, size_t nbytes, mf_error *err);

    /* Runs node `node` of g: in_ids[i] holds src i (already on this backend),
     * out_id receives the output, kv the node's layer regions. */
    int (*execute_node)(mf_backend *b, const mf_graph *g, int32_t node, const int32_t *in_ids,
                        int32_t out_id, mf_kv_pair kv, const mf_exec_args *args, mf_error *err);

    /* Host access at split boundaries; only after synchronize for outputs. */
    int (*read_host)(mf_backend *b, int32_t id, size_t offset, void *dst, size_t nbytes,
                     mf_error *err);
    int (*write_host)(mf_backend *b, int32_t id, size_t offset, const void *src, size_t nbytes,
                      mf_error *err);
    int (*synchronize)(mf_backend *b, mf_error *err);

    /* Optional (NULL allowed). has_weight: for the all-weights-registered gate;
     * NULL means the backend reads every weight from the mapping. */
    bool (*has_weight)(const mf_backend *b, const char *name);
    /* Optional hooks around one forward (CUDA graph capture/replay). */
    int (*begin_forward)(mf_backend *b, const mf_graph *g, const mf_exec_args *args, mf_error *err);
    int (*end_forward)(mf_backend *b, const mf_graph *g, const mf_exec_args *args, mf_error *err);
    /* Optional, between begin_forward (and the inputs) and end_forward of a
     * forward that is one split on this backend: stands for all its
     * execute_node calls when the backend has seen them in an earlier
     * forward of the same graph build (g->stamp), which the engine makes in
     * the same order with the same node, buffer and KV ids in every forward
     * of one build. Returns 1 when it took them (the engine then makes
     * none), 0 when it cannot (the engine makes them), -1 on error. */
    int (*repeat_calls)(mf_backend *b, const mf_graph *g, const mf_exec_args *args, mf_error *err);

    /* Optional: host memory the backend copies outputs into fastest (CUDA:
     * pinned, so read_host into it is one DMA and no staging copy). NULL
     * when it has none to give; the caller then uses the C heap. host_free
     * takes only what host_alloc returned. */
    void *(*host_alloc)(mf_backend *b, size_t nbytes);
    void (*host_free)(mf_backend *b, void *p);
    /* true: read_host itself waits for everything launched before it, so the
     * engine may read an output without a synchronize first (saves a round
     * trip per decode step). */
    bool read_host_waits;

    void (*free)(mf_backend *b);
} mf_backend_ops;

typedef enum mf_backend_kind {
    MF_BACKEND_CPU,
    MF_BACKEND_REF,
    MF_BACKEND_CUDA,
    MF_BACKEND_METAL,
} mf_backend_kind;

struct mf_backend {
    const mf_backend_ops *ops;
    mf_backend_kind kind;
    bool is_gpu;
    void *ctx;
    int32_t extra_refs; /* holders beyond the first (mf_backend_retain) */
};

/* Constructors. The weight table must outlive the backend. */
int mf_backend_cpu_new(const mf_weights *w, int n_threads, mf_backend **out, mf_error *err);
int mf_backend_ref_new(const mf_weights *w, mf_backend **out, mf_error *err);
/* A GPU backend holds the uploaded weights, so the model keeps one and every
 * session's engine shares it: retain adds a holder, free drops one and frees
 * the backend when the last holder lets go. */
void mf_backend_retain(mf_backend *b);
void mf_backend_free(mf_backend *b);

#endif
