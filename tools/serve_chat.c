/* serve_chat.c - OpenAI chat messages -> the template's messages array. */
#include "serve_chat.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_constrain.h"

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* A string a template prints as it is: a C string without U+0001 (the
 * marker's first byte) and without the text of a special token, which the
 * rendered prompt's tokenizer would turn into that control token. */
static int plain_string(const minfer_model *m, const mf_json *v, const char *what, char *err,
                        size_t errlen) {
    if (v->type != MF_JSON_STRING)
        return fail(err, errlen, "%s must be a string, not %s", what, mf_json_type_name(v->type));
    if (strlen(v->str) != v->len)
        return fail(err, errlen, "%s contains a NUL character (\\u0000)", what);
    if (memchr(v->str, '\x01', v->len))
        return fail(err, errlen, "%s contains the control character U+0001", what);
    int64_t a = minfer_tokenize(m, v->str, v->len, false, true, NULL, 0);
    int64_t b = minfer_tokenize(m, v->str, v->len, false, false, NULL, 0);
    bool same = a == b && a >= 0;
    if (same && a > 0) {
        int32_t *ta = malloc((size_t)a * 2 * sizeof *ta);
        if (!ta)
            return fail(err, errlen, "%s: out of memory", what);
        same = minfer_tokenize(m, v->str, v->len, false, true, ta, a) == a &&
               minfer_tokenize(m, v->str, v->len, false, false, ta + a, a) == a &&
               !memcmp(ta, ta + a, (size_t)a * sizeof *ta);
        free(ta);
    }
    if (!same)
        return fail(err, errlen, "%s contains the text of a special token", what);
    return 0;
}

/* Every string (keys too) inside a tool call's arguments. */
static int plain_tree(const minfer_model *m, const mf_json *v, const char *what, char *err,
                      size_t errlen) {
    if (v->type == MF_JSON_STRING)
        return plain_string(m, v, what, err, errlen);
    for (size_t i = 0; (v->type == MF_JSON_ARRAY || v->type == MF_JSON_OBJECT) && i < v->n; i++) {
        if (v->type == MF_JSON_OBJECT) {
            mf_json key = {.type = MF_JSON_STRING, .str = v->kids[i].key, .len = v->kids[i].key_len};
            if (plain_string(m, &key, what, err, errlen))
                return -1;
        }
        if (plain_tree(m, &v->kids[i], what, err, errlen))
            return -1;
    }
    return 0;
}

/* The text of a content: a string, or an array of {"type":"text","text":...}
 * parts concatenated. malloc'd, or NULL with err set. */
static char *content_text(const mf_json *c, const char *what, char *err, size_t errlen) {
    if (c->type == MF_JSON_STRING) {
        if (strlen(c->str) != c->len)
            return fail(err, errlen, "%s contains a NUL character (\\u0000)", what), NULL;
        return mf_strdup(c->str);
    }
    if (c->type != MF_JSON_ARRAY)
        return fail(err, errlen, "%s must be a string or an array of text parts, not %s", what,
                    mf_json_type_name(c->type)),
               NULL;
    mf_sbuf out = {0};
    mf_sbuf_add(&out, "", 0);
    for (size_t i = 0; i < c->n; i++) {
        const mf_json *part = &c->kids[i];
        const mf_json *type = mf_json_get(part, "type"), *text = mf_json_get(part, "text");
        if (part->type != MF_JSON_OBJECT || !type || type->type != MF_JSON_STRING ||
            strcmp(type->str, "text") != 0 || !text || text->type != MF_JSON_STRING ||
            strlen(text->str) != text->len) {
            mf_sbuf_free(&out);
            return fail(err, errlen,
                        "%s[%zu] must be an object {\"type\": \"text\", \"text\": \"...\"}", what, i),
                   NULL;
        }
        mf_sbuf_add(&out, text->str, text->len);
    }
    return out.p;
}

/* One tool call: {"id", "type": "function", "function": {"name", "arguments"}}
 * written with the arguments as a JSON object (parsed when given as the
 * OpenAI JSON string). */
static int tool_call(const minfer_model *m, const mf_json *tc, const char *at, mf_sbuf *o,
                     char *err, size_t errlen) {
    char what[96];
    if (tc->type != MF_JSON_OBJECT)
        return fail(err, errlen, "'%s' must be an object, not %s", at, mf_json_type_name(tc->type));
    for (size_t k = 0; k < tc->n; k++)
        if (strcmp(tc->kids[k].key, "id") && strcmp(tc->kids[k].key, "type") &&
            strcmp(tc->kids[k].key, "function"))
            return fail(err, errlen, "'%s.%.40s' is not supported", at, tc->kids[k].key);
    const mf_json *id = mf_json_get(tc, "id"), *type = mf_json_get(tc, "type"),
                  *fn = mf_json_get(tc, "function");
    snprintf(what, sizeof what, "'%s.id'", at);
    if (!id)
        return fail(err, errlen, "%s is missing", what);
    if (plain_string(m, id, what, err, errlen))
        return -1;
    if (!id->len)
        return fail(err, errlen, "%s is empty", what);
    if (type && (type->type != MF_JSON_STRING || strcmp(type->str, "function")))
        return fail(err, errlen, "'%s.type' must be \"function\"", at);
    if (!fn || fn->type != MF_JSON_OBJECT)
        return fail(err, errlen, "'%s.function' must be an object {\"name\", \"arguments\"}", at);
    for (size_t k = 0; k < fn->n; k++)
        if (strcmp(fn->kids[k].key, "name") && strcmp(fn->kids[k].key, "arguments"))
            return fail(err, errlen, "'%s.function.%.40s' is not supported", at, fn->kids[k].key);
    const mf_json *name = mf_json_get(fn, "name"), *args = mf_json_get(fn, "arguments");
    snprintf(what, sizeof what, "'%s.function.name'", at);
    if (!name)
        return fail(err, errlen, "%s is missing", what);
    if (plain_string(m, name, what, err, errlen))
        return -1;
    if (!name->len)
        return fail(err, errlen, "%s is empty", what);
    snprintf(what, sizeof what, "'%s.function.arguments'", at);
    if (!args)
        return fail(err, errlen, "%s is missing", what);
    mf_json *parsed = NULL;
    if (args->type == MF_JSON_STRING) {
        mf_error je = {{0}};
        parsed = mf_json_parse(args->str, args->len, &je);
        if (!parsed)
            return fail(err, errlen, "%s is not JSON: %s", what, je.msg);
        if (parsed->type != MF_JSON_OBJECT) {
            mf_json_free(parsed);
            return fail(err, errlen, "%s must hold a JSON object", what);
        }
        args = parsed;
    } else if (args->type != MF_JSON_OBJECT) {
        return fail(err, errlen, "%s must be a JSON object or its text, not %s", what,
                    mf_json_type_name(args->type));
    }
    if (plain_tree(m, args, what, err, errlen)) {
        mf_json_free(parsed);
        return -1;
    }
    mf_sbuf_puts(o, "{\"id\":");
    sv_json_write(o, id);
    mf_sbuf_puts(o, ",\"type\":\"function\",\"function\":{\"name\":");
    sv_json_write(o, name);
    mf_sbuf_puts(o, ",\"arguments\":");
    sv_json_write(o, args);
    mf_sbuf_puts(o, "}}");
    mf_json_free(parsed);
    return 0;
}

/* Whether id names a tool call of an assistant message before message i. */
static bool earlier_call(const mf_json *ms, size_t i, const mf_json *id) {
    for (size_t j = 0; j < i; j++) {
        const mf_json *calls = mf_json_get(&ms->kids[j], "tool_calls");
        for (size_t k = 0; calls && calls->type == MF_JSON_ARRAY && k < calls->n; k++) {
            const mf_json *cid = mf_json_get(&calls->kids[k], "id");
            if (cid && cid->type == MF_JSON_STRING && cid->len == id->len &&
                !memcmp(cid->str, id->str, id->len))
                return true;
        }
    }
    return false;
}

static int message(const minfer_model *m, const mf_json *ms, size_t i, unsigned long long nonce,
                   sv_chat *c, mf_sbuf *o, char *err, size_t errlen) {
    const mf_json *msg = &ms->kids[i];
    char what[96];
    if (msg->type != MF_JSON_OBJECT)
        return fail(err, errlen, "'messages[%zu]' must be an object, not %s", i,
                    mf_json_type_name(msg->type));
    const mf_json *role = mf_json_get(msg, "role"), *ct = mf_json_get(msg, "content"),
                  *name = mf_json_get(msg, "name"), *calls = mf_json_get(msg, "tool_calls"),
                  *call_id = mf_json_get(msg, "tool_call_id");
    snprintf(what, sizeof what, "'messages[%zu].role'", i);
    if (!role)
        return fail(err, errlen, "%s is missing", what);
    if (role->type != MF_JSON_STRING)
        return fail(err, errlen, "%s must be a string, not %s", what, mf_json_type_name(role->type));
    const char *r = role->str;
    if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") &&
        strcmp(r, "developer") && strcmp(r, "tool"))
        return fail(err, errlen, "%s '%.40s' is not system, user, assistant, tool or developer",
                    what, r);
    const bool assistant = !strcmp(r, "assistant"), tool = !strcmp(r, "tool");
    for (size_t k = 0; k < msg->n; k++) {
        const char *key = msg->kids[k].key;
        if (!strcmp(key, "role") || !strcmp(key, "content") || !strcmp(key, "name"))
            continue;
        if (!strcmp(key, "tool_calls") && !assistant)
            return fail(err, errlen, "'messages[%zu].tool_calls' is only for assistant messages", i);
        if (!strcmp(key, "tool_call_id") && !tool)
            return fail(err, errlen, "'messages[%zu].tool_call_id' is only for tool messages", i);
        if (strcmp(key, "tool_calls") && strcmp(key, "tool_call_id"))
            return fail(err, errlen, "'messages[%zu].%.40s' is not supported", i, key);
    }
    if (calls && calls->type == MF_JSON_NULL)
        calls = NULL;
    /* "developer" is the newer OpenAI name of the system role. */
    mf_sbuf_puts(o, "{\"role\":");
    mf_json_add_string(o, strcmp(r, "developer") ? r : "system", strlen(strcmp(r, "developer") ? r : "system"));
    if (name) {
        snprintf(what, sizeof what, "'messages[%zu].name'", i);
        if (plain_string(m, name, what, err, errlen))
            return -1;
        mf_sbuf_puts(o, ",\"name\":");
        sv_json_write(o, name);
    }
    if (tool) {
        snprintf(what, sizeof what, "'messages[%zu].tool_call_id'", i);
        if (!call_id)
            return fail(err, errlen, "%s is missing", what);
        if (plain_string(m, call_id, what, err, errlen))
            return -1;
        if (!earlier_call(ms, i, call_id))
            return fail(err, errlen, "%s '%.40s' names no tool call of an earlier assistant message",
                        what, call_id->str);
        mf_sbuf_puts(o, ",\"tool_call_id\":");
        sv_json_write(o, call_id);
    }
    snprintf(what, sizeof what, "'messages[%zu].content'", i);
    if (!ct && !(assistant && calls))
        return fail(err, errlen, "%s is missing", what);
    if ((!ct || ct->type == MF_JSON_NULL) && assistant && calls) {
        /* OpenAI's null content beside tool calls is the empty text: templates
         * that test or concatenate content (Qwen3's `in content`) fail on
         * None, and "" is as falsy for the ones that check it */
        mf_sbuf_puts(o, ",\"content\":\"\"");
    } else if (ct) {
        /* null content elsewhere is the empty text, as before tool calls */
        char *text = ct->type == MF_JSON_NULL ? mf_strdup("") : content_text(ct, what, err, errlen);
        if (!text)
            return -1;
        if (strchr(text, '\x01')) {
            free(text);
            return fail(err, errlen, "%s contains the control character U+0001", what);
        }
        mf_sbuf_puts(o, ",\"content\":");
        if (*text) {
            snprintf(c->mark[i], SV_MARK_LEN, "\x01%016llx.%zu\x02", nonce, i);
            c->content[i] = text;
            mf_json_add_string(o, c->mark[i], strlen(c->mark[i]));
        } else {
            /* no marker: an empty content must stay falsy for the template */
            free(text);
            mf_sbuf_puts(o, "\"\"");
        }
    }
    if (calls) {
        if (calls->type != MF_JSON_ARRAY || !calls->n)
            return fail(err, errlen, "'messages[%zu].tool_calls' must be a non-empty array", i);
        mf_sbuf_puts(o, ",\"tool_calls\":[");
        for (size_t k = 0; k < calls->n; k++) {
            char at[64];
            snprintf(at, sizeof at, "messages[%zu].tool_calls[%zu]", i, k);
            if (k)
                mf_sbuf_puts(o, ",");
            if (tool_call(m, &calls->kids[k], at, o, err, errlen))
                return -1;
        }
        mf_sbuf_puts(o, "]");
        c->has_tools = 1;
    }
    if (tool)
        c->has_tools = 1;
    mf_sbuf_puts(o, "}");
    return 0;
}

int sv_chat_read(const minfer_model *m, const mf_json *ms, unsigned long long nonce, sv_chat *c,
                 char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    c->n = ms->n;
    c->content = mf_calloc(ms->n, sizeof *c->content);
    c->mark = mf_calloc(ms->n, sizeof *c->mark);
    mf_sbuf o = {0};
    mf_sbuf_puts(&o, "[");
    for (size_t i = 0; i < ms->n; i++) {
        if (i)
            mf_sbuf_puts(&o, ",");
        if (message(m, ms, i, nonce, c, &o, err, errlen)) {
            mf_sbuf_free(&o);
            sv_chat_free(c);
            return -1;
        }
    }
    mf_sbuf_puts(&o, "]");
    c->json = o.p;
    return 0;
}

void sv_chat_free(sv_chat *c) {
    for (size_t i = 0; c->content && i < c->n; i++)
        free(c->content[i]);
    free(c->content);
    free(c->mark);
    free(c->json);
    memset(c, 0, sizeof *c);
}
