/*
 * store_stats — the SQL of per-tenant figures (stats.h, api_stats.h): the
 * rollups of tenant_stats_hourly and tenant_stats_daily (migration 0012).
 *
 * The flush takes binary arrays (pg_array.h), one element per (tenant,
 * hour, source, event type); the other statements take text parameters.
 * Results are text.  The statement objects are static and compared by
 * address by pg.c.
 */
#ifndef HUB_STORE_STATS_H
#define HUB_STORE_STATS_H

#include "pg.h"
#include "stats.h"

/*
 * The flush: adds each row's counts to its hourly rollup row and, summed
 * per UTC day, to its daily one (creating them).
 *   $1 tenant_id text[]   $2 hour int8[] (Unix hours)
 *   $3 source text[]      $4 event_type text[]
 *   $5 .. $13 int8[]      the counters, in enum hub_stat order
 * Rows of tenants not on the roster are left out.  Rows are written in key
 * order, so that flushes of several processes over the same keys lock
 * them in one order and never deadlock.  No result rows.
 */
#define HUB_STATS_FLUSH_NPARAMS (4 + HUB_STAT__COUNT)
extern const struct hub_sql hub_sql_stats_flush;

/* $1 retention (ms, int8 text): deletes the hours older than it, and the
 * days wholly older.  No rows. */
#define HUB_SQL_STATS_PURGE_NPARAMS 1
extern const struct hub_sql hub_sql_stats_purge;

/*
 * A tenant's figures over a window of whole hours.
 *   $1 tenant   $2 since, $3 until (Unix hours, int8 text: hours h with
 *   $2 <= h < $3)   $4, $5 the whole UTC days within them (Unix days, int4
 *   text: days d with $4 <= d < $5, read from the daily rollups; the hours
 *   of those days are then skipped; $4 = $5 = 0 for none)
 *   $6 group by: "source", "event_type" or NULL (no groups)
 * Rows (hub_stats_query_col), ordered by ORD: first the totals (ORD 0,
 * KEY NULL, every counter 0 when nothing was counted), then up to 100
 * groups, largest first (ORD 1..100): by the events counted at ingest
 * (accepted + duplicates + quarantined + dropped), then by the deliveries
 * (delivered + delayed + retried + dead + replayed), then by key.
 * FOUND is 1 in the totals row when the tenant is on the roster, else 0.
 */
#define HUB_SQL_STATS_QUERY_NPARAMS 6
extern const struct hub_sql hub_sql_stats_query;

enum hub_stats_query_col {
    HUB_STATS_COL_ORD = 0,
    HUB_STATS_COL_FOUND,
    HUB_STATS_COL_KEY,
    HUB_STATS_COL_COUNTERS, /* + enum hub_stat: HUB_STAT__COUNT int8 columns */
};

#endif
