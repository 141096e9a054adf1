/*
 * store_cluster — SQL texts of process membership (see store_cluster.h).
 */
#include "store_cluster.h"

/* The SQL below is laid out for reading as SQL. */
// clang-format off

/* The count leaves this process's row out and adds one: the statement's
 * snapshot does not see a row its own upsert inserted, and this process
 * is live by definition.  Times are the database's (now()), so the
 * processes' clocks need not agree.  The purge keeps the table to the
 * processes of the last hour; it is cheap on a table this small. */
const struct hub_sql hub_sql_cluster_heartbeat = {
    "cluster_heartbeat",
    "WITH up AS ("
    "  INSERT INTO hub_processes (id, role, host, pid) VALUES ($1, $2, $3, $4::int4)"
    "  ON CONFLICT (id) DO UPDATE SET seen_at = now()"
    "  RETURNING id"
    "), gone AS ("
    "  DELETE FROM hub_processes WHERE seen_at < now() - interval '1 hour' AND id <> $1"
    ")"
    " SELECT 1 + count(*),"
    "        ($2 IN ('all', 'delivery'))::int + count(*) FILTER (WHERE role IN ('all', 'delivery'))"
    "   FROM hub_processes"
    "  WHERE id <> $1 AND seen_at > now() - $5::int8 * interval '1 millisecond'",
    0,
};

const struct hub_sql hub_sql_cluster_leave = {
    "cluster_leave",
    "DELETE FROM hub_processes WHERE id = $1",
    0,
};

// clang-format on
