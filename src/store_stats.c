/*
 * store_stats — SQL texts of per-tenant figures (see store_stats.h).
 */
#include "store_stats.h"

/* The SQL below is laid out for reading as SQL. */
// clang-format off

/* The counter columns, in enum hub_stat order. */
#define STATS_COUNTERS                                                                             \
    "accepted, duplicates, quarantined, dropped, delivered, delayed, retried, dead, replayed"

/* Each column adds the new count to the stored one. */
#define STATS_ADD(c) c " = s." c " + EXCLUDED." c
#define STATS_ADD_ALL                                                                              \
    STATS_ADD("accepted") ", " STATS_ADD("duplicates") ", " STATS_ADD("quarantined") ", "          \
    STATS_ADD("dropped") ", " STATS_ADD("delivered") ", " STATS_ADD("delayed") ", "                \
    STATS_ADD("retried") ", " STATS_ADD("dead") ", " STATS_ADD("replayed")

/* u: the rows of tenants on the roster.  h adds them to their hours; the
 * main statement adds them, summed per day, to their days.  Both insert in
 * key order (see store_stats.h). */
const struct hub_sql hub_sql_stats_flush = {
    "stats_flush",
    "WITH u AS ("
    "  SELECT u.* FROM unnest($1::text[], $2::int8[], $3::text[], $4::text[], $5::int8[],"
    "                         $6::int8[], $7::int8[], $8::int8[], $9::int8[], $10::int8[],"
    "                         $11::int8[], $12::int8[], $13::int8[])"
    "       AS u(tenant_id, hour, source, event_type, c0, c1, c2, c3, c4, c5, c6, c7, c8)"
    "   WHERE EXISTS (SELECT 1 FROM tenants t WHERE t.id = u.tenant_id)"
    "), h AS ("
    "  INSERT INTO tenant_stats_hourly AS s (tenant_id, hour, source, event_type, " STATS_COUNTERS ")"
    "  SELECT tenant_id, to_timestamp(hour * 3600), source, event_type,"
    "         c0, c1, c2, c3, c4, c5, c6, c7, c8"
    "    FROM u ORDER BY tenant_id, hour, source, event_type"
    "  ON CONFLICT (tenant_id, hour, source, event_type) DO UPDATE SET " STATS_ADD_ALL
    ")"
    " INSERT INTO tenant_stats_daily AS s (tenant_id, day, source, event_type, " STATS_COUNTERS ")"
    " SELECT tenant_id, date '1970-01-01' + (hour / 24)::int AS day, source, event_type,"
    "        sum(c0), sum(c1), sum(c2), sum(c3), sum(c4), sum(c5), sum(c6), sum(c7), sum(c8)"
    "   FROM u GROUP BY tenant_id, day, source, event_type"
    "  ORDER BY tenant_id, day, source, event_type"
    " ON CONFLICT (tenant_id, day, source, event_type) DO UPDATE SET " STATS_ADD_ALL,
    0,
};

/* The indexes on hour and day make these read the expired rows only.  A
 * day goes once all of it is past the retention. */
const struct hub_sql hub_sql_stats_purge = {
    "stats_purge",
    "WITH h AS ("
    "  DELETE FROM tenant_stats_hourly WHERE hour < now() - $1::int8 * interval '1 millisecond'"
    ")"
    " DELETE FROM tenant_stats_daily"
    "  WHERE day + 1 < ((now() - $1::int8 * interval '1 millisecond') AT TIME ZONE 'UTC')::date",
    0,
};

/* Sums of the counter columns over a set of rows, in enum hub_stat order. */
#define STATS_SUMS                                                                                 \
    "sum(accepted)::int8 AS accepted, sum(duplicates)::int8 AS duplicates,"                        \
    " sum(quarantined)::int8 AS quarantined, sum(dropped)::int8 AS dropped,"                       \
    " sum(delivered)::int8 AS delivered, sum(delayed)::int8 AS delayed,"                           \
    " sum(retried)::int8 AS retried, sum(dead)::int8 AS dead, sum(replayed)::int8 AS replayed"

/* w: the window's rows, its whole days from the daily table and the
 * hours before and after them from the hourly one, each part a range of a
 * primary key (so that the generic plan of the prepared statement reads
 * nothing else: an OR of the two hour ranges made it walk every hour of
 * the tenant, 40-70 ms for 216,000 rows instead of 4); g sums them by key (one key, '', without a group_by); the totals
 * are the sum of g, and the groups the top of g.  Without a group_by the
 * groups part is empty. */
const struct hub_sql hub_sql_stats_query = {
    "stats_query",
    "WITH w AS ("
    "  SELECT source, event_type, " STATS_COUNTERS " FROM tenant_stats_daily"
    "   WHERE tenant_id = $1 AND day >= date '1970-01-01' + $4::int"
    "     AND day < date '1970-01-01' + $5::int"
    "  UNION ALL"
    "  SELECT source, event_type, " STATS_COUNTERS " FROM tenant_stats_hourly"
    "   WHERE tenant_id = $1 AND hour >= to_timestamp($2::int8 * 3600)"
    "     AND hour < least(to_timestamp($3::int8 * 3600), to_timestamp($4::int8 * 86400))"
    "  UNION ALL"
    "  SELECT source, event_type, " STATS_COUNTERS " FROM tenant_stats_hourly"
    "   WHERE tenant_id = $1"
    "     AND hour >= greatest(to_timestamp($2::int8 * 3600), to_timestamp($5::int8 * 86400))"
    "     AND hour < to_timestamp($3::int8 * 3600)"
    "), g AS ("
    "  SELECT CASE $6::text WHEN 'source' THEN source WHEN 'event_type' THEN event_type"
    "                       ELSE '' END AS key, " STATS_SUMS
    "    FROM w GROUP BY 1"
    ")"
    " SELECT 0 AS ord, (SELECT count(*) FROM tenants WHERE id = $1)::int AS found, NULL::text,"
    "        coalesce(sum(accepted), 0)::int8, coalesce(sum(duplicates), 0)::int8,"
    "        coalesce(sum(quarantined), 0)::int8, coalesce(sum(dropped), 0)::int8,"
    "        coalesce(sum(delivered), 0)::int8, coalesce(sum(delayed), 0)::int8,"
    "        coalesce(sum(retried), 0)::int8, coalesce(sum(dead), 0)::int8,"
    "        coalesce(sum(replayed), 0)::int8"
    "   FROM g"
    " UNION ALL"
    " SELECT * FROM ("
    "   SELECT row_number() OVER (ORDER BY accepted + duplicates + quarantined + dropped DESC,"
    "                                      delivered + delayed + retried + dead + replayed DESC,"
    "                                      key)::int AS ord,"
    "          1, key, " STATS_COUNTERS
    "     FROM g WHERE $6::text IS NOT NULL"
    " ) top WHERE top.ord <= 100"
    " ORDER BY 1",
    0,
};

// clang-format on
