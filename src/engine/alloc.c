/* alloc.c - liveness-based buffer assignment and the split table.
 *
 * One walk in node order over an assigned (and fused) graph. Each value gets
 * a buffer from its backend's pool when it is produced and gives it back after
 * its last consumer, so the pool recycles it for a later value; the pool's
 * free list is exact-size, and we ask for size classes so values of nearby
 * sizes share buffers. What stays out of the recycle economy: INPUT buffers
 * (born before the walk, since the host fills them before anything runs),
 * OUTPUT values (live to the end), and split staging buffers (alloc_fresh).
 * Every buffer is reserved here, so running out of memory happens at build,
 * never in the middle of a forward. */
#include "engine/passes.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

bool mf_node_executes(const mf_node *n) {
    return !(n->flags & MF_NODE_DEAD) && n->op != MF_OP_INPUT && n->op != MF_OP_RESHAPE;
}

size_t mf_size_class(size_t nbytes) {
    if (nbytes <= 256)
        return nbytes;
    size_t p = 1;
    while (p <= nbytes / 2)
        p *= 2; /* p = largest power of two <= nbytes */
    size_t step = p / 4;
    return (nbytes + step - 1) / step * step;
}

/* Ops that may write their output into src0's buffer when src0 dies at them:
 * each output element depends only on the same element (or row) of src0,
 * read before it is written, and every backend handles out == in. */
static bool inplace_op(mf_op op) {
    switch (op) {
    case MF_OP_ADD:
    case MF_OP_MUL:
    case MF_OP_SCALE:
    case MF_OP_SILU:
    case MF_OP_SWIGLU:
    case MF_OP_RMSNORM:
    case MF_OP_QKNORM:
    case MF_OP_ROPE:
    case MF_OP_SOFTMAX:
        return true;
    default:
        return false;
    }
}

/* Per-backend byte flags indexed by buffer id (ids are small pool indices). */
typedef struct idset {
    uint8_t *v;
    int32_t n;
} idset;

static void idset_set(idset *s, int32_t id, uint8_t val) {
    MF_ASSERT(id >= 0);
    if (id >= s->n) {
        int32_t nn = s->n ? s->n : 64;
        while (nn <= id)
            nn *= 2;
        s->v = mf_realloc(s->v, (size_t)nn);
        memset(s->v + s->n, 0, (size_t)(nn - s->n));
        s->n = nn;
    }
    s->v[id] = val;
}

static uint8_t idset_get(const idset *s, int32_t id) {
    return (id >= 0 && id < s->n) ? s->v[id] : 0;
}

static void own_push(mf_plan *p, int32_t b, int32_t id) {
    if (p->n_own == p->cap_own) {
        p->cap_own = p->cap_own ? p->cap_own * 2 : 64;
        p->own_backend = mf_realloc(p->own_backend, (size_t)p->cap_own * sizeof *p->own_backend);
        p->own_id = mf_realloc(p->own_id, (size_t)p->cap_own * sizeof *p->own_id);
    }
    p->own_backend[p->n_own] = b;
    p->own_id[p->n_own] = id;
    p->n_own++;
}

typedef struct walk {
    mf_backend *const *be;
    int n_be;
    idset held[MF_MAX_BACKENDS]; /* ids currently holding a live value */
    idset seen[MF_MAX_BACKENDS]; /* ids ever handed out to this plan */
    mf_plan *plan;
} walk;

static int32_t take(walk *w, int32_t b, size_t nbytes, mf_error *err) {
    size_t cls = mf_size_class(nbytes);
    int32_t id = w->be[b]->ops->alloc_buffer(w->be[b], cls, err);
    if (id < 0)
        return -1;
    MF_ASSERT(!idset_get(&w->held[b], id)); /* the pool handed out a live buffer */
    idset_set(&w->held[b], id, 1);
    if (!idset_get(&w->seen[b], id)) {
        idset_set(&w->seen[b], id, 1);
        w->plan->n_buffers[b]++;
        w->plan->bytes[b] += cls;
    }
    return id;
}

static void give(walk *w, int32_t b, int32_t id) {
    MF_ASSERT(idset_get(&w->held[b], id));
    idset_set(&w->held[b], id, 0);
    w->be[b]->ops->free_buffer(w->be[b], id);
}

/* Moves everything still held into plan->own (end of walk or error path). */
static void collect_held(walk *w) {
    for (int b = 0; b < w->n_be; b++) {
        for (int32_t id = 0; id < w->held[b].n; id++)
            if (w->held[b].v[id])
                own_push(w->plan, b, id);
        free(w->held[b].v);
        free(w->seen[b].v);
    }
}

static int build_splits(mf_graph *g, walk *w, mf_error *err) {
    mf_plan *p = w->plan;
    int32_t cap = 0;
    mf_split *cur = NULL;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        mf_node *n = &g->nodes[i];
        if (!mf_node_executes(n))
            continue;
        if (!cur || cur->backend != n->backend) {
            if (p->n_splits == cap) {
                cap = cap ? cap * 2 : 16;
                p->splits = mf_realloc(p->splits, (size_t)cap * sizeof *p->splits);
            }
            cur = &p->splits[p->n_splits++];
            memset(cur, 0, sizeof *cur);
            cur->backend = n->backend;
            cur->first = i;
        }
        cur->last = i;
        cur->n_nodes++;
        for (int s = 0; s < n->n_src; s++) {
            int32_t src = n->src[s];
            int32_t bb = p->buf_backend[src];
            if (bb < 0 || bb == cur->backend)
                continue;
            bool dup = false;
            for (int32_t k = 0; k < cur->n_inputs; k++)
                dup |= cur->inputs[k] == src;
            if (dup)
                continue;
            cur->inputs = mf_realloc(cur->inputs, (size_t)(cur->n_inputs + 1) * sizeof *cur->inputs);
            cur->staging = mf_realloc(cur->staging, (size_t)(cur->n_inputs + 1) * sizeof *cur->staging);
            size_t nb = mf_node_nbytes(&g->nodes[src]);
            mf_backend *b = w->be[cur->backend];
            int32_t id = b->ops->alloc_fresh(b, nb, err);
            if (id < 0)
                return mf_error_prefix(err, "alloc: staging for node %d '%s' on %s", src,
                                       g->nodes[src].name, b->ops->name(b));
            own_push(p, cur->backend, id);
            cur->inputs[cur->n_inputs] = src;
            cur->staging[cur->n_inputs] = id;
            cur->n_inputs++;
            if (nb > p->max_copy)
                p->max_copy = nb;
        }
    }
    return 0;
}

int mf_alloc_plan(mf_graph *g, mf_backend *const *be, int n_be, mf_plan *plan, mf_error *err) {
    MF_ASSERT(n_be > 0 && n_be <= MF_MAX_BACKENDS);
    memset(plan, 0, sizeof *plan);
    int32_t nn = g->n_nodes;
    plan->n_nodes = nn;
    plan->buf_backend = mf_malloc(((size_t)nn + 1) * sizeof *plan->buf_backend);
    int32_t *root = mf_malloc(((size_t)nn + 1) * sizeof *root);
    int32_t *last = mf_malloc(((size_t)nn + 1) * sizeof *last);
    uint8_t *moved = mf_calloc((size_t)nn + 1, 1); /* buffer passed on in place */
    walk w = {.be = be, .n_be = n_be, .plan = plan};
    int rc = 0;

    /* Liveness on alias roots: a RESHAPE shares its source's bytes, so its
     * consumers extend the source's life. */
    for (int32_t i = 0; i < nn; i++) {
        mf_node *n = &g->nodes[i];
        n->buf = -1;
        plan->buf_backend[i] = -1;
        root[i] = (n->op == MF_OP_RESHAPE && !(n->flags & MF_NODE_DEAD)) ? root[n->src[0]] : i;
        last[i] = i;
        if (n->flags & MF_NODE_DEAD)
            continue;
        MF_ASSERT(n->backend >= 0 && n->backend < n_be);
        for (int s = 0; s < n->n_src; s++) {
            int32_t r = root[n->src[s]];
            if (last[r] < i)
                last[r] = i;
        }
        if (n->flags & MF_NODE_OUTPUT)
            last[root[i]] = INT32_MAX;
    }

    for (int32_t i = 0; i < nn; i++) {
        mf_node *n = &g->nodes[i];
        if ((n->flags & MF_NODE_DEAD) || n->op != MF_OP_INPUT || mf_node_nbytes(n) == 0)
            continue;
        if ((n->buf = take(&w, n->backend, mf_node_nbytes(n), err)) < 0)
            goto fail;
        plan->buf_backend[i] = n->backend;
    }

    for (int32_t i = 0; i < nn; i++) {
        mf_node *n = &g->nodes[i];
        if (n->flags & MF_NODE_DEAD)
            continue;
        size_t nb = mf_node_nbytes(n);
        if (n->op == MF_OP_RESHAPE) {
            n->buf = g->nodes[root[i]].buf;
            plan->buf_backend[i] = plan->buf_backend[root[i]];
        } else if (n->op != MF_OP_INPUT && nb > 0) {
            int32_t s0 = n->n_src > 0 ? n->src[0] : -1;
            int32_t r = s0 >= 0 ? root[s0] : -1;
            if (r >= 0 && inplace_op(n->op) && last[r] == i && !moved[r] && g->nodes[r].buf >= 0 &&
                plan->buf_backend[r] == n->backend && mf_node_nbytes(&g->nodes[s0]) == nb &&
                g->nodes[s0].dtype == n->dtype) {
                n->buf = g->nodes[r].buf;
                moved[r] = 1;
                plan->n_inplace++;
            } else if ((n->buf = take(&w, n->backend, nb, err)) < 0) {
                goto fail;
            }
            plan->buf_backend[i] = n->backend;
        }
        /* Values whose last consumer is this node die now (after the output
         * was taken, so an output never lands on a buffer it still reads). */
        for (int s = 0; s < n->n_src; s++) {
            int32_t r = root[n->src[s]];
            bool first = true;
            for (int t = 0; t < s; t++)
                first &= root[n->src[t]] != r;
            if (first && last[r] == i && !moved[r] && g->nodes[r].buf >= 0) {
                give(&w, plan->buf_backend[r], g->nodes[r].buf);
                moved[r] = 1;
            }
        }
        if (root[i] == i && last[i] == i && n->buf >= 0 && !moved[i]) {
            give(&w, plan->buf_backend[i], n->buf); /* nobody reads it */
            moved[i] = 1;
        }
    }
    if (build_splits(g, &w, err))
        goto fail;
    goto out;
fail:
    rc = -1;
out:
    collect_held(&w);
    free(root);
    free(last);
    free(moved);
    if (rc)
        mf_plan_free(plan, be);
    return rc;
}

void mf_plan_free(mf_plan *plan, mf_backend *const *be) {
    for (int32_t i = 0; i < plan->n_own; i++) {
        mf_backend *b = be[plan->own_backend[i]];
        b->ops->free_buffer(b, plan->own_id[i]);
    }
    for (int32_t s = 0; s < plan->n_splits; s++) {
        free(plan->splits[s].inputs);
        free(plan->splits[s].staging);
    }
    free(plan->splits);
    free(plan->buf_backend);
    free(plan->own_backend);
    free(plan->own_id);
    memset(plan, 0, sizeof *plan);
}
