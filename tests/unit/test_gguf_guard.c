/* test_gguf_guard.c - a model file truncated while mapped.
 *
 * The policy (gguf_guard.c): a read of a mapped model page that the file no
 * longer backs ends the process with one line naming the file and exit
 * status MF_GGUF_SIGBUS_EXIT; with MINFER_NO_MMAP=1 the file is copied at
 * open and a truncation changes nothing. Each case runs in a child process
 * that opens the file, truncates it under the open mf_gguf and reads the
 * last tensor byte; the parent checks how the child ended and what it said. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "mf_test.h"
#include "quant/quant.h"

#define NEL (1 << 16) /* a 256 KiB f32 tensor: many pages past the cut */

static char path[512];

static int write_file(void) {
    const char *dir = getenv("MINFER_TMP");
    snprintf(path, sizeof path, "%s/gguf_guard_%d.gguf", dir && *dir ? dir : "/tmp", (int)getpid());
    mf_gguf_writer *w = mf_gguf_writer_new();
    mf_error err;
    int64_t ne[1] = {NEL};
    float *x = malloc(NEL * sizeof *x);
    for (int i = 0; i < NEL; i++)
        x[i] = (float)i;
    int rc = mf_gguf_writer_add_tensor(w, "t", MF_TYPE_F32, 1, ne, &err) < 0 ||
             mf_gguf_writer_begin(w, path, &err) || mf_gguf_writer_write(w, x, NEL * sizeof *x, &err) ||
             mf_gguf_writer_finish(w, &err);
    if (rc)
        fprintf(stderr, "  write: %s\n", err.msg);
    mf_gguf_writer_free(w);
    free(x);
    return rc ? -1 : 0;
}

/* Runs the truncate-then-read child; returns its wait status and what it
 * wrote to stderr in msg. In the child, exit 0 means the read returned the
 * value written. */
static int run_child(bool copy, char *msg, size_t cap) {
    int fds[2];
    if (pipe(fds))
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        const mf_gguf_open_options o = {.read = copy};
        mf_gguf *g = NULL;
        mf_error err;
        if (mf_gguf_open_opts(path, &o, &g, &err)) {
            fprintf(stderr, "open: %s\n", err.msg);
            _exit(2);
        }
        const mf_gguf_tensor *t = mf_gguf_find_tensor(g, "t");
        if (truncate(path, 4096))
            _exit(3);
        volatile const float *v = t->data;
        float last = v[NEL - 1];
        _exit(last == (float)(NEL - 1) ? 0 : 4);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fds[0], msg + n, cap - 1 - n)) > 0)
        n += (size_t)r;
    msg[n] = 0;
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

MF_TEST(truncated_mapping_fails_with_a_message) {
    CHECK(write_file() == 0);
    char msg[1024];
    int st = run_child(false, msg, sizeof msg);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == MF_GGUF_SIGBUS_EXIT,
              "child ended with status 0x%x: %s", st, msg);
    CHECK_STR_CONTAINS(msg, "minfer: fatal: model file '");
    CHECK_STR_CONTAINS(msg, "' was truncated or replaced while in use");
    CHECK_STR_CONTAINS(msg, "MINFER_NO_MMAP=1");
    CHECK_MSG(strchr(msg, '\n') == msg + strlen(msg) - 1, "not one line: %s", msg);
    unlink(path);
}

MF_TEST(load_copy_survives_truncation) {
    CHECK(write_file() == 0);
    char msg[1024];
    int st = run_child(true, msg, sizeof msg);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child ended with status 0x%x: %s", st, msg);
    unlink(path);
}

MF_TEST_MAIN(MF_T(truncated_mapping_fails_with_a_message), MF_T(load_copy_survives_truncation))
