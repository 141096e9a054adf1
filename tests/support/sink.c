/*
 * hub-sink — a recording HTTP test sink for the delivery integration tests.
 *
 *   hub-sink --listen 127.0.0.1:0 --record FILE [--port-file FILE]
 *
 * Serves HTTP/1.x (keep-alive) and cleartext HTTP/2 (prior knowledge or
 * Upgrade: h2c) through h2o on libuv.  Every request except /_count is first
 * appended to the record file as one compact JSON line, keys always in this
 * order (tests grep it; tests/support/sink.sh relies on the order):
 *
 *   {"ts_ms":..,"method":"POST","path":"/ok/a","query":null|"..",
 *    "headers":{"lower-case-name":"value, value",..},"body_b64":"..",
 *    "body_len":N,"http_version":"1.0"|"1.1"|"2"}
 *
 * and then answered according to its path (see route() and sink.md): /ok,
 * /status/C, /retry-after/C/S, /gone, /slow/MS, /hang, /echo, /echo-after/N,
 * /flaky/N, /fail-until/MS, /redirect, /big, /big-chunked, /garbage, /reset, /close,
 * /_count.  Anything after a recognised prefix is ignored, so one sink serves
 * many subscriptions (/ok/tenant-a, /status/503/sub-1, ...).
 *
 * The address actually bound ("127.0.0.1:PORT") goes to stdout and, written
 * atomically, to --port-file.  SIGUSR1: /slow/MS answers at once from then
 * on (a test's backlog drains after its timed part).  SIGTERM/SIGINT: stop listening, end every
 * connection, dispose of h2o, exit 0.  Exit status 2 on bad usage or set-up
 * errors, 1 when the connections did not close within the grace period.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <h2o.h>
#include <h2o/socket/uv-binding.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <uv.h>

#define SINK_BACKLOG 1024
#define SINK_ADDR_MAX 64
/* Bodies larger than this are refused by h2o itself (413, not recorded). */
#define SINK_MAX_REQUEST_BODY ((size_t)64 << 20)
#define SINK_BIG_BYTES ((size_t)64 << 20)
#define SINK_BIG_CHUNK ((size_t)64 << 10)
#define SINK_MAX_DELAY_MS (24ULL * 3600 * 1000)
#define SINK_MAX_FLAKY 1000000000ULL
#define SINK_MAX_ECHO_AFTER ((uint64_t)1 << 20) /* /echo-after/<n>: n at most 1 MiB */
#define SINK_HANG_CHECK_MS 200
#define SINK_STOP_GRACE_MS 5000

/* Sent raw on the socket for /garbage: a broken HTTP/1.1 status line (so no
 * client can take it for an HTTP/0.9 body either) and, read as an HTTP/2
 * frame header, a frame far over the 16 KiB default size limit. */
static const char SINK_GARBAGE[] = "HTTP/1.1 2x0 \x01garbage\r\n\r\n";

struct sink;

/* One accepted connection.  tcp comes first: h2o's close callback hands us
 * the uv handle, which is then also the connection. */
struct sink_conn {
    uv_tcp_t tcp;
    struct sink *sink;
    struct sockaddr_storage peer; /* to find the socket behind a request */
    int has_peer;
    struct sink_conn *prev;
    struct sink_conn *next;
};

enum sink_pending_kind {
    SINK_PENDING_SLOW, /* answered by the timer */
    SINK_PENDING_HANG  /* never answered while the client is there */
};

/*
 * A request answered later (/slow, /hang).  Owned by the sink (malloc), not
 * by the request: its uv_timer_t must outlive the request's pool until the
 * close callback.  `slot` lives in the request's pool and points back here;
 * h2o's dispose of the pool (client gone, connection closed) detaches it.
 */
struct sink_pending {
    uv_timer_t timer; /* first: the close callback frees the whole struct */
    struct sink *sink;
    h2o_req_t *req;             /* NULL once detached */
    struct sink_pending **slot; /* in req->pool; NULL once detached */
    enum sink_pending_kind kind;
    struct sink_pending *prev;
    struct sink_pending *next;
};

/* /flaky/<n>: requests seen so far for one exact path. */
struct sink_flaky {
    struct sink_flaky *next;
    unsigned long long seen;
    size_t len;
    char path[];
};

/* h2o calls on_req with the h2o_handler_t; ours sits first to reach the sink. */
struct sink_handler {
    h2o_handler_t super;
    struct sink *sink;
};

/* /big: pushes SINK_BIG_CHUNK at a time from the shared filler. */
struct sink_big {
    h2o_generator_t super;
    const char *filler; /* borrowed from the sink */
    size_t left;
};

/* The one context, owned by main(). */
struct sink {
    uv_loop_t loop;
    h2o_globalconf_t config;
    h2o_context_t ctx;
    h2o_accept_ctx_t accept_ctx;
    uv_tcp_t listener;
    uv_signal_t sigterm;
    uv_signal_t sigint;
    uv_signal_t sigusr1;
    uv_timer_t hang_check;
    uv_timer_t stop_deadline;
    int record_fd;
    const char *record_path;
    uint64_t n_recorded;
    struct sink_conn *conns;
    size_t n_conns;
    struct sink_pending *pending;
    struct sink_flaky *flaky;
    char *filler; /* SINK_BIG_CHUNK bytes of 'x', immutable once filled */
    int slow_off; /* SIGUSR1 came: /slow/MS answers at once */
    int stopping;
    int listener_closed;
    int disposed;
    int exit_status;
    char bound[SINK_ADDR_MAX];
};

static void sink_maybe_finish(struct sink *s);

/* ------------------------------------------------------------ helpers -- */

static int64_t now_unix_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int has_prefix(h2o_iovec_t s, const char *prefix) {
    size_t n = strlen(prefix);
    return s.len >= n && memcmp(s.base, prefix, n) == 0;
}

/*
 * The path segment starting at `off`: up to the next '/' or the end.  Sets
 * *end to the index after it.
 */
static h2o_iovec_t segment_at(h2o_iovec_t path, size_t off, size_t *end) {
    size_t i = off;
    while (i < path.len && path.base[i] != '/') {
        i++;
    }
    *end = i;
    return h2o_iovec_init(path.base + off, i - off);
}

/* Decimal without sign or spaces, <= max.  0 on success, -1 otherwise. */
static int parse_u64(h2o_iovec_t seg, uint64_t max, uint64_t *out) {
    uint64_t v = 0;
    if (seg.len == 0 || seg.len > 20) {
        return -1;
    }
    for (size_t i = 0; i < seg.len; i++) {
        unsigned d = (unsigned char)seg.base[i] - '0';
        if (d > 9 || v > (UINT64_MAX - d) / 10) {
            return -1;
        }
        v = v * 10 + d;
    }
    if (v > max) {
        return -1;
    }
    *out = v;
    return 0;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

/*
 * Percent-decodes seg into the request's pool.  Returns {NULL, 0} when the
 * result would be empty or hold a control character (it becomes a header
 * value, so CR/LF must never get through).
 */
static h2o_iovec_t percent_decode(h2o_mem_pool_t *pool, h2o_iovec_t seg) {
    char *out = h2o_mem_alloc_pool(pool, seg.len + 1);
    size_t n = 0;
    for (size_t i = 0; i < seg.len; i++) {
        int c = (unsigned char)seg.base[i];
        if (c == '%' && i + 2 < seg.len) {
            int hi = hex_value(seg.base[i + 1]);
            int lo = hex_value(seg.base[i + 2]);
            if (hi >= 0 && lo >= 0) {
                c = hi * 16 + lo;
                i += 2;
            }
        }
        if (c < 0x20 || c == 0x7f) {
            return h2o_iovec_init(NULL, 0);
        }
        out[n++] = (char)c;
    }
    if (n == 0) {
        return h2o_iovec_init(NULL, 0);
    }
    out[n] = '\0';
    return h2o_iovec_init(out, n);
}

static const char *reason_phrase(int status) {
    switch (status) {
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 202:
        return "Accepted";
    case 204:
        return "No Content";
    case 301:
        return "Moved Permanently";
    case 302:
        return "Found";
    case 303:
        return "See Other";
    case 304:
        return "Not Modified";
    case 307:
        return "Temporary Redirect";
    case 308:
        return "Permanent Redirect";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 409:
        return "Conflict";
    case 410:
        return "Gone";
    case 413:
        return "Content Too Large";
    case 415:
        return "Unsupported Media Type";
    case 422:
        return "Unprocessable Content";
    case 429:
        return "Too Many Requests";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    default:
        break;
    }
    if (status < 300) {
        return "Success";
    }
    if (status < 400) {
        return "Redirection";
    }
    if (status < 500) {
        return "Client Error";
    }
    return "Server Error";
}

/*
 * Answers req with status and a text body (copied), with a Content-Length:
 * h2o 2.2 closes an HTTP/1.1 connection after a non-200 response of unknown
 * length, and keep-alive is what the hub should see.  204 and 304 never carry
 * a body; h2o drops the body of a HEAD response itself.
 */
static void respond(h2o_req_t *req, int status, const char *body) {
    req->res.status = status;
    req->res.reason = reason_phrase(status);
    if (status == 204 || status == 304) {
        h2o_send_inline(req, "", 0);
        return;
    }
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL,
                   H2O_STRLIT("text/plain; charset=utf-8"));
    req->res.content_length = strlen(body);
    h2o_send_inline(req, body, strlen(body));
}

/* ---------------------------------------------------------- recording -- */

/*
 * A JSON string of the bytes p[0..n): as they are when they are UTF-8, else
 * read as Latin-1 (so an odd header byte never breaks the record line).
 * Returns owned, or NULL on OOM.
 */
static json_t *json_bytes(const char *p, size_t n) {
    json_t *s = json_stringn(p, n);
    char *u;
    size_t k = 0;

    if (s != NULL) {
        return s;
    }
    u = malloc(n * 2 + 1);
    if (u == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c < 0x80) {
            u[k++] = (char)c;
        } else {
            u[k++] = (char)(0xc0 | (c >> 6));
            u[k++] = (char)(0x80 | (c & 0x3f));
        }
    }
    s = json_stringn(u, k);
    free(u);
    return s;
}

/*
 * {"lower-case name": "value", ...} in arrival order; a repeated name keeps
 * its first position and gets ", " + the next value.  HTTP/2 carries the host
 * as :authority, HTTP/1 may leave it out of the header list: "host" is then
 * added from the authority so records look the same in both versions.
 */
static json_t *record_headers(h2o_req_t *req) {
    json_t *h = json_object();
    int has_host = 0;

    if (h == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < req->headers.size; i++) {
        const h2o_header_t *e = req->headers.entries + i;
        char *name = malloc(e->name->len + 1);
        json_t *v, *old;

        if (name == NULL) {
            continue;
        }
        for (size_t j = 0; j < e->name->len; j++) {
            name[j] = (char)h2o_tolower(e->name->base[j]);
        }
        name[e->name->len] = '\0';
        if (strcmp(name, "host") == 0) {
            has_host = 1;
        }
        v = json_bytes(e->value.base, e->value.len);
        old = json_object_get(h, name);
        if (v != NULL && old != NULL) {
            size_t a = json_string_length(old), b = json_string_length(v);
            char *joined = malloc(a + 2 + b);
            if (joined != NULL) {
                memcpy(joined, json_string_value(old), a);
                memcpy(joined + a, ", ", 2);
                memcpy(joined + a + 2, json_string_value(v), b);
                json_decref(v);
                v = json_stringn(joined, a + 2 + b);
                free(joined);
            }
        }
        /* json_object_set_new takes v even when it fails (NULL name, ...). */
        json_object_set_new(h, name, v);
        free(name);
    }
    if (!has_host && req->input.authority.len > 0) {
        json_object_set_new(h, "host",
                            json_bytes(req->input.authority.base, req->input.authority.len));
    }
    return h;
}

static const char *version_text(int version) {
    if (version >= 0x200) {
        return "2";
    }
    return version == 0x100 ? "1.0" : "1.1";
}

/* write(2) until everything is out (a regular file: partial writes only on
 * errors such as ENOSPC).  0 or -1. */
static int write_all(int fd, struct iovec *iov, int iovcnt) {
    while (iovcnt > 0) {
        ssize_t w = writev(fd, iov, iovcnt);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1;
        }
        while (iovcnt > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            iovcnt--;
        }
        if (iovcnt > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

/*
 * Appends the record line of req (received at ts_ms) to the record file in
 * one writev on an O_APPEND descriptor, so a reader never sees half a line
 * and the line is on disk (page cache) before the response is decided.
 */
static void record_request(struct sink *s, h2o_req_t *req, int64_t ts_ms) {
    h2o_iovec_t full = req->input.path;
    size_t qa = req->input.query_at;
    size_t path_len = qa != SIZE_MAX ? qa : full.len;
    size_t body_len = req->entity.base != NULL ? req->entity.len : 0;
    size_t b64_cap = 4 * ((body_len + 2) / 3) + 1;
    char *b64 = malloc(b64_cap);
    json_t *o = json_object();
    char *line = NULL;

    if (b64 == NULL || o == NULL || body_len > INT32_MAX) {
        fprintf(stderr, "hub-sink: cannot record %.*s: out of memory\n", (int)path_len, full.base);
        goto done;
    }
    EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)req->entity.base, (int)body_len);
    /* Key order is part of the format (see the top of this file). */
    json_object_set_new(o, "ts_ms", json_integer(ts_ms));
    json_object_set_new(o, "method", json_bytes(req->input.method.base, req->input.method.len));
    json_object_set_new(o, "path", json_bytes(full.base, path_len));
    json_object_set_new(o, "query",
                        qa != SIZE_MAX ? json_bytes(full.base + qa + 1, full.len - qa - 1)
                                       : json_null());
    json_object_set_new(o, "headers", record_headers(req));
    json_object_set_new(o, "body_b64", json_string(b64));
    json_object_set_new(o, "body_len", json_integer((json_int_t)body_len));
    json_object_set_new(o, "http_version", json_string(version_text(req->version)));
    line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (line == NULL) {
        fprintf(stderr, "hub-sink: cannot encode the record of %.*s\n", (int)path_len, full.base);
        goto done;
    }
    struct iovec iov[2] = {{line, strlen(line)}, {"\n", 1}};
    if (write_all(s->record_fd, iov, 2) != 0) {
        fprintf(stderr, "hub-sink: write %s: %s\n", s->record_path, strerror(errno));
        goto done;
    }
    s->n_recorded++;
done:
    free(line);
    json_decref(o);
    free(b64);
}

/* ---------------------------------------------------- late answers -- */

static void pending_closed(uv_handle_t *handle) {
    free(handle); /* the timer is the first member */
}

/* Unlinks p, forgets its request and closes its timer (which frees p). */
static void pending_detach(struct sink_pending *p) {
    struct sink *s = p->sink;

    if (p->prev != NULL) {
        p->prev->next = p->next;
    } else {
        s->pending = p->next;
    }
    if (p->next != NULL) {
        p->next->prev = p->prev;
    }
    if (p->slot != NULL) {
        *p->slot = NULL;
        p->slot = NULL;
    }
    p->req = NULL;
    uv_timer_stop(&p->timer);
    uv_close((uv_handle_t *)&p->timer, pending_closed);
}

/* Dispose callback of the slot in the request's pool: the request is gone
 * (answered elsewhere, client went away, connection closed). */
static void pending_req_disposed(void *arg) {
    struct sink_pending **slot = arg;
    struct sink_pending *p = *slot;

    if (p != NULL) {
        p->slot = NULL;
        pending_detach(p);
    }
}

/* Detaches p, then answers its request if it is still there. */
static void pending_answer(struct sink_pending *p, int status, const char *body) {
    h2o_req_t *req = p->req;

    pending_detach(p);
    if (req != NULL) {
        respond(req, status, body);
    }
}

static void slow_fired(uv_timer_t *timer) {
    pending_answer((struct sink_pending *)timer, 200, "ok");
}

/*
 * Keeps req for a late answer: after delay_ms for SINK_PENDING_SLOW, never
 * (until the client leaves or the sink stops) for SINK_PENDING_HANG.
 * While stopping, answers 503 at once instead.
 */
static void pending_start(struct sink *s, h2o_req_t *req, enum sink_pending_kind kind,
                          uint64_t delay_ms) {
    struct sink_pending *p;

    if (s->stopping) {
        respond(req, 503, "sink stopping\n");
        return;
    }
    p = h2o_mem_alloc(sizeof(*p));
    memset(p, 0, sizeof(*p));
    p->sink = s;
    p->req = req;
    p->kind = kind;
    uv_timer_init(&s->loop, &p->timer);
    p->slot = h2o_mem_alloc_shared(&req->pool, sizeof(*p->slot), pending_req_disposed);
    *p->slot = p;
    p->next = s->pending;
    if (s->pending != NULL) {
        s->pending->prev = p;
    }
    s->pending = p;
    if (kind == SINK_PENDING_SLOW) {
        uv_timer_start(&p->timer, slow_fired, delay_ms, 0);
    }
}

/* ------------------------------------------------------- connections -- */

static int same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
    if (a->ss_family != b->ss_family) {
        return 0;
    }
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
        return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
        return x->sin6_port == y->sin6_port &&
               memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr)) == 0;
    }
    return 0;
}

/*
 * The descriptor of the connection req came on, or -1.  h2o has no public
 * way from a request to its socket; the peer address (public through the
 * connection callbacks) names the connection we accepted.
 */
static int request_fd(struct sink *s, h2o_req_t *req) {
    struct sockaddr_storage ss;
    uv_os_fd_t fd;

    memset(&ss, 0, sizeof(ss));
    if (req->conn->callbacks->get_peername(req->conn, (struct sockaddr *)&ss) == 0) {
        return -1;
    }
    for (struct sink_conn *c = s->conns; c != NULL; c = c->next) {
        if (c->has_peer && same_addr(&c->peer, &ss)) {
            return uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0 ? fd : -1;
        }
    }
    return -1;
}

/*
 * /hang over HTTP/1: h2o stops reading the socket while a request is being
 * handled, so it cannot notice the client leaving.  Peek for EOF/reset
 * ourselves and then answer (into the void): the failed or finished write
 * makes h2o close the connection and free the request.  HTTP/2 connections
 * are always read by h2o, which disposes of the streams itself.
 */
static void hang_check_fired(uv_timer_t *timer) {
    struct sink *s = timer->data;
    int again = 1;

    while (again) {
        again = 0;
        for (struct sink_pending *p = s->pending; p != NULL; p = p->next) {
            char c;
            ssize_t r;
            int fd;

            if (p->kind != SINK_PENDING_HANG || p->req == NULL || p->req->version >= 0x200) {
                continue;
            }
            fd = request_fd(s, p->req);
            if (fd < 0) {
                continue;
            }
            r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
                /* The list changes under us: start over after each answer. */
                pending_answer(p, 503, "client gone\n");
                again = 1;
                break;
            }
        }
    }
}

static void conn_closed(uv_handle_t *handle) {
    struct sink_conn *c = (struct sink_conn *)handle;
    struct sink *s = c->sink;

    if (c->prev != NULL) {
        c->prev->next = c->next;
    } else {
        s->conns = c->next;
    }
    if (c->next != NULL) {
        c->next->prev = c->prev;
    }
    s->n_conns--;
    free(c);
    if (s->stopping) {
        sink_maybe_finish(s);
    }
}

static void on_accept(uv_stream_t *listener, int status) {
    struct sink *s = listener->data;
    struct sink_conn *c;
    h2o_socket_t *sock;
    int len = sizeof(c->peer), rc;

    if (status != 0) {
        fprintf(stderr, "hub-sink: accept: %s\n", uv_strerror(status));
        return;
    }
    c = h2o_mem_alloc(sizeof(*c)); /* aborts on OOM, like h2o itself */
    memset(c, 0, sizeof(*c));
    c->sink = s;
    uv_tcp_init(&s->loop, &c->tcp);
    c->next = s->conns;
    if (s->conns != NULL) {
        s->conns->prev = c;
    }
    s->conns = c;
    s->n_conns++;
    rc = uv_accept(listener, (uv_stream_t *)&c->tcp);
    if (rc != 0) {
        fprintf(stderr, "hub-sink: accept: %s\n", uv_strerror(rc));
        uv_close((uv_handle_t *)&c->tcp, conn_closed);
        return;
    }
    c->has_peer = uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&c->peer, &len) == 0;
    uv_tcp_nodelay(&c->tcp, 1);
    sock = h2o_uv_socket_create((uv_stream_t *)&c->tcp, conn_closed);
    h2o_accept(&s->accept_ctx, sock);
}

/*
 * /garbage, /reset, /close: do `what` to the raw socket, then answer through
 * h2o.  The socket is shut down by then, so h2o's write fails and h2o closes
 * the connection and frees the request the normal way; the client sees only
 * what we did to the socket.  On HTTP/2 this ends the whole connection,
 * every other stream on it included.
 */
enum sink_sabotage { SINK_GARBAGE_BYTES, SINK_RESET, SINK_CLOSE };

static void sabotage(struct sink *s, h2o_req_t *req, enum sink_sabotage what) {
    int fd = request_fd(s, req);

    if (fd < 0) {
        respond(req, 500, "hub-sink: socket of this request not found\n");
        return;
    }
    switch (what) {
    case SINK_GARBAGE_BYTES:
        if (write(fd, SINK_GARBAGE, sizeof(SINK_GARBAGE) - 1) < 0) {
            fprintf(stderr, "hub-sink: /garbage write: %s\n", strerror(errno));
        }
        shutdown(fd, SHUT_RDWR);
        break;
    case SINK_RESET: {
        /* connect(AF_UNSPEC) dissolves a TCP association: Linux answers
         * with a RST at once, and the descriptor stays ours (h2o closes it). */
        struct sockaddr sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_family = AF_UNSPEC;
        if (connect(fd, &sa, sizeof(sa)) != 0) {
            struct linger lg = {1, 0}; /* fallback: RST when h2o closes it */
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
            shutdown(fd, SHUT_RD);
        }
        break;
    }
    case SINK_CLOSE:
        shutdown(fd, SHUT_RDWR);
        break;
    }
    respond(req, 502, "sabotaged\n");
}

/* ------------------------------------------------------------ answers -- */

static void big_proceed(h2o_generator_t *self, h2o_req_t *req) {
    struct sink_big *g = (struct sink_big *)self;
    size_t n = g->left < SINK_BIG_CHUNK ? g->left : SINK_BIG_CHUNK;
    h2o_iovec_t buf = h2o_iovec_init(g->filler, n);

    g->left -= n;
    h2o_send(req, &buf, 1, g->left == 0 ? H2O_SEND_STATE_FINAL : H2O_SEND_STATE_IN_PROGRESS);
}

static void big_stop(h2o_generator_t *self, h2o_req_t *req) {
    (void)self;
    (void)req;
    /* Nothing to release: the generator lives in the request's pool. */
}

/* /big: SINK_BIG_BYTES of 'x', streamed chunk by chunk as h2o asks for more.
 * with_length: announce Content-Length (else chunked on HTTP/1.1). */
static void answer_big(struct sink *s, h2o_req_t *req, int with_length) {
    struct sink_big *g = h2o_mem_alloc_pool(&req->pool, sizeof(*g));

    g->super.proceed = big_proceed;
    g->super.stop = big_stop;
    g->filler = s->filler;
    g->left = SINK_BIG_BYTES;
    req->res.status = 200;
    req->res.reason = "OK";
    if (with_length) {
        req->res.content_length = SINK_BIG_BYTES;
    }
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL,
                   H2O_STRLIT("text/plain"));
    h2o_start_response(req, &g->super);
    if (h2o_memis(req->input.method.base, req->input.method.len, H2O_STRLIT("HEAD"))) {
        h2o_send(req, NULL, 0, H2O_SEND_STATE_FINAL);
        return;
    }
    big_proceed(&g->super, req);
}

static void answer_echo(h2o_req_t *req) {
    ssize_t i = h2o_find_header(&req->headers, H2O_TOKEN_CONTENT_TYPE, -1);

    req->res.status = 200;
    req->res.reason = "OK";
    if (i >= 0) {
        h2o_iovec_t ct = req->headers.entries[i].value;
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, ct.base,
                       ct.len);
    } else {
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL,
                       H2O_STRLIT("application/octet-stream"));
    }
    req->res.content_length = req->entity.base != NULL ? req->entity.len : 0;
    h2o_send_inline(req, req->entity.base != NULL ? req->entity.base : "", req->res.content_length);
}

/* /echo-after/<n>: 200 with n bytes of 'x' and then the request body: an
 * echo buried in a larger document (a verification challenge far into the
 * body). */
static void answer_echo_after(h2o_req_t *req, uint64_t n) {
    size_t len = req->entity.base != NULL ? req->entity.len : 0;
    char *b = h2o_mem_alloc_pool(&req->pool, (size_t)n + len + 1);

    memset(b, 'x', (size_t)n);
    if (len > 0) {
        memcpy(b + n, req->entity.base, len);
    }
    req->res.status = 200;
    req->res.reason = "OK";
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL,
                   H2O_STRLIT("text/plain"));
    req->res.content_length = (size_t)n + len;
    h2o_send_inline(req, b, req->res.content_length);
}

/* /flaky/<n>: 503 for the first n requests to this exact path, then 200. */
static void answer_flaky(struct sink *s, h2o_req_t *req, h2o_iovec_t path, uint64_t n) {
    struct sink_flaky *f;
    char body[64];

    for (f = s->flaky; f != NULL; f = f->next) {
        if (f->len == path.len && memcmp(f->path, path.base, path.len) == 0) {
            break;
        }
    }
    if (f == NULL) {
        f = h2o_mem_alloc(sizeof(*f) + path.len);
        f->seen = 0;
        f->len = path.len;
        memcpy(f->path, path.base, path.len);
        f->next = s->flaky;
        s->flaky = f;
    }
    f->seen++;
    if (f->seen <= n) {
        snprintf(body, sizeof(body), "flaky %llu/%llu\n", f->seen, (unsigned long long)n);
        respond(req, 503, body);
    } else {
        respond(req, 200, "ok");
    }
}

static void bad_path(h2o_req_t *req) {
    respond(req, 400, "hub-sink: malformed parameters in the path (see sink.md)\n");
}

/*
 * Decides the answer from the path (query excluded).  Prefixes are literal:
 * whatever follows the recognised part is ignored.  Unknown paths get 200.
 */
static void route(struct sink *s, h2o_req_t *req, h2o_iovec_t path) {
    uint64_t a, b;
    size_t end;
    char body[64];

    if (has_prefix(path, "/ok")) {
        respond(req, 200, "ok");
    } else if (has_prefix(path, "/status/")) {
        if (parse_u64(segment_at(path, 8, &end), 599, &a) != 0 || a < 200) {
            bad_path(req);
            return;
        }
        snprintf(body, sizeof(body), "status %d\n", (int)a);
        respond(req, (int)a, body);
    } else if (has_prefix(path, "/retry-after/")) {
        h2o_iovec_t value;
        if (parse_u64(segment_at(path, 13, &end), 599, &a) != 0 || a < 200 || end >= path.len) {
            bad_path(req);
            return;
        }
        /* Seconds, or anything else percent-encoded (an HTTP-date). */
        value = percent_decode(&req->pool, segment_at(path, end + 1, &end));
        if (value.base == NULL) {
            bad_path(req);
            return;
        }
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_RETRY_AFTER, NULL, value.base,
                       value.len);
        snprintf(body, sizeof(body), "status %d\n", (int)a);
        respond(req, (int)a, body);
    } else if (has_prefix(path, "/gone")) {
        respond(req, 410, "gone\n");
    } else if (has_prefix(path, "/slow/")) {
        if (parse_u64(segment_at(path, 6, &end), SINK_MAX_DELAY_MS, &a) != 0) {
            bad_path(req);
            return;
        }
        pending_start(s, req, SINK_PENDING_SLOW, s->slow_off ? 0 : a);
    } else if (has_prefix(path, "/hang")) {
        pending_start(s, req, SINK_PENDING_HANG, 0);
    } else if (has_prefix(path, "/echo-after/")) {
        if (parse_u64(segment_at(path, 12, &end), SINK_MAX_ECHO_AFTER, &a) != 0) {
            bad_path(req);
            return;
        }
        answer_echo_after(req, a);
    } else if (has_prefix(path, "/echo")) {
        answer_echo(req);
    } else if (has_prefix(path, "/flaky/")) {
        if (parse_u64(segment_at(path, 7, &end), SINK_MAX_FLAKY, &a) != 0) {
            bad_path(req);
            return;
        }
        answer_flaky(s, req, path, a);
    } else if (has_prefix(path, "/fail-until/")) {
        if (parse_u64(segment_at(path, 12, &end), INT64_MAX, &b) != 0) {
            bad_path(req);
            return;
        }
        if ((uint64_t)now_unix_ms() < b) {
            respond(req, 503, "not yet\n");
        } else {
            respond(req, 200, "ok");
        }
    } else if (has_prefix(path, "/redirect")) {
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_LOCATION, NULL, H2O_STRLIT("/ok"));
        respond(req, 302, "see /ok\n");
    } else if (has_prefix(path, "/big-chunked")) {
        answer_big(s, req, 0);
    } else if (has_prefix(path, "/big")) {
        answer_big(s, req, 1);
    } else if (has_prefix(path, "/garbage")) {
        sabotage(s, req, SINK_GARBAGE_BYTES);
    } else if (has_prefix(path, "/reset")) {
        sabotage(s, req, SINK_RESET);
    } else if (has_prefix(path, "/close")) {
        sabotage(s, req, SINK_CLOSE);
    } else {
        respond(req, 200, "ok");
    }
}

static int on_req(h2o_handler_t *self, h2o_req_t *req) {
    struct sink *s = ((struct sink_handler *)self)->sink;
    int64_t ts_ms = now_unix_ms();
    size_t qa = req->input.query_at;
    h2o_iovec_t path =
        h2o_iovec_init(req->input.path.base, qa != SIZE_MAX ? qa : req->input.path.len);

    if (has_prefix(path, "/_count")) {
        char body[32];
        snprintf(body, sizeof(body), "%" PRIu64 "\n", s->n_recorded);
        respond(req, 200, body);
        return 0;
    }
    record_request(s, req, ts_ms);
    route(s, req, path);
    return 0;
}

/* ----------------------------------------------------------- shutdown -- */

/*
 * Disposes of h2o once the listener and every connection are closed.  Runs
 * from close callbacks only: h2o_context_dispose() runs the loop once
 * (UV_RUN_NOWAIT), harmless from the closing phase.
 */
static void sink_maybe_finish(struct sink *s) {
    if (!s->listener_closed || s->n_conns > 0 || s->disposed) {
        return;
    }
    s->disposed = 1;
    uv_close((uv_handle_t *)&s->stop_deadline, NULL);
    h2o_context_dispose(&s->ctx);
    h2o_config_dispose(&s->config);
}

static void listener_closed(uv_handle_t *handle) {
    struct sink *s = handle->data;
    s->listener_closed = 1;
    sink_maybe_finish(s);
}

static void stop_deadline_fired(uv_timer_t *timer) {
    struct sink *s = timer->data;
    fprintf(stderr, "hub-sink: %zu connection(s) still open %d ms after the stop; exiting\n",
            s->n_conns, SINK_STOP_GRACE_MS);
    exit(1);
}

/*
 * Stops: no new connections; every connection is shut down (h2o then sees
 * EOF or a failed write and closes it); requests waiting for a late answer
 * get a 503 that nobody will read, so h2o lets go of them too.
 */
static void sink_stop(struct sink *s, const char *why) {
    if (s->stopping) {
        return;
    }
    s->stopping = 1;
    fprintf(stderr, "hub-sink: %s: stopping (%zu connection(s), %" PRIu64 " recorded)\n", why,
            s->n_conns, s->n_recorded);
    uv_close((uv_handle_t *)&s->sigterm, NULL);
    uv_close((uv_handle_t *)&s->sigint, NULL);
    uv_close((uv_handle_t *)&s->sigusr1, NULL);
    uv_close((uv_handle_t *)&s->hang_check, NULL);
    uv_close((uv_handle_t *)&s->listener, listener_closed);
    for (struct sink_conn *c = s->conns; c != NULL; c = c->next) {
        uv_os_fd_t fd;
        if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0) {
            shutdown(fd, SHUT_RDWR);
        }
    }
    while (s->pending != NULL) {
        pending_answer(s->pending, 503, "sink stopping\n");
    }
    uv_timer_start(&s->stop_deadline, stop_deadline_fired, SINK_STOP_GRACE_MS, 0);
}

/* A test's timed part is over: the rest of a slow backlog may drain at
 * once (requests already waiting keep their delay). */
static void on_sigusr1(uv_signal_t *handle, int signum) {
    struct sink *s = handle->data;
    (void)signum;
    s->slow_off = 1;
    fprintf(stderr, "hub-sink: SIGUSR1: /slow/MS answers at once from now on\n");
}

static void on_signal(uv_signal_t *handle, int signum) {
    sink_stop(handle->data, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* -------------------------------------------------------------- setup -- */

/* "HOST:PORT" or "[V6]:PORT" into ss.  0 or -1. */
static int parse_listen(const char *spec, struct sockaddr_storage *ss) {
    char host[SINK_ADDR_MAX];
    const char *colon;
    uint64_t port;
    size_t hlen;

    memset(ss, 0, sizeof(*ss));
    if (spec[0] == '[') {
        const char *close = strchr(spec, ']');
        if (close == NULL || close[1] != ':') {
            return -1;
        }
        hlen = (size_t)(close - spec - 1);
        if (hlen >= sizeof(host)) {
            return -1;
        }
        memcpy(host, spec + 1, hlen);
        colon = close + 1;
    } else {
        colon = strrchr(spec, ':');
        if (colon == NULL) {
            return -1;
        }
        hlen = (size_t)(colon - spec);
        if (hlen >= sizeof(host)) {
            return -1;
        }
        memcpy(host, spec, hlen);
    }
    host[hlen] = '\0';
    if (parse_u64(h2o_iovec_init(colon + 1, strlen(colon + 1)), 65535, &port) != 0) {
        return -1;
    }
    if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ss) == 0 ||
        uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)ss) == 0) {
        return 0;
    }
    return -1;
}

static int format_bound(uv_tcp_t *listener, char *out, size_t outsz) {
    struct sockaddr_storage ss;
    int len = sizeof(ss), rc;
    char ip[INET6_ADDRSTRLEN];

    rc = uv_tcp_getsockname(listener, (struct sockaddr *)&ss, &len);
    if (rc != 0) {
        return rc;
    }
    if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        uv_ip6_name(a, ip, sizeof(ip));
        snprintf(out, outsz, "[%s]:%d", ip, ntohs(a->sin6_port));
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        uv_ip4_name(a, ip, sizeof(ip));
        snprintf(out, outsz, "%s:%d", ip, ntohs(a->sin_port));
    }
    return 0;
}

/* Writes "ADDR\n" to path via a temporary file and rename(2). 0 or -1. */
static int write_port_file(const char *path, const char *addr) {
    size_t n = strlen(path) + 32;
    char *tmp = malloc(n);
    FILE *f;
    int ok;

    if (tmp == NULL) {
        return -1;
    }
    snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
    f = fopen(tmp, "w");
    if (f == NULL) {
        free(tmp);
        return -1;
    }
    ok = fprintf(f, "%s\n", addr) > 0;
    ok = (fclose(f) == 0) && ok;
    ok = ok && rename(tmp, path) == 0;
    if (!ok) {
        unlink(tmp);
    }
    free(tmp);
    return ok ? 0 : -1;
}

static void usage(FILE *out) {
    fputs("usage: hub-sink [--listen HOST:PORT] --record FILE [--port-file FILE]\n"
          "  --listen HOST:PORT  address to bind (default 127.0.0.1:0, port 0 = ephemeral)\n"
          "  --record FILE       append one JSON line per request (created if missing)\n"
          "  --port-file FILE    write the bound \"HOST:PORT\" there (atomically)\n"
          "Paths: /ok /status/C /retry-after/C/S /gone /slow/MS /hang /echo /echo-after/N\n"
          "       /flaky/N /fail-until/UNIX_MS /redirect /big /big-chunked /garbage /reset /close\n"
          "       /_count (see tests/support/sink.md)\n",
          out);
}

int main(int argc, char **argv) {
    static const struct option longopts[] = {
        {"listen", required_argument, NULL, 'l'},
        {"record", required_argument, NULL, 'r'},
        {"port-file", required_argument, NULL, 'p'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *listen_spec = "127.0.0.1:0", *port_file = NULL;
    struct sockaddr_storage ss;
    struct sink *s;
    h2o_hostconf_t *host;
    struct sink_handler *handler;
    int opt, rc, status = 2;

    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return 2;
    }
    s->record_fd = -1;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case 'l':
            listen_spec = optarg;
            break;
        case 'r':
            s->record_path = optarg;
            break;
        case 'p':
            port_file = optarg;
            break;
        case 'h':
            usage(stdout);
            free(s);
            return 0;
        default:
            usage(stderr);
            free(s);
            return 2;
        }
    }
    if (optind != argc || s->record_path == NULL || parse_listen(listen_spec, &ss) != 0) {
        usage(stderr);
        free(s);
        return 2;
    }
    /* A client that hangs up mid-answer must cost a failed write, not us. */
    signal(SIGPIPE, SIG_IGN);

    s->record_fd = open(s->record_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (s->record_fd < 0) {
        fprintf(stderr, "hub-sink: open %s: %s\n", s->record_path, strerror(errno));
        goto fail_record;
    }
    s->filler = malloc(SINK_BIG_CHUNK);
    if (s->filler == NULL) {
        goto fail_filler;
    }
    memset(s->filler, 'x', SINK_BIG_CHUNK);
    rc = uv_loop_init(&s->loop);
    if (rc != 0) {
        fprintf(stderr, "hub-sink: uv_loop_init: %s\n", uv_strerror(rc));
        goto fail_loop;
    }
    uv_tcp_init(&s->loop, &s->listener);
    s->listener.data = s;
    rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&ss, 0);
    if (rc == 0) {
        rc = uv_listen((uv_stream_t *)&s->listener, SINK_BACKLOG, on_accept);
    }
    if (rc == 0) {
        rc = format_bound(&s->listener, s->bound, sizeof(s->bound));
    }
    if (rc != 0) {
        fprintf(stderr, "hub-sink: listen on %s: %s\n", listen_spec, uv_strerror(rc));
        goto fail_listen;
    }

    h2o_config_init(&s->config);
    s->config.server_name = h2o_iovec_init(H2O_STRLIT("hub-sink"));
    s->config.max_request_entity_size = SINK_MAX_REQUEST_BODY;
    host = h2o_config_register_host(&s->config, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    handler = (struct sink_handler *)h2o_create_handler(h2o_config_register_path(host, "/", 0),
                                                        sizeof(*handler));
    handler->super.on_req = on_req;
    handler->sink = s;
    h2o_context_init(&s->ctx, &s->loop, &s->config);
    s->accept_ctx.ctx = &s->ctx;
    s->accept_ctx.hosts = s->config.hosts;

    uv_signal_init(&s->loop, &s->sigterm);
    uv_signal_init(&s->loop, &s->sigint);
    s->sigterm.data = s->sigint.data = s;
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    uv_signal_init(&s->loop, &s->sigusr1);
    s->sigusr1.data = s;
    uv_signal_start(&s->sigusr1, on_sigusr1, SIGUSR1);
    uv_timer_init(&s->loop, &s->hang_check);
    s->hang_check.data = s;
    uv_timer_start(&s->hang_check, hang_check_fired, SINK_HANG_CHECK_MS, SINK_HANG_CHECK_MS);
    uv_timer_init(&s->loop, &s->stop_deadline);
    s->stop_deadline.data = s;

    if (port_file != NULL && write_port_file(port_file, s->bound) != 0) {
        fprintf(stderr, "hub-sink: write %s: %s\n", port_file, strerror(errno));
        s->exit_status = 2;
        sink_stop(s, "port file");
    }
    printf("%s\n", s->bound);
    fflush(stdout);
    fprintf(stderr, "hub-sink: listening on %s, recording to %s\n", s->bound, s->record_path);

    uv_run(&s->loop, UV_RUN_DEFAULT);
    rc = uv_loop_close(&s->loop);
    if (rc != 0) {
        fprintf(stderr, "hub-sink: event loop not empty at exit: %s\n", uv_strerror(rc));
    }
    status = s->exit_status;
    goto done;

fail_listen:
    uv_close((uv_handle_t *)&s->listener, NULL);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    uv_loop_close(&s->loop);
fail_loop:
done:
    free(s->filler);
fail_filler:
    close(s->record_fd);
fail_record:
    while (s->flaky != NULL) {
        struct sink_flaky *next = s->flaky->next;
        free(s->flaky);
        s->flaky = next;
    }
    free(s);
    return status;
}
