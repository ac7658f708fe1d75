/* cuda_backend.c - the CUDA backend's entry: the ops table, creation from
 * mf_cuda_options (device checks, tuning, stream, pinned staging, weight
 * upload), lifetime, and the test entry points. The jobs live beside it
 * (cuda_ctx.h lists them).
 *
 * Shape of one forward: the scheduler calls execute_node per node, which
 * checks the node's buffers and weights against the shapes it is about to
 * launch (an out-of-bounds shape is an error naming the node and numbers,
 * before any launch) and enqueues one or a few kernels on the single stream;
 * stream order is the barrier between dependent kernels. synchronize polls
 * the stream against a deadline, then reads the device fault word. Host
 * copies go through a pinned staging area: write_host copies the caller's
 * bytes there and enqueues the upload (so it returns before the copy runs),
 * except a recorded forward's small inputs, which wait in the input slots
 * for the forward's first kernel (slot_put); read_host waits for the stream
 * first. Every CUDA call is checked; its error names the call and
 * file:line. */
#include "backend/cuda/cuda_ctx.h"

/* ---- lifetime ------------------------------------------------------------------------------- */

static void cu_free(mf_backend *b) {
    cu_ctx *c = CX(b);
    if (c->stream) {
        mf_error e;
        c->recording = false; /* an unfinished forward's calls are dropped */
        c->pend_node = -1;
        c->rs_node = -1;
        if (mf_cub_wait(c, "free", &e))
            fprintf(stderr, "%s\n", e.msg);
    }
    mf_cub_ht_print(&c->ht);
#ifdef MF_KTIME
    if (c->stream) /* the kernel timeline (MINFER_CUDA_KTIME, pdl.cuh) */
        mf_cu_ktime_dump(stderr);
#endif
    for (int i = 0; i < PINNED_N; i++) /* blocks a holder did not give back */
        if (c->pinned[i].p)
            cudaFreeHost(c->pinned[i].p);
    for (int i = 0; i < 2 && c->ht.on; i++)
        cudaEventDestroy(c->ht.ev[i]);
    for (int i = 0; i < N_GENTRY; i++)
        mf_cub_gentry_clear(&c->ge[i]);
    free(c->rec);
    mf_cub_paged_free(c);
    if (c->dev_npast)
        cudaFree(c->dev_npast);
    if (c->cnt)
        cudaFree(c->cnt);
    for (int32_t i = 0; i < c->n_bufs; i++)
        if (c->bufs[i].p)
            cudaFree(c->bufs[i].p);
    free(c->bufs);
    for (int i = 0; i < N_SCRATCH; i++)
        if (c->scr[i])
            cudaFree(c->scr[i]);
    if (c->wmem)
        cudaFree(c->wmem);
    free(c->woff);
    if (c->pin)
        cudaFreeHost(c->pin);
    if (c->slot)
        cudaFreeHost(c->slot);
    if (c->fault)
        cudaFreeHost(c->fault);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c);
    free(b);
}

/* ---- the contract: op table and split execution ---------------------------------------- */

#undef mf_exec_args

static mf_cuda_args cu_args_of(const mf_exec_args *a) {
    return (mf_cuda_args){.n_past = a->n_past, .n_tokens = a->n_tokens, .n_ctx = a->n_ctx,
                          .kv_type = a->k_type, .out_node = -1, .batch = a->batch};
}

/* The kernels read K and V with one cache type: different ones are refused
 * (the runtime says so at session creation; this guards direct callers). */
static int cu_kv_types(const mf_exec_args *a, mf_error *err) {
    if (a->k_type != a->v_type)
        return mf_errorf(err, "cuda: K cache type %s and V cache type %s differ; this backend keeps one type "
                              "for both", mf_type_name(a->k_type), mf_type_name(a->v_type));
    return 0;
}

static int cu_op_exec(mf_backend *b, const mf_graph *g, const mf_node_call *k, const mf_exec_args *a,
                      mf_error *err) {
    if (cu_kv_types(a, err))
        return -1;
    const mf_cuda_args ca = cu_args_of(a);
    mf_cub_paged_forget(CX(b)); /* a lone node: its batch may be new */
    return mf_cub_execute_node(b, g, k->node, k->in, k->out, k->kv, &ca, err);
}

/* A split: begin_forward (graph record), the host inputs, the recorded
 * build's calls (a forward that is this one split) or each node, then
 * end_forward (the fusions left pending, capture or replay). */
static int split_run(mf_backend *b, const mf_split_call *s, mf_error *err);

/* A paged forward takes the mma tier from tune paged_mma_min_nt tokens
 * (its B rows are B sequences' decode steps, where the wmma tier measured
 * slowest), restored after the split. */
static int cu_execute_split(mf_backend *b, const mf_split_call *s, mf_error *err) {
    if (cu_kv_types(s->args, err))
        return -1;
    cu_ctx *c = CX(b);
    const int keep = c->t.mma_min_nt;
    if (s->args->batch)
        c->t.mma_min_nt = c->t.paged_mma_min_nt;
    const int rc = split_run(b, s, err);
    c->t.mma_min_nt = keep;
    return rc;
}

static int split_run(mf_backend *b, const mf_split_call *s, mf_error *err) {
    mf_cuda_args a = cu_args_of(s->args);
    for (int32_t k = 0; k < s->n_outputs; k++)
        if (s->read_back[k]) {
            a.out_host = s->read_back[k];
            a.out_node = s->outputs[k];
            a.out_bytes = mf_node_nbytes(&s->g->nodes[s->outputs[k]]);
        }
    if (mf_cub_begin_forward(b, s->g, &a, err))
        return -1;
    for (int32_t k = 0; k < s->n_host_inputs; k++) {
        const mf_host_input *h = &s->host_inputs[k];
        if (mf_cub_write_host(b, h->buf, 0, h->data, h->nbytes, err))
            return mf_error_prefix(err, "forward: input node %d '%s'", h->node, s->g->nodes[h->node].name);
    }
    int repeated = 0;
    if (s->n_splits == 1 && s->n_inputs == 0 && s->g->stamp &&
        (repeated = mf_cub_repeat_calls(b, s->g, &a, err)) < 0)
        return -1;
    for (int32_t k = 0; !repeated && k < s->n_calls; k++) {
        const mf_node_call *c = &s->calls[k];
        if (mf_cub_execute_node(b, s->g, c->node, c->in, c->out, c->kv, &a, err))
            return -1;
    }
    return mf_cub_end_forward(b, s->g, &a, err);
}

#define CU_E(op) [op] = {mf_cub_supports_op, cu_op_exec}
static const mf_op_entry cu_table[] = {
    CU_E(MF_OP_INPUT), CU_E(MF_OP_ADD), CU_E(MF_OP_MUL), CU_E(MF_OP_SCALE), CU_E(MF_OP_SILU),
    CU_E(MF_OP_SWIGLU), CU_E(MF_OP_RMSNORM), CU_E(MF_OP_QKNORM), CU_E(MF_OP_MATMUL), CU_E(MF_OP_GETROWS),
    CU_E(MF_OP_ROPE), CU_E(MF_OP_KVCACHE_STORE), CU_E(MF_OP_KVCACHE_LOAD), CU_E(MF_OP_ATTN),
    CU_E(MF_OP_SOFTMAX), CU_E(MF_OP_VIEW), CU_E(MF_OP_RESHAPE), CU_E(MF_OP_PERMUTE), CU_E(MF_OP_FUSED_QKV),
    CU_E(MF_OP_FUSED_QKV_NORM), CU_E(MF_OP_FUSED_FFN), CU_E(MF_OP_QKV_BIAS_ROPE_STORE),
    CU_E(MF_OP_ATTN_PAGED),
};
#undef CU_E
MF_OP_TABLE_CHECK(cu_table);

static const mf_backend_ops cu_ops = {
    .name = mf_cub_name,
    .op_table = cu_table,
    .supports_fused = mf_cub_supports_fused,
    .alloc_buffer = mf_cub_alloc_buffer,
    .free_buffer = mf_cub_free_buffer,
    .alloc_fresh = mf_cub_alloc_fresh,
    .execute_split = cu_execute_split,
    .read_host = mf_cub_read_host,
    .host_alloc = mf_cub_host_alloc,
    .host_free = mf_cub_host_free,
    .write_host = mf_cub_write_host,
    .synchronize = mf_cub_synchronize,
    .has_weight = mf_cub_has_weight,
    .describe = mf_cuda_device_desc,
    .free = cu_free,
};

#define mf_exec_args mf_cuda_args

int mf_cuda_begin_forward(mf_backend *b, const mf_graph *g, const mf_cuda_args *a, mf_error *err) {
    return mf_cub_begin_forward(b, g, a, err);
}

int mf_cuda_execute_node(mf_backend *b, const mf_graph *g, int32_t node, const int32_t *in, int32_t out,
                         mf_kv_pair kv, const mf_cuda_args *a, mf_error *err) {
    return mf_cub_execute_node(b, g, node, in, out, kv, a, err);
}

int mf_cuda_repeat_calls(mf_backend *b, const mf_graph *g, const mf_cuda_args *a, mf_error *err) {
    return mf_cub_repeat_calls(b, g, a, err);
}

int mf_cuda_end_forward(mf_backend *b, const mf_graph *g, const mf_cuda_args *a, mf_error *err) {
    return mf_cub_end_forward(b, g, a, err);
}


int mf_backend_cuda_create(const mf_weights *w, const mf_backend_options *opt, mf_backend **out, mf_error *err) {
    *out = NULL;
    mf_backend_options def;
    if (!opt) {
        mf_backend_options_default(&def);
        opt = &def;
    }
    cu_ctx *c = mf_calloc(1, sizeof *c);
    mf_backend *b = mf_calloc(1, sizeof *b);
    b->ops = &cu_ops;
    b->kind = MF_BACKEND_CUDA;
    b->is_gpu = true;
    b->ctx = c;
    c->w = w;
    c->timeout_ms = opt->gpu_timeout_ms > 0 ? (long)opt->gpu_timeout_ms : 10000;
    c->trace = opt->trace;
    c->graphs_on = opt->graphs;
    c->rs_node = -1;
    c->pend_node = -1;
    if (mf_cub_open_device(c, opt->device, err))
        goto fail;
    if (!opt->fusion)
        mf_cuda_tune_no_fusions(&c->t);
    if (mf_cuda_tune_parse(&c->t, opt->tune, err))
        goto fail;
    if (opt->profile &&
        cudaEventCreate(&c->ht.ev[0]) == cudaSuccess && cudaEventCreate(&c->ht.ev[1]) == cudaSuccess)
        c->ht.on = true;
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaMallocHost((void **)&c->pin, PIN_BYTES);
    if (e == cudaSuccess)
        e = cudaHostAlloc((void **)&c->slot, MF_CU_SLOT_BYTES, cudaHostAllocMapped);
    if (e == cudaSuccess)
        e = cudaHostGetDevicePointer(&c->slot_dev, c->slot, 0);
    if (e == cudaSuccess)
        e = cudaHostAlloc((void **)&c->fault, sizeof *c->fault, cudaHostAllocMapped);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&c->dev_npast, sizeof *c->dev_npast);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&c->cnt, sizeof *c->cnt * CNT_MAX);
    if (e == cudaSuccess)
        e = cudaMemset(c->cnt, 0, sizeof *c->cnt * CNT_MAX);
    if (e != cudaSuccess) {
        cu_err(err, "stream / pinned staging setup", e, __FILE__, __LINE__);
        goto fail;
    }
    memset(c->fault, 0, sizeof *c->fault);
    if (mf_cub_upload_weights(c, opt->progress, opt->progress_user, err))
        goto fail;
    mf_log(MF_LOG_INFO, "cuda: using device %d: %s; %llu bytes of weights uploaded", c->device, c->desc,
           (unsigned long long)c->wbytes);
    *out = b;
    return 0;
fail:
    mf_error_prefix(err, "cuda backend");
    cu_free(b);
    return -1;
}

int mf_backend_cuda_new(const mf_weights *w, mf_backend **out, mf_error *err) {
    return mf_backend_cuda_create(w, NULL, out, err);
}

const char *mf_cuda_device_desc(const mf_backend *b) {
    return CX(b)->desc;
}

int mf_cuda_retune(mf_backend *b, const char *tune, mf_error *err) {
    cu_ctx *c = CX(b);
    if (mf_cuda_tune_parse(&c->t, tune, err))
        return -1;
    c->fruitless = 0;
    c->d2h_bytes = 0;
    return 0;
}

const mf_cuda_tune *mf_cuda_tuning(const mf_backend *b) {
    return &CX(b)->t;
}

void mf_cuda_set_tuning(mf_backend *b, const mf_cuda_tune *t) {
    cu_ctx *c = CX(b);
    c->t = *t;
    c->fruitless = 0;
    c->d2h_bytes = 0;
}

void mf_cuda_set_graphs(mf_backend *b, bool on) {
    cu_ctx *c = CX(b);
    c->graphs_on = on;
    c->fruitless = 0;
}

void mf_cuda_q8_ready_stats(const mf_backend *b, int64_t *read) {
    *read = CX(b)->n_q8_ready;
}

int64_t mf_cuda_short_rope_count(const mf_backend *b) {
    return CX(b)->n_short_rope;
}

int64_t mf_cuda_slot_count(const mf_backend *b) {
    return CX(b)->n_slot_w;
}

void mf_cuda_fuse_stats(const mf_backend *b, int64_t *adds, int64_t *norms) {
    *adds = CX(b)->n_fused_add;
    *norms = CX(b)->n_fused_norm;
}

int64_t mf_cuda_zc_count(const mf_backend *b) {
    return CX(b)->n_zc;
}

void mf_cuda_d2h_stats(const mf_backend *b, int64_t *chunked, int64_t *early_reads) {
    *chunked = CX(b)->n_d2h_chunked;
    *early_reads = CX(b)->n_d2h_early;
}

void mf_cuda_graph_stats(const mf_backend *b, int64_t *captures, int64_t *replays) {
    *captures = CX(b)->n_captures;
    *replays = CX(b)->n_replays;
}

int64_t mf_cuda_repeat_count(const mf_backend *b) {
    return CX(b)->n_repeats;
}
