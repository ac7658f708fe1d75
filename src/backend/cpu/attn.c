/* attn.c - KV cache rows (store/load in f32, f16 and the 32-element block
 * types q8_0, q4_0, q4_1, q5_0, q5_1) and causal GQA attention over the cache.
 *
 * A cache region is n_ctx rows of kv_dim elements; row r holds position r.
 * K and V regions may have different types. For q8_0 a row is kv_dim / 32
 * blocks, quantized with the same Q8_0 rounding as the matmul activations;
 * the 4/5-bit types use the reference quantizer of src/quant. A head of
 * head_dim % 32 == 0 is whole blocks, so a head's slice dequantizes alone.
 *
 * Attention computes, per (token, head), the full score row over positions
 * [0, n_past + t], a max-subtracted softmax in f32 and the weighted sum of V
 * rows; (token, head) pairs are spread over the pool and each is computed by
 * one thread in a fixed order, so the result does not depend on the thread
 * count. On AVX-512 with K and V both f32 or both f16 and head_dim % 16 == 0,
 * a work item is (token, KV head) instead: its query heads share each K/V row
 * load (ops_avx512.c; a few ulps from the portable path). The unfused form
 * (-fa off) is attn_unfused.c. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels_isa.h"

static size_t kv_row_bytes(uint32_t kv_type, int64_t kv_dim) {
    MF_ASSERT(mf_kv_type_ok(kv_type));
    const size_t rb = mf_type_row_size(kv_type, kv_dim);
    MF_ASSERT(rb > 0); /* block types: kv_dim % 32 == 0, checked by the engine */
    return rb;
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
        } else if (kv_type == MF_TYPE_Q8_0) {
            mf_cpu_quantize_act(MF_TYPE_Q8_0, s, dst, kv_dim, MF_ISA_COUNT);
        } else {
            mf_type_get(kv_type)->from_float(s, dst, kv_dim);
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
    } else if (kv_type == MF_TYPE_Q8_0) {
        const mf_block_q8_0 *b = (const mf_block_q8_0 *)row;
        int64_t i = 0;
        while (i < len) {
            const int64_t e = e0 + i, blk = e / MF_QK8_0;
            const float d = mf_fp16_to_fp32(b[blk].d);
            const int64_t end = (blk + 1) * MF_QK8_0 - e0 < len ? (blk + 1) * MF_QK8_0 - e0 : len;
            for (; i < end; i++)
                dst[i] = d * (float)b[blk].qs[(e0 + i) % MF_QK8_0];
        }
    } else {
        /* 4/5-bit blocks of 32: a head's slice is whole blocks */
        const mf_type_traits *tt = mf_type_get(kv_type);
        MF_ASSERT(e0 % tt->block_size == 0 && len % tt->block_size == 0);
        tt->to_float(row + (size_t)(e0 / tt->block_size) * tt->type_size, dst, len);
    }
}

void mf_cpu_kv_slice(uint32_t kv_type, const void *cache, int64_t kv_dim, int64_t r, int64_t e0,
                     int64_t len, float *dst) {
    kv_slice(kv_type, cache, kv_row_bytes(kv_type, kv_dim), r, e0, len, dst);
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
    uint32_t k_type, v_type;
    size_t rbk, rbv; /* row bytes of K / V */
    float scale;
    float *scratch; /* per thread: stride floats */
    size_t stride;
    bool avx512;    /* (token, KV head) groups through ops_avx512.c */
    int64_t ld;     /* its score row stride */
    /* paged: token t reads rows [0, tn[t]) at tk[t] / tv[t] (its sequence's
     * rows, contiguous); NULL: the one context at k / v, n_past + t + 1 rows */
    const void *const *tk, *const *tv;
    const int64_t *tn;
    _Atomic int64_t next;
} attn_job;

/* Token t's K/V rows and their count: the same arithmetic for a sequence
 * alone and in a batch, so its result does not depend on the batch. */
static void tok_kv(const attn_job *j, int64_t t, const void **k, const void **v, int64_t *n_kv) {
    if (j->tk) {
        *k = j->tk[t];
        *v = j->tv[t];
        *n_kv = j->tn[t];
    } else {
        *k = j->k;
        *v = j->v;
        *n_kv = j->n_past + t + 1;
    }
}

static void attn_one(const attn_job *j, int64_t t, int32_t h, float *scr) {
    const int64_t hd = j->head_dim;
    const int64_t e0 = (int64_t)(h / j->group) * hd;
    const float *q = j->q + (t * j->n_head + h) * hd;
    float *acc = scr, *row = scr + ((hd + 15) & ~15), *sc = row + ((hd + 15) & ~15);
    const bool f32k = j->k_type == MF_TYPE_F32, f32v = j->v_type == MF_TYPE_F32;
    const void *kc, *vc;
    int64_t n_kv;
    tok_kv(j, t, &kc, &vc, &n_kv);

    float mx = -INFINITY;
    for (int64_t r = 0; r < n_kv; r++) {
        const float *k = row;
        if (f32k)
            k = (const float *)((const uint8_t *)kc + (size_t)r * j->rbk) + e0;
        else
            kv_slice(j->k_type, kc, j->rbk, r, e0, hd, row);
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
        if (f32v)
            v = (const float *)((const uint8_t *)vc + (size_t)r * j->rbv) + e0;
        else
            kv_slice(j->v_type, vc, j->rbv, r, e0, hd, row);
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
    const void *kc, *vc;
    int64_t n_kv;
    tok_kv(j, t, &kc, &vc, &n_kv);
    mf_cpu_attn_group_avx512(q, j->group, hd, kc, vc, j->k_type == MF_TYPE_F16, j->rbk, (int64_t)g * hd,
                             n_kv, j->scale, o, scr, j->ld);
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

/* Fills the job for nt tokens whose longest row has max_kv positions and
 * runs it on the pool (or inline when it is too small to wake the pool). */
static void attn_run(mf_cpu_ctx *c, attn_job *j, const float *q, int64_t nt, int32_t n_head,
                     int32_t n_head_kv, int32_t head_dim, uint32_t k_type, uint32_t v_type,
                     int64_t max_kv, float scale, float *out) {
    j->q = q;
    j->out = out;
    j->nt = nt;
    j->n_head = n_head;
    j->head_dim = head_dim;
    j->group = n_head / n_head_kv;
    j->kv_dim = (int64_t)n_head_kv * head_dim;
    j->k_type = k_type;
    j->v_type = v_type;
    j->rbk = kv_row_bytes(k_type, j->kv_dim);
    j->rbv = kv_row_bytes(v_type, j->kv_dim);
    j->scale = scale;
    const int nth = mf_cpu_ctx_threads(c);
    j->ld = (max_kv + 15) & ~(int64_t)15;
    j->stride = 2 * (((size_t)head_dim + 15) & ~(size_t)15) + (size_t)j->ld;
    /* the group kernel reads K and V with one element type and row stride */
    j->avx512 = mf_cpu_ctx_isa(c) == MF_ISA_AVX512 && head_dim % 16 == 0 && k_type == v_type &&
                (k_type == MF_TYPE_F32 || k_type == MF_TYPE_F16);
    if (j->avx512)
        j->stride = (size_t)j->group * (size_t)j->ld;
    j->scratch = mf_cpu_ctx_attn_scratch(c, j->stride * (size_t)nth);
    atomic_init(&j->next, 0);
    /* a short decode row is a microsecond of work: less than waking the
     * pool (on every ISA; which thread computes a (token, head) does not
     * change its bits) */
    const bool small = (double)nt * (double)max_kv * n_head * head_dim < 65536.0;
    if (nt * n_head == 1 || small || (j->avx512 && nt * n_head_kv == 1))
        attn_worker(j, 0, 1);
    else
        mf_pool_run(mf_cpu_ctx_pool(c), attn_worker, j);
}

void mf_cpu_attn(mf_cpu_ctx *c, const float *q, int64_t nt, int32_t n_head, int32_t n_head_kv,
                 int32_t head_dim, const void *k_cache, const void *v_cache, uint32_t k_type,
                 uint32_t v_type, int64_t n_past, float scale, bool unfused, float *out) {
    MF_ASSERT(n_head_kv > 0 && n_head % n_head_kv == 0 && head_dim > 0);
    if (nt <= 0)
        return;
    if (unfused) {
        const void **tk = mf_malloc((size_t)nt * 2 * sizeof *tk), **tv = tk + nt;
        int64_t *tn = mf_malloc((size_t)nt * sizeof *tn);
        for (int64_t t = 0; t < nt; t++) {
            tk[t] = k_cache;
            tv[t] = v_cache;
            tn[t] = n_past + t + 1;
        }
        mf_cpu_attn_unfused(c, q, nt, n_head, n_head_kv, head_dim, tk, tv, tn, k_type, v_type, scale, out);
        free(tk);
        free(tn);
        return;
    }
    attn_job *j = mf_calloc(1, sizeof *j);
    j->n_past = n_past;
    j->k = k_cache;
    j->v = v_cache;
    attn_run(c, j, q, nt, n_head, n_head_kv, head_dim, k_type, v_type, n_past + nt, scale, out);
    free(j);
}

/* ==== paged attention ======================================================= */

static int64_t paged_row(const mf_cpu_paged *pg, int32_t s, int64_t p) {
    return (int64_t)pg->tables[s][p / pg->block_size] * pg->block_size + p % pg->block_size;
}

void mf_cpu_attn_paged(mf_cpu_ctx *c, const mf_cpu_paged *pg, const float *q, const float *k_new,
                       const float *v_new, int64_t nt, int32_t n_head, int32_t n_head_kv,
                       int32_t head_dim, void *k_cache, void *v_cache, uint32_t k_type,
                       uint32_t v_type, float scale, bool unfused, float *out) {
    MF_ASSERT(n_head_kv > 0 && n_head % n_head_kv == 0 && head_dim > 0 && pg->block_size > 0);
    if (nt <= 0)
        return;
    const int64_t kv_dim = (int64_t)n_head_kv * head_dim;
    const size_t rbk = kv_row_bytes(k_type, kv_dim), rbv = kv_row_bytes(v_type, kv_dim);
    /* every token's row is written before any token reads: a prefill chunk
     * sees its own earlier tokens */
    for (int64_t t = 0; t < nt; t++) {
        const int64_t r = paged_row(pg, pg->seq[t], pg->pos[t]);
        mf_cpu_kv_store(k_type, k_cache, kv_dim, r, k_new + t * kv_dim, 1);
        mf_cpu_kv_store(v_type, v_cache, kv_dim, r, v_new + t * kv_dim, 1);
    }
    /* Per sequence of the batch: its rows [0, max pos] contiguous, in place
     * when its blocks follow each other in the pool, else gathered (bytes
     * copied as stored, so the values are the same either way). */
    int64_t *need = mf_calloc((size_t)pg->n_seqs, sizeof *need);
    for (int64_t t = 0; t < nt; t++)
        if (pg->pos[t] + 1 > need[pg->seq[t]])
            need[pg->seq[t]] = pg->pos[t] + 1;
    const void **sk = mf_calloc((size_t)pg->n_seqs * 2, sizeof *sk), **sv = sk + pg->n_seqs;
    uint8_t **own = mf_calloc((size_t)pg->n_seqs, sizeof *own);
    int64_t max_kv = 1;
    for (int32_t s = 0; s < pg->n_seqs; s++) {
        const int64_t n = need[s];
        if (n == 0)
            continue;
        max_kv = n > max_kv ? n : max_kv;
        const int64_t nb = (n + pg->block_size - 1) / pg->block_size;
        bool contiguous = true;
        for (int64_t b = 1; b < nb && contiguous; b++)
            contiguous = pg->tables[s][b] == pg->tables[s][0] + b;
        const size_t base = (size_t)pg->tables[s][0] * (size_t)pg->block_size;
        if (contiguous) {
            sk[s] = (const uint8_t *)k_cache + base * rbk;
            sv[s] = (const uint8_t *)v_cache + base * rbv;
            continue;
        }
        own[s] = mf_malloc((size_t)n * (rbk + rbv));
        for (int64_t b = 0; b < nb; b++) {
            const int64_t r0 = b * pg->block_size;
            const int64_t len = n - r0 < pg->block_size ? n - r0 : pg->block_size;
            const size_t src = (size_t)pg->tables[s][b] * (size_t)pg->block_size;
            memcpy(own[s] + (size_t)r0 * rbk, (const uint8_t *)k_cache + src * rbk, (size_t)len * rbk);
            memcpy(own[s] + (size_t)n * rbk + (size_t)r0 * rbv, (const uint8_t *)v_cache + src * rbv,
                   (size_t)len * rbv);
        }
        sk[s] = own[s];
        sv[s] = own[s] + (size_t)n * rbk;
    }
    attn_job *j = mf_calloc(1, sizeof *j);
    const void **tk = mf_malloc((size_t)nt * 2 * sizeof *tk), **tv = tk + nt;
    int64_t *tn = mf_malloc((size_t)nt * sizeof *tn);
    for (int64_t t = 0; t < nt; t++) {
        tk[t] = sk[pg->seq[t]];
        tv[t] = sv[pg->seq[t]];
        tn[t] = pg->pos[t] + 1;
    }
    j->tk = tk;
    j->tv = tv;
    j->tn = tn;
    if (unfused)
        mf_cpu_attn_unfused(c, q, nt, n_head, n_head_kv, head_dim, tk, tv, tn, k_type, v_type, scale, out);
    else
        attn_run(c, j, q, nt, n_head, n_head_kv, head_dim, k_type, v_type, max_kv, scale, out);
    free(j);
    free(tk);
    free(tn);
    for (int32_t s = 0; s < pg->n_seqs; s++)
        free(own[s]);
    free(own);
    free(sk);
    free(need);
}
