/*
 * store_ingest — the SQL of ingest (SPEC §3, §4) and the parameters it takes.
 *
 * A batch of records (a Kafka partition's or a group of HTTP requests') is
 * written with at most three statements, each taking one binary array per
 * column with one element per row (pg_array.h), so a batch of any size is
 * one statement and one round trip:
 *
 *   hub_sql_quarantine_insert   the records refused (invalid envelope, too
 *                               large, digest conflict), with their evidence;
 *   hub_sql_ingest_insert       the valid records: roster gate, dedup, the
 *                               inbox row and its delivery jobs, and one
 *                               result row per record for its verdict;
 *   hub_sql_ingest_json_errors  the slow path after an insert failed on a
 *                               payload that is not JSON: which ones are not.
 *
 * Each statement has a row builder beside it: init, add rows, then
 * *_txn_add() hands the arrays to a transaction (no copy) and leaves the
 * builder empty.  The builders borrow nothing: every value is copied into
 * the arrays as it is added.  Results are read by the column enums below,
 * in text format.
 *
 * The statement objects are static and compared by address by pg.c.
 */
#ifndef HUB_STORE_INGEST_H
#define HUB_STORE_INGEST_H

#include <stddef.h>
#include <stdint.h>

#include "envelope.h"
#include "pg.h"
#include "pg_array.h"

/* Where a record was read in Kafka.  topic == NULL: not from Kafka (HTTP
 * ingest), and the topic, partition and offset columns are SQL NULL. */
struct hub_store_kafka_pos {
    const char *topic;
    int32_t partition;
    int64_t offset;
};

/* ------------------------------------------------------- the insert -- */

/*
 * The ingest insert.  Parameters (binary arrays, one element per record,
 * same order):
 *   $1 ord int4            the record's index in its batch (echoed back)
 *   $2 tenant_id text      $3 source text          $4 event_id text
 *   $5 ce_type text        $6 event_type text      $7 schema_major int4
 *   $8 event_time timestamptz                      $9 content_type text
 *   $10 headers jsonb      (the attributes kept, hub_event.attrs_json)
 *   $11 payload bytea      $12 digest bytea (SHA-256 of the payload)
 *   $13 topic text         $14 kafka_partition int4  $15 kafka_offset int8
 *                          (all three NULL for HTTP ingest)
 *   $16 json_check bool    the payload's JSON grammar is to be checked: one
 *                          that is not well-formed fails the whole statement
 *                          (hub_sqlstate_json_grammar tells it apart).
 *   $17 schema_version text  the registered schema version the payload
 *                          passed (SPEC §3.5), NULL when none checked it
 * and the fast path's (struct hub_store_ingest_fast; one-element arrays but
 * $21..$23):
 *   $18 lease owner text   $19 lease ms int8        $20 most jobs leased int4
 *   $21 tenant text, $22 origin int8, $23 room int4: how many jobs a
 *                          (tenant, origin) pair may take now, or with a
 *                          NULL tenant the origin for all its tenants (the
 *                          least entry counts)
 *   $24 int4[2]: the room of a pair, and of an origin, not listed.
 * Each event's jobs are inserted pending, but for up to $20 of them (not
 * fifo, no max_rate, within the rooms, in arrival order), inserted already
 * leased to $18 ('in_flight', lease_until now() + $19 ms), as a claim
 * would have.
 * Result rows (text): one per record given, ordered by ord, then one per
 * job leased, ordered by job id; see enum hub_ingest_insert_col.
 */
#define HUB_INGEST_NPARAMS 17
#define HUB_INGEST_FAST_NPARAMS 7
extern const struct hub_sql hub_sql_ingest_insert;
/* The same statement, prepared once per connection (generic plan): for
 * small batches, where planning would cost more than it saves. */
extern const struct hub_sql hub_sql_ingest_insert_prepared;
/* The insert when something may be leased ($1..$24): hub_sql_ingest_insert
 * takes $1..$17 only and leases nothing (its job columns are NULL and
 * HUB_INGEST_COL_JOBS_PENDING is 1 on the row of a record stored). */
extern const struct hub_sql hub_sql_ingest_insert_fast;
extern const struct hub_sql hub_sql_ingest_insert_fast_prepared;

/* The result columns of hub_sql_ingest_insert.  A record's row has the
 * first five (HUB_INGEST_COL_JOB NULL); a leased job's row has ord and the
 * job's columns, the others NULL. */
enum hub_ingest_insert_col {
    HUB_INGEST_COL_ORD = 0,            /* int4: $1 of the row (of the job's event) */
    HUB_INGEST_COL_TENANT_STATUS,      /* tenants.status; NULL: the tenant is not on the roster */
    HUB_INGEST_COL_STORED_DIGEST,      /* digest already stored under the key ("\x" + 64 hex),
                                        * for an active tenant's row not inserted; else NULL */
    HUB_INGEST_COL_SEQ,                /* event_inbox.seq when inserted now; else NULL.  An active
                                        * row with neither digest nor seq raced a concurrent
                                        * insert of its key: run the batch again */
    HUB_INGEST_COL_JOBS_PENDING,       /* int8: the statement's jobs left pending (for the claim),
                                        * the same on every record row */
    HUB_INGEST_COL_JOB,                /* int8: a leased job's id; NULL on a record's row */
    HUB_INGEST_COL_JOB_SUB,            /* its subscription id (uuid text) */
    HUB_INGEST_COL_JOB_ORIGIN,         /* its origin id (int8) */
    HUB_INGEST_COL_JOB_URL,            /* the subscription's url */
    HUB_INGEST_COL_JOB_HEADERS_SEALED, /* sealed destination headers, or NULL */
    HUB_INGEST_COL_JOB_SECRET_SEALED,  /* sealed signing secret */
    HUB_INGEST_COL_JOB_PREV_SECRET_SEALED, /* the previous one within its grace, or NULL */
    HUB_INGEST_COL_JOB_RETRY_SCHEDULE,     /* "1000,5000,..." (ms), or NULL */
    HUB_INGEST_COL_JOB_POLICY,             /* policy name, or NULL */
    HUB_INGEST_COL_JOB_SCHEMA_VERSION,     /* the schema version its event passed, or NULL */
};

/* What the fast path lets one insert lease (dispatch.h,
 * hub_dispatch_fast_offer fills it).  owner NULL or budget 0: nothing. */
struct hub_store_ingest_fast {
    const char *owner;             /* $18: "<dispatcher>#<serial>", copied by the add */
    int64_t lease_ms;              /* $19 */
    int32_t budget;                /* $20 */
    struct hub_pgarr room_tenants; /* $21 text[] (NULL elements: the origin's entry) */
    struct hub_pgarr room_origins; /* $22 int8[] */
    struct hub_pgarr rooms;        /* $23 int4[] */
    int32_t lane_room;             /* $24[1]: a pair not listed */
    int32_t origin_room;           /* $24[2]: an origin not listed */
};

/* An offer of nothing, its arrays empty; hub_store_ingest_rows_txn_add()
 * frees them. */
void hub_store_ingest_fast_init(struct hub_store_ingest_fast *f);

/* Rows of hub_sql_ingest_insert being built; n counts the rows added. */
struct hub_store_ingest_rows {
    struct hub_pgarr a[HUB_INGEST_NPARAMS]; /* private */
    size_t n;
};

void hub_store_ingest_rows_init(struct hub_store_ingest_rows *rows);

/* Adds the row of event ev (borrowed for the call), echoed back as ord;
 * pos says where it was read (topic NULL for HTTP ingest). */
void hub_store_ingest_rows_add(struct hub_store_ingest_rows *rows, int32_t ord,
                               const struct hub_event *ev, const struct hub_store_kafka_pos *pos);

/* The same, for an event the schema step checked: schema_version (borrowed
 * for the call; NULL: not checked) is stored with it. */
void hub_store_ingest_rows_add_checked(struct hub_store_ingest_rows *rows, int32_t ord,
                                       const struct hub_event *ev,
                                       const struct hub_store_kafka_pos *pos,
                                       const char *schema_version);

/*
 * Appends the insert over the rows to txn: the prepared statement for a few
 * rows, planned per batch for many (store_ingest.c says why).  fast says
 * what it may lease (NULL: nothing); its arrays go with the statement.
 * With no rows nothing is appended and the arrays are freed.  rows (and
 * fast's arrays) are empty afterwards.  Returns 0, or HUB_ENOMEM as
 * hub_pgarr_txn_add().
 */
int hub_store_ingest_rows_txn_add(struct hub_store_ingest_rows *rows,
                                  struct hub_store_ingest_fast *fast, struct hub_pg_txn *txn);

/* SQLSTATEs of a payload that is not well-formed JSON failing the insert:
 * 1 when sqlstate (may be NULL) is one of them. */
int hub_sqlstate_json_grammar(const char *sqlstate);

/* ----------------------------------------- keys the schema refused -- */

/*
 * What is stored under the keys of records the schema step refused:
 * $1 ord int4[], $2 tenant text[], $3 source text[], $4 event_id text[].
 * One result row per key (text): its ord, the stored payload's digest in
 * hex, NULL when nothing is stored under it (every day partition is probed
 * by its unique index: refused records only), and the tenant's status,
 * NULL when the tenant is not on the roster.
 */
#define HUB_STORED_DIGESTS_NPARAMS 4
extern const struct hub_sql hub_sql_ingest_stored_digests;

enum hub_stored_digests_col {
    HUB_STORED_DIGESTS_COL_ORD = 0,
    HUB_STORED_DIGESTS_COL_DIGEST,
    HUB_STORED_DIGESTS_COL_TENANT_STATUS,
};

/* --------------------------------------------------- the JSON check -- */

/*
 * The payloads of an insert that failed on JSON grammar, row by row:
 * $1 ord int4[], $2 payload bytea[].  Result rows (text), for the payloads
 * that are not JSON only; see enum hub_json_errors_col.
 */
#define HUB_JSON_ERRORS_NPARAMS 2
extern const struct hub_sql hub_sql_ingest_json_errors;

/* The result columns of hub_sql_ingest_json_errors. */
enum hub_json_errors_col {
    HUB_JSON_ERRORS_COL_ORD = 0, /* int4: $1 of the row */
    HUB_JSON_ERRORS_COL_WHY,     /* text: "invalid JSON syntax", "not UTF-8", ... */
};

/* Rows of hub_sql_ingest_json_errors being built. */
struct hub_store_json_rows {
    struct hub_pgarr a[HUB_JSON_ERRORS_NPARAMS]; /* private */
};

void hub_store_json_rows_init(struct hub_store_json_rows *rows);
/* Adds a payload to check (copied), echoed back as ord when it is not JSON. */
void hub_store_json_rows_add(struct hub_store_json_rows *rows, int32_t ord, const void *payload,
                             size_t len);
/* Appends the check to txn; rows is empty afterwards.  0 or HUB_ENOMEM as
 * hub_pgarr_txn_add(). */
int hub_store_json_rows_txn_add(struct hub_store_json_rows *rows, struct hub_pg_txn *txn);

/* ------------------------------------------------------ quarantine -- */

/*
 * Quarantine (SPEC §3.2), one row per refused record:
 *   $1 reason text   $2 field text   $3 detail text
 *   $4 tenant_id text   $5 source text   $6 event_id text
 *   $7 topic text[]   $8 kafka_partition int4[]   $9 kafka_offset int8[]
 *   $10 headers jsonb[]   $11 value bytea[]
 * No result rows.
 */
#define HUB_QUARANTINE_NPARAMS 11
extern const struct hub_sql hub_sql_quarantine_insert;

/* One quarantine row; every pointer is borrowed for the add call only. */
struct hub_store_quarantine_row {
    const char *reason;             /* $1: hub_envelope_reason_str() or "digest_conflict" */
    const char *field;              /* $2: the attribute at fault; NULL: none */
    const char *detail;             /* $3: UTF-8 text for the operator */
    const char *tenant_id;          /* $4..$6: what the record claimed; NULL: unknown */
    const char *source;             /*   (never trusted: evidence for operators) */
    const char *event_id;           /*   */
    struct hub_store_kafka_pos pos; /* $7..$9: topic NULL for HTTP ingest */
    const char *headers_json;       /* $10: JSON array (hub_ingest_headers_evidence); NULL: "[]" */
    const void *value;              /* $11: the record as received; NULL: empty */
    size_t value_len;
};

/* Rows of hub_sql_quarantine_insert being built. */
struct hub_store_quarantine_rows {
    struct hub_pgarr a[HUB_QUARANTINE_NPARAMS]; /* private */
};

void hub_store_quarantine_rows_init(struct hub_store_quarantine_rows *rows);
void hub_store_quarantine_rows_add(struct hub_store_quarantine_rows *rows,
                                   const struct hub_store_quarantine_row *row);
/* Appends the insert to txn (also with no rows); rows is empty afterwards.
 * 0 or HUB_ENOMEM as hub_pgarr_txn_add(). */
int hub_store_quarantine_rows_txn_add(struct hub_store_quarantine_rows *rows,
                                      struct hub_pg_txn *txn);

/* Every statement above, NULL-terminated (tests/support/sql_text.c prints
 * them for tests that run one with psql). */
extern const struct hub_sql *const hub_sql_ingest_all[];

#endif
