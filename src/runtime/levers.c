/* levers.c - the lever table and its readers (levers.h). */
#include "runtime/levers.h"

#include <stdlib.h>
#include <string.h>

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

static const mf_lever *must(const char *name, mf_lever_type type) {
    const mf_lever *l = mf_lever_find(name);
    MF_ASSERT(l && l->type == type); /* every lever is a row of the table */
    return l;
}

bool mf_lever_flag(const char *name) {
    must(name, MF_LEVER_FLAG);
    return mf_env_flag(name);
}

long mf_lever_int(const char *name) {
    const mf_lever *l = must(name, MF_LEVER_INT);
    return mf_env_int(name, strtol(l->def, NULL, 10));
}

const char *mf_lever_str(const char *name) {
    const mf_lever *l = must(name, MF_LEVER_STRING);
    return mf_env_str(name, *l->def ? l->def : NULL);
}

void mf_levers_backend_options(mf_backend_options *o) {
    mf_backend_options_default(o);
    o->gpu_timeout_ms = mf_lever_int("MINFER_GPU_TIMEOUT_MS");
    o->graphs = !mf_lever_flag("MINFER_NO_CUDA_GRAPH");
    o->fusion = !mf_lever_flag("MINFER_CUDA_NO_FUSE");
    o->trace = mf_lever_flag("MINFER_TRACE");
    o->profile = mf_lever_flag("MINFER_CUDA_HOST_TIMES");
}
