/* test_tokenizer_core.c - tokenizer core on vocabs built in code: byte-level
 * BPE merge order, special-token matching, spm byte fallback and score
 * order, the streaming detokenizer, chat templates, error messages, and
 * (when the model file is there) the SmolLM2 vocab. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mf_test.h"
#include "tok_vocab.h"
#include "tokenizer/tokenizer.h"

/* ---- a small gpt2-style vocab ---------------------------------------------------- */

enum { V_BYTES = 256, V_AA = 256, V_AAAA, V_SPC_A, V_IM_START, V_IM_END, V_IM, V_USER_TOK,
       V_N };

/* 256 byte tokens, "aa", "aaaa", "Ġa", three control tokens (one a prefix of
 * another) and one user-defined token, in the ids of the enum above; merges:
 * "a a", "aa aa", "Ġ a". */
static mf_tokenizer *small_gpt2(const char *pre, mf_error *err) {
    static tok_vocab v;
    v.n = 0;
    tok_vocab_add_gpt2_bytes(&v);
    tok_vocab_add(&v, "aa", MF_TOKEN_NORMAL, 0);
    tok_vocab_add(&v, "aaaa", MF_TOKEN_NORMAL, 0);
    tok_vocab_add(&v, "\u0120a", MF_TOKEN_NORMAL, 0);
    tok_vocab_add(&v, "<|im_start|>", MF_TOKEN_CONTROL, 0);
    tok_vocab_add(&v, "<|im_end|>", MF_TOKEN_CONTROL, 0);
    tok_vocab_add(&v, "<|im", MF_TOKEN_CONTROL, 0);
    tok_vocab_add(&v, "@@user@@", MF_TOKEN_USER_DEFINED, 0);
    if (v.n != V_N)
        abort(); /* the enum and the adds disagree */
    static const char *merges[] = {"a a", "aa aa", "\xc4\xa0 a"};
    mf_tokenizer_spec spec;
    mf_tokenizer_spec_init(&spec, MF_TOKENIZER_GPT2);
    spec.pre = pre;
    spec.n_tokens = v.n;
    spec.tokens = v.ptrs;
    spec.types = v.types;
    spec.n_merges = 3;
    spec.merges = merges;
    spec.eos = V_IM_END;
    mf_tokenizer *t = NULL;
    if (mf_tokenizer_new(&spec, &t, err))
        return NULL;
    return t;
}

static int64_t tok(const mf_tokenizer *t, const char *s, size_t n, bool parse, int32_t *out,
                   int64_t cap) {
    mf_error err;
    return mf_tokenize(t, s, n, false, parse, out, cap, &err);
}

MF_TEST(test_bpe_merge_order) {
    mf_error err;
    mf_tokenizer *t = small_gpt2("gpt2", &err);
    CHECK(t != NULL);
    if (!t)
        return;
    int32_t ids[16];
    /* "aaa": the leftmost of two equal-rank pairs merges first */
    CHECK_EQ_INT(tok(t, "aaa", 3, true, ids, 16), 2);
    CHECK_EQ_INT(ids[0], V_AA);
    CHECK_EQ_INT(ids[1], 'a');
    /* "aaaaa" -> aa aa a -> aaaa a */
    CHECK_EQ_INT(tok(t, "aaaaa", 5, true, ids, 16), 2);
    CHECK_EQ_INT(ids[0], V_AAAA);
    CHECK_EQ_INT(ids[1], 'a');
    /* " a" is one pre-token; " b" stays two bytes */
    CHECK_EQ_INT(tok(t, " a b", 4, true, ids, 16), 3);
    CHECK_EQ_INT(ids[0], V_SPC_A);
    CHECK_EQ_INT(ids[1], 32);
    CHECK_EQ_INT(ids[2], 'b');
    /* cap: the count is returned, only cap ids written */
    ids[1] = -7;
    CHECK_EQ_INT(tok(t, "xyz", 3, true, ids, 1), 3);
    CHECK_EQ_INT(ids[0], 'x');
    CHECK_EQ_INT(ids[1], -7);
    mf_tokenizer_free(t);
}

MF_TEST(test_special_tokens) {
    mf_error err;
    mf_tokenizer *t = small_gpt2("smollm", &err);
    CHECK(t != NULL);
    if (!t)
        return;
    int32_t ids[64];
    const char *s = "x<|im_start|>y<|im";
    int64_t n = tok(t, s, strlen(s), true, ids, 64);
    /* longest match wins over the prefix token "<|im" */
    CHECK_EQ_INT(n, 4);
    CHECK_EQ_INT(ids[0], 'x');
    CHECK_EQ_INT(ids[1], V_IM_START);
    CHECK_EQ_INT(ids[2], 'y');
    CHECK_EQ_INT(ids[3], V_IM);
    /* parse_special off: no control ids, text tokenized as bytes */
    n = tok(t, s, strlen(s), false, ids, 64);
    CHECK(n > 4);
    for (int64_t i = 0; i < n && i < 64; i++)
        CHECK(ids[i] != V_IM_START && ids[i] != V_IM);
    /* user-defined tokens match either way */
    const char *u = "a@@user@@b";
    CHECK_EQ_INT(tok(t, u, strlen(u), false, ids, 64), 3);
    CHECK_EQ_INT(ids[1], V_USER_TOK);
    CHECK(mf_token_is_eog(t, V_IM_END));
    CHECK(!mf_token_is_eog(t, V_IM_START));
    CHECK(!mf_token_is_eog(t, 'a'));
    char buf[32];
    CHECK_EQ_INT(mf_token_to_piece(t, V_IM_START, false, buf, sizeof buf), 0);
    CHECK_EQ_INT(mf_token_to_piece(t, V_IM_START, true, buf, sizeof buf), 12);
    CHECK(!memcmp(buf, "<|im_start|>", 12));
    CHECK_EQ_INT(mf_token_to_piece(t, V_N, true, buf, sizeof buf), -1);
    mf_tokenizer_free(t);
}

/* Random bytes (invalid UTF-8 included) must round-trip through ids and
 * pieces, with every pre-tokenizer. */
MF_TEST(test_random_bytes_roundtrip) {
    static const char *pres[] = {"gpt2", "smollm", "qwen2", "llama3", "deepseek-llm"};
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (size_t p = 0; p < sizeof pres / sizeof pres[0]; p++) {
        mf_error err;
        mf_tokenizer *t = small_gpt2(pres[p], &err);
        CHECK(t != NULL);
        if (!t)
            return;
        for (int iter = 0; iter < 200; iter++) {
            char text[300], back[2000];
            size_t n = 0;
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            size_t len = rng % sizeof text;
            for (size_t i = 0; i < len; i++) {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                /* bias towards ASCII letters, spaces, digits and UTF-8 lead bytes */
                static const char pool[] = "aaa  \t\n\r0123'sS\xc3\xa9\xe4\xb8\x80\xf0\x9f\x98\x80";
                text[i] = (rng >> 40) % 3 ? pool[(rng >> 8) % (sizeof pool - 1)] : (char)(rng >> 24);
            }
            int32_t ids[400];
            int64_t k = tok(t, text, len, false, ids, 400);
            CHECK(k >= 0 && k <= (int64_t)len);
            for (int64_t i = 0; i < k && i < 400; i++) {
                int l = mf_token_to_piece(t, ids[i], true, back + n, sizeof back - n);
                CHECK(l >= 0);
                n += (size_t)l;
            }
            CHECK_MSG(n == len && !memcmp(back, text, len), "pre %s iter %d len %zu", pres[p],
                      iter, len);
        }
        mf_tokenizer_free(t);
    }
}

MF_TEST(test_streaming_detok) {
    mf_error err;
    mf_tokenizer *t = small_gpt2("gpt2", &err);
    CHECK(t != NULL);
    if (!t)
        return;
    /* U+1F600 as four byte tokens: nothing comes out until the last one */
    const uint8_t emoji[4] = {0xF0, 0x9F, 0x98, 0x80};
    mf_detok d;
    mf_detok_init(&d);
    char out[64];
    for (int i = 0; i < 3; i++)
        CHECK_EQ_INT(mf_detok_push(t, &d, emoji[i], out, sizeof out), 0);
    CHECK_EQ_INT(mf_detok_push(t, &d, emoji[3], out, sizeof out), 4);
    CHECK(!memcmp(out, emoji, 4));
    CHECK_EQ_INT(mf_detok_flush(&d, out, sizeof out), 0);
    /* an interrupted sequence becomes U+FFFD followed by the new byte */
    CHECK_EQ_INT(mf_detok_push(t, &d, 0xE4, out, sizeof out), 0);
    CHECK_EQ_INT(mf_detok_push(t, &d, 'A', out, sizeof out), 4);
    CHECK(!memcmp(out, "\xef\xbf\xbd" "A", 4));
    /* a byte that never starts UTF-8 */
    CHECK_EQ_INT(mf_detok_push(t, &d, 0xFF, out, sizeof out), 3);
    /* overlong lead E0 80 is refused at the second byte */
    CHECK_EQ_INT(mf_detok_push(t, &d, 0xE0, out, sizeof out), 0);
    CHECK_EQ_INT(mf_detok_push(t, &d, 0x80, out, sizeof out), 6);
    /* leftovers at the end flush as one U+FFFD */
    CHECK_EQ_INT(mf_detok_push(t, &d, 0xF0, out, sizeof out), 0);
    CHECK_EQ_INT(mf_detok_push(t, &d, 0x9F, out, sizeof out), 0);
    CHECK_EQ_INT(mf_detok_flush(&d, out, sizeof out), 3);
    CHECK(!memcmp(out, "\xef\xbf\xbd", 3));
    /* control tokens render only when asked */
    CHECK_EQ_INT(mf_detok_push(t, &d, V_IM_END, out, sizeof out), 0);
    d.render_special = true;
    CHECK_EQ_INT(mf_detok_push(t, &d, V_IM_END, out, sizeof out), 10);
    mf_tokenizer_free(t);
}

MF_TEST(test_unknown_pre_error) {
    mf_error err = {{0}};
    mf_tokenizer *t = small_gpt2("foo", &err);
    CHECK(t == NULL);
    CHECK_STR_CONTAINS(err.msg, "tokenizer: unknown pre-tokenizer 'foo'");
    const char *toks[] = {"a", "b"};
    mf_tokenizer_spec spec;
    mf_tokenizer_spec_init(&spec, MF_TOKENIZER_GPT2);
    spec.n_tokens = 2;
    spec.tokens = toks;
    spec.bos = 5;
    CHECK(mf_tokenizer_new(&spec, &t, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "bos id 5 out of range (vocab 2)");
    const char *bad_merge[] = {"ab"};
    spec.bos = -1;
    spec.n_merges = 1;
    spec.merges = bad_merge;
    CHECK(mf_tokenizer_new(&spec, &t, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "merge 0 'ab' has no space");
}

/* A byte the vocab has no token for becomes unk when the vocab has one, and
 * is an error naming the byte when it has none (never silently dropped). */
MF_TEST(test_unencodable_byte) {
    const char *toks[] = {"h", "i", "<unk>"};
    const int32_t types[] = {MF_TOKEN_NORMAL, MF_TOKEN_NORMAL, MF_TOKEN_UNKNOWN};
    for (int with_unk = 0; with_unk < 2; with_unk++) {
        mf_tokenizer_spec spec;
        mf_tokenizer_spec_init(&spec, MF_TOKENIZER_GPT2);
        spec.n_tokens = 3;
        spec.tokens = toks;
        spec.types = types;
        spec.unk = with_unk ? 2 : -1;
        mf_tokenizer *t = NULL;
        mf_error err = {{0}};
        CHECK_MSG(mf_tokenizer_new(&spec, &t, &err) == 0, "%s", err.msg);
        if (!t)
            continue;
        int32_t out[8];
        CHECK_EQ_INT(mf_tokenize(t, "hi", 2, false, false, out, 8, &err), 2);
        int64_t n = mf_tokenize(t, "hi!h\xff", 5, false, false, out, 8, &err);
        if (with_unk) {
            CHECK_EQ_INT(n, 5);
            CHECK(n == 5 && out[0] == 0 && out[1] == 1 && out[2] == 2 && out[3] == 0 && out[4] == 2);
        } else {
            CHECK_EQ_INT(n, -1);
            CHECK_STR_CONTAINS(err.msg, "byte 0x21 has no token");
            err.msg[0] = 0;
            CHECK_EQ_INT(mf_tokenize(t, "hih\xff", 4, false, false, out, 8, &err), -1);
            CHECK_STR_CONTAINS(err.msg, "byte 0xFF has no token");
        }
        mf_tokenizer_free(t);
    }
    /* spm without byte tokens or unk: the same error */
    const char *sp[] = {"\xe2\x96\x81", "h", "i"};
    mf_tokenizer_spec spec;
    mf_tokenizer_spec_init(&spec, MF_TOKENIZER_SPM);
    spec.n_tokens = 3;
    spec.tokens = sp;
    mf_tokenizer *t = NULL;
    mf_error err = {{0}};
    CHECK_MSG(mf_tokenizer_new(&spec, &t, &err) == 0, "%s", err.msg);
    if (t) {
        int32_t out[8];
        CHECK_EQ_INT(mf_tokenize(t, "hi", 2, false, false, out, 8, &err), 3);
        CHECK_EQ_INT(mf_tokenize(t, "hi?", 3, false, false, out, 8, &err), -1);
        CHECK_STR_CONTAINS(err.msg, "byte 0x3F has no token");
        mf_tokenizer_free(t);
    }
}

/* ---- spm --------------------------------------------------------------------------- */

/* <unk> <s> </s> <0x00>..<0xFF> then pieces with scores. */
static mf_tokenizer *small_spm(float score_ab, float score_bc, mf_error *err) {
    static tok_vocab v;
    v.n = 0;
    tok_vocab_add(&v, "<unk>", MF_TOKEN_UNKNOWN, 0);
    tok_vocab_add(&v, "<s>", MF_TOKEN_CONTROL, 0);
    tok_vocab_add(&v, "</s>", MF_TOKEN_CONTROL, 0);
    tok_vocab_add_spm_bytes(&v);
    static const char *pieces[] = {"\xe2\x96\x81", "a", "b", "c", "h", "ab", "bc",
                                   "\xe2\x96\x81h", "\u2581a"};
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) {
        float score = -(float)i - 10;
        if (!strcmp(pieces[i], "ab"))
            score = score_ab;
        if (!strcmp(pieces[i], "bc"))
            score = score_bc;
        tok_vocab_add(&v, pieces[i], MF_TOKEN_NORMAL, score);
    }
    mf_tokenizer_spec spec;
    mf_tokenizer_spec_init(&spec, MF_TOKENIZER_SPM);
    spec.n_tokens = v.n;
    spec.tokens = v.ptrs;
    spec.types = v.types;
    spec.scores = v.scores;
    spec.unk = 0, spec.bos = 1, spec.eos = 2;
    mf_tokenizer *t = NULL;
    mf_tokenizer_new(&spec, &t, err);
    return t;
}

static int32_t id_of(const mf_tokenizer *t, const char *s) { return mf_token_lookup(t, s, strlen(s)); }

MF_TEST(test_spm_scores_and_byte_fallback) {
    mf_error err;
    mf_tokenizer *t = small_spm(-1.0f, -2.0f, &err);
    CHECK(t != NULL);
    if (!t)
        return;
    int32_t ids[32];
    /* "abc" -> "▁abc": ▁a (-18) vs ab (-1) vs bc (-2): ab first, then nothing */
    int64_t n = mf_tokenize(t, "abc", 3, true, false, ids, 32, &err);
    CHECK_EQ_INT(n, 4); /* <s> ▁ ab c */
    CHECK_EQ_INT(ids[0], 1);
    CHECK_EQ_INT(ids[1], id_of(t, "\xe2\x96\x81"));
    CHECK_EQ_INT(ids[2], id_of(t, "ab"));
    CHECK_EQ_INT(ids[3], id_of(t, "c"));
    mf_tokenizer_free(t);
    t = small_spm(-2.0f, -1.0f, &err);
    CHECK(t != NULL);
    if (!t)
        return;
    n = mf_tokenize(t, "abc", 3, false, false, ids, 32, &err);
    CHECK_EQ_INT(n, 2); /* ▁a bc: the higher-scored bc wins over ab */
    CHECK_EQ_INT(ids[0], id_of(t, "\u2581a"));
    CHECK_EQ_INT(ids[1], id_of(t, "bc"));
    /* "hé": é is not a piece -> <0xC3> <0xA9> */
    n = mf_tokenize(t, "h\xc3\xa9", 3, false, false, ids, 32, &err);
    CHECK_EQ_INT(n, 3);
    CHECK_EQ_INT(ids[0], id_of(t, "\xe2\x96\x81h"));
    CHECK_EQ_INT(ids[1], id_of(t, "<0xC3>"));
    CHECK_EQ_INT(ids[2], id_of(t, "<0xA9>"));
    char buf[16];
    CHECK_EQ_INT(mf_token_to_piece(t, ids[0], false, buf, sizeof buf), 2);
    CHECK(!memcmp(buf, " h", 2));
    CHECK_EQ_INT(mf_token_to_piece(t, ids[1], false, buf, sizeof buf), 1);
    CHECK_EQ_INT((uint8_t)buf[0], 0xC3);
    /* detok joins the two byte tokens into é */
    mf_detok d;
    mf_detok_init(&d);
    char out[32];
    size_t k = 0;
    for (int i = 0; i < 3; i++)
        k += mf_detok_push(t, &d, ids[i], out + k, sizeof out - k);
    CHECK_EQ_INT(k, 4);
    CHECK(!memcmp(out, " h\xc3\xa9", 4));
    mf_tokenizer_free(t);
}

/* ---- chat templates --------------------------------------------------------------- */

MF_TEST(test_chat_templates) {
    mf_chat_msg msgs[] = {{"system", "Be brief."}, {"user", "Hi there"}, {"assistant", "Hello!"},
                          {"user", " 2+2? "}};
    char *s = mf_chat_render(MF_CHAT_CHATML, msgs, 4, true);
    CHECK(s && !strcmp(s, "<|im_start|>system\nBe brief.<|im_end|>\n"
                          "<|im_start|>user\nHi there<|im_end|>\n"
                          "<|im_start|>assistant\nHello!<|im_end|>\n"
                          "<|im_start|>user\n 2+2? <|im_end|>\n"
                          "<|im_start|>assistant\n"));
    free(s);
    s = mf_chat_render(MF_CHAT_LLAMA3, msgs, 4, true);
    CHECK(s && !strcmp(s, "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                          "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                          "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                          "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
                          "<|start_header_id|>assistant<|end_header_id|>\n\n"));
    free(s);
    s = mf_chat_render(MF_CHAT_CHATML, msgs + 1, 1, false);
    CHECK(s && !strcmp(s, "<|im_start|>user\nHi there<|im_end|>\n"));
    free(s);
    s = mf_chat_render(MF_CHAT_GEMMA, msgs, 2, true);
    CHECK(s && !strcmp(s, "<start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n"
                          "<start_of_turn>model\n"));
    free(s);
    s = mf_chat_render(MF_CHAT_CHATML, NULL, 0, false);
    CHECK(s && !strcmp(s, ""));
    free(s);
    /* A system turn after the last user turn, or alone, is not dropped by
     * the renderers that fold system into a user turn. */
    mf_chat_msg late[] = {{"user", "Hi"}, {"system", "Answer in French."}};
    s = mf_chat_render(MF_CHAT_GEMMA, late, 2, true);
    CHECK(s && !strcmp(s, "<start_of_turn>user\nHi<end_of_turn>\n"
                          "<start_of_turn>user\nAnswer in French.<end_of_turn>\n"
                          "<start_of_turn>model\n"));
    free(s);
    s = mf_chat_render(MF_CHAT_LLAMA2, late, 2, true);
    CHECK(s && !strcmp(s, "[INST] Hi [/INST]<s>[INST] <<SYS>>\nAnswer in French.\n<</SYS>>\n\n [/INST]"));
    free(s);
    s = mf_chat_render(MF_CHAT_LLAMA2, late + 1, 1, false);
    CHECK(s && !strcmp(s, "[INST] <<SYS>>\nAnswer in French.\n<</SYS>>\n\n [/INST]"));
    free(s);
    mf_chat_msg two_sys[] = {{"system", "A."}, {"system", "B."}, {"user", "Q"}};
    s = mf_chat_render(MF_CHAT_GEMMA, two_sys, 3, false);
    CHECK(s && !strcmp(s, "<start_of_turn>user\nA.\n\nB.\n\nQ<end_of_turn>\n"));
    free(s);
    mf_chat_template tm;
    mf_error err = {{0}};
    CHECK(mf_chat_template_from_name("llama3", &tm, &err) == 0 && tm == MF_CHAT_LLAMA3);
    CHECK(mf_chat_template_from_name("nope", &tm, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "unknown template 'nope'");
    mf_tokenizer *t = small_gpt2("gpt2", &err);
    CHECK(t && mf_chat_template_detect(NULL, t, &tm) == 0 && tm == MF_CHAT_CHATML);
    mf_tokenizer_free(t);
}

/* ---- the real vocab ------------------------------------------------------------------ */

MF_TEST(test_smollm2_vocab) {
    const char *path = getenv("MINFER_MODEL");
    if (!path || !*path)
        return;
    mf_gguf *g;
    mf_error err;
    if (mf_gguf_open(path, &g, &err)) {
        printf("  (skipped: %s)\n", err.msg);
        return;
    }
    mf_tokenizer *t;
    uint64_t t0 = mf_time_ns();
    int rc = mf_tokenizer_from_gguf(g, &t, &err);
    double ms = (double)(mf_time_ns() - t0) / 1e6;
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) {
        mf_gguf_close(g);
        return;
    }
    /* Reported, not asserted: timings vary with the machine and sanitizers. */
    printf("  SmolLM2 vocab loaded in %.1f ms\n", ms);
    CHECK_EQ_INT(mf_tokenizer_n_vocab(t), 49152);
    CHECK_EQ_INT(mf_token_eos(t), 2);
    CHECK(mf_token_is_eog(t, 2) && mf_token_is_eog(t, 0) && !mf_token_is_eog(t, 1));
    int32_t ids[16];
    const char *s = "<|im_start|>Hello world";
    CHECK_EQ_INT(mf_tokenize(t, s, strlen(s), true, true, ids, 16, &err), 3);
    CHECK_EQ_INT(ids[0], 1);
    CHECK_EQ_INT(ids[1], 19556);
    CHECK_EQ_INT(ids[2], 905);
    mf_chat_template tm;
    CHECK(mf_chat_template_detect(g, t, &tm) == 0 && tm == MF_CHAT_CHATML);
    mf_tokenizer_free(t);
    mf_gguf_close(g);
}

MF_TEST_MAIN(MF_T(test_bpe_merge_order), MF_T(test_special_tokens), MF_T(test_unencodable_byte),
             MF_T(test_random_bytes_roundtrip), MF_T(test_streaming_detok),
             MF_T(test_unknown_pre_error), MF_T(test_spm_scores_and_byte_fallback),
             MF_T(test_chat_templates), MF_T(test_smollm2_vocab))
