// pdl-chain-bench.cu - what one kernel boundary costs in a replayed chain of
// small kernels, the shape of a small model's decode step (PERF.md entry 17:
// every kernel of a 0.5B layer costs >= ~1.9 us in place, even a 1-block
// one). Three ways to order kernel i after kernel i - 1, each a CUDA graph of
// N kernels replayed after warm-up, timed with events:
//   plain  stream order, no programmatic launch;
//   pdl    launched with programmatic stream serialization, griddepcontrol.wait
//          first (what minfer does): kernel i runs once grid i - 1 has
//          completed and flushed;
//   flag   launched the same way, no griddepcontrol.wait: each block of kernel
//          i - 1 bumps a counter (release) after its work, and kernel i's
//          blocks spin (acquire) until it reaches grid i - 1's block count.
// Safe because a programmatic launch happens only once every block of the
// grid before has started (each triggers first), so a spinning grid never
// holds the SMs the grid it waits on still needs.
// Each block reads a value another block of the kernel before wrote and adds
// one, and may stream `kb` KiB of a weight-like buffer (each kernel its own
// slice, so from HBM like a model's weights); the final values must equal N:
// a read that saw a stale value (or the NaN poison) would not. Grids alternate
// between two sizes (b1, b2) like norm-quant (4 blocks) and GEMV (112-448).
// The launches and the wait / trigger are minfer's own (pdl.cuh: mf_launch
// with its pdl argument set per mode, mf_pdl_wait, mf_pdl_trigger).
//   nvcc -O3 -arch=sm_90 -I src lab/cuda/pdl-chain-bench.cu -o pdl-chain-bench
//   ./pdl-chain-bench [N=168] [b1=4] [b2=144] [threads=128] [kb=0]
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>

#include "backend/cuda/pdl.cuh"


#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "pdl-chain-bench: %s failed at line %d: %s\n", #x, __LINE__,        \
                    cudaGetErrorString(e_));                                                    \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

enum { MODE_PLAIN, MODE_PDL, MODE_FLAG };

struct chain_args {
    const float *prev;
    float *cur;
    int n_prev;                /* blocks of the kernel before (0: the first kernel) */
    unsigned *cnt_prev, *cnt;  /* flag mode: the counters of kernel i - 1 and i */
    const float4 *w;           /* kb KiB a block, this kernel's slice */
    int w_per_block;           /* float4 items a block streams */
};

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

template <int MODE>
__global__ void chain_kernel(chain_args a) {
    if (MODE == MODE_PDL)
        mf_pdl_wait();
    if (MODE != MODE_PLAIN)
        mf_pdl_trigger();
    __shared__ float s_sum;
    if (MODE == MODE_FLAG && a.n_prev > 0) {
        if (threadIdx.x == 0)
            while (ld_acquire(a.cnt_prev) < (unsigned)a.n_prev)
                __nanosleep(32);
        __syncthreads();
    }
    float acc = 0.0f;
    const float4 *w = a.w + (size_t)blockIdx.x * a.w_per_block;
    for (int i = threadIdx.x; i < a.w_per_block; i += blockDim.x) {
        const float4 v = w[i];
        acc += v.x + v.y + v.z + v.w;
    }
    for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (threadIdx.x == 0)
        s_sum = 0.0f;
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        atomicAdd(&s_sum, acc);
    __syncthreads();
    if (threadIdx.x == 0) {
        const float in = a.n_prev > 0 ? a.prev[(blockIdx.x * 7 + 3) % a.n_prev] : 0.0f;
        a.cur[blockIdx.x] = in + 1.0f + 0.0f * s_sum; /* the sum keeps the reads; w is zeros */
        if (MODE == MODE_FLAG) {
            __threadfence();
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(a.cnt) : "memory");
        }
    }
}

static void launch(int mode, dim3 g, dim3 b, const chain_args &a, cudaStream_t s) {
    const bool pdl = mode != MODE_PLAIN;
    if (mode == MODE_PLAIN)
        CK(mf_launch(chain_kernel<MODE_PLAIN>, g, b, 0, s, pdl, a));
    else if (mode == MODE_PDL)
        CK(mf_launch(chain_kernel<MODE_PDL>, g, b, 0, s, pdl, a));
    else
        CK(mf_launch(chain_kernel<MODE_FLAG>, g, b, 0, s, pdl, a));
}

int main(int argc, char **argv) {
    const int n = argc > 1 ? atoi(argv[1]) : 168;
    const int b1 = argc > 2 ? atoi(argv[2]) : 4, b2 = argc > 3 ? atoi(argv[3]) : 144;
    const int thr = argc > 4 ? atoi(argv[4]) : 128, kb = argc > 5 ? atoi(argv[5]) : 0;
    if (n < 2 || b1 < 1 || b2 < 1 || thr < 32 || thr > 1024 || thr % 32 || kb < 0 || kb > 1024) {
        fprintf(stderr, "pdl-chain-bench: usage: N>=2 b1>=1 b2>=1 threads(32..1024, x32) kb(0..1024)\n");
        return 2;
    }
    const int bmax = b1 > b2 ? b1 : b2;
    const int wpb = kb * 1024 / 16; /* float4 a block */
    /* each kernel its own weight slice: the chain streams N * bmax * kb KiB */
    const size_t wbytes = (size_t)n * bmax * kb * 1024 + 16;
    float4 *w;
    float *buf[2];
    unsigned *cnt;
    CK(cudaMalloc(&w, wbytes));
    CK(cudaMemset(w, 0, wbytes));
    CK(cudaMalloc(&buf[0], bmax * sizeof(float)));
    CK(cudaMalloc(&buf[1], bmax * sizeof(float)));
    CK(cudaMalloc(&cnt, (size_t)n * sizeof(unsigned)));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const char *names[3] = {"plain", "pdl", "flag"};
    printf("pdl-chain-bench: N %d kernels, grids %d / %d blocks of %d threads, %d KiB a block\n", n, b1, b2, thr,
           kb);
    for (int mode = 0; mode < 3; mode++) {
        cudaGraph_t gr;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        CK(cudaMemsetAsync(cnt, 0, (size_t)n * sizeof(unsigned), s));
        CK(cudaMemsetAsync(buf[0], 0xff, bmax * sizeof(float), s)); /* NaN: a read before a write shows */
        CK(cudaMemsetAsync(buf[1], 0xff, bmax * sizeof(float), s));
        for (int i = 0; i < n; i++) {
            const int nb = i % 2 ? b2 : b1, np = i == 0 ? 0 : ((i - 1) % 2 ? b2 : b1);
            chain_args a = {buf[(i + 1) % 2], buf[i % 2], np, i ? cnt + i - 1 : cnt, cnt + i,
                            w + (size_t)i * bmax * wpb, wpb};
            launch(mode, dim3(nb), dim3(thr), a, s);
        }
        CK(cudaStreamEndCapture(s, &gr));
        CK(cudaGraphInstantiate(&ge, gr, 0));
        for (int r = 0; r < 3; r++)
            CK(cudaGraphLaunch(ge, s));
        CK(cudaStreamSynchronize(s));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        const int reps = 20;
        CK(cudaEventRecord(e0, s));
        for (int r = 0; r < reps; r++)
            CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        /* the last kernel's values: each the chain length if every read saw its writer's value */
        const int nl = (n - 1) % 2 ? b2 : b1;
        float *h = (float *)malloc(nl * sizeof(float));
        CK(cudaMemcpy(h, buf[(n - 1) % 2], nl * sizeof(float), cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int i = 0; i < nl; i++)
            bad += h[i] != (float)n;
        printf("%-5s  %8.2f us a replay  %6.3f us a kernel  %s (%d of %d final values != %d)\n", names[mode],
               1000.0 * ms / reps, 1000.0 * ms / reps / n, bad ? "WRONG" : "ok", bad, nl, n);
        free(h);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(gr));
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
    }
    CK(cudaFree(w));
    CK(cudaFree(buf[0]));
    CK(cudaFree(buf[1]));
    CK(cudaFree(cnt));
    CK(cudaStreamDestroy(s));
    return 0;
}
