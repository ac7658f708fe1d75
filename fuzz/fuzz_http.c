/* fuzz_http.c - libFuzzer target for the HTTP request reader (tools/http.c).
 *
 * The input is what a peer sends: it is written into one end of a Unix
 * socket pair whose write side is then shut down, and mf_http_read_request
 * reads the other end under small limits. Every outcome must be one of the
 * documented ones: a request (method and path NUL-terminated inside their
 * arrays, a body of body_len bytes no larger than the cap), "nothing sent",
 * or an error status from the documented list with a one-line reason. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_INPUT (128 * 1024) /* fits the socket buffers: one write, no thread */
#define BODY_CAP 4096

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > MAX_INPUT)
        return 0;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
        abort();
    int buf = 2 * MAX_INPUT;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    size_t off = 0;
    while (off < size) {
        ssize_t w = send(sv[0], data + off, size - off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w <= 0)
            break; /* the buffer is full: the reader sees a shorter request */
        off += (size_t)w;
    }
    shutdown(sv[0], SHUT_WR);
    mf_http_limits lim = {.max_body = BODY_CAP, .timeout_ms = 2000, .stop = NULL};
    mf_http_request req;
    memset(&req, 0, sizeof req);
    int status = 0;
    char why[256];
    why[0] = 0;
    int rc = mf_http_read_request(sv[1], &lim, &req, &status, why, sizeof why);
    if (rc == 0) {
        if (!memchr(req.method, 0, sizeof req.method) || !memchr(req.path, 0, sizeof req.path))
            abort();
        if (req.body_len > BODY_CAP || (req.body_len && !req.body))
            abort();
        if (req.body_len)
            sink += (uint8_t)req.body[req.body_len - 1] + (uint8_t)req.body[req.body_len];
        mf_http_request_free(&req);
    } else if (rc == -1) {
        static const int ok[] = {400, 408, 411, 413, 414, 431, 501, 505};
        bool known = false;
        for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
            known |= status == ok[i];
        if (!known || !memchr(why, 0, sizeof why) || strchr(why, '\n'))
            abort();
    } else if (rc != 1) {
        abort();
    }
    close(sv[0]);
    close(sv[1]);
    return 0;
}
