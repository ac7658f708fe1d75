/* test_tokenizer_gguf.c - the tokenizer loader against type confusion.
 *
 * Every tokenizer.ggml.* key is read with its type (and element type)
 * checked where it is read: a token_type or scores array of strings or of
 * arrays, merges of numbers, a model name that is not a string, ids and flags
 * of the wrong type are refused with one line naming the key, the expected
 * and the found type, never read as numbers (an assertion in the GGUF reader
 * used to abort). Names from the file are escaped in the messages. */
#include "gguf/gguf.h"
#include "mf_test.h"
#include "test_gguf_build.h"
#include "tokenizer/tokenizer.h"

enum { V_U32 = 4, V_I32 = 5, V_F32 = 6, V_BOOL = 7, V_STR = 8, V_ARR = 9 };

/* What to put in place of one key of the base vocab. */
typedef enum { K_TYPE, K_SCORES, K_MERGES, K_MODEL, K_BOS, K_ADD_BOS, K_PRE, K_TMPL, K_N } key_id;
typedef void (*put_fn)(gb *b);

static const char *const key_names[K_N] = {
    "tokenizer.ggml.token_type", "tokenizer.ggml.scores", "tokenizer.ggml.merges",
    "tokenizer.ggml.model", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.pre", "tokenizer.chat_template"};

#define NTOK 4
static const char *const toks[NTOK] = {"a", "b", "ab", "<s>"};

static void arr_hdr(gb *b, uint32_t et, uint64_t n) { gb_u32(b, et); gb_u64(b, n); }

static void p_type_i32(gb *b) { gb_u32(b, V_ARR); arr_hdr(b, V_I32, NTOK); for (int i = 0; i < NTOK; i++) gb_u32(b, i == 3 ? 3 : 1); }
static void p_type_str(gb *b) { gb_u32(b, V_ARR); arr_hdr(b, V_STR, NTOK); for (int i = 0; i < NTOK; i++) gb_str(b, "1"); }
static void p_type_arr(gb *b) {
    gb_u32(b, V_ARR);
    arr_hdr(b, V_ARR, NTOK);
    for (int i = 0; i < NTOK; i++) {
        arr_hdr(b, V_I32, 1);
        gb_u32(b, 1);
    }
}
static void p_scores_f32(gb *b) { gb_u32(b, V_ARR); arr_hdr(b, V_F32, NTOK); for (int i = 0; i < NTOK; i++) gb_u32(b, 0x3f800000u); }
static void p_scores_i32(gb *b) { gb_u32(b, V_ARR); arr_hdr(b, V_I32, NTOK); for (int i = 0; i < NTOK; i++) gb_u32(b, (uint32_t)-i); }
static void p_scores_str(gb *b) { p_type_str(b); }
static void p_scores_arr(gb *b) { p_type_arr(b); }
static void p_scores_bool(gb *b) { gb_u32(b, V_ARR); arr_hdr(b, V_BOOL, NTOK); for (int i = 0; i < NTOK; i++) gb_u8(b, 1); }
static void p_merges_str(gb *b) { gb_u32(b, V_ARR); arr_hdr(b, V_STR, 1); gb_str(b, "a b"); }
static void p_merges_i32(gb *b) { gb_u32(b, V_ARR); arr_hdr(b, V_I32, 1); gb_u32(b, 7); }
static void p_merges_esc(gb *b) { gb_u32(b, V_ARR); arr_hdr(b, V_STR, 1); gb_str(b, "\x1b[2J\n"); }
static void p_model_gpt2(gb *b) { gb_u32(b, V_STR); gb_str(b, "gpt2"); }
static void p_model_u32(gb *b) { gb_u32(b, V_U32); gb_u32(b, 2); }
static void p_model_nul(gb *b) { gb_u32(b, V_STR); gb_strn(b, "gpt2\0x", 6); }
static void p_model_esc(gb *b) { gb_u32(b, V_STR); gb_str(b, "gp\x1b]0;t\x07\n"); }
static void p_bos_u32(gb *b) { gb_u32(b, V_U32); gb_u32(b, 3); }
static void p_bos_str(gb *b) { gb_u32(b, V_STR); gb_str(b, "3"); }
static void p_bos_arr(gb *b) { gb_u32(b, V_ARR); arr_hdr(b, V_U32, 1); gb_u32(b, 3); }
static void p_add_bos_bool(gb *b) { gb_u32(b, V_BOOL); gb_u8(b, 1); }
static void p_add_bos_u32(gb *b) { gb_u32(b, V_U32); gb_u32(b, 1); }
static void p_pre_smollm(gb *b) { gb_u32(b, V_STR); gb_str(b, "smollm"); }
static void p_pre_nul(gb *b) { gb_u32(b, V_STR); gb_strn(b, "gpt2\0evil", 9); }
static void p_pre_esc(gb *b) { gb_u32(b, V_STR); gb_str(b, "x\x1b[31m"); }

static void p_tmpl_str(gb *b) { gb_u32(b, V_STR); gb_str(b, "{{ '<|im_start|>' }}"); }
static void p_tmpl_nul(gb *b) { gb_u32(b, V_STR); gb_strn(b, "{{ x }}\0<|im_start|>", 20); }

static const put_fn base[K_N] = {p_type_i32, p_scores_f32, p_merges_str, p_model_gpt2, p_bos_u32,
                                 p_add_bos_bool, p_pre_smollm, p_tmpl_str};

/* The base vocab with key k's value written by put (put NULL: k left out). */
static int load(key_id k, put_fn put, mf_error *err) {
    gb b = {0};
    int n_kv = 1 + K_N - (put ? 0 : 1);
    gb_header(&b, 3, 0, (uint64_t)n_kv);
    gb_kv(&b, "tokenizer.ggml.tokens", V_ARR);
    arr_hdr(&b, V_STR, NTOK);
    for (int i = 0; i < NTOK; i++)
        gb_str(&b, toks[i]);
    for (int i = 0; i < K_N; i++) {
        put_fn f = i == (int)k ? put : base[i];
        if (!f)
            continue;
        gb_str(&b, key_names[i]);
        f(&b);
    }
    mf_gguf *g = NULL;
    int rc = -1;
    if (mf_gguf_parse(b.p, b.n, &g, err) == 0) {
        mf_tokenizer *t = (mf_tokenizer *)1;
        rc = mf_tokenizer_from_gguf(g, &t, err);
        if (rc == 0)
            mf_tokenizer_free(t);
        else if (t != NULL)
            rc = -2; /* out must be cleared on failure */
        mf_gguf_close(g);
    }
    gb_free(&b);
    return rc;
}

static void refused(key_id k, put_fn put, const char *want) {
    mf_error err = {{0}};
    int rc = load(k, put, &err);
    CHECK_MSG(rc == -1, "%s: rc %d, wanted a refusal containing '%s'", key_names[k], rc, want);
    CHECK_STR_CONTAINS(err.msg, want);
    for (const char *c = err.msg; *c; c++)
        CHECK_MSG((unsigned char)*c >= 0x20 && *c != 0x7f, "control byte 0x%02x in '%s'", (unsigned char)*c,
                  err.msg);
}

static void accepted(key_id k, put_fn put) {
    mf_error err = {{0}};
    CHECK_MSG(load(k, put, &err) == 0, "%s: %s", key_names[k], err.msg);
}

MF_TEST(base_and_numeric_variants_load) {
    accepted(K_TYPE, p_type_i32);
    accepted(K_SCORES, p_scores_i32);  /* integers are numbers */
    accepted(K_SCORES, NULL);          /* optional keys may be absent */
    accepted(K_TYPE, NULL);
    accepted(K_ADD_BOS, NULL);
}

MF_TEST(wrong_types_are_refused_by_key) {
    refused(K_TYPE, p_type_str, "key 'tokenizer.ggml.token_type': array of string, expected array of integers");
    refused(K_TYPE, p_type_arr, "key 'tokenizer.ggml.token_type': array of array, expected array of integers");
    refused(K_TYPE, p_scores_f32, "key 'tokenizer.ggml.token_type': array of float32, expected array of integers");
    refused(K_SCORES, p_scores_str, "key 'tokenizer.ggml.scores': array of string, expected array of numbers");
    refused(K_SCORES, p_scores_arr, "key 'tokenizer.ggml.scores': array of array, expected array of numbers");
    refused(K_SCORES, p_scores_bool, "key 'tokenizer.ggml.scores': array of bool, expected array of numbers");
    refused(K_SCORES, p_bos_u32, "key 'tokenizer.ggml.scores': type uint32, expected array of numbers");
    refused(K_MERGES, p_merges_i32, "key 'tokenizer.ggml.merges': array of int32, expected array of string");
    refused(K_MODEL, p_model_u32, "key 'tokenizer.ggml.model': type uint32, expected string");
    refused(K_BOS, p_bos_str, "key 'tokenizer.ggml.bos_token_id': type string, expected uint32");
    refused(K_BOS, p_bos_arr, "key 'tokenizer.ggml.bos_token_id': array of uint32, expected uint32");
    refused(K_ADD_BOS, p_add_bos_u32, "key 'tokenizer.ggml.add_bos_token': type uint32, expected bool");
    refused(K_TMPL, p_type_str, "key 'tokenizer.chat_template': array of string, expected string");
}

MF_TEST(file_strings_are_checked_whole_and_escaped) {
    refused(K_MODEL, p_model_nul, "unsupported model 'gpt2\\x00x'");
    refused(K_MODEL, p_model_esc, "unsupported model 'gp\\x1b]0;t\\x07\\x0a'");
    refused(K_PRE, p_pre_nul, "'tokenizer.ggml.pre' 'gpt2\\x00evil' contains a NUL byte");
    refused(K_PRE, p_pre_esc, "unknown pre-tokenizer 'x\\x1b[31m'");
    refused(K_TMPL, p_tmpl_nul, "key 'tokenizer.chat_template' contains a NUL byte at 7 of 20 bytes");
    refused(K_MERGES, p_merges_esc, "merge 0 '\\x1b[2J\\x0a' has no space");
}

MF_TEST_MAIN(MF_T(base_and_numeric_variants_load), MF_T(wrong_types_are_refused_by_key),
             MF_T(file_strings_are_checked_whole_and_escaped))
