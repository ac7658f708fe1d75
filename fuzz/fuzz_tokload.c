/* fuzz_tokload.c - libFuzzer target for the tokenizer's LOADING path: the
 * input is a GGUF file; when it parses, mf_tokenizer_from_gguf reads every
 * tokenizer.ggml.* key (type confusion of token_type / scores / merges, ids
 * out of range, NUL bytes in names, ...). A refusal must be a one-line
 * message with no control bytes (file strings are escaped); an accepted
 * tokenizer must tokenize and stream-detokenize sample texts, every piece
 * fitting mf_detok_max_bytes, and pick a chat template. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

static void check_msg(const char *m) {
    if (!m[0])
        abort();
    for (const char *c = m; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            abort(); /* a raw control byte from the file reached the message */
}

static void exercise(const mf_tokenizer *t) {
    static const char *const texts[] = {"Hello world! 123", "<|im_start|>user\nhi<|im_end|>",
                                        "\xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80", " \t\n  x", "\xff\xfe"};
    size_t cap = mf_detok_max_bytes(t);
    char *buf = malloc(cap);
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
        int32_t ids[256];
        mf_error err;
        int64_t n = mf_tokenize(t, texts[k], strlen(texts[k]), true, true, ids, 256, &err);
        if (n < 0)
            continue;
        mf_detok d;
        mf_detok_init(&d);
        for (int64_t i = 0; i < n && i < 256; i++) {
            if (ids[i] < 0 || ids[i] >= mf_tokenizer_n_vocab(t))
                abort();
            size_t w = mf_detok_push(t, &d, ids[i], buf, cap);
            if (w > cap)
                abort(); /* the documented bound must hold for every piece */
            sink += w;
        }
        sink += mf_detok_flush(&d, buf, cap);
    }
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mf_gguf *g = NULL;
    mf_error err;
    if (mf_gguf_parse(data, size, &g, &err) != 0) {
        check_msg(err.msg);
        return 0;
    }
    mf_tokenizer *t = NULL;
    err.msg[0] = 0;
    if (mf_tokenizer_from_gguf(g, &t, &err) == 0) {
        exercise(t);
        mf_chat_template ct;
        sink += (uint64_t)mf_chat_template_detect(g, t, &ct);
        mf_tokenizer_free(t);
    } else {
        if (t)
            abort();
        check_msg(err.msg);
    }
    mf_gguf_close(g);
    return 0;
}
