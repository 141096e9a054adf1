/*
 * http — the HTTP listener: libh2o (HTTP/1.1 with keep-alive) on the
 * hub's libuv loop.  This file owns the socket side (listen, accept, track
 * and close connections, dispose of h2o), the first routing step and the
 * drain; the limits on what one client may take are in http_limits.c (see
 * http_int.h), the routes in api_*.c.
 *
 * Life cycle of a connection: we accept it into a `struct http_conn` that we
 * keep on a list, and hand it to h2o; h2o closes it when the client goes
 * away, on errors and timeouts, and our close callback unlinks and frees it.
 *
 * Stopping (see hub_http_stop): h2o 2.2 has no "close every connection" call,
 * and its context may only be disposed of once no connection uses it.  So we
 * close the listener and shut the sockets down under h2o: each connection
 * then sees EOF or a write error and closes itself the normal way.  When the
 * last one is gone the context is disposed of and, two close rounds later,
 * the server is freed.
 */
#include "http.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <h2o.h>
#include <h2o/socket/uv-binding.h>

#include "api_admin.h"
#include "api_events.h"
#include "api_schemas.h"
#include "api_stats.h"
#include "api_subs.h"
#include "api_util.h"
#include "console.h"
#include "dispatch.h"
#include "http_int.h"
#include "hub.h"
#include "ingest.h"
#include "log.h"
#include "metrics.h"
#include "opevents.h"
#include "policy.h"
#include "util.h"

#define HTTP_BACKLOG 1024
/* How often the drain looks whether what it waits for is done. */
#define HTTP_DRAIN_CHECK_MS 20
/* The drain ends only once no connection or request has arrived for this
 * long: clients still sending (each told 503 and Connection: close) are
 * answered rather than finding the listener closed, or their connection
 * reset in its backlog, between two requests. */
#define HTTP_DRAIN_QUIET_NS (250 * 1000000ULL)

const char *hub_http_bound_addr(const struct hub_http *http) {
    return http->bound_addr;
}

/* --------------------------------------------------------- operations -- */

/* Alive: answered by the loop itself, so a stuck loop fails it. */
static void ops_healthz(h2o_req_t *req) {
    static const char body[] = "{\"status\":\"ok\"}";
    hub_api_send_json_text(req, 200, body, sizeof(body) - 1);
}

/* Ready: hub_ready() decides; a 503 names the check that failed in its
 * detail, for the operator reading a probe's answer. */
static void ops_readyz(struct hub *hub, h2o_req_t *req) {
    static const char body[] = "{\"status\":\"ready\"}";
    const char *why = NULL;

    if (hub_ready(hub, &why)) {
        hub_api_send_json_text(req, 200, body, sizeof(body) - 1);
        return;
    }
    hub_api_send_problem(req, 503, why != NULL ? why : "not ready", NULL);
}

/* The Prometheus text: counters as they are, gauges computed now. */
static void ops_metrics(struct hub *hub, h2o_req_t *req) {
    static const char type[] = "text/plain; version=0.0.4; charset=utf-8";
    struct hub_metrics_gauges g;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);

    if (f == NULL) {
        hub_api_send_problem(req, 500, "out of memory rendering metrics", NULL);
        return;
    }
    hub_gauges(hub, &g);
    hub_metrics_render(&hub->metrics, &g, f);
    hub_policies_metrics_render(hub->policies, f);
    hub_dispatch_metrics_render(hub->dispatch, f);
    hub_opevents_metrics_render(hub, f);
    if (fclose(f) != 0 || text == NULL) {
        free(text);
        hub_api_send_problem(req, 500, "out of memory rendering metrics", NULL);
        return;
    }
    req->res.status = 200;
    req->res.reason = "OK";
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, type,
                   sizeof(type) - 1);
    req->res.content_length = len;
    h2o_send_inline(req, text, len); /* copies */
    free(text);
}

/* The three operations endpoints answer GET and HEAD only. */
static int ops_route(struct hub *hub, h2o_req_t *req) {
    h2o_iovec_t p = req->path_normalized;
    int which;

    if (h2o_memis(p.base, p.len, H2O_STRLIT("/healthz"))) {
        which = 0;
    } else if (h2o_memis(p.base, p.len, H2O_STRLIT("/readyz"))) {
        which = 1;
    } else if (h2o_memis(p.base, p.len, H2O_STRLIT("/metrics"))) {
        which = 2;
    } else {
        return 0;
    }
    if (!hub_api_method_is(req, "GET") && !hub_api_method_is(req, "HEAD")) {
        hub_api_send_method_not_allowed(req, "GET, HEAD");
        return 1;
    }
    switch (which) {
    case 0:
        ops_healthz(req);
        break;
    case 1:
        ops_readyz(hub, req);
        break;
    default:
        ops_metrics(hub, req);
        break;
    }
    return 1;
}

/* 1 when path is `prefix` itself or lies under "prefix/". */
static int path_under(h2o_iovec_t path, const char *prefix, size_t plen) {
    return path.len >= plen && memcmp(path.base, prefix, plen) == 0 &&
           (path.len == plen || path.base[plen] == '/');
}

/* 1 for POST /v1/events: HTTP ingest (SPEC §4), as the router splits the
 * path (hub_api_split_path), so every spelling it routes to ingest takes a
 * slot (a trailing slash did not). */
static int is_ingest(const h2o_req_t *req) {
    h2o_iovec_t seg[2];
    return hub_api_method_is(req, "POST") && hub_api_path_under(req->path_normalized, "/v1") &&
           hub_api_split_path(req->path_normalized, 3, seg, 2) == 1 &&
           h2o_memis(seg[0].base, seg[0].len, H2O_STRLIT("events"));
}

/*
 * Every request starts here.  Returns 0: we always answer (now or later).
 * The operations endpoints answer whatever happens (a draining process
 * says so on /readyz); every other request is refused while draining, and
 * otherwise counted in flight and held to the limits (http_limits.c).
 */
static int on_req(h2o_handler_t *self, h2o_req_t *req) {
    struct hub_http *http = ((struct http_handler *)self)->http;
    struct hub *hub = http->hub;

    hub->metrics.http_requests++;
    http->last_arrival_ns = hub_now_ns();
    if (ops_route(hub, req)) {
        return 0;
    }
    /* refused while draining: a client is told to go elsewhere (503, with
     * Connection: close), never left without an answer */
    if (http->stopping || http->draining) {
        http_limits_refused(http, HUB_HTTP_REFUSED_DRAINING, "the server is shutting down");
        req->http1_is_persistent = 0;
        http_send_unavailable(req, "the server is shutting down; retry on another instance");
        return 0;
    }
    if (http_limits_admit(http, req, is_ingest(req))) {
        return 0;
    }
    /* h2o refused a body over its current budget before reading it
     * (http_limits.c), and that budget is never over HTTP ingest's largest
     * body; this is the guard for the routes whose cap is lower (the JSON
     * API takes HUB_API_MAX_BODY).  HTTP ingest takes events as large as
     * STREAMING_HUB_MAX_EVENT_BYTES allows. */
    if (req->entity.len > HUB_API_MAX_BODY &&
        (req->entity.len > hub_api_events_max_body(&hub->cfg) ||
         !path_under(req->path_normalized, H2O_STRLIT("/v1/events")))) {
        hub_api_send_problem(req, 413, "the request body is too large", NULL);
        return 0;
    }
    if (hub_console_handle(req)) {
        return 0;
    }
    if (path_under(req->path_normalized, H2O_STRLIT("/admin"))) {
        hub_api_admin_handle(hub, req);
        return 0;
    }
    if (path_under(req->path_normalized, H2O_STRLIT("/v1"))) {
        /* Dispatch point of the tenant API (SPEC §4, §9): subscriptions,
         * deliveries, events.  Tenant routes authenticate with
         * hub_api_auth_tenant() (api_util.h). */
        if (hub_api_subs_handle(hub, req) || hub_api_events_handle(hub, req) ||
            hub_api_stats_handle(hub, req) || hub_api_schemas_handle(hub, req)) {
            return 0;
        }
        hub_api_send_problem(req, 404, "no such resource", NULL);
        return 0;
    }
    hub_api_send_problem(req, 404, "no such resource", NULL);
    return 0;
}

/* -------------------------------------------------------- connections -- */

static void http_maybe_finish(struct hub_http *http);

/* Takes c off the list of live connections. */
static void conn_unlink(struct http_conn *c) {
    struct hub_http *http = c->http;

    if (c->prev != NULL) {
        c->prev->next = c->next;
    } else {
        http->conns = c->next;
    }
    if (c->next != NULL) {
        c->next->prev = c->prev;
    }
    c->prev = c->next = NULL;
    http->n_conns--;
}

/* Close callback of a connection's handle (given to h2o, or ours on errors).
 * h2o has freed its socket just before. */
static void conn_closed(uv_handle_t *handle) {
    struct http_conn *c = (struct http_conn *)handle;
    struct hub_http *http = c->http;

    conn_unlink(c);
    free(c);
    if (http->stopping) {
        http_maybe_finish(http);
    } else {
        http_limits_conn_closed(http);
    }
}

/* Takes the connection libuv accepted and hands it to h2o. */
void http_accept(struct hub_http *http) {
    uv_stream_t *listener = (uv_stream_t *)&http->listener;
    struct http_conn *c;
    int rc;

    /* h2o_mem_alloc aborts on OOM, as h2o does for every connection it
     * handles; not accepting would stall the listener for good anyway. */
    c = h2o_mem_alloc(sizeof(*c));
    memset(c, 0, sizeof(*c));
    /* on the list before the accept: a failed accept closes it through
     * conn_closed like any other */
    c->http = http;
    uv_tcp_init(listener->loop, &c->tcp);
    c->next = http->conns;
    if (http->conns != NULL) {
        http->conns->prev = c;
    }
    http->conns = c;
    http->n_conns++;
    rc = uv_accept(listener, (uv_stream_t *)&c->tcp);
    if (rc != 0) {
        hub_log(HUB_WARN, "http accept failed", HUB_LS("error", uv_strerror(rc)));
        uv_close((uv_handle_t *)&c->tcp, conn_closed);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    c->sock = h2o_uv_socket_create((uv_stream_t *)&c->tcp, conn_closed);
    h2o_accept(&http->accept_ctx, c->sock);
}

/* A connection waits: accepted now, or left in the backlog at the
 * connection cap (http_limits.c takes it once a slot is free). */
static void on_accept(uv_stream_t *listener, int status) {
    struct hub_http *http = listener->data;

    if (status != 0) {
        hub_log(HUB_WARN, "http accept failed", HUB_LS("error", uv_strerror(status)));
        return;
    }
    http->last_arrival_ns = hub_now_ns();
    /* not accepting leaves the connection in libuv's hands: it stops
     * watching the listener until uv_accept is called (http_accept) */
    if (http->stopping || !http_limits_accept_ok(http)) {
        return;
    }
    http_accept(http);
}

/* ------------------------------------------------------------ address -- */

/*
 * Parses "host:port", "[v6]:port" or ":port" (all interfaces, IPv4) into ss.
 * Numeric hosts are taken as they are; a name (e.g. "localhost") is resolved
 * once, at start, before the loop runs.  Returns 0 or a negative uv error.
 */
static int parse_listen_addr(const char *addr, struct sockaddr_storage *ss) {
    char host[256];
    const char *colon, *port_s;
    size_t hlen;
    long port = 0;
    struct addrinfo hints, *res = NULL;

    if (addr == NULL || addr[0] == '\0') {
        return UV_EINVAL;
    }
    if (addr[0] == '[') {
        const char *rb = strchr(addr, ']');
        if (rb == NULL || rb[1] != ':') {
            return UV_EINVAL;
        }
        hlen = (size_t)(rb - addr - 1);
        if (hlen == 0 || hlen >= sizeof(host)) {
            return UV_EINVAL;
        }
        memcpy(host, addr + 1, hlen);
        port_s = rb + 2;
    } else {
        colon = strrchr(addr, ':');
        if (colon == NULL) {
            return UV_EINVAL;
        }
        hlen = (size_t)(colon - addr);
        if (hlen >= sizeof(host)) {
            return UV_EINVAL;
        }
        memcpy(host, addr, hlen);
        port_s = colon + 1;
        if (hlen == 0) {
            memcpy(host, "0.0.0.0", 8);
            hlen = 7;
        }
    }
    host[hlen] = '\0';
    if (port_s[0] == '\0' || strlen(port_s) > 5) {
        return UV_EINVAL;
    }
    for (const char *p = port_s; *p != '\0'; p++) {
        if (*p < '0' || *p > '9') {
            return UV_EINVAL;
        }
        port = port * 10 + (*p - '0');
    }
    if (port > 65535) {
        return UV_EINVAL;
    }
    memset(ss, 0, sizeof(*ss));
    if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ss) == 0 ||
        uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)ss) == 0) {
        return 0;
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || res == NULL) {
        return UV_EADDRNOTAVAIL;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    if (ss->ss_family == AF_INET) {
        ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
    } else {
        ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
    }
    freeaddrinfo(res);
    return 0;
}

/* Formats the listener's real address ("127.0.0.1:43817", "[::1]:8080"). */
static int format_bound_addr(uv_tcp_t *listener, char *out, size_t outsz) {
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    char ip[INET6_ADDRSTRLEN];
    int rc = uv_tcp_getsockname(listener, (struct sockaddr *)&ss, &len);

    if (rc != 0) {
        return rc;
    }
    if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
        uv_ip6_name(a, ip, sizeof(ip));
        snprintf(out, outsz, "[%s]:%u", ip, (unsigned)ntohs(a->sin6_port));
    } else {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
        uv_ip4_name(a, ip, sizeof(ip));
        snprintf(out, outsz, "%s:%u", ip, (unsigned)ntohs(a->sin_port));
    }
    return 0;
}

/* ---------------------------------------------------------- start/stop -- */

/* The listener of a start that failed after uv_tcp_init closed: the
 * server can go. */
static void start_failed_closed(uv_handle_t *handle) {
    struct hub_http *http = handle->data;
    http_ingest_slots_unref(http->ingest);
    free(http);
}

/*
 * A client that hangs up while we answer makes write(2) fail with EPIPE —
 * and raise SIGPIPE, whose default action kills the process.  libuv does not
 * suppress it (h2o's own server ignores it in main), so the listener does,
 * before its first socket exists.  Process-wide, but nothing in the hub
 * wants SIGPIPE: libpq and libcurl already guard their own writes.
 */
static int ignore_sigpipe(void) {
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGPIPE, &sa, NULL) == 0 ? 0 : UV_EINVAL;
}

/* Steps: SIGPIPE ignored, the address parsed, the listener bound and
 * listening (so a port in use fails the start, with its address logged),
 * then h2o's configuration, the limits and the context. */
int hub_http_start(struct hub *hub, struct hub_http **out) {
    struct sockaddr_storage ss;
    struct hub_http *http;
    h2o_hostconf_t *host;
    h2o_pathconf_t *path;
    struct http_handler *handler;
    const char *addr = hub->cfg.http_listen_addr;
    int rc;

    if (ignore_sigpipe() != 0) {
        hub_log(HUB_ERROR, "cannot ignore SIGPIPE");
        return UV_EINVAL;
    }
    rc = parse_listen_addr(addr, &ss);
    if (rc != 0) {
        hub_log(HUB_ERROR, "invalid STREAMING_HUB_HTTP_LISTEN_ADDR (want host:port)",
                HUB_LS("addr", addr), HUB_LS("error", uv_strerror(rc)));
        return rc;
    }
    http = calloc(1, sizeof(*http));
    if (http == NULL) {
        return UV_ENOMEM;
    }
    http->hub = hub;
    rc = uv_tcp_init(hub->loop, &http->listener);
    if (rc != 0) {
        goto fail_free;
    }
    http->listener.data = http;
    rc = uv_tcp_bind(&http->listener, (const struct sockaddr *)&ss, 0);
    if (rc != 0) {
        goto fail_close;
    }
    /* libuv reports some bind errors (EADDRINUSE) only here */
    rc = uv_listen((uv_stream_t *)&http->listener, HTTP_BACKLOG, on_accept);
    if (rc != 0) {
        goto fail_close;
    }
    rc = format_bound_addr(&http->listener, http->bound_addr, sizeof(http->bound_addr));
    if (rc != 0) {
        goto fail_close;
    }

    /* Nothing below can fail short of h2o aborting on OOM, but the limits'
     * table. */
    h2o_config_init(&http->config);
    http->config.server_name = h2o_iovec_init(H2O_STRLIT("streaming-hub/" HUB_VERSION));
    /* HTTP/1.1 only.  h2o 2.2 keeps an HTTP/2 stream's body out of the
     * connection's input, where the body budget counts (http_limits.c),
     * up to the body limit for each of 100 streams a connection, decodes
     * header blocks of 400 KB into any number of headers, and refuses a
     * body too large with a reset instead of 413: without a key, one
     * connection held 60 MB (docs/configuration.md).  HTTP/2 to clients
     * is a TLS-terminating proxy's job in front of the hub. */
    http->config.http1.upgrade_to_http2 = 0;
    /* h2o answers 413 itself, before reading a body past this size; the
     * limits lower it to the room left before every loop turn */
    http->config.max_request_entity_size = hub_api_events_max_body(&hub->cfg);
    /* one host, one path: every request reaches on_req, which routes; the
     * host's fallback path only sees h2o's own refusals (http_limits.c) */
    host = h2o_config_register_host(&http->config, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    path = h2o_config_register_path(host, "/", 0);
    handler = (struct http_handler *)h2o_create_handler(path, sizeof(*handler));
    handler->super.on_req = on_req;
    handler->http = http;
    if (http_limits_init(http, host, path) != 0) {
        h2o_config_dispose(&http->config);
        rc = UV_ENOMEM;
        goto fail_close;
    }
    h2o_context_init(&http->ctx, hub->loop, &http->config);
    http->accept_ctx.ctx = &http->ctx;
    http->accept_ctx.hosts = http->config.hosts;
    uv_timer_init(hub->loop, &http->reap[0]);
    uv_timer_init(hub->loop, &http->reap[1]);
    uv_timer_init(hub->loop, &http->drain_check);
    http->reap[0].data = http->reap[1].data = http->drain_check.data = http;

    hub_log(HUB_INFO, "http listening", HUB_LS("addr", http->bound_addr));
    *out = http;
    return 0;

fail_close:
    hub_log(HUB_ERROR, "cannot listen for HTTP", HUB_LS("addr", addr),
            HUB_LS("error", uv_strerror(rc)));
    /* the handle is live in the loop: free the server from its close callback */
    uv_close((uv_handle_t *)&http->listener, start_failed_closed);
    return rc;
fail_free:
    http_ingest_slots_unref(http->ingest);
    free(http);
    return rc;
}

/* The second reap timer closed: every handle h2o closed before it has
 * finished, nothing refers to the server any more. */
static void reap_last_closed(uv_handle_t *handle) {
    struct hub_http *http = handle->data;
    http_ingest_slots_unref(http->ingest);
    free(http);
}

/* The first reap timer closed: one more close round before the free. */
static void reap_first_closed(uv_handle_t *handle) {
    struct hub_http *http = handle->data;
    uv_close((uv_handle_t *)&http->reap[1], reap_last_closed);
}

/*
 * Disposes of h2o once the listener and every connection are closed.  Runs
 * from close callbacks only, which matters: h2o_context_dispose() runs the
 * loop once (UV_RUN_NOWAIT) to finish its own handles, and a nested run is
 * harmless from the closing phase, unlike from an I/O callback.
 */
static void http_maybe_finish(struct hub_http *http) {
    if (!http->listener_closed || http->n_conns > 0 || http->disposed) {
        return;
    }
    http->disposed = 1;
    h2o_context_dispose(&http->ctx);
    h2o_config_dispose(&http->config);
    uv_close((uv_handle_t *)&http->reap[0], reap_first_closed);
}

/* The listener closed: h2o may go once the last connection has too. */
static void listener_closed(uv_handle_t *handle) {
    struct hub_http *http = handle->data;
    http->listener_closed = 1;
    http_maybe_finish(http);
}

void hub_http_stop(struct hub_http *http) {
    if (http == NULL || http->stopping) {
        return;
    }
    http->stopping = 1;
    uv_timer_stop(&http->drain_check);
    uv_close((uv_handle_t *)&http->drain_check, NULL);
    http_limits_stop(http);
    uv_close((uv_handle_t *)&http->listener, listener_closed);
    /* No h2o_context_request_shutdown(): its HTTP/2 grace timer would still be
     * linked when the context is disposed of.  Shutting the sockets down makes
     * h2o see EOF (idle or reading) or a write error (answering) and close
     * each connection itself; a request still waiting on the database learns
     * it is gone through its pool dispose callback (api_util.c). */
    for (struct http_conn *c = http->conns; c != NULL; c = c->next) {
        uv_os_fd_t fd;
        if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0) {
            shutdown(fd, SHUT_RDWR);
        }
    }
    hub_log(HUB_INFO, "http stopping", HUB_LI("connections", (int64_t)http->n_conns));
}

/* ----------------------------------------------------------- the drain -- */

/* Still owed an answer: a request routed and not disposed of, a connection
 * with bytes of a request not yet routed (its head or body arriving), an
 * ingest transaction of a client that hung up; or clients still arriving
 * (HTTP_DRAIN_QUIET_NS). */
static int drain_busy(const struct hub_http *http) {
    if (http->inflight > 0 || !hub_ingest_queue_idle(http->hub) ||
        hub_now_ns() - http->last_arrival_ns < HTTP_DRAIN_QUIET_NS) {
        return 1;
    }
    for (const struct http_conn *c = http->conns; c != NULL; c = c->next) {
        if (c->sock != NULL && c->sock->input != NULL && c->sock->input->size > 0) {
            return 1;
        }
    }
    return 0;
}

/* The drain's timer: calls the waiter once nothing is owed an answer. */
static void drain_check_cb(uv_timer_t *t) {
    struct hub_http *http = t->data;
    void (*cb)(void *) = http->drained_cb;

    if (cb == NULL || drain_busy(http)) {
        return;
    }
    uv_timer_stop(t);
    http->drained_cb = NULL;
    hub_log(HUB_INFO, "http drained", HUB_LI("connections", (int64_t)http->n_conns));
    cb(http->drained_arg);
}

void hub_http_drain(struct hub_http *http) {
    if (http == NULL || http->draining) {
        return;
    }
    /* from here on_req refuses what is new, and the routes' filter
     * (http_limits.c) closes the connection after every answer */
    http->draining = 1;
    http->last_arrival_ns = hub_now_ns(); /* a quiet period from now */
    hub_log(HUB_INFO, "http draining: new requests are answered 503",
            HUB_LI("in_flight", (int64_t)http->inflight),
            HUB_LI("connections", (int64_t)http->n_conns));
}

void hub_http_when_drained(struct hub_http *http, void (*cb)(void *arg), void *arg) {
    hub_http_drain(http);
    http->drained_cb = cb;
    http->drained_arg = arg;
    /* looked at on a timer: the things waited for end in h2o's and the
     * pools' callbacks, none of which is ours to hook */
    uv_timer_start(&http->drain_check, drain_check_cb, 0, HTTP_DRAIN_CHECK_MS);
}

void hub_http_figures(const struct hub_http *http, struct hub_metrics_gauges *g) {
    if (http == NULL) {
        return;
    }
    g->http_connections = (int64_t)http->n_conns;
    g->http_body_bytes = (int64_t)http->body_bytes;
    g->http_ingest_requests = (int64_t)http->ingest->live;
}
