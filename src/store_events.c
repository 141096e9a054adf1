/*
 * store_events — SQL texts of the pull API and its horizon (see
 * store_events.h).
 */
#include "store_events.h"

/* The SQL below is laid out for reading as SQL. */
// clang-format off

/* ------------------------------------------------------------ the hold -- */

/* pg_sequence_last_value() reads the sequence's current state, which
 * nextval() changes at once and outside any transaction; it is NULL before
 * the first nextval.  event_seq keeps CACHE 1 (the default, migration
 * 0002): with a cache, a session could hand out a value below the last one
 * read here without touching the sequence, and without holding the lock. */
const struct hub_sql hub_sql_pull_seq = {
    "pull_seq",
    "SELECT coalesce(pg_sequence_last_value('event_seq'), 0)",
    0,
};

/* Granted holders of the hold in this database (advisory locks are per
 * database).  pg_locks is read live, not through the snapshot. */
#define PULL_HOLDERS_WHERE                                                                         \
    " WHERE locktype = 'advisory' AND granted AND objsubid = 1"                                    \
    "   AND classid = " HUB_PULL_HOLD_CLASSID " AND objid = " HUB_PULL_HOLD_OBJID                  \
    "   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"

const struct hub_sql hub_sql_pull_holders = {
    "pull_holders",
    "SELECT coalesce(array_agg(virtualtransaction), '{}') FROM pg_locks" PULL_HOLDERS_WHERE,
    0,
};

/* A virtual transaction id names one transaction of one backend (its local
 * counter never repeats within a server's life), so a holder that is gone
 * from the list has ended, and the same id cannot come back. */
const struct hub_sql hub_sql_pull_still = {
    "pull_still",
    "SELECT coalesce(array_agg(virtualtransaction), '{}') FROM pg_locks" PULL_HOLDERS_WHERE
    "   AND virtualtransaction = ANY ($1::text[])",
    0,
};

/* ---------------------------------------------------------- the events -- */

/* The select list both statements share, in the order of hub_events_col. */
#define EVENTS_COLUMNS "seq, headers::text, event_type, content_type, payload"

/* The pattern test mirrors the subscription match of SPEC §6: the exact
 * type, "*", or "<resource>.*" against the type's first segment.
 *
 * The byte cap: p is the page as `limit` alone would make it; the window
 * sums each event's size over p in seq order, and the page keeps the
 * prefix within $6 (the first event always).  octet_length() of a bytea
 * reads a TOASTed value's size from its pointer, so the payloads the cap
 * leaves out are never fetched; those kept are read once, as the rows go
 * out.  The attributes count as the text they go out as: their stored size
 * (pg_column_size) is compressed, and attributes of one repeated letter
 * had passed a page of 8 MiB by a hundred times. */
const struct hub_sql hub_sql_events_list = {
    "events_list",
    "SELECT " EVENTS_COLUMNS ", scanned FROM ("
    "  SELECT p.*,"
    "         sum(octet_length(p.payload) + octet_length(p.headers::text)) OVER w AS upto,"
    "         row_number() OVER w AS rn, count(*) OVER () AS scanned"
    "    FROM (SELECT seq, headers, event_type, content_type, payload FROM event_inbox"
    "           WHERE tenant_id = $1 AND seq > $2::int8 AND seq <= $5::int8"
    "             AND ($4::text IS NULL OR $4 = '*' OR event_type = $4"
    "                  OR (right($4, 2) = '.*' AND split_part(event_type, '.', 1) || '.*' = $4))"
    "           ORDER BY seq LIMIT $3::int4) p"
    "  WINDOW w AS (ORDER BY p.seq)"
    ") c"
    " WHERE c.upto <= $6::int8 OR c.rn = 1"
    " ORDER BY seq",
    0,
};

const struct hub_sql hub_sql_events_one = {
    "events_one",
    "SELECT " EVENTS_COLUMNS
    "  FROM event_inbox"
    " WHERE tenant_id = $1 AND seq = $2::int8",
    0,
};

// clang-format on
