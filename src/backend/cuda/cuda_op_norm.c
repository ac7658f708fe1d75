/* cuda_op_norm.c - the executor of RMSNORM and QKNORM (an RMSNORM that
 * the next node folds into its quantization is deferred here). */
#include "backend/cuda/cuda_ctx.h"

/* RMSNORM / QKNORM */
int mf_cub_op_norm(const op_call *oc) {
    exec *x = oc->x;
    cu_ctx *c = x->c;
    const mf_graph *g = x->g;
    const mf_node *n = x->n;
    const int32_t node = x->id;
    const int32_t *in = oc->in;
    const int32_t out = oc->out;
    const mf_exec_args *ea = oc->ea;
    const bool may_defer = oc->may_defer;
    const int64_t ne = mf_node_nelem(n);
    const mf_node *s0 = n->n_src > 0 ? &x->g->nodes[n->src[0]] : NULL;
    const int64_t w = n->op == MF_OP_QKNORM ? n->meta.norm.head_dim : n->ne[0];
    if (w <= 0 || ne % w || mf_node_nelem(s0) != ne)
        return NODE_ERR(x, "row width %lld for %lld elements (src %lld)", (long long)w,
                        (long long)ne, (long long)mf_node_nelem(s0));
    const float *wt = NULL;
    if (n->meta.norm.weight && !(wt = mf_cub_norm_weight(x, n->meta.norm.weight, w)))
        return -1;
    const float *a = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(ne), "src0");
    float *y = a ? mf_cub_buf_ptr(x, out, mf_cub_f32b(ne), "output") : NULL;
    if (!y)
        return -1;
    if (may_defer && w == n->ne[0] && mf_cub_norm_fusable(c, g, node)) {
        c->pend_g = g;
        c->pend_node = node;
        c->pend_in = in[0];
        c->pend_out = out;
        c->pend_ea = *ea;
        return 0;
    }
    return mf_cub_run_norm(x, a, wt, y, w, ne / w, n->meta.norm.eps);
}
