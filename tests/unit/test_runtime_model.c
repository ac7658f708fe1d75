/* test_runtime_model.c - src/model: hyperparameters and tensor checks on
 * tiny GGUFs written with the gguf writer, the error message for each broken
 * file, the graph builder's node census per graph params, and the
 * all-weights-registered gate. */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "backend/backend.h"
#include "gguf/gguf.h"
#include "mf_test.h"
#include "model/model.h"
#include "quant/quant.h"

enum { D = 64, FF = 96, H = 4, HKV = 2, V = 50, NL = 2 };

typedef struct spec {
    const char *arch;
    int head_dim;            /* 0: default D / H */
    int n_head, n_head_kv;   /* 0: H, HKV */
    bool tied;
    const char *drop;        /* tensor left out */
    const char *bad_shape;   /* tensor given one more output row */
    const char *bad_type;    /* tensor written as I32 */
    bool no_eps;
    int block_count;         /* 0: NL (the layers written) */
    const char *extra;       /* a vector tensor [D] added after the layers */
} spec;

static char path_buf[512];

static const char *tmp_path(const char *name) {
    const char *dir = getenv("MINFER_TMP");
    snprintf(path_buf, sizeof path_buf, "%s/rt_model_%d_%s.gguf", dir && *dir ? dir : "/tmp",
             (int)getpid(), name);
    return path_buf;
}

typedef struct tdesc {
    char name[64];
    int64_t ne[2];
    int n_dims;
    uint32_t type;
} tdesc;

/* Writes a tiny model of spec s to path; returns 0 on success. */
static int write_model(const spec *s, const char *path) {
    int hd = s->head_dim ? s->head_dim : D / (s->n_head ? s->n_head : H);
    int nh = s->n_head ? s->n_head : H, nkv = s->n_head_kv ? s->n_head_kv : HKV;
    mf_gguf_writer *w = mf_gguf_writer_new();
    char key[128];
    mf_gguf_writer_set_str(w, "general.architecture", s->arch);
#define KEY(k) (snprintf(key, sizeof key, "%s.%s", s->arch, k), key)
    mf_gguf_writer_set_u32(w, KEY("embedding_length"), D);
    mf_gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)(s->block_count ? s->block_count : NL));
    mf_gguf_writer_set_u32(w, KEY("feed_forward_length"), FF);
    mf_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)nh);
    mf_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)nkv);
    mf_gguf_writer_set_u32(w, KEY("context_length"), 256);
    if (s->head_dim)
        mf_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)hd);
    if (!s->no_eps)
        mf_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f);
    mf_gguf_writer_set_f32(w, KEY("rope.freq_base"), 1e6f);
#undef KEY
    tdesc t[64];
    int n = 0;
#define T2(nm, a, b) (snprintf(t[n].name, 64, "%s", nm), t[n].ne[0] = a, t[n].ne[1] = b, t[n].n_dims = 2, n++)
#define T1(nm, a) (snprintf(t[n].name, 64, "%s", nm), t[n].ne[0] = a, t[n].ne[1] = 1, t[n].n_dims = 1, n++)
    char nm[64];
    T2("token_embd.weight", D, V);
    T1("output_norm.weight", D);
    if (!s->tied)
        T2("output.weight", D, V);
    for (int l = 0; l < NL; l++) {
#define L(x) (snprintf(nm, sizeof nm, "blk.%d.%s", l, x), nm)
        T1(L("attn_norm.weight"), D);
        T2(L("attn_q.weight"), D, nh * hd);
        T2(L("attn_k.weight"), D, nkv * hd);
        T2(L("attn_v.weight"), D, nkv * hd);
        if (!strcmp(s->arch, "qwen2")) {
            T1(L("attn_q.bias"), nh * hd);
            T1(L("attn_k.bias"), nkv * hd);
            T1(L("attn_v.bias"), nkv * hd);
        }
        if (!strcmp(s->arch, "qwen3")) {
            T1(L("attn_q_norm.weight"), hd);
            T1(L("attn_k_norm.weight"), hd);
        }
        T2(L("attn_output.weight"), nh * hd, D);
        T1(L("ffn_norm.weight"), D);
        T2(L("ffn_gate.weight"), D, FF);
        T2(L("ffn_up.weight"), D, FF);
        T2(L("ffn_down.weight"), FF, D);
#undef L
    }
    if (s->extra)
        T1(s->extra, D);
    mf_error err;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        t[i].type = MF_TYPE_F32;
        if (s->drop && !strcmp(t[i].name, s->drop))
            continue;
        if (s->bad_shape && !strcmp(t[i].name, s->bad_shape))
            t[i].ne[t[i].n_dims - 1] += 1;
        if (s->bad_type && !strcmp(t[i].name, s->bad_type))
            t[i].type = MF_TYPE_I32;
        if (mf_gguf_writer_add_tensor(w, t[i].name, t[i].type, (uint32_t)t[i].n_dims, t[i].ne,
                                      &err) < 0)
            rc = -1;
    }
    if (!rc && mf_gguf_writer_begin(w, path, &err))
        rc = -1;
    for (int i = 0; !rc && i < n; i++) {
        if (s->drop && !strcmp(t[i].name, s->drop))
            continue;
        size_t nel = (size_t)(t[i].ne[0] * t[i].ne[1]);
        float *data = malloc(nel * 4);
        for (size_t j = 0; j < nel; j++)
            data[j] = (float)((j * 7 + (size_t)i) % 13) / 13.0f - 0.5f;
        if (mf_gguf_writer_write(w, data, nel * 4, &err))
            rc = -1;
        free(data);
    }
    if (!rc && mf_gguf_writer_finish(w, &err))
        rc = -1;
    if (rc)
        fprintf(stderr, "  write_model: %s\n", err.msg);
    mf_gguf_writer_free(w);
    return rc;
}

/* Loads spec s; returns the model or NULL with the error in *err. */
static mf_model *load(const spec *s, const char *name, mf_error *err) {
    const char *p = tmp_path(name);
    if (write_model(s, p)) {
        snprintf(err->msg, sizeof err->msg, "could not write %s", p);
        return NULL;
    }
    mf_model *m = NULL;
    if (mf_model_load(p, NULL, NULL, NULL, &m, err))
        m = NULL;
    unlink(p);
    return m;
}

MF_TEST(hparams_and_tensors) {
    mf_error err = {{0}};
    spec s = {.arch = "llama", .tied = true};
    mf_model *m = load(&s, "llama", &err);
    CHECK_MSG(m != NULL, "%s", err.msg);
    if (!m)
        return;
    CHECK_EQ_INT(m->arch, MF_ARCH_LLAMA);
    CHECK_EQ_INT(m->hp.n_embd, D);
    CHECK_EQ_INT(m->hp.head_dim, D / H);
    CHECK_EQ_INT(m->hp.n_rot, D / H);
    CHECK_EQ_INT(m->hp.n_head_kv, HKV);
    CHECK_EQ_INT(m->hp.n_vocab, V);
    CHECK_EQ_INT(m->hp.rope_mode, MF_ROPE_NORMAL);
    CHECK_NEAR(m->hp.rope_theta, 1e6, 1);
    CHECK(m->tied);
    CHECK_STR_CONTAINS(m->output, "token_embd.weight");
    CHECK(m->layers[1].bq == NULL && m->layers[1].q_norm == NULL);
    mf_model_free(m);

    spec q2 = {.arch = "qwen2"};
    m = load(&q2, "qwen2", &err);
    CHECK_MSG(m != NULL, "%s", err.msg);
    if (m) {
        CHECK(!m->tied);
        CHECK_EQ_INT(m->hp.rope_mode, MF_ROPE_NEOX);
        CHECK_STR_CONTAINS(m->layers[1].bk, "blk.1.attn_k.bias");
        mf_model_free(m);
    }
    spec q3 = {.arch = "qwen3", .head_dim = 32, .tied = true};
    m = load(&q3, "qwen3", &err);
    CHECK_MSG(m != NULL, "%s", err.msg);
    if (m) {
        CHECK_EQ_INT(m->hp.head_dim, 32); /* explicit key_length, != D / H */
        CHECK_STR_CONTAINS(m->layers[0].k_norm, "blk.0.attn_k_norm.weight");
        mf_model_free(m);
    }
}

static void expect_error(const spec *s, const char *want) {
    mf_error err = {{0}};
    mf_model *m = load(s, "bad", &err);
    CHECK_MSG(m == NULL, "loaded, wanted an error containing '%s'", want);
    mf_model_free(m);
    CHECK_STR_CONTAINS(err.msg, want);
    CHECK_MSG(strchr(err.msg, '\n') == NULL, "multi-line error: %s", err.msg);
    CHECK_MSG(strchr(err.msg, '\x1b') == NULL, "raw ESC in the error: %s", err.msg);
}

MF_TEST(broken_models_are_refused_by_name) {
    expect_error(&(spec){.arch = "gpt2"}, "unsupported architecture 'gpt2'");
    expect_error(&(spec){.arch = "llama", .drop = "blk.1.ffn_up.weight"},
                 "tensor 'blk.1.ffn_up.weight' not found");
    expect_error(&(spec){.arch = "llama", .bad_shape = "blk.0.attn_v.weight"},
                 "'blk.0.attn_v.weight' has shape [64, 33], expected [64, 32]");
    expect_error(&(spec){.arch = "llama", .bad_type = "blk.0.ffn_gate.weight"},
                 "'blk.0.ffn_gate.weight' has unsupported type i32");
    expect_error(&(spec){.arch = "llama", .n_head = 4, .n_head_kv = 3},
                 "head_count 4 is not a multiple of llama.attention.head_count_kv 3");
    expect_error(&(spec){.arch = "llama", .n_head = 5, .n_head_kv = 5},
                 "embedding_length 64 is not a multiple of llama.attention.head_count 5");
    expect_error(&(spec){.arch = "llama", .no_eps = true}, "layer_norm_rms_epsilon' not found");
    expect_error(&(spec){.arch = "qwen2", .drop = "blk.0.attn_v.bias"},
                 "tensor 'blk.0.attn_v.bias' not found");
    expect_error(&(spec){.arch = "qwen3", .drop = "blk.1.attn_q_norm.weight"},
                 "tensor 'blk.1.attn_q_norm.weight' not found");
    expect_error(&(spec){.arch = "llama", .bad_shape = "output.weight"}, "output.weight");
    /* Files that describe a different model than they hold. */
    expect_error(&(spec){.arch = "llama", .block_count = 1},
                 "tensor 'blk.1.attn_norm.weight' belongs to layer 1, but llama.block_count is 1");
    expect_error(&(spec){.arch = "llama", .extra = "blk.2.attn_norm.weight"},
                 "belongs to layer 2, but llama.block_count is 2");
    expect_error(&(spec){.arch = "llama", .extra = "rope_freqs.weight"},
                 "tensor 'rope_freqs.weight' is not used by the llama architecture");
    expect_error(&(spec){.arch = "qwen2", .extra = "blk.0.attn_q_norm.weight"},
                 "tensor 'blk.0.attn_q_norm.weight' is not used by the qwen2 architecture");
    /* File strings reach messages escaped. */
    expect_error(&(spec){.arch = "ll\x1b[2Jama\n"}, "unsupported architecture 'll\\x1b[2Jama\\x0a'");
    expect_error(&(spec){.arch = "llama", .extra = "evil\x1b]0;x\x07.weight"},
                 "tensor 'evil\\x1b]0;x\\x07.weight' is not used");
    mf_error err;
    mf_model *m = NULL;
    CHECK(mf_model_load("/nonexistent/model.gguf", NULL, NULL, NULL, &m, &err) == -1 && !m);
}

/* Ops of a graph built for p. */
static void census(mf_model *m, const mf_graph_params *p, int32_t *cnt, mf_graph *g) {
    mf_error err = {{0}};
    mf_graph_init(g);
    memset(cnt, 0, MF_OP_COUNT * sizeof *cnt);
    int rc = mf_model_build_graph(m, p, g, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    for (int32_t i = 0; i < g->n_nodes; i++)
        cnt[g->nodes[i].op]++;
}

MF_TEST(builder_emits_the_right_ops) {
    mf_error err = {{0}};
    int32_t c[MF_OP_COUNT];
    mf_graph g;
    const char *arch[3] = {"llama", "qwen2", "qwen3"};
    for (int a = 0; a < 3; a++) {
        spec s = {.arch = arch[a], .tied = a != 1};
        mf_model *m = load(&s, arch[a], &err);
        CHECK_MSG(m != NULL, "%s", err.msg);
        if (!m)
            continue;
        mf_graph_params p = {.n_tokens = 5, .n_outputs = 1, .n_ctx = 64, .k_type = MF_TYPE_F32, .v_type = MF_TYPE_F32};
        census(m, &p, c, &g);
        CHECK_EQ_INT(c[MF_OP_MATMUL], 7 * NL + 1);
        CHECK_EQ_INT(c[MF_OP_ROPE], 2 * NL);
        CHECK_EQ_INT(c[MF_OP_QKNORM], a == 2 ? 2 * NL : 0);
        CHECK_EQ_INT(c[MF_OP_ATTN], NL);
        CHECK_EQ_INT(c[MF_OP_KVCACHE_STORE], NL);
        /* the builder leaves SILU + MUL; only the fusion pass makes SWIGLU */
        CHECK_EQ_INT(c[MF_OP_SWIGLU], 0);
        CHECK_EQ_INT(c[MF_OP_SILU], NL);
        CHECK_EQ_INT(c[MF_OP_MUL], NL);
        CHECK_EQ_INT(c[MF_OP_RMSNORM], 2 * NL + 1);
        CHECK_EQ_INT(c[MF_OP_GETROWS], 2); /* embedding + last-row select */
        CHECK_EQ_INT(c[MF_OP_ADD], 2 * NL);
        const mf_node *out = &g.nodes[g.n_nodes - 1];
        CHECK(out->flags & MF_NODE_OUTPUT);
        CHECK_EQ_INT(out->ne[0], V);
        CHECK_EQ_INT(out->ne[1], 1);
        CHECK_STR_CONTAINS(out->meta.matmul.weight, a == 1 ? "output.weight" : "token_embd");
        int rope_mode = -1, biased = 0;
        for (int32_t i = 0; i < g.n_nodes; i++) {
            if (g.nodes[i].op == MF_OP_ROPE)
                rope_mode = g.nodes[i].meta.rope.mode;
            if (g.nodes[i].op == MF_OP_MATMUL && g.nodes[i].meta.matmul.bias)
                biased++;
            if (g.nodes[i].op == MF_OP_ATTN)
                CHECK_EQ_INT(g.nodes[i].layer, g.nodes[i].meta.attn.layer);
        }
        CHECK_EQ_INT(rope_mode, a == 0 ? MF_ROPE_NORMAL : MF_ROPE_NEOX);
        CHECK_EQ_INT(biased, a == 1 ? 3 * NL : 0);
        CHECK_EQ_INT(g.n_layers, NL);
        mf_graph_free(&g);

        /* logits for every position: no row select, n_tokens rows */
        p.n_outputs = 5;
        census(m, &p, c, &g);
        CHECK_EQ_INT(c[MF_OP_GETROWS], 1);
        CHECK_EQ_INT(g.nodes[g.n_nodes - 1].ne[1], 5);
        mf_graph_free(&g);

        /* decode with the fusions */
        p = (mf_graph_params){.n_tokens = 1, .n_outputs = 1, .n_ctx = 64, .fuse_qkv = true,
                              .fuse_ffn = true};
        census(m, &p, c, &g);
        CHECK_EQ_INT(c[a == 2 ? MF_OP_FUSED_QKV_NORM : MF_OP_FUSED_QKV], NL);
        CHECK_EQ_INT(c[MF_OP_FUSED_FFN], NL);
        CHECK_EQ_INT(c[MF_OP_ROPE] + c[MF_OP_KVCACHE_STORE] + c[MF_OP_QKNORM], 0);
        CHECK_EQ_INT(c[MF_OP_MATMUL], 2 * NL + 1);
        mf_graph_free(&g);

        /* fuse_swiglu leaves SILU + MUL for the fusion pass */
        p = (mf_graph_params){.n_tokens = 2, .n_outputs = 1, .n_ctx = 64, .fuse_swiglu = true};
        census(m, &p, c, &g);
        CHECK_EQ_INT(c[MF_OP_SILU], NL);
        CHECK_EQ_INT(c[MF_OP_MUL], NL);
        CHECK_EQ_INT(c[MF_OP_SWIGLU], 0);
        mf_graph_free(&g);
        mf_model_free(m);
    }
}

/* A fake GPU backend for the gate: holds every weight but one. */
static const char *fake_missing;
static bool fake_has_weight(const mf_backend *b, const char *name) {
    (void)b;
    return !fake_missing || strcmp(name, fake_missing) != 0;
}

MF_TEST(all_weights_registered_gate) {
    mf_error err = {{0}};
    spec s = {.arch = "qwen2"};
    mf_model *m = load(&s, "gate", &err);
    CHECK_MSG(m != NULL, "%s", err.msg);
    if (!m)
        return;
    mf_backend_ops ops = {0};
    mf_backend b = {.ops = &ops, .kind = MF_BACKEND_CUDA, .is_gpu = true};
    const char *missing = "x";
    const char *const *gw;
    int32_t n = mf_model_graph_weights(m, &gw);
    CHECK(mf_backend_weights_on(&b, gw, n, &missing)); /* no hook: reads the mapping */
    CHECK(missing == NULL);
    ops.has_weight = fake_has_weight;
    fake_missing = NULL;
    CHECK(mf_backend_weights_on(&b, gw, n, &missing));
    /* every tensor the graph reads counts, biases and norms included */
    const char *names[] = {"blk.1.attn_v.bias", "output_norm.weight", "token_embd.weight",
                           "blk.0.ffn_down.weight", "output.weight"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        fake_missing = names[i];
        CHECK_MSG(!mf_backend_weights_on(&b, gw, n, &missing), "gate passed without %s", names[i]);
        CHECK_MSG(missing && !strcmp(missing, names[i]), "named %s, not %s",
                  missing ? missing : "(null)", names[i]);
    }
    /* the gate's list is exactly the builder's weights */
    CHECK_EQ_INT(n, 2 + 1 + NL * 12);
    /* ... every name a node reads is in the list, and every listed name is read */
    mf_graph g;
    int32_t c[MF_OP_COUNT];
    mf_graph_params p = {.n_tokens = 3, .n_outputs = 1, .n_ctx = 64};
    census(m, &p, c, &g);
    int *used = calloc((size_t)n, sizeof *used);
    for (int32_t i = 0; i < g.n_nodes; i++) {
        const mf_node *nd = &g.nodes[i];
        const char *refs[2] = {NULL, NULL};
        if (nd->op == MF_OP_MATMUL) {
            refs[0] = nd->meta.matmul.weight;
            refs[1] = nd->meta.matmul.bias;
        } else if (nd->op == MF_OP_RMSNORM || nd->op == MF_OP_QKNORM) {
            refs[0] = nd->meta.norm.weight;
        } else if (nd->op == MF_OP_GETROWS && nd->meta.getrows.mode == 0) {
            refs[0] = nd->meta.getrows.weight;
        }
        for (int r = 0; r < 2; r++) {
            if (!refs[r])
                continue;
            int found = -1;
            for (int32_t k = 0; k < n; k++)
                if (!strcmp(gw[k], refs[r]))
                    found = k;
            CHECK_MSG(found >= 0, "node '%s' reads '%s', not in the gate list", nd->name, refs[r]);
            if (found >= 0)
                used[found] = 1;
        }
    }
    for (int32_t k = 0; k < n; k++)
        CHECK_MSG(used[k], "gate lists '%s' but no node reads it", gw[k]);
    free(used);
    mf_graph_free(&g);
    mf_model_free(m);
}

MF_TEST_MAIN(MF_T(hparams_and_tensors), MF_T(broken_models_are_refused_by_name),
             MF_T(builder_emits_the_right_ops), MF_T(all_weights_registered_gate))
