/* fuzz_grammar.c - libFuzzer target: arbitrary bytes as GBNF (compiled, then
 * fed its own text and every byte value) and as a JSON Schema (converted,
 * and the result must compile). Never a crash, a hang or a leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mf_error err;
    mf_grammar *g;
    if (!mf_grammar_parse((const char *)data, size, "root", &g, &err)) {
        mf_gstate st;
        if (!mf_gstate_init(g, &st, &err)) {
            for (size_t i = 0; i < size && i < 64; i++)
                (void)mf_gstate_advance(g, &st, (const char *)data + i, 1);
            uint8_t first[256];
            mf_gstate_first_bytes(g, &st, first);
            (void)mf_gstate_done(&st);
            mf_gstate_free(&st);
        }
        mf_grammar_free(g);
    }
    char *gb = mf_json_schema_to_gbnf((const char *)data, size, &err);
    if (gb) {
        if (mf_grammar_parse(gb, strlen(gb), "root", &g, &err))
            abort(); /* a converted schema always compiles */
        mf_grammar_free(g);
        free(gb);
    }
    return 0;
}
