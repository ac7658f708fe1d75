/* ktime.cu - the host side of the in-kernel timeline (lab build:
 * cmake -DMINFER_CUDA_KTIME=ON adds this file to mf_cuda): the per-file
 * rings' registry and the dump the backend prints when freed. */
#include "backend/cuda/cuda_args.h"
#include "backend/cuda/pdl.cuh"

#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

/* ---- the kernel timeline (pdl.cuh: one ring a file) ------------------------------------- */

#define KT_MAX_FILES 32
#define KT_GAP_NS 20000ull /* a step boundary when no getrows kernel marks the steps */

static struct {
    const char *name;
    mf_kt_fetch_fn fetch;
} kt_files[KT_MAX_FILES];
static int kt_n_files;
static int kt_dropped_files; /* registrations past KT_MAX_FILES */

/* Called by each file's static initializer (before main): plain stores into
 * zero-initialized statics, so the order of initializers does not matter. */
int mf_kt_register(const char *file, mf_kt_fetch_fn fetch) {
    if (kt_n_files >= KT_MAX_FILES) {
        kt_dropped_files++;
        return -1;
    }
    const char *slash = strrchr(file, '/');
    kt_files[kt_n_files].name = slash ? slash + 1 : file;
    kt_files[kt_n_files].fetch = fetch;
    kt_n_files++;
    return 0;
}

typedef struct kt_ev {
    unsigned long long t;
    unsigned int wait_ns, site, gx, gy, bx;
    int file;
} kt_ev;

/* a kernel in the summary: where it was called from and how it was launched */
typedef struct kt_key {
    int file;
    unsigned int site, gx, gy, bx;
    int n;
    double sum_us, min_us, max_us, wait_us;
} kt_key;

static bool kt_same(const kt_key &k, const kt_ev &e) {
    return k.file == e.file && k.site == e.site && k.gx == e.gx && k.gy == e.gy && k.bx == e.bx;
}

/* Prints the timeline of the records written since the last dump (see
 * pdl.cuh) to f and empties the rings: the files and their record counts,
 * the steps found (a step starts at each getrows kernel, else after a gap of
 * more than 20 us), every kernel of the last MINFER_KTIME_STEPS (4) steps
 * with the time from its release to the next kernel's release, and a
 * per-kernel summary over those steps. Call with the device idle. */
extern "C" void mf_cu_ktime_dump(FILE *f) {
    std::vector<kt_ev> ev;
    std::vector<mf_kt_rec> ring(MF_KT_CAP);
    unsigned long long cutoff = 0; /* before it, a wrapped ring lost records */
    int wrapped = 0;
    std::vector<unsigned long long> count(kt_n_files, 0);
    int failed = 0;
    for (int i = 0; i < kt_n_files; i++) {
        if (kt_files[i].fetch(ring.data(), &count[i])) {
            fprintf(f, "ktime: %s: reading the ring failed (%s)\n", kt_files[i].name,
                    cudaGetErrorString(cudaGetLastError()));
            failed++;
            continue;
        }
        const unsigned long long n = count[i];
        const unsigned long long kept = n < MF_KT_CAP ? n : MF_KT_CAP;
        unsigned long long first = ~0ull;
        for (unsigned long long j = 0; j < kept; j++) {
            const mf_kt_rec &r = ring[j];
            ev.push_back(kt_ev{r.t, r.wait_ns, r.site, r.gx, r.gy, r.bx, i});
            first = std::min(first, r.t);
        }
        if (n > MF_KT_CAP) {
            wrapped++;
            cutoff = std::max(cutoff, first);
        }
    }
    if (ev.empty() && !failed && !kt_dropped_files)
        return; /* nothing ran since the last dump (a test's second backend) */
    fprintf(f, "ktime: kernel timeline (MINFER_CUDA_KTIME): release = %%globaltimer after griddepcontrol.wait, "
               "block 0 thread 0; dt = release to the next kernel's release\n");
    if (kt_dropped_files)
        fprintf(f, "ktime: %d files not registered (more than %d)\n", kt_dropped_files, KT_MAX_FILES);
    for (int i = 0; i < kt_n_files; i++)
        if (count[i])
            fprintf(f, "ktime: file %2d %-18s %8llu records%s\n", i, kt_files[i].name, count[i],
                    count[i] > MF_KT_CAP ? " (ring wrapped: the oldest are gone)" : "");
    if (wrapped) {
        size_t before = ev.size();
        ev.erase(std::remove_if(ev.begin(), ev.end(), [&](const kt_ev &e) { return e.t < cutoff; }),
                 ev.end());
        fprintf(f, "ktime: %d rings wrapped: %zu records older than the newest wrap dropped\n", wrapped,
                before - ev.size());
    }
    if (ev.size() < 2) {
        fprintf(f, "ktime: %zu records, no timeline\n", ev.size());
        return;
    }
    std::stable_sort(ev.begin(), ev.end(), [](const kt_ev &a, const kt_ev &b) { return a.t < b.t; });
    const size_t ne = ev.size();

    /* %globaltimer's update interval differs between GPUs (as coarse as 1 us
     * on some): show what this one gave, so a 1-3 us dt is read with it */
    unsigned long long min_step = ~0ull;
    size_t whole_us = 0;
    for (size_t i = 0; i < ne; i++) {
        if (i > 0 && ev[i].t > ev[i - 1].t)
            min_step = std::min(min_step, ev[i].t - ev[i - 1].t);
        whole_us += ev[i].t % 1000 == 0;
    }
    fprintf(f, "ktime: %zu records; timer: smallest step between records %llu ns, %.0f%% of stamps whole us\n", ne,
            min_step, 100.0 * (double)whole_us / (double)ne);

    /* steps: each starts at a getrows kernel (the token embedding is a decode
     * step's first kernel); without one, after a gap of > 20 us */
    std::vector<size_t> start;
    for (size_t i = 0; i < ne; i++)
        if (strstr(kt_files[ev[i].file].name, "getrows"))
            start.push_back(i);
    const char *how = "a getrows kernel starts a step";
    if (start.size() < 2) {
        start.assign(1, 0);
        for (size_t i = 1; i < ne; i++)
            if (ev[i].t - ev[i - 1].t > KT_GAP_NS)
                start.push_back(i);
        how = "a gap > 20 us starts a step";
    }
    const size_t ns = start.size();
    start.push_back(ne); /* start[s + 1] ends step s */
    fprintf(f, "ktime: %zu steps (%s); per step: kernels, span first..last release us, start to next start us\n", ns,
            how);
    for (size_t s = ns > 40 ? ns - 40 : 0; s < ns; s++) {
        const size_t a = start[s], b = start[s + 1];
        fprintf(f, "ktime:   step %3zu %4zu kernels  span %9.2f", s, b - a, (double)(ev[b - 1].t - ev[a].t) / 1e3);
        if (b < ne)
            fprintf(f, "  period %9.2f", (double)(ev[b].t - ev[a].t) / 1e3);
        fprintf(f, "\n");
    }

    int want = 4;
    const char *env = getenv("MINFER_KTIME_STEPS");
    if (env && atoi(env) > 0)
        want = atoi(env);
    const size_t last = (size_t)want < ns ? (size_t)want : ns;
    std::vector<kt_key> keys;
    double span_sum = 0, period_sum = 0;
    size_t n_period = 0;
    for (size_t s = ns - last; s < ns; s++) {
        const size_t a = start[s], b = start[s + 1];
        span_sum += (double)(ev[b - 1].t - ev[a].t) / 1e3;
        if (b < ne) {
            period_sum += (double)(ev[b].t - ev[a].t) / 1e3;
            n_period++;
        }
        fprintf(f, "ktime: == step %zu: %zu kernels\nktime:    #    at_us   dt_us wait_us  file:site           grid       block\n",
                s, b - a);
        for (size_t i = a; i < b; i++) {
            const kt_ev &e = ev[i];
            const bool step_end = i + 1 == b;
            char dt[32] = "      -";
            if (i + 1 < ne)
                snprintf(dt, sizeof dt, "%7.2f%s", (double)(ev[i + 1].t - e.t) / 1e3, step_end ? "*" : "");
            fprintf(f, "ktime: %4zu %8.2f %s %7.2f  %-14s:%-4u %6u x %-4u %5u\n", i - a, (double)(e.t - ev[a].t) / 1e3,
                    dt, e.wait_ns / 1e3, kt_files[e.file].name, e.site, e.gx, e.gy, e.bx);
            if (step_end) /* its dt holds the gap to the next step: not a kernel time */
                continue;
            const double us = (double)(ev[i + 1].t - e.t) / 1e3;
            size_t k = 0;
            while (k < keys.size() && !kt_same(keys[k], e))
                k++;
            if (k == keys.size())
                keys.push_back(kt_key{e.file, e.site, e.gx, e.gy, e.bx, 0, 0, us, us, 0});
            kt_key &q = keys[k];
            q.n++;
            q.sum_us += us;
            q.min_us = std::min(q.min_us, us);
            q.max_us = std::max(q.max_us, us);
            q.wait_us += e.wait_ns / 1e3;
        }
        fprintf(f, "ktime:   (* = the step's last kernel: its dt runs to the next step's first release)\n");
    }

    /* per kernel (file, call site, grid, block), in first-seen order */
    double tot = 0;
    for (const kt_key &q : keys)
        tot += q.sum_us;
    fprintf(f, "ktime: == summary over the last %zu steps (each step's last kernel left out)\n"
               "ktime:  file:site           grid       block  per_step mean_us  min_us  max_us wait_us us_per_step    %%\n",
            last);
    for (const kt_key &q : keys)
        fprintf(f, "ktime:  %-14s:%-4u %6u x %-4u %5u %9.2f %7.2f %7.2f %7.2f %7.2f %11.2f %5.1f\n",
                kt_files[q.file].name, q.site, q.gx, q.gy, q.bx, (double)q.n / (double)last, q.sum_us / q.n, q.min_us,
                q.max_us, q.wait_us / q.n, q.sum_us / (double)last, tot > 0 ? 100.0 * q.sum_us / tot : 0.0);
    fprintf(f, "ktime: step total, mean over the last %zu steps: first .. last release %.2f us", last,
            span_sum / (double)last);
    if (n_period)
        fprintf(f, "; first release .. the next step's %.2f us (%zu steps)", period_sum / (double)n_period, n_period);
    fprintf(f, "\n");
}
