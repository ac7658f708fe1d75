// MSL has no double: the emulator's compile must refuse this kernel.
#include <metal_stdlib>
using namespace metal;

kernel void mf_bad_double(device float *y [[buffer(0)]],
                          uint tid [[thread_position_in_grid]]) {
    double acc = 0.0;
    acc += (double)y[tid];
    y[tid] = (float)acc;
}
