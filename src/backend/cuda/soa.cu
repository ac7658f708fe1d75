/* soa.cu - the plane ("SoA") copies of Q4_0 / Q5_0 / Q8_0 weights that the
 * v4 decode GEMV reads with aligned loads (MINFER_CUDA_SOA; the layout and
 * why: q8w_soa.cuh). Built once on the device from the uploaded block copy
 * (cuda_backend.c, after the upload): no host repacking, no second upload. */
#include "backend/cuda/cuda_args.h"
#include "backend/cuda/dequant.cuh"

/* Block bytes of a type with a plane layout, 0 for the others. */
static uint64_t soa_block(uint32_t wtype) {
    switch (wtype) {
    case MF_TYPE_Q4_0:
        return sizeof(mf_block_q4_0);
    case MF_TYPE_Q5_0:
        return sizeof(mf_block_q5_0);
    case MF_TYPE_Q8_0:
        return sizeof(mf_block_q8_0);
    default:
        return 0;
    }
}

extern "C" uint64_t mf_cu_soa_stride(uint32_t wtype, int64_t n_in) {
    const uint64_t b = soa_block(wtype);
    if (b == 0 || n_in <= 0 || n_in % 32 != 0)
        return 0;
    return ((uint64_t)(n_in / 32) * b + 15) & ~(uint64_t)15;
}

/* One thread per unit (block) of the weight: unit u of row r from src (row
 * after row, n blocks each) to the planes of row r of dst (stride bytes
 * apart). The block is 2-byte aligned: read as 16-bit halves. The bytes
 * past the planes (the row's padding) are zeroed by the caller's memset. */
template <int T>
static __global__ void soa_relayout_kernel(const uint8_t *__restrict__ src, int64_t n, int64_t rows,
                                           uint8_t *__restrict__ dst, uint64_t stride) {
    constexpr int B = T == MF_TYPE_Q4_0 ? 18 : T == MF_TYPE_Q5_0 ? 22 : 34;
    constexpr int QS = T == MF_TYPE_Q8_0 ? 32 : 16;
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n * rows)
        return;
    const int64_t r = g / n, u = g % n;
    const uint16_t *b = (const uint16_t *)(src + (uint64_t)g * B);
    uint16_t h[B / 2];
#pragma unroll
    for (int i = 0; i < B / 2; i++)
        h[i] = b[i];
    uint8_t *row = dst + (uint64_t)r * stride;
    /* d is bytes 0-1 of every block; Q5_0's qh bytes 2-5; qs the rest */
    const int q0 = T == MF_TYPE_Q5_0 ? 3 : 1; /* first half-word of qs */
    uint32_t w[QS / 4];
#pragma unroll
    for (int i = 0; i < QS / 4; i++)
        w[i] = (uint32_t)h[q0 + 2 * i] | (uint32_t)h[q0 + 2 * i + 1] << 16;
    uint4 *qs = (uint4 *)(row + (uint64_t)QS * u);
#pragma unroll
    for (int i = 0; i < QS / 16; i++)
        qs[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
    uint64_t dp = (uint64_t)QS * n;
    if (T == MF_TYPE_Q5_0) {
        ((uint32_t *)(row + dp))[u] = (uint32_t)h[1] | (uint32_t)h[2] << 16;
        dp += 4 * (uint64_t)n;
    }
    ((uint16_t *)(row + dp))[u] = h[0];
}

extern "C" cudaError_t mf_cu_soa_relayout(uint32_t wtype, const void *src, int64_t n_in, int64_t rows, void *dst,
                                          cudaStream_t s) {
    const uint64_t stride = mf_cu_soa_stride(wtype, n_in);
    if (stride == 0 || rows <= 0 || !src || !dst || ((uintptr_t)src & 1) || ((uintptr_t)dst & 15))
        return cudaErrorInvalidValue;
    const int64_t n = n_in / 32, units = n * rows;
    cudaError_t e = cudaMemsetAsync(dst, 0, stride * (uint64_t)rows, s);
    if (e != cudaSuccess)
        return e;
    const dim3 grid((unsigned)((units + 255) / 256)), block(256);
    const uint8_t *sp = (const uint8_t *)src;
    uint8_t *dp = (uint8_t *)dst;
    switch (wtype) {
    case MF_TYPE_Q4_0:
        soa_relayout_kernel<MF_TYPE_Q4_0><<<grid, block, 0, s>>>(sp, n, rows, dp, stride);
        break;
    case MF_TYPE_Q5_0:
        soa_relayout_kernel<MF_TYPE_Q5_0><<<grid, block, 0, s>>>(sp, n, rows, dp, stride);
        break;
    case MF_TYPE_Q8_0:
        soa_relayout_kernel<MF_TYPE_Q8_0><<<grid, block, 0, s>>>(sp, n, rows, dp, stride);
        break;
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
