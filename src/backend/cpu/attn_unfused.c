/* attn_unfused.c - attention without the fused kernel (-fa off): the score
 * matrix materialized, softmaxed, then multiplied by V.
 *
 * The fused path (attn.c) walks one (token, head) at a time and never holds
 * more than one score row. Here a work item is a run of consecutive tokens
 * that read the same K/V rows (the whole batch of one sequence) times one
 * KV head: its K and V slices are dequantized once into f32 matrices, then
 * S = Q K^T * scale for all the run's query rows (tokens x the group's query
 * heads) by the context, positions past a token's own masked to -inf, a
 * softmax per row (mf_cpu_softmax), and O = S V. Items are independent and
 * each is computed by one thread in a fixed order, so the result does not
 * depend on the thread count. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels_isa.h"

typedef struct uf_job {
    const float *q;
    float *out;
    int32_t n_head, head_dim, group;
    int64_t kv_dim;
    const void *const *tk, *const *tv;
    const int64_t *tn;
    uint32_t k_type, v_type;
    float scale;
    const int64_t *run0;   /* [n_runs + 1]: first token of each run */
    int64_t n_runs;
    _Atomic int64_t next;
} uf_job;

static void uf_item(const uf_job *j, int64_t run, int32_t g) {
    const int64_t t0 = j->run0[run], t1 = j->run0[run + 1], hd = j->head_dim, e0 = (int64_t)g * hd;
    int64_t n_kv = 0;
    for (int64_t t = t0; t < t1; t++)
        n_kv = j->tn[t] > n_kv ? j->tn[t] : n_kv;
    const int64_t m = (t1 - t0) * j->group; /* query rows of the item */
    float *kf = mf_malloc(((size_t)(2 * n_kv * hd) + (size_t)(m * n_kv) + (size_t)hd) * sizeof *kf);
    float *vf = kf + n_kv * hd, *s = vf + n_kv * hd, *acc = s + m * n_kv;
    for (int64_t r = 0; r < n_kv; r++) {
        mf_cpu_kv_slice(j->k_type, j->tk[t0], j->kv_dim, r, e0, hd, kf + r * hd);
        mf_cpu_kv_slice(j->v_type, j->tv[t0], j->kv_dim, r, e0, hd, vf + r * hd);
    }
    /* S = Q K^T, causal mask */
    for (int64_t i = 0; i < m; i++) {
        const int64_t t = t0 + i / j->group, h = (int64_t)g * j->group + i % j->group;
        const float *q = j->q + (t * j->n_head + h) * hd;
        float *srow = s + i * n_kv;
        for (int64_t r = 0; r < n_kv; r++)
            srow[r] = r < j->tn[t] ? mf_cpu_dot_f32(q, kf + r * hd, hd) * j->scale : -INFINITY;
    }
    for (int64_t i = 0; i < m; i++)
        mf_cpu_softmax(s + i * n_kv, n_kv, 1.0f);
    /* O = S V */
    for (int64_t i = 0; i < m; i++) {
        const int64_t t = t0 + i / j->group, h = (int64_t)g * j->group + i % j->group;
        const float *srow = s + i * n_kv;
        for (int64_t d = 0; d < hd; d++)
            acc[d] = 0;
        for (int64_t r = 0; r < j->tn[t]; r++) {
            const float p = srow[r], *v = vf + r * hd;
            for (int64_t d = 0; d < hd; d++)
                acc[d] += p * v[d];
        }
        memcpy(j->out + (t * j->n_head + h) * hd, acc, (size_t)hd * sizeof *acc);
    }
    free(kf);
}

static void uf_worker(void *vjob, int ith, int nth) {
    uf_job *j = vjob;
    (void)ith;
    (void)nth;
    const int32_t n_kvh = j->n_head / j->group;
    const int64_t total = j->n_runs * n_kvh;
    for (;;) {
        const int64_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= total)
            break;
        uf_item(j, i / n_kvh, (int32_t)(i % n_kvh));
    }
}

void mf_cpu_attn_unfused(mf_cpu_ctx *c, const float *q, int64_t nt, int32_t n_head, int32_t n_head_kv,
                         int32_t head_dim, const void *const *tk, const void *const *tv, const int64_t *tn,
                         uint32_t k_type, uint32_t v_type, float scale, float *out) {
    MF_ASSERT(n_head_kv > 0 && n_head % n_head_kv == 0 && head_dim > 0);
    if (nt <= 0)
        return;
    int64_t *run0 = mf_malloc((size_t)(nt + 1) * sizeof *run0);
    int64_t n_runs = 0;
    for (int64_t t = 0; t < nt; t++)
        if (t == 0 || tk[t] != tk[t - 1] || tv[t] != tv[t - 1])
            run0[n_runs++] = t;
    run0[n_runs] = nt;
    uf_job job = {.q = q, .out = out, .n_head = n_head, .head_dim = head_dim, .group = n_head / n_head_kv,
                  .kv_dim = (int64_t)n_head_kv * head_dim, .tk = tk, .tv = tv, .tn = tn, .k_type = k_type,
                  .v_type = v_type, .scale = scale, .run0 = run0, .n_runs = n_runs};
    atomic_init(&job.next, 0);
    if (n_runs * n_head_kv == 1)
        uf_worker(&job, 0, 1);
    else
        mf_pool_run(mf_cpu_ctx_pool(c), uf_worker, &job);
    free(run0);
}
