/*
 * store — schema upkeep SQL (see store.h).
 */
#include "store.h"

/* Run hourly by the hub and once at start (hub.c), blocking or pooled. */
const struct hub_sql hub_sql_maintain_partitions = {
    "maintain_partitions",
    "SELECT hub_maintain_partitions($1::interval)",
    0,
};

/* The keys are needed only while transactions from either side of the
 * midnight they were stored at may still run: an hour is plenty. */
/* The periodic upkeep waits at most this long for a table lock: creating
 * or dropping a day's partition locks its parent (ACCESS EXCLUSIVE), and a
 * long reader (pg_dump, a replay) would otherwise hold the upkeep, and
 * every ingest, claim and pull queued behind it, for as long as it reads. */
const struct hub_sql hub_sql_maintain_lock_timeout = {
    "maintain_lock_timeout",
    "SELECT set_config('lock_timeout', '200ms', true)",
    0,
};

const struct hub_sql hub_sql_purge_midnight_keys = {
    "purge_midnight_keys",
    "DELETE FROM inbox_midnight_keys WHERE created_at < now() - interval '1 hour'",
    0,
};

/* One row, one column: how many of the given versions are recorded. */
const struct hub_sql hub_sql_schema_versions = {
    "schema_versions",
    "SELECT count(*) FROM schema_migrations WHERE version = ANY($1::text[])",
    0,
};
