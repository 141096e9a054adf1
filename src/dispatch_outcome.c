/*
 * dispatch_outcome — outcomes (see dispatch_int.h for the parts and who
 * owns a job when).
 *
 * Every job a claim handed out ends here as one outcome record: attempted
 * (succeeded, failed and retried later, dead) or not (released, deferred,
 * shed, filtered).  Records wait in d->outcomes and are written in batches
 * of up to DISPATCH_FLUSH_MAX (hub_sql_dispatch_outcomes), so that the
 * dispatcher never waits on the database between attempts; up to
 * DISPATCH_OUT_CONNECTIONS batches are in flight at once.  The same
 * statement moves the failure streaks, disables on a 410 and checks the
 * auto-disable gates (SPEC §7.3, §7.7), all fenced by the jobs' leases: an
 * outcome that comes back after its lease expired (the job may have been
 * reclaimed and delivered by another process since) changes nothing.  The
 * in-memory breaker is not fed such an outcome either (dispatch_breaker_report).
 *
 * A batch that fails is put back at the front and retried after 500 ms; a
 * statement error that is not transient switches to one outcome per
 * transaction until the refused one is found and dropped (its lease then
 * expires and the job is reclaimed: at least once still holds).  Leases
 * protect the jobs meanwhile: the write is fenced by them.
 *
 * A committed disable also notes its subscription for a lease
 * (dispatch_stale_here), as does a change the API made
 * (hub_dispatch_subscription_changed): jobs leased before the dispatcher
 * learned of it (an ingest transaction's fast path, a claim or load in
 * flight) reach the dispatcher after their queue was dropped, and go back
 * unattempted.
 *
 * Also here: the reclaim of expired leases (jobs of a dispatcher that died
 * mid-attempt), poison after STREAMING_HUB_POISON_THRESHOLD reclaims.
 */
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "breaker.h"
#include "dispatch_int.h"
#include "hub.h"
#include "log.h"
#include "opevents.h"
#include "pg.h"
#include "stats.h"
#include "store.h"
#include "store_dispatch.h"
#include "util.h"

#define DISPATCH_FLUSH_MS 5         /* outcome batching window */
#define DISPATCH_FLUSH_MAX 256      /* outcomes per transaction */
#define DISPATCH_FLUSH_RETRY_MS 500 /* after a batch that was not written */

/* One finished job, as the outcome statement takes it (struct
 * hub_outcomes_param).  Owns excerpt. */
struct outcome {
    int64_t id;
    uint64_t claim;     /* serial of the claim that leased the job */
    const char *state;  /* static: succeeded, pending, dead, filtered */
    const char *reason; /* static, or NULL */
    int64_t delay_ms;
    int attempted;
    int success;
    char delivery_id[40];
    int64_t started_unix_ms;
    int duration_ms;
    int status; /* 0 = none */
    char error[32];
    char *excerpt;
    char sub_id[40];
};

/* A subscription an outcome statement of this process disabled, or the API
 * changed: jobs of claims and offers up to `serial` may have been leased
 * before (dispatch_stale_here).  Kept for a lease from `ms`: every such
 * lease began before, so by then it is over, and its job is settled, given
 * back or someone else's.  sub_id "" is an empty slot of the table. */
struct stale_sub {
    char sub_id[40];
    uint64_t serial;
    int64_t ms;
};

/* One outcome transaction: owns the outcomes it carries. */
struct flush {
    struct hub_dispatch *d;
    struct outcome *o;
    size_t n;
};

/* ---------------------------------------------------------------- queue -- */

/* A new zeroed record at the end of the queue, or NULL when out of memory
 * (the caller drops the outcome: the job's lease expires and it is
 * reclaimed). */
static struct outcome *outcome_push(struct hub_dispatch *d) {
    if (d->n_outcomes == d->cap_outcomes) {
        size_t cap = d->cap_outcomes ? d->cap_outcomes * 2 : 64;
        struct outcome *o = realloc(d->outcomes, sizeof(*o) * cap);
        if (o == NULL) {
            return NULL;
        }
        d->outcomes = o;
        d->cap_outcomes = cap;
    }
    struct outcome *o = &d->outcomes[d->n_outcomes++];
    memset(o, 0, sizeof(*o));
    return o;
}

static void flush_timer_cb(uv_timer_t *t) {
    dispatch_flush(t->data);
}

/* Starts the batching window unless a write is due anyway; at once when a
 * full batch is waiting.  With every outcome connection busy nothing is
 * started: the batch that ends first schedules the next (flush_done). */
static void schedule_flush(struct hub_dispatch *d) {
    if (d->flushing < DISPATCH_OUT_CONNECTIONS && !uv_is_active((uv_handle_t *)&d->flush_timer)) {
        uv_timer_start(&d->flush_timer, flush_timer_cb,
                       d->n_outcomes >= DISPATCH_FLUSH_MAX ? 0 : DISPATCH_FLUSH_MS, 0);
    }
}

/* An outcome without an attempt: the statement leaves the attempts table
 * and the streak alone, and the job's attempt_count as it is. */
static void unattempted(struct hub_dispatch *d, int64_t id, const char *sub_id, uint64_t claim,
                        const char *state, const char *reason, int64_t delay_ms) {
    struct outcome *o = outcome_push(d);

    if (o != NULL) { /* else the lease expires and the job is reclaimed */
        o->id = id;
        o->claim = claim;
        o->state = state;
        o->reason = reason;
        o->delay_ms = delay_ms;
        o->started_unix_ms = dispatch_unix_ms();
        snprintf(o->sub_id, sizeof(o->sub_id), "%s", sub_id);
        schedule_flush(d);
    }
}

void dispatch_outcome_unattempted(struct hub_dispatch *d, int64_t id, const char *sub_id,
                                  uint64_t claim, const char *state, int64_t delay_ms) {
    unattempted(d, id, sub_id, claim, state, NULL, delay_ms);
}

void dispatch_outcome_expired(struct hub_dispatch *d, int64_t id, const char *sub_id,
                              uint64_t claim) {
    unattempted(d, id, sub_id, claim, "dead", "expired", 0);
}

/* The job's claim serial goes with it: the write is fenced by that claim's
 * lease, not by whichever claim holds the job by then. */
void dispatch_job_unattempted(struct hub_dispatch *d, struct job *j, const char *state,
                              int64_t delay_ms) {
    dispatch_outcome_unattempted(d, j->id, j->sub_id, j->claim.serial, state, delay_ms);
    dispatch_job_free(j);
}

/*
 * Records an attempt's result: its state (succeeded, or failed and then
 * pending after the retry delay, or dead), what the attempts table keeps of
 * it, and the metrics.  A 410 drops the subscription's queued jobs at once
 * (the batch disables it).
 */
void dispatch_job_outcome(struct hub_dispatch *d, struct job *j,
                          const struct hub_httpc_response *res) {
    struct outcome *o = outcome_push(d);
    int success =
        res != NULL && res->error == HUB_HTTPC_OK && res->status >= 200 && res->status < 300;
    int gone = 0; /* a 410 that disables the subscription */

    if (o == NULL) {
        return; /* OOM: the lease expires and the job is reclaimed */
    }
    o->id = j->id;
    o->claim = j->claim.serial;
    snprintf(o->sub_id, sizeof(o->sub_id), "%s", j->sub_id);
    o->started_unix_ms = j->started_unix_ms ? j->started_unix_ms : dispatch_unix_ms();
    o->attempted = 1;
    o->success = success;
    snprintf(o->delivery_id, sizeof(o->delivery_id), "%s", j->delivery_id);
    if (res != NULL) {
        o->duration_ms = (int)res->duration_ms;
        o->status = (int)res->status;
        if (res->error != HUB_HTTPC_OK) {
            snprintf(o->error, sizeof(o->error), "%s", hub_httpc_error_str(res->error));
        } else if (!success) {
            snprintf(o->error, sizeof(o->error), "status");
        }
        if (res->excerpt_len > 0) {
            /* the text part of the excerpt: it may end inside a character
             * cut at the byte limit, or the body may not be text at all */
            size_t n = hub_utf8_prefix(res->excerpt, res->excerpt_len);
            o->excerpt = n > 0 ? strndup(res->excerpt, n) : NULL;
        }
        hub_histogram_observe(&d->hub->metrics.delivery_attempt_seconds,
                              (double)res->duration_ms / 1000.0);
    } else {
        /* failed before any HTTP: a policy error, or secrets that do not open */
        if (j->breaker_probe) {
            hub_breaker_release(d->breakers, j->tenant, j->origin, dispatch_unix_ms());
        }
        snprintf(o->error, sizeof(o->error), "%s", j->local_error ? j->local_error : "signing");
        o->excerpt = j->local_excerpt;
        j->local_excerpt = NULL;
    }
    if (success) {
        o->state = "succeeded";
        d->hub->metrics.deliveries[HUB_D_SUCCEEDED]++;
    } else {
        const char *dead_reason = "exhausted";
        int64_t delay = dispatch_retry_delay(d, j, res, &dead_reason);
        if (res != NULL && (res->status == 429 || res->status == 503) && res->retry_after) {
            int64_t ra = hub_retry_after_ms(res->retry_after, dispatch_unix_ms());
            if (ra > 0 && delay >= 0 && ra > delay) {
                delay = ra; /* no earlier than Retry-After (capped at 10h there) */
            }
        }
        d->hub->metrics.deliveries[HUB_D_FAILED]++;
        if (delay < 0) {
            o->state = "dead";
            o->reason = dead_reason;
            /* counted, and told to the tenant (hub.delivery.dead), once the
             * statement made it dead (flush_done): the fence may refuse
             * this outcome */
        } else {
            o->state = "pending";
            o->delay_ms = delay;
        }
        gone = res != NULL && res->status == 410 && d->hub->cfg.autodisable_enabled &&
               !dispatch_lease_past(d, j, dispatch_unix_ms());
    }
    /* per-tenant figures (stats.h): delivered, retried, dead */
    hub_stats_attempt(d->hub->stats, j->tenant, j->attrs, j->event_type, o->state);
    if (gone) {
        /* it is being disabled; a stale 410 disables nothing (the
         * statement's fence), so it drops nothing either.  Last: each job
         * dropped pushes an outcome, which may move the records, o too. */
        dispatch_queue_drop_subscription(d, j->sub_id);
    }
    schedule_flush(d);
}

/* ------------------------------------------------- disabled or changed -- */

/*
 * The notes live in an open-addressing table by subscription id (linear
 * probing, a power-of-two number of slots, at most three quarters used),
 * so the check every attempt start makes is one probe however many
 * subscriptions changed lately: a tenant that deletes subscriptions in a
 * loop costs the others nothing.  A note older than a lease reads as
 * absent, and the table drops such notes whenever it would grow.  The
 * note for every subscription ("") is kept apart.
 */
static int stale_live(const struct hub_dispatch *d, const struct stale_sub *e, int64_t now) {
    return e->sub_id[0] != '\0' && now - e->ms <= d->hub->cfg.dispatch_lease_ms;
}

/* The slot of sub_id in a table of cap slots: its note, or the empty slot
 * where it would go. */
static struct stale_sub *stale_slot(struct stale_sub *t, size_t cap, const char *sub_id) {
    size_t i = (size_t)hub_fnv1a_str(sub_id) & (cap - 1);

    while (t[i].sub_id[0] != '\0' && strcmp(t[i].sub_id, sub_id) != 0) {
        i = (i + 1) & (cap - 1);
    }
    return &t[i];
}

/* Makes room for one more note: the live notes go into a table with room
 * for them (twice as many slots when they fill half of it).  Returns 0, or
 * -1 when out of memory (the table is unchanged). */
static int stale_room(struct hub_dispatch *d, int64_t now) {
    size_t live = 0, cap = 16;
    struct stale_sub *t;

    if ((d->n_stale + 1) * 4 <= d->cap_stale * 3) {
        return 0;
    }
    for (size_t i = 0; i < d->cap_stale; i++) {
        live += stale_live(d, &d->stale[i], now);
    }
    while (cap < (live + 1) * 2) {
        cap *= 2;
    }
    if ((t = calloc(cap, sizeof(*t))) == NULL) {
        return -1;
    }
    for (size_t i = 0; i < d->cap_stale; i++) {
        if (stale_live(d, &d->stale[i], now)) {
            *stale_slot(t, cap, d->stale[i].sub_id) = d->stale[i];
        }
    }
    free(d->stale);
    d->stale = t;
    d->cap_stale = cap;
    d->n_stale = live;
    return 0;
}

/* Notes that sub_id was just disabled or changed (committed; "" for every
 * subscription): every claim and offer made so far may hold jobs of it.
 * Out of memory it notes every subscription instead. */
static void stale_note(struct hub_dispatch *d, const char *sub_id) {
    int64_t now = dispatch_unix_ms();
    struct stale_sub *e;

    if (sub_id[0] != '\0' && stale_room(d, now) == 0) {
        e = stale_slot(d->stale, d->cap_stale, sub_id);
        if (e->sub_id[0] == '\0') {
            snprintf(e->sub_id, sizeof(e->sub_id), "%s", sub_id);
            d->n_stale++;
        }
        e->serial = d->claim_serial;
        e->ms = now;
        return;
    }
    d->stale_all_serial = d->claim_serial;
    d->stale_all_ms = now;
}

int dispatch_stale_here(struct hub_dispatch *d, const struct job *j) {
    int64_t now;
    const struct stale_sub *e;

    if (d->n_stale == 0 && d->stale_all_ms == 0) {
        return 0; /* the usual case: nothing changed lately */
    }
    now = dispatch_unix_ms();
    if (d->stale_all_ms != 0 && now - d->stale_all_ms > d->hub->cfg.dispatch_lease_ms) {
        d->stale_all_ms = 0; /* over: the usual case again (every listening session sets it) */
    }
    if (d->stale_all_ms != 0 && j->claim.serial <= d->stale_all_serial) {
        return 1;
    }
    if (d->n_stale == 0) {
        return 0;
    }
    e = stale_slot(d->stale, d->cap_stale, j->sub_id);
    return stale_live(d, e, now) && j->claim.serial <= e->serial;
}

void hub_dispatch_subscription_changed(struct hub_dispatch *d, const char *sub_id) {
    if (d == NULL) {
        return;
    }
    stale_note(d, sub_id != NULL ? sub_id : "");
    dispatch_queue_drop_subscription(d, sub_id);
    if (!d->stopping) {
        /* what went back is due at once: a full queue had kept the claim
         * waiting for an attempt to end (perhaps one that hangs) */
        dispatch_claim_soon(d, 0);
    }
}

/* -------------------------------------------------------------- breaker -- */

/* The claim's answer came back at j->claim.ms, after the database set the
 * lease to end one lease later: past that (on this clock), the lease is
 * surely over. */
int dispatch_lease_past(const struct hub_dispatch *d, const struct job *j, int64_t now_ms) {
    return now_ms - j->claim.ms > d->hub->cfg.dispatch_lease_ms;
}

/*
 * The breaker learns from an attempt only while the attempt's lease holds:
 * once it is over the job may be someone else's, and its outcome is not
 * written (the fence), so it must not trip or close a breaker either.  A
 * stale half-open probe is handed back as if it never reached the
 * destination, so that the breaker probes again at once instead of waiting
 * for a report that will not come.
 */
void dispatch_breaker_report(struct hub_dispatch *d, const struct job *j, int success) {
    int64_t now = dispatch_unix_ms();

    if (!dispatch_lease_past(d, j, now)) {
        hub_breaker_report(d->breakers, j->tenant, j->origin, success, j->breaker_probe, now);
        if (j->origin_id != 0) { /* 0: no named origin; the fast path's */
            hub_breaker_tag(d->breakers, j->tenant, j->origin, j->origin_id);
        }
    } else if (j->breaker_probe) {
        hub_breaker_release(d->breakers, j->tenant, j->origin, now);
    }
}

/* ---------------------------------------------------------------- write -- */

/* Puts a failed batch's outcomes back at the front of the queue, ahead of
 * the newer ones; takes the batch's records (f itself stays the caller's).
 * Out of memory they are dropped. */
static void flush_requeue(struct hub_dispatch *d, struct flush *f) {
    struct outcome *o = realloc(d->outcomes, sizeof(*o) * (d->n_outcomes + f->n));
    if (o == NULL) {
        /* the leases expire and the jobs are reclaimed */
        for (size_t i = 0; i < f->n; i++) {
            free(f->o[i].excerpt);
        }
        return;
    }
    memmove(o + f->n, o, sizeof(*o) * d->n_outcomes);
    memcpy(o, f->o, sizeof(*o) * f->n);
    d->outcomes = o;
    d->n_outcomes += f->n;
    d->cap_outcomes = d->n_outcomes;
}

/* Puts a batch that could not be sent back in the queue, and tries again
 * after DISPATCH_FLUSH_RETRY_MS.  Frees f. */
static void flush_retry_later(struct hub_dispatch *d, struct flush *f) {
    if (f != NULL) {
        flush_requeue(d, f);
        free(f->o);
        free(f);
    }
    uv_timer_start(&d->flush_timer, flush_timer_cb, DISPATCH_FLUSH_RETRY_MS, 0);
}

/* The first result of a transaction that committed, when it has ncols
 * columns, and its rows into *rows; NULL and 0 otherwise (the transaction
 * failed, or the result has another shape). */
static PGresult *committed_result(const struct hub_pg_outcome *out, int ncols, int *rows) {
    PGresult *r = out->n_results > 0 ? out->results[0] : NULL;

    if (out->status != HUB_PG_OK || r == NULL || PQnfields(r) != ncols) {
        *rows = 0;
        return NULL;
    }
    *rows = PQntuples(r);
    return r;
}

/* A batch's transaction ended.  Written: the records are freed, and the
 * subscriptions the batch auto-disabled lose their queued jobs.  Not
 * written: see the top of this file.  Frees f. */
static void flush_done(void *arg, const struct hub_pg_outcome *out) {
    struct flush *f = arg;
    struct hub_dispatch *d = f->d;
    PGresult *r;
    int rows;

    d->flushing--;
    if (out->status == HUB_PG_ESTMT && f->n == 1 && !hub_pg_sqlstate_transient(out->sqlstate) &&
        !(strcmp(out->sqlstate, "23505") == 0 && !d->outcomes_checked)) {
        /* The one outcome the statement refuses: dropped, or it would be
         * retried forever with every outcome queued behind it.  Its job
         * keeps our lease until that expires; then it is reclaimed and
         * attempted again (at least once still holds). */
        hub_log(HUB_ERROR, "a delivery outcome cannot be recorded; its job will be reclaimed",
                HUB_LI("job", f->o[0].id), HUB_LS("subscription", f->o[0].sub_id),
                HUB_LS("state", f->o[0].state), HUB_LS("error", out->error));
        d->flush_single -= d->flush_single > 0;
        free(f->o[0].excerpt);
        free(f->o);
        free(f);
        schedule_flush(d);
        dispatch_maybe_done(d);
        return;
    }
    if (out->status != HUB_PG_OK) {
        /* keep them and try again; leases protect the jobs meanwhile */
        hub_log(HUB_WARN, "delivery outcomes not recorded, retrying", HUB_LS("error", out->error),
                HUB_LI("outcomes", (int64_t)f->n));
        if (out->status == HUB_PG_ESTMT && strcmp(out->sqlstate, "23505") == 0 &&
            !d->outcomes_checked) {
            /* an attempt number already recorded (store_dispatch.c, a:) */
            d->outcomes_checked = 1;
            hub_log(HUB_WARN, "an attempt was already recorded under its number (was a job's "
                              "attempt_count lowered by hand?); outcomes now probe for it first");
        } else if (out->status == HUB_PG_ESTMT && !hub_pg_sqlstate_transient(out->sqlstate)) {
            /* one of them (or its subscription) makes the statement fail:
             * write them one at a time, so that only that one is held back */
            d->flush_single = d->flush_single > f->n ? d->flush_single : f->n;
        }
        uv_timer_stop(&d->flush_timer);
        flush_retry_later(d, f);
        return;
    }
    d->flush_single -= d->flush_single < f->n ? d->flush_single : f->n;
    /* the subscriptions the batch disabled (410, auto-disable) come back
     * from the outcome statement: no attempt of theirs may start now; so
     * do the jobs it set dead, which only now (the fence passed, the
     * transaction committed) may be told to their tenants */
    r = committed_result(out, HUB_OUTCOMES_NCOLS, &rows);
    for (int i = 0; i < rows; i++) {
        const char *sub_id = PQgetvalue(r, i, HUB_OUTCOMES_SUB_ID);
        const char *tenant = PQgetvalue(r, i, HUB_OUTCOMES_TENANT);
        if (!PQgetisnull(r, i, HUB_OUTCOMES_DEAD_JOB)) {
            d->hub->metrics.deliveries[HUB_D_DEAD]++;
            hub_opevents_dead(
                d->hub, tenant, sub_id, strtoll(PQgetvalue(r, i, HUB_OUTCOMES_DEAD_JOB), NULL, 10),
                PQgetvalue(r, i, HUB_OUTCOMES_EVENT_ID), PQgetvalue(r, i, HUB_OUTCOMES_EVENT_TYPE),
                PQgetvalue(r, i, HUB_OUTCOMES_REASON));
            continue;
        }
        /* queued jobs go back now; jobs of claims and offers still in
         * flight (or on the policy threads) when they reach the send */
        stale_note(d, sub_id);
        dispatch_queue_drop_subscription(d, sub_id);
        hub_opevents_disabled(d->hub, tenant, sub_id, PQgetvalue(r, i, HUB_OUTCOMES_REASON));
        if (strcmp(PQgetvalue(r, i, HUB_OUTCOMES_REASON), "gone") == 0) {
            hub_log(HUB_WARN, "subscription disabled: its destination answered 410 Gone",
                    HUB_LS("subscription", sub_id), HUB_LS("tenant", tenant));
            continue;
        }
        d->hub->metrics.subscriptions_auto_disabled++;
        hub_log(HUB_WARN, "subscription auto-disabled: its destination kept failing",
                HUB_LS("subscription", sub_id), HUB_LS("tenant", tenant),
                HUB_LI("failure_window_ms", d->hub->cfg.autodisable_failure_window_ms),
                HUB_LI("failure_spread_ms", d->hub->cfg.autodisable_failure_spread_ms));
    }
    for (size_t i = 0; i < f->n; i++) {
        free(f->o[i].excerpt);
    }
    free(f->o);
    free(f);
    if (d->n_outcomes > 0) {
        schedule_flush(d);
    }
    dispatch_maybe_done(d);
}

/* A malloc'd big-endian integer of n bytes (1: a binary bool, 8: a binary
 * int8), its length in *len; NULL when out of memory. */
static char *binary_value(uint64_t v, int n, int *len) {
    char *b = malloc((size_t)n);

    *len = n;
    for (int i = n - 1; b != NULL && i >= 0; i--) {
        b[i] = (char)(v & 0xff);
        v >>= 8;
    }
    return b;
}

/*
 * Takes up to DISPATCH_FLUSH_MAX queued outcomes (one after a statement
 * error, see flush_done) into a batch and sends it in one transaction: the
 * outcome statement, which also applies 410s and the auto-disable gates
 * when auto-disable is allowed.  Up to DISPATCH_OUT_CONNECTIONS batches run
 * at once; a second one is scheduled when outcomes are left.
 */
void dispatch_flush(struct hub_dispatch *d) {
    /* the element types of the statement's arrays; $14, $16, $17 and $18
     * are plain values (0 here) */
    static const uint32_t oids[HUB_OUTCOMES_NPARAMS] = {
        [HUB_OUTCOMES_PARAM_ID] = HUB_OID_INT8,
        [HUB_OUTCOMES_PARAM_STATE] = HUB_OID_TEXT,
        [HUB_OUTCOMES_PARAM_REASON] = HUB_OID_TEXT,
        [HUB_OUTCOMES_PARAM_DELAY_MS] = HUB_OID_INT8,
        [HUB_OUTCOMES_PARAM_ATTEMPTED] = HUB_OID_BOOL,
        [HUB_OUTCOMES_PARAM_DELIVERY_ID] = HUB_OID_TEXT,
        [HUB_OUTCOMES_PARAM_STARTED_AT] = HUB_OID_TIMESTAMPTZ,
        [HUB_OUTCOMES_PARAM_DURATION_MS] = HUB_OID_INT4,
        [HUB_OUTCOMES_PARAM_STATUS] = HUB_OID_INT4,
        [HUB_OUTCOMES_PARAM_ERROR] = HUB_OID_TEXT,
        [HUB_OUTCOMES_PARAM_EXCERPT] = HUB_OID_TEXT,
        [HUB_OUTCOMES_PARAM_SUB_ID] = HUB_OID_TEXT,
        [HUB_OUTCOMES_PARAM_SUCCESS] = HUB_OID_BOOL,
        [HUB_OUTCOMES_PARAM_CLAIM] = HUB_OID_INT8,
    };
    struct hub_pgarr a[HUB_OUTCOMES_NPARAMS];
    char *values[HUB_OUTCOMES_NPARAMS] = {0};
    int lengths[HUB_OUTCOMES_NPARAMS] = {0};
    size_t max = d->flush_single > 0 ? 1 : DISPATCH_FLUSH_MAX;
    size_t n = d->n_outcomes < max ? d->n_outcomes : max;
    struct hub_pg_txn *txn;
    struct flush *f;
    int rc = 0;

    if (d->flushing >= DISPATCH_OUT_CONNECTIONS || n == 0) {
        return;
    }
    f = calloc(1, sizeof(*f));
    if (f == NULL || (f->o = malloc(sizeof(*f->o) * n)) == NULL) {
        free(f);
        flush_retry_later(d, NULL);
        return;
    }
    /* the batch takes the outcomes out of the queue */
    f->d = d;
    f->n = n;
    memcpy(f->o, d->outcomes, sizeof(*f->o) * n);
    memmove(d->outcomes, d->outcomes + n, sizeof(*d->outcomes) * (d->n_outcomes - n));
    d->n_outcomes -= n;
    for (int k = 0; k < HUB_OUTCOMES_NPARAMS; k++) {
        if (oids[k] != 0) {
            hub_pgarr_init(&a[k], oids[k]);
        }
    }
    for (size_t i = 0; i < n; i++) {
        const struct outcome *o = &f->o[i];
        char t = o->attempted ? 1 : 0, s = o->success ? 1 : 0;
        int64_t delay_ms =
            o->delay_ms < DISPATCH_DEFER_MAX_MS ? o->delay_ms : DISPATCH_DEFER_MAX_MS;
        hub_pgarr_add_i64(&a[HUB_OUTCOMES_PARAM_ID], o->id);
        hub_pgarr_add_text(&a[HUB_OUTCOMES_PARAM_STATE], o->state);
        hub_pgarr_add_text(&a[HUB_OUTCOMES_PARAM_REASON], o->reason);
        hub_pgarr_add_i64(&a[HUB_OUTCOMES_PARAM_DELAY_MS], delay_ms);
        hub_pgarr_add(&a[HUB_OUTCOMES_PARAM_ATTEMPTED], &t, 1);
        hub_pgarr_add_text(&a[HUB_OUTCOMES_PARAM_DELIVERY_ID],
                           o->attempted ? o->delivery_id : NULL);
        hub_pgarr_add_ts(&a[HUB_OUTCOMES_PARAM_STARTED_AT], o->started_unix_ms * 1000);
        hub_pgarr_add_i32(&a[HUB_OUTCOMES_PARAM_DURATION_MS], o->duration_ms);
        if (o->status > 0) {
            hub_pgarr_add_i32(&a[HUB_OUTCOMES_PARAM_STATUS], o->status);
        } else {
            hub_pgarr_add(&a[HUB_OUTCOMES_PARAM_STATUS], NULL, 0);
        }
        hub_pgarr_add_text(&a[HUB_OUTCOMES_PARAM_ERROR], o->error[0] ? o->error : NULL);
        hub_pgarr_add_text(&a[HUB_OUTCOMES_PARAM_EXCERPT], o->excerpt);
        hub_pgarr_add_text(&a[HUB_OUTCOMES_PARAM_SUB_ID], o->sub_id);
        hub_pgarr_add(&a[HUB_OUTCOMES_PARAM_SUCCESS], &s, 1);
        hub_pgarr_add_i64(&a[HUB_OUTCOMES_PARAM_CLAIM], (int64_t)o->claim);
    }
    for (int k = 0; k < HUB_OUTCOMES_NPARAMS; k++) {
        if (oids[k] != 0) {
            values[k] = hub_pgarr_take(&a[k], &lengths[k]);
            rc |= values[k] == NULL;
        }
    }
    /* the plain parameters, binary like the arrays (the statement casts
     * each, so its types are known): owner text, a bool, two int8 */
    values[HUB_OUTCOMES_PARAM_OWNER] = strdup(d->owner);
    lengths[HUB_OUTCOMES_PARAM_OWNER] = (int)strlen(d->owner);
    values[HUB_OUTCOMES_PARAM_AUTODISABLE] =
        binary_value((uint64_t)(d->hub->cfg.autodisable_enabled ? 1 : 0), 1,
                     &lengths[HUB_OUTCOMES_PARAM_AUTODISABLE]);
    values[HUB_OUTCOMES_PARAM_WINDOW_MS] =
        binary_value((uint64_t)d->hub->cfg.autodisable_failure_window_ms, 8,
                     &lengths[HUB_OUTCOMES_PARAM_WINDOW_MS]);
    values[HUB_OUTCOMES_PARAM_SPREAD_MS] =
        binary_value((uint64_t)d->hub->cfg.autodisable_failure_spread_ms, 8,
                     &lengths[HUB_OUTCOMES_PARAM_SPREAD_MS]);
    for (int k = 0; k < HUB_OUTCOMES_NPARAMS; k++) {
        rc |= oids[k] == 0 && values[k] == NULL;
    }
    txn = rc ? NULL : hub_pg_txn_new(d->pg_out, flush_done, f);
    if (txn == NULL) {
        for (int k = 0; k < HUB_OUTCOMES_NPARAMS; k++) {
            free(values[k]);
        }
        flush_retry_later(d, f);
        return;
    }
    hub_pg_txn_add_owned(
        txn, d->outcomes_checked ? &hub_sql_dispatch_outcomes_checked : &hub_sql_dispatch_outcomes,
        HUB_OUTCOMES_NPARAMS, values, lengths);
    d->flushing++;
    hub_pg_txn_submit(txn);
    if (d->n_outcomes > 0) {
        schedule_flush(d); /* a second batch on the other connection */
    }
}

/* -------------------------------------------------------------- reclaim -- */

/* The reclaim's transaction ended: counts and logs the jobs it gave back;
 * poison ones are dead, and their tenants are told (hub.delivery.dead,
 * reason "poison") now that the statement committed.  A failed reclaim is
 * simply tried at the next tick. */
static void reclaim_done(void *arg, const struct hub_pg_outcome *out) {
    struct hub_dispatch *d = arg;
    int rows;
    PGresult *r = committed_result(out, HUB_RECLAIM_NCOLS, &rows);

    d->aux_inflight--;
    for (int i = 0; i < rows; i++) {
        int dead = strcmp(PQgetvalue(r, i, HUB_RECLAIM_STATE), "dead") == 0;
        hub_log(dead ? HUB_WARN : HUB_INFO,
                dead ? "job is poison: its lease expired too often" : "expired lease reclaimed",
                HUB_LS("job", PQgetvalue(r, i, HUB_RECLAIM_JOB_ID)),
                HUB_LS("tenant", PQgetvalue(r, i, HUB_RECLAIM_TENANT)),
                HUB_LS("subscription", PQgetvalue(r, i, HUB_RECLAIM_SUB_ID)));
        if (!dead) {
            continue;
        }
        d->hub->metrics.deliveries[HUB_D_POISON]++;
        hub_opevents_dead(d->hub, PQgetvalue(r, i, HUB_RECLAIM_TENANT),
                          PQgetvalue(r, i, HUB_RECLAIM_SUB_ID),
                          strtoll(PQgetvalue(r, i, HUB_RECLAIM_JOB_ID), NULL, 10),
                          PQgetvalue(r, i, HUB_RECLAIM_EVENT_ID),
                          PQgetvalue(r, i, HUB_RECLAIM_EVENT_TYPE), "poison");
    }
    dispatch_maybe_done(d);
}

/* Runs on the hub's main pool (hub->pg), as the due-jobs sample does, not on
 * the dispatcher's own connections. */
void dispatch_reclaim(struct hub_dispatch *d) {
    char threshold[16];
    const char *params[1] = {threshold};
    struct hub_pg_txn *txn = hub_pg_txn_new(d->hub->pg, reclaim_done, d);

    if (txn == NULL) {
        return;
    }
    snprintf(threshold, sizeof(threshold), "%lld", (long long)d->hub->cfg.poison_threshold);
    hub_pg_txn_add(txn, &hub_sql_dispatch_reclaim, 1, params, NULL, NULL);
    d->aux_inflight++;
    hub_pg_txn_submit(txn);
}

/* The sweep's transaction ended: logs the jobs it parked.  A failed sweep
 * is simply tried at the next tick. */
static void park_stragglers_done(void *arg, const struct hub_pg_outcome *out) {
    struct hub_dispatch *d = arg;
    int rows;
    PGresult *r = committed_result(out, HUB_PARK_STRAGGLERS_NCOLS, &rows);

    d->aux_inflight--;
    for (int i = 0; i < rows; i++) {
        hub_log(HUB_INFO,
                "job parked: its ingest committed after its subscription stopped being "
                "deliverable",
                HUB_LS("job", PQgetvalue(r, i, HUB_PARK_STRAGGLERS_JOB_ID)),
                HUB_LS("subscription", PQgetvalue(r, i, HUB_PARK_STRAGGLERS_SUB_ID)));
    }
    dispatch_maybe_done(d);
}

void dispatch_park_stragglers(struct hub_dispatch *d) {
    struct hub_pg_txn *txn = hub_pg_txn_new(d->hub->pg, park_stragglers_done, d);

    if (txn == NULL) {
        return;
    }
    hub_pg_txn_add(txn, &hub_sql_dispatch_park_stragglers, 0, NULL, NULL, NULL);
    d->aux_inflight++;
    hub_pg_txn_submit(txn);
}

/* Only records never written are left: none after a drain that ended. */
void dispatch_outcome_free(struct hub_dispatch *d) {
    for (size_t i = 0; i < d->n_outcomes; i++) {
        free(d->outcomes[i].excerpt);
    }
    free(d->outcomes);
    d->outcomes = NULL;
    d->n_outcomes = d->cap_outcomes = 0;
    free(d->stale);
    d->stale = NULL;
    d->n_stale = d->cap_stale = 0;
}
