/* quant_mix.h - which weight type each tensor gets, shared by `minfer
 * quantize` and `minfer synth`.
 *
 * A target name is a llama.cpp file type ("ftype"): a default weight type plus
 * the per-tensor adjustments users know from llama-quantize
 * (llama_tensor_get_type):
 *   - tensors with fewer than 2 dims (norms, biases) stay F32;
 *   - for every quantized target, output.weight (or token_embd.weight when the
 *     model has no output.weight, i.e. tied embeddings) gets q6_K, or q8_0
 *     when the target is q8_0 or its rows are not a multiple of 256;
 *   - Q2_K: attn_v q3_K (q4_K when n_head/n_head_kv >= 4), attn_output q3_K,
 *     ffn_down q3_K;
 *   - Q3_K_S: q3_K everywhere (the output rule only);
 *   - Q3_K_L: attn_v, attn_output and ffn_down q5_K;
 *   - Q3_K_M: attn_v q5_K for the first 2 layers else q4_K, attn_output q4_K,
 *     ffn_down q5_K in the first n/16 layers else q4_K;
 *   - Q4_K_M / Q5_K_M: attn_v and ffn_down q6_K in the "use_more_bits" layers
 *     (the first and last eighth, and every third layer in between);
 *   - Q4_K_S: attn_v q5_K in layers < 4, ffn_down q5_K in the first eighth;
 *   - a K-quant on a row length that is not a multiple of 256 falls back
 *     (q4_K->q5_0, q5_K->q5_1, q6_K->q8_0, q2_K/q3_K->q4_0, iq4_xs->iq4_nl), and a 32-block
 *     type on a row length not a multiple of 32 falls back to f16.
 * Names are case-insensitive. "Q2_K", "Q6_K" and "Q8_0" are the llama.cpp
 * file types of those names (Q6_K and Q8_0 are uniform anyway, Q2_K is the
 * mix above); "q3_K", "q4_K", "q5_K" are uniform (every 2-D weight that type
 * apart from the output rule; general.file_type is the _S number).
 * `pure` (the --pure flag) turns every adjustment off except the F32 rule for
 * 1-D tensors and the row-length fallbacks. */
#ifndef MF_TOOLS_QUANT_MIX_H
#define MF_TOOLS_QUANT_MIX_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "quant/quant.h"

typedef enum mf_mix_kind {
    MF_MIX_UNIFORM, /* one type everywhere (plus the output rule when quantized) */
    MF_MIX_Q2_K,
    MF_MIX_Q3_K_S,
    MF_MIX_Q3_K_M,
    MF_MIX_Q3_K_L,
    MF_MIX_Q4_K_S,
    MF_MIX_Q4_K_M,
    MF_MIX_Q5_K_S,
    MF_MIX_Q5_K_M,
} mf_mix_kind;

typedef struct mf_quant_mix {
    const char *name;  /* canonical spelling: "Q4_K_M", "q4_0", "f16" */
    mf_mix_kind kind;
    uint32_t base;     /* mf_type of most 2-D weights */
    uint32_t ftype;    /* llama_ftype number written as general.file_type */
    bool pure;         /* no per-tensor adjustments */
} mf_quant_mix;

/* What the per-tensor rules need to know about the whole model. */
typedef struct mf_mix_model {
    int n_layer;      /* transformer blocks (count of attn_v / ffn_down weights) */
    int n_gqa;        /* n_head / n_head_kv (1 when unknown) */
    bool has_output;  /* the model has its own output.weight (untied) */
} mf_mix_model;

/* Looks a target name up (case-insensitive). On failure err lists every
 * valid name. */
int mf_quant_mix_parse(const char *name, mf_quant_mix *out, mf_error *err);
/* The valid names, space separated, for usage texts. */
const char *mf_quant_mix_names(void);

/* Type for tensor `name` of n_dims dims with row length ne0 under mix.
 * *note (may be NULL) is set to a short reason when a row-length fallback
 * replaced the rule's choice ("row 896 % 256: q4_K -> q5_0"), else "". */
uint32_t mf_quant_mix_choose(const mf_quant_mix *mix, const mf_mix_model *model,
                             const char *name, uint32_t n_dims, int64_t ne0, char *note,
                             size_t note_len);

/* Layer index of a "blk.N." tensor name, or -1. */
int mf_tensor_layer(const char *name);

/* Converts nrows rows of n floats to type (f32, f16, bf16 or any quantized
 * type with a reference quantizer) into dst, splitting rows over pool
 * (NULL: this thread). */
void mf_tools_from_float(mf_pool *pool, uint32_t type, const float *src, void *dst,
                         int64_t nrows, int64_t n);
/* Converts rows of an f32/f16/bf16 source to floats. Returns -1 for other
 * types. */
int mf_tools_to_float(uint32_t type, const void *src, float *dst, int64_t nrows, int64_t n);

#endif
