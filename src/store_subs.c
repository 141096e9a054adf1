/*
 * store_subs — SQL texts of the subscription and delivery API (see
 * store_subs.h).
 *
 * As in store_admin.c, the JSON shapes are written once as macros and pasted
 * into the statements at compile time; every value is still a parameter.
 *
 * Writes are single statements of data-modifying CTEs (WITH x AS (UPDATE
 * ... RETURNING *), a AS (INSERT INTO audit_log ...)): PostgreSQL runs
 * them as one, so a change, its audit row and its idempotency record
 * commit together, and the API never has to order several statements.
 * Result columns are documented by the enums in store_subs.h; a statement
 * that changes its select list changes its enum in the same commit.
 */
#include "store_subs.h"

/* The SQL below is laid out for reading as SQL; clang-format would reflow the
 * string pieces across macro boundaries. */
// clang-format off

/* RFC 3339 in UTC whatever the session TimeZone is. */
#define SUBS_TS(col) "to_char((" col ") AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"

/* A JSON array of strings (text parameter) as text[], keeping the order. */
#define SUBS_TEXT_ARRAY(param) "ARRAY(SELECT json_array_elements_text(" param "::json))"

/*
 * The subscription object of SPEC §6 from a row alias s, plus the internal
 * "_hs" member and `extra` (", 'name', value" pairs, or "").  The API fills
 * destination.headers and strips the internal members (store_subs.h).
 */
#define SUBS_JSON(s, extra)                                                                       \
    "json_build_object('id', " s ".id, 'tenant_id', " s ".tenant_id, "                             \
    "'event_types', " s ".event_types, 'schema_major', " s ".schema_major, "                      \
    "'destination', json_build_object('kind', 'webhook', 'url', " s ".url, 'headers', NULL), "    \
    "'enabled', " s ".enabled, 'verification_state', " s ".verification_state, "                  \
    "'retry_schedule', " s ".retry_schedule, 'policy', " s ".policy, "                            \
    "'ordering', " s ".ordering, 'max_rate', " s ".max_rate, "                                    \
    "'disabled_reason', " s ".disabled_reason, "                                                  \
    "'created_at', " SUBS_TS(s ".created_at") ", 'updated_at', " SUBS_TS(s ".updated_at") ", "    \
    "'_hs', " s ".headers_sealed" extra ")::text"

/* The audit CTE "a" of a statement whose CTE "s" returns the changed
 * subscription rows: one entry per row, by the tenant, with `detail` (a
 * jsonb expression or NULL). */
#define SUBS_AUDIT(action, detail)                                                                \
    " a AS (INSERT INTO audit_log (tenant_id, actor, action, object_id, detail)"                  \
    "       SELECT s.tenant_id, 'tenant', '" action "', s.id::text, " detail " FROM s)"

/*
 * The audit entry of a verification_state transition (SPEC §6): a CTE named
 * `name` writing one "subscription.verification" entry per row of CTE s for
 * which `when` holds, with detail {"from", "to", "by"} (s.was is the state
 * before, s.verification_state after) plus the jsonb `extra` (or NULL).
 * `actor` and `by` are SQL expressions.
 */
#define SUBS_AUDIT_VERIFICATION(name, actor, by, extra, when)                                      \
    " " name " AS (INSERT INTO audit_log (tenant_id, actor, action, object_id, detail)"            \
    "       SELECT s.tenant_id, " actor ", 'subscription.verification', s.id::text,"               \
    "              jsonb_build_object('from', s.was, 'to', s.verification_state, 'by', " by ")"    \
    "              || coalesce(" extra ", '{}'::jsonb) FROM s WHERE " when ")"

/* What a verification probe needs of a subscription row s: its url, sealed
 * headers and secrets, and whether the previous secret still signs (the
 * probe block of the columns enums in store_subs.h). */
#define SUBS_PROBE_COLS(s)                                                                        \
    s ".url, " s ".headers_sealed, " s ".secret_sealed, " s ".prev_secret_sealed, "               \
    "COALESCE(" s ".prev_secret_until > now(), false)"

/* The delivery (job) object of SPEC §9 from a row alias j, plus `extra`.
 * next_attempt_at means nothing once a job is settled: null then. */
#define DELIV_JSON(j, extra)                                                                      \
    "json_build_object('id', " j ".id, 'subscription_id', " j ".subscription_id, "                \
    "'event_id', " j ".event_id, 'event_type', " j ".event_type, 'state', " j ".state, "          \
    "'reason', " j ".reason, 'attempt_count', " j ".attempt_count, "                              \
    "'next_attempt_at', CASE WHEN " j ".state IN ('succeeded', 'dead') THEN NULL ELSE "           \
    SUBS_TS(j ".next_attempt_at") " END, "                                                        \
    "'created_at', " SUBS_TS(j ".created_at") extra ")::text"

/* The attempts of job j: its rows in delivery_attempt_rows and the success
 * recorded on the job itself (migrations/0014), read from j rather than
 * through the delivery_attempts view, which would find the job again.
 * Number order; started_at orders attempts that share a number (the
 * primary key allows one per day partition). */
#define DELIV_ATTEMPTS(j)                                                                         \
    "COALESCE((SELECT json_agg(json_build_object('delivery_id', a.delivery_id, "                  \
    "'number', a.number, 'started_at', " SUBS_TS("a.started_at") ", "                             \
    "'duration_ms', a.duration_ms, 'status', a.status, 'error', a.error, "                        \
    "'response_excerpt', a.response_excerpt) ORDER BY a.number, a.started_at)"                    \
    " FROM (SELECT r.delivery_id, r.number, r.started_at, r.duration_ms, r.status, r.error,"      \
    "              r.response_excerpt FROM delivery_attempt_rows r WHERE r.job_id = " j ".id"     \
    "        UNION ALL"                                                                           \
    "       SELECT " j ".success_delivery_id, " j ".success_number, " j ".success_started_at, "   \
    j ".success_duration_ms, " j ".success_status, NULL::text, " j ".success_excerpt"             \
    "        WHERE " j ".success_delivery_id IS NOT NULL) a), '[]'::json)"

/* One statement for the whole create: the row, its audit entry and (with
 * an Idempotency-Key) the record, whose body is the same object plus the
 * sealed secret ("_ss") and the request marker ("_req").  All or none. */
const struct hub_sql hub_sql_subs_create = {
    "subs_create",
    "WITH s AS ("
    "    INSERT INTO subscriptions (id, tenant_id, event_types, schema_major, url,"
    "                               headers_sealed, secret_sealed, enabled, disabled_reason,"
    "                               retry_schedule, policy, ordering, max_rate)"
    "    SELECT $1::uuid, $2::text, " SUBS_TEXT_ARRAY("$3") ", $4::int, $5::text,"
    "           $6::text, $7::text, $8::boolean,"
    "           CASE WHEN $8::boolean THEN NULL ELSE 'disabled' END,"
    "           CASE WHEN $9::json IS NULL THEN NULL ELSE " SUBS_TEXT_ARRAY("$9") " END,"
    "           $10::text, $11::text, $12::float8"
    "     WHERE (SELECT count(*) FROM subscriptions WHERE tenant_id = $2::text) < $16::int"
    "    RETURNING *),"
    " b AS (SELECT s.id, s.tenant_id, " SUBS_JSON("s", "") " AS obj, "
             SUBS_JSON("s", ", '_ss', s.secret_sealed, '_req', $14::text") " AS stored FROM s),"
    " a AS (INSERT INTO audit_log (tenant_id, actor, action, object_id)"
    "       SELECT b.tenant_id, 'tenant', 'subscription.create', b.id::text FROM b),"
    " i AS (INSERT INTO idempotency_keys (scope, key, status, body)"
    "       SELECT $13::text, $15::text, 201, b.stored FROM b WHERE $15::text IS NOT NULL)"
    " SELECT obj FROM b",
};

const struct hub_sql hub_sql_subs_tenant_lock = {
    "subs_tenant_lock",
    "SELECT pg_advisory_xact_lock(hashtextextended('subscriptions:' || $1::text, 0))",
};

/* Every tenant statement filters on tenant_id = $1 first: another
 * tenant's id reads as absent (SPEC §11). */
const struct hub_sql hub_sql_subs_get = {
    "subs_get",
    "SELECT " SUBS_JSON("s", "") " FROM subscriptions s"
    " WHERE s.tenant_id = $1::text AND s.id = $2::uuid",
};

/* Keyset pagination on the primary key: ids are UUIDv7, so id order is
 * creation order. */
const struct hub_sql hub_sql_subs_list = {
    "subs_list",
    "SELECT s.id::text, " SUBS_JSON("s", "") " FROM subscriptions s"
    " WHERE s.tenant_id = $1::text AND ($2::uuid IS NULL OR s.id > $2::uuid)"
    " ORDER BY s.id LIMIT $3::int",
};

/*
 * "o" locks the row (FOR UPDATE) and keeps the url and verification state as
 * they were, so that url_changed compares against the value before this
 * update even when two PATCHes race, and the audit of the transition names
 * where it came from.  Each member is CASE/COALESCE'd so that NULL
 * parameters keep the stored value (store_subs.h lists which flag goes with
 * which).
 */
const struct hub_sql hub_sql_subs_patch = {
    "subs_patch",
    "WITH o AS (SELECT id, url, verification_state FROM subscriptions"
    "            WHERE tenant_id = $1::text AND id = $2::uuid FOR UPDATE),"
    " s AS ("
    "    UPDATE subscriptions x SET"
    "        event_types = CASE WHEN $3::json IS NULL THEN x.event_types"
    "                           ELSE " SUBS_TEXT_ARRAY("$3") " END,"
    "        schema_major = COALESCE($4::int, x.schema_major),"
    "        url = COALESCE($5::text, x.url),"
    "        headers_sealed = CASE WHEN $6::boolean THEN $7::text ELSE x.headers_sealed END,"
    "        retry_schedule = CASE WHEN NOT $8::boolean THEN x.retry_schedule"
    "                              WHEN $9::json IS NULL THEN NULL"
    "                              ELSE " SUBS_TEXT_ARRAY("$9") " END,"
    "        policy = CASE WHEN $10::boolean THEN $11::text ELSE x.policy END,"
    "        ordering = COALESCE($12::text, x.ordering),"
    "        max_rate = CASE WHEN $13::boolean THEN $14::float8 ELSE x.max_rate END,"
    "        enabled = COALESCE($15::boolean, x.enabled),"
    "        verification_state = CASE WHEN $5::text IS NOT NULL AND $5::text <> x.url"
    "                                  THEN 'pending' ELSE x.verification_state END,"
    "        failure_first_at = CASE WHEN ($5::text IS NOT NULL AND $5::text <> x.url)"
    "                                  OR ($15::boolean AND NOT x.enabled)"
    "                                THEN NULL ELSE x.failure_first_at END,"
    "        failure_last_at = CASE WHEN ($5::text IS NOT NULL AND $5::text <> x.url)"
    "                                 OR ($15::boolean AND NOT x.enabled)"
    "                               THEN NULL ELSE x.failure_last_at END,"
    "        disabled_reason = CASE WHEN $15::boolean IS FALSE THEN 'disabled'"
    "                               WHEN $15::boolean IS TRUE THEN NULL"
    "                               ELSE x.disabled_reason END,"
    "        updated_at = now()"
    "      FROM o WHERE x.id = o.id"
    "    RETURNING x.*, (o.url <> x.url) AS url_changed, o.verification_state AS was),"
    SUBS_AUDIT("subscription.update", "$16::jsonb") ","
    SUBS_AUDIT_VERIFICATION("v", "'tenant'", "'url_change'", "NULL", "s.url_changed")
    " SELECT " SUBS_JSON("s", "") ", s.url_changed, s.id::text,"
    "        pg_notify('" HUB_SUBS_CHANGED_CHANNEL "', s.id::text), " SUBS_PROBE_COLS("s") " FROM s",
};

/* Jobs go with the subscription (ON DELETE CASCADE, migrations/0003);
 * attempts, partitioned by day, stay until retention drops their day.
 * The audit row keeps the id; the notification reaches every dispatcher
 * at the commit. */
const struct hub_sql hub_sql_subs_delete = {
    "subs_delete",
    "WITH s AS (DELETE FROM subscriptions WHERE tenant_id = $1::text AND id = $2::uuid"
    "           RETURNING id, tenant_id),"
    SUBS_AUDIT("subscription.delete", "NULL")
    " SELECT s.id::text, pg_notify('" HUB_SUBS_CHANGED_CHANNEL "', s.id::text) FROM s",
};

/* The object (for the answer) and the probe block in one read. */
const struct hub_sql hub_sql_subs_probe_load = {
    "subs_probe_load",
    "SELECT " SUBS_JSON("s", "") ", " SUBS_PROBE_COLS("s") " FROM subscriptions s WHERE s.tenant_id = $1::text AND s.id = $2::uuid",
};

const struct hub_sql hub_sql_subs_outcome_lock_timeout = {
    "subs_outcome_lock_timeout",
    "SELECT set_config('lock_timeout', '200ms', true)",
    0,
};

/* The url guard: a PATCH to another url while /verify ran makes this a
 * no-op (no row), which the API answers as 409.  "o" locks the row first,
 * so a PATCH in progress is waited for and its url is the one compared,
 * and keeps the state before for the transition's audit entry.  The
 * idempotency record stores the answer as the API sends it: the object and
 * its "verification" member ($9, made by the API). */
const struct hub_sql hub_sql_subs_verify_result = {
    "subs_verify_result",
    "WITH o AS (SELECT id, verification_state FROM subscriptions"
    "            WHERE tenant_id = $1::text AND id = $2::uuid AND url = $4::text FOR UPDATE),"
    " s AS ("
    "    UPDATE subscriptions x SET"
    "        verification_state = CASE WHEN $3::boolean THEN 'active' ELSE 'failed' END,"
    "        enabled = x.enabled OR $3::boolean,"
    "        disabled_reason = CASE WHEN $3::boolean THEN NULL ELSE x.disabled_reason END,"
    "        failure_first_at = CASE WHEN $3::boolean THEN NULL ELSE x.failure_first_at END,"
    "        failure_last_at = CASE WHEN $3::boolean THEN NULL ELSE x.failure_last_at END,"
    "        updated_at = now()"
    "      FROM o WHERE x.id = o.id"
    "    RETURNING x.*, o.verification_state AS was),"
    SUBS_AUDIT("subscription.verify", "$5::jsonb") ","
    SUBS_AUDIT_VERIFICATION("v", "'tenant'", "'verify'", "NULL",
                            "s.was IS DISTINCT FROM s.verification_state") ","
    " i AS (INSERT INTO idempotency_keys (scope, key, status, body)"
    "       SELECT $6::text, $7::text, 200,"
    "              " SUBS_JSON("s", ", 'verification', $9::json, '_req', $8::text")
    "         FROM s WHERE $7::text IS NOT NULL)"
    " SELECT " SUBS_JSON("s", "") " FROM s",
};

/* A background result applies only to the state it probed: still
 * pending, same url.  The destination headers and the secrets are not the
 * challenge's subject (a change of them does not reset verification), so
 * they are not compared.  Its transition is audited (actor "hub"). */
const struct hub_sql hub_sql_subs_probe_result = {
    "subs_probe_result",
    "WITH s AS ("
    "    UPDATE subscriptions SET"
    "        verification_state = CASE WHEN $2::boolean THEN 'active' ELSE 'failed' END,"
    "        updated_at = now()"
    "     WHERE id = $1::uuid AND verification_state = 'pending' AND url = $3::text"
    "    RETURNING id, tenant_id, 'pending'::text AS was, verification_state),"
    SUBS_AUDIT_VERIFICATION("v", "'hub'", "'probe'", "$4::jsonb", "true")
    " SELECT s.id FROM s",
};

/* With a grace of 0 the previous secret is dropped at once (NULLs);
 * otherwise the current one moves to prev_secret_sealed until now + grace.
 * The idempotency record keeps the new secret sealed, like a create's. */
const struct hub_sql hub_sql_subs_rotate = {
    "subs_rotate",
    "WITH s AS ("
    "    UPDATE subscriptions SET"
    "        prev_secret_sealed = CASE WHEN $4::bigint > 0 THEN secret_sealed END,"
    "        prev_secret_until = CASE WHEN $4::bigint > 0"
    "                                 THEN now() + $4::bigint * interval '1 millisecond' END,"
    "        secret_sealed = $3::text,"
    "        updated_at = now()"
    "     WHERE tenant_id = $1::text AND id = $2::uuid"
    "    RETURNING *),"
    " b AS (SELECT s.id, s.tenant_id, " SUBS_JSON("s", "") " AS obj, "
             SUBS_JSON("s", ", '_ss', s.secret_sealed, '_req', $7::text") " AS stored FROM s),"
    " a AS (INSERT INTO audit_log (tenant_id, actor, action, object_id, detail)"
    "       SELECT b.tenant_id, 'tenant', 'subscription.rotate_secret', b.id::text, $8::jsonb"
    "         FROM b),"
    " i AS (INSERT INTO idempotency_keys (scope, key, status, body)"
    "       SELECT $5::text, $6::text, 200, b.stored FROM b WHERE $6::text IS NOT NULL)"
    " SELECT obj FROM b",
};

/* For the deliveries list: tells "no such subscription" from "no jobs". */
const struct hub_sql hub_sql_subs_exists = {
    "subs_exists",
    "SELECT 1 FROM subscriptions WHERE tenant_id = $1::text AND id = $2::uuid",
};

/* The filters of a subscription's deliveries list ($3 state, $4
 * before-id, $7 since, $8 until) on a job row j. */
#define DELIV_FILTERS(j)                                                                          \
    "   AND ($3::text IS NULL OR " j ".state = $3::text)"                                         \
    "   AND ($4::bigint IS NULL OR " j ".id < $4::bigint)"                                        \
    "   AND ($7::timestamptz IS NULL OR " j ".created_at >= $7::timestamptz)"                     \
    "   AND ($8::timestamptz IS NULL OR " j ".created_at < $8::timestamptz)"

/* Newest first by job id (bigint), keyset on it; $6 (the event id) is NULL
 * here, kept so that both forms take the same parameters.  Jobs in flight
 * are merged in as in the console's list (store_console.c, migrations/0018):
 * each arm tests the state filter itself. */
#define DELIV_ARM(cond)                                                                           \
    "(SELECT d.* FROM delivery_jobs d WHERE " cond                                                \
    "   AND d.tenant_id = $1::text AND d.subscription_id = $2::uuid"                              \
    "   AND ($6::text IS NULL OR d.event_id = $6::text)"                                          \
    DELIV_FILTERS("d")                                                                            \
    " ORDER BY d.id DESC LIMIT $5::int)"
const struct hub_sql hub_sql_deliveries_list = {
    "deliveries_list",
    "SELECT j.id::text, " DELIV_JSON("j", "") " FROM ("
    DELIV_ARM("d.state <> 'in_flight' AND ($3::text IS NULL OR $3::text <> 'in_flight')")
    " UNION ALL "
    DELIV_ARM("d.state = 'in_flight' AND ($3::text IS NULL OR $3::text = 'in_flight')")
    ") j ORDER BY j.id DESC LIMIT $5::int",
    1, /* optional filters: a generic plan could not choose by them */
};

/* One event id's job in the subscription: the tenant's stored copies of it
 * (event_inbox_event, migrations/0017), each probing UNIQUE
 * (subscription_id, event_seq). */
const struct hub_sql hub_sql_deliveries_of_event = {
    "deliveries_of_event",
    "SELECT j.id::text, " DELIV_JSON("j", "") " FROM event_inbox e"
    "  CROSS JOIN LATERAL (SELECT * FROM delivery_jobs d WHERE d.subscription_id = $2::uuid"
    "                       AND d.event_seq = e.seq LIMIT 1) j"
    " WHERE e.event_id = $6::text AND e.tenant_id = $1::text AND j.tenant_id = $1::text"
    DELIV_FILTERS("j")
    " ORDER BY j.id DESC LIMIT $5::int",
    1,
};

/* The job and all its attempts, in one object. */
const struct hub_sql hub_sql_delivery_get = {
    "delivery_get",
    "SELECT " DELIV_JSON("j", ", 'attempts', " DELIV_ATTEMPTS("j")) " FROM delivery_jobs j"
    " WHERE j.tenant_id = $1::text AND j.id = $2::bigint",
};

/*
 * Only a dead job of a verified subscription: anything else is left alone
 * (no row), and hub_sql_delivery_state says why.  "s" takes the
 * subscription FOR SHARE: a url change (verification back to pending)
 * committing meanwhile is waited for and seen, and one that starts after
 * waits for this statement and parks the job it made due (migrations/0011).
 * A disabled subscription's job is parked rather than made due (it resumes
 * when enabled).  fifo is read from the subscription now, as its ordering
 * may have changed since the job was made; the lease is cleared so any hub
 * may claim it.
 */
const struct hub_sql hub_sql_delivery_redeliver = {
    "delivery_redeliver",
    "WITH s AS ("
    "    SELECT s.id, s.enabled, s.ordering FROM delivery_jobs d"
    "      JOIN subscriptions s ON s.id = d.subscription_id"
    "     WHERE d.tenant_id = $1::text AND d.id = $2::bigint"
    "       AND s.verification_state = 'active' FOR SHARE OF s),"
    " j AS ("
    "    UPDATE delivery_jobs SET"
    "           state = CASE WHEN (SELECT enabled FROM s) THEN 'pending' ELSE 'parked' END,"
    "           next_attempt_at = now(), reason = NULL,"
    "           lease_owner = NULL, lease_until = NULL, reclaims = 0, updated_at = now(),"
    "           fifo = (SELECT ordering = 'fifo' FROM s)"
    "     WHERE tenant_id = $1::text AND id = $2::bigint AND state = 'dead'"
    "       AND EXISTS (SELECT 1 FROM s)"
    "    RETURNING *),"
    " a AS (INSERT INTO audit_log (tenant_id, actor, action, object_id)"
    "       SELECT j.tenant_id, 'tenant', 'delivery.redeliver', j.id::text FROM j),"
    " i AS (INSERT INTO idempotency_keys (scope, key, status, body)"
    "       SELECT $3::text, $4::text, 200, " DELIV_JSON("j", ", '_req', $5::text")
    "         FROM j WHERE $4::text IS NOT NULL)"
    " SELECT " DELIV_JSON("j", "") " FROM j",
};

/*
 * Replay (store_subs.h), step by step: s the subscription (none: another
 * tenant's or absent), taken FOR SHARE so that a url change committing
 * meanwhile is waited for and seen (and one starting later waits and parks
 * the jobs made here); ok the same row only while verified (the gate: SPEC
 * §6); p its patterns and the asked ones; recent the last replay within $6
 * (its audit row doubles as the rate limit, which every hub process then
 * shares); ev the events (the day range lets PostgreSQL skip whole inbox
 * partitions); j the jobs made or re-armed (parked while the subscription
 * is disabled); a the audit row; r the answer, as JSON (the API sends it as
 * it is) and as the idempotency record stores it (with "_req"); i that
 * record.  The final SELECT reports each step.
 *
 * The limit's times are this statement's start, after the lock, not now():
 * a replay that waited seconds for the one before it would otherwise be
 * stamped (and compare) as of when it began to wait, and pass the limit.
 */
/* An event of type e.event_type matches one of the patterns pats (a text[]
 * expression): the type itself, "<resource>.*" or "*" (SPEC §6). */
#define REPLAY_MATCHES(pats)                                                                       \
    "(e.event_type = ANY (" pats ") OR split_part(e.event_type, '.', 1) || '.*' = ANY (" pats ")"  \
    " OR '*' = ANY (" pats "))"

/* The replay's answer (SPEC §9) plus `extra`; "next_since" only when the
 * batch was full ($7 events), as events may be left after it. */
#define REPLAY_JSON(extra)                                                                         \
    "json_build_object('subscription_id', $2::uuid::text,"                                         \
    " 'since', " SUBS_TS("$3::timestamptz") ", 'until', " SUBS_TS("$4::timestamptz") ","           \
    " 'events', (SELECT count(*) FROM ev),"                                                        \
    " 'created', (SELECT count(*) FROM j WHERE created),"                                          \
    " 'rearmed', (SELECT count(*) FROM j WHERE NOT created),"                                      \
    " 'truncated', (SELECT count(*) FROM ev) >= $7::int,"                                          \
    " 'next_since', CASE WHEN (SELECT count(*) FROM ev) >= $7::int THEN"                           \
    "     (SELECT " SUBS_TS("max(received_at)") " FROM ev) END" extra ")::text"

/* Serialises the replays of one subscription: the replay statement after
 * it takes its snapshot once the lock is held, so it sees the audit row of
 * a replay that just committed, and two sent at once (on one process or
 * several) cannot both pass the rate limit. */
const struct hub_sql hub_sql_subs_replay_lock = {
    "subs_replay_lock",
    "SELECT pg_advisory_xact_lock(hashtextextended('subscription_replay:' || $1::text, 0))",
    0,
};

const struct hub_sql hub_sql_subs_replay = {
    "subs_replay",
    "WITH s AS ("
    "  SELECT id, schema_major, event_types, ordering, enabled, verification_state"
    "    FROM subscriptions WHERE tenant_id = $1::text AND id = $2::uuid FOR SHARE"
    "), ok AS ("
    "  SELECT * FROM s WHERE verification_state = 'active'"
    "), p AS ("
    "  SELECT (SELECT event_types FROM s) AS pats,"
    "         CASE WHEN $5::jsonb IS NOT NULL"
    "              THEN ARRAY(SELECT jsonb_array_elements_text($5::jsonb)) END AS asked"
    "), recent AS ("
    "  SELECT max(at) AS at FROM audit_log"
    "   WHERE tenant_id = $1::text AND action = 'subscription.replay' AND object_id = $2::text"
    "     AND at > statement_timestamp() - $6::bigint * interval '1 millisecond'"
    "), ev AS ("
    "  SELECT e.seq, e.day, e.event_id, e.event_type, e.received_at FROM event_inbox e, ok s, p"
    "   WHERE (SELECT at FROM recent) IS NULL AND e.tenant_id = $1::text"
    "     AND e.day BETWEEN ($3::timestamptz AT TIME ZONE 'UTC')::date"
    "                   AND ($4::timestamptz AT TIME ZONE 'UTC')::date"
    "     AND e.received_at >= $3::timestamptz AND e.received_at < $4::timestamptz"
    "     AND e.schema_major = s.schema_major"
    "     AND " REPLAY_MATCHES("p.pats")
    "     AND (p.asked IS NULL OR " REPLAY_MATCHES("p.asked") ")"
    "   ORDER BY e.received_at, e.seq LIMIT $7::int"
    "), j AS ("
    "  INSERT INTO delivery_jobs (subscription_id, tenant_id, event_seq, event_day, event_id,"
    "                             event_type, fifo, state)"
    "  SELECT s.id, $1::text, ev.seq, ev.day, ev.event_id, ev.event_type, s.ordering = 'fifo',"
    "         CASE WHEN s.enabled THEN 'pending' ELSE 'parked' END"
    "    FROM ev, ok s"
    "  ON CONFLICT (subscription_id, event_seq) DO UPDATE"
    "     SET state = EXCLUDED.state, next_attempt_at = now(), reason = NULL, lease_owner = NULL,"
    "         lease_until = NULL, reclaims = 0, updated_at = now(), fifo = EXCLUDED.fifo"
    "   WHERE delivery_jobs.state IN ('succeeded', 'dead')"
    "  RETURNING (xmax = 0) AS created"
    "), a AS ("
    "  INSERT INTO audit_log (tenant_id, actor, action, object_id, detail, at)"
    "  SELECT $1::text, 'tenant', 'subscription.replay', $2::text,"
    "         jsonb_build_object('since', $3::timestamptz, 'until', $4::timestamptz,"
    "                            'event_types', (SELECT to_jsonb(coalesce(asked, pats)) FROM p),"
    "                            'events', (SELECT count(*) FROM ev),"
    "                            'created', (SELECT count(*) FROM j WHERE created),"
    "                            'rearmed', (SELECT count(*) FROM j WHERE NOT created)),"
    "         statement_timestamp()"
    "   WHERE EXISTS (SELECT 1 FROM ok) AND (SELECT at FROM recent) IS NULL"
    "), r AS ("
    "  SELECT " REPLAY_JSON("") " AS body, " REPLAY_JSON(", '_req', $10::text") " AS stored"
    "   WHERE EXISTS (SELECT 1 FROM ok) AND (SELECT at FROM recent) IS NULL"
    "), i AS ("
    "  INSERT INTO idempotency_keys (scope, key, status, body)"
    "  SELECT $8::text, $9::text, 202, r.stored FROM r WHERE $9::text IS NOT NULL"
    ")"
    " SELECT (SELECT count(*) FROM s),"
    "        (SELECT greatest(1, ceil(extract(epoch FROM at + $6::bigint * interval '1 millisecond'"
    "                                                - statement_timestamp())))::int"
    "           FROM recent WHERE at IS NOT NULL),"
    "        (SELECT verification_state FROM s),"
    "        (SELECT count(*) FROM ev), (SELECT count(*) FROM j WHERE created),"
    "        (SELECT count(*) FROM j WHERE NOT created),"
    "        (SELECT body FROM r)",
};

/* Read after a refused redeliver, to say which state refused it: the
 * job's, or its subscription's verification. */
const struct hub_sql hub_sql_delivery_state = {
    "delivery_state",
    "SELECT j.state, s.verification_state FROM delivery_jobs j"
    "  JOIN subscriptions s ON s.id = j.subscription_id"
    " WHERE j.tenant_id = $1::text AND j.id = $2::bigint",
};

// clang-format on
