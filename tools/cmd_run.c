/* cmd_run.c - `minfer run` (one prompt, streamed continuation) and `minfer
 * chat` (multi-turn with the model's chat template, one answer per stdin
 * line). Both use only include/minfer.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "minfer.h"
#include "tools.h"

typedef struct run_opts {
    const char *model, *prompt, *file, *sys, *tmpl, *ctk, *ctv, *logits_out, *device;
    const char *grammar, *grammar_file, *json_schema; /* structured output (run only) */
    int32_t n_predict, n_ctx, n_threads, n_batch, n_gpu_layers;
    bool chat, display_prompt;
    minfer_sampler_options so;
} run_opts;

static void usage(FILE *f, bool chat) {
    if (chat)
        fprintf(f, "usage: minfer chat [-m MODEL] [options]\n"
                   "Reads one user message per stdin line and streams the model's answer\n"
                   "(ends at end of generation or EOF). Works with a pipe.\n\n");
    else
        fprintf(f, "usage: minfer run [-m MODEL] (-p PROMPT | -f FILE) [options]\n"
                   "Streams the prompt (unless --no-display-prompt) and its continuation to\n"
                   "stdout, then one stats line on stderr.\n\n");
    fprintf(f,
            "  -m, --model FILE         GGUF model (default: $MINFER_MODEL or %s)\n",
            MF_DEFAULT_MODEL);
    if (!chat)
        fprintf(f, "  -p, --prompt TEXT        prompt text\n"
                   "  -f, --file FILE          read the prompt from FILE\n"
                   "  -n, --n-predict N        tokens to generate (default 128; -1: until end "
                   "of text or context)\n"
                   "      --chat               wrap the prompt in the model's chat template\n"
                   "      --logits-out FILE    write the prompt's last-position logits (f32 LE)\n"
                   "      --grammar GBNF       constrain the output to a GBNF grammar (rule root)\n"
                   "      --grammar-file FILE  the same, read from FILE\n"
                   "      --json-schema S      constrain the output to JSON matching schema S\n"
                   "                           (JSON text, or @FILE; '{}' any JSON value)\n"
                   "      --no-display-prompt  do not echo the prompt\n");
    else
        fprintf(f, "  -n, --n-predict N        max tokens per answer (default -1: until end of "
                   "turn)\n");
    fprintf(f,
            "  -sys, --system TEXT      system message (implies the chat template)\n"
            "      --chat-template NAME chatml, llama3, llama2, gemma, phi3, zephyr "
            "(default: the model's)\n"
            "  -c, --ctx-size N         context length (default 0: min(model, 4096))\n"
            "  -b, --batch-size N       prefill batch (default 512)\n"
            "  -t, --threads N          CPU threads (default 0: all cores)\n"
            "  -ctk, -ctv TYPE          KV cache type f32, f16, q8_0 (K and V equal; default "
            "f32)\n"
"  -ngl, --n-gpu-layers N   -1 all layers on the GPU, 0 none\n");
    fprintf(f, "      --device NAME        %s or auto (default auto)\n", minfer_build_devices());
    fprintf(f,
            "  -s, --seed N             sampler seed (default random)\n"
            "      --temp F             temperature (default 0.8; <= 0: greedy)\n"
            "      --top-k N            (default 40; 0: off)\n"
            "      --top-p F            (default 0.95; 1: off)\n"
            "      --min-p F            (default 0.05; 0: off)\n"
            "      --repeat-penalty F   (default 1.0: off)\n"
            "      --repeat-last-n N    penalty window (default 64; -1: 8192)\n"
            "      --presence-penalty F (default 0)\n"
            "      --frequency-penalty F (default 0)\n"
            "  -h, --help               this text\n");
}

/* Returns 0 ok, 1 help printed, 2 bad usage (message printed). */
static int parse(int argc, char **argv, bool chat, run_opts *o) {
    const char *cmd = chat ? "chat" : "run";
    memset(o, 0, sizeof *o);
    minfer_sampler_options_default(&o->so);
    o->n_predict = chat ? -1 : 128;
    o->n_batch = 512;
    o->n_gpu_layers = -1;
    o->device = "auto";
    o->display_prompt = true;
    o->chat = chat;
    mf_error e = {{0}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
        double d;
        int64_t i64;
#define VAL(flag) ((r = mf_arg_value(argc, argv, &i, flag, &v, &e)) != 0)
#define CHECK()                                                                                 \
    do {                                                                                        \
        if (r < 0)                                                                              \
            return mf_arg_fail(cmd, &e);                                                        \
    } while (0)
#define FLOAT(field)                                                                            \
    do {                                                                                        \
        CHECK();                                                                                \
        if (mf_arg_float(a, v, &d, &e))                                                         \
            return mf_arg_fail(cmd, &e);                                                        \
        field = (float)d;                                                                       \
    } while (0)
#define INT(field, lo, hi)                                                                      \
    do {                                                                                        \
        CHECK();                                                                                \
        if (mf_arg_i32(a, v, lo, hi, &field, &e))                                               \
            return mf_arg_fail(cmd, &e);                                                        \
    } while (0)
        if (mf_arg_is_help(a)) {
            usage(stdout, chat);
            return 1;
        } else if (VAL("-m") || VAL("--model")) {
            CHECK();
            o->model = v;
        } else if (!chat && (VAL("-p") || VAL("--prompt"))) {
            CHECK();
            o->prompt = v;
        } else if (!chat && (VAL("-f") || VAL("--file"))) {
            CHECK();
            o->file = v;
        } else if (VAL("-n") || VAL("--n-predict")) {
            INT(o->n_predict, -1, INT32_MAX);
        } else if (VAL("-c") || VAL("--ctx-size")) {
            INT(o->n_ctx, 0, INT32_MAX);
        } else if (VAL("-t") || VAL("--threads")) {
            INT(o->n_threads, 0, 4096);
        } else if (VAL("-b") || VAL("--batch-size")) {
            INT(o->n_batch, 1, INT32_MAX);
        } else if (VAL("--temp")) {
            FLOAT(o->so.temp);
        } else if (VAL("--top-k")) {
            INT(o->so.top_k, 0, INT32_MAX);
        } else if (VAL("--top-p")) {
            FLOAT(o->so.top_p);
            if (o->so.top_p < 0 || o->so.top_p > 1) {
                mf_errorf(&e, "--top-p: %s is out of range [0, 1]", v);
                return mf_arg_fail(cmd, &e);
            }
        } else if (VAL("--min-p")) {
            FLOAT(o->so.min_p);
            if (o->so.min_p < 0 || o->so.min_p > 1) {
                mf_errorf(&e, "--min-p: %s is out of range [0, 1]", v);
                return mf_arg_fail(cmd, &e);
            }
        } else if (VAL("--repeat-penalty")) {
            FLOAT(o->so.repeat_penalty);
            if (o->so.repeat_penalty <= 0) {
                mf_errorf(&e, "--repeat-penalty: %s must be positive", v);
                return mf_arg_fail(cmd, &e);
            }
        } else if (VAL("--repeat-last-n")) {
            INT(o->so.repeat_last_n, -1, 1 << 20);
        } else if (VAL("--presence-penalty")) {
            FLOAT(o->so.presence_penalty);
        } else if (VAL("--frequency-penalty")) {
            FLOAT(o->so.frequency_penalty);
        } else if (VAL("-s") || VAL("--seed")) {
            CHECK();
            if (mf_arg_int(a, v, -1, INT64_MAX, &i64, &e))
                return mf_arg_fail(cmd, &e);
            o->so.seed = i64 < 0 ? UINT64_MAX : (uint64_t)i64;
        } else if (VAL("-sys") || VAL("--system")) {
            CHECK();
            o->sys = v;
        } else if (VAL("--chat-template")) {
            CHECK();
            o->tmpl = v;
        } else if (!chat && !strcmp(a, "--chat")) {
            o->chat = true;
        } else if (VAL("-ctk") || VAL("--cache-type-k")) {
            CHECK();
            o->ctk = v;
        } else if (VAL("-ctv") || VAL("--cache-type-v")) {
            CHECK();
            o->ctv = v;
        } else if (!chat && VAL("--logits-out")) {
            CHECK();
            o->logits_out = v;
        } else if (!chat && VAL("--grammar")) {
            CHECK();
            o->grammar = v;
        } else if (!chat && VAL("--grammar-file")) {
            CHECK();
            o->grammar_file = v;
        } else if (!chat && VAL("--json-schema")) {
            CHECK();
            o->json_schema = v;
        } else if (!chat && !strcmp(a, "--no-display-prompt")) {
            o->display_prompt = false;
        } else if (VAL("-ngl") || VAL("--n-gpu-layers")) {
            INT(o->n_gpu_layers, -1, INT32_MAX);
        } else if (VAL("--device")) {
            CHECK();
            o->device = v;
        } else {
            mf_errorf(&e, "unknown option '%s' (see 'minfer %s --help')", a, cmd);
            return mf_arg_fail(cmd, &e);
        }
#undef VAL
#undef CHECK
#undef FLOAT
#undef INT
    }
    if (!chat && !o->prompt && !o->file) {
        mf_errorf(&e, "a prompt is needed: -p TEXT or -f FILE");
        return mf_arg_fail(cmd, &e);
    }
    if (o->prompt && o->file) {
        mf_errorf(&e, "-p and -f are exclusive");
        return mf_arg_fail(cmd, &e);
    }
    if (o->ctk && o->ctv && strcmp(o->ctk, o->ctv)) {
        mf_errorf(&e, "-ctk %s and -ctv %s differ (one cache type for K and V)", o->ctk, o->ctv);
        return mf_arg_fail(cmd, &e);
    }
    if (o->sys)
        o->chat = true;
    if (!o->model)
        o->model = mf_default_model();
    return 0;
}

static char *read_file(const char *path, const char *cmd);

/* --grammar / --grammar-file / --json-schema onto the sampler (at most one). */
static int set_constraint(const run_opts *o, minfer_model *m, minfer_sampler *smp) {
    int n = !!o->grammar + !!o->grammar_file + !!o->json_schema;
    char err[512];
    if (n > 1) {
        fprintf(stderr, "run: --grammar, --grammar-file and --json-schema exclude each other\n");
        return -1;
    }
    if (!n)
        return 0;
    char *text = NULL;
    const char *g = o->grammar;
    int rc;
    if (o->grammar_file && !(g = text = read_file(o->grammar_file, "run")))
        return -1;
    if (o->json_schema) {
        const char *sch = o->json_schema;
        if (sch[0] == '@' && !(sch = text = read_file(sch + 1, "run")))
            return -1;
        rc = minfer_sampler_set_json_schema(smp, m, sch, err, sizeof err);
    } else {
        rc = minfer_sampler_set_grammar(smp, m, g, err, sizeof err);
    }
    if (rc)
        fprintf(stderr, "run: %s\n", err);
    free(text);
    return rc;
}

static char *read_file(const char *path, const char *cmd) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open '%s'\n", cmd, path);
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (cap - n - 1 == 0) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    bool bad = ferror(f) || !buf;
    fclose(f);
    if (bad) {
        free(buf);
        fprintf(stderr, "%s: cannot read '%s'\n", cmd, path);
        return NULL;
    }
    buf[n] = 0;
    if (strlen(buf) != n) {
        free(buf);
        fprintf(stderr, "%s: '%s' contains NUL bytes\n", cmd, path);
        return NULL;
    }
    return buf;
}

static void progress(void *user, float frac, const char *what) {
    (void)user;
    fprintf(stderr, "\r%s %3.0f%%%s", what, 100.0 * frac, frac >= 1.0f ? "\n" : "");
}

/* The model from the options; prints the error and returns 1 on failure. */
static int load_model(const run_opts *o, const char *cmd, minfer_model **m) {
    char err[512];
    minfer_model_options mo;
    minfer_model_options_default(&mo);
    mo.path = o->model;
    mo.n_threads = o->n_threads;
    mo.device = o->device;
    mo.n_gpu_layers = o->n_gpu_layers;
    mo.chat_template = o->tmpl; /* a built-in override: the GGUF's template is not needed */
    struct stat st;
    *m = NULL;
    if (stat(o->model, &st) != 0) {
        fprintf(stderr, "%s: model file '%s' not found\n", cmd, o->model);
        return 1;
    }
    /* A progress line only where a person waits for it. */
    if (st.st_size >= (1ll << 30) && isatty(2))
        mo.progress = progress;
    *m = minfer_model_load(&mo, err, sizeof err);
    if (!*m) {
        fprintf(stderr, "%s: %s\n", cmd, err);
        return 1;
    }
    return 0;
}

/* The session; a prompt (may be NULL) that cannot fit the context is refused
 * before the session (and its KV cache) exists. Returns 1 on failure. */
static int open_session(const run_opts *o, const char *cmd, minfer_model *m, const char *prompt,
                        minfer_session **s) {
    char err[512];
    minfer_session_options so;
    minfer_session_options_default(&so);
    int32_t train = minfer_model_n_ctx_train(m);
    so.n_ctx = o->n_ctx ? o->n_ctx : (train < 4096 ? train : 4096);
    so.n_batch = o->n_batch;
    so.cache_type = o->ctk ? o->ctk : o->ctv;
    *s = NULL;
    int64_t nt = prompt ? minfer_tokenize(m, prompt, strlen(prompt), true, true, NULL, 0) : 0;
    if (nt > so.n_ctx) {
        fprintf(stderr, "%s: the prompt has %lld tokens, more than the context of %d\n", cmd,
                (long long)nt, so.n_ctx);
        return 1;
    }
    *s = minfer_session_new(m, &so, err, sizeof err);
    if (!*s) {
        fprintf(stderr, "%s: %s\n", cmd, err);
        return 1;
    }
    return 0;
}

static bool print_token(void *user, int32_t token, const char *text, size_t len) {
    (void)user;
    (void)token;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return true;
}

static void print_stats(const minfer_model *m, const minfer_generate_stats *st) {
    double pp = st->prompt_ms > 0 ? 1e3 * st->n_prompt / st->prompt_ms : 0;
    double tg = st->gen_ms > 0 ? 1e3 * st->n_generated / st->gen_ms : 0;
    double ms = st->n_generated ? st->gen_ms / st->n_generated : 0;
    double gbs = st->gen_ms > 0 ? (double)st->weight_bytes * st->n_generated / (st->gen_ms * 1e6)
                                : 0;
    fprintf(stderr,
            "prompt %d tokens %.1f t/s | generated %d tokens %.1f t/s %.2f ms/token | %.2f GB/s "
            "of weights | %s on %s%s\n",
            st->n_prompt, pp, st->n_generated, tg, ms, gbs, minfer_model_desc(m),
            minfer_model_backend(m), st->stopped_ctx ? " | context full" : "");
}

int mf_cmd_run(int argc, char **argv) {
    run_opts o;
    int rc = parse(argc, argv, false, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    char *file_text = NULL;
    if (o.file && !(file_text = read_file(o.file, "run")))
        return 1;
    const char *prompt = o.file ? file_text : o.prompt;
    minfer_model *m = NULL;
    minfer_session *s = NULL;
    char err[512];
    char *formatted = NULL;
    minfer_sampler *smp = NULL;
    rc = 1;
    if (!o.chat && o.tmpl) {
        fprintf(stderr, "run: --chat-template needs --chat or -sys\n");
        free(file_text);
        return 2;
    }
    if (load_model(&o, "run", &m))
        goto out;
    if (o.chat) {
        minfer_chat_message msgs[2];
        int n = 0;
        if (o.sys)
            msgs[n++] = (minfer_chat_message){"system", o.sys};
        msgs[n++] = (minfer_chat_message){"user", prompt};
        formatted = minfer_chat_apply(m, o.tmpl, msgs, n, true, err, sizeof err);
        if (!formatted) {
            fprintf(stderr, "run: %s\n", err);
            goto out;
        }
        prompt = formatted;
    }
    smp = minfer_sampler_new(&o.so);
    if (set_constraint(&o, m, smp))
        goto out;
    if (open_session(&o, "run", m, prompt, &s))
        goto out;
    if (o.display_prompt) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    minfer_generate_stats st, st2;
    if (minfer_generate(s, smp, prompt, o.logits_out ? 0 : o.n_predict, print_token, NULL, &st,
                        err, sizeof err)) {
        fprintf(stderr, "run: %s\n", err);
        goto out;
    }
    if (o.logits_out) {
        FILE *f = fopen(o.logits_out, "wb");
        const float *lg = minfer_logits(s);
        size_t nv = (size_t)minfer_model_n_vocab(m);
        if (!f || fwrite(lg, sizeof *lg, nv, f) != nv) {
            fprintf(stderr, "run: cannot write logits to '%s'\n", o.logits_out);
            if (f)
                fclose(f);
            goto out;
        }
        if (fclose(f)) {
            fprintf(stderr, "run: cannot write logits to '%s'\n", o.logits_out);
            goto out;
        }
        if (o.n_predict != 0) {
            if (minfer_generate(s, smp, "", o.n_predict, print_token, NULL, &st2, err,
                                sizeof err)) {
                fprintf(stderr, "run: %s\n", err);
                goto out;
            }
            st.n_generated = st2.n_generated;
            st.gen_ms = st2.gen_ms;
            st.stopped_ctx = st2.stopped_ctx;
            st.stopped_eog = st2.stopped_eog;
        }
    }
    printf("\n");
    fflush(stdout);
    print_stats(m, &st);
    rc = 0;
out:
    minfer_sampler_free(smp);
    free(formatted);
    free(file_text);
    minfer_session_free(s);
    minfer_model_free(m);
    return rc;
}

/* ---- chat ------------------------------------------------------------------------- */

typedef struct answer {
    char *buf;
    size_t n, cap;
} answer;

static bool chat_token(void *user, int32_t token, const char *text, size_t len) {
    answer *a = user;
    (void)token;
    if (a->n + len + 1 > a->cap) {
        size_t cap = (a->n + len + 1) * 2;
        char *nb = realloc(a->buf, cap);
        if (!nb)
            return false;
        a->buf = nb;
        a->cap = cap;
    }
    memcpy(a->buf + a->n, text, len);
    a->n += len;
    a->buf[a->n] = 0;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return true;
}

/* One line of stdin without its newline (malloc'd), or NULL at EOF. */
static char *read_line(FILE *f) {
    size_t cap = 256, n = 0;
    char *s = malloc(cap);
    int c;
    while (s && (c = fgetc(f)) != EOF && c != '\n') {
        if (n + 2 > cap) {
            char *ns = realloc(s, cap *= 2);
            if (!ns) {
                free(s);
                return NULL;
            }
            s = ns;
        }
        s[n++] = (char)c;
    }
    if (!s || (n == 0 && c == EOF)) {
        free(s);
        return NULL;
    }
    if (n && s[n - 1] == '\r')
        n--;
    s[n] = 0;
    return s;
}

int mf_cmd_chat(int argc, char **argv) {
    run_opts o;
    int rc = parse(argc, argv, true, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    minfer_model *m;
    minfer_session *s;
    if (load_model(&o, "chat", &m))
        return 1;
    if (open_session(&o, "chat", m, NULL, &s)) {
        minfer_model_free(m);
        return 1;
    }
    minfer_sampler *smp = minfer_sampler_new(&o.so);
    const bool tty = isatty(0);
    char err[512];
    /* The conversation; contents are owned copies. */
    minfer_chat_message *msgs = NULL;
    int n_msgs = 0, cap_msgs = 0;
    char *kv_text = strdup(""); /* what the session's context holds, as text */
    minfer_generate_stats total = {0};
    rc = 0;
    if (o.sys) {
        cap_msgs = 8;
        msgs = malloc((size_t)cap_msgs * sizeof *msgs);
        msgs[n_msgs++] = (minfer_chat_message){"system", strdup(o.sys)};
    }
    for (;;) {
        if (tty) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        char *line = read_line(stdin);
        if (!line)
            break;
        if (!*line) {
            free(line);
            continue;
        }
        if (n_msgs + 2 > cap_msgs) {
            cap_msgs = cap_msgs ? cap_msgs * 2 : 8;
            msgs = realloc(msgs, (size_t)cap_msgs * sizeof *msgs);
        }
        msgs[n_msgs++] = (minfer_chat_message){"user", line};
        char *full = minfer_chat_apply(m, o.tmpl, msgs, n_msgs, true, err, sizeof err);
        if (!full) {
            fprintf(stderr, "chat: %s\n", err);
            rc = 1;
            break;
        }
        /* Only the part after what the context already holds is new; if the
         * template re-renders history differently, start over from scratch. */
        size_t kl = strlen(kv_text);
        const char *delta = full + kl;
        if (strncmp(full, kv_text, kl) != 0) {
            minfer_session_reset(s);
            delta = full;
        }
        answer a = {0};
        minfer_generate_stats st;
        if (minfer_generate(s, smp, delta, o.n_predict, chat_token, &a, &st, err, sizeof err)) {
            fprintf(stderr, "chat: %s\n", err);
            free(full);
            free(a.buf);
            rc = 1;
            break;
        }
        fputc('\n', stdout);
        fflush(stdout);
        total.n_prompt += st.n_prompt;
        total.n_generated += st.n_generated;
        total.prompt_ms += st.prompt_ms;
        total.gen_ms += st.gen_ms;
        total.weight_bytes = st.weight_bytes;
        const char *ans = a.buf ? a.buf : "";
        free(kv_text);
        kv_text = malloc(strlen(full) + strlen(ans) + 1);
        strcpy(kv_text, full);
        strcat(kv_text, ans);
        msgs[n_msgs++] = (minfer_chat_message){"assistant", a.buf ? a.buf : strdup("")};
        free(full);
        if (st.stopped_ctx) {
            fprintf(stderr, "chat: the context is full (%d tokens)\n", minfer_session_n_ctx(s));
            rc = 1;
            break;
        }
    }
    if (rc == 0)
        print_stats(m, &total);
    for (int i = 0; i < n_msgs; i++)
        free((char *)msgs[i].content);
    free(msgs);
    free(kv_text);
    minfer_sampler_free(smp);
    minfer_session_free(s);
    minfer_model_free(m);
    return rc;
}
