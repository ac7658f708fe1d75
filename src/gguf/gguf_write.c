/* gguf_write.c - streaming GGUF v3 writer.
 *
 * Metadata values are encoded to their on-disk bytes when they are set, so
 * begin() only concatenates. Tensor data never sit in memory: the caller
 * streams them in declaration order and the writer pads each one to the
 * alignment. The output goes to PATH.tmp and is renamed over PATH only after
 * fsync, so a crash or an error never leaves a half-written PATH.
 *
 * Setters return void (so that building metadata reads as a list); the first
 * invalid call is remembered and reported by mf_gguf_writer_begin. */
#include "gguf/gguf_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "quant/quant.h"

typedef unsigned long long ull;
typedef long long ll;

typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
} wbuf;

static void wb_put(wbuf *b, const void *d, size_t n) {
    if (b->cap - b->n < n) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap - b->n < n)
            cap *= 2;
        b->p = mf_realloc(b->p, cap);
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void wb_u32(wbuf *b, uint32_t v) { wb_put(b, &v, 4); }
static void wb_u64(wbuf *b, uint64_t v) { wb_put(b, &v, 8); }
static void wb_str(wbuf *b, const char *s, uint64_t n) {
    wb_u64(b, n);
    wb_put(b, s, (size_t)n);
}

typedef struct w_kv {
    char *key;
    uint32_t type;
    wbuf val; /* encoded value, without the type tag */
} w_kv;

typedef struct w_tensor {
    char *name;
    uint32_t type, n_dims;
    int64_t ne[MF_GGUF_MAX_DIMS];
    uint64_t nbytes, offset;
} w_tensor;

struct mf_gguf_writer {
    uint32_t alignment;
    w_kv *kvs;
    size_t n_kv, cap_kv;
    w_tensor *ts;
    size_t n_t, cap_t;
    bool failed;          /* a setter was misused; `deferred` says how */
    mf_error deferred;
    FILE *f;
    char *path, *tmp;
    uint64_t pos;         /* bytes written to the file */
    size_t cur;           /* tensor being written */
    uint64_t cur_done;    /* its bytes written so far */
    bool begun, finished, io_failed;
};

mf_gguf_writer *mf_gguf_writer_new(void) {
    mf_gguf_writer *w = mf_calloc(1, sizeof *w);
    w->alignment = MF_GGUF_DEFAULT_ALIGNMENT;
    return w;
}

void mf_gguf_writer_free(mf_gguf_writer *w) {
    if (!w)
        return;
    if (w->f) {
        fclose(w->f);
        unlink(w->tmp);
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].val.p);
    }
    for (size_t i = 0; i < w->n_t; i++)
        free(w->ts[i].name);
    free(w->kvs);
    free(w->ts);
    free(w->path);
    free(w->tmp);
    free(w);
}

/* Records the first setter error; later ones are dropped (the first is the cause). */
static void defer(mf_gguf_writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void defer(mf_gguf_writer *w, const char *fmt, ...) {
    if (w->failed)
        return;
    w->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->deferred.msg, sizeof w->deferred.msg, fmt, ap);
    va_end(ap);
}

void mf_gguf_writer_set_alignment(mf_gguf_writer *w, uint32_t alignment) {
    if (alignment < MF_GGUF_MIN_ALIGNMENT || (alignment & (alignment - 1)) ||
        alignment > MF_GGUF_MAX_ALIGNMENT) {
        defer(w, "gguf writer: alignment %u is not a power of two in %u..%u", alignment,
              MF_GGUF_MIN_ALIGNMENT, MF_GGUF_MAX_ALIGNMENT);
        return;
    }
    w->alignment = alignment;
}

/* Returns the kv for key (created empty if new), or NULL after a deferred error. */
static w_kv *kv_slot(mf_gguf_writer *w, const char *key, uint32_t type) {
    size_t len = strlen(key);
    if (len == 0 || len > GG_MAX_KEY) {
        defer(w, "gguf writer: key of %zu bytes (must be 1..%u)", len, GG_MAX_KEY);
        return NULL;
    }
    if (w->begun) {
        defer(w, "gguf writer: key '%s' set after begin", key);
        return NULL;
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, key) == 0) {
            w->kvs[i].type = type;
            w->kvs[i].val.n = 0;
            return &w->kvs[i];
        }
    }
    if (w->n_kv == w->cap_kv) {
        w->cap_kv = w->cap_kv ? w->cap_kv * 2 : 32;
        w->kvs = mf_realloc(w->kvs, w->cap_kv * sizeof *w->kvs);
    }
    w_kv *kv = &w->kvs[w->n_kv++];
    memset(kv, 0, sizeof *kv);
    kv->key = mf_strdup(key);
    kv->type = type;
    return kv;
}

static void set_fixed(mf_gguf_writer *w, const char *key, uint32_t type, const void *v) {
    w_kv *kv = kv_slot(w, key, type);
    if (kv)
        wb_put(&kv->val, v, gg_vtype_size(type));
}

void mf_gguf_writer_set_u8(mf_gguf_writer *w, const char *key, uint8_t v) { set_fixed(w, key, MF_GGUF_UINT8, &v); }
void mf_gguf_writer_set_i8(mf_gguf_writer *w, const char *key, int8_t v) { set_fixed(w, key, MF_GGUF_INT8, &v); }
void mf_gguf_writer_set_u16(mf_gguf_writer *w, const char *key, uint16_t v) { set_fixed(w, key, MF_GGUF_UINT16, &v); }
void mf_gguf_writer_set_i16(mf_gguf_writer *w, const char *key, int16_t v) { set_fixed(w, key, MF_GGUF_INT16, &v); }
void mf_gguf_writer_set_u32(mf_gguf_writer *w, const char *key, uint32_t v) { set_fixed(w, key, MF_GGUF_UINT32, &v); }
void mf_gguf_writer_set_i32(mf_gguf_writer *w, const char *key, int32_t v) { set_fixed(w, key, MF_GGUF_INT32, &v); }
void mf_gguf_writer_set_u64(mf_gguf_writer *w, const char *key, uint64_t v) { set_fixed(w, key, MF_GGUF_UINT64, &v); }
void mf_gguf_writer_set_i64(mf_gguf_writer *w, const char *key, int64_t v) { set_fixed(w, key, MF_GGUF_INT64, &v); }
void mf_gguf_writer_set_f32(mf_gguf_writer *w, const char *key, float v) { set_fixed(w, key, MF_GGUF_FLOAT32, &v); }
void mf_gguf_writer_set_f64(mf_gguf_writer *w, const char *key, double v) { set_fixed(w, key, MF_GGUF_FLOAT64, &v); }

void mf_gguf_writer_set_bool(mf_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    set_fixed(w, key, MF_GGUF_BOOL, &b);
}

void mf_gguf_writer_set_str(mf_gguf_writer *w, const char *key, const char *v) {
    size_t n = strlen(v);
    if (n > MF_GGUF_MAX_STRING) {
        defer(w, "gguf writer: key '%s': string of %zu bytes exceeds the limit %llu", key, n,
              (ull)MF_GGUF_MAX_STRING);
        return;
    }
    w_kv *kv = kv_slot(w, key, MF_GGUF_STRING);
    if (kv)
        wb_str(&kv->val, v, n);
}

void mf_gguf_writer_set_arr(mf_gguf_writer *w, const char *key, mf_gguf_vtype type, const void *data,
                            uint64_t n) {
    size_t esz = gg_vtype_size((uint32_t)type);
    if (esz == 0) {
        defer(w, "gguf writer: key '%s': set_arr takes fixed-size elements, not %s (use set_arr_str "
                 "or set_raw)", key, gg_vtype_name((uint32_t)type));
        return;
    }
    if (n > MF_GGUF_MAX_ARRAY) {
        defer(w, "gguf writer: key '%s': array length %llu exceeds the limit %llu", key, (ull)n,
              (ull)MF_GGUF_MAX_ARRAY);
        return;
    }
    if (type == MF_GGUF_BOOL) {
        for (uint64_t i = 0; i < n; i++) {
            if (((const uint8_t *)data)[i] > 1) {
                defer(w, "gguf writer: key '%s': bool element %llu is %u, not 0 or 1", key, (ull)i,
                      ((const uint8_t *)data)[i]);
                return;
            }
        }
    }
    w_kv *kv = kv_slot(w, key, MF_GGUF_ARRAY);
    if (!kv)
        return;
    wb_u32(&kv->val, (uint32_t)type);
    wb_u64(&kv->val, n);
    wb_put(&kv->val, data, (size_t)(n * esz));
}

void mf_gguf_writer_set_arr_str(mf_gguf_writer *w, const char *key, const char *const *strs,
                                const uint64_t *lens, uint64_t n) {
    if (n > MF_GGUF_MAX_ARRAY) {
        defer(w, "gguf writer: key '%s': array length %llu exceeds the limit %llu", key, (ull)n,
              (ull)MF_GGUF_MAX_ARRAY);
        return;
    }
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = lens ? lens[i] : strlen(strs[i]);
        if (len > MF_GGUF_MAX_STRING) {
            defer(w, "gguf writer: key '%s': string element %llu of %llu bytes exceeds the limit %llu",
                  key, (ull)i, (ull)len, (ull)MF_GGUF_MAX_STRING);
            return;
        }
    }
    w_kv *kv = kv_slot(w, key, MF_GGUF_ARRAY);
    if (!kv)
        return;
    wb_u32(&kv->val, MF_GGUF_STRING);
    wb_u64(&kv->val, n);
    for (uint64_t i = 0; i < n; i++)
        wb_str(&kv->val, strs[i], lens ? lens[i] : strlen(strs[i]));
}

void mf_gguf_writer_set_raw(mf_gguf_writer *w, const char *key, mf_gguf_vtype type, const void *bytes,
                            size_t nbytes) {
    mf_error e;
    if (gg_check_value((uint32_t)type, bytes, nbytes, &e)) {
        defer(w, "gguf writer: key '%s': %s", key, e.msg);
        return;
    }
    w_kv *kv = kv_slot(w, key, (uint32_t)type);
    if (kv)
        wb_put(&kv->val, bytes, nbytes);
}

/* Encodes node i of g (value bytes without the type tag). Arrays of arrays
 * recurse; the parser bounded their depth. */
static void encode_node(wbuf *b, const mf_gguf *g, int64_t i) {
    const gg_node *v = &g->nodes[i];
    if (v->type == MF_GGUF_STRING) {
        wb_str(b, v->s.ptr, v->s.len);
    } else if (v->type == MF_GGUF_ARRAY) {
        wb_u32(b, v->et);
        wb_u64(b, v->n);
        size_t esz = gg_vtype_size(v->et);
        if (esz)
            wb_put(b, v->raw, (size_t)(v->n * esz));
        else if (v->et == MF_GGUF_STRING)
            for (uint64_t j = 0; j < v->n; j++)
                wb_str(b, v->strs[j].ptr, v->strs[j].len);
        else
            for (uint64_t j = 0; j < v->n; j++)
                encode_node(b, g, v->sub0 + (int64_t)j);
    } else {
        /* scalars were widened on read; write back the declared width */
        uint64_t u = v->is_signed ? (uint64_t)v->i : v->u;
        if (v->type == MF_GGUF_FLOAT32) {
            float f = (float)v->f;
            wb_put(b, &f, 4);
        } else if (v->type == MF_GGUF_FLOAT64) {
            wb_put(b, &v->f, 8);
        } else {
            wb_put(b, &u, gg_vtype_size(v->type)); /* little endian: low bytes first */
        }
    }
}

void mf_gguf_writer_copy_kv(mf_gguf_writer *w, const mf_gguf *g, int64_t i) {
    MF_ASSERT(i >= 0 && i < g->n_kv);
    w_kv *kv = kv_slot(w, g->nodes[i].key.ptr, g->nodes[i].type);
    if (kv)
        encode_node(&kv->val, g, i);
}

int64_t mf_gguf_writer_add_tensor(mf_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                  const int64_t *ne, mf_error *err) {
    size_t len = strlen(name);
    if (w->begun)
        return mf_errorf(err, "gguf writer: tensor '%s' added after begin", name);
    if (len == 0 || len > MF_GGUF_MAX_NAME)
        return mf_errorf(err, "gguf writer: tensor name of %zu bytes (must be 1..%d)", len, MF_GGUF_MAX_NAME);
    const mf_type_traits *tr = mf_type_get(type);
    if (!tr)
        return mf_errorf(err, "gguf writer: tensor '%s': unknown type %u", name, type);
    if (n_dims < 1 || n_dims > MF_GGUF_MAX_DIMS)
        return mf_errorf(err, "gguf writer: tensor '%s': n_dims %u is not in 1..%d", name, n_dims,
                         MF_GGUF_MAX_DIMS);
    int64_t nel = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] <= 0)
            return mf_errorf(err, "gguf writer: tensor '%s': dim %u is %lld", name, d, (ll)ne[d]);
        if (__builtin_mul_overflow(nel, ne[d], &nel))
            return mf_errorf(err, "gguf writer: tensor '%s': element count overflows int64", name);
    }
    if (ne[0] % tr->block_size != 0)
        return mf_errorf(err, "gguf writer: tensor '%s': row length %lld is not a multiple of the block "
                              "size %lld of %s", name, (ll)ne[0], (ll)tr->block_size, tr->name);
    uint64_t row, nbytes;
    if (!mf_mul_u64((uint64_t)(ne[0] / tr->block_size), tr->type_size, &row) ||
        !mf_mul_u64(row, (uint64_t)(nel / ne[0]), &nbytes) || nbytes > (uint64_t)INT64_MAX)
        return mf_errorf(err, "gguf writer: tensor '%s': byte size overflows int64", name);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->ts[i].name, name) == 0)
            return mf_errorf(err, "gguf writer: duplicate tensor name '%s'", name);
    if (w->n_t == w->cap_t) {
        w->cap_t = w->cap_t ? w->cap_t * 2 : 64;
        w->ts = mf_realloc(w->ts, w->cap_t * sizeof *w->ts);
    }
    w_tensor *t = &w->ts[w->n_t];
    memset(t, 0, sizeof *t);
    t->name = mf_strdup(name);
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < MF_GGUF_MAX_DIMS; d++)
        t->ne[d] = d < n_dims ? ne[d] : 1;
    t->nbytes = nbytes;
    return (int64_t)w->n_t++;
}

/* ---- output --------------------------------------------------------------------------- */

static int out(mf_gguf_writer *w, const void *d, size_t n, mf_error *err) {
    if (n && fwrite(d, 1, n, w->f) != n) {
        w->io_failed = true;
        return mf_errorf(err, "gguf writer: %s: write failed at offset %llu: %s", w->tmp, (ull)w->pos,
                         strerror(errno));
    }
    w->pos += n;
    return 0;
}

static int pad(mf_gguf_writer *w, mf_error *err) {
    static const uint8_t zeros[256];
    uint64_t a = w->alignment, rem = (a - w->pos % a) % a;
    while (rem > 0) {
        size_t k = rem < sizeof zeros ? (size_t)rem : sizeof zeros;
        if (out(w, zeros, k, err))
            return -1;
        rem -= k;
    }
    return 0;
}

int mf_gguf_writer_begin(mf_gguf_writer *w, const char *path, mf_error *err) {
    if (w->failed) {
        *err = w->deferred;
        return -1;
    }
    if (w->begun)
        return mf_errorf(err, "gguf writer: begin called twice (%s)", path);
    /* The alignment the data are laid out with is the one the file declares. */
    bool has_key = false;
    for (size_t i = 0; i < w->n_kv; i++)
        has_key |= strcmp(w->kvs[i].key, "general.alignment") == 0;
    if (has_key || w->alignment != MF_GGUF_DEFAULT_ALIGNMENT)
        mf_gguf_writer_set_u32(w, "general.alignment", w->alignment);
    w->begun = true;

    uint64_t off = 0, a = w->alignment;
    for (size_t i = 0; i < w->n_t; i++) {
        w->ts[i].offset = off;
        off = (off + w->ts[i].nbytes + a - 1) / a * a;
    }
    w->path = mf_strdup(path);
    w->tmp = mf_malloc(strlen(path) + 5);
    sprintf(w->tmp, "%s.tmp", path);
    w->f = fopen(w->tmp, "wb");
    if (!w->f)
        return mf_errorf(err, "gguf writer: cannot create '%s': %s", w->tmp, strerror(errno));
    setvbuf(w->f, NULL, _IOFBF, 1 << 20);

    wbuf h = {0};
    wb_u32(&h, MF_GGUF_MAGIC);
    wb_u32(&h, 3);
    wb_u64(&h, w->n_t);
    wb_u64(&h, w->n_kv);
    int rc = out(w, h.p, h.n, err);
    for (size_t i = 0; i < w->n_kv && rc == 0; i++) {
        h.n = 0;
        wb_str(&h, w->kvs[i].key, strlen(w->kvs[i].key));
        wb_u32(&h, w->kvs[i].type);
        rc = out(w, h.p, h.n, err) || out(w, w->kvs[i].val.p, w->kvs[i].val.n, err) ? -1 : 0;
    }
    for (size_t i = 0; i < w->n_t && rc == 0; i++) {
        const w_tensor *t = &w->ts[i];
        h.n = 0;
        wb_str(&h, t->name, strlen(t->name));
        wb_u32(&h, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            wb_u64(&h, (uint64_t)t->ne[d]);
        wb_u32(&h, t->type);
        wb_u64(&h, t->offset);
        rc = out(w, h.p, h.n, err);
    }
    free(h.p);
    if (rc == 0)
        rc = pad(w, err);
    return rc;
}

int mf_gguf_writer_write(mf_gguf_writer *w, const void *data, size_t nbytes, mf_error *err) {
    if (!w->f || w->io_failed)
        return mf_errorf(err, "gguf writer: write without a successful begin");
    if (w->cur >= w->n_t)
        return mf_errorf(err, "gguf writer: %zu bytes written past the last tensor", nbytes);
    w_tensor *t = &w->ts[w->cur];
    if (nbytes > t->nbytes - w->cur_done)
        return mf_errorf(err, "gguf writer: tensor '%s': %zu bytes written, only %llu of %llu left",
                         t->name, nbytes, (ull)(t->nbytes - w->cur_done), (ull)t->nbytes);
    if (out(w, data, nbytes, err))
        return -1;
    w->cur_done += nbytes;
    if (w->cur_done == t->nbytes) {
        w->cur++;
        w->cur_done = 0;
        return pad(w, err);
    }
    return 0;
}

int mf_gguf_writer_finish(mf_gguf_writer *w, mf_error *err) {
    if (!w->f || w->io_failed)
        return mf_errorf(err, "gguf writer: finish without a successful begin");
    if (w->cur < w->n_t)
        return mf_errorf(err, "gguf writer: tensor '%s': %llu of %llu bytes written (%zu of %zu tensors done)",
                         w->ts[w->cur].name, (ull)w->cur_done, (ull)w->ts[w->cur].nbytes, w->cur, w->n_t);
    int fd = fileno(w->f);
    if (fflush(w->f) != 0 || fsync(fd) != 0) {
        w->io_failed = true;
        return mf_errorf(err, "gguf writer: %s: flush failed: %s", w->tmp, strerror(errno));
    }
    int rc = fclose(w->f);
    w->f = NULL;
    if (rc != 0) {
        unlink(w->tmp);
        return mf_errorf(err, "gguf writer: %s: close failed: %s", w->tmp, strerror(errno));
    }
    if (rename(w->tmp, w->path) != 0) {
        int e = errno;
        unlink(w->tmp);
        return mf_errorf(err, "gguf writer: cannot rename '%s' to '%s': %s", w->tmp, w->path, strerror(e));
    }
    /* Make the rename itself durable. */
    char *dir = mf_strdup(w->path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[slash == dir ? 1 : 0] = 0;
    int dfd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(dir);
    w->finished = true;
    return 0;
}
