/*
 * api_events_int — what the two halves of the events API share (internal:
 * api_events.c, the ingest route, and api_events_pull.c, the pull routes).
 */
#ifndef HUB_API_EVENTS_INT_H
#define HUB_API_EVENTS_INT_H

#include <h2o.h>

struct hub;
struct hub_buckets;

/*
 * Charges `cost` tokens of a tenant's cluster-wide limit (rate per second,
 * burst; cluster.h hub_cluster_take) in *table.  Returns 0 when admitted,
 * else the whole seconds to wait for Retry-After (1 to a day).
 */
int hub_events_rate_take(struct hub *hub, struct hub_buckets **table, const char *tenant,
                         double rate, double burst, double cost);

/* Answers 429 with "Retry-After: wait" and detail. */
void hub_events_send_over_rate(h2o_req_t *req, int wait, const char *detail);

#endif
