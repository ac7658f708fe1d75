/* test_gguf_corrupt.c - the model file is hostile.
 *
 * A table of handcrafted corrupt files, one per way a GGUF can lie, each
 * built byte by byte in memory, parsed with mf_gguf_parse from an exactly
 * sized heap copy (so sanitizers see overreads) and required to fail with a
 * message containing the expected fragment. Plus: the valid file they are
 * derived from parses with every field as written; every strict prefix of it
 * fails; random byte corruption never crashes. */
#include "gguf/gguf.h"
#include "mf_test.h"
#include "test_gguf_build.h"

enum { T_F32 = 0, T_F16 = 1, T_Q8_0 = 8, V_U8 = 0, V_I32 = 5, V_BOOL = 7, V_STR = 8, V_ARR = 9, V_U64 = 10 };

/* ---- the valid base file ----------------------------------------------------------------- */

static void kvs_base(gb *b) {
    gb_kv_str(b, "general.architecture", "llama");
    gb_kv_u32(b, "general.alignment", 32);
    gb_kv(b, "tokenizer.ggml.tokens", V_ARR);
    gb_u32(b, V_STR);
    gb_u64(b, 3);
    gb_str(b, "a");
    gb_str(b, "bb");
    gb_str(b, "ccc");
}

static const uint64_t ne_a[2] = {8, 2}; /* f32: 64 bytes */
static const uint64_t ne_b[1] = {32};   /* q8_0: 34 bytes */

static void tinfos_base(gb *b) {
    gb_tinfo(b, "a", 2, ne_a, T_F32, 0);
    gb_tinfo(b, "b", 1, ne_b, T_Q8_0, 64);
}

/* header + kvs + tensor infos + padding + data; the file ends at b's last byte */
static void valid(gb *b) {
    gb_header(b, 3, 2, 3);
    kvs_base(b);
    tinfos_base(b);
    gb_pad(b, 32);
    gb_random(b, 98, 1);
}

/* a file with one kv (the caller writes it after this) and no tensors */
static void one_kv(gb *b) { gb_header(b, 3, 0, 1); }

/* a file whose only tensor info follows (written by the caller) */
static void one_tensor(gb *b) { gb_header(b, 3, 1, 0); }

/* data section for a single tensor at offset 0 of nbytes */
static void data_for(gb *b, size_t nbytes) {
    gb_pad(b, 32);
    gb_random(b, nbytes, 2);
}

/* ---- corrupt cases ---------------------------------------------------------------------------- */

static void c_empty(gb *b) { (void)b; }
static void c_magic_short(gb *b) { gb_put(b, "GGU", 3); }
static void c_bad_magic(gb *b) { gb_u32(b, 0x12345678); gb_u32(b, 3); gb_u64(b, 0); gb_u64(b, 0); }
static void c_version_short(gb *b) { gb_u32(b, 0x46554747u); gb_u8(b, 3); }
static void c_version1(gb *b) { gb_header(b, 1, 0, 0); }
static void c_version7(gb *b) { gb_header(b, 7, 0, 0); }
static void c_big_endian(gb *b) { gb_header(b, 0x03000000u, 0, 0); }
static void c_tcount_short(gb *b) { gb_u32(b, 0x46554747u); gb_u32(b, 3); gb_u32(b, 0); }
static void c_kvcount_short(gb *b) { gb_u32(b, 0x46554747u); gb_u32(b, 3); gb_u64(b, 0); gb_u32(b, 1); }
static void c_kv_huge(gb *b) { gb_header(b, 3, 0, 1ull << 60); }
static void c_kv_many(gb *b) { gb_header(b, 3, 0, 1000); kvs_base(b); }
static void c_t_huge(gb *b) { gb_header(b, 3, 1ull << 40, 0); }
static void c_t_many(gb *b) { gb_header(b, 3, 100, 0); tinfos_base(b); }
static void c_keylen_short(gb *b) {
    gb_header(b, 3, 0, 2);
    gb_kv_u32(b, "general.n", 1);
    gb_u32(b, 5); /* half of the second key's length */
}
static void c_key_short(gb *b) { one_kv(b); gb_u64(b, 10); gb_put(b, "general", 7); }
static void c_key_huge(gb *b) { one_kv(b); gb_u64(b, 1ull << 40); gb_put(b, "general.name", 12); }
static void c_key_empty(gb *b) { one_kv(b); gb_kv_u32(b, "", 1); }
static void c_key_nul(gb *b) { one_kv(b); gb_strn(b, "a\0b", 3); gb_u32(b, 4); gb_u32(b, 1); }
static void c_vtype_short(gb *b) { one_kv(b); gb_str(b, "general.name"); gb_u8(b, 8); }
static void c_vtype_unknown(gb *b) { one_kv(b); gb_kv(b, "general.x", 13); gb_u64(b, 0); }
static void c_value_short(gb *b) { one_kv(b); gb_kv(b, "general.x", 4); gb_u8(b, 1); gb_u8(b, 2); }
static void c_bool_two(gb *b) { one_kv(b); gb_kv(b, "general.flag", V_BOOL); gb_u8(b, 2); }
static void c_str_huge(gb *b) { one_kv(b); gb_kv(b, "general.name", V_STR); gb_u64(b, 1ull << 62); gb_u64(b, 0); }
static void c_str_past_end(gb *b) { one_kv(b); gb_kv(b, "general.name", V_STR); gb_u64(b, 100); gb_put(b, "llama", 5); }
static void c_arr_type_unknown(gb *b) { one_kv(b); gb_kv(b, "general.x", V_ARR); gb_u32(b, 99); gb_u64(b, 0); }
static void c_arr_huge(gb *b) { one_kv(b); gb_kv(b, "general.x", V_ARR); gb_u32(b, 4); gb_u64(b, 1ull << 40); }
static void c_arr_past_end(gb *b) { one_kv(b); gb_kv(b, "general.x", V_ARR); gb_u32(b, 4); gb_u64(b, 1000); gb_u64(b, 0); }
static void c_arr_len_short(gb *b) { one_kv(b); gb_kv(b, "general.x", V_ARR); gb_u32(b, 4); gb_u32(b, 0); }
static void c_arr_str_short(gb *b) {
    one_kv(b);
    gb_kv(b, "general.x", V_ARR);
    gb_u32(b, V_STR);
    gb_u64(b, 2);
    gb_str(b, "one-two-three");
    gb_u32(b, 3); /* half a length */
}
static void c_arr_bool_two(gb *b) {
    one_kv(b);
    gb_kv(b, "general.x", V_ARR);
    gb_u32(b, V_BOOL);
    gb_u64(b, 3);
    gb_u8(b, 1);
    gb_u8(b, 2);
    gb_u8(b, 0);
}
static void c_nest_deep(gb *b) {
    one_kv(b);
    gb_kv(b, "general.x", V_ARR);
    for (int i = 0; i < 9; i++) { /* 9 nested levels of one array each */
        gb_u32(b, V_ARR);
        gb_u64(b, 1);
    }
    gb_u32(b, V_U8);
    gb_u64(b, 0);
}
static void c_nest_huge(gb *b) {
    one_kv(b);
    gb_kv(b, "general.x", V_ARR);
    gb_u32(b, V_ARR);
    gb_u64(b, 1);
    gb_u32(b, V_ARR);
    gb_u64(b, 1ull << 26);
    gb_u32(b, V_U8);
    gb_u64(b, 0);
}
static void c_dup_key(gb *b) {
    gb_header(b, 3, 0, 3);
    gb_kv_str(b, "general.name", "x");
    gb_kv_u32(b, "general.n", 1);
    gb_kv_str(b, "general.name", "y");
}
static void c_align(gb *b, uint32_t type, uint64_t v) {
    one_kv(b);
    gb_kv(b, "general.alignment", type);
    if (type == V_U64)
        gb_u64(b, v);
    else
        gb_u32(b, (uint32_t)v);
}
static void c_align0(gb *b) { c_align(b, 4, 0); }
static void c_align3(gb *b) { c_align(b, 4, 3); }
static void c_align24(gb *b) { c_align(b, 4, 24); }
static void c_align_big(gb *b) { c_align(b, 4, 1u << 20); }
static void c_align_type(gb *b) { c_align(b, V_U64, 32); }
static void c_align_i32(gb *b) { c_align(b, V_I32, 32); }
static void c_tokens_int(gb *b) {
    one_kv(b);
    gb_kv(b, "tokenizer.ggml.tokens", V_ARR);
    gb_u32(b, V_I32);
    gb_u64(b, 2);
    gb_u32(b, 7);
    gb_u32(b, 9);
}
static void c_tokens_scalar(gb *b) { one_kv(b); gb_kv_str(b, "tokenizer.ggml.tokens", "a b c"); }
/* A long name, so that a truncated record still passes the per-tensor minimum
 * (32 bytes) of the count check and the cut lands inside the record. */
#define TN "tensor.with.a.rather.long.name.for.tests"
static void tname(gb *b) { gb_str(b, TN); }
static void c_tname_len_short(gb *b) {
    gb_header(b, 3, 2, 0);
    gb_tinfo(b, TN, 1, ne_b, T_F32, 0);
    gb_u32(b, 7); /* half of the second name's length */
}
static void c_tname_short(gb *b) { one_tensor(b); gb_u64(b, 40); gb_put(b, TN, 30); }
static void c_tname_huge(gb *b) {
    char name[301];
    memset(name, 'x', 300);
    name[300] = 0;
    one_tensor(b);
    gb_tinfo(b, name, 1, ne_b, T_F32, 0);
}
static void c_tname_empty(gb *b) { one_tensor(b); gb_tinfo(b, "", 1, ne_b, T_F32, 0); data_for(b, 128); }
static void c_ndims_short(gb *b) { one_tensor(b); tname(b); gb_u8(b, 1); gb_u8(b, 0); }
static void c_ndims0(gb *b) { one_tensor(b); gb_tinfo(b, "a", 0, ne_b, T_F32, 0); data_for(b, 128); }
static void c_ndims5(gb *b) {
    static const uint64_t ne[5] = {1, 1, 1, 1, 1};
    one_tensor(b);
    gb_tinfo(b, "a", 5, ne, T_F32, 0);
    data_for(b, 128);
}
static void c_dim_short(gb *b) {
    one_tensor(b);
    tname(b);
    gb_u32(b, 2);
    gb_u64(b, 8);
    gb_u32(b, 2); /* half of dim 1 */
}
static void c_type_short(gb *b) { one_tensor(b); tname(b); gb_u32(b, 1); gb_u64(b, 8); gb_u8(b, 0); }
static void c_offset_short(gb *b) { one_tensor(b); tname(b); gb_u32(b, 1); gb_u64(b, 8); gb_u32(b, 0); gb_u32(b, 0); }
static void c_dim0(gb *b) {
    static const uint64_t ne[2] = {8, 0};
    one_tensor(b);
    gb_tinfo(b, "a", 2, ne, T_F32, 0);
    data_for(b, 128);
}
static void c_dim_neg(gb *b) {
    static const uint64_t ne[2] = {8, 1ull << 63};
    one_tensor(b);
    gb_tinfo(b, "a", 2, ne, T_F32, 0);
    data_for(b, 128);
}
static void c_nel_overflow(gb *b) {
    static const uint64_t ne[3] = {1ull << 32, 1ull << 16, 1ull << 16};
    one_tensor(b);
    gb_tinfo(b, "a", 3, ne, T_F32, 0);
    data_for(b, 128);
}
static void c_bytes_overflow(gb *b) {
    static const uint64_t ne[1] = {1ull << 62};
    one_tensor(b);
    gb_tinfo(b, "a", 1, ne, T_F32, 0);
    data_for(b, 128);
}
static void c_type_unknown(gb *b) { one_tensor(b); gb_tinfo(b, "a", 1, ne_b, 4, 0); data_for(b, 128); }
static void c_type_huge(gb *b) { one_tensor(b); gb_tinfo(b, "a", 1, ne_b, 0xffffffffu, 0); data_for(b, 128); }
static void c_row_block(gb *b) {
    static const uint64_t ne[2] = {33, 4};
    one_tensor(b);
    gb_tinfo(b, "a", 2, ne, T_Q8_0, 0);
    data_for(b, 512);
}
static void c_misaligned(gb *b) { one_tensor(b); gb_tinfo(b, "a", 1, ne_b, T_F32, 4); data_for(b, 256); }
static void c_offset_past(gb *b) { one_tensor(b); gb_tinfo(b, "a", 1, ne_b, T_F32, 4096); data_for(b, 256); }
static void c_data_short(gb *b) { one_tensor(b); gb_tinfo(b, "a", 1, ne_b, T_F32, 0); data_for(b, 127); }
static void c_data_start(gb *b) { one_tensor(b); gb_tinfo(b, "a", 1, ne_b, T_F32, 0); /* no padding, no data */ }
static void c_offset_wrap(gb *b) { one_tensor(b); gb_tinfo(b, "a", 1, ne_b, T_F32, (uint64_t)-32); data_for(b, 128); }
static void c_dup_tensor(gb *b) {
    gb_header(b, 3, 2, 0);
    gb_tinfo(b, "a", 1, ne_b, T_F32, 0);
    gb_tinfo(b, "a", 1, ne_b, T_F32, 128);
    data_for(b, 256);
}
static void c_valid_cut(gb *b) { valid(b); b->n -= 1; }
static void c_align64_misaligned(gb *b) {
    /* offset 32 is fine for the default alignment but not for a declared 64 */
    gb_header(b, 3, 2, 1);
    gb_kv_u32(b, "general.alignment", 64);
    gb_tinfo(b, "a", 1, ne_b, T_F32, 0);
    gb_tinfo(b, "b", 1, ne_b, T_F32, 160);
    gb_pad(b, 64);
    gb_random(b, 512, 3);
}

static void c_align1(gb *b) { c_align(b, 4, 1); }
static void c_align4(gb *b) { c_align(b, 4, 4); }
/* Tensor data layout: in table order, each at the previous end (aligned). */
static void c_overlap(gb *b) {
    gb_header(b, 3, 2, 0);
    gb_tinfo(b, "a", 1, ne_b, T_F32, 0);
    gb_tinfo(b, "b", 1, ne_b, T_F32, 0); /* the same bytes as a */
    data_for(b, 256);
}
static void c_grows_into_next(gb *b) {
    static const uint64_t ne[1] = {64}; /* 256 bytes from offset 0: over b at 128 */
    gb_header(b, 3, 2, 0);
    gb_tinfo(b, "a", 1, ne, T_F32, 0);
    gb_tinfo(b, "b", 1, ne_b, T_F32, 128);
    data_for(b, 384);
}
static void c_out_of_order(gb *b) {
    gb_header(b, 3, 2, 0);
    gb_tinfo(b, "a", 1, ne_b, T_F32, 128);
    gb_tinfo(b, "b", 1, ne_b, T_F32, 0);
    data_for(b, 256);
}
static void c_gap(gb *b) {
    gb_header(b, 3, 2, 0);
    gb_tinfo(b, "a", 1, ne_b, T_F32, 0);
    gb_tinfo(b, "b", 1, ne_b, T_F32, 256); /* 128 unexplained bytes between */
    data_for(b, 384);
}
static void c_first_not_zero(gb *b) { one_tensor(b); gb_tinfo(b, "a", 1, ne_b, T_F32, 32); data_for(b, 160); }
static void c_trailing(gb *b) { one_tensor(b); gb_tinfo(b, "a", 1, ne_b, T_F32, 0); data_for(b, 128 + 64); }
/* the valid file with a tensor count one too low: b's record becomes data */
static void c_count_low(gb *b) {
    valid(b);
    uint64_t one = 1;
    memcpy(b->p + 8, &one, 8);
}
/* File strings in messages are escaped: ESC, newline, invalid UTF-8. */
static void c_dup_key_esc(gb *b) {
    gb_header(b, 3, 0, 2);
    gb_kv_u32(b, "k\x1b[31m\n\xff", 1);
    gb_kv_u32(b, "k\x1b[31m\n\xff", 2);
}
static void c_dup_tensor_esc(gb *b) {
    gb_header(b, 3, 2, 0);
    gb_tinfo(b, "t\x1b]2;x\x07", 1, ne_b, T_F32, 0);
    gb_tinfo(b, "t\x1b]2;x\x07", 1, ne_b, T_F32, 128);
    data_for(b, 256);
}
static void c_tname_esc(gb *b) { one_tensor(b); gb_tinfo(b, "\r\x1b[2Kz", 0, ne_b, T_F32, 0); data_for(b, 128); }

typedef struct {
    const char *name;
    void (*build)(gb *b);
    const char *frag;
} corrupt_case;

#define C(fn, frag) {#fn, fn, frag}
static const corrupt_case cases[] = {
    C(c_empty, "truncated reading magic at offset 0 (4 bytes needed, 0 left)"),
    C(c_magic_short, "truncated reading magic"),
    C(c_bad_magic, "bad magic 0x12345678 (expected GGUF)"),
    C(c_version_short, "truncated reading version"),
    C(c_version1, "version 1 not supported"),
    C(c_version7, "version 7 not supported"),
    C(c_big_endian, "big-endian"),
    C(c_tcount_short, "truncated reading tensor count"),
    C(c_kvcount_short, "truncated reading kv count"),
    C(c_kv_huge, "kv count 1152921504606846976 exceeds the limit"),
    C(c_kv_many, "kv count 1000 needs at least 12000 bytes"),
    C(c_t_huge, "tensor count 1099511627776 exceeds the limit"),
    C(c_t_many, "tensor count 100 needs at least 3200 bytes"),
    C(c_keylen_short, "kv 1: truncated reading key length"),
    C(c_key_short, "kv 0: truncated: key length 10"),
    C(c_key_huge, "key length 1099511627776 exceeds the limit 65535"),
    C(c_key_empty, "kv 0: empty key"),
    C(c_key_nul, "key contains a NUL byte"),
    C(c_vtype_short, "key 'general.name': truncated reading value type"),
    C(c_vtype_unknown, "key 'general.x': unknown value type 13"),
    C(c_value_short, "key 'general.x': truncated reading uint32 at offset"),
    C(c_bool_two, "key 'general.flag': bool value 2 is not 0 or 1"),
    C(c_str_huge, "string length 4611686018427387904 exceeds the limit 1048576"),
    C(c_str_past_end, "truncated: string length 100 at offset"),
    C(c_arr_type_unknown, "unknown array element type 99"),
    C(c_arr_huge, "array length 1099511627776 exceeds the limit"),
    C(c_arr_past_end, "array length 1000 of uint32 needs at least 4000 bytes, 8 left"),
    C(c_arr_len_short, "truncated reading array length"),
    C(c_arr_str_short, "truncated reading string element length"),
    C(c_arr_bool_two, "bool element 1 is 2"),
    C(c_nest_deep, "arrays nested deeper than 8 levels"),
    C(c_nest_huge, "array length 67108864 of array needs at least"),
    C(c_dup_key, "duplicate key 'general.name' (kv 0 and kv 2)"),
    C(c_align0, "key 'general.alignment': 0 is not a power of two"),
    C(c_align3, "key 'general.alignment': 3 is not a power of two"),
    C(c_align24, "key 'general.alignment': 24 is not a power of two"),
    C(c_align_big, "key 'general.alignment': 1048576 exceeds the limit 65536"),
    C(c_align_type, "key 'general.alignment': type uint64, expected uint32"),
    C(c_align_i32, "key 'general.alignment': type int32, expected uint32"),
    C(c_tokens_int, "key 'tokenizer.ggml.tokens': array of int32, expected array of string"),
    C(c_tokens_scalar, "key 'tokenizer.ggml.tokens': type string, expected array of string"),
    C(c_tname_len_short, "tensor info 1: truncated reading tensor name length"),
    C(c_tname_short, "tensor info 0: truncated: tensor name length 40 at offset 24 exceeds the 30 bytes left"),
    C(c_tname_huge, "tensor name length 300 exceeds the limit 256"),
    C(c_tname_empty, "empty tensor name"),
    C(c_ndims_short, "tensor '" TN "': truncated reading n_dims"),
    C(c_ndims0, "tensor 'a': n_dims 0 is not in 1..4"),
    C(c_ndims5, "tensor 'a': n_dims 5 is not in 1..4"),
    C(c_dim_short, "tensor '" TN "': truncated reading dim"),
    C(c_type_short, "tensor '" TN "': truncated reading type"),
    C(c_offset_short, "tensor '" TN "': truncated reading offset"),
    C(c_dim0, "tensor 'a': dim 1 is 0"),
    C(c_dim_neg, "tensor 'a': dim 1 = 9223372036854775808 is too large"),
    C(c_nel_overflow, "tensor 'a': element count overflows int64"),
    C(c_bytes_overflow, "tensor 'a': byte size overflows int64"),
    C(c_type_unknown, "tensor 'a': unknown type 4"),
    C(c_type_huge, "tensor 'a': unknown type 4294967295"),
    C(c_row_block, "tensor 'a': row length 33 is not a multiple of the block size 32 of q8_0"),
    C(c_misaligned, "tensor 'a': offset 4 is not a multiple of the alignment 32"),
    C(c_offset_past, "tensor 'a': offset 4096 + 128 bytes exceeds data section size 256"),
    C(c_data_short, "tensor 'a': offset 0 + 128 bytes exceeds data section size 127"),
    C(c_data_start, "truncated: data section starts at offset"),
    C(c_offset_wrap, "tensor 'a': offset 18446744073709551584 + 128 bytes exceeds data section size 128"),
    C(c_dup_tensor, "duplicate tensor name 'a' (tensors 0 and 1)"),
    C(c_valid_cut, "tensor 'b': offset 64 + 34 bytes exceeds data section size 97"),
    C(c_align64_misaligned, "tensor 'b': offset 160 is not a multiple of the alignment 64"),
    C(c_align1, "key 'general.alignment': 1 is below the minimum 8"),
    C(c_align4, "key 'general.alignment': 4 is below the minimum 8"),
    C(c_overlap, "tensor 'b' (1 of 2): offset 0, expected 128"),
    C(c_grows_into_next, "tensor 'b' (1 of 2): offset 128, expected 256"),
    C(c_out_of_order, "tensor 'a' (0 of 2): offset 128, expected 0"),
    C(c_gap, "tensor 'b' (1 of 2): offset 256, expected 128"),
    C(c_first_not_zero, "tensor 'a' (0 of 1): offset 32, expected 0"),
    C(c_trailing, "64 bytes after the last tensor's data"),
    C(c_count_low, "bytes after the last tensor's data"),
    C(c_dup_key_esc, "duplicate key 'k\\x1b[31m\\x0a\\xff' (kv 0 and kv 1)"),
    C(c_dup_tensor_esc, "duplicate tensor name 't\\x1b]2;x\\x07' (tensors 0 and 1)"),
    C(c_tname_esc, "tensor '\\x0d\\x1b[2Kz': n_dims 0"),
};

MF_TEST(test_corrupt_table) {
    int n = (int)(sizeof cases / sizeof cases[0]);
    CHECK(n >= 30);
    for (int i = 0; i < n; i++) {
        gb b = {0};
        cases[i].build(&b);
        void *buf = gb_exact(&b);
        mf_gguf *g = (mf_gguf *)1;
        mf_error err = {{0}};
        int rc = mf_gguf_parse(buf, b.n, &g, &err);
        CHECK_MSG(rc == -1, "%s: parsed", cases[i].name);
        CHECK_MSG(g == NULL, "%s: out not cleared", cases[i].name);
        CHECK_MSG(strncmp(err.msg, "gguf: ", 6) == 0, "%s: message '%s' lacks the gguf prefix", cases[i].name,
                  err.msg);
        CHECK_MSG(strstr(err.msg, cases[i].frag) != NULL, "%s: message '%s' lacks '%s'", cases[i].name, err.msg,
                  cases[i].frag);
        for (const char *c = err.msg; *c; c++) /* one printable line, whatever the file holds */
            CHECK_MSG((unsigned char)*c >= 0x20 && *c != 0x7f, "%s: control byte 0x%02x in '%s'",
                      cases[i].name, (unsigned char)*c, err.msg);
        if (rc == 0)
            mf_gguf_close(g);
        free(buf);
        gb_free(&b);
    }
}

/* The base file parses and every field reads back as written. */
MF_TEST(test_valid_parses) {
    gb b = {0};
    valid(&b);
    void *buf = gb_exact(&b);
    mf_gguf *g = NULL;
    mf_error err = {{0}};
    CHECK_MSG(mf_gguf_parse(buf, b.n, &g, &err) == 0, "%s", err.msg);
    if (g) {
        CHECK_EQ_INT(mf_gguf_version(g), 3);
        CHECK_EQ_INT(mf_gguf_alignment(g), 32);
        CHECK_EQ_INT(mf_gguf_n_kv(g), 3);
        CHECK_EQ_INT(mf_gguf_n_tensors(g), 2);
        CHECK_EQ_INT(mf_gguf_n_parts(g), 1);
        CHECK_EQ_INT(mf_gguf_file_size(g), b.n);
        CHECK_EQ_INT(mf_gguf_data_offset(g), b.n - 98);
        mf_str s;
        CHECK(mf_gguf_get_str(g, "general.architecture", &s, &err) == 0 && s.len == 5 &&
              strcmp(s.ptr, "llama") == 0);
        int64_t kv;
        uint64_t n;
        CHECK(mf_gguf_get_arr(g, "tokenizer.ggml.tokens", MF_GGUF_STRING, &kv, &n, &err) == 0 && n == 3);
        CHECK(strcmp(mf_gguf_arr_str(g, kv, 2).ptr, "ccc") == 0 && mf_gguf_arr_str(g, kv, 1).len == 2);
        const mf_gguf_tensor *a = mf_gguf_find_tensor(g, "a"), *t = mf_gguf_find_tensor(g, "b");
        CHECK(a && t && !mf_gguf_find_tensor(g, "c"));
        if (a && t) {
            CHECK(a->n_dims == 2 && a->ne[0] == 8 && a->ne[1] == 2 && a->ne[2] == 1 && a->ne[3] == 1);
            CHECK(a->type == T_F32 && a->nbytes == 64 && a->offset == 0 && a->part == 0);
            CHECK(t->type == T_Q8_0 && t->nbytes == 34 && t->offset == 64);
            const uint8_t *data = (const uint8_t *)buf + b.n - 98;
            CHECK(a->data == data && t->data == data + 64);
            CHECK(memcmp(t->data, b.p + b.n - 34, 34) == 0);
        }
        mf_gguf_close(g);
    }
    free(buf);
    gb_free(&b);
}

/* Version 2 has the same layout and parses too. */
MF_TEST(test_version2_parses) {
    gb b = {0};
    valid(&b);
    b.p[4] = 2;
    mf_gguf *g = NULL;
    mf_error err = {{0}};
    CHECK_MSG(mf_gguf_parse(b.p, b.n, &g, &err) == 0, "%s", err.msg);
    CHECK(g && mf_gguf_version(g) == 2);
    mf_gguf_close(g);
    gb_free(&b);
}

/* Every strict prefix of the valid file is refused with a truncation message. */
MF_TEST(test_every_prefix_fails) {
    gb b = {0};
    valid(&b);
    for (size_t len = 0; len < b.n; len++) {
        gb p = {0};
        gb_put(&p, b.p, len);
        void *buf = gb_exact(&p);
        mf_gguf *g = NULL;
        mf_error err = {{0}};
        int rc = mf_gguf_parse(buf, len, &g, &err);
        CHECK_MSG(rc == -1, "prefix %zu parsed", len);
        CHECK_MSG(strstr(err.msg, "truncated") || strstr(err.msg, "exceeds data section"),
                  "prefix %zu: '%s'", len, err.msg);
        if (rc == 0)
            mf_gguf_close(g);
        free(buf);
        gb_free(&p);
    }
    gb_free(&b);
}

/* Random corruption: any outcome but a crash (run under the sanitizers). When
 * a mutant parses, walking it must stay inside the buffer. */
MF_TEST(test_random_mutations) {
    gb b = {0};
    valid(&b);
    uint64_t s = 0x1234567;
    int parsed = 0;
    for (int it = 0; it < 20000; it++) {
        uint8_t *buf = gb_exact(&b);
        int flips = 1 + it % 4;
        for (int k = 0; k < flips; k++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            buf[(s >> 8) % b.n] = (uint8_t)(s >> 40);
        }
        mf_gguf *g = NULL;
        mf_error err = {{0}};
        if (mf_gguf_parse(buf, b.n, &g, &err) == 0) {
            parsed++;
            char text[128];
            for (int64_t i = 0; i < mf_gguf_n_kv(g); i++)
                mf_gguf_kv_format(g, i, text, sizeof text);
            for (int64_t i = 0; i < mf_gguf_n_tensors(g); i++) {
                const mf_gguf_tensor *t = mf_gguf_tensor_at(g, i);
                CHECK((const uint8_t *)t->data >= buf && (const uint8_t *)t->data + t->nbytes <= buf + b.n);
            }
            mf_gguf_close(g);
        } else {
            CHECK(strncmp(err.msg, "gguf: ", 6) == 0);
        }
        free(buf);
    }
    CHECK(parsed > 0); /* flips inside tensor data leave the file valid */
    gb_free(&b);
}

/* A file of nested empty arrays costs ~9 bytes of parser memory per file
 * byte; the budget (4 per byte + 16 MiB) refuses it with a clear message
 * instead of letting it take ~9x its size. */
MF_TEST(test_memory_budget) {
    const uint64_t n = 1500000; /* 18 MB of empty arrays */
    gb b = {0};
    one_kv(&b);
    gb_kv(&b, "general.x", V_ARR);
    gb_u32(&b, V_ARR);
    gb_u64(&b, n);
    for (uint64_t i = 0; i < n; i++) {
        gb_u32(&b, V_U8);
        gb_u64(&b, 0);
    }
    mf_gguf *g = NULL;
    mf_error err = {{0}};
    CHECK(mf_gguf_parse(b.p, b.n, &g, &err) == -1 && g == NULL);
    CHECK_STR_CONTAINS(err.msg, "key 'general.x': parsing needs more than");
    CHECK_STR_CONTAINS(err.msg, "bytes of memory (the budget for a 18000057-byte file");
    /* the same structure, small, is fine: the budget is not a ban */
    gb s = {0};
    one_kv(&s);
    gb_kv(&s, "general.x", V_ARR);
    gb_u32(&s, V_ARR);
    gb_u64(&s, 1000);
    for (int i = 0; i < 1000; i++) {
        gb_u32(&s, V_U8);
        gb_u64(&s, 0);
    }
    CHECK_MSG(mf_gguf_parse(s.p, s.n, &g, &err) == 0, "%s", err.msg);
    mf_gguf_close(g);
    gb_free(&s);
    gb_free(&b);
}

/* Numeric arrays are read through typed accessors that refuse another
 * element type (the tokenizer's token_type / scores read as numbers). */
MF_TEST(test_typed_array_accessors) {
    gb b = {0};
    gb_header(&b, 3, 0, 3);
    gb_kv(&b, "strs", V_ARR);
    gb_u32(&b, V_STR);
    gb_u64(&b, 1);
    gb_str(&b, "x");
    gb_kv(&b, "nested", V_ARR);
    gb_u32(&b, V_ARR);
    gb_u64(&b, 0);
    gb_kv(&b, "ints", V_ARR);
    gb_u32(&b, V_I32);
    gb_u64(&b, 1);
    gb_u32(&b, 7);
    mf_gguf *g = NULL;
    mf_error err = {{0}};
    CHECK_MSG(mf_gguf_parse(b.p, b.n, &g, &err) == 0, "%s", err.msg);
    if (g) {
        int64_t kv = -1;
        uint64_t n = 0;
        CHECK(mf_gguf_get_arr_ints(g, "strs", &kv, &n, &err) == -1);
        CHECK_STR_CONTAINS(err.msg, "key 'strs': array of string, expected array of integers");
        CHECK(mf_gguf_get_arr_nums(g, "nested", &kv, &n, &err) == -1);
        CHECK_STR_CONTAINS(err.msg, "key 'nested': array of array, expected array of numbers");
        CHECK(mf_gguf_get_arr_nums(g, "absent", &kv, &n, &err) == 1);
        CHECK(mf_gguf_get_arr_ints(g, "ints", &kv, &n, &err) == 0 && n == 1);
        CHECK_EQ_INT(mf_gguf_arr_int(g, kv, 0), 7);
        CHECK(mf_gguf_get_arr_nums(g, "ints", &kv, &n, &err) == 0);
        mf_gguf_close(g);
    }
    gb_free(&b);
}

/* The escape helper every file string goes through before a message. */
MF_TEST(test_escape) {
    char buf[64];
    CHECK_STR_CONTAINS(mf_escape("ok", 2, buf, sizeof buf), "ok");
    CHECK(strcmp(mf_escape("a\nb\x1b[0m", 7, buf, sizeof buf), "a\\x0ab\\x1b[0m") == 0);
    CHECK(strcmp(mf_escape("\xc3\xa9\xe2\x82\xac", 5, buf, sizeof buf), "\xc3\xa9\xe2\x82\xac") == 0);
    CHECK(strcmp(mf_escape("\xc3(\xed\xa0\x80", 5, buf, sizeof buf), "\\xc3(\\xed\\xa0\\x80") == 0);
    CHECK(strcmp(mf_escape("\xc2\x9b", 2, buf, sizeof buf), "\\xc2\\x9b") == 0); /* C1 CSI */
    CHECK(strcmp(mf_escape("a\\b", 3, buf, sizeof buf), "a\\\\b") == 0);
    CHECK(strcmp(mf_escape("x\0y", 3, buf, sizeof buf), "x\\x00y") == 0);
    char small[8];
    CHECK(strcmp(mf_escape("abcdefghij", 10, small, sizeof small), "abcd...") == 0);
    CHECK(strlen(mf_escape("\n\n\n\n", 4, small, sizeof small)) < sizeof small);
}

MF_TEST_MAIN(MF_T(test_corrupt_table), MF_T(test_memory_budget), MF_T(test_typed_array_accessors),
             MF_T(test_escape), MF_T(test_valid_parses), MF_T(test_version2_parses),
             MF_T(test_every_prefix_fails), MF_T(test_random_mutations))
