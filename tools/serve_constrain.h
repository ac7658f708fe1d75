/* serve_constrain.h - structured output for `minfer serve`: the
 * response_format, tools and tool_choice fields of a chat request turned into
 * a grammar for the sampler and a tools list for the template, and a
 * generated tool call turned back into OpenAI's tool_calls. */
#ifndef MF_TOOLS_SERVE_CONSTRAIN_H
#define MF_TOOLS_SERVE_CONSTRAIN_H

#include <stdbool.h>
#include <stddef.h>

#include "json.h"

typedef enum sv_tool_mode {
    SV_TOOLS_OFF,    /* no tools, or tool_choice "none": nothing rendered */
    SV_TOOLS_AUTO,   /* rendered, output free; a bare tool call is recognised */
    SV_TOOLS_FORCED, /* "required" or a named function: output is one call */
} sv_tool_mode;

typedef struct sv_constraint {
    char *gbnf;             /* the sampler's grammar, or NULL (malloc'd) */
    char *tools_json;       /* the tools array for the template, or NULL (malloc'd) */
    const mf_json *tools;   /* the request's tools (borrowed from its tree) */
    sv_tool_mode mode;
} sv_constraint;

/* Reads response_format, tools and tool_choice of root (tools only when
 * chat). 0, or -1 with err naming the field and the problem (a 400). */
int sv_constraint_parse(const mf_json *root, bool chat, sv_constraint *c, char *err, size_t errlen);
void sv_constraint_free(sv_constraint *c);

/* JSON text of v: the writer of tools/json.c, under the server's prefix. */
static inline void sv_json_write(mf_sbuf *b, const mf_json *v) {
    mf_json_write(b, v);
}

/* When text is exactly one JSON object {"name": N, "arguments": {...}} with N
 * one of the tools: writes [{"id", "type": "function", "function": {"name",
 * "arguments": "<JSON text>"}}] into b and returns true. */
bool sv_tool_calls_json(const sv_constraint *c, const char *text, size_t n, const char *call_id,
                        mf_sbuf *b);

#endif
