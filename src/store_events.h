/*
 * store_events — the SQL of the pull API (SPEC §9): a tenant's accepted
 * events read back from event_inbox in arrival order, and the statements
 * of the pull horizon (pull_horizon.h) that keep a page from passing an
 * event whose lower-sequence neighbours may still commit.
 *
 * The two event statements are run with hub_pg_txn_add_binary(): the
 * results come back in PostgreSQL's binary format, so the payload arrives
 * as the very bytes that were ingested (no bytea hex escaping to undo) and
 * seq as a big-endian int8.  Parameters are text.  The statement objects
 * are static and compared by address by pg.c.
 */
#ifndef HUB_STORE_EVENTS_H
#define HUB_STORE_EVENTS_H

#include "pg.h"

/* ------------------------------------------------------------ the hold -- */

/*
 * The advisory lock every ingest transaction holds in shared mode from
 * before its first nextval('event_seq') to its end: the pull horizon waits
 * for the holders it saw, and for nothing else.  One bigint key, the bytes
 * "shubpull"; in pg_locks it shows as locktype 'advisory', classid
 * HUB_PULL_HOLD_CLASSID, objid HUB_PULL_HOLD_OBJID, objsubid 1.  Operators
 * must not take it themselves: a session holding it holds pulls back (up to
 * STREAMING_HUB_PULL_HOLD_MAX each).
 */
#define HUB_PULL_HOLD_KEY "8316025777593609324"
#define HUB_PULL_HOLD_CLASSID "1936225634"
#define HUB_PULL_HOLD_OBJID "1886743660"

/*
 * A condition that takes the hold and is true, ANDed to the WHERE of the
 * ingest insert's CTE r (store_ingest.c): an uncorrelated sub-select, so
 * PostgreSQL runs it once, as the InitPlan of a one-time filter, before r
 * yields its first row — and so before any row reaches the nextval() of
 * the insert, which reads its rows from r.  No statement or round trip is
 * added to the transaction.  r is materialized anyway (read twice); the
 * volatile call must not go into b, which PostgreSQL would then have to
 * materialize too (a copy of every payload: +3 us of PostgreSQL CPU per
 * event in bench/ingest).
 */
#define HUB_SQL_PULL_HOLD "(SELECT pg_advisory_xact_lock_shared(" HUB_PULL_HOLD_KEY ")) IS NOT NULL"

/*
 * The horizon's snapshot, two statements in one transaction, in this order:
 *   hub_sql_pull_seq      no parameters; one row: HUB_PULL_SEQ_COL_LAST, the
 *                         last value of event_seq (int8 text, 0 when none
 *                         was ever taken)
 *   hub_sql_pull_holders  no parameters; one row: HUB_PULL_HOLDERS_COL_VXIDS,
 *                         the virtual transaction ids holding the hold, a
 *                         text[] ("{}" when none)
 * Reading the sequence first is what makes the horizon safe: a transaction
 * that took a sequence at or below it held the lock already.
 */
extern const struct hub_sql hub_sql_pull_seq;
extern const struct hub_sql hub_sql_pull_holders;
enum hub_pull_seq_col { HUB_PULL_SEQ_COL_LAST };
enum hub_pull_holders_col { HUB_PULL_HOLDERS_COL_VXIDS };

/*
 * $1 text[]: virtual transaction ids seen holding the hold.  One row:
 * HUB_PULL_STILL_COL_VXIDS, those of them that still hold it (text[]).
 */
#define HUB_SQL_PULL_STILL_NPARAMS 1
extern const struct hub_sql hub_sql_pull_still;
enum hub_pull_still_col { HUB_PULL_STILL_COL_VXIDS };

/* ---------------------------------------------------------- the events -- */

/*
 * The columns of both event statements, one row per event (binary format):
 *   SEQ           int8, big-endian: the tenant's arrival order, the cursor
 *   HEADERS       text: the stored CloudEvents attributes, a JSON object
 *   EVENT_TYPE    text: the hub's event type ("resource.event")
 *   CONTENT_TYPE  text: the stored content type (datacontenttype)
 *   PAYLOAD       bytea: the data exactly as ingested (may be empty)
 *   SCANNED       int8, big-endian (list only, same in every row): how many
 *                 events the page looked at before its byte cap; more than
 *                 the rows returned means the cap ended the page
 */
enum hub_events_col {
    HUB_EVENTS_COL_SEQ,
    HUB_EVENTS_COL_HEADERS,
    HUB_EVENTS_COL_EVENT_TYPE,
    HUB_EVENTS_COL_CONTENT_TYPE,
    HUB_EVENTS_COL_PAYLOAD,
    HUB_EVENTS_COL_SCANNED,
};

/*
 * $1 tenant, $2 after-seq (int8 text: 0 for the first page), $3 limit (int4
 * text), $4 event type or pattern ("resource.*", "*"; NULL = every type),
 * $5 horizon (int8 text: no seq above it), $6 byte cap (int8 text).
 * Rows (hub_events_col) with $2 < seq <= $5, by seq, at most $3, and only
 * while the stored bytes so far (payload + attributes) stay within $6 —
 * the first row always comes, however large.  Payloads past the cap are
 * never read: the cap is applied to sizes PostgreSQL knows without
 * detoasting them.  event_inbox_tenant_seq (migration 0009) keeps the cost
 * of a page independent of other tenants and of older events.
 */
#define HUB_SQL_EVENTS_LIST_NPARAMS 6
extern const struct hub_sql hub_sql_events_list;

/* $1 tenant, $2 seq (int8 text).  One row (hub_events_col up to PAYLOAD) or
 * none. */
#define HUB_SQL_EVENTS_ONE_NPARAMS 2
extern const struct hub_sql hub_sql_events_one;

#endif
