/*
 * api_subs — the tenant API of subscriptions and deliveries (SPEC §6, §9).
 *
 * Routes (tenant API key, "Authorization: Bearer shk_…", on every one):
 *
 *   POST   /v1/subscriptions                    create (201, secret shown once)
 *   GET    /v1/subscriptions                    list, by id, paginated
 *   GET    /v1/subscriptions/{id}               one
 *   PATCH  /v1/subscriptions/{id}               update writable members
 *   DELETE /v1/subscriptions/{id}               204
 *   POST   /v1/subscriptions/{id}/verify        synchronous probe
 *   POST   /v1/subscriptions/{id}/rotate-secret new secret, previous one kept for a grace
 *   POST   /v1/subscriptions/{id}/replay        new jobs for stored events (202)
 *   GET    /v1/subscriptions/{id}/deliveries    jobs, newest first, ?state=
 *   GET    /v1/deliveries/{id}                  a job with its attempts
 *   POST   /v1/deliveries/{id}/redeliver        a dead job becomes due again
 *
 * Another tenant's object is 404; every POST honours Idempotency-Key (24h,
 * scope "tenant:<tenant id>").  Verification is a gate (SPEC §6): replay
 * and redeliver on a subscription that is not verified are 409.  The
 * implementation is split by resource; api_subs_internal.h says which file
 * does what.
 */
#ifndef HUB_API_SUBS_H
#define HUB_API_SUBS_H

#include <h2o.h>

struct hub;

/*
 * Answers a request whose path is under /v1/subscriptions or /v1/deliveries
 * and returns 1 (the answer may be sent later, from a database, DNS or
 * probe callback); returns 0 without touching req for any other path.
 * Authentication comes first: an unknown key is 401 whatever the path and
 * method.  Borrows hub and req.
 */
int hub_api_subs_handle(struct hub *hub, h2o_req_t *req);

#endif
