/* test_graph_passes.c - the graph IR and the build-time passes (assign, fuse,
 * alloc) against fake backends: op names, params identity, liveness
 * allocation checked by simulating every value's live interval, in-place and
 * RESHAPE aliasing rules, priority/alternate assignment, SWIGLU fusion. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "ir/graph.h"
#include "engine/passes.h"
#include "mf_test.h"

/* ---- a fake backend: a pool of sizes with an exact-size free list ---------------- */

typedef struct fake {
    mf_backend base;
    uint64_t ops_mask; /* bit op: supports_op says yes */
    bool fuse;
    size_t sizes[4096];
    bool is_free[4096];
    bool fresh[4096];
    int32_t n;
    int n_alloc_calls;
} fake;

static const char *f_name(const mf_backend *b) {
    return ((fake *)b->ctx)->ops_mask == ~0ull ? "all" : "some";
}
static bool f_supports(const mf_backend *b, const mf_node *n) {
    return ((fake *)b->ctx)->ops_mask >> n->op & 1u;
}
static bool f_fused(const mf_backend *b, mf_fused_kind k) {
    return ((fake *)b->ctx)->fuse;
}
static int32_t f_alloc(mf_backend *b, size_t nb, mf_error *err) {
    fake *f = b->ctx;
    f->n_alloc_calls++;
    for (int32_t i = 0; i < f->n; i++)
        if (f->is_free[i] && f->sizes[i] == nb) {
            f->is_free[i] = false;
            return i;
        }
    f->sizes[f->n] = nb;
    f->is_free[f->n] = false;
    return f->n++;
}
static int32_t f_fresh(mf_backend *b, size_t nb, mf_error *err) {
    fake *f = b->ctx;
    f->sizes[f->n] = nb;
    f->is_free[f->n] = false;
    f->fresh[f->n] = true;
    return f->n++;
}
static void f_free(mf_backend *b, int32_t id) {
    fake *f = b->ctx;
    MF_ASSERT(id >= 0 && id < f->n && !f->is_free[id]);
    f->is_free[id] = true;
}
/* Every op's entry asks the mask (the passes never execute). */
#define F(op) [op] = {f_supports, mf_op_nothing}
static const mf_op_entry fake_table[] = {
    F(MF_OP_INPUT), F(MF_OP_ADD), F(MF_OP_MUL), F(MF_OP_SCALE), F(MF_OP_SILU), F(MF_OP_SWIGLU),
    F(MF_OP_RMSNORM), F(MF_OP_QKNORM), F(MF_OP_MATMUL), F(MF_OP_GETROWS), F(MF_OP_ROPE),
    F(MF_OP_KVCACHE_STORE), F(MF_OP_KVCACHE_LOAD), F(MF_OP_ATTN), F(MF_OP_SOFTMAX), F(MF_OP_VIEW),
    F(MF_OP_RESHAPE), F(MF_OP_PERMUTE), F(MF_OP_FUSED_QKV), F(MF_OP_FUSED_QKV_NORM),
    F(MF_OP_FUSED_FFN), F(MF_OP_QKV_BIAS_ROPE_STORE), F(MF_OP_ATTN_PAGED),
};
#undef F
MF_OP_TABLE_CHECK(fake_table);
static const mf_backend_ops fake_ops = {
    .name = f_name, .op_table = fake_table, .supports_fused = f_fused,
    .alloc_buffer = f_alloc, .free_buffer = f_free, .alloc_fresh = f_fresh,
};

static fake *fake_new(uint64_t mask) {
    fake *f = calloc(1, sizeof *f);
    f->ops_mask = mask;
    f->fuse = true;
    f->base = (mf_backend){.ops = &fake_ops, .kind = MF_BACKEND_CPU, .ctx = f};
    return f;
}

static int all_free(const fake *f) {
    for (int32_t i = 0; i < f->n; i++)
        if (!f->is_free[i])
            return 0;
    return 1;
}

/* ---- the simulation: no two live values share a buffer ------------------------------ */

static int32_t root_of(const mf_graph *g, int32_t i) {
    while (g->nodes[i].op == MF_OP_RESHAPE)
        i = g->nodes[i].src[0];
    return i;
}

static bool is_inplace_op(mf_op op) {
    return op == MF_OP_ADD || op == MF_OP_MUL || op == MF_OP_SCALE || op == MF_OP_SILU ||
           op == MF_OP_SWIGLU || op == MF_OP_RMSNORM || op == MF_OP_QKNORM || op == MF_OP_ROPE ||
           op == MF_OP_SOFTMAX;
}

/* Checks, for every pair of values held in one buffer of one backend, that
 * their live intervals only touch through a legal in-place handoff. Returns
 * the number of violations. */
static int simulate(const mf_graph *g, const mf_plan *p) {
    int32_t nn = g->n_nodes;
    int32_t *start = malloc(nn * sizeof *start), *end = malloc(nn * sizeof *end);
    for (int32_t i = 0; i < nn; i++) {
        start[i] = g->nodes[i].op == MF_OP_INPUT ? -1 : i;
        end[i] = i;
    }
    for (int32_t i = 0; i < nn; i++) {
        const mf_node *n = &g->nodes[i];
        if (n->flags & MF_NODE_DEAD)
            continue;
        for (int s = 0; s < n->n_src; s++) {
            int32_t r = root_of(g, n->src[s]);
            if (end[r] < i)
                end[r] = i;
        }
        if (n->flags & MF_NODE_OUTPUT)
            end[root_of(g, i)] = INT32_MAX;
    }
    int bad = 0;
    for (int32_t a = 0; a < nn; a++) {
        const mf_node *na = &g->nodes[a];
        if ((na->flags & MF_NODE_DEAD) || na->op == MF_OP_RESHAPE || na->buf < 0)
            continue;
        for (int32_t b = a + 1; b < nn; b++) {
            const mf_node *nb = &g->nodes[b];
            if ((nb->flags & MF_NODE_DEAD) || nb->op == MF_OP_RESHAPE || nb->buf != na->buf ||
                p->buf_backend[a] != p->buf_backend[b])
                continue;
            int32_t s1 = start[a], e1 = end[a], s2 = start[b], e2 = end[b];
            if (s2 < s1) { /* order by start */
                int32_t t = s1; s1 = s2; s2 = t;
                t = e1; e1 = e2; e2 = t;
            }
            (void)e2;
            int32_t later = start[a] <= start[b] ? b : a, earlier = later == b ? a : b;
            bool handoff = e1 == s2 && is_inplace_op(g->nodes[later].op) &&
                           root_of(g, g->nodes[later].src[0]) == earlier;
            if (e1 > s2 || (e1 == s2 && !handoff)) {
                fprintf(stderr, "  values %d [%d,%d] and %d share buffer %d\n", a, start[a], end[a], b, na->buf);
                bad++;
            }
        }
    }
    free(start);
    free(end);
    return bad;
}

static void assign_all(mf_graph *g, int32_t backend) {
    for (int32_t i = 0; i < g->n_nodes; i++)
        g->nodes[i].backend = backend;
}

/* ---- tests --------------------------------------------------------------------------- */

MF_TEST(op_table_complete) {
    for (int op = 0; op < MF_OP_COUNT; op++) {
        const char *nm = mf_op_name((mf_op)op);
        CHECK_MSG(nm && strcmp(nm, "unknown") != 0 && nm[0], "op %d has no name", op);
        for (int o2 = 0; o2 < op; o2++)
            CHECK_MSG(strcmp(nm, mf_op_name((mf_op)o2)) != 0, "ops %d and %d share name %s", op, o2, nm);
    }
    CHECK(strcmp(mf_op_name(MF_OP_MATMUL), "matmul") == 0);
    CHECK(strcmp(mf_op_name(MF_OP_COUNT), "unknown") == 0);
}

MF_TEST(params_equality_covers_every_field) {
    mf_graph_params a = {.n_tokens = 7, .n_outputs = 1, .n_ctx = 128, .k_type = MF_TYPE_F16, .v_type = MF_TYPE_F16,
                         .backends = 3, .gpu = true, .fuse_qkv = true, .fuse_ffn = false,
                         .fuse_qkv_epilogue = true, .fuse_swiglu = false};
    mf_graph_params b = a;
    CHECK(mf_graph_params_eq(&a, &b));
    int changed = 0;
#define FLIP(field, val)                                   \
    do {                                                   \
        b = a;                                             \
        b.field = val;                                     \
        CHECK_MSG(!mf_graph_params_eq(&a, &b), #field);     \
        CHECK_MSG(!mf_graph_params_eq(&b, &a), #field);     \
        changed++;                                         \
    } while (0)
    FLIP(n_tokens, 8);
    FLIP(n_outputs, 7);
    FLIP(n_ctx, 256);
    FLIP(k_type, MF_TYPE_Q8_0);
    FLIP(v_type, MF_TYPE_Q4_0);
    FLIP(backends, 1);
    FLIP(gpu, false);
    FLIP(fuse_qkv, false);
    FLIP(fuse_ffn, true);
    FLIP(fuse_qkv_epilogue, false);
    FLIP(fuse_swiglu, true);
    FLIP(attn_unfused, true);
    CHECK_EQ_INT(changed, 12); /* graph.c asserts the struct size, so a new field fails there */
}

MF_TEST(weights_table_hash) {
    mf_weights *w = mf_weights_new();
    mf_error err;
    char name[64];
    static float data[4] = {1, 2, 3, 4};
    for (int i = 0; i < 500; i++) {
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", i);
        mf_weight wt = {.name = name, .type = MF_TYPE_F32, .n_dims = 1, .ne = {i + 1, 1, 1, 1}, .data = data};
        CHECK(mf_weights_add(w, &wt, &err) == 0);
    }
    CHECK_EQ_INT(mf_weights_count(w), 500);
    const mf_weight *f = mf_weights_find(w, "blk.321.attn_q.weight");
    CHECK(f && f->ne[0] == 322);
    CHECK(mf_weights_find(w, "blk.500.attn_q.weight") == NULL);
    CHECK(strcmp(mf_weights_at(w, 7)->name, "blk.7.attn_q.weight") == 0);
    mf_weight dup = {.name = "blk.3.attn_q.weight", .type = MF_TYPE_F32, .ne = {1, 1, 1, 1}, .data = data};
    CHECK(mf_weights_add(w, &dup, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "duplicate tensor 'blk.3.attn_q.weight'");
    mf_weights_free(w);
}

/* A residual chain: x -> 8 x (norm -> matmul -> silu -> add residual) -> out. */
static void build_chain(mf_graph *g, int n_blocks) {
    int32_t x = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, 64, 4);
    for (int i = 0; i < n_blocks; i++) {
        int32_t h = mf_g_rmsnorm(g, x, NULL, 1e-5f);
        h = mf_g_matmul(g, h, "w", MF_TYPE_F32, NULL, 64, 128);
        h = mf_g_silu(g, h);
        h = mf_g_matmul(g, h, "w2", MF_TYPE_F32, NULL, 128, 64);
        x = mf_g_add(g, h, x);
    }
    int32_t o = mf_g_scale(g, x, 2.0f);
    g->nodes[o].flags |= MF_NODE_OUTPUT;
}

MF_TEST(alloc_chain_reuses_buffers) {
    fake *f = fake_new(~0ull);
    mf_backend *be[1] = {&f->base};
    mf_graph g;
    mf_graph_init(&g);
    build_chain(&g, 8);
    assign_all(&g, 0);
    mf_plan p;
    mf_error err;
    CHECK(mf_alloc_plan(&g, be, 1, &p, &err) == 0);
    CHECK_MSG(p.n_buffers[0] < g.n_nodes / 4, "%d buffers for %d nodes", p.n_buffers[0], g.n_nodes);
    CHECK_MSG(p.n_buffers[0] <= 5, "%d buffers", p.n_buffers[0]);
    CHECK(p.n_inplace > 0);
    CHECK_EQ_INT(simulate(&g, &p), 0);
    CHECK_EQ_INT(p.n_splits, 1);
    for (int32_t i = 0; i < g.n_nodes; i++)
        CHECK(g.nodes[i].buf >= 0);
    /* the output is still held at the end, everything else is back in the pool */
    int held = 0;
    for (int32_t i = 0; i < f->n; i++)
        held += !f->is_free[i];
    CHECK_EQ_INT(held, 1);
    mf_plan_free(&p, be);
    CHECK(all_free(f));
    mf_graph_free(&g);
    free(f);
}

MF_TEST(inplace_exactly_when_legal) {
    fake *f0 = fake_new(~0ull), *f1 = fake_new(~0ull);
    mf_backend *be[2] = {&f0->base, &f1->base};
    mf_graph g;
    mf_graph_init(&g);
    int32_t a = mf_g_input(&g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, 32, 2);
    int32_t b = mf_g_silu(&g, a);           /* a still read by c: not in place */
    int32_t c = mf_g_add(&g, a, b);         /* a dies here: in place on a */
    int32_t d = mf_g_matmul(&g, c, "w", MF_TYPE_F32, NULL, 32, 32); /* matmul: never in place */
    int32_t e = mf_g_view(&g, d, 0, 16);    /* view: never in place (and smaller) */
    int32_t f = mf_g_scale(&g, d, 3.0f);    /* d dies here, same size: in place */
    g.nodes[f].flags |= MF_NODE_OUTPUT;
    int32_t h = mf_g_silu(&g, f);           /* f is an output: not in place */
    int32_t i = mf_g_rmsnorm(&g, h, NULL, 1e-5f); /* on backend 1: not in place */
    int32_t j = mf_g_rmsnorm(&g, i, NULL, 1e-5f); /* i dies, same backend: in place */
    int32_t r = mf_g_reshape(&g, j, 16, 4);  /* alias of j */
    int32_t k = mf_g_silu(&g, j);           /* j still read through r later: not in place */
    int32_t l = mf_g_add(&g, r, k);         /* r (alias of j) dies: in place on j's buffer */
    g.nodes[l].flags |= MF_NODE_OUTPUT;
    (void)e;
    assign_all(&g, 0);
    g.nodes[i].backend = 1;
    g.nodes[j].backend = 1;
    g.nodes[r].backend = 1;
    g.nodes[k].backend = 1;
    g.nodes[l].backend = 1;
    mf_plan p;
    mf_error err;
    CHECK(mf_alloc_plan(&g, be, 2, &p, &err) == 0);
    CHECK(g.nodes[b].buf != g.nodes[a].buf);
    CHECK(g.nodes[c].buf == g.nodes[a].buf);
    CHECK(g.nodes[d].buf != g.nodes[c].buf);
    CHECK(g.nodes[e].buf != g.nodes[d].buf);
    CHECK(g.nodes[f].buf == g.nodes[d].buf);
    CHECK(g.nodes[h].buf != g.nodes[f].buf);
    CHECK(p.buf_backend[i] == 1 && p.buf_backend[h] == 0);
    CHECK(g.nodes[j].buf == g.nodes[i].buf);
    CHECK(g.nodes[r].buf == g.nodes[j].buf && p.buf_backend[r] == 1);
    CHECK(g.nodes[k].buf != g.nodes[j].buf);
    CHECK(g.nodes[l].buf == g.nodes[j].buf);
    CHECK_EQ_INT(p.n_inplace, 4);
    CHECK_EQ_INT(simulate(&g, &p), 0);
    /* splits: [b..h] on 0, [i..l] on 1 with h copied in */
    CHECK_EQ_INT(p.n_splits, 2);
    CHECK_EQ_INT(p.splits[1].n_inputs, 1);
    CHECK_EQ_INT(p.splits[1].inputs[0], h);
    CHECK(f1->fresh[p.splits[1].staging[0]]);
    mf_plan_free(&p, be);
    CHECK(all_free(f0) && all_free(f1));
    mf_graph_free(&g);
    free(f0);
    free(f1);
}

MF_TEST(reshape_aliases_and_extends_life) {
    fake *f = fake_new(~0ull);
    mf_backend *be[1] = {&f->base};
    mf_graph g;
    mf_graph_init(&g);
    int32_t a = mf_g_input(&g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, 8, 8);
    int32_t s = mf_g_scale(&g, a, 2.0f);
    int32_t r = mf_g_reshape(&g, s, 16, 4);
    int32_t t = mf_g_silu(&g, a);          /* a dies: in place on a */
    int32_t u = mf_g_scale(&g, t, 0.5f);   /* t dies: in place */
    int32_t v = mf_g_reshape(&g, u, 16, 4);
    int32_t w = mf_g_add(&g, r, v);         /* s (through r) must still be intact here */
    g.nodes[w].flags |= MF_NODE_OUTPUT;
    assign_all(&g, 0);
    mf_plan p;
    mf_error err;
    CHECK(mf_alloc_plan(&g, be, 1, &p, &err) == 0);
    CHECK(g.nodes[r].buf == g.nodes[s].buf);
    CHECK(g.nodes[v].buf == g.nodes[u].buf);
    CHECK(g.nodes[t].buf != g.nodes[s].buf);
    CHECK(g.nodes[u].buf != g.nodes[s].buf);
    CHECK(g.nodes[w].buf == g.nodes[s].buf);
    CHECK_EQ_INT(simulate(&g, &p), 0);
    mf_plan_free(&p, be);
    mf_graph_free(&g);
    free(f);
}

/* Random graphs: every allocation is checked by the simulation. */
MF_TEST(alloc_random_graphs_never_share_live_buffers) {
    srand(1234);
    for (int iter = 0; iter < 200; iter++) {
        fake *f0 = fake_new(~0ull), *f1 = fake_new(~0ull);
        mf_backend *be[2] = {&f0->base, &f1->base};
        mf_graph g;
        mf_graph_init(&g);
        int32_t ws[3] = {16, 32, 48};
        mf_g_input(&g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, 16, 2);
        mf_g_input(&g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, 32, 2);
        for (int k = 0; k < 40; k++) {
            int32_t x = rand() % g.n_nodes;
            int32_t y = rand() % g.n_nodes;
            int op = rand() % 6;
            int64_t wx = g.nodes[x].ne[0] * g.nodes[x].ne[1] / 2;
            int32_t id;
            if (op == 0 && mf_node_nelem(&g.nodes[x]) == mf_node_nelem(&g.nodes[y]))
                id = mf_g_add(&g, x, y);
            else if (op == 1)
                id = mf_g_silu(&g, x);
            else if (op == 2)
                id = mf_g_reshape(&g, x, wx, 2);
            else if (op == 3)
                id = mf_g_matmul(&g, x, "w", MF_TYPE_F32, NULL, g.nodes[x].ne[0], ws[rand() % 3]);
            else if (op == 4)
                id = mf_g_scale(&g, x, 1.5f);
            else
                id = mf_g_rmsnorm(&g, x, NULL, 1e-5f);
            if (rand() % 10 == 0)
                g.nodes[id].flags |= MF_NODE_OUTPUT;
        }
        for (int32_t i = 0; i < g.n_nodes; i++)
            g.nodes[i].backend = rand() % 2;
        for (int32_t i = 0; i < g.n_nodes; i++)
            if (g.nodes[i].op == MF_OP_RESHAPE)
                g.nodes[i].backend = g.nodes[g.nodes[i].src[0]].backend;
        mf_plan p;
        mf_error err;
        CHECK(mf_alloc_plan(&g, be, 2, &p, &err) == 0);
        int bad = simulate(&g, &p);
        CHECK_MSG(bad == 0, "iteration %d: %d shared live buffers", iter, bad);
        /* every cross-backend read has a staging copy */
        for (int32_t s = 0; s < p.n_splits; s++)
            for (int32_t i = p.splits[s].first; i <= p.splits[s].last; i++) {
                const mf_node *n = &g.nodes[i];
                if (!mf_node_executes(n))
                    continue;
                CHECK(n->backend == p.splits[s].backend);
                for (int j = 0; j < n->n_src; j++) {
                    if (p.buf_backend[n->src[j]] == n->backend)
                        continue;
                    bool found = false;
                    for (int32_t k = 0; k < p.splits[s].n_inputs; k++)
                        found |= p.splits[s].inputs[k] == n->src[j];
                    CHECK(found);
                }
            }
        mf_plan_free(&p, be);
        CHECK(all_free(f0) && all_free(f1));
        mf_graph_free(&g);
        free(f0);
        free(f1);
    }
}

MF_TEST(assign_priority_alternate_and_refusal) {
    uint64_t only_add = (1ull << MF_OP_INPUT) | (1ull << MF_OP_ADD) | (1ull << MF_OP_RESHAPE);
    fake *f0 = fake_new(only_add), *f1 = fake_new(~0ull & ~(1ull << MF_OP_PERMUTE));
    mf_backend *be[2] = {&f0->base, &f1->base};
    mf_graph g;
    mf_graph_init(&g);
    int32_t a = mf_g_input(&g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, 8, 2);
    int32_t b = mf_g_silu(&g, a);
    int32_t c = mf_g_add(&g, b, a);
    int32_t d = mf_g_add(&g, c, c);
    int32_t e = mf_g_reshape(&g, d, 4, 4);
    int32_t f = mf_g_scale(&g, e, 2.0f);
    mf_error err;
    CHECK(mf_assign_backends(&g, be, 2, 3, false, &err) == 0);
    CHECK_EQ_INT(g.nodes[a].backend, 1); /* its first consumer (silu) runs on 1 */
    CHECK_EQ_INT(g.nodes[b].backend, 1);
    CHECK_EQ_INT(g.nodes[c].backend, 0);
    CHECK_EQ_INT(g.nodes[d].backend, 0);
    CHECK_EQ_INT(g.nodes[e].backend, 0); /* follows its source */
    CHECK_EQ_INT(g.nodes[f].backend, 1);
    /* participation: only backend 1 */
    CHECK(mf_assign_backends(&g, be, 2, 2, false, &err) == 0);
    CHECK_EQ_INT(g.nodes[c].backend, 1);
    /* alternate: add nodes 2 and 3 alternate between both supporters */
    CHECK(mf_assign_backends(&g, be, 2, 3, true, &err) == 0);
    CHECK_EQ_INT(g.nodes[c].backend, c % 2);
    CHECK_EQ_INT(g.nodes[d].backend, d % 2);
    CHECK(g.nodes[c].backend != g.nodes[d].backend);
    /* nobody supports permute */
    int32_t axes[4] = {1, 0, 2, 3};
    int32_t p = mf_g_permute(&g, f, axes);
    mf_g_set_name(&g, p, "blk.%d.perm", 5);
    CHECK(mf_assign_backends(&g, be, 2, 3, false, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "'blk.5.perm'");
    CHECK_STR_CONTAINS(err.msg, "permute");
    CHECK(mf_assign_backends(&g, be, 2, 0, false, &err) == -1);
    mf_graph_free(&g);
    free(f0);
    free(f1);
}

MF_TEST(assign_keeps_layer_kv_ops_together) {
    uint64_t no_attn = ~0ull & ~(1ull << MF_OP_ATTN);
    fake *f0 = fake_new(no_attn), *f1 = fake_new(~0ull), *f2 = fake_new(~0ull);
    mf_backend *be[3] = {&f0->base, &f1->base, &f2->base};
    mf_graph g;
    mf_graph_init(&g);
    g.n_layers = 4;
    g.kv_dim = 16;
    int32_t x = mf_g_input(&g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, 16, 1);
    int32_t st[4], at[4];
    for (int l = 0; l < 4; l++) {
        st[l] = mf_g_kv_store(&g, x, x, l);
        mf_attn_meta m = {.layer = l, .n_head = 2, .n_head_kv = 2, .head_dim = 8, .scale = 0.3f};
        at[l] = mf_g_attn(&g, x, st[l], &m);
    }
    mf_error err;
    CHECK(mf_assign_backends(&g, be, 3, 7, false, &err) == 0);
    for (int l = 0; l < 4; l++) {
        CHECK_EQ_INT(g.nodes[st[l]].backend, 1); /* backend 0 cannot run the layer's attn */
        CHECK_EQ_INT(g.nodes[at[l]].backend, 1);
    }
    CHECK(mf_assign_backends(&g, be, 3, 7, true, &err) == 0);
    for (int l = 0; l < 4; l++) {
        CHECK_EQ_INT(g.nodes[st[l]].backend, g.nodes[at[l]].backend);
        CHECK_EQ_INT(g.nodes[at[l]].backend, 1 + l % 2);
    }
    /* only backend 0 takes part: the attention has no home */
    CHECK(mf_assign_backends(&g, be, 3, 1, false, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "attn");
    mf_graph_free(&g);
    free(f0);
    free(f1);
    free(f2);
}

MF_TEST(fuse_silu_mul_to_swiglu) {
    fake *f = fake_new(~0ull);
    mf_backend *be[1] = {&f->base};
    mf_graph g;
    mf_graph_init(&g);
    int32_t a = mf_g_input(&g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, 8, 2);
    int32_t b = mf_g_input(&g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, 8, 2);
    int32_t s1 = mf_g_silu(&g, a);
    int32_t m1 = mf_g_mul(&g, b, s1);       /* silu as src1: fused as swiglu(a, b) */
    int32_t s2 = mf_g_silu(&g, b);
    int32_t m2 = mf_g_mul(&g, s2, a);
    int32_t z = mf_g_add(&g, s2, m2);       /* s2 has two consumers: not fused */
    (void)z;
    assign_all(&g, 0);
    mf_graph_params p = {.fuse_swiglu = false};
    CHECK_EQ_INT(mf_fuse(&g, be, &p), 0);
    p.fuse_swiglu = true;
    f->fuse = false;
    CHECK_EQ_INT(mf_fuse(&g, be, &p), 0);
    f->fuse = true;
    CHECK_EQ_INT(mf_fuse(&g, be, &p), 1);
    CHECK(g.nodes[m1].op == MF_OP_SWIGLU && g.nodes[m1].src[0] == a && g.nodes[m1].src[1] == b);
    CHECK(g.nodes[s1].flags & MF_NODE_DEAD);
    CHECK(g.nodes[m2].op == MF_OP_MUL && !(g.nodes[s2].flags & MF_NODE_DEAD));
    mf_error err;
    CHECK(mf_graph_validate(&g, &err) == 0);
    mf_plan pl;
    CHECK(mf_alloc_plan(&g, be, 1, &pl, &err) == 0);
    CHECK_EQ_INT(g.nodes[s1].buf, -1);
    mf_plan_free(&pl, be);
    mf_graph_free(&g);
    free(f);
}

MF_TEST(validate_names_bad_nodes) {
    mf_graph g;
    mf_graph_init(&g);
    int32_t x = mf_g_input(&g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, 64, 3);
    int32_t m = mf_g_matmul(&g, x, "blk.0.ffn_up.weight", MF_TYPE_Q4_0, NULL, 96, 32);
    mf_g_set_name(&g, m, "blk.0.ffn_up");
    mf_error err;
    CHECK(mf_graph_validate(&g, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "blk.0.ffn_up");
    CHECK_STR_CONTAINS(err.msg, "96");
    CHECK_STR_CONTAINS(err.msg, "64");
    mf_graph_free(&g);

    mf_graph_init(&g);
    x = mf_g_input(&g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, 64, 3);
    int32_t y = mf_g_input(&g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, 32, 3);
    mf_g_add(&g, x, y);
    CHECK(mf_graph_validate(&g, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "add");
    mf_graph_free(&g);
}

MF_TEST(size_classes) {
    CHECK_EQ_INT(mf_size_class(100), 100);
    CHECK_EQ_INT(mf_size_class(256), 256);
    for (size_t n = 257; n < 100000; n += 37) {
        size_t c = mf_size_class(n);
        CHECK(c >= n && c < n + n / 4 + 1);
    }
    CHECK_EQ_INT(mf_size_class(1000), mf_size_class(1024));
}

MF_TEST_MAIN(MF_T(op_table_complete), MF_T(params_equality_covers_every_field), MF_T(weights_table_hash),
             MF_T(alloc_chain_reuses_buffers), MF_T(inplace_exactly_when_legal),
             MF_T(reshape_aliases_and_extends_life), MF_T(alloc_random_graphs_never_share_live_buffers),
             MF_T(assign_priority_alternate_and_refusal), MF_T(assign_keeps_layer_kv_ops_together),
             MF_T(fuse_silu_mul_to_swiglu), MF_T(validate_names_bad_nodes), MF_T(size_classes))
