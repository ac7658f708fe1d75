/* ropetab.cu - the (cos, sin) table of the rope folded into the QKV GEMV
 * (MINFER_CUDA_QKV_ROPE, gemv_q8v4.cu): entry (p, i) is what rope.cuh's
 * mf_rope_head (and the rope-store kernels) compute for position p and pair
 * i, the angle p * freq_scale * theta^(-2i / n_rot) and its sine / cosine in
 * double, each rounded to float. The same expression, operand order and
 * libdevice calls, so a lookup is bitwise the in-kernel math: the GEMV's
 * epilogue then needs one 8-byte load instead of a double pow + sincos.
 * Filled once per (theta, freq_scale, n_rot, n_pos) by the backend, outside
 * any CUDA graph capture; plain <<<>>> launch (not on the decode path). */
#include <math.h>

#include "backend/cuda/cuda_args.h"

static __global__ void rope_table_kernel(float2 *cs, int64_t n_pos, int32_t n_rot, float theta,
                                         float freq_scale) {
    const int half = n_rot / 2;
    const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n_pos * half)
        return;
    const int64_t pos = k / half;
    const int i = (int)(k % half);
    const double p = (double)pos;
    const double ang = p * (double)freq_scale * pow((double)theta, -2.0 * i / (double)n_rot);
    double sd, cd;
    sincos(ang, &sd, &cd);
    cs[k] = make_float2((float)cd, (float)sd);
}

extern "C" cudaError_t mf_cu_rope_table(float *cs, int64_t n_pos, int32_t n_rot, float theta, float freq_scale,
                                        cudaStream_t s) {
    if (!cs || n_pos <= 0 || n_rot <= 0 || n_rot % 2)
        return cudaErrorInvalidValue;
    const int64_t n = n_pos * (n_rot / 2);
    const int64_t blocks = (n + 255) / 256;
    if (blocks > 0x7fffffff)
        return cudaErrorInvalidValue;
    rope_table_kernel<<<(unsigned)blocks, 256, 0, s>>>((float2 *)cs, n_pos, n_rot, theta, freq_scale);
    return cudaGetLastError();
}
