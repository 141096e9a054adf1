/*
 * ingest_batch — the batch writer: a Kafka partition's batch or a group of
 * HTTP ingest requests → verdicts, durably (see ingest_batch.h for the path
 * and who owns the batch when).
 *
 * The writer is a small state machine per record (enum rec_state, kept in
 * the record's private `state`).  Each transaction carries the records that
 * still have something to write (`sent` marks them); when it commits, each
 * of them moves on — most to REC_DONE, a digest conflict to REC_CONFLICT
 * (its quarantine row goes with the next transaction), a key raced by
 * another hub stays REC_INSERT — and ingest_batch_submit() sends what is
 * left.  A record is REC_DONE only once a committed transaction settled it,
 * and is never written again: a retry after a failure, or the next round
 * after a race, carries only what did not commit.
 */
#include "ingest_batch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "envelope.h"
#include "hub.h"
#include "metrics.h"
#include "stats.h"
#include "store_ingest.h"
#include "util.h"

/* The backoff of a batch that failed (ingest_batch_backoff_ms): doubling
 * from the minimum with each failure, capped. */
#define INGEST_RETRY_MIN_MS 100
#define INGEST_RETRY_MAX_MS 5000
/* Rounds in a row that leave a raced key to run again before the batch
 * gives up (a failure the owner retries).  A key races once, when another
 * hub inserts it at the same moment: the next round sees that row.  Only a
 * statement that answers no row for a record could loop. */
#define INGEST_RACES_MAX 8

/* Where a record is (hub_ingest_rec.state). */
enum rec_state {
    REC_UNPARSED = 0, /* a Kafka record not parsed yet (or memory ran out parsing it); an
                       * HTTP record not looked at yet */
    REC_NOMEM,        /* an HTTP record the API could not parse for lack of memory: it
                       * cannot be settled here, and comes back unsettled */
    REC_REFUSED,      /* the parser refused it: its quarantine row is to be written */
    REC_INSERT,       /* valid and the first of its key: the insert is to run for it */
    REC_REPEAT,       /* valid, a repeat of an earlier record's key: follows that one */
    REC_CONFLICT,     /* a digest conflict: its quarantine row is to be written */
    REC_DONE,         /* settled by a committed transaction: verdict final, counted */
};

const struct hub_pg_outcome ingest_outcome_oom = {HUB_PG_ENOMEM, NULL, 0, "out of memory", ""};

const struct hub_pg_outcome ingest_outcome_held = {
    HUB_PG_ENOMEM, NULL, 0, "an earlier batch of the partition is not stored yet", ""};

/* The outcome of a batch whose raced keys never settled (INGEST_RACES_MAX). */
static const struct hub_pg_outcome ingest_outcome_races = {
    HUB_PG_ESTMT, NULL, 0, "the ingest statement answered no verdict for some records", ""};

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

/* 1 for a valid record not yet written: the ones repeats are marked among. */
static int rec_unwritten_valid(const struct hub_ingest_rec *r) {
    return r->state == REC_INSERT || r->state == REC_REPEAT;
}

/*
 * Marks records whose key already appeared earlier in the batch: only the
 * first goes to the database (REC_INSERT), the others (REC_REPEAT) take
 * their verdict from it.  Runs before the batch's first insert, and again
 * when the JSON check refused some of them.  An open-addressing table of
 * record indexes, at most half full.
 */
static void batch_mark_repeats(struct ingest_batch *b) {
    size_t cap = 16;
    int32_t *slots;

    while (cap < b->n * 2) {
        cap *= 2;
    }
    slots = malloc(sizeof(*slots) * cap);
    for (size_t i = 0; i < b->n; i++) {
        b->recs[i].first = -1;
        if (rec_unwritten_valid(&b->recs[i])) {
            b->recs[i].state = REC_INSERT;
        }
    }
    b->marked = 1;
    if (slots == NULL) {
        return; /* without the table every record goes to the database: still correct
                   except for in-batch repeats, which ON CONFLICT then reports as raced */
    }
    memset(slots, 0xff, sizeof(*slots) * cap);
    for (size_t i = 0; i < b->n; i++) {
        struct hub_ingest_rec *r = &b->recs[i];
        if (r->state != REC_INSERT) {
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
                r->state = REC_REPEAT;
                break;
            }
            h = (h + 1) & (cap - 1);
        }
    }
    free(slots);
}

/* ------------------------------------------------------ the records -- */

/* The record's verdict is final: counted once, here. */
static void rec_settle(struct ingest_batch *b, struct hub_ingest_rec *r, enum hub_verdict v) {
    r->verdict = v;
    r->state = REC_DONE;
    b->hub->metrics.ingest_records[v]++;
    hub_stats_ingest(b->hub->stats, r, 1); /* per-tenant figures (stats.h) */
}

/*
 * The parse step: each record not parsed yet gets its state.  A Kafka
 * record is parsed here, when its batch starts (a pending record is only
 * its Kafka message); an HTTP record was parsed by the API before it came.
 * Returns the number of Kafka records left unparsed for lack of memory.
 */
static size_t batch_parse(struct ingest_batch *b) {
    struct hub_envelope_limits lim = {(size_t)b->hub->cfg.max_event_bytes};
    size_t nomem = 0;

    for (size_t i = 0; i < b->n; i++) {
        struct hub_ingest_rec *r = &b->recs[i];
        if (r->state != REC_UNPARSED) {
            continue;
        }
        if (r->msg != NULL && ingest_rec_parse_kafka(r, &lim) != 0) {
            nomem++; /* parsed again on the batch's next try */
            continue;
        }
        if (r->ok) {
            r->state = REC_INSERT; /* or a repeat: batch_mark_repeats */
        } else if (r->err.reason == HUB_ENVELOPE_NOMEM) {
            r->state = REC_NOMEM; /* HTTP: the API's parse; its client retries */
        } else {
            r->state = REC_REFUSED;
            r->verdict = r->err.reason == HUB_ENVELOPE_TOO_LARGE ? HUB_V_QUARANTINED_TOO_LARGE
                                                                 : HUB_V_QUARANTINED_INVALID;
        }
    }
    return nomem;
}

/* Which records a quarantine statement carries: the refused ones and the
 * digest conflicts not written yet. */
static int want_quarantine(const struct hub_ingest_rec *r) {
    return r->state == REC_REFUSED || r->state == REC_CONFLICT;
}

/* ---------------------------------------------------- the statements -- */

/*
 * Adds to txn the quarantine rows of the records want_quarantine selects
 * (at least one), marking them sent: why (a digest conflict, or the
 * parser's reason and field) and the record's evidence.  Returns 0 or
 * HUB_ENOMEM (txn is then marked failed).
 */
static int add_quarantine(struct hub_pg_txn *txn, struct ingest_batch *b) {
    struct hub_store_quarantine_rows rows;

    hub_store_quarantine_rows_init(&rows);
    for (size_t i = 0; i < b->n; i++) {
        struct hub_ingest_rec *r = &b->recs[i];
        struct hub_store_quarantine_row row;
        struct ingest_evidence ev;
        if (!want_quarantine(r)) {
            continue;
        }
        ingest_rec_evidence(r, &row, &ev);
        if (r->verdict == HUB_V_QUARANTINED_SCHEMA ||
            r->verdict == HUB_V_QUARANTINED_UNKNOWN_SCHEMA) { /* the schema step's */
            row.reason = r->verdict == HUB_V_QUARANTINED_SCHEMA ? "schema_violation"
                                                                : "unknown_schema_version";
            row.field = "data";
            row.detail = r->schema_evidence;
        } else if (r->state == REC_CONFLICT) { /* the envelope is valid */
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
        r->sent = 1;
    }
    return hub_store_quarantine_rows_txn_add(&rows, txn);
}

/* Adds to txn the inbox insert of every record in REC_INSERT (at least
 * one), marking them sent.  Returns 0 or HUB_ENOMEM (txn is then marked
 * failed). */
static int add_insert(struct hub_pg_txn *txn, struct ingest_batch *b) {
    struct hub_store_ingest_rows rows;
    struct hub_store_ingest_fast fast;

    hub_store_ingest_rows_init(&rows);
    for (size_t i = 0; i < b->n; i++) {
        struct hub_ingest_rec *r = &b->recs[i];
        struct hub_store_kafka_pos pos;
        if (r->state != REC_INSERT) {
            continue;
        }
        ingest_rec_pos(r, &pos);
        /* with the version the schema step checked it against, if any */
        hub_store_ingest_rows_add_checked(&rows, (int32_t)i, &r->ev, &pos,
                                          r->schema_version[0] ? r->schema_version : NULL);
        r->sent = 1;
    }
    /* the jobs the dispatcher can start now are leased by this insert */
    b->fast = hub_dispatch_fast_offer(b->hub->dispatch, rows.n, &fast);
    return hub_store_ingest_rows_txn_add(&rows, &fast, txn);
}

/* The event of record ord, for the fast path's hand-off (dispatch.h):
 * only a record this batch stored has jobs.  NULL otherwise. */
static const struct hub_event *batch_event_of(void *arg, int ord) {
    struct ingest_batch *b = arg;
    const struct hub_ingest_rec *r;

    if (ord < 0 || (size_t)ord >= b->n) {
        return NULL;
    }
    r = &b->recs[ord];
    return r->state == REC_DONE && r->verdict == HUB_V_ACCEPTED ? &r->ev : NULL;
}

/* ---------------------------------------------------------- outcomes -- */

/* Marks every record that is not settled as unsettled (what the HTTP owner
 * answers 503 for) and clears the marks of the transaction just ended. */
static void batch_mark_unsettled(struct ingest_batch *b) {
    for (size_t i = 0; i < b->n; i++) {
        b->recs[i].sent = 0;
        b->recs[i].unsettled = b->recs[i].state != REC_DONE;
    }
}

/* Everything of the batch is durable: hand it back (the owner may free it:
 * nothing here touches b after the call). */
static void batch_done(struct ingest_batch *b) {
    struct hub_metrics *m = &b->hub->metrics;

    b->attempts = 0;
    b->races = 0;
    batch_mark_unsettled(b);
    hub_histogram_observe(&m->ingest_batch_seconds, (double)(hub_now_ns() - b->started_ns) / 1e9);
    b->owner->stored(b);
}

/* A transaction of the batch failed (out borrowed for the call), or could
 * not even be sent: count it and hand the batch back, as batch_done does. */
static void batch_failed(struct ingest_batch *b, const struct hub_pg_outcome *out) {
    b->hub->metrics.ingest_batch_failures++;
    batch_mark_unsettled(b);
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
 * records it carried: settled (accepted, duplicate, dropped), a digest
 * conflict still to quarantine, or left in REC_INSERT when another hub
 * raced us for the key (its row was invalid to our snapshot).  Returns 1
 * when a record was accepted (new jobs to dispatch).
 */
static int batch_classify(struct ingest_batch *b, PGresult *res) {
    int rows = res ? PQntuples(res) : 0;
    int accepted = 0;

    for (int row = 0; row < rows; row++) {
        int ord = atoi(PQgetvalue(res, row, HUB_INGEST_COL_ORD));
        struct hub_ingest_rec *r;
        char hex[65];
        if (!PQgetisnull(res, row, HUB_INGEST_COL_JOB)) {
            continue; /* a job the fast path leased, after every record's row */
        }
        if (ord < 0 || (size_t)ord >= b->n) {
            continue; /* not a row we sent: never trust an index from outside */
        }
        r = &b->recs[ord];
        if (r->state != REC_INSERT || !r->sent) {
            continue;
        }
        /* the roster gate first (SPEC §3.2), then the key already stored,
         * then the new row */
        if (PQgetisnull(res, row, HUB_INGEST_COL_TENANT_STATUS)) {
            rec_settle(b, r, HUB_V_DROPPED_UNKNOWN_TENANT);
        } else if (strcmp(PQgetvalue(res, row, HUB_INGEST_COL_TENANT_STATUS), "active") != 0) {
            rec_settle(b, r, HUB_V_DROPPED_INACTIVE_TENANT);
        } else if (!PQgetisnull(res, row, HUB_INGEST_COL_STORED_DIGEST)) {
            const char *old = PQgetvalue(res, row, HUB_INGEST_COL_STORED_DIGEST); /* "\x" + hex */
            snprintf(r->old_digest, sizeof(r->old_digest), "%s", old + 2);
            hub_hex(r->ev.digest, sizeof(r->ev.digest), hex);
            if (strcmp(hex, r->old_digest) == 0) {
                rec_settle(b, r, HUB_V_DUPLICATE);
            } else {
                r->verdict = HUB_V_QUARANTINED_CONFLICT;
                r->state = REC_CONFLICT; /* its quarantine row goes with the next round */
            }
        } else if (!PQgetisnull(res, row, HUB_INGEST_COL_SEQ)) {
            r->seq = strtoll(PQgetvalue(res, row, HUB_INGEST_COL_SEQ), NULL, 10);
            /* what is stored under the key now: its repeats compare to it */
            hub_hex(r->ev.digest, sizeof(r->ev.digest), r->old_digest);
            rec_settle(b, r, HUB_V_ACCEPTED);
            accepted = 1;
        }
        /* else: raced; it stays REC_INSERT for the next round */
    }
    return accepted;
}

/* Repeats inside the batch follow their first occurrence once that one's
 * verdict is known (first->old_digest: the digest now stored under the
 * key); a repeat of a raced key waits for the next round. */
static void batch_follow_repeats(struct ingest_batch *b) {
    for (size_t i = 0; i < b->n; i++) {
        struct hub_ingest_rec *r = &b->recs[i];
        const struct hub_ingest_rec *f;
        char hex[65];
        if (r->state != REC_REPEAT) {
            continue;
        }
        f = &b->recs[r->first];
        if (f->state != REC_DONE && f->state != REC_CONFLICT) {
            continue;
        }
        if (f->verdict == HUB_V_DROPPED_UNKNOWN_TENANT ||
            f->verdict == HUB_V_DROPPED_INACTIVE_TENANT) {
            rec_settle(b, r, f->verdict);
            continue;
        }
        hub_hex(r->ev.digest, sizeof(r->ev.digest), hex);
        if (f->old_digest[0] != '\0' && strcmp(hex, f->old_digest) == 0) {
            rec_settle(b, r, HUB_V_DUPLICATE);
        } else {
            r->verdict = HUB_V_QUARANTINED_CONFLICT;
            r->state = REC_CONFLICT;
        }
    }
}

/* ---------------------------------------------- the JSON-grammar path -- */

/* Whether a valid record not written yet has a JSON payload still
 * unchecked; with repeats_only, among the in-batch repeats only: the
 * records the insert statement does not carry, so its JSON check does not
 * reach them. */
static int batch_json_unchecked(const struct ingest_batch *b, int repeats_only) {
    for (size_t i = 0; i < b->n; i++) {
        const struct hub_ingest_rec *r = &b->recs[i];
        if (rec_unwritten_valid(r) && r->ev.json_unchecked &&
            (!repeats_only || r->state == REC_REPEAT)) {
            return 1;
        }
    }
    return 0;
}

/* A read of the batch's (the JSON check, the refused keys) answered: its
 * rows, or NULL once the batch is handed back because it failed.  No
 * result at all is not "no rows": the read did not run. */
static PGresult *batch_read_done(struct ingest_batch *b, const struct hub_pg_outcome *out) {
    PGresult *res = out->n_results > 0 ? out->results[0] : NULL;

    b->in_txn = 0;
    if (out->status != HUB_PG_OK || res == NULL) {
        batch_failed(b, out);
        return NULL;
    }
    return res;
}

/* The row-by-row check answered: the payloads it lists are refused (their
 * events freed), every other one passed; then the batch is written again. */
static void batch_json_cb(void *arg, const struct hub_pg_outcome *out) {
    struct ingest_batch *b = arg;
    PGresult *res = batch_read_done(b, out);

    if (res == NULL) {
        return;
    }
    for (int row = 0; row < PQntuples(res); row++) {
        int ord = atoi(PQgetvalue(res, row, HUB_JSON_ERRORS_COL_ORD));
        struct hub_ingest_rec *r;
        if (ord < 0 || (size_t)ord >= b->n || !rec_unwritten_valid(&b->recs[ord])) {
            continue;
        }
        r = &b->recs[ord];
        r->ok = 0;
        r->state = REC_REFUSED;
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
        if (rec_unwritten_valid(r) && r->ev.json_unchecked) {
            hub_store_json_rows_add(&rows, (int32_t)i, r->ev.payload, r->ev.payload_len);
        }
    }
    /* on OOM the txn is marked failed and fails through its callback */
    hub_store_json_rows_txn_add(&rows, txn);
    b->in_txn = 1;
    hub_pg_txn_submit(txn);
}

/* ---------------------------------------- keys the schema refused -- */

/* A record the schema step refused whose key may be stored already. */
static int rec_schema_refused(const struct hub_ingest_rec *r) {
    return r->state == REC_REFUSED && r->ok &&
           (r->verdict == HUB_V_QUARANTINED_SCHEMA ||
            r->verdict == HUB_V_QUARANTINED_UNKNOWN_SCHEMA);
}

/* What is stored under the refused keys came back.  The roster gate comes
 * first, as in the insert (SPEC §3.2): a tenant not on the roster, or not
 * active, has its record dropped, never quarantined.  Then a key stored
 * with the same payload is that event again, a duplicate (a producer's
 * retry of an event stored before its type had a schema, or had this
 * one); with another payload, the digest conflict it would be without the
 * schema; with nothing stored, the refusal stands. */
static void batch_stored_cb(void *arg, const struct hub_pg_outcome *out) {
    struct ingest_batch *b = arg;
    PGresult *res = batch_read_done(b, out);

    if (res == NULL) {
        return; /* stored_done still 0: the batch's next try looks again */
    }
    b->stored_done = 1;
    for (int row = 0; row < PQntuples(res); row++) {
        int ord = atoi(PQgetvalue(res, row, HUB_STORED_DIGESTS_COL_ORD));
        struct hub_ingest_rec *r;
        char hex[65];
        if (ord < 0 || (size_t)ord >= b->n || !rec_schema_refused(&b->recs[ord])) {
            continue;
        }
        r = &b->recs[ord];
        if (PQgetisnull(res, row, HUB_STORED_DIGESTS_COL_TENANT_STATUS)) {
            rec_settle(b, r, HUB_V_DROPPED_UNKNOWN_TENANT);
            continue;
        }
        if (strcmp(PQgetvalue(res, row, HUB_STORED_DIGESTS_COL_TENANT_STATUS), "active") != 0) {
            rec_settle(b, r, HUB_V_DROPPED_INACTIVE_TENANT);
            continue;
        }
        if (PQgetisnull(res, row, HUB_STORED_DIGESTS_COL_DIGEST)) {
            continue;
        }
        hub_hex(r->ev.digest, sizeof(r->ev.digest), hex);
        if (strcmp(hex, PQgetvalue(res, row, HUB_STORED_DIGESTS_COL_DIGEST)) == 0) {
            rec_settle(b, r, HUB_V_DUPLICATE);
        } else {
            r->verdict = HUB_V_QUARANTINED_CONFLICT;
            r->state = REC_CONFLICT;
        }
    }
    ingest_batch_submit(b);
}

/* Looks up the keys of the records the schema step refused, once per
 * batch; returns 1 when the lookup has the batch (or it failed), 0 when
 * there is none to look up. */
static int batch_check_stored(struct ingest_batch *b) {
    struct hub_pgarr a[HUB_STORED_DIGESTS_NPARAMS];
    struct hub_pg_txn *txn;
    int n = 0;

    if (b->stored_done) {
        return 0;
    }
    for (size_t i = 0; i < b->n; i++) {
        n += rec_schema_refused(&b->recs[i]);
    }
    if (n == 0) {
        b->stored_done = 1;
        return 0;
    }
    /* the keys an earlier batch of the partition stores are seen only
     * after it: held as its writes would be, and behind them on its lane */
    if (b->owner->may_write != NULL && !b->owner->may_write(b)) {
        batch_mark_unsettled(b); /* held, not failed: not counted as a failure */
        b->owner->failed(b, &ingest_outcome_held);
        return 1;
    }
    hub_pgarr_init(&a[0], HUB_OID_INT4);
    for (int k = 1; k < HUB_STORED_DIGESTS_NPARAMS; k++) {
        hub_pgarr_init(&a[k], HUB_OID_TEXT);
    }
    for (size_t i = 0; i < b->n; i++) {
        const struct hub_ingest_rec *r = &b->recs[i];
        if (rec_schema_refused(r)) {
            hub_pgarr_add_i32(&a[0], (int32_t)i);
            hub_pgarr_add_text(&a[1], r->ev.tenant);
            hub_pgarr_add_text(&a[2], r->ev.source);
            hub_pgarr_add_text(&a[3], r->ev.id);
        }
    }
    if ((txn = hub_pg_txn_new(b->pg, batch_stored_cb, b)) == NULL) {
        for (int k = 0; k < HUB_STORED_DIGESTS_NPARAMS; k++) {
            hub_pgarr_free(&a[k]);
        }
        batch_failed(b, &ingest_outcome_oom);
        return 1;
    }
    if (b->lane != NULL) {
        hub_pg_txn_lane(txn, b->lane);
    }
    /* on OOM the txn is marked failed and fails through its callback */
    hub_pgarr_txn_add(txn, &hub_sql_ingest_stored_digests, a, HUB_STORED_DIGESTS_NPARAMS);
    b->in_txn = 1;
    hub_pg_txn_submit(txn);
    return 1;
}

/* ------------------------------------------------------ the schema step -- */

/* Hands the batch to the schema step (ingest_schema.c) once, before its
 * first transaction: returns 1 when the step has it (or it failed for lack
 * of memory and went back to its owner), 0 to go on now. */
static int batch_schema_step(struct ingest_batch *b) {
    int rc;

    if (b->schema_done) {
        return 0;
    }
    for (size_t i = 0; i < b->n; i++) {
        b->recs[i].schema_want = rec_unwritten_valid(&b->recs[i]);
    }
    rc = ingest_schema_start(b);
    if (rc < 0) {
        batch_failed(b, &ingest_outcome_oom);
        return 1;
    }
    if (rc == 0) {
        /* rc 1 may have finished at once (ingest_batch_schema_done ran and
         * submitted, perhaps failing the batch): b is not touched then */
        b->schema_done = 1;
    }
    return rc;
}

void ingest_batch_schema_done(struct ingest_batch *b) {
    b->in_step = INGEST_STEP_NONE;
    for (size_t i = 0; i < b->n; i++) {
        struct hub_ingest_rec *r = &b->recs[i];
        if (r->schema_want && (r->verdict == HUB_V_QUARANTINED_SCHEMA ||
                               r->verdict == HUB_V_QUARANTINED_UNKNOWN_SCHEMA ||
                               r->verdict == HUB_V_QUARANTINED_INVALID)) {
            r->state = REC_REFUSED; /* a valid envelope (r->ok): its own key is the evidence */
        }
        r->schema_want = 0;
    }
    b->schema_done = 1;
    b->marked = 0; /* a first occurrence may have been refused */
    ingest_batch_submit(b);
}

/* ------------------------------------------------------ the main path -- */

/* What the records still have to write: quarantine rows and inserts, and
 * repeats waiting for their first occurrence (which is then among the
 * inserts). */
struct batch_work {
    size_t quarantines;
    size_t inserts;
    size_t repeats;
};

static void batch_work_left(const struct ingest_batch *b, struct batch_work *w) {
    memset(w, 0, sizeof(*w));
    for (size_t i = 0; i < b->n; i++) {
        const struct hub_ingest_rec *r = &b->recs[i];
        w->quarantines += want_quarantine(r);
        w->inserts += r->state == REC_INSERT;
        w->repeats += r->state == REC_REPEAT;
    }
}

/* A transaction of the batch finished: the records it carried move on, and
 * what is left goes into the next one; or the batch is handed back. */
static void batch_txn_cb(void *arg, const struct hub_pg_outcome *out) {
    struct ingest_batch *b = arg;
    int insert_stmt;
    int sent_insert = 0;
    int sent_quarantine = 0;
    struct hub_dispatch_fast *fast = b->fast; /* this transaction's offer */

    b->in_txn = 0;
    b->in_write = 0;
    b->fast = NULL;
    for (size_t i = 0; i < b->n; i++) {
        const struct hub_ingest_rec *r = &b->recs[i];
        sent_insert |= r->sent && r->state == REC_INSERT;
        sent_quarantine |= r->sent && want_quarantine(r);
    }
    if (out->status != HUB_PG_OK) {
        hub_dispatch_fast_drop(fast); /* nothing it leased exists: nothing is delivered */
        for (size_t i = 0; i < b->n; i++) {
            b->recs[i].sent = 0; /* nothing of it committed */
        }
        if (sent_insert && hub_sqlstate_json_grammar(out->sqlstate) && batch_json_unchecked(b, 0)) {
            batch_check_json(b); /* a payload that is not JSON, most likely */
            return;
        }
        batch_failed(b, out);
        return;
    }
    /* committed: the quarantine statement came first when there was one */
    for (size_t i = 0; i < b->n; i++) {
        struct hub_ingest_rec *r = &b->recs[i];
        if (r->sent && want_quarantine(r)) {
            rec_settle(b, r, r->verdict);
        }
    }
    insert_stmt = sent_quarantine ? 1 : 0;
    if (sent_insert) {
        PGresult *res = insert_stmt < out->n_results ? out->results[insert_stmt] : NULL;
        batch_classify(b, res);
        /* their jobs are committed: the leased ones start, the claim takes the rest */
        hub_dispatch_ingested(b->hub->dispatch, fast, res, batch_event_of, b);
    } else {
        hub_dispatch_fast_drop(fast);
    }
    batch_follow_repeats(b);
    /* a record the insert carried and did not settle raced another hub:
     * it runs again at once (the other hub's row is committed by now) */
    int raced = 0;
    for (size_t i = 0; i < b->n; i++) {
        raced |= b->recs[i].sent && b->recs[i].state == REC_INSERT;
        b->recs[i].sent = 0;
    }
    b->races = raced ? b->races + 1 : 0;
    if (b->races > INGEST_RACES_MAX) {
        b->races = 0;
        batch_failed(b, &ingest_outcome_races);
        return;
    }
    ingest_batch_submit(b);
}

void ingest_batch_submit(struct ingest_batch *b) {
    struct hub_pg_txn *txn;
    struct batch_work w;

    if (batch_parse(b) > 0) {
        /* not one row is written while a record is unparsed: the batch's
         * next try parses it again */
        batch_failed(b, &ingest_outcome_oom);
        return;
    }
    if (!b->marked) {
        batch_mark_repeats(b);
    }
    if (batch_schema_step(b)) {
        return; /* the schema step has the batch, or it failed */
    }
    if (batch_check_stored(b)) {
        return; /* the lookup has the batch, or it failed */
    }
    if (batch_json_unchecked(b, 1)) {
        /* a repeat of a key in the batch is not inserted, so the insert
         * would not check its payload: check them all row by row */
        batch_check_json(b);
        return;
    }
    batch_work_left(b, &w);
    if (w.quarantines == 0 && w.inserts == 0) {
        if (w.repeats > 0) {
            /* a repeat whose first occurrence settles in no transaction:
             * never expected, and never a reason to loop */
            batch_failed(b, &ingest_outcome_races);
            return;
        }
        batch_done(b);
        return;
    }
    /* a partition's batches write in offset order (ingest_kafka.c) */
    if (b->owner->may_write != NULL && !b->owner->may_write(b)) {
        batch_mark_unsettled(b); /* held, not failed: not counted as a failure */
        b->owner->failed(b, &ingest_outcome_held);
        return;
    }
    /* One transaction carries every quarantine row still to write and the
     * insert of every key still to store, so they commit or fail together;
     * rows settled by an earlier transaction are never sent again. */
    txn = hub_pg_txn_new(b->pg, batch_txn_cb, b);
    if (txn == NULL) {
        batch_failed(b, &ingest_outcome_oom);
        return;
    }
    if (b->lane != NULL) {
        hub_pg_txn_lane(txn, b->lane);
    }
    /* on OOM a builder marks txn failed: it then completes through
     * batch_txn_cb with HUB_PG_ENOMEM, sending nothing */
    if (w.quarantines > 0) {
        add_quarantine(txn, b);
    }
    if (w.inserts > 0) {
        add_insert(txn, b);
    }
    b->in_txn = 1;
    b->in_write = 1;
    hub_pg_txn_submit(txn);
}

void ingest_batch_start(struct ingest_batch *b) {
    b->fast = NULL;
    b->in_step = INGEST_STEP_NONE;
    b->attempts = 0;
    b->races = 0;
    b->stored_done = 0;
    ingest_batch_submit(b);
}
