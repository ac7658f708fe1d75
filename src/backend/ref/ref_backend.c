/* ref_backend.c - the `ref` backend: deliberately plain float loops, no
 * threads, no activation quantization, f64 accumulation in reductions.
 *
 * It exists to be obviously right and to make splits: it runs only a subset
 * of the ops (no RoPE, QK norm, KV ops, attention or fused ops), so a graph
 * assigned [ref, cpu] alternates between the two and exercises the
 * cross-backend copy path. Enabled only on request (MINFER_BACKENDS=ref,cpu,
 * or tests). Matmul dequantizes one weight row at a time with the quant
 * module's reference converters. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/hostpool.h"

typedef struct ref_be {
    mf_backend base;
    const mf_weights *w;
    mf_hostpool pool;
    float *tmp;   /* row / output scratch */
    size_t tmp_n;
} ref_be;

static ref_be *RB(const mf_backend *b) {
    return (ref_be *)b->ctx;
}

static const char *ref_name(const mf_backend *b) {
    return "ref";
}

/* Buffers: the shared host pool (backend/hostpool.h), as in the cpu backend. */
static int32_t ref_alloc_buffer(mf_backend *b, size_t nbytes, mf_error *err) {
    return mf_hostpool_alloc(&RB(b)->pool, nbytes, err);
}

static int32_t ref_alloc_fresh(mf_backend *b, size_t nbytes, mf_error *err) {
    return mf_hostpool_alloc_fresh(&RB(b)->pool, nbytes, err);
}

static void ref_free_buffer(mf_backend *b, int32_t id) {
    mf_hostpool_release(&RB(b)->pool, id);
}

static float *bufp(ref_be *c, int32_t id) {
    return mf_hostpool_ptr(&c->pool, id);
}

static int ref_read_host(mf_backend *b, int32_t id, size_t off, void *dst, size_t n, mf_error *err) {
    return mf_hostpool_read(&RB(b)->pool, id, off, dst, n, err);
}

static int ref_write_host(mf_backend *b, int32_t id, size_t off, const void *src, size_t n, mf_error *err) {
    return mf_hostpool_write(&RB(b)->pool, id, off, src, n, err);
}

static int ref_synchronize(mf_backend *b, mf_error *err) {
    return 0;
}

static float *tmp(ref_be *c, size_t n) {
    if (n > c->tmp_n) {
        free(c->tmp);
        c->tmp = mf_malloc(n * sizeof *c->tmp);
        c->tmp_n = n;
    }
    return c->tmp;
}

static bool dequantizable(uint32_t type, int64_t n) {
    const mf_type_traits *t = mf_type_get(type);
    return t && t->to_float && mf_type_row_size(type, n) != 0;
}

static bool can_matmul(const mf_backend *b, const mf_node *n) {
    return mf_type_is_weight(n->meta.matmul.wtype) && dequantizable(n->meta.matmul.wtype, n->meta.matmul.n_in);
}

static bool can_getrows(const mf_backend *b, const mf_node *n) {
    return n->meta.getrows.mode == 1 || dequantizable(n->meta.getrows.wtype, n->ne[0]);
}

static bool ref_supports_fused(const mf_backend *b, mf_fused_kind kind) {
    return kind == MF_FUSE_SWIGLU; /* SWIGLU is a plain op here; the rest are fused kernels */
}

#define NODE_ERR(fmt, ...) \
    mf_errorf(err, "ref: node %d '%s' (%s): " fmt, id, n->name, mf_op_name(n->op), __VA_ARGS__)

/* A weight of type `type` with ne {ne0, ne1}; ne1 < 0 accepts any row count. */
static const mf_weight *weight(ref_be *c, const mf_graph *g, int32_t id, const char *name, int64_t ne0,
                               int64_t ne1, mf_error *err) {
    const mf_node *n = &g->nodes[id];
    const mf_weight *w = mf_weights_find(c->w, name);
    if (!w) {
        NODE_ERR("weight '%s' not found", name ? name : "(null)");
        return NULL;
    }
    if (w->ne[0] != ne0 || (ne1 >= 0 && w->ne[1] != ne1) || w->ne[2] != 1 || w->ne[3] != 1) {
        NODE_ERR("weight '%s' has shape [%lld, %lld, %lld, %lld], node needs [%lld, %lld]", name,
                 (long long)w->ne[0], (long long)w->ne[1], (long long)w->ne[2], (long long)w->ne[3],
                 (long long)ne0, (long long)ne1);
        return NULL;
    }
    if (!dequantizable(w->type, ne0)) {
        NODE_ERR("weight '%s' of type %s cannot be read as floats", name, mf_type_name(w->type));
        return NULL;
    }
    return w;
}

/* Row r of weight w as floats (into dst). */
static void wrow(const mf_weight *w, int64_t r, float *dst) {
    size_t rs = mf_type_row_size(w->type, w->ne[0]);
    mf_dequantize_rows(w->type, (const uint8_t *)w->data + (size_t)r * rs, dst, 1, w->ne[0]);
}

/* ---- the op table ------------------------------------------------------------------ */

/* Every executor's start: the node, src0 / src1 memory, the output. */
typedef struct ref_io {
    ref_be *c;
    const mf_node *n, *a0, *a1;
    const float *x, *x1;
    float *y;
    int64_t nel, w0, rows;
} ref_io;

static ref_io io_of(mf_backend *b, const mf_graph *g, const mf_node_call *k) {
    ref_be *c = RB(b);
    const mf_node *n = &g->nodes[k->node];
    ref_io io = {.c = c, .n = n, .nel = mf_node_nelem(n), .w0 = n->ne[0]};
    io.rows = io.w0 ? io.nel / io.w0 : 0;
    io.a0 = &g->nodes[n->src[0]];
    io.a1 = n->n_src > 1 ? &g->nodes[n->src[1]] : NULL;
    io.x = bufp(c, k->in[0]);
    io.x1 = n->n_src > 1 ? bufp(c, k->in[1]) : NULL;
    io.y = bufp(c, k->out);
    return io;
}

#define REF_OP(fn) \
    static int fn(mf_backend *b, const mf_graph *g, const mf_node_call *k, const mf_exec_args *a, \
                  mf_error *err)
#define IO()                                                        \
    const ref_io io = io_of(b, g, k);                               \
    ref_be *c = io.c;                                               \
    const int32_t id = k->node;                                     \
    const mf_node *n = io.n;                                        \
    const float *x = io.x, *x1 = io.x1;                             \
    float *y = io.y;                                                \
    const int64_t nel = io.nel, w0 = io.w0, rows = io.rows;         \
    (void)c, (void)id, (void)n, (void)x1, (void)nel, (void)w0, (void)rows, (void)a, (void)err

REF_OP(op_add) {
    IO();
    for (int64_t i = 0; i < nel; i++)
        y[i] = x[i] + x1[i];
    return 0;
}

REF_OP(op_mul) {
    IO();
    int64_t n1 = mf_node_nelem(io.a1);
    for (int64_t i = 0; i < nel; i++)
        y[i] = x[i] * x1[i % n1];
    return 0;
}

REF_OP(op_scale) {
    IO();
    for (int64_t i = 0; i < nel; i++)
        y[i] = x[i] * n->meta.scale.s;
    return 0;
}

REF_OP(op_silu) {
    IO();
    for (int64_t i = 0; i < nel; i++)
        y[i] = (float)(x[i] / (1.0 + exp(-(double)x[i])));
    return 0;
}

REF_OP(op_swiglu) {
    IO();
    for (int64_t i = 0; i < nel; i++)
        y[i] = (float)(x[i] / (1.0 + exp(-(double)x[i])) * x1[i]);
    return 0;
}

REF_OP(op_rmsnorm) {
    IO();
    const float *wv = NULL;
    if (n->meta.norm.weight) {
        const mf_weight *w = weight(c, g, id, n->meta.norm.weight, w0, 1, err);
        if (!w)
            return -1;
        wv = tmp(c, (size_t)w0);
        wrow(w, 0, (float *)wv);
    }
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < w0; i++)
            ss += (double)x[r * w0 + i] * x[r * w0 + i];
        double s = 1.0 / sqrt(ss / (double)w0 + n->meta.norm.eps);
        for (int64_t i = 0; i < w0; i++)
            y[r * w0 + i] = (float)(x[r * w0 + i] * s * (wv ? wv[i] : 1.0f));
    }
    return 0;
}

REF_OP(op_matmul) {
    IO();
    const mf_matmul_meta *m = &n->meta.matmul;
    const mf_weight *w = weight(c, g, id, m->weight, m->n_in, m->n_out, err);
    if (!w)
        return -1;
    if (w->type != m->wtype)
        return NODE_ERR("weight '%s' is %s, node expects %s", m->weight, mf_type_name(w->type),
                        mf_type_name(m->wtype));
    const mf_weight *bw = m->bias ? weight(c, g, id, m->bias, m->n_out, 1, err) : NULL;
    if (m->bias && !bw)
        return -1;
    int64_t nt = n->ne[1];
    float *t = tmp(c, (size_t)(m->n_in + m->n_out * nt + m->n_out));
    float *row = t, *acc = t + m->n_in, *bias = acc + m->n_out * nt;
    if (bw)
        wrow(bw, 0, bias);
    for (int64_t o = 0; o < m->n_out; o++) {
        wrow(w, o, row);
        for (int64_t tk = 0; tk < nt; tk++) {
            double s = 0;
            for (int64_t i = 0; i < m->n_in; i++)
                s += (double)row[i] * x[tk * m->n_in + i];
            acc[tk * m->n_out + o] = (float)(s + (bw ? bias[o] : 0.0));
        }
    }
    memcpy(y, acc, (size_t)(m->n_out * nt) * sizeof *y);
    return 0;
}

REF_OP(op_getrows) {
    IO();
    if (n->meta.getrows.mode == 1) {
        memmove(y, x + n->meta.getrows.first * io.a0->ne[0], (size_t)nel * sizeof *y);
        return 0;
    }
    const mf_weight *w = weight(c, g, id, n->meta.getrows.weight, w0, -1, err);
    if (!w)
        return -1;
    const int32_t *ids = (const int32_t *)x;
    float *t = tmp(c, (size_t)nel);
    for (int64_t r = 0; r < rows; r++) {
        if (ids[r] < 0 || ids[r] >= w->ne[1])
            return NODE_ERR("token id %d at row %lld outside [0, %lld) of '%s'", ids[r], (long long)r,
                            (long long)w->ne[1], w->name);
        wrow(w, ids[r], t + r * w0);
    }
    memcpy(y, t, (size_t)nel * sizeof *y);
    return 0;
}

REF_OP(op_softmax) {
    IO();
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * w0;
        float *yr = y + r * w0;
        double mx = -INFINITY, sum = 0;
        for (int64_t i = 0; i < w0; i++)
            mx = fmax(mx, (double)xr[i] * n->meta.softmax.scale);
        for (int64_t i = 0; i < w0; i++) {
            double e = exp((double)xr[i] * n->meta.softmax.scale - mx);
            yr[i] = (float)e;
            sum += e;
        }
        for (int64_t i = 0; i < w0; i++)
            yr[i] = (float)(yr[i] / sum);
    }
    return 0;
}

REF_OP(op_view) {
    IO();
    for (int64_t r = 0; r < n->ne[1]; r++)
        memmove(y + r * w0, x + r * io.a0->ne[0] + n->meta.view.offset, (size_t)w0 * sizeof *y);
    return 0;
}

REF_OP(op_permute) {
    IO();
    const mf_node *a0 = io.a0;
    float *t = tmp(c, (size_t)nel);
    int64_t idx[4], o = 0;
    for (idx[3] = 0; idx[3] < n->ne[3]; idx[3]++)
        for (idx[2] = 0; idx[2] < n->ne[2]; idx[2]++)
            for (idx[1] = 0; idx[1] < n->ne[1]; idx[1]++)
                for (idx[0] = 0; idx[0] < n->ne[0]; idx[0]++) {
                    /* output axis d walks source axis axes[d] */
                    int64_t s[4] = {0, 0, 0, 0};
                    for (int d = 0; d < 4; d++)
                        s[n->meta.permute.axes[d]] = idx[d];
                    t[o++] = x[s[0] + a0->ne[0] * (s[1] + a0->ne[1] * (s[2] + a0->ne[2] * s[3]))];
                }
    memcpy(y, t, (size_t)nel * sizeof *y);
    return 0;
}

/* No RoPE, QK norm, KV ops, attention or fused ops: those entries stay empty,
 * so such nodes go to another backend and make splits. */
static const mf_op_entry ref_table[] = {
    [MF_OP_INPUT] = {NULL, mf_op_nothing},
    [MF_OP_ADD] = {NULL, op_add},
    [MF_OP_MUL] = {NULL, op_mul},
    [MF_OP_SCALE] = {NULL, op_scale},
    [MF_OP_SILU] = {NULL, op_silu},
    [MF_OP_SWIGLU] = {NULL, op_swiglu},
    [MF_OP_RMSNORM] = {NULL, op_rmsnorm},
    [MF_OP_QKNORM] = {NULL, NULL},
    [MF_OP_MATMUL] = {can_matmul, op_matmul},
    [MF_OP_GETROWS] = {can_getrows, op_getrows},
    [MF_OP_ROPE] = {NULL, NULL},
    [MF_OP_KVCACHE_STORE] = {NULL, NULL},
    [MF_OP_KVCACHE_LOAD] = {NULL, NULL},
    [MF_OP_ATTN] = {NULL, NULL},
    [MF_OP_SOFTMAX] = {NULL, op_softmax},
    [MF_OP_VIEW] = {NULL, op_view},
    [MF_OP_RESHAPE] = {NULL, mf_op_nothing},
    [MF_OP_PERMUTE] = {NULL, op_permute},
    [MF_OP_FUSED_QKV] = {NULL, NULL},
    [MF_OP_FUSED_QKV_NORM] = {NULL, NULL},
    [MF_OP_FUSED_FFN] = {NULL, NULL},
    [MF_OP_QKV_BIAS_ROPE_STORE] = {NULL, NULL},
    [MF_OP_ATTN_PAGED] = {NULL, NULL},
};
MF_OP_TABLE_CHECK(ref_table);

static void ref_free(mf_backend *b) {
    ref_be *c = RB(b);
    mf_hostpool_free(&c->pool);
    free(c->tmp);
    free(c);
}

static const mf_backend_ops ref_ops = {
    .name = ref_name,
    .op_table = ref_table,
    .supports_fused = ref_supports_fused,
    .alloc_buffer = ref_alloc_buffer,
    .free_buffer = ref_free_buffer,
    .alloc_fresh = ref_alloc_fresh,
    .read_host = ref_read_host,
    .write_host = ref_write_host,
    .synchronize = ref_synchronize,
    .free = ref_free,
};

int mf_backend_ref_new(const mf_weights *w, mf_backend **out, mf_error *err) {
    *out = NULL;
    if (!w)
        return mf_errorf(err, "ref backend: no weight table");
    ref_be *c = mf_calloc(1, sizeof *c);
    c->w = w;
    mf_hostpool_init(&c->pool, "ref");
    c->base = (mf_backend){.ops = &ref_ops, .kind = MF_BACKEND_REF, .is_gpu = false, .ctx = c};
    *out = &c->base;
    return 0;
}
