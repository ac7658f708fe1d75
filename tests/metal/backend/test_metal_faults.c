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
        MF_T(cache_policy_and_runtime_levers), MF_T(unindexable_shapes_are_refused), MF_T(hang_times_out_names_dispatches_and_fails_device),
    };
    int rc = mf_test_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    mf_weights_free(W);
    return rc;
}
