/* membw.h - a memory read-bandwidth probe for `minfer bench --membw`.
 *
 * Decode on a CPU streams every weight once per token, so its ceiling is the
 * machine's read bandwidth; the probe measures that ceiling with the thread
 * count the benchmark uses, so "% of membw" compares like with like. */
#ifndef MF_TOOLS_MEMBW_H
#define MF_TOOLS_MEMBW_H

#include <stdint.h>

#include "base/base.h"

typedef struct mf_membw_result {
    double gbps;       /* best trial, 1e9 bytes per second */
    double gbps_mean;  /* mean over the trials */
    uint64_t bytes;    /* buffer size */
    int n_threads, passes, trials;
} mf_membw_result;

/* Allocates a buffer of `bytes` (rounded down to 4 KiB, at least 4 KiB),
 * fills it with a non-zero pattern (every page touched by the thread that
 * will read it), then, `trials` times, lets n_threads threads (<= 0: all
 * cores) sum their contiguous slices `passes` times and times the whole
 * trial. Returns 0 with *out filled, or -1 with err naming the size that
 * could not be allocated. The buffer is freed before returning, but its
 * pages count towards this process's peak RSS: run it in a child process
 * when the caller reports its own peak RSS. */
int mf_membw_measure(int n_threads, uint64_t bytes, int passes, int trials, mf_membw_result *out,
                     mf_error *err);

#endif
