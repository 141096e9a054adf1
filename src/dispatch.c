/*
 * dispatch — the delivery engine's lifecycle and public face (see
 * dispatch.h); the work is done by its parts, listed with who owns a job
 * when in dispatch_int.h:
 *
 *   dispatch_claim.c    tenant sample, claim, load, local queue
 *   dispatch_attempt.c  policy, max_rate, breaker, signed request, httpc
 *   dispatch_outcome.c  outcome batches, streaks, 410, auto-disable, reclaim
 *   dispatch_fast.c     jobs leased by the ingest transaction, handed over
 *   store_dispatch.c    every SQL text they run
 *
 * This file makes the dispatcher (its pools, breakers, timers), drains and
 * frees it, and answers the gauges.  The timers: the claim timer (the claim
 * part starts it, dispatch_claim_soon), the flush timer (the outcome part's
 * batching window), the reclaim timer (every lease / 4, at least 1 s) and the
 * due-jobs sample (every DISPATCH_DUE_SAMPLE_MS, which also sweeps the
 * destination slots of dispatch_caps.h).
 *
 * Lab notes of the dispatcher (what each design choice was measured to
 * cost): docs/performance.md, "Notes moved out of the dispatcher's code
 * (issue 22)".
 */
#include "dispatch.h"

#include <jansson.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "breaker.h"
#include "dispatch_caps.h"
#include "dispatch_int.h"
#include "error.h"
#include "hub.h"
#include "log.h"
#include "pg.h"
#include "store_dispatch.h"
#include "store_subs.h"
#include "uuid.h"

#define DISPATCH_DUE_SAMPLE_MS 5000 /* the jobs_due gauge */
#define DISPATCH_TIMERS 4           /* claim, flush, reclaim, sample */

/* ------------------------------------------------------------ gauges -- */

/* The due-jobs sample ended: sets the jobs_due gauge (left as it was when
 * the sample failed). */
static void sample_done(void *arg, const struct hub_pg_outcome *out) {
    struct hub_dispatch *d = arg;
    d->aux_inflight--;
    if (out->status == HUB_PG_OK && out->n_results > 0 && out->results[0] &&
        PQntuples(out->results[0]) == 1) {
        d->hub->metrics.jobs_due = atoll(PQgetvalue(out->results[0], 0, HUB_DUE_SAMPLE_COUNT));
    }
    dispatch_maybe_done(d);
}

/* Counts the due jobs (hub_sql_dispatch_due_sample) for the gauge, on the
 * hub's main pool; counted in aux_inflight so that a drain waits for it. */
static void sample_timer_cb(uv_timer_t *t) {
    struct hub_dispatch *d = t->data;
    struct hub_pg_txn *txn = hub_pg_txn_new(d->hub->pg, sample_done, d);

    hub_caps_sweep(d->caps, dispatch_unix_ms());
    if (txn != NULL) {
        hub_pg_txn_add(txn, &hub_sql_dispatch_due_sample, 0, NULL, NULL, NULL);
        d->aux_inflight++;
        hub_pg_txn_submit(txn);
    }
}

/* Every lease / 4 (at least 1 s): an expired lease waits at most that long
 * past its expiry to be reclaimed; and the sweep that parks what an ingest
 * left pending for a subscription that stopped being deliverable. */
static void reclaim_timer_cb(uv_timer_t *t) {
    dispatch_reclaim(t->data);
    dispatch_park_stragglers(t->data);
}

/* ------------------------------------------------------------ lifecycle -- */

/* Attempts one tenant may have in flight: the workers but an eighth of
 * them (at least one) kept for the others.  A tenant alone still gets 7/8
 * of them; a single worker is no one's to keep (0: no bound). */
static int dispatch_tenant_max(int workers) {
    int reserve = workers / 8 > 1 ? workers / 8 : 1;
    return workers > reserve ? workers - reserve : 0;
}

/* A subscription changed (its id), or the listening session was lost or is
 * new (NULL): hub_pg_listen's callback on the claim connection.  Anyone
 * with a database role may NOTIFY the channel: a payload that is not a
 * subscription id (as the PATCH and DELETE send it, lower-case) is no
 * reason to give anything back. */
static void subs_notified(void *arg, const char *payload) {
    unsigned char bytes[HUB_UUID_BYTES];
    char canonical[HUB_UUID_TEXT_SIZE];

    if (payload != NULL) {
        if (hub_uuid_parse(payload, strlen(payload), bytes) != 0) {
            return;
        }
        hub_uuid_format(bytes, canonical);
        if (strcmp(canonical, payload) != 0) {
            return;
        }
    }
    hub_dispatch_subscription_changed(arg, payload);
}

/* Makes the dispatcher: lease owner, breakers, its three pools, timers; the
 * first claim runs on the next loop iteration. */
int hub_dispatch_start(struct hub *hub, struct hub_dispatch **out) {
    struct hub_dispatch *d = calloc(1, sizeof(*d));
    struct hub_breaker_cfg bcfg = HUB_BREAKER_CFG_DEFAULT;
    const char *dsn = hub->cfg.postgres_dsn;
    char host[64] = "hub";
    unsigned char r[6];
    char rhex[13];
    uint64_t lease = (uint64_t)hub->cfg.dispatch_lease_ms;

    if (d == NULL) {
        goto fail;
    }
    d->hub = hub;
    gethostname(host, sizeof(host) - 1);
    RAND_bytes(r, sizeof(r));
    hub_hex(r, sizeof(r), rhex);
    /* host/pid/random: unique per process start, so that no two
     * dispatchers, nor two runs of one, share a lease owner */
    snprintf(d->owner, sizeof(d->owner), "%s/%d/%s", host, (int)getpid(), rhex);

    bcfg.consecutive_failures = (int)hub->cfg.breaker_consecutive_failures;
    bcfg.failure_ratio = hub->cfg.breaker_failure_ratio;
    bcfg.min_attempts = (int)hub->cfg.breaker_min_attempts;
    bcfg.window_ms = hub->cfg.breaker_window_ms;
    bcfg.open_ms = hub->cfg.breaker_open_ms;
    bcfg.open_max_ms = hub->cfg.breaker_open_max_ms;
    d->breakers = hub_breakers_new(&bcfg);
    /* Attempt slots per destination origin and per (tenant, origin): the
     * claim offers only lanes with room, so a slow or hanging destination
     * holds its share of the workers, not all of them.  A fast one may keep
     * the queue's own run-ahead waiting past its cap (two claim batches),
     * so that claims stay whole batches.  One tenant's lanes together never
     * hold the last workers (dispatch_tenant_max), and each further tenant
     * leaves as many free as it holds (hub_caps_ready): many hanging
     * destinations of one tenant, or of two, would otherwise take every
     * worker, and every other tenant would wait for their timeouts. */
    d->caps = hub_caps_new(&(struct hub_caps_cfg){
        .origin_max = (int)hub->cfg.dispatch_origin_max,
        .tenant_origin_max = (int)hub->cfg.dispatch_tenant_origin_max,
        .start = (int)hub->cfg.dispatch_tenant_origin_start,
        .slow_ms = hub->cfg.dispatch_slow_answer_ms,
        .ahead_ms = hub->cfg.dispatch_queue_ahead_ms,
        .ahead_floor = 2 * (int)hub->cfg.dispatch_claim_batch,
        .tenant_max = dispatch_tenant_max((int)hub->cfg.dispatch_workers),
        .workers = (int)hub->cfg.dispatch_workers,
    });
    /* Claims and outcome writes have connections of their own: a claim
     * never queues behind a batch of outcomes or an API request.  A claim's
     * commit need not wait for the disk: should the database lose it in a
     * crash, the job is simply pending again (at least once), and the
     * outcome of an attempt, committed synchronously, flushes the WAL up to
     * and past the claim it follows. */
    d->pg_claim = hub_pg_new(hub->loop, dsn, 1, "streaming-hub-claim",
                             HUB_DISPATCH_PG_OPTIONS " -c synchronous_commit=off");
    d->pg_load = hub_pg_new(hub->loop, dsn, 1, "streaming-hub-load", HUB_DISPATCH_PG_OPTIONS);
    d->pg_out = hub_pg_new(hub->loop, dsn, DISPATCH_OUT_CONNECTIONS, "streaming-hub-outcomes",
                           HUB_DISPATCH_PG_OPTIONS);
    if (d->breakers == NULL || d->caps == NULL || d->pg_claim == NULL || d->pg_load == NULL ||
        d->pg_out == NULL) {
        if (d->pg_claim != NULL) {
            hub_pg_close(d->pg_claim, NULL, NULL);
        }
        if (d->pg_load != NULL) {
            hub_pg_close(d->pg_load, NULL, NULL);
        }
        if (d->pg_out != NULL) {
            hub_pg_close(d->pg_out, NULL, NULL);
        }
        hub_breakers_free(d->breakers);
        hub_caps_free(d->caps);
        free(d);
        goto fail;
    }
    /* another process's API changed a subscription: its jobs held here
     * go back (the claim's session hears it; a new session, everything) */
    if (hub_pg_listen(d->pg_claim, HUB_SUBS_CHANGED_CHANNEL, subs_notified, d) != 0) {
        hub_log(HUB_WARN, "cannot listen for subscription changes (out of memory)");
    }
    uv_timer_init(hub->loop, &d->claim_timer);
    uv_timer_init(hub->loop, &d->flush_timer);
    uv_timer_init(hub->loop, &d->reclaim_timer);
    uv_timer_init(hub->loop, &d->sample_timer);
    d->claim_timer.data = d->flush_timer.data = d->reclaim_timer.data = d->sample_timer.data = d;
    d->open_handles = DISPATCH_TIMERS;
    dispatch_claim_soon(d, 0);
    uv_timer_start(&d->reclaim_timer, reclaim_timer_cb, 1000, lease / 4 > 1000 ? lease / 4 : 1000);
    uv_timer_start(&d->sample_timer, sample_timer_cb, 1000, DISPATCH_DUE_SAMPLE_MS);
    if (hub->cfg.dispatch_lease_ms - hub->cfg.delivery_timeout_ms <= DISPATCH_OUTCOME_MARGIN_MS) {
        hub_log(HUB_WARN,
                "STREAMING_HUB_DISPATCH_LEASE is not 2s longer than "
                "STREAMING_HUB_DELIVERY_TIMEOUT: a slow attempt can outlive its lease, and "
                "its job is then reclaimed and attempted again meanwhile",
                HUB_LI("lease_ms", hub->cfg.dispatch_lease_ms),
                HUB_LI("timeout_ms", hub->cfg.delivery_timeout_ms));
    }
    hub_log(HUB_INFO, "dispatcher started", HUB_LS("owner", d->owner),
            HUB_LI("workers", hub->cfg.dispatch_workers),
            HUB_LI("claim_batch", hub->cfg.dispatch_claim_batch),
            HUB_LI("origin_max", hub->cfg.dispatch_origin_max),
            HUB_LI("tenant_origin_max", hub->cfg.dispatch_tenant_origin_max));
    *out = d;
    return HUB_OK;

fail:
    /* every step that can fail here is an allocation */
    hub_log(HUB_ERROR, "cannot start the dispatcher", HUB_LS("error", hub_strerror(HUB_ENOMEM)));
    return HUB_ENOMEM;
}

/* A timer closed; the last one frees the dispatcher and calls done_cb. */
static void dispatch_handle_closed(uv_handle_t *h) {
    struct hub_dispatch *d = h->data;
    if (--d->open_handles > 0) {
        return;
    }
    void (*cb)(void *) = d->done_cb;
    void *arg = d->done_arg;
    hub_breakers_free(d->breakers);
    dispatch_attempt_free(d);
    dispatch_outcome_free(d);
    dispatch_claim_free(d);
    hub_caps_free(d->caps); /* after the jobs that held its slots */
    free(d);
    if (cb) {
        cb(arg);
    }
}

/* Once asked to stop: no attempt in flight, no claim, every outcome written.
 * Once it closed the pools and the timers, it is called still (an HTTP
 * ingest group's commit ends here until the hub forgets the dispatcher,
 * after the timers' close callbacks): closing makes those calls no-ops.
 * Set before the pools close, whose callbacks may call back here. */
void dispatch_maybe_done(struct hub_dispatch *d) {
    if (!d->stop_asked || d->closing || d->inflight > 0 || d->n_queue > 0 || d->claiming ||
        d->loading > 0 || d->flushing || d->aux_inflight > 0 || d->fast_offers > 0) {
        return;
    }
    if (d->n_outcomes > 0) {
        /* its flush_done calls back here once the batch is written */
        dispatch_flush(d);
        return;
    }
    d->closing = 1;
    hub_pg_close(d->pg_claim, NULL, NULL);
    hub_pg_close(d->pg_load, NULL, NULL);
    hub_pg_close(d->pg_out, NULL, NULL);
    d->pg_claim = d->pg_load = d->pg_out = NULL;
    uv_close((uv_handle_t *)&d->claim_timer, dispatch_handle_closed);
    uv_close((uv_handle_t *)&d->flush_timer, dispatch_handle_closed);
    uv_close((uv_handle_t *)&d->reclaim_timer, dispatch_handle_closed);
    uv_close((uv_handle_t *)&d->sample_timer, dispatch_handle_closed);
}

void hub_dispatch_quiesce(struct hub_dispatch *d) {
    if (d->stopping) {
        return;
    }
    d->stopping = 1;
    /* the flush timer keeps running: the last outcomes still go out by it */
    uv_timer_stop(&d->claim_timer);
    uv_timer_stop(&d->reclaim_timer);
    uv_timer_stop(&d->sample_timer);
    if (d->inflight > 0 || d->n_queue > 0) {
        hub_log(HUB_INFO, "dispatcher draining", HUB_LI("attempts_in_flight", (int64_t)d->inflight),
                HUB_LI("jobs_released", (int64_t)d->n_queue));
    }
    dispatch_pump(d); /* claimed but not started: back to the table, no reclaim counted */
}

void hub_dispatch_stop(struct hub_dispatch *d, void (*done_cb)(void *arg), void *arg) {
    hub_dispatch_quiesce(d);
    d->stop_asked = 1;
    d->done_cb = done_cb;
    d->done_arg = arg;
    dispatch_maybe_done(d);
}

void hub_dispatch_kick(struct hub_dispatch *d) {
    if (d == NULL || d->stopping) {
        return;
    }
    d->tenants_dirty = 1; /* perhaps a tenant the sample has not seen */
    d->claim_dry = 0;     /* new jobs: the next claim has something to find */
    if (d->claiming) {
        /* the claim in flight may have missed them: claim_done (or the
         * sample's tenants_done) claims again at once */
        d->kicked = 1;
        return;
    }
    dispatch_claim_soon(d, 0);
}

size_t hub_dispatch_inflight(const struct hub_dispatch *d) {
    return d ? d->inflight : 0;
}

/* Only the caps render here: the dispatcher's other series are gauges of
 * struct hub_metrics (metrics.c). */
void hub_dispatch_metrics_render(const struct hub_dispatch *d, FILE *out) {
    if (d != NULL) {
        hub_caps_metrics_render(d->caps, out);
    }
}

size_t hub_dispatch_breakers_open(struct hub_dispatch *d) {
    return d ? hub_breakers_open_count(d->breakers, dispatch_unix_ms()) : 0;
}

/* One breaker as a JSON object appended to the array arg. */
static void breaker_json_cb(void *arg, const char *tenant, const char *origin, const char *state,
                            int64_t opened_at_ms, int64_t retry_at_ms, int consecutive_failures) {
    json_t *o = json_object();
    json_object_set_new(o, "tenant_id", json_string(tenant));
    json_object_set_new(o, "origin", json_string(origin));
    json_object_set_new(o, "state", json_string(state));
    json_object_set_new(o, "opened_at_ms", json_integer(opened_at_ms));
    json_object_set_new(o, "retry_at_ms", json_integer(retry_at_ms));
    json_object_set_new(o, "consecutive_failures", json_integer(consecutive_failures));
    json_array_append_new(arg, o);
}

char *hub_dispatch_breakers_json(struct hub_dispatch *d) {
    json_t *arr = json_array();
    char *text;
    if (d != NULL) {
        hub_breakers_list(d->breakers, dispatch_unix_ms(), breaker_json_cb, arr);
    }
    text = json_dumps(arr, JSON_COMPACT);
    json_decref(arr);
    return text;
}
