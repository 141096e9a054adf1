/*
 * dispatch_claim — claim scheduling (see dispatch_int.h for the parts).
 *
 * The cycle: a tenant sample (hub_sql_dispatch_due_tenants) lists the
 * tenants with due jobs, each with its lanes (the destination origins it
 * has due jobs for); each claim offers a window of the tenants in rotation
 * order, each tenant its share spread over its lanes with room under the
 * destinations' caps (dispatch_caps.h), each lane from its floor, and
 * leases a batch of their oldest due jobs.  A lane at its cap is not
 * offered: its backlog is not read, and its jobs wait here only as its
 * run-ahead (dispatch_caps.h).  A claim either reads what the attempts
 * need itself (the lookup forms), or, in a backlog, leaves that to a load
 * on another connection while the next claim runs.  The jobs it yields wait
 * in a local queue, popped round-robin across tenants by dispatch_pump() as
 * workers free up.
 *
 * Each claimed job holds a slot of its lane from the claim's result on
 * (claim_slots) until it is freed (dispatch_job_free), whatever happens in
 * between: a row whose job is never made gives its slot back at once.
 *
 * Claims and tenant samples run one at a time on the claim connection
 * (d->claiming); d->claim_serial numbers the claims (and the fast path's
 * offers, dispatch_fast.c), and each job carries
 * the serial of the one that leased it (its lease owner is
 * "<owner>#<serial>", the fence of its outcome).
 */
#include <libpq-fe.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "breaker.h"
#include "dispatch_caps.h"
#include "dispatch_int.h"
#include "hub.h"
#include "log.h"
#include "netguard.h"
#include "pg.h"
#include "policy.h"
#include "store.h"
#include "store_dispatch.h"

#define DISPATCH_IDLE_MS 50 /* claim poll when nothing was due */
/* After a dry claim that took jobs (claim_was_dry) the next one waits this
 * long, or for new jobs to be stored (a kick), not for an attempt to end.
 * In a live stream the fast path leases most jobs and each claim finds the
 * few it left: claiming again at every attempt's end ran ~1,300 claims a
 * second of about one job each at 5,000 events/s (docs/performance.md,
 * "Dry claims").  Another process's ingest cannot kick this one: its jobs
 * wait up to this much longer for a claim. */
#define DISPATCH_DRY_MS 5
/* The tenants a claim rotates through are sampled every DISPATCH_TENANTS_MS,
 * and sooner (not before DISPATCH_TENANTS_MIN_MS) once new jobs were stored
 * or a claim came back short: a tenant's first due job waits at most that
 * long for its turn (SPEC §7.1 allows a second). */
#define DISPATCH_TENANTS_MS 100
#define DISPATCH_TENANTS_MIN_MS 10
#define DISPATCH_TENANTS_MAX 100000
/* A claim offers the next (4 × its batch) sampled tenants of the rotation:
 * with a share of at least two jobs each, that fills a batch even when most
 * of them ran dry since the sample. */
#define DISPATCH_WINDOW_BATCHES 4
/* Lane floors (struct due_lane): how far behind its oldest claimed job a
 * lane's next claim starts, and how often every claim starts from the
 * beginning again. */
#define DISPATCH_FLOOR_MARGIN_US 100000
#define DISPATCH_FLOOR_RESET_MS 1000

/*
 * A (tenant, origin) lane of a tenant of the claim's rotation.  Its floor
 * is where the claim starts reading its due jobs: a claim takes the oldest
 * due jobs first, so none older than the ones it took is left, except jobs
 * another dispatcher had locked (its transaction may roll back) and jobs
 * committed after the claim's snapshot with an older next_attempt_at
 * (transactions that took now() earlier, a subscription enabled again).
 * The floor stays DISPATCH_FLOOR_MARGIN_US behind the
 * oldest job claimed, which covers the latter for any transaction shorter
 * than that, and all floors are cleared every DISPATCH_FLOOR_RESET_MS,
 * which bounds how long any such job waits.
 */
struct due_lane {
    int64_t origin;          /* origin id (delivery_jobs.origin_id) */
    int64_t floor_us;        /* 0: none (the claim passes -infinity) */
    int64_t oldest_us;       /* scratch of claim_floors */
    uint64_t offered_serial; /* the offer_serial of the last claim that offered it */
    int offered;             /* ... and the jobs it offered */
    int taken;               /* scratch of claim_was_dry */
};

/* A tenant of the claim's rotation: its lanes (by origin id) and whether it
 * had open fifo jobs at the sample. */
struct due_tenant {
    char *id;
    int fifo;
    struct due_lane *lanes;
    size_t n_lanes;
    size_t lane_next; /* the tenant's lanes take turns: the first one offered next */
};

static void dispatch_claim(struct hub_dispatch *d);

void dispatch_job_free(struct job *j) {
    /* every job ends here, attempted or not: its slot goes back */
    hub_caps_release(j->d->caps, j->slot, j->slot_started, dispatch_unix_ms());
    free(j->local_excerpt);
    hub_policy_gen_release(j->gen);
    free(j);
}

/* ---------------------------------------------------------------- queue -- */

/* Gives a claimed job back without an attempt and without counting a
 * reclaim: its lease is cleared and it is due again at once.  Takes j. */
static void job_release(struct hub_dispatch *d, struct job *j) {
    dispatch_job_unattempted(d, j, "pending", 0);
}

/* Appends j to the queue, which then owns it.  Returns 0, or -1 when out of
 * memory (j is still the caller's). */
static int queue_push(struct hub_dispatch *d, struct job *j) {
    if (d->n_queue == d->cap_queue) {
        size_t cap = d->cap_queue ? d->cap_queue * 2 : 64;
        struct job **q = realloc(d->queue, sizeof(*q) * cap);
        if (q == NULL) {
            return -1;
        }
        d->queue = q;
        d->cap_queue = cap;
    }
    d->queue[d->n_queue++] = j;
    return 0;
}

void dispatch_queue_drop_subscription(struct hub_dispatch *d, const char *sub_id) {
    size_t kept = 0;
    for (size_t i = 0; i < d->n_queue; i++) {
        struct job *j = d->queue[i];
        if (sub_id == NULL || strcmp(j->sub_id, sub_id) == 0) {
            job_release(d, j);
        } else {
            d->queue[kept++] = j;
        }
    }
    d->n_queue = kept;
}

/* How long a claimed job may wait in the queue and still start: its lease
 * must cover the whole attempt and the outcome's write after it.  A lease
 * not longer than the attempt timeout plus that margin cannot (the start
 * warns); then half the lease, as the attempt may outlive it anyway. */
static int64_t dispatch_start_budget_ms(const struct hub_config *cfg) {
    int64_t budget = cfg->dispatch_lease_ms - cfg->delivery_timeout_ms - DISPATCH_OUTCOME_MARGIN_MS;
    return budget > 0 ? budget : cfg->dispatch_lease_ms / 2;
}

/* What a queued job may do now (job_ready). */
enum job_readiness { JOB_GIVE_BACK = -1, JOB_WAITS = 0, JOB_STARTS = 1 };

/*
 * Whether queued job j may start: its destination has an attempt slot free
 * (or its breaker sheds it: it makes no request), else it waits for one —
 * unless more of its destination's jobs wait than the run-ahead allows now,
 * or it waited past dispatch_start_budget_ms(): then it is given back
 * rather than left to wait, its lease must not run out here (another
 * dispatcher would take it, and the expiry would count as a reclaim).
 */
static enum job_readiness job_ready(struct hub_dispatch *d, const struct job *j, int64_t now) {
    const char *name;

    if (now - j->claim.ms > dispatch_start_budget_ms(&d->hub->cfg)) {
        return JOB_GIVE_BACK;
    }
    if (j->slot == NULL || hub_caps_ready(d->caps, j->slot)) {
        return JOB_STARTS; /* no slot: not counted (out of memory at the claim) */
    }
    name = hub_caps_lane_name(j->slot);
    if (name[0] != '\0' && hub_breaker_sheds(d->breakers, j->tenant, name, now)) {
        return JOB_STARTS;
    }
    if (hub_caps_room(d->caps, j->slot)) {
        /* held back for the other tenants' share of the workers: it waits
         * for workers to free up, and the run-ahead rule (which a hanging
         * destination's lane keeps at 0) would give it back at once, to be
         * claimed again by the next claim */
        return JOB_WAITS;
    }
    return hub_caps_waiting_over(d->caps, j->slot) ? JOB_GIVE_BACK : JOB_WAITS;
}

/*
 * The next job to start, round-robin across tenants: the oldest queued job
 * that may start (job_ready) of the first tenant after the one popped last
 * (wrapping around).  Jobs to give back go back on the way.  Returns the
 * job owned, or NULL when none may start now.
 */
static struct job *queue_pop(struct hub_dispatch *d) {
    size_t best = SIZE_MAX, kept = 0;
    int best_wrapped = 2;
    int64_t now = dispatch_unix_ms();
    struct job *j;

    for (size_t i = 0; i < d->n_queue; i++) {
        const char *t;
        int wrapped;
        enum job_readiness ready = job_ready(d, d->queue[i], now);
        if (ready == JOB_GIVE_BACK) {
            job_release(d, d->queue[i]);
            continue;
        }
        d->queue[kept] = d->queue[i];
        if (ready == JOB_STARTS) {
            t = d->queue[kept]->tenant ? d->queue[kept]->tenant : "";
            wrapped = strcmp(t, d->pop_tenant) <= 0;
            if (best == SIZE_MAX || wrapped < best_wrapped ||
                (wrapped == best_wrapped &&
                 strcmp(t, d->queue[best]->tenant ? d->queue[best]->tenant : "") < 0)) {
                best = kept;
                best_wrapped = wrapped;
            }
        }
        kept++;
    }
    d->n_queue = kept;
    if (best == SIZE_MAX) {
        return NULL;
    }
    j = d->queue[best];
    memmove(d->queue + best, d->queue + best + 1, sizeof(*d->queue) * (d->n_queue - best - 1));
    d->n_queue--;
    snprintf(d->pop_tenant, sizeof(d->pop_tenant), "%s", j->tenant ? j->tenant : "");
    return j;
}

/* The job's held slot turns into an attempt in flight (queue_pop found it
 * may start). */
static void slot_start(struct hub_dispatch *d, struct job *j) {
    if (j->slot != NULL) {
        hub_caps_start(d->caps, j->slot, j->due_unix_ms, dispatch_unix_ms(), &j->slot_epoch);
        j->slot_started = 1;
    }
}

void dispatch_slot_report(struct hub_dispatch *d, const struct job *j,
                          const struct hub_httpc_response *res) {
    enum hub_caps_signal signal = HUB_CAPS_NEUTRAL;

    if (j->slot == NULL || !j->slot_started) {
        return;
    }
    /* an answer is an overload when it says so (hub_caps_status_signal);
     * no answer in time, or a connection refused or reset, is one too; the
     * rest (DNS, TLS, a blocked address, a garbled answer) says nothing
     * about load */
    if (res->error == HUB_HTTPC_OK) {
        signal = hub_caps_status_signal(res->status);
    } else if (res->error == HUB_HTTPC_TIMEOUT || res->error == HUB_HTTPC_CONNECT) {
        signal = HUB_CAPS_OVERLOAD;
    }
    hub_caps_report(d->caps, j->slot, j->slot_epoch, signal, res->duration_ms, dispatch_unix_ms());
}

/* Queued jobs start while workers are free and their destinations have
 * room (queue_pop), then the next claim. */
void dispatch_pump(struct hub_dispatch *d) {
    size_t workers = (size_t)d->hub->cfg.dispatch_workers;
    struct job *j;

    if (d->stopping) {
        /* a claim that was in flight when the stop came: give it all back */
        while (d->n_queue > 0) {
            job_release(d, d->queue[--d->n_queue]);
        }
        return;
    }
    while (!d->stopping && d->inflight < workers && (j = queue_pop(d)) != NULL) {
        slot_start(d, j);
        dispatch_attempt_start(d, j); /* may finish at once (filtered, deferred, shed) */
    }
    dispatch_claim(d);
}

/* ----------------------------------------------------------------- jobs -- */

/*
 * Where a job's columns come from: its row of the claim, its subscription's
 * row and its event's row, of the load or of the claim itself (all binary).
 * Column k of a source is column base + k of its result: k of enum
 * hub_claim_col, hub_load_sub_col and hub_load_event_col; the base is 0 in
 * the load's results, HUB_CLAIM_SUB and HUB_CLAIM_EVENT in a claim that did
 * the lookups itself.
 */
enum { ROWS_CLAIM, ROWS_SUB, ROWS_EVENT, ROWS_N };
struct job_rows {
    PGresult *r[ROWS_N];
    int i[ROWS_N];
    int base[ROWS_N];
};

/* The value of column col of source src (NULL for SQL NULL), borrowed from
 * the result; *len is set when not NULL. */
static const char *rows_value(const struct job_rows *x, int src, int col, size_t *len) {
    col += x->base[src];
    if (PQgetisnull(x->r[src], x->i[src], col)) {
        return NULL;
    }
    *len = (size_t)PQgetlength(x->r[src], x->i[src], col);
    return PQgetvalue(x->r[src], x->i[src], col);
}

/*
 * A job from its rows, in one allocation with its text columns and its
 * payload: one malloc per job instead of a dozen (the per-column copies
 * were a visible share of the dispatcher's CPU; see docs/performance.md,
 * "Notes moved out of the dispatcher's code").  Returns it owned, or NULL
 * when out of memory.
 */
static struct job *job_from_rows(struct hub_dispatch *d, const struct job_rows *x,
                                 struct claim_stamp claim) {
    enum { N_TEXT = 11 };
    static const struct {
        int src, col;
        size_t off;
    } text[N_TEXT] = {
        {ROWS_CLAIM, HUB_CLAIM_TENANT, offsetof(struct job, tenant)},
        {ROWS_CLAIM, HUB_CLAIM_EVENT_ID, offsetof(struct job, event_id)},
        {ROWS_CLAIM, HUB_CLAIM_EVENT_TYPE, offsetof(struct job, event_type)},
        {ROWS_SUB, HUB_LOAD_SUB_URL, offsetof(struct job, url)},
        {ROWS_SUB, HUB_LOAD_SUB_HEADERS_SEALED, offsetof(struct job, headers_sealed)},
        {ROWS_SUB, HUB_LOAD_SUB_SECRET_SEALED, offsetof(struct job, secret_sealed)},
        {ROWS_SUB, HUB_LOAD_SUB_PREV_SECRET_SEALED, offsetof(struct job, prev_secret_sealed)},
        {ROWS_SUB, HUB_LOAD_SUB_POLICY, offsetof(struct job, policy)},
        {ROWS_EVENT, HUB_LOAD_EVENT_CONTENT_TYPE, offsetof(struct job, content_type)},
        {ROWS_EVENT, HUB_LOAD_EVENT_ATTRS, offsetof(struct job, attrs)},
        {ROWS_EVENT, HUB_LOAD_EVENT_SCHEMA_VERSION, offsetof(struct job, schema_version)},
    };
    size_t need = sizeof(struct job), len = 0;
    const char *payload = rows_value(x, ROWS_EVENT, HUB_LOAD_EVENT_PAYLOAD, &len);
    const char *v;
    struct job *j;
    char *p;

    need += len + 1;
    for (int k = 0; k < N_TEXT; k++) {
        need += rows_value(x, text[k].src, text[k].col, &len) ? len + 1 : 0;
    }
    if ((j = calloc(1, need)) == NULL) {
        return NULL;
    }
    p = (char *)(j + 1);
    for (int k = 0; k < N_TEXT; k++) {
        if ((v = rows_value(x, text[k].src, text[k].col, &len)) != NULL) {
            memcpy(p, v, len);
            p[len] = '\0';
            *(char **)((char *)j + text[k].off) = p;
            p += len + 1;
        }
    }
    /* a bytea in binary: its bytes (in text format it came as hex, twice
     * its size, to be encoded by the server and decoded here) */
    j->payload = (unsigned char *)p;
    if (payload != NULL) {
        rows_value(x, ROWS_EVENT, HUB_LOAD_EVENT_PAYLOAD, &j->payload_len);
        memcpy(p, payload, j->payload_len);
    }
    j->d = d;
    j->id = atoll(rows_value(x, ROWS_CLAIM, HUB_CLAIM_ID, &len));
    snprintf(j->sub_id, sizeof(j->sub_id), "%s", rows_value(x, ROWS_CLAIM, HUB_CLAIM_SUB_ID, &len));
    j->attempt_count = atoi(rows_value(x, ROWS_CLAIM, HUB_CLAIM_ATTEMPT_COUNT, &len));
    if ((v = rows_value(x, ROWS_SUB, HUB_LOAD_SUB_RETRY_SCHEDULE, &len)) != NULL) {
        int n = hub_duration_list_parse(v, j->schedule, HUB_RETRY_MAX_STEPS);
        /* a malformed schedule falls back to the default curve, counted
         * when a retry uses it (SPEC §7.4) */
        j->n_schedule = n > 0 && hub_backoff_schedule_valid(j->schedule, (size_t)n) ? (size_t)n : 0;
        j->schedule_malformed = j->n_schedule == 0;
    }
    j->max_rate = (v = rows_value(x, ROWS_SUB, HUB_LOAD_SUB_MAX_RATE, &len)) != NULL ? atof(v) : 0;
    j->schema_major =
        (v = rows_value(x, ROWS_EVENT, HUB_LOAD_EVENT_SCHEMA_MAJOR, &len)) != NULL ? atoi(v) : 0;
    j->origin_id = (v = rows_value(x, ROWS_CLAIM, HUB_CLAIM_ORIGIN, &len)) != NULL ? atoll(v) : 0;
    j->due_unix_ms = (v = rows_value(x, ROWS_CLAIM, HUB_CLAIM_DUE_US, &len)) != NULL
                         ? atoll(v) / 1000
                         : claim.ms;
    j->claim = claim;
    return j;
}

void dispatch_queue_take(struct hub_dispatch *d, struct job *j) {
    if (j->slot != NULL && hub_caps_lane_name(j->slot)[0] == '\0') {
        /* the origin's first job: its name, for the metrics and to ask its
         * breakers (keyed by the name) */
        struct hub_url u;
        if (j->url != NULL && hub_url_parse(j->url, &u) == 0) {
            hub_caps_name(d->caps, j->slot, u.origin);
        }
    }
    if (queue_push(d, j) != 0) {
        dispatch_job_free(j); /* releases the slot */
    }
}

/* Makes a job of x and queues it, the job taking the slot *slot held for
 * its claim row (*slot is then NULL).  Out of memory, the lease expires and
 * the job is reclaimed later, and *slot is left to the caller. */
static void queue_job(struct hub_dispatch *d, const struct job_rows *x, struct claim_stamp claim,
                      struct hub_cap_lane **slot) {
    struct job *j = job_from_rows(d, x, claim);

    if (j == NULL) {
        return;
    }
    j->slot = *slot;
    *slot = NULL;
    d->hub->metrics.dispatch_jobs_claimed++;
    dispatch_queue_take(d, j);
}

/* Releases the slots of a claim's rows that did not become jobs (rows
 * entries of slots, NULL where a job took its slot), and frees slots. */
static void slots_release(struct hub_dispatch *d, struct hub_cap_lane **slots, int rows) {
    for (int i = 0; slots != NULL && i < rows; i++) {
        hub_caps_release(d->caps, slots[i], 0, dispatch_unix_ms());
    }
    free(slots);
}

/* Queues the jobs of a claim that looked up what their attempts need; the
 * rows' slots go to their jobs (what is left is the caller's). */
static void claim_jobs(struct hub_dispatch *d, PGresult *r, int rows, struct claim_stamp stamp,
                       struct hub_cap_lane **slots) {
    for (int i = 0; i < rows; i++) {
        struct job_rows x = {{r, r, r}, {i, i, i}, {0, HUB_CLAIM_SUB, HUB_CLAIM_EVENT}};
        struct hub_cap_lane *none = NULL;
        size_t len;
        if (rows_value(&x, ROWS_SUB, HUB_LOAD_SUB_ID, &len) == NULL) {
            continue; /* its subscription went, and the job with it */
        }
        if (rows_value(&x, ROWS_EVENT, HUB_LOAD_EVENT_KEY, &len) == NULL) {
            /* its event is gone (retention dropped the day) */
            dispatch_outcome_expired(d, atoll(PQgetvalue(r, i, HUB_CLAIM_ID)),
                                     PQgetvalue(r, i, HUB_CLAIM_SUB_ID), stamp.serial);
            continue;
        }
        queue_job(d, &x, stamp, slots != NULL ? &slots[i] : &none);
    }
}

/* ----------------------------------------------------------------- load -- */

/* A claim's jobs between their lease and the queue: owns a copy of the
 * claim's result until the load lands (load_done frees both). */
struct load {
    struct hub_dispatch *d;
    PGresult *claim;             /* a copy of the claim's result */
    struct hub_cap_lane **slots; /* the slot of each claim row, until a job takes it */
    struct claim_stamp stamp;
    int days; /* event statements: one per day of the batch */
};

/* A subscription id and its row (of the claim or of the load). */
struct sub_row {
    const char *id;
    int row;
};

static int sub_row_cmp(const void *a, const void *b) {
    return strcmp(((const struct sub_row *)a)->id, ((const struct sub_row *)b)->id);
}

/* Rows of r by their subscription id (column col), sorted; malloc'd (the ids
 * borrowed from r), NULL on OOM. */
static struct sub_row *sub_rows_sorted(PGresult *r, int col) {
    int n = PQntuples(r);
    struct sub_row *s = malloc(sizeof(*s) * (size_t)(n > 0 ? n : 1));
    if (s != NULL) {
        for (int i = 0; i < n; i++) {
            s[i].id = PQgetvalue(r, i, col);
            s[i].row = i;
        }
        qsort(s, (size_t)n, sizeof(*s), sub_row_cmp);
    }
    return s;
}

/* Gives a claim's jobs back unattempted (no reclaim counted). */
static void load_release(struct hub_dispatch *d, PGresult *claim, uint64_t serial) {
    for (int i = 0; i < PQntuples(claim); i++) {
        dispatch_outcome_unattempted(d, atoll(PQgetvalue(claim, i, HUB_CLAIM_ID)),
                                     PQgetvalue(claim, i, HUB_CLAIM_SUB_ID), serial, "pending", 0);
    }
}

/* Queues the jobs of one day's events of a load (see load_done): each event
 * row names its job's row of the claim, whose subscription is found in subs
 * through by_id. */
static void load_events(struct hub_dispatch *d, const struct load *l, PGresult *subs,
                        const struct sub_row *by_id, PGresult *evs, unsigned char *found) {
    int rows = PQntuples(l->claim);
    struct hub_cap_lane *none;

    for (int e = 0; evs != NULL && e < PQntuples(evs); e++) {
        struct job_rows x = {{l->claim, subs, evs},
                             {atoi(PQgetvalue(evs, e, HUB_LOAD_EVENT_KEY)) - 1, 0, e},
                             {0, 0, 0}};
        struct sub_row key, *s;
        if (x.i[ROWS_CLAIM] < 0 || x.i[ROWS_CLAIM] >= rows) {
            continue;
        }
        found[x.i[ROWS_CLAIM]] = 1;
        key.id = PQgetvalue(l->claim, x.i[ROWS_CLAIM], HUB_CLAIM_SUB_ID);
        s = bsearch(&key, by_id, (size_t)PQntuples(subs), sizeof(*by_id), sub_row_cmp);
        if (s == NULL) {
            continue;
        }
        x.i[ROWS_SUB] = s->row;
        none = NULL;
        queue_job(d, &x, l->stamp, l->slots != NULL ? &l->slots[x.i[ROWS_CLAIM]] : &none);
    }
}

/* The load's transaction ended: queues the jobs it found, or gives the
 * claim's jobs back when it failed.  Frees l. */
static void load_done(void *arg, const struct hub_pg_outcome *out) {
    struct load *l = arg;
    struct hub_dispatch *d = l->d;
    int rows = PQntuples(l->claim);
    PGresult *subs = out->n_results == 1 + l->days ? out->results[0] : NULL;
    struct sub_row *by_id = NULL;
    unsigned char *found = NULL; /* per claimed row: its event was read */

    d->loading -= (size_t)rows;
    if (out->status != HUB_PG_OK || subs == NULL ||
        (by_id = sub_rows_sorted(subs, HUB_LOAD_SUB_ID)) == NULL ||
        (found = calloc((size_t)rows + 1, 1)) == NULL) {
        hub_log(HUB_WARN, "claimed jobs could not be loaded: released",
                HUB_LS("error", out->status != HUB_PG_OK ? out->error : "out of memory"),
                HUB_LI("jobs", rows));
        load_release(d, l->claim, l->stamp.serial);
    } else {
        for (int k = 1; k <= l->days; k++) {
            load_events(d, l, subs, by_id, out->results[k], found);
        }
        /* a job whose event is gone (retention dropped the day) has no
         * row: dead, "expired"; one whose subscription is gone went with
         * it */
        for (int i = 0; i < rows; i++) {
            struct sub_row key = {.id = PQgetvalue(l->claim, i, HUB_CLAIM_SUB_ID)};
            if (!found[i] && bsearch(&key, by_id, (size_t)PQntuples(subs), sizeof(*by_id),
                                     sub_row_cmp) != NULL) {
                dispatch_outcome_expired(d, atoll(PQgetvalue(l->claim, i, HUB_CLAIM_ID)), key.id,
                                         l->stamp.serial);
            }
        }
    }
    free(found);
    free(by_id);
    /* the rows that made no job (given back, or left leased for the
     * reclaim): their slots */
    slots_release(d, l->slots, rows);
    PQclear(l->claim);
    free(l);
    dispatch_pump(d); /* stopping: the loaded jobs go back at once */
    dispatch_maybe_done(d);
}

/* Adds to txn the events statement of the claim rows (r) whose day is day.
 * Returns 0, or -1 when out of memory. */
static int load_add_day(struct hub_pg_txn *txn, PGresult *r, const int *row_day, int rows,
                        int day) {
    static const int formats[HUB_LOAD_EVENTS_NPARAMS] = {1, 1, 0};
    struct hub_pgarr seqs, ords;
    const char *params[HUB_LOAD_EVENTS_NPARAMS];
    int lengths[HUB_LOAD_EVENTS_NPARAMS] = {0, 0, 0};
    char text[16];
    int rc;

    hub_pgarr_init(&seqs, HUB_OID_INT8);
    hub_pgarr_init(&ords, HUB_OID_INT4);
    for (int i = 0; i < rows; i++) {
        if (row_day[i] == day) {
            hub_pgarr_add_i64(&seqs, atoll(PQgetvalue(r, i, HUB_CLAIM_EVENT_SEQ)));
            hub_pgarr_add_i32(&ords, i + 1);
        }
    }
    snprintf(text, sizeof(text), "%d", day);
    params[0] = hub_pgarr_finish(&seqs, &lengths[0]);
    params[1] = hub_pgarr_finish(&ords, &lengths[1]);
    params[2] = text;
    rc = params[0] != NULL && params[1] != NULL
             ? hub_pg_txn_add_binary(txn, &hub_sql_dispatch_load_events, HUB_LOAD_EVENTS_NPARAMS,
                                     params, lengths, formats)
             : -1;
    hub_pgarr_free(&seqs);
    hub_pgarr_free(&ords);
    return rc;
}

/*
 * Reads what the attempts of a claim's jobs need (hub_sql_dispatch_load_*)
 * on the load connection, for a claim r of rows jobs that did not look it
 * up.  The claim connection is free for the next claim meanwhile: the claim
 * is the one step of the cycle that runs one at a time, and the lookups
 * were a large part of it.  Borrows r (copies it) and takes slots (the
 * slot of each row); the jobs are queued, or given back, when the load
 * lands.
 */
static void dispatch_load(struct hub_dispatch *d, PGresult *r, int rows, struct claim_stamp stamp,
                          struct hub_cap_lane **slots) {
    static const int formats[1] = {1};
    struct load *l = calloc(1, sizeof(*l));
    struct sub_row *by_id = sub_rows_sorted(r, HUB_CLAIM_SUB_ID);
    int *row_day = malloc(sizeof(*row_day) * (size_t)(rows > 0 ? rows : 1));
    struct hub_pgarr subs;
    const char *sub_ids;
    int sub_len, ok;
    struct hub_pg_txn *txn = NULL;

    if (l == NULL || by_id == NULL || row_day == NULL ||
        (l->claim = PQcopyResult(r, PG_COPYRES_ATTRS | PG_COPYRES_TUPLES)) == NULL) {
        hub_log(HUB_WARN, "claimed jobs could not be loaded: released",
                HUB_LS("error", "out of memory"), HUB_LI("jobs", rows));
        load_release(d, r, stamp.serial);
        slots_release(d, slots, rows);
        free(l);
        free(by_id);
        free(row_day);
        return;
    }
    l->d = d;
    l->stamp = stamp;
    l->slots = slots;
    hub_pgarr_init(&subs, HUB_OID_TEXT);
    for (int i = 0; i < rows; i++) {
        if (i == 0 || strcmp(by_id[i].id, by_id[i - 1].id) != 0) {
            hub_pgarr_add_text(&subs, by_id[i].id);
        }
        row_day[i] = atoi(PQgetvalue(r, i, HUB_CLAIM_EVENT_DAY));
    }
    sub_ids = hub_pgarr_finish(&subs, &sub_len);
    ok = sub_ids != NULL && (txn = hub_pg_txn_new(d->pg_load, load_done, l)) != NULL &&
         hub_pg_txn_add_binary(txn, &hub_sql_dispatch_load_subscriptions, 1, &sub_ids, &sub_len,
                               formats) == 0;
    /* one statement per day, at the day's first row (a batch has one day,
     * two around midnight: the scan back stops at once) */
    for (int i = 0; ok && i < rows; i++) {
        int first = 1;
        for (int k = 0; k < i && first; k++) {
            first = row_day[k] != row_day[i];
        }
        if (first) {
            ok = load_add_day(txn, r, row_day, rows, row_day[i]) == 0;
            l->days++;
        }
    }
    hub_pgarr_free(&subs);
    free(by_id);
    free(row_day);
    if (txn == NULL) {
        load_release(d, l->claim, l->stamp.serial);
        slots_release(d, l->slots, rows);
        PQclear(l->claim);
        free(l);
        return;
    }
    /* a statement that could not be added fails the transaction at submit
     * (or leaves it short of l->days results): load_done then releases the
     * jobs */
    d->loading += (size_t)rows;
    hub_pg_txn_submit(txn); /* load_done runs, whatever happens */
}

/* ---------------------------------------------------------------- claim -- */

/* A claim or tenant sample failed (the database is away): try again soon. */
static void claim_failed(struct hub_dispatch *d, const char *msg, const char *error) {
    hub_log(HUB_WARN, msg, HUB_LS("error", error));
    if (!d->stopping) {
        dispatch_claim_soon(d, 500);
    }
    dispatch_maybe_done(d);
}

static int due_tenant_cmp(const void *key, const void *elem) {
    return strcmp(key, ((const struct due_tenant *)elem)->id);
}

static int due_lane_cmp(const void *key, const void *elem) {
    int64_t a = *(const int64_t *)key, b = ((const struct due_lane *)elem)->origin;
    return (a > b) - (a < b);
}

/* The sampled lane of claim row i (NULL: not sampled, or a fifo head). */
static struct due_lane *claim_row_lane(struct hub_dispatch *d, PGresult *r, int i) {
    struct due_tenant *t;
    int64_t origin;

    if (PQgetvalue(r, i, HUB_CLAIM_FIFO)[0] == 't' || PQgetisnull(r, i, HUB_CLAIM_DUE_US) ||
        PQgetisnull(r, i, HUB_CLAIM_ORIGIN)) {
        return NULL;
    }
    t = bsearch(PQgetvalue(r, i, HUB_CLAIM_TENANT), d->tenants, d->n_tenants, sizeof(*d->tenants),
                due_tenant_cmp);
    origin = atoll(PQgetvalue(r, i, HUB_CLAIM_ORIGIN));
    return t != NULL ? bsearch(&origin, t->lanes, t->n_lanes, sizeof(*t->lanes), due_lane_cmp)
                     : NULL;
}

/* Raises each lane's floor to DISPATCH_FLOOR_MARGIN_US behind the oldest
 * unordered job this claim took from it (fifo heads come from their own
 * index and are not read from a floor). */
static void claim_floors(struct hub_dispatch *d, PGresult *r, int rows) {
    /* pass 0 resets the lanes' scratch, 1 finds their oldest job, 2 moves
     * their floors */
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < rows; i++) {
            struct due_lane *l = claim_row_lane(d, r, i);
            int64_t at;
            if (l == NULL) {
                continue;
            }
            at = atoll(PQgetvalue(r, i, HUB_CLAIM_DUE_US));
            if (pass == 0) {
                l->oldest_us = INT64_MAX;
            } else if (pass == 1) {
                l->oldest_us = at < l->oldest_us ? at : l->oldest_us;
            } else if (l->oldest_us - DISPATCH_FLOOR_MARGIN_US > l->floor_us) {
                l->floor_us = l->oldest_us - DISPATCH_FLOOR_MARGIN_US;
            }
        }
    }
}

/*
 * 1 when claim r (rows jobs) was dry: it offered every sampled lane (none
 * passed over at its cap, for its tenant's share or outside the window, and
 * no fifo heads), and none of them filled what it offered.  Everything due
 * in them was taken: the next claim can only find what was stored since,
 * which kicks it, or what came due since, which its timer finds.
 */
static int claim_was_dry(struct hub_dispatch *d, PGresult *r, int rows) {
    if (d->claim_partial || (size_t)rows >= d->claim_offered) {
        return 0;
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < rows; i++) {
            struct due_lane *l = claim_row_lane(d, r, i);
            if (l == NULL || l->offered_serial != d->offer_serial) {
                return 0;
            }
            if (pass == 0) {
                l->taken = 0;
            } else if (++l->taken >= l->offered) {
                return 0; /* this lane may have more due */
            }
        }
    }
    return 1;
}

/* A slot for each claimed job, held from now on (hub_caps_hold): rows
 * entries, NULL where none could be made.  Returns the array owned, or NULL
 * when out of memory (the jobs are then not counted). */
static struct hub_cap_lane **claim_slots(struct hub_dispatch *d, PGresult *r, int rows) {
    struct hub_cap_lane **slots = calloc((size_t)(rows > 0 ? rows : 1), sizeof(*slots));
    int64_t now = dispatch_unix_ms();

    for (int i = 0; slots != NULL && i < rows; i++) {
        const char *origin =
            PQgetisnull(r, i, HUB_CLAIM_ORIGIN) ? "0" : PQgetvalue(r, i, HUB_CLAIM_ORIGIN);
        slots[i] = hub_caps_hold(d->caps, PQgetvalue(r, i, HUB_CLAIM_TENANT), atoll(origin), now);
    }
    return slots;
}

/* A claim's transaction ended: moves the rotation and the floors, queues
 * its jobs (or starts their load), and schedules the next claim. */
static void claim_done(void *arg, const struct hub_pg_outcome *out) {
    struct hub_dispatch *d = arg;
    PGresult *r = out->n_results > 0 ? out->results[0] : NULL;
    int rows = r ? PQntuples(r) : 0;
    /* one claim at a time: the one that just returned is the last sent */
    struct claim_stamp stamp = {dispatch_unix_ms(), d->claim_sent};

    d->claiming = 0;
    if ((size_t)rows < d->claim_offered) {
        d->tenants_dirty = 1; /* some lane ran dry (or one is missing) */
    }
    if (out->status != HUB_PG_OK) {
        claim_failed(d, "claim failed", out->error);
        return;
    }
    /* the next claim's rotation starts after the furthest tenant served now */
    {
        char cursor[260];
        const char *best = NULL;
        snprintf(cursor, sizeof(cursor), "%s", d->last_tenant);
        for (int i = 0; i < rows; i++) {
            const char *t = PQgetvalue(r, i, HUB_CLAIM_TENANT);
            int wrapped = strcmp(t, cursor) <= 0;
            int best_wrapped = best != NULL && strcmp(best, cursor) <= 0;
            if (best == NULL || wrapped > best_wrapped ||
                (wrapped == best_wrapped && strcmp(t, best) > 0)) {
                best = t;
            }
        }
        if ((size_t)rows < d->claim_offered && d->window_last[0] != '\0') {
            /* the batch did not fill: every tenant of the window had its
             * turn, the next claim offers the next window */
            best = d->window_last;
        }
        if (best != NULL) {
            snprintf(d->last_tenant, sizeof(d->last_tenant), "%s", best);
        }
    }
    claim_floors(d, r, rows);
    /* set before the jobs start: the pump below must not claim again */
    d->claim_dry = !d->kicked && claim_was_dry(d, r, rows);
    if (rows > 0) {
        struct hub_cap_lane **slots = claim_slots(d, r, rows);
        if (!d->claim_full) { /* this claim did the lookups itself */
            claim_jobs(d, r, rows, stamp, slots);
            slots_release(d, slots, rows);
        } else {
            dispatch_load(d, r, rows, stamp, slots);
        }
    }
    /* a full batch means a backlog: the next claim leaves the lookups to
     * the load, so that claims follow each other sooner; a short one means
     * the dispatcher keeps up, and one round trip is the latency.  A batch
     * its lanes' caps made small is not a backlog the claim can take. */
    d->claim_full = (size_t)rows >= d->claim_asked;
    dispatch_pump(d);
    /* rows (or a kick) mean more may be due: claim again at once, unless
     * the claim was dry */
    if (!d->stopping) {
        dispatch_claim_soon(d, d->kicked      ? 0
                               : rows == 0    ? DISPATCH_IDLE_MS
                               : d->claim_dry ? DISPATCH_DRY_MS
                                              : 0);
    }
    d->kicked = 0;
    dispatch_maybe_done(d);
}

/* Frees the tenants of a sample and their lanes. */
static void tenants_free_array(struct due_tenant *t, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(t[i].id);
        free(t[i].lanes);
    }
    free(t);
}

static void tenants_free(struct hub_dispatch *d) {
    tenants_free_array(d->tenants, d->n_tenants);
    d->tenants = NULL;
    d->n_tenants = 0;
}

/* A row of the lane sample, borrowed from its result. */
struct sample_row {
    const char *tenant;
    int64_t origin;
    int lane; /* 0: the tenant's fifo row */
};

/* strcmp order of the tenants, whatever the database's collation
 * (claim_done moves the rotation point by strcmp), then origin order. */
static int sample_row_cmp(const void *a, const void *b) {
    const struct sample_row *x = a, *y = b;
    int c = strcmp(x->tenant, y->tenant);
    return c != 0 ? c : (x->origin > y->origin) - (x->origin < y->origin);
}

/* Carries a tenant's floors and lane turn from its last sample to this one
 * (both lane lists in origin order). */
static void tenant_keep(struct due_tenant *t, const struct due_tenant *old) {
    for (size_t i = 0, k = 0; i < t->n_lanes && k < old->n_lanes;) {
        int64_t a = t->lanes[i].origin, b = old->lanes[k].origin;
        if (a == b) {
            t->lanes[i].floor_us = old->lanes[k].floor_us;
        }
        i += a <= b;
        k += a >= b;
    }
    t->lane_next = t->n_lanes > 0 ? old->lane_next % t->n_lanes : 0;
}

/* The sample's rows as tenants with their lanes, in strcmp order; *n set.
 * NULL when there are none or memory runs out. */
static struct due_tenant *tenants_from_rows(PGresult *r, int rows, size_t *n) {
    struct sample_row *x = malloc(sizeof(*x) * (size_t)(rows > 0 ? rows : 1));
    struct due_tenant *t = calloc((size_t)(rows > 0 ? rows : 1), sizeof(*t));
    size_t nt = 0;

    *n = 0;
    if (x == NULL || t == NULL || rows == 0) {
        free(x);
        free(t);
        return NULL;
    }
    for (int i = 0; i < rows; i++) {
        x[i].tenant = PQgetvalue(r, i, HUB_DUE_TENANTS_ID);
        x[i].lane = PQgetvalue(r, i, HUB_DUE_TENANTS_FIFO)[0] != 't' &&
                    !PQgetisnull(r, i, HUB_DUE_TENANTS_ORIGIN);
        x[i].origin = x[i].lane ? atoll(PQgetvalue(r, i, HUB_DUE_TENANTS_ORIGIN)) : INT64_MIN;
    }
    qsort(x, (size_t)rows, sizeof(*x), sample_row_cmp);
    for (int i = 0, k; i < rows; i = k) {
        struct due_tenant *u = &t[nt];
        for (k = i; k < rows && strcmp(x[k].tenant, x[i].tenant) == 0; k++) {
            u->fifo |= !x[k].lane;
            u->n_lanes += (size_t)x[k].lane;
        }
        u->id = strdup(x[i].tenant);
        u->lanes = calloc(u->n_lanes > 0 ? u->n_lanes : 1, sizeof(*u->lanes));
        if (u->id == NULL || u->lanes == NULL) {
            free(u->id);
            free(u->lanes);
            memset(u, 0, sizeof(*u));
            continue; /* out of memory: this tenant waits for the next sample */
        }
        u->n_lanes = 0;
        for (int m = i; m < k; m++) {
            if (x[m].lane) {
                u->lanes[u->n_lanes++].origin = x[m].origin;
            }
        }
        nt++;
    }
    free(x);
    *n = nt;
    return t;
}

/* A tenant sample ended: replaces the rotation's tenants and lanes (keeping
 * the floors of the lanes still there) and schedules the claim. */
static void tenants_done(void *arg, const struct hub_pg_outcome *out) {
    struct hub_dispatch *d = arg;
    PGresult *r = out->n_results > 0 ? out->results[0] : NULL;
    int rows = r ? PQntuples(r) : 0;
    struct due_tenant *old = d->tenants;
    size_t n_old = d->n_tenants;

    d->claiming = 0;
    if (out->status != HUB_PG_OK) {
        claim_failed(d, "tenant sample failed", out->error);
        return;
    }
    d->tenants = tenants_from_rows(r, rows, &d->n_tenants);
    /* the floors outlive the sample (both lists are in strcmp order) */
    for (size_t i = 0, k = 0; i < d->n_tenants && k < n_old;) {
        int c = strcmp(d->tenants[i].id, old[k].id);
        if (c == 0) {
            tenant_keep(&d->tenants[i], &old[k]);
        }
        i += c <= 0;
        k += c >= 0;
    }
    tenants_free_array(old, n_old);
    d->tenants_ms = dispatch_unix_ms();
    d->tenants_dirty = d->kicked; /* a kick during the sample may be a new tenant */
    d->kicked = 0;
    if (!d->stopping) {
        dispatch_claim_soon(d, d->n_tenants > 0 ? 0 : DISPATCH_IDLE_MS);
    }
    dispatch_maybe_done(d);
}

/* Samples the tenants with due jobs (hub_sql_dispatch_due_tenants); the
 * claim follows. */
static void dispatch_sample_tenants(struct hub_dispatch *d) {
    char limit[16];
    const char *params[1] = {limit};
    struct hub_pg_txn *txn = hub_pg_txn_new(d->pg_claim, tenants_done, d);

    if (txn == NULL) {
        dispatch_claim_soon(d, DISPATCH_IDLE_MS); /* out of memory: nothing else would */
        return;
    }
    snprintf(limit, sizeof(limit), "%d", DISPATCH_TENANTS_MAX);
    hub_pg_txn_add(txn, &hub_sql_dispatch_due_tenants, 1, params, NULL, NULL);
    d->claiming = 1;
    hub_pg_txn_submit(txn);
}

/* The entries of a claim, as the statement takes them (enum
 * hub_claim_param): owns its arrays until claim_arrays_free. */
struct claim_arrays {
    struct hub_pgarr tenants, origins, floors, fifo, limits, capped_tenants, capped_origins;
    size_t offered;  /* the sum of the entries' limits */
    uint64_t serial; /* the claim's offer_serial */
    int any_fifo;
    int partial;        /* some sampled lane was not offered (caps, share, window) */
    const char *tenant; /* scratch of claim_capped */
};

static void claim_arrays_init(struct claim_arrays *a) {
    memset(a, 0, sizeof(*a));
    hub_pgarr_init(&a->tenants, HUB_OID_TEXT);
    hub_pgarr_init(&a->origins, HUB_OID_INT8);
    hub_pgarr_init(&a->floors, HUB_OID_TIMESTAMPTZ);
    hub_pgarr_init(&a->fifo, HUB_OID_BOOL);
    hub_pgarr_init(&a->limits, HUB_OID_INT4);
    hub_pgarr_init(&a->capped_tenants, HUB_OID_TEXT);
    hub_pgarr_init(&a->capped_origins, HUB_OID_INT8);
}

static void claim_arrays_free(struct claim_arrays *a) {
    hub_pgarr_free(&a->tenants);
    hub_pgarr_free(&a->origins);
    hub_pgarr_free(&a->floors);
    hub_pgarr_free(&a->fifo);
    hub_pgarr_free(&a->limits);
    hub_pgarr_free(&a->capped_tenants);
    hub_pgarr_free(&a->capped_origins);
}

/* One entry: lane l of tenant t, or (l NULL) t's fifo heads; lim jobs at most. */
static void claim_entry(struct claim_arrays *a, const struct due_tenant *t, struct due_lane *l,
                        int lim) {
    hub_pgarr_add_text(&a->tenants, t->id);
    if (l != NULL) {
        hub_pgarr_add_i64(&a->origins, l->origin);
    } else {
        hub_pgarr_add(&a->origins, NULL, 0);
    }
    if (l != NULL && l->floor_us > 0) {
        hub_pgarr_add_ts(&a->floors, l->floor_us);
    } else {
        hub_pgarr_add_i64(&a->floors, INT64_MIN); /* binary timestamptz -infinity */
    }
    hub_pgarr_add_bool(&a->fifo, l == NULL);
    hub_pgarr_add_i32(&a->limits, lim);
    a->any_fifo |= l == NULL;
    a->offered += (size_t)lim;
    if (l != NULL) {
        l->offered_serial = a->serial;
        l->offered = lim;
    }
}

/* hub_caps_each_full's callback: a pair whose fifo heads wait. */
static void claim_capped(void *arg, int64_t origin) {
    struct claim_arrays *a = arg;
    hub_pgarr_add_text(&a->capped_tenants, a->tenant);
    hub_pgarr_add_i64(&a->capped_origins, origin);
}

/* 1 when the breaker of t's lane l sheds its jobs now: they hold no slot
 * for long, so the lane is offered whatever its cap (see hub_caps_offer). */
static int lane_sheds(struct hub_dispatch *d, const struct due_tenant *t, const struct due_lane *l,
                      int64_t now) {
    const char *name = hub_caps_origin_name(d->caps, l->origin);
    return name != NULL && hub_breaker_sheds(d->breakers, t->id, name, now);
}

/* 1 when tenant t has anything the claim may offer: fifo heads, or a lane
 * with room (or shedding). */
static int tenant_offers(struct hub_dispatch *d, const struct due_tenant *t, int64_t now) {
    if (t->fifo) {
        return 1;
    }
    for (size_t k = 0; k < t->n_lanes; k++) {
        if (!hub_caps_full(d->caps, t->id, t->lanes[k].origin, d->offer_serial) ||
            lane_sheds(d, t, &t->lanes[k], now)) {
            return 1;
        }
    }
    return 0;
}

/*
 * Tenant t's entries in the claim: its share, spread over up to `share` of
 * its lanes with room, taking turns (lane_next) when it has more; each lane
 * gets what its and its origin's caps leave (hub_caps_offer books it, so
 * that the lanes of one origin do not offer the same room twice).  Then its
 * fifo heads, but those of the (tenant, origin) pairs left without room.
 */
static void claim_tenant(struct hub_dispatch *d, struct due_tenant *t, size_t share,
                         struct claim_arrays *a, int64_t now) {
    size_t avail = 0, offered = 0, per_lane, next = t->lane_next;

    for (size_t k = 0; k < t->n_lanes; k++) {
        avail += !hub_caps_full(d->caps, t->id, t->lanes[k].origin, d->offer_serial) ||
                 lane_sheds(d, t, &t->lanes[k], now);
    }
    /* each lane offered gets an even part of the share: a tenant with many
     * destinations offers as much as one with a single one */
    avail = avail < share ? avail : share;
    per_lane = avail > 0 ? (share + avail - 1) / avail : 0;
    for (size_t m = 0; m < t->n_lanes && offered < avail; m++) {
        struct due_lane *l = &t->lanes[(t->lane_next + m) % t->n_lanes];
        int lim = hub_caps_offer(d->caps, t->id, l->origin, (int)per_lane, d->offer_serial,
                                 lane_sheds(d, t, l, now), now);
        if (lim > 0) {
            claim_entry(a, t, l, lim);
            offered++;
            next = (t->lane_next + m + 1) % t->n_lanes;
        }
    }
    t->lane_next = next;
    a->partial |= offered < t->n_lanes;
    if (t->fifo) {
        claim_entry(a, t, NULL, (int)share);
        a->tenant = t->id;
        hub_caps_each_full(d->caps, t->id, d->offer_serial, claim_capped, a);
    }
}

/*
 * Keeps up to WORKERS + 2 × CLAIM_BATCH jobs in hand (one claim at a time),
 * claiming in batches of CLAIM_BATCH, and not less than half of one unless
 * workers are idle: the queue must outlast a claim's round trip.  Samples
 * the tenants first when the sample is stale.  Offers only what the
 * destinations' caps leave room for (dispatch_caps.h): when no lane has
 * room, no claim is sent, and the next one waits for an attempt to end (or
 * the idle poll, which samples again).
 */
static void dispatch_claim(struct hub_dispatch *d) {
    /* the four forms of the claim, by [fifo arm][lookups] */
    static const struct hub_sql *const forms[2][2] = {
        {&hub_sql_dispatch_claim, &hub_sql_dispatch_claim_lookup},
        {&hub_sql_dispatch_claim_fifo, &hub_sql_dispatch_claim_fifo_lookup},
    };
    static const int formats[HUB_CLAIM_NPARAMS] = {
        [HUB_CLAIM_PARAM_TENANTS] = 1,        [HUB_CLAIM_PARAM_ORIGINS] = 1,
        [HUB_CLAIM_PARAM_FLOORS] = 1,         [HUB_CLAIM_PARAM_FIFO] = 1,
        [HUB_CLAIM_PARAM_LIMITS] = 1,         [HUB_CLAIM_PARAM_CAPPED_TENANTS] = 1,
        [HUB_CLAIM_PARAM_CAPPED_ORIGINS] = 1,
    };
    static const int arrays[] = {
        HUB_CLAIM_PARAM_TENANTS,        HUB_CLAIM_PARAM_ORIGINS, HUB_CLAIM_PARAM_FLOORS,
        HUB_CLAIM_PARAM_FIFO,           HUB_CLAIM_PARAM_LIMITS,  HUB_CLAIM_PARAM_CAPPED_TENANTS,
        HUB_CLAIM_PARAM_CAPPED_ORIGINS,
    };
    size_t workers = (size_t)d->hub->cfg.dispatch_workers;
    size_t batch = (size_t)d->hub->cfg.dispatch_claim_batch;
    size_t held = d->inflight + d->n_queue + d->loading;
    size_t target = workers + 2 * batch;
    size_t free_slots = target > held ? target - held : 0;
    int64_t age = dispatch_unix_ms() - d->tenants_ms;
    char lease[32], limit[16];
    char owner[sizeof(d->owner) + 24];
    const char *params[HUB_CLAIM_NPARAMS] = {
        [HUB_CLAIM_PARAM_OWNER] = owner,
        [HUB_CLAIM_PARAM_LEASE_MS] = lease,
        [HUB_CLAIM_PARAM_BATCH] = limit,
    };
    int lengths[HUB_CLAIM_NPARAMS] = {0};
    struct claim_arrays a;
    int64_t now = dispatch_unix_ms();
    size_t first = 0, window_max, share, *window, n_window = 0, seen = 0;
    int ok = 1, passed_over = 0;
    struct hub_pg_txn *txn;

    if (d->claiming || d->stopping || free_slots == 0 || d->hub->httpc == NULL || d->claim_dry) {
        return;
    }
    if (free_slots < (batch + 1) / 2 && held >= workers) {
        return; /* every worker has a job: wait for room for a real batch */
    }
    if (d->n_tenants == 0 || age >= DISPATCH_TENANTS_MS || age < 0 ||
        (d->tenants_dirty && age >= DISPATCH_TENANTS_MIN_MS)) {
        dispatch_sample_tenants(d);
        return;
    }
    if (batch > free_slots) {
        batch = free_slots;
    }
    /* rotation: start after the tenant served last */
    while (first < d->n_tenants && strcmp(d->tenants[first].id, d->last_tenant) <= 0) {
        first++;
    }
    if (now - d->floors_ms >= DISPATCH_FLOOR_RESET_MS || now < d->floors_ms) {
        for (size_t i = 0; i < d->n_tenants; i++) {
            for (size_t k = 0; k < d->tenants[i].n_lanes; k++) {
                d->tenants[i].lanes[k].floor_us = 0;
            }
        }
        d->floors_ms = now;
    }
    /* a window of the rotation, not every sampled tenant: a claim costs
     * what its batch needs however many tenants have due jobs.  Tenants
     * whose every lane is at its cap have nothing to offer and take no
     * room in it. */
    window_max = DISPATCH_WINDOW_BATCHES * batch;
    if ((window = malloc(sizeof(*window) * window_max)) == NULL) {
        dispatch_claim_soon(d, DISPATCH_IDLE_MS); /* out of memory: nothing else would */
        return;
    }
    d->offer_serial++;
    for (; seen < d->n_tenants && n_window < window_max; seen++) {
        size_t i = (first + seen) % d->n_tenants;
        if (tenant_offers(d, &d->tenants[i], now)) {
            window[n_window++] = i;
        } else {
            passed_over = 1; /* every lane at its cap */
        }
    }
    snprintf(d->window_last, sizeof(d->window_last), "%s",
             seen < d->n_tenants ? d->tenants[(first + seen - 1) % d->n_tenants].id : "");
    if (n_window == 0) {
        free(window);
        dispatch_claim_soon(d, DISPATCH_IDLE_MS); /* the sample's turn comes with it */
        return;
    }
    /* each tenant offers up to twice its fair share, so that a batch still
     * fills when some have less, and at least two jobs: a tenant's turn
     * costs the claim about as much as a job, so a share of one makes a
     * many-tenant claim dearer per job than a one-tenant claim (see
     * docs/performance.md, "Notes moved out of the dispatcher's code"); a
     * lone tenant may fill the batch alone */
    share = (2 * batch + n_window - 1) / n_window;
    share = share < 2 ? 2 : share;
    share = share > batch ? batch : share;
    claim_arrays_init(&a);
    a.serial = d->offer_serial;
    a.partial = passed_over || seen < d->n_tenants;
    for (size_t w = 0; w < n_window; w++) {
        claim_tenant(d, &d->tenants[window[w]], share, &a, now);
    }
    free(window);
    if (a.offered == 0) {
        claim_arrays_free(&a);
        dispatch_claim_soon(d, DISPATCH_IDLE_MS);
        return;
    }
    {
        struct hub_pgarr *src[] = {&a.tenants, &a.origins,        &a.floors,        &a.fifo,
                                   &a.limits,  &a.capped_tenants, &a.capped_origins};
        for (size_t k = 0; k < sizeof(arrays) / sizeof(arrays[0]); k++) {
            params[arrays[k]] = hub_pgarr_finish(src[k], &lengths[arrays[k]]);
            ok &= params[arrays[k]] != NULL;
        }
    }
    d->claim_asked = batch;
    d->claim_offered = a.offered < batch ? a.offered : batch;
    d->claim_partial = a.partial || a.any_fifo;
    snprintf(lease, sizeof(lease), "%lld", (long long)d->hub->cfg.dispatch_lease_ms);
    snprintf(limit, sizeof(limit), "%zu", d->claim_offered);
    txn = ok ? hub_pg_txn_new(d->pg_claim, claim_done, d) : NULL;
    if (txn != NULL) {
        d->claim_sent = ++d->claim_serial; /* fast offers take serials too */
        snprintf(owner, sizeof(owner), "%s#%llu", d->owner, (unsigned long long)d->claim_serial);
        /* the forms without the fifo arm end at $8 */
        hub_pg_txn_add_binary(txn, forms[a.any_fifo][!d->claim_full],
                              a.any_fifo ? HUB_CLAIM_NPARAMS : HUB_CLAIM_NPARAMS_UNORDERED, params,
                              lengths, formats);
        d->claiming = 1;
        d->hub->metrics.dispatch_claims++;
        hub_pg_txn_submit(txn);
    } else {
        dispatch_claim_soon(d, DISPATCH_IDLE_MS); /* out of memory: nothing else would */
    }
    claim_arrays_free(&a);
}

static void claim_timer_cb(uv_timer_t *t) {
    struct hub_dispatch *d = t->data;

    d->claim_dry = 0;
    dispatch_claim(d);
}

void dispatch_claim_soon(struct hub_dispatch *d, uint64_t delay_ms) {
    uv_timer_start(&d->claim_timer, claim_timer_cb, delay_ms, 0);
}

void dispatch_claim_free(struct hub_dispatch *d) {
    tenants_free(d);
    free(d->queue);
    d->queue = NULL;
}
