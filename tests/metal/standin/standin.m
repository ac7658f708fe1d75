/* The stand-in Metal framework: Apple's API (include/Metal/Metal.h) on the
 * CPU. One "GPU" thread per command queue runs committed command buffers in
 * order: each dispatch through the MSL emulator, then the completion
 * handlers on that thread. Validation-layer checks and the project's rules
 * (races between unbarriered dispatches of a concurrent encoder, host
 * access to a buffer in flight) fail the command buffer and are counted.
 * Manual retain/release (gcc's runtime has no ARC). */
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <Block.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "emu_rt.h"
#include "mf_standin.h"

NSString *const MTLCommandBufferErrorDomain = @"MTLCommandBufferErrorDomain";
NSString *const MTLLibraryErrorDomain = @"MTLLibraryErrorDomain";
NSString *const MTLCaptureErrorDomain = @"MTLCaptureErrorDomain";

enum {
    MAX_BIND = 31,
    SET_BYTES_MAX = 4096,
    TG_MEM_MAX = 32768,
    NOCOPY_ALIGN = 16384,
    MSG = 512,
};

/* ---- hooks and violations ------------------------------------------------ */
static atomic_int g_hang;
static atomic_int g_violations;
static unsigned g_pipe_max = 1024;
static char g_last[MSG];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

typedef struct subst {
    char name[128], impl[128];
} subst;
static subst g_subst[32];
static int g_nsubst;

void mf_standin_set_hang(int on) { atomic_store(&g_hang, on); }
int mf_standin_hide_kernel(const char *name, int hidden) { return mf_emu_hide(name, hidden); }
void mf_standin_set_pipeline_max_threads(unsigned n) { g_pipe_max = n; }
int mf_standin_violations(void) { return atomic_load(&g_violations); }
const char *mf_standin_last_violation(void) { return g_last; }

void mf_standin_reset_violations(void)
{
    pthread_mutex_lock(&g_mu);
    atomic_store(&g_violations, 0);
    g_last[0] = 0;
    pthread_mutex_unlock(&g_mu);
}

int mf_standin_substitute_kernel(const char *name, const char *impl)
{
    pthread_mutex_lock(&g_mu);
    int i;
    for (i = 0; i < g_nsubst; i++)
        if (strcmp(g_subst[i].name, name) == 0) break;
    if (!impl) {
        if (i < g_nsubst) g_subst[i] = g_subst[--g_nsubst];
        pthread_mutex_unlock(&g_mu);
        return 0;
    }
    if (i == g_nsubst) {
        if (g_nsubst == 32) {
            pthread_mutex_unlock(&g_mu);
            return -1;
        }
        g_nsubst++;
    }
    snprintf(g_subst[i].name, sizeof g_subst[i].name, "%s", name);
    snprintf(g_subst[i].impl, sizeof g_subst[i].impl, "%s", impl);
    pthread_mutex_unlock(&g_mu);
    return 0;
}

static void env_hooks_once(void)
{
    const char *e = getenv("MINFER_STANDIN_HANG");
    if (e && *e && strcmp(e, "0") != 0) atomic_store(&g_hang, 1);
    e = getenv("MINFER_STANDIN_HIDE_KERNEL");
    if (e && *e) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", e);
        for (char *t = strtok(buf, ","); t; t = strtok(NULL, ","))
            if (mf_emu_hide(t, 1) != 0) fprintf(stderr, "MINFER_STANDIN_HIDE_KERNEL: no kernel '%s'\n", t);
    }
    e = getenv("MINFER_STANDIN_SUBSTITUTE");
    if (e && *e) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", e);
        for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
            char *eq = strchr(t, '=');
            if (!eq) {
                fprintf(stderr, "MINFER_STANDIN_SUBSTITUTE: expected name=impl, got '%s'\n", t);
                continue;
            }
            *eq = 0;
            mf_standin_substitute_kernel(t, eq + 1);
        }
    }
}

/* A violation: printed, counted, remembered; fails `msg_out` (the command
 * buffer's) when given. */
static void violation(char *cb_msg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void violation(char *cb_msg, const char *fmt, ...)
{
    char m[MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    fprintf(stderr, "metal stand-in: %s\n", m);
    pthread_mutex_lock(&g_mu);
    snprintf(g_last, sizeof g_last, "%s", m);
    atomic_fetch_add(&g_violations, 1);
    pthread_mutex_unlock(&g_mu);
    if (cb_msg && !cb_msg[0]) snprintf(cb_msg, MSG, "%s", m);
    const char *a = getenv("MINFER_STANDIN_ABORT");
    if (a && strcmp(a, "1") == 0) abort();
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static NSError *make_error(NSString *domain, NSInteger code, const char *msg)
{
    NSDictionary *info = [NSDictionary dictionaryWithObject:[NSString stringWithUTF8String:msg]
                                                     forKey:NSLocalizedDescriptionKey];
    return [NSError errorWithDomain:domain code:code userInfo:info];
}

static void label_to(char *dst, size_t cap, NSString *label, const char *fallback)
{
    snprintf(dst, cap, "%s", label ? [label UTF8String] : fallback);
}

/* ---- classes -------------------------------------------------------------- */
@class MFSDevice;

@interface MFSBuffer : NSObject <MTLBuffer> {
@public
    id<MTLDevice> _device;
    NSString *_label;
    unsigned char *_host, *_gpu;       /* contents; what kernels see */
    unsigned char *_host_map, *_gpu_map;
    size_t _map_len;
    size_t _page_lo, _page_len;        /* host pages to protect while in flight */
    NSUInteger _length;
    MTLResourceOptions _options;
    int _nocopy;
    void (^_dealloc)(void *, NSUInteger);
    int _inflight;                     /* under g_inflight_mu */
    char _cname[96];
}
@end

@interface MFSFunction : NSObject <MTLFunction> {
@public
    id<MTLDevice> _device;
    NSString *_name, *_label;
    const mf_emu_kernel *_k;
}
@end

@interface MFSLibrary : NSObject <MTLLibrary> {
@public
    id<MTLDevice> _device;
    NSString *_label;
}
@end

@interface MFSPipeline : NSObject <MTLComputePipelineState> {
@public
    id<MTLDevice> _device;
    const mf_emu_kernel *_k;
    NSUInteger _max_threads;
}
@end

/* One recorded dispatch. */
typedef struct op {
    const mf_emu_kernel *k;
    MFSBuffer *buf[MAX_BIND];      /* retained */
    size_t off[MAX_BIND];
    void *bytes[MAX_BIND];         /* setBytes copies (malloc) */
    size_t bytes_len[MAX_BIND];
    size_t tg[MAX_BIND];
    uint32_t groups[3], threads[3];
    int index;                     /* dispatch number in its command buffer */
} op;

@class MFSQueue;

@interface MFSCommandBuffer : NSObject <MTLCommandBuffer> {
@public
    MFSQueue *_queue;
    id<MTLDevice> _device;
    NSString *_label;
    NSError *_error;
    atomic_int _status;
    op *_ops;
    int _nops, _capops;
    MTLCommandBufferHandler _handlers[32];
    int _nhandlers;
    id _open_encoder;               /* not retained: the encoder retains us */
    char _violation[MSG];
    MFSBuffer **_used;               /* retained, deduplicated */
    int _nused, _capused;
    double _t0, _t1;
    pthread_mutex_t _mu;
    pthread_cond_t _cv;
    MFSCommandBuffer *_next;        /* queue FIFO */
}
- (void)mfs_run;
@end

typedef struct seg_ent {
    MFSBuffer *buf;
    int writes;
    int index;
    const char *kernel;
    int arg;
} seg_ent;

@interface MFSEncoder : NSObject <MTLComputeCommandEncoder> {
@public
    MFSCommandBuffer *_cb;          /* retained */
    id<MTLDevice> _device;
    NSString *_label;
    MTLDispatchType _type;
    int _ended;
    MFSPipeline *_pipe;             /* retained */
    MFSBuffer *_buf[MAX_BIND];      /* retained */
    size_t _off[MAX_BIND];
    unsigned char *_bytes[MAX_BIND];
    size_t _bytes_len[MAX_BIND];
    size_t _tg[MAX_BIND];
    seg_ent *_seg;                  /* dispatches since the last barrier */
    int _nseg, _capseg;
}
@end

@interface MFSQueue : NSObject <MTLCommandQueue> {
@public
    id<MTLDevice> _device;
    NSString *_label;
    pthread_t _thread;
    int _started, _stop;
    pthread_mutex_t _mu;
    pthread_cond_t _cv;
    MFSCommandBuffer *_head, *_tail;
}
- (void)mfs_submit:(MFSCommandBuffer *)cb;
@end

@interface MFSDevice : NSObject <MTLDevice> {
@public
    NSString *_name;
}
@end

/* ---- buffers and the in-flight rule --------------------------------------- */
static pthread_mutex_t g_inflight_mu = PTHREAD_MUTEX_INITIALIZER;
static MFSBuffer *g_inflight[1024];
static int g_ninflight;

static void host_fault_hook(void *addr)
{
    uintptr_t a = (uintptr_t)addr;
    for (int i = 0; i < g_ninflight; i++) {
        MFSBuffer *b = g_inflight[i];
        if (b && a >= (uintptr_t)b->_host_map + b->_page_lo && a < (uintptr_t)b->_host_map + b->_page_lo + b->_page_len) {
            char m[MSG];
            long off = (long)(a - (uintptr_t)b->_host);
            snprintf(m, sizeof m,
                     "host access to buffer '%s' (%lu bytes) at offset %ld while a command buffer using it is in flight",
                     b->_cname, (unsigned long)b->_length, off);
            fprintf(stderr, "metal stand-in: %s\n", m);
            fflush(stderr);
            abort();
        }
    }
}

static void buffer_inflight(MFSBuffer *b, int delta)
{
    if (b->_nocopy || !b->_page_len) return;
    pthread_mutex_lock(&g_inflight_mu);
    int was = b->_inflight;
    b->_inflight += delta;
    if (was == 0 && b->_inflight > 0) {
        for (int i = 0; i < 1024; i++)
            if (!g_inflight[i]) {
                g_inflight[i] = b;
                if (i >= g_ninflight) g_ninflight = i + 1;
                break;
            }
        mprotect(b->_host_map + b->_page_lo, b->_page_len, PROT_NONE);
    } else if (was > 0 && b->_inflight == 0) {
        mprotect(b->_host_map + b->_page_lo, b->_page_len, PROT_READ | PROT_WRITE);
        for (int i = 0; i < g_ninflight; i++)
            if (g_inflight[i] == b) g_inflight[i] = nil;
    }
    pthread_mutex_unlock(&g_inflight_mu);
}

@implementation MFSBuffer
- (NSUInteger)length { return _length; }
- (void *)contents { return _host; }
- (NSString *)label { return _label; }
- (void)setLabel:(NSString *)label
{
    NSString *l = [label copy];
    [_label release];
    _label = l;
    label_to(_cname, sizeof _cname, _label, "(unlabelled)");
    if (_gpu) mf_emu_set_label(_gpu, _cname);
}
- (id<MTLDevice>)device { return _device; }
- (MTLCPUCacheMode)cpuCacheMode { return (MTLCPUCacheMode)(_options & 15); }
- (MTLStorageMode)storageMode { return (MTLStorageMode)((_options >> MTLResourceStorageModeShift) & 15); }
- (MTLHazardTrackingMode)hazardTrackingMode { return (MTLHazardTrackingMode)((_options >> MTLResourceHazardTrackingModeShift) & 3); }
- (MTLResourceOptions)resourceOptions { return _options; }
- (NSUInteger)allocatedSize { return _nocopy ? _length : _map_len / 2; }
- (void)dealloc
{
    if (_gpu) mf_emu_mem_unregister(_gpu);
    if (_nocopy) {
        if (_dealloc) {
            _dealloc(_host, _length);
            Block_release(_dealloc);
        }
    } else {
        if (_host_map) munmap(_host_map, _map_len);
        if (_gpu_map) munmap(_gpu_map, _map_len);
    }
    [_label release];
    [super dealloc];
}
@end

/* Two views of one memfd: the host's (contents) and the kernels' (guarded,
 * so the emulator names overruns; the host's is protected while in flight).
 * The data ends where the trailing guard page starts. */
static MFSBuffer *shared_buffer(id<MTLDevice> dev, NSUInteger length, MTLResourceOptions options)
{
    size_t pg = (size_t)getpagesize();
    size_t body = (length + 15) & ~(size_t)15;
    size_t pages = body ? (body + pg - 1) / pg : 1;
    size_t map_len = (pages + 2) * pg;
    int fd = memfd_create("mtlbuffer", MFD_CLOEXEC);
    if (fd < 0) return nil;
    if (ftruncate(fd, (off_t)(pages * pg)) != 0) {
        close(fd);
        return nil;
    }
    unsigned char *maps[2] = { NULL, NULL };
    for (int v = 0; v < 2; v++) {
        unsigned char *m = mmap(NULL, map_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED || mmap(m + pg, pages * pg, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
            if (m != MAP_FAILED) munmap(m, map_len);
            if (maps[0]) munmap(maps[0], map_len);
            close(fd);
            return nil;
        }
        maps[v] = m;
    }
    close(fd);
    MFSBuffer *b = [[MFSBuffer alloc] init];
    size_t slack = pages * pg - body;
    b->_device = dev;
    b->_host_map = maps[0];
    b->_gpu_map = maps[1];
    b->_map_len = map_len;
    b->_host = maps[0] + pg + slack;
    b->_gpu = maps[1] + pg + slack;
    b->_page_lo = pg;
    b->_page_len = pages * pg;
    b->_length = length;
    b->_options = options;
    snprintf(b->_cname, sizeof b->_cname, "(unlabelled, %lu bytes)", (unsigned long)length);
    mf_emu_mem_register(maps[1], map_len, b->_gpu, length, b->_cname);
    return b;
}

/* ---- library, function, pipeline ------------------------------------------ */
static const mf_emu_kernel *resolve_kernel(const char *name)
{
    char impl[128] = "";
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_nsubst; i++)
        if (strcmp(g_subst[i].name, name) == 0) snprintf(impl, sizeof impl, "%s", g_subst[i].impl);
    pthread_mutex_unlock(&g_mu);
    return mf_emu_find(impl[0] ? impl : name);
}

@implementation MFSFunction
- (NSString *)name { return _name; }
- (NSString *)label { return _label; }
- (void)setLabel:(NSString *)label { NSString *l = [label copy]; [_label release]; _label = l; }
- (id<MTLDevice>)device { return _device; }
- (void)dealloc { [_name release]; [_label release]; [super dealloc]; }
@end

@implementation MFSLibrary
- (NSString *)label { return _label; }
- (void)setLabel:(NSString *)label { NSString *l = [label copy]; [_label release]; _label = l; }
- (id<MTLDevice>)device { return _device; }
- (id<MTLFunction>)newFunctionWithName:(NSString *)functionName
{
    const mf_emu_kernel *k = resolve_kernel([functionName UTF8String]);
    if (!k) return nil;
    MFSFunction *f = [[MFSFunction alloc] init];
    f->_device = _device;
    f->_name = [functionName copy];
    f->_k = k;
    return f;
}
- (NSArray<NSString *> *)functionNames
{
    NSMutableArray *a = [NSMutableArray array];
    for (int i = 0; i < mf_emu_kernel_count(); i++)
        [a addObject:[NSString stringWithUTF8String:mf_emu_kernel_name(i)]];
    return a;
}
- (void)dealloc { [_label release]; [super dealloc]; }
@end

@implementation MFSPipeline
- (NSString *)label { return nil; }
- (id<MTLDevice>)device { return _device; }
- (NSUInteger)maxTotalThreadsPerThreadgroup { return _max_threads; }
- (NSUInteger)threadExecutionWidth { return MF_EMU_SIMD_WIDTH; }
- (NSUInteger)staticThreadgroupMemoryLength { return 0; }
@end

/* ---- the GPU thread ------------------------------------------------------------ */
static void *gpu_main(void *arg)
{
    MFSQueue *q = arg;
    GSRegisterCurrentThread();
    pthread_mutex_lock(&q->_mu);
    for (;;) {
        while (!q->_stop && (!q->_head || atomic_load(&g_hang))) pthread_cond_wait(&q->_cv, &q->_mu);
        if (q->_stop) break;
        MFSCommandBuffer *cb = q->_head;
        q->_head = cb->_next;
        if (!q->_head) q->_tail = nil;
        pthread_mutex_unlock(&q->_mu);
        NSAutoreleasePool *pool = [NSAutoreleasePool new];
        [cb mfs_run];
        [pool drain];
        [cb release];
        pthread_mutex_lock(&q->_mu);
    }
    pthread_mutex_unlock(&q->_mu);
    GSUnregisterCurrentThread();
    return NULL;
}

@implementation MFSQueue
- (NSString *)label { return _label; }
- (void)setLabel:(NSString *)label { NSString *l = [label copy]; [_label release]; _label = l; }
- (id<MTLDevice>)device { return _device; }
- (id<MTLCommandBuffer>)commandBuffer
{
    MFSCommandBuffer *cb = [[MFSCommandBuffer alloc] init];
    cb->_queue = [self retain];
    cb->_device = _device;
    pthread_mutex_init(&cb->_mu, NULL);
    pthread_cond_init(&cb->_cv, NULL);
    atomic_store(&cb->_status, MTLCommandBufferStatusNotEnqueued);
    return [cb autorelease];
}
- (id<MTLCommandBuffer>)commandBufferWithUnretainedReferences { return [self commandBuffer]; }
- (void)mfs_submit:(MFSCommandBuffer *)cb
{
    pthread_mutex_lock(&_mu);
    if (!_started) {
        if (pthread_create(&_thread, NULL, gpu_main, self) == 0) _started = 1;
    }
    [cb retain];
    cb->_next = nil;
    if (_tail) _tail->_next = cb;
    else _head = cb;
    _tail = cb;
    pthread_cond_signal(&_cv);
    pthread_mutex_unlock(&_mu);
}
- (void)dealloc
{
    pthread_mutex_lock(&_mu);
    _stop = 1;
    pthread_cond_broadcast(&_cv);
    pthread_mutex_unlock(&_mu);
    if (_started) pthread_join(_thread, NULL);
    /* never run (a simulated hang): dropped without their handlers */
    for (MFSCommandBuffer *cb = _head; cb;) {
        MFSCommandBuffer *n = cb->_next;
        [cb release];
        cb = n;
    }
    pthread_mutex_destroy(&_mu);
    pthread_cond_destroy(&_cv);
    [_label release];
    [super dealloc];
}
@end

@implementation MFSCommandBuffer
- (id<MTLDevice>)device { return _device; }
- (id<MTLCommandQueue>)commandQueue { return _queue; }
- (NSString *)label { return _label; }
- (void)setLabel:(NSString *)label { NSString *l = [label copy]; [_label release]; _label = l; }
- (MTLCommandBufferStatus)status { return (MTLCommandBufferStatus)atomic_load(&_status); }
- (NSError *)error
{
    pthread_mutex_lock(&_mu);
    NSError *e = [[_error retain] autorelease];
    pthread_mutex_unlock(&_mu);
    return e;
}
- (CFTimeInterval)GPUStartTime { return _t0; }
- (CFTimeInterval)GPUEndTime { return _t1; }
- (id<MTLComputeCommandEncoder>)computeCommandEncoder
{
    return [self computeCommandEncoderWithDispatchType:MTLDispatchTypeSerial];
}
- (id<MTLComputeCommandEncoder>)computeCommandEncoderWithDispatchType:(MTLDispatchType)dispatchType
{
    if ((NSUInteger)atomic_load(&_status) != MTLCommandBufferStatusNotEnqueued) {
        violation(_violation, "computeCommandEncoder on a command buffer already committed");
        return nil;
    }
    if (_open_encoder) {
        violation(_violation, "computeCommandEncoder while the previous encoder has not called endEncoding");
        return nil;
    }
    MFSEncoder *e = [[MFSEncoder alloc] init];
    e->_cb = [self retain];
    e->_device = _device;
    e->_type = dispatchType;
    _open_encoder = e;
    return [e autorelease];
}
- (void)mfs_use:(MFSBuffer *)b
{
    for (int i = 0; i < _nused; i++)
        if (_used[i] == b) return;
    if (_nused == _capused) {
        _capused = _capused ? 2 * _capused : 16;
        _used = realloc(_used, sizeof *_used * (size_t)_capused);
    }
    _used[_nused++] = [b retain];
}
- (void)mfs_add_op:(const op *)o
{
    if (_nops == _capops) {
        _capops = _capops ? 2 * _capops : 16;
        _ops = realloc(_ops, sizeof *_ops * (size_t)_capops);
    }
    _ops[_nops++] = *o;
}
- (void)enqueue
{
    int s = MTLCommandBufferStatusNotEnqueued;
    atomic_compare_exchange_strong(&_status, &s, MTLCommandBufferStatusEnqueued);
}
- (void)commit
{
    int s = atomic_load(&_status);
    if ((NSUInteger)s > MTLCommandBufferStatusEnqueued) {
        violation(_violation, "commit of a command buffer already committed");
        return;
    }
    if (_open_encoder) violation(_violation, "commit with an encoder that has not called endEncoding");
    for (int i = 0; i < _nused; i++) buffer_inflight(_used[i], +1);
    atomic_store(&_status, MTLCommandBufferStatusCommitted);
    [_queue mfs_submit:self];
}
- (void)addScheduledHandler:(MTLCommandBufferHandler)block
{
    (void)block; /* scheduling is not modelled: nothing to call it for */
    if ((NSUInteger)atomic_load(&_status) >= MTLCommandBufferStatusCommitted)
        violation(_violation, "addScheduledHandler after commit");
}
- (void)addCompletedHandler:(MTLCommandBufferHandler)block
{
    if ((NSUInteger)atomic_load(&_status) >= MTLCommandBufferStatusCommitted) {
        violation(NULL, "addCompletedHandler after commit");
        return;
    }
    if (_nhandlers == 32) {
        violation(_violation, "more than 32 completed handlers");
        return;
    }
    _handlers[_nhandlers++] = Block_copy(block);
}
- (void)waitUntilScheduled { }
- (void)waitUntilCompleted
{
    pthread_mutex_lock(&_mu);
    while ((NSUInteger)atomic_load(&_status) < MTLCommandBufferStatusCompleted) pthread_cond_wait(&_cv, &_mu);
    pthread_mutex_unlock(&_mu);
}
/* On the GPU thread. */
- (void)mfs_run
{
    atomic_store(&_status, MTLCommandBufferStatusScheduled);
    _t0 = now_s();
    char err[MSG] = "";
    NSInteger code = MTLCommandBufferErrorNone;
    if (_violation[0]) {
        snprintf(err, sizeof err, "%s", _violation);
        code = MTLCommandBufferErrorInvalidResource;
    }
    for (int i = 0; i < _nops && !err[0]; i++) {
        op *o = &_ops[i];
        mf_emu_launch l;
        memset(&l, 0, sizeof l);
        l.kernel = o->k;
        for (int j = 0; j < MAX_BIND; j++) {
            if (o->buf[j]) {
                MFSBuffer *b = o->buf[j];
                l.buf[j] = (o->off[j] <= b->_length) ? (void *)((b->_nocopy ? b->_host : b->_gpu) + o->off[j]) : NULL;
                l.buf_len[j] = b->_length - o->off[j];
                l.buf_label[j] = b->_cname;
            } else if (o->bytes[j]) {
                l.buf[j] = o->bytes[j];
                l.buf_len[j] = o->bytes_len[j];
                l.buf_label[j] = "setBytes";
            }
            l.tg_len[j] = o->tg[j];
        }
        memcpy(l.groups, o->groups, sizeof l.groups);
        memcpy(l.threads, o->threads, sizeof l.threads);
        char e[MSG - 64];
        if (mf_emu_dispatch(&l, e, sizeof e) != 0) {
            snprintf(err, sizeof err, "dispatch #%d: %s", o->index, e);
            code = strstr(e, "memory fault")                                   ? MTLCommandBufferErrorPageFault
                 : (strstr(e, "DEADLOCK") || strstr(e, "DIVERGENCE"))          ? MTLCommandBufferErrorTimeout
                                                                               : MTLCommandBufferErrorInvalidResource;
        }
    }
    _t1 = now_s();
    for (int i = 0; i < _nused; i++) buffer_inflight(_used[i], -1);
    pthread_mutex_lock(&_mu);
    if (err[0]) _error = [make_error(MTLCommandBufferErrorDomain, code, err) retain];
    atomic_store(&_status, err[0] ? MTLCommandBufferStatusError : MTLCommandBufferStatusCompleted);
    pthread_cond_broadcast(&_cv);
    pthread_mutex_unlock(&_mu);
    for (int i = 0; i < _nhandlers; i++) {
        _handlers[i](self);
        Block_release(_handlers[i]);
    }
    _nhandlers = 0;
}
- (void)dealloc
{
    for (int i = 0; i < _nops; i++)
        for (int j = 0; j < MAX_BIND; j++) {
            [_ops[i].buf[j] release];
            free(_ops[i].bytes[j]);
        }
    free(_ops);
    for (int i = 0; i < _nused; i++) [_used[i] release];
    free(_used);
    for (int i = 0; i < _nhandlers; i++) Block_release(_handlers[i]);
    [_error release];
    [_label release];
    [_queue release];
    pthread_mutex_destroy(&_mu);
    pthread_cond_destroy(&_cv);
    [super dealloc];
}
@end

@implementation MFSEncoder
- (id<MTLDevice>)device { return _device; }
- (NSString *)label { return _label; }
- (void)setLabel:(NSString *)label { NSString *l = [label copy]; [_label release]; _label = l; }
- (MTLDispatchType)dispatchType { return _type; }
- (int)mfs_live:(const char *)what
{
    if (_ended) {
        violation(_cb->_violation, "%s on an encoder after endEncoding", what);
        return 0;
    }
    return 1;
}
- (int)mfs_index:(NSUInteger)index what:(const char *)what
{
    if (index >= MAX_BIND) {
        violation(_cb->_violation, "%s atIndex:%lu (the argument table has 31 entries: 0..30)", what, (unsigned long)index);
        return 0;
    }
    return 1;
}
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state
{
    if (![self mfs_live:"setComputePipelineState"]) return;
    [(id)state retain];
    [_pipe release];
    _pipe = (MFSPipeline *)state;
}
- (void)mfs_clear:(NSUInteger)i
{
    [_buf[i] release];
    _buf[i] = nil;
    free(_bytes[i]);
    _bytes[i] = NULL;
    _bytes_len[i] = 0;
}
- (void)setBytes:(const void *)bytes length:(NSUInteger)length atIndex:(NSUInteger)index
{
    if (![self mfs_live:"setBytes"] || ![self mfs_index:index what:"setBytes"]) return;
    if (length > SET_BYTES_MAX) {
        violation(_cb->_violation, "setBytes:length:%lu atIndex:%lu: more than 4096 bytes (use a buffer)",
                  (unsigned long)length, (unsigned long)index);
        return;
    }
    [self mfs_clear:index];
    _bytes[index] = malloc(length ? length : 1);
    memcpy(_bytes[index], bytes, length);
    _bytes_len[index] = length;
}
- (void)setBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index
{
    if (![self mfs_live:"setBuffer"] || ![self mfs_index:index what:"setBuffer"]) return;
    MFSBuffer *b = (MFSBuffer *)buffer;
    if (b && offset > b->_length) {
        violation(_cb->_violation, "setBuffer:'%s' offset:%lu past its length %lu", b->_cname, (unsigned long)offset,
                  (unsigned long)b->_length);
        return;
    }
    [self mfs_clear:index];
    _buf[index] = [b retain];
    _off[index] = offset;
}
- (void)setBufferOffset:(NSUInteger)offset atIndex:(NSUInteger)index
{
    if (![self mfs_live:"setBufferOffset"] || ![self mfs_index:index what:"setBufferOffset"]) return;
    _off[index] = offset;
}
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index
{
    if (![self mfs_live:"setThreadgroupMemoryLength"] || ![self mfs_index:index what:"setThreadgroupMemoryLength"])
        return;
    if (length % 16) {
        violation(_cb->_violation, "setThreadgroupMemoryLength:%lu atIndex:%lu: not a multiple of 16",
                  (unsigned long)length, (unsigned long)index);
        return;
    }
    if (length > TG_MEM_MAX) {
        violation(_cb->_violation, "setThreadgroupMemoryLength:%lu atIndex:%lu: over maxThreadgroupMemoryLength %d",
                  (unsigned long)length, (unsigned long)index, TG_MEM_MAX);
        return;
    }
    _tg[index] = length;
}
- (void)mfs_race_check:(const mf_emu_kernel *)k index:(int)index
{
    for (int a = 0; a < k->nargs; a++) {
        const mf_emu_arg *arg = &k->args[a];
        if (arg->kind != MF_EMU_ARG_BUFFER || !_buf[arg->index]) continue;
        MFSBuffer *b = _buf[arg->index];
        int writes = !arg->is_const;
        for (int s = 0; s < _nseg; s++) {
            const seg_ent *e = &_seg[s];
            if (e->buf != b || e->index == index || !(writes || e->writes)) continue;
            violation(_cb->_violation,
                      "race: dispatch #%d (%s) %s buffer '%s' (argument '%s') that dispatch #%d (%s) %s, with no "
                      "memoryBarrier between them in a concurrent encoder",
                      index, k->name, writes ? "writes" : "reads", b->_cname, arg->name, e->index, e->kernel,
                      e->writes ? "writes" : "reads");
            return;
        }
    }
    for (int a = 0; a < k->nargs; a++) {
        const mf_emu_arg *arg = &k->args[a];
        if (arg->kind != MF_EMU_ARG_BUFFER || !_buf[arg->index]) continue;
        if (_nseg == _capseg) {
            _capseg = _capseg ? 2 * _capseg : 32;
            _seg = realloc(_seg, sizeof *_seg * (size_t)_capseg);
        }
        _seg[_nseg++] = (seg_ent){ _buf[arg->index], !arg->is_const, index, k->name, a };
    }
}
- (void)dispatchThreadgroups:(MTLSize)threadgroupsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup
{
    if (![self mfs_live:"dispatchThreadgroups"]) return;
    if (!_pipe) {
        violation(_cb->_violation, "dispatchThreadgroups without a compute pipeline state");
        return;
    }
    NSUInteger nt = threadsPerThreadgroup.width * threadsPerThreadgroup.height * threadsPerThreadgroup.depth;
    int index = _cb->_nops;
    if (nt == 0 || nt > _pipe->_max_threads) {
        violation(_cb->_violation,
                  "dispatch #%d (%s): %lu threads per threadgroup (%lux%lux%lu), pipeline maxTotalThreadsPerThreadgroup %lu",
                  index, _pipe->_k->name, (unsigned long)nt, (unsigned long)threadsPerThreadgroup.width,
                  (unsigned long)threadsPerThreadgroup.height, (unsigned long)threadsPerThreadgroup.depth,
                  (unsigned long)_pipe->_max_threads);
        return;
    }
    if (threadgroupsPerGrid.width * threadgroupsPerGrid.height * threadgroupsPerGrid.depth == 0) return;
    if (_type == MTLDispatchTypeConcurrent) [self mfs_race_check:_pipe->_k index:index];
    op o;
    memset(&o, 0, sizeof o);
    o.k = _pipe->_k;
    o.index = index;
    for (int j = 0; j < MAX_BIND; j++) {
        if (_buf[j]) {
            o.buf[j] = [_buf[j] retain];
            o.off[j] = _off[j];
            [_cb mfs_use:_buf[j]];
        } else if (_bytes[j]) {
            o.bytes[j] = malloc(_bytes_len[j] ? _bytes_len[j] : 1);
            memcpy(o.bytes[j], _bytes[j], _bytes_len[j]);
            o.bytes_len[j] = _bytes_len[j];
        }
        o.tg[j] = _tg[j];
    }
    o.groups[0] = (uint32_t)threadgroupsPerGrid.width;
    o.groups[1] = (uint32_t)threadgroupsPerGrid.height;
    o.groups[2] = (uint32_t)threadgroupsPerGrid.depth;
    o.threads[0] = (uint32_t)threadsPerThreadgroup.width;
    o.threads[1] = (uint32_t)threadsPerThreadgroup.height;
    o.threads[2] = (uint32_t)threadsPerThreadgroup.depth;
    [_cb mfs_add_op:&o];
}
- (void)dispatchThreads:(MTLSize)threadsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup
{
    /* non-uniform grids are not modelled: whole threadgroups only */
    if (threadsPerThreadgroup.width == 0 || threadsPerThreadgroup.height == 0 || threadsPerThreadgroup.depth == 0) {
        violation(_cb->_violation, "dispatchThreads with an empty threadgroup");
        return;
    }
    if (threadsPerGrid.width % threadsPerThreadgroup.width || threadsPerGrid.height % threadsPerThreadgroup.height ||
        threadsPerGrid.depth % threadsPerThreadgroup.depth) {
        violation(_cb->_violation, "dispatchThreads: a grid that is not whole threadgroups is not emulated");
        return;
    }
    [self dispatchThreadgroups:MTLSizeMake(threadsPerGrid.width / threadsPerThreadgroup.width,
                                           threadsPerGrid.height / threadsPerThreadgroup.height,
                                           threadsPerGrid.depth / threadsPerThreadgroup.depth)
         threadsPerThreadgroup:threadsPerThreadgroup];
}
- (void)memoryBarrierWithScope:(MTLBarrierScope)scope
{
    if (![self mfs_live:"memoryBarrierWithScope"]) return;
    if (scope & MTLBarrierScopeBuffers) _nseg = 0;
}
- (void)endEncoding
{
    if (![self mfs_live:"endEncoding"]) return;
    _ended = 1;
    if (_cb->_open_encoder == self) _cb->_open_encoder = nil;
}
- (void)dealloc
{
    if (!_ended) {
        violation(_cb->_violation, "encoder released without endEncoding");
        if (_cb->_open_encoder == self) _cb->_open_encoder = nil;
    }
    for (int i = 0; i < MAX_BIND; i++) [self mfs_clear:i];
    free(_seg);
    [_pipe release];
    [_label release];
    [_cb release];
    [super dealloc];
}
@end

/* ---- device --------------------------------------------------------------------- */
@implementation MFSDevice
- (NSString *)name { return _name; }
- (uint64_t)registryID { return 0x6d696e666572ull; }
- (MTLSize)maxThreadsPerThreadgroup { return MTLSizeMake(1024, 1024, 1024); }
- (BOOL)hasUnifiedMemory { return YES; }
- (uint64_t)recommendedMaxWorkingSetSize { return 16ull << 30; }
- (NSUInteger)maxThreadgroupMemoryLength { return TG_MEM_MAX; }
- (NSUInteger)maxBufferLength { return (NSUInteger)1 << 34; }
- (BOOL)supportsFamily:(MTLGPUFamily)gpuFamily
{
    return gpuFamily == MTLGPUFamilyApple7 || gpuFamily == MTLGPUFamilyCommon3 || gpuFamily == MTLGPUFamilyMac2 ||
           (gpuFamily >= MTLGPUFamilyApple1 && gpuFamily <= MTLGPUFamilyApple7) ||
           (gpuFamily >= MTLGPUFamilyCommon1 && gpuFamily <= MTLGPUFamilyCommon3);
}
- (id<MTLCommandQueue>)newCommandQueue
{
    MFSQueue *q = [[MFSQueue alloc] init];
    q->_device = self;
    pthread_mutex_init(&q->_mu, NULL);
    pthread_cond_init(&q->_cv, NULL);
    return q;
}
- (id<MTLCommandQueue>)newCommandQueueWithMaxCommandBufferCount:(NSUInteger)maxCommandBufferCount
{
    (void)maxCommandBufferCount;
    return [self newCommandQueue];
}
- (id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options
{
    if (length == 0) return nil; /* Apple: a zero-length buffer is nil */
    return shared_buffer(self, length, options);
}
- (id<MTLBuffer>)newBufferWithBytes:(const void *)pointer length:(NSUInteger)length options:(MTLResourceOptions)options
{
    MFSBuffer *b = (MFSBuffer *)[self newBufferWithLength:length options:options];
    if (b) memcpy(b->_host, pointer, length);
    return b;
}
- (id<MTLBuffer>)newBufferWithBytesNoCopy:(void *)pointer
                                   length:(NSUInteger)length
                                  options:(MTLResourceOptions)options
                              deallocator:(void (^_Nullable)(void *pointer, NSUInteger length))deallocator
{
    if (!pointer || length == 0 || (uintptr_t)pointer % NOCOPY_ALIGN || length % NOCOPY_ALIGN) {
        fprintf(stderr, "metal stand-in: newBufferWithBytesNoCopy: pointer %p length %lu: both must be multiples of "
                        "the 16384-byte page (nil)\n", pointer, (unsigned long)length);
        return nil;
    }
    MFSBuffer *b = [[MFSBuffer alloc] init];
    b->_device = self;
    b->_host = pointer;
    b->_length = length;
    b->_options = options;
    b->_nocopy = 1;
    b->_dealloc = deallocator ? Block_copy(deallocator) : NULL;
    snprintf(b->_cname, sizeof b->_cname, "(no-copy, %lu bytes)", (unsigned long)length);
    return b;
}
- (id<MTLLibrary>)newDefaultLibrary
{
    MFSLibrary *l = [[MFSLibrary alloc] init];
    l->_device = self;
    return l;
}
- (id<MTLLibrary>)newLibraryWithURL:(NSURL *)url error:(NSError **)error
{
    const char *path = [[url path] UTF8String];
    if (!path || access(path, R_OK) != 0) {
        char m[MSG];
        snprintf(m, sizeof m, "library file %s cannot be read", path ? path : "(no path)");
        if (error) *error = make_error(MTLLibraryErrorDomain, MTLLibraryErrorFileNotFound, m);
        return nil;
    }
    /* no metallib loader here: the file's kernels are the emulator's registry */
    return [self newDefaultLibrary];
}
- (id<MTLLibrary>)newLibraryWithSource:(NSString *)source options:(MTLCompileOptions *)options error:(NSError **)error
{
    (void)options;
    if (!source || [source length] == 0) {
        if (error) *error = make_error(MTLLibraryErrorDomain, MTLLibraryErrorCompileFailure, "empty source");
        return nil;
    }
    /* no MSL compiler on Linux: the same .metal files were compiled as C++
     * into the emulator's registry at build time */
    return [self newDefaultLibrary];
}
- (id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)computeFunction error:(NSError **)error
{
    MFSFunction *f = (MFSFunction *)computeFunction;
    if (!f || !f->_k) {
        if (error) *error = make_error(MTLLibraryErrorDomain, MTLLibraryErrorFunctionNotFound, "no function");
        return nil;
    }
    MFSPipeline *p = [[MFSPipeline alloc] init];
    p->_device = self;
    p->_k = f->_k;
    p->_max_threads = g_pipe_max;
    return p;
}
- (void)dealloc { [_name release]; [super dealloc]; }
@end

static MFSDevice *g_device;

id<MTLDevice> MTLCreateSystemDefaultDevice(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, env_hooks_once);
    pthread_mutex_lock(&g_mu);
    if (!g_device) {
        g_device = [[MFSDevice alloc] init];
        g_device->_name = [[NSString alloc] initWithUTF8String:"minfer stand-in (MSL emulator on the CPU)"];
        mf_emu_set_fault_hook(host_fault_hook);
    }
    pthread_mutex_unlock(&g_mu);
    return [g_device retain];
}

/* ---- compile options, capture ------------------------------------------------------ */
@implementation MTLCompileOptions
- (id)init
{
    if ((self = [super init])) _languageVersion = MTLLanguageVersion2_4;
    return self;
}
- (id)copyWithZone:(NSZone *)zone
{
    MTLCompileOptions *c = [[MTLCompileOptions allocWithZone:zone] init];
    c->_preprocessorMacros = [_preprocessorMacros copy];
    c->_fastMathEnabled = _fastMathEnabled;
    c->_languageVersion = _languageVersion;
    return c;
}
- (NSDictionary<NSString *, NSObject *> *)preprocessorMacros { return _preprocessorMacros; }
- (void)setPreprocessorMacros:(NSDictionary<NSString *, NSObject *> *)m
{
    NSDictionary *c = [m copy];
    [_preprocessorMacros release];
    _preprocessorMacros = c;
}
- (BOOL)fastMathEnabled { return _fastMathEnabled; }
- (void)setFastMathEnabled:(BOOL)v { _fastMathEnabled = v; }
- (MTLLanguageVersion)languageVersion { return _languageVersion; }
- (void)setLanguageVersion:(MTLLanguageVersion)v { _languageVersion = v; }
- (void)dealloc { [_preprocessorMacros release]; [super dealloc]; }
@end

@implementation MTLCaptureDescriptor
- (id)copyWithZone:(NSZone *)zone
{
    MTLCaptureDescriptor *c = [[MTLCaptureDescriptor allocWithZone:zone] init];
    c->_captureObject = [_captureObject retain];
    c->_destination = _destination;
    c->_outputURL = [_outputURL copy];
    return c;
}
- (id)captureObject { return _captureObject; }
- (void)setCaptureObject:(id)o { [o retain]; [_captureObject release]; _captureObject = o; }
- (MTLCaptureDestination)destination { return _destination; }
- (void)setDestination:(MTLCaptureDestination)d { _destination = d; }
- (NSURL *)outputURL { return _outputURL; }
- (void)setOutputURL:(NSURL *)u { NSURL *c = [u copy]; [_outputURL release]; _outputURL = c; }
- (void)dealloc { [_captureObject release]; [_outputURL release]; [super dealloc]; }
@end

@implementation MTLCaptureManager
+ (MTLCaptureManager *)sharedCaptureManager
{
    static MTLCaptureManager *m;
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    if (!m) m = [[MTLCaptureManager alloc] init];
    pthread_mutex_unlock(&mu);
    return m;
}
- (BOOL)supportsDestination:(MTLCaptureDestination)destination
{
    (void)destination;
    return NO; /* no GPU tools on Linux */
}
- (BOOL)startCaptureWithDescriptor:(MTLCaptureDescriptor *)descriptor error:(NSError **)error
{
    (void)descriptor;
    if (error)
        *error = make_error(MTLCaptureErrorDomain, MTLCaptureErrorNotSupported,
                            "GPU capture is not supported by the stand-in framework");
    return NO;
}
- (void)stopCapture { _isCapturing = NO; }
- (BOOL)isCapturing { return _isCapturing; }
@end
