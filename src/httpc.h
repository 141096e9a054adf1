/*
 * httpc — outgoing HTTP requests (webhook attempts, verification probes):
 * libcurl's multi interface driven by the hub's libuv loop (uv_poll_t per
 * socket, one uv_timer_t), keep-alive connection reuse, HTTP/1.1 and HTTP/2
 * (ALPN), TLS verification on, redirects never followed, response bodies
 * read only up to a cap, and the SSRF guard of SPEC §11 applied to the
 * address each connection actually uses.
 *
 * Everything runs on the loop thread.
 */
#ifndef HUB_HTTPC_H
#define HUB_HTTPC_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

struct hub_url; /* netguard.h */

struct hub_httpc;

struct hub_httpc_options {
    int allow_private;       /* STREAMING_HUB_ALLOW_PRIVATE_SINKS */
    long max_connections;    /* total open connections (0 = libcurl default) */
    long cached_connections; /* connections kept open for reuse (0 = libcurl default: 4 ×
                                transfers in progress, so a dip in concurrency closes the
                                connections that the next burst has to open again) */
    size_t excerpt_bytes;    /* response body bytes kept for the caller (1024) */
    size_t max_body_bytes;   /* response body bytes read before giving up (e.g. 1 MiB) */
    const char *user_agent;  /* "streaming-hub/<version>" */
    const char *ca_file;     /* PEM bundle that replaces the system CAs for https, or NULL */
};

/* One request.  Everything is borrowed only until hub_httpc_post returns
 * (the module copies what it needs). */
struct hub_httpc_request {
    const char *url;
    const struct hub_url *parsed; /* url as hub_url_parse() gave it; NULL: parsed here */
    const char *const *headers;   /* "Name: value" lines, NULL-terminated; may be NULL */
    const void *body;
    size_t body_len;
    int64_t timeout_ms;         /* whole attempt (STREAMING_HUB_DELIVERY_TIMEOUT) */
    int64_t connect_timeout_ms; /* 5000 */
    /* response body bytes kept for the callback (the response's excerpt);
     * 0: the client's excerpt_bytes (verification probes keep more) */
    size_t excerpt_bytes;
};

enum hub_httpc_error {
    HUB_HTTPC_OK = 0,   /* a response arrived (any status) */
    HUB_HTTPC_TIMEOUT,  /* whole-attempt or connect timeout */
    HUB_HTTPC_CONNECT,  /* refused, reset, unreachable */
    HUB_HTTPC_DNS,      /* name did not resolve */
    HUB_HTTPC_TLS,      /* handshake or certificate */
    HUB_HTTPC_BLOCKED,  /* SSRF guard refused the address */
    HUB_HTTPC_PROTOCOL, /* garbage response, body over the cap, ... */
    HUB_HTTPC_INTERNAL, /* out of memory, closing */
    HUB_HTTPC_ABORTED,  /* hub_httpc_abort: the answer was not waited for */
};

struct hub_httpc_response {
    enum hub_httpc_error error;
    const char *error_text; /* short, for logs and delivery_attempts.error */
    long status;            /* HTTP status, 0 when none */
    const char *excerpt;    /* first excerpt_bytes of the body (NUL-terminated) */
    size_t excerpt_len;
    size_t body_len;         /* bytes of body read (up to the cap) */
    const char *retry_after; /* Retry-After header value, or NULL */
    int64_t duration_ms;
};

/* Called exactly once per request, on the loop; the response is borrowed for
 * the duration of the call. */
typedef void (*hub_httpc_cb)(void *arg, const struct hub_httpc_response *res);

/* Creates the client on loop.  Returns NULL on failure (logged). */
struct hub_httpc *hub_httpc_new(uv_loop_t *loop, const struct hub_httpc_options *opt);

/*
 * Starts a POST.  Returns 0 and later calls cb, or returns -1 at once (bad
 * URL, out of memory) without calling cb.
 */
int hub_httpc_post(struct hub_httpc *c, const struct hub_httpc_request *req, hub_httpc_cb cb,
                   void *arg);

/*
 * Ends every request in flight at once, each callback called (before this
 * returns) with HUB_HTTPC_ABORTED: the destination may have received it, no
 * answer was awaited.  For a drain whose time is nearly up.  The client
 * stays usable.
 */
void hub_httpc_abort(struct hub_httpc *c);

/* Requests started and not finished. */
size_t hub_httpc_inflight(const struct hub_httpc *c);

/* Aborts what is in flight (callbacks run with HUB_HTTPC_INTERNAL, "closing"),
 * closes every handle and frees the client once libuv closed them. */
void hub_httpc_close(struct hub_httpc *c);

/* Stable label of an error ("timeout", "connect", ...). */
const char *hub_httpc_error_str(enum hub_httpc_error e);

#endif
