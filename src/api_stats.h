/*
 * api_stats — per-tenant figures over HTTP (SPEC §9, §10):
 *
 *   GET /v1/stats?since=&until=&group_by=source|event_type   (tenant key)
 *   GET /admin/tenants/{id}/stats?since=&until=&group_by=     (admin token)
 *
 * Both answer 200 {"tenant","since","until","accepted","duplicates",
 * "quarantined","dropped","delivered","delayed","retried","dead","replayed",
 * "groups":[{"key", the same counters}]}, from the hourly rollups stats.h
 * keeps (what each counter counts is written there).
 *
 * The window: since and until are RFC 3339; counts are kept per hour, so
 * the window is the whole hours that cover [since, until): since truncated
 * to its hour, until raised to the next hour unless it is one.  until
 * defaults to now, since to 24 hours before until.  The answer gives the
 * window it used (hour-aligned, UTC).  groups is [] without group_by, else
 * at most 100 groups, largest first (store_stats.h says by what).
 *
 * Bad input is 400 problem+json naming the field (since, until, group_by:
 * malformed, or since after until); an admin's unknown tenant is 404.
 * Refusals are counted (streaming_hub_api_invalid_requests_total
 * {route="stats"}) and logged at most once a minute.
 */
#ifndef HUB_API_STATS_H
#define HUB_API_STATS_H

#include <h2o.h>

struct hub;

/* Answers /v1/stats (and paths under it: 404) and returns 1; returns 0
 * without touching req for any other path.  Borrows hub and req. */
int hub_api_stats_handle(struct hub *hub, h2o_req_t *req);

/* Answers GET /admin/tenants/{tenant}/stats for an authenticated admin
 * (api_admin.c routes it; other methods are answered there).  tenant
 * points into the path (borrowed for the call). */
void hub_api_stats_admin(struct hub *hub, h2o_req_t *req, h2o_iovec_t tenant);

#endif
