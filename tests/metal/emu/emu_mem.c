/* Guarded device memory for the emulator and the fault handler that turns
 * a hit on a guard page into a failed dispatch naming the buffer. */
#include "emu_rt.h"
#include "emu_internal.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct region {
    uintptr_t map, map_len;  /* whole mapping (guards included); 0 for a label only */
    uintptr_t data, len;     /* the caller's bytes */
    char label[96];
} region;

#define MAX_REGIONS 4096
static region g_regions[MAX_REGIONS];
static int g_nregions;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static void set_label(region *r, const char *label)
{
    snprintf(r->label, sizeof r->label, "%s", label && *label ? label : "(unlabelled)");
}

static region *add_region(void)
{
    for (int i = 0; i < g_nregions; i++)
        if (!g_regions[i].data)
            return &g_regions[i];
    return g_nregions < MAX_REGIONS ? &g_regions[g_nregions++] : NULL;
}

void *mf_emu_alloc(size_t len, const char *label)
{
    size_t pg = (size_t)getpagesize();
    size_t body = (len + 15) & ~(size_t)15;
    size_t pages = (body + pg - 1) / pg;
    if (pages == 0)
        pages = 1;
    size_t map_len = (pages + 2) * pg;
    unsigned char *m = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    mprotect(m, pg, PROT_NONE);
    mprotect(m + (pages + 1) * pg, pg, PROT_NONE);
    unsigned char *data = m + (pages + 1) * pg - body; /* the end touches the trailing guard */
    pthread_mutex_lock(&g_mu);
    region *r = add_region();
    if (!r) {
        pthread_mutex_unlock(&g_mu);
        munmap(m, map_len);
        return NULL;
    }
    r->map = (uintptr_t)m;
    r->map_len = map_len;
    r->data = (uintptr_t)data;
    r->len = len;
    set_label(r, label);
    pthread_mutex_unlock(&g_mu);
    return data;
}

void mf_emu_free(void *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_nregions; i++)
        if (g_regions[i].data == (uintptr_t)p) {
            region r = g_regions[i];
            memset(&g_regions[i], 0, sizeof g_regions[i]);
            pthread_mutex_unlock(&g_mu);
            if (r.map)
                munmap((void *)r.map, r.map_len);
            return;
        }
    pthread_mutex_unlock(&g_mu);
}

void mf_emu_mem_label_range(const void *p, size_t len, const char *label)
{
    pthread_mutex_lock(&g_mu);
    region *r = add_region();
    if (r) {
        r->map = 0;
        r->map_len = 0;
        r->data = (uintptr_t)p;
        r->len = len;
        set_label(r, label);
    }
    pthread_mutex_unlock(&g_mu);
}

void mf_emu_mem_register(void *map, size_t map_len, void *data, size_t len, const char *label)
{
    pthread_mutex_lock(&g_mu);
    region *r = add_region();
    if (r) {
        r->map = (uintptr_t)map;
        r->map_len = map_len;
        r->data = (uintptr_t)data;
        r->len = len;
        set_label(r, label);
    }
    pthread_mutex_unlock(&g_mu);
}

void mf_emu_mem_unregister(void *data)
{
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_nregions; i++)
        if (g_regions[i].data == (uintptr_t)data) {
            memset(&g_regions[i], 0, sizeof g_regions[i]);
            break;
        }
    pthread_mutex_unlock(&g_mu);
}

static void (*g_fault_hook)(void *addr);

void mf_emu_set_fault_hook(void (*hook)(void *addr))
{
    g_fault_hook = hook;
    mf_emu_install_fault_handler();
}

void mf_emu_set_label(void *p, const char *label)
{
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_nregions; i++)
        if (g_regions[i].data == (uintptr_t)p) {
            set_label(&g_regions[i], label);
            break;
        }
    pthread_mutex_unlock(&g_mu);
}

/* Runs in the signal handler: no locks (a torn read names the wrong buffer
 * at worst), only snprintf into the caller's buffer. */
void mf_emu_mem_describe(const void *addr, char *out, size_t cap)
{
    uintptr_t a = (uintptr_t)addr;
    for (int i = 0; i < g_nregions; i++) {
        const region *r = &g_regions[i];
        if (!r->data)
            continue;
        uintptr_t end = r->data + r->len;
        if (r->map && a >= end && a < r->map + r->map_len) {
            snprintf(out, cap, "%lu bytes past the end of buffer '%s' (%lu bytes)", (unsigned long)(a - end), r->label,
                     (unsigned long)r->len);
            return;
        }
        if (r->map && a >= r->map && a < r->data) {
            snprintf(out, cap, "%lu bytes before the start of buffer '%s' (%lu bytes)", (unsigned long)(r->data - a),
                     r->label, (unsigned long)r->len);
            return;
        }
        if (!r->map && a >= r->data && a < end) {
            snprintf(out, cap, "in %s", r->label);
            return;
        }
    }
    snprintf(out, cap, "not in any device buffer");
}

static struct sigaction g_old_segv, g_old_bus;

static void fault_handler(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    mf_emu_fault(si->si_addr); /* does not return inside a dispatch */
    if (g_fault_hook)
        g_fault_hook(si->si_addr); /* does not return when the address is its */
    /* not ours: the previous handler (or the default action) */
    struct sigaction *old = sig == SIGSEGV ? &g_old_segv : &g_old_bus;
    sigaction(sig, old, NULL);
    raise(sig);
}

static void install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = fault_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
    sigaction(SIGBUS, &sa, &g_old_bus);
}

void mf_emu_install_fault_handler(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, install);
}
