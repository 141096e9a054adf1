/*
 * store_console — the SQL of the operator's read routes across tenants that
 * the web console uses (GET /admin/subscriptions, GET /admin/deliveries,
 * GET /admin/deliveries/{id}; api_admin.c).
 *
 * Every statement is parameterised and casts each parameter; objects are
 * rendered by PostgreSQL as JSON text, timestamps RFC 3339 UTC with
 * microseconds.  The filters are "NULL means any", so the statements are
 * planned for each execution (plan_each_time): a generic plan of such a
 * statement cannot pick the index that the given filters allow.
 * migrations/0015_console_indexes.sql and 0017 add the indexes they rely on.
 */
#ifndef HUB_STORE_CONSOLE_H
#define HUB_STORE_CONSOLE_H

#include "pg.h"

/* The columns of the list statements: the row's key (the next page's
 * cursor carries it), then the object's JSON text. */
enum hub_console_page_col {
    HUB_CONSOLE_PAGE_KEY,
    HUB_CONSOLE_PAGE_OBJECT,
};

/* The column of a statement that returns one object. */
enum hub_console_object_col {
    HUB_CONSOLE_OBJECT,
};

/*
 * $1 tenant (or NULL: every tenant), $2 after-id (uuid text or NULL), $3
 * limit.  Rows (hub_console_page_col: id, subscription) by id.  The
 * subscription object is the tenant API's (SPEC §9) plus its failure streak
 * (failure_first_at, failure_last_at) and "has_headers"; destination
 * credentials are never read (headers is null).
 */
extern const struct hub_sql hub_sql_console_subs_list;

/*
 * $1 tenant, $2 subscription (uuid), $3 event id, $4 state, $5 since, $6
 * until (timestamptz text: created_at in [since, until)), $7 before-id
 * (bigint), each NULL for "any"; $8 limit.  Rows (hub_console_page_col: job
 * id, delivery with its tenant_id and updated_at), newest first.  With an
 * event id, hub_sql_console_deliveries_of_event finds its jobs by key
 * (hub_console_deliveries_sql picks the form); the list also serves the
 * tenant's GET /v1/deliveries, with $1 its tenant.
 */
extern const struct hub_sql hub_sql_console_deliveries_list;
extern const struct hub_sql hub_sql_console_deliveries_of_event;

/* The form of the deliveries list for these filters ($3 the event id, or
 * NULL). */
static inline const struct hub_sql *hub_console_deliveries_sql(const char *event_id) {
    return event_id != NULL ? &hub_sql_console_deliveries_of_event
                            : &hub_sql_console_deliveries_list;
}

/* $1 job id.  One row (hub_console_object_col: the delivery with its
 * tenant_id and its attempts, as GET /v1/deliveries/{id}) or none. */
extern const struct hub_sql hub_sql_console_delivery_get;

#endif
