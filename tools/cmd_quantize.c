/* cmd_quantize.c - `minfer quantize IN OUT TYPE [--threads N] [--pure]`:
 * converts an F32/F16/BF16 GGUF to another weight type or a llama.cpp-style
 * mix (quant_mix.h). Streams: only one chunk of rows of one tensor is in
 * memory at a time; the output is written to OUT.tmp and renamed at the end. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "quant_mix.h"
#include "tools.h"

#define CHUNK_FLOATS (1 << 22) /* rows converted per step: about 16 MiB of floats */

static void quantize_usage(FILE *f) {
    fprintf(f,
            "usage: minfer quantize IN OUT TYPE [--threads N] [--pure]\n"
            "  IN must hold F32/F16/BF16 tensors. TYPE (case-insensitive):\n"
            "    %s\n"
            "  Mixes follow llama-quantize: 1-D tensors stay f32, output.weight (or the\n"
            "  tied token_embd.weight) gets q6_K (q8_0 for Q8_0), *_M mixes give attn_v\n"
            "  and ffn_down more bits in some layers, K-quants on rows that are not a\n"
            "  multiple of 256 fall back to q5_0/q5_1/q8_0/q4_0.\n"
            "  Single type q2_K: the names are case-insensitive, so q2_K is the Q2_K mix;\n"
            "  'Q2_K --pure' gives every 2-D weight q2_K.\n"
            "  --threads N  worker threads (default: all cores)\n"
            "  --pure       no per-tensor adjustments: every 2-D weight gets TYPE\n",
            mf_quant_mix_names());
}

/* The model facts the mix rules need, read from IN. */
static mf_mix_model mix_model_of(const mf_gguf *g) {
    mf_mix_model m = {0, 1, mf_gguf_find_tensor(g, "output.weight") != NULL};
    for (int64_t i = 0; i < mf_gguf_n_tensors(g); i++) {
        const char *n = mf_gguf_tensor_at(g, i)->name.ptr;
        size_t len = strlen(n);
        if (len >= 13 && !strcmp(n + len - 13, "attn_v.weight"))
            m.n_layer++;
    }
    mf_str arch = {0};
    if (mf_gguf_get_str(g, "general.architecture", &arch, NULL) == 0) {
        char key[160];
        uint32_t nh = 0, nkv = 0;
        snprintf(key, sizeof key, "%s.attention.head_count", arch.ptr);
        int a = mf_gguf_get_u32(g, key, &nh, NULL);
        snprintf(key, sizeof key, "%s.attention.head_count_kv", arch.ptr);
        int b = mf_gguf_get_u32(g, key, &nkv, NULL);
        if (a == 0 && b == 0 && nkv > 0)
            m.n_gqa = (int)(nh / nkv);
    }
    return m;
}

static bool skip_key(const char *k) {
    return !strcmp(k, "general.file_type") || !strcmp(k, "general.quantization_version") ||
           !strncmp(k, "split.", 6);
}

static int run_quantize(const char *in, const char *out, const mf_quant_mix *mix, int threads) {
    mf_error err = {{0}};
    mf_gguf *g = NULL;
    if (mf_gguf_open(in, &g, &err)) {
        fprintf(stderr, "quantize: %s\n", err.msg);
        return 1;
    }
    int64_t nt = mf_gguf_n_tensors(g);
    for (int64_t i = 0; i < nt; i++) {
        const mf_gguf_tensor *t = mf_gguf_tensor_at(g, i);
        if (t->type != MF_TYPE_F32 && t->type != MF_TYPE_F16 && t->type != MF_TYPE_BF16) {
            fprintf(stderr,
                    "quantize: '%s' tensor '%s' is already %s; requantizing is not supported\n",
                    in, MF_ESCN(t->name.ptr, (size_t)t->name.len), mf_type_name(t->type));
            mf_gguf_close(g);
            return 1;
        }
    }

    mf_mix_model model = mix_model_of(g);
    mf_gguf_writer *w = mf_gguf_writer_new();
    uint32_t align = 0;
    if (mf_gguf_get_u32(g, "general.alignment", &align, NULL) == 0 && align > 0)
        mf_gguf_writer_set_alignment(w, align);
    for (int64_t i = 0; i < mf_gguf_n_kv(g); i++)
        if (!skip_key(mf_gguf_kv_key(g, i).ptr))
            mf_gguf_writer_copy_kv(w, g, i);
    mf_gguf_writer_set_u32(w, "general.quantization_version", 2);
    mf_gguf_writer_set_u32(w, "general.file_type", mix->ftype);

    uint32_t *types = mf_malloc((size_t)(nt > 0 ? nt : 1) * sizeof *types);
    uint64_t bytes_in = 0, bytes_out = 0, params = 0;
    for (int64_t i = 0; i < nt; i++) {
        const mf_gguf_tensor *t = mf_gguf_tensor_at(g, i);
        types[i] = mf_quant_mix_choose(mix, &model, t->name.ptr, t->n_dims, t->ne[0], NULL, 0);
        if (mf_gguf_writer_add_tensor(w, t->name.ptr, types[i], t->n_dims, t->ne, &err) < 0)
            goto fail;
    }
    if (mf_gguf_writer_begin(w, out, &err))
        goto fail;

    mf_pool *pool = threads > 1 ? mf_pool_new(threads) : NULL;
    float *fbuf = NULL;
    void *qbuf = NULL;
    size_t fcap = 0, qcap = 0;
    uint64_t t0 = mf_time_ns();
    for (int64_t i = 0; i < nt; i++) {
        const mf_gguf_tensor *t = mf_gguf_tensor_at(g, i);
        int64_t n = t->ne[0], nrows = 1;
        for (uint32_t d = 1; d < t->n_dims; d++)
            nrows *= t->ne[d];
        char note[96], shape[64];
        mf_quant_mix_choose(mix, &model, t->name.ptr, t->n_dims, n, note, sizeof note);
        snprintf(shape, sizeof shape, "%" PRId64, n);
        for (uint32_t d = 1; d < t->n_dims; d++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "x%" PRId64, t->ne[d]);
        fprintf(stderr, "[%3" PRId64 "/%" PRId64 "] %-32s %5s -> %-5s %s%s%s%s\n", i + 1, nt,
                MF_ESCN(t->name.ptr, (size_t)t->name.len), mf_type_name(t->type), mf_type_name(types[i]), shape,
                note[0] ? "  (" : "", note, note[0] ? ")" : "");

        size_t in_row = mf_type_row_size(t->type, n), out_row = mf_type_row_size(types[i], n);
        int64_t chunk = CHUNK_FLOATS / n > 0 ? CHUNK_FLOATS / n : 1;
        if (chunk > nrows)
            chunk = nrows;
        if ((size_t)(chunk * n) > fcap) {
            fcap = (size_t)(chunk * n);
            fbuf = mf_realloc(fbuf, fcap * sizeof(float));
        }
        if ((size_t)chunk * out_row > qcap) {
            qcap = (size_t)chunk * out_row;
            qbuf = mf_realloc(qbuf, qcap);
        }
        for (int64_t r = 0; r < nrows; r += chunk) {
            int64_t nr = nrows - r < chunk ? nrows - r : chunk;
            mf_tools_to_float(t->type, (const uint8_t *)t->data + (size_t)r * in_row, fbuf, nr, n);
            mf_tools_from_float(pool, types[i], fbuf, qbuf, nr, n);
            if (mf_gguf_writer_write(w, qbuf, (size_t)nr * out_row, &err)) {
                free(fbuf);
                free(qbuf);
                if (pool)
                    mf_pool_free(pool);
                goto fail;
            }
        }
        bytes_in += t->nbytes;
        bytes_out += (uint64_t)nrows * out_row;
        params += (uint64_t)nrows * (uint64_t)n;
    }
    free(fbuf);
    free(qbuf);
    if (pool)
        mf_pool_free(pool);
    if (mf_gguf_writer_finish(w, &err))
        goto fail;
    double secs = (double)(mf_time_ns() - t0) * 1e-9;
    double pbits = params ? 8.0 / (double)params : 0.0;
    fprintf(stderr,
            "quantize: %s -> %s (%s, file_type %u): %" PRId64 " tensors, %.2f MiB -> %.2f MiB"
            " (%.2f -> %.2f bits per weight) in %.1f s\n",
            in, out, mix->name, mix->ftype, nt, (double)bytes_in / 1048576.0,
            (double)bytes_out / 1048576.0, (double)bytes_in * pbits, (double)bytes_out * pbits,
            secs);
    mf_gguf_writer_free(w);
    free(types);
    mf_gguf_close(g);
    return 0;

fail:
    fprintf(stderr, "quantize: %s\n", err.msg);
    mf_gguf_writer_free(w);
    free(types);
    mf_gguf_close(g);
    return 1;
}

int mf_cmd_quantize(int argc, char **argv) {
    const char *pos[3] = {0};
    int npos = 0, threads = 0;
    bool pure = false;
    mf_error err = {{0}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
        if (mf_arg_is_help(a)) {
            quantize_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--pure")) {
            pure = true;
        } else if ((r = mf_arg_value(argc, argv, &i, "--threads", &v, &err)) != 0) {
            if (r < 0 || mf_arg_i32("--threads", v, 1, 4096, &threads, &err))
                return mf_arg_fail("quantize", &err);
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "quantize: unknown option '%s' (see 'minfer quantize --help')\n", a);
            return 2;
        } else if (npos < 3) {
            pos[npos++] = a;
        } else {
            fprintf(stderr, "quantize: too many arguments ('%s')\n", a);
            return 2;
        }
    }
    if (npos < 3) {
        fprintf(stderr, "quantize: usage: minfer quantize IN OUT TYPE [--threads N] [--pure]\n");
        return 2;
    }
    mf_quant_mix mix;
    if (mf_quant_mix_parse(pos[2], &mix, &err))
        return mf_arg_fail("quantize", &err);
    mix.pure = pure;
    if (threads <= 0)
        threads = mf_cpu_count();
    return run_quantize(pos[0], pos[1], &mix, threads);
}
