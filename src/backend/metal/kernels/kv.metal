// kv.metal - the KV cache in f32, f16 or q8_0 rows (the layout the CPU
// backend uses, so a region migrates between backends byte for byte):
// store writes nt rows at positions pos0.., load reads rows [0, nt) back as
// f32. q8_0 store: one simdgroup per 32-element block, d = absmax / 127,
// q = round(x / d) as the CPU's quantizer.
#include "metal_args.h"

using namespace metal;

// grid: (ceil(kv_dim / ntg.x), nt)
kernel void mf_kv_store_f32(device const float *x [[buffer(0)]], device uchar *cache [[buffer(1)]],
                            constant mf_mtl_kv_args &a [[buffer(2)]],
                            uint3 tgpig [[threadgroup_position_in_grid]],
                            uint3 tpitg [[thread_position_in_threadgroup]],
                            uint3 ntg [[threads_per_threadgroup]]) {
    const int i = int(tgpig.x * ntg.x + tpitg.x), t = int(tgpig.y);
    if (i < a.kv_dim && t < a.nt) {
        device float *row = (device float *)(cache + int64_t(a.pos0 + t) * a.row_bytes);
        row[i] = x[int64_t(t) * a.kv_dim + i];
    }
}

kernel void mf_kv_store_f16(device const float *x [[buffer(0)]], device uchar *cache [[buffer(1)]],
                            constant mf_mtl_kv_args &a [[buffer(2)]],
                            uint3 tgpig [[threadgroup_position_in_grid]],
                            uint3 tpitg [[thread_position_in_threadgroup]],
                            uint3 ntg [[threads_per_threadgroup]]) {
    const int i = int(tgpig.x * ntg.x + tpitg.x), t = int(tgpig.y);
    if (i < a.kv_dim && t < a.nt) {
        device half *row = (device half *)(cache + int64_t(a.pos0 + t) * a.row_bytes);
        row[i] = half(x[int64_t(t) * a.kv_dim + i]);
    }
}

// grid: (kv_dim / 32, nt), 32 threads: lane j owns element j of block tgpig.x
kernel void mf_kv_store_q8_0(device const float *x [[buffer(0)]], device uchar *cache [[buffer(1)]],
                             constant mf_mtl_kv_args &a [[buffer(2)]],
                             uint3 tgpig [[threadgroup_position_in_grid]],
                             uint tiisg [[thread_index_in_simdgroup]]) {
    const int b = int(tgpig.x), t = int(tgpig.y);
    const bool live = b < a.kv_dim / 32 && t < a.nt;
    const float v = live ? x[int64_t(t) * a.kv_dim + 32 * b + int(tiisg)] : 0.0f;
    const float amax = simd_max(fabs(v));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (live) {
        device uchar *blk = cache + int64_t(a.pos0 + t) * a.row_bytes + 34 * b;
        if (tiisg == 0)
            *(device half *)blk = half(d);
        ((device char *)(blk + 2))[tiisg] = char(int(round(v * id)));
    }
}

// grid: (ceil(kv_dim / ntg.x), rows)
kernel void mf_kv_load_f32(device const uchar *cache [[buffer(0)]], device float *y [[buffer(1)]],
                           constant mf_mtl_kv_args &a [[buffer(2)]],
                           uint3 tgpig [[threadgroup_position_in_grid]],
                           uint3 tpitg [[thread_position_in_threadgroup]],
                           uint3 ntg [[threads_per_threadgroup]]) {
    const int i = int(tgpig.x * ntg.x + tpitg.x), t = int(tgpig.y);
    if (i < a.kv_dim && t < a.nt)
        y[int64_t(t) * a.kv_dim + i] = ((device const float *)(cache + int64_t(t) * a.row_bytes))[i];
}

kernel void mf_kv_load_f16(device const uchar *cache [[buffer(0)]], device float *y [[buffer(1)]],
                           constant mf_mtl_kv_args &a [[buffer(2)]],
                           uint3 tgpig [[threadgroup_position_in_grid]],
                           uint3 tpitg [[thread_position_in_threadgroup]],
                           uint3 ntg [[threads_per_threadgroup]]) {
    const int i = int(tgpig.x * ntg.x + tpitg.x), t = int(tgpig.y);
    if (i < a.kv_dim && t < a.nt)
        y[int64_t(t) * a.kv_dim + i] = float(((device const half *)(cache + int64_t(t) * a.row_bytes))[i]);
}

kernel void mf_kv_load_q8_0(device const uchar *cache [[buffer(0)]], device float *y [[buffer(1)]],
                            constant mf_mtl_kv_args &a [[buffer(2)]],
                            uint3 tgpig [[threadgroup_position_in_grid]],
                            uint3 tpitg [[thread_position_in_threadgroup]],
                            uint3 ntg [[threads_per_threadgroup]]) {
    const int i = int(tgpig.x * ntg.x + tpitg.x), t = int(tgpig.y);
    if (i < a.kv_dim && t < a.nt) {
        device const uchar *blk = cache + int64_t(t) * a.row_bytes + 34 * (i / 32);
        const float d = float(*(device const half *)blk);
        y[int64_t(t) * a.kv_dim + i] = d * float(((device const char *)(blk + 2))[i % 32]);
    }
}
