/*
 * store_workbench — SQL texts of the dry-run (see store_workbench.h).
 */
#include "store_workbench.h"

/* The SQL below is laid out for reading as SQL. */
// clang-format off

const struct hub_sql hub_sql_dryrun_sub = {
    "dryrun_sub",
    "SELECT policy FROM subscriptions WHERE tenant_id = $1 AND id = $2::uuid",
    0,
};

/* The columns of both event statements (hub_dryrun_event_col). */
#define DRYRUN_EVENT_COLUMNS \
    "seq::text, headers::text, event_type, content_type, schema_major::text, payload, scanned::text"

/* The events' own columns, picked by the inner queries. */
#define DRYRUN_INNER_COLUMNS \
    "e.seq, e.headers, e.event_type, e.content_type, e.schema_major, e.payload"

/* The byte cap, as the pull API's list applies it (store_events.c): the
 * inner query picks the events, the window sums their sizes (payload, and
 * the attributes as the text they are read as) in the answer's order, and
 * only the prefix within the cap is read out (the first event always).
 * octet_length() reads a TOASTed payload's size from its pointer, so the
 * payloads the cap leaves out are never fetched.  scanned counts the events
 * the inner query picked. */
#define DRYRUN_WINDOW                                                                     \
    "  SELECT p.*, sum(octet_length(p.payload) + octet_length(p.headers::text)) OVER w"  \
    "         AS upto, row_number() OVER w AS rn, count(*) OVER () AS scanned"

/* The ORDER BY ... LIMIT on (tenant_id, seq) reads event_inbox_tenant_seq
 * backwards; the subscription filter is a one-row lookup per event. */
const struct hub_sql hub_sql_dryrun_recent = {
    "dryrun_recent",
    "SELECT " DRYRUN_EVENT_COLUMNS " FROM ("
    DRYRUN_WINDOW
    "    FROM (SELECT " DRYRUN_INNER_COLUMNS
    "            FROM event_inbox e"
    "           WHERE e.tenant_id = $1"
    "             AND ($2::uuid IS NULL OR EXISTS ("
    "                  SELECT 1 FROM subscriptions s"
    "                   WHERE s.id = $2::uuid AND s.tenant_id = $1"
    "                     AND s.schema_major = e.schema_major"
    "                     AND (e.event_type = ANY (s.event_types) OR '*' = ANY (s.event_types)"
    "                          OR split_part(e.event_type, '.', 1) || '.*'"
    "                             = ANY (s.event_types))))"
    "           ORDER BY e.seq DESC LIMIT $3::int4) p"
    "  WINDOW w AS (ORDER BY p.seq DESC)"
    ") c"
    " WHERE c.upto <= $4::int8 OR c.rn = 1"
    " ORDER BY seq DESC",
    0,
};

const struct hub_sql hub_sql_dryrun_seqs = {
    "dryrun_seqs",
    "SELECT " DRYRUN_EVENT_COLUMNS " FROM ("
    DRYRUN_WINDOW
    "    FROM (SELECT " DRYRUN_INNER_COLUMNS
    "            FROM event_inbox e"
    "           WHERE e.tenant_id = $1 AND e.seq = ANY ($2::int8[])) p"
    "  WINDOW w AS (ORDER BY p.seq)"
    ") c"
    " WHERE c.upto <= $3::int8 OR c.rn = 1"
    " ORDER BY seq",
    0,
};

/* No index on policy: a trip is rare, and subscriptions are few next to
 * events; enabled ones only, as matching would admit. */
const struct hub_sql hub_sql_opevents_policy_subs = {
    "opevents_policy_subs",
    "SELECT id::text, tenant_id FROM subscriptions"
    " WHERE policy = $1 AND enabled AND ($3::text IS NULL OR tenant_id = $3::text)"
    " ORDER BY id LIMIT $2::int4",
    0,
};

// clang-format on
