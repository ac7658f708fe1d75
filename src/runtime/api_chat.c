/* api_chat.c - chat formatting for the public API: the model's own Jinja
 * template (tokenizer.chat_template) by default, the built-in renderers of
 * src/tokenizer/chat.c when a name is given or the GGUF has no template. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

static void set_err(char *err, size_t errlen, const mf_error *e) {
    if (err && errlen)
        snprintf(err, errlen, "%s", e->msg);
}

static bool contains(const char *s, size_t n, const char *word) {
    const size_t w = strlen(word);
    for (size_t i = 0; i + w <= n; i++)
        if (!memcmp(s + i, word, w))
            return true;
    return false;
}

static char *token_text(const mf_tokenizer *t, int32_t id) {
    return mf_strdup(id >= 0 ? mf_token_text(t, id) : "");
}

/* The variables every render gets besides messages and tools. */
static mf_jv base_ctx(const minfer_model *mm, mf_arena *a, bool add_assistant) {
    mf_jv ctx = mf_jv_dict(a);
    mf_jv_dict_setc(a, ctx, "add_generation_prompt", mf_jv_bool(add_assistant));
    mf_jv_dict_setc(a, ctx, "bos_token", mf_jv_cstr(a, mm->bos_text));
    mf_jv_dict_setc(a, ctx, "eos_token", mf_jv_cstr(a, mm->eos_text));
    return ctx;
}

/* Renders ctx with the model's template. A leading BOS text is dropped when
 * the tokenizer adds BOS itself, so the prompt does not start with two. */
static char *render(const minfer_model *mm, mf_jv ctx, mf_error *e) {
    char *out;
    size_t n;
    if (mf_jinja_render(mm->jinja, ctx, &out, &n, e)) {
        mf_error_prefix(e, "chat template");
        return NULL;
    }
    size_t bl = strlen(mm->bos_text);
    if (bl && mf_tokenizer_add_bos(mm->tok) && n >= bl && !memcmp(out, mm->bos_text, bl))
        memmove(out, out + bl, n - bl + 1);
    return out;
}

int mf_rt_chat_init(minfer_model *mm, bool builtin_only, mf_error *err) {
    mm->bos_text = token_text(mm->tok, mf_token_bos(mm->tok));
    mm->eos_text = token_text(mm->tok, mf_token_eos(mm->tok));
    mf_str src = {0};
    if (builtin_only)
        return 0;
    if (mf_gguf_get_str(mm->m->gguf, "tokenizer.chat_template", &src, NULL) != 0 || !src.ptr)
        return 0;
    if (mf_jinja_parse(src.ptr, (size_t)src.len, &mm->jinja, err))
        return mf_error_prefix(err, "model: tokenizer.chat_template (--chat-template NAME uses a "
                                    "built-in one instead)");
    /* Probe: every chat template must render one user turn. */
    mf_arena *a = mf_arena_new();
    mf_jv ctx = base_ctx(mm, a, true), msgs = mf_jv_list(a), m = mf_jv_dict(a);
    mf_jv_dict_setc(a, m, "role", mf_jv_cstr(a, "user"));
    mf_jv_dict_setc(a, m, "content", mf_jv_cstr(a, "Hello"));
    mf_jv_list_push(a, msgs, m);
    mf_jv_dict_setc(a, ctx, "messages", msgs);
    char *out = render(mm, ctx, err);
    mf_arena_free(a);
    if (!out) {
        mf_jinja_free(mm->jinja);
        mm->jinja = NULL;
        return mf_error_prefix(err, "model: tokenizer.chat_template cannot render one user message "
                                    "(--chat-template NAME uses a built-in one instead)");
    }
    free(out);
    return 0;
}

void mf_rt_chat_free(minfer_model *mm) {
    mf_jinja_free(mm->jinja);
    free(mm->bos_text);
    free(mm->eos_text);
}

int minfer_chat_template_check(const char *name, char *err, size_t errlen) {
    mf_error e;
    mf_chat_template t;
    if (!name || !*name)
        return 0;
    if (mf_chat_template_from_name(name, &t, &e)) {
        set_err(err, errlen, &e);
        return -1;
    }
    return 0;
}

static char *apply_builtin(mf_chat_template t, const minfer_chat_message *msgs, int32_t n,
                           bool add_assistant, mf_error *e) {
    mf_chat_msg *cm = mf_malloc(((size_t)n + 1) * sizeof *cm);
    for (int32_t i = 0; i < n; i++)
        cm[i] = (mf_chat_msg){.role = msgs[i].role, .content = msgs[i].content};
    char *s = mf_chat_render(t, cm, n, add_assistant);
    free(cm);
    if (!s)
        mf_errorf(e, "chat: template '%s' could not render the messages", mf_chat_template_name(t));
    return s;
}

char *minfer_chat_apply(const minfer_model *m, const char *template_name,
                        const minfer_chat_message *msgs, int32_t n, bool add_assistant, char *err,
                        size_t errlen) {
    mf_error e;
    mf_chat_template t = m->tmpl;
    char *s = NULL;
    if (n < 0) {
        mf_errorf(&e, "chat: %d messages", n);
    } else if (template_name && *template_name) {
        if (!mf_chat_template_from_name(template_name, &t, &e))
            s = apply_builtin(t, msgs, n, add_assistant, &e);
    } else if (!m->jinja) {
        s = apply_builtin(t, msgs, n, add_assistant, &e);
    } else {
        mf_arena *a = mf_arena_new();
        mf_jv ctx = base_ctx(m, a, add_assistant), list = mf_jv_list(a);
        for (int32_t i = 0; i < n; i++) {
            mf_jv d = mf_jv_dict(a);
            mf_jv_dict_setc(a, d, "role", mf_jv_cstr(a, msgs[i].role ? msgs[i].role : ""));
            mf_jv_dict_setc(a, d, "content", mf_jv_cstr(a, msgs[i].content ? msgs[i].content : ""));
            mf_jv_list_push(a, list, d);
        }
        mf_jv_dict_setc(a, ctx, "messages", list);
        s = render(m, ctx, &e);
        mf_arena_free(a);
    }
    if (!s)
        set_err(err, errlen, &e);
    return s;
}

char *minfer_chat_apply_json(const minfer_model *m, const char *template_name,
                             const char *messages_json, const char *tools_json, bool add_assistant,
                             char *err, size_t errlen) {
    mf_error e;
    mf_arena *a = mf_arena_new();
    char *s = NULL;
    mf_jv msgs, tools = mf_jv_undef();
    if (!messages_json || mf_jv_parse_json(a, messages_json, strlen(messages_json), &msgs, &e)) {
        if (!messages_json)
            mf_errorf(&e, "chat: no messages");
        else
            mf_error_prefix(&e, "chat: messages");
        goto done;
    }
    if (msgs.t != MF_JV_LIST) {
        mf_errorf(&e, "chat: messages must be a JSON array");
        goto done;
    }
    if (tools_json && *tools_json) {
        if (mf_jv_parse_json(a, tools_json, strlen(tools_json), &tools, &e)) {
            mf_error_prefix(&e, "chat: tools");
            goto done;
        }
        if (tools.t != MF_JV_LIST) {
            mf_errorf(&e, "chat: tools must be a JSON array");
            goto done;
        }
    }
    bool builtin = (template_name && *template_name) || !m->jinja;
    if (builtin) {
        /* The built-in renderers know role and content only. */
        if (tools.t == MF_JV_LIST && tools.u.l->n) {
            mf_errorf(&e, "chat: tools need the model's own chat template (the built-in '%s' has "
                          "no tool syntax)",
                      template_name && *template_name ? template_name : mf_chat_template_name(m->tmpl));
            goto done;
        }
        size_t n = msgs.u.l->n;
        minfer_chat_message *cm = mf_calloc(n + 1, sizeof *cm);
        for (size_t i = 0; i < n; i++) {
            mf_jv mi = msgs.u.l->v[i], r = mf_jv_dict_get(mi, "role", 4),
                  c = mf_jv_dict_get(mi, "content", 7);
            if (r.t == MF_JV_STR && (!strcmp(r.u.s.p, "tool") ||
                                     mf_jv_dict_get(mi, "tool_calls", 10).t != MF_JV_UNDEF)) {
                mf_errorf(&e, "chat: message %zu: tool calls and tool results need the model's "
                              "own chat template (the built-in '%s' has no tool syntax)",
                          i, template_name && *template_name ? template_name
                                                             : mf_chat_template_name(m->tmpl));
                free(cm);
                goto done;
            }
            if (r.t != MF_JV_STR || (c.t != MF_JV_STR && c.t != MF_JV_NONE)) {
                mf_errorf(&e, "chat: message %zu needs a string role and string content", i);
                free(cm);
                goto done;
            }
            cm[i] = (minfer_chat_message){r.u.s.p, c.t == MF_JV_STR ? c.u.s.p : ""};
        }
        s = minfer_chat_apply(m, template_name, cm, (int32_t)n, add_assistant, err, errlen);
        free(cm);
        mf_arena_free(a);
        return s;
    }
    /* A template that never reads tool_calls would drop the calls silently. */
    mf_str src = {0};
    if (mf_gguf_get_str(m->m->gguf, "tokenizer.chat_template", &src, NULL) == 0 && src.ptr &&
        !contains(src.ptr, (size_t)src.len, "tool_calls"))
        for (size_t i = 0; i < msgs.u.l->n; i++)
            if (mf_jv_dict_get(msgs.u.l->v[i], "tool_calls", 10).t != MF_JV_UNDEF) {
                mf_errorf(&e, "chat: message %zu has tool_calls, which the model's chat template "
                              "never reads",
                          i);
                goto done;
            }
    mf_jv ctx = base_ctx(m, a, add_assistant);
    mf_jv_dict_setc(a, ctx, "messages", msgs);
    if (tools.t == MF_JV_LIST)
        mf_jv_dict_setc(a, ctx, "tools", tools);
    s = render(m, ctx, &e);
done:
    mf_arena_free(a);
    if (!s)
        set_err(err, errlen, &e);
    return s;
}

/* ---- tool calls ------------------------------------------------------------------------ */

char *minfer_tool_call_schema(const char *tools_json, const char *only, char *err, size_t errlen) {
    mf_error e;
    mf_arena *a = mf_arena_new();
    mf_jv tools;
    char *out = NULL;
    if (!tools_json || mf_jv_parse_json(a, tools_json, strlen(tools_json), &tools, &e)) {
        if (!tools_json)
            mf_errorf(&e, "tools: none given");
        else
            mf_error_prefix(&e, "tools");
        goto done;
    }
    if (tools.t != MF_JV_LIST || !tools.u.l->n) {
        mf_errorf(&e, "tools: must be a non-empty JSON array");
        goto done;
    }
    mf_jv alts = mf_jv_list(a);
    for (size_t i = 0; i < tools.u.l->n; i++) {
        mf_jv t = tools.u.l->v[i], fn = mf_jv_dict_get(t, "function", 8),
              type = mf_jv_dict_get(t, "type", 4), name = mf_jv_dict_get(fn, "name", 4),
              params = mf_jv_dict_get(fn, "parameters", 10);
        if (type.t != MF_JV_STR || strcmp(type.u.s.p, "function")) {
            mf_errorf(&e, "tools[%zu]: 'type' must be \"function\"", i);
            goto done;
        }
        if (name.t != MF_JV_STR || !name.u.s.n) {
            mf_errorf(&e, "tools[%zu]: 'function.name' must be a non-empty string", i);
            goto done;
        }
        if (params.t != MF_JV_UNDEF && params.t != MF_JV_DICT) {
            mf_errorf(&e, "tools[%zu]: 'function.parameters' must be an object", i);
            goto done;
        }
        if (only && strcmp(only, name.u.s.p))
            continue;
        if (params.t == MF_JV_UNDEF) {
            params = mf_jv_dict(a);
            mf_jv_dict_setc(a, params, "type", mf_jv_cstr(a, "object"));
        }
        mf_jv props = mf_jv_dict(a), cname = mf_jv_dict(a), req = mf_jv_list(a), alt = mf_jv_dict(a);
        mf_jv_dict_setc(a, cname, "const", name);
        mf_jv_dict_setc(a, props, "name", cname);
        mf_jv_dict_setc(a, props, "arguments", params);
        mf_jv_list_push(a, req, mf_jv_cstr(a, "name"));
        mf_jv_list_push(a, req, mf_jv_cstr(a, "arguments"));
        mf_jv_dict_setc(a, alt, "type", mf_jv_cstr(a, "object"));
        mf_jv_dict_setc(a, alt, "properties", props);
        mf_jv_dict_setc(a, alt, "required", req);
        mf_jv_list_push(a, alts, alt);
    }
    if (!alts.u.l->n) {
        mf_errorf(&e, "tools: no tool named '%s'", only);
        goto done;
    }
    mf_jv schema = mf_jv_dict(a);
    mf_jv_dict_setc(a, schema, "anyOf", alts);
    mf_jbuf b = {0};
    if (mf_jv_to_json(&b, schema, -1, false, &e)) {
        free(b.p);
        goto done;
    }
    out = b.p;
done:
    mf_arena_free(a);
    if (!out)
        set_err(err, errlen, &e);
    return out;
}
