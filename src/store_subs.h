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
 * Idempotency records of the other tenant POSTs (verify, replay,
 * redeliver) store the answer exactly as the API sends it, plus "_req".
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

/* The columns of a statement that returns one API object (a subscription or
 * a delivery): its JSON text. */
enum hub_subs_object_col {
    HUB_SUBS_OBJECT,
};

/* The columns of a list statement: the row's key, which the next page's
 * cursor carries (a subscription's uuid, a job's id), then the object. */
enum hub_subs_page_col {
    HUB_SUBS_PAGE_KEY,
    HUB_SUBS_PAGE_OBJECT,
};

/*
 * What a verification probe reads from a subscription row, as a block of
 * five columns that subs_patch and subs_probe_load return after columns of
 * their own (HUB_SUBS_PATCH_PROBE, HUB_SUBS_PROBE_LOAD_PROBE): the block's
 * first column plus these offsets.
 */
enum hub_subs_probe_col {
    HUB_SUBS_PROBE_URL,                /* destination url */
    HUB_SUBS_PROBE_HEADERS_SEALED,     /* sealed destination headers, or NULL */
    HUB_SUBS_PROBE_SECRET_SEALED,      /* sealed current secret */
    HUB_SUBS_PROBE_PREV_SECRET_SEALED, /* sealed previous secret, or NULL */
    HUB_SUBS_PROBE_PREV_VALID,         /* 't' while the previous one is in its grace */
};

/*
 * $1 id (uuid), $2 tenant, $3 event_types (JSON array), $4 schema_major,
 * $5 url, $6 headers_sealed (or NULL), $7 secret_sealed, $8 enabled
 * ('true'/'false'), $9 retry_schedule (JSON array or NULL), $10 policy (or
 * NULL), $11 ordering, $12 max_rate (or NULL), $13 idempotency scope, $14
 * request marker, $15 Idempotency-Key (or NULL), $16 the tenant's cap
 * (STREAMING_HUB_TENANT_MAX_SUBSCRIPTIONS).  Inserts the subscription
 * (verification_state 'pending'; disabled_reason 'disabled' when not
 * enabled), its audit row and, with a key, the idempotency record (status
 * 201): one row (hub_subs_object_col); none when the tenant holds its cap
 * already.  Run after hub_sql_subs_tenant_lock in the same transaction, so
 * that its count sees every create that committed before.
 */
extern const struct hub_sql hub_sql_subs_create;

/* $1 tenant: the lock its creates take in turn (released at commit). */
extern const struct hub_sql hub_sql_subs_tenant_lock;

/* $1 tenant, $2 id.  One row (hub_subs_object_col) or none. */
extern const struct hub_sql hub_sql_subs_get;

/* $1 tenant, $2 after-id (uuid or NULL), $3 limit.  Rows (hub_subs_page_col:
 * id, subscription) by id, i.e. in creation order (UUIDv7). */
extern const struct hub_sql hub_sql_subs_list;

/*
 * The channel a PATCH or DELETE of a subscription, and an outcome statement
 * that disables one (410, auto-disable), notify at their commit, the
 * subscription's id the payload: every dispatcher listens on it
 * (hub_dispatch_subscription_changed), so that no job it holds starts an
 * attempt with what was read before the change.
 */
#define HUB_SUBS_CHANGED_CHANNEL "streaming_hub_subscription_changed"

/*
 * $1 tenant, $2 id, $3 event_types (JSON array or NULL: unchanged), $4
 * schema_major (or NULL), $5 url (or NULL), $6 'true' to set headers_sealed
 * to $7 (may be NULL: no headers), $8 'true' to set retry_schedule to $9
 * (JSON array or NULL), $10 'true' to set policy to $11, $12 ordering (or
 * NULL), $13 'true' to set max_rate to $14, $15 enabled (or NULL), $16 audit
 * detail (jsonb text).
 *
 * A url different from the stored one resets verification_state to
 * 'pending' (audited as a "subscription.verification" transition, by
 * "url_change"; its jobs are parked until it verifies again) and clears the
 * failure streak; enabled false sets disabled_reason 'disabled', enabled
 * true clears it.  Bumps updated_at.  One row (hub_subs_patch_col) or
 * none; the probe block feeds the verification probe a url change starts.
 */
enum hub_subs_patch_col {
    HUB_SUBS_PATCH_OBJECT,      /* the subscription's JSON text */
    HUB_SUBS_PATCH_URL_CHANGED, /* 't' when the url changed */
    HUB_SUBS_PATCH_ID,          /* its id (text) */
    HUB_SUBS_PATCH_NOTIFIED,    /* void: HUB_SUBS_CHANGED_CHANNEL's notification */
    HUB_SUBS_PATCH_PROBE,       /* first column of the hub_subs_probe_col block */
};
extern const struct hub_sql hub_sql_subs_patch;

/* $1 tenant, $2 id.  Deletes (jobs cascade), audits and notifies
 * HUB_SUBS_CHANGED_CHANNEL.  One row (the id as text, then a void column)
 * when deleted, none when absent. */
extern const struct hub_sql hub_sql_subs_delete;

/* $1 tenant, $2 id.  What a synchronous probe needs.  One row
 * (hub_subs_probe_load_col) or none. */
enum hub_subs_probe_load_col {
    HUB_SUBS_PROBE_LOAD_OBJECT, /* the subscription's JSON text */
    HUB_SUBS_PROBE_LOAD_PROBE,  /* first column of the hub_subs_probe_col block */
};
extern const struct hub_sql hub_sql_subs_probe_load;

/*
 * $1 tenant, $2 id, $3 ok ('true'/'false'), $4 the url that was probed, $5
 * audit detail, $6 idempotency scope, $7 Idempotency-Key (or NULL), $8
 * request marker, $9 the answer's "verification" member (JSON text).  The
 * outcome of POST /verify: success sets verification_state 'active',
 * enabled, clears disabled_reason and the failure streak; failure sets
 * 'failed'.  Applies only while the url is still the probed one.  Audited
 * ("subscription.verify", and a "subscription.verification" transition by
 * "verify" when the state changed); with a key, the idempotency record
 * (status 200) holds the answer.  One row (hub_subs_object_col) or none.
 */
extern const struct hub_sql hub_sql_subs_verify_result;

/* A verification outcome's first statement: its row locks wait at most
 * 200 ms (lock_timeout, for this transaction).  The outcome locks the
 * subscription's row, which a replay holds FOR SHARE until it commits: its
 * transaction, outside the tenant's API turns, would otherwise hold an API
 * connection as long (hub_api_call_txn), and a tenant's 8 probes' outcomes
 * all four connections. */
extern const struct hub_sql hub_sql_subs_outcome_lock_timeout;

/*
 * $1 id, $2 ok, $3 url, $4 audit detail to add (jsonb text: the probe's
 * status).  The outcome of the background probe: verification_state
 * 'active' or 'failed', only while it is still 'pending' with the same url
 * (otherwise the url changed meanwhile, or /verify decided, and the result
 * is ignored), audited as a "subscription.verification" transition by
 * "probe" (actor "hub").  One row (the id) when applied, none when ignored.
 */
extern const struct hub_sql hub_sql_subs_probe_result;

/*
 * $1 tenant, $2 id, $3 new secret_sealed, $4 grace in ms (0: the previous
 * secret is dropped at once), $5 idempotency scope, $6 Idempotency-Key (or
 * NULL), $7 request marker, $8 audit detail.  Moves the current secret to
 * prev_secret_sealed (valid until now + grace), audits, stores the
 * idempotency record (status 200).  One row (hub_subs_object_col) or none.
 */
extern const struct hub_sql hub_sql_subs_rotate;

/* $1 tenant, $2 subscription id.  One row (a constant 1) when the
 * subscription is the tenant's, none otherwise. */
extern const struct hub_sql hub_sql_subs_exists;

/*
 * $1 tenant, $2 subscription id, $3 state (or NULL), $4 before-id (or NULL),
 * $5 limit, $6 event id (or NULL), $7 since and $8 until (timestamptz text or
 * NULL: created_at in [since, until)).  Rows (hub_subs_page_col: job id,
 * delivery), newest first.
 */
extern const struct hub_sql hub_sql_deliveries_list;
/* The same list given an event id ($6 not NULL): its job found by key. */
extern const struct hub_sql hub_sql_deliveries_of_event;

/* $1 tenant, $2 job id.  One row (hub_subs_object_col: the delivery with its
 * "attempts") or none. */
extern const struct hub_sql hub_sql_delivery_get;

/*
 * $1 tenant, $2 job id, $3 idempotency scope, $4 Idempotency-Key (or
 * NULL), $5 request marker.  A dead job of a verified subscription goes
 * back to 'pending' ('parked' while the subscription is disabled), due now,
 * reason and lease cleared, reclaim count reset; audited; with a key, the
 * idempotency record (status 200, the delivery plus "_req").  One row
 * (hub_subs_object_col: the delivery, without attempts) or none (absent,
 * not dead, or its subscription not verified: hub_sql_delivery_state).
 */
extern const struct hub_sql hub_sql_delivery_redeliver;

/* $1 tenant, $2 job id.  One row (hub_delivery_state_col) or none. */
enum hub_delivery_state_col {
    HUB_DELIVERY_STATE,        /* pending, in_flight, succeeded, dead, parked */
    HUB_DELIVERY_VERIFICATION, /* its subscription's verification_state */
};
extern const struct hub_sql hub_sql_delivery_state;

/*
 * Replay (SPEC §9).  $1 tenant, $2 subscription id, $3 since, $4 until
 * (RFC 3339), $5 event type patterns (JSON array text, or NULL), $6 minimum
 * interval between two replays of one subscription (ms), $7 most events,
 * $8 idempotency scope, $9 Idempotency-Key (or NULL), $10 request marker.
 *
 * Only for a verified subscription (SPEC §6): otherwise nothing is done.
 * New jobs for the tenant's events received in [$3, $4) that the
 * subscription matches (its event types and schema major) and, when $5 is
 * given, that $5 matches too: a replay narrows what the subscription
 * receives, never widens it.  Jobs that exist and finished (succeeded,
 * dead) are re-armed, pending ones left alone; while the subscription is
 * disabled they are parked instead (they resume when it is enabled).
 * Audited ("subscription.replay"), and that audit row is also the rate
 * limit.  With a key, the idempotency record (status 202) stores the
 * answer.  Exactly one row (hub_subs_replay_col).
 */
enum hub_subs_replay_col {
    HUB_SUBS_REPLAY_FOUND,        /* 1 when the subscription is the tenant's, else 0 */
    HUB_SUBS_REPLAY_RETRY_AFTER,  /* seconds to wait when rate-limited, else NULL */
    HUB_SUBS_REPLAY_VERIFICATION, /* its verification_state (nothing ran unless 'active') */
    HUB_SUBS_REPLAY_EVENTS,       /* events matched (at most $7) */
    HUB_SUBS_REPLAY_CREATED,      /* jobs created */
    HUB_SUBS_REPLAY_REARMED,      /* finished jobs made pending again */
    HUB_SUBS_REPLAY_BODY,         /* the answer (JSON object text), NULL when nothing ran */
};
extern const struct hub_sql hub_sql_subs_replay;

/* Before hub_sql_subs_replay in its transaction: $1 subscription id.  Waits
 * for another replay of that subscription to end, so that the rate limit
 * holds when two are sent at once. */
extern const struct hub_sql hub_sql_subs_replay_lock;

#endif
