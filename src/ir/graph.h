/* graph.h - the compute graph: one node per math op of the transformer.
 *
 * The model builder (src/model) emits nodes in topological order through the
 * mf_g_* helpers; the passes then assign each node a backend (assign.c), fuse
 * what the assigned backend can fuse (fuse.c), give each node an output buffer
 * by liveness (alloc.c), and the scheduler (engine.c) runs the splits. The
 * graph knows nothing about any device: weights are referenced by GGUF name
 * and resolved by each backend through the weight table (mf_weights).
 *
 * Shapes: ne[0] is the contiguous (row) dimension. An activation of n_tokens
 * rows of width d has ne = {d, n_tokens, 1, 1}. A GGUF weight W with n_out rows
 * of n_in has ne = {n_in, n_out}; MATMUL computes y[t] = W x[t] (+ bias). */
#ifndef MF_GRAPH_H
#define MF_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "quant/quant.h"

/* ---- ops ---------------------------------------------------------------------- */

typedef enum mf_op {
    MF_OP_INPUT,          /* host-filled input: meta.input.kind */
    MF_OP_ADD,            /* src0 + src1 (same shape) */
    MF_OP_MUL,            /* src0 * src1 (same shape, or src1 one row broadcast) */
    MF_OP_SCALE,          /* src0 * meta.scale.s */
    MF_OP_SILU,           /* src0 * sigmoid(src0) */
    MF_OP_SWIGLU,         /* silu(src0) * src1 */
    MF_OP_RMSNORM,        /* per row: x / rms(x) * weight (meta.norm) */
    MF_OP_QKNORM,         /* per head of meta.norm.head_dim: rmsnorm with a head_dim weight */
    MF_OP_MATMUL,         /* W src0 (+ bias), meta.matmul */
    MF_OP_GETROWS,        /* meta.getrows: embedding gather or row select */
    MF_OP_ROPE,           /* rotary embedding of src0 at positions src1 (I32), meta.rope */
    MF_OP_KVCACHE_STORE,  /* writes K src0 and V src1 at positions n_past.. of layer's KV pair */
    MF_OP_KVCACHE_LOAD,   /* reads K (which 0) or V (1) rows [0, n_kv) of the layer as f32 */
    MF_OP_ATTN,           /* causal GQA attention of Q src0 over the layer's KV (src1 = the store) */
    MF_OP_SOFTMAX,        /* per row softmax of src0 * meta.softmax.scale */
    MF_OP_VIEW,           /* copy of a column window of src0: meta.view.offset, width = ne[0] */
    MF_OP_RESHAPE,        /* same bytes, new shape (aliases src0's buffer) */
    MF_OP_PERMUTE,        /* copy with axes permuted: out.ne[i] = src0.ne[axes[i]] */
    MF_OP_FUSED_QKV,      /* x -> Q/K/V matmuls + biases + RoPE + KV store; output Q roped */
    MF_OP_FUSED_QKV_NORM, /* FUSED_QKV with Qwen3 per-head Q/K RMSNorm before RoPE */
    MF_OP_FUSED_FFN,      /* x -> swiglu(W_gate x, W_up x) */
    MF_OP_QKV_BIAS_ROPE_STORE, /* (q, k, v) matmul outputs -> biases + RoPE + store; output Q */
    MF_OP_ATTN_PAGED,     /* many sequences: stores K src1 / V src2 in the KV slots of the
                             forward's batch (mf_exec_args.batch), then causal GQA attention of
                             each token's Q (src0) over its own sequence's blocks (meta.attn) */
    MF_OP_COUNT
} mf_op;

const char *mf_op_name(mf_op op);

typedef enum mf_dtype { MF_DTYPE_F32, MF_DTYPE_I32 } mf_dtype;

typedef enum mf_input_kind {
    MF_INPUT_TOKENS,      /* I32 [n_tokens] */
    MF_INPUT_POSITIONS,   /* I32 [n_tokens] */
    MF_INPUT_EXTERNAL,    /* F32 filled by the caller (op tests) */
} mf_input_kind;

typedef enum mf_rope_mode {
    MF_ROPE_NORMAL = 0,   /* rotate adjacent pairs (x[2i], x[2i+1]) - llama */
    MF_ROPE_NEOX = 2,     /* rotate halves (x[i], x[i + n_rot/2]) - qwen2, qwen3 */
} mf_rope_mode;

typedef struct mf_rope_meta {
    int32_t n_head;       /* heads in src0's row */
    int32_t head_dim;
    int32_t n_rot;        /* rotated dims per head (<= head_dim, even) */
    int32_t mode;         /* mf_rope_mode */
    float theta;          /* rope.freq_base */
    float freq_scale;     /* 1 / linear scaling factor (1 = none) */
} mf_rope_meta;

typedef struct mf_matmul_meta {
    const char *weight;   /* GGUF tensor name, ne = {n_in, n_out} */
    uint32_t wtype;       /* mf_type of the weight */
    const char *bias;     /* F32 [n_out] tensor name or NULL */
    int64_t n_in, n_out;
} mf_matmul_meta;

typedef struct mf_attn_meta {
    int32_t layer;
    int32_t n_head, n_head_kv, head_dim;
    float scale;          /* usually 1/sqrt(head_dim) */
    bool unfused;         /* flash attention off: the score matrix (tokens x context) is
                             materialized, softmaxed, then multiplied by V (CPU only) */
} mf_attn_meta;

/* Fused attention input block: the three projections of one layer. */
typedef struct mf_qkv_meta {
    int32_t layer;
    mf_matmul_meta q, k, v;   /* n_in equal; biases optional */
    const char *q_norm, *k_norm; /* FUSED_QKV_NORM: per-head weights [head_dim] */
    float norm_eps;
    mf_rope_meta rope_q, rope_k;
    int32_t n_head, n_head_kv, head_dim;
} mf_qkv_meta;

typedef struct mf_ffn_meta {
    mf_matmul_meta gate, up; /* same n_in, same n_out */
} mf_ffn_meta;

#define MF_MAX_SRC 4
#define MF_NODE_NAME 48

enum {
    MF_NODE_OUTPUT = 1 << 0, /* read by the host after the forward (logits) */
    MF_NODE_DEAD = 1 << 1,   /* removed by a pass (fused into another node) */
};

typedef struct mf_node {
    mf_op op;
    mf_dtype dtype;
    int64_t ne[4];
    int32_t n_src;
    int32_t src[MF_MAX_SRC];  /* producer node indices, each < this node's index */
    int32_t layer;            /* -1 outside the layer loop */
    uint32_t flags;
    char name[MF_NODE_NAME];  /* e.g. "blk.3.attn_q" for traces */
    union {
        struct { mf_input_kind kind; } input;
        struct { float s; } scale;
        struct { const char *weight; float eps; int32_t head_dim; } norm; /* weight may be NULL */
        mf_matmul_meta matmul;
        /* mode 0: embedding gather: rows src0 (I32 token ids) of weight (any type);
         * mode 1: row select: rows [first, first + ne[1]) of src0 */
        struct { int32_t mode; const char *weight; uint32_t wtype; int64_t first; } getrows;
        mf_rope_meta rope;
        struct { int32_t layer; int32_t which; } kv;  /* which: 0 K, 1 V (LOAD only) */
        mf_attn_meta attn;
        struct { float scale; } softmax;
        struct { int64_t offset; } view;              /* first column */
        struct { int32_t axes[4]; } permute;
        mf_qkv_meta qkv;  /* FUSED_QKV, FUSED_QKV_NORM, QKV_BIAS_ROPE_STORE (srcs q,k,v) */
        mf_ffn_meta ffn;
    } meta;

    /* set by the passes */
    int32_t backend;          /* index into the engine's backend list; -1 before assign */
    int32_t buf;              /* output buffer id in that backend's pool; -1 none */
} mf_node;

/* The graph: nodes plus the KV layout they use. Strings (weight names) live in
 * the graph's own arena, so a graph outlives the builder's temporaries. */
typedef struct mf_graph {
    mf_node *nodes;
    int32_t n_nodes, cap;
    char **strings;           /* arena: every string handed to mf_g_str */
    int32_t n_strings, cap_strings;
    int32_t n_layers;         /* layers with a KV pair */
    int64_t kv_dim;           /* K (= V) row width per layer: n_head_kv * head_dim */
    uint64_t stamp;           /* engine builds: unique per build, never reused (0: not stamped), so a
                                 backend caching per graph can tell a rebuild at the same address */
} mf_graph;

void mf_graph_init(mf_graph *g);
void mf_graph_free(mf_graph *g);
/* A copy of s owned by the graph. */
const char *mf_g_str(mf_graph *g, const char *s);
/* Appends a node (backend/buf -1, name "") and returns its index. */
int32_t mf_g_node(mf_graph *g, mf_op op, mf_dtype dtype, int64_t ne0, int64_t ne1,
                  const int32_t *src, int32_t n_src);
void mf_g_set_name(mf_graph *g, int32_t node, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Builder helpers: each returns the new node's index; weight names are copied. */
int32_t mf_g_input(mf_graph *g, mf_input_kind kind, mf_dtype dtype, int64_t ne0, int64_t ne1);
int32_t mf_g_add(mf_graph *g, int32_t a, int32_t b);
int32_t mf_g_mul(mf_graph *g, int32_t a, int32_t b);
int32_t mf_g_scale(mf_graph *g, int32_t a, float s);
int32_t mf_g_silu(mf_graph *g, int32_t a);
int32_t mf_g_swiglu(mf_graph *g, int32_t gate, int32_t up);
int32_t mf_g_rmsnorm(mf_graph *g, int32_t x, const char *weight, float eps);
int32_t mf_g_qknorm(mf_graph *g, int32_t x, const char *weight, int32_t head_dim, float eps);
int32_t mf_g_matmul(mf_graph *g, int32_t x, const char *weight, uint32_t wtype,
                    const char *bias, int64_t n_in, int64_t n_out);
int32_t mf_g_embed(mf_graph *g, int32_t tokens, const char *weight, uint32_t wtype, int64_t d);
int32_t mf_g_rows(mf_graph *g, int32_t x, int64_t first, int64_t n);
int32_t mf_g_rope(mf_graph *g, int32_t x, int32_t pos, const mf_rope_meta *rope);
int32_t mf_g_kv_store(mf_graph *g, int32_t k, int32_t v, int32_t layer);
int32_t mf_g_kv_load(mf_graph *g, int32_t store, int32_t layer, int32_t which, int64_t n_kv);
int32_t mf_g_attn(mf_graph *g, int32_t q, int32_t store, const mf_attn_meta *m);
int32_t mf_g_attn_paged(mf_graph *g, int32_t q, int32_t k, int32_t v, const mf_attn_meta *m);
int32_t mf_g_softmax(mf_graph *g, int32_t x, float scale);
int32_t mf_g_view(mf_graph *g, int32_t x, int64_t offset, int64_t width);
int32_t mf_g_reshape(mf_graph *g, int32_t x, int64_t ne0, int64_t ne1);
int32_t mf_g_permute(mf_graph *g, int32_t x, const int32_t axes[4]);
int32_t mf_g_fused_qkv(mf_graph *g, int32_t x, int32_t pos, const mf_qkv_meta *m); /* op by q_norm */
int32_t mf_g_fused_ffn(mf_graph *g, int32_t x, const mf_ffn_meta *m);

/* Element count and f32/i32 bytes of a node's output. A node of 0 bytes
 * (KVCACHE_STORE: its effect is the KV write) gets no buffer. */
int64_t mf_node_nelem(const mf_node *n);
size_t mf_node_nbytes(const mf_node *n);
/* The layer whose KV regions the node touches (KV ops, ATTN, fused QKV ops),
 * or -1 for every other op. */
int32_t mf_node_kv_layer(const mf_node *n);
/* The nodes that consume node i's value (src lists of live nodes), counted. */
int32_t mf_graph_n_consumers(const mf_graph *g, int32_t i);

/* Checks what the builder emitted: src indices before the node, shapes that
 * agree per op (ADD same shape, MATMUL src0 width == n_in, ...), KV layers in
 * [0, n_layers). Error names the node, its op and the numbers. */
int mf_graph_validate(const mf_graph *g, mf_error *err);

/* ---- weight table ------------------------------------------------------------------ */

/* Every tensor a graph may name, with its bytes (normally views into the GGUF
 * mapping; derived tensors made at load are owned by the table). */
typedef struct mf_weight {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[4];
    const void *data;
    uint64_t nbytes;
} mf_weight;

typedef struct mf_weights mf_weights;

mf_weights *mf_weights_new(void);
void mf_weights_free(mf_weights *w);
/* Adds a view (name copied, data not); a duplicate name is an error. */
int mf_weights_add(mf_weights *w, const mf_weight *wt, mf_error *err);
/* Adds a tensor whose bytes the table takes ownership of (malloc'd). */
int mf_weights_add_owned(mf_weights *w, const mf_weight *wt, void *data, mf_error *err);
const mf_weight *mf_weights_find(const mf_weights *w, const char *name);
int64_t mf_weights_count(const mf_weights *w);
const mf_weight *mf_weights_at(const mf_weights *w, int64_t i);

/* ---- graph params: the reuse identity --------------------------------------------- */

/* A cached graph is reused only when the params are equal (mf_graph_params_eq);
 * anything that changes the graph's nodes, assignment or buffers is in here. */
typedef struct mf_graph_params {
    int32_t n_tokens;      /* tokens of this forward */
    int32_t n_outputs;     /* logits rows: 1 (last token) or n_tokens */
    int32_t n_ctx;         /* KV positions per layer */
    uint32_t k_type;       /* K cache type: f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1 */
    uint32_t v_type;       /* V cache type (same set; may differ from k_type) */
    uint32_t backends;     /* bit i: backend i of the engine takes part */
    bool gpu;              /* a GPU backend takes part (all-weights-registered gate) */
    bool fuse_qkv;         /* emit FUSED_QKV / FUSED_QKV_NORM */
    bool fuse_ffn;         /* emit FUSED_FFN */
    bool fuse_qkv_epilogue;/* emit QKV_BIAS_ROPE_STORE */
    bool fuse_swiglu;      /* fusion pass: SILU + MUL -> SWIGLU */
    bool paged;            /* many sequences: ATTN_PAGED over the block-paged KV pool; the
                              logits of the last n_outputs rows (any count 1..n_tokens) */
    bool attn_unfused;     /* -fa off: ATTN / ATTN_PAGED nodes get meta.attn.unfused */
} mf_graph_params;

bool mf_graph_params_eq(const mf_graph_params *a, const mf_graph_params *b);

/* Graph dump for MINFER_GRAPH_TRACE: one line per node. */
void mf_graph_print(const mf_graph *g, void *file /* FILE* */);

#endif
