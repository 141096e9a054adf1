/*
 * ingest_kafka — the Kafka consumer (see ingest.h): partitions, their
 * pending records and batches, backpressure, offset commits, and the
 * loop's wake-up.
 *
 * Everything runs on the hub's loop: librdkafka's consumer queue writes to
 * a pipe when it gets records, a uv_poll_t on the pipe wakes ingest_drain(),
 * which takes them into their partitions' pending lists.  Partitions with
 * pending records put them in a carrier, one transaction's worth, once the
 * ingest pool has a connection for it (ingest_start, carrier_make): a
 * batch of each partition that may start, taken in turn.  A partition has
 * up to STREAMING_HUB_INGEST_PARTITION_BATCHES batches in flight (default
 * 1); with more than one, a carrier holds one partition's batch, and their
 * write transactions go in offset order on the partition's lane (pg.h),
 * one connection, each running only if the one before committed, so
 * records are stored in partition order (SPEC §3.4) and a key repeated in
 * two batches is seen by the second as a duplicate.  The batch writer
 * (ingest_batch.c) reports back through carrier_owner, and each partition
 * commits the offset past its batch once it and every earlier batch of the
 * partition are stored (part_commit).  A carrier that failed is retried
 * whole: the partitions' batches behind it wait, and none of its
 * partitions starts a new one, until it is stored (carrier_may_write,
 * part_may_start).
 *
 * Who owns a record: librdkafka until ingest_take(), then its partition's
 * pending list, then the carrier, which destroys it once the carrier is
 * stored or dropped (a revoked partition's records are dropped: the next owner
 * reads them again from the committed offset).
 */
#include "ingest.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "fault.h"
#include "hub.h"
#include "ingest_batch.h"
#include "kafka.h"
#include "log.h"
#include "schema_registry.h"
#include "util.h"

/* Records taken per loop turn.  Also how far one turn can overshoot the
 * pending budget below: 8192 let the hub hold 15-20k records (and the
 * fetch buffers they pin) over 64 partitions; 1024 holds 10-12k. */
#define INGEST_POLL_BUDGET 1024
/* Stop taking records from librdkafka's queue above this much pending in
 * partitions (not yet in a batch): the queue is the buffer (see its bound
 * in hub_ingest_start). */
#define INGEST_PENDING_BYTES (4 << 20)
/* How long a partition waits for the record of its hole before asking for
 * it again (part_seek_hole). */
#define INGEST_HOLE_SEEK_NS (1000 * 1000 * 1000ULL)
/* librdkafka's statistics interval: how soon readiness learns that the
 * brokers or the group are gone (or back). */
#define INGEST_STATS_MS "1000"
/* How soon a batch held back behind an earlier batch of its partition (a
 * retry, or a write whose turn has not come) asks again. */
#define INGEST_RETRY_WAIT_MS 20
/* A partition's next batch starts before the previous one is stored only
 * while fewer records than this are pending: a partition that keeps up
 * sends its few records at once (latency), one that fell behind waits and
 * sends them in one big batch (throughput: a batch this big is planned for
 * its arrays, which costs a few ms per transaction, store_ingest.c). */
#define INGEST_PIPELINE_ROWS 16

struct ingest_carrier;

/* A partition's batch: bookkeeping for the commit, in the partition's
 * list.  Its records are in its carrier, which writes them (below). */
struct part_batch {
    struct ingest_part *p;
    struct ingest_carrier *carrier; /* NULL once that is stored or dropped */
    size_t n;                       /* records */
    int64_t first_offset, last_offset;
    int stored;    /* stored, its offset not yet committed */
    int no_commit; /* an earlier batch was dropped unstored */
    int attempts;  /* its carrier's failed tries so far (part_backpressure) */
    struct part_batch *next;
};

/* One topic partition this consumer was assigned at some point.  Kept
 * after a revocation (assigned 0) until the consumer stops: its batch in
 * flight may still finish, and the partition may come back. */
struct ingest_part {
    struct hub_ingest *ing;
    char *topic;
    int32_t partition;
    int assigned;                 /* ours now: records are taken and offsets committed */
    int paused;                   /* fetching paused (part_backpressure) */
    rd_kafka_message_t **pending; /* taken, not yet in a batch; owned */
    size_t n_pending;
    size_t cap_pending;
    size_t pending_bytes;
    /* batches in flight, oldest first: offsets are committed from the
     * oldest on (part_commit) */
    struct part_batch *first, *last;
    int n_batches;
    struct hub_pg_lane lane; /* their write transactions, in order */
    /* A record that could not be taken (out of memory) leaves a hole at its
     * offset: later records are dropped until the partition, sought back to
     * the hole, delivers it again, so no offset is committed past it. */
    int64_t hole; /* the offset to read again, or -1 */
    /* The offset after the last record taken since the partition was
     * assigned, -1 before the first: where consumption started and any
     * gap in the offsets are logged (ingest_note_offset). */
    int64_t next_offset;
    int64_t committed;     /* the last offset this consumer committed for it, -1 none */
    uint64_t hole_seek_ns; /* when the seek to it was last asked for */
    struct ingest_part *next;
};

/* The consumer.  Freed by ingest_finish_stop once stopping, with no batch
 * in flight and every handle closed. */
struct hub_ingest {
    struct hub *hub;
    rd_kafka_t *rk;
    rd_kafka_queue_t *queue; /* the consumer queue (records, errors, rebalances) */
    int pipe_fds[2];         /* librdkafka writes [1] when its queue gets records */
    uv_poll_t wake;          /* on pipe_fds[0] */
    uv_timer_t tick;         /* drains every 100 ms even without a wake-up */
    uv_idle_t more;          /* keeps draining when a turn's budget ran out */
    struct ingest_part *parts;
    /* readiness (SPEC §9 /readyz, hub_ingest_ready) */
    int ready;                  /* joined the group once (an assignment, even empty) */
    int healthy;                /* broker connection and group membership, last we heard */
    uint64_t unhealthy_since;   /* hub_now_ns() when healthy last turned 0; 0 while healthy */
    const char *unhealthy_why;  /* what is missing (static text) */
    int no_topics;              /* subscribed, and no topic matches yet: no group to join */
    int stopping;               /* hub_ingest_stop ran: no new batches, no retries */
    int open_handles;           /* handles not yet closed: wake, tick, more, carrier timers */
    int batches_inflight;       /* batches not yet released, over every partition */
    size_t pending_bytes;       /* over every partition */
    void (*done_cb)(void *arg); /* hub_ingest_stop's */
    void *done_arg;
    size_t batch_max; /* records per batch (STREAMING_HUB_INGEST_BATCH_MAX) */
    int batches_max;  /* in flight per partition (STREAMING_HUB_INGEST_PARTITION_BATCHES) */
    size_t conns;     /* the ingest pool's connections (STREAMING_HUB_INGEST_PG_CONNECTIONS) */
    size_t writing;   /* carriers with the writer: started or submitted, not yet reported */
    struct ingest_part *turn;        /* the partition that started a batch last (carrier_make) */
    struct ingest_carrier *carriers; /* not yet stored or dropped */
};

static void ingest_drain(struct hub_ingest *ing);
static void ingest_more_cb(uv_idle_t *h);
static void ingest_start(struct hub_ingest *ing);
static void ingest_finish_stop(struct hub_ingest *ing);

/* ------------------------------------------------------------ partitions -- */

/* The partition (topic, partition), made when create and not known yet.
 * NULL when unknown (or on OOM). */
static struct ingest_part *part_find(struct hub_ingest *ing, const char *topic, int32_t partition,
                                     int create) {
    for (struct ingest_part *p = ing->parts; p != NULL; p = p->next) {
        if (p->partition == partition && strcmp(p->topic, topic) == 0) {
            return p;
        }
    }
    if (!create) {
        return NULL;
    }
    struct ingest_part *p = calloc(1, sizeof(*p));
    if (p == NULL || (p->topic = strdup(topic)) == NULL) {
        free(p);
        return NULL;
    }
    p->ing = ing;
    p->partition = partition;
    p->hole = -1;
    p->next_offset = -1;
    p->committed = -1;
    p->next = ing->parts;
    ing->parts = p;
    return p;
}

/* Pauses or resumes fetching for an assigned partition. */
static void part_set_paused(struct ingest_part *p, int paused) {
    rd_kafka_topic_partition_list_t *l;

    if (p->paused == paused || !p->assigned) {
        return;
    }
    l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, p->topic, p->partition);
    if (paused) {
        rd_kafka_pause_partitions(p->ing->rk, l);
    } else {
        rd_kafka_resume_partitions(p->ing->rk, l);
    }
    rd_kafka_topic_partition_list_destroy(l);
    p->paused = paused;
}

/* Destroys the partition's pending records (not in a batch yet). */
static void part_drop_pending(struct ingest_part *p) {
    for (size_t i = 0; i < p->n_pending; i++) {
        rd_kafka_message_destroy(p->pending[i]);
    }
    p->ing->pending_bytes -= p->pending_bytes;
    p->n_pending = 0;
    p->pending_bytes = 0;
}

/* Appends m to the pending list, which takes it.  Returns 0, or HUB_ENOMEM
 * (m is then still the caller's). */
/* What a record holds: its value, key and headers (a record of a few
 * bytes may carry a megabyte of either, which a budget of values never
 * saw). */
static size_t msg_bytes(const rd_kafka_message_t *m) {
    return m->len + m->key_len + hub_ingest_msg_header_bytes(m, NULL);
}

static int part_push(struct ingest_part *p, rd_kafka_message_t *m) {
    if (p->n_pending == p->cap_pending) {
        size_t cap = p->cap_pending ? p->cap_pending * 2 : 256;
        rd_kafka_message_t **a = realloc(p->pending, sizeof(*a) * cap);
        if (a == NULL) {
            return HUB_ENOMEM;
        }
        p->pending = a;
        p->cap_pending = cap;
    }
    size_t bytes = msg_bytes(m);

    p->pending[p->n_pending++] = m;
    p->pending_bytes += bytes;
    p->ing->pending_bytes += bytes;
    return 0;
}

/*
 * A partition whose batch keeps failing stops fetching, so that it does not
 * pile up records while the others go on; it resumes once its batch is stored.
 *
 * Backpressure for speed is global instead (ingest_drain stops taking records
 * above INGEST_PENDING_BYTES, and librdkafka's bounded queue then stops the
 * fetcher): pausing partitions for that costs librdkafka a fetch back-off of
 * up to a second on every resume (what bench/ingest showed: docs/performance.md,
 * "Notes moved out of the ingest code (issue 22)").
 */
static void part_backpressure(struct ingest_part *p) {
    int failing = 0;
    for (const struct part_batch *b = p->first; b != NULL; b = b->next) {
        failing |= b->attempts > 0;
    }
    part_set_paused(p, failing);
}

/* ------------------------------------------------------- their batches -- */

/*
 * A partition's batch (struct part_batch) is bookkeeping for the commit:
 * how many records, from which offset to which.  The records are in its
 * carrier, the batch the writer writes in one transaction: the batches of
 * several partitions, one each (with one batch per partition in flight,
 * the default), or a single partition's (with several in flight: their
 * writes go in order on its lane).  The carrier owns the records and is
 * freed once it is stored or dropped; its partitions' batches stay in
 * their lists until their offsets are committed.
 */
struct ingest_carrier {
    struct ingest_batch w; /* what the writer writes; w.owner_arg is the carrier */
    struct hub_ingest *ing;
    struct part_batch **members; /* the partitions' batches, in the order of the records */
    size_t n_members;
    struct ingest_carrier *next; /* ing->carriers */
};

/* Detaches the batch from its partition and frees it.  Its records not
 * committed are read again by the partition's next owner, or by this one
 * after a restart; a batch released unstored keeps every later batch of
 * the partition from committing (no_commit), since committing past them
 * would skip its records. */
static void batch_release(struct part_batch *b) {
    struct ingest_part *p = b->p;
    struct part_batch **at = &p->first, *prev = NULL;

    while (*at != b) {
        prev = *at;
        at = &(*at)->next;
    }
    *at = b->next;
    if (p->last == b) {
        p->last = prev;
    }
    if (!b->stored) {
        for (struct part_batch *l = b->next; l != NULL; l = l->next) {
            l->no_commit = 1;
        }
    }
    p->n_batches--;
    p->ing->batches_inflight--;
    free(b);
}

/* Commits next_offset for p: asynchronously, but synchronously while
 * stopping.  A failure is counted and logged; the records after the last
 * committed offset are then read again by the partition's next owner. */
static void commit_offset(struct hub_ingest *ing, struct ingest_part *p, int64_t next_offset) {
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_resp_err_t err;

    rd_kafka_topic_partition_list_add(l, p->topic, p->partition)->offset = next_offset;
    /* While stopping, commit synchronously: the process is about to leave. */
    err = rd_kafka_commit(ing->rk, l, ing->stopping ? 0 : 1);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        ing->hub->metrics.ingest_commit_failures++;
        hub_log(HUB_WARN, "offset commit failed", HUB_LS("topic", p->topic),
                HUB_LI("partition", p->partition), HUB_LI("offset", next_offset),
                HUB_LS("error", rd_kafka_err2str(err)));
    }
    rd_kafka_topic_partition_list_destroy(l);
}

/* Commits past the partition's oldest batches that are stored, in offset
 * order (once, past the last of them), and frees them.  A stored batch
 * behind one still in flight waits here. */
static void part_commit(struct ingest_part *p) {
    int64_t next_offset = -1;

    while (p->first != NULL && p->first->stored) {
        struct part_batch *b = p->first;
        if (!b->no_commit) {
            next_offset = b->last_offset + 1;
        }
        batch_release(b);
    }
    if (next_offset >= 0 && p->assigned) {
        p->committed = next_offset;
        commit_offset(p->ing, p, next_offset);
    }
}

/* 1 when every batch of p before `b` (NULL: all of them) is stored or has
 * a write transaction of its carrier's first try on the lane: then b's
 * write goes behind theirs, and runs only if they commit. */
static int part_may_write_before(const struct ingest_part *p, const struct part_batch *b) {
    for (const struct part_batch *e = p->first; e != NULL && e != b; e = e->next) {
        const struct ingest_batch *w = e->carrier != NULL ? &e->carrier->w : NULL;
        if (!e->stored && !(w != NULL && w->in_write && w->attempts == 0)) {
            return 0;
        }
    }
    return 1;
}

/* A carrier with room for n records of `parts` partitions, or NULL when
 * out of memory. */
static struct ingest_carrier *carrier_new(struct hub_ingest *ing, size_t n, size_t parts) {
    struct ingest_carrier *c = calloc(1, sizeof(*c));

    if (c != NULL && ((c->w.recs = calloc(n, sizeof(*c->w.recs))) == NULL ||
                      (c->members = calloc(parts, sizeof(*c->members))) == NULL)) {
        free(c->w.recs);
        free(c);
        return NULL;
    }
    if (c != NULL) {
        c->ing = ing;
    }
    return c;
}

/* Frees a carrier's arrays and itself (its records are freed or moved). */
static void carrier_discard(struct ingest_carrier *c) {
    free(c->w.recs);
    free(c->members);
    free(c);
}

/* A carrier's timer closed: free its records (events and Kafka messages)
 * and itself. */
static void carrier_closed(uv_handle_t *h) {
    struct ingest_carrier *c = h->data;
    struct hub_ingest *ing = c->ing;

    for (size_t i = 0; i < c->w.n; i++) {
        hub_event_free(&c->w.recs[i].ev);
        ingest_rec_schema_free(&c->w.recs[i]);
        rd_kafka_message_destroy(c->w.recs[i].msg);
    }
    carrier_discard(c);
    if (--ing->open_handles == 0 && ing->stopping && ing->batches_inflight == 0) {
        ingest_finish_stop(ing);
    }
}

/* Unlinks c and frees it once its timer closed (its partitions' batches
 * are released, or no longer point at it). */
static void carrier_free(struct ingest_carrier *c) {
    struct hub_ingest *ing = c->ing;
    struct ingest_carrier **at = &ing->carriers;

    while (*at != c) {
        at = &(*at)->next;
    }
    *at = c->next;
    ing->open_handles++;
    uv_close((uv_handle_t *)&c->w.retry, carrier_closed);
}

/* Drops c unstored: each partition's batch is released (the partition's
 * next owner, or this one after a restart, reads its records again) and
 * what was stored before it is committed. */
static void carrier_release(struct ingest_carrier *c) {
    for (size_t i = 0; i < c->n_members; i++) {
        struct ingest_part *p = c->members[i]->p;
        batch_release(c->members[i]);
        part_commit(p);
    }
    carrier_free(c);
}

/* The batch writer's report: everything of the carrier is durable.  Each
 * partition commits past its batch once every earlier batch of it is
 * stored too (if the partition is still ours), and moves on. */
static void carrier_stored(struct ingest_batch *w) {
    struct ingest_carrier *c = w->owner_arg;
    struct hub_ingest *ing = c->ing;

    ing->writing--;
    for (size_t i = 0; i < c->n_members; i++) {
        c->members[i]->stored = 1;
        c->members[i]->attempts = 0;
        c->members[i]->carrier = NULL; /* c goes below; a batch may wait on for an earlier one */
    }
    for (size_t i = 0; i < c->n_members; i++) {
        struct ingest_part *p = c->members[i]->p;
        part_commit(p);
        part_backpressure(p);
    }
    carrier_free(c);
    ingest_start(ing); /* a connection is free */
}

/* The writer asks before each write transaction of a carrier
 * (ingest_batch.h): each of its partitions' earlier batches must be on the
 * lane or stored. */
static int carrier_may_write(struct ingest_batch *w) {
    const struct ingest_carrier *c = w->owner_arg;

    for (size_t i = 0; i < c->n_members; i++) {
        if (!part_may_write_before(c->members[i]->p, c->members[i])) {
            return 0;
        }
    }
    return 1;
}

static const struct ingest_batch_owner carrier_owner;
static void carrier_retry_cb(uv_timer_t *t);

/* Readies c, filled with its members and their records, for the writer
 * and links it into the consumer's list. */
static void carrier_open(struct ingest_carrier *c) {
    struct hub_ingest *ing = c->ing;

    c->w.hub = ing->hub;
    c->w.pg = ing->hub->pg_ingest;
    /* one partition's batches, several in flight, go in order on its lane;
     * one batch per partition needs none: the writes skip the mark */
    c->w.lane = ing->batches_max > 1 ? &c->members[0]->p->lane : NULL;
    c->w.owner = &carrier_owner;
    c->w.owner_arg = c;
    c->w.started_ns = hub_now_ns();
    uv_timer_init(ing->hub->loop, &c->w.retry);
    c->w.retry.data = c;
    c->next = ing->carriers;
    ing->carriers = c;
}

/*
 * Splits a carrier of several partitions that failed into one carrier per
 * partition, each retried alone after delay_ms: a record that fails every
 * transaction it is in (a poisoned partition, SPEC §3.3) then holds back
 * only its own partition.  The records move with what the writer knows of
 * them (settled or not); in-batch repeats are marked again in each.
 * Returns 0, or HUB_ENOMEM (nothing changed: c is retried whole).
 */
static int carrier_split(struct ingest_carrier *c, uint64_t delay_ms) {
    struct hub_ingest *ing = c->ing;
    struct ingest_carrier **parts = calloc(c->n_members, sizeof(*parts));
    size_t at = 0;

    if (parts == NULL) {
        return HUB_ENOMEM;
    }
    for (size_t i = 0; i < c->n_members; i++) {
        if ((parts[i] = carrier_new(ing, c->members[i]->n, 1)) == NULL) {
            for (size_t k = 0; k < i; k++) {
                carrier_discard(parts[k]);
            }
            free(parts);
            return HUB_ENOMEM;
        }
    }
    for (size_t i = 0; i < c->n_members; i++) {
        struct ingest_carrier *solo = parts[i];
        struct part_batch *b = c->members[i];

        memcpy(solo->w.recs, c->w.recs + at, sizeof(*solo->w.recs) * b->n);
        at += b->n;
        solo->w.n = b->n;
        solo->w.attempts = c->w.attempts; /* the backoff goes on growing */
        solo->w.schema_done = c->w.schema_done;
        solo->members[0] = b;
        solo->n_members = 1;
        b->carrier = solo;
        carrier_open(solo);
        uv_timer_start(&solo->w.retry, carrier_retry_cb, delay_ms, 0);
    }
    free(parts);
    c->w.n = 0; /* the records moved */
    c->n_members = 0;
    carrier_free(c);
    return 0;
}

/* The backoff of a failed carrier ended: submit it again, unless none of
 * its partitions is ours any more or the consumer is stopping.  (A carrier
 * that still has one of them writes the others' records too: stored twice
 * they are duplicates, and their offsets are not committed here.) */
static void carrier_retry_cb(uv_timer_t *t) {
    struct ingest_carrier *c = t->data;
    struct hub_ingest *ing = c->ing;
    int ours = 0;

    for (size_t i = 0; i < c->n_members; i++) {
        ours |= c->members[i]->p->assigned;
    }
    if (!ours || ing->stopping) {
        /* the next owners replay from the committed offsets, which never
         * moved past these batches */
        carrier_release(c);
        if (ing->stopping && ing->batches_inflight == 0) {
            ingest_finish_stop(ing);
        }
        return;
    }
    if (!carrier_may_write(&c->w)) {
        /* an earlier batch of a partition is not stored yet: a retry goes
         * alone, in order */
        uv_timer_start(&c->w.retry, carrier_retry_cb, INGEST_RETRY_WAIT_MS, 0);
        return;
    }
    ing->writing++;
    ingest_batch_submit(&c->w);
}

/* The batch writer's report: a transaction failed.  The partitions keep
 * their batches and the carrier tries again after a backoff, each of them
 * paused meanwhile; the offsets stay where they are, so nothing is lost if
 * a partition moves. */
static void carrier_failed(struct ingest_batch *w, const struct hub_pg_outcome *out) {
    struct ingest_carrier *c = w->owner_arg;
    struct hub_ingest *ing = c->ing;
    const struct part_batch *first = c->members[0];
    const struct ingest_part *p0 = first->p;
    const char *error = out->error != NULL ? out->error : "transaction failed";
    const char *sqlstate = out->sqlstate != NULL ? out->sqlstate : "";
    int held = out == &ingest_outcome_held;
    uint64_t delay = held ? INGEST_RETRY_WAIT_MS : ingest_batch_backoff_ms(w);

    ing->writing--;

    /* Log the first failure and then every tenth, not a line per retry (a
     * carrier held back behind an earlier batch did not fail: not logged). */
    if (!held && (w->attempts == 1 || w->attempts % 10 == 0)) {
        hub_log(HUB_WARN, "partition batch not stored, retrying", HUB_LS("topic", p0->topic),
                HUB_LI("partition", p0->partition), HUB_LI("offset", first->first_offset),
                HUB_LI("records", w->n), HUB_LI("partitions", c->n_members),
                HUB_LI("attempt", w->attempts), HUB_LS("sqlstate", sqlstate),
                HUB_LS("error", error));
    }
    for (size_t i = 0; i < c->n_members; i++) {
        c->members[i]->attempts = w->attempts;
        part_backpressure(c->members[i]->p);
    }
    if (ing->stopping) {
        carrier_release(c);
        if (ing->batches_inflight == 0) {
            ingest_finish_stop(ing);
        }
        return;
    }
    if (held || c->n_members == 1 || carrier_split(c, delay) != 0) {
        uv_timer_start(&w->retry, carrier_retry_cb, delay, 0);
    }
}

/* How the batch writer reports to a carrier (ingest_batch.h). */
static const struct ingest_batch_owner carrier_owner = {carrier_stored, carrier_failed,
                                                        carrier_may_write};

/* 1 when p may put a batch in a carrier now: it has pending records (fewer
 * than INGEST_PIPELINE_ROWS if a batch is in flight), fewer than
 * batches_max in flight, and every batch in flight stored or in a
 * first-try write (none failing: a retry goes alone). */
static int part_may_start(const struct ingest_part *p) {
    const struct hub_ingest *ing = p->ing;

    return p->n_batches < ing->batches_max && p->n_pending > 0 && !ing->stopping &&
           part_may_write_before(p, NULL) &&
           !(p->n_batches > 0 && p->n_pending >= INGEST_PIPELINE_ROWS);
}

/* Moves p's n oldest pending records to the end of carrier c, as a new
 * batch of p at the end of its list.  Returns 0, or HUB_ENOMEM (nothing
 * moved). */
static int part_batch_add(struct ingest_part *p, struct ingest_carrier *c, size_t n) {
    struct hub_ingest *ing = p->ing;
    struct part_batch *b = calloc(1, sizeof(*b));

    if (b == NULL) {
        return HUB_ENOMEM;
    }
    b->p = p;
    b->n = n;
    b->carrier = c;
    b->first_offset = p->pending[0]->offset;
    b->last_offset = p->pending[n - 1]->offset;
    for (size_t i = 0; i < n; i++) {
        size_t bytes = msg_bytes(p->pending[i]);

        c->w.recs[c->w.n + i].msg = p->pending[i];
        p->pending_bytes -= bytes;
        ing->pending_bytes -= bytes;
    }
    memmove(p->pending, p->pending + n, sizeof(*p->pending) * (p->n_pending - n));
    p->n_pending -= n;
    c->w.n += n;
    c->members[c->n_members++] = b;
    if (p->last != NULL) {
        p->last->next = b;
    } else {
        p->first = b;
    }
    p->last = b;
    p->n_batches++;
    ing->batches_inflight++;
    return 0;
}

/* The partition after p in the turn (the first after the last). */
static struct ingest_part *part_after(const struct hub_ingest *ing, const struct ingest_part *p) {
    return p != NULL && p->next != NULL ? p->next : ing->parts;
}

/*
 * A carrier of the records the partitions may start now, taken in turn
 * from the one after the last that started, up to batch_max records: with
 * one batch per partition in flight, of as many partitions as have
 * records; with several, of one partition.  NULL when no partition may
 * start, or while two carriers or more are being written and fewer than
 * INGEST_PIPELINE_ROWS records wait (the commit of one in flight starts
 * the next, with everything that arrived meanwhile), or out of memory
 * (the next tick tries again).
 */
static struct ingest_carrier *carrier_make(struct hub_ingest *ing) {
    int one = ing->batches_max > 1; /* one partition per carrier */
    struct ingest_part *from = part_after(ing, ing->turn), *p = from;
    size_t want = 0, parts = 0;
    struct ingest_carrier *c;

    if (p == NULL) {
        return NULL;
    }
    do {
        if (part_may_start(p)) {
            want += p->n_pending;
            parts++;
        }
        p = part_after(ing, p);
    } while (p != from && !(one && parts > 0));
    if (want > ing->batch_max) {
        want = ing->batch_max;
    }
    if (want == 0 || (!one && ing->writing >= 2 && want < INGEST_PIPELINE_ROWS)) {
        return NULL;
    }
    if ((c = carrier_new(ing, want, parts)) == NULL) {
        return NULL;
    }
    p = from;
    do {
        if (part_may_start(p)) {
            size_t left = want - c->w.n;
            if (part_batch_add(p, c, p->n_pending < left ? p->n_pending : left) != 0) {
                break;
            }
            ing->turn = p;
        }
        p = part_after(ing, p);
    } while (p != from && c->w.n < want && c->n_members < parts);
    if (c->n_members == 0) {
        carrier_discard(c);
        return NULL;
    }
    carrier_open(c);
    return c;
}

/*
 * Starts the carriers the ingest pool has connections for.  A carrier is
 * made only while fewer are being written than the pool has connections:
 * made earlier, it waited in the pool's queue with the records it had,
 * while the ones that arrived meanwhile waited for its commit to form the
 * next.  Made late, it takes everything its partitions have by then; and
 * one carrier takes every partition's records, where a batch per
 * partition stored a stream over many partitions in many small
 * transactions (a commit and a statement's start-up each: docs/
 * performance.md, "Several partitions in one transaction").  Only Kafka's
 * own carriers count: HTTP ingest groups on the same pool cannot hold the
 * partitions back, and a carrier waiting out a retry's backoff holds no
 * place (its retry goes at once, counted again).
 */
static void ingest_start(struct hub_ingest *ing) {
    struct ingest_carrier *c;

    while (ing->writing < ing->conns && (c = carrier_make(ing)) != NULL) {
        ing->writing++;
        ingest_batch_start(&c->w);
    }
}

/* ------------------------------------------------------------ readiness -- */

/*
 * What librdkafka last told about the consumer's health: a connection to
 * some broker and a steady membership of its group.  Statistics (every
 * INGEST_STATS_MS) say both, and so recovery too; the error callback's
 * ALL_BROKERS_DOWN and the rebalance callback say it sooner.  why is
 * static text naming what is missing.
 */
static void health_set(struct hub_ingest *ing, int healthy, const char *why) {
    if (healthy) {
        if (!ing->healthy && ing->ready && ing->unhealthy_since != 0) {
            hub_log(HUB_INFO, "kafka consumer connected and in its group again",
                    HUB_LI("after_ms", (int64_t)((hub_now_ns() - ing->unhealthy_since) / 1000000)));
        }
        ing->healthy = 1;
        ing->unhealthy_since = 0;
        ing->unhealthy_why = NULL;
        return;
    }
    if (ing->unhealthy_since == 0) {
        ing->unhealthy_since = hub_now_ns();
        if (ing->ready) {
            hub_log(HUB_WARN,
                    "kafka consumer lost its brokers or its group; /readyz turns 503 "
                    "if this lasts STREAMING_HUB_READY_KAFKA_WINDOW",
                    HUB_LS("why", why));
        }
    }
    ing->healthy = 0;
    ing->unhealthy_why = why;
}

/* The statistics (JSON, borrowed): "brokers" {name: {"state": "UP", ...}},
 * "cgrp" {"state": "up", "join_state": "steady", ...}.  Returns 0: librdkafka
 * frees the text. */
static int stats_cb(rd_kafka_t *rk, char *json, size_t json_len, void *opaque) {
    struct hub_ingest *ing = opaque;
    json_t *root = json_loadb(json, json_len, 0, NULL);
    json_t *brokers, *b, *cgrp;
    const char *name;
    const char *state, *join;
    int up = 0;

    (void)rk;
    if (root == NULL) {
        return 0; /* out of memory: the last state stands */
    }
    brokers = json_object_get(root, "brokers");
    json_object_foreach(brokers, name, b) {
        const char *st = json_string_value(json_object_get(b, "state"));
        up += st != NULL && strcmp(st, "UP") == 0;
    }
    cgrp = json_object_get(root, "cgrp");
    state = json_string_value(json_object_get(cgrp, "state"));
    join = json_string_value(json_object_get(cgrp, "join_state"));
    if (up == 0) {
        health_set(ing, 0, "no connection to any Kafka broker");
    } else if (state == NULL || strcmp(state, "up") != 0 || join == NULL ||
               (strcmp(join, "steady") != 0 && !(ing->no_topics && strcmp(join, "init") == 0))) {
        health_set(ing, 0, "not a member of its Kafka consumer group");
    } else {
        health_set(ing, 1, NULL);
    }
    json_decref(root);
    return 0;
}

/* ------------------------------------------------------------- consumer -- */

/* librdkafka's group rebalance (called from rd_kafka_consumer_poll, on the
 * loop): takes an assignment, or gives partitions up. */
static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque) {
    struct hub_ingest *ing = opaque;

    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        for (int i = 0; i < parts->cnt; i++) {
            struct ingest_part *p =
                part_find(ing, parts->elems[i].topic, parts->elems[i].partition, 1);
            if (p != NULL) {
                p->assigned = 1;
                p->paused = 0;
                p->next_offset = -1;
            }
        }
        rd_kafka_assign(rk, parts);
        /* librdkafka keeps a partition this process paused (part_set_paused)
         * paused through a revoke and a new assignment; it starts afresh
         * here (p->paused = 0), so it must fetch again */
        if (rd_kafka_resume_partitions(rk, parts) != RD_KAFKA_RESP_ERR_NO_ERROR) {
            hub_log(HUB_WARN, "kafka partitions not resumed after their assignment");
        }
        ing->ready = 1;
        ing->no_topics = 0;
        health_set(ing, 1, NULL); /* an assignment: a member, connected */
        hub_log(HUB_INFO, "kafka partitions assigned", HUB_LI("count", parts->cnt));
    } else {
        for (int i = 0; i < parts->cnt; i++) {
            struct ingest_part *p =
                part_find(ing, parts->elems[i].topic, parts->elems[i].partition, 0);
            if (p != NULL) {
                /* where this owner got to: what a next owner, or a crash
                 * investigation, compares with where it starts */
                hub_log(HUB_INFO, "kafka partition given up", HUB_LS("topic", p->topic),
                        HUB_LI("partition", p->partition), HUB_LI("taken_to", p->next_offset),
                        HUB_LI("committed", p->committed), HUB_LI("pending", (int64_t)p->n_pending),
                        HUB_LI("batches", p->n_batches));
                /* The next owner starts from the committed offset; what we hold
                 * and have not stored yet is simply read again there. */
                p->assigned = 0;
                p->paused = 0;
                p->hole = -1;
                part_drop_pending(p);
            }
        }
        rd_kafka_assign(rk, NULL);
        health_set(ing, 0, "not a member of its Kafka consumer group"); /* until assigned */
        hub_log(HUB_INFO, "kafka partitions revoked", HUB_LI("count", parts->cnt),
                HUB_LS("reason", rd_kafka_err2str(err)));
    }
}

/* The asynchronous commits' outcome: failures are counted and logged. */
static void commit_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                      rd_kafka_topic_partition_list_t *offsets, void *opaque) {
    struct hub_ingest *ing = opaque;
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR && err != RD_KAFKA_RESP_ERR__NO_OFFSET) {
        ing->hub->metrics.ingest_commit_failures++;
        hub_log(HUB_WARN, "offset commit failed", HUB_LS("error", rd_kafka_err2str(err)));
    }
}

/* Asks librdkafka to deliver p's records again from its hole on (async;
 * asked again by the tick if the hole's record does not come back). */
static void part_seek_hole(struct ingest_part *p) {
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_error_t *e;

    if (l == NULL) {
        return; /* the tick asks again */
    }
    rd_kafka_topic_partition_list_add(l, p->topic, p->partition)->offset = p->hole;
    e = rd_kafka_seek_partitions(p->ing->rk, l, 0);
    if (e != NULL) {
        rd_kafka_error_destroy(e);
    }
    rd_kafka_topic_partition_list_destroy(l);
    p->hole_seek_ns = hub_now_ns();
}

/* The record at offset could not be taken (out of memory): nothing after
 * it is taken either until it is read again, so the partition's committed
 * offset never passes it. */
static void part_hole(struct ingest_part *p, int64_t offset) {
    if (p->hole >= 0) {
        return;
    }
    p->hole = offset;
    p->ing->hub->metrics.ingest_kafka_refetches++;
    hub_log(HUB_WARN, "kafka record not taken (out of memory); reading the partition again from it",
            HUB_LS("topic", p->topic), HUB_LI("partition", p->partition), HUB_LI("offset", offset));
    part_seek_hole(p);
}

/* Where a partition's records come from, as the log should tell it after a
 * crash or a rebalance: the offset consumption starts at once per
 * assignment (the committed offset, or the reset one), and any offset that
 * is not the one after the last (a gap: compacted or transactional topics
 * have them; a rewind: a seek).  Which records a crash lost or replayed is
 * then read from the logs, not guessed. */
static void ingest_note_offset(struct ingest_part *p, int64_t offset) {
    if (p->next_offset < 0) {
        hub_log(HUB_INFO, "kafka partition consumption starts", HUB_LS("topic", p->topic),
                HUB_LI("partition", p->partition), HUB_LI("offset", offset));
    } else if (offset != p->next_offset) {
        hub_log(HUB_INFO, "kafka partition offsets not contiguous", HUB_LS("topic", p->topic),
                HUB_LI("partition", p->partition), HUB_LI("expected", p->next_offset),
                HUB_LI("offset", offset));
    }
    p->next_offset = offset + 1;
}

/* Takes m (owned) from the consumer queue: an error or event is handled and
 * destroyed, a record goes to its partition's pending list. */
static void ingest_take(struct hub_ingest *ing, rd_kafka_message_t *m) {
    struct ingest_part *p;

    if (m->err) {
        if (m->err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART ||
            m->err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC) {
            /* The brokers answered and no topic matches the subscription yet:
             * there is nothing to assign, which is a ready state.  A matching
             * topic created later is picked up by the metadata refresh. */
            if (!ing->ready) {
                hub_log(HUB_INFO, "no kafka topic matches the subscription yet",
                        HUB_LS("topics", ing->hub->cfg.kafka_topics));
                ing->no_topics = 1;
                health_set(ing, 1, NULL);
            }
            ing->ready = 1;
        } else if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            hub_log(HUB_WARN, "kafka consumer error", HUB_LS("error", rd_kafka_message_errstr(m)),
                    HUB_LS("topic", m->rkt ? rd_kafka_topic_name(m->rkt) : NULL),
                    HUB_LI("partition", m->partition));
        }
        rd_kafka_message_destroy(m);
        return;
    }
    {
        /* how far behind the producer we read (the record's timestamp) */
        rd_kafka_timestamp_type_t tstype;
        int64_t ts = rd_kafka_message_timestamp(m, &tstype);
        if (ts > 0) {
            struct timespec now;
            clock_gettime(CLOCK_REALTIME, &now);
            double age = (double)now.tv_sec + (double)now.tv_nsec / 1e9 - (double)ts / 1000.0;
            hub_histogram_observe(&ing->hub->metrics.ingest_record_age_seconds, age > 0 ? age : 0);
        }
    }
    p = part_find(ing, rd_kafka_topic_name(m->rkt), m->partition, 1);
    if (p == NULL || !p->assigned) {
        /* not ours (a late record of a revoked partition): the owner reads
         * it again from the committed offset */
        rd_kafka_message_destroy(m);
        return;
    }
    if (p->hole >= 0 && m->offset != p->hole) {
        /* behind a hole: read again once the seek brings the hole back */
        rd_kafka_message_destroy(m);
        return;
    }
    ingest_note_offset(p, m->offset);
    if (hub_fault("kafka_take") || part_push(p, m) != 0) {
        part_hole(p, m->offset);
        rd_kafka_message_destroy(m);
        return;
    }
    p->hole = -1;
}

/* Takes what the consumer queue holds, up to a budget per loop turn. */
static void ingest_drain(struct hub_ingest *ing) {
    char buf[64];
    int taken = 0;

    if (ing->stopping) {
        return;
    }
    /* empty the wake-up pipe: one read per turn covers every write */
    while (read(ing->pipe_fds[0], buf, sizeof(buf)) > 0) {
    }
    /* Over the pending budget, take one record per turn: enough to keep the
     * consumer polled (rebalances, max.poll.interval.ms), while librdkafka's
     * bounded queue holds the rest back. */
    int budget = ing->pending_bytes > INGEST_PENDING_BYTES ? 1 : INGEST_POLL_BUDGET;
    while (taken < budget) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(ing->rk, 0);
        if (m == NULL) {
            break;
        }
        ingest_take(ing, m);
        taken++;
    }
    for (struct ingest_part *p = ing->parts; p != NULL; p = p->next) {
        if (p->hole >= 0 && p->assigned && hub_now_ns() - p->hole_seek_ns > INGEST_HOLE_SEEK_NS) {
            part_seek_hole(p); /* the hole's record did not come back yet */
        }
        part_backpressure(p);
    }
    ingest_start(ing);
    if (taken == INGEST_POLL_BUDGET) {
        uv_idle_start(&ing->more, ingest_more_cb);
    }
}

/* The previous turn used its whole budget: drain again on the next turn,
 * after the loop has served everything else once. */
static void ingest_more_cb(uv_idle_t *h) {
    uv_idle_stop(h);
    ingest_drain(h->data);
}

/* librdkafka wrote to the pipe: its queue has something. */
static void ingest_wake_cb(uv_poll_t *h, int status, int events) {
    ingest_drain(h->data);
}

/* Every 100 ms whatever the pipe says: rebalances and retries of a batch
 * that could not even be allocated need a poll without new records. */
static void ingest_tick_cb(uv_timer_t *t) {
    ingest_drain(t->data);
}

/* librdkafka's client-level errors (brokers down, ...): logged; librdkafka
 * retries on its own.  Every broker down is also a readiness fact. */
static void kafka_error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque) {
    struct hub_ingest *ing = opaque;

    if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN) {
        health_set(ing, 0, "no connection to any Kafka broker");
    }
    hub_log(HUB_WARN, "kafka error", HUB_LS("error", rd_kafka_err2str(err)),
            HUB_LS("detail", reason));
}

int hub_ingest_start(struct hub *hub, struct hub_ingest **out) {
    struct hub_ingest *ing = calloc(1, sizeof(*ing));
    rd_kafka_conf_t *conf = NULL;
    rd_kafka_topic_partition_list_t *topics = NULL;
    char err[512];
    char num[32], wait[32];
    int rc = HUB_EKAFKA; /* what librdkafka refused, unless set otherwise below */

    if (ing == NULL) {
        return HUB_ENOMEM;
    }
    ing->hub = hub;
    ing->batch_max = (size_t)hub->cfg.ingest_batch_max;
    ing->batches_max = (int)hub->cfg.ingest_partition_batches;
    ing->conns = (size_t)hub->cfg.ingest_pg_connections;
    ing->pipe_fds[0] = ing->pipe_fds[1] = -1;

    conf = hub_kafka_conf_new(&hub->cfg, hub->brokers, err, sizeof(err));
    if (conf == NULL) {
        goto fail_conf;
    }
    snprintf(num, sizeof(num), "%lld", (long long)hub->cfg.kafka_session_timeout_ms);
    snprintf(wait, sizeof(wait), "%lld", (long long)hub->cfg.kafka_fetch_wait_ms);
    if (rd_kafka_conf_set(conf, "group.id", hub->cfg.kafka_group, err, sizeof(err)) ||
        /* offsets are committed by us, after the batch is stored */
        rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof(err)) ||
        rd_kafka_conf_set(conf, "enable.auto.offset.store", "false", err, sizeof(err)) ||
        rd_kafka_conf_set(conf, "auto.offset.reset", "earliest", err, sizeof(err)) ||
        rd_kafka_conf_set(conf, "session.timeout.ms", num, err, sizeof(err)) ||
        rd_kafka_conf_set(conf, "enable.partition.eof", "false", err, sizeof(err)) ||
        /* new topics matching the regex are picked up within seconds */
        rd_kafka_conf_set(conf, "topic.metadata.refresh.interval.ms", "2000", err, sizeof(err)) ||
        /* Bounded prefetch, for the whole consumer queue (librdkafka 2.0
         * measures the forwarded queue): memory stays flat however far behind
         * we are.  Once the queue is full the fetcher stops, and it starts
         * again only when its broker thread next wakes up; the queue must
         * cover that gap, with a small pending budget (INGEST_PENDING_BYTES)
         * beside it (docs/performance.md, "Notes moved out of the ingest
         * code (issue 22)").  A record keeps its whole fetch response in
         * memory until it is destroyed, so the queue's bytes are not all
         * it costs; the poll budget above and the mmap threshold (main.c)
         * bound the rest.  A 12 MiB queue with 2 MiB responses held less
         * still (~110 MiB over 16 topics × 4 partitions) but cost a third
         * of the drain rate on a quiet machine (README, "Ingest"). */
        rd_kafka_conf_set(conf, "queued.max.messages.kbytes", "24576", err, sizeof(err)) ||
        rd_kafka_conf_set(conf, "fetch.wait.max.ms", wait, err, sizeof(err)) ||
        rd_kafka_conf_set(conf, "fetch.max.bytes", "8388608", err, sizeof(err))) {
        goto fail_conf;
    }
    snprintf(num, sizeof(num), "%lld", (long long)hub->cfg.kafka_session_timeout_ms / 3);
    if (rd_kafka_conf_set(conf, "heartbeat.interval.ms", num, err, sizeof(err)) ||
        rd_kafka_conf_set(conf, "statistics.interval.ms", INGEST_STATS_MS, err, sizeof(err))) {
        goto fail_conf;
    }
    rd_kafka_conf_set_stats_cb(conf, stats_cb);
    rd_kafka_conf_set_log_cb(conf, hub_kafka_log_cb);
    rd_kafka_conf_set_error_cb(conf, kafka_error_cb);
    rd_kafka_conf_set_rebalance_cb(conf, rebalance_cb);
    rd_kafka_conf_set_offset_commit_cb(conf, commit_cb);
    rd_kafka_conf_set_opaque(conf, ing);

    ing->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
    if (ing->rk == NULL) {
        goto fail_conf;
    }
    conf = NULL; /* owned by rk now */
    rd_kafka_poll_set_consumer(ing->rk);
    ing->queue = rd_kafka_queue_get_consumer(ing->rk);

    if (pipe2(ing->pipe_fds, O_NONBLOCK | O_CLOEXEC) != 0) {
        snprintf(err, sizeof(err), "pipe: %s", strerror(errno));
        rc = HUB_EIO;
        goto fail_rk;
    }
    /* librdkafka writes one byte whenever the queue goes from empty to not */
    rd_kafka_queue_io_event_enable(ing->queue, ing->pipe_fds[1], "1", 1);

    topics = hub_kafka_topic_list(hub->cfg.kafka_topics);
    if (topics == NULL) {
        snprintf(err, sizeof(err), "STREAMING_HUB_KAFKA_TOPICS is empty");
        rc = HUB_EINVAL;
        goto fail_rk;
    }
    rd_kafka_resp_err_t rerr = rd_kafka_subscribe(ing->rk, topics);
    rd_kafka_topic_partition_list_destroy(topics);
    if (rerr) {
        /* the only input subscribe can refuse is the variable's value */
        snprintf(err, sizeof(err), "STREAMING_HUB_KAFKA_TOPICS: cannot subscribe to '%s': %s",
                 hub->cfg.kafka_topics, rd_kafka_err2str(rerr));
        rc = HUB_EINVAL;
        goto fail_rk;
    }

    /* served on the loop from here: wake-up, tick, and the idle handle that
     * continues a drain whose budget ran out */
    uv_poll_init(hub->loop, &ing->wake, ing->pipe_fds[0]);
    ing->wake.data = ing;
    uv_poll_start(&ing->wake, UV_READABLE, ingest_wake_cb);
    uv_timer_init(hub->loop, &ing->tick);
    ing->tick.data = ing;
    uv_timer_start(&ing->tick, ingest_tick_cb, 100, 100);
    uv_idle_init(hub->loop, &ing->more);
    ing->more.data = ing;
    ing->open_handles = 3;
    hub_log(HUB_INFO, "kafka consumer started", HUB_LS("brokers", hub->brokers),
            HUB_LS("topics", hub->cfg.kafka_topics), HUB_LS("group", hub->cfg.kafka_group));
    *out = ing;
    return 0;

fail_rk:
    if (ing->queue) {
        rd_kafka_queue_destroy(ing->queue);
    }
    rd_kafka_destroy(ing->rk);
    if (ing->pipe_fds[0] >= 0) {
        close(ing->pipe_fds[0]);
        close(ing->pipe_fds[1]);
    }
fail_conf:
    if (conf) {
        rd_kafka_conf_destroy(conf);
    }
    hub_log(HUB_ERROR, "kafka consumer not started", HUB_LS("error", err),
            HUB_LS("code", hub_strerror(rc)));
    free(ing);
    return rc;
}

/* One of the consumer's handles closed (hub_ingest_stop). */
static void ingest_handle_closed(uv_handle_t *h) {
    struct hub_ingest *ing = h->data;
    if (--ing->open_handles == 0 && ing->batches_inflight == 0) {
        ingest_finish_stop(ing);
    }
}

/* Runs once no batch is in flight and every handle is closed: leaves the
 * group, frees the consumer and the partitions (dropping their pending
 * records), then calls the done_cb of hub_ingest_stop. */
static void ingest_finish_stop(struct hub_ingest *ing) {
    if (ing->open_handles > 0 || ing->done_cb == NULL) {
        return;
    }
    /* Leave the group now so that the partitions move at once rather than
     * after the session timeout; blocking, but only at exit. */
    rd_kafka_consumer_close(ing->rk);
    rd_kafka_queue_destroy(ing->queue);
    rd_kafka_destroy(ing->rk);
    close(ing->pipe_fds[0]);
    close(ing->pipe_fds[1]);
    while (ing->parts != NULL) {
        struct ingest_part *p = ing->parts;
        ing->parts = p->next;
        part_drop_pending(p);
        free(p->pending);
        free(p->topic);
        free(p);
    }
    void (*cb)(void *) = ing->done_cb;
    void *arg = ing->done_arg;
    free(ing);
    cb(arg);
}

void hub_ingest_stop(struct hub_ingest *ing, void (*done_cb)(void *arg), void *arg) {
    ing->stopping = 1;
    ing->done_cb = done_cb;
    ing->done_arg = arg;
    /* Carriers waiting in retry give up now (their records replay on the
     * next start); carriers with a transaction outstanding finish and commit. */
    for (struct ingest_carrier *c = ing->carriers, *next; c != NULL; c = next) {
        next = c->next;
        if (c->w.in_txn || c->w.in_step == INGEST_STEP_CHECKING) {
            continue; /* it finishes (a check runs on into its transaction) */
        }
        if (c->w.in_step == INGEST_STEP_WAITING) {
            hub_schemas_cancel_wait(ing->hub, &c->w);
            c->w.in_step = INGEST_STEP_NONE;
        }
        uv_timer_stop(&c->w.retry);
        carrier_release(c);
    }
    uv_poll_stop(&ing->wake);
    uv_close((uv_handle_t *)&ing->wake, ingest_handle_closed);
    uv_close((uv_handle_t *)&ing->tick, ingest_handle_closed);
    uv_close((uv_handle_t *)&ing->more, ingest_handle_closed);
}

/* ----------------------------------------------------------- figures -- */

int hub_ingest_ready(const struct hub_ingest *ing, const char **why) {
    uint64_t window_ns;

    if (ing == NULL || !ing->ready) {
        *why = "kafka consumer has not joined its group yet";
        return 0;
    }
    window_ns = (uint64_t)ing->hub->cfg.ready_kafka_window_ms * 1000000ULL;
    if (ing->unhealthy_since != 0 && hub_now_ns() - ing->unhealthy_since >= window_ns) {
        *why = ing->unhealthy_why != NULL ? ing->unhealthy_why : "kafka consumer is not healthy";
        return 0;
    }
    return 1;
}

int hub_ingest_healthy(const struct hub_ingest *ing) {
    return ing != NULL && ing->ready && ing->healthy;
}

int hub_ingest_assigned(const struct hub_ingest *ing) {
    int n = 0;
    for (const struct ingest_part *p = ing ? ing->parts : NULL; p != NULL; p = p->next) {
        n += p->assigned;
    }
    return n;
}

int hub_ingest_paused(const struct hub_ingest *ing) {
    int n = 0;
    for (const struct ingest_part *p = ing ? ing->parts : NULL; p != NULL; p = p->next) {
        n += p->paused;
    }
    return n;
}

long hub_ingest_pending(const struct hub_ingest *ing) {
    long n = 0;
    for (const struct ingest_part *p = ing ? ing->parts : NULL; p != NULL; p = p->next) {
        n += (long)p->n_pending;
        for (const struct part_batch *b = p->first; b != NULL; b = b->next) {
            n += (long)b->n;
        }
    }
    return n;
}
