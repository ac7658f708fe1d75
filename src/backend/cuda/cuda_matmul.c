/* cuda_matmul.c - the exec helpers (buffers, scratch, counters, the launch
 * record) and the matmul paths: GEMM tiers, the int8 GEMVs (one weight or
 * a fused group) and the lm_head that writes the logits to the host. */
#include "backend/cuda/cuda_ctx.h"

/* The device pointer of buffer `id` after checking it holds `need` bytes. */
void *mf_cub_buf_ptr(exec *x, int32_t id, size_t need, const char *role) {
    cu_ctx *c = x->c;
    if (id < 0 || id >= c->n_bufs || !c->bufs[id].p) {
        NODE_ERR(x, "%s buffer id %d is not in the pool (%d buffers)", role, id, c->n_bufs);
        return NULL;
    }
    if (c->bufs[id].size < need) {
        NODE_ERR(x, "%s buffer %d holds %zu bytes, the launch needs %zu", role, id, c->bufs[id].size,
                 need);
        return NULL;
    }
    return c->bufs[id].p;
}

size_t mf_cub_f32b(int64_t n) {
    return n > 0 ? (size_t)n * 4 : 0;
}

/* Scratch slot k with at least nbytes (grown after waiting for the stream,
 * since kernels in flight may still use the old one). */
float *mf_cub_scratch(exec *x, int k, size_t nbytes) {
    cu_ctx *c = x->c;
    if (c->scr_cap[k] >= nbytes)
        return c->scr[k];
    if (c->capturing) { /* no waits or allocations inside a capture: it is abandoned */
        NODE_ERR(x, "mf_cub_scratch %d must grow to %zu bytes during a CUDA graph mf_cub_capture", k, nbytes);
        return NULL;
    }
    if (mf_cub_wait(c, "growing mf_cub_scratch", x->err))
        return NULL;
    if (c->scr[k])
        cudaFree(c->scr[k]);
    c->scr[k] = NULL;
    c->scr_cap[k] = 0;
    size_t want = nbytes + nbytes / 4 + 4096;
    cudaError_t e = cudaMalloc(&c->scr[k], want);
    if (e != cudaSuccess) {
        c->scr[k] = NULL;
        cudaGetLastError();
        NODE_ERR(x, "mf_cub_scratch of %zu bytes: cudaMalloc failed: %s", want, cudaGetErrorName(e));
        return NULL;
    }
    c->scr_cap[k] = want;
    return c->scr[k];
}

/* Whether a forward at ea's position takes the one-kernel split-KV decode
 * (tune attn_decode=one): its last block combines every active split alone,
 * which costs more than the second kernel once the context is long. */
bool mf_cub_attn_one_now(const cu_ctx *c, const mf_exec_args *ea) {
    return mf_cuda_sel_attn_decode(&c->t, (int64_t)ea->n_past + ea->n_tokens, true) >= MF_CU_AD_ONE;
}

/* n zeroed counters, or NULL with the error set when there are fewer. The
 * user must leave them at 0. */
int32_t *mf_cub_counters(exec *x, int64_t n) {
    if (n < 0 || n > CNT_MAX) {
        NODE_ERR(x, "%lld mf_cub_counters asked of %d", (long long)n, CNT_MAX);
        return NULL;
    }
    return x->c->cnt;
}

/* Call right after a launch that also wrote into q8 (a scratch of at least
 * mf_cu_q8_bytes(n_in, nt); Q8OUT_SLOT when the kernel reads Q8_SLOT) the
 * int8 quantization of the nt rows of `of`: the next launch, if it is an
 * int8 GEMV of that x without a folded norm (run_multi), reads q8 and skips
 * its quantize kernel. Any launch in between invalidates it. */
void mf_cub_q8_produced(exec *x, const float *of, int64_t n_in, int64_t nt, void *q8) {
    cu_ctx *c = x->c;
    c->q8_nt = nt;
    c->q8_buf = q8;
    c->q8_of = of;
    c->q8_n = n_in;
    c->q8_stamp = c->n_launched;
}

/* Records a launch in the ring and turns its launch status into an error. */
int mf_cub_launched(exec *x, const char *kernel, int64_t d0, int64_t d1, cudaError_t e) {
    cu_ctx *c = x->c;
    cu_trace *t = &c->ring[c->n_launched++ % TRACE_N];
    t->node = x->id;
    snprintf(t->name, sizeof t->name, "%s", x->n->name);
    t->op = mf_op_name(x->n->op);
    t->kernel = kernel;
    t->d0 = d0;
    t->d1 = d1;
    if (c->trace) /* MINFER_TRACE=1: the ring's entries, also streamed as they are made */
        fprintf(stderr, "cuda: launch %lld node %d '%s' (%s) %s [%lld x %lld]%s\n",
                (long long)c->n_launched, t->node, t->name, t->op, kernel, (long long)d0, (long long)d1,
                c->capturing ? " (captured)" : "");
    if (e == cudaSuccess)
        return 0;
    NODE_ERR(x, "launching %s [%lld x %lld]: %s (%s)", kernel, (long long)d0, (long long)d1,
             cudaGetErrorName(e), cudaGetErrorString(e));
    mf_cub_dump_ring(c, x->err);
    return -1;
}

/* Device pointer of weight `name` checked against type and shape. */
const void *mf_cub_weight_ptr(exec *x, const char *name, uint32_t type, int64_t ne0, int64_t ne1) {
    int64_t i;
    const mf_weight *wt = name ? mf_cub_weight_at_name(x->c, name, &i) : NULL;
    if (!wt) {
        NODE_ERR(x, "weight '%s' not on the GPU", name ? name : "(null)");
        return NULL;
    }
    if (wt->type != type) {
        NODE_ERR(x, "weight '%s' is %s, the node expects %s", name, mf_type_name(wt->type),
                 mf_type_name(type));
        return NULL;
    }
    int64_t rows = wt->ne[1] > 0 ? wt->ne[1] : 1;
    if (wt->ne[0] != ne0 || (ne1 >= 0 && rows != ne1) || (wt->n_dims > 2 && (wt->ne[2] > 1 || wt->ne[3] > 1))) {
        NODE_ERR(x, "weight '%s' has shape [%lld %lld %lld %lld], the node expects [%lld %lld]", name,
                 (long long)wt->ne[0], (long long)wt->ne[1], (long long)wt->ne[2], (long long)wt->ne[3],
                 (long long)ne0, (long long)ne1);
        return NULL;
    }
    return x->c->wmem + x->c->woff[i];
}

const float *mf_cub_norm_weight(exec *x, const char *name, int64_t n) {
    if (!name)
        return NULL;
    return mf_cub_weight_ptr(x, name, MF_TYPE_F32, n, 1);
}


/* y (n_out x nt) = W x (+ bias) with the node's matmul meta; y must not alias x. */
int mf_cub_run_matmul(exec *x, const mf_matmul_meta *m, const float *in, float *y, int64_t nt) {
    if (!mf_cub_mm_ok(m))
        return NODE_ERR(x, "weight '%s' of type %s with n_in %lld has no CUDA kernel (K-quants need "
                        "n_in %% 256 == 0)", m->weight, mf_type_name(m->wtype), (long long)m->n_in);
    const void *w = mf_cub_weight_ptr(x, m->weight, m->wtype, m->n_in, m->n_out);
    if (!w)
        return -1;
    const float *bias = NULL;
    if (m->bias && !(bias = mf_cub_weight_ptr(x, m->bias, MF_TYPE_F32, m->n_out, 1)))
        return -1;
    mf_cu_matmul_args a = {.wtype = m->wtype, .w = w, .row_bytes = mf_cub_row_bytes(m->wtype, m->n_in),
                           .x = in, .bias = bias, .y = y, .n_in = m->n_in, .n_out = m->n_out,
                           .nt = nt, .force_gemm = x->c->t.force, .no_tc = x->c->t.mm_prefill == MF_CU_MM_SIMT,
                           .gemv_v1 = x->c->t.gemv == MF_CU_GEMV_V1, .gemv_auto = x->c->t.gemv < 0,
                           .gt = gemv_tune(x->c), .sms = x->c->t.sm_count};
    const bool q8 = mf_cu_q8_supported(m->wtype, m->n_in) && nt <= 8 &&
                    q8_tier(x->c);
    if (x->c->t.force == MF_CU_FORCE_GEMV_Q8 && !q8)
        return NODE_ERR(x, "int8 GEMV forced for weight '%s' (%s, n_in %lld, nt %lld) it cannot run",
                        m->weight, mf_type_name(m->wtype), (long long)m->n_in, (long long)nt);
    if (q8 && !(a.q8 = mf_cub_scratch(x, Q8_SLOT, mf_cu_q8_bytes(m->n_in, nt))))
        return -1;
    a.no_mma = x->c->t.mm_prefill != MF_CU_MM_MMA;
    a.mma_min_nt = x->c->t.mma_min_nt;
    a.wchunk_bytes = x->c->t.mma_chunk;
    a.no_split = !x->c->t.mma_split;
    if (!q8 && mf_cu_mma_wanted(&a)) {
        size_t wb, xb;
        mf_cu_mma_scratch(&a, &wb, &xb);
        if (wb && !(a.wf16 = mf_cub_scratch(x, WF16_SLOT, wb)))
            return -1;
        if (!(a.xf16 = mf_cub_scratch(x, XF16_SLOT, xb)))
            return -1;
        /* the same x of the same node (fused QKV / gate+up): converted once */
        a.x_ready = x->xf16_of == in && x->xf16_n_in == m->n_in;
        const cudaError_t e = mf_cu_matmul(&a, x->c->stream);
        x->xf16_of = e == cudaSuccess ? in : NULL;
        x->xf16_n_in = m->n_in;
        return mf_cub_launched(x, a.x_ready ? "matmul(mma, x ready)" : "matmul(mma)", m->n_out, nt, e);
    }
    return mf_cub_launched(x, q8 ? "matmul(q8)" : "matmul", m->n_out, nt, mf_cu_matmul(&a, x->c->stream));
}

/* The mma tier's one-GEMM form (mf_cu_gemm_mma_multi) of n matmuls sharing
 * `in`: n 3 (QKV) into y[0..2], or n 2 with swiglu (gate, up) into y[0] =
 * silu(gate) * up. Returns 1 when it does not apply (tune mma_fuse=0,
 * a folded norm, a weight the mma tier would not take at this nt, shapes
 * it does not serve): the caller runs the matmuls one by one; else 0, or -1
 * with the error set. y may alias in: the GEMM reads the f16 copy of in. */
int mf_cub_run_mma_multi(exec *x, const mf_matmul_meta *const *mm, int n, bool swiglu, const float *in,
                         float *const *y, int64_t nt) {
    if (!x->c->t.mma_fuse || x->norm || nt <= 8 || (x->c->t.force != MF_CU_FORCE_NONE && x->c->t.force != MF_CU_FORCE_MMA))
        return 1;
    mf_cu_mma_multi_args a = {.n_w = n, .swiglu = swiglu, .x = in, .n_in = mm[0]->n_in, .nt = nt,
                              .wchunk_bytes = x->c->t.mma_chunk, .sms = x->c->t.sm_count};
    for (int i = 0; i < n; i++) {
        const mf_matmul_meta *m = mm[i];
        mf_cu_matmul_args t = {.wtype = m->wtype, .n_in = m->n_in, .n_out = m->n_out, .nt = nt,
                               .force_gemm = x->c->t.force, .no_tc = x->c->t.mm_prefill == MF_CU_MM_SIMT, .no_mma = x->c->t.mm_prefill != MF_CU_MM_MMA,
                               .mma_min_nt = x->c->t.mma_min_nt};
        if (!mf_cub_mm_ok(m) || m->n_in != a.n_in || !mf_cu_mma_wanted(&t))
            return 1;
    }
    for (int i = 0; i < n; i++) {
        const mf_matmul_meta *m = mm[i];
        if (!(a.w[i] = mf_cub_weight_ptr(x, m->weight, m->wtype, m->n_in, m->n_out)))
            return -1;
        if (m->bias && !(a.bias[i] = mf_cub_weight_ptr(x, m->bias, MF_TYPE_F32, m->n_out, 1)))
            return -1;
        a.wtype[i] = m->wtype;
        a.row_bytes[i] = mf_cub_row_bytes(m->wtype, m->n_in);
        a.y[i] = y[i] ? y[i] : y[0];
        a.n_out[i] = m->n_out;
    }
    if (!mf_cu_mma_multi_ok(&a))
        return 1;
    size_t wb, xb;
    mf_cu_mma_multi_scratch(&a, &wb, &xb);
    if (!(a.wf16 = mf_cub_scratch(x, WF16_SLOT, wb)) || !(a.xf16 = mf_cub_scratch(x, XF16_SLOT, xb)))
        return -1;
    a.x_ready = x->xf16_of == in && x->xf16_n_in == a.n_in;
    const cudaError_t e = mf_cu_gemm_mma_multi(&a, x->c->stream);
    x->xf16_of = e == cudaSuccess ? in : NULL;
    x->xf16_n_in = a.n_in;
    return mf_cub_launched(x, swiglu ? "matmul(mma, gate+up swiglu)" : "matmul(mma, qkv)", a.n_out[0] * n, nt, e);
}

/* Whether the fused int8 GEMV (mf_cu_gemv_q8_multi) serves these n matmuls
 * of nt tokens: the lever (or the test hook) is on, the int8 tier is the one
 * run_matmul would pick, and every weight has an int8 decoder. */
bool mf_cub_fuse_ok(const exec *x, const mf_matmul_meta *const *mm, int n, int64_t nt) {
    if (!(x->c->t.fuse_gemv || x->norm) || nt > 8 || !q8_tier(x->c))
        return false;
    for (int i = 0; i < n; i++)
        if (!mf_cub_mm_ok(mm[i]) || !mf_cu_q8_supported(mm[i]->wtype, mm[i]->n_in) || mm[i]->n_in != mm[0]->n_in)
            return false;
    return true;
}

/* y[i] = W_i in (+ b_i) for the n (<= 3) matmuls of fuse_ok, or with swiglu
 * (n == 2) y[0] = silu(W0 in + b0) * (W1 in + b1). y may alias in: the GEMV
 * reads only the quantized copy of in. */
int mf_cub_run_multi(exec *x, const mf_matmul_meta *const *mm, int n, bool swiglu, const float *in,
                     float *const *y, const float *const *res, int64_t nt) {
    mf_cu_q8_multi_args a = {.n_w = n, .swiglu = swiglu, .x = x->norm ? x->norm_x : in, .n_in = mm[0]->n_in,
                             .nt = nt, .norm = x->norm, .norm_w = x->norm_w, .norm_eps = x->norm_eps,
                             .gemv_v1 = x->c->t.gemv == MF_CU_GEMV_V1, .gemv_auto = x->c->t.gemv < 0,
                             .gt = gemv_tune(x->c), .qkv_mix = x->c->t.qkv_mix};
    for (int i = 0; i < n; i++) {
        const mf_matmul_meta *m = mm[i];
        if (!(a.w[i] = mf_cub_weight_ptr(x, m->weight, m->wtype, m->n_in, m->n_out)))
            return -1;
        if (m->bias && !(a.bias[i] = mf_cub_weight_ptr(x, m->bias, MF_TYPE_F32, m->n_out, 1)))
            return -1;
        a.wtype[i] = m->wtype;
        a.row_bytes[i] = mf_cub_row_bytes(m->wtype, m->n_in);
        a.y[i] = y[i];
        a.res[i] = res ? res[i] : NULL;
        a.n_out[i] = m->n_out;
    }
    cu_ctx *c = x->c;
    a.x_q8_ready = (!x->norm && c->q8_buf && c->q8_of == a.x && c->q8_n == a.n_in && c->q8_nt == nt &&
                                c->q8_stamp == c->n_launched);
    if (a.x_q8_ready)
        a.q8 = c->q8_buf;
    else if (!(a.q8 = mf_cub_scratch(x, Q8_SLOT, mf_cu_q8_bytes(a.n_in, nt))))
        return -1;
    x->c->n_q8_ready += a.x_q8_ready;
    if (n == 1)
        a.y_host = x->zc_host; /* tune zc: checked by zc_alias with mf_cu_gemv_q8_zc_ok's rule */
    /* tune ffn_q8b: h's int8 copy into Q8OUT_SLOT (the GEMV reads Q8_SLOT), for the down GEMV */
    if (x->q8b && swiglu && !a.x_q8_ready && mf_cu_gemv_q8_ffn_q8b_ok(&a)) {
        if (!(a.q8out = mf_cub_scratch(x, Q8OUT_SLOT, mf_cu_q8_bytes(a.n_out[0], nt))))
            return -1;
        if (mf_cub_launched(x, "gemv_q8_multi(swiglu, q8 out)", a.n_out[0] * n, nt, mf_cu_gemv_q8_multi(&a, x->c->stream)))
            return -1;
        mf_cub_q8_produced(x, y[0], a.n_out[0], nt, a.q8out);
        return 0;
    }
    static const char *const kname[2][2] = { /* [x ready][swiglu] (MINFER_TRACE) */
        {"gemv_q8_multi", "gemv_q8_multi(swiglu)"}, {"gemv_q8_multi(x ready)", "gemv_q8_multi(swiglu, x ready)"}};
    return mf_cub_launched(x, kname[a.x_q8_ready != 0][swiglu], a.n_out[0] * n, nt, mf_cu_gemv_q8_multi(&a, x->c->stream));
}

/* The hint as the CUDA graph cache keys it: out_host while the ZC lm_head is
 * on (a captured ZC lm_head embeds its device alias), else NULL. */
void *mf_cub_head_key(const cu_ctx *c, const mf_exec_args *a) {
    return c->t.zc ? a->out_host : NULL;
}

/* Bytes [0, bytes) of buffer id are already in host block `host` once the
 * stream reaches this point (read_host then only waits): copied early by
 * the lm_head's ZC epilogue. Counted for
 * mf_cuda_d2h_stats / mf_cuda_zc_count when there are such bytes. */
void mf_cub_d2h_set(cu_ctx *c, int32_t id, void *host, size_t bytes, bool zc) {
    c->d2h_id = id;
    c->d2h_host = host;
    c->d2h_bytes = bytes;
    c->d2h_zc = zc;
    c->n_d2h_chunked += bytes != 0 && !zc;
    c->n_zc += bytes != 0 && zc;
}

/* ---- tune zc: the lm_head GEMV writes the logits into the pinned block ---- */

/* Why. After a replayed decode step the engine's read of the logits (the
 * 0.5B: 151936 floats, 608 KB) would be a D2H copy that starts only when
 * the lm_head, the graph's last kernel, has finished. Here nothing is copied: the lm_head's v4 GEMV stores
 * every row also into the engine's pinned logits block through its device
 * alias, a 32-byte line per row group (v4_zc_store, gemv_q8v4.cu), while
 * it streams the weight (~47 us on the 0.5B); the writes cross PCIe under
 * the GEMV and the read after the forward only waits. y on the device is
 * still written (the same stores as today), so every other read of the
 * buffer and every later kernel see it as before. */

/* The device alias of the host_alloc block bytes [p, p + n) lie in, or
 * NULL (not such a block, or the runtime gives no alias). */
float *mf_cub_zc_alias(cu_ctx *c, void *p, size_t n) {
    const uint8_t *q = p;
    for (int i = 0; i < PINNED_N; i++) {
        uint8_t *b0 = c->pinned[i].p;
        if (!b0 || q < b0 || q > b0 + c->pinned[i].n || n > (size_t)(b0 + c->pinned[i].n - q))
            continue;
        if (!c->pinned[i].dev && cudaHostGetDevicePointer(&c->pinned[i].dev, b0, 0) != cudaSuccess) {
            cudaGetLastError();
            c->pinned[i].dev = NULL;
            return NULL;
        }
        return (float *)((uint8_t *)c->pinned[i].dev + (q - b0));
    }
    return NULL;
}

/* The device alias the ZC lm_head writes for MATMUL node `node` (input
 * buffer in, output out), or NULL: the switch is on, the node is the output
 * the engine reads right after into a host_alloc block (ea's hint, exact
 * byte count, 32-byte aligned), and the launch
 * is one token on the v4 int8 GEMV that has a ZC instance with the plain
 * launch's plan (mf_cu_gemv_q8_zc_ok's rule: every logit keeps its bits). */
float *mf_cub_zc_head(cu_ctx *c, const mf_graph *g, int32_t node, int32_t in, int32_t out, const mf_exec_args *ea) {
    if (!c->t.zc || !ea->out_host || ea->out_node != node || in == out || out < 0 || out >= c->n_bufs ||
        ((uintptr_t)ea->out_host & 31))
        return NULL;
    const mf_node *n = &g->nodes[node];
    const mf_matmul_meta *m = &n->meta.matmul;
    if (n->op != MF_OP_MATMUL || n->ne[1] != 1 || ea->out_bytes != mf_cub_f32b(m->n_out) ||
        c->bufs[out].size < ea->out_bytes || !mf_cub_mm_ok(m) || !mf_cu_q8_supported(m->wtype, m->n_in) ||
        !q8_tier(c))
        return NULL;
    const mf_cu_gemv_tune gt = gemv_tune(c);
    const int u = mf_cu_q8v4_u(&gt, m->wtype, m->n_out, m->n_in);
    if (u <= 0 || !mf_cu_q8v4_zc_ok(&gt, m->wtype, u, m->n_out, m->n_in))
        return NULL;
    return mf_cub_zc_alias(c, ea->out_host, ea->out_bytes);
}

/* The lm_head through run_multi with the ZC epilogue into yh (zc_head);
 * remembers the logits as already on the host for read_host, like the
 * chunked copy does. */
int mf_cub_run_head_zc(exec *x, const mf_matmul_meta *m, const float *in, float *y, int32_t out,
                       const mf_exec_args *ea, float *yh) {
    cu_ctx *c = x->c;
    const mf_matmul_meta *mm[1] = {m};
    float *const ys[1] = {y};
    c->d2h_bytes = 0;
    x->zc_host = yh;
    const int rc = mf_cub_run_multi(x, mm, 1, false, in, ys, NULL, 1);
    x->zc_host = NULL;
    if (rc)
        return rc;
    mf_cub_d2h_set(c, out, ea->out_host, ea->out_bytes, true);
    return 0;
}

int mf_cub_run_ew(exec *x, int op, const float *a, const float *b, float *y, int64_t n, int64_t b_n,
                  float s) {
    mf_cu_ew_args e = {.op = op, .a = a, .b = b, .y = y, .n = n, .b_n = b_n, .s = s, .pdl = x->c->t.pdl};
    return mf_cub_launched(x, "elementwise", n, op, mf_cu_elementwise(&e, x->c->stream));
}

int mf_cub_run_norm(exec *x, const float *in, const float *w, float *y, int64_t n, int64_t rows,
                    float eps) {
    mf_cu_norm_args a = {.x = in, .w = w, .y = y, .n = n, .nrows = rows, .eps = eps, .pdl = x->c->t.pdl};
    return mf_cub_launched(x, "rmsnorm", rows, n, mf_cu_rmsnorm(&a, x->c->stream));
}

int mf_cub_run_rope(exec *x, const mf_rope_meta *r, const float *in, float *y, const int32_t *pos,
                    int64_t pos0, int64_t nt) {
    if (r->n_head <= 0 || r->head_dim <= 0 || r->n_rot <= 0 || r->n_rot > r->head_dim || r->n_rot % 2)
        return NODE_ERR(x, "rope n_head %d head_dim %d n_rot %d", r->n_head, r->head_dim, r->n_rot);
    mf_cu_rope_args a = {.x = in, .y = y, .pos = pos, .pos0 = pos0, .pos0_dev = pos ? NULL : x->npast_dev,
                         .nt = nt, .n_head = r->n_head,
                         .head_dim = r->head_dim, .n_rot = r->n_rot, .mode = r->mode,
                         .theta = r->theta, .freq_scale = r->freq_scale, .pdl = x->c->t.pdl};
    return mf_cub_launched(x, "rope", nt, r->n_head, mf_cu_rope(&a, x->c->stream));
}
