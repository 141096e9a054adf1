/*
 * pg_array — PostgreSQL's binary array format, built element by element
 * (see pg_array.h).
 *
 * The wire form of a one-dimensional array: a 20-byte header (ndim = 1,
 * has-null flag, element OID, element count, lower bound = 1), then per
 * element its length as a big-endian int32 (-1 for NULL) and its bytes.
 * The header's count is only known at the end, so the first 20 bytes are
 * reserved at init and written by hub_pgarr_finish().
 */
#include "pg_array.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "fault.h"

#define PGARR_HEADER 20 /* ndim, flags, oid, dim length, lower bound */

/* Seconds between the Unix epoch and PostgreSQL's (2000-01-01). */
#define PG_EPOCH_OFFSET_US (946684800LL * 1000000LL)

/* Makes room for `more` bytes, doubling; a failure sets a->oom, which every
 * later call then respects (the adds become no-ops, finish returns NULL). */
static void pgarr_reserve(struct hub_pgarr *a, size_t more) {
    if (a->oom || a->len + more <= a->cap) {
        return;
    }
    size_t cap = a->cap ? a->cap : 4096;
    while (cap < a->len + more) {
        cap *= 2;
    }
    char *b = hub_fault("pg_array") ? NULL : realloc(a->buf, cap);
    if (b == NULL) {
        a->oom = 1;
        return;
    }
    a->buf = b;
    a->cap = cap;
}

/* Writes v big-endian at p (PostgreSQL's binary formats are network order). */
static void put32(char *p, uint32_t v) {
    v = htonl(v);
    memcpy(p, &v, 4);
}

/* The header's room is reserved now and written by finish; an allocation
 * failure here already marks the array (finish then returns NULL). */
void hub_pgarr_init(struct hub_pgarr *a, uint32_t oid) {
    memset(a, 0, sizeof(*a));
    a->oid = oid;
    pgarr_reserve(a, PGARR_HEADER);
    a->len = PGARR_HEADER;
}

/* Every element: its length as int32 (-1 for NULL, no bytes), then its
 * bytes in the element type's binary form. */
void hub_pgarr_add(struct hub_pgarr *a, const void *p, size_t len) {
    pgarr_reserve(a, 4 + (p ? len : 0));
    if (a->oom) {
        return;
    }
    if (p == NULL) {
        put32(a->buf + a->len, 0xFFFFFFFFu);
        a->len += 4;
        a->has_null = 1;
    } else {
        put32(a->buf + a->len, (uint32_t)len);
        memcpy(a->buf + a->len + 4, p, len);
        a->len += 4 + len;
    }
    a->n++;
}

/* text's binary form is its bytes, without the NUL. */
void hub_pgarr_add_text(struct hub_pgarr *a, const char *s) {
    hub_pgarr_add(a, s, s ? strlen(s) : 0);
}

/* int4: 4 bytes big-endian; a negative value keeps its two's-complement
 * bits through the unsigned cast. */
void hub_pgarr_add_i32(struct hub_pgarr *a, int32_t v) {
    char b[4];
    put32(b, (uint32_t)v);
    hub_pgarr_add(a, b, 4);
}

void hub_pgarr_add_i64(struct hub_pgarr *a, int64_t v) {
    /* big-endian as two 32-bit halves: there is no portable htonll */
    char b[8];
    put32(b, (uint32_t)((uint64_t)v >> 32));
    put32(b + 4, (uint32_t)((uint64_t)v & 0xFFFFFFFFu));
    hub_pgarr_add(a, b, 8);
}

/* bool's binary form is one byte, 0 or 1. */
void hub_pgarr_add_bool(struct hub_pgarr *a, int v) {
    char b = v ? 1 : 0;
    hub_pgarr_add(a, &b, 1);
}

void hub_pgarr_add_ts(struct hub_pgarr *a, int64_t unix_us) {
    /* binary timestamptz: microseconds since PostgreSQL's epoch, as int8 */
    hub_pgarr_add_i64(a, unix_us - PG_EPOCH_OFFSET_US);
}

/* json is not checked here: PostgreSQL parses it and fails the statement
 * if it is not JSON, so callers pass text they built or validated. */
void hub_pgarr_add_jsonb(struct hub_pgarr *a, const char *json, size_t len) {
    /* jsonb's binary input is a version byte (1) followed by the JSON text */
    pgarr_reserve(a, 5 + len);
    if (a->oom) {
        return;
    }
    put32(a->buf + a->len, (uint32_t)(len + 1));
    a->buf[a->len + 4] = 1;
    memcpy(a->buf + a->len + 5, json, len);
    a->len += 5 + len;
    a->n++;
}

/* May be called more than once (the header is rewritten); the buffer stays
 * a's, so a later add still works and a later finish covers it. */
const char *hub_pgarr_finish(struct hub_pgarr *a, int *len) {
    /* libpq takes parameter lengths as int */
    if (a->oom || a->len > (size_t)INT32_MAX) {
        return NULL;
    }
    put32(a->buf, 1);
    put32(a->buf + 4, (uint32_t)a->has_null);
    put32(a->buf + 8, a->oid);
    put32(a->buf + 12, a->n);
    put32(a->buf + 16, 1);
    *len = (int)a->len;
    return a->buf;
}

/* After take, a holds no buffer: adding to it starts a new, headerless
 * buffer, so a taken array is only freed or initialised again. */
char *hub_pgarr_take(struct hub_pgarr *a, int *len) {
    char *buf;
    if (hub_pgarr_finish(a, len) == NULL) {
        hub_pgarr_free(a);
        return NULL;
    }
    buf = a->buf;
    a->buf = NULL;
    a->len = a->cap = 0;
    return buf;
}

/* Safe on a taken or already freed array; a is left empty, not reusable
 * until hub_pgarr_init. */
void hub_pgarr_free(struct hub_pgarr *a) {
    free(a->buf);
    a->buf = NULL;
    a->len = a->cap = 0;
}

int hub_pgarr_txn_add(struct hub_pg_txn *txn, const struct hub_sql *sql, struct hub_pgarr *a,
                      int n) {
    char *values[HUB_PGARR_TXN_MAX];
    int lengths[HUB_PGARR_TXN_MAX];
    int rc = 0;

    /* the buffers go whatever happens: the caller never frees them */
    if (n < 1 || n > HUB_PGARR_TXN_MAX) {
        for (int k = 0; k < n; k++) {
            hub_pgarr_free(&a[k]);
        }
        hub_pg_txn_fail(txn, "a statement with too many array parameters");
        return HUB_EINVAL;
    }
    for (int k = 0; k < n; k++) {
        values[k] = hub_pgarr_take(&a[k], &lengths[k]);
        rc |= values[k] == NULL ? -1 : 0;
    }
    if (rc == 0) {
        /* the buffers are the transaction's now, even when this fails */
        return hub_pg_txn_add_owned(txn, sql, n, values, lengths) == 0 ? 0 : HUB_ENOMEM;
    }
    /* One array ran out of memory: nothing is added, and the transaction
     * fails as a whole (its other statements alone would commit only part
     * of what the caller meant as one write). */
    for (int k = 0; k < n; k++) {
        free(values[k]);
    }
    hub_pg_txn_fail(txn, "out of memory building a statement's array");
    return HUB_ENOMEM;
}
