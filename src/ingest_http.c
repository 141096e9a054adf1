/*
 * ingest_http — the queue of HTTP ingest requests (SPEC §4): requests that
 * arrive together share one transaction (see ingest.h, hub_ingest_store).
 *
 * A request's records stay the caller's (api_events.c) throughout: a group
 * copies them side by side into one array for the batch writer, and copies
 * them back, verdicts and all, before it calls the requests' callbacks.
 *
 *   hub_ingest_store() ──► request queued ──► queue_pump(): room for
 *   another group? ──► group_start(): the requests at
 *   the head, whole, up to the batch size ──► ingest_batch_start()
 *   ──► group_stored() / group_failed() ──► group_done(): records copied
 *   back, each request's callback, the next group.
 */
#include "ingest.h"

#include <stdlib.h>
#include <string.h>

#include "hub.h"
#include "ingest_batch.h"
#include "util.h"

/*
 * HTTP ingest requests share transactions: a request arriving while
 * STORE_INFLIGHT_MIN transactions are running waits, and the waiting ones
 * go together into the next (up to the batch size, whole requests), as
 * records arriving during a partition's batch form its next one.  One
 * transaction per request costs PostgreSQL a commit and a statement each.
 *
 * Adaptive group commit: as concurrency grows, more requests arrive while
 * those two run than one group should wait for, and each group waits for a
 * commit (its fsync) more than for CPU.  A further transaction (up to
 * STREAMING_HUB_INGEST_HTTP_TXNS) starts only once STORE_GROUP_MIN
 * records wait: a few clients still share two transactions as before,
 * many get more commits in flight, each of at least STORE_GROUP_MIN
 * events, so PostgreSQL's cost per event does not grow with them.  The
 * figures, and the other limits tried: docs/performance.md, "HTTP ingest".
 *
 * Groups start at the end of a loop turn (hub->ingest_turn, a uv_check_t),
 * not as each request arrives or a group ends: the requests read in one
 * turn go together.  Started on arrival, the first of a turn's requests
 * went alone into a transaction of its own while STORE_INFLIGHT_MIN had
 * room.
 */
#define STORE_INFLIGHT_MIN 2
#define STORE_GROUP_MIN 16

/* One waiting or running request. */
struct store_req {
    struct store_req *next;
    struct hub_ingest_rec *recs; /* the caller's; copied into the group while it runs */
    size_t n;
    size_t bytes; /* its records' bytes as received (the body its caller holds) */
    hub_ingest_store_cb cb;
    void *arg;
};

/* hub->ingest_queue: made by the first request, freed at shutdown once idle. */
struct hub_ingest_queue {
    struct store_req *head, *tail; /* waiting */
    size_t waiting;                /* requests in the list */
    size_t waiting_recs;           /* their records */
    size_t bytes;                  /* of the requests waiting or running */
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
    int retried; /* group_failed ran it once more */
};

/* The outcome of requests that never got a transaction because the hub is
 * finishing. */
static const struct hub_pg_outcome ingest_closing = {HUB_PG_ECLOSED, NULL, 0, "shutting down", ""};

static void queue_pump(struct hub *hub, struct hub_ingest_queue *q);

/* The end of a loop turn in which requests were queued or a group ended. */
static void turn_cb(uv_check_t *h) {
    struct hub *hub = h->data;

    uv_check_stop(h);
    if (hub->ingest_queue != NULL) {
        queue_pump(hub, hub->ingest_queue);
    }
}

/* Pumps q once this loop turn's requests are in (at once when the hub is
 * finishing: no turn to wait for). */
static void queue_pump_soon(struct hub *hub, struct hub_ingest_queue *q) {
    if (uv_is_closing((uv_handle_t *)&hub->ingest_turn)) {
        queue_pump(hub, q);
    } else {
        uv_check_start(&hub->ingest_turn, turn_cb);
    }
}

static void queue_free_if_idle(struct hub_ingest_queue *q) {
    if (q->orphaned && q->inflight == 0 && q->head == NULL) {
        free(q);
    }
}

/* Completes every request of list with the outcome why (NULL: each has its
 * verdicts), and frees them.  The callbacks may queue new requests. */
static void reqs_finish(struct store_req *list, const struct hub_pg_outcome *why) {
    while (list != NULL) {
        struct store_req *r = list;
        list = r->next;
        r->cb(r->arg, why);
        free(r);
    }
}

/* 1 when no record of r was settled: nothing of the request is stored. */
static int req_unsettled(const struct store_req *r) {
    for (size_t i = 0; i < r->n; i++) {
        if (!r->recs[i].unsettled) {
            return 0;
        }
    }
    return 1;
}

/*
 * The group's last transaction ended (failure NULL: every record settled
 * but those the API could not parse): give the records back to their
 * requests and complete each with what happened to its own records — its
 * verdicts when any of them is settled, else failure (or, when none failed,
 * the out-of-memory outcome of its unparsed records).  Then start the next
 * group and free g.
 */
static void group_done(void *arg, const struct hub_pg_outcome *failure) {
    struct store_group *g = arg;
    struct hub_ingest_queue *q = g->q;
    struct store_req *list = g->reqs;
    size_t at = 0;

    /* the verdicts (and records the JSON check refused) go back first */
    for (struct store_req *r = g->reqs; r != NULL; r = r->next) {
        memcpy(r->recs, g->recs + at, sizeof(*r->recs) * r->n);
        at += r->n;
        q->bytes -= r->bytes;
    }
    q->inflight--;
    /* each request on its own: the callbacks may queue new requests */
    while (list != NULL) {
        struct store_req *r = list;
        list = r->next;
        r->next = NULL;
        reqs_finish(r, !req_unsettled(r) ? NULL : failure != NULL ? failure : &ingest_outcome_oom);
    }
    free(g->recs);
    if (q->orphaned) {
        queue_free_if_idle(q);
    } else {
        queue_pump_soon(g->hub, q);
    }
    free(g);
}

/* The batch writer's reports (ingest_batch.h).  The batch is the group's
 * own, freed once the group is done; the records are the group's. */
static void group_stored(struct ingest_batch *b) {
    group_done(b->owner_arg, NULL);
    free(b);
}

/* HTTP ingest does not retry: the failure goes to the clients, who do.
 * Save once: a subscription deleted while the transaction ran fails its
 * job's foreign key at the statement's end (23503), which says nothing
 * about any request of the group; run again, the match no longer finds
 * it. */
static void group_failed(struct ingest_batch *b, const struct hub_pg_outcome *out) {
    struct store_group *g = b->owner_arg;

    if (!g->retried && out->status == HUB_PG_ESTMT && strcmp(out->sqlstate, "23503") == 0) {
        g->retried = 1;
        ingest_batch_submit(b);
        return;
    }
    group_done(g, out);
    free(b);
}

static const struct ingest_batch_owner group_owner = {group_stored, group_failed};

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
        q->waiting = 0;
        q->waiting_recs = 0;
        for (struct store_req *r = all; r != NULL; r = r->next) {
            q->bytes -= r->bytes;
        }
        free(g);
        free(b);
        reqs_finish(all, &ingest_outcome_oom);
        return;
    }
    /* whole requests, up to the batch size (at least one, whatever its size) */
    while (q->head != NULL && (n == 0 || n + q->head->n <= cap)) {
        struct store_req *r = q->head;
        q->head = r->next;
        q->waiting--;
        q->waiting_recs -= r->n;
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
        for (struct store_req *r = mine; r != NULL; r = r->next) {
            q->bytes -= r->bytes;
        }
        free(g);
        free(b);
        reqs_finish(mine, &ingest_outcome_oom);
        return;
    }
    n = 0;
    for (struct store_req *r = g->reqs; r != NULL; r = r->next) {
        memcpy(g->recs + n, r->recs, sizeof(*r->recs) * r->n);
        n += r->n;
    }
    /* the results and private members the caller may not have zeroed
     * (the writer sets them) */
    for (size_t i = 0; i < n; i++) {
        struct hub_ingest_rec *rec = &g->recs[i];
        rec->msg = NULL;
        rec->seq = 0;
        rec->unsettled = 0;
        rec->old_digest[0] = '\0';
        rec->state = 0;
        rec->sent = 0;
    }
    b->hub = hub;
    b->pg = hub->pg_ingest;
    b->recs = g->recs;
    b->n = n;
    b->started_ns = hub_now_ns();
    b->owner = &group_owner;
    b->owner_arg = g;
    q->inflight++;
    ingest_batch_start(b); /* group_done runs, whatever happens */
}

/* Starts groups while requests wait: up to STORE_INFLIGHT_MIN whatever
 * their size, then more (up to the configured most) only for groups of
 * STORE_GROUP_MIN records or more. */
static void queue_pump(struct hub *hub, struct hub_ingest_queue *q) {
    int most = (int)hub->cfg.ingest_http_txns;

    while (q->head != NULL && q->inflight < most &&
           (q->inflight < STORE_INFLIGHT_MIN || q->waiting_recs >= STORE_GROUP_MIN)) {
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
        cb(arg, &ingest_outcome_oom);
        return;
    }
    r->recs = recs;
    r->n = n;
    r->cb = cb;
    r->arg = arg;
    for (size_t i = 0; i < n; i++) {
        r->bytes += recs[i].value_len;
    }
    q->bytes += r->bytes;
    q->waiting++;
    q->waiting_recs += n;
    if (q->tail != NULL) {
        q->tail->next = r;
    } else {
        q->head = r;
    }
    q->tail = r;
    queue_pump_soon(hub, q);
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
        q->waiting = 0;
        q->waiting_recs = 0;
        for (struct store_req *r = waiting; r != NULL; r = r->next) {
            q->bytes -= r->bytes;
        }
        q->orphaned = 1;
        reqs_finish(waiting, &ingest_closing);
        queue_free_if_idle(q);
    }
}

size_t hub_ingest_queue_bytes(const struct hub *hub) {
    return hub->ingest_queue != NULL ? hub->ingest_queue->bytes : 0;
}

size_t hub_ingest_queue_waiting(const struct hub *hub) {
    return hub->ingest_queue != NULL ? hub->ingest_queue->waiting : 0;
}

int hub_ingest_queue_idle(const struct hub *hub) {
    const struct hub_ingest_queue *q = hub->ingest_queue;
    return q == NULL || (q->head == NULL && q->inflight == 0);
}
