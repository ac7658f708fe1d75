/* gguf_read.c - GGUF v2/v3 reader: mmap, bounds-checked parse, getters,
 * split models.
 *
 * Every byte of the file is untrusted. All reads go through a cursor that
 * checks `n > size || pos > size - n` before touching memory; every count is
 * checked against the bytes that remain before anything is allocated for it,
 * so a forged count of 2^60 fails before malloc. Errors are built without the
 * "gguf: " prefix inside the parser and prefixed once at the API boundary. */
#include "gguf/gguf_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant/quant.h"

typedef unsigned long long ull;
typedef long long ll;

/* ---- value types ------------------------------------------------------------ */

size_t gg_vtype_size(uint32_t t) {
    switch (t) {
    case MF_GGUF_UINT8: case MF_GGUF_INT8: case MF_GGUF_BOOL: return 1;
    case MF_GGUF_UINT16: case MF_GGUF_INT16: return 2;
    case MF_GGUF_UINT32: case MF_GGUF_INT32: case MF_GGUF_FLOAT32: return 4;
    case MF_GGUF_UINT64: case MF_GGUF_INT64: case MF_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

const char *gg_vtype_name(uint32_t t) {
    static const char *const names[MF_GGUF_VTYPE_COUNT] = {
        [MF_GGUF_UINT8] = "uint8",     [MF_GGUF_INT8] = "int8",
        [MF_GGUF_UINT16] = "uint16",   [MF_GGUF_INT16] = "int16",
        [MF_GGUF_UINT32] = "uint32",   [MF_GGUF_INT32] = "int32",
        [MF_GGUF_FLOAT32] = "float32", [MF_GGUF_BOOL] = "bool",
        [MF_GGUF_STRING] = "string",   [MF_GGUF_ARRAY] = "array",
        [MF_GGUF_UINT64] = "uint64",   [MF_GGUF_INT64] = "int64",
        [MF_GGUF_FLOAT64] = "float64",
    };
    return t < MF_GGUF_VTYPE_COUNT ? names[t] : "unknown";
}

static bool vtype_is_int(uint32_t t) {
    return t <= MF_GGUF_INT32 || t == MF_GGUF_UINT64 || t == MF_GGUF_INT64;
}

static bool vtype_is_signed(uint32_t t) {
    return t == MF_GGUF_INT8 || t == MF_GGUF_INT16 || t == MF_GGUF_INT32 || t == MF_GGUF_INT64;
}

/* ---- string arena --------------------------------------------------------------- */

/* Charges bytes against the file's parser memory budget; false when that
 * would exceed it (the caller fails the parse with mem_error). */
static bool charge(mf_gguf *g, uint64_t bytes) {
    if (bytes > g->mem_budget || g->mem_used > g->mem_budget - bytes)
        return false;
    g->mem_used += bytes;
    return true;
}

/* MF_GGUF_MEM_PER_BYTE x size + MF_GGUF_MEM_BASE, at most MF_GGUF_MEM_CAP. */
static uint64_t mem_budget_for(uint64_t size) {
    if (size >= MF_GGUF_MEM_CAP / MF_GGUF_MEM_PER_BYTE)
        return MF_GGUF_MEM_CAP;
    uint64_t b = size * MF_GGUF_MEM_PER_BYTE + MF_GGUF_MEM_BASE;
    return b < MF_GGUF_MEM_CAP ? b : MF_GGUF_MEM_CAP;
}

/* Returns a NUL-terminated copy of s[0..n) that lives as long as g, or NULL
 * when the budget is spent. Chunks are never moved, so pointers handed out
 * stay valid. */
static const char *arena_dup(mf_gguf *g, const void *s, uint64_t n) {
    size_t need = (size_t)n + 1;
    gg_chunk *c = g->arena;
    if (!c || c->cap - c->used < need) {
        size_t cap = need > 16384 ? need : 65536;
        if (!charge(g, sizeof *c + cap))
            return NULL;
        c = mf_malloc(sizeof *c + cap);
        c->used = 0;
        c->cap = cap;
        if (need > 16384 && g->arena) { /* big string: keep filling the current chunk */
            c->next = g->arena->next;
            g->arena->next = c;
        } else {
            c->next = g->arena;
            g->arena = c;
        }
    }
    char *p = c->data + c->used;
    if (n)
        memcpy(p, s, (size_t)n);
    p[n] = 0;
    c->used += need;
    return p;
}

/* ---- names hash table ------------------------------------------------------------ */

static uint64_t hash_bytes(const char *s, uint64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t ht_cap_for(int64_t n) {
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2)
        cap <<= 1;
    return cap;
}

/* Looks name up in a table whose slots hold index+1 into an array of names
 * reached through get(ctx, idx). Returns the slot (empty or matching). */
typedef mf_str (*name_fn)(const mf_gguf *g, int64_t idx);

static mf_str kv_name(const mf_gguf *g, int64_t i) { return g->nodes[i].key; }
static mf_str t_name(const mf_gguf *g, int64_t i) { return g->tensors[i].name; }

static uint64_t ht_slot(const mf_gguf *g, const int64_t *ht, uint64_t cap, name_fn get,
                        const char *s, uint64_t n) {
    uint64_t mask = cap - 1, h = hash_bytes(s, n) & mask;
    for (;;) {
        int64_t v = ht[h];
        if (v == 0)
            return h;
        mf_str k = get(g, v - 1);
        if (k.len == n && memcmp(k.ptr, s, (size_t)n) == 0)
            return h;
        h = (h + 1) & mask;
    }
}

/* ---- parser ------------------------------------------------------------------------ */

typedef struct gg_parser {
    mf_gguf *g;
    mf_cursor c;
    mf_error *err;
    char ctx[200]; /* what is being parsed: "header", "key 'general.name'", ... */
} gg_parser;

/* Names what is being parsed, the file's name escaped (mf_escape). */
static void set_ctx(gg_parser *p, const char *what, const char *name, uint64_t n) {
    char clean[128];
    snprintf(p->ctx, sizeof p->ctx, "%s '%s'", what, mf_escape(name, (size_t)n, clean, sizeof clean));
}

static uint64_t left(const gg_parser *p) {
    return p->c.pos <= p->c.size ? p->c.size - p->c.pos : 0;
}

static int rd(gg_parser *p, void *dst, uint64_t n, const char *what) {
    if (!mf_cursor_can(&p->c, n)) {
        p->c.failed = true;
        return mf_errorf(p->err, "%s: truncated reading %s at offset %llu (%llu bytes needed, %llu left)",
                         p->ctx, what, (ull)p->c.pos, (ull)n, (ull)left(p));
    }
    memcpy(dst, p->c.buf + p->c.pos, (size_t)n);
    p->c.pos += n;
    return 0;
}

static int rd_u32(gg_parser *p, uint32_t *v, const char *what) { return rd(p, v, 4, what); }
static int rd_u64(gg_parser *p, uint64_t *v, const char *what) { return rd(p, v, 8, what); }

static int mem_error(gg_parser *p) {
    return mf_errorf(p->err, "%s: parsing needs more than %llu bytes of memory (the budget for a "
                             "%llu-byte file; limit %llu)",
                     p->ctx, (ull)p->g->mem_budget, (ull)p->c.size, (ull)MF_GGUF_MEM_CAP);
}

/* Reads a GGUF string (u64 length + bytes) of at most max bytes into the arena. */
static int rd_str(gg_parser *p, mf_str *out, uint64_t max, const char *what) {
    char w[64];
    uint64_t n = 0;
    snprintf(w, sizeof w, "%s length", what);
    if (rd_u64(p, &n, w))
        return -1;
    if (n > max)
        return mf_errorf(p->err, "%s: %s %llu exceeds the limit %llu", p->ctx, w, (ull)n, (ull)max);
    if (n > left(p))
        return mf_errorf(p->err, "%s: truncated: %s %llu at offset %llu exceeds the %llu bytes left",
                         p->ctx, w, (ull)n, (ull)(p->c.pos - 8), (ull)left(p));
    out->ptr = arena_dup(p->g, p->c.buf + p->c.pos, n);
    if (!out->ptr)
        return mem_error(p);
    out->len = n;
    p->c.pos += n;
    return 0;
}

/* Index of n fresh zeroed nodes, or -1 when the memory budget is spent. n
 * was checked against the bytes left. */
static int64_t reserve_nodes(mf_gguf *g, uint64_t n) {
    if (n == 0)
        return g->n_nodes;
    if ((uint64_t)(g->cap_nodes - g->n_nodes) < n) {
        uint64_t cap = (uint64_t)g->cap_nodes * 2;
        if (cap < (uint64_t)g->n_nodes + n)
            cap = (uint64_t)g->n_nodes + n;
        if (cap < 16)
            cap = 16;
        if (!charge(g, (cap - (uint64_t)g->cap_nodes) * sizeof *g->nodes))
            return -1;
        g->nodes = mf_realloc(g->nodes, (size_t)cap * sizeof *g->nodes);
        g->cap_nodes = (int64_t)cap;
    }
    int64_t base = g->n_nodes;
    memset(g->nodes + base, 0, (size_t)n * sizeof *g->nodes);
    g->n_nodes += (int64_t)n;
    return base;
}

/* Parses the body of an array value (element type, count, elements) into
 * node; depth is the nesting level of this array (1 for a top-level one). */
static int parse_array(gg_parser *p, int64_t node, int depth) {
    uint32_t et = 0;
    uint64_t n = 0;
    if (rd_u32(p, &et, "array element type") || rd_u64(p, &n, "array length"))
        return -1;
    if (et >= MF_GGUF_VTYPE_COUNT)
        return mf_errorf(p->err, "%s: unknown array element type %u", p->ctx, et);
    if (n > MF_GGUF_MAX_ARRAY)
        return mf_errorf(p->err, "%s: array length %llu exceeds the limit %llu", p->ctx, (ull)n,
                         (ull)MF_GGUF_MAX_ARRAY);
    if (et == MF_GGUF_ARRAY && depth >= GG_MAX_DEPTH)
        return mf_errorf(p->err, "%s: arrays nested deeper than %d levels", p->ctx, GG_MAX_DEPTH);
    size_t esz = gg_vtype_size(et);
    uint64_t min = esz ? esz : et == MF_GGUF_STRING ? 8 : GG_MIN_KV_BYTES;
    if (n > left(p) / min)
        return mf_errorf(p->err, "%s: truncated: array length %llu of %s needs at least %llu bytes, %llu left",
                         p->ctx, (ull)n, gg_vtype_name(et), (ull)n * min, (ull)left(p));
    mf_gguf *g = p->g;
    g->nodes[node].type = MF_GGUF_ARRAY;
    g->nodes[node].et = et;
    g->nodes[node].n = n;
    if (esz) {
        const uint8_t *raw = p->c.buf + p->c.pos;
        if (et == MF_GGUF_BOOL) {
            for (uint64_t j = 0; j < n; j++)
                if (raw[j] > 1)
                    return mf_errorf(p->err, "%s: bool element %llu is %u, not 0 or 1", p->ctx,
                                     (ull)j, raw[j]);
        }
        g->nodes[node].raw = raw;
        p->c.pos += n * esz;
    } else if (et == MF_GGUF_STRING) {
        if (!charge(g, (n ? n : 1) * sizeof(mf_str)))
            return mem_error(p);
        mf_str *strs = mf_calloc((size_t)(n ? n : 1), sizeof *strs);
        g->nodes[node].strs = strs;
        for (uint64_t j = 0; j < n; j++)
            if (rd_str(p, &strs[j], MF_GGUF_MAX_STRING, "string element"))
                return -1;
    } else {
        int64_t base = reserve_nodes(g, n);
        if (base < 0)
            return mem_error(p);
        g->nodes[node].sub0 = base;
        for (uint64_t j = 0; j < n; j++)
            if (parse_array(p, base + (int64_t)j, depth + 1))
                return -1;
    }
    return 0;
}

/* Parses one value of the given type into node (its key is set by the caller). */
static int parse_value(gg_parser *p, int64_t node, uint32_t type) {
    gg_node *v = &p->g->nodes[node];
    uint8_t b[8] = {0};
    if (type >= MF_GGUF_VTYPE_COUNT)
        return mf_errorf(p->err, "%s: unknown value type %u", p->ctx, type);
    v->type = type;
    if (type == MF_GGUF_STRING)
        return rd_str(p, &v->s, MF_GGUF_MAX_STRING, "string");
    if (type == MF_GGUF_ARRAY)
        return parse_array(p, node, 1);
    size_t sz = gg_vtype_size(type);
    if (rd(p, b, sz, gg_vtype_name(type)))
        return -1;
    v->is_signed = vtype_is_signed(type);
    switch (type) {
    case MF_GGUF_UINT8: v->u = b[0]; break;
    case MF_GGUF_INT8: v->i = (int8_t)b[0]; break;
    case MF_GGUF_UINT16: { uint16_t x; memcpy(&x, b, 2); v->u = x; break; }
    case MF_GGUF_INT16: { int16_t x; memcpy(&x, b, 2); v->i = x; break; }
    case MF_GGUF_UINT32: { uint32_t x; memcpy(&x, b, 4); v->u = x; break; }
    case MF_GGUF_INT32: { int32_t x; memcpy(&x, b, 4); v->i = x; break; }
    case MF_GGUF_UINT64: memcpy(&v->u, b, 8); break;
    case MF_GGUF_INT64: memcpy(&v->i, b, 8); break;
    case MF_GGUF_FLOAT32: { float x; memcpy(&x, b, 4); v->f = x; break; }
    case MF_GGUF_FLOAT64: memcpy(&v->f, b, 8); break;
    case MF_GGUF_BOOL:
        if (b[0] > 1)
            return mf_errorf(p->err, "%s: bool value %u is not 0 or 1", p->ctx, b[0]);
        v->u = b[0];
        break;
    default: break;
    }
    if (v->is_signed)
        v->u = (uint64_t)v->i;
    else
        v->i = (int64_t)v->u;
    return 0;
}

static void free_contents(mf_gguf *g) {
    for (int64_t i = 0; i < g->n_nodes; i++)
        free(g->nodes[i].strs);
    free(g->nodes);
    free(g->tensors);
    free(g->kv_ht);
    free(g->t_ht);
    for (gg_chunk *c = g->arena, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    memset(g, 0, sizeof *g);
}

/* Builds the kv name table; fails on a duplicate key. */
static int index_kvs(mf_gguf *g, mf_error *err) {
    g->kv_ht_cap = ht_cap_for(g->n_kv);
    g->kv_ht = mf_calloc((size_t)g->kv_ht_cap, sizeof *g->kv_ht);
    for (int64_t i = 0; i < g->n_kv; i++) {
        mf_str k = g->nodes[i].key;
        uint64_t s = ht_slot(g, g->kv_ht, g->kv_ht_cap, kv_name, k.ptr, k.len);
        if (g->kv_ht[s])
            return mf_errorf(err, "duplicate key '%s' (kv %lld and kv %lld)", MF_ESCN(k.ptr, k.len),
                             (ll)(g->kv_ht[s] - 1), (ll)i);
        g->kv_ht[s] = i + 1;
    }
    return 0;
}

/* Builds the tensor name table; fails on a duplicate name. */
static int index_tensors(mf_gguf *g, mf_error *err) {
    free(g->t_ht);
    g->t_ht_cap = ht_cap_for(g->n_tensors);
    g->t_ht = mf_calloc((size_t)g->t_ht_cap, sizeof *g->t_ht);
    for (int64_t i = 0; i < g->n_tensors; i++) {
        mf_str k = g->tensors[i].name;
        uint64_t s = ht_slot(g, g->t_ht, g->t_ht_cap, t_name, k.ptr, k.len);
        if (g->t_ht[s])
            return mf_errorf(err, "duplicate tensor name '%s' (tensors %lld and %lld)", MF_ESCN(k.ptr, k.len),
                             (ll)(g->t_ht[s] - 1), (ll)i);
        g->t_ht[s] = i + 1;
    }
    return 0;
}

/* Reads one tensor info record and validates its shape and type. */
static int parse_tensor_info(gg_parser *p, int64_t idx) {
    mf_gguf_tensor *t = &p->g->tensors[idx];
    snprintf(p->ctx, sizeof p->ctx, "tensor info %lld", (ll)idx);
    if (rd_str(p, &t->name, MF_GGUF_MAX_NAME, "tensor name"))
        return -1;
    if (t->name.len == 0)
        return mf_errorf(p->err, "%s: empty tensor name", p->ctx);
    set_ctx(p, "tensor", t->name.ptr, t->name.len);
    if (memchr(t->name.ptr, 0, (size_t)t->name.len))
        return mf_errorf(p->err, "%s: name contains a NUL byte", p->ctx);
    if (rd_u32(p, &t->n_dims, "n_dims"))
        return -1;
    if (t->n_dims < 1 || t->n_dims > MF_GGUF_MAX_DIMS)
        return mf_errorf(p->err, "%s: n_dims %u is not in 1..%d", p->ctx, t->n_dims, MF_GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < MF_GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne = 0;
        if (rd_u64(p, &ne, "dim"))
            return -1;
        if (ne == 0)
            return mf_errorf(p->err, "%s: dim %u is 0", p->ctx, d);
        if (ne > (uint64_t)INT64_MAX)
            return mf_errorf(p->err, "%s: dim %u = %llu is too large", p->ctx, d, (ull)ne);
        t->ne[d] = (int64_t)ne;
    }
    if (rd_u32(p, &t->type, "type") || rd_u64(p, &t->offset, "offset"))
        return -1;
    const mf_type_traits *tr = mf_type_get(t->type);
    if (!tr)
        return mf_errorf(p->err, "%s: unknown type %u", p->ctx, t->type);
    if (tr->block_size <= 0 || t->ne[0] % tr->block_size != 0)
        return mf_errorf(p->err, "%s: row length %lld is not a multiple of the block size %lld of %s",
                         p->ctx, (ll)t->ne[0], (ll)tr->block_size, tr->name);
    int64_t nel = t->ne[0];
    for (uint32_t d = 1; d < t->n_dims; d++)
        if (__builtin_mul_overflow(nel, t->ne[d], &nel))
            return mf_errorf(p->err, "%s: element count overflows int64 (%lld x %lld x %lld x %lld)",
                             p->ctx, (ll)t->ne[0], (ll)t->ne[1], (ll)t->ne[2], (ll)t->ne[3]);
    uint64_t row, nbytes;
    if (!mf_mul_u64((uint64_t)(t->ne[0] / tr->block_size), tr->type_size, &row) ||
        !mf_mul_u64(row, (uint64_t)(nel / t->ne[0]), &nbytes) || nbytes > (uint64_t)INT64_MAX)
        return mf_errorf(p->err, "%s: byte size overflows int64 (%lld elements of %s)", p->ctx,
                         (ll)nel, tr->name);
    t->nbytes = nbytes;
    if (t->offset % p->g->alignment != 0)
        return mf_errorf(p->err, "%s: offset %llu is not a multiple of the alignment %u", p->ctx,
                         (ull)t->offset, p->g->alignment);
    return 0;
}

/* Checks the well-known keys whose shape other modules rely on. */
static int check_known_keys(mf_gguf *g, mf_error *err) {
    int64_t i = mf_gguf_find_key(g, "general.alignment");
    g->alignment = MF_GGUF_DEFAULT_ALIGNMENT;
    if (i >= 0) {
        const gg_node *v = &g->nodes[i];
        if (v->type != MF_GGUF_UINT32)
            return mf_errorf(err, "key 'general.alignment': type %s, expected uint32", gg_vtype_name(v->type));
        if (v->u == 0 || (v->u & (v->u - 1)) != 0)
            return mf_errorf(err, "key 'general.alignment': %llu is not a power of two", (ull)v->u);
        if (v->u < MF_GGUF_MIN_ALIGNMENT)
            return mf_errorf(err, "key 'general.alignment': %llu is below the minimum %u (blocks "
                                  "would load misaligned)", (ull)v->u, MF_GGUF_MIN_ALIGNMENT);
        if (v->u > MF_GGUF_MAX_ALIGNMENT)
            return mf_errorf(err, "key 'general.alignment': %llu exceeds the limit %u", (ull)v->u,
                             MF_GGUF_MAX_ALIGNMENT);
        g->alignment = (uint32_t)v->u;
    }
    i = mf_gguf_find_key(g, "tokenizer.ggml.tokens");
    if (i >= 0) {
        const gg_node *v = &g->nodes[i];
        if (v->type != MF_GGUF_ARRAY || v->et != MF_GGUF_STRING)
            return mf_errorf(err, "key 'tokenizer.ggml.tokens': %s%s, expected array of string",
                             v->type == MF_GGUF_ARRAY ? "array of " : "type ",
                             gg_vtype_name(v->type == MF_GGUF_ARRAY ? v->et : v->type));
        if (v->n > MF_GGUF_MAX_VOCAB)
            return mf_errorf(err, "key 'tokenizer.ggml.tokens': %llu tokens exceed the limit %llu",
                             (ull)v->n, (ull)MF_GGUF_MAX_VOCAB);
    }
    return 0;
}

/* Parses a whole file image into g (zeroed by the caller). Messages carry no
 * "gguf: " prefix; the callers add it. */
static int parse_file(mf_gguf *g, const uint8_t *buf, uint64_t size, mf_error *err) {
    gg_parser p = {.g = g, .c = {.buf = buf, .size = size}, .err = err};
    snprintf(p.ctx, sizeof p.ctx, "header");
    g->buf = buf;
    g->size = size;
    g->alignment = MF_GGUF_DEFAULT_ALIGNMENT;

    uint32_t magic = 0;
    if (rd_u32(&p, &magic, "magic"))
        return -1;
    if (magic != MF_GGUF_MAGIC)
        return mf_errorf(err, "bad magic 0x%08x (expected GGUF)", magic);
    if (rd_u32(&p, &g->version, "version"))
        return -1;
    if (g->version == 1)
        return mf_errorf(err, "version 1 not supported (GGUF v1 is obsolete; reconvert the model)");
    if (g->version != 2 && g->version != 3)
        return mf_errorf(err, "version %u not supported%s", g->version,
                         (g->version & 0xffffu) == 0 ? " (a big-endian file?)" : "");
    uint64_t n_tensors = 0, n_kv = 0;
    if (rd_u64(&p, &n_tensors, "tensor count") || rd_u64(&p, &n_kv, "kv count"))
        return -1;
    if (n_kv > MF_GGUF_MAX_KV)
        return mf_errorf(err, "kv count %llu exceeds the limit %llu", (ull)n_kv, (ull)MF_GGUF_MAX_KV);
    if (n_tensors > MF_GGUF_MAX_TENSORS)
        return mf_errorf(err, "tensor count %llu exceeds the limit %llu", (ull)n_tensors,
                         (ull)MF_GGUF_MAX_TENSORS);
    if (n_kv > left(&p) / GG_MIN_KV_BYTES)
        return mf_errorf(err, "truncated: kv count %llu needs at least %llu bytes, %llu left",
                         (ull)n_kv, (ull)n_kv * GG_MIN_KV_BYTES, (ull)left(&p));
    if (n_tensors > left(&p) / GG_MIN_TINFO_BYTES)
        return mf_errorf(err, "truncated: tensor count %llu needs at least %llu bytes, %llu left",
                         (ull)n_tensors, (ull)n_tensors * GG_MIN_TINFO_BYTES, (ull)left(&p));

    /* ---- metadata ---- */
    g->mem_budget = mem_budget_for(size);
    if (reserve_nodes(g, n_kv) < 0)
        return mem_error(&p);
    g->n_kv = (int64_t)n_kv;
    for (int64_t i = 0; i < (int64_t)n_kv; i++) {
        snprintf(p.ctx, sizeof p.ctx, "kv %lld", (ll)i);
        mf_str key;
        if (rd_str(&p, &key, GG_MAX_KEY, "key"))
            return -1;
        g->nodes[i].key = key;
        if (key.len == 0)
            return mf_errorf(err, "%s: empty key", p.ctx);
        set_ctx(&p, "key", key.ptr, key.len);
        if (memchr(key.ptr, 0, (size_t)key.len))
            return mf_errorf(err, "%s: key contains a NUL byte", p.ctx);
        uint32_t type = 0;
        if (rd_u32(&p, &type, "value type") || parse_value(&p, i, type))
            return -1;
    }
    if (index_kvs(g, err) || check_known_keys(g, err))
        return -1;

    /* ---- tensor infos ---- */
    if (n_tensors > left(&p) / GG_MIN_TINFO_BYTES)
        return mf_errorf(err, "truncated: tensor count %llu needs at least %llu bytes, %llu left",
                         (ull)n_tensors, (ull)n_tensors * GG_MIN_TINFO_BYTES, (ull)left(&p));
    snprintf(p.ctx, sizeof p.ctx, "tensor infos");
    if (!charge(g, (n_tensors ? n_tensors : 1) * sizeof *g->tensors))
        return mem_error(&p);
    g->tensors = mf_calloc((size_t)(n_tensors ? n_tensors : 1), sizeof *g->tensors);
    for (int64_t i = 0; i < (int64_t)n_tensors; i++) {
        g->n_tensors = i + 1; /* names so far are owned and freed even on failure */
        if (parse_tensor_info(&p, i))
            return -1;
    }
    if (index_tensors(g, err))
        return -1;

    /* ---- data section ---- */
    uint64_t a = g->alignment;
    g->data_offset = (p.c.pos + a - 1) / a * a;
    if (n_tensors > 0 && g->data_offset > size)
        return mf_errorf(err, "truncated: data section starts at offset %llu but the file is %llu bytes",
                         (ull)g->data_offset, (ull)size);
    uint64_t data_size = size > g->data_offset ? size - g->data_offset : 0;
    /* In table order, each tensor starts where the previous one ends, rounded
     * up to the alignment: two tensors cannot share bytes, a shape cannot
     * grow into the next tensor, and a table that lost or gained an entry
     * cannot line up with the data it describes. */
    uint64_t expect = 0;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        mf_gguf_tensor *t = &g->tensors[i];
        const char *nm = MF_ESCN(t->name.ptr, t->name.len);
        if (t->offset > data_size || t->nbytes > data_size - t->offset)
            return mf_errorf(err, "tensor '%s': offset %llu + %llu bytes exceeds data section size %llu",
                             nm, (ull)t->offset, (ull)t->nbytes, (ull)data_size);
        if (t->offset != expect)
            return mf_errorf(err, "tensor '%s' (%lld of %lld): offset %llu, expected %llu (tensor data "
                                  "must follow the table order, each at the previous end aligned to %llu)",
                             nm, (ll)i, (ll)g->n_tensors, (ull)t->offset, (ull)expect, (ull)a);
        expect = (t->offset + t->nbytes + a - 1) / a * a; /* fits: offset + nbytes <= data_size */
        t->data = buf + g->data_offset + t->offset;
    }
    if (g->n_tensors > 0 && data_size > expect)
        return mf_errorf(err, "%llu bytes after the last tensor's data (offset %llu, file %llu bytes): "
                              "the tensor table does not describe the whole data section",
                         (ull)(data_size - expect), (ull)(g->data_offset + expect), (ull)size);
    return 0;
}

/* ---- open / parse / close ------------------------------------------------------------ */

int mf_gguf_parse(const void *buf, size_t len, mf_gguf **out, mf_error *err) {
    *out = NULL;
    mf_gguf *g = mf_calloc(1, sizeof *g);
    if (parse_file(g, buf, len, err)) {
        mf_gguf_close(g);
        return mf_error_prefix(err, "gguf");
    }
    *out = g;
    return 0;
}

/* MINFER_NO_MMAP=1: the file's bytes in anonymous memory (so nothing later
 * depends on the file staying unchanged, and munmap still releases it), read
 * with plain read() calls. NULL with err set on failure. */
static void *read_whole(int fd, const char *path, size_t size, mf_error *err) {
    void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        mf_errorf(err, "gguf: cannot allocate %zu bytes to read '%s': %s", size, path,
                  strerror(errno));
        return NULL;
    }
    size_t done = 0;
    while (done < size) {
        ssize_t k = read(fd, (char *)mem + done, size - done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            mf_errorf(err, "gguf: cannot read '%s' (%zu of %zu bytes): %s", path, done, size,
                      k < 0 ? strerror(errno) : "file shrank");
            munmap(mem, size);
            return NULL;
        }
        done += (size_t)k;
    }
    mprotect(mem, size, PROT_READ);
    return mem;
}

/* Maps path read-only (or reads it, see read_whole) and parses it. Errors
 * name the path. */
static int open_one(const char *path, const mf_gguf_open_options *o, mf_gguf **out,
                    mf_error *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mf_errorf(err, "gguf: cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return mf_errorf(err, "gguf: '%s' is not a regular file", path);
    }
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return mf_errorf(err, "gguf: '%s': %lld bytes do not fit the address space", path, (ll)st.st_size);
    }
    mf_gguf *g = mf_calloc(1, sizeof *g);
    size_t size = (size_t)st.st_size;
    void *map = NULL;
    if (size > 0) {
        if (o->read) {
            map = read_whole(fd, path, size, err);
            g->map_copy = map != NULL;
        }
        else if ((map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED) {
            map = NULL;
            mf_errorf(err, "gguf: cannot map '%s' (%zu bytes): %s", path, size, strerror(errno));
        }
        if (!map) {
            close(fd);
            free(g);
            return -1;
        }
#ifdef MADV_HUGEPAGE
        /* A decode streams every weight once per token, so with 4 KiB pages
         * each 4 KiB of it costs a TLB miss. Where the page cache can give
         * 2 MiB folios (ext4 and others on recent kernels), this asks for
         * them when the file is read in, and the mapping then takes PMD
         * entries: measured 88 % -> 99.6 % of a 341 MB file PMD-mapped after
         * a cold read (smaps FilePmdMapped). Pages already cached keep their
         * size; an advice the kernel refuses changes nothing, so its result
         * is not checked. */
        if (!o->read)
            (void)madvise(map, size, MADV_HUGEPAGE);
#endif
        if (o->lock && mlock(map, size) != 0)
            mf_log(MF_LOG_WARN, "cannot lock '%s' (%zu bytes) in memory: %s (see ulimit -l)", path,
                   size, strerror(errno));
    }
    mf_log(MF_LOG_DEBUG, "gguf: %s '%s' (%zu bytes)",
           o->read ? "read" : "mapped", path, size);
    close(fd);
    if (map && !g->map_copy)
        gg_guard_add(map, size, path);
    int rc = parse_file(g, map, size, err);
    g->map = map;
    g->map_len = size;
    if (rc) {
        mf_gguf_close(g);
        return mf_error_prefix(err, "gguf: %s", path);
    }
    *out = g;
    return 0;
}

/* Reads an integer kv of any integer type; 1 when absent. */
static int get_int_any(const mf_gguf *g, const char *key, int64_t *out) {
    int64_t i = mf_gguf_find_key(g, key);
    if (i < 0 || !vtype_is_int(g->nodes[i].type))
        return 1;
    *out = g->nodes[i].is_signed ? g->nodes[i].i
           : g->nodes[i].u > (uint64_t)INT64_MAX ? -1 : (int64_t)g->nodes[i].u;
    return 0;
}

/* Recognises "<prefix>-NNNNN-of-MMMMM.gguf"; returns the prefix length or 0. */
static size_t split_name(const char *path, int *no, int *count) {
    size_t n = strlen(path);
    static const char tail[] = "-00000-of-00000.gguf";
    size_t tl = sizeof tail - 1;
    if (n <= tl)
        return 0;
    const char *s = path + n - tl;
    for (size_t i = 0; i < tl; i++) {
        bool digit = tail[i] == '0';
        if (digit ? (s[i] < '0' || s[i] > '9') : s[i] != tail[i])
            return 0;
    }
    *no = atoi(s + 1);
    *count = atoi(s + 10);
    return n - tl;
}

/* Opens parts 1..count of a split model and merges their tensors into part 1. */
static int open_split(const char *path, size_t plen, int no, int count,
                      const mf_gguf_open_options *o, mf_gguf **out, mf_error *err) {
    if (no < 1 || no > count)
        return mf_errorf(err, "gguf: '%s': part number %d is not in 1..%d", path, no, count);
    char *pp = mf_malloc(plen + 32);
    mf_gguf *g = NULL;
    int rc = -1;
    for (int k = 0; k < count; k++) {
        memcpy(pp, path, plen);
        snprintf(pp + plen, 32, "-%05d-of-%05d.gguf", k + 1, count);
        mf_gguf *part;
        if (open_one(pp, o, &part, err))
            goto done;
        if (k == 0) {
            g = part;
            g->subs = mf_calloc((size_t)count, sizeof *g->subs);
        } else {
            g->subs[g->n_subs++] = part;
        }
        int64_t v;
        if (get_int_any(part, "split.count", &v) == 0 && v != count) {
            mf_errorf(err, "gguf: %s: key 'split.count': %lld, but the file name says %d parts", pp, (ll)v, count);
            goto done;
        }
        if (get_int_any(part, "split.no", &v) == 0 && v != k) {
            mf_errorf(err, "gguf: %s: key 'split.no': %lld, expected %d", pp, (ll)v, k);
            goto done;
        }
    }
    /* Merge: part 1 keeps its tensors; the others' are appended with their part index. */
    int64_t total = g->n_tensors;
    for (uint32_t s = 0; s < g->n_subs; s++)
        total += g->subs[s]->n_tensors;
    int64_t v;
    if (get_int_any(g, "split.tensors.count", &v) == 0 && v != total) {
        mf_errorf(err, "gguf: %s: key 'split.tensors.count': %lld, but the %d parts hold %lld tensors",
                  path, (ll)v, count, (ll)total);
        goto done;
    }
    g->tensors = mf_realloc(g->tensors, (size_t)(total ? total : 1) * sizeof *g->tensors);
    for (uint32_t s = 0; s < g->n_subs; s++) {
        const mf_gguf *sub = g->subs[s];
        for (int64_t i = 0; i < sub->n_tensors; i++) {
            mf_gguf_tensor t = sub->tensors[i];
            t.part = s + 1;
            g->tensors[g->n_tensors++] = t;
        }
    }
    if (index_tensors(g, err)) {
        mf_error_prefix(err, "gguf: %s", path);
        goto done;
    }
    rc = 0;
done:
    free(pp);
    if (rc) {
        mf_gguf_close(g);
        g = NULL;
    }
    *out = g;
    return rc;
}

int mf_gguf_open(const char *path, mf_gguf **out, mf_error *err) {
    return mf_gguf_open_opts(path, NULL, out, err);
}

int mf_gguf_open_opts(const char *path, const mf_gguf_open_options *o, mf_gguf **out, mf_error *err) {
    static const mf_gguf_open_options mapped = {false, false};
    if (!o)
        o = &mapped;
    int no = 0, count = 0;
    size_t plen = split_name(path, &no, &count);
    if (plen && count > 1)
        return open_split(path, plen, no, count, o, out, err);
    if (open_one(path, o, out, err))
        return -1;
    int64_t v;
    if (get_int_any(*out, "split.count", &v) == 0 && v > 1) {
        mf_gguf_close(*out);
        *out = NULL;
        return mf_errorf(err, "gguf: %s: key 'split.count' says %lld parts, but the name is not "
                              "<name>-00001-of-%05lld.gguf", path, (ll)v, (ll)v);
    }
    return 0;
}

void mf_gguf_close(mf_gguf *g) {
    if (!g)
        return;
    for (uint32_t s = 0; s < g->n_subs; s++)
        mf_gguf_close(g->subs[s]);
    free(g->subs);
    if (g->map) {
        if (!g->map_copy)
            gg_guard_remove(g->map);
        munmap(g->map, g->map_len);
    }
    free_contents(g);
    free(g);
}

/* ---- file facts ------------------------------------------------------------------------ */

uint32_t mf_gguf_version(const mf_gguf *g) { return g->version; }
uint32_t mf_gguf_alignment(const mf_gguf *g) { return g->alignment; }
uint64_t mf_gguf_data_offset(const mf_gguf *g) { return g->data_offset; }
uint32_t mf_gguf_n_parts(const mf_gguf *g) { return 1 + g->n_subs; }

uint64_t mf_gguf_file_size(const mf_gguf *g) {
    uint64_t n = g->size;
    for (uint32_t s = 0; s < g->n_subs; s++)
        n += g->subs[s]->size;
    return n;
}

int mf_gguf_part_mapping(const mf_gguf *g, uint32_t part, const void **base, uint64_t *size) {
    const mf_gguf *p = part == 0 ? g : part <= g->n_subs ? g->subs[part - 1] : NULL;
    if (!p || !p->map)
        return -1;
    *base = p->map;
    *size = p->map_len;
    return 0;
}

/* ---- metadata --------------------------------------------------------------------------- */

int64_t mf_gguf_n_kv(const mf_gguf *g) { return g->n_kv; }

int64_t mf_gguf_find_key(const mf_gguf *g, const char *key) {
    if (!g->kv_ht)
        return -1;
    uint64_t s = ht_slot(g, g->kv_ht, g->kv_ht_cap, kv_name, key, strlen(key));
    return g->kv_ht[s] - 1;
}

mf_str mf_gguf_kv_key(const mf_gguf *g, int64_t i) {
    MF_ASSERT(i >= 0 && i < g->n_kv);
    return g->nodes[i].key;
}

mf_gguf_vtype mf_gguf_kv_type(const mf_gguf *g, int64_t i) {
    MF_ASSERT(i >= 0 && i < g->n_nodes);
    return (mf_gguf_vtype)g->nodes[i].type;
}

/* Shared front of the typed getters: finds key, returns its node or NULL
 * with *rc = 1 (absent). */
static const gg_node *find_node(const mf_gguf *g, const char *key, int *rc) {
    int64_t i = mf_gguf_find_key(g, key);
    *rc = i < 0 ? 1 : 0;
    return i < 0 ? NULL : &g->nodes[i];
}

static int type_err(mf_error *err, const char *key, const gg_node *v, const char *want) {
    if (v->type == MF_GGUF_ARRAY)
        return mf_errorf(err, "gguf: key '%s': array of %s, expected %s", key, gg_vtype_name(v->et), want);
    return mf_errorf(err, "gguf: key '%s': type %s, expected %s", key, gg_vtype_name(v->type), want);
}

/* Range-checks an integer kv against [lo, hi] (as signed or unsigned bounds). */
static int get_int_checked(const mf_gguf *g, const char *key, const char *want, int64_t lo,
                           uint64_t hi, int64_t *si, uint64_t *ui, mf_error *err) {
    int rc;
    const gg_node *v = find_node(g, key, &rc);
    if (!v)
        return rc;
    if (!vtype_is_int(v->type))
        return type_err(err, key, v, want);
    bool fits = v->is_signed ? (v->i >= lo && (v->i < 0 || (uint64_t)v->i <= hi)) : v->u <= hi;
    if (!fits) {
        if (v->is_signed)
            return mf_errorf(err, "gguf: key '%s': value %lld (%s) does not fit %s", key, (ll)v->i,
                             gg_vtype_name(v->type), want);
        return mf_errorf(err, "gguf: key '%s': value %llu (%s) does not fit %s", key, (ull)v->u,
                         gg_vtype_name(v->type), want);
    }
    *si = v->i;
    *ui = v->u;
    return 0;
}

int mf_gguf_get_u32(const mf_gguf *g, const char *key, uint32_t *out, mf_error *err) {
    int64_t si = 0;
    uint64_t ui = 0;
    int rc = get_int_checked(g, key, "uint32", 0, UINT32_MAX, &si, &ui, err);
    if (rc == 0)
        *out = (uint32_t)ui;
    return rc;
}

int mf_gguf_get_i32(const mf_gguf *g, const char *key, int32_t *out, mf_error *err) {
    int64_t si = 0;
    uint64_t ui = 0;
    int rc = get_int_checked(g, key, "int32", INT32_MIN, INT32_MAX, &si, &ui, err);
    if (rc == 0)
        *out = (int32_t)si;
    return rc;
}

int mf_gguf_get_u64(const mf_gguf *g, const char *key, uint64_t *out, mf_error *err) {
    int64_t si = 0;
    uint64_t ui = 0;
    int rc = get_int_checked(g, key, "uint64", 0, UINT64_MAX, &si, &ui, err);
    if (rc == 0)
        *out = ui;
    return rc;
}

int mf_gguf_get_f32(const mf_gguf *g, const char *key, float *out, mf_error *err) {
    int rc;
    const gg_node *v = find_node(g, key, &rc);
    if (!v)
        return rc;
    if (v->type != MF_GGUF_FLOAT32 && v->type != MF_GGUF_FLOAT64)
        return type_err(err, key, v, "float32");
    *out = (float)v->f;
    return 0;
}

int mf_gguf_get_bool(const mf_gguf *g, const char *key, bool *out, mf_error *err) {
    int rc;
    const gg_node *v = find_node(g, key, &rc);
    if (!v)
        return rc;
    if (v->type != MF_GGUF_BOOL)
        return type_err(err, key, v, "bool");
    *out = v->u != 0;
    return 0;
}

int mf_gguf_get_str(const mf_gguf *g, const char *key, mf_str *out, mf_error *err) {
    int rc;
    const gg_node *v = find_node(g, key, &rc);
    if (!v)
        return rc;
    if (v->type != MF_GGUF_STRING)
        return type_err(err, key, v, "string");
    *out = v->s;
    return 0;
}

int mf_gguf_get_arr(const mf_gguf *g, const char *key, mf_gguf_vtype want, int64_t *kv,
                    uint64_t *n, mf_error *err) {
    int64_t i = mf_gguf_find_key(g, key);
    if (i < 0)
        return 1;
    const gg_node *v = &g->nodes[i];
    if (v->type != MF_GGUF_ARRAY)
        return mf_errorf(err, "gguf: key '%s': type %s, expected array", key, gg_vtype_name(v->type));
    if (want != MF_GGUF_VTYPE_COUNT && v->et != (uint32_t)want)
        return mf_errorf(err, "gguf: key '%s': array of %s, expected array of %s", key,
                         gg_vtype_name(v->et), gg_vtype_name(want));
    *kv = i;
    *n = v->n;
    return 0;
}

/* mf_gguf_get_arr with an element-type class instead of one type. */
static int get_arr_class(const mf_gguf *g, const char *key, bool floats_too, int64_t *kv,
                         uint64_t *n, mf_error *err) {
    int64_t i = mf_gguf_find_key(g, key);
    if (i < 0)
        return 1;
    const gg_node *v = &g->nodes[i];
    const char *want = floats_too ? "array of numbers" : "array of integers";
    if (v->type != MF_GGUF_ARRAY)
        return mf_errorf(err, "gguf: key '%s': type %s, expected %s", key, gg_vtype_name(v->type), want);
    bool ok = vtype_is_int(v->et) || (floats_too && (v->et == MF_GGUF_FLOAT32 || v->et == MF_GGUF_FLOAT64));
    if (!ok)
        return mf_errorf(err, "gguf: key '%s': array of %s, expected %s", key, gg_vtype_name(v->et), want);
    *kv = i;
    *n = v->n;
    return 0;
}

int mf_gguf_get_arr_ints(const mf_gguf *g, const char *key, int64_t *kv, uint64_t *n,
                         mf_error *err) {
    return get_arr_class(g, key, false, kv, n, err);
}

int mf_gguf_get_arr_nums(const mf_gguf *g, const char *key, int64_t *kv, uint64_t *n,
                         mf_error *err) {
    return get_arr_class(g, key, true, kv, n, err);
}

static const gg_node *arr_node(const mf_gguf *g, int64_t kv) {
    MF_ASSERT(kv >= 0 && kv < g->n_nodes && g->nodes[kv].type == MF_GGUF_ARRAY);
    return &g->nodes[kv];
}

mf_gguf_vtype mf_gguf_arr_type(const mf_gguf *g, int64_t kv) { return (mf_gguf_vtype)arr_node(g, kv)->et; }
uint64_t mf_gguf_arr_n(const mf_gguf *g, int64_t kv) { return arr_node(g, kv)->n; }

mf_str mf_gguf_arr_str(const mf_gguf *g, int64_t kv, uint64_t i) {
    const gg_node *v = arr_node(g, kv);
    MF_ASSERT(v->et == MF_GGUF_STRING && i < v->n);
    return v->strs[i];
}

/* Element i of a fixed-size array, as the widest signed/unsigned/float value. */
static void arr_elem(const gg_node *v, uint64_t i, int64_t *si, double *f) {
    MF_ASSERT(gg_vtype_size(v->et) > 0 && i < v->n);
    const uint8_t *p = v->raw + i * gg_vtype_size(v->et);
    switch (v->et) {
    case MF_GGUF_UINT8: case MF_GGUF_BOOL: *si = p[0]; *f = (double)*si; return;
    case MF_GGUF_INT8: *si = (int8_t)p[0]; *f = (double)*si; return;
    case MF_GGUF_UINT16: { uint16_t x; memcpy(&x, p, 2); *si = x; *f = x; return; }
    case MF_GGUF_INT16: { int16_t x; memcpy(&x, p, 2); *si = x; *f = x; return; }
    case MF_GGUF_UINT32: { uint32_t x; memcpy(&x, p, 4); *si = x; *f = x; return; }
    case MF_GGUF_INT32: { int32_t x; memcpy(&x, p, 4); *si = x; *f = x; return; }
    case MF_GGUF_UINT64: { uint64_t x; memcpy(&x, p, 8); *si = (int64_t)x; *f = (double)x; return; }
    case MF_GGUF_INT64: { int64_t x; memcpy(&x, p, 8); *si = x; *f = (double)x; return; }
    case MF_GGUF_FLOAT32: { float x; memcpy(&x, p, 4); *f = x; break; }
    case MF_GGUF_FLOAT64: memcpy(f, p, 8); break;
    default: MF_ASSERT(0);
    }
    /* Float to integer: truncate, saturating (NaN becomes 0). */
    *si = *f != *f ? 0 : *f >= 9.2233720368547758e18 ? INT64_MAX : *f <= -9.2233720368547758e18 ? INT64_MIN
                                                                                              : (int64_t)*f;
}

int64_t mf_gguf_arr_int(const mf_gguf *g, int64_t kv, uint64_t i) {
    int64_t si;
    double f;
    arr_elem(arr_node(g, kv), i, &si, &f);
    return si;
}

double mf_gguf_arr_float(const mf_gguf *g, int64_t kv, uint64_t i) {
    int64_t si;
    double f;
    arr_elem(arr_node(g, kv), i, &si, &f);
    return f;
}

int64_t mf_gguf_arr_sub(const mf_gguf *g, int64_t kv, uint64_t i) {
    const gg_node *v = arr_node(g, kv);
    MF_ASSERT(v->et == MF_GGUF_ARRAY && i < v->n);
    return v->sub0 + (int64_t)i;
}

/* Appends s to buf[*k..n) as a quoted, escaped, possibly shortened string. */
static void fmt_quoted(char *buf, size_t n, size_t *k, mf_str s, size_t max) {
    size_t j = *k;
    if (j + 1 < n)
        buf[j++] = '"';
    for (uint64_t i = 0; i < s.len && j + 6 < n; i++) {
        if (i == max) {
            j += (size_t)snprintf(buf + j, n - j, "...");
            break;
        }
        unsigned char ch = (unsigned char)s.ptr[i];
        if (ch == '"' || ch == '\\')
            buf[j++] = '\\', buf[j++] = (char)ch;
        else if (ch == '\n')
            buf[j++] = '\\', buf[j++] = 'n';
        else if (ch < 32 || ch == 127)
            j += (size_t)snprintf(buf + j, n - j, "\\x%02x", ch);
        else
            buf[j++] = (char)ch;
    }
    if (j + 1 < n)
        buf[j++] = '"';
    buf[j < n ? j : n - 1] = 0;
    *k = j < n ? j : n - 1;
}

void mf_gguf_kv_format(const mf_gguf *g, int64_t i, char *buf, size_t n) {
    if (n == 0)
        return;
    MF_ASSERT(i >= 0 && i < g->n_nodes);
    const gg_node *v = &g->nodes[i];
    size_t k = 0;
    buf[0] = 0;
    switch (v->type) {
    case MF_GGUF_FLOAT32: snprintf(buf, n, "%.9g", v->f); break;
    case MF_GGUF_FLOAT64: snprintf(buf, n, "%.17g", v->f); break;
    case MF_GGUF_BOOL: snprintf(buf, n, "%s", v->u ? "true" : "false"); break;
    case MF_GGUF_STRING: fmt_quoted(buf, n, &k, v->s, 200); break;
    case MF_GGUF_ARRAY:
        if (v->n <= 8 && v->et != MF_GGUF_ARRAY && v->et != MF_GGUF_STRING) {
            /* short numeric arrays inline, as a reader expects for e.g. rope sections */
            k = (size_t)snprintf(buf, n, "[");
            for (uint64_t j = 0; j < v->n && k < n; j++) {
                int64_t si;
                double f;
                arr_elem(v, j, &si, &f);
                const char *sep = j ? ", " : "";
                if (v->et == MF_GGUF_FLOAT32 || v->et == MF_GGUF_FLOAT64)
                    k += (size_t)snprintf(buf + k, n - k, "%s%.9g", sep, f);
                else if (v->et == MF_GGUF_BOOL)
                    k += (size_t)snprintf(buf + k, n - k, "%s%s", sep, si ? "true" : "false");
                else if (v->et == MF_GGUF_UINT64)
                    k += (size_t)snprintf(buf + k, n - k, "%s%llu", sep, (ull)(uint64_t)si);
                else
                    k += (size_t)snprintf(buf + k, n - k, "%s%lld", sep, (ll)si);
            }
            if (k < n)
                snprintf(buf + k, n - k, "]");
        } else {
            snprintf(buf, n, "[%llu %s%s]", (ull)v->n, v->et == MF_GGUF_ARRAY ? "arrays" : gg_vtype_name(v->et),
                     v->et == MF_GGUF_ARRAY ? "" : "s");
        }
        break;
    default:
        if (v->is_signed)
            snprintf(buf, n, "%lld", (ll)v->i);
        else
            snprintf(buf, n, "%llu", (ull)v->u);
    }
}

/* ---- tensors ------------------------------------------------------------------------------ */

int64_t mf_gguf_n_tensors(const mf_gguf *g) { return g->n_tensors; }

const mf_gguf_tensor *mf_gguf_tensor_at(const mf_gguf *g, int64_t i) {
    MF_ASSERT(i >= 0 && i < g->n_tensors);
    return &g->tensors[i];
}

const mf_gguf_tensor *mf_gguf_find_tensor(const mf_gguf *g, const char *name) {
    if (!g->t_ht)
        return NULL;
    uint64_t s = ht_slot(g, g->t_ht, g->t_ht_cap, t_name, name, strlen(name));
    return g->t_ht[s] ? &g->tensors[g->t_ht[s] - 1] : NULL;
}

/* ---- raw value check (for the writer) ------------------------------------------------------ */

int gg_check_value(uint32_t type, const void *buf, size_t len, mf_error *err) {
    mf_gguf g = {0};
    gg_parser p = {.g = &g, .c = {.buf = buf, .size = len}, .err = err};
    snprintf(p.ctx, sizeof p.ctx, "value");
    g.mem_budget = mem_budget_for(len);
    reserve_nodes(&g, 1);
    g.n_kv = 1;
    int rc = parse_value(&p, 0, type);
    if (rc == 0 && p.c.pos != len)
        rc = mf_errorf(err, "value: %llu trailing bytes after a %s value", (ull)(len - p.c.pos),
                       gg_vtype_name(type));
    free_contents(&g);
    return rc;
}
