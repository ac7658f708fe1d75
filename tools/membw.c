/* membw.c - memory read-bandwidth probe (see membw.h). */
#include "membw.h"

#include <stdlib.h>
#include <string.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

typedef struct membw_job {
    uint64_t *buf;
    size_t n_words;
    int passes;
    bool fill;
    uint64_t sums[256]; /* per thread; slots past 255 are not checked */
} membw_job;

/* [lo, hi) word range of thread ith: contiguous slices, so each thread
 * streams its own pages (the ones it touched first when filling). */
static void slice(size_t n, int ith, int nth, size_t *lo, size_t *hi) {
    *lo = n / (size_t)nth * (size_t)ith;
    *hi = ith == nth - 1 ? n : n / (size_t)nth * (size_t)(ith + 1);
    /* 64-byte steps keep every slice aligned for the unrolled loop. */
    *lo &= ~(size_t)7;
    if (ith != nth - 1)
        *hi &= ~(size_t)7;
}

/* Wrapping 64-bit sum of w[lo, hi). Several independent accumulators, so the
 * loop is bound by loads, not by the add latency chain. */
static uint64_t sum_words(const uint64_t *w, size_t lo, size_t hi) {
    size_t i = lo;
    uint64_t s = 0;
#ifdef __SSE2__
    __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 8 <= hi; i += 8) {
        a0 = _mm_add_epi64(a0, _mm_load_si128((const __m128i *)(w + i)));
        a1 = _mm_add_epi64(a1, _mm_load_si128((const __m128i *)(w + i + 2)));
        a2 = _mm_add_epi64(a2, _mm_load_si128((const __m128i *)(w + i + 4)));
        a3 = _mm_add_epi64(a3, _mm_load_si128((const __m128i *)(w + i + 6)));
    }
    __m128i a = _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3));
    uint64_t lanes[2];
    _mm_storeu_si128((__m128i *)lanes, a);
    s = lanes[0] + lanes[1];
#else
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (; i + 4 <= hi; i += 4) {
        s0 += w[i];
        s1 += w[i + 1];
        s2 += w[i + 2];
        s3 += w[i + 3];
    }
    s = s0 + s1 + s2 + s3;
#endif
    for (; i < hi; i++)
        s += w[i];
    return s;
}

static void membw_worker(void *ctx, int ith, int nth) {
    membw_job *job = ctx;
    size_t lo, hi;
    slice(job->n_words, ith, nth, &lo, &hi);
    if (job->fill) {
        for (size_t i = lo; i < hi; i++)
            job->buf[i] = (uint64_t)i;
        return;
    }
    uint64_t s = 0;
    for (int p = 0; p < job->passes; p++)
        s += sum_words(job->buf, lo, hi);
    if (ith < 256)
        job->sums[ith] = s;
}

/* Sum of i for i in [lo, hi), wrapping like the kernel does. */
static uint64_t expected_sum(uint64_t lo, uint64_t hi) {
    uint64_t a = hi - lo, b = lo + hi - 1;
    /* One of a, b is even: halve it before the (wrapping) product. */
    return (a % 2 == 0) ? (a / 2) * b : a * (b / 2);
}

int mf_membw_measure(int n_threads, uint64_t bytes, int passes, int trials, mf_membw_result *out,
                     mf_error *err) {
    if (passes < 1 || trials < 1)
        return mf_errorf(err, "membw: %d passes x %d trials (each must be >= 1)", passes, trials);
    bytes &= ~(uint64_t)4095;
    if (bytes < 4096)
        bytes = 4096;
    void *mem = NULL;
    if (bytes > SIZE_MAX || posix_memalign(&mem, 4096, (size_t)bytes) != 0)
        return mf_errorf(err, "membw: cannot allocate a %.2f GiB buffer",
                         (double)bytes / (1024.0 * 1024.0 * 1024.0));
    mf_pool *pool = mf_pool_new(n_threads);
    membw_job *job = mf_calloc(1, sizeof *job);
    job->buf = mem;
    job->n_words = (size_t)(bytes / 8);
    job->passes = passes;
    job->fill = true;
    mf_pool_run(pool, membw_worker, job);
    job->fill = false;

    const int nth = mf_pool_size(pool);
    double best = 0, total = 0;
    for (int t = 0; t < trials; t++) {
        uint64_t t0 = mf_time_ns();
        mf_pool_run(pool, membw_worker, job);
        uint64_t dt = mf_time_ns() - t0;
        double gbps = (double)bytes * passes / (double)(dt ? dt : 1);
        total += gbps;
        if (gbps > best)
            best = gbps;
        /* The sums prove every word was read (and keep the loads alive). */
        for (int i = 0; i < nth && i < 256; i++) {
            size_t lo, hi;
            slice(job->n_words, i, nth, &lo, &hi);
            MF_ASSERT(job->sums[i] == expected_sum(lo, hi) * (uint64_t)passes);
        }
    }
    mf_pool_free(pool);
    free(job);
    free(mem);
    *out = (mf_membw_result){.gbps = best,
                             .gbps_mean = total / trials,
                             .bytes = bytes,
                             .n_threads = nth,
                             .passes = passes,
                             .trials = trials};
    return 0;
}
