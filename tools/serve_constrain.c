/* serve_constrain.c - response_format / tools / tool_choice -> grammar. */
#include "serve_constrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "minfer.h"

static char *json_text(const mf_json *v) {
    mf_sbuf b = {0};
    mf_json_write(&b, v);
    return b.p;
}

static int fail(char *err, size_t errlen, const char *msg, const char *detail) {
    snprintf(err, errlen, "%s%s", msg, detail ? detail : "");
    return -1;
}

/* response_format -> c->gbnf. */
static int response_format(const mf_json *rf, sv_constraint *c, char *err, size_t errlen) {
    if (rf->type != MF_JSON_OBJECT)
        return fail(err, errlen, "'response_format' must be an object {\"type\": ...}", NULL);
    const mf_json *type = mf_json_get(rf, "type");
    if (!type || type->type != MF_JSON_STRING)
        return fail(err, errlen, "'response_format.type' must be a string", NULL);
    for (size_t i = 0; i < rf->n; i++)
        if (strcmp(rf->kids[i].key, "type") && strcmp(rf->kids[i].key, "json_schema")) {
            snprintf(err, errlen, "'response_format.%.40s' is not supported", rf->kids[i].key);
            return -1;
        }
    const mf_json *js = mf_json_get(rf, "json_schema");
    char e[256];
    if (!strcmp(type->str, "text")) {
        if (js)
            return fail(err, errlen, "'response_format.json_schema' needs type 'json_schema'", NULL);
        return 0;
    }
    if (!strcmp(type->str, "json_object")) {
        if (js)
            return fail(err, errlen, "'response_format.json_schema' needs type 'json_schema'", NULL);
        if (!(c->gbnf = minfer_json_schema_to_grammar(NULL, e, sizeof e)))
            return fail(err, errlen, "response_format: ", e);
        return 0;
    }
    if (strcmp(type->str, "json_schema")) {
        snprintf(err, errlen,
                 "'response_format.type' '%.40s' is not text, json_object or json_schema",
                 type->str);
        return -1;
    }
    if (!js || js->type != MF_JSON_OBJECT)
        return fail(err, errlen, "'response_format.json_schema' must be an object {\"schema\": ...}",
                    NULL);
    const mf_json *schema = mf_json_get(js, "schema");
    for (size_t i = 0; i < js->n; i++) {
        const char *k = js->kids[i].key;
        if (strcmp(k, "schema") && strcmp(k, "name") && strcmp(k, "description") &&
            strcmp(k, "strict")) {
            snprintf(err, errlen, "'response_format.json_schema.%.40s' is not supported", k);
            return -1;
        }
    }
    if (!schema || schema->type != MF_JSON_OBJECT)
        return fail(err, errlen, "'response_format.json_schema.schema' must be an object", NULL);
    char *text = json_text(schema);
    c->gbnf = minfer_json_schema_to_grammar(text, e, sizeof e);
    free(text);
    if (!c->gbnf)
        return fail(err, errlen, "'response_format.json_schema.schema': ", e);
    return 0;
}

int sv_constraint_parse(const mf_json *root, bool chat, sv_constraint *c, char *err,
                        size_t errlen) {
    memset(c, 0, sizeof *c);
    const mf_json *rf = mf_json_get(root, "response_format");
    const mf_json *tools = mf_json_get(root, "tools");
    const mf_json *tc = mf_json_get(root, "tool_choice");
    const mf_json *ptc = mf_json_get(root, "parallel_tool_calls");
    if (tools && tools->type == MF_JSON_NULL)
        tools = NULL;
    if (tc && tc->type == MF_JSON_NULL)
        tc = NULL;
    if (!chat && (tools || tc || ptc))
        return fail(err, errlen, "'tools' / 'tool_choice' are for /v1/chat/completions", NULL);
    if (ptc && ptc->type != MF_JSON_NULL && ptc->type != MF_JSON_BOOL)
        return fail(err, errlen, "'parallel_tool_calls' must be a boolean", NULL);
    if (rf && rf->type != MF_JSON_NULL && response_format(rf, c, err, errlen))
        return -1;
    if (tc && !tools)
        return fail(err, errlen, "'tool_choice' needs 'tools'", NULL);
    if (!tools)
        return 0;
    if (tools->type != MF_JSON_ARRAY || tools->n == 0)
        return fail(err, errlen, "'tools' must be a non-empty array of tool definitions", NULL);
    const char *only = NULL;
    c->mode = SV_TOOLS_AUTO;
    if (tc && tc->type == MF_JSON_STRING) {
        if (!strcmp(tc->str, "none"))
            c->mode = SV_TOOLS_OFF;
        else if (!strcmp(tc->str, "required"))
            c->mode = SV_TOOLS_FORCED;
        else if (strcmp(tc->str, "auto")) {
            snprintf(err, errlen, "'tool_choice' '%.40s' is not none, auto or required", tc->str);
            return -1;
        }
    } else if (tc) {
        const mf_json *type = tc->type == MF_JSON_OBJECT ? mf_json_get(tc, "type") : NULL;
        const mf_json *fn = tc->type == MF_JSON_OBJECT ? mf_json_get(tc, "function") : NULL;
        const mf_json *name = fn && fn->type == MF_JSON_OBJECT ? mf_json_get(fn, "name") : NULL;
        if (!type || type->type != MF_JSON_STRING || strcmp(type->str, "function") || !name ||
            name->type != MF_JSON_STRING)
            return fail(err, errlen,
                        "'tool_choice' must be none, auto, required or {\"type\": \"function\", "
                        "\"function\": {\"name\": ...}}",
                        NULL);
        only = name->str;
        c->mode = SV_TOOLS_FORCED;
    }
    char *tj = json_text(tools), e[256];
    /* the schema also checks every tool definition, whatever the mode */
    char *schema = minfer_tool_call_schema(tj, only, e, sizeof e);
    if (!schema) {
        free(tj);
        return fail(err, errlen, "'tools': ", e);
    }
    if (c->mode == SV_TOOLS_FORCED) {
        if (c->gbnf) {
            free(tj);
            free(schema);
            return fail(err, errlen, "'response_format' and a forced 'tool_choice' conflict", NULL);
        }
        c->gbnf = minfer_json_schema_to_grammar(schema, e, sizeof e);
        if (!c->gbnf) {
            free(tj);
            free(schema);
            return fail(err, errlen, "'tools' parameters: ", e);
        }
    }
    free(schema);
    if (c->mode == SV_TOOLS_OFF)
        free(tj);
    else
        c->tools_json = tj;
    c->tools = tools;
    return 0;
}

void sv_constraint_free(sv_constraint *c) {
    free(c->gbnf);
    free(c->tools_json);
    memset(c, 0, sizeof *c);
}

bool sv_tool_calls_json(const sv_constraint *c, const char *text, size_t n, const char *call_id,
                        mf_sbuf *b) {
    if (c->mode == SV_TOOLS_OFF || !c->tools)
        return false;
    while (n && (text[0] == ' ' || text[0] == '\n' || text[0] == '\t' || text[0] == '\r'))
        text++, n--;
    mf_error e = {{0}};
    mf_json *v = mf_json_parse(text, n, &e);
    if (!v)
        return false;
    const mf_json *name = mf_json_get(v, "name"), *args = mf_json_get(v, "arguments");
    bool ok = v->type == MF_JSON_OBJECT && v->n == 2 && name && name->type == MF_JSON_STRING &&
              args && args->type == MF_JSON_OBJECT;
    bool known = false;
    for (size_t i = 0; ok && i < c->tools->n; i++) {
        const mf_json *fn = mf_json_get(&c->tools->kids[i], "function");
        const mf_json *nm = fn ? mf_json_get(fn, "name") : NULL;
        known |= nm && nm->type == MF_JSON_STRING && !strcmp(nm->str, name->str);
    }
    if (ok && known) {
        char *a = json_text(args);
        mf_sbuf_puts(b, "[{\"id\":");
        mf_json_add_string(b, call_id, strlen(call_id));
        mf_sbuf_puts(b, ",\"type\":\"function\",\"function\":{\"name\":");
        mf_json_add_string(b, name->str, name->len);
        mf_sbuf_puts(b, ",\"arguments\":");
        mf_json_add_string(b, a, strlen(a));
        mf_sbuf_puts(b, "}}]");
        free(a);
    }
    mf_json_free(v);
    return ok && known;
}
