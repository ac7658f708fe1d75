/* kvpool.h - the bookkeeping of a paged KV pool: fixed-size blocks with
 * reference counts, a block table and the token ids per sequence, forks that
 * share blocks, copy-on-write before a write into a shared block, and the
 * prompt cache (ended sequences kept, least recently used given back first).
 * It moves no KV bytes itself: a copy-on-write is handed to the caller's
 * copy callback (rows of the pool). */
#ifndef MF_KVPOOL_H
#define MF_KVPOOL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"

typedef struct mf_kvseq {
    bool used;          /* a live sequence or a cache entry */
    int32_t len;        /* positions held */
    int32_t nb;         /* blocks held (one more than len needs after a failed run) */
    int32_t *blocks;    /* [max_blocks] */
    int32_t *tokens;    /* [n_ctx] the token of each position */
    uint64_t last_use;
} mf_kvseq;

/* Copies rows [src, src + n) of the pool to [dst, dst + n) (every layer). */
typedef int (*mf_kv_copy_fn)(void *user, int64_t dst, int64_t src, int64_t n, mf_error *err);

typedef struct mf_kvpool {
    int32_t n_blocks, block_size, n_ctx, max_blocks;
    int32_t *ref;          /* [n_blocks] holders of each block */
    int32_t *free_ids;     /* stack of free blocks */
    int32_t n_free;
    mf_kvseq *seq;         /* [n_live] live sequences, ids 0..n_live-1 */
    int32_t n_live;
    mf_kvseq *cache;       /* [n_cache] prompt cache entries */
    int32_t n_cache;
    uint64_t clock;
    mf_kv_copy_fn copy;
    void *copy_user;
    int64_t lookups, hits, reused;
} mf_kvpool;

int mf_kvpool_init(mf_kvpool *p, int32_t n_blocks, int32_t block_size, int32_t n_ctx,
                   int32_t n_live, int32_t n_cache, mf_kv_copy_fn copy, void *copy_user,
                   mf_error *err);
void mf_kvpool_free(mf_kvpool *p);

/* A free live slot made an empty sequence; its id or -1 (err: all in use). */
int32_t mf_kvpool_seq_new(mf_kvpool *p, mf_error *err);
/* A new sequence with the first n_keep positions of src_seq (a live id, or
 * when from_cache a cache entry index), sharing its blocks. */
int32_t mf_kvpool_fork(mf_kvpool *p, int32_t src, bool from_cache, int32_t n_keep, mf_error *err);
/* The longest prefix of tokens (at most max_keep) any live sequence or cache
 * entry holds, as a new sequence; *n_reused its length (0: an empty one). */
int32_t mf_kvpool_from_cache(mf_kvpool *p, const int32_t *tokens, int32_t n, int32_t max_keep,
                             int32_t *n_reused, mf_error *err);
/* Ends a live sequence: into the prompt cache (keep and len > 0), else its
 * blocks are released. */
int mf_kvpool_remove(mf_kvpool *p, int32_t seq, bool keep, mf_error *err);
/* Makes position pos of seq writable (pos == its length): a new block at a
 * block boundary, a private copy of a shared block. Blocks come from the
 * free list, else from evicting cache entries. */
int mf_kvpool_prepare_write(mf_kvpool *p, int32_t seq, int32_t pos, mf_error *err);
/* Records token at pos (== len) and advances the length. */
void mf_kvpool_commit(mf_kvpool *p, int32_t seq, int32_t pos, int32_t token);
/* Sets a live sequence's length back to len (<= its length: a run that failed). */
void mf_kvpool_rewind(mf_kvpool *p, int32_t seq, int32_t len);

int32_t mf_kvpool_blocks_used(const mf_kvpool *p);
/* Blocks only cache entries hold (what evicting the whole cache would free). */
int32_t mf_kvpool_blocks_cached(const mf_kvpool *p);

#endif
