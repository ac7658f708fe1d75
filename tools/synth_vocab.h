/* synth_vocab.h - the deterministic byte-level BPE vocabulary of synthetic
 * models (`minfer synth`).
 *
 * Layout of a vocabulary of n tokens (ids in this order):
 *   [0, 256)          the 256 byte symbols, id == byte value, spelled with the
 *                     GPT-2 byte-to-unicode map ("Ġ" is the space byte);
 *   [256, 256+m)      one token per BPE merge learned (in rank order) by a
 *                     small deterministic training run over an embedded corpus
 *                     of English, code and numbers; m <= 4000 and shrinks when
 *                     n is small (a merge whose result is already a token adds
 *                     no new token);
 *   ...               filler tokens "[PAD<id>]" (type normal) that no merge
 *                     produces, up to n - 3;
 *   n-3, n-2, n-1     <|endoftext|>, <|im_start|>, <|im_end|> (type control).
 * Every merge "a b" has a, b and ab in the vocabulary. Special ids follow the
 * real models: pre "qwen2" (Qwen2.5-Instruct): bos = pad = <|endoftext|>,
 * eos = eot = <|im_end|>; pre "smollm" (SmolLM2-Instruct): bos = <|im_start|>,
 * eos = eot = pad = <|im_end|>, unk = <|endoftext|>. No BOS is added. */
#ifndef MF_TOOLS_SYNTH_VOCAB_H
#define MF_TOOLS_SYNTH_VOCAB_H

#include <stdint.h>

#include "base/base.h"
#include "gguf/gguf.h"

#define MF_SYNTH_VOCAB_MIN 259u     /* 256 bytes + 3 specials */
#define MF_SYNTH_MAX_MERGES 4000u

typedef struct mf_synth_vocab {
    uint32_t n_tokens;
    char **tokens;      /* n_tokens UTF-8 strings */
    int32_t *types;     /* n_tokens token types: 1 normal, 3 control */
    uint32_t n_merges;
    char **merges;      /* n_merges strings "a b" in rank order */
    uint32_t id_endoftext, id_im_start, id_im_end;
} mf_synth_vocab;

/* Builds the vocabulary of exactly n_tokens tokens. Deterministic: the same
 * n_tokens always gives the same vocabulary. */
int mf_synth_vocab_build(uint32_t n_tokens, mf_synth_vocab *out, mf_error *err);
void mf_synth_vocab_free(mf_synth_vocab *v);

/* Sets the tokenizer.* keys (model "gpt2", pre, tokens, token_type, merges,
 * special ids, add_bos_token false, ChatML chat_template) on w. */
void mf_synth_vocab_write(const mf_synth_vocab *v, const char *pre, mf_gguf_writer *w);

/* The embedded training corpus (NUL-terminated), for tests of the tokenizer. */
const char *mf_synth_vocab_corpus(void);

#endif
