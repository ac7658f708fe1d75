/* kvpool.c - blocks, block tables, forks, copy-on-write and the prompt
 * cache of a paged KV pool (kvpool.h). */
#include "runtime/kvpool.h"

#include <stdlib.h>
#include <string.h>

static int seq_alloc(mf_kvseq *s, int32_t max_blocks, int32_t n_ctx) {
    s->blocks = malloc((size_t)max_blocks * sizeof *s->blocks);
    s->tokens = malloc((size_t)n_ctx * sizeof *s->tokens);
    return s->blocks && s->tokens ? 0 : -1;
}

int mf_kvpool_init(mf_kvpool *p, int32_t n_blocks, int32_t block_size, int32_t n_ctx,
                   int32_t n_live, int32_t n_cache, mf_kv_copy_fn copy, void *copy_user,
                   mf_error *err) {
    memset(p, 0, sizeof *p);
    if (n_blocks <= 0 || block_size <= 0 || n_ctx <= 0 || n_live <= 0 || n_cache < 0)
        return mf_errorf(err, "kv pool: %d blocks of %d, n_ctx %d, %d sequences, %d cached",
                         n_blocks, block_size, n_ctx, n_live, n_cache);
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    p->n_ctx = n_ctx;
    p->max_blocks = (n_ctx + block_size - 1) / block_size;
    p->n_live = n_live;
    p->n_cache = n_cache;
    p->copy = copy;
    p->copy_user = copy_user;
    p->ref = calloc((size_t)n_blocks, sizeof *p->ref);
    p->free_ids = malloc((size_t)n_blocks * sizeof *p->free_ids);
    p->seq = calloc((size_t)n_live, sizeof *p->seq);
    p->cache = calloc((size_t)(n_cache ? n_cache : 1), sizeof *p->cache);
    bool ok = p->ref && p->free_ids && p->seq && p->cache;
    for (int32_t i = 0; ok && i < n_live; i++)
        ok = seq_alloc(&p->seq[i], p->max_blocks, n_ctx) == 0;
    for (int32_t i = 0; ok && i < n_cache; i++)
        ok = seq_alloc(&p->cache[i], p->max_blocks, n_ctx) == 0;
    if (!ok) {
        mf_kvpool_free(p);
        return mf_errorf(err, "kv pool: out of memory for %d sequences of %d positions", n_live + n_cache,
                         n_ctx);
    }
    /* popped from the top: block 0 first, so a lone sequence's blocks are
     * contiguous and its attention reads them in place */
    for (int32_t i = 0; i < n_blocks; i++)
        p->free_ids[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    return 0;
}

void mf_kvpool_free(mf_kvpool *p) {
    for (int32_t i = 0; p->seq && i < p->n_live; i++) {
        free(p->seq[i].blocks);
        free(p->seq[i].tokens);
    }
    for (int32_t i = 0; p->cache && i < p->n_cache; i++) {
        free(p->cache[i].blocks);
        free(p->cache[i].tokens);
    }
    free(p->seq);
    free(p->cache);
    free(p->ref);
    free(p->free_ids);
    memset(p, 0, sizeof *p);
}

static void release_blocks(mf_kvpool *p, mf_kvseq *s) {
    for (int32_t b = 0; b < s->nb; b++) {
        const int32_t id = s->blocks[b];
        MF_ASSERT(p->ref[id] > 0);
        if (--p->ref[id] == 0)
            p->free_ids[p->n_free++] = id;
    }
    s->used = false;
    s->len = 0;
    s->nb = 0;
}

/* The least recently used cache entry, or -1. */
static int32_t lru_entry(const mf_kvpool *p) {
    int32_t best = -1;
    for (int32_t i = 0; i < p->n_cache; i++)
        if (p->cache[i].used && (best < 0 || p->cache[i].last_use < p->cache[best].last_use))
            best = i;
    return best;
}

static int32_t take_block(mf_kvpool *p, mf_error *err) {
    while (p->n_free == 0) {
        const int32_t e = lru_entry(p);
        if (e < 0) {
            mf_errorf(err, "kv pool: all %d blocks of %d positions are in use", p->n_blocks,
                      p->block_size);
            return -1;
        }
        release_blocks(p, &p->cache[e]);
    }
    const int32_t id = p->free_ids[--p->n_free];
    p->ref[id] = 1;
    return id;
}

int32_t mf_kvpool_seq_new(mf_kvpool *p, mf_error *err) {
    for (int32_t i = 0; i < p->n_live; i++)
        if (!p->seq[i].used) {
            p->seq[i].used = true;
            p->seq[i].len = 0;
            p->seq[i].nb = 0;
            p->seq[i].last_use = ++p->clock;
            return i;
        }
    mf_errorf(err, "kv pool: all %d sequences are in use", p->n_live);
    return -1;
}

static mf_kvseq *get(mf_kvpool *p, int32_t id, bool from_cache) {
    if (from_cache)
        return id >= 0 && id < p->n_cache && p->cache[id].used ? &p->cache[id] : NULL;
    return id >= 0 && id < p->n_live && p->seq[id].used ? &p->seq[id] : NULL;
}

int32_t mf_kvpool_fork(mf_kvpool *p, int32_t src, bool from_cache, int32_t n_keep, mf_error *err) {
    mf_kvseq *s = get(p, src, from_cache);
    if (!s) {
        mf_errorf(err, "kv pool: fork of %s %d, which does not exist", from_cache ? "cache entry" : "sequence",
                  src);
        return -1;
    }
    if (n_keep < 0 || n_keep > s->len) {
        mf_errorf(err, "kv pool: fork keeping %d positions of a sequence of %d", n_keep, s->len);
        return -1;
    }
    const int32_t id = mf_kvpool_seq_new(p, err);
    if (id < 0)
        return -1;
    mf_kvseq *d = &p->seq[id];
    s = get(p, src, from_cache); /* (the arrays do not move; kept for clarity) */
    const int32_t nb = (n_keep + p->block_size - 1) / p->block_size;
    for (int32_t b = 0; b < nb; b++) {
        d->blocks[b] = s->blocks[b];
        p->ref[s->blocks[b]]++;
    }
    memcpy(d->tokens, s->tokens, (size_t)n_keep * sizeof *d->tokens);
    d->len = n_keep;
    d->nb = nb;
    s->last_use = ++p->clock;
    return id;
}

static int32_t common_prefix(const mf_kvseq *s, const int32_t *tokens, int32_t n) {
    int32_t k = 0;
    const int32_t lim = s->len < n ? s->len : n;
    while (k < lim && s->tokens[k] == tokens[k])
        k++;
    return k;
}

int32_t mf_kvpool_from_cache(mf_kvpool *p, const int32_t *tokens, int32_t n, int32_t max_keep,
                             int32_t *n_reused, mf_error *err) {
    int32_t best = 0, best_id = -1;
    bool best_cache = false;
    for (int pass = 0; pass < 2; pass++) {
        const bool c = pass == 1;
        const int32_t cnt = c ? p->n_cache : p->n_live;
        for (int32_t i = 0; i < cnt; i++) {
            const mf_kvseq *s = c ? &p->cache[i] : &p->seq[i];
            if (!s->used)
                continue;
            int32_t k = common_prefix(s, tokens, n);
            k = k < max_keep ? k : max_keep;
            if (k > best) {
                best = k;
                best_id = i;
                best_cache = c;
            }
        }
    }
    p->lookups++;
    *n_reused = 0;
    if (best_id < 0)
        return mf_kvpool_seq_new(p, err);
    const int32_t id = mf_kvpool_fork(p, best_id, best_cache, best, err);
    if (id >= 0) {
        p->hits++;
        p->reused += best;
        *n_reused = best;
    }
    return id;
}

int mf_kvpool_remove(mf_kvpool *p, int32_t seq, bool keep, mf_error *err) {
    mf_kvseq *s = get(p, seq, false);
    if (!s)
        return mf_errorf(err, "kv pool: remove of sequence %d, which does not exist", seq);
    if (!keep || s->len == 0 || p->n_cache == 0) {
        release_blocks(p, s);
        return 0;
    }
    /* an entry holding the same tokens or a prefix of them adds nothing */
    for (int32_t i = 0; i < p->n_cache; i++) {
        mf_kvseq *c = &p->cache[i];
        if (c->used && c->len <= s->len && common_prefix(c, s->tokens, s->len) == c->len)
            release_blocks(p, c);
    }
    int32_t slot = -1;
    for (int32_t i = 0; i < p->n_cache && slot < 0; i++)
        if (!p->cache[i].used)
            slot = i;
    if (slot < 0) {
        slot = lru_entry(p);
        release_blocks(p, &p->cache[slot]);
    }
    mf_kvseq *c = &p->cache[slot];
    /* swap the arrays: the entry takes the sequence's table and tokens */
    int32_t *b = c->blocks, *t = c->tokens;
    c->blocks = s->blocks;
    c->tokens = s->tokens;
    c->len = s->len;
    c->nb = s->nb;
    c->used = true;
    c->last_use = ++p->clock;
    s->blocks = b;
    s->tokens = t;
    s->used = false;
    s->len = 0;
    s->nb = 0;
    return 0;
}

int mf_kvpool_prepare_write(mf_kvpool *p, int32_t seq, int32_t pos, mf_error *err) {
    mf_kvseq *s = get(p, seq, false);
    if (!s)
        return mf_errorf(err, "kv pool: write to sequence %d, which does not exist", seq);
    if (pos != s->len || pos >= p->n_ctx)
        return mf_errorf(err, "kv pool: sequence %d: position %d (its length is %d, n_ctx %d)", seq, pos,
                         s->len, p->n_ctx);
    const int32_t bi = pos / p->block_size, off = pos % p->block_size;
    if (off == 0 && bi >= s->nb) {
        const int32_t id = take_block(p, err);
        if (id < 0)
            return -1;
        s->blocks[bi] = id;
        s->nb = bi + 1;
        return 0;
    }
    const int32_t old = s->blocks[bi];
    if (p->ref[old] == 1)
        return 0;
    /* shared: this sequence gets its own copy of the rows written so far.
     * The old block cannot be evicted here (we hold a reference). */
    const int32_t id = take_block(p, err);
    if (id < 0)
        return -1;
    if (p->copy(p->copy_user, (int64_t)id * p->block_size, (int64_t)old * p->block_size, off, err)) {
        p->ref[id] = 0;
        p->free_ids[p->n_free++] = id;
        return -1;
    }
    p->ref[old]--;
    s->blocks[bi] = id;
    return 0;
}

void mf_kvpool_commit(mf_kvpool *p, int32_t seq, int32_t pos, int32_t token) {
    mf_kvseq *s = &p->seq[seq];
    MF_ASSERT(s->used && pos == s->len);
    s->tokens[pos] = token;
    s->len++;
    s->last_use = ++p->clock;
}

void mf_kvpool_rewind(mf_kvpool *p, int32_t seq, int32_t len) {
    mf_kvseq *s = &p->seq[seq];
    MF_ASSERT(s->used && len >= 0 && len <= s->len);
    s->len = len;
}

int32_t mf_kvpool_blocks_used(const mf_kvpool *p) { return p->n_blocks - p->n_free; }

int32_t mf_kvpool_blocks_cached(const mf_kvpool *p) {
    int32_t *live = calloc((size_t)p->n_blocks, sizeof *live);
    if (!live)
        return 0;
    for (int32_t i = 0; i < p->n_live; i++) {
        const mf_kvseq *s = &p->seq[i];
        for (int32_t b = 0; s->used && b < s->nb; b++)
            live[s->blocks[b]]++;
    }
    int32_t n = 0;
    for (int32_t i = 0; i < p->n_blocks; i++)
        n += p->ref[i] > 0 && live[i] == 0;
    free(live);
    return n;
}
