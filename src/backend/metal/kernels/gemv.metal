// gemv.metal - the decode matmul tier: y[t, o] = W[o, :] . x[t, :] (+ bias)
// on f32 activations for a few tokens. One simdgroup per output row, four
// rows per threadgroup; lane l walks the row's 32-element chunks l, l + 32,
// ..., decodes each once and dots it with up to 8 tokens, then simd_sum.
// A simdgroup past the last row computes row 0 and stores nothing, so every
// lane reaches every simd_sum.
#include "dequant.h"

template <typename D>
static void gemv_body(device const uchar *w, device const float *x, device float *y,
                      device const float *bias, constant mf_mtl_mm_args &a, uint3 tgpig,
                      uint tiisg, uint sgitg) {
    const int r = int(tgpig.x) * 4 + int(sgitg);
    const bool live = r < a.n_out;
    device const uchar *row = w + int64_t(live ? r : 0) * a.row_bytes;
    const int nch = a.n_in / 32;
    for (int t0 = 0; t0 < a.nt; t0 += 8) {
        const int tn = min(8, a.nt - t0);
        float acc[8];
        for (int t = 0; t < 8; t++)
            acc[t] = 0.0f;
        for (int c = int(tiisg); c < nch; c += 32) {
            float v[32];
            D::chunk(row, c, v);
            for (int t = 0; t < tn; t++) {
                device const float *xt = x + int64_t(t0 + t) * a.n_in + 32 * c;
                float s = 0.0f;
                for (int j = 0; j < 32; j++)
                    s += v[j] * xt[j];
                acc[t] += s;
            }
        }
        for (int t = 0; t < 8; t++) {
            const float s = simd_sum(acc[t]);
            if (live && tiisg == 0 && t < tn)
                y[int64_t(t0 + t) * a.n_out + r] = s + (a.has_bias ? bias[r] : 0.0f);
        }
    }
}

kernel void mf_gemv_f32(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint tiisg [[thread_index_in_simdgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_body<dq_f32>(w, x, y, bias, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_f16(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint tiisg [[thread_index_in_simdgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_body<dq_f16>(w, x, y, bias, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_bf16(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint tiisg [[thread_index_in_simdgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_body<dq_bf16>(w, x, y, bias, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_q4_0(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint tiisg [[thread_index_in_simdgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_body<dq_q4_0>(w, x, y, bias, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_q4_1(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint tiisg [[thread_index_in_simdgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_body<dq_q4_1>(w, x, y, bias, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_q5_0(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint tiisg [[thread_index_in_simdgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_body<dq_q5_0>(w, x, y, bias, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_q5_1(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint tiisg [[thread_index_in_simdgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_body<dq_q5_1>(w, x, y, bias, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_q8_0(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint tiisg [[thread_index_in_simdgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_body<dq_q8_0>(w, x, y, bias, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_q2_K(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint tiisg [[thread_index_in_simdgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_body<dq_q2_K>(w, x, y, bias, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_q3_K(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint tiisg [[thread_index_in_simdgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_body<dq_q3_K>(w, x, y, bias, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_q4_K(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint tiisg [[thread_index_in_simdgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_body<dq_q4_K>(w, x, y, bias, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_q5_K(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint tiisg [[thread_index_in_simdgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_body<dq_q5_K>(w, x, y, bias, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_q6_K(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint tiisg [[thread_index_in_simdgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_body<dq_q6_K>(w, x, y, bias, a, tgpig, tiisg, sgitg);
}

