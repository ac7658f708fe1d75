/* cuda_backend.c - the CUDA backend: device, stream, buffer pool, weight
 * registry, the op dispatch (supports_op, execute_node) and the bounded
 * synchronize.
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
#include "backend/cuda/cuda_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_args.h"
#include "quant/quant.h"

/* Split-contract adapter (cu_execute_split, at cu_ops): the paths of this
 * file take the forward's values plus the read-back hint (out_host: where
 * the engine reads node out_node right after the forward), which
 * cu_execute_split derives from the split's read_back. */
typedef struct cu_args {
    int32_t n_past, n_tokens, n_ctx;
    uint32_t kv_type;
    void *out_host;
    int32_t out_node;
    size_t out_bytes;
} cu_args;
#define mf_exec_args cu_args

#define TRACE_N 16
#define N_SCRATCH 9
#define PIN_BYTES ((size_t)64 << 20)
#define PINNED_N 8                          /* host_alloc blocks at once */
#define PINNED_MAX ((size_t)256 << 20)      /* larger ones come from the C heap */
#define WEIGHT_ALIGN 256
#define NO_WEIGHT UINT64_MAX
#define N_GENTRY 4        /* forwards (graph identities) kept captured */
#define GRAPH_MAX_T 8     /* forwards of at most this many tokens are captured */
#define FRUITLESS_MAX 8   /* captures without a replay before graphs turn off */
#define LC_MAX 16         /* MINFER_CUDA_LOGITS_CHUNKS: most lm_head chunks */
#define Q8_SLOT 3         /* scratch slot of the int8 GEMV activations */
#define WF16_SLOT 4       /* prefill GEMM: a weight dequantized to f16 */
#define XF16_SLOT 5       /* prefill GEMM: the activations as f16 */
#define ATTN_SLOT 6       /* split-KV decode attention: per-split partial results */
#define Q8OUT_SLOT 7      /* an int8 activation a kernel writes as a by-product (q8_produced) while
                             it reads its own input from Q8_SLOT (the attention) */
/* Zeroed int32 counters for a kernel whose last block to finish a piece of
 * work does the step that needs all of it (the one-kernel split-KV decode's
 * combine). The kernel leaves every counter it touched at 0 again, so the
 * next launch and graph replays find zeros. */
#define CNT_MAX 65536
/* MINFER_CUDA_INPUT_SLOTS: a recorded forward's small inputs (token ids,
 * positions, n_past) wait in fixed pinned slots and are copied by the
 * forward's own first launches, inside its CUDA graph */
#define SLOT_MAX_W 256 /* bytes of one write that may wait in a slot (MF_CU_SLOT_N writes, MF_CU_SLOT_BYTES) */

typedef struct cu_buf {
    void *p;
    size_t size;
    bool free;
} cu_buf;

/* One deferred execute_node call of a recorded forward. */
typedef struct cu_call {
    int32_t node, out;
    int32_t in[MF_MAX_SRC];
    mf_kv_pair kv;
} cu_call;

/* One input write waiting in the slots: n bytes at slot offset off, for
 * device address dst. */
typedef struct cu_slotw {
    void *dst;
    uint32_t off, n;
} cu_slotw;

/* A forward seen before: the graph's nodes, the calls, the shapes and the
 * scratch pointers they launched with; exec once captured. */
typedef struct cu_gentry {
    const mf_graph *g;
    uint64_t stamp; /* g->stamp when recorded: equal stamps mean equal nodes (no memcmp) */
    mf_node *nodes;
    int32_t n_nodes;
    int64_t kv_dim;
    cu_call *calls;
    int32_t n_calls;
    int32_t n_tokens, n_ctx;
    uint32_t kv_type;
    void *scr[N_SCRATCH];
    cudaGraphExec_t exec;
    bool no_capture; /* a capture failed: run this one plainly */
    bool attn_one;   /* captured with the one-kernel decode attention (attn_one_now) */
    int32_t attn_short; /* ... and with MINFER_CUDA_ATTN_SHORT as it was (tests flip it) */
    int32_t short_rope; /* ... and MINFER_CUDA_SHORT_ROPE (cu_ctx.short_rope; tests flip it) */
    void *out_host;     /* the forward's out_host hint while LOGITS_ZC or LOGITS_CHUNKS is on (lc_key; else
                           NULL): the graph may write into it, so entries are found by (g, out_host) */
    int32_t d2h_id;     /* the early logits copy the graph makes (d2h_bytes 0: none; cu_ctx.d2h_*) */
    size_t d2h_bytes;
    bool d2h_zc;        /* ... made by the lm_head GEMV itself (MINFER_CUDA_LOGITS_ZC), not by chunk copies */
    int32_t zc;         /* captured with MINFER_CUDA_LOGITS_ZC as it was (cu_ctx.logits_zc; tests flip it) */
    cu_slotw slotw[MF_CU_SLOT_N]; /* the input copies the graph makes from the slots (cu_ctx.slotw) */
    int32_t n_slotw;
    uint64_t used;
} cu_gentry;

typedef struct cu_trace {
    int32_t node;
    char name[MF_NODE_NAME];
    const char *op;
    const char *kernel;
    int64_t d0, d1; /* the launch's leading extents (rows, tokens ...) */
} cu_trace;

/* marks of one replayed forward (cu_host_times.t) */
enum { HT_BEGIN, HT_REC0, HT_MATCH, HT_LAUNCH0, HT_LAUNCH1, HT_SYNC0, HT_SYNC1, HT_READ0, HT_READ1, HT_READ2,
       HT_N };

typedef struct cu_host_times {
    bool on, live;
    cudaEvent_t ev[2];
    uint64_t t[HT_N];
    double sum[HT_N + 3];
    int64_t n;
} cu_host_times;

typedef struct cu_ctx {
    const mf_weights *w;
    int device;
    char desc[160];
    size_t smem_per_block;
    cudaStream_t stream;

    cu_buf *bufs;
    int32_t n_bufs, cap_bufs;

    uint8_t *wmem;          /* every uploaded weight, WEIGHT_ALIGN-aligned */
    int64_t n_w;            /* weights in the table at construction */
    uint64_t *woff;         /* per weight index: offset in wmem or NO_WEIGHT */
    uint64_t wbytes;
    uint8_t *soa_mem;       /* MINFER_CUDA_SOA: plane copies of the Q4_0 / Q5_0 / Q8_0 weights (build_soa) */
    uint64_t *soff;         /* per weight index: offset in soa_mem or NO_WEIGHT (NULL: no copies) */
    uint64_t soa_bytes;

    uint8_t *pin;           /* pinned staging for host copies */
    size_t pin_used;
    /* MINFER_CUDA_INPUT_SLOTS (default 1): while a forward is recorded, its
     * small write_host calls (and the n_past upload) only fill these pinned
     * slots; the copies out of them are the first launches of run_calls, so
     * a captured graph holds them and a replay costs no copy call at all.
     * slot_live: a launch that reads the slots is queued and the stream has
     * not been waited for since (the next forward's writes wait first). */
    int input_slots; /* 1: one kernel copies them (slot_copy.cu), 2: a copy call each, 0: off */
    uint8_t *slot;
    void *slot_dev;  /* the slots' device alias (mapped) */
    cu_slotw slotw[MF_CU_SLOT_N];
    int32_t n_slotw;
    uint32_t slot_used;
    bool slot_live;
    int64_t n_slot_w; /* writes that took a slot (mf_cuda_slot_count) */

    void *scr[N_SCRATCH];
    size_t scr_cap[N_SCRATCH];

    mf_cu_fault *fault;     /* mapped pinned memory the kernels write */
    int32_t *cnt;           /* CNT_MAX zeroed counters (counters()) */

    /* An int8 activation a kernel wrote as a by-product (q8_produced): q8_buf
     * (layout of mf_cu_q8_bytes) holds the quantization of q8_of (q8_n
     * inputs per token, q8_nt tokens), valid while n_launched == q8_stamp
     * (no launch since). */
    const float *q8_of;
    void *q8_buf;
    int64_t q8_n, q8_nt, q8_stamp;

    cu_trace ring[TRACE_N];
    int64_t n_launched;
    long timeout_ms;
    int matmul_mode;
    int no_tc; /* MINFER_CUDA_NO_TC=1: SIMT GEMM tier for prefill */
    int no_mma; /* MINFER_CUDA_NO_MMA=1: the wmma TC tier for every nt > 8 (no mma tier) */
    int mma_min_nt; /* MINFER_CUDA_MMA_MIN_NT: the mma tier from this many tokens (0: 64) */
    uint64_t mma_chunk; /* f16 weight bytes per mma dequant chunk (0: 320 MiB; tests shrink it) */
    int no_mma_fuse;  /* MINFER_CUDA_NO_MMA_FUSE=1: QKV / gate+up as per-weight mma GEMMs */
    int no_mma_split; /* MINFER_CUDA_NO_MMA_SPLIT=1: no split-K in the mma tier */
    int mma_cfg;      /* MINFER_CUDA_MMA_CFG: mma GEMM tile config (0: the session-2 tiles) */
    int no_q8; /* MINFER_CUDA_NO_Q8=1: f32-activation GEMV for decode */
    int trace; /* MINFER_TRACE=1: every launch printed to stderr as it is made */
    int fuse;  /* MINFER_CUDA_FUSE_GEMV=1: QKV / gate+up(+SwiGLU) as one int8 GEMV launch */
    int fuse_rope; /* MINFER_CUDA_FUSE_ROPE=1: FUSED_QKV's rope q/k + store k/v as one launch */
    int fuse_add;  /* MINFER_CUDA_FUSE_ADD=1: MATMUL + the ADD of its result as one GEMV */
    int fuse_norm; /* MINFER_CUDA_FUSE_NORM=1: RMSNORM folded into the next fused node's quantization */
    int norm_mm;   /* MINFER_CUDA_NORM_MM (default 1): ... and into a plain MATMUL's (the lm_head) */
    int gemv_v2;   /* MINFER_CUDA_GEMV_V2=1: Q4_K decode GEMVs take the paired-unit kernel */
    int gemv_v1;   /* MINFER_CUDA_GEMV_V1=1: the int8 GEMVs on the v1 kernels (default: v3) */
    int gemv_auto; /* v3 only where it measured faster; MINFER_CUDA_GEMV_V3=1: v3 everywhere */
    int gemv_v4;   /* one-token GEMVs on the v4 kernel: -1 auto rule (default), MINFER_CUDA_GEMV_V4=U forces
                      U slices in flight (1, 2), =0 off */
    int soa;       /* MINFER_CUDA_SOA=1/2 (opt-in, read at creation): the one-token v4 GEMVs read the plane
                      copies build_soa made (mf_cuda_set_soa flips it; no copies: no effect) */
    int qkv_mix;   /* MINFER_CUDA_QKV_MIX (default 1): a fused QKV whose V is another type than Q/K (K-quant
                      mixes) as one v4 GEMV launch (mf_cu_q8v4_launch_mix); 0: one launch per type */
    int ffn_q8b;   /* MINFER_CUDA_FFN_Q8B (default 4): the decode FUSED_FFN's SwiGLU GEMV also writes the down
                      GEMV's int8 input (block-local kernel, gemv_q8v4.cu; mf_cu_gemv_q8_ffn_q8b_ok); the value
                      is the kernel's block form (1 .. MF_CU_Q8B_FORMS, args field q8b_form), 0 off */
    int gemv_pro;  /* int8 GEMV quantizes x in its prologue: 1 auto rule, 2 always (tests), 0 the separate
                      quantize kernels (opt-in MINFER_CUDA_GEMV_PROLOGUE=1) */
    int64_t n_q8_ready; /* int8 GEMVs that read an input a kernel before wrote (q8_produced; tests) */
    int flash;     /* MINFER_CUDA_FLASH_PREFILL=1: query-tiled attention for nt > 8 */
    int tc_attn;   /* tensor-core prefill attention for nt > 8 (MINFER_CUDA_NO_TC_ATTN=1 clears) */
    int flash_decode; /* MINFER_CUDA_NO_FLASH_DECODE=1 clears it: split-KV attention for nt <= 8 */
    int attn_one;  /* MINFER_CUDA_ATTN_ONE (default 1): that attention's combine (+ the o GEMV's quantize) in
                      the split kernel's last block per group: one kernel instead of three */
    int64_t attn_one_max; /* ... only while n_past + n_tokens <= this (MINFER_CUDA_ATTN_ONE_MAX, default 384):
                             a CUDA graph captured on either side is kept apart (cu_gentry.attn_one) */
    int attn_short; /* MINFER_CUDA_ATTN_SHORT (default 1): where the one-kernel decode would run, the
                       short-context kernel instead (attn_short.cu: no partials, no counters); 1: 12 warps a
                       block (384 rows a pass), 4: 4 warps (128 rows a pass) */
    int short_rope; /* MINFER_CUDA_SHORT_ROPE (default 1): a one-token FUSED_QKV's rope-store is folded into
                       the short-context attention right after it (rope_deferrable); rs_node >= 0: such a
                       rope-store is pending (rs_args), launched plainly by anything else (flush_rope) */
    const mf_graph *rs_g;
    int32_t rs_node;
    mf_cu_rope_store_args rs_args;
    int64_t n_short_rope; /* launches of that fold (mf_cuda_short_rope_count; a captured one counts once) */
    int logits_chunks; /* MINFER_CUDA_LOGITS_CHUNKS=K (opt-in, 2..LC_MAX; 0 off): the lm_head the engine reads
                          next (mf_exec_args.out_host) as K row chunks, each copied to the host on d2h_stream
                          while the next computes (lc_chunks, run_head_chunks) */
    cudaStream_t d2h_stream;
    cudaEvent_t d2h_ev[LC_MAX + 1]; /* [i]: chunk i done (fork); [LC_MAX]: copies done (join) */
    /* the copy the last forward already made (d2h_bytes 0: none): read_host
     * of exactly (d2h_id, offset 0, d2h_host, d2h_bytes) only waits */
    int32_t d2h_id;
    void *d2h_host;
    size_t d2h_bytes;
    int64_t n_d2h_chunked, n_d2h_early; /* mf_cuda_d2h_stats */
    int logits_zc; /* MINFER_CUDA_LOGITS_ZC (default 1): that lm_head's v4 GEMV also stores the logits into the
                      engine's pinned block through its device alias (zc_alias, run_head_zc): the read only
                      waits. Takes precedence over logits_chunks where both apply */
    bool d2h_zc;   /* the early bytes (d2h_*) are the ZC epilogue's, not chunk copies' */
    int64_t n_zc;  /* mf_cuda_zc_count */
    /* the deferred MATMUL of fuse_add or RMSNORM of fuse_norm (see exec_now);
     * pend_node < 0: none */
    const mf_graph *pend_g;
    int32_t pend_node, pend_in, pend_out;
    mf_exec_args pend_ea;

    /* CUDA graphs (see "forward hooks" below) */
    bool graphs_on;          /* MINFER_NO_CUDA_GRAPH=1 turns them off */
    bool recording;          /* inside begin/end_forward: execute_node defers */
    bool capturing;          /* launches go into a stream capture */
    const mf_graph *rec_g;
    mf_exec_args rec_a;
    cu_call *rec;
    int32_t n_rec, cap_rec;
    cu_gentry ge[N_GENTRY];
    uint64_t ge_clock;
    int32_t *dev_npast;      /* n_past of the forward, read by captured kernels */
    int32_t fruitless;       /* captures since the last replay */
    int64_t n_captures, n_replays;
    bool repeat;             /* MINFER_CUDA_REPEAT (default 1): cu_repeat_calls takes a recorded build's calls */
    int64_t n_repeats;
    int64_t n_fused_add, n_fused_norm; /* launches of the two deferrals (mf_cuda_fuse_stats) */
    cu_host_times ht;        /* MINFER_CUDA_HOST_TIMES=1: where a replayed forward's wall time goes */
    struct {                 /* cu_host_alloc's pinned blocks (read_host copies into them directly) */
        void *p;
        size_t n;
        void *dev;           /* its device alias once zc_alias asked for it (NULL: not yet) */
    } pinned[PINNED_N];
} cu_ctx;

#define CX(b) ((cu_ctx *)(b)->ctx)

/* ---- host time of replayed forwards (MINFER_CUDA_HOST_TIMES=1) -------------------------- */

/* One replayed forward's marks (mf_time_ns) and the sums over all of them,
 * printed when the backend is freed: how much of a decode step the GPU is
 * busy and where the host spends the rest. */

static void ht_mark(cu_ctx *c, int k) {
    if (c->ht.on)
        c->ht.t[k] = mf_time_ns();
}

/* Closes the forward begun at t[HT_BEGIN] when the next one begins. */
static void ht_begin(cu_ctx *c) {
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

static void ht_print(const cu_host_times *h) {
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

/* ---- errors ------------------------------------------------------------------------ */

static int cu_err(mf_error *err, const char *call, cudaError_t e, const char *file, int line) {
    return mf_errorf(err, "cuda: %s failed: %s (%s) at %s:%d", call, cudaGetErrorName(e),
                     cudaGetErrorString(e), file, line);
}

#define CU_TRY(call)                                                     \
    do {                                                                 \
        cudaError_t e_ = (call);                                         \
        if (e_ != cudaSuccess)                                           \
            return cu_err(err, #call, e_, __FILE__, __LINE__);           \
    } while (0)

/* Prints the launch ring (oldest first) to stderr and appends the last three
 * launches to err's message. */
static void dump_ring(cu_ctx *c, mf_error *err) {
    int64_t n = c->n_launched < TRACE_N ? c->n_launched : TRACE_N;
    fprintf(stderr, "cuda: last %lld kernels launched (oldest first):\n", (long long)n);
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
 * (H200, MINFER_CUDA_HOST_TIMES, docs/PERF.md entry 15). */
#define SPIN_NS 100000000ull
static int cu_wait(cu_ctx *c, const char *what, mf_error *err) {
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
            dump_ring(c, err);
            return -1;
        }
        const uint64_t dt = mf_time_ns() - t0;
        if (dt > limit) {
            mf_errorf(err, "cuda: %s: the GPU did not finish within %ld ms (MINFER_GPU_TIMEOUT_MS)",
                      what, c->timeout_ms);
            dump_ring(c, err);
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
static int cu_wait_event(cu_ctx *c, cudaEvent_t ev, mf_error *err) {
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
static int32_t cu_alloc_buffer(mf_backend *b, size_t nbytes, mf_error *err) {
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
static int32_t cu_alloc_fresh(mf_backend *b, size_t nbytes, mf_error *err) {
    return new_buf(CX(b), nbytes, err);
}

static void cu_free_buffer(mf_backend *b, int32_t id) {
    cu_ctx *c = CX(b);
    if (id >= 0 && id < c->n_bufs)
        c->bufs[id].free = true;
}

/* ---- host copies ------------------------------------------------------------------------ */

static int flush_recorded(mf_backend *b, mf_error *err);
static int flush_pending(mf_backend *b, mf_error *err);

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
static void ring_note(cu_ctx *c, const char *op, const char *what, int64_t d0, int64_t d1) {
    cu_trace *t = &c->ring[c->n_launched++ % TRACE_N];
    memset(t, 0, sizeof *t);
    t->node = -1;
    snprintf(t->name, sizeof t->name, "forward");
    t->op = op;
    t->kernel = what;
    t->d0 = d0;
    t->d1 = d1;
}

/* MINFER_CUDA_INPUT_SLOTS: puts n bytes for device address dst into the
 * slots. 1: not taken (switch off, too big, slots full), copy it now; 0:
 * waiting in a slot; -1: error. Waits for the stream when a queued launch
 * still reads the slots (a decode loop has waited already: its logits read). */
static int slot_put(cu_ctx *c, void *dst, const void *src, size_t n, mf_error *err) {
    const uint32_t at = (c->slot_used + 15u) & ~15u;
    if (!c->input_slots || !c->slot || n == 0 || n > SLOT_MAX_W || c->n_slotw == MF_CU_SLOT_N ||
        at + n > MF_CU_SLOT_BYTES)
        return 1;
    if (c->slot_live && cu_wait(c, "input slots", err))
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
static int slot_issue(cu_ctx *c, mf_error *err) {
    if (c->n_slotw == 0)
        return 0;
    c->slot_live = true;
    if (c->input_slots == 1 && c->slot_dev) {
        mf_cu_slot_args a = {.src = c->slot_dev, .used = c->slot_used, .n = c->n_slotw};
        for (int32_t i = 0; i < c->n_slotw; i++) {
            a.dst[i] = c->slotw[i].dst;
            a.off[i] = c->slotw[i].off;
            a.len[i] = c->slotw[i].n;
        }
        ring_note(c, "inputs", "slot_copy", c->n_slotw, c->slot_used);
        CU_TRY(mf_cu_slot_copy(&a, c->stream));
        return 0;
    }
    for (int32_t i = 0; i < c->n_slotw; i++)
        CU_TRY(cudaMemcpyAsync(c->slotw[i].dst, c->slot + c->slotw[i].off, c->slotw[i].n, cudaMemcpyHostToDevice,
                               c->stream));
    return 0;
}

static void slot_clear(cu_ctx *c) {
    c->n_slotw = 0;
    c->slot_used = 0;
}

/* Copies into pinned staging and enqueues the upload; waits only when the
 * staging area is full. */
static int cu_write_host(mf_backend *b, int32_t id, size_t off, const void *src, size_t nbytes,
                         mf_error *err) {
    cu_ctx *c = CX(b);
    if (check_window(c, id, off, nbytes, "write_host", err))
        return -1;
    if (c->recording && c->n_rec > 0 && flush_recorded(b, err)) /* a split boundary */
        return -1;
    if (flush_pending(b, err))
        return -1;
    c->d2h_bytes = 0; /* the early logits copy is no longer what the buffer holds next */
    if (c->recording && c->n_rec == 0) { /* before the forward's first node: maybe a slot */
        const int rc = slot_put(c, (uint8_t *)c->bufs[id].p + off, src, nbytes, err);
        if (rc <= 0)
            return rc;
    }
    const uint8_t *s = src;
    while (nbytes > 0) {
        size_t chunk = nbytes < PIN_BYTES ? nbytes : PIN_BYTES;
        if (c->pin_used + chunk > PIN_BYTES && cu_wait(c, "write_host", err))
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

static void *cu_host_alloc(mf_backend *b, size_t nbytes) {
    cu_ctx *c = CX(b);
    if (nbytes == 0 || nbytes > PINNED_MAX)
        return NULL;
    for (int i = 0; i < PINNED_N; i++) {
        if (c->pinned[i].p)
            continue;
        void *p = NULL;
        /* MINFER_CUDA_LOGITS_ZC: kernels write the block (mapped; with UVA every
         * cudaHostAlloc block is, so a block from before the switch works too) */
        if (cudaHostAlloc(&p, nbytes, c->logits_zc ? cudaHostAllocMapped : cudaHostAllocDefault) != cudaSuccess) {
            cudaGetLastError();
            return NULL;
        }
        c->pinned[i].p = p;
        c->pinned[i].n = nbytes;
        c->pinned[i].dev = NULL;
        if (c->logits_zc && cudaHostGetDevicePointer(&c->pinned[i].dev, p, 0) != cudaSuccess) {
            cudaGetLastError(); /* zc_alias asks again; no alias: no ZC into this block */
            c->pinned[i].dev = NULL;
        }
        return p;
    }
    return NULL;
}

static void gentry_clear(cu_gentry *e);

static void cu_host_free(mf_backend *b, void *p) {
    cu_ctx *c = CX(b);
    for (int i = 0; i < PINNED_N; i++)
        if (p && c->pinned[i].p == p) {
            /* a captured graph copying into the block (MINFER_CUDA_LOGITS_CHUNKS) must not replay */
            const uintptr_t b0 = (uintptr_t)p, b1 = b0 + c->pinned[i].n;
            for (int k = 0; k < N_GENTRY; k++)
                if ((uintptr_t)c->ge[k].out_host >= b0 && (uintptr_t)c->ge[k].out_host < b1)
                    gentry_clear(&c->ge[k]);
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
static int cu_read_host(mf_backend *b, int32_t id, size_t off, void *dst, size_t nbytes,
                        mf_error *err) {
    cu_ctx *c = CX(b);
    if (check_window(c, id, off, nbytes, "read_host", err))
        return -1;
    if (c->recording && flush_recorded(b, err))
        return -1;
    if (flush_pending(b, err))
        return -1;
    ht_mark(c, HT_READ0);
    if (c->d2h_bytes && id == c->d2h_id && off == 0 && dst == c->d2h_host && nbytes == c->d2h_bytes) {
        /* MINFER_CUDA_LOGITS_CHUNKS: the chunks' copies carry these bytes and the
         * stream joined them: waiting for it is the whole read */
        const int rc = cu_wait(c, "read_host", err);
        ht_mark(c, HT_READ1);
        ht_mark(c, HT_READ2);
        c->n_d2h_early += rc == 0;
        return rc;
    }
    if (is_pinned(c, dst, nbytes)) { /* one DMA behind the queued work, no staging */
        CU_TRY(cudaMemcpyAsync(dst, (const uint8_t *)c->bufs[id].p + off, nbytes, cudaMemcpyDeviceToHost,
                               c->stream));
        const int rc = cu_wait(c, "read_host", err);
        ht_mark(c, HT_READ1);
        ht_mark(c, HT_READ2);
        return rc;
    }
    uint8_t *d = dst;
    while (nbytes > 0) {
        size_t chunk = nbytes < PIN_BYTES ? nbytes : PIN_BYTES;
        if (cu_wait(c, "read_host", err))
            return -1;
        CU_TRY(cudaMemcpyAsync(c->pin, (const uint8_t *)c->bufs[id].p + off, chunk,
                               cudaMemcpyDeviceToHost, c->stream));
        if (cu_wait(c, "read_host", err))
            return -1;
        ht_mark(c, HT_READ1);
        memcpy(d, c->pin, chunk);
        d += chunk;
        off += chunk;
        nbytes -= chunk;
    }
    ht_mark(c, HT_READ2);
    return 0;
}

static int cu_synchronize(mf_backend *b, mf_error *err) {
    if (CX(b)->recording && flush_recorded(b, err))
        return -1;
    if (flush_pending(b, err))
        return -1;
    ht_mark(CX(b), HT_SYNC0);
    int rc = cu_wait(CX(b), "synchronize", err);
    ht_mark(CX(b), HT_SYNC1);
    return rc;
}

/* ---- weights ------------------------------------------------------------------------------ */

static const mf_weight *weight_at_name(const cu_ctx *c, const char *name, int64_t *idx) {
    const mf_weight *wt = mf_weights_find(c->w, name);
    if (!wt)
        return NULL;
    int64_t i = wt - mf_weights_at(c->w, 0);
    if (i < 0 || i >= c->n_w || c->woff[i] == NO_WEIGHT)
        return NULL;
    *idx = i;
    return wt;
}

static bool cu_has_weight(const mf_backend *b, const char *name) {
    int64_t i;
    return name && weight_at_name(CX(b), name, &i) != NULL;
}

/* Bytes of one row of a weight of `type` with n elements, 0 when impossible. */
static size_t row_bytes(uint32_t type, int64_t n) {
    return mf_type_row_size(type, n);
}

static bool uploadable(const mf_weight *wt) {
    if (!mf_cu_type_supported(wt->type) || !wt->data || wt->nbytes == 0)
        return false;
    const size_t rb = row_bytes(wt->type, wt->ne[0]);
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
static int upload_weights(cu_ctx *c, mf_cuda_progress_fn progress, void *user, mf_error *err) {
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
            if (used[k] && cu_wait_event(c, ev[k], err)) {
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
        rc = cu_wait(c, "weight upload", err);
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    return rc;
}

/* MINFER_CUDA_SOA=2: a plane copy only where the H200 measured it faster
 * (session 6, device run 3, the v4 GEMV alone): Q4_0 (896 -> 9728 +11 %,
 * 3584 -> 37888 +5 %) and Q8_0 rows of >= 2048 (3584 -> 18944 +6 %, 4864 ->
 * 896 +5 %); not Q5_0 (896 -> 9728 -6 %) nor the 896-wide Q8_0 lm_head
 * (-6 %). =1: every Q4_0 / Q5_0 / Q8_0 matrix. */
static bool soa_wanted(int mode, uint32_t type, int64_t n_in) {
    return mode == 1 || type == MF_TYPE_Q4_0 || (type == MF_TYPE_Q8_0 && n_in >= 2048);
}

/* MINFER_CUDA_SOA: a plane copy (soa.cu; layout in q8w_soa.cuh) of every
 * uploaded Q4_0 / Q5_0 / Q8_0 matrix of >= 2 rows soa_wanted picks, relaid out on the
 * device from the block copy into one allocation of its own, for the
 * one-token v4 GEMVs (the block copy stays: prefill, getrows, v1 / v3 read
 * it). Only while >= 1 GiB stays free after it; else, or when the
 * allocation or a relayout launch fails, one info line and no copies (the
 * load never fails for it). -1 only when the wait for the relayouts fails
 * (the device is gone). */
static int build_soa(cu_ctx *c, mf_error *err) {
    if (!c->soa || c->n_w <= 0 || !c->wmem)
        return 0;
    c->soff = mf_malloc((size_t)c->n_w * sizeof *c->soff);
    uint64_t total = 0;
    int64_t n = 0;
    for (int64_t i = 0; i < c->n_w; i++) {
        const mf_weight *wt = mf_weights_at(c->w, i);
        c->soff[i] = NO_WEIGHT;
        const int64_t rows = wt->ne[1] > 0 ? wt->ne[1] : 1;
        const uint64_t st = mf_cu_soa_stride(wt->type, wt->ne[0]);
        if (c->woff[i] == NO_WEIGHT || st == 0 || rows < 2 || (wt->n_dims > 2 && (wt->ne[2] > 1 || wt->ne[3] > 1)) ||
            !soa_wanted(c->soa, wt->type, wt->ne[0]))
            continue;
        c->soff[i] = total;
        total += (st * (uint64_t)rows + WEIGHT_ALIGN - 1) & ~(uint64_t)(WEIGHT_ALIGN - 1);
        n++;
    }
    size_t fr = 0, tot = 0;
    const uint64_t keep = (uint64_t)1 << 30;
    cudaError_t e = total ? cudaMemGetInfo(&fr, &tot) : cudaSuccess;
    if (total == 0 || e != cudaSuccess || (uint64_t)fr < total + keep) {
        if (total)
            mf_log(MF_LOG_INFO, "cuda: MINFER_CUDA_SOA: plane copies of %lld weights need %llu bytes, %zu free "
                   "(1 GiB must stay free); the GEMVs read the block copies", (long long)n,
                   (unsigned long long)total, fr);
        free(c->soff);
        c->soff = NULL;
        cudaGetLastError();
        return 0;
    }
    e = cudaMalloc((void **)&c->soa_mem, total);
    for (int64_t i = 0; i < c->n_w && e == cudaSuccess; i++) {
        const mf_weight *wt = mf_weights_at(c->w, i);
        if (c->soff[i] != NO_WEIGHT)
            e = mf_cu_soa_relayout(wt->type, c->wmem + c->woff[i], wt->ne[0], wt->ne[1] > 0 ? wt->ne[1] : 1,
                                   c->soa_mem + c->soff[i], c->stream);
    }
    if (e != cudaSuccess) {
        mf_log(MF_LOG_INFO, "cuda: MINFER_CUDA_SOA: plane copies of %lld weights (%llu bytes) failed (%s); the "
               "GEMVs read the block copies", (long long)n, (unsigned long long)total, cudaGetErrorName(e));
        cudaGetLastError();
        if (c->soa_mem) { /* relayouts of it may be queued */
            if (cu_wait(c, "plane copies of the weights", err))
                return -1;
            cudaFree(c->soa_mem);
            c->soa_mem = NULL;
        }
        free(c->soff);
        c->soff = NULL;
        return 0;
    }
    if (cu_wait(c, "plane copies of the weights", err))
        return -1;
    c->soa_bytes = total;
    mf_log(MF_LOG_INFO, "cuda: MINFER_CUDA_SOA: plane copies of %lld weights, %llu bytes", (long long)n,
           (unsigned long long)total);
    return 0;
}

/* ---- capability -------------------------------------------------------------------------- */

static bool is_kquant(uint32_t t) {
    return t == MF_TYPE_Q2_K || t == MF_TYPE_Q3_K || t == MF_TYPE_Q4_K || t == MF_TYPE_Q5_K ||
           t == MF_TYPE_Q6_K;
}

static bool mm_ok(const mf_matmul_meta *m) {
    if (!mf_cu_type_supported(m->wtype) || m->n_in <= 0 || m->n_out <= 0)
        return false;
    if (is_kquant(m->wtype) && m->n_in % MF_QK_K != 0)
        return false; /* the kernels walk whole super-blocks: a tail would be dropped */
    return row_bytes(m->wtype, m->n_in) != 0;
}

static bool norm_weight_ok(const cu_ctx *c, const char *name) {
    if (!name)
        return true;
    const mf_weight *wt = mf_weights_find(c->w, name);
    return !wt || wt->type == MF_TYPE_F32; /* a missing one is the gate's business */
}

static const char *cu_name(const mf_backend *b) {
    return "cuda";
}

static bool cu_supports_op(const mf_backend *b, const mf_node *n) {
    const cu_ctx *c = CX(b);
    switch (n->op) {
    case MF_OP_MATMUL:
        return mm_ok(&n->meta.matmul);
    case MF_OP_GETROWS:
        if (n->meta.getrows.mode == 0)
            return mf_cu_type_supported(n->meta.getrows.wtype) &&
                   row_bytes(n->meta.getrows.wtype, n->ne[0]) != 0;
        return true;
    case MF_OP_RMSNORM:
    case MF_OP_QKNORM:
        return norm_weight_ok(c, n->meta.norm.weight);
    case MF_OP_ATTN:
        return n->meta.attn.head_dim > 0 && n->meta.attn.head_dim <= MF_CU_ATTN_MAX_HEAD_DIM;
    case MF_OP_ATTN_PAGED:
        return false; /* not in cu_table: runs on the CPU */
    case MF_OP_FUSED_QKV:
    case MF_OP_FUSED_QKV_NORM:
        if (!mm_ok(&n->meta.qkv.q) || !mm_ok(&n->meta.qkv.k) || !mm_ok(&n->meta.qkv.v))
            return false;
        /* fall through */
    case MF_OP_QKV_BIAS_ROPE_STORE:
        return n->meta.qkv.head_dim > 0 && norm_weight_ok(c, n->meta.qkv.q_norm) &&
               norm_weight_ok(c, n->meta.qkv.k_norm);
    case MF_OP_FUSED_FFN:
        return mm_ok(&n->meta.ffn.gate) && mm_ok(&n->meta.ffn.up);
    default:
        return (unsigned)n->op < MF_OP_COUNT;
    }
}

static bool cu_supports_fused(const mf_backend *b, mf_fused_kind kind) {
    return kind < MF_FUSE_COUNT;
}

/* ---- execute: helpers ---------------------------------------------------------------------- */

typedef struct exec {
    cu_ctx *c;
    const mf_graph *g;
    const mf_node *n;
    int32_t id;
    mf_error *err;
    const int32_t *npast_dev; /* capturing: n_past lives here, not in launch arguments */
    /* MINFER_CUDA_FUSE_NORM: the node's input is RMSNorm(norm_x) (not launched) */
    bool norm;
    const float *norm_x, *norm_w;
    float norm_eps;
    /* the x this node last converted to f16 in XF16_SLOT for the mma tier
     * (the fused QKV / FFN matmuls share it); NULL: none */
    const float *xf16_of;
    int64_t xf16_n_in;
    /* MINFER_CUDA_FFN_Q8B: this node's SwiGLU GEMV (run_multi) also writes
     * its output's int8 quantization where the kernel allows (q8_produced) */
    bool q8b;
    /* MINFER_CUDA_LOGITS_CHUNKS (run_head_chunks): run_multi of one weight
     * computes only rows [win0, win1) (win1 0: all), reading x's int8 copy
     * from q8_in when set (an earlier chunk quantized it); q8_used: the int8
     * copy run_multi's launch read */
    int64_t win0, win1;
    void *q8_in, *q8_used;
    /* MINFER_CUDA_LOGITS_ZC (run_head_zc): run_multi of one weight also
     * stores y into this device alias of host memory (NULL: no) */
    float *zc_host;
} exec;

#define NODE_ERR(x, fmt, ...)                                                                   \
    mf_errorf((x)->err, "cuda: node %d '%s' (%s): " fmt, (x)->id, (x)->n->name,                 \
              mf_op_name((x)->n->op), __VA_ARGS__)

/* The device pointer of buffer `id` after checking it holds `need` bytes. */
static void *buf_ptr(exec *x, int32_t id, size_t need, const char *role) {
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

static size_t f32b(int64_t n) {
    return n > 0 ? (size_t)n * 4 : 0;
}

/* Scratch slot k with at least nbytes (grown after waiting for the stream,
 * since kernels in flight may still use the old one). */
static float *scratch(exec *x, int k, size_t nbytes) {
    cu_ctx *c = x->c;
    if (c->scr_cap[k] >= nbytes)
        return c->scr[k];
    if (c->capturing) { /* no waits or allocations inside a capture: it is abandoned */
        NODE_ERR(x, "scratch %d must grow to %zu bytes during a CUDA graph capture", k, nbytes);
        return NULL;
    }
    if (cu_wait(c, "growing scratch", x->err))
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
        NODE_ERR(x, "scratch of %zu bytes: cudaMalloc failed: %s", want, cudaGetErrorName(e));
        return NULL;
    }
    c->scr_cap[k] = want;
    return c->scr[k];
}

/* Whether a forward at ea's position takes the one-kernel split-KV decode
 * (MINFER_CUDA_ATTN_ONE): its last block combines every active split alone,
 * which costs more than the second kernel once the context is long. */
static bool attn_one_now(const cu_ctx *c, const mf_exec_args *ea) {
    return c->attn_one && (int64_t)ea->n_past + ea->n_tokens <= c->attn_one_max;
}

/* n zeroed counters, or NULL with the error set when there are fewer. The
 * user must leave them at 0. */
static int32_t *counters(exec *x, int64_t n) {
    if (n < 0 || n > CNT_MAX) {
        NODE_ERR(x, "%lld counters asked of %d", (long long)n, CNT_MAX);
        return NULL;
    }
    return x->c->cnt;
}

/* Call right after a launch that also wrote into q8 (a scratch of at least
 * mf_cu_q8_bytes(n_in, nt); Q8OUT_SLOT when the kernel reads Q8_SLOT) the
 * int8 quantization of the nt rows of `of`: the next launch, if it is an
 * int8 GEMV of that x without a folded norm (run_multi), reads q8 and skips
 * its quantize kernel. Any launch in between invalidates it. */
static void q8_produced(exec *x, const float *of, int64_t n_in, int64_t nt, void *q8) {
    cu_ctx *c = x->c;
    c->q8_nt = nt;
    c->q8_buf = q8;
    c->q8_of = of;
    c->q8_n = n_in;
    c->q8_stamp = c->n_launched;
}

/* Records a launch in the ring and turns its launch status into an error. */
static int launched(exec *x, const char *kernel, int64_t d0, int64_t d1, cudaError_t e) {
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
    dump_ring(c, x->err);
    return -1;
}

/* Device pointer of weight `name` checked against type and shape. */
static const void *weight_ptr(exec *x, const char *name, uint32_t type, int64_t ne0, int64_t ne1) {
    int64_t i;
    const mf_weight *wt = name ? weight_at_name(x->c, name, &i) : NULL;
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

/* The plane copy of weight `name` for the v4 GEMV (MINFER_CUDA_SOA) and its
 * row stride, or NULL (switch off, no copy). Call after weight_ptr checked
 * the weight. */
static const void *weight_soa(const exec *x, const char *name, uint64_t *stride) {
    const cu_ctx *c = x->c;
    int64_t i;
    *stride = 0;
    const mf_weight *wt = c->soa && c->soa_mem && name ? weight_at_name(c, name, &i) : NULL;
    if (!wt || c->soff[i] == NO_WEIGHT)
        return NULL;
    *stride = mf_cu_soa_stride(wt->type, wt->ne[0]);
    return c->soa_mem + c->soff[i];
}

static const float *norm_weight(exec *x, const char *name, int64_t n) {
    if (!name)
        return NULL;
    return weight_ptr(x, name, MF_TYPE_F32, n, 1);
}

static int run_multi(exec *x, const mf_matmul_meta *const *mm, int n, bool swiglu, const float *in,
                     float *const *y, const float *const *res, int64_t nt);

/* y (n_out x nt) = W x (+ bias) with the node's matmul meta; y must not alias x. */
static int run_matmul(exec *x, const mf_matmul_meta *m, const float *in, float *y, int64_t nt) {
    if (!mm_ok(m))
        return NODE_ERR(x, "weight '%s' of type %s with n_in %lld has no CUDA kernel (K-quants need "
                        "n_in %% 256 == 0)", m->weight, mf_type_name(m->wtype), (long long)m->n_in);
    const void *w = weight_ptr(x, m->weight, m->wtype, m->n_in, m->n_out);
    if (!w)
        return -1;
    const float *bias = NULL;
    if (m->bias && !(bias = weight_ptr(x, m->bias, MF_TYPE_F32, m->n_out, 1)))
        return -1;
    mf_cu_matmul_args a = {.wtype = m->wtype, .w = w, .row_bytes = row_bytes(m->wtype, m->n_in),
                           .x = in, .bias = bias, .y = y, .n_in = m->n_in, .n_out = m->n_out,
                           .nt = nt, .force_gemm = x->c->matmul_mode, .no_tc = x->c->no_tc,
                           .gemv_v1 = x->c->gemv_v1, .gemv_auto = x->c->gemv_auto,
                           .gemv_v4 = x->c->gemv_v4, .prologue = x->c->gemv_pro};
    a.w_soa = weight_soa(x, m->weight, &a.soa_stride);
    const int mode = x->c->matmul_mode;
    const bool q8 = mf_cu_q8_supported(m->wtype, m->n_in) && nt <= 8 &&
                    (mode == -2 || (mode == 0 && !x->c->no_q8));
    if (mode == -2 && !q8)
        return NODE_ERR(x, "int8 GEMV forced for weight '%s' (%s, n_in %lld, nt %lld) it cannot run",
                        m->weight, mf_type_name(m->wtype), (long long)m->n_in, (long long)nt);
    if (q8 && x->c->gemv_v2 && m->wtype == MF_TYPE_Q4_K) { /* the paired-unit kernel */
        const mf_matmul_meta *mm[1] = {m};
        float *const ys[1] = {y};
        return run_multi(x, mm, 1, false, in, ys, NULL, nt);
    }
    if (q8 && !(a.q8 = scratch(x, Q8_SLOT, mf_cu_q8_bytes(m->n_in, nt))))
        return -1;
    a.no_mma = x->c->no_mma;
    a.mma_min_nt = x->c->mma_min_nt;
    a.wchunk_bytes = x->c->mma_chunk;
    a.no_split = x->c->no_mma_split;
    a.mma_cfg = x->c->mma_cfg;
    if (!q8 && mf_cu_mma_wanted(&a)) {
        size_t wb, xb;
        mf_cu_mma_scratch(&a, &wb, &xb);
        if (wb && !(a.wf16 = scratch(x, WF16_SLOT, wb)))
            return -1;
        if (!(a.xf16 = scratch(x, XF16_SLOT, xb)))
            return -1;
        /* the same x of the same node (fused QKV / gate+up): converted once */
        a.x_ready = x->xf16_of == in && x->xf16_n_in == m->n_in;
        const cudaError_t e = mf_cu_matmul(&a, x->c->stream);
        x->xf16_of = e == cudaSuccess ? in : NULL;
        x->xf16_n_in = m->n_in;
        return launched(x, a.x_ready ? "matmul(mma, x ready)" : "matmul(mma)", m->n_out, nt, e);
    }
    return launched(x, q8 ? "matmul(q8)" : "matmul", m->n_out, nt, mf_cu_matmul(&a, x->c->stream));
}

/* The mma tier's one-GEMM form (mf_cu_gemm_mma_multi) of n matmuls sharing
 * `in`: n 3 (QKV) into y[0..2], or n 2 with swiglu (gate, up) into y[0] =
 * silu(gate) * up. Returns 1 when it does not apply (MINFER_CUDA_NO_MMA_FUSE,
 * a folded norm, a weight the mma tier would not take at this nt, shapes
 * it does not serve): the caller runs the matmuls one by one; else 0, or -1
 * with the error set. y may alias in: the GEMM reads the f16 copy of in. */
static int run_mma_multi(exec *x, const mf_matmul_meta *const *mm, int n, bool swiglu, const float *in,
                         float *const *y, int64_t nt) {
    const int mode = x->c->matmul_mode;
    if (x->c->no_mma_fuse || x->norm || nt <= 8 || (mode != 0 && mode != 3))
        return 1;
    mf_cu_mma_multi_args a = {.n_w = n, .swiglu = swiglu, .x = in, .n_in = mm[0]->n_in, .nt = nt,
                              .wchunk_bytes = x->c->mma_chunk, .mma_cfg = x->c->mma_cfg};
    for (int i = 0; i < n; i++) {
        const mf_matmul_meta *m = mm[i];
        mf_cu_matmul_args t = {.wtype = m->wtype, .n_in = m->n_in, .n_out = m->n_out, .nt = nt,
                               .force_gemm = mode, .no_tc = x->c->no_tc, .no_mma = x->c->no_mma,
                               .mma_min_nt = x->c->mma_min_nt};
        if (!mm_ok(m) || m->n_in != a.n_in || !mf_cu_mma_wanted(&t))
            return 1;
    }
    for (int i = 0; i < n; i++) {
        const mf_matmul_meta *m = mm[i];
        if (!(a.w[i] = weight_ptr(x, m->weight, m->wtype, m->n_in, m->n_out)))
            return -1;
        if (m->bias && !(a.bias[i] = weight_ptr(x, m->bias, MF_TYPE_F32, m->n_out, 1)))
            return -1;
        a.wtype[i] = m->wtype;
        a.row_bytes[i] = row_bytes(m->wtype, m->n_in);
        a.y[i] = y[i] ? y[i] : y[0];
        a.n_out[i] = m->n_out;
    }
    if (!mf_cu_mma_multi_ok(&a))
        return 1;
    size_t wb, xb;
    mf_cu_mma_multi_scratch(&a, &wb, &xb);
    if (!(a.wf16 = scratch(x, WF16_SLOT, wb)) || !(a.xf16 = scratch(x, XF16_SLOT, xb)))
        return -1;
    a.x_ready = x->xf16_of == in && x->xf16_n_in == a.n_in;
    const cudaError_t e = mf_cu_gemm_mma_multi(&a, x->c->stream);
    x->xf16_of = e == cudaSuccess ? in : NULL;
    x->xf16_n_in = a.n_in;
    return launched(x, swiglu ? "matmul(mma, gate+up swiglu)" : "matmul(mma, qkv)", a.n_out[0] * n, nt, e);
}

/* Whether the fused int8 GEMV (mf_cu_gemv_q8_multi) serves these n matmuls
 * of nt tokens: the lever (or the test hook) is on, the int8 tier is the one
 * run_matmul would pick, and every weight has an int8 decoder. */
static bool fuse_ok(const exec *x, const mf_matmul_meta *const *mm, int n, int64_t nt) {
    const int mode = x->c->matmul_mode;
    if (!(x->c->fuse || x->norm) || nt > 8 || !(mode == -2 || (mode == 0 && !x->c->no_q8)))
        return false;
    for (int i = 0; i < n; i++)
        if (!mm_ok(mm[i]) || !mf_cu_q8_supported(mm[i]->wtype, mm[i]->n_in) || mm[i]->n_in != mm[0]->n_in)
            return false;
    return true;
}

/* y[i] = W_i in (+ b_i) for the n (<= 3) matmuls of fuse_ok, or with swiglu
 * (n == 2) y[0] = silu(W0 in + b0) * (W1 in + b1). y may alias in: the GEMV
 * reads only the quantized copy of in. */
static int run_multi(exec *x, const mf_matmul_meta *const *mm, int n, bool swiglu, const float *in,
                     float *const *y, const float *const *res, int64_t nt) {
    mf_cu_q8_multi_args a = {.n_w = n, .swiglu = swiglu, .x = x->norm ? x->norm_x : in, .n_in = mm[0]->n_in,
                             .nt = nt, .norm = x->norm, .norm_w = x->norm_w, .norm_eps = x->norm_eps,
                             .v2 = x->c->gemv_v2, .gemv_v1 = x->c->gemv_v1, .gemv_auto = x->c->gemv_auto,
                             .gemv_v4 = x->c->gemv_v4, .prologue = x->c->gemv_pro, .qkv_mix = x->c->qkv_mix};
    for (int i = 0; i < n; i++) {
        const mf_matmul_meta *m = mm[i];
        if (!(a.w[i] = weight_ptr(x, m->weight, m->wtype, m->n_in, m->n_out)))
            return -1;
        if (m->bias && !(a.bias[i] = weight_ptr(x, m->bias, MF_TYPE_F32, m->n_out, 1)))
            return -1;
        a.wtype[i] = m->wtype;
        a.row_bytes[i] = row_bytes(m->wtype, m->n_in);
        a.w_soa[i] = weight_soa(x, m->weight, &a.soa_stride[i]);
        a.y[i] = y[i];
        a.res[i] = res ? res[i] : NULL;
        a.n_out[i] = m->n_out;
    }
    if (x->win1 > 0 && n == 1) { /* MINFER_CUDA_LOGITS_CHUNKS: rows [win0, win1) of the one weight */
        const int64_t r0 = x->win0;
        a.w[0] = (const uint8_t *)a.w[0] + (uint64_t)r0 * a.row_bytes[0];
        if (a.w_soa[0])
            a.w_soa[0] = (const uint8_t *)a.w_soa[0] + (uint64_t)r0 * a.soa_stride[0];
        if (a.bias[0])
            a.bias[0] += r0;
        if (a.res[0])
            a.res[0] += r0;
        a.y[0] += r0;
        a.n_out[0] = x->win1 - r0;
    }
    cu_ctx *c = x->c;
    a.x_q8_ready = x->q8_in || (!x->norm && c->q8_buf && c->q8_of == a.x && c->q8_n == a.n_in && c->q8_nt == nt &&
                                c->q8_stamp == c->n_launched);
    if (a.x_q8_ready)
        a.q8 = x->q8_in ? x->q8_in : c->q8_buf;
    else if (!(a.q8 = scratch(x, Q8_SLOT, mf_cu_q8_bytes(a.n_in, nt))))
        return -1;
    x->q8_used = a.q8;
    x->c->n_q8_ready += a.x_q8_ready && !x->q8_in;
    if (n == 1)
        a.y_host = x->zc_host; /* MINFER_CUDA_LOGITS_ZC: checked by zc_alias with mf_cu_gemv_q8_zc_ok's rule */
    /* MINFER_CUDA_FFN_Q8B: h's int8 copy into Q8OUT_SLOT (the GEMV reads Q8_SLOT), for the down GEMV */
    if (x->q8b && swiglu && !a.x_q8_ready && mf_cu_gemv_q8_ffn_q8b_ok(&a)) {
        if (!(a.q8out = scratch(x, Q8OUT_SLOT, mf_cu_q8_bytes(a.n_out[0], nt))))
            return -1;
        a.q8b_form = c->ffn_q8b;
        if (launched(x, "gemv_q8_multi(swiglu, q8 out)", a.n_out[0] * n, nt, mf_cu_gemv_q8_multi(&a, x->c->stream)))
            return -1;
        q8_produced(x, y[0], a.n_out[0], nt, a.q8out);
        return 0;
    }
    static const char *const kname[2][2] = { /* [x ready][swiglu] (MINFER_TRACE) */
        {"gemv_q8_multi", "gemv_q8_multi(swiglu)"}, {"gemv_q8_multi(x ready)", "gemv_q8_multi(swiglu, x ready)"}};
    return launched(x, kname[a.x_q8_ready != 0][swiglu], a.n_out[0] * n, nt, mf_cu_gemv_q8_multi(&a, x->c->stream));
}

/* ---- MINFER_CUDA_LOGITS_CHUNKS: the logits copy overlapped with the lm_head ------------ */

/* Why. After a replayed decode step the engine's read of the logits (the
 * 0.5B: 151936 floats, 608 KB) is a D2H copy that starts only when the
 * lm_head, the graph's last kernel (~47 us), has finished: ~12 us of PCIe
 * plus latency a token with the GPU idle. Run as K row chunks, chunk i's
 * rows cross PCIe while chunk i + 1 computes; only the last chunk's copy
 * stays after the GEMV. */

/* Row bound i of k chunks over n rows: multiples of 64 (row pairs intact,
 * 256-byte aligned copies); bound k is n. */
static int64_t lc_bound(int64_t n, int k, int i) {
    return i >= k ? n : (n * i / k) & ~(int64_t)63;
}

/* The hint as the CUDA graph cache keys it: out_host while either switch is
 * on (a captured chunked lm_head copies into it, a captured ZC lm_head
 * embeds its device alias), else NULL (the old keys). */
static void *lc_key(const cu_ctx *c, const mf_exec_args *a) {
    return c->logits_chunks || c->logits_zc ? a->out_host : NULL;
}

/* How many chunks MATMUL node `node` (input buffer in, output out) runs as:
 * 0 unless it is the output the engine reads right after into a host_alloc
 * block (ea's hint, exact byte count), one token on the v4 int8 GEMV
 * (neither the prologue nor f32 activations), and every chunk's plan has
 * the whole launch's slices in flight (u) and warps per row (ks): a row's
 * summation order is fixed by those, so every logit keeps its bits. */
static int lc_chunks(const cu_ctx *c, const mf_graph *g, int32_t node, int32_t in, int32_t out,
                     const mf_exec_args *ea) {
    const int k = c->logits_chunks;
    if (k < 2 || k > LC_MAX || !ea->out_host || ea->out_node != node || in == out || out < 0 || out >= c->n_bufs ||
        !c->d2h_stream)
        return 0;
    const mf_node *n = &g->nodes[node];
    const mf_matmul_meta *m = &n->meta.matmul;
    const int mode = c->matmul_mode;
    if (n->op != MF_OP_MATMUL || n->ne[1] != 1 || ea->out_bytes != f32b(m->n_out) ||
        c->bufs[out].size < ea->out_bytes || !mm_ok(m) || !mf_cu_q8_supported(m->wtype, m->n_in) ||
        !(mode == -2 || (mode == 0 && !c->no_q8)) || c->gemv_pro || !is_pinned(c, ea->out_host, ea->out_bytes))
        return 0;
    const int u = mf_cu_q8v4_u(c->gemv_v4, m->wtype, m->n_out, m->n_in);
    const int ks = u > 0 ? mf_cu_q8v4_ks(m->wtype, u, m->n_out, m->n_in) : 0;
    if (ks <= 0)
        return 0;
    for (int i = 0; i < k; i++) {
        const int64_t r = lc_bound(m->n_out, k, i + 1) - lc_bound(m->n_out, k, i);
        if (r <= 0 || mf_cu_q8v4_u(c->gemv_v4, m->wtype, r, m->n_in) != u ||
            mf_cu_q8v4_ks(m->wtype, u, r, m->n_in) != ks)
            return 0;
    }
    return k;
}

/* Bytes [0, bytes) of buffer id are already in host block `host` once the
 * stream reaches this point (read_host then only waits): copied early by
 * the lm_head's chunks, or (zc) written by its ZC epilogue. Counted for
 * mf_cuda_d2h_stats / mf_cuda_zc_count when there are such bytes. */
static void d2h_set(cu_ctx *c, int32_t id, void *host, size_t bytes, bool zc) {
    c->d2h_id = id;
    c->d2h_host = host;
    c->d2h_bytes = bytes;
    c->d2h_zc = zc;
    c->n_d2h_chunked += bytes != 0 && !zc;
    c->n_zc += bytes != 0 && zc;
}

/* The lm_head as k chunks (lc_chunks): chunk i's rows through run_multi
 * (the first quantizes x, the folded output norm applied if any; the others
 * read that int8 copy), then the copy of its rows into ea->out_host on
 * d2h_stream, forked from the stream right after the chunk; after the last
 * copy the stream joins d2h_stream (a capture sees every fork joined, and
 * waiting for the stream covers the copies). Remembers the copy for
 * read_host. */
static int run_head_chunks(exec *x, const mf_matmul_meta *m, const float *in, float *y, int32_t out,
                           const mf_exec_args *ea, int k) {
    cu_ctx *c = x->c;
    mf_error *err = x->err;
    const mf_matmul_meta *mm[1] = {m};
    float *const ys[1] = {y};
    c->d2h_bytes = 0;
    int rc = 0;
    for (int i = 0; i < k && rc == 0; i++) {
        const int64_t r0 = lc_bound(m->n_out, k, i), r1 = lc_bound(m->n_out, k, i + 1);
        x->win0 = r0;
        x->win1 = r1;
        rc = run_multi(x, mm, 1, false, in, ys, NULL, 1);
        x->q8_in = x->q8_used;
        if (rc == 0) {
            cudaError_t e = cudaEventRecord(c->d2h_ev[i], c->stream);
            if (e == cudaSuccess)
                e = cudaStreamWaitEvent(c->d2h_stream, c->d2h_ev[i], 0);
            if (e == cudaSuccess)
                e = cudaMemcpyAsync((uint8_t *)ea->out_host + (size_t)r0 * 4, y + r0, (size_t)(r1 - r0) * 4,
                                    cudaMemcpyDeviceToHost, c->d2h_stream);
            if (e != cudaSuccess)
                rc = NODE_ERR(x, "early logits copy of rows [%lld, %lld): %s", (long long)r0, (long long)r1,
                              cudaGetErrorName(e));
        }
    }
    x->win0 = x->win1 = 0;
    x->q8_in = NULL;
    /* joined even after a failure, so a capture is never left with an open fork */
    CU_TRY(cudaEventRecord(c->d2h_ev[LC_MAX], c->d2h_stream));
    CU_TRY(cudaStreamWaitEvent(c->stream, c->d2h_ev[LC_MAX], 0));
    if (rc)
        return rc;
    d2h_set(c, out, ea->out_host, ea->out_bytes, false);
    return 0;
}

/* ---- MINFER_CUDA_LOGITS_ZC: the lm_head GEMV writes the logits into the pinned block ---- */

/* Why. The chunked copy (above) did not pay: each chunk boundary cost what
 * its copy saved. Here nothing is copied: the lm_head's v4 GEMV stores
 * every row also into the engine's pinned logits block through its device
 * alias, a 32-byte line per row group (v4_zc_store, gemv_q8v4.cu), while
 * it streams the weight (~47 us on the 0.5B); the writes cross PCIe under
 * the GEMV and the read after the forward only waits. y on the device is
 * still written (the same stores as today), so every other read of the
 * buffer and every later kernel see it as before. */

/* The device alias of the host_alloc block bytes [p, p + n) lie in, or
 * NULL (not such a block, or the runtime gives no alias). */
static float *zc_alias(cu_ctx *c, void *p, size_t n) {
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
static float *zc_head(cu_ctx *c, const mf_graph *g, int32_t node, int32_t in, int32_t out, const mf_exec_args *ea) {
    if (!c->logits_zc || !ea->out_host || ea->out_node != node || in == out || out < 0 || out >= c->n_bufs ||
        ((uintptr_t)ea->out_host & 31))
        return NULL;
    const mf_node *n = &g->nodes[node];
    const mf_matmul_meta *m = &n->meta.matmul;
    const int mode = c->matmul_mode;
    if (n->op != MF_OP_MATMUL || n->ne[1] != 1 || ea->out_bytes != f32b(m->n_out) ||
        c->bufs[out].size < ea->out_bytes || !mm_ok(m) || !mf_cu_q8_supported(m->wtype, m->n_in) ||
        !(mode == -2 || (mode == 0 && !c->no_q8)) || c->gemv_pro)
        return NULL;
    const int u = mf_cu_q8v4_u(c->gemv_v4, m->wtype, m->n_out, m->n_in);
    if (u <= 0 || !mf_cu_q8v4_zc_ok(m->wtype, u, m->n_out, m->n_in))
        return NULL;
    return zc_alias(c, ea->out_host, ea->out_bytes);
}

/* The lm_head through run_multi with the ZC epilogue into yh (zc_head);
 * remembers the logits as already on the host for read_host, like the
 * chunked copy does. */
static int run_head_zc(exec *x, const mf_matmul_meta *m, const float *in, float *y, int32_t out,
                       const mf_exec_args *ea, float *yh) {
    cu_ctx *c = x->c;
    const mf_matmul_meta *mm[1] = {m};
    float *const ys[1] = {y};
    c->d2h_bytes = 0;
    x->zc_host = yh;
    const int rc = run_multi(x, mm, 1, false, in, ys, NULL, 1);
    x->zc_host = NULL;
    if (rc)
        return rc;
    d2h_set(c, out, ea->out_host, ea->out_bytes, true);
    return 0;
}

static int run_ew(exec *x, int op, const float *a, const float *b, float *y, int64_t n, int64_t b_n,
                  float s) {
    mf_cu_ew_args e = {.op = op, .a = a, .b = b, .y = y, .n = n, .b_n = b_n, .s = s};
    return launched(x, "elementwise", n, op, mf_cu_elementwise(&e, x->c->stream));
}

static int run_norm(exec *x, const float *in, const float *w, float *y, int64_t n, int64_t rows,
                    float eps) {
    mf_cu_norm_args a = {.x = in, .w = w, .y = y, .n = n, .nrows = rows, .eps = eps};
    return launched(x, "rmsnorm", rows, n, mf_cu_rmsnorm(&a, x->c->stream));
}

static int run_rope(exec *x, const mf_rope_meta *r, const float *in, float *y, const int32_t *pos,
                    int64_t pos0, int64_t nt) {
    if (r->n_head <= 0 || r->head_dim <= 0 || r->n_rot <= 0 || r->n_rot > r->head_dim || r->n_rot % 2)
        return NODE_ERR(x, "rope n_head %d head_dim %d n_rot %d", r->n_head, r->head_dim, r->n_rot);
    mf_cu_rope_args a = {.x = in, .y = y, .pos = pos, .pos0 = pos0, .pos0_dev = pos ? NULL : x->npast_dev,
                         .nt = nt, .n_head = r->n_head,
                         .head_dim = r->head_dim, .n_rot = r->n_rot, .mode = r->mode,
                         .theta = r->theta, .freq_scale = r->freq_scale};
    return launched(x, "rope", nt, r->n_head, mf_cu_rope(&a, x->c->stream));
}

/* The layer's K (which 0) or V region, checked to hold `rows` rows. */
static void *kv_region(exec *x, int32_t id, const mf_exec_args *ea, int64_t rows, const char *which) {
    const uint32_t t = ea->kv_type;
    if (t != MF_TYPE_F32 && t != MF_TYPE_F16 && t != MF_TYPE_Q8_0) {
        NODE_ERR(x, "KV cache type %s (%u) is not f32, f16 or q8_0", mf_type_name(t), t);
        return NULL;
    }
    const size_t rb = row_bytes(t, x->g->kv_dim);
    if (rb == 0) {
        NODE_ERR(x, "KV cache type %s needs kv_dim %% 32 == 0, kv_dim is %lld", mf_type_name(t),
                 (long long)x->g->kv_dim);
        return NULL;
    }
    if (id < 0) {
        NODE_ERR(x, "layer %d has no %s region", mf_node_kv_layer(x->n), which);
        return NULL;
    }
    if (rows > ea->n_ctx) {
        NODE_ERR(x, "needs KV rows [0, %lld) but n_ctx is %d", (long long)rows, ea->n_ctx);
        return NULL;
    }
    return buf_ptr(x, id, rb * (size_t)rows, which);
}

static int run_store(exec *x, void *kc, void *vc, const mf_exec_args *ea, const float *k,
                     const float *v, int64_t nt) {
    mf_cu_kv_args a = {.kv_type = ea->kv_type, .cache = kc, .kv_dim = x->g->kv_dim,
                       .pos0 = ea->n_past, .pos0_dev = x->npast_dev, .nt = nt, .src = k};
    if (launched(x, "kv_store(k)", nt, x->g->kv_dim, mf_cu_kv_store(&a, x->c->stream)))
        return -1;
    a.cache = vc;
    a.src = v;
    return launched(x, "kv_store(v)", nt, x->g->kv_dim, mf_cu_kv_store(&a, x->c->stream));
}

/* The four launches of run_rope(k in place), run_store, run_rope(q -> y) as
 * one (mf_cu_rope_store), with the same arguments and checks. */
/* qn / kn non-NULL: the QkNorm of sq / sk goes into the same launch
 * (mf_cu_rope_store_args.q_norm). */
/* defer non-NULL (MINFER_CUDA_SHORT_ROPE): the arguments go there, nothing
 * is launched. */
static int run_rope_store(exec *x, const mf_qkv_meta *m, float *sq, float *sk, const float *sv, float *y,
                          void *kc, void *vc, const mf_exec_args *ea, const int32_t *pos, int64_t nt,
                          const float *qn, const float *kn, mf_cu_rope_store_args *defer) {
    const mf_rope_meta *r[2] = {&m->rope_q, &m->rope_k};
    for (int i = 0; i < 2; i++)
        if (r[i]->n_head <= 0 || r[i]->head_dim <= 0 || r[i]->n_rot <= 0 || r[i]->n_rot > r[i]->head_dim ||
            r[i]->n_rot % 2)
            return NODE_ERR(x, "rope n_head %d head_dim %d n_rot %d", r[i]->n_head, r[i]->head_dim,
                            r[i]->n_rot);
    mf_cu_rope_store_args a;
    memset(&a, 0, sizeof a);
    mf_cu_rope_args *ra[2] = {&a.rq, &a.rk};
    for (int i = 0; i < 2; i++)
        *ra[i] = (mf_cu_rope_args){.x = i ? sk : sq, .y = i ? sk : y, .pos = pos, .pos0 = ea->n_past,
                                   .pos0_dev = pos ? NULL : x->npast_dev, .nt = nt,
                                   .n_head = r[i]->n_head, .head_dim = r[i]->head_dim,
                                   .n_rot = r[i]->n_rot, .mode = r[i]->mode, .theta = r[i]->theta,
                                   .freq_scale = r[i]->freq_scale};
    a.ks = (mf_cu_kv_args){.kv_type = ea->kv_type, .cache = kc, .kv_dim = x->g->kv_dim,
                           .pos0 = ea->n_past, .pos0_dev = x->npast_dev, .nt = nt, .src = sk};
    a.vs = a.ks;
    a.vs.cache = vc;
    a.vs.src = sv;
    a.q_norm = qn;
    a.k_norm = kn;
    a.norm_eps = m->norm_eps;
    if (defer) {
        *defer = a;
        return 0;
    }
    return launched(x, qn ? "rope_store(qk norm)" : "rope_store", nt, m->n_head, mf_cu_rope_store(&a, x->c->stream));
}

/* Whether a live node from index `from` on reads node's output: a fold
 * that never writes that output (or writes it late) needs none to. */
static bool read_from(const mf_graph *g, int32_t node, int32_t from) {
    for (int32_t i = from; i < g->n_nodes; i++) {
        const mf_node *v = &g->nodes[i];
        if (v->flags & MF_NODE_DEAD)
            continue;
        for (int32_t k = 0; k < v->n_src && k < MF_MAX_SRC; k++)
            if (v->src[k] == node)
                return true;
    }
    return false;
}

/* MINFER_CUDA_SHORT_ROPE: whether this FUSED_QKV node's rope-store (one
 * token) is left to the ATTN node right after it, decided once here: that
 * node's q is this node's output and nothing else reads it (so the roped q
 * and K the rope-store would write are never needed), its heads are the
 * rope's, and it takes the 12-warp short-context kernel (attn_short on, not
 * 4 warps; the one-kernel range; flash decode; an f32 / f16 cache;
 * head_dim 64 or 128). The ATTN node re-checks the arguments
 * (mf_cu_attn_short_rope_ok) and launches the rope-store plainly first
 * when they do not fit, so a wrong guess here costs nothing but the fold. */
static bool rope_deferrable(const exec *x, const mf_qkv_meta *m, int64_t nt, const mf_exec_args *ea) {
    const cu_ctx *c = x->c;
    const mf_graph *g = x->g;
    const int32_t node = x->id;
    if (!c->short_rope || !c->attn_short || c->attn_short == 4 || !attn_one_now(c, ea) || !c->flash_decode ||
        nt != 1 || node + 1 >= g->n_nodes || (x->n->flags & MF_NODE_OUTPUT) ||
        (ea->kv_type != MF_TYPE_F32 && ea->kv_type != MF_TYPE_F16) || (m->head_dim != 64 && m->head_dim != 128) ||
        m->rope_q.head_dim != m->head_dim || m->rope_k.head_dim != m->head_dim || m->rope_q.n_head != m->n_head ||
        m->rope_k.n_head != m->n_head_kv)
        return false;
    const mf_node *u = &g->nodes[node + 1];
    if (u->op != MF_OP_ATTN || (u->flags & MF_NODE_DEAD) || u->n_src < 1 || u->src[0] != node ||
        u->meta.attn.n_head != m->n_head || u->meta.attn.n_head_kv != m->n_head_kv ||
        u->meta.attn.head_dim != m->head_dim || read_from(g, node, node + 2))
        return false;
    const mf_cu_attn_args p = {.kv_type = ea->kv_type, .nt = 1, .n_past = ea->n_past, .n_past_dev = x->npast_dev,
                               .n_head = m->n_head, .n_head_kv = m->n_head_kv, .head_dim = m->head_dim,
                               .n_ctx = ea->n_ctx};
    return mf_cu_attn_decode_bytes(&p) > 0;
}

/* Launches the rope-store rope_deferrable left pending, if any. */
static int flush_rope(cu_ctx *c, mf_error *err) {
    if (c->rs_node < 0)
        return 0;
    exec xx = {.c = c, .g = c->rs_g, .n = &c->rs_g->nodes[c->rs_node], .id = c->rs_node, .err = err};
    c->rs_node = -1;
    return launched(&xx, c->rs_args.q_norm ? "rope_store(qk norm)" : "rope_store", 1, c->rs_args.rq.n_head,
                    mf_cu_rope_store(&c->rs_args, c->stream));
}

static int d2d(exec *x, void *dst, const void *src, size_t nbytes) {
    if (dst == src || nbytes == 0)
        return 0;
    cudaError_t e = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, x->c->stream);
    return launched(x, "memcpy d2d", (int64_t)nbytes, 1, e);
}

/* ---- execute: fused attention input ---------------------------------------------------------- */

/* FUSED_QKV(_NORM): three matmuls into scratch (the output may alias x),
 * optional per-head norms, RoPE of K in place and of Q into the output, the
 * K/V store at n_past. QKV_BIAS_ROPE_STORE: the same tail on three given
 * matmul outputs (biases added here; positions src3 or n_past + t). */
static int exec_qkv(exec *x, const int32_t *in, int32_t out, mf_kv_pair kv, const mf_exec_args *ea) {
    const mf_node *n = x->n;
    const mf_qkv_meta *m = &n->meta.qkv;
    const int64_t nt = n->ne[1], q_dim = (int64_t)m->n_head * m->head_dim, kvd = x->g->kv_dim;
    if (q_dim != n->ne[0] || (int64_t)m->n_head_kv * m->head_dim != kvd)
        return NODE_ERR(x, "n_head %d n_head_kv %d head_dim %d for width %lld, kv_dim %lld", m->n_head,
                        m->n_head_kv, m->head_dim, (long long)n->ne[0], (long long)kvd);
    float *y = buf_ptr(x, out, f32b(q_dim * nt), "output");
    void *kc = kv_region(x, kv.k, ea, ea->n_past + nt, "K");
    void *vc = kc ? kv_region(x, kv.v, ea, ea->n_past + nt, "V") : NULL;
    if (!y || !vc)
        return -1;
    float *sq = scratch(x, 0, f32b(q_dim * nt));
    float *sk = sq ? scratch(x, 1, f32b(kvd * nt)) : NULL;
    float *sv = sk ? scratch(x, 2, f32b(kvd * nt)) : NULL;
    if (!sv)
        return -1;
    const int32_t *pos = NULL;
    if (n->op == MF_OP_QKV_BIAS_ROPE_STORE) {
        const float *q = buf_ptr(x, in[0], f32b(q_dim * nt), "q");
        const float *k = q ? buf_ptr(x, in[1], f32b(kvd * nt), "k") : NULL;
        const float *v = k ? buf_ptr(x, in[2], f32b(kvd * nt), "v") : NULL;
        if (!v)
            return -1;
        const mf_matmul_meta *mm[3] = {&m->q, &m->k, &m->v};
        const float *src[3] = {q, k, v};
        float *dst[3] = {sq, sk, sv};
        const int64_t w[3] = {q_dim, kvd, kvd};
        for (int i = 0; i < 3; i++) {
            const float *bias = NULL;
            if (mm[i]->bias && !(bias = weight_ptr(x, mm[i]->bias, MF_TYPE_F32, w[i], 1)))
                return -1;
            if (bias ? run_ew(x, MF_CU_EW_ADD, src[i], bias, dst[i], w[i] * nt, w[i], 0)
                     : run_ew(x, MF_CU_EW_COPY, src[i], NULL, dst[i], w[i] * nt, 0, 0))
                return -1;
        }
        if (n->n_src > 3 && !(pos = buf_ptr(x, in[3], (size_t)nt * 4, "positions")))
            return -1;
    } else {
        const float *xin = buf_ptr(x, in[0], f32b(m->q.n_in * nt), "input");
        if (!xin || !(pos = buf_ptr(x, in[1], (size_t)nt * 4, "positions")))
            return -1;
        if (m->k.n_out != kvd || m->v.n_out != kvd || m->q.n_out != q_dim)
            return NODE_ERR(x, "q/k/v n_out %lld/%lld/%lld vs q_dim %lld, kv_dim %lld",
                            (long long)m->q.n_out, (long long)m->k.n_out, (long long)m->v.n_out,
                            (long long)q_dim, (long long)kvd);
        const mf_matmul_meta *mm[3] = {&m->q, &m->k, &m->v};
        float *const ys[3] = {sq, sk, sv};
        if (fuse_ok(x, mm, 3, nt)) {
            if (run_multi(x, mm, 3, false, xin, ys, NULL, nt))
                return -1;
        } else if (x->norm) { /* norm_fusable promised the fused path */
            return NODE_ERR(x, "folded RMSNorm but the matmuls cannot take the int8 GEMV (nt %lld)",
                            (long long)nt);
        } else {
            const int r = run_mma_multi(x, mm, 3, false, xin, ys, nt);
            if (r < 0 || (r > 0 && (run_matmul(x, &m->q, xin, sq, nt) || run_matmul(x, &m->k, xin, sk, nt) ||
                                    run_matmul(x, &m->v, xin, sv, nt))))
                return -1;
        }
    }
    const float *fold_qn = NULL, *fold_kn = NULL; /* QkNorm inside the rope-store launch */
    if (m->q_norm || m->k_norm || n->op == MF_OP_FUSED_QKV_NORM) {
        const float *qn = norm_weight(x, m->q_norm, m->head_dim);
        const float *kn = qn ? norm_weight(x, m->k_norm, m->head_dim) : NULL;
        if (!kn)
            return m->q_norm && m->k_norm ? -1 : NODE_ERR(x, "needs q_norm and k_norm weights%s", "");
        if (x->c->fuse_rope && m->rope_q.head_dim == m->head_dim && m->rope_k.head_dim == m->head_dim &&
            m->rope_q.n_head == m->n_head && m->rope_k.n_head == m->n_head_kv) {
            fold_qn = qn;
            fold_kn = kn;
        } else if (run_norm(x, sq, qn, sq, m->head_dim, nt * m->n_head, m->norm_eps) ||
                   run_norm(x, sk, kn, sk, m->head_dim, nt * m->n_head_kv, m->norm_eps)) {
            return -1;
        }
    }
    if ((int64_t)m->rope_q.n_head * m->rope_q.head_dim != q_dim ||
        (int64_t)m->rope_k.n_head * m->rope_k.head_dim != kvd)
        return NODE_ERR(x, "rope q %dx%d / k %dx%d for widths %lld / %lld", m->rope_q.n_head,
                        m->rope_q.head_dim, m->rope_k.n_head, m->rope_k.head_dim, (long long)q_dim,
                        (long long)kvd);
    if (x->c->fuse_rope && rope_deferrable(x, m, nt, ea)) { /* the next node, ATTN, does it */
        if (run_rope_store(x, m, sq, sk, sv, y, kc, vc, ea, pos, nt, fold_qn, fold_kn, &x->c->rs_args))
            return -1;
        x->c->rs_g = x->g;
        x->c->rs_node = x->id;
        return 0;
    }
    if (x->c->fuse_rope)
        return run_rope_store(x, m, sq, sk, sv, y, kc, vc, ea, pos, nt, fold_qn, fold_kn, NULL);
    if (run_rope(x, &m->rope_k, sk, sk, pos, ea->n_past, nt) ||
        run_store(x, kc, vc, ea, sk, sv, nt) || run_rope(x, &m->rope_q, sq, y, pos, ea->n_past, nt))
        return -1;
    return 0;
}

/* ---- execute -------------------------------------------------------------------------------- */

/* ---- MATMUL + ADD (MINFER_CUDA_FUSE_ADD) ----------------------------------------------- */

/* Rule: a decode MATMUL on the int8 tier whose only consumer is the next
 * node, an ADD of two operands of its size (the residual add after Wo and
 * Wdown), and which is no graph output, is deferred: exec_node records it
 * instead of launching. When the next call is that ADD, one GEMV writes
 * add_out = residual + W x (+ b); the MATMUL's own output buffer is never
 * written (nothing else reads it). Any other call, a host copy, a
 * synchronize, begin/end_forward, or the end of a replayed call list first
 * launches the deferred MATMUL plainly (flush_pending), so correctness never
 * depends on the scheduler's order. */
static bool add_fusable(const cu_ctx *c, const mf_graph *g, int32_t node, int64_t nt) {
    const mf_node *n = &g->nodes[node];
    const mf_matmul_meta *m = &n->meta.matmul;
    const int mode = c->matmul_mode;
    if (!c->fuse_add || nt > 8 || node + 1 >= g->n_nodes || (n->flags & MF_NODE_OUTPUT) ||
        !(mode == -2 || (mode == 0 && !c->no_q8)) || !mf_cu_q8_supported(m->wtype, m->n_in))
        return false;
    const mf_node *a = &g->nodes[node + 1];
    if (a->op != MF_OP_ADD || (a->flags & MF_NODE_DEAD) || a->n_src != 2 ||
        (a->src[0] == node) == (a->src[1] == node) || mf_node_nelem(a) != mf_node_nelem(n) ||
        mf_node_nelem(&g->nodes[a->src[0]]) != mf_node_nelem(a) ||
        mf_node_nelem(&g->nodes[a->src[1]]) != mf_node_nelem(a))
        return false;
    return !read_from(g, node, node + 2);
}

/* RMSNORM + quantization (MINFER_CUDA_FUSE_NORM), the same deferral: an
 * RMSNORM over whole rows whose only consumer is the next node, a
 * FUSED_QKV(_NORM) or FUSED_FFN whose matmuls all run on the int8 tier at
 * this token count, is not launched; that node then quantizes the norm's
 * input with the norm applied (mf_cu_q8_multi_args.norm) and runs its
 * matmuls through the multi-weight GEMV. The norm's output buffer is never
 * written. A plain MATMUL consumer (the output norm -> lm_head) folds the
 * same way unless an ADD after it would take it (add_fusable), and only
 * with MINFER_CUDA_NORM_MM (c->norm_mm; default on). */
static bool norm_fusable(const cu_ctx *c, const mf_graph *g, int32_t node) {
    const mf_node *n = &g->nodes[node];
    const int mode = c->matmul_mode;
    if (!c->fuse_norm || n->op != MF_OP_RMSNORM || n->ne[1] > 8 || node + 1 >= g->n_nodes ||
        (n->flags & MF_NODE_OUTPUT) || !(mode == -2 || (mode == 0 && !c->no_q8)))
        return false;
    const mf_node *u = &g->nodes[node + 1];
    if ((u->flags & MF_NODE_DEAD) || u->n_src < 1 || u->src[0] != node || u->ne[1] != n->ne[1])
        return false;
    const mf_matmul_meta *mm[3];
    int k = 0;
    if (u->op == MF_OP_FUSED_QKV || u->op == MF_OP_FUSED_QKV_NORM) {
        mm[k++] = &u->meta.qkv.q;
        mm[k++] = &u->meta.qkv.k;
        mm[k++] = &u->meta.qkv.v;
    } else if (u->op == MF_OP_FUSED_FFN) {
        mm[k++] = &u->meta.ffn.gate;
        mm[k++] = &u->meta.ffn.up;
    } else if (u->op == MF_OP_MATMUL && c->norm_mm && u->n_src == 1 && !add_fusable(c, g, node + 1, u->ne[1])) {
        mm[k++] = &u->meta.matmul;
    } else {
        return false;
    }
    for (int i = 0; i < k; i++)
        if (!mm_ok(mm[i]) || !mf_cu_q8_supported(mm[i]->wtype, mm[i]->n_in) || mm[i]->n_in != n->ne[0])
            return false;
    for (int32_t s = 1; s < u->n_src && s < MF_MAX_SRC; s++) /* the norm is u's input 0 only */
        if (u->src[s] == node)
            return false;
    return !read_from(g, node, node + 2);
}

static int exec_node(mf_backend *b, const mf_graph *g, int32_t node, const int32_t *in, int32_t out,
                     mf_kv_pair kv, const mf_exec_args *ea, mf_error *err, bool may_defer,
                     const exec *fold);

/* Launches the deferred MATMUL or RMSNORM, if any, plainly. */
static int flush_pending(mf_backend *b, mf_error *err) {
    cu_ctx *c = CX(b);
    if (flush_rope(c, err))
        return -1;
    if (c->pend_node < 0)
        return 0;
    const int32_t node = c->pend_node;
    int32_t in[MF_MAX_SRC] = {c->pend_in};
    c->pend_node = -1;
    return exec_node(b, c->pend_g, node, in, c->pend_out, (mf_kv_pair){-1, -1}, &c->pend_ea, err, false,
                     NULL);
}

/* The ADD (node `node`) that consumes the deferred MATMUL: one GEMV with the
 * other operand as the residual. */
static int exec_add_fused(mf_backend *b, const mf_graph *g, int32_t node, const int32_t *in, int32_t out,
                          mf_error *err) {
    cu_ctx *c = CX(b);
    exec xx = {.c = c, .g = g, .n = &g->nodes[node], .id = node, .err = err,
               .npast_dev = c->capturing ? c->dev_npast : NULL};
    exec *x = &xx;
    const mf_node *mmn = &g->nodes[c->pend_node];
    const mf_matmul_meta *m = &mmn->meta.matmul;
    const int64_t nt = mmn->ne[1], ne = m->n_out * nt;
    const int r = x->n->src[0] == c->pend_node ? 1 : 0; /* the residual operand */
    const int32_t pin = c->pend_in;
    c->pend_node = -1;
    c->n_fused_add++;
    if (mf_node_nelem(x->n) != ne)
        return NODE_ERR(x, "fused residual add of %lld elements after a matmul of %lld", (long long)mf_node_nelem(x->n),
                        (long long)ne);
    const float *a = buf_ptr(x, pin, f32b(m->n_in * nt), "matmul input");
    const float *res = a ? buf_ptr(x, in[r], f32b(ne), "residual") : NULL;
    float *y = res ? buf_ptr(x, out, f32b(ne), "output") : NULL;
    if (!y)
        return -1;
    const mf_matmul_meta *mm[1] = {m};
    float *const ys[1] = {y};
    const float *const rs[1] = {res};
    return run_multi(x, mm, 1, false, a, ys, rs, nt);
}

/* Launches node `node` now (execute_node's contract), apart from the MATMUL
 * that MINFER_CUDA_FUSE_ADD defers to its ADD. */
static int exec_now(mf_backend *b, const mf_graph *g, int32_t node, const int32_t *in, int32_t out,
                    mf_kv_pair kv, const mf_exec_args *ea, mf_error *err) {
    cu_ctx *c = CX(b);
    c->d2h_bytes = 0; /* a launch after the early logits copy may rewrite its buffer */
    if (c->rs_node >= 0 && !(g == c->rs_g && node == c->rs_node + 1) && flush_rope(c, err))
        return -1; /* MINFER_CUDA_SHORT_ROPE: only the ATTN right after it takes the rope-store */
    if (c->pend_node >= 0) {
        const bool next = g == c->pend_g && node == c->pend_node + 1 && node < g->n_nodes;
        const mf_node *pn = &c->pend_g->nodes[c->pend_node];
        if (next && pn->op == MF_OP_MATMUL && g->nodes[node].op == MF_OP_ADD)
            return exec_add_fused(b, g, node, in, out, err);
        if (next && pn->op == MF_OP_RMSNORM && g->nodes[node].n_src > 0 && g->nodes[node].src[0] == c->pend_node) {
            /* the consumer quantizes RMSNorm(norm input) itself */
            exec nf = {.c = c, .g = g, .n = pn, .id = c->pend_node, .err = err, .norm = true,
                       .norm_eps = pn->meta.norm.eps};
            const int32_t pin = c->pend_in;
            c->pend_node = -1;
            c->n_fused_norm++;
            if (!(nf.norm_x = buf_ptr(&nf, pin, f32b(mf_node_nelem(pn)), "norm input")))
                return -1;
            if (pn->meta.norm.weight && !(nf.norm_w = norm_weight(&nf, pn->meta.norm.weight, pn->ne[0])))
                return -1;
            return exec_node(b, g, node, in, out, kv, ea, err, false, &nf);
        }
        if (flush_pending(b, err))
            return -1;
    }
    return exec_node(b, g, node, in, out, kv, ea, err, true, NULL);
}

static int exec_node(mf_backend *b, const mf_graph *g, int32_t node, const int32_t *in, int32_t out,
                     mf_kv_pair kv, const mf_exec_args *ea, mf_error *err, bool may_defer,
                     const exec *fold) {
    cu_ctx *c = CX(b);
    if (node < 0 || node >= g->n_nodes)
        return mf_errorf(err, "cuda: node %d outside the graph (%d nodes)", node, g->n_nodes);
    exec xx = {.c = c, .g = g, .n = &g->nodes[node], .id = node, .err = err,
               .npast_dev = c->capturing ? c->dev_npast : NULL};
    if (fold) { /* the RMSNorm folded into this node (MINFER_CUDA_FUSE_NORM) */
        xx.norm = true;
        xx.norm_x = fold->norm_x;
        xx.norm_w = fold->norm_w;
        xx.norm_eps = fold->norm_eps;
    }
    exec *x = &xx;
    const mf_node *n = x->n;
    if (!cu_supports_op(b, n))
        return NODE_ERR(x, "the CUDA backend refused this op at build time (supports_op)%s", "");
    const int64_t ne = mf_node_nelem(n);
    const int64_t nt = n->ne[1];
    const mf_node *s0 = n->n_src > 0 ? &g->nodes[n->src[0]] : NULL;
    const mf_node *s1 = n->n_src > 1 ? &g->nodes[n->src[1]] : NULL;
    cudaStream_t st = c->stream;

    switch (n->op) {
    case MF_OP_INPUT:
        return 0;
    case MF_OP_ADD:
    case MF_OP_SWIGLU: {
        if (mf_node_nelem(s0) != ne || mf_node_nelem(s1) != ne)
            return NODE_ERR(x, "srcs of %lld and %lld elements for an output of %lld",
                            (long long)mf_node_nelem(s0), (long long)mf_node_nelem(s1), (long long)ne);
        const float *a = buf_ptr(x, in[0], f32b(ne), "src0");
        const float *bb = a ? buf_ptr(x, in[1], f32b(ne), "src1") : NULL;
        float *y = bb ? buf_ptr(x, out, f32b(ne), "output") : NULL;
        if (!y)
            return -1;
        return run_ew(x, n->op == MF_OP_ADD ? MF_CU_EW_ADD : MF_CU_EW_SWIGLU, a, bb, y, ne, ne, 0);
    }
    case MF_OP_MUL: {
        const int64_t bn = mf_node_nelem(s1);
        if (mf_node_nelem(s0) != ne || (bn != ne && bn != n->ne[0]))
            return NODE_ERR(x, "src1 of %lld elements neither matches %lld nor is one row of %lld",
                            (long long)bn, (long long)ne, (long long)n->ne[0]);
        const float *a = buf_ptr(x, in[0], f32b(ne), "src0");
        const float *bb = a ? buf_ptr(x, in[1], f32b(bn), "src1") : NULL;
        float *y = bb ? buf_ptr(x, out, f32b(ne), "output") : NULL;
        if (!y)
            return -1;
        if (bn != ne && out == in[1]) { /* the broadcast row would be overwritten under its readers */
            float *s = scratch(x, 0, f32b(ne));
            if (!s || run_ew(x, MF_CU_EW_MUL, a, bb, s, ne, bn, 0))
                return -1;
            return d2d(x, y, s, f32b(ne));
        }
        return run_ew(x, MF_CU_EW_MUL, a, bb, y, ne, bn, 0);
    }
    case MF_OP_SCALE:
    case MF_OP_SILU: {
        if (mf_node_nelem(s0) != ne)
            return NODE_ERR(x, "src of %lld elements for %lld", (long long)mf_node_nelem(s0), (long long)ne);
        const float *a = buf_ptr(x, in[0], f32b(ne), "src0");
        float *y = a ? buf_ptr(x, out, f32b(ne), "output") : NULL;
        if (!y)
            return -1;
        return run_ew(x, n->op == MF_OP_SCALE ? MF_CU_EW_SCALE : MF_CU_EW_SILU, a, NULL, y, ne, 0,
                      n->meta.scale.s);
    }
    case MF_OP_RMSNORM:
    case MF_OP_QKNORM: {
        const int64_t w = n->op == MF_OP_QKNORM ? n->meta.norm.head_dim : n->ne[0];
        if (w <= 0 || ne % w || mf_node_nelem(s0) != ne)
            return NODE_ERR(x, "row width %lld for %lld elements (src %lld)", (long long)w,
                            (long long)ne, (long long)mf_node_nelem(s0));
        const float *wt = NULL;
        if (n->meta.norm.weight && !(wt = norm_weight(x, n->meta.norm.weight, w)))
            return -1;
        const float *a = buf_ptr(x, in[0], f32b(ne), "src0");
        float *y = a ? buf_ptr(x, out, f32b(ne), "output") : NULL;
        if (!y)
            return -1;
        if (may_defer && w == n->ne[0] && norm_fusable(c, g, node)) {
            c->pend_g = g;
            c->pend_node = node;
            c->pend_in = in[0];
            c->pend_out = out;
            c->pend_ea = *ea;
            return 0;
        }
        return run_norm(x, a, wt, y, w, ne / w, n->meta.norm.eps);
    }
    case MF_OP_MATMUL: {
        const mf_matmul_meta *m = &n->meta.matmul;
        if (s0->ne[0] != m->n_in || n->ne[0] != m->n_out || s0->ne[1] != nt)
            return NODE_ERR(x, "input %lldx%lld, output %lldx%lld for weight '%s' n_in %lld n_out %lld",
                            (long long)s0->ne[0], (long long)s0->ne[1], (long long)n->ne[0],
                            (long long)nt, m->weight, (long long)m->n_in, (long long)m->n_out);
        const float *a = buf_ptr(x, in[0], f32b(m->n_in * nt), "input");
        float *y = a ? buf_ptr(x, out, f32b(m->n_out * nt), "output") : NULL;
        if (!y)
            return -1;
        if (may_defer && add_fusable(c, g, node, nt)) {
            c->pend_g = g;
            c->pend_node = node;
            c->pend_in = in[0];
            c->pend_out = out;
            c->pend_ea = *ea;
            return 0;
        }
        float *const zc = zc_head(c, g, node, in[0], out, ea);
        if (zc) /* MINFER_CUDA_LOGITS_ZC: the GEMV writes the logits where the engine reads them */
            return run_head_zc(x, m, a, y, out, ea, zc);
        const int lc = lc_chunks(c, g, node, in[0], out, ea);
        if (lc) /* MINFER_CUDA_LOGITS_CHUNKS: the engine reads y right after; copy it while it is computed */
            return run_head_chunks(x, m, a, y, out, ea, lc);
        if (x->norm) { /* the RMSNorm before it is applied while x is quantized (norm_fusable) */
            const mf_matmul_meta *mm[1] = {m};
            float *const ys[1] = {y};
            return run_multi(x, mm, 1, false, a, ys, NULL, nt);
        }
        if (out == in[0]) { /* other rows still read the input while rows are written */
            float *s = scratch(x, 0, f32b(m->n_out * nt));
            if (!s || run_matmul(x, m, a, s, nt))
                return -1;
            return d2d(x, y, s, f32b(m->n_out * nt));
        }
        return run_matmul(x, m, a, y, nt);
    }
    case MF_OP_GETROWS: {
        const int64_t w = n->ne[0];
        float *y = buf_ptr(x, out, f32b(ne), "output");
        if (!y)
            return -1;
        if (n->meta.getrows.mode == 0) {
            if (s0->dtype != MF_DTYPE_I32 || s0->ne[0] != nt)
                return NODE_ERR(x, "%lld ids (%s) for %lld rows", (long long)s0->ne[0],
                                s0->dtype == MF_DTYPE_I32 ? "i32" : "f32", (long long)nt);
            const uint32_t wtype = n->meta.getrows.wtype;
            const void *wp = weight_ptr(x, n->meta.getrows.weight, wtype, w, -1);
            const int32_t *ids = wp ? buf_ptr(x, in[0], (size_t)nt * 4, "ids") : NULL;
            if (!ids)
                return -1;
            const mf_weight *wt = mf_weights_find(c->w, n->meta.getrows.weight);
            mf_cu_getrows_args a = {.wtype = wtype, .w = wp, .row_bytes = row_bytes(wtype, w),
                                    .n = w, .n_rows = wt->ne[1] > 0 ? wt->ne[1] : 1, .ids = ids,
                                    .nt = nt, .y = y, .fault = c->fault, .node = node};
            return launched(x, "getrows", nt, w, mf_cu_getrows(&a, st));
        }
        const int64_t first = n->meta.getrows.first;
        if (first < 0 || first + nt > s0->ne[1] || s0->ne[0] != w)
            return NODE_ERR(x, "rows [%lld, %lld) of a %lldx%lld input", (long long)first,
                            (long long)(first + nt), (long long)s0->ne[0], (long long)s0->ne[1]);
        const uint8_t *a = buf_ptr(x, in[0], f32b(mf_node_nelem(s0)), "src0");
        if (!a)
            return -1;
        if (out == in[0]) /* a row shift inside one buffer: memmove semantics */
            return first == 0 ? 0 : NODE_ERR(x, "row select [%lld, ...) in place", (long long)first);
        return d2d(x, y, a + f32b(first * w), f32b(ne));
    }
    case MF_OP_ROPE: {
        if (mf_node_nelem(s0) != ne || s1->dtype != MF_DTYPE_I32 || s1->ne[0] != nt ||
            (int64_t)n->meta.rope.n_head * n->meta.rope.head_dim != n->ne[0])
            return NODE_ERR(x, "x %lldx%lld, %lld positions, n_head %d head_dim %d", (long long)s0->ne[0],
                            (long long)s0->ne[1], (long long)s1->ne[0], n->meta.rope.n_head,
                            n->meta.rope.head_dim);
        const float *a = buf_ptr(x, in[0], f32b(ne), "src0");
        const int32_t *pos = a ? buf_ptr(x, in[1], (size_t)nt * 4, "positions") : NULL;
        float *y = pos ? buf_ptr(x, out, f32b(ne), "output") : NULL;
        if (!y)
            return -1;
        return run_rope(x, &n->meta.rope, a, y, pos, 0, nt);
    }
    case MF_OP_KVCACHE_STORE: {
        const int64_t kvd = g->kv_dim, ntk = s0->ne[1];
        if (s0->ne[0] != kvd || s1->ne[0] != kvd || s1->ne[1] != ntk)
            return NODE_ERR(x, "K %lldx%lld / V %lldx%lld vs kv_dim %lld", (long long)s0->ne[0],
                            (long long)ntk, (long long)s1->ne[0], (long long)s1->ne[1], (long long)kvd);
        void *kc = kv_region(x, kv.k, ea, ea->n_past + ntk, "K");
        void *vc = kc ? kv_region(x, kv.v, ea, ea->n_past + ntk, "V") : NULL;
        const float *k = vc ? buf_ptr(x, in[0], f32b(kvd * ntk), "K src") : NULL;
        const float *v = k ? buf_ptr(x, in[1], f32b(kvd * ntk), "V src") : NULL;
        if (!v)
            return -1;
        return run_store(x, kc, vc, ea, k, v, ntk);
    }
    case MF_OP_KVCACHE_LOAD: {
        if (n->ne[0] != g->kv_dim)
            return NODE_ERR(x, "width %lld vs kv_dim %lld", (long long)n->ne[0], (long long)g->kv_dim);
        void *r = kv_region(x, n->meta.kv.which ? kv.v : kv.k, ea, nt, n->meta.kv.which ? "V" : "K");
        float *y = r ? buf_ptr(x, out, f32b(ne), "output") : NULL;
        if (!y)
            return -1;
        mf_cu_kv_args a = {.kv_type = ea->kv_type, .cache = r, .kv_dim = g->kv_dim, .nt = nt, .dst = y};
        return launched(x, "kv_load", nt, g->kv_dim, mf_cu_kv_load(&a, st));
    }
    case MF_OP_ATTN: {
        const mf_attn_meta *m = &n->meta.attn;
        if (m->n_head <= 0 || m->n_head_kv <= 0 || m->n_head % m->n_head_kv ||
            (int64_t)m->n_head * m->head_dim != n->ne[0] ||
            (int64_t)m->n_head_kv * m->head_dim != g->kv_dim || m->head_dim > MF_CU_ATTN_MAX_HEAD_DIM ||
            mf_node_nelem(s0) != ne)
            return NODE_ERR(x, "n_head %d n_head_kv %d head_dim %d (max %d) for width %lld, kv_dim %lld",
                            m->n_head, m->n_head_kv, m->head_dim, MF_CU_ATTN_MAX_HEAD_DIM,
                            (long long)n->ne[0], (long long)g->kv_dim);
        void *kc = kv_region(x, kv.k, ea, ea->n_past + nt, "K");
        void *vc = kc ? kv_region(x, kv.v, ea, ea->n_past + nt, "V") : NULL;
        const float *q = vc ? buf_ptr(x, in[0], f32b(ne), "q") : NULL;
        float *y = q ? buf_ptr(x, out, f32b(ne), "output") : NULL;
        if (!y)
            return -1;
        mf_cu_attn_args a = {.q = q, .out = y, .k = kc, .v = vc, .kv_type = ea->kv_type, .nt = nt,
                             .n_past = ea->n_past, .n_past_dev = x->npast_dev,
                             .n_head = m->n_head, .n_head_kv = m->n_head_kv,
                             .head_dim = m->head_dim, .scale = m->scale,
                             .flash = c->flash && mf_cu_attn_flash_ok(m->head_dim, nt),
                             .n_ctx = ea->n_ctx, .tc = c->tc_attn};
        /* split-KV decode: its scratch size depends on n_ctx, never n_past */
        const size_t pb = c->flash_decode && !a.flash ? mf_cu_attn_decode_bytes(&a) : 0;
        /* short contexts: one kernel that also quantizes for the o GEMV, the
         * short-context kernel (MINFER_CUDA_ATTN_SHORT; no partials, no
         * counters) or the split kernel whose last block combines */
        const bool one = pb && attn_one_now(c, ea);
        const bool shrt = one && c->attn_short && mf_cu_attn_short_ok(&a);
        if (pb && !shrt && !(a.part = scratch(x, ATTN_SLOT, pb)))
            return -1;
        if (one && !shrt && !(a.cnt = counters(x, nt * m->n_head_kv)))
            return -1;
        if (one && m->head_dim % 32 == 0 && !(a.q8out = scratch(x, Q8OUT_SLOT, mf_cu_q8_bytes(n->ne[0], nt))))
            return -1;
        bool srope = false; /* MINFER_CUDA_SHORT_ROPE: the FUSED_QKV's rope-store folded in (rope_deferrable) */
        if (c->rs_node >= 0) {
            if (shrt && c->attn_short != 4 && c->rs_g == g && c->rs_node == n->src[0] && c->rs_args.rq.y == q &&
                mf_cu_attn_short_rope_ok(&a, &c->rs_args)) {
                srope = true;
                c->rs_node = -1;
            } else if (flush_rope(c, x->err)) {
                return -1;
            }
        }
        const char *kind = a.tc && mf_cu_attn_mma_ok(&a) ? "attn(mma)"
                           : a.flash                      ? "attn(flash)"
                           : srope                        ? (a.q8out ? "attn(short rope, q8)" : "attn(short rope)")
                           : shrt                         ? (a.q8out ? "attn(short, q8)" : "attn(short)")
                           : a.cnt                        ? (a.q8out ? "attn(decode one, q8)" : "attn(decode one)")
                           : a.part                       ? "attn(decode)"
                                                          : "attn";
        const cudaError_t ae = srope ? mf_cu_attn_short_rope(&a, &c->rs_args, st)
                               : shrt ? mf_cu_attn_short(&a, c->attn_short == 4 ? 4 : 0, st)
                                      : mf_cu_attn(&a, st);
        if (launched(x, kind, nt, m->n_head, ae))
            return -1;
        c->n_short_rope += srope;
        if (a.q8out) /* the o MATMUL (+ADD) after it finds x quantized (run_multi) */
            q8_produced(x, y, n->ne[0], nt, a.q8out);
        return 0;
    }
    case MF_OP_SOFTMAX: {
        if (mf_node_nelem(s0) != ne)
            return NODE_ERR(x, "src of %lld elements for %lld", (long long)mf_node_nelem(s0), (long long)ne);
        const float *a = buf_ptr(x, in[0], f32b(ne), "src0");
        float *y = a ? buf_ptr(x, out, f32b(ne), "output") : NULL;
        if (!y)
            return -1;
        mf_cu_softmax_args sa = {.x = a, .y = y, .n = n->ne[0], .nrows = ne / n->ne[0],
                                 .scale = n->meta.softmax.scale};
        return launched(x, "softmax", sa.nrows, sa.n, mf_cu_softmax(&sa, st));
    }
    case MF_OP_VIEW:
    case MF_OP_PERMUTE: {
        mf_cu_copy_args a = {.ne = {n->ne[0], n->ne[1], n->ne[2], n->ne[3]}};
        const int64_t srows = s0->ne[1] * s0->ne[2] * s0->ne[3];
        int64_t base = 0;
        if (n->op == MF_OP_VIEW) {
            base = n->meta.view.offset;
            if (base < 0 || base + n->ne[0] > s0->ne[0] || ne / n->ne[0] != srows)
                return NODE_ERR(x, "columns [%lld, %lld) of width %lld, %lld rows of %lld",
                                (long long)base, (long long)(base + n->ne[0]), (long long)s0->ne[0],
                                (long long)(ne / n->ne[0]), (long long)srows);
            a.st[0] = 1;
            a.st[1] = s0->ne[0];
            a.st[2] = s0->ne[0] * s0->ne[1];
            a.st[3] = a.st[2] * s0->ne[2];
        } else {
            int64_t sst[4] = {1, s0->ne[0], s0->ne[0] * s0->ne[1], s0->ne[0] * s0->ne[1] * s0->ne[2]};
            for (int d = 0; d < 4; d++) {
                int ax = n->meta.permute.axes[d];
                if (ax < 0 || ax > 3 || n->ne[d] != s0->ne[ax])
                    return NODE_ERR(x, "axis %d -> %d: %lld vs %lld", d, ax, (long long)n->ne[d],
                                    (long long)(ax >= 0 && ax < 4 ? s0->ne[ax] : -1));
                a.st[d] = sst[ax];
            }
        }
        const uint8_t *src = buf_ptr(x, in[0], f32b(mf_node_nelem(s0)), "src0");
        float *y = src ? buf_ptr(x, out, f32b(ne), "output") : NULL;
        if (!y)
            return -1;
        a.x = src + f32b(base);
        if (out == in[0]) { /* a gather from the buffer being written: go through scratch */
            float *s = scratch(x, 0, f32b(ne));
            a.y = s;
            if (!s || launched(x, "copy4d", ne, 1, mf_cu_copy4d(&a, st)))
                return -1;
            return d2d(x, y, s, f32b(ne));
        }
        a.y = y;
        return launched(x, "copy4d", ne, 1, mf_cu_copy4d(&a, st));
    }
    case MF_OP_RESHAPE: {
        if (mf_node_nelem(s0) != ne)
            return NODE_ERR(x, "%lld elements from %lld", (long long)ne, (long long)mf_node_nelem(s0));
        if (out == in[0])
            return 0;
        const void *a = buf_ptr(x, in[0], f32b(ne), "src0");
        void *y = a ? buf_ptr(x, out, f32b(ne), "output") : NULL;
        return y ? d2d(x, y, a, f32b(ne)) : -1;
    }
    case MF_OP_FUSED_QKV:
    case MF_OP_FUSED_QKV_NORM:
    case MF_OP_QKV_BIAS_ROPE_STORE:
        return exec_qkv(x, in, out, kv, ea);
    case MF_OP_FUSED_FFN: {
        const mf_ffn_meta *m = &n->meta.ffn;
        const int64_t nf = m->gate.n_out;
        if (m->up.n_out != nf || n->ne[0] != nf || s0->ne[0] != m->gate.n_in || s0->ne[0] != m->up.n_in)
            return NODE_ERR(x, "gate %lldx%lld, up %lldx%lld, input width %lld, output %lld",
                            (long long)m->gate.n_in, (long long)nf, (long long)m->up.n_in,
                            (long long)m->up.n_out, (long long)s0->ne[0], (long long)n->ne[0]);
        const float *a = buf_ptr(x, in[0], f32b(s0->ne[0] * nt), "input");
        float *y = a ? buf_ptr(x, out, f32b(nf * nt), "output") : NULL;
        const mf_matmul_meta *mm[2] = {&m->gate, &m->up};
        if (y && fuse_ok(x, mm, 2, nt) && m->gate.wtype == m->up.wtype) {
            float *const ys[2] = {y, NULL};
            x->q8b = c->ffn_q8b != 0; /* the down GEMV's int8 input too, where the kernel allows */
            return run_multi(x, mm, 2, true, a, ys, NULL, nt);
        }
        if (y) { /* prefill: gate and up as one mma GEMM with SwiGLU in its epilogue */
            float *const ys[2] = {y, NULL};
            const int r = run_mma_multi(x, mm, 2, true, a, ys, nt);
            if (r <= 0)
                return r;
        }
        float *sg = y ? scratch(x, 0, f32b(nf * nt)) : NULL;
        float *su = sg ? scratch(x, 1, f32b(nf * nt)) : NULL;
        if (su && fuse_ok(x, mm, 2, nt)) {
            float *const ys[2] = {sg, su};
            if (run_multi(x, mm, 2, false, a, ys, NULL, nt))
                return -1;
            return run_ew(x, MF_CU_EW_SWIGLU, sg, su, y, nf * nt, nf * nt, 0);
        }
        if (su && x->norm) /* norm_fusable promised the fused path */
            return NODE_ERR(x, "folded RMSNorm but the matmuls cannot take the int8 GEMV (nt %lld)",
                            (long long)nt);
        if (!su || run_matmul(x, &m->gate, a, sg, nt) || run_matmul(x, &m->up, a, su, nt))
            return -1;
        return run_ew(x, MF_CU_EW_SWIGLU, sg, su, y, nf * nt, nf * nt, 0);
    }
    default:
        return NODE_ERR(x, "no CUDA arm for this op%s", "");
    }
}

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

static void gentry_clear(cu_gentry *e) {
    if (e->exec)
        cudaGraphExecDestroy(e->exec);
    free(e->nodes);
    free(e->calls);
    memset(e, 0, sizeof *e);
}

static int run_calls(mf_backend *b, const mf_graph *g, const cu_call *calls, int32_t n,
                     const mf_exec_args *a, mf_error *err) {
    cu_ctx *c = CX(b);
    if (slot_issue(c, err))
        return -1;
    if (!c->capturing) /* a capture keeps them: its fallback issues them again */
        slot_clear(c);
    for (int32_t i = 0; i < n; i++)
        if (exec_now(b, g, calls[i].node, calls[i].in, calls[i].out, calls[i].kv, a, err))
            return -1;
    return flush_pending(b, err); /* a capture must contain every launch */
}

static int flush_recorded(mf_backend *b, mf_error *err) {
    cu_ctx *c = CX(b);
    if (!c->recording)
        return 0;
    c->recording = false;
    return run_calls(b, c->rec_g, c->rec, c->n_rec, &c->rec_a, err);
}

static int cu_begin_forward(mf_backend *b, const mf_graph *g, const mf_exec_args *a, mf_error *err) {
    cu_ctx *c = CX(b);
    (void)err;
    ht_begin(c);
    /* a recording still open belongs to a forward that failed before its
     * end_forward: its calls are dropped, never run late */
    c->recording = false;
    c->n_rec = 0;
    c->pend_node = -1; /* likewise a node it deferred (end_forward flushes one on success) */
    c->rs_node = -1;
    c->d2h_bytes = 0;
    slot_clear(c); /* likewise its slot writes */
    if (!c->graphs_on || a->n_tokens > GRAPH_MAX_T)
        return 0;
    c->recording = true;
    c->rec_g = g;
    c->rec_a = *a;
    c->n_rec = 0;
    return 0;
}

static int cu_execute_node(mf_backend *b, const mf_graph *g, int32_t node, const int32_t *in,
                           int32_t out, mf_kv_pair kv, const mf_exec_args *ea, mf_error *err) {
    cu_ctx *c = CX(b);
    if (c->recording && (g != c->rec_g || ea->n_past != c->rec_a.n_past ||
                         ea->n_tokens != c->rec_a.n_tokens || node < 0 || node >= g->n_nodes ||
                         g->nodes[node].n_src > MF_MAX_SRC) &&
        flush_recorded(b, err))
        return -1;
    if (!c->recording)
        return exec_now(b, g, node, in, out, kv, ea, err);
    if (c->n_rec == 0)
        ht_mark(c, HT_REC0);
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
 * replays without ~170 execute_node calls (MINFER_CUDA_REPEAT, default on). */
static int cu_repeat_calls(mf_backend *b, const mf_graph *g, const mf_exec_args *a, mf_error *err) {
    cu_ctx *c = CX(b);
    (void)err;
    if (!c->repeat || !c->recording || c->n_rec != 0 || g != c->rec_g || g->stamp == 0 ||
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
    ht_mark(c, HT_REC0);
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
           e->attn_one == attn_one_now(c, &c->rec_a) && e->attn_short == c->attn_short &&
           e->short_rope == c->short_rope && e->out_host == lc_key(c, &c->rec_a) && e->zc == c->logits_zc &&
           memcmp(e->scr, c->scr, sizeof e->scr) == 0 && e->n_slotw == c->n_slotw &&
           memcmp(e->slotw, c->slotw, (size_t)c->n_slotw * sizeof *c->slotw) == 0 &&
           memcmp(e->calls, c->rec, (size_t)c->n_rec * sizeof *c->rec) == 0 &&
           ((g->stamp != 0 && e->stamp == g->stamp) ||
            memcmp(e->nodes, g->nodes, (size_t)g->n_nodes * sizeof *g->nodes) == 0);
}

/* Enqueues the upload of the forward's n_past to dev_npast (before the
 * graph's kernels, in stream order), or puts it into the input slots. */
static int upload_npast(cu_ctx *c, int32_t n_past, mf_error *err) {
    const int rc = slot_put(c, c->dev_npast, &n_past, sizeof n_past, err);
    if (rc <= 0)
        return rc;
    if (c->pin_used + 256 > PIN_BYTES && cu_wait(c, "n_past upload", err))
        return -1;
    memcpy(c->pin + c->pin_used, &n_past, sizeof n_past);
    CU_TRY(cudaMemcpyAsync(c->dev_npast, c->pin + c->pin_used, sizeof n_past, cudaMemcpyHostToDevice,
                           c->stream));
    c->pin_used += 256;
    return 0;
}

/* Captures the recorded calls into e->exec; false (nothing launched, the
 * stream out of capture mode) when any part fails. */
static bool capture(mf_backend *b, cu_gentry *e, mf_error *err) {
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
        slot_clear(c); /* the graph copies them out of the slots */
    if (!ok) {
        cudaGetLastError();
        mf_log(MF_LOG_DEBUG, "cuda: graph capture abandoned (%s); running the forward plainly",
               rc ? cerr.msg : cudaGetErrorName(ce));
    }
    (void)err;
    return ok;
}

static int cu_end_forward(mf_backend *b, const mf_graph *g, const mf_exec_args *a, mf_error *err) {
    cu_ctx *c = CX(b);
    if (!c->recording)
        return flush_pending(b, err);
    if (g != c->rec_g || a->n_past != c->rec_a.n_past)
        return flush_recorded(b, err);
    c->recording = false;
    if (c->n_rec == 0 || (int64_t)a->n_past + a->n_tokens > a->n_ctx)
        return run_calls(b, g, c->rec, c->n_rec, a, err); /* the plain path reports it */
    /* n_past for the captured kernels: into the slots (part of what a graph
     * must match), or uploaded now, ahead of the graph */
    if (upload_npast(c, a->n_past, err))
        return -1;
    cu_gentry *e = NULL;
    for (int i = 0; i < N_GENTRY; i++) /* two sessions' logits buffers: two entries, no recaptures */
        if (c->ge[i].g == g && c->ge[i].out_host == lc_key(c, &c->rec_a))
            e = &c->ge[i];
    const bool match = e && gentry_matches(c, e);
    if (match && e->exec) {
        ht_mark(c, HT_MATCH);
        e->used = ++c->ge_clock;
        ring_note(c, "graph", "cudaGraphLaunch", c->n_rec, 1);
        c->ht.live = c->ht.on;
        ht_mark(c, HT_LAUNCH0);
        if (c->ht.live)
            CU_TRY(cudaEventRecord(c->ht.ev[0], c->stream));
        CU_TRY(cudaGraphLaunch(e->exec, c->stream));
        if (c->ht.live)
            CU_TRY(cudaEventRecord(c->ht.ev[1], c->stream));
        ht_mark(c, HT_LAUNCH1);
        if (c->n_slotw) /* the graph's first node reads them */
            c->slot_live = true;
        slot_clear(c);
        c->n_replays++;
        if (g->stamp) /* matched by its nodes: this build's calls too (cu_repeat_calls) */
            e->stamp = g->stamp;
        /* the graph made the early logits copy (if it captured one) */
        d2h_set(c, e->d2h_id, e->out_host, e->d2h_bytes, e->d2h_zc);
        c->fruitless = 0;
        return 0;
    }
    if (match && !e->no_capture) {
        e->used = ++c->ge_clock;
        if (capture(b, e, err)) {
            ring_note(c, "graph", "cudaGraphLaunch(first)", c->n_rec, 1);
            e->d2h_id = c->d2h_id; /* what the captured calls copied early (run_head_chunks) */
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
    gentry_clear(e);
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
    e->attn_one = attn_one_now(c, a);
    e->attn_short = c->attn_short;
    e->short_rope = c->short_rope;
    e->out_host = lc_key(c, a);
    e->zc = c->logits_zc;
    memcpy(e->slotw, slotw, sizeof slotw);
    e->n_slotw = n_slotw;
    memcpy(e->scr, c->scr, sizeof e->scr);
    e->used = ++c->ge_clock;
    return 0;
}

/* ---- lifetime ------------------------------------------------------------------------------- */

static void cu_free(mf_backend *b) {
    cu_ctx *c = CX(b);
    if (c->stream) {
        mf_error e;
        c->recording = false; /* an unfinished forward's calls are dropped */
        c->pend_node = -1;
        c->rs_node = -1;
        if (cu_wait(c, "free", &e))
            fprintf(stderr, "%s\n", e.msg);
    }
    ht_print(&c->ht);
#ifdef MF_KTIME
    if (c->stream) /* the kernel timeline (MINFER_CUDA_KTIME, pdl.cuh) */
        mf_cu_ktime_dump(stderr);
#endif
    for (int i = 0; i < PINNED_N; i++) /* blocks a holder did not give back */
        if (c->pinned[i].p)
            cudaFreeHost(c->pinned[i].p);
    for (int i = 0; i < 2 && c->ht.on; i++)
        cudaEventDestroy(c->ht.ev[i]);
    for (int i = 0; c->d2h_stream && i <= LC_MAX; i++)
        if (c->d2h_ev[i])
            cudaEventDestroy(c->d2h_ev[i]);
    if (c->d2h_stream)
        cudaStreamDestroy(c->d2h_stream);
    for (int i = 0; i < N_GENTRY; i++)
        gentry_clear(&c->ge[i]);
    free(c->rec);
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
    if (c->soa_mem)
        cudaFree(c->soa_mem);
    free(c->soff);
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

#undef mf_exec_args

static cu_args cu_args_of(const mf_exec_args *a) {
    return (cu_args){.n_past = a->n_past, .n_tokens = a->n_tokens, .n_ctx = a->n_ctx, .kv_type = a->kv_type,
                     .out_node = -1};
}

static int cu_op_exec(mf_backend *b, const mf_graph *g, const mf_node_call *k, const mf_exec_args *a,
                      mf_error *err) {
    const cu_args ca = cu_args_of(a);
    return cu_execute_node(b, g, k->node, k->in, k->out, k->kv, &ca, err);
}

/* The hooks in the order the engine called them for a split: begin_forward,
 * the host inputs, the recorded calls (repeat_calls, one-split forwards) or
 * execute_node per node, end_forward. */
static int cu_execute_split(mf_backend *b, const mf_split_call *s, mf_error *err) {
    cu_args a = cu_args_of(s->args);
    for (int32_t k = 0; k < s->n_outputs; k++)
        if (s->read_back[k]) {
            a.out_host = s->read_back[k];
            a.out_node = s->outputs[k];
            a.out_bytes = mf_node_nbytes(&s->g->nodes[s->outputs[k]]);
        }
    if (cu_begin_forward(b, s->g, &a, err))
        return -1;
    for (int32_t k = 0; k < s->n_host_inputs; k++) {
        const mf_host_input *h = &s->host_inputs[k];
        if (cu_write_host(b, h->buf, 0, h->data, h->nbytes, err))
            return mf_error_prefix(err, "forward: input node %d '%s'", h->node, s->g->nodes[h->node].name);
    }
    int repeated = 0;
    if (s->n_splits == 1 && s->n_inputs == 0 && s->g->stamp &&
        (repeated = cu_repeat_calls(b, s->g, &a, err)) < 0)
        return -1;
    for (int32_t k = 0; !repeated && k < s->n_calls; k++) {
        const mf_node_call *c = &s->calls[k];
        if (cu_execute_node(b, s->g, c->node, c->in, c->out, c->kv, &a, err))
            return -1;
    }
    return cu_end_forward(b, s->g, &a, err);
}

#define CU_E(op) [op] = {cu_supports_op, cu_op_exec}
static const mf_op_entry cu_table[] = {
    CU_E(MF_OP_INPUT), CU_E(MF_OP_ADD), CU_E(MF_OP_MUL), CU_E(MF_OP_SCALE), CU_E(MF_OP_SILU),
    CU_E(MF_OP_SWIGLU), CU_E(MF_OP_RMSNORM), CU_E(MF_OP_QKNORM), CU_E(MF_OP_MATMUL), CU_E(MF_OP_GETROWS),
    CU_E(MF_OP_ROPE), CU_E(MF_OP_KVCACHE_STORE), CU_E(MF_OP_KVCACHE_LOAD), CU_E(MF_OP_ATTN),
    CU_E(MF_OP_SOFTMAX), CU_E(MF_OP_VIEW), CU_E(MF_OP_RESHAPE), CU_E(MF_OP_PERMUTE), CU_E(MF_OP_FUSED_QKV),
    CU_E(MF_OP_FUSED_QKV_NORM), CU_E(MF_OP_FUSED_FFN), CU_E(MF_OP_QKV_BIAS_ROPE_STORE),
    /* no batched paged kernel yet: the node (and its layer's KV) runs on the CPU */
    [MF_OP_ATTN_PAGED] = {NULL, NULL},
};
#undef CU_E
MF_OP_TABLE_CHECK(cu_table);

static const mf_backend_ops cu_ops = {
    .name = cu_name,
    .op_table = cu_table,
    .supports_fused = cu_supports_fused,
    .alloc_buffer = cu_alloc_buffer,
    .free_buffer = cu_free_buffer,
    .alloc_fresh = cu_alloc_fresh,
    .execute_split = cu_execute_split,
    .read_host = cu_read_host,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .write_host = cu_write_host,
    .synchronize = cu_synchronize,
    .has_weight = cu_has_weight,
    .describe = mf_cuda_device_desc,
    .free = cu_free,
};

/* MINFER_CUDA_LOGITS_CHUNKS=k: 2..LC_MAX turns the chunked lm_head on
 * (its side stream and events made on first use), anything else off. A
 * failure to make them leaves it off. */
static void lc_set(cu_ctx *c, int64_t k) {
    c->logits_chunks = 0;
    c->d2h_bytes = 0;
    if (k < 2 || k > LC_MAX)
        return;
    if (!c->d2h_stream) {
        if (cudaStreamCreateWithFlags(&c->d2h_stream, cudaStreamNonBlocking) != cudaSuccess) {
            cudaGetLastError();
            c->d2h_stream = NULL;
            return;
        }
        for (int i = 0; i <= LC_MAX; i++)
            if (cudaEventCreateWithFlags(&c->d2h_ev[i], cudaEventDisableTiming) != cudaSuccess) {
                cudaGetLastError();
                for (int j = 0; j < i; j++)
                    cudaEventDestroy(c->d2h_ev[j]);
                memset(c->d2h_ev, 0, sizeof c->d2h_ev);
                cudaStreamDestroy(c->d2h_stream);
                c->d2h_stream = NULL;
                return;
            }
    }
    c->logits_chunks = (int)k;
}

/* Device choice and checks, before anything is allocated on it. */
static int open_device(cu_ctx *c, mf_error *err) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
        return mf_errorf(err, "cuda: no usable device: cudaGetDeviceCount: %s (%s)", cudaGetErrorName(e),
                         cudaGetErrorString(e));
    if (count <= 0)
        return mf_errorf(err, "cuda: no CUDA device found");
    long dev = mf_env_int("MINFER_CUDA_DEVICE", 0);
    if (dev < 0 || dev >= count)
        return mf_errorf(err, "cuda: MINFER_CUDA_DEVICE=%ld but %d device(s) exist", dev, count);
    c->device = (int)dev;
    CU_TRY(cudaSetDevice(c->device));
    struct cudaDeviceProp p;
    CU_TRY(cudaGetDeviceProperties(&p, c->device));
    if (p.major < 7)
        return mf_errorf(err, "cuda: device %d '%s' has compute capability %d.%d; minfer needs 7.0 or newer",
                         c->device, p.name, p.major, p.minor);
    c->smem_per_block = p.sharedMemPerBlock;
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
    return 0;
}

/* The mma GEMM's tile config: MINFER_CUDA_MMA_CFG, default 2 (64x64 warp
 * tiles, k step 64, 3 stages: the fastest on the H200, docs/PERF.md entry
 * 13); 0 is the session-2 kernel exactly; out of range: the default. */
static int mma_cfg_from_env(void) {
    const int64_t c = mf_env_int("MINFER_CUDA_MMA_CFG", 2);
    return c >= 0 && c < MF_CU_MMA_N_CFG ? (int)c : 2;
}

/* MINFER_CUDA_FFN_Q8B's default block form (H200 session 7 runs 1-2: form 4) */
#define FFN_Q8B_DEFAULT 4

/* MINFER_CUDA_FFN_Q8B's value as the block form it names: 0 off, 1 ..
 * MF_CU_Q8B_FORMS that form, anything else the default. */
static int ffn_q8b_form(int64_t v) {
    return v >= 0 && v <= MF_CU_Q8B_FORMS ? (int)v : FFN_Q8B_DEFAULT;
}

/* The int8 GEMV's kernel choice as the environment asks (at creation, and
 * when a test hands the choice back). */
static void gemv_from_env(cu_ctx *c) {
    c->gemv_v1 = mf_env_flag("MINFER_CUDA_GEMV_V1");
    c->gemv_auto = !mf_env_flag("MINFER_CUDA_GEMV_V3");
    c->gemv_pro = mf_env_flag("MINFER_CUDA_GEMV_PROLOGUE") ? 1 : 0;
    /* v4 by its rule unless v1 / v3 everywhere was asked for */
    const int64_t u = mf_env_int("MINFER_CUDA_GEMV_V4", c->gemv_v1 || !c->gemv_auto ? 0 : -1);
    c->gemv_v4 = u >= -1 && u <= 2 ? (int)u : -1;
    c->qkv_mix = mf_env_int("MINFER_CUDA_QKV_MIX", 1) != 0; /* on: H200 device run 2 of session 6 (PERF.md entry 16) */
    c->ffn_q8b = ffn_q8b_form(mf_env_int("MINFER_CUDA_FFN_Q8B", FFN_Q8B_DEFAULT));
}

int mf_backend_cuda_new_progress(const mf_weights *w, mf_cuda_progress_fn progress, void *user,
                                 mf_backend **out, mf_error *err) {
    *out = NULL;
    if (mf_env_flag("MINFER_DISABLE_CUDA"))
        return mf_errorf(err, "cuda: disabled by MINFER_DISABLE_CUDA");
    cu_ctx *c = mf_calloc(1, sizeof *c);
    mf_backend *b = mf_calloc(1, sizeof *b);
    b->ops = &cu_ops;
    b->kind = MF_BACKEND_CUDA;
    b->is_gpu = true;
    b->ctx = c;
    c->w = w;
    c->timeout_ms = mf_env_int("MINFER_GPU_TIMEOUT_MS", 10000);
    if (c->timeout_ms <= 0)
        c->timeout_ms = 10000;
    c->no_tc = mf_env_flag("MINFER_CUDA_NO_TC");
    c->no_mma = mf_env_flag("MINFER_CUDA_NO_MMA");
    c->mma_min_nt = (int)mf_env_int("MINFER_CUDA_MMA_MIN_NT", 0);
    c->no_mma_fuse = mf_env_flag("MINFER_CUDA_NO_MMA_FUSE");
    c->no_mma_split = mf_env_flag("MINFER_CUDA_NO_MMA_SPLIT");
    c->mma_cfg = mma_cfg_from_env();
    c->no_q8 = mf_env_flag("MINFER_CUDA_NO_Q8");
    c->fuse = mf_env_flag("MINFER_CUDA_FUSE_GEMV");
    /* On by default: the H200 run of 2026-11-30 00:21 measured rope-store + norm
     * fusion + flash prefill together at +33 % tg / +25 % pp on qwen2-0.5B and
     * +2 % / +11 % on the 7B shapes (docs/PERF.md); =0 turns each off. The others
     * stay opt-in: FUSE_GEMV helped alone but not on top of these, GEMV_V2
     * measured slower. FUSE_ADD (measured +0.3 % in run 10, before the
     * kernels got fast enough for 48 ew launches a token to show) is on by
     * default from session 2; =0 turns it off. */
    c->fuse_rope = mf_env_int("MINFER_CUDA_FUSE_ROPE", 1) != 0;
    c->fuse_add = mf_env_int("MINFER_CUDA_FUSE_ADD", 1) != 0;
    c->fuse_norm = mf_env_int("MINFER_CUDA_FUSE_NORM", 1) != 0;
    c->norm_mm = mf_env_int("MINFER_CUDA_NORM_MM", 1) != 0;
    c->gemv_v2 = mf_env_flag("MINFER_CUDA_GEMV_V2");
    gemv_from_env(c);
    /* opt-in: plane copies built after the upload (build_soa); 2: only the types and
     * widths where they measured faster (soa_wanted) */
    c->soa = (int)mf_env_int("MINFER_CUDA_SOA", 0);
    if (c->soa < 0 || c->soa > 2)
        c->soa = 1;
    c->flash = mf_env_int("MINFER_CUDA_FLASH_PREFILL", 1) != 0;
    c->tc_attn = !mf_env_flag("MINFER_CUDA_NO_TC_ATTN");
    c->flash_decode = !mf_env_flag("MINFER_CUDA_NO_FLASH_DECODE");
    /* on by default while the context is short: H200, PERF.md entry 14 (one
     * kernel -2.2 us per layer at depth 100, +3.9 us at depth 1000: the last
     * block's combine reads every active split alone) */
    c->attn_one = mf_env_int("MINFER_CUDA_ATTN_ONE", 1) != 0;
    c->attn_one_max = mf_env_int("MINFER_CUDA_ATTN_ONE_MAX", 384);
    /* on by default: H200, device run 5 (PERF.md entry 15): the attention of a 0.5B
     * layer 7.7 -> 3.0 us in the replayed graph, tg128 0.5B Q4_0 1,418 -> 1,708,
     * 7B Q4_0 495.5 -> 527.0, 7B Q4_K_M 416.1 -> 429.0 */
    c->attn_short = (int)mf_env_int("MINFER_CUDA_ATTN_SHORT", 1);
    /* on: H200 session 6 device run 3, tg128 0.5B Q4_0 1,758 -> 1,805, 7B Q4_0 523.7 -> 543.4,
     * 7B Q4_K_M 437.1 -> 447.1 (PERF.md entry 16) */
    c->short_rope = mf_env_int("MINFER_CUDA_SHORT_ROPE", 1) != 0;
    c->rs_node = -1;
    c->pend_node = -1;
    c->graphs_on = !mf_env_flag("MINFER_NO_CUDA_GRAPH");
    mf_cuda_set_input_slots(b, (int)mf_env_int("MINFER_CUDA_INPUT_SLOTS", 1));
    c->repeat = mf_env_int("MINFER_CUDA_REPEAT", 1) != 0;
    c->trace = mf_env_flag("MINFER_TRACE");
    if (mf_env_flag("MINFER_CUDA_HOST_TIMES") &&
        cudaEventCreate(&c->ht.ev[0]) == cudaSuccess && cudaEventCreate(&c->ht.ev[1]) == cudaSuccess)
        c->ht.on = true;
    mf_cu_set_pdl(mf_env_int("MINFER_CUDA_PDL", MF_CU_PDL_DEFAULT) != 0);
    mf_cu_set_gemv_pf((int)mf_env_int("MINFER_CUDA_GEMV_PF", 0), mf_env_flag("MINFER_CUDA_GEMV_PF_LINES"));
    /* many-block RMSNorm / norm-quant and per-head rope-store (bitwise equal) */
    mf_cu_set_wide(!mf_env_flag("MINFER_CUDA_NO_WIDE_NORM"), !mf_env_flag("MINFER_CUDA_NO_WIDE_ROPE"));
    /* on by default: +13 % 7B / +16 % 4B / +9 % 0.5B tg128 on the H200 (PERF.md
     * entry 13), bitwise the same outputs; MINFER_CUDA_LAT=0 the old kernels */
    mf_cu_set_lat(mf_env_int("MINFER_CUDA_LAT", 1) != 0);
    mf_cu_set_gemv_v4_pf((int)mf_env_int("MINFER_CUDA_GEMV_V4_PF", 3)); /* 3: auto by launch bytes */
    mf_cu_set_attn_short_pf(mf_env_int("MINFER_CUDA_ATTN_PF", 1) != 0);
    mf_cu_set_gemv_v4_q6k((int)mf_env_int("MINFER_CUDA_GEMV_V4_Q6K", 3)); /* PERF.md entries 14, 18 */
    mf_cu_set_gemv_v4_big((int)mf_env_int("MINFER_CUDA_GEMV_V4_BIG", 32)); /* PERF.md entry 14 */
    mf_cu_set_gemv_v4_early((int)mf_env_int("MINFER_CUDA_GEMV_V4_EARLY", 2)); /* PERF.md entry 19 */
    if (open_device(c, err))
        goto fail;
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
    /* opt-in until measured on the H200 (docs/ENV.md): the logits copy overlapped with the lm_head */
    lc_set(c, mf_env_int("MINFER_CUDA_LOGITS_CHUNKS", 0));
    /* on by default (H200 session 7, PERF.md entry 17): the lm_head GEMV writes the logits to the host itself */
    c->logits_zc = mf_env_int("MINFER_CUDA_LOGITS_ZC", 1) == 1;
    if (upload_weights(c, progress, user, err) || build_soa(c, err))
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
    return mf_backend_cuda_new_progress(w, NULL, NULL, out, err);
}

const char *mf_cuda_device_desc(const mf_backend *b) {
    return CX(b)->desc;
}

void mf_cuda_set_matmul_mode(mf_backend *b, int mode) {
    CX(b)->matmul_mode = mode;
}

void mf_cuda_set_fuse(mf_backend *b, bool on) {
    CX(b)->fuse = on;
}

void mf_cuda_set_fuse_rope(mf_backend *b, bool on) {
    CX(b)->fuse_rope = on;
}

void mf_cuda_set_fuse_add(mf_backend *b, bool on) {
    CX(b)->fuse_add = on;
}

void mf_cuda_set_fuse_norm(mf_backend *b, bool on) {
    CX(b)->fuse_norm = on;
}

void mf_cuda_set_norm_mm(mf_backend *b, bool on) {
    CX(b)->norm_mm = on;
}

void mf_cuda_set_gemv_v2(mf_backend *b, bool on) {
    CX(b)->gemv_v2 = on;
}

void mf_cuda_set_gemv_v1(mf_backend *b, bool on) {
    CX(b)->gemv_v1 = on;
    CX(b)->gemv_auto = false; /* the tests pick v1 or v3 exactly */
    CX(b)->gemv_v4 = 0;
}

void mf_cuda_set_gemv_v4(mf_backend *b, int u) {
    CX(b)->gemv_v4 = u >= -1 && u <= 2 ? u : 0;
}

void mf_cuda_set_ffn_q8b(mf_backend *b, int mode) {
    CX(b)->ffn_q8b = ffn_q8b_form(mode < 0 ? mf_env_int("MINFER_CUDA_FFN_Q8B", FFN_Q8B_DEFAULT) : mode);
}

void mf_cuda_q8_ready_stats(const mf_backend *b, int64_t *read) {
    *read = CX(b)->n_q8_ready;
}

void mf_cuda_reset_gemv(mf_backend *b) {
    gemv_from_env(CX(b));
}

void mf_cuda_set_soa(mf_backend *b, bool on) {
    CX(b)->soa = on;
}

uint64_t mf_cuda_soa_bytes(const mf_backend *b) {
    return CX(b)->soa_mem ? CX(b)->soa_bytes : 0;
}

void mf_cuda_set_gemv_prologue(mf_backend *b, int mode) {
    if (mode < 0)
        CX(b)->gemv_pro = mf_env_flag("MINFER_CUDA_GEMV_PROLOGUE") ? 1 : 0;
    else
        CX(b)->gemv_pro = mode > 2 ? 2 : mode;
}

void mf_cuda_set_flash(mf_backend *b, bool on) {
    CX(b)->flash = on;
}

void mf_cuda_set_tc_attn(mf_backend *b, bool on) {
    CX(b)->tc_attn = on;
}

void mf_cuda_set_flash_decode(mf_backend *b, bool on) {
    CX(b)->flash_decode = on;
}

void mf_cuda_set_attn_one(mf_backend *b, int mode) {
    cu_ctx *c = CX(b);
    c->attn_one = mode < 0 ? mf_env_int("MINFER_CUDA_ATTN_ONE", 1) != 0 : mode != 0;
    c->attn_one_max = mode < 0 ? mf_env_int("MINFER_CUDA_ATTN_ONE_MAX", 384) : INT64_MAX;
}

void mf_cuda_set_attn_short(mf_backend *b, int mode) {
    CX(b)->attn_short = mode < 0 ? (int)mf_env_int("MINFER_CUDA_ATTN_SHORT", 1) : mode;
}

void mf_cuda_set_short_rope(mf_backend *b, int mode) {
    CX(b)->short_rope = mode < 0 ? mf_env_int("MINFER_CUDA_SHORT_ROPE", 1) != 0 : mode != 0;
}

int64_t mf_cuda_short_rope_count(const mf_backend *b) {
    return CX(b)->n_short_rope;
}

void mf_cuda_set_mma_chunk(mf_backend *b, uint64_t bytes) {
    CX(b)->mma_chunk = bytes;
}

void mf_cuda_set_mma_fuse(mf_backend *b, int fuse, int split) {
    CX(b)->no_mma_fuse = !fuse;
    CX(b)->no_mma_split = !split;
}

void mf_cuda_set_mma_cfg(mf_backend *b, int cfg) {
    CX(b)->mma_cfg = cfg >= 0 && cfg < MF_CU_MMA_N_CFG ? cfg : mma_cfg_from_env();
}

void mf_cuda_set_graphs(mf_backend *b, bool on) {
    cu_ctx *c = CX(b);
    c->graphs_on = on;
    c->fruitless = 0;
}

void mf_cuda_set_input_slots(mf_backend *b, int mode) {
    CX(b)->input_slots = mode >= 0 && mode <= 2 ? mode : 1;
}

int64_t mf_cuda_slot_count(const mf_backend *b) {
    return CX(b)->n_slot_w;
}

void mf_cuda_fuse_stats(const mf_backend *b, int64_t *adds, int64_t *norms) {
    *adds = CX(b)->n_fused_add;
    *norms = CX(b)->n_fused_norm;
}

void mf_cuda_set_logits_chunks(mf_backend *b, int k) {
    lc_set(CX(b), k);
}

void mf_cuda_set_logits_zc(mf_backend *b, bool on) {
    CX(b)->logits_zc = on;
    CX(b)->d2h_bytes = 0;
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

void mf_cuda_set_repeat(mf_backend *b, bool on) {
    CX(b)->repeat = on;
}

int64_t mf_cuda_repeat_count(const mf_backend *b) {
    return CX(b)->n_repeats;
}
