/*
 * store_rekey — the SQL of `streaming-hub rekey` (rekey.c): find the sealed
 * values that are not under the current KEK, a page at a time, and write
 * each re-sealed value back only if the row still holds what was read (a
 * compare-and-set: a PATCH or a rotation that committed meanwhile wins, and
 * its value is sealed under the current KEK already).
 *
 * Sealed values live in two places: a subscription's secret_sealed,
 * headers_sealed and prev_secret_sealed (migrations/0003), and the "_ss"
 * (a secret) and "_hs" (destination headers) members of the idempotency
 * records of creations, rotations and verifications (store_subs.h), which
 * a replay opens.  Both are sealed with the subscription id as AAD.
 *
 * Every statement takes `$kid_like`, the LIKE pattern "v1:<current key
 * id>:%" of a value sealed under the current KEK.  Parameters and results
 * are text.
 */
#ifndef HUB_STORE_REKEY_H
#define HUB_STORE_REKEY_H

#include "pg.h"

/*
 * $1 after-id (uuid; the nil uuid to start), $2 kid_like, $3 limit.  The
 * subscriptions after $1, by id, with a sealed value not under the current
 * KEK.  Rows: enum hub_rekey_subs_col.
 */
enum hub_rekey_subs_col {
    HUB_REKEY_SUBS_ID,          /* subscription id (the AAD) */
    HUB_REKEY_SUBS_SECRET,      /* secret_sealed */
    HUB_REKEY_SUBS_HEADERS,     /* headers_sealed, or NULL */
    HUB_REKEY_SUBS_PREV_SECRET, /* prev_secret_sealed, or NULL */
    HUB_REKEY_SUBS_NCOLS,
};
extern const struct hub_sql hub_sql_rekey_subs_page;

/*
 * $1 id, $2..$4 the new secret_sealed, headers_sealed, prev_secret_sealed,
 * $5..$7 the values read (NULLs compare equal).  Writes the new ones only
 * while the row holds the values read; updated_at is left alone (nothing
 * a tenant sees changed).  One row (the id) when written, none when the row
 * changed meanwhile or is gone.
 */
extern const struct hub_sql hub_sql_rekey_subs_update;

/*
 * $1 after-scope, $2 after-key (both "" to start), $3 kid_like, $4 limit.
 * The idempotency records after ($1, $2) whose "_ss" or "_hs" is not under
 * the current KEK.  Rows: enum hub_rekey_idem_col.
 */
enum hub_rekey_idem_col {
    HUB_REKEY_IDEM_SCOPE,
    HUB_REKEY_IDEM_KEY,
    HUB_REKEY_IDEM_BODY, /* the stored answer, JSON text */
    HUB_REKEY_IDEM_NCOLS,
};
extern const struct hub_sql hub_sql_rekey_idem_page;

/* $1 scope, $2 key, $3 new body, $4 the body read.  One row (the key) when
 * written, none when the record changed meanwhile or is gone. */
extern const struct hub_sql hub_sql_rekey_idem_update;

/* $1 kid_like.  How many subscriptions and idempotency records still hold
 * a value not under the current KEK.  One row: enum hub_rekey_left_col. */
enum hub_rekey_left_col {
    HUB_REKEY_LEFT_SUBS,
    HUB_REKEY_LEFT_IDEM,
};
extern const struct hub_sql hub_sql_rekey_left;

#endif
