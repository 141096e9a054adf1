/*
 * dispatch — the delivery engine (SPEC §7): claims due jobs in batches with a
 * lease (FOR UPDATE SKIP LOCKED, tenants interleaved), makes exactly one
 * signed attempt per claim through httpc, and records outcomes in batches:
 * attempts, retries on the full-jitter curve, dead letters, 410 disables,
 * failure streaks and auto-disable, circuit-breaker shedding, and the
 * reclaim of expired leases (poison after STREAMING_HUB_POISON_THRESHOLD).
 *
 * Runs on the hub's loop; several processes may dispatch from one database.
 * The parts (claim, attempt, outcome) and who owns a job at each step:
 * dispatch_int.h; the SQL: store_dispatch.h.
 */
#ifndef HUB_DISPATCH_H
#define HUB_DISPATCH_H

#include <stddef.h>
#include <stdio.h>

struct hub;
struct hub_dispatch;

/* Starts claiming.  Returns 0 and stores *out, or HUB_ENOMEM (error.h;
 * logged).  Borrows hub until the stop's done_cb. */
int hub_dispatch_start(struct hub *hub, struct hub_dispatch **out);

/*
 * The drain began: stops claiming (and taking jobs from ingest
 * transactions) and releases the leases of claimed jobs not attempted yet
 * without counting a reclaim.  Attempts in flight go on; the dispatcher
 * stays until hub_dispatch_stop.  A second call does nothing.
 */
void hub_dispatch_quiesce(struct hub_dispatch *d);

/*
 * hub_dispatch_quiesce, then lets attempts in flight finish (their outcomes
 * are written), then frees everything and calls done_cb on the loop.
 */
void hub_dispatch_stop(struct hub_dispatch *d, void (*done_cb)(void *arg), void *arg);

/*
 * New jobs were stored (this process's ingest committed a batch): claim now
 * rather than at the next idle poll.  Other processes find them by polling
 * (every 50 ms when idle).  NULL is a no-op.
 */
void hub_dispatch_kick(struct hub_dispatch *d);

/*
 * sub_id's row changed or is gone (committed): the API's PATCH or DELETE
 * calls it before answering, and every dispatcher hears it from the others
 * (HUB_SUBS_CHANGED_CHANNEL, store_subs.h).  None of its jobs this process
 * holds (queued, or leased by a claim or offer made before this
 * call) starts an attempt with what was read before.  Queued ones go back
 * unattempted now (pending at once: the next claim reads the subscription
 * again, or they stay parked where the change parked them), the others
 * when they reach the send.  sub_id NULL: every subscription (the
 * listening session was lost).  NULL d is a no-op.
 */
void hub_dispatch_subscription_changed(struct hub_dispatch *d, const char *sub_id);

/* Attempts in flight (gauge). */
size_t hub_dispatch_inflight(const struct hub_dispatch *d);

/* Lists open/half-open breakers as a JSON array text (malloc'd) for
 * GET /admin/breakers. */
char *hub_dispatch_breakers_json(struct hub_dispatch *d);

/* Open and half-open breakers (gauge). */
size_t hub_dispatch_breakers_open(struct hub_dispatch *d);

/* Writes the per-destination metrics (attempts in flight, adaptive cap,
 * time jobs waited for a slot; the busiest origins by name, the rest as
 * "other") to out, for GET /metrics.  NULL (no dispatcher) writes nothing. */
void hub_dispatch_metrics_render(const struct hub_dispatch *d, FILE *out);

/* ------------------------------------------------------------ fast path -- */

/*
 * The fast path (dispatch_fast.c): in a process that ingests and
 * dispatches, the ingest transaction leases the jobs this dispatcher can
 * start now and hands them over with the event it holds.
 *
 * Per ingest transaction that inserts events (records of them):
 * hub_dispatch_fast_offer() before it is sent fills *p (always initialised; its arrays then go with
 * the statement, store_ingest.h) and returns the offer owned (NULL: nothing
 * is offered, p leases nothing); once the transaction ended, exactly one of
 * hub_dispatch_ingested() (it committed) or hub_dispatch_fast_drop() (it
 * failed, or its outcome is unknown) takes the offer back.  d may be NULL
 * (no dispatcher in this process).  An offer keeps a stopping dispatcher
 * alive until it is taken back.
 */
struct hub_dispatch_fast;
struct hub_store_ingest_fast;
struct hub_event;
struct pg_result;

struct hub_dispatch_fast *hub_dispatch_fast_offer(struct hub_dispatch *d, size_t records,
                                                  struct hub_store_ingest_fast *p);

/* The transaction failed: nothing it leased exists.  Takes f (NULL is a
 * no-op). */
void hub_dispatch_fast_drop(struct hub_dispatch_fast *f);

/*
 * The transaction committed; res is the insert statement's result
 * (borrowed, NULL when it had none).  Each leased job's row becomes a job
 * queued for an attempt, its event read through event_of(arg, ord) (the
 * record's event, borrowed for the call: its bytes are copied); jobs left
 * pending wake the claim (hub_dispatch_kick).  Takes f (may be NULL).
 */
void hub_dispatch_ingested(struct hub_dispatch *d, struct hub_dispatch_fast *f,
                           struct pg_result *res,
                           const struct hub_event *(*event_of)(void *arg, int ord), void *arg);

#endif
