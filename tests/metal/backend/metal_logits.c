/* metal_logits - runs a model through the engine with the Metal backend
 * first (then the CPU) and dumps every position's logits, for comparison with
 * the float64 reference (tests/ref/ref_forward.py) in test_metal_e2e.py.
 *
 *   metal_logits MODEL --tokens 1,2,3 [--decode N] [--cache f32|f16|q8_0]
 *                [--no-fuse] [--withhold NAME] [--rebuild] [--out PREFIX]
 *
 * Prefill of the prompt with every row's logits, then N greedy decode steps
 * (argmax, first index on ties; decode uses the fused ops unless --no-fuse).
 * The all-weights-registered gate runs as in the session: a withheld weight
 * sends the whole graph to the CPU with a message naming it. --rebuild drops
 * the cached graph before every decode step. Output: PREFIX.json {"tokens",
 * "n_vocab", "n_rows", "splits", "metal_nodes", "bin"} and PREFIX.bin (rows of
 * raw f32). Exit 0, 1 on an engine error (message on stderr), 2 on usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/metal/metal_backend.h"
#include "engine/engine.h"
#include "runtime/levers.h"
#include "gguf/gguf.h"
#include "model/model.h"

static int usage(void) {
    fprintf(stderr, "usage: metal_logits MODEL --tokens 1,2,3 [--decode N] [--cache f32|f16|q8_0] "
                    "[--no-fuse] [--withhold NAME] [--rebuild] [--out PREFIX]\n");
    return 2;
}

static int argmax(const float *v, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return (int)b;
}

int main(int argc, char **argv) {
    if (argc < 2)
        return usage();
    const char *path = argv[1], *toks = NULL, *out = "metal_logits", *withhold = NULL;
    int n_dec = 0;
    bool no_fuse = false, rebuild = false;
    uint32_t kv_type = 0; /* 0: the Metal policy's choice (mf_metal_auto_cache_type) */
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            toks = argv[++i];
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc)
            n_dec = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--withhold") && i + 1 < argc)
            withhold = argv[++i];
        else if (!strcmp(argv[i], "--no-fuse"))
            no_fuse = true;
        else if (!strcmp(argv[i], "--rebuild"))
            rebuild = true;
        else if (!strcmp(argv[i], "--cache") && i + 1 < argc) {
            const char *c = argv[++i];
            kv_type = !strcmp(c, "f16") ? MF_TYPE_F16 : !strcmp(c, "q8_0") ? MF_TYPE_Q8_0 : MF_TYPE_F32;
        } else
            return usage();
    }
    if (!toks || n_dec < 0)
        return usage();
    int32_t tokens[4096];
    int n_prompt = 0;
    for (const char *p = toks; *p && n_prompt < 2048;) {
        tokens[n_prompt++] = (int32_t)strtol(p, (char **)&p, 10);
        if (*p == ',')
            p++;
    }
    mf_error err = {{0}};
    mf_model *m = NULL;
    if (mf_model_load(path, NULL, NULL, NULL, &m, &err)) {
        fprintf(stderr, "metal_logits: %s\n", err.msg);
        return 1;
    }
    mf_metal_region regs[16];
    int n_regs = 0;
    for (uint32_t p = 0; p < mf_gguf_n_parts(m->gguf) && n_regs < 16; p++) {
        const void *base;
        uint64_t size;
        if (mf_gguf_part_mapping(m->gguf, p, &base, &size) == 0)
            regs[n_regs++] = (mf_metal_region){base, size};
    }
    mf_backend_options bo; /* the backend's levers (MINFER_METAL_GEMM ...), as the runtime reads them */
    mf_levers_backend_options(&bo);
    mf_metal_opts mo = {.regions = regs, .n_regions = n_regs, .withhold = withhold, .backend = &bo};
    mf_backend *be[2] = {NULL, NULL};
    if (mf_backend_metal_new(m->weights, &mo, &be[0], &err) || mf_backend_cpu_new(m->weights, 2, &be[1], &err)) {
        fprintf(stderr, "metal_logits: %s\n", err.msg);
        if (be[0])
            mf_backend_free(be[0]);
        mf_model_free(m);
        return 1;
    }
    const char *missing = NULL;
    const char *const *names = NULL;
    const int32_t n_names = mf_model_graph_weights(m, &names);
    bool gpu = mf_backend_weights_on(be[0], names, n_names, &missing);
    if (!gpu)
        fprintf(stderr, "metal_logits: metal does not hold weight '%s'; the whole graph runs on the CPU\n",
                missing);
    if (!kv_type)
        kv_type = mf_metal_auto_cache_type(m->hp.n_layer, (int64_t)m->hp.n_head_kv * m->hp.head_dim);
    const int n_ctx = n_prompt + n_dec + 1;
    mf_engine_opts eo = {.n_layers = m->hp.n_layer, .kv_dim = (int64_t)m->hp.n_head_kv * m->hp.head_dim,
                         .n_ctx = n_ctx, .k_type = kv_type, .v_type = kv_type, .n_vocab = m->hp.n_vocab,
                         /* the engine's levers, as the runtime passes them */
                         .trace = (int32_t)mf_lever_int("MINFER_GRAPH_TRACE"),
                         .profile = mf_lever_flag("MINFER_OP_PROFILE")};
    mf_engine *e = NULL;
    if (mf_engine_new(&eo, be, 2, &e, &err)) {
        fprintf(stderr, "metal_logits: %s\n", err.msg);
        mf_model_free(m);
        return 1;
    }
    if (!gpu)
        mf_engine_set_backend_enabled(e, 0, false);
    const int64_t nv = m->hp.n_vocab;
    float *rows = malloc((size_t)(n_prompt + n_dec) * (size_t)nv * sizeof(float));
    int rc = 0, splits = 0, metal_nodes = 0;
    int64_t dispatch0 = 0, decode_dispatches = 0; /* Metal dispatches of the last decode step */
    const bool qwen3 = m->arch == MF_ARCH_QWEN3;
    for (int step = 0; step <= n_dec && !rc; step++) {
        const int nt = step ? 1 : n_prompt, n_past = step ? n_prompt + step - 1 : 0;
        mf_graph_params p = {.n_tokens = nt, .n_outputs = nt, .n_ctx = n_ctx, .k_type = kv_type, .v_type = kv_type,
                             .gpu = gpu};
        p.fuse_swiglu = mf_engine_supports_fused(e, &p, MF_FUSE_SWIGLU);
        if (step && !no_fuse) {
            p.fuse_qkv = mf_engine_supports_fused(e, &p, qwen3 ? MF_FUSE_QKV_NORM : MF_FUSE_QKV);
            p.fuse_ffn = mf_engine_supports_fused(e, &p, MF_FUSE_FFN);
        }
        if (rebuild)
            mf_engine_invalidate(e);
        float *dst = rows + (size_t)(step ? n_prompt + step - 1 : 0) * (size_t)nv;
        dispatch0 = mf_metal_n_dispatches(mf_engine_backend(e, 0));
        rc = mf_engine_forward(e, &p, mf_model_build_graph, m, tokens + n_past, n_past, dst, &err);
        if (rc)
            break;
        decode_dispatches = mf_metal_n_dispatches(mf_engine_backend(e, 0)) - dispatch0;
        splits = mf_engine_n_splits(e);
        const mf_graph *g = mf_engine_graph(e);
        metal_nodes = 0;
        for (int32_t i = 0; i < g->n_nodes; i++)
            metal_nodes += !(g->nodes[i].flags & MF_NODE_DEAD) && g->nodes[i].backend == 0 &&
                           g->nodes[i].op != MF_OP_INPUT;
        if (step < n_dec)
            tokens[n_prompt + step] = argmax(dst + (size_t)(nt - 1) * (size_t)nv, nv);
    }
    if (rc) {
        fprintf(stderr, "metal_logits: %s\n", err.msg);
    } else {
        char fn[1024];
        snprintf(fn, sizeof fn, "%s.bin", out);
        FILE *f = fopen(fn, "wb");
        if (!f || fwrite(rows, sizeof(float) * (size_t)nv, (size_t)(n_prompt + n_dec), f) != (size_t)(n_prompt + n_dec))
            rc = -1;
        if (f)
            fclose(f);
        snprintf(fn, sizeof fn, "%s.json", out);
        f = fopen(fn, "w");
        if (!f) {
            rc = -1;
        } else {
            fprintf(f, "{\"tokens\": [");
            for (int i = 0; i < n_prompt + n_dec; i++)
                fprintf(f, "%s%d", i ? ", " : "", tokens[i]);
            fprintf(f, "], \"n_vocab\": %lld, \"n_rows\": %d, \"splits\": %d, \"metal_nodes\": %d, "
                       "\"dispatches\": %lld, \"bin\": \"%s.bin\"}\n",
                    (long long)nv, n_prompt + n_dec, splits, metal_nodes, (long long)decode_dispatches, out);
            fclose(f);
        }
        if (rc)
            fprintf(stderr, "metal_logits: cannot write %s\n", out);
    }
    free(rows);
    mf_engine_free(e);
    mf_model_free(m);
    return rc ? 1 : 0;
}
