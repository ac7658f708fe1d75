/* mem.c - how much memory this process may still take: the kernel's
 * MemAvailable estimate, lowered by the cgroup limit the process runs under
 * (v2 memory.max - memory.current, or v1 limit_in_bytes - usage_in_bytes).
 * Total RAM says nothing about a box that is half full or a container
 * capped at 2 GiB; an allocation larger than this meets the OOM killer. */
#include "base/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The first unsigned number in file root+rel, or -1 when it cannot be read
 * or holds none ("max"). */
static int read_u64(const char *root, const char *rel, uint64_t *out) {
    char p[512];
    snprintf(p, sizeof p, "%s%s", root, rel);
    FILE *f = fopen(p, "r");
    if (!f)
        return -1;
    unsigned long long v;
    int ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    if (!ok)
        return -1;
    *out = v;
    return 0;
}

static int meminfo_available(const char *root, uint64_t *out) {
    char p[512], line[256];
    snprintf(p, sizeof p, "%s/proc/meminfo", root);
    FILE *f = fopen(p, "r");
    if (!f)
        return -1;
    int rc = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
            *out = kb * 1024ull;
            rc = 0;
            break;
        }
    }
    fclose(f);
    return rc;
}

int mf_mem_available_at(const char *root, uint64_t *bytes, const char **source) {
    uint64_t best = UINT64_MAX, v;
    const char *src = NULL;
    if (meminfo_available(root, &v) == 0)
        best = v, src = "MemAvailable in /proc/meminfo";
    static const char *const lim[2][2] = {
        {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
        {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"},
    };
    for (int i = 0; i < 2; i++) {
        uint64_t max, cur;
        if (read_u64(root, lim[i][0], &max) || read_u64(root, lim[i][1], &cur))
            continue;
        if (max >= (1ull << 62)) /* v1 "no limit" is a huge page-rounded number */
            continue;
        uint64_t left = max > cur ? max - cur : 0;
        if (left < best)
            best = left, src = i == 0 ? "the cgroup's memory.max" : "the cgroup's memory.limit_in_bytes";
        break;
    }
    if (!src)
        return -1;
    *bytes = best;
    if (source)
        *source = src;
    return 0;
}

int mf_mem_available(uint64_t *bytes, const char **source) {
    return mf_mem_available_at("", bytes, source);
}
