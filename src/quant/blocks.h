/* blocks.h - the GGUF weight block layouts, declared once.
 *
 * This header is the single contract between disk, CPU, CUDA and Metal code:
 * it is plain C with fixed-width fields (halves stored as uint16_t bits) so
 * that .c, .cu and (through its own mirror with the same static checks) .metal
 * sources agree byte for byte. Each layout is followed by a static assertion
 * on its size; the numbers are the GGUF ecosystem's. */
#ifndef MF_BLOCKS_H
#define MF_BLOCKS_H

#include <stdint.h>

#ifdef __cplusplus
#define MF_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define MF_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

#define MF_QK4_0 32
#define MF_QK4_1 32
#define MF_QK5_0 32
#define MF_QK5_1 32
#define MF_QK8_0 32
#define MF_QK8_1 32
#define MF_QK_K 256
#define MF_K_SCALE_SIZE 12

/* x = d * (q - 8), q in [0, 15]; qs[j] holds element j (low nibble) and j+16 (high) */
typedef struct {
    uint16_t d;
    uint8_t qs[MF_QK4_0 / 2];
} mf_block_q4_0;
MF_STATIC_ASSERT(sizeof(mf_block_q4_0) == 2 + MF_QK4_0 / 2, "q4_0 block size");

/* x = d * q + m */
typedef struct {
    uint16_t d;
    uint16_t m;
    uint8_t qs[MF_QK4_1 / 2];
} mf_block_q4_1;
MF_STATIC_ASSERT(sizeof(mf_block_q4_1) == 4 + MF_QK4_1 / 2, "q4_1 block size");

/* x = d * (q - 16); the fifth bit of element j is bit j of qh */
typedef struct {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[MF_QK5_0 / 2];
} mf_block_q5_0;
MF_STATIC_ASSERT(sizeof(mf_block_q5_0) == 2 + 4 + MF_QK5_0 / 2, "q5_0 block size");

/* x = d * q + m */
typedef struct {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[MF_QK5_1 / 2];
} mf_block_q5_1;
MF_STATIC_ASSERT(sizeof(mf_block_q5_1) == 4 + 4 + MF_QK5_1 / 2, "q5_1 block size");

/* x = d * q */
typedef struct {
    uint16_t d;
    int8_t qs[MF_QK8_0];
} mf_block_q8_0;
MF_STATIC_ASSERT(sizeof(mf_block_q8_0) == 2 + MF_QK8_0, "q8_0 block size");

/* activation format: s = d * sum(qs) */
typedef struct {
    uint16_t d;
    uint16_t s;
    int8_t qs[MF_QK8_1];
} mf_block_q8_1;
MF_STATIC_ASSERT(sizeof(mf_block_q8_1) == 4 + MF_QK8_1, "q8_1 block size");

/* 16 sub-blocks of 16; scales[i] = scale (low 4 bits) | min (high 4 bits);
 * x = d * scale * q - dmin * min, q in [0, 3] */
typedef struct {
    uint8_t scales[MF_QK_K / 16];
    uint8_t qs[MF_QK_K / 4];
    uint16_t d;
    uint16_t dmin;
} mf_block_q2_K;
MF_STATIC_ASSERT(sizeof(mf_block_q2_K) == 2 * 2 + MF_QK_K / 16 + MF_QK_K / 4, "q2_K block size");

/* 16 sub-blocks of 16 with 6-bit signed scales packed in 12 bytes; the high
 * bit of q is in hmask (set means +0, clear means -4); x = d * (scale - 32) * q */
typedef struct {
    uint8_t hmask[MF_QK_K / 8];
    uint8_t qs[MF_QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
} mf_block_q3_K;
MF_STATIC_ASSERT(sizeof(mf_block_q3_K) == 2 + MF_QK_K / 4 + MF_QK_K / 8 + 12, "q3_K block size");

/* 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes;
 * x = d * scale * q - dmin * min */
typedef struct {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[MF_K_SCALE_SIZE];
    uint8_t qs[MF_QK_K / 2];
} mf_block_q4_K;
MF_STATIC_ASSERT(sizeof(mf_block_q4_K) == 2 * 2 + MF_K_SCALE_SIZE + MF_QK_K / 2, "q4_K block size");

typedef struct {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[MF_K_SCALE_SIZE];
    uint8_t qh[MF_QK_K / 8];
    uint8_t qs[MF_QK_K / 2];
} mf_block_q5_K;
MF_STATIC_ASSERT(sizeof(mf_block_q5_K) == 2 * 2 + MF_K_SCALE_SIZE + MF_QK_K / 2 + MF_QK_K / 8,
                 "q5_K block size");

/* 16 sub-blocks of 16 with int8 scales; x = d * scale * (q - 32), q 6 bits */
typedef struct {
    uint8_t ql[MF_QK_K / 2];
    uint8_t qh[MF_QK_K / 4];
    int8_t scales[MF_QK_K / 16];
    uint16_t d;
} mf_block_q6_K;
MF_STATIC_ASSERT(sizeof(mf_block_q6_K) == 2 + MF_QK_K / 16 + 3 * MF_QK_K / 4, "q6_K block size");

/* IQ4_NL: 32 weights as 4-bit indices into a fixed non-linear codebook
 * (mf_iq4_values), one f16 scale: w = d * values[q]. qs[j] holds element j
 * in its low nibble and element j + 16 in its high nibble. */
#define MF_QK4_NL 32
typedef struct {
    uint16_t d;
    uint8_t qs[MF_QK4_NL / 2];
} mf_block_iq4_nl;
MF_STATIC_ASSERT(sizeof(mf_block_iq4_nl) == 2 + MF_QK4_NL / 2, "iq4_nl block size");

/* IQ4_XS: 256 weights in 8 sub-blocks of 32 with the IQ4_NL codebook; each
 * sub-block has a 6-bit scale ls (low 4 bits in scales_l, nibble ib % 2 of
 * byte ib / 2; high 2 bits at bit 2 * ib of scales_h): w = d * (ls - 32) *
 * values[q], sub-block ib's indices in qs[16 * ib ..] laid out as IQ4_NL. */
typedef struct {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[MF_QK_K / 64];
    uint8_t qs[MF_QK_K / 2];
} mf_block_iq4_xs;
MF_STATIC_ASSERT(sizeof(mf_block_iq4_xs) == 2 + 2 + MF_QK_K / 64 + MF_QK_K / 2, "iq4_xs block size");

/* activation format for K-quant dot products; bsums[i] = sum of qs[16i..16i+15] */
typedef struct {
    float d;
    int8_t qs[MF_QK_K];
    int16_t bsums[MF_QK_K / 16];
} mf_block_q8_K;
MF_STATIC_ASSERT(sizeof(mf_block_q8_K) == 4 + MF_QK_K + MF_QK_K / 16 * 2, "q8_K block size");

#endif
