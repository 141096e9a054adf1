/*
 * ingest — reads CloudEvents from Kafka and decides their verdicts (SPEC §3),
 * and stores the events of HTTP ingest requests the same way (SPEC §4).
 *
 * Its parts (ingest_batch.h draws how a batch goes from one to the next):
 *   ingest_kafka.c  the consumer: hub_ingest_start/stop and the figures;
 *   ingest_http.c   the HTTP ingest queue: hub_ingest_store and
 *                   hub_ingest_queue_release;
 *   ingest_batch.c  the batch writer both share (SQL in store_ingest.h);
 *   ingest.c        the records: hub_ingest_headers_evidence and what is
 *                   read from a Kafka record.
 *
 * A librdkafka consumer in a consumer group, served on the hub's loop: the
 * consumer queue signals a pipe that a uv_poll_t watches, so records are
 * taken on the loop thread and nothing here needs a lock.
 *
 * Records are grouped per partition.  Each partition has at most one batch
 * in flight to PostgreSQL (one transaction); its offset is committed only
 * after that transaction committed.  Records that arrive meanwhile wait in
 * the partition's pending list and form the next batch; a partition with too
 * much pending work, or whose batch keeps failing, is paused so memory stays
 * bounded while the other partitions go on.
 */
#ifndef HUB_INGEST_H
#define HUB_INGEST_H

#include <stddef.h>
#include <stdint.h>

#include "envelope.h"
#include "metrics.h"
#include "pg.h"

struct hub;
struct hub_ingest;

/*
 * Creates the consumer for hub->brokers / hub->cfg and subscribes it.
 * Returns 0 and stores *out, or (logged) HUB_ENOMEM, HUB_EKAFKA (librdkafka
 * refused the configuration), HUB_EINVAL (STREAMING_HUB_KAFKA_TOPICS empty
 * or refused) or HUB_EIO (no wake-up pipe).  Borrows hub until freed.
 */
int hub_ingest_start(struct hub *hub, struct hub_ingest **out);

/*
 * Stops taking records, lets in-flight batches finish (their offsets are
 * committed), then leaves the group and frees everything.  done_cb runs on
 * the loop once that is complete.
 */
void hub_ingest_stop(struct hub_ingest *ing, void (*done_cb)(void *arg), void *arg);

/*
 * Readiness of the consumer (SPEC §9 /readyz): 1 once it joined its group
 * (an assignment, even empty, arrived; or no topic matches yet), for as
 * long as it has not been without a broker connection or its group
 * membership for STREAMING_HUB_READY_KAFKA_WINDOW; it becomes 1 again by
 * itself once both are back.  A member without partitions (more members
 * than partitions) is ready.  Else 0 with *why naming what is missing.
 */
int hub_ingest_ready(const struct hub_ingest *ing, const char **why);

/* 1 while the consumer has a broker connection and its membership now
 * (the streaming_hub_kafka_healthy gauge). */
int hub_ingest_healthy(const struct hub_ingest *ing);

/* Figures for gauges. */
int hub_ingest_assigned(const struct hub_ingest *ing);
int hub_ingest_paused(const struct hub_ingest *ing);
long hub_ingest_pending(const struct hub_ingest *ing);

/* ------------------------------------------------- HTTP ingest (SPEC §4) -- */

/*
 * One record to store: a Kafka record (internal) or one event of an HTTP
 * ingest request.  An HTTP caller fills the members up to `verdict`, hands
 * an array of them to hub_ingest_store(), and reads verdict, seq and err
 * back in its callback.  The same statements, dedup and verdicts serve both
 * paths.
 */
struct hub_ingest_rec {
    int ok;                        /* ev holds a valid event */
    struct hub_event ev;           /* when ok; the caller releases it (hub_event_free) */
    struct hub_envelope_error err; /* when !ok, or once the payload failed its JSON check */
    /* Quarantine evidence of an HTTP record (borrowed until the callback):
     * the record as received, a JSON array of its headers (NULL: none), and
     * the tenant, source and id it claimed (NULL when unknown). */
    const void *value;
    size_t value_len;
    const char *headers_json;
    const char *claimed_tenant;
    const char *claimed_source;
    const char *claimed_id;
    /* results */
    enum hub_verdict verdict; /* when !unsettled */
    int64_t seq;              /* accepted: its arrival sequence */
    int unsettled;            /* 1: no verdict: the transaction that was to write this record
                               * failed, nothing of it is stored (answer 503; a retry is safe) */
    /* private (ingest's own; an HTTP caller need not set them) */
    void *msg;           /* the Kafka record (rd_kafka_message_t), NULL for HTTP */
    int first;           /* index of the earlier record with the same key, or -1 */
    char old_digest[65]; /* hex digest stored under the key, "" if none */
    unsigned char state; /* where the batch writer is with it (ingest_batch.c) */
    unsigned char sent;  /* carried by the batch's outstanding transaction */
    /* the schema step (ingest_schema.c, SPEC §3.5) */
    unsigned char schema_want; /* valid and not written yet: the step looks at it */
    char schema_version[32];   /* the registered version it passed, "" if none */
    char *schema_evidence;     /* quarantined by the step: the evidence (JSON text,
                                * owned; freed with ingest_rec_schema_free) */
};

/* Frees what the schema step attached to r (its evidence); safe twice. */
void ingest_rec_schema_free(struct hub_ingest_rec *r);

/* Completion of hub_ingest_store.  failure is NULL when at least one record
 * of the request is settled: every record then has its verdict (stored,
 * counted, jobs committed) or is marked unsettled (nothing of it stored).
 * failure is non-NULL when none is: it is the outcome (status, error,
 * sqlstate; no results) of the transaction that failed, and nothing of the
 * request is stored. */
typedef void (*hub_ingest_store_cb)(void *arg, const struct hub_pg_outcome *failure);

/*
 * Stores recs[0..n) (n >= 1) on the ingest pool (the API pool in the
 * delivery role): quarantine rows for refused records, events and their
 * delivery jobs for accepted ones, exactly as a Kafka partition batch, in
 * transactions shared with the other requests that arrived meanwhile.  Each
 * record's result says what happened to it alone: a later transaction of
 * the group that fails (a digest conflict's quarantine row, a key raced by
 * another hub) leaves what the earlier ones stored stored, and only the
 * records it carried unsettled.  A record the API's parser gave up on for
 * lack of memory (HUB_ENVELOPE_NOMEM) comes back unsettled.  Counts the
 * verdicts in the ingest metrics.  Borrows recs until cb (the caller must
 * not touch them meanwhile), which runs exactly once, possibly before this
 * returns.
 */
void hub_ingest_store(struct hub *hub, struct hub_ingest_rec *recs, size_t n,
                      hub_ingest_store_cb cb, void *arg);

/* At shutdown: the queue of HTTP ingest requests is freed once its
 * transactions have finished (or failed as the pools close). */
void hub_ingest_queue_release(struct hub *hub);

/* Bytes of the records (as received) of the HTTP ingest requests waiting
 * or being stored: what their callers hold in memory for them. */
size_t hub_ingest_queue_bytes(const struct hub *hub);

/* HTTP ingest requests waiting for a transaction (a gauge). */
size_t hub_ingest_queue_waiting(const struct hub *hub);

/* 1 when no HTTP ingest request is waiting or being stored (the drain). */
int hub_ingest_queue_idle(const struct hub *hub);

/* What an event's headers may hold, over HTTP (its ce-*, content-type and
 * trace headers: 431) and Kafka (all the record's headers: quarantined
 * too_large, field "headers", their evidence left out): each is copied
 * into the event's quarantine evidence and parsed on the loop, and a
 * record's headers are outside every byte budget that counts its value. */
#define HUB_EVENT_HEADERS_MAX 256
#define HUB_EVENT_HEADER_BYTES_MAX (64 * 1024)

/* JSON evidence of a record's headers for the quarantine table: an array of
 * {"name","value"}; a name or value that is not UTF-8 text is kept as
 * "name_b64"/"value_b64".  Returns malloc'd text, or NULL on OOM. */
char *hub_ingest_headers_evidence(const struct hub_header *h, size_t n);

#endif
