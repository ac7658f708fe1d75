/* runopts.h - the options and set-up shared by `minfer run` and `minfer chat`
 * (cmd_run.c parses and loads; cmd_chat.c holds the conversation loop). */
#ifndef MF_TOOLS_RUNOPTS_H
#define MF_TOOLS_RUNOPTS_H

#include <stdbool.h>
#include <stdint.h>

#include "gen.h"
#include "minfer.h"

typedef struct run_opts {
    const char *model, *prompt, *file, *sys, *tmpl, *ctk, *ctv, *logits_out, *device;
    const char *log_file;
    const char *grammar, *grammar_file, *json_schema; /* structured output (run only) */
    int32_t n_predict, n_ctx, n_threads, n_batch, n_ubatch, n_gpu_layers, n_keep;
    bool chat, display_prompt, conversation, escape, ignore_eos, no_mmap, mlock;
    bool verbose, log_disable, verbose_prompt, color, keep_given, seed_random;
    bool fa_off;                     /* -fa off: unfused attention */
    const char *rev[MF_GEN_MAX_REV];
    int n_rev;
    minfer_sampler_options so;
} run_opts;

/* The model from the options; prints the error and returns 1 on failure. */
int mf_run_load_model(const run_opts *o, const char *cmd, minfer_model **m);
/* The session; a prompt (may be NULL) that cannot fit is refused first. */
int mf_run_open_session(const run_opts *o, const char *cmd, minfer_model *m, const char *prompt,
                        minfer_session **s);
/* The one stats line on stderr (unless --log-disable). */
void mf_run_print_stats(const run_opts *o, const minfer_model *m, const mf_gen_result *r);
/* The conversation loop of `minfer chat` and `run -cnv`; returns the exit status. */
int mf_chat_loop(const run_opts *o, minfer_model *m, minfer_session *s, minfer_sampler *smp);

#endif
