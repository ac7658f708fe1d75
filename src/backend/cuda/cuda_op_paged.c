/* cuda_op_paged.c - the executor of ATTN_PAGED: the forward's batch
 * (mf_kv_batch) turned into the kernels' work list (paged.h) and uploaded
 * once per forward into the backend's own device buffer, then the store,
 * attention and combine launches (attn_paged.cu) per layer.
 *
 * Work list: consecutive tokens of one sequence form a tile of at most
 * MF_CU_PAGED_ROWS / gqa tokens (a decode step: one token a tile; a prefill
 * chunk: tiles of a few tokens sharing each K/V chunk). When tiles x KV
 * heads would leave the GPU's SMs idle (few sequences, long contexts) each
 * tile's KV range is split into pieces of at least two chunks, written as
 * partials and merged by the combine (flash-decoding). The list depends on
 * the batch and the heads only, so the first ATTN_PAGED node of a forward
 * builds it and the others reuse it; begin_forward and each lone
 * execute_node forget it (mf_cub_paged_forget), so a batch is never reused
 * across forwards. */
#include "backend/cuda/cuda_ctx.h"
#include "backend/cuda/paged.h"

#define CUDA_NODE_TRY(x, call)                                                            \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess)                                                            \
            return NODE_ERR(x, "%s failed: %s", #call, cudaGetErrorName(e_));             \
    } while (0)

struct cu_paged {
    int32_t *host;         /* the buffer as built */
    size_t host_cap;       /* ints */
    void *pin;             /* pinned staging of the upload */
    size_t pin_cap;        /* bytes */
    int32_t *dev;          /* the device copy */
    size_t dev_cap;        /* bytes */
    cudaEvent_t done;      /* the last upload out of pin finished */
    bool ev_live, valid;
    int32_t n_head_kv, gqa, nt; /* what the valid list was built for */
    int64_t o_tok, o_seq, o_blk, o_items; /* offsets (ints) into dev */
    int32_t n_items;
    int64_t part_rows;     /* partial rows (0: no split) */
    int64_t max_block;     /* the largest block id listed */
};

void mf_cub_paged_forget(cu_ctx *c) {
    if (c->paged)
        c->paged->valid = false;
}

void mf_cub_paged_free(cu_ctx *c) {
    cu_paged *p = c->paged;
    if (!p)
        return;
    if (p->ev_live)
        cudaEventSynchronize(p->done);
    if (p->done)
        cudaEventDestroy(p->done);
    if (p->pin)
        cudaFreeHost(p->pin);
    if (p->dev)
        cudaFree(p->dev);
    free(p->host);
    free(p);
    c->paged = NULL;
}

static int32_t *host_ints(cu_paged *p, size_t n) {
    if (p->host_cap < n) {
        free(p->host);
        p->host_cap = n + n / 2 + 64;
        p->host = mf_malloc(p->host_cap * sizeof *p->host);
    }
    return p->host;
}

/* Tiles, splits and the sequences' blocks into p->host; returns its ints,
 * or -1 (err) for a batch that does not fit the kernels. */
static int64_t build(exec *x, cu_paged *p, const mf_kv_batch *kb, int32_t n_head_kv, int32_t gqa) {
    const int32_t nt = kb->n_tokens, bs = kb->block_size, tile = MF_CU_PAGED_ROWS / gqa;
    /* per sequence: positions the batch reads (max pos + 1), 0 when absent */
    int64_t n_blocks = 0, n_tiles = 0;
    int32_t *need = mf_calloc((size_t)kb->n_seqs, sizeof *need);
    for (int32_t t = 0; t < nt; t++) {
        const int32_t s = kb->seq[t];
        if (s < 0 || s >= kb->n_seqs || kb->pos[t] < 0 || !kb->tables[s]) {
            free(need);
            return NODE_ERR(x, "batch token %d: sequence %d of %d at position %d (no block table)", t, s,
                            kb->n_seqs, kb->pos[t]);
        }
        need[s] = kb->pos[t] + 1 > need[s] ? kb->pos[t] + 1 : need[s];
        if (t == 0 || kb->seq[t - 1] != s)
            n_tiles++;
    }
    for (int32_t s = 0; s < kb->n_seqs; s++)
        n_blocks += (need[s] + bs - 1) / bs;
    /* tiles: runs of one sequence cut every `tile` tokens */
    int64_t cut = 0;
    for (int32_t t = 0, run = 0; t < nt; t++) {
        run = t > 0 && kb->seq[t - 1] == kb->seq[t] ? run + 1 : 0;
        cut += run > 0 && run % tile == 0;
    }
    n_tiles += cut;
    /* splits: enough blocks for two per SM */
    const int64_t want = 2 * (int64_t)x->c->t.sm_count, work = n_tiles * n_head_kv;
    const int32_t ns_max = work >= want ? 1 : (int32_t)((want + work - 1) / work);
    /* upper bound on items: a tile splits into at most ns_max pieces */
    const int64_t max_items = n_tiles * ns_max;
    const int64_t n_ints = 5 * (int64_t)nt + kb->n_seqs + n_blocks + MF_CU_PAGED_ITEM * max_items;
    int32_t *h = host_ints(p, (size_t)n_ints);
    int32_t *tok = h, *seq_off = h + 5 * (int64_t)nt, *blk = seq_off + kb->n_seqs;
    int32_t *items = blk + n_blocks;
    int64_t off = 0;
    p->max_block = 0;
    for (int32_t s = 0; s < kb->n_seqs; s++) {
        seq_off[s] = (int32_t)off;
        for (int32_t b = 0; b < (need[s] + bs - 1) / bs; b++) {
            const int32_t id = kb->tables[s][b];
            if (id < 0) {
                free(need);
                return NODE_ERR(x, "sequence %d: block %d of its table is %d", s, b, id);
            }
            p->max_block = id > p->max_block ? id : p->max_block;
            blk[off++] = id;
        }
    }
    free(need);
    int32_t n_items = 0;
    int64_t prow = 0;
    for (int32_t t0 = 0; t0 < nt;) {
        int32_t n = 1, maxp = kb->pos[t0];
        while (t0 + n < nt && n < tile && kb->seq[t0 + n] == kb->seq[t0]) {
            maxp = kb->pos[t0 + n] > maxp ? kb->pos[t0 + n] : maxp;
            n++;
        }
        const int32_t len = maxp + 1, chunks = (len + MF_CU_PAGED_CHUNK - 1) / MF_CU_PAGED_CHUNK;
        int32_t ns = ns_max < chunks / 2 ? ns_max : chunks / 2;
        ns = ns < 1 ? 1 : ns;
        const int32_t per = (chunks + ns - 1) / ns; /* chunks a split */
        ns = (chunks + per - 1) / per;
        for (int32_t k = 0; k < ns; k++) {
            int32_t *it = items + (int64_t)n_items++ * MF_CU_PAGED_ITEM;
            const int32_t kv0 = k * per * MF_CU_PAGED_CHUNK, kv1 = (k + 1) * per * MF_CU_PAGED_CHUNK;
            it[0] = t0;
            it[1] = n;
            it[2] = kv0;
            it[3] = kv1 < len ? kv1 : len;
            it[4] = ns > 1 ? (int32_t)(prow + (int64_t)k * n) : -1;
        }
        for (int32_t i = 0; i < n; i++) {
            const int32_t t = t0 + i;
            tok[t] = kb->seq[t];
            tok[nt + t] = kb->pos[t];
            tok[2 * nt + t] = ns > 1 ? (int32_t)(prow + i) : -1;
            tok[3 * nt + t] = ns;
            tok[4 * nt + t] = n;
        }
        if (ns > 1)
            prow += (int64_t)ns * n;
        t0 += n;
    }
    if (n_items > max_items || prow > INT32_MAX)
        return NODE_ERR(x, "paged work list: %d items (bound %lld), %lld partial rows", n_items,
                        (long long)max_items, (long long)prow);
    p->o_tok = 0;
    p->o_seq = 5 * (int64_t)nt;
    p->o_blk = p->o_seq + kb->n_seqs;
    p->o_items = p->o_blk + n_blocks;
    p->n_items = n_items;
    p->part_rows = prow;
    return p->o_items + (int64_t)n_items * MF_CU_PAGED_ITEM;
}

/* The batch's work list on the device (built and uploaded unless this
 * forward already did). */
static int upload(exec *x, const mf_kv_batch *kb, int32_t n_head_kv, int32_t gqa) {
    cu_ctx *c = x->c;
    if (!c->paged) {
        c->paged = mf_calloc(1, sizeof *c->paged);
        CUDA_NODE_TRY(x, cudaEventCreateWithFlags(&c->paged->done, cudaEventDisableTiming));
    }
    cu_paged *p = c->paged;
    if (p->valid && p->n_head_kv == n_head_kv && p->gqa == gqa && p->nt == kb->n_tokens)
        return 0;
    p->valid = false;
    const int64_t n = build(x, p, kb, n_head_kv, gqa);
    if (n < 0)
        return -1;
    const size_t bytes = (size_t)n * sizeof(int32_t);
    if (p->ev_live && mf_cub_wait_event(c, p->done, x->err)) /* pin is still being read */
        return -1;
    p->ev_live = false;
    if (p->pin_cap < bytes) {
        if (p->pin)
            cudaFreeHost(p->pin);
        p->pin = NULL;
        p->pin_cap = bytes + bytes / 2 + 4096;
        CUDA_NODE_TRY(x, cudaHostAlloc(&p->pin, p->pin_cap, cudaHostAllocDefault));
    }
    if (p->dev_cap < bytes) {
        if (mf_cub_wait(c, "growing the paged batch buffer", x->err)) /* kernels may read the old one */
            return -1;
        if (p->dev)
            cudaFree(p->dev);
        p->dev = NULL;
        p->dev_cap = bytes + bytes / 2 + 4096;
        CUDA_NODE_TRY(x, cudaMalloc((void **)&p->dev, p->dev_cap));
    }
    memcpy(p->pin, p->host, bytes);
    CUDA_NODE_TRY(x, cudaMemcpyAsync(p->dev, p->pin, bytes, cudaMemcpyHostToDevice, c->stream));
    CUDA_NODE_TRY(x, cudaEventRecord(p->done, c->stream));
    p->ev_live = true;
    p->valid = true;
    p->n_head_kv = n_head_kv;
    p->gqa = gqa;
    p->nt = kb->n_tokens;
    return 0;
}

bool mf_cub_paged_ok(const mf_node *n) {
    const mf_attn_meta *m = &n->meta.attn;
    return m->n_head > 0 && m->n_head_kv > 0 && m->n_head % m->n_head_kv == 0 &&
           mf_cu_attn_paged_ok(m->head_dim, m->n_head / m->n_head_kv);
}

/* ATTN_PAGED */
int mf_cub_op_attn_paged(const op_call *oc) {
    exec *x = oc->x;
    const mf_node *n = x->n;
    const mf_attn_meta *m = &n->meta.attn;
    const mf_exec_args *ea = oc->ea;
    const mf_kv_batch *kb = ea->batch;
    const int64_t nt = n->ne[1], qd = (int64_t)m->n_head * m->head_dim, kvd = x->g->kv_dim;
    if (!mf_cub_paged_ok(n) || qd != n->ne[0] || (int64_t)m->n_head_kv * m->head_dim != kvd)
        return NODE_ERR(x, "n_head %d n_head_kv %d head_dim %d for width %lld, kv_dim %lld", m->n_head,
                        m->n_head_kv, m->head_dim, (long long)n->ne[0], (long long)kvd);
    if (!kb || kb->n_tokens != nt || kb->block_size <= 0 || kb->n_seqs <= 0)
        return NODE_ERR(x, "a paged forward of %lld tokens without its batch (%d tokens, block size %d)",
                        (long long)nt, kb ? kb->n_tokens : 0, kb ? kb->block_size : 0);
    const uint32_t t = ea->kv_type;
    const size_t rb = mf_cub_row_bytes(t, kvd);
    if ((t != MF_TYPE_F32 && t != MF_TYPE_F16 && t != MF_TYPE_Q8_0) || rb == 0)
        return NODE_ERR(x, "KV cache type %s (%u) for kv_dim %lld", mf_type_name(t), t, (long long)kvd);
    if (oc->kv.k < 0 || oc->kv.v < 0)
        return NODE_ERR(x, "no KV regions for layer %d", m->layer);
    if (upload(x, kb, m->n_head_kv, m->n_head / m->n_head_kv))
        return -1;
    const cu_paged *p = x->c->paged;
    const size_t pool = rb * (size_t)(p->max_block + 1) * (size_t)kb->block_size;
    void *kc = mf_cub_buf_ptr(x, oc->kv.k, pool, "K pool");
    void *vc = kc ? mf_cub_buf_ptr(x, oc->kv.v, pool, "V pool") : NULL;
    const float *q = vc ? mf_cub_buf_ptr(x, oc->in[0], mf_cub_f32b(qd * nt), "q") : NULL;
    const float *k = q ? mf_cub_buf_ptr(x, oc->in[1], mf_cub_f32b(kvd * nt), "k") : NULL;
    const float *v = k ? mf_cub_buf_ptr(x, oc->in[2], mf_cub_f32b(kvd * nt), "v") : NULL;
    float *y = v ? mf_cub_buf_ptr(x, oc->out, mf_cub_f32b(qd * nt), "output") : NULL;
    if (!y)
        return -1;
    float *part = NULL;
    if (p->part_rows > 0 &&
        !(part = mf_cub_scratch(x, ATTN_SLOT, mf_cub_f32b(p->part_rows * m->n_head * (m->head_dim + 2)))))
        return -1;
    const mf_cu_paged_args a = {.q = q, .k_new = k, .v_new = v, .out = y, .k = kc, .v = vc, .kv_type = t,
                                .nt = (int32_t)nt, .n_head = m->n_head, .n_head_kv = m->n_head_kv,
                                .head_dim = m->head_dim, .block_size = kb->block_size, .scale = m->scale,
                                .tok = p->dev + p->o_tok, .seq_off = p->dev + p->o_seq,
                                .blocks = p->dev + p->o_blk, .items = p->dev + p->o_items,
                                .n_items = p->n_items, .part = part};
    return mf_cub_launched(x, part ? "attn_paged(split)" : "attn_paged", nt, p->n_items,
                           mf_cu_attn_paged(&a, x->c->stream));
}
