// gemm.metal - the prefill matmul tier: a 32 x 32 output tile (32 weight
// rows x 32 tokens) per threadgroup of four simdgroups, each owning a 16 x 16
// quarter as four 8 x 8 simdgroup_float8x8 accumulators. Per 32-wide step
// along K, the first 32 threads dequantize one chunk of the tile's 32 rows
// into threadgroup memory (A, rows x k) while all 128 threads stage the
// tokens' activations transposed (B, k x tokens); a barrier, the 4 x 4
// multiply-accumulates, a barrier before the tiles are reused. Out-of-range
// rows and tokens are staged as zeros and never stored. Threadgroup memory:
// 2 x 32 x 32 floats = 8 KiB (the host checks it against the device limit).
#include "dequant.h"

template <typename D>
static void gemm_body(device const uchar *w, device const float *x, device float *y,
                      device const float *bias, constant mf_mtl_mm_args &a,
                      threadgroup float *shmem, uint3 tgpig, uint tid, uint sgitg) {
    threadgroup float *As = shmem;         // [32 rows][32 k]
    threadgroup float *Bs = shmem + 1024;  // [32 k][32 tokens]
    const int r0 = int(tgpig.x) * 32, t0 = int(tgpig.y) * 32;
    const int sr = int(sgitg / 2) * 16, st = int(sgitg % 2) * 16;
    simdgroup_float8x8 c00 = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    simdgroup_float8x8 c01 = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    simdgroup_float8x8 c10 = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    simdgroup_float8x8 c11 = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    const int nch = a.n_in / 32;
    for (int c = 0; c < nch; c++) {
        if (tid < 32) {
            const int r = r0 + int(tid);
            float v[32];
            if (r < a.n_out) {
                D::chunk(w + int64_t(r) * a.row_bytes, c, v);
            } else {
                for (int j = 0; j < 32; j++)
                    v[j] = 0.0f;
            }
            for (int j = 0; j < 32; j++)
                As[tid * 32 + j] = v[j];
        }
        for (int e = 0; e < 8; e++) {
            const int idx = int(tid) * 8 + e, tok = idx / 32, k = idx % 32;
            Bs[k * 32 + tok] = (t0 + tok < a.nt) ? x[int64_t(t0 + tok) * a.n_in + 32 * c + k] : 0.0f;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int kk = 0; kk < 4; kk++) {
            simdgroup_float8x8 a0, a1, b0, b1;
            simdgroup_load(a0, As + (sr + 0) * 32 + kk * 8, 32);
            simdgroup_load(a1, As + (sr + 8) * 32 + kk * 8, 32);
            simdgroup_load(b0, Bs + (kk * 8) * 32 + st + 0, 32);
            simdgroup_load(b1, Bs + (kk * 8) * 32 + st + 8, 32);
            simdgroup_multiply_accumulate(c00, a0, b0, c00);
            simdgroup_multiply_accumulate(c01, a0, b1, c01);
            simdgroup_multiply_accumulate(c10, a1, b0, c10);
            simdgroup_multiply_accumulate(c11, a1, b1, c11);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    // the result tile [32 rows][32 tokens] in As (free after the last barrier)
    simdgroup_store(c00, As + (sr + 0) * 32 + st + 0, 32);
    simdgroup_store(c01, As + (sr + 0) * 32 + st + 8, 32);
    simdgroup_store(c10, As + (sr + 8) * 32 + st + 0, 32);
    simdgroup_store(c11, As + (sr + 8) * 32 + st + 8, 32);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int e = 0; e < 8; e++) {
        const int idx = int(tid) * 8 + e, row = idx / 32, tok = idx % 32;
        const int r = r0 + row, t = t0 + tok;
        if (r < a.n_out && t < a.nt)
            y[int64_t(t) * a.n_out + r] = As[row * 32 + tok] + (a.has_bias ? bias[r] : 0.0f);
    }
}

kernel void mf_gemm_f32(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        threadgroup float *shmem [[threadgroup(0)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint3 tpitg [[thread_position_in_threadgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemm_body<dq_f32>(w, x, y, bias, a, shmem, tgpig, tpitg.x, sgitg);
}

kernel void mf_gemm_f16(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        threadgroup float *shmem [[threadgroup(0)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint3 tpitg [[thread_position_in_threadgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemm_body<dq_f16>(w, x, y, bias, a, shmem, tgpig, tpitg.x, sgitg);
}

kernel void mf_gemm_bf16(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        threadgroup float *shmem [[threadgroup(0)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint3 tpitg [[thread_position_in_threadgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemm_body<dq_bf16>(w, x, y, bias, a, shmem, tgpig, tpitg.x, sgitg);
}

kernel void mf_gemm_q4_0(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        threadgroup float *shmem [[threadgroup(0)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint3 tpitg [[thread_position_in_threadgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemm_body<dq_q4_0>(w, x, y, bias, a, shmem, tgpig, tpitg.x, sgitg);
}

kernel void mf_gemm_q4_1(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        threadgroup float *shmem [[threadgroup(0)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint3 tpitg [[thread_position_in_threadgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemm_body<dq_q4_1>(w, x, y, bias, a, shmem, tgpig, tpitg.x, sgitg);
}

kernel void mf_gemm_q5_0(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        threadgroup float *shmem [[threadgroup(0)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint3 tpitg [[thread_position_in_threadgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemm_body<dq_q5_0>(w, x, y, bias, a, shmem, tgpig, tpitg.x, sgitg);
}

kernel void mf_gemm_q5_1(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        threadgroup float *shmem [[threadgroup(0)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint3 tpitg [[thread_position_in_threadgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemm_body<dq_q5_1>(w, x, y, bias, a, shmem, tgpig, tpitg.x, sgitg);
}

kernel void mf_gemm_q8_0(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        threadgroup float *shmem [[threadgroup(0)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint3 tpitg [[thread_position_in_threadgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemm_body<dq_q8_0>(w, x, y, bias, a, shmem, tgpig, tpitg.x, sgitg);
}

kernel void mf_gemm_q2_K(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        threadgroup float *shmem [[threadgroup(0)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint3 tpitg [[thread_position_in_threadgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemm_body<dq_q2_K>(w, x, y, bias, a, shmem, tgpig, tpitg.x, sgitg);
}

kernel void mf_gemm_q3_K(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        threadgroup float *shmem [[threadgroup(0)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint3 tpitg [[thread_position_in_threadgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemm_body<dq_q3_K>(w, x, y, bias, a, shmem, tgpig, tpitg.x, sgitg);
}

kernel void mf_gemm_q4_K(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        threadgroup float *shmem [[threadgroup(0)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint3 tpitg [[thread_position_in_threadgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemm_body<dq_q4_K>(w, x, y, bias, a, shmem, tgpig, tpitg.x, sgitg);
}

kernel void mf_gemm_q5_K(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        threadgroup float *shmem [[threadgroup(0)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint3 tpitg [[thread_position_in_threadgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemm_body<dq_q5_K>(w, x, y, bias, a, shmem, tgpig, tpitg.x, sgitg);
}

kernel void mf_gemm_q6_K(device const uchar *w [[buffer(0)]],
                        device const float *x [[buffer(1)]], device float *y [[buffer(2)]],
                        device const float *bias [[buffer(3)]],
                        constant mf_mtl_mm_args &a [[buffer(4)]],
                        threadgroup float *shmem [[threadgroup(0)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint3 tpitg [[thread_position_in_threadgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]]) {
    gemm_body<dq_q6_K>(w, x, y, bias, a, shmem, tgpig, tpitg.x, sgitg);
}

