// paged.metal - ATTN_PAGED: many sequences in one forward over a pool of
// block-paged KV rows (f32, f16 or q8_0, the layout kv.metal writes).
//
// The forward's batch is one int32 buffer (metal_backend.c builds it):
//   [0, nt)            each token's sequence
//   [nt, 2 nt)         each token's position
//   [2 nt, 2 nt + S)   per sequence: where its block ids start (S = n_seqs)
//   [2 nt + S, ...)    the block ids covering each batch sequence's positions
// Position p of sequence s lives in pool row blocks[off[s] + p / bs] * bs +
// p % bs.
//
// Store: each token's K and V rows into its slot, one dispatch for both.
// Attention, one simdgroup per (head, token): lane l holds dims l, l + 32,
// ... (< head_dim <= 256) of the scaled query and walks positions [0, pos]
// of its own sequence with an online softmax (running max, sum and
// accumulators rescaled at each new max), f32 throughout. The query row is
// read before the output row is written, and no other simdgroup reads it,
// so the output may alias q. Loop bounds are uniform per simdgroup.
#include "metal_args.h"

using namespace metal;

static int64_t paged_row(device const int *bt, constant mf_mtl_paged_args &a, int s, int p) {
    const int off = bt[2 * a.nt + s];
    return int64_t(bt[2 * a.nt + a.n_seqs + off + p / a.block_size]) * a.block_size + p % a.block_size;
}

// grid: (ceil(kv_dim / ntg.x), nt)
kernel void mf_paged_store_f32(device const float *k [[buffer(0)]], device const float *v [[buffer(1)]],
                               device uchar *kc [[buffer(2)]], device uchar *vc [[buffer(3)]],
                               device const int *bt [[buffer(4)]],
                               constant mf_mtl_paged_args &a [[buffer(5)]],
                               uint3 tgpig [[threadgroup_position_in_grid]],
                               uint3 tpitg [[thread_position_in_threadgroup]],
                               uint3 ntg [[threads_per_threadgroup]]) {
    const int i = int(tgpig.x * ntg.x + tpitg.x), t = int(tgpig.y);
    if (i < a.kv_dim && t < a.nt) {
        const int64_t r = paged_row(bt, a, bt[t], bt[a.nt + t]);
        ((device float *)(kc + r * a.row_bytes))[i] = k[int64_t(t) * a.kv_dim + i];
        ((device float *)(vc + r * a.row_bytes))[i] = v[int64_t(t) * a.kv_dim + i];
    }
}

kernel void mf_paged_store_f16(device const float *k [[buffer(0)]], device const float *v [[buffer(1)]],
                               device uchar *kc [[buffer(2)]], device uchar *vc [[buffer(3)]],
                               device const int *bt [[buffer(4)]],
                               constant mf_mtl_paged_args &a [[buffer(5)]],
                               uint3 tgpig [[threadgroup_position_in_grid]],
                               uint3 tpitg [[thread_position_in_threadgroup]],
                               uint3 ntg [[threads_per_threadgroup]]) {
    const int i = int(tgpig.x * ntg.x + tpitg.x), t = int(tgpig.y);
    if (i < a.kv_dim && t < a.nt) {
        const int64_t r = paged_row(bt, a, bt[t], bt[a.nt + t]);
        ((device half *)(kc + r * a.row_bytes))[i] = half(k[int64_t(t) * a.kv_dim + i]);
        ((device half *)(vc + r * a.row_bytes))[i] = half(v[int64_t(t) * a.kv_dim + i]);
    }
}

// grid: (kv_dim / 32, nt), 32 threads: lane j owns element j of block
// tgpig.x (d = absmax / 127, q = round(x / d), as the CPU's quantizer)
kernel void mf_paged_store_q8_0(device const float *k [[buffer(0)]], device const float *v [[buffer(1)]],
                                device uchar *kc [[buffer(2)]], device uchar *vc [[buffer(3)]],
                                device const int *bt [[buffer(4)]],
                                constant mf_mtl_paged_args &a [[buffer(5)]],
                                uint3 tgpig [[threadgroup_position_in_grid]],
                                uint tiisg [[thread_index_in_simdgroup]]) {
    const int b = int(tgpig.x), t = int(tgpig.y);
    const bool live = b < a.kv_dim / 32 && t < a.nt;
    const int64_t e = int64_t(t) * a.kv_dim + 32 * b + int(tiisg);
    const float xk = live ? k[e] : 0.0f, xv = live ? v[e] : 0.0f;
    const float dk = simd_max(fabs(xk)) / 127.0f, dv = simd_max(fabs(xv)) / 127.0f;
    const float ik = dk != 0.0f ? 1.0f / dk : 0.0f, iv = dv != 0.0f ? 1.0f / dv : 0.0f;
    if (live) {
        const int64_t r = paged_row(bt, a, bt[t], bt[a.nt + t]);
        device uchar *bk = kc + r * a.row_bytes + 34 * b;
        device uchar *bv = vc + r * a.row_bytes + 34 * b;
        if (tiisg == 0) {
            *(device half *)bk = half(dk);
            *(device half *)bv = half(dv);
        }
        ((device char *)(bk + 2))[tiisg] = char(int(round(xk * ik)));
        ((device char *)(bv + 2))[tiisg] = char(int(round(xv * iv)));
    }
}

struct pkv_f32 {
    static float get(device const uchar *c, int64_t rb, int64_t r, int e) {
        return ((device const float *)(c + r * rb))[e];
    }
};
struct pkv_f16 {
    static float get(device const uchar *c, int64_t rb, int64_t r, int e) {
        return float(((device const half *)(c + r * rb))[e]);
    }
};
struct pkv_q8_0 {
    static float get(device const uchar *c, int64_t rb, int64_t r, int e) {
        device const uchar *blk = c + r * rb + 34 * (e / 32);
        return float(*(device const half *)blk) * float(((device const char *)(blk + 2))[e % 32]);
    }
};

template <typename KV>
static void paged_attn_body(device const float *q, device const uchar *kc, device const uchar *vc,
                            device const int *bt, device float *y, constant mf_mtl_paged_args &a,
                            uint3 tgpig, uint tiisg) {
    const int h = int(tgpig.x), t = int(tgpig.y);
    const int hd = a.head_dim;
    const int kvh = h / (a.n_head / a.n_head_kv);
    const int s = bt[t], n_kv = bt[a.nt + t] + 1;
    float qv[8], acc[8];
    for (int j = 0; j < 8; j++) {
        const int d = int(tiisg) + 32 * j;
        qv[j] = d < hd ? q[(int64_t(t) * a.n_head + h) * hd + d] * a.scale : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int p = 0; p < n_kv; p++) {
        const int64_t r = paged_row(bt, a, s, p);
        float sc = 0.0f;
        for (int j = 0; j < 8; j++) {
            const int d = int(tiisg) + 32 * j;
            if (d < hd)
                sc += qv[j] * KV::get(kc, a.row_bytes, r, kvh * hd + d);
        }
        sc = simd_sum(sc);
        const float mn = max(m, sc);
        const float corr = exp(m - mn), e = exp(sc - mn);
        l = l * corr + e;
        for (int j = 0; j < 8; j++) {
            const int d = int(tiisg) + 32 * j;
            const float vv = d < hd ? KV::get(vc, a.row_bytes, r, kvh * hd + d) : 0.0f;
            acc[j] = acc[j] * corr + e * vv;
        }
        m = mn;
    }
    for (int j = 0; j < 8; j++) {
        const int d = int(tiisg) + 32 * j;
        if (d < hd)
            y[(int64_t(t) * a.n_head + h) * hd + d] = acc[j] / l;
    }
}

// grid: (n_head, nt), 32 threads
kernel void mf_paged_attn_f32(device const float *q [[buffer(0)]], device const uchar *kc [[buffer(1)]],
                              device const uchar *vc [[buffer(2)]], device const int *bt [[buffer(3)]],
                              device float *y [[buffer(4)]], constant mf_mtl_paged_args &a [[buffer(5)]],
                              uint3 tgpig [[threadgroup_position_in_grid]],
                              uint tiisg [[thread_index_in_simdgroup]]) {
    paged_attn_body<pkv_f32>(q, kc, vc, bt, y, a, tgpig, tiisg);
}

kernel void mf_paged_attn_f16(device const float *q [[buffer(0)]], device const uchar *kc [[buffer(1)]],
                              device const uchar *vc [[buffer(2)]], device const int *bt [[buffer(3)]],
                              device float *y [[buffer(4)]], constant mf_mtl_paged_args &a [[buffer(5)]],
                              uint3 tgpig [[threadgroup_position_in_grid]],
                              uint tiisg [[thread_index_in_simdgroup]]) {
    paged_attn_body<pkv_f16>(q, kc, vc, bt, y, a, tgpig, tiisg);
}

kernel void mf_paged_attn_q8_0(device const float *q [[buffer(0)]], device const uchar *kc [[buffer(1)]],
                               device const uchar *vc [[buffer(2)]], device const int *bt [[buffer(3)]],
                               device float *y [[buffer(4)]], constant mf_mtl_paged_args &a [[buffer(5)]],
                               uint3 tgpig [[threadgroup_position_in_grid]],
                               uint tiisg [[thread_index_in_simdgroup]]) {
    paged_attn_body<pkv_q8_0>(q, kc, vc, bt, y, a, tgpig, tiisg);
}
