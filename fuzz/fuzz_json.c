/* fuzz_json.c - libFuzzer target for the JSON reader and writer (tools/json.c).
 *
 * Parses the input; a rejection must leave a one-line message that names a
 * byte offset. An accepted document is walked (every member looked up by its
 * own name), written back as JSON text with the writer and parsed again: the
 * writer's output must always parse, and to a tree of the same shape. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Same types and child counts all the way down. */
static bool same_shape(const mf_json *a, const mf_json *b) {
    if (a->type != b->type || a->n != b->n)
        return false;
    for (size_t i = 0; i < a->n; i++)
        if (!same_shape(&a->kids[i], &b->kids[i]))
            return false;
    return true;
}

static void walk(const mf_json *v) {
    if (v->type == MF_JSON_OBJECT)
        for (size_t i = 0; i < v->n; i++) {
            const mf_json *k = &v->kids[i];
            if (!k->key)
                abort();
            if (strlen(k->key) == k->key_len && !mf_json_get(v, k->key))
                abort(); /* a member is findable by its name */
        }
    if (v->type == MF_JSON_STRING && (!v->str || v->str[v->len] != 0))
        abort();
    for (size_t i = 0; i < v->n; i++)
        walk(&v->kids[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mf_error err;
    err.msg[0] = 0;
    mf_json *v = mf_json_parse((const char *)data, size, &err);
    if (!v) {
        if (!err.msg[0] || strchr(err.msg, '\n') || strncmp(err.msg, "byte ", 5) != 0)
            abort();
        return 0;
    }
    walk(v);
    mf_sbuf b = {0};
    mf_json_write(&b, v);
    mf_json *w = mf_json_parse(b.p ? b.p : "", b.n, &err);
    if (!w || !same_shape(v, w))
        abort(); /* the writer's text must parse back to the same tree shape */
    mf_json_free(w);
    mf_sbuf_free(&b);
    mf_json_free(v);
    return 0;
}
