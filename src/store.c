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
