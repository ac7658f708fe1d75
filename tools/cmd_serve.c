/* cmd_serve.c - `minfer serve`: an HTTP server with OpenAI-style completion
 * endpoints over one model, many requests at once.
 *
 * Threads: the main thread accepts; each connection gets a thread that reads
 * its requests (keep-alive), answers the cheap endpoints itself (/health,
 * /metrics, /props, /slots, /tokenize, /detokenize, /v1/models) and hands
 * completions to the compute thread of serve_sched.c as jobs, then waits on
 * the job, streaming what it produces and watching the socket so a client
 * that leaves cancels its job within a step or two. Uses include/minfer.h,
 * plus http.h and json.h for the wire formats. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "http.h"
#include "json.h"
#include "minfer.h"
#include "serve_chat.h"
#include "serve_constrain.h"
#include "serve_sched.h"
#include "tools.h"

#define SERVE_MAX_BODY (1u << 20) /* request bodies above this: 413 */
#define SERVE_MAX_MESSAGES 1024
#define SERVE_MAX_CONNS 256       /* connection threads at once; more: 503 at accept */

typedef struct serve_opts {
    const char *model, *host, *alias, *tmpl, *ctk, *ctv, *device;
    int32_t port, n_ctx, n_threads, n_batch, n_gpu_layers, parallel, timeout_s, idle_s;
    int32_t queue_max, chunk, kv_blocks, max_tokens_default, max_tokens_max, grace_s;
    bool no_prompt_cache;
    bool fa_off; /* -fa off */
} serve_opts;

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: minfer serve [-m MODEL] [options]\n"
            "Serves the model over HTTP/1.1 (keep-alive), many requests at once: up to\n"
            "--parallel sequences decode together in one batch (continuous batching:\n"
            "requests join and leave at every step; long prompts are prefilled in chunks\n"
            "between decode steps), more wait in a queue of --queue, beyond that 503 with\n"
            "Retry-After. A prompt cache reuses the longest prefix an earlier request left.\n"
            "Prints \"serve: listening on http://HOST:PORT\" on stderr once it accepts\n"
            "requests. SIGINT or SIGTERM: stop accepting, answer queued requests 503, give\n"
            "running ones --shutdown-grace seconds, then cut them with an error, exit 0.\n\n"
            "endpoints:\n"
            "  GET  /health                {\"status\":\"ok\"}\n"
            "  GET  /metrics               Prometheus text (requests, tokens, queue, KV blocks,\n"
            "                               prompt cache, latency histograms)\n"
            "  GET  /props                 model, n_ctx, slots, limits\n"
            "  GET  /slots                 the state of each slot\n"
            "  GET  /v1/models             the model id\n"
            "  POST /tokenize              {content, add_special (false), parse_special (true)}\n"
            "  POST /detokenize            {tokens: [ids]}\n"
            "  POST /apply-template        {messages, tools}: the chat prompt as text\n"
            "  POST /v1/completions        {prompt (text or token ids), max_tokens (16),\n"
            "                               temperature, top_k, top_p, min_p, seed, stop, stream,\n"
            "                               presence_penalty, frequency_penalty, repeat_penalty,\n"
            "                               logprobs (0..%d)}\n"
            "  POST /v1/chat/completions   {messages: [{role, content, tool_calls,\n"
            "                               tool_call_id}], max_tokens\n"
            "                               (--max-tokens-default), logprobs, top_logprobs,\n"
            "                               response_format, tools, tool_choice,\n"
            "                               same sampling fields}\n"
            "  Unset sampling fields take minfer run's defaults (temperature 0.8, top_k 40,\n"
            "  top_p 0.95, min_p 0.05, random seed); temperature 0 is greedy. \"stream\": true\n"
            "  answers with Server-Sent Events ending in \"data: [DONE]\". A field the server\n"
            "  cannot honour (logit_bias, echo, n > 1, functions, grammar, ...) is a 400\n"
            "  naming it. Message content is text: special-token spellings in it stay text.\n"
            "  Bodies above 1 MiB are refused (413); errors are JSON\n"
            "  {\"error\": {\"message\", \"type\", \"code\"}}.\n\n"
            "options:\n"
            "  -m, --model FILE         GGUF model (default: $MINFER_MODEL or %s)\n"
            "      --host ADDR          address to listen on (default 127.0.0.1)\n"
            "      --port N             TCP port (default 8080; 0: any free port)\n"
            "      --alias NAME         model id in responses (default: the file name)\n"
            "  -c, --ctx-size N         context per sequence (default 0: min(model, 4096))\n"
            "  -np, --parallel N        sequences decoded together (default 4)\n"
            "      --queue N            requests waiting for a slot before 503 (default 64)\n"
            "  -b, --batch-size N       tokens per forward (default 512)\n"
            "      --prefill-chunk N    prompt tokens per forward and request (default 128)\n"
            "      --kv-blocks N        KV pool blocks of 16 positions (default: every slot a\n"
            "                           full context)\n"
            "      --no-prompt-cache    forget each request's KV when it ends\n"
            "      --max-tokens-default N  max_tokens of a chat request without one (512)\n"
            "      --max-tokens-max N   larger max_tokens: 400 (default 4096)\n"
            "  -t, --threads N          CPU threads (default 0: all cores)\n"
            "  -ctk, --cache-type-k T   K cache type f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1\n"
            "                           (default f32; also V's unless -ctv; alias --cache-type)\n"
            "  -ctv, --cache-type-v T   V cache type (default: -ctk's)\n"
            "  -ngl, --n-gpu-layers N   -1 or N >= layers: all on the GPU, 0: none\n"
            "  -fa, --flash-attn MODE   on, off, auto (= on); off: unfused attention (cpu)\n",
            SV_MAX_TOP > 5 ? 5 : SV_MAX_TOP, MF_DEFAULT_MODEL);
    fprintf(f, "      --device NAME        %s or auto (default auto)\n", minfer_build_devices());
    fprintf(f,
            "      --chat-template NAME chatml, llama3, llama2, gemma, phi3, zephyr "
            "(default: the model's)\n"
            "      --timeout N          seconds a client has to send a request once it\n"
            "                           starts (default 10)\n"
            "      --idle-timeout N     seconds a kept-alive connection may wait idle (30)\n"
            "      --shutdown-grace N   seconds running requests get at shutdown (default 5)\n"
            "  -h, --help               this text\n");
}

/* Returns 0 ok, 1 help printed, 2 bad usage (message printed). */
static int parse(int argc, char **argv, serve_opts *o) {
    const char *cmd = "serve";
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->n_batch = 512;
    o->n_gpu_layers = -1;
    o->device = "auto";
    o->parallel = 4;
    o->timeout_s = 10;
    o->idle_s = 30;
    o->queue_max = 64;
    o->chunk = 128;
    o->max_tokens_default = 512;
    o->max_tokens_max = 4096;
    o->grace_s = 5;
    mf_error e = {{0}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
#define VAL(flag) ((r = mf_arg_value(argc, argv, &i, flag, &v, &e)) != 0)
/* A missing value must not swallow the next option: a server that starts by
 * mistake holds a port. */
#define STR(field)                                                                              \
    do {                                                                                        \
        if (r < 0)                                                                              \
            return mf_arg_fail(cmd, &e);                                                        \
        if (v[0] == '-' && v[1] == '-') {                                                       \
            mf_errorf(&e, "%s needs a value, not the option '%s'", a, v);                      \
            return mf_arg_fail(cmd, &e);                                                        \
        }                                                                                       \
        field = v;                                                                              \
    } while (0)
#define INT(field, lo, hi)                                                                      \
    do {                                                                                        \
        if (r < 0 || mf_arg_i32(a, v, lo, hi, &field, &e))                                      \
            return mf_arg_fail(cmd, &e);                                                        \
    } while (0)
        if (mf_arg_is_help(a)) {
            usage(stdout);
            return 1;
        } else if (VAL("-m") || VAL("--model")) {
            STR(o->model);
        } else if (VAL("--host")) {
            STR(o->host);
        } else if (VAL("--port")) {
            INT(o->port, 0, 65535);
        } else if (VAL("--alias")) {
            STR(o->alias);
        } else if (VAL("-c") || VAL("--ctx-size")) {
            INT(o->n_ctx, 0, INT32_MAX);
        } else if (VAL("-b") || VAL("--batch-size")) {
            INT(o->n_batch, 1, 65536);
        } else if (VAL("-t") || VAL("--threads")) {
            INT(o->n_threads, 0, 4096);
        } else if (VAL("-ctk") || VAL("--cache-type-k") || VAL("--cache-type")) {
            STR(o->ctk);
        } else if (VAL("-ctv") || VAL("--cache-type-v")) {
            STR(o->ctv);
        } else if (VAL("-ngl") || VAL("--n-gpu-layers")) {
            INT(o->n_gpu_layers, -1, INT32_MAX);
        } else if (VAL("-fa") || VAL("--flash-attn")) {
            if (r < 0 || mf_parse_flash_attn(cmd, v, &o->fa_off, &e))
                return mf_arg_fail(cmd, &e);
        } else if (VAL("--device")) {
            STR(o->device);
        } else if (VAL("--chat-template")) {
            STR(o->tmpl);
            if (minfer_chat_template_check(o->tmpl, e.msg, sizeof e.msg)) return mf_arg_fail(cmd, &e);
        } else if (VAL("-np") || VAL("--parallel")) {
            INT(o->parallel, 1, 256);
        } else if (VAL("--queue")) {
            INT(o->queue_max, 1, 100000);
        } else if (VAL("--prefill-chunk")) {
            INT(o->chunk, 1, 65536);
        } else if (VAL("--kv-blocks")) {
            INT(o->kv_blocks, 1, INT32_MAX);
        } else if (VAL("--max-tokens-default")) {
            INT(o->max_tokens_default, 1, INT32_MAX);
        } else if (VAL("--max-tokens-max")) {
            INT(o->max_tokens_max, 1, INT32_MAX);
        } else if (VAL("--timeout")) {
            INT(o->timeout_s, 1, 3600);
        } else if (VAL("--idle-timeout")) {
            INT(o->idle_s, 1, 3600);
        } else if (VAL("--shutdown-grace")) {
            INT(o->grace_s, 0, 3600);
        } else if (!strcmp(a, "--no-prompt-cache")) {
            o->no_prompt_cache = true;
        } else {
            mf_errorf(&e, "unknown option '%s' (see 'minfer serve --help')", a);
            return mf_arg_fail(cmd, &e);
        }
#undef VAL
#undef STR
#undef INT
    }
    if (o->max_tokens_default > o->max_tokens_max) {
        mf_errorf(&e, "--max-tokens-default %d exceeds --max-tokens-max %d", o->max_tokens_default,
                  o->max_tokens_max);
        return mf_arg_fail(cmd, &e);
    }
    if (!o->model)
        o->model = mf_default_model();
    return 0;
}

/* ---- server state and responses ------------------------------------------------------ */

typedef struct server {
    const serve_opts *o;
    minfer_model *m;
    sv_sched *sched;
    char model_id[256];
    _Atomic unsigned long long n_requests;
    pthread_mutex_t mu;
    pthread_cond_t conns_cv;
    int n_conns;
} server;

static const char *error_type(int status) {
    switch (status) {
    case 404: return "not_found_error";
    case 405: return "method_not_allowed";
    case 413: return "request_too_large";
    case 500: return "server_error";
    case 503: return "service_unavailable";
    }
    return "invalid_request_error";
}

/* {"error":{"message":...,"type":...,"code":status}} into b. */
static void error_json(mf_sbuf *b, int status, const char *msg) {
    mf_sbuf_puts(b, "{\"error\":{\"message\":");
    mf_json_add_string(b, msg, strlen(msg));
    mf_sbuf_printf(b, ",\"type\":\"%s\",\"code\":%d}}", error_type(status), status);
}

/* One connection: its socket and whether it stays open after this answer. */
typedef struct conn {
    server *sv;
    int fd;
    bool keep;
} conn;

static void send_json(conn *c, int status, const mf_sbuf *b, const char *extra_headers) {
    if (mf_http_respond_ka(c->fd, status, "application/json", extra_headers, b->p, b->n, c->keep))
        c->keep = false;
}

static void send_error(conn *c, int status, const char *extra_headers, const char *msg) {
    mf_sbuf b = {0};
    error_json(&b, status, msg);
    send_json(c, status, &b, extra_headers);
    mf_sbuf_free(&b);
}

/* ---- request fields ---------------------------------------------------------------------- */

/* A request the server cannot take: status (400, 500) and one line. */
typedef struct bad {
    int status;
    char msg[512];
} bad;

static int badf(bad *b, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int badf(bad *b, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->msg, sizeof b->msg, fmt, ap);
    va_end(ap);
    b->status = status;
    return -1;
}

/* A number field in [lo, hi]: 0 absent or null, 1 set, -1 bad. */
static int get_number(const mf_json *root, const char *key, double lo, double hi, double *out,
                      bad *b) {
    const mf_json *v = mf_json_get(root, key);
    if (!v || v->type == MF_JSON_NULL)
        return 0;
    if (v->type != MF_JSON_NUMBER)
        return badf(b, 400, "'%s' must be a number, not %s", key, mf_json_type_name(v->type));
    if (!(v->number >= lo && v->number <= hi))
        return badf(b, 400, "'%s' is %g, outside [%g, %g]", key, v->number, lo, hi);
    *out = v->number;
    return 1;
}

/* An integer field in [lo, hi] (1e3 or 16.0 count as integers). */
static int get_int(const mf_json *root, const char *key, double lo, double hi, long long *out,
                   bad *b) {
    double d = 0;
    const mf_json *v = mf_json_get(root, key);
    if (v && v->type == MF_JSON_NUMBER && v->number != floor(v->number))
        return badf(b, 400, "'%s' must be an integer, not %g", key, v->number);
    int r = get_number(root, key, lo, hi, &d, b);
    if (r == 1)
        *out = (long long)d;
    return r;
}

static int get_bool(const mf_json *root, const char *key, bool *out, bad *b) {
    const mf_json *v = mf_json_get(root, key);
    if (!v || v->type == MF_JSON_NULL)
        return 0;
    if (v->type != MF_JSON_BOOL)
        return badf(b, 400, "'%s' must be a boolean, not %s", key, mf_json_type_name(v->type));
    *out = v->boolean;
    return 1;
}

/* A string that goes to a C API: no NUL inside. */
static int c_string(const mf_json *v, const char *what, bad *b) {
    if (v->type != MF_JSON_STRING)
        return badf(b, 400, "%s must be a string, not %s", what, mf_json_type_name(v->type));
    if (strlen(v->str) != v->len)
        return badf(b, 400, "%s contains a NUL character (\\u0000)", what);
    return 0;
}

typedef struct gen_params {
    minfer_sampler_options so;
    bool greedy;
    int32_t max_tokens;
    bool stream;
    const char *stop[SV_MAX_STOP];
    size_t stop_len[SV_MAX_STOP];
    int n_stop;
    bool logprobs;
    int32_t n_top;
} gen_params;

/* Fields a request may carry, per endpoint; any other is a 400 naming it, so
 * nothing a client asks for is silently ignored. "model" and "user" are
 * accepted as labels (one model is served). */
static const char *const common_fields[] = {
    "model", "user", "max_tokens", "temperature", "top_k", "top_p", "min_p",
    "presence_penalty", "frequency_penalty", "repeat_penalty", "seed", "stream",
    "stream_options", "stop", "n", "logprobs", "response_format", "tools", "tool_choice",
    "parallel_tool_calls", NULL};
static const char *const completion_fields[] = {"prompt", NULL};
static const char *const chat_fields[] = {"messages", "max_completion_tokens", "top_logprobs", NULL};

static bool listed(const char *const *list, const char *k) {
    for (; *list; list++)
        if (!strcmp(*list, k))
            return true;
    return false;
}

/* Output constraints this server does not take: the legacy function-calling
 * fields and llama.cpp's raw grammar fields (response_format, tools and
 * tool_choice are read by serve_constrain.c). */
static int check_constraints(const mf_json *root, bad *b) {
    static const char *const constrained[] = {"functions", "function_call", "grammar",
                                              "json_schema", NULL};
    for (size_t i = 0; constrained[i]; i++) {
        const mf_json *v = mf_json_get(root, constrained[i]);
        if (v && v->type != MF_JSON_NULL)
            return badf(b, 400, "'%s' is not supported by this server (use response_format / "
                                "tools)",
                        constrained[i]);
    }
    return 0;
}

static int check_fields(const mf_json *root, bool chat, bad *b) {
    if (check_constraints(root, b))
        return -1;
    for (size_t i = 0; i < root->n; i++) {
        const char *k = root->kids[i].key;
        if (listed(common_fields, k) || listed(chat ? chat_fields : completion_fields, k))
            continue;
        if (!strcmp(k, "logit_bias") || !strcmp(k, "echo") || !strcmp(k, "suffix") ||
            !strcmp(k, "best_of") || !strcmp(k, "prompt") || !strcmp(k, "messages"))
            return badf(b, 400, "'%.60s' is not supported on this endpoint", k);
        return badf(b, 400, "unknown field '%.60s'", k);
    }
    return 0;
}

static int parse_params(const serve_opts *o, const mf_json *root, bool chat, gen_params *g, bad *b) {
    double d = 0;
    long long ll;
    int r;
    memset(g, 0, sizeof *g);
    if (check_fields(root, chat, b))
        return -1;
    minfer_sampler_options_default(&g->so);
    g->max_tokens = chat ? o->max_tokens_default : 16;
    if (g->max_tokens > o->max_tokens_max)
        g->max_tokens = o->max_tokens_max;
    if ((r = get_int(root, "max_tokens", 0, INT32_MAX, &ll, b)) < 0)
        return -1;
    if (r)
        g->max_tokens = (int32_t)ll;
    if (chat && (r = get_int(root, "max_completion_tokens", 0, INT32_MAX, &ll, b)) != 0) {
        if (r < 0)
            return -1;
        g->max_tokens = (int32_t)ll;
    }
    if (g->max_tokens > o->max_tokens_max)
        return badf(b, 400, "'max_tokens' is %d, more than this server's maximum of %d",
                    g->max_tokens, o->max_tokens_max);
    /* The float sampling fields: name, accepted range, where it goes. */
    const struct {
        const char *key;
        double lo, hi;
        float *dst;
    } floats[] = {
        {"temperature", 0, 100, &g->so.temp},
        {"top_p", 0, 1, &g->so.top_p},
        {"min_p", 0, 1, &g->so.min_p},
        {"presence_penalty", -2, 2, &g->so.presence_penalty},
        {"frequency_penalty", -2, 2, &g->so.frequency_penalty},
        {"repeat_penalty", 0.01, 100, &g->so.repeat_penalty},
    };
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) {
        if ((r = get_number(root, floats[i].key, floats[i].lo, floats[i].hi, &d, b)) < 0)
            return -1;
        if (r)
            *floats[i].dst = (float)d;
    }
    /* greedy: the argmax of the raw logits, as `minfer run --temp 0` */
    g->greedy = g->so.temp <= 0 && g->so.repeat_penalty == 1.0f && g->so.presence_penalty == 0 &&
                g->so.frequency_penalty == 0;
    if ((r = get_int(root, "top_k", 0, INT32_MAX, &ll, b)) < 0)
        return -1;
    if (r)
        g->so.top_k = (int32_t)ll;
    if ((r = get_int(root, "seed", -1, 9007199254740992.0, &ll, b)) < 0)
        return -1;
    if (r)
        g->so.seed = ll < 0 ? UINT64_MAX : (uint64_t)ll;
    if (get_bool(root, "stream", &g->stream, b) < 0)
        return -1;
    const mf_json *so = mf_json_get(root, "stream_options");
    if (so && so->type != MF_JSON_NULL) {
        const mf_json *iu = mf_json_get(so, "include_usage");
        if (so->type != MF_JSON_OBJECT || so->n != (iu ? 1u : 0u) || (iu && iu->type != MF_JSON_BOOL))
            return badf(b, 400, "'stream_options' may only hold include_usage (a boolean; the "
                                "last chunk always carries usage)");
    }
    if ((r = get_int(root, "n", 1, 1, &ll, b)) < 0)
        return badf(b, 400, "'n': only 1 choice per request is supported");
    if (chat) {
        if (get_bool(root, "logprobs", &g->logprobs, b) < 0)
            return -1;
        if ((r = get_int(root, "top_logprobs", 0, SV_MAX_TOP, &ll, b)) < 0)
            return -1;
        if (r && !g->logprobs)
            return badf(b, 400, "'top_logprobs' needs 'logprobs': true");
        g->n_top = r ? (int32_t)ll : 0;
    } else {
        if ((r = get_int(root, "logprobs", 0, 5, &ll, b)) < 0)
            return -1;
        g->logprobs = r == 1;
        g->n_top = r ? (int32_t)ll : 0;
    }
    const mf_json *st = mf_json_get(root, "stop");
    if (st && st->type == MF_JSON_STRING) {
        if (st->len) {
            g->stop[0] = st->str;
            g->stop_len[0] = st->len;
            g->n_stop = 1;
        }
    } else if (st && st->type == MF_JSON_ARRAY) {
        if (st->n > SV_MAX_STOP)
            return badf(b, 400, "'stop' has %zu strings, more than %d", st->n, SV_MAX_STOP);
        for (size_t i = 0; i < st->n; i++) {
            const mf_json *s = &st->kids[i];
            if (s->type != MF_JSON_STRING)
                return badf(b, 400, "'stop[%zu]' must be a string, not %s", i,
                            mf_json_type_name(s->type));
            if (s->len) {
                g->stop[g->n_stop] = s->str;
                g->stop_len[g->n_stop++] = s->len;
            }
        }
    } else if (st && st->type != MF_JSON_NULL) {
        return badf(b, 400, "'stop' must be a string or an array of strings, not %s",
                    mf_json_type_name(st->type));
    }
    return 0;
}

/* ---- prompts as tokens ------------------------------------------------------------------------ */

typedef struct tokvec {
    int32_t *p;
    int64_t n, cap;
} tokvec;

/* Appends the tokens of text[0..len) (BOS when bos). */
static int tok_append(const minfer_model *m, tokvec *v, const char *text, size_t len, bool bos,
                      bool special, bad *b) {
    int64_t n = minfer_tokenize(m, text, len, bos, special, NULL, 0);
    if (n < 0)
        return badf(b, 400, "the prompt cannot be tokenized");
    if (v->n + n > v->cap) {
        v->cap = (v->n + n) * 2 + 16;
        v->p = mf_realloc(v->p, (size_t)v->cap * sizeof *v->p);
    }
    if (n && minfer_tokenize(m, text, len, bos, special, v->p + v->n, n) != n)
        return badf(b, 500, "tokenizer: the token count changed between two calls");
    v->n += n;
    return 0;
}

/* The completion prompt: a string (special tokens parsed, as `minfer run`),
 * token ids, or a one-element array of either. */
static int completion_tokens(server *sv, const mf_json *root, tokvec *v, bad *b) {
    const mf_json *p = mf_json_get(root, "prompt");
    if (!p)
        return badf(b, 400, "'prompt' is missing");
    if (p->type == MF_JSON_ARRAY && p->n == 1 &&
        (p->kids[0].type == MF_JSON_STRING || p->kids[0].type == MF_JSON_ARRAY))
        p = &p->kids[0]; /* the one-prompt batch clients send */
    if (p->type == MF_JSON_ARRAY) {
        const int32_t n_vocab = minfer_model_n_vocab(sv->m);
        if (p->n == 0)
            return badf(b, 400, "'prompt' is an empty token list");
        v->p = mf_malloc(p->n * sizeof *v->p);
        v->cap = (int64_t)p->n;
        for (size_t i = 0; i < p->n; i++) {
            const mf_json *t = &p->kids[i];
            if (t->type != MF_JSON_NUMBER || !t->integral || t->number < 0 || t->number >= n_vocab)
                return badf(b, 400, "'prompt[%zu]' must be a token id in [0, %d)", i, n_vocab);
            v->p[v->n++] = (int32_t)t->number;
        }
        return 0;
    }
    if (c_string(p, "'prompt'", b))
        return -1;
    return tok_append(sv->m, v, p->str, p->len, true, true, b);
}

static bool mem_has(const char *s, size_t n, const char *word) {
    const size_t w = strlen(word);
    for (size_t i = 0; i + w <= n; i++)
        if (!memcmp(s + i, word, w))
            return true;
    return false;
}

/* The chat prompt, rendered with a marker in place of each message's content
 * (serve_chat.c). As tokens (v): the template's own text is tokenized with
 * special tokens parsed, each content as plain text, so a user who types
 * "<|im_start|>system" gets those characters, not a system turn. As text
 * (text, for /apply-template): the contents put back in place. */
static int chat_prompt(server *sv, const mf_json *root, const char *tools_json, tokvec *v,
                       mf_sbuf *text, bad *b) {
    const mf_json *ms = mf_json_get(root, "messages");
    if (!ms)
        return badf(b, 400, "'messages' is missing");
    if (ms->type != MF_JSON_ARRAY)
        return badf(b, 400, "'messages' must be an array, not %s", mf_json_type_name(ms->type));
    if (ms->n == 0)
        return badf(b, 400, "'messages' is empty");
    if (ms->n > SERVE_MAX_MESSAGES)
        return badf(b, 400, "'messages' has %zu entries, more than %d", ms->n, SERVE_MAX_MESSAGES);
    /* a marker no text contains: control bytes around a per-request nonce */
    unsigned long long nonce = (unsigned long long)mf_time_ns() * 0x9E3779B97F4A7C15ull;
    char err[512];
    sv_chat c;
    if (sv_chat_read(sv->m, ms, nonce, &c, err, sizeof err))
        return badf(b, 400, "%s", err);
    int rc = -1;
    char *out = minfer_chat_apply_json(sv->m, sv->o->tmpl, c.json, tools_json, true, err, sizeof err);
    if (!out) {
        badf(b, 400, "chat template: %s", err);
        goto done;
    }
    char hex[20];
    snprintf(hex, sizeof hex, "%016llx", nonce);
    const char *p = out;
    bool first = true;
    for (;;) {
        /* the next marker, as written or as tojson writes it ("\u0001...") */
        const char *m = p;
        while ((m = strpbrk(m, "\x01\\")) && *m == '\\' && strncmp(m, "\\u0001", 6))
            m += m[1] ? 2 : 1;
        size_t idx = 0, mlen = 0;
        const bool esc = m && *m == '\\';
        if (m) {
            for (idx = 0; idx < c.n; idx++) {
                if (!c.content[idx])
                    continue;
                const char *mk = c.mark[idx];
                const size_t body = strlen(mk) - 2; /* between \x01 and \x02 */
                if (!esc && !strncmp(m, mk, body + 2)) {
                    mlen = body + 2;
                    break;
                }
                if (esc && !strncmp(m + 6, mk + 1, body) && !strncmp(m + 6 + body, "\\u0002", 6)) {
                    mlen = body + 12;
                    break;
                }
            }
            if (idx == c.n) {
                badf(b, 500, "chat template: a content marker came out altered");
                goto done;
            }
        }
        const size_t seg = m ? (size_t)(m - p) : strlen(p);
        if (mem_has(p, seg, hex)) {
            badf(b, 500, "chat template: a content marker came out altered");
            goto done;
        }
        if (text)
            mf_sbuf_add(text, p, seg);
        else if ((seg || first) && tok_append(sv->m, v, p, seg, first, true, b))
            goto done;
        first = false;
        if (!m)
            break;
        /* tojson's form stands for the content as a JSON string's inside */
        mf_sbuf js = {0};
        const char *ctext = c.content[idx];
        size_t clen = strlen(ctext);
        if (esc) {
            mf_json_add_string(&js, ctext, clen);
            ctext = js.p + 1;
            clen = js.n - 2;
        }
        if (text)
            mf_sbuf_add(text, ctext, clen);
        else if (tok_append(sv->m, v, ctext, clen, false, false, b)) {
            mf_sbuf_free(&js);
            goto done;
        }
        mf_sbuf_free(&js);
        p = m + mlen;
    }
    rc = 0;
done:
    sv_chat_free(&c);
    free(out);
    return rc;
}

/* ---- answers --------------------------------------------------------------------------------- */

typedef struct answer {
    conn *c;
    bool stream, chat;
    const char *id, *model_id;
    long long created;
    size_t sent;             /* text bytes streamed */
    int32_t probs_sent;      /* logprobs entries streamed */
    int32_t n_top;
    bool gone;               /* the client left */
} answer;

static void token_json(mf_sbuf *b, server *sv, int32_t tok) {
    char piece[256];
    int32_t n = minfer_token_to_piece(sv->m, tok, piece, sizeof piece);
    n = n < 0 ? 0 : n > (int32_t)sizeof piece ? (int32_t)sizeof piece : n;
    mf_json_add_string(b, piece, (size_t)n);
}

static void token_bytes(mf_sbuf *b, server *sv, int32_t tok) {
    char piece[256];
    int32_t n = minfer_token_to_piece(sv->m, tok, piece, sizeof piece);
    n = n < 0 ? 0 : n > (int32_t)sizeof piece ? (int32_t)sizeof piece : n;
    mf_sbuf_puts(b, "[");
    for (int32_t i = 0; i < n; i++)
        mf_sbuf_printf(b, "%s%u", i ? "," : "", (unsigned)(unsigned char)piece[i]);
    mf_sbuf_puts(b, "]");
}

/* The "logprobs" value of a choice for entries [from, to) of the job:
 * chat {"content":[{token, logprob, bytes, top_logprobs}]}, completions
 * {tokens, token_logprobs, top_logprobs, text_offset}. */
static void logprobs_json(mf_sbuf *b, server *sv, const answer *a, const sv_tokprob *pr,
                          const size_t *end, int32_t from, int32_t to, size_t offset0) {
    if (a->chat) {
        mf_sbuf_puts(b, "{\"content\":[");
        for (int32_t i = from; i < to; i++) {
            mf_sbuf_puts(b, i > from ? ",{\"token\":" : "{\"token\":");
            token_json(b, sv, pr[i].token);
            mf_sbuf_printf(b, ",\"logprob\":%.6g,\"bytes\":", (double)pr[i].logprob);
            token_bytes(b, sv, pr[i].token);
            mf_sbuf_puts(b, ",\"top_logprobs\":[");
            for (int32_t k = 0; k < pr[i].n_top; k++) {
                mf_sbuf_puts(b, k ? ",{\"token\":" : "{\"token\":");
                token_json(b, sv, pr[i].top[k]);
                mf_sbuf_printf(b, ",\"logprob\":%.6g,\"bytes\":", (double)pr[i].top_lp[k]);
                token_bytes(b, sv, pr[i].top[k]);
                mf_sbuf_puts(b, "}");
            }
            mf_sbuf_puts(b, "]}");
        }
        mf_sbuf_puts(b, "]}");
        return;
    }
    mf_sbuf_puts(b, "{\"tokens\":[");
    for (int32_t i = from; i < to; i++) {
        if (i > from)
            mf_sbuf_puts(b, ",");
        token_json(b, sv, pr[i].token);
    }
    mf_sbuf_puts(b, "],\"token_logprobs\":[");
    for (int32_t i = from; i < to; i++)
        mf_sbuf_printf(b, "%s%.6g", i > from ? "," : "", (double)pr[i].logprob);
    mf_sbuf_puts(b, "],\"top_logprobs\":[");
    for (int32_t i = from; i < to; i++) {
        mf_sbuf_puts(b, i > from ? ",{" : "{");
        for (int32_t k = 0; k < pr[i].n_top; k++) {
            if (k)
                mf_sbuf_puts(b, ",");
            token_json(b, sv, pr[i].top[k]);
            mf_sbuf_printf(b, ":%.6g", (double)pr[i].top_lp[k]);
        }
        mf_sbuf_puts(b, "}");
    }
    mf_sbuf_puts(b, "],\"text_offset\":[");
    /* where each token's text starts: the previous token's end */
    for (int32_t i = from; i < to; i++) {
        const size_t st = i == 0 ? 0 : end[i - 1];
        mf_sbuf_printf(b, "%s%zu", i > from ? "," : "", st + offset0);
    }
    mf_sbuf_puts(b, "]}");
}

/* One "data: {...}\n\n" event carrying text[0..n) and optional logprobs (and,
 * when finish is set, the finish reason and usage). false: the client is gone. */
static bool send_chunk(answer *a, server *sv, const char *text, size_t n, const char *finish,
                       const sv_job *j, const sv_tokprob *pr, const size_t *pe, int32_t p0,
                       int32_t p1, bool first) {
    mf_sbuf b = {0};
    mf_sbuf_printf(&b, "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", a->id,
                   a->chat ? "chat.completion.chunk" : "text_completion", a->created);
    mf_json_add_string(&b, a->model_id, strlen(a->model_id));
    mf_sbuf_puts(&b, ",\"choices\":[{\"index\":0,");
    if (a->chat) {
        mf_sbuf_puts(&b, "\"delta\":{");
        if (first)
            mf_sbuf_puts(&b, "\"role\":\"assistant\"");
        if (n || (first && !finish)) {
            mf_sbuf_puts(&b, first ? ",\"content\":" : "\"content\":");
            mf_json_add_string(&b, text, n);
        }
        mf_sbuf_puts(&b, "}");
    } else {
        mf_sbuf_puts(&b, "\"text\":");
        mf_json_add_string(&b, text, n);
    }
    mf_sbuf_puts(&b, ",\"logprobs\":");
    if (pr && p1 > p0)
        logprobs_json(&b, sv, a, pr, pe, p0, p1, 0);
    else
        mf_sbuf_puts(&b, "null");
    if (finish)
        mf_sbuf_printf(&b, ",\"finish_reason\":\"%s\"}]", finish);
    else
        mf_sbuf_puts(&b, ",\"finish_reason\":null}]");
    if (finish && j)
        mf_sbuf_printf(&b,
                       ",\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,"
                       "\"total_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}",
                       j->n_prompt, j->n_gen, j->n_prompt + j->n_gen, j->n_cached);
    mf_sbuf_puts(&b, "}\n\n");
    int rc = mf_http_send_all(a->c->fd, b.p, b.n);
    mf_sbuf_free(&b);
    if (rc)
        a->gone = true;
    return rc == 0;
}

/* The client closed its side (or reset): nothing more will be read. */
static bool client_gone(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0)
        return false;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP))
        return true;
    if (p.revents & POLLIN) {
        char c;
        ssize_t k = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return k == 0;
    }
    return false;
}

/* Waits for the job to end, streaming its text when a->stream; a client that
 * leaves cancels the job. Returns with the job done (or the client gone). */
static void follow_job(answer *a, server *sv, sv_job *j) {
    mf_sbuf chunk = {0};
    for (;;) {
        pthread_mutex_lock(&j->mu);
        if (j->state != SV_DONE && (!a->stream || j->ready <= a->sent)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000000L; /* the socket is looked at this often */
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        }
        const bool done = j->state == SV_DONE;
        size_t upto = j->ready;
        chunk.n = 0;
        int32_t p0 = a->probs_sent, p1 = p0;
        if (a->stream && upto > a->sent) {
            mf_sbuf_add(&chunk, j->text.p + a->sent, upto - a->sent);
            p1 = j->n_probs;
            /* the entries whose text is out */
            while (p1 > p0 && j->prob_end[p1 - 1] > upto)
                p1--;
        }
        sv_tokprob *pr = NULL;
        size_t *pe = NULL;
        if (p1 > p0) {
            pr = mf_malloc((size_t)p1 * sizeof *pr);
            pe = mf_malloc((size_t)p1 * sizeof *pe);
            memcpy(pr + p0, j->probs + p0, (size_t)(p1 - p0) * sizeof *pr);
            memcpy(pe, j->prob_end, (size_t)p1 * sizeof *pe);
        }
        pthread_mutex_unlock(&j->mu);
        if (chunk.n || p1 > p0) {
            if (!send_chunk(a, sv, chunk.p, chunk.n, NULL, NULL, pr, pe, p0, p1, false)) {
                atomic_store(&j->cancel, 1);
                free(pr);
                free(pe);
                break;
            }
            a->sent = upto;
            a->probs_sent = p1;
        }
        free(pr);
        free(pe);
        if (done)
            break;
        if (client_gone(a->c->fd)) {
            a->gone = true;
            atomic_store(&j->cancel, 1);
            break;
        }
    }
    mf_sbuf_free(&chunk);
    if (a->gone) { /* wait for the scheduler to let go (bounded by a step) */
        pthread_mutex_lock(&j->mu);
        while (j->state != SV_DONE)
            pthread_cond_wait(&j->cv, &j->mu);
        pthread_mutex_unlock(&j->mu);
    }
}

/* Waits while the job is queued, watching the socket. Returns true when it
 * left the queue (admitted or ended), false when the client left first. */
static bool wait_admitted(answer *a, sv_job *j) {
    for (;;) {
        pthread_mutex_lock(&j->mu);
        if (j->state == SV_QUEUED) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        }
        const bool queued = j->state == SV_QUEUED;
        pthread_mutex_unlock(&j->mu);
        if (!queued)
            return true;
        if (client_gone(a->c->fd)) {
            a->gone = true;
            atomic_store(&j->cancel, 1);
            pthread_mutex_lock(&j->mu);
            while (j->state != SV_DONE)
                pthread_cond_wait(&j->cv, &j->mu);
            pthread_mutex_unlock(&j->mu);
            return false;
        }
    }
}

/* POST /v1/completions and /v1/chat/completions. */
static int handle_completion(server *sv, conn *c, const mf_http_request *req, bool chat, char *log,
                             size_t log_cap) {
    bad b = {0};
    mf_json *root = NULL;
    tokvec tv = {0};
    sv_job *j = NULL;
    sv_constraint cons = {0};
    mf_error je = {{0}};
    int status = 200;
    if (!req->body_len) {
        badf(&b, 400, "the request has no body (a JSON object is expected)");
        goto fail;
    }
    root = mf_json_parse(req->body, req->body_len, &je);
    if (!root) {
        badf(&b, 400, "malformed JSON: %s", je.msg);
        goto fail;
    }
    if (root->type != MF_JSON_OBJECT) {
        badf(&b, 400, "the body must be a JSON object, not %s", mf_json_type_name(root->type));
        goto fail;
    }
    gen_params g;
    if (parse_params(sv->o, root, chat, &g, &b))
        goto fail;
    char cerr[400];
    if (sv_constraint_parse(root, chat, &cons, cerr, sizeof cerr)) {
        badf(&b, 400, "%s", cerr);
        goto fail;
    }
    if (cons.mode == SV_TOOLS_FORCED && g.stream) {
        badf(&b, 400, "'stream' with a forced 'tool_choice' is not supported (a tool call is "
                      "answered whole)");
        goto fail;
    }
    if (chat ? chat_prompt(sv, root, cons.tools_json, &tv, NULL, &b) : completion_tokens(sv, root, &tv, &b))
        goto fail;
    const int32_t n_ctx = sv_sched_n_ctx(sv->sched);
    if (tv.n == 0) {
        badf(&b, 400, "the prompt is empty");
        goto fail;
    }
    if (tv.n >= n_ctx) {
        badf(&b, 400, "the prompt has %lld tokens, more than the context of %d leaves room for",
             (long long)tv.n, n_ctx);
        goto fail;
    }
    j = sv_job_new();
    j->prompt = tv.p;
    j->n_prompt = (int32_t)tv.n;
    tv.p = NULL;
    j->so = g.so;
    j->greedy = g.greedy;
    j->max_tokens = g.max_tokens;
    for (int i = 0; i < g.n_stop; i++) {
        j->stop[i] = mf_malloc(g.stop_len[i] + 1);
        memcpy(j->stop[i], g.stop[i], g.stop_len[i] + 1);
        j->stop_len[i] = g.stop_len[i];
    }
    j->n_stop = g.n_stop;
    j->logprobs = g.logprobs;
    j->n_top = g.n_top;
    j->gbnf = cons.gbnf;
    cons.gbnf = NULL;
    if (g.max_tokens == 0) { /* nothing to generate: answered here */
        j->finish = "length";
        j->state = SV_DONE;
    } else {
        int q = sv_submit(sv->sched, j);
        if (q) {
            status = 503;
            if (q == 1)
                send_error(c, 503, "Retry-After: 1\r\n",
                           "the server is busy: every slot is taken and the queue is full");
            else
                send_error(c, 503, NULL, "the server is shutting down");
            snprintf(log, log_cap, ": %s", q == 1 ? "queue full" : "shutting down");
            c->keep = false;
            goto out;
        }
    }

    char id[64];
    unsigned long long nr = atomic_fetch_add(&sv->n_requests, 1) + 1;
    snprintf(id, sizeof id, "%s-%llx%04llx", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)time(NULL), nr & 0xffff);
    answer a = {.c = c, .stream = g.stream, .chat = chat, .id = id, .model_id = sv->model_id,
                .created = (long long)time(NULL), .n_top = g.n_top};
    if (g.stream && wait_admitted(&a, j)) {
        /* refused before it ran (shutdown, an error): a plain status, no stream */
        pthread_mutex_lock(&j->mu);
        const bool early = j->state == SV_DONE && !j->finish;
        pthread_mutex_unlock(&j->mu);
        if (early)
            g.stream = a.stream = false;
    }
    if (g.stream && !a.gone) {
        c->keep = false; /* an event stream ends with the connection */
        if (mf_http_start_events(c->fd) ||
            (chat && !send_chunk(&a, sv, "", 0, NULL, NULL, NULL, NULL, 0, 0, true))) {
            a.gone = true;
            atomic_store(&j->cancel, 1);
        }
    }
    if (!a.gone)
        follow_job(&a, sv, j);
    pthread_mutex_lock(&j->mu); /* done: nothing changes any more */
    pthread_mutex_unlock(&j->mu);
    if (a.gone) {
        snprintf(log, log_cap, " (client left after %d tokens)", j->n_gen);
        status = 499;
        goto out;
    }
    if (!j->finish) {
        status = j->err_status;
        snprintf(log, log_cap, ": %s", j->err);
        if (g.stream) {
            /* the text so far went out; the error event says why it ends here */
            if (j->text.n > a.sent)
                send_chunk(&a, sv, j->text.p + a.sent, j->text.n - a.sent, NULL, NULL, NULL, NULL, 0,
                           0, false);
            mf_sbuf e = {0};
            mf_sbuf_puts(&e, "data: ");
            error_json(&e, status, j->err);
            mf_sbuf_puts(&e, "\n\n");
            mf_http_send_all(c->fd, e.p, e.n);
            mf_sbuf_free(&e);
        } else {
            send_error(c, status, status == 503 ? "Retry-After: 1\r\n" : NULL, j->err);
        }
        goto out;
    }
    snprintf(log, log_cap, " (prompt %d, cached %d, generated %d, %s)", j->n_prompt, j->n_cached,
             j->n_gen, j->finish);
    if (g.stream) {
        bool live = true;
        if (j->text.n > a.sent || j->n_probs > a.probs_sent)
            live = send_chunk(&a, sv, j->text.p + a.sent, j->text.n - a.sent, NULL, NULL, j->probs,
                              j->prob_end, a.probs_sent, j->n_probs, false);
        if (live)
            live = send_chunk(&a, sv, "", 0, j->finish, j, NULL, NULL, 0, 0, false);
        if (live)
            mf_http_send_all(c->fd, "data: [DONE]\n\n", 14);
        goto out;
    }
    mf_sbuf r = {0};
    mf_sbuf_printf(&r, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", id,
                   chat ? "chat.completion" : "text_completion", a.created);
    mf_json_add_string(&r, sv->model_id, strlen(sv->model_id));
    mf_sbuf_puts(&r, ",\"choices\":[{\"index\":0,");
    const char *finish = j->finish;
    if (chat) {
        mf_sbuf calls = {0};
        char call_id[80];
        snprintf(call_id, sizeof call_id, "call_%s", id);
        mf_sbuf_puts(&r, "\"message\":{\"role\":\"assistant\",\"content\":");
        if (sv_tool_calls_json(&cons, j->text.p, j->text.n, call_id, &calls)) {
            mf_sbuf_puts(&r, "null,\"tool_calls\":");
            mf_sbuf_add(&r, calls.p, calls.n);
            finish = "tool_calls";
        } else {
            mf_json_add_string(&r, j->text.p, j->text.n);
        }
        mf_sbuf_free(&calls);
        mf_sbuf_puts(&r, "}");
    } else {
        mf_sbuf_puts(&r, "\"text\":");
        mf_json_add_string(&r, j->text.p, j->text.n);
    }
    mf_sbuf_puts(&r, ",\"logprobs\":");
    if (j->logprobs)
        logprobs_json(&r, sv, &a, j->probs, j->prob_end, 0, j->n_probs, 0);
    else
        mf_sbuf_puts(&r, "null");
    mf_sbuf_printf(&r,
                   ",\"finish_reason\":\"%s\"}],\"usage\":{\"prompt_tokens\":%d,"
                   "\"completion_tokens\":%d,\"total_tokens\":%d,"
                   "\"prompt_tokens_details\":{\"cached_tokens\":%d}}}",
                   finish, j->n_prompt, j->n_gen, j->n_prompt + j->n_gen, j->n_cached);
    send_json(c, 200, &r, NULL);
    mf_sbuf_free(&r);
    goto out;
fail:
    status = b.status;
    send_error(c, b.status, NULL, b.msg);
    snprintf(log, log_cap, ": %s", b.msg);
out:
    free(tv.p);
    sv_job_release(j);
    sv_constraint_free(&cons);
    mf_json_free(root);
    return status;
}

/* ---- the other endpoints ------------------------------------------------------------------ */

static mf_json *json_body(const mf_http_request *req, bad *b) {
    mf_error je = {{0}};
    if (!req->body_len)
        return badf(b, 400, "the request has no body (a JSON object is expected)"), NULL;
    mf_json *root = mf_json_parse(req->body, req->body_len, &je);
    if (!root)
        return badf(b, 400, "malformed JSON: %s", je.msg), NULL;
    if (root->type != MF_JSON_OBJECT) {
        badf(b, 400, "the body must be a JSON object, not %s", mf_json_type_name(root->type));
        mf_json_free(root);
        return NULL;
    }
    return root;
}

/* POST /apply-template {messages, tools, tool_choice} -> {prompt}: the text
 * a chat request would be prompted with (llama.cpp's endpoint). */
static int handle_apply_template(server *sv, conn *c, const mf_http_request *req) {
    bad b = {0};
    mf_json *root = json_body(req, &b);
    sv_constraint cons = {0};
    mf_sbuf text = {0};
    char cerr[400];
    for (size_t i = 0; root && !b.status && i < root->n; i++)
        if (strcmp(root->kids[i].key, "messages") && strcmp(root->kids[i].key, "tools") &&
            strcmp(root->kids[i].key, "tool_choice") && strcmp(root->kids[i].key, "model"))
            badf(&b, 400, "unknown field '%.60s'", root->kids[i].key);
    if (root && !b.status && sv_constraint_parse(root, true, &cons, cerr, sizeof cerr))
        badf(&b, 400, "%s", cerr);
    mf_sbuf_add(&text, "", 0);
    if (root && !b.status)
        (void)chat_prompt(sv, root, cons.tools_json, NULL, &text, &b);
    if (b.status) {
        send_error(c, b.status, NULL, b.msg);
    } else {
        mf_sbuf r = {0};
        mf_sbuf_puts(&r, "{\"prompt\":");
        mf_json_add_string(&r, text.p, text.n);
        mf_sbuf_puts(&r, "}");
        send_json(c, 200, &r, NULL);
        mf_sbuf_free(&r);
    }
    mf_sbuf_free(&text);
    sv_constraint_free(&cons);
    mf_json_free(root);
    return b.status ? b.status : 200;
}

/* POST /tokenize {content, add_special, parse_special} -> {tokens}. */
static int handle_tokenize(server *sv, conn *c, const mf_http_request *req) {
    bad b = {0};
    mf_json *root = json_body(req, &b);
    tokvec v = {0};
    bool add = false, special = true;
    const mf_json *ct = root ? mf_json_get(root, "content") : NULL;
    for (size_t i = 0; root && !b.status && i < root->n; i++)
        if (strcmp(root->kids[i].key, "content") && strcmp(root->kids[i].key, "add_special") &&
            strcmp(root->kids[i].key, "parse_special"))
            badf(&b, 400, "unknown field '%.60s'", root->kids[i].key);
    if (root && !b.status && !ct)
        badf(&b, 400, "'content' is missing");
    if (root && !b.status && (get_bool(root, "add_special", &add, &b) < 0 ||
                              get_bool(root, "parse_special", &special, &b) < 0 ||
                              c_string(ct, "'content'", &b) ||
                              tok_append(sv->m, &v, ct->str, ct->len, add, special, &b)))
        (void)0;
    if (b.status) {
        send_error(c, b.status, NULL, b.msg);
    } else {
        mf_sbuf r = {0};
        mf_sbuf_puts(&r, "{\"tokens\":[");
        for (int64_t i = 0; i < v.n; i++)
            mf_sbuf_printf(&r, "%s%d", i ? "," : "", v.p[i]);
        mf_sbuf_puts(&r, "]}");
        send_json(c, 200, &r, NULL);
        mf_sbuf_free(&r);
    }
    free(v.p);
    mf_json_free(root);
    return b.status ? b.status : 200;
}

/* POST /detokenize {tokens: [ids]} -> {content}. */
static int handle_detokenize(server *sv, conn *c, const mf_http_request *req) {
    bad b = {0};
    mf_json *root = json_body(req, &b);
    const mf_json *t = root ? mf_json_get(root, "tokens") : NULL;
    const int32_t n_vocab = minfer_model_n_vocab(sv->m);
    for (size_t i = 0; root && !b.status && i < root->n; i++)
        if (strcmp(root->kids[i].key, "tokens"))
            badf(&b, 400, "unknown field '%.60s'", root->kids[i].key);
    if (root && !b.status && (!t || t->type != MF_JSON_ARRAY))
        badf(&b, 400, "'tokens' must be an array of token ids");
    mf_sbuf text = {0};
    mf_sbuf_add(&text, "", 0);
    for (size_t i = 0; root && !b.status && i < t->n; i++) {
        const mf_json *k = &t->kids[i];
        if (k->type != MF_JSON_NUMBER || !k->integral || k->number < 0 || k->number >= n_vocab) {
            badf(&b, 400, "'tokens[%zu]' must be a token id in [0, %d)", i, n_vocab);
            break;
        }
        char piece[256];
        int32_t n = minfer_token_to_piece(sv->m, (int32_t)k->number, piece, sizeof piece);
        if (n > 0)
            mf_sbuf_add(&text, piece, (size_t)(n > (int32_t)sizeof piece ? (int32_t)sizeof piece : n));
    }
    if (b.status) {
        send_error(c, b.status, NULL, b.msg);
    } else {
        mf_sbuf r = {0};
        mf_sbuf_puts(&r, "{\"content\":");
        mf_json_add_string(&r, text.p, text.n);
        mf_sbuf_puts(&r, "}");
        send_json(c, 200, &r, NULL);
        mf_sbuf_free(&r);
    }
    mf_sbuf_free(&text);
    mf_json_free(root);
    return b.status ? b.status : 200;
}

static void props_json(server *sv, mf_sbuf *b) {
    mf_sbuf_puts(b, "{\"model\":");
    mf_json_add_string(b, sv->model_id, strlen(sv->model_id));
    mf_sbuf_puts(b, ",\"model_desc\":");
    const char *d = minfer_model_desc(sv->m);
    mf_json_add_string(b, d, strlen(d));
    mf_sbuf_printf(b,
                   ",\"backend\":\"%s\",\"n_ctx\":%d,\"n_ctx_train\":%d,\"n_vocab\":%d,"
                   "\"total_slots\":%d,\"queue_max\":%d,\"n_batch\":%d,\"prefill_chunk\":%d,"
                   "\"max_tokens_default\":%d,\"max_tokens_max\":%d,\"prompt_cache\":%s}",
                   minfer_model_backend(sv->m), sv_sched_n_ctx(sv->sched), minfer_model_n_ctx_train(sv->m),
                   minfer_model_n_vocab(sv->m), sv_sched_n_slots(sv->sched), sv->o->queue_max,
                   sv->o->n_batch, sv->o->chunk, sv->o->max_tokens_default, sv->o->max_tokens_max,
                   sv->o->no_prompt_cache ? "false" : "true");
}

/* ---- routing and the connections ------------------------------------------------------------ */

static int handle_request(server *sv, conn *c, const mf_http_request *req, char *log, size_t log_cap) {
    const char *p = req->path;
    const bool get = !strcmp(req->method, "GET"), post = !strcmp(req->method, "POST");
    char msg[1200];
    static const char *const gets[] = {"/health", "/v1/models", "/metrics", "/props", "/slots", NULL};
    static const char *const posts[] = {"/v1/completions", "/v1/chat/completions", "/tokenize",
                                        "/detokenize", "/apply-template", NULL};
    if (listed(gets, p)) {
        if (!get) {
            snprintf(msg, sizeof msg, "method %s is not allowed on %s (use GET)", req->method, p);
            send_error(c, 405, "Allow: GET\r\n", msg);
            return 405;
        }
        mf_sbuf b = {0};
        if (!strcmp(p, "/health")) {
            mf_sbuf_puts(&b, "{\"status\":\"ok\"}");
        } else if (!strcmp(p, "/metrics")) {
            sv_sched_metrics(sv->sched, &b);
            if (mf_http_respond_ka(c->fd, 200, "text/plain; version=0.0.4", NULL, b.p, b.n, c->keep))
                c->keep = false;
            mf_sbuf_free(&b);
            return 200;
        } else if (!strcmp(p, "/props")) {
            props_json(sv, &b);
        } else if (!strcmp(p, "/slots")) {
            sv_sched_slots_json(sv->sched, &b);
        } else {
            mf_sbuf_puts(&b, "{\"object\":\"list\",\"data\":[{\"id\":");
            mf_json_add_string(&b, sv->model_id, strlen(sv->model_id));
            mf_sbuf_puts(&b, ",\"object\":\"model\",\"created\":0,\"owned_by\":\"minfer\"}]}");
        }
        send_json(c, 200, &b, NULL);
        mf_sbuf_free(&b);
        return 200;
    }
    if (listed(posts, p)) {
        if (!post) {
            snprintf(msg, sizeof msg, "method %s is not allowed on %s (use POST)", req->method, p);
            send_error(c, 405, "Allow: POST\r\n", msg);
            return 405;
        }
        if (!strcmp(p, "/tokenize"))
            return handle_tokenize(sv, c, req);
        if (!strcmp(p, "/detokenize"))
            return handle_detokenize(sv, c, req);
        if (!strcmp(p, "/apply-template"))
            return handle_apply_template(sv, c, req);
        return handle_completion(sv, c, req, !strcmp(p, "/v1/chat/completions"), log, log_cap);
    }
    snprintf(msg, sizeof msg,
             "unknown path '%s' (known: /health, /metrics, /props, /slots, /v1/models, /tokenize, "
             "/detokenize, /apply-template, /v1/completions, /v1/chat/completions)",
             p);
    send_error(c, 404, NULL, msg);
    return 404;
}

static const char *endpoint_label(const char *path) {
    static const char *const known[] = {"/health", "/v1/models", "/metrics", "/props", "/slots",
                                        "/v1/completions", "/v1/chat/completions", "/tokenize",
                                        "/detokenize", "/apply-template", NULL};
    for (size_t i = 0; known[i]; i++)
        if (!strcmp(known[i], path))
            return known[i];
    return "other";
}

static void *conn_main(void *arg) {
    conn *c = arg;
    server *sv = c->sv;
    /* A client that stops reading cannot hold its thread longer than this. */
    struct timeval tv = {.tv_sec = sv->o->timeout_s};
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    mf_http_limits lim = {.max_body = SERVE_MAX_BODY,
                          .timeout_ms = sv->o->timeout_s * 1000,
                          .idle_ms = sv->o->idle_s * 1000,
                          .stop = &g_stop};
    bool drain = false;
    for (c->keep = true; c->keep && !g_stop;) {
        mf_http_request req;
        int status = 0;
        char why[512], log[600] = "";
        int r = mf_http_read_request(c->fd, &lim, &req, &status, why, sizeof why);
        uint64_t t0 = mf_time_ns();
        if (r == 1)
            break;
        if (r < 0) {
            c->keep = false;
            send_error(c, status, NULL, why);
            fprintf(stderr, "serve: bad request: %d %s\n", status, why);
            sv_sched_count_request(sv->sched, "bad_request", status);
            drain = true;
            break;
        }
        c->keep = req.keep_alive;
        status = handle_request(sv, c, &req, log, sizeof log);
        sv_sched_count_request(sv->sched, endpoint_label(req.path), status);
        if (strcmp(req.path, "/health") && strcmp(req.path, "/metrics"))
            fprintf(stderr, "serve: %s %s %d %.0f ms%s\n", req.method, req.path, status,
                    (double)(mf_time_ns() - t0) / 1e6, log);
        mf_http_request_free(&req);
    }
    mf_http_close(c->fd, drain);
    pthread_mutex_lock(&sv->mu);
    sv->n_conns--;
    pthread_cond_broadcast(&sv->conns_cv);
    pthread_mutex_unlock(&sv->mu);
    free(c);
    return NULL;
}

/* Binds and listens on host:port. Returns the socket, or -1 with a message
 * printed. *bound gets "ADDR:PORT" as a URL authority. */
static int listen_on(const char *host, int port, char *bound, size_t bound_cap) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    int rc = getaddrinfo(host, ports, &hints, &res);
    if (rc) {
        fprintf(stderr, "serve: cannot resolve host '%s': %s\n", host, gai_strerror(rc));
        return -1;
    }
    int fd = -1, last_errno = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0)
            break;
        last_errno = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        fprintf(stderr, "serve: cannot listen on %s port %d: %s\n", host, port,
                strerror(last_errno));
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char addr[INET6_ADDRSTRLEN] = "?";
    int p = port;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *in = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &in->sin_addr, addr, sizeof addr);
            p = ntohs(in->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &in6->sin6_addr, addr, sizeof addr);
            p = ntohs(in6->sin6_port);
        }
    }
    snprintf(bound, bound_cap, ss.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", addr, p);
    return fd;
}

/* The model id: --alias, else the file name without ".gguf". */
static void model_id(const serve_opts *o, char *out, size_t cap) {
    if (o->alias) {
        snprintf(out, cap, "%s", o->alias);
        return;
    }
    const char *base = strrchr(o->model, '/');
    base = base ? base + 1 : o->model;
    size_t n = strlen(base);
    if (n > 5 && !strcmp(base + n - 5, ".gguf"))
        n -= 5;
    snprintf(out, cap, "%.*s", (int)n, base);
}

int mf_cmd_serve(int argc, char **argv) {
    serve_opts o;
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    server sv = {.o = &o};
    pthread_mutex_init(&sv.mu, NULL);
    pthread_cond_init(&sv.conns_cv, NULL);
    model_id(&o, sv.model_id, sizeof sv.model_id);
    char err[512];
    struct stat st;
    if (stat(o.model, &st) != 0) {
        fprintf(stderr, "serve: model file '%s' not found\n", o.model);
        return 1;
    }
    minfer_model_options mo;
    minfer_model_options_default(&mo);
    mo.path = o.model;
    mo.n_threads = o.n_threads;
    mo.device = o.device;
    mo.n_gpu_layers = o.n_gpu_layers;
    mo.chat_template = o.tmpl;
    sv.m = minfer_model_load(&mo, err, sizeof err);
    if (!sv.m) {
        fprintf(stderr, "serve: %s\n", err);
        return 1;
    }
    int32_t train = minfer_model_n_ctx_train(sv.m);
    sv_sched_opts so = {.n_slots = o.parallel,
                        .n_ctx = o.n_ctx ? o.n_ctx : (train < 4096 ? train : 4096),
                        .n_batch = o.n_batch,
                        .chunk = o.chunk,
                        .queue_max = o.queue_max,
                        .n_blocks = o.kv_blocks,
                        .cache_type = o.ctk,
                        .cache_type_v = o.ctv,
                        .flash_attn_off = o.fa_off,
                        .prompt_cache = !o.no_prompt_cache,
                        .grace_ms = o.grace_s * 1000};
    sv.sched = sv_sched_new(sv.m, &so, err, sizeof err);
    if (!sv.sched) {
        fprintf(stderr, "serve: %s\n", err);
        minfer_model_free(sv.m);
        return 1;
    }

    /* Handlers without SA_RESTART: a signal interrupts poll() at once. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    char bound[INET6_ADDRSTRLEN + 16];
    int lfd = listen_on(o.host, o.port, bound, sizeof bound);
    if (lfd < 0) {
        sv_sched_free(sv.sched);
        minfer_model_free(sv.m);
        return 1;
    }
    fprintf(stderr, "serve: model %s (%s on %s), context %d, %d slots, queue %d\n", sv.model_id,
            minfer_model_desc(sv.m), minfer_model_backend(sv.m), sv_sched_n_ctx(sv.sched), o.parallel,
            o.queue_max);
    fprintf(stderr, "serve: listening on http://%s\n", bound);
    fflush(stderr);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 << 10);
    while (!g_stop) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        int r = poll(&p, 1, 500);
        if (r <= 0)
            continue; /* timeout, or EINTR from the stop signal */
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue; /* the client left before we got to it */
        pthread_mutex_lock(&sv.mu);
        const bool room = sv.n_conns < SERVE_MAX_CONNS;
        if (room)
            sv.n_conns++;
        pthread_mutex_unlock(&sv.mu);
        conn *c = mf_calloc(1, sizeof *c);
        c->sv = &sv;
        c->fd = fd;
        pthread_t th;
        if (!room || pthread_create(&th, &attr, conn_main, c)) {
            if (room) {
                pthread_mutex_lock(&sv.mu);
                sv.n_conns--;
                pthread_mutex_unlock(&sv.mu);
            }
            send_error(c, 503, "Retry-After: 1\r\n", "too many connections");
            mf_http_close(fd, true);
            free(c);
        }
    }
    pthread_attr_destroy(&attr);
    /* stop accepting; queued requests get 503, running ones the grace period */
    close(lfd);
    fprintf(stderr, "serve: shutting down\n");
    sv_sched_shutdown(sv.sched);
    const uint64_t until = mf_time_ns() + ((uint64_t)o.grace_s + (uint64_t)o.timeout_s + 5) * 1000000000ull;
    pthread_mutex_lock(&sv.mu);
    while (sv.n_conns > 0 && mf_time_ns() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&sv.conns_cv, &sv.mu, &ts);
    }
    const int left = sv.n_conns;
    pthread_mutex_unlock(&sv.mu);
    if (left) { /* a thread stuck in a send: its process ends with us */
        fprintf(stderr, "serve: %d connections still open at exit\n", left);
        return 0;
    }
    sv_sched_free(sv.sched);
    minfer_model_free(sv.m);
    return 0;
}
