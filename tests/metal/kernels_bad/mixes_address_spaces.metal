// A threadgroup pointer where a device pointer is expected: Apple's compiler
// refuses it, and so must the emulator's.
#include <metal_stdlib>
using namespace metal;

static float first(device const float *p) {
    return p[0];
}

kernel void mf_bad_addrspace(device float *y [[buffer(0)]],
                             threadgroup float *shmem [[threadgroup(0)]],
                             uint tid [[thread_position_in_grid]]) {
    shmem[tid] = 1.0f;
    y[tid] = first(shmem);
}
