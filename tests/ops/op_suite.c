/* op_suite.c - one table of op cases, run on any registered backend against
 * a float64 reference.
 *
 *   test_ops BACKEND [FILTER] [--sweep] [--count] [--shard K/N]
 *            e.g. test_ops cpu, test_ops ref matmul, test_ops cuda --sweep
 *
 * --sweep adds the dense grid of small shapes (make_sweep_cases; the GPU
 * runs it), --count prints how many cases the table holds and runs none;
 * every run ends with its totals ("N cases: P passed, F failed, R not run").
 * Bad input (the error_* cases) must fail naming the problem.
 *
 * Each case is one graph node with random inputs (and random weights,
 * quantized to the case's type) run straight through the backend contract:
 * buffers allocated, inputs written, the output buffer poisoned with NaN,
 * execute_node through the op table, synchronize, read back. The reference
 * computes the node in float64 from exactly what the backend was given (the
 * dequantized weights, the KV history as stored), so the tolerance of each
 * path covers only what the path itself rounds: f32 math, f16 / bf16
 * weights, int8-quantized activations (docs/ARCHITECTURE.md §9).
 * In-place cases hand the op its first input's buffer as the output; the
 * attention-input cases (FUSED_QKV(_NORM), QKV_BIAS_ROPE_STORE) also read the
 * KV regions back and check the rows they stored. A case
 * the backend's op table refuses is counted as not run, never as a pass;
 * the suite fails when the backend refuses one it claims (runs_every_op). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "quant/quant.h"
#include "runtime/levers.h"

/* ---- random data -------------------------------------------------------------------- */

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}
static float *rand_vec(int64_t n, float scale) {
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = frand() * scale;
    return v;
}

/* ---- the cases ---------------------------------------------------------------------- */

typedef enum kind {
    K_ADD, K_MUL, K_MUL_BCAST, K_SCALE, K_SILU, K_SWIGLU, K_RMSNORM, K_QKNORM, K_MATMUL, K_EMBED, K_ROWS,
    K_ROPE, K_SOFTMAX, K_VIEW, K_PERMUTE, K_KV, K_ATTN, K_FFN, K_QKV, K_EPI, K_COUNT
} kind;

static const char *const kind_names[K_COUNT] = {
    "add", "mul", "mul_bcast", "scale", "silu", "swiglu", "rmsnorm", "qknorm", "matmul", "getrows_embed",
    "getrows_rows", "rope", "softmax", "view", "permute", "kv_store_load", "attn", "fused_ffn", "fused_qkv",
    "qkv_bias_rope_store"};

typedef struct ocase {
    kind k;
    int64_t w, nt;     /* input width, tokens */
    int64_t n_out;     /* matmul / ffn rows, embedding vocab */
    uint32_t wtype;    /* weight type, or KV type for K_KV / K_ATTN */
    uint32_t kvtype;   /* K_QKV / K_EPI: the cache they store into */
    uint32_t vtype;    /* K_KV / K_ATTN: the V cache type (wtype is K's) */
    bool unfused;      /* K_ATTN: -fa off, the unfused form (meta.attn.unfused) */
    bool bias, inplace, norm; /* norm: FUSED_QKV_NORM / the epilogue's Q/K norms */
    int32_t n_head, n_head_kv, head_dim, n_past, mode;
    /* RoPE beyond the defaults (0: n_rot = head_dim, freq_scale 1, theta
     * 1e6; the attention-input block NEOX unless rope_normal) */
    int32_t n_rot;
    float freq_scale, theta;
    bool rope_normal;
} ocase;

static ocase *cases;
static int n_cases, cap_cases;
static void add_case(ocase c) {
    /* a weight type whose blocks do not divide the row (K-quants at 896) is no case */
    if ((c.k == K_MATMUL || c.k == K_EMBED || c.k == K_FFN || c.k == K_QKV) && mf_type_row_size(c.wtype, c.w) == 0)
        return;
    if (n_cases == cap_cases) {
        cap_cases = cap_cases ? 2 * cap_cases : 1024;
        cases = realloc(cases, (size_t)cap_cases * sizeof *cases);
        MF_ASSERT(cases);
    }
    cases[n_cases++] = c;
}

static const uint32_t wtypes[] = {MF_TYPE_F32, MF_TYPE_F16, MF_TYPE_BF16, MF_TYPE_Q4_0, MF_TYPE_Q4_1,
                                  MF_TYPE_Q5_0, MF_TYPE_Q5_1, MF_TYPE_Q8_0, MF_TYPE_Q2_K, MF_TYPE_Q3_K,
                                  MF_TYPE_Q4_K, MF_TYPE_Q5_K, MF_TYPE_Q6_K};
enum { N_WTYPES = sizeof wtypes / sizeof wtypes[0] };
static const uint32_t kvtypes[] = {MF_TYPE_F32, MF_TYPE_F16, MF_TYPE_Q8_0};

/* Every KV cache type (the 4/5-bit block types too) for K and for V, K and
 * V of different types, and attention in its unfused form (-fa off). K_KV
 * mode 1 loads K back (mode 0: V). */
static const uint32_t all_kvtypes[] = {MF_TYPE_F32,  MF_TYPE_F16,  MF_TYPE_Q8_0, MF_TYPE_Q4_0,
                                       MF_TYPE_Q4_1, MF_TYPE_Q5_0, MF_TYPE_Q5_1};
enum { N_ALL_KV = sizeof all_kvtypes / sizeof all_kvtypes[0] };
static void make_kv_type_cases(void) {
    for (int i = 0; i < N_ALL_KV; i++) {
        const uint32_t kt = all_kvtypes[i], vt = all_kvtypes[(i + 3) % N_ALL_KV];
        for (int m = 0; m < 2; m++)
            add_case((ocase){.k = K_KV, .w = 128, .nt = 7, .wtype = kt, .vtype = vt, .n_past = 9, .mode = m});
        for (int uf = 0; uf < 2; uf++) {
            /* same type, then mixed: 0.5B heads (14 x 64 over 2), one decode token and a prefill chunk */
            add_case((ocase){.k = K_ATTN, .nt = 1, .wtype = kt, .vtype = kt, .n_head = 14, .n_head_kv = 2,
                             .head_dim = 64, .n_past = 37, .unfused = uf});
            add_case((ocase){.k = K_ATTN, .nt = 7, .wtype = kt, .vtype = vt, .n_head = 14, .n_head_kv = 2,
                             .head_dim = 64, .n_past = 37, .unfused = uf});
        }
    }
    /* the unfused form at 1.5B heads (12 x 128 over 2), a longer prefill */
    add_case((ocase){.k = K_ATTN, .nt = 64, .wtype = MF_TYPE_F32, .vtype = MF_TYPE_F32, .n_head = 12,
                     .n_head_kv = 2, .head_dim = 128, .n_past = 5, .unfused = true});
    add_case((ocase){.k = K_ATTN, .nt = 64, .wtype = MF_TYPE_Q8_0, .vtype = MF_TYPE_F16, .n_head = 12,
                     .n_head_kv = 2, .head_dim = 128, .n_past = 5, .unfused = true});
}

/* What a KV type costs: one quantization step of a block relative to its
 * largest element (2^-(bits-1): q8_0 1/128, q5 1/16, q4 1/8) with margin; f16
 * half an ulp; f32 exact. A backend's own quantizer of the new rows may round
 * one step away from the reference's. */
static double kv_type_tol(uint32_t t) {
    switch (t) {
    case MF_TYPE_F32: return 0;
    case MF_TYPE_F16: return 1e-3;
    case MF_TYPE_Q8_0: return 1e-2;
    case MF_TYPE_Q5_0: case MF_TYPE_Q5_1: return 7e-2;
    default: return 1.5e-1; /* q4_0, q4_1 */
    }
}

/* Real widths (qwen2 0.5B / 1.5B / 3B / 7B hidden, 0.5B ffn, 7B ffn) and
 * odd token counts; the big shapes only where CI time allows. */
static void make_cases(void) {
    const int64_t widths[] = {896, 1536, 2560, 3584, 4864, 18944};
    const int64_t toks[] = {1, 7, 64, 513};
    for (int k = K_ADD; k <= K_SWIGLU; k++)
        for (int t = 0; t < 4; t++)
            for (int ip = 0; ip < 2; ip++)
                add_case((ocase){.k = (kind)k, .w = 896, .nt = toks[t], .inplace = ip});
    for (int wi = 0; wi < 6; wi++)
        add_case((ocase){.k = K_ADD, .w = widths[wi], .nt = 7, .inplace = wi % 2});
    for (int wi = 0; wi < 6; wi++)
        for (int t = 0; t < 3; t++) {
            add_case((ocase){.k = K_RMSNORM, .w = widths[wi], .nt = toks[t], .wtype = MF_TYPE_F32, .inplace = t == 1});
            add_case((ocase){.k = K_SOFTMAX, .w = widths[wi], .nt = toks[t], .inplace = t == 2});
        }
    add_case((ocase){.k = K_RMSNORM, .w = 896, .nt = 7, .wtype = MF_TYPE_F16});
    add_case((ocase){.k = K_RMSNORM, .w = 896, .nt = 7, .wtype = MF_TYPE_COUNT}); /* no weight */
    for (int t = 0; t < 4; t++)
        add_case((ocase){.k = K_QKNORM, .w = 896, .nt = toks[t], .head_dim = 64, .inplace = t % 2});
    /* every weight type at the 1.5B hidden width, 1 and 7 tokens, bias on odd types */
    for (int i = 0; i < N_WTYPES; i++)
        for (int t = 0; t < 2; t++)
            add_case((ocase){.k = K_MATMUL, .w = 1536, .n_out = 128, .nt = toks[t], .wtype = wtypes[i], .bias = i % 2});
    /* real widths: ffn up / down, 7B shapes, one token at the largest */
    const uint32_t big[] = {MF_TYPE_Q4_0, MF_TYPE_Q8_0, MF_TYPE_Q4_K, MF_TYPE_Q6_K};
    for (int i = 0; i < 4; i++) {
        add_case((ocase){.k = K_MATMUL, .w = 896, .n_out = 4864, .nt = 7, .wtype = big[i]});
        add_case((ocase){.k = K_MATMUL, .w = 4864, .n_out = 896, .nt = 1, .wtype = big[i], .bias = true});
        add_case((ocase){.k = K_MATMUL, .w = 18944, .n_out = 64, .nt = 1, .wtype = big[i]});
        add_case((ocase){.k = K_MATMUL, .w = 3584, .n_out = 256, .nt = 1, .wtype = big[i]});
        add_case((ocase){.k = K_MATMUL, .w = 1536, .n_out = 256, .nt = 7, .wtype = big[i]});
        add_case((ocase){.k = K_MATMUL, .w = 2560, .n_out = 128, .nt = 1, .wtype = big[i]});
    }
    add_case((ocase){.k = K_MATMUL, .w = 1536, .n_out = 896, .nt = 64, .wtype = MF_TYPE_Q4_K});
    add_case((ocase){.k = K_MATMUL, .w = 896, .n_out = 896, .nt = 64, .wtype = MF_TYPE_Q4_0});
    add_case((ocase){.k = K_MATMUL, .w = 896, .n_out = 128, .nt = 513, .wtype = MF_TYPE_Q8_0});
    add_case((ocase){.k = K_MATMUL, .w = 256, .n_out = 151936, .nt = 1, .wtype = MF_TYPE_Q8_0}); /* lm_head rows */
    for (int i = 0; i < N_WTYPES; i++)
        add_case((ocase){.k = K_EMBED, .w = 256, .n_out = 500, .nt = 7, .wtype = wtypes[i]});
    add_case((ocase){.k = K_EMBED, .w = 128, .n_out = 151936, .nt = 7, .wtype = MF_TYPE_Q8_0});
    for (int t = 1; t < 4; t++)
        add_case((ocase){.k = K_ROWS, .w = 896, .nt = toks[t]});
    for (int m = 0; m <= 2; m += 2)
        for (int t = 0; t < 4; t++)
            add_case((ocase){.k = K_ROPE, .w = 896, .nt = toks[t], .n_head = 14, .head_dim = 64, .mode = m,
                             .n_past = 5, .inplace = t % 2});
    add_case((ocase){.k = K_VIEW, .w = 1536, .nt = 7});
    add_case((ocase){.k = K_PERMUTE, .w = 896, .nt = 7});
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < 3; t++) {
            add_case((ocase){.k = K_KV, .w = 128, .nt = toks[t], .wtype = kvtypes[i], .vtype = kvtypes[i],
                             .n_past = 9});
            /* 0.5B attention: 14 query heads over 2 KV heads of 64 */
            add_case((ocase){.k = K_ATTN, .nt = toks[t], .wtype = kvtypes[i], .vtype = kvtypes[i], .n_head = 14,
                             .n_head_kv = 2, .head_dim = 64, .n_past = 37});
        }
    /* the attention input block: 0.5B (14 x 64 over 2 KV heads) and 1.5B (12 x 128) */
    const uint32_t qkv_t[] = {MF_TYPE_F32, MF_TYPE_Q8_0, MF_TYPE_Q4_0, MF_TYPE_Q4_K, MF_TYPE_Q6_K};
    for (int i = 0; i < 5; i++)
        for (int nm = 0; nm < 2; nm++) {
            const bool big_hd = mf_type_row_size(qkv_t[i], 896) == 0;
            add_case((ocase){.k = K_QKV, .w = big_hd ? 1536 : 896, .nt = nm ? 7 : 1, .wtype = qkv_t[i],
                             .kvtype = kvtypes[(i + nm) % 3], .norm = nm, .n_head = big_hd ? 12 : 14,
                             .n_head_kv = 2, .head_dim = big_hd ? 128 : 64, .n_past = 11});
        }
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < 3; t++)
            add_case((ocase){.k = K_EPI, .w = 896, .nt = toks[t], .kvtype = kvtypes[i], .norm = t == 1,
                             .inplace = t == 2, .n_head = 14, .n_head_kv = 2, .head_dim = 64, .n_past = 4,
                             .mode = i == 1 /* 1: no positions src, n_past + t */});
    for (int i = 0; i < 4; i++)
        add_case((ocase){.k = K_FFN, .w = i < 2 ? 896 : 1536, .n_out = 1216, .nt = i % 2 ? 7 : 1, .wtype = big[i]});
    make_kv_type_cases();
}

/* The cases the engine-level op test had beyond make_cases' (partial
 * rotary, frequency scale, other theta, the llama rope order in the
 * attention-input block), and the real shapes by size class: every real
 * width and every odd token count, the tokens a shape runs with bounded so
 * the float64 reference stays within CI time (nt * width * rows <= 2^26
 * multiply-adds: the big shapes run with few tokens). */
static void make_shape_cases(void) {
    const int64_t widths[] = {896, 1536, 2560, 3584, 4864, 18944};
    const int64_t toks[] = {1, 7, 64, 513};
    for (int m = 0; m <= 2; m += 2)
        for (int t = 0; t < 3; t++)
            add_case((ocase){.k = K_ROPE, .w = 256, .nt = toks[t], .n_head = 4, .head_dim = 64, .mode = m,
                             .n_past = 5, .n_rot = 48, .freq_scale = 0.5f, .theta = 1e4f});
    for (int i = 0; i < 3; i++)
        add_case((ocase){.k = K_EPI, .w = 896, .nt = 7, .kvtype = kvtypes[i], .norm = i == 1, .n_head = 14,
                         .n_head_kv = 2, .head_dim = 64, .n_past = 4, .mode = i == 2, .rope_normal = true,
                         .n_rot = 48, .theta = 1e4f});
    add_case((ocase){.k = K_QKV, .w = 896, .nt = 7, .wtype = MF_TYPE_F32, .kvtype = MF_TYPE_F16, .n_head = 14,
                     .n_head_kv = 2, .head_dim = 64, .n_past = 3, .rope_normal = true, .n_rot = 32, .freq_scale = 0.25f});
    for (int wi = 0; wi < 6; wi++)
        for (int t = 0; t < 4; t++) {
            const int64_t rows = 128;
            if (toks[t] * widths[wi] * rows > (1 << 26))
                continue;
            add_case((ocase){.k = K_MATMUL, .w = widths[wi], .n_out = rows, .nt = toks[t],
                             .wtype = wtypes[(wi * 4 + t) % N_WTYPES], .bias = t % 2});
            add_case((ocase){.k = K_RMSNORM, .w = widths[wi], .nt = toks[t], .wtype = MF_TYPE_F32});
            add_case((ocase){.k = K_SWIGLU, .w = widths[wi], .nt = toks[t], .inplace = wi % 2});
        }
    /* the vocabulary at 7 tokens, the lm_head's K-quant */
    add_case((ocase){.k = K_MATMUL, .w = 256, .n_out = 151936, .nt = 7, .wtype = MF_TYPE_Q6_K});
    /* every weight type in the fused FFN and the attention-input block */
    for (int i = 0; i < N_WTYPES; i++) {
        add_case((ocase){.k = K_FFN, .w = 1536, .n_out = 512, .nt = i % 2 ? 7 : 1, .wtype = wtypes[i]});
        const bool kq = mf_type_row_size(wtypes[i], 896) == 0;
        add_case((ocase){.k = K_QKV, .w = kq ? 1536 : 896, .nt = i % 3 == 0 ? 7 : 1, .wtype = wtypes[i],
                         .kvtype = kvtypes[i % 3], .norm = i % 2, .n_head = kq ? 12 : 14, .n_head_kv = 2,
                         .head_dim = kq ? 128 : 64, .n_past = 6});
    }
    /* attention and the cache at 513 tokens; the 1.5B heads (12 x 128 over 2) */
    for (int i = 0; i < 3; i++) {
        add_case((ocase){.k = K_KV, .w = 128, .nt = 513, .wtype = kvtypes[i], .n_past = 9});
        add_case((ocase){.k = K_ATTN, .nt = i ? 64 : 513, .wtype = kvtypes[i], .n_head = 14, .n_head_kv = 2,
                         .head_dim = 64, .n_past = 37});
        for (int t = 0; t < 3; t++)
            add_case((ocase){.k = K_ATTN, .nt = toks[t], .wtype = kvtypes[i], .n_head = 12, .n_head_kv = 2,
                             .head_dim = 128, .n_past = 300});
    }
}

/* The dense sweep (test_ops BACKEND --sweep): small shapes over every
 * weight type, token counts 1..9 and beyond, GQA layouts, history lengths.
 * Cheap on a GPU, where it runs (tests/CMakeLists.txt); minutes on the CPU. */
static void make_sweep_cases(void) {
    static const int64_t nts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 24, 33, 48, 64, 100};
    enum { N_NT = sizeof nts / sizeof nts[0] };
    /* (width, rows): the real widths and odd ones, rows odd and even */
    static const int64_t shapes[][2] = {{256, 32},   {256, 257},  {512, 96},   {512, 1},    {768, 64},
                                        {896, 136},  {1024, 257}, {1024, 8},   {1280, 72},  {1536, 64},
                                        {1536, 200}, {1792, 40},  {2048, 40},  {2048, 129}, {2304, 48},
                                        {2560, 96},  {2560, 17},  {2816, 32},  {3072, 24},  {3584, 33},
                                        {3584, 64},  {4096, 16},  {4352, 24},  {4864, 24},  {4864, 7},
                                        {5120, 12},  {6144, 9},   {8192, 5},   {256, 65},   {1024, 33},
                                        {3072, 96},  {4096, 3}};
    enum { N_SHAPES = sizeof shapes / sizeof shapes[0] };
    for (int i = 0; i < N_WTYPES; i++)
        for (int s = 0; s < N_SHAPES; s++)
            for (int t = 0; t < N_NT; t++)
                add_case((ocase){.k = K_MATMUL, .w = shapes[s][0], .n_out = shapes[s][1], .nt = nts[t],
                                 .wtype = wtypes[i], .bias = (s + t) % 3 == 0});
    static const int32_t heads[][3] = {{14, 2, 64}, {12, 2, 128}, {16, 8, 64}, {28, 4, 128}, {8, 8, 64}, {32, 8, 128}};
    static const int32_t pasts[] = {0, 1, 5, 31, 37, 100, 300, 383};
    for (int k = 0; k < 3; k++)
        for (int h = 0; h < 6; h++)
            for (int p = 0; p < 8; p++)
                for (int t = 0; t < N_NT - 1; t++)
                    add_case((ocase){.k = K_ATTN, .nt = nts[t], .wtype = kvtypes[k], .n_head = heads[h][0],
                                     .n_head_kv = heads[h][1], .head_dim = heads[h][2], .n_past = pasts[p]});
    for (int i = 0; i < N_WTYPES; i++)
        for (int t = 0; t < N_NT; t++) {
            add_case((ocase){.k = K_FFN, .w = 512, .n_out = 96, .nt = nts[t], .wtype = wtypes[i]});
            const bool kq = mf_type_row_size(wtypes[i], 896) == 0;
            add_case((ocase){.k = K_QKV, .w = kq ? 512 : 896, .nt = nts[t], .wtype = wtypes[i],
                             .kvtype = kvtypes[t % 3], .norm = t % 2, .n_head = kq ? 4 : 14, .n_head_kv = 2,
                             .head_dim = kq ? 128 : 64, .n_past = 3 + t});
            for (int e = 0; e < 3; e++)
                add_case((ocase){.k = K_EMBED, .w = (int64_t[]){256, 1536, 3584}[e], .n_out = 300, .nt = nts[t],
                                 .wtype = wtypes[i]});
        }
    static const int64_t ew[] = {64, 896, 1536, 2560, 4864, 18944};
    for (int k = K_ADD; k <= K_SWIGLU; k++)
        for (int t = 0; t < N_NT; t++)
            for (int wi = 0; wi < 6; wi++)
                add_case((ocase){.k = (kind)k, .w = ew[wi], .nt = nts[t], .inplace = (t + wi) % 2});
    for (int t = 0; t < N_NT; t++)
        for (int i = 0; i < 3; i++) {
            add_case((ocase){.k = K_RMSNORM, .w = ew[2 * i + 1], .nt = nts[t], .wtype = MF_TYPE_F32});
            add_case((ocase){.k = K_SOFTMAX, .w = ew[2 * i + 1], .nt = nts[t]});
            add_case((ocase){.k = K_QKNORM, .w = 896, .nt = nts[t], .head_dim = 64, .inplace = i == 1});
            add_case((ocase){.k = K_ROPE, .w = 896, .nt = nts[t], .n_head = 14, .head_dim = 64, .mode = i ? 2 : 0,
                             .n_past = 3 * t, .n_rot = i == 2 ? 32 : 0});
            add_case((ocase){.k = K_EPI, .w = 896, .nt = nts[t], .kvtype = kvtypes[i], .norm = t % 2, .n_head = 14,
                             .n_head_kv = 2, .head_dim = 64, .n_past = t, .mode = i == 1});
            add_case((ocase){.k = K_KV, .w = 128, .nt = nts[t], .wtype = kvtypes[i], .n_past = t});
        }
}

/* ---- tolerance per path ---------------------------------------------------------------- */

/* max |got - want| <= tol * max |want|. */
static double tolerance(const ocase *c, const mf_backend_entry *be) {
    switch (c->k) {
    case K_MATMUL:
    case K_FFN:
        /* f32 weights: f32 accumulation; f16/bf16 weights: activations may be
         * rounded to the weight's type; quantized weights: int8 activations */
        /* CUDA's multi-token tiers (nt > 8) take f32 weights through the
         * f16 tensor-core GEMM: x and W rounded to f16 (measured 2.4-2.8e-4) */
        if (c->wtype == MF_TYPE_F32 && be->kind == MF_BACKEND_CUDA && c->nt > 8)
            return 2e-3;
        return c->wtype == MF_TYPE_F32 ? 1e-4 : c->wtype == MF_TYPE_F16 || c->wtype == MF_TYPE_BF16 ? 1e-2 : 3e-2;
    case K_ATTN:
        /* the history is as stored; a quantized cache leaves the new rows'
         * rounding (the backend's quantizer): q8_0 2e-2 as before, q4/q5 their step */
        if (c->wtype == MF_TYPE_Q8_0 || c->vtype == MF_TYPE_Q8_0 || kv_type_tol(c->wtype) > 1e-2 ||
            kv_type_tol(c->vtype) > 1e-2)
            return fmax(2e-2, fmax(kv_type_tol(c->wtype), kv_type_tol(c->vtype)));
        /* CUDA prefill (nt > 8, head_dim 64 / 128) is the tensor-core kernel:
         * q, K, V and P rounded to f16, documented at 3e-3 against float64
         * (tests/cuda/test_cuda_ops.c PA_TOL, docs/GPU-TESTS.md preattn) */
        if (be->kind == MF_BACKEND_CUDA && c->nt > 8 && (c->head_dim == 64 || c->head_dim == 128))
            return 3e-3;
        return 2e-4;
    case K_QKV:
        return c->wtype == MF_TYPE_F32 ? 1e-4 : 3e-2;
    case K_EPI:
        return 1e-4;
    case K_KV: /* the load returns what was stored (the backend's own rounding of the new rows) */
        return kv_type_tol(c->mode ? c->wtype : c->vtype);
    case K_EMBED:
    case K_ROWS:
    case K_VIEW:
    case K_PERMUTE:
        return 0; /* copies */
    default:
        return 2e-5;
    }
}

/* The case's RoPE, its zero fields meaning the defaults. */
static int32_t rope_n_rot(const ocase *c) { return c->n_rot ? c->n_rot : c->head_dim; }
static float rope_theta(const ocase *c) { return c->theta > 0 ? c->theta : 1e6f; }
static float rope_fs(const ocase *c) { return c->freq_scale > 0 ? c->freq_scale : 1.0f; }
static int rope_mode(const ocase *c) { return c->rope_normal ? MF_ROPE_NORMAL : MF_ROPE_NEOX; }

/* ---- float64 references ---------------------------------------------------------------- */

static double silu(double x) {
    return x / (1.0 + exp(-x));
}

static void rope_f64(double *x, int64_t nt, int n_head, int hd, int n_rot, int32_t p0, int mode, double theta,
                     double fs) {
    for (int64_t t = 0; t < nt; t++)
        for (int h = 0; h < n_head; h++) {
            double *v = x + (t * n_head + h) * hd;
            for (int i = 0; i < n_rot / 2; i++) {
                double ang = (double)(p0 + t) * fs * pow(theta, -2.0 * i / n_rot);
                int i0 = mode == MF_ROPE_NEOX ? i : 2 * i, i1 = mode == MF_ROPE_NEOX ? i + n_rot / 2 : 2 * i + 1;
                double a = v[i0], b = v[i1];
                v[i0] = a * cos(ang) - b * sin(ang);
                v[i1] = a * sin(ang) + b * cos(ang);
            }
        }
}

/* Rows round-tripped through a stored type (what a cache or weight holds). */
static float *through(uint32_t type, const float *x, int64_t rows, int64_t w) {
    float *y = malloc((size_t)(rows * w) * sizeof *y);
    size_t rs = mf_type_row_size(type, w);
    void *q = malloc(rs * (size_t)rows);
    mf_quantize_rows(type, x, q, rows, w);
    mf_dequantize_rows(type, q, y, rows, w);
    free(q);
    return y;
}

/* ---- one case on one backend ----------------------------------------------------------- */

typedef struct run {
    mf_backend *b;
    mf_weights *w;
    mf_graph g;
    int32_t bufs[8];
    int n_bufs;
    mf_error err;
} run;

static int32_t buf_with(run *r, const void *data, size_t nbytes) {
    int32_t id = r->b->ops->alloc_buffer(r->b, nbytes ? nbytes : 4, &r->err);
    if (id < 0)
        return -1;
    r->bufs[r->n_bufs++] = id;
    if (data && r->b->ops->write_host(r->b, id, 0, data, nbytes, &r->err))
        return -1;
    return id;
}

static int32_t poisoned(run *r, size_t nbytes) {
    unsigned char *p = malloc(nbytes);
    memset(p, 0xff, nbytes); /* NaN in every float */
    int32_t id = buf_with(r, p, nbytes);
    free(p);
    return id;
}

/* Adds weight `name` of type, [n_in, n_out], from random floats; returns the
 * floats the backend will see (dequantized). */
static float *add_weight(run *r, const char *name, uint32_t type, int64_t n_in, int64_t n_out, float scale) {
    float *f = rand_vec(n_in * n_out, scale);
    size_t bytes = mf_type_row_size(type, n_in) * (size_t)n_out;
    void *q = malloc(bytes);
    mf_quantize_rows(type, f, q, n_out, n_in);
    mf_dequantize_rows(type, q, f, n_out, n_in);
    mf_weight wt = {.name = name, .type = type, .n_dims = n_out > 1 ? 2 : 1, .ne = {n_in, n_out, 1, 1},
                    .nbytes = bytes};
    MF_ASSERT(mf_weights_add_owned(r->w, &wt, q, &r->err) == 0);
    return f;
}

static double max_abs(const double *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        m = fmax(m, fabs(x[i]));
    return m;
}

/* The graph ops some passing case ran (the coverage check in main). */
static bool op_passed[MF_OP_COUNT];

/* The options every case's backend is made with: the runtime's levers as a
 * model load passes them (MINFER_GPU_TIMEOUT_MS, the registry line's device
 * and tuning levers: MINFER_CUDA_TUNE drives the kernel choices), two CPU
 * threads. */
static const mf_backend_options *suite_options(const mf_backend_entry *be) {
    static mf_backend_options o;
    static bool made;
    if (!made) {
        mf_levers_backend_options(&o);
        o.n_threads = 2;
        if (be->device_lever)
            o.device = (int32_t)mf_lever_int(be->device_lever);
        if (be->tune_lever)
            o.tune = mf_lever_str(be->tune_lever);
        made = true;
    }
    return &o;
}

/* Runs c; 1 pass, 0 fail (message printed), -1 not run by this backend. */
static int run_case(const mf_backend_entry *be, const ocase *c, char *label, size_t cap) {
    run r = {0};
    r.w = mf_weights_new();
    mf_graph_init(&r.g);
    mf_graph *g = &r.g;
    const int64_t nt = c->nt;
    const bool qkv = c->k == K_QKV || c->k == K_EPI;
    int64_t kv_dim = (c->k == K_ATTN || qkv) ? (int64_t)c->n_head_kv * c->head_dim : c->w;
    const int64_t qd = (int64_t)c->n_head * c->head_dim;
    const uint32_t kvt = qkv ? c->kvtype : c->wtype;             /* K */
    const uint32_t vvt = qkv ? c->kvtype : c->vtype;             /* V */
    float *wq = NULL, *wk = NULL, *wv = NULL, *bq = NULL, *bk = NULL, *bv = NULL, *qn = NULL, *kn = NULL;
    g->n_layers = 1;
    g->kv_dim = kv_dim;
    int n_ctx = (int)(c->n_past + nt + 3);
    float *ins[4] = {0};
    int64_t in_n[4] = {0};
    double *want = NULL;
    int64_t out_n = 0;
    float *wf = NULL, *wf2 = NULL, *bias = NULL;
    float *hk = NULL, *hv = NULL; /* the KV history as stored, then the new rows */
    int32_t node = -1;
    mf_kv_pair kv = {-1, -1};
    int rc = 0;
    const bool typed = c->k == K_MATMUL || c->k == K_EMBED || c->k == K_FFN || c->k == K_KV || c->k == K_ATTN ||
                       c->k == K_QKV ||
                       (c->k == K_RMSNORM && c->wtype != MF_TYPE_COUNT);
    snprintf(label, cap, "%s w %lld nt %lld%s%s", kind_names[c->k], (long long)c->w, (long long)nt,
             typed ? " " : "", typed ? mf_type_name(c->wtype) : "");
    if (c->n_out) {
        size_t l = strlen(label);
        snprintf(label + l, cap - l, " n_out %lld", (long long)c->n_out);
    }
    if (c->inplace) {
        size_t l = strlen(label);
        snprintf(label + l, cap - l, " in-place");
    }
    if (c->n_rot || c->freq_scale > 0 || c->theta > 0 || c->rope_normal) {
        size_t l = strlen(label);
        snprintf(label + l, cap - l, " rope n_rot %d fs %g theta %g%s", rope_n_rot(c), rope_fs(c), rope_theta(c),
                 c->rope_normal ? " normal" : "");
    }
    if (c->k == K_KV || c->k == K_ATTN) {
        size_t l = strlen(label);
        snprintf(label + l, cap - l, " v %s%s%s", mf_type_name(c->vtype), c->k == K_KV && c->mode ? " load K" : "",
                 c->unfused ? " unfused" : "");
    }
    if (c->k == K_QKV || c->k == K_EPI) {
        size_t l = strlen(label);
        snprintf(label + l, cap - l, "%s kv %s%s", c->norm ? " norm" : "", mf_type_name(c->kvtype),
                 c->k == K_EPI && c->mode ? " no-pos" : "");
    }

    /* the graph: inputs, then the node under test */
    int32_t x = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, c->k == K_ATTN || c->k == K_EPI ? qd : c->w, nt);
    in_n[0] = mf_node_nelem(&g->nodes[x]);
    ins[0] = rand_vec(in_n[0], c->k == K_SOFTMAX ? 4.0f : 1.5f);
    switch (c->k) {
    case K_ADD: case K_MUL: case K_SWIGLU: {
        int32_t y = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, c->w, nt);
        in_n[1] = c->w * nt;
        ins[1] = rand_vec(in_n[1], 2.0f);
        node = c->k == K_ADD ? mf_g_add(g, x, y) : c->k == K_MUL ? mf_g_mul(g, x, y) : mf_g_swiglu(g, x, y);
        break;
    }
    case K_MUL_BCAST: {
        int32_t y = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, c->w, 1);
        in_n[1] = c->w;
        ins[1] = rand_vec(in_n[1], 2.0f);
        node = mf_g_mul(g, x, y);
        break;
    }
    case K_SCALE: node = mf_g_scale(g, x, -1.75f); break;
    case K_SILU: node = mf_g_silu(g, x); break;
    case K_RMSNORM:
        if (c->wtype != MF_TYPE_COUNT)
            wf = add_weight(&r, "norm", c->wtype, c->w, 1, 1.0f);
        node = mf_g_rmsnorm(g, x, c->wtype != MF_TYPE_COUNT ? "norm" : NULL, 1e-6f);
        break;
    case K_QKNORM:
        wf = add_weight(&r, "qn", MF_TYPE_F32, c->head_dim, 1, 1.0f);
        node = mf_g_qknorm(g, x, "qn", c->head_dim, 1e-6f);
        break;
    case K_MATMUL:
        wf = add_weight(&r, "mm", c->wtype, c->w, c->n_out, 0.5f);
        if (c->bias)
            bias = add_weight(&r, "mm.b", MF_TYPE_F32, c->n_out, 1, 1.0f);
        node = mf_g_matmul(g, x, "mm", c->wtype, c->bias ? "mm.b" : NULL, c->w, c->n_out);
        break;
    case K_EMBED: {
        wf = add_weight(&r, "emb", c->wtype, c->w, c->n_out, 1.0f);
        int32_t t = mf_g_input(g, MF_INPUT_TOKENS, MF_DTYPE_I32, nt, 1);
        node = mf_g_embed(g, t, "emb", c->wtype, c->w);
        /* the ids replace input 0 below */
        break;
    }
    case K_ROWS: node = mf_g_rows(g, x, 1, nt - 2); break;
    case K_ROPE: {
        int32_t pos = mf_g_input(g, MF_INPUT_POSITIONS, MF_DTYPE_I32, nt, 1);
        mf_rope_meta m = {.n_head = c->n_head, .head_dim = c->head_dim, .n_rot = rope_n_rot(c), .mode = c->mode,
                          .theta = rope_theta(c), .freq_scale = rope_fs(c)};
        node = mf_g_rope(g, x, pos, &m);
        break;
    }
    case K_SOFTMAX: node = mf_g_softmax(g, x, 0.7f); break;
    case K_VIEW: node = mf_g_view(g, x, 128, 896); break;
    case K_PERMUTE: {
        int32_t rs = mf_g_reshape(g, x, c->w / 14, 14 * nt);
        g->nodes[rs].ne[1] = 14;
        g->nodes[rs].ne[2] = nt;
        node = mf_g_permute(g, rs, (int32_t[]){1, 2, 0, 3});
        break;
    }
    case K_KV: {
        int32_t v = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, c->w, nt);
        in_n[1] = c->w * nt;
        ins[1] = rand_vec(in_n[1], 1.0f);
        int32_t st = mf_g_kv_store(g, x, v, 0);
        node = mf_g_kv_load(g, st, 0, c->mode ? 0 : 1, c->n_past + nt); /* V (mode 1: K) rows back */
        break;
    }
    case K_ATTN: {
        int32_t k = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, kv_dim, nt);
        int32_t v = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, kv_dim, nt);
        in_n[1] = in_n[2] = kv_dim * nt;
        ins[1] = rand_vec(in_n[1], 1.0f);
        ins[2] = rand_vec(in_n[2], 1.0f);
        int32_t st = mf_g_kv_store(g, k, v, 0);
        mf_attn_meta m = {.layer = 0, .n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = c->head_dim,
                          .scale = 1.0f / sqrtf((float)c->head_dim), .unfused = c->unfused};
        node = mf_g_attn(g, x, st, &m);
        break;
    }
    case K_FFN: {
        wf = add_weight(&r, "gate", c->wtype, c->w, c->n_out, 0.5f);
        wf2 = add_weight(&r, "up", c->wtype, c->w, c->n_out, 0.5f);
        mf_ffn_meta m = {.gate = {"gate", c->wtype, NULL, c->w, c->n_out}, .up = {"up", c->wtype, NULL, c->w, c->n_out}};
        node = mf_g_fused_ffn(g, x, &m);
        break;
    }
    case K_QKV: case K_EPI: {
        const uint32_t wt = c->k == K_QKV ? c->wtype : MF_TYPE_F32;
        if (c->k == K_QKV) {
            wq = add_weight(&r, "wq", wt, c->w, qd, 0.3f);
            wk = add_weight(&r, "wk", wt, c->w, kv_dim, 0.3f);
            wv = add_weight(&r, "wv", wt, c->w, kv_dim, 0.3f);
        }
        bq = add_weight(&r, "bq", MF_TYPE_F32, qd, 1, 0.5f);
        bk = add_weight(&r, "bk", MF_TYPE_F32, kv_dim, 1, 0.5f);
        if (c->k == K_EPI)
            bv = add_weight(&r, "bv", MF_TYPE_F32, kv_dim, 1, 0.5f);
        if (c->norm) {
            qn = add_weight(&r, "qn", MF_TYPE_F32, c->head_dim, 1, 1.0f);
            kn = add_weight(&r, "kn", MF_TYPE_F32, c->head_dim, 1, 1.0f);
        }
        mf_qkv_meta m = {.layer = 0, .n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = c->head_dim,
                         .norm_eps = 1e-6f, .q_norm = c->norm ? "qn" : NULL, .k_norm = c->norm ? "kn" : NULL};
        m.q = (mf_matmul_meta){"wq", wt, "bq", c->w, qd};
        m.k = (mf_matmul_meta){"wk", wt, "bk", c->w, kv_dim};
        m.v = (mf_matmul_meta){"wv", wt, c->k == K_EPI ? "bv" : NULL, c->w, kv_dim};
        m.rope_q = (mf_rope_meta){.n_head = c->n_head, .head_dim = c->head_dim, .n_rot = rope_n_rot(c),
                                  .mode = rope_mode(c), .theta = rope_theta(c), .freq_scale = rope_fs(c)};
        m.rope_k = m.rope_q;
        m.rope_k.n_head = c->n_head_kv;
        if (c->k == K_QKV) {
            int32_t pos = mf_g_input(g, MF_INPUT_POSITIONS, MF_DTYPE_I32, nt, 1);
            node = mf_g_fused_qkv(g, x, pos, &m);
        } else {
            int32_t k = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, kv_dim, nt);
            int32_t v = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, kv_dim, nt);
            in_n[1] = in_n[2] = kv_dim * nt;
            ins[1] = rand_vec(in_n[1], 1.5f);
            ins[2] = rand_vec(in_n[2], 1.5f);
            int32_t pos = c->mode ? -1 : mf_g_input(g, MF_INPUT_POSITIONS, MF_DTYPE_I32, nt, 1);
            node = mf_g_node(g, MF_OP_QKV_BIAS_ROPE_STORE, MF_DTYPE_F32, qd, nt, (int32_t[]){x, k, v, pos},
                             c->mode ? 3 : 4);
            g->nodes[node].meta.qkv = m;
            g->nodes[node].layer = 0;
        }
        break;
    }
    default: break;
    }
    g->nodes[node].flags |= MF_NODE_OUTPUT;
    mf_g_set_name(g, node, "out");
    const mf_node *n = &g->nodes[node];
    out_n = mf_node_nelem(n);
    if (mf_graph_validate(g, &r.err)) {
        printf("FAIL %s: the case's graph is invalid: %s\n", label, r.err.msg);
        rc = 0;
        goto done;
    }
    MF_ASSERT(!be->create(r.w, suite_options(be), &r.b, &r.err));
    /* nodes before `node` that run (the KV store of K_KV / K_ATTN) */
    bool refused = false;
    for (int32_t i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op != MF_OP_INPUT && g->nodes[i].op != MF_OP_RESHAPE && !mf_backend_supports_op(r.b, &g->nodes[i]))
            refused = true;
    /* the GPU backends keep K and V in one of f32 / f16 / q8_0 (the runtime
     * refuses the rest for them: mf_rt_check_gpu_kv) */
    if (be->is_gpu && (c->k == K_KV || c->k == K_ATTN) &&
        (kvt != vvt || (kvt != MF_TYPE_F32 && kvt != MF_TYPE_F16 && kvt != MF_TYPE_Q8_0)))
        refused = true;
    if (refused) {
        rc = -1;
        goto done;
    }

    /* inputs, KV regions, the poisoned output */
    int n_ext = 0;
    int32_t tok_ids[513], pos[513];
    for (int64_t t = 0; t < nt; t++) {
        tok_ids[t] = (int32_t)((t * 7919 + 13) % (c->n_out > 0 ? c->n_out : 1));
        pos[t] = c->n_past + (int32_t)t;
    }
    int32_t node_buf[64];
    for (int32_t i = 0; i < g->n_nodes && i < 64; i++) {
        node_buf[i] = -1;
        const mf_node *q = &g->nodes[i];
        if (q->op == MF_OP_INPUT) {
            const void *data = q->meta.input.kind == MF_INPUT_TOKENS ? (const void *)tok_ids
                               : q->meta.input.kind == MF_INPUT_POSITIONS ? (const void *)pos
                                                                          : (const void *)ins[n_ext++];
            node_buf[i] = buf_with(&r, data, mf_node_nbytes(q));
        } else if (q->op == MF_OP_RESHAPE) {
            node_buf[i] = node_buf[q->src[0]];
        }
    }
    if (c->k == K_KV || c->k == K_ATTN || qkv) {
        const size_t row = mf_type_row_size(kvt, kv_dim), vrow = mf_type_row_size(vvt, kv_dim);
        kv.k = r.b->ops->alloc_fresh(r.b, row * (size_t)n_ctx, &r.err);
        kv.v = r.b->ops->alloc_fresh(r.b, vrow * (size_t)n_ctx, &r.err);
        MF_ASSERT(kv.k >= 0 && kv.v >= 0);
        float *k0 = rand_vec(kv_dim * n_ctx, 1.0f), *v0 = rand_vec(kv_dim * n_ctx, 1.0f);
        void *q = malloc((row > vrow ? row : vrow) * (size_t)n_ctx);
        mf_quantize_rows(kvt, k0, q, n_ctx, kv_dim);
        r.b->ops->write_host(r.b, kv.k, 0, q, row * (size_t)n_ctx, &r.err);
        mf_quantize_rows(vvt, v0, q, n_ctx, kv_dim);
        r.b->ops->write_host(r.b, kv.v, 0, q, vrow * (size_t)n_ctx, &r.err);
        free(q);
        hk = through(kvt, k0, n_ctx, kv_dim);
        hv = through(vvt, v0, n_ctx, kv_dim);
        free(k0);
        free(v0);
    }
    if (c->k == K_KV || c->k == K_ATTN) {
        /* the store of this batch: rows n_past.. become the new K / V (as stored) */
        const float *nk = c->k == K_ATTN ? ins[1] : ins[0], *nv = c->k == K_ATTN ? ins[2] : ins[1];
        float *sk = through(kvt, nk, nt, kv_dim), *sv = through(vvt, nv, nt, kv_dim);
        memcpy(hk + c->n_past * kv_dim, sk, (size_t)(nt * kv_dim) * sizeof *hk);
        memcpy(hv + c->n_past * kv_dim, sv, (size_t)(nt * kv_dim) * sizeof *hv);
        free(sk);
        free(sv);
    }
    mf_exec_args args = {.n_past = c->n_past, .n_tokens = (int32_t)nt, .n_ctx = n_ctx, .k_type = kvt,
                         .v_type = vvt};
    if (c->k != K_KV && c->k != K_ATTN && !qkv)
        args.k_type = args.v_type = MF_TYPE_F32;
    for (int32_t i = 0; i < g->n_nodes && !rc; i++) {
        const mf_node *q = &g->nodes[i];
        if (q->op == MF_OP_INPUT || q->op == MF_OP_RESHAPE)
            continue;
        mf_node_call call = {.node = i, .in = {-1, -1, -1, -1}, .out = -1, .kv = {-1, -1}};
        for (int j = 0; j < q->n_src; j++)
            call.in[j] = node_buf[q->src[j]];
        if (mf_node_kv_layer(q) >= 0)
            call.kv = kv;
        if (mf_node_nbytes(q) > 0)
            call.out = (i == node && c->inplace && mf_node_nbytes(&g->nodes[q->src[0]]) == mf_node_nbytes(q))
                           ? call.in[0]
                           : poisoned(&r, mf_node_nbytes(q));
        node_buf[i] = call.out;
        if (mf_backend_execute_node(r.b, g, &call, &args, &r.err) || r.b->ops->synchronize(r.b, &r.err)) {
            printf("FAIL %s: %s\n", label, r.err.msg);
            goto done;
        }
    }
    float *got = malloc((size_t)out_n * sizeof *got);
    if (r.b->ops->read_host(r.b, node_buf[node], 0, got, (size_t)out_n * 4, &r.err)) {
        printf("FAIL %s: read back: %s\n", label, r.err.msg);
        free(got);
        goto done;
    }

    /* the reference */
    want = calloc((size_t)out_n, sizeof *want);
    const float *a = ins[0], *b1 = ins[1];
    const int64_t w = c->w;
    switch (c->k) {
    case K_ADD: for (int64_t i = 0; i < out_n; i++) want[i] = (double)a[i] + b1[i]; break;
    case K_MUL: for (int64_t i = 0; i < out_n; i++) want[i] = (double)a[i] * b1[i]; break;
    case K_MUL_BCAST: for (int64_t i = 0; i < out_n; i++) want[i] = (double)a[i] * b1[i % w]; break;
    case K_SCALE: for (int64_t i = 0; i < out_n; i++) want[i] = (double)a[i] * -1.75; break;
    case K_SILU: for (int64_t i = 0; i < out_n; i++) want[i] = silu(a[i]); break;
    case K_SWIGLU: for (int64_t i = 0; i < out_n; i++) want[i] = silu(a[i]) * b1[i]; break;
    case K_RMSNORM: case K_QKNORM: {
        const int64_t rw = c->k == K_QKNORM ? c->head_dim : w;
        for (int64_t r0 = 0; r0 < out_n / rw; r0++) {
            double ss = 0;
            for (int64_t i = 0; i < rw; i++)
                ss += (double)a[r0 * rw + i] * a[r0 * rw + i];
            double s = 1.0 / sqrt(ss / (double)rw + 1e-6);
            for (int64_t i = 0; i < rw; i++)
                want[r0 * rw + i] = a[r0 * rw + i] * s * (wf ? wf[i] : 1.0);
        }
        break;
    }
    case K_MATMUL:
        for (int64_t t = 0; t < nt; t++)
            for (int64_t o = 0; o < c->n_out; o++) {
                double s = bias ? bias[o] : 0.0;
                for (int64_t i = 0; i < w; i++)
                    s += (double)wf[o * w + i] * a[t * w + i];
                want[t * c->n_out + o] = s;
            }
        break;
    case K_FFN:
        for (int64_t t = 0; t < nt; t++)
            for (int64_t o = 0; o < c->n_out; o++) {
                double sg = 0, su = 0;
                for (int64_t i = 0; i < w; i++) {
                    sg += (double)wf[o * w + i] * a[t * w + i];
                    su += (double)wf2[o * w + i] * a[t * w + i];
                }
                want[t * c->n_out + o] = silu(sg) * su;
            }
        break;
    case K_EMBED:
        for (int64_t t = 0; t < nt; t++)
            for (int64_t i = 0; i < w; i++)
                want[t * w + i] = wf[tok_ids[t] * w + i];
        break;
    case K_ROWS: for (int64_t i = 0; i < out_n; i++) want[i] = a[w + i]; break;
    case K_ROPE:
        for (int64_t i = 0; i < out_n; i++)
            want[i] = a[i];
        rope_f64(want, nt, c->n_head, c->head_dim, rope_n_rot(c), c->n_past, c->mode, rope_theta(c), rope_fs(c));
        break;
    case K_SOFTMAX:
        for (int64_t r0 = 0; r0 < nt; r0++) {
            double mx = -INFINITY, sum = 0;
            for (int64_t i = 0; i < w; i++)
                mx = fmax(mx, 0.7 * a[r0 * w + i]);
            for (int64_t i = 0; i < w; i++)
                sum += exp(0.7 * a[r0 * w + i] - mx);
            for (int64_t i = 0; i < w; i++)
                want[r0 * w + i] = exp(0.7 * a[r0 * w + i] - mx) / sum;
        }
        break;
    case K_VIEW:
        for (int64_t t = 0; t < nt; t++)
            for (int64_t i = 0; i < 896; i++)
                want[t * 896 + i] = a[t * w + 128 + i];
        break;
    case K_PERMUTE: {
        /* src [w/14, 14, nt] -> out[i0, i1, i2] = src[i2, i0, i1] */
        const int64_t d0 = w / 14;
        for (int64_t i2 = 0; i2 < d0; i2++)
            for (int64_t i1 = 0; i1 < nt; i1++)
                for (int64_t i0 = 0; i0 < 14; i0++)
                    want[i0 + 14 * (i1 + nt * i2)] = a[i2 + d0 * (i0 + 14 * i1)];
        break;
    }
    case K_KV: for (int64_t i = 0; i < out_n; i++) want[i] = c->mode ? hk[i] : hv[i]; break;
    case K_ATTN: {
        const int hd = c->head_dim, nh = c->n_head, nkv = c->n_head_kv;
        double *s = malloc((size_t)n_ctx * sizeof *s);
        for (int64_t t = 0; t < nt; t++)
            for (int h = 0; h < nh; h++) {
                const int kh = h / (nh / nkv);
                const int64_t np = c->n_past + t + 1; /* causal */
                double mx = -INFINITY, sum = 0;
                for (int64_t p = 0; p < np; p++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++)
                        d += (double)a[(t * nh + h) * hd + i] * hk[p * kv_dim + kh * hd + i];
                    s[p] = d / sqrt((double)hd);
                    mx = fmax(mx, s[p]);
                }
                for (int64_t p = 0; p < np; p++)
                    sum += (s[p] = exp(s[p] - mx));
                for (int i = 0; i < hd; i++) {
                    double acc = 0;
                    for (int64_t p = 0; p < np; p++)
                        acc += s[p] / sum * hv[p * kv_dim + kh * hd + i];
                    want[(t * nh + h) * hd + i] = acc;
                }
            }
        free(s);
        break;
    }
    case K_QKV: case K_EPI: {
        /* q, k, v rows: the matmuls (or the given inputs) plus biases */
        double *q = calloc((size_t)(qd * nt), sizeof *q), *k = calloc((size_t)(kv_dim * nt), sizeof *k),
               *v = calloc((size_t)(kv_dim * nt), sizeof *v);
        for (int64_t t = 0; t < nt; t++) {
            for (int64_t o = 0; o < qd; o++) {
                double sq = bq[o];
                if (c->k == K_QKV)
                    for (int64_t i = 0; i < w; i++)
                        sq += (double)wq[o * w + i] * a[t * w + i];
                else
                    sq += a[t * qd + o];
                q[t * qd + o] = sq;
            }
            for (int64_t o = 0; o < kv_dim; o++) {
                double sk = bk[o], sv = bv ? bv[o] : 0.0;
                if (c->k == K_QKV)
                    for (int64_t i = 0; i < w; i++) {
                        sk += (double)wk[o * w + i] * a[t * w + i];
                        sv += (double)wv[o * w + i] * a[t * w + i];
                    }
                else {
                    sk += ins[1][t * kv_dim + o];
                    sv += ins[2][t * kv_dim + o];
                }
                k[t * kv_dim + o] = sk;
                v[t * kv_dim + o] = sv;
            }
        }
        if (c->norm) {
            double *vs[2] = {q, k};
            const float *nw[2] = {qn, kn};
            const int64_t nh[2] = {c->n_head, c->n_head_kv};
            for (int j = 0; j < 2; j++)
                for (int64_t r0 = 0; r0 < nt * nh[j]; r0++) {
                    double ss = 0, *h = vs[j] + r0 * c->head_dim;
                    for (int i = 0; i < c->head_dim; i++)
                        ss += h[i] * h[i];
                    double sc = 1.0 / sqrt(ss / c->head_dim + 1e-6);
                    for (int i = 0; i < c->head_dim; i++)
                        h[i] = h[i] * sc * nw[j][i];
                }
        }
        rope_f64(q, nt, c->n_head, c->head_dim, rope_n_rot(c), c->n_past, rope_mode(c), rope_theta(c), rope_fs(c));
        rope_f64(k, nt, c->n_head_kv, c->head_dim, rope_n_rot(c), c->n_past, rope_mode(c), rope_theta(c),
                 rope_fs(c));
        for (int64_t i = 0; i < out_n; i++)
            want[i] = q[i];
        /* the store: rows n_past.. of the regions hold k and v in the cache type */
        const size_t row = mf_type_row_size(kvt, kv_dim);
        void *raw = malloc(row * (size_t)n_ctx);
        float *st = malloc((size_t)(kv_dim * n_ctx) * sizeof *st);
        double *ws[2] = {k, v};
        const int32_t ids[2] = {kv.k, kv.v};
        /* the path's own rounding, then the cache type's */
        const double kvtol = fmax(tolerance(c, be), kvt == MF_TYPE_F32 ? 0 : kvt == MF_TYPE_F16 ? 2e-3 : 2e-2);
        for (int j = 0; j < 2 && rc == 0; j++) {
            if (r.b->ops->read_host(r.b, ids[j], 0, raw, row * (size_t)n_ctx, &r.err)) {
                printf("FAIL %s: reading the KV region back: %s\n", label, r.err.msg);
                rc = -2;
                break;
            }
            mf_dequantize_rows(kvt, raw, st, n_ctx, kv_dim);
            const float *hist = j ? hv : hk;
            double e = 0, m = max_abs(ws[j], kv_dim * nt);
            for (int64_t i = 0; i < kv_dim * n_ctx; i++) {
                const int64_t rrow = i / kv_dim;
                const double ref = rrow >= c->n_past && rrow < c->n_past + nt ? ws[j][i - c->n_past * kv_dim]
                                                                               : hist[i];
                double d = fabs(st[i] - ref);
                if (!(d <= e))
                    e = d;
            }
            if (!(e <= kvtol * m)) {
                printf("FAIL %s: stored %s rows off by %.3g (max %.3g, tolerance %.1g)\n", label, j ? "V" : "K", e, m,
                       kvtol);
                rc = -2;
            }
        }
        free(raw);
        free(st);
        free(q);
        free(k);
        free(v);
        break;
    }
    default: break;
    }
    if (rc == -2) { /* the KV check failed (said above) */
        rc = 0;
        free(got);
        goto done;
    }
    double err = 0, wm = max_abs(want, out_n);
    int64_t worst = 0;
    for (int64_t i = 0; i < out_n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= err)) { /* NaN (an unwritten or poisoned element) sticks */
            err = d;
            worst = i;
        }
    }
    const double tol = tolerance(c, be);
    rc = err <= tol * wm && wm > 0;
    for (int32_t i = 0; rc && i < g->n_nodes; i++)
        op_passed[g->nodes[i].op] = true;
    if (!rc)
        printf("FAIL %s: max |got - want| %.3g at %lld (got %.6g, want %.6g), max |want| %.3g, tolerance %.1g\n",
               label, err, (long long)worst, got[worst], want[worst], wm, tol);
    free(got);
done:
    free(hk);
    free(hv);
    free(want);
    for (int i = 0; i < 4; i++)
        free(ins[i]);
    free(wf);
    free(wf2);
    free(bias);
    free(wq), free(wk), free(wv), free(bq), free(bk), free(bv), free(qn), free(kn);
    mf_backend_free(r.b);
    mf_graph_free(&r.g);
    mf_weights_free(r.w);
    return rc;
}

/* ---- bad input: every backend refuses it with an error, never a wrong answer ---------- */

typedef enum ekind { E_TOKEN_RANGE, E_MISSING_WEIGHT, E_WEIGHT_SHAPE, E_ROPE_WIDTH, E_COUNT } ekind;
static const char *const ekind_names[E_COUNT] = {"error_token_range", "error_missing_weight",
                                                 "error_weight_shape", "error_rope_width"};

/* Runs error case k: 1 when the node fails naming the problem (need in the
 * message), 0 when it runs or fails without saying so, -1 when the backend
 * refuses the node (the engine then places it elsewhere, which is not a
 * wrong answer either). */
static int run_error_case(const mf_backend_entry *be, ekind k) {
    run r = {0};
    r.w = mf_weights_new();
    mf_graph_init(&r.g);
    mf_graph *g = &r.g;
    const char *need = "";
    int32_t ids[4] = {7, 0, 19, 7}, x = -1, node = -1, pos_in = -1;
    float *wf = NULL, *in[3] = {0};
    switch (k) {
    case E_TOKEN_RANGE: { /* a token id past the vocabulary of 20 */
        wf = add_weight(&r, "emb", MF_TYPE_F32, 256, 20, 1.0f);
        ids[1] = 20;
        x = mf_g_input(g, MF_INPUT_TOKENS, MF_DTYPE_I32, 4, 1);
        node = mf_g_embed(g, x, "emb", MF_TYPE_F32, 256);
        need = "token id";
        break;
    }
    case E_MISSING_WEIGHT: case E_WEIGHT_SHAPE: /* no such weight; a [64, 9] weight used as [64, 8] */
        wf = add_weight(&r, "mm64x9", MF_TYPE_F32, 64, 9, 1.0f);
        x = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, 64, 2);
        in[0] = rand_vec(128, 1.0f);
        node = mf_g_matmul(g, x, k == E_MISSING_WEIGHT ? "nope.weight" : "mm64x9", MF_TYPE_F32, NULL, 64, 8);
        need = k == E_MISSING_WEIGHT ? "nope.weight" : "64";
        break;
    case E_ROPE_WIDTH: { /* an attention-input rope over 3 heads of a 4-head q */
        for (int i = 0; i < 3; i++)
            in[i] = rand_vec(i ? 32 : 64, 1.0f);
        free(add_weight(&r, "bq", MF_TYPE_F32, 64, 1, 1.0f));
        free(add_weight(&r, "bk", MF_TYPE_F32, 32, 1, 1.0f));
        x = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, 64, 1);
        int32_t kk = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, 32, 1);
        int32_t vv = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, 32, 1);
        pos_in = mf_g_input(g, MF_INPUT_POSITIONS, MF_DTYPE_I32, 1, 1);
        node = mf_g_node(g, MF_OP_QKV_BIAS_ROPE_STORE, MF_DTYPE_F32, 64, 1, (int32_t[]){x, kk, vv, pos_in}, 4);
        mf_qkv_meta m = {.layer = 0, .n_head = 4, .n_head_kv = 2, .head_dim = 16, .norm_eps = 1e-6f};
        m.q = (mf_matmul_meta){"wq", MF_TYPE_F32, "bq", 64, 64};
        m.k = (mf_matmul_meta){"wk", MF_TYPE_F32, "bk", 64, 32};
        m.v = (mf_matmul_meta){"wv", MF_TYPE_F32, NULL, 64, 32};
        m.rope_q = (mf_rope_meta){.n_head = 3, .head_dim = 16, .n_rot = 16, .theta = 1e4f, .freq_scale = 1};
        m.rope_k = m.rope_q;
        m.rope_k.n_head = 2;
        g->nodes[node].meta.qkv = m;
        g->nodes[node].layer = 0;
        g->kv_dim = 32;
        need = "rope q";
        break;
    }
    default: break;
    }
    g->n_layers = 1;
    if (!g->kv_dim)
        g->kv_dim = 32;
    g->nodes[node].flags |= MF_NODE_OUTPUT;
    mf_g_set_name(g, node, "out");
    int rc = 0;
    if (mf_graph_validate(g, &r.err)) { /* caught before any backend: said, and named */
        rc = strstr(r.err.msg, need) != NULL;
        if (!rc)
            printf("FAIL %s: the graph check says '%s', not naming '%s'\n", ekind_names[k], r.err.msg, need);
        goto done;
    }
    MF_ASSERT(!be->create(r.w, suite_options(be), &r.b, &r.err));
    if (!mf_backend_supports_op(r.b, &g->nodes[node])) {
        rc = -1;
        goto done;
    }
    mf_node_call call = {.node = node, .in = {-1, -1, -1, -1}, .out = -1, .kv = {-1, -1}};
    int n_ext = 0;
    for (int j = 0; j < g->nodes[node].n_src; j++) {
        const mf_node *q = &g->nodes[g->nodes[node].src[j]];
        const void *data = q->meta.input.kind == MF_INPUT_TOKENS ? (const void *)ids
                           : q->meta.input.kind == MF_INPUT_POSITIONS ? (const void *)(int32_t[]){0}
                                                                      : (const void *)in[n_ext++];
        call.in[j] = buf_with(&r, data, mf_node_nbytes(q));
    }
    call.out = poisoned(&r, mf_node_nbytes(&g->nodes[node]));
    if (mf_node_kv_layer(&g->nodes[node]) >= 0) {
        call.kv.k = r.b->ops->alloc_fresh(r.b, 32 * 4 * 4, &r.err);
        call.kv.v = r.b->ops->alloc_fresh(r.b, 32 * 4 * 4, &r.err);
    }
    mf_exec_args args = {.n_past = 0, .n_tokens = (int32_t)g->nodes[node].ne[1], .n_ctx = 4, .k_type = MF_TYPE_F32, .v_type = MF_TYPE_F32};
    r.err.msg[0] = 0;
    int bad = mf_backend_execute_node(r.b, g, &call, &args, &r.err);
    if (!bad)
        bad = r.b->ops->synchronize(r.b, &r.err);
    rc = bad && strstr(r.err.msg, need) != NULL;
    if (!rc)
        printf("FAIL %s: %s\n", ekind_names[k],
               bad ? r.err.msg : "ran without an error");
    if (!rc && bad)
        printf("  (the message does not name '%s')\n", need);
done:
    free(wf);
    for (int i = 0; i < 3; i++)
        free(in[i]);
    mf_backend_free(r.b);
    mf_graph_free(&r.g);
    mf_weights_free(r.w);
    return rc;
}

int main(int argc, char **argv) {
    const char *filter = NULL;
    bool sweep = false, count_only = false;
    int shard = 0, n_shards = 1; /* --shard K/N: cases i with i % N == K (parallel processes) */
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--sweep"))
            sweep = true;
        else if (!strcmp(argv[i], "--shard") && i + 1 < argc) {
            if (sscanf(argv[++i], "%d/%d", &shard, &n_shards) != 2 || n_shards < 1 || shard < 0 ||
                shard >= n_shards) {
                fprintf(stderr, "test_ops: --shard wants K/N with 0 <= K < N, got '%s'\n", argv[i]);
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--count"))
            count_only = true;
        else if (argv[i][0] == '-') {
            fprintf(stderr, "test_ops: unknown option '%s' (--sweep, --count, --shard K/N)\n", argv[i]);
            return 2;
        } else
            filter = argv[i];
    }
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: test_ops BACKEND [FILTER] [--sweep] [--count]   (this build: %s)\n",
                mf_registry_names());
        return 2;
    }
    const mf_backend_entry *be = mf_registry_find(argv[1], strlen(argv[1]));
    if (!be) {
        fprintf(stderr, "test_ops: unknown backend '%s' (this build: %s)\n", argv[1], mf_registry_names());
        return 2;
    }
    make_cases();
    make_shape_cases();
    if (sweep)
        make_sweep_cases();
    int in_table = 0;
    for (int i = 0; i < n_cases; i++)
        in_table += !filter || strstr(kind_names[cases[i].k], filter) != NULL;
    for (int k = 0; k < E_COUNT; k++)
        in_table += !filter || strstr(ekind_names[k], filter) != NULL;
    if (count_only) { /* the table's size, nothing run (a backend may refuse some) */
        printf("test_ops %s%s: %d cases\n", be->name, sweep ? " --sweep" : "", in_table);
        return 0;
    }
    if (be->is_gpu) { /* skipped (77) without a usable device */
        mf_weights *w = mf_weights_new();
        mf_backend *b = NULL;
        mf_error err;
        if (be->create(w, suite_options(be), &b, &err)) {
            printf("test_ops %s: no usable device (%s)\n", be->name, err.msg);
            mf_weights_free(w);
            return 77;
        }
        mf_backend_free(b);
        mf_weights_free(w);
    }
    int pass = 0, fail = 0, not_run = 0;
    int per_kind_run[K_COUNT] = {0};
    char label[192];
    for (int i = 0; i < n_cases; i++) {
        if ((filter && !strstr(kind_names[cases[i].k], filter)) || i % n_shards != shard)
            continue;
        int rc = run_case(be, &cases[i], label, sizeof label);
        if (rc < 0) {
            not_run++;
            if (be->runs_every_op) {
                printf("FAIL %s: %s claims every op but refused this one\n", label, be->name);
                fail++;
            }
            continue;
        }
        per_kind_run[cases[i].k]++;
        if (rc)
            pass++;
        else
            fail++;
    }
    int err_run = 0;
    for (int k = 0; k < E_COUNT; k++) {
        if ((filter && !strstr(ekind_names[k], filter)) || k % n_shards != shard)
            continue;
        int rc = run_error_case(be, (ekind)k);
        if (rc < 0) {
            not_run++;
            continue;
        }
        err_run++;
        if (rc)
            pass++;
        else
            fail++;
    }
    /* every graph op has a case: a backend that runs every op passed one of
     * each (INPUT and RESHAPE run nowhere; ATTN_PAGED needs the batch path's
     * block tables: test_engine_paged) */
    if (!filter && n_shards == 1 && be->runs_every_op)
        for (int op = 0; op < MF_OP_COUNT; op++)
            if (!op_passed[op] && op != MF_OP_INPUT && op != MF_OP_RESHAPE && op != MF_OP_ATTN_PAGED) {
                printf("FAIL op %s: no case of the suite ran it\n", mf_op_name((mf_op)op));
                fail++;
            }
    for (int k = 0; k < K_COUNT; k++)
        printf("  %-20s %d run\n", kind_names[k], per_kind_run[k]);
    printf("  %-20s %d run\n", "bad input", err_run);
    printf("test_ops %s%s: %d cases: %d passed, %d failed, %d not run by this backend\n", be->name,
           sweep ? " --sweep" : "", pass + fail + not_run, pass, fail, not_run);
    free(cases);
    return fail || pass == 0 ? 1 : 0;
}
