/*
 * http — the HTTP listener (libh2o on the hub's libuv loop): operations
 * endpoints (/healthz, /readyz, /metrics) and the JSON API (SPEC §9), with
 * the limits that keep one client from taking the process (connections,
 * request bodies held, HTTP ingest requests in progress) and the drain.
 */
#ifndef HUB_HTTP_H
#define HUB_HTTP_H

struct hub;
struct hub_http;
struct http_ingest_hold;
struct hub_metrics_gauges;

/*
 * Binds hub->cfg.http_listen_addr ("host:port", IPv4 or [IPv6]) and starts
 * serving on hub->loop.  Returns 0 and stores the server in *out, or a
 * negative libuv error code (logged) when the address cannot be bound.
 * The server borrows hub until hub_http_stop().
 */
int hub_http_start(struct hub *hub, struct hub_http **out);

/* Stops accepting, closes the listener and every connection, frees the server
 * once libuv has closed all handles.  Requests waiting on the database are
 * abandoned safely (their callbacks see the request is gone). */
void hub_http_stop(struct hub_http *http);

/*
 * Starts the drain (SIGTERM): /readyz says so, every new request but the
 * operations endpoints is answered 503 with Retry-After, and every answer
 * closes its connection; the listener stays open.  Safe twice.
 */
void hub_http_drain(struct hub_http *http);

/*
 * Drains (hub_http_drain) and calls cb(arg) once, on the loop, when nothing
 * is owed an answer any more: no request in flight, no request partly
 * received, no HTTP ingest transaction running (of a client that hung up),
 * and no connection or request arrived for the last 250 ms.
 * The caller then stops the server and closes the pools; its drain
 * deadline bounds the wait.
 */
void hub_http_when_drained(struct hub_http *http, void (*cb)(void *arg), void *arg);

/* Fills the listener's gauges of g (connections, body bytes held, HTTP
 * ingest requests in progress); http may be NULL. */
void hub_http_figures(const struct hub_http *http, struct hub_metrics_gauges *g);

/* The "host:port" the HTTP listener is bound to (the real port when the
 * configuration asked for port 0), e.g. "127.0.0.1:8080" or "[::1]:8080".
 * Borrowed from the server; valid until hub_http_stop(). */
const char *hub_http_bound_addr(const struct hub_http *http);

/*
 * The HTTP ingest slot of the request being routed (NULL when it holds
 * none: not an ingest request, or http NULL), held until
 * hub_http_ingest_release.  A call whose work outlives its request keeps
 * the slot it was admitted with: a client that hangs up does not give
 * back a slot its events still take in the
 * ingest queue (STREAMING_HUB_INGEST_HTTP_QUEUE and a key's half of it).
 * Safe to release after the server is gone.
 */
struct http_ingest_hold *hub_http_ingest_hold(struct hub_http *http);
void hub_http_ingest_release(struct http_ingest_hold *h);

#endif
