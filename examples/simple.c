/* simple.c - the smallest complete minfer program: load a model, generate 32
 * tokens greedily after a prompt, print them. Uses only include/minfer.h.
 *
 *   example_simple [MODEL] [PROMPT]   (MODEL defaults to $MINFER_MODEL) */
#include <stdio.h>
#include <stdlib.h>

#include "minfer.h"

static bool print_piece(void *user, int32_t token, const char *text, size_t len) {
    (void)user;
    (void)token;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return true;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : getenv("MINFER_MODEL");
    const char *prompt = argc > 2 ? argv[2] : "Once upon a time";
    if (!path) {
        fprintf(stderr, "usage: %s MODEL [PROMPT]\n", argv[0]);
        return 2;
    }
    char err[512];
    minfer_model_options mo;
    minfer_model_options_default(&mo);
    mo.path = path;
    minfer_model *m = minfer_model_load(&mo, err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    minfer_session_options so;
    minfer_session_options_default(&so);
    so.n_ctx = 512;
    minfer_session *s = minfer_session_new(m, &so, err, sizeof err);
    if (!s) {
        fprintf(stderr, "%s\n", err);
        minfer_model_free(m);
        return 1;
    }
    minfer_sampler_options sa;
    minfer_sampler_options_default(&sa);
    sa.temp = 0; /* greedy */
    minfer_sampler *smp = minfer_sampler_new(&sa);

    printf("%s", prompt);
    minfer_generate_stats st;
    int rc = minfer_generate(s, smp, prompt, 32, print_piece, NULL, &st, err, sizeof err);
    if (rc)
        fprintf(stderr, "\n%s\n", err);
    else
        printf("\n(%d tokens, %.1f tokens/s)\n", st.n_generated,
               st.gen_ms > 0 ? 1e3 * st.n_generated / st.gen_ms : 0.0);
    minfer_sampler_free(smp);
    minfer_session_free(s);
    minfer_model_free(m);
    return rc ? 1 : 0;
}
