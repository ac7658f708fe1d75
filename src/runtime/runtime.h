/* runtime.h - internals of libminfer's public API (include/minfer.h): what a
 * minfer_model and a minfer_session hold, and the sampler's inspectable
 * filter chain (tests include this header to check candidate sets). */
#ifndef MF_RUNTIME_H
#define MF_RUNTIME_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/registry.h"
#include "engine/engine.h"
#include "minfer.h"
#include "model/model.h"
#include "template/jinja.h"
#include "tokenizer/tokenizer.h"

#define MF_RT_MAX_BACKENDS 4

struct minfer_model {
    mf_model *m;
    mf_tokenizer *tok;
    mf_chat_template tmpl;      /* built-in family detected from the GGUF (ChatML when unknown) */
    mf_jinja *jinja;            /* tokenizer.chat_template, parsed; NULL when the GGUF has none */
    char *bos_text, *eos_text;  /* bos_token / eos_token as templates see them ("" when none) */
    int32_t n_threads;
    const mf_backend_entry *be[MF_RT_MAX_BACKENDS]; /* engine backend list, priority order */
    mf_backend *made[MF_RT_MAX_BACKENDS]; /* GPU entries: made at load (weights uploaded once),
                                             shared by sessions; NULL for per-session ones */
    int n_be;
    mf_backend_options bo;      /* what every backend is made with (from the levers) */
    char backend_name[64];      /* "cpu", "ref,cpu", "cuda,cpu" */
};

struct minfer_session {
    minfer_model *model;
    mf_engine *eng;
    int32_t n_ctx, n_batch, n_past;
    uint32_t kv_type[2];        /* K, V cache types */
    bool attn_unfused;          /* -fa off */
    bool logits_all;
    bool gpu;                   /* a GPU backend passed the all-weights-registered gate */
    bool fuse_off[MF_FUSE_COUNT]; /* MINFER_NO_FUSE_* kill switches */
    bool rebuild_each;          /* MINFER_GRAPH_REBUILD=1 */
    float *logits;              /* [n_batch or 1][n_vocab] */
    int32_t n_logits;           /* rows valid in logits */
};

/* Parses and probes the GGUF's chat template (api_chat.c): a template that
 * does not parse, or fails to render a one-message conversation, fails the
 * load with the template's line:column. builtin_only: a built-in template
 * was chosen, the GGUF's is not read. */
int mf_rt_chat_init(minfer_model *mm, bool builtin_only, mf_error *err);
void mf_rt_chat_free(minfer_model *mm);

/* The engine of a session or a minfer_multi: the model's backends (the GPU
 * ones through the all-weights-registered gate, *gpu says whether one passed)
 * over KV regions of n_rows rows. */
int mf_rt_make_engine(const minfer_model *mm, int32_t n_rows, const uint32_t kv_types[2], mf_engine **out,
                      bool *gpu, mf_error *err);
/* The cache type of a session that names none: the first backend of the
 * model's list with a policy of its own (Metal: f16 from the 7B class
 * up), else "f32". */
const char *mf_rt_default_cache_type(const minfer_model *mm);
/* "f32" / "f16" / "q8_0" / "q4_0" / "q4_1" / "q5_0" / "q5_1" -> the type;
 * source names where the name came from; the block types need
 * head_dim % 32 == 0. */
int mf_rt_parse_cache_type(const char *name, const char *source, int32_t head_dim, uint32_t *out,
                           mf_error *err);
/* The K and V types of a session or minfer_multi (out[0] K, out[1] V):
 * MINFER_CACHE_TYPE for both, else k (and v, when v is NULL or "") else the
 * model's default. who: "session" / "multi" for the errors. */
int mf_rt_cache_types(const minfer_model *mm, const char *k, const char *v, const char *who, uint32_t out[2],
                      mf_error *err);
/* What a GPU backend that takes part cannot do, refused in one line naming
 * the backend and the types: K and V of different types, a type other than
 * f32 / f16 / q8_0, unfused attention (-fa off). */
int mf_rt_check_gpu_kv(mf_engine *e, bool gpu, const uint32_t kv_types[2], bool unfused, const char *who,
                       mf_error *err);

/* ---- sampler internals ------------------------------------------------------------ */

typedef struct mf_cand {
    int32_t id;
    float logit;
    float p;                    /* softmax probability after the last filter */
} mf_cand;

/* Applies the penalties and the top-k, top-p and min-p filters (in that order)
 * to logits[0..n_vocab) and writes the surviving candidates into out (room
 * for n_vocab), sorted by logit descending with p = the softmax over the
 * survivors at temperature 1. Returns the survivor count (>= 1). */
/* The last sample call found no token the grammar allows. */
bool mf_sampler_grammar_stuck(const minfer_sampler *s);

int32_t mf_sampler_candidates(minfer_sampler *s, const float *logits, int32_t n_vocab,
                              mf_cand *out);

#endif
