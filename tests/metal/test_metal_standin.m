/* The stand-in Metal framework through Apple's API: a dispatch end to end,
 * completion on the queue's thread, error statuses for kernel faults, each
 * validation-layer check, the race rule, the in-flight host access rule, the
 * hang hook, and the kernel registry hooks. */
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "emu_rt.h"
#include "mf_standin.h"
#include "mf_test.h"

typedef struct {
    int32_t n;
    float scale;
} t_args;

static id<MTLDevice> g_dev;
static id<MTLCommandQueue> g_q;
static id<MTLLibrary> g_lib;

static id<MTLComputePipelineState> pipeline(const char *name)
{
    id<MTLFunction> f = [g_lib newFunctionWithName:[NSString stringWithUTF8String:name]];
    if (!f) return nil;
    NSError *err = nil;
    id<MTLComputePipelineState> p = [g_dev newComputePipelineStateWithFunction:f error:&err];
    [f release];
    return p;
}

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    pthread_t thread;
} waiter;

static void waiter_init(waiter *w)
{
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &a);
    w->done = 0;
}

static int waiter_wait(waiter *w, int ms)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&w->mu);
    int rc = 0;
    while (!w->done && rc == 0) rc = pthread_cond_timedwait(&w->cv, &w->mu, &t);
    int done = w->done;
    pthread_mutex_unlock(&w->mu);
    return done;
}

static void on_complete(id<MTLCommandBuffer> cb, waiter *w)
{
    (void)cb;
    pthread_mutex_lock(&w->mu);
    w->done = 1;
    w->thread = pthread_self();
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* commit and wait (bounded) */
static int run_cb(id<MTLCommandBuffer> cb, waiter *w)
{
    waiter_init(w);
    [cb addCompletedHandler:^(id<MTLCommandBuffer> c) { on_complete(c, w); }];
    [cb commit];
    return waiter_wait(w, 10000);
}

MF_TEST(test_dispatch_end_to_end)
{
    NSAutoreleasePool *pool = [NSAutoreleasePool new];
    CHECK([g_dev hasUnifiedMemory]);
    CHECK_EQ_INT([g_dev maxThreadgroupMemoryLength], 32768);
    id<MTLComputePipelineState> p = pipeline("mf_t_rowsum");
    CHECK(p != nil);
    CHECK_EQ_INT([p threadExecutionWidth], 32);
    CHECK_EQ_INT([p maxTotalThreadsPerThreadgroup], 1024);
    const int rows = 3, n = 300;
    id<MTLBuffer> x = [g_dev newBufferWithLength:sizeof(float) * rows * n options:MTLResourceStorageModeShared];
    id<MTLBuffer> y = [g_dev newBufferWithLength:sizeof(float) * rows options:MTLResourceStorageModeShared];
    [y setLabel:@"rowsums"];
    float *xp = [x contents];
    for (int i = 0; i < rows * n; i++) xp[i] = (float)(i % 7) - 3.0f;
    t_args a = { n, 0.5f };
    id<MTLCommandBuffer> cb = [g_q commandBuffer];
    id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoderWithDispatchType:MTLDispatchTypeConcurrent];
    [enc setComputePipelineState:p];
    [enc setBuffer:x offset:0 atIndex:0];
    [enc setBuffer:y offset:0 atIndex:1];
    [enc setBytes:&a length:sizeof a atIndex:2];
    [enc setThreadgroupMemoryLength:128 atIndex:0];
    [enc dispatchThreadgroups:MTLSizeMake(rows, 1, 1) threadsPerThreadgroup:MTLSizeMake(96, 1, 1)];
    [enc endEncoding];
    CHECK_EQ_INT([cb status], MTLCommandBufferStatusNotEnqueued);
    waiter w;
    CHECK(run_cb(cb, &w));
    CHECK_EQ_INT([cb status], MTLCommandBufferStatusCompleted);
    CHECK([cb error] == nil);
    CHECK(!pthread_equal(w.thread, pthread_self())); /* the queue's own thread */
    const float *yp = [y contents];
    for (int r = 0; r < rows; r++) {
        double ref = 0;
        for (int i = 0; i < n; i++) ref += xp[r * n + i];
        CHECK_NEAR(yp[r], 0.5 * ref, 1e-4);
    }
    [x release];
    [y release];
    [p release];
    [pool drain];
}

/* The handler block outlives the frame that made it: Block_copy must really
 * copy (gnustep-base has a _Block_copy that does not). */
static waiter g_late;
static int g_late_value;
static void __attribute__((noinline)) add_late_handler(id<MTLCommandBuffer> cb)
{
    int value = 12345;
    waiter *w = &g_late;
    [cb addCompletedHandler:^(id<MTLCommandBuffer> c) {
        (void)c;
        g_late_value = value;
        on_complete(c, w);
    }];
}
static int __attribute__((noinline)) scribble_stack(int n)
{
    volatile char buf[4096];
    for (int i = 0; i < (int)sizeof buf; i++) buf[i] = (char)(i + n);
    return buf[n % 4096];
}

MF_TEST(test_handler_outlives_its_frame)
{
    NSAutoreleasePool *pool = [NSAutoreleasePool new];
    waiter_init(&g_late);
    g_late_value = 0;
    id<MTLCommandBuffer> cb = [g_q commandBuffer];
    add_late_handler(cb);
    scribble_stack(7);
    [cb commit];
    CHECK(waiter_wait(&g_late, 10000));
    CHECK_EQ_INT(g_late_value, 12345);
    [pool drain];
}

MF_TEST(test_kernel_faults_error_status)
{
    NSAutoreleasePool *pool = [NSAutoreleasePool new];
    id<MTLComputePipelineState> p = pipeline("mf_t_overrun");
    id<MTLBuffer> y = [g_dev newBufferWithLength:64 * 4 options:MTLResourceStorageModeShared];
    [y setLabel:@"logits"];
    t_args a = { 3, 0 };
    id<MTLCommandBuffer> cb = [g_q commandBuffer];
    id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoderWithDispatchType:MTLDispatchTypeConcurrent];
    [enc setComputePipelineState:p];
    [enc setBuffer:y offset:0 atIndex:0];
    [enc setBytes:&a length:sizeof a atIndex:1];
    [enc dispatchThreadgroups:MTLSizeMake(2, 1, 1) threadsPerThreadgroup:MTLSizeMake(32, 1, 1)];
    [enc endEncoding];
    waiter w;
    CHECK(run_cb(cb, &w));
    CHECK_EQ_INT([cb status], MTLCommandBufferStatusError);
    NSError *e = [cb error];
    CHECK(e != nil);
    CHECK([[e domain] isEqualToString:MTLCommandBufferErrorDomain]);
    CHECK_EQ_INT([e code], MTLCommandBufferErrorPageFault);
    const char *d = [[e localizedDescription] UTF8String];
    CHECK_STR_CONTAINS(d, "mf_t_overrun");
    CHECK_STR_CONTAINS(d, "past the end of buffer 'logits'");
    [p release];

    /* a deadlocked kernel: an error (a GPU would time out), not a hang */
    p = pipeline("mf_t_early_return");
    a.n = 10;
    cb = [g_q commandBuffer];
    enc = [cb computeCommandEncoderWithDispatchType:MTLDispatchTypeConcurrent];
    [enc setComputePipelineState:p];
    [enc setBuffer:y offset:0 atIndex:0];
    [enc setBytes:&a length:sizeof a atIndex:1];
    [enc setThreadgroupMemoryLength:256 atIndex:0];
    [enc dispatchThreadgroups:MTLSizeMake(1, 1, 1) threadsPerThreadgroup:MTLSizeMake(64, 1, 1)];
    [enc endEncoding];
    CHECK(run_cb(cb, &w));
    CHECK_EQ_INT([cb status], MTLCommandBufferStatusError);
    CHECK_EQ_INT([[cb error] code], MTLCommandBufferErrorTimeout);
    CHECK_STR_CONTAINS([[[cb error] localizedDescription] UTF8String], "DEADLOCK");
    [p release];
    [y release];
    [pool drain];
}

/* One command buffer with one violation: counted, named, status Error. */
static void expect_violation(const char *what, void (^body)(id<MTLCommandBuffer> cb, id<MTLComputeCommandEncoder> enc))
{
    mf_standin_reset_violations();
    id<MTLCommandBuffer> cb = [g_q commandBuffer];
    id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoderWithDispatchType:MTLDispatchTypeConcurrent];
    body(cb, enc);
    CHECK_MSG(mf_standin_violations() >= 1, "no violation for %s", what);
    CHECK_STR_CONTAINS(mf_standin_last_violation(), what);
    if ([cb status] == MTLCommandBufferStatusNotEnqueued) {
        waiter w;
        CHECK(run_cb(cb, &w));
    } else {
        [cb waitUntilCompleted];
    }
    CHECK_EQ_INT([cb status], MTLCommandBufferStatusError);
}

MF_TEST(test_validation_checks)
{
    NSAutoreleasePool *pool = [NSAutoreleasePool new];
    id<MTLComputePipelineState> p = pipeline("mf_t_rowsum");
    id<MTLBuffer> b = [g_dev newBufferWithLength:4096 options:MTLResourceStorageModeShared];
    static char big[4097];
    char *bigp = big;
    expect_violation("after endEncoding", ^(id<MTLCommandBuffer> cb, id<MTLComputeCommandEncoder> enc) {
        (void)cb;
        [enc endEncoding];
        [enc setBuffer:b offset:0 atIndex:0];
    });
    expect_violation("commit with an encoder", ^(id<MTLCommandBuffer> cb, id<MTLComputeCommandEncoder> enc) {
        (void)enc;
        [cb commit];
        [enc endEncoding];
    });
    /* refused handler: the command buffer itself completes */
    mf_standin_reset_violations();
    {
        id<MTLCommandBuffer> cb = [g_q commandBuffer];
        [cb commit];
        [cb addCompletedHandler:^(id<MTLCommandBuffer> c) { (void)c; }];
        CHECK_STR_CONTAINS(mf_standin_last_violation(), "addCompletedHandler after commit");
        [cb waitUntilCompleted];
    }
    expect_violation("atIndex:31", ^(id<MTLCommandBuffer> cb, id<MTLComputeCommandEncoder> enc) {
        (void)cb;
        [enc setBuffer:b offset:0 atIndex:31];
        [enc endEncoding];
    });
    expect_violation("more than 4096 bytes", ^(id<MTLCommandBuffer> cb, id<MTLComputeCommandEncoder> enc) {
        (void)cb;
        [enc setBytes:bigp length:4097 atIndex:2];
        [enc endEncoding];
    });
    expect_violation("not a multiple of 16", ^(id<MTLCommandBuffer> cb, id<MTLComputeCommandEncoder> enc) {
        (void)cb;
        [enc setThreadgroupMemoryLength:20 atIndex:0];
        [enc endEncoding];
    });
    expect_violation("over maxThreadgroupMemoryLength", ^(id<MTLCommandBuffer> cb, id<MTLComputeCommandEncoder> enc) {
        (void)cb;
        [enc setThreadgroupMemoryLength:32768 + 16 atIndex:0];
        [enc endEncoding];
    });
    mf_standin_set_pipeline_max_threads(64);
    id<MTLComputePipelineState> small = pipeline("mf_t_rowsum");
    mf_standin_set_pipeline_max_threads(1024);
    CHECK_EQ_INT([small maxTotalThreadsPerThreadgroup], 64);
    expect_violation("maxTotalThreadsPerThreadgroup 64", ^(id<MTLCommandBuffer> cb, id<MTLComputeCommandEncoder> enc) {
        (void)cb;
        [enc setComputePipelineState:small];
        [enc dispatchThreadgroups:MTLSizeMake(1, 1, 1) threadsPerThreadgroup:MTLSizeMake(128, 1, 1)];
        [enc endEncoding];
    });
    [small release];
    /* NoCopy: pointer and length must be 16 KiB multiples */
    void *m = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *al = (unsigned char *)(((uintptr_t)m + 16383) & ~(uintptr_t)16383);
    id<MTLBuffer> nb = [g_dev newBufferWithBytesNoCopy:al + 4096 length:16384 options:MTLResourceStorageModeShared deallocator:nil];
    CHECK(nb == nil);
    nb = [g_dev newBufferWithBytesNoCopy:al length:16384 - 16 options:MTLResourceStorageModeShared deallocator:nil];
    CHECK(nb == nil);
    __block int freed = 0;
    nb = [g_dev newBufferWithBytesNoCopy:al length:16384 options:MTLResourceStorageModeShared
                              deallocator:^(void *ptr, NSUInteger len) { freed = ptr == al && len == 16384; }];
    CHECK(nb != nil);
    CHECK([nb contents] == al);
    [nb release];
    CHECK(freed);
    munmap(m, 65536);
    [b release];
    [p release];
    [pool drain];
}

static id<MTLCommandBuffer> two_dispatches(const char *k1, const char *k2, id<MTLBuffer> shared, id<MTLBuffer> other,
                                           int barrier, MTLDispatchType type)
{
    id<MTLComputePipelineState> p1 = pipeline(k1), p2 = pipeline(k2);
    id<MTLCommandBuffer> cb = [g_q commandBuffer];
    id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoderWithDispatchType:type];
    [enc setComputePipelineState:p1];
    [enc setBuffer:other offset:0 atIndex:0];
    [enc setBuffer:shared offset:0 atIndex:1];
    [enc dispatchThreadgroups:MTLSizeMake(1, 1, 1) threadsPerThreadgroup:MTLSizeMake(4, 1, 1)];
    if (barrier) [enc memoryBarrierWithScope:MTLBarrierScopeBuffers];
    [enc setComputePipelineState:p2];
    [enc setBuffer:shared offset:0 atIndex:0];
    [enc setBuffer:other offset:256 atIndex:1];
    [enc dispatchThreadgroups:MTLSizeMake(1, 1, 1) threadsPerThreadgroup:MTLSizeMake(4, 1, 1)];
    [enc endEncoding];
    [p1 release];
    [p2 release];
    return cb;
}

MF_TEST(test_race_rule)
{
    NSAutoreleasePool *pool = [NSAutoreleasePool new];
    id<MTLBuffer> act = [g_dev newBufferWithLength:1024 options:MTLResourceStorageModeShared];
    id<MTLBuffer> other = [g_dev newBufferWithLength:1024 options:MTLResourceStorageModeShared];
    [act setLabel:@"act0"];
    /* mf_t_vec4 reads buffer(0) (device const), writes buffer(1):
     * #0 writes act0, #1 reads it */
    mf_standin_reset_violations();
    id<MTLCommandBuffer> cb = two_dispatches("mf_t_vec4", "mf_t_vec4", act, other, 0, MTLDispatchTypeConcurrent);
    CHECK_EQ_INT(mf_standin_violations(), 1);
    const char *v = mf_standin_last_violation();
    CHECK_STR_CONTAINS(v, "race: dispatch #1 (mf_t_vec4) reads buffer 'act0'");
    CHECK_STR_CONTAINS(v, "dispatch #0 (mf_t_vec4) writes");
    waiter w;
    CHECK(run_cb(cb, &w));
    CHECK_EQ_INT([cb status], MTLCommandBufferStatusError);
    CHECK_STR_CONTAINS([[[cb error] localizedDescription] UTF8String], "race");
    /* with the barrier, or in a serial encoder: no race */
    mf_standin_reset_violations();
    cb = two_dispatches("mf_t_vec4", "mf_t_vec4", act, other, 1, MTLDispatchTypeConcurrent);
    CHECK(run_cb(cb, &w));
    cb = two_dispatches("mf_t_vec4", "mf_t_vec4", act, other, 0, MTLDispatchTypeSerial);
    CHECK(run_cb(cb, &w));
    CHECK_EQ_INT([cb status], MTLCommandBufferStatusCompleted);
    CHECK_EQ_INT(mf_standin_violations(), 0);
    [act release];
    [other release];
    [pool drain];
}

MF_TEST(test_hang_hook)
{
    NSAutoreleasePool *pool = [NSAutoreleasePool new];
    id<MTLCommandQueue> q = [g_dev newCommandQueue];
    mf_standin_set_hang(1);
    id<MTLCommandBuffer> cb = [q commandBuffer];
    static waiter w;
    waiter *wp = &w;
    waiter_init(wp);
    [cb addCompletedHandler:^(id<MTLCommandBuffer> c) { on_complete(c, wp); }];
    [cb commit];
    CHECK(!waiter_wait(wp, 200)); /* the bounded wait times out */
    CHECK_EQ_INT([cb status], MTLCommandBufferStatusCommitted);
    mf_standin_set_hang(0);
    [q release]; /* the queue's thread exits; the hung command buffer never completes */
    CHECK(!w.done);
    [pool drain];
}

MF_TEST(test_registry_hooks)
{
    NSAutoreleasePool *pool = [NSAutoreleasePool new];
    id<MTLFunction> f = [g_lib newFunctionWithName:@"mf_no_such_kernel"];
    CHECK(f == nil);
    CHECK([[g_lib functionNames] containsObject:@"mf_t_rowsum"]);
    mf_standin_hide_kernel("mf_t_rowsum", 1);
    CHECK(![[g_lib functionNames] containsObject:@"mf_t_rowsum"]);
    mf_standin_hide_kernel("mf_t_rowsum", 0);
    CHECK_EQ_INT(mf_standin_hide_kernel("mf_t_rowsum", 1), 0);
    CHECK(pipeline("mf_t_rowsum") == nil);
    mf_standin_hide_kernel("mf_t_rowsum", 0);
    id<MTLComputePipelineState> p = pipeline("mf_t_rowsum");
    CHECK(p != nil);
    [p release];
    /* substitution: the name resolves to a faulty kernel */
    CHECK_EQ_INT(mf_standin_substitute_kernel("mf_t_rowsum", "mf_t_early_return"), 0);
    f = [g_lib newFunctionWithName:@"mf_t_rowsum"];
    CHECK(f != nil);
    CHECK([[f name] isEqualToString:@"mf_t_rowsum"]);
    [f release];
    mf_standin_substitute_kernel("mf_t_rowsum", NULL);
    [pool drain];
}

/* Host access to a buffer in flight: the process stops with a message naming
 * the buffer (checked in a child process). */
MF_TEST(test_host_access_in_flight)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        NSAutoreleasePool *pool = [NSAutoreleasePool new];
        id<MTLBuffer> kv = [g_dev newBufferWithLength:8192 options:MTLResourceStorageModeShared];
        [kv setLabel:@"kv cache"];
        float *host = [kv contents];
        host[3] = 1.0f; /* fine: not in flight */
        id<MTLComputePipelineState> p = pipeline("mf_t_vec4");
        id<MTLCommandQueue> q = [g_dev newCommandQueue];
        mf_standin_set_hang(1); /* keep it in flight */
        id<MTLCommandBuffer> cb = [q commandBuffer];
        id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoderWithDispatchType:MTLDispatchTypeConcurrent];
        [enc setComputePipelineState:p];
        [enc setBuffer:kv offset:0 atIndex:0];
        [enc setBuffer:kv offset:4096 atIndex:1];
        [enc dispatchThreadgroups:MTLSizeMake(1, 1, 1) threadsPerThreadgroup:MTLSizeMake(4, 1, 1)];
        [enc endEncoding];
        [cb commit];
        volatile float r = host[100]; /* refused */
        (void)r;
        [pool drain];
        _exit(0);
    }
    close(fds[1]);
    char buf[2048] = { 0 };
    size_t got = 0;
    ssize_t k;
    while (got + 1 < sizeof buf && (k = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)k;
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    CHECK_STR_CONTAINS(buf, "host access to buffer 'kv cache' (8192 bytes) at offset 400 while a command buffer");
}

int main(int argc, char **argv)
{
    NSAutoreleasePool *pool = [NSAutoreleasePool new];
    g_dev = MTLCreateSystemDefaultDevice();
    g_q = [g_dev newCommandQueue];
    NSError *err = nil;
    g_lib = [g_dev newLibraryWithSource:@"// the kernels come from the emulator's registry" options:nil error:&err];
    static const mf_test_entry tests[] = { MF_T(test_dispatch_end_to_end), MF_T(test_handler_outlives_its_frame),
                                           MF_T(test_kernel_faults_error_status),
                                           MF_T(test_validation_checks),   MF_T(test_race_rule),
                                           MF_T(test_hang_hook),           MF_T(test_registry_hooks),
                                           MF_T(test_host_access_in_flight) };
    int rc = mf_test_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    [g_lib release];
    [g_q release];
    [g_dev release];
    [pool drain];
    return rc;
}
