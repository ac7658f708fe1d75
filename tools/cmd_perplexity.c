/* cmd_perplexity.c - `minfer perplexity`: the standard chunked perplexity.
 *
 * The text is tokenized once (no BOS) and cut into chunks of n_ctx tokens;
 * each chunk runs in a fresh context (first token replaced by BOS when the
 * model adds one) with logits for every position, and only the second half
 * of each chunk is scored, so every scored token sees at least n_ctx/2
 * tokens of context. PPL = exp(mean NLL); the +/- is the standard error of
 * the mean NLL carried through exp (as llama-perplexity reports it).
 *
 * KL divergence against a base model (llama-perplexity's procedure): a run
 * with --kl-divergence-base FILE alone saves the base model's log-softmax of
 * every scored position; a later run with --kl-divergence and the same FILE
 * (same text, -c and chunks; another model or cache type) reports the mean
 * KL(base || this) and how often both put the same token on top. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "minfer.h"
#include "tools.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: minfer perplexity [-m MODEL] -f TEXT [options]\n"
            "Chunked perplexity of a text file: chunks of -c tokens, the second half of\n"
            "each scored; prints the running [chunk]ppl values and 'Final estimate: PPL =\n"
            "x +/- y'.\n\n"
            "  -m, --model FILE       GGUF model (default: $MINFER_MODEL or %s)\n"
            "  -f, --file FILE        text to score (needs at least -c tokens)\n"
            "  -c, --ctx-size N       chunk length (default 512)\n"
            "  -b, --batch-size N     prefill batch (default: the chunk length)\n"
            "  -t, --threads N        CPU threads (default 0: all cores)\n"
            "      --chunks N         score at most N chunks (default all)\n"
            "  -ctk, --cache-type-k T K cache type f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1\n"
            "                         (default f32; also V's unless -ctv)\n"
            "  -ctv, --cache-type-v T V cache type (default: -ctk's)\n"
            "  -fa, --flash-attn MODE on, off, auto (= on); off: unfused attention (cpu)\n"
            "  -ngl, --n-gpu-layers N -1 or >= layers: all on the GPU, 0: none\n"
            "      --kl-divergence-base FILE  save the scored positions' log-probs to FILE\n"
            "                         (or, with --kl-divergence, read them as the base)\n"
            "      --kl-divergence    compare with the base FILE: mean KLD, same top token\n",
            MF_DEFAULT_MODEL);
    fprintf(f, "      --device NAME      %s or auto (default auto)\n", minfer_build_devices());
    fprintf(f, "  -h, --help             this text\n");
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0, k;
    char *buf = malloc(cap);
    while (buf && (k = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
            }
            buf = nb;
        }
    }
    if (buf && ferror(f)) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf)
        buf[n] = 0;
    return buf;
}

/* -log softmax(logits)[target], in double. */
static double nll_of(const float *lg, int32_t n_vocab, int32_t target) {
    float mx = lg[0];
    for (int32_t i = 1; i < n_vocab; i++)
        mx = lg[i] > mx ? lg[i] : mx;
    double sum = 0;
    for (int32_t i = 0; i < n_vocab; i++)
        sum += exp((double)lg[i] - mx);
    return log(sum) - ((double)lg[target] - mx);
}

/* ---- KL divergence ------------------------------------------------------------- */

/* The base file: a 32-byte header (magic, n_vocab, n_ctx, n_chunks, a hash of
 * the scored text's tokens) and then, per scored position, the base model's
 * n_vocab log-probabilities as f32 (little-endian hosts only, like the rest
 * of the GGUF path). */
static const char kl_magic[8] = {'M', 'F', 'K', 'L', 'D', '1', 0, 0};

typedef struct kl_file_t {
    FILE *f;
    bool compare;
    int32_t n_vocab;
    double *lp;    /* this model's log-probs */
    float *base;   /* the base's, read back */
    double sum, sum2;
    int64_t n, same_top;
} kl_file_t;

static uint64_t fnv(const int32_t *t, int64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; i < n; i++) {
        h ^= (uint32_t)t[i];
        h *= 1099511628211ull;
    }
    return h;
}

static int kl_open(kl_file_t *k, const char *path, bool compare, int32_t n_vocab, int32_t n_ctx,
                   int64_t n_chunks, uint64_t hash, const char *cmd) {
    k->compare = compare;
    k->n_vocab = n_vocab;
    k->lp = malloc((size_t)n_vocab * sizeof *k->lp);
    k->base = malloc((size_t)n_vocab * sizeof *k->base);
    k->f = fopen(path, compare ? "rb" : "wb");
    if (!k->lp || !k->base || !k->f) {
        fprintf(stderr, "%s: --kl-divergence-base: cannot %s '%s'\n", cmd,
                compare ? "open" : "create", path);
        return -1;
    }
    struct {
        char magic[8];
        int32_t n_vocab, n_ctx;
        int64_t n_chunks;
        uint64_t hash;
    } h = {{0}, n_vocab, n_ctx, n_chunks, hash}, got;
    memcpy(h.magic, kl_magic, 8);
    if (!compare)
        return fwrite(&h, sizeof h, 1, k->f) == 1 ? 0 : -1;
    if (fread(&got, sizeof got, 1, k->f) != 1 || memcmp(got.magic, kl_magic, 8)) {
        fprintf(stderr, "%s: '%s' is not a minfer KL-divergence base file\n", cmd, path);
        return -1;
    }
    if (got.n_vocab != n_vocab || got.n_ctx != n_ctx || got.n_chunks != n_chunks ||
        got.hash != hash) {
        fprintf(stderr,
                "%s: '%s' was saved for another run (n_vocab %d, -c %d, %lld chunks%s); this "
                "run has n_vocab %d, -c %d, %lld chunks\n",
                cmd, path, got.n_vocab, got.n_ctx, (long long)got.n_chunks,
                got.hash != hash ? ", other text" : "", n_vocab, n_ctx, (long long)n_chunks);
        return -1;
    }
    return 0;
}

/* One scored position: write the log-probs, or compare them with the base's. */
static int kl_step(kl_file_t *k, const float *lg, const char *cmd) {
    const int32_t nv = k->n_vocab;
    float mx = lg[0];
    int32_t top = 0;
    for (int32_t i = 1; i < nv; i++)
        if (lg[i] > mx) {
            mx = lg[i];
            top = i;
        }
    double z = 0;
    for (int32_t i = 0; i < nv; i++)
        z += exp((double)lg[i] - mx);
    double lz = log(z) + mx;
    for (int32_t i = 0; i < nv; i++)
        k->lp[i] = (double)lg[i] - lz;
    if (!k->compare) {
        for (int32_t i = 0; i < nv; i++)
            k->base[i] = (float)k->lp[i];
        if (fwrite(k->base, sizeof *k->base, (size_t)nv, k->f) != (size_t)nv) {
            fprintf(stderr, "%s: --kl-divergence-base: write failed\n", cmd);
            return -1;
        }
        return 0;
    }
    if (fread(k->base, sizeof *k->base, (size_t)nv, k->f) != (size_t)nv) {
        fprintf(stderr, "%s: --kl-divergence-base: the file ends early\n", cmd);
        return -1;
    }
    double kl = 0;
    int32_t btop = 0;
    for (int32_t i = 0; i < nv; i++) {
        double pb = exp((double)k->base[i]);
        kl += pb * ((double)k->base[i] - k->lp[i]);
        if (k->base[i] > k->base[btop])
            btop = i;
    }
    if (kl < 0)
        kl = 0; /* rounding of a value that is 0 in exact arithmetic */
    k->sum += kl;
    k->sum2 += kl * kl;
    k->n++;
    k->same_top += btop == top;
    return 0;
}

static int kl_finish(kl_file_t *k, const char *cmd) {
    if (!k->compare) {
        if (fflush(k->f)) {
            fprintf(stderr, "%s: --kl-divergence-base: write failed\n", cmd);
            return -1;
        }
        fprintf(stderr, "%s: saved the base log-probs of the scored positions\n", cmd);
        return 0;
    }
    double n = (double)k->n, mean = k->sum / n, var = k->sum2 / n - mean * mean;
    double se = k->n > 1 && var > 0 ? sqrt(var / (n - 1)) : 0;
    double p = (double)k->same_top / n;
    printf("Mean KLD: %.6f +/- %.6f\n", mean, se);
    printf("Same top p: %.3f +/- %.3f %%\n", 100 * p, 100 * sqrt(p * (1 - p) / n));
    return 0;
}

static void kl_close(kl_file_t *k) {
    if (k->f)
        fclose(k->f);
    free(k->lp);
    free(k->base);
}

int mf_cmd_perplexity(int argc, char **argv) {
    const char *cmd = "perplexity";
    const char *model = NULL, *file = NULL, *ctk = NULL, *ctv = NULL, *device = "auto";
    const char *kl_file = NULL;
    bool kl_compare = false, fa_off = false;
    int32_t n_ctx = 512, n_batch = 0, n_threads = 0, ngl = -1, max_chunks = -1;
    mf_error e = {{0}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
        if (mf_arg_is_help(a)) {
            usage(stdout);
            return 0;
        }
#define VAL(flag) ((r = mf_arg_value(argc, argv, &i, flag, &v, &e)) != 0)
        if (VAL("-m") || VAL("--model") || VAL("-f") || VAL("--file") || VAL("-ctk") ||
            VAL("--cache-type-k") || VAL("-ctv") || VAL("--cache-type-v") || VAL("--device")) {
            if (r < 0)
                return mf_arg_fail(cmd, &e);
            if (!strcmp(a, "-m") || !strncmp(a, "--model", 7))
                model = v;
            else if (!strcmp(a, "-f") || !strncmp(a, "--file", 6))
                file = v;
            else if (!strcmp(a, "-ctk") || !strncmp(a, "--cache-type-k", 14))
                ctk = v;
            else if (!strcmp(a, "-ctv") || !strncmp(a, "--cache-type-v", 14))
                ctv = v;
            else
                device = v;
        } else if (VAL("-c") || VAL("--ctx-size")) {
            if (r < 0 || mf_arg_i32(a, v, 0, 1 << 24, &n_ctx, &e))
                return mf_arg_fail(cmd, &e);
            if (n_ctx == 0)
                n_ctx = 512;
        } else if (VAL("-b") || VAL("--batch-size")) {
            if (r < 0 || mf_arg_i32(a, v, 1, 1 << 24, &n_batch, &e))
                return mf_arg_fail(cmd, &e);
        } else if (VAL("-t") || VAL("--threads")) {
            if (r < 0 || mf_arg_i32(a, v, 0, 4096, &n_threads, &e))
                return mf_arg_fail(cmd, &e);
        } else if (VAL("--chunks")) {
            if (r < 0 || mf_arg_i32(a, v, -1, INT32_MAX, &max_chunks, &e))
                return mf_arg_fail(cmd, &e);
        } else if (VAL("--kl-divergence-base")) {
            if (r < 0)
                return mf_arg_fail(cmd, &e);
            kl_file = v;
        } else if (!strcmp(a, "--kl-divergence")) {
            kl_compare = true;
        } else if (VAL("-ngl") || VAL("--n-gpu-layers")) {
            if (r < 0 || mf_arg_i32(a, v, -1, INT32_MAX, &ngl, &e))
                return mf_arg_fail(cmd, &e);
        } else if (VAL("-fa") || VAL("--flash-attn")) {
            if (r < 0 || mf_parse_flash_attn(cmd, v, &fa_off, &e))
                return mf_arg_fail(cmd, &e);
        } else {
            mf_errorf(&e, "unknown option '%s' (see 'minfer perplexity --help')", a);
            return mf_arg_fail(cmd, &e);
        }
#undef VAL
    }
    if (!file) {
        mf_errorf(&e, "a text file is needed: -f FILE");
        return mf_arg_fail(cmd, &e);
    }
    if (n_ctx < 16) {
        mf_errorf(&e, "-c %d is too small (at least 16)", n_ctx);
        return mf_arg_fail(cmd, &e);
    }
    if (kl_compare && !kl_file) {
        mf_errorf(&e, "--kl-divergence needs --kl-divergence-base FILE (the saved base)");
        return mf_arg_fail(cmd, &e);
    }
    if (!model)
        model = mf_default_model();
    if (max_chunks == 0) {
        fprintf(stderr, "perplexity: --chunks 0 scores nothing (give N >= 1, or -1 for all)\n");
        return 2;
    }
    struct stat sb;
    if (stat(model, &sb) != 0) {
        fprintf(stderr, "%s: model file '%s' not found\n", cmd, model);
        return 1;
    }
    char *text = slurp(file);
    if (!text) {
        fprintf(stderr, "%s: cannot read '%s'\n", cmd, file);
        return 1;
    }

    char err[512];
    int rc = 1;
    int32_t *toks = NULL;
    kl_file_t kf = {0};
    minfer_session *s = NULL;
    minfer_model_options mo;
    minfer_model_options_default(&mo);
    mo.path = model;
    mo.n_threads = n_threads;
    mo.device = device;
    mo.n_gpu_layers = ngl;
    minfer_model *m = minfer_model_load(&mo, err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s: %s\n", cmd, err);
        goto out;
    }
    size_t len = strlen(text);
    int64_t n_tok = minfer_tokenize(m, text, len, false, false, NULL, 0);
    if (n_tok < 0) {
        fprintf(stderr, "%s: cannot tokenize '%s'\n", cmd, file);
        goto out;
    }
    toks = malloc(((size_t)n_tok + 1) * sizeof *toks);
    if (!toks || minfer_tokenize(m, text, len, false, false, toks, n_tok) != n_tok) {
        fprintf(stderr, "%s: cannot tokenize '%s'\n", cmd, file);
        goto out;
    }
    int64_t n_chunks = n_tok / n_ctx;
    if (n_chunks == 0) {
        fprintf(stderr, "%s: '%s' has %lld tokens, fewer than one chunk of %d (use a smaller -c)\n",
                cmd, file, (long long)n_tok, n_ctx);
        goto out;
    }
    if (max_chunks >= 0 && n_chunks > max_chunks)
        n_chunks = max_chunks;
    /* Whether the model wants BOS: tokenizing "" with add_special says so. */
    int32_t bos_tok = -1;
    if (minfer_tokenize(m, "", 0, true, false, &bos_tok, 1) != 1)
        bos_tok = -1;

    /* Before the session, so a mismatched base file is the only message. */
    if (kl_file && kl_open(&kf, kl_file, kl_compare, minfer_model_n_vocab(m), n_ctx, n_chunks,
                           fnv(toks, n_chunks * n_ctx), cmd))
        goto out;
    minfer_session_options so;
    minfer_session_options_default(&so);
    so.n_ctx = n_ctx;
    so.n_batch = n_batch > 0 && n_batch < n_ctx ? n_batch : n_ctx;
    so.cache_type = ctk;
    so.cache_type_v = ctv;
    so.flash_attn_off = fa_off;
    so.logits_all = true;
    s = minfer_session_new(m, &so, err, sizeof err);
    if (!s) {
        fprintf(stderr, "%s: %s\n", cmd, err);
        goto out;
    }
    const int32_t n_vocab = minfer_model_n_vocab(m), first = n_ctx / 2;

    fprintf(stderr, "%s: %lld tokens, %lld chunks of %d, scoring positions %d..%d of each\n", cmd,
            (long long)n_tok, (long long)n_chunks, n_ctx, first, n_ctx - 2);
    double nll = 0, nll2 = 0;
    int64_t count = 0;
    for (int64_t c = 0; c < n_chunks; c++) {
        int32_t *ct = toks + c * n_ctx;
        int32_t saved = ct[0];
        if (bos_tok >= 0)
            ct[0] = bos_tok;
        minfer_session_reset(s);
        for (int32_t b = 0; b < n_ctx; b += so.n_batch) {
            int32_t nb = n_ctx - b < so.n_batch ? n_ctx - b : so.n_batch;
            if (minfer_prefill(s, ct + b, nb, err, sizeof err)) {
                fprintf(stderr, "\n%s: %s\n", cmd, err);
                goto out;
            }
            /* Position p predicts token p + 1. */
            for (int32_t i = 0; i < nb; i++) {
                int32_t p = b + i;
                if (p < first || p + 1 >= n_ctx)
                    continue;
                const float *lg = minfer_logits_ith(s, i);
                if (kl_file && kl_step(&kf, lg, cmd))
                    goto out;
                double v = nll_of(lg, n_vocab, ct[p + 1]);
                nll += v;
                nll2 += v * v;
                count++;
            }
        }
        ct[0] = saved;
        printf("[%lld]%.4f,", (long long)c + 1, exp(nll / (double)count));
        fflush(stdout);
    }
    printf("\n");
    double mean = nll / (double)count, var = nll2 / (double)count - mean * mean;
    double se = count > 1 && var > 0 ? sqrt(var / (double)(count - 1)) : 0;
    double ppl = exp(mean);
    printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, se * ppl);
    if (kl_file && kl_finish(&kf, cmd))
        goto out;
    rc = 0;
out:
    kl_close(&kf);
    free(toks);
    free(text);
    minfer_session_free(s);
    minfer_model_free(m);
    return rc;
}
