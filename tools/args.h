/* args.h - small flag-parsing helpers shared by the minfer subcommands.
 *
 * Every helper reports a bad value as one line in an mf_error that names the
 * flag and the offending text ("--threads: 'abc' is not an integer"), so a
 * command prints "<cmd>: <msg>" and exits 2. */
#ifndef MF_TOOLS_ARGS_H
#define MF_TOOLS_ARGS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"

/* Parses a whole decimal integer in [lo, hi]. Returns 0, or -1 with err set. */
int mf_arg_int(const char *flag, const char *text, int64_t lo, int64_t hi, int64_t *out,
               mf_error *err);
/* Same, for the many int-sized flags. */
int mf_arg_i32(const char *flag, const char *text, int32_t lo, int32_t hi, int32_t *out,
               mf_error *err);
/* Parses a whole finite floating-point number (1e6, 0.5, -2). */
int mf_arg_float(const char *flag, const char *text, double *out, mf_error *err);

/* Matches argv[*i] against flag, given either as "--flag VALUE" or
 * "--flag=VALUE". Returns 1 and sets *value (advancing *i past a separate
 * value) when it matches, 0 when argv[*i] is another argument, and -1 with
 * err set when the flag is there but its value is missing. */
int mf_arg_value(int argc, char **argv, int *i, const char *flag, const char **value,
                 mf_error *err);

/* -fa / --flash-attn VALUE (llama.cpp: on|off|auto, llama-bench 0|1): on and
 * auto (= on) the fused attention kernel, off (*off = true) the unfused form
 * (scores materialized, softmax, then V; CPU only). */
int mf_parse_flash_attn(const char *cmd, const char *v, bool *off, mf_error *err);

/* True when arg is one of the usual help spellings. */
bool mf_arg_is_help(const char *arg);

/* Prints "cmd: msg" on stderr and returns 2 (the bad-usage exit status). */
int mf_arg_fail(const char *cmd, const mf_error *err);

/* The model a command uses without -m: $MINFER_MODEL, else MF_DEFAULT_MODEL
 * relative to the working directory, else the same file under the source tree
 * this binary was built from (so `minfer run` works from any directory). */
const char *mf_default_model(void);

#endif
