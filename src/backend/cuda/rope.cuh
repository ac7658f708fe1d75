/* rope.cuh - one head of rotary position embedding, shared by rope.cu and
 * ropestore.cu (the fused rope + KV-store tail) so the two give bitwise
 * equal results.
 *
 * Pair i of head h of token t rotates by pos * freq_scale *
 * theta^(-2i/n_rot), the angle and its sine/cosine in double as the CPU
 * does; NEOX pairs (i, i + n_rot/2), NORMAL pairs (2i, 2i+1). The block's
 * threads stride over the pairs; each pair is read and written by one
 * thread, so y may equal x; dims >= n_rot are copied when y != x. */
#ifndef MF_CUDA_ROPE_CUH
#define MF_CUDA_ROPE_CUH

#include "backend/cuda/cuda_args.h"

static __device__ void mf_rope_head(const mf_cu_rope_args &a, int64_t t, int h) {
    const double p = a.pos ? (double)a.pos[t] : (double)((a.pos0_dev ? (int64_t)*a.pos0_dev : a.pos0) + t);
    const int half = a.n_rot / 2;
    const bool neox = (a.mode & 2) != 0;
    const int64_t off = (t * a.n_head + h) * (int64_t)a.head_dim;
    const float *xv = a.x + off;
    float *yv = a.y + off;
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

#endif
