// Kernels that exercise the MSL emulator itself (tests/metal/test_metal_emu.c).
// Plain MSL: the same text would compile with Apple's metal tool.
#include <metal_stdlib>
using namespace metal;

struct mf_t_args {
    int32_t n;
    float scale;
};

// Row sums: each threadgroup reduces one row with simd_sum and a
// threadgroup-memory pass over the simdgroup partials.
kernel void mf_t_rowsum(device const float *x [[buffer(0)]],
                        device float *y [[buffer(1)]],
                        constant mf_t_args &a [[buffer(2)]],
                        threadgroup float *shmem [[threadgroup(0)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint3 tpitg [[thread_position_in_threadgroup]],
                        uint3 ntg [[threads_per_threadgroup]],
                        uint tiisg [[thread_index_in_simdgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    device const float *row = x + tgpig.x * a.n;
    float s = 0.0f;
    for (int i = tpitg.x; i < a.n; i += ntg.x) {
        s += row[i];
    }
    s = simd_sum(s);
    if (tiisg == 0) {
        shmem[sgitg] = s;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sgitg == 0) {
        uint nsg = (ntg.x + 31) / 32;
        float t = tiisg < nsg ? shmem[tiisg] : 0.0f;
        t = simd_sum(t);
        if (tiisg == 0) {
            y[tgpig.x] = t * a.scale;
        }
    }
}

// The GPU-safety rule broken: threads past n return before the barrier.
kernel void mf_t_early_return(device float *y [[buffer(0)]],
                              constant mf_t_args &a [[buffer(1)]],
                              threadgroup float *shmem [[threadgroup(0)]],
                              uint tid [[thread_index_in_threadgroup]]) {
    if ((int)tid >= a.n) {
        return;
    }
    shmem[tid] = (float)tid;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[tid] = shmem[a.n - 1 - tid];
}

// Reverses through threadgroup memory; `barrier` chooses whether the
// barrier between the writes and the reads is there.
kernel void mf_t_reverse(device const float *x [[buffer(0)]],
                         device float *y [[buffer(1)]],
                         constant mf_t_args &a [[buffer(2)]],
                         threadgroup float *shmem [[threadgroup(0)]],
                         uint tid [[thread_index_in_threadgroup]],
                         uint ntg [[threads_per_threadgroup]]) {
    shmem[tid] = x[tid];
    if (a.n != 0) {
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    y[tid] = shmem[ntg - 1 - tid];
}

// Two different barriers: the first simdgroup waits at one, the rest at another.
kernel void mf_t_divergent(device float *y [[buffer(0)]],
                           uint tid [[thread_index_in_threadgroup]]) {
    if (tid < 32) {
        threadgroup_barrier(mem_flags::mem_threadgroup);
    } else {
        threadgroup_barrier(mem_flags::mem_device);
    }
    y[tid] = 1.0f;
}

// Writes one element per thread at y[tid + a.n]: past the end when a.n > 0.
kernel void mf_t_overrun(device float *y [[buffer(0)]],
                         constant mf_t_args &a [[buffer(1)]],
                         uint tid [[thread_position_in_grid]]) {
    y[tid + a.n] = 2.0f;
}

// Reads through a float4 view: needs x 16-byte aligned.
kernel void mf_t_vec4(device const float4 *x [[buffer(0)]],
                      device float *y [[buffer(1)]],
                      uint tid [[thread_position_in_grid]]) {
    float4 v = x[tid];
    float4 w = float4(v.wz, v.y, 1.0f);
    y[tid] = dot(v, w) + v.x * 0.5f;
}

// simd collectives: every result into its own row of y (32 lanes x 9).
kernel void mf_t_simd(device const float *x [[buffer(0)]],
                      device float *y [[buffer(1)]],
                      uint lane [[thread_index_in_simdgroup]]) {
    float v = x[lane];
    y[0 * 32 + lane] = simd_sum(v);
    y[1 * 32 + lane] = simd_max(v);
    y[2 * 32 + lane] = simd_min(v);
    y[3 * 32 + lane] = simd_shuffle(v, (ushort)(31 - lane));
    y[4 * 32 + lane] = simd_shuffle_down(v, (ushort)3);
    y[5 * 32 + lane] = simd_shuffle_xor(v, (ushort)5);
    y[6 * 32 + lane] = simd_broadcast(v, (ushort)7);
    y[7 * 32 + lane] = simd_prefix_exclusive_sum(v);
    y[8 * 32 + lane] = simd_shuffle_up(v, (ushort)2);
}

// Half lanes return early; the rest still reduce (a collective waits only
// for live lanes).
kernel void mf_t_simd_partial(device const float *x [[buffer(0)]],
                              device float *y [[buffer(1)]],
                              uint lane [[thread_index_in_simdgroup]]) {
    if (lane >= 16) {
        return;
    }
    y[lane] = simd_sum(x[lane]);
}

// C = A * B for an 8x8 block per simdgroup (row-major, lda = K).
kernel void mf_t_mma(device const float *a [[buffer(0)]],
                     device const half *b [[buffer(1)]],
                     device float *c [[buffer(2)]],
                     constant mf_t_args &args [[buffer(3)]],
                     uint sgitg [[simdgroup_index_in_threadgroup]]) {
    simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    simdgroup_float8x8 ma;
    simdgroup_half8x8 mb;
    int k = args.n;
    for (int k0 = 0; k0 < k; k0 += 8) {
        simdgroup_load(ma, a + sgitg * 8 * k, k, ulong2(k0, 0));
        simdgroup_load(mb, b, 8, ulong2(0, k0));
        simdgroup_multiply_accumulate(acc, ma, mb, acc);
    }
    simdgroup_store(acc, c + sgitg * 64, 8);
}

// half conversions (round to nearest even) and half4 vectors.
kernel void mf_t_half(device const float *x [[buffer(0)]],
                      device half *h [[buffer(1)]],
                      device float *back [[buffer(2)]],
                      uint tid [[thread_position_in_grid]]) {
    half v = (half)x[tid];
    h[tid] = v;
    back[tid] = (float)v;
    if (tid % 4 == 0) {
        device half4 *h4 = (device half4 *)h;
        half4 q = h4[tid / 4];
        float4 f = float4(q);
        (void)f;
    }
}

// atomics across the whole grid
kernel void mf_t_atomic(device atomic_uint *counter [[buffer(0)]],
                        device atomic_float *total [[buffer(1)]],
                        uint tid [[thread_position_in_grid]]) {
    atomic_fetch_add_explicit(counter, 1u, memory_order_relaxed);
    atomic_fetch_add_explicit(total, (float)(tid % 4), memory_order_relaxed);
}

// f32 GEMV, one simdgroup per row, 2 rows per threadgroup (speed probe).
kernel void mf_t_gemv(device const float *w [[buffer(0)]],
                      device const float *x [[buffer(1)]],
                      device float *y [[buffer(2)]],
                      constant mf_t_args &a [[buffer(3)]],
                      uint3 tgpig [[threadgroup_position_in_grid]],
                      uint tiisg [[thread_index_in_simdgroup]],
                      uint sgitg [[simdgroup_index_in_threadgroup]]) {
    uint row = tgpig.x * 2 + sgitg;
    device const float4 *w4 = (device const float4 *)(w + row * a.n);
    device const float4 *x4 = (device const float4 *)x;
    float s = 0.0f;
    for (int i = tiisg; i < a.n / 4; i += 32) {
        s += dot(w4[i], x4[i]);
    }
    s = simd_sum(s);
    if (tiisg == 0) {
        y[row] = s;
    }
}

// Divergent collectives: each branch reduces over its own active lanes.
kernel void mf_t_simd_divergent(device const float *x [[buffer(0)]],
                                device float *y [[buffer(1)]],
                                uint lane [[thread_index_in_simdgroup]]) {
    float v = x[lane];
    if (lane < 12) {
        y[lane] = simd_sum(v);
    } else {
        y[lane] = simd_max(v);
    }
}

// Writes threadgroup memory one float past what the host set.
kernel void mf_t_tg_overrun(threadgroup float *shmem [[threadgroup(0)]],
                            constant mf_t_args &a [[buffer(0)]],
                            uint tid [[thread_index_in_threadgroup]]) {
    shmem[tid + a.n] = 1.0f;
}
