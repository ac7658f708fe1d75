/* registry.c - one line per backend compiled into this build. */
#include "backend/registry.h"

#include <stdio.h>
#include <string.h>

#include "backend/cpu/kernels.h"

#ifdef MINFER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#ifdef MINFER_HAVE_METAL
#include "backend/metal/metal_backend.h"
#endif

static int create_cpu(const mf_weights *w, const mf_backend_options *o, mf_backend **out, mf_error *err) {
    mf_cpu_isa_set_cap(o->cpu_isa); /* process-wide: the kernels dispatch on it */
    return mf_backend_cpu_new(w, o->n_threads > 0 ? o->n_threads : 1, out, err);
}

static int create_ref(const mf_weights *w, const mf_backend_options *o, mf_backend **out, mf_error *err) {
    (void)o;
    return mf_backend_ref_new(w, out, err);
}

#ifdef MINFER_HAVE_CUDA
static int create_cuda(const mf_weights *w, const mf_backend_options *o, mf_backend **out, mf_error *err) {
    return mf_backend_cuda_create(w, o, out, err);
}
#endif

#ifdef MINFER_HAVE_METAL
static int create_metal(const mf_weights *w, const mf_backend_options *o, mf_backend **out, mf_error *err) {
    mf_metal_opts mo = {.backend = o}; /* the mapped spans are found from the weight views */
    return mf_backend_metal_new(w, &mo, out, err);
}
#endif

static const mf_backend_entry entries[] = {
#ifdef MINFER_HAVE_METAL
    /* above CUDA (seed §2.7); its levers (MINFER_DISABLE_METAL ...) reach
     * it as mf_backend_options.metal */
    {"metal", MF_BACKEND_METAL, true, 30, false, NULL, NULL, NULL, create_metal, mf_metal_auto_cache_type},
#endif
#ifdef MINFER_HAVE_CUDA
    {"cuda", MF_BACKEND_CUDA, true, 20, false, "MINFER_DISABLE_CUDA", "MINFER_CUDA_DEVICE", "MINFER_CUDA_TUNE",
     create_cuda, NULL},
#endif
    {"cpu", MF_BACKEND_CPU, false, 10, true, NULL, NULL, NULL, create_cpu, NULL},
    {"ref", MF_BACKEND_REF, false, -1, false, NULL, NULL, NULL, create_ref, NULL},
};

int mf_registry_count(void) {
    return (int)(sizeof entries / sizeof entries[0]);
}

const mf_backend_entry *mf_registry_at(int i) {
    return i >= 0 && i < mf_registry_count() ? &entries[i] : NULL;
}

const mf_backend_entry *mf_registry_find(const char *name, size_t len) {
    for (int i = 0; i < mf_registry_count(); i++)
        if (strlen(entries[i].name) == len && !strncmp(entries[i].name, name, len))
            return &entries[i];
    return NULL;
}

const char *mf_registry_names(void) {
    static char buf[128];
    if (!buf[0])
        for (int i = 0; i < mf_registry_count(); i++) {
            size_t l = strlen(buf);
            snprintf(buf + l, sizeof buf - l, "%s%s", i ? ", " : "", entries[i].name);
        }
    return buf;
}
