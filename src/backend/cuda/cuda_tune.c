/* cuda_tune.c - the CUDA tuning: defaults per device, the tuning string's
 * parser, the selectors. */
#include "backend/cuda/cuda_tune.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mf_cuda_tune_defaults(mf_cuda_tune *t, int cc, int sm_count, size_t smem_per_block) {
    memset(t, 0, sizeof *t);
    t->cc = cc;
    t->sm_count = sm_count > 0 ? sm_count : 1;
    t->smem_per_block = smem_per_block;
    t->force = MF_CU_FORCE_NONE;
    /* the mma tier needs cc >= 8.0 (ldmatrix, mma.sync m16n8k16); below it wmma */
    t->mm_prefill = cc >= 80 ? MF_CU_MM_MMA : MF_CU_MM_WMMA;
    t->mma_min_nt = 64;
    t->paged_mma_min_nt = 9;
    t->mma_fuse = 1;
    t->mma_split = 1;
    t->gemv_q8 = 1;
    t->gemv = -1;
    t->v4 = -1;
    t->v4_q6k = -1;
    t->v4_big_mib = 32;
    t->v4_early = -1;
    t->v4_pf = -1;
    t->qkv_mix = 1;
    t->ffn_q8b = 1;
    t->fuse_gemv = 0;
    t->attn_prefill = cc >= 80 ? MF_CU_AP_MMA : MF_CU_AP_FLASH;
    t->attn_decode = MF_CU_AD_SHORT;
    t->attn_one_max = 384;
    t->short_rope = 1;
    t->attn_pf = 1;
    t->pdl = cc >= 90; /* programmatic dependent launch: Hopper and newer */
    t->zc = 1;
    t->slots = 1;
    t->repeat = 1;
    t->fuse_rope = 1;
    t->fuse_add = 1;
    t->fuse_norm = 1;
    t->norm_mm = 1;
}

void mf_cuda_tune_no_fusions(mf_cuda_tune *t) {
    t->fuse_rope = t->fuse_add = t->fuse_norm = t->norm_mm = 0;
    t->short_rope = 0;
    t->ffn_q8b = 0;
    t->fuse_gemv = 0;
}

/* One key: an int field at `off` (int64_t / uint64_t where wide), either a
 * number in [lo, hi] or one of `names` (value = index + base). */
typedef struct tkey {
    const char *key;
    size_t off;
    int width;          /* 4: int, 8: int64_t / uint64_t */
    long long lo, hi;   /* numbers accepted (lo > hi: none) */
    const char *names;  /* "a|b|c" accepted as base, base + 1, ... (NULL: none) */
    int base;
    const char *help;
} tkey;

#define OFF(f) offsetof(mf_cuda_tune, f)
static const tkey keys[] = {
    {"force", OFF(force), 4, -2, 3, "gemv_q8|gemv_f32|none|simt|wmma|mma", -2,
     "tests: this matmul family for every node it can run"},
    {"mm", OFF(mm_prefill), 4, 1, 0, "simt|wmma|mma", MF_CU_MM_SIMT, "prefill GEMM tier (default mma, cc >= 8.0)"},
    {"mma_min_nt", OFF(mma_min_nt), 4, 9, 1 << 20, NULL, 0, "tokens from which prefill takes the mma tier"},
    {"paged_mma_min_nt", OFF(paged_mma_min_nt), 4, 9, 1 << 20, NULL, 0, "... in a paged forward (many sequences)"},
    {"mma_fuse", OFF(mma_fuse), 4, 0, 1, NULL, 0, "prefill QKV and gate+up as one mma GEMM each"},
    {"mma_split", OFF(mma_split), 4, 0, 1, NULL, 0, "split-K for mma grids under half a wave"},
    {"mma_chunk", OFF(mma_chunk), 8, 0, (long long)1 << 40, NULL, 0,
     "f16 weight bytes per dequant + GEMM chunk (0: 320 MiB)"},
    {"gemv_q8", OFF(gemv_q8), 4, 0, 1, NULL, 0, "decode GEMVs on int8 activations (0: f32 reference tier)"},
    {"gemv", OFF(gemv), 4, 1, 0, "auto|v1|v3", -1, "int8 GEMV generation: the rule, or v1 / v3 everywhere"},
    {"v4", OFF(v4), 4, 0, 2, "auto", -1, "one-token v4 GEMV: auto, 0 off, 1 / 2 slices in flight everywhere"},
    {"v4_q6k", OFF(v4_q6k), 4, 0, 2, "auto", -1, "Q6_K on the v4 slice decoder: auto, 0 off, 1 / 2 slices"},
    {"v4_big", OFF(v4_big_mib), 4, 0, 1 << 20, NULL, 0, "MiB from which a Q4_K weight takes 2 slices"},
    {"v4_early", OFF(v4_early), 4, 0, 1, "auto", -1, "v4 early-load instances: auto (<= 4 MiB), 0, 1"},
    {"v4_pf", OFF(v4_pf), 4, 0, 2, "auto", -1, "v4 L2 prefetch before the PDL wait: auto, 0, 1, 2"},
    {"qkv_mix", OFF(qkv_mix), 4, 0, 1, NULL, 0, "a QKV with another V type as one v4 launch"},
    {"ffn_q8b", OFF(ffn_q8b), 4, 0, 1, NULL, 0, "the SwiGLU GEMV also quantizes for the down GEMV"},
    {"fuse_gemv", OFF(fuse_gemv), 4, 0, 1, NULL, 0, "QKV / gate+up as one int8 GEMV launch"},
    {"attn_prefill", OFF(attn_prefill), 4, 1, 0, "simt|flash|mma", MF_CU_AP_SIMT, "prefill attention kernel"},
    {"attn_decode", OFF(attn_decode), 4, 1, 0, "block|split|one|short", MF_CU_AD_BLOCK,
     "decode attention kernel while the context is short"},
    {"attn_one_max", OFF(attn_one_max), 8, 0, (long long)1 << 40, NULL, 0,
     "longest context for attn_decode one / short"},
    {"short_rope", OFF(short_rope), 4, 0, 1, NULL, 0, "one-token rope-store folded into the short attention"},
    {"attn_pf", OFF(attn_pf), 4, 0, 1, NULL, 0, "short attention prefetches old K/V rows"},
    {"short_warps", OFF(short_w4), 4, 1, 0, "12|4", 0, "warps a block of the short attention"},
    {"pdl", OFF(pdl), 4, 0, 1, NULL, 0, "programmatic dependent launch"},
    {"zc", OFF(zc), 4, 0, 1, NULL, 0, "the lm_head writes the logits to the host block itself"},
    {"slots", OFF(slots), 4, 0, 1, NULL, 0, "a recorded forward's small inputs through pinned slots"},
    {"repeat", OFF(repeat), 4, 0, 1, NULL, 0, "a replayed forward takes the recorded build's calls"},
    {"fuse_rope", OFF(fuse_rope), 4, 0, 1, NULL, 0, "FUSED_QKV's rope + K/V store as one kernel"},
    {"fuse_add", OFF(fuse_add), 4, 0, 1, NULL, 0, "MATMUL + residual ADD as one GEMV"},
    {"fuse_norm", OFF(fuse_norm), 4, 0, 1, NULL, 0, "RMSNORM folded into the next fused node"},
    {"norm_mm", OFF(norm_mm), 4, 0, 1, NULL, 0, "... and into a plain MATMUL (the lm_head)"},
};
#undef OFF
#define N_KEYS (sizeof keys / sizeof keys[0])

/* The index of `v` (length n) in "a|b|c", or -1. */
static int name_index(const char *names, const char *v, size_t n) {
    int i = 0;
    for (const char *p = names; p && *p; i++) {
        const char *bar = strchr(p, '|');
        const size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0)
            return i;
        if (!bar)
            break;
        p = bar + 1;
    }
    return -1;
}

static void put(mf_cuda_tune *t, const tkey *k, long long v) {
    char *p = (char *)t + k->off;
    if (k->width == 8)
        memcpy(p, &(int64_t){v}, 8);
    else
        memcpy(p, &(int){(int)v}, 4);
}

static void accepts(const tkey *k, char *buf, size_t n) {
    if (k->names && k->lo <= k->hi)
        snprintf(buf, n, "%s or %lld..%lld", k->names, k->lo, k->hi);
    else if (k->names)
        snprintf(buf, n, "%s", k->names);
    else
        snprintf(buf, n, "%lld..%lld", k->lo, k->hi);
}

/* One "key=value" of length n. */
static int parse_one(mf_cuda_tune *t, const char *s, size_t n, mf_error *err) {
    const char *eq = memchr(s, '=', n);
    if (!eq)
        return mf_errorf(err, "cuda tune: '%.*s' is not key=value", (int)n, s);
    const size_t kn = (size_t)(eq - s), vn = n - kn - 1;
    const char *v = eq + 1;
    for (size_t i = 0; i < N_KEYS; i++) {
        const tkey *k = &keys[i];
        if (strlen(k->key) != kn || strncmp(k->key, s, kn) != 0)
            continue;
        const int ni = k->names ? name_index(k->names, v, vn) : -1;
        if (ni >= 0) {
            put(t, k, (long long)ni + k->base);
            return 0;
        }
        char num[32];
        if (vn > 0 && vn < sizeof num && k->lo <= k->hi) {
            memcpy(num, v, vn);
            num[vn] = 0;
            char *end;
            const long long x = strtoll(num, &end, 10);
            if (*end == 0 && x >= k->lo && x <= k->hi) {
                put(t, k, x);
                return 0;
            }
        }
        char acc[96];
        accepts(k, acc, sizeof acc);
        return mf_errorf(err, "cuda tune: %.*s=%.*s: expected %s", (int)kn, s, (int)vn, v, acc);
    }
    return mf_errorf(err, "cuda tune: unknown key '%.*s' (mf_cuda_tune_help lists them; docs/ENV.md)", (int)kn, s);
}

int mf_cuda_tune_parse(mf_cuda_tune *t, const char *s, mf_error *err) {
    if (!s || !*s)
        return 0;
    mf_cuda_tune w = *t; /* all or nothing */
    for (const char *p = s;;) {
        const char *comma = strchr(p, ',');
        const size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n > 0 && parse_one(&w, p, n, err))
            return -1;
        if (!comma)
            break;
        p = comma + 1;
    }
    *t = w;
    return 0;
}

const char *mf_cuda_tune_help(void) {
    static char buf[4096];
    if (buf[0])
        return buf;
    size_t at = 0;
    for (size_t i = 0; i < N_KEYS && at < sizeof buf; i++) {
        char acc[96];
        accepts(&keys[i], acc, sizeof acc);
        const int w = snprintf(buf + at, sizeof buf - at, "%s=%s  %s\n", keys[i].key, acc, keys[i].help);
        if (w < 0)
            break;
        at += (size_t)w;
    }
    return buf;
}

mf_cu_mm_kind mf_cuda_sel_matmul(const mf_cuda_tune *t, int64_t nt, bool q8_ok) {
    switch (t->force) {
    case MF_CU_FORCE_GEMV_Q8: return MF_CU_MM_GEMV_Q8;
    case MF_CU_FORCE_GEMV_F32: return MF_CU_MM_GEMV_F32;
    case MF_CU_FORCE_SIMT: return MF_CU_MM_SIMT;
    case MF_CU_FORCE_WMMA: return MF_CU_MM_WMMA;
    case MF_CU_FORCE_MMA: return MF_CU_MM_MMA;
    default: break;
    }
    if (nt <= 8)
        return q8_ok && t->gemv_q8 ? MF_CU_MM_GEMV_Q8 : MF_CU_MM_GEMV_F32;
    if (t->mm_prefill == MF_CU_MM_MMA && nt < t->mma_min_nt)
        return MF_CU_MM_WMMA;
    return (mf_cu_mm_kind)t->mm_prefill;
}

mf_cu_ad_kind mf_cuda_sel_attn_decode(const mf_cuda_tune *t, int64_t n_ctx, bool short_ok) {
    const mf_cu_ad_kind k = (mf_cu_ad_kind)t->attn_decode;
    if (k == MF_CU_AD_BLOCK || k == MF_CU_AD_SPLIT)
        return k;
    if (n_ctx > t->attn_one_max)
        return MF_CU_AD_SPLIT;
    return k == MF_CU_AD_SHORT && short_ok ? MF_CU_AD_SHORT : MF_CU_AD_ONE;
}
