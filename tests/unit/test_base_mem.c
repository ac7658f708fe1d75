/* test_base_mem.c - mf_mem_available_at over forged /proc and cgroup trees:
 * MemAvailable alone, a tighter cgroup v2 limit, "max" (no limit), a v1
 * limit, and nothing readable. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "mf_test.h"

static char root[256];

static void put(const char *rel, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s%s", root, rel);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void mk(const char *rel) {
    char p[512];
    snprintf(p, sizeof p, "%s%s", root, rel);
    mkdir(p, 0700);
}

MF_TEST(available_memory_takes_the_tightest_limit) {
    const char *dir = getenv("MINFER_TMP");
    snprintf(root, sizeof root, "%s/base_mem_%d", dir && *dir ? dir : "/tmp", (int)getpid());
    mkdir(root, 0700);
    uint64_t b = 0;
    const char *src = NULL;
    CHECK(mf_mem_available_at(root, &b, &src) == -1); /* nothing to read */
    mk("/proc");
    put("/proc/meminfo", "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    8000000 kB\n");
    CHECK(mf_mem_available_at(root, &b, &src) == 0);
    CHECK_EQ_INT((long long)b, 8000000ll * 1024);
    CHECK_STR_CONTAINS(src, "MemAvailable");
    mk("/sys");
    mk("/sys/fs");
    mk("/sys/fs/cgroup");
    put("/sys/fs/cgroup/memory.max", "max\n");
    put("/sys/fs/cgroup/memory.current", "1000\n");
    CHECK(mf_mem_available_at(root, &b, &src) == 0);
    CHECK_EQ_INT((long long)b, 8000000ll * 1024); /* "max": no limit */
    put("/sys/fs/cgroup/memory.max", "2147483648\n");
    put("/sys/fs/cgroup/memory.current", "1073741824\n");
    CHECK(mf_mem_available_at(root, &b, &src) == 0);
    CHECK_EQ_INT((long long)b, 1073741824ll);
    CHECK_STR_CONTAINS(src, "memory.max");
    put("/sys/fs/cgroup/memory.current", "3000000000\n"); /* over the limit: nothing left */
    CHECK(mf_mem_available_at(root, &b, &src) == 0);
    CHECK_EQ_INT((long long)b, 0);
    /* the real machine: some answer, and a positive one */
    CHECK(mf_mem_available(&b, &src) == 0 && b > 0);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
}

MF_TEST_MAIN(MF_T(available_memory_takes_the_tightest_limit))
