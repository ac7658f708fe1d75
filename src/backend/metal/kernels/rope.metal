// rope.metal - rotary embedding in place-safe form: one thread per (token,
// head, pair) reads both elements of its pair before writing them. Pair i
// turns by pos[t] * freq_scale * theta^(-2i / n_rot); NORMAL pairs (2i,
// 2i + 1), NEOX pairs (i, i + n_rot / 2). Dims past n_rot are untouched
// (the host copies the source first when the output is another buffer).
#include "metal_args.h"

using namespace metal;

// grid: (ceil(n_head * n_rot / 2 / ntg.x), nt)
kernel void mf_rope(device const float *x [[buffer(0)]], device const int *pos [[buffer(1)]],
                    device float *y [[buffer(2)]], constant mf_mtl_rope_args &a [[buffer(3)]],
                    uint3 tgpig [[threadgroup_position_in_grid]],
                    uint3 tpitg [[thread_position_in_threadgroup]],
                    uint3 ntg [[threads_per_threadgroup]]) {
    const int half_rot = a.n_rot / 2;
    const int k = int(tgpig.x * ntg.x + tpitg.x), t = int(tgpig.y);
    if (k < a.n_head * half_rot && t < a.nt) {
        const int h = k / half_rot, i = k % half_rot;
        const int64_t base = (int64_t(t) * a.n_head + h) * a.head_dim;
        const int i0 = a.neox ? i : 2 * i, i1 = a.neox ? i + half_rot : 2 * i + 1;
        const float ang = float(pos[t]) * a.freq_scale * exp(float(i) * a.log_theta_step);
        const float co = cos(ang), si = sin(ang);
        const float v0 = x[base + i0], v1 = x[base + i1];
        y[base + i0] = v0 * co - v1 * si;
        y[base + i1] = v0 * si + v1 * co;
    }
}
