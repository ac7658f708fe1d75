/* backend.h - the backend contract (DESIGN.md §3, seed §2.1).
 *
 * A backend is an executor: it owns a pool of buffers and knows how to run
 * graph ops on one piece of hardware. Every backend (cpu, ref, cuda, metal)
 * fills one mf_backend_ops and one op table and includes this header, so
 * signature drift is a compile error. A new backend is a folder, an op table
 * and one line in the registry (backend/registry.h).
 *
 * Rules:
 *  - Buffers are int32 ids into the backend's own pool, never raw pointers
 *    across the seam. An output id may equal an input id (liveness reuse):
 *    every op must work in place.
 *  - The op table has one entry per graph op (MF_OP_TABLE_CHECK makes a
 *    missing one a compile error): a can-run check and an executor.
 *    mf_backend_supports_op / mf_backend_execute_node dispatch through it.
 *  - supports_op / supports_fused are asked at build time; a refusal is not an
 *    error, it makes a split. execute_node on a node supports_op refused, a
 *    missing weight or bad metadata is an error naming the node and numbers —
 *    never a silent fallback.
 *  - A split (a run of nodes on one backend) runs through execute_split when
 *    the backend has one (it sees the whole split: plans fusions over it,
 *    records and replays it, encodes one command buffer); without it the
 *    engine calls execute_node per node.
 *  - execute_node / execute_split encode or launch and may return before the
 *    work is done; synchronize is the (bounded) wait, called at every split
 *    end and before the engine reads an output.
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
 * elements of the region's type (K: k_type, V: v_type; f32, f16 or one of the
 * 32-element block types q8_0 / q4_0 / q4_1 / q5_0 / q5_1), row r = position r. */
typedef struct mf_kv_pair {
    int32_t k, v;
} mf_kv_pair;

/* The sequences of a paged forward (ATTN_PAGED). The KV pool is the
 * layer's region cut into blocks of block_size rows; sequence s's position
 * p lives in row tables[s][p / block_size] * block_size + p % block_size.
 * Token t belongs to sequence seq[t] at position pos[t] and attends to that
 * sequence's positions [0, pos[t]] (its own K/V row is written first). */
typedef struct mf_kv_batch {
    int32_t n_tokens;
    const int32_t *seq;          /* [n_tokens] index into tables */
    const int32_t *pos;          /* [n_tokens] */
    int32_t n_seqs;
    const int32_t *const *tables; /* [n_seqs] block ids, each covering its sequence's pos */
    int32_t block_size;
} mf_kv_batch;

/* Per-forward values that do not change the graph (so a cached graph stays
 * valid): where this batch starts in the KV cache, and for a paged forward
 * its sequences. */
typedef struct mf_exec_args {
    int32_t n_past;   /* position of the first token of the batch */
    int32_t n_tokens; /* tokens in the batch (== graph params n_tokens) */
    int32_t n_ctx;
    uint32_t k_type, v_type;  /* the K and V regions' cache types (graph params k_type / v_type) */
    const mf_kv_batch *batch; /* paged forwards only (graph params paged); else NULL */
} mf_exec_args;

/* One node as the engine hands it over, its buffers resolved. The engine
 * makes the same calls (same node, buffer and KV ids) in every forward of
 * one graph build (g->stamp). */
typedef struct mf_node_call {
    int32_t node;             /* index into g->nodes */
    int32_t in[MF_MAX_SRC];   /* src i's buffer here (a staging copy when src i ran elsewhere) */
    int32_t out;              /* output buffer; -1 for a node of 0 bytes */
    mf_kv_pair kv;            /* the node's layer regions ({-1, -1} outside attention) */
} mf_node_call;

/* Host bytes of an INPUT node that the split's backend writes into buf
 * before its nodes read it (execute_split only: otherwise the engine writes
 * them with write_host). data stays valid for the call. */
typedef struct mf_host_input {
    int32_t node, buf;
    const void *data;
    size_t nbytes;
} mf_host_input;

/* A whole split, as execute_split gets it. Values produced by other
 * backends (inputs) are already copied into this backend's staging buffers;
 * outputs are the split's nodes whose values leave it (read by a later
 * split, or by the host after the forward). read_back[k], when not NULL, is
 * where the engine will read output k with read_host (mf_node_nbytes bytes
 * from offset 0) right after the forward's final synchronize: a backend may
 * start that copy early, but the read still follows. */
typedef struct mf_split_call {
    const mf_graph *g;
    int32_t index, n_splits;         /* this split's place in the forward */
    const mf_node_call *calls;       /* executable nodes, in order */
    int32_t n_calls;
    const int32_t *inputs, *staging; /* node from another backend, its copy's buffer here */
    int32_t n_inputs;
    const mf_host_input *host_inputs;
    int32_t n_host_inputs;
    const int32_t *outputs, *out_bufs; /* node, its buffer here */
    void *const *read_back;          /* per output; NULL entries: not read back */
    int32_t n_outputs;
    const mf_exec_args *args;
} mf_split_call;

/* One op table entry. can_run NULL: every node of the op runs; exec NULL:
 * the backend does not run the op at all. */
typedef struct mf_op_entry {
    bool (*can_run)(const mf_backend *b, const mf_node *n);
    int (*exec)(mf_backend *b, const mf_graph *g, const mf_node_call *c, const mf_exec_args *a,
                mf_error *err);
} mf_op_entry;

/* After a backend's `static const mf_op_entry t[] = {[MF_OP_INPUT] = ...}`:
 * a table whose size is not the op count does not compile. Write every op's
 * entry, {NULL, NULL} for one the backend does not run, so a new op shows
 * up in every table as a decision. */
#define MF_OP_TABLE_CHECK(t) \
    _Static_assert(sizeof(t) / sizeof((t)[0]) == MF_OP_COUNT, #t ": one entry per graph op")

/* The executor of INPUT (the host fills it) and RESHAPE (same bytes as its
 * source): nothing to run. */
int mf_op_nothing(mf_backend *b, const mf_graph *g, const mf_node_call *c, const mf_exec_args *a,
                  mf_error *err);

typedef struct mf_backend_ops {
    const char *(*name)(const mf_backend *b);
    const mf_op_entry *op_table; /* MF_OP_COUNT entries */
    bool (*supports_fused)(const mf_backend *b, mf_fused_kind kind);

    /* Buffer pool (sizes in bytes). alloc_buffer may recycle a freed buffer of
     * the same size; alloc_fresh never does. Return the id or -1 (err set). */
    int32_t (*alloc_buffer)(mf_backend *b, size_t nbytes, mf_error *err);
    void (*free_buffer)(mf_backend *b, int32_t id);
    int32_t (*alloc_fresh)(mf_backend *b, size_t nbytes, mf_error *err);

    /* Optional (NULL: the engine writes the host inputs and calls
     * execute_node per node). Runs a whole split; must write s->host_inputs
     * before the nodes that read them. */
    int (*execute_split)(mf_backend *b, const mf_split_call *s, mf_error *err);

    /* Host access at split boundaries; only after synchronize for outputs. */
    int (*read_host)(mf_backend *b, int32_t id, size_t offset, void *dst, size_t nbytes,
                     mf_error *err);
    int (*write_host)(mf_backend *b, int32_t id, size_t offset, const void *src, size_t nbytes,
                      mf_error *err);
    int (*synchronize)(mf_backend *b, mf_error *err);

    /* Optional (NULL allowed). has_weight: for the all-weights-registered gate;
     * NULL means the backend reads every weight from the mapping. */
    bool (*has_weight)(const mf_backend *b, const char *name);
    /* Optional: host memory the backend copies outputs into fastest (CUDA:
     * pinned, so read_host into it is one DMA and no staging copy). NULL
     * when it has none to give; the caller then uses the C heap. host_free
     * takes only what host_alloc returned. */
    void *(*host_alloc)(mf_backend *b, size_t nbytes);
    void (*host_free)(mf_backend *b, void *p);
    /* Optional: one line about the device in use ("NVIDIA H200, cc 9.0, ..."). */
    const char *(*describe)(const mf_backend *b);

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

/* What a backend is made with. The runtime fills it from the lever table
 * (runtime/levers.h); backends never read the environment. */
typedef struct mf_backend_options {
    int32_t n_threads;        /* cpu: worker threads (>= 1) */
    int32_t device;           /* GPU index on the machine */
    int64_t gpu_timeout_ms;   /* bound of every GPU wait */
    bool graphs;              /* GPU: record and replay splits (CUDA graphs) */
    bool fusion;              /* GPU: the backend's own fusions inside a split */
    uint32_t cache_type;      /* KV cache type the sessions use (MF_TYPE_F32 / F16 / Q8_0) */
    bool trace;               /* name every launch in a ring shown on a fault */
    bool profile;             /* per-kernel host timings at free */
    const char *tune;         /* kernel-choice experiments, "key=value,..." (NULL / "": defaults);
                                 parsed by the backend, an unknown key is its error */
    const char *cpu_isa;      /* cpu: cap the kernel ISA ("scalar", "avx2", ...; NULL: the best) */
    /* metal: the seed's levers (defaults from mf_backend_options_default) */
    struct {
        bool disable;         /* refuse to start (MINFER_DISABLE_METAL / _MPS) */
        const char *metallib; /* a precompiled .metallib instead of the embedded source */
        bool weight_copy;     /* copy the weights instead of wrapping the mapping */
        bool capture;         /* a GPU capture of the first command buffers */
        int32_t gemm;         /* matmul tier: 0 GEMV only, 1 GEMM from 2 tokens, 2 by shape */
        int32_t attn_chunk;   /* KV positions per split of the split-KV attention (0: auto) */
        bool fuse_qkv, fuse_ffn, fuse_qkv_norm; /* the fused decode dispatches */
    } metal;
    /* weight upload progress: bytes done of total (may be NULL) */
    void (*progress)(void *user, uint64_t done, uint64_t total);
    void *progress_user;
} mf_backend_options;

void mf_backend_options_default(mf_backend_options *o);

/* Generic dispatch through b's op table. supports_op: the entry has an
 * executor and its can_run (if any) says yes. execute_node: runs c->node,
 * or an error naming the node when supports_op refuses it. */
bool mf_backend_supports_op(const mf_backend *b, const mf_node *n);
int mf_backend_execute_node(mf_backend *b, const mf_graph *g, const mf_node_call *c,
                            const mf_exec_args *a, mf_error *err);

/* The all-weights-registered gate (seed §2.7, §3.2.8): true when b may take
 * part in graphs reading names[0..n), i.e. b has no has_weight hook or
 * has_weight is true for each. On false, *missing (if non-NULL) names the
 * first tensor b lacks. */
bool mf_backend_weights_on(const mf_backend *b, const char *const *names, int32_t n,
                           const char **missing);

/* Constructors. The weight table must outlive the backend. */
int mf_backend_cpu_new(const mf_weights *w, int n_threads, mf_backend **out, mf_error *err);
int mf_backend_ref_new(const mf_weights *w, mf_backend **out, mf_error *err);
/* A GPU backend holds the uploaded weights, so the model keeps one and every
 * session's engine shares it: retain adds a holder, free drops one and frees
 * the backend when the last holder lets go. */
void mf_backend_retain(mf_backend *b);
void mf_backend_free(mf_backend *b);

#endif
