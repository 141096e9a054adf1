/*
 * bucket — token buckets keyed by a string: the pull rate and the ingest
 * quota per tenant (api_events), the max_rate per subscription (dispatch).
 *
 * A table is created on first use and grows with its keys; buckets that are
 * full again are dropped when the table is large, since a full bucket is
 * what a missing one is.  Loop thread only; no locks.
 */
#ifndef HUB_BUCKET_H
#define HUB_BUCKET_H

#include <stdint.h>

struct hub_buckets;

/*
 * Charges `cost` tokens to key's bucket in *table (the table and the
 * bucket are created on first use; a new bucket starts full) at `rate`
 * tokens per second, holding at most `burst`.  A charge is admitted while
 * the bucket holds at least one token, and may take it below zero: a batch
 * larger than the burst is admitted once and paid for by the waits of the
 * charges after it, so the average stays at the rate.  A bucket keeps the
 * rate and burst of its last charge, so a changed limit applies at once.
 *
 * Returns 0 when admitted, else the seconds (> 0) until the bucket holds
 * one token again.  Out of memory admits: a rate limit is no reason to
 * refuse service.  `now_ns` is a monotonic clock (hub_now_ns()).
 */
double hub_bucket_take(struct hub_buckets **table, const char *key, double rate, double burst,
                       double cost, uint64_t now_ns);

/*
 * hub_bucket_take of one token, for callers that come back when told (a
 * job deferred by its subscription's max_rate): refusals hand out waits
 * one token interval apart, the k-th refused waiting k intervals, rather
 * than all the same wait.  Those refused together then come back one per
 * token, instead of all at the next token with all but one refused again
 * (a backlog of n rewritten n times over).  `rate` > 0.
 */
double hub_bucket_take_queued(struct hub_buckets **table, const char *key, double rate,
                              double burst, uint64_t now_ns);

/* Frees *table and its buckets and sets *table to NULL (NULL is fine). */
void hub_buckets_free(struct hub_buckets **table);

#endif
