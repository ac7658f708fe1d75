// attn.metal - causal GQA attention over the KV cache, split along the KV
// positions with an online softmax (decode and prefill alike).
//
// Pass 1, one simdgroup per (chunk, head, token): lane l holds dims l, l + 32,
// ... (< head_dim <= 256) of the scaled query; for each position p of its
// chunk (clipped to the token's causal range [0, n_past + t]) the score is a
// simd_sum, the running max / sum / accumulators are rescaled as in flash
// attention, and the chunk's (max, sum, acc[head_dim]) go to `part`.
// Pass 2, one simdgroup per (head, token): the chunks' partials combined with
// weights exp(max_c - max). A chunk past the causal range has sum 0 and
// weight 0. No threadgroup memory, no barriers; loop bounds are uniform per
// simdgroup, so every lane reaches every simd_sum.
#include "metal_args.h"

using namespace metal;

struct kv_f32 {
    static float get(device const uchar *c, int64_t rb, int p, int e) {
        return ((device const float *)(c + int64_t(p) * rb))[e];
    }
};
struct kv_f16 {
    static float get(device const uchar *c, int64_t rb, int p, int e) {
        return float(((device const half *)(c + int64_t(p) * rb))[e]);
    }
};
struct kv_q8_0 {
    static float get(device const uchar *c, int64_t rb, int p, int e) {
        device const uchar *blk = c + int64_t(p) * rb + 34 * (e / 32);
        return float(*(device const half *)blk) * float(((device const char *)(blk + 2))[e % 32]);
    }
};

template <typename KV>
static void attn_part_body(device const float *q, device const uchar *kc, device const uchar *vc,
                           device float *part, constant mf_mtl_attn_args &a, uint3 tgpig,
                           uint tiisg) {
    const int ch = int(tgpig.x), h = int(tgpig.y), t = int(tgpig.z);
    const int hd = a.head_dim;
    const int kvh = h / (a.n_head / a.n_head_kv);
    const int n_kv = a.n_past + t + 1;
    const int p0 = ch * a.chunk, p1 = min(p0 + a.chunk, n_kv);
    float qv[8], acc[8];
    for (int j = 0; j < 8; j++) {
        const int d = int(tiisg) + 32 * j;
        qv[j] = d < hd ? q[(int64_t(t) * a.n_head + h) * hd + d] * a.scale : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int p = p0; p < p1; p++) {
        float s = 0.0f;
        for (int j = 0; j < 8; j++) {
            const int d = int(tiisg) + 32 * j;
            if (d < hd)
                s += qv[j] * KV::get(kc, a.row_bytes, p, kvh * hd + d);
        }
        s = simd_sum(s);
        const float mn = max(m, s);
        const float corr = exp(m - mn), e = exp(s - mn);
        l = l * corr + e;
        for (int j = 0; j < 8; j++) {
            const int d = int(tiisg) + 32 * j;
            const float v = d < hd ? KV::get(vc, a.row_bytes, p, kvh * hd + d) : 0.0f;
            acc[j] = acc[j] * corr + e * v;
        }
        m = mn;
    }
    device float *o = part + ((int64_t(t) * a.n_head + h) * a.n_chunks + ch) * (hd + 2);
    if (tiisg == 0) {
        o[0] = m;
        o[1] = l;
    }
    for (int j = 0; j < 8; j++) {
        const int d = int(tiisg) + 32 * j;
        if (d < hd)
            o[2 + d] = acc[j];
    }
}

kernel void mf_attn_part_f32(device const float *q [[buffer(0)]], device const uchar *kc [[buffer(1)]],
                             device const uchar *vc [[buffer(2)]], device float *part [[buffer(3)]],
                             constant mf_mtl_attn_args &a [[buffer(4)]],
                             uint3 tgpig [[threadgroup_position_in_grid]],
                             uint tiisg [[thread_index_in_simdgroup]]) {
    attn_part_body<kv_f32>(q, kc, vc, part, a, tgpig, tiisg);
}

kernel void mf_attn_part_f16(device const float *q [[buffer(0)]], device const uchar *kc [[buffer(1)]],
                             device const uchar *vc [[buffer(2)]], device float *part [[buffer(3)]],
                             constant mf_mtl_attn_args &a [[buffer(4)]],
                             uint3 tgpig [[threadgroup_position_in_grid]],
                             uint tiisg [[thread_index_in_simdgroup]]) {
    attn_part_body<kv_f16>(q, kc, vc, part, a, tgpig, tiisg);
}

kernel void mf_attn_part_q8_0(device const float *q [[buffer(0)]], device const uchar *kc [[buffer(1)]],
                              device const uchar *vc [[buffer(2)]], device float *part [[buffer(3)]],
                              constant mf_mtl_attn_args &a [[buffer(4)]],
                              uint3 tgpig [[threadgroup_position_in_grid]],
                              uint tiisg [[thread_index_in_simdgroup]]) {
    attn_part_body<kv_q8_0>(q, kc, vc, part, a, tgpig, tiisg);
}

// grid: (n_head, nt), 32 threads
kernel void mf_attn_combine(device const float *part [[buffer(0)]], device float *y [[buffer(1)]],
                            constant mf_mtl_attn_args &a [[buffer(2)]],
                            uint3 tgpig [[threadgroup_position_in_grid]],
                            uint tiisg [[thread_index_in_simdgroup]]) {
    const int h = int(tgpig.x), t = int(tgpig.y), hd = a.head_dim;
    device const float *pb = part + (int64_t(t) * a.n_head + h) * a.n_chunks * (hd + 2);
    float mx = -INFINITY;
    for (int c = 0; c < a.n_chunks; c++)
        if (pb[c * (hd + 2) + 1] > 0.0f)
            mx = max(mx, pb[c * (hd + 2)]);
    float den = 0.0f, num[8];
    for (int j = 0; j < 8; j++)
        num[j] = 0.0f;
    for (int c = 0; c < a.n_chunks; c++) {
        device const float *o = pb + c * (hd + 2);
        if (o[1] > 0.0f) {
            const float wgt = exp(o[0] - mx);
            den += wgt * o[1];
            for (int j = 0; j < 8; j++) {
                const int d = int(tiisg) + 32 * j;
                if (d < hd)
                    num[j] += wgt * o[2 + d];
            }
        }
    }
    for (int j = 0; j < 8; j++) {
        const int d = int(tiisg) + 32 * j;
        if (d < hd)
            y[(int64_t(t) * a.n_head + h) * hd + d] = num[j] / den;
    }
}
