/* pool.c - the worker thread pool (mf_pool_*) and mf_cpu_count.
 *
 * One parallel-for at a time: mf_pool_run publishes (fn, ctx) under a new
 * generation number, the caller runs as thread 0, workers run 1..n-1. A worker
 * that finished a job spins for a short while (mf_pool_set_spin_us: the
 * runtime's MINFER_POOL_SPIN_US, default 50 us) watching the generation counter, because the next matmul of a forward
 * pass usually follows within microseconds; after that it sleeps on a condition
 * variable, so an idle engine burns no CPU. The caller waits for the workers the
 * same way: spin briefly, then sleep.
 *
 * The generation and done counters are atomics so the spinning paths take no
 * lock; every sleep re-checks its condition under the mutex, and every state
 * change that a sleeper waits for is made (or followed by a signal) under the
 * same mutex, so no wake-up is lost.
 *
 * Not reentrant: fn must not call mf_pool_run on the pool that runs it, and one
 * pool serves one caller thread at a time. Separate pools are independent. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/base.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

typedef struct worker {
    mf_pool *pool;
    int ith;
    pthread_t thread;
} worker;

struct mf_pool {
    int n; /* threads including the caller */
    worker *workers; /* n - 1 of them */
    uint64_t spin_ns;

    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* generation advanced or stop requested */
    pthread_cond_t cv_done; /* the last worker finished the job */

    /* the job; written by the caller before the generation is bumped */
    mf_pool_fn fn;
    void *ctx;

    _Atomic uint64_t gen;
    _Atomic int n_done; /* workers finished with the current generation */
    _Atomic int stop;
};

int mf_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0)
            return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Spins until the generation moves past seen (or stop is set): true, or
 * until spin_ns passed: false, and the caller goes to sleep. */
static bool spin_until_gen_changes(mf_pool *p, uint64_t seen) {
    const uint64_t t0 = mf_time_ns();
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&p->gen, memory_order_acquire) != seen ||
            atomic_load_explicit(&p->stop, memory_order_acquire))
            return true;
        cpu_relax();
        if ((i & 63) == 0 && mf_time_ns() - t0 > p->spin_ns)
            return false;
    }
}

static void *worker_main(void *arg) {
    worker *w = arg;
    mf_pool *p = w->pool;
    uint64_t seen = 0;
    for (;;) {
        if (!spin_until_gen_changes(p, seen)) {
            pthread_mutex_lock(&p->mu);
            while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen &&
                   !atomic_load_explicit(&p->stop, memory_order_acquire))
                pthread_cond_wait(&p->cv_work, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            return NULL;
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        p->fn(p->ctx, w->ith, p->n);
        if (atomic_fetch_add_explicit(&p->n_done, 1, memory_order_acq_rel) + 1 == p->n - 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static _Atomic long pool_spin_us = 50;

void mf_pool_set_spin_us(long us) {
    atomic_store_explicit(&pool_spin_us, us, memory_order_relaxed);
}

/* Creates n_threads - 1 workers (n_threads <= 0: one per core). Returns NULL
 * only if the OS refuses threads, after logging why. */
mf_pool *mf_pool_new(int n_threads) {
    if (n_threads <= 0)
        n_threads = mf_cpu_count();
    mf_pool *p = mf_calloc(1, sizeof *p);
    p->n = n_threads;
    const long spin_us = atomic_load_explicit(&pool_spin_us, memory_order_relaxed);
    p->spin_ns = spin_us > 0 ? (uint64_t)spin_us * 1000u : 0;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->n_done, 0);
    atomic_init(&p->stop, 0);
    p->workers = mf_calloc((size_t)n_threads, sizeof *p->workers);
    for (int i = 1; i < n_threads; i++) {
        worker *w = &p->workers[i - 1];
        w->pool = p;
        w->ith = i;
        int rc = pthread_create(&w->thread, NULL, worker_main, w);
        if (rc != 0) {
            mf_log(MF_LOG_ERROR, "thread pool: pthread_create for worker %d of %d failed (error %d)",
                   i, n_threads, rc);
            p->n = i; /* free joins exactly the workers that exist */
            mf_pool_free(p);
            return NULL;
        }
    }
    return p;
}

void mf_pool_free(mf_pool *p) {
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->stop, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++)
        pthread_join(p->workers[i - 1].thread, NULL);
    pthread_cond_destroy(&p->cv_done);
    pthread_cond_destroy(&p->cv_work);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p);
}

int mf_pool_size(const mf_pool *p) { return p ? p->n : 1; }

/* Runs fn(ctx, ith, n) for ith in [0, n): the caller is thread 0. Returns
 * after every thread returned from fn; the writes fn made on any thread are
 * visible to the caller afterwards (acq_rel on n_done, or the mutex). A NULL
 * pool runs fn(ctx, 0, 1). */
void mf_pool_run(mf_pool *p, mf_pool_fn fn, void *ctx) {
    if (!p || p->n <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    const int n_workers = p->n - 1;
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->n_done, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);

    fn(ctx, 0, p->n);

    const uint64_t t0 = mf_time_ns();
    for (unsigned i = 1; atomic_load_explicit(&p->n_done, memory_order_acquire) < n_workers; i++) {
        cpu_relax();
        if ((i & 63) == 0 && mf_time_ns() - t0 > p->spin_ns) {
            pthread_mutex_lock(&p->mu);
            while (atomic_load_explicit(&p->n_done, memory_order_acquire) < n_workers)
                pthread_cond_wait(&p->cv_done, &p->mu);
            pthread_mutex_unlock(&p->mu);
            break;
        }
    }
}
