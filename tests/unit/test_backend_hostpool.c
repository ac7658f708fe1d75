/* test_graph_hostpool.c - the host buffer pool that the cpu and ref backends
 * share (graph/hostpool.h): ids are dense and stable, alloc recycles only an
 * exact-size free buffer, alloc_fresh never recycles, every buffer is 64-byte
 * aligned, written bytes read back, and out-of-range reads/writes are errors
 * naming the backend, the buffer and the numbers. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/hostpool.h"
#include "mf_test.h"

MF_TEST(ids_recycle_exact_size_only) {
    mf_hostpool p;
    mf_hostpool_init(&p, "cpu");
    mf_error err = {0};
    int32_t a = mf_hostpool_alloc(&p, 100, &err);
    int32_t b = mf_hostpool_alloc(&p, 200, &err);
    CHECK_EQ_INT(a, 0);
    CHECK_EQ_INT(b, 1);
    mf_hostpool_release(&p, a);
    CHECK_EQ_INT(mf_hostpool_alloc(&p, 101, &err), 2); /* not 100: no recycling */
    CHECK_EQ_INT(mf_hostpool_alloc_fresh(&p, 100, &err), 3); /* fresh never recycles */
    CHECK_EQ_INT(mf_hostpool_alloc(&p, 100, &err), a);        /* exact size: recycled */
    CHECK_EQ_INT(mf_hostpool_alloc(&p, 100, &err), 4);        /* a is taken again */
    /* a released id keeps its memory (the allocator frees before execution) */
    void *pb = mf_hostpool_ptr(&p, b);
    mf_hostpool_release(&p, b);
    CHECK(mf_hostpool_ptr(&p, b) == pb);
    mf_hostpool_free(&p);
    CHECK_EQ_INT(p.n_bufs, 0);
    CHECK_EQ_INT(mf_hostpool_alloc(&p, 8, &err), 0); /* reusable after free */
    mf_hostpool_free(&p);
}

MF_TEST(aligned_and_many) {
    mf_hostpool p;
    mf_hostpool_init(&p, "ref");
    mf_error err = {0};
    /* past the first growth of the id table (64), odd sizes and zero */
    for (int i = 0; i < 300; i++) {
        size_t n = (size_t)(i * 37 % 1000);
        int32_t id = mf_hostpool_alloc_fresh(&p, n, &err);
        CHECK_EQ_INT(id, i);
        void *ptr = mf_hostpool_ptr(&p, id);
        CHECK(ptr != NULL);
        CHECK_EQ_INT((uintptr_t)ptr % 64, 0);
        memset(ptr, i & 0xff, n); /* ASan catches a short allocation */
    }
    for (int i = 0; i < 300; i++) {
        size_t n = (size_t)(i * 37 % 1000);
        const unsigned char *q = mf_hostpool_ptr(&p, i);
        CHECK(n == 0 || (q[0] == (i & 0xff) && q[n - 1] == (i & 0xff)));
    }
    mf_hostpool_free(&p);
}

MF_TEST(read_write_roundtrip_and_bounds) {
    mf_hostpool p;
    mf_hostpool_init(&p, "cpu");
    mf_error err = {0};
    int32_t id = mf_hostpool_alloc(&p, 40, &err);
    float src[10], dst[10];
    srand(7);
    for (int i = 0; i < 10; i++)
        src[i] = (float)((double)rand() / RAND_MAX - 0.5);
    CHECK_EQ_INT(mf_hostpool_write(&p, id, 0, src, sizeof src, &err), 0);
    CHECK_EQ_INT(mf_hostpool_read(&p, id, 0, dst, sizeof dst, &err), 0);
    CHECK(memcmp(src, dst, sizeof src) == 0);
    /* a window in the middle */
    CHECK_EQ_INT(mf_hostpool_read(&p, id, 12, dst, 8, &err), 0);
    CHECK(memcmp(dst, src + 3, 8) == 0);
    CHECK_EQ_INT(mf_hostpool_read(&p, id, 40, dst, 0, &err), 0); /* empty at the end */

    CHECK_EQ_INT(mf_hostpool_read(&p, id, 36, dst, 8, &err), -1);
    CHECK_STR_CONTAINS(err.msg, "cpu: read_host buffer 0 [36, +8) out of range (size 40)");
    CHECK_EQ_INT(mf_hostpool_write(&p, id, 41, src, 0, &err), -1);
    CHECK_STR_CONTAINS(err.msg, "cpu: write_host buffer 0 [41, +0) out of range (size 40)");
    /* off + n would wrap around: still refused */
    CHECK_EQ_INT(mf_hostpool_write(&p, id, 8, src, SIZE_MAX - 4, &err), -1);
    CHECK_STR_CONTAINS(err.msg, "out of range");
    CHECK_EQ_INT(mf_hostpool_read(&p, 5, 0, dst, 4, &err), -1);
    CHECK_STR_CONTAINS(err.msg, "cpu: read_host buffer 5 is not in the pool (1 buffers)");
    CHECK_EQ_INT(mf_hostpool_write(&p, -1, 0, src, 4, &err), -1);
    CHECK_STR_CONTAINS(err.msg, "write_host buffer -1 is not in the pool");
    /* a refused write leaves the buffer as it was */
    CHECK_EQ_INT(mf_hostpool_read(&p, id, 0, dst, sizeof dst, &err), 0);
    CHECK(memcmp(src, dst, sizeof src) == 0);
    mf_hostpool_free(&p);
}

MF_TEST_MAIN(MF_T(ids_recycle_exact_size_only), MF_T(aligned_and_many), MF_T(read_write_roundtrip_and_bounds))
