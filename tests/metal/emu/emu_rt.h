/* The MSL emulator's runtime: kernel registry, dispatch of a grid on fibers
 * (one per GPU thread, 32-lane simdgroups), the synchronisation points the
 * prelude calls (simd collectives, barriers), guarded device memory and the
 * checks that fail a dispatch. C API, used by the prelude (C++), the stand-in
 * Metal framework (Objective-C) and the tests (C). */
#ifndef MF_EMU_RT_H
#define MF_EMU_RT_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

#define MF_EMU_MAX_BUFFERS 31      /* Metal's buffer argument table */
#define MF_EMU_MAX_TG_ARGS 31
#define MF_EMU_TG_LIMIT 32768      /* threadgroup memory per threadgroup */
#define MF_EMU_MAX_THREADS 1024    /* threads per threadgroup */
#define MF_EMU_SIMD_WIDTH 32
#define MF_EMU_SLOT_BYTES 64       /* largest value a simd collective moves */

enum mf_emu_arg_kind { MF_EMU_ARG_BUFFER = 1, MF_EMU_ARG_THREADGROUP = 2, MF_EMU_ARG_BUILTIN = 3 };
enum mf_emu_builtin {
    MF_EMU_B_THREAD_POSITION_IN_GRID = 1,
    MF_EMU_B_THREADGROUP_POSITION_IN_GRID,
    MF_EMU_B_THREAD_POSITION_IN_THREADGROUP,
    MF_EMU_B_THREADS_PER_THREADGROUP,
    MF_EMU_B_THREADGROUPS_PER_GRID,
    MF_EMU_B_THREADS_PER_GRID,
    MF_EMU_B_THREAD_INDEX_IN_THREADGROUP,
    MF_EMU_B_THREAD_INDEX_IN_SIMDGROUP,
    MF_EMU_B_SIMDGROUP_INDEX_IN_THREADGROUP,
    MF_EMU_B_THREADS_PER_SIMDGROUP,
    MF_EMU_B_SIMDGROUPS_PER_THREADGROUP
};

/* One kernel parameter, as mf_mslgen read it from the signature. */
typedef struct mf_emu_arg {
    int kind;          /* mf_emu_arg_kind */
    int index;         /* [[buffer(n)]], [[threadgroup(n)]], or the builtin id */
    int is_ref;        /* `constant T &`: the bytes bound must cover sizeof(T) */
    int is_const;      /* `device const T *` or `constant`: never written */
    size_t size;       /* sizeof the pointee */
    size_t align;      /* alignof the pointee: the bound address must be a multiple */
    const char *name;  /* parameter name */
    const char *type;  /* parameter type as written */
} mf_emu_arg;

typedef struct mf_emu_kernel {
    const char *name;
    const char *file;
    int line;
    int nargs;
    const mf_emu_arg *args;
    void (*thunk)(void *const *bind); /* bind[i]: pointer for parameter i */
    struct mf_emu_kernel *next;       /* registry chain */
    int hidden;                       /* test hook: mf_emu_hide */
} mf_emu_kernel;

/* Registry (filled by constructors the generated code carries). */
void mf_emu_register(mf_emu_kernel *k);
const mf_emu_kernel *mf_emu_find(const char *name);
/* Test hooks: hide a kernel from mf_emu_find (1) or show it again (0);
 * add a kernel not built from a .metal file (a deliberately faulty one). */
int mf_emu_hide(const char *name, int hidden);
int mf_emu_kernel_count(void);
const char *mf_emu_kernel_name(int i); /* i < mf_emu_kernel_count(), else NULL */

/* A dispatch: dispatchThreadgroups:threadsPerThreadgroup: with its bindings. */
typedef struct mf_emu_launch {
    const mf_emu_kernel *kernel;
    void *buf[MF_EMU_MAX_BUFFERS];       /* contents + offset, NULL = unbound */
    size_t buf_len[MF_EMU_MAX_BUFFERS];  /* bytes from buf[i] to the end of its buffer */
    const char *buf_label[MF_EMU_MAX_BUFFERS];
    size_t tg_len[MF_EMU_MAX_TG_ARGS];   /* setThreadgroupMemoryLength:atIndex: */
    uint32_t groups[3];
    uint32_t threads[3];
} mf_emu_launch;

/* Runs the whole grid on the calling thread. 0 on success; else -1 with a
 * one-line message in err (DEADLOCK / DIVERGENCE / fault / a failed check). */
int mf_emu_dispatch(const mf_emu_launch *l, char *err, size_t errcap);

/* Schedules: the order fibers run between synchronisation points. The
 * default comes from MINFER_EMU_SCHEDULE=forward|reverse|random[:seed]. */
enum mf_emu_schedule { MF_EMU_FORWARD = 0, MF_EMU_REVERSE = 1, MF_EMU_RANDOM = 2 };
void mf_emu_set_schedule(int schedule, uint64_t seed);
int mf_emu_get_schedule(uint64_t *seed);

/* Device memory with a PROT_NONE guard page on both sides; the end of the
 * data (len rounded up to 16) touches the trailing guard so an overrun of one
 * element faults. The fault message names the label. */
void *mf_emu_alloc(size_t len, const char *label);
void mf_emu_free(void *p);
/* Relabels memory from mf_emu_alloc or mf_emu_mem_register. */
void mf_emu_set_label(void *p, const char *label);
/* Names memory mapped elsewhere for fault messages: [map, map + map_len) is
 * the whole mapping (guard pages included; 0/0 for none), [data, data + len)
 * the bytes. mf_emu_mem_unregister(data) forgets it. */
void mf_emu_mem_register(void *map, size_t map_len, void *data, size_t len, const char *label);
void mf_emu_mem_unregister(void *data);
/* Called for a fault outside a dispatch (the stand-in names host access to
 * a buffer in flight); the hook does not return when it claims the fault. */
void mf_emu_set_fault_hook(void (*hook)(void *addr));
void mf_emu_install_fault_handler(void);

/* ---- called by the prelude, on a fiber ---- */
typedef struct mf_emu_simd_view {
    const unsigned char *slots; /* slot l at slots + l * MF_EMU_SLOT_BYTES */
    uint32_t mask;              /* lanes that took part */
    uint32_t lane;              /* the caller's lane */
} mf_emu_simd_view;
void mf_emu_simd_sync(const void *val, unsigned size, mf_emu_simd_view *out,
                      const char *file, unsigned line);
void mf_emu_barrier(unsigned flags, const char *file, unsigned line);
void mf_emu_builtin3(int id, uint32_t out[3]);
/* A failed check inside a kernel (refused operation): fails the dispatch. */
void mf_emu_kernel_fail(const char *msg, const char *file, unsigned line);

#ifdef __cplusplus
}
#endif
#endif
