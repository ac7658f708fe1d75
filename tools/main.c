/* main.c - the minfer command: one binary, one subcommand per job. */
#include <stdio.h>
#include <string.h>

#include "minfer.h"
#include "runtime/levers.h"
#include "tools.h"

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"run", mf_cmd_run, "generate text from a prompt"},
    {"chat", mf_cmd_chat, "interactive multi-turn chat with the model's template"},
    {"perplexity", mf_cmd_perplexity, "chunked perplexity of a text file"},
    {"bench", mf_cmd_bench, "prompt-processing and generation throughput"},
    {"inspect", mf_cmd_inspect, "print a GGUF file's metadata and tensor table"},
    {"quantize", mf_cmd_quantize, "convert an F32/F16/BF16 model to a quantized type"},
    {"tokenize", mf_cmd_tokenize, "token ids and pieces of a text"},
    {"detokenize", mf_cmd_detokenize, "text of a list of token ids"},
    {"synth", mf_cmd_synth, "write a synthetic model at real shapes"},
    {"serve", mf_cmd_serve, "HTTP server (OpenAI-style completions)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: minfer <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'minfer <command> --help' describes a command's options.\n");
}

int main(int argc, char **argv) {
    mf_levers_init(); /* MINFER_LOG for commands that load no model (quantize, synth...) */
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("minfer %s (commit %s)\nbackends: %s\n", MF_VERSION_STRING, minfer_build_commit(),
               minfer_build_devices());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "minfer: unknown command '%s' (see 'minfer --help')\n", argv[1]);
    return 2;
}
