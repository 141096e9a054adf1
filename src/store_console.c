/*
 * store_console — SQL texts of the console's admin read routes (see
 * store_console.h).  The object shapes are macros pasted into the
 * statements at compile time; every value travels as a parameter.
 */
#include "store_console.h"

/* The SQL below is laid out for reading as SQL; clang-format would reflow the
 * string pieces across macro boundaries. */
// clang-format off

/* RFC 3339 in UTC whatever the session TimeZone is. */
#define CON_TS(col) "to_char((" col ") AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"

/* The subscription of the tenant API from a row alias s, without its sealed
 * credentials (the operator sees only whether there are some), plus the
 * failure streak that auto-disable reads (SPEC §7.7). */
#define CON_SUBS_JSON(s)                                                                          \
    "json_build_object('id', " s ".id, 'tenant_id', " s ".tenant_id, "                             \
    "'event_types', " s ".event_types, 'schema_major', " s ".schema_major, "                      \
    "'destination', json_build_object('kind', 'webhook', 'url', " s ".url, 'headers', NULL), "    \
    "'has_headers', " s ".headers_sealed IS NOT NULL, "                                           \
    "'enabled', " s ".enabled, 'verification_state', " s ".verification_state, "                  \
    "'retry_schedule', " s ".retry_schedule, 'policy', " s ".policy, "                            \
    "'ordering', " s ".ordering, 'max_rate', " s ".max_rate, "                                    \
    "'disabled_reason', " s ".disabled_reason, "                                                  \
    "'failure_first_at', " CON_TS(s ".failure_first_at") ", "                                     \
    "'failure_last_at', " CON_TS(s ".failure_last_at") ", "                                       \
    "'created_at', " CON_TS(s ".created_at") ", 'updated_at', " CON_TS(s ".updated_at") ")::text"

/* The delivery of SPEC §9 from a row alias j, with the tenant it belongs to
 * (the operator's lists mix tenants) and when it last changed, plus extra. */
#define CON_DELIV_JSON(j, extra)                                                                  \
    "json_build_object('id', " j ".id, 'tenant_id', " j ".tenant_id, "                            \
    "'subscription_id', " j ".subscription_id, "                                                  \
    "'event_id', " j ".event_id, 'event_type', " j ".event_type, 'state', " j ".state, "          \
    "'reason', " j ".reason, 'attempt_count', " j ".attempt_count, "                              \
    "'next_attempt_at', CASE WHEN " j ".state IN ('succeeded', 'dead') THEN NULL ELSE "           \
    CON_TS(j ".next_attempt_at") " END, "                                                         \
    "'created_at', " CON_TS(j ".created_at") ", 'updated_at', " CON_TS(j ".updated_at")           \
    extra ")::text"

/* Keyset on the primary key (UUIDv7: creation order); the tenant filter
 * uses subscriptions_tenant (tenant_id, id). */
const struct hub_sql hub_sql_console_subs_list = {
    "console_subs_list",
    "SELECT s.id::text, " CON_SUBS_JSON("s") " FROM subscriptions s"
    " WHERE ($1::text IS NULL OR s.tenant_id = $1::text)"
    "   AND ($2::uuid IS NULL OR s.id > $2::uuid)"
    " ORDER BY s.id LIMIT $3::int",
    1,
};

/* Newest first by job id.  An event id is looked up through
 * delivery_jobs_event (event_id, tenant_id), with or without a tenant;
 * a tenant alone through delivery_jobs_tenant_id; a rare state (dead,
 * parked) alone through delivery_jobs_state_id (0015), a common one by the
 * primary key newest first. */
const struct hub_sql hub_sql_console_deliveries_list = {
    "console_deliveries_list",
    "SELECT j.id::text, " CON_DELIV_JSON("j", "") " FROM delivery_jobs j"
    " WHERE ($1::text IS NULL OR j.tenant_id = $1::text)"
    "   AND ($2::uuid IS NULL OR j.subscription_id = $2::uuid)"
    "   AND ($3::text IS NULL OR j.event_id = $3::text)"
    "   AND ($4::text IS NULL OR j.state = $4::text)"
    "   AND ($5::timestamptz IS NULL OR j.created_at >= $5::timestamptz)"
    "   AND ($6::timestamptz IS NULL OR j.created_at < $6::timestamptz)"
    "   AND ($7::bigint IS NULL OR j.id < $7::bigint)"
    " ORDER BY j.id DESC LIMIT $8::int",
    1,
};

/* The attempts as the tenant API gives them (store_subs.c DELIV_ATTEMPTS). */
const struct hub_sql hub_sql_console_delivery_get = {
    "console_delivery_get",
    "SELECT " CON_DELIV_JSON("j", ", 'attempts', "
        "COALESCE((SELECT json_agg(json_build_object('delivery_id', a.delivery_id, "
        "'number', a.number, 'started_at', " CON_TS("a.started_at") ", "
        "'duration_ms', a.duration_ms, 'status', a.status, 'error', a.error, "
        "'response_excerpt', a.response_excerpt) ORDER BY a.number, a.started_at)"
        " FROM delivery_attempts a WHERE a.job_id = j.id), '[]'::json)")
    " FROM delivery_jobs j WHERE j.id = $1::bigint",
};
