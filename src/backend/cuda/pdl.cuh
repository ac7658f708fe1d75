/* pdl.cuh - programmatic dependent launch (Hopper, sm_90+).
 *
 * A kernel launched through mf_launch() with PDL on may start while the
 * kernel before it in the stream is still running. That hides the launch
 * gap and lets a decode GEMV pull its weights (which no kernel writes)
 * while the previous kernel finishes. The rules that keep it correct:
 *   - every kernel launched through mf_launch() calls mf_pdl_wait() in every
 *     thread, unconditionally, before it reads anything an earlier kernel
 *     wrote and before it writes anything at all (a buffer it writes may
 *     still be read by the kernel before it), and before any early return;
 *   - before the wait it may only read memory no kernel writes (weights);
 *   - mf_pdl_trigger() lets the next PDL kernel be scheduled; calling it at
 *     the top is safe because the next kernel still waits for this one to
 *     complete (and its writes to be visible) in its own mf_pdl_wait().
 * Kernels launched with <<<>>> are unaffected (plain stream order), and on
 * architectures before sm_90 both calls compile to nothing. The switch is
 * mf_cu_set_pdl() (MINFER_CUDA_PDL, read once at backend creation, before
 * any graph is captured). */
#ifndef MF_CUDA_PDL_CUH
#define MF_CUDA_PDL_CUH

#include <utility>

#include <cuda_runtime.h>

extern int mf_cu_pdl_on;

static __device__ __forceinline__ void mf_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static __device__ __forceinline__ void mf_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

#ifdef MF_KTIME /* the lab's in-kernel timeline build (lab/cuda/README.md) */
#include "ktime.cuh"
#endif

static __device__ mf_kt_rec mf_kt_ring[MF_KT_CAP];
static __device__ unsigned long long mf_kt_n; /* records ever written into this file's ring */

static __device__ __forceinline__ unsigned long long mf_kt_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __device__ __forceinline__ void mf_kt_wait_at(unsigned int site) {
    const bool me = (threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z) == 0;
    unsigned long long t0 = 0, slot = 0;
    if (me) {
        t0 = mf_kt_now();
        /* before the wait: the slot only has to be unique (the dump sorts by
         * time), atomics on one word are coherent whatever else is running,
         * and an early-launched kernel hides the atomic's round trip here */
        slot = atomicAdd(&mf_kt_n, 1ull) & (MF_KT_CAP - 1);
    }
    mf_pdl_wait();
    if (me) {
        const unsigned long long t1 = mf_kt_now();
        mf_kt_rec *r = &mf_kt_ring[slot];
        r->t = t1;
        r->wait_ns = (unsigned int)(t1 - t0);
        r->site = site;
        r->gx = gridDim.x;
        r->gy = gridDim.y;
        r->bx = blockDim.x;
        r->pad = 0;
    }
}
/* every call site records its own line; the function above is already defined */
#define mf_pdl_wait() mf_kt_wait_at(__LINE__)

/* Host side: the reader each file registers (pdl.cu keeps the list). Copies
 * the file's ring into out (MF_KT_CAP records) and its count into *n, then
 * zeroes the count so the next dump sees only newer records; 0 or -1. */
typedef int (*mf_kt_fetch_fn)(mf_kt_rec *out, unsigned long long *n);
int mf_kt_register(const char *file, mf_kt_fetch_fn fetch);

static int mf_kt_fetch(mf_kt_rec *out, unsigned long long *n) {
    const unsigned long long zero = 0;
    if (cudaMemcpyFromSymbol(n, mf_kt_n, sizeof *n) != cudaSuccess ||
        cudaMemcpyFromSymbol(out, mf_kt_ring, sizeof mf_kt_ring) != cudaSuccess ||
        cudaMemcpyToSymbol(mf_kt_n, &zero, sizeof zero) != cudaSuccess)
        return -1;
    return 0;
}
static struct mf_kt_registrar {
    mf_kt_registrar() { mf_kt_register(MF_KT_FILE, mf_kt_fetch); }
} mf_kt_registrar_here;
#endif

/* kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute
 * when mf_cu_pdl_on. Returns the launch status. */
template <typename... P, typename... A>
static cudaError_t mf_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                             A &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = mf_cu_pdl_on ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

#endif
