/* fuzz_template.c - libFuzzer target: arbitrary bytes as a chat template,
 * parsed and (when it parses) rendered over a small conversation; arbitrary
 * bytes as JSON. Every outcome must be a value or an error message, never
 * a crash, a hang or a leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "template/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char ctx_json[] =
    "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
    "\"content\":\" héllo \"},{\"role\":\"assistant\",\"content\":\"x\",\"tool_calls\":[{"
    "\"function\":{\"name\":\"f\",\"arguments\":{\"a\":[1,2.5,null]}}}]}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
    "\"add_generation_prompt\":true,\"bos_token\":\"<s>\",\"eos_token\":\"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mf_error err;
    mf_arena *a = mf_arena_new();
    mf_jv v;
    (void)mf_jv_parse_json(a, (const char *)data, size, &v, &err);
    mf_jv ctx;
    if (mf_jv_parse_json(a, ctx_json, sizeof ctx_json - 1, &ctx, &err))
        abort();
    mf_jinja *t;
    if (!mf_jinja_parse((const char *)data, size, &t, &err)) {
        char *out = NULL;
        size_t n;
        if (!mf_jinja_render(t, ctx, &out, &n, &err) && strlen(out) > n)
            abort();
        free(out);
        mf_jinja_free(t);
    }
    mf_arena_free(a);
    return 0;
}
