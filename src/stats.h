/*
 * stats — per-tenant figures (SPEC §10, GET /v1/stats): what happened to a
 * tenant's events, counted where each verdict or outcome is decided, by
 * tenant, hour, source and event type.
 *
 * Counting is in memory (a small hash of (tenant, hour, source, event
 * type) → counters): a hook costs a hash lookup and an add, never a
 * database round trip.  Every STREAMING_HUB_STATS_FLUSH_INTERVAL the
 * counts gathered since the last write are added to tenant_stats_hourly
 * (migration 0012) with one upsert over arrays, on a connection of the
 * module's own; an hourly purge drops the hours past
 * STREAMING_HUB_STATS_RETENTION.  An answer sums at most hours x keys rows,
 * so it costs the same at 10 k and 100 M events (api_stats.h).
 *
 * Crash and failure rules: a crash loses the counts of at most one flush
 * interval.  A write that failed before it could commit (a statement
 * error, a pool that never sent it) puts its counts back for the next one;
 * a write whose outcome is unknown (the connection dropped after sending)
 * is dropped, never sent again: counts are lost rather than counted twice
 * (streaming_hub_stats_counts_lost_total).  A clean stop writes the last
 * counts.
 *
 * What each counter counts (units as SPEC §10's API says):
 *   accepted, duplicates, quarantined, dropped   events, by ingest verdict
 *       (dropped: an inactive tenant; a tenant not on the roster has no
 *       figures; a quarantined record counts for the tenant it claims)
 *   delivered   jobs whose attempt succeeded
 *   delayed     jobs put off past their due time without an attempt: over
 *               the subscription's max_rate, shed by an open breaker, or
 *               held by a destination's concurrency cap; once per deferral
 *   retried     failed attempts whose job was scheduled to try again (an
 *               attempt that ends its job dead is counted as dead only)
 *   dead        jobs that went dead after their last attempt
 *   replayed    jobs a replay created or re-armed (source and event type
 *               '': the replay statement counts jobs, not their events)
 * Sources and event types per tenant and hour are capped
 * (STATS_KEYS_PER_TENANT_HOUR in stats.c): past the cap a process counts
 * them under "(other)", so a tenant cannot grow the table without bound.
 *
 * Loop thread only.  Every hook takes `s` NULL (no stats module: a unit
 * test, or out of memory at start) and does nothing then.
 */
#ifndef HUB_STATS_H
#define HUB_STATS_H

#include <stddef.h>
#include <stdint.h>

struct hub;
struct hub_stats;
struct hub_ingest_rec;

/* The counters, in the order of the table's columns and the API's members. */
enum hub_stat {
    HUB_STAT_ACCEPTED = 0,
    HUB_STAT_DUPLICATES,
    HUB_STAT_QUARANTINED,
    HUB_STAT_DROPPED,
    HUB_STAT_DELIVERED,
    HUB_STAT_DELAYED,
    HUB_STAT_RETRIED,
    HUB_STAT_DEAD,
    HUB_STAT_REPLAYED,
    HUB_STAT__COUNT
};

/* The API member (and column) name of a counter: "accepted", ... */
const char *hub_stat_name(enum hub_stat which);

/* Starts counting: the flush and purge timers and the module's connection
 * (hub->stats).  Without memory it logs and leaves hub->stats NULL. */
void hub_stats_start(struct hub *hub);

/* At shutdown: writes what is left (within 2 s), then closes the
 * connection and frees the state.  Safe when never started. */
void hub_stats_stop(struct hub *hub);

/*
 * Adds n to counter `which` of (tenant, the current hour, source,
 * event_type).  Strings are borrowed for the call; source or event_type
 * NULL count as "".  tenant NULL is not counted.
 */
void hub_stats_add(struct hub_stats *s, const char *tenant, const char *source,
                   const char *event_type, enum hub_stat which, int64_t n);

/* ----------------------------------------------------------- the hooks -- */

/* Verdicts that are final (ingest_batch.c, as a committed transaction
 * settles each record, once per record): recs borrowed for the call. */
void hub_stats_ingest(struct hub_stats *s, const struct hub_ingest_rec *recs, size_t n);

/*
 * An attempt's outcome (dispatch_outcome.c): state as the outcome record
 * has it ("succeeded", "pending" for a retry to come, "dead").  attrs is
 * the event's stored attributes (JSON text, the source is read from it;
 * may be NULL).  All borrowed.
 */
void hub_stats_attempt(struct hub_stats *s, const char *tenant, const char *attrs,
                       const char *event_type, const char *state);

/* A job put off without an attempt (max_rate, an open breaker, a
 * destination cap); arguments as hub_stats_attempt. */
void hub_stats_delayed(struct hub_stats *s, const char *tenant, const char *attrs,
                       const char *event_type);

/* jobs created or re-armed by one replay of the tenant (api_deliveries.c). */
void hub_stats_replayed(struct hub_stats *s, const char *tenant, int64_t jobs);

#endif
