/* minfer.h - the public C API of minfer. Keep this header narrow: opaque
 * handles, option structs with defaults, callbacks. The CLI uses nothing else.
 *
 * Errors: functions that can fail take (char *err, size_t errlen) and, on
 * failure, return NULL or a negative value and write one line naming the
 * problem into err. */
#ifndef MINFER_H
#define MINFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct minfer_model minfer_model;
typedef struct minfer_session minfer_session;
typedef struct minfer_sampler minfer_sampler;

/* ---- model ------------------------------------------------------------------------ */

/* fraction in [0, 1]; what names the current step ("loading", "uploading"). */
typedef void (*minfer_progress_fn)(void *user, float fraction, const char *what);

typedef struct minfer_model_options {
    const char *path;          /* GGUF file (first part of a split model) */
    int32_t n_threads;         /* 0: all cores */
    const char *device;        /* "auto" (default), "cpu", "cuda" */
    int32_t n_gpu_layers;      /* -1 or >= layers: all (default -1), 0: none; else refused */
    const char *backends;      /* NULL: default list; else e.g. "ref,cpu" (MINFER_BACKENDS) */
    minfer_progress_fn progress;
    void *progress_user;
    /* NULL: the GGUF's chat template, which must render (else the load
     * fails); a built-in name ("chatml", ...): the GGUF's template is not
     * used, so a model whose template minfer cannot run still loads. */
    const char *chat_template;
} minfer_model_options;

void minfer_model_options_default(minfer_model_options *o);
minfer_model *minfer_model_load(const minfer_model_options *o, char *err, size_t errlen);
void minfer_model_free(minfer_model *m);

int32_t minfer_model_n_vocab(const minfer_model *m);
int32_t minfer_model_n_ctx_train(const minfer_model *m);
int32_t minfer_model_n_layers(const minfer_model *m);
int64_t minfer_model_n_params(const minfer_model *m);
uint64_t minfer_model_size(const minfer_model *m);      /* weight bytes */
const char *minfer_model_arch(const minfer_model *m);   /* "llama", "qwen2", "qwen3" */
/* "qwen2 0.5B Q4_K_M"-style description for reports. */
const char *minfer_model_desc(const minfer_model *m);
/* Backend that runs the graph: "cpu", "cuda", ... */
const char *minfer_model_backend(const minfer_model *m);

/* One line naming the GPU that runs the model ("NVIDIA H200, cc 9.0, 132 SMs,
 * 139.8 GiB"), or "" when the model runs on the CPU. */
const char *minfer_model_device_desc(const minfer_model *m);

/* The devices (backends) compiled into this build, in priority order, e.g.
 * "cuda, cpu, ref"; a model option's device is one of them or "auto". */
const char *minfer_build_devices(void);
bool minfer_build_has_device(const char *name);
/* The commit the build was configured from (git describe), or "unknown". */
const char *minfer_build_commit(void);

/* ---- logging ------------------------------------------------------------------------ */

typedef enum minfer_log_level {
    MINFER_LOG_DEBUG,
    MINFER_LOG_INFO,
    MINFER_LOG_WARN,  /* the default (MINFER_LOG=debug|info|warn|error overrides) */
    MINFER_LOG_ERROR,
} minfer_log_level;

/* Messages below level are not printed; the session's KV-size line is shown at
 * WARN and below. */
void minfer_log_set_level(minfer_log_level level);
/* The level in force: the one set above, else MINFER_LOG's, else WARN. */
minfer_log_level minfer_log_get_level(void);

/* ---- tokens -------------------------------------------------------------------------- */

/* Returns the token count (may exceed cap: then only cap are written), or -1. */
int64_t minfer_tokenize(const minfer_model *m, const char *text, size_t len, bool add_special,
                        bool parse_special, int32_t *out, int64_t cap);
/* Bytes of one token (not NUL-terminated); returns the length or -1. */
int32_t minfer_token_to_piece(const minfer_model *m, int32_t token, char *buf, size_t cap);
bool minfer_token_is_eog(const minfer_model *m, int32_t token);
int32_t minfer_token_bos(const minfer_model *m);
int32_t minfer_token_eos(const minfer_model *m);

/* Renders a chat with the model's own Jinja template (tokenizer.chat_template,
 * checked at load) when template_name is NULL or "", or with the named
 * built-in one ("chatml", "llama3", "llama2", "gemma", "phi3", "zephyr"),
 * which is also the default for a GGUF without a template. add_assistant
 * opens the assistant turn (add_generation_prompt). A BOS text the template
 * writes is dropped when the tokenizer adds BOS itself. Returns a malloc'd
 * string (free with free()) or NULL with err naming the problem (a
 * raise_exception of the template, an unknown template name). */
typedef struct minfer_chat_message {
    const char *role;    /* "system", "user", "assistant" */
    const char *content;
} minfer_chat_message;
char *minfer_chat_apply(const minfer_model *m, const char *template_name,
                        const minfer_chat_message *msgs, int32_t n, bool add_assistant,
                        char *err, size_t errlen);
/* As minfer_chat_apply, with the messages as a JSON array of OpenAI chat
 * messages (role, content, tool_calls, tool_call_id, ...) and tools as a JSON
 * array of OpenAI tool definitions (NULL or "": none), passed to the template
 * as `messages` and `tools`. Tools need the model's own template: with a
 * built-in one they are refused. */
char *minfer_chat_apply_json(const minfer_model *m, const char *template_name,
                             const char *messages_json, const char *tools_json, bool add_assistant,
                             char *err, size_t errlen);
/* A JSON Schema for one tool call {"name": ..., "arguments": {...}} over
 * OpenAI tool definitions (tools_json: [{"type": "function", "function":
 * {"name", "parameters"}}]); only non-NULL: that tool alone (tool_choice
 * naming a function). Feed it to minfer_sampler_set_json_schema to force a
 * well-formed call (tool_choice "required" or a named one). malloc'd, or
 * NULL with err. */
char *minfer_tool_call_schema(const char *tools_json, const char *only, char *err, size_t errlen);
/* 0 when name is NULL, "" or a built-in template name; else -1 and err
 * ("chat: unknown template 'bogus' (chatml, ...)"). For flag parsing. */
int minfer_chat_template_check(const char *name, char *err, size_t errlen);

/* ---- session ------------------------------------------------------------------------------ */

typedef struct minfer_session_options {
    int32_t n_ctx;            /* 0: min(model context, 4096) */
    int32_t n_batch;          /* prefill batch, default 512 */
    const char *cache_type;   /* K cache type, and V's when cache_type_v is unset: "f32" (default),
                                 "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1" (the block types
                                 need head_dim % 32 == 0); MINFER_CACHE_TYPE overrides both */
    bool logits_all;          /* keep logits of every position of the last batch */
    const char *cache_type_v; /* V cache type (same names); NULL or "": cache_type's */
    bool flash_attn_off;      /* -fa off: attention unfused (scores materialized, softmax, then V);
                                 the CPU backend only (a GPU session refuses it) */
} minfer_session_options;

void minfer_session_options_default(minfer_session_options *o);
minfer_session *minfer_session_new(minfer_model *m, const minfer_session_options *o, char *err,
                                   size_t errlen);
void minfer_session_free(minfer_session *s);

int32_t minfer_session_n_ctx(const minfer_session *s);
int32_t minfer_session_n_past(const minfer_session *s);
uint64_t minfer_session_kv_bytes(const minfer_session *s);
/* Forgets the context (n_past = 0). */
void minfer_session_reset(minfer_session *s);

/* Runs tokens through the model after the current context, in batches of
 * n_batch. Fails (nothing run) if n_past + n would exceed n_ctx. */
int minfer_prefill(minfer_session *s, const int32_t *tokens, int32_t n, char *err, size_t errlen);
/* One token (a prefill of 1). */
int minfer_decode(minfer_session *s, int32_t token, char *err, size_t errlen);
/* Logits (n_vocab floats) of the last position run. */
const float *minfer_logits(const minfer_session *s);
/* With logits_all: logits of position i of the last batch (0 <= i < batch size). */
const float *minfer_logits_ith(const minfer_session *s, int32_t i);

/* ---- many sequences ----------------------------------------------------------------------- */

/* One KV pool shared by many sequences, in blocks of block_size positions
 * with a block table per sequence (paged). Sequences forked from another, or
 * started from the prompt cache, share the blocks of their common prefix
 * (copy-on-write: a shared block is copied before a write into it). A
 * removed sequence's blocks stay in the prompt cache until the pool needs
 * them (least recently used first). One minfer_multi is used by one thread.
 * A sequence's logits do not depend on the other sequences of its batch (on
 * the CPU: bitwise). */
typedef struct minfer_multi minfer_multi;

typedef struct minfer_multi_options {
    int32_t n_ctx;            /* positions per sequence at most; 0: min(model context, 4096) */
    int32_t n_seq_max;        /* live sequences at most (default 8) */
    int32_t block_size;       /* positions per KV block (default 16) */
    int32_t n_blocks;         /* pool size; 0: n_seq_max full contexts */
    int32_t n_batch;          /* tokens per minfer_multi_decode at most (default 512) */
    const char *cache_type;   /* as in minfer_session_options */
    bool prompt_cache;        /* keep removed sequences for prefix reuse (default true) */
    const char *cache_type_v; /* as in minfer_session_options */
    bool flash_attn_off;      /* as in minfer_session_options */
} minfer_multi_options;

/* A batch: token i is appended to sequence seq_id[i] at position pos[i],
 * which must be that sequence's length counting the batch's earlier tokens
 * of the same sequence. logits[i] asks for token i's logits (NULL: the last
 * token of each sequence in the batch). */
typedef struct minfer_batch {
    int32_t n_tokens;
    const int32_t *token;
    const int32_t *seq_id;
    const int32_t *pos;
    const bool *logits;
} minfer_batch;

typedef struct minfer_multi_stats {
    int32_t n_blocks, block_size;
    int32_t blocks_used;      /* held by live sequences or the prompt cache */
    int32_t blocks_cached;    /* held only by the prompt cache (reclaimable) */
    int32_t n_seqs;           /* live sequences */
    int64_t cache_lookups, cache_hits, cache_tokens_reused;
} minfer_multi_stats;

void minfer_multi_options_default(minfer_multi_options *o);
minfer_multi *minfer_multi_new(minfer_model *m, const minfer_multi_options *o, char *err,
                               size_t errlen);
void minfer_multi_free(minfer_multi *mm);
int32_t minfer_multi_n_ctx(const minfer_multi *mm);
/* A new empty sequence; returns its id (>= 0) or -1. */
int32_t minfer_seq_new(minfer_multi *mm, char *err, size_t errlen);
/* A new sequence holding the first n_keep positions of src (shared blocks). */
int32_t minfer_seq_fork(minfer_multi *mm, int32_t src, int32_t n_keep, char *err, size_t errlen);
/* A new sequence starting with the longest prefix of tokens[0..n) that a live
 * or cached sequence holds (at most n - 1, so the last token is run for its
 * logits); *n_reused says how many positions it already has. */
int32_t minfer_seq_from_cache(minfer_multi *mm, const int32_t *tokens, int32_t n, int32_t *n_reused,
                              char *err, size_t errlen);
/* Ends a sequence (its blocks go to the prompt cache when that is on). */
int minfer_seq_remove(minfer_multi *mm, int32_t seq, char *err, size_t errlen);
int32_t minfer_seq_len(const minfer_multi *mm, int32_t seq); /* -1: no such sequence */
/* Runs the batch (n_tokens <= n_batch) in one forward. Fails, nothing run,
 * on a bad id, position or token, a full context or a full pool. */
int minfer_multi_decode(minfer_multi *mm, const minfer_batch *b, char *err, size_t errlen);
/* Logits of batch token i of the last decode, NULL when it did not ask. */
const float *minfer_multi_logits(const minfer_multi *mm, int32_t i);
void minfer_multi_get_stats(const minfer_multi *mm, minfer_multi_stats *st);

/* ---- sampling --------------------------------------------------------------------------------- */

#define MINFER_SEED_RANDOM UINT64_MAX

typedef struct minfer_sampler_options {
    float temp;               /* 0.8; <= 0 means greedy */
    int32_t top_k;            /* 40; <= 0 disables */
    float top_p;              /* 0.95; 1 disables */
    float min_p;              /* 0.05; 0 disables */
    float repeat_penalty;     /* 1.0 (off) */
    int32_t repeat_last_n;    /* 64 */
    float presence_penalty;   /* 0 */
    float frequency_penalty;  /* 0 */
    uint64_t seed;            /* MINFER_SEED_RANDOM (UINT64_MAX) means random; any other
                                 value, 4294967295 included, is a fixed seed */
} minfer_sampler_options;

void minfer_sampler_options_default(minfer_sampler_options *o);
minfer_sampler *minfer_sampler_new(const minfer_sampler_options *o);
void minfer_sampler_free(minfer_sampler *s);
int32_t minfer_sampler_sample(minfer_sampler *s, const float *logits, int32_t n_vocab);
/* Records a token in the penalty window (prompt and generated tokens). */
void minfer_sampler_accept(minfer_sampler *s, int32_t token);

/* Structured output: constrains sampling to a GBNF grammar (start rule
 * "root"; the syntax llama.cpp's --grammar takes). Each sample call then
 * returns only a token whose bytes extend a valid prefix, an end-of-generation
 * token only once the output is a complete sentence, and advances the
 * grammar by it; -1 when no token fits. gbnf NULL or "" removes the
 * constraint. Fails (err: "grammar: 2:7: ...") on a grammar that does not
 * compile. m gives the token pieces. */
int minfer_sampler_set_grammar(minfer_sampler *s, const minfer_model *m, const char *gbnf,
                               char *err, size_t errlen);
/* The same with a JSON Schema (JSON text) converted to a grammar; schema
 * NULL or "" means any JSON object (response_format json_object). */
int minfer_sampler_set_json_schema(minfer_sampler *s, const minfer_model *m, const char *schema,
                                   char *err, size_t errlen);
/* The GBNF text a schema converts to (NULL/"": the JSON object grammar);
 * malloc'd, or NULL with err naming the unsupported part. */
char *minfer_json_schema_to_grammar(const char *schema, char *err, size_t errlen);

/* ---- generation ------------------------------------------------------------------------------------- */

/* Called with each generated token and its text (complete UTF-8 only; may be
 * empty while a multibyte character is pending; a piece is never cut, however
 * long). Return false to stop. When generation ends (token limit, context,
 * end of generation) inside a multibyte character, its incomplete bytes are
 * dropped: the text never ends in a U+FFFD the model did not produce. */
typedef bool (*minfer_token_fn)(void *user, int32_t token, const char *text, size_t len);

typedef struct minfer_generate_stats {
    int32_t n_prompt, n_generated;
    double prompt_ms, gen_ms;
    uint64_t weight_bytes;    /* streamed per generated token */
    bool stopped_eog, stopped_ctx;
} minfer_generate_stats;

/* Tokenizes prompt (parse_special; BOS only when the context is empty),
 * prefills it, then samples up to n_predict tokens (-1: until end of
 * generation or context), calling cb for each; every emitted token is decoded
 * into the context, so a later call continues the conversation. An empty
 * prompt on a non-empty context continues from the last logits (no prefill).
 * smp NULL: greedy. A full context stops generation cleanly
 * (stats->stopped_ctx); a prompt that does not fit is an error. */
int minfer_generate(minfer_session *s, minfer_sampler *smp, const char *prompt, int32_t n_predict,
                    minfer_token_fn cb, void *user, minfer_generate_stats *stats, char *err,
                    size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
