/*
 * http_int — the HTTP listener's state, shared by its two files (internal:
 * only http*.c include it):
 *
 *   http.c         the socket side (listen, accept, track and close
 *                  connections, dispose of h2o), the first routing step,
 *                  and the drain;
 *   http_limits.c  what one client may take of the process (SPEC §11,
 *                  issue 24): the connection cap, the bytes of request
 *                  bodies held at once, the HTTP ingest requests in
 *                  progress and one API key's share of them, and the
 *                  answers h2o gives on its own before a handler runs
 *                  (413 before a body is read).
 *
 * A request's way in: on_accept (connection cap) ──► h2o reads the head;
 * a body over the current budget (max_request_entity_size, set before
 * every loop turn) is refused by h2o before it is read, and the answer is
 * rewritten by the fallback filter (413 or 503) ──► on_req: the request is
 * counted in flight until h2o disposes of it (http_limits_admit), an
 * ingest request against its bound ──► the routes (api_*.c).
 */
#ifndef HUB_HTTP_INT_H
#define HUB_HTTP_INT_H

#include <h2o.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "metrics.h"

#define HTTP_ADDR_MAX 64

struct hub;
struct hub_http;

/* One accepted connection.  tcp comes first: h2o's close callback gives us
 * the uv handle, which is then also the connection. */
struct http_conn {
    uv_tcp_t tcp;
    struct hub_http *http;
    h2o_socket_t *sock; /* h2o's socket over tcp; valid until our close callback */
    /* what the request head at the start of sock->input announces
     * (http_limits.c): the head's bytes and Content-Length, cached for the
     * buffer they were read from */
    const char *head_of;
    size_t head_total;
    struct http_conn *prev;
    struct http_conn *next;
};

/* h2o calls on_req with the h2o_handler_t; ours sits first to reach the server. */
struct http_handler {
    h2o_handler_t super;
    struct hub_http *http;
};

/* An h2o filter of ours (on_setup_ostream): the drain's Connection: close on
 * the routes, the rewrite of h2o's own refusals on the fallback path. */
struct http_filter {
    h2o_filter_t super;
    struct hub_http *http;
};

/* HTTP ingest requests in progress of one API key (by a hash of its
 * token), for its share of the bound: an open-addressing table. */
struct http_keycount {
    uint64_t key; /* 0: free slot */
    uint32_t n;
};

/* HTTP ingest requests in progress, overall and per API key.  A request's
 * slot is held until its work ends, which may be after its client left and
 * after the server is gone (a drain), so the table is counted: the server
 * holds one reference, each slot held another (struct http_ingest_hold). */
struct http_ingest_slots {
    size_t max;  /* STREAMING_HUB_INGEST_HTTP_QUEUE */
    size_t live; /* HTTP ingest requests in progress */
    struct http_keycount *keys;
    size_t keys_cap; /* a power of two, at least twice max */
    size_t refs;
};

struct hub_http {
    struct hub *hub; /* borrowed until hub_http_stop */
    h2o_globalconf_t config;
    h2o_context_t ctx;
    h2o_accept_ctx_t accept_ctx;
    uv_tcp_t listener;
    /* Closed one after the other after h2o_context_dispose: the second close
     * callback runs only once every handle h2o closed has been finished. */
    uv_timer_t reap[2];
    struct http_conn *conns; /* live connections */
    size_t n_conns;
    int stopping;
    int listener_closed;
    int disposed;
    char bound_addr[HTTP_ADDR_MAX];

    /* the drain (http.c): new requests refused, in-flight ones finish */
    int draining;
    size_t inflight;          /* requests routed and not yet disposed of by h2o */
    uint64_t last_arrival_ns; /* the last connection accepted or request routed */
    uv_timer_t drain_check;
    void (*drained_cb)(void *arg);
    void *drained_arg;

    /* limits (http_limits.c) */
    size_t max_conns;    /* STREAMING_HUB_HTTP_MAX_CONNECTIONS */
    int accept_pending;  /* a connection waits in the backlog for a slot */
    size_t body_cap;     /* STREAMING_HUB_HTTP_BODY_BYTES */
    size_t body_max;     /* the largest body any route takes */
    size_t body_bytes;   /* held at the last loop turn (a gauge) */
    uv_prepare_t budget; /* recomputes max_request_entity_size every turn */
    struct http_ingest_slots *ingest;
    /* the slot of the request on_req is routing (admitted last), or NULL:
     * hub_http_ingest_hold takes it for a call that may outlive it */
    struct http_ingest_hold *routing;
    uint64_t logged_ms[HUB_HTTP_REFUSED__COUNT + 1]; /* last log line per refusal (+ cap) */
};

/* ------------------------------------------------- http_limits.c -- */

/* Sets the limits up from the configuration and hooks them into h2o: the
 * budget before every loop turn, the filters on the routes' path and on
 * the host's fallback path.  Returns 0 or HUB_ENOMEM. */
int http_limits_init(struct hub_http *http, h2o_hostconf_t *host, h2o_pathconf_t *path);

/* The server's reference to its ingest slots, dropped as it is freed. */
void http_ingest_slots_unref(struct http_ingest_slots *s);

/* Closes the limits' handles (part of hub_http_stop). */
void http_limits_stop(struct hub_http *http);

/* 1 when a new connection may be accepted now; 0 at the cap (the
 * connection stays in the kernel's backlog: http_limits_conn_closed
 * accepts it once a slot is free). */
int http_limits_accept_ok(struct hub_http *http);

/* A connection closed: accepts the one waiting for its slot, if any. */
void http_limits_conn_closed(struct hub_http *http);

/*
 * Every routed request but the operations endpoints: counts it in flight
 * until h2o disposes of it, and holds an ingest request (POST /v1/events)
 * to its bound and its key's share.  Returns 0 when the request goes on,
 * 1 when it was answered (503 with Retry-After).
 */
int http_limits_admit(struct hub_http *http, h2o_req_t *req, int ingest);

/* Counts a refusal and logs it, once per minute and reason at most. */
void http_limits_refused(struct hub_http *http, enum hub_http_refusal why, const char *detail);

/* Answers 503 with Retry-After: 1 and detail (problem+json). */
void http_send_unavailable(h2o_req_t *req, const char *detail);

/* The accept of a connection waiting for a slot (http.c's on_accept). */
void http_accept(struct hub_http *http);

#endif
