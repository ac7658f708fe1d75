/* attn.c - KV cache rows (store/load in f32, f16, q8_0) and causal GQA
 * attention over the cache.
 *
 * A cache region is n_ctx rows of kv_dim elements; row r holds position r.
 * For q8_0 a row is kv_dim / 32 blocks, quantized with the same Q8_0 rounding
 * as the matmul activations. Attention computes, per (token, head), the full
 * score row over positions [0, n_past + t], a max-subtracted softmax in f32 and
 * the weighted sum of V rows; (token, head) pairs are spread over the pool and
 * each is computed by one thread in a fixed order, so the result does not
 * depend on the thread count. On AVX-512 with an f32/f16 cache and head_dim
 * % 16 == 0, a work item is (token, KV head) instead: its query heads share
 * each K/V row load (ops_avx512.c; a few ulps from the portable path). */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels_isa.h"

static size_t kv_row_bytes(uint32_t kv_type, int64_t kv_dim) {
    switch (kv_type) {
    case MF_TYPE_F32: return (size_t)kv_dim * 4;
    case MF_TYPE_F16: return (size_t)kv_dim * 2;
    case MF_TYPE_Q8_0:
        MF_ASSERT(kv_dim % MF_QK8_0 == 0);
        return (size_t)(kv_dim / MF_QK8_0) * sizeof(mf_block_q8_0);
    default: MF_ASSERT(!"unsupported KV cache type"); return 0;
    }
}

void mf_cpu_kv_store(uint32_t kv_type, void *cache, int64_t kv_dim, int64_t pos0,
                     const float *src, int64_t nt) {
    const size_t rb = kv_row_bytes(kv_type, kv_dim);
    for (int64_t t = 0; t < nt; t++) {
        uint8_t *dst = (uint8_t *)cache + (size_t)(pos0 + t) * rb;
        const float *s = src + t * kv_dim;
        if (kv_type == MF_TYPE_F32) {
            memcpy(dst, s, rb);
        } else if (kv_type == MF_TYPE_F16) {
            uint16_t *h = (uint16_t *)dst;
            for (int64_t i = 0; i < kv_dim; i++)
                h[i] = mf_fp32_to_fp16(s[i]);
        } else {
            mf_cpu_quantize_act(MF_TYPE_Q8_0, s, dst, kv_dim, MF_ISA_COUNT);
        }
    }
}

/* Elements [e0, e0 + len) of cache row r as floats into dst. */
static void kv_slice(uint32_t kv_type, const void *cache, size_t rb, int64_t r, int64_t e0,
                     int64_t len, float *dst) {
    const uint8_t *row = (const uint8_t *)cache + (size_t)r * rb;
    if (kv_type == MF_TYPE_F32) {
        memcpy(dst, (const float *)row + e0, (size_t)len * sizeof(float));
    } else if (kv_type == MF_TYPE_F16) {
        const uint16_t *h = (const uint16_t *)row + e0;
        for (int64_t i = 0; i < len; i++)
            dst[i] = mf_fp16_to_fp32(h[i]);
    } else {
        const mf_block_q8_0 *b = (const mf_block_q8_0 *)row;
        int64_t i = 0;
        while (i < len) {
            const int64_t e = e0 + i, blk = e / MF_QK8_0;
            const float d = mf_fp16_to_fp32(b[blk].d);
            const int64_t end = (blk + 1) * MF_QK8_0 - e0 < len ? (blk + 1) * MF_QK8_0 - e0 : len;
            for (; i < end; i++)
                dst[i] = d * (float)b[blk].qs[(e0 + i) % MF_QK8_0];
        }
    }
}

void mf_cpu_kv_load(uint32_t kv_type, const void *cache, int64_t kv_dim, int64_t n, float *dst) {
    const size_t rb = kv_row_bytes(kv_type, kv_dim);
    for (int64_t r = 0; r < n; r++)
        kv_slice(kv_type, cache, rb, r, 0, kv_dim, dst + r * kv_dim);
}

/* ==== attention ============================================================ */

typedef struct attn_job {
    const float *q;
    float *out;
    int64_t nt, n_past;
    int32_t n_head, head_dim, group; /* group: query heads per KV head */
    int64_t kv_dim;
    const void *k, *v;
    uint32_t kv_type;
    size_t rb;
    float scale;
    float *scratch; /* per thread: stride floats */
    size_t stride;
    bool avx512;    /* (token, KV head) groups through ops_avx512.c */
    int64_t ld;     /* its score row stride */
    _Atomic int64_t next;
} attn_job;

static void attn_one(const attn_job *j, int64_t t, int32_t h, float *scr) {
    const int64_t hd = j->head_dim, n_kv = j->n_past + t + 1;
    const int64_t e0 = (int64_t)(h / j->group) * hd;
    const float *q = j->q + (t * j->n_head + h) * hd;
    float *acc = scr, *row = scr + ((hd + 15) & ~15), *sc = row + ((hd + 15) & ~15);
    const bool f32 = j->kv_type == MF_TYPE_F32;

    float mx = -INFINITY;
    for (int64_t r = 0; r < n_kv; r++) {
        const float *k = row;
        if (f32)
            k = (const float *)((const uint8_t *)j->k + (size_t)r * j->rb) + e0;
        else
            kv_slice(j->kv_type, j->k, j->rb, r, e0, hd, row);
        sc[r] = mf_cpu_dot_f32(q, k, hd) * j->scale;
        mx = fmaxf(mx, sc[r]);
    }
    float sum = 0;
    for (int64_t r = 0; r < n_kv; r++) {
        sc[r] = expf(sc[r] - mx);
        sum += sc[r];
    }
    for (int64_t i = 0; i < hd; i++)
        acc[i] = 0;
    for (int64_t r = 0; r < n_kv; r++) {
        const float *v = row;
        if (f32)
            v = (const float *)((const uint8_t *)j->v + (size_t)r * j->rb) + e0;
        else
            kv_slice(j->kv_type, j->v, j->rb, r, e0, hd, row);
        const float p = sc[r];
        for (int64_t i = 0; i < hd; i++)
            acc[i] += p * v[i];
    }
    float *o = j->out + (t * j->n_head + h) * hd;
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < hd; i++)
        o[i] = acc[i] * inv;
}

#if MF_CPU_X86
/* All query heads of KV head g for token t (ops_avx512.c). */
static void attn_group(const attn_job *j, int64_t t, int32_t g, float *scr) {
    const int64_t hd = j->head_dim, h0 = (int64_t)g * j->group;
    const float *q = j->q + (t * j->n_head + h0) * hd;
    float *o = j->out + (t * j->n_head + h0) * hd;
    mf_cpu_attn_group_avx512(q, j->group, hd, j->k, j->v, j->kv_type == MF_TYPE_F16, j->rb, (int64_t)g * hd,
                             j->n_past + t + 1, j->scale, o, scr, j->ld);
}
#endif

static void attn_worker(void *vjob, int ith, int nth) {
    attn_job *j = vjob;
    (void)nth;
    float *scr = j->scratch + (size_t)ith * j->stride;
#if MF_CPU_X86
    if (j->avx512) {
        const int64_t n_kvh = j->n_head / j->group, total = j->nt * n_kvh;
        for (;;) {
            const int64_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
            if (i >= total)
                break;
            const int64_t k = total - 1 - i; /* longest rows first */
            attn_group(j, k / n_kvh, (int32_t)(k % n_kvh), scr);
        }
        return;
    }
#endif
    const int64_t total = j->nt * j->n_head;
    for (;;) {
        const int64_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= total)
            break;
        /* later tokens have longer rows: hand them out first */
        const int64_t k = total - 1 - i;
        attn_one(j, k / j->n_head, (int32_t)(k % j->n_head), scr);
    }
}

void mf_cpu_attn(mf_cpu_ctx *c, const float *q, int64_t nt, int32_t n_head, int32_t n_head_kv,
                 int32_t head_dim, const void *k_cache, const void *v_cache, uint32_t kv_type,
                 int64_t n_past, float scale, float *out) {
    MF_ASSERT(n_head_kv > 0 && n_head % n_head_kv == 0 && head_dim > 0);
    if (nt <= 0)
        return;
    attn_job *j = mf_calloc(1, sizeof *j);
    j->q = q;
    j->out = out;
    j->nt = nt;
    j->n_past = n_past;
    j->n_head = n_head;
    j->head_dim = head_dim;
    j->group = n_head / n_head_kv;
    j->kv_dim = (int64_t)n_head_kv * head_dim;
    j->k = k_cache;
    j->v = v_cache;
    j->kv_type = kv_type;
    j->rb = kv_row_bytes(kv_type, j->kv_dim);
    j->scale = scale;
    const int nth = mf_cpu_ctx_threads(c);
    j->ld = (n_past + nt + 15) & ~(int64_t)15;
    j->stride = 2 * (((size_t)head_dim + 15) & ~(size_t)15) + (size_t)j->ld;
    j->avx512 = mf_cpu_ctx_isa(c) == MF_ISA_AVX512 && head_dim % 16 == 0 &&
                (kv_type == MF_TYPE_F32 || kv_type == MF_TYPE_F16);
    if (j->avx512)
        j->stride = (size_t)j->group * (size_t)j->ld;
    j->scratch = mf_cpu_ctx_attn_scratch(c, j->stride * (size_t)nth);
    atomic_init(&j->next, 0);
    /* a short decode row is a microsecond of work: less than waking the pool */
    const bool small = (double)nt * (double)(n_past + nt) * n_head * head_dim < 65536.0;
    if (nt * n_head == 1 || (j->avx512 && (nt * n_head_kv == 1 || small)))
        attn_worker(j, 0, 1);
    else
        mf_pool_run(mf_cpu_ctx_pool(c), attn_worker, j);
    free(j);
}
