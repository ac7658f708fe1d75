/* gguf_guard.c - the policy for a model file that changes under its mapping.
 *
 * Tensor data are read straight from a MAP_PRIVATE mapping of the file. If
 * the file is truncated while mapped (replaced in place, a full disk that
 * rolled back a copy), the kernel answers a read of a page past the new end
 * with SIGBUS, on whichever thread touched it: a worker of the CPU pool, a
 * device upload. There is no sound way to resume the forward pass that was
 * running (its threads hold locks and half-written activations), so the
 * policy is: a SIGBUS whose address lies in a registered model mapping ends
 * the process at once with one line naming the file and the offset and exit
 * status MF_GGUF_SIGBUS_EXIT, instead of a bare "Bus error" core dump. A
 * SIGBUS anywhere else keeps the default action. Processes that must survive
 * files being replaced under them set MINFER_NO_MMAP=1: the file is then
 * read into anonymous memory at open (gguf_read.c), which nothing outside
 * the process can take away. */
#include "gguf/gguf_impl.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define GUARD_SLOTS 64

typedef struct guard_slot {
    _Atomic uintptr_t lo, hi; /* [lo, hi) of a mapping; lo == 0: free */
    char path[256];           /* escaped, for the message */
} guard_slot;

static guard_slot slots[GUARD_SLOTS];
static pthread_mutex_t guard_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;

/* Async-signal-safe decimal of v into buf (at least 21 bytes); returns its length. */
static size_t u64_text(uint64_t v, char *buf) {
    char tmp[24];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        buf[i] = tmp[n - 1 - i];
    return n;
}

static void put(int fd, const char *s, size_t n) {
    while (n) {
        ssize_t w = write(fd, s, n);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

static void on_sigbus(int sig, siginfo_t *si, void *uctx) {
    (void)uctx;
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < GUARD_SLOTS; i++) {
        uintptr_t lo = atomic_load(&slots[i].lo), hi = atomic_load(&slots[i].hi);
        if (lo && a >= lo && a < hi) {
            char num[24];
            static const char a1[] = "minfer: fatal: model file '";
            static const char a2[] = "' was truncated or replaced while in use (a read at offset ";
            static const char a3[] = " is past its end now); stopping. Set MINFER_NO_MMAP=1 to "
                                     "load models into memory instead of mapping them.\n";
            put(2, a1, sizeof a1 - 1);
            put(2, slots[i].path, strlen(slots[i].path));
            put(2, a2, sizeof a2 - 1);
            put(2, num, u64_text((uint64_t)(a - lo), num));
            put(2, a3, sizeof a3 - 1);
            _exit(MF_GGUF_SIGBUS_EXIT);
        }
    }
    /* Not ours: the default action, as if no handler were installed. */
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}

void gg_guard_add(const void *base, size_t len, const char *path) {
    if (!base || !len)
        return;
    pthread_once(&guard_once, install);
    pthread_mutex_lock(&guard_mu);
    for (int i = 0; i < GUARD_SLOTS; i++)
        if (atomic_load(&slots[i].lo) == 0) {
            mf_escape(path, strlen(path), slots[i].path, sizeof slots[i].path);
            atomic_store(&slots[i].hi, (uintptr_t)base + len);
            atomic_store(&slots[i].lo, (uintptr_t)base);
            break;
        }
    pthread_mutex_unlock(&guard_mu);
}

void gg_guard_remove(const void *base) {
    if (!base)
        return;
    pthread_mutex_lock(&guard_mu);
    for (int i = 0; i < GUARD_SLOTS; i++)
        if (atomic_load(&slots[i].lo) == (uintptr_t)base) {
            atomic_store(&slots[i].lo, 0);
            atomic_store(&slots[i].hi, 0);
            break;
        }
    pthread_mutex_unlock(&guard_mu);
}
