/* cuda_backend.h - the CUDA backend (NVIDIA GPUs, compute capability >= 7.0).
 *
 * mf_backend_cuda_create picks a device (mf_cuda_options.device), checks
 * it (cc >= 7.0, every kernel resolvable, shared-memory needs within the
 * device's limit), creates one stream, and uploads every weight of a type it
 * has kernels for (F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K..Q6_K) once,
 * through pinned staging, registered by GGUF name (has_weight answers the
 * all-weights-registered gate). Activations are f32 device buffers.
 *
 * execute_node only launches; synchronize is the bounded wait
 * (mf_cuda_options.timeout_ms, default 10 s) and on a timeout or a device
 * fault fails naming the last 16 kernels launched (also printed to stderr).
 *
 * The backend reads no environment: the product levers come in
 * mf_cuda_options, every kernel choice in the tuning (cuda_tune.h: defaults
 * per device, then the options' tuning string). Without a usable device or
 * driver the constructor fails with a message (the caller then runs on the
 * CPU): never an abort. */
#ifndef MF_CUDA_BACKEND_H
#define MF_CUDA_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_tune.h"

/* Called during the weight upload with bytes done and total. */
typedef void (*mf_cuda_progress_fn)(void *user, uint64_t done, uint64_t total);

/* The weight table must outlive the backend; opt NULL: the defaults
 * (mf_backend_options_default). Of the options it reads device,
 * gpu_timeout_ms, graphs, fusion, trace, profile (where a replayed step's
 * host time went, printed when freed), tune (the tuning string) and the
 * upload progress. Returns 0 and *out, or -1 with err saying why (no
 * device, cc too low, a bad tuning string, out of device memory). */
int mf_backend_cuda_create(const mf_weights *w, const mf_backend_options *opt, mf_backend **out, mf_error *err);
int mf_backend_cuda_new(const mf_weights *w, mf_backend **out, mf_error *err);

/* One line describing the device in use ("NVIDIA H200, cc 9.0, 132 SMs,
 * 139.8 GiB"), for logs and tests. */
const char *mf_cuda_device_desc(const mf_backend *b);

/* The per-forward values the backend's paths take: the split's args plus
 * the read-back hint (out_host: where the engine reads node out_node's
 * out_bytes right after the forward; NULL: none), which execute_split
 * derives from the split's read_back. */
typedef struct mf_cuda_args {
    int32_t n_past, n_tokens, n_ctx;
    uint32_t kv_type;
    void *out_host;
    int32_t out_node;
    size_t out_bytes;
    const mf_kv_batch *batch; /* paged forwards (ATTN_PAGED) only; else NULL */
} mf_cuda_args;

/* Tests: one forward driven by hand, in the order execute_split calls them
 * (begin, the host inputs through write_host, the nodes, end); repeat:
 * the recorded build's calls stand for the nodes (1), or not (0). */
int mf_cuda_begin_forward(mf_backend *b, const mf_graph *g, const mf_cuda_args *a, mf_error *err);
int mf_cuda_execute_node(mf_backend *b, const mf_graph *g, int32_t node, const int32_t *in, int32_t out,
                         mf_kv_pair kv, const mf_cuda_args *a, mf_error *err);
int mf_cuda_repeat_calls(mf_backend *b, const mf_graph *g, const mf_cuda_args *a, mf_error *err);
int mf_cuda_end_forward(mf_backend *b, const mf_graph *g, const mf_cuda_args *a, mf_error *err);

/* Tests and experiments: the tuning string applied on top of the backend's
 * current tuning (as mf_cuda_tune_parse; a bad string changes nothing), the
 * tuning itself, and a saved tuning put back. Graphs captured before keep
 * what they captured where their key does not tell (cu_gentry). */
int mf_cuda_retune(mf_backend *b, const char *tune, mf_error *err);
const mf_cuda_tune *mf_cuda_tuning(const mf_backend *b);
void mf_cuda_set_tuning(mf_backend *b, const mf_cuda_tune *t);

/* Tests: the product lever mf_cuda_options.graphs after creation. */
void mf_cuda_set_graphs(mf_backend *b, bool on);

/* Tests: counters since creation (a captured graph counts once, at its
 * capture, unless said otherwise). fuse_stats: MATMUL + ADD pairs run as
 * one GEMV (fuse_add) and RMSNorms folded into their consumer (fuse_norm);
 * q8_ready: int8 GEMVs that read an input a kernel before wrote as a
 * by-product; short_rope: launches of the rope-store folded into the short
 * attention; graph_stats: forwards captured and replayed; repeat: forwards
 * that took their calls from a recorded build; slot: writes that took an
 * input slot; d2h_stats: forwards whose logits were written early (at each
 * replay too) and read_host calls that only waited; zc: forwards whose
 * lm_head stored the logits into the host block (at each replay too). */
void mf_cuda_fuse_stats(const mf_backend *b, int64_t *adds, int64_t *norms);
void mf_cuda_q8_ready_stats(const mf_backend *b, int64_t *read);
int64_t mf_cuda_short_rope_count(const mf_backend *b);
void mf_cuda_graph_stats(const mf_backend *b, int64_t *captures, int64_t *replays);
int64_t mf_cuda_repeat_count(const mf_backend *b);
int64_t mf_cuda_slot_count(const mf_backend *b);
void mf_cuda_d2h_stats(const mf_backend *b, int64_t *chunked, int64_t *early_reads);
int64_t mf_cuda_zc_count(const mf_backend *b);

#endif
