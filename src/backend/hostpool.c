/* hostpool.c - id-indexed pool of 64-byte-aligned host buffers (hostpool.h). */
#include <stdlib.h>
#include <string.h>

#include "backend/hostpool.h"

void mf_hostpool_init(mf_hostpool *pool, const char *owner) {
    *pool = (mf_hostpool){.owner = owner};
}

void mf_hostpool_free(mf_hostpool *pool) {
    for (int32_t i = 0; i < pool->n_bufs; i++)
        free(pool->bufs[i].p);
    free(pool->bufs);
    mf_hostpool_init(pool, pool->owner);
}

int32_t mf_hostpool_alloc_fresh(mf_hostpool *pool, size_t nbytes, mf_error *err) {
    /* aligned_alloc wants a multiple of the alignment; a zero-size buffer
     * still gets memory so that every id has a valid pointer. */
    size_t rounded = (nbytes + 63) / 64 * 64;
    void *p = rounded >= nbytes ? aligned_alloc(64, rounded ? rounded : 64) : NULL;
    if (!p)
        return mf_errorf(err, "%s: out of memory allocating a %zu-byte buffer", pool->owner, nbytes);
    if (pool->n_bufs == pool->cap_bufs) {
        pool->cap_bufs = pool->cap_bufs ? pool->cap_bufs * 2 : 64;
        pool->bufs = mf_realloc(pool->bufs, (size_t)pool->cap_bufs * sizeof *pool->bufs);
    }
    pool->bufs[pool->n_bufs] = (mf_hostbuf){.p = p, .n = nbytes, .free = false};
    return pool->n_bufs++;
}

int32_t mf_hostpool_alloc(mf_hostpool *pool, size_t nbytes, mf_error *err) {
    for (int32_t i = 0; i < pool->n_bufs; i++)
        if (pool->bufs[i].free && pool->bufs[i].n == nbytes) {
            pool->bufs[i].free = false;
            return i;
        }
    return mf_hostpool_alloc_fresh(pool, nbytes, err);
}

void mf_hostpool_release(mf_hostpool *pool, int32_t id) {
    MF_ASSERT(id >= 0 && id < pool->n_bufs);
    pool->bufs[id].free = true;
}

void *mf_hostpool_ptr(const mf_hostpool *pool, int32_t id) {
    MF_ASSERT(id >= 0 && id < pool->n_bufs);
    return pool->bufs[id].p;
}

/* The one bounds test of both copies: overflow-safe (n > size - off). */
static int check_range(const mf_hostpool *pool, const char *what, int32_t id, size_t off, size_t n,
                       mf_error *err) {
    if (id < 0 || id >= pool->n_bufs)
        return mf_errorf(err, "%s: %s buffer %d is not in the pool (%d buffers)", pool->owner, what, id,
                         pool->n_bufs);
    size_t size = pool->bufs[id].n;
    if (off > size || n > size - off)
        return mf_errorf(err, "%s: %s buffer %d [%zu, +%zu) out of range (size %zu)", pool->owner, what, id,
                         off, n, size);
    return 0;
}

int mf_hostpool_read(const mf_hostpool *pool, int32_t id, size_t off, void *dst, size_t n, mf_error *err) {
    if (check_range(pool, "read_host", id, off, n, err))
        return -1;
    memcpy(dst, (const char *)pool->bufs[id].p + off, n);
    return 0;
}

int mf_hostpool_write(mf_hostpool *pool, int32_t id, size_t off, const void *src, size_t n, mf_error *err) {
    if (check_range(pool, "write_host", id, off, n, err))
        return -1;
    memcpy((char *)pool->bufs[id].p + off, src, n);
    return 0;
}
