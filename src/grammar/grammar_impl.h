/* grammar_impl.h - the compiled grammar, shared by the parser (gbnf.c) and
 * the matcher (gmatch.c). Private to src/grammar.
 *
 * Every alternative of every rule is a run of elements in el[] ending with
 * GE_END. A character element names a class: ranges [lo, hi] of code
 * points, matched or (neg) excluded. A reference element names a rule. */
#ifndef MF_GRAMMAR_IMPL_H
#define MF_GRAMMAR_IMPL_H

#include "grammar/grammar.h"

enum { GE_END = 0, GE_CHAR = 1, GE_REF = 2 };

typedef struct gel {
    int32_t kind;
    int32_t arg; /* GE_CHAR: class index; GE_REF: rule index */
} gel;

typedef struct gclass {
    int32_t off, n; /* ranges[off .. off + 2n) as lo, hi pairs */
    bool neg;
} gclass;

struct mf_grammar {
    gel *el;
    int32_t n_el;
    int32_t *alts;       /* start element of each alternative, rule by rule */
    int32_t *rule_alt0;  /* [n_rules + 1]: rule r's alternatives are alts[rule_alt0[r] ..) */
    int32_t n_rules, root;
    uint32_t *ranges;
    gclass *classes;
    int32_t n_classes;
    char **names;
};

#endif
