// norm.metal - RMSNorm over rows of width w (RMSNORM: the hidden size;
// QKNORM: head_dim, one row per head). One threadgroup per row of up to 8
// simdgroups: each thread sums the squares of elements tpitg.x, +ntg.x, ...,
// simd_sum per simdgroup, the partials meet in threadgroup memory. Scalar
// loads only: a row starts at x + row * w, which is not 16-byte aligned
// when w % 4 != 0. Every thread reaches both barriers; a thread with no
// element just sums nothing.
#include "metal_args.h"

using namespace metal;

kernel void mf_rmsnorm(device const float *x [[buffer(0)]], device const float *wt [[buffer(1)]],
                       device float *y [[buffer(2)]], constant mf_mtl_norm_args &a [[buffer(3)]],
                       threadgroup float *shmem [[threadgroup(0)]],
                       uint3 tgpig [[threadgroup_position_in_grid]],
                       uint3 tpitg [[thread_position_in_threadgroup]],
                       uint3 ntg [[threads_per_threadgroup]],
                       uint tiisg [[thread_index_in_simdgroup]],
                       uint sgitg [[simdgroup_index_in_threadgroup]]) {
    const int64_t row = tgpig.x;
    const bool live = row < a.rows;
    const int64_t base = (live ? row : 0) * a.w;
    float ss = 0.0f;
    for (int i = int(tpitg.x); i < a.w; i += int(ntg.x)) {
        const float v = x[base + i];
        ss += v * v;
    }
    ss = simd_sum(ss);
    if (tiisg == 0)
        shmem[sgitg] = ss;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const uint nsg = (ntg.x + 31) / 32;
    float tot = 0.0f;
    for (uint s = 0; s < nsg; s++)
        tot += shmem[s];
    const float inv = rsqrt(tot / float(a.w) + a.eps);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (live) {
        for (int i = int(tpitg.x); i < a.w; i += int(ntg.x)) {
            const float v = x[base + i] * inv;
            y[base + i] = a.has_w ? v * wt[i] : v;
        }
    }
}
