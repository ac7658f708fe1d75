/* model.h - transformer architectures (llama, qwen2, qwen3): hyperparameters,
 * the weight table, the all-weights-registered gate and the graph builder.
 *
 * mf_model_load opens the GGUF, reads and validates the hyperparameters of
 * general.architecture, and builds an mf_weights table of zero-copy views into
 * the mapping after checking that every tensor the graph reads exists with
 * the expected shape and a supported weight type. The builder
 * (mf_model_build_graph, an mf_graph_build_fn) emits one node per math op for
 * the given graph params; it never looks at a backend. */
#ifndef MF_MODEL_H
#define MF_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "gguf/gguf.h"
#include "ir/graph.h"

typedef enum mf_arch {
    MF_ARCH_LLAMA,
    MF_ARCH_QWEN2,
    MF_ARCH_QWEN3,
    MF_ARCH_COUNT
} mf_arch;

const char *mf_arch_name(mf_arch arch);

typedef struct mf_hparams {
    int32_t n_embd;       /* {arch}.embedding_length */
    int32_t n_layer;      /* block_count */
    int32_t n_ff;         /* feed_forward_length */
    int32_t n_head;       /* attention.head_count */
    int32_t n_head_kv;    /* attention.head_count_kv (default n_head) */
    int32_t head_dim;     /* attention.key_length (default n_embd / n_head) */
    int32_t n_rot;        /* rope.dimension_count (default head_dim) */
    int32_t n_ctx_train;  /* context_length */
    int32_t n_vocab;      /* rows of token_embd.weight */
    float rope_theta;     /* rope.freq_base (default 10000) */
    float freq_scale;     /* 1 / rope.scaling.factor for linear scaling, else 1 */
    float norm_eps;       /* attention.layer_norm_rms_epsilon */
    int32_t rope_mode;    /* MF_ROPE_NORMAL (llama) or MF_ROPE_NEOX (qwen2/3) */
} mf_hparams;

/* Tensor names of one layer (NULL where the arch has none). */
typedef struct mf_layer_names {
    const char *attn_norm, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *q_norm, *k_norm;
    const char *ffn_norm, *gate, *up, *down;
} mf_layer_names;

typedef struct mf_model {
    mf_arch arch;
    mf_hparams hp;
    mf_gguf *gguf;            /* owned: the mapping the weight views point into */
    mf_weights *weights;      /* owned */
    bool tied;                /* no output.weight: logits use token_embd.weight */
    const char *tok_embd, *out_norm, *output; /* output = token_embd when tied */
    mf_layer_names *layers;   /* [n_layer], pointing into gw_names */
    char **gw_names;          /* every tensor the graph reads, graph order, owned */
    int32_t n_gw, cap_gw;
    uint64_t weight_bytes;    /* bytes of every tensor the graph reads */
    int64_t n_params;         /* elements of those tensors */
    char desc[96];            /* "llama 135M Q4_1" */
} mf_model;

/* Loads path. progress (may be NULL) is called with fractions in [0, 1] while
 * tensors are checked. Errors name the key/tensor and the values:
 * "model: unsupported architecture 'gpt2'", "model: tensor 'blk.3.ffn_up.weight'
 * not found", "model: tensor 'x' has shape [a, b], expected [c, d]". */
int mf_model_load(const char *path, void (*progress)(void *user, float frac, const char *what),
                  void *progress_user, mf_model **out, mf_error *err);
void mf_model_free(mf_model *m);

/* The weight type of a tensor the graph reads (by name). */
uint32_t mf_model_wtype(const mf_model *m, const char *name);

/* Every tensor name the graph reads, in graph order; returns the count and
 * sets *names to an array the model owns (valid until mf_model_free). The
 * all-weights-registered gate checks a backend against this list
 * (mf_backend_weights_on). */
int32_t mf_model_graph_weights(const mf_model *m, const char *const **names);

/* mf_graph_build_fn: ctx is the mf_model. Builds the forward for p:
 * p->n_tokens tokens, p->n_outputs logits rows (1: the last token, else all),
 * FUSED_QKV(_NORM) when p->fuse_qkv, FUSED_FFN when p->fuse_ffn, SILU + MUL
 * instead of SWIGLU when p->fuse_swiglu (so the fusion pass has work). */
int mf_model_build_graph(void *ctx, const mf_graph_params *p, mf_graph *g, mf_error *err);

#endif
