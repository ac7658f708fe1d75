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

static __device__ mf_kt_rec mf_kt_ring[MF_KT_CAP];
static __device__ unsigned long long mf_kt_n; /* records ever written into this file's ring */

static __device__ __forceinline__ unsigned long long mf_kt_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __device__ __forceinline__ void mf_kt_wait_at(unsigned int site) {
    const bool me = (threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z) == 0;
    unsigned long long t0 = 0, slot = 0;
    if (me) {
        t0 = mf_kt_now();
        /* before the wait: the slot only has to be unique (the dump sorts by
         * time), atomics on one word are coherent whatever else is running,
         * and an early-launched kernel hides the atomic's round trip here */
        slot = atomicAdd(&mf_kt_n, 1ull) & (MF_KT_CAP - 1);
    }
    mf_pdl_wait();
    if (me) {
        const unsigned long long t1 = mf_kt_now();
        mf_kt_rec *r = &mf_kt_ring[slot];
        r->t = t1;
        r->wait_ns = (unsigned int)(t1 - t0);
        r->site = site;
        r->gx = gridDim.x;
        r->gy = gridDim.y;
        r->bx = blockDim.x;
        r->pad = 0;
    }
}
/* every call site records its own line; the function above is already defined */
#define mf_pdl_wait() mf_kt_wait_at(__LINE__)

/* Host side: the reader each file registers (pdl.cu keeps the list). Copies
 * the file's ring into out (MF_KT_CAP records) and its count into *n, then
 * zeroes the count so the next dump sees only newer records; 0 or -1. */
typedef int (*mf_kt_fetch_fn)(mf_kt_rec *out, unsigned long long *n);
int mf_kt_register(const char *file, mf_kt_fetch_fn fetch);

static int mf_kt_fetch(mf_kt_rec *out, unsigned long long *n) {
    const unsigned long long zero = 0;
    if (cudaMemcpyFromSymbol(n, mf_kt_n, sizeof *n) != cudaSuccess ||
        cudaMemcpyFromSymbol(out, mf_kt_ring, sizeof mf_kt_ring) != cudaSuccess ||
        cudaMemcpyToSymbol(mf_kt_n, &zero, sizeof zero) != cudaSuccess)
        return -1;
    return 0;
}
static struct mf_kt_registrar {
    mf_kt_registrar() { mf_kt_register(MF_KT_FILE, mf_kt_fetch); }
} mf_kt_registrar_here;
#endif
