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


// The decode fusions' GEMVs: one dispatch for several weights of one type
// and one K (seed §2.5's fused decode ops, without concatenated weights).
// gemv3 (FUSED_QKV): rows [0, n0) from w0, [n0, n0 + n1) from w1, the rest
// from w2, into one packed row per token of n0 + n1 + n2 (q | k | v), each
// with its bias when has_bias bit j is set. gemv_swiglu (FUSED_FFN): the
// simdgroup of row r dots gate row r and up row r and stores
// silu(gate) * up. The same chunk walk and uniform simd_sum as gemv_body.
template <typename D>
static void gemv3_body(device const uchar *w0, device const uchar *w1, device const uchar *w2,
                       device const float *x, device float *y, device const float *b0,
                       device const float *b1, device const float *b2, constant mf_mtl_mm3_args &a,
                       uint3 tgpig, uint tiisg, uint sgitg) {
    const int ntot = a.n0 + a.n1 + a.n2;
    const int r = int(tgpig.x) * 4 + int(sgitg);
    const bool live = r < ntot;
    const int rr = live ? r : 0;
    const int j = rr < a.n0 ? 0 : rr < a.n0 + a.n1 ? 1 : 2;
    const int lr = j == 0 ? rr : j == 1 ? rr - a.n0 : rr - a.n0 - a.n1;
    device const uchar *row = (j == 0 ? w0 : j == 1 ? w1 : w2) + int64_t(lr) * a.row_bytes;
    device const float *bias = j == 0 ? b0 : j == 1 ? b1 : b2;
    const bool hb = (a.has_bias >> j) & 1;
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
                for (int k = 0; k < 32; k++)
                    s += v[k] * xt[k];
                acc[t] += s;
            }
        }
        for (int t = 0; t < 8; t++) {
            const float s = simd_sum(acc[t]);
            if (live && tiisg == 0 && t < tn)
                y[int64_t(t0 + t) * ntot + r] = s + (hb ? bias[lr] : 0.0f);
        }
    }
}

template <typename D>
static void gemv_swiglu_body(device const uchar *wg, device const uchar *wu, device const float *x,
                             device float *y, device const float *bg, device const float *bu,
                             constant mf_mtl_mm3_args &a, uint3 tgpig, uint tiisg, uint sgitg) {
    const int r = int(tgpig.x) * 4 + int(sgitg);
    const bool live = r < a.n0;
    device const uchar *rg = wg + int64_t(live ? r : 0) * a.row_bytes;
    device const uchar *ru = wu + int64_t(live ? r : 0) * a.row_bytes;
    const int nch = a.n_in / 32;
    for (int t0 = 0; t0 < a.nt; t0 += 4) {
        const int tn = min(4, a.nt - t0);
        float ag[4], au[4];
        for (int t = 0; t < 4; t++) {
            ag[t] = 0.0f;
            au[t] = 0.0f;
        }
        for (int c = int(tiisg); c < nch; c += 32) {
            float vg[32], vu[32];
            D::chunk(rg, c, vg);
            D::chunk(ru, c, vu);
            for (int t = 0; t < tn; t++) {
                device const float *xt = x + int64_t(t0 + t) * a.n_in + 32 * c;
                float sg = 0.0f, su = 0.0f;
                for (int k = 0; k < 32; k++) {
                    sg += vg[k] * xt[k];
                    su += vu[k] * xt[k];
                }
                ag[t] += sg;
                au[t] += su;
            }
        }
        for (int t = 0; t < 4; t++) {
            const float g = simd_sum(ag[t]) + ((a.has_bias & 1) && live ? bg[r] : 0.0f);
            const float u = simd_sum(au[t]) + ((a.has_bias & 2) && live ? bu[r] : 0.0f);
            if (live && tiisg == 0 && t < tn)
                y[int64_t(t0 + t) * a.n0 + r] = g / (1.0f + exp(-g)) * u;
        }
    }
}

kernel void mf_gemv3_f32(device const uchar *w0 [[buffer(0)]], device const uchar *w1 [[buffer(1)]],
                         device const uchar *w2 [[buffer(2)]], device const float *x [[buffer(3)]],
                         device float *y [[buffer(4)]], device const float *b0 [[buffer(5)]],
                         device const float *b1 [[buffer(6)]], device const float *b2 [[buffer(7)]],
                         constant mf_mtl_mm3_args &a [[buffer(8)]],
                         uint3 tgpig [[threadgroup_position_in_grid]],
                         uint tiisg [[thread_index_in_simdgroup]],
                         uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv3_body<dq_f32>(w0, w1, w2, x, y, b0, b1, b2, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_swiglu_f32(device const uchar *wg [[buffer(0)]], device const uchar *wu [[buffer(1)]],
                               device const float *x [[buffer(2)]], device float *y [[buffer(3)]],
                               device const float *bg [[buffer(4)]], device const float *bu [[buffer(5)]],
                               constant mf_mtl_mm3_args &a [[buffer(6)]],
                               uint3 tgpig [[threadgroup_position_in_grid]],
                               uint tiisg [[thread_index_in_simdgroup]],
                               uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_swiglu_body<dq_f32>(wg, wu, x, y, bg, bu, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv3_f16(device const uchar *w0 [[buffer(0)]], device const uchar *w1 [[buffer(1)]],
                         device const uchar *w2 [[buffer(2)]], device const float *x [[buffer(3)]],
                         device float *y [[buffer(4)]], device const float *b0 [[buffer(5)]],
                         device const float *b1 [[buffer(6)]], device const float *b2 [[buffer(7)]],
                         constant mf_mtl_mm3_args &a [[buffer(8)]],
                         uint3 tgpig [[threadgroup_position_in_grid]],
                         uint tiisg [[thread_index_in_simdgroup]],
                         uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv3_body<dq_f16>(w0, w1, w2, x, y, b0, b1, b2, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_swiglu_f16(device const uchar *wg [[buffer(0)]], device const uchar *wu [[buffer(1)]],
                               device const float *x [[buffer(2)]], device float *y [[buffer(3)]],
                               device const float *bg [[buffer(4)]], device const float *bu [[buffer(5)]],
                               constant mf_mtl_mm3_args &a [[buffer(6)]],
                               uint3 tgpig [[threadgroup_position_in_grid]],
                               uint tiisg [[thread_index_in_simdgroup]],
                               uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_swiglu_body<dq_f16>(wg, wu, x, y, bg, bu, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv3_bf16(device const uchar *w0 [[buffer(0)]], device const uchar *w1 [[buffer(1)]],
                         device const uchar *w2 [[buffer(2)]], device const float *x [[buffer(3)]],
                         device float *y [[buffer(4)]], device const float *b0 [[buffer(5)]],
                         device const float *b1 [[buffer(6)]], device const float *b2 [[buffer(7)]],
                         constant mf_mtl_mm3_args &a [[buffer(8)]],
                         uint3 tgpig [[threadgroup_position_in_grid]],
                         uint tiisg [[thread_index_in_simdgroup]],
                         uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv3_body<dq_bf16>(w0, w1, w2, x, y, b0, b1, b2, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_swiglu_bf16(device const uchar *wg [[buffer(0)]], device const uchar *wu [[buffer(1)]],
                               device const float *x [[buffer(2)]], device float *y [[buffer(3)]],
                               device const float *bg [[buffer(4)]], device const float *bu [[buffer(5)]],
                               constant mf_mtl_mm3_args &a [[buffer(6)]],
                               uint3 tgpig [[threadgroup_position_in_grid]],
                               uint tiisg [[thread_index_in_simdgroup]],
                               uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_swiglu_body<dq_bf16>(wg, wu, x, y, bg, bu, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv3_q4_0(device const uchar *w0 [[buffer(0)]], device const uchar *w1 [[buffer(1)]],
                         device const uchar *w2 [[buffer(2)]], device const float *x [[buffer(3)]],
                         device float *y [[buffer(4)]], device const float *b0 [[buffer(5)]],
                         device const float *b1 [[buffer(6)]], device const float *b2 [[buffer(7)]],
                         constant mf_mtl_mm3_args &a [[buffer(8)]],
                         uint3 tgpig [[threadgroup_position_in_grid]],
                         uint tiisg [[thread_index_in_simdgroup]],
                         uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv3_body<dq_q4_0>(w0, w1, w2, x, y, b0, b1, b2, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_swiglu_q4_0(device const uchar *wg [[buffer(0)]], device const uchar *wu [[buffer(1)]],
                               device const float *x [[buffer(2)]], device float *y [[buffer(3)]],
                               device const float *bg [[buffer(4)]], device const float *bu [[buffer(5)]],
                               constant mf_mtl_mm3_args &a [[buffer(6)]],
                               uint3 tgpig [[threadgroup_position_in_grid]],
                               uint tiisg [[thread_index_in_simdgroup]],
                               uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_swiglu_body<dq_q4_0>(wg, wu, x, y, bg, bu, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv3_q4_1(device const uchar *w0 [[buffer(0)]], device const uchar *w1 [[buffer(1)]],
                         device const uchar *w2 [[buffer(2)]], device const float *x [[buffer(3)]],
                         device float *y [[buffer(4)]], device const float *b0 [[buffer(5)]],
                         device const float *b1 [[buffer(6)]], device const float *b2 [[buffer(7)]],
                         constant mf_mtl_mm3_args &a [[buffer(8)]],
                         uint3 tgpig [[threadgroup_position_in_grid]],
                         uint tiisg [[thread_index_in_simdgroup]],
                         uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv3_body<dq_q4_1>(w0, w1, w2, x, y, b0, b1, b2, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_swiglu_q4_1(device const uchar *wg [[buffer(0)]], device const uchar *wu [[buffer(1)]],
                               device const float *x [[buffer(2)]], device float *y [[buffer(3)]],
                               device const float *bg [[buffer(4)]], device const float *bu [[buffer(5)]],
                               constant mf_mtl_mm3_args &a [[buffer(6)]],
                               uint3 tgpig [[threadgroup_position_in_grid]],
                               uint tiisg [[thread_index_in_simdgroup]],
                               uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_swiglu_body<dq_q4_1>(wg, wu, x, y, bg, bu, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv3_q5_0(device const uchar *w0 [[buffer(0)]], device const uchar *w1 [[buffer(1)]],
                         device const uchar *w2 [[buffer(2)]], device const float *x [[buffer(3)]],
                         device float *y [[buffer(4)]], device const float *b0 [[buffer(5)]],
                         device const float *b1 [[buffer(6)]], device const float *b2 [[buffer(7)]],
                         constant mf_mtl_mm3_args &a [[buffer(8)]],
                         uint3 tgpig [[threadgroup_position_in_grid]],
                         uint tiisg [[thread_index_in_simdgroup]],
                         uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv3_body<dq_q5_0>(w0, w1, w2, x, y, b0, b1, b2, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_swiglu_q5_0(device const uchar *wg [[buffer(0)]], device const uchar *wu [[buffer(1)]],
                               device const float *x [[buffer(2)]], device float *y [[buffer(3)]],
                               device const float *bg [[buffer(4)]], device const float *bu [[buffer(5)]],
                               constant mf_mtl_mm3_args &a [[buffer(6)]],
                               uint3 tgpig [[threadgroup_position_in_grid]],
                               uint tiisg [[thread_index_in_simdgroup]],
                               uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_swiglu_body<dq_q5_0>(wg, wu, x, y, bg, bu, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv3_q5_1(device const uchar *w0 [[buffer(0)]], device const uchar *w1 [[buffer(1)]],
                         device const uchar *w2 [[buffer(2)]], device const float *x [[buffer(3)]],
                         device float *y [[buffer(4)]], device const float *b0 [[buffer(5)]],
                         device const float *b1 [[buffer(6)]], device const float *b2 [[buffer(7)]],
                         constant mf_mtl_mm3_args &a [[buffer(8)]],
                         uint3 tgpig [[threadgroup_position_in_grid]],
                         uint tiisg [[thread_index_in_simdgroup]],
                         uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv3_body<dq_q5_1>(w0, w1, w2, x, y, b0, b1, b2, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_swiglu_q5_1(device const uchar *wg [[buffer(0)]], device const uchar *wu [[buffer(1)]],
                               device const float *x [[buffer(2)]], device float *y [[buffer(3)]],
                               device const float *bg [[buffer(4)]], device const float *bu [[buffer(5)]],
                               constant mf_mtl_mm3_args &a [[buffer(6)]],
                               uint3 tgpig [[threadgroup_position_in_grid]],
                               uint tiisg [[thread_index_in_simdgroup]],
                               uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_swiglu_body<dq_q5_1>(wg, wu, x, y, bg, bu, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv3_q8_0(device const uchar *w0 [[buffer(0)]], device const uchar *w1 [[buffer(1)]],
                         device const uchar *w2 [[buffer(2)]], device const float *x [[buffer(3)]],
                         device float *y [[buffer(4)]], device const float *b0 [[buffer(5)]],
                         device const float *b1 [[buffer(6)]], device const float *b2 [[buffer(7)]],
                         constant mf_mtl_mm3_args &a [[buffer(8)]],
                         uint3 tgpig [[threadgroup_position_in_grid]],
                         uint tiisg [[thread_index_in_simdgroup]],
                         uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv3_body<dq_q8_0>(w0, w1, w2, x, y, b0, b1, b2, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_swiglu_q8_0(device const uchar *wg [[buffer(0)]], device const uchar *wu [[buffer(1)]],
                               device const float *x [[buffer(2)]], device float *y [[buffer(3)]],
                               device const float *bg [[buffer(4)]], device const float *bu [[buffer(5)]],
                               constant mf_mtl_mm3_args &a [[buffer(6)]],
                               uint3 tgpig [[threadgroup_position_in_grid]],
                               uint tiisg [[thread_index_in_simdgroup]],
                               uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_swiglu_body<dq_q8_0>(wg, wu, x, y, bg, bu, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv3_q2_K(device const uchar *w0 [[buffer(0)]], device const uchar *w1 [[buffer(1)]],
                         device const uchar *w2 [[buffer(2)]], device const float *x [[buffer(3)]],
                         device float *y [[buffer(4)]], device const float *b0 [[buffer(5)]],
                         device const float *b1 [[buffer(6)]], device const float *b2 [[buffer(7)]],
                         constant mf_mtl_mm3_args &a [[buffer(8)]],
                         uint3 tgpig [[threadgroup_position_in_grid]],
                         uint tiisg [[thread_index_in_simdgroup]],
                         uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv3_body<dq_q2_K>(w0, w1, w2, x, y, b0, b1, b2, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_swiglu_q2_K(device const uchar *wg [[buffer(0)]], device const uchar *wu [[buffer(1)]],
                               device const float *x [[buffer(2)]], device float *y [[buffer(3)]],
                               device const float *bg [[buffer(4)]], device const float *bu [[buffer(5)]],
                               constant mf_mtl_mm3_args &a [[buffer(6)]],
                               uint3 tgpig [[threadgroup_position_in_grid]],
                               uint tiisg [[thread_index_in_simdgroup]],
                               uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_swiglu_body<dq_q2_K>(wg, wu, x, y, bg, bu, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv3_q3_K(device const uchar *w0 [[buffer(0)]], device const uchar *w1 [[buffer(1)]],
                         device const uchar *w2 [[buffer(2)]], device const float *x [[buffer(3)]],
                         device float *y [[buffer(4)]], device const float *b0 [[buffer(5)]],
                         device const float *b1 [[buffer(6)]], device const float *b2 [[buffer(7)]],
                         constant mf_mtl_mm3_args &a [[buffer(8)]],
                         uint3 tgpig [[threadgroup_position_in_grid]],
                         uint tiisg [[thread_index_in_simdgroup]],
                         uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv3_body<dq_q3_K>(w0, w1, w2, x, y, b0, b1, b2, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_swiglu_q3_K(device const uchar *wg [[buffer(0)]], device const uchar *wu [[buffer(1)]],
                               device const float *x [[buffer(2)]], device float *y [[buffer(3)]],
                               device const float *bg [[buffer(4)]], device const float *bu [[buffer(5)]],
                               constant mf_mtl_mm3_args &a [[buffer(6)]],
                               uint3 tgpig [[threadgroup_position_in_grid]],
                               uint tiisg [[thread_index_in_simdgroup]],
                               uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_swiglu_body<dq_q3_K>(wg, wu, x, y, bg, bu, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv3_q4_K(device const uchar *w0 [[buffer(0)]], device const uchar *w1 [[buffer(1)]],
                         device const uchar *w2 [[buffer(2)]], device const float *x [[buffer(3)]],
                         device float *y [[buffer(4)]], device const float *b0 [[buffer(5)]],
                         device const float *b1 [[buffer(6)]], device const float *b2 [[buffer(7)]],
                         constant mf_mtl_mm3_args &a [[buffer(8)]],
                         uint3 tgpig [[threadgroup_position_in_grid]],
                         uint tiisg [[thread_index_in_simdgroup]],
                         uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv3_body<dq_q4_K>(w0, w1, w2, x, y, b0, b1, b2, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_swiglu_q4_K(device const uchar *wg [[buffer(0)]], device const uchar *wu [[buffer(1)]],
                               device const float *x [[buffer(2)]], device float *y [[buffer(3)]],
                               device const float *bg [[buffer(4)]], device const float *bu [[buffer(5)]],
                               constant mf_mtl_mm3_args &a [[buffer(6)]],
                               uint3 tgpig [[threadgroup_position_in_grid]],
                               uint tiisg [[thread_index_in_simdgroup]],
                               uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_swiglu_body<dq_q4_K>(wg, wu, x, y, bg, bu, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv3_q5_K(device const uchar *w0 [[buffer(0)]], device const uchar *w1 [[buffer(1)]],
                         device const uchar *w2 [[buffer(2)]], device const float *x [[buffer(3)]],
                         device float *y [[buffer(4)]], device const float *b0 [[buffer(5)]],
                         device const float *b1 [[buffer(6)]], device const float *b2 [[buffer(7)]],
                         constant mf_mtl_mm3_args &a [[buffer(8)]],
                         uint3 tgpig [[threadgroup_position_in_grid]],
                         uint tiisg [[thread_index_in_simdgroup]],
                         uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv3_body<dq_q5_K>(w0, w1, w2, x, y, b0, b1, b2, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_swiglu_q5_K(device const uchar *wg [[buffer(0)]], device const uchar *wu [[buffer(1)]],
                               device const float *x [[buffer(2)]], device float *y [[buffer(3)]],
                               device const float *bg [[buffer(4)]], device const float *bu [[buffer(5)]],
                               constant mf_mtl_mm3_args &a [[buffer(6)]],
                               uint3 tgpig [[threadgroup_position_in_grid]],
                               uint tiisg [[thread_index_in_simdgroup]],
                               uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_swiglu_body<dq_q5_K>(wg, wu, x, y, bg, bu, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv3_q6_K(device const uchar *w0 [[buffer(0)]], device const uchar *w1 [[buffer(1)]],
                         device const uchar *w2 [[buffer(2)]], device const float *x [[buffer(3)]],
                         device float *y [[buffer(4)]], device const float *b0 [[buffer(5)]],
                         device const float *b1 [[buffer(6)]], device const float *b2 [[buffer(7)]],
                         constant mf_mtl_mm3_args &a [[buffer(8)]],
                         uint3 tgpig [[threadgroup_position_in_grid]],
                         uint tiisg [[thread_index_in_simdgroup]],
                         uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv3_body<dq_q6_K>(w0, w1, w2, x, y, b0, b1, b2, a, tgpig, tiisg, sgitg);
}

kernel void mf_gemv_swiglu_q6_K(device const uchar *wg [[buffer(0)]], device const uchar *wu [[buffer(1)]],
                               device const float *x [[buffer(2)]], device float *y [[buffer(3)]],
                               device const float *bg [[buffer(4)]], device const float *bu [[buffer(5)]],
                               constant mf_mtl_mm3_args &a [[buffer(6)]],
                               uint3 tgpig [[threadgroup_position_in_grid]],
                               uint tiisg [[thread_index_in_simdgroup]],
                               uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemv_swiglu_body<dq_q6_K>(wg, wu, x, y, bg, bu, a, tgpig, tiisg, sgitg);
}
