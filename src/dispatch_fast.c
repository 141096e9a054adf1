/*
 * dispatch_fast — the delivery fast path: jobs leased by the ingest
 * transaction that stored their event, and handed to the dispatcher with
 * the event ingest already holds (see dispatch.h for the contract).
 *
 * In role `all` a fresh event's jobs would otherwise wait for a claim (a
 * tenant sample, a claim transaction, a load of the subscription and of
 * the payload just written): two transactions and a wake-up between the
 * broker's acknowledgement and the request.  Here the insert itself leases
 * the jobs this process can start now, exactly as a claim would (state
 * 'in_flight', lease_owner "<owner>#<serial>", lease_until), so everything
 * after the hand-off is the claimed job's path: the local queue, the
 * policy match on the policy threads, the attempt, the fenced outcome, and
 * after a crash the reclaim of the expired lease (counted, poison after
 * enough of them).
 *
 * What "can start now" means, decided here before the transaction is
 * sent (hub_dispatch_fast_offer) and applied by the statement
 * (store_ingest.h, $18..$24):
 *   - workers free: at most as many jobs as the dispatcher's workers not
 *     busy (in flight, queued, being loaded), and all offers in flight
 *     together no more than a claim keeps in hand (workers and two claim
 *     batches); FAST_PER_RECORD per record of the transaction;
 *   - destination below its cap: a (tenant, origin) lane, and an origin,
 *     take at most what their held slots leave under their caps
 *     (hub_caps_each_room; a lane not in use lately its start limit);
 *   - breaker closed: no job to a (tenant, origin) whose breaker is open
 *     or half-open (a room of 0);
 *   - not fifo (SPEC §7.8: a fifo job may have an earlier job of its
 *     subscription uncommitted in another transaction): fifo jobs are
 *     always claimed;
 *   - no max_rate: the bucket is per subscription and the subscriptions an
 *     event matches are known only in the statement, so a rate-limited
 *     subscription's jobs are claimed (a token is never taken twice);
 *   - enabled and verified: the statement's matching already requires it.
 *
 * Each offer takes a claim serial of its own, so its jobs' outcomes are
 * fenced like a claim's.  The hand-off runs only once the transaction
 * committed (hub_dispatch_ingested); one that failed or rolled back drops
 * its offer (hub_dispatch_fast_drop) and nothing of it is delivered.  An
 * outcome unknown (the connection lost at the commit) also drops it: jobs
 * it may have committed are reclaimed when their lease expires.
 */
#include <libpq-fe.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "breaker.h"
#include "config.h"
#include "dispatch_caps.h"
#include "dispatch_int.h"
#include "envelope.h"
#include "hub.h"
#include "log.h"
#include "store_ingest.h"

/* An offer's jobs per record of its transaction (an event matching more
 * subscriptions has the rest claimed), and at least this many. */
#define FAST_PER_RECORD 4
#define FAST_MIN 4
/* A tenant's open or half-open breakers an offer blocks by name (a room of
 * 0 for their pairs).  Past them its jobs to the others are leased too, and
 * shed by their attempts as claimed ones would be: the cost of a tenant's
 * outage stays that tenant's (and the offer's work O(tenants with open
 * breakers), never O(breakers)).  A process-wide cut-off at 8 open
 * breakers let one tenant turn the fast path off for every tenant. */
#define FAST_TENANT_BREAKERS 8

/* An offer: what one ingest transaction may lease, until its callback. */
struct hub_dispatch_fast {
    struct hub_dispatch *d;
    struct claim_stamp stamp; /* the serial of its lease; ms: when offered */
    size_t budget;            /* counted in d->fast_reserved until taken or dropped */
    char owner[sizeof(((struct hub_dispatch *)0)->owner) + 24];
};

/* hub_caps_each_room's callback: how many jobs one pair (tenant NULL: an
 * origin, for all its tenants) may still take. */
static void room_entry(void *arg, const char *tenant, int64_t origin, int room) {
    struct hub_store_ingest_fast *p = arg;
    hub_pgarr_add_text(&p->room_tenants, tenant);
    hub_pgarr_add_i64(&p->room_origins, origin);
    hub_pgarr_add_i32(&p->rooms, room);
}

/* hub_breakers_each_open's callback: an open or half-open breaker gives
 * its (tenant, origin) pair a room of 0; its tag is the origin's id (any
 * 64-bit value but 0: hub_origin_id, migrations/0013), kept by the outcomes
 * that opened it (a job of no named origin, id 0, tags none: not listed,
 * and a job leased to it is shed by the attempt, as a claimed one would
 * be). */
static void block_breaker(void *arg, const char *tenant, const char *origin, int64_t origin_id) {
    (void)origin;
    room_entry(arg, tenant, origin_id, 0);
}

struct hub_dispatch_fast *hub_dispatch_fast_offer(struct hub_dispatch *d, size_t records,
                                                  struct hub_store_ingest_fast *p) {
    struct hub_dispatch_fast *f;
    size_t workers, held, room, budget, want;

    hub_store_ingest_fast_init(p);
    if (d == NULL || d->stopping || !d->hub->cfg.dispatch_fast_path || d->hub->httpc == NULL) {
        return NULL;
    }
    workers = (size_t)d->hub->cfg.dispatch_workers;
    held = d->inflight + d->n_queue + d->loading;
    /* what the offers in flight may lease together: the workers free and
     * the claim's run-ahead (two claim batches), as much as a claim keeps
     * in hand; each offer its records' worth (FAST_PER_RECORD jobs each),
     * so that the partitions' transactions in flight at once all get some */
    room = workers + 2 * (size_t)d->hub->cfg.dispatch_claim_batch;
    room = room > held + d->fast_reserved ? room - held - d->fast_reserved : 0;
    budget = workers > held ? workers - held : 0;
    budget = budget < room ? budget : room;
    want = records * FAST_PER_RECORD > FAST_MIN ? records * FAST_PER_RECORD : FAST_MIN;
    budget = budget < want ? budget : want;
    if (budget == 0 || (f = calloc(1, sizeof(*f))) == NULL) {
        return NULL; /* busy (or out of memory): the claim takes them */
    }
    f->d = d;
    f->budget = budget;
    f->stamp.ms = dispatch_unix_ms(); /* before the lease starts: never thought longer */
    f->stamp.serial = ++d->claim_serial;
    snprintf(f->owner, sizeof(f->owner), "%s#%llu", d->owner, (unsigned long long)f->stamp.serial);
    p->owner = f->owner;
    p->lease_ms = d->hub->cfg.dispatch_lease_ms;
    p->budget = (int32_t)(f->budget < INT32_MAX ? f->budget : INT32_MAX);
    p->lane_room = (int32_t)d->hub->cfg.dispatch_tenant_origin_start;
    p->origin_room = (int32_t)d->hub->cfg.dispatch_origin_max;
    hub_caps_each_room(d->caps, room_entry, p);
    hub_breakers_each_open(d->breakers, FAST_TENANT_BREAKERS, block_breaker, p);
    d->fast_reserved += f->budget;
    d->fast_offers++;
    return f;
}

/* The offer is over: its budget and its count go back. */
static void offer_end(struct hub_dispatch_fast *f) {
    struct hub_dispatch *d = f->d;

    d->fast_reserved -= f->budget;
    d->fast_offers--;
    free(f);
}

void hub_dispatch_fast_drop(struct hub_dispatch_fast *f) {
    struct hub_dispatch *d;

    if (f == NULL) {
        return;
    }
    d = f->d;
    offer_end(f);
    dispatch_maybe_done(d);
}

/* The value of column col of row i, or NULL for SQL NULL (*len set). */
static const char *col(PGresult *r, int i, int c, size_t *len) {
    if (PQgetisnull(r, i, c)) {
        *len = 0;
        return NULL;
    }
    *len = (size_t)PQgetlength(r, i, c);
    return PQgetvalue(r, i, c);
}

/*
 * The job of leased row i of res and its event ev, in one allocation with
 * its text columns and a copy of the payload (the layout of a claimed job:
 * dispatch_int.h).  Returns it owned, or NULL when out of memory.
 */
static struct job *job_from_fast(struct hub_dispatch *d, PGresult *res, int i,
                                 const struct hub_event *ev, struct claim_stamp stamp) {
    enum { N_ROW = 6, N_EV = 5 };
    static const struct {
        int c;
        size_t off;
    } row_text[N_ROW] = {
        {HUB_INGEST_COL_JOB_URL, offsetof(struct job, url)},
        {HUB_INGEST_COL_JOB_HEADERS_SEALED, offsetof(struct job, headers_sealed)},
        {HUB_INGEST_COL_JOB_SECRET_SEALED, offsetof(struct job, secret_sealed)},
        {HUB_INGEST_COL_JOB_PREV_SECRET_SEALED, offsetof(struct job, prev_secret_sealed)},
        {HUB_INGEST_COL_JOB_POLICY, offsetof(struct job, policy)},
        {HUB_INGEST_COL_JOB_SCHEMA_VERSION, offsetof(struct job, schema_version)},
    };
    const char *ev_text[N_EV] = {ev->tenant, ev->id, ev->event_type, ev->content_type,
                                 ev->attrs_json};
    size_t ev_len[N_EV];
    static const size_t ev_off[N_EV] = {
        offsetof(struct job, tenant), offsetof(struct job, event_id),
        offsetof(struct job, event_type), offsetof(struct job, content_type),
        offsetof(struct job, attrs)};
    size_t need = sizeof(struct job) + ev->payload_len + 1, len;
    const char *v;
    struct job *j;
    char *p;

    for (int k = 0; k < N_ROW; k++) {
        need += col(res, i, row_text[k].c, &len) ? len + 1 : 0;
    }
    for (int k = 0; k < N_EV; k++) {
        /* the attributes are not NUL-terminated: their length is known */
        ev_len[k] = ev_text[k] == NULL ? 0
                    : k == N_EV - 1    ? ev->attrs_json_len
                                       : strlen(ev_text[k]);
        need += ev_text[k] ? ev_len[k] + 1 : 0;
    }
    if ((j = calloc(1, need)) == NULL) {
        return NULL;
    }
    p = (char *)(j + 1);
    for (int k = 0; k < N_ROW; k++) {
        if ((v = col(res, i, row_text[k].c, &len)) != NULL) {
            memcpy(p, v, len);
            p[len] = '\0';
            *(char **)((char *)j + row_text[k].off) = p;
            p += len + 1;
        }
    }
    for (int k = 0; k < N_EV; k++) {
        if (ev_text[k] != NULL) {
            memcpy(p, ev_text[k], ev_len[k]);
            p[ev_len[k]] = '\0';
            *(char **)((char *)j + ev_off[k]) = p;
            p += ev_len[k] + 1;
        }
    }
    /* the bytes ingest stored: no second read of them */
    j->payload = (unsigned char *)p;
    j->payload_len = ev->payload_len;
    if (ev->payload_len > 0) {
        memcpy(p, ev->payload, ev->payload_len);
    }
    j->d = d;
    j->id = atoll(PQgetvalue(res, i, HUB_INGEST_COL_JOB));
    snprintf(j->sub_id, sizeof(j->sub_id), "%s", PQgetvalue(res, i, HUB_INGEST_COL_JOB_SUB));
    if ((v = col(res, i, HUB_INGEST_COL_JOB_RETRY_SCHEDULE, &len)) != NULL) {
        int n = hub_duration_list_parse(v, j->schedule, HUB_RETRY_MAX_STEPS);
        /* as a claimed job's: a malformed schedule falls back to the curve */
        j->n_schedule = n > 0 && hub_backoff_schedule_valid(j->schedule, (size_t)n) ? (size_t)n : 0;
        j->schedule_malformed = j->n_schedule == 0;
    }
    j->max_rate = 0; /* the statement leases no job of a rate-limited subscription */
    j->schema_major = ev->schema_major;
    j->origin_id = atoll(PQgetvalue(res, i, HUB_INGEST_COL_JOB_ORIGIN));
    j->due_unix_ms = stamp.ms;
    j->claim = stamp;
    return j;
}

void hub_dispatch_ingested(struct hub_dispatch *d, struct hub_dispatch_fast *f, PGresult *res,
                           const struct hub_event *(*event_of)(void *arg, int ord), void *arg) {
    int rows = res != NULL ? PQntuples(res) : 0;
    int pending = 0, made = 0;

    if (d == NULL) {
        return; /* no dispatcher here (role ingest): no offer either */
    }
    for (int i = 0; i < rows; i++) {
        const struct hub_event *ev;
        struct job *j;
        if (PQgetisnull(res, i, HUB_INGEST_COL_JOB)) {
            /* a record's row: jobs left for the claim? */
            pending |= !PQgetisnull(res, i, HUB_INGEST_COL_JOBS_PENDING) &&
                       atoll(PQgetvalue(res, i, HUB_INGEST_COL_JOBS_PENDING)) > 0;
            continue;
        }
        if (f == NULL) {
            continue; /* never expected: nothing was offered */
        }
        ev = event_of(arg, atoi(PQgetvalue(res, i, HUB_INGEST_COL_ORD)));
        j = ev != NULL ? job_from_fast(d, res, i, ev, f->stamp) : NULL;
        if (j == NULL) {
            /* out of memory (or a row that names no event of the batch):
             * given back at once rather than left to its lease's expiry */
            dispatch_outcome_unattempted(d, atoll(PQgetvalue(res, i, HUB_INGEST_COL_JOB)),
                                         PQgetvalue(res, i, HUB_INGEST_COL_JOB_SUB),
                                         f->stamp.serial, "pending", 0);
            continue;
        }
        j->slot = hub_caps_hold(d->caps, j->tenant, j->origin_id, f->stamp.ms);
        d->hub->metrics.dispatch_jobs_fast++;
        dispatch_queue_take(d, j);
        made = 1;
    }
    if (f != NULL) {
        offer_end(f);
    }
    if (pending || res == NULL) {
        hub_dispatch_kick(d); /* the rest wait for a claim */
    }
    if (made) {
        dispatch_pump(d); /* stopping: they go back at once, unattempted */
    }
    dispatch_maybe_done(d);
}
