/*
 * store_rekey — SQL texts of `streaming-hub rekey` (see store_rekey.h).
 *
 * The pages walk a primary key (subscriptions by id, idempotency records by
 * (scope, key)) and filter as they go, so a run reads each table once
 * whatever it finds; nothing here needs an index of its own, as a rekey runs
 * once per rotation.
 */
#include "store_rekey.h"

/* The SQL below is laid out for reading as SQL. */
// clang-format off

/* A sealed value (text expression) that is there and not under the current
 * KEK; NULL (no headers, no previous secret) is nothing to re-seal. */
#define REKEY_STALE(v, like) "(" v " IS NOT NULL AND " v " NOT LIKE " like ")"

/* A subscription row, or an idempotency record, holding such a value. */
#define REKEY_SUB_STALE(like)                                                                     \
    "(" REKEY_STALE("secret_sealed", like) " OR " REKEY_STALE("headers_sealed", like)             \
    " OR " REKEY_STALE("prev_secret_sealed", like) ")"
#define REKEY_IDEM_STALE(like)                                                                    \
    "(" REKEY_STALE("body::json->>'_ss'", like) " OR " REKEY_STALE("body::json->>'_hs'", like) ")"

const struct hub_sql hub_sql_rekey_subs_page = {
    "rekey_subs_page",
    "SELECT id::text, secret_sealed, headers_sealed, prev_secret_sealed FROM subscriptions"
    " WHERE id > $1::uuid AND " REKEY_SUB_STALE("$2::text") " ORDER BY id LIMIT $3::int",
    0,
};

const struct hub_sql hub_sql_rekey_subs_update = {
    "rekey_subs_update",
    "UPDATE subscriptions SET secret_sealed = $2::text, headers_sealed = $3::text,"
    "       prev_secret_sealed = $4::text"
    " WHERE id = $1::uuid AND secret_sealed = $5::text"
    "   AND headers_sealed IS NOT DISTINCT FROM $6::text"
    "   AND prev_secret_sealed IS NOT DISTINCT FROM $7::text"
    " RETURNING id",
    0,
};

/* The records are JSON text; only those of creations, rotations and
 * verifications carry "_ss" or "_hs" (store_subs.h). */
const struct hub_sql hub_sql_rekey_idem_page = {
    "rekey_idem_page",
    "SELECT scope, key, body FROM idempotency_keys"
    " WHERE (scope, key) > ($1::text, $2::text) AND " REKEY_IDEM_STALE("$3::text")
    " ORDER BY scope, key LIMIT $4::int",
    0,
};

const struct hub_sql hub_sql_rekey_idem_update = {
    "rekey_idem_update",
    "UPDATE idempotency_keys SET body = $3::text"
    " WHERE scope = $1::text AND key = $2::text AND body = $4::text"
    " RETURNING key",
    0,
};

const struct hub_sql hub_sql_rekey_left = {
    "rekey_left",
    "SELECT (SELECT count(*) FROM subscriptions WHERE " REKEY_SUB_STALE("$1::text") "),"
    "       (SELECT count(*) FROM idempotency_keys WHERE " REKEY_IDEM_STALE("$1::text") ")",
    0,
};

// clang-format on
