/* cuda_ctx.h - the CUDA backend's private state and the functions its
 * files share (cuda_backend.c: lifetime, creation and the test entry
 * points; cuda_device.c: errors, the launch ring, bounded waits, the buffer
 * pool, host copies and pinned memory, the device; cuda_weights.c: the
 * upload and the capability checks; cuda_matmul.c: the exec helpers and the
 * matmul / GEMV paths; cuda_exec.c: the per-node dispatch and the fusions
 * planned over a split; cuda_graph.c: CUDA graph record / replay). Nothing
 * here is part of the backend's interface (cuda_backend.h). */
#ifndef MF_CUDA_CTX_H
#define MF_CUDA_CTX_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_args.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_tune.h"
#include "quant/quant.h"

/* The backend's paths take the forward's values plus the read-back hint
 * (cuda_backend.h); the adapter in cuda_backend.c builds them. */
#define mf_exec_args mf_cuda_args

#define TRACE_N 16
#define N_SCRATCH 9
#define PIN_BYTES ((size_t)64 << 20)
#define PINNED_N 8                          /* host_alloc blocks at once */
#define PINNED_MAX ((size_t)256 << 20)      /* larger ones come from the C heap */
#define WEIGHT_ALIGN 256
#define NO_WEIGHT UINT64_MAX
#define N_GENTRY 4        /* forwards (graph identities) kept captured */
#define GRAPH_MAX_T 8     /* forwards of at most this many tokens are captured */
#define FRUITLESS_MAX 8   /* captures without a replay before graphs turn off */
#define Q8_SLOT 3         /* scratch slot of the int8 GEMV activations */
#define WF16_SLOT 4       /* prefill GEMM: a weight dequantized to f16 */
#define XF16_SLOT 5       /* prefill GEMM: the activations as f16 */
#define ATTN_SLOT 6       /* split-KV decode attention: per-split partial results */
#define Q8OUT_SLOT 7      /* an int8 activation a kernel writes as a by-product (q8_produced) while
                             it reads its own input from Q8_SLOT (the attention) */
/* Zeroed int32 counters for a kernel whose last block to finish a piece of
 * work does the step that needs all of it (the one-kernel split-KV decode's
 * combine). The kernel leaves every counter it touched at 0 again, so the
 * next launch and graph replays find zeros. */
#define CNT_MAX 65536
/* tune slots: a recorded forward's small inputs (token ids,
 * positions, n_past) wait in fixed pinned slots and are copied by the
 * forward's own first launches, inside its CUDA graph */
#define SLOT_MAX_W 256 /* bytes of one write that may wait in a slot (MF_CU_SLOT_N writes, MF_CU_SLOT_BYTES) */

typedef struct cu_buf {
    void *p;
    size_t size;
    bool free;
} cu_buf;

/* One deferred execute_node call of a recorded forward. */
typedef struct cu_call {
    int32_t node, out;
    int32_t in[MF_MAX_SRC];
    mf_kv_pair kv;
} cu_call;

/* One input write waiting in the slots: n bytes at slot offset off, for
 * device address dst. */
typedef struct cu_slotw {
    void *dst;
    uint32_t off, n;
} cu_slotw;

/* A forward seen before: the graph's nodes, the calls, the shapes and the
 * scratch pointers they launched with; exec once captured. */
typedef struct cu_gentry {
    const mf_graph *g;
    uint64_t stamp; /* g->stamp when recorded: equal stamps mean equal nodes (no memcmp) */
    mf_node *nodes;
    int32_t n_nodes;
    int64_t kv_dim;
    cu_call *calls;
    int32_t n_calls;
    int32_t n_tokens, n_ctx;
    uint32_t kv_type;
    void *scr[N_SCRATCH];
    cudaGraphExec_t exec;
    bool no_capture; /* a capture failed: run this one plainly */
    bool attn_one;   /* captured with the one-kernel decode attention (attn_one_now) */
    int32_t attn_short; /* ... and with tune attn_decode=short as it was (tests flip it) */
    int32_t short_rope; /* ... and tune short_rope (cu_ctx.short_rope; tests flip it) */
    void *out_host;     /* the forward's out_host hint while the ZC lm_head is on (head_key; else
                           NULL): the graph may write into it, so entries are found by (g, out_host) */
    int32_t d2h_id;     /* the early logits copy the graph makes (d2h_bytes 0: none; cu_ctx.d2h_*) */
    size_t d2h_bytes;
    bool d2h_zc;        /* ... made by the lm_head GEMV itself (tune zc) */
    int32_t zc;         /* captured with tune zc as it was (cu_ctx.logits_zc; tests flip it) */
    cu_slotw slotw[MF_CU_SLOT_N]; /* the input copies the graph makes from the slots (cu_ctx.slotw) */
    int32_t n_slotw;
    uint64_t used;
} cu_gentry;

typedef struct cu_trace {
    int32_t node;
    char name[MF_NODE_NAME];
    const char *op;
    const char *kernel;
    int64_t d0, d1; /* the launch's leading extents (rows, tokens ...) */
} cu_trace;

/* marks of one replayed forward (cu_host_times.t) */
enum { HT_BEGIN, HT_REC0, HT_MATCH, HT_LAUNCH0, HT_LAUNCH1, HT_SYNC0, HT_SYNC1, HT_READ0, HT_READ1, HT_READ2,
       HT_N };

typedef struct cu_host_times {
    bool on, live;
    cudaEvent_t ev[2];
    uint64_t t[HT_N];
    double sum[HT_N + 3];
    int64_t n;
} cu_host_times;

typedef struct cu_paged cu_paged; /* ATTN_PAGED's batch upload (cuda_op_paged.c) */

typedef struct cu_ctx {
    const mf_weights *w;
    int device;
    char desc[160];
    size_t smem_per_block;
    cudaStream_t stream;

    cu_buf *bufs;
    int32_t n_bufs, cap_bufs;

    uint8_t *wmem;          /* every uploaded weight, WEIGHT_ALIGN-aligned */
    int64_t n_w;            /* weights in the table at construction */
    uint64_t *woff;         /* per weight index: offset in wmem or NO_WEIGHT */
    uint64_t wbytes;

    uint8_t *pin;           /* pinned staging for host copies */
    size_t pin_used;
    /* tune slots (default 1): while a forward is recorded, its
     * small write_host calls (and the n_past upload) only fill these pinned
     * slots; the copies out of them are the first launches of run_calls, so
     * a captured graph holds them and a replay costs no copy call at all.
     * slot_live: a launch that reads the slots is queued and the stream has
     * not been waited for since (the next forward's writes wait first). */
    uint8_t *slot;
    void *slot_dev;  /* the slots' device alias (mapped) */
    cu_slotw slotw[MF_CU_SLOT_N];
    int32_t n_slotw;
    uint32_t slot_used;
    bool slot_live;
    int64_t n_slot_w; /* writes that took a slot (mf_cuda_slot_count) */

    void *scr[N_SCRATCH];
    size_t scr_cap[N_SCRATCH];

    mf_cu_fault *fault;     /* mapped pinned memory the kernels write */
    int32_t *cnt;           /* CNT_MAX zeroed counters (counters()) */

    /* An int8 activation a kernel wrote as a by-product (q8_produced): q8_buf
     * (layout of mf_cu_q8_bytes) holds the quantization of q8_of (q8_n
     * inputs per token, q8_nt tokens), valid while n_launched == q8_stamp
     * (no launch since). */
    const float *q8_of;
    void *q8_buf;
    int64_t q8_n, q8_nt, q8_stamp;

    cu_trace ring[TRACE_N];
    int64_t n_launched;
    long timeout_ms;
    int trace;             /* mf_cuda_options.trace: every launch printed as it is made */
    mf_cuda_tune t;        /* every kernel choice (cuda_tune.h) */
    mf_cu_gemv_occ occ;    /* the int8 GEMVs' resident blocks per SM, measured at start */
    int64_t n_q8_ready; /* int8 GEMVs that read an input a kernel before wrote (q8_produced; tests) */
    const mf_graph *rs_g;
    int32_t rs_node;
    mf_cu_rope_store_args rs_args;
    int64_t n_short_rope; /* launches of that fold (mf_cuda_short_rope_count; a captured one counts once) */
    /* the copy the last forward already made (d2h_bytes 0: none): read_host
     * of exactly (d2h_id, offset 0, d2h_host, d2h_bytes) only waits */
    int32_t d2h_id;
    void *d2h_host;
    size_t d2h_bytes;
    int64_t n_d2h_chunked, n_d2h_early; /* mf_cuda_d2h_stats */
    bool d2h_zc;   /* the early bytes (d2h_*) are the ZC epilogue's */
    int64_t n_zc;  /* mf_cuda_zc_count */
    /* the deferred MATMUL of fuse_add or RMSNORM of fuse_norm (see exec_now);
     * pend_node < 0: none */
    const mf_graph *pend_g;
    int32_t pend_node, pend_in, pend_out;
    mf_exec_args pend_ea;

    /* CUDA graphs (see "forward hooks" below) */
    bool graphs_on;          /* MINFER_NO_CUDA_GRAPH=1 turns them off */
    bool recording;          /* inside begin/end_forward: execute_node defers */
    bool capturing;          /* launches go into a stream capture */
    const mf_graph *rec_g;
    mf_exec_args rec_a;
    cu_call *rec;
    int32_t n_rec, cap_rec;
    cu_gentry ge[N_GENTRY];
    uint64_t ge_clock;
    int32_t *dev_npast;      /* n_past of the forward, read by captured kernels */
    int32_t fruitless;       /* captures since the last replay */
    int64_t n_captures, n_replays;
    int64_t n_repeats;
    int64_t n_fused_add, n_fused_norm; /* launches of the two deferrals (mf_cuda_fuse_stats) */
    cu_paged *paged;         /* NULL until the first ATTN_PAGED */
    cu_host_times ht;        /* MINFER_CUDA_HOST_TIMES=1: where a replayed forward's wall time goes */
    struct {                 /* host_alloc's pinned blocks (read_host copies into them directly) */
        void *p;
        size_t n;
        void *dev;           /* its device alias once zc_alias asked for it (NULL: not yet) */
    } pinned[PINNED_N];
} cu_ctx;

#define CX(b) ((cu_ctx *)(b)->ctx)

/* Whether the decode GEMVs take the int8 tier (else f32 activations). */
static inline bool q8_tier(const cu_ctx *c) {
    return mf_cuda_sel_matmul(&c->t, 1, true) == MF_CU_MM_GEMV_Q8;
}

/* The int8 GEMV's launch choices (cuda_args.h) from the tuning and the
 * device numbers read at start. */
static inline mf_cu_gemv_tune gemv_tune(const cu_ctx *c) {
    return mf_cu_gemv_tune_of(&c->t, &c->occ);
}

/* ---- errors ------------------------------------------------------------------------ */

static inline int cu_err(mf_error *err, const char *call, cudaError_t e, const char *file, int line) {
    return mf_errorf(err, "cuda: %s failed: %s (%s) at %s:%d", call, cudaGetErrorName(e),
                     cudaGetErrorString(e), file, line);
}

#define CU_TRY(call)                                                     \
    do {                                                                 \
        cudaError_t e_ = (call);                                         \
        if (e_ != cudaSuccess)                                           \
            return cu_err(err, #call, e_, __FILE__, __LINE__);           \
    } while (0)

/* ---- execute: helpers ---------------------------------------------------------------------- */

typedef struct exec {
    cu_ctx *c;
    const mf_graph *g;
    const mf_node *n;
    int32_t id;
    mf_error *err;
    const int32_t *npast_dev; /* capturing: n_past lives here, not in launch arguments */
    /* tune fuse_norm: the node's input is RMSNorm(norm_x) (not launched) */
    bool norm;
    const float *norm_x, *norm_w;
    float norm_eps;
    /* the x this node last converted to f16 in XF16_SLOT for the mma tier
     * (the fused QKV / FFN matmuls share it); NULL: none */
    const float *xf16_of;
    int64_t xf16_n_in;
    /* tune ffn_q8b: this node's SwiGLU GEMV (run_multi) also writes
     * its output's int8 quantization where the kernel allows (q8_produced) */
    bool q8b;
    /* tune zc (run_head_zc): run_multi of one weight also
     * stores y into this device alias of host memory (NULL: no) */
    float *zc_host;
} exec;

#define NODE_ERR(x, fmt, ...)                                                                   \
    mf_errorf((x)->err, "cuda: node %d '%s' (%s): " fmt, (x)->id, (x)->n->name,                 \
              mf_op_name((x)->n->op), __VA_ARGS__)

/* One node's executor call (cuda_op_*.c; exec_node in cuda_exec.c
 * dispatches by op): the node's state, its buffers, its layer's KV pair,
 * the forward's arguments; may_defer: a fusion may hold the node back (not
 * when it is the deferred node being launched or a fold's consumer). */
typedef struct op_call {
    exec *x;
    const int32_t *in;
    int32_t out;
    mf_kv_pair kv;
    const mf_exec_args *ea;
    bool may_defer;
} op_call;

int mf_cub_op_add(const op_call *oc);     /* ADD, SWIGLU (cuda_op_ew.c) */
int mf_cub_op_mul(const op_call *oc);     /* MUL */
int mf_cub_op_unary(const op_call *oc);   /* SCALE, SILU */
int mf_cub_op_softmax(const op_call *oc); /* SOFTMAX */
int mf_cub_op_copy(const op_call *oc);    /* VIEW, PERMUTE */
int mf_cub_op_reshape(const op_call *oc); /* RESHAPE */
int mf_cub_op_norm(const op_call *oc);    /* RMSNORM, QKNORM (cuda_op_norm.c) */
int mf_cub_op_matmul(const op_call *oc);  /* MATMUL (cuda_op_mm.c) */
int mf_cub_op_getrows(const op_call *oc); /* GETROWS */
int mf_cub_op_ffn(const op_call *oc);     /* FUSED_FFN */
int mf_cub_op_rope(const op_call *oc);    /* ROPE (cuda_op_attn.c) */
int mf_cub_op_kv_store(const op_call *oc); /* KVCACHE_STORE */
int mf_cub_op_kv_load(const op_call *oc); /* KVCACHE_LOAD */
int mf_cub_op_attn(const op_call *oc);    /* ATTN */
int mf_cub_op_qkv(const op_call *oc);     /* FUSED_QKV, FUSED_QKV_NORM, QKV_BIAS_ROPE_STORE */
int mf_cub_op_attn_paged(const op_call *oc); /* ATTN_PAGED (cuda_op_paged.c) */
bool mf_cub_paged_ok(const mf_node *n);
void mf_cub_paged_forget(cu_ctx *c); /* a new forward: the batch upload is stale */
void mf_cub_paged_free(cu_ctx *c);

/* cuda_exec.c: the fusion rules and helpers the executors share. */
bool mf_cub_read_from(const mf_graph *g, int32_t node, int32_t from);
bool mf_cub_add_fusable(const cu_ctx *c, const mf_graph *g, int32_t node, int64_t nt);
bool mf_cub_norm_fusable(const cu_ctx *c, const mf_graph *g, int32_t node);
int mf_cub_flush_rope(cu_ctx *c, mf_error *err);
int mf_cub_d2d(exec *x, void *dst, const void *src, size_t nbytes);

/* ---- shared between the backend's files ---- */

void mf_cub_ht_mark(cu_ctx *c, int k);
void mf_cub_ht_begin(cu_ctx *c);
void mf_cub_ht_print(const cu_host_times *h);
void mf_cub_dump_ring(cu_ctx *c, mf_error *err);
int mf_cub_wait(cu_ctx *c, const char *what, mf_error *err);
int mf_cub_wait_event(cu_ctx *c, cudaEvent_t ev, mf_error *err);
int32_t mf_cub_alloc_buffer(mf_backend *b, size_t nbytes, mf_error *err);
int32_t mf_cub_alloc_fresh(mf_backend *b, size_t nbytes, mf_error *err);
void mf_cub_free_buffer(mf_backend *b, int32_t id);
void mf_cub_ring_note(cu_ctx *c, const char *op, const char *what, int64_t d0, int64_t d1);
int mf_cub_slot_put(cu_ctx *c, void *dst, const void *src, size_t n, mf_error *err);
int mf_cub_slot_issue(cu_ctx *c, mf_error *err);
void mf_cub_slot_clear(cu_ctx *c);
int mf_cub_write_host(mf_backend *b, int32_t id, size_t off, const void *src, size_t nbytes,
                         mf_error *err);
void *mf_cub_host_alloc(mf_backend *b, size_t nbytes);
void mf_cub_host_free(mf_backend *b, void *p);
int mf_cub_read_host(mf_backend *b, int32_t id, size_t off, void *dst, size_t nbytes,
                        mf_error *err);
int mf_cub_synchronize(mf_backend *b, mf_error *err);
int mf_cub_open_device(cu_ctx *c, int dev, mf_error *err);
const mf_weight *mf_cub_weight_at_name(const cu_ctx *c, const char *name, int64_t *idx);
bool mf_cub_has_weight(const mf_backend *b, const char *name);
size_t mf_cub_row_bytes(uint32_t type, int64_t n);
int mf_cub_upload_weights(cu_ctx *c, mf_cuda_progress_fn progress, void *user, mf_error *err);
bool mf_cub_mm_ok(const mf_matmul_meta *m);
const char *mf_cub_name(const mf_backend *b);
bool mf_cub_supports_op(const mf_backend *b, const mf_node *n);
bool mf_cub_supports_fused(const mf_backend *b, mf_fused_kind kind);
void *mf_cub_buf_ptr(exec *x, int32_t id, size_t need, const char *role);
size_t mf_cub_f32b(int64_t n);
float *mf_cub_scratch(exec *x, int k, size_t nbytes);
bool mf_cub_attn_one_now(const cu_ctx *c, const mf_exec_args *ea);
int32_t *mf_cub_counters(exec *x, int64_t n);
void mf_cub_q8_produced(exec *x, const float *of, int64_t n_in, int64_t nt, void *q8);
int mf_cub_launched(exec *x, const char *kernel, int64_t d0, int64_t d1, cudaError_t e);
const void *mf_cub_weight_ptr(exec *x, const char *name, uint32_t type, int64_t ne0, int64_t ne1);
const float *mf_cub_norm_weight(exec *x, const char *name, int64_t n);
int mf_cub_run_multi(exec *x, const mf_matmul_meta *const *mm, int n, bool swiglu, const float *in,
                     float *const *y, const float *const *res, int64_t nt);
int mf_cub_run_matmul(exec *x, const mf_matmul_meta *m, const float *in, float *y, int64_t nt);
int mf_cub_run_mma_multi(exec *x, const mf_matmul_meta *const *mm, int n, bool swiglu, const float *in,
                         float *const *y, int64_t nt);
bool mf_cub_fuse_ok(const exec *x, const mf_matmul_meta *const *mm, int n, int64_t nt);
void *mf_cub_head_key(const cu_ctx *c, const mf_exec_args *a);
void mf_cub_d2h_set(cu_ctx *c, int32_t id, void *host, size_t bytes, bool zc);
float *mf_cub_zc_alias(cu_ctx *c, void *p, size_t n);
float *mf_cub_zc_head(cu_ctx *c, const mf_graph *g, int32_t node, int32_t in, int32_t out, const mf_exec_args *ea);
int mf_cub_run_head_zc(exec *x, const mf_matmul_meta *m, const float *in, float *y, int32_t out,
                       const mf_exec_args *ea, float *yh);
int mf_cub_run_ew(exec *x, int op, const float *a, const float *b, float *y, int64_t n, int64_t b_n,
                  float s);
int mf_cub_run_norm(exec *x, const float *in, const float *w, float *y, int64_t n, int64_t rows,
                    float eps);
int mf_cub_run_rope(exec *x, const mf_rope_meta *r, const float *in, float *y, const int32_t *pos,
                    int64_t pos0, int64_t nt);
int mf_cub_exec_now(mf_backend *b, const mf_graph *g, int32_t node, const int32_t *in, int32_t out,
                    mf_kv_pair kv, const mf_exec_args *ea, mf_error *err);
int mf_cub_begin_forward(mf_backend *b, const mf_graph *g, const mf_exec_args *a, mf_error *err);
int mf_cub_execute_node(mf_backend *b, const mf_graph *g, int32_t node, const int32_t *in,
                           int32_t out, mf_kv_pair kv, const mf_exec_args *ea, mf_error *err);
int mf_cub_repeat_calls(mf_backend *b, const mf_graph *g, const mf_exec_args *a, mf_error *err);
bool mf_cub_capture(mf_backend *b, cu_gentry *e, mf_error *err);
int mf_cub_end_forward(mf_backend *b, const mf_graph *g, const mf_exec_args *a, mf_error *err);
int mf_cub_flush_recorded(mf_backend *b, mf_error *err);
int mf_cub_flush_pending(mf_backend *b, mf_error *err);
void mf_cub_gentry_clear(cu_gentry *e);

#endif
