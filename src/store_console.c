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

/* The filters of the deliveries lists after the tenant, subscription and
 * event ($4 state, $5 since, $6 until, $7 before-id) on a job row j. */
#define CON_DELIV_FILTERS(j)                                                                      \
    "   AND ($4::text IS NULL OR " j ".state = $4::text)"                                         \
    "   AND ($5::timestamptz IS NULL OR " j ".created_at >= $5::timestamptz)"                     \
    "   AND ($6::timestamptz IS NULL OR " j ".created_at < $6::timestamptz)"                      \
    "   AND ($7::bigint IS NULL OR " j ".id < $7::bigint)"

/* Newest first by job id, without an event id ($3 is NULL, kept so that
 * both forms take the same parameters).  Jobs in flight are merged in from
 * delivery_jobs_leased (few: the workers'), the others read through
 * delivery_jobs_tenant_id_settled (0018) for a tenant, delivery_jobs_state_id
 * for a rare state (dead, parked) alone (0015), the primary key newest
 * first otherwise.  Each arm tests the state filter itself, so that a plan
 * made for the given values leaves out the arm that cannot match. */
#define CON_DELIV_ARM(cond)                                                                       \
    "(SELECT d.* FROM delivery_jobs d WHERE " cond                                                \
    "   AND ($1::text IS NULL OR d.tenant_id = $1::text)"                                         \
    "   AND ($2::uuid IS NULL OR d.subscription_id = $2::uuid)"                                   \
    "   AND ($3::text IS NULL OR d.event_id = $3::text)"                                          \
    CON_DELIV_FILTERS("d")                                                                        \
    " ORDER BY d.id DESC LIMIT $8::int)"
const struct hub_sql hub_sql_console_deliveries_list = {
    "console_deliveries_list",
    "SELECT j.id::text, " CON_DELIV_JSON("j", "") " FROM ("
    CON_DELIV_ARM("d.state <> 'in_flight' AND ($4::text IS NULL OR $4::text <> 'in_flight')")
    " UNION ALL "
    CON_DELIV_ARM("d.state = 'in_flight' AND ($4::text IS NULL OR $4::text = 'in_flight')")
    ") j ORDER BY j.id DESC LIMIT $8::int",
    1,
};

/* The jobs of one event id: its stored copies by event id
 * (event_inbox_event, 0017), each tenant's subscriptions, and a probe of
 * UNIQUE (subscription_id, event_seq) for each: nothing on delivery_jobs
 * beyond the keys it has anyway (an index there would take an entry at
 * each of a delivery's updates). */
const struct hub_sql hub_sql_console_deliveries_of_event = {
    "console_deliveries_of_event",
    "SELECT j.id::text, " CON_DELIV_JSON("j", "") " FROM event_inbox e"
    "  JOIN subscriptions s ON s.tenant_id = e.tenant_id"
    "  CROSS JOIN LATERAL (SELECT * FROM delivery_jobs d WHERE d.subscription_id = s.id"
    "                       AND d.event_seq = e.seq LIMIT 1) j"
    " WHERE e.event_id = $3::text AND ($1::text IS NULL OR e.tenant_id = $1::text)"
    "   AND ($2::uuid IS NULL OR s.id = $2::uuid)"
    CON_DELIV_FILTERS("j")
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
