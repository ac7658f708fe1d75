/* cuda_backend.h - the CUDA backend (NVIDIA GPUs, compute capability >= 7.0).
 *
 * mf_backend_cuda_new picks a device (MINFER_CUDA_DEVICE, default 0), checks
 * it (cc >= 7.0, every kernel resolvable, shared-memory needs within the
 * device's limit), creates one stream, and uploads every weight of a type it
 * has kernels for (F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K..Q6_K) once,
 * through pinned staging, registered by GGUF name (has_weight answers the
 * all-weights-registered gate). Activations are f32 device buffers.
 *
 * execute_node only launches; synchronize is the bounded wait (default 10 s,
 * MINFER_GPU_TIMEOUT_MS) and on a timeout or a device fault fails naming the
 * last 16 kernels launched (also printed to stderr).
 *
 * Levers: MINFER_DISABLE_CUDA=1 makes the constructor fail with a message
 * (the caller then runs on the CPU); MINFER_CUDA_DEVICE=N; MINFER_GPU_TIMEOUT_MS;
 * the kernel-path switches (MINFER_NO_CUDA_GRAPH, MINFER_CUDA_PDL,
 * MINFER_CUDA_NO_MMA, ...) are read once here, at creation; docs/ENV.md lists
 * each with its default and the measurement behind it.
 * Without a usable device or driver the constructor fails the same way:
 * never an abort. */
#ifndef MF_CUDA_BACKEND_H
#define MF_CUDA_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"

/* Called during the weight upload with bytes done and total. */
typedef void (*mf_cuda_progress_fn)(void *user, uint64_t done, uint64_t total);

/* The weight table must outlive the backend. Returns 0 and *out, or -1 with
 * err saying why (disabled, no device, cc too low, out of device memory). */
int mf_backend_cuda_new(const mf_weights *w, mf_backend **out, mf_error *err);
int mf_backend_cuda_new_progress(const mf_weights *w, mf_cuda_progress_fn progress, void *user,
                                 mf_backend **out, mf_error *err);

/* One line describing the device in use ("NVIDIA H200, cc 9.0, 132 SMs,
 * 139.8 GiB"), for logs and tests. */
const char *mf_cuda_device_desc(const mf_backend *b);

/* Tests: force the matmul kernel family (3 mma GEMM, 2 tensor-core GEMM,
 * 1 SIMT GEMM, -1 f32-activation GEMV, -2 int8 GEMV, 0 by token count and
 * type). Not for production use. */
void mf_cuda_set_matmul_mode(mf_backend *b, int mode);
/* Tests: f16 bytes of weight rows per mma dequant + GEMM chunk (0: the
 * default 320 MiB), so a small test can make the chunking happen. */
void mf_cuda_set_mma_chunk(mf_backend *b, uint64_t bytes);
/* Tests: the mma tier's fused QKV / gate+up GEMMs (fuse; off = what
 * MINFER_CUDA_NO_MMA_FUSE=1 gives) and its split-K (split; off = what
 * MINFER_CUDA_NO_MMA_SPLIT=1 gives). */
void mf_cuda_set_mma_fuse(mf_backend *b, int fuse, int split);
/* Tests: the mma GEMM's tile config as MINFER_CUDA_MMA_CFG=cfg gives (0 the
 * session-2 tiles, 1 .. MF_CU_MMA_N_CFG - 1 the newer ones, cuda_args.h;
 * others: what the environment says, default 2). */
void mf_cuda_set_mma_cfg(mf_backend *b, int cfg);

/* Tests: the fused decode GEMV of MINFER_CUDA_FUSE_GEMV on or off. */
void mf_cuda_set_fuse(mf_backend *b, bool on);
/* Tests: the one-launch rope + KV store of MINFER_CUDA_FUSE_ROPE on or off. */
void mf_cuda_set_fuse_rope(mf_backend *b, bool on);
/* Tests: MATMUL + residual ADD as one GEMV (MINFER_CUDA_FUSE_ADD) on or off. */
void mf_cuda_set_fuse_add(mf_backend *b, bool on);
/* Tests: RMSNORM folded into the next fused node (MINFER_CUDA_FUSE_NORM). */
void mf_cuda_set_fuse_norm(mf_backend *b, bool on);
/* Tests: ... into a plain MATMUL too (the output norm -> lm_head; MINFER_CUDA_NORM_MM). */
void mf_cuda_set_norm_mm(mf_backend *b, bool on);
/* Tests: how many MATMUL + ADD pairs ran as one GEMV (FUSE_ADD) and how many
 * RMSNorms were folded into their consumer (FUSE_NORM) since creation; a
 * captured graph counts once, at its capture. */
void mf_cuda_fuse_stats(const mf_backend *b, int64_t *adds, int64_t *norms);
/* Tests: the paired-unit Q4_K GEMV (MINFER_CUDA_GEMV_V2) on or off. */
void mf_cuda_set_gemv_v2(mf_backend *b, bool on);
/* Tests: exactly the v1 int8 GEMV kernels (on) or exactly v3 (off), not
 * the auto rule; mf_cuda_reset_gemv restores what the environment says. */
void mf_cuda_set_gemv_v1(mf_backend *b, bool on);
void mf_cuda_reset_gemv(mf_backend *b);
/* Tests: the one-token v4 GEMVs on the plane weight copies (MINFER_CUDA_SOA)
 * or not; copies exist only when the variable was set at creation, and
 * mf_cuda_soa_bytes says how many bytes they hold (0: none). */
void mf_cuda_set_soa(mf_backend *b, bool on);
uint64_t mf_cuda_soa_bytes(const mf_backend *b);
/* Tests: one-token GEMVs on the v4 kernel with u slices per lane in flight
 * (1, 2; 0 off; -1 the default rule), as MINFER_CUDA_GEMV_V4=u. */
void mf_cuda_set_gemv_v4(mf_backend *b, int u);
/* Tests: how many int8 GEMVs read an input a kernel before wrote as a
 * by-product (x_q8_ready: the ATTN_ONE decode's quantized output) since
 * creation; a captured graph counts once, at its capture. */
void mf_cuda_q8_ready_stats(const mf_backend *b, int64_t *read);
/* Tests: MINFER_CUDA_FFN_Q8B (default 4): a decode FUSED_FFN's SwiGLU GEMV
 * also writes the down GEMV's int8 input (that GEMV then launches no
 * quantize kernel). 1 .. MF_CU_Q8B_FORMS (cuda_args.h): on, with that block
 * form of the kernel (same bits every form); 0 off; -1 what the
 * environment says; another value: the default form. Graphs captured
 * before keep what they captured. */
void mf_cuda_set_ffn_q8b(mf_backend *b, int mode);
/* The int8 GEMV's quantizing prologue (opt-in MINFER_CUDA_GEMV_PROLOGUE=1): 0 off
 * (the separate quantize / norm-quant kernels), 1 the auto rule
 * (mf_cu_q8_prologue_rule), 2 wherever it fits; < 0: what the environment
 * says. */
void mf_cuda_set_gemv_prologue(mf_backend *b, int mode);
/* Tests: the flash-prefill attention (MINFER_CUDA_FLASH_PREFILL) on or off. */
void mf_cuda_set_flash(mf_backend *b, bool on);
/* Tests: the tensor-core prefill attention (on unless MINFER_CUDA_NO_TC_ATTN=1);
 * off, forwards of > 8 tokens take the kernel mf_cuda_set_flash selects. */
void mf_cuda_set_tc_attn(mf_backend *b, bool on);
/* Tests: the split-KV flash decode attention (on unless
 * MINFER_CUDA_NO_FLASH_DECODE=1) on or off. */
void mf_cuda_set_flash_decode(mf_backend *b, bool on);
/* Tests: MINFER_CUDA_ATTN_ONE: the split-KV decode combines (and quantizes
 * its output for the o GEMV) in its last block per group. 1: at every
 * depth, 0: off, -1: what the environment says (default: on while n_past +
 * n_tokens <= MINFER_CUDA_ATTN_ONE_MAX, 384). */
void mf_cuda_set_attn_one(mf_backend *b, int mode);
/* Tests: MINFER_CUDA_ATTN_SHORT: where the one-kernel decode above would
 * run (and the shape fits mf_cu_attn_short_ok), the short-context kernel
 * (attn_short.cu) instead, same outputs (out, the o GEMV's q8). 1 on (12
 * warps a block), 4 on with 4 warps, 0 off (the default), -1 what the
 * environment says. Graphs are keyed on it. */
void mf_cuda_set_attn_short(mf_backend *b, int mode);
/* Tests: MINFER_CUDA_SHORT_ROPE (opt-in): a one-token FUSED_QKV's
 * rope-store (+ QkNorm, K/V store) folded into the 12-warp short-context
 * attention right after it (mf_cu_attn_short_rope), bitwise the same
 * outputs and cache rows. 1 on, 0 off, -1 what the environment says.
 * Graphs are keyed on it. _count: launches of the folded kernel so far (a
 * captured launch counts once, its replays not). */
void mf_cuda_set_short_rope(mf_backend *b, int mode);
int64_t mf_cuda_short_rope_count(const mf_backend *b);

/* CUDA graph capture/replay of small forwards (begin_forward/end_forward):
 * on unless MINFER_NO_CUDA_GRAPH=1; tests switch it and read how many
 * forwards were captured and replayed. */
void mf_cuda_set_graphs(mf_backend *b, bool on);
void mf_cuda_graph_stats(const mf_backend *b, int64_t *captures, int64_t *replays);
/* MINFER_CUDA_REPEAT (default on): the engine's repeat_calls hook takes a
 * forward's calls from a recorded forward of the same graph build; the count
 * of forwards it took. */
void mf_cuda_set_repeat(mf_backend *b, bool on);
int64_t mf_cuda_repeat_count(const mf_backend *b);
/* Tests: MINFER_CUDA_INPUT_SLOTS as at creation (a recorded forward's small
 * write_host calls and n_past wait in pinned slots that its graph copies
 * from: 1 with one kernel, 2 with a copy each; 0 off), and how many writes
 * took a slot so far. */
void mf_cuda_set_input_slots(mf_backend *b, int mode);
int64_t mf_cuda_slot_count(const mf_backend *b);
/* Tests: MINFER_CUDA_LOGITS_CHUNKS=k as at creation (2..16; 0 or anything
 * else: off, exactly the old launches and copies): a one-token int8 lm_head
 * whose rows the engine reads right after (mf_exec_args' out_host hint, in a
 * host_alloc block) runs as k row chunks, each chunk's rows copied to the
 * host on a side stream while the next chunk computes. */
void mf_cuda_set_logits_chunks(mf_backend *b, int k);
/* Tests: forwards whose lm_head ran chunked with the early copy (a captured
 * graph counts at its capture and at each replay) and read_host calls that
 * found their bytes already copied (only waited) since creation. */
void mf_cuda_d2h_stats(const mf_backend *b, int64_t *chunked, int64_t *early_reads);
/* Tests: MINFER_CUDA_LOGITS_ZC=1 as at creation (false: exactly the old
 * launches and copies): that one-token lm_head, where its v4 GEMV has a ZC
 * instance, also stores the logits into the hinted host_alloc block itself
 * (32-byte lines through the block's device alias), so the read only
 * waits (counted in mf_cuda_d2h_stats' early reads). Takes precedence over
 * the chunks where both apply. Graphs are keyed on it. _count: forwards
 * whose lm_head did so (a captured graph counts at its capture and at
 * each replay). */
void mf_cuda_set_logits_zc(mf_backend *b, bool on);
int64_t mf_cuda_zc_count(const mf_backend *b);

#endif
