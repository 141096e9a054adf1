/*
 * opevents — operational events for tenants (see opevents.h).
 *
 * One event's path: a hook (dispatch_outcome.c, or the policy registry's
 * trip callback) ──► the rate limit of its (subscription, type) ──► a
 * structured CloudEvent built as JSON text and parsed by the envelope
 * parser, like any structured event ──► hub_ingest_store() ──► stored,
 * matched, jobs made ──► freed in the store's callback.
 *
 * A trip names a policy, not a tenant: the subscriptions that use it are
 * looked up first (enabled ones, at most OPEV_TRIP_SUBS), and each gets
 * its tenant's event.
 */
#include "opevents.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "bucket.h"
#include "envelope.h"
#include "error.h"
#include "hub.h"
#include "ingest.h"
#include "log.h"
#include "pg.h"
#include "policy.h"
#include "store_workbench.h"
#include "util.h"
#include "uuid.h"

#define OPEV_SOURCE "streaming-hub"
#define OPEV_TRIP_SUBS "1000" /* subscriptions told of one trip, at most */

static const char *const type_names[HUB_OPEV__COUNT] = {"hub.subscription.disabled",
                                                        "hub.delivery.dead", "hub.policy.tripped"};
static const char *const result_names[HUB_OPEV_RESULT__COUNT] = {"published", "limited", "failed"};

struct hub_opevents {
    struct hub_buckets *buckets; /* per "<type>:<subscription>" */
    double rate, burst;          /* events per second, and at once */
    uint64_t counts[HUB_OPEV__COUNT][HUB_OPEV_RESULT__COUNT];
};

/* One event being stored: the record hub_ingest_store borrows, and the
 * text its event was parsed from (the payload points into the arena). */
struct opev_pub {
    struct hub_ingest_rec rec;
    char *text;
    struct hub *hub;
    enum hub_opevent_type type;
};

/* -------------------------------------------------------------- storing -- */

static void count(struct hub *hub, enum hub_opevent_type type, enum hub_opevent_result r) {
    if (hub->opevents != NULL) {
        hub->opevents->counts[type][r]++;
    }
}

/* The store's answer (loop): counted, and the record freed.  A duplicate
 * counts as published: ids are fresh UUIDv7s, so it can only be the same
 * event stored by an earlier try of the same transaction. */
static void stored(void *arg, const struct hub_pg_outcome *failure) {
    struct opev_pub *p = arg;
    int ok = failure == NULL && !p->rec.unsettled &&
             (p->rec.verdict == HUB_V_ACCEPTED || p->rec.verdict == HUB_V_DUPLICATE);

    count(p->hub, p->type, ok ? HUB_OPEV_PUBLISHED : HUB_OPEV_FAILED);
    if (!ok) {
        /* a dropped verdict: the tenant is inactive or gone */
        hub_log(HUB_WARN, "operational event not stored", HUB_LS("type", type_names[p->type]),
                HUB_LS("tenant", p->rec.ev.tenant),
                HUB_LS("error", failure != NULL ? failure->error : "not accepted"));
    }
    ingest_rec_schema_free(&p->rec); /* a hub.* type may have schemas too */
    hub_event_free(&p->rec.ev);
    free(p->text);
    free(p);
}

/*
 * Publishes one event of type into tenant's stream about subscription,
 * with data (taken).  Rate-limited per (subscription, type).
 */
static void publish(struct hub *hub, enum hub_opevent_type type, const char *tenant,
                    const char *subscription, json_t *data) {
    struct hub_opevents *ops = hub->opevents;
    struct hub_envelope_limits lim = {.max_event_bytes = (size_t)hub->cfg.max_event_bytes};
    struct hub_envelope_error err = {0};
    static const char ct[] = "application/cloudevents+json";
    struct hub_header h = {"content-type", 12, ct, sizeof(ct) - 1};
    char key[320], id[HUB_UUID_TEXT_SIZE], now[40];
    struct opev_pub *p = NULL;
    json_t *ev = NULL;

    if (ops == NULL || tenant == NULL || subscription == NULL) {
        json_decref(data);
        return;
    }
    snprintf(key, sizeof(key), "%d:%s", (int)type, subscription);
    if (hub_bucket_take(&ops->buckets, key, ops->rate, ops->burst, 1.0, hub_now_ns()) > 0.0) {
        ops->counts[type][HUB_OPEV_LIMITED]++;
        json_decref(data);
        return;
    }
    hub_uuid7_text(id);
    hub_rfc3339(hub_unix_us(), 3, now, sizeof(now));
    ev = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:o}", "specversion", "1.0", "id", id,
                   "source", OPEV_SOURCE, "type", type_names[type], "time", now, "tenantid", tenant,
                   "subject", subscription, "datacontenttype", "application/json", "data", data);
    p = calloc(1, sizeof(*p));
    if (ev == NULL || p == NULL || (p->text = json_dumps(ev, JSON_COMPACT)) == NULL) {
        goto fail;
    }
    p->hub = hub;
    p->type = type;
    if (hub_envelope_parse(HUB_ENVELOPE_HTTP, &h, 1, p->text, strlen(p->text), NULL, &lim,
                           &p->rec.ev, &err) != 0) {
        hub_log(HUB_ERROR, "operational event refused by the envelope", HUB_LS("field", err.field),
                HUB_LS("error", err.message));
        goto fail;
    }
    p->rec.ok = 1;
    p->rec.value = p->text;
    p->rec.value_len = strlen(p->text);
    p->rec.claimed_tenant = p->rec.ev.tenant;
    p->rec.claimed_source = p->rec.ev.source;
    p->rec.claimed_id = p->rec.ev.id;
    json_decref(ev);
    hub_ingest_store(hub, &p->rec, 1, stored, p);
    return;

fail:
    ops->counts[type][HUB_OPEV_FAILED]++;
    if (p != NULL) {
        free(p->text);
        free(p);
    }
    json_decref(ev);
}

/* ------------------------------------------------------------ the hooks -- */

void hub_opevents_disabled(struct hub *hub, const char *tenant, const char *subscription,
                           const char *reason) {
    char now[40];

    if (hub->opevents == NULL) {
        return;
    }
    hub_rfc3339(hub_unix_us(), 3, now, sizeof(now));
    publish(hub, HUB_OPEV_SUB_DISABLED, tenant, subscription,
            json_pack("{s:s, s:s, s:s}", "subscription_id", subscription, "reason",
                      reason != NULL ? reason : "disabled", "disabled_at", now));
}

void hub_opevents_dead(struct hub *hub, const char *tenant, const char *subscription,
                       int64_t job_id, const char *event_id, const char *event_type,
                       const char *reason) {
    if (hub->opevents == NULL) {
        return;
    }
    /* an operational event that could not be delivered tells nobody: a
     * subscription failing on them would otherwise feed itself */
    if (event_type != NULL && strncmp(event_type, "hub.", 4) == 0) {
        return;
    }
    publish(hub, HUB_OPEV_DELIVERY_DEAD, tenant, subscription,
            json_pack("{s:s, s:I, s:s?, s:s?, s:s?}", "subscription_id", subscription, "job_id",
                      (json_int_t)job_id, "event_id", event_id, "event_type", event_type, "reason",
                      reason));
}

/* What a trip tells each subscription of the policy (borrowed): of the
 * tenant it tripped for, or of every tenant when it tripped for all. */
struct trip_note {
    struct hub *hub;
    char policy[HUB_POLICY_NAME_MAX + 1];
    char *tenant; /* NULL: every tenant */
    char until[40];
    char *last_error;
};

/* The subscriptions of the tripped policy came back: one event each. */
static void trip_subs_done(void *arg, const struct hub_pg_outcome *out) {
    struct trip_note *t = arg;
    PGresult *r = out->n_results > 0 ? out->results[0] : NULL;
    int rows = out->status == HUB_PG_OK && r != NULL ? PQntuples(r) : 0;

    if (out->status != HUB_PG_OK) {
        count(t->hub, HUB_OPEV_POLICY_TRIPPED, HUB_OPEV_FAILED);
        hub_log(HUB_WARN, "the subscriptions of a tripped policy could not be read",
                HUB_LS("policy", t->policy), HUB_LS("error", out->error));
    }
    for (int i = 0; i < rows; i++) {
        const char *sub = PQgetvalue(r, i, HUB_OPEV_SUBS_COL_ID);
        publish(t->hub, HUB_OPEV_POLICY_TRIPPED, PQgetvalue(r, i, HUB_OPEV_SUBS_COL_TENANT), sub,
                json_pack("{s:s, s:s, s:s, s:s?}", "subscription_id", sub, "policy", t->policy,
                          "tripped_until", t->until, "last_error", t->last_error));
    }
    free(t->tenant);
    free(t->last_error);
    free(t);
}

/* The registry's trip callback (loop).  It must not call back into the
 * registry (policy.h): the lookup of the policy's subscriptions goes to
 * the database, and the events are published from its answer.  The note
 * outlives the callback's borrowed strings, so it copies them. */
static void on_trip(void *arg, const char *policy, const char *tenant, int64_t until_ms,
                    const char *last_error) {
    struct hub *hub = arg;
    struct trip_note *t;
    struct hub_pg_txn *txn;

    if (hub->opevents == NULL || hub->pg == NULL || (t = calloc(1, sizeof(*t))) == NULL) {
        return;
    }
    t->hub = hub;
    snprintf(t->policy, sizeof(t->policy), "%s", policy);
    hub_rfc3339(until_ms * 1000, 3, t->until, sizeof(t->until));
    t->last_error = last_error != NULL ? strdup(last_error) : NULL;
    t->tenant = tenant != NULL ? strdup(tenant) : NULL;
    if ((tenant != NULL && t->tenant == NULL) ||
        (txn = hub_pg_txn_new(hub->pg, trip_subs_done, t)) == NULL) {
        free(t->tenant);
        free(t->last_error);
        free(t);
        return;
    }
    hub_pg_txn_add(txn, &hub_sql_opevents_policy_subs, HUB_SQL_OPEVENTS_POLICY_SUBS_NPARAMS,
                   (const char *[]){t->policy, OPEV_TRIP_SUBS, t->tenant}, NULL, NULL);
    hub_pg_txn_submit(txn);
}

/* ------------------------------------------------------------ lifecycle -- */

/* The rate is per second for the token bucket: STREAMING_HUB_OPEVENTS_PER_MINUTE
 * / 60, with the burst as the bucket's depth (a new bucket starts full, so
 * the first events about a subscription always go out). */
int hub_opevents_start(struct hub *hub) {
    struct hub_opevents *ops;

    if (!hub->cfg.opevents_enabled) {
        return 0;
    }
    if ((ops = calloc(1, sizeof(*ops))) == NULL) {
        return HUB_ENOMEM;
    }
    ops->rate = (double)hub->cfg.opevents_per_minute / 60.0;
    ops->burst = (double)hub->cfg.opevents_burst;
    hub->opevents = ops;
    if (hub->policies != NULL) {
        hub_policies_on_trip(hub->policies, on_trip, hub);
    }
    return 0;
}

void hub_opevents_stop(struct hub *hub) {
    struct hub_opevents *ops = hub->opevents;

    if (ops == NULL) {
        return;
    }
    if (hub->policies != NULL) {
        hub_policies_on_trip(hub->policies, NULL, NULL);
    }
    hub->opevents = NULL;
    hub_buckets_free(&ops->buckets);
    free(ops);
}

void hub_opevents_metrics_render(const struct hub *hub, FILE *out) {
    const struct hub_opevents *ops = hub->opevents;

    if (ops == NULL) {
        return;
    }
    fprintf(out, "# HELP streaming_hub_opevents_total Operational events for tenants, by type "
                 "and result (published, limited: over the subscription's rate, failed).\n"
                 "# TYPE streaming_hub_opevents_total counter\n");
    for (int t = 0; t < HUB_OPEV__COUNT; t++) {
        for (int r = 0; r < HUB_OPEV_RESULT__COUNT; r++) {
            fprintf(out, "streaming_hub_opevents_total{type=\"%s\",result=\"%s\"} %llu\n",
                    type_names[t], result_names[r], (unsigned long long)ops->counts[t][r]);
        }
    }
}
