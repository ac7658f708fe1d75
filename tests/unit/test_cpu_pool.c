/* test_cpu_pool.c - the thread pool (mf_pool_*, in mf_base): partitioned
 * sums equal the serial result for several thread counts, every index is
 * visited once, many back-to-back runs (spinning and sleeping workers), and
 * two pools used at once from two threads. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "mf_test.h"

#define N_ITEMS 1000000

typedef struct sum_job {
    const uint32_t *v;
    uint8_t *seen;
    uint64_t part[64];
    int nth_seen;
} sum_job;

static void sum_fn(void *ctx, int ith, int nth) {
    sum_job *j = ctx;
    const int64_t per = (N_ITEMS + nth - 1) / nth;
    const int64_t i0 = ith * per, i1 = i0 + per < N_ITEMS ? i0 + per : N_ITEMS;
    uint64_t s = 0;
    for (int64_t i = i0; i < i1; i++) {
        s += j->v[i];
        j->seen[i]++;
    }
    j->part[ith] = s;
    if (ith == 0)
        j->nth_seen = nth;
}

static uint32_t *make_values(void) {
    uint32_t *v = malloc(sizeof(uint32_t) * N_ITEMS);
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < N_ITEMS; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v[i] = (uint32_t)x;
    }
    return v;
}

MF_TEST(sum_matches_serial) {
    uint32_t *v = make_values();
    uint64_t serial = 0;
    for (int i = 0; i < N_ITEMS; i++)
        serial += v[i];
    const int counts[3] = {1, 2, 4};
    for (int k = 0; k < 3; k++) {
        mf_pool *p = mf_pool_new(counts[k]);
        CHECK(p != NULL);
        CHECK_EQ_INT(mf_pool_size(p), counts[k]);
        sum_job *j = calloc(1, sizeof *j);
        j->v = v;
        j->seen = calloc(N_ITEMS, 1);
        for (int run = 0; run < 20; run++) {
            memset(j->part, 0, sizeof j->part);
            mf_pool_run(p, sum_fn, j);
            uint64_t s = 0;
            for (int t = 0; t < counts[k]; t++)
                s += j->part[t];
            CHECK_MSG(s == serial, "%d threads run %d: %llu != %llu", counts[k], run, (unsigned long long)s,
                      (unsigned long long)serial);
            CHECK_EQ_INT(j->nth_seen, counts[k]);
            if (run == 4)
                usleep(2000); /* workers fall asleep: the condvar path */
        }
        int bad = 0;
        for (int i = 0; i < N_ITEMS; i++)
            bad += j->seen[i] != 20;
        CHECK_MSG(bad == 0, "%d threads: %d items not visited exactly once per run", counts[k], bad);
        free(j->seen);
        free(j);
        mf_pool_free(p);
    }
    free(v);
}

typedef struct count_job {
    int hits[16];
} count_job;

static void count_fn(void *ctx, int ith, int nth) {
    (void)nth;
    ((count_job *)ctx)->hits[ith]++;
}

/* Many tiny runs: a lost wake-up or a missed completion would hang or miscount. */
static void *hammer(void *arg) {
    mf_pool *p = arg;
    count_job j;
    memset(&j, 0, sizeof j);
    for (int r = 0; r < 3000; r++) {
        mf_pool_run(p, count_fn, &j);
        if (r % 500 == 0)
            usleep(300);
    }
    int ok = 1;
    for (int t = 0; t < mf_pool_size(p); t++)
        ok &= j.hits[t] == 3000;
    return ok ? p : NULL;
}

MF_TEST(many_runs_two_pools) {
    mf_pool *a = mf_pool_new(3), *b = mf_pool_new(2);
    pthread_t ta, tb;
    void *ra = NULL, *rb = NULL;
    pthread_create(&ta, NULL, hammer, a);
    pthread_create(&tb, NULL, hammer, b);
    pthread_join(ta, &ra);
    pthread_join(tb, &rb);
    CHECK(ra == a);
    CHECK(rb == b);
    mf_pool_free(a);
    mf_pool_free(b);
}

MF_TEST(defaults) {
    CHECK(mf_cpu_count() >= 1);
    mf_pool *p = mf_pool_new(0);
    CHECK_EQ_INT(mf_pool_size(p), mf_cpu_count());
    mf_pool_free(p);
    count_job j;
    memset(&j, 0, sizeof j);
    mf_pool_run(NULL, count_fn, &j); /* no pool: runs inline as thread 0 of 1 */
    CHECK_EQ_INT(j.hits[0], 1);
}

MF_TEST_MAIN(MF_T(sum_matches_serial), MF_T(many_runs_two_pools), MF_T(defaults))
