/* tools.h - the subcommands of the minfer command. Each takes argc/argv
 * starting at its own name and returns the process exit status (0 ok, 1 a
 * failure, 2 bad usage). */
#ifndef MF_TOOLS_H
#define MF_TOOLS_H

#define MF_VERSION_STRING "0.1.0"
/* The default model, relative to the current directory or MINFER_MODEL. */
#define MF_DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

int mf_cmd_run(int argc, char **argv);
int mf_cmd_chat(int argc, char **argv);
int mf_cmd_perplexity(int argc, char **argv);
int mf_cmd_bench(int argc, char **argv);
/* bench_batched.c: `minfer bench` with -npp / -ntg / -npl (llama-batched-bench). */
#include <stdbool.h>
bool mf_bench_is_batched(int argc, char **argv);
int mf_cmd_bench_batched(int argc, char **argv);
int mf_cmd_inspect(int argc, char **argv);
int mf_cmd_quantize(int argc, char **argv);
int mf_cmd_tokenize(int argc, char **argv);
int mf_cmd_detokenize(int argc, char **argv);
int mf_cmd_synth(int argc, char **argv);
int mf_cmd_serve(int argc, char **argv);

#endif
