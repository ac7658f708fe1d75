/* q8w_soa.cuh - the v4 GEMV's slice decoders for the plane ("SoA") copies
 * of Q4_0 / Q5_0 / Q8_0 weights (MINFER_CUDA_SOA; soa.cu builds them).
 *
 * Why. Those blocks are 18 / 22 / 34 bytes, only 2-byte aligned: q8w.cuh's
 * unit decoder reads a unit as N + 1 aligned words funnel-shifted by 16
 * bits, and a warp's lanes sit 18-34 bytes apart, so each of its ~10 load
 * instructions per unit touches 5-9 128-byte lines: the GEMV is bound by L1
 * wavefronts (~12 bytes each), not by HBM (docs/PERF.md; the 0.5B
 * lm_head streams at ~3 TB/s). In the plane copy a row of n = n_in / 32
 * units is its planes back to back (mf_cu_soa_stride bytes a row, a
 * multiple of 16):
 *   Q4_0: qs[16 n] d[2 n]      Q5_0: qs[16 n] qh[4 n] d[2 n]
 *   Q8_0: qs[32 n] d[2 n]
 * unit u's bytes at 16 u (32 u) / 4 u / 2 u of each plane, each field's
 * bytes as in the block. A slice (= unit) is then one 16-byte load of qs
 * (two for Q8_0), one 4-byte qh load (Q5_0) and one 2-byte d load, and a
 * warp's 32 lanes read 512 (1,024) contiguous qs bytes.
 *
 * The dot is the unit decoder's to the bit: the same 8 words of weight
 * integers (q8w<T>::unit's q8_nibbles on the same bytes), the same
 * (d, offset d) pairs, then v4s<T>::dot's expression (q8_unit_dot scaled by
 * the activation unit's scale) - so the GEMV's output equals the AoS path's
 * bitwise (the launcher also keeps its warps-per-row split, v4_plan). The
 * raw slice is 5 / 6 / 9 registers instead of the unit decoder's 12. */
#ifndef MF_CUDA_Q8W_SOA_CUH
#define MF_CUDA_Q8W_SOA_CUH

#include <stdint.h>

#include "backend/cuda/dequant.cuh"
#include "backend/cuda/q8w.cuh"

/* The float part of v4s<T>::dot of the generic decoder, before the
 * activation unit's scale: weight integer sums s0 / s1 of the two halves,
 * the unit's (d, offset d) pair dm (both halves share it in these types)
 * and the activation half sums sx0 / sx1. The float steps are spelled out with
 * the _rn intrinsics (never contracted or reordered) in the order nvcc 13 contracts q8_unit_dot's expression in
 * every block-copy instance of gemv_q8v4.cu (PTX checked: the offset
 * product of the first half is the one left a mul):
 *   xd[k] * fma(m, sx1, fma(d, s1, fma(d, s0, m * sx0)))
 * - left to nvcc, the same expression here came out as fma(m, sx0, d * s0),
 * another rounding. The integer part is q8_unit_dot's (q8_unit_isum). */
static __device__ __forceinline__ float soa_unit_t(float2 dm, int s0, int s1, float sx0, float sx1) {
    float t = __fmul_rn(dm.y, sx0);
    t = __fmaf_rn(dm.x, (float)s0, t);
    t = __fmaf_rn(dm.x, (float)s1, t);
    return __fmaf_rn(dm.y, sx1, t);
}

/* q8soa<T>: T the block type; QS the qs bytes of a unit (its plane stride).
 * fetch(row, k, n, raw): loads only (n: units a row); words(raw, q, dm):
 * the unit's 8 words of weight integers and its (d, offset d) pair. */
template <int T> struct q8soa;

template <> struct q8soa<MF_TYPE_Q4_0> {
    static constexpr int QS = 16;
    struct raw {
        uint4 qs;
        uint32_t d;
    };
    static __device__ __forceinline__ void fetch(const uint8_t *row, int64_t k, int64_t n, raw &r) {
        r.qs = ((const uint4 *)row)[k];
        r.d = ((const uint16_t *)(row + 16 * n))[k];
    }
    static __device__ __forceinline__ void words(const raw &r, uint32_t *q, float2 &dm) {
        const uint32_t w[4] = {r.qs.x, r.qs.y, r.qs.z, r.qs.w};
        q8_nibbles<false>(w, 0, q);
        const float d = mf_h2f((uint16_t)r.d);
        dm = make_float2(d, __fmul_rn(-8.0f, d));
    }
};

template <> struct q8soa<MF_TYPE_Q5_0> {
    static constexpr int QS = 16;
    struct raw {
        uint4 qs;
        uint32_t qh, d;
    };
    static __device__ __forceinline__ void fetch(const uint8_t *row, int64_t k, int64_t n, raw &r) {
        r.qs = ((const uint4 *)row)[k];
        r.qh = ((const uint32_t *)(row + 16 * n))[k];
        r.d = ((const uint16_t *)(row + 20 * n))[k];
    }
    static __device__ __forceinline__ void words(const raw &r, uint32_t *q, float2 &dm) {
        const uint32_t w[4] = {r.qs.x, r.qs.y, r.qs.z, r.qs.w};
        q8_nibbles<true>(w, r.qh, q);
        const float d = mf_h2f((uint16_t)r.d);
        dm = make_float2(d, __fmul_rn(-16.0f, d));
    }
};

template <> struct q8soa<MF_TYPE_Q8_0> {
    static constexpr int QS = 32;
    struct raw {
        uint4 lo, hi;
        uint32_t d;
    };
    static __device__ __forceinline__ void fetch(const uint8_t *row, int64_t k, int64_t n, raw &r) {
        r.lo = ((const uint4 *)row)[2 * k];
        r.hi = ((const uint4 *)row)[2 * k + 1];
        r.d = ((const uint16_t *)(row + 32 * n))[k];
    }
    static __device__ __forceinline__ void words(const raw &r, uint32_t *q, float2 &dm) {
        const uint32_t w[8] = {r.lo.x, r.lo.y, r.lo.z, r.lo.w, r.hi.x, r.hi.y, r.hi.z, r.hi.w};
        for (int i = 0; i < 8; i++)
            q[i] = w[i];
        dm = make_float2(mf_h2f((uint16_t)r.d), 0.0f);
    }
};

/* The v4 decoder of a plane copy (gemv_q8v4.cu's v4s<V4_SOA_*>): dot loads
 * the unit's activation itself, at the points the one-block loop always
 * had them (the int8 and half sums first, the scale last); afetch / dot_x
 * take it apart, for the early-load instances (E). */
template <int T> struct q8soa_dec : q8soa<T> {
    typedef typename q8soa<T>::raw raw;
    typedef q8_act act;
    static __device__ __forceinline__ float dot(const raw &r, int64_t k, const int8_t *__restrict__ xq,
                                                const float *__restrict__ xd, const int32_t *__restrict__ xs) {
        uint32_t q[8];
        float2 dm;
        q8soa<T>::words(r, q, dm);
        const int4 *xp = (const int4 *)(xq + k * 32);
        const int4 a = xp[0], c = xp[1];
        const int32_t hs = xs[k];
        const float sx0 = (float)(int16_t)(hs & 0xffff), sx1 = (float)(int16_t)(hs >> 16);
        int s0, s1;
        q8_unit_isum(q, a, c, s0, s1);
        return __fmul_rn(xd[k], soa_unit_t(dm, s0, s1, sx0, sx1));
    }
    static __device__ __forceinline__ void afetch(int64_t k, const int8_t *__restrict__ xq,
                                                  const float *__restrict__ xd, const int32_t *__restrict__ xs,
                                                  act &x) {
        q8_act_fetch(k, xq, xd, xs, x);
    }
    static __device__ __forceinline__ float dot_x(const raw &r, const act &x) {
        uint32_t q[8];
        float2 dm;
        q8soa<T>::words(r, q, dm);
        const float sx0 = (float)(int16_t)(x.hs & 0xffff), sx1 = (float)(int16_t)(x.hs >> 16);
        int s0, s1;
        q8_unit_isum(q, x.a, x.c, s0, s1);
        return __fmul_rn(x.d, soa_unit_t(dm, s0, s1, sx0, sx1));
    }
};

#endif
