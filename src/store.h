/*
 * store — the SQL of ingest and schema upkeep.  Its statements take whole
 * partition batches as binary arrays (pg_array.h).
 */
#ifndef HUB_STORE_H
#define HUB_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "pg.h"
/* The binary array encoder lived here before it moved to pg_array; the
 * modules that still reach it through store.h keep working. */
#include "pg_array.h"

/*
 * Ingest: one statement per partition batch.  Parameters (binary arrays, one
 * element per event, same order): $1 ord int4, $2 tenant_id, $3 source,
 * $4 event_id, $5 ce_type, $6 event_type, $7 schema_major int4,
 * $8 event_time timestamptz, $9 content_type, $10 headers jsonb,
 * $11 payload bytea, $12 digest bytea, $13 topic, $14 kafka_partition int4,
 * $15 kafka_offset int8, $16 json_check bool (the payload's JSON grammar is
 * to be checked: one that is not well-formed fails the whole statement).
 * Result rows (text): ord, tenant status (NULL = not on the roster),
 * digest of an already stored event with the same key (\x hex, or NULL),
 * seq of the stored event (NULL when not inserted).
 */
#define HUB_INGEST_NPARAMS 16
extern const struct hub_sql hub_sql_ingest_insert;
/* The same statement, prepared once per connection (generic plan): for
 * small batches, where planning would cost more than it saves. */
extern const struct hub_sql hub_sql_ingest_insert_prepared;

/* SQLSTATEs of a payload that is not well-formed JSON failing the insert. */
int hub_sqlstate_json_grammar(const char *sqlstate);

/*
 * The payloads of an insert that failed on JSON grammar, row by row: $1 ord
 * int4[], $2 payload bytea[].  Result rows (text): ord and why, for the bad
 * ones only.
 */
#define HUB_JSON_ERRORS_NPARAMS 2
extern const struct hub_sql hub_sql_ingest_json_errors;

/*
 * Quarantine: $1 reason, $2 field, $3 detail, $4 tenant_id, $5 source,
 * $6 event_id, $7 topic (text[]), $8 kafka_partition int4[],
 * $9 kafka_offset int8[], $10 headers jsonb[], $11 value bytea[].
 */
#define HUB_QUARANTINE_NPARAMS 11
extern const struct hub_sql hub_sql_quarantine_insert;

/* $1 retention (interval text). */
extern const struct hub_sql hub_sql_maintain_partitions;

#endif
