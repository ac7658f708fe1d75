/* iq4.h - IQ4_NL / IQ4_XS converters (iq4.c), for the traits table and the
 * CPU dot kernels. */
#ifndef MF_QUANT_IQ4_H
#define MF_QUANT_IQ4_H

#include <stdint.h>

#include "quant/blocks.h"

void mf_iq4_nl_from_float(const float *x, void *y, int64_t n);
void mf_iq4_nl_to_float(const void *x, float *y, int64_t n);
void mf_iq4_xs_from_float(const float *x, void *y, int64_t n);
void mf_iq4_xs_to_float(const void *x, float *y, int64_t n);
/* Sub-block ib's signed scale multiplier (ls - 32, in [-32, 31]). */
int mf_iq4_xs_scale(const mf_block_iq4_xs *x, int ib);

#endif
