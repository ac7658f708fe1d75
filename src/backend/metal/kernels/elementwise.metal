// elementwise.metal - one thread per element: ADD, MUL (src1 broadcast when
// n1 < n), SCALE, SILU, SWIGLU; and the copies: a strided 2-D copy (VIEW,
// row select, copy_in) and PERMUTE. No threadgroup memory, no barriers: a
// thread past the end stores nothing.
#include "metal_args.h"

using namespace metal;

kernel void mf_add(device const float *x0 [[buffer(0)]], device const float *x1 [[buffer(1)]],
                   device float *y [[buffer(2)]], constant mf_mtl_ew_args &a [[buffer(3)]],
                   uint3 tgpig [[threadgroup_position_in_grid]],
                   uint3 tpitg [[thread_position_in_threadgroup]],
                   uint3 ntg [[threads_per_threadgroup]]) {
    const int64_t i = int64_t(tgpig.x) * ntg.x + tpitg.x;
    if (i < a.n)
        y[i] = x0[i] + x1[i];
}

kernel void mf_mul(device const float *x0 [[buffer(0)]], device const float *x1 [[buffer(1)]],
                   device float *y [[buffer(2)]], constant mf_mtl_ew_args &a [[buffer(3)]],
                   uint3 tgpig [[threadgroup_position_in_grid]],
                   uint3 tpitg [[thread_position_in_threadgroup]],
                   uint3 ntg [[threads_per_threadgroup]]) {
    const int64_t i = int64_t(tgpig.x) * ntg.x + tpitg.x;
    if (i < a.n)
        y[i] = x0[i] * x1[i % a.n1];
}

kernel void mf_swiglu(device const float *x0 [[buffer(0)]], device const float *x1 [[buffer(1)]],
                      device float *y [[buffer(2)]], constant mf_mtl_ew_args &a [[buffer(3)]],
                      uint3 tgpig [[threadgroup_position_in_grid]],
                      uint3 tpitg [[thread_position_in_threadgroup]],
                      uint3 ntg [[threads_per_threadgroup]]) {
    const int64_t i = int64_t(tgpig.x) * ntg.x + tpitg.x;
    if (i < a.n) {
        const float g = x0[i];
        y[i] = g / (1.0f + exp(-g)) * x1[i];
    }
}

kernel void mf_scale(device const float *x [[buffer(0)]], device float *y [[buffer(1)]],
                     constant mf_mtl_ew_args &a [[buffer(2)]],
                     uint3 tgpig [[threadgroup_position_in_grid]],
                     uint3 tpitg [[thread_position_in_threadgroup]],
                     uint3 ntg [[threads_per_threadgroup]]) {
    const int64_t i = int64_t(tgpig.x) * ntg.x + tpitg.x;
    if (i < a.n)
        y[i] = x[i] * a.s;
}

kernel void mf_silu(device const float *x [[buffer(0)]], device float *y [[buffer(1)]],
                    constant mf_mtl_ew_args &a [[buffer(2)]],
                    uint3 tgpig [[threadgroup_position_in_grid]],
                    uint3 tpitg [[thread_position_in_threadgroup]],
                    uint3 ntg [[threads_per_threadgroup]]) {
    const int64_t i = int64_t(tgpig.x) * ntg.x + tpitg.x;
    if (i < a.n) {
        const float v = x[i];
        y[i] = v / (1.0f + exp(-v));
    }
}

// grid: (ceil(width / ntg.x), rows)
kernel void mf_copy2d(device const float *x [[buffer(0)]], device float *y [[buffer(1)]],
                      constant mf_mtl_copy_args &a [[buffer(2)]],
                      uint3 tgpig [[threadgroup_position_in_grid]],
                      uint3 tpitg [[thread_position_in_threadgroup]],
                      uint3 ntg [[threads_per_threadgroup]]) {
    const int64_t c = int64_t(tgpig.x) * ntg.x + tpitg.x, r = tgpig.y;
    if (c < a.width && r < a.rows)
        y[r * a.dst_stride + c] = x[a.src_off + r * a.src_stride + c];
}

kernel void mf_permute(device const float *x [[buffer(0)]], device float *y [[buffer(1)]],
                       constant mf_mtl_permute_args &a [[buffer(2)]],
                       uint3 tgpig [[threadgroup_position_in_grid]],
                       uint3 tpitg [[thread_position_in_threadgroup]],
                       uint3 ntg [[threads_per_threadgroup]]) {
    const int64_t n = a.ne[0] * a.ne[1] * a.ne[2] * a.ne[3];
    const int64_t o = int64_t(tgpig.x) * ntg.x + tpitg.x;
    if (o < n) {
        const int64_t i0 = o % a.ne[0], i1 = (o / a.ne[0]) % a.ne[1];
        const int64_t i2 = (o / (a.ne[0] * a.ne[1])) % a.ne[2], i3 = o / (a.ne[0] * a.ne[1] * a.ne[2]);
        y[o] = x[i0 * a.st[0] + i1 * a.st[1] + i2 * a.st[2] + i3 * a.st[3]];
    }
}
