/* fuzz_gguf.c - libFuzzer target for the GGUF parser.
 *
 * Parses the input with mf_gguf_parse and, when it is accepted, walks
 * everything a consumer may touch: every kv through every getter and
 * mf_gguf_kv_format, every array element (nested arrays recursively) and
 * every tensor's bytes, which must lie inside the input. Any crash, sanitizer
 * report or escaped tensor view is a bug.
 *
 * Build: CC=clang cmake -B build-fuzz -DMINFER_FUZZ=ON -DMINFER_SANITIZE=ON
 *        cmake --build build-fuzz --target fuzz_gguf
 * Run:   ./build-fuzz/fuzz_gguf -max_total_time=60 fuzz-corpus-gguf fuzz/corpus/gguf */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

static void walk_array(const mf_gguf *g, int64_t kv, int depth) {
    uint64_t n = mf_gguf_arr_n(g, kv);
    mf_gguf_vtype et = mf_gguf_arr_type(g, kv);
    for (uint64_t i = 0; i < n && i < 4096; i++) {
        if (et == MF_GGUF_STRING) {
            mf_str s = mf_gguf_arr_str(g, kv, i);
            sink += s.len ? (uint8_t)s.ptr[s.len - 1] : 0;
            sink += (uint8_t)s.ptr[s.len]; /* the terminator is there */
        } else if (et == MF_GGUF_ARRAY) {
            if (depth > 64)
                abort(); /* the parser bounds nesting; this would be a bug */
            walk_array(g, mf_gguf_arr_sub(g, kv, i), depth + 1);
        } else {
            sink += (uint64_t)mf_gguf_arr_int(g, kv, i);
            double d = mf_gguf_arr_float(g, kv, i);
            uint64_t bits;
            memcpy(&bits, &d, sizeof bits);
            sink += bits;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mf_gguf *g = NULL;
    mf_error err;
    if (mf_gguf_parse(data, size, &g, &err) != 0) {
        if (g != NULL || strncmp(err.msg, "gguf: ", 6) != 0)
            abort();
        return 0;
    }
    char text[160];
    for (int64_t i = 0; i < mf_gguf_n_kv(g); i++) {
        mf_str k = mf_gguf_kv_key(g, i);
        if (mf_gguf_find_key(g, k.ptr) != i)
            abort(); /* keys are unique and findable */
        mf_gguf_kv_format(g, i, text, sizeof text);
        sink += strlen(text);
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        float f;
        bool b;
        mf_str s;
        int64_t kv;
        uint64_t n;
        sink += (uint64_t)mf_gguf_get_u32(g, k.ptr, &u32, &err);
        sink += (uint64_t)mf_gguf_get_i32(g, k.ptr, &i32, &err);
        sink += (uint64_t)mf_gguf_get_u64(g, k.ptr, &u64, &err);
        sink += (uint64_t)mf_gguf_get_f32(g, k.ptr, &f, &err);
        sink += (uint64_t)mf_gguf_get_bool(g, k.ptr, &b, &err);
        sink += (uint64_t)mf_gguf_get_str(g, k.ptr, &s, &err);
        if (mf_gguf_get_arr(g, k.ptr, MF_GGUF_VTYPE_COUNT, &kv, &n, &err) == 0)
            walk_array(g, kv, 0);
    }
    for (int64_t i = 0; i < mf_gguf_n_tensors(g); i++) {
        const mf_gguf_tensor *t = mf_gguf_tensor_at(g, i);
        const uint8_t *p = t->data;
        if (p < data || p > data + size || t->nbytes > (uint64_t)(data + size - p))
            abort();
        if (mf_gguf_find_tensor(g, t->name.ptr) != t)
            abort();
        if (t->nbytes)
            sink += p[0] + p[t->nbytes - 1];
    }
    mf_gguf_close(g);
    return 0;
}
