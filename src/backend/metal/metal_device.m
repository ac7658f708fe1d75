/* metal_device.m - the Objective-C device layer behind metal_device.h.
 *
 * Manual retain/release (no ARC): every object this file keeps it owns by
 * new/alloc/copy or an explicit retain, and releases once. Autoreleased
 * temporaries live in a pool per call. Completion handlers write into plain
 * C storage (a refcounted wait record), never into Objective-C collections:
 * blocks from libBlocksRuntime are not objects for gcc's runtime.
 *
 * The wait is bounded: pthread_cond_timedwait on CLOCK_MONOTONIC, never
 * waitUntilCompleted (which has no timeout). After a timeout the queue may
 * stay wedged, so the device is marked failed and refuses further work. */
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <Block.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/metal/metal_device.h"

enum { RING = 16, LABEL = 64 };

struct mf_mtl_buf {
    id<MTLBuffer> b;
};

/* One command buffer's completion. The handler (a heap copy of its block,
 * so its captures outlive the submitting frame) only sets done under the
 * mutex; the waiter frees both once it has seen done. After a timeout both
 * are left alive on purpose: the handler may still run. */
typedef struct wait_rec {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
} wait_rec;

struct mf_mtl_dev {
    id<MTLDevice> dev;
    id<MTLCommandQueue> queue;
    id<MTLComputePipelineState> *pipes;
    const char **names;
    int n_pipes;
    char name[128];
    bool unified;
    size_t max_tg_mem;
    int timeout_ms;
    bool trace, capturing, failed;
    id<MTLCommandBuffer> cb;               /* open command buffer or nil */
    id<MTLComputeCommandEncoder> enc;      /* its encoder */
    int n_encoded;                         /* dispatches in cb */
    char ring[RING][LABEL];                /* last dispatches, oldest first from ring_pos */
    uint64_t ring_pos;
};

static void wait_free(wait_rec *w) {
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

static wait_rec *wait_new(void) {
    wait_rec *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
#if !defined(__APPLE__)
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
#endif
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    return w;
}

/* Waits until w is done or timeout_ms pass; true when done. */
static bool wait_for(wait_rec *w, int timeout_ms) {
    pthread_mutex_lock(&w->mu);
#if defined(__APPLE__)
    /* macOS has no pthread_condattr_setclock: a relative wait on the
     * monotonic clock instead. */
    struct timespec rel = {.tv_sec = timeout_ms / 1000, .tv_nsec = (long)(timeout_ms % 1000) * 1000000L};
    while (!w->done) {
        if (pthread_cond_timedwait_relative_np(&w->cv, &w->mu, &rel) == ETIMEDOUT)
            break;
    }
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    while (!w->done) {
        if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT)
            break;
    }
#endif
    bool done = w->done;
    pthread_mutex_unlock(&w->mu);
    return done;
}

static void ring_text(const mf_mtl_dev *d, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = 0;
    uint64_t first = d->ring_pos > RING ? d->ring_pos - RING : 0;
    for (uint64_t i = first; i < d->ring_pos && len + 2 < n; i++) {
        int w = snprintf(buf + len, n - len, "%s%s", i > first ? ", " : "", d->ring[i % RING]);
        if (w < 0)
            break;
        len += (size_t)w;
    }
    if (!d->ring_pos)
        snprintf(buf, n, "(none)");
}

static void drop_cb(mf_mtl_dev *d) {
    if (d->enc) {
        [d->enc release];
        d->enc = nil;
    }
    if (d->cb) {
        [d->cb release];
        d->cb = nil;
    }
    d->n_encoded = 0;
}

int mf_mtl_dev_open(const mf_mtl_dev_opts *o, const char *const *kernels, int n, mf_mtl_dev **out,
                    mf_error *err) {
    *out = NULL;
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    mf_mtl_dev *d = calloc(1, sizeof *d);
    if (!d) {
        [pool drain];
        return mf_errorf(err, "metal: out of memory");
    }
    d->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 10000;
    d->trace = o->trace;
    d->dev = MTLCreateSystemDefaultDevice();
    if (!d->dev) {
        free(d);
        [pool drain];
        return mf_errorf(err, "metal: no Metal device (MTLCreateSystemDefaultDevice returned nil)");
    }
    snprintf(d->name, sizeof d->name, "%s", [[d->dev name] UTF8String]);
    d->unified = [d->dev hasUnifiedMemory];
    d->max_tg_mem = (size_t)[d->dev maxThreadgroupMemoryLength];
    d->queue = [d->dev newCommandQueue];
    if (!d->queue) {
        mf_mtl_dev_close(d);
        [pool drain];
        return mf_errorf(err, "metal: %s: cannot create a command queue", d->name);
    }
    NSError *nerr = nil;
    id<MTLLibrary> lib = nil;
    if (o->metallib_file && *o->metallib_file) {
        NSURL *url = [NSURL fileURLWithPath:[NSString stringWithUTF8String:o->metallib_file]];
        lib = [d->dev newLibraryWithURL:url error:&nerr];
        if (!lib) {
            mf_errorf(err, "metal: MINFER_METALLIB_FILE '%s': %s", o->metallib_file,
                      nerr ? [[nerr localizedDescription] UTF8String] : "cannot load");
            mf_mtl_dev_close(d);
            [pool drain];
            return -1;
        }
    } else {
        MTLCompileOptions *copt = [[MTLCompileOptions alloc] init];
        lib = [d->dev newLibraryWithSource:[NSString stringWithUTF8String:o->source ? o->source : ""]
                                   options:copt
                                     error:&nerr];
        [copt release];
        if (!lib) {
            mf_errorf(err, "metal: compiling the kernels failed: %s",
                      nerr ? [[nerr localizedDescription] UTF8String] : "no library");
            mf_mtl_dev_close(d);
            [pool drain];
            return -1;
        }
    }
    d->pipes = calloc((size_t)n, sizeof *d->pipes);
    d->names = calloc((size_t)n, sizeof *d->names);
    for (int i = 0; i < n; i++) {
        d->names[i] = kernels[i];
        id<MTLFunction> fn = [lib newFunctionWithName:[NSString stringWithUTF8String:kernels[i]]];
        if (!fn) {
            mf_errorf(err, "metal: kernel '%s' is not in the library (%d kernels expected)", kernels[i], n);
            [lib release];
            mf_mtl_dev_close(d);
            [pool drain];
            return -1;
        }
        nerr = nil;
        d->pipes[i] = [d->dev newComputePipelineStateWithFunction:fn error:&nerr];
        [fn release];
        if (!d->pipes[i]) {
            mf_errorf(err, "metal: pipeline for kernel '%s' failed: %s", kernels[i],
                      nerr ? [[nerr localizedDescription] UTF8String] : "unknown error");
            [lib release];
            mf_mtl_dev_close(d);
            [pool drain];
            return -1;
        }
        d->n_pipes = i + 1;
    }
    [lib release];
    if (o->capture) {
        MTLCaptureManager *cm = [MTLCaptureManager sharedCaptureManager];
        MTLCaptureDescriptor *cd = [[MTLCaptureDescriptor alloc] init];
        cd.captureObject = d->dev;
        cd.destination = MTLCaptureDestinationDeveloperTools;
        nerr = nil;
        if ([cm startCaptureWithDescriptor:cd error:&nerr])
            d->capturing = true;
        else
            mf_log(MF_LOG_WARN, "metal: MINFER_METAL_CAPTURE: %s",
                   nerr ? [[nerr localizedDescription] UTF8String] : "capture refused");
        [cd release];
    }
    [pool drain];
    *out = d;
    return 0;
}

void mf_mtl_dev_close(mf_mtl_dev *d) {
    if (!d)
        return;
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    if (d->cb && !d->failed) {
        mf_error e;
        (void)mf_mtl_submit(d, &e);
    }
    drop_cb(d);
    if (d->capturing)
        [[MTLCaptureManager sharedCaptureManager] stopCapture];
    for (int i = 0; i < d->n_pipes; i++)
        [d->pipes[i] release];
    free(d->pipes);
    free(d->names);
    if (d->queue)
        [d->queue release];
    if (d->dev)
        [d->dev release];
    free(d);
    [pool drain];
}

const char *mf_mtl_dev_name(const mf_mtl_dev *d) {
    return d->name;
}

bool mf_mtl_dev_unified(const mf_mtl_dev *d) {
    return d->unified;
}

size_t mf_mtl_dev_max_tg_mem(const mf_mtl_dev *d) {
    return d->max_tg_mem;
}

uint32_t mf_mtl_dev_max_threads(const mf_mtl_dev *d, int k) {
    return (uint32_t)[d->pipes[k] maxTotalThreadsPerThreadgroup];
}

uint32_t mf_mtl_dev_simd_width(const mf_mtl_dev *d, int k) {
    return (uint32_t)[d->pipes[k] threadExecutionWidth];
}

bool mf_mtl_dev_failed(const mf_mtl_dev *d) {
    return d->failed;
}

bool mf_mtl_dev_pending(const mf_mtl_dev *d) {
    return d->cb != nil;
}

mf_mtl_buf *mf_mtl_buf_new(mf_mtl_dev *d, size_t nbytes, void **contents, mf_error *err) {
    id<MTLBuffer> b = [d->dev newBufferWithLength:(nbytes ? nbytes : 16) options:MTLResourceStorageModeShared];
    if (!b) {
        mf_errorf(err, "metal: %s: cannot allocate a shared buffer of %zu bytes", d->name, nbytes);
        return NULL;
    }
    mf_mtl_buf *mb = malloc(sizeof *mb);
    if (!mb) {
        [b release];
        mf_errorf(err, "metal: out of memory");
        return NULL;
    }
    mb->b = b;
    *contents = [b contents];
    memset(*contents, 0, nbytes);
    return mb;
}

mf_mtl_buf *mf_mtl_buf_wrap(mf_mtl_dev *d, void *p, size_t nbytes, mf_error *err) {
    const uintptr_t page = 16384;
    if (((uintptr_t)p & (page - 1)) || (nbytes & (page - 1))) {
        mf_errorf(err, "metal: no-copy span %p + %zu is not 16 KiB aligned", p, nbytes);
        return NULL;
    }
    id<MTLBuffer> b = [d->dev newBufferWithBytesNoCopy:p
                                                length:nbytes
                                               options:MTLResourceStorageModeShared
                                           deallocator:nil];
    if (!b) {
        mf_errorf(err, "metal: %s refused a no-copy buffer of %zu bytes at %p", d->name, nbytes, p);
        return NULL;
    }
    mf_mtl_buf *mb = malloc(sizeof *mb);
    if (!mb) {
        [b release];
        mf_errorf(err, "metal: out of memory");
        return NULL;
    }
    mb->b = b;
    return mb;
}

void mf_mtl_buf_free(mf_mtl_buf *b) {
    if (!b)
        return;
    [b->b release];
    free(b);
}

int mf_mtl_dispatch(mf_mtl_dev *d, const mf_mtl_launch *l, mf_error *err) {
    if (d->failed)
        return mf_errorf(err, "metal: %s failed earlier (a GPU timeout or error); refusing '%s'", d->name,
                         l->label ? l->label : d->names[l->kernel]);
    if (l->kernel < 0 || l->kernel >= d->n_pipes || l->n_bufs > MF_MTL_MAX_BIND)
        return mf_errorf(err, "metal: bad launch (kernel %d of %d, %d buffers)", l->kernel, d->n_pipes,
                         l->n_bufs);
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    if (!d->cb) {
        d->cb = [[d->queue commandBuffer] retain];
        d->enc = [[d->cb computeCommandEncoderWithDispatchType:MTLDispatchTypeConcurrent] retain];
        if (!d->cb || !d->enc) {
            drop_cb(d);
            [pool drain];
            return mf_errorf(err, "metal: %s: cannot open a command buffer", d->name);
        }
        d->n_encoded = 0;
    }
    id<MTLComputeCommandEncoder> enc = d->enc;
    if (d->n_encoded > 0)
        [enc memoryBarrierWithScope:MTLBarrierScopeBuffers];
    [enc setComputePipelineState:d->pipes[l->kernel]];
    for (int i = 0; i < l->n_bufs; i++)
        [enc setBuffer:l->bufs[i].buf->b offset:l->bufs[i].offset atIndex:(NSUInteger)i];
    if (l->args && l->args_len)
        [enc setBytes:l->args length:l->args_len atIndex:(NSUInteger)l->n_bufs];
    if (l->tg_mem)
        [enc setThreadgroupMemoryLength:(l->tg_mem + 15) / 16 * 16 atIndex:0];
    [enc dispatchThreadgroups:MTLSizeMake(l->grid[0], l->grid[1], l->grid[2])
        threadsPerThreadgroup:MTLSizeMake(l->tg[0], l->tg[1], l->tg[2])];
    d->n_encoded++;
    snprintf(d->ring[d->ring_pos % RING], LABEL, "%s[%s]", d->names[l->kernel], l->label ? l->label : "");
    d->ring_pos++;
    if (d->trace)
        fprintf(stderr, "metal: dispatch %s [%s] grid %ux%ux%u tg %ux%ux%u\n", d->names[l->kernel],
                l->label ? l->label : "", l->grid[0], l->grid[1], l->grid[2], l->tg[0], l->tg[1], l->tg[2]);
    [pool drain];
    return 0;
}

int mf_mtl_submit(mf_mtl_dev *d, mf_error *err) {
    if (d->failed) {
        drop_cb(d);
        return mf_errorf(err, "metal: %s failed earlier (a GPU timeout or error); refusing to submit", d->name);
    }
    if (!d->cb)
        return 0;
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    [d->enc endEncoding];
    wait_rec *w = wait_new();
    if (!w) {
        drop_cb(d);
        [pool drain];
        return mf_errorf(err, "metal: out of memory");
    }
    MTLCommandBufferHandler handler = Block_copy(^(id<MTLCommandBuffer> cb) {
        (void)cb;
        wait_rec *ww = w;
        pthread_mutex_lock(&ww->mu);
        ww->done = true;
        pthread_cond_broadcast(&ww->cv);
        pthread_mutex_unlock(&ww->mu);
    });
    [d->cb addCompletedHandler:handler];
    [d->cb commit];
    bool done = wait_for(w, d->timeout_ms);
    int rc = 0;
    char ring[RING * LABEL + 32];
    if (!done) {
        ring_text(d, ring, sizeof ring);
        d->failed = true;
        rc = mf_errorf(err, "metal: %s: command buffer of %d dispatches did not complete within %d ms "
                            "(MINFER_GPU_TIMEOUT_MS); device marked failed; last dispatches: %s",
                       d->name, d->n_encoded, d->timeout_ms, ring);
    } else if ([d->cb status] != MTLCommandBufferStatusCompleted) {
        NSError *e = [d->cb error];
        ring_text(d, ring, sizeof ring);
        d->failed = true;
        rc = mf_errorf(err, "metal: %s: command buffer failed (status %d: %s); device marked failed; last "
                            "dispatches: %s",
                       d->name, (int)[d->cb status], e ? [[e localizedDescription] UTF8String] : "no error",
                       ring);
    }
    if (done) {
        Block_release(handler);
        wait_free(w);
    }
    drop_cb(d);
    [pool drain];
    return rc;
}
