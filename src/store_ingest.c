/*
 * store_ingest — the ingest statements and their row builders (see
 * store_ingest.h).
 */
#include "store_ingest.h"
#include "store_events.h"

#include <string.h>

/*
 * Batches of fewer rows use the prepared statement (generic plan), bigger
 * ones have the insert planned for their actual arrays.  Planning this
 * statement costs 1-3 ms: worth it for a big batch, whose custom plan is
 * cheaper per row than the generic one (~25% of the run), not for the few
 * to few dozen rows a batch holds in a live stream, Kafka's or HTTP's,
 * where planning was a third of the ingest connections' CPU.  Figures:
 * docs/performance.md, "Notes moved out of the ingest code (issue 22)" and
 * "The insert's plan in a live stream (stop 38, issue 26)".
 */
#define INGEST_PLAN_MIN_ROWS 256

/*
 * Why one statement: the roster gate, the dedup lookups and the insert all
 * happen server-side in one round trip.
 *
 * Dedup has two halves (see migrations/0002_inbox.sql): the per-day unique
 * index arbitrates today's partition through ON CONFLICT, at no extra cost;
 * keys stored on earlier days are looked up by the NOT EXISTS, which only
 * visits partitions older than today (pruned at executor start, `now()` being
 * stable).  Only rows that were not inserted — replays, normally rare — pay
 * for fetching the stored digest that tells a duplicate from a conflict.  A
 * row inserted meanwhile by a concurrent hub is invisible to this
 * statement's snapshot: it comes back with neither seq nor digest, and ingest
 * runs the batch again to classify it.
 *
 * n holds the rows to store but for today's unique index: active tenants,
 * keys no older day holds.  Across a UTC midnight that index does not
 * arbitrate: within five minutes of one, mk also inserts n's keys into
 * inbox_midnight_keys (migrations/0010), whose primary key spans the days,
 * and ins stores only the keys mk inserted.  A concurrent hub's insert of
 * the same key, on the other side of midnight, then makes this statement
 * wait, and once it has committed, store nothing: the row comes back raced.
 * The rest of the day mk does not run (its condition is an InitPlan, a
 * one-time filter) and ins pays one parameter test per row; the statement
 * plans in ~0.2 ms more than without them (docs/performance.md).  The day
 * is taken from hub_ingest_clock(), which is now() (tests move it).
 *
 * Each stored event gets its delivery jobs in the same statement, so an event
 * and its jobs commit (and the offset moves) together.
 *
 * r checks the grammar of the JSON payloads (envelope.h json_unchecked) with
 * PostgreSQL's JSON parser, every row's, the roster's rejects included: r is
 * read twice, so it is materialized whole.  A bad payload fails the
 * statement, and ingest finds it with hub_sql_ingest_json_errors.
 *
 * r also takes the pull hold (store_events.h, pull_horizon.h) in a one-time
 * filter, before any row reaches ins's nextval().
 */
#define INGEST_INSERT_HEAD                                                                         \
    "WITH b AS ("                                                                                  \
    "  SELECT * FROM unnest($1::int4[], $2::text[], $3::text[], $4::text[], $5::text[],"           \
    "                       $6::text[], $7::int4[], $8::timestamptz[], $9::text[], $10::jsonb[],"  \
    "                       $11::bytea[], $12::bytea[], $13::text[], $14::int4[], $15::int8[],"    \
    "                       $16::bool[], $17::text[])"                                             \
    "    AS u(ord, tenant_id, source, event_id, ce_type, event_type, schema_major, event_time,"    \
    "         content_type, headers, payload, digest, topic, kafka_partition, kafka_offset,"       \
    "         json_check, schema_version)"                                                         \
    "), r AS ("                                                                                    \
    "  SELECT b.*, t.status FROM b LEFT JOIN tenants t ON t.id = b.tenant_id"                      \
    "   WHERE (NOT b.json_check OR convert_from(b.payload, 'UTF8')::json IS NOT NULL)"             \
    "     AND " HUB_SQL_PULL_HOLD                                                                  \
    "), n AS (" /* the rows to store unless a key of today's holds them */                         \
    "  SELECT r.* FROM r"                                                                          \
    "   WHERE r.status = 'active'"                                                                 \
    "     AND NOT EXISTS (SELECT 1 FROM event_inbox e"                                             \
    "                      WHERE e.tenant_id = r.tenant_id AND e.source = r.source"                \
    "                        AND e.event_id = r.event_id"                                          \
    "                        AND e.day < (hub_ingest_clock() AT TIME ZONE 'UTC')::date)"           \
    "), mk AS (" /* near a UTC midnight only: their keys, across the days */                       \
    "  INSERT INTO inbox_midnight_keys (tenant_id, source, event_id, day)"                         \
    "  SELECT n.tenant_id, n.source, n.event_id, (hub_ingest_clock() AT TIME ZONE 'UTC')::date"    \
    "    FROM n WHERE (SELECT hub_ingest_near_midnight())"                                         \
    "  ON CONFLICT DO NOTHING"                                                                     \
    "  RETURNING tenant_id, source, event_id"                                                      \
    "), ins AS ("                                                                                  \
    "  INSERT INTO event_inbox (seq, day, tenant_id, source, event_id, ce_type, event_type,"       \
    "                           schema_major, event_time, content_type, headers, payload,"         \
    "                           digest, topic, kafka_partition, kafka_offset, schema_version)"     \
    "  SELECT nextval('event_seq'), (hub_ingest_clock() AT TIME ZONE 'UTC')::date, n.tenant_id,"   \
    "         n.source, n.event_id, n.ce_type, n.event_type, n.schema_major, n.event_time,"        \
    "         n.content_type, n.headers, n.payload, n.digest, n.topic, n.kafka_partition,"         \
    "         n.kafka_offset, n.schema_version"                                                    \
    "    FROM n"                                                                                   \
    "   WHERE (SELECT NOT hub_ingest_near_midnight())"                                             \
    "      OR EXISTS (SELECT 1 FROM mk WHERE mk.tenant_id = n.tenant_id"                           \
    "                    AND mk.source = n.source AND mk.event_id = n.event_id)"                   \
    "   ORDER BY n.ord"                                                                            \
    "  ON CONFLICT (tenant_id, source, event_id, day) DO NOTHING"                                  \
    "  RETURNING seq, day, tenant_id, source, event_id, event_type, schema_major"

/* Matching (SPEC §6): each stored event (ins i) with the tenant's routes
 * for its event type, its resource wildcard and '*', of subscriptions
 * enabled AND verified (s). */
#define INGEST_MATCH_FROM                                                                          \
    "    FROM ins i"                                                                               \
    "    JOIN subscription_routes sr ON sr.tenant_id = i.tenant_id"                                \
    "         AND sr.schema_major = i.schema_major"                                                \
    "         AND sr.pattern IN (i.event_type, split_part(i.event_type, '.', 1) || '.*', '*')"     \
    "    JOIN subscriptions s ON s.id = sr.subscription_id AND s.enabled"                          \
    "         AND s.verification_state = 'active'"

/* A record's row: its verdict's columns, up to HUB_INGEST_COL_SEQ (the
 * rest follow in each form). */
#define INGEST_VERDICT_COLUMNS                                                                     \
    " SELECT r.ord, r.status," /* enum hub_ingest_insert_col, in this order */                     \
    "        CASE WHEN ins.seq IS NULL AND r.status = 'active' THEN"                               \
    "          (SELECT e.digest FROM event_inbox e"                                                \
    "            WHERE e.tenant_id = r.tenant_id AND e.source = r.source"                          \
    "              AND e.event_id = r.event_id LIMIT 1)"                                           \
    "        END,"                                                                                 \
    "        ins.seq,"

/* The tail of the insert without the fast path: every job pending, as
 * before the fast path existed (the same columns, the jobs' NULL). */
#define INGEST_INSERT_PLAIN                                                                        \
    INGEST_INSERT_HEAD                                                                             \
    "), jobs AS (" /* matching (SPEC §6): the tenant's routes for this event type, its            \
                    * resource wildcard and '*', of subscriptions enabled AND verified */          \
    "  INSERT INTO delivery_jobs (subscription_id, tenant_id, event_seq, event_day, event_id,"     \
    "                             event_type, fifo, origin_id)"                                    \
    "  SELECT DISTINCT s.id, i.tenant_id, i.seq, i.day, i.event_id, i.event_type,"                 \
    "         s.ordering = 'fifo', coalesce(s.origin_id, 0)" /* named: no per-row trigger */       \
        INGEST_MATCH_FROM "  ON CONFLICT (subscription_id, event_seq) DO NOTHING"                  \
    ")" INGEST_VERDICT_COLUMNS                                                                     \
    "        CASE WHEN ins.seq IS NOT NULL THEN 1 ELSE 0 END," /* jobs perhaps: kick */            \
    "        NULL::int8, NULL::text, NULL::int8, NULL::text, NULL::text, NULL::text, NULL::text,"  \
    "        NULL::text, NULL::text, NULL::text"                                                   \
    "   FROM r LEFT JOIN ins ON ins.tenant_id = r.tenant_id AND ins.source = r.source"             \
    "                       AND ins.event_id = r.event_id"                                         \
    "  ORDER BY r.ord"

/* The tail of the insert with the fast path: matching into m, the jobs to
 * lease into f, every job inserted (leased or pending), and the leased ones
 * returned after the records' rows.  A leased job comes back once, with the
 * record inserted: the first of its key (repeats are unmarked after OOM),
 * picked by one sort of n (DISTINCT ON).  A correlated min() per row of n
 * was planned as a filter re-run for every row of every job's scan of n:
 * cubic in the batch, 6 s for 517 records. */
#define INGEST_INSERT_FAST                                                                         \
    INGEST_INSERT_HEAD                                                                             \
    "), m AS (" /* matching (SPEC §6): the tenant's routes for this event type, its               \
                 * resource wildcard and '*', of subscriptions enabled AND verified */             \
    "  SELECT DISTINCT s.id AS sub, i.tenant_id, i.seq, i.day, i.event_id, i.event_type,"          \
    "         s.ordering = 'fifo' AS fifo, coalesce(s.origin_id, 0) AS origin_id,"                 \
    "         s.max_rate IS NULL AS unlimited" INGEST_MATCH_FROM                                   \
    "), f AS (" /* the fast path: the first $20 of them that may start now (store_ingest.h) */     \
    "  SELECT x.sub, x.seq FROM ("                                                                 \
    "    SELECT m.sub, m.seq, coalesce(lr.room, ($24::int4[])[1]) AS lane_room,"                   \
    "           coalesce(orr.room, ($24::int4[])[2]) AS origin_room,"                              \
    "           row_number() OVER (PARTITION BY m.tenant_id, m.origin_id ORDER BY m.seq, m.sub) "  \
    "k,"                                                                                           \
    "           row_number() OVER (PARTITION BY m.origin_id ORDER BY m.seq, m.sub) ko"             \
    "      FROM m"                                                                                 \
    "      LEFT JOIN (SELECT l.tenant_id, l.origin_id, min(l.room) AS room"                        \
    "                   FROM unnest($21::text[], $22::int8[], $23::int4[]) l(tenant_id, "          \
    "origin_id,"                                                                                   \
    "                        room)"                                                                \
    "                  WHERE l.tenant_id IS NOT NULL GROUP BY 1, 2) lr"                            \
    "             ON lr.tenant_id = m.tenant_id AND lr.origin_id = m.origin_id"                    \
    "      LEFT JOIN (SELECT l.origin_id, min(l.room) AS room"                                     \
    "                   FROM unnest($21::text[], $22::int8[], $23::int4[]) l(tenant_id, "          \
    "origin_id,"                                                                                   \
    "                        room)"                                                                \
    "                  WHERE l.tenant_id IS NULL GROUP BY 1) orr ON orr.origin_id = m.origin_id"   \
    "     WHERE ($20::int4[])[1] > 0 AND NOT m.fifo AND m.unlimited) x"                            \
    "   WHERE x.k <= x.lane_room AND x.ko <= x.origin_room"                                        \
    "   ORDER BY x.seq, x.sub LIMIT ($20::int4[])[1]"                                              \
    "), jobs AS (" /* named origin: no per-row trigger */                                          \
    "  INSERT INTO delivery_jobs (subscription_id, tenant_id, event_seq, event_day, event_id,"     \
    "                             event_type, fifo, origin_id, state, lease_owner, lease_until)"   \
    "  SELECT m.sub, m.tenant_id, m.seq, m.day, m.event_id, m.event_type, m.fifo, m.origin_id,"    \
    "         CASE WHEN f.sub IS NULL THEN 'pending' ELSE 'in_flight' END,"                        \
    "         CASE WHEN f.sub IS NOT NULL THEN ($18::text[])[1] END,"                              \
    "         CASE WHEN f.sub IS NOT NULL"                                                         \
    "              THEN now() + ($19::int8[])[1] * interval '1 millisecond' END"                   \
    "    FROM m LEFT JOIN f ON f.sub = m.sub AND f.seq = m.seq"                                    \
    "  ON CONFLICT (subscription_id, event_seq) DO NOTHING"                                        \
    "  RETURNING id, subscription_id, event_seq, lease_owner, origin_id"                           \
    ")" INGEST_VERDICT_COLUMNS "        (SELECT count(*) FROM m) - (SELECT count(*) FROM f),"      \
    "        NULL::int8, NULL::text, NULL::int8, NULL::text, NULL::text, NULL::text, NULL::text,"  \
    "        NULL::text, NULL::text, NULL::text"                                                   \
    "   FROM r LEFT JOIN ins ON ins.tenant_id = r.tenant_id AND ins.source = r.source"             \
    "                       AND ins.event_id = r.event_id"                                         \
    " UNION ALL" /* the leased jobs, after every verdict row */                                    \
    " SELECT n.ord, NULL, NULL, NULL, NULL, j.id, j.subscription_id::text, j.origin_id, s.url,"    \
    "        s.headers_sealed, s.secret_sealed,"                                                   \
    "        CASE WHEN s.prev_secret_until > now() THEN s.prev_secret_sealed END,"                 \
    "        array_to_string(s.retry_schedule, ','), s.policy, n.schema_version"                   \
    "   FROM jobs j JOIN ins ON ins.seq = j.event_seq" /* one row per job: see above */            \
    "   JOIN (SELECT DISTINCT ON (tenant_id, source, event_id)"                                    \
    "                ord, tenant_id, source, event_id, schema_version"                             \
    "           FROM n ORDER BY tenant_id, source, event_id, ord) n"                               \
    "         ON n.tenant_id = ins.tenant_id AND n.source = ins.source"                            \
    "        AND n.event_id = ins.event_id"                                                        \
    "   JOIN subscriptions s ON s.id = j.subscription_id"                                          \
    "  WHERE j.lease_owner IS NOT NULL"                                                            \
    "  ORDER BY 6 NULLS FIRST, 1"

const struct hub_sql hub_sql_ingest_insert = {
    "ingest_insert", INGEST_INSERT_PLAIN, 1, /* plan per batch: see struct hub_sql */
};

const struct hub_sql hub_sql_ingest_insert_prepared = {
    "ingest_insert_prepared",
    INGEST_INSERT_PLAIN,
    0,
};

const struct hub_sql hub_sql_ingest_insert_fast = {
    "ingest_insert_fast",
    INGEST_INSERT_FAST,
    1,
};

const struct hub_sql hub_sql_ingest_insert_fast_prepared = {
    "ingest_insert_fast_prepared",
    INGEST_INSERT_FAST,
    0,
};

const struct hub_sql hub_sql_ingest_stored_digests = {
    "ingest_stored_digests",
    "SELECT u.ord, encode((SELECT e.digest FROM event_inbox e WHERE e.tenant_id = u.tenant"
    "                        AND e.source = u.source AND e.event_id = u.id LIMIT 1), 'hex'),"
    "       (SELECT t.status FROM tenants t WHERE t.id = u.tenant)"
    "  FROM unnest($1::int4[], $2::text[], $3::text[], $4::text[]) u(ord, tenant, source, id)",
    0,
};

/* hub_json_error() (migrations/0004) catches what the cast raises, row by
 * row: slow, and run only after an insert failed on a bad payload. */
const struct hub_sql hub_sql_ingest_json_errors = {
    "ingest_json_errors",
    "SELECT ord, e FROM (" /* enum hub_json_errors_col */
    "  SELECT u.ord, hub_json_error(u.payload) AS e"
    "    FROM unnest($1::int4[], $2::bytea[]) AS u(ord, payload)) x"
    " WHERE e IS NOT NULL",
    0,
};

/* The arrays' order is the table's column order: unnest's output goes in
 * as is. */
const struct hub_sql hub_sql_quarantine_insert = {
    "quarantine_insert",
    "INSERT INTO quarantine (reason, field, detail, tenant_id, source, event_id, topic,"
    "                        kafka_partition, kafka_offset, headers, value)"
    " SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],"
    "                      $6::text[], $7::text[], $8::int4[], $9::int8[], $10::jsonb[],"
    "                      $11::bytea[])",
    0,
};

int hub_sqlstate_json_grammar(const char *sqlstate) {
    /* what json input and convert_from raise (as hub_json_error catches):
     * invalid_text_representation, character_not_in_repertoire,
     * untranslatable_character, statement_too_complex (nesting depth) */
    static const char *const codes[] = {"22P02", "22021", "22P05", "54001"};
    for (size_t i = 0; sqlstate != NULL && i < sizeof(codes) / sizeof(codes[0]); i++) {
        if (strcmp(sqlstate, codes[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

/* ------------------------------------------------------- the insert -- */

/* Adds where a record was read to a[0..3): its topic, partition and offset
 * columns, or three NULLs for HTTP ingest (pos->topic NULL). */
static void add_pos(struct hub_pgarr *a, const struct hub_store_kafka_pos *pos) {
    if (pos->topic != NULL) {
        hub_pgarr_add_text(&a[0], pos->topic);
        hub_pgarr_add_i32(&a[1], pos->partition);
        hub_pgarr_add_i64(&a[2], pos->offset);
    } else { /* HTTP ingest: no topic, partition or offset */
        hub_pgarr_add(&a[0], NULL, 0);
        hub_pgarr_add(&a[1], NULL, 0);
        hub_pgarr_add(&a[2], NULL, 0);
    }
}

void hub_store_ingest_rows_init(struct hub_store_ingest_rows *rows) {
    /* the element types of $1..$17, in order */
    static const uint32_t oids[HUB_INGEST_NPARAMS] = {
        HUB_OID_INT4,  HUB_OID_TEXT,  HUB_OID_TEXT,        HUB_OID_TEXT, HUB_OID_TEXT,
        HUB_OID_TEXT,  HUB_OID_INT4,  HUB_OID_TIMESTAMPTZ, HUB_OID_TEXT, HUB_OID_JSONB,
        HUB_OID_BYTEA, HUB_OID_BYTEA, HUB_OID_TEXT,        HUB_OID_INT4, HUB_OID_INT8,
        HUB_OID_BOOL,  HUB_OID_TEXT};

    rows->n = 0;
    for (int k = 0; k < HUB_INGEST_NPARAMS; k++) {
        hub_pgarr_init(&rows->a[k], oids[k]);
    }
}

void hub_store_ingest_rows_add(struct hub_store_ingest_rows *rows, int32_t ord,
                               const struct hub_event *ev, const struct hub_store_kafka_pos *pos) {
    hub_store_ingest_rows_add_checked(rows, ord, ev, pos, NULL);
}

void hub_store_ingest_rows_add_checked(struct hub_store_ingest_rows *rows, int32_t ord,
                                       const struct hub_event *ev,
                                       const struct hub_store_kafka_pos *pos,
                                       const char *schema_version) {
    struct hub_pgarr *a = rows->a;

    hub_pgarr_add_i32(&a[0], ord);
    hub_pgarr_add_text(&a[1], ev->tenant);
    hub_pgarr_add_text(&a[2], ev->source);
    hub_pgarr_add_text(&a[3], ev->id);
    hub_pgarr_add_text(&a[4], ev->type);
    hub_pgarr_add_text(&a[5], ev->event_type);
    hub_pgarr_add_i32(&a[6], ev->schema_major);
    hub_pgarr_add_ts(&a[7], ev->time_us);
    hub_pgarr_add_text(&a[8], ev->content_type);
    hub_pgarr_add_jsonb(&a[9], ev->attrs_json, ev->attrs_json_len);
    /* an empty payload is bytes of length 0, not NULL */
    hub_pgarr_add(&a[10], ev->payload ? (const void *)ev->payload : "", ev->payload_len);
    hub_pgarr_add(&a[11], ev->digest, sizeof(ev->digest));
    add_pos(&a[12], pos);
    hub_pgarr_add_bool(&a[15], ev->json_unchecked);
    hub_pgarr_add_text(&a[16], schema_version); /* NULL: not checked (SPEC §3.5) */
    rows->n++;
}

void hub_store_ingest_fast_init(struct hub_store_ingest_fast *f) {
    memset(f, 0, sizeof(*f));
    hub_pgarr_init(&f->room_tenants, HUB_OID_TEXT);
    hub_pgarr_init(&f->room_origins, HUB_OID_INT8);
    hub_pgarr_init(&f->rooms, HUB_OID_INT4);
}

/* Frees what an offer's arrays hold (they are empty after a move). */
static void fast_arrays_free(struct hub_store_ingest_fast *f) {
    hub_pgarr_free(&f->room_tenants);
    hub_pgarr_free(&f->room_origins);
    hub_pgarr_free(&f->rooms);
}

int hub_store_ingest_rows_txn_add(struct hub_store_ingest_rows *rows,
                                  struct hub_store_ingest_fast *fast, struct hub_pg_txn *txn) {
    struct hub_pgarr a[HUB_INGEST_NPARAMS + HUB_INGEST_FAST_NPARAMS];
    struct hub_store_ingest_fast none;
    int on;
    int planned;

    if (fast == NULL) {
        hub_store_ingest_fast_init(&none);
        fast = &none;
    }
    if (rows->n == 0) {
        for (int k = 0; k < HUB_INGEST_NPARAMS; k++) {
            hub_pgarr_free(&rows->a[k]);
        }
        fast_arrays_free(fast);
        return 0;
    }
    /* the arrays move into a[]: the transaction takes them all */
    memcpy(a, rows->a, sizeof(rows->a));
    planned = rows->n >= INGEST_PLAN_MIN_ROWS;
    on = fast->owner != NULL && fast->budget > 0;
    hub_pgarr_init(&a[17], HUB_OID_TEXT);
    hub_pgarr_add_text(&a[17], on ? fast->owner : NULL);
    hub_pgarr_init(&a[18], HUB_OID_INT8);
    hub_pgarr_add_i64(&a[18], fast->lease_ms);
    hub_pgarr_init(&a[19], HUB_OID_INT4);
    hub_pgarr_add_i32(&a[19], on ? fast->budget : 0);
    a[20] = fast->room_tenants;
    a[21] = fast->room_origins;
    a[22] = fast->rooms;
    hub_pgarr_init(&a[23], HUB_OID_INT4);
    hub_pgarr_add_i32(&a[23], fast->lane_room);
    hub_pgarr_add_i32(&a[23], fast->origin_room);
    memset(rows->a, 0, sizeof(rows->a));
    hub_store_ingest_fast_init(fast); /* emptied: its arrays moved */
    fast_arrays_free(fast);
    if (!on) {
        /* nothing to lease: the plain statement, which takes $1..$17 only */
        for (int k = HUB_INGEST_NPARAMS; k < HUB_INGEST_NPARAMS + HUB_INGEST_FAST_NPARAMS; k++) {
            hub_pgarr_free(&a[k]);
        }
        return hub_pgarr_txn_add(txn,
                                 planned ? &hub_sql_ingest_insert : &hub_sql_ingest_insert_prepared,
                                 a, HUB_INGEST_NPARAMS);
    }
    return hub_pgarr_txn_add(
        txn, planned ? &hub_sql_ingest_insert_fast : &hub_sql_ingest_insert_fast_prepared, a,
        HUB_INGEST_NPARAMS + HUB_INGEST_FAST_NPARAMS);
}

/* --------------------------------------------------- the JSON check -- */

void hub_store_json_rows_init(struct hub_store_json_rows *rows) {
    hub_pgarr_init(&rows->a[0], HUB_OID_INT4);
    hub_pgarr_init(&rows->a[1], HUB_OID_BYTEA);
}

void hub_store_json_rows_add(struct hub_store_json_rows *rows, int32_t ord, const void *payload,
                             size_t len) {
    hub_pgarr_add_i32(&rows->a[0], ord);
    hub_pgarr_add(&rows->a[1], payload, len);
}

int hub_store_json_rows_txn_add(struct hub_store_json_rows *rows, struct hub_pg_txn *txn) {
    return hub_pgarr_txn_add(txn, &hub_sql_ingest_json_errors, rows->a, HUB_JSON_ERRORS_NPARAMS);
}

/* ------------------------------------------------------ quarantine -- */

void hub_store_quarantine_rows_init(struct hub_store_quarantine_rows *rows) {
    /* the element types of $1..$11, in order */
    static const uint32_t oids[HUB_QUARANTINE_NPARAMS] = {
        HUB_OID_TEXT, HUB_OID_TEXT, HUB_OID_TEXT, HUB_OID_TEXT,  HUB_OID_TEXT, HUB_OID_TEXT,
        HUB_OID_TEXT, HUB_OID_INT4, HUB_OID_INT8, HUB_OID_JSONB, HUB_OID_BYTEA};

    for (int k = 0; k < HUB_QUARANTINE_NPARAMS; k++) {
        hub_pgarr_init(&rows->a[k], oids[k]);
    }
}

void hub_store_quarantine_rows_add(struct hub_store_quarantine_rows *rows,
                                   const struct hub_store_quarantine_row *row) {
    struct hub_pgarr *a = rows->a;

    hub_pgarr_add_text(&a[0], row->reason);
    hub_pgarr_add_text(&a[1], row->field);
    hub_pgarr_add_text(&a[2], row->detail);
    hub_pgarr_add_text(&a[3], row->tenant_id);
    hub_pgarr_add_text(&a[4], row->source);
    hub_pgarr_add_text(&a[5], row->event_id);
    add_pos(&a[6], &row->pos);
    /* the headers column is NOT NULL: a record without headers has [] */
    hub_pgarr_add_jsonb(&a[9], row->headers_json ? row->headers_json : "[]",
                        row->headers_json ? strlen(row->headers_json) : 2);
    hub_pgarr_add(&a[10], row->value ? row->value : "", row->value_len);
}

int hub_store_quarantine_rows_txn_add(struct hub_store_quarantine_rows *rows,
                                      struct hub_pg_txn *txn) {
    return hub_pgarr_txn_add(txn, &hub_sql_quarantine_insert, rows->a, HUB_QUARANTINE_NPARAMS);
}

const struct hub_sql *const hub_sql_ingest_all[] = {
    &hub_sql_ingest_insert,
    &hub_sql_ingest_insert_prepared,
    &hub_sql_ingest_insert_fast,
    &hub_sql_ingest_insert_fast_prepared,
    &hub_sql_ingest_json_errors,
    &hub_sql_quarantine_insert,
    NULL,
};
