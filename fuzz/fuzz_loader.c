/* fuzz_loader.c - libFuzzer target for model loading: the input is a whole
 * GGUF file, put in a memfd and opened with mf_model_load (hyperparameter
 * types and ranges, tensor shapes against the metadata, the layout rules,
 * tensors the architecture does not use), then its tokenizer is built. A
 * refusal must be one printable line; an accepted model must have every
 * graph weight inside the input and shapes that agree with its hparams. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model/model.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

static void check_msg(const char *m) {
    if (!m[0])
        abort();
    for (const char *c = m; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("fuzz_loader", MFD_CLOEXEC);
    if (fd < 0)
        abort();
    if (size && write(fd, data, size) != (ssize_t)size)
        abort();
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    mf_model *m = NULL;
    mf_error err;
    err.msg[0] = 0;
    if (mf_model_load(path, NULL, NULL, NULL, &m, &err) != 0) {
        if (m)
            abort();
        check_msg(err.msg);
    } else {
        const mf_hparams *hp = &m->hp;
        if (hp->n_layer <= 0 || hp->n_embd <= 0 || hp->n_vocab <= 0 || hp->head_dim <= 0)
            abort();
        const char *const *names;
        int32_t n = mf_model_graph_weights(m, &names);
        for (int32_t i = 0; i < n; i++) {
            const mf_gguf_tensor *t = mf_gguf_find_tensor(m->gguf, names[i]);
            if (!t)
                abort();
            const uint8_t *p = t->data;
            sink += p[0] + p[t->nbytes - 1];
        }
        mf_tokenizer *tok = NULL;
        if (mf_tokenizer_from_gguf(m->gguf, &tok, &err) == 0)
            mf_tokenizer_free(tok);
        else
            check_msg(err.msg);
        mf_model_free(m);
    }
    close(fd);
    return 0;
}
