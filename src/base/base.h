/* base.h - the ground every module stands on: error values, logging,
 * fp16/bf16 conversion, environment levers, timers, a bounds-checked byte
 * cursor and the worker thread pool.
 *
 * Conventions used across minfer:
 *   - A fallible function returns int: 0 on success, -1 on failure, and fills
 *     the caller's mf_error with one line naming the thing and the numbers.
 *   - MF_ASSERT guards invariants of our own code (aborts with file:line); it
 *     is never used on untrusted input. */
#ifndef MF_BASE_H
#define MF_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- errors ------------------------------------------------------------- */

typedef struct mf_error {
    char msg[512];
} mf_error;

/* Formats the message into err (if non-NULL) and returns -1, so that
 * `return mf_errorf(err, "...", ...);` reads as one statement. */
int mf_errorf(mf_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes an existing message: "ctx: old message". Returns -1. */
int mf_error_prefix(mf_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define MF_ASSERT(cond)                                                              \
    do {                                                                             \
        if (!(cond))                                                                 \
            mf_panic(__FILE__, __LINE__, "assertion failed: %s", #cond);            \
    } while (0)

_Noreturn void mf_panic(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Allocation that cannot fail silently: aborts with the size on OOM. */
void *mf_malloc(size_t n);
void *mf_calloc(size_t n, size_t size);
void *mf_realloc(void *p, size_t n);
char *mf_strdup(const char *s);

/* ---- file-derived text in messages ---------------------------------------- */

/* Bytes of s[0..n) that form valid UTF-8 from the start (n when all do). */
size_t mf_utf8_valid_len(const char *s, size_t n);

/* Writes s[0..n) into buf[0..cap) as one printable line: valid UTF-8 text is
 * kept, while control bytes (newline, ESC, ...), DEL, C1 controls, backslash
 * and bytes that are not valid UTF-8 become \xNN (backslash: \\). A string
 * longer than fits ends in "...". Returns buf (always NUL-terminated when
 * cap > 0), so a call can be an argument of printf. Every string that comes
 * from a file or a peer goes through this before it reaches a message. */
const char *mf_escape(const void *s, size_t n, char *buf, size_t cap);
/* mf_escape into a compound-literal buffer (MF_ESC: a NUL-terminated string;
 * MF_ESCN: n bytes), valid until the end of the enclosing block. */
#define MF_ESC_CAP 200
#define MF_ESC(s) mf_escape((s), strlen(s), (char[MF_ESC_CAP]){0}, MF_ESC_CAP)
#define MF_ESCN(s, n) mf_escape((s), (n), (char[MF_ESC_CAP]){0}, MF_ESC_CAP)

/* ---- overflow-safe arithmetic -------------------------------------------- */

/* Return false (and leave *out unspecified) when the result does not fit. */
static inline bool mf_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool mf_add_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

/* ---- logging ------------------------------------------------------------ */

typedef enum { MF_LOG_DEBUG, MF_LOG_INFO, MF_LOG_WARN, MF_LOG_ERROR } mf_log_level;

/* Writes one line to stderr when level >= the current level: the one set
 * with mf_log_set_level, else the default (warn; the runtime sets it from
 * MINFER_LOG once at start). Base reads no environment. */
void mf_log(mf_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void mf_log_set_level(mf_log_level level);
void mf_log_set_default_level(mf_log_level level);
mf_log_level mf_log_get_level(void);

/* ---- fp16 / bf16 -------------------------------------------------------- */

typedef uint16_t mf_fp16; /* IEEE 754 binary16 bits */
typedef uint16_t mf_bf16; /* bfloat16 bits */

float mf_fp16_to_fp32(mf_fp16 h);
mf_fp16 mf_fp32_to_fp16(float f); /* round to nearest even, overflow to inf */
static inline float mf_bf16_to_fp32(mf_bf16 h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}
mf_bf16 mf_fp32_to_bf16(float f); /* round to nearest even; NaN stays NaN */

/* ---- memory --------------------------------------------------------------- */

/* Bytes this process may still allocate: MemAvailable, lowered by a cgroup
 * (v2 or v1) limit minus its usage. 0 with *bytes and *source (which limit
 * applied, for messages) set; -1 when neither can be read. The _at form
 * reads the same files under root (tests). */
int mf_mem_available(uint64_t *bytes, const char **source);
int mf_mem_available_at(const char *root, uint64_t *bytes, const char **source);

/* ---- time ---------------------------------------------------------------- */

uint64_t mf_time_ns(void); /* monotonic clock */

/* ---- bounds-checked cursor for untrusted bytes ---------------------------- */

/* A read cursor over [buf, buf+size). The first failed read sets err (sticky)
 * and every later read returns zeros, so a parser checks once per record. */
typedef struct mf_cursor {
    const uint8_t *buf;
    uint64_t size;
    uint64_t pos;
    bool failed;
} mf_cursor;

static inline bool mf_cursor_can(const mf_cursor *c, uint64_t n) {
    return !c->failed && !(n > c->size || c->pos > c->size - n);
}

/* ---- thread pool ----------------------------------------------------------- */

/* A fixed set of worker threads that run one parallel-for at a time. Workers
 * spin briefly before sleeping on a condition variable, so back-to-back
 * matmuls of one forward pay little wake-up latency. */
typedef struct mf_pool mf_pool;

/* fn(ctx, ith, nth): ith in [0, nth) is the calling thread's index. */
typedef void (*mf_pool_fn)(void *ctx, int ith, int nth);

mf_pool *mf_pool_new(int n_threads); /* n_threads <= 0: number of cores */
/* How long a worker spins for the next job before it sleeps, for pools made
 * from now on (default 50 us; <= 0: sleep at once). */
void mf_pool_set_spin_us(long us);
void mf_pool_free(mf_pool *pool);
int mf_pool_size(const mf_pool *pool);
/* Runs fn on all threads (the caller is thread 0) and returns when all are done. */
void mf_pool_run(mf_pool *pool, mf_pool_fn fn, void *ctx);
int mf_cpu_count(void);

#endif
