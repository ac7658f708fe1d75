/* tok_vocab.h - vocabs built in code for the tokenizer tests, shared by
 * tests/unit/test_tokenizer_core.c and fuzz/fuzz_tokenizer.c. Header-only
 * (static functions), no link dependency.
 *
 * A tok_vocab accumulates tokens in id order with their types and scores, in
 * the parallel arrays an mf_tokenizer_spec points at. The GPT-2 byte map is
 * written independently of the tokenizer's own on purpose: a test vocab built
 * with the implementation's map would agree with its bugs. */
#ifndef MF_TOK_VOCAB_H
#define MF_TOK_VOCAB_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

enum { TOK_VOCAB_MAX = 320 };

typedef struct tok_vocab {
    char store[TOK_VOCAB_MAX][32];
    const char *ptrs[TOK_VOCAB_MAX]; /* spec.tokens */
    int32_t types[TOK_VOCAB_MAX];    /* spec.types */
    float scores[TOK_VOCAB_MAX];     /* spec.scores (spm) */
    int32_t n;
} tok_vocab;

/* Appends a token and returns its id. Past TOK_VOCAB_MAX tokens or 31 bytes
 * the test itself is wrong: abort. */
static inline int32_t tok_vocab_add(tok_vocab *v, const char *text, int32_t type, float score) {
    if (v->n >= TOK_VOCAB_MAX || strlen(text) >= sizeof v->store[0])
        abort();
    strcpy(v->store[v->n], text);
    v->ptrs[v->n] = v->store[v->n];
    v->types[v->n] = type;
    v->scores[v->n] = score;
    return v->n++;
}

/* The GPT-2 byte-to-unicode map: printable Latin-1 bytes stand for
 * themselves, the other 68 map to U+0100 upwards in byte order. */
static inline uint32_t tok_vocab_byte_cp(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return (uint32_t)b;
    int k = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174))
            k++;
    return 256u + (uint32_t)k;
}

/* The 256 byte-level BPE symbols (UTF-8 of the map above; every code point
 * is below U+0800), ids 0..255 when v is empty. */
static inline void tok_vocab_add_gpt2_bytes(tok_vocab *v) {
    for (int b = 0; b < 256; b++) {
        uint32_t cp = tok_vocab_byte_cp(b);
        char s[3] = {(char)cp, 0, 0};
        if (cp >= 0x80)
            s[0] = (char)(0xC0 | (cp >> 6)), s[1] = (char)(0x80 | (cp & 0x3F));
        tok_vocab_add(v, s, MF_TOKEN_NORMAL, 0.0f);
    }
}

/* The 256 SentencePiece byte-fallback tokens <0x00>..<0xFF>. */
static inline void tok_vocab_add_spm_bytes(tok_vocab *v) {
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        tok_vocab_add(v, s, MF_TOKEN_BYTE, 0.0f);
    }
}

#endif
