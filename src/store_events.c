/*
 * store_events — SQL texts of the pull API (see store_events.h).
 */
#include "store_events.h"

/* The SQL below is laid out for reading as SQL. */
// clang-format off

/* The select list both statements share, in the order of hub_events_col. */
#define EVENTS_COLUMNS "seq, headers::text, event_type, content_type, payload"

/* The pattern test mirrors the subscription match of SPEC §6: the exact
 * type, "*", or "<resource>.*" against the type's first segment. */
const struct hub_sql hub_sql_events_list = {
    "events_list",
    "SELECT " EVENTS_COLUMNS
    "  FROM event_inbox"
    " WHERE tenant_id = $1 AND seq > $2::int8"
    "   AND ($4::text IS NULL OR $4 = '*' OR event_type = $4"
    "        OR (right($4, 2) = '.*' AND split_part(event_type, '.', 1) || '.*' = $4))"
    " ORDER BY seq LIMIT $3::int4",
    0,
};

const struct hub_sql hub_sql_events_one = {
    "events_one",
    "SELECT " EVENTS_COLUMNS
    "  FROM event_inbox"
    " WHERE tenant_id = $1 AND seq = $2::int8",
    0,
};

// clang-format on
