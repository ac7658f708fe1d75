/* The MSL emulator's execution: one fiber per GPU thread of a threadgroup,
 * run cooperatively on the dispatching OS thread. A fiber runs until it
 * reaches a synchronisation point (a simd collective or a barrier) or
 * returns; the schedule (forward / reverse / random) decides which runnable
 * fiber goes next. Fibers are created once per OS thread (mmap'd stacks with
 * a guard page, makecontext) and reused for every GPU thread after that:
 * switching is _setjmp/_longjmp, no system call. */
#include "emu_rt.h"
#include "emu_internal.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MF_EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define MF_EMU_ASAN 1
#endif
#ifdef MF_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#define MF_STACK_BYTES (512u * 1024u)
#else
#define MF_STACK_BYTES (128u * 1024u)
#endif

enum { F_RUN = 0, F_SIMD = 1, F_BAR = 2, F_DONE = 3 };

typedef struct fiber {
    jmp_buf ctx;
    unsigned char *map; /* guard page + stack */
    size_t map_len;
    int state;
    int started;        /* bootstrapped: sits at the top of its loop */
    uint32_t tid, lane, sg;
    uint32_t simd_gen;  /* generation of the collective it last joined */
    uint32_t simd_mask; /* the lanes it exchanged with there */
    const char *wfile;  /* where it waits */
    unsigned wline;
#ifdef MF_EMU_ASAN
    void *fake;
#endif
} fiber;

typedef struct simdgroup {
    uint32_t live, arrived;
    uint32_t gen;

    unsigned char slots[2][MF_EMU_SIMD_WIDTH][MF_EMU_SLOT_BYTES];
} simdgroup;

typedef struct worker {
    fiber fibers[MF_EMU_MAX_THREADS];
    int nfibers;      /* created so far */
    simdgroup sgs[MF_EMU_MAX_THREADS / MF_EMU_SIMD_WIDTH];
    jmp_buf sched;
    sigjmp_buf fault;
    int in_dispatch;
    fiber *cur;
    /* the dispatch */
    const mf_emu_launch *l;
    void *bind[64];
    uint32_t group[3];
    uint32_t nthreads;
    uint32_t ndone;
    uint32_t bar_arrived;
    int failed;
    char *err;
    size_t errcap;
    unsigned char *tg_map; /* threadgroup arena: MF_EMU_TG_LIMIT + a guard page */
    size_t tg_map_len;
    void *altstack;
#ifdef MF_EMU_ASAN
    const void *main_bottom;
    size_t main_size;
    void *main_fake;
#endif
} worker;

static _Thread_local worker *g_w;

/* ---- registry ------------------------------------------------------------ */
static mf_emu_kernel *g_kernels;

void mf_emu_register(mf_emu_kernel *k)
{
    k->next = g_kernels;
    g_kernels = k;
}

const mf_emu_kernel *mf_emu_find(const char *name)
{
    for (mf_emu_kernel *k = g_kernels; k; k = k->next)
        if (!k->hidden && strcmp(k->name, name) == 0)
            return k;
    return NULL;
}

int mf_emu_hide(const char *name, int hidden)
{
    for (mf_emu_kernel *k = g_kernels; k; k = k->next)
        if (strcmp(k->name, name) == 0) {
            k->hidden = hidden;
            return 0;
        }
    return -1;
}

const char *mf_emu_kernel_name(int i)
{
    for (mf_emu_kernel *k = g_kernels; k; k = k->next)
        if (!k->hidden && i-- == 0)
            return k->name;
    return NULL;
}

int mf_emu_kernel_count(void)
{
    int n = 0;
    for (mf_emu_kernel *k = g_kernels; k; k = k->next)
        n += !k->hidden;
    return n;
}

/* ---- schedule ------------------------------------------------------------ */
static int g_sched = -1;
static uint64_t g_seed = 1;

void mf_emu_set_schedule(int schedule, uint64_t seed)
{
    g_sched = schedule;
    g_seed = seed ? seed : 1;
}

int mf_emu_get_schedule(uint64_t *seed)
{
    if (g_sched < 0) {
        const char *e = getenv("MINFER_EMU_SCHEDULE");
        g_sched = MF_EMU_FORWARD;
        if (e && strcmp(e, "reverse") == 0)
            g_sched = MF_EMU_REVERSE;
        else if (e && strncmp(e, "random", 6) == 0) {
            g_sched = MF_EMU_RANDOM;
            if (e[6] == ':')
                g_seed = strtoull(e + 7, NULL, 10);
            if (!g_seed)
                g_seed = 1;
        } else if (e && *e && strcmp(e, "forward") != 0) {
            fprintf(stderr, "MINFER_EMU_SCHEDULE=%s: expected forward, reverse or random[:seed]\n", e);
            exit(2);
        }
    }
    if (seed)
        *seed = g_seed;
    return g_sched;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* ---- errors -------------------------------------------------------------- */
static void fail(worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(worker *w, const char *fmt, ...)
{
    if (w->failed)
        return;
    w->failed = 1;
    const mf_emu_launch *l = w->l;
    int n = snprintf(w->err, w->errcap, "kernel %s threadgroup (%u,%u,%u): ", l->kernel->name,
                     w->group[0], w->group[1], w->group[2]);
    if (n < 0 || (size_t)n >= w->errcap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err + n, w->errcap - (size_t)n, fmt, ap);
    va_end(ap);
}

/* ---- fibers -------------------------------------------------------------- */
static void to_sched(worker *w, fiber *f)
{
#ifdef MF_EMU_ASAN
    __sanitizer_start_switch_fiber(&f->fake, w->main_bottom, w->main_size);
#endif
    if (!_setjmp(f->ctx))
        _longjmp(w->sched, 1);
#ifdef MF_EMU_ASAN
    __sanitizer_finish_switch_fiber(f->fake, NULL, NULL);
#endif
}

static void to_fiber(worker *w, fiber *f)
{
    w->cur = f;
#ifdef MF_EMU_ASAN
    __sanitizer_start_switch_fiber(&w->main_fake, f->map + getpagesize(), f->map_len - (size_t)getpagesize());
#endif
    if (!_setjmp(w->sched))
        _longjmp(f->ctx, 1);
#ifdef MF_EMU_ASAN
    __sanitizer_finish_switch_fiber(w->main_fake, &w->main_bottom, &w->main_size);
#endif
    w->cur = NULL;
}

static void thread_done(worker *w, fiber *f);

static void fiber_main(void)
{
    worker *w = g_w;
    fiber *f = w->cur;
#ifdef MF_EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &w->main_bottom, &w->main_size);
#endif
    to_sched(w, f); /* bootstrapped: wait for the first GPU thread */
    for (;;) {
        w = g_w;
        w->l->kernel->thunk(w->bind);
        f = w->cur;
        thread_done(w, f);
        to_sched(w, f);
    }
}

static int fiber_boot(worker *w, fiber *f)
{
    size_t pg = (size_t)getpagesize();
    if (!f->map) {
        f->map_len = MF_STACK_BYTES + pg;
        f->map = mmap(NULL, f->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (f->map == MAP_FAILED) {
            f->map = NULL;
            return -1;
        }
        mprotect(f->map, pg, PROT_NONE); /* stack overflow faults, not corrupts */
        mf_emu_mem_label_range(f->map, pg, "a fiber's stack guard (the kernel overflowed its stack)");
    }
    ucontext_t uc, back;
    if (getcontext(&uc) != 0)
        return -1;
    uc.uc_stack.ss_sp = f->map + pg;
    uc.uc_stack.ss_size = f->map_len - pg;
    uc.uc_link = NULL;
    makecontext(&uc, fiber_main, 0);
    w->cur = f;
    /* fiber_main jumps back to w->sched once it sits at the top of its loop */
#ifdef MF_EMU_ASAN
    __sanitizer_start_switch_fiber(&w->main_fake, uc.uc_stack.ss_sp, uc.uc_stack.ss_size);
#endif
    if (!_setjmp(w->sched))
        swapcontext(&back, &uc);
#ifdef MF_EMU_ASAN
    __sanitizer_finish_switch_fiber(w->main_fake, &w->main_bottom, &w->main_size);
#endif
    w->cur = NULL;
    f->started = 1;
    return 0;
}



/* A thread's worker goes with the thread (queues' GPU threads come and go). */
static pthread_key_t g_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;

static void worker_free(void *p)
{
    worker *w = p;
    for (int i = 0; i < MF_EMU_MAX_THREADS; i++)
        if (w->fibers[i].map) {
            mf_emu_mem_unregister(w->fibers[i].map);
            munmap(w->fibers[i].map, w->fibers[i].map_len);
        }
    mf_emu_mem_unregister(w->tg_map + MF_EMU_TG_LIMIT);
    munmap(w->tg_map, w->tg_map_len);
    if (w->altstack) {
        stack_t ss = { .ss_sp = NULL, .ss_size = 0, .ss_flags = SS_DISABLE };
        sigaltstack(&ss, NULL);
        free(w->altstack);
    }
    free(w);
    g_w = NULL;
}

static void key_create(void) { pthread_key_create(&g_key, worker_free); }

static worker *worker_get(void)
{
    if (g_w)
        return g_w;
    worker *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    size_t pg = (size_t)getpagesize();
    w->tg_map_len = MF_EMU_TG_LIMIT + pg;
    w->tg_map = mmap(NULL, w->tg_map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (w->tg_map == MAP_FAILED) {
        free(w);
        return NULL;
    }
    mprotect(w->tg_map + MF_EMU_TG_LIMIT, pg, PROT_NONE);
    mf_emu_mem_label_range(w->tg_map + MF_EMU_TG_LIMIT, pg, "threadgroup memory (end)");
    /* faults are handled on their own stack: a fiber's may be the one that
     * overflowed (a sanitizer runtime may have installed one already) */
    stack_t old;
    if (sigaltstack(NULL, &old) == 0 && (old.ss_flags & SS_DISABLE)) {
        size_t alt = 64 * 1024;
        w->altstack = malloc(alt);
        stack_t ss = { .ss_sp = w->altstack, .ss_size = alt, .ss_flags = 0 };
        if (w->altstack && sigaltstack(&ss, NULL) != 0) {
            free(w->altstack);
            w->altstack = NULL;
        }
    }
    mf_emu_install_fault_handler();
    pthread_once(&g_key_once, key_create);
    pthread_setspecific(g_key, w);
    g_w = w;
    return w;
}

/* ---- the fault path (called from the SIGSEGV/SIGBUS handler) -------------- */
int mf_emu_fault(void *addr)
{
    worker *w = g_w;
    if (!w || !w->in_dispatch)
        return 0;
    char what[256];
    mf_emu_mem_describe(addr, what, sizeof what);
    if (w->cur)
        fail(w, "memory fault at %p (%s) in thread %u", addr, what, w->cur->tid);
    else
        fail(w, "memory fault at %p (%s)", addr, what);
#ifdef MF_EMU_ASAN
    if (w->cur) /* the fiber is abandoned: back to the thread's own stack */
        __sanitizer_start_switch_fiber(NULL, w->main_bottom, w->main_size);
#endif
    siglongjmp(w->fault, 1);
}

/* ---- synchronisation ------------------------------------------------------ */
/* Every live lane of the simdgroup waits at a collective: release them.
 * Lanes at the same call site exchange with each other (the active lanes of
 * a divergent branch, as SIMT hardware runs it). */
static void simd_release(worker *w, simdgroup *s)
{
    uint32_t gen = s->gen++;
    uint32_t base = (uint32_t)(s - w->sgs) * MF_EMU_SIMD_WIDTH;
    uint32_t left = s->arrived;
    while (left) {
        fiber *lead = &w->fibers[base + (uint32_t)__builtin_ctz(left)];
        uint32_t group = 0;
        for (uint32_t l = 0; l < MF_EMU_SIMD_WIDTH; l++) {
            const fiber *f = &w->fibers[base + l];
            if ((left >> l & 1u) && f->wline == lead->wline && strcmp(f->wfile, lead->wfile) == 0)
                group |= 1u << l;
        }
        for (uint32_t l = 0; l < MF_EMU_SIMD_WIDTH; l++)
            if (group >> l & 1u) {
                fiber *f = &w->fibers[base + l];
                f->state = F_RUN;
                f->simd_gen = gen;
                f->simd_mask = group;
            }
        left &= ~group;
    }
    s->arrived = 0;
}

void mf_emu_simd_sync(const void *val, unsigned size, mf_emu_simd_view *out, const char *file, unsigned line)
{
    worker *w = g_w;
    fiber *f = w->cur;
    simdgroup *s = &w->sgs[f->sg];
    if (size)
        memcpy(s->slots[s->gen & 1][f->lane], val, size);
    s->arrived |= 1u << f->lane;
    f->state = F_SIMD;
    f->wfile = file;
    f->wline = line;
    if (s->arrived == s->live)
        simd_release(w, s);
    else
        to_sched(w, f);
    out->slots = &s->slots[f->simd_gen & 1][0][0];
    out->mask = f->simd_mask;
    out->lane = f->lane;
}

void mf_emu_barrier(unsigned flags, const char *file, unsigned line)
{
    (void)flags;
    worker *w = g_w;
    fiber *f = w->cur;
    f->state = F_BAR;
    f->wfile = file;
    f->wline = line;
    if (++w->bar_arrived == w->nthreads) {
        for (uint32_t i = 0; i < w->nthreads; i++) {
            fiber *g = &w->fibers[i];
            if (g->wline != line || strcmp(g->wfile, file) != 0) {
                fail(w, "DIVERGENCE: threads at different barriers: thread %u at %s:%u, thread %u at %s:%u", g->tid,
                     g->wfile, g->wline, f->tid, file, line);
                to_sched(w, f);
            }
        }
        for (uint32_t i = 0; i < w->nthreads; i++)
            w->fibers[i].state = F_RUN;
        w->bar_arrived = 0;
    } else {
        to_sched(w, f);
    }
}

static void thread_done(worker *w, fiber *f)
{
    f->state = F_DONE;
    w->ndone++;
    simdgroup *s = &w->sgs[f->sg];
    s->live &= ~(1u << f->lane);
    if (s->arrived && s->arrived == s->live)
        simd_release(w, s);
}

void mf_emu_builtin3(int id, uint32_t o[3])
{
    worker *w = g_w;
    const fiber *f = w->cur;
    const uint32_t *nt = w->l->threads, *ng = w->l->groups;
    uint32_t t[3] = { f->tid % nt[0], f->tid / nt[0] % nt[1], f->tid / (nt[0] * nt[1]) };
    o[0] = o[1] = o[2] = 0;
    switch (id) {
    case MF_EMU_B_THREAD_POSITION_IN_GRID:
        for (int i = 0; i < 3; i++) o[i] = w->group[i] * nt[i] + t[i];
        break;
    case MF_EMU_B_THREADGROUP_POSITION_IN_GRID: memcpy(o, w->group, 12); break;
    case MF_EMU_B_THREAD_POSITION_IN_THREADGROUP: memcpy(o, t, 12); break;
    case MF_EMU_B_THREADS_PER_THREADGROUP: memcpy(o, nt, 12); break;
    case MF_EMU_B_THREADGROUPS_PER_GRID: memcpy(o, ng, 12); break;
    case MF_EMU_B_THREADS_PER_GRID:
        for (int i = 0; i < 3; i++) o[i] = ng[i] * nt[i];
        break;
    case MF_EMU_B_THREAD_INDEX_IN_THREADGROUP: o[0] = f->tid; break;
    case MF_EMU_B_THREAD_INDEX_IN_SIMDGROUP: o[0] = f->lane; break;
    case MF_EMU_B_SIMDGROUP_INDEX_IN_THREADGROUP: o[0] = f->sg; break;
    case MF_EMU_B_THREADS_PER_SIMDGROUP: o[0] = MF_EMU_SIMD_WIDTH; break;
    case MF_EMU_B_SIMDGROUPS_PER_THREADGROUP: o[0] = (w->nthreads + MF_EMU_SIMD_WIDTH - 1) / MF_EMU_SIMD_WIDTH; break;
    default: break;
    }
}

void mf_emu_kernel_fail(const char *msg, const char *file, unsigned line)
{
    worker *w = g_w;
    fail(w, "%s at %s:%u", msg, file, line);
    to_sched(w, w->cur);
}

/* ---- checks before a dispatch -------------------------------------------- */
static int check_launch(const mf_emu_launch *l, char *err, size_t cap, size_t *tg_off, size_t *tg_total)
{
    const mf_emu_kernel *k = l->kernel;
    uint64_t nt = (uint64_t)l->threads[0] * l->threads[1] * l->threads[2];
    if (nt == 0 || nt > MF_EMU_MAX_THREADS) {
        snprintf(err, cap, "kernel %s: %llu threads per threadgroup (limit %d)", k->name, (unsigned long long)nt,
                 MF_EMU_MAX_THREADS);
        return -1;
    }
    size_t total = 0;
    for (int i = 0; i < k->nargs; i++) {
        const mf_emu_arg *a = &k->args[i];
        if (a->kind == MF_EMU_ARG_BUFFER) {
            const void *p = l->buf[a->index];
            if (!p) {
                snprintf(err, cap, "kernel %s: buffer(%d) '%s' (%s) is not bound", k->name, a->index, a->name, a->type);
                return -1;
            }
            if ((uintptr_t)p % a->align) {
                snprintf(err, cap, "kernel %s: buffer(%d) '%s' (%s) at %p is not %zu-byte aligned", k->name, a->index,
                         a->name, a->type, p, a->align);
                return -1;
            }
            if (a->is_ref && l->buf_len[a->index] < a->size) {
                snprintf(err, cap,
                         "kernel %s: buffer(%d) '%s' (%s) is %zu bytes in the kernel but %zu bytes are bound "
                         "(host and kernel structs differ)",
                         k->name, a->index, a->name, a->type, a->size, l->buf_len[a->index]);
                return -1;
            }
        } else if (a->kind == MF_EMU_ARG_THREADGROUP) {
            size_t n = l->tg_len[a->index];
            if (n == 0) {
                snprintf(err, cap, "kernel %s: threadgroup(%d) '%s' has no length set", k->name, a->index, a->name);
                return -1;
            }
            tg_off[i] = total;
            total += (n + 15) & ~(size_t)15;
        }
    }
    if (total > MF_EMU_TG_LIMIT) {
        snprintf(err, cap, "kernel %s: %zu bytes of threadgroup memory (limit %d)", k->name, total, MF_EMU_TG_LIMIT);
        return -1;
    }
    *tg_total = total;
    return 0;
}

/* Runs the fibers of one threadgroup until all return or it stalls. */
static void run_group(worker *w, int sched, uint64_t *rng, uint32_t *order)
{
    uint32_t n = w->nthreads;
    while (w->ndone < n && !w->failed) {
        int progressed = 0;
        if (sched == MF_EMU_RANDOM)
            for (uint32_t i = n - 1; i > 0; i--) {
                uint32_t j = (uint32_t)(rng_next(rng) % (i + 1));
                uint32_t t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
        for (uint32_t k = 0; k < n && !w->failed; k++) {
            uint32_t i = sched == MF_EMU_FORWARD ? k : sched == MF_EMU_REVERSE ? n - 1 - k : order[k];
            fiber *f = &w->fibers[i];
            if (f->state == F_RUN) {
                to_fiber(w, f);
                progressed = 1;
            }
        }
        if (w->failed || w->ndone == n || progressed)
            continue;
        /* stalled: nobody can run */
        uint32_t nbar = 0, nsimd = 0;
        const fiber *fb = NULL, *fs = NULL;
        for (uint32_t i = 0; i < n; i++) {
            const fiber *f = &w->fibers[i];
            if (f->state == F_BAR) {
                nbar++;
                if (!fb) fb = f;
            } else if (f->state == F_SIMD) {
                nsimd++;
                if (!fs) fs = f;
            }
        }
        if (fb && w->ndone)
            fail(w, "DEADLOCK: threadgroup_barrier at %s:%u: %u of %u threads arrived, %u returned before it", fb->wfile,
                 fb->wline, nbar, n, w->ndone);
        else if (fb && fs)
            fail(w, "DIVERGENCE: %u threads at threadgroup_barrier %s:%u while %u wait at simd collective %s:%u",
                 nbar, fb->wfile, fb->wline, nsimd, fs->wfile, fs->wline);
        else
            fail(w, "DEADLOCK: no thread can proceed (%u at barriers, %u at simd collectives, %u returned)", nbar, nsimd,
                 w->ndone);
    }
}

/* The threadgroups of one dispatch, in schedule order (a fault jumps out). */
static void run_grid(worker *w, const mf_emu_launch *l, unsigned char *tg, size_t tg_total, uint32_t n, int sched,
                     uint64_t seed)
{
    uint64_t rng = seed ^ 0x9e3779b97f4a7c15ull;
    uint32_t order[MF_EMU_MAX_THREADS];
    for (uint32_t i = 0; i < n; i++)
        order[i] = i;
    uint32_t ngroups = l->groups[0] * l->groups[1] * l->groups[2];
    for (uint32_t g = 0; g < ngroups && !w->failed; g++) {
        uint32_t gi = sched == MF_EMU_REVERSE ? ngroups - 1 - g : g;
        w->group[0] = gi % l->groups[0];
        w->group[1] = gi / l->groups[0] % l->groups[1];
        w->group[2] = gi / (l->groups[0] * l->groups[1]);
        memset(tg, 0xff, tg_total); /* NaN in every float/half: reads before writes show */
        for (uint32_t i = 0; i < n; i++) {
            fiber *f = &w->fibers[i];
            f->state = F_RUN;
            f->tid = i;
            f->lane = i % MF_EMU_SIMD_WIDTH;
            f->sg = i / MF_EMU_SIMD_WIDTH;
            f->wfile = "";
            f->wline = 0;
        }
        for (uint32_t s = 0; s * MF_EMU_SIMD_WIDTH < n; s++) {
            uint32_t lanes = n - s * MF_EMU_SIMD_WIDTH;
            w->sgs[s].live = lanes >= 32 ? 0xffffffffu : ((1u << lanes) - 1u);
            w->sgs[s].arrived = 0;
            w->sgs[s].gen = 0;
        }
        w->ndone = 0;
        w->bar_arrived = 0;
        run_group(w, sched, &rng, order);
    }
}

/* A fault inside the grid jumps back here (nothing live but the job). */
typedef struct grid_job {
    worker *w;
    const mf_emu_launch *l;
    unsigned char *tg;
    size_t tg_total;
    uint32_t n;
    int sched;
    uint64_t seed;
} grid_job;

static void run_guarded(const grid_job *j)
{
    if (sigsetjmp(j->w->fault, 1) != 0) {
#ifdef MF_EMU_ASAN
        if (j->w->cur)
            __sanitizer_finish_switch_fiber(NULL, NULL, NULL);
#endif
        return;
    }
    run_grid(j->w, j->l, j->tg, j->tg_total, j->n, j->sched, j->seed);
}

int mf_emu_dispatch(const mf_emu_launch *l, char *err, size_t errcap)
{
    size_t tg_off[64] = { 0 }, tg_total = 0;
    if (!l->kernel) {
        snprintf(err, errcap, "dispatch without a kernel");
        return -1;
    }
    if (l->kernel->nargs > 64) {
        snprintf(err, errcap, "kernel %s: %d parameters", l->kernel->name, l->kernel->nargs);
        return -1;
    }
    if (check_launch(l, err, errcap, tg_off, &tg_total) != 0)
        return -1;
    worker *w = worker_get();
    if (!w) {
        snprintf(err, errcap, "kernel %s: emulator out of memory", l->kernel->name);
        return -1;
    }
    uint32_t n = l->threads[0] * l->threads[1] * l->threads[2];
    for (uint32_t i = 0; i < n; i++)
        if (!w->fibers[i].started && fiber_boot(w, &w->fibers[i]) != 0) {
            snprintf(err, errcap, "kernel %s: cannot create fiber %u", l->kernel->name, i);
            return -1;
        }
    const mf_emu_kernel *k = l->kernel;
    unsigned char *tg = w->tg_map + MF_EMU_TG_LIMIT - tg_total; /* ends at the guard page */
    for (int i = 0; i < k->nargs; i++) {
        const mf_emu_arg *a = &k->args[i];
        w->bind[i] = a->kind == MF_EMU_ARG_BUFFER ? l->buf[a->index]
                   : a->kind == MF_EMU_ARG_THREADGROUP ? (void *)(tg + tg_off[i]) : NULL;
    }
    w->l = l;
    w->nthreads = n;
    w->failed = 0;
    w->err = err;
    w->errcap = errcap;
    err[0] = 0;
    uint64_t seed;
    int sched = mf_emu_get_schedule(&seed);
    w->in_dispatch = 1;
    grid_job job = { w, l, tg, tg_total, n, sched, seed };
    run_guarded(&job);
    w->in_dispatch = 0;
    w->cur = NULL;
    if (w->failed) {
        /* fibers were left mid-kernel: bootstrap them again next time */
        for (uint32_t i = 0; i < n; i++)
            w->fibers[i].started = 0;
        return -1;
    }
    return 0;
}
