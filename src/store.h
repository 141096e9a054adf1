/*
 * store — the SQL of schema upkeep: the inbox's daily partitions, the
 * midnight dedup keys, and the schema check of the readiness probe.
 *
 * Every SQL text of the hub lives in a store module named for the job that
 * runs it (store_ingest, store_subs, store_admin, ...); this one holds what
 * belongs to no single job.  The statement objects are static and compared
 * by address by pg.c.
 */
#ifndef HUB_STORE_H
#define HUB_STORE_H

#include "pg.h"
/* The binary array encoder lived here before it moved to pg_array; the
 * modules that still reach it through store.h keep working. */
#include "pg_array.h"

/*
 * $1 retention (interval text, e.g. "604800000 milliseconds").  Creates the
 * coming days' event_inbox partitions, drops those past the retention and
 * analyzes a partition recorded as empty that has rows now
 * (hub_maintain_partitions(), last redefined in migrations/0006).  One row,
 * one column (void); only its success matters.
 */
extern const struct hub_sql hub_sql_maintain_partitions;

/* No parameters, no rows: forgets the dedup keys stored near a UTC midnight
 * more than an hour ago (inbox_midnight_keys, migrations/0010).  Run with
 * the hourly partition upkeep. */
/* Ahead of hub_sql_maintain_partitions in the periodic upkeep: a table
 * lock waited for more than 200 ms fails the upkeep (55P03), retried at its
 * next run; start-up waits as long as it takes. */
extern const struct hub_sql hub_sql_maintain_lock_timeout;
extern const struct hub_sql hub_sql_purge_midnight_keys;

/*
 * $1 versions (text[]: the migrations this binary embeds, by name).  One
 * row, one column (int8): how many of them schema_migrations records.  The
 * readiness probe (hub.c): fewer than given means the schema is behind.
 */
extern const struct hub_sql hub_sql_schema_versions;

/* The columns of hub_sql_schema_versions. */
enum hub_schema_versions_col {
    HUB_SCHEMA_VERSIONS_COL_COUNT = 0,
};

#endif
