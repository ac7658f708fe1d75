/* test_runtime_session.c - the public session API on the real model
 * ($MINFER_MODEL): batched prefill equals token-by-token decode, logits_all
 * rows equal the one-row logits, reset reproduces, a full context is an error
 * that changes nothing, bad token ids and options are refused, the KV size,
 * and minfer_generate's stop conditions. Skips (passes) when no model. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "mf_test.h"
#include "minfer.h"
#include "runtime/runtime.h" /* the session's engine: reserve checks */

static minfer_model *model;
static int32_t n_vocab;

static minfer_session *session(int32_t n_ctx, int32_t n_batch, bool all, const char *ct) {
    minfer_session_options o;
    minfer_session_options_default(&o);
    o.n_ctx = n_ctx;
    o.n_batch = n_batch;
    o.logits_all = all;
    o.cache_type = ct;
    char err[512];
    minfer_session *s = minfer_session_new(model, &o, err, sizeof err);
    CHECK_MSG(s != NULL, "%s", err);
    return s;
}

static double max_diff(const float *a, const float *b) {
    double m = 0;
    for (int32_t i = 0; i < n_vocab; i++)
        m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static int32_t argmax(const float *a) {
    int32_t k = 0;
    for (int32_t i = 1; i < n_vocab; i++)
        if (a[i] > a[k])
            k = i;
    return k;
}

/* random-ish but fixed token ids */
static void tokens(int32_t *t, int n, uint32_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        t[i] = (int32_t)(seed >> 8) % n_vocab;
    }
}

MF_TEST(prefill_batches_equal_decode_steps) {
    enum { N = 9 };
    int32_t t[N];
    tokens(t, N, 1);
    char err[512];
    minfer_session *a = session(64, 512, true, NULL); /* one batch, every row */
    minfer_session *b = session(64, 4, false, NULL);  /* batches of 4, last row */
    minfer_session *c = session(64, 512, false, NULL);
    if (!a || !b || !c)
        goto out;
    CHECK(minfer_prefill(a, t, N, err, sizeof err) == 0);
    CHECK(minfer_prefill(b, t, N, err, sizeof err) == 0);
    CHECK_EQ_INT(minfer_session_n_past(a), N);
    CHECK_EQ_INT(minfer_session_n_past(b), N);
    /* a: row i = the logits after tokens 0..i; c decodes one at a time */
    double worst = 0;
    for (int i = 0; i < N; i++) {
        CHECK(minfer_decode(c, t[i], err, sizeof err) == 0);
        const float *row = minfer_logits_ith(a, i), *one = minfer_logits(c);
        CHECK(row && one);
        if (!row || !one)
            break;
        worst = fmax(worst, max_diff(row, one));
        CHECK_EQ_INT(argmax(row), argmax(one));
    }
    /* CPU matmuls quantize the activations per call; batch shapes may sum
     * in another order, so equal within a small absolute tolerance. */
    printf("  batched vs one-by-one: max logit difference %.3g\n", worst);
    CHECK_MSG(worst < 0.05, "batched vs decode logits differ by %g", worst);
    CHECK(minfer_logits_ith(a, N) == NULL);
    CHECK(max_diff(minfer_logits(a), minfer_logits(b)) < 0.05);
    CHECK(minfer_logits_ith(b, 1) == NULL); /* only the last row without logits_all */

    /* reset: the same tokens give the same logits, bit for bit */
    float *first = malloc((size_t)n_vocab * sizeof *first);
    memcpy(first, minfer_logits(b), (size_t)n_vocab * sizeof *first);
    minfer_session_reset(b);
    CHECK_EQ_INT(minfer_session_n_past(b), 0);
    CHECK(minfer_prefill(b, t, N, err, sizeof err) == 0);
    CHECK(memcmp(first, minfer_logits(b), (size_t)n_vocab * sizeof *first) == 0);
    free(first);
out:
    minfer_session_free(a);
    minfer_session_free(b);
    minfer_session_free(c);
}

MF_TEST(full_context_is_an_error_that_changes_nothing) {
    int32_t t[20];
    tokens(t, 20, 2);
    char err[512] = "";
    minfer_session *s = session(16, 8, false, NULL);
    if (!s)
        return;
    CHECK_EQ_INT(minfer_session_n_ctx(s), 16);
    CHECK(minfer_prefill(s, t, 12, err, sizeof err) == 0);
    float *before = malloc((size_t)n_vocab * sizeof *before);
    memcpy(before, minfer_logits(s), (size_t)n_vocab * sizeof *before);
    CHECK(minfer_prefill(s, t, 5, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "context full");
    CHECK_EQ_INT(minfer_session_n_past(s), 12);
    CHECK(memcmp(before, minfer_logits(s), (size_t)n_vocab * sizeof *before) == 0);
    CHECK(minfer_prefill(s, t, 4, err, sizeof err) == 0); /* exactly full is fine */
    CHECK(minfer_decode(s, t[0], err, sizeof err) == -1);
    CHECK_EQ_INT(minfer_session_n_past(s), 16);
    free(before);

    /* bad ids never reach the embedding gather */
    minfer_session_reset(s);
    int32_t bad[2] = {1, n_vocab};
    CHECK(minfer_prefill(s, bad, 2, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "outside the vocabulary");
    bad[1] = -3;
    CHECK(minfer_prefill(s, bad, 2, err, sizeof err) == -1);
    CHECK(minfer_prefill(s, bad, 0, err, sizeof err) == -1);
    CHECK_EQ_INT(minfer_session_n_past(s), 0);
    minfer_session_free(s);
}

static int n_cb;
static bool count_cb(void *user, int32_t token, const char *text, size_t len) {
    (void)user;
    (void)text;
    (void)len;
    if (token >= 0)
        n_cb++;
    return true;
}

MF_TEST(generate_stops_cleanly) {
    char err[512] = "";
    minfer_sampler_options so;
    minfer_sampler_options_default(&so);
    so.temp = 0;
    minfer_sampler *smp = minfer_sampler_new(&so);
    minfer_session *s = session(12, 512, false, NULL);
    minfer_generate_stats st;
    if (!s)
        goto out;
    /* 5 prompt tokens, context 12: generation stops at the context */
    n_cb = 0;
    CHECK(minfer_generate(s, smp, "The capital of France is", -1, count_cb, NULL, &st, err,
                          sizeof err) == 0);
    CHECK_EQ_INT(st.n_prompt, 5);
    CHECK(st.stopped_ctx);
    CHECK_EQ_INT(st.n_generated, 12 - 5 + 1); /* the last one is emitted, not stored */
    CHECK_EQ_INT(n_cb, st.n_generated);
    CHECK_EQ_INT(minfer_session_n_past(s), 12);
    /* a prompt that no longer fits is an error, not a truncation */
    CHECK(minfer_generate(s, smp, "more", 4, NULL, NULL, &st, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "does not fit the context");
    minfer_session_reset(s);
    /* n_predict caps; a callback returning false stops at once */
    CHECK(minfer_generate(s, smp, "The capital of France is", 3, NULL, NULL, &st, err,
                          sizeof err) == 0);
    CHECK_EQ_INT(st.n_generated, 3);
    CHECK(!st.stopped_ctx);
    CHECK(minfer_generate(s, smp, "x", -2, NULL, NULL, &st, err, sizeof err) == -1);
out:
    minfer_session_free(s);
    minfer_sampler_free(smp);
}

MF_TEST(options_and_sizes) {
    char err[512] = "";
    minfer_session_options o;
    minfer_session_options_default(&o);
    CHECK_EQ_INT(o.n_batch, 512);
    minfer_session *s = session(0, 512, false, NULL); /* default: min(8192, 4096) */
    if (s) {
        CHECK_EQ_INT(minfer_session_n_ctx(s), 4096);
        /* 30 layers x K,V x 4096 rows x 192 f32 */
        CHECK_EQ_INT(minfer_session_kv_bytes(s), 30ull * 2 * 4096 * 192 * 4);
        minfer_session_free(s);
    }
    s = session(64, 512, false, "q8_0");
    if (s) {
        CHECK_EQ_INT(minfer_session_kv_bytes(s), 30ull * 2 * 64 * (192 / 32) * 34);
        minfer_session_free(s);
    }
    s = session(64, 512, false, "f16");
    if (s) {
        CHECK_EQ_INT(minfer_session_kv_bytes(s), 30ull * 2 * 64 * 192 * 2);
        minfer_session_free(s);
    }
    o.n_ctx = -5;
    CHECK(minfer_session_new(model, &o, err, sizeof err) == NULL);
    CHECK_STR_CONTAINS(err, "n_ctx");
    o.n_ctx = 64;
    o.cache_type = "q4_z";
    CHECK(minfer_session_new(model, &o, err, sizeof err) == NULL);
    CHECK_STR_CONTAINS(err, "cache type");

    CHECK_EQ_INT(minfer_model_n_vocab(model), 49152);
    CHECK_EQ_INT(minfer_model_n_layers(model), 30);
    CHECK_STR_CONTAINS(minfer_model_arch(model), "llama");
    CHECK_STR_CONTAINS(minfer_model_desc(model), "llama 135M");
    CHECK(minfer_model_n_params(model) > 130000000 && minfer_model_n_params(model) < 140000000);
    char piece[64];
    int32_t ids[8];
    CHECK_EQ_INT(minfer_tokenize(model, " Paris", 6, false, false, ids, 8), 1);
    int32_t k = minfer_token_to_piece(model, ids[0], piece, sizeof piece);
    CHECK(k == 6 && !memcmp(piece, " Paris", 6));
    CHECK(minfer_token_is_eog(model, minfer_token_eos(model)));
    minfer_chat_message m[2] = {{"system", "Be brief."}, {"user", "Hi"}};
    char *txt = minfer_chat_apply(model, NULL, m, 2, true, err, sizeof err);
    CHECK_STR_CONTAINS(txt, "<|im_start|>user\nHi<|im_end|>");
    CHECK_STR_CONTAINS(txt, "<|im_start|>assistant\n");
    free(txt);
    CHECK(minfer_chat_apply(model, "nonsense", m, 2, true, err, sizeof err) == NULL);
    /* The model's own Jinja template is the default: SmolLM2's adds its
     * system prompt when the chat has none; the built-in chatml does not. */
    txt = minfer_chat_apply(model, NULL, m + 1, 1, false, err, sizeof err);
    CHECK(txt && !strcmp(txt, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                              "trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"));
    free(txt);
    txt = minfer_chat_apply(model, "chatml", m + 1, 1, false, err, sizeof err);
    CHECK(txt && !strcmp(txt, "<|im_start|>user\nHi<|im_end|>\n"));
    free(txt);
    txt = minfer_chat_apply_json(model, NULL, "[{\"role\":\"user\",\"content\":\"Hi\"}]", NULL,
                                 true, err, sizeof err);
    CHECK_STR_CONTAINS(txt, "named SmolLM");
    CHECK_STR_CONTAINS(txt, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(txt);
    CHECK(minfer_chat_apply_json(model, NULL, "[{\"role\":", NULL, true, err, sizeof err) == NULL);
    CHECK_STR_CONTAINS(err, "chat: messages");
    CHECK(minfer_chat_apply_json(model, "chatml", "[{\"role\":\"user\",\"content\":\"Hi\"}]",
                                 "[{\"type\":\"function\"}]", true, err, sizeof err) == NULL);
    CHECK_STR_CONTAINS(err, "tools need the model's own chat template");
    /* a forced tool call: the schema admits exactly {"name": tool, "arguments": its params} */
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                        "\"description\":\"Weather\",\"parameters\":{\"type\":\"object\","
                        "\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}},"
                        "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";
    char *sch = minfer_tool_call_schema(tools, NULL, err, sizeof err);
    CHECK_STR_CONTAINS(sch, "\"anyOf\"");
    char *gb = sch ? minfer_json_schema_to_grammar(sch, err, sizeof err) : NULL;
    CHECK(gb != NULL);
    minfer_sampler *smp = minfer_sampler_new(NULL);
    CHECK(sch && minfer_sampler_set_json_schema(smp, model, sch, err, sizeof err) == 0);
    minfer_sampler_free(smp);
    free(gb);
    free(sch);
    sch = minfer_tool_call_schema(tools, "now", err, sizeof err);
    CHECK(sch && !strstr(sch, "get_weather") && strstr(sch, "\"now\""));
    free(sch);
    CHECK(minfer_tool_call_schema(tools, "missing", err, sizeof err) == NULL);
    CHECK_STR_CONTAINS(err, "no tool named 'missing'");
    CHECK(minfer_tool_call_schema("[{\"type\":\"x\"}]", NULL, err, sizeof err) == NULL);
    CHECK_STR_CONTAINS(err, "tools[0]: 'type' must be \"function\"");
    CHECK(minfer_chat_template_check("llama3", err, sizeof err) == 0);
    CHECK(minfer_chat_template_check("bogus", err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "unknown template 'bogus'");
}

/* A context past the trained one is refused with both numbers (never an
 * abort, whatever the value); a session reserves its n_batch graph and every
 * KV region at creation, and a forward of that shape reuses it. */
MF_TEST(context_limit_and_reserve) {
    if (!model)
        return;
    const int32_t train = minfer_model_n_ctx_train(model);
    CHECK_EQ_INT(train, 8192);
    minfer_session_options o;
    minfer_session_options_default(&o);
    char err[512], want[128];
    const int32_t bad[3] = {train + 1, 20000, INT32_MAX};
    for (int i = 0; i < 3; i++) {
        o.n_ctx = bad[i];
        err[0] = 0;
        CHECK(minfer_session_new(model, &o, err, sizeof err) == NULL);
        snprintf(want, sizeof want, "n_ctx %d exceeds the model's trained context of %d", bad[i], train);
        CHECK_STR_CONTAINS(err, want);
    }
    minfer_session *s = session(64, 8, false, NULL);
    if (!s)
        return;
    const mf_graph *g = mf_engine_graph(s->eng);
    CHECK_MSG(g != NULL, "no graph reserved at session creation");
    CHECK_EQ_INT(mf_engine_n_builds(s->eng), 1);
    for (int i = 0; g && i < g->n_nodes; i++)
        if (g->nodes[i].op == MF_OP_INPUT && g->nodes[i].meta.input.kind == MF_INPUT_TOKENS)
            CHECK_EQ_INT(g->nodes[i].ne[0], 8);
    int32_t t[8];
    tokens(t, 8, 7);
    CHECK_MSG(minfer_prefill(s, t, 8, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_INT(mf_engine_n_builds(s->eng), 1); /* the reserved graph ran */
    minfer_session_free(s);
}

static void setup(void) {
    const char *p = getenv("MINFER_MODEL");
    if (!p)
        return;
    minfer_model_options o;
    minfer_model_options_default(&o);
    o.path = p;
    o.n_threads = 2;
    char err[512];
    model = minfer_model_load(&o, err, sizeof err);
    if (!model)
        fprintf(stderr, "cannot load %s: %s\n", p, err);
    else
        n_vocab = minfer_model_n_vocab(model);
}

static const mf_test_entry tests[] = {MF_T(prefill_batches_equal_decode_steps),
                                      MF_T(full_context_is_an_error_that_changes_nothing),
                                      MF_T(generate_stops_cleanly), MF_T(options_and_sizes),
                                      MF_T(context_limit_and_reserve)};

int main(int argc, char **argv) {
    setup();
    if (!model) {
        printf("skip: no model (set MINFER_MODEL)\n");
        return getenv("MINFER_MODEL") ? 1 : 0;
    }
    int rc = mf_test_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    minfer_model_free(model);
    return rc;
}
