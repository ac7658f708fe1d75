/* test_engine_ops.c - every op alone through the whole engine (build, assign,
 * alloc, scheduler) on the ref and the cpu backend: a tiny graph
 * INPUT(external, random) -> op -> output with random weights in an in-memory
 * mf_weights table. Ops both run: cpu vs ref within tolerance (matmul: the
 * cpu quantizes activations). Ops ref refuses (RoPE, QK norm, KV, attention,
 * fused): cpu vs a float64 reference written here. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/engine.h"
#include "mf_test.h"

/* ---- random data and the weight table ------------------------------------------------ */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}
static float *rand_vec(int64_t n, float scale) {
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = frand() * scale;
    return v;
}

static mf_weights *W;

/* Adds a random [n_in, n_out] weight of `type`, quantized from floats. */
static void add_weight(const char *name, uint32_t type, int64_t n_in, int64_t n_out, float scale) {
    float *f = rand_vec(n_in * n_out, scale);
    size_t bytes = mf_type_row_size(type, n_in) * (size_t)n_out;
    void *q = malloc(bytes);
    mf_quantize_rows(type, f, q, n_out, n_in);
    free(f);
    mf_weight w = {.name = name, .type = type, .n_dims = 2, .ne = {n_in, n_out, 1, 1}, .nbytes = bytes};
    mf_error err;
    MF_ASSERT(mf_weights_add_owned(W, &w, q, &err) == 0);
}

/* Weight rows as doubles, through the reference dequantizer. */
static double *weight_f64(const char *name) {
    const mf_weight *w = mf_weights_find(W, name);
    MF_ASSERT(w);
    int64_t n = w->ne[0] * w->ne[1];
    float *f = malloc((size_t)n * sizeof *f);
    mf_dequantize_rows(w->type, w->data, f, w->ne[1], w->ne[0]);
    double *d = malloc((size_t)n * sizeof *d);
    for (int64_t i = 0; i < n; i++)
        d[i] = f[i];
    free(f);
    return d;
}

/* ---- one case: its graph and its inputs ------------------------------------------- */

enum { C_ADD, C_MUL, C_MUL_BCAST, C_SCALE, C_SILU, C_SWIGLU, C_SILU_MUL, C_RMSNORM, C_RMSNORM_F16,
       C_RMSNORM_NOW, C_SOFTMAX, C_VIEW, C_PERMUTE, C_ROWS, C_EMBED, C_MATMUL, C_ROPE, C_QKNORM,
       C_STORE_LOAD, C_ATTN, C_ATTN_PAGED, C_FUSED_QKV, C_FUSED_QKV_K, C_FUSED_FFN, C_EPILOGUE, C_EPILOGUE_K };

typedef struct tcase {
    int kind;
    int64_t w, nt;           /* input width, rows */
    const char *weight;      /* MATMUL / EMBED / norm weight */
    uint32_t wtype;
    const char *bias;
    const char *up;          /* FUSED_FFN up weight (gate in .weight) */
    int64_t n_out;
    mf_rope_meta rope;
    int64_t n_kv;
    int32_t n_head, n_head_kv, head_dim;
    bool no_pos;             /* QKV_BIAS_ROPE_STORE without a positions src (n_past + t) */
    int64_t out_nelem;       /* set by the builder */
} tcase;

static int build_case(void *ctx, const mf_graph_params *p, mf_graph *g, mf_error *err) {
    tcase *c = ctx;
    int64_t nt = p->n_tokens;
    int32_t x = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, c->w, nt);
    int32_t y = -1, o = -1;
    switch (c->kind) {
    case C_ADD: y = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, c->w, nt); o = mf_g_add(g, x, y); break;
    case C_MUL: y = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, c->w, nt); o = mf_g_mul(g, x, y); break;
    case C_MUL_BCAST: y = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, c->w, 1); o = mf_g_mul(g, x, y); break;
    case C_SCALE: o = mf_g_scale(g, x, -1.75f); break;
    case C_SILU: o = mf_g_silu(g, x); break;
    case C_SWIGLU: y = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, c->w, nt); o = mf_g_swiglu(g, x, y); break;
    case C_SILU_MUL:
        y = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, c->w, nt);
        o = mf_g_mul(g, mf_g_silu(g, x), y);
        break;
    case C_RMSNORM: case C_RMSNORM_F16: case C_RMSNORM_NOW: o = mf_g_rmsnorm(g, x, c->weight, 1e-5f); break;
    case C_SOFTMAX: o = mf_g_softmax(g, x, 0.7f); break;
    case C_VIEW: o = mf_g_view(g, x, 5, c->w - 9); break;
    case C_PERMUTE: {
        int32_t r = mf_g_reshape(g, x, c->w / 4, 4 * nt);
        g->nodes[r].ne[1] = 4;
        g->nodes[r].ne[2] = nt; /* [w/4, 4, nt] */
        o = mf_g_permute(g, r, (int32_t[]){1, 2, 0, 3});
        break;
    }
    case C_ROWS: o = mf_g_rows(g, x, 1, nt - 2); break;
    case C_EMBED: {
        int32_t t = mf_g_input(g, MF_INPUT_TOKENS, MF_DTYPE_I32, nt, 1);
        o = mf_g_embed(g, t, c->weight, c->wtype, c->w);
        o = mf_g_add(g, o, x);
        break;
    }
    case C_MATMUL: o = mf_g_matmul(g, x, c->weight, c->wtype, c->bias, c->w, c->n_out); break;
    case C_ROPE: {
        int32_t pos = mf_g_input(g, MF_INPUT_POSITIONS, MF_DTYPE_I32, nt, 1);
        o = mf_g_rope(g, x, pos, &c->rope);
        break;
    }
    case C_QKNORM: o = mf_g_qknorm(g, x, c->weight, c->head_dim, 1e-6f); break;
    case C_STORE_LOAD: {
        y = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, c->w, nt);
        int32_t st = mf_g_kv_store(g, x, y, 0);
        int32_t lk = mf_g_kv_load(g, st, 0, 0, c->n_kv);
        int32_t lv = mf_g_kv_load(g, st, 0, 1, c->n_kv);
        /* one output: K + 1000 V, row by row */
        int32_t r1 = mf_g_reshape(g, lk, c->w * c->n_kv, 1);
        int32_t r2 = mf_g_reshape(g, lv, c->w * c->n_kv, 1);
        o = mf_g_add(g, mf_g_scale(g, r1, 1.0f), mf_g_scale(g, r2, 1000.0f));
        break;
    }
    case C_ATTN: {
        int32_t k = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, g->kv_dim, nt);
        int32_t v = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, g->kv_dim, nt);
        int32_t st = mf_g_kv_store(g, k, v, 0);
        mf_attn_meta m = {.layer = 0, .n_head = c->n_head, .n_head_kv = c->n_head_kv,
                          .head_dim = c->head_dim, .scale = 1.0f / sqrtf((float)c->head_dim)};
        o = mf_g_attn(g, x, st, &m);
        break;
    }
    case C_ATTN_PAGED: {
        int32_t k = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, g->kv_dim, nt);
        int32_t v = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, g->kv_dim, nt);
        mf_attn_meta m = {.layer = 0, .n_head = c->n_head, .n_head_kv = c->n_head_kv,
                          .head_dim = c->head_dim, .scale = 1.0f / sqrtf((float)c->head_dim)};
        o = mf_g_attn_paged(g, x, k, v, &m);
        break;
    }
    case C_FUSED_QKV: case C_FUSED_QKV_K: {
        int32_t pos = mf_g_input(g, MF_INPUT_POSITIONS, MF_DTYPE_I32, nt, 1);
        mf_qkv_meta m = {.layer = 0, .n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = c->head_dim,
                         .norm_eps = 1e-6f};
        int64_t qd = (int64_t)c->n_head * c->head_dim, kd = (int64_t)c->n_head_kv * c->head_dim;
        m.q = (mf_matmul_meta){"fq", c->wtype, "fq.b", c->w, qd};
        m.k = (mf_matmul_meta){"fk", c->wtype, "fk.b", c->w, kd};
        m.v = (mf_matmul_meta){"fv", c->wtype, NULL, c->w, kd};
        if (c->weight) { /* QKV_NORM */
            m.q_norm = "qn";
            m.k_norm = "kn";
        }
        m.rope_q = c->rope;
        m.rope_k = c->rope;
        m.rope_k.n_head = c->n_head_kv;
        o = mf_g_fused_qkv(g, x, pos, &m);
        if (c->kind == C_FUSED_QKV_K)
            o = mf_g_add(g, mf_g_kv_load(g, o, 0, 0, c->n_kv), mf_g_scale(g, mf_g_kv_load(g, o, 0, 1, c->n_kv), 1000.0f));
        break;
    }
    case C_FUSED_FFN: {
        mf_ffn_meta m = {.gate = {c->weight, c->wtype, NULL, c->w, c->n_out},
                         .up = {c->up, c->wtype, NULL, c->w, c->n_out}};
        o = mf_g_fused_ffn(g, x, &m);
        break;
    }
    case C_EPILOGUE: case C_EPILOGUE_K: {
        /* x is the q matmul output; k and v come as two more inputs */
        int64_t qd = (int64_t)c->n_head * c->head_dim, kd = (int64_t)c->n_head_kv * c->head_dim;
        int32_t k = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, kd, nt);
        int32_t v = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, kd, nt);
        int32_t pos = c->no_pos ? -1 : mf_g_input(g, MF_INPUT_POSITIONS, MF_DTYPE_I32, nt, 1);
        int32_t id = mf_g_node(g, MF_OP_QKV_BIAS_ROPE_STORE, MF_DTYPE_F32, qd, nt, (int32_t[]){x, k, v, pos},
                               c->no_pos ? 3 : 4);
        mf_qkv_meta m = {.layer = 0, .n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = c->head_dim,
                         .norm_eps = 1e-6f};
        m.q = (mf_matmul_meta){"fq", MF_TYPE_F32, "fq.b", 64, qd};
        m.k = (mf_matmul_meta){"fk", MF_TYPE_F32, "fk.b", 64, kd};
        m.v = (mf_matmul_meta){"fv", MF_TYPE_F32, "fv.b", 64, kd};
        if (c->weight) {
            m.q_norm = "qn";
            m.k_norm = "kn";
        }
        m.rope_q = c->rope;
        m.rope_k = c->rope;
        m.rope_k.n_head = c->n_head_kv;
        g->nodes[id].meta.qkv = m;
        g->nodes[id].layer = 0;
        mf_g_set_name(g, id, "blk.0.qkv_epilogue");
        o = id;
        if (c->kind == C_EPILOGUE_K)
            o = mf_g_add(g, mf_g_kv_load(g, o, 0, 0, c->n_kv), mf_g_scale(g, mf_g_kv_load(g, o, 0, 1, c->n_kv), 1000.0f));
        break;
    }
    }
    g->nodes[o].flags |= MF_NODE_OUTPUT;
    if (!g->nodes[o].name[0])
        mf_g_set_name(g, o, "out");
    c->out_nelem = mf_node_nelem(&g->nodes[o]);
    return 0;
}

/* Runs the case on one backend ("ref" or "cpu"); fills out (out_nelem floats).
 * ext: the external inputs in node order. Returns 0 or -1 (err). */
typedef struct run_opts {
    int n_ext;
    float *ext[4];
    int64_t ext_n[4];
    const int32_t *tokens;
    int32_t n_past;
    uint32_t kv_type;
    int64_t kv_dim;
    bool fuse_swiglu;
} run_opts;

static int run_on(const char *backend, tcase *c, const run_opts *ro, float *out, int64_t out_n, mf_error *err) {
    mf_backend *b = NULL;
    if (strcmp(backend, "ref") == 0)
        MF_ASSERT(mf_backend_ref_new(W, &b, err) == 0);
    else
        MF_ASSERT(mf_backend_cpu_new(W, 2, &b, err) == 0);
    mf_engine_opts eo = {.n_layers = 1, .kv_dim = ro->kv_dim ? ro->kv_dim : 32, .n_ctx = 16,
                         .k_type = ro->kv_type, .v_type = ro->kv_type, .n_vocab = out_n};
    mf_engine *e;
    if (mf_engine_new(&eo, &b, 1, &e, err))
        return -1;
    for (int k = 0; k < ro->n_ext; k++)
        mf_engine_set_external(e, k, ro->ext[k], (size_t)ro->ext_n[k] * 4);
    mf_graph_params p = {.n_tokens = (int32_t)c->nt, .n_outputs = 1, .k_type = ro->kv_type, .v_type = ro->kv_type,
                         .fuse_swiglu = ro->fuse_swiglu};
    int rc = 0;
    /* A KV case with n_past > 0: fill the earlier rows first (same inputs). */
    if (ro->n_past > 0) {
        mf_graph_params p0 = p;
        rc = mf_engine_forward(e, &p0, build_case, c, ro->tokens, 0, NULL, err);
        mf_engine_invalidate(e);
    }
    if (!rc)
        rc = mf_engine_forward(e, &p, build_case, c, ro->tokens, ro->n_past, out, err);
    if (!rc && ro->fuse_swiglu) {
        const mf_graph *g = mf_engine_graph(e);
        int sw = 0;
        for (int32_t i = 0; i < g->n_nodes; i++)
            sw += g->nodes[i].op == MF_OP_SWIGLU && !(g->nodes[i].flags & MF_NODE_DEAD);
        CHECK_EQ_INT(sw, 1);
    }
    mf_engine_free(e);
    return rc;
}

/* max |a - b| <= atol + rtol * max|b| */
static double max_err(const float *a, const float *b, int64_t n, double *bmax) {
    double m = 0, bm = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m))
            m = d; /* NaN sticks */
        if (fabs(b[i]) > bm)
            bm = fabs(b[i]);
    }
    *bmax = bm;
    return m;
}

/* Runs c on ref and cpu and checks they agree. */
static void ref_vs_cpu(const char *label, tcase *c, const run_opts *ro, int64_t out_n, double rtol) {
    float *a = malloc((size_t)out_n * 4), *b = malloc((size_t)out_n * 4);
    for (int64_t i = 0; i < out_n; i++)
        a[i] = b[i] = NAN; /* poisoned: an unwritten output fails */
    mf_error err = {{0}};
    int ra = run_on("ref", c, ro, a, out_n, &err);
    CHECK_MSG(ra == 0, "%s on ref: %s", label, err.msg);
    int rb = run_on("cpu", c, ro, b, out_n, &err);
    CHECK_MSG(rb == 0, "%s on cpu: %s", label, err.msg);
    if (!ra && !rb) {
        double bm, m = max_err(b, a, out_n, &bm);
        CHECK_MSG(m <= rtol * bm + 1e-6, "%s: cpu vs ref max diff %.3g (max |ref| %.3g, rtol %.2g)", label, m,
                  bm, rtol);
        CHECK_MSG(bm > 0, "%s: all-zero output", label);
    }
    free(a);
    free(b);
}

static void set_ext(run_opts *ro, int k, int64_t n, float scale) {
    ro->ext[k] = rand_vec(n, scale);
    ro->ext_n[k] = n;
    if (k + 1 > ro->n_ext)
        ro->n_ext = k + 1;
}
static void free_ext(run_opts *ro) {
    for (int k = 0; k < ro->n_ext; k++)
        free(ro->ext[k]);
}

/* ---- cases both backends run ------------------------------------------------------------ */

MF_TEST(elementwise_and_row_ops_ref_vs_cpu) {
    const int kinds[] = {C_ADD, C_MUL, C_MUL_BCAST, C_SCALE, C_SILU, C_SWIGLU, C_SILU_MUL, C_RMSNORM,
                         C_RMSNORM_F16, C_RMSNORM_NOW, C_SOFTMAX, C_VIEW, C_PERMUTE, C_ROWS};
    const char *names[] = {"add", "mul", "mul_bcast", "scale", "silu", "swiglu", "silu_mul(fused)", "rmsnorm",
                           "rmsnorm_f16w", "rmsnorm_noweight", "softmax", "view", "permute", "rows"};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        tcase c = {.kind = kinds[k], .w = 48, .nt = 5};
        if (kinds[k] == C_RMSNORM)
            c.weight = "norm32";
        if (kinds[k] == C_RMSNORM_F16)
            c.weight = "norm16";
        run_opts ro = {.kv_type = MF_TYPE_F32, .fuse_swiglu = kinds[k] == C_SILU_MUL};
        set_ext(&ro, 0, c.w * c.nt, 3.0f);
        if (kinds[k] == C_ADD || kinds[k] == C_MUL || kinds[k] == C_SWIGLU || kinds[k] == C_SILU_MUL)
            set_ext(&ro, 1, c.w * c.nt, 2.0f);
        if (kinds[k] == C_MUL_BCAST)
            set_ext(&ro, 1, c.w, 2.0f);
        int64_t out_n = c.w * c.nt;
        if (kinds[k] == C_VIEW)
            out_n = (c.w - 9) * c.nt;
        if (kinds[k] == C_ROWS)
            out_n = c.w * (c.nt - 2);
        ref_vs_cpu(names[k], &c, &ro, out_n, 2e-5);
        CHECK_MSG(c.out_nelem == out_n, "%s: %lld elements", names[k], (long long)c.out_nelem);
        free_ext(&ro);
    }
}

MF_TEST(permute_matches_index_math) {
    tcase c = {.kind = C_PERMUTE, .w = 12, .nt = 2};
    run_opts ro = {.kv_type = MF_TYPE_F32};
    set_ext(&ro, 0, 24, 1.0f);
    float out[24];
    mf_error err;
    CHECK(run_on("cpu", &c, &ro, out, 24, &err) == 0);
    /* src [3, 4, 2] -> out[i0,i1,i2] = src[a0=i2, a1=i0, a2=i1] with out ne {4, 2, 3} */
    const float *x = ro.ext[0];
    int bad = 0;
    for (int i2 = 0; i2 < 3; i2++)
        for (int i1 = 0; i1 < 2; i1++)
            for (int i0 = 0; i0 < 4; i0++)
                bad += out[i0 + 4 * (i1 + 2 * i2)] != x[i2 + 3 * (i0 + 4 * i1)];
    CHECK_EQ_INT(bad, 0);
    free_ext(&ro);
}

MF_TEST(matmul_every_weight_type_ref_vs_cpu) {
    const uint32_t types[] = {MF_TYPE_F32, MF_TYPE_F16, MF_TYPE_BF16, MF_TYPE_Q4_0, MF_TYPE_Q4_1, MF_TYPE_Q5_0,
                              MF_TYPE_Q5_1, MF_TYPE_Q8_0, MF_TYPE_Q2_K, MF_TYPE_Q3_K, MF_TYPE_Q4_K,
                              MF_TYPE_Q5_K, MF_TYPE_Q6_K};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        char name[32];
        snprintf(name, sizeof name, "mm.%s", mf_type_name(types[k]));
        tcase c = {.kind = C_MATMUL, .w = 256, .nt = 3, .weight = name, .wtype = types[k],
                   .bias = k % 2 ? "bias40" : NULL, .n_out = 40};
        run_opts ro = {.kv_type = MF_TYPE_F32};
        set_ext(&ro, 0, c.w * c.nt, 1.0f);
        /* float weights dot against float activations; quantized ones see Q8 activations */
        double tol = types[k] == MF_TYPE_F32 ? 1e-5 : types[k] == MF_TYPE_F16 || types[k] == MF_TYPE_BF16 ? 1e-2 : 3e-2;
        ref_vs_cpu(name, &c, &ro, c.n_out * c.nt, tol);
        free_ext(&ro);
    }
}

MF_TEST(embedding_gather_ref_vs_cpu) {
    const uint32_t types[] = {MF_TYPE_F32, MF_TYPE_F16, MF_TYPE_Q8_0, MF_TYPE_Q4_K};
    int32_t toks[4] = {7, 0, 19, 7};
    for (size_t k = 0; k < 4; k++) {
        char name[32];
        snprintf(name, sizeof name, "emb.%s", mf_type_name(types[k]));
        tcase c = {.kind = C_EMBED, .w = 256, .nt = 4, .weight = name, .wtype = types[k]};
        run_opts ro = {.kv_type = MF_TYPE_F32, .tokens = toks};
        set_ext(&ro, 0, c.w * c.nt, 0.01f);
        ref_vs_cpu(name, &c, &ro, c.w * c.nt, 1e-6);
        free_ext(&ro);
    }
    /* a token id outside the vocabulary is an error naming it */
    int32_t bad[4] = {7, 20, 1, 2};
    tcase c = {.kind = C_EMBED, .w = 256, .nt = 4, .weight = "emb.f32", .wtype = MF_TYPE_F32};
    run_opts ro = {.kv_type = MF_TYPE_F32, .tokens = bad};
    set_ext(&ro, 0, c.w * c.nt, 0.01f);
    float out[1024];
    mf_error err;
    CHECK(run_on("cpu", &c, &ro, out, 1024, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "token id 20");
    CHECK(run_on("ref", &c, &ro, out, 1024, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "token id 20");
    free_ext(&ro);
}

MF_TEST(missing_and_misshapen_weights_are_errors) {
    tcase c = {.kind = C_MATMUL, .w = 64, .nt = 2, .weight = "nope.weight", .wtype = MF_TYPE_F32, .n_out = 8};
    run_opts ro = {.kv_type = MF_TYPE_F32};
    set_ext(&ro, 0, 128, 1.0f);
    float out[16];
    mf_error err;
    CHECK(run_on("cpu", &c, &ro, out, 16, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "weight 'nope.weight' not found");
    CHECK(run_on("ref", &c, &ro, out, 16, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "'nope.weight' not found");
    c.weight = "mm64x9"; /* [64, 9] used as [64, 8] */
    CHECK(run_on("cpu", &c, &ro, out, 16, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "[64, 9, 1, 1]");
    CHECK_STR_CONTAINS(err.msg, "[64, 8]");
    free_ext(&ro);
}

/* ---- cases only the cpu runs, against float64 ------------------------------------------ */

static void rope_f64(double *x, int64_t nt, int n_head, int head_dim, int n_rot, const int32_t *pos, int mode,
                     double theta, double fs) {
    for (int64_t t = 0; t < nt; t++)
        for (int h = 0; h < n_head; h++) {
            double *v = x + (t * n_head + h) * head_dim;
            for (int i = 0; i < n_rot / 2; i++) {
                double ang = pos[t] * fs * pow(theta, -2.0 * i / n_rot);
                int i0 = mode == MF_ROPE_NEOX ? i : 2 * i, i1 = mode == MF_ROPE_NEOX ? i + n_rot / 2 : 2 * i + 1;
                double a = v[i0], b = v[i1];
                v[i0] = a * cos(ang) - b * sin(ang);
                v[i1] = a * sin(ang) + b * cos(ang);
            }
        }
}

static void check_f64(const char *label, const float *got, const double *want, int64_t n, double rtol) {
    double m = 0, bm = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(got[i] - want[i]);
        if (!(d <= m))
            m = d;
        bm = fmax(bm, fabs(want[i]));
    }
    CHECK_MSG(m <= rtol * bm + 1e-6 && bm > 0, "%s: max diff %.3g (max |want| %.3g)", label, m, bm);
}

MF_TEST(rope_cpu_vs_f64) {
    for (int mode = 0; mode <= 2; mode += 2) {
        tcase c = {.kind = C_ROPE, .w = 64, .nt = 3,
                   .rope = {.n_head = 4, .head_dim = 16, .n_rot = 12, .mode = mode, .theta = 10000.0f, .freq_scale = 0.5f}};
        run_opts ro = {.kv_type = MF_TYPE_F32, .n_past = 5};
        set_ext(&ro, 0, c.w * c.nt, 1.0f);
        float out[192];
        mf_error err;
        CHECK_MSG(run_on("cpu", &c, &ro, out, 192, &err) == 0, "%s", err.msg);
        double want[192];
        for (int i = 0; i < 192; i++)
            want[i] = ro.ext[0][i];
        int32_t pos[3] = {5, 6, 7};
        rope_f64(want, 3, 4, 16, 12, pos, mode, 10000.0, 0.5);
        check_f64(mode ? "rope neox" : "rope normal", out, want, 192, 1e-5);
        /* the pass-through dims really pass through and the rotated ones moved */
        CHECK(out[12] == ro.ext[0][12] && out[15] == ro.ext[0][15]);
        CHECK(fabs(out[16 * 4 + 1] - ro.ext[0][16 * 4 + 1]) > 1e-4);
        free_ext(&ro);
    }
    /* ref refuses rope: a [ref]-only engine reports the node */
    tcase c = {.kind = C_ROPE, .w = 64, .nt = 3, .rope = {.n_head = 4, .head_dim = 16, .n_rot = 16, .theta = 1e4f, .freq_scale = 1}};
    run_opts ro = {.kv_type = MF_TYPE_F32};
    set_ext(&ro, 0, 192, 1.0f);
    float out[192];
    mf_error err;
    CHECK(run_on("ref", &c, &ro, out, 192, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "no backend supports node");
    CHECK_STR_CONTAINS(err.msg, "rope");
    free_ext(&ro);
}

MF_TEST(qknorm_cpu_vs_f64) {
    tcase c = {.kind = C_QKNORM, .w = 64, .nt = 3, .weight = "norm16h", .head_dim = 16};
    run_opts ro = {.kv_type = MF_TYPE_F32};
    set_ext(&ro, 0, 192, 2.0f);
    float out[192];
    mf_error err;
    CHECK_MSG(run_on("cpu", &c, &ro, out, 192, &err) == 0, "%s", err.msg);
    double *nw = weight_f64("norm16h"), want[192];
    for (int r = 0; r < 12; r++) {
        double ss = 0;
        for (int i = 0; i < 16; i++)
            ss += (double)ro.ext[0][r * 16 + i] * ro.ext[0][r * 16 + i];
        for (int i = 0; i < 16; i++)
            want[r * 16 + i] = ro.ext[0][r * 16 + i] / sqrt(ss / 16 + 1e-6) * nw[i];
    }
    check_f64("qknorm", out, want, 192, 1e-5);
    free(nw);
    free_ext(&ro);
}

MF_TEST(kv_store_load_cpu) {
    const uint32_t kts[3] = {MF_TYPE_F32, MF_TYPE_F16, MF_TYPE_Q8_0};
    for (int k = 0; k < 3; k++) {
        /* second forward at n_past 3 loads rows [0, 6): the first forward's
         * rows 0..2 and this one's 3..5 (both stores used the same inputs) */
        tcase c = {.kind = C_STORE_LOAD, .w = 32, .nt = 3, .n_kv = 6};
        run_opts ro = {.kv_type = kts[k], .n_past = 3};
        set_ext(&ro, 0, 96, 1.0f);
        set_ext(&ro, 1, 96, 1.0f);
        float out[192];
        mf_error err;
        CHECK_MSG(run_on("cpu", &c, &ro, out, 192, &err) == 0, "%s", err.msg);
        double want[192];
        for (int r = 0; r < 6; r++)
            for (int i = 0; i < 32; i++)
                want[r * 32 + i] = ro.ext[0][(r % 3) * 32 + i] + 1000.0 * ro.ext[1][(r % 3) * 32 + i];
        check_f64(mf_type_name(kts[k]), out, want, 192, kts[k] == MF_TYPE_F32 ? 1e-7 : kts[k] == MF_TYPE_F16 ? 1e-3 : 1e-2);
        free_ext(&ro);
    }
}

/* Causal GQA attention over n_pos cached positions, float64. */
static void attn_f64(const float *q, int64_t nt, int nh, int nkv, int hd, const float *K, const float *V,
                     int64_t n_past, double *out) {
    for (int64_t t = 0; t < nt; t++)
        for (int h = 0; h < nh; h++) {
            int kh = h / (nh / nkv);
            int64_t n = n_past + t + 1;
            double *s = malloc((size_t)n * sizeof *s), mx = -1e300, sum = 0;
            for (int64_t p = 0; p < n; p++) {
                double d = 0;
                for (int i = 0; i < hd; i++)
                    d += (double)q[(t * nh + h) * hd + i] * K[p * nkv * hd + kh * hd + i];
                s[p] = d / sqrt((double)hd);
                mx = fmax(mx, s[p]);
            }
            for (int64_t p = 0; p < n; p++)
                sum += (s[p] = exp(s[p] - mx));
            for (int i = 0; i < hd; i++) {
                double a = 0;
                for (int64_t p = 0; p < n; p++)
                    a += s[p] / sum * V[p * nkv * hd + kh * hd + i];
                out[(t * nh + h) * hd + i] = a;
            }
            free(s);
        }
}

MF_TEST(attention_cpu_vs_f64) {
    /* 4 query heads over 2 KV heads of 16: kv_dim 32; first forward fills
     * positions 0..2, the second (n_past 3) attends over 0..5 */
    tcase c = {.kind = C_ATTN, .w = 64, .nt = 3, .n_head = 4, .n_head_kv = 2, .head_dim = 16};
    run_opts ro = {.kv_type = MF_TYPE_F32, .n_past = 3};
    set_ext(&ro, 0, 192, 1.0f);
    set_ext(&ro, 1, 96, 1.0f);
    set_ext(&ro, 2, 96, 1.0f);
    float out[192];
    mf_error err;
    CHECK_MSG(run_on("cpu", &c, &ro, out, 192, &err) == 0, "%s", err.msg);
    float K[192], V[192];
    for (int r = 0; r < 6; r++)
        for (int i = 0; i < 32; i++) {
            K[r * 32 + i] = ro.ext[1][(r % 3) * 32 + i];
            V[r * 32 + i] = ro.ext[2][(r % 3) * 32 + i];
        }
    double want[192];
    attn_f64(ro.ext[0], 3, 4, 2, 16, K, V, 3, want);
    check_f64("attn", out, want, 192, 1e-5);
    free_ext(&ro);
}

/* Paged attention of three sequences over blocks of 4 rows in a pool of 8,
 * in three forwards of 4 tokens (A0 A1 A2 B0 | A3 A4 B1 C0 | A5 B2 C1 C2):
 * sequence A's blocks are 5 then 1 (not adjacent: gathered), B's 2, C's 7;
 * each token attends to its own sequence's rows only, those of earlier
 * forwards included. Against float64 per cache type. */
MF_TEST(attention_paged_cpu_vs_f64) {
    enum { NT = 4, NH = 4, NKV = 2, HD = 16, KVD = NKV * HD, QD = NH * HD, BS = 4 };
    static const int32_t seq[3][NT] = {{0, 0, 0, 1}, {0, 0, 1, 2}, {0, 1, 2, 2}};
    static const int32_t pos[3][NT] = {{0, 1, 2, 0}, {3, 4, 1, 0}, {5, 2, 1, 2}};
    static const int32_t ta[2] = {5, 1}, tb[1] = {2}, tc[1] = {7};
    const int32_t *const tables[3] = {ta, tb, tc};
    const uint32_t kts[2] = {MF_TYPE_F32, MF_TYPE_F16};
    for (int kt = 0; kt < 2; kt++) {
        tcase c = {.kind = C_ATTN_PAGED, .w = QD, .nt = NT, .n_head = NH, .n_head_kv = NKV, .head_dim = HD};
        mf_backend *b = NULL;
        mf_error err;
        MF_ASSERT(mf_backend_cpu_new(W, 2, &b, &err) == 0);
        mf_engine_opts eo = {.n_layers = 1, .kv_dim = KVD, .n_ctx = 8 * BS, .k_type = kts[kt], .v_type = kts[kt],
                             .n_vocab = NT * QD};
        mf_engine *e;
        CHECK_MSG(mf_engine_new(&eo, &b, 1, &e, &err) == 0, "%s", err.msg);
        double Kf[3][8][KVD], Vf[3][8][KVD]; /* per sequence, per position */
        for (int f = 0; f < 3; f++) {
            run_opts ro = {0};
            set_ext(&ro, 0, NT * QD, 1.0f);
            set_ext(&ro, 1, NT * KVD, 1.0f);
            set_ext(&ro, 2, NT * KVD, 1.0f);
            for (int k = 0; k < 3; k++)
                mf_engine_set_external(e, k, ro.ext[k], (size_t)ro.ext_n[k] * 4);
            for (int t = 0; t < NT; t++)
                for (int i = 0; i < KVD; i++) {
                    Kf[seq[f][t]][pos[f][t]][i] = ro.ext[1][t * KVD + i];
                    Vf[seq[f][t]][pos[f][t]][i] = ro.ext[2][t * KVD + i];
                }
            mf_kv_batch kb = {.n_tokens = NT, .seq = seq[f], .pos = pos[f], .n_seqs = 3,
                              .tables = tables, .block_size = BS};
            mf_graph_params p = {.n_tokens = NT, .n_outputs = 1, .k_type = kts[kt], .v_type = kts[kt], .paged = true};
            float out[NT * QD];
            CHECK_MSG(mf_engine_forward_batch(e, &p, build_case, &c, NULL, &kb, out, &err) == 0, "%s",
                      err.msg);
            double want[NT * QD];
            for (int t = 0; t < NT; t++) {
                /* the token's sequence as a contiguous float cache, 0..pos */
                const int s = seq[f][t], n = pos[f][t] + 1;
                float K[8 * KVD], V[8 * KVD];
                for (int r = 0; r < n; r++)
                    for (int i = 0; i < KVD; i++) {
                        K[r * KVD + i] = (float)Kf[s][r][i];
                        V[r * KVD + i] = (float)Vf[s][r][i];
                    }
                attn_f64(ro.ext[0] + t * QD, 1, NH, NKV, HD, K, V, n - 1, want + t * QD);
            }
            if (f > 0)
                check_f64(mf_type_name(kts[kt]), out, want, NT * QD, kts[kt] == MF_TYPE_F32 ? 1e-5 : 2e-3);
            free_ext(&ro);
        }
        /* a batch row outside the pool is refused before anything runs */
        const int32_t bad_t[1] = {9};
        const int32_t *const bad[1] = {bad_t};
        mf_kv_batch kb = {.n_tokens = NT, .seq = (int32_t[]){0, 0, 0, 0}, .pos = (int32_t[]){0, 1, 2, 3},
                          .n_seqs = 1, .tables = bad, .block_size = BS};
        mf_graph_params p = {.n_tokens = NT, .n_outputs = 1, .k_type = kts[kt], .v_type = kts[kt], .paged = true};
        float out[NT * QD];
        CHECK(mf_engine_forward_batch(e, &p, build_case, &c, NULL, &kb, out, &err) != 0);
        CHECK_STR_CONTAINS(err.msg, "outside the pool");
        mf_engine_free(e);
    }
}

static void matmul_f64(const char *wname, const char *bname, const float *x, int64_t nt, int64_t n_in,
                       int64_t n_out, double *y) {
    double *w = weight_f64(wname), *b = bname ? weight_f64(bname) : NULL;
    for (int64_t t = 0; t < nt; t++)
        for (int64_t o = 0; o < n_out; o++) {
            double s = b ? b[o] : 0;
            for (int64_t i = 0; i < n_in; i++)
                s += w[o * n_in + i] * x[t * n_in + i];
            y[t * n_out + o] = s;
        }
    free(w);
    free(b);
}

MF_TEST(fused_qkv_cpu_vs_f64) {
    for (int norm = 0; norm < 2; norm++) {
        tcase c = {.kind = C_FUSED_QKV, .w = 64, .nt = 3, .wtype = MF_TYPE_F32, .n_head = 4, .n_head_kv = 2,
                   .head_dim = 16, .n_kv = 3, .weight = norm ? "qk-norms" : NULL,
                   .rope = {.n_head = 4, .head_dim = 16, .n_rot = 16, .mode = MF_ROPE_NEOX, .theta = 1e6f, .freq_scale = 1}};
        run_opts ro = {.kv_type = MF_TYPE_F32};
        set_ext(&ro, 0, 192, 1.0f);
        float q[192], kv[96];
        mf_error err;
        CHECK_MSG(run_on("cpu", &c, &ro, q, 192, &err) == 0, "%s", err.msg);
        c.kind = C_FUSED_QKV_K;
        CHECK_MSG(run_on("cpu", &c, &ro, kv, 96, &err) == 0, "%s", err.msg);
        double wq[192], wk[96], wv[96], want_kv[96];
        matmul_f64("fq", "fq.b", ro.ext[0], 3, 64, 64, wq);
        matmul_f64("fk", "fk.b", ro.ext[0], 3, 64, 32, wk);
        matmul_f64("fv", NULL, ro.ext[0], 3, 64, 32, wv);
        if (norm) {
            double *qn = weight_f64("qn"), *kn = weight_f64("kn");
            for (int pass = 0; pass < 2; pass++) {
                double *v = pass ? wk : wq, *nw = pass ? kn : qn;
                int rows = pass ? 6 : 12;
                for (int r = 0; r < rows; r++) {
                    double ss = 0;
                    for (int i = 0; i < 16; i++)
                        ss += v[r * 16 + i] * v[r * 16 + i];
                    for (int i = 0; i < 16; i++)
                        v[r * 16 + i] = v[r * 16 + i] / sqrt(ss / 16 + 1e-6) * nw[i];
                }
            }
            free(qn);
            free(kn);
        }
        int32_t pos[3] = {0, 1, 2};
        rope_f64(wq, 3, 4, 16, 16, pos, MF_ROPE_NEOX, 1e6, 1);
        rope_f64(wk, 3, 2, 16, 16, pos, MF_ROPE_NEOX, 1e6, 1);
        for (int i = 0; i < 96; i++)
            want_kv[i] = wk[i] + 1000.0 * wv[i];
        check_f64(norm ? "fused_qkv_norm q" : "fused_qkv q", q, wq, 192, 1e-5);
        check_f64(norm ? "fused_qkv_norm kv" : "fused_qkv kv", kv, want_kv, 96, 1e-5);
        free_ext(&ro);
    }
}

MF_TEST(fused_ffn_cpu_vs_f64) {
    const uint32_t types[2] = {MF_TYPE_F32, MF_TYPE_Q8_0};
    for (int k = 0; k < 2; k++) {
        tcase c = {.kind = C_FUSED_FFN, .w = 64, .nt = 3, .wtype = types[k], .n_out = 96,
                   .weight = k ? "fg8" : "fg", .up = k ? "fu8" : "fu"};
        run_opts ro = {.kv_type = MF_TYPE_F32};
        set_ext(&ro, 0, 192, 1.0f);
        float out[288];
        mf_error err;
        CHECK_MSG(run_on("cpu", &c, &ro, out, 288, &err) == 0, "%s", err.msg);
        double gt[288], up[288], want[288];
        matmul_f64(k ? "fg8" : "fg", NULL, ro.ext[0], 3, 64, 96, gt);
        matmul_f64(k ? "fu8" : "fu", NULL, ro.ext[0], 3, 64, 96, up);
        for (int i = 0; i < 288; i++)
            want[i] = gt[i] / (1 + exp(-gt[i])) * up[i];
        check_f64(k ? "fused_ffn q8_0" : "fused_ffn f32", out, want, 288, k ? 3e-2 : 1e-5);
        free_ext(&ro);
    }
}

/* QKV_BIAS_ROPE_STORE on the cpu: q/k/v matmul outputs given as inputs ->
 * biases, optional per-head norms, RoPE, K/V store; output Q. Checked against
 * float64 for Q and for every cached K/V row after two forwards (the second
 * at n_past 2 overwrites row 2 on), with and without a positions src. */
MF_TEST(qkv_epilogue_cpu_vs_f64) {
    for (int variant = 0; variant < 4; variant++) {
        const bool norm = variant & 1, no_pos = variant & 2;
        const int n_past = 2, nt = 3, n_kv = n_past + nt;
        tcase c = {.kind = C_EPILOGUE, .w = 64, .nt = nt, .n_head = 4, .n_head_kv = 2, .head_dim = 16,
                   .n_kv = n_kv, .weight = norm ? "qk-norms" : NULL, .no_pos = no_pos,
                   .rope = {.n_head = 4, .head_dim = 16, .n_rot = 12, .mode = variant < 2 ? MF_ROPE_NEOX : MF_ROPE_NORMAL,
                            .theta = 1e4f, .freq_scale = 1}};
        run_opts ro = {.kv_type = MF_TYPE_F32, .n_past = n_past};
        set_ext(&ro, 0, 64 * nt, 2.0f);
        set_ext(&ro, 1, 32 * nt, 2.0f);
        set_ext(&ro, 2, 32 * nt, 2.0f);
        float q[192], kv[32 * 5];
        mf_error err = {{0}};
        for (int i = 0; i < 192; i++)
            q[i] = NAN;
        CHECK_MSG(run_on("cpu", &c, &ro, q, 64 * nt, &err) == 0, "%s", err.msg);
        c.kind = C_EPILOGUE_K;
        CHECK_MSG(run_on("cpu", &c, &ro, kv, 32 * n_kv, &err) == 0, "%s", err.msg);
        /* reference: inputs + biases, norms, rope at the positions of each pass */
        double *bq = weight_f64("fq.b"), *bk = weight_f64("fk.b"), *bv = weight_f64("fv.b");
        double *qn = weight_f64("qn"), *kn = weight_f64("kn");
        double wq[192], wk[2][96], wv[96];
        for (int t = 0; t < nt; t++) {
            for (int i = 0; i < 64; i++)
                wq[t * 64 + i] = ro.ext[0][t * 64 + i] + bq[i];
            for (int i = 0; i < 32; i++) {
                wk[0][t * 32 + i] = wk[1][t * 32 + i] = ro.ext[1][t * 32 + i] + bk[i];
                wv[t * 32 + i] = ro.ext[2][t * 32 + i] + bv[i];
            }
        }
        if (norm)
            for (int pass = 0; pass < 3; pass++) {
                double *v = pass == 0 ? wq : wk[pass - 1], *nw = pass ? kn : qn;
                for (int r = 0; r < (pass ? 6 : 12); r++) {
                    double ss = 0;
                    for (int i = 0; i < 16; i++)
                        ss += v[r * 16 + i] * v[r * 16 + i];
                    for (int i = 0; i < 16; i++)
                        v[r * 16 + i] = v[r * 16 + i] / sqrt(ss / 16 + 1e-6) * nw[i];
                }
            }
        int32_t pos0[3] = {0, 1, 2}, pos1[3] = {2, 3, 4};
        rope_f64(wq, nt, 4, 16, 12, pos1, c.rope.mode, 1e4, 1);
        rope_f64(wk[0], nt, 2, 16, 12, pos0, c.rope.mode, 1e4, 1);
        rope_f64(wk[1], nt, 2, 16, 12, pos1, c.rope.mode, 1e4, 1);
        double want_kv[32 * 5];
        for (int r = 0; r < n_kv; r++) /* rows 0, 1 from the first pass, 2..4 from the second */
            for (int i = 0; i < 32; i++) {
                int pass = r >= n_past, t = pass ? r - n_past : r;
                want_kv[r * 32 + i] = wk[pass][t * 32 + i] + 1000.0 * wv[t * 32 + i];
            }
        char label[64];
        snprintf(label, sizeof label, "epilogue norm=%d pos=%s q", norm, no_pos ? "n_past" : "src");
        check_f64(label, q, wq, 64 * nt, 1e-5);
        snprintf(label, sizeof label, "epilogue norm=%d pos=%s kv", norm, no_pos ? "n_past" : "src");
        check_f64(label, kv, want_kv, 32 * n_kv, 1e-5);
        free(bq);
        free(bk);
        free(bv);
        free(qn);
        free(kn);
        free_ext(&ro);
    }
    /* a rope that does not cover the q width is an error naming the node */
    tcase c = {.kind = C_EPILOGUE, .w = 64, .nt = 1, .n_head = 4, .n_head_kv = 2, .head_dim = 16, .n_kv = 1,
               .rope = {.n_head = 3, .head_dim = 16, .n_rot = 16, .theta = 1e4f, .freq_scale = 1}};
    run_opts ro = {.kv_type = MF_TYPE_F32};
    set_ext(&ro, 0, 64, 1.0f);
    set_ext(&ro, 1, 32, 1.0f);
    set_ext(&ro, 2, 32, 1.0f);
    float out[64];
    mf_error err = {{0}};
    CHECK(run_on("cpu", &c, &ro, out, 64, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "'blk.0.qkv_epilogue'");
    CHECK_STR_CONTAINS(err.msg, "rope q 3x16");
    free_ext(&ro);
}

MF_TEST(op_nobody_supports_is_an_error) {
    /* ref runs no fused op: a ref-only engine names the node it cannot place */
    tcase c = {.kind = C_EPILOGUE, .w = 64, .nt = 1, .n_head = 4, .n_head_kv = 2, .head_dim = 16, .n_kv = 1,
               .rope = {.n_head = 4, .head_dim = 16, .n_rot = 16, .theta = 1e4f, .freq_scale = 1}};
    run_opts ro = {.kv_type = MF_TYPE_F32};
    set_ext(&ro, 0, 64, 1.0f);
    set_ext(&ro, 1, 32, 1.0f);
    set_ext(&ro, 2, 32, 1.0f);
    float out[64];
    mf_error err;
    CHECK(run_on("ref", &c, &ro, out, 64, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "'blk.0.qkv_epilogue'");
    CHECK_STR_CONTAINS(err.msg, "qkv_bias_rope_store");
    free_ext(&ro);
}

static void setup_weights(void) {
    W = mf_weights_new();
    const uint32_t types[] = {MF_TYPE_F32, MF_TYPE_F16, MF_TYPE_BF16, MF_TYPE_Q4_0, MF_TYPE_Q4_1, MF_TYPE_Q5_0,
                              MF_TYPE_Q5_1, MF_TYPE_Q8_0, MF_TYPE_Q2_K, MF_TYPE_Q3_K, MF_TYPE_Q4_K,
                              MF_TYPE_Q5_K, MF_TYPE_Q6_K};
    char name[32];
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        snprintf(name, sizeof name, "mm.%s", mf_type_name(types[k]));
        add_weight(name, types[k], 256, 40, 0.5f);
    }
    const uint32_t et[] = {MF_TYPE_F32, MF_TYPE_F16, MF_TYPE_Q8_0, MF_TYPE_Q4_K};
    for (int k = 0; k < 4; k++) {
        snprintf(name, sizeof name, "emb.%s", mf_type_name(et[k]));
        add_weight(name, et[k], 256, 20, 1.0f);
    }
    add_weight("bias40", MF_TYPE_F32, 40, 1, 1.0f);
    add_weight("norm32", MF_TYPE_F32, 48, 1, 1.0f);
    add_weight("norm16", MF_TYPE_F16, 48, 1, 1.0f);
    add_weight("norm16h", MF_TYPE_F32, 16, 1, 1.0f);
    add_weight("mm64x9", MF_TYPE_F32, 64, 9, 1.0f);
    add_weight("fq", MF_TYPE_F32, 64, 64, 0.3f);
    add_weight("fk", MF_TYPE_F32, 64, 32, 0.3f);
    add_weight("fv", MF_TYPE_F32, 64, 32, 0.3f);
    add_weight("fq.b", MF_TYPE_F32, 64, 1, 0.3f);
    add_weight("fk.b", MF_TYPE_F32, 32, 1, 0.3f);
    add_weight("fv.b", MF_TYPE_F32, 32, 1, 0.3f);
    add_weight("qn", MF_TYPE_F32, 16, 1, 1.0f);
    add_weight("kn", MF_TYPE_F16, 16, 1, 1.0f);
    add_weight("fg", MF_TYPE_F32, 64, 96, 0.3f);
    add_weight("fu", MF_TYPE_F32, 64, 96, 0.3f);
    add_weight("fg8", MF_TYPE_Q8_0, 64, 96, 0.3f);
    add_weight("fu8", MF_TYPE_Q8_0, 64, 96, 0.3f);
    /* weights are 1-D for vectors */
    for (int64_t i = 0; i < mf_weights_count(W); i++) {
        mf_weight *w = (mf_weight *)mf_weights_at(W, i);
        if (w->ne[1] == 1)
            w->n_dims = 1;
    }
}

int main(int argc, char **argv) {
    setup_weights();
    static const mf_test_entry tests[] = {
        MF_T(elementwise_and_row_ops_ref_vs_cpu), MF_T(permute_matches_index_math),
        MF_T(matmul_every_weight_type_ref_vs_cpu), MF_T(embedding_gather_ref_vs_cpu),
        MF_T(missing_and_misshapen_weights_are_errors), MF_T(rope_cpu_vs_f64), MF_T(qknorm_cpu_vs_f64),
        MF_T(kv_store_load_cpu), MF_T(attention_cpu_vs_f64), MF_T(attention_paged_cpu_vs_f64), MF_T(fused_qkv_cpu_vs_f64),
        MF_T(fused_ffn_cpu_vs_f64), MF_T(qkv_epilogue_cpu_vs_f64), MF_T(op_nobody_supports_is_an_error),
    };
    int rc = mf_test_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    mf_weights_free(W);
    return rc;
}
