// getrows.metal - GETROWS mode 0, the embedding gather: row ids[t] of a
// weight of any supported type into output row t as floats. One thread per
// 32-element chunk of a row (d % 32 == 0, checked by the host). An id outside
// [0, n_rows) reads row 0 and stores nothing: the host validated the ids it
// wrote, this only keeps a bad one from reading out of bounds.
#include "dequant.h"

template <typename D>
static void getrows_body(device const uchar *w, device const int *ids, device float *y,
                         constant mf_mtl_getrows_args &a, uint3 tgpig, uint3 tpitg, uint3 ntg) {
    const int c = int(tgpig.x * ntg.x + tpitg.x), t = int(tgpig.y);
    if (c < a.d / 32 && t < a.nt) {
        const int id = ids[t];
        if (id >= 0 && id < a.n_rows) {
            float v[32];
            D::chunk(w + int64_t(id) * a.row_bytes, c, v);
            device float *yr = y + int64_t(t) * a.d + 32 * c;
            for (int j = 0; j < 32; j++)
                yr[j] = v[j];
        }
    }
}

kernel void mf_getrows_f32(device const uchar *w [[buffer(0)]],
                           device const int *ids [[buffer(1)]], device float *y [[buffer(2)]],
                           constant mf_mtl_getrows_args &a [[buffer(3)]],
                           uint3 tgpig [[threadgroup_position_in_grid]],
                           uint3 tpitg [[thread_position_in_threadgroup]],
                           uint3 ntg [[threads_per_threadgroup]]) {
    getrows_body<dq_f32>(w, ids, y, a, tgpig, tpitg, ntg);
}

kernel void mf_getrows_f16(device const uchar *w [[buffer(0)]],
                           device const int *ids [[buffer(1)]], device float *y [[buffer(2)]],
                           constant mf_mtl_getrows_args &a [[buffer(3)]],
                           uint3 tgpig [[threadgroup_position_in_grid]],
                           uint3 tpitg [[thread_position_in_threadgroup]],
                           uint3 ntg [[threads_per_threadgroup]]) {
    getrows_body<dq_f16>(w, ids, y, a, tgpig, tpitg, ntg);
}

kernel void mf_getrows_bf16(device const uchar *w [[buffer(0)]],
                           device const int *ids [[buffer(1)]], device float *y [[buffer(2)]],
                           constant mf_mtl_getrows_args &a [[buffer(3)]],
                           uint3 tgpig [[threadgroup_position_in_grid]],
                           uint3 tpitg [[thread_position_in_threadgroup]],
                           uint3 ntg [[threads_per_threadgroup]]) {
    getrows_body<dq_bf16>(w, ids, y, a, tgpig, tpitg, ntg);
}

kernel void mf_getrows_q4_0(device const uchar *w [[buffer(0)]],
                           device const int *ids [[buffer(1)]], device float *y [[buffer(2)]],
                           constant mf_mtl_getrows_args &a [[buffer(3)]],
                           uint3 tgpig [[threadgroup_position_in_grid]],
                           uint3 tpitg [[thread_position_in_threadgroup]],
                           uint3 ntg [[threads_per_threadgroup]]) {
    getrows_body<dq_q4_0>(w, ids, y, a, tgpig, tpitg, ntg);
}

kernel void mf_getrows_q4_1(device const uchar *w [[buffer(0)]],
                           device const int *ids [[buffer(1)]], device float *y [[buffer(2)]],
                           constant mf_mtl_getrows_args &a [[buffer(3)]],
                           uint3 tgpig [[threadgroup_position_in_grid]],
                           uint3 tpitg [[thread_position_in_threadgroup]],
                           uint3 ntg [[threads_per_threadgroup]]) {
    getrows_body<dq_q4_1>(w, ids, y, a, tgpig, tpitg, ntg);
}

kernel void mf_getrows_q5_0(device const uchar *w [[buffer(0)]],
                           device const int *ids [[buffer(1)]], device float *y [[buffer(2)]],
                           constant mf_mtl_getrows_args &a [[buffer(3)]],
                           uint3 tgpig [[threadgroup_position_in_grid]],
                           uint3 tpitg [[thread_position_in_threadgroup]],
                           uint3 ntg [[threads_per_threadgroup]]) {
    getrows_body<dq_q5_0>(w, ids, y, a, tgpig, tpitg, ntg);
}

kernel void mf_getrows_q5_1(device const uchar *w [[buffer(0)]],
                           device const int *ids [[buffer(1)]], device float *y [[buffer(2)]],
                           constant mf_mtl_getrows_args &a [[buffer(3)]],
                           uint3 tgpig [[threadgroup_position_in_grid]],
                           uint3 tpitg [[thread_position_in_threadgroup]],
                           uint3 ntg [[threads_per_threadgroup]]) {
    getrows_body<dq_q5_1>(w, ids, y, a, tgpig, tpitg, ntg);
}

kernel void mf_getrows_q8_0(device const uchar *w [[buffer(0)]],
                           device const int *ids [[buffer(1)]], device float *y [[buffer(2)]],
                           constant mf_mtl_getrows_args &a [[buffer(3)]],
                           uint3 tgpig [[threadgroup_position_in_grid]],
                           uint3 tpitg [[thread_position_in_threadgroup]],
                           uint3 ntg [[threads_per_threadgroup]]) {
    getrows_body<dq_q8_0>(w, ids, y, a, tgpig, tpitg, ntg);
}

kernel void mf_getrows_q2_K(device const uchar *w [[buffer(0)]],
                           device const int *ids [[buffer(1)]], device float *y [[buffer(2)]],
                           constant mf_mtl_getrows_args &a [[buffer(3)]],
                           uint3 tgpig [[threadgroup_position_in_grid]],
                           uint3 tpitg [[thread_position_in_threadgroup]],
                           uint3 ntg [[threads_per_threadgroup]]) {
    getrows_body<dq_q2_K>(w, ids, y, a, tgpig, tpitg, ntg);
}

kernel void mf_getrows_q3_K(device const uchar *w [[buffer(0)]],
                           device const int *ids [[buffer(1)]], device float *y [[buffer(2)]],
                           constant mf_mtl_getrows_args &a [[buffer(3)]],
                           uint3 tgpig [[threadgroup_position_in_grid]],
                           uint3 tpitg [[thread_position_in_threadgroup]],
                           uint3 ntg [[threads_per_threadgroup]]) {
    getrows_body<dq_q3_K>(w, ids, y, a, tgpig, tpitg, ntg);
}

kernel void mf_getrows_q4_K(device const uchar *w [[buffer(0)]],
                           device const int *ids [[buffer(1)]], device float *y [[buffer(2)]],
                           constant mf_mtl_getrows_args &a [[buffer(3)]],
                           uint3 tgpig [[threadgroup_position_in_grid]],
                           uint3 tpitg [[thread_position_in_threadgroup]],
                           uint3 ntg [[threads_per_threadgroup]]) {
    getrows_body<dq_q4_K>(w, ids, y, a, tgpig, tpitg, ntg);
}

kernel void mf_getrows_q5_K(device const uchar *w [[buffer(0)]],
                           device const int *ids [[buffer(1)]], device float *y [[buffer(2)]],
                           constant mf_mtl_getrows_args &a [[buffer(3)]],
                           uint3 tgpig [[threadgroup_position_in_grid]],
                           uint3 tpitg [[thread_position_in_threadgroup]],
                           uint3 ntg [[threads_per_threadgroup]]) {
    getrows_body<dq_q5_K>(w, ids, y, a, tgpig, tpitg, ntg);
}

kernel void mf_getrows_q6_K(device const uchar *w [[buffer(0)]],
                           device const int *ids [[buffer(1)]], device float *y [[buffer(2)]],
                           constant mf_mtl_getrows_args &a [[buffer(3)]],
                           uint3 tgpig [[threadgroup_position_in_grid]],
                           uint3 tpitg [[thread_position_in_threadgroup]],
                           uint3 ntg [[threads_per_threadgroup]]) {
    getrows_body<dq_q6_K>(w, ids, y, a, tgpig, tpitg, ntg);
}

