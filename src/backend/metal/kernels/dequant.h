// dequant.h - the weight formats of src/quant/blocks.h read by the kernels:
// one struct per type whose static chunk() writes 32 consecutive elements
// (chunk c of a row: elements [32c, 32c + 32)) as floats. Blocks are read
// byte by byte (halves as 2-byte aligned loads only: every block size is
// even), so no vector cast depends on a row's alignment.
#ifndef MF_MTL_DEQUANT_H
#define MF_MTL_DEQUANT_H

#include "metal_args.h"

using namespace metal;

static inline float mf_h(device const uchar *p) {
    return float(*(device const half *)p);
}

struct dq_f32 {
    static void chunk(device const uchar *row, int c, thread float *o) {
        device const float *x = (device const float *)row + 32 * c;
        for (int j = 0; j < 32; j++)
            o[j] = x[j];
    }
};

struct dq_f16 {
    static void chunk(device const uchar *row, int c, thread float *o) {
        device const half *x = (device const half *)row + 32 * c;
        for (int j = 0; j < 32; j++)
            o[j] = float(x[j]);
    }
};

struct dq_bf16 {
    static void chunk(device const uchar *row, int c, thread float *o) {
        device const ushort *x = (device const ushort *)row + 32 * c;
        for (int j = 0; j < 32; j++)
            o[j] = as_type<float>(uint(x[j]) << 16);
    }
};

// 18 bytes: d, 16 nibble pairs (element j low, j + 16 high); x = d (q - 8)
struct dq_q4_0 {
    static void chunk(device const uchar *row, int c, thread float *o) {
        device const uchar *b = row + 18 * c;
        const float d = mf_h(b);
        for (int j = 0; j < 16; j++) {
            const uchar q = b[2 + j];
            o[j] = d * (float(q & 15) - 8.0f);
            o[j + 16] = d * (float(q >> 4) - 8.0f);
        }
    }
};

// 20 bytes: d, m, 16 nibble pairs; x = d q + m
struct dq_q4_1 {
    static void chunk(device const uchar *row, int c, thread float *o) {
        device const uchar *b = row + 20 * c;
        const float d = mf_h(b), m = mf_h(b + 2);
        for (int j = 0; j < 16; j++) {
            const uchar q = b[4 + j];
            o[j] = d * float(q & 15) + m;
            o[j + 16] = d * float(q >> 4) + m;
        }
    }
};

static inline uint mf_qh32(device const uchar *p) {
    return uint(p[0]) | (uint(p[1]) << 8) | (uint(p[2]) << 16) | (uint(p[3]) << 24);
}

// 22 bytes: d, qh (bit j: fifth bit of element j), nibbles; x = d (q - 16)
struct dq_q5_0 {
    static void chunk(device const uchar *row, int c, thread float *o) {
        device const uchar *b = row + 22 * c;
        const float d = mf_h(b);
        const uint qh = mf_qh32(b + 2);
        for (int j = 0; j < 16; j++) {
            const uchar q = b[6 + j];
            const int lo = int(q & 15) | int(((qh >> j) & 1u) << 4);
            const int hi = int(q >> 4) | int(((qh >> (j + 16)) & 1u) << 4);
            o[j] = d * float(lo - 16);
            o[j + 16] = d * float(hi - 16);
        }
    }
};

// 24 bytes: d, m, qh, nibbles; x = d q + m
struct dq_q5_1 {
    static void chunk(device const uchar *row, int c, thread float *o) {
        device const uchar *b = row + 24 * c;
        const float d = mf_h(b), m = mf_h(b + 2);
        const uint qh = mf_qh32(b + 4);
        for (int j = 0; j < 16; j++) {
            const uchar q = b[8 + j];
            const int lo = int(q & 15) | int(((qh >> j) & 1u) << 4);
            const int hi = int(q >> 4) | int(((qh >> (j + 16)) & 1u) << 4);
            o[j] = d * float(lo) + m;
            o[j + 16] = d * float(hi) + m;
        }
    }
};

// 34 bytes: d, 32 int8; x = d q
struct dq_q8_0 {
    static void chunk(device const uchar *row, int c, thread float *o) {
        device const uchar *b = row + 34 * c;
        const float d = mf_h(b);
        device const char *q = (device const char *)(b + 2);
        for (int j = 0; j < 32; j++)
            o[j] = d * float(q[j]);
    }
};

// Q2_K (84 bytes: scales[16], qs[64], d, dmin). Chunk k of a super-block:
// half n = k / 4, shift 2 (k % 4); element l uses qs[32 n + l] and
// sub-block scale 8 n + 2 (k % 4) + l / 16.
struct dq_q2_K {
    static void chunk(device const uchar *row, int c, thread float *o) {
        device const uchar *b = row + 84 * (c / 8);
        const int k = c % 8, n = k / 4, j = k % 4;
        const float d = mf_h(b + 80), dmin = mf_h(b + 82);
        for (int l = 0; l < 32; l++) {
            const uchar sc = b[8 * n + 2 * j + l / 16];
            const int q = (b[16 + 32 * n + l] >> (2 * j)) & 3;
            o[l] = d * float(sc & 15) * float(q) - dmin * float(sc >> 4);
        }
    }
};

// Q3_K (110 bytes: hmask[32], qs[64], scales[12], d). Sub-block scale i is
// 6 bits: low 4 from scales[i % 8] (high nibble when i >= 8), high 2 from
// scales[8 + i % 4] >> 2 (i / 4); minus 32. Chunk k: n = k / 4, j = k % 4,
// element l: 2 bits of qs[32 n + l] >> 2j, high bit hmask[l] bit 4n + j
// (clear means -4), scale 8 n + 2 j + l / 16.
struct dq_q3_K {
    static void chunk(device const uchar *row, int c, thread float *o) {
        device const uchar *b = row + 110 * (c / 8);
        const int k = c % 8, n = k / 4, j = k % 4;
        const float d = mf_h(b + 108);
        device const uchar *sc = b + 96;
        for (int l = 0; l < 32; l++) {
            const int i = 8 * n + 2 * j + l / 16;
            const int lo = i < 8 ? (sc[i] & 15) : (sc[i - 8] >> 4);
            const int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
            const int s = (lo | (hi << 4)) - 32;
            const int q = (b[32 + 32 * n + l] >> (2 * j)) & 3;
            const int h = (b[l] >> (4 * n + j)) & 1;
            o[l] = d * float(s) * float(q - (h ? 0 : 4));
        }
    }
};

// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K super-block.
static inline void mf_scale_min_k4(int j, device const uchar *q, thread int &sc, thread int &m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Q4_K (144 bytes: d, dmin, scales[12], qs[128]). Sub-block k (32 elements)
// is the low (k even) or high nibble of qs[32 (k / 2) + l].
struct dq_q4_K {
    static void chunk(device const uchar *row, int c, thread float *o) {
        device const uchar *b = row + 144 * (c / 8);
        const int k = c % 8;
        const float d = mf_h(b), dmin = mf_h(b + 2);
        int sc, m;
        mf_scale_min_k4(k, b + 4, sc, m);
        const float ds = d * float(sc), dm = dmin * float(m);
        device const uchar *q = b + 16 + 32 * (k / 2);
        const int sh = (k & 1) * 4;
        for (int l = 0; l < 32; l++)
            o[l] = ds * float((q[l] >> sh) & 15) - dm;
    }
};

// Q5_K (176 bytes: d, dmin, scales[12], qh[32], qs[128]); the fifth bit of
// element l of sub-block k is bit k of qh[l].
struct dq_q5_K {
    static void chunk(device const uchar *row, int c, thread float *o) {
        device const uchar *b = row + 176 * (c / 8);
        const int k = c % 8;
        const float d = mf_h(b), dmin = mf_h(b + 2);
        int sc, m;
        mf_scale_min_k4(k, b + 4, sc, m);
        const float ds = d * float(sc), dm = dmin * float(m);
        device const uchar *qh = b + 16;
        device const uchar *q = b + 48 + 32 * (k / 2);
        const int sh = (k & 1) * 4;
        for (int l = 0; l < 32; l++) {
            const int v = ((q[l] >> sh) & 15) | (((qh[l] >> k) & 1) << 4);
            o[l] = ds * float(v) - dm;
        }
    }
};

// Q6_K (210 bytes: ql[128], qh[64], scales[16] int8, d). Chunk k: half
// n = k / 4, quarter r = k % 4; element l: low 4 bits from
// ql[64 n + 32 (r & 1) + l] (high nibble when r >= 2), high 2 bits from
// qh[32 n + l] >> 2r, scale 8 n + 2 r + l / 16; x = d s (q - 32).
struct dq_q6_K {
    static void chunk(device const uchar *row, int c, thread float *o) {
        device const uchar *b = row + 210 * (c / 8);
        const int k = c % 8, n = k / 4, r = k % 4;
        const float d = mf_h(b + 208);
        device const char *sc = (device const char *)(b + 192);
        device const uchar *ql = b + 64 * n + 32 * (r & 1);
        device const uchar *qh = b + 128 + 32 * n;
        const int sh = r >= 2 ? 4 : 0;
        for (int l = 0; l < 32; l++) {
            const int q = ((ql[l] >> sh) & 15) | (((qh[l] >> (2 * r)) & 3) << 4);
            o[l] = d * float(sc[8 * n + 2 * r + l / 16]) * float(q - 32);
        }
    }
};

#endif
