/* cuda_exec.c - one node to kernels (exec_now), and the fusions planned
 * over a forward's nodes: MATMUL + ADD, RMSNORM folded into its consumer,
 * the rope-store folded into the short attention. */
#include "backend/cuda/cuda_ctx.h"

/* The layer's K (which 0) or V region, checked to hold `rows` rows. */
static void *kv_region(exec *x, int32_t id, const mf_exec_args *ea, int64_t rows, const char *which) {
    const uint32_t t = ea->kv_type;
    if (t != MF_TYPE_F32 && t != MF_TYPE_F16 && t != MF_TYPE_Q8_0) {
        NODE_ERR(x, "KV cache type %s (%u) is not f32, f16 or q8_0", mf_type_name(t), t);
        return NULL;
    }
    const size_t rb = mf_cub_row_bytes(t, x->g->kv_dim);
    if (rb == 0) {
        NODE_ERR(x, "KV cache type %s needs kv_dim %% 32 == 0, kv_dim is %lld", mf_type_name(t),
                 (long long)x->g->kv_dim);
        return NULL;
    }
    if (id < 0) {
        NODE_ERR(x, "layer %d has no %s region", mf_node_kv_layer(x->n), which);
        return NULL;
    }
    if (rows > ea->n_ctx) {
        NODE_ERR(x, "needs KV rows [0, %lld) but n_ctx is %d", (long long)rows, ea->n_ctx);
        return NULL;
    }
    return mf_cub_buf_ptr(x, id, rb * (size_t)rows, which);
}

static int run_store(exec *x, void *kc, void *vc, const mf_exec_args *ea, const float *k,
                     const float *v, int64_t nt) {
    mf_cu_kv_args a = {.kv_type = ea->kv_type, .cache = kc, .kv_dim = x->g->kv_dim,
                       .pos0 = ea->n_past, .pos0_dev = x->npast_dev, .nt = nt, .src = k};
    if (mf_cub_launched(x, "kv_store(k)", nt, x->g->kv_dim, mf_cu_kv_store(&a, x->c->stream)))
        return -1;
    a.cache = vc;
    a.src = v;
    return mf_cub_launched(x, "kv_store(v)", nt, x->g->kv_dim, mf_cu_kv_store(&a, x->c->stream));
}

/* The four launches of run_rope(k in place), run_store, run_rope(q -> y) as
 * one (mf_cu_rope_store), with the same arguments and checks. */
/* qn / kn non-NULL: the QkNorm of sq / sk goes into the same launch
 * (mf_cu_rope_store_args.q_norm). */
/* defer non-NULL (tune short_rope): the arguments go there, nothing
 * is launched. */
static int run_rope_store(exec *x, const mf_qkv_meta *m, float *sq, float *sk, const float *sv, float *y,
                          void *kc, void *vc, const mf_exec_args *ea, const int32_t *pos, int64_t nt,
                          const float *qn, const float *kn, mf_cu_rope_store_args *defer) {
    const mf_rope_meta *r[2] = {&m->rope_q, &m->rope_k};
    for (int i = 0; i < 2; i++)
        if (r[i]->n_head <= 0 || r[i]->head_dim <= 0 || r[i]->n_rot <= 0 || r[i]->n_rot > r[i]->head_dim ||
            r[i]->n_rot % 2)
            return NODE_ERR(x, "rope n_head %d head_dim %d n_rot %d", r[i]->n_head, r[i]->head_dim,
                            r[i]->n_rot);
    mf_cu_rope_store_args a;
    memset(&a, 0, sizeof a);
    mf_cu_rope_args *ra[2] = {&a.rq, &a.rk};
    for (int i = 0; i < 2; i++)
        *ra[i] = (mf_cu_rope_args){.x = i ? sk : sq, .y = i ? sk : y, .pos = pos, .pos0 = ea->n_past,
                                   .pos0_dev = pos ? NULL : x->npast_dev, .nt = nt,
                                   .n_head = r[i]->n_head, .head_dim = r[i]->head_dim,
                                   .n_rot = r[i]->n_rot, .mode = r[i]->mode, .theta = r[i]->theta,
                                   .freq_scale = r[i]->freq_scale};
    a.ks = (mf_cu_kv_args){.kv_type = ea->kv_type, .cache = kc, .kv_dim = x->g->kv_dim,
                           .pos0 = ea->n_past, .pos0_dev = x->npast_dev, .nt = nt, .src = sk};
    a.vs = a.ks;
    a.vs.cache = vc;
    a.vs.src = sv;
    a.q_norm = qn;
    a.k_norm = kn;
    a.norm_eps = m->norm_eps;
    if (defer) {
        *defer = a;
        return 0;
    }
    return mf_cub_launched(x, qn ? "rope_store(qk norm)" : "rope_store", nt, m->n_head, mf_cu_rope_store(&a, x->c->stream));
}

/* Whether a live node from index `from` on reads node's output: a fold
 * that never writes that output (or writes it late) needs none to. */
static bool read_from(const mf_graph *g, int32_t node, int32_t from) {
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

/* tune short_rope: whether this FUSED_QKV node's rope-store (one
 * token) is left to the ATTN node right after it, decided once here: that
 * node's q is this node's output and nothing else reads it (so the roped q
 * and K the rope-store would write are never needed), its heads are the
 * rope's, and it takes the 12-warp short-context kernel (attn_short on, not
 * 4 warps; the one-kernel range; flash decode; an f32 / f16 cache;
 * head_dim 64 or 128). The ATTN node re-checks the arguments
 * (mf_cu_attn_short_rope_ok) and launches the rope-store plainly first
 * when they do not fit, so a wrong guess here costs nothing but the fold. */
static bool rope_deferrable(const exec *x, const mf_qkv_meta *m, int64_t nt, const mf_exec_args *ea) {
    const cu_ctx *c = x->c;
    const mf_graph *g = x->g;
    const int32_t node = x->id;
    if (!c->t.short_rope || c->t.attn_decode != MF_CU_AD_SHORT || !mf_cub_attn_one_now(c, ea) ||
        nt != 1 || node + 1 >= g->n_nodes || (x->n->flags & MF_NODE_OUTPUT) ||
        (ea->kv_type != MF_TYPE_F32 && ea->kv_type != MF_TYPE_F16) || (m->head_dim != 64 && m->head_dim != 128) ||
        m->rope_q.head_dim != m->head_dim || m->rope_k.head_dim != m->head_dim || m->rope_q.n_head != m->n_head ||
        m->rope_k.n_head != m->n_head_kv)
        return false;
    const mf_node *u = &g->nodes[node + 1];
    if (u->op != MF_OP_ATTN || (u->flags & MF_NODE_DEAD) || u->n_src < 1 || u->src[0] != node ||
        u->meta.attn.n_head != m->n_head || u->meta.attn.n_head_kv != m->n_head_kv ||
        u->meta.attn.head_dim != m->head_dim || read_from(g, node, node + 2))
        return false;
    const mf_cu_attn_args p = {.kv_type = ea->kv_type, .nt = 1, .n_past = ea->n_past, .n_past_dev = x->npast_dev,
                               .n_head = m->n_head, .n_head_kv = m->n_head_kv, .head_dim = m->head_dim,
                               .n_ctx = ea->n_ctx};
    return mf_cu_attn_decode_bytes(&p) > 0;
}

/* Launches the rope-store rope_deferrable left pending, if any. */
static int flush_rope(cu_ctx *c, mf_error *err) {
    if (c->rs_node < 0)
        return 0;
    exec xx = {.c = c, .g = c->rs_g, .n = &c->rs_g->nodes[c->rs_node], .id = c->rs_node, .err = err};
    c->rs_node = -1;
    return mf_cub_launched(&xx, c->rs_args.q_norm ? "rope_store(qk norm)" : "rope_store", 1, c->rs_args.rq.n_head,
                    mf_cu_rope_store(&c->rs_args, c->stream));
}

static int d2d(exec *x, void *dst, const void *src, size_t nbytes) {
    if (dst == src || nbytes == 0)
        return 0;
    cudaError_t e = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, x->c->stream);
    return mf_cub_launched(x, "memcpy d2d", (int64_t)nbytes, 1, e);
}

/* ---- execute: fused attention input ---------------------------------------------------------- */

/* FUSED_QKV(_NORM): three matmuls into scratch (the output may alias x),
 * optional per-head norms, RoPE of K in place and of Q into the output, the
 * K/V store at n_past. QKV_BIAS_ROPE_STORE: the same tail on three given
 * matmul outputs (biases added here; positions src3 or n_past + t). */
static int exec_qkv(exec *x, const int32_t *in, int32_t out, mf_kv_pair kv, const mf_exec_args *ea) {
    const mf_node *n = x->n;
    const mf_qkv_meta *m = &n->meta.qkv;
    const int64_t nt = n->ne[1], q_dim = (int64_t)m->n_head * m->head_dim, kvd = x->g->kv_dim;
    if (q_dim != n->ne[0] || (int64_t)m->n_head_kv * m->head_dim != kvd)
        return NODE_ERR(x, "n_head %d n_head_kv %d head_dim %d for width %lld, kv_dim %lld", m->n_head,
                        m->n_head_kv, m->head_dim, (long long)n->ne[0], (long long)kvd);
    float *y = mf_cub_buf_ptr(x, out, mf_cub_f32b(q_dim * nt), "output");
    void *kc = kv_region(x, kv.k, ea, ea->n_past + nt, "K");
    void *vc = kc ? kv_region(x, kv.v, ea, ea->n_past + nt, "V") : NULL;
    if (!y || !vc)
        return -1;
    float *sq = mf_cub_scratch(x, 0, mf_cub_f32b(q_dim * nt));
    float *sk = sq ? mf_cub_scratch(x, 1, mf_cub_f32b(kvd * nt)) : NULL;
    float *sv = sk ? mf_cub_scratch(x, 2, mf_cub_f32b(kvd * nt)) : NULL;
    if (!sv)
        return -1;
    const int32_t *pos = NULL;
    if (n->op == MF_OP_QKV_BIAS_ROPE_STORE) {
        const float *q = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(q_dim * nt), "q");
        const float *k = q ? mf_cub_buf_ptr(x, in[1], mf_cub_f32b(kvd * nt), "k") : NULL;
        const float *v = k ? mf_cub_buf_ptr(x, in[2], mf_cub_f32b(kvd * nt), "v") : NULL;
        if (!v)
            return -1;
        const mf_matmul_meta *mm[3] = {&m->q, &m->k, &m->v};
        const float *src[3] = {q, k, v};
        float *dst[3] = {sq, sk, sv};
        const int64_t w[3] = {q_dim, kvd, kvd};
        for (int i = 0; i < 3; i++) {
            const float *bias = NULL;
            if (mm[i]->bias && !(bias = mf_cub_weight_ptr(x, mm[i]->bias, MF_TYPE_F32, w[i], 1)))
                return -1;
            if (bias ? mf_cub_run_ew(x, MF_CU_EW_ADD, src[i], bias, dst[i], w[i] * nt, w[i], 0)
                     : mf_cub_run_ew(x, MF_CU_EW_COPY, src[i], NULL, dst[i], w[i] * nt, 0, 0))
                return -1;
        }
        if (n->n_src > 3 && !(pos = mf_cub_buf_ptr(x, in[3], (size_t)nt * 4, "positions")))
            return -1;
    } else {
        const float *xin = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(m->q.n_in * nt), "input");
        if (!xin || !(pos = mf_cub_buf_ptr(x, in[1], (size_t)nt * 4, "positions")))
            return -1;
        if (m->k.n_out != kvd || m->v.n_out != kvd || m->q.n_out != q_dim)
            return NODE_ERR(x, "q/k/v n_out %lld/%lld/%lld vs q_dim %lld, kv_dim %lld",
                            (long long)m->q.n_out, (long long)m->k.n_out, (long long)m->v.n_out,
                            (long long)q_dim, (long long)kvd);
        const mf_matmul_meta *mm[3] = {&m->q, &m->k, &m->v};
        float *const ys[3] = {sq, sk, sv};
        if (mf_cub_fuse_ok(x, mm, 3, nt)) {
            if (mf_cub_run_multi(x, mm, 3, false, xin, ys, NULL, nt))
                return -1;
        } else if (x->norm) { /* norm_fusable promised the fused path */
            return NODE_ERR(x, "folded RMSNorm but the matmuls cannot take the int8 GEMV (nt %lld)",
                            (long long)nt);
        } else {
            const int r = mf_cub_run_mma_multi(x, mm, 3, false, xin, ys, nt);
            if (r < 0 || (r > 0 && (mf_cub_run_matmul(x, &m->q, xin, sq, nt) || mf_cub_run_matmul(x, &m->k, xin, sk, nt) ||
                                    mf_cub_run_matmul(x, &m->v, xin, sv, nt))))
                return -1;
        }
    }
    const float *fold_qn = NULL, *fold_kn = NULL; /* QkNorm inside the rope-store launch */
    if (m->q_norm || m->k_norm || n->op == MF_OP_FUSED_QKV_NORM) {
        const float *qn = mf_cub_norm_weight(x, m->q_norm, m->head_dim);
        const float *kn = qn ? mf_cub_norm_weight(x, m->k_norm, m->head_dim) : NULL;
        if (!kn)
            return m->q_norm && m->k_norm ? -1 : NODE_ERR(x, "needs q_norm and k_norm weights%s", "");
        if (x->c->t.fuse_rope && m->rope_q.head_dim == m->head_dim && m->rope_k.head_dim == m->head_dim &&
            m->rope_q.n_head == m->n_head && m->rope_k.n_head == m->n_head_kv) {
            fold_qn = qn;
            fold_kn = kn;
        } else if (mf_cub_run_norm(x, sq, qn, sq, m->head_dim, nt * m->n_head, m->norm_eps) ||
                   mf_cub_run_norm(x, sk, kn, sk, m->head_dim, nt * m->n_head_kv, m->norm_eps)) {
            return -1;
        }
    }
    if ((int64_t)m->rope_q.n_head * m->rope_q.head_dim != q_dim ||
        (int64_t)m->rope_k.n_head * m->rope_k.head_dim != kvd)
        return NODE_ERR(x, "rope q %dx%d / k %dx%d for widths %lld / %lld", m->rope_q.n_head,
                        m->rope_q.head_dim, m->rope_k.n_head, m->rope_k.head_dim, (long long)q_dim,
                        (long long)kvd);
    if (x->c->t.fuse_rope && rope_deferrable(x, m, nt, ea)) { /* the next node, ATTN, does it */
        if (run_rope_store(x, m, sq, sk, sv, y, kc, vc, ea, pos, nt, fold_qn, fold_kn, &x->c->rs_args))
            return -1;
        x->c->rs_g = x->g;
        x->c->rs_node = x->id;
        return 0;
    }
    if (x->c->t.fuse_rope)
        return run_rope_store(x, m, sq, sk, sv, y, kc, vc, ea, pos, nt, fold_qn, fold_kn, NULL);
    if (mf_cub_run_rope(x, &m->rope_k, sk, sk, pos, ea->n_past, nt) ||
        run_store(x, kc, vc, ea, sk, sv, nt) || mf_cub_run_rope(x, &m->rope_q, sq, y, pos, ea->n_past, nt))
        return -1;
    return 0;
}

/* ---- execute -------------------------------------------------------------------------------- */

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
static bool add_fusable(const cu_ctx *c, const mf_graph *g, int32_t node, int64_t nt) {
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
    return !read_from(g, node, node + 2);
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
static bool norm_fusable(const cu_ctx *c, const mf_graph *g, int32_t node) {
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
    } else if (u->op == MF_OP_MATMUL && c->t.norm_mm && u->n_src == 1 && !add_fusable(c, g, node + 1, u->ne[1])) {
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
    return !read_from(g, node, node + 2);
}

static int exec_node(mf_backend *b, const mf_graph *g, int32_t node, const int32_t *in, int32_t out,
                     mf_kv_pair kv, const mf_exec_args *ea, mf_error *err, bool may_defer,
                     const exec *fold);

/* Launches the deferred MATMUL or RMSNORM, if any, plainly. */
int mf_cub_flush_pending(mf_backend *b, mf_error *err) {
    cu_ctx *c = CX(b);
    if (flush_rope(c, err))
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
    if (c->rs_node >= 0 && !(g == c->rs_g && node == c->rs_node + 1) && flush_rope(c, err))
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
    const int64_t ne = mf_node_nelem(n);
    const int64_t nt = n->ne[1];
    const mf_node *s0 = n->n_src > 0 ? &g->nodes[n->src[0]] : NULL;
    const mf_node *s1 = n->n_src > 1 ? &g->nodes[n->src[1]] : NULL;
    cudaStream_t st = c->stream;

    switch (n->op) {
    case MF_OP_INPUT:
        return 0;
    case MF_OP_ADD:
    case MF_OP_SWIGLU: {
        if (mf_node_nelem(s0) != ne || mf_node_nelem(s1) != ne)
            return NODE_ERR(x, "srcs of %lld and %lld elements for an output of %lld",
                            (long long)mf_node_nelem(s0), (long long)mf_node_nelem(s1), (long long)ne);
        const float *a = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(ne), "src0");
        const float *bb = a ? mf_cub_buf_ptr(x, in[1], mf_cub_f32b(ne), "src1") : NULL;
        float *y = bb ? mf_cub_buf_ptr(x, out, mf_cub_f32b(ne), "output") : NULL;
        if (!y)
            return -1;
        return mf_cub_run_ew(x, n->op == MF_OP_ADD ? MF_CU_EW_ADD : MF_CU_EW_SWIGLU, a, bb, y, ne, ne, 0);
    }
    case MF_OP_MUL: {
        const int64_t bn = mf_node_nelem(s1);
        if (mf_node_nelem(s0) != ne || (bn != ne && bn != n->ne[0]))
            return NODE_ERR(x, "src1 of %lld elements neither matches %lld nor is one row of %lld",
                            (long long)bn, (long long)ne, (long long)n->ne[0]);
        const float *a = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(ne), "src0");
        const float *bb = a ? mf_cub_buf_ptr(x, in[1], mf_cub_f32b(bn), "src1") : NULL;
        float *y = bb ? mf_cub_buf_ptr(x, out, mf_cub_f32b(ne), "output") : NULL;
        if (!y)
            return -1;
        if (bn != ne && out == in[1]) { /* the broadcast row would be overwritten under its readers */
            float *s = mf_cub_scratch(x, 0, mf_cub_f32b(ne));
            if (!s || mf_cub_run_ew(x, MF_CU_EW_MUL, a, bb, s, ne, bn, 0))
                return -1;
            return d2d(x, y, s, mf_cub_f32b(ne));
        }
        return mf_cub_run_ew(x, MF_CU_EW_MUL, a, bb, y, ne, bn, 0);
    }
    case MF_OP_SCALE:
    case MF_OP_SILU: {
        if (mf_node_nelem(s0) != ne)
            return NODE_ERR(x, "src of %lld elements for %lld", (long long)mf_node_nelem(s0), (long long)ne);
        const float *a = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(ne), "src0");
        float *y = a ? mf_cub_buf_ptr(x, out, mf_cub_f32b(ne), "output") : NULL;
        if (!y)
            return -1;
        return mf_cub_run_ew(x, n->op == MF_OP_SCALE ? MF_CU_EW_SCALE : MF_CU_EW_SILU, a, NULL, y, ne, 0,
                      n->meta.scale.s);
    }
    case MF_OP_RMSNORM:
    case MF_OP_QKNORM: {
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
        if (may_defer && w == n->ne[0] && norm_fusable(c, g, node)) {
            c->pend_g = g;
            c->pend_node = node;
            c->pend_in = in[0];
            c->pend_out = out;
            c->pend_ea = *ea;
            return 0;
        }
        return mf_cub_run_norm(x, a, wt, y, w, ne / w, n->meta.norm.eps);
    }
    case MF_OP_MATMUL: {
        const mf_matmul_meta *m = &n->meta.matmul;
        if (s0->ne[0] != m->n_in || n->ne[0] != m->n_out || s0->ne[1] != nt)
            return NODE_ERR(x, "input %lldx%lld, output %lldx%lld for weight '%s' n_in %lld n_out %lld",
                            (long long)s0->ne[0], (long long)s0->ne[1], (long long)n->ne[0],
                            (long long)nt, m->weight, (long long)m->n_in, (long long)m->n_out);
        const float *a = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(m->n_in * nt), "input");
        float *y = a ? mf_cub_buf_ptr(x, out, mf_cub_f32b(m->n_out * nt), "output") : NULL;
        if (!y)
            return -1;
        if (may_defer && add_fusable(c, g, node, nt)) {
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
            return d2d(x, y, s, mf_cub_f32b(m->n_out * nt));
        }
        return mf_cub_run_matmul(x, m, a, y, nt);
    }
    case MF_OP_GETROWS: {
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
                                    .nt = nt, .y = y, .fault = c->fault, .node = node};
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
        return d2d(x, y, a + mf_cub_f32b(first * w), mf_cub_f32b(ne));
    }
    case MF_OP_ROPE: {
        if (mf_node_nelem(s0) != ne || s1->dtype != MF_DTYPE_I32 || s1->ne[0] != nt ||
            (int64_t)n->meta.rope.n_head * n->meta.rope.head_dim != n->ne[0])
            return NODE_ERR(x, "x %lldx%lld, %lld positions, n_head %d head_dim %d", (long long)s0->ne[0],
                            (long long)s0->ne[1], (long long)s1->ne[0], n->meta.rope.n_head,
                            n->meta.rope.head_dim);
        const float *a = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(ne), "src0");
        const int32_t *pos = a ? mf_cub_buf_ptr(x, in[1], (size_t)nt * 4, "positions") : NULL;
        float *y = pos ? mf_cub_buf_ptr(x, out, mf_cub_f32b(ne), "output") : NULL;
        if (!y)
            return -1;
        return mf_cub_run_rope(x, &n->meta.rope, a, y, pos, 0, nt);
    }
    case MF_OP_KVCACHE_STORE: {
        const int64_t kvd = g->kv_dim, ntk = s0->ne[1];
        if (s0->ne[0] != kvd || s1->ne[0] != kvd || s1->ne[1] != ntk)
            return NODE_ERR(x, "K %lldx%lld / V %lldx%lld vs kv_dim %lld", (long long)s0->ne[0],
                            (long long)ntk, (long long)s1->ne[0], (long long)s1->ne[1], (long long)kvd);
        void *kc = kv_region(x, kv.k, ea, ea->n_past + ntk, "K");
        void *vc = kc ? kv_region(x, kv.v, ea, ea->n_past + ntk, "V") : NULL;
        const float *k = vc ? mf_cub_buf_ptr(x, in[0], mf_cub_f32b(kvd * ntk), "K src") : NULL;
        const float *v = k ? mf_cub_buf_ptr(x, in[1], mf_cub_f32b(kvd * ntk), "V src") : NULL;
        if (!v)
            return -1;
        return run_store(x, kc, vc, ea, k, v, ntk);
    }
    case MF_OP_KVCACHE_LOAD: {
        if (n->ne[0] != g->kv_dim)
            return NODE_ERR(x, "width %lld vs kv_dim %lld", (long long)n->ne[0], (long long)g->kv_dim);
        void *r = kv_region(x, n->meta.kv.which ? kv.v : kv.k, ea, nt, n->meta.kv.which ? "V" : "K");
        float *y = r ? mf_cub_buf_ptr(x, out, mf_cub_f32b(ne), "output") : NULL;
        if (!y)
            return -1;
        mf_cu_kv_args a = {.kv_type = ea->kv_type, .cache = r, .kv_dim = g->kv_dim, .nt = nt, .dst = y};
        return mf_cub_launched(x, "kv_load", nt, g->kv_dim, mf_cu_kv_load(&a, st));
    }
    case MF_OP_ATTN: {
        const mf_attn_meta *m = &n->meta.attn;
        if (m->n_head <= 0 || m->n_head_kv <= 0 || m->n_head % m->n_head_kv ||
            (int64_t)m->n_head * m->head_dim != n->ne[0] ||
            (int64_t)m->n_head_kv * m->head_dim != g->kv_dim || m->head_dim > MF_CU_ATTN_MAX_HEAD_DIM ||
            mf_node_nelem(s0) != ne)
            return NODE_ERR(x, "n_head %d n_head_kv %d head_dim %d (max %d) for width %lld, kv_dim %lld",
                            m->n_head, m->n_head_kv, m->head_dim, MF_CU_ATTN_MAX_HEAD_DIM,
                            (long long)n->ne[0], (long long)g->kv_dim);
        void *kc = kv_region(x, kv.k, ea, ea->n_past + nt, "K");
        void *vc = kc ? kv_region(x, kv.v, ea, ea->n_past + nt, "V") : NULL;
        const float *q = vc ? mf_cub_buf_ptr(x, in[0], mf_cub_f32b(ne), "q") : NULL;
        float *y = q ? mf_cub_buf_ptr(x, out, mf_cub_f32b(ne), "output") : NULL;
        if (!y)
            return -1;
        mf_cu_attn_args a = {.q = q, .out = y, .k = kc, .v = vc, .kv_type = ea->kv_type, .nt = nt,
                             .n_past = ea->n_past, .n_past_dev = x->npast_dev,
                             .n_head = m->n_head, .n_head_kv = m->n_head_kv,
                             .head_dim = m->head_dim, .scale = m->scale,
                             .flash = c->t.attn_prefill >= MF_CU_AP_FLASH && mf_cu_attn_flash_ok(m->head_dim, nt),
                             .n_ctx = ea->n_ctx, .tc = c->t.attn_prefill == MF_CU_AP_MMA};
        /* split-KV decode: its scratch size depends on n_ctx, never n_past */
        const size_t pb = c->t.attn_decode != MF_CU_AD_BLOCK && !a.flash ? mf_cu_attn_decode_bytes(&a) : 0;
        /* short contexts: one kernel that also quantizes for the o GEMV, the
         * short-context kernel (tune attn_decode=short; no partials, no
         * counters) or the split kernel whose last block combines */
        const mf_cu_ad_kind ak = mf_cuda_sel_attn_decode(&c->t, (int64_t)ea->n_past + nt, mf_cu_attn_short_ok(&a));
        const bool one = pb && ak >= MF_CU_AD_ONE;
        const bool shrt = pb && ak == MF_CU_AD_SHORT;
        if (pb && !shrt && !(a.part = mf_cub_scratch(x, ATTN_SLOT, pb)))
            return -1;
        if (one && !shrt && !(a.cnt = mf_cub_counters(x, nt * m->n_head_kv)))
            return -1;
        if (one && m->head_dim % 32 == 0 && !(a.q8out = mf_cub_scratch(x, Q8OUT_SLOT, mf_cu_q8_bytes(n->ne[0], nt))))
            return -1;
        bool srope = false; /* tune short_rope: the FUSED_QKV's rope-store folded in (rope_deferrable) */
        if (c->rs_node >= 0) {
            if (shrt && c->rs_g == g && c->rs_node == n->src[0] && c->rs_args.rq.y == q &&
                mf_cu_attn_short_rope_ok(&a, &c->rs_args)) {
                srope = true;
                c->rs_node = -1;
            } else if (flush_rope(c, x->err)) {
                return -1;
            }
        }
        const char *kind = a.tc && mf_cu_attn_mma_ok(&a) ? "attn(mma)"
                           : a.flash                      ? "attn(flash)"
                           : srope                        ? (a.q8out ? "attn(short rope, q8)" : "attn(short rope)")
                           : shrt                         ? (a.q8out ? "attn(short, q8)" : "attn(short)")
                           : a.cnt                        ? (a.q8out ? "attn(decode one, q8)" : "attn(decode one)")
                           : a.part                       ? "attn(decode)"
                                                          : "attn";
        const cudaError_t ae = srope ? mf_cu_attn_short_rope(&a, &c->rs_args, st)
                               : shrt ? mf_cu_attn_short(&a, 0, st)
                                      : mf_cu_attn(&a, st);
        if (mf_cub_launched(x, kind, nt, m->n_head, ae))
            return -1;
        c->n_short_rope += srope;
        if (a.q8out) /* the o MATMUL (+ADD) after it finds x quantized (run_multi) */
            mf_cub_q8_produced(x, y, n->ne[0], nt, a.q8out);
        return 0;
    }
    case MF_OP_SOFTMAX: {
        if (mf_node_nelem(s0) != ne)
            return NODE_ERR(x, "src of %lld elements for %lld", (long long)mf_node_nelem(s0), (long long)ne);
        const float *a = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(ne), "src0");
        float *y = a ? mf_cub_buf_ptr(x, out, mf_cub_f32b(ne), "output") : NULL;
        if (!y)
            return -1;
        mf_cu_softmax_args sa = {.x = a, .y = y, .n = n->ne[0], .nrows = ne / n->ne[0],
                                 .scale = n->meta.softmax.scale};
        return mf_cub_launched(x, "softmax", sa.nrows, sa.n, mf_cu_softmax(&sa, st));
    }
    case MF_OP_VIEW:
    case MF_OP_PERMUTE: {
        mf_cu_copy_args a = {.ne = {n->ne[0], n->ne[1], n->ne[2], n->ne[3]}};
        const int64_t srows = s0->ne[1] * s0->ne[2] * s0->ne[3];
        int64_t base = 0;
        if (n->op == MF_OP_VIEW) {
            base = n->meta.view.offset;
            if (base < 0 || base + n->ne[0] > s0->ne[0] || ne / n->ne[0] != srows)
                return NODE_ERR(x, "columns [%lld, %lld) of width %lld, %lld rows of %lld",
                                (long long)base, (long long)(base + n->ne[0]), (long long)s0->ne[0],
                                (long long)(ne / n->ne[0]), (long long)srows);
            a.st[0] = 1;
            a.st[1] = s0->ne[0];
            a.st[2] = s0->ne[0] * s0->ne[1];
            a.st[3] = a.st[2] * s0->ne[2];
        } else {
            int64_t sst[4] = {1, s0->ne[0], s0->ne[0] * s0->ne[1], s0->ne[0] * s0->ne[1] * s0->ne[2]};
            for (int d = 0; d < 4; d++) {
                int ax = n->meta.permute.axes[d];
                if (ax < 0 || ax > 3 || n->ne[d] != s0->ne[ax])
                    return NODE_ERR(x, "axis %d -> %d: %lld vs %lld", d, ax, (long long)n->ne[d],
                                    (long long)(ax >= 0 && ax < 4 ? s0->ne[ax] : -1));
                a.st[d] = sst[ax];
            }
        }
        const uint8_t *src = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(mf_node_nelem(s0)), "src0");
        float *y = src ? mf_cub_buf_ptr(x, out, mf_cub_f32b(ne), "output") : NULL;
        if (!y)
            return -1;
        a.x = src + mf_cub_f32b(base);
        if (out == in[0]) { /* a gather from the buffer being written: go through scratch */
            float *s = mf_cub_scratch(x, 0, mf_cub_f32b(ne));
            a.y = s;
            if (!s || mf_cub_launched(x, "copy4d", ne, 1, mf_cu_copy4d(&a, st)))
                return -1;
            return d2d(x, y, s, mf_cub_f32b(ne));
        }
        a.y = y;
        return mf_cub_launched(x, "copy4d", ne, 1, mf_cu_copy4d(&a, st));
    }
    case MF_OP_RESHAPE: {
        if (mf_node_nelem(s0) != ne)
            return NODE_ERR(x, "%lld elements from %lld", (long long)ne, (long long)mf_node_nelem(s0));
        if (out == in[0])
            return 0;
        const void *a = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(ne), "src0");
        void *y = a ? mf_cub_buf_ptr(x, out, mf_cub_f32b(ne), "output") : NULL;
        return y ? d2d(x, y, a, mf_cub_f32b(ne)) : -1;
    }
    case MF_OP_FUSED_QKV:
    case MF_OP_FUSED_QKV_NORM:
    case MF_OP_QKV_BIAS_ROPE_STORE:
        return exec_qkv(x, in, out, kv, ea);
    case MF_OP_FUSED_FFN: {
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
    default:
        return NODE_ERR(x, "no CUDA arm for this op%s", "");
    }
}
