/*
 * dispatch_int — what the parts of the dispatcher share (internal: only
 * dispatch*.c include it).  dispatch.h is the public face.
 *
 * The parts, in the order a job meets them:
 *
 *   dispatch_claim.c    the lane sample, the claim and the load; the local
 *                       queue of claimed jobs, popped round-robin across
 *                       tenants by dispatch_pump(); the slots each job
 *                       holds of its destination (dispatch_caps.h)
 *   dispatch_attempt.c  one attempt: policy match, max_rate, breaker, policy
 *                       shape, the signed request, httpc; and the retry
 *                       delay of a failed one
 *   dispatch_outcome.c  outcome records, written in batches with the lease
 *                       fence; streaks, 410, auto-disable; the reclaim of
 *                       expired leases
 *   dispatch.c          start, stop and drain, kick, gauges, timers
 *
 * Who owns a job (struct job):
 *
 *   1. dispatch_claim.c makes it from a claim's rows (or a load's) and the
 *      queue (d->queue) owns it, with the slot of its destination it holds
 *      from the claim on (dispatch_caps.h; released by dispatch_job_free).
 *      Out of memory it is dropped: its lease expires and the reclaim gives
 *      it back (at least once still holds).
 *   2. dispatch_pump() pops it and either gives it back unattempted (it
 *      waited past its start budget, more of its destination's jobs wait
 *      than its run-ahead allows, or the dispatcher is stopping) or hands
 *      it to dispatch_attempt_start(), which takes it.  A job whose
 *      destination has no attempt slot free waits in the queue meanwhile.
 *   3. The attempt owns it until it ends: at once when it ends without HTTP
 *      (filtered, deferred, shed, policy error, secrets that do not open),
 *      else in httpc's callback (d->inflight counts those).  It ends by
 *      handing the job's result to dispatch_outcome.c (dispatch_job_outcome
 *      borrows the job, dispatch_job_unattempted takes it) and freeing it.
 *   4. The outcome record copies what the write needs; the job is gone by
 *      the time the record is written.  Records wait in d->outcomes, a batch
 *      (struct flush, dispatch_outcome.c) owns them while written, and a
 *      failed batch puts them back at the front.
 *
 * On stop nothing new is claimed or started; queued jobs go back to the
 * table unattempted (no reclaim counted), attempts in flight finish, a
 * claim or load in flight lands and its jobs go back too, and once every
 * outcome is written dispatch.c closes the pools and timers and frees
 * everything.
 *
 * Everything runs on the hub's loop thread.
 */
#ifndef HUB_DISPATCH_INT_H
#define HUB_DISPATCH_INT_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "dispatch.h"
#include "httpc.h"
#include "uuid.h"
#include "util.h"

struct hub;
struct hub_pg;
struct hub_breakers;
struct hub_buckets;
struct hub_caps;
struct hub_cap_lane;
struct hub_policy;
struct hub_policy_gen;

/* The longest a job is put off without an attempt (max_rate deferral), and
 * the longest delay an outcome carries to the database: the longest step a
 * retry schedule may have (SPEC §7.4). */
#define DISPATCH_DEFER_MAX_MS (10LL * 3600 * 1000)
/* What a lease must leave after an attempt's timeout for its outcome's write. */
#define DISPATCH_OUTCOME_MARGIN_MS 2000
/* Connections of the outcome pool: outcome transactions in flight at most. */
#define DISPATCH_OUT_CONNECTIONS 2

/* Wall clock in Unix ms (leases, Retry-After, breakers and logs use it). */
static inline int64_t dispatch_unix_ms(void) {
    return hub_unix_us() / 1000;
}

/* Which claim handed a job out, and when its result arrived. */
struct claim_stamp {
    int64_t ms;
    uint64_t serial; /* the lease owner is "<owner>#<serial>" */
};

/*
 * A claimed job and what its attempt needs.  Allocated in one block with
 * its text columns and the stored payload (dispatch_claim.c,
 * job_from_rows): the char pointers point into that block and are not freed
 * one by one.  Only local_excerpt and gen are owned apart, and
 * dispatch_job_free() releases them.
 */
struct job {
    struct hub_dispatch *d;
    int64_t id;
    char sub_id[40];
    char *tenant;
    char *event_id;
    char *event_type;
    char *url;
    char *content_type;
    char *attrs;                  /* event attributes (JSON text) */
    const unsigned char *payload; /* the stored event's, or the shaped body in its
                                   * attempt's context (ap), which outlives the request */
    size_t payload_len;
    char *headers_sealed;
    char *secret_sealed;
    char *prev_secret_sealed;
    int64_t schedule[HUB_RETRY_MAX_STEPS];
    size_t n_schedule;
    int schedule_malformed; /* a stored schedule that is not one: n_schedule 0 */
    int attempt_count;      /* before this attempt */
    double max_rate;        /* deliveries per second, 0 = unlimited */
    int schema_major;
    char *schema_version;       /* X-Lerian-Schema-Version (SPEC §3.5), or NULL */
    char *policy;               /* the subscription's policy name, or NULL */
    struct hub_policy_gen *gen; /* held from the attempt's start to the job's free
                                 * (SPEC §8: a job finishes on the generation it
                                 * started with) */
    struct hub_policy *pol;     /* policy in gen, NULL when not loaded */
    struct attempt_ctx *ap;     /* dispatch_attempt.c's, for a job with a policy */
    const char *local_error;    /* an attempt that failed before any HTTP */
    char *local_excerpt;        /* owned; taken by the outcome record */
    char origin[300];
    struct claim_stamp claim;
    /* the slot the job holds of its (tenant, origin) lane from its claim
     * to its free (NULL: not counted, out of memory); see dispatch_caps.h */
    struct hub_cap_lane *slot;
    int64_t origin_id;   /* the lane's origin, as the claim read it */
    int64_t due_unix_ms; /* next_attempt_at as claimed: the slot wait's start */
    uint32_t slot_epoch; /* the origin's epoch at the start (hub_caps_report) */
    int slot_started;    /* the job started: its slot counts as in flight */
    char delivery_id[HUB_UUID_TEXT_SIZE];
    int64_t started_unix_ms;
    int breaker_probe; /* the breaker let this attempt through as its probe */
};

struct outcome;    /* dispatch_outcome.c */
struct stale_sub;  /* dispatch_outcome.c */
struct url_slot;   /* dispatch_attempt.c */
struct due_tenant; /* dispatch_claim.c */

struct attempt_ctx; /* dispatch_attempt.c: the attempt of a job with a policy */

/*
 * The dispatcher.  Made and freed by dispatch.c; each group of fields below
 * belongs to the part named above it, which writes them (but for kicked and
 * tenants_dirty, which hub_dispatch_kick sets too); dispatch.c reads the
 * counters to know when a drain is over.
 */
struct hub_dispatch {
    struct hub *hub;
    char owner[96];                /* lease owner prefix: host/pid/random */
    struct hub_breakers *breakers; /* per tenant and origin (attempts, gauges) */
    struct hub_caps *caps;         /* slots per origin and per (tenant, origin) lane */

    /* dispatch.c: lifecycle */
    uv_timer_t claim_timer; /* started by dispatch_claim_soon() */
    uv_timer_t flush_timer; /* dispatch_outcome.c's batching window */
    uv_timer_t reclaim_timer;
    uv_timer_t sample_timer;
    int aux_inflight; /* reclaim and sampling queries not answered yet */
    int stopping;     /* no new work (hub_dispatch_quiesce) */
    int stop_asked;   /* hub_dispatch_stop: free once nothing is left */
    int closing;      /* dispatch_maybe_done closed the pools and timers: never twice */
    int open_handles;
    void (*done_cb)(void *arg);
    void *done_arg;

    /* dispatch_claim.c */
    struct hub_pg *pg_claim;    /* one connection: tenant samples and claims, one at a time */
    struct hub_pg *pg_load;     /* one connection: the claimed jobs' loads */
    uint64_t claim_serial;      /* the last serial taken, by a claim or a fast offer */
    uint64_t claim_sent;        /* the serial of the claim in flight, or of the last one */
    int claiming;               /* a claim or a tenant sample is in flight */
    int kicked;                 /* new jobs were stored while a claim was in flight */
    char last_tenant[260];      /* rotation point of the tenant round-robin */
    uint64_t offer_serial;      /* numbers the claims' slot bookings (hub_caps_offer) */
    char window_last[260];      /* last tenant offered to the claim in flight, "" = all were */
    struct due_tenant *tenants; /* tenants with due jobs at the last sample, by strcmp, each
                                 * with its lanes */
    size_t n_tenants;
    int64_t floors_ms;    /* when the floors were last cleared */
    int64_t tenants_ms;   /* when they were sampled */
    int tenants_dirty;    /* new jobs or a short claim since */
    size_t claim_asked;   /* the batch the claim in flight would have asked for uncapped */
    size_t claim_offered; /* ... and what its lanes' limits let it ask for */
    int claim_full;       /* the last claim came back full; the one after it leaves
                           * its lookups to the load (see claim_done) */
    int claim_partial;    /* the claim in flight passed some sampled lane over */
    int claim_dry;        /* the last claim was dry (claim_was_dry): the next one waits
                           * for its timer or a kick, not for an attempt to end */
    size_t loading;       /* claimed jobs whose load is in flight */
    /* Claimed jobs waiting for a worker: claims run ahead of the workers so
     * that none waits on the database between attempts.  Popped round-robin
     * across tenants, so a tenant's queued backlog cannot hold another's job
     * back by more than one rotation. */
    struct job **queue;
    size_t n_queue;
    size_t cap_queue;
    char pop_tenant[260]; /* the tenant popped last */

    /* dispatch_fast.c: offers to ingest transactions still in flight, and
     * the workers they may lease */
    int fast_offers;
    size_t fast_reserved;

    /* dispatch_attempt.c */
    size_t inflight;               /* attempts whose HTTP request is in flight */
    struct hub_buckets *rates;     /* max_rate buckets per subscription (SPEC §7.9) */
    struct url_slot *urls;         /* URL cache, allocated at the first attempt */
    struct attempt_ctx *spare_ctx; /* contexts of finished policy jobs, for reuse */
    size_t n_spare_ctx;
    uint64_t schedule_fallback_logged_ms; /* loop time of the last such warning */
    uint64_t ev_serial;   /* numbers each job's policy event (hub_policy_event.serial) */
    int64_t policy_log_s; /* policy failure log lines: the current second ... */
    int policy_log_n;     /* ... and how many were written in it */

    /* dispatch_outcome.c */
    struct hub_pg *pg_out;    /* outcome batches, DISPATCH_OUT_CONNECTIONS connections */
    struct outcome *outcomes; /* waiting to be written, oldest first */
    size_t n_outcomes;
    size_t cap_outcomes;
    int flushing;         /* outcome transactions in flight (at most DISPATCH_OUT_CONNECTIONS) */
    int outcomes_checked; /* hub_sql_dispatch_outcomes_checked since a duplicate attempt key */
    size_t flush_single;  /* outcomes to write one per transaction (after a batch failed) */
    /* subscriptions this process disabled, or learned changed, lately
     * (dispatch_stale_here): a table by id (n_stale notes in cap_stale
     * slots), and the note for every subscription (ms 0: none) */
    struct stale_sub *stale;
    size_t n_stale;
    size_t cap_stale;
    uint64_t stale_all_serial;
    int64_t stale_all_ms;
};

/* ------------------------------------------------------------ dispatch.c -- */

/* Once stopping, and nothing is in flight or queued any more: writes the
 * last outcomes, then closes the pools and timers and frees d (done_cb runs
 * then).  Called by every part after anything it had in flight ended; a
 * no-op until the drain is over. */
void dispatch_maybe_done(struct hub_dispatch *d);

/* ------------------------------------------------------ dispatch_claim.c -- */

/* Starts queued jobs while workers are free, then claims more (or, when
 * stopping, gives every queued job back).  Call after anything that frees a
 * worker or fills the queue. */
void dispatch_pump(struct hub_dispatch *d);

/* Runs a claim (or a tenant sample) after delay_ms on the claim timer. */
void dispatch_claim_soon(struct hub_dispatch *d, uint64_t delay_ms);

/* Gives back every queued job of sub_id (NULL: every queued job)
 * unattempted (the outcome write parks them where the subscription is no
 * longer deliverable): this process just disabled it (410, auto-disable),
 * or it changed, and no attempt may start with what was read before. */
void dispatch_queue_drop_subscription(struct hub_dispatch *d, const char *sub_id);

/* Queues j (owned by the queue from now on), naming its slot's origin
 * from its URL when the caps do not know it yet; out of memory j is freed
 * (its lease expires and it is reclaimed). */
void dispatch_queue_take(struct hub_dispatch *d, struct job *j);

/* Frees a job and what it owns (its shaped body, its local excerpt, its
 * hold on a policy generation).  NULL is not allowed. */
void dispatch_job_free(struct job *j);

/* Frees the claim side's memory (tenant sample, queue array) once stopped:
 * the queue is empty by then. */
void dispatch_claim_free(struct hub_dispatch *d);

/* What the HTTP result res of j's attempt says about its destination's load
 * goes to its origin's adaptive limit (hub_caps_report).  Borrows both;
 * the slot itself is released when j is freed. */
void dispatch_slot_report(struct hub_dispatch *d, const struct job *j,
                          const struct hub_httpc_response *res);

/* ---------------------------------------------------- dispatch_attempt.c -- */

/* Takes j and makes its attempt (or settles it without one).  The job is
 * freed, and its outcome queued, when the attempt ends: possibly before this
 * returns. */
void dispatch_attempt_start(struct hub_dispatch *d, struct job *j);

/*
 * The delay before the next attempt of a job whose attempt just failed
 * (SPEC §7.4, §8): a policy's retry function or table first, then the
 * subscription's schedule, then the default curve.  res is the HTTP result,
 * or NULL when the attempt failed before any HTTP.  Returns the delay in
 * ms, or -1 when the job is dead (*reason, static, says why).  Borrows j.
 */
int64_t dispatch_retry_delay(struct hub_dispatch *d, const struct job *j,
                             const struct hub_httpc_response *res, const char **reason);

/* Frees the attempt side's memory (URL cache, rate buckets) once stopped. */
void dispatch_attempt_free(struct hub_dispatch *d);

/* ---------------------------------------------------- dispatch_outcome.c -- */

/* Queues the outcome of j's attempt: res is its HTTP result, or NULL when
 * it failed before any HTTP (j->local_error says why; j->local_excerpt is
 * taken).  Borrows j: the caller frees it. */
void dispatch_job_outcome(struct hub_dispatch *d, struct job *j,
                          const struct hub_httpc_response *res);

/* Takes j and settles it without an attempt: state "pending" after delay_ms
 * (released, deferred, shed) or "filtered" (deleted).  Nothing is counted
 * as an attempt or a failure.  Frees j. */
void dispatch_job_unattempted(struct hub_dispatch *d, struct job *j, const char *state,
                              int64_t delay_ms);

/* The same for a job known by its id, subscription and claim serial only (a
 * claim whose jobs were never made). */
void dispatch_outcome_unattempted(struct hub_dispatch *d, int64_t id, const char *sub_id,
                                  uint64_t claim, const char *state, int64_t delay_ms);

/* A claimed job whose stored event is gone (retention dropped its day) is
 * dead, reason "expired", without an attempt: left leased, it was reclaimed
 * POISON_THRESHOLD times and ended as poison, a fifo subscription stalled
 * behind it a lease at a time. */
void dispatch_outcome_expired(struct hub_dispatch *d, int64_t id, const char *sub_id,
                              uint64_t claim);

/* 1 when this process knows j's lease is over (its claim answered more
 * than a lease ago, on this clock): its outcome will not be written. */
int dispatch_lease_past(const struct hub_dispatch *d, const struct job *j, int64_t now_ms);

/* Reports j's attempt (success non-zero) to its breaker, unless its lease is
 * past: a stale outcome feeds no breaker (a stale probe is released). */
void dispatch_breaker_report(struct hub_dispatch *d, const struct job *j, int success);

/*
 * 1 when j must not be attempted: an outcome statement of this process
 * disabled j's subscription (410, auto-disable), or it changed
 * (hub_dispatch_subscription_changed), and j was leased by a claim or a
 * fast-path offer made before the dispatcher learned it.  Such
 * a statement may have read the subscription still enabled (an ingest
 * transaction in flight at the disable commits its leased jobs after it),
 * and its jobs reach the queue after dispatch_queue_drop_subscription().
 * A job leased later was read after the disable committed.  Borrows j.
 */
int dispatch_stale_here(struct hub_dispatch *d, const struct job *j);

/* Writes up to one batch of queued outcomes now, if a connection is free. */
void dispatch_flush(struct hub_dispatch *d);

/* Gives back jobs whose lease expired (hub_sql_dispatch_reclaim), counting
 * poison ones.  On the hub's main pool; counted in d->aux_inflight. */
void dispatch_reclaim(struct hub_dispatch *d);

/* Parks the pending jobs that an ingest committed after their subscription
 * stopped being deliverable (hub_sql_dispatch_park_stragglers); on the
 * hub's main pool, counted in d->aux_inflight. */
void dispatch_park_stragglers(struct hub_dispatch *d);

/* Frees the outcome records never written, once stopped. */
void dispatch_outcome_free(struct hub_dispatch *d);

#endif
