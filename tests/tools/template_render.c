/* template_render.c - renders a chat template over many contexts, for
 * tests/py/test_template_jinja2.py.
 *
 *   template_render TEMPLATE.jinja CONTEXTS.jsonl
 *
 * Each line of CONTEXTS.jsonl is a JSON object (messages, tools,
 * add_generation_prompt, bos_token, ...). For each line one record goes to
 * stdout: "OK <bytes>\n" and the rendering, or "ERR <bytes>\n" and the error
 * message. A template that does not parse prints "PARSE <msg>" and exits 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/jinja.h"

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *p = malloc(cap);
    size_t k;
    while ((k = fread(p + len, 1, cap - len, f)) > 0) {
        len += k;
        if (len == cap)
            p = realloc(p, cap *= 2);
    }
    fclose(f);
    *n = len;
    return p;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: template_render TEMPLATE CONTEXTS.jsonl\n");
        return 2;
    }
    size_t tn, cn;
    char *tsrc = slurp(argv[1], &tn), *ctx = slurp(argv[2], &cn);
    if (!tsrc || !ctx) {
        fprintf(stderr, "template_render: cannot read %s\n", !tsrc ? argv[1] : argv[2]);
        return 2;
    }
    mf_error err = {{0}};
    mf_jinja *t;
    if (mf_jinja_parse(tsrc, tn, &t, &err)) {
        printf("PARSE %s\n", err.msg);
        return 1;
    }
    for (size_t i = 0; i < cn;) {
        size_t j = i;
        while (j < cn && ctx[j] != '\n')
            j++;
        if (j > i) {
            mf_arena *a = mf_arena_new();
            mf_jv v;
            char *out = NULL;
            size_t n = 0;
            if (mf_jv_parse_json(a, ctx + i, j - i, &v, &err) ||
                mf_jinja_render(t, v, &out, &n, &err)) {
                printf("ERR %zu\n%s", strlen(err.msg), err.msg);
            } else {
                printf("OK %zu\n", n);
                fwrite(out, 1, n, stdout);
            }
            free(out);
            mf_arena_free(a);
        }
        i = j + 1;
    }
    mf_jinja_free(t);
    free(tsrc);
    free(ctx);
    return 0;
}
