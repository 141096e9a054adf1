/*
 * dispatch_caps — attempts in flight per destination (SPEC §7.1): a cap per
 * destination origin (scheme://host:port) across all tenants, and an
 * adaptive cap per (tenant, origin) lane that follows what the destination
 * sustains for that tenant.
 *
 * The caps bound attempts in flight; slots are counted from the claim on.
 * A claimed job holds a slot of its lane and of its origin until it ends
 * (attempted or not).  A lane may have more jobs claimed than its cap only
 * by its run-ahead: the jobs it starts within `ahead_ms` as its attempts'
 * smoothed duration says (none for a destination that has not answered or
 * answers slowly, up to the cap for a fast one), so that workers do not
 * wait for the next claim — and no claimed job waits long for its
 * destination.  The claim asks how much room each lane has
 * (hub_caps_offer) and offers the database only the lanes with room; a
 * lane at its cap is not offered and its backlog is not read.
 *
 * The limit of a lane (AIMD, like a TCP congestion window):
 *
 *   start      a new lane (or one forgotten after idling) starts at
 *              `start`, and grows by one slot per success while its slots
 *              are in use (slow start: doubling per round trip) up to
 *              `tenant_origin_max`;
 *   overload   a timeout, a refused or reset connection, a 429, 502, 503
 *              or 504 halves it (not below 1), and from then on it grows
 *              by one slot per round trip only;
 *   slow       an answer that took `slow_ms` or longer (on its way to a
 *              timeout) takes a tenth off;
 *   neutral    DNS, TLS, a blocked address, a garbled response, and the
 *              other 5xx (a 500 is the webhook's error about the request
 *              it was given, not a host out of capacity: one failing path
 *              must not throttle the tenant's healthy paths on the same
 *              host; the breaker is what answers a failing destination):
 *              nothing about load.
 *
 * A decrease counts once per round trip: only an attempt that started
 * after the last decrease can cause the next one, so a burst of failures
 * from one overload halves the limit once.
 *
 * The limit is per lane, not per origin: one origin serves many paths
 * (several tenants' webhooks on one host), and one tenant's failing or slow
 * webhook there must not throttle another tenant's deliveries to the same
 * host; an overloaded host makes every tenant's lane back off by itself.
 * Latency is judged against an absolute bound for the same reason: a slow
 * path beside a fast one is not a destination slowing down.  The origin's
 * cap (`origin_max`) is fixed: it bounds what one endpoint takes of the
 * process whatever its tenants.
 *
 * Everything is per process (SPEC §7.6 keeps breakers per process too):
 * with N hubs a destination sees up to N times the caps.
 *
 * Pure code: the caller passes the time; no I/O, no global state, one
 * thread.  Memory: an entry per origin and per lane in use, forgotten once
 * idle (hub_caps_sweep).
 */
#ifndef HUB_DISPATCH_CAPS_H
#define HUB_DISPATCH_CAPS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Origins shown by name in the metrics; the rest are summed as "other". */
#define HUB_CAPS_NAMED 10
/* The longest origin name kept ("scheme://host:port", as hub_url.origin). */
#define HUB_CAPS_NAME_MAX 300

struct hub_caps_cfg {
    int origin_max;        /* STREAMING_HUB_DISPATCH_ORIGIN_MAX (>= 1) */
    int tenant_origin_max; /* STREAMING_HUB_DISPATCH_TENANT_ORIGIN_MAX (>= 1) */
    int start;             /* STREAMING_HUB_DISPATCH_TENANT_ORIGIN_START (1 .. tenant_origin_max) */
    int64_t slow_ms;       /* STREAMING_HUB_DISPATCH_SLOW_ANSWER; 0: latency ignored */
    int64_t ahead_ms;      /* STREAMING_HUB_DISPATCH_QUEUE_AHEAD; 0: no run-ahead past a cap */
    int ahead_floor;       /* a fast destination's run-ahead may reach this even past its
                            * cap: the dispatcher's own (2 x DISPATCH_CLAIM_BATCH) */
    int tenant_max;        /* attempts in flight of one tenant over all its lanes (the
                            * workers but a reserve for the others); 0: no bound */
    int workers;           /* the dispatcher's: with tenant_max, what a tenant leaves
                            * free for the others as it starts more (hub_caps_ready) */
};

/* What an attempt's result says about its destination's load. */
enum hub_caps_signal {
    HUB_CAPS_OK,       /* an answer that is not an overload (2xx, 3xx, 4xx but 429) */
    HUB_CAPS_OVERLOAD, /* timeout, connection refused or reset, 429, 502, 503, 504 */
    HUB_CAPS_NEUTRAL,  /* nothing about load (DNS, TLS, blocked, protocol, other 5xx) */
};

/* The signal of an HTTP answer with this status. */
enum hub_caps_signal hub_caps_status_signal(long status);

struct hub_caps;
/* A (tenant, origin) lane: a held slot points to it until released. */
struct hub_cap_lane;

/* Creates an empty table (cfg copied, NULL fields clamped into range).
 * Returns it owned, or NULL when out of memory. */
struct hub_caps *hub_caps_new(const struct hub_caps_cfg *cfg);

/* Frees the table; slots still held are dropped with it.  NULL is fine. */
void hub_caps_free(struct hub_caps *c);

/*
 * Books up to `want` slots for the lane in the claim numbered `serial`:
 * returns how many the lane may still take — its cap and run-ahead, less
 * what it holds and what this claim booked for it — and as many as its
 * origin's (shared by its lanes) leave; 0 when the lane or its origin is at
 * its cap.  shed: the lane's jobs are shed without an attempt (its breaker
 * is open), so they hold no slot for long: `want` is granted and nothing
 * booked.  Out of memory, `want` is granted.  A new serial forgets the
 * bookings of the last one.
 */
int hub_caps_offer(struct hub_caps *c, const char *tenant, int64_t origin, int want,
                   uint64_t serial, int shed, int64_t now_ms);

/* 1 when the lane (or its origin) has no room left, bookings of `serial`
 * included; unknown lanes have room. */
int hub_caps_full(struct hub_caps *c, const char *tenant, int64_t origin, uint64_t serial);

/* Calls cb for every origin with no room left for tenant (the origin at its
 * cap, or the tenant's lane to it), bookings of serial included. */
void hub_caps_each_full(struct hub_caps *c, const char *tenant, uint64_t serial,
                        void (*cb)(void *arg, int64_t origin), void *arg);

/* A claimed job of the lane holds a slot (until hub_caps_release).  Returns
 * the lane, or NULL when out of memory (the job is then not counted). */
struct hub_cap_lane *hub_caps_hold(struct hub_caps *c, const char *tenant, int64_t origin,
                                   int64_t now_ms);

/*
 * Whether the held slot's job may start now: 1 when its lane's and its
 * origin's attempts in flight leave room under their caps, and its tenant
 * leaves free, after it starts, as many of the workers as it holds (at
 * most the reserve, workers - tenant_max): a tenant alone reaches
 * tenant_max, and each further tenant whose attempts hang takes at most
 * half of what those before it left, so a tenant with nothing in flight
 * finds a worker while fewer than log2(reserve) + 2 tenants hang.  A job that may
 * not waits in the local queue (its breaker sheds it: it starts anyway, it
 * makes no request) ...
 */
int hub_caps_ready(const struct hub_caps *c, const struct hub_cap_lane *l);

/* hub_caps_ready but the tenant's share of the free workers: 1 when a job
 * of the lane that may not start waits only for workers to free up (as
 * any job does while all of them are busy), not for its destination. */
int hub_caps_room(const struct hub_caps *c, const struct hub_cap_lane *l);

/* ... unless more of its lane's (or origin's) claimed jobs wait than may
 * (its run-ahead fell since the claim: the limit fell, or the attempts got
 * slower): then 1, and the job is to be given back (its slot released). */
int hub_caps_waiting_over(const struct hub_caps *c, const struct hub_cap_lane *l);

/* The held slot's job starts (due_unix_ms: since when it was due, for the
 * wait histogram); *epoch is set for hub_caps_report. */
void hub_caps_start(struct hub_caps *c, struct hub_cap_lane *l, int64_t due_unix_ms,
                    int64_t now_unix_ms, uint32_t *epoch);

/* The attempt that started under epoch ended with signal after latency_ms.
 * Moves the lane's limit (see above).  Does not release the slot. */
void hub_caps_report(struct hub_caps *c, struct hub_cap_lane *l, uint32_t epoch,
                     enum hub_caps_signal signal, int64_t latency_ms, int64_t now_ms);

/* Names the lane's origin ("scheme://host:port", as hub_url.origin; copied)
 * for the metrics and the breakers. */
void hub_caps_name(struct hub_caps *c, struct hub_cap_lane *l, const char *name);

/* Gives the slot back (started: it had started).  l may be NULL. */
void hub_caps_release(struct hub_caps *c, struct hub_cap_lane *l, int started, int64_t now_ms);

/* The name of the lane's origin, "" until hub_caps_name gave it one. */
const char *hub_caps_lane_name(const struct hub_cap_lane *l);

/* The name of an origin by id (NULL when unknown or not named yet). */
const char *hub_caps_origin_name(struct hub_caps *c, int64_t origin);

/* Current limit of a lane (the start value when unknown). */
double hub_caps_limit(struct hub_caps *c, const char *tenant, int64_t origin);

/* Attempts started and not released, and slots held, of an origin. */
void hub_caps_counts(struct hub_caps *c, int64_t origin, int *inflight, int *held);

/* Housekeeping, every few seconds: forgets lanes and origins idle and
 * holding nothing, and picks the origins the metrics show by name. */
void hub_caps_sweep(struct hub_caps *c, int64_t now_ms);

/* Writes the per-origin metrics (in flight, limit, wait histogram). */
void hub_caps_metrics_render(const struct hub_caps *c, FILE *out);

/* Calls cb for every origin with the slots it has left under its cap
 * (tenant NULL), then for every (tenant, origin) lane with what it has left
 * under its own cap (0 when its tenant is at tenant_max): the run-ahead left
 * out (rooms of 0 included).  The
 * fast path (dispatch_fast.c) leases no more there.  tenant is borrowed for
 * the call. */
void hub_caps_each_room(const struct hub_caps *c,
                        void (*cb)(void *arg, const char *tenant, int64_t origin, int room),
                        void *arg);

#endif
