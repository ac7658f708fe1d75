/* quant_act.c - activation quantizers (scalar) and their ISA dispatch.
 *
 * The formats and their arithmetic are the GGUF ecosystem's reference ones,
 * so our integer dot products see the same activation levels as its kernels:
 *   Q8_0: d = amax / 127, q = roundf(x * (1/d)) (ties away from zero), d as f16;
 *   Q8_1: Q8_0 plus s = f16(d * sum(q));
 *   Q8_K: iscale = -127 / x_max where x_max is the signed element of largest
 *         magnitude, q = min(127, round-half-even(iscale * x)), d = 1 / iscale
 *         (f32), bsums = sums of 16 consecutive q; an all-zero block is zeros.
 * The ISA versions reproduce these bytes exactly. */
#include <math.h>
#include <string.h>

#include "backend/cpu/kernels_isa.h"

static void q8_0_row(const float *x, void *vy, int64_t n) {
    mf_block_q8_0 *y = vy;
    for (int64_t b = 0; b < n / MF_QK8_0; b++, x += MF_QK8_0) {
        float amax = 0;
        for (int j = 0; j < MF_QK8_0; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[b].d = mf_fp32_to_fp16(d);
        for (int j = 0; j < MF_QK8_0; j++)
            y[b].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

static void q8_1_row(const float *x, void *vy, int64_t n) {
    mf_block_q8_1 *y = vy;
    for (int64_t b = 0; b < n / MF_QK8_1; b++, x += MF_QK8_1) {
        float amax = 0;
        for (int j = 0; j < MF_QK8_1; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        int sum = 0;
        y[b].d = mf_fp32_to_fp16(d);
        for (int j = 0; j < MF_QK8_1; j++) {
            y[b].qs[j] = (int8_t)roundf(x[j] * id);
            sum += y[b].qs[j];
        }
        y[b].s = mf_fp32_to_fp16((float)sum * d);
    }
}

/* Round half to even for |v| < 2^22 (the float magic-number trick; no libm
 * rounding-mode dependence). */
static inline int round_even(float v) {
    float t = v + 12582912.0f;
    uint32_t u;
    memcpy(&u, &t, sizeof u);
    return (int)(u & 0x007fffffu) - 0x00400000;
}

static void q8_K_row(const float *x, void *vy, int64_t n) {
    mf_block_q8_K *y = vy;
    for (int64_t b = 0; b < n / MF_QK_K; b++, x += MF_QK_K) {
        float amax = 0, max = 0;
        for (int j = 0; j < MF_QK_K; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        if (!amax) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < MF_QK_K; j++) {
            const int q = round_even(iscale * x[j]);
            y[b].qs[j] = (int8_t)(q < 127 ? q : 127);
        }
        for (int j = 0; j < MF_QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++)
                sum += y[b].qs[16 * j + l];
            y[b].bsums[j] = (int16_t)sum;
        }
        y[b].d = 1 / iscale;
    }
}

void mf_cpu_quantize_act_scalar(uint32_t act_type, const float *x, void *y, int64_t n) {
    switch (act_type) {
    case MF_TYPE_F32: memcpy(y, x, (size_t)n * sizeof(float)); break;
    case MF_TYPE_Q8_0: q8_0_row(x, y, n); break;
    case MF_TYPE_Q8_1: q8_1_row(x, y, n); break;
    case MF_TYPE_Q8_K: q8_K_row(x, y, n); break;
    default: MF_ASSERT(!"activation type without a quantizer");
    }
}

/* Quantizes one row of n floats (n a multiple of act_type's block size) to
 * act_type with the best kernel isa allows; identical bytes on every ISA. */
void mf_cpu_quantize_act(uint32_t act_type, const float *x, void *y, int64_t n, mf_cpu_isa isa) {
    MF_ASSERT(mf_type_row_size(act_type, n) > 0 || n == 0);
#if MF_CPU_X86
    const mf_cpu_isa hw = mf_cpu_isa_clamp(isa);
    if (hw >= MF_ISA_AVX512 && mf_cpu_quantize_act_avx512(act_type, x, y, n))
        return;
    if (hw >= MF_ISA_AVX2 && mf_cpu_quantize_act_avx2(act_type, x, y, n))
        return;
#endif
#if MF_CPU_ARM /* [neon] */
    if (mf_cpu_isa_clamp(isa) == MF_ISA_NEON && mf_cpu_quantize_act_neon(act_type, x, y, n))
        return;
#endif
    mf_cpu_quantize_act_scalar(act_type, x, y, n);
}
