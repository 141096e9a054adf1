/*
 * store_admin — the SQL of the admin API, of tenant key authentication and
 * of the Idempotency-Key records that the admin and tenant APIs share.
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

/* Largest value (bytes) that a quarantine LIST item carries as value_base64,
 * and largest header evidence (bytes of its JSON text) it carries as
 * headers; larger ones are null there (value_size, headers_size say how
 * big) and come whole from GET /admin/quarantine/{id}.  Bounds the memory
 * of a 500-item page: a Kafka record's headers may be a megabyte. */
#define HUB_QUARANTINE_LIST_VALUE_MAX 65536

/* The columns of a statement that returns one API object: its JSON text. */
enum hub_admin_object_col {
    HUB_ADMIN_OBJECT,
};

/* The columns of a list statement: the row's key, which the next page's
 * cursor carries, then the object's JSON text. */
enum hub_admin_page_col {
    HUB_ADMIN_PAGE_KEY,
    HUB_ADMIN_PAGE_OBJECT,
};

/*
 * $1 id, $2 status, $3 quotas (jsonb text or NULL), $4 audit detail (jsonb
 * text), $5 Idempotency-Key (or NULL), $6 the request's marker (with a key).
 * Inserts the tenant, its audit row and (with a key) the idempotency record,
 * which keeps the marker as "_req".  One row (hub_admin_object_col) when
 * created, none when the id exists.
 */
extern const struct hub_sql hub_sql_admin_tenant_create;

/* $1 id.  One row (hub_admin_object_col: the tenant) or none. */
extern const struct hub_sql hub_sql_admin_tenant_get;

/* $1 after-id (or NULL), $2 limit.  Rows (hub_admin_page_col: id, tenant)
 * by id. */
extern const struct hub_sql hub_sql_admin_tenant_list;

/*
 * $1 id, $2 status (or NULL: unchanged), $3 'true' to set quotas, $4 quotas
 * (jsonb text or NULL), $5 audit detail (jsonb text).  Bumps updated_at and
 * writes the audit row.  One row (hub_admin_object_col) or none.
 */
extern const struct hub_sql hub_sql_admin_tenant_patch;

/*
 * $1 tenant id, $2 key hash (bytea, BINARY format, 32 bytes), $3
 * Idempotency-Key (or NULL), $4 the request's marker (with a key, kept as
 * "_req" in the idempotency record).  One row (hub_admin_object_col: the
 * key object with "key" null, as the plaintext never reaches the database)
 * or none when the tenant is absent.
 */
extern const struct hub_sql hub_sql_admin_api_key_create;

/* $1 tenant id, $2 key id (uuid text).  Sets revoked_at and writes the audit
 * row.  One row (the key id) when revoked, none when absent or already
 * revoked. */
extern const struct hub_sql hub_sql_admin_api_key_revoke;

/*
 * $1 tenant (or NULL), $2 reason (or NULL), $3 before-id (or NULL), $4 limit.
 * Rows (hub_admin_page_col: id, quarantine object), newest first.
 */
extern const struct hub_sql hub_sql_admin_quarantine_list;

/* $1 id.  One row (hub_admin_object_col) or none. */
extern const struct hub_sql hub_sql_admin_quarantine_get;

/*
 * Idempotency-Key records (SPEC §9, api_idem.h).  A scope says whose keys
 * they are ("admin", "tenant:<id>"); a record keeps the status and body of
 * the response that the creating statement stored with it, and counts for
 * 24 hours.
 *
 * $1 scope, $2 key.  One row (hub_idem_lookup_col) when a record younger
 * than 24h is stored, else none.
 */
enum hub_idem_lookup_col {
    HUB_IDEM_LOOKUP_STATUS, /* the HTTP status, decimal text */
    HUB_IDEM_LOOKUP_BODY,   /* the response object's JSON text */
};
extern const struct hub_sql hub_sql_idem_lookup;

/* No parameters.  Deletes up to 100 records older than 24h (opportunistic,
 * with every lookup).  No rows. */
extern const struct hub_sql hub_sql_idem_purge;

/* $1 scope, $2 key.  Deletes that record if older than 24h, so that the
 * key can be used again (the insert of a new one would collide).  No rows. */
extern const struct hub_sql hub_sql_idem_forget_stale;

/* $1 scope, $2 key, $3 status (int), $4 body (JSON text with "_req").
 * Stores the record of a request whose change is not in the database (a
 * policy reload): the answer is stored after the fact.  No rows; 23505 on
 * idempotency_keys_pkey when a concurrent request stored the key first. */
extern const struct hub_sql hub_sql_idem_store;

/* $1 key hash (bytea, BINARY format).  One row (hub_auth_tenant_col) when
 * the key is not revoked and its tenant is active, else none. */
enum hub_auth_tenant_col {
    HUB_AUTH_TENANT_ID,           /* the key's tenant */
    HUB_AUTH_TENANT_INGEST_RATE,  /* quotas.ingest_rate as text, or NULL */
    HUB_AUTH_TENANT_INGEST_BURST, /* quotas.ingest_burst as text, or NULL */
};
extern const struct hub_sql hub_sql_api_auth_tenant;

#endif
