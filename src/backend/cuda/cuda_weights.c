/* cuda_weights.c - the weight upload (once, through pinned staging,
 * registered by GGUF name) and what the backend can run. */
#include "backend/cuda/cuda_ctx.h"

/* ---- weights ------------------------------------------------------------------------------ */

const mf_weight *mf_cub_weight_at_name(const cu_ctx *c, const char *name, int64_t *idx) {
    const mf_weight *wt = mf_weights_find(c->w, name);
    if (!wt)
        return NULL;
    int64_t i = wt - mf_weights_at(c->w, 0);
    if (i < 0 || i >= c->n_w || c->woff[i] == NO_WEIGHT)
        return NULL;
    *idx = i;
    return wt;
}

bool mf_cub_has_weight(const mf_backend *b, const char *name) {
    int64_t i;
    return name && mf_cub_weight_at_name(CX(b), name, &i) != NULL;
}

/* Bytes of one row of a weight of `type` with n elements, 0 when impossible. */
size_t mf_cub_row_bytes(uint32_t type, int64_t n) {
    return mf_type_row_size(type, n);
}

static bool uploadable(const mf_weight *wt) {
    if (!mf_cu_type_supported(wt->type) || !wt->data || wt->nbytes == 0)
        return false;
    const size_t rb = mf_cub_row_bytes(wt->type, wt->ne[0]);
    if (rb == 0)
        return false;
    uint64_t rows = 1;
    for (uint32_t d = 1; d < 4; d++)
        rows *= (uint64_t)(wt->ne[d] > 0 ? wt->ne[d] : 1);
    return rb * rows <= wt->nbytes;
}

/* One device allocation for every weight; copies stream through two halves of
 * the pinned staging area, each guarded by an event so a half is refilled only
 * after its previous copy finished. */
int mf_cub_upload_weights(cu_ctx *c, mf_cuda_progress_fn progress, void *user, mf_error *err) {
    c->n_w = mf_weights_count(c->w);
    c->woff = mf_malloc((size_t)(c->n_w > 0 ? c->n_w : 1) * sizeof *c->woff);
    uint64_t total = 0;
    for (int64_t i = 0; i < c->n_w; i++) {
        const mf_weight *wt = mf_weights_at(c->w, i);
        c->woff[i] = NO_WEIGHT;
        if (uploadable(wt)) {
            c->woff[i] = total;
            total += (wt->nbytes + WEIGHT_ALIGN - 1) & ~(uint64_t)(WEIGHT_ALIGN - 1);
        }
    }
    c->wbytes = total;
    if (total == 0)
        return 0;
    size_t fr = 0, tot = 0;
    CU_TRY(cudaMemGetInfo(&fr, &tot));
    if (total > fr)
        return mf_errorf(err, "cuda: the weights need %llu bytes, the device has %zu of %zu free",
                         (unsigned long long)total, fr, tot);
    CU_TRY(cudaMalloc((void **)&c->wmem, total));

    cudaEvent_t ev[2];
    CU_TRY(cudaEventCreateWithFlags(&ev[0], cudaEventDisableTiming));
    if (cudaEventCreateWithFlags(&ev[1], cudaEventDisableTiming) != cudaSuccess) {
        cudaEventDestroy(ev[0]);
        return mf_errorf(err, "cuda: cudaEventCreateWithFlags failed at %s:%d", __FILE__, __LINE__);
    }
    const size_t half = PIN_BYTES / 2;
    bool used[2] = {false, false};
    int k = 0, rc = 0;
    uint64_t done = 0;
    for (int64_t i = 0; i < c->n_w && !rc; i++) {
        if (c->woff[i] == NO_WEIGHT)
            continue;
        const mf_weight *wt = mf_weights_at(c->w, i);
        const uint8_t *src = wt->data;
        for (uint64_t o = 0; o < wt->nbytes && !rc; o += half) {
            size_t chunk = (size_t)(wt->nbytes - o < half ? wt->nbytes - o : half);
            if (used[k] && mf_cub_wait_event(c, ev[k], err)) {
                rc = -1;
                break;
            }
            uint8_t *stage = c->pin + (size_t)k * half;
            memcpy(stage, src + o, chunk);
            cudaError_t e = cudaMemcpyAsync(c->wmem + c->woff[i] + o, stage, chunk,
                                            cudaMemcpyHostToDevice, c->stream);
            if (e == cudaSuccess)
                e = cudaEventRecord(ev[k], c->stream);
            if (e != cudaSuccess) {
                rc = cu_err(err, "cudaMemcpyAsync(weight)", e, __FILE__, __LINE__);
                mf_error_prefix(err, "weight '%s'", wt->name);
                break;
            }
            used[k] = true;
            k ^= 1;
            done += chunk;
            if (progress)
                progress(user, done, total);
        }
    }
    if (!rc)
        rc = mf_cub_wait(c, "weight upload", err);
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    return rc;
}

/* ---- capability -------------------------------------------------------------------------- */

static bool is_kquant(uint32_t t) {
    return t == MF_TYPE_Q2_K || t == MF_TYPE_Q3_K || t == MF_TYPE_Q4_K || t == MF_TYPE_Q5_K ||
           t == MF_TYPE_Q6_K;
}

bool mf_cub_mm_ok(const mf_matmul_meta *m) {
    if (!mf_cu_type_supported(m->wtype) || m->n_in <= 0 || m->n_out <= 0)
        return false;
    if (is_kquant(m->wtype) && m->n_in % MF_QK_K != 0)
        return false; /* the kernels walk whole super-blocks: a tail would be dropped */
    return mf_cub_row_bytes(m->wtype, m->n_in) != 0;
}

static bool norm_weight_ok(const cu_ctx *c, const char *name) {
    if (!name)
        return true;
    const mf_weight *wt = mf_weights_find(c->w, name);
    return !wt || wt->type == MF_TYPE_F32; /* a missing one is the gate's business */
}

const char *mf_cub_name(const mf_backend *b) {
    return "cuda";
}

bool mf_cub_supports_op(const mf_backend *b, const mf_node *n) {
    const cu_ctx *c = CX(b);
    switch (n->op) {
    case MF_OP_MATMUL:
        return mf_cub_mm_ok(&n->meta.matmul);
    case MF_OP_GETROWS:
        if (n->meta.getrows.mode == 0)
            return mf_cu_type_supported(n->meta.getrows.wtype) &&
                   mf_cub_row_bytes(n->meta.getrows.wtype, n->ne[0]) != 0;
        return true;
    case MF_OP_RMSNORM:
    case MF_OP_QKNORM:
        return norm_weight_ok(c, n->meta.norm.weight);
    case MF_OP_ATTN: /* fused kernels only: unfused attention (-fa off) is the CPU's */
        return !n->meta.attn.unfused && n->meta.attn.head_dim > 0 &&
               n->meta.attn.head_dim <= MF_CU_ATTN_MAX_HEAD_DIM;
    case MF_OP_ATTN_PAGED:
        return mf_cub_paged_ok(n);
    case MF_OP_FUSED_QKV:
    case MF_OP_FUSED_QKV_NORM:
        if (!mf_cub_mm_ok(&n->meta.qkv.q) || !mf_cub_mm_ok(&n->meta.qkv.k) || !mf_cub_mm_ok(&n->meta.qkv.v))
            return false;
        /* fall through */
    case MF_OP_QKV_BIAS_ROPE_STORE:
        return n->meta.qkv.head_dim > 0 && norm_weight_ok(c, n->meta.qkv.q_norm) &&
               norm_weight_ok(c, n->meta.qkv.k_norm);
    case MF_OP_FUSED_FFN:
        return mf_cub_mm_ok(&n->meta.ffn.gate) && mf_cub_mm_ok(&n->meta.ffn.up);
    default:
        return (unsigned)n->op < MF_OP_COUNT;
    }
}

bool mf_cub_supports_fused(const mf_backend *b, mf_fused_kind kind) {
    return kind < MF_FUSE_COUNT;
}
