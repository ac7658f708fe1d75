/* quant.h - weight types: ids, traits, reference quantize/dequantize.
 *
 * Type ids are the GGUF ones (ggml_type numbering), so a tensor's type field
 * maps directly. The traits table is the one definition of each type's block
 * size and bytes; kernels elsewhere key off it. */
#ifndef MF_QUANT_H
#define MF_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "quant/blocks.h"

typedef enum mf_type {
    MF_TYPE_F32 = 0,
    MF_TYPE_F16 = 1,
    MF_TYPE_Q4_0 = 2,
    MF_TYPE_Q4_1 = 3,
    MF_TYPE_Q5_0 = 6,
    MF_TYPE_Q5_1 = 7,
    MF_TYPE_Q8_0 = 8,
    MF_TYPE_Q8_1 = 9,
    MF_TYPE_Q2_K = 10,
    MF_TYPE_Q3_K = 11,
    MF_TYPE_Q4_K = 12,
    MF_TYPE_Q5_K = 13,
    MF_TYPE_Q6_K = 14,
    MF_TYPE_Q8_K = 15,
    MF_TYPE_IQ4_NL = 20,
    MF_TYPE_IQ4_XS = 23,
    MF_TYPE_I8 = 24,
    MF_TYPE_I16 = 25,
    MF_TYPE_I32 = 26,
    MF_TYPE_I64 = 27,
    MF_TYPE_F64 = 28,
    MF_TYPE_BF16 = 30,
    MF_TYPE_COUNT = 31 /* one past the largest id; not every id below is known */
} mf_type;

/* The IQ4_NL / IQ4_XS codebook: 16 levels, not evenly spaced (denser near
 * zero, as weights are distributed), fixed by the GGUF format. */
extern const int8_t mf_iq4_values[16];

/* Row conversions. n is a multiple of the type's block size. */
typedef void (*mf_to_float_fn)(const void *src, float *dst, int64_t n);
typedef void (*mf_from_float_fn)(const float *src, void *dst, int64_t n);

typedef struct mf_type_traits {
    const char *name;      /* "q4_K", as gguf and llama.cpp spell it */
    int64_t block_size;    /* elements per block */
    size_t type_size;      /* bytes per block */
    int is_quantized;
    mf_to_float_fn to_float;     /* NULL when the type cannot be dequantized */
    mf_from_float_fn from_float; /* reference quantizer; NULL when unsupported */
} mf_type_traits;

/* Traits for a type id, or NULL when the id is not a type minfer knows. */
const mf_type_traits *mf_type_get(uint32_t type);
/* Name of a type id ("q4_K"), or "unknown". */
const char *mf_type_name(uint32_t type);
/* Type id for a case-insensitive name ("Q4_K", "q8_0", "f16"), or -1. */
int mf_type_from_name(const char *name);
/* Bytes of a row of n elements; 0 if n is not a multiple of the block size. */
size_t mf_type_row_size(uint32_t type, int64_t n);
/* True for the types a model weight may have (F32 F16 BF16 Q4_0 Q4_1 Q5_0
 * Q5_1 Q8_0 Q2_K..Q6_K IQ4_NL IQ4_XS). */
int mf_type_is_weight(uint32_t type);
/* True for the KV cache types (F32 F16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1): the block
 * ones have 32-element blocks, so a head of head_dim % 32 == 0 is whole blocks. */
int mf_kv_type_ok(uint32_t type);

/* Name of a llama.cpp file type (GGUF general.file_type: 15 -> "Q4_K_M"), or
 * NULL for a number minfer does not know. */
const char *mf_ftype_name(uint32_t ftype);

/* Row-wise reference quantize/dequantize of nrows rows of n_per_row elements. */
void mf_dequantize_rows(uint32_t type, const void *src, float *dst, int64_t nrows, int64_t n_per_row);
void mf_quantize_rows(uint32_t type, const float *src, void *dst, int64_t nrows, int64_t n_per_row);

#endif
