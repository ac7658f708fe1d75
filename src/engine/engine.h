/* engine.h - the graph machinery around the backends: backend assignment,
 * fusion pass, liveness allocation, the scheduler, and the graph cache.
 *
 * The model supplies a builder callback; mf_engine_forward reuses the cached
 * graph when the params are equal (mf_graph_params_eq), else rebuilds:
 * build -> assign (the backend list's order is the priority, e.g. cuda, ref,
 * cpu; the first whose supports_op says yes gets the node) ->
 * fuse (supports_fused) -> alloc (liveness, KV regions) -> run splits.
 *
 * Options (the runtime fills them from its levers): trace prints the split
 * table and the op x backend census at each rebuild; profile prints per-op
 * time at free. */
#ifndef MF_ENGINE_H
#define MF_ENGINE_H

#include "backend/backend.h"
#include "ir/graph.h"

typedef struct mf_engine mf_engine;

/* Builds the graph for p into g (initialised, empty). */
typedef int (*mf_graph_build_fn)(void *ctx, const mf_graph_params *p, mf_graph *g, mf_error *err);

typedef struct mf_engine_opts {
    int32_t n_layers;   /* KV pairs */
    int64_t kv_dim;     /* K/V row width per layer */
    int32_t n_ctx;
    uint32_t k_type, v_type; /* K / V cache types: mf_kv_type_ok */
    int64_t n_vocab;    /* logits row width */
    bool alternate;     /* mf_engine_set_alternate at creation (MINFER_ALTERNATE_BACKENDS) */
    int32_t trace;      /* 1: split table and census per build; 2: also every node (MINFER_GRAPH_TRACE) */
    bool profile;       /* synchronize after every node, per-op times at free (MINFER_OP_PROFILE) */
} mf_engine_opts;

/* Takes ownership of the backends, also on failure (in priority order: the
 * first whose supports_op says yes gets a node). Per forward each split goes
 * to its backend's execute_split when it has one, else node by node through
 * execute_node; the last backend is synchronized before the output is read. */
int mf_engine_new(const mf_engine_opts *o, mf_backend **backends, int n_backends, mf_engine **out,
                  mf_error *err);
void mf_engine_free(mf_engine *e);

/* Host memory of nbytes for outputs (logits), zeroed: from the first
 * backend that offers host_alloc (CUDA: pinned, so reading an output into
 * it is one DMA), else the C heap. NULL: out of memory. Give it back with
 * mf_engine_host_free before mf_engine_free. */
void *mf_engine_host_alloc(mf_engine *e, size_t nbytes);
void mf_engine_host_free(mf_engine *e, void *p);

int mf_engine_n_backends(const mf_engine *e);
mf_backend *mf_engine_backend(const mf_engine *e, int i);

/* One forward of n_tokens tokens at positions n_past.. : fills the params'
 * backends field (and n_ctx when 0), reuses or rebuilds the graph, runs it,
 * and copies p->n_outputs rows of logits (n_vocab floats each) from the node
 * flagged MF_NODE_OUTPUT into logits (NULL: not read). tokens may be NULL
 * when the graph has no TOKENS input. n_past + n_tokens > n_ctx is an error,
 * and so is a p->n_ctx other than the engine's. */
int mf_engine_forward(mf_engine *e, mf_graph_params *p, mf_graph_build_fn build, void *build_ctx,
                      const int32_t *tokens, int32_t n_past, float *logits, mf_error *err);

/* A paged forward (p->paged): the tokens of many sequences, their positions
 * and KV slots in b (b->n_tokens == p->n_tokens; every slot row inside the
 * engine's n_ctx rows). logits: n_tokens rows. */
int mf_engine_forward_batch(mf_engine *e, mf_graph_params *p, mf_graph_build_fn build,
                            void *build_ctx, const int32_t *tokens, const mf_kv_batch *b,
                            float *logits, mf_error *err);

/* Copies KV rows [src, src + n) to [dst, dst + n) in every layer's K and V
 * regions (a copy-on-write block). The regions must be placed (reserve). */
int mf_engine_kv_copy_rows(mf_engine *e, int64_t dst, int64_t src, int64_t n, mf_error *err);

/* Reserve at session creation: makes the cached graph the one for p (as a
 * forward of p->n_tokens tokens would: n_ctx and backends filled in, the
 * graph built, assigned, fused and its buffers allocated) and places every
 * layer's KV regions, without running anything. A later forward with equal
 * params reuses that graph, so out-of-memory shows here, not mid-run.
 * Errors name the layer / buffer, its bytes and the backend. */
int mf_engine_reserve(mf_engine *e, mf_graph_params *p, mf_graph_build_fn build, void *build_ctx,
                      mf_error *err);

/* Number of graph (re)builds so far (tests check reuse). */
int64_t mf_engine_n_builds(const mf_engine *e);
/* Drops the cached graph so the next forward rebuilds (KV contents are kept). */
void mf_engine_invalidate(mf_engine *e);
/* Test hook: assign node i to backend (i % n_backends_supporting) instead of by
 * priority, to alternate backends node by node (mf_engine_opts.alternate at
 * creation). Changing it drops the cached graph. */
void mf_engine_set_alternate(mf_engine *e, bool on);

/* Participation: backend i takes part in the next builds (default: all).
 * Params.backends (filled by mf_engine_forward) is the mask of enabled
 * backends, less the GPU ones when params.gpu is false (the all-weights-
 * registered gate), so a change forces a rebuild. KV regions follow their
 * layer's attention to its new backend (contents migrated). */
void mf_engine_set_backend_enabled(mf_engine *e, int i, bool on);
/* The participation mask mf_engine_forward would use for p (p->gpu read). */
uint32_t mf_engine_participants(const mf_engine *e, const mf_graph_params *p);

/* Whether the builder may emit fused node `kind`: true when the highest-
 * priority backend taking part under p (p->gpu read) supports it. */
bool mf_engine_supports_fused(const mf_engine *e, const mf_graph_params *p, mf_fused_kind kind);

/* Host data for the k-th MF_INPUT_EXTERNAL node of the graph (in node
 * order), read at each following forward: nbytes must equal the node's
 * bytes. The pointer must stay valid until it is replaced or the engine
 * freed. (Op tests feed activations this way.) */
void mf_engine_set_external(mf_engine *e, int k, const void *data, size_t nbytes);

/* Splits of the cached graph (0 when none; tests check alternation). */
int32_t mf_engine_n_splits(const mf_engine *e);
/* The cached graph (NULL when none): node backends and buffers for tests. */
const mf_graph *mf_engine_graph(const mf_engine *e);

#endif
