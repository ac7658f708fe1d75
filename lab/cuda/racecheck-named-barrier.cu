// racecheck-named-barrier.cu - why the racecheck stage of gpu-check.sh leaves
// out the shortrope family: compute-sanitizer racecheck (CUDA 12.x/13.0 on
// the H200, session 6) reports hazards in this kernel, which is correct by
// construction. Warps 8-11 exchange through shared memory across a 128-thread
// named barrier (bar.sync 1, 128), the way attn_short.cu's rope prologue
// does; afterwards every exchange is separated by __syncthreads (bar.sync 0,
// the whole block). racecheck then reports "Race reported between Write
// access ... and Read access" for pairs on both sides of a __syncthreads
// (here s_c and s_m; in attn_short.cu the s_m / s_acc merge): it appears to
// count the named barrier as a block-wide one, so the four warps that took
// it look one barrier ahead of the rest. memcheck, and the bitwise tests of
// the shortrope family, cover the kernel instead.
//   nvcc -O3 -lineinfo -arch=sm_90 lab/cuda/racecheck-named-barrier.cu -o nb
//   compute-sanitizer --tool racecheck ./nb
#include <cstdio>

template <bool NAMED>
__global__ void nb_kernel(float *out) {
    __shared__ float s_m[12];
    __shared__ float s_x[64];
    __shared__ float s_c;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (NAMED && warp >= 8) {
        if (warp < 10)
            s_x[(warp - 8) * 32 + lane] = (float)lane;
        asm volatile("bar.sync 1, 128;" ::: "memory");
        if (warp == 10 && lane == 0) {
            float t = 0.0f;
            for (int j = 0; j < 64; j++)
                t += s_x[j];
            s_c = t;
        }
    }
    __syncthreads();
    const float c = NAMED ? s_c : 0.0f;
    __syncthreads();
    if (lane == 0)
        s_m[warp] = (float)warp + c;
    __syncthreads();
    if (warp == 0) {
        float m = 0.0f;
        for (int w = 0; w < 12; w++)
            m += s_m[w];
        if (lane == 0)
            out[blockIdx.x + (NAMED ? 0 : 14)] = m;
    }
}

int main() {
    float *d = NULL;
    if (cudaMalloc(&d, 28 * sizeof(float)) != cudaSuccess)
        return 1;
    nb_kernel<true><<<14, 384>>>(d);
    nb_kernel<false><<<14, 384>>>(d);
    float h[28];
    const cudaError_t e = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    /* 0 + 1 + ... + 11 = 66, plus 12 x (0 + 1 + ... + 31) x 2 = 12 x 992 with the exchange */
    printf("%s: named %.0f (want %.0f), plain %.0f (want 66)\n", cudaGetErrorName(e), h[0], 66.0 + 12 * 992.0,
           h[14]);
    cudaFree(d);
    return e == cudaSuccess && h[0] == 66.0f + 12 * 992.0f && h[14] == 66.0f ? 0 : 1;
}
