/* levers.c - the lever table and its readers (levers.h). */
#include "runtime/levers.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const mf_lever levers[] = {
    {"MINFER_LOG", MF_LEVER_STRING, "warn", "level of log lines on stderr: debug, info, warn, error"},
    {"MINFER_BACKENDS", MF_LEVER_STRING, "", "the engine's backend list in priority order, e.g. ref,cpu"},
    {"MINFER_CACHE_TYPE", MF_LEVER_STRING, "", "K and V cache type, f32 f16 q8_0 q4_0 q4_1 q5_0 q5_1; overrides the options"},
    {"MINFER_NO_MMAP", MF_LEVER_FLAG, "off", "the GGUF reader reads the model file instead of mapping it"},
    {"MINFER_MLOCK", MF_LEVER_FLAG, "off", "the GGUF reader locks the model's bytes in memory (mlock)"},
    {"MINFER_NO_FUSE_QKV", MF_LEVER_FLAG, "off", "decode graphs keep separate Q/K/V matmuls, norms, RoPE, store"},
    {"MINFER_NO_FUSE_FFN", MF_LEVER_FLAG, "off", "decode graphs keep separate gate/up matmuls and SWIGLU"},
    {"MINFER_NO_FUSE_QKV_EPILOGUE", MF_LEVER_FLAG, "off", "decode graphs keep separate bias, RoPE, KV-store nodes"},
    {"MINFER_NO_FUSE_SWIGLU", MF_LEVER_FLAG, "off", "no SILU + MUL -> SWIGLU fusion pass"},
    {"MINFER_GRAPH_REBUILD", MF_LEVER_FLAG, "off", "rebuild the graph before every forward (reuse check)"},
    {"MINFER_GRAPH_TRACE", MF_LEVER_INT, "0", "1: split table and census per build; 2: also every node"},
    {"MINFER_OP_PROFILE", MF_LEVER_FLAG, "off", "synchronize after every node, print time per op at exit"},
    {"MINFER_ALTERNATE_BACKENDS", MF_LEVER_FLAG, "off", "test: node i to the (i mod k)-th backend that runs it"},
    {"MINFER_CPU_ISA", MF_LEVER_STRING, "", "lower the CPU kernel ISA: scalar, avx2, avx512, neon"},
    {"MINFER_POOL_SPIN_US", MF_LEVER_INT, "50", "microseconds a pool worker spins before it sleeps"},
    {"MINFER_DISABLE_CUDA", MF_LEVER_FLAG, "off", "device auto does not try CUDA; asking for it fails"},
    {"MINFER_CUDA_DEVICE", MF_LEVER_INT, "0", "CUDA device index"},
    {"MINFER_CUDA_TUNE", MF_LEVER_STRING, "", "CUDA kernel-choice experiments, key=value,... (ENV.md)"},
    {"MINFER_GPU_TIMEOUT_MS", MF_LEVER_INT, "10000", "bound of every GPU wait, in ms"},
    {"MINFER_NO_CUDA_GRAPH", MF_LEVER_FLAG, "off", "GPU splits launch kernel by kernel, never replay a graph"},
    {"MINFER_CUDA_NO_FUSE", MF_LEVER_FLAG, "off", "no fusions of the GPU backend's own inside a split"},
    {"MINFER_TRACE", MF_LEVER_FLAG, "off", "print every GPU kernel launch as it is enqueued"},
    {"MINFER_CUDA_HOST_TIMES", MF_LEVER_FLAG, "off", "print where a replayed decode step's time went, at exit"},
    /* the Metal backend's (mf_backend_options.metal) */
    {"MINFER_DISABLE_METAL", MF_LEVER_FLAG, "off", "the Metal constructor refuses: auto runs without Metal"},
    {"MINFER_DISABLE_MPS", MF_LEVER_FLAG, "off", "the seed's name for MINFER_DISABLE_METAL"},
    {"MINFER_METALLIB_FILE", MF_LEVER_STRING, "", "a precompiled .metallib instead of the embedded kernel source"},
    {"MINFER_WEIGHT_COPY", MF_LEVER_FLAG, "off", "Metal copies the weights instead of wrapping the mapping"},
    {"MINFER_METAL_CAPTURE", MF_LEVER_FLAG, "off", "a GPU capture of the first Metal command buffers"},
    {"MINFER_METAL_GEMM", MF_LEVER_INT, "2", "Metal matmul tier: 0 GEMV only, 1 GEMM from 2 tokens, 2 by shape"},
    {"MINFER_ATTN_CHUNK", MF_LEVER_INT, "0", "KV positions per split of Metal's split-KV attention (0: auto)"},
    {"MINFER_METAL_NO_FUSED_QKV", MF_LEVER_FLAG, "off", "Metal runs no fused QKV dispatch"},
    {"MINFER_METAL_NO_FUSED_FFN", MF_LEVER_FLAG, "off", "Metal runs no fused FFN dispatch"},
    {"MINFER_METAL_NO_FUSED_QKV_NORM", MF_LEVER_FLAG, "off", "Metal runs no fused QKV + QK-norm dispatch"},
};

int mf_lever_count(void) {
    return (int)(sizeof levers / sizeof levers[0]);
}

const mf_lever *mf_lever_at(int i) {
    return i >= 0 && i < mf_lever_count() ? &levers[i] : NULL;
}

const mf_lever *mf_lever_find(const char *name) {
    for (int i = 0; i < mf_lever_count(); i++)
        if (!strcmp(levers[i].name, name))
            return &levers[i];
    return NULL;
}

/* ---- the environment: the only getenv calls of the library ------------------ */

static long env_int(const char *name, long def) {
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end) {
        mf_log(MF_LOG_WARN, "%s=%s is not an integer; using %ld", name, v, def);
        return def;
    }
    return x;
}

static bool env_flag(const char *name) {
    const char *v = getenv(name);
    if (!v || !*v)
        return false;
    return strcmp(v, "0") && strcasecmp(v, "false") && strcasecmp(v, "off") && strcasecmp(v, "no");
}

static const char *env_str(const char *name, const char *def) {
    const char *v = getenv(name);
    return (v && *v) ? v : def;
}

static const mf_lever *must(const char *name, mf_lever_type type) {
    const mf_lever *l = mf_lever_find(name);
    MF_ASSERT(l && l->type == type); /* every lever is a row of the table */
    return l;
}

bool mf_lever_flag(const char *name) {
    must(name, MF_LEVER_FLAG);
    return env_flag(name);
}

long mf_lever_int(const char *name) {
    const mf_lever *l = must(name, MF_LEVER_INT);
    return env_int(name, strtol(l->def, NULL, 10));
}

const char *mf_lever_str(const char *name) {
    const mf_lever *l = must(name, MF_LEVER_STRING);
    return env_str(name, *l->def ? l->def : NULL);
}

void mf_levers_backend_options(mf_backend_options *o) {
    mf_backend_options_default(o);
    o->gpu_timeout_ms = mf_lever_int("MINFER_GPU_TIMEOUT_MS");
    o->graphs = !mf_lever_flag("MINFER_NO_CUDA_GRAPH");
    o->fusion = !mf_lever_flag("MINFER_CUDA_NO_FUSE");
    o->trace = mf_lever_flag("MINFER_TRACE");
    o->profile = mf_lever_flag("MINFER_CUDA_HOST_TIMES");
    o->cpu_isa = mf_lever_str("MINFER_CPU_ISA");
    o->metal.disable = mf_lever_flag("MINFER_DISABLE_METAL") || mf_lever_flag("MINFER_DISABLE_MPS");
    o->metal.metallib = mf_lever_str("MINFER_METALLIB_FILE");
    o->metal.weight_copy = mf_lever_flag("MINFER_WEIGHT_COPY");
    o->metal.capture = mf_lever_flag("MINFER_METAL_CAPTURE");
    o->metal.gemm = (int32_t)mf_lever_int("MINFER_METAL_GEMM");
    o->metal.attn_chunk = (int32_t)mf_lever_int("MINFER_ATTN_CHUNK");
    o->metal.fuse_qkv = !mf_lever_flag("MINFER_METAL_NO_FUSED_QKV");
    o->metal.fuse_ffn = !mf_lever_flag("MINFER_METAL_NO_FUSED_FFN");
    o->metal.fuse_qkv_norm = !mf_lever_flag("MINFER_METAL_NO_FUSED_QKV_NORM");
}

mf_log_level mf_levers_log_level(void) {
    const char *v = mf_lever_str("MINFER_LOG");
    if (!strcasecmp(v, "debug"))
        return MF_LOG_DEBUG;
    if (!strcasecmp(v, "info"))
        return MF_LOG_INFO;
    if (!strcasecmp(v, "error"))
        return MF_LOG_ERROR;
    return MF_LOG_WARN; /* warn, and anything unknown */
}

static void apply_process_levers(void) {
    mf_log_set_default_level(mf_levers_log_level());
    mf_pool_set_spin_us(mf_lever_int("MINFER_POOL_SPIN_US"));
}

void mf_levers_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, apply_process_levers);
}
