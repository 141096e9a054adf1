/*
 * ingest_batch — the batch writer, and how ingest's parts hand a batch and
 * its records to one another.  Internal to ingest: only ingest*.c include it.
 *
 * The parts:
 *   ingest_kafka.c  the consumer: the partitions' pending records become
 *                   batches, several partitions' in one carrier that the
 *                   writer writes (one partition's when several of its
 *                   batches are in flight, their write transactions in
 *                   order on its lane); a partition's offset is committed
 *                   past a batch once it and every earlier batch of the
 *                   partition are stored;
 *   ingest_http.c   the HTTP ingest queue: requests waiting together become
 *                   one batch, a transaction they share;
 *   ingest_batch.c  the writer: records → verdicts, durably;
 *   ingest.c        the records: what is read from a Kafka record (headers,
 *                   position, quarantine evidence).
 *
 * A batch's path through the writer:
 *
 *   owner fills the batch ──► ingest_batch_start(): Kafka records parsed,
 *     refused ones get their verdict, in-batch repeats of a key marked
 *   ──► one transaction: quarantine rows of the refused records + the insert
 *       of the valid ones (store_ingest.h)
 *   ──► verdicts read from the insert's rows: each record settled by a
 *       committed transaction is final (counted, never written again)
 *       (the insert failed on a payload that is not JSON: the row-by-row
 *       check, those records refused, then the transaction again)
 *   ──► what is left goes into the next transaction, and only that: the
 *       quarantine rows of digest conflicts found, and the insert of keys
 *       another hub raced us for (their rows are visible now: duplicates)
 *   ──► every record settled: dispatch kicked ──► owner->stored(b)
 *
 *   any transaction failed ──► owner->failed(b, out): what earlier
 *   transactions settled stays settled; a Kafka carrier waits
 *   ingest_batch_backoff_ms() and calls ingest_batch_submit() for the rest
 *   (split first into one carrier per partition when it held several);
 *   an HTTP group answers each request for its own records (a record not
 *   settled is `unsettled`: its client retries it).
 *
 * Out of memory is never a verdict: a Kafka record whose headers or
 * envelope could not be read for lack of memory fails the batch before
 * anything is written (the partition retries, the record is parsed again),
 * and an HTTP record the API could not parse for that reason comes back
 * unsettled (503).
 *
 * Ownership: the owner allocates the batch and its records and fills the
 * members marked "owner".  From ingest_batch_start() until the owner's
 * stored() or failed() callback the writer has the batch: the owner may
 * read it but neither change nor free it.  From the callback on it is the
 * owner's again, to free or to submit again.
 */
#ifndef HUB_INGEST_BATCH_H
#define HUB_INGEST_BATCH_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "ingest.h"
#include "pg.h"
#include "store_ingest.h"

struct hub;
struct ingest_batch;

/* How the writer reports to a batch's owner; both run on the loop, and the
 * batch is the owner's from the call on. */
struct ingest_batch_owner {
    /* Every record is settled (but HTTP records the API could not parse
     * for lack of memory, marked unsettled): the rows, their jobs and the
     * quarantine rows are committed, the verdicts counted in the metrics. */
    void (*stored)(struct ingest_batch *b);
    /* A transaction failed (out borrowed for the call; no results).  What
     * the batch wrote before stays written and counted: each record not
     * settled is marked unsettled, and a later submit writes only those. */
    void (*failed)(struct ingest_batch *b, const struct hub_pg_outcome *out);
    /* May be NULL.  Asked before each write transaction (quarantine rows
     * and inserts): 0 holds it back, the batch then fails (with
     * ingest_outcome_held) and its owner submits it again later.  The
     * Kafka owner answers 0 while an earlier batch of a partition is
     * neither stored nor in a first-try write transaction on its lane. */
    int (*may_write)(struct ingest_batch *b);
};

struct ingest_batch {
    /* owner: set before ingest_batch_start() */
    struct hub *hub;
    struct hub_pg *pg;           /* the pool its transactions run on */
    struct hub_ingest_rec *recs; /* the owner's; the writer sets their verdicts */
    size_t n;                    /* >= 1 */
    uint64_t started_ns;         /* for the batch-duration histogram */
    const struct ingest_batch_owner *owner;
    void *owner_arg;  /* the Kafka consumer's carrier or the HTTP group */
    uv_timer_t retry; /* the Kafka owner's retry timer; unused by HTTP */
    /* the lane its write transactions go on (pg.h), or NULL (HTTP) */
    struct hub_pg_lane *lane;
    /* the writer's progress (the owner reads them; each record's own
     * progress is in its private members) */
    int attempts;    /* failed tries so far (reset once stored) */
    int in_txn;      /* a transaction is outstanding: the batch cannot be dropped */
    int in_write;    /* that transaction is a write (on b->lane) */
    int marked;      /* in-batch repeats are marked */
    int races;       /* transactions in a row that left a raced key to run again */
    int schema_done; /* the schema step has looked at the batch (ingest_schema.c) */
    int stored_done; /* the keys it refused were looked up (ingest_batch.c) */
    int in_step;     /* the step holds it: INGEST_STEP_CHECKING or INGEST_STEP_WAITING */
    /* the fast path's offer to the transaction in flight (dispatch.h), or NULL */
    struct hub_dispatch_fast *fast;
};

/* Where the schema step holds a batch (ingest_batch.in_step): a check on
 * the threadpool cannot be recalled, so stopping waits for it as for a
 * transaction; a wait for the registry's first snapshot can, and stopping
 * cancels it (hub_schemas_cancel_wait) and releases the batch. */
enum { INGEST_STEP_NONE = 0, INGEST_STEP_CHECKING, INGEST_STEP_WAITING };

/* The outcome a batch fails with when its transaction could not even be
 * built (out of memory): never sent, nothing stored. */
extern const struct hub_pg_outcome ingest_outcome_oom;

/* The outcome of a batch its owner's may_write() held back: nothing sent. */
extern const struct hub_pg_outcome ingest_outcome_held;

/*
 * Takes b (filled by its owner, records with their zeroed results) and
 * writes it: Kafka records (msg != NULL) are parsed here, HTTP records come
 * parsed.  Ends in exactly one call of b->owner->stored or ->failed,
 * possibly before this returns.
 */
void ingest_batch_start(struct ingest_batch *b);

/* Sends whatever b still has to write; for an owner retrying after
 * failed().  Takes b back as ingest_batch_start() does. */
void ingest_batch_submit(struct ingest_batch *b);

/* The delay before a failed batch's next try: 100 ms doubling with each
 * failure up to 5 s.  Counts the failure in b->attempts. */
uint64_t ingest_batch_backoff_ms(struct ingest_batch *b);

/* ------------------------------------------- the schema step (ingest_schema.c) -- */

/*
 * The schema step (SPEC §3.5) of a batch whose valid records not written
 * yet are marked schema_want.  Returns 0 when none of them has a type with
 * registered schemas (nothing to do: the writer goes on at once),
 * HUB_ENOMEM when the step could not start (the batch fails and is tried
 * again: nothing is stored unchecked), else 1: the step has the batch,
 * checks the payloads on the threadpool and calls
 * ingest_batch_schema_done(b) on the loop.  A record it quarantines gets
 * its verdict (HUB_V_QUARANTINED_SCHEMA or _UNKNOWN_SCHEMA) and evidence,
 * or, for a payload that is not JSON under a JSON content type, the
 * verdict it has without schemas (HUB_V_QUARANTINED_INVALID, field data,
 * in err); a record that passed, the version in schema_version.
 */
int ingest_schema_start(struct ingest_batch *b);

/* The step is over (ingest_batch.c): quarantined records are refused, the
 * batch goes on. */
void ingest_batch_schema_done(struct ingest_batch *b);

/* ------------------------------------------------ records (ingest.c) -- */

/*
 * Parses r's Kafka record (r->msg) under lim into r->ev / r->err and sets
 * r->ok.  Returns 0, or HUB_ENOMEM when memory ran out (reading the headers
 * or in the parser): r->ok is then 0, r->ev empty and r->err.reason
 * HUB_ENVELOPE_NOMEM; the record is not refused, only not parsed yet.
 */
int ingest_rec_parse_kafka(struct hub_ingest_rec *r, const struct hub_envelope_limits *lim);

/* The bytes of a Kafka record's headers (names and values; msg is an
 * rd_kafka_message_t), and in *n (may be NULL) how many there are: what a
 * record holds beyond its value. */
size_t hub_ingest_msg_header_bytes(const void *msg, size_t *n);

/* Where r was read: its topic, partition and offset, or topic NULL for an
 * HTTP record.  The topic is borrowed from the record. */
void ingest_rec_pos(const struct hub_ingest_rec *r, struct hub_store_kafka_pos *pos);

/* Strings made for a record's quarantine row; ingest_evidence_free()
 * frees them once the row is added. */
struct ingest_evidence {
    char *owned[4];
};

/*
 * Fills the evidence members of row ($4..$11: tenant, source, id, position,
 * headers, value) for record r: the event's own key when r->ok (a digest
 * conflict), else what the record claimed.  row borrows from r and from
 * *ev until ingest_evidence_free(ev).
 */
void ingest_rec_evidence(const struct hub_ingest_rec *r, struct hub_store_quarantine_row *row,
                         struct ingest_evidence *ev);
void ingest_evidence_free(struct ingest_evidence *ev);

#endif
