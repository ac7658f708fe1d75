/* backend.c - the generic half of the backend contract: dispatch through a
 * backend's op table, the all-weights-registered gate, holders. */
#include "backend/backend.h"

#include <string.h>

int mf_op_nothing(mf_backend *b, const mf_graph *g, const mf_node_call *c, const mf_exec_args *a,
                  mf_error *err) {
    (void)b, (void)g, (void)c, (void)a, (void)err;
    return 0;
}

void mf_backend_options_default(mf_backend_options *o) {
    memset(o, 0, sizeof *o);
    o->n_threads = 1;
    o->gpu_timeout_ms = 10000;
    o->graphs = true;
    o->fusion = true;
    o->cache_type = MF_TYPE_F32;
    o->metal.gemm = 2;
    o->metal.fuse_qkv = o->metal.fuse_ffn = o->metal.fuse_qkv_norm = true;
}

bool mf_backend_supports_op(const mf_backend *b, const mf_node *n) {
    if ((unsigned)n->op >= MF_OP_COUNT)
        return false;
    const mf_op_entry *e = &b->ops->op_table[n->op];
    return e->exec && (!e->can_run || e->can_run(b, n));
}

int mf_backend_execute_node(mf_backend *b, const mf_graph *g, const mf_node_call *c,
                            const mf_exec_args *a, mf_error *err) {
    if (c->node < 0 || c->node >= g->n_nodes)
        return mf_errorf(err, "%s: node %d outside the graph's %d nodes", b->ops->name(b), c->node,
                         g->n_nodes);
    const mf_node *n = &g->nodes[c->node];
    if (!mf_backend_supports_op(b, n))
        return mf_errorf(err, "%s: node %d '%s' (%s): not supported by this backend", b->ops->name(b),
                         c->node, n->name, (unsigned)n->op < MF_OP_COUNT ? mf_op_name(n->op) : "?");
    return b->ops->op_table[n->op].exec(b, g, c, a, err);
}

bool mf_backend_weights_on(const mf_backend *b, const char *const *names, int32_t n,
                           const char **missing) {
    if (missing)
        *missing = NULL;
    if (!b->ops->has_weight)
        return true;
    for (int32_t i = 0; i < n; i++)
        if (!b->ops->has_weight(b, names[i])) {
            if (missing)
                *missing = names[i];
            return false;
        }
    return true;
}

void mf_backend_retain(mf_backend *b) {
    b->extra_refs++;
}

void mf_backend_free(mf_backend *b) {
    if (!b)
        return;
    if (b->extra_refs > 0) {
        b->extra_refs--;
        return;
    }
    b->ops->free(b);
}
