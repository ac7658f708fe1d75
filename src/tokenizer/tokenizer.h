/* tokenizer.h - text <-> token ids: byte-level BPE (gpt2 family) and
 * SentencePiece-style BPE with byte fallback (llama spm), special-token
 * matching, a streaming UTF-8-safe detokenizer and chat templates.
 *
 * A tokenizer is built from plain arrays (mf_tokenizer_new) so it can be used
 * and tested without a model file; mf_tokenizer_from_gguf is a thin loader
 * over the tokenizer.ggml.* keys. A built tokenizer is immutable: every
 * function taking a const mf_tokenizer * is safe to call from many threads.
 *
 * Input text may be any bytes. The pre-tokenizer treats a byte that does not
 * start a valid UTF-8 sequence as one code unit with no Unicode category
 * (it lands in the "other" class of the split regexes); byte-level BPE then
 * works on the raw bytes, so every input round-trips through
 * mf_tokenize + mf_token_to_piece. */
#ifndef MF_TOKENIZER_H
#define MF_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "gguf/gguf.h"

typedef struct mf_tokenizer mf_tokenizer;

/* Token types, numbered as in tokenizer.ggml.token_type. */
typedef enum mf_token_type {
    MF_TOKEN_UNDEFINED = 0,
    MF_TOKEN_NORMAL = 1,
    MF_TOKEN_UNKNOWN = 2,
    MF_TOKEN_CONTROL = 3,
    MF_TOKEN_USER_DEFINED = 4,
    MF_TOKEN_UNUSED = 5,
    MF_TOKEN_BYTE = 6,
} mf_token_type;

typedef enum mf_tokenizer_model {
    MF_TOKENIZER_GPT2, /* byte-level BPE, merges ranked by list order */
    MF_TOKENIZER_SPM,  /* llama SentencePiece BPE: scores drive merges, <0xNN> fallback */
} mf_tokenizer_model;

/* Everything a tokenizer is built from. Arrays are read during
 * mf_tokenizer_new only (copied). Initialise with mf_tokenizer_spec_init,
 * which sets every special id to -1 and every flag to its default. */
typedef struct mf_tokenizer_spec {
    mf_tokenizer_model model;
    const char *pre;              /* tokenizer.ggml.pre; NULL = "default" (gpt2 only) */
    int32_t n_tokens;
    const char *const *tokens;    /* [n_tokens] token texts */
    const uint32_t *token_lens;   /* [n_tokens] byte lengths, or NULL: NUL-terminated */
    const int32_t *types;         /* [n_tokens] mf_token_type, or NULL: all normal */
    const float *scores;          /* [n_tokens], or NULL: all 0 (spm merges need them) */
    int64_t n_merges;             /* gpt2: "left right" strings, rank = index */
    const char *const *merges;
    const uint32_t *merge_lens;   /* or NULL: NUL-terminated */
    int32_t bos, eos, eot, pad, unk; /* -1: none (eot: searched by text when -1) */
    bool add_bos, add_eos;
    bool add_space_prefix;        /* spm: prepend ' ' to the text (default true) */
} mf_tokenizer_spec;

void mf_tokenizer_spec_init(mf_tokenizer_spec *spec, mf_tokenizer_model model);

/* Builds a tokenizer. Fails (err names the value) on an unknown pre name
 * ("tokenizer: unknown pre-tokenizer 'foo'"), a special id out of range, an
 * empty vocab or a merge string without a separating space. Merges whose
 * parts or result are not in the vocab can never apply and are skipped. */
int mf_tokenizer_new(const mf_tokenizer_spec *spec, mf_tokenizer **out, mf_error *err);
/* Reads tokenizer.ggml.{model,pre,tokens,token_type,scores,merges,
 * bos/eos/eot/padding/unknown_token_id,add_bos_token,add_eos_token,
 * add_space_prefix} and calls mf_tokenizer_new. */
int mf_tokenizer_from_gguf(const mf_gguf *g, mf_tokenizer **out, mf_error *err);
void mf_tokenizer_free(mf_tokenizer *t);

int32_t mf_tokenizer_n_vocab(const mf_tokenizer *t);
mf_tokenizer_model mf_tokenizer_get_model(const mf_tokenizer *t);
const char *mf_tokenizer_pre_name(const mf_tokenizer *t); /* canonical: "gpt2", "llama3", ... */

/* Tokens of text[0..len). add_special: BOS/EOS as the tokenizer's add_bos /
 * add_eos flags say. parse_special: control-token texts (e.g.
 * "<|im_start|>") in the text become those tokens (leftmost, longest match);
 * user-defined tokens are always matched. Returns the token count; when it
 * exceeds cap only the first cap ids are written and the caller retries with
 * a larger buffer. Returns -1 (err set) only on an internal limit (text over
 * 2 GiB). out may be NULL when cap is 0. */
int64_t mf_tokenize(const mf_tokenizer *t, const char *text, size_t len, bool add_special,
                    bool parse_special, int32_t *out, int64_t cap, mf_error *err);

/* The GPT-2 byte-level symbol of byte b as UTF-8 (printable Latin-1 bytes
 * stand for themselves, the others map in order to U+0100..: ' ' -> "Ġ").
 * Writes at most 2 bytes plus a NUL into out; returns the length. */
size_t mf_gpt2_byte_symbol(uint8_t b, char out[3]);

/* The bytes token id stands for: gpt2 byte-level mapping undone, spm '▁' ->
 * ' ' and <0xNN> -> that byte. Control tokens (and unknown/unused ones)
 * render their text only when render_special, else nothing. Writes
 * min(n, cap) bytes (no NUL) and returns n, the piece length; -1 for an id
 * out of range. */
int mf_token_to_piece(const mf_tokenizer *t, int32_t id, bool render_special, char *buf,
                      size_t cap);
/* Raw vocab string (NUL-terminated; "" for an id out of range). */
const char *mf_token_text(const mf_tokenizer *t, int32_t id);
mf_token_type mf_token_get_type(const mf_tokenizer *t, int32_t id);
/* Vocab id of an exact token text, or -1. */
int32_t mf_token_lookup(const mf_tokenizer *t, const char *text, size_t len);

int32_t mf_token_bos(const mf_tokenizer *t); /* -1 when none */
int32_t mf_token_eos(const mf_tokenizer *t);
int32_t mf_token_eot(const mf_tokenizer *t);
int32_t mf_token_pad(const mf_tokenizer *t);
int32_t mf_token_unk(const mf_tokenizer *t);
bool mf_tokenizer_add_bos(const mf_tokenizer *t);
/* End of generation: eos, eot, and control tokens whose text is a known
 * end-of-turn marker (<|im_end|>, <|eot_id|>, <|endoftext|>, <|end|>,
 * <end_of_turn>, <|eom_id|>, </s>, ...). */
bool mf_token_is_eog(const mf_tokenizer *t, int32_t id);

/* ---- streaming detokenizer ------------------------------------------------ */

/* Holds the tail of an incomplete UTF-8 sequence between tokens, so a
 * character split over byte tokens is emitted whole once complete. */
typedef struct mf_detok {
    uint8_t pend[4]; /* bytes of the incomplete sequence */
    uint8_t n_pend;
    uint8_t need;    /* total length of the sequence being held (2..4) */
    bool render_special; /* render control tokens' text (init: false) */
} mf_detok;

void mf_detok_init(mf_detok *d);
/* A cap for mf_detok_push's out that no single push can exceed. */
size_t mf_detok_max_bytes(const mf_tokenizer *t);
/* Appends token id's piece (control tokens only if d->render_special) and writes every
 * complete character to out. Bytes that can never form valid UTF-8 are
 * written as U+FFFD. Returns the bytes that belong in out; writes at most
 * cap of them (cap >= mf_detok_max_bytes(t) never truncates). */
size_t mf_detok_push(const mf_tokenizer *t, mf_detok *d, int32_t id, char *out, size_t cap);
/* Writes U+FFFD for a held incomplete sequence (at most 3 bytes) and resets. */
size_t mf_detok_flush(mf_detok *d, char *out, size_t cap);

/* ---- chat templates --------------------------------------------------------- */

typedef enum mf_chat_template {
    MF_CHAT_CHATML,  /* <|im_start|>role\ncontent<|im_end|>\n */
    MF_CHAT_LLAMA3,  /* <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> */
    MF_CHAT_LLAMA2,  /* [INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] */
    MF_CHAT_GEMMA,   /* <start_of_turn>user\n...<end_of_turn>\n */
    MF_CHAT_PHI3,    /* <|user|>\n...<|end|>\n */
    MF_CHAT_ZEPHYR,  /* <|user|>\n...</s>\n */
    MF_CHAT_COUNT
} mf_chat_template;

typedef struct mf_chat_msg {
    const char *role;    /* "system", "user", "assistant" */
    const char *content;
} mf_chat_msg;

/* Picks the template from tokenizer.chat_template (g may be NULL) and then
 * from the vocab's special tokens. Returns 0 when recognised, 1 when nothing
 * matched and *out was set to the ChatML default. */
int mf_chat_template_detect(const mf_gguf *g, const mf_tokenizer *t, mf_chat_template *out);
/* "chatml", "llama3", "llama2", "gemma", "phi3", "zephyr". */
int mf_chat_template_from_name(const char *name, mf_chat_template *out, mf_error *err);
const char *mf_chat_template_name(mf_chat_template tmpl);
/* Renders the messages; add_assistant appends the assistant turn opener.
 * Returns a malloc'd NUL-terminated string (caller frees). No BOS is
 * written: mf_tokenize(add_special) adds it when the model wants one. */
char *mf_chat_render(mf_chat_template tmpl, const mf_chat_msg *msgs, int n, bool add_assistant);

/* ---- internals shared with the generated tables ---------------------------- */

enum { MF_UC_LETTER = 1, MF_UC_NUMBER = 2, MF_UC_SPACE = 4, MF_UC_PUNCT = 8 };
typedef struct mf_unicode_range {
    uint32_t lo, hi;
    uint32_t flags;
} mf_unicode_range;
extern const mf_unicode_range mf_unicode_ranges[];
extern const uint32_t mf_unicode_n_ranges;
extern const mf_unicode_range mf_unicode_ds_letters[], mf_unicode_ds_punct[], mf_unicode_ds_cjk[];
extern const uint32_t mf_unicode_n_ds_letters, mf_unicode_n_ds_punct, mf_unicode_n_ds_cjk;
/* MF_UC_* flags of a code point (0 for unassigned, symbols, marks, ...). */
uint32_t mf_unicode_flags(uint32_t cp);

#endif
