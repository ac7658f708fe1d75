/* tokenizer_gguf.c - the tokenizer.ggml.* loader and chat-template
 * detection: the only parts of the module that read a GGUF file (kept apart
 * so code using the array constructor links without the reader). */
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

/* An optional id key: 0 and *out set, *out = -1 when absent, -1 on error. */
static int get_id(const mf_gguf *g, const char *key, int32_t *out, mf_error *err) {
    uint32_t v;
    int rc = mf_gguf_get_u32(g, key, &v, err);
    if (rc < 0)
        return -1;
    *out = rc == 0 ? (v > INT32_MAX ? INT32_MAX : (int32_t)v) : -1;
    return 0;
}

static int get_flag(const mf_gguf *g, const char *key, bool *out, mf_error *err) {
    bool v;
    int rc = mf_gguf_get_bool(g, key, &v, err);
    if (rc < 0)
        return -1;
    if (rc == 0)
        *out = v;
    return 0;
}

/* Reads the tokenizer keys into a spec (string arrays point into g, which
 * outlives this call) and builds the tokenizer. */
int mf_tokenizer_from_gguf(const mf_gguf *g, mf_tokenizer **out, mf_error *err) {
    *out = NULL;
    mf_str model;
    int rc = mf_gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (rc < 0)
        return -1;
    if (rc > 0)
        return mf_errorf(err, "tokenizer: key 'tokenizer.ggml.model' missing");
    mf_tokenizer_spec spec;
    /* Compared with the length: "gpt2\0x" is not "gpt2". */
    if (model.len == 4 && !memcmp(model.ptr, "gpt2", 4))
        mf_tokenizer_spec_init(&spec, MF_TOKENIZER_GPT2);
    else if (model.len == 5 && !memcmp(model.ptr, "llama", 5))
        mf_tokenizer_spec_init(&spec, MF_TOKENIZER_SPM);
    else
        return mf_errorf(err, "tokenizer: unsupported model '%s' (gpt2 and llama are)",
                         MF_ESCN(model.ptr, model.len));

    /* Read later by mf_chat_template_detect, which must not meet another type
     * and silently fall back to the token heuristics. */
    mf_str tmpl;
    rc = mf_gguf_get_str(g, "tokenizer.chat_template", &tmpl, err);
    if (rc < 0)
        return -1;
    if (rc == 0 && strlen(tmpl.ptr) != tmpl.len) /* detection would see only the text before it */
        return mf_errorf(err, "tokenizer: key 'tokenizer.chat_template' contains a NUL byte at %zu of "
                              "%llu bytes", strlen(tmpl.ptr), (unsigned long long)tmpl.len);
    mf_str pre;
    rc = mf_gguf_get_str(g, "tokenizer.ggml.pre", &pre, err);
    if (rc < 0)
        return -1;
    if (rc == 0 && strlen(pre.ptr) != pre.len)
        return mf_errorf(err, "tokenizer: key 'tokenizer.ggml.pre' '%s' contains a NUL byte",
                         MF_ESCN(pre.ptr, pre.len));
    spec.pre = rc == 0 ? pre.ptr : NULL;

    int64_t kv_tok, kv_type = -1, kv_score = -1, kv_merge = -1;
    uint64_t n_tok, n;
    rc = mf_gguf_get_arr(g, "tokenizer.ggml.tokens", MF_GGUF_STRING, &kv_tok, &n_tok, err);
    if (rc < 0)
        return -1;
    if (rc > 0)
        return mf_errorf(err, "tokenizer: key 'tokenizer.ggml.tokens' missing");
    if (n_tok == 0 || n_tok > INT32_MAX)
        return mf_errorf(err, "tokenizer: tokenizer.ggml.tokens has %llu entries",
                         (unsigned long long)n_tok);
    rc = mf_gguf_get_arr_ints(g, "tokenizer.ggml.token_type", &kv_type, &n, err);
    if (rc < 0)
        return -1;
    if (rc == 0 && n != n_tok)
        return mf_errorf(err, "tokenizer: token_type has %llu entries, tokens %llu",
                         (unsigned long long)n, (unsigned long long)n_tok);
    if (rc > 0)
        kv_type = -1;
    rc = mf_gguf_get_arr_nums(g, "tokenizer.ggml.scores", &kv_score, &n, err);
    if (rc < 0)
        return -1;
    if (rc == 0 && n != n_tok)
        return mf_errorf(err, "tokenizer: scores has %llu entries, tokens %llu",
                         (unsigned long long)n, (unsigned long long)n_tok);
    if (rc > 0)
        kv_score = -1;
    uint64_t n_merge = 0;
    rc = mf_gguf_get_arr(g, "tokenizer.ggml.merges", MF_GGUF_STRING, &kv_merge, &n_merge, err);
    if (rc < 0)
        return -1;
    if (rc > 0)
        kv_merge = -1, n_merge = 0;
    if (n_merge > INT32_MAX)
        return mf_errorf(err, "tokenizer: %llu merges", (unsigned long long)n_merge);

    if (get_id(g, "tokenizer.ggml.bos_token_id", &spec.bos, err) ||
        get_id(g, "tokenizer.ggml.eos_token_id", &spec.eos, err) ||
        get_id(g, "tokenizer.ggml.eot_token_id", &spec.eot, err) ||
        get_id(g, "tokenizer.ggml.padding_token_id", &spec.pad, err) ||
        get_id(g, "tokenizer.ggml.unknown_token_id", &spec.unk, err) ||
        get_flag(g, "tokenizer.ggml.add_bos_token", &spec.add_bos, err) ||
        get_flag(g, "tokenizer.ggml.add_eos_token", &spec.add_eos, err) ||
        get_flag(g, "tokenizer.ggml.add_space_prefix", &spec.add_space_prefix, err))
        return -1;

    const char **toks = mf_malloc(sizeof *toks * n_tok);
    uint32_t *lens = mf_malloc(sizeof *lens * n_tok);
    int32_t *types = kv_type >= 0 ? mf_malloc(sizeof *types * n_tok) : NULL;
    float *scores = kv_score >= 0 ? mf_malloc(sizeof *scores * n_tok) : NULL;
    const char **merges = n_merge ? mf_malloc(sizeof *merges * n_merge) : NULL;
    uint32_t *mlens = n_merge ? mf_malloc(sizeof *mlens * n_merge) : NULL;
    for (uint64_t i = 0; i < n_tok; i++) {
        mf_str s = mf_gguf_arr_str(g, kv_tok, i);
        toks[i] = s.ptr;
        lens[i] = (uint32_t)s.len; /* strings are capped at MF_GGUF_MAX_STRING */
        if (types) {
            int64_t v = mf_gguf_arr_int(g, kv_type, i);
            types[i] = (v >= 0 && v <= MF_TOKEN_BYTE) ? (int32_t)v : MF_TOKEN_UNDEFINED;
        }
        if (scores)
            scores[i] = (float)mf_gguf_arr_float(g, kv_score, i);
    }
    for (uint64_t i = 0; i < n_merge; i++) {
        mf_str s = mf_gguf_arr_str(g, kv_merge, i);
        merges[i] = s.ptr;
        mlens[i] = (uint32_t)s.len;
    }
    spec.n_tokens = (int32_t)n_tok;
    spec.tokens = toks;
    spec.token_lens = lens;
    spec.types = types;
    spec.scores = scores;
    spec.n_merges = (int64_t)n_merge;
    spec.merges = merges;
    spec.merge_lens = mlens;
    rc = mf_tokenizer_new(&spec, out, err);
    free(toks);
    free(lens);
    free(types);
    free(scores);
    free(merges);
    free(mlens);
    return rc;
}

/* ---- chat template detection ------------------------------------------------ */

static bool has_token(const mf_tokenizer *t, const char *s) {
    return t && mf_token_lookup(t, s, strlen(s)) >= 0;
}

/* The template text is Jinja; we only look for each family's markers, most
 * specific first (phi3 and zephyr share <|user|>; they differ in the end
 * marker). */
int mf_chat_template_detect(const mf_gguf *g, const mf_tokenizer *t, mf_chat_template *out) {
    mf_str tmpl = {0};
    if (g && mf_gguf_get_str(g, "tokenizer.chat_template", &tmpl, NULL) != 0)
        tmpl.ptr = NULL;
    if (tmpl.ptr) {
        const char *s = tmpl.ptr;
        if (strstr(s, "<|im_start|>")) {
            *out = MF_CHAT_CHATML;
            return 0;
        }
        if (strstr(s, "<|start_header_id|>")) {
            *out = MF_CHAT_LLAMA3;
            return 0;
        }
        if (strstr(s, "<start_of_turn>")) {
            *out = MF_CHAT_GEMMA;
            return 0;
        }
        if (strstr(s, "<|assistant|>") && strstr(s, "<|end|>")) {
            *out = MF_CHAT_PHI3;
            return 0;
        }
        if (strstr(s, "<|assistant|>")) {
            *out = MF_CHAT_ZEPHYR;
            return 0;
        }
        if (strstr(s, "[INST]")) {
            *out = MF_CHAT_LLAMA2;
            return 0;
        }
    }
    if (has_token(t, "<|im_start|>")) {
        *out = MF_CHAT_CHATML;
        return 0;
    }
    if (has_token(t, "<|start_header_id|>")) {
        *out = MF_CHAT_LLAMA3;
        return 0;
    }
    if (has_token(t, "<start_of_turn>")) {
        *out = MF_CHAT_GEMMA;
        return 0;
    }
    if (has_token(t, "<|assistant|>") && has_token(t, "<|end|>")) {
        *out = MF_CHAT_PHI3;
        return 0;
    }
    *out = MF_CHAT_CHATML;
    return 1;
}
