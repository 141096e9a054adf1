/*
 * store_admin — the SQL of the admin API and of tenant key authentication.
 *
 * Every statement is parameterised (never concatenated) and names each
 * parameter's type with a cast, because pg.c prepares statements without
 * parameter types.  Objects that the API returns are rendered by PostgreSQL
 * (json_build_object) so that a creation and its Idempotency-Key record can
 * store the very same body in the same statement.  Timestamps are RFC 3339
 * UTC with microseconds ("2024-05-01T12:00:00.123456Z").
 *
 * The statement objects are static and compared by address by pg.c.
 */
#ifndef HUB_STORE_ADMIN_H
#define HUB_STORE_ADMIN_H

#include "pg.h"

/* Largest value (bytes) that a quarantine LIST item carries as value_base64;
 * larger ones are null there (value_size says how big) and come whole from
 * GET /admin/quarantine/{id}.  Bounds the memory of a 500-item page. */
#define HUB_QUARANTINE_LIST_VALUE_MAX 65536

/*
 * $1 id, $2 status, $3 quotas (jsonb text or NULL), $4 audit detail (jsonb
 * text), $5 Idempotency-Key (or NULL), $6 the request's marker (with a key).
 * Inserts the tenant, its audit row and (with a key) the idempotency record,
 * which keeps the marker as "_req".  One row (tenant JSON text) when
 * created, none when the id exists.
 */
extern const struct hub_sql hub_sql_admin_tenant_create;

/* $1 id.  One row (tenant JSON text) or none. */
extern const struct hub_sql hub_sql_admin_tenant_get;

/* $1 after-id (or NULL), $2 limit.  Rows (id, tenant JSON text) by id. */
extern const struct hub_sql hub_sql_admin_tenant_list;

/*
 * $1 id, $2 status (or NULL: unchanged), $3 'true' to set quotas, $4 quotas
 * (jsonb text or NULL), $5 audit detail (jsonb text).  Bumps updated_at and
 * writes the audit row.  One row (tenant JSON text) or none.
 */
extern const struct hub_sql hub_sql_admin_tenant_patch;

/*
 * $1 tenant id, $2 key hash (bytea, BINARY format, 32 bytes), $3
 * Idempotency-Key (or NULL), $4 the request's marker (with a key, kept as
 * "_req" in the idempotency record).  One row (key JSON text, "key" null: the
 * plaintext never reaches the database) or none when the tenant is absent.
 */
extern const struct hub_sql hub_sql_admin_api_key_create;

/* $1 tenant id, $2 key id (uuid text).  Sets revoked_at and writes the audit
 * row.  One row when revoked, none when absent or already revoked. */
extern const struct hub_sql hub_sql_admin_api_key_revoke;

/*
 * $1 tenant (or NULL), $2 reason (or NULL), $3 before-id (or NULL), $4 limit.
 * Rows (id, quarantine JSON text), newest first.
 */
extern const struct hub_sql hub_sql_admin_quarantine_list;

/* $1 id.  One row (quarantine JSON text) or none. */
extern const struct hub_sql hub_sql_admin_quarantine_get;

/* $1 scope, $2 key.  One row (status, body) when a response younger than
 * 24h is stored. */
extern const struct hub_sql hub_sql_admin_idem_lookup;

/* No parameters.  Deletes up to 100 records older than 24h (opportunistic). */
extern const struct hub_sql hub_sql_admin_idem_purge;

/* $1 scope, $2 key.  Deletes that record if older than 24h, so that the
 * key can be used again. */
extern const struct hub_sql hub_sql_admin_idem_forget_stale;

/* $1 key hash (bytea, BINARY format).  One row (tenant id, then its quotas'
 * ingest_rate and ingest_burst as text or NULL) when the key is not revoked
 * and its tenant is active. */
extern const struct hub_sql hub_sql_api_auth_tenant;

#endif
