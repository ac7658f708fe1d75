/* registry.c - one line per backend compiled into this build. */
#include "backend/registry.h"

#include <stdio.h>
#include <string.h>

#ifdef MINFER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

static int create_cpu(const mf_weights *w, const mf_backend_options *o, mf_backend **out, mf_error *err) {
    return mf_backend_cpu_new(w, o->n_threads > 0 ? o->n_threads : 1, out, err);
}

static int create_ref(const mf_weights *w, const mf_backend_options *o, mf_backend **out, mf_error *err) {
    (void)o;
    return mf_backend_ref_new(w, out, err);
}

#ifdef MINFER_HAVE_CUDA
static int create_cuda(const mf_weights *w, const mf_backend_options *o, mf_backend **out, mf_error *err) {
    return mf_backend_cuda_new_progress(w, o->progress, o->progress_user, out, err);
}
#endif

static const mf_backend_entry entries[] = {
#ifdef MINFER_HAVE_CUDA
    {"cuda", MF_BACKEND_CUDA, true, 20, false, "MINFER_DISABLE_CUDA", "MINFER_CUDA_DEVICE", "MINFER_CUDA_TUNE",
     create_cuda},
#endif
    {"cpu", MF_BACKEND_CPU, false, 10, true, NULL, NULL, NULL, create_cpu},
    {"ref", MF_BACKEND_REF, false, -1, false, NULL, NULL, NULL, create_ref},
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
