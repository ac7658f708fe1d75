/* cmd_synth.c - `minfer synth`: writes a synthetic model at real shapes
 * (llama, qwen2, qwen3) with deterministic, numerically tame random weights
 * and a real byte-level BPE vocabulary (synth_vocab.h). Streams: weights are
 * generated and converted a chunk of rows at a time, so a 7B model is written
 * in bounded memory. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "args.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "quant_mix.h"
#include "synth_vocab.h"
#include "tools.h"

#define CHUNK_FLOATS (1 << 22)
#define FAST_POOL_ROWS 512 /* --fast: distinct rows per tensor, repeated after */

/* ---- configuration ---------------------------------------------------------------- */

typedef struct synth_cfg {
    const char *arch;    /* "llama", "qwen2", "qwen3" */
    const char *name;    /* preset or arch, for general.name */
    const char *pre;     /* tokenizer.ggml.pre */
    int64_t dim, layers, ff, heads, kv_heads, head_dim, vocab, ctx;
    double theta, eps;
    int tied;            /* 1 tied, 0 untied, -1 unset */
} synth_cfg;

/* Facts about the released models these presets imitate. */
static const synth_cfg presets[] = {
    {"qwen2", "qwen2-0.5b", "qwen2", 896, 24, 4864, 14, 2, 0, 151936, 32768, 1e6, 1e-6, 1},
    {"qwen2", "qwen2-1.5b", "qwen2", 1536, 28, 8960, 12, 2, 0, 151936, 32768, 1e6, 1e-6, 1},
    {"qwen2", "qwen2-7b", "qwen2", 3584, 28, 18944, 28, 4, 0, 152064, 32768, 1e6, 1e-6, 0},
    {"qwen3", "qwen3-0.6b", "qwen2", 1024, 28, 3072, 16, 8, 128, 151936, 40960, 1e6, 1e-6, 1},
    {"qwen3", "qwen3-4b", "qwen2", 2560, 36, 9728, 32, 8, 128, 151936, 40960, 1e6, 1e-6, 1},
    {"qwen3", "qwen3-8b", "qwen2", 4096, 36, 12288, 32, 8, 128, 151936, 40960, 1e6, 1e-6, 0},
    {"llama", "smollm2-135m", "smollm", 576, 30, 1536, 9, 3, 0, 49152, 8192, 1e5, 1e-5, 1},
};
#define N_PRESETS (sizeof presets / sizeof presets[0])

static const char *const archs[] = {"llama", "qwen2", "qwen3"};

/* ---- deterministic random numbers ----------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* Fills out[0..n) with N(0,1) samples by Box-Muller from a splitmix64 stream
 * seeded per row, so rows can be generated in any order or thread. */
static void gauss_row(uint64_t state, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i += 2) {
        double u1 = ((double)(splitmix64(&state) >> 11) + 1.0) * 0x1.0p-53; /* (0, 1] */
        double u2 = (double)(splitmix64(&state) >> 11) * 0x1.0p-53;
        double r = sqrt(-2.0 * log(u1)), a = 6.283185307179586 * u2;
        out[i] = (float)(r * cos(a));
        if (i + 1 < n)
            out[i + 1] = (float)(r * sin(a));
    }
}

/* ---- the tensor plan ----------------------------------------------------------------- */

/* How a tensor's values are drawn: value = center + scale * N(0,1). */
typedef struct tensor_plan {
    char name[64];
    uint32_t n_dims;
    int64_t ne[2];
    float center, scale;
    uint32_t type;
} tensor_plan;

typedef struct plan {
    tensor_plan *t;
    int n, cap;
} plan;

static void plan_add(plan *p, const char *name, uint32_t n_dims, int64_t ne0, int64_t ne1,
                     float center, float scale) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 64;
        p->t = mf_realloc(p->t, (size_t)p->cap * sizeof *p->t);
    }
    tensor_plan *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->center = center;
    t->scale = scale;
}

/* The scales keep a forward pass tame at any depth: projections are
 * N(0, 1/n_in) so each keeps activations O(1); the two residual-writing
 * projections are further scaled by 1/sqrt(2 n_layers) so the residual stream
 * grows to O(1), not O(sqrt(n_layers)); the logit matrix gives logits of
 * standard deviation about 3 (peaked but never degenerate). Norm weights are
 * 1 + 5% noise, biases small. */
static void build_plan(const synth_cfg *c, plan *p) {
    int64_t d = c->dim, hd = c->head_dim, q = c->heads * hd, kv = c->kv_heads * hd;
    float s_d = 1.0f / sqrtf((float)d), s_q = 1.0f / sqrtf((float)q);
    float s_ff = 1.0f / sqrtf((float)c->ff), res = 1.0f / sqrtf(2.0f * (float)c->layers);
    float logit = 3.0f * s_d;
    char n[64];
    /* tied: the embedding is the logit matrix, so it takes its scale */
    plan_add(p, "token_embd.weight", 2, d, c->vocab, 0.0f, c->tied ? logit : 1.0f);
    for (int64_t l = 0; l < c->layers; l++) {
#define T(suffix) (snprintf(n, sizeof n, "blk.%" PRId64 ".%s", l, suffix), n)
        plan_add(p, T("attn_norm.weight"), 1, d, 1, 1.0f, 0.05f);
        plan_add(p, T("attn_q.weight"), 2, d, q, 0.0f, s_d);
        if (!strcmp(c->arch, "qwen2"))
            plan_add(p, T("attn_q.bias"), 1, q, 1, 0.0f, 0.02f);
        plan_add(p, T("attn_k.weight"), 2, d, kv, 0.0f, s_d);
        if (!strcmp(c->arch, "qwen2"))
            plan_add(p, T("attn_k.bias"), 1, kv, 1, 0.0f, 0.02f);
        plan_add(p, T("attn_v.weight"), 2, d, kv, 0.0f, s_d);
        if (!strcmp(c->arch, "qwen2"))
            plan_add(p, T("attn_v.bias"), 1, kv, 1, 0.0f, 0.02f);
        if (!strcmp(c->arch, "qwen3")) {
            plan_add(p, T("attn_q_norm.weight"), 1, hd, 1, 1.0f, 0.05f);
            plan_add(p, T("attn_k_norm.weight"), 1, hd, 1, 1.0f, 0.05f);
        }
        plan_add(p, T("attn_output.weight"), 2, q, d, 0.0f, s_q * res);
        plan_add(p, T("ffn_norm.weight"), 1, d, 1, 1.0f, 0.05f);
        plan_add(p, T("ffn_gate.weight"), 2, d, c->ff, 0.0f, s_d);
        plan_add(p, T("ffn_up.weight"), 2, d, c->ff, 0.0f, s_d);
        plan_add(p, T("ffn_down.weight"), 2, c->ff, d, 0.0f, s_ff * res);
#undef T
    }
    plan_add(p, "output_norm.weight", 1, d, 1, 1.0f, 0.05f);
    if (!c->tied)
        plan_add(p, "output.weight", 2, d, c->vocab, 0.0f, logit);
}

/* ---- generation ------------------------------------------------------------------------- */

typedef struct gen_job {
    const tensor_plan *t;
    uint64_t tensor_seed;
    int64_t row0, nrows;
    float *fbuf;
    void *qbuf;
    size_t out_row;
} gen_job;

static void gen_worker(void *ctx, int ith, int nth) {
    const gen_job *j = ctx;
    int64_t n = j->t->ne[0];
    int64_t r0 = j->nrows * ith / nth, r1 = j->nrows * (ith + 1) / nth;
    for (int64_t r = r0; r < r1; r++) {
        float *row = j->fbuf + r * n;
        uint64_t s = j->tensor_seed ^ ((uint64_t)(j->row0 + r) * 0xd1b54a32d192ed03ull);
        splitmix64(&s);
        gauss_row(s, row, n);
        for (int64_t i = 0; i < n; i++)
            row[i] = j->t->center + j->t->scale * row[i];
    }
    if (r1 > r0)
        mf_tools_from_float(NULL, j->t->type, j->fbuf + r0 * n,
                            (uint8_t *)j->qbuf + (size_t)r0 * j->out_row, r1 - r0, n);
}

/* --fast: rows past the first FAST_POOL_ROWS repeat them, row r taking pool
 * row (r * 7919) % pool (a stride coprime to the pool, so neighbouring rows
 * differ). Every row is still a real quantization of a Gaussian row, so the
 * file is valid and numerically tame; only the variety is lower, which speed
 * measurements do not see (no kernel's work depends on the values). */
static void fast_fill(const uint8_t *pool, int64_t pool_rows, size_t out_row, int64_t row0,
                      int64_t nrows, uint8_t *dst) {
    for (int64_t r = 0; r < nrows; r++)
        memcpy(dst + (size_t)r * out_row,
               pool + (size_t)(((row0 + r) * 7919) % pool_rows) * out_row, out_row);
}

static int write_model(const synth_cfg *c, const mf_quant_mix *mix, uint64_t seed,
                       const char *out, int threads, bool fast) {
    mf_error err = {{0}};
    plan p = {0};
    build_plan(c, &p);
    mf_mix_model mm = {(int)c->layers, (int)(c->heads / c->kv_heads), !c->tied};
    for (int i = 0; i < p.n; i++)
        p.t[i].type = mf_quant_mix_choose(mix, &mm, p.t[i].name, p.t[i].n_dims, p.t[i].ne[0],
                                          NULL, 0);

    mf_synth_vocab v;
    if (mf_synth_vocab_build((uint32_t)c->vocab, &v, &err)) {
        fprintf(stderr, "synth: %s\n", err.msg);
        free(p.t);
        return 1;
    }

    mf_gguf_writer *w = mf_gguf_writer_new();
    char key[128], name[128];
    const char *a = c->arch;
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", a, suffix), key)
    mf_gguf_writer_set_str(w, "general.architecture", a);
    mf_gguf_writer_set_str(w, "general.type", "model");
    snprintf(name, sizeof name, "minfer synth %s seed %" PRIu64, c->name, seed);
    mf_gguf_writer_set_str(w, "general.name", name);
    mf_gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)c->ctx);
    mf_gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)c->dim);
    mf_gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)c->layers);
    mf_gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)c->ff);
    mf_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)c->heads);
    mf_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->kv_heads);
    mf_gguf_writer_set_f32(w, KEY("rope.freq_base"), (float)c->theta);
    mf_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), (float)c->eps);
    if (!strcmp(a, "qwen3") || c->head_dim * c->heads != c->dim) {
        mf_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)c->head_dim);
        mf_gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)c->head_dim);
    }
    if (!strcmp(a, "llama")) {
        mf_gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)c->vocab);
        mf_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)c->head_dim);
    }
#undef KEY
    mf_gguf_writer_set_u32(w, "general.file_type", mix->ftype);
    mf_gguf_writer_set_u32(w, "general.quantization_version", 2);
    mf_synth_vocab_write(&v, c->pre, w);
    mf_synth_vocab_free(&v);

    uint64_t total_bytes = 0, total_params = 0;
    for (int i = 0; i < p.n; i++) {
        if (mf_gguf_writer_add_tensor(w, p.t[i].name, p.t[i].type, p.t[i].n_dims, p.t[i].ne,
                                      &err) < 0)
            goto fail;
        total_bytes += mf_type_row_size(p.t[i].type, p.t[i].ne[0]) * (uint64_t)p.t[i].ne[1];
        total_params += (uint64_t)p.t[i].ne[0] * (uint64_t)p.t[i].ne[1];
    }
    if (mf_gguf_writer_begin(w, out, &err))
        goto fail;

    mf_pool *pool = threads > 1 ? mf_pool_new(threads) : NULL;
    float *fbuf = NULL;
    void *qbuf = NULL;
    size_t fcap = 0, qcap = 0;
    uint64_t t0 = mf_time_ns();
    int rc = 0;
    for (int i = 0; i < p.n && rc == 0; i++) {
        const tensor_plan *t = &p.t[i];
        int64_t n = t->ne[0], nrows = t->ne[1];
        char note[96];
        mf_quant_mix_choose(mix, &mm, t->name, t->n_dims, n, note, sizeof note);
        char shape[48];
        if (t->n_dims == 1)
            snprintf(shape, sizeof shape, "%" PRId64, n);
        else
            snprintf(shape, sizeof shape, "%" PRId64 "x%" PRId64, n, nrows);
        fprintf(stderr, "[%3d/%d] %-28s %-5s %s%s%s%s\n", i + 1, p.n, t->name,
                mf_type_name(t->type), shape, note[0] ? "  (" : "", note, note[0] ? ")" : "");
        size_t out_row = mf_type_row_size(t->type, n);
        int64_t chunk = CHUNK_FLOATS / n > 0 ? CHUNK_FLOATS / n : 1;
        if (chunk > nrows)
            chunk = nrows;
        if ((size_t)(chunk * n) > fcap) {
            fcap = (size_t)(chunk * n);
            fbuf = mf_realloc(fbuf, (fcap + 1) * sizeof(float));
        }
        if ((size_t)chunk * out_row > qcap) {
            qcap = (size_t)chunk * out_row;
            qbuf = mf_realloc(qbuf, qcap);
        }
        uint64_t ts = seed * 0x9e3779b97f4a7c15ull ^ fnv1a(t->name);
        if (fast && nrows > FAST_POOL_ROWS) {
            /* the pool: FAST_POOL_ROWS generated rows, kept after qbuf's chunk */
            const int64_t pr = FAST_POOL_ROWS;
            if ((size_t)(pr * n) > fcap) {
                fcap = (size_t)(pr * n);
                fbuf = mf_realloc(fbuf, (fcap + 1) * sizeof(float));
            }
            uint8_t *poolq = mf_malloc((size_t)pr * out_row);
            gen_job pj = {t, ts, 0, pr, fbuf, poolq, out_row};
            if (pool)
                mf_pool_run(pool, gen_worker, &pj);
            else
                gen_worker(&pj, 0, 1);
            for (int64_t r = 0; r < nrows && rc == 0; r += chunk) {
                const int64_t nr = nrows - r < chunk ? nrows - r : chunk;
                fast_fill(poolq, pr, out_row, r, nr, qbuf);
                rc = mf_gguf_writer_write(w, qbuf, (size_t)nr * out_row, &err);
            }
            free(poolq);
            continue;
        }
        for (int64_t r = 0; r < nrows && rc == 0; r += chunk) {
            gen_job j = {t, ts, r, nrows - r < chunk ? nrows - r : chunk, fbuf, qbuf, out_row};
            if (pool && j.nrows > 1)
                mf_pool_run(pool, gen_worker, &j);
            else
                gen_worker(&j, 0, 1);
            rc = mf_gguf_writer_write(w, qbuf, (size_t)j.nrows * out_row, &err);
        }
    }
    free(fbuf);
    free(qbuf);
    if (pool)
        mf_pool_free(pool);
    if (rc || mf_gguf_writer_finish(w, &err))
        goto fail;
    fprintf(stderr,
            "synth: wrote %s: %s %s, %d tensors, %.1fM parameters, %.2f MiB of weights"
            " (%.2f bits per weight), %s, seed %" PRIu64 ", %.1f s\n",
            out, c->arch, c->name, p.n, (double)total_params / 1e6,
            (double)total_bytes / 1048576.0, 8.0 * (double)total_bytes / (double)total_params,
            mix->name, seed, (double)(mf_time_ns() - t0) * 1e-9);
    mf_gguf_writer_free(w);
    free(p.t);
    return 0;

fail:
    fprintf(stderr, "synth: %s\n", err.msg);
    mf_gguf_writer_free(w);
    free(p.t);
    return 1;
}

/* ---- arguments ------------------------------------------------------------------------ */

static void synth_usage(FILE *f) {
    fprintf(f,
            "usage: minfer synth (--preset NAME | --arch ARCH shape flags) [--type T] [--seed S]\n"
            "                    -o FILE [--layers N] [--vocab N] [--ctx N] [--threads N] [--pure]\n"
            "  presets: qwen2-0.5b qwen2-1.5b qwen2-7b qwen3-0.6b qwen3-4b qwen3-8b smollm2-135m\n"
            "  archs:   llama qwen2 qwen3\n"
            "  shape flags (override a preset's values): --dim --layers --ff --heads --kv-heads\n"
            "    --head-dim --vocab --ctx --theta --eps --tied/--untied\n"
            "  --type T   weight type or mix (default f16): %s\n"
            "  --seed S   random seed (default 0); the same seed gives identical bytes\n"
            "  --pure     every 2-D weight gets T (no llama.cpp mix adjustments)\n"
            "  --fast     draw 512 rows per tensor and repeat them (valid weights, much faster\n"
            "             for multi-GB models; for speed measurements, not accuracy tests)\n",
            mf_quant_mix_names());
}

typedef struct int_flag {
    const char *flag;
    int64_t lo, hi;
    int64_t *dst;
} int_flag;

int mf_cmd_synth(int argc, char **argv) {
    mf_error err = {{0}};
    synth_cfg c = {NULL, NULL, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0, -1};
    synth_cfg set = c; /* values given by flags; 0 / -1 = not given */
    const char *arch = NULL, *preset = NULL, *type = "f16", *out = NULL;
    int64_t seed = 0, threads = 0;
    bool pure = false, fast = false, have_theta = false, have_eps = false;
    int_flag ints[] = {
        {"--dim", 1, 1 << 20, &set.dim},        {"--layers", 1, 4096, &set.layers},
        {"--ff", 1, 1 << 22, &set.ff},          {"--heads", 1, 4096, &set.heads},
        {"--kv-heads", 1, 4096, &set.kv_heads}, {"--head-dim", 2, 1 << 16, &set.head_dim},
        {"--vocab", MF_SYNTH_VOCAB_MIN, (int64_t)MF_GGUF_MAX_VOCAB, &set.vocab},
        {"--ctx", 1, 1 << 26, &set.ctx},        {"--seed", 0, INT64_MAX, &seed},
        {"--threads", 1, 4096, &threads},
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r = 0;
        if (mf_arg_is_help(a)) {
            synth_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--tied") || !strcmp(a, "--untied")) {
            set.tied = !strcmp(a, "--tied");
            continue;
        }
        if (!strcmp(a, "--fast")) {
            fast = true;
            continue;
        }
        if (!strcmp(a, "--pure")) {
            pure = true;
            continue;
        }
        bool done = false;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0] && !done; k++) {
            if ((r = mf_arg_value(argc, argv, &i, ints[k].flag, &v, &err)) == 0)
                continue;
            if (r < 0 || mf_arg_int(ints[k].flag, v, ints[k].lo, ints[k].hi, ints[k].dst, &err))
                return mf_arg_fail("synth", &err);
            done = true;
        }
        if (done)
            continue;
        if ((r = mf_arg_value(argc, argv, &i, "--theta", &v, &err)) != 0 ||
            (r = mf_arg_value(argc, argv, &i, "--eps", &v, &err)) != 0) {
            bool is_theta = !strncmp(a, "--theta", 7);
            double x;
            if (r < 0 || mf_arg_float(is_theta ? "--theta" : "--eps", v, &x, &err))
                return mf_arg_fail("synth", &err);
            if (x <= 0) {
                mf_errorf(&err, "%s: %s must be positive", is_theta ? "--theta" : "--eps", v);
                return mf_arg_fail("synth", &err);
            }
            *(is_theta ? &set.theta : &set.eps) = x;
            *(is_theta ? &have_theta : &have_eps) = true;
            continue;
        }
        if ((r = mf_arg_value(argc, argv, &i, "--arch", &arch, &err)) != 0 ||
            (r = mf_arg_value(argc, argv, &i, "--preset", &preset, &err)) != 0 ||
            (r = mf_arg_value(argc, argv, &i, "--type", &type, &err)) != 0 ||
            (r = mf_arg_value(argc, argv, &i, "--output", &out, &err)) != 0 ||
            (r = mf_arg_value(argc, argv, &i, "-o", &out, &err)) != 0) {
            if (r < 0)
                return mf_arg_fail("synth", &err);
            continue;
        }
        fprintf(stderr, "synth: unknown argument '%s' (see 'minfer synth --help')\n", a);
        return 2;
    }

    if (preset) {
        size_t k = 0;
        while (k < N_PRESETS && strcasecmp(preset, presets[k].name) != 0)
            k++;
        if (k == N_PRESETS) {
            fprintf(stderr, "synth: unknown preset '%s' (valid: qwen2-0.5b qwen2-1.5b qwen2-7b "
                            "qwen3-0.6b qwen3-4b qwen3-8b smollm2-135m)\n", preset);
            return 2;
        }
        c = presets[k];
        if (arch && strcmp(arch, c.arch) != 0) {
            fprintf(stderr, "synth: --arch %s does not match preset %s (arch %s)\n", arch,
                    c.name, c.arch);
            return 2;
        }
    } else {
        if (!arch) {
            fprintf(stderr, "synth: --preset or --arch is required (see 'minfer synth --help')\n");
            return 2;
        }
        size_t k = 0;
        while (k < 3 && strcmp(arch, archs[k]) != 0)
            k++;
        if (k == 3) {
            fprintf(stderr, "synth: unknown arch '%s' (valid: llama qwen2 qwen3)\n", arch);
            return 2;
        }
        if (!set.dim || !set.layers || !set.ff || !set.heads) {
            fprintf(stderr, "synth: without --preset, --dim --layers --ff --heads are required\n");
            return 2;
        }
        bool llama = k == 0;
        c = (synth_cfg){archs[k], archs[k], llama ? "smollm" : "qwen2", 0, 0, 0, 0, 0, 0,
                        32000, 4096, llama ? 1e4 : 1e6, llama ? 1e-5 : 1e-6, 0};
    }
    /* flags override the preset */
    if (set.dim) c.dim = set.dim;
    if (set.layers) c.layers = set.layers;
    if (set.ff) c.ff = set.ff;
    if (set.heads) c.heads = set.heads;
    if (set.kv_heads) c.kv_heads = set.kv_heads;
    if (set.head_dim) c.head_dim = set.head_dim;
    if (set.vocab) c.vocab = set.vocab;
    if (set.ctx) c.ctx = set.ctx;
    if (have_theta) c.theta = set.theta;
    if (have_eps) c.eps = set.eps;
    if (set.tied >= 0) c.tied = set.tied;
    if (!c.kv_heads) c.kv_heads = c.heads;
    if (!c.head_dim) {
        if (c.dim % c.heads != 0) {
            fprintf(stderr, "synth: --dim %" PRId64 " is not a multiple of --heads %" PRId64
                            " (give --head-dim)\n", c.dim, c.heads);
            return 2;
        }
        c.head_dim = c.dim / c.heads;
    }
    if (c.heads % c.kv_heads != 0) {
        fprintf(stderr, "synth: --heads %" PRId64 " is not a multiple of --kv-heads %" PRId64 "\n",
                c.heads, c.kv_heads);
        return 2;
    }
    if (c.head_dim % 2 != 0) {
        fprintf(stderr, "synth: head dim %" PRId64 " must be even (RoPE rotates pairs)\n",
                c.head_dim);
        return 2;
    }
    mf_quant_mix mix;
    if (mf_quant_mix_parse(type, &mix, &err))
        return mf_arg_fail("synth", &err);
    mix.pure = pure;
    if (!out) {
        fprintf(stderr, "synth: missing -o FILE\n");
        return 2;
    }
    if (threads <= 0)
        threads = mf_cpu_count();
    return write_model(&c, &mix, (uint64_t)seed, out, (int)threads, fast);
}
