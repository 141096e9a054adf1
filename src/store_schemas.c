/*
 * store_schemas — the schema registry's SQL (see store_schemas.h).
 */
#include "store_schemas.h"

/* Timestamps as the rest of the API writes them (RFC 3339, UTC, µs). */
#define SCH_TS(col) "to_char((" col ") AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"

/* The schema object of a row alias s, without the schema itself. */
#define SCH_OBJECT(s)                                                                              \
    "json_build_object('event_type', " s ".event_type, 'version', " s ".version,"                  \
    " 'scope', CASE WHEN " s ".tenant_id = '' THEN 'platform' ELSE 'tenant' END,"                  \
    " 'digest', 'sha256:' || " s ".digest, 'registered_at', " SCH_TS(                              \
        s ".registered_at") ","                                                                    \
                            " 'registered_by', " s ".registered_by,"                               \
                            " 'retired_at', " SCH_TS(s ".retired_at") ")"

/* 'prev' is the highest live version below the new one in the same scope,
 * type and major: the one the new minor or patch must stay compatible
 * with (docs/schemas.md). */
const struct hub_sql hub_sql_schema_prior = {
    "schema_prior",
    "(SELECT 'same', version, digest, schema FROM event_schemas"
    "  WHERE tenant_id = $1::text AND event_type = $2::text AND version = $3::text"
    "    AND retired_at IS NULL)"
    " UNION ALL"
    " (SELECT 'prev', version, digest, schema FROM event_schemas"
    "   WHERE tenant_id = $1::text AND event_type = $2::text AND major = $4::int4"
    "     AND (minor, patch) < ($5::int4, $6::int4) AND retired_at IS NULL"
    "   ORDER BY minor DESC, patch DESC LIMIT 1)",
    0,
};

/* The digest is taken here, over the text stored, so it is the same on
 * every process and in every answer. */
/* Serialises the registrations of one scope, so that the caps of
 * schema_put are checked against every committed insert of that scope. */
const struct hub_sql hub_sql_schema_scope_lock = {
    "schema_scope_lock",
    "SELECT pg_advisory_xact_lock(hashtextextended('event_schemas:' || $1::text, 0))",
    0,
};

/* The insert happens only under the scope's caps; when it does not, the
 * one row says what the scope holds, so the caller can name the cap. */
const struct hub_sql hub_sql_schema_put = {
    "schema_put",
    "WITH u AS ("
    "    SELECT count(*) AS n, coalesce(sum(octet_length(schema)), 0) AS bytes,"
    "           (SELECT version FROM event_schemas"
    "             WHERE tenant_id = $1::text AND event_type = $2::text AND major = $4::int4"
    "               AND (minor, patch) < ($5::int4, $6::int4) AND retired_at IS NULL"
    "             ORDER BY minor DESC, patch DESC LIMIT 1)"
    "             IS DISTINCT FROM $11::text AS prior_changed"
    "      FROM event_schemas WHERE tenant_id = $1::text AND retired_at IS NULL),"
    " s AS ("
    "    INSERT INTO event_schemas (tenant_id, event_type, version, major, minor, patch, schema,"
    "                               digest, registered_by)"
    "    SELECT $1::text, $2::text, $3::text, $4::int4, $5::int4, $6::int4, $7::text,"
    "           encode(sha256(convert_to($7::text, 'UTF8')), 'hex'), $8::text"
    "      FROM u WHERE u.n < $9::int8 AND u.bytes + octet_length($7::text) <= $10::int8"
    "       AND NOT u.prior_changed"
    "    RETURNING *),"
    " a AS (INSERT INTO audit_log (tenant_id, actor, action, object_id, detail)"
    "       SELECT NULLIF(s.tenant_id, ''), s.registered_by, 'schema.register',"
    "              s.event_type || '/' || s.version, json_build_object('digest', s.digest)"
    "         FROM s)"
    " SELECT " SCH_OBJECT("s") "::text, NULL::text, NULL::text, NULL::bool FROM s"
                               " UNION ALL"
                               " SELECT NULL::text, u.n::text, u.bytes::text, u.prior_changed"
                               "   FROM u WHERE NOT EXISTS (SELECT 1 FROM s)",
    0,
};

/* The schema member is the stored text parsed back: what was registered,
 * keys sorted. */
const struct hub_sql hub_sql_schema_get = {
    "schema_get",
    "SELECT (" SCH_OBJECT(
        "s") "::jsonb || jsonb_build_object('schema', s.schema::jsonb))::text"
             "  FROM event_schemas s"
             " WHERE s.tenant_id = $1::text AND s.event_type = $2::text AND s.version = $3::text"
             "   AND s.retired_at IS NULL",
    0,
};

/* A tenant's list ($3) shows the platform's versions beside its own: the
 * precedence per major is the registry's to apply, the list shows both. */
const struct hub_sql hub_sql_schema_list = {
    "schema_list",
    "SELECT " SCH_OBJECT(
        "s") "::text FROM event_schemas s"
             " WHERE (s.tenant_id = $1::text OR ($3::boolean AND s.tenant_id = ''))"
             "   AND ($2::text IS NULL OR s.event_type = $2::text) AND s.retired_at IS NULL"
             " ORDER BY s.event_type, s.tenant_id, s.major, s.minor, s.patch LIMIT 1000",
    0,
};

/* A retired row stays (events keep naming its version); the partial unique
 * index lets the same version be registered again. */
const struct hub_sql hub_sql_schema_retire = {
    "schema_retire",
    "WITH s AS ("
    "    UPDATE event_schemas SET retired_at = now(), retired_by = $4::text"
    "     WHERE tenant_id = $1::text AND event_type = $2::text AND version = $3::text"
    "       AND retired_at IS NULL"
    "    RETURNING *),"
    " a AS (INSERT INTO audit_log (tenant_id, actor, action, object_id, detail)"
    "       SELECT NULLIF(s.tenant_id, ''), $4::text, 'schema.retire',"
    "              s.event_type || '/' || s.version, json_build_object('digest', s.digest)"
    "         FROM s)"
    " SELECT " SCH_OBJECT("s") "::text FROM s",
    0,
};

/* One row per (scope, type): the last PUT wins, each one audited. */
/* The settings object of a row alias s. */
#define SCH_SETTINGS(s)                                                                            \
    "json_build_object('event_type', " s ".event_type,"                                            \
    " 'scope', CASE WHEN " s ".tenant_id = '' THEN 'platform' ELSE 'tenant' END,"                  \
    " 'unknown_version', " s                                                                       \
    ".unknown_version, 'updated_at', " SCH_TS(s ".updated_at") ","                                 \
                                                               " 'updated_by', " s                 \
                                                               ".updated_by)::text"

/* The tenant's row first: it is the one that applies. */
const struct hub_sql hub_sql_schema_settings_get = {
    "schema_settings_get",
    "SELECT " SCH_SETTINGS("s") " FROM event_schema_settings s"
                                " WHERE s.event_type = $2::text AND (s.tenant_id = $1::text OR "
                                "($3::boolean AND s.tenant_id = ''))"
                                " ORDER BY s.tenant_id DESC LIMIT 1",
    0,
};

const struct hub_sql hub_sql_schema_settings_put = {
    "schema_settings_put",
    "WITH s AS ("
    "    INSERT INTO event_schema_settings (tenant_id, event_type, unknown_version, updated_by)"
    "    VALUES ($1::text, $2::text, $3::text, $4::text)"
    "    ON CONFLICT (tenant_id, event_type) DO UPDATE"
    "       SET unknown_version = EXCLUDED.unknown_version, updated_at = now(),"
    "           updated_by = EXCLUDED.updated_by"
    "    RETURNING *),"
    " a AS (INSERT INTO audit_log (tenant_id, actor, action, object_id, detail)"
    "       SELECT NULLIF(s.tenant_id, ''), $4::text, 'schema.settings', s.event_type,"
    "              json_build_object('unknown_version', s.unknown_version) FROM s)"
    " SELECT " SCH_SETTINGS("s") " FROM s",
    0,
};

/* One row, bumped by the triggers of migration 0016. */
const struct hub_sql hub_sql_schema_generation = {
    "schema_generation",
    "SELECT generation FROM event_schema_generation WHERE id = 1",
    0,
};

/* Ordered so that each (scope, type)'s versions are contiguous and
 * ascending: schema_registry.c groups them in one pass. */
const struct hub_sql hub_sql_schema_load = {
    "schema_load",
    "SELECT tenant_id, event_type, version, major, minor, patch, digest, schema"
    "  FROM event_schemas WHERE retired_at IS NULL"
    " ORDER BY tenant_id, event_type, major, minor, patch",
    0,
};

const struct hub_sql hub_sql_schema_settings_load = {
    "schema_settings_load",
    "SELECT tenant_id, event_type, unknown_version FROM event_schema_settings",
    0,
};
