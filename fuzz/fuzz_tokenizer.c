/* fuzz_tokenizer.c - libFuzzer target: tokenize arbitrary bytes with every
 * pre-tokenizer over a small byte-level vocab built here (plus the model's
 * vocab when $MINFER_MODEL opens), and an spm vocab with byte fallback; then
 * detokenize. Byte-level BPE must round-trip the input exactly; the
 * streaming detokenizer must emit valid UTF-8. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/unit/tok_vocab.h" /* vocab builder shared with the unit test */
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define N_GPT2 5
static mf_tokenizer *gpt2_toks[N_GPT2 + 1]; /* the last: the model's, if any */
static mf_tokenizer *spm_tok;
static mf_gguf *model;

static void build(void) {
    static const char *pres[N_GPT2] = {"gpt2", "smollm", "qwen2", "llama3", "deepseek-llm"};
    /* 256 bytes, pairs of a few letters and their merges, two specials */
    static tok_vocab gv, sv;
    static const char *merges[64];
    static char mstore[64][16];
    int nm = 0;
    tok_vocab_add_gpt2_bytes(&gv);
    const char *letters = "aeinst";
    for (const char *x = letters; *x; x++)
        for (const char *y = letters; *y; y++) {
            if (nm >= 30)
                break;
            const char pair[3] = {*x, *y, 0};
            tok_vocab_add(&gv, pair, MF_TOKEN_NORMAL, 0);
            snprintf(mstore[nm], sizeof mstore[nm], "%c %c", *x, *y);
            merges[nm] = mstore[nm];
            nm++;
        }
    tok_vocab_add(&gv, "<|im_start|>", MF_TOKEN_CONTROL, 0);
    tok_vocab_add(&gv, "<|im", MF_TOKEN_CONTROL, 0);
    tok_vocab_add(&gv, "@u@", MF_TOKEN_USER_DEFINED, 0);
    mf_error err;
    for (int p = 0; p < N_GPT2; p++) {
        mf_tokenizer_spec spec;
        mf_tokenizer_spec_init(&spec, MF_TOKENIZER_GPT2);
        spec.pre = pres[p];
        spec.n_tokens = gv.n;
        spec.tokens = gv.ptrs;
        spec.types = gv.types;
        spec.n_merges = nm;
        spec.merges = merges;
        if (mf_tokenizer_new(&spec, &gpt2_toks[p], &err)) {
            fprintf(stderr, "fuzz: %s\n", err.msg);
            abort();
        }
    }
    /* spm: <unk>, <0xNN>, ▁ and a few letters */
    tok_vocab_add(&sv, "<unk>", MF_TOKEN_UNKNOWN, 0);
    tok_vocab_add_spm_bytes(&sv);
    static const char *pieces[] = {"\xe2\x96\x81", "a", "b", "ab", "\u2581a", "ba", "aba"};
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++)
        tok_vocab_add(&sv, pieces[i], MF_TOKEN_NORMAL, -(float)i);
    mf_tokenizer_spec spec;
    mf_tokenizer_spec_init(&spec, MF_TOKENIZER_SPM);
    spec.n_tokens = sv.n;
    spec.tokens = sv.ptrs;
    spec.types = sv.types;
    spec.scores = sv.scores;
    spec.unk = 0;
    if (mf_tokenizer_new(&spec, &spm_tok, &err))
        abort();
    const char *path = getenv("MINFER_MODEL");
    if (path && *path && mf_gguf_open(path, &model, &err) == 0 &&
        mf_tokenizer_from_gguf(model, &gpt2_toks[N_GPT2], &err) != 0)
        gpt2_toks[N_GPT2] = NULL;
}

static bool valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t l = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3
                 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (!l || i + l > n)
            return false;
        for (size_t k = 1; k < l; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
        i += l;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!spm_tok)
        build();
    if (size < 1)
        return 0;
    int which = data[0] % (N_GPT2 + 2);
    bool parse = data[0] & 0x80;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    mf_tokenizer *t = which == N_GPT2 + 1 ? spm_tok : gpt2_toks[which];
    if (!t)
        t = gpt2_toks[0];
    mf_error err;
    int64_t n = mf_tokenize(t, text, len, true, parse, NULL, 0, &err);
    if (n < 0)
        abort();
    int32_t *ids = malloc(sizeof *ids * (size_t)(n + 1));
    if (mf_tokenize(t, text, len, true, parse, ids, n, &err) != n)
        abort();
    size_t cap = mf_detok_max_bytes(t);
    char *piece = malloc(cap), *back = malloc(len * 3 + 64), *stream = malloc((size_t)n * cap + 8);
    size_t nb = 0, ns = 0;
    mf_detok d;
    mf_detok_init(&d);
    d.render_special = true;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= mf_tokenizer_n_vocab(t))
            abort();
        int l = mf_token_to_piece(t, ids[i], true, piece, cap);
        if (l < 0 || (size_t)l > cap)
            abort();
        if (nb + (size_t)l <= len * 3 + 64)
            memcpy(back + nb, piece, (size_t)l);
        nb += (size_t)l;
        ns += mf_detok_push(t, &d, ids[i], stream + ns, cap);
    }
    ns += mf_detok_flush(&d, stream + ns, 8);
    if (!valid_utf8((const uint8_t *)stream, ns))
        abort();
    if (mf_tokenizer_get_model(t) == MF_TOKENIZER_GPT2 && mf_token_bos(t) < 0 &&
        (nb != len || memcmp(back, text, len)))
        abort(); /* byte-level BPE loses nothing */
    free(ids);
    free(piece);
    free(back);
    free(stream);
    return 0;
}
