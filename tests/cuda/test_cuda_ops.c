/* test_cuda_ops.c - what is CUDA-specific about the CUDA backend: every
 * kernel family against a float64 host reference at the real model widths,
 * and the backend's own machinery (graph record / replay, the fusions it
 * plans over a split, launch ordering with and without programmatic
 * dependent launch, the fault word, the pinned logits path), through the
 * backend contract (execute_node / synchronize / read_host) or the kernel
 * launchers of cuda_args.h.
 *
 * Weights are random blocks (random quant bytes with sane random f16
 * scales), so every bit pattern of a format is exercised; the reference
 * dequantizes the rows it checks with the host reference dequantizer
 * (quant.c) and computes in double. Inputs are random (never zeros), every
 * output buffer is poisoned before the launch, and a case fails if any
 * output element stays NaN or ||out - ref|| / ||ref|| exceeds its
 * tolerance (1e-3 for f32-activation paths; 3e-3 for the tensor-core GEMM
 * tiers, which round both operands to f16; 1e-2 for the int8 decode GEMV,
 * which rounds the activations to int8 per 32 elements, and there every
 * sampled output must also lie within the rounding bound
 *   |y - y_ref| <= sum_units amax_unit(x) / 254 * sum_unit |w| (+ 1e-5 sum |w x|)
 * and agree with the f32-activation GEMV to 1e-2). Kernel choices that are
 * meant to give the same bits (fusions on / off, the mixed-type QKV, the
 * block-local FFN GEMV, the lm_head writing the pinned logits, PDL on /
 * off, graph replay vs plain launches) are checked bitwise. Every choice
 * is made through the tuning string (mf_cuda_retune, the keys of
 * cuda_tune.h), never a setter or the environment.
 *
 * Families (MINFER_CUDA_TEST_ONLY=a,b,... runs only these): matmul,
 * getrows, norm, rope, elementwise, attn, qkv, ffn, fuse_add, fuse_norm,
 * graph, misc, mma, mmafuse, decattn, preattn, gemv, q6k, attnone,
 * attnshort, shortrope, normmm, qkvmix, ffnq8b, zc. Each family's cases are
 * described above its code. MINFER_CUDA_TEST_SMALL=1: small shapes only
 * (compute-sanitizer runs). MINFER_CUDA_TUNE: the whole suite under another
 * tuning (gpu-check.sh's ops-nopdl runs pdl=0).
 *
 * Exit: 0 all passed, 1 a failure, 77 no usable CUDA device (ctest skips).
 * Timing loops are not here: the kernel benchmarks live in lab/cuda. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_args.h"
#include "backend/cuda/cuda_backend.h"
#include "quant/quant.h"

/* the backend's per-forward values, with the read-back hint (cuda_backend.h) */
#define mf_exec_args mf_cuda_args

/* ---- harness ----------------------------------------------------------------------- */

/* A test switch of this program's own (the library reads none outside the
 * runtime's lever table): set and not "", "0", "false", "off", "no". */
static bool mf_env_flag(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") && strcmp(v, "false") && strcmp(v, "off") && strcmp(v, "no");
}

static int n_pass, n_fail;
static bool small;
static mf_backend *be;

/* ---- the choices the cases flip, all through the tuning string ---------------------------- */

static mf_cuda_tune tune0; /* the tuning at creation (defaults + MINFER_CUDA_TUNE) */

static void tune(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void tune(const char *fmt, ...) {
    char s[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s, sizeof s, fmt, ap);
    va_end(ap);
    mf_error e;
    if (mf_cuda_retune(be, s, &e)) {
        fprintf(stderr, "FAIL tuning '%s': %s\n", s, e.msg);
        exit(1);
    }
}

/* The decode attention's three old switches, kept apart here so the cases
 * can flip one at a time; each flip writes the one attn_decode choice. */
static int tk_decode = 1, tk_one = -1, tk_short = -1;
static void tk_attn(void) {
    const bool one = tk_one != 0, shrt = tk_short != 0;
    tune("attn_decode=%s,attn_one_max=%lld", !tk_decode ? "block" : !one ? "split" : shrt ? "short" : "one",
         tk_one == 1 ? (long long)1 << 40 : (long long)tune0.attn_one_max);
}
static void t_flash_decode(mf_backend *b, bool on) { (void)b; tk_decode = on; tk_attn(); }
static void t_attn_one(mf_backend *b, int mode) { (void)b; tk_one = mode; tk_attn(); }
static void t_attn_short(mf_backend *b, int mode) { (void)b; tk_short = mode; tk_attn(); }

/* Prefill attention: the tensor-core kernel, the SIMT flash one, or neither. */
static int tk_tc = 1, tk_flash = 1;
static void tk_prefill(void) { tune("attn_prefill=%s", tk_tc ? "mma" : tk_flash ? "flash" : "simt"); }
static void t_tc_attn(mf_backend *b, bool on) { (void)b; tk_tc = on; tk_prefill(); }
static void t_flash(mf_backend *b, bool on) { (void)b; tk_flash = on; tk_prefill(); }

static void t_matmul_mode(mf_backend *b, int mode) { (void)b; tune("force=%d", mode); }
static void t_fuse(mf_backend *b, bool on) { (void)b; tune("fuse_gemv=%d", on); }
static void t_fuse_add(mf_backend *b, bool on) { (void)b; tune("fuse_add=%d", on); }
static void t_fuse_rope(mf_backend *b, bool on) { (void)b; tune("fuse_rope=%d", on); }
static void t_fuse_norm(mf_backend *b, bool on) { (void)b; tune("fuse_norm=%d", on); }
static void t_norm_mm(mf_backend *b, bool on) { (void)b; tune("norm_mm=%d", on); }
static void t_logits_zc(mf_backend *b, bool on) { (void)b; tune("zc=%d", on); }
static void t_short_rope(mf_backend *b, int mode) { (void)b; tune("short_rope=%d", mode < 0 ? tune0.short_rope : mode != 0); }
static void t_ffn_q8b(mf_backend *b, int mode) { (void)b; tune("ffn_q8b=%d", mode < 0 ? tune0.ffn_q8b : mode != 0); }
static void t_input_slots(mf_backend *b, int mode) { (void)b; tune("slots=%d", mode != 0); }
static void t_mma_fuse(mf_backend *b, int fuse, int split) { (void)b; tune("mma_fuse=%d,mma_split=%d", fuse != 0, split != 0); }
static void t_mma_chunk(mf_backend *b, uint64_t bytes) { (void)b; tune("mma_chunk=%llu", (unsigned long long)bytes); }
/* v1 (on) or v3 (off) everywhere, the v4 kernel off */
static void t_gemv_v1(mf_backend *b, bool on) { (void)b; tune("gemv=%s,v4=0", on ? "v1" : "v3"); }
static void t_gemv_v4(mf_backend *b, int u) {
    (void)b;
    if (u < 0)
        tune("v4=auto");
    else
        tune("v4=%d", u);
}
static void t_reset_gemv(mf_backend *b) {
    (void)b;
    tune("gemv=auto,v4=auto,qkv_mix=%d,ffn_q8b=%d", tune0.qkv_mix, tune0.ffn_q8b);
}
static void t_pdl(int on) { tune("pdl=%d", on != 0); }
static void t_attn_short_pf(int on) { tune("attn_pf=%d", on != 0); }
static void t_gemv_v4_big(int mib) { tune("v4_big=%d", mib); }
static void t_gemv_v4_early(int mode) {
    if (mode < 0 || mode > 1)
        tune("v4_early=auto");
    else
        tune("v4_early=%d", mode);
}
static void t_gemv_v4_q6k(int u) {
    if (u < 0 || u > 2)
        tune("v4_q6k=auto");
    else
        tune("v4_q6k=%d", u);
}
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

/* The stream of a test family, or false with the failure reported. */
static bool family_stream(const char *family, cudaStream_t *st) {
    if (cudaStreamCreate(st) == cudaSuccess)
        return true;
    char name[64];
    snprintf(name, sizeof name, "%s: stream", family);
    check_true(name, false, NULL);
    return false;
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
    if (mf_cuda_execute_node(be, g, node, in, out, kv, a, err))
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
    t_matmul_mode(be, mode);
    run_ok(&g, mi, &in, out, (mf_kv_pair){-1, -1}, &a);
    t_matmul_mode(be, 0);
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
        t_matmul_mode(be, -1);
        run_ok(&g, mi, &in, out2, (mf_kv_pair){-1, -1}, &a);
        t_matmul_mode(be, 0);
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
        t_flash(be, true);
        run_ok(&g, at, (int32_t[]){qf, -1}, of, kv, &a);
        t_flash(be, false);
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

/* The FUSED_QKV meta of spec s (rope over the whole head, theta 10000),
 * naming the weights in nm (qkv_names), which must outlive it. */
static mf_qkv_meta qkv_meta(const qkv_spec *s, char nm[6][64]) {
    qkv_names(s, nm);
    const int64_t qd = (int64_t)s->n_head * s->hd, kvd = (int64_t)s->n_head_kv * s->hd;
    mf_rope_meta rq = {.n_head = s->n_head, .head_dim = s->hd, .n_rot = s->hd, .mode = s->mode,
                       .theta = 10000.0f, .freq_scale = 1.0f};
    mf_rope_meta rk = rq;
    rk.n_head = s->n_head_kv;
    return (mf_qkv_meta){
        .layer = 0,
        .q = {.weight = nm[0], .wtype = s->type, .bias = s->bias ? nm[3] : NULL, .n_in = s->d, .n_out = qd},
        .k = {.weight = nm[1], .wtype = s->type, .bias = s->bias ? nm[4] : NULL, .n_in = s->d, .n_out = kvd},
        .v = {.weight = nm[2], .wtype = qkv_vtype(s), .bias = s->bias ? nm[4] : NULL, .n_in = s->d, .n_out = kvd},
        .q_norm = s->norm ? nm[5] : NULL, .k_norm = s->norm ? nm[5] : NULL, .norm_eps = 1e-6f,
        .rope_q = rq, .rope_k = rk, .n_head = s->n_head, .n_head_kv = s->n_head_kv, .head_dim = s->hd};
}

/* FUSED_QKV / FUSED_QKV_NORM (epilogue=false) or QKV_BIAS_ROPE_STORE on
 * separate matmul outputs (epilogue=true): checks the roped Q output and the
 * K/V rows stored at n_past. */
static void test_qkv(const qkv_spec *s, int64_t nt, int64_t n_past, bool epilogue, uint32_t kvt) {
    char nm[6][64];
    const mf_qkv_meta m = qkv_meta(s, nm);
    const int64_t qd = (int64_t)s->n_head * s->hd, kvd = (int64_t)s->n_head_kv * s->hd;
    const int32_t n_ctx = (int32_t)(n_past + nt + 8);
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
    ref_rope(tq, rq_, nt, &m.rope_q, pos);
    ref_rope(tk, rk_, nt, &m.rope_k, pos);

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
        t_fuse(be, fg);
        t_fuse_rope(be, fr);
        run_ok(&g, node, ids, out, kv, &a);
        t_fuse(be, false);
        t_fuse_rope(be, tune0.fuse_rope != 0);
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
        t_fuse(be, fv == 1);
        run_ok(&g, node, &in, out, (mf_kv_pair){-1, -1}, &a);
        t_fuse(be, false);
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
        t_fuse_norm(be, v > 0);
        if (mf_cuda_execute_node(be, &g, ni, &xb, nb, (mf_kv_pair){-1, -1}, &a, &e))
            die("fuse_norm rmsnorm", &e);
        if (v == 3 && be->ops->synchronize(be, &e))
            die("fuse_norm synchronize", &e);
        if (mf_cuda_execute_node(be, &g, fi, &nb, ob, (mf_kv_pair){-1, -1}, &a, &e) ||
            be->ops->synchronize(be, &e))
            die("fuse_norm ffn", &e);
        t_fuse_norm(be, tune0.fuse_norm != 0);
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
        t_fuse_add(be, v > 0);
        if (mf_cuda_execute_node(be, &g, mi, &xb, mb, (mf_kv_pair){-1, -1}, &a, &e))
            die("fuse_add matmul", &e);
        float *ym = NULL;
        if (v == 4) {
            if (be->ops->synchronize(be, &e))
                die("fuse_add synchronize", &e);
            ym = dev_get(mb, (size_t)(n_out * nt) * 4);
        }
        if (mf_cuda_execute_node(be, &g, ai, ain, ob, (mf_kv_pair){-1, -1}, &a, &e) ||
            be->ops->synchronize(be, &e))
            die("fuse_add add", &e);
        t_fuse_add(be, tune0.fuse_add != 0);
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
    check_true("supports_op: K-quant with n_in 896 refused", !mf_backend_supports_op(be, &g.nodes[b]), NULL);
    check_true("supports_op: q8_1 weights refused", !mf_backend_supports_op(be, &g.nodes[c]), NULL);
    check_true("supports_op: q8_0 matmul accepted", mf_backend_supports_op(be, &g.nodes[a]), NULL);
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
    /* run 0: graphs, the small inputs (pos, n_past) through the input
     * slots and their copy kernel; run 1: no graphs; run 2: graphs, slots
     * off; run 3: slots with a copy call each (x, 3.5 KB, is never a slot's);
     * run 4: as run 0, the graph stamped as an engine build (a stamp no
     * build reaches; its own, as the KV buffers are new) and each step's
     * calls through repeat_calls where it takes them */
    enum { RUNS = 5 };
    float *logits[RUNS], *caches[RUNS];
    int64_t cap0, rep0, cap1, rep1, slots[RUNS], rpt0 = mf_cuda_repeat_count(be), rpt_taken = 0;
    for (int run_i = 0; run_i < RUNS; run_i++) {
        mf_cuda_set_graphs(be, run_i != 1);
        t_input_slots(be, run_i == 0 || run_i == 4 ? 1 : run_i == 3 ? 2 : 0);
        g.stamp = run_i == 4 ? UINT64_MAX - 1 : 0;
        slots[run_i] = mf_cuda_slot_count(be);
        if (run_i == 0)
            mf_cuda_graph_stats(be, &cap0, &rep0);
        mf_kv_pair kv = {dev_put(init, region), dev_put(init, region)};
        logits[run_i] = malloc((size_t)(n_out * STEPS) * 4);
        mf_error e;
        for (int st = 0; st < STEPS; st++) {
            const int32_t pos = PAST0 + st;
            mf_exec_args a = args(pos, 1, n_ctx, MF_TYPE_F16);
            if (mf_cuda_begin_forward(be, &g, &a, &e) ||
                be->ops->write_host(be, bx, 0, xs + st * d, (size_t)d * 4, &e) ||
                be->ops->write_host(be, bp, 0, &pos, 4, &e))
                die("graph test: begin/inputs", &e);
            int took = 0;
            if (run_i == 4 && (took = mf_cuda_repeat_calls(be, &g, &a, &e)) < 0)
                die("graph test: repeat_calls", &e);
            rpt_taken += took;
            for (int k = 0; k < 4 && !took; k++) {
                mf_kv_pair nkv = k == 1 || k == 2 ? kv : (mf_kv_pair){-1, -1};
                if (mf_cuda_execute_node(be, &g, nodes[k], ins[k], outs[k], nkv, &a, &e))
                    die("graph test: execute", &e);
                if (st == 4 && k == 1 && be->ops->synchronize(be, &e))
                    die("graph test: mid-forward synchronize", &e);
            }
            if (mf_cuda_end_forward(be, &g, &a, &e) || be->ops->synchronize(be, &e) ||
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
        slots[run_i] = mf_cuda_slot_count(be) - slots[run_i];
    }
    mf_cuda_set_graphs(be, !false);
    t_input_slots(be, (int)tune0.slots);
    g.stamp = 0;
    char detail[120];
    snprintf(detail, sizeof detail, "%lld of %d steps through repeat_calls (count %lld)", (long long)rpt_taken,
             STEPS, (long long)(mf_cuda_repeat_count(be) - rpt0));
    check_true("cuda graph: repeat_calls takes the recorded build's calls (steps 1 ..)",
               rpt_taken >= STEPS - 1 && mf_cuda_repeat_count(be) - rpt0 == rpt_taken, detail);
    snprintf(detail, sizeof detail, "%lld captures, %lld replays in %d steps", (long long)(cap1 - cap0),
             (long long)(rep1 - rep0), STEPS);
    check_true("cuda graph: decode steps replayed", cap1 - cap0 >= 1 && rep1 - rep0 >= STEPS - 3, detail);
    /* every step put pos in a slot, and n_past once it was captured or replayed */
    snprintf(detail, sizeof detail, "slot writes: %lld / %lld / %lld / %lld", (long long)slots[0],
             (long long)slots[1], (long long)slots[2], (long long)slots[3]);
    check_true("cuda graph: pos and n_past through the input slots (switch on only)",
               slots[0] >= 2 * STEPS - 2 && slots[1] == 0 && slots[2] == 0 && slots[3] == slots[0], detail);
    static const char *const what[RUNS] = {NULL, "cuda graph: logits and KV identical with and without replay",
                                           "cuda graph: logits and KV identical with the input slots on and off",
                                           "cuda graph: logits and KV identical with the slots' kernel and copies",
                                           "cuda graph: logits and KV identical with the calls through repeat_calls"};
    for (int r = 1; r < RUNS; r++) {
        const bool same = memcmp(logits[0], logits[r], (size_t)(n_out * STEPS) * 4) == 0 &&
                          memcmp(caches[0], caches[r], 2 * region) == 0;
        check_true(what[r], same, NULL);
    }
    result("cuda graph: logits finite", 0.0, 0.0, count_nan(logits[0], n_out * STEPS), NULL);
    for (int i = 0; i < RUNS; i++) {
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

/* ---- mma prefill tier (family "mma") --------------------------------------------------------- */

/* The device's SMs, for the launchers the cases call directly (the
 * backend passes its own: mf_cuda_tune.sm_count). */
static int g_sms;

/* The GEMV choices the backend's tuning makes now (mf_cuda_retune moves
 * them), with the v4 mode v4, for the GEMV launchers the cases call
 * directly; g_occ: the occupancy table, measured once as the backend does. */
static mf_cu_gemv_occ g_occ;
static mf_cu_gemv_tune gt_of(int v4) {
    mf_cu_gemv_tune g = mf_cu_gemv_tune_of(mf_cuda_tuning(be), &g_occ);
    g.v4 = v4;
    return g;
}

/* One matmul node through `mode`, input x (host), output returned (host). */
static float *mma_run(const mf_graph *g, int32_t mi, const float *x, int64_t n_in, int64_t n_out, int64_t nt,
                      int mode) {
    int32_t in = dev_put(x, (size_t)(n_in * nt) * 4);
    int32_t out = dev_poison((size_t)(n_out * nt) * 4);
    mf_exec_args a = args(0, nt, 1, MF_TYPE_F32);
    t_matmul_mode(be, mode);
    run_ok(g, mi, &in, out, (mf_kv_pair){-1, -1}, &a);
    t_matmul_mode(be, 0);
    float *y = dev_get(out, (size_t)(n_out * nt) * 4);
    dev_free(in);
    dev_free(out);
    return y;
}

/* The mma tier (force_gemm 3) on weight spec s at nt tokens, f16 weight
 * chunks of `chunk` bytes (0: default): against float64 on 40 sampled rows
 * (all tokens; 3e-3, both operands rounded to f16), NaN-free everywhere, and
 * within 1e-4 (max norm) of the wmma TC tier, which rounds the same operands
 * the same way and differs only in the summation order. */
static void test_mma(const mm_spec *s, int64_t nt, uint64_t chunk) {
    char wn[64], bn[64] = "", name[140];
    mm_name(wn, sizeof wn, s);
    if (s->bias)
        snprintf(bn, sizeof bn, "bias.%lld", (long long)s->n_out);
    snprintf(name, sizeof name, "mma %-5s %5lldx%-6lld nt %-4lld%s%s", mf_type_name(s->type),
             (long long)s->n_in, (long long)s->n_out, (long long)nt, s->bias ? " +bias" : "", chunk ? " chunked" : "");
    mf_graph g;
    graph_new(&g, 0, 0);
    int32_t xi = ext(&g, s->n_in, nt);
    int32_t mi = mf_g_matmul(&g, xi, wn, s->type, s->bias ? bn : NULL, s->n_in, s->n_out);
    mf_g_set_name(&g, mi, "%s", wn);
    float *x = rand_vec(s->n_in * nt, 1.0f);
    t_mma_chunk(be, chunk);
    float *y = mma_run(&g, mi, x, s->n_in, s->n_out, nt, 3);
    t_mma_chunk(be, 0);
    float *yt = mma_run(&g, mi, x, s->n_in, s->n_out, nt, 2);
    const int64_t n = s->n_out * nt;

    enum { NS = 40 };
    double *wr = malloc((size_t)s->n_in * sizeof *wr);
    double *ref = malloc((size_t)(NS * nt) * sizeof *ref);
    float *got = malloc((size_t)(NS * nt) * sizeof *got);
    for (int i = 0; i < NS; i++) {
        const int64_t r = i == 0 ? 0 : i == 1 ? s->n_out - 1 : (int64_t)(next_u64() % (uint64_t)s->n_out);
        ref_row(wn, r, wr);
        const double b = s->bias ? wf32(bn)[r] : 0.0;
        for (int64_t t = 0; t < nt; t++) {
            double acc = 0;
            const float *xt = x + t * s->n_in;
            for (int64_t k = 0; k < s->n_in; k++)
                acc += wr[k] * xt[k];
            ref[i * nt + t] = acc + b;
            got[i * nt + t] = y[t * s->n_out + r];
        }
    }
    result(name, rel_err(got, ref, NS * nt), 3e-3, count_nan(y, n), NULL);
    strncat(name, " vs tc", sizeof name - strlen(name) - 1);
    result(name, rel_err_f(y, yt, n), 1e-4, count_nan(yt, n), NULL);
    free(wr); free(ref); free(got); free(x); free(y); free(yt);
    mf_graph_free(&g);
}

/* FUSED_FFN at nt tokens (gate and up share x: converted to f16 once for
 * both) on the default path (the mma tier from 64 tokens), run twice on the
 * same buffers with different inputs, so an f16 copy of x kept past its node
 * would show; against float64 (3e-3) and the TC tier (1e-4). */
static void test_mma_ffn(uint32_t t, int64_t d, int64_t ff, int64_t nt) {
    char gn[64], un[80], name[140];
    mm_spec sg = {t, d, ff, false};
    mm_name(gn, sizeof gn, &sg);
    ffn_up_name(un, sizeof un, gn, t, t);
    mf_ffn_meta m = {.gate = {.weight = gn, .wtype = t, .n_in = d, .n_out = ff},
                     .up = {.weight = un, .wtype = t, .n_in = d, .n_out = ff}};
    mf_graph g;
    graph_new(&g, 0, 0);
    int32_t xi = ext(&g, d, nt);
    int32_t node = mf_g_fused_ffn(&g, xi, &m);
    int32_t in = dev_put(NULL, (size_t)(d * nt) * 4);
    double *rg = malloc((size_t)(ff * nt) * sizeof *rg), *ru = malloc((size_t)(ff * nt) * sizeof *ru);
    for (int rep = 0; rep < 2; rep++) {
        float *x = rand_vec(d * nt, 1.0f);
        mf_error e;
        if (be->ops->write_host(be, in, 0, x, (size_t)(d * nt) * 4, &e))
            die("write_host", &e);
        ref_matmul(gn, x, d, ff, nt, NULL, rg);
        ref_matmul(un, x, d, ff, nt, NULL, ru);
        for (int64_t i = 0; i < ff * nt; i++)
            rg[i] = rg[i] / (1 + exp(-rg[i])) * ru[i];
        float *y[2];
        for (int mode = 0; mode < 2; mode++) {
            int32_t out = dev_poison((size_t)(ff * nt) * 4);
            mf_exec_args a = args(0, nt, 1, MF_TYPE_F32);
            t_matmul_mode(be, mode ? 2 : 0);
            run_ok(&g, node, &in, out, (mf_kv_pair){-1, -1}, &a);
            t_matmul_mode(be, 0);
            y[mode] = dev_get(out, (size_t)(ff * nt) * 4);
            dev_free(out);
        }
        snprintf(name, sizeof name, "mma fused_ffn %-5s %lld -> %lld nt %lld run %d", mf_type_name(t),
                 (long long)d, (long long)ff, (long long)nt, rep);
        result(name, rel_err(y[0], rg, ff * nt), 3e-3, count_nan(y[0], ff * nt), NULL);
        strncat(name, " vs tc", sizeof name - strlen(name) - 1);
        result(name, rel_err_f(y[0], y[1], ff * nt), 1e-4, count_nan(y[1], ff * nt), NULL);
        free(x); free(y[0]); free(y[1]);
    }
    free(rg); free(ru);
    dev_free(in);
    mf_graph_free(&g);
}

/* 0.5B (Q4_0) and 7B (Q4_K) projection shapes: n_in, n_out, bias (q/k/v) */
static const mm_spec mma_real[] = {
    {MF_TYPE_Q4_0, 896, 896, true},   {MF_TYPE_Q4_0, 896, 128, true},   {MF_TYPE_Q4_0, 896, 4864, false},
    {MF_TYPE_Q4_0, 4864, 896, false}, {MF_TYPE_Q4_K, 3584, 3584, true}, {MF_TYPE_Q4_K, 3584, 512, true},
    {MF_TYPE_Q4_K, 3584, 18944, false}, {MF_TYPE_Q4_K, 18944, 3584, false},
};
#define N_MMA_REAL (int)(sizeof mma_real / sizeof mma_real[0])

/* every type at a small shape (K-quants need n_in % 256 == 0), and odd
 * shapes: n_in % 32 != 0 (float types), n_out not a multiple of a tile */
static mm_spec mma_small_spec(int i) {
    const uint32_t t = all_types[i];
    return (mm_spec){t, kq(t) ? 512 : 256, 200, i % 2 == 0};
}
static const mm_spec mma_odd[] = {{MF_TYPE_F32, 904, 1000, true}, {MF_TYPE_F16, 904, 1000, false},
                                  {MF_TYPE_Q8_0, 896, 1000, true}};
/* >= 99 tiles of 128 rows at any nt, so the big tile runs on ragged rows
 * (13000 = 101 x 128 + 72) and a ragged last k tile (904 = 14 x 64 + 8) */
static const mm_spec mma_wide = {MF_TYPE_F16, 904, 13000, true};

/* Weights of the mma family (before the backend uploads them). */
static void mma_weights(void) {
    for (int i = 0; i < N_TYPES; i++) {
        const mm_spec s = mma_small_spec(i);
        char wn[64];
        mm_name(wn, sizeof wn, &s);
        add_weight(wn, s.type, s.n_in, s.n_out);
    }
    const int n_real = small ? 2 : N_MMA_REAL;
    for (int i = 0; i < n_real + 3; i++) {
        const mm_spec *s = i < n_real ? &mma_real[i] : &mma_odd[i - n_real];
        char wn[64];
        mm_name(wn, sizeof wn, s);
        add_weight(wn, s->type, s->n_in, s->n_out);
    }
    char wn[64];
    mm_name(wn, sizeof wn, &mma_wide);
    add_weight(wn, mma_wide.type, mma_wide.n_in, mma_wide.n_out);
    add_f32("bias.13000", 13000, 0.5f, 0.0f);
    add_f32("bias.200", 200, 0.5f, 0.0f);
    add_f32("bias.1000", 1000, 0.5f, 0.0f);
    add_f32("bias.896", 896, 0.5f, 0.0f);
    add_f32("bias.128", 128, 0.5f, 0.0f);
    add_f32("bias.3584", 3584, 0.5f, 0.0f);
    add_f32("bias.512", 512, 0.5f, 0.0f);
}

/* Every type at a small shape, the odd shapes, the real shapes, the
 * ragged wide shape, split-K on the big tile (7B o / down at nt 500: 112
 * tiles of 128x128, 2 splits) and 7B up at nt 2048. */
static void mma_family(void) {
    const int64_t nts[] = {9, 64, 100, 513};
    const int n_nts = small ? 3 : 4;
    const int n_real = small ? 2 : N_MMA_REAL;
    {
        {
            for (int i = 0; i < N_TYPES; i++) {
                const mm_spec s = mma_small_spec(i);
                for (int k = 0; k < n_nts; k++)
                    test_mma(&s, nts[k], 0);
            }
            for (int i = 0; i < 3; i++) {
                test_mma(&mma_odd[i], 100, 0);
                test_mma(&mma_odd[i], 37, 100u << 10); /* 128-row chunks, the last one 104 rows */
            }
            for (int i = 0; i < n_real; i++)
                for (int k = 0; k < n_nts; k++)
                    test_mma(&mma_real[i], nts[k], 0);
            test_mma(&mma_real[small ? 0 : 2], 100, 256u << 10); /* many chunks of 128 rows */
            test_mma_ffn(MF_TYPE_Q4_0, 896, small ? 256 : 4864, 100);
        }
        test_mma(&mma_wide, 65, 0);
        if (!small) {
            test_mma(&mma_wide, 127, 0);
            test_mma(&mma_wide, 513, 0);
            test_mma(&mma_real[4], 500, 0);
            test_mma(&mma_real[7], 500, 0);
            test_mma(&mma_real[6], 2048, 0);
        }
    }
}

/* ---- fused mma GEMMs and split-K (family "mmafuse") ------------------------------------------- */

/* A weight from the test set copied to the device as-is (NULL name: NULL). */
static void *mf_dev_weight(const char *name) {
    if (!name)
        return NULL;
    const mf_weight *wt = mf_weights_find(W, name);
    void *d = NULL;
    if (!wt || cudaMalloc(&d, wt->nbytes) != cudaSuccess ||
        cudaMemcpy(d, wt->data, wt->nbytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        printf("mmafuse: cannot upload weight %s\n", name);
        exit(1);
    }
    return d;
}

static float *mf_dev_f32(const float *host, int64_t n, bool poison) {
    float *d = NULL;
    if (cudaMalloc((void **)&d, (size_t)n * 4) != cudaSuccess ||
        (host ? cudaMemcpy(d, host, (size_t)n * 4, cudaMemcpyHostToDevice)
              : poison ? cudaMemset(d, 0xff, (size_t)n * 4) : cudaSuccess) != cudaSuccess) {
        printf("mmafuse: cudaMalloc of %lld floats failed\n", (long long)n);
        exit(1);
    }
    return d;
}

static float *mf_host_f32(const float *dev, int64_t n) {
    float *h = malloc((size_t)n * 4);
    if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpy(h, dev, (size_t)n * 4, cudaMemcpyDeviceToHost)) {
        printf("mmafuse: kernel or copy failed: %s\n", cudaGetErrorString(cudaGetLastError()));
        exit(1);
    }
    return h;
}

/* One weight (name, optional bias) through the unfused mma tier
 * (mf_cu_gemm_mma, force_gemm 3, split-K as the default) into y. */
static void mf_mma_single(const char *wn, const void *w, const float *bias, const float *x, float *y, int64_t n_in,
                          int64_t nt) {
    const mf_weight *wt = mf_weights_find(W, wn);
    mf_cu_matmul_args a = {.wtype = wt->type, .w = w, .row_bytes = mf_type_row_size(wt->type, n_in), .x = x,
                           .bias = bias, .y = y, .n_in = n_in, .n_out = wt->ne[1], .nt = nt, .force_gemm = 3,
                           .sms = g_sms};
    size_t wb, xb;
    mf_cu_mma_scratch(&a, &wb, &xb);
    void *wf = NULL, *xf = NULL;
    if (cudaMalloc(&wf, wb ? wb : 16) || cudaMalloc(&xf, xb)) {
        printf("mmafuse: scratch for %s failed\n", wn);
        exit(1);
    }
    a.wf16 = wf;
    a.xf16 = xf;
    if (mf_cu_matmul(&a, 0) != cudaSuccess) {
        printf("mmafuse: unfused %s failed\n", wn);
        exit(1);
    }
    cudaDeviceSynchronize();
    cudaFree(wf);
    cudaFree(xf);
}

/* float64 reference of rows `rows` (NS of them) of weight wn (+ bias) for all
 * nt tokens: ref[i * nt + t]. */
static void mf_ref_rows(const char *wn, const char *bn, const int64_t *rows, int ns, const float *x, int64_t n_in,
                        int64_t nt, double *ref) {
    double *wr = malloc((size_t)n_in * sizeof *wr);
    for (int i = 0; i < ns; i++) {
        ref_row(wn, rows[i], wr);
        const double b = bn ? wf32(bn)[rows[i]] : 0.0;
        for (int64_t t = 0; t < nt; t++) {
            double acc = 0;
            for (int64_t k = 0; k < n_in; k++)
                acc += wr[k] * x[t * n_in + k];
            ref[i * nt + t] = acc + b;
        }
    }
    free(wr);
}

enum { MF_NS = 24 };

static void mf_sample_rows(int64_t n, int64_t *rows) {
    for (int i = 0; i < MF_NS; i++)
        rows[i] = i == 0 ? 0 : i == 1 ? n - 1 : i == 2 ? (n / 2 + 7) % n : (int64_t)(next_u64() % (uint64_t)n);
}

/* The fused QKV GEMM (mf_cu_gemm_mma_multi, n_w 3) of spec s at nt tokens,
 * outputs poisoned: every output NaN-free, q/k/v against float64 on sampled
 * rows (3e-3: both operands rounded to f16) and against the three unfused
 * mma GEMMs over every element (1e-5, max norm: only the f32 summation
 * order may differ, through split-K). */
static void test_mmafuse_qkv(const qkv_spec *s, int64_t nt) {
    char nm[6][64], name[160];
    qkv_names(s, nm);
    const int64_t qd = (int64_t)s->n_head * s->hd, kvd = (int64_t)s->n_head_kv * s->hd, d = s->d;
    const int64_t no[3] = {qd, kvd, kvd};
    const char *bn[3] = {s->bias ? nm[3] : NULL, s->bias ? nm[4] : NULL, s->bias ? nm[4] : NULL};
    float *x = rand_vec(d * nt, 1.0f);
    float *dx = mf_dev_f32(x, d * nt, false);
    mf_cu_mma_multi_args a = {.n_w = 3, .x = dx, .n_in = d, .nt = nt, .sms = g_sms};
    void *dw[3];
    float *db[3], *dy[3], *du[3];
    for (int i = 0; i < 3; i++) {
        const mf_weight *wt = mf_weights_find(W, nm[i]);
        dw[i] = mf_dev_weight(nm[i]);
        db[i] = bn[i] ? mf_dev_f32(wf32(bn[i]), no[i], false) : NULL;
        dy[i] = mf_dev_f32(NULL, no[i] * nt, true);
        du[i] = mf_dev_f32(NULL, no[i] * nt, true);
        a.wtype[i] = wt->type;
        a.w[i] = dw[i];
        a.row_bytes[i] = mf_type_row_size(wt->type, d);
        a.bias[i] = db[i];
        a.y[i] = dy[i];
        a.n_out[i] = no[i];
    }
    snprintf(name, sizeof name, "mmafuse qkv %s%s d %lld q %lld kv %lld nt %lld%s", mf_type_name(s->type),
             s->vtype ? "/v Q6_K" : "", (long long)d, (long long)qd, (long long)kvd, (long long)nt,
             s->bias ? " +bias" : "");
    if (!mf_cu_mma_multi_ok(&a)) {
        check_true(name, false, "mf_cu_mma_multi_ok refused a real QKV shape");
    } else {
        size_t wb, xb;
        mf_cu_mma_multi_scratch(&a, &wb, &xb);
        if (cudaMalloc(&a.wf16, wb) || cudaMalloc(&a.xf16, xb) || mf_cu_gemm_mma_multi(&a, 0) != cudaSuccess) {
            printf("mmafuse: fused qkv launch failed\n");
            exit(1);
        }
        for (int i = 0; i < 3; i++) {
            float *y = mf_host_f32(dy[i], no[i] * nt);
            mf_mma_single(nm[i], dw[i], db[i], dx, du[i], d, nt);
            float *u = mf_host_f32(du[i], no[i] * nt);
            int64_t rows[MF_NS];
            mf_sample_rows(no[i], rows);
            double *ref = malloc((size_t)(MF_NS * nt) * sizeof *ref);
            float *got = malloc((size_t)(MF_NS * nt) * sizeof *got);
            mf_ref_rows(nm[i], bn[i], rows, MF_NS, x, d, nt, ref);
            for (int r = 0; r < MF_NS; r++)
                for (int64_t t = 0; t < nt; t++)
                    got[r * nt + t] = y[t * no[i] + rows[r]];
            char nn[200];
            snprintf(nn, sizeof nn, "%s: %c", name, "qkv"[i]);
            result(nn, rel_err(got, ref, MF_NS * nt), 3e-3, count_nan(y, no[i] * nt), NULL);
            strncat(nn, " vs unfused", sizeof nn - strlen(nn) - 1);
            result(nn, rel_err_f(y, u, no[i] * nt), 1e-5, count_nan(u, no[i] * nt), NULL);
            free(y); free(u); free(ref); free(got);
        }
        cudaFree(a.wf16);
        cudaFree(a.xf16);
    }
    for (int i = 0; i < 3; i++) {
        cudaFree(dw[i]); cudaFree(db[i]); cudaFree(dy[i]); cudaFree(du[i]);
    }
    cudaFree(dx);
    free(x);
}

/* The fused gate/up GEMM with SwiGLU in its epilogue (n_w 2, swiglu) at
 * d -> ff, nt tokens, f16 weight chunks of `chunk` bytes (0: default): NaN-free,
 * against float64 silu(g) u on sampled outputs (3e-3) and against the two
 * unfused mma GEMMs + silu(g) u in double on the host (1e-5, max norm). */
static void test_mmafuse_ffn(uint32_t t, int64_t d, int64_t ff, int64_t nt, uint64_t chunk) {
    char gn[64], un[80], name[160];
    mm_spec sg = {t, d, ff, false};
    mm_name(gn, sizeof gn, &sg);
    ffn_up_name(un, sizeof un, gn, t, t);
    float *x = rand_vec(d * nt, 1.0f);
    float *dx = mf_dev_f32(x, d * nt, false);
    void *dg = mf_dev_weight(gn), *du = mf_dev_weight(un);
    float *dy = mf_dev_f32(NULL, ff * nt, true), *yg = mf_dev_f32(NULL, ff * nt, true),
          *yu = mf_dev_f32(NULL, ff * nt, true);
    const uint64_t rb = mf_type_row_size(t, d);
    mf_cu_mma_multi_args a = {.n_w = 2, .swiglu = 1, .wtype = {t, t}, .w = {dg, du}, .row_bytes = {rb, rb},
                              .y = {dy, dy}, .n_out = {ff, ff}, .x = dx, .n_in = d, .nt = nt,
                              .wchunk_bytes = chunk, .sms = g_sms};
    snprintf(name, sizeof name, "mmafuse ffn %-5s %lld -> %lld nt %lld%s", mf_type_name(t), (long long)d,
             (long long)ff, (long long)nt, chunk ? " chunked" : "");
    size_t wb, xb;
    mf_cu_mma_multi_scratch(&a, &wb, &xb);
    if (!mf_cu_mma_multi_ok(&a)) {
        check_true(name, false, "mf_cu_mma_multi_ok refused a real FFN shape");
    } else if (cudaMalloc(&a.wf16, wb) || cudaMalloc(&a.xf16, xb) || mf_cu_gemm_mma_multi(&a, 0) != cudaSuccess) {
        printf("mmafuse: fused ffn launch failed\n");
        exit(1);
    } else {
        float *y = mf_host_f32(dy, ff * nt);
        mf_mma_single(gn, dg, NULL, dx, yg, d, nt);
        mf_mma_single(un, du, NULL, dx, yu, d, nt);
        float *hg = mf_host_f32(yg, ff * nt), *hu = mf_host_f32(yu, ff * nt);
        float *old = malloc((size_t)(ff * nt) * 4);
        for (int64_t i = 0; i < ff * nt; i++)
            old[i] = (float)((double)hg[i] / (1.0 + exp(-(double)hg[i])) * hu[i]);
        int64_t rows[MF_NS];
        mf_sample_rows(ff, rows);
        double *rg = malloc((size_t)(MF_NS * nt) * sizeof *rg), *ru = malloc((size_t)(MF_NS * nt) * sizeof *ru);
        float *got = calloc((size_t)(MF_NS * nt), sizeof *got); /* calloc: gcc 12 -Wmaybe-uninitialized */
        mf_ref_rows(gn, NULL, rows, MF_NS, x, d, nt, rg);
        mf_ref_rows(un, NULL, rows, MF_NS, x, d, nt, ru);
        for (int r = 0; r < MF_NS; r++)
            for (int64_t k = 0; k < nt; k++) {
                const int64_t i = r * nt + k;
                rg[i] = rg[i] / (1 + exp(-rg[i])) * ru[i];
                got[i] = y[k * ff + rows[r]];
            }
        result(name, rel_err(got, rg, MF_NS * nt), 3e-3, count_nan(y, ff * nt), NULL);
        strncat(name, " vs unfused", sizeof name - strlen(name) - 1);
        result(name, rel_err_f(y, old, ff * nt), 1e-5, count_nan(hg, ff * nt) + count_nan(hu, ff * nt), NULL);
        free(y); free(hg); free(hu); free(old); free(rg); free(ru); free(got);
    }
    cudaFree(a.wf16); cudaFree(a.xf16);
    cudaFree(dg); cudaFree(du); cudaFree(dy); cudaFree(yg); cudaFree(yu); cudaFree(dx);
    free(x);
}

/* FUSED_QKV through the backend (exec_qkv: routing, biases, the rope/store
 * tail) with the mma fusion on (default) and off (mf_cuda_set_mma_fuse, =
 * MINFER_CUDA_NO_MMA_FUSE=1): the roped q output and the K/V rows stored at
 * n_past (f32 cache) agree within 1e-5 (max norm), nothing stays NaN. */
static void test_mmafuse_qkv_node(const qkv_spec *s, int64_t nt) {
    char nm[6][64], name[160];
    qkv_names(s, nm);
    const int64_t qd = (int64_t)s->n_head * s->hd, kvd = (int64_t)s->n_head_kv * s->hd, n_past = 5;
    const int32_t n_ctx = (int32_t)(n_past + nt + 8);
    mf_rope_meta rq = {.n_head = s->n_head, .head_dim = s->hd, .n_rot = s->hd, .mode = s->mode,
                       .theta = 10000.0f, .freq_scale = 1.0f};
    mf_rope_meta rk = rq;
    rk.n_head = s->n_head_kv;
    mf_qkv_meta m = {.layer = 0,
                     .q = {.weight = nm[0], .wtype = s->type, .bias = s->bias ? nm[3] : NULL, .n_in = s->d, .n_out = qd},
                     .k = {.weight = nm[1], .wtype = s->type, .bias = s->bias ? nm[4] : NULL, .n_in = s->d, .n_out = kvd},
                     .v = {.weight = nm[2], .wtype = qkv_vtype(s), .bias = s->bias ? nm[4] : NULL, .n_in = s->d,
                           .n_out = kvd},
                     .q_norm = s->norm ? nm[5] : NULL, .k_norm = s->norm ? nm[5] : NULL, .norm_eps = 1e-6f,
                     .rope_q = rq, .rope_k = rk, .n_head = s->n_head, .n_head_kv = s->n_head_kv, .head_dim = s->hd};
    mf_graph g;
    graph_new(&g, 1, kvd);
    int32_t xi = ext(&g, s->d, nt);
    int32_t pi = mf_g_input(&g, MF_INPUT_POSITIONS, MF_DTYPE_I32, nt, 1);
    int32_t node = mf_g_fused_qkv(&g, xi, pi, &m);
    float *x = rand_vec(s->d * nt, 1.0f);
    int32_t *pos = malloc((size_t)nt * 4);
    for (int64_t t = 0; t < nt; t++)
        pos[t] = (int32_t)(n_past + t);
    int32_t ids[2] = {dev_put(x, (size_t)(s->d * nt) * 4), dev_put(pos, (size_t)nt * 4)};
    const size_t region = (size_t)kvd * 4 * (size_t)n_ctx, off = (size_t)kvd * 4 * (size_t)n_past;
    const size_t kvb = (size_t)(kvd * nt) * 4;
    float *res[2][3];
    for (int v = 0; v < 2; v++) {
        mf_kv_pair kv = {dev_poison(region), dev_poison(region)};
        int32_t out = dev_poison((size_t)(qd * nt) * 4);
        mf_exec_args ea = args(n_past, nt, n_ctx, MF_TYPE_F32);
        t_mma_fuse(be, v == 0, 1);
        run_ok(&g, node, ids, out, kv, &ea);
        t_mma_fuse(be, 1, 1);
        res[v][0] = dev_get(out, (size_t)(qd * nt) * 4);
        res[v][1] = malloc(kvb);
        res[v][2] = malloc(kvb);
        mf_error e;
        if (be->ops->read_host(be, kv.k, off, res[v][1], kvb, &e) ||
            be->ops->read_host(be, kv.v, off, res[v][2], kvb, &e))
            die("read kv", &e);
        dev_free(out); dev_free(kv.k); dev_free(kv.v);
    }
    snprintf(name, sizeof name, "mmafuse qkv node %s%s d %lld heads %d/%d nt %lld%s%s vs unfused",
             mf_type_name(s->type), s->vtype ? "/v Q6_K" : "", (long long)s->d, s->n_head, s->n_head_kv,
             (long long)nt, s->bias ? " +bias" : "", s->norm ? " +qk_norm" : "");
    const int64_t n[3] = {qd * nt, kvd * nt, kvd * nt};
    const char *part[3] = {"(q)", "(k)", "(v)"};
    for (int i = 0; i < 3; i++) {
        result(name, rel_err_f(res[0][i], res[1][i], n[i]), 1e-5, count_nan(res[0][i], n[i]) + count_nan(res[1][i], n[i]),
               part[i]);
        free(res[0][i]); free(res[1][i]);
    }
    dev_free(ids[0]); dev_free(ids[1]);
    free(x); free(pos);
    mf_graph_free(&g);
}

static const qkv_spec mmafuse_qkvs[] = {
    {MF_TYPE_Q4_0, 896, 14, 2, 64, true, false, MF_ROPE_NEOX, 0},               /* qwen2 0.5B */
    {MF_TYPE_Q4_K, 3584, 28, 4, 128, true, false, MF_ROPE_NEOX, MF_TYPE_Q6_K}, /* qwen2 7B Q4_K_M */
    {MF_TYPE_Q4_K, 2560, 32, 8, 128, false, true, MF_ROPE_NEOX, 0},            /* qwen3 4B */
};

static void mmafuse_weights(void) {
    for (int i = 0; i < (small ? 1 : 3); i++)
        qkv_weights(&mmafuse_qkvs[i]);
    const int64_t ff05 = small ? 256 : 4864;
    const struct { uint32_t t; int64_t d, ff; } f[2] = {{MF_TYPE_Q4_0, 896, ff05}, {MF_TYPE_Q4_K, 3584, 18944}};
    for (int i = 0; i < (small ? 1 : 2); i++) {
        char gn[64], un[80];
        mm_spec sg = {f[i].t, f[i].d, f[i].ff, false};
        mm_name(gn, sizeof gn, &sg);
        ffn_up_name(un, sizeof un, gn, f[i].t, f[i].t);
        add_weight(gn, f[i].t, f[i].d, f[i].ff);
        add_weight(un, f[i].t, f[i].d, f[i].ff);
    }
    /* the split-K cases' weights, named as test_mma looks them up (mm_name;
     * add_weight skips a name the mma family registered already) */
    add_weight("mm.q4_0.4864x896", MF_TYPE_Q4_0, 4864, 896);
    if (!small)
        add_weight("mm.q4_K.18944x3584", MF_TYPE_Q4_K, 18944, 3584);
}

/* QKV launcher and nodes, FFN 0.5B and 7B, chunked and not. */
static void mmafuse_family(void) {
    const int64_t nts[] = {9, 64, 513};
    const int n_q = small ? 1 : 3;
    for (int cfg = 0; cfg < 1; cfg++) {
        const int k0 = 0;
        for (int i = 0; i < n_q; i++)
            for (int k = k0; k < (small ? 2 : 3); k++)
                test_mmafuse_qkv(&mmafuse_qkvs[i], nts[k]);
        for (int i = 0; i < n_q; i++)
            test_mmafuse_qkv_node(&mmafuse_qkvs[i], cfg == 0 ? 100 : 513);
        const int64_t fnts[] = {9, 100, 513};
        for (int k = k0; k < (small ? 2 : 3); k++)
            test_mmafuse_ffn(MF_TYPE_Q4_0, 896, small ? 256 : 4864, fnts[k], 0);
        if (cfg == 0)
            test_mmafuse_ffn(MF_TYPE_Q4_0, 896, small ? 256 : 4864, 100, 1u << 20); /* 19 chunks of 256 outputs */
        if (!small) {
            test_mmafuse_ffn(MF_TYPE_Q4_K, 3584, 18944, 9, 0);
            test_mmafuse_ffn(MF_TYPE_Q4_K, 3584, 18944, 513, 0);
            test_mmafuse_ffn(MF_TYPE_Q4_K, 3584, 18944, 100, 64u << 20); /* 5 chunks, the last one shorter */
        }
    }
    /* FUSED_FFN node on the default path with the fusion off (the old path), then on */
    printf("mmafuse: the next mma fused_ffn lines run with the mma fusion off, then on\n");
    t_mma_fuse(be, 0, 1);
    test_mma_ffn(MF_TYPE_Q4_0, 896, small ? 256 : 4864, 100);
    t_mma_fuse(be, 1, 1);
    test_mma_ffn(MF_TYPE_Q4_0, 896, small ? 256 : 4864, 100);
    /* split-K: 0.5B down at nt 100 / 513 (4 splits), 7B down at nt 100 (4); off = the old path */
    const mm_spec down05 = {MF_TYPE_Q4_0, 4864, 896, false}, down7 = {MF_TYPE_Q4_K, 18944, 3584, false};
    for (int sp = 0; sp < 2; sp++) {
        printf("mmafuse: the next test_mma lines run with split-K %s\n", sp ? "on (default)" : "off (old path)");
        t_mma_fuse(be, 1, sp);
        test_mma(&down05, 100, 0);
        if (!small) {
            test_mma(&down05, 513, 0);
            test_mma(&down7, 100, 0);
        }
    }
    t_mma_fuse(be, 1, 1);
}

/* ---- split-KV flash decode attention (family "decattn") ------------------------------------- */

/* out[t, h] = softmax(q k^T * scale) v over rows [0, n_past + t] of the host
 * view of the cache (kc/vc: rows of kvd), in double. */
static void da_ref(const float *q, const float *kc, const float *vc, int32_t n_head, int32_t n_head_kv, int32_t hd,
                   int64_t n_past, int64_t nt, float scale, double *out) {
    const int64_t kvd = (int64_t)n_head_kv * hd;
    const int group = n_head / n_head_kv;
    double *sc = malloc((size_t)(n_past + nt) * sizeof *sc);
    for (int64_t t = 0; t < nt; t++)
        for (int h = 0; h < n_head; h++) {
            const float *qv = q + (t * n_head + h) * hd;
            const int64_t e0 = (int64_t)(h / group) * hd, nr = n_past + t + 1;
            double mx = -INFINITY, sum = 0;
            for (int64_t r = 0; r < nr; r++) {
                double d = 0;
                for (int i = 0; i < hd; i++)
                    d += (double)qv[i] * kc[r * kvd + e0 + i];
                sc[r] = d * scale;
                mx = fmax(mx, sc[r]);
            }
            for (int64_t r = 0; r < nr; r++)
                sum += sc[r] = exp(sc[r] - mx);
            double *o = out + (t * n_head + h) * hd;
            for (int i = 0; i < hd; i++)
                o[i] = 0;
            for (int64_t r = 0; r < nr; r++) {
                const float *vr = vc + r * kvd + e0;
                for (int i = 0; i < hd; i++)
                    o[i] += sc[r] * vr[i];
            }
            for (int i = 0; i < hd; i++)
                o[i] /= sum;
        }
    free(sc);
}

/* A cache region of n_ctx rows, its first `rows` random K/V (stored by a
 * KVCACHE_STORE node), and an ATTN node of nt tokens over it; *kc / *vc get the host view (what the kernels read). */
typedef struct da_fix {
    mf_graph g;
    mf_kv_pair kv;
    int32_t at;
    float *kc, *vc;
    float scale;
} da_fix;

static void da_setup(da_fix *f, int32_t n_head, int32_t n_head_kv, int32_t hd, int64_t rows, int64_t nt,
                     int32_t n_ctx, uint32_t kv_type) {
    const int64_t kvd = (int64_t)n_head_kv * hd;
    const size_t region = mf_type_row_size(kv_type, kvd) * (size_t)n_ctx;
    f->kv = (mf_kv_pair){dev_put(NULL, region), dev_put(NULL, region)};
    graph_new(&f->g, 1, kvd);
    int32_t ki = ext(&f->g, kvd, rows), vi = ext(&f->g, kvd, rows);
    int32_t st = mf_g_kv_store(&f->g, ki, vi, 0);
    int32_t qi = ext(&f->g, (int64_t)n_head * hd, nt);
    f->scale = 1.0f / sqrtf((float)hd);
    mf_attn_meta am = {.layer = 0, .n_head = n_head, .n_head_kv = n_head_kv, .head_dim = hd, .scale = f->scale};
    f->at = mf_g_attn(&f->g, qi, st, &am);
    float *k = rand_vec(kvd * rows, 2.0f), *v = rand_vec(kvd * rows, 1.0f);
    int32_t ids[2] = {dev_put(k, (size_t)(kvd * rows) * 4), dev_put(v, (size_t)(kvd * rows) * 4)};
    mf_exec_args a0 = args(0, rows, n_ctx, kv_type);
    run_ok(&f->g, st, ids, -1, f->kv, &a0);
    f->kc = malloc((size_t)(kvd * rows) * 4);
    f->vc = malloc((size_t)(kvd * rows) * 4);
    kv_roundtrip(kv_type, k, f->kc, rows, kvd);
    kv_roundtrip(kv_type, v, f->vc, rows, kvd);
    free(k);
    free(v);
    dev_free(ids[0]);
    dev_free(ids[1]);
}

static void da_teardown(da_fix *f) {
    free(f->kc);
    free(f->vc);
    dev_free(f->kv.k);
    dev_free(f->kv.v);
    mf_graph_free(&f->g);
}

/* The ATTN node for nt tokens at n_past with the flash decode on or off,
 * into a poisoned buffer (or in place over q); returns the output. */
static float *da_run(da_fix *f, const float *q, int64_t qd, int64_t n_past, int64_t nt, int32_t n_ctx,
                     uint32_t kv_type, bool decode, bool inplace) {
    int32_t qid = dev_put(q, (size_t)(qd * nt) * 4);
    int32_t out = inplace ? qid : dev_poison((size_t)(qd * nt) * 4);
    mf_exec_args a = args(n_past, nt, n_ctx, kv_type);
    t_flash_decode(be, decode);
    run_ok(&f->g, f->at, (int32_t[]){qid, -1}, out, f->kv, &a);
    t_flash_decode(be, !(tune0.attn_decode == MF_CU_AD_BLOCK));
    float *y = dev_get(out, (size_t)(qd * nt) * 4);
    dev_free(qid);
    if (!inplace)
        dev_free(out);
    return y;
}

/* nt tokens at depth n_past for one head shape and cache type: the flash
 * decode (into a poisoned buffer, and in place over q when nt == 3) and the
 * old kernel, both against float64 (1e-4, the attn family's tolerance) and
 * against each other (3e-5 max norm: same f32 math, another order). n_ctx
 * sets the split count: tight (n_past + nt + 16: few splits, all busy) or
 * wide (many splits, most of them empty at small depth, as in a graph
 * captured for a long context). */
static void test_decattn(int32_t n_head, int32_t n_head_kv, int32_t hd, int64_t n_past, int64_t nt,
                         uint32_t kv_type, bool wide) {
    const int64_t qd = (int64_t)n_head * hd, n_kv = n_past + nt;
    const int32_t n_ctx = wide ? (int32_t)(n_kv > 4224 ? n_kv + 64 : 4224) : (int32_t)(n_kv + 16);
    da_fix f;
    da_setup(&f, n_head, n_head_kv, hd, n_kv, nt, n_ctx, kv_type);
    float *q = rand_vec(qd * nt, 2.0f);
    double *ref = malloc((size_t)(qd * nt) * sizeof *ref);
    da_ref(q, f.kc, f.vc, n_head, n_head_kv, hd, n_past, nt, f.scale, ref);
    float *yn = da_run(&f, q, qd, n_past, nt, n_ctx, kv_type, true, false);
    float *yo = da_run(&f, q, qd, n_past, nt, n_ctx, kv_type, false, false);
    char name[160], sub[200];
    snprintf(name, sizeof name, "decattn %-4s heads %d/%d hd %d n_past %lld nt %lld ctx %d",
             mf_type_name(kv_type), n_head, n_head_kv, hd, (long long)n_past, (long long)nt, n_ctx);
    snprintf(sub, sizeof sub, "%s [flash decode]", name);
    result(sub, rel_err(yn, ref, qd * nt), 1e-4, count_nan(yn, qd * nt), NULL);
    snprintf(sub, sizeof sub, "%s [old kernel]", name);
    result(sub, rel_err(yo, ref, qd * nt), 1e-4, count_nan(yo, qd * nt), NULL);
    snprintf(sub, sizeof sub, "%s [flash vs old]", name);
    result(sub, rel_err_f(yn, yo, qd * nt), 3e-5, count_nan(yn, qd * nt), NULL);
    if (nt == 3) {
        float *yi = da_run(&f, q, qd, n_past, nt, n_ctx, kv_type, true, true);
        snprintf(sub, sizeof sub, "%s [flash in place]", name);
        result(sub, rel_err(yi, ref, qd * nt), 1e-4, count_nan(yi, qd * nt), NULL);
        free(yi);
    }
    free(q);
    free(ref);
    free(yn);
    free(yo);
    da_teardown(&f);
}

/* CUDA graph replay of a forward holding only the ATTN node: n_ctx fixed,
 * n_past moving across split boundaries (1st step plain, 2nd captured, the
 * rest replayed with n_past read from the device); every step's output
 * against float64, and the replay count. one: the one-kernel decode
 * (MINFER_CUDA_ATTN_ONE) at every depth or off (with the default depth
 * limit the graph would be captured again past it). */
static void test_decattn_graph(uint32_t kv_type, int64_t nt, int one) {
    const int32_t n_head = 14, n_head_kv = 2, hd = 64, n_ctx = small ? 640 : 4224;
    const int64_t qd = (int64_t)n_head * hd;
    const int64_t past[] = {40, 41, 300, small ? 500 : 2047, small ? 600 : 4096, 5};
    enum { STEPS = sizeof past / sizeof past[0] };
    da_fix f;
    da_setup(&f, n_head, n_head_kv, hd, n_ctx, nt, n_ctx, kv_type);
    int32_t qid = dev_put(NULL, (size_t)(qd * nt) * 4), out = dev_put(NULL, (size_t)(qd * nt) * 4);
    double *ref = malloc((size_t)(qd * nt) * sizeof *ref);
    mf_cuda_set_graphs(be, true);
    t_attn_one(be, one);
    t_attn_short(be, 0); /* the split-KV kernels (family attnshort replays its own) */
    int64_t cap0, rep0, cap1, rep1;
    mf_cuda_graph_stats(be, &cap0, &rep0);
    double worst = 0;
    int64_t nan = 0;
    for (int st = 0; st < STEPS; st++) {
        float *q = rand_vec(qd * nt, 2.0f);
        mf_exec_args a = args(past[st], nt, n_ctx, kv_type);
        mf_error e;
        if (mf_cuda_begin_forward(be, &f.g, &a, &e) || be->ops->write_host(be, qid, 0, q, (size_t)(qd * nt) * 4, &e) ||
            mf_cuda_execute_node(be, &f.g, f.at, (int32_t[]){qid, -1}, out, f.kv, &a, &e) ||
            mf_cuda_end_forward(be, &f.g, &a, &e))
            die("decattn graph step", &e);
        float *y = dev_get(out, (size_t)(qd * nt) * 4);
        da_ref(q, f.kc, f.vc, n_head, n_head_kv, hd, past[st], nt, f.scale, ref);
        worst = fmax(worst, rel_err(y, ref, qd * nt));
        nan += count_nan(y, qd * nt);
        free(y);
        free(q);
    }
    mf_cuda_graph_stats(be, &cap1, &rep1);
    mf_cuda_set_graphs(be, !false);
    t_attn_one(be, -1);
    t_attn_short(be, -1);
    char name[160], detail[120];
    snprintf(name, sizeof name, "decattn graph %-4s nt %lld one %d ctx %d, %d steps (worst)", mf_type_name(kv_type),
             (long long)nt, one, n_ctx, STEPS);
    result(name, worst, 1e-4, nan, NULL);
    snprintf(detail, sizeof detail, "%lld captures, %lld replays", (long long)(cap1 - cap0), (long long)(rep1 - rep0));
    snprintf(name, sizeof name, "decattn graph %-4s nt %lld one %d: steps replayed", mf_type_name(kv_type), (long long)nt,
             one);
    check_true(name, cap1 - cap0 >= 1 && rep1 - rep0 >= STEPS - 2, detail);
    free(ref);
    dev_free(qid);
    dev_free(out);
    da_teardown(&f);
}

static void decattn_family(void) {
    static const int32_t shapes[][3] = {{14, 2, 64}, {28, 4, 128}, {32, 8, 128}};
    static const uint32_t kvt[] = {MF_TYPE_F32, MF_TYPE_F16, MF_TYPE_Q8_0};
    const int64_t nts[] = {1, 3, 8};
    const int64_t depth[] = {0, 1, 37, small ? 300 : 700, 4095};
    const int n_depth = small ? 4 : 5;
    for (int si = 0; si < 3; si++)
        for (int ti = 0; ti < 3; ti++)
            for (int di = 0; di < n_depth; di++)
                for (int ni = 0; ni < 3; ni++) {
                    /* the deepest cases cost the float64 reference most: f16 at every nt, the others at nt 1 */
                    if (depth[di] == 4095 && kvt[ti] != MF_TYPE_F16 && nts[ni] != 1)
                        continue;
                    /* small (sanitizer runs): depth 1 and nt 3 once per shape and type */
                    if (small && ((depth[di] == 1) != (nts[ni] == 3)))
                        continue;
                    test_decattn(shapes[si][0], shapes[si][1], shapes[si][2], depth[di], nts[ni], kvt[ti],
                                 (di + ni) % 2 == 1);
                }
    for (int ti = 0; ti < 3; ti++)
        for (int one = 0; one <= 1; one++)
            test_decattn_graph(kvt[ti], ti == 1 ? 3 : 1, one);
}

/* ---- family preattn: tensor-core flash prefill (attn_prefill_mma.cu) ------------------------- */

/* Error bound of the tensor-core prefill. q, K, V (f32 cache) and P are
 * rounded to f16 (unit roundoff u = 2^-11 ~ 4.9e-4 each); the kernel
 * accumulates in f32 and normalizes by the sum of the rounded P, so the
 * output is an exact convex combination of the rounded V with weights
 * perturbed by exp(ds) (1 + dp). A score s = scale q.k picks up
 * ds ~ u scale sqrt(sum (q_i k_i)^2 * 2 / 3) (independent roundings): with
 * q, k uniform in [-2, 2) that is ~ u * 0.8 ~ 4e-4 for hd 64 and 128 (scale
 * 1 / sqrt(hd)); the weight errors are independent across rows, so the
 * output error of a token with n_eff effective rows is ~ (4e-4 + u) |v| /
 * sqrt(n_eff) against an output of ~|v| / sqrt(n_eff): about 1e-3 relative,
 * plus u from V's own rounding. The case tolerance is 3e-3 (L2 relative,
 * same as the tensor-core GEMM tier) against float64, and 3e-3 against the
 * SIMT flash kernel (which is f32 throughout); the worst case (all
 * roundings aligned) would be ~ u (2 scale sum |q k| + 2) ~ 1.2e-2, far
 * beyond what random data produces. */
#define PA_TOL 3e-3

/* Tokens whose float64 reference is computed: the ends, both sides of
 * every 64-query tile boundary and a stride (all of them when nt is small). */
static bool pa_check_tok(int64_t t, int64_t nt) {
    if (nt <= 80)
        return true;
    if (nt > 1000) /* nt 2048 at depth 4096: ~36 tokens keep the host reference to seconds */
        return t < 2 || t >= nt - 2 || t % 256 == 0 || t % 256 == 255 || t % 127 == 3;
    return t < 2 || t >= nt - 2 || t % 64 == 0 || t % 64 == 63 || t % 29 == 3;
}

/* Runs ATTN of test graph g (node at) into a fresh poisoned buffer, or in
 * place over a fresh copy of q; returns the host copy of the output. */
static float *pa_run(const mf_graph *g, int32_t at, const float *q, int64_t n, mf_kv_pair kv,
                     const mf_exec_args *a, bool inplace) {
    const int32_t qid = dev_put(q, (size_t)n * 4);
    const int32_t out = inplace ? qid : dev_poison((size_t)n * 4);
    run_ok(g, at, (int32_t[]){qid, -1}, out, kv, a);
    float *y = dev_get(out, (size_t)n * 4);
    dev_free(qid);
    if (!inplace)
        dev_free(out);
    return y;
}

/* Stores random K/V rows [0, n_past + nt) (KVCACHE_STORE), then runs ATTN
 * for nt tokens at n_past on the tensor-core kernel (into a poisoned buffer,
 * and in place over q when `inplace`) and on the SIMT flash kernel; checks
 * both against float64 on the pa_check_tok tokens (every element for NaN)
 * and the new kernel against the old everywhere. */
static void test_preattn(const attn_spec *s, bool inplace) {
    const int64_t kvd = (int64_t)s->n_head_kv * s->hd, qd = (int64_t)s->n_head * s->hd;
    const int64_t n_kv = s->n_past + s->nt, nq = qd * s->nt;
    const int32_t n_ctx = (int32_t)(n_kv + 16);
    const size_t region = mf_type_row_size(s->kv_type, kvd) * (size_t)n_ctx;
    mf_kv_pair kv = {dev_put(NULL, region), dev_put(NULL, region)};
    mf_graph g;
    graph_new(&g, 1, kvd);
    const int32_t ki = ext(&g, kvd, n_kv), vi = ext(&g, kvd, n_kv);
    const int32_t st = mf_g_kv_store(&g, ki, vi, 0);
    const int32_t qi = ext(&g, qd, s->nt);
    mf_attn_meta am = {.layer = 0, .n_head = s->n_head, .n_head_kv = s->n_head_kv, .head_dim = s->hd,
                       .scale = 1.0f / sqrtf((float)s->hd)};
    const int32_t at = mf_g_attn(&g, qi, st, &am);
    float *k = rand_vec(kvd * n_kv, 2.0f), *v = rand_vec(kvd * n_kv, 1.0f), *q = rand_vec(nq, 2.0f);
    const int32_t ids[2] = {dev_put(k, (size_t)(kvd * n_kv) * 4), dev_put(v, (size_t)(kvd * n_kv) * 4)};
    const mf_exec_args a0 = args(0, n_kv, n_ctx, s->kv_type);
    run_ok(&g, st, ids, -1, kv, &a0);
    dev_free(ids[0]);
    dev_free(ids[1]);
    float *kc = malloc((size_t)(kvd * n_kv) * 4), *vc = malloc((size_t)(kvd * n_kv) * 4);
    kv_roundtrip(s->kv_type, k, kc, n_kv, kvd);
    kv_roundtrip(s->kv_type, v, vc, n_kv, kvd);

    const mf_exec_args a = args(s->n_past, s->nt, n_ctx, s->kv_type);
    t_flash(be, true);
    t_tc_attn(be, true);
    float *yt = pa_run(&g, at, q, nq, kv, &a, false);
    float *yi = inplace ? pa_run(&g, at, q, nq, kv, &a, true) : NULL;
    t_tc_attn(be, false);
    float *yf = pa_run(&g, at, q, nq, kv, &a, false);
    t_tc_attn(be, true);

    /* float64 reference on the sampled tokens, gathered with the outputs */
    int64_t n_chk = 0;
    for (int64_t t = 0; t < s->nt; t++)
        n_chk += pa_check_tok(t, s->nt);
    double *ref = malloc((size_t)(n_chk * qd) * sizeof *ref), *sc = malloc((size_t)n_kv * sizeof *sc);
    float *gt = malloc((size_t)(n_chk * qd) * 4), *gf = malloc((size_t)(n_chk * qd) * 4);
    const int group = s->n_head / s->n_head_kv;
    int64_t row = 0;
    for (int64_t t = 0; t < s->nt; t++) {
        if (!pa_check_tok(t, s->nt))
            continue;
        memcpy(gt + row * qd, yt + t * qd, (size_t)qd * 4);
        memcpy(gf + row * qd, yf + t * qd, (size_t)qd * 4);
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
            double *o = ref + row * qd + (int64_t)h * s->hd;
            for (int i = 0; i < s->hd; i++)
                o[i] = 0;
            for (int64_t r = 0; r < nr; r++)
                for (int i = 0; i < s->hd; i++)
                    o[i] += sc[r] * vc[r * kvd + e0 + i];
            for (int i = 0; i < s->hd; i++)
                o[i] /= sum;
        }
        row++;
    }
    char name[160];
    snprintf(name, sizeof name, "preattn %-4s heads %d/%d hd %d n_past %lld nt %lld", mf_type_name(s->kv_type),
             s->n_head, s->n_head_kv, s->hd, (long long)s->n_past, (long long)s->nt);
    char note[48];
    snprintf(note, sizeof note, "(%lld of %lld tokens vs f64)", (long long)n_chk, (long long)s->nt);
    result(name, rel_err(gt, ref, n_chk * qd), PA_TOL, count_nan(yt, nq), note);
    char sub[200];
    snprintf(sub, sizeof sub, "%s [simt flash]", name);
    result(sub, rel_err(gf, ref, n_chk * qd), 1e-4, count_nan(yf, nq), note);
    /* the new kernel against the old over every element */
    double *fd = malloc((size_t)nq * sizeof *fd);
    for (int64_t i = 0; i < nq; i++)
        fd[i] = yf[i];
    snprintf(sub, sizeof sub, "%s vs simt flash", name);
    result(sub, rel_err(yt, fd, nq), PA_TOL, count_nan(yt, nq), NULL);
    if (yi) { /* in place: the same kernel on the same data, bit for bit */
        snprintf(sub, sizeof sub, "%s [in-place] vs poisoned out", name);
        result(sub, rel_err_f(yi, yt, nq), 0.0, count_nan(yi, nq), NULL);
    }
    free(fd);
    free(k);
    free(v);
    free(q);
    free(kc);
    free(vc);
    free(yt);
    free(yi);
    free(yf);
    free(ref);
    free(sc);
    free(gt);
    free(gf);
    dev_free(kv.k);
    dev_free(kv.v);
    mf_graph_free(&g);
}

/* Family preattn: GQA 14/2/64 (qwen2 0.5B), 28/4/128 (7B), 32/8/128 (qwen3
 * 4B) x nt {9, 64, 65, 513} x n_past {0, 37, 700} x every KV type (small:
 * the first two shapes, nt {9, 65}, n_past {0, 37}), in place at nt 65; the
 * 7B shape at nt 2048, n_past 4096 unless small. */
static void run_preattn(void) {
    const uint32_t kvt[] = {MF_TYPE_F32, MF_TYPE_F16, MF_TYPE_Q8_0};
    const int32_t shapes[3][3] = {{14, 2, 64}, {28, 4, 128}, {32, 8, 128}};
    const int64_t nts[] = {9, 65, 64, 513}, pasts[] = {0, 37, 700};
    const int n_nt = small ? 2 : 4, n_pa = small ? 2 : 3, n_sh = small ? 2 : 3;
    for (int i = 0; i < 3; i++)
        for (int sh = 0; sh < n_sh; sh++)
            for (int p = 0; p < n_pa; p++)
                for (int k = 0; k < n_nt; k++)
                    test_preattn(&(attn_spec){shapes[sh][0], shapes[sh][1], shapes[sh][2], pasts[p], nts[k], kvt[i]},
                                 nts[k] == 65);
    for (int i = 0; !small && i < 3; i++)
        test_preattn(&(attn_spec){28, 4, 128, 4096, 2048, kvt[i]}, false);
}

/* ---- int8 decode GEMV v3 vs v1 (family "gemv") -------------------------------------------- */

/* The shapes of family gemv (registered before the backend exists). */
typedef struct gv_case {
    uint32_t type;
    int64_t n_in, n_out;
} gv_case;

static int gv_cases(gv_case *c) {
    static const uint32_t qt[] = {MF_TYPE_Q4_0, MF_TYPE_Q4_1, MF_TYPE_Q5_0, MF_TYPE_Q5_1, MF_TYPE_Q8_0,
                                  MF_TYPE_Q2_K, MF_TYPE_Q3_K, MF_TYPE_Q4_K, MF_TYPE_Q5_K, MF_TYPE_Q6_K};
    int n = 0;
    for (int i = 0; i < 10; i++) { /* every type: an odd row count (a half-empty row pair), long rows */
        c[n++] = (gv_case){qt[i], kq(qt[i]) ? 3584 : 896, small ? 97 : 899};
        c[n++] = (gv_case){qt[i], kq(qt[i]) ? (small ? 3584 : 18944) : 4864, 128};
    }
    if (small)
        return n;
    /* qwen2 0.5B (Q4_0 / Q8_0): Wo, k/v, down, gate/up */
    for (int i = 0; i < 2; i++) {
        const uint32_t t = i ? MF_TYPE_Q8_0 : MF_TYPE_Q4_0;
        c[n++] = (gv_case){t, 896, 896};
        c[n++] = (gv_case){t, 896, 128};
        c[n++] = (gv_case){t, 4864, 896};
        c[n++] = (gv_case){t, 896, 4864};
    }
    c[n++] = (gv_case){MF_TYPE_Q8_0, 896, 151936}; /* 0.5B lm_head */
    /* qwen2 7B: Wo / q, k/v, down, gate/up for the four types of the issue's table */
    static const uint32_t bt[] = {MF_TYPE_Q4_0, MF_TYPE_Q4_K, MF_TYPE_Q6_K, MF_TYPE_Q8_0};
    for (int i = 0; i < 4; i++) {
        c[n++] = (gv_case){bt[i], 3584, 3584};
        c[n++] = (gv_case){bt[i], 3584, 512};
        c[n++] = (gv_case){bt[i], 18944, 3584};
        c[n++] = (gv_case){bt[i], 3584, 18944};
    }
    c[n++] = (gv_case){MF_TYPE_Q6_K, 3584, 152064}; /* 7B lm_head (Q4_K_M) */
    return n;
}

static void gemv_weights(void) {
    gv_case c[64];
    const int n = gv_cases(c);
    for (int i = 0; i < n; i++) {
        char wn[64];
        mm_name(wn, sizeof wn, &(mm_spec){c[i].type, c[i].n_in, c[i].n_out, false});
        add_weight(wn, c[i].type, c[i].n_in, c[i].n_out);
    }
    add_f32("bias.899", 899, 0.5f, 0.0f);
}

/* sum_k w[k] x[k] in double, and in *bound what the int8 GEMV may differ
 * from it: per 32-element unit the activation rounding (amax / 254 per
 * element) times sum |w|, plus 1e-5 of sum |w x| for f32 accumulation. */
static double int8_dot(const double *w, const float *x, int64_t n, double *bound) {
    double acc = 0, bd = 1e-6, mag = 0;
    for (int64_t u = 0; u < n / 32; u++) {
        double amax = 0, wabs = 0;
        for (int l = 0; l < 32; l++) {
            const int64_t k = 32 * u + l;
            acc += w[k] * x[k];
            amax = fmax(amax, fabs(x[k]));
            wabs += fabs(w[k]);
            mag += fabs(w[k] * x[k]);
        }
        bd += amax / 254.0 * wabs;
    }
    *bound = bd + 1e-5 * mag;
    return acc;
}

/* One int8-GEMV matmul node (matmul mode -2) at nt tokens on three paths: v3
 * (default), v3 with PDL launches, v1 (the test hook of
 * MINFER_CUDA_GEMV_V1). Each against float64 on 40 sampled rows (first,
 * last, random; all tokens) within 3e-2 and within the int8 rounding bound
 * of every sampled output (the matmul family's), every output NaN-free
 * (poisoned), and v3 against v1 on every output within 1e-5 (the same int8
 * arithmetic per unit; only the f32 summation order differs). */
static void test_gemv(const gv_case *c, int64_t nt, bool bias) {
    char wn[64], name[160], sub[200];
    const mm_spec s = {c->type, c->n_in, c->n_out, false};
    mm_name(wn, sizeof wn, &s);
    const bool has_b = bias && c->n_out == 899;
    mf_graph g;
    graph_new(&g, 0, 0);
    int32_t xi = ext(&g, c->n_in, nt);
    int32_t mi = mf_g_matmul(&g, xi, wn, c->type, has_b ? "bias.899" : NULL, c->n_in, c->n_out);
    float *x = rand_vec(c->n_in * nt, 1.0f);
    for (int64_t i = 0; i < c->n_in * nt; i += 97) /* a few large activations: units of mixed scale */
        x[i] *= 8.0f;
    int32_t in = dev_put(x, (size_t)(c->n_in * nt) * 4);
    enum { NS = 40 };
    int64_t rows[NS];
    for (int i = 0; i < NS; i++)
        rows[i] = i == 0 ? 0 : i == 1 ? c->n_out - 1 : (int64_t)(next_u64() % (uint64_t)c->n_out);
    double *wr = malloc((size_t)c->n_in * sizeof *wr);
    double *ref = malloc((size_t)(NS * nt) * sizeof *ref), *bound = malloc((size_t)(NS * nt) * sizeof *bound);
    for (int i = 0; i < NS; i++) {
        ref_row(wn, rows[i], wr);
        const double b = has_b ? wf32("bias.899")[rows[i]] : 0.0;
        for (int64_t t = 0; t < nt; t++) {
            ref[i * nt + t] = int8_dot(wr, x + t * c->n_in, c->n_in, &bound[i * nt + t]) + b;
        }
    }
    snprintf(name, sizeof name, "gemv %-5s %5lldx%-6lld nt %lld%s", mf_type_name(c->type), (long long)c->n_in,
             (long long)c->n_out, (long long)nt, has_b ? " +bias" : "");
    const int64_t ny = c->n_out * nt;
    float *ys[5];
    static const char *const vname[5] = {"v3", "v3+pdl", "v1", "v4 u1", "v4 u2"};
    float *got = malloc((size_t)(NS * nt) * sizeof *got);
    const int nv = nt == 1 ? 5 : 3; /* v4 takes one-token GEMVs only */
    for (int v = 0; v < nv; v++) {
        int32_t out = dev_poison((size_t)ny * 4);
        mf_exec_args a = args(0, nt, 1, MF_TYPE_F32);
        t_matmul_mode(be, -2);
        t_gemv_v1(be, v == 2);
        t_gemv_v4(be, v < 3 ? 0 : 1 << (v - 3));
        t_pdl(v == 1 || v >= 3);
        run_ok(&g, mi, &in, out, (mf_kv_pair){-1, -1}, &a);
        t_pdl(tune0.pdl != 0);
        t_reset_gemv(be);
        t_matmul_mode(be, 0);
        ys[v] = dev_get(out, (size_t)ny * 4);
        dev_free(out);
        double worst = 0;
        for (int i = 0; i < NS; i++)
            for (int64_t t = 0; t < nt; t++) {
                got[i * nt + t] = ys[v][t * c->n_out + rows[i]];
                worst = fmax(worst, fabs((double)got[i * nt + t] - ref[i * nt + t]) / bound[i * nt + t]);
            }
        snprintf(sub, sizeof sub, "%s [%s]", name, vname[v]);
        /* the x8 activations widen their units' int8 step: norm-wise the
         * error reaches ~1.4e-2 on v1 and v3 alike (H200, PERF.md entry 11);
         * the per-output rounding bound below is the exact check */
        result(sub, rel_err(got, ref, NS * nt), 3e-2, count_nan(ys[v], ny), NULL);
        char detail[64];
        snprintf(detail, sizeof detail, "worst |err| / bound %.3f", worst);
        snprintf(sub, sizeof sub, "%s [%s]: int8 bound", name, vname[v]);
        check_true(sub, worst <= 1.0, detail);
    }
    snprintf(sub, sizeof sub, "%s [v3 vs v1]", name);
    result(sub, rel_err_f(ys[0], ys[2], ny), 1e-5, count_nan(ys[0], ny), NULL);
    snprintf(sub, sizeof sub, "%s [v3+pdl vs v3]", name);
    result(sub, rel_err_f(ys[1], ys[0], ny), 1e-6, count_nan(ys[1], ny), NULL);
    for (int v = 3; v < nv; v++) { /* the same int8 products per 16-element half, summed in another order */
        snprintf(sub, sizeof sub, "%s [%s vs v3]", name, vname[v]);
        result(sub, rel_err_f(ys[v], ys[0], ny), 1e-5, count_nan(ys[v], ny), NULL);
    }
    /* the v4 early-load instances (MINFER_CUDA_GEMV_V4_EARLY forced off and
     * on): the same expressions, so the same bits */
    for (int u = 1; u <= 2 && nt == 1; u++) {
        float *yo[2];
        for (int on = 0; on < 2; on++) {
            int32_t out = dev_poison((size_t)ny * 4);
            mf_exec_args a = args(0, nt, 1, MF_TYPE_F32);
            t_matmul_mode(be, -2);
            t_gemv_v4(be, u);
            t_gemv_v4_early(on);
            run_ok(&g, mi, &in, out, (mf_kv_pair){-1, -1}, &a);
            t_gemv_v4_early((int)tune0.v4_early);
            t_reset_gemv(be);
            t_matmul_mode(be, 0);
            yo[on] = dev_get(out, (size_t)ny * 4);
            dev_free(out);
        }
        snprintf(sub, sizeof sub, "%s [v4 u%d early-load off vs on, bitwise]", name, u);
        check_true(sub, memcmp(yo[0], yo[1], (size_t)ny * 4) == 0 && count_nan(yo[0], ny) == 0, NULL);
        free(yo[0]);
        free(yo[1]);
    }
    for (int v = 0; v < nv; v++)
        free(ys[v]);
    free(got); free(wr); free(ref); free(bound); free(x);
    dev_free(in);
    mf_graph_free(&g);
}

/* The v4 rule (mf_cu_q8v4_u) at the shapes its comment cites: Q4_K takes
 * two slices in flight only from 32 MiB of weight (7B gate+up, down), one
 * below (7B q+k+v and o, 4B gate+up and down); the other types one; a
 * forced U is kept; mode 0 is off. A rule that drifted from the measured
 * table fails here. */
static void gemv_rule(void) {
    static const struct {
        int mode;
        uint32_t t;
        int64_t rows, n_in;
        int want;
    } r[] = {
        {-1, MF_TYPE_Q4_K, 2 * 18944, 3584, 2}, {-1, MF_TYPE_Q4_K, 3584, 18944, 2},
        {-1, MF_TYPE_Q4_K, 4608, 3584, 1},      {-1, MF_TYPE_Q4_K, 3584, 3584, 1},
        {-1, MF_TYPE_Q4_K, 2 * 9728, 2560, 1},  {-1, MF_TYPE_Q4_K, 2560, 9728, 1},
        {-1, MF_TYPE_Q4_0, 2 * 18944, 3584, 1}, {-1, MF_TYPE_Q8_0, 151936, 896, 1},
        {2, MF_TYPE_Q4_0, 896, 896, 2},         {0, MF_TYPE_Q4_K, 2 * 18944, 3584, 0},
    };
    t_gemv_v4_big(32); /* the default threshold, whatever the environment says */
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
        char name[120];
        const mf_cu_gemv_tune g = gt_of(r[i].mode);
        const int got = mf_cu_q8v4_u(&g, r[i].t, r[i].rows, r[i].n_in);
        snprintf(name, sizeof name, "gemv v4 rule mode %d %s %lld x %lld -> u%d", r[i].mode, mf_type_name(r[i].t),
                 (long long)r[i].rows, (long long)r[i].n_in, r[i].want);
        check_true(name, got == r[i].want, NULL);
    }
    t_gemv_v4_big((int)tune0.v4_big_mib);
}

static void gemv_family(void) {
    gemv_rule();
    gv_case c[64];
    const int n = gv_cases(c);
    static const int64_t nts[] = {1, 2, 5, 8};
    for (int i = 0; i < n; i++) {
        const bool first = i < 20; /* the per-type cases: every token count */
        for (int k = 0; k < 4; k++)
            if (first || k == 0 || (k == 3 && c[i].n_out <= 18944))
                test_gemv(&c[i], nts[k], k == 1);
    }
    /* the multi-weight launches (FUSED_FFN's gate+up+SwiGLU, FUSED_QKV with a
     * Q6_K V: two launches, FUSE_ADD's residual epilogue) on v3 and v1 */
    const qkv_spec q7 = {MF_TYPE_Q4_K, 3584, 28, 4, 128, true, false, MF_ROPE_NEOX, MF_TYPE_Q6_K};
    const qkv_spec q05 = {MF_TYPE_Q8_0, 896, 14, 2, 64, true, false, MF_ROPE_NEOX, 0};
    for (int v = 0; v < 3; v++) { /* v3, v1, v4 (2 slices in flight) */
        t_gemv_v1(be, v == 1);
        t_gemv_v4(be, v == 2 ? 2 : 0);
        test_qkv(&q7, 1, 37, false, MF_TYPE_F32);
        test_qkv(&q05, 5, 3, false, MF_TYPE_F32);
        test_ffn(MF_TYPE_Q4_0, MF_TYPE_Q4_0, 896, small ? 256 : 4864, 1);
        test_ffn(MF_TYPE_Q4_0, MF_TYPE_Q4_0, 896, small ? 256 : 4864, 5);
        test_ffn(MF_TYPE_Q6_K, MF_TYPE_Q6_K, 2560, small ? 256 : 9728, 1);
        test_fuse_add(MF_TYPE_Q4_K, 3584, 3584, 1);
        t_reset_gemv(be);
    }
    /* the residual epilogue of the E instances (its loads at the group's
     * start), forced on and off (the auto rule gives them to <= 4 MiB); the
     * random stream is put back after, so the families after this one test
     * the same data as before these cases existed */
    const uint64_t rng0 = rng;
    for (int on = 0; on < 2; on++) {
        t_gemv_v4(be, 1);
        t_gemv_v4_early(on);
        test_fuse_add(MF_TYPE_Q4_0, 896, 896, 1);
        test_fuse_add(MF_TYPE_Q6_K, 2560, small ? 256 : 9728, 1);
    }
    t_gemv_v4_early((int)tune0.v4_early);
    t_reset_gemv(be);
    rng = rng0;
}

/* ---- the v4 GEMV's Q6_K slice decoder (family "q6k") ------------------------------------- */

/* The shapes of family q6k: the 7B lm_head width (a few thousand rows, odd),
 * the 7B down / v and qwen3-4B down / v, 4864 -> 896 (19 super-blocks a row:
 * rows alternate 4- and 2-byte alignment), one super-block a row (lanes past
 * the row's 8 slices), 5 super-blocks. */
typedef struct q6k_case {
    int64_t n_in, n_out;
} q6k_case;

/* A v4 decoder under test: the weight type, its switch (setter, variable,
 * default) and the family name (the shape, so that another type's decoder
 * can reuse family q6k's cases, tests and bench). */
typedef struct v4dec {
    uint32_t type;
    void (*set)(int u); /* through the tuning string, so a later retune keeps it */
    const char *tag;
    int def;
} v4dec;
static const v4dec dec_q6k = {MF_TYPE_Q6_K, t_gemv_v4_q6k, "q6k", 3};

static void dec_reset(const v4dec *d) {
    d->set(d->def);
}

static int q6k_cases(q6k_case *c) {
    int n = 0;
    c[n++] = (q6k_case){3584, small ? 517 : 4099};
    c[n++] = (q6k_case){small ? 3584 : 18944, small ? 64 : 3584};
    c[n++] = (q6k_case){3584, 512};
    c[n++] = (q6k_case){4864, small ? 97 : 896};
    c[n++] = (q6k_case){256, 97};
    c[n++] = (q6k_case){1280, 33};
    if (!small) {
        c[n++] = (q6k_case){9728, 2560};
        c[n++] = (q6k_case){2560, 1024};
    }
    return n;
}

static void q6k_name(char *buf, size_t n, uint32_t t, int64_t n_in, int64_t n_out) {
    mm_name(buf, n, &(mm_spec){t, n_in, n_out, false});
}

static void q6k_weights(const v4dec *d) {
    q6k_case c[16];
    const int n = q6k_cases(c);
    char wn[64];
    for (int i = 0; i < n; i++) {
        q6k_name(wn, sizeof wn, d->type, c[i].n_in, c[i].n_out);
        add_weight(wn, d->type, c[i].n_in, c[i].n_out);
    }
    if (!small) { /* the 7B lm_head itself: the rule's vocab-wide arm */
        q6k_name(wn, sizeof wn, d->type, 3584, 152064);
        add_weight(wn, d->type, 3584, 152064);
    }
}

/* One Q6_K MATMUL node at nt 1 (int8 GEMV forced, PDL on) on five paths:
 * v4 with the unit decoder (1 and 2 slices in flight), v4 with the slice
 * decoder (mf_cu_set_gemv_v4_q6k, 1 and 2), and the auto rule with the
 * switch at 1 and 2 (MINFER_CUDA_GEMV_V4_Q6K=1 / 2: must pick the slice
 * decoder with that many slices: bitwise the forced runs), and at 3 (auto:
 * two slices for rows of >= 4096 in a weight of <= 4 MiB, else one; bitwise
 * the forced run it names). Each against float64 on sampled rows
 * (first, last, random) within 3e-2 and the int8 rounding bound of each
 * sampled output (family gemv's), NaN-free everywhere (poisoned output);
 * slice vs unit decoder over every output within 1e-5 (the same int8
 * products per 8 elements; the -32 offset through the activation half sums
 * and the f32 summation order differ). */
static void test_q6k(const v4dec *d, int64_t n_in, int64_t n_out) {
    char wn[64], name[160], sub[220];
    q6k_name(wn, sizeof wn, d->type, n_in, n_out);
    mf_graph g;
    graph_new(&g, 0, 0);
    int32_t xi = ext(&g, n_in, 1);
    int32_t mi = mf_g_matmul(&g, xi, wn, d->type, NULL, n_in, n_out);
    float *x = rand_vec(n_in, 1.0f);
    for (int64_t i = 0; i < n_in; i += 97) /* a few large activations: units of mixed scale */
        x[i] *= 8.0f;
    int32_t in = dev_put(x, (size_t)n_in * 4);
    enum { NS = 48, NV = 7 };
    int64_t rows[NS];
    for (int i = 0; i < NS; i++)
        rows[i] = i == 0 ? 0 : i == 1 ? n_out - 1 : i == 2 ? n_out / 2 : (int64_t)(next_u64() % (uint64_t)n_out);
    double *wr = malloc((size_t)n_in * sizeof *wr), ref[NS], bound[NS];
    for (int i = 0; i < NS; i++) {
        ref_row(wn, rows[i], wr);
        ref[i] = int8_dot(wr, x, n_in, &bound[i]);
    }
    snprintf(name, sizeof name, "%s %5lldx%-6lld", d->tag, (long long)n_in, (long long)n_out);
    static const char *const vname[NV] = {"v4 unit u1", "v4 unit u2", "v4 slice u1",
                                          "v4 slice u2", "auto+slice 1", "auto+slice 2", "auto+slice 3"};
    float *ys[NV], got[NS];
    for (int v = 0; v < NV; v++) {
        int32_t out = dev_poison((size_t)n_out * 4);
        mf_exec_args a = args(0, 1, 1, MF_TYPE_F32);
        t_matmul_mode(be, -2);
        t_gemv_v1(be, 0);
        t_gemv_v4(be, v >= 4 ? -1 : 1 + (v & 1));
        d->set(v < 2 ? 0 : v < 4 ? 1 : v - 3);
        t_pdl(1);
        run_ok(&g, mi, &in, out, (mf_kv_pair){-1, -1}, &a);
        t_pdl(tune0.pdl != 0);
        dec_reset(d);
        t_reset_gemv(be);
        t_matmul_mode(be, 0);
        ys[v] = dev_get(out, (size_t)n_out * 4);
        dev_free(out);
        double worst = 0;
        for (int i = 0; i < NS; i++) {
            got[i] = ys[v][rows[i]];
            worst = fmax(worst, fabs((double)got[i] - ref[i]) / bound[i]);
        }
        snprintf(sub, sizeof sub, "%s [%s]", name, vname[v]);
        result(sub, rel_err(got, ref, NS), 3e-2, count_nan(ys[v], n_out), NULL);
        char detail[64];
        snprintf(detail, sizeof detail, "worst |err| / bound %.3f", worst);
        snprintf(sub, sizeof sub, "%s [%s]: int8 bound", name, vname[v]);
        check_true(sub, worst <= 1.0, detail);
    }
    for (int v = 2; v < 4; v++) {
        snprintf(sub, sizeof sub, "%s [%s vs %s]", name, vname[v], vname[v - 2]);
        result(sub, rel_err_f(ys[v], ys[v - 2], n_out), 1e-5, count_nan(ys[v], n_out), NULL);
    }
    /* switch 3: the rule's own size test, restated (Q6_K: 210 bytes a 256) */
    const bool two = n_in >= 4096 && (double)n_out * (double)(n_in / 256) * 210.0 <= 4.0 * 1024 * 1024;
    for (int v = 4; v < NV; v++) {
        const int want = v < 6 ? v - 2 : two ? 3 : 2;
        snprintf(sub, sizeof sub, "%s [%s == %s]", name, vname[v], vname[want]);
        check_true(sub, memcmp(ys[v], ys[want], (size_t)n_out * 4) == 0, "bitwise: the rule takes the slice decoder");
    }
    for (int v = 0; v < NV; v++)
        free(ys[v]);
    free(wr);
    dev_free(in);
    mf_graph_free(&g);
}

static void q6k_family(const v4dec *d) {
    q6k_case c[16];
    const int n = q6k_cases(c);
    for (int i = 0; i < n; i++)
        test_q6k(d, c[i].n_in, c[i].n_out);
    if (!small)
        test_q6k(d, 3584, 152064);
    /* the multi-weight launches on the new decoder: FUSED_FFN gate+up+SwiGLU
     * (2560 -> 9728) and FUSED_QKV with the decoder's type for V */
    const qkv_spec q7 = {MF_TYPE_Q4_K, 3584, 28, 4, 128, true, false, MF_ROPE_NEOX, d->type};
    d->set(1);
    for (int u = 1; u <= 2; u++) {
        t_gemv_v4(be, u);
        test_ffn(d->type, d->type, 2560, small ? 256 : 9728, 1);
        test_qkv(&q7, 1, 37, false, MF_TYPE_F32);
        t_reset_gemv(be);
    }
    dec_reset(d);
}

/* ---- device buffers for the launcher cases; MATMUL + ADD in a replayed graph (family "graph") -- */

static void *ds_alloc(size_t n, int poison) {
    void *p = NULL;
    if (cudaMalloc(&p, n ? n : 4) != cudaSuccess || cudaMemset(p, poison, n ? n : 4) != cudaSuccess) {
        fprintf(stderr, "test_cuda_ops: cudaMalloc of %zu bytes failed\n", n);
        exit(1);
    }
    return p;
}

static void *ds_put(const void *h, size_t n) {
    void *p = ds_alloc(n, 0);
    cudaMemcpy(p, h, n, cudaMemcpyHostToDevice);
    return p;
}

static void *ds_get(const void *d, size_t n) {
    void *h = malloc(n ? n : 4);
    cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost);
    return h;
}

static void ds_sync(const char *what, cudaError_t e, cudaStream_t st) {
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(st);
    if (e != cudaSuccess) {
        fprintf(stderr, "test_cuda_ops: %s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

/* A decode forward of MATMUL (Wo of the 0.5B) + residual ADD written in
 * place over the residual (as the model's allocator does), run through
 * begin_forward / execute_node / end_forward for 6 steps with CUDA graphs:
 * with FUSE_ADD the fused GEMV must have been launched (mf_cuda_fuse_stats:
 * the plain first step and the capture), the graph replayed, and every
 * step's output match float64 (int8 tier, 1e-2) and the unfused run (1e-5). */
static void ds_fuse_add_graph(void) {
    const int64_t d = 896;
    const char *wn = "mm.q4_0.896x896";
    /* one graph per run: a graph the backend captured before would replay
     * (same graph, same calls) instead of being launched anew */
    mf_graph gs[2];
    int32_t mi = 0, ai = 0;
    for (int k = 0; k < 2; k++) {
        graph_new(&gs[k], 0, 0);
        const int32_t xi = ext(&gs[k], d, 1), ri = ext(&gs[k], d, 1);
        mi = mf_g_matmul(&gs[k], xi, wn, MF_TYPE_Q4_0, NULL, d, d);
        ai = mf_g_add(&gs[k], ri, mi);
    }
    enum { STEPS = 6 };
    float *xs = rand_vec(d * STEPS, 1.0f), *rs = rand_vec(d * STEPS, 1.0f);
    double *ref = malloc((size_t)(d * STEPS) * sizeof *ref);
    ref_matmul(wn, xs, d, d, STEPS, NULL, ref); /* the STEPS inputs as tokens */
    for (int64_t i = 0; i < d * STEPS; i++)
        ref[i] += rs[i];
    float *y[2];
    int64_t adds[2], reps[2];
    for (int on = 1; on >= 0; on--) {
        const int32_t bx = dev_put(NULL, (size_t)d * 4), br = dev_put(NULL, (size_t)d * 4);
        const int32_t bm = dev_poison((size_t)d * 4);
        y[on] = malloc((size_t)(d * STEPS) * 4);
        const mf_graph *g = &gs[on];
        t_fuse_add(be, on);
        mf_cuda_set_graphs(be, true);
        int64_t a0, n0, c0, r0, a1, n1, c1, r1;
        mf_cuda_fuse_stats(be, &a0, &n0);
        mf_cuda_graph_stats(be, &c0, &r0);
        mf_error e;
        for (int s = 0; s < STEPS; s++) {
            mf_exec_args a = args(10 + s, 1, 64, MF_TYPE_F32);
            if (mf_cuda_begin_forward(be, g, &a, &e) ||
                be->ops->write_host(be, bx, 0, xs + s * d, (size_t)d * 4, &e) ||
                be->ops->write_host(be, br, 0, rs + s * d, (size_t)d * 4, &e) ||
                mf_cuda_execute_node(be, g, mi, &bx, bm, (mf_kv_pair){-1, -1}, &a, &e) ||
                mf_cuda_execute_node(be, g, ai, (int32_t[]){br, bm}, br, (mf_kv_pair){-1, -1}, &a, &e) ||
                mf_cuda_end_forward(be, g, &a, &e) || be->ops->synchronize(be, &e) ||
                be->ops->read_host(be, br, 0, y[on] + s * d, (size_t)d * 4, &e))
                die("graph fuse_add step", &e);
        }
        mf_cuda_fuse_stats(be, &a1, &n1);
        mf_cuda_graph_stats(be, &c1, &r1);
        adds[on] = a1 - a0;
        reps[on] = r1 - r0;
        dev_free(bx); dev_free(br); dev_free(bm);
    }
    t_fuse_add(be, tune0.fuse_add != 0);
    mf_cuda_set_graphs(be, !false);
    char det[120];
    snprintf(det, sizeof det, "(%lld fused launches, %lld replays; off: %lld, %lld)", (long long)adds[1],
             (long long)reps[1], (long long)adds[0], (long long)reps[0]);
    check_true("graph fuse_add: fused GEMV launched and replayed",
               adds[1] >= 2 && adds[0] == 0 && reps[1] >= STEPS - 3 && reps[0] >= STEPS - 3, det);
    /* ref_matmul took the steps as tokens: rows are per step already */
    result("graph fuse_add: 6 steps vs float64", rel_err(y[1], ref, d * STEPS), 1e-2,
           count_nan(y[1], d * STEPS), NULL);
    result("graph fuse_add: fused vs unfused", rel_err_f(y[1], y[0], d * STEPS), 1e-5,
           count_nan(y[0], d * STEPS), NULL);
    free(y[0]); free(y[1]); free(xs); free(rs); free(ref);
    mf_graph_free(&gs[0]);
    mf_graph_free(&gs[1]);
}

/* ---- MINFER_CUDA_ATTN_ONE: split-KV decode attention as one kernel (family "attnone") ------ */

/* A device cache of n_ctx rows of kv_type, its first `rows` random
 * (stored as the backend stores them: the host quantizer), the rest 0. */
/* A device KV region of n_ctx rows of kvd: rows < `rows` from src (in
 * kvt), the rest bytes `fill` (0, or 0xff: NaN rows that show an over-read). */
static void *kv_cache_dev(uint32_t kvt, const float *src, int64_t rows, int64_t n_ctx, int64_t kvd, int fill) {
    const size_t rb = mf_type_row_size(kvt, kvd);
    uint8_t *h = malloc(rb * (size_t)n_ctx);
    memset(h, fill, rb * (size_t)n_ctx);
    if (kvt == MF_TYPE_F32)
        memcpy(h, src, (size_t)(kvd * rows) * 4);
    else
        mf_quantize_rows(kvt, src, h, rows, kvd);
    void *d = ds_put(h, rb * (size_t)n_ctx);
    free(h);
    return d;
}

/* A zero-padded KV region of random rows (scale). */
static void *ao_cache(uint32_t kvt, int64_t rows, int64_t n_ctx, int64_t kvd, float scale) {
    float *f = rand_vec(kvd * rows > 0 ? kvd * rows : 1, scale); /* >= 1: gcc sees it written */
    void *d = kv_cache_dev(kvt, f, rows, n_ctx, kvd, 0);
    free(f);
    return d;
}

/* Variant v of a launcher test: in place (q = out, over a copy of hq) or
 * out poisoned (NaN / 3.4e38 by v, so an unwritten float shows); the q8
 * output poisoned per v. */
static void ao_variant_out(mf_cu_attn_args *b, bool in_place, int v, const float *hq, size_t ob, void *q8o,
                           size_t q8b) {
    if (in_place) {
        b->q = b->out;
        cudaMemcpy(b->out, hq, ob, cudaMemcpyHostToDevice);
    } else {
        cudaMemset(b->out, v % 2 ? 0x7f : 0xff, ob);
    }
    cudaMemset(q8o, 0x35 + 16 * v, q8b);
}

/* After a variant's launch: its out (n floats) bitwise ref, its NaNs added
 * to *n_nan, and with b->q8out the q8 output's first q8used bytes bitwise
 * ref8; *same / *q8same cleared on a difference. */
static void ao_variant_cmp(const mf_cu_attn_args *b, size_t ob, int64_t n, const float *ref, const void *q8o,
                           size_t q8used, const void *ref8, int64_t *n_nan, bool *same, bool *q8same) {
    float *yn = ds_get(b->out, ob);
    *n_nan += count_nan(yn, n);
    *same = *same && !memcmp(yn, ref, ob);
    if (b->q8out) {
        uint8_t *hn = ds_get(q8o, q8used);
        *q8same = *q8same && !memcmp(hn, ref8, q8used);
        free(hn);
    }
    free(yn);
}

/* One shape / cache type / depth / token count, n_ctx wide (4224 rows or
 * more: many splits, mostly empty at small depth). The two-kernel decode
 * (split + combine) and the quantize kernel on its output give the
 * reference; then the one-kernel launch (a.cnt, a.q8out) five times on
 * outputs poisoned differently each time: 3 identical launches in a row
 * (a counter left non-zero would make a later launch combine early or
 * never: garbage or poison), one with n_past from n_past_dev (graph
 * replay), one with no q8out. Each: out
 * bitwise the two-kernel out, q8out bitwise the quantize kernel's bytes
 * (q, d, half sums), every counter back at 0. At nt 3 also in place (out
 * == q). */
static void ao_case(int32_t nh, int32_t nkv, int32_t hd, int64_t n_past, int64_t nt, uint32_t kvt, cudaStream_t st) {
    const int64_t qd = (int64_t)nh * hd, kvd = (int64_t)nkv * hd, n_kv = n_past + nt;
    const int32_t n_ctx = (int32_t)(n_kv > 4224 ? n_kv + 64 : 4224);
    void *kc = ao_cache(kvt, n_kv, n_ctx, kvd, 2.0f), *vc = ao_cache(kvt, n_kv, n_ctx, kvd, 1.0f);
    float *hq = rand_vec(qd * nt, 2.0f);
    /* q8 bytes compared: the int8 q, then a float d and an int32 of half sums a unit */
    const size_t ob = (size_t)(qd * nt) * 4, q8b = mf_cu_q8_bytes(qd, nt), q8used = (size_t)(qd * nt) * 5 / 4;
    float *q = ds_put(hq, ob);
    mf_cu_attn_args a = {.q = q, .k = kc, .v = vc, .kv_type = kvt, .nt = nt, .n_past = n_past, .n_head = nh,
                         .n_head_kv = nkv, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd), .n_ctx = n_ctx};
    a.part = ds_alloc(mf_cu_attn_decode_bytes(&a), 0xff);
    a.out = ds_alloc(ob, 0xff);
    ds_sync("attnone two-kernel", mf_cu_attn_decode(&a, st), st);
    float *yo = ds_get(a.out, ob);
    void *q8r = ds_alloc(q8b, 0);
    ds_sync("attnone quantize", mf_cu_q8_quant_rows(a.out, NULL, 0.0f, 0, qd, nt, q8r, tune0.pdl, st), st);
    uint8_t *hr = ds_get(q8r, q8used);
    int32_t *cnt = ds_alloc((size_t)(nt * nkv) * 4, 0);
    const int32_t np32 = (int32_t)n_past;
    int32_t *dp = ds_put(&np32, 4);
    void *q8o = ds_alloc(q8b, 0);
    bool out_ok = true, q8_ok = true, cnt_ok = true;
    int64_t n_nan = 0;
    for (int v = 0; v < 5 + (nt == 3); v++) {
        mf_cu_attn_args b = a;
        b.cnt = cnt;
        b.q8out = v == 4 ? NULL : q8o;
        if (v == 3) {
            b.n_past_dev = dp;
            b.n_past = 0; /* must be ignored */
        }
        ao_variant_out(&b, v == 5, v, hq, ob, q8o, q8b);
        ds_sync("attnone one-kernel", mf_cu_attn_decode(&b, st), st);
        ao_variant_cmp(&b, ob, qd * nt, yo, q8o, q8used, hr, &n_nan, &out_ok, &q8_ok);
        int32_t *hc = ds_get(cnt, (size_t)(nt * nkv) * 4);
        for (int64_t i = 0; i < nt * nkv; i++)
            cnt_ok = cnt_ok && hc[i] == 0;
        free(hc);
    }
    char name[160], sub[220];
    snprintf(name, sizeof name, "attnone %-4s heads %d/%d hd %d n_past %lld nt %lld ctx %d", mf_type_name(kvt), nh, nkv,
             hd, (long long)n_past, (long long)nt, n_ctx);
    snprintf(sub, sizeof sub, "%s: out == two-kernel", name);
    check_true(sub, out_ok && n_nan == 0 && count_nan(yo, qd * nt) == 0, "(bitwise, 5-6 launches, no NaN)");
    snprintf(sub, sizeof sub, "%s: q8out == quantize kernel", name);
    check_true(sub, q8_ok, "(bitwise: q, d, half sums)");
    snprintf(sub, sizeof sub, "%s: counters reset", name);
    check_true(sub, cnt_ok, NULL);
    cudaFree(kc); cudaFree(vc); cudaFree(q); cudaFree(a.part); cudaFree(a.out); cudaFree(q8r); cudaFree(cnt);
    cudaFree(dp); cudaFree(q8o);
    free(hq); free(yo); free(hr);
}

/* The o weights of the attention families' layer tests: <pre>.<type>.<d>x<d>
 * (pre "ao": attnone, "as": attnshort). */
static void ao_wname(char *wn, size_t n, const char *pre, uint32_t t, int64_t d) {
    snprintf(wn, n, "%s.%s.%lldx%lld", pre, mf_type_name(t), (long long)d, (long long)d);
}

/* Q4_0 896 (0.5B), Q4_K 3584 (7B) and, extra > 0, Q4_0 extra x extra. */
static void ao_weights(const char *pre, int64_t extra) {
    char wn[64];
    ao_wname(wn, sizeof wn, pre, MF_TYPE_Q4_0, 896);
    add_weight(wn, MF_TYPE_Q4_0, 896, 896);
    ao_wname(wn, sizeof wn, pre, MF_TYPE_Q4_K, 3584);
    add_weight(wn, MF_TYPE_Q4_K, 3584, 3584);
    if (extra > 0) {
        ao_wname(wn, sizeof wn, pre, MF_TYPE_Q4_0, extra);
        add_weight(wn, MF_TYPE_Q4_0, extra, extra);
    }
}

/* A decode layer's attention tail through the backend: ATTN -> o MATMUL
 * (weight pre's, ao_wname) -> residual ADD. */
typedef struct attn_layer {
    da_fix f;
    int32_t ri, mi, ai; /* residual input, o MATMUL, ADD */
} attn_layer;

static void attn_layer_setup(attn_layer *L, const char *pre, uint32_t wt, int32_t nh, int32_t nkv, int32_t hd,
                           int64_t rows, int64_t nt, int32_t n_ctx, uint32_t kvt) {
    const int64_t qd = (int64_t)nh * hd;
    char wn[64];
    ao_wname(wn, sizeof wn, pre, wt, qd);
    da_setup(&L->f, nh, nkv, hd, rows, nt, n_ctx, kvt);
    L->ri = ext(&L->f.g, qd, nt);
    L->mi = mf_g_matmul(&L->f.g, L->f.at, wn, wt, NULL, qd, qd);
    L->ai = mf_g_add(&L->f.g, L->ri, L->mi);
}

/* ATTN -> o MATMUL -> ADD of the layer on buffers qb / rb into ob (the
 * attention), mb (the MATMUL, deferred into the ADD) and yb; no sync. */
static void attn_layer_exec(attn_layer *L, int32_t qb, int32_t rb, int32_t ob, int32_t mb, int32_t yb,
                          const mf_exec_args *a) {
    mf_error e;
    const int32_t ain[2] = {qb, -1}, aadd[2] = {rb, mb};
    if (mf_cuda_execute_node(be, &L->f.g, L->f.at, ain, ob, L->f.kv, a, &e) ||
        mf_cuda_execute_node(be, &L->f.g, L->mi, &ob, mb, (mf_kv_pair){-1, -1}, a, &e) ||
        mf_cuda_execute_node(be, &L->f.g, L->ai, aadd, yb, (mf_kv_pair){-1, -1}, a, &e))
        die("attention layer (ATTN -> o MATMUL -> ADD)", &e);
}

/* The switches back to what the environment asked for. */
static void attn_switches_default(void) {
    t_attn_short(be, -1);
    t_attn_one(be, -1);
    t_fuse_add(be, tune0.fuse_add != 0);
    t_flash_decode(be, !(tune0.attn_decode == MF_CU_AD_BLOCK));
}

/* One synchronized forward of the layer on fresh buffers for q / r (nb
 * bytes each; the outputs poisoned) with FUSE_ADD and flash decode on and
 * the hooks t_attn_one(one), t_attn_short(shrt): the
 * attention output into *ya and the layer output into *yl (malloc'd);
 * returns how far the x-ready GEMV count (mf_cuda_q8_ready_stats) moved. */
static int64_t attn_layer_run(attn_layer *L, const float *q, const float *r, size_t nb, const mf_exec_args *a,
                              int one, int shrt, float **ya, float **yl, const char *what) {
    const int32_t qb = dev_put(q, nb), rb = dev_put(r, nb), ob = dev_poison(nb), mb = dev_poison(nb),
                  yb = dev_poison(nb);
    mf_error e;
    int64_t c0, c1;
    mf_cuda_q8_ready_stats(be, &c0);
    t_flash_decode(be, true);
    t_fuse_add(be, true);
    t_attn_one(be, one);
    t_attn_short(be, shrt);
    attn_layer_exec(L, qb, rb, ob, mb, yb, a);
    if (be->ops->synchronize(be, &e))
        die(what, &e);
    attn_switches_default();
    mf_cuda_q8_ready_stats(be, &c1);
    *ya = dev_get(ob, nb);
    *yl = dev_get(yb, nb);
    dev_free(qb); dev_free(rb); dev_free(ob); dev_free(mb); dev_free(yb);
    return c1 - c0;
}

/* Through the backend: ATTN -> o MATMUL -> residual ADD (the MATMUL
 * deferred into the ADD: FUSE_ADD on) with MINFER_CUDA_ATTN_ONE off and on
 * (hook mf_cuda_set_attn_one): the attention output and the layer output
 * bitwise equal, and with it on the o GEMV took the attention's q8 (the
 * count of mf_cuda_q8_ready_stats moved by one; off: by none). */
static void ao_node(uint32_t wt, int32_t nh, int32_t nkv, int32_t hd, int64_t n_past, int64_t nt, uint32_t kvt) {
    const int64_t qd = (int64_t)nh * hd, n_kv = n_past + nt;
    const int32_t n_ctx = 4224;
    attn_layer L;
    attn_layer_setup(&L, "ao", wt, nh, nkv, hd, n_kv, nt, n_ctx, kvt);
    float *q = rand_vec(qd * nt, 2.0f), *r = rand_vec(qd * nt, 1.0f);
    float *ya[2], *yl[2];
    int64_t moved[2];
    const mf_exec_args a = args(n_past, nt, n_ctx, kvt);
    for (int on = 0; on < 2; on++) /* short kernel off: on vs off bitwise, the split-KV kernels */
        moved[on] = attn_layer_run(&L, q, r, (size_t)(qd * nt) * 4, &a, on, 0, &ya[on], &yl[on], "attnone node");
    char name[200];
    snprintf(name, sizeof name,
             "attnone node %s cache, o %s %d/%d/%d n_past %lld nt %lld: attn + o GEMV + add on == off",
             mf_type_name(kvt), mf_type_name(wt), nh, nkv, hd, (long long)n_past, (long long)nt);
    const size_t nb = (size_t)(qd * nt) * 4;
    check_true(name, count_nan(yl[1], qd * nt) == 0 && count_nan(ya[1], qd * nt) == 0 && !memcmp(ya[0], ya[1], nb) &&
                         !memcmp(yl[0], yl[1], nb),
               "(bitwise, attention and layer outputs)");
    snprintf(name, sizeof name, "attnone node %s %d/%d/%d nt %lld: o GEMV took the attention's q8",
             mf_type_name(kvt), nh, nkv, hd, (long long)nt);
    char det[64];
    snprintf(det, sizeof det, "(x-ready GEMVs: off %lld, on %lld; want 0, 1)", (long long)moved[0],
             (long long)moved[1]);
    check_true(name, moved[0] == 0 && moved[1] == 1, det);
    for (int on = 0; on < 2; on++) {
        free(ya[on]);
        free(yl[on]);
    }
    free(q);
    free(r);
    da_teardown(&L.f);
}

static void attnone_family(void) {
    cudaStream_t st;
    if (!family_stream("attnone", &st))
        return;
    const int32_t shapes[3][3] = {{14, 2, 64}, {28, 4, 128}, {32, 8, 128}}; /* 0.5B, 7B, Qwen3-4B */
    const uint32_t kvts[3] = {MF_TYPE_F32, MF_TYPE_F16, MF_TYPE_Q8_0};
    const int64_t depths[4] = {1, 31, 300, 4000}, nts[2] = {1, 3};
    for (int s = 0; s < 3; s++)
        for (int k = 0; k < 3; k++)
            for (int d = 0; d < (small ? 3 : 4); d++)
                for (int n = 0; n < 2; n++)
                    ao_case(shapes[s][0], shapes[s][1], shapes[s][2], depths[d], nts[n], kvts[k], st);
    ao_node(MF_TYPE_Q4_0, 14, 2, 64, 37, 1, MF_TYPE_F16);
    ao_node(MF_TYPE_Q4_0, 14, 2, 64, 300, 3, MF_TYPE_Q8_0);
    if (!small)
        ao_node(MF_TYPE_Q4_K, 28, 4, 128, 700, 1, MF_TYPE_F32);
    cudaStreamDestroy(st);
}

/* ---- MINFER_CUDA_ATTN_SHORT: short-context decode attention (family "attnshort") ---------- */


/* The attention of nt tokens at n_past over device caches kc / vc through
 * the launcher: the short kernel (mode 1: 12 warps a block, 4: 4 warps,
 * tune short_warps=4's launch) or
 * today's one-kernel split-KV decode (mode 0: a.cnt, q8out, n_ctx's split
 * count), into a poisoned
 * output; *q8 (if not NULL) gets the q8out bytes the kernel wrote
 * (q8used of them). Returns the output (qd * nt floats). */
static float *as_launch(int mode, const float *hq, const void *kc, const void *vc, uint32_t kvt, int32_t nh,
                        int32_t nkv, int32_t hd, int64_t n_past, int64_t nt, int32_t n_ctx, uint8_t **q8,
                        cudaStream_t st) {
    const int64_t qd = (int64_t)nh * hd;
    const size_t ob = (size_t)(qd * nt) * 4, q8b = mf_cu_q8_bytes(qd, nt), q8used = (size_t)(qd * nt) * 5 / 4;
    mf_cu_attn_args a = {.q = ds_put(hq, ob), .k = kc, .v = vc, .kv_type = kvt, .nt = nt, .n_past = n_past,
                         .n_head = nh, .n_head_kv = nkv, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd),
                         .n_ctx = n_ctx};
    a.out = ds_alloc(ob, 0xff);
    a.q8out = ds_alloc(q8b, 0x35);
    if (mode) {
        a.short_warps = mode == 4 ? 4 : 0;
        ds_sync("attnshort short kernel", mf_cu_attn_short(&a, st), st);
    } else {
        a.part = ds_alloc(mf_cu_attn_decode_bytes(&a), 0xff);
        a.cnt = ds_alloc((size_t)(nt * nkv) * 4, 0);
        ds_sync("attnshort one-kernel", mf_cu_attn_decode(&a, st), st);
        cudaFree(a.part);
        cudaFree(a.cnt);
    }
    float *y = ds_get(a.out, ob);
    if (q8)
        *q8 = ds_get(a.q8out, q8used);
    cudaFree((void *)a.q); cudaFree(a.out); cudaFree(a.q8out);
    return y;
}

/* One shape / cache type / depth / token count through the launcher (n_ctx
 * 4224: the one-kernel decode's graph-sized split count). The short kernel
 * and today's one-kernel decode each against float64 (1e-4, the cache's
 * rounding in the reference), short vs one-kernel (1e-4 max norm; not
 * bitwise: the order of the sums differs), each for 12 and 4 warps a
 * block; the short kernel's q8out (both forms) bitwise
 * the quantize kernel run on its out (q, d, half sums); then the short
 * kernel again with n_past from n_past_dev (n_past 0 must be ignored),
 * without q8out, and at nt 3 in place (out == q): out bitwise the first
 * run, q8out too where written. */
static void as_case(int32_t nh, int32_t nkv, int32_t hd, int64_t n_past, int64_t nt, uint32_t kvt, cudaStream_t st) {
    const int64_t qd = (int64_t)nh * hd, kvd = (int64_t)nkv * hd, n_kv = n_past + nt;
    const int32_t n_ctx = (int32_t)(n_kv > 4224 ? n_kv + 64 : 4224);
    const size_t ob = (size_t)(qd * nt) * 4, q8b = mf_cu_q8_bytes(qd, nt), q8used = (size_t)(qd * nt) * 5 / 4;
    float *fk = rand_vec(kvd * n_kv, 2.0f), *fv = rand_vec(kvd * n_kv, 1.0f);
    float *hk = malloc((size_t)(kvd * n_kv) * 4), *hv = malloc((size_t)(kvd * n_kv) * 4);
    kv_roundtrip(kvt, fk, hk, n_kv, kvd);
    kv_roundtrip(kvt, fv, hv, n_kv, kvd);
    void *kc = kv_cache_dev(kvt, fk, n_kv, n_ctx, kvd, 0xff), *vc = kv_cache_dev(kvt, fv, n_kv, n_ctx, kvd, 0xff);
    float *hq = rand_vec(qd * nt, 2.0f);
    double *ref = malloc((size_t)(qd * nt) * sizeof *ref);
    da_ref(hq, hk, hv, nh, nkv, hd, n_past, nt, 1.0f / sqrtf((float)hd), ref);
    uint8_t *s8 = NULL;
    float *ys = as_launch(1, hq, kc, vc, kvt, nh, nkv, hd, n_past, nt, n_ctx, &s8, st);
    float *yo = as_launch(0, hq, kc, vc, kvt, nh, nkv, hd, n_past, nt, n_ctx, NULL, st);
    uint8_t *s84 = NULL;
    float *y4 = as_launch(4, hq, kc, vc, kvt, nh, nkv, hd, n_past, nt, n_ctx, &s84, st);
    /* the quantize kernel on the short kernel's out (and the 4-warp one's) */
    float *dy = ds_put(ys, ob);
    void *q8r = ds_alloc(q8b, 0);
    ds_sync("attnshort quantize", mf_cu_q8_quant_rows(dy, NULL, 0.0f, 0, qd, nt, q8r, tune0.pdl, st), st);
    uint8_t *hr = ds_get(q8r, q8used);
    cudaMemcpy(dy, y4, ob, cudaMemcpyHostToDevice);
    ds_sync("attnshort quantize", mf_cu_q8_quant_rows(dy, NULL, 0.0f, 0, qd, nt, q8r, tune0.pdl, st), st);
    uint8_t *hr4 = ds_get(q8r, q8used);
    /* variants: n_past_dev, no q8out, in place */
    const int32_t np32 = (int32_t)n_past;
    int32_t *dp = ds_put(&np32, 4);
    void *q8o = ds_alloc(q8b, 0);
    float *dq = ds_put(hq, ob), *dout = ds_alloc(ob, 0xff);
    bool same = true, q8same = true;
    int64_t n_nan = 0;
    for (int v = 0; v < 2 + (nt == 3); v++) {
        mf_cu_attn_args b = {.q = dq, .out = dout, .k = kc, .v = vc, .kv_type = kvt, .nt = nt, .n_past = n_past,
                             .n_head = nh, .n_head_kv = nkv, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd),
                             .n_ctx = n_ctx, .q8out = v == 1 ? NULL : q8o};
        if (v == 0) {
            b.n_past_dev = dp;
            b.n_past = 0; /* must be ignored */
        }
        ao_variant_out(&b, v == 2, v, hq, ob, q8o, q8b);
        t_attn_short_pf(v != 1); /* MINFER_CUDA_ATTN_PF: the same bits with the L2 prefetch */
        ds_sync("attnshort variant", mf_cu_attn_short(&b, st), st);
        ao_variant_cmp(&b, ob, qd * nt, ys, q8o, q8used, s8, &n_nan, &same, &q8same);
    }
    t_attn_short_pf(tune0.attn_pf != 0);
    char name[160], sub[220];
    snprintf(name, sizeof name, "attnshort %-4s heads %d/%d hd %d n_past %lld nt %lld", mf_type_name(kvt), nh, nkv, hd,
             (long long)n_past, (long long)nt);
    snprintf(sub, sizeof sub, "%s [short]", name);
    result(sub, rel_err(ys, ref, qd * nt), 1e-4, count_nan(ys, qd * nt), NULL);
    snprintf(sub, sizeof sub, "%s [short 4 warps]", name);
    result(sub, rel_err(y4, ref, qd * nt), 1e-4, count_nan(y4, qd * nt), NULL);
    snprintf(sub, sizeof sub, "%s [one-kernel]", name);
    result(sub, rel_err(yo, ref, qd * nt), 1e-4, count_nan(yo, qd * nt), NULL);
    snprintf(sub, sizeof sub, "%s [short vs one-kernel]", name);
    result(sub, rel_err_f(ys, yo, qd * nt), 1e-4, count_nan(ys, qd * nt), "(max norm; other sum order)");
    snprintf(sub, sizeof sub, "%s [short 4 warps vs one-kernel]", name);
    result(sub, rel_err_f(y4, yo, qd * nt), 1e-4, count_nan(y4, qd * nt), "(max norm; other sum order)");
    snprintf(sub, sizeof sub, "%s: q8out == quantize kernel", name);
    check_true(sub, !memcmp(s8, hr, q8used) && !memcmp(s84, hr4, q8used), "(bitwise: q, d, half sums; 12 and 4 warps)");
    snprintf(sub, sizeof sub, "%s: n_past_dev, no q8out%s == plain", name, nt == 3 ? ", in place" : "");
    check_true(sub, same && q8same && n_nan == 0,
               "(bitwise out and q8out, no NaN; ATTN_PF prefetch on in the n_past_dev and in-place runs)");
    cudaFree(kc); cudaFree(vc); cudaFree(dy); cudaFree(q8r); cudaFree(dp); cudaFree(q8o); cudaFree(dq); cudaFree(dout);
    free(fk); free(fv); free(hk); free(hv); free(hq); free(ref); free(s8); free(ys); free(yo); free(hr);
    free(s84); free(y4); free(hr4);
}


/* A layer's attention part as graph nodes: the da_fix cache and ATTN node,
 * then the o MATMUL (weight as.<wt>.<qd>x<qd>) and the residual ADD. */
/* Through the backend (hooks mf_cuda_set_attn_one 1 and
 * mf_cuda_set_attn_short 0 / 1): ATTN -> o MATMUL -> ADD (FUSE_ADD on).
 * The attention output bitwise the launcher's one-kernel decode (switch 0)
 * or 12-warp short kernel (1; the backend has no 4-warp form) on a copy of
 * the cache (so the backend took the kernel the switch names), each against
 * float64 (1e-4); the layer output of the short kernel within 1e-2 of the
 * switch-off one
 * (the o GEMV rounds its input to int8 per 32: inputs 1e-6 apart may round
 * apart); every time the o GEMV took the attention's q8
 * (mf_cuda_q8_ready_stats moved by one). */
static void as_node(uint32_t wt, int32_t nh, int32_t nkv, int32_t hd, int64_t n_past, int64_t nt, uint32_t kvt,
                    cudaStream_t st) {
    const int64_t qd = (int64_t)nh * hd, kvd = (int64_t)nkv * hd, n_kv = n_past + nt;
    const int32_t n_ctx = 4224;
    enum { MODES = 2 };
    const int modes[MODES] = {0, 1};
    attn_layer L;
    attn_layer_setup(&L, "as", wt, nh, nkv, hd, n_kv, nt, n_ctx, kvt);
    void *kc = kv_cache_dev(kvt, L.f.kc, n_kv, n_ctx, kvd, 0xff), *vc = kv_cache_dev(kvt, L.f.vc, n_kv, n_ctx, kvd, 0xff);
    float *q = rand_vec(qd * nt, 2.0f), *r = rand_vec(qd * nt, 1.0f);
    double *ref = malloc((size_t)(qd * nt) * sizeof *ref);
    da_ref(q, L.f.kc, L.f.vc, nh, nkv, hd, n_past, nt, L.f.scale, ref);
    const size_t nb = (size_t)(qd * nt) * 4;
    float *ya[MODES], *yl[MODES], *yk[MODES];
    int64_t moved[MODES];
    const mf_exec_args a = args(n_past, nt, n_ctx, kvt);
    for (int m = 0; m < MODES; m++) {
        moved[m] = attn_layer_run(&L, q, r, nb, &a, 1, modes[m], &ya[m], &yl[m], "attnshort node");
        yk[m] = as_launch(modes[m], q, kc, vc, kvt, nh, nkv, hd, n_past, nt, n_ctx, NULL, st);
    }
    char name[200], sub[240];
    snprintf(name, sizeof name, "attnshort node %s cache, o %s %d/%d/%d n_past %lld nt %lld", mf_type_name(kvt),
             mf_type_name(wt), nh, nkv, hd, (long long)n_past, (long long)nt);
    for (int m = 0; m < MODES; m++) {
        const char *what = m == 0 ? "one-kernel" : "short";
        snprintf(sub, sizeof sub, "%s: %s == launcher", name, what);
        check_true(sub, !memcmp(ya[m], yk[m], nb) && count_nan(ya[m], qd * nt) == 0, "(bitwise attention output)");
        snprintf(sub, sizeof sub, "%s [%s]", name, what);
        result(sub, rel_err(ya[m], ref, qd * nt), 1e-4, count_nan(ya[m], qd * nt), NULL);
        if (m) {
            snprintf(sub, sizeof sub, "%s: layer %s vs one-kernel", name, what);
            result(sub, rel_err_f(yl[m], yl[0], qd * nt), 1e-2, count_nan(yl[m], qd * nt), "(max norm)");
        }
    }
    snprintf(sub, sizeof sub, "%s: o GEMV took the q8", name);
    char det[96];
    snprintf(det, sizeof det, "(x-ready GEMVs: one-kernel %lld, short %lld; want 1 each)", (long long)moved[0],
             (long long)moved[1]);
    check_true(sub, moved[0] == 1 && moved[1] == 1, det);
    for (int m = 0; m < MODES; m++) {
        free(ya[m]);
        free(yl[m]);
        free(yk[m]);
    }
    cudaFree(kc); cudaFree(vc);
    free(q); free(r); free(ref);
    da_teardown(&L.f);
}

/* CUDA graph replay with the switch at mode (1, the backend's only short
 * form; attn_one 1): ATTN -> o MATMUL ->
 * ADD of the 0.5B shape (Q4_0 o, f16 cache of 640 rows), n_past 40, 41,
 * 100, 300 (1st step plain, 2nd captured, the rest replayed with n_past
 * from the device): each step's attention output against float64 (1e-4)
 * and bitwise the launcher's short kernel of that mode; each step's layer output
 * bitwise the same step run without graphs; captures >= 1, replays >= 2. */
static void as_graph(int64_t nt, int mode, cudaStream_t st) {
    const int32_t nh = 14, nkv = 2, hd = 64, n_ctx = 640;
    const uint32_t kvt = MF_TYPE_F16;
    const int64_t qd = (int64_t)nh * hd, kvd = (int64_t)nkv * hd;
    const int64_t past[] = {40, 41, 100, 300};
    enum { STEPS = sizeof past / sizeof past[0] };
    attn_layer L;
    attn_layer_setup(&L, "as", MF_TYPE_Q4_0, nh, nkv, hd, n_ctx, nt, n_ctx, kvt);
    void *kc = kv_cache_dev(kvt, L.f.kc, n_ctx, n_ctx, kvd, 0xff), *vc = kv_cache_dev(kvt, L.f.vc, n_ctx, n_ctx, kvd, 0xff);
    const size_t nb = (size_t)(qd * nt) * 4;
    int32_t qb = dev_put(NULL, nb), rb = dev_put(NULL, nb), ob = dev_put(NULL, nb), mb = dev_put(NULL, nb),
            yb = dev_put(NULL, nb);
    float *q[STEPS], *r[STEPS], *yg[STEPS];
    double *ref = malloc((size_t)(qd * nt) * sizeof *ref);
    double worst = 0;
    int64_t nan = 0, cap0 = 0, rep0 = 0, cap1 = 0, rep1 = 0;
    bool att_same = true, lay_same = true;
    t_flash_decode(be, true);
    t_fuse_add(be, true);
    t_attn_one(be, 1);
    t_attn_short(be, mode);
    for (int g = 1; g >= 0; g--) { /* graphs on, then the same steps plainly */
        mf_cuda_set_graphs(be, g);
        if (g)
            mf_cuda_graph_stats(be, &cap0, &rep0);
        for (int s = 0; s < STEPS; s++) {
            if (g) {
                q[s] = rand_vec(qd * nt, 2.0f);
                r[s] = rand_vec(qd * nt, 1.0f);
            }
            mf_exec_args a = args(past[s], nt, n_ctx, kvt);
            mf_error e;
            if (mf_cuda_begin_forward(be, &L.f.g, &a, &e) || be->ops->write_host(be, qb, 0, q[s], nb, &e) ||
                be->ops->write_host(be, rb, 0, r[s], nb, &e))
                die("attnshort graph step", &e);
            attn_layer_exec(&L, qb, rb, ob, mb, yb, &a);
            if (mf_cuda_end_forward(be, &L.f.g, &a, &e))
                die("attnshort graph step", &e);
            float *y = dev_get(yb, nb);
            if (g) {
                float *ya = dev_get(ob, nb);
                float *yk = as_launch(mode, q[s], kc, vc, kvt, nh, nkv, hd, past[s], nt, n_ctx, NULL, st);
                da_ref(q[s], L.f.kc, L.f.vc, nh, nkv, hd, past[s], nt, L.f.scale, ref);
                worst = fmax(worst, rel_err(ya, ref, qd * nt));
                nan += count_nan(ya, qd * nt) + count_nan(y, qd * nt);
                att_same = att_same && !memcmp(ya, yk, nb);
                yg[s] = y;
                free(ya);
                free(yk);
            } else {
                lay_same = lay_same && !memcmp(y, yg[s], nb);
                free(y);
            }
        }
        if (g)
            mf_cuda_graph_stats(be, &cap1, &rep1);
    }
    mf_cuda_set_graphs(be, !false);
    attn_switches_default();
    char name[160], det[120];
    snprintf(name, sizeof name, "attnshort graph f16 nt %lld mode %d, %d steps (worst)", (long long)nt, mode, STEPS);
    result(name, worst, 1e-4, nan, NULL);
    snprintf(name, sizeof name, "attnshort graph f16 nt %lld mode %d: attention == launcher short", (long long)nt,
             mode);
    check_true(name, att_same, "(bitwise, every step)");
    snprintf(name, sizeof name, "attnshort graph f16 nt %lld mode %d: layer replayed == plain", (long long)nt, mode);
    check_true(name, lay_same, "(bitwise, every step)");
    snprintf(det, sizeof det, "%lld captures, %lld replays", (long long)(cap1 - cap0), (long long)(rep1 - rep0));
    snprintf(name, sizeof name, "attnshort graph f16 nt %lld mode %d: steps replayed", (long long)nt, mode);
    check_true(name, cap1 - cap0 >= 1 && rep1 - rep0 >= STEPS - 2, det);
    for (int s = 0; s < STEPS; s++) {
        free(q[s]);
        free(r[s]);
        free(yg[s]);
    }
    free(ref);
    cudaFree(kc); cudaFree(vc);
    dev_free(qb); dev_free(rb); dev_free(ob); dev_free(mb); dev_free(yb);
    da_teardown(&L.f);
}

static void attnshort_family(void) {
    cudaStream_t st;
    if (!family_stream("attnshort", &st))
        return;
    /* 0.5B, 7B, Qwen3-4B, G = 1 */
    const int32_t shapes[4][3] = {{14, 2, 64}, {28, 4, 128}, {32, 8, 128}, {16, 16, 64}};
    const uint32_t kvts[2] = {MF_TYPE_F32, MF_TYPE_F16};
    const int64_t depths[9] = {1, 31, 32, 33, 127, 128, 129, 300, 383}, nts[2] = {1, 3};
    for (int s = 0; s < 4; s++)
        for (int k = 0; k < 2; k++)
            for (int d = 0; d < 9; d++)
                for (int n = 0; n < 2; n++)
                    if (!small || d % 3 == 1)
                        as_case(shapes[s][0], shapes[s][1], shapes[s][2], depths[d], nts[n], kvts[k], st);
    as_node(MF_TYPE_Q4_0, 14, 2, 64, 37, 1, MF_TYPE_F16, st);
    as_node(MF_TYPE_Q4_0, 14, 2, 64, 300, 3, MF_TYPE_F32, st);
    as_node(MF_TYPE_Q4_0, 16, 16, 64, 129, 1, MF_TYPE_F16, st);
    if (!small)
        as_node(MF_TYPE_Q4_K, 28, 4, 128, 200, 1, MF_TYPE_F16, st);
    as_graph(1, 1, st);
    as_graph(3, 1, st);
    cudaStreamDestroy(st);
}

/* ---- MINFER_CUDA_SHORT_ROPE: rope + K/V store inside the short attention (family "shortrope") ---- */

/* One launcher case: what the QKV GEMV leaves (raw q, k, v of one token),
 * the rope metas, optional QkNorm weights, a cache of n_ctx rows whose rows
 * < n_past are random and the rest NaN. */
typedef struct sr_case_in {
    int32_t nh, nkv, hd, n_rot, mode;
    int64_t n_past;
    int32_t pos; /* the token's position (not n_past: a mix-up shows) */
    uint32_t kvt;
    bool norm;
    float *hq, *hk, *hv, *hqn, *hkn; /* raw q / k / v; norm weights (norm) */
    float *hk0, *hv0;                /* cache rows [0, n_past) */
    int32_t n_ctx;
} sr_case_in;

/* Random inputs of c: q and k (and the cache's K rows [0, n_past]) in
 * [-qk, qk], v (and the V rows) in [-v, v], the QkNorm weights 1 +- spread. */
static void sr_case_rand(sr_case_in *c, float qk, float v, float spread) {
    const int64_t qd = (int64_t)c->nh * c->hd, kvd = (int64_t)c->nkv * c->hd, rows = c->n_past + 1;
    c->hq = rand_vec(qd, qk);
    c->hk = rand_vec(kvd, qk);
    c->hv = rand_vec(kvd, v);
    c->hqn = rand_vec(c->hd, spread);
    c->hkn = rand_vec(c->hd, spread);
    for (int i = 0; i < c->hd; i++) {
        c->hqn[i] += 1.0f;
        c->hkn[i] += 1.0f;
    }
    c->hk0 = rand_vec(kvd * rows, qk);
    c->hv0 = rand_vec(kvd * rows, v);
}

/* The device side of one run: raw inputs (fresh copies), caches, outputs. */
typedef struct sr_dev {
    float *q, *k, *v, *qy, *qn, *kn, *out;
    int32_t *pos, *np;
    void *kc, *vc, *q8;
    mf_cu_rope_store_args rs;
    mf_cu_attn_args a;
} sr_dev;

/* n_past_dev: graph-replay form (n_past / pos0 0 in the arguments, the
 * row from device memory); poison: the fill of out / qy / q8. */
static void sr_dev_new(sr_dev *d, const sr_case_in *c, bool n_past_dev, int poison) {
    const int64_t qd = (int64_t)c->nh * c->hd, kvd = (int64_t)c->nkv * c->hd;
    const int32_t np32 = (int32_t)c->n_past;
    d->q = ds_put(c->hq, (size_t)qd * 4);
    d->k = ds_put(c->hk, (size_t)kvd * 4);
    d->v = ds_put(c->hv, (size_t)kvd * 4);
    d->qy = ds_alloc((size_t)qd * 4, poison);
    d->out = ds_alloc((size_t)qd * 4, poison);
    d->q8 = ds_alloc(mf_cu_q8_bytes(qd, 1), poison);
    d->qn = c->norm ? ds_put(c->hqn, (size_t)c->hd * 4) : NULL;
    d->kn = c->norm ? ds_put(c->hkn, (size_t)c->hd * 4) : NULL;
    d->pos = ds_put(&c->pos, 4);
    d->np = ds_put(&np32, 4);
    d->kc = kv_cache_dev(c->kvt, c->hk0, c->n_past, c->n_ctx, kvd, 0xff);
    d->vc = kv_cache_dev(c->kvt, c->hv0, c->n_past, c->n_ctx, kvd, 0xff);
    const float theta = c->mode == MF_ROPE_NEOX ? 1000000.0f : 10000.0f;
    memset(&d->rs, 0, sizeof d->rs);
    d->rs.rq = (mf_cu_rope_args){.x = d->q, .y = d->qy, .pos = d->pos, .pos0 = c->n_past, .nt = 1, .n_head = c->nh,
                                 .head_dim = c->hd, .n_rot = c->n_rot, .mode = c->mode, .theta = theta,
                                 .freq_scale = 1.0f};
    d->rs.rk = d->rs.rq;
    d->rs.rk.x = d->rs.rk.y = d->k;
    d->rs.rk.n_head = c->nkv;
    d->rs.ks = (mf_cu_kv_args){.kv_type = c->kvt, .cache = d->kc, .kv_dim = kvd, .pos0 = n_past_dev ? 0 : c->n_past,
                               .pos0_dev = n_past_dev ? d->np : NULL, .nt = 1, .src = d->k};
    d->rs.vs = d->rs.ks;
    d->rs.vs.cache = d->vc;
    d->rs.vs.src = d->v;
    d->rs.q_norm = d->qn;
    d->rs.k_norm = d->kn;
    d->rs.norm_eps = 1e-6f;
    d->a = (mf_cu_attn_args){.q = d->qy, .out = d->out, .k = d->kc, .v = d->vc, .kv_type = c->kvt, .nt = 1,
                             .n_past = n_past_dev ? 0 : c->n_past, .n_past_dev = n_past_dev ? d->np : NULL,
                             .n_head = c->nh, .n_head_kv = c->nkv, .head_dim = c->hd,
                             .scale = 1.0f / sqrtf((float)c->hd), .n_ctx = c->n_ctx, .q8out = d->q8};
}

static void sr_dev_free(sr_dev *d) {
    cudaFree(d->q); cudaFree(d->k); cudaFree(d->v); cudaFree(d->qy); cudaFree(d->out); cudaFree(d->q8);
    cudaFree(d->qn); cudaFree(d->kn); cudaFree(d->pos); cudaFree(d->np); cudaFree(d->kc); cudaFree(d->vc);
}

/* Host float64 of rope_store on one token's heads (QkNorm first with w,
 * eps 1e-6, when w != NULL), rounded to float: the reference's q / K row. */
static void sr_ref_rope(const float *x, const float *w, int32_t n_head, int32_t hd, int32_t n_rot, int mode,
                        int32_t pos, float *y) {
    const float theta = mode == MF_ROPE_NEOX ? 1000000.0f : 10000.0f;
    mf_rope_meta r = {.n_head = n_head, .head_dim = hd, .n_rot = n_rot, .mode = mode, .theta = theta,
                      .freq_scale = 1.0f};
    float *xn = malloc((size_t)n_head * hd * 4);
    double *yd = malloc((size_t)n_head * hd * sizeof *yd);
    for (int32_t h = 0; h < n_head; h++) {
        double ss = 0;
        for (int i = 0; i < hd; i++)
            ss += (double)x[h * hd + i] * x[h * hd + i];
        const double sc = w ? 1.0 / sqrt(ss / hd + 1e-6) : 1.0;
        for (int i = 0; i < hd; i++)
            xn[h * hd + i] = (float)(x[h * hd + i] * sc * (w ? w[i] : 1.0f));
    }
    ref_rope(xn, yd, 1, &r, &pos);
    for (int64_t i = 0; i < (int64_t)n_head * hd; i++)
        y[i] = (float)yd[i];
    free(xn);
    free(yd);
}

/* One shape / rope mode / cache type / depth (launchers): rope_store +
 * attn_short (the path the switch replaces) vs mf_cu_attn_short_rope three
 * times (plain; n_past from the device with 0 in the arguments; no q8out),
 * each on fresh inputs, caches and poisoned outputs: the whole K and V
 * caches bitwise (row n_past written once and right, no other row touched),
 * out bitwise (same summation order), q8out bitwise; the raw q / k / v and
 * the rope-store's q output left as they were (the fused kernel writes
 * none); out against float64 (1e-4: norm and rope in double, the cache's
 * rounding of the new row included) and the new K / V rows against it
 * (cache rounding). */
static void sr_case(int32_t nh, int32_t nkv, int32_t hd, int32_t n_rot, int mode, bool norm, int64_t n_past,
                    uint32_t kvt, cudaStream_t st) {
    const int64_t qd = (int64_t)nh * hd, kvd = (int64_t)nkv * hd, n_kv = n_past + 1;
    sr_case_in c = {.nh = nh, .nkv = nkv, .hd = hd, .n_rot = n_rot, .mode = mode, .n_past = n_past,
                    .pos = (int32_t)n_past + 5, .kvt = kvt, .norm = norm, .n_ctx = (int32_t)(n_kv + 17)};
    sr_case_rand(&c, 2.0f, 1.0f, 0.5f);
    const size_t ob = (size_t)qd * 4, q8used = (size_t)qd * 5 / 4;
    const size_t region = mf_type_row_size(kvt, kvd) * (size_t)c.n_ctx;
    /* the old path */
    sr_dev o;
    sr_dev_new(&o, &c, false, 0xff);
    ds_sync("shortrope rope_store", mf_cu_rope_store(&o.rs, st), st);
    ds_sync("shortrope attn_short", mf_cu_attn_short(&o.a, st), st);
    float *yo = ds_get(o.out, ob);
    uint8_t *q8o = ds_get(o.q8, q8used), *kco = ds_get(o.kc, region), *vco = ds_get(o.vc, region);
    /* float64: roped q, the cache with the new row (as the cache holds it) */
    float *rq = malloc(ob), *hkc = malloc((size_t)(kvd * n_kv) * 4), *hvc = malloc((size_t)(kvd * n_kv) * 4);
    sr_ref_rope(c.hq, norm ? c.hqn : NULL, nh, hd, n_rot, mode, c.pos, rq);
    memcpy(c.hk0 + n_past * kvd, c.hk, (size_t)kvd * 4);
    sr_ref_rope(c.hk, norm ? c.hkn : NULL, nkv, hd, n_rot, mode, c.pos, c.hk0 + n_past * kvd);
    memcpy(c.hv0 + n_past * kvd, c.hv, (size_t)kvd * 4);
    kv_roundtrip(kvt, c.hk0, hkc, n_kv, kvd);
    kv_roundtrip(kvt, c.hv0, hvc, n_kv, kvd);
    double *ref = malloc((size_t)qd * sizeof *ref), *rk = malloc((size_t)kvd * 2 * sizeof *rk);
    da_ref(rq, hkc, hvc, nh, nkv, hd, n_past, 1, 1.0f / sqrtf((float)hd), ref);
    for (int64_t i = 0; i < kvd; i++) {
        rk[i] = c.hk0[n_past * kvd + i];
        rk[kvd + i] = c.hv0[n_past * kvd + i];
    }
    /* the fused kernel: plain, n_past_dev, no q8out */
    bool same = true, cache_same = true, q8same = true, untouched = true, launched_ok = true;
    float *yn0 = NULL, *newkv = malloc((size_t)kvd * 2 * 4);
    for (int v = 0; v < 3; v++) {
        sr_dev n;
        sr_dev_new(&n, &c, v == 1, v == 1 ? 0x7f : 0xff);
        if (v == 2)
            n.a.q8out = NULL;
        t_attn_short_pf(v > 0); /* MINFER_CUDA_ATTN_PF: the same bits with the L2 prefetch */
        const cudaError_t e = mf_cu_attn_short_rope(&n.a, &n.rs, st);
        t_attn_short_pf(tune0.attn_pf != 0);
        launched_ok = launched_ok && e == cudaSuccess;
        ds_sync("shortrope fused", e, st);
        float *yn = ds_get(n.out, ob), *qn_ = ds_get(n.q, ob), *kn_ = ds_get(n.k, (size_t)kvd * 4);
        float *vn_ = ds_get(n.v, (size_t)kvd * 4);
        uint8_t *kcn = ds_get(n.kc, region), *vcn = ds_get(n.vc, region), *qyn = ds_get(n.qy, ob);
        same = same && !memcmp(yn, yo, ob);
        cache_same = cache_same && !memcmp(kcn, kco, region) && !memcmp(vcn, vco, region);
        bool poisoned = true;
        for (size_t i = 0; i < ob; i++)
            poisoned = poisoned && qyn[i] == (v == 1 ? 0x7f : 0xff);
        untouched = untouched && poisoned && !memcmp(qn_, c.hq, ob) && !memcmp(kn_, c.hk, (size_t)kvd * 4) &&
                    !memcmp(vn_, c.hv, (size_t)kvd * 4);
        if (n.a.q8out) {
            uint8_t *q8n = ds_get(n.q8, q8used);
            q8same = q8same && !memcmp(q8n, q8o, q8used);
            free(q8n);
        }
        if (v == 0) {
            yn0 = yn;
            const size_t rb = mf_type_row_size(kvt, kvd);
            float *t = malloc((size_t)kvd * 4);
            mf_dequantize_rows(kvt, kcn + rb * (size_t)n_past, t, 1, kvd);
            memcpy(newkv, t, (size_t)kvd * 4);
            mf_dequantize_rows(kvt, vcn + rb * (size_t)n_past, t, 1, kvd);
            memcpy(newkv + kvd, t, (size_t)kvd * 4);
            free(t);
        } else {
            free(yn);
        }
        free(qn_); free(kn_); free(vn_); free(kcn); free(vcn); free(qyn);
        sr_dev_free(&n);
    }
    char name[160], sub[220];
    snprintf(name, sizeof name, "shortrope %-4s %d/%d/%d rot %d %s%s n_past %lld", mf_type_name(kvt), nh, nkv, hd,
             n_rot, mode == MF_ROPE_NEOX ? "neox" : "normal", norm ? " qknorm" : "", (long long)n_past);
    snprintf(sub, sizeof sub, "%s [fused vs float64]", name);
    result(sub, rel_err(yn0, ref, qd), 1e-4, count_nan(yn0, qd), NULL);
    snprintf(sub, sizeof sub, "%s [old vs float64]", name);
    result(sub, rel_err(yo, ref, qd), 1e-4, count_nan(yo, qd), NULL);
    snprintf(sub, sizeof sub, "%s [new K/V rows vs float64]", name);
    result(sub, rel_err(newkv, rk, kvd * 2), kvt == MF_TYPE_F32 ? 1e-5 : 1e-3, count_nan(newkv, kvd * 2),
           "(cache rounding)");
    snprintf(sub, sizeof sub, "%s: == rope_store + attn_short", name);
    check_true(sub, launched_ok && same && cache_same && q8same,
               "(bitwise: out, q8out, whole K / V caches; plain, n_past_dev + ATTN_PF, no q8out + ATTN_PF)");
    snprintf(sub, sizeof sub, "%s: inputs and q output untouched", name);
    check_true(sub, untouched, "(raw q / k / v, rope-store q output still poison)");
    sr_dev_free(&o);
    free(yo); free(q8o); free(kco); free(vco); free(rq); free(hkc); free(hvc); free(ref); free(rk); free(yn0);
    free(newkv);
    free(c.hq); free(c.hk); free(c.hv); free(c.hqn); free(c.hkn); free(c.hk0); free(c.hv0);
}

/* Arguments the fused launcher must refuse (each a wrong program the
 * backend must never hand it): nt 2, another cache than the attention's,
 * K not in place, a q8_0 cache, head_dim 256, one norm only, a store row
 * that is not n_past. */
static void sr_refusals(cudaStream_t st) {
    sr_case_in c = {.nh = 14, .nkv = 2, .hd = 64, .n_rot = 64, .mode = MF_ROPE_NEOX, .n_past = 3, .pos = 3,
                    .kvt = MF_TYPE_F16, .norm = true, .n_ctx = 32};
    c.hq = rand_vec(14 * 64, 1.0f);
    c.hk = rand_vec(128, 1.0f);
    c.hv = rand_vec(128, 1.0f);
    c.hqn = rand_vec(64, 1.0f);
    c.hkn = rand_vec(64, 1.0f);
    c.hk0 = rand_vec(128 * 4, 1.0f);
    c.hv0 = rand_vec(128 * 4, 1.0f);
    sr_dev d;
    sr_dev_new(&d, &c, false, 0xff);
    bool ok = mf_cu_attn_short_rope_ok(&d.a, &d.rs) != 0;
    for (int k = 0; k < 7; k++) {
        mf_cu_attn_args a = d.a;
        mf_cu_rope_store_args r = d.rs;
        switch (k) {
        case 0: a.nt = r.rq.nt = r.rk.nt = r.ks.nt = r.vs.nt = 2; break;
        case 1: r.ks.cache = d.vc; break;
        case 2: r.rk.y = d.qy; break;
        case 3: a.kv_type = r.ks.kv_type = r.vs.kv_type = MF_TYPE_Q8_0; break;
        case 4: a.head_dim = r.rq.head_dim = r.rk.head_dim = 256; break;
        case 5: r.k_norm = NULL; break;
        default: r.vs.pos0 = a.n_past + 1; break;
        }
        ok = ok && !mf_cu_attn_short_rope_ok(&a, &r) && mf_cu_attn_short_rope(&a, &r, st) == cudaErrorInvalidValue;
    }
    check_true("shortrope launcher refuses wrong arguments", ok, "(nt 2, other cache, K not in place, q8_0, hd 256, "
                                                               "one norm, store row != n_past)");
    sr_dev_free(&d);
    free(c.hq); free(c.hk); free(c.hv); free(c.hqn); free(c.hkn); free(c.hk0); free(c.hv0);
}

/* The node test's specs: qwen2-0.5B (bias), qwen2-7B shape (bias), qwen3-4B
 * shape (QkNorm), all NEOX, Q4_0 weights on a small d (the QKV GEMV is not
 * what is tested); their o weights sr.o.<qd>. */
static const qkv_spec sr_specs[3] = {
    {MF_TYPE_Q4_0, 896, 14, 2, 64, true, false, MF_ROPE_NEOX, 0},
    {MF_TYPE_Q4_0, 1024, 28, 4, 128, true, false, MF_ROPE_NEOX, 0},
    {MF_TYPE_Q4_0, 1024, 32, 8, 128, false, true, MF_ROPE_NEOX, 0},
};

static void sr_oname(char *wn, size_t n, int64_t qd) {
    snprintf(wn, n, "sr.o.%lld", (long long)qd);
}

static void shortrope_weights(void) {
    for (int i = 0; i < 3; i++) {
        qkv_weights(&sr_specs[i]);
        char wn[64];
        const int64_t qd = (int64_t)sr_specs[i].n_head * sr_specs[i].hd;
        sr_oname(wn, sizeof wn, qd);
        add_weight(wn, MF_TYPE_Q4_0, qd, qd);
    }
}

/* A decode layer's attention half as graph nodes: FUSED_QKV(_NORM) of x at
 * positions (epi: QKV_BIAS_ROPE_STORE of three given matmul outputs, the
 * MINFER_NO_FUSE_QKV epilogue), ATTN over it, the o MATMUL and the
 * residual ADD. */
typedef struct sr_layer {
    mf_graph g;
    mf_qkv_meta m;
    char nm[6][64], on[64];
    bool epi;
    int32_t xi, pi, ri, qkv, at, mi, ai;
    int64_t qd, kvd;
} sr_layer;

static void sr_layer_setup(sr_layer *L, const qkv_spec *s, bool epi) {
    L->m = qkv_meta(s, L->nm);
    L->epi = epi;
    L->qd = (int64_t)s->n_head * s->hd;
    L->kvd = (int64_t)s->n_head_kv * s->hd;
    graph_new(&L->g, 1, L->kvd);
    if (epi) {
        const int32_t qi = ext(&L->g, L->qd, 1), ki = ext(&L->g, L->kvd, 1), vi = ext(&L->g, L->kvd, 1);
        L->pi = mf_g_input(&L->g, MF_INPUT_POSITIONS, MF_DTYPE_I32, 1, 1);
        L->qkv = mf_g_node(&L->g, MF_OP_QKV_BIAS_ROPE_STORE, MF_DTYPE_F32, L->qd, 1, (int32_t[]){qi, ki, vi, L->pi}, 4);
        L->g.nodes[L->qkv].meta.qkv = L->m;
        L->g.nodes[L->qkv].layer = 0;
        L->xi = qi;
    } else {
        L->xi = ext(&L->g, s->d, 1);
        L->pi = mf_g_input(&L->g, MF_INPUT_POSITIONS, MF_DTYPE_I32, 1, 1);
        L->qkv = mf_g_fused_qkv(&L->g, L->xi, L->pi, &L->m);
    }
    mf_attn_meta am = {.layer = 0, .n_head = s->n_head, .n_head_kv = s->n_head_kv, .head_dim = s->hd,
                       .scale = 1.0f / sqrtf((float)s->hd)};
    L->at = mf_g_attn(&L->g, L->qkv, L->qkv, &am);
    L->ri = ext(&L->g, L->qd, 1);
    sr_oname(L->on, sizeof L->on, L->qd);
    L->mi = mf_g_matmul(&L->g, L->at, L->on, MF_TYPE_Q4_0, NULL, L->qd, L->qd);
    L->ai = mf_g_add(&L->g, L->ri, L->mi);
}

/* The buffers of one step: x (epi: the q matmul output; xk / xv the k and
 * v ones), positions, residual in; QKV out, attention out, o MATMUL out
 * (deferred: never written), layer out. */
typedef struct sr_bufs {
    int32_t x, p, r, qkv, at, mm, y, xk, xv;
} sr_bufs;

/* split: a synchronize between the QKV node and the ATTN (the pending
 * rope-store must be launched plainly then) */
static void sr_layer_exec(const sr_layer *L, const sr_bufs *b, mf_kv_pair kv, const mf_exec_args *a, bool split) {
    mf_error e;
    const int32_t qin[4] = {b->x, L->epi ? b->xk : b->p, b->xv, b->p}, ain[2] = {b->qkv, b->qkv},
                  aadd[2] = {b->r, b->mm};
    if (mf_cuda_execute_node(be, &L->g, L->qkv, qin, b->qkv, kv, a, &e) ||
        (split && be->ops->synchronize(be, &e)) ||
        mf_cuda_execute_node(be, &L->g, L->at, ain, b->at, kv, a, &e) ||
        mf_cuda_execute_node(be, &L->g, L->mi, &b->at, b->mm, (mf_kv_pair){-1, -1}, a, &e) ||
        mf_cuda_execute_node(be, &L->g, L->ai, aadd, b->y, (mf_kv_pair){-1, -1}, a, &e))
        die("shortrope layer", &e);
}

/* A cache region of n_ctx rows of kvt, every row random (the same bytes
 * for each call with the same seed state copy: rows from src). */
static int32_t sr_cache(uint32_t kvt, const float *src, int64_t n_ctx, int64_t kvd) {
    const size_t rb = mf_type_row_size(kvt, kvd);
    uint8_t *h = malloc(rb * (size_t)n_ctx);
    if (kvt == MF_TYPE_F32)
        memcpy(h, src, (size_t)(kvd * n_ctx) * 4);
    else
        mf_quantize_rows(kvt, src, h, n_ctx, kvd);
    const int32_t id = dev_put(h, rb * (size_t)n_ctx);
    free(h);
    return id;
}

/* The switches the node / graph tests set, and back. */
static void sr_switches(int on) {
    t_flash_decode(be, true);
    t_fuse_add(be, true);
    t_fuse_rope(be, true);
    t_attn_one(be, 1);
    t_attn_short(be, 1);
    t_short_rope(be, on);
}

static void sr_default(void) {
    t_flash_decode(be, !(tune0.attn_decode == MF_CU_AD_BLOCK));
    t_fuse_add(be, tune0.fuse_add != 0);
    t_fuse_rope(be, tune0.fuse_rope != 0);
    t_attn_one(be, -1);
    t_attn_short(be, -1);
    t_short_rope(be, -1);
}

/* Through the backend, one token: FUSED_QKV (epi: QKV_BIAS_ROPE_STORE) ->
 * ATTN -> o MATMUL -> ADD with MINFER_CUDA_SHORT_ROPE off and on (hook
 * mf_cuda_set_short_rope) on the same inputs and caches (random rows, NaN
 * outputs): the fold taken exactly when on and the case allows it
 * (mf_cuda_short_rope_count moved by 1; by 0 with a q8_0 cache, or with a
 * synchronize between the nodes: split, which must launch the pending
 * rope-store plainly), the whole K and V caches, the attention output and
 * the layer output bitwise equal (the o GEMV took the attention's q8 both
 * ways: its int8 input is bitwise the same or the layer would differ), and
 * the attention against float64 over the off run's roped q (its QKV output)
 * and caches (1e-4). */
static void sr_node(const qkv_spec *s, bool epi, int64_t n_past, uint32_t kvt, bool split) {
    sr_layer L;
    sr_layer_setup(&L, s, epi);
    /* the fold: an f32 / f16 cache and nothing between the two nodes */
    const int64_t want = (kvt == MF_TYPE_F32 || kvt == MF_TYPE_F16) && !split;
    const int32_t n_ctx = 400;
    const size_t nb = (size_t)L.qd * 4, region = mf_type_row_size(kvt, L.kvd) * (size_t)n_ctx;
    const int64_t nx = epi ? L.qd : s->d;
    float *x = rand_vec(nx, 1.0f), *r = rand_vec(L.qd, 1.0f), *xk = rand_vec(L.kvd, 1.0f), *xv = rand_vec(L.kvd, 1.0f);
    float *k0 = rand_vec(L.kvd * n_ctx, 2.0f), *v0 = rand_vec(L.kvd * n_ctx, 1.0f);
    const int32_t pos = (int32_t)n_past;
    float *ya[2], *yl[2], *qo = NULL;
    uint8_t *kc[2], *vc[2];
    int64_t moved[2], q8r[2];
    for (int on = 0; on < 2; on++) {
        sr_bufs b = {dev_put(x, (size_t)nx * 4), dev_put(&pos, 4), dev_put(r, nb), dev_poison(nb), dev_poison(nb),
                     dev_poison(nb), dev_poison(nb), dev_put(xk, (size_t)L.kvd * 4), dev_put(xv, (size_t)L.kvd * 4)};
        mf_kv_pair kv = {sr_cache(kvt, k0, n_ctx, L.kvd), sr_cache(kvt, v0, n_ctx, L.kvd)};
        mf_exec_args a = args(n_past, 1, n_ctx, kvt);
        mf_error e;
        int64_t c0, c1;
        const int64_t s0 = mf_cuda_short_rope_count(be);
        mf_cuda_q8_ready_stats(be, &c0);
        sr_switches(on);
        sr_layer_exec(&L, &b, kv, &a, split);
        if (be->ops->synchronize(be, &e))
            die("shortrope node", &e);
        sr_default();
        mf_cuda_q8_ready_stats(be, &c1);
        moved[on] = mf_cuda_short_rope_count(be) - s0;
        q8r[on] = c1 - c0;
        ya[on] = dev_get(b.at, nb);
        yl[on] = dev_get(b.y, nb);
        if (!on)
            qo = dev_get(b.qkv, nb); /* the roped q (the fused path never writes it) */
        kc[on] = (uint8_t *)dev_get(kv.k, region);
        vc[on] = (uint8_t *)dev_get(kv.v, region);
        dev_free(b.x); dev_free(b.p); dev_free(b.r); dev_free(b.qkv); dev_free(b.at); dev_free(b.mm); dev_free(b.y);
        dev_free(b.xk); dev_free(b.xv); dev_free(kv.k); dev_free(kv.v);
    }
    char name[200], sub[260], det[140];
    snprintf(name, sizeof name, "shortrope node%s %s cache %d/%d/%d%s%s n_past %lld%s", epi ? " (epilogue)" : "",
             mf_type_name(kvt), s->n_head, s->n_head_kv, s->hd, s->bias ? " +bias" : "", s->norm ? " +qknorm" : "",
             (long long)n_past, split ? " sync between" : "");
    snprintf(sub, sizeof sub, "%s: on == off", name);
    check_true(sub, !memcmp(ya[0], ya[1], nb) && !memcmp(yl[0], yl[1], nb) && !memcmp(kc[0], kc[1], region) &&
                        !memcmp(vc[0], vc[1], region) && count_nan(yl[1], L.qd) == 0,
               "(bitwise: attention, layer, whole K / V caches)");
    snprintf(det, sizeof det, "(fused launches: off %lld, on %lld; x-ready o GEMVs %lld / %lld; want 0 %lld 1 1)",
             (long long)moved[0], (long long)moved[1], (long long)q8r[0], (long long)q8r[1], (long long)want);
    snprintf(sub, sizeof sub, "%s: fold taken %s", name, want ? "when on" : "never");
    check_true(sub, moved[0] == 0 && moved[1] == want && q8r[0] == 1 && q8r[1] == 1, det);
    /* float64 over what the off run left: its roped q (the QKV output) and
     * its caches, new row included */
    {
        const int64_t n_kv = n_past + 1;
        float *hk = malloc((size_t)(L.kvd * n_kv) * 4), *hv = malloc((size_t)(L.kvd * n_kv) * 4);
        mf_dequantize_rows(kvt, kc[0], hk, n_kv, L.kvd);
        mf_dequantize_rows(kvt, vc[0], hv, n_kv, L.kvd);
        double *ref = malloc((size_t)L.qd * sizeof *ref);
        da_ref(qo, hk, hv, s->n_head, s->n_head_kv, s->hd, n_past, 1, 1.0f / sqrtf((float)s->hd), ref);
        snprintf(sub, sizeof sub, "%s [on vs float64]", name);
        result(sub, rel_err(ya[1], ref, L.qd), 1e-4, count_nan(ya[1], L.qd), NULL);
        free(hk); free(hv); free(ref);
    }
    for (int on = 0; on < 2; on++) {
        free(ya[on]); free(yl[on]); free(kc[on]); free(vc[on]);
    }
    free(x); free(r); free(xk); free(xv); free(k0); free(v0); free(qo);
    mf_graph_free(&L.g);
}

/* CUDA graph replay with the switch on: the 0.5B layer (f16 cache of 400
 * random rows), n_past 40, 41, 100, 300 (1st step plain, 2nd captured, the
 * rest replayed: positions and n_past from device memory); then the same
 * steps without graphs and with the switch off on a fresh copy of the
 * cache: every step's attention and layer output bitwise equal, the final K
 * and V caches bitwise equal, the attention of each step within 1e-4 of
 * float64 over the off run's roped q and cache; captures >= 1, replays >= 2,
 * the fold in the captured forward. */
static void sr_graph(void) {
    const qkv_spec *s = &sr_specs[0];
    const uint32_t kvt = MF_TYPE_F16;
    const int32_t n_ctx = 400;
    const int64_t past[] = {40, 41, 100, 300};
    enum { STEPS = sizeof past / sizeof past[0] };
    sr_layer L;
    sr_layer_setup(&L, s, false);
    const size_t nb = (size_t)L.qd * 4, region = mf_type_row_size(kvt, L.kvd) * (size_t)n_ctx;
    float *k0 = rand_vec(L.kvd * n_ctx, 2.0f), *v0 = rand_vec(L.kvd * n_ctx, 1.0f);
    float *x[STEPS], *r[STEPS], *ya[2][STEPS], *yl[2][STEPS], *qo[STEPS];
    uint8_t *kc[2], *vc[2];
    for (int i = 0; i < STEPS; i++) {
        x[i] = rand_vec(s->d, 1.0f);
        r[i] = rand_vec(L.qd, 1.0f);
    }
    int64_t cap0 = 0, rep0 = 0, cap1 = 0, rep1 = 0, f0 = 0, f1 = 0;
    for (int on = 1; on >= 0; on--) {
        sr_bufs b = {dev_put(NULL, (size_t)s->d * 4), dev_put(NULL, 4), dev_put(NULL, nb), dev_poison(nb),
                     dev_poison(nb), dev_poison(nb), dev_poison(nb), -1, -1};
        mf_kv_pair kv = {sr_cache(kvt, k0, n_ctx, L.kvd), sr_cache(kvt, v0, n_ctx, L.kvd)};
        sr_switches(on);
        mf_cuda_set_graphs(be, on);
        if (on) {
            mf_cuda_graph_stats(be, &cap0, &rep0);
            f0 = mf_cuda_short_rope_count(be);
        }
        for (int i = 0; i < STEPS; i++) {
            const int32_t pos = (int32_t)past[i];
            mf_exec_args a = args(past[i], 1, n_ctx, kvt);
            mf_error e;
            if (mf_cuda_begin_forward(be, &L.g, &a, &e) || be->ops->write_host(be, b.x, 0, x[i], (size_t)s->d * 4, &e) ||
                be->ops->write_host(be, b.p, 0, &pos, 4, &e) || be->ops->write_host(be, b.r, 0, r[i], nb, &e))
                die("shortrope graph step", &e);
            sr_layer_exec(&L, &b, kv, &a, false);
            if (mf_cuda_end_forward(be, &L.g, &a, &e))
                die("shortrope graph step", &e);
            ya[on][i] = dev_get(b.at, nb);
            yl[on][i] = dev_get(b.y, nb);
            if (!on)
                qo[i] = dev_get(b.qkv, nb);
        }
        if (on) {
            mf_cuda_graph_stats(be, &cap1, &rep1);
            f1 = mf_cuda_short_rope_count(be);
        }
        kc[on] = (uint8_t *)dev_get(kv.k, region);
        vc[on] = (uint8_t *)dev_get(kv.v, region);
        dev_free(b.x); dev_free(b.p); dev_free(b.r); dev_free(b.qkv); dev_free(b.at); dev_free(b.mm); dev_free(b.y);
        dev_free(kv.k); dev_free(kv.v);
    }
    mf_cuda_set_graphs(be, !false);
    sr_default();
    bool same = !memcmp(kc[0], kc[1], region) && !memcmp(vc[0], vc[1], region);
    double worst = 0;
    int64_t nan = 0;
    float *hk = malloc((size_t)(L.kvd * n_ctx) * 4), *hv = malloc((size_t)(L.kvd * n_ctx) * 4);
    mf_dequantize_rows(kvt, kc[0], hk, n_ctx, L.kvd);
    mf_dequantize_rows(kvt, vc[0], hv, n_ctx, L.kvd);
    double *ref = malloc((size_t)L.qd * sizeof *ref);
    for (int i = 0; i < STEPS; i++) {
        same = same && !memcmp(ya[0][i], ya[1][i], nb) && !memcmp(yl[0][i], yl[1][i], nb);
        nan += count_nan(ya[1][i], L.qd) + count_nan(yl[1][i], L.qd);
        /* the final cache is what step i saw in rows <= past[i]: later steps write higher rows */
        da_ref(qo[i], hk, hv, s->n_head, s->n_head_kv, s->hd, past[i], 1, 1.0f / sqrtf((float)s->hd), ref);
        worst = fmax(worst, rel_err(ya[1][i], ref, L.qd));
    }
    char det[120];
    result("shortrope graph 0.5B f16, 4 steps (worst vs float64)", worst, 1e-4, nan, NULL);
    check_true("shortrope graph: replayed on == plain off", same, "(bitwise: every step's attention and layer, caches)");
    snprintf(det, sizeof det, "%lld captures, %lld replays, %lld fused launches", (long long)(cap1 - cap0),
             (long long)(rep1 - rep0), (long long)(f1 - f0));
    check_true("shortrope graph: steps replayed with the fold", cap1 - cap0 >= 1 && rep1 - rep0 >= STEPS - 2 && f1 > f0,
               det);
    for (int i = 0; i < STEPS; i++) {
        free(x[i]); free(r[i]); free(ya[0][i]); free(ya[1][i]); free(yl[0][i]); free(yl[1][i]); free(qo[i]);
    }
    for (int on = 0; on < 2; on++) {
        free(kc[on]); free(vc[on]);
    }
    free(k0); free(v0); free(hk); free(hv); free(ref);
    mf_graph_free(&L.g);
}

static void shortrope_family(void) {
    cudaStream_t st;
    if (!family_stream("shortrope", &st))
        return;
    /* 0.5B, 7B, Qwen3-4B (QkNorm) */
    const int32_t shapes[3][3] = {{14, 2, 64}, {28, 4, 128}, {32, 8, 128}};
    const uint32_t kvts[2] = {MF_TYPE_F32, MF_TYPE_F16};
    const int64_t depths[5] = {0, 1, 7, 100, 383};
    const int modes[2] = {MF_ROPE_NEOX, MF_ROPE_NORMAL};
    for (int s = 0; s < 3; s++)
        for (int m = 0; m < 2; m++)
            for (int k = 0; k < 2; k++)
                for (int d = 0; d < 5; d++)
                    if (!small || d % 2 == 1)
                        sr_case(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][2], modes[m], s == 2, depths[d],
                                kvts[k], st);
    /* partial rotation (dims past n_rot copied), QkNorm on the 0.5B shape */
    sr_case(14, 2, 64, 32, MF_ROPE_NEOX, true, 100, MF_TYPE_F16, st);
    sr_case(28, 4, 128, 64, MF_ROPE_NORMAL, false, 7, MF_TYPE_F32, st);
    sr_refusals(st);
    for (int s = 0; s < 3; s++) {
        sr_node(&sr_specs[s], false, 37, MF_TYPE_F16, false);
        if (!small)
            sr_node(&sr_specs[s], false, 383, MF_TYPE_F32, false);
    }
    sr_node(&sr_specs[0], false, 0, MF_TYPE_F16, false);
    sr_node(&sr_specs[0], true, 100, MF_TYPE_F16, false);  /* QKV_BIAS_ROPE_STORE */
    sr_node(&sr_specs[2], true, 5, MF_TYPE_F32, false);
    sr_node(&sr_specs[0], false, 100, MF_TYPE_F16, true);  /* flushed: rope_store + attn_short */
    sr_node(&sr_specs[0], false, 100, MF_TYPE_Q8_0, false); /* not taken: q8_0 cache */
    sr_graph();
    cudaStreamDestroy(st);
}

/* ---- helpers of the graph-replayed layer tails (families normmm, ffnq8b) ---------------------- */

/* Device copy of weight `wn` (+256 bytes: the GEMVs may read one word past a block). */
static void *gf_wdev(const char *wn) {
    const mf_weight *wt = mf_weights_find(W, wn);
    void *d = ds_alloc((size_t)wt->nbytes + 256, 0);
    cudaMemcpy(d, wt->data, (size_t)wt->nbytes, cudaMemcpyHostToDevice);
    return d;
}

/* A decode layer's FFN tail through the backend contract: RMSNORM ->
 * FUSED_FFN (gate/up + SwiGLU) -> MATMUL down -> ADD in place over the
 * residual, and the buffers it runs on (x and the residual uploaded each
 * step, the others poisoned). One per run: a graph captured before would
 * replay. */
typedef struct ffn_tail {
    mf_graph gr;
    int32_t ni, fi, mi, ai;         /* the nodes */
    int32_t bx, br, bn, bf, bm;     /* x, residual (= output), normed x, h, down */
    int64_t d, ff;
} ffn_tail;

static void ffn_tail_new(ffn_tail *t, int64_t d, int64_t ff, const char *norm, float eps, const mf_ffn_meta *m,
                         const char *down, uint32_t down_type) {
    t->d = d;
    t->ff = ff;
    graph_new(&t->gr, 0, 0);
    const int32_t xi = ext(&t->gr, d, 1), ri = ext(&t->gr, d, 1);
    t->ni = mf_g_rmsnorm(&t->gr, xi, norm, eps);
    t->fi = mf_g_fused_ffn(&t->gr, t->ni, m);
    t->mi = mf_g_matmul(&t->gr, t->fi, down, down_type, NULL, ff, d);
    t->ai = mf_g_add(&t->gr, ri, t->mi);
    t->bx = dev_put(NULL, (size_t)d * 4);
    t->br = dev_put(NULL, (size_t)d * 4);
    t->bn = dev_poison((size_t)d * 4);
    t->bf = dev_poison((size_t)ff * 4);
    t->bm = dev_poison((size_t)d * 4);
}

/* One forward at n_past with x and residual r: the layer output into y,
 * and h (the SwiGLU output) into h when non-NULL. */
static void ffn_tail_step(ffn_tail *t, int32_t n_past, const float *x, const float *r, float *y, float *h,
                          const char *what) {
    mf_exec_args a = args(n_past, 1, 64, MF_TYPE_F32);
    mf_error e;
    const mf_kv_pair nokv = {-1, -1};
    if (mf_cuda_begin_forward(be, &t->gr, &a, &e) ||
        be->ops->write_host(be, t->bx, 0, x, (size_t)t->d * 4, &e) ||
        be->ops->write_host(be, t->br, 0, r, (size_t)t->d * 4, &e) ||
        mf_cuda_execute_node(be, &t->gr, t->ni, &t->bx, t->bn, nokv, &a, &e) ||
        mf_cuda_execute_node(be, &t->gr, t->fi, &t->bn, t->bf, nokv, &a, &e) ||
        mf_cuda_execute_node(be, &t->gr, t->mi, &t->bf, t->bm, nokv, &a, &e) ||
        mf_cuda_execute_node(be, &t->gr, t->ai, (int32_t[]){t->br, t->bm}, t->br, nokv, &a, &e) ||
        mf_cuda_end_forward(be, &t->gr, &a, &e) || be->ops->synchronize(be, &e) ||
        be->ops->read_host(be, t->br, 0, y, (size_t)t->d * 4, &e) ||
        (h && be->ops->read_host(be, t->bf, 0, h, (size_t)t->ff * 4, &e)))
        die(what, &e);
}

static void ffn_tail_free(ffn_tail *t) {
    dev_free(t->bx); dev_free(t->br); dev_free(t->bn); dev_free(t->bf); dev_free(t->bm);
    mf_graph_free(&t->gr);
}

/* float64 reference of the tail over `steps` tokens: norm (weight `norm`),
 * gate/up (+ biases, NULL: none) + SwiGLU, down, + the residual rs. */
static double *ffn_tail_ref(const float *xs, const float *rs, const char *norm, float eps, const char *gn,
                            const char *bgn, const char *un, const char *bun, const char *dn, int64_t d, int64_t ff,
                            int64_t steps) {
    double *xn = malloc((size_t)(d * steps) * sizeof *xn), *g = malloc((size_t)(ff * steps) * sizeof *g);
    double *u = malloc((size_t)(ff * steps) * sizeof *u), *ref = malloc((size_t)(d * steps) * sizeof *ref);
    /* zeroed: gcc cannot see the loops below fill them before ref_matmul reads */
    float *xnf = calloc((size_t)(d * steps), 4), *hf = calloc((size_t)(ff * steps), 4);
    ref_rmsnorm(xs, wf32(norm), xn, d, steps, eps);
    for (int64_t i = 0; i < d * steps; i++)
        xnf[i] = (float)xn[i];
    ref_matmul(gn, xnf, d, ff, steps, bgn, g);
    ref_matmul(un, xnf, d, ff, steps, bun, u);
    for (int64_t i = 0; i < ff * steps; i++)
        hf[i] = (float)(g[i] / (1 + exp(-g[i])) * u[i]);
    ref_matmul(dn, hf, ff, d, steps, NULL, ref);
    for (int64_t i = 0; i < d * steps; i++)
        ref[i] += rs[i];
    free(xn); free(g); free(u); free(xnf); free(hf);
    return ref;
}
/* The output norm folded into the lm_head's quantization (norm_fusable's
 * MATMUL consumer, MINFER_CUDA_NORM_MM): RMSNORM -> MATMUL (the graph's
 * output) for 4 decode steps with CUDA graphs, fold on and off. On: the
 * norm was folded (mf_cuda_fuse_stats) and the graph replayed; both vs
 * float64 (int8 tier, 1e-2) and on vs off bitwise (the fold quantizes the
 * same normed floats: 0 allowed). Weights: a Q8_0 896-wide head (the
 * 0.5B's lm_head type) and a Q6_K 3584-wide one (the 7B's), 3000 rows. */
static void normmm_weights(void) {
    add_weight("nm.q8_0.896x3000", MF_TYPE_Q8_0, 896, 3000);
    add_weight("nm.q6_k.3584x3000", MF_TYPE_Q6_K, 3584, 3000);
}

static void normmm_case(const char *wn, uint32_t t, int64_t d) {
    const int64_t nv = 3000;
    char nn[32];
    snprintf(nn, sizeof nn, "norm.%lld", (long long)d);
    const float eps = 1e-6f;
    enum { STEPS = 4 };
    float *xs = rand_vec(d * STEPS, 2.0f);
    double *xn = malloc((size_t)(d * STEPS) * sizeof *xn), *ref = malloc((size_t)(nv * STEPS) * sizeof *ref);
    float *xnf = malloc((size_t)(d * STEPS) * 4);
    ref_rmsnorm(xs, wf32(nn), xn, d, STEPS, eps);
    for (int64_t i = 0; i < d * STEPS; i++)
        xnf[i] = (float)xn[i];
    ref_matmul(wn, xnf, d, nv, STEPS, NULL, ref);
    float *y[2];
    int64_t norms[2], reps[2];
    for (int on = 1; on >= 0; on--) {
        mf_graph gr; /* one graph per run: a graph captured before would replay */
        graph_new(&gr, 0, 0);
        const int32_t xi = ext(&gr, d, 1);
        const int32_t ni = mf_g_rmsnorm(&gr, xi, nn, eps);
        const int32_t mi = mf_g_matmul(&gr, ni, wn, t, NULL, d, nv);
        gr.nodes[mi].flags |= MF_NODE_OUTPUT;
        const int32_t bx = dev_put(NULL, (size_t)d * 4), bn = dev_poison((size_t)d * 4);
        const int32_t by = dev_poison((size_t)nv * 4);
        y[on] = malloc((size_t)(nv * STEPS) * 4);
        t_fuse_norm(be, true);
        t_norm_mm(be, on);
        mf_cuda_set_graphs(be, true);
        int64_t a0, n0, c0, r0, a1, n1, c1, r1;
        mf_cuda_fuse_stats(be, &a0, &n0);
        mf_cuda_graph_stats(be, &c0, &r0);
        mf_error e;
        for (int s = 0; s < STEPS; s++) {
            mf_exec_args a = args(10 + s, 1, 64, MF_TYPE_F32);
            if (mf_cuda_begin_forward(be, &gr, &a, &e) ||
                be->ops->write_host(be, bx, 0, xs + s * d, (size_t)d * 4, &e) ||
                mf_cuda_execute_node(be, &gr, ni, &bx, bn, (mf_kv_pair){-1, -1}, &a, &e) ||
                mf_cuda_execute_node(be, &gr, mi, &bn, by, (mf_kv_pair){-1, -1}, &a, &e) ||
                mf_cuda_end_forward(be, &gr, &a, &e) || be->ops->synchronize(be, &e) ||
                be->ops->read_host(be, by, 0, y[on] + s * nv, (size_t)nv * 4, &e))
                die("normmm step", &e);
        }
        mf_cuda_fuse_stats(be, &a1, &n1);
        mf_cuda_graph_stats(be, &c1, &r1);
        norms[on] = n1 - n0;
        reps[on] = r1 - r0;
        dev_free(bx); dev_free(bn); dev_free(by);
        mf_graph_free(&gr);
    }
    t_fuse_norm(be, tune0.fuse_norm != 0);
    t_norm_mm(be, tune0.norm_mm != 0);
    mf_cuda_set_graphs(be, !false);
    char name[120], det[160];
    snprintf(det, sizeof det, "(folded norms %lld, replays %lld; off: %lld, %lld)", (long long)norms[1],
             (long long)reps[1], (long long)norms[0], (long long)reps[0]);
    snprintf(name, sizeof name, "normmm %s: norm folded into the matmul, replayed", mf_type_name(t));
    check_true(name, norms[1] >= 2 && norms[0] == 0 && reps[1] >= STEPS - 3, det);
    snprintf(name, sizeof name, "normmm %s %lld -> %lld: 4 steps vs float64", mf_type_name(t), (long long)d,
             (long long)nv);
    result(name, rel_err(y[1], ref, nv * STEPS), 1e-2, count_nan(y[1], nv * STEPS), NULL);
    snprintf(name, sizeof name, "normmm %s: folded vs separate norm", mf_type_name(t));
    result(name, rel_err_f(y[1], y[0], nv * STEPS), 0.0, count_nan(y[0], nv * STEPS), NULL);
    free(y[0]); free(y[1]); free(xs); free(xn); free(ref); free(xnf);
}

/* ---- the mixed-type QKV on one v4 GEMV launch (family "qkvmix") ---------------------------- */

/* A fused QKV (or any 2-3 weight group) whose weights form two runs of
 * different types: the K-quant mixes' use_more_bits layers (tools/quant_mix.c). */
typedef struct qm_spec {
    const char *what;
    int64_t n_in;
    int n_w;
    uint32_t t[3];
    int64_t n_out[3];
    bool bias;
} qm_spec;

static int qm_specs(qm_spec *c) {
    int n = 0;
    c[n++] = (qm_spec){"0.5B Q4_K_M", 896, 3, {MF_TYPE_Q5_0, MF_TYPE_Q5_0, MF_TYPE_Q8_0}, {896, 128, 128}, true};
    c[n++] = (qm_spec){"7B Q4_K_M", 3584, 3, {MF_TYPE_Q4_K, MF_TYPE_Q4_K, MF_TYPE_Q6_K}, {3584, 512, 512}, true};
    c[n++] = (qm_spec){"4B Q4_K_M", 2560, 3, {MF_TYPE_Q4_K, MF_TYPE_Q4_K, MF_TYPE_Q6_K}, {4096, 1024, 1024}, false};
    c[n++] = (qm_spec){"0.5B Q3_K_M", 896, 3, {MF_TYPE_Q4_0, MF_TYPE_Q4_0, MF_TYPE_Q5_0}, {896, 128, 128}, true};
    /* odd run lengths: the last row pair of each run is half empty */
    c[n++] = (qm_spec){"odd rows", 896, 3, {MF_TYPE_Q5_0, MF_TYPE_Q5_0, MF_TYPE_Q8_0}, {97, 32, 65}, true};
    /* the instance's second type first (the launcher swaps the runs), and two weights */
    c[n++] = (qm_spec){"V first", 3584, 3, {MF_TYPE_Q6_K, MF_TYPE_Q4_K, MF_TYPE_Q4_K}, {512, 512, 512}, false};
    c[n++] = (qm_spec){"two weights", 896, 2, {MF_TYPE_Q8_0, MF_TYPE_Q5_0, 0}, {128, 896, 0}, true};
    return n;
}

static void qm_wname(char *buf, size_t n, int si, int k, const qm_spec *s) {
    snprintf(buf, n, "qm%d.%d.%s.%lldx%lld", si, k, mf_type_name(s->t[k]), (long long)s->n_in,
             (long long)s->n_out[k]);
}

/* The switch through the backend: tune qkv_mix=0 / 1 (mf_cuda_retune on
 * the live backend; the environment variable of that name is no longer
 * read by the backend), FUSED_QKV nodes (fused int8 GEMV, hook
 * mf_cuda_set_fuse) over 4 decode steps with CUDA graphs (the first step
 * plain, then capture and replays; n_past 10..13, f32 cache), switch off
 * and on: every step's q output and the cache rows it stored (K after
 * rope, V) bitwise equal, NaN-free (outputs and caches poisoned), one
 * mixed launch per step launched from the host with the switch on (plain
 * steps and the capture; replays launch nothing), none off, and the graph
 * replayed. */
static const qkv_spec qm_qkv[] = {
    {MF_TYPE_Q5_0, 896, 14, 2, 64, true, false, MF_ROPE_NEOX, MF_TYPE_Q8_0},   /* qwen2 0.5B Q4_K_M */
    {MF_TYPE_Q4_K, 3584, 28, 4, 128, true, false, MF_ROPE_NEOX, MF_TYPE_Q6_K}, /* qwen2 7B Q4_K_M */
    {MF_TYPE_Q4_K, 2560, 32, 8, 128, false, true, MF_ROPE_NEOX, MF_TYPE_Q6_K}, /* qwen3 4B Q4_K_M */
};

static void qm_backend(const qkv_spec *s) {
    enum { STEPS = 4 };
    char nm[6][64];
    const mf_qkv_meta m = qkv_meta(s, nm);
    const int64_t qd = (int64_t)s->n_head * s->hd, kvd = (int64_t)s->n_head_kv * s->hd;
    const int32_t n_ctx = 64;
    const size_t region = (size_t)(kvd * n_ctx) * 4;
    float *xs = rand_vec(s->d * STEPS, 1.0f);
    float *q[2], *kc[2], *vc[2];
    int64_t moved[2], reps[2];
    for (int mix = 0; mix < 2; mix++) {
        mf_graph g; /* one graph per run: a graph captured before would replay */
        graph_new(&g, 1, kvd);
        const int32_t xi = ext(&g, s->d, 1);
        const int32_t pi = mf_g_input(&g, MF_INPUT_POSITIONS, MF_DTYPE_I32, 1, 1);
        const int32_t node = mf_g_fused_qkv(&g, xi, pi, &m);
        const int32_t bx = dev_put(NULL, (size_t)s->d * 4), bp = dev_put(NULL, 4);
        const int32_t bo = dev_poison((size_t)qd * 4);
        mf_kv_pair kv = {dev_poison(region), dev_poison(region)};
        t_reset_gemv(be);
        tune("qkv_mix=%d", mix);
        t_fuse(be, true);
        mf_cuda_set_graphs(be, true);
        int64_t c0, r0, c1, r1;
        mf_cuda_graph_stats(be, &c0, &r0);
        const int64_t m0 = mf_cu_q8v4_mix_count();
        q[mix] = malloc((size_t)(qd * STEPS) * 4);
        mf_error e;
        for (int t = 0; t < STEPS; t++) {
            const int32_t pos = 10 + t;
            mf_exec_args a = args(pos, 1, n_ctx, MF_TYPE_F32);
            if (mf_cuda_begin_forward(be, &g, &a, &e) ||
                be->ops->write_host(be, bx, 0, xs + t * s->d, (size_t)s->d * 4, &e) ||
                be->ops->write_host(be, bp, 0, &pos, 4, &e) ||
                mf_cuda_execute_node(be, &g, node, (int32_t[]){bx, bp}, bo, kv, &a, &e) ||
                mf_cuda_end_forward(be, &g, &a, &e) || be->ops->synchronize(be, &e) ||
                be->ops->read_host(be, bo, 0, q[mix] + t * qd, (size_t)qd * 4, &e))
                die("qkvmix backend step", &e);
        }
        moved[mix] = mf_cu_q8v4_mix_count() - m0;
        mf_cuda_graph_stats(be, &c1, &r1);
        reps[mix] = r1 - r0;
        kc[mix] = dev_get(kv.k, region);
        vc[mix] = dev_get(kv.v, region);
        dev_free(bx); dev_free(bp); dev_free(bo); dev_free(kv.k); dev_free(kv.v);
        mf_graph_free(&g);
    }
    t_reset_gemv(be); /* qkv_mix back to tune0's */
    t_fuse(be, tune0.fuse_gemv);
    mf_cuda_set_graphs(be, !false);
    const size_t rows = (size_t)(kvd * STEPS) * 4, at = (size_t)(kvd * 10); /* the rows stored: n_past 10..13 */
    const bool same = memcmp(q[1], q[0], (size_t)(qd * STEPS) * 4) == 0 && memcmp(kc[1] + at, kc[0] + at, rows) == 0 &&
                      memcmp(vc[1] + at, vc[0] + at, rows) == 0;
    const int64_t nan = count_nan(q[0], qd * STEPS) + count_nan(q[1], qd * STEPS) + count_nan(kc[0] + at, kvd * STEPS) +
                        count_nan(kc[1] + at, kvd * STEPS) + count_nan(vc[0] + at, kvd * STEPS) +
                        count_nan(vc[1] + at, kvd * STEPS);
    char name[160], det[160];
    snprintf(name, sizeof name, "qkvmix backend %s%s+%s d %lld: 4 graph steps on == off", mf_type_name(s->type),
             s->norm ? "+qknorm" : "", mf_type_name(s->vtype), (long long)s->d);
    snprintf(det, sizeof det, "(q, K, V bitwise; NaN %lld; mixed launches on %lld off %lld; replays %lld / %lld)",
             (long long)nan, (long long)moved[1], (long long)moved[0], (long long)reps[1], (long long)reps[0]);
    check_true(name, same && nan == 0 && moved[0] == 0 && moved[1] >= 1 && moved[1] == STEPS - reps[1] &&
                         reps[1] >= STEPS - 3,
               det);
    for (int i = 0; i < 2; i++) {
        free(q[i]); free(kc[i]); free(vc[i]);
    }
    free(xs);
}

static void qkvmix_weights(void) {
    qm_spec c[16];
    const int n = qm_specs(c);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < c[i].n_w; k++) {
            char wn[80];
            qm_wname(wn, sizeof wn, i, k, &c[i]);
            add_weight(wn, c[i].t[k], c[i].n_in, c[i].n_out[k]);
            snprintf(wn, sizeof wn, "qm%d.%d.bias", i, k);
            add_f32(wn, c[i].n_out[k], 0.5f, 0.0f);
        }
    for (size_t i = 0; i < sizeof qm_qkv / sizeof qm_qkv[0]; i++)
        qkv_weights(&qm_qkv[i]);
}

/* Device buffers of one qkvmix case: weights (+256 bytes, gf_wdev), biases,
 * residuals, outputs, the norm weight, x and the q8 scratch. */
typedef struct qm_dev {
    void *w[3], *q8;
    float *b[3], *r[3], *y[3], *x, *nw;
} qm_dev;

static mf_cu_q8_multi_args qm_args(const qm_spec *s, const qm_dev *d, bool bias, bool res, bool norm, int mix) {
    mf_cu_q8_multi_args a = {.n_w = s->n_w, .x = d->x, .n_in = s->n_in, .nt = 1, .q8 = d->q8, .norm = norm,
                             .norm_w = norm ? d->nw : NULL, .norm_eps = 1e-6f, .gemv_auto = 1, .gt = gt_of(-1),
                             .qkv_mix = mix};
    for (int k = 0; k < s->n_w; k++) {
        a.wtype[k] = s->t[k];
        a.w[k] = d->w[k];
        a.row_bytes[k] = mf_type_row_size(s->t[k], s->n_in);
        a.bias[k] = bias ? d->b[k] : NULL;
        a.res[k] = res ? d->r[k] : NULL;
        a.y[k] = d->y[k];
        a.n_out[k] = s->n_out[k];
    }
    return a;
}

/* One case through mf_cu_gemv_q8_multi at nt 1 (the decode form: v4 by the
 * auto rule, the norm folded into the quantization or not, bias and a
 * residual epilogue as asked): run 0 with MINFER_CUDA_QKV_MIX off (one v4
 * launch per type run), runs 1 and 2 with it on, PDL on and off. Every run
 * on outputs poisoned with another pattern (NaN, -1.7e38, NaN), vs float64
 * on 24 sampled rows per weight (3e-2 norm-wise and every sample within
 * the int8 rounding bound, family gemv's); the mixed runs bitwise the
 * separate one over every output, and the mixed kernel counted once per
 * mixed run (mf_cu_q8v4_mix_count), never for the separate run. */
static void qm_test(int si, const qm_spec *s, bool bias, bool res, bool norm) {
    const int64_t n_in = s->n_in;
    const float eps = 1e-6f;
    float *x = rand_vec(n_in, 1.0f), *nw = rand_vec(n_in, 0.5f);
    for (int64_t i = 0; i < n_in; i++)
        nw[i] += 1.0f;
    for (int64_t i = 0; i < n_in; i += 97) /* a few large activations: units of mixed scale */
        x[i] *= 8.0f;
    float *xn = malloc((size_t)n_in * 4);
    double ss = 0;
    for (int64_t i = 0; i < n_in; i++)
        ss += (double)x[i] * x[i];
    const float sc = (float)(1.0 / sqrt(ss / (double)n_in + (double)eps));
    for (int64_t i = 0; i < n_in; i++)
        xn[i] = norm ? x[i] * sc * nw[i] : x[i];
    qm_dev d = {.x = ds_put(x, (size_t)n_in * 4), .nw = ds_put(nw, (size_t)n_in * 4),
                .q8 = ds_alloc(mf_cu_q8_bytes(n_in, 1), 0x5a)};
    char wn[3][80];
    float *hr[3] = {NULL, NULL, NULL};
    for (int k = 0; k < s->n_w; k++) {
        char bn[40];
        qm_wname(wn[k], sizeof wn[k], si, k, s);
        snprintf(bn, sizeof bn, "qm%d.%d.bias", si, k);
        d.w[k] = gf_wdev(wn[k]);
        d.b[k] = ds_put(wf32(bn), (size_t)s->n_out[k] * 4);
        hr[k] = rand_vec(s->n_out[k], 1.0f);
        d.r[k] = ds_put(hr[k], (size_t)s->n_out[k] * 4);
        d.y[k] = ds_alloc((size_t)s->n_out[k] * 4, 0xff);
    }
    enum { NS = 24 };
    int64_t rows[3][NS];
    double ref[3][NS], bound[3][NS];
    double *wr = malloc((size_t)n_in * sizeof *wr);
    for (int k = 0; k < s->n_w; k++) {
        char bn[40];
        snprintf(bn, sizeof bn, "qm%d.%d.bias", si, k);
        for (int i = 0; i < NS; i++) {
            const int64_t o = i == 0 ? 0 : i == 1 ? s->n_out[k] - 1 : (int64_t)(next_u64() % (uint64_t)s->n_out[k]);
            rows[k][i] = o;
            ref_row(wn[k], o, wr);
            ref[k][i] = int8_dot(wr, xn, n_in, &bound[k][i]) + (bias ? wf32(bn)[o] : 0.0) + (res ? hr[k][o] : 0.0);
        }
    }
    char name[200], sub[260];
    int kn = snprintf(name, sizeof name, "qkvmix %-11s %lld->", s->what, (long long)n_in);
    for (int k = 0; k < s->n_w && kn > 0 && (size_t)kn < sizeof name; k++)
        kn += snprintf(name + kn, sizeof name - (size_t)kn, "%s%lld %s", k ? "/" : "", (long long)s->n_out[k],
                       mf_type_name(s->t[k]));
    snprintf(name + strlen(name), sizeof name - strlen(name), "%s%s%s", bias ? " +bias" : "", res ? " +res" : "",
             norm ? " +norm" : "");
    const bool pdl0 = tune0.pdl != 0;
    static const int poison[3] = {0xff, 0xfe, 0xff};
    static const char *const rn[3] = {"separate", "mixed", "mixed pdl0"};
    cudaStream_t st;
    cudaStreamCreate(&st);
    float *out[3][3];
    int64_t moved[3];
    for (int run = 0; run < 3; run++) {
        for (int k = 0; k < s->n_w; k++)
            cudaMemset(d.y[k], poison[run], (size_t)s->n_out[k] * 4);
        t_pdl(run == 2 ? 0 : 1);
        const mf_cu_q8_multi_args a = qm_args(s, &d, bias, res, norm, run > 0);
        const int64_t c0 = mf_cu_q8v4_mix_count();
        ds_sync("qkvmix gemv", mf_cu_gemv_q8_multi(&a, st), st);
        moved[run] = mf_cu_q8v4_mix_count() - c0;
        for (int k = 0; k < s->n_w; k++)
            out[run][k] = ds_get(d.y[k], (size_t)s->n_out[k] * 4);
    }
    t_pdl(pdl0);
    for (int run = 0; run < 3; run++) {
        float got[3 * NS];
        double r64[3 * NS], worst = 0;
        int64_t nan = 0, m = 0;
        for (int k = 0; k < s->n_w; k++) {
            nan += count_nan(out[run][k], s->n_out[k]);
            for (int i = 0; i < NS; i++, m++) {
                got[m] = out[run][k][rows[k][i]];
                r64[m] = ref[k][i];
                worst = fmax(worst, fabs((double)got[m] - r64[m]) / bound[k][i]);
            }
        }
        snprintf(sub, sizeof sub, "%s [%s]", name, rn[run]);
        result(sub, rel_err(got, r64, m), 3e-2, nan, NULL);
        char det[64];
        snprintf(det, sizeof det, "worst |err| / bound %.3f", worst);
        snprintf(sub, sizeof sub, "%s [%s]: int8 bound", name, rn[run]);
        check_true(sub, worst <= 1.0, det);
        if (run > 0) {
            bool same = true;
            for (int k = 0; k < s->n_w; k++)
                same = same && memcmp(out[run][k], out[0][k], (size_t)s->n_out[k] * 4) == 0;
            snprintf(sub, sizeof sub, "%s [%s == separate]", name, rn[run]);
            check_true(sub, same, "bitwise, every output");
        }
    }
    char det[96];
    snprintf(det, sizeof det, "(mixed launches: separate %lld, mixed %lld / %lld)", (long long)moved[0],
             (long long)moved[1], (long long)moved[2]);
    snprintf(sub, sizeof sub, "%s: one mixed launch", name);
    check_true(sub, moved[0] == 0 && moved[1] == 1 && moved[2] == 1, det);
    for (int run = 0; run < 3; run++)
        for (int k = 0; k < s->n_w; k++)
            free(out[run][k]);
    cudaStreamDestroy(st);
    for (int k = 0; k < s->n_w; k++) {
        cudaFree(d.w[k]); cudaFree(d.b[k]); cudaFree(d.r[k]); cudaFree(d.y[k]);
        free(hr[k]);
    }
    cudaFree(d.x); cudaFree(d.nw); cudaFree(d.q8);
    free(x); free(nw); free(xn); free(wr);
}

/* Where no mixed kernel applies the switch changes nothing: two slices in
 * flight forced (MINFER_CUDA_GEMV_V4=2), the Q6_K slice decoder off
 * (MINFER_CUDA_GEMV_V4_Q6K=0: V on the generic decoder), v4 off: no mixed
 * launch, outputs bitwise the switch off. */
static void qm_fallback(int si, const qm_spec *s) {
    qm_dev d = {.q8 = ds_alloc(mf_cu_q8_bytes(s->n_in, 1), 0x5a)};
    float *x = rand_vec(s->n_in, 1.0f);
    d.x = ds_put(x, (size_t)s->n_in * 4);
    char wn[80];
    for (int k = 0; k < s->n_w; k++) {
        qm_wname(wn, sizeof wn, si, k, s);
        d.w[k] = gf_wdev(wn);
        d.y[k] = ds_alloc((size_t)s->n_out[k] * 4, 0xff);
    }
    cudaStream_t st;
    cudaStreamCreate(&st);
    static const char *const why[3] = {"v4 u2 forced", "Q6_K slice decoder off", "v4 off"};
    for (int f = 0; f < 3; f++) {
        float *out[2][3];
        int64_t moved = 0;
        for (int mix = 0; mix < 2; mix++) {
            mf_cu_q8_multi_args a = qm_args(s, &d, false, false, false, mix);
            t_gemv_v4_q6k(f == 1 ? 0 : 1);
            a.gt = gt_of(f == 0 ? 2 : f == 1 ? -1 : 0);
            for (int k = 0; k < s->n_w; k++)
                cudaMemset(d.y[k], mix ? 0xfe : 0xff, (size_t)s->n_out[k] * 4);
            const int64_t c0 = mf_cu_q8v4_mix_count();
            ds_sync("qkvmix fallback", mf_cu_gemv_q8_multi(&a, st), st);
            moved += mf_cu_q8v4_mix_count() - c0;
            for (int k = 0; k < s->n_w; k++)
                out[mix][k] = ds_get(d.y[k], (size_t)s->n_out[k] * 4);
        }
        t_gemv_v4_q6k((int)tune0.v4_q6k);
        bool same = true;
        int64_t nan = 0;
        for (int k = 0; k < s->n_w; k++) {
            same = same && memcmp(out[1][k], out[0][k], (size_t)s->n_out[k] * 4) == 0;
            nan += count_nan(out[1][k], s->n_out[k]);
            free(out[0][k]);
            free(out[1][k]);
        }
        char name[160], det[80];
        snprintf(name, sizeof name, "qkvmix %s, %s: switch on == off", s->what, why[f]);
        snprintf(det, sizeof det, "(mixed launches %lld, NaN %lld; bitwise)", (long long)moved, (long long)nan);
        check_true(name, same && moved == 0 && nan == 0, det);
    }
    cudaStreamDestroy(st);
    for (int k = 0; k < s->n_w; k++) {
        cudaFree(d.w[k]);
        cudaFree(d.y[k]);
    }
    cudaFree(d.x); cudaFree(d.q8);
    free(x);
}

/* The mixed launch in a CUDA graph: norm-quant + mixed QKV captured once
 * (PDL on, the decode graph's form), replayed for 4 steps with a new x and
 * poisoned outputs each; every step bitwise the separate launches run
 * plainly on that x, the mixed kernel counted once (the capture). */
static void qm_graph(int si, const qm_spec *s) {
    enum { STEPS = 4 };
    const int64_t n_in = s->n_in;
    float *xs = rand_vec(n_in * STEPS, 2.0f), *nw = rand_vec(n_in, 0.5f);
    for (int64_t i = 0; i < n_in; i++)
        nw[i] += 1.0f;
    qm_dev d = {.x = ds_alloc((size_t)n_in * 4, 0), .nw = ds_put(nw, (size_t)n_in * 4),
                .q8 = ds_alloc(mf_cu_q8_bytes(n_in, 1), 0x5a)};
    char wn[80], bn[40];
    for (int k = 0; k < s->n_w; k++) {
        qm_wname(wn, sizeof wn, si, k, s);
        snprintf(bn, sizeof bn, "qm%d.%d.bias", si, k);
        d.w[k] = gf_wdev(wn);
        d.b[k] = ds_put(wf32(bn), (size_t)s->n_out[k] * 4);
        d.y[k] = ds_alloc((size_t)s->n_out[k] * 4, 0xff);
    }
    const bool pdl0 = tune0.pdl != 0;
    t_pdl(1);
    cudaStream_t st;
    cudaStreamCreate(&st);
    float *ref[STEPS][3];
    for (int t = 0; t < STEPS; t++) { /* the separate launches, plain */
        cudaMemcpy(d.x, xs + t * n_in, (size_t)n_in * 4, cudaMemcpyHostToDevice);
        const mf_cu_q8_multi_args a = qm_args(s, &d, s->bias, false, true, 0);
        ds_sync("qkvmix graph ref", mf_cu_gemv_q8_multi(&a, st), st);
        for (int k = 0; k < s->n_w; k++)
            ref[t][k] = ds_get(d.y[k], (size_t)s->n_out[k] * 4);
    }
    const mf_cu_q8_multi_args a = qm_args(s, &d, s->bias, false, true, 1);
    const int64_t c0 = mf_cu_q8v4_mix_count();
    cudaGraph_t gr = NULL;
    cudaGraphExec_t ge = NULL;
    cudaError_t e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
        const cudaError_t le = mf_cu_gemv_q8_multi(&a, st);
        e = cudaStreamEndCapture(st, &gr);
        e = le != cudaSuccess ? le : e;
    }
    if (e == cudaSuccess)
        e = cudaGraphInstantiate(&ge, gr, 0);
    ds_sync("qkvmix graph capture", e, st);
    const int64_t captured = mf_cu_q8v4_mix_count() - c0;
    bool same = true;
    int64_t nan = 0;
    for (int t = 0; t < STEPS; t++) {
        cudaMemcpyAsync(d.x, xs + t * n_in, (size_t)n_in * 4, cudaMemcpyHostToDevice, st);
        for (int k = 0; k < s->n_w; k++)
            cudaMemsetAsync(d.y[k], t & 1 ? 0xfe : 0xff, (size_t)s->n_out[k] * 4, st);
        ds_sync("qkvmix graph replay", cudaGraphLaunch(ge, st), st);
        for (int k = 0; k < s->n_w; k++) {
            float *y = ds_get(d.y[k], (size_t)s->n_out[k] * 4);
            same = same && memcmp(y, ref[t][k], (size_t)s->n_out[k] * 4) == 0;
            nan += count_nan(y, s->n_out[k]);
            free(y);
            free(ref[t][k]);
        }
    }
    const int64_t replayed = mf_cu_q8v4_mix_count() - c0 - captured;
    t_pdl(pdl0);
    char name[160], det[120];
    snprintf(name, sizeof name, "qkvmix graph %s: %d replays == separate", s->what, STEPS);
    snprintf(det, sizeof det, "(mixed launches captured %lld, host launches in replays %lld, NaN %lld; bitwise)",
             (long long)captured, (long long)replayed, (long long)nan);
    check_true(name, same && captured == 1 && replayed == 0 && nan == 0, det);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(gr);
    cudaStreamDestroy(st);
    for (int k = 0; k < s->n_w; k++) {
        cudaFree(d.w[k]); cudaFree(d.b[k]); cudaFree(d.y[k]);
    }
    cudaFree(d.x); cudaFree(d.nw); cudaFree(d.q8);
    free(xs); free(nw);
}

static void qkvmix_family(void) {
    qm_spec c[16];
    const int n = qm_specs(c);
    for (int i = 0; i < n; i++) {
        const bool model = i < 4; /* the model shapes: every epilogue form */
        qm_test(i, &c[i], c[i].bias, false, true);
        qm_test(i, &c[i], !c[i].bias, true, false);
        if (model && !small) {
            qm_test(i, &c[i], true, true, true);
            qm_test(i, &c[i], false, false, false);
        }
    }
    qm_fallback(1, &c[1]);
    qm_graph(0, &c[0]);
    qm_graph(1, &c[1]);
    for (size_t i = 0; i < sizeof qm_qkv / sizeof qm_qkv[0]; i++)
        qm_backend(&qm_qkv[i]);
}

/* ---- the SwiGLU GEMV writing the down GEMV's int8 input (family "ffnq8b") ------------------------ */

/* One shape of family ffnq8b: gate / up d -> ff of type t, down ff -> d of
 * the same type, registered as fq.<type>.<d>x<ff>.{g,u,d} with biases
 * fq.b.<type>.<d>x<ff>.{g,u} and the norm weight fq.norm.<d>. */
typedef struct fq_spec {
    const char *what;
    uint32_t t;
    int64_t d, ff;
} fq_spec;

static int fq_specs(fq_spec *c) {
    int n = 0;
    c[n++] = (fq_spec){"0.5B", MF_TYPE_Q4_0, 896, 4864};
    c[n++] = (fq_spec){"0.5B", MF_TYPE_Q5_0, 896, 4864}; /* the 0.5B Q4_K_M's gate/up */
    c[n++] = (fq_spec){"0.5B", MF_TYPE_Q8_0, 896, 4864};
    c[n++] = (fq_spec){"1.5B", MF_TYPE_Q4_K, 1536, 8960};
    c[n++] = (fq_spec){"1.5B", MF_TYPE_Q5_0, 1536, 8960};
    c[n++] = (fq_spec){"1.5B", MF_TYPE_Q8_0, 1536, 8960};
    c[n++] = (fq_spec){"1.5B", MF_TYPE_Q6_K, 1536, 8960};
    c[n++] = (fq_spec){"2048", MF_TYPE_Q4_0, 2048, 8192};
    c[n++] = (fq_spec){"2048", MF_TYPE_Q4_K, 2048, 8192};
    c[n++] = (fq_spec){"2048", MF_TYPE_Q5_0, 2048, 8192};
    c[n++] = (fq_spec){"2048", MF_TYPE_Q8_0, 2048, 8192};
    c[n++] = (fq_spec){"1.5B", MF_TYPE_Q4_0, 1536, 8960};
    return n;
}

static void fq_wname(char *buf, size_t n, const fq_spec *s, const char *k) {
    snprintf(buf, n, "fq.%s.%lldx%lld.%s", mf_type_name(s->t), (long long)s->d, (long long)s->ff, k);
}

/* A case's weight names: gate, up, down, the two biases, the norm. */
typedef struct fq_names {
    char g[96], u[96], d[96], bg[96], bu[96], norm[64];
} fq_names;

static void fq_names_of(const fq_spec *s, fq_names *n) {
    fq_wname(n->g, sizeof n->g, s, "g");
    fq_wname(n->u, sizeof n->u, s, "u");
    fq_wname(n->d, sizeof n->d, s, "d");
    fq_wname(n->bg, sizeof n->bg, s, "bg");
    fq_wname(n->bu, sizeof n->bu, s, "bu");
    snprintf(n->norm, sizeof n->norm, "fq.norm.%lld", (long long)s->d);
}

static void ffnq8b_weights(void) {
    fq_spec c[16];
    const int n = fq_specs(c);
    for (int i = 0; i < n; i++) {
        char wn[96];
        fq_wname(wn, sizeof wn, &c[i], "g");
        add_weight(wn, c[i].t, c[i].d, c[i].ff);
        fq_wname(wn, sizeof wn, &c[i], "u");
        add_weight(wn, c[i].t, c[i].d, c[i].ff);
        fq_wname(wn, sizeof wn, &c[i], "d");
        add_weight(wn, c[i].t, c[i].ff, c[i].d);
        fq_wname(wn, sizeof wn, &c[i], "bg");
        add_f32(wn, c[i].ff, 0.5f, 0.0f);
        fq_wname(wn, sizeof wn, &c[i], "bu");
        add_f32(wn, c[i].ff, 0.5f, 0.0f);
        snprintf(wn, sizeof wn, "fq.norm.%lld", (long long)c[i].d);
        add_f32(wn, c[i].d, 0.5f, 1.0f);
    }
}

/* Device buffers of one ffnq8b case: weights (+256 bytes, gf_wdev), biases,
 * x, the norm weight, the GEMVs' input scratch q8 (room for either input),
 * the int8 h q8o, the quantize kernel's reference quantization q8r, h (y),
 * the residual r and the down output z. */
typedef struct fq_dev {
    void *wg, *wu, *wd, *q8, *q8o, *q8r;
    float *bg, *bu, *x, *nw, *y, *r, *z;
} fq_dev;

static void fq_dev_new(const fq_spec *s, fq_dev *d) {
    char wn[96];
    memset(d, 0, sizeof *d);
    fq_wname(wn, sizeof wn, s, "g");
    d->wg = gf_wdev(wn);
    fq_wname(wn, sizeof wn, s, "u");
    d->wu = gf_wdev(wn);
    fq_wname(wn, sizeof wn, s, "d");
    d->wd = gf_wdev(wn);
    fq_wname(wn, sizeof wn, s, "bg");
    d->bg = ds_put(wf32(wn), (size_t)s->ff * 4);
    fq_wname(wn, sizeof wn, s, "bu");
    d->bu = ds_put(wf32(wn), (size_t)s->ff * 4);
    snprintf(wn, sizeof wn, "fq.norm.%lld", (long long)s->d);
    d->nw = ds_put(wf32(wn), (size_t)s->d * 4);
    const size_t qi = mf_cu_q8_bytes(s->d, 1), qf = mf_cu_q8_bytes(s->ff, 1);
    d->q8 = ds_alloc(qi > qf ? qi : qf, 0x5a);
    d->q8o = ds_alloc(qf, 0x5a);
    d->q8r = ds_alloc(qf, 0x5a);
    d->x = ds_alloc((size_t)s->d * 4, 0);
    d->y = ds_alloc((size_t)s->ff * 4, 0xff);
    d->r = ds_alloc((size_t)s->d * 4, 0);
    d->z = ds_alloc((size_t)s->d * 4, 0xff);
}

static void fq_dev_free(fq_dev *d) {
    cudaFree(d->wg); cudaFree(d->wu); cudaFree(d->wd); cudaFree(d->q8); cudaFree(d->q8o); cudaFree(d->q8r);
    cudaFree(d->bg); cudaFree(d->bu); cudaFree(d->x); cudaFree(d->nw); cudaFree(d->y); cudaFree(d->r);
    cudaFree(d->z);
}

/* gate/up + SwiGLU at nt 1 as the FUSED_FFN node launches it (norm folded
 * or not), writing the int8 h into q8out when that is set, with block form
 * of the kernel */
static mf_cu_q8_multi_args fq_ffn_args(const fq_spec *s, const fq_dev *d, bool bias, bool norm, void *q8out) {
    mf_cu_q8_multi_args a = {.n_w = 2, .swiglu = 1, .x = d->x, .n_in = s->d, .nt = 1, .q8 = d->q8, .norm = norm,
                             .norm_w = norm ? d->nw : NULL, .norm_eps = 1e-6f, .gemv_auto = 1, .gt = gt_of(-1),
                             .q8out = q8out};
    for (int k = 0; k < 2; k++) {
        a.wtype[k] = s->t;
        a.w[k] = k ? d->wu : d->wg;
        a.row_bytes[k] = mf_type_row_size(s->t, s->d);
        a.bias[k] = bias ? (k ? d->bu : d->bg) : NULL;
        a.n_out[k] = s->ff;
    }
    a.y[0] = d->y;
    return a;
}

/* the down GEMV + residual (FUSE_ADD's form) on h; ready: q8 already holds h quantized */
static mf_cu_q8_multi_args fq_down_args(const fq_spec *s, const fq_dev *d, void *q8, int ready) {
    mf_cu_q8_multi_args a = {.n_w = 1, .x = d->y, .n_in = s->ff, .nt = 1, .q8 = q8, .gemv_auto = 1, .gt = gt_of(-1),
                             .x_q8_ready = ready};
    a.wtype[0] = s->t;
    a.w[0] = d->wd;
    a.row_bytes[0] = mf_type_row_size(s->t, s->ff);
    a.res[0] = d->r;
    a.y[0] = d->z;
    a.n_out[0] = s->d;
    return a;
}

/* The bytes of the int8 layout of n values (the 256 bytes of slack excluded). */
static size_t fq_q8_used(int64_t n) {
    return (size_t)n + (size_t)(n / 32) * 8;
}

/* One case through the launchers at nt 1: run 0 today's chain (gate/up +
 * SwiGLU, then the quantize kernel on h, mf_cu_q8_quant_rows, and the down
 * GEMV + residual quantizing h itself), runs 1 / 2 the switch's chain
 * (gate/up writing the int8 h, the down GEMV reading it: x_q8_ready) with
 * PDL on / off. Every run on
 * outputs poisoned with another pattern (h, the int8 h, the down output).
 * h vs float64 (6e-2, gemvfuse's SwiGLU norm tolerance), the down output
 * vs float64 (3e-2, the layer tail's); runs >= 1: h, the int8 h (values,
 * scales, half sums) and the down output bitwise run 0's; the block-local
 * kernel launched once and no quantize launch beyond the input's (none with the norm folded). */
static void fq_test(const fq_spec *s, bool bias, bool norm) {
    const int64_t D = s->d, F = s->ff;
    const float eps = 1e-6f;
    fq_names names;
    fq_names_of(s, &names);
    const char *gn = names.g, *un = names.u, *dn = names.d, *bgn = names.bg, *bun = names.bu, *nn = names.norm;
    float *x = rand_vec(D, 1.0f), *r = rand_vec(D, 1.0f);
    for (int64_t i = 0; i < D; i += 97) /* a few large activations: units of mixed scale */
        x[i] *= 8.0f;
    float *xn = malloc((size_t)D * 4), *hf = malloc((size_t)F * 4);
    if (norm) {
        double *t = malloc((size_t)D * sizeof *t);
        ref_rmsnorm(x, wf32(nn), t, D, 1, eps);
        for (int64_t i = 0; i < D; i++)
            xn[i] = (float)t[i];
        free(t);
    } else {
        memcpy(xn, x, (size_t)D * 4);
    }
    double *g = malloc((size_t)F * sizeof *g), *u = malloc((size_t)F * sizeof *u), *zr = malloc((size_t)D * sizeof *zr);
    ref_matmul(gn, xn, D, F, 1, bias ? bgn : NULL, g);
    ref_matmul(un, xn, D, F, 1, bias ? bun : NULL, u);
    for (int64_t i = 0; i < F; i++) {
        g[i] = g[i] / (1 + exp(-g[i])) * u[i];
        hf[i] = (float)g[i];
    }
    ref_matmul(dn, hf, F, D, 1, NULL, zr);
    for (int64_t i = 0; i < D; i++)
        zr[i] += r[i];
    fq_dev d;
    fq_dev_new(s, &d);
    cudaMemcpy(d.x, x, (size_t)D * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(d.r, r, (size_t)D * 4, cudaMemcpyHostToDevice);
    char name[200], sub[260], det[160];
    snprintf(name, sizeof name, "ffnq8b %s %-5s %lld->%lld->%lld%s%s", s->what, mf_type_name(s->t), (long long)D,
             (long long)F, (long long)D, bias ? " +bias" : "", norm ? " +norm" : "");
    const mf_cu_q8_multi_args rule = fq_ffn_args(s, &d, bias, norm, NULL);
    snprintf(sub, sizeof sub, "%s: taken by the rule", name);
    check_true(sub, mf_cu_gemv_q8_ffn_q8b_ok(&rule) == 1, "(mf_cu_gemv_q8_ffn_q8b_ok)");
    const bool pdl0 = tune0.pdl != 0;
    enum { RUNS = 3 };
    char rn[RUNS][32];
    cudaStream_t st;
    cudaStreamCreate(&st);
    float *h[RUNS], *z[RUNS];
    uint8_t *q[RUNS];
    int64_t quant[RUNS], swq[RUNS];
    const size_t qb = fq_q8_used(F);
    for (int run = 0; run < RUNS; run++) {
        if (run)
            snprintf(rn[run], sizeof rn[run], "q8b%s", run % 2 ? "" : " pdl0");
        else
            snprintf(rn[run], sizeof rn[run], "today");
        cudaMemset(d.y, run % 2 ? 0xfe : 0xff, (size_t)F * 4);
        cudaMemset(d.z, run % 2 ? 0xfe : 0xff, (size_t)D * 4);
        cudaMemset(d.q8o, run % 2 ? 0xa5 : 0x5a, qb);
        cudaMemset(d.q8r, 0x33, qb);
        t_pdl(run && run % 2 == 0 ? 0 : 1);
        const int64_t c0 = mf_cu_q8_quant_count(), s0 = mf_cu_q8v4_swq8_count();
        const mf_cu_q8_multi_args fa = fq_ffn_args(s, &d, bias, norm, run ? d.q8o : NULL);
        const mf_cu_q8_multi_args da = fq_down_args(s, &d, run ? d.q8o : d.q8, run != 0);
        cudaError_t e = mf_cu_gemv_q8_multi(&fa, st);
        if (e == cudaSuccess && run == 0)
            e = mf_cu_q8_quant_rows(d.y, NULL, 0.0f, 0, F, 1, d.q8r, tune0.pdl, st);
        if (e == cudaSuccess)
            e = mf_cu_gemv_q8_multi(&da, st);
        ds_sync("ffnq8b chain", e, st);
        quant[run] = mf_cu_q8_quant_count() - c0;
        swq[run] = mf_cu_q8v4_swq8_count() - s0;
        h[run] = ds_get(d.y, (size_t)F * 4);
        z[run] = ds_get(d.z, (size_t)D * 4);
        q[run] = ds_get(run ? d.q8o : d.q8r, qb);
    }
    t_pdl(pdl0);
    for (int run = 0; run < RUNS; run++) {
        snprintf(sub, sizeof sub, "%s [%s]: h vs float64", name, rn[run]);
        result(sub, rel_err(h[run], g, F), 6e-2, count_nan(h[run], F), NULL);
        snprintf(sub, sizeof sub, "%s [%s]: down + residual vs float64", name, rn[run]);
        result(sub, rel_err(z[run], zr, D), 3e-2, count_nan(z[run], D), NULL);
        if (run == 0)
            continue;
        snprintf(sub, sizeof sub, "%s [%s == today]", name, rn[run]);
        const bool sh = memcmp(h[run], h[0], (size_t)F * 4) == 0, sq = memcmp(q[run], q[0], qb) == 0,
                   sz = memcmp(z[run], z[0], (size_t)D * 4) == 0;
        snprintf(det, sizeof det, "(bitwise: h %s, int8 h %s, down output %s)", sh ? "same" : "DIFFERS",
                 sq ? "same" : "DIFFERS", sz ? "same" : "DIFFERS");
        check_true(sub, sh && sq && sz, det);
    }
    const int64_t qin = norm ? 0 : 1; /* the gate/up input's own quantization */
    for (int run = 1; run < RUNS; run++) {
        snprintf(sub, sizeof sub, "%s [%s]: no quantize launch for the down GEMV, the block-local kernel launched",
                 name, rn[run]);
        snprintf(det, sizeof det, "(quantize launches today %lld, here %lld; block-local kernel today %lld, here "
                 "%lld)", (long long)quant[0], (long long)quant[run], (long long)swq[0], (long long)swq[run]);
        check_true(sub, quant[0] == qin + 2 && quant[run] == qin && swq[0] == 0 && swq[run] == 1, det);
    }
    for (int run = 0; run < RUNS; run++) {
        free(h[run]); free(z[run]); free(q[run]);
    }
    cudaStreamDestroy(st);
    fq_dev_free(&d);
    free(x); free(r); free(xn); free(hf); free(g); free(u); free(zr);
}

/* Where the rule says no, the launch with q8out set is refused before
 * anything is launched (cudaErrorInvalidValue) and mf_cu_gemv_q8_ffn_q8b_ok
 * says 0: two slices in flight forced (MINFER_CUDA_GEMV_V4=2), v4 off,
 * n_out % 32 != 0, n_in over the size rule (the 7B gate/up, 3584 ->
 * 18944), nt 2, gate and up of two types; the 0.5B shape is taken. */
static void fq_rule(void) {
    static const struct {
        const char *why;
        uint32_t t, ut;
        int64_t d, ff, nt;
        int v4, want;
    } c[] = {
        {"0.5B Q4_0 (taken)", MF_TYPE_Q4_0, MF_TYPE_Q4_0, 896, 4864, 1, -1, 1},
        {"v4 u2 forced", MF_TYPE_Q4_0, MF_TYPE_Q4_0, 896, 4864, 1, 2, 0},
        {"v4 off", MF_TYPE_Q4_0, MF_TYPE_Q4_0, 896, 4864, 1, 0, 0},
        {"n_out % 32 != 0", MF_TYPE_Q4_0, MF_TYPE_Q4_0, 896, 4880, 1, -1, 0},
        {"7B gate/up 3584", MF_TYPE_Q4_K, MF_TYPE_Q4_K, 3584, 18944, 1, -1, 0},
        {"nt 2", MF_TYPE_Q4_0, MF_TYPE_Q4_0, 896, 4864, 2, -1, 0},
        {"gate / up types differ", MF_TYPE_Q4_0, MF_TYPE_Q8_0, 896, 4864, 1, -1, 0},
    };
    void *buf = ds_alloc(1 << 20, 0);
    cudaStream_t st;
    cudaStreamCreate(&st);
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        mf_cu_q8_multi_args a = {.n_w = 2, .swiglu = 1, .x = buf, .n_in = c[i].d, .nt = c[i].nt, .q8 = buf,
                                 .gemv_auto = 1, .gt = gt_of(c[i].v4),
                                 .q8out = (uint8_t *)buf + (512 << 10)};
        for (int k = 0; k < 2; k++) {
            a.wtype[k] = k ? c[i].ut : c[i].t;
            a.w[k] = buf;
            a.row_bytes[k] = mf_type_row_size(a.wtype[k], c[i].d);
            a.n_out[k] = c[i].ff;
        }
        a.y[0] = buf;
        const int ok = mf_cu_gemv_q8_ffn_q8b_ok(&a);
        char name[160], det[120];
        snprintf(name, sizeof name, "ffnq8b rule: %s", c[i].why);
        if (c[i].want) {
            snprintf(det, sizeof det, "(ok %d)", ok);
            check_true(name, ok == 1, det);
            continue;
        }
        const int64_t s0 = mf_cu_q8v4_swq8_count();
        const cudaError_t e = mf_cu_gemv_q8_multi(&a, st);
        cudaGetLastError();
        snprintf(det, sizeof det, "(ok %d, launch %s, q8b launches %lld)", ok, cudaGetErrorName(e),
                 (long long)(mf_cu_q8v4_swq8_count() - s0));
        check_true(name, ok == 0 && e == cudaErrorInvalidValue && mf_cu_q8v4_swq8_count() == s0, det);
    }
    cudaStreamSynchronize(st);
    cudaStreamDestroy(st);
    cudaFree(buf);
}

/* The chain in a CUDA graph: norm-quant + gate/up writing the int8 h +
 * down reading it, captured with PDL on, then with PDL off; replayed 4 steps with a new x and poisoned h /
 * down output / int8 h each; every step bitwise today's chain (norm-quant,
 * gate/up, quantize, down) run plainly on that x; the block-local kernel
 * counted once (the capture) and no quantize launch in it. */
static void fq_graph(const fq_spec *s) {
    enum { STEPS = 4 };
    const int64_t D = s->d, F = s->ff;
    float *xs = rand_vec(D * STEPS, 2.0f), *r = rand_vec(D, 1.0f);
    fq_dev d;
    fq_dev_new(s, &d);
    cudaMemcpy(d.r, r, (size_t)D * 4, cudaMemcpyHostToDevice);
    const bool pdl0 = tune0.pdl != 0;
    cudaStream_t st;
    cudaStreamCreate(&st);
    for (int pf = 0; pf < 2; pf++) {
        const int pdl = pf % 2 == 0;
        t_pdl(pdl);
        float *hr[STEPS], *zr[STEPS];
        for (int t = 0; t < STEPS; t++) { /* today's chain, plain */
            cudaMemcpy(d.x, xs + t * D, (size_t)D * 4, cudaMemcpyHostToDevice);
            const mf_cu_q8_multi_args fa = fq_ffn_args(s, &d, true, true, NULL);
            const mf_cu_q8_multi_args da = fq_down_args(s, &d, d.q8, 0);
            cudaError_t e = mf_cu_gemv_q8_multi(&fa, st);
            if (e == cudaSuccess)
                e = mf_cu_gemv_q8_multi(&da, st);
            ds_sync("ffnq8b graph ref", e, st);
            hr[t] = ds_get(d.y, (size_t)F * 4);
            zr[t] = ds_get(d.z, (size_t)D * 4);
        }
        const mf_cu_q8_multi_args fa = fq_ffn_args(s, &d, true, true, d.q8o);
        const mf_cu_q8_multi_args da = fq_down_args(s, &d, d.q8o, 1);
        const int64_t s0 = mf_cu_q8v4_swq8_count(), c0 = mf_cu_q8_quant_count();
        cudaGraph_t gr = NULL;
        cudaGraphExec_t ge = NULL;
        cudaError_t e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
        if (e == cudaSuccess) {
            cudaError_t le = mf_cu_gemv_q8_multi(&fa, st);
            if (le == cudaSuccess)
                le = mf_cu_gemv_q8_multi(&da, st);
            e = cudaStreamEndCapture(st, &gr);
            e = le != cudaSuccess ? le : e;
        }
        if (e == cudaSuccess)
            e = cudaGraphInstantiate(&ge, gr, 0);
        ds_sync("ffnq8b graph capture", e, st);
        const int64_t captured = mf_cu_q8v4_swq8_count() - s0, quant = mf_cu_q8_quant_count() - c0;
        bool same = true;
        int64_t nan = 0;
        for (int t = 0; t < STEPS; t++) {
            cudaMemcpyAsync(d.x, xs + t * D, (size_t)D * 4, cudaMemcpyHostToDevice, st);
            cudaMemsetAsync(d.y, t & 1 ? 0xfe : 0xff, (size_t)F * 4, st);
            cudaMemsetAsync(d.z, t & 1 ? 0xfe : 0xff, (size_t)D * 4, st);
            cudaMemsetAsync(d.q8o, t & 1 ? 0xa5 : 0x5a, fq_q8_used(F), st);
            ds_sync("ffnq8b graph replay", cudaGraphLaunch(ge, st), st);
            float *h = ds_get(d.y, (size_t)F * 4), *z = ds_get(d.z, (size_t)D * 4);
            same = same && memcmp(h, hr[t], (size_t)F * 4) == 0 && memcmp(z, zr[t], (size_t)D * 4) == 0;
            nan += count_nan(h, F) + count_nan(z, D);
            free(h); free(z); free(hr[t]); free(zr[t]);
        }
        const int64_t replayed = mf_cu_q8v4_swq8_count() - s0 - captured;
        char name[160], det[160];
        snprintf(name, sizeof name, "ffnq8b graph %s %s pdl %d: %d replays == today's chain", s->what,
                 mf_type_name(s->t), pdl, STEPS);
        snprintf(det, sizeof det, "(q8b kernel captured %lld, launched in replays %lld, quantize launches %lld, "
                 "NaN %lld; h and down output bitwise)", (long long)captured, (long long)replayed, (long long)quant,
                 (long long)nan);
        check_true(name, same && captured == 1 && replayed == 0 && quant == 0 && nan == 0, det);
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(gr);
    }
    t_pdl(pdl0);
    cudaStreamDestroy(st);
    fq_dev_free(&d);
    free(xs); free(r);
}

/* Through the backend: RMSNORM -> FUSED_FFN -> MATMUL (down) -> ADD (the
 * residual, in place) over 4 decode steps with CUDA graphs (plain, capture,
 * replays), FUSE_NORM / FUSE_ADD / FUSE_GEMV on, the switch (tune
 * ffn_q8b) off, then on, one graph each. On == off bitwise (h and the layer
 * output of every step, NaN-free; outputs poisoned); on: the block-local
 * kernel launched and the down GEMV read its int8 h
 * (mf_cuda_q8_ready_stats) once per host-launched step, no quantize
 * launch; off: none of that, one quantize a host-launched step; replays
 * every way; the layer output vs float64 (3e-2). */
static void fq_backend(const fq_spec *s) {
    enum { STEPS = 4 };
    const int64_t D = s->d, F = s->ff;
    const float eps = 1e-6f;
    fq_names names;
    fq_names_of(s, &names);
    const char *gn = names.g, *un = names.u, *dn = names.d, *bgn = names.bg, *bun = names.bu, *nn = names.norm;
    mf_ffn_meta m = {.gate = {.weight = gn, .bias = bgn, .wtype = s->t, .n_in = D, .n_out = F},
                     .up = {.weight = un, .bias = bun, .wtype = s->t, .n_in = D, .n_out = F}};
    float *xs = rand_vec(D * STEPS, 2.0f), *rs = rand_vec(D * STEPS, 1.0f);
    double *ref = ffn_tail_ref(xs, rs, nn, eps, gn, bgn, un, bun, dn, D, F, STEPS);
    enum { RUNS = 2 };
    const int forms[RUNS] = {0, 1}; /* the switch off, on */
    float *y[RUNS], *h[RUNS];
    int64_t quant[RUNS], swq[RUNS], ready[RUNS], reps[RUNS];
    for (int on = 0; on < RUNS; on++) {
        ffn_tail tl; /* one graph per run: a graph captured before would replay */
        ffn_tail_new(&tl, D, F, nn, eps, &m, dn, s->t);
        y[on] = malloc((size_t)(D * STEPS) * 4);
        h[on] = malloc((size_t)(F * STEPS) * 4);
        t_ffn_q8b(be, forms[on]);
        t_fuse(be, true);
        t_fuse_norm(be, true);
        t_fuse_add(be, true);
        mf_cuda_set_graphs(be, true);
        int64_t r0, r1, c0, c1, q0, q1;
        mf_cuda_graph_stats(be, &c0, &r0);
        mf_cuda_q8_ready_stats(be, &q0);
        const int64_t k0 = mf_cu_q8_quant_count(), s0 = mf_cu_q8v4_swq8_count();
        for (int t = 0; t < STEPS; t++)
            ffn_tail_step(&tl, 10 + t, xs + t * D, rs + t * D, y[on] + t * D, h[on] + t * F, "ffnq8b backend step");
        quant[on] = mf_cu_q8_quant_count() - k0;
        swq[on] = mf_cu_q8v4_swq8_count() - s0;
        mf_cuda_graph_stats(be, &c1, &r1);
        mf_cuda_q8_ready_stats(be, &q1);
        reps[on] = r1 - r0;
        ready[on] = q1 - q0;
        ffn_tail_free(&tl);
    }
    t_ffn_q8b(be, -1);
    t_fuse(be, tune0.fuse_gemv);
    t_fuse_norm(be, tune0.fuse_norm != 0);
    t_fuse_add(be, tune0.fuse_add != 0);
    mf_cuda_set_graphs(be, !false);
    char name[160], det[240];
    const int64_t plain0 = STEPS - reps[0]; /* host-launched steps */
    for (int on = 1; on < RUNS; on++) {
        snprintf(name, sizeof name, "ffnq8b backend %s %s: %d graph steps, switch =%d == off", s->what,
                 mf_type_name(s->t), STEPS, forms[on]);
        const int64_t nan = count_nan(y[0], D * STEPS) + count_nan(y[on], D * STEPS) +
                            count_nan(h[0], F * STEPS) + count_nan(h[on], F * STEPS);
        const bool same = memcmp(y[on], y[0], (size_t)(D * STEPS) * 4) == 0 &&
                          memcmp(h[on], h[0], (size_t)(F * STEPS) * 4) == 0;
        snprintf(det, sizeof det, "(h and output bitwise; NaN %lld)", (long long)nan);
        check_true(name, same && nan == 0, det);
        const int64_t plain1 = STEPS - reps[on];
        snprintf(name, sizeof name, "ffnq8b backend %s %s =%d: the down GEMV's quantize launch gone", s->what,
                 mf_type_name(s->t), forms[on]);
        snprintf(det, sizeof det, "(on: q8b %lld, int8 h read %lld, quantize %lld, replays %lld; "
                 "off: %lld, %lld, %lld, %lld)", (long long)swq[on], (long long)ready[on],
                 (long long)quant[on], (long long)reps[on], (long long)swq[0], (long long)ready[0],
                 (long long)quant[0], (long long)reps[0]);
        check_true(name, swq[on] == plain1 && ready[on] == plain1 && quant[on] == 0 &&
                             swq[0] == 0 && ready[0] == 0 && quant[0] == plain0 && reps[on] >= STEPS - 3 &&
                             reps[0] >= STEPS - 3, det);
        snprintf(name, sizeof name, "ffnq8b backend %s %s: switch =%d vs float64", s->what, mf_type_name(s->t),
                 forms[on]);
        result(name, rel_err(y[on], ref, D * STEPS), 3e-2, count_nan(y[on], D * STEPS), NULL);
    }
    for (int on = 0; on < RUNS; on++) {
        free(y[on]); free(h[on]);
    }
    free(xs); free(rs); free(ref);
}

static void ffnq8b_family(void) {
    fq_spec c[16];
    const int n = fq_specs(c);
    for (int i = 0; i < n; i++) {
        if (small && i != 0 && i != 3)
            continue;
        fq_test(&c[i], true, true);
        if (!small || i == 0)
            fq_test(&c[i], false, false);
    }
    fq_rule();
    fq_graph(&c[0]);
    fq_graph(&c[3]);
    fq_backend(&c[0]);
    fq_backend(&c[1]);
    if (!small)
        fq_backend(&c[3]);
}

/* ---- family d2h: the logits copy overlapped with the lm_head ------------------------- */
enum { D2H_STEPS = 5 };

typedef struct d2h_case {
    const char *wn;
    uint32_t t;
    int64_t d, nv;
} d2h_case;

/* The norm -> lm_head decode graph of case c (the head a graph output, named
 * tag.N with N new each call: a graph captured by an earlier run, same
 * address, same nodes, must not replay) and its buffers: x (x0's d floats,
 * or uninitialized), the normed x and the logits poisoned. */
typedef struct d2h_head {
    mf_graph gr;
    int32_t ni, mi, bx, bn, by;
} d2h_head;

static void d2h_head_new(d2h_head *h, const d2h_case *c, const char *tag, const float *x0) {
    static int run_no;
    char nn[32];
    snprintf(nn, sizeof nn, "norm.%lld", (long long)c->d);
    graph_new(&h->gr, 0, 0);
    const int32_t xi = ext(&h->gr, c->d, 1);
    h->ni = mf_g_rmsnorm(&h->gr, xi, nn, 1e-6f);
    h->mi = mf_g_matmul(&h->gr, h->ni, c->wn, c->t, NULL, c->d, c->nv);
    h->gr.nodes[h->mi].flags |= MF_NODE_OUTPUT;
    snprintf(h->gr.nodes[h->mi].name, sizeof h->gr.nodes[h->mi].name, "%s.%d", tag, run_no++);
    h->bx = dev_put(x0, (size_t)c->d * 4);
    h->bn = dev_poison((size_t)c->d * 4);
    h->by = dev_poison((size_t)c->nv * 4);
}

static void d2h_head_free(d2h_head *h) {
    dev_free(h->bx); dev_free(h->bn); dev_free(h->by);
    mf_graph_free(&h->gr);
}

/* One run of the norm -> head steps (families d2h and zc): the ZC switch
 * (MINFER_CUDA_LOGITS_ZC), the chunk count, graphs, the folded norm, the
 * floats read. */
typedef struct zc_run {
    int zc;          /* 1 on, 0 off, 2: on at odd steps only */
    int k;           /* row chunks (0: none; the chunked copy left the backend) */
    bool graphs, norm_mm;
    int64_t n_read;  /* floats read (nv: all) */
} zc_run;

typedef struct zc_stats {
    int64_t zc, chunked, early, caps, reps, clobbered, hint_bad, launches;
} zc_stats;

/* steps forwards of norm -> head on a fresh graph under r: step s hints
 * hint[s] and reads r->n_read floats into dst[s] (copied into res + s *
 * nv). clobbered: floats of the previous step's read buffer (when another
 * one) that changed during step s; hint_bad: floats of a hint other than
 * the read buffer that differ from the read after a ZC step. */
static void zc_forwards(const d2h_case *c, const zc_run *r, const float *xs, int steps, float *const *hint,
                        float *const *dst, float *res, zc_stats *st) {
    const int64_t d = c->d, nv = c->nv;
    d2h_head h;
    d2h_head_new(&h, c, "head", NULL);
    const int32_t ni = h.ni, mi = h.mi, bx = h.bx, bn = h.bn, by = h.by;
    t_fuse_norm(be, true);
    t_norm_mm(be, r->norm_mm);
    mf_cuda_set_graphs(be, r->graphs);
    int64_t c0, r0, k0, e0;
    mf_cuda_graph_stats(be, &c0, &r0);
    mf_cuda_d2h_stats(be, &k0, &e0);
    const int64_t z0 = mf_cuda_zc_count(be), l0 = mf_cu_q8v4_zc_count();
    st->clobbered = st->hint_bad = 0;
    mf_error e;
    for (int s = 0; s < steps; s++) {
        const bool on = r->zc == 1 || (r->zc == 2 && s % 2);
        t_logits_zc(be, on);
        const int64_t zs = mf_cuda_zc_count(be);
        for (int64_t i = 0; i < nv; i++)
            hint[s][i] = dst[s][i] = NAN;
        mf_exec_args a = args(10 + s, 1, 64, MF_TYPE_F32);
        a.out_host = hint[s];
        a.out_node = mi;
        a.out_bytes = (size_t)nv * 4;
        if (mf_cuda_begin_forward(be, &h.gr, &a, &e) ||
            be->ops->write_host(be, bx, 0, xs + s * d, (size_t)d * 4, &e) ||
            mf_cuda_execute_node(be, &h.gr, ni, &bx, bn, (mf_kv_pair){-1, -1}, &a, &e) ||
            mf_cuda_execute_node(be, &h.gr, mi, &bn, by, (mf_kv_pair){-1, -1}, &a, &e) ||
            mf_cuda_end_forward(be, &h.gr, &a, &e) ||
            be->ops->read_host(be, by, 0, dst[s], (size_t)r->n_read * 4, &e))
            die("zc step", &e);
        memcpy(res + s * nv, dst[s], (size_t)nv * 4);
        if (hint[s] != dst[s] && mf_cuda_zc_count(be) > zs)
            for (int64_t i = 0; i < r->n_read; i++)
                st->hint_bad += memcmp(&hint[s][i], &dst[s][i], 4) != 0;
        if (s > 0 && dst[s - 1] != dst[s] && dst[s - 1] != hint[s])
            for (int64_t i = 0; i < r->n_read; i++)
                st->clobbered += memcmp(&dst[s - 1][i], res + (s - 1) * nv + i, 4) != 0;
    }
    int64_t c1, r1, k1, e1;
    mf_cuda_graph_stats(be, &c1, &r1);
    mf_cuda_d2h_stats(be, &k1, &e1);
    st->caps = c1 - c0;
    st->reps = r1 - r0;
    st->chunked = k1 - k0;
    st->early = e1 - e0;
    st->zc = mf_cuda_zc_count(be) - z0;
    st->launches = mf_cu_q8v4_zc_count() - l0;
    d2h_head_free(&h);
    t_logits_zc(be, tune0.zc == 1);
    t_fuse_norm(be, tune0.fuse_norm != 0);
    t_norm_mm(be, tune0.norm_mm != 0);
    mf_cuda_set_graphs(be, !false);
}


/* Floats of a (n) whose bits differ from b's, NaNs in a counted too. */
static int64_t d2h_diff(const float *a, const float *b, int64_t n) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        k += memcmp(a + i, b + i, 4) != 0 || isnan(a[i]);
    return k;
}
/* ---- family zc: the lm_head GEMV writes the logits into the pinned block --------------- */

/* Family zc: MINFER_CUDA_LOGITS_ZC (hook mf_cuda_set_logits_zc): the same
 * norm -> lm_head decode step as family d2h (the contract's order, the
 * out_host hint on a host_alloc block, every read buffer and hint poisoned
 * before its step, 5 steps of new inputs), ZC on vs the switch off: logits
 * bitwise, the ZC path taken on every step (mf_cuda_zc_count: capture and
 * replays count) and every read served without a copy (mf_cuda_d2h_stats'
 * early reads), graphs on / off, norm folded / separate, at the Q8_0 896 x
 * 151936 (0.5B) and Q6_K 3584 x 152064 (7B) heads and a Q8_0 896 x 3003
 * head (a ragged last row group); the hint block holds the logits even
 * when the read goes elsewhere (a heap buffer: the plain copy, no early
 * read) or reads half the bytes (the plain copy); two logits buffers
 * alternating on one graph (each read its own step's logits, the other
 * buffer untouched, <= 2 captures); a hint not 32-byte aligned and ZC with
 * the chunks on (ZC taken, no chunk) and the switch flipped every step on
 * one graph (graphs keyed on it: ZC exactly on the steps it is on). */
static void zc_weights(void) {
    add_weight("mm.q8_0.896x151936", MF_TYPE_Q8_0, 896, 151936);
    add_weight("zc.q8_0.896x3003", MF_TYPE_Q8_0, 896, 3003);
    if (!small)
        add_weight("zc.q6_k.3584x152064", MF_TYPE_Q6_K, 3584, 152064);
}



static void zc_case_run(const d2h_case *c, bool full) {
    const int64_t d = c->d, nv = c->nv;
    const int steps = D2H_STEPS;
    float *xs = rand_vec(d * steps, 2.0f);
    /* the ZC switch on before the blocks exist: host_alloc maps them */
    t_logits_zc(be, true);
    float *pa = be->ops->host_alloc(be, (size_t)nv * 4), *pb = be->ops->host_alloc(be, (size_t)nv * 4 + 64);
    t_logits_zc(be, tune0.zc == 1);
    float *heap = malloc((size_t)nv * 4 + 4);
    float *base[2] = {malloc((size_t)(nv * steps) * 4), malloc((size_t)(nv * steps) * 4)};
    float *res = malloc((size_t)(nv * steps) * 4);
    if (!pa || !pb) {
        check_true("zc: host_alloc gave pinned blocks", false, NULL);
        return;
    }
    float *ha[D2H_STEPS], *hh[D2H_STEPS], *hab[D2H_STEPS], *hm[D2H_STEPS];
    for (int s = 0; s < steps; s++) {
        ha[s] = pa;
        hh[s] = heap;
        hab[s] = s % 2 ? pb : pa;
        hm[s] = pb + 1; /* 4 bytes into a block: not 32-byte aligned */
    }
    const mf_cu_gemv_tune g = gt_of(-1);
    const bool want = mf_cu_q8v4_zc_ok(&g, c->t, mf_cu_q8v4_u(&g, c->t, nv, d), nv, d) != 0;
    char name[160], det[240];
    snprintf(name, sizeof name, "zc %s %lld x %lld: the head has a ZC instance", mf_type_name(c->t), (long long)d,
             (long long)nv);
    check_true(name, want, NULL);
    zc_stats st;
    for (int nm = 1; nm >= (full ? 0 : 1); nm--) {
        const zc_run off = {.zc = 0, .graphs = false, .norm_mm = nm, .n_read = nv};
        zc_forwards(c, &off, xs, steps, ha, ha, base[nm], &st);
        snprintf(name, sizeof name, "zc %s %lld: switch off baseline (norm %s)", mf_type_name(c->t), (long long)nv,
                 nm ? "folded" : "separate");
        check_true(name, d2h_diff(base[nm], base[nm], nv * steps) == 0 && st.zc == 0 && st.early == 0 &&
                             st.launches == 0, "(no NaN, no ZC launch)");
        for (int gon = 1; gon >= 0; gon--) {
            if (!full && !gon)
                continue;
            const zc_run on = {.zc = 1, .graphs = gon, .norm_mm = nm, .n_read = nv};
            zc_forwards(c, &on, xs, steps, ha, ha, res, &st);
            snprintf(name, sizeof name, "zc %s %lld graphs %s norm %s", mf_type_name(c->t), (long long)nv,
                     gon ? "on" : "off", nm ? "folded" : "separate");
            snprintf(det, sizeof det, "(%lld floats differ; zc %lld early reads %lld of %d, launches %lld; "
                     "captures %lld replays %lld)", (long long)d2h_diff(res, base[nm], nv * steps), (long long)st.zc,
                     (long long)st.early, steps, (long long)st.launches, (long long)st.caps, (long long)st.reps);
            check_true(name, d2h_diff(res, base[nm], nv * steps) == 0 && st.zc == steps && st.early == steps &&
                                 st.chunked == 0 && st.launches >= 1 && (gon || st.launches == steps) &&
                                 (!gon || st.reps >= steps - 2), det);
        }
    }
    if (full) {
        /* two sessions' logits buffers alternating on one graph */
        zc_run r = {.zc = 1, .graphs = true, .norm_mm = true, .n_read = nv};
        zc_forwards(c, &r, xs, steps, hab, hab, res, &st);
        snprintf(det, sizeof det, "(%lld floats differ, %lld of the other buffer changed; captures %lld replays "
                 "%lld, zc %lld early %lld)", (long long)d2h_diff(res, base[1], nv * steps), (long long)st.clobbered,
                 (long long)st.caps, (long long)st.reps, (long long)st.zc, (long long)st.early);
        check_true("zc two buffers alternating: own logits, other kept, replayed",
                   d2h_diff(res, base[1], nv * steps) == 0 && st.clobbered == 0 && st.caps <= 2 &&
                       st.reps >= steps - 4 && st.zc == steps && st.early == steps, det);
        /* a read into another buffer than the hint: the plain copy, the hint written all the same */
        zc_forwards(c, &r, xs, steps, ha, hh, res, &st);
        snprintf(det, sizeof det, "(%lld floats differ, %lld hint floats differ; zc %lld early %lld)",
                 (long long)d2h_diff(res, base[1], nv * steps), (long long)st.hint_bad, (long long)st.zc,
                 (long long)st.early);
        check_true("zc read into a heap buffer, not the hint", d2h_diff(res, base[1], nv * steps) == 0 &&
                                                                  st.hint_bad == 0 && st.zc == steps && st.early == 0,
                   det);
        /* half the bytes into the hint buffer: the plain copy */
        r.n_read = nv / 2;
        zc_forwards(c, &r, xs, steps, ha, ha, res, &st);
        int64_t bad = 0;
        for (int s = 0; s < steps; s++)
            bad += d2h_diff(res + s * nv, base[1] + s * nv, nv / 2);
        snprintf(det, sizeof det, "(%lld floats differ; early %lld)", (long long)bad, (long long)st.early);
        check_true("zc read of half the hinted bytes", bad == 0 && st.early == 0, det);
        /* a hint 4 bytes into a block: no ZC, the plain copy */
        r.n_read = nv;
        zc_forwards(c, &r, xs, steps, hm, hm, res, &st);
        snprintf(det, sizeof det, "(%lld floats differ; zc %lld early %lld)", (long long)d2h_diff(res, base[1], nv * steps),
                 (long long)st.zc, (long long)st.early);
        check_true("zc hint not 32-byte aligned: plain read", d2h_diff(res, base[1], nv * steps) == 0 && st.zc == 0 &&
                                                                  st.early == 0 && st.launches == 0, det);
        /* the switch flipped every step on one graph: graphs keyed on it */
        r.zc = 2;
        zc_forwards(c, &r, xs, steps, ha, ha, res, &st);
        snprintf(det, sizeof det, "(%lld floats differ; zc %lld early %lld, want %d)",
                 (long long)d2h_diff(res, base[1], nv * steps), (long long)st.zc, (long long)st.early, steps / 2);
        check_true("zc switch flipped every step, graphs on", d2h_diff(res, base[1], nv * steps) == 0 &&
                                                                  st.zc == steps / 2 && st.early == steps / 2, det);
    }
    be->ops->host_free(be, pa);
    be->ops->host_free(be, pb);
    free(heap); free(base[0]); free(base[1]); free(res); free(xs);
}

static void zc_family(void) {
    zc_case_run(&(d2h_case){"mm.q8_0.896x151936", MF_TYPE_Q8_0, 896, 151936}, !small);
    if (!small)
        zc_case_run(&(d2h_case){"zc.q6_k.3584x152064", MF_TYPE_Q6_K, 3584, 152064}, false);
    zc_case_run(&(d2h_case){"zc.q8_0.896x3003", MF_TYPE_Q8_0, 896, 3003}, true);
}

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

    if (fam("mma"))
        mma_weights();
    if (fam("mmafuse"))
        mmafuse_weights();
    if (fam("gemv"))
        gemv_weights();
    if (fam("q6k"))
        q6k_weights(&dec_q6k);
    if (fam("attnone"))
        ao_weights("ao", 0);
    if (fam("attnshort"))
        ao_weights("as", 1024);
    if (fam("shortrope"))
        shortrope_weights();
    if (fam("normmm"))
        normmm_weights();
    if (fam("qkvmix"))
        qkvmix_weights();
    if (fam("ffnq8b"))
        ffnq8b_weights();
    if (fam("zc"))
        zc_weights();

    mf_error e;
    /* MINFER_CUDA_TUNE: the whole suite under another tuning (gpu-check.sh's ops-nopdl: pdl=0) */
    mf_backend_options o;
    mf_backend_options_default(&o);
    o.tune = getenv("MINFER_CUDA_TUNE");
    if (mf_backend_cuda_create(W, &o, &be, &e)) {
        printf("skip: no usable CUDA backend: %s\n", e.msg);
        mf_weights_free(W);
        return 77;
    }
    printf("device: %s%s\n", mf_cuda_device_desc(be), small ? " (small shapes)" : "");
    tune0 = *mf_cuda_tuning(be);
    g_sms = tune0.sm_count;
    mf_cu_gemv_occupancy(&g_occ);

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
    t_tc_attn(be, false); /* family attn: the f32 kernels at 1e-4 (preattn: the tensor-core one) */
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
    t_tc_attn(be, true);

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
    if (fam("fuse_norm")) {
        const int64_t ff05 = small ? 256 : 4864;
        test_fuse_norm(MF_TYPE_Q4_0, MF_TYPE_Q4_0, 896, ff05, 1); /* 0.5B ffn_norm -> gate/up */
        test_fuse_norm(MF_TYPE_Q4_0, MF_TYPE_Q4_0, 896, ff05, 7);
        test_fuse_norm(MF_TYPE_Q4_0, MF_TYPE_Q8_0, 896, ff05, 3); /* two GEMV launches */
        test_fuse_norm(MF_TYPE_Q6_K, MF_TYPE_Q6_K, 2560, small ? 256 : 9728, 1);
    }
    if (fam("gemv"))
        gemv_family();
    if (fam("q6k"))
        q6k_family(&dec_q6k);
    if (fam("mma"))
        mma_family();
    if (fam("mmafuse"))
        mmafuse_family();
    if (fam("graph"))
        test_graph();
    if (fam("decattn"))
        decattn_family();
    if (fam("preattn"))
        run_preattn();
    if (fam("graph"))
        ds_fuse_add_graph();
    if (fam("attnone"))
        attnone_family();
    if (fam("attnshort"))
        attnshort_family();
    if (fam("shortrope"))
        shortrope_family();
    if (fam("normmm")) {
        normmm_case("nm.q8_0.896x3000", MF_TYPE_Q8_0, 896);
        normmm_case("nm.q6_k.3584x3000", MF_TYPE_Q6_K, 3584);
    }
    if (fam("qkvmix"))
        qkvmix_family();
    if (fam("ffnq8b"))
        ffnq8b_family();
    if (fam("zc"))
        zc_family();
    if (fam("misc")) {
        test_refusals();
        test_pool();
    }

    mf_backend_free(be);
    mf_weights_free(W);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
