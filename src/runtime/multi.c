/* multi.c - many sequences in one forward (minfer.h, "many sequences"): the
 * paged KV pool (kvpool.c) under an engine whose KV regions are the pool's
 * rows, and the batch -> paged forward glue. The rows that want logits are
 * moved to the end of the forward (a sequence's rows are independent of
 * their order: every token carries its own position and KV slot), so the
 * graph computes the lm_head for those rows only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/kvpool.h"
#include "runtime/levers.h"
#include "runtime/runtime.h"

#define DEFAULT_CTX 4096
#define DEFAULT_SEQS 8
#define DEFAULT_BLOCK 16
#define DEFAULT_BATCH 512

struct minfer_multi {
    minfer_model *model;
    mf_engine *eng;
    mf_kvpool pool;
    int32_t n_ctx, n_batch;
    uint32_t kv_type[2];                    /* K, V */
    bool gpu, prompt_cache, fuse_swiglu, attn_unfused;
    /* per forward, in forward order */
    int32_t *f_tok, *f_seq, *f_pos, *f_src; /* f_src: batch index of forward row */
    int32_t *f_old_len;                     /* per sequence: length before the batch */
    const int32_t **tables;
    float *logits;                          /* [n_out rows][n_vocab] */
    size_t logits_rows;
    int32_t *out_row;                       /* batch index -> logits row, -1: none */
    int32_t last_n;                         /* tokens of the last decode */
};

void minfer_multi_options_default(minfer_multi_options *o) {
    *o = (minfer_multi_options){.n_ctx = 0, .n_seq_max = DEFAULT_SEQS, .block_size = DEFAULT_BLOCK,
                                .n_blocks = 0, .n_batch = DEFAULT_BATCH, .cache_type = NULL,
                                .prompt_cache = true};
}

static void set_err(char *err, size_t errlen, const mf_error *e) {
    if (err && errlen)
        snprintf(err, errlen, "%s", e->msg);
}

static int copy_rows(void *user, int64_t dst, int64_t src, int64_t n, mf_error *err) {
    return mf_engine_kv_copy_rows(user, dst, src, n, err);
}

static void params(const minfer_multi *mm, int32_t nt, int32_t n_out, mf_graph_params *p) {
    *p = (mf_graph_params){.n_tokens = nt, .n_outputs = n_out, .n_ctx = 0, .k_type = mm->kv_type[0],
                           .v_type = mm->kv_type[1], .gpu = mm->gpu, .fuse_swiglu = mm->fuse_swiglu,
                           .paged = true, .attn_unfused = mm->attn_unfused};
}

minfer_multi *minfer_multi_new(minfer_model *model, const minfer_multi_options *o, char *err,
                               size_t errlen) {
    mf_error e = {{0}};
    minfer_multi_options def;
    if (!o) {
        minfer_multi_options_default(&def);
        o = &def;
    }
    const mf_hparams *hp = &model->m->hp;
    minfer_multi *mm = mf_calloc(1, sizeof *mm);
    mm->model = model;
    if (o->n_ctx < 0 || o->n_ctx > hp->n_ctx_train || o->n_seq_max <= 0 || o->block_size <= 0 ||
        o->n_blocks < 0 || o->n_batch < 0) {
        mf_errorf(&e, "multi: n_ctx %d (trained %d), n_seq_max %d, block_size %d, n_blocks %d, "
                  "n_batch %d", o->n_ctx, hp->n_ctx_train, o->n_seq_max, o->block_size, o->n_blocks,
                  o->n_batch);
        goto fail;
    }
    mm->n_ctx = o->n_ctx ? o->n_ctx : (hp->n_ctx_train < DEFAULT_CTX ? hp->n_ctx_train : DEFAULT_CTX);
    mm->n_batch = o->n_batch ? o->n_batch : DEFAULT_BATCH;
    mm->prompt_cache = o->prompt_cache;
    const int64_t per_seq = (mm->n_ctx + o->block_size - 1) / o->block_size;
    const int64_t n_blocks = o->n_blocks ? o->n_blocks : per_seq * o->n_seq_max;
    const int64_t rows = n_blocks * o->block_size;
    if (rows > INT32_MAX) {
        mf_errorf(&e, "multi: %lld blocks of %d positions overflow the row index", (long long)n_blocks,
                  o->block_size);
        goto fail;
    }
    if (mf_rt_cache_types(model, o->cache_type, o->cache_type_v, "multi", mm->kv_type, &e))
        goto fail;
    mm->attn_unfused = o->flash_attn_off;
    if (mf_rt_make_engine(model, (int32_t)rows, mm->kv_type, &mm->eng, &mm->gpu, &e) ||
        mf_rt_check_gpu_kv(mm->eng, mm->gpu, mm->kv_type, mm->attn_unfused, "multi", &e))
        goto fail;
    {
        mf_graph_params p;
        params(mm, 1, 1, &p);
        mm->fuse_swiglu = !mf_lever_flag("MINFER_NO_FUSE_SWIGLU") &&
                          mf_engine_supports_fused(mm->eng, &p, MF_FUSE_SWIGLU);
    }
    /* the cache may hold as many ended sequences as there are live ones, twice */
    if (mf_kvpool_init(&mm->pool, (int32_t)n_blocks, o->block_size, mm->n_ctx, o->n_seq_max,
                       mm->prompt_cache ? 2 * o->n_seq_max : 0, copy_rows, mm->eng, &e))
        goto fail;
    const size_t nb = (size_t)mm->n_batch;
    mm->f_tok = mf_malloc(nb * 5 * sizeof(int32_t));
    mm->f_seq = mm->f_tok + nb;
    mm->f_pos = mm->f_seq + nb;
    mm->f_src = mm->f_pos + nb;
    mm->out_row = mm->f_src + nb;
    mm->f_old_len = mf_malloc((size_t)o->n_seq_max * sizeof *mm->f_old_len);
    mm->tables = mf_malloc((size_t)o->n_seq_max * sizeof *mm->tables);
    /* every layer's KV regions now, and the largest forward's buffers */
    mf_graph_params p;
    params(mm, mm->n_batch < rows ? mm->n_batch : (int32_t)rows, 1, &p);
    if (mf_engine_reserve(mm->eng, &p, mf_model_build_graph, model->m, &e)) {
        mf_error_prefix(&e, "multi: reserving %lld KV rows, n_batch %d", (long long)rows, mm->n_batch);
        goto fail;
    }
    return mm;
fail:
    set_err(err, errlen, &e);
    minfer_multi_free(mm);
    return NULL;
}

void minfer_multi_free(minfer_multi *mm) {
    if (!mm)
        return;
    mf_kvpool_free(&mm->pool);
    mf_engine_free(mm->eng);
    free(mm->f_tok);
    free(mm->f_old_len);
    free(mm->tables);
    free(mm->logits);
    free(mm);
}

int32_t minfer_multi_n_ctx(const minfer_multi *mm) { return mm->n_ctx; }

int32_t minfer_seq_new(minfer_multi *mm, char *err, size_t errlen) {
    mf_error e = {{0}};
    int32_t id = mf_kvpool_seq_new(&mm->pool, &e);
    if (id < 0)
        set_err(err, errlen, &e);
    return id;
}

int32_t minfer_seq_fork(minfer_multi *mm, int32_t src, int32_t n_keep, char *err, size_t errlen) {
    mf_error e = {{0}};
    int32_t id = mf_kvpool_fork(&mm->pool, src, false, n_keep, &e);
    if (id < 0)
        set_err(err, errlen, &e);
    return id;
}

int32_t minfer_seq_from_cache(minfer_multi *mm, const int32_t *tokens, int32_t n, int32_t *n_reused,
                              char *err, size_t errlen) {
    mf_error e = {{0}};
    int32_t dummy;
    n_reused = n_reused ? n_reused : &dummy;
    int32_t id = mf_kvpool_from_cache(&mm->pool, tokens, n < 0 ? 0 : n, n > 0 ? n - 1 : 0, n_reused, &e);
    if (id < 0)
        set_err(err, errlen, &e);
    return id;
}

int minfer_seq_remove(minfer_multi *mm, int32_t seq, char *err, size_t errlen) {
    mf_error e = {{0}};
    if (mf_kvpool_remove(&mm->pool, seq, mm->prompt_cache, &e)) {
        set_err(err, errlen, &e);
        return -1;
    }
    return 0;
}

int32_t minfer_seq_len(const minfer_multi *mm, int32_t seq) {
    if (seq < 0 || seq >= mm->pool.n_live || !mm->pool.seq[seq].used)
        return -1;
    return mm->pool.seq[seq].len;
}

/* Checks the batch against the sequences' lengths without changing anything;
 * counts the rows that want logits. */
static int check_batch(const minfer_multi *mm, const minfer_batch *b, int32_t *n_out, mf_error *e) {
    const int32_t n_vocab = mm->model->m->hp.n_vocab;
    if (!b || b->n_tokens <= 0 || b->n_tokens > mm->n_batch || !b->token || !b->seq_id || !b->pos)
        return mf_errorf(e, "batch: %d tokens (n_batch %d) or a missing array", b ? b->n_tokens : 0,
                         mm->n_batch);
    const mf_kvpool *p = &mm->pool;
    int32_t *len = mm->f_old_len;
    for (int32_t s = 0; s < p->n_live; s++)
        len[s] = p->seq[s].used ? p->seq[s].len : -1;
    *n_out = 0;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        const int32_t s = b->seq_id[i];
        if (s < 0 || s >= p->n_live || len[s] < 0)
            return mf_errorf(e, "batch: token %d names sequence %d, which does not exist", i, s);
        if (b->token[i] < 0 || b->token[i] >= n_vocab)
            return mf_errorf(e, "batch: token %d has id %d outside the vocabulary (%d)", i, b->token[i],
                             n_vocab);
        if (b->pos[i] != len[s])
            return mf_errorf(e, "batch: token %d of sequence %d at position %d, the sequence is at %d", i,
                             s, b->pos[i], len[s]);
        if (len[s] >= mm->n_ctx)
            return mf_errorf(e, "context full: sequence %d has %d positions of n_ctx %d", s, len[s],
                             mm->n_ctx);
        len[s]++;
    }
    for (int32_t i = 0; i < b->n_tokens; i++) {
        bool want = b->logits ? b->logits[i] : true;
        if (!b->logits) /* the last token of its sequence in this batch */
            for (int32_t k = i + 1; k < b->n_tokens && want; k++)
                want = b->seq_id[k] != b->seq_id[i];
        mm->out_row[i] = want ? 0 : -1;
        *n_out += want;
    }
    return 0;
}

int minfer_multi_decode(minfer_multi *mm, const minfer_batch *b, char *err, size_t errlen) {
    mf_error e = {{0}};
    int32_t n_out = 0;
    mm->last_n = 0;
    if (check_batch(mm, b, &n_out, &e))
        goto fail;
    const int32_t nt = b->n_tokens, n_vocab = mm->model->m->hp.n_vocab;
    mf_kvpool *p = &mm->pool;
    for (int32_t s = 0; s < p->n_live; s++)
        mm->f_old_len[s] = p->seq[s].used ? p->seq[s].len : -1;
    /* slots first: a full pool fails before anything runs */
    for (int32_t i = 0; i < nt; i++) {
        if (mf_kvpool_prepare_write(p, b->seq_id[i], b->pos[i], &e))
            goto rewind;
        mf_kvpool_commit(p, b->seq_id[i], b->pos[i], b->token[i]);
    }
    /* rows without logits first, then those with, each in batch order */
    int32_t r = 0, o = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int32_t i = 0; i < nt; i++)
            if ((mm->out_row[i] >= 0) == (pass == 1)) {
                mm->f_tok[r] = b->token[i];
                mm->f_seq[r] = b->seq_id[i];
                mm->f_pos[r] = b->pos[i];
                mm->f_src[r] = i;
                if (pass == 1)
                    mm->out_row[i] = o++;
                r++;
            }
    /* a batch that wants no logits (a prompt chunk) still ends in one row
     * of lm_head: the graph has an output; nothing maps to it */
    const int32_t n_rows = n_out > 0 ? n_out : 1;
    if ((size_t)n_rows > mm->logits_rows) {
        free(mm->logits);
        mm->logits = mf_malloc((size_t)n_rows * (size_t)n_vocab * sizeof *mm->logits);
        mm->logits_rows = (size_t)n_rows;
    }
    for (int32_t s = 0; s < p->n_live; s++)
        mm->tables[s] = p->seq[s].blocks;
    const mf_kv_batch kb = {.n_tokens = nt, .seq = mm->f_seq, .pos = mm->f_pos, .n_seqs = p->n_live,
                            .tables = mm->tables, .block_size = p->block_size};
    mf_graph_params gp;
    params(mm, nt, n_rows, &gp);
    if (mf_engine_forward_batch(mm->eng, &gp, mf_model_build_graph, mm->model->m, mm->f_tok, &kb,
                                mm->logits, &e))
        goto rewind;
    mm->last_n = nt;
    return 0;
rewind:
    for (int32_t s = 0; s < p->n_live; s++)
        if (mm->f_old_len[s] >= 0 && p->seq[s].used && p->seq[s].len > mm->f_old_len[s])
            mf_kvpool_rewind(p, s, mm->f_old_len[s]);
fail:
    set_err(err, errlen, &e);
    return -1;
}

const float *minfer_multi_logits(const minfer_multi *mm, int32_t i) {
    if (i < 0 || i >= mm->last_n || mm->out_row[i] < 0)
        return NULL;
    return mm->logits + (size_t)mm->out_row[i] * (size_t)mm->model->m->hp.n_vocab;
}

void minfer_multi_get_stats(const minfer_multi *mm, minfer_multi_stats *st) {
    const mf_kvpool *p = &mm->pool;
    int32_t live = 0;
    for (int32_t s = 0; s < p->n_live; s++)
        live += p->seq[s].used;
    *st = (minfer_multi_stats){.n_blocks = p->n_blocks,
                               .block_size = p->block_size,
                               .blocks_used = mf_kvpool_blocks_used(p),
                               .blocks_cached = mf_kvpool_blocks_cached(p),
                               .n_seqs = live,
                               .cache_lookups = p->lookups,
                               .cache_hits = p->hits,
                               .cache_tokens_reused = p->reused};
}
