/* test_gguf_rw.c - writer -> reader round trips.
 *
 * Writes files with every metadata type (nested arrays included) and several
 * tensors of random content, streamed in uneven chunks, reads them back with
 * mf_gguf_open and compares every value and byte. Also: typed getter
 * contracts, kv copy, writer misuse, split models opened from any part. */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "mf_test.h"
#include "quant/quant.h"
#include "test_gguf_build.h"

static char tmpdir[256];

static void setup(void);

static const char *tmp_path(const char *name) {
    static char buf[4][512];
    if (!tmpdir[0])
        setup();
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static void rnd_bytes(void *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        ((uint8_t *)p)[i] = (uint8_t)(rnd() >> 32);
}

static bool file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* ---- the "every type" file --------------------------------------------------------------- */

typedef struct {
    uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
    uint64_t u64; int64_t i64; float f32; double f64;
    uint8_t a_u8[5]; int8_t a_i8[6]; uint16_t a_u16[7]; int16_t a_i16[3]; uint32_t a_u32[9];
    int32_t a_i32[4]; uint64_t a_u64[3]; int64_t a_i64[5]; float a_f32[11]; double a_f64[2];
    uint8_t a_bool[10];
    char strs[6][24];
    uint64_t str_lens[6];
} values;

static void make_values(values *v) {
    rnd_bytes(v, sizeof *v);
    v->f32 = (float)(rnd() % 100000) / 7.0f;
    v->f64 = (double)(rnd() % 1000000) / 13.0;
    for (int i = 0; i < 11; i++)
        v->a_f32[i] = (float)((int)(rnd() % 2001) - 1000) / 3.0f;
    for (int i = 0; i < 2; i++)
        v->a_f64[i] = (double)(rnd() % 100000) / 9.0;
    for (int i = 0; i < 10; i++)
        v->a_bool[i] = rnd() & 1;
    for (int i = 0; i < 6; i++) {
        v->str_lens[i] = i == 0 ? 0 : 1 + rnd() % 20; /* an empty string, and bytes of any value */
        v->strs[i][v->str_lens[i]] = 0;
    }
    v->strs[3][1] = 0; /* an embedded NUL */
}

/* GGUF encoding of [[1,2,3],[],[-7]] (int32) and [[["a"],["bc",""]]] (strings, 3 levels) */
static void nested_i32(gb *b) {
    gb_u32(b, 9);
    gb_u64(b, 3);
    gb_u32(b, 5), gb_u64(b, 3), gb_u32(b, 1), gb_u32(b, 2), gb_u32(b, 3);
    gb_u32(b, 5), gb_u64(b, 0);
    gb_u32(b, 5), gb_u64(b, 1), gb_u32(b, (uint32_t)-7);
}
static void nested_str(gb *b) {
    gb_u32(b, 9);
    gb_u64(b, 1);
    gb_u32(b, 9), gb_u64(b, 2);
    gb_u32(b, 8), gb_u64(b, 1), gb_str(b, "a");
    gb_u32(b, 8), gb_u64(b, 2), gb_str(b, "bc"), gb_str(b, "");
}

static void set_all(mf_gguf_writer *w, const values *v) {
    mf_gguf_writer_set_str(w, "general.architecture", "llama");
    mf_gguf_writer_set_u8(w, "t.u8", v->u8);
    mf_gguf_writer_set_i8(w, "t.i8", v->i8);
    mf_gguf_writer_set_u16(w, "t.u16", v->u16);
    mf_gguf_writer_set_i16(w, "t.i16", v->i16);
    mf_gguf_writer_set_u32(w, "t.u32", v->u32);
    mf_gguf_writer_set_i32(w, "t.i32", v->i32);
    mf_gguf_writer_set_u64(w, "t.u64", v->u64);
    mf_gguf_writer_set_i64(w, "t.i64", v->i64);
    mf_gguf_writer_set_f32(w, "t.f32", v->f32);
    mf_gguf_writer_set_f64(w, "t.f64", v->f64);
    mf_gguf_writer_set_bool(w, "t.bool", true);
    mf_gguf_writer_set_bool(w, "t.bool0", false);
    mf_gguf_writer_set_str(w, "t.str", "hello, \"world\"\n");
    mf_gguf_writer_set_arr(w, "a.u8", MF_GGUF_UINT8, v->a_u8, 5);
    mf_gguf_writer_set_arr(w, "a.i8", MF_GGUF_INT8, v->a_i8, 6);
    mf_gguf_writer_set_arr(w, "a.u16", MF_GGUF_UINT16, v->a_u16, 7);
    mf_gguf_writer_set_arr(w, "a.i16", MF_GGUF_INT16, v->a_i16, 3);
    mf_gguf_writer_set_arr(w, "a.u32", MF_GGUF_UINT32, v->a_u32, 9);
    mf_gguf_writer_set_arr(w, "a.i32", MF_GGUF_INT32, v->a_i32, 4);
    mf_gguf_writer_set_arr(w, "a.u64", MF_GGUF_UINT64, v->a_u64, 3);
    mf_gguf_writer_set_arr(w, "a.i64", MF_GGUF_INT64, v->a_i64, 5);
    mf_gguf_writer_set_arr(w, "a.f32", MF_GGUF_FLOAT32, v->a_f32, 11);
    mf_gguf_writer_set_arr(w, "a.f64", MF_GGUF_FLOAT64, v->a_f64, 2);
    mf_gguf_writer_set_arr(w, "a.bool", MF_GGUF_BOOL, v->a_bool, 10);
    mf_gguf_writer_set_arr(w, "a.empty", MF_GGUF_INT32, NULL, 0);
    const char *strs[6];
    for (int i = 0; i < 6; i++)
        strs[i] = v->strs[i];
    mf_gguf_writer_set_arr_str(w, "a.str", strs, v->str_lens, 6);
    static const char *const toks[] = {"<s>", "</s>", "hello", " world"};
    mf_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 4);
    gb n1 = {0}, n2 = {0};
    nested_i32(&n1);
    nested_str(&n2);
    mf_gguf_writer_set_raw(w, "a.nested_i32", MF_GGUF_ARRAY, n1.p, n1.n);
    mf_gguf_writer_set_raw(w, "a.nested_str", MF_GGUF_ARRAY, n2.p, n2.n);
    gb_free(&n1);
    gb_free(&n2);
}

#define N_KV_ALL 30 /* keys set by set_all */

/* Checks every value set by set_all. */
static void check_all(const mf_gguf *g, const values *v) {
    mf_error err = {{0}};
    int64_t i64 = -1;
    uint64_t n = 0;
    uint32_t u32 = 0;
    int32_t i32 = 0;
    uint64_t u64 = 0;
    float f = 0;
    bool b = false;
    mf_str s = {0};

    int64_t kv = mf_gguf_find_key(g, "t.i64");
    CHECK(kv >= 0 && mf_gguf_kv_type(g, kv) == MF_GGUF_INT64);
    /* integer getters widen any integer type whose value fits */
    CHECK(mf_gguf_get_u32(g, "t.u8", &u32, &err) == 0 && u32 == v->u8);
    CHECK(mf_gguf_get_u32(g, "t.u16", &u32, &err) == 0 && u32 == v->u16);
    CHECK(mf_gguf_get_u32(g, "t.u32", &u32, &err) == 0 && u32 == v->u32);
    CHECK(mf_gguf_get_i32(g, "t.i8", &i32, &err) == 0 && i32 == v->i8);
    CHECK(mf_gguf_get_i32(g, "t.i16", &i32, &err) == 0 && i32 == v->i16);
    CHECK(mf_gguf_get_i32(g, "t.i32", &i32, &err) == 0 && i32 == v->i32);
    CHECK(mf_gguf_get_u64(g, "t.u64", &u64, &err) == 0 && u64 == v->u64);
    CHECK(mf_gguf_get_f32(g, "t.f32", &f, &err) == 0 && f == v->f32);
    CHECK(mf_gguf_get_f32(g, "t.f64", &f, &err) == 0 && f == (float)v->f64);
    CHECK(mf_gguf_get_bool(g, "t.bool", &b, &err) == 0 && b);
    CHECK(mf_gguf_get_bool(g, "t.bool0", &b, &err) == 0 && !b);
    CHECK(mf_gguf_get_str(g, "t.str", &s, &err) == 0 && strcmp(s.ptr, "hello, \"world\"\n") == 0 && s.len == 15);
    char text[128];
    mf_gguf_kv_format(g, mf_gguf_find_key(g, "t.i64"), text, sizeof text);
    char want[64];
    snprintf(want, sizeof want, "%lld", (long long)v->i64);
    CHECK_MSG(strcmp(text, want) == 0, "%s vs %s", text, want);
    mf_gguf_kv_format(g, mf_gguf_find_key(g, "t.str"), text, sizeof text);
    CHECK_MSG(strcmp(text, "\"hello, \\\"world\\\"\\n\"") == 0, "%s", text);
    mf_gguf_kv_format(g, mf_gguf_find_key(g, "tokenizer.ggml.tokens"), text, sizeof text);
    CHECK_MSG(strcmp(text, "[4 strings]") == 0, "%s", text);

#define CHECK_ARR(key, vt, arr, cnt, conv)                                                    \
    do {                                                                                      \
        CHECK(mf_gguf_get_arr(g, key, vt, &i64, &n, &err) == 0 && n == cnt);                  \
        CHECK(mf_gguf_arr_type(g, i64) == vt && mf_gguf_arr_n(g, i64) == cnt);                \
        for (uint64_t j = 0; j < n && j < cnt; j++)                                            \
            CHECK_MSG(conv(g, i64, j) == arr[j], "%s[%llu]", key, (unsigned long long)j);     \
    } while (0)
    CHECK_ARR("a.u8", MF_GGUF_UINT8, v->a_u8, 5, mf_gguf_arr_int);
    CHECK_ARR("a.i8", MF_GGUF_INT8, v->a_i8, 6, mf_gguf_arr_int);
    CHECK_ARR("a.u16", MF_GGUF_UINT16, v->a_u16, 7, mf_gguf_arr_int);
    CHECK_ARR("a.i16", MF_GGUF_INT16, v->a_i16, 3, mf_gguf_arr_int);
    CHECK_ARR("a.u32", MF_GGUF_UINT32, v->a_u32, 9, mf_gguf_arr_int);
    CHECK_ARR("a.i32", MF_GGUF_INT32, v->a_i32, 4, mf_gguf_arr_int);
    CHECK_ARR("a.u64", MF_GGUF_UINT64, v->a_u64, 3, (uint64_t)mf_gguf_arr_int);
    CHECK_ARR("a.i64", MF_GGUF_INT64, v->a_i64, 5, mf_gguf_arr_int);
    CHECK_ARR("a.f32", MF_GGUF_FLOAT32, v->a_f32, 11, mf_gguf_arr_float);
    CHECK_ARR("a.f64", MF_GGUF_FLOAT64, v->a_f64, 2, mf_gguf_arr_float);
    CHECK_ARR("a.bool", MF_GGUF_BOOL, v->a_bool, 10, mf_gguf_arr_int);
    CHECK(mf_gguf_get_arr(g, "a.empty", MF_GGUF_INT32, &i64, &n, &err) == 0 && n == 0);
    CHECK(mf_gguf_get_arr(g, "a.str", MF_GGUF_STRING, &i64, &n, &err) == 0 && n == 6);
    for (uint64_t j = 0; j < n && j < 6; j++) {
        mf_str e = mf_gguf_arr_str(g, i64, j);
        CHECK(e.len == v->str_lens[j] && memcmp(e.ptr, v->strs[j], e.len) == 0 && e.ptr[e.len] == 0);
    }
    /* [[1,2,3],[],[-7]] */
    CHECK(mf_gguf_get_arr(g, "a.nested_i32", MF_GGUF_ARRAY, &i64, &n, &err) == 0 && n == 3);
    if (n == 3) {
        int64_t s0 = mf_gguf_arr_sub(g, i64, 0), s1 = mf_gguf_arr_sub(g, i64, 1), s2 = mf_gguf_arr_sub(g, i64, 2);
        CHECK(mf_gguf_arr_type(g, s0) == MF_GGUF_INT32 && mf_gguf_arr_n(g, s0) == 3);
        CHECK(mf_gguf_arr_int(g, s0, 0) == 1 && mf_gguf_arr_int(g, s0, 2) == 3);
        CHECK(mf_gguf_arr_n(g, s1) == 0 && mf_gguf_arr_n(g, s2) == 1 && mf_gguf_arr_int(g, s2, 0) == -7);
    }
    /* [[["a"],["bc",""]]] */
    CHECK(mf_gguf_get_arr(g, "a.nested_str", MF_GGUF_ARRAY, &i64, &n, &err) == 0 && n == 1);
    if (n == 1) {
        int64_t l1 = mf_gguf_arr_sub(g, i64, 0);
        CHECK(mf_gguf_arr_type(g, l1) == MF_GGUF_ARRAY && mf_gguf_arr_n(g, l1) == 2);
        int64_t a = mf_gguf_arr_sub(g, l1, 0), bb = mf_gguf_arr_sub(g, l1, 1);
        CHECK(mf_gguf_arr_type(g, a) == MF_GGUF_STRING && strcmp(mf_gguf_arr_str(g, a, 0).ptr, "a") == 0);
        CHECK(mf_gguf_arr_n(g, bb) == 2 && strcmp(mf_gguf_arr_str(g, bb, 0).ptr, "bc") == 0 &&
              mf_gguf_arr_str(g, bb, 1).len == 0);
    }
}

/* ---- tensors ---------------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    uint32_t type, n_dims;
    int64_t ne[4];
} tspec;

static const tspec tensors[] = {
    {"token_embd.weight", MF_TYPE_Q8_0, 2, {64, 5, 1, 1}},
    {"blk.0.attn_norm.weight", MF_TYPE_F32, 1, {7, 1, 1, 1}},
    {"blk.0.ffn_up.weight", MF_TYPE_F16, 3, {3, 5, 2, 1}},
    {"blk.0.ffn_down.weight", MF_TYPE_Q4_K, 2, {256, 3, 1, 1}},
    {"blk.0.x", MF_TYPE_I32, 4, {2, 3, 1, 2}},
};
#define N_T (int)(sizeof tensors / sizeof tensors[0])

static size_t t_bytes(const tspec *t) {
    return mf_type_row_size(t->type, t->ne[0]) * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]);
}

/* Writes tensors[first..last) with random data (kept in data[i]) in uneven chunks. */
static int write_tensors(mf_gguf_writer *w, int first, int last, uint8_t **data, mf_error *err) {
    for (int i = first; i < last; i++) {
        size_t nb = t_bytes(&tensors[i]), off = 0;
        free(data[i]);
        data[i] = malloc(nb);
        rnd_bytes(data[i], nb);
        while (off < nb) {
            size_t k = 1 + rnd() % 97;
            if (k > nb - off)
                k = nb - off;
            if (mf_gguf_writer_write(w, data[i] + off, k, err))
                return -1;
            off += k;
        }
    }
    return 0;
}

static void check_tensors(const mf_gguf *g, int first, int last, uint8_t **data, uint32_t align) {
    for (int i = first; i < last; i++) {
        const mf_gguf_tensor *t = mf_gguf_find_tensor(g, tensors[i].name);
        CHECK_MSG(t != NULL, "tensor %s missing", tensors[i].name);
        if (!t)
            continue;
        CHECK(t->type == tensors[i].type && t->n_dims == tensors[i].n_dims);
        CHECK(memcmp(t->ne, tensors[i].ne, sizeof t->ne) == 0);
        CHECK(t->nbytes == t_bytes(&tensors[i]));
        CHECK(t->offset % align == 0);
        CHECK_MSG(memcmp(t->data, data[i], t->nbytes) == 0, "tensor %s data differ", tensors[i].name);
    }
}

static void free_data(uint8_t **data) {
    for (int i = 0; i < N_T; i++) {
        free(data[i]);
        data[i] = NULL;
    }
}

static int add_tensors(mf_gguf_writer *w, int first, int last, mf_error *err) {
    for (int i = first; i < last; i++)
        if (mf_gguf_writer_add_tensor(w, tensors[i].name, tensors[i].type, tensors[i].n_dims, tensors[i].ne,
                                      err) != i - first)
            return -1;
    return 0;
}

static void roundtrip(uint32_t align) {
    values v;
    make_values(&v);
    uint8_t *data[N_T] = {0};
    const char *path = tmp_path("all.gguf");
    mf_error err = {{0}};
    mf_gguf_writer *w = mf_gguf_writer_new();
    if (align)
        mf_gguf_writer_set_alignment(w, align);
    set_all(w, &v);
    CHECK_MSG(add_tensors(w, 0, N_T, &err) == 0, "%s", err.msg);
    CHECK_MSG(mf_gguf_writer_begin(w, path, &err) == 0, "%s", err.msg);
    CHECK(file_exists(tmp_path("all.gguf.tmp")));
    CHECK_MSG(write_tensors(w, 0, N_T, data, &err) == 0, "%s", err.msg);
    CHECK_MSG(mf_gguf_writer_finish(w, &err) == 0, "%s", err.msg);
    mf_gguf_writer_free(w);
    CHECK(!file_exists(tmp_path("all.gguf.tmp")));

    mf_gguf *g = NULL;
    CHECK_MSG(mf_gguf_open(path, &g, &err) == 0, "%s", err.msg);
    if (g) {
        uint32_t a = align ? align : 32;
        CHECK_EQ_INT(mf_gguf_version(g), 3);
        CHECK_EQ_INT(mf_gguf_alignment(g), a);
        CHECK(mf_gguf_data_offset(g) % a == 0);
        CHECK_EQ_INT(mf_gguf_n_kv(g), N_KV_ALL + (align ? 1 : 0));
        CHECK_EQ_INT(mf_gguf_n_tensors(g), N_T);
        check_all(g, &v);
        check_tensors(g, 0, N_T, data, a);
        const void *base = NULL;
        uint64_t size = 0;
        CHECK(mf_gguf_part_mapping(g, 0, &base, &size) == 0 && size == mf_gguf_file_size(g));
        CHECK(((uintptr_t)base & 4095) == 0 && mf_gguf_part_mapping(g, 1, &base, &size) == -1);

        /* copy every kv and tensor into a second file: identical reading */
        mf_gguf_writer *w2 = mf_gguf_writer_new();
        if (align)
            mf_gguf_writer_set_alignment(w2, align);
        for (int64_t i = mf_gguf_n_kv(g) - 1; i >= 0; i--) /* reversed: order must not matter */
            mf_gguf_writer_copy_kv(w2, g, i);
        CHECK(add_tensors(w2, 0, N_T, &err) == 0);
        CHECK(mf_gguf_writer_begin(w2, tmp_path("copy.gguf"), &err) == 0);
        for (int i = 0; i < N_T; i++)
            CHECK(mf_gguf_writer_write(w2, data[i], t_bytes(&tensors[i]), &err) == 0);
        CHECK_MSG(mf_gguf_writer_finish(w2, &err) == 0, "%s", err.msg);
        mf_gguf_writer_free(w2);
        mf_gguf *g2 = NULL;
        CHECK_MSG(mf_gguf_open(tmp_path("copy.gguf"), &g2, &err) == 0, "%s", err.msg);
        if (g2) {
            check_all(g2, &v);
            check_tensors(g2, 0, N_T, data, a);
            CHECK_EQ_INT(mf_gguf_n_kv(g2), mf_gguf_n_kv(g));
            for (int64_t i = 0; i < mf_gguf_n_kv(g); i++) {
                char t1[256], t2[256];
                mf_str k = mf_gguf_kv_key(g, i);
                int64_t j = mf_gguf_find_key(g2, k.ptr);
                CHECK_MSG(j >= 0, "%s lost in copy", k.ptr);
                if (j < 0)
                    continue;
                mf_gguf_kv_format(g, i, t1, sizeof t1);
                mf_gguf_kv_format(g2, j, t2, sizeof t2);
                CHECK_MSG(strcmp(t1, t2) == 0 && mf_gguf_kv_type(g, i) == mf_gguf_kv_type(g2, j), "%s: %s vs %s",
                          k.ptr, t1, t2);
            }
            mf_gguf_close(g2);
        }
        mf_gguf_close(g);
        /* read into memory (and locked) instead of mapped: the same file.
         * The bytes are no view of a mapping of the file, so they must be a
         * copy that matches it exactly. */
        mf_gguf_open_options ro = {.read = true, .lock = true};
        mf_gguf *g3 = NULL;
        CHECK_MSG(mf_gguf_open_opts(path, &ro, &g3, &err) == 0, "%s", err.msg);
        if (g3) {
            CHECK_EQ_INT(mf_gguf_n_kv(g3), N_KV_ALL + (align ? 1 : 0));
            check_all(g3, &v);
            check_tensors(g3, 0, N_T, data, align ? align : 32);
            CHECK(mf_gguf_part_mapping(g3, 0, &base, &size) == 0 && size == mf_gguf_file_size(g3));
            mf_gguf_close(g3);
        }
    }
    free_data(data);
    unlink(path);
    unlink(tmp_path("copy.gguf"));
}

MF_TEST(test_roundtrip_default_alignment) { roundtrip(0); }
MF_TEST(test_roundtrip_alignment_64) { roundtrip(64); }
MF_TEST(test_roundtrip_alignment_8) { roundtrip(8); } /* the minimum */

/* ---- getter contracts --------------------------------------------------------------------------- */

MF_TEST(test_getter_contracts) {
    mf_gguf_writer *w = mf_gguf_writer_new();
    mf_gguf_writer_set_i32(w, "neg", -5);
    mf_gguf_writer_set_u32(w, "big", 3000000000u);
    mf_gguf_writer_set_i64(w, "i64neg", -1);
    mf_gguf_writer_set_u64(w, "huge", 1ull << 40);
    mf_gguf_writer_set_str(w, "s", "x");
    mf_gguf_writer_set_u32(w, "s", 9); /* replaces: keys stay unique */
    mf_gguf_writer_set_str(w, "name", "n");
    mf_gguf_writer_set_f32(w, "f", 1.5f);
    uint32_t a[2] = {1, 2};
    mf_gguf_writer_set_arr(w, "arr", MF_GGUF_UINT32, a, 2);
    mf_error err = {{0}};
    CHECK(mf_gguf_writer_begin(w, tmp_path("get.gguf"), &err) == 0);
    CHECK_MSG(mf_gguf_writer_finish(w, &err) == 0, "%s", err.msg);
    mf_gguf_writer_free(w);

    mf_gguf *g = NULL;
    CHECK_MSG(mf_gguf_open(tmp_path("get.gguf"), &g, &err) == 0, "%s", err.msg);
    if (!g)
        return;
    CHECK_EQ_INT(mf_gguf_n_kv(g), 8);
    CHECK_EQ_INT(mf_gguf_n_tensors(g), 0);
    uint32_t u32 = 77;
    int32_t i32 = 0;
    uint64_t u64 = 0;
    float f = 0;
    bool b;
    mf_str s;
    int64_t kv;
    uint64_t n;
    strcpy(err.msg, "untouched");
    CHECK(mf_gguf_get_u32(g, "absent", &u32, &err) == 1 && u32 == 77 && strcmp(err.msg, "untouched") == 0);
    CHECK(mf_gguf_get_u32(g, "s", &u32, &err) == 0 && u32 == 9);
    CHECK(mf_gguf_get_u32(g, "neg", &u32, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "key 'neg': value -5 (int32) does not fit uint32");
    CHECK(mf_gguf_get_i32(g, "big", &i32, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "key 'big': value 3000000000 (uint32) does not fit int32");
    CHECK(mf_gguf_get_u64(g, "big", &u64, &err) == 0 && u64 == 3000000000u);
    CHECK(mf_gguf_get_u64(g, "i64neg", &u64, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "value -1 (int64) does not fit uint64");
    CHECK(mf_gguf_get_u32(g, "huge", &u32, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "1099511627776 (uint64) does not fit uint32");
    CHECK(mf_gguf_get_i32(g, "neg", &i32, &err) == 0 && i32 == -5);
    CHECK(mf_gguf_get_u32(g, "name", &u32, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "gguf: key 'name': type string, expected uint32");
    CHECK(mf_gguf_get_str(g, "f", &s, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "key 'f': type float32, expected string");
    CHECK(mf_gguf_get_f32(g, "neg", &f, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "type int32, expected float32");
    CHECK(mf_gguf_get_bool(g, "neg", &b, &err) == -1);
    CHECK(mf_gguf_get_u32(g, "arr", &u32, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "key 'arr': array of uint32, expected uint32");
    CHECK(mf_gguf_get_arr(g, "arr", MF_GGUF_STRING, &kv, &n, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "key 'arr': array of uint32, expected array of string");
    CHECK(mf_gguf_get_arr(g, "name", MF_GGUF_VTYPE_COUNT, &kv, &n, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "key 'name': type string, expected array");
    CHECK(mf_gguf_get_arr(g, "arr", MF_GGUF_VTYPE_COUNT, &kv, &n, &err) == 0 && n == 2);
    CHECK(mf_gguf_get_arr(g, "absent", MF_GGUF_VTYPE_COUNT, &kv, &n, &err) == 1);
    CHECK(mf_gguf_find_key(g, "absent") == -1 && mf_gguf_find_tensor(g, "absent") == NULL);
    char text[8];
    mf_gguf_kv_format(g, mf_gguf_find_key(g, "big"), text, sizeof text); /* truncated, terminated */
    CHECK(strcmp(text, "3000000") == 0);
    mf_gguf_close(g);
    unlink(tmp_path("get.gguf"));
}

/* ---- writer misuse -------------------------------------------------------------------------------- */

MF_TEST(test_writer_errors) {
    mf_error err = {{0}};
    mf_gguf_writer *w = mf_gguf_writer_new();
    int64_t ne[2] = {33, 2};
    CHECK(mf_gguf_writer_add_tensor(w, "q", MF_TYPE_Q8_0, 2, ne, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "tensor 'q': row length 33 is not a multiple of the block size 32");
    CHECK(mf_gguf_writer_add_tensor(w, "q", 4, 2, ne, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "unknown type 4");
    CHECK(mf_gguf_writer_add_tensor(w, "q", MF_TYPE_F32, 0, ne, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "n_dims 0");
    ne[1] = 0;
    CHECK(mf_gguf_writer_add_tensor(w, "q", MF_TYPE_F32, 2, ne, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "dim 1 is 0");
    ne[1] = 2;
    CHECK(mf_gguf_writer_add_tensor(w, "a", MF_TYPE_F32, 2, ne, &err) == 0);
    CHECK(mf_gguf_writer_add_tensor(w, "b", MF_TYPE_F32, 1, ne, &err) == 1);
    CHECK(mf_gguf_writer_add_tensor(w, "a", MF_TYPE_F32, 1, ne, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "duplicate tensor name 'a'");
    CHECK(mf_gguf_writer_write(w, "x", 1, &err) == -1); /* before begin */
    const char *path = tmp_path("err.gguf");
    CHECK(mf_gguf_writer_begin(w, path, &err) == 0);
    static float buf[200];
    CHECK(mf_gguf_writer_write(w, buf, 33 * 2 * 4 + 1, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "tensor 'a': 265 bytes written, only 264 of 264 left");
    CHECK(mf_gguf_writer_write(w, buf, 100, &err) == 0);
    CHECK(mf_gguf_writer_finish(w, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "tensor 'a': 100 of 264 bytes written (0 of 2 tensors done)");
    CHECK(file_exists(tmp_path("err.gguf.tmp")));
    mf_gguf_writer_free(w); /* unfinished: the temp file goes, no PATH appears */
    CHECK(!file_exists(tmp_path("err.gguf.tmp")) && !file_exists(path));

    /* setter errors surface at begin */
    w = mf_gguf_writer_new();
    mf_gguf_writer_set_alignment(w, 48);
    CHECK(mf_gguf_writer_begin(w, path, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "alignment 48 is not a power of two");
    mf_gguf_writer_free(w);
    w = mf_gguf_writer_new();
    gb bad = {0};
    gb_u32(&bad, 4);
    gb_u64(&bad, 100); /* 100 uint32 promised, none given */
    mf_gguf_writer_set_raw(w, "x.bad", MF_GGUF_ARRAY, bad.p, bad.n);
    gb_free(&bad);
    CHECK(mf_gguf_writer_begin(w, path, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "key 'x.bad'");
    CHECK_STR_CONTAINS(err.msg, "array length 100 of uint32 needs at least 400 bytes");
    mf_gguf_writer_free(w);
    w = mf_gguf_writer_new();
    uint8_t bools[2] = {1, 5};
    mf_gguf_writer_set_arr(w, "x.b", MF_GGUF_BOOL, bools, 2);
    CHECK(mf_gguf_writer_begin(w, path, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "bool element 1 is 5");
    mf_gguf_writer_free(w);
    CHECK(!file_exists(path));
}

/* ---- split models ------------------------------------------------------------------------------------ */

/* Writes the tensors[first..last) as part `no` (0-based) of `count`. */
static void write_part(const char *prefix, int no, int count, int first, int last, uint8_t **data,
                       int32_t tensors_count, int split_count_key) {
    char name[128];
    snprintf(name, sizeof name, "%s-%05d-of-%05d.gguf", prefix, no + 1, count);
    mf_error err = {{0}};
    mf_gguf_writer *w = mf_gguf_writer_new();
    if (no == 0) {
        mf_gguf_writer_set_str(w, "general.architecture", "llama");
        mf_gguf_writer_set_u32(w, "llama.block_count", 1);
        mf_gguf_writer_set_i32(w, "split.tensors.count", tensors_count);
    }
    mf_gguf_writer_set_u16(w, "split.no", (uint16_t)no);
    mf_gguf_writer_set_u16(w, "split.count", (uint16_t)split_count_key);
    CHECK(add_tensors(w, first, last, &err) == 0);
    CHECK_MSG(mf_gguf_writer_begin(w, tmp_path(name), &err) == 0, "%s", err.msg);
    CHECK_MSG(write_tensors(w, first, last, data, &err) == 0, "%s", err.msg);
    CHECK_MSG(mf_gguf_writer_finish(w, &err) == 0, "%s", err.msg);
    mf_gguf_writer_free(w);
}

MF_TEST(test_split_model) {
    uint8_t *data[N_T] = {0};
    write_part("split", 0, 3, 0, 2, data, N_T, 3);
    write_part("split", 1, 3, 2, 3, data, N_T, 3);
    write_part("split", 2, 3, 3, N_T, data, N_T, 3);
    for (int k = 1; k <= 3; k++) { /* any part name opens the whole model */
        char name[64];
        snprintf(name, sizeof name, "split-%05d-of-00003.gguf", k);
        mf_gguf *g = NULL;
        mf_error err = {{0}};
        CHECK_MSG(mf_gguf_open(tmp_path(name), &g, &err) == 0, "%s", err.msg);
        if (!g)
            continue;
        CHECK_EQ_INT(mf_gguf_n_parts(g), 3);
        CHECK_EQ_INT(mf_gguf_n_tensors(g), N_T);
        uint32_t u32 = 0;
        CHECK(mf_gguf_get_u32(g, "llama.block_count", &u32, &err) == 0 && u32 == 1);
        check_tensors(g, 0, N_T, data, 32);
        static const uint32_t want_part[N_T] = {0, 0, 1, 2, 2};
        for (int i = 0; i < N_T; i++)
            CHECK(mf_gguf_find_tensor(g, tensors[i].name)->part == want_part[i]);
        CHECK(mf_gguf_find_tensor(g, tensors[3].name)->offset == 0); /* offsets are per part */
        uint64_t total = 0;
        for (int p = 0; p < 3; p++) {
            char pn[64];
            struct stat st;
            snprintf(pn, sizeof pn, "split-%05d-of-00003.gguf", p + 1);
            stat(tmp_path(pn), &st);
            total += (uint64_t)st.st_size;
        }
        CHECK_EQ_INT(mf_gguf_file_size(g), total);
        mf_gguf_close(g);
    }
    free_data(data);

    mf_gguf *g = NULL;
    mf_error err = {{0}};
    /* the metadata disagree with the names */
    write_part("bad", 0, 2, 0, 2, data, N_T, 3);
    write_part("bad", 1, 2, 2, N_T, data, N_T, 2);
    CHECK(mf_gguf_open(tmp_path("bad-00002-of-00002.gguf"), &g, &err) == -1 && g == NULL);
    CHECK_STR_CONTAINS(err.msg, "key 'split.count': 3, but the file name says 2 parts");
    free_data(data);
    write_part("cnt", 0, 2, 0, 2, data, 4, 2);
    write_part("cnt", 1, 2, 2, N_T, data, 4, 2);
    CHECK(mf_gguf_open(tmp_path("cnt-00001-of-00002.gguf"), &g, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "key 'split.tensors.count': 4, but the 2 parts hold 5 tensors");
    free_data(data);
    /* a missing part */
    CHECK(mf_gguf_open(tmp_path("split-00001-of-00004.gguf"), &g, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "cannot open");
    /* a tensor in two parts */
    write_part("dup", 0, 2, 0, 2, data, 4, 2);
    write_part("dup", 1, 2, 1, 3, data, 4, 2);
    CHECK(mf_gguf_open(tmp_path("dup-00001-of-00002.gguf"), &g, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "duplicate tensor name 'blk.0.attn_norm.weight'");
    free_data(data);
    /* a part renamed as a single file */
    rename(tmp_path("split-00001-of-00003.gguf"), tmp_path("single.gguf"));
    CHECK(mf_gguf_open(tmp_path("single.gguf"), &g, &err) == -1);
    CHECK_STR_CONTAINS(err.msg, "key 'split.count' says 3 parts");
}

/* ---- the real model, when present ------------------------------------------------------------------- */

MF_TEST(test_real_model) {
    const char *path = getenv("MINFER_MODEL");
    if (!path || !file_exists(path)) {
        printf("  (MINFER_MODEL not found: skipped)\n");
        return;
    }
    mf_gguf *g = NULL;
    mf_error err = {{0}};
    CHECK_MSG(mf_gguf_open(path, &g, &err) == 0, "%s", err.msg);
    if (!g)
        return;
    CHECK_EQ_INT(mf_gguf_n_kv(g), 33);
    CHECK_EQ_INT(mf_gguf_n_tensors(g), 272);
    int64_t kv;
    uint64_t n;
    CHECK(mf_gguf_get_arr(g, "tokenizer.ggml.tokens", MF_GGUF_STRING, &kv, &n, &err) == 0 && n == 49152);
    const mf_gguf_tensor *t = mf_gguf_find_tensor(g, "token_embd.weight");
    CHECK(t && t->ne[0] == 576 && t->ne[1] == 49152);
    mf_gguf_close(g);
}

static void setup(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/mf_gguf_rw_XXXXXX");
    if (!mkdtemp(tmpdir))
        abort();
}

static void teardown(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
}

MF_TEST(test_teardown) { teardown(); }

MF_TEST_MAIN(MF_T(test_roundtrip_default_alignment), MF_T(test_roundtrip_alignment_64),
             MF_T(test_roundtrip_alignment_8), MF_T(test_getter_contracts), MF_T(test_writer_errors),
             MF_T(test_split_model), MF_T(test_real_model), MF_T(test_teardown))
