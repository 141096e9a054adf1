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

#define DRYRUN_EVENT_COLUMNS \
    "e.seq::text, e.headers::text, e.event_type, e.content_type, e.schema_major::text, e.payload"

/* The ORDER BY ... LIMIT on (tenant_id, seq) reads the index backwards;
 * the subscription filter is a one-row lookup per event. */
const struct hub_sql hub_sql_dryrun_recent = {
    "dryrun_recent",
    "SELECT " DRYRUN_EVENT_COLUMNS
    "  FROM event_inbox e"
    " WHERE e.tenant_id = $1"
    "   AND ($2::uuid IS NULL OR EXISTS ("
    "        SELECT 1 FROM subscriptions s"
    "         WHERE s.id = $2::uuid AND s.tenant_id = $1"
    "           AND s.schema_major = e.schema_major"
    "           AND (e.event_type = ANY (s.event_types) OR '*' = ANY (s.event_types)"
    "                OR split_part(e.event_type, '.', 1) || '.*' = ANY (s.event_types))))"
    " ORDER BY e.seq DESC"
    " LIMIT $3::int4",
    0,
};

const struct hub_sql hub_sql_dryrun_seqs = {
    "dryrun_seqs",
    "SELECT " DRYRUN_EVENT_COLUMNS
    "  FROM event_inbox e"
    " WHERE e.tenant_id = $1 AND e.seq = ANY ($2::int8[])"
    " ORDER BY e.seq",
    0,
};

/* No index on policy: a trip is rare, and subscriptions are few next to
 * events; enabled ones only, as matching would admit. */
const struct hub_sql hub_sql_opevents_policy_subs = {
    "opevents_policy_subs",
    "SELECT id::text, tenant_id FROM subscriptions"
    " WHERE policy = $1 AND enabled"
    " ORDER BY id LIMIT $2::int4",
    0,
};

// clang-format on
