/* assign.c - backend assignment (seed §2.7: fixed priority, first yes wins).
 *
 * The engine's backend list is its priority order ([cuda?, ref?, cpu]). A
 * refusal from supports_op is not an error; it makes a split. Alternate mode
 * is a test lever that spreads consecutive nodes over every backend able to
 * run them, so the split/copy machinery is exercised node by node. */
#include "engine/passes.h"

#include <stdlib.h>

/* Backends (indices into be) that take part and run node n, in priority order. */
static int supporters(const mf_node *n, mf_backend *const *be, int n_be, uint32_t mask, int *out) {
    int k = 0;
    for (int b = 0; b < n_be; b++)
        if ((mask >> b & 1u) && mf_backend_supports_op(be[b], n))
            out[k++] = b;
    return k;
}

/* The backend of node i's first live consumer, looking through RESHAPEs
 * (which have no backend of their own yet); -1 when nothing consumes it. */
static int32_t first_consumer_backend(const mf_graph *g, int32_t i) {
    for (int32_t j = i + 1; j < g->n_nodes; j++) {
        const mf_node *n = &g->nodes[j];
        if (n->flags & MF_NODE_DEAD)
            continue;
        for (int s = 0; s < n->n_src; s++) {
            if (n->src[s] != i)
                continue;
            if (n->op == MF_OP_RESHAPE) {
                int32_t b = first_consumer_backend(g, j);
                if (b >= 0)
                    return b;
            } else {
                return n->backend;
            }
        }
    }
    return -1;
}

int mf_assign_backends(mf_graph *g, mf_backend *const *be, int n_be, uint32_t mask, bool alternate,
                       mf_error *err) {
    MF_ASSERT(n_be > 0 && n_be <= MF_MAX_BACKENDS);
    int first_part = -1;
    for (int b = 0; b < n_be; b++)
        if (mask >> b & 1u) {
            first_part = b;
            break;
        }
    if (first_part < 0)
        return mf_errorf(err, "assign: no backend takes part (mask 0x%x of %d backends)", mask, n_be);

    /* KV homes first: every KV-touching node of a layer must run where that
     * layer's regions live, so the home is a backend supporting all of them. */
    int32_t n_layers = g->n_layers > 0 ? g->n_layers : 0;
    int32_t *home = mf_malloc(((size_t)n_layers + 1) * sizeof *home);
    uint32_t *ok = mf_malloc(((size_t)n_layers + 1) * sizeof *ok);
    int32_t *first_kv = mf_malloc(((size_t)n_layers + 1) * sizeof *first_kv);
    for (int32_t l = 0; l < n_layers; l++) {
        ok[l] = mask;
        home[l] = -1;
        first_kv[l] = -1;
    }
    int sup[MF_MAX_BACKENDS];
    int rc = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        mf_node *n = &g->nodes[i];
        n->backend = -1;
        int32_t l = mf_node_kv_layer(n);
        if ((n->flags & MF_NODE_DEAD) || l < 0 || l >= n_layers)
            continue;
        int k = supporters(n, be, n_be, mask, sup);
        if (k == 0) {
            rc = mf_errorf(err, "assign: no backend supports node %d '%s' (%s)", i, n->name,
                           mf_op_name(n->op));
            goto done;
        }
        uint32_t m = 0;
        for (int j = 0; j < k; j++)
            m |= 1u << sup[j];
        ok[l] &= m;
        if (first_kv[l] < 0)
            first_kv[l] = i;
    }
    for (int32_t l = 0; l < n_layers; l++) {
        if (first_kv[l] < 0)
            continue;
        int k = 0;
        for (int b = 0; b < n_be; b++)
            if (ok[l] >> b & 1u)
                sup[k++] = b;
        if (k == 0) {
            const mf_node *n = &g->nodes[first_kv[l]];
            rc = mf_errorf(err, "assign: layer %d: no backend runs all its KV ops (first: node %d '%s' (%s))",
                           l, first_kv[l], n->name, mf_op_name(n->op));
            goto done;
        }
        home[l] = sup[alternate ? l % k : 0];
    }

    /* Compute nodes. */
    for (int32_t i = 0; i < g->n_nodes; i++) {
        mf_node *n = &g->nodes[i];
        if ((n->flags & MF_NODE_DEAD) || n->op == MF_OP_INPUT || n->op == MF_OP_RESHAPE)
            continue;
        int32_t l = mf_node_kv_layer(n);
        if (l >= 0 && l < n_layers) {
            n->backend = home[l];
            continue;
        }
        int k = supporters(n, be, n_be, mask, sup);
        if (k == 0) {
            rc = mf_errorf(err, "assign: no backend supports node %d '%s' (%s)", i, n->name,
                           mf_op_name(n->op));
            goto done;
        }
        n->backend = sup[alternate ? i % k : 0];
    }
    /* Inputs live where they are first read. */
    for (int32_t i = 0; i < g->n_nodes; i++) {
        mf_node *n = &g->nodes[i];
        if ((n->flags & MF_NODE_DEAD) || n->op != MF_OP_INPUT)
            continue;
        int32_t b = first_consumer_backend(g, i);
        n->backend = b >= 0 ? b : first_part;
    }
    /* A reshape is the same bytes: it stays with its source. */
    for (int32_t i = 0; i < g->n_nodes; i++) {
        mf_node *n = &g->nodes[i];
        if (!(n->flags & MF_NODE_DEAD) && n->op == MF_OP_RESHAPE)
            n->backend = g->nodes[n->src[0]].backend;
    }
done:
    free(home);
    free(ok);
    free(first_kv);
    return rc;
}
