/* registry.h - the backends compiled into this build, in priority order.
 *
 * The only place that knows which backends exist: each compiled-in backend
 * is one line of registry.c ({name, kind, is_gpu, priority, create}). The
 * runtime picks from here by priority (metal, cuda, cpu) or by the name the
 * user gives (--device, MINFER_BACKENDS), and tools list the devices of this
 * build from it; nothing above the backends names one. */
#ifndef MF_REGISTRY_H
#define MF_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>

#include "backend/backend.h"

typedef struct mf_backend_entry {
    const char *name;        /* as --device and MINFER_BACKENDS spell it */
    mf_backend_kind kind;
    bool is_gpu;             /* holds the weights itself: made once per model, shared by sessions */
    int priority;            /* higher first; below 0: only when asked for by name (ref) */
    bool runs_every_op;      /* its table runs every graph op, so a graph always has a home */
    /* the levers that reach this backend through the runtime (NULL: none);
     * each is a row of the runtime's lever table */
    const char *disable_lever, *device_lever, *tune_lever;
    int (*create)(const mf_weights *w, const mf_backend_options *o, mf_backend **out, mf_error *err);
    /* the KV cache type this backend picks when the user names none (NULL:
     * f32): Metal's policy by model size (seed §3.3) */
    uint32_t (*auto_cache_type)(int32_t n_layers, int64_t kv_dim);
} mf_backend_entry;

/* Entries in priority order (highest first). */
int mf_registry_count(void);
const mf_backend_entry *mf_registry_at(int i);
/* The entry named name[0..len), or NULL. */
const mf_backend_entry *mf_registry_find(const char *name, size_t len);
/* "cuda, cpu, ref": every compiled-in name, in priority order. */
const char *mf_registry_names(void);

#endif
