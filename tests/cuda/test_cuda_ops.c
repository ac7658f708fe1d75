/* test_cuda_ops.c - every CUDA kernel family against a float64 host
 * reference, through the backend contract (execute_node / synchronize /
 * read_host), at the real model widths.
 *
 * Weights are random blocks (random quant bytes with sane random f16
 * scales), so every bit pattern of a format is exercised; the reference
 * dequantizes the rows it checks with the host reference dequantizer
 * (quant.c) and computes in double. Inputs are random (never zeros), every
 * output buffer is poisoned with NaN before the launch, and a case fails if
 * any output element stays NaN or ||out - ref|| / ||ref|| exceeds its
 * tolerance (1e-3 for f32-activation paths; 3e-3 for the tensor-core GEMM tier,
 * which rounds both operands to f16; 1e-2 for the int8 decode GEMV, which
 * rounds the activations to int8 per 32 elements, and there every sampled
 * output must also lie within the rounding bound
 *   |y - y_ref| <= sum_units amax_unit(x) / 254 * sum_unit |w| (+ 1e-5 sum |w x|)
 * and agree with the f32-activation GEMV to 1e-2). Matmul references are computed
 * for a sample of output rows (all tokens), which keeps the host cost small
 * at vocab width; the NaN check still covers every element.
 *
 * Exit: 0 all passed, 1 a failure, 77 no usable CUDA device (ctest skips).
 * MINFER_CUDA_TEST_SMALL=1: small shapes only (compute-sanitizer runs).
 * MINFER_CUDA_TEST_ONLY=matmul,norm,...: run only these families (matmul,
 * getrows, norm, rope, elementwise, attn, qkv, ffn, fuse_add, fuse_norm,
 * gemv_v2, graph, misc); racecheck runs the shared-memory families this way.
 * The default-off levers (MINFER_CUDA_FUSE_GEMV / _ROPE / _ADD / _NORM,
 * MINFER_CUDA_GEMV_V2, MINFER_CUDA_FLASH_PREFILL) are run through their test
 * hooks (mf_cuda_set_fuse ...) inside the qkv, ffn, attn, fuse_add,
 * fuse_norm and gemv_v2 families, against float64 and the default path. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "quant/quant.h"

/* ---- harness ----------------------------------------------------------------------- */

static int n_pass, n_fail;
static bool small;
static mf_backend *be;
static mf_weights *W;
static const char *only;

/* Whether family `f` runs (MINFER_CUDA_TEST_ONLY unset: all). */
static bool fam(const char *f) {
    if (!only || !*only)
        return true;
    const size_t n = strlen(f);
    for (const char *p = only; (p = strstr(p, f)) != NULL; p += n)
        if ((p == only || p[-1] == ',') && (p[n] == ',' || p[n] == 0))
            return true;
    return false;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
/* uniform in [-1, 1), never exactly 0 */
static float frand(void) {
    float f = (float)((double)(next_u64() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    return f == 0.0f ? 0.5f : f;
}
static float *rand_vec(int64_t n, float scale) {
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = frand() * scale;
    return v;
}

static void result(const char *name, double rel, double tol, int64_t n_nan, const char *note) {
    bool ok = n_nan == 0 && rel <= tol && !isnan(rel);
    printf("%-58s rel %.2e tol %.0e nan %-6lld %s %s\n", name, rel, tol, (long long)n_nan,
           ok ? "PASS" : "FAIL", note ? note : "");
    fflush(stdout);
    if (ok)
        n_pass++;
    else
        n_fail++;
}

static void check_true(const char *name, bool ok, const char *detail) {
    printf("%-58s %s %s\n", name, ok ? "PASS" : "FAIL", detail ? detail : "");
    fflush(stdout);
    if (ok)
        n_pass++;
    else
        n_fail++;
}

static void die(const char *what, const mf_error *e) {
    fprintf(stderr, "test_cuda_ops: %s: %s\n", what, e->msg);
    exit(1);
}

static int32_t dev_put(const void *host, size_t nbytes) {
    mf_error e;
    int32_t id = be->ops->alloc_buffer(be, nbytes, &e);
    if (id < 0)
        die("alloc", &e);
    if (host && be->ops->write_host(be, id, 0, host, nbytes, &e))
        die("write_host", &e);
    return id;
}

/* A buffer of nbytes filled with NaN (the poison every output starts as). */
static int32_t dev_poison(size_t nbytes) {
    float *p = malloc(nbytes + 4);
    for (size_t i = 0; i < nbytes / 4; i++)
        p[i] = NAN;
    int32_t id = dev_put(p, nbytes);
    free(p);
    return id;
}

static float *dev_get(int32_t id, size_t nbytes) {
    mf_error e;
    float *h = malloc(nbytes + 4);
    if (be->ops->synchronize(be, &e) || be->ops->read_host(be, id, 0, h, nbytes, &e))
        die("read_host", &e);
    return h;
}

static void dev_free(int32_t id) {
    be->ops->free_buffer(be, id);
}

/* Executes node `node` and synchronizes; returns 0 or -1 with err. */
static int run(const mf_graph *g, int32_t node, const int32_t *in, int32_t out, mf_kv_pair kv,
               const mf_exec_args *a, mf_error *err) {
    if (be->ops->execute_node(be, g, node, in, out, kv, a, err))
        return -1;
    return be->ops->synchronize(be, err);
}

static void run_ok(const mf_graph *g, int32_t node, const int32_t *in, int32_t out, mf_kv_pair kv,
                   const mf_exec_args *a) {
    mf_error e;
    if (run(g, node, in, out, kv, a, &e))
        die(g->nodes[node].name[0] ? g->nodes[node].name : mf_op_name(g->nodes[node].op), &e);
}

static int64_t count_nan(const float *v, int64_t n) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        k += isnan(v[i]) || isinf(v[i]);
    return k;
}

static double rel_err(const float *out, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)out[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* max |a - b| / max |b|: the fused path against the old one */
static double rel_err_f(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - (double)b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return den > 0 ? num / den : num;
}

/* A variant loop's comparison with its first variant: variant 0's output y
 * becomes *y0 (the caller frees it after the loop); a later variant's is
 * checked against it within 1e-5 (max norm) as "<name><suffix>" and freed. */
static void check_vs_first(char *name, size_t cap, const char *suffix, int variant, float *y, float **y0,
                           int64_t n) {
    if (variant == 0) {
        *y0 = y;
        return;
    }
    strncat(name, suffix, cap - strlen(name) - 1);
    result(name, rel_err_f(y, *y0, n), 1e-5, count_nan(y, n), NULL);
    free(y);
}

static mf_exec_args args(int64_t n_past, int64_t nt, int32_t n_ctx, uint32_t kv_type) {
    return (mf_exec_args){.n_past = (int32_t)n_past, .n_tokens = (int32_t)nt, .n_ctx = n_ctx,
                          .kv_type = kv_type};
}

/* ---- random weights ------------------------------------------------------------------ */

/* Byte offsets of the f16 scale fields in one block, -1 terminated. */
static void half_fields(uint32_t t, int off[3]) {
    off[0] = off[1] = off[2] = -1;
    switch (t) {
    case MF_TYPE_Q4_0: off[0] = offsetof(mf_block_q4_0, d); break;
    case MF_TYPE_Q4_1: off[0] = offsetof(mf_block_q4_1, d); off[1] = offsetof(mf_block_q4_1, m); break;
    case MF_TYPE_Q5_0: off[0] = offsetof(mf_block_q5_0, d); break;
    case MF_TYPE_Q5_1: off[0] = offsetof(mf_block_q5_1, d); off[1] = offsetof(mf_block_q5_1, m); break;
    case MF_TYPE_Q8_0: off[0] = offsetof(mf_block_q8_0, d); break;
    case MF_TYPE_Q2_K: off[0] = offsetof(mf_block_q2_K, d); off[1] = offsetof(mf_block_q2_K, dmin); break;
    case MF_TYPE_Q3_K: off[0] = offsetof(mf_block_q3_K, d); break;
    case MF_TYPE_Q4_K: off[0] = offsetof(mf_block_q4_K, d); off[1] = offsetof(mf_block_q4_K, dmin); break;
    case MF_TYPE_Q5_K: off[0] = offsetof(mf_block_q5_K, d); off[1] = offsetof(mf_block_q5_K, dmin); break;
    case MF_TYPE_Q6_K: off[0] = offsetof(mf_block_q6_K, d); break;
    default: break;
    }
}

/* Adds weight `name` of type t, rows of n_in, n_out rows, random contents. */
static void add_weight(const char *name, uint32_t t, int64_t n_in, int64_t n_out) {
    if (mf_weights_find(W, name))
        return;
    const size_t rb = mf_type_row_size(t, n_in), nb = rb * (size_t)n_out;
    uint8_t *p = malloc(nb + 8);
    if (t == MF_TYPE_F32 || t == MF_TYPE_F16 || t == MF_TYPE_BF16) {
        for (int64_t i = 0; i < n_in * n_out; i++) {
            float f = frand();
            if (t == MF_TYPE_F32)
                ((float *)p)[i] = f;
            else if (t == MF_TYPE_F16)
                ((uint16_t *)p)[i] = mf_fp32_to_fp16(f);
            else
                ((uint16_t *)p)[i] = mf_fp32_to_bf16(f);
        }
    } else {
        for (size_t i = 0; i < nb; i += 8) {
            uint64_t r = next_u64();
            memcpy(p + i, &r, nb - i < 8 ? nb - i : 8);
        }
        const mf_type_traits *tr = mf_type_get(t);
        int off[3];
        half_fields(t, off);
        const size_t nblk = nb / tr->type_size;
        for (size_t b = 0; b < nblk; b++)
            for (int k = 0; k < 3 && off[k] >= 0; k++) {
                float v = (0.002f + 0.01f * fabsf(frand())) * (frand() < 0 ? -1.0f : 1.0f);
                uint16_t h = mf_fp32_to_fp16(v);
                memcpy(p + b * tr->type_size + (size_t)off[k], &h, 2);
            }
    }
    mf_weight wt = {.name = name, .type = t, .n_dims = 2, .ne = {n_in, n_out, 1, 1}, .nbytes = nb};
    mf_error e;
    if (mf_weights_add_owned(W, &wt, p, &e))
        die("weights", &e);
}

static void add_f32(const char *name, int64_t n, float scale, float offset) {
    if (mf_weights_find(W, name))
        return;
    float *p = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++)
        p[i] = offset + scale * frand();
    mf_weight wt = {.name = name, .type = MF_TYPE_F32, .n_dims = 1, .ne = {n, 1, 1, 1}, .nbytes = (uint64_t)n * 4};
    mf_error e;
    if (mf_weights_add_owned(W, &wt, p, &e))
        die("weights", &e);
}

/* Row r of weight `name` as doubles (the reference's view of it). */
static double *ref_row(const char *name, int64_t r, double *dst) {
    const mf_weight *wt = mf_weights_find(W, name);
    const size_t rb = mf_type_row_size(wt->type, wt->ne[0]);
    float *tmp = malloc((size_t)wt->ne[0] * 4);
    mf_dequantize_rows(wt->type, (const uint8_t *)wt->data + rb * (size_t)r, tmp, 1, wt->ne[0]);
    for (int64_t i = 0; i < wt->ne[0]; i++)
        dst[i] = tmp[i];
    free(tmp);
    return dst;
}

static const float *wf32(const char *name) {
    return mf_weights_find(W, name)->data;
}

/* ---- graph helpers ------------------------------------------------------------------- */

static void graph_new(mf_graph *g, int32_t n_layers, int64_t kv_dim) {
    mf_graph_init(g);
    g->n_layers = n_layers;
    g->kv_dim = kv_dim;
}

static int32_t ext(mf_graph *g, int64_t ne0, int64_t ne1) {
    return mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, ne0, ne1);
}

/* ---- matmul -------------------------------------------------------------------------- */

static const uint32_t all_types[] = {MF_TYPE_F32, MF_TYPE_F16, MF_TYPE_BF16, MF_TYPE_Q4_0, MF_TYPE_Q4_1,
                                     MF_TYPE_Q5_0, MF_TYPE_Q5_1, MF_TYPE_Q8_0, MF_TYPE_Q2_K, MF_TYPE_Q3_K,
                                     MF_TYPE_Q4_K, MF_TYPE_Q5_K, MF_TYPE_Q6_K};
#define N_TYPES (int)(sizeof all_types / sizeof all_types[0])

static bool kq(uint32_t t) {
    return t >= MF_TYPE_Q2_K && t <= MF_TYPE_Q6_K;
}

static bool is_float_type(uint32_t t) {
    return t == MF_TYPE_F32 || t == MF_TYPE_F16 || t == MF_TYPE_BF16;
}

/* Whether a matmul of weight type t at nt tokens runs the int8 GEMV under
 * matmul mode `mode` (0 auto, -2 forced). */
static bool q8_tier(uint32_t t, int64_t nt, int mode) {
    return !is_float_type(t) && nt <= 8 && (mode == -2 || (mode == 0 && !getenv("MINFER_CUDA_NO_Q8")));
}

typedef struct mm_spec {
    uint32_t type;
    int64_t n_in, n_out;
    bool bias;
} mm_spec;

static void mm_name(char *buf, size_t n, const mm_spec *s) {
    snprintf(buf, n, "mm.%s.%lldx%lld", mf_type_name(s->type), (long long)s->n_in, (long long)s->n_out);
}

/* One matmul node at nt tokens; mode: 0 auto, 2 TC GEMM, 1 GEMM, -1 f32 GEMV,
 * -2 int8 GEMV. */
static void test_matmul(const mm_spec *s, int64_t nt, int mode) {
    char wn[64], bn[64] = "", name[96];
    mm_name(wn, sizeof wn, s);
    if (s->bias)
        snprintf(bn, sizeof bn, "bias.%lld", (long long)s->n_out);
    snprintf(name, sizeof name, "matmul %-5s %5lldx%-6lld nt %-3lld %s%s", mf_type_name(s->type),
             (long long)s->n_in, (long long)s->n_out, (long long)nt,
             mode == 2 ? "tc" : mode > 0 ? "gemm" : mode == -2 ? "gemv-q8" : mode < 0 ? "gemv" : "auto",
             s->bias ? " +bias" : "");
    mf_graph g;
    graph_new(&g, 0, 0);
    int32_t xi = ext(&g, s->n_in, nt);
    int32_t mi = mf_g_matmul(&g, xi, wn, s->type, s->bias ? bn : NULL, s->n_in, s->n_out);
    mf_g_set_name(&g, mi, "%s", wn);
    float *x = rand_vec(s->n_in * nt, 1.0f);
    int32_t in = dev_put(x, (size_t)(s->n_in * nt) * 4);
    int32_t out = dev_poison((size_t)(s->n_out * nt) * 4);
    mf_exec_args a = args(0, nt, 1, MF_TYPE_F32);
    mf_cuda_set_matmul_mode(be, mode);
    run_ok(&g, mi, &in, out, (mf_kv_pair){-1, -1}, &a);
    mf_cuda_set_matmul_mode(be, 0);
    float *y = dev_get(out, (size_t)(s->n_out * nt) * 4);
    const int64_t n_nan = count_nan(y, s->n_out * nt);

    /* sampled rows: first, last, and random ones */
    enum { NS = 40 };
    int64_t rows[NS];
    for (int i = 0; i < NS; i++)
        rows[i] = i == 0 ? 0 : i == 1 ? s->n_out - 1 : (int64_t)(next_u64() % (uint64_t)s->n_out);
    double *wr = malloc((size_t)s->n_in * sizeof *wr);
    double *ref = malloc((size_t)(NS * nt) * sizeof *ref);
    float *got = malloc((size_t)(NS * nt) * sizeof *got);
    for (int i = 0; i < NS; i++) {
        ref_row(wn, rows[i], wr);
        const double b = s->bias ? wf32(bn)[rows[i]] : 0.0;
        for (int64_t t = 0; t < nt; t++) {
            double acc = 0;
            const float *xt = x + t * s->n_in;
            for (int64_t k = 0; k < s->n_in; k++)
                acc += wr[k] * xt[k];
            ref[i * nt + t] = acc + b;
            got[i * nt + t] = y[t * s->n_out + rows[i]];
        }
    }
    /* the tensor-core tier (auto picks it above 8 tokens) rounds both
     * operands to f16: its own tolerance */
    const bool tc = mode == 2 || (mode == 0 && nt > 8 && !getenv("MINFER_CUDA_NO_TC"));
    const bool q8 = q8_tier(s->type, nt, mode);
    result(name, rel_err(got, ref, NS * nt), q8 ? 1e-2 : tc ? 3e-3 : 1e-3, n_nan, q8 ? "(int8 tier)" : NULL);
    if (q8) {
        /* the int8 rounding bound per sampled output, and the f32-activation
         * GEMV (the reference tier) on the same input */
        double worst = 0;
        for (int i = 0; i < NS; i++) {
            ref_row(wn, rows[i], wr);
            for (int64_t t = 0; t < nt; t++) {
                const float *xt = x + t * s->n_in;
                double bound = 1e-6, mag = 0;
                for (int64_t u = 0; u < s->n_in / 32; u++) {
                    double amax = 0, wabs = 0;
                    for (int l = 0; l < 32; l++) {
                        amax = fmax(amax, fabs(xt[32 * u + l]));
                        wabs += fabs(wr[32 * u + l]);
                        mag += fabs(wr[32 * u + l] * xt[32 * u + l]);
                    }
                    bound += amax / 254.0 * wabs;
                }
                bound += 1e-5 * mag;
                worst = fmax(worst, fabs((double)got[i * nt + t] - ref[i * nt + t]) / bound);
            }
        }
        char bn2[140], detail[64];
        snprintf(bn2, sizeof bn2, "%s: int8 bound", name);
        snprintf(detail, sizeof detail, "worst |err| / bound %.3f", worst);
        check_true(bn2, worst <= 1.0, detail);
        int32_t out2 = dev_poison((size_t)(s->n_out * nt) * 4);
        mf_cuda_set_matmul_mode(be, -1);
        run_ok(&g, mi, &in, out2, (mf_kv_pair){-1, -1}, &a);
        mf_cuda_set_matmul_mode(be, 0);
        float *y2 = dev_get(out2, (size_t)(s->n_out * nt) * 4);
        double *y2d = malloc((size_t)(s->n_out * nt) * sizeof *y2d);
        for (int64_t i = 0; i < s->n_out * nt; i++)
            y2d[i] = y2[i];
        snprintf(bn2, sizeof bn2, "%s: vs f32 gemv", name);
        result(bn2, rel_err(y, y2d, s->n_out * nt), 1e-2, count_nan(y2, s->n_out * nt), NULL);
        free(y2);
        free(y2d);
        dev_free(out2);
    }
    free(wr);
    free(ref);
    free(got);
    free(x);
    free(y);
    dev_free(in);
    dev_free(out);
    mf_graph_free(&g);
}

/* ---- getrows --------------------------------------------------------------------------- */

static void test_getrows(uint32_t t, int64_t n, int64_t n_rows, int64_t nt) {
    char wn[64], name[96];
    mm_spec s = {t, n, n_rows, false};
    mm_name(wn, sizeof wn, &s);
    snprintf(name, sizeof name, "getrows %-5s %5lld of %lld rows, nt %lld", mf_type_name(t), (long long)n,
             (long long)n_rows, (long long)nt);
    mf_graph g;
    graph_new(&g, 0, 0);
    int32_t ti = mf_g_input(&g, MF_INPUT_TOKENS, MF_DTYPE_I32, nt, 1);
    int32_t gi = mf_g_embed(&g, ti, wn, t, n);
    int32_t *ids = malloc((size_t)nt * 4);
    for (int64_t i = 0; i < nt; i++)
        ids[i] = i == 0 ? 0 : i == 1 ? (int32_t)(n_rows - 1) : (int32_t)(next_u64() % (uint64_t)n_rows);
    int32_t in = dev_put(ids, (size_t)nt * 4);
    int32_t out = dev_poison((size_t)(n * nt) * 4);
    mf_exec_args a = args(0, nt, 1, MF_TYPE_F32);
    run_ok(&g, gi, &in, out, (mf_kv_pair){-1, -1}, &a);
    float *y = dev_get(out, (size_t)(n * nt) * 4);
    double *ref = malloc((size_t)(n * nt) * sizeof *ref);
    for (int64_t i = 0; i < nt; i++)
        ref_row(wn, ids[i], ref + i * n);
    result(name, rel_err(y, ref, n * nt), 1e-6, count_nan(y, n * nt), NULL);

    /* an id past the table: NaN row plus an error at synchronize, and the
     * backend stays usable */
    if (nt > 2) {
        ids[2] = (int32_t)n_rows;
        mf_error e;
        be->ops->write_host(be, in, 0, ids, (size_t)nt * 4, &e);
        int rc = run(&g, gi, &in, out, (mf_kv_pair){-1, -1}, &a, &e);
        char msg[120];
        snprintf(msg, sizeof msg, "(%s)", rc ? e.msg : "no error");
        check_true("getrows: token id past the table is an error", rc != 0 && strstr(e.msg, "token id"),
                   msg);
        ids[2] = 1;
        be->ops->write_host(be, in, 0, ids, (size_t)nt * 4, &e);
        check_true("getrows: backend usable after a fault", run(&g, gi, &in, out, (mf_kv_pair){-1, -1}, &a, &e) == 0,
                   NULL);
    }
    free(ids);
    free(y);
    free(ref);
    dev_free(in);
    dev_free(out);
    mf_graph_free(&g);
}

/* ---- norms, rope, elementwise, softmax, copies -------------------------------------------- */

static void ref_rmsnorm(const float *x, const float *w, double *y, int64_t n, int64_t rows, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < n; i++)
            ss += (double)x[r * n + i] * x[r * n + i];
        double sc = 1.0 / sqrt(ss / (double)n + eps);
        for (int64_t i = 0; i < n; i++)
            y[r * n + i] = x[r * n + i] * sc * (w ? w[i] : 1.0);
    }
}

static void test_norm(int64_t width, int64_t nt, int32_t head_dim, bool inplace) {
    char name[96], wn[64];
    const int64_t n = head_dim ? head_dim : width;
    snprintf(wn, sizeof wn, "norm.%lld", (long long)n);
    snprintf(name, sizeof name, "%s width %lld nt %lld%s", head_dim ? "qknorm" : "rmsnorm",
             (long long)width, (long long)nt, inplace ? " in-place" : "");
    mf_graph g;
    graph_new(&g, 0, 0);
    int32_t xi = ext(&g, width, nt);
    int32_t ni = head_dim ? mf_g_qknorm(&g, xi, wn, head_dim, 1e-6f) : mf_g_rmsnorm(&g, xi, wn, 1e-5f);
    float *x = rand_vec(width * nt, 3.0f);
    int32_t in = dev_put(x, (size_t)(width * nt) * 4);
    int32_t out = inplace ? in : dev_poison((size_t)(width * nt) * 4);
    mf_exec_args a = args(0, nt, 1, MF_TYPE_F32);
    run_ok(&g, ni, &in, out, (mf_kv_pair){-1, -1}, &a);
    float *y = dev_get(out, (size_t)(width * nt) * 4);
    double *ref = malloc((size_t)(width * nt) * sizeof *ref);
    ref_rmsnorm(x, wf32(wn), ref, n, width * nt / n, head_dim ? 1e-6f : 1e-5f);
    result(name, rel_err(y, ref, width * nt), 1e-5, count_nan(y, width * nt), NULL);
    free(x);
    free(y);
    free(ref);
    dev_free(in);
    if (!inplace)
        dev_free(out);
    mf_graph_free(&g);
}

static void ref_rope(const float *x, double *y, int64_t nt, const mf_rope_meta *r, const int32_t *pos) {
    const int half = r->n_rot / 2;
    for (int64_t t = 0; t < nt; t++)
        for (int h = 0; h < r->n_head; h++) {
            const float *v = x + (t * r->n_head + h) * r->head_dim;
            double *o = y + (t * r->n_head + h) * r->head_dim;
            for (int d = 0; d < r->head_dim; d++)
                o[d] = v[d];
            for (int i = 0; i < half; i++) {
                double ang = pos[t] * (double)r->freq_scale * pow((double)r->theta, -2.0 * i / r->n_rot);
                int i0 = r->mode == MF_ROPE_NEOX ? i : 2 * i, i1 = r->mode == MF_ROPE_NEOX ? i + half : 2 * i + 1;
                o[i0] = v[i0] * cos(ang) - v[i1] * sin(ang);
                o[i1] = v[i0] * sin(ang) + v[i1] * cos(ang);
            }
        }
}

static void test_rope(int mode, int32_t n_head, int32_t hd, int32_t n_rot, int64_t nt, float fs) {
    char name[96];
    snprintf(name, sizeof name, "rope %s heads %d hd %d n_rot %d nt %lld fs %.2f",
             mode == MF_ROPE_NEOX ? "neox" : "normal", n_head, hd, n_rot, (long long)nt, fs);
    mf_rope_meta r = {.n_head = n_head, .head_dim = hd, .n_rot = n_rot, .mode = mode, .theta = 1000000.0f,
                      .freq_scale = fs};
    const int64_t w = (int64_t)n_head * hd;
    mf_graph g;
    graph_new(&g, 0, 0);
    int32_t xi = ext(&g, w, nt);
    int32_t pi = mf_g_input(&g, MF_INPUT_POSITIONS, MF_DTYPE_I32, nt, 1);
    int32_t ri = mf_g_rope(&g, xi, pi, &r);
    float *x = rand_vec(w * nt, 2.0f);
    int32_t *pos = malloc((size_t)nt * 4);
    for (int64_t t = 0; t < nt; t++)
        pos[t] = (int32_t)(next_u64() % 32768);
    int32_t ids[2] = {dev_put(x, (size_t)(w * nt) * 4), dev_put(pos, (size_t)nt * 4)};
    int32_t out = dev_poison((size_t)(w * nt) * 4);
    mf_exec_args a = args(0, nt, 1, MF_TYPE_F32);
    run_ok(&g, ri, ids, out, (mf_kv_pair){-1, -1}, &a);
    float *y = dev_get(out, (size_t)(w * nt) * 4);
    double *ref = malloc((size_t)(w * nt) * sizeof *ref);
    ref_rope(x, ref, nt, &r, pos);
    result(name, rel_err(y, ref, w * nt), 1e-5, count_nan(y, w * nt), NULL);
    free(x);
    free(pos);
    free(y);
    free(ref);
    dev_free(ids[0]);
    dev_free(ids[1]);
    dev_free(out);
    mf_graph_free(&g);
}

static void test_elementwise(int64_t width, int64_t nt) {
    const int64_t n = width * nt;
    const mf_op ops[] = {MF_OP_ADD, MF_OP_MUL, MF_OP_MUL, MF_OP_SCALE, MF_OP_SILU, MF_OP_SWIGLU, MF_OP_SOFTMAX};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        const bool bcast = k == 2;
        mf_graph g;
        graph_new(&g, 0, 0);
        int32_t ai = ext(&g, width, nt), bi = ext(&g, width, bcast ? 1 : nt), node = -1;
        switch (ops[k]) {
        case MF_OP_ADD: node = mf_g_add(&g, ai, bi); break;
        case MF_OP_MUL: node = mf_g_mul(&g, ai, bi); break;
        case MF_OP_SCALE: node = mf_g_scale(&g, ai, 0.37f); break;
        case MF_OP_SILU: node = mf_g_silu(&g, ai); break;
        case MF_OP_SWIGLU: node = mf_g_swiglu(&g, ai, bi); break;
        default: node = mf_g_softmax(&g, ai, 0.7f); break;
        }
        const int64_t bn = bcast ? width : n;
        float *a = rand_vec(n, 4.0f), *b = rand_vec(bn, 2.0f);
        int32_t ids[2] = {dev_put(a, (size_t)n * 4), dev_put(b, (size_t)bn * 4)};
        int32_t out = dev_poison((size_t)n * 4);
        mf_exec_args ea = args(0, nt, 1, MF_TYPE_F32);
        run_ok(&g, node, ids, out, (mf_kv_pair){-1, -1}, &ea);
        float *y = dev_get(out, (size_t)n * 4);
        double *ref = malloc((size_t)n * sizeof *ref);
        for (int64_t i = 0; i < n; i++) {
            double x = a[i], yb = b[bcast ? i % width : i];
            switch (ops[k]) {
            case MF_OP_ADD: ref[i] = x + yb; break;
            case MF_OP_MUL: ref[i] = x * yb; break;
            case MF_OP_SCALE: ref[i] = x * 0.37f; break;
            case MF_OP_SILU: ref[i] = x / (1 + exp(-x)); break;
            case MF_OP_SWIGLU: ref[i] = x / (1 + exp(-x)) * yb; break;
            default: ref[i] = 0; break;
            }
        }
        if (ops[k] == MF_OP_SOFTMAX)
            for (int64_t r = 0; r < nt; r++) {
                double mx = -INFINITY, sum = 0;
                for (int64_t i = 0; i < width; i++)
                    mx = fmax(mx, a[r * width + i] * (double)0.7f);
                for (int64_t i = 0; i < width; i++)
                    sum += ref[r * width + i] = exp(a[r * width + i] * (double)0.7f - mx);
                for (int64_t i = 0; i < width; i++)
                    ref[r * width + i] /= sum;
            }
        char name[96];
        snprintf(name, sizeof name, "%s%s %lldx%lld", mf_op_name(ops[k]), bcast ? " (row broadcast)" : "",
                 (long long)width, (long long)nt);
        result(name, rel_err(y, ref, n), 1e-5, count_nan(y, n), NULL);
        free(a);
        free(b);
        free(y);
        free(ref);
        dev_free(ids[0]);
        dev_free(ids[1]);
        dev_free(out);
        mf_graph_free(&g);
    }
}

/* VIEW, PERMUTE, RESHAPE (copy to another buffer), row select. */
static void test_copies(void) {
    const int64_t w = 3584, nt = 7;
    float *x = rand_vec(w * nt, 1.0f);
    int32_t in = dev_put(x, (size_t)(w * nt) * 4);
    mf_exec_args a = args(0, nt, 1, MF_TYPE_F32);
    for (int k = 0; k < 4; k++) {
        mf_graph g;
        graph_new(&g, 0, 0);
        int32_t xi = ext(&g, w, nt), node;
        const char *nm;
        if (k == 0) {
            node = mf_g_view(&g, xi, 896, 512);
            nm = "view cols [896, 1408) of 3584x7";
        } else if (k == 1) {
            node = mf_g_permute(&g, xi, (int32_t[]){1, 0, 2, 3});
            nm = "permute (1,0,2,3) of 3584x7";
        } else if (k == 2) {
            node = mf_g_reshape(&g, xi, 128, w * nt / 128);
            nm = "reshape 3584x7 -> 128x196 (copy)";
        } else {
            node = mf_g_rows(&g, xi, 3, 4);
            nm = "row select [3, 7) of 3584x7";
        }
        const int64_t n = mf_node_nelem(&g.nodes[node]);
        int32_t out = dev_poison((size_t)n * 4);
        run_ok(&g, node, &in, out, (mf_kv_pair){-1, -1}, &a);
        float *y = dev_get(out, (size_t)n * 4);
        double *ref = malloc((size_t)n * sizeof *ref);
        for (int64_t i = 0; i < n; i++) {
            if (k == 0)
                ref[i] = x[(i / 512) * w + 896 + i % 512];
            else if (k == 1)
                ref[i] = x[(i % nt) * w + i / nt];
            else if (k == 2)
                ref[i] = x[i];
            else
                ref[i] = x[3 * w + i];
        }
        result(nm, rel_err(y, ref, n), 0.0, count_nan(y, n), NULL);
        free(y);
        free(ref);
        dev_free(out);
        mf_graph_free(&g);
    }
    free(x);
    dev_free(in);
}

/* ---- KV cache and attention ------------------------------------------------------------------ */

/* What a cache of kv_type holds for rows of src: the host quantize/dequantize. */
static void kv_roundtrip(uint32_t kv_type, const float *src, float *dst, int64_t rows, int64_t kv_dim) {
    if (kv_type == MF_TYPE_F32) {
        memcpy(dst, src, (size_t)(rows * kv_dim) * 4);
        return;
    }
    void *q = malloc(mf_type_row_size(kv_type, kv_dim) * (size_t)rows);
    mf_quantize_rows(kv_type, src, q, rows, kv_dim);
    mf_dequantize_rows(kv_type, q, dst, rows, kv_dim);
    free(q);
}

typedef struct attn_spec {
    int32_t n_head, n_head_kv, hd;
    int64_t n_past, nt;
    uint32_t kv_type;
} attn_spec;

/* Stores random K/V rows [0, n_past + nt) with KVCACHE_STORE nodes, loads
 * them back (KVCACHE_LOAD), then runs ATTN for nt tokens at n_past. */
static void test_attention(const attn_spec *s) {
    const int64_t kvd = (int64_t)s->n_head_kv * s->hd, qd = (int64_t)s->n_head * s->hd;
    const int64_t n_kv = s->n_past + s->nt;
    const int32_t n_ctx = (int32_t)(n_kv + 16);
    const size_t region = mf_type_row_size(s->kv_type, kvd) * (size_t)n_ctx;
    mf_kv_pair kv = {dev_put(NULL, region), dev_put(NULL, region)};
    mf_graph g;
    graph_new(&g, 1, kvd);
    int32_t ki = ext(&g, kvd, n_kv), vi = ext(&g, kvd, n_kv);
    int32_t st = mf_g_kv_store(&g, ki, vi, 0);
    int32_t ld = mf_g_kv_load(&g, st, 0, 0, n_kv);
    int32_t qi = ext(&g, qd, s->nt);
    mf_attn_meta am = {.layer = 0, .n_head = s->n_head, .n_head_kv = s->n_head_kv, .head_dim = s->hd,
                       .scale = 1.0f / sqrtf((float)s->hd)};
    int32_t at = mf_g_attn(&g, qi, st, &am);
    float *k = rand_vec(kvd * n_kv, 2.0f), *v = rand_vec(kvd * n_kv, 1.0f), *q = rand_vec(qd * s->nt, 2.0f);
    int32_t ids[2] = {dev_put(k, (size_t)(kvd * n_kv) * 4), dev_put(v, (size_t)(kvd * n_kv) * 4)};
    mf_exec_args a0 = args(0, n_kv, n_ctx, s->kv_type);
    run_ok(&g, st, ids, -1, kv, &a0);

    /* the cache as the kernels see it */
    float *kc = malloc((size_t)(kvd * n_kv) * 4), *vc = malloc((size_t)(kvd * n_kv) * 4);
    kv_roundtrip(s->kv_type, k, kc, n_kv, kvd);
    kv_roundtrip(s->kv_type, v, vc, n_kv, kvd);
    char name[120];
    {
        int32_t out = dev_poison((size_t)(kvd * n_kv) * 4);
        run_ok(&g, ld, &st, out, kv, &a0);
        float *y = dev_get(out, (size_t)(kvd * n_kv) * 4);
        double *ref = malloc((size_t)(kvd * n_kv) * sizeof *ref);
        for (int64_t i = 0; i < kvd * n_kv; i++)
            ref[i] = kc[i];
        snprintf(name, sizeof name, "kv store+load %-4s kv_dim %lld rows %lld", mf_type_name(s->kv_type),
                 (long long)kvd, (long long)n_kv);
        result(name, rel_err(y, ref, kvd * n_kv), s->kv_type == MF_TYPE_Q8_0 ? 1e-3 : 1e-6,
               count_nan(y, kvd * n_kv), NULL);
        free(y);
        free(ref);
        dev_free(out);
    }

    int32_t qid = dev_put(q, (size_t)(qd * s->nt) * 4);
    int32_t out = dev_poison((size_t)(qd * s->nt) * 4);
    mf_exec_args a = args(s->n_past, s->nt, n_ctx, s->kv_type);
    run_ok(&g, at, (int32_t[]){qid, -1}, out, kv, &a);
    float *y = dev_get(out, (size_t)(qd * s->nt) * 4);
    double *ref = malloc((size_t)(qd * s->nt) * sizeof *ref);
    double *sc = malloc((size_t)n_kv * sizeof *sc);
    const int group = s->n_head / s->n_head_kv;
    for (int64_t t = 0; t < s->nt; t++)
        for (int h = 0; h < s->n_head; h++) {
            const float *qv = q + (t * s->n_head + h) * s->hd;
            const int64_t e0 = (int64_t)(h / group) * s->hd, nr = s->n_past + t + 1;
            double mx = -INFINITY, sum = 0;
            for (int64_t r = 0; r < nr; r++) {
                double d = 0;
                for (int i = 0; i < s->hd; i++)
                    d += (double)qv[i] * kc[r * kvd + e0 + i];
                sc[r] = d * am.scale;
                mx = fmax(mx, sc[r]);
            }
            for (int64_t r = 0; r < nr; r++)
                sum += sc[r] = exp(sc[r] - mx);
            for (int i = 0; i < s->hd; i++) {
                double o = 0;
                for (int64_t r = 0; r < nr; r++)
                    o += sc[r] * vc[r * kvd + e0 + i];
                ref[(t * s->n_head + h) * s->hd + i] = o / sum;
            }
        }
    snprintf(name, sizeof name, "attn %-4s heads %d/%d hd %d n_past %lld nt %lld", mf_type_name(s->kv_type),
             s->n_head, s->n_head_kv, s->hd, (long long)s->n_past, (long long)s->nt);
    result(name, rel_err(y, ref, qd * s->nt), 1e-4, count_nan(y, qd * s->nt), NULL);

    /* the flash-prefill kernel (MINFER_CUDA_FLASH_PREFILL) through the test
     * hook, into a poisoned buffer and in place over q, against the same
     * reference and against the default kernel */
    for (int inplace = 0; s->hd <= 128 && s->nt > 8 && inplace < 2; inplace++) {
        int32_t qf = inplace ? dev_put(q, (size_t)(qd * s->nt) * 4) : qid;
        int32_t of = inplace ? qf : dev_poison((size_t)(qd * s->nt) * 4);
        mf_cuda_set_flash(be, true);
        run_ok(&g, at, (int32_t[]){qf, -1}, of, kv, &a);
        mf_cuda_set_flash(be, false);
        float *yf = dev_get(of, (size_t)(qd * s->nt) * 4);
        char fname[160];
        snprintf(fname, sizeof fname, "%s [flash%s]", name, inplace ? " in-place" : "");
        result(fname, rel_err(yf, ref, qd * s->nt), 1e-4, count_nan(yf, qd * s->nt), NULL);
        strncat(fname, " vs default", sizeof fname - strlen(fname) - 1);
        result(fname, rel_err_f(yf, y, qd * s->nt), 1e-5, count_nan(yf, qd * s->nt), NULL);
        free(yf);
        dev_free(of);
    }

    /* out-of-bounds refusal: n_past + nt past n_ctx is an error before launch */
    if (s->nt == 1) {
        mf_exec_args bad = args(n_ctx, 1, n_ctx, s->kv_type);
        mf_error e;
        int rc = run(&g, at, (int32_t[]){qid, -1}, out, kv, &bad, &e);
        char msg[200];
        snprintf(msg, sizeof msg, "(%.150s)", rc ? e.msg : "no error");
        check_true("attn past n_ctx is refused before launch", rc != 0 && strstr(e.msg, "n_ctx"), msg);
    }
    free(k);
    free(v);
    free(q);
    free(kc);
    free(vc);
    free(y);
    free(ref);
    free(sc);
    dev_free(ids[0]);
    dev_free(ids[1]);
    dev_free(qid);
    dev_free(out);
    dev_free(kv.k);
    dev_free(kv.v);
    mf_graph_free(&g);
}

/* ---- fused nodes ----------------------------------------------------------------------------- */

typedef struct qkv_spec {
    uint32_t type;
    int64_t d;
    int32_t n_head, n_head_kv, hd;
    bool bias, norm;
    int mode;
    uint32_t vtype; /* 0: type; else V's own type (Q4_K_M keeps V in Q6_K) */
} qkv_spec;

static uint32_t qkv_vtype(const qkv_spec *s) {
    return s->vtype ? s->vtype : s->type;
}

static void qkv_names(const qkv_spec *s, char names[6][64]) {
    const int64_t qd = (int64_t)s->n_head * s->hd, kvd = (int64_t)s->n_head_kv * s->hd;
    mm_spec q = {s->type, s->d, qd, false}, k = {s->type, s->d, kvd, false};
    mm_name(names[0], 64, &q);
    mm_name(names[1], 64, &k);
    char kn[64];
    memcpy(kn, names[1], sizeof kn);
    if (s->vtype)
        snprintf(names[2], 64, "%s.v.%s", kn, mf_type_name(s->vtype));
    else
        snprintf(names[2], 64, "%s.v", kn);
    snprintf(names[3], 64, "bias.%lld", (long long)qd);
    snprintf(names[4], 64, "bias.%lld", (long long)kvd);
    snprintf(names[5], 64, "norm.%d", s->hd);
}

static void qkv_weights(const qkv_spec *s) {
    char nm[6][64];
    qkv_names(s, nm);
    const int64_t qd = (int64_t)s->n_head * s->hd, kvd = (int64_t)s->n_head_kv * s->hd;
    add_weight(nm[0], s->type, s->d, qd);
    add_weight(nm[1], s->type, s->d, kvd);
    add_weight(nm[2], qkv_vtype(s), s->d, kvd);
    add_f32(nm[3], qd, 0.5f, 0.0f);
    add_f32(nm[4], kvd, 0.5f, 0.0f);
    add_f32(nm[5], s->hd, 0.5f, 1.0f);
}

static void ref_matmul(const char *wn, const float *x, int64_t n_in, int64_t n_out, int64_t nt,
                       const char *bias, double *y) {
    double *wr = malloc((size_t)n_in * sizeof *wr);
    for (int64_t o = 0; o < n_out; o++) {
        ref_row(wn, o, wr);
        for (int64_t t = 0; t < nt; t++) {
            double acc = 0;
            for (int64_t k = 0; k < n_in; k++)
                acc += wr[k] * x[t * n_in + k];
            y[t * n_out + o] = acc + (bias ? wf32(bias)[o] : 0.0);
        }
    }
    free(wr);
}

/* FUSED_QKV / FUSED_QKV_NORM (epilogue=false) or QKV_BIAS_ROPE_STORE on
 * separate matmul outputs (epilogue=true): checks the roped Q output and the
 * K/V rows stored at n_past. */
static void test_qkv(const qkv_spec *s, int64_t nt, int64_t n_past, bool epilogue, uint32_t kvt) {
    char nm[6][64];
    qkv_names(s, nm);
    const int64_t qd = (int64_t)s->n_head * s->hd, kvd = (int64_t)s->n_head_kv * s->hd;
    const int32_t n_ctx = (int32_t)(n_past + nt + 8);
    mf_rope_meta rq = {.n_head = s->n_head, .head_dim = s->hd, .n_rot = s->hd, .mode = s->mode,
                       .theta = 10000.0f, .freq_scale = 1.0f};
    mf_rope_meta rk = rq;
    rk.n_head = s->n_head_kv;
    mf_qkv_meta m = {.layer = 0,
                     .q = {.weight = nm[0], .wtype = s->type, .bias = s->bias ? nm[3] : NULL, .n_in = s->d, .n_out = qd},
                     .k = {.weight = nm[1], .wtype = s->type, .bias = s->bias ? nm[4] : NULL, .n_in = s->d, .n_out = kvd},
                     .v = {.weight = nm[2], .wtype = qkv_vtype(s), .bias = s->bias ? nm[4] : NULL, .n_in = s->d, .n_out = kvd},
                     .q_norm = s->norm ? nm[5] : NULL, .k_norm = s->norm ? nm[5] : NULL, .norm_eps = 1e-6f,
                     .rope_q = rq, .rope_k = rk, .n_head = s->n_head, .n_head_kv = s->n_head_kv, .head_dim = s->hd};
    mf_graph g;
    graph_new(&g, 1, kvd);
    float *x = rand_vec(s->d * nt, 1.0f);
    int32_t *pos = malloc((size_t)nt * 4);
    for (int64_t t = 0; t < nt; t++)
        pos[t] = (int32_t)(n_past + t);
    /* reference: projections (+bias), norms, rope */
    double *rq_ = malloc((size_t)(qd * nt) * sizeof(double)), *rk_ = malloc((size_t)(kvd * nt) * sizeof(double)),
           *rv_ = malloc((size_t)(kvd * nt) * sizeof(double));
    ref_matmul(nm[0], x, s->d, qd, nt, m.q.bias, rq_);
    ref_matmul(nm[1], x, s->d, kvd, nt, m.k.bias, rk_);
    ref_matmul(nm[2], x, s->d, kvd, nt, m.v.bias, rv_);
    int32_t node, ids[4], n_ids;
    float *pq = NULL, *pk = NULL, *pv = NULL;
    if (!epilogue) {
        int32_t xi = ext(&g, s->d, nt);
        int32_t pi = mf_g_input(&g, MF_INPUT_POSITIONS, MF_DTYPE_I32, nt, 1);
        node = mf_g_fused_qkv(&g, xi, pi, &m);
        ids[0] = dev_put(x, (size_t)(s->d * nt) * 4);
        ids[1] = dev_put(pos, (size_t)nt * 4);
        n_ids = 2;
    } else {
        /* the epilogue takes the matmul outputs without bias */
        pq = malloc((size_t)(qd * nt) * 4);
        pk = malloc((size_t)(kvd * nt) * 4);
        pv = malloc((size_t)(kvd * nt) * 4);
        for (int64_t i = 0; i < qd * nt; i++)
            pq[i] = (float)(rq_[i] - (m.q.bias ? wf32(m.q.bias)[i % qd] : 0.0));
        for (int64_t i = 0; i < kvd * nt; i++) {
            pk[i] = (float)(rk_[i] - (m.k.bias ? wf32(m.k.bias)[i % kvd] : 0.0));
            pv[i] = (float)(rv_[i] - (m.v.bias ? wf32(m.v.bias)[i % kvd] : 0.0));
        }
        int32_t a = ext(&g, qd, nt), b = ext(&g, kvd, nt), c = ext(&g, kvd, nt);
        int32_t pi = mf_g_input(&g, MF_INPUT_POSITIONS, MF_DTYPE_I32, nt, 1);
        node = mf_g_node(&g, MF_OP_QKV_BIAS_ROPE_STORE, MF_DTYPE_F32, qd, nt, (int32_t[]){a, b, c, pi}, 4);
        g.nodes[node].meta.qkv = m;
        g.nodes[node].layer = 0;
        ids[0] = dev_put(pq, (size_t)(qd * nt) * 4);
        ids[1] = dev_put(pk, (size_t)(kvd * nt) * 4);
        ids[2] = dev_put(pv, (size_t)(kvd * nt) * 4);
        ids[3] = dev_put(pos, (size_t)nt * 4);
        n_ids = 4;
    }
    if (s->norm) {
        const float *nw = wf32(nm[5]);
        for (int64_t r = 0; r < nt * s->n_head; r++) {
            double ss = 0;
            for (int i = 0; i < s->hd; i++)
                ss += rq_[r * s->hd + i] * rq_[r * s->hd + i];
            double sc = 1.0 / sqrt(ss / s->hd + 1e-6f);
            for (int i = 0; i < s->hd; i++)
                rq_[r * s->hd + i] *= sc * nw[i];
        }
        for (int64_t r = 0; r < nt * s->n_head_kv; r++) {
            double ss = 0;
            for (int i = 0; i < s->hd; i++)
                ss += rk_[r * s->hd + i] * rk_[r * s->hd + i];
            double sc = 1.0 / sqrt(ss / s->hd + 1e-6f);
            for (int i = 0; i < s->hd; i++)
                rk_[r * s->hd + i] *= sc * nw[i];
        }
    }
    /* rope on the double values (through float copies: the reference rope takes floats) */
    float *tq = malloc((size_t)(qd * nt) * 4), *tk = malloc((size_t)(kvd * nt) * 4);
    for (int64_t i = 0; i < qd * nt; i++)
        tq[i] = (float)rq_[i];
    for (int64_t i = 0; i < kvd * nt; i++)
        tk[i] = (float)rk_[i];
    ref_rope(tq, rq_, nt, &rq, pos);
    ref_rope(tk, rk_, nt, &rk, pos);

    /* Variants through the test hooks: 0 the default path, 1 the fused int8
     * GEMV (MINFER_CUDA_FUSE_GEMV; matmul inputs on the int8 tier only), 2
     * the one-launch rope + KV store (MINFER_CUDA_FUSE_ROPE), 3 both. Each is
     * checked against the float64 reference (K/V rows decoded from the
     * cache; its rounding widens the tolerance) and against variant 0 (the
     * rope/store fusion should be bitwise equal, the GEMV fusion within f32
     * summation-order noise; cache rounding may flip one step either way).
     * Outputs and caches start poisoned. */
    const size_t kvrb = mf_type_row_size(kvt, kvd), region = kvrb * (size_t)n_ctx;
    const bool fusable = !epilogue && q8_tier(s->type, nt, 0) && q8_tier(qkv_vtype(s), nt, 0);
    const double ctol = kvt == MF_TYPE_F32 ? 0 : kvt == MF_TYPE_F16 ? 2e-3 : 2e-2; /* cache rounding */
    float *y0 = NULL, *kr0 = NULL, *vr0 = NULL;
    for (int fv = 0; fv < 4; fv++) {
        const bool fg = fv & 1, fr = fv & 2;
        if (fg && !fusable)
            continue;
        mf_kv_pair kv = {dev_poison(region), dev_poison(region)};
        int32_t out = dev_poison((size_t)(qd * nt) * 4);
        mf_exec_args a = args(n_past, nt, n_ctx, kvt);
        mf_cuda_set_fuse(be, fg);
        mf_cuda_set_gemv_v2(be, fg); /* Q4_K weights: the paired-unit kernel inside the fused GEMV */
        mf_cuda_set_fuse_rope(be, fr);
        run_ok(&g, node, ids, out, kv, &a);
        mf_cuda_set_fuse(be, false);
        mf_cuda_set_gemv_v2(be, false);
        mf_cuda_set_fuse_rope(be, false);
        float *y = dev_get(out, (size_t)(qd * nt) * 4);
        uint8_t *kraw = malloc(region), *vraw = malloc(region);
        mf_error e;
        if (be->ops->read_host(be, kv.k, 0, kraw, region, &e) || be->ops->read_host(be, kv.v, 0, vraw, region, &e))
            die("read kv", &e);
        float *kr = malloc((size_t)(kvd * nt) * 4), *vr = malloc((size_t)(kvd * nt) * 4);
        mf_dequantize_rows(kvt, kraw + n_past * kvrb, kr, nt, kvd);
        mf_dequantize_rows(kvt, vraw + n_past * kvrb, vr, nt, kvd);
        free(kraw); free(vraw);
        char name[160];
        snprintf(name, sizeof name, "%s%s%s %-5s%s d %lld heads %d/%d hd %d nt %lld%s %s: q",
                 epilogue ? "qkv_bias_rope_store" : s->norm ? "fused_qkv_norm" : "fused_qkv",
                 fg ? (s->type == MF_TYPE_Q4_K ? "[fuse+v2]" : "[fuse]") : "", fr ? "[rope1]" : "", mf_type_name(s->type), s->vtype ? "+v" : "",
                 (long long)s->d, s->n_head, s->n_head_kv, s->hd, (long long)nt, s->bias ? " +bias" : "",
                 mf_type_name(kvt));
        const double mtol = !epilogue && q8_tier(s->type, nt, 0) ? 1e-2 : 1e-3; /* int8 activations */
        result(name, rel_err(y, rq_, qd * nt), mtol, count_nan(y, qd * nt), NULL);
        name[strlen(name) - 1] = 'k';
        result(name, rel_err(kr, rk_, kvd * nt), mtol + ctol, count_nan(kr, kvd * nt), NULL);
        name[strlen(name) - 1] = 'v';
        result(name, rel_err(vr, rv_, kvd * nt), mtol + ctol, count_nan(vr, kvd * nt), NULL);
        if (fv == 0) {
            y0 = y; kr0 = kr; vr0 = vr;
        } else {
            name[strlen(name) - 1] = 'q';
            strncat(name, " vs default", sizeof name - strlen(name) - 1);
            const double vtol = (fg ? 1e-5 : 1e-6) + ctol / 2;
            result(name, rel_err_f(y, y0, qd * nt), fg ? 1e-5 : 1e-6, count_nan(y, qd * nt), NULL);
            result(name, rel_err_f(kr, kr0, kvd * nt), vtol, count_nan(kr, kvd * nt), "(k)");
            result(name, rel_err_f(vr, vr0, kvd * nt), vtol, count_nan(vr, kvd * nt), "(v)");
            if (!fg)
                printf("%-58s %s\n", name,
                       memcmp(y, y0, (size_t)(qd * nt) * 4) || memcmp(kr, kr0, (size_t)(kvd * nt) * 4) ||
                               memcmp(vr, vr0, (size_t)(kvd * nt) * 4)
                           ? "note: not bitwise equal (FMA contraction differs?)"
                           : "bitwise equal");
            free(y); free(kr); free(vr);
        }
        dev_free(out);
        dev_free(kv.k);
        dev_free(kv.v);
    }
    for (int i = 0; i < n_ids; i++)
        dev_free(ids[i]);
    free(x); free(pos); free(rq_); free(rk_); free(rv_); free(tq); free(tk);
    free(pq); free(pk); free(pv); free(y0); free(kr0); free(vr0);
    mf_graph_free(&g);
}

/* up's weight name: gate's + ".up" (+ ".<type>" when up has its own type) */
static void ffn_up_name(char *un, size_t n, const char *gn, uint32_t t, uint32_t ut) {
    if (ut == t)
        snprintf(un, n, "%s.up", gn);
    else
        snprintf(un, n, "%s.up.%s", gn, mf_type_name(ut));
}

/* FUSED_FFN with gate of type t and up of type ut. Variant 0 is the default
 * path; variant 1 (int8 tier only) the fused GEMV of MINFER_CUDA_FUSE_GEMV
 * through the test hook (one launch with the SwiGLU epilogue when t == ut),
 * checked against the reference and against variant 0. */
static void test_ffn(uint32_t t, uint32_t ut, int64_t d, int64_t ff, int64_t nt) {
    char gn[64], un[80], name[140];
    mm_spec sg = {t, d, ff, false};
    mm_name(gn, sizeof gn, &sg);
    ffn_up_name(un, sizeof un, gn, t, ut);
    mf_ffn_meta m = {.gate = {.weight = gn, .wtype = t, .n_in = d, .n_out = ff},
                     .up = {.weight = un, .wtype = ut, .n_in = d, .n_out = ff}};
    mf_graph g;
    graph_new(&g, 0, 0);
    int32_t xi = ext(&g, d, nt);
    int32_t node = mf_g_fused_ffn(&g, xi, &m);
    float *x = rand_vec(d * nt, 1.0f);
    double *rg = malloc((size_t)(ff * nt) * sizeof *rg), *ru = malloc((size_t)(ff * nt) * sizeof *ru);
    ref_matmul(gn, x, d, ff, nt, NULL, rg);
    ref_matmul(un, x, d, ff, nt, NULL, ru);
    for (int64_t i = 0; i < ff * nt; i++)
        rg[i] = rg[i] / (1 + exp(-rg[i])) * ru[i];
    /* the output aliases the input when the sizes allow (liveness reuse) */
    const bool alias = ff == d;
    const bool q8 = q8_tier(t, nt, 0) && q8_tier(ut, nt, 0);
    float *y0 = NULL;
    for (int fv = 0; fv < (q8 ? 2 : 1); fv++) {
        int32_t in = dev_put(x, (size_t)(d * nt) * 4);
        int32_t out = alias ? in : dev_poison((size_t)(ff * nt) * 4);
        mf_exec_args a = args(0, nt, 1, MF_TYPE_F32);
        mf_cuda_set_fuse(be, fv == 1);
        run_ok(&g, node, &in, out, (mf_kv_pair){-1, -1}, &a);
        mf_cuda_set_fuse(be, false);
        float *y = dev_get(out, (size_t)(ff * nt) * 4);
        snprintf(name, sizeof name, "fused_ffn%s %-5s%s%s %lld -> %lld nt %lld%s", fv ? "[fuse]" : "",
                 mf_type_name(t), ut != t ? "/" : "", ut != t ? mf_type_name(ut) : "", (long long)d,
                 (long long)ff, (long long)nt, alias ? " in-place" : "");
        result(name, rel_err(y, rg, ff * nt), q8 ? 1e-2 : 1e-3, count_nan(y, ff * nt), NULL);
        check_vs_first(name, sizeof name, " vs unfused", fv, y, &y0, ff * nt);
        dev_free(in);
        if (!alias)
            dev_free(out);
    }
    free(x); free(y0); free(rg); free(ru);
    mf_graph_free(&g);
}

/* ---- refusals ---------------------------------------------------------------------------------- */

/* ---- paired-unit Q4_K GEMV (MINFER_CUDA_GEMV_V2) ---------------------------------------------- */

/* One Q4_K matmul node at a decode token count, default path vs the
 * paired-unit kernel (test hook), both against float64 and each other. */
static void test_gemv_v2(int64_t n_in, int64_t n_out, int64_t nt) {
    char wn[64], name[140];
    mm_spec ms = {MF_TYPE_Q4_K, n_in, n_out, false};
    mm_name(wn, sizeof wn, &ms);
    float *x = rand_vec(n_in * nt, 1.0f);
    double *ref = malloc((size_t)(n_out * nt) * sizeof *ref);
    ref_matmul(wn, x, n_in, n_out, nt, NULL, ref);
    mf_graph g;
    graph_new(&g, 0, 0);
    int32_t xi = ext(&g, n_in, nt);
    int32_t mi = mf_g_matmul(&g, xi, wn, MF_TYPE_Q4_K, NULL, n_in, n_out);
    int32_t in = dev_put(x, (size_t)(n_in * nt) * 4);
    float *y0 = NULL;
    for (int v = 0; v < 2; v++) {
        int32_t out = dev_poison((size_t)(n_out * nt) * 4);
        mf_exec_args a = args(0, nt, 1, MF_TYPE_F32);
        mf_cuda_set_gemv_v2(be, v == 1);
        run_ok(&g, mi, &in, out, (mf_kv_pair){-1, -1}, &a);
        mf_cuda_set_gemv_v2(be, false);
        float *y = dev_get(out, (size_t)(n_out * nt) * 4);
        snprintf(name, sizeof name, "gemv_v2[%s] q4_K %lldx%lld nt %lld", v ? "on" : "off", (long long)n_in,
                 (long long)n_out, (long long)nt);
        result(name, rel_err(y, ref, n_out * nt), q8_tier(MF_TYPE_Q4_K, nt, 0) ? 1e-2 : 1e-3,
               count_nan(y, n_out * nt), NULL);
        check_vs_first(name, sizeof name, " vs off", v, y, &y0, n_out * nt);
        dev_free(out);
    }
    dev_free(in);
    free(x); free(ref); free(y0);
    mf_graph_free(&g);
}

/* ---- RMSNORM folded into the next fused node (MINFER_CUDA_FUSE_NORM) ------------------------- */

/* RMSNORM(x) -> FUSED_FFN executed back to back through the test hook.
 * Variants: 0 hook off; 1 hook on (the norm is not launched, the FFN
 * quantizes the normed input itself); 2 hook on with a second reader of the
 * norm output (must not fold: the norm output is checked); 3 hook on with a
 * synchronize between (the deferred norm is flushed, its output checked).
 * Against the float64 reference and, 1-3, against variant 0. */
static void test_fuse_norm(uint32_t t, uint32_t ut, int64_t d, int64_t ff, int64_t nt) {
    char gn[64], un[80], wn[64], name[160];
    mm_spec sg = {t, d, ff, false};
    mm_name(gn, sizeof gn, &sg);
    ffn_up_name(un, sizeof un, gn, t, ut);
    snprintf(wn, sizeof wn, "norm.%lld", (long long)d);
    mf_ffn_meta m = {.gate = {.weight = gn, .wtype = t, .n_in = d, .n_out = ff},
                     .up = {.weight = un, .wtype = ut, .n_in = d, .n_out = ff}};
    const float eps = 1e-5f;
    float *x = rand_vec(d * nt, 3.0f);
    double *rn = malloc((size_t)(d * nt) * sizeof *rn);
    ref_rmsnorm(x, wf32(wn), rn, d, nt, eps);
    float *xn = malloc((size_t)(d * nt) * 4);
    for (int64_t i = 0; i < d * nt; i++)
        xn[i] = (float)rn[i];
    double *rg = malloc((size_t)(ff * nt) * sizeof *rg), *ru = malloc((size_t)(ff * nt) * sizeof *ru);
    ref_matmul(gn, xn, d, ff, nt, NULL, rg);
    ref_matmul(un, xn, d, ff, nt, NULL, ru);
    for (int64_t i = 0; i < ff * nt; i++)
        rg[i] = rg[i] / (1 + exp(-rg[i])) * ru[i];
    const double tol = q8_tier(t, nt, 0) && q8_tier(ut, nt, 0) ? 1e-2 : 1e-3;
    float *y0 = NULL;
    for (int v = 0; v < 4; v++) {
        mf_graph g;
        graph_new(&g, 0, 0);
        int32_t xi = ext(&g, d, nt);
        int32_t ni = mf_g_rmsnorm(&g, xi, wn, eps);
        int32_t fi = mf_g_fused_ffn(&g, ni, &m);
        if (v == 2)
            mf_g_scale(&g, ni, 2.0f); /* a second reader of the norm output */
        int32_t xb = dev_put(x, (size_t)(d * nt) * 4), nb = dev_poison((size_t)(d * nt) * 4);
        int32_t ob = dev_poison((size_t)(ff * nt) * 4);
        mf_exec_args a = args(0, nt, 1, MF_TYPE_F32);
        mf_error e;
        mf_cuda_set_fuse_norm(be, v > 0);
        if (be->ops->execute_node(be, &g, ni, &xb, nb, (mf_kv_pair){-1, -1}, &a, &e))
            die("fuse_norm rmsnorm", &e);
        if (v == 3 && be->ops->synchronize(be, &e))
            die("fuse_norm synchronize", &e);
        if (be->ops->execute_node(be, &g, fi, &nb, ob, (mf_kv_pair){-1, -1}, &a, &e) ||
            be->ops->synchronize(be, &e))
            die("fuse_norm ffn", &e);
        mf_cuda_set_fuse_norm(be, false);
        float *y = dev_get(ob, (size_t)(ff * nt) * 4);
        snprintf(name, sizeof name, "fuse_norm[%s] ffn %-5s%s%s %lld -> %lld nt %lld",
                 v == 0 ? "off" : v == 1 ? "on" : v == 2 ? "2 readers" : "flushed", mf_type_name(t),
                 ut != t ? "/" : "", ut != t ? mf_type_name(ut) : "", (long long)d, (long long)ff, (long long)nt);
        result(name, rel_err(y, rg, ff * nt), tol, count_nan(y, ff * nt), NULL);
        if (v >= 2) {
            float *yn = dev_get(nb, (size_t)(d * nt) * 4);
            result(name, rel_err(yn, rn, d * nt), 1e-5, count_nan(yn, d * nt), "(norm output)");
            free(yn);
        }
        /* the fold quantizes x * sc * w computed in the same f32 order as
         * norm.cu; the GEMV may sum in another order, hence not bitwise */
        check_vs_first(name, sizeof name, " vs off", v, y, &y0, ff * nt);
        dev_free(xb);
        dev_free(nb);
        dev_free(ob);
        mf_graph_free(&g);
    }
    free(x); free(xn); free(rn); free(rg); free(ru); free(y0);
}

/* ---- MATMUL + residual ADD (MINFER_CUDA_FUSE_ADD) ------------------------------------------ */

/* h = r + W x as two nodes executed back to back (no synchronize between,
 * as the scheduler does), through the test hook. Variants: 0 hook off (the
 * default path); 1 hook on, ADD(r, mm), output in place over r (the
 * residual stream's buffer reuse); 2 hook on, ADD(mm, r); 3 hook on with a
 * second consumer of the matmul (must not fuse: the matmul output is
 * checked too); 4 hook on, a synchronize between the two calls (the
 * deferred matmul is flushed and then read back). Each against the float64
 * reference, 1-4 also against variant 0. Outputs poisoned. */
static void test_fuse_add(uint32_t t, int64_t n_in, int64_t n_out, int64_t nt) {
    char wn[64], name[140];
    mm_spec ms = {t, n_in, n_out, false};
    mm_name(wn, sizeof wn, &ms);
    float *x = rand_vec(n_in * nt, 1.0f), *r = rand_vec(n_out * nt, 1.0f);
    double *ref = malloc((size_t)(n_out * nt) * sizeof *ref), *refm = malloc((size_t)(n_out * nt) * sizeof *refm);
    ref_matmul(wn, x, n_in, n_out, nt, NULL, refm);
    for (int64_t i = 0; i < n_out * nt; i++)
        ref[i] = refm[i] + r[i];
    const double tol = q8_tier(t, nt, 0) ? 1e-2 : 1e-3;
    float *y0 = NULL;
    for (int v = 0; v < 5; v++) {
        mf_graph g;
        graph_new(&g, 0, 0);
        int32_t xi = ext(&g, n_in, nt), ri = ext(&g, n_out, nt);
        int32_t mi = mf_g_matmul(&g, xi, wn, t, NULL, n_in, n_out);
        int32_t ai = v == 2 ? mf_g_add(&g, mi, ri) : mf_g_add(&g, ri, mi);
        if (v == 3)
            mf_g_scale(&g, mi, 2.0f); /* a second reader of the matmul output */
        int32_t xb = dev_put(x, (size_t)(n_in * nt) * 4), rb = dev_put(r, (size_t)(n_out * nt) * 4);
        int32_t mb = dev_poison((size_t)(n_out * nt) * 4);
        int32_t ob = v == 1 ? rb : dev_poison((size_t)(n_out * nt) * 4);
        mf_exec_args a = args(0, nt, 1, MF_TYPE_F32);
        mf_error e;
        const int32_t ain[2] = {v == 2 ? mb : rb, v == 2 ? rb : mb};
        mf_cuda_set_fuse_add(be, v > 0);
        if (be->ops->execute_node(be, &g, mi, &xb, mb, (mf_kv_pair){-1, -1}, &a, &e))
            die("fuse_add matmul", &e);
        float *ym = NULL;
        if (v == 4) {
            if (be->ops->synchronize(be, &e))
                die("fuse_add synchronize", &e);
            ym = dev_get(mb, (size_t)(n_out * nt) * 4);
        }
        if (be->ops->execute_node(be, &g, ai, ain, ob, (mf_kv_pair){-1, -1}, &a, &e) ||
            be->ops->synchronize(be, &e))
            die("fuse_add add", &e);
        mf_cuda_set_fuse_add(be, false);
        float *y = dev_get(ob, (size_t)(n_out * nt) * 4);
        if (v == 3)
            ym = dev_get(mb, (size_t)(n_out * nt) * 4);
        snprintf(name, sizeof name, "fuse_add[%s] %-5s %lldx%lld nt %lld",
                 v == 0 ? "off" : v == 1 ? "in-place" : v == 2 ? "swapped" : v == 3 ? "2 readers" : "flushed",
                 mf_type_name(t), (long long)n_in, (long long)n_out, (long long)nt);
        result(name, rel_err(y, ref, n_out * nt), tol, count_nan(y, n_out * nt), NULL);
        if (ym)
            result(name, rel_err(ym, refm, n_out * nt), tol, count_nan(ym, n_out * nt), "(matmul output)");
        check_vs_first(name, sizeof name, " vs off", v, y, &y0, n_out * nt);
        free(ym);
        dev_free(xb);
        dev_free(rb);
        dev_free(mb);
        if (ob != rb)
            dev_free(ob);
        mf_graph_free(&g);
    }
    free(x); free(r); free(ref); free(refm); free(y0);
}

static void test_refusals(void) {
    mf_graph g;
    graph_new(&g, 0, 0);
    int32_t xi = ext(&g, 896, 1);
    int32_t a = mf_g_matmul(&g, xi, "no.such.weight", MF_TYPE_Q8_0, NULL, 896, 64);
    int32_t b = mf_g_matmul(&g, xi, "mm.q4_K.896x64", MF_TYPE_Q4_K, NULL, 896, 64);
    int32_t c = mf_g_matmul(&g, xi, "mm.q8_1", MF_TYPE_Q8_1, NULL, 896, 64);
    check_true("supports_op: K-quant with n_in 896 refused", !be->ops->supports_op(be, &g.nodes[b]), NULL);
    check_true("supports_op: q8_1 weights refused", !be->ops->supports_op(be, &g.nodes[c]), NULL);
    check_true("supports_op: q8_0 matmul accepted", be->ops->supports_op(be, &g.nodes[a]), NULL);
    check_true("has_weight: unknown name is false", !be->ops->has_weight(be, "no.such.weight"), NULL);
    float *x = rand_vec(896, 1.0f);
    int32_t in = dev_put(x, 896 * 4), out = dev_poison(64 * 4);
    mf_exec_args ea = args(0, 1, 1, MF_TYPE_F32);
    mf_error e;
    int rc = run(&g, a, &in, out, (mf_kv_pair){-1, -1}, &ea, &e);
    char msg[200];
    snprintf(msg, sizeof msg, "(%.150s)", rc ? e.msg : "no error");
    check_true("execute: missing weight is an error naming it", rc && strstr(e.msg, "no.such.weight"), msg);
    int32_t tiny = dev_put(x, 16);
    rc = run(&g, a, &tiny, out, (mf_kv_pair){-1, -1}, &ea, &e);
    snprintf(msg, sizeof msg, "(%.150s)", rc ? e.msg : "no error");
    check_true("execute: short input buffer refused before launch", rc && strstr(e.msg, "bytes"), msg);
    free(x);
    dev_free(in);
    dev_free(out);
    dev_free(tiny);
    mf_graph_free(&g);
}

/* The graph allocator frees ids during its build-time liveness walk, so at
 * execute time a "free" id may hold a live value: host copies must accept
 * it (the bench failure "write_host: buffer id 48 is not a live buffer"). An
 * id never allocated is still refused. */
static void test_pool(void) {
    float *x = rand_vec(1000, 1.0f);
    int32_t id = dev_put(NULL, 4000);
    dev_free(id);
    mf_error e;
    int rc = be->ops->write_host(be, id, 0, x, 4000, &e);
    float *y = rc ? NULL : dev_get(id, 4000);
    check_true("pool: write/read_host on an id freed at build time", !rc && y && !memcmp(x, y, 4000),
               rc ? e.msg : NULL);
    int32_t again = be->ops->alloc_buffer(be, 4000, &e); /* the free list hands it back */
    check_true("pool: freed id recycled by alloc_buffer", again == id, NULL);
    rc = be->ops->write_host(be, 1 << 30, 0, x, 4, &e);
    check_true("pool: unknown id refused by write_host", rc && strstr(e.msg, "not in the pool"),
               rc ? e.msg : "no error");
    dev_free(again);
    free(x);
    free(y);
}

/* ---- CUDA graph replay ------------------------------------------------------------------------ */

/* A decode-shaped forward (rmsnorm -> fused QKV with the K/V store at n_past
 * -> attention over the cache -> output matmul) run for 8 consecutive steps
 * through begin_forward / execute_node / end_forward, once with graph
 * capture/replay and once without, from identical caches and inputs: the
 * logits and the caches must be bit-identical, and the graph run must have
 * replayed (step 1 is seen, step 2 captured, the rest replayed; step 5 is
 * flushed by a synchronize between nodes, as the op profiler does). */
static void test_graph(void) {
    const qkv_spec qs = {MF_TYPE_Q8_0, 896, 14, 2, 64, true, false, MF_ROPE_NEOX, 0};
    char nm[6][64];
    qkv_names(&qs, nm);
    const int64_t d = qs.d, qd = 14 * 64, kvd = 2 * 64, n_out = small ? 96 : 1152;
    mm_spec os = {MF_TYPE_Q4_0, 896, n_out, false};
    char on[64];
    mm_name(on, sizeof on, &os);
    mf_rope_meta rq = {.n_head = qs.n_head, .head_dim = qs.hd, .n_rot = qs.hd, .mode = qs.mode,
                       .theta = 10000.0f, .freq_scale = 1.0f};
    mf_rope_meta rk = rq;
    rk.n_head = qs.n_head_kv;
    mf_qkv_meta m = {.layer = 0,
                     .q = {.weight = nm[0], .wtype = qs.type, .bias = nm[3], .n_in = d, .n_out = qd},
                     .k = {.weight = nm[1], .wtype = qs.type, .bias = nm[4], .n_in = d, .n_out = kvd},
                     .v = {.weight = nm[2], .wtype = qs.type, .bias = nm[4], .n_in = d, .n_out = kvd},
                     .rope_q = rq, .rope_k = rk, .n_head = qs.n_head, .n_head_kv = qs.n_head_kv,
                     .head_dim = qs.hd};
    mf_graph g;
    graph_new(&g, 1, kvd);
    const int32_t xi = ext(&g, d, 1);
    const int32_t pi = mf_g_input(&g, MF_INPUT_POSITIONS, MF_DTYPE_I32, 1, 1);
    const int32_t ni = mf_g_rmsnorm(&g, xi, "norm.896", 1e-6f);
    const int32_t qi = mf_g_fused_qkv(&g, ni, pi, &m);
    mf_attn_meta am = {.layer = 0, .n_head = qs.n_head, .n_head_kv = qs.n_head_kv, .head_dim = qs.hd,
                       .scale = 0.125f};
    const int32_t ai = mf_g_attn(&g, qi, qi, &am);
    const int32_t oi = mf_g_matmul(&g, ai, on, os.type, NULL, 896, n_out);
    /* output buffers per node (x and pos are inputs) */
    const int32_t bx = dev_put(NULL, (size_t)d * 4), bp = dev_put(NULL, 4);
    const int32_t bn = dev_put(NULL, (size_t)d * 4), bq = dev_put(NULL, (size_t)qd * 4);
    const int32_t ba = dev_put(NULL, (size_t)qd * 4), bo = dev_put(NULL, (size_t)n_out * 4);
    const int32_t nodes[4] = {ni, qi, ai, oi};
    const int32_t ins[4][2] = {{bx, -1}, {bn, bp}, {bq, -1}, {ba, -1}};
    const int32_t outs[4] = {bn, bq, ba, bo};

    enum { STEPS = 8, PAST0 = 10 };
    const int32_t n_ctx = 64;
    const size_t region = mf_type_row_size(MF_TYPE_F16, kvd) * (size_t)n_ctx;
    uint16_t *init = malloc(region);
    for (size_t i = 0; i < region / 2; i++)
        init[i] = mf_fp32_to_fp16(frand());
    float *xs = rand_vec(d * STEPS, 1.0f);
    float *logits[2], *caches[2];
    int64_t cap0, rep0, cap1, rep1;
    for (int run_i = 0; run_i < 2; run_i++) {
        mf_cuda_set_graphs(be, run_i == 0);
        if (run_i == 0)
            mf_cuda_graph_stats(be, &cap0, &rep0);
        mf_kv_pair kv = {dev_put(init, region), dev_put(init, region)};
        logits[run_i] = malloc((size_t)(n_out * STEPS) * 4);
        mf_error e;
        for (int st = 0; st < STEPS; st++) {
            const int32_t pos = PAST0 + st;
            mf_exec_args a = args(pos, 1, n_ctx, MF_TYPE_F16);
            if (be->ops->begin_forward(be, &g, &a, &e) ||
                be->ops->write_host(be, bx, 0, xs + st * d, (size_t)d * 4, &e) ||
                be->ops->write_host(be, bp, 0, &pos, 4, &e))
                die("graph test: begin/inputs", &e);
            for (int k = 0; k < 4; k++) {
                mf_kv_pair nkv = k == 1 || k == 2 ? kv : (mf_kv_pair){-1, -1};
                if (be->ops->execute_node(be, &g, nodes[k], ins[k], outs[k], nkv, &a, &e))
                    die("graph test: execute", &e);
                if (st == 4 && k == 1 && be->ops->synchronize(be, &e))
                    die("graph test: mid-forward synchronize", &e);
            }
            if (be->ops->end_forward(be, &g, &a, &e) || be->ops->synchronize(be, &e) ||
                be->ops->read_host(be, bo, 0, logits[run_i] + st * n_out, (size_t)n_out * 4, &e))
                die("graph test: end/read", &e);
        }
        caches[run_i] = malloc(2 * region);
        if (be->ops->read_host(be, kv.k, 0, caches[run_i], region, &e) ||
            be->ops->read_host(be, kv.v, 0, (uint8_t *)caches[run_i] + region, region, &e))
            die("graph test: read kv", &e);
        dev_free(kv.k);
        dev_free(kv.v);
        if (run_i == 0)
            mf_cuda_graph_stats(be, &cap1, &rep1);
    }
    mf_cuda_set_graphs(be, !mf_env_flag("MINFER_NO_CUDA_GRAPH"));
    char detail[120];
    snprintf(detail, sizeof detail, "%lld captures, %lld replays in %d steps", (long long)(cap1 - cap0),
             (long long)(rep1 - rep0), STEPS);
    check_true("cuda graph: decode steps replayed", cap1 - cap0 >= 1 && rep1 - rep0 >= STEPS - 3, detail);
    const bool same = memcmp(logits[0], logits[1], (size_t)(n_out * STEPS) * 4) == 0 &&
                      memcmp(caches[0], caches[1], 2 * region) == 0;
    check_true("cuda graph: logits and KV identical with and without replay", same, NULL);
    result("cuda graph: logits finite", 0.0, 0.0, count_nan(logits[0], n_out * STEPS), NULL);
    for (int i = 0; i < 2; i++) {
        free(logits[i]);
        free(caches[i]);
    }
    free(init);
    free(xs);
    const int32_t bufs[6] = {bx, bp, bn, bq, ba, bo};
    for (int i = 0; i < 6; i++)
        dev_free(bufs[i]);
    mf_graph_free(&g);
}

/* ---- main ---------------------------------------------------------------------------------- */

int main(void) {
    small = mf_env_flag("MINFER_CUDA_TEST_SMALL");
    only = getenv("MINFER_CUDA_TEST_ONLY");
    W = mf_weights_new();

    /* matmul specs at the real widths (896, 2560, 3584, 18944, vocab 151936) */
    mm_spec specs[64];
    int n_specs = 0;
    for (int i = 0; i < N_TYPES; i++) {
        const uint32_t t = all_types[i];
        specs[n_specs++] = (mm_spec){t, kq(t) ? 2560 : 896, small ? 96 : 1152, i % 3 == 0};
        if (!small)
            specs[n_specs++] = (mm_spec){t, 18944, 160, false};
    }
    const int n_type_specs = n_specs;
    if (!small) {
        specs[n_specs++] = (mm_spec){MF_TYPE_Q8_0, 896, 151936, false};
        specs[n_specs++] = (mm_spec){MF_TYPE_Q6_K, 2560, 151936, false};
        specs[n_specs++] = (mm_spec){MF_TYPE_F16, 896, 151936, false};
        specs[n_specs++] = (mm_spec){MF_TYPE_Q4_K, 3584, 18944, false};
    }
    for (int i = 0; i < n_specs; i++) {
        char wn[64];
        mm_name(wn, sizeof wn, &specs[i]);
        add_weight(wn, specs[i].type, specs[i].n_in, specs[i].n_out);
        char bn[64];
        snprintf(bn, sizeof bn, "bias.%lld", (long long)specs[i].n_out);
        add_f32(bn, specs[i].n_out, 0.5f, 0.0f);
    }
    /* getrows reads the first spec table of each type (same name, same shape) */
    add_f32("norm.896", 896, 0.5f, 1.0f);
    add_f32("norm.2560", 2560, 0.5f, 1.0f);
    add_f32("norm.3584", 3584, 0.5f, 1.0f);
    add_f32("norm.18944", 18944, 0.5f, 1.0f);
    add_f32("norm.128", 128, 0.5f, 1.0f);
    const qkv_spec qkvs[] = {
        {MF_TYPE_Q8_0, 896, 14, 2, 64, true, false, MF_ROPE_NEOX, 0},  /* qwen2 0.5B */
        {MF_TYPE_Q4_K, 2560, 32, 8, 128, false, true, MF_ROPE_NEOX, 0}, /* qwen3 4B */
        {MF_TYPE_Q5_0, 896, 14, 2, 64, false, false, MF_ROPE_NORMAL, 0}, /* llama-style */
        {MF_TYPE_Q4_K, 3584, 28, 4, 128, true, false, MF_ROPE_NEOX, MF_TYPE_Q6_K}, /* qwen2 7B Q4_K_M */
    };
    for (size_t i = 0; i < sizeof qkvs / sizeof qkvs[0]; i++)
        qkv_weights(&qkvs[i]);
    const uint32_t ffn_types[] = {MF_TYPE_Q4_0, MF_TYPE_Q6_K, MF_TYPE_BF16};
    for (size_t i = 0; i < sizeof ffn_types / sizeof ffn_types[0]; i++) {
        const uint32_t t = ffn_types[i];
        const int64_t d = kq(t) ? 2560 : 896, ff = small ? 256 : kq(t) ? 9728 : 4864;
        char gn[64], un[64];
        mm_spec sg = {t, d, ff, false};
        mm_name(gn, sizeof gn, &sg);
        snprintf(un, sizeof un, "%s.up", gn);
        add_weight(gn, t, d, ff);
        add_weight(un, t, d, ff);
        mm_spec sq = {t, d, d, false};
        mm_name(gn, sizeof gn, &sq);
        snprintf(un, sizeof un, "%s.up", gn);
        add_weight(gn, t, d, d);
        add_weight(un, t, d, d);
        if (t == MF_TYPE_Q4_0) { /* gate and up of different types: the fused path's two-launch arm */
            mm_spec sm = {t, d, ff, false};
            char um[80];
            mm_name(gn, sizeof gn, &sm);
            ffn_up_name(um, sizeof um, gn, t, MF_TYPE_Q8_0);
            add_weight(um, MF_TYPE_Q8_0, d, ff);
        }
    }

    mf_error e;
    if (mf_backend_cuda_new(W, &be, &e)) {
        printf("skip: no usable CUDA backend: %s\n", e.msg);
        mf_weights_free(W);
        return 77;
    }
    printf("device: %s%s\n", mf_cuda_device_desc(be), small ? " (small shapes)" : "");

    const int64_t nts[] = {1, 7, 64, 513};
    const int n_nts = small ? 3 : 4;
    for (int i = 0; fam("matmul") && i < n_type_specs; i++) {
        const bool wide = specs[i].n_in == 18944;
        for (int k = 0; k < n_nts; k++) {
            if (wide && nts[k] == 513)
                continue;
            test_matmul(&specs[i], nts[k], 0);
        }
        if (!is_float_type(specs[i].type)) { /* int8 GEMV forced, and the f32 reference tier */
            test_matmul(&specs[i], 3, -2);
            test_matmul(&specs[i], 1, -1);
        }
        if (!wide) { /* every kernel family at a token count another would pick */
            test_matmul(&specs[i], 7, 1);
            test_matmul(&specs[i], 7, 2);
            test_matmul(&specs[i], small ? 64 : 513, 1);
            test_matmul(&specs[i], small ? 64 : 513, -1);
        }
    }
    for (int i = n_type_specs; fam("matmul") && i < n_specs; i++) {
        test_matmul(&specs[i], 1, 0);
        test_matmul(&specs[i], specs[i].n_out == 18944 ? 64 : 7, 0);
    }

    for (int i = 0; fam("getrows") && i < N_TYPES; i++) {
        const uint32_t t = all_types[i];
        mm_spec s = {t, kq(t) ? 2560 : 896, small ? 96 : 1152, false};
        test_getrows(t, s.n_in, s.n_out, i == 0 ? 513 : 7);
    }

    if (fam("norm")) {
        const int64_t widths[] = {896, 3584, 18944};
        for (int i = 0; i < 3; i++)
            for (int k = 0; k < n_nts; k++)
                if (!(widths[i] == 18944 && nts[k] == 513))
                    test_norm(widths[i], nts[k], 0, k == 1);
        test_norm(1792, 7, 128, false);
        test_norm(4096, small ? 7 : 513, 128, true);
    }

    if (fam("rope")) {
        test_rope(MF_ROPE_NEOX, 14, 64, 64, 7, 1.0f);
        test_rope(MF_ROPE_NEOX, 32, 128, 128, small ? 7 : 513, 1.0f);
        test_rope(MF_ROPE_NORMAL, 32, 128, 128, 64, 0.25f);
        test_rope(MF_ROPE_NORMAL, 8, 128, 64, 7, 1.0f); /* partial rotation: dims >= n_rot pass */
    }

    if (fam("elementwise")) {
        test_elementwise(18944, 7);
        test_elementwise(896, small ? 7 : 513);
        test_copies();
    }

    const uint32_t kvt[] = {MF_TYPE_F32, MF_TYPE_F16, MF_TYPE_Q8_0};
    for (int i = 0; fam("attn") && i < 3; i++) {
        test_attention(&(attn_spec){14, 2, 64, 0, small ? 64 : 513, kvt[i]});
        test_attention(&(attn_spec){14, 2, 64, small ? 100 : 2000, 1, kvt[i]});
        test_attention(&(attn_spec){32, 8, 128, small ? 30 : 700, 7, kvt[i]});
        test_attention(&(attn_spec){28, 4, 128, 0, 64, kvt[i]});
        /* odd prefill counts after a past: the flash kernel's tail tiles */
        test_attention(&(attn_spec){14, 2, 64, 37, 45, kvt[i]});
        test_attention(&(attn_spec){28, 4, 128, 100, 17, kvt[i]});
    }
    if (fam("attn"))
        test_attention(&(attn_spec){8, 8, 256, 50, 3, MF_TYPE_F32}); /* widest head, no GQA */

    for (size_t i = 0; fam("qkv") && i < sizeof qkvs / sizeof qkvs[0]; i++) {
        test_qkv(&qkvs[i], 1, 37, false, MF_TYPE_F32);
        test_qkv(&qkvs[i], 7, 0, false, MF_TYPE_F32);
        test_qkv(&qkvs[i], 7, 11, true, MF_TYPE_F32);
        test_qkv(&qkvs[i], 3, 5, false, i % 2 ? MF_TYPE_F16 : MF_TYPE_Q8_0); /* the rope/store fusion's casts */
    }
    for (size_t i = 0; fam("ffn") && i < sizeof ffn_types / sizeof ffn_types[0]; i++) {
        const uint32_t t = ffn_types[i];
        const int64_t d = kq(t) ? 2560 : 896, ff = small ? 256 : kq(t) ? 9728 : 4864;
        test_ffn(t, t, d, ff, 1);
        test_ffn(t, t, d, ff, 7);
        test_ffn(t, t, d, d, 1);
        if (t == MF_TYPE_Q4_0) {
            test_ffn(t, MF_TYPE_Q8_0, d, ff, 1);
            test_ffn(t, MF_TYPE_Q8_0, d, ff, 5);
        }
    }
    if (fam("fuse_add")) {
        test_fuse_add(MF_TYPE_Q4_0, 896, 896, 1);   /* 0.5B attn_output */
        test_fuse_add(MF_TYPE_Q4_0, 896, 896, 7);
        test_fuse_add(MF_TYPE_Q4_K, 3584, 3584, 1); /* 7B attn_output */
        test_fuse_add(MF_TYPE_Q6_K, 2560, small ? 256 : 9728, 3);
        test_fuse_add(MF_TYPE_BF16, 896, 896, 1);   /* no int8 tier: never fuses */
    }
    if (fam("gemv_v2")) {
        test_gemv_v2(2560, small ? 96 : 1152, 1);
        test_gemv_v2(2560, small ? 96 : 1152, 8);
        test_gemv_v2(3584, 3584, 1);  /* 7B attn_q / attn_output */
        test_gemv_v2(3584, 3584, 5);
        if (!small) {
            test_gemv_v2(18944, 160, 1); /* long rows: ks 4, many pairs per lane */
            test_gemv_v2(3584, 18944, 1);
        }
    }
    if (fam("fuse_norm")) {
        const int64_t ff05 = small ? 256 : 4864;
        test_fuse_norm(MF_TYPE_Q4_0, MF_TYPE_Q4_0, 896, ff05, 1); /* 0.5B ffn_norm -> gate/up */
        test_fuse_norm(MF_TYPE_Q4_0, MF_TYPE_Q4_0, 896, ff05, 7);
        test_fuse_norm(MF_TYPE_Q4_0, MF_TYPE_Q8_0, 896, ff05, 3); /* two GEMV launches */
        test_fuse_norm(MF_TYPE_Q6_K, MF_TYPE_Q6_K, 2560, small ? 256 : 9728, 1);
    }
    if (fam("graph"))
        test_graph();
    if (fam("misc")) {
        test_refusals();
        test_pool();
    }

    mf_backend_free(be);
    mf_weights_free(W);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
