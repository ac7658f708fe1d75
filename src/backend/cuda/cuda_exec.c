/* cuda_exec.c - one node to its op's executor (exec_now; the executors
 * live in cuda_op_*.c by family), and the fusions planned over a forward's
 * nodes: MATMUL + ADD, RMSNORM folded into its consumer, the rope-store
 * folded into the short attention. */
#include "backend/cuda/cuda_ctx.h"

/* Whether a live node from index `from` on reads node's output: a fold
 * that never writes that output (or writes it late) needs none to. */
bool mf_cub_read_from(const mf_graph *g, int32_t node, int32_t from) {
    for (int32_t i = from; i < g->n_nodes; i++) {
        const mf_node *v = &g->nodes[i];
        if (v->flags & MF_NODE_DEAD)
            continue;
        for (int32_t k = 0; k < v->n_src && k < MF_MAX_SRC; k++)
            if (v->src[k] == node)
                return true;
    }
    return false;
}

/* Launches the rope-store rope_deferrable left pending, if any. */
int mf_cub_flush_rope(cu_ctx *c, mf_error *err) {
    if (c->rs_node < 0)
        return 0;
    exec xx = {.c = c, .g = c->rs_g, .n = &c->rs_g->nodes[c->rs_node], .id = c->rs_node, .err = err};
    c->rs_node = -1;
    return mf_cub_launched(&xx, c->rs_args.q_norm ? "rope_store(qk norm)" : "rope_store", 1, c->rs_args.rq.n_head,
                    mf_cu_rope_store(&c->rs_args, c->stream));
}

int mf_cub_d2d(exec *x, void *dst, const void *src, size_t nbytes) {
    if (dst == src || nbytes == 0)
        return 0;
    cudaError_t e = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, x->c->stream);
    return mf_cub_launched(x, "memcpy d2d", (int64_t)nbytes, 1, e);
}

/* ---- MATMUL + ADD (tune fuse_add) ----------------------------------------------- */

/* Rule: a decode MATMUL on the int8 tier whose only consumer is the next
 * node, an ADD of two operands of its size (the residual add after Wo and
 * Wdown), and which is no graph output, is deferred: exec_node records it
 * instead of launching. When the next call is that ADD, one GEMV writes
 * add_out = residual + W x (+ b); the MATMUL's own output buffer is never
 * written (nothing else reads it). Any other call, a host copy, a
 * synchronize, begin/end_forward, or the end of a replayed call list first
 * launches the deferred MATMUL plainly (flush_pending), so correctness never
 * depends on the scheduler's order. */
bool mf_cub_add_fusable(const cu_ctx *c, const mf_graph *g, int32_t node, int64_t nt) {
    const mf_node *n = &g->nodes[node];
    const mf_matmul_meta *m = &n->meta.matmul;
    if (!c->t.fuse_add || nt > 8 || node + 1 >= g->n_nodes || (n->flags & MF_NODE_OUTPUT) ||
        !q8_tier(c) || !mf_cu_q8_supported(m->wtype, m->n_in))
        return false;
    const mf_node *a = &g->nodes[node + 1];
    if (a->op != MF_OP_ADD || (a->flags & MF_NODE_DEAD) || a->n_src != 2 ||
        (a->src[0] == node) == (a->src[1] == node) || mf_node_nelem(a) != mf_node_nelem(n) ||
        mf_node_nelem(&g->nodes[a->src[0]]) != mf_node_nelem(a) ||
        mf_node_nelem(&g->nodes[a->src[1]]) != mf_node_nelem(a))
        return false;
    return !mf_cub_read_from(g, node, node + 2);
}

/* RMSNORM + quantization (tune fuse_norm), the same deferral: an
 * RMSNORM over whole rows whose only consumer is the next node, a
 * FUSED_QKV(_NORM) or FUSED_FFN whose matmuls all run on the int8 tier at
 * this token count, is not launched; that node then quantizes the norm's
 * input with the norm applied (mf_cu_q8_multi_args.norm) and runs its
 * matmuls through the multi-weight GEMV. The norm's output buffer is never
 * written. A plain MATMUL consumer (the output norm -> lm_head) folds the
 * same way unless an ADD after it would take it (add_fusable), and only
 * with tune norm_mm (c->t.norm_mm; default on). */
bool mf_cub_norm_fusable(const cu_ctx *c, const mf_graph *g, int32_t node) {
    const mf_node *n = &g->nodes[node];
    if (!c->t.fuse_norm || n->op != MF_OP_RMSNORM || n->ne[1] > 8 || node + 1 >= g->n_nodes ||
        (n->flags & MF_NODE_OUTPUT) || !q8_tier(c))
        return false;
    const mf_node *u = &g->nodes[node + 1];
    if ((u->flags & MF_NODE_DEAD) || u->n_src < 1 || u->src[0] != node || u->ne[1] != n->ne[1])
        return false;
    const mf_matmul_meta *mm[3];
    int k = 0;
    if (u->op == MF_OP_FUSED_QKV || u->op == MF_OP_FUSED_QKV_NORM) {
        mm[k++] = &u->meta.qkv.q;
        mm[k++] = &u->meta.qkv.k;
        mm[k++] = &u->meta.qkv.v;
    } else if (u->op == MF_OP_FUSED_FFN) {
        mm[k++] = &u->meta.ffn.gate;
        mm[k++] = &u->meta.ffn.up;
    } else if (u->op == MF_OP_MATMUL && c->t.norm_mm && u->n_src == 1 && !mf_cub_add_fusable(c, g, node + 1, u->ne[1])) {
        mm[k++] = &u->meta.matmul;
    } else {
        return false;
    }
    for (int i = 0; i < k; i++)
        if (!mf_cub_mm_ok(mm[i]) || !mf_cu_q8_supported(mm[i]->wtype, mm[i]->n_in) || mm[i]->n_in != n->ne[0])
            return false;
    for (int32_t s = 1; s < u->n_src && s < MF_MAX_SRC; s++) /* the norm is u's input 0 only */
        if (u->src[s] == node)
            return false;
    return !mf_cub_read_from(g, node, node + 2);
}

static int exec_node(mf_backend *b, const mf_graph *g, int32_t node, const int32_t *in, int32_t out,
                     mf_kv_pair kv, const mf_exec_args *ea, mf_error *err, bool may_defer,
                     const exec *fold);

/* Launches the deferred MATMUL or RMSNORM, if any, plainly. */
int mf_cub_flush_pending(mf_backend *b, mf_error *err) {
    cu_ctx *c = CX(b);
    if (mf_cub_flush_rope(c, err))
        return -1;
    if (c->pend_node < 0)
        return 0;
    const int32_t node = c->pend_node;
    int32_t in[MF_MAX_SRC] = {c->pend_in};
    c->pend_node = -1;
    return exec_node(b, c->pend_g, node, in, c->pend_out, (mf_kv_pair){-1, -1}, &c->pend_ea, err, false,
                     NULL);
}

/* The ADD (node `node`) that consumes the deferred MATMUL: one GEMV with the
 * other operand as the residual. */
static int exec_add_fused(mf_backend *b, const mf_graph *g, int32_t node, const int32_t *in, int32_t out,
                          mf_error *err) {
    cu_ctx *c = CX(b);
    exec xx = {.c = c, .g = g, .n = &g->nodes[node], .id = node, .err = err,
               .npast_dev = c->capturing ? c->dev_npast : NULL};
    exec *x = &xx;
    const mf_node *mmn = &g->nodes[c->pend_node];
    const mf_matmul_meta *m = &mmn->meta.matmul;
    const int64_t nt = mmn->ne[1], ne = m->n_out * nt;
    const int r = x->n->src[0] == c->pend_node ? 1 : 0; /* the residual operand */
    const int32_t pin = c->pend_in;
    c->pend_node = -1;
    c->n_fused_add++;
    if (mf_node_nelem(x->n) != ne)
        return NODE_ERR(x, "fused residual add of %lld elements after a matmul of %lld", (long long)mf_node_nelem(x->n),
                        (long long)ne);
    const float *a = mf_cub_buf_ptr(x, pin, mf_cub_f32b(m->n_in * nt), "matmul input");
    const float *res = a ? mf_cub_buf_ptr(x, in[r], mf_cub_f32b(ne), "residual") : NULL;
    float *y = res ? mf_cub_buf_ptr(x, out, mf_cub_f32b(ne), "output") : NULL;
    if (!y)
        return -1;
    const mf_matmul_meta *mm[1] = {m};
    float *const ys[1] = {y};
    const float *const rs[1] = {res};
    return mf_cub_run_multi(x, mm, 1, false, a, ys, rs, nt);
}

/* Launches node `node` now (execute_node's contract), apart from the MATMUL
 * that tune fuse_add defers to its ADD. */
int mf_cub_exec_now(mf_backend *b, const mf_graph *g, int32_t node, const int32_t *in, int32_t out,
                    mf_kv_pair kv, const mf_exec_args *ea, mf_error *err) {
    cu_ctx *c = CX(b);
    c->d2h_bytes = 0; /* a launch after the early logits copy may rewrite its buffer */
    if (c->rs_node >= 0 && !(g == c->rs_g && node == c->rs_node + 1) && mf_cub_flush_rope(c, err))
        return -1; /* tune short_rope: only the ATTN right after it takes the rope-store */
    if (c->pend_node >= 0) {
        const bool next = g == c->pend_g && node == c->pend_node + 1 && node < g->n_nodes;
        const mf_node *pn = &c->pend_g->nodes[c->pend_node];
        if (next && pn->op == MF_OP_MATMUL && g->nodes[node].op == MF_OP_ADD)
            return exec_add_fused(b, g, node, in, out, err);
        if (next && pn->op == MF_OP_RMSNORM && g->nodes[node].n_src > 0 && g->nodes[node].src[0] == c->pend_node) {
            /* the consumer quantizes RMSNorm(norm input) itself */
            exec nf = {.c = c, .g = g, .n = pn, .id = c->pend_node, .err = err, .norm = true,
                       .norm_eps = pn->meta.norm.eps};
            const int32_t pin = c->pend_in;
            c->pend_node = -1;
            c->n_fused_norm++;
            if (!(nf.norm_x = mf_cub_buf_ptr(&nf, pin, mf_cub_f32b(mf_node_nelem(pn)), "norm input")))
                return -1;
            if (pn->meta.norm.weight && !(nf.norm_w = mf_cub_norm_weight(&nf, pn->meta.norm.weight, pn->ne[0])))
                return -1;
            return exec_node(b, g, node, in, out, kv, ea, err, false, &nf);
        }
        if (mf_cub_flush_pending(b, err))
            return -1;
    }
    return exec_node(b, g, node, in, out, kv, ea, err, true, NULL);
}

static int op_input(const op_call *oc) {
    (void)oc; /* the host fills it */
    return 0;
}

/* Each op's executor, by family: cuda_op_ew.c, cuda_op_norm.c,
 * cuda_op_mm.c, cuda_op_attn.c. */
static int (*const op_exec[MF_OP_COUNT])(const op_call *oc) = {
    [MF_OP_INPUT] = op_input,
    [MF_OP_ADD] = mf_cub_op_add,
    [MF_OP_SWIGLU] = mf_cub_op_add,
    [MF_OP_MUL] = mf_cub_op_mul,
    [MF_OP_SCALE] = mf_cub_op_unary,
    [MF_OP_SILU] = mf_cub_op_unary,
    [MF_OP_SOFTMAX] = mf_cub_op_softmax,
    [MF_OP_VIEW] = mf_cub_op_copy,
    [MF_OP_PERMUTE] = mf_cub_op_copy,
    [MF_OP_RESHAPE] = mf_cub_op_reshape,
    [MF_OP_RMSNORM] = mf_cub_op_norm,
    [MF_OP_QKNORM] = mf_cub_op_norm,
    [MF_OP_MATMUL] = mf_cub_op_matmul,
    [MF_OP_GETROWS] = mf_cub_op_getrows,
    [MF_OP_FUSED_FFN] = mf_cub_op_ffn,
    [MF_OP_ROPE] = mf_cub_op_rope,
    [MF_OP_KVCACHE_STORE] = mf_cub_op_kv_store,
    [MF_OP_KVCACHE_LOAD] = mf_cub_op_kv_load,
    [MF_OP_ATTN] = mf_cub_op_attn,
    [MF_OP_FUSED_QKV] = mf_cub_op_qkv,
    [MF_OP_FUSED_QKV_NORM] = mf_cub_op_qkv,
    [MF_OP_QKV_BIAS_ROPE_STORE] = mf_cub_op_qkv,
    [MF_OP_ATTN_PAGED] = mf_cub_op_attn_paged,
};

static int exec_node(mf_backend *b, const mf_graph *g, int32_t node, const int32_t *in, int32_t out,
                     mf_kv_pair kv, const mf_exec_args *ea, mf_error *err, bool may_defer,
                     const exec *fold) {
    cu_ctx *c = CX(b);
    if (node < 0 || node >= g->n_nodes)
        return mf_errorf(err, "cuda: node %d outside the graph (%d nodes)", node, g->n_nodes);
    exec xx = {.c = c, .g = g, .n = &g->nodes[node], .id = node, .err = err,
               .npast_dev = c->capturing ? c->dev_npast : NULL};
    if (fold) { /* the RMSNorm folded into this node (tune fuse_norm) */
        xx.norm = true;
        xx.norm_x = fold->norm_x;
        xx.norm_w = fold->norm_w;
        xx.norm_eps = fold->norm_eps;
    }
    exec *x = &xx;
    const mf_node *n = x->n;
    if (!mf_cub_supports_op(b, n))
        return NODE_ERR(x, "the CUDA backend refused this op at build time (supports_op)%s", "");
    if ((unsigned)n->op >= MF_OP_COUNT || !op_exec[n->op])
        return NODE_ERR(x, "no CUDA arm for this op%s", "");
    const op_call oc = {.x = x, .in = in, .out = out, .kv = kv, .ea = ea, .may_defer = may_defer};
    return op_exec[n->op](&oc);
}
