/* test_engine_multi.c - a small hand-built transformer (2 layers, d 64, GQA,
 * random F32 weights) through the engine on [cpu], on [ref, cpu] (splits at
 * every op ref refuses) and in alternate mode (node by node): same logits.
 * Also: graph reuse identity, KV migration when a rebuild moves attention,
 * KV type conversion, the errors (op nobody runs, context overflow), and a
 * backend's execute_split (whole splits, the same calls per build). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/engine.h"
#include "mf_test.h"

enum { D = 64, NH = 4, NKV = 2, HD = 16, KVD = NKV * HD, FF = 128, NV = 96, NL = 2, NCTX = 32 };

static mf_weights *W;
static uint64_t rng = 42;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) * (1.0 / 16777216.0) * 2.0 - 1.0);
}

static void add_w(const char *name, int64_t n_in, int64_t n_out, float scale, float bias) {
    float *f = malloc((size_t)(n_in * n_out) * sizeof *f);
    for (int64_t i = 0; i < n_in * n_out; i++)
        f[i] = bias + frand() * scale;
    mf_weight w = {.name = name, .type = MF_TYPE_F32, .n_dims = n_out == 1 ? 1 : 2, .ne = {n_in, n_out, 1, 1},
                   .nbytes = (uint64_t)(n_in * n_out * 4)};
    mf_error err;
    MF_ASSERT(mf_weights_add_owned(W, &w, f, &err) == 0);
}

static void setup(void) {
    W = mf_weights_new();
    char n[64];
    add_w("token_embd.weight", D, NV, 1.0f, 0);
    add_w("output_norm.weight", D, 1, 0.2f, 1.0f);
    add_w("output.weight", D, NV, 0.2f, 0);
    for (int l = 0; l < NL; l++) {
#define W_(suffix, a, b, s, bias) (snprintf(n, sizeof n, "blk.%d." suffix, l), add_w(n, a, b, s, bias))
        W_("attn_norm.weight", D, 1, 0.2f, 1.0f);
        W_("attn_q.weight", D, NH * HD, 0.25f, 0);
        W_("attn_k.weight", D, KVD, 0.25f, 0);
        W_("attn_v.weight", D, KVD, 0.25f, 0);
        W_("attn_q.bias", NH * HD, 1, 0.1f, 0);
        W_("attn_output.weight", NH * HD, D, 0.15f, 0);
        W_("ffn_norm.weight", D, 1, 0.2f, 1.0f);
        W_("ffn_gate.weight", D, FF, 0.2f, 0);
        W_("ffn_up.weight", D, FF, 0.2f, 0);
        W_("ffn_down.weight", FF, D, 0.15f, 0);
    }
}

typedef struct model_opts {
    bool bad_op; /* add a matmul of a type nobody runs */
} model_opts;

/* The builder: llama-like blocks with NEOX RoPE and a q bias. */
static int build(void *ctx, const mf_graph_params *p, mf_graph *g, mf_error *err) {
    const model_opts *mo = ctx;
    int32_t nt = p->n_tokens;
    char n[64], n2[64];
    int32_t tok = mf_g_input(g, MF_INPUT_TOKENS, MF_DTYPE_I32, nt, 1);
    int32_t pos = mf_g_input(g, MF_INPUT_POSITIONS, MF_DTYPE_I32, nt, 1);
    int32_t x = mf_g_embed(g, tok, "token_embd.weight", MF_TYPE_F32, D);
    mf_rope_meta rq = {.n_head = NH, .head_dim = HD, .n_rot = HD, .mode = MF_ROPE_NEOX, .theta = 10000.0f,
                       .freq_scale = 1.0f};
    mf_rope_meta rk = rq;
    rk.n_head = NKV;
    for (int l = 0; l < NL; l++) {
#define NM(s) (snprintf(n, sizeof n, "blk.%d." s, l), n)
        int32_t h = mf_g_rmsnorm(g, x, NM("attn_norm.weight"), 1e-5f);
        mf_g_set_name(g, h, "blk.%d.attn_norm", l);
        snprintf(n2, sizeof n2, "blk.%d.attn_q.bias", l);
        int32_t q = mf_g_matmul(g, h, NM("attn_q.weight"), MF_TYPE_F32, n2, D, NH * HD);
        int32_t k = mf_g_matmul(g, h, NM("attn_k.weight"), MF_TYPE_F32, NULL, D, KVD);
        int32_t v = mf_g_matmul(g, h, NM("attn_v.weight"), MF_TYPE_F32, NULL, D, KVD);
        q = mf_g_rope(g, q, pos, &rq);
        k = mf_g_rope(g, k, pos, &rk);
        int32_t st = mf_g_kv_store(g, k, v, l);
        mf_attn_meta am = {.layer = l, .n_head = NH, .n_head_kv = NKV, .head_dim = HD, .scale = 0.25f};
        int32_t a = mf_g_attn(g, q, st, &am);
        mf_g_set_name(g, a, "blk.%d.attn", l);
        a = mf_g_matmul(g, a, NM("attn_output.weight"), MF_TYPE_F32, NULL, NH * HD, D);
        x = mf_g_add(g, x, a);
        h = mf_g_rmsnorm(g, x, NM("ffn_norm.weight"), 1e-5f);
        int32_t gt = mf_g_matmul(g, h, NM("ffn_gate.weight"), MF_TYPE_F32, NULL, D, FF);
        int32_t up = mf_g_matmul(g, h, NM("ffn_up.weight"), MF_TYPE_F32, NULL, D, FF);
        int32_t s = p->fuse_swiglu ? mf_g_mul(g, mf_g_silu(g, gt), up) : mf_g_swiglu(g, gt, up);
        s = mf_g_matmul(g, s, NM("ffn_down.weight"), MF_TYPE_F32, NULL, FF, D);
        x = mf_g_add(g, x, s);
    }
    if (mo && mo->bad_op) {
        int32_t b = mf_g_matmul(g, x, "token_embd.weight", MF_TYPE_I32, NULL, D, D);
        mf_g_set_name(g, b, "weird.matmul");
        x = mf_g_add(g, x, b);
    }
    x = mf_g_rmsnorm(g, x, "output_norm.weight", 1e-5f);
    if (p->n_outputs == 1 && nt > 1)
        x = mf_g_rows(g, x, nt - 1, 1);
    int32_t o = mf_g_matmul(g, x, "output.weight", MF_TYPE_F32, NULL, D, NV);
    g->nodes[o].flags |= MF_NODE_OUTPUT;
    mf_g_set_name(g, o, "output");
    return 0;
}

typedef enum { CFG_CPU, CFG_REF_CPU, CFG_ALT, CFG_CPU_CPU } cfg;

static mf_engine *make(cfg c, uint32_t kv_type) {
    mf_backend *b[2];
    int nb = 0;
    mf_error err;
    if (c == CFG_REF_CPU || c == CFG_ALT)
        MF_ASSERT(mf_backend_ref_new(W, &b[nb++], &err) == 0);
    MF_ASSERT(mf_backend_cpu_new(W, 2, &b[nb++], &err) == 0);
    if (c == CFG_CPU_CPU)
        MF_ASSERT(mf_backend_cpu_new(W, 1, &b[nb++], &err) == 0);
    mf_engine_opts o = {.n_layers = NL, .kv_dim = KVD, .n_ctx = NCTX, .k_type = kv_type, .v_type = kv_type, .n_vocab = NV};
    mf_engine *e;
    MF_ASSERT(mf_engine_new(&o, b, nb, &e, &err) == 0);
    if (c == CFG_ALT)
        mf_engine_set_alternate(e, true);
    return e;
}

static const int32_t prompt[6] = {5, 17, 88, 3, 41, 60};
static const int32_t gen[3] = {9, 70, 33};

static int fwd(mf_engine *e, const int32_t *toks, int nt, int n_past, int n_out, uint32_t kv_type, float *logits,
               mf_error *err) {
    mf_graph_params p = {.n_tokens = nt, .n_outputs = n_out, .k_type = kv_type, .v_type = kv_type, .fuse_swiglu = true};
    return mf_engine_forward(e, &p, build, NULL, toks, n_past, logits, err);
}

/* Prefill the prompt (all logits) then decode the 3 tokens; out: 6 + 3 rows. */
static void run_seq(mf_engine *e, uint32_t kv_type, float *out) {
    mf_error err;
    CHECK_MSG(fwd(e, prompt, 6, 0, 6, kv_type, out, &err) == 0, "%s", err.msg);
    for (int i = 0; i < 3; i++)
        CHECK_MSG(fwd(e, &gen[i], 1, 6 + i, 1, kv_type, out + (6 + i) * NV, &err) == 0, "%s", err.msg);
}

static double maxdiff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m))
            m = d;
    }
    return m;
}

MF_TEST(cpu_vs_ref_cpu_vs_alternate_same_logits) {
    static float a[9 * NV], b[9 * NV], c[9 * NV];
    for (int i = 0; i < 9 * NV; i++)
        a[i] = b[i] = c[i] = NAN;
    mf_engine *e0 = make(CFG_CPU, MF_TYPE_F32), *e1 = make(CFG_REF_CPU, MF_TYPE_F32),
              *e2 = make(CFG_ALT, MF_TYPE_F32);
    run_seq(e0, MF_TYPE_F32, a);
    CHECK_EQ_INT(mf_engine_n_splits(e0), 1);
    run_seq(e1, MF_TYPE_F32, b);
    int32_t s1 = mf_engine_n_splits(e1);
    run_seq(e2, MF_TYPE_F32, c);
    int32_t s2 = mf_engine_n_splits(e2);
    CHECK_MSG(s1 > NL, "[ref, cpu]: %d splits", s1);
    CHECK_MSG(s2 > NL && s2 > s1, "alternate: %d splits ([ref, cpu] %d)", s2, s1);
    /* the alternate graph really runs ops on both backends, and the fusion pass fired */
    const mf_graph *g = mf_engine_graph(e2);
    int on[2] = {0, 0}, swiglu = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i].flags & MF_NODE_DEAD)
            continue;
        on[g->nodes[i].backend]++;
        swiglu += g->nodes[i].op == MF_OP_SWIGLU;
    }
    CHECK(on[0] > 5 && on[1] > 5);
    CHECK_EQ_INT(swiglu, NL);
    double bmax = 0;
    for (int i = 0; i < 9 * NV; i++)
        bmax = fmax(bmax, fabs(a[i]));
    CHECK(bmax > 0.1);
    double d1 = maxdiff(a, b, 9 * NV), d2 = maxdiff(a, c, 9 * NV);
    CHECK_MSG(d1 < 1e-3 * bmax, "[cpu] vs [ref, cpu]: %.3g (max %.3g)", d1, bmax);
    CHECK_MSG(d2 < 1e-3 * bmax, "[cpu] vs alternate: %.3g (max %.3g)", d2, bmax);
    /* the logits depend on the context: decode rows differ from each other */
    CHECK(maxdiff(a + 6 * NV, a + 7 * NV, NV) > 1e-3);
    mf_engine_free(e0);
    mf_engine_free(e1);
    mf_engine_free(e2);
}

MF_TEST(graph_reuse_and_rebuild_identity) {
    mf_engine *e = make(CFG_REF_CPU, MF_TYPE_F32);
    static float out[9 * NV];
    mf_error err;
    CHECK(fwd(e, prompt, 6, 0, 6, MF_TYPE_F32, out, &err) == 0);
    CHECK_EQ_INT(mf_engine_n_builds(e), 1);
    CHECK(fwd(e, &gen[0], 1, 6, 1, MF_TYPE_F32, out, &err) == 0); /* n_tokens changed */
    CHECK_EQ_INT(mf_engine_n_builds(e), 2);
    CHECK(fwd(e, &gen[1], 1, 7, 1, MF_TYPE_F32, out, &err) == 0); /* equal params: reuse */
    CHECK_EQ_INT(mf_engine_n_builds(e), 2);
    mf_engine_set_backend_enabled(e, 0, false);                  /* participation changed */
    CHECK(fwd(e, &gen[2], 1, 8, 1, MF_TYPE_F32, out, &err) == 0);
    CHECK_EQ_INT(mf_engine_n_builds(e), 3);
    CHECK_EQ_INT(mf_engine_n_splits(e), 1);
    CHECK(fwd(e, &gen[2], 1, 9, 1, MF_TYPE_F16, out, &err) == 0); /* kv_type changed */
    CHECK_EQ_INT(mf_engine_n_builds(e), 4);
    CHECK(fwd(e, &gen[2], 1, 10, 1, MF_TYPE_F16, out, &err) == 0);
    CHECK_EQ_INT(mf_engine_n_builds(e), 4);
    mf_engine_invalidate(e);
    CHECK(fwd(e, &gen[2], 1, 11, 1, MF_TYPE_F16, out, &err) == 0);
    CHECK_EQ_INT(mf_engine_n_builds(e), 5);
    mf_engine_free(e);
}

/* Prefill on backend 0, then disable it: the rebuild moves both layers'
 * attention (and KV regions) to backend 1. Decoding must continue exactly as
 * on an engine that never moved. */
MF_TEST(kv_migrates_when_attention_moves) {
    static float a[9 * NV], b[9 * NV];
    mf_engine *ref = make(CFG_CPU, MF_TYPE_F32);
    run_seq(ref, MF_TYPE_F32, a);
    mf_engine *e = make(CFG_CPU_CPU, MF_TYPE_F32);
    mf_error err;
    CHECK(fwd(e, prompt, 6, 0, 6, MF_TYPE_F32, b, &err) == 0);
    const mf_graph *g = mf_engine_graph(e);
    for (int32_t i = 0; i < g->n_nodes; i++)
        CHECK((g->nodes[i].flags & MF_NODE_DEAD) || g->nodes[i].backend == 0);
    mf_engine_set_backend_enabled(e, 0, false);
    CHECK(fwd(e, &gen[0], 1, 6, 1, MF_TYPE_F32, b + 6 * NV, &err) == 0);
    g = mf_engine_graph(e);
    for (int32_t i = 0; i < g->n_nodes; i++)
        CHECK((g->nodes[i].flags & MF_NODE_DEAD) || g->nodes[i].backend == 1);
    mf_engine_set_backend_enabled(e, 0, true);
    mf_engine_set_backend_enabled(e, 1, false); /* and back */
    CHECK(fwd(e, &gen[1], 1, 7, 1, MF_TYPE_F32, b + 7 * NV, &err) == 0);
    CHECK(fwd(e, &gen[2], 1, 8, 1, MF_TYPE_F32, b + 8 * NV, &err) == 0);
    CHECK_MSG(maxdiff(a, b, 9 * NV) < 1e-5, "moved vs unmoved: %.3g", maxdiff(a, b, 9 * NV));
    mf_engine_free(e);
    mf_engine_free(ref);
}

/* Switching a live f32 cache to f16 converts its rows: decoding continues
 * close to the all-f32 run (f16 rounding only), far from a run that lost the
 * prompt's KV (decoding at n_past 6 over a zeroed cache). */
MF_TEST(kv_type_change_converts_contents) {
    static float a[9 * NV], b[9 * NV], z[3 * NV];
    mf_engine *e32 = make(CFG_CPU, MF_TYPE_F32);
    run_seq(e32, MF_TYPE_F32, a);
    mf_engine *e = make(CFG_CPU, MF_TYPE_F32), *ez = make(CFG_CPU, MF_TYPE_F16);
    mf_error err;
    CHECK(fwd(e, prompt, 6, 0, 6, MF_TYPE_F32, b, &err) == 0);
    for (int i = 0; i < 3; i++) {
        CHECK(fwd(e, &gen[i], 1, 6 + i, 1, MF_TYPE_F16, b + (6 + i) * NV, &err) == 0);
        CHECK(fwd(ez, &gen[i], 1, 6 + i, 1, MF_TYPE_F16, z + i * NV, &err) == 0);
    }
    double bmax = 0;
    for (int i = 6 * NV; i < 9 * NV; i++)
        bmax = fmax(bmax, fabs(a[i]));
    double d = maxdiff(a + 6 * NV, b + 6 * NV, 3 * NV), dz = maxdiff(z, b + 6 * NV, 3 * NV);
    CHECK_MSG(d < 5e-3 * bmax, "converted vs f32: %.3g (max %.3g)", d, bmax);
    CHECK_MSG(dz > 20 * d && dz > 1e-2 * bmax, "converted vs lost cache: %.3g (vs %.3g)", dz, d);
    mf_engine_free(e);
    mf_engine_free(ez);
    mf_engine_free(e32);
}

MF_TEST(errors_name_the_problem) {
    mf_engine *e = make(CFG_REF_CPU, MF_TYPE_F32);
    static float out[9 * NV];
    mf_error err;
    model_opts bad = {.bad_op = true};
    mf_graph_params p = {.n_tokens = 2, .n_outputs = 1, .k_type = MF_TYPE_F32, .v_type = MF_TYPE_F32};
    CHECK(mf_engine_forward(e, &p, build, &bad, prompt, 0, out, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "no backend supports node");
    CHECK_STR_CONTAINS(err.msg, "'weird.matmul'");
    /* the context: 30 + 6 > 32 */
    CHECK(fwd(e, prompt, 6, 30, 1, MF_TYPE_F32, out, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "n_past 30 + n_tokens 6 > n_ctx 32");
    CHECK(fwd(e, prompt, 2, 30, 1, MF_TYPE_F32, out, &err) == 0); /* exactly full is fine */
    /* wrong logits size */
    mf_graph_params p2 = {.n_tokens = 2, .n_outputs = 3, .k_type = MF_TYPE_F32, .v_type = MF_TYPE_F32};
    model_opts ok = {0};
    CHECK(mf_engine_forward(e, &p2, build, &ok, prompt, 0, out, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "output node");
    mf_engine_free(e);
    /* q8_0 KV with a width that is not whole blocks */
    mf_backend *b;
    CHECK(mf_backend_cpu_new(W, 1, &b, &err) == 0);
    mf_engine_opts o = {.n_layers = 2, .kv_dim = 48, .n_ctx = 8, .k_type = MF_TYPE_Q8_0, .v_type = MF_TYPE_Q8_0, .n_vocab = NV};
    CHECK(mf_engine_new(&o, &b, 1, &e, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "kv_dim 48");
}

/* A CPU backend dressed as one with host memory of its own: counts the
 * calls the engine makes. */
static mf_backend_ops host_ops;
static const mf_backend_ops *cpu_ops;
static int n_sync, n_halloc, n_hfree, halloc_fail;
static void *hblocks[4];
static int wrap_sync(mf_backend *b, mf_error *err) {
    n_sync++;
    return cpu_ops->synchronize(b, err);
}
static void *wrap_halloc(mf_backend *b, size_t n) {
    (void)b;
    if (halloc_fail || n_halloc >= 4)
        return NULL;
    void *p = malloc(n);
    memset(p, 0x5a, n); /* the engine must hand it out zeroed */
    hblocks[n_halloc++] = p;
    return p;
}
static void wrap_hfree(mf_backend *b, void *p) {
    (void)b;
    for (int i = 0; i < 4; i++)
        if (hblocks[i] == p) {
            n_hfree++;
            hblocks[i] = NULL;
            free(p);
        }
}

/* A CPU backend whose ops table is *ops: a copy of the CPU's (cpu_ops) that
 * the caller has dressed, through dress(ops); an engine on it alone. */
static mf_engine *make_dressed(mf_backend_ops *ops, void (*dress)(mf_backend_ops *ops)) {
    mf_backend *b;
    mf_error err;
    MF_ASSERT(mf_backend_cpu_new(W, 2, &b, &err) == 0);
    cpu_ops = b->ops;
    *ops = *b->ops;
    dress(ops);
    b->ops = ops;
    mf_engine_opts o = {.n_layers = NL, .kv_dim = KVD, .n_ctx = NCTX, .k_type = MF_TYPE_F32, .v_type = MF_TYPE_F32, .n_vocab = NV};
    mf_engine *e;
    MF_ASSERT(mf_engine_new(&o, &b, 1, &e, &err) == 0);
    return e;
}

static void dress_host(mf_backend_ops *ops) {
    ops->synchronize = wrap_sync;
    ops->host_alloc = wrap_halloc;
    ops->host_free = wrap_hfree;
}

/* Output memory from the backend (zeroed, given back through host_free, a
 * heap fallback when it has none), one synchronize per one-split forward
 * before the output is read: same logits. */
MF_TEST(host_memory_and_one_synchronize) {
    static float want[9 * NV];
    mf_engine *e0 = make(CFG_CPU, MF_TYPE_F32);
    run_seq(e0, MF_TYPE_F32, want);
    mf_engine_free(e0);
    {
        const int waits = 0;
        n_sync = n_halloc = n_hfree = halloc_fail = 0;
        mf_engine *e = make_dressed(&host_ops, dress_host);
        float *out = mf_engine_host_alloc(e, 9 * NV * sizeof *out);
        CHECK(out && n_halloc == 1 && (void *)out == hblocks[0]);
        int zero = 1;
        for (int i = 0; i < 9 * NV; i++)
            zero &= out[i] == 0.0f;
        CHECK_MSG(zero, "host_alloc memory not zeroed (waits %d)", waits);
        run_seq(e, MF_TYPE_F32, out);
        /* one split per forward: 4 forwards, a synchronize each */
        CHECK_MSG(n_sync == 4, "%d synchronize calls for 4 forwards", n_sync);
        CHECK_MSG(maxdiff(out, want, 9 * NV) == 0.0, "logits differ by %.3g", maxdiff(out, want, 9 * NV));
        mf_engine_host_free(e, out);
        CHECK_EQ_INT(n_hfree, 1);
        halloc_fail = 1; /* no backend memory: the C heap, zeroed, freed with free() */
        float *h = mf_engine_host_alloc(e, 64 * sizeof *h);
        CHECK(h && h[0] == 0.0f && h[63] == 0.0f);
        mf_engine_host_free(e, h);
        CHECK_EQ_INT(n_hfree, 1);
        halloc_fail = 0;
        CHECK(mf_engine_host_alloc(e, 16) != NULL); /* left for mf_engine_free to give back */
        mf_engine_free(e);
        CHECK_EQ_INT(n_hfree, 2);
    }
}

/* A CPU backend with an execute_split: it keeps the calls of each graph
 * build's first forward and checks that every later forward of that build
 * hands it the same calls in the same order (the promise a backend that
 * replays a recorded split relies on); it writes the split's host inputs
 * itself and runs the calls through the generic execute_node. The split
 * that produces the logits is told where the engine reads them. Forwards of
 * several builds (prefill, decode) and a KV type change (a rebuild that
 * moves the KV regions) in one engine. */
enum { REP_MAX = 256 };
static struct {
    uint64_t stamp;
    mf_node_call calls[REP_MAX];
    int n;
} rep_builds[8];
static int rep_nb, rep_mismatch, rep_splits, rep_read_back, rep_host;
static float *rep_logits;
static mf_backend_ops rep_ops;

static int rep_split(mf_backend *b, const mf_split_call *s, mf_error *err) {
    rep_splits++;
    int cur = -1;
    for (int i = 0; i < rep_nb; i++)
        if (rep_builds[i].stamp == s->g->stamp)
            cur = i;
    if (cur < 0 && rep_nb < 8 && s->n_calls <= REP_MAX) { /* first forward of this build */
        cur = rep_nb++;
        rep_builds[cur].stamp = s->g->stamp;
        rep_builds[cur].n = s->n_calls;
        memcpy(rep_builds[cur].calls, s->calls, (size_t)s->n_calls * sizeof *s->calls);
    } else if (cur >= 0 && (rep_builds[cur].n != s->n_calls ||
                            memcmp(rep_builds[cur].calls, s->calls, (size_t)s->n_calls * sizeof *s->calls))) {
        rep_mismatch++;
    }
    for (int32_t k = 0; k < s->n_host_inputs; k++) {
        const mf_host_input *h = &s->host_inputs[k];
        rep_host++;
        if (b->ops->write_host(b, h->buf, 0, h->data, h->nbytes, err))
            return -1;
    }
    for (int32_t k = 0; k < s->n_outputs; k++)
        if (s->read_back[k]) {
            const float *p = s->read_back[k];
            rep_read_back += p >= rep_logits && p < rep_logits + 9 * NV &&
                             (s->g->nodes[s->outputs[k]].flags & MF_NODE_OUTPUT) &&
                             s->out_bufs[k] == s->g->nodes[s->outputs[k]].buf;
        }
    for (int32_t k = 0; k < s->n_calls; k++)
        if (mf_backend_execute_node(b, s->g, &s->calls[k], s->args, err))
            return -1;
    return 0;
}

static void dress_rep(mf_backend_ops *ops) {
    ops->execute_split = rep_split;
}

MF_TEST(execute_split_same_logits_and_same_calls) {
    static float want[9 * NV], got[9 * NV];
    mf_engine *e0 = make(CFG_CPU, MF_TYPE_F32);
    run_seq(e0, MF_TYPE_F32, want);
    mf_engine_free(e0);
    mf_engine *e = make_dressed(&rep_ops, dress_rep);
    rep_logits = got;
    for (int rep = 0; rep < 2; rep++) { /* the second sequence: every build known from the first */
        for (int i = 0; i < 9 * NV; i++)
            got[i] = NAN;
        run_seq(e, MF_TYPE_F32, got);
        CHECK_MSG(maxdiff(got, want, 9 * NV) == 0.0, "pass %d: logits differ by %.3g", rep,
                  maxdiff(got, want, 9 * NV));
    }
    CHECK_MSG(rep_mismatch == 0, "%d splits differ from the same build's earlier forward", rep_mismatch);
    CHECK_MSG(rep_splits == 8 && rep_nb >= 2, "%d splits, %d builds", rep_splits, rep_nb);
    CHECK_MSG(rep_host >= 8, "%d host inputs written by the backend in 8 forwards", rep_host);
    CHECK_MSG(rep_read_back == 8, "the logits' read_back named in %d of 8 forwards", rep_read_back);
    /* a KV type change rebuilds (new stamp) and moves the regions: the
     * backend sees a new build, never the old calls */
    const int nb0 = rep_nb;
    static float f16[9 * NV];
    rep_logits = f16;
    run_seq(e, MF_TYPE_F16, f16);
    CHECK_MSG(rep_nb > nb0 && rep_mismatch == 0, "builds %d -> %d, mismatches %d", nb0, rep_nb, rep_mismatch);
    mf_engine_free(e);
}

int main(int argc, char **argv) {
    setup();
    static const mf_test_entry tests[] = {
        MF_T(cpu_vs_ref_cpu_vs_alternate_same_logits), MF_T(graph_reuse_and_rebuild_identity),
        MF_T(kv_migrates_when_attention_moves), MF_T(kv_type_change_converts_contents),
        MF_T(errors_name_the_problem), MF_T(host_memory_and_one_synchronize),
        MF_T(execute_split_same_logits_and_same_calls),
    };
    int rc = mf_test_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    mf_weights_free(W);
    return rc;
}
