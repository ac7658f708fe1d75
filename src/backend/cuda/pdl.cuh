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
 * architectures before sm_90 both calls compile to nothing. Whether a
 * launch asks for it is its argument struct's pdl field, which the backend
 * fills from its tuning (tune pdl). */
#ifndef MF_CUDA_PDL_CUH
#define MF_CUDA_PDL_CUH

#include <utility>

#include <cuda_runtime.h>

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

/* kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute
 * when pdl. Returns the launch status. */
template <typename... P, typename... A>
static cudaError_t mf_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, bool pdl,
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
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

#endif
