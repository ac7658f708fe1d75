/* grammar.h - GBNF grammars for constrained sampling: a parser (the syntax
 * llama.cpp users write: rules, |, sequences, ( ), * + ? {m,n}, "literals",
 * [char classes] with ranges and ^, escapes \n \t \\ \" \xNN \uNNNN, #
 * comments), a matcher that advances a set of pushdown stacks over UTF-8
 * bytes, and a JSON Schema -> GBNF converter.
 *
 * A compiled grammar is immutable; a match state (mf_gstate) is a value the
 * caller owns and advances. Left-recursive rules are refused at compile
 * time (a stack expansion that reaches the same rule without consuming
 * input would never end). */
#ifndef MF_GRAMMAR_H
#define MF_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

typedef struct mf_grammar mf_grammar;

/* Parses GBNF text; root names the start rule ("root"). Errors name the line
 * and column: "grammar: 3:14: expected ']' to close the character class". */
int mf_grammar_parse(const char *text, size_t len, const char *root, mf_grammar **out,
                     mf_error *err);
void mf_grammar_free(mf_grammar *g);
int mf_grammar_n_rules(const mf_grammar *g);

/* ---- matching ------------------------------------------------------------------------ */

/* The set of parse stacks reachable after the bytes fed so far, plus the
 * bytes of an unfinished UTF-8 character. */
typedef struct mf_gstate {
    int32_t *buf;     /* stacks, each as [len, e0, e1, ...] */
    size_t n, cap;    /* ints used / allocated */
    int32_t n_stacks;
    uint32_t cp;      /* unfinished character: bits so far */
    uint8_t need;     /* continuation bytes still missing (0: none) */
    uint8_t have;     /* bytes of it seen */
} mf_gstate;

/* The state before any input. */
int mf_gstate_init(const mf_grammar *g, mf_gstate *st, mf_error *err);
void mf_gstate_free(mf_gstate *st);
void mf_gstate_copy(mf_gstate *dst, const mf_gstate *src);
/* Advances over bytes; false (st unchanged) when they cannot continue any
 * parse. An unfinished trailing character is accepted if some stack could
 * still take a character that starts with those bytes. */
bool mf_gstate_advance(const mf_grammar *g, mf_gstate *st, const char *bytes, size_t n);
/* Would the bytes be accepted? (st is not changed; tmp is scratch.) */
bool mf_gstate_accepts(const mf_grammar *g, const mf_gstate *st, const char *bytes, size_t n,
                       mf_gstate *tmp);
/* out[b] = 0 when no input starting with byte b can be accepted (a cheap
 * first test before mf_gstate_accepts; all 1 inside a character). */
void mf_gstate_first_bytes(const mf_grammar *g, const mf_gstate *st, uint8_t out[256]);
/* The input so far is a complete sentence of the grammar. */
bool mf_gstate_done(const mf_gstate *st);
/* No further byte can be added (complete and nothing can follow). */
bool mf_gstate_finished(const mf_gstate *st);

/* ---- JSON ------------------------------------------------------------------------------ */

/* GBNF for any JSON value whose root is an object (response_format
 * json_object). Static text. */
const char *mf_grammar_json_object_gbnf(void);
/* Converts a JSON Schema (JSON text) into GBNF with rule "root". Supports
 * type (incl. lists), properties, required, additionalProperties, enum,
 * const, items, minItems/maxItems, minLength/maxLength, anyOf/oneOf/allOf
 * of one, $ref to #/$defs/... or #/definitions/...; any other constraining
 * keyword (pattern, minimum, ...) is an error naming it. Returns a malloc'd
 * string or NULL with err set. */
char *mf_json_schema_to_gbnf(const char *schema, size_t len, mf_error *err);

#endif
