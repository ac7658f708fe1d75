/* test_gguf_build.h - byte-level GGUF builders for the gguf unit tests: emit a
 * header, kvs and tensor infos exactly as the format lays them out, so tests
 * can forge any corruption. Header-only, static functions (test use only). */
#ifndef TEST_GGUF_BUILD_H
#define TEST_GGUF_BUILD_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct gb {
    uint8_t *p;
    size_t n, cap;
} gb;

static inline void gb_put(gb *b, const void *d, size_t n) {
    if (b->cap - b->n < n) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < n)
            cap *= 2;
        b->p = realloc(b->p, cap);
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, d, n);
    b->n += n;
}
static inline void gb_u8(gb *b, uint8_t v) { gb_put(b, &v, 1); }
static inline void gb_u32(gb *b, uint32_t v) { gb_put(b, &v, 4); }
static inline void gb_u64(gb *b, uint64_t v) { gb_put(b, &v, 8); }
static inline void gb_strn(gb *b, const char *s, uint64_t n) {
    gb_u64(b, n);
    gb_put(b, s, (size_t)n);
}
static inline void gb_str(gb *b, const char *s) { gb_strn(b, s, strlen(s)); }
static inline void gb_free(gb *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* magic "GGUF", version, tensor count, kv count */
static inline void gb_header(gb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    gb_u32(b, 0x46554747u);
    gb_u32(b, version);
    gb_u64(b, n_tensors);
    gb_u64(b, n_kv);
}
/* kv prefix: key and value type; the value bytes follow */
static inline void gb_kv(gb *b, const char *key, uint32_t type) {
    gb_str(b, key);
    gb_u32(b, type);
}
static inline void gb_kv_u32(gb *b, const char *key, uint32_t v) {
    gb_kv(b, key, 4);
    gb_u32(b, v);
}
static inline void gb_kv_str(gb *b, const char *key, const char *v) {
    gb_kv(b, key, 8);
    gb_str(b, v);
}
static inline void gb_tinfo(gb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                            uint64_t offset) {
    gb_str(b, name);
    gb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        gb_u64(b, ne[d]);
    gb_u32(b, type);
    gb_u64(b, offset);
}
static inline void gb_pad(gb *b, size_t align) {
    while (b->n % align)
        gb_u8(b, 0);
}
/* n pseudo-random bytes (xorshift; seed varies per call site) */
static inline void gb_random(gb *b, size_t n, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        gb_u8(b, (uint8_t)(s >> 24));
    }
}
/* An exactly sized heap copy, so that AddressSanitizer sees any overread. */
static inline void *gb_exact(const gb *b) {
    void *p = malloc(b->n ? b->n : 1);
    if (b->n)
        memcpy(p, b->p, b->n);
    return p;
}

#endif
