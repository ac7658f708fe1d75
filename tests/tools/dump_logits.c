/* dump_logits - runs a model through the public API and dumps every
 * position's logits, for comparison with the float64 reference
 * (tests/ref/ref_forward.py). Uses only include/minfer.h.
 *
 *   dump_logits MODEL --tokens 1,2,3 [--decode N] [--threads N]
 *               [--cache f32|f16|q8_0] [--backends ref,cpu] [--device cpu]
 *               [--chunk N] [--ctx N] [--out PREFIX]
 *
 * The prompt is prefilled with logits_all (in pieces of --chunk tokens, each
 * its own minfer_prefill call, when given: that runs batches at n_past > 0),
 * then N greedy decode steps follow (argmax of the last row, first index on
 * ties). Output: JSON {"tokens": [prompt + generated], "n_vocab": V,
 * "n_rows": R, "backend": "...", "logits": [[...] one row per prompt position,
 * then one per decode step]}. With --out PREFIX the JSON goes to PREFIX.json
 * without "logits" and the rows go to PREFIX.bin as raw little-endian f32,
 * row after row ("bin" in the JSON names that file). Exit 0 on success, 1 on
 * an engine error (message on stderr), 2 on bad usage. */
#include "minfer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(void) {
    fprintf(stderr,
            "usage: dump_logits MODEL --tokens 1,2,3 [--decode N] [--threads N] [--cache f32|f16|q8_0]\n"
            "                   [--backends LIST] [--device NAME] [--chunk N] [--ctx N] [--out PREFIX]\n");
}

/* Parses a non-negative int flag value; returns -1 on garbage. */
static long parse_count(const char *flag, const char *s) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0 || v > 1000000) {
        fprintf(stderr, "dump_logits: %s: bad value '%s'\n", flag, s);
        return -1;
    }
    return v;
}

/* Parses "1,2,3" into a malloc'd array; returns the count or -1. */
static long parse_tokens(const char *s, int32_t **out) {
    long cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *t = malloc((size_t)cap * sizeof *t);
    if (!t) return -1;
    long n = 0;
    const char *p = s;
    while (*p) {
        char *end = NULL;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "dump_logits: --tokens: bad token list '%s'\n", s);
            free(t);
            return -1;
        }
        t[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    *out = t;
    return n;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static void write_json_head(FILE *f, const int32_t *toks, long n_toks, int32_t n_vocab, long n_rows,
                            const char *backend) {
    fprintf(f, "{\"tokens\": [");
    for (long i = 0; i < n_toks; i++) fprintf(f, "%s%d", i ? ", " : "", toks[i]);
    fprintf(f, "], \"n_vocab\": %d, \"n_rows\": %ld, \"backend\": \"%s\"", n_vocab, n_rows,
            backend ? backend : "");
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *tokens_arg = NULL, *cache = NULL, *backends = NULL;
    const char *device = NULL, *out_prefix = NULL;
    long n_decode = 0, n_threads = 0, chunk = 0, n_ctx = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (a[0] != '-') {
            if (model_path) {
                usage();
                return 2;
            }
            model_path = a;
            continue;
        }
        if (!v) {
            fprintf(stderr, "dump_logits: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--tokens")) tokens_arg = v;
        else if (!strcmp(a, "--decode")) n_decode = parse_count(a, v);
        else if (!strcmp(a, "--threads")) n_threads = parse_count(a, v);
        else if (!strcmp(a, "--chunk")) chunk = parse_count(a, v);
        else if (!strcmp(a, "--ctx")) n_ctx = parse_count(a, v);
        else if (!strcmp(a, "--cache")) cache = v;
        else if (!strcmp(a, "--backends")) backends = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--out")) out_prefix = v;
        else {
            fprintf(stderr, "dump_logits: unknown flag '%s'\n", a);
            usage();
            return 2;
        }
        if (n_decode < 0 || n_threads < 0 || chunk < 0 || n_ctx < 0) return 2;
    }
    if (!model_path || !tokens_arg) {
        usage();
        return 2;
    }
    int32_t *prompt = NULL;
    long n_prompt = parse_tokens(tokens_arg, &prompt);
    if (n_prompt <= 0) {
        if (n_prompt == 0) fprintf(stderr, "dump_logits: --tokens is empty\n");
        return 2;
    }

    char err[512] = {0};
    int rc = 1;
    minfer_model *m = NULL;
    minfer_session *s = NULL;
    float *rows = NULL;
    int32_t *toks = NULL;
    FILE *f = NULL;

    minfer_model_options mo;
    minfer_model_options_default(&mo);
    mo.path = model_path;
    mo.n_threads = (int32_t)n_threads;
    if (backends) mo.backends = backends;
    if (device) mo.device = device;
    m = minfer_model_load(&mo, err, sizeof err);
    if (!m) {
        fprintf(stderr, "dump_logits: load '%s': %s\n", model_path, err);
        goto done;
    }
    int32_t n_vocab = minfer_model_n_vocab(m);
    for (long i = 0; i < n_prompt; i++) {
        if (prompt[i] >= n_vocab) {
            fprintf(stderr, "dump_logits: token %d out of range (n_vocab %d)\n", prompt[i], n_vocab);
            rc = 2;
            goto done;
        }
    }

    minfer_session_options so;
    minfer_session_options_default(&so);
    so.logits_all = true;
    if (cache) so.cache_type = cache;
    if (n_ctx) so.n_ctx = (int32_t)n_ctx;
    if (so.n_batch < (int32_t)n_prompt) so.n_batch = (int32_t)n_prompt;
    s = minfer_session_new(m, &so, err, sizeof err);
    if (!s) {
        fprintf(stderr, "dump_logits: session: %s\n", err);
        goto done;
    }

    long n_rows = n_prompt + n_decode;
    rows = malloc((size_t)n_rows * (size_t)n_vocab * sizeof *rows);
    toks = malloc((size_t)n_rows * sizeof *toks);
    if (!rows || !toks) {
        fprintf(stderr, "dump_logits: out of memory for %ld x %d logits\n", n_rows, n_vocab);
        goto done;
    }
    memcpy(toks, prompt, (size_t)n_prompt * sizeof *toks);

    long step = chunk > 0 ? chunk : n_prompt;
    for (long p0 = 0; p0 < n_prompt; p0 += step) {
        long n = n_prompt - p0 < step ? n_prompt - p0 : step;
        if (minfer_prefill(s, prompt + p0, (int32_t)n, err, sizeof err) != 0) {
            fprintf(stderr, "dump_logits: prefill of %ld tokens at %ld: %s\n", n, p0, err);
            goto done;
        }
        for (long i = 0; i < n; i++) {
            const float *l = minfer_logits_ith(s, (int32_t)i);
            if (!l) {
                fprintf(stderr, "dump_logits: no logits for batch row %ld\n", i);
                goto done;
            }
            memcpy(rows + (size_t)(p0 + i) * (size_t)n_vocab, l, (size_t)n_vocab * sizeof *rows);
        }
    }
    for (long d = 0; d < n_decode; d++) {
        long prev = n_prompt + d - 1;
        int32_t t = argmax(rows + (size_t)prev * (size_t)n_vocab, n_vocab);
        toks[n_prompt + d] = t;
        if (minfer_decode(s, t, err, sizeof err) != 0) {
            fprintf(stderr, "dump_logits: decode step %ld (token %d): %s\n", d, t, err);
            goto done;
        }
        const float *l = minfer_logits(s);
        if (!l) {
            fprintf(stderr, "dump_logits: no logits after decode step %ld\n", d);
            goto done;
        }
        memcpy(rows + (size_t)(n_prompt + d) * (size_t)n_vocab, l, (size_t)n_vocab * sizeof *rows);
    }

    const char *backend = minfer_model_backend(m);
    if (out_prefix) {
        char path[4096];
        snprintf(path, sizeof path, "%s.bin", out_prefix);
        f = fopen(path, "wb");
        if (!f || fwrite(rows, sizeof *rows, (size_t)n_rows * (size_t)n_vocab, f) !=
                      (size_t)n_rows * (size_t)n_vocab) {
            fprintf(stderr, "dump_logits: write '%s': %s\n", path, strerror(errno));
            goto done;
        }
        fclose(f);
        snprintf(path, sizeof path, "%s.json", out_prefix);
        f = fopen(path, "w");
        if (!f) {
            fprintf(stderr, "dump_logits: write '%s': %s\n", path, strerror(errno));
            goto done;
        }
        write_json_head(f, toks, n_rows, n_vocab, n_rows, backend);
        fprintf(f, ", \"bin\": \"%s.bin\"}\n", out_prefix);
    } else {
        write_json_head(stdout, toks, n_rows, n_vocab, n_rows, backend);
        printf(", \"logits\": [");
        for (long r = 0; r < n_rows; r++) {
            printf("%s[", r ? ",\n" : "\n");
            for (int32_t j = 0; j < n_vocab; j++) {
                double x = rows[(size_t)r * (size_t)n_vocab + (size_t)j];
                /* Python's json reads NaN/Infinity, never C's "nan"/"inf" */
                if (isnan(x)) printf("%sNaN", j ? ", " : "");
                else if (isinf(x)) printf("%s%sInfinity", j ? ", " : "", x < 0 ? "-" : "");
                else printf("%s%.9g", j ? ", " : "", x);
            }
            printf("]");
        }
        printf("]}\n");
    }
    rc = 0;
done:
    if (f && fclose(f) != 0 && rc == 0) {
        fprintf(stderr, "dump_logits: close: %s\n", strerror(errno));
        rc = 1;
    }
    free(rows);
    free(toks);
    free(prompt);
    if (s) minfer_session_free(s);
    if (m) minfer_model_free(m);
    return rc;
}
