/* hostpool.h - the host buffer pool shared by the backends whose buffers are
 * plain memory (cpu, ref).
 *
 * The backend contract (backend/backend.h) hands out buffers as ids, never
 * pointers. A host pool keeps one 64-byte-aligned allocation per id and an
 * exact-size free list: the allocator asks for size classes, so an exact match
 * recycles well and never hands a buffer smaller than asked. Ids are stable
 * for the pool's lifetime; memory is returned only by mf_hostpool_free.
 *
 * "Free" means "recyclable by the next mf_hostpool_alloc", not "unused": the
 * allocator frees a buffer after its last consumer during its walk, before
 * the graph runs, so a freed id may still carry a value at execute time.
 * Hence mf_hostpool_ptr checks only the id's range. */
#ifndef MF_HOSTPOOL_H
#define MF_HOSTPOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

typedef struct mf_hostbuf {
    void *p;     /* 64-byte aligned, at least 64 bytes */
    size_t n;    /* bytes asked for; read/write_host bound checks use this */
    bool free;   /* recyclable by mf_hostpool_alloc */
} mf_hostbuf;

typedef struct mf_hostpool {
    const char *owner; /* backend name, first word of every error message */
    mf_hostbuf *bufs;
    int32_t n_bufs, cap_bufs;
} mf_hostpool;

/* An empty pool; owner (a string that outlives the pool) names it in errors. */
void mf_hostpool_init(mf_hostpool *pool, const char *owner);
/* Frees every buffer; the pool is empty again and may be reused. */
void mf_hostpool_free(mf_hostpool *pool);

/* alloc_buffer: a free buffer of exactly nbytes if there is one, else a new
 * one. Returns its id, or -1 with err filled when memory runs out. */
int32_t mf_hostpool_alloc(mf_hostpool *pool, size_t nbytes, mf_error *err);
/* alloc_fresh: always a new buffer, never one recycled (split staging). */
int32_t mf_hostpool_alloc_fresh(mf_hostpool *pool, size_t nbytes, mf_error *err);
/* free_buffer: marks id recyclable; its memory stays valid (see above). */
void mf_hostpool_release(mf_hostpool *pool, int32_t id);

/* The memory behind id. id must be one this pool returned (MF_ASSERT). */
void *mf_hostpool_ptr(const mf_hostpool *pool, int32_t id);

/* read_host / write_host: copy n bytes at byte offset off of buffer id. An
 * unknown id or a range past the buffer's size is an error naming both. */
int mf_hostpool_read(const mf_hostpool *pool, int32_t id, size_t off, void *dst, size_t n, mf_error *err);
int mf_hostpool_write(mf_hostpool *pool, int32_t id, size_t off, const void *src, size_t n, mf_error *err);

#endif
