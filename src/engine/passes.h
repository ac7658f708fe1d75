/* passes.h - the build-time passes between the builder and the scheduler
 * (private to src/engine and its tests; everyone else goes through engine.h).
 *
 *   assign (assign.c): node -> backend index (priority or alternate mode)
 *   fuse   (fuse.c):   SILU + MUL -> SWIGLU where the backend fuses it
 *   alloc  (alloc.c):  node -> buffer id by liveness; splits and staging
 */
#ifndef MF_ENGINE_PASSES_H
#define MF_ENGINE_PASSES_H

#include "backend/backend.h"
#include "ir/graph.h"

#define MF_MAX_BACKENDS 8

/* Sets every live node's backend. `mask` bit i: backend i takes part.
 * Priority mode: the first participating backend whose supports_op says yes.
 * Alternate mode: node i goes to the (i mod k)-th of the k that support it.
 * INPUT nodes go to their first consumer's backend, RESHAPE to its source's;
 * every KV-touching node of one layer lands on one backend (the layer's KV
 * home), which in alternate mode rotates with the layer index. A node nobody
 * takes is an error naming it. */
int mf_assign_backends(mf_graph *g, mf_backend *const *be, int n_be, uint32_t mask, bool alternate,
                       mf_error *err);

/* Fusion pass: MUL(SILU(a), b) (either operand order) whose SILU has no other
 * consumer becomes SWIGLU(a, b) when fuse_swiglu is set and the MUL's backend
 * supports_fused(MF_FUSE_SWIGLU); the SILU is marked DEAD. Returns the number
 * of fusions. */
int mf_fuse(mf_graph *g, mf_backend *const *be, const mf_graph_params *p);

/* A split: a maximal run of consecutive executable nodes on one backend.
 * INPUT (filled by the host), RESHAPE (no work) and DEAD nodes are not
 * executed and do not break runs. inputs[i] is a node whose value lives on
 * another backend; staging[i] its copy's buffer on this one (alloc_fresh). */
typedef struct mf_split {
    int32_t backend;
    int32_t first, last; /* node range, inclusive */
    int32_t n_nodes;     /* executable nodes in the range */
    int32_t n_inputs;
    int32_t *inputs;
    int32_t *staging;
} mf_split;

typedef struct mf_plan {
    int32_t n_nodes;
    int32_t *buf_backend;  /* per node: backend whose pool holds node.buf (-1: none) */
    mf_split *splits;
    int32_t n_splits;
    size_t max_copy;       /* largest cross-backend copy (host bounce buffer size) */
    /* every (backend, id) the plan holds at the end of the walk, to free */
    int32_t *own_backend, *own_id;
    int32_t n_own, cap_own;
    int32_t n_buffers[MF_MAX_BACKENDS]; /* distinct alloc_buffer ids per backend */
    size_t bytes[MF_MAX_BACKENDS];      /* bytes of those buffers */
    int32_t n_inplace;                  /* nodes that write into src0's buffer */
} mf_plan;

/* Executable by the scheduler (not INPUT, RESHAPE or DEAD). */
bool mf_node_executes(const mf_node *n);
/* Byte class the allocator asks the pool for (buffers of one class are
 * interchangeable): exact up to 256, then steps of a quarter power of two. */
size_t mf_size_class(size_t nbytes);

/* Liveness allocation of an assigned graph: sets node.buf and fills plan
 * (splits, staging via alloc_fresh). On error nothing stays allocated. */
int mf_alloc_plan(mf_graph *g, mf_backend *const *be, int n_be, mf_plan *plan, mf_error *err);
/* Returns every buffer the plan holds to its backend and clears plan. */
void mf_plan_free(mf_plan *plan, mf_backend *const *be);

#endif
