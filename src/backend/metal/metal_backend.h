/* metal_backend.h - the Metal backend (seed chapter 14): constructor, the
 * kernel list, and the hooks tests use. Built with MINFER_METAL (macOS) or
 * MINFER_METAL_EMU (Linux, against the stand-in framework and the MSL
 * emulator of tests/metal). */
#ifndef MF_METAL_BACKEND_H
#define MF_METAL_BACKEND_H

#include "backend/backend.h"

/* A read-only mapping the weight views may point into (a GGUF part): wrapped
 * once, no copy, and each weight inside it registered as (buffer, offset). */
typedef struct mf_metal_region {
    const void *base;
    uint64_t size;
} mf_metal_region;

typedef struct mf_metal_opts {
    const mf_metal_region *regions; /* may be NULL: every weight is copied */
    int n_regions;
    const char *withhold;           /* tests: a weight name left unregistered */
    /* The runtime's lever values: gpu_timeout_ms, trace, fusion and the
     * .metal block (NULL: mf_backend_options_default's). The backend reads
     * no environment. */
    const mf_backend_options *backend;
} mf_metal_opts;

/* Opens the device, resolves every kernel and registers every weight of w.
 * options.metal.disable (MINFER_DISABLE_METAL=1 or MINFER_DISABLE_MPS=1): an
 * error saying so (the caller runs without Metal). Prints "using Metal on <device> (unified: yes)"
 * at info level. */
int mf_backend_metal_new(const mf_weights *w, const mf_metal_opts *o, mf_backend **out, mf_error *err);

/* The KV cache type the seed's policy picks for a model on Metal (§3.3):
 * f16 when n_layers * kv_dim >= 8192 (the 7B class, where attention streams
 * enough KV bytes for half floats to pay), else f32 (the small models are
 * dispatch-bound and the conversions cost more than they save).
 * MINFER_CACHE_TYPE, read by the session, overrides it. */
uint32_t mf_metal_auto_cache_type(int32_t n_layers, int64_t kv_dim);

/* The number of kernels the backend resolves at start, and their names. */
int mf_metal_n_kernels(void);
const char *mf_metal_kernel_name(int i);

/* Dispatches encoded by this backend so far (tests: fusions make fewer). */
int64_t mf_metal_n_dispatches(const mf_backend *b);

#endif
