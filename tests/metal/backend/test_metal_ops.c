/* test_metal_ops.c - what only the Metal backend has, under the MSL
 * emulator, through the whole engine with the backend list [metal, cpu]:
 * its refusals (K-quant rows with K % 256 != 0 go to the CPU), its two
 * matmul tiers forced by the option and agreeing, its own fused dispatches
 * against the plain graph, its kernel list; each case also checks where the
 * node ran. Every op against float64 on every backend, Metal included, is
 * tests/ops (ctest ops_metal, under each emulator schedule). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/metal/metal_backend.h"
#include "engine/engine.h"
#include "mf_test.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) {
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

static void add_weight(const char *name, uint32_t type, int64_t n_in, int64_t n_out, int n_dims, float scale) {
    if (mf_weights_find(W, name))
        return;
    float *f = rand_vec(n_in * n_out, scale);
    size_t bytes = mf_type_row_size(type, n_in) * (size_t)n_out;
    void *q = malloc(bytes);
    mf_quantize_rows(type, f, q, n_out, n_in);
    free(f);
    mf_weight w = {.name = strdup(name), .type = type, .n_dims = (uint32_t)n_dims, .ne = {n_in, n_out, 1, 1},
                   .nbytes = bytes};
    mf_error err;
    MF_ASSERT(mf_weights_add_owned(W, &w, q, &err) == 0);
}

/* ---- cases ------------------------------------------------------------------------------ */

enum { C_ADD, C_MUL, C_MUL_BCAST, C_SCALE, C_SILU, C_SILU_MUL, C_RMSNORM, C_VIEW, C_PERMUTE, C_ROWS,
       C_EMBED, C_MATMUL, C_ROPE, C_QKNORM, C_STORE_LOAD, C_ATTN, C_FFN_FUSED, C_FFN_PLAIN, C_QKV_FUSED, C_QKV_PLAIN };

typedef struct tcase {
    int kind;
    int64_t w, nt;
    const char *weight, *up, *bias;
    uint32_t wtype;
    int64_t n_out;
    mf_rope_meta rope;
    int64_t n_kv;
    int32_t n_head, n_head_kv, head_dim;
    bool qk_norm;        /* QKV: Qwen3's per-head norms */
    bool read_kv;        /* QKV: output K + 1000 V of the cache instead of Q */
    int32_t target;      /* node index of the op under test (set by the builder) */
    int64_t out_nelem;
} tcase;

static int build_case(void *ctx, const mf_graph_params *p, mf_graph *g, mf_error *err) {
    tcase *c = ctx;
    const int64_t nt = p->n_tokens;
    int32_t x = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, c->w, nt);
    int32_t y, o = -1;
    switch (c->kind) {
    case C_ADD: y = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, c->w, nt); o = mf_g_add(g, x, y); break;
    case C_MUL: y = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, c->w, nt); o = mf_g_mul(g, x, y); break;
    case C_MUL_BCAST: y = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, c->w, 1); o = mf_g_mul(g, x, y); break;
    case C_SCALE: o = mf_g_scale(g, x, -1.75f); break;
    case C_SILU: o = mf_g_silu(g, x); break;
    case C_SILU_MUL:
        y = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, c->w, nt);
        o = mf_g_mul(g, mf_g_silu(g, x), y);
        break;
    case C_RMSNORM: o = mf_g_rmsnorm(g, x, c->weight, 1e-5f); break;
    case C_VIEW: o = mf_g_view(g, x, 5, c->w - 9); break;
    case C_PERMUTE: {
        int32_t r = mf_g_reshape(g, x, c->w / 4, 4 * nt);
        g->nodes[r].ne[1] = 4;
        g->nodes[r].ne[2] = nt;
        o = mf_g_permute(g, r, (int32_t[]){1, 2, 0, 3});
        break;
    }
    case C_ROWS: o = mf_g_rows(g, x, 1, nt - 2); break;
    case C_EMBED: {
        int32_t t = mf_g_input(g, MF_INPUT_TOKENS, MF_DTYPE_I32, nt, 1);
        o = mf_g_embed(g, t, c->weight, c->wtype, c->w);
        c->target = o;
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
        c->target = st;
        int32_t lk = mf_g_kv_load(g, st, 0, 0, c->n_kv);
        int32_t lv = mf_g_kv_load(g, st, 0, 1, c->n_kv);
        int32_t r1 = mf_g_reshape(g, lk, c->w * c->n_kv, 1);
        int32_t r2 = mf_g_reshape(g, lv, c->w * c->n_kv, 1);
        o = mf_g_add(g, r1, mf_g_scale(g, r2, 1000.0f));
        break;
    }
    case C_ATTN: {
        int32_t k = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, g->kv_dim, nt);
        int32_t v = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, g->kv_dim, nt);
        int32_t st = mf_g_kv_store(g, k, v, 0);
        mf_attn_meta m = {.layer = 0, .n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = c->head_dim,
                          .scale = 1.0f / sqrtf((float)c->head_dim)};
        o = mf_g_attn(g, x, st, &m);
        break;
    }
    case C_FFN_FUSED: {
        mf_ffn_meta m = {.gate = {c->weight, c->wtype, NULL, c->w, c->n_out},
                         .up = {c->up, c->wtype, NULL, c->w, c->n_out}};
        o = mf_g_fused_ffn(g, x, &m);
        break;
    }
    case C_QKV_FUSED:
    case C_QKV_PLAIN: {
        int32_t pos = mf_g_input(g, MF_INPUT_POSITIONS, MF_DTYPE_I32, nt, 1);
        const int64_t qd = (int64_t)c->n_head * c->head_dim, kd = (int64_t)c->n_head_kv * c->head_dim;
        mf_qkv_meta m = {.layer = 0, .n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = c->head_dim,
                         .norm_eps = 1e-6f, .rope_q = c->rope, .rope_k = c->rope};
        m.rope_k.n_head = c->n_head_kv;
        m.q = (mf_matmul_meta){"fq", c->wtype, "fq.b", c->w, qd};
        m.k = (mf_matmul_meta){"fk", c->wtype, "fk.b", c->w, kd};
        m.v = (mf_matmul_meta){"fv", c->wtype, "fv.b", c->w, kd};
        if (c->qk_norm) {
            m.q_norm = "qn.64";
            m.k_norm = "kn.64";
        }
        int32_t st;
        if (c->kind == C_QKV_FUSED) {
            o = st = mf_g_fused_qkv(g, x, pos, &m);
        } else {
            int32_t q = mf_g_matmul(g, x, "fq", c->wtype, "fq.b", c->w, qd);
            int32_t k = mf_g_matmul(g, x, "fk", c->wtype, "fk.b", c->w, kd);
            int32_t v = mf_g_matmul(g, x, "fv", c->wtype, "fv.b", c->w, kd);
            if (c->qk_norm) {
                q = mf_g_qknorm(g, q, "qn.64", c->head_dim, 1e-6f);
                k = mf_g_qknorm(g, k, "kn.64", c->head_dim, 1e-6f);
            }
            o = mf_g_rope(g, q, pos, &m.rope_q);
            st = mf_g_kv_store(g, mf_g_rope(g, k, pos, &m.rope_k), v, 0);
        }
        c->target = o;
        if (c->read_kv) {
            int32_t r1 = mf_g_reshape(g, mf_g_kv_load(g, st, 0, 0, c->n_kv), kd * c->n_kv, 1);
            int32_t r2 = mf_g_reshape(g, mf_g_kv_load(g, st, 0, 1, c->n_kv), kd * c->n_kv, 1);
            o = mf_g_add(g, r1, mf_g_scale(g, r2, 1000.0f));
        }
        break;
    }
    case C_FFN_PLAIN:
        o = mf_g_swiglu(g, mf_g_matmul(g, x, c->weight, c->wtype, NULL, c->w, c->n_out),
                        mf_g_matmul(g, x, c->up, c->wtype, NULL, c->w, c->n_out));
        break;
    }
    if (c->kind != C_EMBED && c->kind != C_STORE_LOAD && c->kind != C_QKV_FUSED && c->kind != C_QKV_PLAIN)
        c->target = o;
    g->nodes[o].flags |= MF_NODE_OUTPUT;
    if (!g->nodes[o].name[0])
        mf_g_set_name(g, o, "out");
    c->out_nelem = mf_node_nelem(&g->nodes[o]);
    return 0;
}

typedef struct run_opts {
    int n_ext;
    float *ext[4];
    int64_t ext_n[4];
    const int32_t *tokens;
    int32_t n_past;
    uint32_t kv_type;
    int64_t kv_dim;
    int32_t n_ctx;
    bool fuse_swiglu;
} run_opts;

enum { ON_METAL, ON_REF, ON_CPU };

/* Runs c with the backend list of `on`; *where gets the backend kind of the
 * node under test. */
/* The Metal backend's options: the defaults, the GPU bound from ctest's
 * MINFER_GPU_TIMEOUT_MS (an emulated run is slow), the matmul tier a case
 * forces. */
static mf_backend_options metal_opts;

static int run_on(int on, tcase *c, const run_opts *ro, float *out, int64_t out_n, int *where, mf_error *err) {
    mf_backend *b[2] = {NULL, NULL};
    int nb = 0;
    if (on == ON_METAL) {
        mf_metal_opts mo = {.backend = &metal_opts};
        if (mf_backend_metal_new(W, &mo, &b[nb], err))
            return -1;
        nb++;
    } else if (on == ON_REF) {
        MF_ASSERT(mf_backend_ref_new(W, &b[nb++], err) == 0);
    }
    MF_ASSERT(mf_backend_cpu_new(W, 2, &b[nb++], err) == 0);
    mf_engine_opts eo = {.n_layers = 1, .kv_dim = ro->kv_dim ? ro->kv_dim : 64, .n_ctx = ro->n_ctx ? ro->n_ctx : 128,
                         .k_type = ro->kv_type, .v_type = ro->kv_type, .n_vocab = out_n};
    mf_engine *e;
    if (mf_engine_new(&eo, b, nb, &e, err))
        return -1;
    for (int k = 0; k < ro->n_ext; k++)
        mf_engine_set_external(e, k, ro->ext[k], (size_t)ro->ext_n[k] * 4);
    mf_graph_params p = {.n_tokens = (int32_t)c->nt, .n_outputs = 1, .k_type = ro->kv_type, .v_type = ro->kv_type,
                         .gpu = on == ON_METAL, .fuse_swiglu = ro->fuse_swiglu};
    int rc = 0;
    if (ro->n_past > 0) {
        mf_graph_params p0 = p;
        rc = mf_engine_forward(e, &p0, build_case, c, ro->tokens, 0, NULL, err);
        mf_engine_invalidate(e);
    }
    if (!rc)
        rc = mf_engine_forward(e, &p, build_case, c, ro->tokens, ro->n_past, out, err);
    if (!rc) {
        const mf_graph *g = mf_engine_graph(e);
        int32_t bi = g->nodes[c->target].backend;
        *where = mf_engine_backend(e, bi)->kind;
    }
    mf_engine_free(e);
    return rc;
}

static double max_err(const float *a, const float *b, int64_t n, double *bmax) {
    double m = 0, bm = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m))
            m = d;
        if (fabs(b[i]) > bm)
            bm = fabs(b[i]);
    }
    *bmax = bm;
    return m;
}

static int n_cases;

/* Runs c on Metal and on the reference list `ref`; checks the outputs agree
 * within rtol of max |reference| and that the node ran on `want`. */
static void metal_vs(int ref, const char *label, tcase *c, const run_opts *ro, int64_t out_n, double rtol,
                     mf_backend_kind want) {
    float *a = malloc((size_t)out_n * 4), *b = malloc((size_t)out_n * 4);
    for (int64_t i = 0; i < out_n; i++)
        a[i] = b[i] = NAN;
    mf_error err = {{0}};
    int wa = -1, wb = -1;
    int ra = run_on(ON_METAL, c, ro, a, out_n, &wa, &err);
    CHECK_MSG(ra == 0, "%s on metal: %s", label, err.msg);
    int rb = run_on(ref, c, ro, b, out_n, &wb, &err);
    CHECK_MSG(rb == 0, "%s on %s: %s", label, ref == ON_REF ? "ref" : "cpu", err.msg);
    if (!ra && !rb) {
        double bm, m = max_err(a, b, out_n, &bm);
        CHECK_MSG(m <= rtol * bm + 1e-6, "%s: metal vs %s max diff %.3g (max |ref| %.3g, rtol %.2g)", label,
                  ref == ON_REF ? "ref" : "cpu", m, bm, rtol);
        CHECK_MSG(bm > 0, "%s: all-zero output", label);
        CHECK_MSG(wa == (int)want, "%s: the node ran on backend kind %d, expected %d", label, wa, (int)want);
    }
    n_cases++;
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

enum { N_TYPES = 13 }; /* the weight types every matmul family has a kernel for (MF_WTYPES) */

/* ---- the cases ------------------------------------------------------------------------------ */

static void mm_case(uint32_t t, int64_t n_in, int64_t n_out, int64_t nt, const char *bias, const char *tag) {
    char name[64];
    snprintf(name, sizeof name, "w.%s.%lld.%lld", mf_type_name(t), (long long)n_in, (long long)n_out);
    add_weight(name, t, n_in, n_out, 2, 1.0f);
    tcase c = {.kind = C_MATMUL, .w = n_in, .nt = nt, .weight = name, .wtype = t, .n_out = n_out, .bias = bias};
    run_opts ro = {.kv_type = MF_TYPE_F32};
    set_ext(&ro, 0, n_in * nt, 1.0f);
    char label[128];
    snprintf(label, sizeof label, "matmul %s %lldx%lld nt %lld%s%s", mf_type_name(t), (long long)n_in,
             (long long)n_out, (long long)nt, bias ? " +bias" : "", tag);
    metal_vs(ON_REF, label, &c, &ro, n_out * nt, 1e-3, MF_BACKEND_METAL);
    free_ext(&ro);
}

MF_TEST(kquant_rows_not_256_are_refused) {
    /* K = 896 = 3.5 super-blocks: the K-quant kernels index whole
     * super-blocks, so Metal refuses the node (it makes a split, the CPU
     * would get it); K = 2560 is taken. */
    mf_backend *b = NULL;
    mf_error err = {{0}};
    CHECK_MSG(mf_backend_metal_new(W, NULL, &b, &err) == 0, "%s", err.msg);
    if (!b)
        return;
    mf_node n = {.op = MF_OP_MATMUL, .ne = {100, 1, 1, 1}};
    const uint32_t kts[] = {MF_TYPE_Q2_K, MF_TYPE_Q3_K, MF_TYPE_Q4_K, MF_TYPE_Q5_K, MF_TYPE_Q6_K};
    for (int i = 0; i < 5; i++) {
        n.meta.matmul = (mf_matmul_meta){"w", kts[i], NULL, 896, 100};
        CHECK_MSG(!mf_backend_supports_op(b, &n), "%s K 896 accepted", mf_type_name(kts[i]));
        n.meta.matmul.n_in = 2560;
        CHECK_MSG(mf_backend_supports_op(b, &n), "%s K 2560 refused", mf_type_name(kts[i]));
    }
    n.meta.matmul = (mf_matmul_meta){"w", MF_TYPE_Q4_0, NULL, 900, 100}; /* not whole 32-blocks */
    CHECK(!mf_backend_supports_op(b, &n));
    mf_backend_free(b);
}

MF_TEST(matmul_gemm_and_gemv_tiers_agree) {
    /* the same 7-token batch through each tier, forced by the option
     * (MINFER_METAL_GEMM) */
    metal_opts.metal.gemm = 1;
    mm_case(MF_TYPE_Q4_0, 896, 100, 7, NULL, " [gemm]");
    mm_case(MF_TYPE_Q5_K, 2560, 100, 7, NULL, " [gemm]");
    mm_case(MF_TYPE_Q4_1, 896, 100, 1, NULL, " [gemm: nt 1 stays gemv]");
    metal_opts.metal.gemm = 0;
    mm_case(MF_TYPE_Q3_K, 2560, 100, 64, NULL, " [gemv]");
    mm_case(MF_TYPE_Q5_0, 896, 100, 64, NULL, " [gemv]");
    metal_opts.metal.gemm = 2;
}

MF_TEST(fused_ffn_vs_plain_on_ref) {
    const uint32_t ts[] = {MF_TYPE_Q4_0, MF_TYPE_Q4_K};
    for (int i = 0; i < 2; i++) {
        int64_t n_in = ts[i] == MF_TYPE_Q4_K ? 512 : 896;
        char gn[64], un[64];
        snprintf(gn, sizeof gn, "gate.%s", mf_type_name(ts[i]));
        snprintf(un, sizeof un, "up.%s", mf_type_name(ts[i]));
        add_weight(gn, ts[i], n_in, 160, 2, 1.0f);
        add_weight(un, ts[i], n_in, 160, 2, 1.0f);
        for (int64_t nt = 1; nt <= 7; nt += 6) {
            tcase fused = {.kind = C_FFN_FUSED, .w = n_in, .nt = nt, .weight = gn, .up = un, .wtype = ts[i], .n_out = 160};
            tcase plain = fused;
            plain.kind = C_FFN_PLAIN;
            run_opts ro = {.kv_type = MF_TYPE_F32};
            set_ext(&ro, 0, n_in * nt, 1.0f);
            float *a = malloc((size_t)(160 * nt) * 4), *b = malloc((size_t)(160 * nt) * 4);
            mf_error err = {{0}};
            int wa = -1, wb = -1;
            CHECK_MSG(run_on(ON_METAL, &fused, &ro, a, 160 * nt, &wa, &err) == 0, "fused ffn: %s", err.msg);
            CHECK_MSG(run_on(ON_REF, &plain, &ro, b, 160 * nt, &wb, &err) == 0, "plain ffn on ref: %s", err.msg);
            double bm, m = max_err(a, b, 160 * nt, &bm);
            CHECK_MSG(m <= 1e-3 * bm, "fused ffn %s nt %lld: max diff %.3g of %.3g", mf_type_name(ts[i]),
                      (long long)nt, m, bm);
            CHECK_EQ_INT(wa, MF_BACKEND_METAL);
            n_cases++;
            free(a);
            free(b);
            free_ext(&ro);
        }
    }
}

MF_TEST(fused_qkv_vs_plain_graph) {
    /* FUSED_QKV (decode: one GEMV for q | k | v) and FUSED_QKV_NORM against
     * the same math as plain nodes on [ref, cpu]: the roped Q, and the K / V
     * rows it stored */
    const uint32_t ts[] = {MF_TYPE_Q8_0, MF_TYPE_Q4_K};
    add_weight("qn.64", MF_TYPE_F32, 64, 1, 1, 1.0f);
    add_weight("kn.64", MF_TYPE_F32, 64, 1, 1, 1.0f);
    for (int i = 0; i < 2; i++) {
        const int64_t n_in = 512;
        mf_weights_free(W); /* fresh fq / fk / fv of this type */
        W = mf_weights_new();
        add_weight("qn.64", MF_TYPE_F32, 64, 1, 1, 1.0f);
        add_weight("kn.64", MF_TYPE_F32, 64, 1, 1, 1.0f);
        add_weight("fq", ts[i], n_in, 8 * 64, 2, 1.0f);
        add_weight("fk", ts[i], n_in, 2 * 64, 2, 1.0f);
        add_weight("fv", ts[i], n_in, 2 * 64, 2, 1.0f);
        add_weight("fq.b", MF_TYPE_F32, 8 * 64, 1, 1, 1.0f);
        add_weight("fk.b", MF_TYPE_F32, 2 * 64, 1, 1, 1.0f);
        add_weight("fv.b", MF_TYPE_F32, 2 * 64, 1, 1, 1.0f);
        for (int v = 0; v < 8; v++) {
            const bool norm = v & 1, kvout = v & 2;
            const int64_t nt = (v & 4) ? 7 : 1;
            tcase fused = {.kind = C_QKV_FUSED, .w = n_in, .nt = nt, .wtype = ts[i], .n_head = 8, .n_head_kv = 2,
                           .head_dim = 64, .n_kv = 5 + nt, .qk_norm = norm, .read_kv = kvout,
                           .rope = {.n_head = 8, .head_dim = 64, .n_rot = 64, .mode = MF_ROPE_NEOX,
                                    .theta = 10000.0f, .freq_scale = 1.0f}};
            tcase plain = fused;
            plain.kind = C_QKV_PLAIN;
            const int64_t out_n = kvout ? 2 * 64 * fused.n_kv : 8 * 64 * nt;
            run_opts ro = {.kv_type = MF_TYPE_F32, .kv_dim = 128, .n_past = 5};
            set_ext(&ro, 0, n_in * nt, 1.0f);
            float *a = malloc((size_t)out_n * 4), *b = malloc((size_t)out_n * 4);
            mf_error err = {{0}};
            int wa = -1, wb = -1;
            CHECK_MSG(run_on(ON_METAL, &fused, &ro, a, out_n, &wa, &err) == 0, "fused qkv: %s", err.msg);
            CHECK_MSG(run_on(ON_REF, &plain, &ro, b, out_n, &wb, &err) == 0, "plain qkv: %s", err.msg);
            double bm, m = max_err(a, b, out_n, &bm);
            CHECK_MSG(m <= 1e-3 * bm && bm > 0, "fused qkv %s nt %lld norm %d %s: max diff %.3g of %.3g",
                      mf_type_name(ts[i]), (long long)nt, norm, kvout ? "K/V" : "Q", m, bm);
            CHECK_EQ_INT(wa, MF_BACKEND_METAL);
            n_cases++;
            free(a);
            free(b);
            free_ext(&ro);
        }
    }
}

MF_TEST(kernel_list_is_complete) {
    /* the backend resolves every name at start: the list covers every
     * family and weight type */
    CHECK(mf_metal_n_kernels() >= 19 + 5 * N_TYPES);
    for (int i = 0; i < mf_metal_n_kernels(); i++)
        CHECK(mf_metal_kernel_name(i) && !strncmp(mf_metal_kernel_name(i), "mf_", 3));
    CHECK(mf_metal_kernel_name(mf_metal_n_kernels()) == NULL);
}

MF_TEST(count) {
    printf("metal op cases: %d\n", n_cases);
    CHECK(n_cases > 0);
}

int main(int argc, char **argv) {
    W = mf_weights_new();
    mf_backend_options_default(&metal_opts);
    const char *t = getenv("MINFER_GPU_TIMEOUT_MS");
    if (t && atol(t) > 0)
        metal_opts.gpu_timeout_ms = atol(t);
    static const mf_test_entry tests[] = {
        MF_T(kquant_rows_not_256_are_refused), MF_T(matmul_gemm_and_gemv_tiers_agree),
        MF_T(fused_ffn_vs_plain_on_ref),       MF_T(fused_qkv_vs_plain_graph),
        MF_T(kernel_list_is_complete),
        MF_T(count),
    };
    int rc = mf_test_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    mf_weights_free(W);
    return rc;
}
