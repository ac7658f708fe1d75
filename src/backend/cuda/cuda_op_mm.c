/* cuda_op_mm.c - the executors of the weight ops: MATMUL (deferred to
 * the ADD after it, or writing the logits to the host block), GETROWS and
 * FUSED_FFN. */
#include "backend/cuda/cuda_ctx.h"

/* MATMUL */
int mf_cub_op_matmul(const op_call *oc) {
    exec *x = oc->x;
    cu_ctx *c = x->c;
    const mf_graph *g = x->g;
    const mf_node *n = x->n;
    const int32_t node = x->id;
    const int32_t *in = oc->in;
    const int32_t out = oc->out;
    const mf_exec_args *ea = oc->ea;
    const bool may_defer = oc->may_defer;
    const int64_t nt = n->ne[1];
    const mf_node *s0 = n->n_src > 0 ? &x->g->nodes[n->src[0]] : NULL;
    const mf_matmul_meta *m = &n->meta.matmul;
    if (s0->ne[0] != m->n_in || n->ne[0] != m->n_out || s0->ne[1] != nt)
        return NODE_ERR(x, "input %lldx%lld, output %lldx%lld for weight '%s' n_in %lld n_out %lld",
                        (long long)s0->ne[0], (long long)s0->ne[1], (long long)n->ne[0],
                        (long long)nt, m->weight, (long long)m->n_in, (long long)m->n_out);
    const float *a = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(m->n_in * nt), "input");
    float *y = a ? mf_cub_buf_ptr(x, out, mf_cub_f32b(m->n_out * nt), "output") : NULL;
    if (!y)
        return -1;
    if (may_defer && mf_cub_add_fusable(c, g, node, nt)) {
        c->pend_g = g;
        c->pend_node = node;
        c->pend_in = in[0];
        c->pend_out = out;
        c->pend_ea = *ea;
        return 0;
    }
    float *const zc = mf_cub_zc_head(c, g, node, in[0], out, ea);
    if (zc) /* tune zc: the GEMV writes the logits where the engine reads them */
        return mf_cub_run_head_zc(x, m, a, y, out, ea, zc);
    if (x->norm) { /* the RMSNorm before it is applied while x is quantized (norm_fusable) */
        const mf_matmul_meta *mm[1] = {m};
        float *const ys[1] = {y};
        return mf_cub_run_multi(x, mm, 1, false, a, ys, NULL, nt);
    }
    if (out == in[0]) { /* other rows still read the input while rows are written */
        float *s = mf_cub_scratch(x, 0, mf_cub_f32b(m->n_out * nt));
        if (!s || mf_cub_run_matmul(x, m, a, s, nt))
            return -1;
        return mf_cub_d2d(x, y, s, mf_cub_f32b(m->n_out * nt));
    }
    return mf_cub_run_matmul(x, m, a, y, nt);
}

/* GETROWS */
int mf_cub_op_getrows(const op_call *oc) {
    exec *x = oc->x;
    cu_ctx *c = x->c;
    const mf_node *n = x->n;
    const int32_t node = x->id;
    const int32_t *in = oc->in;
    const int32_t out = oc->out;
    const int64_t ne = mf_node_nelem(n);
    const int64_t nt = n->ne[1];
    const mf_node *s0 = n->n_src > 0 ? &x->g->nodes[n->src[0]] : NULL;
    cudaStream_t st = x->c->stream;
    const int64_t w = n->ne[0];
    float *y = mf_cub_buf_ptr(x, out, mf_cub_f32b(ne), "output");
    if (!y)
        return -1;
    if (n->meta.getrows.mode == 0) {
        if (s0->dtype != MF_DTYPE_I32 || s0->ne[0] != nt)
            return NODE_ERR(x, "%lld ids (%s) for %lld rows", (long long)s0->ne[0],
                            s0->dtype == MF_DTYPE_I32 ? "i32" : "f32", (long long)nt);
        const uint32_t wtype = n->meta.getrows.wtype;
        const void *wp = mf_cub_weight_ptr(x, n->meta.getrows.weight, wtype, w, -1);
        const int32_t *ids = wp ? mf_cub_buf_ptr(x, in[0], (size_t)nt * 4, "ids") : NULL;
        if (!ids)
            return -1;
        const mf_weight *wt = mf_weights_find(c->w, n->meta.getrows.weight);
        mf_cu_getrows_args a = {.wtype = wtype, .w = wp, .row_bytes = mf_cub_row_bytes(wtype, w),
                                .n = w, .n_rows = wt->ne[1] > 0 ? wt->ne[1] : 1, .ids = ids,
                                .nt = nt, .y = y, .fault = c->fault, .node = node,
                                .pdl = c->t.pdl};
        return mf_cub_launched(x, "getrows", nt, w, mf_cu_getrows(&a, st));
    }
    const int64_t first = n->meta.getrows.first;
    if (first < 0 || first + nt > s0->ne[1] || s0->ne[0] != w)
        return NODE_ERR(x, "rows [%lld, %lld) of a %lldx%lld input", (long long)first,
                        (long long)(first + nt), (long long)s0->ne[0], (long long)s0->ne[1]);
    const uint8_t *a = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(mf_node_nelem(s0)), "src0");
    if (!a)
        return -1;
    if (out == in[0]) /* a row shift inside one buffer: memmove semantics */
        return first == 0 ? 0 : NODE_ERR(x, "row select [%lld, ...) in place", (long long)first);
    return mf_cub_d2d(x, y, a + mf_cub_f32b(first * w), mf_cub_f32b(ne));
}

/* FUSED_FFN */
int mf_cub_op_ffn(const op_call *oc) {
    exec *x = oc->x;
    cu_ctx *c = x->c;
    const mf_node *n = x->n;
    const int32_t *in = oc->in;
    const int32_t out = oc->out;
    const int64_t nt = n->ne[1];
    const mf_node *s0 = n->n_src > 0 ? &x->g->nodes[n->src[0]] : NULL;
    const mf_ffn_meta *m = &n->meta.ffn;
    const int64_t nf = m->gate.n_out;
    if (m->up.n_out != nf || n->ne[0] != nf || s0->ne[0] != m->gate.n_in || s0->ne[0] != m->up.n_in)
        return NODE_ERR(x, "gate %lldx%lld, up %lldx%lld, input width %lld, output %lld",
                        (long long)m->gate.n_in, (long long)nf, (long long)m->up.n_in,
                        (long long)m->up.n_out, (long long)s0->ne[0], (long long)n->ne[0]);
    const float *a = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(s0->ne[0] * nt), "input");
    float *y = a ? mf_cub_buf_ptr(x, out, mf_cub_f32b(nf * nt), "output") : NULL;
    const mf_matmul_meta *mm[2] = {&m->gate, &m->up};
    if (y && mf_cub_fuse_ok(x, mm, 2, nt) && m->gate.wtype == m->up.wtype) {
        float *const ys[2] = {y, NULL};
        x->q8b = c->t.ffn_q8b != 0; /* the down GEMV's int8 input too, where the kernel allows */
        return mf_cub_run_multi(x, mm, 2, true, a, ys, NULL, nt);
    }
    if (y) { /* prefill: gate and up as one mma GEMM with SwiGLU in its epilogue */
        float *const ys[2] = {y, NULL};
        const int r = mf_cub_run_mma_multi(x, mm, 2, true, a, ys, nt);
        if (r <= 0)
            return r;
    }
    float *sg = y ? mf_cub_scratch(x, 0, mf_cub_f32b(nf * nt)) : NULL;
    float *su = sg ? mf_cub_scratch(x, 1, mf_cub_f32b(nf * nt)) : NULL;
    if (su && mf_cub_fuse_ok(x, mm, 2, nt)) {
        float *const ys[2] = {sg, su};
        if (mf_cub_run_multi(x, mm, 2, false, a, ys, NULL, nt))
            return -1;
        return mf_cub_run_ew(x, MF_CU_EW_SWIGLU, sg, su, y, nf * nt, nf * nt, 0);
    }
    if (su && x->norm) /* norm_fusable promised the fused path */
        return NODE_ERR(x, "folded RMSNorm but the matmuls cannot take the int8 GEMV (nt %lld)",
                        (long long)nt);
    if (!su || mf_cub_run_matmul(x, &m->gate, a, sg, nt) || mf_cub_run_matmul(x, &m->up, a, su, nt))
        return -1;
    return mf_cub_run_ew(x, MF_CU_EW_SWIGLU, sg, su, y, nf * nt, nf * nt, 0);
}
