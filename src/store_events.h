/*
 * store_events — the SQL of the pull API (SPEC §9): a tenant's accepted
 * events read back from event_inbox in arrival order.
 *
 * Both statements are run with hub_pg_txn_add_binary(): the results come
 * back in PostgreSQL's binary format, so the payload arrives as the very
 * bytes that were ingested (no bytea hex escaping to undo) and seq as a
 * big-endian int8.  Parameters are text.  The statement objects are static
 * and compared by address by pg.c.
 */
#ifndef HUB_STORE_EVENTS_H
#define HUB_STORE_EVENTS_H

#include "pg.h"

/*
 * The columns of both statements, one row per event (binary format):
 *   SEQ           int8, big-endian: the tenant's arrival order, the cursor
 *   HEADERS       text: the stored CloudEvents attributes, a JSON object
 *   EVENT_TYPE    text: the hub's event type ("resource.event")
 *   CONTENT_TYPE  text: the stored content type (datacontenttype)
 *   PAYLOAD       bytea: the data exactly as ingested (may be empty)
 */
enum hub_events_col {
    HUB_EVENTS_COL_SEQ,
    HUB_EVENTS_COL_HEADERS,
    HUB_EVENTS_COL_EVENT_TYPE,
    HUB_EVENTS_COL_CONTENT_TYPE,
    HUB_EVENTS_COL_PAYLOAD,
};

/*
 * $1 tenant, $2 after-seq (int8 text: 0 for the first page), $3 limit (int4
 * text), $4 event type or pattern ("resource.*", "*"; NULL = every type).
 * Rows (hub_events_col) with seq > $2, by seq, at most $3.
 * event_inbox_tenant_seq (migration 0009) keeps the cost of a page
 * independent of other tenants and of older events.
 */
#define HUB_SQL_EVENTS_LIST_NPARAMS 4
extern const struct hub_sql hub_sql_events_list;

/* $1 tenant, $2 seq (int8 text).  One row (hub_events_col) or none. */
#define HUB_SQL_EVENTS_ONE_NPARAMS 2
extern const struct hub_sql hub_sql_events_one;

#endif
