/* test_metal_faults.c - the Metal backend's failure paths, through the
 * stand-in framework's test hooks (emulated build only):
 *  - a kernel missing from the library fails start-up naming it;
 *  - a hang (commits never complete) times out within the options' GPU bound
 *    with a message naming the last dispatches, and the device then refuses
 *    further work;
 *  - a launch over the pipeline's thread limit is refused with the numbers;
 *  - options.metal.disable (MINFER_DISABLE_METAL) and a bad metallib file
 *    (MINFER_METALLIB_FILE) refuse start-up;
 *  - shapes the kernels cannot index are refused (the node goes elsewhere);
 *  - ATTN_PAGED: batches that change between calls (before and after a
 *    submit) are each uploaded and match the CPU's; bad batches are refused;
 *  - a clean run leaves no validation / race finding in the stand-in. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/metal/metal_backend.h"
#include "engine/engine.h"
#include "mf_standin.h"
#include "mf_test.h"

static mf_weights *W;

static void add_weight(const char *name, uint32_t type, int64_t n_in, int64_t n_out) {
    float *f = malloc((size_t)(n_in * n_out) * sizeof *f);
    for (int64_t i = 0; i < n_in * n_out; i++)
        f[i] = (float)((i * 7919) % 201 - 100) / 100.0f;
    size_t bytes = mf_type_row_size(type, n_in) * (size_t)n_out;
    void *q = malloc(bytes);
    mf_quantize_rows(type, f, q, n_out, n_in);
    free(f);
    mf_weight w = {.name = name, .type = type, .n_dims = 2, .ne = {n_in, n_out, 1, 1}, .nbytes = bytes};
    mf_error err;
    MF_ASSERT(mf_weights_add_owned(W, &w, q, &err) == 0);
}

/* x (256 x 3) -> matmul "w" (64 rows) -> silu -> output */
static int build(void *ctx, const mf_graph_params *p, mf_graph *g, mf_error *err) {
    int32_t x = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, 256, p->n_tokens);
    int32_t y = mf_g_matmul(g, x, "w", MF_TYPE_Q4_0, NULL, 256, 64);
    mf_g_set_name(g, y, "blk.0.attn_q");
    int32_t o = mf_g_silu(g, y);
    mf_g_set_name(g, o, "out");
    g->nodes[o].flags |= MF_NODE_OUTPUT;
    return 0;
}

static float X[256 * 3];

/* One forward on [metal, cpu]; returns its rc, err filled. */
static int forward(mf_engine *e, float *out, mf_error *err) {
    mf_engine_set_external(e, 0, X, sizeof X);
    mf_graph_params p = {.n_tokens = 3, .n_outputs = 1, .k_type = MF_TYPE_F32, .v_type = MF_TYPE_F32, .gpu = true};
    return mf_engine_forward(e, &p, build, NULL, NULL, 0, out, err);
}

/* engine(): the Metal backend made with these options (the defaults when NULL) */
static const mf_backend_options *engine_opts;

static mf_engine *engine(mf_error *err) {
    mf_backend *b[2] = {NULL, NULL};
    mf_metal_opts mo = {.backend = engine_opts};
    if (mf_backend_metal_new(W, &mo, &b[0], err))
        return NULL;
    MF_ASSERT(mf_backend_cpu_new(W, 1, &b[1], err) == 0);
    mf_engine_opts eo = {.n_layers = 1, .kv_dim = 64, .n_ctx = 8, .k_type = MF_TYPE_F32, .v_type = MF_TYPE_F32,
                         .n_vocab = 64 * 3};
    mf_engine *e = NULL;
    if (mf_engine_new(&eo, b, 2, &e, err))
        return NULL;
    return e;
}

MF_TEST(clean_run_has_no_findings) {
    mf_standin_reset_violations();
    mf_error err = {{0}};
    mf_engine *e = engine(&err);
    CHECK_MSG(e, "%s", err.msg);
    if (!e)
        return;
    float out[64 * 3];
    CHECK_MSG(forward(e, out, &err) == 0, "%s", err.msg);
    CHECK_MSG(forward(e, out, &err) == 0, "%s", err.msg);
    CHECK_MSG(mf_standin_violations() == 0, "stand-in findings: %s", mf_standin_last_violation());
    CHECK(isfinite(out[0]));
    mf_engine_free(e);
}

MF_TEST(missing_kernel_fails_startup_naming_it) {
    CHECK_EQ_INT(mf_standin_hide_kernel("mf_gemv_q4_K", 1), 0);
    mf_backend *b = NULL;
    mf_error err = {{0}};
    CHECK(mf_backend_metal_new(W, NULL, &b, &err) != 0);
    CHECK(b == NULL);
    CHECK_STR_CONTAINS(err.msg, "mf_gemv_q4_K");
    mf_standin_hide_kernel("mf_gemv_q4_K", 0);
    CHECK_MSG(mf_backend_metal_new(W, NULL, &b, &err) == 0, "after unhiding: %s", err.msg);
    mf_backend_free(b);
}

MF_TEST(thread_limit_guard_names_the_numbers) {
    mf_standin_set_pipeline_max_threads(64); /* the GEMV launches 128 */
    mf_error err = {{0}};
    mf_engine *e = engine(&err);
    mf_standin_set_pipeline_max_threads(1024);
    CHECK_MSG(e, "%s", err.msg);
    if (!e)
        return;
    float out[64 * 3];
    CHECK(forward(e, out, &err) != 0);
    CHECK_STR_CONTAINS(err.msg, "128 threads per threadgroup");
    CHECK_STR_CONTAINS(err.msg, "allows 64");
    CHECK_STR_CONTAINS(err.msg, "blk.0.attn_q");
    mf_engine_free(e);
}

MF_TEST(levers_refuse_startup) {
    mf_backend *b = NULL;
    mf_error err = {{0}};
    mf_backend_options bo;
    mf_backend_options_default(&bo);
    mf_metal_opts mo = {.backend = &bo};
    bo.metal.disable = true;
    CHECK(mf_backend_metal_new(W, &mo, &b, &err) != 0);
    CHECK_STR_CONTAINS(err.msg, "MINFER_DISABLE_METAL");
    bo.metal.disable = false;
    bo.metal.metallib = "/nonexistent/minfer.metallib";
    CHECK(mf_backend_metal_new(W, &mo, &b, &err) != 0);
    CHECK_STR_CONTAINS(err.msg, "/nonexistent/minfer.metallib");
    CHECK(b == NULL);
}

MF_TEST(cache_policy_and_runtime_levers) {
    /* f16 for the 7B class (28 layers x kv 512), f32 for a 0.5B (24 x 128) */
    CHECK_EQ_INT(mf_metal_auto_cache_type(28, 512), MF_TYPE_F16);
    CHECK_EQ_INT(mf_metal_auto_cache_type(36, 1024), MF_TYPE_F16);
    CHECK_EQ_INT(mf_metal_auto_cache_type(24, 128), MF_TYPE_F32);
    /* the runtime's options: fusion off withdraws the fused ops */
    mf_backend_options bo;
    mf_backend_options_default(&bo);
    bo.fusion = false;
    mf_metal_opts mo = {.backend = &bo};
    mf_backend *b = NULL;
    mf_error err = {{0}};
    CHECK_MSG(mf_backend_metal_new(W, &mo, &b, &err) == 0, "%s", err.msg);
    if (!b)
        return;
    CHECK(!b->ops->supports_fused(b, MF_FUSE_FFN));
    CHECK(!b->ops->supports_fused(b, MF_FUSE_QKV));
    CHECK(b->ops->supports_fused(b, MF_FUSE_SWIGLU));
    mf_backend_free(b);
    bo.fusion = true;
    CHECK_MSG(mf_backend_metal_new(W, &mo, &b, &err) == 0, "%s", err.msg);
    CHECK(b && b->ops->supports_fused(b, MF_FUSE_FFN));
    mf_backend_free(b);
}

MF_TEST(unindexable_shapes_are_refused) {
    mf_backend *b = NULL;
    mf_error err = {{0}};
    CHECK_MSG(mf_backend_metal_new(W, NULL, &b, &err) == 0, "%s", err.msg);
    if (!b)
        return;
    mf_node n = {.op = MF_OP_ATTN, .ne = {8 * 320, 1, 1, 1}};
    n.meta.attn = (mf_attn_meta){.n_head = 8, .n_head_kv = 2, .head_dim = 320, .scale = 1.0f};
    CHECK(!mf_backend_supports_op(b, &n)); /* head_dim > 256: more than 8 values a lane */
    n.meta.attn.head_dim = 128;
    CHECK(mf_backend_supports_op(b, &n));
    n.meta.attn.n_head_kv = 3; /* 8 % 3 != 0 */
    CHECK(!mf_backend_supports_op(b, &n));
    n = (mf_node){.op = MF_OP_QKV_BIAS_ROPE_STORE};
    CHECK(!mf_backend_supports_op(b, &n));
    mf_backend_free(b);
}

/* One ATTN_PAGED graph (2 heads over 1 KV head of 32, 2 tokens) on b: the
 * batches kbs[0..n) executed in turn over one f32 pool of 8 blocks of 4 rows,
 * a submit after the first when split_submit; the outputs into out (n x 128
 * floats). Returns the first error's rc. */
enum { PG_BS = 4, PG_ROWS = 32, PG_KVD = 32, PG_QD = 64 };
static int paged_runs(mf_backend *b, const mf_kv_batch *kbs, int n, bool split_submit, float *out,
                      mf_error *err) {
    mf_graph g;
    mf_graph_init(&g);
    g.n_layers = 1;
    g.kv_dim = PG_KVD;
    const int32_t xq = mf_g_input(&g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, PG_QD, 2);
    const int32_t xk = mf_g_input(&g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, PG_KVD, 2);
    const int32_t xv = mf_g_input(&g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, PG_KVD, 2);
    const mf_attn_meta meta = {.n_head = 2, .n_head_kv = 1, .head_dim = 32, .scale = 0.2f};
    const int32_t node = mf_g_attn_paged(&g, xq, xk, xv, &meta);
    g.nodes[node].flags |= MF_NODE_OUTPUT;
    const mf_backend_ops *o = b->ops;
    float q[2 * PG_QD], kn[2 * PG_KVD], vn[2 * PG_KVD], pool[PG_ROWS * PG_KVD];
    for (int i = 0; i < 2 * PG_QD; i++)
        q[i] = (float)((i * 37) % 19 - 9) / 9.0f;
    for (int i = 0; i < 2 * PG_KVD; i++) {
        kn[i] = (float)((i * 13) % 11 - 5) / 5.0f;
        vn[i] = (float)((i * 29) % 7 - 3) / 3.0f;
    }
    for (int i = 0; i < PG_ROWS * PG_KVD; i++)
        pool[i] = (float)((i * 101) % 23 - 11) / 11.0f;
    const int32_t bq = o->alloc_buffer(b, sizeof q, err), bk = o->alloc_buffer(b, sizeof kn, err);
    const int32_t bv = o->alloc_buffer(b, sizeof vn, err);
    const mf_kv_pair kv = {o->alloc_fresh(b, sizeof pool, err), o->alloc_fresh(b, sizeof pool, err)};
    int32_t bo[4];
    for (int i = 0; i < n; i++)
        bo[i] = o->alloc_fresh(b, 2 * PG_QD * sizeof(float), err);
    int rc = o->write_host(b, bq, 0, q, sizeof q, err) || o->write_host(b, bk, 0, kn, sizeof kn, err) ||
             o->write_host(b, bv, 0, vn, sizeof vn, err) || o->write_host(b, kv.k, 0, pool, sizeof pool, err) ||
             o->write_host(b, kv.v, 0, pool, sizeof pool, err);
    for (int i = 0; i < n && !rc; i++) {
        const mf_exec_args args = {.n_tokens = 2, .n_ctx = PG_ROWS, .k_type = MF_TYPE_F32, .v_type = MF_TYPE_F32, .batch = &kbs[i]};
        const mf_node_call call = {.node = node, .in = {bq, bk, bv, -1}, .out = bo[i], .kv = kv};
        rc = mf_backend_execute_node(b, &g, &call, &args, err) ||
             (split_submit && i == 0 && o->synchronize(b, err));
    }
    rc = rc || o->synchronize(b, err);
    for (int i = 0; i < n && !rc; i++)
        rc = o->read_host(b, bo[i], 0, out + i * 2 * PG_QD, 2 * PG_QD * sizeof(float), err);
    mf_graph_free(&g);
    return rc;
}

MF_TEST(paged_batches_reupload_and_bad_batches_refused) {
    mf_backend *m = NULL, *c = NULL;
    mf_error err = {{0}};
    CHECK_MSG(mf_backend_metal_new(W, NULL, &m, &err) == 0, "%s", err.msg);
    MF_ASSERT(mf_backend_cpu_new(W, 1, &c, &err) == 0);
    if (!m) {
        mf_backend_free(c);
        return;
    }
    /* three sequences, sequence 2 outside the batch; A -> B changes the
     * positions only (same ints otherwise), C moves sequence 0's blocks */
    static const int32_t t0[] = {3, 6}, t1[] = {1}, t0c[] = {7, 0};
    const int32_t *const ta[] = {t0, t1, NULL}, *const tc[] = {t0c, t1, NULL};
    static const int32_t seq[] = {0, 1}, pa[] = {5, 2}, pbb[] = {6, 3};
    const mf_kv_batch kbs[3] = {
        {.n_tokens = 2, .seq = seq, .pos = pa, .n_seqs = 3, .tables = ta, .block_size = PG_BS},
        {.n_tokens = 2, .seq = seq, .pos = pbb, .n_seqs = 3, .tables = ta, .block_size = PG_BS},
        {.n_tokens = 2, .seq = seq, .pos = pbb, .n_seqs = 3, .tables = tc, .block_size = PG_BS},
    };
    for (int split = 0; split < 2; split++) {
        float got[3 * 2 * PG_QD], want[3 * 2 * PG_QD];
        CHECK_MSG(paged_runs(m, kbs, 3, split, got, &err) == 0, "%s", err.msg);
        CHECK_MSG(paged_runs(c, kbs, 3, split, want, &err) == 0, "%s", err.msg);
        double worst = 0;
        for (int i = 0; i < 3 * 2 * PG_QD; i++) {
            const double e = fabs((double)got[i] - want[i]);
            worst = isnan(e) || e > worst ? e : worst; /* a NaN sticks */
        }
        CHECK_MSG(worst <= 1e-4, "split %d: metal vs cpu max error %g", split, worst);
        /* the three batches' outputs differ: each call read its own batch */
        CHECK(memcmp(got, got + 2 * PG_QD, 2 * PG_QD * sizeof(float)) != 0);
        CHECK(memcmp(got + 2 * PG_QD, got + 4 * PG_QD, 2 * PG_QD * sizeof(float)) != 0);
    }
    const int32_t *const tnull[] = {t0, NULL, NULL};
    static const int32_t tneg[] = {-1, 6};
    const int32_t *const tn[] = {tneg, t1, NULL};
    const mf_kv_batch bad[2] = {
        {.n_tokens = 2, .seq = seq, .pos = pa, .n_seqs = 3, .tables = tnull, .block_size = PG_BS},
        {.n_tokens = 2, .seq = seq, .pos = pa, .n_seqs = 3, .tables = tn, .block_size = PG_BS},
    };
    float out[2 * PG_QD];
    mf_error e1 = {{0}}, e2 = {{0}};
    CHECK(paged_runs(m, &bad[0], 1, false, out, &e1) != 0);
    CHECK_STR_CONTAINS(e1.msg, "batch token 1: sequence 1 of 3 at position 2 (no block table)");
    CHECK(paged_runs(m, &bad[1], 1, false, out, &e2) != 0);
    CHECK_STR_CONTAINS(e2.msg, "sequence 0: block 0 of its table is -1");
    mf_backend_free(m);
    mf_backend_free(c);
}

/* Last: the device is failed afterwards. */
MF_TEST(hang_times_out_names_dispatches_and_fails_device) {
    mf_backend_options bo;
    mf_backend_options_default(&bo);
    bo.gpu_timeout_ms = 300;
    engine_opts = &bo;
    mf_error err = {{0}};
    mf_engine *e = engine(&err);
    engine_opts = NULL;
    CHECK_MSG(e, "%s", err.msg);
    if (!e)
        return;
    float out[64 * 3];
    mf_standin_set_hang(1);
    CHECK(forward(e, out, &err) != 0);
    CHECK_STR_CONTAINS(err.msg, "did not complete within 300 ms");
    CHECK_STR_CONTAINS(err.msg, "mf_gemv_q4_0[blk.0.attn_q]");
    CHECK_STR_CONTAINS(err.msg, "mf_silu[out]");
    CHECK_STR_CONTAINS(err.msg, "marked failed");
    mf_standin_set_hang(0);
    mf_error err2 = {{0}};
    CHECK(forward(e, out, &err2) != 0);
    CHECK_STR_CONTAINS(err2.msg, "failed earlier");
    mf_engine_free(e);
}

int main(int argc, char **argv) {
    W = mf_weights_new();
    add_weight("w", MF_TYPE_Q4_0, 256, 64);
    for (int i = 0; i < 256 * 3; i++)
        X[i] = (float)(i % 17) / 17.0f - 0.5f;
    static const mf_test_entry tests[] = {
        MF_T(clean_run_has_no_findings), MF_T(missing_kernel_fails_startup_naming_it),
        MF_T(thread_limit_guard_names_the_numbers), MF_T(levers_refuse_startup),
        MF_T(cache_policy_and_runtime_levers), MF_T(unindexable_shapes_are_refused),
        MF_T(paged_batches_reupload_and_bad_batches_refused), MF_T(hang_times_out_names_dispatches_and_fails_device),
    };
    int rc = mf_test_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    mf_weights_free(W);
    return rc;
}
