/* rope.cu - rotary position embedding, NORMAL (adjacent pairs) and NEOX
 * (halves) modes.
 *
 * One block per (token, head). Pair i rotates by pos * freq_scale *
 * theta^(-2i/n_rot); the angle and its sine/cosine are computed in double,
 * as the CPU does, so long contexts keep their phase. Each pair is read and
 * written by one thread, so y may equal x; dims >= n_rot are copied. */
#include "backend/cuda/cuda_args.h"
#include "backend/cuda/pdl.cuh"

static __global__ void rope_kernel(mf_cu_rope_args a) {
    mf_pdl_wait();
    mf_pdl_trigger();
    const int64_t t = blockIdx.x / a.n_head;
    const int h = (int)(blockIdx.x % a.n_head);
    const float *xv = a.x + (t * a.n_head + h) * (int64_t)a.head_dim;
    float *yv = a.y + (t * a.n_head + h) * (int64_t)a.head_dim;
    const double p = a.pos ? (double)a.pos[t] : (double)((a.pos0_dev ? (int64_t)*a.pos0_dev : a.pos0) + t);
    const int half = a.n_rot / 2;
    const bool neox = (a.mode & 2) != 0;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const double ang = p * (double)a.freq_scale * pow((double)a.theta, -2.0 * i / (double)a.n_rot);
        double sd, cd;
        sincos(ang, &sd, &cd);
        const float si = (float)sd, co = (float)cd;
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        const float x0 = xv[i0], x1 = xv[i1];
        yv[i0] = x0 * co - x1 * si;
        yv[i1] = x0 * si + x1 * co;
    }
    if (xv != yv)
        for (int d = a.n_rot + threadIdx.x; d < a.head_dim; d += blockDim.x)
            yv[d] = xv[d];
}

extern "C" cudaError_t mf_cu_rope(const mf_cu_rope_args *a, cudaStream_t s) {
    const int64_t blocks = a->nt * a->n_head;
    if (blocks <= 0)
        return cudaSuccess;
    return mf_launch(rope_kernel, dim3((unsigned)blocks), dim3(64), 0, s, *a);
}

#include "backend/cuda/probe.cuh"

extern "C" cudaError_t mf_cu_probe_rope(size_t smem_limit, const char **bad) {
    MF_PROBE(rope_kernel, 64);
    return cudaSuccess;
}
