/*
 * store_schemas — the SQL of the schema registry (SPEC §3.5): the tables of
 * migration 0016 (event_schemas, event_schema_settings, and the generation
 * every process polls).  A scope is a tenant id, or '' for the platform's
 * own schemas.  Parameters and results are text; a schema object is JSON
 * text built by the statement (see SCHEMA_OBJECT in store_schemas.c):
 *
 *   {"event_type", "version", "scope": "platform"|"tenant", "digest",
 *    "registered_at", "registered_by", "retired_at": null|ts,
 *    "schema": {...} (the fetch only)}
 *
 * The statement objects are static and compared by address by pg.c.
 */
#ifndef HUB_STORE_SCHEMAS_H
#define HUB_STORE_SCHEMAS_H

#include "pg.h"

/*
 * What a registration needs to decide: the live row of that exact version
 * (if any), and the schema it must stay compatible with (the highest live
 * version of the same scope, type and major below it).
 *   $1 scope  $2 event type  $3 version  $4 major (int4)  $5 minor  $6 patch
 * Up to two rows: HUB_SCHEMA_PRIOR_COL_KIND ('same' or 'prev'), _VERSION,
 * _DIGEST, _SCHEMA (the stored text).
 */
#define HUB_SQL_SCHEMA_PRIOR_NPARAMS 6
extern const struct hub_sql hub_sql_schema_prior;
enum hub_schema_prior_col {
    HUB_SCHEMA_PRIOR_COL_KIND,
    HUB_SCHEMA_PRIOR_COL_VERSION,
    HUB_SCHEMA_PRIOR_COL_DIGEST,
    HUB_SCHEMA_PRIOR_COL_SCHEMA,
};

/*
 * Takes the scope's registration lock until the transaction ends: run it
 * first in the transaction of hub_sql_schema_put.  $1 scope.  One row.
 */
#define HUB_SQL_SCHEMA_SCOPE_LOCK_NPARAMS 1
extern const struct hub_sql hub_sql_schema_scope_lock;

/*
 * Registers a version and writes its audit row, when the scope stays under
 * its caps: fewer than $9 live versions, and at most $10 bytes of live
 * schema text with this one.
 *   $1 scope  $2 event type  $3 version  $4 major  $5 minor  $6 patch
 *   $7 schema text (valid JSON)  $8 who ('admin' or 'tenant:<id>')
 *   $9 most live versions (int8)  $10 most live bytes (int8)
 *   $11 the version below it the schema was compared with (NULL: none)
 * Only while $11 is still the highest live version below it (the
 * registration of another minor between the comparison and this insert
 * would otherwise go unchecked).  One row (enum hub_schema_put_col): the
 * object (without the schema) when registered; else NULL, the scope's live
 * versions and bytes, and whether the version below changed.  A version
 * registered meanwhile by someone else fails the statement with a unique
 * violation (23505): the caller answers 409.
 */
#define HUB_SQL_SCHEMA_PUT_NPARAMS 11
extern const struct hub_sql hub_sql_schema_put;
enum hub_schema_put_col {
    HUB_SCHEMA_PUT_COL_OBJECT,
    HUB_SCHEMA_PUT_COL_LIVE_VERSIONS,
    HUB_SCHEMA_PUT_COL_LIVE_BYTES,
    HUB_SCHEMA_PUT_COL_PRIOR_CHANGED, /* 't' when the version below is not $11 */
};

/* $1 scope  $2 event type  $3 version.  One row (HUB_SCHEMA_OBJECT_COL, the
 * object with its schema) or none: the live version. */
#define HUB_SQL_SCHEMA_GET_NPARAMS 3
extern const struct hub_sql hub_sql_schema_get;

/*
 * $1 scope  $2 event type (or NULL: every type)  $3 'true' to include the
 * platform's versions beside the tenant's (a tenant's list).  Rows
 * (HUB_SCHEMA_OBJECT_COL, objects without schemas) of the live versions by
 * type, then major, minor, patch; at most 1,000.
 */
#define HUB_SQL_SCHEMA_LIST_NPARAMS 3
extern const struct hub_sql hub_sql_schema_list;
enum hub_schema_object_col { HUB_SCHEMA_OBJECT_COL };

/* Retires a live version and writes its audit row.
 *   $1 scope  $2 event type  $3 version  $4 who
 * One row (HUB_SCHEMA_OBJECT_COL, the retired object) or none. */
#define HUB_SQL_SCHEMA_RETIRE_NPARAMS 4
extern const struct hub_sql hub_sql_schema_retire;

/* Sets a type's settings (upsert) and writes the audit row.
 *   $1 scope  $2 event type  $3 unknown_version ('accept'|'quarantine')  $4 who
 * One row, HUB_SCHEMA_OBJECT_COL: {"event_type","scope","unknown_version",
 * "updated_at","updated_by"}. */
#define HUB_SQL_SCHEMA_SETTINGS_PUT_NPARAMS 4
extern const struct hub_sql hub_sql_schema_settings_put;

/* The settings that apply to a type: $1 scope  $2 event type  $3 'true' to
 * fall back to the platform's (a tenant's read).  One row
 * (HUB_SCHEMA_OBJECT_COL, the settings object) or none: the default,
 * accept. */
#define HUB_SQL_SCHEMA_SETTINGS_GET_NPARAMS 3
extern const struct hub_sql hub_sql_schema_settings_get;

/* No parameters.  One row: HUB_SCHEMA_GEN_COL, the registry's generation
 * (int8 text). */
extern const struct hub_sql hub_sql_schema_generation;
enum hub_schema_gen_col { HUB_SCHEMA_GEN_COL };

/* No parameters.  Every live version, one row each (enum
 * hub_schema_load_col), by scope, type, major, minor, patch. */
extern const struct hub_sql hub_sql_schema_load;
enum hub_schema_load_col {
    HUB_SCHEMA_LOAD_COL_SCOPE,
    HUB_SCHEMA_LOAD_COL_TYPE,
    HUB_SCHEMA_LOAD_COL_VERSION,
    HUB_SCHEMA_LOAD_COL_MAJOR,
    HUB_SCHEMA_LOAD_COL_MINOR,
    HUB_SCHEMA_LOAD_COL_PATCH,
    HUB_SCHEMA_LOAD_COL_DIGEST,
    HUB_SCHEMA_LOAD_COL_SCHEMA,
};

/* No parameters.  Every type setting (enum hub_schema_settings_col). */
extern const struct hub_sql hub_sql_schema_settings_load;
enum hub_schema_settings_col {
    HUB_SCHEMA_SETTINGS_COL_SCOPE,
    HUB_SCHEMA_SETTINGS_COL_TYPE,
    HUB_SCHEMA_SETTINGS_COL_UNKNOWN,
};

#endif
