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
#include "tokenizer/tokenizer.h"

#define MF_RT_MAX_BACKENDS 4

struct minfer_model {
    mf_model *m;
    mf_tokenizer *tok;
    mf_chat_template tmpl;      /* detected from the GGUF (ChatML when unknown) */
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
    uint32_t kv_type;
    bool logits_all;
    bool gpu;                   /* a GPU backend passed the all-weights-registered gate */
    bool fuse_off[MF_FUSE_COUNT]; /* MINFER_NO_FUSE_* kill switches */
    bool rebuild_each;          /* MINFER_GRAPH_REBUILD=1 */
    float *logits;              /* [n_batch or 1][n_vocab] */
    int32_t n_logits;           /* rows valid in logits */
};

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
int32_t mf_sampler_candidates(minfer_sampler *s, const float *logits, int32_t n_vocab,
                              mf_cand *out);

#endif
