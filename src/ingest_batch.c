/*
 * ingest_batch — the batch writer: a Kafka partition's batch or a group of
 * HTTP ingest requests → verdicts, durably (see ingest_batch.h for the path
 * and who owns the batch when).
 *
 * The writer is a small state machine on the batch's flags: `quarantined`
 * (refused records written), `stored` (the insert succeeded),
 * `conflicts_left` (digest conflicts still to quarantine).  Each
 * transaction's callback advances them and ingest_batch_submit() sends what
 * is left, so a retry after a failure never writes a row twice.
 */
#include "ingest_batch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "envelope.h"
#include "hub.h"
#include "metrics.h"
#include "store_ingest.h"
#include "util.h"

/* The backoff of a batch that failed (ingest_batch_backoff_ms): doubling
 * from the minimum with each failure, capped. */
#define INGEST_RETRY_MIN_MS 100
#define INGEST_RETRY_MAX_MS 5000

const struct hub_pg_outcome ingest_outcome_oom = {HUB_PG_ECLOSED, NULL, 0, "out of memory", ""};

/* ------------------------------------------------- in-batch repeats -- */

/* The dedup key's hash; a separator between the parts keeps ("ab","c")
 * apart from ("a","bc"). */
static uint64_t key_hash(const struct hub_event *ev) {
    static const unsigned char sep = 0xff;
    const char *parts[3] = {ev->tenant, ev->source, ev->id};
    uint64_t h = HUB_FNV1A_BASIS;

    for (int k = 0; k < 3; k++) {
        h = hub_fnv1a(h, parts[k], strlen(parts[k]));
        h = hub_fnv1a(h, &sep, 1);
    }
    return h;
}

/* 1 when a and b have the same dedup key (tenant, source, id). */
static int key_equal(const struct hub_event *a, const struct hub_event *b) {
    return strcmp(a->id, b->id) == 0 && strcmp(a->source, b->source) == 0 &&
           strcmp(a->tenant, b->tenant) == 0;
}

/* Marks records whose key already appeared earlier in the same batch: only the
 * first goes to the database, the others take their verdict from it.  An
 * open-addressing table of record indexes, at most half full. */
static void batch_mark_repeats(struct ingest_batch *b) {
    size_t cap = 16;
    int32_t *slots;

    while (cap < b->n * 2) {
        cap *= 2;
    }
    slots = malloc(sizeof(*slots) * cap);
    for (size_t i = 0; i < b->n; i++) {
        b->recs[i].first = -1;
    }
    if (slots == NULL) {
        return; /* without the table every record goes to the database: still correct
                   except for in-batch repeats, which ON CONFLICT then reports as raced */
    }
    memset(slots, 0xff, sizeof(*slots) * cap);
    for (size_t i = 0; i < b->n; i++) {
        struct hub_ingest_rec *r = &b->recs[i];
        if (!r->ok) {
            continue;
        }
        size_t h = (size_t)key_hash(&r->ev) & (cap - 1);
        for (;;) {
            if (slots[h] < 0) {
                slots[h] = (int32_t)i;
                break;
            }
            if (key_equal(&b->recs[slots[h]].ev, &r->ev)) {
                r->first = slots[h];
                break;
            }
            h = (h + 1) & (cap - 1);
        }
    }
    free(slots);
}

/* The verdict of a record the parser refused. */
static void rec_refuse(struct hub_ingest_rec *r) {
    r->verdict = r->err.reason == HUB_ENVELOPE_TOO_LARGE ? HUB_V_QUARANTINED_TOO_LARGE
                                                         : HUB_V_QUARANTINED_INVALID;
}

/* ---------------------------------------------------- the statements -- */

/* Which records a quarantine statement carries: the refused ones with the
 * batch's first transaction, the digest conflicts with the last. */
static int want_invalid(const struct hub_ingest_rec *r) {
    return !r->ok;
}

static int want_conflict(const struct hub_ingest_rec *r) {
    return r->ok && r->verdict == HUB_V_QUARANTINED_CONFLICT;
}

/*
 * Adds to txn the quarantine rows of the records `want` selects: why (a
 * digest conflict, or the parser's reason and field) and the record's
 * evidence.  Returns 0 or HUB_ENOMEM (store_ingest.h).
 */
static int add_quarantine(struct hub_pg_txn *txn, struct ingest_batch *b,
                          int (*want)(const struct hub_ingest_rec *)) {
    struct hub_store_quarantine_rows rows;

    hub_store_quarantine_rows_init(&rows);
    for (size_t i = 0; i < b->n; i++) {
        const struct hub_ingest_rec *r = &b->recs[i];
        struct hub_store_quarantine_row row;
        struct ingest_evidence ev;
        if (!want(r)) {
            continue;
        }
        ingest_rec_evidence(r, &row, &ev);
        if (r->ok) { /* a digest conflict: the envelope is valid */
            row.reason = "digest_conflict";
            row.field = "data";
            row.detail = "same tenant, source and id already stored with a "
                         "different payload digest";
        } else {
            row.reason = hub_envelope_reason_str(r->err.reason);
            row.field = r->err.field[0] ? r->err.field : NULL;
            /* the detail column is text: never store bytes that are not UTF-8 */
            row.detail = hub_utf8_valid(r->err.message, strlen(r->err.message))
                             ? r->err.message
                             : "invalid envelope";
        }
        hub_store_quarantine_rows_add(&rows, &row);
        ingest_evidence_free(&ev);
    }
    return hub_store_quarantine_rows_txn_add(&rows, txn);
}

/* Adds to txn the inbox insert of every valid record that is the first of
 * its key in the batch; *count says how many (none: nothing added).
 * Returns 0 or HUB_ENOMEM (store_ingest.h). */
static int add_insert(struct hub_pg_txn *txn, struct ingest_batch *b, size_t *count) {
    struct hub_store_ingest_rows rows;

    hub_store_ingest_rows_init(&rows);
    for (size_t i = 0; i < b->n; i++) {
        const struct hub_ingest_rec *r = &b->recs[i];
        struct hub_store_kafka_pos pos;
        if (!r->ok || r->first >= 0) {
            continue;
        }
        ingest_rec_pos(r, &pos);
        hub_store_ingest_rows_add(&rows, (int32_t)i, &r->ev, &pos);
    }
    *count = rows.n;
    return hub_store_ingest_rows_txn_add(&rows, txn);
}

/* ---------------------------------------------------------- outcomes -- */

/* Everything of the batch is durable: count the verdicts, wake the
 * dispatcher for the new jobs, and hand the batch back (the owner may free
 * it: nothing here touches b after the call). */
static void batch_done(struct ingest_batch *b) {
    struct hub_metrics *m = &b->hub->metrics;
    int accepted = 0;

    for (size_t i = 0; i < b->n; i++) {
        m->ingest_records[b->recs[i].verdict]++;
        accepted |= b->recs[i].verdict == HUB_V_ACCEPTED;
    }
    if (accepted) {
        hub_dispatch_kick(b->hub->dispatch); /* their jobs are committed */
    }
    hub_histogram_observe(&m->ingest_batch_seconds, (double)(hub_now_ns() - b->started_ns) / 1e9);
    b->owner->stored(b);
}

/* A transaction of the batch failed (out borrowed for the call): count it
 * and hand the batch back, as batch_done does. */
static void batch_failed(struct ingest_batch *b, const struct hub_pg_outcome *out) {
    b->hub->metrics.ingest_batch_failures++;
    b->owner->failed(b, out);
}

/* Doubling per failure so far: 100, 200, 400 ... 5000 ms. */
uint64_t ingest_batch_backoff_ms(struct ingest_batch *b) {
    uint64_t delay = INGEST_RETRY_MIN_MS;

    for (int i = 0; i < b->attempts && delay < INGEST_RETRY_MAX_MS; i++) {
        delay *= 2;
    }
    if (delay > INGEST_RETRY_MAX_MS) {
        delay = INGEST_RETRY_MAX_MS;
    }
    b->attempts++;
    return delay;
}

/*
 * Reads the insert statement's rows (res may be NULL: no rows) into the
 * verdicts of the records it carried, then gives each in-batch repeat the
 * verdict its first occurrence implies.  Returns the number of records that
 * raced a concurrent insert of the same key (to classify again).
 */
static size_t batch_classify(struct ingest_batch *b, PGresult *res) {
    size_t raced = 0;
    int rows = res ? PQntuples(res) : 0;

    for (int row = 0; row < rows; row++) {
        int ord = atoi(PQgetvalue(res, row, HUB_INGEST_COL_ORD));
        struct hub_ingest_rec *r;
        char hex[65];
        if (ord < 0 || (size_t)ord >= b->n) {
            continue; /* not a row we sent: never trust an index from outside */
        }
        r = &b->recs[ord];
        /* the roster gate first (SPEC §3.2), then the key already stored,
         * then the new row */
        if (PQgetisnull(res, row, HUB_INGEST_COL_TENANT_STATUS)) {
            r->verdict = HUB_V_DROPPED_UNKNOWN_TENANT;
        } else if (strcmp(PQgetvalue(res, row, HUB_INGEST_COL_TENANT_STATUS), "active") != 0) {
            r->verdict = HUB_V_DROPPED_INACTIVE_TENANT;
        } else if (!PQgetisnull(res, row, HUB_INGEST_COL_STORED_DIGEST)) {
            const char *old = PQgetvalue(res, row, HUB_INGEST_COL_STORED_DIGEST); /* "\x" + hex */
            snprintf(r->old_digest, sizeof(r->old_digest), "%s", old + 2);
            hub_hex(r->ev.digest, sizeof(r->ev.digest), hex);
            r->verdict =
                strcmp(hex, r->old_digest) == 0 ? HUB_V_DUPLICATE : HUB_V_QUARANTINED_CONFLICT;
        } else if (!PQgetisnull(res, row, HUB_INGEST_COL_SEQ)) {
            r->verdict = HUB_V_ACCEPTED;
            r->seq = strtoll(PQgetvalue(res, row, HUB_INGEST_COL_SEQ), NULL, 10);
            /* what is stored under the key now: its repeats compare to it */
            hub_hex(r->ev.digest, sizeof(r->ev.digest), r->old_digest);
        } else {
            raced++;
        }
    }
    /* Repeats inside the batch follow their first occurrence. */
    for (size_t i = 0; i < b->n; i++) {
        struct hub_ingest_rec *r = &b->recs[i];
        struct hub_ingest_rec *f;
        char hex[65];
        if (!r->ok || r->first < 0) {
            continue;
        }
        f = &b->recs[r->first];
        switch (f->verdict) {
        case HUB_V_DROPPED_UNKNOWN_TENANT:
        case HUB_V_DROPPED_INACTIVE_TENANT:
            r->verdict = f->verdict;
            break;
        default:
            /* f->old_digest is the digest now stored under the key */
            hub_hex(r->ev.digest, sizeof(r->ev.digest), hex);
            r->verdict = f->old_digest[0] != '\0' && strcmp(hex, f->old_digest) == 0
                             ? HUB_V_DUPLICATE
                             : HUB_V_QUARANTINED_CONFLICT;
            break;
        }
    }
    return raced;
}

/* ---------------------------------------------- the JSON-grammar path -- */

/* Whether a valid record's JSON payload is still unchecked; with
 * repeats_only, among the in-batch repeats only: the records the insert
 * statement does not carry, so its JSON check does not reach them. */
static int batch_json_unchecked(const struct ingest_batch *b, int repeats_only) {
    for (size_t i = 0; i < b->n; i++) {
        const struct hub_ingest_rec *r = &b->recs[i];
        if (r->ok && r->ev.json_unchecked && (!repeats_only || r->first >= 0)) {
            return 1;
        }
    }
    return 0;
}

/* The row-by-row check answered: the payloads it lists are refused (their
 * events freed), every other one passed; then the batch is written again. */
static void batch_json_cb(void *arg, const struct hub_pg_outcome *out) {
    struct ingest_batch *b = arg;
    PGresult *res = out->n_results > 0 ? out->results[0] : NULL;

    b->in_txn = 0;
    /* no rows at all is not "all passed": the check did not run */
    if (out->status != HUB_PG_OK || res == NULL) {
        batch_failed(b, out);
        return;
    }
    for (int row = 0; row < PQntuples(res); row++) {
        int ord = atoi(PQgetvalue(res, row, HUB_JSON_ERRORS_COL_ORD));
        struct hub_ingest_rec *r;
        if (ord < 0 || (size_t)ord >= b->n) {
            continue;
        }
        r = &b->recs[ord];
        r->ok = 0;
        r->verdict = HUB_V_QUARANTINED_INVALID;
        r->err.reason = HUB_ENVELOPE_INVALID;
        snprintf(r->err.field, sizeof(r->err.field), "data");
        snprintf(r->err.message, sizeof(r->err.message), "payload is not well-formed JSON (%s)",
                 PQgetvalue(res, row, HUB_JSON_ERRORS_COL_WHY));
        /* refused now: its event goes, the record keeps only its error */
        hub_event_free(&r->ev);
    }
    for (size_t i = 0; i < b->n; i++) {
        b->recs[i].ev.json_unchecked = 0; /* the others passed, one by one */
    }
    batch_mark_repeats(b); /* a first occurrence may have become invalid */
    ingest_batch_submit(b);
}

/* The insert failed on a payload's JSON grammar (or a batch has repeats to
 * check): find which payloads are not JSON, row by row (the slow path, for
 * bad input only), then write the batch again with them quarantined. */
static void batch_check_json(struct ingest_batch *b) {
    struct hub_store_json_rows rows;
    struct hub_pg_txn *txn;

    txn = hub_pg_txn_new(b->pg, batch_json_cb, b);
    if (txn == NULL) {
        batch_failed(b, &ingest_outcome_oom);
        return;
    }
    hub_store_json_rows_init(&rows);
    for (size_t i = 0; i < b->n; i++) {
        const struct hub_ingest_rec *r = &b->recs[i];
        if (r->ok && r->ev.json_unchecked) {
            hub_store_json_rows_add(&rows, (int32_t)i, r->ev.payload, r->ev.payload_len);
        }
    }
    /* on OOM the txn fails through its callback */
    hub_store_json_rows_txn_add(&rows, txn);
    b->in_txn = 1;
    hub_pg_txn_submit(txn);
}

/* ------------------------------------------------------ the main path -- */

/* A transaction of the batch finished: advance the flags and send what is
 * left, or hand the batch back. */
static void batch_txn_cb(void *arg, const struct hub_pg_outcome *out) {
    struct ingest_batch *b = arg;
    int stmt = 0;

    b->in_txn = 0;
    if (out->status != HUB_PG_OK) {
        if (!b->stored && hub_sqlstate_json_grammar(out->sqlstate) && batch_json_unchecked(b, 0)) {
            batch_check_json(b); /* a payload that is not JSON, most likely */
            return;
        }
        batch_failed(b, out);
        return;
    }
    if (!b->quarantined) {
        /* this transaction carried the invalid records, if there were any:
         * their quarantine statement came first, the insert second */
        for (size_t i = 0; i < b->n; i++) {
            if (!b->recs[i].ok) {
                stmt = 1;
                break;
            }
        }
        b->quarantined = 1;
    }
    if (!b->stored) {
        size_t raced = batch_classify(b, stmt < out->n_results ? out->results[stmt] : NULL);
        if (raced > 0) {
            /* Another hub inserted one of our keys while we did: run the batch
             * again; now its rows are visible and classify as duplicates. */
            b->attempts++;
            ingest_batch_submit(b);
            return;
        }
        b->stored = 1;
        b->conflicts_left = 0;
        for (size_t i = 0; i < b->n; i++) {
            b->conflicts_left += want_conflict(&b->recs[i]);
        }
    } else {
        b->conflicts_left = 0; /* this was the conflict quarantine transaction */
    }
    if (b->conflicts_left > 0) {
        ingest_batch_submit(b);
        return;
    }
    b->attempts = 0;
    batch_done(b);
}

void ingest_batch_submit(struct ingest_batch *b) {
    struct hub_pg_txn *txn;
    size_t inserts = 0;
    int invalid = 0;
    int rc = 0;

    if (!b->stored && batch_json_unchecked(b, 1)) {
        /* a repeat of a key in the batch is not inserted, so the insert
         * would not check its payload: check them all row by row */
        batch_check_json(b);
        return;
    }
    for (size_t i = 0; i < b->n; i++) {
        invalid |= !b->recs[i].ok;
    }
    /* The first transaction carries the refused records' quarantine rows
     * and the insert together, so both commit or neither does; once
     * stored, only the conflicts' quarantine rows are left to write. */
    txn = hub_pg_txn_new(b->pg, batch_txn_cb, b);
    if (txn == NULL) {
        batch_failed(b, &ingest_outcome_oom);
        return;
    }
    if (!b->stored) {
        if (!b->quarantined && invalid) {
            rc = add_quarantine(txn, b, want_invalid);
        }
        if (rc == 0) {
            rc = add_insert(txn, b, &inserts);
        }
        if (rc == 0 && inserts == 0 && (b->quarantined || !invalid)) {
            /* nothing to write at all: every record was invalid and is stored */
            hub_pg_txn_submit(txn); /* an empty transaction completes at once */
            b->in_txn = 1;
            return;
        }
    } else {
        rc = add_quarantine(txn, b, want_conflict);
    }
    if (rc != 0) {
        /* OOM while building: let submit fail the txn through the callback
         * (which it does when hub_pg_txn_add_owned failed; an array that
         * ran out of memory is simply missing, see pg_array.h) */
    }
    b->in_txn = 1;
    hub_pg_txn_submit(txn);
}

/* The batch's "parse" step: a Kafka record is parsed here, when its batch
 * starts, not when the consumer takes it (a pending record is only its
 * Kafka message); an HTTP record was parsed by the API before it came. */
void ingest_batch_start(struct ingest_batch *b) {
    struct hub_envelope_limits lim = {(size_t)b->hub->cfg.max_event_bytes};

    for (size_t i = 0; i < b->n; i++) {
        struct hub_ingest_rec *r = &b->recs[i];
        if (r->msg != NULL && ingest_rec_parse_kafka(r, &lim) != 0) {
            /* headers unreadable (OOM): refused, but its verdict is left as
             * it was before the split (see ingest_rec_parse_kafka) */
            continue;
        }
        if (!r->ok) {
            rec_refuse(r);
        }
    }
    batch_mark_repeats(b);
    ingest_batch_submit(b);
}
