/* fuse.c - the fusion pass, run after assignment (so it can ask the backend
 * that will run the result) and before allocation (so dead nodes get no
 * buffer). FUSED_QKV / FUSED_FFN are not made here: the builder emits them
 * when the params say so (mf_engine_supports_fused). */
#include "engine/passes.h"

int mf_fuse(mf_graph *g, mf_backend *const *be, const mf_graph_params *p) {
    if (!p->fuse_swiglu)
        return 0;
    int fused = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        mf_node *n = &g->nodes[i];
        if ((n->flags & MF_NODE_DEAD) || n->op != MF_OP_MUL || n->backend < 0)
            continue;
        mf_backend *b = be[n->backend];
        if (!b->ops->supports_fused(b, MF_FUSE_SWIGLU))
            continue;
        for (int s = 0; s < 2; s++) {
            int32_t si = n->src[s], other = n->src[1 - s];
            mf_node *silu = &g->nodes[si];
            if (silu->op != MF_OP_SILU || (silu->flags & (MF_NODE_DEAD | MF_NODE_OUTPUT)) ||
                mf_graph_n_consumers(g, si) != 1 || si == other)
                continue;
            /* SWIGLU needs both operands whole (no one-row broadcast). */
            const mf_node *o = &g->nodes[other];
            if (mf_node_nelem(o) != mf_node_nelem(silu) || o->ne[0] != silu->ne[0])
                continue;
            n->op = MF_OP_SWIGLU;
            n->src[0] = silu->src[0];
            n->src[1] = other;
            silu->flags |= MF_NODE_DEAD;
            silu->backend = -1;
            fused++;
            break;
        }
    }
    return fused;
}
