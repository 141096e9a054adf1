/*
 * store_admin — SQL texts of the admin API (see store_admin.h).
 *
 * The JSON shapes of the API objects are written once, as macros, and pasted
 * into the statements at compile time (string-literal concatenation: no
 * runtime SQL building, every value still travels as a parameter).
 * Result columns are documented by the enums in store_admin.h.
 */
#include "store_admin.h"

/* The SQL below is laid out for reading as SQL; clang-format would reflow the
 * string pieces across macro boundaries. */
// clang-format off

#define ADM_STR_(x) #x
#define ADM_STR(x) ADM_STR_(x)

/* RFC 3339 in UTC whatever the session TimeZone is. */
#define ADM_TS(col) "to_char((" col ") AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"

/* The tenant object of SPEC §5 / §9, from a row alias t. */
#define ADM_TENANT_JSON(t)                                                                        \
    "json_build_object('id', " t ".id, 'status', " t ".status, 'quotas', " t ".quotas, "          \
    "'created_at', " ADM_TS(t ".created_at") ", 'updated_at', " ADM_TS(t ".updated_at") ")::text"

/* base64 without the line breaks PostgreSQL puts every 76 characters. */
#define ADM_B64(col) "translate(encode(" col ", 'base64'), E'\\n', '')"

/* The quarantine object, from a row alias q, with value_base64 =
 * value_expr and headers = headers_expr (headers_size their text's bytes). */
#define ADM_QUARANTINE_JSON(q, value_expr, headers_expr)                                          \
    "json_build_object('id', " q ".id, 'received_at', " ADM_TS(q ".received_at") ", "             \
    "'reason', " q ".reason, 'field', " q ".field, 'detail', " q ".detail, "                      \
    "'tenant_id', " q ".tenant_id, 'source', " q ".source, 'event_id', " q ".event_id, "          \
    "'topic', " q ".topic, 'partition', " q ".kafka_partition, 'offset', " q ".kafka_offset, "    \
    "'headers', " headers_expr ", 'headers_size', octet_length(" q ".headers::text), "            \
    "'value_size', octet_length(" q ".value), 'value_base64', " value_expr ")::text"

/* A stored response: the object's JSON text with the request's marker
 * appended as "_req" (members keep their order; the API removes it). */
#define ADM_WITH_MARKER(obj, marker)                                                               \
    "left(" obj ", -1) || ', \"_req\" : ' || to_json(" marker "::text)::text || '}'"

/* Idempotency records count for 24 hours (SPEC §9).  Older ones are
 * ignored by the lookup at once, and deleted lazily: a few by every
 * lookup (idem_purge), and one key's by the creation that reuses it
 * (idem_forget_stale). */
#define ADM_IDEM_TTL "interval '24 hours'"

/* ON CONFLICT DO NOTHING: an existing id yields no row (the API's 409, or
 * a replay when its own earlier request created it) instead of an error
 * that would abort the transaction. */
const struct hub_sql hub_sql_admin_tenant_create = {
    "admin_tenant_create",
    "WITH t AS ("
    "    INSERT INTO tenants (id, status, quotas) VALUES ($1::text, $2::text, $3::jsonb)"
    "    ON CONFLICT (id) DO NOTHING"
    "    RETURNING id, status, quotas, created_at, updated_at),"
    " b AS (SELECT t.id, " ADM_TENANT_JSON("t") " AS obj FROM t),"
    " a AS (INSERT INTO audit_log (tenant_id, actor, action, object_id, detail)"
    "       SELECT b.id, 'admin', 'tenant.create', b.id, $4::jsonb FROM b),"
    " i AS (INSERT INTO idempotency_keys (scope, key, status, body)"
    "       SELECT 'admin', $5::text, 201, " ADM_WITH_MARKER("b.obj", "$6") " FROM b"
    "        WHERE $5::text IS NOT NULL)"
    " SELECT obj FROM b",
};

const struct hub_sql hub_sql_admin_tenant_get = {
    "admin_tenant_get",
    "SELECT " ADM_TENANT_JSON("t") " FROM tenants t WHERE t.id = $1::text",
};

const struct hub_sql hub_sql_admin_tenant_list = {
    "admin_tenant_list",
    "SELECT t.id, " ADM_TENANT_JSON("t") " FROM tenants t"
    " WHERE ($1::text IS NULL OR t.id > $1::text)"
    " ORDER BY t.id LIMIT $2::int",
};

/* COALESCE keeps the status when $2 is NULL; quotas have their own flag
 * ($3), since NULL is also a value they may be set to. */
const struct hub_sql hub_sql_admin_tenant_patch = {
    "admin_tenant_patch",
    "WITH t AS ("
    "    UPDATE tenants SET status = COALESCE($2::text, status),"
    "           quotas = CASE WHEN $3::boolean THEN $4::jsonb ELSE quotas END,"
    "           updated_at = now()"
    "     WHERE id = $1::text"
    "    RETURNING id, status, quotas, created_at, updated_at),"
    " a AS (INSERT INTO audit_log (tenant_id, actor, action, object_id, detail)"
    "       SELECT t.id, 'admin', 'tenant.update', t.id, $5::jsonb FROM t)"
    " SELECT " ADM_TENANT_JSON("t") " FROM t",
};

/* The key is inserted only for an existing tenant (INSERT ... SELECT): no
 * row means no tenant.  The object says "key": null; the API fills the
 * plaintext into the fresh answer only. */
const struct hub_sql hub_sql_admin_api_key_create = {
    "admin_api_key_create",
    "WITH k AS ("
    "    INSERT INTO tenant_api_keys (tenant_id, key_hash)"
    "    SELECT t.id, $2::bytea FROM tenants t WHERE t.id = $1::text"
    "    RETURNING id, tenant_id, created_at),"
    " b AS (SELECT k.id, k.tenant_id,"
    "              json_build_object('id', k.id, 'key', NULL, 'tenant_id', k.tenant_id,"
    "                                'created_at', " ADM_TS("k.created_at") ")::text AS obj"
    "         FROM k),"
    " a AS (INSERT INTO audit_log (tenant_id, actor, action, object_id)"
    "       SELECT b.tenant_id, 'admin', 'api_key.create', b.id::text FROM b),"
    " i AS (INSERT INTO idempotency_keys (scope, key, status, body)"
    "       SELECT 'admin', $3::text, 201, " ADM_WITH_MARKER("b.obj", "$4") " FROM b"
    "        WHERE $3::text IS NOT NULL)"
    " SELECT obj FROM b",
};

/* Both tenant and key id must match: a key id alone never revokes. */
const struct hub_sql hub_sql_admin_api_key_revoke = {
    "admin_api_key_revoke",
    "WITH k AS ("
    "    UPDATE tenant_api_keys SET revoked_at = now()"
    "     WHERE id = $2::uuid AND tenant_id = $1::text AND revoked_at IS NULL"
    "    RETURNING id, tenant_id),"
    " a AS (INSERT INTO audit_log (tenant_id, actor, action, object_id)"
    "       SELECT k.tenant_id, 'admin', 'api_key.revoke', k.id::text FROM k)"
    " SELECT k.id FROM k",
};

/* Newest first; values larger than HUB_QUARANTINE_LIST_VALUE_MAX are left
 * out (value_size still says how big), so a page stays small. */
const struct hub_sql hub_sql_admin_quarantine_list = {
    "admin_quarantine_list",
    "SELECT q.id, "
    ADM_QUARANTINE_JSON("q", "CASE WHEN octet_length(q.value) <= "
                             ADM_STR(HUB_QUARANTINE_LIST_VALUE_MAX) " THEN " ADM_B64("q.value")
                             " END",
                        "CASE WHEN octet_length(q.headers::text) <= "
                             ADM_STR(HUB_QUARANTINE_LIST_VALUE_MAX) " THEN q.headers END")
    " FROM quarantine q"
    " WHERE ($1::text IS NULL OR q.tenant_id = $1::text)"
    "   AND ($2::text IS NULL OR q.reason = $2::text)"
    "   AND ($3::bigint IS NULL OR q.id < $3::bigint)"
    " ORDER BY q.id DESC LIMIT $4::int",
};

const struct hub_sql hub_sql_admin_quarantine_get = {
    "admin_quarantine_get",
    "SELECT " ADM_QUARANTINE_JSON("q", ADM_B64("q.value"), "q.headers") " FROM quarantine q"
    " WHERE q.id = $1::bigint",
};

const struct hub_sql hub_sql_idem_lookup = {
    "idem_lookup",
    "SELECT status, body FROM idempotency_keys"
    " WHERE scope = $1::text AND key = $2::text AND created_at > now() - " ADM_IDEM_TTL,
};

const struct hub_sql hub_sql_idem_purge = {
    "idem_purge",
    /* SKIP LOCKED: several hubs purging at once never wait on each other. */
    "DELETE FROM idempotency_keys WHERE (scope, key) IN ("
    "    SELECT scope, key FROM idempotency_keys"
    "     WHERE created_at <= now() - " ADM_IDEM_TTL " LIMIT 100 FOR UPDATE SKIP LOCKED)",
};

const struct hub_sql hub_sql_idem_forget_stale = {
    "idem_forget_stale",
    "DELETE FROM idempotency_keys"
    " WHERE scope = $1::text AND key = $2::text AND created_at <= now() - " ADM_IDEM_TTL,
};

const struct hub_sql hub_sql_idem_store = {
    "idem_store",
    "INSERT INTO idempotency_keys (scope, key, status, body)"
    " VALUES ($1::text, $2::text, $3::int, $4::text)",
};

/* One indexed lookup by key hash per tenant request; an inactive tenant's
 * keys fail here like unknown ones. */
const struct hub_sql hub_sql_api_auth_tenant = {
    "api_auth_tenant",
    "SELECT t.id, t.quotas->>'ingest_rate', t.quotas->>'ingest_burst'"
    "  FROM tenant_api_keys k JOIN tenants t ON t.id = k.tenant_id"
    " WHERE k.key_hash = $1::bytea AND k.revoked_at IS NULL AND t.status = 'active'",
};

// clang-format on
