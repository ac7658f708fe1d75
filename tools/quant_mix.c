/* quant_mix.c - per-tensor type choice (see quant_mix.h for the rules). */
#include "quant_mix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- the names ------------------------------------------------------------ */

/* llama_ftype numbers (llama.h): ALL_F32 0, MOSTLY_F16 1, Q4_0 2, Q4_1 3,
 * Q8_0 7, Q5_0 8, Q5_1 9, Q2_K 10, Q3_K_S 11, Q3_K_M 12, Q3_K_L 13, Q4_K_S 14,
 * Q4_K_M 15, Q5_K_S 16, Q5_K_M 17, Q6_K 18, IQ4_NL 25, IQ4_XS 30, BF16 32. */
static const mf_quant_mix mixes[] = {
    {"f32", MF_MIX_UNIFORM, MF_TYPE_F32, 0, false},
    {"f16", MF_MIX_UNIFORM, MF_TYPE_F16, 1, false},
    {"bf16", MF_MIX_UNIFORM, MF_TYPE_BF16, 32, false},
    {"q4_0", MF_MIX_UNIFORM, MF_TYPE_Q4_0, 2, false},
    {"q4_1", MF_MIX_UNIFORM, MF_TYPE_Q4_1, 3, false},
    {"q5_0", MF_MIX_UNIFORM, MF_TYPE_Q5_0, 8, false},
    {"q5_1", MF_MIX_UNIFORM, MF_TYPE_Q5_1, 9, false},
    {"q8_0", MF_MIX_UNIFORM, MF_TYPE_Q8_0, 7, false},
    {"q2_K", MF_MIX_Q2_K, MF_TYPE_Q2_K, 10, false},
    {"q3_K", MF_MIX_UNIFORM, MF_TYPE_Q3_K, 11, false},
    {"q4_K", MF_MIX_UNIFORM, MF_TYPE_Q4_K, 14, false},
    {"q5_K", MF_MIX_UNIFORM, MF_TYPE_Q5_K, 16, false},
    {"q6_K", MF_MIX_UNIFORM, MF_TYPE_Q6_K, 18, false},
    {"iq4_nl", MF_MIX_UNIFORM, MF_TYPE_IQ4_NL, 25, false},
    {"iq4_xs", MF_MIX_UNIFORM, MF_TYPE_IQ4_XS, 30, false},
    {"Q3_K_S", MF_MIX_Q3_K_S, MF_TYPE_Q3_K, 11, false},
    {"Q3_K_M", MF_MIX_Q3_K_M, MF_TYPE_Q3_K, 12, false},
    {"Q3_K_L", MF_MIX_Q3_K_L, MF_TYPE_Q3_K, 13, false},
    {"Q4_K_S", MF_MIX_Q4_K_S, MF_TYPE_Q4_K, 14, false},
    {"Q4_K_M", MF_MIX_Q4_K_M, MF_TYPE_Q4_K, 15, false},
    {"Q5_K_S", MF_MIX_Q5_K_S, MF_TYPE_Q5_K, 16, false},
    {"Q5_K_M", MF_MIX_Q5_K_M, MF_TYPE_Q5_K, 17, false},
};
#define N_MIXES (sizeof mixes / sizeof mixes[0])

const char *mf_quant_mix_names(void) {
    return "f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q3_K q4_K q5_K q6_K iq4_nl iq4_xs, mixes Q2_K Q3_K_S "
           "Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M (Q6_K, Q8_0 = q6_K, q8_0)";
}

int mf_quant_mix_parse(const char *name, mf_quant_mix *out, mf_error *err) {
    for (size_t i = 0; i < N_MIXES; i++) {
        if (!strcasecmp(name, mixes[i].name)) {
            *out = mixes[i];
            return 0;
        }
    }
    return mf_errorf(err, "unknown type '%s' (valid: %s)", name, mf_quant_mix_names());
}

/* ---- the rules ---------------------------------------------------------------- */

int mf_tensor_layer(const char *name) {
    if (strncmp(name, "blk.", 4) != 0)
        return -1;
    char *end = NULL;
    long v = strtol(name + 4, &end, 10);
    if (end == name + 4 || *end != '.' || v < 0 || v > 1000000)
        return -1;
    return (int)v;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* llama.cpp's use_more_bits: the first and last eighth of the layers get more
 * bits, and every third layer in between. */
static bool use_more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static bool is_k_quant(uint32_t t) {
    return t == MF_TYPE_Q2_K || t == MF_TYPE_Q3_K || t == MF_TYPE_Q4_K || t == MF_TYPE_Q5_K ||
           t == MF_TYPE_Q6_K;
}

static uint32_t rule_type(const mf_quant_mix *mix, const mf_mix_model *m, const char *name,
                          int64_t ne0) {
    uint32_t t = mix->base;
    const mf_type_traits *tr = mf_type_get(t);
    if (mix->pure || !tr || !tr->is_quantized)
        return t;
    if (!strcmp(name, "output.weight") || (!m->has_output && !strcmp(name, "token_embd.weight")))
        return (ne0 % MF_QK_K != 0 || t == MF_TYPE_Q8_0) ? MF_TYPE_Q8_0 : MF_TYPE_Q6_K;
    int il = mf_tensor_layer(name);
    int nl = m->n_layer;
    if (il < 0 || nl <= 0)
        return t;
    if (ends_with(name, "attn_v.weight")) {
        switch (mix->kind) {
        case MF_MIX_Q2_K: return m->n_gqa >= 4 ? MF_TYPE_Q4_K : MF_TYPE_Q3_K;
        case MF_MIX_Q3_K_M: return il < 2 ? MF_TYPE_Q5_K : MF_TYPE_Q4_K;
        case MF_MIX_Q3_K_L: return MF_TYPE_Q5_K;
        case MF_MIX_Q4_K_M:
        case MF_MIX_Q5_K_M: return use_more_bits(il, nl) ? MF_TYPE_Q6_K : t;
        case MF_MIX_Q4_K_S: return il < 4 ? MF_TYPE_Q5_K : t;
        default: return t;
        }
    }
    if (ends_with(name, "ffn_down.weight")) {
        switch (mix->kind) {
        case MF_MIX_Q2_K: return MF_TYPE_Q3_K;
        case MF_MIX_Q3_K_M: return il < nl / 16 ? MF_TYPE_Q5_K : MF_TYPE_Q4_K;
        case MF_MIX_Q3_K_L: return MF_TYPE_Q5_K;
        case MF_MIX_Q4_K_M:
        case MF_MIX_Q5_K_M: return use_more_bits(il, nl) ? MF_TYPE_Q6_K : t;
        case MF_MIX_Q4_K_S: return il < nl / 8 ? MF_TYPE_Q5_K : t;
        default: return t;
        }
    }
    if (ends_with(name, "attn_output.weight")) {
        if (mix->kind == MF_MIX_Q2_K)
            return MF_TYPE_Q3_K;
        if (mix->kind == MF_MIX_Q3_K_M)
            return MF_TYPE_Q4_K;
        if (mix->kind == MF_MIX_Q3_K_L)
            return MF_TYPE_Q5_K;
    }
    return t;
}

uint32_t mf_quant_mix_choose(const mf_quant_mix *mix, const mf_mix_model *model,
                             const char *name, uint32_t n_dims, int64_t ne0, char *note,
                             size_t note_len) {
    if (note && note_len)
        note[0] = '\0';
    if (n_dims < 2)
        return MF_TYPE_F32;
    uint32_t want = rule_type(mix, model, name, ne0);
    uint32_t t = want;
    if (is_k_quant(t) && ne0 % MF_QK_K != 0) {
        switch (t) {
        case MF_TYPE_Q4_K: t = MF_TYPE_Q5_0; break;
        case MF_TYPE_Q5_K: t = MF_TYPE_Q5_1; break;
        case MF_TYPE_Q6_K: t = MF_TYPE_Q8_0; break;
        default: t = MF_TYPE_Q4_0; break;
        }
    }
    if (t == MF_TYPE_IQ4_XS && ne0 % MF_QK_K != 0)
        t = MF_TYPE_IQ4_NL; /* the same codebook in blocks of 32 */
    const mf_type_traits *tr = mf_type_get(t);
    if (tr && ne0 % tr->block_size != 0)
        t = MF_TYPE_F16;
    if (t != want && note && note_len)
        snprintf(note, note_len, "row %lld %% %lld: %s -> %s", (long long)ne0,
                 (long long)mf_type_get(want)->block_size, mf_type_name(want), mf_type_name(t));
    return t;
}

/* ---- row conversion ------------------------------------------------------------ */

typedef struct {
    uint32_t type;
    const float *src;
    void *dst;
    int64_t nrows, n;
    size_t row_bytes;
} convert_job;

static void convert_rows(uint32_t type, const float *src, void *dst, int64_t nrows, int64_t n) {
    int64_t total = nrows * n;
    switch (type) {
    case MF_TYPE_F32: memcpy(dst, src, (size_t)total * sizeof(float)); break;
    case MF_TYPE_F16: {
        mf_fp16 *d = dst;
        for (int64_t i = 0; i < total; i++)
            d[i] = mf_fp32_to_fp16(src[i]);
        break;
    }
    case MF_TYPE_BF16: {
        mf_bf16 *d = dst;
        for (int64_t i = 0; i < total; i++)
            d[i] = mf_fp32_to_bf16(src[i]);
        break;
    }
    default: mf_quantize_rows(type, src, dst, nrows, n); break;
    }
}

static void convert_worker(void *ctx, int ith, int nth) {
    const convert_job *j = ctx;
    int64_t r0 = j->nrows * ith / nth, r1 = j->nrows * (ith + 1) / nth;
    if (r1 > r0)
        convert_rows(j->type, j->src + r0 * j->n, (uint8_t *)j->dst + (size_t)r0 * j->row_bytes,
                     r1 - r0, j->n);
}

void mf_tools_from_float(mf_pool *pool, uint32_t type, const float *src, void *dst,
                         int64_t nrows, int64_t n) {
    convert_job j = {type, src, dst, nrows, n, mf_type_row_size(type, n)};
    MF_ASSERT(j.row_bytes > 0);
    if (pool && nrows > 1)
        mf_pool_run(pool, convert_worker, &j);
    else
        convert_worker(&j, 0, 1);
}

int mf_tools_to_float(uint32_t type, const void *src, float *dst, int64_t nrows, int64_t n) {
    int64_t total = nrows * n;
    switch (type) {
    case MF_TYPE_F32: memcpy(dst, src, (size_t)total * sizeof(float)); return 0;
    case MF_TYPE_F16: {
        const mf_fp16 *s = src;
        for (int64_t i = 0; i < total; i++)
            dst[i] = mf_fp16_to_fp32(s[i]);
        return 0;
    }
    case MF_TYPE_BF16: {
        const mf_bf16 *s = src;
        for (int64_t i = 0; i < total; i++)
            dst[i] = mf_bf16_to_fp32(s[i]);
        return 0;
    }
    default: return -1;
    }
}
