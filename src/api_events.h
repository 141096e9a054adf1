/*
 * api_events — events over the tenant API: ingest in the CloudEvents HTTP
 * binding (SPEC §4) and the pull API over accepted events (SPEC §9).
 *
 * Routes (tenant API key, "Authorization: Bearer shk_…", on every one):
 *
 *   POST /v1/events         ingest: binary mode (ce-* headers, the body is
 *                           the data), structured mode
 *                           (application/cloudevents+json) or batch mode
 *                           (application/cloudevents-batch+json, 207)
 *   GET  /v1/events         ?after=<seq>&limit=&type=: the tenant's accepted
 *                           events in arrival order
 *   GET  /v1/events/{seq}   one of them
 *
 * Ingest stores through the same statement, dedup and verdicts as Kafka
 * (ingest.h hub_ingest_store) and answers only once the transaction
 * committed; a tenant with an ingest quota (api_util.h
 * hub_api_quotas_check) is charged one token per event first.  Pull requests
 * take a token from the tenant's pull bucket (STREAMING_HUB_PULL_RATE per
 * second, STREAMING_HUB_PULL_BURST) once they are found valid.  An empty
 * bucket is 429 with Retry-After.  Both limits are for the whole deployment:
 * each process charges its share (cluster.h).
 *
 * A pull page never passes an event whose lower-sequence neighbours may
 * still commit (pull_horizon.h), and holds at most
 * STREAMING_HUB_PULL_PAGE_BYTES of stored events (one larger event comes
 * alone).  Each item is a structured CloudEvent with the producer's
 * attributes as stored, plus "hubsequence" (the arrival sequence, the
 * cursor) and "event_type".
 */
#ifndef HUB_API_EVENTS_H
#define HUB_API_EVENTS_H

#include <h2o.h>

struct hub;
struct hub_config;

/* Largest number of events in one batch-mode request. */
#define HUB_INGEST_BATCH_MAX 1000

/* Largest request body of HTTP ingest: 1 MiB, or one event of
 * STREAMING_HUB_MAX_EVENT_BYTES with 64 KiB for its envelope when that is
 * more.  Every other route keeps HUB_API_MAX_BODY. */
size_t hub_api_events_max_body(const struct hub_config *cfg);

/*
 * Answers a request whose path is /v1/events or under it and returns 1 (the
 * answer may come later, from a database callback); returns 0 without
 * touching req for any other path.  Borrows hub and req.
 */
int hub_api_events_handle(struct hub *hub, h2o_req_t *req);

/*
 * The pull routes (api_events_pull.c): GET /v1/events and anything under
 * /v1/events/.  Returns 1 when it took the request (it answers, now or
 * later), 0 for the rest of /v1/events (POST, other methods).  Borrows hub
 * and req.
 */
int hub_api_events_pull_handle(struct hub *hub, h2o_req_t *req);

/* Releases the pull rate and ingest quota buckets and the pull horizon
 * (at shutdown). */
void hub_api_events_free(struct hub *hub);

#endif
