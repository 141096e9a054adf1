/*
 * breaker — circuit breakers per (tenant, destination origin) (SPEC §7.6).
 *
 * One breaker per pair, created on the first reported outcome, kept in a hash
 * table owned by the dispatcher of one process (breaker state is per process).
 *
 *   closed     attempts go through; outcomes are counted.  It trips (opens)
 *              after `consecutive_failures` failures in a row, or when at
 *              least `min_attempts` attempts in the last `window_ms` failed
 *              at a rate >= `failure_ratio`.
 *   open       due jobs are shed: rescheduled to the probe time, with no
 *              attempt and no attempt counted.
 *   half_open  the open time has elapsed and exactly one probe attempt is in
 *              flight; everything else is still shed.  Probe success closes
 *              the breaker (the open time goes back to `open_ms`); probe
 *              failure re-opens it for twice the previous open time, at most
 *              `open_max_ms`.
 *
 * Pure code: the caller passes the time (a monotonic clock in ms); no I/O, no
 * global state.  Not thread-safe: one loop thread owns a struct hub_breakers.
 *
 * Memory is bounded: each breaker is O(1) (a ring of 60 buckets spanning the
 * window) and the table holds at most `max_breakers` of them.  Breakers
 * nobody uses are forgotten (see hub_breakers_list()); when the table is full
 * the idle closed ones are evicted, and if none is idle a new pair is simply
 * not tracked (its checks answer ALLOW) rather than growing without bound.
 */
#ifndef HUB_BREAKER_H
#define HUB_BREAKER_H

#include <stddef.h>
#include <stdint.h>

#define HUB_BREAKERS_DEFAULT_MAX 10000

struct hub_breaker_cfg {
    int consecutive_failures; /* trip after this many failures in a row (>= 1) */
    double failure_ratio;     /* trip at failures/attempts >= this, in (0, 1] */
    int min_attempts;         /* ... over at least this many attempts (>= 1) */
    int64_t window_ms;        /* ... within this sliding window (1 ms .. 30 days),
                                 measured to 1/60 of itself */
    int64_t open_ms;          /* first open time (>= 1 ms) */
    int64_t open_max_ms;      /* cap of the doubling (open_ms .. 30 days); also how
                                 long a probe may stay unreported before it counts
                                 as lost */
    size_t max_breakers;      /* table cap; 0 means HUB_BREAKERS_DEFAULT_MAX */
};

/* SPEC §2.2 defaults: 5, 0.5, 20, 60s, 30s, 10m. */
#define HUB_BREAKER_CFG_DEFAULT                                                                    \
    { 5, 0.5, 20, 60000, 30000, 600000, 0 }

enum hub_breaker_verdict {
    HUB_BREAKER_ALLOW = 0, /* closed: attempt, then report the outcome */
    HUB_BREAKER_PROBE = 1, /* the one half-open probe: attempt, then report the outcome */
    HUB_BREAKER_SHED = 2,  /* do not attempt; reschedule the job to *retry_at_ms */
};

struct hub_breakers;

/* Called by hub_breakers_list() for each open or half-open breaker; the
 * strings are borrowed for the duration of the call.  state is "open" or
 * "half_open"; retry_at_ms is when shed jobs are due again. */
typedef void (*hub_breakers_list_cb)(void *arg, const char *tenant, const char *origin,
                                     const char *state, int64_t opened_at_ms, int64_t retry_at_ms,
                                     int consecutive_failures);

/*
 * Creates an empty table.  cfg is copied (NULL means the defaults).  Returns
 * owned memory (release with hub_breakers_free()), or NULL when cfg is out of
 * the ranges documented above or memory runs out.
 */
struct hub_breakers *hub_breakers_new(const struct hub_breaker_cfg *cfg);

/* Frees the table and every breaker; NULL is fine. */
void hub_breakers_free(struct hub_breakers *b);

/*
 * Decides whether a due job for (tenant, origin) may be attempted at now_ms.
 * tenant and origin are borrowed for the call (origin as hub_url.origin).
 *
 * ALLOW when the pair is closed or unknown.  PROBE exactly once per open
 * period, when the open time has elapsed: the breaker turns half-open and
 * the caller must report that attempt's outcome.  SHED otherwise, with
 * *retry_at_ms (when not NULL) set to a time > now_ms at which to try again:
 * the probe time while open, now + open_ms while a probe is in flight.  For
 * ALLOW and PROBE *retry_at_ms is set to now_ms.
 *
 * If a probe's outcome is never reported (a worker died), another probe is
 * let through once open_max_ms have passed since it started.
 */
enum hub_breaker_verdict hub_breaker_check(struct hub_breakers *b, const char *tenant,
                                           const char *origin, int64_t now_ms,
                                           int64_t *retry_at_ms);

/*
 * 1 when hub_breaker_check() at now_ms would answer SHED, without its side
 * effects (a probe due is not handed out): the claim asks it of a lane it
 * may take more jobs of than its cap allows, since shed jobs hold no slot.
 */
int hub_breaker_sheds(const struct hub_breakers *b, const char *tenant, const char *origin,
                      int64_t now_ms);

/*
 * Records the outcome (success non-zero) of an attempt to (tenant, origin)
 * made under ALLOW or PROBE (probe non-zero: the attempt PROBE let
 * through).  Borrowed strings are copied when the pair is new.  While
 * closed this may trip the breaker; while half-open the probe's outcome
 * closes or re-opens it; any other report while half-open or open (an
 * attempt that started before the trip) only updates the consecutive-failure
 * count.
 */
void hub_breaker_report(struct hub_breakers *b, const char *tenant, const char *origin, int success,
                        int probe, int64_t now_ms);

/*
 * Gives back a PROBE whose attempt never reached the destination (a policy
 * error, secrets that do not open, a request the HTTP client refused): the
 * destination told nothing, so the breaker goes back to open with its probe
 * due at once, and the next due job probes.  Anything else is left alone.
 */
void hub_breaker_release(struct hub_breakers *b, const char *tenant, const char *origin,
                         int64_t now_ms);

/*
 * Calls cb for every open and half-open breaker (for GET /admin/breakers),
 * in no particular order, and returns how many there were.  Before listing
 * it forgets breakers that hold no information (closed, no failure streak,
 * idle for 2 windows) and open ones nobody has checked or reported for
 * 2 windows + open_max_ms (their jobs are gone), so the list and the
 * gauge never show breakers nobody is waiting on.  cb may be NULL.
 */
size_t hub_breakers_list(struct hub_breakers *b, int64_t now_ms, hub_breakers_list_cb cb,
                         void *arg);

/* Number of open and half-open breakers (the streaming_hub_breakers_open
 * gauge), after the same forgetting as hub_breakers_list(). */
size_t hub_breakers_open_count(struct hub_breakers *b, int64_t now_ms);

/* The same count without the forgetting (constant time, may count breakers
 * a sweep would forget): for callers on a hot path that only need to know
 * whether there are none or few. */
size_t hub_breakers_open_hint(const struct hub_breakers *b);

/* Keeps tag (the caller's, e.g. an id of the origin) with the pair's
 * breaker, if it has one; hub_breakers_each_open hands it back. */
void hub_breaker_tag(struct hub_breakers *b, const char *tenant, const char *origin, int64_t tag);

typedef void (*hub_breakers_open_cb)(void *arg, const char *tenant, const char *origin,
                                     int64_t tag);

/*
 * Calls cb for the open and half-open breakers that were given a tag
 * (hub_breaker_tag; any value), at most per_tenant of each tenant, without
 * forgetting anything.  A hot path: it visits the tenants with open
 * breakers, and of each at most 2 * per_tenant (untagged ones are passed
 * over within that).  Returns how many it called cb for.
 */
size_t hub_breakers_each_open(const struct hub_breakers *b, size_t per_tenant,
                              hub_breakers_open_cb cb, void *arg);

#endif
