/* cmd_bench.c - `minfer bench`: prompt-processing (pp) and generation (tg)
 * throughput, measured like llama-bench so the numbers compare with it.
 *
 * Method: random token ids in [0, n_vocab) go straight to minfer_prefill /
 * minfer_decode, so tokenization and sampling are not timed. Each test gets
 * its own session (n_ctx = depth + tokens); each repetition starts from an
 * empty context (minfer_session_reset), first fills `depth` tokens untimed,
 * then times either one prefill of p tokens (pp, t/s = p / time) or n
 * single-token decodes (tg, t/s = n / time). One untimed warm-up repetition
 * per test builds and caches the graphs of both shapes. Uses only
 * include/minfer.h for the engine. */
#include <inttypes.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "membw.h"
#include "minfer.h"
#include "runtime/levers.h"
#include "tools.h"

#ifndef MINFER_BUILD_COMMIT
#define MINFER_BUILD_COMMIT "unknown"
#endif

#define MAX_LIST 32
#define MEMBW_BYTES (1ull << 30)
#define MEMBW_PASSES 4
#define MEMBW_TRIALS 3

/* ---- options ---------------------------------------------------------------------- */

typedef struct int_list {
    int32_t v[MAX_LIST];
    int n;
} int_list;

typedef enum out_fmt { OUT_MD, OUT_CSV, OUT_JSON, OUT_JSONL } out_fmt;

typedef struct bench_opts {
    const char *model, *ctk, *ctv, *device;
    int_list p, n, t, d;
    int_list pg_p, pg_n; /* -pg PP,TG pairs */
    int32_t reps, n_batch, n_ubatch, ngl;
    out_fmt fmt;
    bool json, membw;    /* json: any machine format (the md table stays off stdout) */
    bool fa_off;         /* -fa 0: unfused attention */
} bench_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: minfer bench -m MODEL [options]\n"
            "Prompt processing (pp: one prefill of P tokens) and text generation (tg: N\n"
            "single-token decodes) throughput on random token ids, like llama-bench. Lists\n"
            "(-p 128,512) run every combination.\n\n"
            "  -m, --model FILE         GGUF model (default: $MINFER_MODEL or %s)\n"
            "  -p, --n-prompt LIST      prompt lengths (default 512; 0: no pp test)\n"
            "  -n, --n-gen LIST         generated tokens (default 128; 0: no tg test)\n"
            "  -d, --n-depth LIST       tokens already in the context, filled untimed "
            "(default 0)\n"
            "  -t, --threads LIST       CPU threads (default: all cores)\n"
            "  -r, --repetitions N      timed runs per test, after one warm-up (default 5)\n"
            "  -pg PP,TG                a prefill of PP then TG decodes, timed together\n"
            "                           (t/s over PP+TG tokens; repeatable)\n"
            "  -b, --batch-size N       prefill batch (default 512)\n"
            "  -ub, --ubatch-size N     physical batch: tokens per forward (default: -b)\n"
            "  -ctk, --cache-type-k T   K cache type f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1\n"
            "                           (default f32; also V's unless -ctv)\n"
            "  -ctv, --cache-type-v T   V cache type (default: -ctk's)\n"
            "  -ngl, --n-gpu-layers N   -1 or N >= layers: all on the GPU, 0: none\n"
            "  -fa, --flash-attn LIST   1/on/auto fused attention, 0/off unfused (cpu);\n"
            "                           one mode per invocation\n",
            MF_DEFAULT_MODEL);
    fprintf(f, "      --device NAME        %s or auto (default auto)\n", minfer_build_devices());
    fprintf(f,
            "  -o, --output FMT         md (default), csv, json or jsonl\n"
            "      --membw              measure memory read bandwidth per thread count and "
            "add\n"
            "                           '%% of membw' to tg rows\n"
            "  -h, --help               this text\n"
            "Batched mode (many sequences together, like llama-batched-bench): any of\n"
            "-npp, -ntg, -npl; see 'minfer bench -npl 1 --help'.\n");
}

/* Parses "1,2,3" into l (each value in [lo, hi]). */
static int parse_list(const char *flag, const char *text, int32_t lo, int32_t hi, int_list *l,
                      mf_error *err) {
    l->n = 0;
    const char *s = text;
    for (;;) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        char item[32];
        if (len == 0 || len >= sizeof item)
            return mf_errorf(err, "%s: '%s' is not a comma-separated list of integers", flag,
                             text);
        if (l->n == MAX_LIST)
            return mf_errorf(err, "%s: more than %d values in '%s'", flag, MAX_LIST, text);
        memcpy(item, s, len);
        item[len] = 0;
        if (mf_arg_i32(flag, item, lo, hi, &l->v[l->n], err))
            return -1;
        l->n++;
        if (!comma)
            return 0;
        s = comma + 1;
    }
}

/* Returns 0 ok, 1 help printed, 2 bad usage (message printed). */
static int parse(int argc, char **argv, bench_opts *o) {
    memset(o, 0, sizeof *o);
    o->p = (int_list){{512}, 1};
    o->n = (int_list){{128}, 1};
    o->d = (int_list){{0}, 1};
    o->t = (int_list){{0}, 1};
    o->reps = 5;
    o->n_batch = 512;
    o->ngl = -1;
    o->device = "auto";
    mf_error e = {{0}};
    int fa_seen = 0; /* bit 0: on given, bit 1: off given */
    const char *fmt = "md";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
#define VAL(flag) ((r = mf_arg_value(argc, argv, &i, flag, &v, &e)) != 0)
#define LIST(field, lo, hi)                                                                     \
    do {                                                                                        \
        if (r < 0 || parse_list(a, v, lo, hi, &field, &e))                                      \
            return mf_arg_fail("bench", &e);                                                    \
    } while (0)
        if (mf_arg_is_help(a)) {
            usage(stdout);
            return 1;
        } else if (VAL("-m") || VAL("--model")) {
            if (r < 0)
                return mf_arg_fail("bench", &e);
            o->model = v;
        } else if (VAL("-p") || VAL("--n-prompt")) {
            LIST(o->p, 0, 1 << 20);
        } else if (VAL("-n") || VAL("--n-gen")) {
            LIST(o->n, 0, 1 << 20);
        } else if (VAL("-d") || VAL("--n-depth")) {
            LIST(o->d, 0, 1 << 22);
        } else if (VAL("-t") || VAL("--threads")) {
            LIST(o->t, 0, 4096);
        } else if (VAL("-r") || VAL("--repetitions")) {
            if (r < 0 || mf_arg_i32(a, v, 1, 100000, &o->reps, &e))
                return mf_arg_fail("bench", &e);
        } else if (VAL("-b") || VAL("--batch-size")) {
            if (r < 0 || mf_arg_i32(a, v, 1, 1 << 20, &o->n_batch, &e))
                return mf_arg_fail("bench", &e);
        } else if (VAL("-ub") || VAL("--ubatch-size")) {
            if (r < 0 || mf_arg_i32(a, v, 1, 1 << 20, &o->n_ubatch, &e))
                return mf_arg_fail("bench", &e);
        } else if (VAL("-ngl") || VAL("--n-gpu-layers")) {
            if (r < 0 || mf_arg_i32(a, v, -1, INT32_MAX, &o->ngl, &e))
                return mf_arg_fail("bench", &e);
        } else if (VAL("-fa") || VAL("--flash-attn")) {
            if (r < 0)
                return mf_arg_fail("bench", &e);
            char item[32];
            for (const char *q = v;;) { /* llama-bench takes a list: -fa 0,1 */
                size_t len = strcspn(q, ",");
                snprintf(item, sizeof item, "%.*s", (int)(len < 31 ? len : 31), q);
                if (mf_parse_flash_attn("bench", item, &o->fa_off, &e))
                    return mf_arg_fail("bench", &e);
                fa_seen |= o->fa_off ? 2 : 1;
                if (!q[len])
                    break;
                q += len + 1;
            }
        } else if (VAL("-pg")) {
            int_list pair;
            if (r < 0 || parse_list(a, v, 1, 1 << 20, &pair, &e))
                return mf_arg_fail("bench", &e);
            if (pair.n != 2) {
                mf_errorf(&e, "-pg: '%s' is not PP,TG (two positive integers)", v);
                return mf_arg_fail("bench", &e);
            }
            if (o->pg_p.n == MAX_LIST) {
                mf_errorf(&e, "-pg: more than %d pairs", MAX_LIST);
                return mf_arg_fail("bench", &e);
            }
            o->pg_p.v[o->pg_p.n++] = pair.v[0];
            o->pg_n.v[o->pg_n.n++] = pair.v[1];
        } else if (VAL("-ctv") || VAL("--cache-type-v")) {
            if (r < 0)
                return mf_arg_fail("bench", &e);
            o->ctv = v;
        } else if (VAL("-ctk") || VAL("--cache-type-k")) {
            if (r < 0)
                return mf_arg_fail("bench", &e);
            o->ctk = v;
        } else if (VAL("--device")) {
            if (r < 0)
                return mf_arg_fail("bench", &e);
            if (strcmp(v, "auto") && !minfer_build_has_device(v)) {
                mf_errorf(&e, "--device: '%s' is not a device of this build (%s) or auto", v,
                          minfer_build_devices());
                return mf_arg_fail("bench", &e);
            }
            o->device = v;
        } else if (VAL("-o") || VAL("--output")) {
            if (r < 0)
                return mf_arg_fail("bench", &e);
            if (strcmp(v, "md") && strcmp(v, "json") && strcmp(v, "csv") && strcmp(v, "jsonl")) {
                mf_errorf(&e, "--output: '%s' is not md, csv, json or jsonl", v);
                return mf_arg_fail("bench", &e);
            }
            fmt = v;
        } else if (!strcmp(a, "--membw")) {
            o->membw = true;
        } else {
            mf_errorf(&e, "unknown option '%s' (see 'minfer bench --help')", a);
            return mf_arg_fail("bench", &e);
        }
#undef VAL
#undef LIST
    }
    o->fmt = !strcmp(fmt, "json") ? OUT_JSON : !strcmp(fmt, "jsonl") ? OUT_JSONL
           : !strcmp(fmt, "csv") ? OUT_CSV : OUT_MD;
    o->json = o->fmt != OUT_MD;
    if (fa_seen == 3) {
        mf_errorf(&e, "-fa: both on and off given; one attention mode per invocation");
        return mf_arg_fail("bench", &e);
    }
    bool any = o->pg_p.n > 0;
    for (int i = 0; i < o->p.n; i++)
        any |= o->p.v[i] > 0;
    for (int i = 0; i < o->n.n; i++)
        any |= o->n.v[i] > 0;
    if (!any) {
        mf_errorf(&e, "nothing to run: every -p and -n value is 0");
        return mf_arg_fail("bench", &e);
    }
    /* 0 means all cores; resolved here so the table shows the count used. */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    for (int i = 0; i < o->t.n; i++)
        if (o->t.v[i] == 0)
            o->t.v[i] = ncpu > 0 ? (int32_t)ncpu : 1;
    if (!o->model)
        o->model = mf_default_model();
    return 0;
}

/* ---- measurement ------------------------------------------------------------------ */

typedef struct bench_test {
    bool tg;              /* false: pp */
    int32_t n_tokens;     /* p for pp, n for tg; pg: the sum */
    int32_t pg_p, pg_n;   /* -pg: a prefill of pg_p then pg_n decodes (pg_n > 0) */
    int32_t depth, threads;
    char name[48];        /* "pp512", "tg128 @ d4096" */
    char time_iso[32];    /* start of the test, UTC */
    double *ns;           /* reps samples */
} bench_test;

typedef struct sample_stats {
    double avg_ns, sd_ns, avg_ts, sd_ts;
} sample_stats;

static double mean_of(const double *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++)
        s += x[i];
    return s / n;
}

/* Sample standard deviation (n - 1); 0 for a single sample. */
static double sd_of(const double *x, int n) {
    if (n < 2)
        return 0;
    double m = mean_of(x, n), s = 0;
    for (int i = 0; i < n; i++)
        s += (x[i] - m) * (x[i] - m);
    return sqrt(s / (n - 1));
}

/* Throughput is averaged per sample (as llama-bench does), not derived from the
 * mean time: the two differ when the samples spread. */
static sample_stats stats_of(const bench_test *t, int reps, double *ts) {
    for (int i = 0; i < reps; i++)
        ts[i] = 1e9 * t->n_tokens / t->ns[i];
    return (sample_stats){mean_of(t->ns, reps), sd_of(t->ns, reps), mean_of(ts, reps),
                          sd_of(ts, reps)};
}

/* xorshift64*: a fixed stream, so two runs feed the same ids. */
static uint32_t next_token(uint64_t *state, int32_t n_vocab) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return (uint32_t)((x * 0x2545F4914F6CDD1Dull) >> 33) % (uint32_t)n_vocab;
}

static void fill_tokens(int32_t *tok, int32_t n, uint64_t *state, int32_t n_vocab) {
    for (int32_t i = 0; i < n; i++)
        tok[i] = (int32_t)next_token(state, n_vocab);
}

/* One repetition: reset, untimed depth fill, then the timed part. Returns the
 * timed nanoseconds, or -1 with err set. */
static double run_once(minfer_session *s, const bench_test *t, int32_t n_vocab, int32_t *tok,
                       uint64_t seed, char *err, size_t errlen) {
    uint64_t state = seed;
    minfer_session_reset(s);
    if (t->depth > 0) {
        fill_tokens(tok, t->depth, &state, n_vocab);
        if (minfer_prefill(s, tok, t->depth, err, errlen))
            return -1;
    }
    fill_tokens(tok, t->n_tokens, &state, n_vocab);
    uint64_t t0 = mf_time_ns();
    if (t->pg_n > 0) {
        if (minfer_prefill(s, tok, t->pg_p, err, errlen))
            return -1;
        for (int32_t i = 0; i < t->pg_n; i++)
            if (minfer_decode(s, tok[t->pg_p + i], err, errlen))
                return -1;
    } else if (!t->tg) {
        if (minfer_prefill(s, tok, t->n_tokens, err, errlen))
            return -1;
    } else {
        for (int32_t i = 0; i < t->n_tokens; i++)
            if (minfer_decode(s, tok[i], err, errlen))
                return -1;
    }
    uint64_t dt = mf_time_ns() - t0;
    return (double)(dt ? dt : 1);
}

/* Warm-up plus reps timed runs of one test in a session of its own. Returns 0,
 * or 1 with the error printed. */
static int run_test(minfer_model *m, const bench_opts *o, bench_test *t) {
    char err[512];
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    strftime(t->time_iso, sizeof t->time_iso, "%Y-%m-%dT%H:%M:%SZ", &tmv);

    minfer_session_options so;
    minfer_session_options_default(&so);
    so.n_ctx = t->depth + t->n_tokens;
    so.n_batch = o->n_ubatch && o->n_ubatch < o->n_batch ? o->n_ubatch : o->n_batch;
    so.cache_type = o->ctk;
    so.cache_type_v = o->ctv;
    so.flash_attn_off = o->fa_off;
    minfer_session *s = minfer_session_new(m, &so, err, sizeof err);
    if (!s) {
        fprintf(stderr, "bench: %s: %s\n", t->name, err);
        return 1;
    }
    const int32_t n_vocab = minfer_model_n_vocab(m);
    int32_t *tok = malloc(sizeof *tok * (size_t)(t->depth > t->n_tokens ? t->depth : t->n_tokens));
    int rc = 1;
    if (!tok) {
        fprintf(stderr, "bench: %s: out of memory for %d token ids\n", t->name, t->depth);
        goto out;
    }
    for (int r = -1; r < o->reps; r++) { /* r == -1: the warm-up */
        double ns = run_once(s, t, n_vocab, tok, 0x9E3779B97F4A7C15ull + (uint64_t)(r + 1),
                             err, sizeof err);
        if (ns < 0) {
            fprintf(stderr, "bench: %s: %s\n", t->name, err);
            goto out;
        }
        if (r >= 0)
            t->ns[r] = ns;
    }
    rc = 0;
out:
    free(tok);
    minfer_session_free(s);
    return rc;
}

/* Runs the bandwidth probe in a child process, so its 1 GiB buffer does not
 * show in the peak RSS this command reports for the model. Falls back to
 * measuring in this process when fork is unavailable. */
static int measure_membw(int n_threads, mf_membw_result *res, mf_error *err) {
    struct {
        int rc;
        mf_membw_result r;
        mf_error e;
    } msg;
    int fd[2];
    if (pipe(fd) != 0)
        return mf_membw_measure(n_threads, MEMBW_BYTES, MEMBW_PASSES, MEMBW_TRIALS, res, err);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return mf_membw_measure(n_threads, MEMBW_BYTES, MEMBW_PASSES, MEMBW_TRIALS, res, err);
    }
    if (pid == 0) {
        close(fd[0]);
        memset(&msg, 0, sizeof msg);
        msg.rc = mf_membw_measure(n_threads, MEMBW_BYTES, MEMBW_PASSES, MEMBW_TRIALS, &msg.r,
                                  &msg.e);
        ssize_t w = write(fd[1], &msg, sizeof msg);
        _exit(w == (ssize_t)sizeof msg ? 0 : 1);
    }
    close(fd[1]);
    size_t got = 0;
    while (got < sizeof msg) {
        ssize_t k = read(fd[0], (char *)&msg + got, sizeof msg - got);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (got != sizeof msg)
        return mf_errorf(err, "membw: the probe process (%d threads) ended without a result",
                         n_threads);
    if (msg.rc) {
        *err = msg.e;
        return -1;
    }
    *res = msg.r;
    return 0;
}

/* ---- output ----------------------------------------------------------------------- */

static uint64_t peak_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (uint64_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
}

static void cpu_info(char *out, size_t cap) {
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10))
            continue;
        const char *c = strchr(line, ':');
        if (!c)
            break;
        c++;
        while (*c == ' ' || *c == '\t')
            c++;
        size_t len = strcspn(c, "\n");
        snprintf(out, cap, "%.*s", (int)len, c);
        break;
    }
    fclose(f);
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

static void upper(char *out, size_t cap, const char *s) {
    size_t i = 0;
    for (; s[i] && i + 1 < cap; i++)
        out[i] = (s[i] >= 'a' && s[i] <= 'z') ? (char)(s[i] - 'a' + 'A') : s[i];
    out[i] = 0;
}

static void fmt_size(char *out, size_t cap, uint64_t bytes) {
    if (bytes >= (1ull << 30))
        snprintf(out, cap, "%.2f GiB", (double)bytes / (1024.0 * 1024.0 * 1024.0));
    else
        snprintf(out, cap, "%.2f MiB", (double)bytes / (1024.0 * 1024.0));
}

static void fmt_params(char *out, size_t cap, int64_t n) {
    if (n >= 1000000000)
        snprintf(out, cap, "%.2f B", (double)n / 1e9);
    else if (n >= 1000000)
        snprintf(out, cap, "%.2f M", (double)n / 1e6);
    else
        snprintf(out, cap, "%.2f K", (double)n / 1e3);
}

typedef struct bench_ctx {
    const bench_opts *o;
    char cpu[256];
    double membw[MAX_LIST]; /* GB/s per -t entry; 0: not measured */
    int n_rows;
} bench_ctx;

static void md_header(const bench_ctx *c) {
    const bench_opts *o = c->o;
    printf("| model | size | params | backend | threads |%s%s%s%s test | t/s | GB/s |%s\n",
           o->n_batch != 512 ? " n_batch |" : "", o->ctk ? " type_k |" : "", o->ctv ? " type_v |" : "",
           o->fa_off ? " fa |" : "", o->membw ? " % of membw |" : "");
    printf("| --- | ---: | ---: | --- | ---: |%s%s%s%s --- | ---: | ---: |%s\n",
           o->n_batch != 512 ? " ---: |" : "", o->ctk ? " --- |" : "", o->ctv ? " --- |" : "",
           o->fa_off ? " ---: |" : "", o->membw ? " ---: |" : "");
}

static void md_row(const bench_ctx *c, const minfer_model *m, const bench_test *t,
                   const sample_stats *st, double membw) {
    const bench_opts *o = c->o;
    char size[32], params[32], be[32], extra[64] = "";
    fmt_size(size, sizeof size, minfer_model_size(m));
    fmt_params(params, sizeof params, minfer_model_n_params(m));
    upper(be, sizeof be, minfer_model_backend(m));
    if (o->n_batch != 512)
        snprintf(extra, sizeof extra, " %d |", o->n_batch);
    if (o->ctk)
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), " %s |", o->ctk);
    if (o->ctv)
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), " %s |", o->ctv);
    if (o->fa_off)
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), " 0 |");
    printf("| %s | %s | %s | %s | %d |%s %s | %.2f ± %.2f |", minfer_model_desc(m), size, params,
           be, t->threads, extra, t->name, st->avg_ts, st->sd_ts);
    if (t->tg) {
        double gbs = (double)minfer_model_size(m) * st->avg_ts / 1e9;
        printf(" %.2f |", gbs);
        /* The probe measures host memory: a GPU's weights stream from its own. */
        if (o->membw && strcmp(minfer_model_backend(m), "cpu"))
            printf(" - |");
        else if (o->membw)
            printf(" %.1f%% |", membw > 0 ? 100.0 * gbs / membw : 0.0);
    } else {
        printf("  |%s", o->membw ? "  |" : "");
    }
    printf("\n");
    fflush(stdout);
}

static void json_nums(FILE *f, const double *x, int n, bool integer) {
    fputc('[', f);
    for (int i = 0; i < n; i++)
        fprintf(f, integer ? "%s%.0f" : "%s%.6f", i ? ", " : "", x[i]);
    fputc(']', f);
}

/* One result as (key, JSON value) pairs, in llama-bench's field order, so the
 * json, jsonl and csv outputs carry the same fields. */
typedef struct field {
    const char *key;
    char *val;
} field;

#define MAX_FIELDS 40

static int add_field(field *fs, int n, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int add_field(field *fs, int n, const char *key, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *v = NULL;
    if (vasprintf(&v, fmt, ap) < 0)
        v = NULL;
    va_end(ap);
    fs[n] = (field){key, v};
    return n + 1;
}

static char *json_text(const char *s) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    json_str(f, s);
    fclose(f);
    return buf;
}

static char *json_nums_text(const double *x, int n, bool integer) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    json_nums(f, x, n, integer);
    fclose(f);
    return buf;
}

static int result_fields(const bench_ctx *c, const minfer_model *m, const bench_test *t,
                         const sample_stats *st, const double *ts, double membw, field *fs) {
    const bench_opts *o = c->o;
    char be[32];
    upper(be, sizeof be, minfer_model_backend(m));
    const char *ct = o->ctk ? o->ctk : "f32", *cv = o->ctv ? o->ctv : ct;
    char *q;
    int n = 0;
#define STR(k, s) (q = json_text(s), n = add_field(fs, n, k, "%s", q ? q : "\"\""), free(q))
    STR("build_commit", MINFER_BUILD_COMMIT);
    n = add_field(fs, n, "build_number", "0");
    STR("cpu_info", c->cpu);
    STR("gpu_info", minfer_model_device_desc(m));
    STR("backends", be);
    STR("model_filename", o->model);
    STR("model_type", minfer_model_desc(m));
    n = add_field(fs, n, "model_size", "%" PRIu64, minfer_model_size(m));
    n = add_field(fs, n, "model_n_params", "%" PRId64, minfer_model_n_params(m));
    n = add_field(fs, n, "n_batch", "%d", o->n_batch);
    n = add_field(fs, n, "n_ubatch", "%d",
                  o->n_ubatch && o->n_ubatch < o->n_batch ? o->n_ubatch : o->n_batch);
    n = add_field(fs, n, "n_threads", "%d", t->threads);
    STR("type_k", ct);
    STR("type_v", cv);
    /* The all-weights gate makes participation all or nothing: the layer
     * count when the GPU runs the model, else 0. */
    n = add_field(fs, n, "n_gpu_layers", "%d",
                  strcmp(minfer_model_backend(m), "cpu") ? minfer_model_n_layers(m) : 0);
    n = add_field(fs, n, "flash_attn", "%s", o->fa_off ? "false" : "true");
    n = add_field(fs, n, "use_mmap", "%s", mf_lever_flag("MINFER_NO_MMAP") ? "false" : "true");
    n = add_field(fs, n, "embeddings", "false");
    n = add_field(fs, n, "n_prompt", "%d", t->pg_n ? t->pg_p : t->tg ? 0 : t->n_tokens);
    n = add_field(fs, n, "n_gen", "%d", t->pg_n ? t->pg_n : t->tg ? t->n_tokens : 0);
    n = add_field(fs, n, "n_depth", "%d", t->depth);
    STR("test_time", t->time_iso);
    n = add_field(fs, n, "avg_ns", "%.0f", st->avg_ns);
    n = add_field(fs, n, "stddev_ns", "%.0f", st->sd_ns);
    n = add_field(fs, n, "avg_ts", "%.6f", st->avg_ts);
    n = add_field(fs, n, "stddev_ts", "%.6f", st->sd_ts);
    q = json_nums_text(t->ns, o->reps, true);
    n = add_field(fs, n, "samples_ns", "%s", q ? q : "[]");
    free(q);
    q = json_nums_text(ts, o->reps, false);
    n = add_field(fs, n, "samples_ts", "%s", q ? q : "[]");
    free(q);
    /* csv has one header for every row: the optional fields stay, empty */
    const bool csv = o->fmt == OUT_CSV;
    if (t->tg)
        n = add_field(fs, n, "weights_gbps", "%.6f",
                      (double)minfer_model_size(m) * st->avg_ts / 1e9);
    else if (csv)
        n = add_field(fs, n, "weights_gbps", "%s", "");
    if (membw > 0)
        n = add_field(fs, n, "membw_gbps", "%.6f", membw);
    else if (csv && o->membw)
        n = add_field(fs, n, "membw_gbps", "%s", "");
    n = add_field(fs, n, "peak_rss_bytes", "%" PRIu64, peak_rss_bytes());
#undef STR
    return n;
}

/* CSV cell of a JSON value: strings unquoted from JSON and re-quoted for CSV
 * (doubled quotes), arrays as one quoted cell. */
static void csv_cell(FILE *f, const char *v) {
    if (v[0] != '"' && v[0] != '[') {
        fputs(v, f);
        return;
    }
    fputc('"', f);
    size_t n = strlen(v);
    const char *p = v, *end = v + n;
    if (v[0] == '"') {
        p++;
        end--;
    }
    for (; p < end; p++) {
        if (v[0] == '"' && *p == '\\' && p + 1 < end) /* undo the JSON escape */
            p++;
        if (*p == '"')
            fputc('"', f);
        fputc(*p, f);
    }
    fputc('"', f);
}

static void machine_row(bench_ctx *c, const minfer_model *m, const bench_test *t,
                        const sample_stats *st, const double *ts, double membw) {
    field fs[MAX_FIELDS];
    int n = result_fields(c, m, t, st, ts, membw, fs);
    FILE *f = stdout;
    const out_fmt fmt = c->o->fmt;
    if (fmt == OUT_CSV) {
        if (c->n_rows == 0)
            for (int i = 0; i < n; i++)
                fprintf(f, "%s%s", fs[i].key, i + 1 < n ? "," : "\n");
        for (int i = 0; i < n; i++) {
            csv_cell(f, fs[i].val ? fs[i].val : "");
            fputs(i + 1 < n ? "," : "\n", f);
        }
    } else if (fmt == OUT_JSONL) {
        fputc('{', f);
        for (int i = 0; i < n; i++)
            fprintf(f, "%s\"%s\": %s", i ? ", " : "", fs[i].key, fs[i].val ? fs[i].val : "null");
        fputs("}\n", f);
    } else {
        fprintf(f, "%s  {\n", c->n_rows ? ",\n" : "[\n");
        for (int i = 0; i < n; i++)
            fprintf(f, "    \"%s\": %s%s\n", fs[i].key, fs[i].val ? fs[i].val : "null",
                    i + 1 < n ? "," : "");
        fputs("  }", f);
    }
    for (int i = 0; i < n; i++)
        free(fs[i].val);
    fflush(f);
}

/* ---- command ------------------------------------------------------------------------ */

/* Loads the model with n_threads; prints the error and returns NULL on failure. */
static minfer_model *load_model(const bench_opts *o, int32_t n_threads) {
    char err[512];
    minfer_model_options mo;
    minfer_model_options_default(&mo);
    mo.path = o->model;
    mo.n_threads = n_threads;
    mo.device = o->device;
    mo.n_gpu_layers = o->ngl;
    minfer_model *m = minfer_model_load(&mo, err, sizeof err);
    if (!m)
        fprintf(stderr, "bench: %s\n", err);
    return m;
}

int mf_cmd_bench(int argc, char **argv) {
    if (mf_bench_is_batched(argc, argv))
        return mf_cmd_bench_batched(argc, argv);
    bench_opts o;
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    struct stat sb;
    if (stat(o.model, &sb) != 0) {
        fprintf(stderr, "bench: model file '%s' not found\n", o.model);
        return 1;
    }
    bench_ctx c = {.o = &o};
    /* The per-test sessions would each print their KV line: bench reports
     * its own errors, so only errors from the library unless MINFER_LOG asks. */
    if (!getenv("MINFER_LOG"))
        minfer_log_set_level(MINFER_LOG_ERROR);
    cpu_info(c.cpu, sizeof c.cpu);

    /* Bandwidth first, before any model pages are resident. */
    if (o.membw) {
        for (int i = 0; i < o.t.n; i++) {
            mf_membw_result mr;
            mf_error e = {{0}};
            if (measure_membw(o.t.v[i], &mr, &e)) {
                fprintf(stderr, "bench: %s\n", e.msg);
                return 1;
            }
            c.membw[i] = mr.gbps;
            fprintf(o.json ? stderr : stdout,
                    "membw: %.2f GB/s read with %d threads (%.2f GiB buffer, %d passes, best of "
                    "%d; mean %.2f)\n",
                    mr.gbps, mr.n_threads, (double)mr.bytes / (1024.0 * 1024.0 * 1024.0),
                    mr.passes, mr.trials, mr.gbps_mean);
        }
        if (!o.json)
            printf("\n");
    }

    double *ns = malloc(sizeof *ns * (size_t)o.reps);
    double *ts = malloc(sizeof *ts * (size_t)o.reps);
    if (!ns || !ts) {
        free(ns);
        free(ts);
        fprintf(stderr, "bench: out of memory for %d repetitions\n", o.reps);
        return 1;
    }
    rc = 0;
    /* Thread count is a model option: one load per -t value, outermost. */
    for (int ti = 0; ti < o.t.n && !rc; ti++) {
        minfer_model *m = load_model(&o, o.t.v[ti]);
        if (!m) {
            rc = 1;
            break;
        }
        for (int di = 0; di < o.d.n && !rc; di++) {
            for (int k = 0; k < o.p.n + o.n.n + o.pg_p.n && !rc; k++) {
                const int g = k - o.p.n - o.n.n; /* >= 0: a -pg pair */
                bench_test t = {.tg = k >= o.p.n && g < 0,
                                .n_tokens = k < o.p.n ? o.p.v[k]
                                            : g < 0   ? o.n.v[k - o.p.n]
                                                      : o.pg_p.v[g] + o.pg_n.v[g],
                                .pg_p = g >= 0 ? o.pg_p.v[g] : 0,
                                .pg_n = g >= 0 ? o.pg_n.v[g] : 0,
                                .depth = o.d.v[di],
                                .threads = o.t.v[ti],
                                .ns = ns};
                if (t.n_tokens == 0)
                    continue;
                int len = g >= 0 ? snprintf(t.name, sizeof t.name, "pp%d+tg%d", t.pg_p, t.pg_n)
                                 : snprintf(t.name, sizeof t.name, "%s%d", t.tg ? "tg" : "pp",
                                            t.n_tokens);
                if (t.depth > 0)
                    snprintf(t.name + len, sizeof t.name - (size_t)len, " @ d%d", t.depth);
                if (run_test(m, &o, &t)) {
                    rc = 1;
                    break;
                }
                sample_stats st = stats_of(&t, o.reps, ts);
                if (o.json) {
                    machine_row(&c, m, &t, &st, ts, c.membw[ti]);
                } else {
                    if (c.n_rows == 0)
                        md_header(&c);
                    md_row(&c, m, &t, &st, c.membw[ti]);
                }
                c.n_rows++;
            }
        }
        minfer_model_free(m);
    }
    if (o.fmt == OUT_JSON && c.n_rows)
        printf("\n]\n");
    else if (!o.json && c.n_rows)
        fprintf(stderr, "peak RSS: %.2f MiB\n", (double)peak_rss_bytes() / (1024.0 * 1024.0));
    fflush(stdout);
    free(ns);
    free(ts);
    return rc;
}
