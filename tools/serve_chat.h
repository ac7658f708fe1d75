/* serve_chat.h - the messages of an OpenAI chat request turned into the
 * messages array a chat template renders: role, content, name, tool_calls
 * (arguments as objects, the transformers convention) and tool results
 * (role "tool" with tool_call_id). Each non-empty content is replaced by an
 * opaque marker the caller swaps back after rendering, so user text is never
 * parsed for special tokens; the other user strings a template prints (names,
 * ids, arguments) are refused when they spell a special token. */
#ifndef MF_TOOLS_SERVE_CHAT_H
#define MF_TOOLS_SERVE_CHAT_H

#include <stddef.h>

#include "json.h"
#include "minfer.h"

#define SV_MARK_LEN 48

typedef struct sv_chat {
    char *json;               /* the messages array as JSON text (malloc'd) */
    size_t n;                 /* messages */
    char **content;           /* content[i]: the text behind mark[i], or NULL (no marker) */
    char (*mark)[SV_MARK_LEN];
    int has_tools;            /* some message carries tool_calls or is a tool result */
} sv_chat;

/* Reads ms (the request's 'messages' array, already checked to be a
 * non-empty array). 0, or -1 with err naming the field (a 400). */
int sv_chat_read(const minfer_model *m, const mf_json *ms, unsigned long long nonce, sv_chat *c,
                 char *err, size_t errlen);
void sv_chat_free(sv_chat *c);

#endif
