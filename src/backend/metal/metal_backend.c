/* metal_backend.c - the Metal backend proper, in C: the op table, the guards,
 * the weight registry and the all-weights-registered gate, the buffer pool
 * over shared-storage buffers, and the dispatch decisions of seed §2.5.
 *
 * Rhythm (seed §2.4): execute_node only encodes into the device's open
 * command buffer; synchronize (every split end) submits it and waits,
 * bounded. Activations are f32 everywhere on the GPU path; weights are the
 * GGUF bytes, read in place through a no-copy wrapper of the mapping.
 *
 * In-place rule (copy_in): an output id may equal an input id. Kernels that
 * read other threads' inputs after writing (matmul, gathers, copies) then
 * run into a scratch buffer and copy back; row-local kernels (norms, RoPE,
 * elementwise) run in place; a RoPE into another buffer copies its source
 * there first. Every dispatch of a split sits behind a buffer barrier, so
 * scratch reuse between nodes is ordered. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/metal/metal_args.h"
#include "backend/metal/metal_backend.h"
#include "backend/metal/metal_device.h"

/* ---- the kernel list: resolved once at start, a missing one fails it ---------------- */

#define MF_WTYPES(X) X(f32) X(f16) X(bf16) X(q4_0) X(q4_1) X(q5_0) X(q5_1) X(q8_0) \
                     X(q2_K) X(q3_K) X(q4_K) X(q5_K) X(q6_K)

#define K_WT(fam, t) K(fam##_##t, "mf_" #fam "_" #t)
#define K_GETROWS(t) K_WT(getrows, t)
#define K_GEMV(t) K_WT(gemv, t)
#define K_GEMM(t) K_WT(gemm, t)
#define K_GEMV3(t) K_WT(gemv3, t)
#define K_GEMVSW(t) K_WT(gemv_swiglu, t)
#define MF_KERNELS(K)                                                                           \
    K(add, "mf_add") K(mul, "mf_mul") K(swiglu, "mf_swiglu") K(scale, "mf_scale")               \
    K(silu, "mf_silu") K(copy2d, "mf_copy2d") K(permute, "mf_permute")                          \
    K(rmsnorm, "mf_rmsnorm") K(rope, "mf_rope")                                                 \
    K(kv_store_f32, "mf_kv_store_f32") K(kv_store_f16, "mf_kv_store_f16")                       \
    K(kv_store_q8_0, "mf_kv_store_q8_0") K(kv_load_f32, "mf_kv_load_f32")                       \
    K(kv_load_f16, "mf_kv_load_f16") K(kv_load_q8_0, "mf_kv_load_q8_0")                         \
    K(attn_part_f32, "mf_attn_part_f32") K(attn_part_f16, "mf_attn_part_f16")                   \
    K(attn_part_q8_0, "mf_attn_part_q8_0") K(attn_combine, "mf_attn_combine")                  \
    K(paged_store_f32, "mf_paged_store_f32") K(paged_store_f16, "mf_paged_store_f16")           \
    K(paged_store_q8_0, "mf_paged_store_q8_0") K(paged_attn_f32, "mf_paged_attn_f32")           \
    K(paged_attn_f16, "mf_paged_attn_f16") K(paged_attn_q8_0, "mf_paged_attn_q8_0")

/* Every kernel, once: the fixed ones, then each per-type family in turn
 * (K is defined at each use: the enum, then the name table). */
#define ALL_KERNELS                                                                            \
    MF_KERNELS(K) MF_WTYPES(K_GETROWS) MF_WTYPES(K_GEMV) MF_WTYPES(K_GEMM) MF_WTYPES(K_GEMV3) \
        MF_WTYPES(K_GEMVSW)

enum {
#define K(e, s) KN_##e,
    ALL_KERNELS
#undef K
    KN_COUNT
};

static const char *const kernel_names[KN_COUNT] = {
#define K(e, s) [KN_##e] = s,
    ALL_KERNELS
#undef K
};
#undef ALL_KERNELS

int mf_metal_n_kernels(void) {
    return KN_COUNT;
}

const char *mf_metal_kernel_name(int i) {
    return i >= 0 && i < KN_COUNT ? kernel_names[i] : NULL;
}

/* The family index of weight type t (order of MF_WTYPES), -1 if none; for
 * K-quants *kq is set (rows must be whole 256-element super-blocks). */
static int wtype_index(uint32_t t, bool *kq) {
    static const uint32_t order[] = {MF_TYPE_F32,  MF_TYPE_F16,  MF_TYPE_BF16, MF_TYPE_Q4_0, MF_TYPE_Q4_1,
                                     MF_TYPE_Q5_0, MF_TYPE_Q5_1, MF_TYPE_Q8_0, MF_TYPE_Q2_K, MF_TYPE_Q3_K,
                                     MF_TYPE_Q4_K, MF_TYPE_Q5_K, MF_TYPE_Q6_K};
    for (int i = 0; i < (int)(sizeof order / sizeof order[0]); i++)
        if (order[i] == t) {
            if (kq)
                *kq = i >= 8;
            return i;
        }
    return -1;
}

/* ---- levers: the options this backend acts on ------------------------------------------ */

typedef struct levers {
    const char *metallib; /* a precompiled library instead of the embedded source */
    bool weight_copy;
    int timeout_ms;
    bool trace, capture;
    int gemm;             /* 0 never, 1 always (nt >= 2), else auto */
    bool fuse_qkv, fuse_ffn, fuse_qkv_norm;
    int attn_chunk;       /* KV positions per split (0 auto) */
} levers;

/* From the options (the runtime's levers: MINFER_METAL_GEMM ..., docs/ENV.md). */
static void read_levers(levers *l, const mf_backend_options *o) {
    l->metallib = o->metal.metallib && *o->metal.metallib ? o->metal.metallib : NULL;
    l->weight_copy = o->metal.weight_copy;
    l->timeout_ms = (int)(o->gpu_timeout_ms <= 0 ? 10000 : o->gpu_timeout_ms > 3600000 ? 3600000 : o->gpu_timeout_ms);
    l->trace = o->trace;
    l->capture = o->metal.capture;
    l->gemm = o->metal.gemm;
    l->fuse_qkv = o->fusion && o->metal.fuse_qkv;
    l->fuse_ffn = o->fusion && o->metal.fuse_ffn;
    l->fuse_qkv_norm = o->fusion && o->metal.fuse_qkv_norm;
    l->attn_chunk = o->metal.attn_chunk;
}

/* ---- state -------------------------------------------------------------------------- */

typedef struct wreg {
    const char *name;
    uint32_t type;
    int64_t ne[4];
    mf_mtl_buf *buf; /* the region wrapper (not owned) or an own buffer (owned) */
    size_t offset;
    bool owned;
} wreg;

typedef struct pbuf {
    mf_mtl_buf *buf;
    void *host;
    size_t bytes;
    bool live, fresh;
} pbuf;

enum { N_SCRATCH = 4, MAX_REGIONS = 16 };

typedef struct metal_be {
    mf_backend base;
    levers lv;
    mf_mtl_dev *dev;
    const mf_weights *w;
    wreg *regs;               /* sorted by name */
    int64_t n_regs;
    mf_mtl_buf *spans[MAX_REGIONS];
    int n_spans;
    pbuf *pool;
    int32_t n_pool, cap_pool;
    mf_mtl_buf *scratch[N_SCRATCH];
    size_t scratch_n[N_SCRATCH];
    mf_mtl_buf **grave;       /* replaced scratch still referenced by the open command buffer */
    int n_grave, cap_grave;
    mf_mtl_buf *dummy;        /* bound where a kernel's optional buffer is absent */
    /* ATTN_PAGED: the batch buffer (paged.metal's layout) as last uploaded,
     * and its host copy to tell a new batch from the same one */
    mf_mtl_buf *paged;
    int32_t *paged_dev;       /* the buffer's contents */
    size_t paged_cap;         /* ints the buffer holds */
    int32_t *paged_host;      /* the ints of the batch being checked */
    size_t paged_host_cap;
    size_t paged_n;           /* ints of the uploaded batch (0: none) */
    int64_t paged_max_block;  /* the largest block id it lists */
    int64_t n_dispatch;
} metal_be;

static metal_be *MB(const mf_backend *b) {
    return (metal_be *)b->ctx;
}

static const char *metal_name(const mf_backend *b) {
    return "metal";
}

/* ---- weight registry ---------------------------------------------------------------- */

static int wreg_cmp(const void *a, const void *b) {
    return strcmp(((const wreg *)a)->name, ((const wreg *)b)->name);
}

static const wreg *find_weight(const metal_be *m, const char *name) {
    if (!name)
        return NULL;
    wreg key = {.name = name};
    return bsearch(&key, m->regs, (size_t)m->n_regs, sizeof *m->regs, wreg_cmp);
}

static bool metal_has_weight(const mf_backend *b, const char *name) {
    return find_weight(MB(b), name) != NULL;
}

/* A vector (1-D) weight that is not f32: norms and biases, converted once so
 * the kernels read f32. */
static bool needs_f32(const mf_weight *w) {
    return w->n_dims <= 1 && w->type != MF_TYPE_F32;
}

/* Without the mapping's bounds: the runs of weight views that lie back to
 * back in memory (a GGUF's tensor data, up to its alignment padding), of at
 * least 1 MiB, largest first. Smaller runs (tensors the loader made) are
 * copied. */
static int ptr_cmp(const void *a, const void *b) {
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

static int find_spans(const mf_weights *w, mf_metal_region *out, int max) {
    const int64_t n = mf_weights_count(w);
    if (n <= 0)
        return 0;
    uintptr_t *pe = mf_malloc((size_t)n * 2 * sizeof *pe); /* (start, end) pairs */
    for (int64_t i = 0; i < n; i++) {
        const mf_weight *t = mf_weights_at(w, i);
        pe[2 * i] = (uintptr_t)t->data;
        pe[2 * i + 1] = (uintptr_t)t->data + (uintptr_t)t->nbytes;
    }
    qsort(pe, (size_t)n, 2 * sizeof *pe, ptr_cmp);
    int k = 0;
    uintptr_t b = pe[0], e = pe[1];
    for (int64_t i = 1; i <= n; i++) {
        if (i < n && pe[2 * i] <= e + 4096) { /* adjacent or overlapping */
            if (pe[2 * i + 1] > e)
                e = pe[2 * i + 1];
            continue;
        }
        if (e - b >= (1u << 20) && k < max)
            out[k++] = (mf_metal_region){(const void *)b, (uint64_t)(e - b)};
        if (i < n) {
            b = pe[2 * i];
            e = pe[2 * i + 1];
        }
    }
    free(pe);
    return k;
}

static int register_weights(metal_be *m, const mf_metal_opts *o, mf_error *err) {
    const int64_t n = mf_weights_count(m->w);
    m->regs = mf_calloc((size_t)(n ? n : 1), sizeof *m->regs);
    const uintptr_t page = 16384;
    uintptr_t lo[MAX_REGIONS], hi[MAX_REGIONS];
    mf_metal_region found[MAX_REGIONS];
    const mf_metal_region *regions = o ? o->regions : NULL;
    int n_regions = o ? o->n_regions : 0;
    if (!regions) {
        n_regions = find_spans(m->w, found, MAX_REGIONS);
        regions = found;
    }
    if (!m->lv.weight_copy) {
        for (int i = 0; i < n_regions && m->n_spans < MAX_REGIONS; i++) {
            uintptr_t b = (uintptr_t)regions[i].base, e = b + regions[i].size;
            lo[m->n_spans] = b & ~(page - 1);
            hi[m->n_spans] = (e + page - 1) & ~(page - 1);
            mf_error werr = {{0}};
            mf_mtl_buf *s = mf_mtl_buf_wrap(m->dev, (void *)lo[m->n_spans], hi[m->n_spans] - lo[m->n_spans], &werr);
            if (!s) { /* its weights are copied instead */
                mf_log(MF_LOG_INFO, "metal: %s; copying the weights of that span", werr.msg);
                continue;
            }
            /* warm-up read: the first GPU touch of file-backed pages pays the
             * page / TLB setup; pay it here, at load, once. */
            volatile const uint8_t *p = (const uint8_t *)b;
            uint8_t acc = 0;
            for (uintptr_t off = 0; off < regions[i].size; off += page)
                acc ^= p[off];
            (void)acc;
            m->spans[m->n_spans++] = s;
        }
    }
    for (int64_t i = 0; i < n; i++) {
        const mf_weight *w = mf_weights_at(m->w, i);
        if (o && o->withhold && !strcmp(o->withhold, w->name))
            continue;
        wreg r = {.name = w->name, .type = w->type, .ne = {w->ne[0], w->ne[1], w->ne[2], w->ne[3]}};
        uintptr_t p = (uintptr_t)w->data;
        if (!needs_f32(w)) {
            for (int s = 0; s < m->n_spans; s++)
                if (p >= lo[s] && p + w->nbytes <= hi[s]) {
                    r.buf = m->spans[s];
                    r.offset = p - lo[s];
                    break;
                }
        }
        if (!r.buf) {
            void *host;
            int64_t nel = w->ne[0] * w->ne[1] * w->ne[2] * w->ne[3];
            size_t bytes = needs_f32(w) ? (size_t)nel * sizeof(float) : (size_t)w->nbytes;
            r.buf = mf_mtl_buf_new(m->dev, bytes, &host, err);
            if (!r.buf)
                return -1;
            r.owned = true;
            if (needs_f32(w)) {
                const mf_type_traits *t = mf_type_get(w->type);
                if (!t || !t->to_float) {
                    mf_mtl_buf_free(r.buf);
                    return mf_errorf(err, "metal: vector weight '%s' of type %s cannot be read as floats",
                                     w->name, mf_type_name(w->type));
                }
                mf_dequantize_rows(w->type, w->data, host, 1, nel);
                r.type = MF_TYPE_F32;
            } else {
                memcpy(host, w->data, (size_t)w->nbytes);
            }
        }
        m->regs[m->n_regs++] = r;
    }
    qsort(m->regs, (size_t)m->n_regs, sizeof *m->regs, wreg_cmp);
    return 0;
}

/* ---- buffer pool ---------------------------------------------------------------------- */

static int32_t pool_new(metal_be *m, size_t nbytes, bool fresh, mf_error *err) {
    if (!fresh)
        for (int32_t i = 0; i < m->n_pool; i++)
            if (!m->pool[i].live && !m->pool[i].fresh && m->pool[i].buf && m->pool[i].bytes == nbytes) {
                m->pool[i].live = true;
                return i;
            }
    if (m->n_pool == m->cap_pool) {
        m->cap_pool = m->cap_pool ? 2 * m->cap_pool : 64;
        m->pool = realloc(m->pool, (size_t)m->cap_pool * sizeof *m->pool);
        MF_ASSERT(m->pool);
    }
    pbuf p = {.bytes = nbytes, .live = true, .fresh = fresh};
    p.buf = mf_mtl_buf_new(m->dev, nbytes, &p.host, err);
    if (!p.buf)
        return -1;
    m->pool[m->n_pool] = p;
    return m->n_pool++;
}

static int32_t metal_alloc_buffer(mf_backend *b, size_t nbytes, mf_error *err) {
    return pool_new(MB(b), nbytes, false, err);
}

static int32_t metal_alloc_fresh(mf_backend *b, size_t nbytes, mf_error *err) {
    return pool_new(MB(b), nbytes, true, err);
}

static void metal_free_buffer(mf_backend *b, int32_t id) {
    metal_be *m = MB(b);
    if (id >= 0 && id < m->n_pool)
        m->pool[id].live = false;
}

static pbuf *pb(metal_be *m, int32_t id) {
    return (id >= 0 && id < m->n_pool && m->pool[id].buf) ? &m->pool[id] : NULL;
}

/* read_host / write_host: views of the shared buffers. */
static int host_io(metal_be *m, int32_t id, size_t off, void *host, size_t n, bool write, mf_error *err) {
    pbuf *p = pb(m, id);
    if (!p)
        return mf_errorf(err, "metal: %s of unknown buffer %d", write ? "write_host" : "read_host", id);
    if (off > p->bytes || n > p->bytes - off)
        return mf_errorf(err, "metal: %s of [%zu, %zu) outside buffer %d of %zu bytes",
                         write ? "write_host" : "read_host", off, off + n, id, p->bytes);
    if (mf_mtl_dev_failed(m->dev))
        return mf_errorf(err, "metal: %s of buffer %d: the device failed earlier (its buffers may still be "
                              "in use by the GPU)", write ? "write_host" : "read_host", id);
    if (mf_mtl_dev_pending(m->dev))
        return mf_errorf(err, "metal: %s of buffer %d while a command buffer is open (synchronize first)",
                         write ? "write_host" : "read_host", id);
    if (write)
        memcpy((uint8_t *)p->host + off, host, n);
    else
        memcpy(host, (const uint8_t *)p->host + off, n);
    return 0;
}

static int metal_read_host(mf_backend *b, int32_t id, size_t off, void *dst, size_t n, mf_error *err) {
    return host_io(MB(b), id, off, dst, n, false, err);
}

static int metal_write_host(mf_backend *b, int32_t id, size_t off, const void *src, size_t n, mf_error *err) {
    return host_io(MB(b), id, off, (void *)src, n, true, err);
}

static void bury_scratch(metal_be *m) {
    for (int i = 0; i < m->n_grave; i++)
        mf_mtl_buf_free(m->grave[i]);
    m->n_grave = 0;
}

static int metal_synchronize(mf_backend *b, mf_error *err) {
    metal_be *m = MB(b);
    int rc = mf_mtl_submit(m->dev, err);
    bury_scratch(m);
    return rc;
}

/* A buffer the open command buffer may still read: freed at the next
 * submit. */
static void bury(metal_be *m, mf_mtl_buf *b) {
    if (m->n_grave == m->cap_grave) {
        m->cap_grave = m->cap_grave ? 2 * m->cap_grave : 8;
        m->grave = realloc(m->grave, (size_t)m->cap_grave * sizeof *m->grave);
        MF_ASSERT(m->grave);
    }
    m->grave[m->n_grave++] = b;
}

/* Scratch slot s of at least nbytes (its old buffer stays alive until the
 * open command buffer is submitted). */
static mf_mtl_buf *scratch(metal_be *m, int s, size_t nbytes, mf_error *err) {
    if (nbytes > m->scratch_n[s]) {
        void *host;
        size_t want = nbytes < 4096 ? 4096 : nbytes + nbytes / 4;
        mf_mtl_buf *nb = mf_mtl_buf_new(m->dev, want, &host, err);
        if (!nb)
            return NULL;
        if (m->scratch[s])
            bury(m, m->scratch[s]);
        m->scratch[s] = nb;
        m->scratch_n[s] = want;
    }
    return m->scratch[s];
}

/* ---- capability ------------------------------------------------------------------------ */

/* A matmul the kernels can run: a known weight type, whole 32-element chunks,
 * and for K-quants whole 256-element super-blocks (the chunk decoders index
 * super-blocks; a partial one would be read past its row). */
static bool mm_ok(const mf_matmul_meta *mm) {
    bool kq = false;
    if (wtype_index(mm->wtype, &kq) < 0 || mm->n_in <= 0 || mm->n_in % 32)
        return false;
    return !(kq && mm->n_in % 256);
}

static bool attn_ok(int32_t n_head, int32_t n_head_kv, int32_t head_dim) {
    return head_dim > 0 && head_dim <= 256 && n_head_kv > 0 && n_head % n_head_kv == 0;
}

static bool metal_can_run(const mf_backend *b, const mf_node *n) {
    const metal_be *m = MB(b);
    switch (n->op) {
    case MF_OP_INPUT:
    case MF_OP_ADD:
    case MF_OP_MUL:
    case MF_OP_SCALE:
    case MF_OP_SILU:
    case MF_OP_SWIGLU:
    case MF_OP_RMSNORM:
    case MF_OP_VIEW:
    case MF_OP_RESHAPE:
    case MF_OP_PERMUTE:
    case MF_OP_ROPE:
        return true;
    case MF_OP_QKNORM:
        return n->meta.norm.head_dim > 0;
    case MF_OP_KVCACHE_STORE:
    case MF_OP_KVCACHE_LOAD:
        return true;
    case MF_OP_ATTN: /* fused kernels only: unfused attention (-fa off) is the CPU's */
    case MF_OP_ATTN_PAGED:
        return !n->meta.attn.unfused &&
               attn_ok(n->meta.attn.n_head, n->meta.attn.n_head_kv, n->meta.attn.head_dim);
    case MF_OP_MATMUL:
        return mm_ok(&n->meta.matmul);
    case MF_OP_GETROWS:
        if (n->meta.getrows.mode == 1)
            return true;
        return wtype_index(n->meta.getrows.wtype, NULL) >= 0 && n->ne[0] % 32 == 0 &&
               mf_type_row_size(n->meta.getrows.wtype, n->ne[0]) != 0;
    case MF_OP_FUSED_QKV:
    case MF_OP_FUSED_QKV_NORM: {
        const mf_qkv_meta *q = &n->meta.qkv;
        if (n->op == MF_OP_FUSED_QKV ? !m->lv.fuse_qkv : !m->lv.fuse_qkv_norm)
            return false;
        return mm_ok(&q->q) && mm_ok(&q->k) && mm_ok(&q->v) && attn_ok(q->n_head, q->n_head_kv, q->head_dim);
    }
    case MF_OP_FUSED_FFN:
        return m->lv.fuse_ffn && mm_ok(&n->meta.ffn.gate) && mm_ok(&n->meta.ffn.up);
    default:
        /* SOFTMAX: the model graphs never emit it (attention does its own);
         * QKV_BIAS_ROPE_STORE: the CUDA epilogue fusion. Both go to the CPU. */
        return false;
    }
}

static bool metal_supports_fused(const mf_backend *b, mf_fused_kind kind) {
    const metal_be *m = MB(b);
    switch (kind) {
    case MF_FUSE_QKV:
        return m->lv.fuse_qkv;
    case MF_FUSE_QKV_NORM:
        return m->lv.fuse_qkv_norm;
    case MF_FUSE_FFN:
        return m->lv.fuse_ffn;
    case MF_FUSE_SWIGLU:
        return true;
    default:
        return false;
    }
}

/* ---- launching -------------------------------------------------------------------------- */

typedef struct xc { /* one execute_node call */
    metal_be *m;
    const mf_graph *g;
    int32_t id;
    const mf_node *n;
    const int32_t *in;
    int32_t out;
    mf_kv_pair kv;
    const mf_exec_args *a;
    mf_error *err;
} xc;

#define XERR(x, fmt, ...)                                                                          \
    mf_errorf((x)->err, "metal: node %d '%s' (%s): " fmt, (x)->id, (x)->n->name, mf_op_name((x)->n->op), \
              __VA_ARGS__)

static uint32_t cdiv(int64_t a, int64_t b) {
    return (uint32_t)((a + b - 1) / b);
}

/* Guards every launch against the limits queried at init: threads per
 * threadgroup against the pipeline's maximum, threadgroup memory against the
 * device's. */
static int launch(xc *x, int k, const mf_mtl_bind *bufs, int nb, const void *args, size_t args_len,
                  size_t tg_mem, uint32_t g0, uint32_t g1, uint32_t g2, uint32_t t0) {
    metal_be *m = x->m;
    uint32_t maxt = mf_mtl_dev_max_threads(m->dev, k);
    if (t0 > maxt)
        return XERR(x, "kernel %s needs %u threads per threadgroup, the pipeline allows %u", kernel_names[k],
                    t0, maxt);
    size_t maxm = mf_mtl_dev_max_tg_mem(m->dev);
    if (tg_mem > maxm)
        return XERR(x, "kernel %s needs %zu bytes of threadgroup memory, the device allows %zu",
                    kernel_names[k], tg_mem, maxm);
    if (!g0 || !g1 || !g2)
        return 0; /* nothing to do (an empty shape) */
    mf_mtl_launch l = {.kernel = k, .label = x->n->name, .n_bufs = nb, .args = args, .args_len = args_len,
                       .tg_mem = tg_mem, .grid = {g0, g1, g2}, .tg = {t0, 1, 1}};
    memcpy(l.bufs, bufs, (size_t)nb * sizeof *bufs);
    m->n_dispatch++;
    if (mf_mtl_dispatch(m->dev, &l, x->err))
        return -1;
    return 0;
}

static mf_mtl_bind B(mf_mtl_buf *b, size_t off) {
    return (mf_mtl_bind){b, off};
}

static mf_mtl_bind BID(xc *x, int32_t id) {
    pbuf *p = pb(x->m, id);
    return (mf_mtl_bind){p ? p->buf : x->m->dummy, 0};
}

static int ew(xc *x, int k, mf_mtl_bind a0, mf_mtl_bind a1, mf_mtl_bind y, int64_t n, int64_t n1, float s,
              bool two) {
    mf_mtl_ew_args a = {.n = n, .n1 = n1 > 0 ? n1 : 1, .s = s};
    mf_mtl_bind bufs[3] = {a0, two ? a1 : y, y};
    return launch(x, k, bufs, two ? 3 : 2, &a, sizeof a, 0, cdiv(n, 256), 1, 1, 256);
}

static int copy2d(xc *x, mf_mtl_bind src, mf_mtl_bind dst, int64_t rows, int64_t width, int64_t sstride,
                  int64_t dstride, int64_t soff) {
    mf_mtl_copy_args a = {.rows = rows, .width = width, .src_stride = sstride, .dst_stride = dstride,
                          .src_off = soff};
    mf_mtl_bind bufs[2] = {src, dst};
    return launch(x, KN_copy2d, bufs, 2, &a, sizeof a, 0, cdiv(width, 256), (uint32_t)rows, 1, 256);
}

/* ---- weights at execute time ---------------------------------------------------------- */

static const wreg *weight(xc *x, const char *name, uint32_t type, int64_t ne0, int64_t ne1) {
    const wreg *r = find_weight(x->m, name);
    if (!r) {
        XERR(x, "weight '%s' not on GPU", name ? name : "(null)");
        return NULL;
    }
    if (r->type != type) {
        XERR(x, "weight '%s' is %s, node expects %s", name, mf_type_name(r->type), mf_type_name(type));
        return NULL;
    }
    if (r->ne[0] != ne0 || (ne1 >= 0 && r->ne[1] != ne1) || r->ne[2] != 1 || r->ne[3] != 1) {
        XERR(x, "weight '%s' has shape [%lld, %lld, %lld, %lld], node needs [%lld, %lld]", name,
             (long long)r->ne[0], (long long)r->ne[1], (long long)r->ne[2], (long long)r->ne[3],
             (long long)ne0, (long long)ne1);
        return NULL;
    }
    return r;
}

/* A vector weight of n floats (registered as f32). */
static const wreg *vec_weight(xc *x, const char *name, int64_t n) {
    const wreg *r = find_weight(x->m, name);
    if (!r) {
        XERR(x, "weight '%s' not on GPU", name ? name : "(null)");
        return NULL;
    }
    if (r->type != MF_TYPE_F32 || r->ne[0] * r->ne[1] * r->ne[2] * r->ne[3] != n) {
        XERR(x, "weight '%s' is %s with %lld elements, node needs %lld f32", name, mf_type_name(r->type),
             (long long)(r->ne[0] * r->ne[1] * r->ne[2] * r->ne[3]), (long long)n);
        return NULL;
    }
    return r;
}

/* ---- matmul: the GEMV / GEMM tiers --------------------------------------------------- */

static bool use_gemm(const metal_be *m, int64_t nt, int64_t n_out) {
    if (nt < 2 || m->lv.gemm == 0)
        return false;
    if (m->lv.gemm == 1)
        return true;
    return n_out >= 2048 || nt >= 9;
}

/* y (nt rows of mm->n_out) = W x (+ bias); y must not alias x. */
static int matmul_into(xc *x, const mf_matmul_meta *mm, mf_mtl_bind xb, mf_mtl_bind yb, int64_t nt) {
    bool kq = false;
    int wi = wtype_index(mm->wtype, &kq);
    if (wi < 0 || mm->n_in % 32)
        return XERR(x, "weight '%s': %s rows of %lld are not supported (whole 32-element chunks needed)",
                    mm->weight, mf_type_name(mm->wtype), (long long)mm->n_in);
    if (kq && mm->n_in % 256)
        return XERR(x, "weight '%s': %s rows of K = %lld: K %% 256 = %lld, the K-quant kernels need whole "
                    "super-blocks (force the CPU with MINFER_DISABLE_METAL=1)",
                    mm->weight, mf_type_name(mm->wtype), (long long)mm->n_in, (long long)(mm->n_in % 256));
    const wreg *w = weight(x, mm->weight, mm->wtype, mm->n_in, mm->n_out);
    if (!w)
        return -1;
    const wreg *bias = mm->bias ? vec_weight(x, mm->bias, mm->n_out) : NULL;
    if (mm->bias && !bias)
        return -1;
    mf_mtl_mm_args a = {.row_bytes = (int64_t)mf_type_row_size(mm->wtype, mm->n_in), .n_in = (int32_t)mm->n_in,
                        .n_out = (int32_t)mm->n_out, .nt = (int32_t)nt, .has_bias = bias != NULL};
    mf_mtl_bind bufs[4] = {B(w->buf, w->offset), xb, yb,
                           bias ? B(bias->buf, bias->offset) : B(x->m->dummy, 0)};
    if (use_gemm(x->m, nt, mm->n_out))
        return launch(x, KN_gemm_f32 + wi, bufs, 4, &a, sizeof a, 2 * 32 * 32 * sizeof(float),
                      cdiv(mm->n_out, 32), cdiv(nt, 32), 1, 128);
    return launch(x, KN_gemv_f32 + wi, bufs, 4, &a, sizeof a, 0, cdiv(mm->n_out, 4), 1, 1, 128);
}

static int op_matmul(xc *x) {
    const mf_matmul_meta *mm = &x->n->meta.matmul;
    int64_t nt = x->n->ne[1];
    size_t bytes = (size_t)(mm->n_out * nt) * sizeof(float);
    if (x->out != x->in[0])
        return matmul_into(x, mm, BID(x, x->in[0]), BID(x, x->out), nt);
    mf_mtl_buf *s = scratch(x->m, 0, bytes, x->err);
    if (!s || matmul_into(x, mm, BID(x, x->in[0]), B(s, 0), nt))
        return -1;
    return copy2d(x, B(s, 0), BID(x, x->out), 1, mm->n_out * nt, 0, 0, 0);
}

/* The fused decode GEMVs: n (3: q, k, v packed per token; 2 with swiglu:
 * gate and up into silu(gate) * up) weights of one type and one K. */
static int matmul3_into(xc *x, const mf_matmul_meta *const *mm, int n, mf_mtl_bind xb, mf_mtl_bind yb,
                        int64_t nt, bool swiglu) {
    bool kq = false;
    int wi = wtype_index(mm[0]->wtype, &kq);
    if (wi < 0 || mm[0]->n_in % 32 || (kq && mm[0]->n_in % 256))
        return XERR(x, "weight '%s': %s rows of K = %lld cannot be fused", mm[0]->weight,
                    mf_type_name(mm[0]->wtype), (long long)mm[0]->n_in);
    mf_mtl_mm3_args a = {.row_bytes = (int64_t)mf_type_row_size(mm[0]->wtype, mm[0]->n_in),
                         .n_in = (int32_t)mm[0]->n_in, .nt = (int32_t)nt};
    mf_mtl_bind w[3], bias[3];
    int32_t *nr[3] = {&a.n0, &a.n1, &a.n2};
    for (int j = 0; j < 3; j++) {
        w[j] = bias[j] = B(x->m->dummy, 0);
        if (j >= n)
            continue;
        if (mm[j]->wtype != mm[0]->wtype || mm[j]->n_in != mm[0]->n_in)
            return XERR(x, "fused weights '%s' (%s, K %lld) and '%s' (%s, K %lld) differ", mm[0]->weight,
                        mf_type_name(mm[0]->wtype), (long long)mm[0]->n_in, mm[j]->weight,
                        mf_type_name(mm[j]->wtype), (long long)mm[j]->n_in);
        const wreg *r = weight(x, mm[j]->weight, mm[j]->wtype, mm[j]->n_in, mm[j]->n_out);
        if (!r)
            return -1;
        w[j] = B(r->buf, r->offset);
        *nr[j] = (int32_t)mm[j]->n_out;
        if (mm[j]->bias) {
            const wreg *b = vec_weight(x, mm[j]->bias, mm[j]->n_out);
            if (!b)
                return -1;
            bias[j] = B(b->buf, b->offset);
            a.has_bias |= 1 << j;
        }
    }
    if (swiglu) {
        mf_mtl_bind bufs[6] = {w[0], w[1], xb, yb, bias[0], bias[1]};
        return launch(x, KN_gemv_swiglu_f32 + wi, bufs, 6, &a, sizeof a, 0, cdiv(a.n0, 4), 1, 1, 128);
    }
    mf_mtl_bind bufs[8] = {w[0], w[1], w[2], xb, yb, bias[0], bias[1], bias[2]};
    return launch(x, KN_gemv3_f32 + wi, bufs, 8, &a, sizeof a, 0, cdiv((int64_t)a.n0 + a.n1 + a.n2, 4), 1, 1, 128);
}

/* ---- the other ops ---------------------------------------------------------------------- */

static int op_binary(xc *x) {
    const mf_node *n = x->n;
    int64_t nel = mf_node_nelem(n);
    int k = n->op == MF_OP_ADD ? KN_add : n->op == MF_OP_MUL ? KN_mul : KN_swiglu;
    int64_t n1 = mf_node_nelem(&x->g->nodes[n->src[1]]);
    if (n->op != MF_OP_MUL && n1 != nel)
        return XERR(x, "src1 has %lld elements, src0 %lld", (long long)n1, (long long)nel);
    if (n->op == MF_OP_MUL && nel % n1)
        return XERR(x, "src1 of %lld elements does not broadcast over %lld", (long long)n1, (long long)nel);
    return ew(x, k, BID(x, x->in[0]), BID(x, x->in[1]), BID(x, x->out), nel, n1, 0.0f, true);
}

static int op_unary(xc *x) {
    const mf_node *n = x->n;
    int k = n->op == MF_OP_SCALE ? KN_scale : KN_silu;
    return ew(x, k, BID(x, x->in[0]), B(NULL, 0), BID(x, x->out), mf_node_nelem(n), 0,
              n->op == MF_OP_SCALE ? n->meta.scale.s : 0.0f, false);
}

static int norm_rows(xc *x, mf_mtl_bind src, mf_mtl_bind dst, const char *wname, int64_t w, int64_t rows,
                     float eps) {
    const wreg *wt = wname ? vec_weight(x, wname, w) : NULL;
    if (wname && !wt)
        return -1;
    mf_mtl_norm_args a = {.rows = rows, .w = (int32_t)w, .eps = eps, .has_w = wt != NULL};
    uint32_t nsg = cdiv(w, 32);
    if (nsg > 8)
        nsg = 8;
    mf_mtl_bind bufs[3] = {src, wt ? B(wt->buf, wt->offset) : B(x->m->dummy, 0), dst};
    return launch(x, KN_rmsnorm, bufs, 3, &a, sizeof a, 32 * sizeof(float), (uint32_t)rows, 1, 1, nsg * 32);
}

static int op_norm(xc *x) {
    const mf_node *n = x->n;
    int64_t w = n->op == MF_OP_QKNORM ? n->meta.norm.head_dim : n->ne[0];
    int64_t nel = mf_node_nelem(n);
    if (w <= 0 || nel % w)
        return XERR(x, "%lld elements are not rows of %lld", (long long)nel, (long long)w);
    return norm_rows(x, BID(x, x->in[0]), BID(x, x->out), n->meta.norm.weight, w, nel / w, n->meta.norm.eps);
}

static int rope_rows(xc *x, mf_mtl_bind v, mf_mtl_bind pos, const mf_rope_meta *r, int64_t nt) {
    if (r->n_rot <= 0 || r->n_rot % 2 || r->n_rot > r->head_dim)
        return XERR(x, "n_rot %d for head_dim %d", r->n_rot, r->head_dim);
    mf_mtl_rope_args a = {.nt = (int32_t)nt, .n_head = r->n_head, .head_dim = r->head_dim, .n_rot = r->n_rot,
                          .neox = (r->mode & 2) != 0, .freq_scale = r->freq_scale,
                          .log_theta_step = (float)(-2.0 * log((double)r->theta) / (double)r->n_rot)};
    mf_mtl_bind bufs[3] = {v, pos, v};
    return launch(x, KN_rope, bufs, 3, &a, sizeof a, 0, cdiv((int64_t)r->n_head * r->n_rot / 2, 64),
                  (uint32_t)nt, 1, 64);
}

static int op_rope(xc *x) {
    const mf_node *n = x->n;
    const mf_rope_meta *r = &n->meta.rope;
    if ((int64_t)r->n_head * r->head_dim != n->ne[0])
        return XERR(x, "%d heads of %d for rows of %lld", r->n_head, r->head_dim, (long long)n->ne[0]);
    if (x->out != x->in[0] && copy2d(x, BID(x, x->in[0]), BID(x, x->out), 1, mf_node_nelem(n), 0, 0, 0))
        return -1;
    return rope_rows(x, BID(x, x->out), BID(x, x->in[1]), r, n->ne[1]);
}

static int op_getrows(xc *x) {
    const mf_node *n = x->n;
    const int64_t d = n->ne[0], nr = n->ne[1];
    const size_t bytes = (size_t)(d * nr) * sizeof(float);
    const bool alias = x->out == x->in[0];
    mf_mtl_buf *s = alias ? scratch(x->m, 0, bytes, x->err) : NULL;
    if (alias && !s)
        return -1;
    mf_mtl_bind dst = alias ? B(s, 0) : BID(x, x->out);
    if (n->meta.getrows.mode == 1) {
        const mf_node *a0 = &x->g->nodes[n->src[0]];
        if (n->meta.getrows.first < 0 || n->meta.getrows.first + nr > a0->ne[1])
            return XERR(x, "rows [%lld, %lld) of %lld", (long long)n->meta.getrows.first,
                        (long long)(n->meta.getrows.first + nr), (long long)a0->ne[1]);
        if (copy2d(x, BID(x, x->in[0]), dst, nr, d, a0->ne[0], d, n->meta.getrows.first * a0->ne[0]))
            return -1;
    } else {
        bool kq;
        int wi = wtype_index(n->meta.getrows.wtype, &kq);
        if (wi < 0 || d % 32 || (kq && d % 256))
            return XERR(x, "%s rows of %lld cannot be gathered", mf_type_name(n->meta.getrows.wtype), (long long)d);
        const wreg *w = weight(x, n->meta.getrows.weight, n->meta.getrows.wtype, d, -1);
        if (!w)
            return -1;
        /* ids from a graph input sit in shared memory, written before the
         * split: checked here, so a bad one is an error naming it, not a row
         * the kernel leaves unwritten */
        const pbuf *ip = pb(x->m, x->in[0]);
        if (ip && x->g->nodes[n->src[0]].op == MF_OP_INPUT && ip->bytes >= (size_t)nr * sizeof(int32_t)) {
            const int32_t *ids = ip->host;
            for (int64_t t = 0; t < nr; t++)
                if (ids[t] < 0 || ids[t] >= w->ne[1])
                    return XERR(x, "token id %d at row %lld outside [0, %lld) of '%s'", ids[t], (long long)t,
                                (long long)w->ne[1], n->meta.getrows.weight);
        }
        mf_mtl_getrows_args a = {.row_bytes = (int64_t)mf_type_row_size(w->type, d), .n_rows = w->ne[1],
                                 .d = (int32_t)d, .nt = (int32_t)nr};
        mf_mtl_bind bufs[3] = {B(w->buf, w->offset), BID(x, x->in[0]), dst};
        if (launch(x, KN_getrows_f32 + wi, bufs, 3, &a, sizeof a, 0, cdiv(d / 32, 64), (uint32_t)nr, 1, 64))
            return -1;
    }
    return alias ? copy2d(x, dst, BID(x, x->out), 1, d * nr, 0, 0, 0) : 0;
}

static int op_view(xc *x) {
    const mf_node *n = x->n;
    const mf_node *a0 = &x->g->nodes[n->src[0]];
    const int64_t rows = mf_node_nelem(n) / n->ne[0];
    if (n->meta.view.offset < 0 || n->meta.view.offset + n->ne[0] > a0->ne[0])
        return XERR(x, "columns [%lld, %lld) of %lld", (long long)n->meta.view.offset,
                    (long long)(n->meta.view.offset + n->ne[0]), (long long)a0->ne[0]);
    if (x->out != x->in[0])
        return copy2d(x, BID(x, x->in[0]), BID(x, x->out), rows, n->ne[0], a0->ne[0], n->ne[0], n->meta.view.offset);
    mf_mtl_buf *s = scratch(x->m, 0, (size_t)(rows * n->ne[0]) * sizeof(float), x->err);
    if (!s || copy2d(x, BID(x, x->in[0]), B(s, 0), rows, n->ne[0], a0->ne[0], n->ne[0], n->meta.view.offset))
        return -1;
    return copy2d(x, B(s, 0), BID(x, x->out), 1, rows * n->ne[0], 0, 0, 0);
}

static int op_permute(xc *x) {
    const mf_node *n = x->n;
    const mf_node *a0 = &x->g->nodes[n->src[0]];
    int64_t ss[4] = {1, a0->ne[0], a0->ne[0] * a0->ne[1], a0->ne[0] * a0->ne[1] * a0->ne[2]};
    mf_mtl_permute_args a;
    for (int d = 0; d < 4; d++) {
        int ax = n->meta.permute.axes[d];
        if (ax < 0 || ax > 3)
            return XERR(x, "axis %d of output dim %d", ax, d);
        a.ne[d] = n->ne[d];
        a.st[d] = ss[ax];
    }
    int64_t nel = mf_node_nelem(n);
    const bool alias = x->out == x->in[0];
    mf_mtl_buf *s = alias ? scratch(x->m, 0, (size_t)nel * sizeof(float), x->err) : NULL;
    if (alias && !s)
        return -1;
    mf_mtl_bind bufs[2] = {BID(x, x->in[0]), alias ? B(s, 0) : BID(x, x->out)};
    if (launch(x, KN_permute, bufs, 2, &a, sizeof a, 0, cdiv(nel, 256), 1, 1, 256))
        return -1;
    return alias ? copy2d(x, B(s, 0), BID(x, x->out), 1, nel, 0, 0, 0) : 0;
}

/* ---- KV cache and attention ---------------------------------------------------------- */

static int kv_kind(xc *x, size_t *row_bytes) {
    uint32_t t = x->a->k_type;
    *row_bytes = mf_type_row_size(t, x->g->kv_dim);
    if (t == MF_TYPE_F32)
        return 0;
    if (t == MF_TYPE_F16)
        return 1;
    if (t == MF_TYPE_Q8_0 && x->g->kv_dim % 32 == 0)
        return 2;
    XERR(x, "KV cache type %s with kv_dim %lld is not supported (f32, f16, q8_0 with kv_dim %% 32 == 0)",
         mf_type_name(t), (long long)x->g->kv_dim);
    return -1;
}

static int check_kv(xc *x, int64_t nt) {
    if (x->a->v_type != x->a->k_type) /* the runtime refuses it first; this guards direct callers */
        return XERR(x, "K cache type %s and V cache type %s differ; this backend keeps one type for both",
                    mf_type_name(x->a->k_type), mf_type_name(x->a->v_type));
    if (x->kv.k < 0 || x->kv.v < 0 || !pb(x->m, x->kv.k) || !pb(x->m, x->kv.v))
        return XERR(x, "no KV regions for layer %d", mf_node_kv_layer(x->n));
    if (x->a->n_past < 0 || x->a->n_past + nt > x->a->n_ctx)
        return XERR(x, "positions [%d, %lld) outside the context of %d", x->a->n_past,
                    (long long)(x->a->n_past + nt), x->a->n_ctx);
    size_t rb = mf_type_row_size(x->a->k_type, x->g->kv_dim);
    size_t need = rb * (size_t)x->a->n_ctx;
    if (pb(x->m, x->kv.k)->bytes < need || pb(x->m, x->kv.v)->bytes < need)
        return XERR(x, "KV regions of %zu / %zu bytes, %d rows of %zu need %zu", pb(x->m, x->kv.k)->bytes,
                    pb(x->m, x->kv.v)->bytes, x->a->n_ctx, rb, need);
    return 0;
}

static int kv_store(xc *x, mf_mtl_bind k, mf_mtl_bind v, int64_t nt) {
    size_t rb;
    int kind = kv_kind(x, &rb);
    if (kind < 0 || check_kv(x, nt))
        return -1;
    mf_mtl_kv_args a = {.row_bytes = (int64_t)rb, .kv_dim = (int32_t)x->g->kv_dim, .pos0 = x->a->n_past,
                        .nt = (int32_t)nt};
    mf_mtl_bind bk[2] = {k, BID(x, x->kv.k)}, bv[2] = {v, BID(x, x->kv.v)};
    if (kind == 2)
        return launch(x, KN_kv_store_q8_0, bk, 2, &a, sizeof a, 0, (uint32_t)(x->g->kv_dim / 32), (uint32_t)nt, 1, 32) ||
               launch(x, KN_kv_store_q8_0, bv, 2, &a, sizeof a, 0, (uint32_t)(x->g->kv_dim / 32), (uint32_t)nt, 1, 32)
                   ? -1 : 0;
    int kn = kind ? KN_kv_store_f16 : KN_kv_store_f32;
    return launch(x, kn, bk, 2, &a, sizeof a, 0, cdiv(x->g->kv_dim, 256), (uint32_t)nt, 1, 256) ||
           launch(x, kn, bv, 2, &a, sizeof a, 0, cdiv(x->g->kv_dim, 256), (uint32_t)nt, 1, 256) ? -1 : 0;
}

static int op_kv_store(xc *x) {
    const mf_node *k = &x->g->nodes[x->n->src[0]], *v = &x->g->nodes[x->n->src[1]];
    if (k->ne[0] != x->g->kv_dim || v->ne[0] != x->g->kv_dim || k->ne[1] != v->ne[1])
        return XERR(x, "K %lldx%lld / V %lldx%lld for kv_dim %lld", (long long)k->ne[0], (long long)k->ne[1],
                    (long long)v->ne[0], (long long)v->ne[1], (long long)x->g->kv_dim);
    return kv_store(x, BID(x, x->in[0]), BID(x, x->in[1]), k->ne[1]);
}

static int op_kv_load(xc *x) {
    size_t rb;
    int kind = kv_kind(x, &rb);
    if (kind < 0 || check_kv(x, 0))
        return -1;
    if (x->n->ne[1] > x->a->n_ctx || x->n->ne[0] != x->g->kv_dim)
        return XERR(x, "%lld rows of %lld from a %d-row cache of kv_dim %lld", (long long)x->n->ne[1],
                    (long long)x->n->ne[0], x->a->n_ctx, (long long)x->g->kv_dim);
    mf_mtl_kv_args a = {.row_bytes = (int64_t)rb, .kv_dim = (int32_t)x->g->kv_dim, .nt = (int32_t)x->n->ne[1]};
    mf_mtl_bind bufs[2] = {BID(x, x->n->meta.kv.which ? x->kv.v : x->kv.k), BID(x, x->out)};
    int kn = kind == 2 ? KN_kv_load_q8_0 : kind ? KN_kv_load_f16 : KN_kv_load_f32;
    return launch(x, kn, bufs, 2, &a, sizeof a, 0, cdiv(x->g->kv_dim, 256), (uint32_t)x->n->ne[1], 1, 256);
}

static int attention(xc *x, mf_mtl_bind q, mf_mtl_bind y, int32_t n_head, int32_t n_head_kv, int32_t hd,
                     float scl, int64_t nt) {
    size_t rb;
    int kind = kv_kind(x, &rb);
    if (kind < 0 || check_kv(x, nt))
        return -1;
    /* The kernels stride the cache by kv_dim = n_head_kv * head_dim and keep
     * head_dim / 32 values per lane: any other shape would read out of
     * bounds. */
    if (!attn_ok(n_head, n_head_kv, hd) || (int64_t)n_head_kv * hd != x->g->kv_dim)
        return XERR(x, "attention shape %d heads / %d KV heads of %d (kv_dim %lld): needs n_head %% n_head_kv "
                    "== 0, head_dim <= 256 and n_head_kv * head_dim == kv_dim",
                    n_head, n_head_kv, hd, (long long)x->g->kv_dim);
    const int64_t n_kv = x->a->n_past + nt;
    int chunk = x->m->lv.attn_chunk > 0 ? x->m->lv.attn_chunk : 32;
    while (cdiv(n_kv, chunk) > 32)
        chunk *= 2;
    const int n_chunks = (int)cdiv(n_kv, chunk);
    mf_mtl_attn_args a = {.row_bytes = (int64_t)rb, .nt = (int32_t)nt, .n_past = x->a->n_past, .n_head = n_head,
                          .n_head_kv = n_head_kv, .head_dim = hd, .chunk = chunk, .n_chunks = n_chunks,
                          .scale = scl};
    size_t part_bytes = (size_t)nt * (size_t)n_head * (size_t)n_chunks * (size_t)(hd + 2) * sizeof(float);
    mf_mtl_buf *part = scratch(x->m, 3, part_bytes, x->err);
    if (!part)
        return -1;
    mf_mtl_bind b1[4] = {q, BID(x, x->kv.k), BID(x, x->kv.v), B(part, 0)};
    int kn = kind == 2 ? KN_attn_part_q8_0 : kind ? KN_attn_part_f16 : KN_attn_part_f32;
    if (launch(x, kn, b1, 4, &a, sizeof a, 0, (uint32_t)n_chunks, (uint32_t)n_head, (uint32_t)nt, 32))
        return -1;
    mf_mtl_bind b2[2] = {B(part, 0), y};
    return launch(x, KN_attn_combine, b2, 2, &a, sizeof a, 0, (uint32_t)n_head, (uint32_t)nt, 1, 32);
}

static int op_attn(xc *x) {
    const mf_attn_meta *m = &x->n->meta.attn;
    if ((int64_t)m->n_head * m->head_dim != x->n->ne[0])
        return XERR(x, "%d heads of %d for rows of %lld", m->n_head, m->head_dim, (long long)x->n->ne[0]);
    return attention(x, BID(x, x->in[0]), BID(x, x->out), m->n_head, m->n_head_kv, m->head_dim, m->scale,
                     x->n->ne[1]);
}

/* The forward's batch in paged.metal's layout, into m->paged_host; returns
 * its ints, or -1 (err) for a token without a sequence, a position or a
 * table, or a negative block id. */
static int64_t paged_build(xc *x, const mf_kv_batch *kb) {
    metal_be *m = x->m;
    const int32_t nt = kb->n_tokens, bs = kb->block_size;
    int32_t *need = mf_calloc((size_t)kb->n_seqs, sizeof *need); /* max pos + 1 per sequence */
    for (int32_t t = 0; t < nt; t++) {
        const int32_t s = kb->seq[t];
        if (s < 0 || s >= kb->n_seqs || kb->pos[t] < 0 || !kb->tables[s]) {
            free(need);
            return XERR(x, "batch token %d: sequence %d of %d at position %d (no block table)", t, s,
                        kb->n_seqs, kb->pos[t]);
        }
        need[s] = kb->pos[t] + 1 > need[s] ? kb->pos[t] + 1 : need[s];
    }
    int64_t n_blocks = 0;
    for (int32_t s = 0; s < kb->n_seqs; s++)
        n_blocks += (need[s] + bs - 1) / bs;
    const int64_t n = 2 * (int64_t)nt + kb->n_seqs + n_blocks;
    if (n > INT32_MAX) {
        free(need);
        return XERR(x, "a paged batch of %lld ints", (long long)n);
    }
    if (m->paged_host_cap < (size_t)n) {
        free(m->paged_host);
        m->paged_host_cap = (size_t)n + (size_t)n / 2 + 64;
        m->paged_host = mf_malloc(m->paged_host_cap * sizeof *m->paged_host);
    }
    int32_t *h = m->paged_host, *off = h + 2 * (int64_t)nt, *blk = off + kb->n_seqs;
    memcpy(h, kb->seq, (size_t)nt * sizeof *h);
    memcpy(h + nt, kb->pos, (size_t)nt * sizeof *h);
    int64_t k = 0, max_block = 0;
    for (int32_t s = 0; s < kb->n_seqs; s++) {
        off[s] = (int32_t)k;
        for (int32_t b = 0; b < (need[s] + bs - 1) / bs; b++) {
            const int32_t id = kb->tables[s][b];
            if (id < 0) {
                free(need);
                return XERR(x, "sequence %d: block %d of its table is %d", s, b, id);
            }
            max_block = id > max_block ? id : max_block;
            blk[k++] = id;
        }
    }
    free(need);
    m->paged_max_block = max_block;
    return n;
}

/* The batch on the device: built each call (cheap: a few ints a token and a
 * block), uploaded only when it differs from the buffer's, so the layers of
 * one forward share one upload. A buffer the open command buffer may read is
 * never rewritten: a new one takes its place. */
static int paged_upload(xc *x, const mf_kv_batch *kb) {
    metal_be *m = x->m;
    const int64_t n = paged_build(x, kb);
    if (n < 0)
        return -1;
    const size_t bytes = (size_t)n * sizeof(int32_t);
    if (m->paged && m->paged_n == (size_t)n && !memcmp(m->paged_dev, m->paged_host, bytes))
        return 0;
    if (!m->paged || m->paged_cap < (size_t)n || mf_mtl_dev_pending(m->dev)) {
        const size_t cap = (size_t)n + (size_t)n / 2 + 1024;
        void *host;
        mf_mtl_buf *nb = mf_mtl_buf_new(m->dev, cap * sizeof(int32_t), &host, x->err);
        if (!nb)
            return -1;
        if (m->paged) {
            if (mf_mtl_dev_pending(m->dev))
                bury(m, m->paged);
            else
                mf_mtl_buf_free(m->paged);
        }
        m->paged = nb;
        m->paged_dev = host;
        m->paged_cap = cap;
    }
    memcpy(m->paged_dev, m->paged_host, bytes);
    m->paged_n = (size_t)n;
    return 0;
}

/* ATTN_PAGED: each token's K/V rows into its sequence's slot, then causal
 * GQA attention of each token over its own sequence's blocks. */
static int op_attn_paged(xc *x) {
    const mf_node *n = x->n;
    const mf_attn_meta *am = &n->meta.attn;
    const mf_kv_batch *kb = x->a->batch;
    const int64_t nt = n->ne[1];
    if (!attn_ok(am->n_head, am->n_head_kv, am->head_dim) || (int64_t)am->n_head * am->head_dim != n->ne[0] ||
        (int64_t)am->n_head_kv * am->head_dim != x->g->kv_dim)
        return XERR(x, "n_head %d n_head_kv %d head_dim %d for width %lld, kv_dim %lld: needs n_head %% "
                    "n_head_kv == 0 and head_dim <= 256", am->n_head, am->n_head_kv, am->head_dim,
                    (long long)n->ne[0], (long long)x->g->kv_dim);
    if (!kb || kb->n_tokens != nt || kb->block_size <= 0 || kb->n_seqs <= 0 || !kb->seq || !kb->pos ||
        !kb->tables)
        return XERR(x, "a paged forward of %lld tokens without its batch (%d tokens, %d sequences, block size %d)",
                    (long long)nt, kb ? kb->n_tokens : 0, kb ? kb->n_seqs : 0, kb ? kb->block_size : 0);
    size_t rb;
    const int kind = kv_kind(x, &rb);
    if (kind < 0)
        return -1;
    if (x->kv.k < 0 || x->kv.v < 0 || !pb(x->m, x->kv.k) || !pb(x->m, x->kv.v))
        return XERR(x, "no KV regions for layer %d", am->layer);
    if (nt <= 0)
        return 0;
    if (paged_upload(x, kb))
        return -1;
    const size_t pool = rb * (size_t)(x->m->paged_max_block + 1) * (size_t)kb->block_size;
    if (pb(x->m, x->kv.k)->bytes < pool || pb(x->m, x->kv.v)->bytes < pool)
        return XERR(x, "KV pools of %zu / %zu bytes, block %lld of %d rows of %zu needs %zu",
                    pb(x->m, x->kv.k)->bytes, pb(x->m, x->kv.v)->bytes, (long long)x->m->paged_max_block,
                    kb->block_size, rb, pool);
    const mf_mtl_paged_args a = {.row_bytes = (int64_t)rb, .nt = (int32_t)nt, .n_seqs = kb->n_seqs,
                                 .n_head = am->n_head, .n_head_kv = am->n_head_kv, .head_dim = am->head_dim,
                                 .kv_dim = (int32_t)x->g->kv_dim, .block_size = kb->block_size,
                                 .scale = am->scale};
    const mf_mtl_bind bt = B(x->m->paged, 0), kc = BID(x, x->kv.k), vc = BID(x, x->kv.v);
    const mf_mtl_bind bs[5] = {BID(x, x->in[1]), BID(x, x->in[2]), kc, vc, bt};
    const int rc = kind == 2 ? launch(x, KN_paged_store_q8_0, bs, 5, &a, sizeof a, 0,
                                      (uint32_t)(x->g->kv_dim / 32), (uint32_t)nt, 1, 32)
                             : launch(x, kind ? KN_paged_store_f16 : KN_paged_store_f32, bs, 5, &a, sizeof a, 0,
                                      cdiv(x->g->kv_dim, 256), (uint32_t)nt, 1, 256);
    if (rc)
        return -1;
    const mf_mtl_bind ba[5] = {BID(x, x->in[0]), kc, vc, bt, BID(x, x->out)};
    const int kn = kind == 2 ? KN_paged_attn_q8_0 : kind ? KN_paged_attn_f16 : KN_paged_attn_f32;
    return launch(x, kn, ba, 5, &a, sizeof a, 0, (uint32_t)am->n_head, (uint32_t)nt, 1, 32);
}

/* ---- the decode fusions ----------------------------------------------------------------- */

/* FUSED_QKV / FUSED_QKV_NORM: the three projections into scratch (the output
 * may alias x), biases in the matmul epilogue, the per-head Q/K norms
 * (QKV_NORM), RoPE of Q and K, the K/V store, and Q copied out. */
static int op_fused_qkv(xc *x) {
    const mf_node *n = x->n;
    const mf_qkv_meta *q = &n->meta.qkv;
    const int64_t nt = n->ne[1];
    const mf_rope_meta *rq = &q->rope_q, *rk = &q->rope_k;
    if ((int64_t)rq->n_head * rq->head_dim != q->q.n_out || (int64_t)rk->n_head * rk->head_dim != x->g->kv_dim ||
        q->k.n_out != x->g->kv_dim || q->v.n_out != x->g->kv_dim || q->q.n_out != n->ne[0])
        return XERR(x, "rope q %dx%d / k %dx%d for q/k/v widths %lld/%lld/%lld, kv_dim %lld", rq->n_head,
                    rq->head_dim, rk->n_head, rk->head_dim, (long long)q->q.n_out, (long long)q->k.n_out,
                    (long long)q->v.n_out, (long long)x->g->kv_dim);
    if (check_kv(x, nt))
        return -1;
    mf_mtl_buf *sq = scratch(x->m, 0, (size_t)((q->q.n_out + q->k.n_out + q->v.n_out) * nt) * sizeof(float), x->err);
    mf_mtl_buf *sk = sq ? scratch(x->m, 1, (size_t)(q->k.n_out * nt) * sizeof(float), x->err) : NULL;
    mf_mtl_buf *sv = sk ? scratch(x->m, 2, (size_t)(q->v.n_out * nt) * sizeof(float), x->err) : NULL;
    if (!sv)
        return -1;
    mf_mtl_bind xb = BID(x, x->in[0]), pos = BID(x, x->in[1]);
    mf_mtl_bind bq = B(sq, 0), bk = B(sk, 0), bv = B(sv, 0);
    if (nt == 1 && q->q.wtype == q->k.wtype && q->q.wtype == q->v.wtype) {
        /* decode: one GEMV for the three projections into one packed row
         * q | k | v (scratch 0), the rest works on views of it */
        int rc = matmul3_into(x, (const mf_matmul_meta *[]){&q->q, &q->k, &q->v}, 3, xb, B(sq, 0), nt, false);
        if (rc)
            return rc;
        bk = B(sq, (size_t)q->q.n_out * sizeof(float));
        bv = B(sq, (size_t)(q->q.n_out + q->k.n_out) * sizeof(float));
    } else if (matmul_into(x, &q->q, xb, bq, nt) || matmul_into(x, &q->k, xb, bk, nt) ||
               matmul_into(x, &q->v, xb, bv, nt)) {
        return -1;
    }
    if (n->op == MF_OP_FUSED_QKV_NORM || (q->q_norm && q->k_norm)) {
        if (norm_rows(x, bq, bq, q->q_norm, q->head_dim, nt * q->n_head, q->norm_eps) ||
            norm_rows(x, bk, bk, q->k_norm, q->head_dim, nt * q->n_head_kv, q->norm_eps))
            return -1;
    }
    if (rope_rows(x, bq, pos, rq, nt) || rope_rows(x, bk, pos, rk, nt))
        return -1;
    if (kv_store(x, bk, bv, nt))
        return -1;
    return copy2d(x, bq, BID(x, x->out), 1, q->q.n_out * nt, 0, 0, 0);
}

static int op_fused_ffn(xc *x) {
    const mf_ffn_meta *f = &x->n->meta.ffn;
    const int64_t nt = x->n->ne[1], nf = f->gate.n_out;
    if (f->up.n_out != nf || f->up.n_in != f->gate.n_in || x->n->ne[0] != nf)
        return XERR(x, "gate %lldx%lld / up %lldx%lld for an output of %lld", (long long)f->gate.n_in,
                    (long long)nf, (long long)f->up.n_in, (long long)f->up.n_out, (long long)x->n->ne[0]);
    mf_mtl_buf *sg = scratch(x->m, 0, (size_t)(nf * nt) * sizeof(float), x->err);
    mf_mtl_buf *su = sg ? scratch(x->m, 1, (size_t)(nf * nt) * sizeof(float), x->err) : NULL;
    if (!su)
        return -1;
    mf_mtl_bind xb = BID(x, x->in[0]);
    if (nt <= 8 && f->gate.wtype == f->up.wtype && !use_gemm(x->m, nt, nf)) {
        /* the GEMV tier: gate, up and SwiGLU in one dispatch into scratch
         * (the output may alias x) */
        if (matmul3_into(x, (const mf_matmul_meta *[]){&f->gate, &f->up}, 2, xb, B(sg, 0), nt, true))
            return -1;
        return copy2d(x, B(sg, 0), BID(x, x->out), 1, nf * nt, 0, 0, 0);
    }
    if (matmul_into(x, &f->gate, xb, B(sg, 0), nt) || matmul_into(x, &f->up, xb, B(su, 0), nt))
        return -1;
    return ew(x, KN_swiglu, B(sg, 0), B(su, 0), BID(x, x->out), nf * nt, nf * nt, 0.0f, true);
}

/* ---- the op table ------------------------------------------------------------------------ */

/* The shared head of every executor: the call's buffers checked, the device
 * not failed. */
static int xc_make(xc *x, mf_backend *b, const mf_graph *g, const mf_node_call *c, const mf_exec_args *a,
                   mf_error *err) {
    metal_be *m = MB(b);
    *x = (xc){.m = m, .g = g, .id = c->node, .n = &g->nodes[c->node], .in = c->in, .out = c->out,
              .kv = c->kv, .a = a, .err = err};
    if (mf_mtl_dev_failed(m->dev))
        return XERR(x, "the Metal device failed earlier (a GPU timeout or error); refusing further work%s", "");
    if (mf_node_nelem(x->n) > 0 && x->n->op != MF_OP_KVCACHE_STORE && !pb(m, c->out))
        return XERR(x, "no output buffer (id %d)", c->out);
    for (int i = 0; i < x->n->n_src; i++)
        if (!pb(m, c->in[i]) && mf_node_nbytes(&g->nodes[x->n->src[i]]) > 0)
            return XERR(x, "src %d has no buffer (id %d)", i, c->in[i]);
    return 0;
}

#define MF_METAL_EXEC(fn)                                                                           \
    static int x_##fn(mf_backend *b, const mf_graph *g, const mf_node_call *c, const mf_exec_args *a, \
                      mf_error *err) {                                                              \
        xc x;                                                                                       \
        return xc_make(&x, b, g, c, a, err) ? -1 : fn(&x);                                          \
    }
MF_METAL_EXEC(op_binary)
MF_METAL_EXEC(op_unary)
MF_METAL_EXEC(op_norm)
MF_METAL_EXEC(op_matmul)
MF_METAL_EXEC(op_getrows)
MF_METAL_EXEC(op_rope)
MF_METAL_EXEC(op_kv_store)
MF_METAL_EXEC(op_kv_load)
MF_METAL_EXEC(op_attn)
MF_METAL_EXEC(op_attn_paged)
MF_METAL_EXEC(op_view)
MF_METAL_EXEC(op_permute)
MF_METAL_EXEC(op_fused_qkv)
MF_METAL_EXEC(op_fused_ffn)

#define RUN(fn) {metal_can_run, x_##fn}
static const mf_op_entry metal_op_table[] = {
    [MF_OP_INPUT] = {NULL, mf_op_nothing},
    [MF_OP_ADD] = RUN(op_binary),
    [MF_OP_MUL] = RUN(op_binary),
    [MF_OP_SCALE] = RUN(op_unary),
    [MF_OP_SILU] = RUN(op_unary),
    [MF_OP_SWIGLU] = RUN(op_binary),
    [MF_OP_RMSNORM] = RUN(op_norm),
    [MF_OP_QKNORM] = RUN(op_norm),
    [MF_OP_MATMUL] = RUN(op_matmul),
    [MF_OP_GETROWS] = RUN(op_getrows),
    [MF_OP_ROPE] = RUN(op_rope),
    [MF_OP_KVCACHE_STORE] = RUN(op_kv_store),
    [MF_OP_KVCACHE_LOAD] = RUN(op_kv_load),
    [MF_OP_ATTN] = RUN(op_attn),
    /* the model graphs never emit SOFTMAX (attention does its own): the CPU's */
    [MF_OP_SOFTMAX] = {NULL, NULL},
    [MF_OP_VIEW] = RUN(op_view),
    [MF_OP_RESHAPE] = {NULL, mf_op_nothing},
    [MF_OP_PERMUTE] = RUN(op_permute),
    [MF_OP_FUSED_QKV] = RUN(op_fused_qkv),
    [MF_OP_FUSED_QKV_NORM] = RUN(op_fused_qkv),
    [MF_OP_FUSED_FFN] = RUN(op_fused_ffn),
    /* the CUDA epilogue fusion; the session asks for it only when FUSED_QKV is off */
    [MF_OP_QKV_BIAS_ROPE_STORE] = {NULL, NULL},
    [MF_OP_ATTN_PAGED] = RUN(op_attn_paged),
};
MF_OP_TABLE_CHECK(metal_op_table);
#undef RUN

/* One command buffer per split: the host inputs written into their shared
 * buffers (no command buffer is open: the engine synchronized the split
 * before), every call encoded behind a buffer barrier; synchronize, at the
 * split's end, commits and waits. */
static int metal_execute_split(mf_backend *b, const mf_split_call *s, mf_error *err) {
    metal_be *m = MB(b);
    if (mf_mtl_dev_failed(m->dev))
        return mf_errorf(err, "metal: the device failed earlier (a GPU timeout or error); refusing split %d",
                         s->index);
    for (int32_t i = 0; i < s->n_host_inputs; i++) {
        const mf_host_input *h = &s->host_inputs[i];
        if (host_io(m, h->buf, 0, (void *)h->data, h->nbytes, true, err))
            return -1;
    }
    for (int32_t i = 0; i < s->n_calls; i++)
        if (mf_backend_execute_node(b, s->g, &s->calls[i], s->args, err))
            return -1;
    return 0;
}

/* ---- life ---------------------------------------------------------------------------------- */

static void metal_free(mf_backend *b) {
    metal_be *m = MB(b);
    if (m->dev && mf_mtl_dev_pending(m->dev)) {
        mf_error e;
        (void)mf_mtl_submit(m->dev, &e);
    }
    bury_scratch(m);
    free(m->grave);
    mf_mtl_buf_free(m->paged);
    free(m->paged_host);
    for (int i = 0; i < N_SCRATCH; i++)
        mf_mtl_buf_free(m->scratch[i]);
    for (int32_t i = 0; i < m->n_pool; i++)
        mf_mtl_buf_free(m->pool[i].buf);
    free(m->pool);
    for (int64_t i = 0; i < m->n_regs; i++)
        if (m->regs[i].owned)
            mf_mtl_buf_free(m->regs[i].buf);
    free(m->regs);
    for (int i = 0; i < m->n_spans; i++)
        mf_mtl_buf_free(m->spans[i]);
    mf_mtl_buf_free(m->dummy);
    mf_mtl_dev_close(m->dev);
    free(m);
}

static const char *metal_describe(const mf_backend *b) {
    return mf_mtl_dev_name(MB(b)->dev);
}

static const mf_backend_ops metal_ops = {
    .name = metal_name,
    .op_table = metal_op_table,
    .supports_fused = metal_supports_fused,
    .alloc_buffer = metal_alloc_buffer,
    .free_buffer = metal_free_buffer,
    .alloc_fresh = metal_alloc_fresh,
    .execute_split = metal_execute_split,
    .read_host = metal_read_host,
    .write_host = metal_write_host,
    .synchronize = metal_synchronize,
    .has_weight = metal_has_weight,
    .describe = metal_describe,
    .free = metal_free,
};

/* The kernels' MSL, generated at build time from kernels/ *.metal. */
extern const char mf_metal_source[];

uint32_t mf_metal_auto_cache_type(int32_t n_layers, int64_t kv_dim) {
    return (int64_t)n_layers * kv_dim >= 8192 ? MF_TYPE_F16 : MF_TYPE_F32;
}

int64_t mf_metal_n_dispatches(const mf_backend *b) {
    return MB(b)->n_dispatch;
}

int mf_backend_metal_new(const mf_weights *w, const mf_metal_opts *o, mf_backend **out, mf_error *err) {
    *out = NULL;
    if (!w)
        return mf_errorf(err, "metal backend: no weight table");
    mf_backend_options def;
    mf_backend_options_default(&def);
    const mf_backend_options *bo = o && o->backend ? o->backend : &def;
    if (bo->metal.disable)
        return mf_errorf(err, "metal: disabled (MINFER_DISABLE_METAL / MINFER_DISABLE_MPS)");
    metal_be *m = mf_calloc(1, sizeof *m);
    read_levers(&m->lv, bo);
    m->w = w;
    mf_mtl_dev_opts dopt = {.source = mf_metal_source, .metallib_file = m->lv.metallib,
                            .timeout_ms = m->lv.timeout_ms, .trace = m->lv.trace, .capture = m->lv.capture};
    if (mf_mtl_dev_open(&dopt, kernel_names, KN_COUNT, &m->dev, err)) {
        free(m);
        return -1;
    }
    void *host;
    m->base = (mf_backend){.ops = &metal_ops, .kind = MF_BACKEND_METAL, .is_gpu = true, .ctx = m};
    if (!(m->dummy = mf_mtl_buf_new(m->dev, 16, &host, err)) || register_weights(m, o, err)) {
        metal_free(&m->base);
        return -1;
    }
    mf_log(MF_LOG_INFO, "using Metal on %s (unified: %s)", mf_mtl_dev_name(m->dev),
           mf_mtl_dev_unified(m->dev) ? "yes" : "no");
    *out = &m->base;
    return 0;
}
