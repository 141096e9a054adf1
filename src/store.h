/*
 * store — the SQL of ingest and schema upkeep, and the binary array encoder
 * that lets one statement write a whole partition batch (`unnest` over
 * arrays sent in PostgreSQL's binary format: no escaping, payload bytes as
 * they are).
 */
#ifndef HUB_STORE_H
#define HUB_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "pg.h"

/* Element type OIDs used in parameter arrays. */
#define HUB_OID_BOOL 16
#define HUB_OID_BYTEA 17
#define HUB_OID_INT8 20
#define HUB_OID_INT4 23
#define HUB_OID_TEXT 25
#define HUB_OID_TIMESTAMPTZ 1184
#define HUB_OID_JSONB 3802

/* A one-dimensional array in binary wire format, built element by element. */
struct hub_pgarr {
    char *buf;
    size_t len;
    size_t cap;
    uint32_t n;
    uint32_t oid;
    int has_null;
    int oom;
};

void hub_pgarr_init(struct hub_pgarr *a, uint32_t oid);
/* Appends raw element bytes (already in the element's binary form); p == NULL appends NULL. */
void hub_pgarr_add(struct hub_pgarr *a, const void *p, size_t len);
void hub_pgarr_add_text(struct hub_pgarr *a, const char *s); /* NULL → SQL NULL */
void hub_pgarr_add_i32(struct hub_pgarr *a, int32_t v);
void hub_pgarr_add_i64(struct hub_pgarr *a, int64_t v);
void hub_pgarr_add_bool(struct hub_pgarr *a, int v);
void hub_pgarr_add_ts(struct hub_pgarr *a, int64_t unix_us); /* timestamptz */
void hub_pgarr_add_jsonb(struct hub_pgarr *a, const char *json, size_t len);
/* Writes the header; returns the buffer (owned by a) and its length, or NULL on OOM. */
const char *hub_pgarr_finish(struct hub_pgarr *a, int *len);
void hub_pgarr_free(struct hub_pgarr *a);
/* Finishes the array and hands its malloc'd buffer to the caller (for
 * hub_pg_txn_add_owned); a is left empty.  NULL on OOM (a is then freed). */
char *hub_pgarr_take(struct hub_pgarr *a, int *len);

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
