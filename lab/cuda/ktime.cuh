/* ktime.cuh - the in-kernel timeline (lab build: cmake -DMINFER_CUDA_KTIME=ON).
 * Included by src/backend/cuda/pdl.cuh only when MF_KTIME is defined: every
 * kernel that calls mf_pdl_wait records its release time into a per-file
 * device ring; ktime.cu prints the timeline when the backend is freed. */
#ifndef MF_CUDA_KTIME_CUH
#define MF_CUDA_KTIME_CUH
/* The in-situ kernel timeline (CMake MINFER_CUDA_KTIME; off: none of this
 * exists and mf_pdl_wait() is the plain wait above). Thread 0 of block
 * (0,0,0) of every kernel that calls mf_pdl_wait() appends one record: the
 * %globaltimer just after griddepcontrol.wait returned (= the kernel before
 * it completed and its writes are visible: the kernel's release), how long
 * that thread sat in the wait (0: it arrived after the release, so its own
 * launch / prologue was on the critical path), its grid and block, and the
 * source line of the call (the site). Without -rdc every .cu is its own device
 * image, so each file that includes this header gets its own ring (static
 * below) and registers a host-side reader with pdl.cu at static-initializer
 * time; mf_cu_ktime_dump (pdl.cu) merges them. Cost: one atomic (issued
 * before the wait) and a 32-byte store in one thread a kernel. */
typedef struct mf_kt_rec {
    unsigned long long t;  /* %globaltimer (ns) after the wait */
    unsigned int wait_ns;  /* time in the wait */
    unsigned int site;     /* __LINE__ of the mf_pdl_wait() call */
    unsigned int gx, gy;   /* gridDim.x, gridDim.y */
    unsigned int bx;       /* blockDim.x */
    unsigned int pad;
} mf_kt_rec;

#define MF_KT_CAP 8192 /* records a file (power of 2); the ring keeps the last ones */
#ifndef MF_KT_FILE
#define MF_KT_FILE __BASE_FILE__ /* CMake passes the .cu's name; nvcc's own is a temp file */
#endif
