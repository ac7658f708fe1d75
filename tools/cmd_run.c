/* cmd_run.c - `minfer run` (one prompt, streamed continuation) and the option
 * parsing and set-up that `minfer chat` shares (cmd_chat.c). Both use only
 * include/minfer.h. Flag spellings and meanings follow llama.cpp's
 * llama-cli where minfer can do the same thing (docs/CLI.md). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "minfer.h"
#include "runopts.h"
#include "tools.h"

static void usage(FILE *f, bool chat) {
    if (chat)
        fprintf(f, "usage: minfer chat [-m MODEL] [options]\n"
                   "A conversation with the model's chat template. On a terminal: line editing\n"
                   "and history, Ctrl-C stops an answer (at an empty prompt it exits), /help\n"
                   "lists the commands. From a pipe: one user message per line.\n\n");
    else
        fprintf(f, "usage: minfer run [-m MODEL] (-p PROMPT | -f FILE) [options]\n"
                   "Streams the prompt (unless --no-display-prompt) and its continuation to\n"
                   "stdout, then one stats line on stderr.\n\n");
    fprintf(f,
            "  -m, --model FILE         GGUF model (default: $MINFER_MODEL or %s)\n",
            MF_DEFAULT_MODEL);
    if (!chat)
        fprintf(f, "  -p, --prompt TEXT        prompt text (with -cnv: the system message)\n"
                   "  -f, --file FILE          read the prompt from FILE ('-': stdin)\n"
                   "  -n, --n-predict N        tokens to generate (default 128; -1: until end "
                   "of text or context)\n"
                   "      --chat               wrap the prompt in the model's chat template\n"
                   "  -cnv, --conversation     conversation mode (as `minfer chat`; -i too)\n"
                   "  -i, --interactive        same as -cnv\n"
                   "      --logits-out FILE    write the prompt's last-position logits (f32 LE)\n"
                   "      --grammar GBNF       constrain the output to a GBNF grammar (rule root)\n"
                   "      --grammar-file FILE  the same, read from FILE\n"
                   "      --json-schema S      constrain the output to JSON matching schema S\n"
                   "                           (JSON text, or @FILE; '{}' any JSON value)\n"
                                      "      --no-display-prompt  do not echo the prompt\n"
                   "      --keep N             on a full context keep N prompt tokens (-1: all)\n"
                   "                           and the newer half of the rest, and go on\n"
                   "      --verbose-prompt     print the prompt's tokens on stderr\n");
    else
        fprintf(f, "  -n, --n-predict N        max tokens per answer (default -1: until end of "
                   "turn)\n");
    fprintf(f,
            "  -sys, --system TEXT      system message (implies the chat template)\n"
            "      --chat-template NAME chatml, llama3, llama2, gemma, phi3, zephyr "
            "(default: the model's)\n"
            "  -e, --escape             process \\n \\t \\\\ ... in prompt, system and reverse prompt\n"
            "                           texts (default on)\n"
            "      --no-escape          take them literally\n"
            "  -r, --reverse-prompt TEXT stop when the output contains TEXT (repeatable)\n"
            "      --ignore-eos         never stop at end-of-generation tokens\n"
            "  -c, --ctx-size N         context length (default 0: min(model, 4096))\n"
            "  -b, --batch-size N       prefill batch (default 512)\n"
            "  -ub, --ubatch-size N     physical batch: tokens per forward (default: -b)\n"
            "  -t, --threads N          CPU threads (default 0: all cores)\n"
            "  -ctk, --cache-type-k T   K cache type f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1\n"
            "                           (default f32; also V's unless -ctv)\n"
            "  -ctv, --cache-type-v T   V cache type (same types; default: -ctk's)\n"
            "  -ngl, --n-gpu-layers N   -1 or N >= layers: all on the GPU, 0: none\n"
            "  -fa, --flash-attn MODE   on, off, auto (= on); off: unfused attention (cpu)\n");
    fprintf(f, "      --device NAME        %s or auto (default auto)\n", minfer_build_devices());
    fprintf(f,
            "      --no-mmap            read the model into memory instead of mapping it\n"
            "      --mlock              lock the model's memory (no swapping out)\n"
            "  -s, --seed N             sampler seed (default random, printed)\n"
            "      --temp F             temperature (default 0.8; <= 0: greedy)\n"
            "      --top-k N            (default 40; 0: off)\n"
            "      --top-p F            (default 0.95; 1: off)\n"
            "      --min-p F            (default 0.05; 0: off)\n"
            "      --repeat-penalty F   (default 1.0: off)\n"
            "      --repeat-last-n N    penalty window (default 64; -1: 8192)\n"
            "      --presence-penalty F (default 0)\n"
            "      --frequency-penalty F (default 0)\n"
            "      --color              colour the prompt (yellow) and user input (green)\n"
            "  -v, --verbose            debug log lines (MINFER_LOG=debug)\n"
            "      --log-disable        no log, seed or stats lines (errors still print)\n"
            "      --log-file FILE      write the log (stderr) to FILE\n"
            "  -h, --help               this text\n");
}

/* llama.cpp's escape processing: \n \r \t \a \b \f \v \\ \' \" \? \xHH; any
 * other backslash stays as it is. Edits s in place (the result is never
 * longer). */
static void process_escapes(char *s) {
    char *w = s;
    for (const char *r = s; *r; r++) {
        if (*r != '\\' || !r[1]) {
            *w++ = *r;
            continue;
        }
        char c = *++r;
        switch (c) {
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'a': *w++ = '\a'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'v': *w++ = '\v'; break;
        case '\\': case '\'': case '"': case '?': *w++ = c; break;
        case 'x': {
            int v = 0, k = 0;
            while (k < 2) {
                char h = r[1];
                int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                      : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (d < 0)
                    break;
                v = v * 16 + d;
                r++;
                k++;
            }
            if (k && v) {
                *w++ = (char)v;
            } else { /* \x without digits (or \x00, which would end the text) */
                *w++ = '\\';
                *w++ = 'x';
                r -= k;
            }
            break;
        }
        default: *w++ = '\\'; *w++ = c; break;
        }
    }
    *w = 0;
}

/* Returns 0 ok, 1 help printed, 2 bad usage (message printed). */
static int parse(int argc, char **argv, bool chat, run_opts *o) {
    const char *cmd = chat ? "chat" : "run";
    memset(o, 0, sizeof *o);
    minfer_sampler_options_default(&o->so);
    o->n_predict = chat ? -1 : 128;
    o->n_batch = 512;
    o->n_gpu_layers = -1;
    o->n_keep = -2;
    o->device = "auto";
    o->display_prompt = true;
    o->escape = true;
    o->chat = chat;
    o->conversation = chat;
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
        } else if (VAL("-ub") || VAL("--ubatch-size")) {
            INT(o->n_ubatch, 1, INT32_MAX);
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
        } else if (VAL("-sys") || VAL("--system") || VAL("--system-prompt")) {
            CHECK();
            o->sys = v;
        } else if (VAL("--chat-template")) {
            CHECK();
            o->tmpl = v;
        } else if (!chat && !strcmp(a, "--chat")) {
            o->chat = true;
        } else if (!chat && (!strcmp(a, "-cnv") || !strcmp(a, "--conversation") ||
                             !strcmp(a, "-i") || !strcmp(a, "--interactive"))) {
            o->conversation = true;
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
        } else if (!chat && !strcmp(a, "--verbose-prompt")) {
            o->verbose_prompt = true;
        } else if (!chat && VAL("--keep")) {
            INT(o->n_keep, -1, INT32_MAX);
            o->keep_given = true;
        } else if (VAL("-ngl") || VAL("--n-gpu-layers") || VAL("--gpu-layers")) {
            INT(o->n_gpu_layers, -1, INT32_MAX);
        } else if (VAL("-fa") || VAL("--flash-attn")) {
            CHECK();
            if (mf_parse_flash_attn(cmd, v, &o->fa_off, &e))
                return mf_arg_fail(cmd, &e);
        } else if (VAL("--device")) {
            CHECK();
            o->device = v;
        } else if (!strcmp(a, "-e") || !strcmp(a, "--escape")) {
            o->escape = true;
        } else if (!strcmp(a, "--no-escape")) {
            o->escape = false;
        } else if (VAL("-r") || VAL("--reverse-prompt")) {
            CHECK();
            if (o->n_rev == MF_GEN_MAX_REV) {
                mf_errorf(&e, "-r: at most %d reverse prompts", MF_GEN_MAX_REV);
                return mf_arg_fail(cmd, &e);
            }
            if (!*v) {
                mf_errorf(&e, "-r: an empty reverse prompt would stop at once");
                return mf_arg_fail(cmd, &e);
            }
            o->rev[o->n_rev++] = v;
        } else if (!strcmp(a, "--ignore-eos")) {
            o->ignore_eos = true;
        } else if (!strcmp(a, "--no-mmap")) {
            o->no_mmap = true;
        } else if (!strcmp(a, "--mlock")) {
            o->mlock = true;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            o->verbose = true;
        } else if (!strcmp(a, "--log-disable")) {
            o->log_disable = true;
        } else if (VAL("--log-file")) {
            CHECK();
            o->log_file = v;
        } else if (!strcmp(a, "--color") || !strcmp(a, "-co")) {
            o->color = true;
        } else {
            mf_errorf(&e, "unknown option '%s' (see 'minfer %s --help')", a, cmd);
            return mf_arg_fail(cmd, &e);
        }
#undef VAL
#undef CHECK
#undef FLOAT
#undef INT
    }
    if (!chat && !o->conversation && !o->prompt && !o->file) {
        mf_errorf(&e, "a prompt is needed: -p TEXT or -f FILE");
        return mf_arg_fail(cmd, &e);
    }
    if (o->prompt && o->file) {
        mf_errorf(&e, "-p and -f are exclusive");
        return mf_arg_fail(cmd, &e);
    }
    if (o->conversation && !chat && o->logits_out) {
        mf_errorf(&e, "--logits-out does not go with conversation mode");
        return mf_arg_fail(cmd, &e);
    }
    if (o->escape) {
        if (o->prompt)
            process_escapes((char *)o->prompt); /* argv strings are writable */
        if (o->sys)
            process_escapes((char *)o->sys);
        for (int k = 0; k < o->n_rev; k++)
            process_escapes((char *)o->rev[k]);
    }
    if (o->n_ubatch && o->n_ubatch < o->n_batch)
        o->n_batch = o->n_ubatch; /* minfer runs one physical batch per forward */
    if (o->sys)
        o->chat = true;
    if (!o->model)
        o->model = mf_default_model();
    return 0;
}

/* The process-wide effects of the logging and loading flags, applied once the
 * whole command line has parsed (a bad flag later on changes nothing). */
static int apply_env(const run_opts *o, const char *cmd) {
    if (o->log_file) {
        int fd = open(o->log_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            fprintf(stderr, "%s: --log-file: cannot create '%s'\n", cmd, o->log_file);
            return 1;
        }
        fflush(stderr);
        dup2(fd, 2);
        close(fd);
    }
    if (o->verbose)
        minfer_log_set_level(MINFER_LOG_DEBUG);
    if (o->log_disable)
        minfer_log_set_level(MINFER_LOG_ERROR);
    if (o->no_mmap)
        setenv("MINFER_NO_MMAP", "1", 1);
    if (o->mlock)
        setenv("MINFER_MLOCK", "1", 1);
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
    bool in = !strcmp(path, "-");
    FILE *f = in ? stdin : fopen(path, "rb");
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
    if (!in)
        fclose(f);
    if (in)
        path = "<stdin>";
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

int mf_run_load_model(const run_opts *o, const char *cmd, minfer_model **m) {
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
    if (st.st_size >= (64ll << 20) && isatty(2) && !o->log_disable)
        mo.progress = progress;
    *m = minfer_model_load(&mo, err, sizeof err);
    if (!*m) {
        fprintf(stderr, "%s: %s\n", cmd, err);
        return 1;
    }
    return 0;
}

int mf_run_open_session(const run_opts *o, const char *cmd, minfer_model *m, const char *prompt,
                        minfer_session **s) {
    char err[512];
    minfer_session_options so;
    minfer_session_options_default(&so);
    int32_t train = minfer_model_n_ctx_train(m);
    so.n_ctx = o->n_ctx ? o->n_ctx : (train < 4096 ? train : 4096);
    so.n_batch = o->n_batch;
    so.cache_type = o->ctk;
    so.cache_type_v = o->ctv;
    so.flash_attn_off = o->fa_off;
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

void mf_run_print_stats(const run_opts *o, const minfer_model *m, const mf_gen_result *r) {
    if (o->log_disable)
        return;
    double pp = r->prompt_ms > 0 ? 1e3 * r->n_prompt / r->prompt_ms : 0;
    double tg = r->gen_ms > 0 ? 1e3 * r->n_generated / r->gen_ms : 0;
    double ms = r->n_generated ? r->gen_ms / r->n_generated : 0;
    double gbs = r->gen_ms > 0
                     ? (double)minfer_model_size(m) * r->n_generated / (r->gen_ms * 1e6)
                     : 0;
    fprintf(stderr,
            "prompt %d tokens %.1f t/s | generated %d tokens %.1f t/s %.2f ms/token | %.2f GB/s "
            "of weights | %s on %s%s%s\n",
            r->n_prompt, pp, r->n_generated, tg, ms, gbs, minfer_model_desc(m),
            minfer_model_backend(m), r->stopped_ctx ? " | context full" : "",
            r->stopped_rev ? " | reverse prompt" : "");
}

/* A random seed when none was given, said on stderr so the run can be
 * repeated with -s. */
static void pick_seed(run_opts *o) {
    if (o->so.seed != UINT64_MAX)
        return;
    uint64_t v = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &v, sizeof v) != (ssize_t)sizeof v) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid();
    }
    if (fd >= 0)
        close(fd);
    o->so.seed = v & 0x7fffffffffffffffull; /* -s takes it back */
    o->seed_random = true;
}

/* Said once the model and session exist (an error before that stays the
 * only stderr line), and only where sampling is random. */
static void print_seed(const run_opts *o) {
    if (minfer_log_get_level() >= MINFER_LOG_ERROR) /* at error level only errors print */
        return;
    if (o->seed_random && !o->log_disable && o->so.temp > 0)
        fprintf(stderr, "seed: %llu\n", (unsigned long long)o->so.seed);
}

static void print_text(void *user, const char *text, size_t len) {
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

/* `run -cnv`: the chat loop, with -p (or -f) as its system message. */
static int run_conversation(run_opts *o, const char *sys_text) {
    if (sys_text && !o->sys)
        o->sys = sys_text;
    minfer_model *m;
    minfer_session *s;
    if (mf_run_load_model(o, "run", &m))
        return 1;
    if (mf_run_open_session(o, "run", m, NULL, &s)) {
        minfer_model_free(m);
        return 1;
    }
    print_seed(o);
    minfer_sampler *smp = minfer_sampler_new(&o->so);
    int rc = mf_chat_loop(o, m, s, smp);
    minfer_sampler_free(smp);
    minfer_session_free(s);
    minfer_model_free(m);
    return rc;
}

int mf_cmd_run(int argc, char **argv) {
    run_opts o;
    int rc = parse(argc, argv, false, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    if (apply_env(&o, "run"))
        return 1;
    char *file_text = NULL;
    if (o.file && !(file_text = read_file(o.file, "run")))
        return 1;
    const char *prompt = o.file ? file_text : o.prompt;
    pick_seed(&o);
    if (o.conversation) {
        rc = run_conversation(&o, prompt);
        free(file_text);
        return rc;
    }
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
    if (mf_run_load_model(&o, "run", &m))
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
    if (mf_run_open_session(&o, "run", m, prompt, &s))
        goto out;
    print_seed(&o);
    if (o.display_prompt) {
        fputs(o.color ? "\x1b[33m" : "", stdout);
        fputs(prompt, stdout);
        fputs(o.color ? "\x1b[0m" : "", stdout);
        fflush(stdout);
    }
    mf_gen_opts go = {.n_predict = o.logits_out ? 0 : o.n_predict,
                      .ignore_eos = o.ignore_eos,
                      .n_rev = o.n_rev,
                      .n_keep = o.keep_given ? o.n_keep : -2,
                      .verbose_prompt = o.verbose_prompt,
                      .progress = isatty(2) && !o.log_disable,
                      .n_batch = o.n_batch,
                      .out = print_text};
    memcpy(go.rev, o.rev, sizeof go.rev);
    mf_gen_result st, st2;
    if (mf_gen_run(m, s, smp, prompt, &go, &st, err, sizeof err)) {
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
            go.n_predict = o.n_predict;
            if (mf_gen_run(m, s, smp, "", &go, &st2, err, sizeof err)) {
                fprintf(stderr, "run: %s\n", err);
                goto out;
            }
            st.n_generated = st2.n_generated;
            st.gen_ms = st2.gen_ms;
            st.stopped_ctx = st2.stopped_ctx;
            st.stopped_eog = st2.stopped_eog;
            st.stopped_rev = st2.stopped_rev;
        }
    }
    printf("\n");
    fflush(stdout);
    mf_run_print_stats(&o, m, &st);
    rc = 0;
out:
    minfer_sampler_free(smp);
    free(formatted);
    free(file_text);
    minfer_session_free(s);
    minfer_model_free(m);
    return rc;
}

int mf_cmd_chat(int argc, char **argv) {
    run_opts o;
    int rc = parse(argc, argv, true, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    if (apply_env(&o, "chat"))
        return 1;
    pick_seed(&o);
    minfer_model *m;
    minfer_session *s;
    if (mf_run_load_model(&o, "chat", &m))
        return 1;
    if (mf_run_open_session(&o, "chat", m, NULL, &s)) {
        minfer_model_free(m);
        return 1;
    }
    print_seed(&o);
    minfer_sampler *smp = minfer_sampler_new(&o.so);
    rc = mf_chat_loop(&o, m, s, smp);
    minfer_sampler_free(smp);
    minfer_session_free(s);
    minfer_model_free(m);
    return rc;
}
