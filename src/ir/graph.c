/* graph.c - the graph IR: op names, node helpers, string arena, validation,
 * the weight table (hash map by GGUF name), graph params equality and the
 * trace dump. No device or backend notion lives here. */
#include "ir/graph.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- op names ------------------------------------------------------------------ */

static const char *const op_names[] = {
    [MF_OP_INPUT] = "input",
    [MF_OP_ADD] = "add",
    [MF_OP_MUL] = "mul",
    [MF_OP_SCALE] = "scale",
    [MF_OP_SILU] = "silu",
    [MF_OP_SWIGLU] = "swiglu",
    [MF_OP_RMSNORM] = "rmsnorm",
    [MF_OP_QKNORM] = "qknorm",
    [MF_OP_MATMUL] = "matmul",
    [MF_OP_GETROWS] = "getrows",
    [MF_OP_ROPE] = "rope",
    [MF_OP_KVCACHE_STORE] = "kvcache_store",
    [MF_OP_KVCACHE_LOAD] = "kvcache_load",
    [MF_OP_ATTN] = "attn",
    [MF_OP_ATTN_PAGED] = "attn_paged",
    [MF_OP_SOFTMAX] = "softmax",
    [MF_OP_VIEW] = "view",
    [MF_OP_RESHAPE] = "reshape",
    [MF_OP_PERMUTE] = "permute",
    [MF_OP_FUSED_QKV] = "fused_qkv",
    [MF_OP_FUSED_QKV_NORM] = "fused_qkv_norm",
    [MF_OP_FUSED_FFN] = "fused_ffn",
    [MF_OP_QKV_BIAS_ROPE_STORE] = "qkv_bias_rope_store",
};
/* Adding an op without its name fails here (the table is sized by its last
 * designated entry). */
_Static_assert(sizeof op_names / sizeof op_names[0] == MF_OP_COUNT, "op_names must name every mf_op");
_Static_assert(MF_OP_COUNT == 23, "new op: add its name above and its arms in every backend");

const char *mf_op_name(mf_op op) {
    if ((unsigned)op >= MF_OP_COUNT || !op_names[op])
        return "unknown";
    return op_names[op];
}

/* ---- graph and arena ------------------------------------------------------------- */

void mf_graph_init(mf_graph *g) {
    memset(g, 0, sizeof *g);
}

void mf_graph_free(mf_graph *g) {
    for (int32_t i = 0; i < g->n_strings; i++)
        free(g->strings[i]);
    free(g->strings);
    free(g->nodes);
    memset(g, 0, sizeof *g);
}

const char *mf_g_str(mf_graph *g, const char *s) {
    if (!s)
        return NULL;
    /* Weight names repeat rarely within a graph; a linear dedup would cost
     * O(n^2) on big graphs, so every call gets its own copy. */
    if (g->n_strings == g->cap_strings) {
        g->cap_strings = g->cap_strings ? g->cap_strings * 2 : 64;
        g->strings = mf_realloc(g->strings, (size_t)g->cap_strings * sizeof *g->strings);
    }
    char *c = mf_strdup(s);
    g->strings[g->n_strings++] = c;
    return c;
}

int32_t mf_g_node(mf_graph *g, mf_op op, mf_dtype dtype, int64_t ne0, int64_t ne1,
                  const int32_t *src, int32_t n_src) {
    MF_ASSERT(n_src >= 0 && n_src <= MF_MAX_SRC);
    if (g->n_nodes == g->cap) {
        g->cap = g->cap ? g->cap * 2 : 256;
        g->nodes = mf_realloc(g->nodes, (size_t)g->cap * sizeof *g->nodes);
    }
    int32_t id = g->n_nodes++;
    mf_node *n = &g->nodes[id];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->dtype = dtype;
    n->ne[0] = ne0;
    n->ne[1] = ne1;
    n->ne[2] = 1;
    n->ne[3] = 1;
    n->n_src = n_src;
    for (int i = 0; i < MF_MAX_SRC; i++)
        n->src[i] = -1;
    for (int i = 0; i < n_src; i++) {
        MF_ASSERT(src[i] >= 0 && src[i] < id);
        n->src[i] = src[i];
    }
    n->layer = -1;
    n->backend = -1;
    n->buf = -1;
    return id;
}

void mf_g_set_name(mf_graph *g, int32_t node, const char *fmt, ...) {
    MF_ASSERT(node >= 0 && node < g->n_nodes);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->nodes[node].name, MF_NODE_NAME, fmt, ap);
    va_end(ap);
}

static mf_node *nd(mf_graph *g, int32_t i) {
    MF_ASSERT(i >= 0 && i < g->n_nodes);
    return &g->nodes[i];
}

/* ---- builder helpers -------------------------------------------------------------- */

int32_t mf_g_input(mf_graph *g, mf_input_kind kind, mf_dtype dtype, int64_t ne0, int64_t ne1) {
    int32_t id = mf_g_node(g, MF_OP_INPUT, dtype, ne0, ne1, NULL, 0);
    g->nodes[id].meta.input.kind = kind;
    return id;
}

static int32_t same_shape(mf_graph *g, mf_op op, const int32_t *src, int32_t n_src) {
    mf_node a = *nd(g, src[0]);
    int32_t id = mf_g_node(g, op, MF_DTYPE_F32, a.ne[0], a.ne[1], src, n_src);
    g->nodes[id].ne[2] = a.ne[2];
    g->nodes[id].ne[3] = a.ne[3];
    return id;
}

int32_t mf_g_add(mf_graph *g, int32_t a, int32_t b) {
    return same_shape(g, MF_OP_ADD, (int32_t[]){a, b}, 2);
}

int32_t mf_g_mul(mf_graph *g, int32_t a, int32_t b) {
    return same_shape(g, MF_OP_MUL, (int32_t[]){a, b}, 2);
}

int32_t mf_g_scale(mf_graph *g, int32_t a, float s) {
    int32_t id = same_shape(g, MF_OP_SCALE, &a, 1);
    g->nodes[id].meta.scale.s = s;
    return id;
}

int32_t mf_g_silu(mf_graph *g, int32_t a) {
    return same_shape(g, MF_OP_SILU, &a, 1);
}

int32_t mf_g_swiglu(mf_graph *g, int32_t gate, int32_t up) {
    return same_shape(g, MF_OP_SWIGLU, (int32_t[]){gate, up}, 2);
}

int32_t mf_g_rmsnorm(mf_graph *g, int32_t x, const char *weight, float eps) {
    int32_t id = same_shape(g, MF_OP_RMSNORM, &x, 1);
    g->nodes[id].meta.norm.weight = mf_g_str(g, weight);
    g->nodes[id].meta.norm.eps = eps;
    g->nodes[id].meta.norm.head_dim = 0;
    return id;
}

int32_t mf_g_qknorm(mf_graph *g, int32_t x, const char *weight, int32_t head_dim, float eps) {
    int32_t id = same_shape(g, MF_OP_QKNORM, &x, 1);
    g->nodes[id].meta.norm.weight = mf_g_str(g, weight);
    g->nodes[id].meta.norm.eps = eps;
    g->nodes[id].meta.norm.head_dim = head_dim;
    return id;
}

static mf_matmul_meta mm_copy(mf_graph *g, const mf_matmul_meta *m) {
    mf_matmul_meta c = *m;
    c.weight = mf_g_str(g, m->weight);
    c.bias = mf_g_str(g, m->bias);
    return c;
}

int32_t mf_g_matmul(mf_graph *g, int32_t x, const char *weight, uint32_t wtype,
                    const char *bias, int64_t n_in, int64_t n_out) {
    int64_t nt = nd(g, x)->ne[1];
    int32_t id = mf_g_node(g, MF_OP_MATMUL, MF_DTYPE_F32, n_out, nt, &x, 1);
    mf_matmul_meta m = {.weight = weight, .wtype = wtype, .bias = bias, .n_in = n_in, .n_out = n_out};
    g->nodes[id].meta.matmul = mm_copy(g, &m);
    return id;
}

int32_t mf_g_embed(mf_graph *g, int32_t tokens, const char *weight, uint32_t wtype, int64_t d) {
    int64_t nt = nd(g, tokens)->ne[0];
    int32_t id = mf_g_node(g, MF_OP_GETROWS, MF_DTYPE_F32, d, nt, &tokens, 1);
    g->nodes[id].meta.getrows.mode = 0;
    g->nodes[id].meta.getrows.weight = mf_g_str(g, weight);
    g->nodes[id].meta.getrows.wtype = wtype;
    g->nodes[id].meta.getrows.first = 0;
    return id;
}

int32_t mf_g_rows(mf_graph *g, int32_t x, int64_t first, int64_t n) {
    int64_t w = nd(g, x)->ne[0];
    int32_t id = mf_g_node(g, MF_OP_GETROWS, MF_DTYPE_F32, w, n, &x, 1);
    g->nodes[id].meta.getrows.mode = 1;
    g->nodes[id].meta.getrows.first = first;
    return id;
}

int32_t mf_g_rope(mf_graph *g, int32_t x, int32_t pos, const mf_rope_meta *rope) {
    int32_t id = same_shape(g, MF_OP_ROPE, (int32_t[]){x, pos}, 2);
    g->nodes[id].meta.rope = *rope;
    return id;
}

int32_t mf_g_kv_store(mf_graph *g, int32_t k, int32_t v, int32_t layer) {
    int64_t nt = nd(g, k)->ne[1];
    /* No output bytes: the effect is the write into the layer's KV regions;
     * ATTN takes this node as src1 so the order is explicit in the graph. */
    int32_t id = mf_g_node(g, MF_OP_KVCACHE_STORE, MF_DTYPE_F32, 0, nt, (int32_t[]){k, v}, 2);
    g->nodes[id].meta.kv.layer = layer;
    g->nodes[id].meta.kv.which = 0;
    g->nodes[id].layer = layer;
    return id;
}

int32_t mf_g_kv_load(mf_graph *g, int32_t store, int32_t layer, int32_t which, int64_t n_kv) {
    int32_t id = mf_g_node(g, MF_OP_KVCACHE_LOAD, MF_DTYPE_F32, g->kv_dim, n_kv, &store, 1);
    g->nodes[id].meta.kv.layer = layer;
    g->nodes[id].meta.kv.which = which;
    g->nodes[id].layer = layer;
    return id;
}

int32_t mf_g_attn(mf_graph *g, int32_t q, int32_t store, const mf_attn_meta *m) {
    int32_t id = same_shape(g, MF_OP_ATTN, (int32_t[]){q, store}, 2);
    g->nodes[id].meta.attn = *m;
    g->nodes[id].layer = m->layer;
    return id;
}

int32_t mf_g_attn_paged(mf_graph *g, int32_t q, int32_t k, int32_t v, const mf_attn_meta *m) {
    int32_t id = same_shape(g, MF_OP_ATTN_PAGED, (int32_t[]){q, k, v}, 3);
    g->nodes[id].meta.attn = *m;
    g->nodes[id].layer = m->layer;
    return id;
}

int32_t mf_g_softmax(mf_graph *g, int32_t x, float scale) {
    int32_t id = same_shape(g, MF_OP_SOFTMAX, &x, 1);
    g->nodes[id].meta.softmax.scale = scale;
    return id;
}

int32_t mf_g_view(mf_graph *g, int32_t x, int64_t offset, int64_t width) {
    int64_t nt = nd(g, x)->ne[1];
    int32_t id = mf_g_node(g, MF_OP_VIEW, MF_DTYPE_F32, width, nt, &x, 1);
    g->nodes[id].meta.view.offset = offset;
    return id;
}

int32_t mf_g_reshape(mf_graph *g, int32_t x, int64_t ne0, int64_t ne1) {
    mf_dtype dt = nd(g, x)->dtype;
    return mf_g_node(g, MF_OP_RESHAPE, dt, ne0, ne1, &x, 1);
}

int32_t mf_g_permute(mf_graph *g, int32_t x, const int32_t axes[4]) {
    mf_node a = *nd(g, x);
    int32_t id = mf_g_node(g, MF_OP_PERMUTE, a.dtype, 1, 1, &x, 1);
    mf_node *n = &g->nodes[id];
    for (int i = 0; i < 4; i++) {
        MF_ASSERT(axes[i] >= 0 && axes[i] < 4);
        n->ne[i] = a.ne[axes[i]];
        n->meta.permute.axes[i] = axes[i];
    }
    return id;
}

int32_t mf_g_fused_qkv(mf_graph *g, int32_t x, int32_t pos, const mf_qkv_meta *m) {
    int64_t nt = nd(g, x)->ne[1];
    mf_op op = m->q_norm ? MF_OP_FUSED_QKV_NORM : MF_OP_FUSED_QKV;
    int32_t id = mf_g_node(g, op, MF_DTYPE_F32, (int64_t)m->n_head * m->head_dim, nt,
                           (int32_t[]){x, pos}, 2);
    mf_qkv_meta c = *m;
    c.q = mm_copy(g, &m->q);
    c.k = mm_copy(g, &m->k);
    c.v = mm_copy(g, &m->v);
    c.q_norm = mf_g_str(g, m->q_norm);
    c.k_norm = mf_g_str(g, m->k_norm);
    g->nodes[id].meta.qkv = c;
    g->nodes[id].layer = m->layer;
    return id;
}

int32_t mf_g_fused_ffn(mf_graph *g, int32_t x, const mf_ffn_meta *m) {
    int64_t nt = nd(g, x)->ne[1];
    int32_t id = mf_g_node(g, MF_OP_FUSED_FFN, MF_DTYPE_F32, m->gate.n_out, nt, &x, 1);
    g->nodes[id].meta.ffn.gate = mm_copy(g, &m->gate);
    g->nodes[id].meta.ffn.up = mm_copy(g, &m->up);
    return id;
}

/* ---- node facts ------------------------------------------------------------------- */

int64_t mf_node_nelem(const mf_node *n) {
    return n->ne[0] * n->ne[1] * n->ne[2] * n->ne[3];
}

size_t mf_node_nbytes(const mf_node *n) {
    int64_t e = mf_node_nelem(n);
    return e > 0 ? (size_t)e * 4 : 0; /* f32 and i32 are both 4 bytes */
}

int32_t mf_node_kv_layer(const mf_node *n) {
    switch (n->op) {
    case MF_OP_KVCACHE_STORE:
    case MF_OP_KVCACHE_LOAD:
        return n->meta.kv.layer;
    case MF_OP_ATTN:
    case MF_OP_ATTN_PAGED:
        return n->meta.attn.layer;
    case MF_OP_FUSED_QKV:
    case MF_OP_FUSED_QKV_NORM:
    case MF_OP_QKV_BIAS_ROPE_STORE:
        return n->meta.qkv.layer;
    default:
        return -1;
    }
}

int32_t mf_graph_n_consumers(const mf_graph *g, int32_t i) {
    int32_t c = 0;
    for (int32_t j = i + 1; j < g->n_nodes; j++) {
        const mf_node *n = &g->nodes[j];
        if (n->flags & MF_NODE_DEAD)
            continue;
        for (int s = 0; s < n->n_src; s++)
            c += n->src[s] == i;
    }
    return c;
}

/* ---- validation ---------------------------------------------------------------------- */

#define VFAIL(fmt, ...)                                                                     \
    return mf_errorf(err, "graph: node %d '%s' (%s): " fmt, i, n->name, mf_op_name(n->op), \
                     __VA_ARGS__)

static int check_mm(const mf_graph *g, int32_t i, const mf_node *n, const mf_matmul_meta *m,
                    int64_t in_w, mf_error *err) {
    if (!m->weight)
        VFAIL("matmul without a weight name%s", "");
    if (m->n_in <= 0 || m->n_out <= 0)
        VFAIL("weight '%s': n_in %lld n_out %lld", m->weight, (long long)m->n_in, (long long)m->n_out);
    if (in_w != m->n_in)
        VFAIL("weight '%s' takes rows of %lld, input rows are %lld", m->weight, (long long)m->n_in,
              (long long)in_w);
    return 0;
}

static bool rope_ok(const mf_rope_meta *r, int32_t n_head, int32_t head_dim) {
    return r->n_head == n_head && r->head_dim == head_dim && r->n_rot > 0 && r->n_rot <= head_dim &&
           r->n_rot % 2 == 0;
}

int mf_graph_validate(const mf_graph *g, mf_error *err) {
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const mf_node *n = &g->nodes[i];
        if (n->flags & MF_NODE_DEAD)
            continue;
        if ((unsigned)n->op >= MF_OP_COUNT)
            VFAIL("op id %d out of range", (int)n->op);
        for (int d = 0; d < 4; d++)
            if (n->ne[d] < 0 || (d > 0 && n->ne[d] == 0))
                VFAIL("ne[%d] = %lld", d, (long long)n->ne[d]);
        if (n->n_src < 0 || n->n_src > MF_MAX_SRC)
            VFAIL("n_src %d", n->n_src);
        for (int s = 0; s < n->n_src; s++)
            if (n->src[s] < 0 || n->src[s] >= i || (g->nodes[n->src[s]].flags & MF_NODE_DEAD))
                VFAIL("src[%d] = %d is not a live earlier node", s, n->src[s]);
        const mf_node *a = n->n_src > 0 ? &g->nodes[n->src[0]] : NULL;
        const mf_node *b = n->n_src > 1 ? &g->nodes[n->src[1]] : NULL;
        int32_t layer = mf_node_kv_layer(n);
        if (layer != -1 && (layer < 0 || layer >= g->n_layers))
            VFAIL("layer %d outside [0, %d)", layer, g->n_layers);
        static const int8_t want_src[MF_OP_COUNT] = {
            [MF_OP_INPUT] = 0, [MF_OP_ADD] = 2, [MF_OP_MUL] = 2, [MF_OP_SCALE] = 1,
            [MF_OP_SILU] = 1, [MF_OP_SWIGLU] = 2, [MF_OP_RMSNORM] = 1, [MF_OP_QKNORM] = 1,
            [MF_OP_MATMUL] = 1, [MF_OP_GETROWS] = 1, [MF_OP_ROPE] = 2, [MF_OP_KVCACHE_STORE] = 2,
            [MF_OP_KVCACHE_LOAD] = 1, [MF_OP_ATTN] = 2, [MF_OP_SOFTMAX] = 1, [MF_OP_VIEW] = 1,
            [MF_OP_RESHAPE] = 1, [MF_OP_PERMUTE] = 1, [MF_OP_FUSED_QKV] = 2,
            [MF_OP_FUSED_QKV_NORM] = 2, [MF_OP_FUSED_FFN] = 1, [MF_OP_QKV_BIAS_ROPE_STORE] = 4,
            [MF_OP_ATTN_PAGED] = 3,
        };
        if (n->op == MF_OP_QKV_BIAS_ROPE_STORE ? n->n_src < 3 : n->n_src != want_src[n->op])
            VFAIL("%d srcs, expected %d", n->n_src, want_src[n->op]);
        switch (n->op) {
        case MF_OP_ADD:
        case MF_OP_SWIGLU:
            if (mf_node_nelem(a) != mf_node_nelem(b) || a->ne[0] != b->ne[0])
                VFAIL("src shapes %lldx%lld and %lldx%lld differ", (long long)a->ne[0],
                      (long long)a->ne[1], (long long)b->ne[0], (long long)b->ne[1]);
            break;
        case MF_OP_MUL:
            if (a->ne[0] != b->ne[0] || (mf_node_nelem(a) != mf_node_nelem(b) && mf_node_nelem(b) != b->ne[0]))
                VFAIL("src1 %lldx%lld neither matches src0 %lldx%lld nor is one row", (long long)b->ne[0],
                      (long long)b->ne[1], (long long)a->ne[0], (long long)a->ne[1]);
            break;
        case MF_OP_QKNORM:
            if (n->meta.norm.head_dim <= 0 || n->ne[0] % n->meta.norm.head_dim)
                VFAIL("width %lld is not a multiple of head_dim %d", (long long)n->ne[0],
                      n->meta.norm.head_dim);
            break;
        case MF_OP_MATMUL:
            if (check_mm(g, i, n, &n->meta.matmul, a->ne[0], err))
                return -1;
            if (n->ne[0] != n->meta.matmul.n_out || n->ne[1] != a->ne[1])
                VFAIL("output %lldx%lld for n_out %lld", (long long)n->ne[0], (long long)n->ne[1],
                      (long long)n->meta.matmul.n_out);
            break;
        case MF_OP_GETROWS:
            if (n->meta.getrows.mode == 0) {
                if (a->dtype != MF_DTYPE_I32 || !n->meta.getrows.weight)
                    VFAIL("embedding gather needs I32 ids and a weight%s", "");
            } else if (n->meta.getrows.first < 0 || n->meta.getrows.first + n->ne[1] > a->ne[1] ||
                       n->ne[0] != a->ne[0]) {
                VFAIL("rows [%lld, %lld) of a %lld-row input", (long long)n->meta.getrows.first,
                      (long long)(n->meta.getrows.first + n->ne[1]), (long long)a->ne[1]);
            }
            break;
        case MF_OP_ROPE: {
            const mf_rope_meta *r = &n->meta.rope;
            if (r->head_dim <= 0 || r->n_head <= 0 || (int64_t)r->n_head * r->head_dim != n->ne[0] ||
                r->n_rot <= 0 || r->n_rot > r->head_dim || r->n_rot % 2 || b->dtype != MF_DTYPE_I32 ||
                b->ne[0] != n->ne[1])
                VFAIL("n_head %d head_dim %d n_rot %d for width %lld, %lld positions", r->n_head,
                      r->head_dim, r->n_rot, (long long)n->ne[0], (long long)b->ne[0]);
            break;
        }
        case MF_OP_KVCACHE_STORE:
            if (a->ne[0] != g->kv_dim || b->ne[0] != g->kv_dim || a->ne[1] != b->ne[1])
                VFAIL("K %lldx%lld / V %lldx%lld vs kv_dim %lld", (long long)a->ne[0],
                      (long long)a->ne[1], (long long)b->ne[0], (long long)b->ne[1],
                      (long long)g->kv_dim);
            break;
        case MF_OP_KVCACHE_LOAD:
            if (n->ne[0] != g->kv_dim || n->meta.kv.which < 0 || n->meta.kv.which > 1)
                VFAIL("width %lld vs kv_dim %lld, which %d", (long long)n->ne[0],
                      (long long)g->kv_dim, n->meta.kv.which);
            break;
        case MF_OP_ATTN:
        case MF_OP_ATTN_PAGED: {
            const mf_attn_meta *m = &n->meta.attn;
            if (m->n_head <= 0 || m->n_head_kv <= 0 || m->n_head % m->n_head_kv ||
                (int64_t)m->n_head * m->head_dim != a->ne[0] ||
                (int64_t)m->n_head_kv * m->head_dim != g->kv_dim)
                VFAIL("n_head %d n_head_kv %d head_dim %d for q width %lld, kv_dim %lld", m->n_head,
                      m->n_head_kv, m->head_dim, (long long)a->ne[0], (long long)g->kv_dim);
            if (n->op == MF_OP_ATTN_PAGED) {
                const mf_node *v = &g->nodes[n->src[2]];
                if (b->ne[0] != g->kv_dim || v->ne[0] != g->kv_dim || b->ne[1] != a->ne[1] ||
                    v->ne[1] != a->ne[1])
                    VFAIL("K %lldx%lld / V %lldx%lld vs kv_dim %lld and %lld tokens",
                          (long long)b->ne[0], (long long)b->ne[1], (long long)v->ne[0],
                          (long long)v->ne[1], (long long)g->kv_dim, (long long)a->ne[1]);
            }
            break;
        }
        case MF_OP_VIEW:
            if (n->meta.view.offset < 0 || n->meta.view.offset + n->ne[0] > a->ne[0])
                VFAIL("columns [%lld, %lld) of width %lld", (long long)n->meta.view.offset,
                      (long long)(n->meta.view.offset + n->ne[0]), (long long)a->ne[0]);
            break;
        case MF_OP_RESHAPE:
            if (mf_node_nelem(n) != mf_node_nelem(a))
                VFAIL("%lld elements from %lld", (long long)mf_node_nelem(n), (long long)mf_node_nelem(a));
            break;
        case MF_OP_PERMUTE: {
            int seen = 0;
            for (int d = 0; d < 4; d++)
                seen |= 1 << n->meta.permute.axes[d];
            if (seen != 15)
                VFAIL("axes %d %d %d %d are not a permutation", n->meta.permute.axes[0],
                      n->meta.permute.axes[1], n->meta.permute.axes[2], n->meta.permute.axes[3]);
            break;
        }
        case MF_OP_FUSED_QKV:
        case MF_OP_FUSED_QKV_NORM:
        case MF_OP_QKV_BIAS_ROPE_STORE: {
            const mf_qkv_meta *m = &n->meta.qkv;
            if (n->op != MF_OP_QKV_BIAS_ROPE_STORE &&
                (check_mm(g, i, n, &m->q, a->ne[0], err) || check_mm(g, i, n, &m->k, a->ne[0], err) ||
                 check_mm(g, i, n, &m->v, a->ne[0], err)))
                return -1;
            if (m->n_head <= 0 || m->n_head_kv <= 0 || m->n_head % m->n_head_kv ||
                (int64_t)m->n_head_kv * m->head_dim != g->kv_dim ||
                m->q.n_out != (int64_t)m->n_head * m->head_dim || m->k.n_out != g->kv_dim ||
                m->v.n_out != g->kv_dim)
                VFAIL("n_head %d n_head_kv %d head_dim %d, q/k/v n_out %lld/%lld/%lld, kv_dim %lld",
                      m->n_head, m->n_head_kv, m->head_dim, (long long)m->q.n_out,
                      (long long)m->k.n_out, (long long)m->v.n_out, (long long)g->kv_dim);
            if (n->op != MF_OP_QKV_BIAS_ROPE_STORE &&
                (!rope_ok(&m->rope_q, m->n_head, m->head_dim) || !rope_ok(&m->rope_k, m->n_head_kv, m->head_dim)))
                VFAIL("rope n_head %d/%d head_dim %d/%d n_rot %d/%d for %d q heads, %d kv heads of %d",
                      m->rope_q.n_head, m->rope_k.n_head, m->rope_q.head_dim, m->rope_k.head_dim,
                      m->rope_q.n_rot, m->rope_k.n_rot, m->n_head, m->n_head_kv, m->head_dim);
            if (n->op == MF_OP_FUSED_QKV_NORM && (!m->q_norm || !m->k_norm))
                VFAIL("needs q_norm and k_norm weights%s", "");
            break;
        }
        case MF_OP_FUSED_FFN:
            if (check_mm(g, i, n, &n->meta.ffn.gate, a->ne[0], err) ||
                check_mm(g, i, n, &n->meta.ffn.up, a->ne[0], err))
                return -1;
            if (n->meta.ffn.gate.n_out != n->meta.ffn.up.n_out)
                VFAIL("gate n_out %lld != up n_out %lld", (long long)n->meta.ffn.gate.n_out,
                      (long long)n->meta.ffn.up.n_out);
            break;
        default:
            break;
        }
    }
    return 0;
}

/* ---- weight table ------------------------------------------------------------------ */

/* Open addressing over a power-of-two slot array; entries live in a dense
 * array so mf_weights_at enumerates them in insertion order. */
struct mf_weights {
    mf_weight *items;
    void **owned;     /* per item: malloc'd bytes the table frees, or NULL */
    int64_t n, cap;
    int64_t *slots;   /* index into items, -1 empty */
    int64_t n_slots;
};

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

mf_weights *mf_weights_new(void) {
    mf_weights *w = mf_calloc(1, sizeof *w);
    w->n_slots = 64;
    w->slots = mf_malloc((size_t)w->n_slots * sizeof *w->slots);
    for (int64_t i = 0; i < w->n_slots; i++)
        w->slots[i] = -1;
    return w;
}

void mf_weights_free(mf_weights *w) {
    if (!w)
        return;
    for (int64_t i = 0; i < w->n; i++) {
        free((char *)w->items[i].name);
        free(w->owned[i]);
    }
    free(w->items);
    free(w->owned);
    free(w->slots);
    free(w);
}

static int64_t find_slot(const mf_weights *w, const char *name) {
    uint64_t mask = (uint64_t)w->n_slots - 1;
    for (uint64_t h = hash_name(name) & mask;; h = (h + 1) & mask) {
        int64_t it = w->slots[h];
        if (it < 0 || strcmp(w->items[it].name, name) == 0)
            return (int64_t)h;
    }
}

static void rehash(mf_weights *w) {
    free(w->slots);
    w->n_slots *= 2;
    w->slots = mf_malloc((size_t)w->n_slots * sizeof *w->slots);
    for (int64_t i = 0; i < w->n_slots; i++)
        w->slots[i] = -1;
    for (int64_t i = 0; i < w->n; i++)
        w->slots[find_slot(w, w->items[i].name)] = i;
}

static int weights_put(mf_weights *w, const mf_weight *wt, void *owned, mf_error *err) {
    if (!wt->name)
        return mf_errorf(err, "weights: tensor without a name");
    if (mf_weights_find(w, wt->name))
        return mf_errorf(err, "weights: duplicate tensor '%s'", wt->name);
    if ((w->n + 1) * 2 > w->n_slots)
        rehash(w);
    if (w->n == w->cap) {
        w->cap = w->cap ? w->cap * 2 : 64;
        w->items = mf_realloc(w->items, (size_t)w->cap * sizeof *w->items);
        w->owned = mf_realloc(w->owned, (size_t)w->cap * sizeof *w->owned);
    }
    w->items[w->n] = *wt;
    w->items[w->n].name = mf_strdup(wt->name);
    w->owned[w->n] = owned;
    w->slots[find_slot(w, wt->name)] = w->n;
    w->n++;
    return 0;
}

int mf_weights_add(mf_weights *w, const mf_weight *wt, mf_error *err) {
    return weights_put(w, wt, NULL, err);
}

int mf_weights_add_owned(mf_weights *w, const mf_weight *wt, void *data, mf_error *err) {
    mf_weight c = *wt;
    c.data = data;
    if (weights_put(w, &c, data, err)) {
        free(data);
        return -1;
    }
    return 0;
}

const mf_weight *mf_weights_find(const mf_weights *w, const char *name) {
    if (!w || !name)
        return NULL;
    int64_t it = w->slots[find_slot(w, name)];
    return it < 0 ? NULL : &w->items[it];
}

int64_t mf_weights_count(const mf_weights *w) {
    return w ? w->n : 0;
}

const mf_weight *mf_weights_at(const mf_weights *w, int64_t i) {
    return (w && i >= 0 && i < w->n) ? &w->items[i] : NULL;
}

/* ---- graph params -------------------------------------------------------------------- */

/* A new field must be compared below: this assert trips when the struct grows. */
_Static_assert(sizeof(mf_graph_params) == 32, "new mf_graph_params field: compare it in mf_graph_params_eq");

bool mf_graph_params_eq(const mf_graph_params *a, const mf_graph_params *b) {
    return a->n_tokens == b->n_tokens && a->n_outputs == b->n_outputs && a->n_ctx == b->n_ctx &&
           a->k_type == b->k_type && a->v_type == b->v_type && a->backends == b->backends && a->gpu == b->gpu &&
           a->fuse_qkv == b->fuse_qkv && a->fuse_ffn == b->fuse_ffn &&
           a->fuse_qkv_epilogue == b->fuse_qkv_epilogue && a->fuse_swiglu == b->fuse_swiglu &&
           a->paged == b->paged && a->attn_unfused == b->attn_unfused;
}

/* ---- trace dump ------------------------------------------------------------------------ */

void mf_graph_print(const mf_graph *g, void *file) {
    FILE *f = file ? (FILE *)file : stderr;
    fprintf(f, "graph: %d nodes, %d KV layers, kv_dim %lld\n", g->n_nodes, g->n_layers,
            (long long)g->kv_dim);
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const mf_node *n = &g->nodes[i];
        fprintf(f, "  %4d %-20s %s [%lld %lld %lld %lld]", i, mf_op_name(n->op),
                n->dtype == MF_DTYPE_I32 ? "i32" : "f32", (long long)n->ne[0], (long long)n->ne[1],
                (long long)n->ne[2], (long long)n->ne[3]);
        fprintf(f, " src(");
        for (int s = 0; s < n->n_src; s++)
            fprintf(f, "%s%d", s ? "," : "", n->src[s]);
        fprintf(f, ") be %d buf %d%s%s %s\n", n->backend, n->buf,
                (n->flags & MF_NODE_OUTPUT) ? " OUT" : "", (n->flags & MF_NODE_DEAD) ? " DEAD" : "",
                n->name);
    }
}
