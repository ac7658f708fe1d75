/* matmul.c - the CPU context (pool + scratch) and the quantized matmul.
 *
 * A matmul call quantizes the nt activation rows once into the context's
 * scratch (one copy per distinct activation format), then hands out tiles of
 * (rows x tokens) to the pool through an atomic counter. Every output element
 * is one call of the type's dot kernel on one weight row and one activation
 * row, so the result is the same bits whatever the thread count or the tile
 * that computed it: determinism comes from the kernel, not the schedule (the
 * four-row decode kernels and the multi-token tiles reproduce the one-row
 * dot bit for bit). Within
 * a tile the loop runs weight row by weight row over the tile's tokens, so a
 * weight row is read from memory once and reused from L1 for every token. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels_isa.h"

struct mf_cpu_ctx {
    mf_pool *pool;
    int n_threads;
    mf_cpu_isa isa;
    uint8_t *act; /* quantized activations of the current matmul */
    size_t act_cap;
    float *attn; /* per-thread attention scratch */
    size_t attn_cap;
    uint8_t *pack; /* per-thread packed weight panels of the multi-token tiles */
    size_t pack_cap;
};

mf_cpu_ctx *mf_cpu_ctx_new(int n_threads) {
    mf_pool *pool = mf_pool_new(n_threads);
    if (!pool)
        return NULL;
    mf_cpu_ctx *c = mf_calloc(1, sizeof *c);
    c->pool = pool;
    c->n_threads = mf_pool_size(pool);
    c->isa = mf_cpu_isa_best();
    return c;
}

void mf_cpu_ctx_free(mf_cpu_ctx *c) {
    if (!c)
        return;
    mf_pool_free(c->pool);
    free(c->act);
    free(c->attn);
    free(c->pack);
    free(c);
}

int mf_cpu_ctx_threads(const mf_cpu_ctx *c) { return c->n_threads; }
mf_pool *mf_cpu_ctx_pool(mf_cpu_ctx *c) { return c->pool; }
void mf_cpu_ctx_set_isa(mf_cpu_ctx *c, mf_cpu_isa isa) { c->isa = mf_cpu_isa_clamp(isa); }
mf_cpu_isa mf_cpu_ctx_isa(const mf_cpu_ctx *c) { return c->isa; }

/* Scratch of at least n bytes, 64-byte aligned, valid until the next call. */
static void *ctx_scratch(uint8_t **buf, size_t *cap, size_t n) {
    if (n + 64 > *cap) {
        free(*buf);
        *cap = (n + 64) + (n + 64) / 4;
        *buf = mf_malloc(*cap);
    }
    return (void *)(((uintptr_t)*buf + 63) & ~(uintptr_t)63);
}

float *mf_cpu_ctx_attn_scratch(mf_cpu_ctx *c, size_t n_floats) {
    return ctx_scratch((uint8_t **)&c->attn, &c->attn_cap, n_floats * sizeof(float));
}

/* ==== activation quantization ============================================= */

#define ACT_KINDS 4 /* F32, Q8_0, Q8_1, Q8_K */

typedef struct quant_job {
    const float *x;
    int64_t n_in, nt;
    int n_kind;
    uint32_t type[ACT_KINDS];
    uint8_t *dst[ACT_KINDS];
    size_t row[ACT_KINDS];
    mf_cpu_isa isa;
    int aux_kind;   /* the Q8_0 kind whose block scales/sums the tiles / dot4 read; -1: none */
    float *ad;      /* nt x n_in/32 block scales as floats */
    int32_t *as;    /* nt x n_in/32 level sums */
} quant_job;

static void quant_worker(void *vjob, int ith, int nth) {
    const quant_job *j = vjob;
    for (int64_t i = ith; i < j->n_kind * j->nt; i += nth) {
        const int k = (int)(i / j->nt);
        const int64_t t = i % j->nt;
        uint8_t *row = j->dst[k] + (size_t)t * j->row[k];
        mf_cpu_quantize_act(j->type[k], j->x + t * j->n_in, row, j->n_in, j->isa);
        if (k == j->aux_kind) {
            const mf_block_q8_0 *blk = (const mf_block_q8_0 *)row;
            const int64_t nb = j->n_in / MF_QK8_0;
#if MF_CPU_X86
            if (j->isa >= MF_ISA_AVX512) {
                mf_cpu_q8_0_aux_avx512(blk, nb, j->ad + t * nb, j->as + t * nb);
                continue;
            }
#endif
            for (int64_t b = 0; b < nb; b++) {
                int sum = 0;
                for (int e = 0; e < MF_QK8_0; e++)
                    sum += blk[b].qs[e];
                j->ad[t * nb + b] = mf_fp16_to_fp32(blk[b].d);
                j->as[t * nb + b] = sum;
            }
        }
    }
}

/* ==== tiled dot products ==================================================== */

#define MM_MAX_PARTS 8

typedef struct mm_part {
    const uint8_t *w;
    size_t w_row; /* bytes per weight row */
    mf_vec_dot_fn dot;
    mf_vec_dot4_fn dot4; /* one token, four rows at a time (NULL: none) */
    mf_vec_dotn_fn dotn; /* one row, up to four tokens at a time (NULL: none) */
    uint32_t wtype;
    bool gemm; /* multi-token tiles of gemm_avx512.c (tile_rows == 32) */
#if MF_CPU_X86
    mf_cpu_avx2_tile_fn avx2_tile; /* multi-token tiles of gemm_avx2.c (NULL: none) */
#endif
    const uint8_t *a;
    size_t a_row; /* bytes per activation row */
    float *y;
    int64_t n_out;
    int64_t tile0; /* global index of this part's first tile */
    int64_t n_rt;  /* row tiles */
} mm_part;

typedef struct mm_job {
    mm_part part[MM_MAX_PARTS];
    int n_part;
    int64_t n_in, nt;
    int64_t tile_rows, tile_toks, n_tt; /* tile shape; token tiles per row tile */
    int64_t n_tiles;
    const float *ad;   /* Q8_0 block scales and level sums for gemm parts */
    const int32_t *as;
    uint8_t *pack;     /* per-thread panel scratch, pack_stride bytes each */
    size_t pack_stride;
    _Atomic int64_t next;
} mm_job;

#ifndef PF_BYTES
#define PF_BYTES 6144 /* decode prefetch distance in the weight stream */
#endif

static inline void mf_prefetch(const void *p) {
#if defined(__GNUC__)
    __builtin_prefetch(p, 0, 3);
#else
    (void)p;
#endif
}

/* The weight bytes tile k of part p reads (for the next-tile prefetch). */
static size_t mm_tile_span(const mm_job *j, const mm_part *p, int64_t k, const uint8_t **w) {
    const int64_t r0 = (k / j->n_tt) * j->tile_rows;
    const int64_t r1 = r0 + j->tile_rows < p->n_out ? r0 + j->tile_rows : p->n_out;
    *w = p->w + (size_t)r0 * p->w_row;
    return (size_t)(r1 - r0) * p->w_row;
}

static void mm_tile(const mm_job *j, const mm_part *p, int64_t k, int ith, const uint8_t *pf, size_t pf_bytes) {
    const int64_t r0 = (k / j->n_tt) * j->tile_rows, t0 = (k % j->n_tt) * j->tile_toks;
    const int64_t r1 = r0 + j->tile_rows < p->n_out ? r0 + j->tile_rows : p->n_out;
    const int64_t t1 = t0 + j->tile_toks < j->nt ? t0 + j->tile_toks : j->nt;
#if MF_CPU_X86
    if (p->gemm) {
        const int64_t nb = j->n_in / MF_QK8_0;
        const mf_cpu_gemm_tile g = {
            .wtype = p->wtype, .w = p->w + (size_t)r0 * p->w_row, .w_row = p->w_row, .rows = r1 - r0,
            .n_in = j->n_in, .nt = t1 - t0, .act = p->a + (size_t)t0 * p->a_row, .a_row = p->a_row,
            .ad = j->ad ? j->ad + t0 * nb : NULL, .as = j->as ? j->as + t0 * nb : NULL, .y = p->y + t0 * p->n_out + r0, .ldy = p->n_out,
            .scratch = j->pack + (size_t)ith * j->pack_stride, .pf = pf, .pf_bytes = pf_bytes};
        mf_cpu_gemm_avx512(&g);
        return;
    }
    if (p->avx2_tile) {
        const mf_cpu_avx2_tile g = {
            .w = p->w + (size_t)r0 * p->w_row, .w_row = p->w_row, .rows = r1 - r0, .n_in = j->n_in,
            .nt = t1 - t0, .act = p->a + (size_t)t0 * p->a_row, .a_row = p->a_row,
            .y = p->y + t0 * p->n_out + r0, .ldy = p->n_out,
            .scratch = (float *)(j->pack + (size_t)ith * j->pack_stride)};
        p->avx2_tile(&g);
        return;
    }
#else
    (void)ith;
#endif
    (void)pf;
    (void)pf_bytes;
    int64_t r = r0;
    if (t1 - t0 == 1) {
        /* decode streams the weights from DRAM: the tile's first PF_BYTES
         * are requested at once, then the one-row loop keeps PF_BYTES ahead
         * (the four-row kernels prefetch for themselves). Cold one-token
         * matmuls (bench "cold", 2 threads): q4_K / q6_K 1536-wide 28 / 30
         * -> 37 / 39 GB/s, q4_0 +8-12 %. */
        const size_t span = (size_t)(r1 - r0) * p->w_row, head = span < PF_BYTES ? span : PF_BYTES;
        for (size_t o = 0; o < head; o += 64)
            mf_prefetch(p->w + (size_t)r0 * p->w_row + o);
        if (p->dot4)
            for (; r + 4 <= r1; r += 4)
                p->dot4(j->n_in, &p->y[r], p->w + (size_t)r * p->w_row, p->w_row, p->a, j->ad, j->as);
        /* rows over 2 KB: the hardware prefetchers keep up on their own,
         * and the extra requests cost (q6_K 8960-wide: 39 -> 30 GB/s) */
        const size_t end = p->w_row <= 2048 ? (size_t)r1 * p->w_row : 0;
        for (; r < r1; r++) {
            const uint8_t *w = p->w + (size_t)r * p->w_row;
            /* the same row's bytes PF_BYTES further on, within the tile */
            for (size_t o = (size_t)r * p->w_row + PF_BYTES; o < (size_t)(r + 1) * p->w_row + PF_BYTES && o < end; o += 64)
                mf_prefetch(p->w + o);
            p->dot(j->n_in, &p->y[t0 * p->n_out + r], w, p->a + (size_t)t0 * p->a_row);
        }
        return;
    }
    for (; r < r1; r++) {
        const uint8_t *w = p->w + (size_t)r * p->w_row;
        int64_t t = t0;
        if (p->dotn)
            for (; t < t1; t += 4) {
                const int nt = t1 - t < 4 ? (int)(t1 - t) : 4;
                p->dotn(j->n_in, &p->y[t * p->n_out + r], p->n_out, w, p->a + (size_t)t * p->a_row,
                        p->a_row, nt);
            }
        for (; t < t1; t++)
            p->dot(j->n_in, &p->y[t * p->n_out + r], w, p->a + (size_t)t * p->a_row);
    }
}

static const mm_part *mm_find_part(const mm_job *j, int64_t k, int *pi) {
    while (k >= j->part[*pi].tile0 + j->part[*pi].n_rt * j->n_tt)
        (*pi)++;
    while (k < j->part[*pi].tile0)
        (*pi)--;
    return &j->part[*pi];
}

/* Before running a multi-token tile a thread claims its next tile, so the
 * tile can prefetch the next one's weights while it computes (the pack of a
 * DRAM-resident panel otherwise stalls on DRAM): pp128 1.5B Q4_K_M +4-5 %,
 * 0.5B q4_0 / Q4_K_M / q8_0 +7 / +7 / +12 % (interleaved). Decode tiles do
 * not claim ahead (it would only lengthen the tail). Which thread runs a
 * tile does not change its bits. */
static void mm_worker(void *vjob, int ith, int nth) {
    mm_job *j = vjob;
    (void)nth;
    int pi = 0;
    int64_t k = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
    while (k < j->n_tiles) {
        const mm_part *p = mm_find_part(j, k, &pi);
        if (!p->gemm) {
            mm_tile(j, p, k - p->tile0, ith, NULL, 0);
            k = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
            continue;
        }
        const int64_t kn = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        const uint8_t *pf = NULL;
        size_t pf_bytes = 0;
        if (kn < j->n_tiles) {
            int pn = pi;
            const mm_part *q = mm_find_part(j, kn, &pn);
            if (q->gemm)
                pf_bytes = mm_tile_span(j, q, kn - q->tile0, &pf);
        }
        mm_tile(j, p, k - p->tile0, ith, pf, pf_bytes);
        k = kn;
    }
}

/* The matmuls of mm (all reading x, nt rows of n_in floats) in one parallel
 * region. Weight types, n_in divisibility and the number of parts are our own
 * invariants: the backend's supports_op refuses anything else before here. */
void mf_cpu_matmul_multi(mf_cpu_ctx *c, const mf_cpu_mm *mm, int n_mm, int64_t n_in,
                         const float *x, int64_t nt) {
    MF_ASSERT(n_mm >= 1 && n_mm <= MM_MAX_PARTS);
    if (nt <= 0)
        return;
    quant_job q = {.x = x, .n_in = n_in, .nt = nt, .isa = c->isa, .aux_kind = -1};
    const mf_cpu_dot *dots[MM_MAX_PARTS];
    int kind_of[MM_MAX_PARTS];
    bool gemm[MM_MAX_PARTS], any_gemm = false, any_aux = false, any_avx2_tile = false;
    mf_vec_dot4_fn dot4[MM_MAX_PARTS];
    size_t total = 0;
    int64_t sum_out = 0;
    for (int i = 0; i < n_mm; i++) {
        dots[i] = mf_cpu_dot_get(mm[i].wtype, c->isa);
        MF_ASSERT(dots[i] != NULL);
        MF_ASSERT(mf_type_row_size(mm[i].wtype, n_in) > 0);
        sum_out += mm[i].n_out;
        kind_of[i] = -1;
        gemm[i] = false;
        dot4[i] = NULL;
#if MF_CPU_X86
        /* one token: the single-row dot streams each weight row linearly,
         * which the hardware prefetchers follow (the panel walk of the
         * tiles does not); it computes the same bits */
        gemm[i] = nt > 1 && c->isa >= MF_ISA_AVX512 && mf_cpu_gemm_supported(mm[i].wtype);
        any_gemm |= gemm[i];
        any_avx2_tile |= nt > 1 && c->isa == MF_ISA_AVX2 && mf_cpu_avx2_tile_get(mm[i].wtype);
        if (nt == 1 && c->isa >= MF_ISA_AVX512)
            dot4[i] = mf_cpu_dot4_avx512(mm[i].wtype);
        any_aux |= gemm[i] || dot4[i];
        /* the AVX2 four-row kernels read no aux (not counted above) */
        if (nt == 1 && c->isa == MF_ISA_AVX2)
            dot4[i] = mf_cpu_dot4_avx2(mm[i].wtype);
#endif
        if (dots[i]->act_type == MF_TYPE_F32)
            continue;
        for (int k = 0; k < q.n_kind; k++)
            if (q.type[k] == dots[i]->act_type)
                kind_of[i] = k;
        if (kind_of[i] < 0) {
            const int k = q.n_kind++;
            q.type[k] = dots[i]->act_type;
            q.row[k] = mf_type_row_size(q.type[k], n_in);
            MF_ASSERT(q.row[k] > 0);
            total += (q.row[k] * (size_t)nt + 63) & ~(size_t)63;
            kind_of[i] = k;
        }
        if ((gemm[i] || (dot4[i] && c->isa >= MF_ISA_AVX512)) && dots[i]->act_type == MF_TYPE_Q8_0)
            q.aux_kind = kind_of[i];
    }
    const size_t aux_bytes = any_aux ? (size_t)(nt * (n_in / MF_QK8_0)) * 4 : 0;
    if (q.n_kind) {
        uint8_t *buf = ctx_scratch(&c->act, &c->act_cap, total + 2 * aux_bytes + 128);
        for (int k = 0; k < q.n_kind; k++) {
            q.dst[k] = buf;
            buf += (q.row[k] * (size_t)nt + 63) & ~(size_t)63;
        }
        if (any_aux) {
            q.ad = (float *)buf;
            q.as = (int32_t *)(buf + ((aux_bytes + 63) & ~(size_t)63));
        }
        if (q.n_kind * nt == 1)
            quant_worker(&q, 0, 1);
        else
            mf_pool_run(c->pool, quant_worker, &q);
    }

    mm_job *j = mf_calloc(1, sizeof *j); /* small; heap keeps the atomic off a shared stack line */
    j->n_part = n_mm;
    j->n_in = n_in;
    j->nt = nt;
    const int64_t nth = c->n_threads;
    if (any_gemm) {
        /* a 32-row panel is unpacked once per tile and reused for up to 128
         * tokens (their activations stay in L2) */
        j->tile_rows = 32;
        j->tile_toks = nt < 128 ? nt : 128;
#if MF_CPU_X86
        j->pack_stride = 0;
        for (int i = 0; i < n_mm; i++) {
            const size_t need = gemm[i] ? (mf_cpu_gemm_scratch(mm[i].wtype, n_in) + 63) & ~(size_t)63 : 0;
            j->pack_stride = need > j->pack_stride ? need : j->pack_stride;
        }
        j->pack = ctx_scratch(&c->pack, &c->pack_cap, j->pack_stride * (size_t)nth);
#endif
        j->ad = q.ad;
        j->as = q.as;
    } else if (nt == 1) {
        /* ~8 tiles per thread for balance, small enough tiles to spread,
         * large enough that the counter is not contended */
        j->tile_toks = 1;
        j->tile_rows = sum_out / (nth * 8);
        j->tile_rows = j->tile_rows < 4 ? 4 : j->tile_rows > 64 ? 64 : j->tile_rows & ~(int64_t)3; /* dot4 groups */
        j->ad = q.ad;
        j->as = q.as;
    } else if (any_avx2_tile) {
        /* 16 rows x 16 tokens: each row's blocks are unpacked once per
         * eight tokens, and the tile's activations (16 tokens) stay in L1/L2
         * while its rows stream past them */
        j->tile_toks = nt < 16 ? nt : 16;
        j->tile_rows = 16;
#if MF_CPU_X86
        j->pack_stride = (mf_cpu_avx2_tile_scratch(n_in) + 63) & ~(size_t)63;
        j->pack = ctx_scratch(&c->pack, &c->pack_cap, j->pack_stride * (size_t)nth);
#endif
    } else {
        j->tile_toks = nt < 16 ? nt : 16;
        j->tile_rows = 8;
    }
    j->n_tt = (nt + j->tile_toks - 1) / j->tile_toks;
    int64_t tiles = 0;
    for (int i = 0; i < n_mm; i++) {
        mm_part *p = &j->part[i];
        p->w = mm[i].w;
        p->w_row = mf_type_row_size(mm[i].wtype, n_in);
        p->dot = dots[i]->dot;
        p->dot4 = dot4[i];
        p->dotn = NULL;
#if MF_CPU_X86
        /* several tokens share each unpacked weight block (the AVX-512
         * tiles have their own kernel) */
        if (nt > 1 && !gemm[i] && c->isa == MF_ISA_AVX2)
            p->dotn = mf_cpu_dotn_avx2(mm[i].wtype);
        p->avx2_tile = nt > 1 && c->isa == MF_ISA_AVX2 ? mf_cpu_avx2_tile_get(mm[i].wtype) : NULL;
#endif
        p->wtype = mm[i].wtype;
        p->gemm = gemm[i];
        if (dots[i]->act_type == MF_TYPE_F32) {
            p->a = (const uint8_t *)x;
            p->a_row = (size_t)n_in * sizeof(float);
        } else {
            p->a = q.dst[kind_of[i]];
            p->a_row = q.row[kind_of[i]];
        }
        p->y = mm[i].y;
        p->n_out = mm[i].n_out;
        p->tile0 = tiles;
        p->n_rt = (p->n_out + j->tile_rows - 1) / j->tile_rows;
        tiles += p->n_rt * j->n_tt;
    }
    j->n_tiles = tiles;
    atomic_init(&j->next, 0);
    if (tiles == 1)
        mm_worker(j, 0, 1);
    else
        mf_pool_run(c->pool, mm_worker, j);
    free(j);
}

void mf_cpu_matmul(mf_cpu_ctx *c, uint32_t wtype, const void *w, int64_t n_in, int64_t n_out,
                   const float *x, int64_t nt, float *y) {
    const mf_cpu_mm mm = {.wtype = wtype, .w = w, .n_out = n_out, .y = y};
    mf_cpu_matmul_multi(c, &mm, 1, n_in, x, nt);
}
