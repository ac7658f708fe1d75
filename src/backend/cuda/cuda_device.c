/* cuda_device.c - the CUDA backend's device side: errors, the launch ring,
 * bounded waits, the buffer pool, host copies (staging, input slots),
 * pinned host memory, and the device choice and checks. */
#include "backend/cuda/cuda_ctx.h"

/* ---- host time of replayed forwards (MINFER_CUDA_HOST_TIMES=1) -------------------------- */

/* One replayed forward's marks (mf_time_ns) and the sums over all of them,
 * printed when the backend is freed: how much of a decode step the GPU is
 * busy and where the host spends the rest. */

void mf_cub_ht_mark(cu_ctx *c, int k) {
    if (c->ht.on)
        c->ht.t[k] = mf_time_ns();
}

/* Closes the forward begun at t[HT_BEGIN] when the next one begins. */
void mf_cub_ht_begin(cu_ctx *c) {
    cu_host_times *h = &c->ht;
    if (!h->on)
        return;
    const uint64_t now = mf_time_ns();
    if (h->live && h->t[HT_READ2]) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, h->ev[0], h->ev[1]) == cudaSuccess)
            h->sum[HT_N] += (double)ms * 1e6;
        h->sum[0] += (double)(h->t[HT_LAUNCH0] - h->t[HT_BEGIN]);
        if (h->t[HT_REC0] && h->t[HT_MATCH]) { /* inputs written, nodes recorded + matched */
            h->sum[HT_N + 1] += (double)(h->t[HT_REC0] - h->t[HT_BEGIN]);
            h->sum[HT_N + 2] += (double)(h->t[HT_MATCH] - h->t[HT_REC0]);
        }
        h->sum[1] += (double)(h->t[HT_LAUNCH1] - h->t[HT_LAUNCH0]);
        h->sum[2] += (double)(h->t[HT_SYNC1] - h->t[HT_SYNC0]);
        h->sum[3] += (double)(h->t[HT_READ1] - h->t[HT_READ0]);
        h->sum[4] += (double)(h->t[HT_READ2] - h->t[HT_READ1]);
        h->sum[5] += (double)(now - h->t[HT_READ2]);
        h->sum[6] += (double)(now - h->t[HT_BEGIN]);
        h->n++;
    }
    memset(h->t, 0, sizeof h->t);
    h->live = false;
    h->t[HT_BEGIN] = now;
}

void mf_cub_ht_print(const cu_host_times *h) {
    if (!h->on || h->n == 0)
        return;
    const double n = (double)h->n * 1e3;
    fprintf(stderr,
            "cuda host times, %lld replayed forwards, us each: wall %.1f = record+match %.1f (inputs %.1f, "
            "nodes recorded + matched %.1f, n_past upload the rest), "
            "cudaGraphLaunch %.1f, synchronize %.1f, read D2H %.1f, read memcpy %.1f, "
            "after read %.1f; graph on the GPU (events) %.1f\n",
            (long long)h->n, h->sum[6] / n, h->sum[0] / n, h->sum[HT_N + 1] / n, h->sum[HT_N + 2] / n,
            h->sum[1] / n, h->sum[2] / n, h->sum[3] / n, h->sum[4] / n, h->sum[5] / n, h->sum[HT_N] / n);
}


/* Prints the launch ring (oldest first) to stderr and appends the last three
 * launches to err's message. */
void mf_cub_dump_ring(cu_ctx *c, mf_error *err) {
    int64_t n = c->n_launched < TRACE_N ? c->n_launched : TRACE_N;
    fprintf(stderr, "cuda: last %lld kernels mf_cub_launched (oldest first):\n", (long long)n);
    for (int64_t i = c->n_launched - n; i < c->n_launched; i++) {
        const cu_trace *t = &c->ring[i % TRACE_N];
        fprintf(stderr, "  #%lld node %d '%s' (%s): %s [%lld x %lld]\n", (long long)i, t->node,
                t->name, t->op, t->kernel, (long long)t->d0, (long long)t->d1);
    }
    if (!err)
        return;
    char tail[200] = "";
    size_t len = 0;
    for (int64_t i = c->n_launched - (n < 3 ? n : 3); i < c->n_launched; i++) {
        const cu_trace *t = &c->ring[i % TRACE_N];
        int k = snprintf(tail + len, sizeof tail - len, "%s%s@%d'%s'", len ? ", " : "", t->kernel,
                         t->node, t->name);
        if (k < 0 || (size_t)k >= sizeof tail - len)
            break;
        len += (size_t)k;
    }
    size_t ml = strlen(err->msg);
    snprintf(err->msg + ml, sizeof err->msg - ml, "; last kernels: %s (16 on stderr)", tail);
}

/* ---- bounded waits ------------------------------------------------------------------ */

static void nap_us(long us) {
    struct timespec ts = {.tv_sec = 0, .tv_nsec = us * 1000L};
    nanosleep(&ts, NULL);
}

/* Waits until the stream is idle, at most timeout_ms: spins on
 * cudaStreamQuery for the first SPIN_NS, then sleeps in growing naps. Then
 * reports a fault a kernel recorded. `what` names the caller for the
 * message. The spin covers every decode step: a nap costs at least the
 * kernel's timer slack (~50 us), and 2 ms of spin (the old rule) put a
 * 7B decode step (2.6 ms) into naps of up to 320 us, 6 % of its wall time
 * (H200, MINFER_CUDA_HOST_TIMES, docs/PERF.md). */
#define SPIN_NS 100000000ull
int mf_cub_wait(cu_ctx *c, const char *what, mf_error *err) {
    const uint64_t t0 = mf_time_ns();
    const uint64_t limit = (uint64_t)c->timeout_ms * 1000000ull;
    long nap = 20;
    for (;;) {
        cudaError_t e = cudaStreamQuery(c->stream);
        if (e == cudaSuccess)
            break;
        if (e != cudaErrorNotReady) {
            cu_err(err, "cudaStreamQuery", e, __FILE__, __LINE__);
            mf_error_prefix(err, "cuda: %s", what);
            mf_cub_dump_ring(c, err);
            return -1;
        }
        const uint64_t dt = mf_time_ns() - t0;
        if (dt > limit) {
            mf_errorf(err, "cuda: %s: the GPU did not finish within %ld ms (MINFER_GPU_TIMEOUT_MS)",
                      what, c->timeout_ms);
            mf_cub_dump_ring(c, err);
            return -1;
        }
        if (dt > SPIN_NS) {
            nap_us(nap);
            if (nap < 1000)
                nap *= 2;
        }
    }
    c->pin_used = 0;
    c->slot_live = false;
    volatile mf_cu_fault *f = c->fault;
    if (f && f->code != MF_CU_FAULT_NONE) {
        int32_t code = f->code, node = f->node;
        long long v = (long long)f->value, lim = (long long)f->limit;
        f->code = MF_CU_FAULT_NONE;
        if (code == MF_CU_FAULT_TOKEN_ID)
            return mf_errorf(err, "cuda: %s: node %d (getrows): token id %lld outside [0, %lld)", what,
                             node, v, lim);
        return mf_errorf(err, "cuda: %s: node %d: device fault code %d (value %lld, limit %lld)", what,
                         node, code, v, lim);
    }
    return 0;
}

/* Waits for an event with the same deadline rule (weight upload). */
int mf_cub_wait_event(cu_ctx *c, cudaEvent_t ev, mf_error *err) {
    const uint64_t t0 = mf_time_ns();
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady)
            return cu_err(err, "cudaEventQuery", e, __FILE__, __LINE__);
        if (mf_time_ns() - t0 > (uint64_t)c->timeout_ms * 1000000ull)
            return mf_errorf(err, "cuda: weight upload did not finish within %ld ms", c->timeout_ms);
        nap_us(50);
    }
}

/* ---- buffer pool --------------------------------------------------------------------- */

static int32_t new_buf(cu_ctx *c, size_t nbytes, mf_error *err) {
    size_t sz = nbytes ? nbytes : 4;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, sz);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaGetLastError(); /* clear the allocation error */
        cudaMemGetInfo(&fr, &tot);
        mf_errorf(err, "cuda: cudaMalloc(%zu bytes) failed: %s (%zu of %zu bytes free) at %s:%d", sz,
                  cudaGetErrorName(e), fr, tot, __FILE__, __LINE__);
        return -1;
    }
    if (c->n_bufs == c->cap_bufs) {
        c->cap_bufs = c->cap_bufs ? 2 * c->cap_bufs : 64;
        c->bufs = mf_realloc(c->bufs, (size_t)c->cap_bufs * sizeof *c->bufs);
    }
    c->bufs[c->n_bufs] = (cu_buf){.p = p, .size = nbytes, .free = false};
    return c->n_bufs++;
}

/* Exact-size free list: a freed buffer of the same byte count is reused. */
int32_t mf_cub_alloc_buffer(mf_backend *b, size_t nbytes, mf_error *err) {
    cu_ctx *c = CX(b);
    for (int32_t i = 0; i < c->n_bufs; i++)
        if (c->bufs[i].free && c->bufs[i].size == nbytes && c->bufs[i].p) {
            c->bufs[i].free = false;
            return i;
        }
    return new_buf(c, nbytes, err);
}

/* Never from the free list: split staging must not clobber ids whose contents
 * are still in flight in this execute. It joins the free list when freed. */
int32_t mf_cub_alloc_fresh(mf_backend *b, size_t nbytes, mf_error *err) {
    return new_buf(CX(b), nbytes, err);
}

void mf_cub_free_buffer(mf_backend *b, int32_t id) {
    cu_ctx *c = CX(b);
    if (id >= 0 && id < c->n_bufs)
        c->bufs[id].free = true;
}

/* ---- host copies ------------------------------------------------------------------------ */


static int check_window(cu_ctx *c, int32_t id, size_t off, size_t nbytes, const char *what,
                        mf_error *err) {
    /* The free flag is not checked: the graph allocator frees ids during its
     * build-time liveness walk, so a "free" id can hold a live value at
     * execute time. Existing (allocated, not destroyed) is the invariant. */
    if (id < 0 || id >= c->n_bufs || !c->bufs[id].p)
        return mf_errorf(err, "cuda: %s: buffer id %d is not in the pool (%d buffers)", what, id,
                         c->n_bufs);
    if (off > c->bufs[id].size || nbytes > c->bufs[id].size - off)
        return mf_errorf(err, "cuda: %s: bytes [%zu, %zu) outside buffer %d of %zu bytes", what, off,
                         off + nbytes, id, c->bufs[id].size);
    return 0;
}

/* A launch of no node (a forward's graph, the slot copy) in the ring. */
void mf_cub_ring_note(cu_ctx *c, const char *op, const char *what, int64_t d0, int64_t d1) {
    cu_trace *t = &c->ring[c->n_launched++ % TRACE_N];
    memset(t, 0, sizeof *t);
    t->node = -1;
    snprintf(t->name, sizeof t->name, "forward");
    t->op = op;
    t->kernel = what;
    t->d0 = d0;
    t->d1 = d1;
}

/* tune slots: puts n bytes for device address dst into the
 * slots. 1: not taken (switch off, too big, slots full), copy it now; 0:
 * waiting in a slot; -1: error. Waits for the stream when a queued launch
 * still reads the slots (a decode loop has waited already: its logits read). */
int mf_cub_slot_put(cu_ctx *c, void *dst, const void *src, size_t n, mf_error *err) {
    const uint32_t at = (c->slot_used + 15u) & ~15u;
    if (!c->t.slots || !c->slot || n == 0 || n > SLOT_MAX_W || c->n_slotw == MF_CU_SLOT_N ||
        at + n > MF_CU_SLOT_BYTES)
        return 1;
    if (c->slot_live && mf_cub_wait(c, "input slots", err))
        return -1;
    memcpy(c->slot + at, src, n);
    c->slotw[c->n_slotw++] = (cu_slotw){.dst = dst, .off = at, .n = (uint32_t)n};
    c->slot_used = at + (uint32_t)n;
    c->n_slot_w++;
    return 0;
}

/* The copies out of the slots, in stream order before whatever follows
 * (inside a capture: the graph's first nodes). Kept for a capture's
 * fallback; cleared (slot_clear) once they are in a graph or ran. */
int mf_cub_slot_issue(cu_ctx *c, mf_error *err) {
    if (c->n_slotw == 0)
        return 0;
    c->slot_live = true;
    if (c->slot_dev) {
        mf_cu_slot_args a = {.src = c->slot_dev, .used = c->slot_used, .n = c->n_slotw, .pdl = c->t.pdl};
        for (int32_t i = 0; i < c->n_slotw; i++) {
            a.dst[i] = c->slotw[i].dst;
            a.off[i] = c->slotw[i].off;
            a.len[i] = c->slotw[i].n;
        }
        mf_cub_ring_note(c, "inputs", "slot_copy", c->n_slotw, c->slot_used);
        CU_TRY(mf_cu_slot_copy(&a, c->stream));
        return 0;
    }
    for (int32_t i = 0; i < c->n_slotw; i++)
        CU_TRY(cudaMemcpyAsync(c->slotw[i].dst, c->slot + c->slotw[i].off, c->slotw[i].n, cudaMemcpyHostToDevice,
                               c->stream));
    return 0;
}

void mf_cub_slot_clear(cu_ctx *c) {
    c->n_slotw = 0;
    c->slot_used = 0;
}

/* Copies into pinned staging and enqueues the upload; waits only when the
 * staging area is full. */
int mf_cub_write_host(mf_backend *b, int32_t id, size_t off, const void *src, size_t nbytes,
                         mf_error *err) {
    cu_ctx *c = CX(b);
    if (check_window(c, id, off, nbytes, "write_host", err))
        return -1;
    if (c->recording && c->n_rec > 0 && mf_cub_flush_recorded(b, err)) /* a split boundary */
        return -1;
    if (mf_cub_flush_pending(b, err))
        return -1;
    c->d2h_bytes = 0; /* the early logits copy is no longer what the buffer holds next */
    if (c->recording && c->n_rec == 0) { /* before the forward's first node: maybe a slot */
        const int rc = mf_cub_slot_put(c, (uint8_t *)c->bufs[id].p + off, src, nbytes, err);
        if (rc <= 0)
            return rc;
    }
    const uint8_t *s = src;
    while (nbytes > 0) {
        size_t chunk = nbytes < PIN_BYTES ? nbytes : PIN_BYTES;
        if (c->pin_used + chunk > PIN_BYTES && mf_cub_wait(c, "write_host", err))
            return -1;
        memcpy(c->pin + c->pin_used, s, chunk);
        CU_TRY(cudaMemcpyAsync((uint8_t *)c->bufs[id].p + off, c->pin + c->pin_used, chunk,
                               cudaMemcpyHostToDevice, c->stream));
        c->pin_used += (chunk + 255) & ~(size_t)255;
        s += chunk;
        off += chunk;
        nbytes -= chunk;
    }
    return 0;
}

/* ---- pinned host memory (host_alloc) ------------------------------------------------ */

void *mf_cub_host_alloc(mf_backend *b, size_t nbytes) {
    cu_ctx *c = CX(b);
    if (nbytes == 0 || nbytes > PINNED_MAX)
        return NULL;
    for (int i = 0; i < PINNED_N; i++) {
        if (c->pinned[i].p)
            continue;
        void *p = NULL;
        /* tune zc: kernels write the block (mapped; with UVA every
         * cudaHostAlloc block is, so a block from before the switch works too) */
        if (cudaHostAlloc(&p, nbytes, c->t.zc ? cudaHostAllocMapped : cudaHostAllocDefault) != cudaSuccess) {
            cudaGetLastError();
            return NULL;
        }
        c->pinned[i].p = p;
        c->pinned[i].n = nbytes;
        c->pinned[i].dev = NULL;
        if (c->t.zc && cudaHostGetDevicePointer(&c->pinned[i].dev, p, 0) != cudaSuccess) {
            cudaGetLastError(); /* zc_alias asks again; no alias: no ZC into this block */
            c->pinned[i].dev = NULL;
        }
        return p;
    }
    return NULL;
}


void mf_cub_host_free(mf_backend *b, void *p) {
    cu_ctx *c = CX(b);
    for (int i = 0; i < PINNED_N; i++)
        if (p && c->pinned[i].p == p) {
            /* a captured graph copying into the block (MINFER_CUDA_LOGITS_CHUNKS) must not replay */
            const uintptr_t b0 = (uintptr_t)p, b1 = b0 + c->pinned[i].n;
            for (int k = 0; k < N_GENTRY; k++)
                if ((uintptr_t)c->ge[k].out_host >= b0 && (uintptr_t)c->ge[k].out_host < b1)
                    mf_cub_gentry_clear(&c->ge[k]);
            if ((uintptr_t)c->d2h_host >= b0 && (uintptr_t)c->d2h_host < b1)
                c->d2h_bytes = 0;
            cudaFreeHost(p);
            c->pinned[i].p = NULL;
            c->pinned[i].dev = NULL;
        }
}

/* Whether [p, p + n) lies inside one of host_alloc's blocks. */
static bool is_pinned(const cu_ctx *c, const void *p, size_t n) {
    const uint8_t *q = p;
    for (int i = 0; i < PINNED_N; i++) {
        const uint8_t *b0 = c->pinned[i].p;
        if (b0 && q >= b0 && q <= b0 + c->pinned[i].n && n <= (size_t)(b0 + c->pinned[i].n - q))
            return true;
    }
    return false;
}

/* Stream-ordered (read_host_waits): the copy follows every launch before it
 * and the wait covers them, so the engine need not synchronize first. */
int mf_cub_read_host(mf_backend *b, int32_t id, size_t off, void *dst, size_t nbytes,
                        mf_error *err) {
    cu_ctx *c = CX(b);
    if (check_window(c, id, off, nbytes, "read_host", err))
        return -1;
    if (c->recording && mf_cub_flush_recorded(b, err))
        return -1;
    if (mf_cub_flush_pending(b, err))
        return -1;
    mf_cub_ht_mark(c, HT_READ0);
    if (c->d2h_bytes && id == c->d2h_id && off == 0 && dst == c->d2h_host && nbytes == c->d2h_bytes) {
        /* the ZC lm_head wrote these bytes where they are read: waiting
         * for the stream is the whole read */
        const int rc = mf_cub_wait(c, "read_host", err);
        mf_cub_ht_mark(c, HT_READ1);
        mf_cub_ht_mark(c, HT_READ2);
        c->n_d2h_early += rc == 0;
        return rc;
    }
    if (is_pinned(c, dst, nbytes)) { /* one DMA behind the queued work, no staging */
        CU_TRY(cudaMemcpyAsync(dst, (const uint8_t *)c->bufs[id].p + off, nbytes, cudaMemcpyDeviceToHost,
                               c->stream));
        const int rc = mf_cub_wait(c, "read_host", err);
        mf_cub_ht_mark(c, HT_READ1);
        mf_cub_ht_mark(c, HT_READ2);
        return rc;
    }
    uint8_t *d = dst;
    while (nbytes > 0) {
        size_t chunk = nbytes < PIN_BYTES ? nbytes : PIN_BYTES;
        if (mf_cub_wait(c, "read_host", err))
            return -1;
        CU_TRY(cudaMemcpyAsync(c->pin, (const uint8_t *)c->bufs[id].p + off, chunk,
                               cudaMemcpyDeviceToHost, c->stream));
        if (mf_cub_wait(c, "read_host", err))
            return -1;
        mf_cub_ht_mark(c, HT_READ1);
        memcpy(d, c->pin, chunk);
        d += chunk;
        off += chunk;
        nbytes -= chunk;
    }
    mf_cub_ht_mark(c, HT_READ2);
    return 0;
}

int mf_cub_synchronize(mf_backend *b, mf_error *err) {
    if (CX(b)->recording && mf_cub_flush_recorded(b, err))
        return -1;
    if (mf_cub_flush_pending(b, err))
        return -1;
    mf_cub_ht_mark(CX(b), HT_SYNC0);
    int rc = mf_cub_wait(CX(b), "synchronize", err);
    mf_cub_ht_mark(CX(b), HT_SYNC1);
    return rc;
}

/* Device choice and checks, before anything is allocated on it. */
int mf_cub_open_device(cu_ctx *c, int dev, mf_error *err) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
        return mf_errorf(err, "cuda: no usable device: cudaGetDeviceCount: %s (%s)", cudaGetErrorName(e),
                         cudaGetErrorString(e));
    if (count <= 0)
        return mf_errorf(err, "cuda: no CUDA device found");
    if (dev < 0 || dev >= count)
        return mf_errorf(err, "cuda: device %d asked for but %d device(s) exist", dev, count);
    c->device = dev;
    CU_TRY(cudaSetDevice(c->device));
    struct cudaDeviceProp p;
    CU_TRY(cudaGetDeviceProperties(&p, c->device));
    if (p.major < 7)
        return mf_errorf(err, "cuda: device %d '%s' has compute capability %d.%d; minfer needs 7.0 or newer",
                         c->device, p.name, p.major, p.minor);
    c->smem_per_block = p.sharedMemPerBlock;
    mf_cuda_tune_defaults(&c->t, 10 * p.major + p.minor, p.multiProcessorCount, p.sharedMemPerBlock);
    snprintf(c->desc, sizeof c->desc, "%s, cc %d.%d, %d SMs, %.1f GiB, %zu KiB shared/block", p.name,
             p.major, p.minor, p.multiProcessorCount, (double)p.totalGlobalMem / (1024.0 * 1024 * 1024),
             p.sharedMemPerBlock / 1024);
    const char *bad = "?";
    cudaError_t (*probes[])(size_t, const char **) = {
        mf_cu_probe_matmul, mf_cu_probe_norm, mf_cu_probe_rope, mf_cu_probe_elementwise,
        mf_cu_probe_getrows, mf_cu_probe_kv, mf_cu_probe_attn, mf_cu_probe_gemv_q8,
        mf_cu_probe_rope_store, mf_cu_probe_attn_decode, mf_cu_probe_attn_short};
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        e = probes[i](c->smem_per_block, &bad);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return mf_errorf(err, "cuda: kernel %s unusable on '%s' (cc %d.%d, %zu bytes shared/block): %s "
                             "(built for the wrong architecture? see MINFER_CUDA_ARCHS)",
                             bad, p.name, p.major, p.minor, c->smem_per_block, cudaGetErrorName(e));
        }
    }
    mf_cu_gemv_occupancy(&c->occ);
    cudaGetLastError();
    return 0;
}
