/* http.h - the minimal HTTP/1.1 server side `minfer serve` needs: read a
 * request from a connected socket, write a response, keep the connection for
 * the next request or close it.
 *
 * Keep-alive: a connection carries requests one after another (HTTP/1.1
 * unless "Connection: close"; HTTP/1.0 with "Connection: keep-alive"); a
 * client that sends its next request before the answer (pipelining) gets
 * its first answer and a close. The reader is bounded: the request line and
 * headers fit in MF_HTTP_MAX_HEAD bytes, the body in the caller's cap, and the
 * whole request arrives before a deadline; a body needs Content-Length
 * (chunked uploads are refused). A bad request comes back as an HTTP status
 * and one line saying why, for the caller to send as an error body. */
#ifndef MF_TOOLS_HTTP_H
#define MF_TOOLS_HTTP_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#define MF_HTTP_MAX_HEAD (16 * 1024)

typedef struct mf_http_request {
    char method[16];       /* "GET", "POST", ... */
    char path[1024];       /* the target without its "?query" */
    char *body;            /* malloc'd, NUL-terminated (may hold NULs); NULL when empty */
    size_t body_len;
    bool keep_alive;       /* the client may send another request on this connection */
} mf_http_request;

typedef struct mf_http_limits {
    size_t max_body;       /* larger Content-Length: 413 */
    int timeout_ms;        /* the whole request must arrive within this of its first byte */
    int idle_ms;           /* wait for a first byte this long (0: timeout_ms) */
    volatile sig_atomic_t *stop; /* when it becomes non-zero, reading gives up (may be NULL) */
} mf_http_limits;

/* Reads one request from fd. Returns 0 with *req filled (free the body with
 * mf_http_request_free), 1 when the peer sent nothing at all (closed or timed
 * out before a byte: no response is due), or -1 with *status (400, 408, 411,
 * 413, 414, 431, 501, 505) and why[0..why_cap) describing the problem. */
int mf_http_read_request(int fd, const mf_http_limits *lim, mf_http_request *req, int *status,
                         char *why, size_t why_cap);
void mf_http_request_free(mf_http_request *req);

/* Writes all of buf; returns 0, or -1 when the peer is gone or stopped
 * reading (a send timeout set on fd bounds the wait). Never raises SIGPIPE. */
int mf_http_send_all(int fd, const void *buf, size_t n);

/* Sends a complete response with Content-Length and "Connection: close".
 * extra_headers is NULL or CRLF-terminated header lines ("Allow: GET\r\n"). */
int mf_http_respond(int fd, int status, const char *content_type, const char *extra_headers,
                    const char *body, size_t n);

/* mf_http_respond with "Connection: keep-alive" when keep_alive. */
int mf_http_respond_ka(int fd, int status, const char *content_type, const char *extra_headers,
                       const char *body, size_t n, bool keep_alive);

/* Sends the head of a Server-Sent Events response; the body follows as
 * "data: ...\n\n" events and ends when the connection closes. */
int mf_http_start_events(int fd);

/* The reason phrase of a status code ("Not Found"); "Unknown" if unlisted. */
const char *mf_http_reason(int status);

/* Closes fd after a response. With drain (the request was not read whole),
 * first reads and discards what the peer still sends, bounded in bytes and
 * time, so that the unread rest of a request does not turn the close into a
 * reset that destroys the response before the peer reads it. */
void mf_http_close(int fd, bool drain);

#endif
