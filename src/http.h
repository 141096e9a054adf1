/*
 * http — the HTTP listener (libh2o on the hub's libuv loop): operations
 * endpoints (/healthz, /readyz, /metrics) and the JSON API (SPEC §9).
 */
#ifndef HUB_HTTP_H
#define HUB_HTTP_H

struct hub;
struct hub_http;

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

/* The "host:port" the HTTP listener is bound to (the real port when the
 * configuration asked for port 0), e.g. "127.0.0.1:8080" or "[::1]:8080".
 * Borrowed from the server; valid until hub_http_stop(). */
const char *hub_http_bound_addr(const struct hub_http *http);

#endif
