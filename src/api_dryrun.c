/*
 * api_dryrun — POST /admin/policies/dry-run (see api_dryrun.h).
 *
 * The request's path:
 *
 *   validate in memory (a named policy is looked up in the current
 *   generation, which the request then holds)
 *   ──► one transaction: the subscription's policy (when one is named) and
 *       the events, copied out of the rows
 *   ──► source given: compiled on a policy thread (422 when it fails)
 *   ──► one policy call per event, queued under one fairness key, so the
 *       dry-run takes turns with the subscriptions' calls on the threads
 *   ──► the last call back: the answer, in the events' order.
 *
 * Each event's call builds its own result object on the policy thread
 * (attributes parsed, match/shape/retry run, bodies encoded), so the loop
 * does no Lua and no per-event JSON work but appending.
 */
#include "api_dryrun.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_util.h"
#include "hub.h"
#include "log.h"
#include "policy.h"
#include "policy_test.h"
#include "store_workbench.h"
#include "util.h"
#include "webhook.h"

/* The fairness key of every dry-run call: all dry-runs share one turn. */
#define DRYRUN_KEY "admin:dry-run"
/* The name compiled sources go by in messages ("dry-run.lua:3: ..."). */
#define DRYRUN_SOURCE_NAME "dry-run"
#define DRYRUN_EXT_MAX 64
/* Stored payload bytes one dry-run reads at most: the answer carries each
 * twice (stored and shaped) and is rendered on the loop, so 1,000 events
 * of 1 MiB must not become a 2 GiB answer.  Past it the list is cut
 * ("truncated": true); the first event always comes. */
#define DRYRUN_BYTES_MAX "8388608"
/* Bytes of rendered results one answer carries at most.  The stored cap
 * above does not bound the shaped bodies (4 MiB each, and a control byte
 * is six once escaped as \u0001), so the results themselves are counted,
 * as JSON text: past the cap a result keeps match, shape headers, retry
 * and error but loses its body texts ("body_truncated": true).  Rendered
 * on the policy threads, the answer costs the loop one copy of at most
 * this much. */
#define DRYRUN_ANSWER_MAX ((size_t)16 << 20)

struct dryrun;

/* One stored event and its call.  The strings are copies of the row
 * (owned); text, the result rendered as JSON, is made on the policy thread
 * and copied into the answer. */
struct dry_event {
    struct hub_policy_call call;
    struct dryrun *dr;
    char *seq;
    char *attrs;
    char *event_type;
    char *content_type;
    int schema_major;
    char *payload;
    size_t payload_len;
    char *text; /* the result object as JSON text, NULL on out of memory */
    size_t text_len;
    int failed;         /* a function raised, timed out or ran out of memory */
    int body_truncated; /* the answer cap took its body texts */
};

struct dryrun {
    struct hub_api_call call; /* first: api_util hands this pointer back */
    char *tenant;
    char *subscription; /* NULL when none */
    char *policy_name;  /* the loaded policy, NULL for a source */
    char *source;
    size_t source_len;
    char *seqs; /* int8[] text, or NULL for "recent" */
    int limit;
    struct hub_policy_retry_ctx rctx;
    struct hub_policy_gen *gen; /* held while a loaded policy runs */
    struct hub_policy *p;       /* borrowed from gen, or compiled (owned) */
    int owns_p;
    struct hub_policy_call compile;
    char compile_err[512];
    struct dry_event *ev;
    size_t n, done;
    int errors;
    int truncated;              /* the byte cap cut the list, or a result lost its bodies */
    atomic_size_t answer_bytes; /* results' text so far: the threads add to it */
};

/* on_free: the events, the policy, the generation. */
static void dryrun_free(struct hub_api_call *call) {
    struct dryrun *dr = (struct dryrun *)call;

    for (size_t i = 0; i < dr->n; i++) {
        struct dry_event *e = &dr->ev[i];
        free(e->seq);
        free(e->attrs);
        free(e->event_type);
        free(e->content_type);
        free(e->payload);
        free(e->text);
    }
    free(dr->ev);
    if (dr->owns_p && dr->p != NULL) {
        hub_policy_unref(dr->p);
    }
    hub_policy_gen_release(dr->gen);
    free(dr->tenant);
    free(dr->subscription);
    free(dr->policy_name);
    free(dr->source);
    free(dr->seqs);
    dr->ev = NULL;
    dr->n = 0;
}

/* 422 problem+json for a source that does not compile: the message in
 * detail, its line in "line" (null when Lua named none), with its own type
 * and title; sent here with the same headers send_body gives every API
 * answer. */
static void send_compile_error(h2o_req_t *req, const char *msg) {
    json_t *p = hub_api_problem(422, msg, NULL);
    int line = hub_policy_error_line(msg, DRYRUN_SOURCE_NAME);
    char *text;

    if (p == NULL) {
        hub_api_send_oom(req);
        return;
    }
    json_object_set_new(p, "type", json_string("urn:streaming-hub:problem:policy-compile"));
    json_object_set_new(p, "title", json_string("The policy does not compile"));
    json_object_set_new(p, "line", line > 0 ? json_integer(line) : json_null());
    text = json_dumps(p, HUB_API_JSON_FLAGS);
    json_decref(p);
    if (text == NULL) {
        hub_api_send_oom(req);
        return;
    }
    hub_api_add_header(req, "content-type", "application/problem+json");
    hub_api_add_header(req, "cache-control", "no-store");
    req->res.status = 422;
    req->res.reason = "Unprocessable Content";
    req->res.content_length = strlen(text);
    h2o_send_inline(req, text, req->res.content_length);
    free(text);
}

/* ------------------------------------------------------------ the answer -- */

/* The last call is back: 200 with the results in the events' order (the
 * rows' order: newest first for "recent", by sequence for a list).  The
 * results are text already (rendered on the policy threads, at most
 * DRYRUN_ANSWER_MAX together): the loop only splices them after the other
 * members, one copy.  An event whose result could not be rendered (out of
 * memory on its thread) fails the whole answer rather than leave a hole
 * in it. */
static void answer(struct hub_api_call *call, void *arg) {
    struct dryrun *dr = (struct dryrun *)call;
    json_t *head;
    char *head_text = NULL, *text = NULL, *at;
    size_t head_len, len = 0;

    (void)arg;
    for (size_t i = 0; i < dr->n; i++) {
        if (dr->ev[i].text == NULL) {
            hub_api_send_oom(call->req);
            return;
        }
        len += dr->ev[i].text_len + 1;
    }
    head = json_pack("{s:s?, s:o, s:i, s:b}", "policy", dr->policy_name, "generation",
                     dr->owns_p ? json_null()
                                : json_integer((json_int_t)hub_policy_gen_number(dr->gen)),
                     "errors", dr->errors, "truncated", dr->truncated);
    if (head != NULL) {
        head_text = json_dumps(head, HUB_API_JSON_FLAGS);
        json_decref(head);
    }
    /* {head members,"results":[r1,r2,...]}: the head's closing brace is
     * replaced by the results member */
    head_len = head_text != NULL ? strlen(head_text) - 1 : 0;
    if (head_text != NULL) {
        text = malloc(head_len + sizeof(",\"results\":[]}") + len);
    }
    if (text == NULL) {
        free(head_text);
        hub_api_send_oom(call->req);
        return;
    }
    memcpy(text, head_text, head_len);
    at = text + head_len;
    at += sprintf(at, "%s\"results\":[", head_len > 1 ? "," : "");
    for (size_t i = 0; i < dr->n; i++) {
        if (i > 0) {
            *at++ = ',';
        }
        memcpy(at, dr->ev[i].text, dr->ev[i].text_len);
        at += dr->ev[i].text_len;
    }
    *at++ = ']';
    *at++ = '}';
    hub_api_send_json_text(call->req, 200, text, (size_t)(at - text));
    free(text);
    free(head_text);
}

/* -------------------------------------------------- on the policy threads -- */

/* t[k] for a string member of the attributes, or NULL. */
static const char *attr(const json_t *attrs, const char *k) {
    return json_string_value(json_object_get(attrs, k));
}

/* A policy thread: r (borrowed) as e->text, under the answer's cap.  The
 * text is reserved on the request's running total; when it does not fit,
 * the reservation is given back and r loses its body texts (the stored
 * one and shape's), which leaves a result of a few KiB that is always
 * taken.  Which events keep their bodies then depends on the threads'
 * order; the answer says "truncated" either way.  e->text stays NULL on
 * out of memory. */
static void render(struct dry_event *e, json_t *r) {
    struct dryrun *dr = e->dr;
    json_t *shape;
    char *text;
    size_t len;

    json_object_set_new(r, "body_truncated", json_false());
    if ((text = json_dumps(r, HUB_API_JSON_FLAGS)) == NULL) {
        return;
    }
    len = strlen(text);
    if (atomic_fetch_add(&dr->answer_bytes, len) + len > DRYRUN_ANSWER_MAX) {
        atomic_fetch_sub(&dr->answer_bytes, len);
        free(text);
        json_object_del(r, "stored_body");
        json_object_del(r, "stored_body_encoding");
        if (json_is_object(shape = json_object_get(r, "shape"))) {
            json_object_del(shape, "body");
            json_object_del(shape, "body_encoding");
        }
        json_object_set_new(r, "body_truncated", json_true());
        e->body_truncated = 1;
        if ((text = json_dumps(r, HUB_API_JSON_FLAGS)) == NULL) {
            return;
        }
        len = strlen(text);
        atomic_fetch_add(&dr->answer_bytes, len);
    }
    e->text = text;
    e->text_len = len;
}

/* A policy thread: one stored event through the policy, as a result
 * rendered in e->text (NULL when memory ran out).  The event is rebuilt
 * from its stored attributes the way dispatch builds it for delivery
 * (dispatch_attempt.c, event_from_attrs), so a policy sees the same ev
 * here as when the event is delivered; the tenant is the request's, which
 * the statement made sure owns the event. */
static void event_run(struct hub_policy_call *c) {
    struct dry_event *e = c->arg;
    struct dryrun *dr = e->dr;
    json_t *attrs = json_loads(e->attrs, 0, NULL), *r, *v;
    const char *ext[DRYRUN_EXT_MAX + 1];
    struct hub_policy_event pe;
    struct hub_policy_try t;

    hub_webhook_extensions(attrs, ext, DRYRUN_EXT_MAX); /* as delivery reads them */
    pe = (struct hub_policy_event){
        .id = attr(attrs, "id"),
        .source = attr(attrs, "source"),
        .type = attr(attrs, "type"),
        .event_type = e->event_type,
        .tenant = dr->tenant,
        .subject = attr(attrs, "subject"),
        .time = attr(attrs, "time"),
        .schema_version = attr(attrs, "schemaversion"),
        .content_type = e->content_type,
        .schema_major = e->schema_major,
        .extensions = ext,
        .body = e->payload,
        .body_len = e->payload_len,
        .serial = 0, /* a serial could collide with a delivery's on a shared state */
    };
    hub_policy_try_run(dr->p, &pe, &dr->rctx, &t);
    e->failed = t.err_fn >= 0;
    r = json_pack("{s:I, s:s?, s:s?}", "sequence", (json_int_t)strtoll(e->seq, NULL, 10),
                  "event_id", pe.id, "type", e->event_type);
    v = hub_policy_try_json(&t, hub_policy_name(dr->p), &dr->rctx, e->payload, e->payload_len);
    if (r != NULL && v != NULL && json_object_update(r, v) == 0 &&
        hub_policy_body_set(r, "stored_body", e->payload, e->payload_len) == 0) {
        render(e, r);
    }
    json_decref(r);
    json_decref(v);
    json_decref(attrs);
    hub_policy_try_free(&t);
}

/* Back on the loop: the answer once every event's call is. */
static void event_done(struct hub_policy_call *c) {
    struct dry_event *e = c->arg;
    struct dryrun *dr = e->dr;

    dr->errors += e->failed;
    dr->truncated |= e->body_truncated;
    if (++dr->done == dr->n) {
        hub_api_call_wake(&dr->call, answer, NULL);
    }
}

/* Queues every event's call (room for them was checked); answers at once
 * when there is none. */
static void run_events(struct dryrun *dr) {
    if (dr->n == 0) {
        hub_api_call_wake(&dr->call, answer, NULL);
        return;
    }
    for (size_t i = 0; i < dr->n; i++) {
        struct hub_policy_call *c = &dr->ev[i].call;
        c->key = DRYRUN_KEY;
        c->run = event_run;
        c->cb = event_done;
        c->arg = &dr->ev[i];
        hub_policies_submit_dry(dr->call.hub->policies, c);
    }
}

/* A policy thread: compiles the request's source under the registry's
 * limits. */
static void compile_run(struct hub_policy_call *c) {
    struct dryrun *dr = c->arg;
    struct hub_policy_limits lim = hub_policies_limits(dr->call.hub->policies);

    dr->p = hub_policy_compile(DRYRUN_SOURCE_NAME, dr->source, dr->source_len, &lim,
                               dr->compile_err, sizeof(dr->compile_err));
    dr->owns_p = 1;
}

static void compile_answer(struct hub_api_call *call, void *arg) {
    (void)arg;
    send_compile_error(call->req, ((struct dryrun *)call)->compile_err);
}

/* Back on the loop after the compile: 422, or on to the events. */
static void compile_done(struct hub_policy_call *c) {
    struct dryrun *dr = c->arg;

    if (dr->p == NULL) {
        hub_api_call_wake(&dr->call, compile_answer, NULL);
        return;
    }
    if (dr->call.req == NULL) {
        hub_api_call_wake(&dr->call, answer, NULL); /* gone: frees the call */
        return;
    }
    run_events(dr);
}

/* ------------------------------------------------------------- the rows -- */

/* Copies the event rows into dr->ev: the result is the pool's and goes
 * away when the callback returns, while the calls run later on other
 * threads.  Returns 0, or -1 on out of memory (what was copied is freed
 * with the call). */
static int copy_events(struct dryrun *dr, PGresult *r) {
    int rows = PQntuples(r);

    dr->ev = calloc(rows > 0 ? (size_t)rows : 1, sizeof(*dr->ev));
    if (dr->ev == NULL) {
        return -1;
    }
    dr->truncated = rows > 0 && atoll(PQgetvalue(r, 0, HUB_DRYRUN_EV_COL_SCANNED)) > rows;
    for (int i = 0; i < rows; i++) {
        struct dry_event *e = &dr->ev[dr->n++];
        size_t len = (size_t)PQgetlength(r, i, HUB_DRYRUN_EV_COL_PAYLOAD);
        e->dr = dr;
        e->seq = strdup(PQgetvalue(r, i, HUB_DRYRUN_EV_COL_SEQ));
        e->attrs = strdup(PQgetvalue(r, i, HUB_DRYRUN_EV_COL_ATTRS));
        e->event_type = strdup(PQgetvalue(r, i, HUB_DRYRUN_EV_COL_EVENT_TYPE));
        e->content_type = strdup(PQgetvalue(r, i, HUB_DRYRUN_EV_COL_CONTENT_TYPE));
        e->schema_major = atoi(PQgetvalue(r, i, HUB_DRYRUN_EV_COL_SCHEMA_MAJOR));
        e->payload = malloc(len ? len : 1);
        e->payload_len = len;
        if (e->seq == NULL || e->attrs == NULL || e->event_type == NULL ||
            e->content_type == NULL || e->payload == NULL) {
            return -1;
        }
        memcpy(e->payload, PQgetvalue(r, i, HUB_DRYRUN_EV_COL_PAYLOAD), len);
    }
    return 0;
}

/* The transaction's answer: [subscription,] events. */
static void rows_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct dryrun *dr = (struct dryrun *)call;
    h2o_req_t *req = call->req;
    int at = 0;

    if (out->status != HUB_PG_OK) {
        hub_api_send_db_error(req, out);
        return;
    }
    if (dr->subscription != NULL) {
        PGresult *s = hub_api_found(req, out, at++, "no such subscription for this tenant");
        if (s == NULL) {
            return;
        }
        if (dr->p == NULL && dr->source == NULL) {
            /* the subscription's policy is the one to run */
            const char *why = "it has none";
            json_t *errors = NULL;
            char msg[160];
            if (!PQgetisnull(s, 0, HUB_DRYRUN_SUB_COL_POLICY)) {
                dr->policy_name = strdup(PQgetvalue(s, 0, HUB_DRYRUN_SUB_COL_POLICY));
                dr->gen = hub_policies_acquire(call->hub->policies);
                dr->p = dr->policy_name ? hub_policy_gen_find(dr->gen, dr->policy_name) : NULL;
                why = "it is not loaded";
            }
            if (dr->p == NULL) {
                snprintf(msg, sizeof(msg),
                         "give policy or source: the subscription's policy cannot run (%s)", why);
                hub_api_errors_add(&errors, "subscription", msg);
                hub_api_send_invalid(req, errors);
                return;
            }
        }
    }
    if (copy_events(dr, out->results[at]) != 0) {
        hub_api_send_oom(req);
        return;
    }
    /* every call this dry-run makes is queued now or after the compile:
     * room for all of them, or none (never a partial answer) */
    if (hub_policies_dry_room(call->hub->policies) < dr->n + (dr->source != NULL)) {
        hub_api_add_header(req, "retry-after", "1");
        hub_api_send_problem(req, 503, "the policy threads have too much dry-run work waiting",
                             NULL);
        return;
    }
    /* from here the call waits on the policy threads, not the request */
    hub_api_call_wait(call);
    if (dr->source != NULL) {
        dr->compile.key = DRYRUN_KEY;
        dr->compile.run = compile_run;
        dr->compile.cb = compile_done;
        dr->compile.arg = dr;
        hub_policies_submit_dry(call->hub->policies, &dr->compile);
        return;
    }
    run_events(dr);
}

/* ------------------------------------------------------------ the input -- */

/* Reads "events": "recent" or 1..1000 positive sequence numbers, into
 * dr->seqs as int8[] text (at most 19 digits and a comma each: the buffer
 * is sized for that, and jansson integers are int64). */
static void read_events(struct dryrun *dr, const json_t *v, json_t **errors, int *oom) {
    static const char rule[] = "must be \"recent\" or an array of 1 to 1000 sequence numbers";
    size_t i, n;
    char *buf, *at;

    if (v == NULL || (json_is_string(v) && strcmp(json_string_value(v), "recent") == 0)) {
        return;
    }
    if (!json_is_array(v) || (n = json_array_size(v)) == 0 || n > HUB_DRYRUN_LIMIT_MAX) {
        hub_api_errors_add(errors, "events", rule);
        return;
    }
    if ((buf = at = malloc(n * 21 + 3)) == NULL) {
        *oom = 1;
        return;
    }
    *at++ = '{';
    for (i = 0; i < n; i++) {
        json_t *s = json_array_get(v, i);
        if (!json_is_integer(s) || json_integer_value(s) < 1) {
            hub_api_errors_add(errors, "events", rule);
            free(buf);
            return;
        }
        at += sprintf(at, "%s%lld", i ? "," : "", (long long)json_integer_value(s));
    }
    strcpy(at, "}");
    dr->seqs = buf;
}

/* An optional integer member in [lo, hi], else def. */
static int int_member(const json_t *body, const char *k, int lo, int hi, int def, json_t **errors) {
    const json_t *v = json_object_get(body, k);
    char msg[96];

    if (v == NULL) {
        return def;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        snprintf(msg, sizeof(msg), "must be an integer from %d to %d", lo, hi);
        hub_api_errors_add(errors, k, msg);
        return def;
    }
    return (int)json_integer_value(v);
}

/* Reads the policy to run: "policy"/"name" (looked up now, the generation
 * held) or "source"; neither is allowed only with a subscription.  Holding
 * the generation from here to the answer is what lets a reload happen
 * meanwhile: the dry-run finishes on the version it started with, as a
 * delivery does (policy.h, "Generations"). */
static void read_policy(struct dryrun *dr, const json_t *body, json_t **errors, int *oom) {
    const json_t *name = json_object_get(body, "policy"), *alias = json_object_get(body, "name");
    const json_t *src = json_object_get(body, "source");
    const char *field = name != NULL ? "policy" : "name";

    if (name != NULL && alias != NULL && !json_equal(name, alias)) {
        hub_api_errors_add(errors, "name", "is an alias of policy: give one of them");
        return;
    }
    name = name != NULL ? name : alias;
    if (name != NULL && src != NULL) {
        hub_api_errors_add(errors, "source", "give either a policy name or source, not both");
        return;
    }
    if (src != NULL) {
        if (!json_is_string(src) || json_string_length(src) == 0) {
            hub_api_errors_add(errors, "source", "must be a non-empty string of Lua");
            return;
        }
        dr->source = hub_api_strndup(json_string_value(src), json_string_length(src), oom);
        dr->source_len = json_string_length(src);
        return;
    }
    if (name == NULL) {
        if (json_object_get(body, "subscription") == NULL) {
            hub_api_errors_add(errors, "policy", "is required (or source, or a subscription)");
        }
        return;
    }
    if (!json_is_string(name) ||
        !hub_policy_name_valid(json_string_value(name), json_string_length(name))) {
        hub_api_errors_add(errors, field, "must be a policy name, [A-Za-z0-9_-]{1,64}");
        return;
    }
    dr->gen = hub_policies_acquire(dr->call.hub->policies);
    dr->p = hub_policy_gen_find(dr->gen, json_string_value(name));
    if (dr->p == NULL) {
        hub_api_errors_add(errors, field, "no policy of that name is loaded");
        return;
    }
    dr->policy_name = hub_api_strdup(json_string_value(name), oom);
}

void hub_api_dryrun(struct hub *hub, h2o_req_t *req) {
    static const char *const allowed[] = {"policy", "name",  "source",  "tenant", "subscription",
                                          "events", "limit", "attempt", "status", NULL};
    json_t *body, *errors = NULL, *tenant, *sub;
    struct hub_pg_txn *txn;
    struct dryrun *dr;
    char limit[16];
    int oom = 0;

    if (!hub_api_method_is(req, "POST")) {
        hub_api_send_method_not_allowed(req, "POST");
        return;
    }
    if ((body = hub_api_read_json_object(req, HUB_API_MAX_BODY)) == NULL) {
        return;
    }
    if ((dr = hub_api_call_new(hub, req, sizeof(*dr), dryrun_free)) == NULL) {
        json_decref(body);
        return;
    }
    hub_api_reject_unknown_members(body, allowed, &errors);
    tenant = json_object_get(body, "tenant");
    sub = json_object_get(body, "subscription");
    if (!json_is_string(tenant) ||
        !hub_api_tenant_id_valid(json_string_value(tenant), json_string_length(tenant))) {
        hub_api_errors_add(&errors, "tenant", "is required: a tenant id");
    } else {
        dr->tenant = hub_api_strdup(json_string_value(tenant), &oom);
    }
    if (sub != NULL && (!json_is_string(sub) ||
                        !hub_api_uuid_valid(json_string_value(sub), json_string_length(sub)))) {
        hub_api_errors_add(&errors, "subscription", "must be a subscription id (a UUID)");
    } else if (sub != NULL) {
        dr->subscription = hub_api_strdup(json_string_value(sub), &oom);
    }
    read_policy(dr, body, &errors, &oom);
    read_events(dr, json_object_get(body, "events"), &errors, &oom);
    dr->limit =
        int_member(body, "limit", 1, HUB_DRYRUN_LIMIT_MAX, HUB_DRYRUN_LIMIT_DEFAULT, &errors);
    dr->rctx.attempt = int_member(body, "attempt", 1, 1000, 1, &errors);
    dr->rctx.status = int_member(body, "status", 0, 599, 500, &errors);
    dr->rctx.error = dr->rctx.status > 0 ? "status" : "connect";
    json_decref(body);
    if (hub_api_input_refused(req, errors, oom)) {
        return;
    }
    if ((txn = hub_api_call_txn(&dr->call, rows_done)) == NULL) {
        return;
    }
    if (dr->subscription != NULL) {
        hub_pg_txn_add(txn, &hub_sql_dryrun_sub, HUB_SQL_DRYRUN_SUB_NPARAMS,
                       (const char *[]){dr->tenant, dr->subscription}, NULL, NULL);
    }
    snprintf(limit, sizeof(limit), "%d", dr->limit);
    /* binary results: the payloads come back as their bytes */
    if (dr->seqs != NULL) {
        hub_pg_txn_add_binary(txn, &hub_sql_dryrun_seqs, HUB_SQL_DRYRUN_SEQS_NPARAMS,
                              (const char *[]){dr->tenant, dr->seqs, DRYRUN_BYTES_MAX}, NULL, NULL);
    } else {
        hub_pg_txn_add_binary(
            txn, &hub_sql_dryrun_recent, HUB_SQL_DRYRUN_RECENT_NPARAMS,
            (const char *[]){dr->tenant, dr->subscription, limit, DRYRUN_BYTES_MAX}, NULL, NULL);
    }
    hub_api_call_submit(&dr->call, txn);
}
