/*
 * ingest — Kafka consumer, verdicts, per-partition batches (see ingest.h).
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

#include "dispatch.h"
#include "envelope.h"
#include "hub.h"
#include "kafka.h"
#include "log.h"
#include "pg.h"
#include "store.h"
#include "util.h"

#define INGEST_POLL_BUDGET 8192       /* records taken per loop turn */
#define INGEST_PLAN_MIN_RECORDS 16 /* smaller batches use the prepared statement */
/* Stop taking records from librdkafka's queue above this much pending in
 * partitions (not yet in a batch): the queue is the buffer (see its bound). */
#define INGEST_PENDING_BYTES (4 << 20)
#define INGEST_RETRY_MIN_MS 100
#define INGEST_RETRY_MAX_MS 5000

struct ingest_part;

struct ingest_batch {
    struct hub *hub;
    struct hub_pg *pg;
    struct ingest_part *part; /* Kafka: the partition; NULL for HTTP ingest */
    struct hub_ingest_rec *recs;
    size_t n;
    int attempts;
    int quarantined;   /* invalid records already written (never twice) */
    int stored;        /* insert statement succeeded */
    int conflicts_left; /* digest conflicts still to quarantine */
    int in_txn;        /* a transaction is outstanding */
    uint64_t started_ns;
    uv_timer_t retry;         /* Kafka only: HTTP ingest does not retry, its client does */
    hub_ingest_store_cb done; /* HTTP ingest: runs once, then the batch is freed */
    void *done_arg;
};

struct ingest_part {
    struct hub_ingest *ing;
    char *topic;
    int32_t partition;
    int assigned;
    int paused;
    rd_kafka_message_t **pending;
    size_t n_pending;
    size_t cap_pending;
    size_t pending_bytes;
    struct ingest_batch *inflight;
    struct ingest_part *next;
};

struct hub_ingest {
    struct hub *hub;
    rd_kafka_t *rk;
    rd_kafka_queue_t *queue;
    int pipe_fds[2];
    uv_poll_t wake;
    uv_timer_t tick;
    uv_idle_t more; /* keeps draining when a turn's budget ran out */
    struct ingest_part *parts;
    int ready;
    int stopping;
    int open_handles;
    int batches_inflight;
    size_t pending_bytes; /* over every partition */
    void (*done_cb)(void *arg);
    void *done_arg;
    size_t batch_max;
};

static void ingest_drain(struct hub_ingest *ing);
static void ingest_more_cb(uv_idle_t *h);
static void batch_submit(struct ingest_batch *b);
static void part_maybe_start(struct ingest_part *p);
static void ingest_finish_stop(struct hub_ingest *ing);

/* ------------------------------------------------------------ partitions -- */

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
    p->next = ing->parts;
    ing->parts = p;
    return p;
}

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

static void part_drop_pending(struct ingest_part *p) {
    for (size_t i = 0; i < p->n_pending; i++) {
        rd_kafka_message_destroy(p->pending[i]);
    }
    p->ing->pending_bytes -= p->pending_bytes;
    p->n_pending = 0;
    p->pending_bytes = 0;
}

static int part_push(struct ingest_part *p, rd_kafka_message_t *m) {
    if (p->n_pending == p->cap_pending) {
        size_t cap = p->cap_pending ? p->cap_pending * 2 : 256;
        rd_kafka_message_t **a = realloc(p->pending, sizeof(*a) * cap);
        if (a == NULL) {
            return -1;
        }
        p->pending = a;
        p->cap_pending = cap;
    }
    p->pending[p->n_pending++] = m;
    p->pending_bytes += m->len;
    p->ing->pending_bytes += m->len;
    return 0;
}

/*
 * A partition whose batch keeps failing stops fetching, so that it does not
 * pile up records while the others go on; it resumes once its batch is stored.
 *
 * Backpressure for speed is global instead (ingest_drain stops taking records
 * above INGEST_PENDING_BYTES, and librdkafka's bounded queue then stops the
 * fetcher): pausing partitions for that costs librdkafka a fetch back-off of
 * up to a second on every resume, which showed as stalls in bench/ingest.
 */
static void part_backpressure(struct ingest_part *p) {
    int failing = p->inflight != NULL && p->inflight->attempts > 0 && !p->inflight->stored;
    part_set_paused(p, failing);
}

/* --------------------------------------------------------------- batches -- */

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

static int key_equal(const struct hub_event *a, const struct hub_event *b) {
    return strcmp(a->id, b->id) == 0 && strcmp(a->source, b->source) == 0 &&
           strcmp(a->tenant, b->tenant) == 0;
}

/* Marks records whose key already appeared earlier in the same batch: only the
 * first goes to the database, the others take their verdict from it. */
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

char *hub_ingest_headers_evidence(const struct hub_header *h, size_t n) {
    json_t *arr = json_array();
    char *out;

    for (size_t i = 0; arr != NULL && i < n; i++) {
        json_t *o = json_object();
        if (hub_utf8_valid(h[i].name, h[i].name_len)) {
            json_object_set_new(o, "name", json_stringn(h[i].name, h[i].name_len));
        } else {
            char *b = hub_base64(h[i].name, h[i].name_len);
            json_object_set_new(o, "name_b64", json_string(b ? b : ""));
            free(b);
        }
        if (h[i].value == NULL) {
            json_object_set_new(o, "value", json_null());
        } else if (hub_utf8_valid(h[i].value, h[i].value_len)) {
            json_object_set_new(o, "value", json_stringn(h[i].value, h[i].value_len));
        } else {
            char *b = hub_base64(h[i].value, h[i].value_len);
            json_object_set_new(o, "value_b64", json_string(b ? b : ""));
            free(b);
        }
        json_array_append_new(arr, o);
    }
    out = arr != NULL ? json_dumps(arr, JSON_COMPACT) : NULL;
    json_decref(arr);
    return out;
}

/*
 * A Kafka record's headers as an array: stack[0..cap) when they fit, else
 * malloc'd (the caller frees it when it is not stack).  Returns NULL on OOM.
 */
static struct hub_header *msg_headers(const rd_kafka_message_t *m, struct hub_header *stack,
                                      size_t cap, size_t *n) {
    rd_kafka_headers_t *hdrs = NULL;
    struct hub_header *h = stack;
    const char *name;
    const void *val;
    size_t size;

    *n = 0;
    if (rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        return h;
    }
    if (rd_kafka_header_cnt(hdrs) > cap) {
        h = malloc(sizeof(*h) * rd_kafka_header_cnt(hdrs));
        if (h == NULL) {
            return NULL;
        }
    }
    for (size_t k = 0; rd_kafka_header_get_all(hdrs, k, &name, &val, &size) == 0; k++) {
        h[(*n)++] = (struct hub_header){name, strlen(name), val, val ? size : 0};
    }
    return h;
}

/* JSON evidence of a Kafka record's headers for the quarantine table. */
static char *headers_evidence(const rd_kafka_message_t *m, size_t *len) {
    struct hub_header stack[32];
    size_t n;
    struct hub_header *h = msg_headers(m, stack, sizeof(stack) / sizeof(stack[0]), &n);
    char *out = h != NULL ? hub_ingest_headers_evidence(h, n) : NULL;

    if (h != stack) {
        free(h);
    }
    if (out != NULL) {
        *len = strlen(out);
    }
    return out;
}

/* The value of a header as text when it is storable, else NULL (evidence of
 * the claimed tenant/source/id for operators browsing the quarantine). */
static char *header_text(const rd_kafka_message_t *m, const char *attr) {
    rd_kafka_headers_t *hdrs = NULL;
    const char *name;
    const void *val;
    size_t size;
    char *found = NULL;

    if (rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        return NULL;
    }
    for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &val, &size) == 0; i++) {
        if ((strncasecmp(name, "ce-", 3) == 0 || strncasecmp(name, "ce_", 3) == 0) &&
            strcasecmp(name + 3, attr) == 0 && val != NULL && size <= 1024 &&
            hub_utf8_valid(val, size)) {
            free(found);
            found = strndup(val, size); /* last one wins, as in the parser */
        }
    }
    return found;
}

/* Hands n built arrays to txn as the parameters of sql (no copy), or frees
 * them when add is 0.  Returns 0, or -1 on OOM (the txn then fails). */
static int txn_add_arrays(struct hub_pg_txn *txn, const struct hub_sql *sql, struct hub_pgarr *a,
                          int n, int add) {
    char *values[HUB_INGEST_NPARAMS > HUB_QUARANTINE_NPARAMS ? HUB_INGEST_NPARAMS
                                                             : HUB_QUARANTINE_NPARAMS];
    int lengths[sizeof(values) / sizeof(values[0])];
    int rc = 0;

    for (int k = 0; k < n; k++) {
        values[k] = hub_pgarr_take(&a[k], &lengths[k]);
        rc |= values[k] == NULL ? -1 : 0;
    }
    if (rc == 0 && add) {
        return hub_pg_txn_add_owned(txn, sql, n, values, lengths);
    }
    for (int k = 0; k < n; k++) {
        free(values[k]);
    }
    return add ? -1 : 0;
}

/* Why a valid record is quarantined: its key is stored with another digest. */
static void add_conflict_reason(struct hub_pgarr *a, const struct hub_ingest_rec *r) {
    hub_pgarr_add_text(&a[0], "digest_conflict");
    hub_pgarr_add_text(&a[1], "data");
    hub_pgarr_add_text(&a[2], "same tenant, source and id already stored with a "
                              "different payload digest");
    hub_pgarr_add_text(&a[3], r->ev.tenant);
    hub_pgarr_add_text(&a[4], r->ev.source);
    hub_pgarr_add_text(&a[5], r->ev.id);
}

/* Why an invalid record is quarantined (the parser's reason and field). */
static void add_invalid_reason(struct hub_pgarr *a, const struct hub_ingest_rec *r) {
    hub_pgarr_add_text(&a[0], hub_envelope_reason_str(r->err.reason));
    hub_pgarr_add_text(&a[1], r->err.field[0] ? r->err.field : NULL);
    hub_pgarr_add_text(&a[2], hub_utf8_valid(r->err.message, strlen(r->err.message))
                                  ? r->err.message
                                  : "invalid envelope");
}

/* The quarantine row of an HTTP record: no topic, partition or offset. */
static void add_quarantine_http(struct hub_pgarr *a, const struct hub_ingest_rec *r) {
    if (r->ok) {
        add_conflict_reason(a, r);
    } else {
        add_invalid_reason(a, r);
        hub_pgarr_add_text(&a[3], r->claimed_tenant);
        hub_pgarr_add_text(&a[4], r->claimed_source);
        hub_pgarr_add_text(&a[5], r->claimed_id);
    }
    hub_pgarr_add(&a[6], NULL, 0);
    hub_pgarr_add(&a[7], NULL, 0);
    hub_pgarr_add(&a[8], NULL, 0);
    hub_pgarr_add_jsonb(&a[9], r->headers_json ? r->headers_json : "[]",
                        r->headers_json ? strlen(r->headers_json) : 2);
    hub_pgarr_add(&a[10], r->value ? r->value : "", r->value_len);
}

/* Adds quarantine rows for the records selected by `want` to txn. */
static int add_quarantine(struct hub_pg_txn *txn, struct ingest_batch *b,
                          int (*want)(const struct hub_ingest_rec *)) {
    struct hub_pgarr a[HUB_QUARANTINE_NPARAMS];
    static const uint32_t oids[HUB_QUARANTINE_NPARAMS] = {
        HUB_OID_TEXT, HUB_OID_TEXT, HUB_OID_TEXT, HUB_OID_TEXT,  HUB_OID_TEXT, HUB_OID_TEXT,
        HUB_OID_TEXT, HUB_OID_INT4, HUB_OID_INT8, HUB_OID_JSONB, HUB_OID_BYTEA};

    for (int k = 0; k < HUB_QUARANTINE_NPARAMS; k++) {
        hub_pgarr_init(&a[k], oids[k]);
    }
    for (size_t i = 0; i < b->n; i++) {
        struct hub_ingest_rec *r = &b->recs[i];
        const rd_kafka_message_t *m = r->msg;
        size_t hlen = 0;
        char *hjson;
        if (!want(r)) {
            continue;
        }
        if (m == NULL) {
            add_quarantine_http(a, r);
            continue;
        }
        if (r->ok) { /* a digest conflict: the envelope is valid */
            add_conflict_reason(a, r);
        } else {
            char *t = header_text(m, "tenantid"), *s = header_text(m, "source"),
                 *id = header_text(m, "id");
            add_invalid_reason(a, r);
            hub_pgarr_add_text(&a[3], t);
            hub_pgarr_add_text(&a[4], s);
            hub_pgarr_add_text(&a[5], id);
            free(t);
            free(s);
            free(id);
        }
        hub_pgarr_add_text(&a[6], rd_kafka_topic_name(m->rkt));
        hub_pgarr_add_i32(&a[7], m->partition);
        hub_pgarr_add_i64(&a[8], m->offset);
        hjson = headers_evidence(m, &hlen);
        hub_pgarr_add_jsonb(&a[9], hjson ? hjson : "[]", hjson ? hlen : 2);
        free(hjson);
        hub_pgarr_add(&a[10], m->payload ? m->payload : "", m->len);
    }
    return txn_add_arrays(txn, &hub_sql_quarantine_insert, a, HUB_QUARANTINE_NPARAMS, 1);
}

static int want_invalid(const struct hub_ingest_rec *r) {
    return !r->ok;
}

static int want_conflict(const struct hub_ingest_rec *r) {
    return r->ok && r->verdict == HUB_V_QUARANTINED_CONFLICT;
}

/* Adds the inbox insert for every first-of-its-key valid record. */
static int add_insert(struct hub_pg_txn *txn, struct ingest_batch *b, size_t *count) {
    struct hub_pgarr a[HUB_INGEST_NPARAMS];
    static const uint32_t oids[HUB_INGEST_NPARAMS] = {
        HUB_OID_INT4, HUB_OID_TEXT,  HUB_OID_TEXT,  HUB_OID_TEXT,
        HUB_OID_TEXT, HUB_OID_TEXT,  HUB_OID_INT4,  HUB_OID_TIMESTAMPTZ,
        HUB_OID_TEXT, HUB_OID_JSONB, HUB_OID_BYTEA, HUB_OID_BYTEA,
        HUB_OID_TEXT, HUB_OID_INT4,  HUB_OID_INT8,  HUB_OID_BOOL};

    *count = 0;
    for (int k = 0; k < HUB_INGEST_NPARAMS; k++) {
        hub_pgarr_init(&a[k], oids[k]);
    }
    for (size_t i = 0; i < b->n; i++) {
        struct hub_ingest_rec *r = &b->recs[i];
        const struct hub_event *ev = &r->ev;
        if (!r->ok || r->first >= 0) {
            continue;
        }
        hub_pgarr_add_i32(&a[0], (int32_t)i);
        hub_pgarr_add_text(&a[1], ev->tenant);
        hub_pgarr_add_text(&a[2], ev->source);
        hub_pgarr_add_text(&a[3], ev->id);
        hub_pgarr_add_text(&a[4], ev->type);
        hub_pgarr_add_text(&a[5], ev->event_type);
        hub_pgarr_add_i32(&a[6], ev->schema_major);
        hub_pgarr_add_ts(&a[7], ev->time_us);
        hub_pgarr_add_text(&a[8], ev->content_type);
        hub_pgarr_add_jsonb(&a[9], ev->attrs_json, ev->attrs_json_len);
        hub_pgarr_add(&a[10], ev->payload ? (const void *)ev->payload : "", ev->payload_len);
        hub_pgarr_add(&a[11], ev->digest, sizeof(ev->digest));
        if (r->msg != NULL) {
            const rd_kafka_message_t *m = r->msg;
            hub_pgarr_add_text(&a[12], rd_kafka_topic_name(m->rkt));
            hub_pgarr_add_i32(&a[13], m->partition);
            hub_pgarr_add_i64(&a[14], m->offset);
        } else { /* HTTP ingest: no topic, partition or offset */
            hub_pgarr_add(&a[12], NULL, 0);
            hub_pgarr_add(&a[13], NULL, 0);
            hub_pgarr_add(&a[14], NULL, 0);
        }
        hub_pgarr_add_bool(&a[15], r->ev.json_unchecked);
        (*count)++;
    }
    /* Planning this statement costs a few ms: worth it for a big batch (its
     * custom plan is ~25% cheaper per row than the generic one), not for the
     * few records a batch holds at a steady, low rate, where it would be
     * most of the batch's latency. */
    return txn_add_arrays(txn,
                          *count >= INGEST_PLAN_MIN_RECORDS ? &hub_sql_ingest_insert
                                                            : &hub_sql_ingest_insert_prepared,
                          a, HUB_INGEST_NPARAMS, *count > 0);
}

static void batch_free(struct ingest_batch *b) {
    if (b->done == NULL) { /* a Kafka batch owns its records; HTTP's are the caller's */
        for (size_t i = 0; i < b->n; i++) {
            hub_event_free(&b->recs[i].ev);
            rd_kafka_message_destroy(b->recs[i].msg);
        }
        free(b->recs);
    }
    free(b);
}

/* Offset of a Kafka batch's i-th record. */
static int64_t batch_offset(const struct ingest_batch *b, size_t i) {
    return ((const rd_kafka_message_t *)b->recs[i].msg)->offset;
}

static void batch_timer_closed(uv_handle_t *h) {
    struct ingest_batch *b = h->data;
    struct hub_ingest *ing = b->part->ing;
    batch_free(b);
    if (--ing->open_handles == 0 && ing->stopping && ing->batches_inflight == 0) {
        ingest_finish_stop(ing);
    }
}

/* Detaches the batch from its partition and frees it (after its timer closed). */
static void batch_release(struct ingest_batch *b) {
    struct ingest_part *p = b->part;
    struct hub_ingest *ing = p->ing;

    p->inflight = NULL;
    ing->batches_inflight--;
    ing->open_handles++;
    uv_close((uv_handle_t *)&b->retry, batch_timer_closed);
}

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

/* Everything of the batch is durable: count, commit, move on. */
static void batch_done(struct ingest_batch *b) {
    struct ingest_part *p = b->part;
    struct hub_metrics *m = &b->hub->metrics;
    int accepted = 0;

    for (size_t i = 0; i < b->n; i++) {
        m->ingest_records[b->recs[i].verdict]++;
        accepted |= b->recs[i].verdict == HUB_V_ACCEPTED;
    }
    if (accepted) {
        hub_dispatch_kick(b->hub->dispatch); /* their jobs are committed */
    }
    hub_histogram_observe(&m->ingest_batch_seconds,
                          (double)(hub_now_ns() - b->started_ns) / 1e9);
    if (b->done != NULL) {
        b->done(b->done_arg, NULL);
        batch_free(b);
        return;
    }
    if (p->assigned) {
        commit_offset(p->ing, p, batch_offset(b, b->n - 1) + 1);
    }
    batch_release(b);
    part_backpressure(p);
    part_maybe_start(p);
}

static void batch_retry_cb(uv_timer_t *t) {
    struct ingest_batch *b = t->data;
    struct ingest_part *p = b->part;

    if (!p->assigned || p->ing->stopping) {
        /* Not ours any more (or leaving): the next owner replays from the
         * committed offset, which never moved past this batch. */
        batch_release(b);
        if (p->ing->stopping && p->ing->batches_inflight == 0) {
            ingest_finish_stop(p->ing);
        }
        return;
    }
    batch_submit(b);
}

/* A transaction that could not be built (out of memory): never sent. */
static const struct hub_pg_outcome ingest_oom = {HUB_PG_ECLOSED, NULL, 0, "out of memory", ""};
static const struct hub_pg_outcome ingest_closing = {HUB_PG_ECLOSED, NULL, 0, "shutting down", ""};

static void batch_failed(struct ingest_batch *b, const struct hub_pg_outcome *out) {
    struct ingest_part *p = b->part;
    struct hub_ingest *ing;
    const char *error = out->error != NULL ? out->error : "transaction failed";
    const char *sqlstate = out->sqlstate != NULL ? out->sqlstate : "";
    uint64_t delay = INGEST_RETRY_MIN_MS;

    b->hub->metrics.ingest_batch_failures++;
    if (b->done != NULL) {
        b->done(b->done_arg, out);
        batch_free(b);
        return;
    }
    ing = p->ing;
    for (int i = 0; i < b->attempts && delay < INGEST_RETRY_MAX_MS; i++) {
        delay *= 2;
    }
    if (delay > INGEST_RETRY_MAX_MS) {
        delay = INGEST_RETRY_MAX_MS;
    }
    b->attempts++;
    /* Log the first failure and then every tenth, not a line per retry. */
    if (b->attempts == 1 || b->attempts % 10 == 0) {
        hub_log(HUB_WARN, "partition batch not stored, retrying", HUB_LS("topic", p->topic),
                HUB_LI("partition", p->partition), HUB_LI("offset", batch_offset(b, 0)),
                HUB_LI("records", b->n), HUB_LI("attempt", b->attempts),
                HUB_LS("sqlstate", sqlstate), HUB_LS("error", error));
    }
    part_backpressure(p);
    if (ing->stopping) {
        batch_release(b);
        if (ing->batches_inflight == 0) {
            ingest_finish_stop(ing);
        }
        return;
    }
    uv_timer_start(&b->retry, batch_retry_cb, delay, 0);
}

/* Reads the insert statement's rows into verdicts.  Returns the number of
 * records that raced a concurrent insert of the same key (to classify again). */
static size_t batch_classify(struct ingest_batch *b, PGresult *res) {
    size_t raced = 0;
    int rows = res ? PQntuples(res) : 0;

    for (int row = 0; row < rows; row++) {
        int ord = atoi(PQgetvalue(res, row, 0));
        struct hub_ingest_rec *r;
        char hex[65];
        if (ord < 0 || (size_t)ord >= b->n) {
            continue;
        }
        r = &b->recs[ord];
        if (PQgetisnull(res, row, 1)) {
            r->verdict = HUB_V_DROPPED_UNKNOWN_TENANT;
        } else if (strcmp(PQgetvalue(res, row, 1), "active") != 0) {
            r->verdict = HUB_V_DROPPED_INACTIVE_TENANT;
        } else if (!PQgetisnull(res, row, 2)) {
            const char *old = PQgetvalue(res, row, 2); /* "\x" + hex */
            snprintf(r->old_digest, sizeof(r->old_digest), "%s", old + 2);
            hub_hex(r->ev.digest, sizeof(r->ev.digest), hex);
            r->verdict = strcmp(hex, r->old_digest) == 0 ? HUB_V_DUPLICATE
                                                          : HUB_V_QUARANTINED_CONFLICT;
        } else if (!PQgetisnull(res, row, 3)) {
            r->verdict = HUB_V_ACCEPTED;
            r->seq = strtoll(PQgetvalue(res, row, 3), NULL, 10);
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

/* Whether a valid record's JSON payload is still unchecked (repeats only:
 * records that the insert statement does not carry). */
static int batch_json_unchecked(const struct ingest_batch *b, int repeats_only) {
    for (size_t i = 0; i < b->n; i++) {
        const struct hub_ingest_rec *r = &b->recs[i];
        if (r->ok && r->ev.json_unchecked && (!repeats_only || r->first >= 0)) {
            return 1;
        }
    }
    return 0;
}

static void batch_json_cb(void *arg, const struct hub_pg_outcome *out) {
    struct ingest_batch *b = arg;
    PGresult *res = out->n_results > 0 ? out->results[0] : NULL;

    b->in_txn = 0;
    if (out->status != HUB_PG_OK || res == NULL) {
        batch_failed(b, out);
        return;
    }
    for (int row = 0; row < PQntuples(res); row++) {
        int ord = atoi(PQgetvalue(res, row, 0));
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
                 PQgetvalue(res, row, 1));
        hub_event_free(&r->ev);
    }
    for (size_t i = 0; i < b->n; i++) {
        b->recs[i].ev.json_unchecked = 0; /* the others passed, one by one */
    }
    batch_mark_repeats(b); /* a first occurrence may have become invalid */
    batch_submit(b);
}

/* The insert failed on a payload's JSON grammar (or a batch has repeats to
 * check): find which payloads are not JSON, row by row (the slow path, for
 * bad input only), then write the batch again with them quarantined. */
static void batch_check_json(struct ingest_batch *b) {
    struct hub_pgarr a[HUB_JSON_ERRORS_NPARAMS];
    struct hub_pg_txn *txn;

    txn = hub_pg_txn_new(b->pg, batch_json_cb, b);
    if (txn == NULL) {
        batch_failed(b, &ingest_oom);
        return;
    }
    hub_pgarr_init(&a[0], HUB_OID_INT4);
    hub_pgarr_init(&a[1], HUB_OID_BYTEA);
    for (size_t i = 0; i < b->n; i++) {
        const struct hub_ingest_rec *r = &b->recs[i];
        if (r->ok && r->ev.json_unchecked) {
            hub_pgarr_add_i32(&a[0], (int32_t)i);
            hub_pgarr_add(&a[1], r->ev.payload, r->ev.payload_len);
        }
    }
    /* on OOM the txn fails through its callback */
    txn_add_arrays(txn, &hub_sql_ingest_json_errors, a, HUB_JSON_ERRORS_NPARAMS, 1);
    b->in_txn = 1;
    hub_pg_txn_submit(txn);
}

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
        /* this transaction carried the invalid records, if there were any */
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
            batch_submit(b);
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
        batch_submit(b);
        return;
    }
    b->attempts = 0;
    batch_done(b);
}

/* Sends whatever the batch still has to write, as one transaction. */
static void batch_submit(struct ingest_batch *b) {
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
    txn = hub_pg_txn_new(b->pg, batch_txn_cb, b);
    if (txn == NULL) {
        batch_failed(b, &ingest_oom);
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
        /* OOM while building: let submit fail the txn through the callback */
    }
    b->in_txn = 1;
    hub_pg_txn_submit(txn);
}

/* The verdict of a record the parser refused. */
static void rec_refuse(struct hub_ingest_rec *r) {
    r->verdict = r->err.reason == HUB_ENVELOPE_TOO_LARGE ? HUB_V_QUARANTINED_TOO_LARGE
                                                         : HUB_V_QUARANTINED_INVALID;
}

/* Parses the records of a new batch (envelope rules, SPEC §3.1). */
static void batch_parse(struct ingest_batch *b) {
    struct hub_ingest *ing = b->part->ing;
    struct hub_envelope_limits lim = {(size_t)ing->hub->cfg.max_event_bytes};
    struct hub_header stack_hdrs[32];

    for (size_t i = 0; i < b->n; i++) {
        struct hub_ingest_rec *r = &b->recs[i];
        rd_kafka_message_t *m = r->msg;
        size_t nh;
        struct hub_header *h =
            msg_headers(m, stack_hdrs, sizeof(stack_hdrs) / sizeof(stack_hdrs[0]), &nh);

        if (h == NULL) {
            r->ok = 0;
            r->err.reason = HUB_ENVELOPE_INVALID;
            snprintf(r->err.message, sizeof(r->err.message), "out of memory reading headers");
            continue;
        }
        r->ok = hub_envelope_parse(HUB_ENVELOPE_KAFKA, h, nh, m->payload, m->len,
                                   rd_kafka_topic_name(m->rkt), &lim, &r->ev, &r->err) == 0;
        if (!r->ok) {
            rec_refuse(r);
        }
        if (h != stack_hdrs) {
            free(h);
        }
    }
    batch_mark_repeats(b);
}

/* Starts the partition's next batch when it has pending records and none in flight. */
static void part_maybe_start(struct ingest_part *p) {
    struct hub_ingest *ing = p->ing;
    struct ingest_batch *b;
    size_t n;

    if (p->inflight != NULL || p->n_pending == 0 || ing->stopping) {
        return;
    }
    n = p->n_pending < ing->batch_max ? p->n_pending : ing->batch_max;
    b = calloc(1, sizeof(*b));
    if (b == NULL || (b->recs = calloc(n, sizeof(*b->recs))) == NULL) {
        free(b);
        return; /* retried at the next tick */
    }
    b->hub = ing->hub;
    b->pg = ing->hub->pg_ingest;
    b->part = p;
    b->n = n;
    b->started_ns = hub_now_ns();
    uv_timer_init(ing->hub->loop, &b->retry);
    b->retry.data = b;
    for (size_t i = 0; i < n; i++) {
        b->recs[i].msg = p->pending[i];
        p->pending_bytes -= p->pending[i]->len;
        ing->pending_bytes -= p->pending[i]->len;
    }
    memmove(p->pending, p->pending + n, sizeof(*p->pending) * (p->n_pending - n));
    p->n_pending -= n;
    p->inflight = b;
    ing->batches_inflight++;
    batch_parse(b);
    batch_submit(b);
}

/* ------------------------------------------------ HTTP ingest (SPEC §4) -- */

/*
 * HTTP ingest requests share transactions: a request arriving while
 * STORE_INFLIGHT_MAX transactions are running waits, and the waiting ones
 * go together into the next (up to the batch size, whole requests), as
 * records arriving during a partition's batch form its next one.  One
 * transaction per request cost PostgreSQL a commit and a statement each
 * (~2,600 events/s on the 2-core machine).
 */
#define STORE_INFLIGHT_MAX 2

struct store_req {
    struct store_req *next;
    struct hub_ingest_rec *recs; /* the caller's; copied into the group while it runs */
    size_t n;
    hub_ingest_store_cb cb;
    void *arg;
};

struct hub_ingest_queue {
    struct store_req *head, *tail; /* waiting */
    int inflight;                  /* groups running */
    int orphaned;                  /* the hub is finishing: free once idle */
};

/* One shared transaction: its requests and their records, side by side. */
struct store_group {
    struct hub *hub;
    struct hub_ingest_queue *q;
    struct store_req *reqs;
    struct hub_ingest_rec *recs;
    size_t n;
};

static void queue_pump(struct hub *hub, struct hub_ingest_queue *q);

static void queue_free_if_idle(struct hub_ingest_queue *q) {
    if (q->orphaned && q->inflight == 0 && q->head == NULL) {
        free(q);
    }
}

/* Completes every request of list with the outcome why (NULL: each has its verdicts). */
static void reqs_finish(struct store_req *list, const struct hub_pg_outcome *why) {
    while (list != NULL) {
        struct store_req *r = list;
        list = r->next;
        r->cb(r->arg, why);
        free(r);
    }
}

static void group_done(void *arg, const struct hub_pg_outcome *failure) {
    struct store_group *g = arg;
    struct hub_ingest_queue *q = g->q;
    size_t at = 0;

    /* the verdicts (and records the JSON check refused) go back first */
    for (struct store_req *r = g->reqs; r != NULL; r = r->next) {
        memcpy(r->recs, g->recs + at, sizeof(*r->recs) * r->n);
        at += r->n;
    }
    q->inflight--;
    reqs_finish(g->reqs, failure);
    free(g->recs);
    if (q->orphaned) {
        queue_free_if_idle(q);
    } else {
        queue_pump(g->hub, q);
    }
    free(g);
}

/* Starts one shared transaction with the requests at the head of q. */
static void group_start(struct hub *hub, struct hub_ingest_queue *q) {
    size_t cap = (size_t)hub->cfg.ingest_batch_max;
    struct store_group *g = calloc(1, sizeof(*g));
    struct store_req **last = &g->reqs;
    struct ingest_batch *b = calloc(1, sizeof(*b));
    size_t n = 0;

    if (g == NULL || b == NULL) {
        struct store_req *all = q->head;
        q->head = q->tail = NULL;
        free(g);
        free(b);
        reqs_finish(all, &ingest_oom);
        return;
    }
    /* whole requests, up to the batch size (at least one, whatever its size) */
    while (q->head != NULL && (n == 0 || n + q->head->n <= cap)) {
        struct store_req *r = q->head;
        q->head = r->next;
        r->next = NULL;
        *last = r;
        last = &r->next;
        n += r->n;
    }
    if (q->head == NULL) {
        q->tail = NULL;
    }
    g->hub = hub;
    g->q = q;
    g->n = n;
    g->recs = malloc(sizeof(*g->recs) * n);
    if (g->recs == NULL) {
        struct store_req *mine = g->reqs;
        free(g);
        free(b);
        reqs_finish(mine, &ingest_oom);
        return;
    }
    n = 0;
    for (struct store_req *r = g->reqs; r != NULL; r = r->next) {
        memcpy(g->recs + n, r->recs, sizeof(*r->recs) * r->n);
        n += r->n;
    }
    for (size_t i = 0; i < n; i++) {
        struct hub_ingest_rec *rec = &g->recs[i];
        rec->msg = NULL;
        rec->seq = 0;
        rec->old_digest[0] = '\0';
        if (!rec->ok) {
            rec_refuse(rec);
        }
    }
    b->hub = hub;
    b->pg = hub->pg_ingest != NULL ? hub->pg_ingest : hub->pg; /* the delivery role has no
                                                                 ingest pool */
    b->recs = g->recs;
    b->n = n;
    b->started_ns = hub_now_ns();
    b->done = group_done;
    b->done_arg = g;
    q->inflight++;
    batch_mark_repeats(b);
    batch_submit(b); /* group_done runs, whatever happens */
}

static void queue_pump(struct hub *hub, struct hub_ingest_queue *q) {
    while (q->inflight < STORE_INFLIGHT_MAX && q->head != NULL) {
        group_start(hub, q);
    }
}

void hub_ingest_store(struct hub *hub, struct hub_ingest_rec *recs, size_t n,
                      hub_ingest_store_cb cb, void *arg) {
    struct hub_ingest_queue *q = hub->ingest_queue;
    struct store_req *r = calloc(1, sizeof(*r));

    if (q == NULL && r != NULL && (q = hub->ingest_queue = calloc(1, sizeof(*q))) == NULL) {
        free(r);
        r = NULL;
    }
    if (r == NULL) {
        cb(arg, &ingest_oom);
        return;
    }
    r->recs = recs;
    r->n = n;
    r->cb = cb;
    r->arg = arg;
    if (q->tail != NULL) {
        q->tail->next = r;
    } else {
        q->head = r;
    }
    q->tail = r;
    queue_pump(hub, q);
}

void hub_ingest_queue_release(struct hub *hub) {
    struct hub_ingest_queue *q = hub->ingest_queue;

    hub->ingest_queue = NULL;
    if (q != NULL) {
        /* Requests still waiting for a transaction get none: nothing of
         * theirs is stored, and their callers answer (or drop) them now.
         * The running transactions finish (or fail) as the pools close. */
        struct store_req *waiting = q->head;
        q->head = q->tail = NULL;
        q->orphaned = 1;
        reqs_finish(waiting, &ingest_closing);
        queue_free_if_idle(q);
    }
}

/* ------------------------------------------------------------- consumer -- */

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque) {
    struct hub_ingest *ing = opaque;

    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        for (int i = 0; i < parts->cnt; i++) {
            struct ingest_part *p = part_find(ing, parts->elems[i].topic,
                                              parts->elems[i].partition, 1);
            if (p != NULL) {
                p->assigned = 1;
                p->paused = 0;
            }
        }
        rd_kafka_assign(rk, parts);
        ing->ready = 1;
        hub_log(HUB_INFO, "kafka partitions assigned", HUB_LI("count", parts->cnt));
    } else {
        for (int i = 0; i < parts->cnt; i++) {
            struct ingest_part *p = part_find(ing, parts->elems[i].topic,
                                              parts->elems[i].partition, 0);
            if (p != NULL) {
                /* The next owner starts from the committed offset; what we hold
                 * and have not stored yet is simply read again there. */
                p->assigned = 0;
                p->paused = 0;
                part_drop_pending(p);
            }
        }
        rd_kafka_assign(rk, NULL);
        hub_log(HUB_INFO, "kafka partitions revoked", HUB_LI("count", parts->cnt),
                HUB_LS("reason", rd_kafka_err2str(err)));
    }
}

static void commit_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                      rd_kafka_topic_partition_list_t *offsets, void *opaque) {
    struct hub_ingest *ing = opaque;
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR && err != RD_KAFKA_RESP_ERR__NO_OFFSET) {
        ing->hub->metrics.ingest_commit_failures++;
        hub_log(HUB_WARN, "offset commit failed", HUB_LS("error", rd_kafka_err2str(err)));
    }
}

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
    if (p == NULL || !p->assigned || part_push(p, m) != 0) {
        /* not ours (a late record of a revoked partition) or OOM: the owner
         * reads it again from the committed offset */
        rd_kafka_message_destroy(m);
        return;
    }
}

/* Takes what the consumer queue holds, up to a budget per loop turn. */
static void ingest_drain(struct hub_ingest *ing) {
    char buf[64];
    int taken = 0;

    if (ing->stopping) {
        return;
    }
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
        part_backpressure(p);
        part_maybe_start(p);
    }
    if (taken == INGEST_POLL_BUDGET) {
        uv_idle_start(&ing->more, ingest_more_cb);
    }
}

static void ingest_more_cb(uv_idle_t *h) {
    uv_idle_stop(h);
    ingest_drain(h->data);
}

static void ingest_wake_cb(uv_poll_t *h, int status, int events) {
    ingest_drain(h->data);
}

static void ingest_tick_cb(uv_timer_t *t) {
    ingest_drain(t->data);
}

static void kafka_error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque) {
    hub_log(HUB_WARN, "kafka error", HUB_LS("error", rd_kafka_err2str(err)),
            HUB_LS("detail", reason));
}

int hub_ingest_start(struct hub *hub, struct hub_ingest **out) {
    struct hub_ingest *ing = calloc(1, sizeof(*ing));
    rd_kafka_conf_t *conf = NULL;
    rd_kafka_topic_partition_list_t *topics = NULL;
    char err[512];
    char num[32], wait[32];

    if (ing == NULL) {
        return -1;
    }
    ing->hub = hub;
    ing->batch_max = (size_t)hub->cfg.ingest_batch_max;
    ing->pipe_fds[0] = ing->pipe_fds[1] = -1;

    conf = hub_kafka_conf_new(&hub->cfg, hub->brokers, err, sizeof(err));
    if (conf == NULL) {
        goto fail_conf;
    }
    snprintf(num, sizeof(num), "%lld", (long long)hub->cfg.kafka_session_timeout_ms);
    snprintf(wait, sizeof(wait), "%lld", (long long)hub->cfg.kafka_fetch_wait_ms);
    if (rd_kafka_conf_set(conf, "group.id", hub->cfg.kafka_group, err, sizeof(err)) ||
        rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof(err)) ||
        rd_kafka_conf_set(conf, "enable.auto.offset.store", "false", err, sizeof(err)) ||
        rd_kafka_conf_set(conf, "auto.offset.reset", "earliest", err, sizeof(err)) ||
        rd_kafka_conf_set(conf, "session.timeout.ms", num, err, sizeof(err)) ||
        rd_kafka_conf_set(conf, "enable.partition.eof", "false", err, sizeof(err)) ||
        /* new topics matching the regex are picked up within seconds */
        rd_kafka_conf_set(conf, "topic.metadata.refresh.interval.ms", "2000", err,
                          sizeof(err)) ||
        /* Bounded prefetch, for the whole consumer queue (librdkafka 2.0
         * measures the forwarded queue): memory stays flat however far behind
         * we are.  Once the queue is full the fetcher stops, and it starts
         * again only when its broker thread next wakes up; the queue must
         * cover that gap.  With 8 MiB, bench/ingest stalled for 100-200 ms at
         * a time (0.5-1.1 of raw); with 24 MiB and a small pending budget
         * (INGEST_PENDING_BYTES) it ran at 1.0-1.1 in the same memory. */
        rd_kafka_conf_set(conf, "queued.max.messages.kbytes", "24576", err, sizeof(err)) ||
        rd_kafka_conf_set(conf, "fetch.wait.max.ms", wait, err, sizeof(err)) ||
        rd_kafka_conf_set(conf, "fetch.max.bytes", "8388608", err, sizeof(err))) {
        goto fail_conf;
    }
    snprintf(num, sizeof(num), "%lld", (long long)hub->cfg.kafka_session_timeout_ms / 3);
    if (rd_kafka_conf_set(conf, "heartbeat.interval.ms", num, err, sizeof(err))) {
        goto fail_conf;
    }
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
        goto fail_rk;
    }
    rd_kafka_queue_io_event_enable(ing->queue, ing->pipe_fds[1], "1", 1);

    topics = hub_kafka_topic_list(hub->cfg.kafka_topics);
    if (topics == NULL) {
        snprintf(err, sizeof(err), "STREAMING_HUB_KAFKA_TOPICS is empty");
        goto fail_rk;
    }
    rd_kafka_resp_err_t rerr = rd_kafka_subscribe(ing->rk, topics);
    rd_kafka_topic_partition_list_destroy(topics);
    if (rerr) {
        /* the only input subscribe can refuse is the variable's value */
        snprintf(err, sizeof(err), "STREAMING_HUB_KAFKA_TOPICS: cannot subscribe to '%s': %s",
                 hub->cfg.kafka_topics, rd_kafka_err2str(rerr));
        goto fail_rk;
    }

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
    hub_log(HUB_ERROR, "kafka consumer not started", HUB_LS("error", err));
    free(ing);
    return -1;
}

static void ingest_handle_closed(uv_handle_t *h) {
    struct hub_ingest *ing = h->data;
    if (--ing->open_handles == 0 && ing->batches_inflight == 0) {
        ingest_finish_stop(ing);
    }
}

/* Runs once no batch is in flight and every handle is closed. */
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
    /* Batches waiting in retry give up now (their records replay on the next
     * start); batches with a transaction outstanding finish and commit. */
    for (struct ingest_part *p = ing->parts; p != NULL; p = p->next) {
        if (p->inflight != NULL && !p->inflight->in_txn) {
            uv_timer_stop(&p->inflight->retry);
            batch_release(p->inflight);
        }
    }
    uv_poll_stop(&ing->wake);
    uv_close((uv_handle_t *)&ing->wake, ingest_handle_closed);
    uv_close((uv_handle_t *)&ing->tick, ingest_handle_closed);
    uv_close((uv_handle_t *)&ing->more, ingest_handle_closed);
}

int hub_ingest_ready(const struct hub_ingest *ing) {
    return ing != NULL && ing->ready;
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
        n += (long)p->n_pending + (p->inflight ? (long)p->inflight->n : 0);
    }
    return n;
}
