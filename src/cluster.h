/*
 * cluster — which hub processes share one database, so that the limits
 * SPEC §13 says "hold across all processes of a deployment" do: the pull
 * rate (STREAMING_HUB_PULL_RATE/BURST) and tenants' ingest quotas
 * (quotas.ingest_rate/burst).
 *
 * The split: each `serve` process upserts its row in hub_processes every
 * STREAMING_HUB_CLUSTER_HEARTBEAT and counts the rows seen within
 * STREAMING_HUB_CLUSTER_MEMBER_TIMEOUT: N.  It charges its own token
 * buckets (bucket.h) at rate/N with burst/N (at least one token), so with
 * requests spread evenly over the processes (a round-robin load balancer)
 * a tenant gets the configured rate plus one burst in all.  No request
 * waits on the database for it.
 *
 * A process joins before it serves (its first heartbeat is part of the
 * start), so it never admits more than its share.  While membership
 * changes the split lags by up to one heartbeat: the processes already
 * there admit at rate/N_old until they see the new one
 * (briefly up to (N+1)/N of the rate); one that stops cleanly deletes its
 * row (the others see N-1 within a heartbeat); one that crashes counts
 * until its row ages out (up to the member timeout, the others admit
 * (N-1)/N of the rate meanwhile).  A process that cannot reach the
 * database keeps the last N it knew.  Requests that do not spread evenly
 * (sticky clients) get less than the rate: a process never admits more
 * than its share.
 *
 * Loop thread only.  The state hangs off struct hub (hub->cluster).
 */
#ifndef HUB_CLUSTER_H
#define HUB_CLUSTER_H

#include <libpq-fe.h>

struct hub;
struct hub_buckets;

/* Joins before the process serves: upserts its row and counts the live
 * processes on `conn` (the start-up connection, blocking), so that the
 * first request is already charged at the deployment's share.  Returns 0,
 * or -1 (logged) when the database refuses: the start then fails, as for
 * any other start-up statement. */
int hub_cluster_join(struct hub *hub, PGconn *conn);

/* Once the loop's pools exist: the heartbeat every
 * STREAMING_HUB_CLUSTER_HEARTBEAT on a connection of its own, the first one
 * period after the join. */
void hub_cluster_start(struct hub *hub);

/* At shutdown: deletes this process's row (within 2 s, or not at all when
 * the database does not answer: the row then ages out), then closes the
 * connection and frees the state.  Safe when never started. */
void hub_cluster_stop(struct hub *hub);

/* Live processes, this one included (>= 1). */
int hub_cluster_size(const struct hub *hub);

/* Live processes that deliver (roles all and delivery), this one included
 * (>= 1): a subscription's max_rate is shared by them (dispatch_attempt.c). */
int hub_cluster_dispatchers(const struct hub *hub);

/*
 * Charges `cost` tokens of a cluster-wide limit (`rate` per second, `burst`
 * at once, for the whole deployment) to key's bucket in *table: the bucket
 * runs at this process's share, rate/N and max(1, burst/N).  Returns 0 when
 * admitted, else the seconds until a token is there (hub_bucket_take).
 */
double hub_cluster_take(struct hub *hub, struct hub_buckets **table, const char *key, double rate,
                        double burst, double cost);

#endif
