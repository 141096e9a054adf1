/*
 * pg_array — one-dimensional PostgreSQL arrays in the binary wire format.
 *
 * Why: a statement over `unnest($1::text[], $2::bytea[], ...)` writes a whole
 * batch in one round trip, and sending its arrays in binary needs no
 * escaping: payload bytes travel as they are.  The ingest insert, the
 * quarantine rows and the dispatcher's outcome and claim statements are
 * built this way.
 *
 * Ownership: a struct hub_pgarr owns its buffer from hub_pgarr_init() until
 * hub_pgarr_free(), or until hub_pgarr_take() hands the buffer to the caller
 * (or hub_pgarr_txn_add() to a transaction).  An allocation failure is
 * remembered (`oom`) and reported once, by finish/take: the add functions
 * never fail on their own, so a builder loop needs no error checks.
 */
#ifndef HUB_PG_ARRAY_H
#define HUB_PG_ARRAY_H

#include <stddef.h>
#include <stdint.h>

#include "pg.h"

/* Element type OIDs used in parameter arrays (pg_type.oid). */
#define HUB_OID_BOOL 16
#define HUB_OID_BYTEA 17
#define HUB_OID_INT8 20
#define HUB_OID_INT4 23
#define HUB_OID_TEXT 25
#define HUB_OID_TIMESTAMPTZ 1184
#define HUB_OID_JSONB 3802

/* A one-dimensional array in binary wire format, built element by element.
 * The members are the encoder's; callers only read `n` (elements so far). */
struct hub_pgarr {
    char *buf;
    size_t len;
    size_t cap;
    uint32_t n;
    uint32_t oid;
    int has_null;
    int oom;
};

/* Starts an empty array of element type oid (a HUB_OID_* value). */
void hub_pgarr_init(struct hub_pgarr *a, uint32_t oid);
/* Appends raw element bytes (already in the element's binary form); p == NULL appends NULL. */
void hub_pgarr_add(struct hub_pgarr *a, const void *p, size_t len);
void hub_pgarr_add_text(struct hub_pgarr *a, const char *s); /* NULL → SQL NULL */
void hub_pgarr_add_i32(struct hub_pgarr *a, int32_t v);
void hub_pgarr_add_i64(struct hub_pgarr *a, int64_t v);
void hub_pgarr_add_bool(struct hub_pgarr *a, int v);
void hub_pgarr_add_ts(struct hub_pgarr *a, int64_t unix_us); /* timestamptz */
void hub_pgarr_add_jsonb(struct hub_pgarr *a, const char *json, size_t len);
/* Writes the header; returns the buffer (owned by a) and its length, or NULL on OOM. */
const char *hub_pgarr_finish(struct hub_pgarr *a, int *len);
void hub_pgarr_free(struct hub_pgarr *a);
/* Finishes the array and hands its malloc'd buffer to the caller (for
 * hub_pg_txn_add_owned); a is left empty.  NULL on OOM (a is then freed). */
char *hub_pgarr_take(struct hub_pgarr *a, int *len);

/* The most arrays hub_pgarr_txn_add() takes for one statement. */
#define HUB_PGARR_TXN_MAX 32

/*
 * Finishes a[0..n) and appends sql to txn with them as its parameters $1..$n
 * (binary), without copying them: the transaction takes every buffer, and
 * each a[k] is left empty (freed), also on failure.  Returns 0, or:
 *   HUB_ENOMEM  an array ran out of memory, or txn could not take the
 *               statement: nothing was added and txn is marked failed
 *               (hub_pg_txn_fail): submit completes it with HUB_PG_ENOMEM,
 *               so no transaction ever commits without one of its statements;
 *   HUB_EINVAL  n outside 1..HUB_PGARR_TXN_MAX (txn marked failed too).
 */
int hub_pgarr_txn_add(struct hub_pg_txn *txn, const struct hub_sql *sql, struct hub_pgarr *a,
                      int n);

#endif
