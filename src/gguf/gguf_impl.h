/* gguf_impl.h - private to src/gguf: the parsed representation shared by the
 * reader (gguf_read.c) and the writer (gguf_write.c, which copies kvs out of
 * an open file and validates raw values with the reader's value parser). */
#ifndef MF_GGUF_IMPL_H
#define MF_GGUF_IMPL_H

#include "gguf/gguf.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "minfer's GGUF code reads little-endian fields straight from memory"
/* The mapped-file policy (gguf_guard.c): a SIGBUS inside a registered
 * mapping (the file was truncated under it) ends the process with a line
 * naming the file. At most 64 mappings are guarded at once. */
void gg_guard_add(const void *base, size_t len, const char *path);
void gg_guard_remove(const void *base);

#endif

#define GG_MAX_DEPTH 8        /* array nesting levels (the outer array is level 1) */
#define GG_MAX_KEY 65535u     /* bytes in a key, as the GGUF spec bounds them */
#define GG_MIN_KV_BYTES 12u   /* key length (8) + value type (4) */
#define GG_MIN_TINFO_BYTES 32u /* name length + n_dims + one dim + type + offset */

/* One metadata value. Top-level kvs are nodes [0, n_kv); the element arrays of
 * an array of arrays are appended after them, n consecutive nodes from sub0,
 * so every array (top-level or nested) is addressed by a node index. */
typedef struct gg_node {
    mf_str key;           /* empty for nested arrays */
    uint32_t type;        /* mf_gguf_vtype */
    /* scalars */
    bool is_signed;       /* integer types: value in i, else in u */
    int64_t i;
    uint64_t u;           /* also bool (0/1) */
    double f;
    mf_str s;
    /* arrays */
    uint32_t et;          /* element type */
    uint64_t n;           /* element count */
    const uint8_t *raw;   /* fixed-size elements, packed little endian, in the file */
    mf_str *strs;         /* string elements (owned; text in the arena) */
    int64_t sub0;         /* array of arrays: first element node */
} gg_node;

typedef struct gg_chunk {
    struct gg_chunk *next;
    size_t used, cap;
    char data[];
} gg_chunk;

struct mf_gguf {
    uint32_t version;
    uint32_t alignment;
    const uint8_t *buf;   /* the whole file (mapping or caller's buffer) */
    uint64_t size;
    uint64_t data_offset;
    void *map;            /* page-aligned base of the mapping, or NULL */
    size_t map_len;
    bool map_copy;        /* map holds a copy of the file (MINFER_NO_MMAP) */

    gg_node *nodes;
    int64_t n_nodes, cap_nodes, n_kv;
    mf_gguf_tensor *tensors;
    int64_t n_tensors;

    int64_t *kv_ht;       /* open addressing: node index + 1, 0 = empty */
    uint64_t kv_ht_cap;
    int64_t *t_ht;        /* tensor index + 1 */
    uint64_t t_ht_cap;

    gg_chunk *arena;      /* NUL-terminated copies of every string */

    uint64_t mem_used;    /* parser allocations charged so far */
    uint64_t mem_budget;  /* their limit for this file (MF_GGUF_MEM_*) */

    mf_gguf **subs;       /* parts 2..N of a split model (own their mappings) */
    uint32_t n_subs;
};

size_t gg_vtype_size(uint32_t t); /* bytes of a fixed-size value, 0 for string/array */
const char *gg_vtype_name(uint32_t t);

/* Parses one value of type `type` at buf[0..len) into a scratch mf_gguf and
 * checks that it fills the buffer exactly. Used by the writer to refuse raw
 * values that the reader would reject. Returns 0/-1 (err says why). */
int gg_check_value(uint32_t type, const void *buf, size_t len, mf_error *err);

/* The mapped-file policy (gguf_guard.c): a SIGBUS inside a registered
 * mapping (the file was truncated under it) ends the process with a line
 * naming the file. At most 64 mappings are guarded at once. */
void gg_guard_add(const void *base, size_t len, const char *path);
void gg_guard_remove(const void *base);

#endif
