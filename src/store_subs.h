/*
 * store_subs — the SQL of the subscription and delivery API (SPEC §6, §9).
 *
 * Same conventions as store_admin.h: every statement is parameterised and
 * casts each parameter; objects are rendered by PostgreSQL as JSON text;
 * timestamps are RFC 3339 UTC with microseconds; every tenant-scoped
 * statement takes the authenticated tenant as $1 and filters on it, so
 * another tenant's object is simply "not found".  Writes carry their
 * audit_log row (actor "tenant") in the same statement.
 *
 * The subscription object comes back with three internal members that the
 * API strips before answering (api_subs.c, subs_render):
 *
 *   "_hs"   headers_sealed: the destination headers, sealed under the KEK;
 *           the API opens it only to list the header NAMES (values "***");
 *   "_ss"   secret_sealed (idempotency records of create/rotate only): lets
 *           a replay show the secret without it ever being stored in clear;
 *   "_req"  (idempotency records only) what request made the record.
 *
 * "destination"."headers" is null in the rendered text for the same reason:
 * only the API can fill it.  Array parameters (event_types, retry_schedule)
 * travel as JSON arrays of strings (made by jansson), never as SQL text.
 *
 * The statement objects are static and compared by address by pg.c.
 */
#ifndef HUB_STORE_SUBS_H
#define HUB_STORE_SUBS_H

#include "pg.h"

/*
 * $1 id (uuid), $2 tenant, $3 event_types (JSON array), $4 schema_major,
 * $5 url, $6 headers_sealed (or NULL), $7 secret_sealed, $8 enabled
 * ('true'/'false'), $9 retry_schedule (JSON array or NULL), $10 policy (or
 * NULL), $11 ordering, $12 max_rate (or NULL), $13 idempotency scope, $14
 * request marker, $15 Idempotency-Key (or NULL).  Inserts the subscription
 * (verification_state 'pending'; disabled_reason 'disabled' when not
 * enabled), its audit row and, with a key, the idempotency record (status
 * 201).  One row: (object JSON text).
 */
extern const struct hub_sql hub_sql_subs_create;

/* $1 tenant, $2 id.  One row (object JSON text) or none. */
extern const struct hub_sql hub_sql_subs_get;

/* $1 tenant, $2 after-id (uuid or NULL), $3 limit.  Rows (id, object JSON
 * text) by id, i.e. in creation order (UUIDv7). */
extern const struct hub_sql hub_sql_subs_list;

/*
 * $1 tenant, $2 id, $3 event_types (JSON array or NULL: unchanged), $4
 * schema_major (or NULL), $5 url (or NULL), $6 'true' to set headers_sealed
 * to $7 (may be NULL: no headers), $8 'true' to set retry_schedule to $9
 * (JSON array or NULL), $10 'true' to set policy to $11, $12 ordering (or
 * NULL), $13 'true' to set max_rate to $14, $15 enabled (or NULL), $16 audit
 * detail (jsonb text).
 *
 * A url different from the stored one resets verification_state to
 * 'pending' and clears the failure streak; enabled false sets
 * disabled_reason 'disabled', enabled true clears it.  Bumps updated_at.
 * One row or none: (object JSON text, url_changed, url, headers_sealed,
 * secret_sealed, prev_secret_sealed, prev_valid) — the last five feed the
 * verification probe a url change starts.
 */
extern const struct hub_sql hub_sql_subs_patch;

/* $1 tenant, $2 id.  Deletes (jobs cascade) and audits.  One row or none. */
extern const struct hub_sql hub_sql_subs_delete;

/*
 * $1 tenant, $2 id.  What a synchronous probe needs.  One row or none:
 * (object JSON text, url, headers_sealed, secret_sealed, prev_secret_sealed,
 * prev_valid 't'/'f' = the previous secret is within its grace).
 */
extern const struct hub_sql hub_sql_subs_probe_load;

/*
 * $1 tenant, $2 id, $3 ok ('true'/'false'), $4 the url that was probed, $5
 * audit detail.  The outcome of POST /verify: success sets
 * verification_state 'active', enabled, clears disabled_reason and the
 * failure streak; failure sets 'failed'.  Applies only while the url is
 * still the probed one.  One row (object JSON text) or none.
 */
extern const struct hub_sql hub_sql_subs_verify_result;

/*
 * $1 id, $2 ok, $3 url, $4 headers_sealed (or NULL).  The outcome of the
 * background probe: verification_state 'active' or 'failed', only while it
 * is still 'pending' with the same url and headers (otherwise the
 * subscription changed meanwhile and the result is ignored).  One row (id)
 * when applied.
 */
extern const struct hub_sql hub_sql_subs_probe_result;

/*
 * $1 tenant, $2 id, $3 new secret_sealed, $4 grace in ms (0: the previous
 * secret is dropped at once), $5 idempotency scope, $6 Idempotency-Key (or
 * NULL), $7 request marker, $8 audit detail.  Moves the current secret to
 * prev_secret_sealed (valid until now + grace), audits, stores the
 * idempotency record (status 200).  One row (object JSON text) or none.
 */
extern const struct hub_sql hub_sql_subs_rotate;

/* $1 tenant, $2 subscription id.  One row when the subscription is the
 * tenant's. */
extern const struct hub_sql hub_sql_subs_exists;

/*
 * $1 tenant, $2 subscription id, $3 state (or NULL), $4 before-id (or NULL),
 * $5 limit.  Rows (id, delivery JSON text), newest first.
 */
extern const struct hub_sql hub_sql_deliveries_list;

/* $1 tenant, $2 job id.  One row (delivery JSON text with "attempts") or none. */
extern const struct hub_sql hub_sql_delivery_get;

/*
 * $1 tenant, $2 job id.  A dead job goes back to 'pending', due now, reason
 * and lease cleared, reclaim count reset; audited.  One row (delivery JSON
 * text, no attempts) or none (absent, or not dead).
 */
extern const struct hub_sql hub_sql_delivery_redeliver;

/* $1 tenant, $2 job id.  One row (state) or none. */
extern const struct hub_sql hub_sql_delivery_state;

extern const struct hub_sql hub_sql_subs_replay;

#endif
