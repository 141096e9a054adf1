/*
 * api_events — HTTP ingest and the pull API (see api_events.h).
 *
 * Ingest: a request's events are parsed here (envelope.h, the same parser
 * as Kafka records), each into a struct hub_ingest_rec, and handed to
 * hub_ingest_store(), which writes them with Kafka's statement, dedup and
 * verdicts and calls back once the transaction is over.  The answer is
 * built from each record's verdict: 202 accepted, 200 duplicate, 409/413/
 * 400 quarantined, 403 another tenant's.  A batch answers 207 with one
 * result per event, in order.
 *
 * The pull routes live in api_events_pull.c; this file hands them over
 * first and keeps the token buckets both share (api_events_int.h).
 *
 * Both are tenant-scoped: the key's tenant is the only one a request can
 * write or read, and a per-tenant token bucket (bucket.h), split across the
 * deployment's processes (cluster.h), bounds each.
 */
#include "api_events.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api_events_int.h"
#include "api_schemas.h"
#include "api_util.h"
#include "bucket.h"
#include "cluster.h"
#include "envelope.h"
#include "http.h"
#include "hub.h"
#include "ingest.h"
#include "log.h"
#include "pull_horizon.h"
#include "util.h"

#define EVENTS_PATH "/v1/events"

/* Evidence values kept from a refused record's claims (SPEC §3.1 bounds). */
#define CLAIM_MAX_BYTES 1024

/* The CloudEvents HTTP binding's modes (SPEC §4), from Content-Type. */
enum ingest_mode {
    MODE_BINARY,      /* ce-* headers, the body is the data */
    MODE_STRUCTURED,  /* application/cloudevents+json */
    MODE_BATCH,       /* application/cloudevents-batch+json */
    MODE_UNSUPPORTED, /* another application/cloudevents… format: 415 */
};

/* What an ingest request keeps per event besides its hub_ingest_rec. */
struct ingest_item {
    int rec;            /* index into recs, or -1 when refused before storing */
    int status;         /* when rec < 0: the answer's status (403) */
    char *headers_json; /* quarantine evidence */
    char *claimed_tenant;
    char *claimed_source;
    char *claimed_id;
    json_t *errors; /* every attribute validation refused, when any */
};

/* One events request (api_util.h's call machinery).  An ingest's records
 * point into `body` and `items`, so the call owns both until the store's
 * transaction is over, even if the client hangs up. */
struct events_call {
    struct hub_api_call call;      /* first: see api_util.h */
    struct http_ingest_hold *slot; /* its HTTP ingest slot, held until the call ends */
    int route_status;              /* 0, or 405 to answer once authenticated */
    const char *allow;             /* for 405 */
    char *tenant;                  /* the key's tenant */
    enum ingest_mode mode;
    struct ingest_item *items;
    size_t n_items;
    struct hub_ingest_rec *recs;
    size_t n_recs;
    char *body;    /* a copy of the request body */
    size_t *spans; /* batch mode: element offsets (hub_envelope_batch_split) */
};

/* ---------------------------------------------------------- rate buckets -- */

int hub_events_rate_take(struct hub *hub, struct hub_buckets **table, const char *tenant,
                         double rate, double burst, double cost) {
    double wait = hub_cluster_take(hub, table, tenant, rate, burst, cost);

    if (wait <= 0.0) {
        return 0;
    }
    /* rounded up: a client that waits Retry-After seconds finds a token */
    return wait < 1.0 ? 1 : wait > 86400.0 ? 86400 : (int)ceil(wait);
}

/* The buckets live in struct hub (per process); freed at shutdown only,
 * with the pull horizon. */
void hub_api_events_free(struct hub *hub) {
    hub_buckets_free(&hub->pull_buckets);
    hub_buckets_free(&hub->ingest_buckets);
    hub_pull_horizon_free(hub);
}

void hub_events_send_over_rate(h2o_req_t *req, int wait, const char *detail) {
    char retry[16];

    snprintf(retry, sizeof(retry), "%d", wait);
    hub_api_add_header(req, "retry-after", retry);
    hub_api_send_problem(req, 429, detail, NULL);
}

/* ---------------------------------------------------------------- ingest -- */

/* The 64 KiB leave room for a structured event's attributes around data
 * of the largest size STREAMING_HUB_MAX_EVENT_BYTES allows; an event over
 * that size but within this cap reaches the parser, which quarantines it
 * as too large.  http.c refuses bodies over the cap (413). */
size_t hub_api_events_max_body(const struct hub_config *cfg) {
    size_t event = (size_t)cfg->max_event_bytes + 64 * 1024;
    return event > HUB_API_MAX_BODY ? event : HUB_API_MAX_BODY;
}

/* on_free: the records' events (hub_event_free), the evidence strings,
 * the body copy.  Runs after the store's callback when one is pending. */
static void events_call_free(struct hub_api_call *call) {
    struct events_call *c = (struct events_call *)call;

    hub_http_ingest_release(c->slot);
    /* items own their evidence; records own their parsed events, whose
     * payloads point into body (freed last) */
    for (size_t i = 0; i < c->n_items; i++) {
        free(c->items[i].headers_json);
        free(c->items[i].claimed_tenant);
        free(c->items[i].claimed_source);
        free(c->items[i].claimed_id);
        json_decref(c->items[i].errors);
    }
    for (size_t i = 0; i < c->n_recs; i++) {
        hub_event_free(&c->recs[i].ev);
        ingest_rec_schema_free(&c->recs[i]);
    }
    free(c->items);
    free(c->recs);
    free(c->spans);
    free(c->body);
    free(c->tenant);
}

/* 1 when the media type of content-type value v (parameters ignored) is t. */
/* Media types compare case-insensitively (RFC 9110 §8.3.1). */
static int media_type_is(h2o_iovec_t v, const char *t) {
    size_t n = 0;
    size_t tlen = strlen(t);

    while (n < v.len && v.base[n] != ';' && v.base[n] != ' ' && v.base[n] != '\t') {
        n++;
    }
    return n == tlen && strncasecmp(v.base, t, n) == 0;
}

/* The mode by Content-Type: anything that is not application/cloudevents…
 * is binary mode (the body is the data, whatever its type); an
 * application/cloudevents format other than JSON is 415. */
static enum ingest_mode ingest_mode(const h2o_req_t *req) {
    static const char ce[] = "application/cloudevents";
    h2o_iovec_t ct;

    if (!hub_api_header(req, "content-type", &ct) || ct.len < sizeof(ce) - 1 ||
        strncasecmp(ct.base, ce, sizeof(ce) - 1) != 0) {
        return MODE_BINARY;
    }
    if (media_type_is(ct, "application/cloudevents+json")) {
        return MODE_STRUCTURED;
    }
    if (media_type_is(ct, "application/cloudevents-batch+json")) {
        return MODE_BATCH;
    }
    return MODE_UNSUPPORTED;
}

/* 1 for the request headers the envelope reads (and quarantine keeps): the
 * ce-* attributes, content-type and the trace context.  Never Authorization. */
static int header_wanted(const h2o_iovec_t *name, enum ingest_mode mode) {
    if (name->len == 12 && strncasecmp(name->base, "content-type", 12) == 0) {
        return 1;
    }
    if ((name->len == 11 && strncasecmp(name->base, "traceparent", 11) == 0) ||
        (name->len == 10 && strncasecmp(name->base, "tracestate", 10) == 0)) {
        return mode != MODE_BATCH; /* a batch's events carry their own */
    }
    return mode == MODE_BINARY && name->len > 3 && strncasecmp(name->base, "ce-", 3) == 0;
}

/* 1 when the headers an event would be parsed with pass the bounds of
 * ingest.h (ce-*, content-type, traceparent, tracestate; over HTTP/2,
 * since turned off, a repeated header cost the client one byte: 400,000
 * copies of a 4 KB one fit in one request and became gigabytes of
 * evidence). */
static int headers_over(const h2o_req_t *req, enum ingest_mode mode) {
    size_t n = 0, bytes = 0;

    for (size_t i = 0; i < req->headers.size; i++) {
        const h2o_header_t *e = &req->headers.entries[i];
        if (header_wanted(e->name, mode)) {
            n++;
            bytes += e->name->len + e->value.len;
        }
    }
    return n > HUB_EVENT_HEADERS_MAX || bytes > HUB_EVENT_HEADER_BYTES_MAX;
}

/* The headers an event of this request is parsed with, in req's pool. */
static struct hub_header *request_headers(h2o_req_t *req, enum ingest_mode mode, size_t *n) {
    /* room for every request header (+1 for batch mode's one): filtering
     * only shrinks the list.  The pool frees it with the request, which
     * is fine: hub_envelope_parse borrows headers for the call only */
    struct hub_header *h =
        h2o_mem_alloc_pool(&req->pool, sizeof(struct hub_header) * (req->headers.size + 1));

    *n = 0;
    if (mode == MODE_BATCH) { /* each element is one structured event */
        h[(*n)++] = (struct hub_header){"content-type", 12, "application/cloudevents+json", 28};
        return h;
    }
    for (size_t i = 0; i < req->headers.size; i++) {
        const h2o_header_t *e = &req->headers.entries[i];
        if (header_wanted(e->name, mode)) {
            h[(*n)++] =
                (struct hub_header){e->name->base, e->name->len, e->value.base, e->value.len};
        }
    }
    return h;
}

/* A claimed attribute as evidence text: UTF-8, bounded, else NULL. */
/* Claims of a refused record are untrusted: kept only when they can be
 * stored as text and shown in the admin API as they are. */
static char *claim_text(const char *s, size_t len) {
    if (s == NULL || len == 0 || len > CLAIM_MAX_BYTES || !hub_utf8_valid(s, len) ||
        memchr(s, '\0', len) != NULL) {
        return NULL;
    }
    return strndup(s, len);
}

/* The tenant, source and id a refused record claims (quarantine evidence,
 * and the tenant check): binary mode reads the headers, the others the
 * JSON members, when the text parses that far. */
static void item_claims(struct ingest_item *it, enum ingest_mode mode, const struct hub_header *h,
                        size_t nh, const void *value, size_t len) {
    static const char *const attrs[3] = {"tenantid", "source", "id"};
    char **out[3] = {&it->claimed_tenant, &it->claimed_source, &it->claimed_id};

    if (mode == MODE_BINARY) {
        for (size_t i = 0; i < nh; i++) {
            for (int k = 0; k < 3; k++) {
                if (h[i].name_len == 3 + strlen(attrs[k]) &&
                    strncasecmp(h[i].name + 3, attrs[k], h[i].name_len - 3) == 0 &&
                    strncasecmp(h[i].name, "ce-", 3) == 0) {
                    free(*out[k]); /* the last one wins, as in the parser */
                    *out[k] = claim_text(h[i].value, h[i].value_len);
                }
            }
        }
        return;
    }
    /* integers as reals: an integer member too big for jansson must not
     * fail a parse that only looks for three strings */
    json_t *o = json_loadb(value, len, JSON_DECODE_INT_AS_REAL, NULL);
    for (int k = 0; json_is_object(o) && k < 3; k++) {
        json_t *v = json_object_get(o, attrs[k]);
        if (json_is_string(v)) {
            *out[k] = claim_text(json_string_value(v), json_string_length(v));
        }
    }
    json_decref(o);
}

/*
 * Parses one event into the next rec, or refuses it (403) when it names
 * another tenant.  Returns 0, or -1 when memory ran out.
 */
static int ingest_item(struct events_call *c, struct ingest_item *it, const struct hub_header *h,
                       size_t nh, const void *value, size_t len) {
    const struct hub_config *cfg = &c->call.hub->cfg;
    struct hub_envelope_issues issues;
    struct hub_envelope_limits lim = {(size_t)cfg->max_event_bytes, c->tenant, &issues};
    struct hub_ingest_rec *r = &c->recs[c->n_recs];
    const char *claimed;

    memset(r, 0, sizeof(*r));
    r->ok =
        hub_envelope_parse(HUB_ENVELOPE_HTTP, h, nh, value, len, NULL, &lim, &r->ev, &r->err) == 0;
    if (!r->ok) {
        item_claims(it, c->mode, h, nh, value, len);
        for (size_t i = 0; i < issues.n; i++) { /* the 400 names each attribute at fault */
            hub_api_errors_add(&it->errors, issues.item[i].field, issues.item[i].message);
        }
    }
    claimed = r->ok ? r->ev.tenant : it->claimed_tenant;
    if (claimed != NULL && strcmp(claimed, c->tenant) != 0) {
        hub_event_free(&r->ev);
        it->rec = -1;
        it->status = 403;
        return 0;
    }
    /* a refused event is still stored (quarantined): the evidence is the
     * headers it came with, Authorization left out (header_wanted) */
    it->headers_json = hub_ingest_headers_evidence(h, nh);
    if (it->headers_json == NULL) {
        hub_event_free(&r->ev);
        return -1;
    }
    r->value = value;
    r->value_len = len;
    r->headers_json = it->headers_json;
    r->claimed_tenant = c->tenant; /* the key's: a differing claim is refused above */
    r->claimed_source = it->claimed_source;
    r->claimed_id = it->claimed_id;
    it->rec = (int)c->n_recs++;
    return 0;
}

/* An answer to one event: a JSON body, or a problem (detail, errors). */
struct item_answer {
    int status;
    json_t *body; /* owned; NULL for a problem */
    const char *detail;
    json_t *errors; /* owned */
};

/* The answer to one event, from its verdict (or its refusal before the
 * store), as a single-event request or a batch element shows it.  a->body
 * and a->errors are owned by the caller. */
static void item_answer(const struct events_call *c, const struct ingest_item *it,
                        struct item_answer *a) {
    const struct hub_ingest_rec *r = it->rec >= 0 ? &c->recs[it->rec] : NULL;

    memset(a, 0, sizeof(*a));
    if (r == NULL) {
        a->status = it->status;
        a->detail = "the event's tenantid is not the tenant of the API key";
        return;
    }
    if (r->unsettled) { /* a batch element whose transaction failed (ingest.h) */
        a->status = 503;
        a->detail = "this event was not stored; retrying it is safe";
        return;
    }
    switch (r->verdict) {
    case HUB_V_ACCEPTED:
        a->status = 202;
        a->body = json_pack("{s:s, s:s, s:I}", "id", r->ev.id, "verdict", "accepted", "sequence",
                            (json_int_t)r->seq);
        break;
    case HUB_V_DUPLICATE:
        a->status = 200;
        a->body = json_pack("{s:s, s:s}", "id", r->ev.id, "verdict", "duplicate");
        break;
    /* quarantined: stored as evidence, not accepted; the status says why */
    case HUB_V_QUARANTINED_CONFLICT:
        a->status = 409;
        a->detail = "an event with this tenant, source and id is already stored with a "
                    "different payload; this one is quarantined";
        break;
    case HUB_V_QUARANTINED_TOO_LARGE:
        a->status = 413;
        a->detail = r->err.message;
        break;
    case HUB_V_QUARANTINED_SCHEMA: /* SPEC §3.5: the schema's errors, by pointer */
    case HUB_V_QUARANTINED_UNKNOWN_SCHEMA:
        hub_api_schema_answer(r->verdict == HUB_V_QUARANTINED_SCHEMA, r->schema_evidence,
                              &a->status, &a->detail, &a->errors);
        break;
    case HUB_V_QUARANTINED_INVALID:
        a->status = 400;
        a->detail = r->err.message;
        if (it->errors != NULL) {
            a->errors = json_incref(it->errors);
        } else { /* refused before validation, or by the JSON check */
            hub_api_errors_add(&a->errors, r->err.field[0] ? r->err.field : "event",
                               r->err.message);
        }
        break;
    default: /* dropped: the tenant left the roster after the key was checked */
        a->status = 403;
        a->detail = "the tenant is not active";
        break;
    }
}

/* Batch mode's answer: 207 {"results": [...]}, each result the body a
 * single event would have had, with its "status". */
static void answer_batch(struct events_call *c) {
    h2o_req_t *req = c->call.req;
    json_t *results = json_array();
    json_t *body = json_pack("{s:o}", "results", results);

    for (size_t i = 0; body != NULL && i < c->n_items; i++) {
        struct item_answer a;
        json_t *one;
        item_answer(c, &c->items[i], &a);
        /* a refused event's result is its problem object, as a single
         * request would have had it, so clients handle both one way */
        one = a.body != NULL ? a.body : hub_api_problem(a.status, a.detail, a.errors);
        json_object_set_new(one, "status", json_integer(a.status));
        if (json_array_append_new(results, one) != 0) {
            json_decref(body);
            body = NULL;
        }
    }
    if (body == NULL) {
        hub_api_send_oom(req);
        return;
    }
    /* 207 whatever each event's fate: a client reads every result's status */
    hub_api_send_json(req, 207, body);
    json_decref(body);
}

/* The store is done (arg: its failure, or NULL when every record has a
 * verdict).  A failure is answered as a whole: nothing was stored, so the
 * client may retry every event. */
static void ingest_answer(struct hub_api_call *call, void *arg) {
    struct events_call *c = (struct events_call *)call;
    const struct hub_pg_outcome *failure = arg;
    struct item_answer a;

    if (failure != NULL) {
        hub_api_send_db_error(call->req, failure); /* nothing is stored: the client retries */
        return;
    }
    if (c->mode == MODE_BATCH) {
        answer_batch(c);
        return;
    }
    item_answer(c, &c->items[0], &a);
    if (a.body != NULL) {
        hub_api_send_json(call->req, a.status, a.body);
        json_decref(a.body);
    } else {
        hub_api_send_problem(call->req, a.status, a.detail, a.errors);
    }
}

/* The store's callback: wakes the call, which answers only if the request
 * is still there. */
static void ingest_stored(void *arg, const struct hub_pg_outcome *failure) {
    struct events_call *c = arg;
    hub_api_call_wake(&c->call, ingest_answer, (void *)failure);
}

/*
 * POST /v1/events: charges the ingest quota (one token per event, once a
 * batch is split and counted, before its events are parsed), parses every
 * event, and hands the records to the store.  Events refused before the
 * store (another tenant's) keep their slot in the answer.
 */
static void ingest_start(struct events_call *c) {
    h2o_req_t *req = c->call.req;
    size_t n = 1;
    size_t nh;
    struct hub_header *h;
    const char *body;

    c->mode = ingest_mode(req);
    if (c->mode == MODE_UNSUPPORTED) {
        hub_api_send_problem(req, 415,
                             "structured events must be application/cloudevents+json, "
                             "batches application/cloudevents-batch+json",
                             NULL);
        return;
    }
    /* The records point into the body (a binary event's payload, quarantine
     * evidence) while their transaction runs, which may outlive the request
     * (a client that hangs up): the call keeps its own copy. */
    c->body = malloc(req->entity.len + 1);
    if (c->body == NULL) {
        hub_api_send_oom(req);
        return;
    }
    if (req->entity.len > 0) {
        memcpy(c->body, req->entity.base, req->entity.len);
    }
    c->body[req->entity.len] = '\0';
    body = c->body;
    /* the split only finds the elements' bounds; each element is parsed
     * as its own structured event below */
    if (c->mode == MODE_BATCH) {
        long count =
            hub_envelope_batch_split(body, req->entity.len, HUB_INGEST_BATCH_MAX, &c->spans);
        json_t *errors = NULL;
        if (count <= 0) {
            hub_api_errors_add(&errors, "body",
                               count == 0 ? "a batch holds at least one event"
                                          : "a batch is a JSON array of at most 1000 events");
            hub_api_send_invalid(req, errors);
            return;
        }
        n = (size_t)count;
    }
    if (headers_over(req, c->mode)) {
        hub_api_send_problem(req, 431,
                             "the event's headers (ce-*, content-type, traceparent, tracestate) "
                             "are over 256 or 64 KiB",
                             NULL);
        return;
    }
    if (c->call.ingest_rate > 0.0) {
        int wait = hub_events_rate_take(c->call.hub, &c->call.hub->ingest_buckets, c->tenant,
                                        c->call.ingest_rate, c->call.ingest_burst, (double)n);
        if (wait > 0) {
            hub_events_send_over_rate(req, wait, "over this tenant's ingest quota; retry later");
            return;
        }
    }
    h = request_headers(req, c->mode, &nh);
    c->items = calloc(n, sizeof(*c->items));
    c->recs = calloc(n, sizeof(*c->recs));
    if (c->items == NULL || c->recs == NULL) {
        hub_api_send_oom(req);
        return;
    }
    /* a batch element is a span of the body copy: no per-event copy */
    for (size_t i = 0; i < n; i++) {
        const char *value = c->mode == MODE_BATCH ? body + c->spans[2 * i] : body;
        size_t len =
            c->mode == MODE_BATCH ? c->spans[2 * i + 1] - c->spans[2 * i] : req->entity.len;
        c->n_items++;
        if (ingest_item(c, &c->items[i], h, nh, value, len) != 0) {
            hub_api_send_oom(req);
            return;
        }
    }
    if (c->n_recs == 0) { /* every event named another tenant */
        ingest_answer(&c->call, NULL);
        return;
    }
    /* the answer waits for the commit (SPEC §4: a 202 means durable); the
     * call stays alive meanwhile, even if the client hangs up */
    hub_api_call_wait(&c->call);
    hub_ingest_store(c->call.hub, c->recs, c->n_recs, ingest_stored, c);
}

/* --------------------------------------------------------------- routing -- */

/* The route, once the key was checked (api_util.h's prologue). */
static void events_authed(struct hub_api_call *call, const char *tenant_id, int status) {
    struct events_call *c = (struct events_call *)call;
    h2o_req_t *req = call->req;

    if (hub_api_route_answered(req, status, c->route_status, c->allow, "event not found")) {
        return;
    }
    /* a copy: tenant_id is borrowed for the callback only, and the records
     * refer to the tenant until the store is done */
    c->tenant = strdup(tenant_id);
    if (c->tenant == NULL) {
        hub_api_send_oom(req);
        return;
    }
    ingest_start(c);
}

/* The entry point (api_events.h): the pull routes go to api_events_pull.c;
 * what is left is POST /v1/events (any other method: 405, once
 * authenticated).  GET routes answer HEAD too (hub_api_method_get). */
int hub_api_events_handle(struct hub *hub, h2o_req_t *req) {
    struct events_call *c;

    /* not ours: http.c answers 404 when no /v1 module takes a path */
    if (!hub_api_path_under(req->path_normalized, EVENTS_PATH)) {
        return 0;
    }
    if (hub_api_events_pull_handle(hub, req)) {
        return 1;
    }
    c = hub_api_call_new(hub, req, sizeof(*c), events_call_free);
    if (c == NULL) {
        return 1;
    }
    /* the events stay in the ingest queue until stored, client or not */
    c->slot = hub_http_ingest_hold(hub->http);
    if (!hub_api_method_is(req, "POST")) {
        c->route_status = 405;
        c->allow = "GET, HEAD, POST";
    }
    hub_api_auth_tenant(&c->call, events_authed);
    return 1;
}
