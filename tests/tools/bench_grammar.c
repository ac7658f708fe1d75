/* bench_grammar.c - what a grammar constraint costs per generated token.
 *
 *   bench_grammar MODEL [N] [TEMP]
 *
 * Generates N tokens (default 64) after a chat prompt three ways: no
 * constraint, the JSON object grammar, and a JSON Schema, and prints per
 * way the generation rate and the time spent in the sampler alone (the
 * constraint's whole cost; the forward pass is the same work either way). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "minfer.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_grammar MODEL [N] [TEMP]\n");
        return 2;
    }
    int n = argc > 2 ? atoi(argv[2]) : 64;
    float temp = argc > 3 ? (float)atof(argv[3]) : 0.0f;
    char err[512];
    minfer_model_options mo;
    minfer_model_options_default(&mo);
    mo.path = argv[1];
    minfer_model *m = minfer_model_load(&mo, err, sizeof err);
    if (!m) {
        fprintf(stderr, "bench_grammar: %s\n", err);
        return 1;
    }
    minfer_chat_message msg = {"user", "Describe the city of Paris as a JSON object with many fields."};
    char *prompt = minfer_chat_apply(m, NULL, &msg, 1, true, err, sizeof err);
    int32_t toks[512];
    int64_t nt = minfer_tokenize(m, prompt, strlen(prompt), true, true, toks, 512);
    const char *modes[] = {"none", "json_object", "json_schema"};
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                         "\"facts\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},"
                         "\"required\":[\"name\",\"facts\"]}";
    for (int mode = 0; mode < 3; mode++) {
        minfer_session_options so;
        minfer_session_options_default(&so);
        so.n_ctx = 1024;
        minfer_session *s = minfer_session_new(m, &so, err, sizeof err);
        minfer_sampler_options sm;
        minfer_sampler_options_default(&sm);
        sm.temp = temp;
        sm.seed = 7;
        minfer_sampler *smp = minfer_sampler_new(&sm);
        if ((mode == 1 && minfer_sampler_set_json_schema(smp, m, NULL, err, sizeof err)) ||
            (mode == 2 && minfer_sampler_set_json_schema(smp, m, schema, err, sizeof err)) ||
            !s || minfer_prefill(s, toks, (int32_t)nt, err, sizeof err)) {
            fprintf(stderr, "bench_grammar: %s\n", err);
            return 1;
        }
        double t_sample = 0, t0 = now_ms();
        int got = 0;
        for (; got < n; got++) {
            double a = now_ms();
            int32_t tok = minfer_sampler_sample(smp, minfer_logits(s), minfer_model_n_vocab(m));
            t_sample += now_ms() - a;
            /* past the end of the constrained text, keep the work per token equal */
            if (tok < 0 || minfer_token_is_eog(m, tok)) {
                minfer_sampler_set_grammar(smp, m, NULL, err, sizeof err);
                tok = minfer_sampler_sample(smp, minfer_logits(s), minfer_model_n_vocab(m));
            }
            if (minfer_decode(s, tok, err, sizeof err)) {
                fprintf(stderr, "bench_grammar: %s\n", err);
                return 1;
            }
        }
        double total = now_ms() - t0;
        printf("%-12s %d tokens  %.2f t/s  sampler %.3f ms/token (%.1f%% of the time)\n", modes[mode],
               got, got / (total / 1e3), t_sample / got, 100.0 * t_sample / total);
        minfer_sampler_free(smp);
        minfer_session_free(s);
    }
    free(prompt);
    minfer_model_free(m);
    return 0;
}
