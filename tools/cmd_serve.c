/* cmd_serve.c - `minfer serve`: an HTTP server with OpenAI-style completion
 * endpoints over one model and one session.
 *
 * One request at a time: the accept loop serves a connection to the end
 * before it accepts the next, so concurrent clients queue in the listen
 * backlog (never a 503). The session is reset for every request. Uses only
 * include/minfer.h, plus http.h and json.h for the wire formats. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
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
#include "tools.h"

#define SERVE_MAX_BODY (1u << 20) /* request bodies above this: 413 */
#define SERVE_MAX_STOP 4          /* "stop" strings per request, as in the OpenAI API */
#define SERVE_MAX_MESSAGES 1024

typedef struct serve_opts {
    const char *model, *host, *alias, *tmpl, *ctk, *device;
    int32_t port, n_ctx, n_threads, n_batch, n_gpu_layers, parallel, timeout_s;
} serve_opts;

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: minfer serve [-m MODEL] [options]\n"
            "Serves the model over HTTP/1.1, one request at a time (others wait in the\n"
            "listen queue); the session is reset for every request. Prints\n"
            "\"serve: listening on http://HOST:PORT\" on stderr once it accepts requests;\n"
            "SIGINT or SIGTERM stops it cleanly.\n\n"
            "endpoints:\n"
            "  GET  /health                {\"status\":\"ok\"}\n"
            "  GET  /v1/models             the model id\n"
            "  POST /v1/completions        {prompt, max_tokens (16), temperature, top_k, top_p,\n"
            "                               min_p, seed, stop, stream, presence_penalty,\n"
            "                               frequency_penalty, repeat_penalty}\n"
            "  POST /v1/chat/completions   {messages: [{role, content}], max_tokens (until end\n"
            "                               of turn), same sampling fields}\n"
            "  Unset sampling fields take minfer run's defaults (temperature 0.8, top_k 40,\n"
            "  top_p 0.95, min_p 0.05, random seed); temperature 0 is greedy. \"stream\": true\n"
            "  answers with Server-Sent Events ending in \"data: [DONE]\". Bodies above 1 MiB\n"
            "  are refused (413); errors are JSON {\"error\": {\"message\", \"type\", \"code\"}}.\n\n"
            "options:\n"
            "  -m, --model FILE         GGUF model (default: $MINFER_MODEL or %s)\n"
            "      --host ADDR          address to listen on (default 127.0.0.1)\n"
            "      --port N             TCP port (default 8080; 0: any free port)\n"
            "      --alias NAME         model id in responses (default: the file name)\n"
            "  -c, --ctx-size N         context length (default 0: min(model, 4096))\n"
            "  -b, --batch-size N       prefill batch (default 512)\n"
            "  -t, --threads N          CPU threads (default 0: all cores)\n"
            "  -ctk, --cache-type TYPE  KV cache type f32, f16, q8_0 (default f32)\n"
            "  -ngl, --n-gpu-layers N   -1 all layers on the GPU, 0 none\n"
            "      --device NAME        cpu, cuda, auto (default auto)\n"
            "      --chat-template NAME chatml, llama3, llama2, gemma, phi3, zephyr "
            "(default: the model's)\n"
            "      --parallel N         requests served at once: only 1 is supported\n"
            "      --timeout N          seconds a client has to send its request (default 10)\n"
            "  -h, --help               this text\n",
            MF_DEFAULT_MODEL);
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
    o->parallel = 1;
    o->timeout_s = 10;
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
            INT(o->n_batch, 1, INT32_MAX);
        } else if (VAL("-t") || VAL("--threads")) {
            INT(o->n_threads, 0, 4096);
        } else if (VAL("-ctk") || VAL("--cache-type")) {
            STR(o->ctk);
        } else if (VAL("-ngl") || VAL("--n-gpu-layers")) {
            INT(o->n_gpu_layers, -1, INT32_MAX);
        } else if (VAL("--device")) {
            STR(o->device);
        } else if (VAL("--chat-template")) {
            STR(o->tmpl);
            if (minfer_chat_template_check(o->tmpl, e.msg, sizeof e.msg)) return mf_arg_fail(cmd, &e);
        } else if (VAL("--parallel")) {
            INT(o->parallel, 1, 1);
        } else if (VAL("--timeout")) {
            INT(o->timeout_s, 1, 3600);
        } else {
            mf_errorf(&e, "unknown option '%s' (see 'minfer serve --help')", a);
            return mf_arg_fail(cmd, &e);
        }
#undef VAL
#undef STR
#undef INT
    }
    if (!o->model)
        o->model = mf_default_model();
    return 0;
}

/* ---- server state and responses ------------------------------------------------------ */

typedef struct server {
    const serve_opts *o;
    minfer_model *m;
    minfer_session *s;
    char model_id[256];
    unsigned long long n_requests;
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

static void send_json(int fd, int status, const mf_sbuf *b, const char *extra_headers) {
    mf_http_respond(fd, status, "application/json", extra_headers, b->p, b->n);
}

static void send_error(int fd, int status, const char *extra_headers, const char *msg) {
    mf_sbuf b = {0};
    error_json(&b, status, msg);
    send_json(fd, status, &b, extra_headers);
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
    int32_t max_tokens;
    bool stream;
    const char *stop[SERVE_MAX_STOP];
    size_t stop_len[SERVE_MAX_STOP];
    int n_stop;
} gen_params;

static int parse_params(const mf_json *root, bool chat, gen_params *g, bad *b) {
    double d = 0;
    long long ll;
    int r;
    memset(g, 0, sizeof *g);
    minfer_sampler_options_default(&g->so);
    g->max_tokens = chat ? -1 : 16;
    if ((r = get_int(root, "max_tokens", 0, INT32_MAX, &ll, b)) < 0)
        return -1;
    if (r)
        g->max_tokens = (int32_t)ll;
    if (chat && (r = get_int(root, "max_completion_tokens", 0, INT32_MAX, &ll, b)) != 0) {
        if (r < 0)
            return -1;
        g->max_tokens = (int32_t)ll;
    }
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
    if ((r = get_int(root, "n", 1, 1, &ll, b)) < 0)
        return badf(b, 400, "'n': only 1 choice per request is supported");
    const mf_json *st = mf_json_get(root, "stop");
    if (st && st->type == MF_JSON_STRING) {
        if (st->len) {
            g->stop[0] = st->str;
            g->stop_len[0] = st->len;
            g->n_stop = 1;
        }
    } else if (st && st->type == MF_JSON_ARRAY) {
        if (st->n > SERVE_MAX_STOP)
            return badf(b, 400, "'stop' has %zu strings, more than %d", st->n, SERVE_MAX_STOP);
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

/* The text of a message's content: a string, or an array of {"type":"text",
 * "text":...} parts, concatenated. Returns a malloc'd string or NULL. */
static char *message_content(const mf_json *c, size_t idx, bad *b) {
    char what[64];
    snprintf(what, sizeof what, "'messages[%zu].content'", idx);
    if (c->type == MF_JSON_STRING) {
        if (c_string(c, what, b))
            return NULL;
        return mf_strdup(c->str);
    }
    if (c->type == MF_JSON_NULL)
        return mf_strdup("");
    if (c->type != MF_JSON_ARRAY) {
        badf(b, 400, "%s must be a string or an array of text parts, not %s", what,
             mf_json_type_name(c->type));
        return NULL;
    }
    mf_sbuf out = {0};
    mf_sbuf_add(&out, "", 0);
    for (size_t i = 0; i < c->n; i++) {
        const mf_json *part = &c->kids[i];
        const mf_json *type = mf_json_get(part, "type"), *text = mf_json_get(part, "text");
        if (part->type != MF_JSON_OBJECT || !type || type->type != MF_JSON_STRING ||
            strcmp(type->str, "text") != 0 || !text) {
            badf(b, 400, "%s[%zu] must be an object {\"type\": \"text\", \"text\": ...}", what,
                 i);
            mf_sbuf_free(&out);
            return NULL;
        }
        if (c_string(text, what, b)) {
            mf_sbuf_free(&out);
            return NULL;
        }
        mf_sbuf_add(&out, text->str, text->len);
    }
    return out.p;
}

/* The prompt of a request: "prompt", or "messages" through the chat
 * template. Returns a malloc'd string or NULL. */
static char *request_prompt(server *sv, const mf_json *root, bool chat, bad *b) {
    if (!chat) {
        const mf_json *p = mf_json_get(root, "prompt");
        if (!p)
            return badf(b, 400, "'prompt' is missing"), NULL;
        if (p->type == MF_JSON_ARRAY && p->n == 1)
            p = &p->kids[0]; /* ["text"]: the one-prompt batch clients send */
        if (c_string(p, "'prompt'", b))
            return NULL;
        return mf_strdup(p->str);
    }
    const mf_json *ms = mf_json_get(root, "messages");
    if (!ms)
        return badf(b, 400, "'messages' is missing"), NULL;
    if (ms->type != MF_JSON_ARRAY)
        return badf(b, 400, "'messages' must be an array, not %s", mf_json_type_name(ms->type)),
               NULL;
    if (ms->n == 0)
        return badf(b, 400, "'messages' is empty"), NULL;
    if (ms->n > SERVE_MAX_MESSAGES)
        return badf(b, 400, "'messages' has %zu entries, more than %d", ms->n,
                    SERVE_MAX_MESSAGES),
               NULL;
    minfer_chat_message *msgs = mf_calloc(ms->n, sizeof *msgs);
    char *out = NULL;
    size_t i;
    for (i = 0; i < ms->n; i++) {
        const mf_json *m = &ms->kids[i];
        char what[64];
        if (m->type != MF_JSON_OBJECT) {
            badf(b, 400, "'messages[%zu]' must be an object, not %s", i,
                 mf_json_type_name(m->type));
            goto done;
        }
        const mf_json *role = mf_json_get(m, "role"), *content = mf_json_get(m, "content");
        snprintf(what, sizeof what, "'messages[%zu].role'", i);
        if (!role) {
            badf(b, 400, "%s is missing", what);
            goto done;
        }
        if (c_string(role, what, b))
            goto done;
        if (strcmp(role->str, "system") && strcmp(role->str, "user") &&
            strcmp(role->str, "assistant") && strcmp(role->str, "developer")) {
            badf(b, 400, "%s '%.40s' is not system, user, assistant or developer", what,
                 role->str);
            goto done;
        }
        if (!content) {
            badf(b, 400, "'messages[%zu].content' is missing", i);
            goto done;
        }
        /* "developer" is the newer OpenAI name of the system role. */
        msgs[i].role = strcmp(role->str, "developer") ? role->str : "system";
        if (!(msgs[i].content = message_content(content, i, b)))
            goto done;
    }
    char err[512];
    out = minfer_chat_apply(sv->m, sv->o->tmpl, msgs, (int32_t)ms->n, true, err, sizeof err);
    if (!out)
        badf(b, 400, "chat template: %s", err);
done:
    for (size_t j = 0; j < ms->n; j++)
        free((char *)msgs[j].content);
    free(msgs);
    return out;
}

/* ---- generation ---------------------------------------------------------------------------- */

typedef struct gen_ctx {
    int fd;
    bool stream, chat;
    const gen_params *g;
    const char *id, *model_id;
    long long created;
    mf_sbuf text;          /* the completion so far (cut at a stop string) */
    size_t sent;           /* bytes of text already streamed */
    bool hit_stop, client_gone, interrupted;
} gen_ctx;

/* One "data: {...}\n\n" event carrying text[0..n) (and, when finish is set,
 * the finish reason and usage). Returns -1 when the client is gone. */
static int send_chunk(gen_ctx *c, const char *text, size_t n, const char *finish,
                      const minfer_generate_stats *st, bool first) {
    mf_sbuf b = {0};
    mf_sbuf_printf(&b, "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", c->id,
                   c->chat ? "chat.completion.chunk" : "text_completion", c->created);
    mf_json_add_string(&b, c->model_id, strlen(c->model_id));
    mf_sbuf_puts(&b, ",\"choices\":[{\"index\":0,");
    if (c->chat) {
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
        mf_sbuf_puts(&b, ",\"logprobs\":null");
    }
    if (finish)
        mf_sbuf_printf(&b, ",\"finish_reason\":\"%s\"}]", finish);
    else
        mf_sbuf_puts(&b, ",\"finish_reason\":null}]");
    if (finish && st)
        mf_sbuf_printf(&b,
                       ",\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,"
                       "\"total_tokens\":%d}",
                       st->n_prompt, st->n_generated, st->n_prompt + st->n_generated);
    mf_sbuf_puts(&b, "}\n\n");
    int rc = mf_http_send_all(c->fd, b.p, b.n);
    mf_sbuf_free(&b);
    if (rc)
        c->client_gone = true;
    return rc;
}

/* Bytes at the end of text that could still grow into a stop string: the
 * longest suffix that is a proper prefix of one. Streaming holds them back. */
static size_t stop_holdback(const gen_ctx *c) {
    size_t best = 0;
    for (int i = 0; i < c->g->n_stop; i++) {
        size_t sl = c->g->stop_len[i];
        for (size_t k = sl - 1; k > best; k--)
            if (k <= c->text.n && !memcmp(c->text.p + c->text.n - k, c->g->stop[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

static bool on_token(void *user, int32_t token, const char *text, size_t len) {
    gen_ctx *c = user;
    (void)token;
    if (c->hit_stop || c->client_gone)
        return false;
    size_t old = c->text.n;
    mf_sbuf_add(&c->text, text, len);
    /* A stop string ends the text where it starts; only the new bytes (and
     * the tail of the old ones a match could start in) need searching. */
    size_t cut = SIZE_MAX;
    for (int i = 0; i < c->g->n_stop; i++) {
        size_t sl = c->g->stop_len[i];
        size_t from = old >= sl - 1 ? old - (sl - 1) : 0;
        for (size_t p = from; p + sl <= c->text.n && p < cut; p++)
            if (!memcmp(c->text.p + p, c->g->stop[i], sl)) {
                cut = p;
                break;
            }
    }
    if (cut != SIZE_MAX) {
        c->text.n = cut;
        c->text.p[cut] = 0;
        c->hit_stop = true;
    }
    if (c->stream) {
        size_t upto = c->hit_stop ? c->text.n : c->text.n - stop_holdback(c);
        if (upto > c->sent) {
            if (send_chunk(c, c->text.p + c->sent, upto - c->sent, NULL, NULL, false))
                return false;
            c->sent = upto;
        }
    }
    if (g_stop) {
        c->interrupted = true;
        return false;
    }
    return !c->hit_stop;
}

/* POST /v1/completions and /v1/chat/completions. */
static int handle_completion(server *sv, int fd, const mf_http_request *req, bool chat,
                             char *log, size_t log_cap) {
    bad b = {0};
    mf_json *root = NULL;
    char *prompt = NULL;
    minfer_sampler *smp = NULL;
    gen_ctx c = {0};
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
    if (parse_params(root, chat, &g, &b))
        goto fail;
    if (!(prompt = request_prompt(sv, root, chat, &b)))
        goto fail;
    int32_t n_ctx = minfer_session_n_ctx(sv->s);
    int64_t nt = minfer_tokenize(sv->m, prompt, strlen(prompt), true, true, NULL, 0);
    if (nt < 0) {
        badf(&b, 400, "the prompt cannot be tokenized");
        goto fail;
    }
    if (nt == 0) {
        badf(&b, 400, "the prompt is empty");
        goto fail;
    }
    if (nt > n_ctx) {
        badf(&b, 400, "the prompt has %lld tokens, more than the context of %d", (long long)nt,
             n_ctx);
        goto fail;
    }

    char id[64];
    sv->n_requests++;
    snprintf(id, sizeof id, "%s-%llx%04llx", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)time(NULL), sv->n_requests & 0xffff);
    c = (gen_ctx){.fd = fd, .stream = g.stream, .chat = chat, .g = &g, .id = id,
                  .model_id = sv->model_id, .created = (long long)time(NULL)};
    mf_sbuf_add(&c.text, "", 0);
    minfer_session_reset(sv->s);
    smp = minfer_sampler_new(&g.so);
    if (g.stream) {
        /* A chat stream opens with the assistant role, as OpenAI's does. */
        if (mf_http_start_events(fd) || (chat && send_chunk(&c, "", 0, NULL, NULL, true))) {
            status = 499; /* the client left before the answer */
            goto out;
        }
    }
    char err[512];
    minfer_generate_stats st = {0};
    if (minfer_generate(sv->s, smp, prompt, g.max_tokens, on_token, &c, &st, err, sizeof err)) {
        if (g.stream) {
            mf_sbuf e = {0};
            mf_sbuf_puts(&e, "data: ");
            error_json(&e, 500, err);
            mf_sbuf_puts(&e, "\n\n");
            mf_http_send_all(fd, e.p, e.n);
            mf_sbuf_free(&e);
            status = 500;
            goto out;
        }
        badf(&b, 500, "generation failed: %s", err);
        goto fail;
    }
    const char *finish =
        c.hit_stop || st.stopped_eog || c.interrupted ? "stop"
        : (g.max_tokens >= 0 && st.n_generated >= g.max_tokens) || st.stopped_ctx ? "length"
                                                                                   : "stop";
    snprintf(log, log_cap, " (prompt %d, generated %d, %s)", st.n_prompt, st.n_generated, finish);
    if (g.stream) {
        if (!c.client_gone) {
            /* Held-back bytes that never became a stop string are text. */
            if (c.text.n > c.sent)
                send_chunk(&c, c.text.p + c.sent, c.text.n - c.sent, NULL, NULL, false);
            if (!c.client_gone)
                send_chunk(&c, "", 0, finish, &st, false);
            if (!c.client_gone)
                mf_http_send_all(fd, "data: [DONE]\n\n", 14);
        }
        status = c.client_gone ? 499 : 200;
        goto out;
    }
    mf_sbuf r = {0};
    mf_sbuf_printf(&r, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", id,
                   chat ? "chat.completion" : "text_completion", c.created);
    mf_json_add_string(&r, sv->model_id, strlen(sv->model_id));
    mf_sbuf_puts(&r, ",\"choices\":[{\"index\":0,");
    if (chat) {
        mf_sbuf_puts(&r, "\"message\":{\"role\":\"assistant\",\"content\":");
        mf_json_add_string(&r, c.text.p, c.text.n);
        mf_sbuf_puts(&r, "}");
    } else {
        mf_sbuf_puts(&r, "\"text\":");
        mf_json_add_string(&r, c.text.p, c.text.n);
        mf_sbuf_puts(&r, ",\"logprobs\":null");
    }
    mf_sbuf_printf(&r,
                   ",\"finish_reason\":\"%s\"}],\"usage\":{\"prompt_tokens\":%d,"
                   "\"completion_tokens\":%d,\"total_tokens\":%d}}",
                   finish, st.n_prompt, st.n_generated, st.n_prompt + st.n_generated);
    send_json(fd, 200, &r, NULL);
    mf_sbuf_free(&r);
    goto out;
fail:
    status = b.status;
    send_error(fd, b.status, NULL, b.msg);
    snprintf(log, log_cap, ": %s", b.msg);
out:
    mf_sbuf_free(&c.text);
    minfer_sampler_free(smp);
    free(prompt);
    mf_json_free(root);
    return status;
}

/* ---- routing and the accept loop ------------------------------------------------------------ */

static int handle_request(server *sv, int fd, const mf_http_request *req, char *log,
                          size_t log_cap) {
    const char *p = req->path;
    bool get = !strcmp(req->method, "GET"), post = !strcmp(req->method, "POST");
    char msg[1200];
    if (!strcmp(p, "/health") || !strcmp(p, "/v1/models")) {
        if (!get) {
            snprintf(msg, sizeof msg, "method %s is not allowed on %s (use GET)", req->method, p);
            send_error(fd, 405, "Allow: GET\r\n", msg);
            return 405;
        }
        mf_sbuf b = {0};
        if (!strcmp(p, "/health")) {
            mf_sbuf_puts(&b, "{\"status\":\"ok\"}");
        } else {
            mf_sbuf_puts(&b, "{\"object\":\"list\",\"data\":[{\"id\":");
            mf_json_add_string(&b, sv->model_id, strlen(sv->model_id));
            mf_sbuf_puts(&b, ",\"object\":\"model\",\"created\":0,\"owned_by\":\"minfer\"}]}");
        }
        send_json(fd, 200, &b, NULL);
        mf_sbuf_free(&b);
        return 200;
    }
    bool compl = !strcmp(p, "/v1/completions"), chat = !strcmp(p, "/v1/chat/completions");
    if (compl || chat) {
        if (!post) {
            snprintf(msg, sizeof msg, "method %s is not allowed on %s (use POST)", req->method,
                     p);
            send_error(fd, 405, "Allow: POST\r\n", msg);
            return 405;
        }
        return handle_completion(sv, fd, req, chat, log, log_cap);
    }
    snprintf(msg, sizeof msg,
             "unknown path '%s' (known: /health, /v1/models, /v1/completions, "
             "/v1/chat/completions)",
             p);
    send_error(fd, 404, NULL, msg);
    return 404;
}

static void serve_connection(server *sv, int fd) {
    /* A client that stops reading cannot hold the server longer than this. */
    struct timeval tv = {.tv_sec = sv->o->timeout_s};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    mf_http_limits lim = {.max_body = SERVE_MAX_BODY,
                          .timeout_ms = sv->o->timeout_s * 1000,
                          .stop = &g_stop};
    mf_http_request req;
    int status = 0;
    char why[512], log[600] = "";
    uint64_t t0 = mf_time_ns();
    int r = mf_http_read_request(fd, &lim, &req, &status, why, sizeof why);
    if (r == 1) {
        mf_http_close(fd, false);
        return;
    }
    if (r < 0) {
        send_error(fd, status, NULL, why);
        fprintf(stderr, "serve: bad request: %d %s\n", status, why);
        mf_http_close(fd, true);
        return;
    }
    status = handle_request(sv, fd, &req, log, sizeof log);
    fprintf(stderr, "serve: %s %s %d %.0f ms%s\n", req.method, req.path, status,
            (double)(mf_time_ns() - t0) / 1e6, log);
    mf_http_request_free(&req);
    mf_http_close(fd, false);
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
    sv.m = minfer_model_load(&mo, err, sizeof err);
    if (!sv.m) {
        fprintf(stderr, "serve: %s\n", err);
        return 1;
    }
    minfer_session_options so;
    minfer_session_options_default(&so);
    int32_t train = minfer_model_n_ctx_train(sv.m);
    so.n_ctx = o.n_ctx ? o.n_ctx : (train < 4096 ? train : 4096);
    so.n_batch = o.n_batch;
    so.cache_type = o.ctk;
    sv.s = minfer_session_new(sv.m, &so, err, sizeof err);
    if (!sv.s) {
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
        minfer_session_free(sv.s);
        minfer_model_free(sv.m);
        return 1;
    }
    fprintf(stderr, "serve: model %s (%s on %s), context %d\n", sv.model_id,
            minfer_model_desc(sv.m), minfer_model_backend(sv.m), minfer_session_n_ctx(sv.s));
    fprintf(stderr, "serve: listening on http://%s\n", bound);
    fflush(stderr);
    while (!g_stop) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        int r = poll(&p, 1, 500);
        if (r <= 0)
            continue; /* timeout, or EINTR from the stop signal */
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue; /* the client left before we got to it */
        serve_connection(&sv, fd);
    }
    fprintf(stderr, "serve: shutting down\n");
    close(lfd);
    minfer_session_free(sv.s);
    minfer_model_free(sv.m);
    return 0;
}
