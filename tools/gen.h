/* gen.h - the CLI's generation loop over the public API (run and chat).
 *
 * Unlike minfer_generate it knows the CLI's stop rules: --ignore-eos (end of
 * generation tokens can never be sampled), reverse prompts (-r: stop once the
 * output ends with one), an interrupt flag (Ctrl-C), and a context shift for
 * `run --keep N` (the first N prompt tokens plus the newer half of the rest
 * are prefilled again when the context fills; there is no KV shifting API, so
 * the kept tokens are recomputed). */
#ifndef MF_TOOLS_GEN_H
#define MF_TOOLS_GEN_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "minfer.h"

#define MF_GEN_MAX_REV 8

/* Receives the text of the generated tokens, whole UTF-8 only. */
typedef void (*mf_gen_text_fn)(void *user, const char *text, size_t len);

typedef struct mf_gen_opts {
    int32_t n_predict;          /* -1: until end of generation or context */
    bool ignore_eos;
    const char *rev[MF_GEN_MAX_REV];
    int n_rev;
    int32_t n_keep;             /* < -1: no context shift; -1: keep the whole prompt */
    volatile sig_atomic_t *stop; /* polled before every token; NULL: never */
    bool verbose_prompt;        /* print the prompt's tokens on stderr */
    bool progress;              /* a prefill progress line on stderr (a terminal) */
    int32_t n_batch;            /* prefill slice for the progress line */
    mf_gen_text_fn out;
    void *user;
} mf_gen_opts;

typedef struct mf_gen_result {
    int32_t n_prompt, n_generated, n_shifts;
    double prompt_ms, gen_ms;
    bool stopped_eog, stopped_ctx, stopped_rev, interrupted;
} mf_gen_result;

/* Tokenizes prompt (BOS only on an empty context), prefills it and samples
 * after it; every emitted token is decoded into the context. An empty prompt
 * on a non-empty context continues from the last logits. Returns 0, or -1
 * with err set (a prompt that does not fit, a failing forward, NaN logits). */
int mf_gen_run(minfer_model *m, minfer_session *s, minfer_sampler *smp, const char *prompt,
               const mf_gen_opts *o, mf_gen_result *r, char *err, size_t errlen);

/* Tokens of text (malloc'd) and their count; NULL on failure. */
int32_t *mf_gen_tokenize(const minfer_model *m, const char *text, bool add_special, int64_t *n);

#endif
