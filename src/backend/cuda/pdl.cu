/* pdl.cu - the programmatic-dependent-launch switch (pdl.cuh), and with
 * MINFER_CUDA_KTIME the kernel timeline's registry and dump. */
#include "backend/cuda/cuda_args.h"
#include "backend/cuda/pdl.cuh"

int mf_cu_pdl_on = 0;

extern "C" void mf_cu_set_pdl(int on) {
    mf_cu_pdl_on = on != 0;
}
