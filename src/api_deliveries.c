/*
 * api_deliveries — the deliveries over the tenant API (SPEC §9; see
 * api_subs_internal.h): the jobs of one subscription or of all the
 * tenant's, one job with its attempts, redelivering a dead job, and
 * replaying stored events into new jobs.
 *
 * Each route is one transaction whose statement filters on the
 * authenticated tenant, so another tenant's job or subscription is simply
 * "not found".  Delivery objects are rendered by PostgreSQL
 * (store_subs.c) and passed through as they are.
 *
 * Verification is a gate (SPEC §6): replay and redeliver on a subscription
 * that is not verified ('pending' after a url change, or 'failed') make no
 * job and answer 409 naming the state.  On a verified but disabled one they
 * make parked jobs, which resume when it is enabled.
 *
 * Both POSTs honour Idempotency-Key (api_idem.h, scope "tenant:<id>"): the
 * statement that makes the jobs stores the answer with its record, and the
 * first answer and its replays are rendered by the same code
 * (hub_api_idem_send_stored), so a replay is the first answer byte for byte.
 */
#include "api_subs_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_filters.h"
#include "envelope.h"
#include "hub.h"
#include "log.h"
#include "stats.h"
#include "store_console.h"
#include "store_subs.h"
#include "util.h"

/* Bounds of one replay call: a replay is one statement, so its size is
 * the size of one transaction on the event and job tables. */
/* (REPLAY_MAX_EVENTS bounds the answer's "truncated" too: store_subs.c.) */
#define REPLAY_MAX_EVENTS 100000 /* per call */
#define REPLAY_INTERVAL_MS 5000  /* between two replays of one subscription */

/* Answers a delivery object as PostgreSQL rendered it (re-serialised, so
 * that every answer has one byte format). */
static void send_delivery(h2o_req_t *req, int status, PGresult *r) {
    json_t *obj = hub_api_pg_object(req, PQgetvalue(r, 0, HUB_SUBS_OBJECT),
                                    (size_t)PQgetlength(r, 0, HUB_SUBS_OBJECT));

    if (obj == NULL) {
        return;
    }
    hub_api_send_json(req, status, obj);
    json_decref(obj);
}

/* ======================================================== deliveries ======= */

/* Two results: the subscription's existence (hub_sql_subs_exists), then
 * the page (hub_subs_page_col).  An unknown subscription is 404 rather
 * than an empty list, which would hide a wrong id. */
static void deliv_list_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    PGresult *exists = out->results[0];

    if (out->status != HUB_PG_OK || exists == NULL || out->results[1] == NULL) {
        hub_api_send_db_error(call->req, out);
        return;
    }
    if (PQntuples(exists) == 0) {
        hub_api_send_problem(call->req, 404, "subscription not found", NULL);
        return;
    }
    hub_api_send_page(call->req, out->results[1], ((struct subs_call *)call)->limit, "deliveries",
                      HUB_SUBS_PAGE_KEY, HUB_SUBS_PAGE_OBJECT, NULL, NULL);
}

/* GET /v1/subscriptions/{id}/deliveries?state=&event_id=&since=&until=
 * &limit=&cursor=: the jobs of one subscription, newest first (job ids),
 * optionally of one state, of one event, made in [since, until)
 * (api_filters.h). */
void hub_subs_deliveries_list(struct subs_call *c) {
    h2o_req_t *req = c->call.req;
    struct hub_api_page page;
    struct hub_deliv_filter f;
    json_t *errors = NULL;
    struct hub_pg_txn *txn;
    char limit[HUB_SUBS_LIMIT_TEXT];
    int oom = 0;

    hub_api_page_parse(req, "deliveries", &page, &errors);
    /* job ids are bigints: any other cursor value would fail the cast */
    if (page.after != NULL && !hub_api_positive_id(page.after, strlen(page.after))) {
        hub_api_errors_add(&errors, "cursor", "is not a cursor of this list");
    }
    hub_deliv_filter_parse(req, 1, &f, &errors);
    if (hub_subs_page_keep(c, &page, errors, limit) != 0) {
        return;
    }
    c->state = hub_api_strdup(f.state, &oom);
    if (oom) {
        hub_api_send_oom(req);
        return;
    }
    /* the subscription's existence tells "not found" from an empty list */
    txn = hub_api_call_txn(&c->call, deliv_list_done);
    if (txn == NULL) {
        return;
    }
    hub_pg_txn_add(txn, &hub_sql_subs_exists, 2, (const char *[]){c->tenant_id, c->object_id}, NULL,
                   NULL);
    /* the event id borrows the request pool: the transaction copies it */
    hub_pg_txn_add(
        txn, f.event_id != NULL ? &hub_sql_deliveries_of_event : &hub_sql_deliveries_list, 8,
        (const char *[]){c->tenant_id, c->object_id, c->state, c->after, limit, f.event_id,
                         hub_deliv_filter_since(&f), hub_deliv_filter_until(&f)},
        NULL, NULL);
    hub_api_call_submit(&c->call, txn);
}

static void deliv_list_all_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    if (out->status != HUB_PG_OK || out->results[0] == NULL) {
        hub_api_send_db_error(call->req, out);
        return;
    }
    hub_api_send_page(call->req, out->results[0], ((struct subs_call *)call)->limit, "deliveries",
                      HUB_CONSOLE_PAGE_KEY, HUB_CONSOLE_PAGE_OBJECT, NULL, NULL);
}

/* GET /v1/deliveries?subscription=&state=&event_id=&since=&until=&limit=
 * &cursor=: the tenant's jobs across its subscriptions, newest first (job
 * ids) — the operator's list (store_console.h) with the tenant fixed. */
void hub_deliveries_list(struct subs_call *c) {
    h2o_req_t *req = c->call.req;
    struct hub_api_page page;
    struct hub_deliv_filter f;
    json_t *errors = NULL;
    const char *sub = NULL;
    char limit[HUB_SUBS_LIMIT_TEXT];
    int r;

    hub_api_page_parse(req, "deliveries", &page, &errors);
    if (page.after != NULL && !hub_api_positive_id(page.after, strlen(page.after))) {
        hub_api_errors_add(&errors, "cursor", "is not a cursor of this list");
    }
    r = hub_api_query_param(req, "subscription", &sub);
    if (r < 0 || (r == 1 && !hub_api_uuid_valid(sub, strlen(sub)))) {
        hub_api_errors_add(&errors, "subscription", "must be a subscription id (a UUID)");
    }
    hub_deliv_filter_parse(req, 1, &f, &errors);
    if (hub_subs_page_keep(c, &page, errors, limit) != 0) {
        return;
    }
    /* the filters borrow the request pool: the statement copies them */
    hub_api_call_query(&c->call, deliv_list_all_done, hub_console_deliveries_sql(f.event_id), 8,
                       (const char *[]){c->tenant_id, r == 1 ? sub : NULL, f.event_id, f.state,
                                        hub_deliv_filter_since(&f), hub_deliv_filter_until(&f),
                                        c->after, limit});
}

/* GET /v1/deliveries/{id}: the job with its attempts (hub_sql_delivery_get). */
static void deliv_get_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    PGresult *r = hub_api_found(call->req, out, 0, "delivery not found");

    if (r == NULL) {
        return;
    }
    send_delivery(call->req, 200, r);
}

void hub_subs_delivery_get(struct subs_call *c) {
    hub_subs_run_by_id(c, &hub_sql_delivery_get, deliv_get_done);
}

/* The 409 of a replay or redeliver on a subscription that is not verified:
 * names its state and what to do. */
static void send_unverified(h2o_req_t *req, const char *state) {
    char detail[256];

    snprintf(detail, sizeof(detail),
             "the subscription's verification_state is %.16s: nothing is delivered to a "
             "destination that has not answered the verification challenge; verify it first "
             "(POST /v1/subscriptions/{id}/verify)",
             state);
    hub_api_send_problem(req, 409, detail, NULL);
}

/* A stored answer of replay or redeliver: as it was (hub_api_idem_ops). */
static void deliv_idem_replay(struct hub_api_call *call, int status, const char *text, size_t len) {
    hub_api_idem_send_stored(call->req, status, text, len, 1);
}

/*
 * The redeliver's two results (after the stale record's statement when
 * there is a key): the job made due again (one row only when it was dead
 * and its subscription verified), then its state and its subscription's as
 * they are now.  No first row: 409 naming the subscription's state when it
 * is not verified, else the job's; neither row is 404.
 */
static void redeliver_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct subs_call *c = (struct subs_call *)call;
    int first = hub_api_idem_first(call);
    PGresult *r = out->results[first], *st = out->results[first + 1];
    char detail[128];

    if (out->status != HUB_PG_OK || r == NULL || st == NULL) {
        if (!hub_api_idem_collided(call, out)) {
            hub_api_send_db_error(call->req, out);
        }
        return;
    }
    if (PQntuples(r) == 1) {
        hub_log(HUB_INFO, "delivery redelivered on request", HUB_LS("tenant", c->tenant_id),
                HUB_LS("job", c->object_id));
        hub_api_idem_send_stored(call->req, 200, PQgetvalue(r, 0, HUB_SUBS_OBJECT),
                                 (size_t)PQgetlength(r, 0, HUB_SUBS_OBJECT), 0);
        return;
    }
    if (PQntuples(st) == 0) {
        hub_api_send_problem(call->req, 404, "delivery not found", NULL);
        return;
    }
    if (strcmp(PQgetvalue(st, 0, HUB_DELIVERY_VERIFICATION), "active") != 0) {
        send_unverified(call->req, PQgetvalue(st, 0, HUB_DELIVERY_VERIFICATION));
        return;
    }
    snprintf(detail, sizeof(detail), "only a dead delivery can be redelivered; this one is %.20s",
             PQgetvalue(st, 0, HUB_DELIVERY_STATE));
    hub_api_send_problem(call->req, 409, detail, NULL);
}

/* No answer is stored under the key: the update and the read of the state
 * that explains a refusal, in one transaction (with the stale record's
 * removal first when there is a key). */
static void redeliver_proceed(struct hub_api_call *call) {
    struct subs_call *c = (struct subs_call *)call;
    struct hub_pg_txn *txn = hub_api_idem_txn(call, redeliver_done);

    if (txn == NULL) {
        return;
    }
    hub_pg_txn_add(
        txn, &hub_sql_delivery_redeliver, 5,
        (const char *[]){c->tenant_id, c->object_id, c->idem.scope, c->idem.key, c->idem.marker},
        NULL, NULL);
    hub_pg_txn_add(txn, &hub_sql_delivery_state, 2, (const char *[]){c->tenant_id, c->object_id},
                   NULL, NULL);
    hub_api_call_submit(call, txn);
}

static const struct hub_api_idem_ops redeliver_idem = {
    .proceed = redeliver_proceed,
    .replay = deliv_idem_replay,
};

/* POST /v1/deliveries/{id}/redeliver: no input but an optional
 * Idempotency-Key. */
void hub_subs_redeliver(struct subs_call *c) {
    h2o_iovec_t idem;

    if (!hub_subs_action_input(c->call.req, &idem)) {
        return;
    }
    hub_api_idem_start(&c->call, &c->idem, idem, HUB_SUBS_IDEM_SCOPE, c->tenant_id, "redeliver",
                       c->object_id, &redeliver_idem);
}

/* ============================================================ replay ======= */

/* The replay's one row (hub_subs_replay_col): 404, 409 (not verified), 429,
 * or 202 with the answer the statement made (and stored with a key). */
static void replay_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct subs_call *c = (struct subs_call *)call;
    int at = hub_api_idem_first(call) + 1; /* after the lock */
    PGresult *r = out->n_results > at ? out->results[at] : NULL;

    if (out->status != HUB_PG_OK || r == NULL || PQntuples(r) != 1) {
        if (!hub_api_idem_collided(call, out)) {
            hub_api_send_db_error(call->req, out);
        }
        return;
    }
    if (strcmp(PQgetvalue(r, 0, HUB_SUBS_REPLAY_FOUND), "0") == 0) {
        hub_api_send_problem(call->req, 404, "subscription not found", NULL);
        return;
    }
    if (strcmp(PQgetvalue(r, 0, HUB_SUBS_REPLAY_VERIFICATION), "active") != 0) {
        send_unverified(call->req, PQgetvalue(r, 0, HUB_SUBS_REPLAY_VERIFICATION));
        return;
    }
    if (!PQgetisnull(r, 0, HUB_SUBS_REPLAY_RETRY_AFTER)) {
        /* one replay per subscription per REPLAY_INTERVAL_MS */
        hub_api_add_header(call->req, "Retry-After", PQgetvalue(r, 0, HUB_SUBS_REPLAY_RETRY_AFTER));
        hub_api_send_problem(call->req, 429,
                             "a replay of this subscription ran moments ago; retry later", NULL);
        return;
    }
    hub_stats_replayed(call->hub->stats, c->tenant_id, /* stats.h */
                       atoll(PQgetvalue(r, 0, HUB_SUBS_REPLAY_CREATED)) +
                           atoll(PQgetvalue(r, 0, HUB_SUBS_REPLAY_REARMED)));
    hub_log(HUB_INFO, "subscription replay", HUB_LS("tenant", c->tenant_id),
            HUB_LS("subscription", c->object_id),
            HUB_LI("events", atoll(PQgetvalue(r, 0, HUB_SUBS_REPLAY_EVENTS))),
            HUB_LI("created", atoll(PQgetvalue(r, 0, HUB_SUBS_REPLAY_CREATED))),
            HUB_LI("rearmed", atoll(PQgetvalue(r, 0, HUB_SUBS_REPLAY_REARMED))));
    hub_api_idem_send_stored(call->req, 202, PQgetvalue(r, 0, HUB_SUBS_REPLAY_BODY),
                             (size_t)PQgetlength(r, 0, HUB_SUBS_REPLAY_BODY), 0);
}

/* No answer is stored under the key: the replay, one statement. */
static void replay_proceed(struct hub_api_call *call) {
    struct subs_call *c = (struct subs_call *)call;
    struct hub_pg_txn *txn = hub_api_idem_txn(call, replay_done);
    char interval[24], max[24];

    if (txn == NULL) {
        return;
    }
    snprintf(interval, sizeof(interval), "%d", REPLAY_INTERVAL_MS);
    snprintf(max, sizeof(max), "%d", REPLAY_MAX_EVENTS);
    hub_pg_txn_add(txn, &hub_sql_subs_replay_lock, 1, (const char *[]){c->object_id}, NULL, NULL);
    hub_pg_txn_add(txn, &hub_sql_subs_replay, 10,
                   (const char *[]){c->tenant_id, c->object_id, c->since, c->until,
                                    c->in.event_types, interval, max, c->idem.scope, c->idem.key,
                                    c->idem.marker},
                   NULL, NULL);
    hub_api_call_submit(call, txn);
}

static const struct hub_api_idem_ops replay_idem = {
    .proceed = replay_proceed,
    .replay = deliv_idem_replay,
};

/* A replay bound: an RFC 3339 string PostgreSQL can read back as text once
 * formatted, so not before 0001-01-01 (RFC 3339 allows year 0000, which
 * PostgreSQL's text input refuses).  Returns 1 with *us set, or 0. */
static int replay_time(const json_t *v, int64_t *us) {
    static const int64_t year1_us = INT64_C(-62135596800000000); /* 0001-01-01T00:00:00Z */
    return json_is_string(v) &&
           hub_rfc3339_parse(json_string_value(v), json_string_length(v), us) == 0 &&
           *us >= year1_us;
}

/*
 * POST /v1/subscriptions/{id}/replay {"since", "until", "event_types"}: new
 * jobs for the tenant's stored events received in [since, until) that the
 * subscription's event types (or the given ones) and schema major match;
 * jobs that exist already and finished (succeeded or dead) are re-armed,
 * pending ones are left alone.  At most REPLAY_MAX_EVENTS events per call
 * ("truncated" and "next_since" say where to continue), one call per
 * subscription per REPLAY_INTERVAL_MS (429 + Retry-After), audited.
 * "until" defaults to now (a retry under the same Idempotency-Key gets the
 * first answer, with its "until").  The whole replay is one statement
 * (hub_sql_subs_replay, after a lock that serialises the replays of the
 * subscription), so its jobs, its audit row, its rate limit and its
 * idempotency record commit together.  409 on a subscription that is not
 * verified.
 */
void hub_subs_replay(struct subs_call *c) {
    static const char *const allowed[] = {"since", "until", "event_types", NULL};
    h2o_req_t *req = c->call.req;
    json_t *errors = NULL, *body, *v;
    int64_t since_us = 0, until_us = 0;
    h2o_iovec_t idem;
    int oom = 0;

    body = hub_api_read_json_object(req, HUB_API_MAX_BODY);
    if (body == NULL) {
        return;
    }
    hub_api_reject_unknown_members(body, allowed, &errors);
    v = json_object_get(body, "since");
    if (!replay_time(v, &since_us)) {
        hub_api_errors_add(&errors, "since", "required: an RFC 3339 time from year 1 on");
    }
    v = json_object_get(body, "until");
    if (v == NULL || json_is_null(v)) {
        until_us = hub_unix_us();
    } else if (!replay_time(v, &until_us)) {
        hub_api_errors_add(&errors, "until", "must be an RFC 3339 time from year 1 on");
    }
    if (errors == NULL && since_us >= until_us) {
        hub_api_errors_add(&errors, "until", "must be after since");
    }
    v = json_object_get(body, "event_types");
    /* the same rules as a subscription's own list; the statement then
     * narrows by both, so a replay never sends what the subscription
     * would not receive */
    if (v != NULL && !json_is_null(v)) {
        hub_subs_check_event_types(v, &c->in, &errors, &oom);
    }
    json_decref(body);
    hub_api_idem_read_key(req, &idem, &errors);
    if (hub_api_input_refused(req, errors, oom)) {
        return;
    }
    /* the bounds as the statement reads them (and shows them in the
     * answer, normalised to UTC with microseconds) */
    hub_rfc3339(since_us, 6, c->since, sizeof(c->since));
    hub_rfc3339(until_us, 6, c->until, sizeof(c->until));
    hub_api_idem_start(&c->call, &c->idem, idem, HUB_SUBS_IDEM_SCOPE, c->tenant_id, "replay",
                       c->object_id, &replay_idem);
}
