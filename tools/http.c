/* http.c - one bounded HTTP/1.1 request in, one response out (see http.h). */
#include "http.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"

const char *mf_http_reason(int status) {
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    }
    return "Unknown";
}

int mf_http_send_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1; /* gone, reset, or the send timeout passed */
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int mf_http_respond(int fd, int status, const char *content_type, const char *extra_headers,
                    const char *body, size_t n) {
    return mf_http_respond_ka(fd, status, content_type, extra_headers, body, n, false);
}

int mf_http_respond_ka(int fd, int status, const char *content_type, const char *extra_headers,
                       const char *body, size_t n, bool keep_alive) {
    char head[512];
    int k = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
                     "Connection: %s\r\n\r\n",
                     status, mf_http_reason(status), content_type, n,
                     extra_headers ? extra_headers : "", keep_alive ? "keep-alive" : "close");
    if (k < 0 || (size_t)k >= sizeof head)
        return -1;
    if (mf_http_send_all(fd, head, (size_t)k))
        return -1;
    return n ? mf_http_send_all(fd, body, n) : 0;
}

int mf_http_start_events(int fd) {
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                               "Cache-Control: no-cache\r\nConnection: close\r\n\r\n";
    return mf_http_send_all(fd, head, sizeof head - 1);
}

/* Waits until fd is readable: 1 readable, 0 the deadline passed or stop was
 * raised, -1 a poll error. Polls in short slices so stop is seen promptly. */
static int wait_readable(int fd, uint64_t deadline_ns, volatile sig_atomic_t *stop) {
    for (;;) {
        uint64_t now = mf_time_ns();
        if (now >= deadline_ns || (stop && *stop))
            return 0;
        uint64_t left_ms = (deadline_ns - now) / 1000000 + 1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, left_ms < 200 ? (int)left_ms : 200);
        if (r > 0)
            return 1;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

void mf_http_close(int fd, bool drain) {
    if (drain) {
        shutdown(fd, SHUT_WR);
        char buf[16384];
        size_t total = 0;
        uint64_t deadline = mf_time_ns() + 2000ull * 1000000;
        while (total < (8u << 20) && wait_readable(fd, deadline, NULL) == 1) {
            ssize_t k = recv(fd, buf, sizeof buf, 0);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                break;
            total += (size_t)k;
        }
    }
    close(fd);
}

void mf_http_request_free(mf_http_request *req) {
    free(req->body);
    req->body = NULL;
    req->body_len = 0;
}

/* ---- request parsing ----------------------------------------------------------- */

typedef struct req_error {
    int *status;
    char *why;
    size_t cap;
} req_error;

static int reject(const req_error *e, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int reject(const req_error *e, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->why, e->cap, fmt, ap);
    va_end(ap);
    *e->status = status;
    return -1;
}

static bool is_tchar(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* The request line "METHOD SP TARGET SP HTTP/1.x" in line[0..n). */
static int parse_request_line(const char *line, size_t n, mf_http_request *req,
                              const req_error *e) {
    size_t i = 0, m = 0;
    while (i < n && line[i] >= 'A' && line[i] <= 'Z')
        i++;
    if (i == 0 || i >= sizeof req->method || i >= n || line[i] != ' ')
        return reject(e, 400, "malformed request line (expected 'METHOD /path HTTP/1.1')");
    memcpy(req->method, line, i);
    req->method[i] = 0;
    size_t t0 = ++i;
    while (i < n && (unsigned char)line[i] > 0x20 && (unsigned char)line[i] < 0x7f)
        i++;
    size_t tlen = i - t0;
    if (tlen == 0 || i >= n || line[i] != ' ')
        return reject(e, 400, "malformed request line (expected 'METHOD /path HTTP/1.1')");
    const char *target = line + t0;
    if (target[0] != '/')
        return reject(e, 400, "request target must start with '/'");
    while (m < tlen && target[m] != '?' && target[m] != '#')
        m++;
    if (m >= sizeof req->path)
        return reject(e, 414, "request path of %zu bytes exceeds %zu", m, sizeof req->path - 1);
    memcpy(req->path, target, m);
    req->path[m] = 0;
    const char *ver = line + i + 1;
    size_t vlen = n - i - 1;
    if (vlen == 8 && (!memcmp(ver, "HTTP/1.1", 8) || !memcmp(ver, "HTTP/1.0", 8)))
        return 0;
    if (vlen >= 5 && !memcmp(ver, "HTTP/", 5))
        return reject(e, 505, "HTTP version '%.*s' is not supported (1.0, 1.1 are)",
                      (int)(vlen > 16 ? 16 : vlen), ver);
    return reject(e, 400, "malformed request line (expected 'METHOD /path HTTP/1.1')");
}

typedef struct head_info {
    long long content_length; /* -1: absent */
    bool expect_continue;
    bool chunked;
    int connection;           /* 0 absent, 1 "close", 2 "keep-alive" */
} head_info;

/* The header lines in h[0..n) (each ending in LF, CR optional). */
static int parse_headers(const char *h, size_t n, const mf_http_limits *lim, head_info *hi,
                         const req_error *e) {
    size_t i = 0;
    while (i < n) {
        size_t end = i;
        while (end < n && h[end] != '\n')
            end++;
        size_t len = end - i;
        if (len && h[i + len - 1] == '\r')
            len--;
        const char *line = h + i;
        i = end + 1;
        if (len == 0)
            break; /* the blank line ending the head */
        if (line[0] == ' ' || line[0] == '\t')
            return reject(e, 400, "obsolete header line folding is not accepted");
        size_t k = 0;
        while (k < len && is_tchar((unsigned char)line[k]))
            k++;
        if (k == 0 || k >= len || line[k] != ':')
            return reject(e, 400, "malformed header line '%.*s'", (int)(len > 60 ? 60 : len),
                          line);
        size_t v = k + 1, ve = len;
        while (v < ve && (line[v] == ' ' || line[v] == '\t'))
            v++;
        while (ve > v && (line[ve - 1] == ' ' || line[ve - 1] == '\t'))
            ve--;
        const char *val = line + v;
        size_t vl = ve - v;
        if (k == 14 && !strncasecmp(line, "Content-Length", 14)) {
            long long cl = 0;
            if (vl == 0 || vl > 18)
                return reject(e, 400, "bad Content-Length '%.*s'", (int)(vl > 30 ? 30 : vl),
                              val);
            for (size_t j = 0; j < vl; j++) {
                if (val[j] < '0' || val[j] > '9')
                    return reject(e, 400, "bad Content-Length '%.*s'",
                                  (int)(vl > 30 ? 30 : vl), val);
                cl = cl * 10 + (val[j] - '0');
            }
            if (hi->content_length >= 0 && hi->content_length != cl)
                return reject(e, 400, "two Content-Length headers disagree (%lld, %lld)",
                              hi->content_length, cl);
            hi->content_length = cl;
        } else if (k == 17 && !strncasecmp(line, "Transfer-Encoding", 17)) {
            hi->chunked = true;
        } else if (k == 10 && !strncasecmp(line, "Connection", 10)) {
            if (vl == 5 && !strncasecmp(val, "close", 5))
                hi->connection = 1;
            else if (vl == 10 && !strncasecmp(val, "keep-alive", 10))
                hi->connection = 2;
        } else if (k == 6 && !strncasecmp(line, "Expect", 6)) {
            hi->expect_continue = vl == 12 && !strncasecmp(val, "100-continue", 12);
        }
    }
    if (hi->chunked)
        return reject(e, 501, "Transfer-Encoding is not supported (send a Content-Length)");
    if (hi->content_length > (long long)lim->max_body)
        return reject(e, 413, "request body of %lld bytes exceeds the limit of %zu bytes",
                      hi->content_length, lim->max_body);
    return 0;
}

int mf_http_read_request(int fd, const mf_http_limits *lim, mf_http_request *req, int *status,
                         char *why, size_t why_cap) {
    const req_error e = {status, why, why_cap};
    memset(req, 0, sizeof *req);
    /* idle until the first byte, then the whole request within timeout_ms */
    const int idle = lim->idle_ms > 0 ? lim->idle_ms : lim->timeout_ms;
    uint64_t deadline = mf_time_ns() + (uint64_t)idle * 1000000;
    char *head = mf_malloc(MF_HTTP_MAX_HEAD);
    size_t n = 0, head_end = 0, scan = 0;
    int rc = -1;
    /* The head: up to the first empty line. */
    while (!head_end) {
        if (n == MF_HTTP_MAX_HEAD) {
            reject(&e, 431, "request line and headers exceed %d bytes", MF_HTTP_MAX_HEAD);
            goto out;
        }
        int w = wait_readable(fd, deadline, lim->stop);
        if (w <= 0) {
            if (n == 0)
                rc = 1;
            else
                reject(&e, 408, "the request head did not arrive within %d ms", lim->timeout_ms);
            goto out;
        }
        ssize_t k = recv(fd, head + n, MF_HTTP_MAX_HEAD - n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (k <= 0) {
            if (n == 0)
                rc = 1;
            else
                reject(&e, 400, "connection closed inside the request head (%zu bytes)", n);
            goto out;
        }
        if (n == 0)
            deadline = mf_time_ns() + (uint64_t)lim->timeout_ms * 1000000;
        n += (size_t)k;
        for (; scan < n; scan++) {
            if (head[scan] == 0) {
                reject(&e, 400, "NUL byte in the request head at byte %zu", scan);
                goto out;
            }
            if (head[scan] != '\n')
                continue;
            if (scan + 1 < n && head[scan + 1] == '\n') {
                head_end = scan + 2;
                break;
            }
            if (scan + 2 < n && head[scan + 1] == '\r' && head[scan + 2] == '\n') {
                head_end = scan + 3;
                break;
            }
            if (scan + 2 >= n)
                break; /* the blank line may be completed by the next read */
        }
    }
    size_t line_end = 0;
    while (head[line_end] != '\n')
        line_end++;
    size_t ll = line_end && head[line_end - 1] == '\r' ? line_end - 1 : line_end;
    if (parse_request_line(head, ll, req, &e))
        goto out;
    head_info hi = {.content_length = -1};
    if (parse_headers(head + line_end + 1, head_end - line_end - 1, lim, &hi, &e))
        goto out;
    if (hi.content_length < 0 && !strcmp(req->method, "POST")) {
        reject(&e, 411, "a POST needs a Content-Length header");
        goto out;
    }
    size_t cl = hi.content_length > 0 ? (size_t)hi.content_length : 0;
    {
        const bool v11 = ll >= 8 && !memcmp(head + ll - 8, "HTTP/1.1", 8);
        /* bytes past this request: a pipelining client, answered once then closed */
        req->keep_alive = (v11 ? hi.connection != 1 : hi.connection == 2) && n - head_end <= cl;
    }
    if (cl == 0) {
        rc = 0;
        goto out;
    }
    /* The body: what came with the head, then the rest. */
    req->body = mf_malloc(cl + 1);
    size_t have = n - head_end < cl ? n - head_end : cl;
    memcpy(req->body, head + head_end, have);
    if (have < cl && hi.expect_continue) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        if (mf_http_send_all(fd, cont, sizeof cont - 1)) {
            reject(&e, 400, "peer gone before sending the body");
            goto out;
        }
    }
    while (have < cl) {
        int w = wait_readable(fd, deadline, lim->stop);
        if (w <= 0) {
            reject(&e, 408, "%zu of %zu body bytes arrived within %d ms", have, cl,
                   lim->timeout_ms);
            goto out;
        }
        ssize_t k = recv(fd, req->body + have, cl - have, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (k <= 0) {
            reject(&e, 400, "connection closed after %zu of %zu body bytes", have, cl);
            goto out;
        }
        have += (size_t)k;
    }
    req->body[cl] = 0;
    req->body_len = cl;
    rc = 0;
out:
    free(head);
    if (rc != 0)
        mf_http_request_free(req);
    return rc;
}
