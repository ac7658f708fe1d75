/* chat.c - chat templates rendered in C: each family's turn markers, as the
 * models' own Jinja templates produce them for plain role/content messages.
 * No BOS is written here; the tokenizer adds it when the model asks. */
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

static const char *const template_names[MF_CHAT_COUNT] = {
    [MF_CHAT_CHATML] = "chatml", [MF_CHAT_LLAMA3] = "llama3", [MF_CHAT_LLAMA2] = "llama2",
    [MF_CHAT_GEMMA] = "gemma",   [MF_CHAT_PHI3] = "phi3",     [MF_CHAT_ZEPHYR] = "zephyr",
};

const char *mf_chat_template_name(mf_chat_template tmpl) {
    return (unsigned)tmpl < MF_CHAT_COUNT ? template_names[tmpl] : "?";
}

int mf_chat_template_from_name(const char *name, mf_chat_template *out, mf_error *err) {
    for (int i = 0; i < MF_CHAT_COUNT; i++)
        if (!strcmp(name, template_names[i])) {
            *out = (mf_chat_template)i;
            return 0;
        }
    return mf_errorf(err, "chat: unknown template '%s' (chatml, llama3, llama2, gemma, phi3, zephyr)",
                     name);
}

/* ---- a growing string ------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_addn(sbuf *b, const char *s, size_t l) {
    if (b->n + l + 1 > b->cap) {
        b->cap = (b->n + l + 1) * 2;
        b->p = mf_realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, l);
    b->n += l;
    b->p[b->n] = 0;
}

static void sb_add(sbuf *b, const char *s) { sb_addn(b, s, strlen(s)); }

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Appends s without leading/trailing whitespace (Jinja's | trim). */
static void sb_add_trim(sbuf *b, const char *s) {
    size_t l = strlen(s), i = 0;
    while (i < l && is_ws(s[i]))
        i++;
    while (l > i && is_ws(s[l - 1]))
        l--;
    sb_addn(b, s + i, l - i);
}

/* Appends a system turn to the pending ones ("\n\n" between two). */
static void add_pending(sbuf *sys, const char *content) {
    if (sys->n)
        sb_add(sys, "\n\n");
    sb_add(sys, content);
    if (!sys->n) /* an empty system turn still counts as one */
        sb_add(sys, " ");
}

static const char *nz(const char *s) { return s ? s : ""; }

/* Renders msgs[0..n) in the template's format. Unknown roles are written
 * through as given (ChatML, Llama-3, Phi-3, Zephyr) or treated as user
 * (Llama-2, Gemma, which only know user/model turns). */
char *mf_chat_render(mf_chat_template tmpl, const mf_chat_msg *msgs, int n, bool add_assistant) {
    sbuf b = {0};
    sb_add(&b, "");
    /* llama2/gemma fold system turns into the next user turn; several in a
     * row are joined, and one with no user turn after it gets a user turn
     * of its own rather than being dropped. */
    sbuf sys = {0};
    bool first_user = true;
    for (int i = 0; i < n; i++) {
        const char *role = nz(msgs[i].role), *content = nz(msgs[i].content);
        bool is_sys = !strcmp(role, "system"), is_asst = !strcmp(role, "assistant");
        switch (tmpl) {
        case MF_CHAT_CHATML:
            sb_add(&b, "<|im_start|>");
            sb_add(&b, role);
            sb_add(&b, "\n");
            sb_add(&b, content);
            sb_add(&b, "<|im_end|>\n");
            break;
        case MF_CHAT_LLAMA3:
            sb_add(&b, "<|start_header_id|>");
            sb_add(&b, role);
            sb_add(&b, "<|end_header_id|>\n\n");
            sb_add_trim(&b, content);
            sb_add(&b, "<|eot_id|>");
            break;
        case MF_CHAT_LLAMA2:
            if (is_sys) {
                add_pending(&sys, content);
            } else if (is_asst) {
                sb_add(&b, " ");
                sb_add_trim(&b, content);
                sb_add(&b, " </s>");
            } else {
                sb_add(&b, first_user ? "[INST] " : "<s>[INST] ");
                if (sys.n) {
                    sb_add(&b, "<<SYS>>\n");
                    sb_add_trim(&b, sys.p);
                    sb_add(&b, "\n<</SYS>>\n\n");
                    sys.n = 0;
                }
                sb_add_trim(&b, content);
                sb_add(&b, " [/INST]");
                first_user = false;
            }
            break;
        case MF_CHAT_GEMMA:
            if (is_sys) {
                add_pending(&sys, content);
                break;
            }
            sb_add(&b, is_asst ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
            if (sys.n && !is_asst) {
                sb_add_trim(&b, sys.p);
                sb_add(&b, "\n\n");
                sys.n = 0;
            }
            sb_add_trim(&b, content);
            sb_add(&b, "<end_of_turn>\n");
            break;
        case MF_CHAT_PHI3:
        case MF_CHAT_ZEPHYR:
            sb_add(&b, "<|");
            sb_add(&b, role);
            sb_add(&b, "|>\n");
            sb_add(&b, content);
            sb_add(&b, tmpl == MF_CHAT_PHI3 ? "<|end|>\n" : "</s>\n");
            break;
        case MF_CHAT_COUNT:
            break;
        }
    }
    if (sys.n && tmpl == MF_CHAT_LLAMA2) {
        sb_add(&b, first_user ? "[INST] <<SYS>>\n" : "<s>[INST] <<SYS>>\n");
        sb_add_trim(&b, sys.p);
        sb_add(&b, "\n<</SYS>>\n\n [/INST]");
    } else if (sys.n && tmpl == MF_CHAT_GEMMA) {
        sb_add(&b, "<start_of_turn>user\n");
        sb_add_trim(&b, sys.p);
        sb_add(&b, "<end_of_turn>\n");
    }
    free(sys.p);
    if (add_assistant) {
        switch (tmpl) {
        case MF_CHAT_CHATML: sb_add(&b, "<|im_start|>assistant\n"); break;
        case MF_CHAT_LLAMA3: sb_add(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n"); break;
        case MF_CHAT_GEMMA: sb_add(&b, "<start_of_turn>model\n"); break;
        case MF_CHAT_PHI3:
        case MF_CHAT_ZEPHYR: sb_add(&b, "<|assistant|>\n"); break;
        case MF_CHAT_LLAMA2: /* the model answers right after [/INST] */
        case MF_CHAT_COUNT: break;
        }
    }
    return b.p;
}
