/* cpu_backend.c - the CPU backend: glue from graph nodes to the kernels of
 * kernels.h (seed §2.1: "its buffers are plain memory, execute_node just calls
 * the function, synchronize is a no-op").
 *
 * Buffers live in the shared host pool (backend/hostpool.h: 64-byte aligned,
 * indexed by id, exact-size free list). Weights are
 * resolved by GGUF name in the mf_weights table at execute time; norm weights
 * and biases stored as F16/BF16 are converted to f32 once and cached under
 * the same name. Every op works in place (out id == in id). */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "backend/hostpool.h"

enum { N_SCRATCH = 4 };

typedef struct cpu_be {
    mf_backend base;
    const mf_weights *w;
    mf_cpu_ctx *cpu;
    mf_hostpool pool;
    mf_weights *f32; /* converted small weights, by name */
    float *scratch[N_SCRATCH];
    size_t scratch_n[N_SCRATCH];
} cpu_be;

static cpu_be *CB(const mf_backend *b) {
    return (cpu_be *)b->ctx;
}

static const char *cpu_name(const mf_backend *b) {
    return "cpu";
}

/* ---- buffer pool -------------------------------------------------------------------- */

static int32_t cpu_alloc_buffer(mf_backend *b, size_t nbytes, mf_error *err) {
    return mf_hostpool_alloc(&CB(b)->pool, nbytes, err);
}

static int32_t cpu_alloc_fresh(mf_backend *b, size_t nbytes, mf_error *err) {
    return mf_hostpool_alloc_fresh(&CB(b)->pool, nbytes, err);
}

static void cpu_free_buffer(mf_backend *b, int32_t id) {
    mf_hostpool_release(&CB(b)->pool, id);
}

static void *bufp(cpu_be *c, int32_t id) {
    return mf_hostpool_ptr(&c->pool, id);
}

static int cpu_read_host(mf_backend *b, int32_t id, size_t off, void *dst, size_t n, mf_error *err) {
    return mf_hostpool_read(&CB(b)->pool, id, off, dst, n, err);
}

static int cpu_write_host(mf_backend *b, int32_t id, size_t off, const void *src, size_t n, mf_error *err) {
    return mf_hostpool_write(&CB(b)->pool, id, off, src, n, err);
}

static int cpu_synchronize(mf_backend *b, mf_error *err) {
    return 0; /* every kernel has returned by the time execute_node does */
}

static float *scratch(cpu_be *c, int slot, size_t n_floats) {
    if (n_floats > c->scratch_n[slot]) {
        free(c->scratch[slot]);
        size_t bytes = (n_floats * sizeof(float) + 63) / 64 * 64;
        c->scratch[slot] = aligned_alloc(64, bytes);
        MF_ASSERT(c->scratch[slot]);
        c->scratch_n[slot] = n_floats;
    }
    return c->scratch[slot];
}

/* ---- capability -------------------------------------------------------------------- */

static bool mm_ok(const mf_matmul_meta *m) {
    return mf_cpu_dot_get(m->wtype, MF_ISA_SCALAR) != NULL && mf_type_row_size(m->wtype, m->n_in) != 0;
}

static bool can_matmul(const mf_backend *b, const mf_node *n) {
    return mm_ok(&n->meta.matmul);
}

static bool can_getrows(const mf_backend *b, const mf_node *n) {
    if (n->meta.getrows.mode != 0)
        return true;
    const mf_type_traits *t = mf_type_get(n->meta.getrows.wtype);
    return t && t->to_float && mf_type_row_size(n->meta.getrows.wtype, n->ne[0]) != 0;
}

static bool can_fused_qkv(const mf_backend *b, const mf_node *n) {
    return mm_ok(&n->meta.qkv.q) && mm_ok(&n->meta.qkv.k) && mm_ok(&n->meta.qkv.v);
}

static bool can_fused_ffn(const mf_backend *b, const mf_node *n) {
    return mm_ok(&n->meta.ffn.gate) && mm_ok(&n->meta.ffn.up);
}

static bool can_qkv_epilogue(const mf_backend *b, const mf_node *n) {
    return n->meta.qkv.head_dim > 0;
}

static bool cpu_supports_fused(const mf_backend *b, mf_fused_kind kind) {
    return kind == MF_FUSE_QKV || kind == MF_FUSE_QKV_NORM || kind == MF_FUSE_FFN ||
           kind == MF_FUSE_QKV_EPILOGUE || kind == MF_FUSE_SWIGLU;
}

/* ---- weights ----------------------------------------------------------------------- */

#define NODE_ERR(fmt, ...) \
    mf_errorf(err, "cpu: node %d '%s' (%s): " fmt, id, n->name, mf_op_name(n->op), __VA_ARGS__)

/* The weight `name` of type wtype and shape {ne0, ne1}, or NULL with err set
 * naming both shapes. */
static const mf_weight *weight(cpu_be *c, const mf_graph *g, int32_t id, const char *name,
                               uint32_t wtype, int64_t ne0, int64_t ne1, mf_error *err) {
    const mf_node *n = &g->nodes[id];
    const mf_weight *w = mf_weights_find(c->w, name);
    if (!w) {
        NODE_ERR("weight '%s' not found", name ? name : "(null)");
        return NULL;
    }
    if (w->type != wtype) {
        NODE_ERR("weight '%s' is %s, node expects %s", name, mf_type_name(w->type), mf_type_name(wtype));
        return NULL;
    }
    if (w->ne[0] != ne0 || w->ne[1] != ne1 || w->ne[2] != 1 || w->ne[3] != 1) {
        NODE_ERR("weight '%s' has shape [%lld, %lld, %lld, %lld], node needs [%lld, %lld]", name,
                 (long long)w->ne[0], (long long)w->ne[1], (long long)w->ne[2], (long long)w->ne[3],
                 (long long)ne0, (long long)ne1);
        return NULL;
    }
    return w;
}

/* A vector weight (norm, bias) of n floats as f32: F32 in place, F16/BF16
 * converted once and cached. */
static const float *weight_f32(cpu_be *c, const mf_graph *g, int32_t id, const char *name, int64_t n_el,
                               mf_error *err) {
    const mf_node *n = &g->nodes[id];
    const mf_weight *cw = mf_weights_find(c->f32, name);
    if (cw)
        return cw->data;
    const mf_weight *w = mf_weights_find(c->w, name);
    if (!w) {
        NODE_ERR("weight '%s' not found", name ? name : "(null)");
        return NULL;
    }
    if (w->ne[0] * w->ne[1] * w->ne[2] * w->ne[3] != n_el || w->ne[0] != n_el) {
        NODE_ERR("weight '%s' has shape [%lld, %lld, %lld, %lld], node needs [%lld]", name,
                 (long long)w->ne[0], (long long)w->ne[1], (long long)w->ne[2], (long long)w->ne[3],
                 (long long)n_el);
        return NULL;
    }
    if (w->type == MF_TYPE_F32)
        return w->data;
    const mf_type_traits *t = mf_type_get(w->type);
    if (w->type != MF_TYPE_F16 && w->type != MF_TYPE_BF16 && !(t && t->to_float && t->block_size == 1)) {
        NODE_ERR("weight '%s' is %s; vector weights must be f32, f16 or bf16", name, mf_type_name(w->type));
        return NULL;
    }
    float *f = mf_malloc((size_t)n_el * sizeof *f);
    mf_dequantize_rows(w->type, w->data, f, 1, n_el);
    mf_weight cwt = {.name = name, .type = MF_TYPE_F32, .n_dims = 1, .ne = {n_el, 1, 1, 1},
                     .nbytes = (uint64_t)n_el * 4};
    if (mf_weights_add_owned(c->f32, &cwt, f, err))
        return NULL;
    return f;
}

static void add_bias(float *y, const float *bias, int64_t n_out, int64_t nt) {
    for (int64_t t = 0; t < nt; t++)
        mf_cpu_add(y + t * n_out, bias, y + t * n_out, n_out);
}

/* ---- the ops ----------------------------------------------------------------------- */

static int exec_matmul(cpu_be *c, const mf_graph *g, int32_t id, const float *x, float *y,
                       mf_error *err) {
    const mf_node *n = &g->nodes[id];
    const mf_matmul_meta *m = &n->meta.matmul;
    int64_t nt = n->ne[1];
    const mf_weight *w = weight(c, g, id, m->weight, m->wtype, m->n_in, m->n_out, err);
    if (!w)
        return -1;
    const float *bias = NULL;
    if (m->bias && !(bias = weight_f32(c, g, id, m->bias, m->n_out, err)))
        return -1;
    float *dst = (x == y) ? scratch(c, 0, (size_t)(m->n_out * nt)) : y;
    mf_cpu_matmul(c->cpu, m->wtype, w->data, m->n_in, m->n_out, x, nt, dst);
    if (bias)
        add_bias(dst, bias, m->n_out, nt);
    if (dst != y)
        memcpy(y, dst, (size_t)(m->n_out * nt) * sizeof *y);
    return 0;
}

static int exec_getrows(cpu_be *c, const mf_graph *g, int32_t id, const void *x, float *y, mf_error *err) {
    const mf_node *n = &g->nodes[id];
    const mf_node *a = &g->nodes[n->src[0]];
    int64_t d = n->ne[0], nr = n->ne[1];
    if (n->meta.getrows.mode == 1) {
        memmove(y, (const float *)x + n->meta.getrows.first * a->ne[0], (size_t)(d * nr) * sizeof *y);
        return 0;
    }
    const mf_weight *w = mf_weights_find(c->w, n->meta.getrows.weight);
    if (!w)
        return NODE_ERR("weight '%s' not found", n->meta.getrows.weight);
    if (w->type != n->meta.getrows.wtype || w->ne[0] != d || w->ne[2] != 1 || w->ne[3] != 1)
        return NODE_ERR("weight '%s' is %s [%lld, %lld], node needs %s [%lld, n_vocab]", w->name,
                        mf_type_name(w->type), (long long)w->ne[0], (long long)w->ne[1],
                        mf_type_name(n->meta.getrows.wtype), (long long)d);
    size_t row = mf_type_row_size(w->type, d);
    const int32_t *ids = x;
    /* Gather into scratch first: the ids buffer may be the output buffer. */
    float *dst = (x == (const void *)y) ? scratch(c, 0, (size_t)(d * nr)) : y;
    for (int64_t t = 0; t < nr; t++) {
        if (ids[t] < 0 || ids[t] >= w->ne[1])
            return NODE_ERR("token id %d at row %lld outside [0, %lld) of '%s'", ids[t], (long long)t,
                            (long long)w->ne[1], w->name);
        mf_dequantize_rows(w->type, (const uint8_t *)w->data + (size_t)ids[t] * row, dst + t * d, 1, d);
    }
    if (dst != y)
        memcpy(y, dst, (size_t)(d * nr) * sizeof *y);
    return 0;
}

static void exec_permute(cpu_be *c, const mf_node *n, const mf_node *a, const float *x, float *y) {
    int64_t nel = mf_node_nelem(n);
    float *dst = (x == y) ? scratch(c, 0, (size_t)nel) : y;
    /* stride in the source of each output axis */
    int64_t sstride[4] = {1, a->ne[0], a->ne[0] * a->ne[1], a->ne[0] * a->ne[1] * a->ne[2]};
    int64_t st[4];
    for (int d = 0; d < 4; d++)
        st[d] = sstride[n->meta.permute.axes[d]];
    int64_t o = 0;
    for (int64_t i3 = 0; i3 < n->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < n->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < n->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < n->ne[0]; i0++)
                    dst[o++] = x[i0 * st[0] + i1 * st[1] + i2 * st[2] + i3 * st[3]];
    if (dst != y)
        memcpy(y, dst, (size_t)nel * sizeof *y);
}

/* The cache types: known, whole blocks per row, and for attention whole
 * blocks per head (a head's slice is dequantized alone). */
static int check_kv_types(const mf_graph *g, int32_t id, const mf_exec_args *a, mf_error *err) {
    const mf_node *n = &g->nodes[id];
    const uint32_t t[2] = {a->k_type, a->v_type};
    const bool attn = n->op == MF_OP_ATTN || n->op == MF_OP_ATTN_PAGED;
    for (int w = 0; w < 2; w++) {
        if (!mf_kv_type_ok(t[w]))
            return NODE_ERR("%s cache type %s (%u) is not f32, f16, q8_0, q4_0, q4_1, q5_0 or q5_1", w ? "V" : "K",
                            mf_type_name(t[w]), t[w]);
        const int64_t bs = mf_type_get(t[w])->block_size;
        if (g->kv_dim % bs || (attn && n->meta.attn.head_dim % bs))
            return NODE_ERR("%s cache type %s needs head_dim and kv_dim %% %lld == 0 (head_dim %d, kv_dim %lld)",
                            w ? "V" : "K", mf_type_name(t[w]), (long long)bs, attn ? n->meta.attn.head_dim : 0,
                            (long long)g->kv_dim);
    }
    return 0;
}

static int check_kv(const mf_graph *g, int32_t id, mf_kv_pair kv, const mf_exec_args *a, int64_t nt,
                    mf_error *err) {
    const mf_node *n = &g->nodes[id];
    if (kv.k < 0 || kv.v < 0)
        return NODE_ERR("no KV regions for layer %d", mf_node_kv_layer(n));
    if (a->n_past < 0 || a->n_past + nt > a->n_ctx)
        return NODE_ERR("positions [%d, %lld) outside the context of %d", a->n_past,
                        (long long)(a->n_past + nt), a->n_ctx);
    return check_kv_types(g, id, a, err);
}

/* The shared tail of the fused attention input, in place on q (nt rows of
 * n_head heads), k and v (nt rows of kv_dim): biases, the per-head Q/K norms
 * (FUSED_QKV_NORM, or any op whose meta names both weights), RoPE of Q and K
 * at pos, the K/V store at n_past, and the roped Q copied to y. */
static int qkv_tail(cpu_be *c, const mf_graph *g, int32_t id, float *q, float *k, float *v,
                    const int32_t *pos, float *y, mf_kv_pair kv, const mf_exec_args *a, mf_error *err) {
    const mf_node *n = &g->nodes[id];
    const mf_qkv_meta *m = &n->meta.qkv;
    const int64_t nt = n->ne[1];
    const mf_rope_meta *rq = &m->rope_q, *rk = &m->rope_k;
    if ((int64_t)rq->n_head * rq->head_dim != m->q.n_out || (int64_t)rk->n_head * rk->head_dim != g->kv_dim ||
        m->q.n_out != n->ne[0] || m->k.n_out != g->kv_dim || m->v.n_out != g->kv_dim ||
        rq->n_rot <= 0 || rq->n_rot > rq->head_dim || rk->n_rot <= 0 || rk->n_rot > rk->head_dim)
        return NODE_ERR("rope q %dx%d (n_rot %d) / k %dx%d (n_rot %d) for q/k/v widths %lld/%lld/%lld, "
                        "kv_dim %lld", rq->n_head, rq->head_dim, rq->n_rot, rk->n_head, rk->head_dim,
                        rk->n_rot, (long long)m->q.n_out, (long long)m->k.n_out, (long long)m->v.n_out,
                        (long long)g->kv_dim);
    const mf_matmul_meta *mms[3] = {&m->q, &m->k, &m->v};
    float *ys[3] = {q, k, v};
    for (int j = 0; j < 3; j++) {
        if (!mms[j]->bias)
            continue;
        const float *bias = weight_f32(c, g, id, mms[j]->bias, mms[j]->n_out, err);
        if (!bias)
            return -1;
        add_bias(ys[j], bias, mms[j]->n_out, nt);
    }
    if (n->op == MF_OP_FUSED_QKV_NORM || (m->q_norm && m->k_norm)) {
        const float *qn = weight_f32(c, g, id, m->q_norm, m->head_dim, err);
        const float *kn = qn ? weight_f32(c, g, id, m->k_norm, m->head_dim, err) : NULL;
        if (!kn)
            return -1;
        mf_cpu_rmsnorm(c->cpu, q, qn, q, m->head_dim, nt * m->n_head, m->norm_eps);
        mf_cpu_rmsnorm(c->cpu, k, kn, k, m->head_dim, nt * m->n_head_kv, m->norm_eps);
    }
    mf_cpu_rope(c->cpu, q, nt, rq->n_head, rq->head_dim, rq->n_rot, pos, rq->mode, rq->theta,
                rq->freq_scale);
    mf_cpu_rope(c->cpu, k, nt, rk->n_head, rk->head_dim, rk->n_rot, pos, rk->mode, rk->theta,
                rk->freq_scale);
    mf_cpu_kv_store(a->k_type, bufp(c, kv.k), g->kv_dim, a->n_past, k, nt);
    mf_cpu_kv_store(a->v_type, bufp(c, kv.v), g->kv_dim, a->n_past, v, nt);
    memcpy(y, q, (size_t)(m->q.n_out * nt) * sizeof *y);
    return 0;
}

static int exec_fused_qkv(cpu_be *c, const mf_graph *g, int32_t id, const float *x, const int32_t *pos,
                          float *y, mf_kv_pair kv, const mf_exec_args *a, mf_error *err) {
    const mf_node *n = &g->nodes[id];
    const mf_qkv_meta *m = &n->meta.qkv;
    int64_t nt = n->ne[1], n_in = m->q.n_in;
    if (check_kv(g, id, kv, a, nt, err))
        return -1;
    const mf_matmul_meta *mms[3] = {&m->q, &m->k, &m->v};
    mf_cpu_mm mm[3];
    for (int j = 0; j < 3; j++) {
        const mf_weight *w = weight(c, g, id, mms[j]->weight, mms[j]->wtype, n_in, mms[j]->n_out, err);
        if (!w)
            return -1;
        mm[j] = (mf_cpu_mm){.wtype = mms[j]->wtype, .w = w->data, .n_out = mms[j]->n_out,
                            .y = scratch(c, j, (size_t)(mms[j]->n_out * nt))};
    }
    mf_cpu_matmul_multi(c->cpu, mm, 3, n_in, x, nt);
    return qkv_tail(c, g, id, mm[0].y, mm[1].y, mm[2].y, pos, y, kv, a, err);
}

/* QKV_BIAS_ROPE_STORE: the tail of FUSED_QKV on three given matmul outputs
 * (srcs q, k, v; positions src3, or n_past + t without it). The inputs are
 * copied to scratch first: the output may alias q. */
static int exec_qkv_epilogue(cpu_be *c, const mf_graph *g, int32_t id, const int32_t *in, float *y,
                             mf_kv_pair kv, const mf_exec_args *a, mf_error *err) {
    const mf_node *n = &g->nodes[id];
    const mf_qkv_meta *m = &n->meta.qkv;
    const int64_t nt = n->ne[1], qd = m->q.n_out, kvd = g->kv_dim;
    if (check_kv(g, id, kv, a, nt, err))
        return -1;
    const int64_t w[3] = {qd, kvd, kvd};
    float *sc[3];
    for (int j = 0; j < 3; j++) {
        const mf_node *sn = &g->nodes[n->src[j]];
        if (in[j] < 0 || sn->ne[0] != w[j] || sn->ne[1] != nt)
            return NODE_ERR("src %d is %lldx%lld, needs %lldx%lld", j, (long long)sn->ne[0],
                            (long long)sn->ne[1], (long long)w[j], (long long)nt);
        sc[j] = scratch(c, j, (size_t)(w[j] * nt));
        memcpy(sc[j], bufp(c, in[j]), (size_t)(w[j] * nt) * sizeof(float));
    }
    const int32_t *pos;
    if (n->n_src > 3) {
        const mf_node *pn = &g->nodes[n->src[3]];
        if (in[3] < 0 || pn->dtype != MF_DTYPE_I32 || mf_node_nelem(pn) != nt)
            return NODE_ERR("positions src has %lld elements for %lld tokens", (long long)mf_node_nelem(pn),
                            (long long)nt);
        pos = bufp(c, in[3]);
    } else {
        int32_t *pp = (int32_t *)scratch(c, 3, (size_t)nt);
        for (int64_t t = 0; t < nt; t++)
            pp[t] = a->n_past + (int32_t)t;
        pos = pp;
    }
    return qkv_tail(c, g, id, sc[0], sc[1], sc[2], pos, y, kv, a, err);
}

static int exec_fused_ffn(cpu_be *c, const mf_graph *g, int32_t id, const float *x, float *y,
                          mf_error *err) {
    const mf_node *n = &g->nodes[id];
    const mf_ffn_meta *m = &n->meta.ffn;
    int64_t nt = n->ne[1], n_ff = m->gate.n_out;
    const mf_weight *wg = weight(c, g, id, m->gate.weight, m->gate.wtype, m->gate.n_in, n_ff, err);
    const mf_weight *wu = wg ? weight(c, g, id, m->up.weight, m->up.wtype, m->up.n_in, n_ff, err) : NULL;
    if (!wu)
        return -1;
    mf_cpu_mm mm[2] = {
        {.wtype = m->gate.wtype, .w = wg->data, .n_out = n_ff, .y = scratch(c, 0, (size_t)(n_ff * nt))},
        {.wtype = m->up.wtype, .w = wu->data, .n_out = n_ff, .y = scratch(c, 1, (size_t)(n_ff * nt))},
    };
    mf_cpu_matmul_multi(c->cpu, mm, 2, m->gate.n_in, x, nt);
    const mf_matmul_meta *mms[2] = {&m->gate, &m->up};
    for (int j = 0; j < 2; j++) {
        if (!mms[j]->bias)
            continue;
        const float *bias = weight_f32(c, g, id, mms[j]->bias, n_ff, err);
        if (!bias)
            return -1;
        add_bias(mm[j].y, bias, n_ff, nt);
    }
    mf_cpu_swiglu_mt(c->cpu, mm[0].y, mm[1].y, y, n_ff * nt);
    return 0;
}

/* ---- the op table ------------------------------------------------------------------ */

/* What every executor starts from: the node, its first two sources' memory
 * and the output's (NULL where absent). */
typedef struct cpu_io {
    cpu_be *c;
    const mf_node *n, *a0, *a1;
    void *x0, *x1;
    float *y;
    int64_t nel;
} cpu_io;

static int io_of(mf_backend *b, const mf_graph *g, const mf_node_call *k, cpu_io *io, mf_error *err) {
    cpu_be *c = CB(b);
    const int32_t id = k->node;
    const mf_node *n = &g->nodes[id];
    *io = (cpu_io){.c = c, .n = n, .nel = mf_node_nelem(n)};
    io->a0 = n->n_src > 0 ? &g->nodes[n->src[0]] : NULL;
    io->a1 = n->n_src > 1 ? &g->nodes[n->src[1]] : NULL;
    io->x0 = (n->n_src > 0 && k->in[0] >= 0) ? bufp(c, k->in[0]) : NULL;
    io->x1 = (n->n_src > 1 && k->in[1] >= 0) ? bufp(c, k->in[1]) : NULL;
    io->y = k->out >= 0 ? bufp(c, k->out) : NULL;
    if (io->nel > 0 && !io->y)
        return NODE_ERR("no output buffer for %lld elements", (long long)io->nel);
    return 0;
}

#define CPU_OP(fn) \
    static int fn(mf_backend *b, const mf_graph *g, const mf_node_call *k, const mf_exec_args *a, \
                  mf_error *err)
#define IO()                                  \
    cpu_io io;                                \
    if (io_of(b, g, k, &io, err))             \
        return -1;                            \
    const int32_t id = k->node;               \
    const mf_node *n = io.n;                  \
    (void)id, (void)n, (void)a

CPU_OP(op_add) {
    IO();
    mf_cpu_add(io.x0, io.x1, io.y, io.nel);
    return 0;
}

CPU_OP(op_mul) {
    IO();
    if (mf_node_nelem(io.a1) == io.a1->ne[0] && io.nel != io.a1->ne[0]) {
        for (int64_t r = 0; r < io.nel / n->ne[0]; r++)
            mf_cpu_mul((float *)io.x0 + r * n->ne[0], io.x1, io.y + r * n->ne[0], n->ne[0]);
    } else {
        mf_cpu_mul(io.x0, io.x1, io.y, io.nel);
    }
    return 0;
}

CPU_OP(op_scale) {
    IO();
    mf_cpu_scale(io.x0, n->meta.scale.s, io.y, io.nel);
    return 0;
}

CPU_OP(op_silu) {
    IO();
    mf_cpu_silu(io.x0, io.y, io.nel);
    return 0;
}

CPU_OP(op_swiglu) {
    IO();
    mf_cpu_swiglu_mt(io.c->cpu, io.x0, io.x1, io.y, io.nel);
    return 0;
}

/* RMSNORM and QKNORM: rows of the node's width or of head_dim. */
CPU_OP(op_norm) {
    IO();
    int64_t w = n->op == MF_OP_QKNORM ? n->meta.norm.head_dim : n->ne[0];
    const float *nw = NULL;
    if (n->meta.norm.weight && !(nw = weight_f32(io.c, g, id, n->meta.norm.weight, w, err)))
        return -1;
    mf_cpu_rmsnorm(io.c->cpu, io.x0, nw, io.y, w, io.nel / w, n->meta.norm.eps);
    return 0;
}

CPU_OP(op_matmul) {
    IO();
    return exec_matmul(io.c, g, id, io.x0, io.y, err);
}

CPU_OP(op_getrows) {
    IO();
    return exec_getrows(io.c, g, id, io.x0, io.y, err);
}

CPU_OP(op_rope) {
    IO();
    const mf_rope_meta *r = &n->meta.rope;
    if (io.y != io.x0)
        memcpy(io.y, io.x0, (size_t)io.nel * sizeof *io.y);
    mf_cpu_rope(io.c->cpu, io.y, n->ne[1], r->n_head, r->head_dim, r->n_rot, io.x1, r->mode, r->theta,
                r->freq_scale);
    return 0;
}

CPU_OP(op_kv_store) {
    IO();
    if (check_kv(g, id, k->kv, a, io.a0->ne[1], err))
        return -1;
    mf_cpu_kv_store(a->k_type, bufp(io.c, k->kv.k), g->kv_dim, a->n_past, io.x0, io.a0->ne[1]);
    mf_cpu_kv_store(a->v_type, bufp(io.c, k->kv.v), g->kv_dim, a->n_past, io.x1, io.a1->ne[1]);
    return 0;
}

CPU_OP(op_kv_load) {
    IO();
    if (check_kv(g, id, k->kv, a, 0, err))
        return -1;
    if (n->ne[1] > a->n_ctx)
        return NODE_ERR("%lld rows of a %d-row cache", (long long)n->ne[1], a->n_ctx);
    mf_cpu_kv_load(n->meta.kv.which ? a->v_type : a->k_type, bufp(io.c, n->meta.kv.which ? k->kv.v : k->kv.k),
                   g->kv_dim, n->ne[1], io.y);
    return 0;
}

CPU_OP(op_attn) {
    IO();
    const mf_attn_meta *m = &n->meta.attn;
    if (check_kv(g, id, k->kv, a, n->ne[1], err))
        return -1;
    float *dst = (io.x0 == (void *)io.y) ? scratch(io.c, 0, (size_t)io.nel) : io.y;
    mf_cpu_attn(io.c->cpu, io.x0, n->ne[1], m->n_head, m->n_head_kv, m->head_dim, bufp(io.c, k->kv.k),
                bufp(io.c, k->kv.v), a->k_type, a->v_type, a->n_past, m->scale, m->unfused, dst);
    if (dst != io.y)
        memcpy(io.y, dst, (size_t)io.nel * sizeof *io.y);
    return 0;
}

CPU_OP(op_attn_paged) {
    IO();
    const mf_attn_meta *m = &n->meta.attn;
    const mf_kv_batch *kb = a->batch;
    if (k->kv.k < 0 || k->kv.v < 0)
        return NODE_ERR("no KV regions for layer %d", m->layer);
    if (check_kv_types(g, id, a, err))
        return -1;
    if (!kb || kb->n_tokens != n->ne[1])
        return NODE_ERR("a paged forward of %lld tokens without its batch (%d tokens)",
                        (long long)n->ne[1], kb ? kb->n_tokens : 0);
    const mf_cpu_paged pg = {.seq = kb->seq, .pos = kb->pos, .n_seqs = kb->n_seqs,
                             .tables = kb->tables, .block_size = kb->block_size};
    const float *xk = bufp(io.c, k->in[1]), *xv = bufp(io.c, k->in[2]);
    float *dst = (io.x0 == (void *)io.y) ? scratch(io.c, 0, (size_t)io.nel) : io.y;
    mf_cpu_attn_paged(io.c->cpu, &pg, io.x0, xk, xv, n->ne[1], m->n_head, m->n_head_kv, m->head_dim,
                      bufp(io.c, k->kv.k), bufp(io.c, k->kv.v), a->k_type, a->v_type, m->scale, m->unfused,
                      dst);
    if (dst != io.y)
        memcpy(io.y, dst, (size_t)io.nel * sizeof *io.y);
    return 0;
}

CPU_OP(op_softmax) {
    IO();
    if (io.y != io.x0)
        memcpy(io.y, io.x0, (size_t)io.nel * sizeof *io.y);
    for (int64_t r = 0; r < io.nel / n->ne[0]; r++)
        mf_cpu_softmax(io.y + r * n->ne[0], n->ne[0], n->meta.softmax.scale);
    return 0;
}

CPU_OP(op_view) {
    IO();
    for (int64_t r = 0; r < n->ne[1]; r++)
        memmove(io.y + r * n->ne[0], (const float *)io.x0 + r * io.a0->ne[0] + n->meta.view.offset,
                (size_t)n->ne[0] * sizeof *io.y);
    return 0;
}

CPU_OP(op_permute) {
    IO();
    exec_permute(io.c, n, io.a0, io.x0, io.y);
    return 0;
}

CPU_OP(op_fused_qkv) {
    IO();
    return exec_fused_qkv(io.c, g, id, io.x0, io.x1, io.y, k->kv, a, err);
}

CPU_OP(op_fused_ffn) {
    IO();
    return exec_fused_ffn(io.c, g, id, io.x0, io.y, err);
}

CPU_OP(op_qkv_epilogue) {
    IO();
    return exec_qkv_epilogue(io.c, g, id, k->in, io.y, k->kv, a, err);
}

static const mf_op_entry cpu_table[] = {
    [MF_OP_INPUT] = {NULL, mf_op_nothing},
    [MF_OP_ADD] = {NULL, op_add},
    [MF_OP_MUL] = {NULL, op_mul},
    [MF_OP_SCALE] = {NULL, op_scale},
    [MF_OP_SILU] = {NULL, op_silu},
    [MF_OP_SWIGLU] = {NULL, op_swiglu},
    [MF_OP_RMSNORM] = {NULL, op_norm},
    [MF_OP_QKNORM] = {NULL, op_norm},
    [MF_OP_MATMUL] = {can_matmul, op_matmul},
    [MF_OP_GETROWS] = {can_getrows, op_getrows},
    [MF_OP_ROPE] = {NULL, op_rope},
    [MF_OP_KVCACHE_STORE] = {NULL, op_kv_store},
    [MF_OP_KVCACHE_LOAD] = {NULL, op_kv_load},
    [MF_OP_ATTN] = {NULL, op_attn},
    [MF_OP_SOFTMAX] = {NULL, op_softmax},
    [MF_OP_VIEW] = {NULL, op_view},
    [MF_OP_RESHAPE] = {NULL, mf_op_nothing},
    [MF_OP_PERMUTE] = {NULL, op_permute},
    [MF_OP_FUSED_QKV] = {can_fused_qkv, op_fused_qkv},
    [MF_OP_FUSED_QKV_NORM] = {can_fused_qkv, op_fused_qkv},
    [MF_OP_FUSED_FFN] = {can_fused_ffn, op_fused_ffn},
    [MF_OP_QKV_BIAS_ROPE_STORE] = {can_qkv_epilogue, op_qkv_epilogue},
    [MF_OP_ATTN_PAGED] = {NULL, op_attn_paged},
};
MF_OP_TABLE_CHECK(cpu_table);

static void cpu_free(mf_backend *b) {
    cpu_be *c = CB(b);
    mf_hostpool_free(&c->pool);
    for (int i = 0; i < N_SCRATCH; i++)
        free(c->scratch[i]);
    mf_weights_free(c->f32);
    mf_cpu_ctx_free(c->cpu);
    free(c);
}

static const mf_backend_ops cpu_ops = {
    .name = cpu_name,
    .op_table = cpu_table,
    .supports_fused = cpu_supports_fused,
    .alloc_buffer = cpu_alloc_buffer,
    .free_buffer = cpu_free_buffer,
    .alloc_fresh = cpu_alloc_fresh,
    .read_host = cpu_read_host,
    .write_host = cpu_write_host,
    .synchronize = cpu_synchronize,
    .has_weight = NULL,
    .free = cpu_free,
};

int mf_backend_cpu_new(const mf_weights *w, int n_threads, mf_backend **out, mf_error *err) {
    *out = NULL;
    if (!w)
        return mf_errorf(err, "cpu backend: no weight table");
    cpu_be *c = mf_calloc(1, sizeof *c);
    c->w = w;
    c->cpu = mf_cpu_ctx_new(n_threads);
    if (!c->cpu) {
        free(c);
        return mf_errorf(err, "cpu backend: cannot start %d threads", n_threads);
    }
    c->f32 = mf_weights_new();
    mf_hostpool_init(&c->pool, "cpu");
    c->base = (mf_backend){.ops = &cpu_ops, .kind = MF_BACKEND_CPU, .is_gpu = false, .ctx = c};
    *out = &c->base;
    return 0;
}
