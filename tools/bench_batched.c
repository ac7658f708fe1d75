/* bench_batched.c - `minfer bench -npp LIST -ntg LIST -npl LIST`: aggregate
 * throughput of many sequences decoded together, measured like
 * llama-batched-bench so the numbers compare with it.
 *
 * For each (PP, TG, B): a fresh minfer_multi of B sequences; the B prompts
 * of PP random tokens are prefilled together in forwards of at most n_batch
 * tokens (timed: T_PP, S_PP = B*PP / T_PP), then TG steps each decode one
 * token of every sequence in one forward (T_TG, S_TG = B*TG / T_TG).
 * N_KV = B*(PP+TG), T = T_PP + T_TG, S = N_KV / T. One untimed warm-up
 * forward per case builds the step's graph. With -r N every case runs N
 * times in interleaved rounds (all cases once, then all again, ...) and a
 * row reports the median T_PP and T_TG: on a shared machine the load moves
 * during a run, and only cases measured side by side compare. Uses only
 * include/minfer.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "minfer.h"
#include "tools.h"

#ifndef MINFER_BUILD_COMMIT
#define MINFER_BUILD_COMMIT "unknown"
#endif

#define BB_MAX_LIST 32

typedef struct bb_list {
    int32_t v[BB_MAX_LIST];
    int n;
} bb_list;

typedef struct bb_opts {
    const char *model, *ctk, *ctv, *device;
    bb_list pp, tg, pl;
    int32_t n_threads, n_batch, reps;
    bool json;
} bb_opts;

static void bb_usage(FILE *f) {
    fprintf(f,
            "usage: minfer bench -npp LIST -ntg LIST -npl LIST [options]\n"
            "Batched mode, like llama-batched-bench: B sequences (-npl) of PP prompt tokens\n"
            "(-npp) and TG generated tokens (-ntg) run together, prompts prefilled in\n"
            "forwards of -b tokens, then TG steps of one token per sequence. Random token\n"
            "ids; every combination of the lists runs.\n"
            "Columns: PP, TG, B, N_KV = B*(PP+TG), T_PP / S_PP (prompt seconds, t/s),\n"
            "T_TG / S_TG (generation seconds, aggregate t/s), T / S (total).\n\n"
            "  -m, --model FILE         GGUF model (default: $MINFER_MODEL or %s)\n"
            "  -npp LIST                prompt tokens per sequence (default 128)\n"
            "  -ntg LIST                generated tokens per sequence (default 128)\n"
            "  -npl LIST                sequences decoded together (default 1,2,4,8,16)\n"
            "  -t, --threads N          CPU threads (default: all cores)\n"
            "  -b, --batch-size N       tokens per prefill forward (default 2048)\n"
            "  -r, --repetitions N      run every case N times in interleaved rounds and\n"
            "                           report the median times (default 1)\n"
            "  -ctk, --cache-type-k T   K cache type f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1\n"
            "                           (default f32; also V's unless -ctv)\n"
            "  -ctv, --cache-type-v T   V cache type (default: -ctk's)\n"
            "      --device NAME        cpu, cuda, auto (default auto)\n"
            "  -o, --output FMT         md (default) or json\n"
            "  -h, --help               this text\n",
            MF_DEFAULT_MODEL);
}

static int bb_list_parse(const char *flag, const char *text, int32_t lo, int32_t hi, bb_list *l,
                         mf_error *e) {
    l->n = 0;
    const char *p = text;
    for (;;) {
        const char *comma = strchr(p, ',');
        char item[32];
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0 || len >= sizeof item)
            return mf_errorf(e, "%s: '%s' is not a comma-separated list of integers", flag, text);
        memcpy(item, p, len);
        item[len] = 0;
        if (l->n == BB_MAX_LIST)
            return mf_errorf(e, "%s: more than %d values", flag, BB_MAX_LIST);
        if (mf_arg_i32(flag, item, lo, hi, &l->v[l->n], e))
            return -1;
        l->n++;
        if (!comma)
            return 0;
        p = comma + 1;
    }
}

bool mf_bench_is_batched(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-npp") || !strcmp(argv[i], "-ntg") || !strcmp(argv[i], "-npl"))
            return true;
    return false;
}

static int bb_parse(int argc, char **argv, bb_opts *o) {
    const char *cmd = "bench";
    memset(o, 0, sizeof *o);
    o->pp = (bb_list){{128}, 1};
    o->tg = (bb_list){{128}, 1};
    o->pl = (bb_list){{1, 2, 4, 8, 16}, 5};
    o->n_batch = 2048;
    o->reps = 1;
    o->device = "auto";
    mf_error e = {{0}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
#define VAL(flag) ((r = mf_arg_value(argc, argv, &i, flag, &v, &e)) != 0)
#define OK() \
    if (r < 0) \
    return mf_arg_fail(cmd, &e)
        if (mf_arg_is_help(a)) {
            bb_usage(stdout);
            return 1;
        } else if (VAL("-m") || VAL("--model")) {
            OK();
            o->model = v;
        } else if (VAL("-npp")) {
            OK();
            if (bb_list_parse(a, v, 1, 1 << 20, &o->pp, &e))
                return mf_arg_fail(cmd, &e);
        } else if (VAL("-ntg")) {
            OK();
            if (bb_list_parse(a, v, 1, 1 << 20, &o->tg, &e))
                return mf_arg_fail(cmd, &e);
        } else if (VAL("-npl")) {
            OK();
            if (bb_list_parse(a, v, 1, 4096, &o->pl, &e))
                return mf_arg_fail(cmd, &e);
        } else if (VAL("-t") || VAL("--threads")) {
            if (r < 0 || mf_arg_i32(a, v, 0, 4096, &o->n_threads, &e))
                return mf_arg_fail(cmd, &e);
        } else if (VAL("-b") || VAL("--batch-size")) {
            if (r < 0 || mf_arg_i32(a, v, 1, 1 << 20, &o->n_batch, &e))
                return mf_arg_fail(cmd, &e);
        } else if (VAL("-r") || VAL("--repetitions")) {
            if (r < 0 || mf_arg_i32(a, v, 1, 1000, &o->reps, &e))
                return mf_arg_fail(cmd, &e);
        } else if (VAL("-ctk") || VAL("--cache-type-k")) {
            OK();
            o->ctk = v;
        } else if (VAL("-ctv") || VAL("--cache-type-v")) {
            OK();
            o->ctv = v;
        } else if (VAL("--device")) {
            OK();
            o->device = v;
        } else if (VAL("-o") || VAL("--output")) {
            OK();
            if (strcmp(v, "md") && strcmp(v, "json")) {
                mf_errorf(&e, "%s: '%s' is not md or json", a, v);
                return mf_arg_fail(cmd, &e);
            }
            o->json = !strcmp(v, "json");
        } else {
            mf_errorf(&e, "unknown option '%s' in batched mode (see 'minfer bench -npl 1 --help')",
                      a);
            return mf_arg_fail(cmd, &e);
        }
#undef VAL
#undef OK
    }
    if (!o->model)
        o->model = mf_default_model();
    return 0;
}

typedef struct bb_row {
    int32_t pp, tg, b;
    int64_t n_kv;
    double t_pp, t_tg;
} bb_row;

static int bb_cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (sorts v). */
static double bb_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bb_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t bb_rng = 0x2545F4914F6CDD1Dull;
static int32_t bb_token(int32_t n_vocab) {
    bb_rng ^= bb_rng << 13;
    bb_rng ^= bb_rng >> 7;
    bb_rng ^= bb_rng << 17;
    return (int32_t)(bb_rng % (uint64_t)n_vocab);
}

/* One case; 0 ok, -1 failed (message printed). */
static int bb_case(minfer_model *m, const bb_opts *o, bb_row *row) {
    char err[512];
    const int32_t B = row->b, PP = row->pp, TG = row->tg, V = minfer_model_n_vocab(m);
    minfer_multi_options mo;
    minfer_multi_options_default(&mo);
    mo.n_ctx = PP + TG;
    mo.n_seq_max = B;
    mo.n_batch = o->n_batch > B ? o->n_batch : B;
    mo.cache_type = o->ctk;
    mo.cache_type_v = o->ctv;
    mo.prompt_cache = false;
    minfer_multi *mm = minfer_multi_new(m, &mo, err, sizeof err);
    if (!mm) {
        fprintf(stderr, "bench: PP %d TG %d B %d: %s\n", PP, TG, B, err);
        return -1;
    }
    const int32_t nb = mo.n_batch;
    int32_t *tok = malloc((size_t)nb * sizeof *tok), *seq = malloc((size_t)nb * sizeof *seq),
            *pos = malloc((size_t)nb * sizeof *pos), *sid = malloc((size_t)B * sizeof *sid);
    bool *lg = malloc((size_t)nb * sizeof *lg);
    int rc = -1;
    /* warm-up: one step of B single tokens, then fresh sequences */
    for (int32_t s = 0; s < B; s++) {
        sid[s] = minfer_seq_new(mm, err, sizeof err);
        tok[s] = bb_token(V);
        seq[s] = sid[s];
        pos[s] = 0;
        lg[s] = true;
    }
    minfer_batch wb = {.n_tokens = B, .token = tok, .seq_id = seq, .pos = pos, .logits = lg};
    if (minfer_multi_decode(mm, &wb, err, sizeof err))
        goto fail;
    for (int32_t s = 0; s < B; s++) {
        minfer_seq_remove(mm, sid[s], err, sizeof err);
        sid[s] = minfer_seq_new(mm, err, sizeof err);
    }
    /* prompts: sequence after sequence, in forwards of nb tokens */
    uint64_t t0 = mf_time_ns();
    int64_t total = (int64_t)B * PP, done = 0;
    while (done < total) {
        int32_t n = 0;
        for (; n < nb && done < total; n++, done++) {
            const int32_t s = (int32_t)(done / PP), p = (int32_t)(done % PP);
            tok[n] = bb_token(V);
            seq[n] = sid[s];
            pos[n] = p;
            lg[n] = p == PP - 1;
        }
        minfer_batch b = {.n_tokens = n, .token = tok, .seq_id = seq, .pos = pos, .logits = lg};
        if (minfer_multi_decode(mm, &b, err, sizeof err))
            goto fail;
    }
    row->t_pp = (double)(mf_time_ns() - t0) / 1e9;
    uint64_t t1 = mf_time_ns();
    for (int32_t t = 0; t < TG; t++) {
        for (int32_t s = 0; s < B; s++) {
            tok[s] = bb_token(V);
            seq[s] = sid[s];
            pos[s] = PP + t;
            lg[s] = true;
        }
        minfer_batch b = {.n_tokens = B, .token = tok, .seq_id = seq, .pos = pos, .logits = lg};
        if (minfer_multi_decode(mm, &b, err, sizeof err))
            goto fail;
    }
    row->t_tg = (double)(mf_time_ns() - t1) / 1e9;
    row->n_kv = (int64_t)B * (PP + TG);
    rc = 0;
fail:
    if (rc)
        fprintf(stderr, "bench: PP %d TG %d B %d: %s\n", PP, TG, B, err);
    free(tok);
    free(seq);
    free(pos);
    free(sid);
    free(lg);
    minfer_multi_free(mm);
    return rc;
}

int mf_cmd_bench_batched(int argc, char **argv) {
    bb_opts o;
    int rc = bb_parse(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    struct stat sb;
    if (stat(o.model, &sb) != 0) {
        fprintf(stderr, "bench: model file '%s' not found\n", o.model);
        return 1;
    }
    minfer_log_set_level(MINFER_LOG_ERROR);
    char err[512];
    minfer_model_options mo;
    minfer_model_options_default(&mo);
    mo.path = o.model;
    mo.n_threads = o.n_threads;
    mo.device = o.device;
    minfer_model *m = minfer_model_load(&mo, err, sizeof err);
    if (!m) {
        fprintf(stderr, "bench: %s\n", err);
        return 1;
    }
    int n_out = 0, failed = 0;
    const int n_case = o.pp.n * o.tg.n * o.pl.n;
    double *t_pp = calloc((size_t)n_case * (size_t)o.reps, sizeof *t_pp);
    double *t_tg = calloc((size_t)n_case * (size_t)o.reps, sizeof *t_tg);
    bool *bad = calloc((size_t)n_case, sizeof *bad);
    for (int rep = 0; rep < o.reps; rep++)
        for (int c = 0; c < n_case; c++) {
            const int j = c % o.pl.n, k = c / o.pl.n % o.tg.n, i = c / (o.pl.n * o.tg.n);
            bb_row r = {.pp = o.pp.v[i], .tg = o.tg.v[k], .b = o.pl.v[j]};
            if (bad[c])
                continue;
            if (bb_case(m, &o, &r)) {
                failed = 1;
                bad[c] = true;
                continue;
            }
            t_pp[(size_t)c * o.reps + rep] = r.t_pp;
            t_tg[(size_t)c * o.reps + rep] = r.t_tg;
            if (rep < o.reps - 1)
                continue;
            r.t_pp = bb_median(t_pp + (size_t)c * o.reps, o.reps);
            r.t_tg = bb_median(t_tg + (size_t)c * o.reps, o.reps);
            const double s_pp = (double)r.b * r.pp / r.t_pp, s_tg = (double)r.b * r.tg / r.t_tg,
                         t = r.t_pp + r.t_tg, s = (double)r.n_kv / t;
            if (n_out == 0 && !o.json) /* the head with the first row: a failed run prints none */
                printf("model: %s (%s), backend %s, n_batch %d, commit %s\n\n"
                       "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |\n"
                       "|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|\n",
                       o.model, minfer_model_desc(m), minfer_model_backend(m), o.n_batch,
                       MINFER_BUILD_COMMIT);
            if (n_out == 0 && o.json)
                printf("[");
            if (o.json)
                printf("%s\n  {\"pp\": %d, \"tg\": %d, \"pl\": %d, \"n_kv\": %lld, \"t_pp\": %.6f, "
                       "\"speed_pp\": %.3f, \"t_tg\": %.6f, \"speed_tg\": %.3f, \"t\": %.6f, "
                       "\"speed\": %.3f, \"model\": \"%s\", \"backend\": \"%s\", \"commit\": \"%s\"}",
                       n_out ? "," : "", r.pp, r.tg, r.b, (long long)r.n_kv, r.t_pp, s_pp, r.t_tg,
                       s_tg, t, s, minfer_model_desc(m), minfer_model_backend(m), MINFER_BUILD_COMMIT);
            else
                printf("| %5d | %6d | %4d | %6lld | %8.3f | %8.2f | %8.3f | %8.2f | %8.3f | %8.2f |\n",
                       r.pp, r.tg, r.b, (long long)r.n_kv, r.t_pp, s_pp, r.t_tg, s_tg, t, s);
            fflush(stdout);
            n_out++;
        }
    if (o.json && n_out)
        printf("\n]\n");
    free(t_pp);
    free(t_tg);
    free(bad);
    minfer_model_free(m);
    return failed;
}
