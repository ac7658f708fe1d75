/* metal_device.h - the C face of the Objective-C device layer
 * (metal_device.m): one device, one queue, the pipelines of the kernel list,
 * shared-storage buffers, zero-copy wrappers, and the encode/submit rhythm of
 * one command buffer per split (seed §2.4, §3.2.6).
 *
 * Nothing here knows about graphs or ops; metal_backend.c does. Errors are
 * mf_error values naming the kernel / buffer / numbers. */
#ifndef MF_METAL_DEVICE_H
#define MF_METAL_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

typedef struct mf_mtl_dev mf_mtl_dev;
typedef struct mf_mtl_buf mf_mtl_buf; /* an MTLBuffer, retained */

typedef struct mf_mtl_dev_opts {
    const char *source;         /* MSL of every kernel (compiled at start) */
    const char *metallib_file;  /* MINFER_METALLIB_FILE: a precompiled library instead */
    int timeout_ms;             /* bounded submit (MINFER_GPU_TIMEOUT_MS) */
    bool trace;                 /* MINFER_TRACE: print every dispatch as it is encoded */
    bool capture;               /* MINFER_METAL_CAPTURE: a GPU capture around the device's life */
} mf_mtl_dev_opts;

/* Opens the default device, its queue and one pipeline per name of `kernels`
 * (n of them). A name the library lacks or whose pipeline fails is an error
 * naming it; nothing half-made survives. */
int mf_mtl_dev_open(const mf_mtl_dev_opts *o, const char *const *kernels, int n, mf_mtl_dev **out,
                    mf_error *err);
void mf_mtl_dev_close(mf_mtl_dev *d);

const char *mf_mtl_dev_name(const mf_mtl_dev *d);
bool mf_mtl_dev_unified(const mf_mtl_dev *d);
size_t mf_mtl_dev_max_tg_mem(const mf_mtl_dev *d);
/* Pipeline limits of kernel k (index into the list given at open). */
uint32_t mf_mtl_dev_max_threads(const mf_mtl_dev *d, int k);
uint32_t mf_mtl_dev_simd_width(const mf_mtl_dev *d, int k);
/* After a timeout or a GPU error the device refuses all further work. */
bool mf_mtl_dev_failed(const mf_mtl_dev *d);

/* Shared-storage buffer of nbytes (zeroed); *contents its host view. */
mf_mtl_buf *mf_mtl_buf_new(mf_mtl_dev *d, size_t nbytes, void **contents, mf_error *err);
/* A no-copy wrapper of [p, p + nbytes); both must be 16 KiB aligned. */
mf_mtl_buf *mf_mtl_buf_wrap(mf_mtl_dev *d, void *p, size_t nbytes, mf_error *err);
void mf_mtl_buf_free(mf_mtl_buf *b);

/* One dispatch. Buffers bind at 0..n_bufs-1; the argument bytes (if any) at
 * n_bufs; threadgroup memory (if any) at threadgroup index 0. */
enum { MF_MTL_MAX_BIND = 8 };
typedef struct mf_mtl_bind {
    mf_mtl_buf *buf;
    size_t offset;
} mf_mtl_bind;

typedef struct mf_mtl_launch {
    int kernel;
    const char *label;          /* node name for traces and fault messages */
    mf_mtl_bind bufs[MF_MTL_MAX_BIND];
    int n_bufs;
    const void *args;
    size_t args_len;
    size_t tg_mem;
    uint32_t grid[3];           /* threadgroups */
    uint32_t tg[3];             /* threads per threadgroup */
} mf_mtl_launch;

/* Encodes l into the open command buffer (opening one, with a concurrent
 * encoder, when none is), after a buffer barrier on every dispatch but the
 * first: the engine's nodes of a split are a dependency chain. */
int mf_mtl_dispatch(mf_mtl_dev *d, const mf_mtl_launch *l, mf_error *err);
/* Ends the encoder, commits and waits (bounded) for the command buffer; no-op
 * when nothing was encoded. A timeout or an error status names the last 16
 * dispatches and marks the device failed. */
int mf_mtl_submit(mf_mtl_dev *d, mf_error *err);
/* Whether a command buffer is open (encoded but not submitted). */
bool mf_mtl_dev_pending(const mf_mtl_dev *d);

#endif
