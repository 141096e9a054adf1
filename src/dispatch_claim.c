/*
 * dispatch_claim — claim scheduling (see dispatch_int.h for the parts).
 *
 * The cycle: a tenant sample (hub_sql_dispatch_due_tenants) lists the
 * tenants with due jobs; each claim offers a window of them in rotation
 * order, each from its floor, and leases a batch of their oldest due jobs.
 * A claim either reads what the attempts need itself (the lookup forms), or,
 * in a backlog, leaves that to a load on another connection while the next
 * claim runs.  The jobs it yields wait in a local queue, popped round-robin
 * across tenants by dispatch_pump() as workers free up.
 *
 * Claims and tenant samples run one at a time on the claim connection
 * (d->claiming); d->claim_serial numbers the claims, and each job carries
 * the serial of the one that leased it (its lease owner is
 * "<owner>#<serial>", the fence of its outcome).
 */
#include <libpq-fe.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "dispatch_int.h"
#include "hub.h"
#include "log.h"
#include "pg.h"
#include "policy.h"
#include "store.h"
#include "store_dispatch.h"

#define DISPATCH_IDLE_MS 50 /* claim poll when nothing was due */
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
/* Tenant floors (struct due_tenant): how far behind its oldest claimed job
 * a tenant's next claim starts, and how often every claim starts from the
 * beginning again. */
#define DISPATCH_FLOOR_MARGIN_US 100000
#define DISPATCH_FLOOR_RESET_MS 1000

/*
 * A tenant of the claim's rotation.  Its floor is where the claim starts
 * reading its due jobs: a claim takes the oldest due jobs first, so none
 * older than the ones it took is left, except jobs another dispatcher had
 * locked (its transaction may roll back) and jobs committed after the
 * claim's snapshot with an older next_attempt_at (transactions that took
 * now() earlier, or a subscription enabled again).  The floor stays
 * DISPATCH_FLOOR_MARGIN_US behind the oldest job claimed, which covers the
 * latter for any transaction shorter than that, and all floors are cleared
 * every DISPATCH_FLOOR_RESET_MS, which bounds how long any such job waits.
 */
struct due_tenant {
    char *id;
    int fifo;          /* had open fifo jobs at the sample */
    int64_t floor_us;  /* 0: none (the claim passes -infinity) */
    int64_t oldest_us; /* scratch of claim_floors */
};

static void dispatch_claim(struct hub_dispatch *d);

void dispatch_job_free(struct job *j) {
    free(j->shaped_body);
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
        if (strcmp(j->sub_id, sub_id) == 0) {
            job_release(d, j);
        } else {
            d->queue[kept++] = j;
        }
    }
    d->n_queue = kept;
}

/* The next job round-robin across tenants: the oldest queued job of the
 * first tenant after the one popped last (wrapping around).  The queue must
 * not be empty; returns the job owned. */
static struct job *queue_pop(struct hub_dispatch *d) {
    size_t best = 0;
    int best_wrapped = 2;
    struct job *j;

    for (size_t i = 0; i < d->n_queue; i++) {
        const char *t = d->queue[i]->tenant ? d->queue[i]->tenant : "";
        int wrapped = strcmp(t, d->pop_tenant) <= 0;
        if (wrapped < best_wrapped ||
            (wrapped == best_wrapped &&
             strcmp(t, d->queue[best]->tenant ? d->queue[best]->tenant : "") < 0)) {
            best = i;
            best_wrapped = wrapped;
        }
    }
    j = d->queue[best];
    memmove(d->queue + best, d->queue + best + 1, sizeof(*d->queue) * (d->n_queue - best - 1));
    d->n_queue--;
    snprintf(d->pop_tenant, sizeof(d->pop_tenant), "%s", j->tenant ? j->tenant : "");
    return j;
}

/* How long a claimed job may wait in the queue and still start: its lease
 * must cover the whole attempt and the outcome's write after it.  A lease
 * not longer than the attempt timeout plus that margin cannot (the start
 * warns); then half the lease, as the attempt may outlive it anyway. */
static int64_t dispatch_start_budget_ms(const struct hub_config *cfg) {
    int64_t budget = cfg->dispatch_lease_ms - cfg->delivery_timeout_ms - DISPATCH_OUTCOME_MARGIN_MS;
    return budget > 0 ? budget : cfg->dispatch_lease_ms / 2;
}

/*
 * A job that waited in the queue past dispatch_start_budget_ms() is given
 * back rather than started: its lease must not run out during the attempt
 * (another dispatcher would take it, and the expiry would count as a
 * reclaim).
 */
void dispatch_pump(struct hub_dispatch *d) {
    size_t workers = (size_t)d->hub->cfg.dispatch_workers;
    int64_t stale_ms = dispatch_start_budget_ms(&d->hub->cfg);

    if (d->stopping) {
        /* a claim that was in flight when the stop came: give it all back */
        while (d->n_queue > 0) {
            job_release(d, d->queue[--d->n_queue]);
        }
        return;
    }
    while (!d->stopping && d->inflight < workers && d->n_queue > 0) {
        struct job *j = queue_pop(d);
        if (dispatch_unix_ms() - j->claim.ms > stale_ms) {
            job_release(d, j);
            continue;
        }
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
    enum { N_TEXT = 10 };
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
    j->claim = claim;
    return j;
}

/* Makes a job of x and queues it (out of memory, the lease expires and the
 * job is reclaimed later). */
static void queue_job(struct hub_dispatch *d, const struct job_rows *x, struct claim_stamp claim) {
    struct job *j = job_from_rows(d, x, claim);
    if (j != NULL && queue_push(d, j) != 0) {
        dispatch_job_free(j);
    }
}

/* Queues the jobs of a claim that looked up what their attempts need. */
static void claim_jobs(struct hub_dispatch *d, PGresult *r, int rows, struct claim_stamp stamp) {
    for (int i = 0; i < rows; i++) {
        struct job_rows x = {{r, r, r}, {i, i, i}, {0, HUB_CLAIM_SUB, HUB_CLAIM_EVENT}};
        size_t len;
        /* a job whose event is gone (its partition dropped) stays leased: it
         * is reclaimed, and dead as poison in the end */
        if (rows_value(&x, ROWS_EVENT, HUB_LOAD_EVENT_KEY, &len) == NULL ||
            rows_value(&x, ROWS_SUB, HUB_LOAD_SUB_ID, &len) == NULL) {
            continue;
        }
        queue_job(d, &x, stamp);
    }
}

/* ----------------------------------------------------------------- load -- */

/* A claim's jobs between their lease and the queue: owns a copy of the
 * claim's result until the load lands (load_done frees both). */
struct load {
    struct hub_dispatch *d;
    PGresult *claim; /* a copy of the claim's result */
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
                        const struct sub_row *by_id, PGresult *evs) {
    int rows = PQntuples(l->claim);

    for (int e = 0; evs != NULL && e < PQntuples(evs); e++) {
        struct job_rows x = {{l->claim, subs, evs},
                             {atoi(PQgetvalue(evs, e, HUB_LOAD_EVENT_KEY)) - 1, 0, e},
                             {0, 0, 0}};
        struct sub_row key, *s;
        if (x.i[ROWS_CLAIM] < 0 || x.i[ROWS_CLAIM] >= rows) {
            continue;
        }
        key.id = PQgetvalue(l->claim, x.i[ROWS_CLAIM], HUB_CLAIM_SUB_ID);
        s = bsearch(&key, by_id, (size_t)PQntuples(subs), sizeof(*by_id), sub_row_cmp);
        if (s == NULL) {
            continue;
        }
        x.i[ROWS_SUB] = s->row;
        queue_job(d, &x, l->stamp);
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

    d->loading -= (size_t)rows;
    if (out->status != HUB_PG_OK || subs == NULL ||
        (by_id = sub_rows_sorted(subs, HUB_LOAD_SUB_ID)) == NULL) {
        hub_log(HUB_WARN, "claimed jobs could not be loaded: released",
                HUB_LS("error", out->status != HUB_PG_OK ? out->error : "out of memory"),
                HUB_LI("jobs", rows));
        load_release(d, l->claim, l->stamp.serial);
    } else {
        /* a job whose event is gone (its partition dropped) has no row and
         * stays leased: it is reclaimed, and dead as poison in the end; one
         * whose subscription is gone went with it */
        for (int k = 1; k <= l->days; k++) {
            load_events(d, l, subs, by_id, out->results[k]);
        }
    }
    free(by_id);
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
 * were a large part of it.  Borrows r (copies it); the jobs are queued, or
 * given back, when the load lands.
 */
static void dispatch_load(struct hub_dispatch *d, PGresult *r, int rows, struct claim_stamp stamp) {
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
        free(l);
        free(by_id);
        free(row_day);
        return;
    }
    l->d = d;
    l->stamp = stamp;
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

/* Raises each tenant's floor to DISPATCH_FLOOR_MARGIN_US behind the oldest
 * unordered job this claim took from it (fifo heads come from their own
 * index and are not read from a floor). */
static void claim_floors(struct hub_dispatch *d, PGresult *r, int rows) {
    /* pass 0 resets the tenants' scratch, 1 finds their oldest job, 2 moves
     * their floors */
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < rows; i++) {
            struct due_tenant *t;
            int64_t at;
            if (PQgetvalue(r, i, HUB_CLAIM_FIFO)[0] == 't' || PQgetisnull(r, i, HUB_CLAIM_DUE_US)) {
                continue;
            }
            t = bsearch(PQgetvalue(r, i, HUB_CLAIM_TENANT), d->tenants, d->n_tenants,
                        sizeof(*d->tenants), due_tenant_cmp);
            if (t == NULL) {
                continue;
            }
            at = atoll(PQgetvalue(r, i, HUB_CLAIM_DUE_US));
            if (pass == 0) {
                t->oldest_us = INT64_MAX;
            } else if (pass == 1) {
                t->oldest_us = at < t->oldest_us ? at : t->oldest_us;
            } else if (t->oldest_us - DISPATCH_FLOOR_MARGIN_US > t->floor_us) {
                t->floor_us = t->oldest_us - DISPATCH_FLOOR_MARGIN_US;
            }
        }
    }
}

/* A claim's transaction ended: moves the rotation and the floors, queues
 * its jobs (or starts their load), and schedules the next claim. */
static void claim_done(void *arg, const struct hub_pg_outcome *out) {
    struct hub_dispatch *d = arg;
    PGresult *r = out->n_results > 0 ? out->results[0] : NULL;
    int rows = r ? PQntuples(r) : 0;
    /* one claim at a time: the one that just returned is the last sent */
    struct claim_stamp stamp = {dispatch_unix_ms(), d->claim_serial};

    d->claiming = 0;
    if ((size_t)rows < d->claim_asked) {
        d->tenants_dirty = 1; /* some tenant ran dry (or one is missing) */
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
        if ((size_t)rows < d->claim_asked && d->window_last[0] != '\0') {
            /* the batch did not fill: every tenant of the window had its
             * turn, the next claim offers the next window */
            best = d->window_last;
        }
        if (best != NULL) {
            snprintf(d->last_tenant, sizeof(d->last_tenant), "%s", best);
        }
    }
    claim_floors(d, r, rows);
    if (rows > 0 && !d->claim_full) { /* this claim did the lookups itself */
        claim_jobs(d, r, rows, stamp);
    } else if (rows > 0) {
        dispatch_load(d, r, rows, stamp);
    }
    /* a full batch means a backlog: the next claim leaves the lookups to
     * the load, so that claims follow each other sooner; a short one means
     * the dispatcher keeps up, and one round trip is the latency */
    d->claim_full = (size_t)rows >= d->claim_asked;
    dispatch_pump(d);
    /* rows (or a kick) mean more may be due: claim again at once */
    if (!d->stopping) {
        dispatch_claim_soon(d, rows > 0 || d->kicked ? 0 : DISPATCH_IDLE_MS);
    }
    d->kicked = 0;
    dispatch_maybe_done(d);
}

static void tenants_free(struct hub_dispatch *d) {
    for (size_t i = 0; i < d->n_tenants; i++) {
        free(d->tenants[i].id);
    }
    free(d->tenants);
    d->tenants = NULL;
    d->n_tenants = 0;
}

static int tenant_cmp(const void *a, const void *b) {
    return strcmp(((const struct due_tenant *)a)->id, ((const struct due_tenant *)b)->id);
}

/* A tenant sample ended: replaces the rotation's tenants (keeping the floors
 * of those still there) and schedules the claim. */
static void tenants_done(void *arg, const struct hub_pg_outcome *out) {
    struct hub_dispatch *d = arg;
    PGresult *r = out->n_results > 0 ? out->results[0] : NULL;
    int rows = r ? PQntuples(r) : 0;

    d->claiming = 0;
    if (out->status != HUB_PG_OK) {
        claim_failed(d, "tenant sample failed", out->error);
        return;
    }
    {
        struct due_tenant *old = d->tenants;
        size_t n_old = d->n_tenants;
        d->tenants = rows > 0 ? calloc((size_t)rows, sizeof(*d->tenants)) : NULL;
        d->n_tenants = 0;
        for (int i = 0; d->tenants != NULL && i < rows; i++) {
            char *t = strdup(PQgetvalue(r, i, HUB_DUE_TENANTS_ID));
            if (t != NULL) {
                d->tenants[d->n_tenants].fifo = PQgetvalue(r, i, HUB_DUE_TENANTS_FIFO)[0] == 't';
                d->tenants[d->n_tenants++].id = t;
            }
        }
        /* strcmp order, whatever the database's collation: claim_done moves
         * the rotation point by strcmp */
        if (d->n_tenants > 1) {
            qsort(d->tenants, d->n_tenants, sizeof(*d->tenants), tenant_cmp);
        }
        /* the floors outlive the sample (both lists are in strcmp order) */
        for (size_t i = 0, k = 0; i < d->n_tenants && k < n_old;) {
            int c = strcmp(d->tenants[i].id, old[k].id);
            if (c == 0) {
                d->tenants[i].floor_us = old[k].floor_us;
            }
            i += c <= 0;
            k += c >= 0;
        }
        for (size_t k = 0; k < n_old; k++) {
            free(old[k].id);
        }
        free(old);
    }
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
        return;
    }
    snprintf(limit, sizeof(limit), "%d", DISPATCH_TENANTS_MAX);
    hub_pg_txn_add(txn, &hub_sql_dispatch_due_tenants, 1, params, NULL, NULL);
    d->claiming = 1;
    hub_pg_txn_submit(txn);
}

/*
 * Keeps up to WORKERS + 2 × CLAIM_BATCH jobs in hand (one claim at a time),
 * claiming in batches of CLAIM_BATCH, and not less than half of one unless
 * workers are idle: the queue must outlast a claim's round trip.  Samples
 * the tenants first when the sample is stale.
 */
static void dispatch_claim(struct hub_dispatch *d) {
    /* the four forms of the claim, by [fifo arm][lookups] */
    static const struct hub_sql *const forms[2][2] = {
        {&hub_sql_dispatch_claim, &hub_sql_dispatch_claim_lookup},
        {&hub_sql_dispatch_claim_fifo, &hub_sql_dispatch_claim_fifo_lookup},
    };
    static const int formats[HUB_CLAIM_NPARAMS] = {
        [HUB_CLAIM_PARAM_TENANTS] = 1, [HUB_CLAIM_PARAM_FLOORS] = 1, [HUB_CLAIM_PARAM_FIFO] = 1};
    size_t workers = (size_t)d->hub->cfg.dispatch_workers;
    size_t batch = (size_t)d->hub->cfg.dispatch_claim_batch;
    size_t held = d->inflight + d->n_queue + d->loading;
    size_t target = workers + 2 * batch;
    size_t free_slots = target > held ? target - held : 0;
    int64_t age = dispatch_unix_ms() - d->tenants_ms;
    char lease[32], limit[16], per_tenant[16];
    char owner[sizeof(d->owner) + 24];
    const char *params[HUB_CLAIM_NPARAMS] = {
        [HUB_CLAIM_PARAM_OWNER] = owner,
        [HUB_CLAIM_PARAM_LEASE_MS] = lease,
        [HUB_CLAIM_PARAM_BATCH] = limit,
        [HUB_CLAIM_PARAM_PER_TENANT] = per_tenant,
    };
    int lengths[HUB_CLAIM_NPARAMS] = {0};
    struct hub_pgarr tenants, floors, fifo;
    int64_t now = dispatch_unix_ms();
    size_t first = 0, window, share;
    int any_fifo = 0;
    struct hub_pg_txn *txn;

    if (d->claiming || d->stopping || free_slots == 0 || d->hub->httpc == NULL) {
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
            d->tenants[i].floor_us = 0;
        }
        d->floors_ms = now;
    }
    /* a window of the rotation, not every sampled tenant: a claim costs
     * what its batch needs however many tenants have due jobs */
    window = d->n_tenants < DISPATCH_WINDOW_BATCHES * batch ? d->n_tenants
                                                            : DISPATCH_WINDOW_BATCHES * batch;
    hub_pgarr_init(&tenants, HUB_OID_TEXT);
    hub_pgarr_init(&floors, HUB_OID_TIMESTAMPTZ);
    hub_pgarr_init(&fifo, HUB_OID_BOOL);
    for (size_t i = 0; i < window; i++) {
        const struct due_tenant *t = &d->tenants[(first + i) % d->n_tenants];
        hub_pgarr_add_text(&tenants, t->id);
        hub_pgarr_add_bool(&fifo, t->fifo);
        any_fifo |= t->fifo;
        if (t->floor_us > 0) {
            hub_pgarr_add_ts(&floors, t->floor_us);
        } else {
            hub_pgarr_add_i64(&floors, INT64_MIN); /* binary timestamptz -infinity */
        }
    }
    params[HUB_CLAIM_PARAM_TENANTS] = hub_pgarr_finish(&tenants, &lengths[HUB_CLAIM_PARAM_TENANTS]);
    params[HUB_CLAIM_PARAM_FLOORS] = hub_pgarr_finish(&floors, &lengths[HUB_CLAIM_PARAM_FLOORS]);
    params[HUB_CLAIM_PARAM_FIFO] = hub_pgarr_finish(&fifo, &lengths[HUB_CLAIM_PARAM_FIFO]);
    snprintf(d->window_last, sizeof(d->window_last), "%s",
             window < d->n_tenants ? d->tenants[(first + window - 1) % d->n_tenants].id : "");
    /* each tenant offers up to twice its fair share, so that a batch still
     * fills when some have less, and at least two jobs: a tenant's turn
     * costs the claim about as much as a job, so a share of one makes a
     * many-tenant claim dearer per job than a one-tenant claim (see
     * docs/performance.md, "Notes moved out of the dispatcher's code"); a
     * lone tenant may fill the batch alone */
    share = (2 * batch + window - 1) / window;
    share = share < 2 ? 2 : share;
    share = share > batch ? batch : share;
    snprintf(lease, sizeof(lease), "%lld", (long long)d->hub->cfg.dispatch_lease_ms);
    snprintf(limit, sizeof(limit), "%zu", batch);
    snprintf(per_tenant, sizeof(per_tenant), "%zu", share);
    txn = params[HUB_CLAIM_PARAM_TENANTS] != NULL && params[HUB_CLAIM_PARAM_FLOORS] != NULL &&
                  params[HUB_CLAIM_PARAM_FIFO] != NULL
              ? hub_pg_txn_new(d->pg_claim, claim_done, d)
              : NULL;
    if (txn != NULL) {
        d->claim_serial++;
        snprintf(owner, sizeof(owner), "%s#%llu", d->owner, (unsigned long long)d->claim_serial);
        hub_pg_txn_add_binary(txn, forms[any_fifo][!d->claim_full], HUB_CLAIM_NPARAMS, params,
                              lengths, formats);
        d->claiming = 1;
        d->claim_asked = batch;
        hub_pg_txn_submit(txn);
    }
    hub_pgarr_free(&tenants);
    hub_pgarr_free(&floors);
    hub_pgarr_free(&fifo);
}

static void claim_timer_cb(uv_timer_t *t) {
    dispatch_claim(t->data);
}

void dispatch_claim_soon(struct hub_dispatch *d, uint64_t delay_ms) {
    uv_timer_start(&d->claim_timer, claim_timer_cb, delay_ms, 0);
}

void dispatch_claim_free(struct hub_dispatch *d) {
    tenants_free(d);
    free(d->queue);
    d->queue = NULL;
}
