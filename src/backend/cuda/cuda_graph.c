/* cuda_graph.c - CUDA graph record / replay of small forwards. */
#include "backend/cuda/cuda_ctx.h"

/* ---- forward hooks: CUDA graphs ------------------------------------------------------- */

/* A decode step launches a few hundred small kernels; their launch cost, not
 * the GPU, bounds small models. Between begin_forward and end_forward (a
 * forward of at most GRAPH_MAX_T tokens) execute_node only records its call.
 * end_forward then compares the forward with the ones seen before (the
 * graph pointer, a byte copy of its nodes, every call's buffer ids, the
 * shapes and the scratch pointers: everything a launch depends on except
 * n_past) and either
 *   - replays the captured CUDA graph (n_past uploaded to dev_npast first;
 *     captured kernels read it from there), or
 *   - on the second identical forward, captures the calls in stream capture
 *     mode, instantiates and launches the graph, or
 *   - runs the calls plainly and remembers the forward.
 * A capture that fails (say scratch would have to grow) is abandoned before
 * anything ran and the calls run plainly. Host copies, a synchronize or a
 * different graph inside a recording flush it (the calls run plainly, in
 * order), so multi-split forwards stay correct. After FRUITLESS_MAX captures
 * without a replay graphs turn off (a forward that never repeats). */

void mf_cub_gentry_clear(cu_gentry *e) {
    if (e->exec)
        cudaGraphExecDestroy(e->exec);
    free(e->nodes);
    free(e->calls);
    memset(e, 0, sizeof *e);
}

static int run_calls(mf_backend *b, const mf_graph *g, const cu_call *calls, int32_t n,
                     const mf_exec_args *a, mf_error *err) {
    cu_ctx *c = CX(b);
    if (mf_cub_slot_issue(c, err))
        return -1;
    if (!c->capturing) /* a capture keeps them: its fallback issues them again */
        mf_cub_slot_clear(c);
    for (int32_t i = 0; i < n; i++)
        if (mf_cub_exec_now(b, g, calls[i].node, calls[i].in, calls[i].out, calls[i].kv, a, err))
            return -1;
    return mf_cub_flush_pending(b, err); /* a capture must contain every launch */
}

int mf_cub_flush_recorded(mf_backend *b, mf_error *err) {
    cu_ctx *c = CX(b);
    if (!c->recording)
        return 0;
    c->recording = false;
    return run_calls(b, c->rec_g, c->rec, c->n_rec, &c->rec_a, err);
}

int mf_cub_begin_forward(mf_backend *b, const mf_graph *g, const mf_exec_args *a, mf_error *err) {
    cu_ctx *c = CX(b);
    (void)err;
    mf_cub_ht_begin(c);
    /* a recording still open belongs to a forward that failed before its
     * end_forward: its calls are dropped, never run late */
    c->recording = false;
    c->n_rec = 0;
    c->pend_node = -1; /* likewise a node it deferred (end_forward flushes one on success) */
    c->rs_node = -1;
    c->d2h_bytes = 0;
    mf_cub_slot_clear(c); /* likewise its slot writes */
    mf_cub_paged_forget(c);
    /* a paged forward's batch changes every step and its launches depend on
     * it (the work list): never recorded, so no replay sees a stale batch */
    if (!c->graphs_on || a->n_tokens > GRAPH_MAX_T || a->batch)
        return 0;
    c->recording = true;
    c->rec_g = g;
    c->rec_a = *a;
    c->n_rec = 0;
    return 0;
}

int mf_cub_execute_node(mf_backend *b, const mf_graph *g, int32_t node, const int32_t *in,
                           int32_t out, mf_kv_pair kv, const mf_exec_args *ea, mf_error *err) {
    cu_ctx *c = CX(b);
    if (c->recording && (g != c->rec_g || ea->n_past != c->rec_a.n_past ||
                         ea->n_tokens != c->rec_a.n_tokens || node < 0 || node >= g->n_nodes ||
                         g->nodes[node].n_src > MF_MAX_SRC) &&
        mf_cub_flush_recorded(b, err))
        return -1;
    if (!c->recording)
        return mf_cub_exec_now(b, g, node, in, out, kv, ea, err);
    if (c->n_rec == 0)
        mf_cub_ht_mark(c, HT_REC0);
    if (c->n_rec == c->cap_rec) {
        c->cap_rec = c->cap_rec ? 2 * c->cap_rec : 512;
        c->rec = mf_realloc(c->rec, (size_t)c->cap_rec * sizeof *c->rec);
    }
    cu_call *k = &c->rec[c->n_rec++];
    memset(k, 0, sizeof *k);
    k->node = node;
    k->out = out;
    k->kv = kv;
    for (int i = 0; i < g->nodes[node].n_src; i++)
        k->in[i] = in[i];
    return 0;
}

/* The engine's repeat_calls: the calls of a forward of graph build
 * g->stamp, taken from an entry that recorded that build (its calls are the
 * ones the engine would make now, backend.h), so end_forward matches and
 * replays without ~170 execute_node calls (tune repeat, default on). */
int mf_cub_repeat_calls(mf_backend *b, const mf_graph *g, const mf_exec_args *a, mf_error *err) {
    cu_ctx *c = CX(b);
    (void)err;
    if (!c->t.repeat || !c->recording || c->n_rec != 0 || g != c->rec_g || g->stamp == 0 ||
        a->n_past != c->rec_a.n_past || a->n_tokens != c->rec_a.n_tokens)
        return 0;
    const cu_gentry *e = NULL;
    for (int i = 0; i < N_GENTRY && !e; i++)
        if (c->ge[i].g == g && c->ge[i].stamp == g->stamp && c->ge[i].n_tokens == a->n_tokens && c->ge[i].calls)
            e = &c->ge[i];
    if (!e)
        return 0;
    if (c->cap_rec < e->n_calls) {
        c->cap_rec = e->n_calls;
        c->rec = mf_realloc(c->rec, (size_t)c->cap_rec * sizeof *c->rec);
    }
    mf_cub_ht_mark(c, HT_REC0);
    memcpy(c->rec, e->calls, (size_t)e->n_calls * sizeof *c->rec);
    c->n_rec = e->n_calls;
    c->n_repeats++;
    return 1;
}

static bool gentry_matches(const cu_ctx *c, const cu_gentry *e) {
    const mf_graph *g = c->rec_g;
    return e->g == g && e->n_nodes == g->n_nodes && e->kv_dim == g->kv_dim &&
           e->n_calls == c->n_rec && e->n_tokens == c->rec_a.n_tokens &&
           e->n_ctx == c->rec_a.n_ctx && e->kv_type == c->rec_a.kv_type &&
           e->attn_one == mf_cub_attn_one_now(c, &c->rec_a) && e->attn_short == c->t.attn_decode &&
           e->short_rope == c->t.short_rope && e->out_host == mf_cub_head_key(c, &c->rec_a) && e->zc == c->t.zc &&
           memcmp(e->scr, c->scr, sizeof e->scr) == 0 && e->n_slotw == c->n_slotw &&
           memcmp(e->slotw, c->slotw, (size_t)c->n_slotw * sizeof *c->slotw) == 0 &&
           memcmp(e->calls, c->rec, (size_t)c->n_rec * sizeof *c->rec) == 0 &&
           ((g->stamp != 0 && e->stamp == g->stamp) ||
            memcmp(e->nodes, g->nodes, (size_t)g->n_nodes * sizeof *g->nodes) == 0);
}

/* Enqueues the upload of the forward's n_past to dev_npast (before the
 * graph's kernels, in stream order), or puts it into the input slots. */
static int upload_npast(cu_ctx *c, int32_t n_past, mf_error *err) {
    const int rc = mf_cub_slot_put(c, c->dev_npast, &n_past, sizeof n_past, err);
    if (rc <= 0)
        return rc;
    if (c->pin_used + 256 > PIN_BYTES && mf_cub_wait(c, "n_past upload", err))
        return -1;
    memcpy(c->pin + c->pin_used, &n_past, sizeof n_past);
    CU_TRY(cudaMemcpyAsync(c->dev_npast, c->pin + c->pin_used, sizeof n_past, cudaMemcpyHostToDevice,
                           c->stream));
    c->pin_used += 256;
    return 0;
}

/* Captures the recorded calls into e->exec; false (nothing launched, the
 * stream out of capture mode) when any part fails. */
bool mf_cub_capture(mf_backend *b, cu_gentry *e, mf_error *err) {
    cu_ctx *c = CX(b);
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    c->capturing = true;
    mf_error cerr;
    int rc = run_calls(b, c->rec_g, c->rec, c->n_rec, &c->rec_a, &cerr);
    c->capturing = false;
    cudaGraph_t graph = NULL;
    cudaError_t ce = cudaStreamEndCapture(c->stream, &graph);
    bool ok = rc == 0 && ce == cudaSuccess && graph;
    if (ok && cudaGraphInstantiate(&e->exec, graph, 0) != cudaSuccess) {
        e->exec = NULL;
        ok = false;
    }
    if (graph)
        cudaGraphDestroy(graph);
    if (ok)
        mf_cub_slot_clear(c); /* the graph copies them out of the slots */
    if (!ok) {
        cudaGetLastError();
        mf_log(MF_LOG_DEBUG, "cuda: graph mf_cub_capture abandoned (%s); running the forward plainly",
               rc ? cerr.msg : cudaGetErrorName(ce));
    }
    (void)err;
    return ok;
}

int mf_cub_end_forward(mf_backend *b, const mf_graph *g, const mf_exec_args *a, mf_error *err) {
    cu_ctx *c = CX(b);
    if (!c->recording)
        return mf_cub_flush_pending(b, err);
    if (g != c->rec_g || a->n_past != c->rec_a.n_past)
        return mf_cub_flush_recorded(b, err);
    c->recording = false;
    if (c->n_rec == 0 || (int64_t)a->n_past + a->n_tokens > a->n_ctx)
        return run_calls(b, g, c->rec, c->n_rec, a, err); /* the plain path reports it */
    /* n_past for the captured kernels: into the slots (part of what a graph
     * must match), or uploaded now, ahead of the graph */
    if (upload_npast(c, a->n_past, err))
        return -1;
    cu_gentry *e = NULL;
    for (int i = 0; i < N_GENTRY; i++) /* two sessions' logits buffers: two entries, no recaptures */
        if (c->ge[i].g == g && c->ge[i].out_host == mf_cub_head_key(c, &c->rec_a))
            e = &c->ge[i];
    const bool match = e && gentry_matches(c, e);
    if (match && e->exec) {
        mf_cub_ht_mark(c, HT_MATCH);
        e->used = ++c->ge_clock;
        mf_cub_ring_note(c, "graph", "cudaGraphLaunch", c->n_rec, 1);
        c->ht.live = c->ht.on;
        mf_cub_ht_mark(c, HT_LAUNCH0);
        if (c->ht.live)
            CU_TRY(cudaEventRecord(c->ht.ev[0], c->stream));
        CU_TRY(cudaGraphLaunch(e->exec, c->stream));
        if (c->ht.live)
            CU_TRY(cudaEventRecord(c->ht.ev[1], c->stream));
        mf_cub_ht_mark(c, HT_LAUNCH1);
        if (c->n_slotw) /* the graph's first node reads them */
            c->slot_live = true;
        mf_cub_slot_clear(c);
        c->n_replays++;
        if (g->stamp) /* matched by its nodes: this build's calls too (repeat_calls) */
            e->stamp = g->stamp;
        /* the graph made the early logits copy (if it captured one) */
        mf_cub_d2h_set(c, e->d2h_id, e->out_host, e->d2h_bytes, e->d2h_zc);
        c->fruitless = 0;
        return 0;
    }
    if (match && !e->no_capture) {
        e->used = ++c->ge_clock;
        if (mf_cub_capture(b, e, err)) {
            mf_cub_ring_note(c, "graph", "cudaGraphLaunch(first)", c->n_rec, 1);
            e->d2h_id = c->d2h_id; /* what the captured calls copied early (run_head_zc) */
            e->d2h_bytes = c->d2h_host == e->out_host ? c->d2h_bytes : 0;
            e->d2h_zc = c->d2h_zc;
            CU_TRY(cudaGraphLaunch(e->exec, c->stream)); /* slot_issue in the capture marked the slots live */
            c->n_captures++;
            if (++c->fruitless >= FRUITLESS_MAX) {
                mf_log(MF_LOG_INFO, "cuda: %d graph captures without a replay; CUDA graphs off",
                       c->fruitless);
                c->graphs_on = false;
            }
            return 0;
        }
        e->no_capture = true;
        return run_calls(b, g, c->rec, c->n_rec, a, err);
    }
    cu_slotw slotw[MF_CU_SLOT_N]; /* the layout a capture of this forward will copy (run_calls clears it) */
    const int32_t n_slotw = c->n_slotw;
    memcpy(slotw, c->slotw, sizeof slotw);
    if (run_calls(b, g, c->rec, c->n_rec, a, err))
        return -1;
    if (match)
        return 0; /* capture failed before: stays plain */
    /* remember this forward (replacing the entry of this graph, else the
     * least recently used one) */
    if (!e) {
        e = &c->ge[0];
        for (int i = 1; i < N_GENTRY; i++)
            if (c->ge[i].used < e->used)
                e = &c->ge[i];
    }
    /* an exec being replaced may still run: the stream orders its
     * destruction after it (cudaGraphExecDestroy is safe for a launched
     * graph once the launch was enqueued) */
    mf_cub_gentry_clear(e);
    e->g = g;
    e->stamp = g->stamp;
    e->n_nodes = g->n_nodes;
    e->nodes = mf_malloc((size_t)(g->n_nodes > 0 ? g->n_nodes : 1) * sizeof *e->nodes);
    memcpy(e->nodes, g->nodes, (size_t)g->n_nodes * sizeof *g->nodes);
    e->kv_dim = g->kv_dim;
    e->calls = mf_malloc((size_t)c->n_rec * sizeof *e->calls);
    memcpy(e->calls, c->rec, (size_t)c->n_rec * sizeof *c->rec);
    e->n_calls = c->n_rec;
    e->n_tokens = a->n_tokens;
    e->n_ctx = a->n_ctx;
    e->kv_type = a->kv_type;
    e->attn_one = mf_cub_attn_one_now(c, a);
    e->attn_short = c->t.attn_decode;
    e->short_rope = c->t.short_rope;
    e->out_host = mf_cub_head_key(c, a);
    e->zc = c->t.zc;
    memcpy(e->slotw, slotw, sizeof slotw);
    e->n_slotw = n_slotw;
    memcpy(e->scr, c->scr, sizeof e->scr);
    e->used = ++c->ge_clock;
    return 0;
}
