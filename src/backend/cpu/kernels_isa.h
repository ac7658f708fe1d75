/* kernels_isa.h - private to src/backend/cpu: the seam between the portable
 * kernels and the per-ISA files (dot_avx2.c, dot_avx512.c).
 *
 * Each ISA file exports a lookup that returns its dot kernel for a weight type
 * (NULL where it has none, and the dispatcher falls back to a lower ISA) and an
 * activation quantizer that returns false for formats it does not handle. The
 * ISA versions must produce the same quantized activations as the scalar ones,
 * byte for byte, so a dot kernel can be checked against its scalar twin on the
 * same input. They may only be called after mf_cpu_isa_best() said the CPU
 * runs them. */
#ifndef MF_CPU_KERNELS_ISA_H
#define MF_CPU_KERNELS_ISA_H

#include "backend/cpu/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#define MF_CPU_X86 1
#else
#define MF_CPU_X86 0
#endif
/* [neon] 64-bit ARM: dot_neon.c (ARMv8.2 dotprod + fp16) */
#if defined(__aarch64__)
#define MF_CPU_ARM 1
#else
#define MF_CPU_ARM 0
#endif

/* isa lowered to what the hardware runs (ignores the cap). */
mf_cpu_isa mf_cpu_isa_clamp(mf_cpu_isa isa);

/* The activation format each weight type's dot product consumes. */
uint32_t mf_cpu_act_type(uint32_t wtype);

const mf_cpu_dot *mf_cpu_dot_scalar(uint32_t wtype);
void mf_cpu_quantize_act_scalar(uint32_t act_type, const float *x, void *y, int64_t n);

/* s[0..3] = the dots of the four weight rows at w, w + w_row, ... with one
 * Q8_0 activation row a (ad/as: its block scales as floats and level sums,
 * n/32 each), bit-equal to the one-row kernel (x86: dot_avx512.c). */
typedef void (*mf_vec_dot4_fn)(int64_t n, float *s, const void *w, size_t w_row, const void *a, const float *ad,
                               const int32_t *as);

/* s[t * ldy] (t < nt <= 4) = the dot of one weight row w with activation
 * row t (rows a_row bytes apart), each bit-equal to the one-token kernel:
 * the weights are unpacked once for the nt tokens (dot_avx2.c). */
typedef void (*mf_vec_dotn_fn)(int64_t n, float *s, int64_t ldy, const void *w, const void *a, size_t a_row,
                               int nt);

#if MF_CPU_X86
const mf_cpu_dot *mf_cpu_dot_avx2(uint32_t wtype);
/* IQ4_NL / IQ4_XS (dot_iq4_avx2.c), bit-equal to the scalar kernels. */
const mf_cpu_dot *mf_cpu_dot_iq4_avx2(uint32_t wtype);
mf_vec_dotn_fn mf_cpu_dotn_avx2(uint32_t wtype);
/* four rows, one token, each bit-equal to the one-row AVX2 kernel (ad / as unused) */
mf_vec_dot4_fn mf_cpu_dot4_avx2(uint32_t wtype);
bool mf_cpu_quantize_act_avx2(uint32_t act_type, const float *x, void *y, int64_t n);

/* Multi-token tile on AVX2 (gemm_avx2.c): rows weight rows of wtype at w
 * (w_row bytes apart) times nt tokens of activations (rows of a_row bytes
 * at act, the dot's activation format) into y[t * ldy + r], each output
 * bit-equal to the one-token dot of dot_avx2.c. scratch holds
 * mf_cpu_avx2_tile_scratch(n_in) bytes private to the caller. */
typedef struct mf_cpu_avx2_tile {
    const uint8_t *w;
    size_t w_row;
    int64_t rows, n_in, nt;
    const uint8_t *act;
    size_t a_row;
    float *y;
    int64_t ldy;
    float *scratch;
} mf_cpu_avx2_tile;
typedef void (*mf_cpu_avx2_tile_fn)(const mf_cpu_avx2_tile *g);
mf_cpu_avx2_tile_fn mf_cpu_avx2_tile_get(uint32_t wtype); /* NULL: no tile for wtype */
size_t mf_cpu_avx2_tile_scratch(int64_t n_in);
const mf_cpu_dot *mf_cpu_dot_avx512(uint32_t wtype);
bool mf_cpu_quantize_act_avx512(uint32_t act_type, const float *x, void *y, int64_t n);
mf_vec_dot4_fn mf_cpu_dot4_avx512(uint32_t wtype);
void mf_cpu_q8_0_aux_avx512(const void *blk, int64_t nb, float *ad, int32_t *as);

/* Multi-token tile (gemm_avx512.c): rows (<= 32) weight rows of wtype at w
 * times nt tokens of activations (rows of a_row bytes at act; for the Q8_0
 * types also their block scales ad and level sums as, nt x n_in/32 each;
 * Q4_K/Q6_K read their Q8_K rows alone) into y[t * ldy + r].
 * Bit-identical to the scalar twin of the dot; scratch holds
 * mf_cpu_gemm_scratch(n_in) bytes private to the caller. */
typedef struct mf_cpu_gemm_tile {
    uint32_t wtype;
    const uint8_t *w;
    size_t w_row;
    int64_t rows, n_in, nt;
    const uint8_t *act;
    size_t a_row;
    const float *ad;
    const int32_t *as;
    float *y;
    int64_t ldy;
    void *scratch;
    /* the weights of the caller's next tile: prefetched into L2 while this
     * one computes, so its pack does not wait on DRAM (NULL: none) */
    const uint8_t *pf;
    size_t pf_bytes;
} mf_cpu_gemm_tile;
bool mf_cpu_gemm_supported(uint32_t wtype);

/* ops_avx512.c: row ops and attention's inner loops (within a few ulps of
 * the portable versions, not bit-equal; see that file). */
void mf_cpu_exp_avx512(const float *x, float *y, int64_t n);
void mf_cpu_silu_avx512(const float *a, float *y, int64_t n);
void mf_cpu_swiglu_avx512(const float *gate, const float *up, float *y, int64_t n);
void mf_cpu_rmsnorm_row_avx512(const float *x, const float *w, float *y, int64_t n, float eps);
void mf_cpu_attn_group_avx512(const float *q, int n_q, int64_t hd, const void *k, const void *v, bool f16,
                              size_t rb, int64_t e0, int64_t n_kv, float scale, float *out, float *scr,
                              int64_t ld);
size_t mf_cpu_gemm_scratch(uint32_t wtype, int64_t n_in);
void mf_cpu_gemm_avx512(const mf_cpu_gemm_tile *g);
#endif
#if MF_CPU_ARM /* [neon] */
const mf_cpu_dot *mf_cpu_dot_neon(uint32_t wtype);
bool mf_cpu_quantize_act_neon(uint32_t act_type, const float *x, void *y, int64_t n);
#endif

/* The best ISA of this CPU under the cap, kept until the cap changes (for
 * the ops that take no context). */
mf_cpu_isa mf_cpu_isa_default(void);

/* Context scratch for attention: n_floats, 64-byte aligned, valid until the
 * next call on the same context. */
float *mf_cpu_ctx_attn_scratch(mf_cpu_ctx *c, size_t n_floats);

/* Float helpers shared by attention and the float dots: 8 independent
 * accumulators in a fixed order, so the compiler can vectorize them without
 * reassociating and the result does not depend on the ISA it picked. */
float mf_cpu_dot_f32(const float *a, const float *b, int64_t n);

#endif
