/* cuda_op_attn.c - the executors of the attention ops: ROPE, the KV
 * cache store and load, ATTN (the decode kernel chosen by
 * mf_cuda_sel_attn_decode) and the fused attention input (FUSED_QKV,
 * FUSED_QKV_NORM, QKV_BIAS_ROPE_STORE). */
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
                       .pos0 = ea->n_past, .pos0_dev = x->npast_dev, .nt = nt, .src = k, .pdl = x->c->t.pdl};
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
                                   .freq_scale = r[i]->freq_scale, .pdl = x->c->t.pdl};
    a.ks = (mf_cu_kv_args){.kv_type = ea->kv_type, .cache = kc, .kv_dim = x->g->kv_dim,
                           .pos0 = ea->n_past, .pos0_dev = x->npast_dev, .nt = nt, .src = sk,
                           .pdl = x->c->t.pdl};
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
        u->meta.attn.head_dim != m->head_dim || mf_cub_read_from(g, node, node + 2))
        return false;
    const mf_cu_attn_args p = {.kv_type = ea->kv_type, .nt = 1, .n_past = ea->n_past, .n_past_dev = x->npast_dev,
                               .n_head = m->n_head, .n_head_kv = m->n_head_kv, .head_dim = m->head_dim,
                               .n_ctx = ea->n_ctx};
    return mf_cu_attn_decode_bytes(&p) > 0;
}

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

/* ROPE */
int mf_cub_op_rope(const op_call *oc) {
    exec *x = oc->x;
    const mf_node *n = x->n;
    const int32_t *in = oc->in;
    const int32_t out = oc->out;
    const int64_t ne = mf_node_nelem(n);
    const int64_t nt = n->ne[1];
    const mf_node *s0 = n->n_src > 0 ? &x->g->nodes[n->src[0]] : NULL;
    const mf_node *s1 = n->n_src > 1 ? &x->g->nodes[n->src[1]] : NULL;
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

/* KVCACHE_STORE */
int mf_cub_op_kv_store(const op_call *oc) {
    exec *x = oc->x;
    const mf_graph *g = x->g;
    const mf_node *n = x->n;
    const int32_t *in = oc->in;
    const mf_kv_pair kv = oc->kv;
    const mf_exec_args *ea = oc->ea;
    const mf_node *s0 = n->n_src > 0 ? &x->g->nodes[n->src[0]] : NULL;
    const mf_node *s1 = n->n_src > 1 ? &x->g->nodes[n->src[1]] : NULL;
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

/* KVCACHE_LOAD */
int mf_cub_op_kv_load(const op_call *oc) {
    exec *x = oc->x;
    const mf_graph *g = x->g;
    const mf_node *n = x->n;
    const int32_t out = oc->out;
    const mf_kv_pair kv = oc->kv;
    const mf_exec_args *ea = oc->ea;
    const int64_t ne = mf_node_nelem(n);
    const int64_t nt = n->ne[1];
    cudaStream_t st = x->c->stream;
    if (n->ne[0] != g->kv_dim)
        return NODE_ERR(x, "width %lld vs kv_dim %lld", (long long)n->ne[0], (long long)g->kv_dim);
    void *r = kv_region(x, n->meta.kv.which ? kv.v : kv.k, ea, nt, n->meta.kv.which ? "V" : "K");
    float *y = r ? mf_cub_buf_ptr(x, out, mf_cub_f32b(ne), "output") : NULL;
    if (!y)
        return -1;
    mf_cu_kv_args a = {.kv_type = ea->kv_type, .cache = r, .kv_dim = g->kv_dim, .nt = nt, .dst = y,
                       .pdl = x->c->t.pdl};
    return mf_cub_launched(x, "kv_load", nt, g->kv_dim, mf_cu_kv_load(&a, st));
}

/* ATTN */
int mf_cub_op_attn(const op_call *oc) {
    exec *x = oc->x;
    cu_ctx *c = x->c;
    const mf_graph *g = x->g;
    const mf_node *n = x->n;
    const int32_t *in = oc->in;
    const int32_t out = oc->out;
    const mf_kv_pair kv = oc->kv;
    const mf_exec_args *ea = oc->ea;
    const int64_t ne = mf_node_nelem(n);
    const int64_t nt = n->ne[1];
    const mf_node *s0 = n->n_src > 0 ? &x->g->nodes[n->src[0]] : NULL;
    cudaStream_t st = x->c->stream;
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
                         .n_ctx = ea->n_ctx, .tc = c->t.attn_prefill == MF_CU_AP_MMA, .no_pf = !c->t.attn_pf,
                         .short_warps = c->t.short_w4 ? 4 : 12, .pdl = c->t.pdl};
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
        } else if (mf_cub_flush_rope(c, x->err)) {
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
                           : shrt ? mf_cu_attn_short(&a, st)
                                  : mf_cu_attn(&a, st);
    if (mf_cub_launched(x, kind, nt, m->n_head, ae))
        return -1;
    c->n_short_rope += srope;
    if (a.q8out) /* the o MATMUL (+ADD) after it finds x quantized (run_multi) */
        mf_cub_q8_produced(x, y, n->ne[0], nt, a.q8out);
    return 0;
}

/* FUSED_QKV / FUSED_QKV_NORM / QKV_BIAS_ROPE_STORE */
int mf_cub_op_qkv(const op_call *oc) {
    exec *x = oc->x;
    const int32_t *in = oc->in;
    const int32_t out = oc->out;
    const mf_kv_pair kv = oc->kv;
    const mf_exec_args *ea = oc->ea;
    return exec_qkv(x, in, out, kv, ea);
}
