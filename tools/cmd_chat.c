/* cmd_chat.c - the conversation loop of `minfer chat` and `run -cnv`.
 *
 * The context holds the rendered conversation as text (kv_text); each turn
 * renders the whole history with the chat template and prefills only what
 * follows kv_text (or everything again, after a reset, when the template
 * renders the history differently). When the history no longer leaves room
 * for an answer, the oldest turns after the system message are dropped and
 * the rest is prefilled again (the context shift). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen.h"
#include "json.h"
#include "lineedit.h"
#include "runopts.h"

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

typedef struct chat {
    const run_opts *o;
    minfer_model *m;
    minfer_session *s;
    minfer_sampler *smp;
    minfer_chat_message *msgs; /* role: a literal; content: owned */
    int n, cap;
    char *kv_text;             /* what the context holds, as text */
    char *ans;                 /* the answer being streamed */
    size_t ans_n, ans_cap;
    mf_gen_result total;
} chat;

static const char *role_name(const char *r) {
    return !strcmp(r, "system") ? "system" : !strcmp(r, "user") ? "user" : "assistant";
}

static int add_msg(chat *c, const char *role, const char *text) {
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 16;
        minfer_chat_message *nm = realloc(c->msgs, (size_t)cap * sizeof *nm);
        if (!nm)
            return -1;
        c->msgs = nm;
        c->cap = cap;
    }
    char *dup = strdup(text);
    if (!dup)
        return -1;
    c->msgs[c->n++] = (minfer_chat_message){role_name(role), dup};
    return 0;
}

static void clear_msgs(chat *c, bool keep_system) {
    int w = 0;
    for (int i = 0; i < c->n; i++) {
        if (keep_system && !strcmp(c->msgs[i].role, "system"))
            c->msgs[w++] = c->msgs[i];
        else
            free((char *)c->msgs[i].content);
    }
    c->n = w;
}

static void reset_context(chat *c) {
    minfer_session_reset(c->s);
    free(c->kv_text);
    c->kv_text = strdup("");
}

/* Drops the oldest turn after the system message (a user message and the
 * answer that follows it). False when nothing can be dropped. */
static bool drop_oldest(chat *c) {
    int first = 0;
    while (first < c->n && !strcmp(c->msgs[first].role, "system"))
        first++;
    if (first >= c->n - 1) /* keep the message being answered */
        return false;
    int end = first + 1;
    while (end < c->n - 1 && strcmp(c->msgs[end].role, "user"))
        end++;
    for (int i = first; i < end; i++)
        free((char *)c->msgs[i].content);
    memmove(c->msgs + first, c->msgs + end, (size_t)(c->n - end) * sizeof *c->msgs);
    c->n -= end - first;
    return true;
}

static void on_text(void *user, const char *text, size_t len) {
    chat *c = user;
    if (c->ans_n + len + 1 > c->ans_cap) {
        size_t cap = (c->ans_n + len + 1) * 2;
        char *nb = realloc(c->ans, cap);
        if (!nb)
            return;
        c->ans = nb;
        c->ans_cap = cap;
    }
    memcpy(c->ans + c->ans_n, text, len);
    c->ans_n += len;
    c->ans[c->ans_n] = 0;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

/* ---- /save and /load ------------------------------------------------------------- */

static int save(const chat *c, const char *path) {
    mf_sbuf b = {0};
    mf_sbuf_puts(&b, "{\"messages\": [");
    for (int i = 0; i < c->n; i++) {
        mf_sbuf_puts(&b, i ? ",\n  {\"role\": " : "\n  {\"role\": ");
        mf_json_add_string(&b, c->msgs[i].role, strlen(c->msgs[i].role));
        mf_sbuf_puts(&b, ", \"content\": ");
        mf_json_add_string(&b, c->msgs[i].content, strlen(c->msgs[i].content));
        mf_sbuf_puts(&b, "}");
    }
    mf_sbuf_puts(&b, "\n]}\n");
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(b.p, 1, b.n, f) == b.n;
    if (f && fclose(f))
        ok = false;
    mf_sbuf_free(&b);
    if (!ok) {
        fprintf(stderr, "chat: /save: cannot write '%s'\n", path);
        return -1;
    }
    fprintf(stderr, "chat: saved %d messages to '%s'\n", c->n, path);
    return 0;
}

/* Replaces the conversation with the file's; on any problem the current one
 * stays and one line says what is wrong. */
static int load(chat *c, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "chat: /load: cannot open '%s': %s\n", path, strerror(errno));
        return -1;
    }
    mf_sbuf b = {0};
    char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0)
        mf_sbuf_add(&b, buf, k);
    fclose(f);
    mf_error e = {{0}};
    mf_json *j = mf_json_parse(b.p ? b.p : "", b.n, &e);
    mf_sbuf_free(&b);
    if (!j) {
        fprintf(stderr, "chat: /load: '%s': %s\n", path, e.msg);
        return -1;
    }
    const mf_json *arr = mf_json_get(j, "messages");
    const char *bad = NULL;
    size_t at = 0;
    if (!arr || arr->type != MF_JSON_ARRAY)
        bad = "no \"messages\" array";
    for (at = 0; !bad && at < arr->n; at++) {
        const mf_json *r = mf_json_get(&arr->kids[at], "role");
        const mf_json *t = mf_json_get(&arr->kids[at], "content");
        if (!r || r->type != MF_JSON_STRING ||
            (strcmp(r->str, "system") && strcmp(r->str, "user") && strcmp(r->str, "assistant")))
            bad = "a role that is not system, user or assistant";
        else if (!t || t->type != MF_JSON_STRING || strlen(t->str) != t->len)
            bad = "a content that is not a string (or holds NUL)";
        for (size_t kk = 0; !bad && kk < arr->kids[at].n; kk++)
            if (strcmp(arr->kids[at].kids[kk].key, "role") &&
                strcmp(arr->kids[at].kids[kk].key, "content"))
                bad = "a field other than role and content (chat has no tool calls)";
    }
    if (bad) {
        fprintf(stderr, "chat: /load: '%s': message %zu: %s\n", path, at ? at - 1 : 0, bad);
        mf_json_free(j);
        return -1;
    }
    clear_msgs(c, false);
    for (size_t i = 0; i < arr->n; i++)
        add_msg(c, mf_json_get(&arr->kids[i], "role")->str,
                mf_json_get(&arr->kids[i], "content")->str);
    mf_json_free(j);
    reset_context(c);
    fprintf(stderr, "chat: loaded %d messages from '%s'\n", c->n, path);
    return 0;
}

/* ---- one turn -------------------------------------------------------------------- */

static int64_t count_tokens(const chat *c, const char *text) {
    return minfer_tokenize(c->m, text, strlen(text), true, true, NULL, 0);
}

/* Renders the conversation so that it leaves room for an answer, dropping old
 * turns when needed. NULL (said on stderr) when even the last message alone
 * does not fit. */
static char *render_fitting(chat *c) {
    char err[512];
    const int32_t n_ctx = minfer_session_n_ctx(c->s);
    const int32_t room = c->o->n_predict > 0 && c->o->n_predict < n_ctx / 2 ? c->o->n_predict
                                                                           : n_ctx / 4;
    for (;;) {
        char *full = minfer_chat_apply(c->m, c->o->tmpl, c->msgs, c->n, true, err, sizeof err);
        if (!full) {
            fprintf(stderr, "chat: %s\n", err);
            return NULL;
        }
        int64_t nt = count_tokens(c, full);
        if (nt + room <= n_ctx)
            return full;
        if (!drop_oldest(c)) {
            if (nt < n_ctx)
                return full; /* no older turn left: answer in what remains */
            fprintf(stderr, "chat: the message needs %lld tokens, the context has %d\n",
                    (long long)nt, n_ctx);
            free(full);
            return NULL;
        }
        fprintf(stderr, "[context shift: the oldest turn is dropped]\n");
        reset_context(c);
    }
}

/* Answers the last (user) message. Returns 0, or -1 on an engine error. */
static int answer(chat *c) {
    char err[512];
    char *full = render_fitting(c);
    if (!full) {
        free((char *)c->msgs[c->n - 1].content);
        c->n--;
        return 0;
    }
    size_t kl = strlen(c->kv_text);
    const char *delta = full + kl;
    const int32_t past = minfer_session_n_past(c->s);
    /* Start over when the history renders differently, or when the new part,
     * tokenized on its own, would not fit after what the context holds. */
    if (strncmp(full, c->kv_text, kl) != 0 ||
        past + minfer_tokenize(c->m, delta, strlen(delta), past == 0, true, NULL, 0) >
            minfer_session_n_ctx(c->s)) {
        minfer_session_reset(c->s);
        delta = full;
    }
    c->ans_n = 0;
    if (c->ans)
        c->ans[0] = 0;
    const run_opts *o = c->o;
    mf_gen_opts go = {.n_predict = o->n_predict,
                      .ignore_eos = o->ignore_eos,
                      .n_rev = o->n_rev,
                      .n_keep = -2,
                      .stop = &interrupted,
                      .progress = isatty(2) && !o->log_disable,
                      .n_batch = o->n_batch,
                      .out = on_text,
                      .user = c};
    memcpy(go.rev, o->rev, sizeof go.rev);
    interrupted = 0;
    mf_gen_result r;
    struct sigaction sa = {0}, old;
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);
    int rc = mf_gen_run(c->m, c->s, c->smp, delta, &go, &r, err, sizeof err);
    sigaction(SIGINT, &old, NULL);
    fputc('\n', stdout);
    fflush(stdout);
    if (rc) {
        fprintf(stderr, "chat: %s\n", err);
        free(full);
        return -1;
    }
    if (r.interrupted)
        fprintf(stderr, "[stopped]\n");
    c->total.n_prompt += r.n_prompt;
    c->total.n_generated += r.n_generated;
    c->total.prompt_ms += r.prompt_ms;
    c->total.gen_ms += r.gen_ms;
    const char *ans = c->ans ? c->ans : "";
    char *kv = malloc(strlen(full) + strlen(ans) + 1);
    if (kv) {
        strcpy(kv, full);
        strcat(kv, ans);
        free(c->kv_text);
        c->kv_text = kv;
    }
    free(full);
    add_msg(c, "assistant", ans);
    if (r.stopped_ctx) {
        /* The next turn drops old turns to make room instead of exiting. */
        fprintf(stderr, "[context full at %d tokens: older turns will be dropped]\n",
                minfer_session_n_ctx(c->s));
        reset_context(c);
    }
    return 0;
}

static void help(void) {
    fprintf(stderr, "commands:\n"
                    "  /help        this text\n"
                    "  /exit        leave (also /quit, Ctrl-D, Ctrl-C at an empty prompt)\n"
                    "  /clear       forget the conversation (the system message stays)\n"
                    "  /save FILE   write the conversation as JSON {\"messages\": [...]}\n"
                    "  /load FILE   replace the conversation with a saved one\n"
                    "  //text       send '/text' as a message\n"
                    "keys: Left/Right, Home/End, Backspace/Delete, Up/Down (history),\n"
                    "Ctrl-U / Ctrl-K (kill), Ctrl-C (stop an answer / clear the line).\n");
}

/* A /command; 1 to leave the loop, 0 otherwise. */
static int command(chat *c, const char *line) {
    const char *arg = strchr(line, ' ');
    size_t n = arg ? (size_t)(arg - line) : strlen(line);
    while (arg && *arg == ' ')
        arg++;
#define IS(w) (n == strlen(w) && !strncmp(line, w, n))
    if (IS("/exit") || IS("/quit"))
        return 1;
    if (IS("/help")) {
        help();
    } else if (IS("/clear")) {
        clear_msgs(c, true);
        reset_context(c);
        fprintf(stderr, "chat: conversation cleared\n");
    } else if (IS("/save") || IS("/load")) {
        if (!arg || !*arg)
            fprintf(stderr, "chat: %.*s needs a file name\n", (int)n, line);
        else if (IS("/save"))
            save(c, arg);
        else
            load(c, arg);
    } else {
        fprintf(stderr, "chat: unknown command '%.*s' (/help lists them)\n", (int)n, line);
    }
#undef IS
    return 0;
}

/* One line of a pipe without its newline (malloc'd), or NULL at EOF. */
static char *read_line(FILE *f) {
    size_t cap = 256, n = 0;
    char *s = malloc(cap);
    int ch = EOF;
    while (s && (ch = fgetc(f)) != EOF && ch != '\n') {
        if (n + 2 > cap) {
            char *ns = realloc(s, cap *= 2);
            if (!ns) {
                free(s);
                return NULL;
            }
            s = ns;
        }
        s[n++] = (char)ch;
    }
    if (!s || (n == 0 && ch == EOF)) {
        free(s);
        return NULL;
    }
    if (n && s[n - 1] == '\r')
        n--;
    s[n] = 0;
    return s;
}

int mf_chat_loop(const run_opts *o, minfer_model *m, minfer_session *s, minfer_sampler *smp) {
    chat c = {.o = o, .m = m, .s = s, .smp = smp, .kv_text = strdup("")};
    const bool tty = isatty(0) && isatty(1);
    mf_lineedit *le = tty ? mf_le_new(0, 1) : NULL;
    const char *prompt = o->color ? "\x1b[32m> " : "> ";
    int rc = 0;
    if (o->sys)
        add_msg(&c, "system", o->sys);
    if (tty)
        fprintf(stderr, "chat: /help for commands, /exit or Ctrl-D to leave\n");
    for (;;) {
        char *line = NULL;
        if (le) {
            mf_le_status st = mf_le_read(le, prompt, &line);
            if (o->color)
                fputs("\x1b[0m", stdout);
            if (st != MF_LE_LINE) /* Ctrl-D, or Ctrl-C at an empty prompt */
                break;
        } else {
            line = read_line(stdin);
            if (!line)
                break;
        }
        if (!line || !*line) {
            free(line);
            continue;
        }
        if (le)
            mf_le_history_add(le, line);
        if (line[0] == '/' && line[1] != '/') {
            int leave = command(&c, line);
            free(line);
            if (leave)
                break;
            continue;
        }
        int bad = add_msg(&c, "user", line[0] == '/' ? line + 1 : line);
        free(line);
        if (bad || answer(&c)) {
            rc = 1;
            break;
        }
    }
    if (rc == 0)
        mf_run_print_stats(o, m, &c.total);
    clear_msgs(&c, false);
    free(c.msgs);
    free(c.kv_text);
    free(c.ans);
    mf_le_free(le);
    return rc;
}
