/*
 * api_subs_internal — what the files of the subscription API share; no
 * other module includes it (api_subs.h is the public side).
 *
 *   api_subs.c        routing, the request state, rendering a subscription,
 *                     create / list / get / PATCH / DELETE, rotate-secret
 *   api_subs_input.c  validating create and PATCH bodies; vetting a
 *                     destination against SSRF (DNS on the loop)
 *   api_verify.c      verification probes: the background one after a
 *                     create or a url change, and POST .../verify
 *   api_deliveries.c  deliveries: list, get, redeliver; and replay
 *
 * One request is one struct subs_call from routing to its answer.  Routing
 * (api_subs.c) authenticates the tenant, then hands the call to the route's
 * function in one of these files, which answers, or starts one
 * asynchronous step (a transaction, a DNS lookup, a probe) whose callback
 * answers.  Everything runs on the loop thread.
 */
#ifndef HUB_API_SUBS_INTERNAL_H
#define HUB_API_SUBS_INTERNAL_H

#include <h2o.h>
#include <jansson.h>
#include <stdint.h>

#include "api_idem.h"
#include "api_util.h"
#include "pg.h"
#include "sign.h"

struct hub;

struct subs_call;

/* The scope of the tenant API's Idempotency-Key records: "tenant:<id>"
 * (api_idem.h), shared by every POST of these files. */
#define HUB_SUBS_IDEM_SCOPE "tenant"

/* The next step of a request that waited (for DNS, say). */
typedef void (*subs_step)(struct subs_call *c);

/* A DNS lookup of the SSRF vetting and a verification probe: both may
 * outlive the request, so they are objects of their own with a weak link
 * to the call (api_subs_input.c, api_verify.c). */
struct subs_resolve;
struct subs_probe;

/* The validated members of a create or PATCH body.  Strings are owned and
 * released by hub_subs_input_free. */
struct subs_input {
    char *event_types;  /* JSON array text; NULL = not given */
    char *schema_major; /* decimal; NULL = not given */
    char *url;          /* NULL = not given */
    int headers_set;    /* destination.headers given (possibly null / {}) */
    json_t *headers;    /* the plaintext credentials (non-empty object) or NULL */
    char *headers_sealed;
    int retry_set;
    char *retry_schedule; /* JSON array text or NULL */
    int policy_set;
    char *policy;
    char *ordering; /* NULL = not given (create: "unordered") */
    int max_rate_set;
    char *max_rate; /* decimal text or NULL */
    int enabled;    /* -1 not given, else 0/1 */
    char *audit;    /* PATCH: audit detail (member names only) */
};

/* One request waiting on the database, DNS or a probe.  Owned by api_util's
 * call machinery (hub_api_call_new); released by subs_call_free. */
struct subs_call {
    struct hub_api_call call; /* first: api_util hands this pointer back */
    subs_step run;            /* the route (api_subs.c, routes[]); NULL when none */
    int route_status;         /* 0, or 404/405 decided before authentication */
    const char *allow;        /* 405: the Allow header */
    const char *missing;      /* 404 after routing: the detail */
    char *tenant_id;
    char *object_id; /* subscription id (lower-case uuid) or job id */
    struct subs_input in;
    struct hub_api_idem idem;     /* every POST: create, rotate-secret, verify, replay,
                                   * redeliver */
    int limit;                    /* lists: page size (one more row is fetched) */
    char *after;                  /* lists: cursor value */
    char *state;                  /* deliveries list: ?state= */
    int64_t grace_ms;             /* rotate-secret */
    char since[64], until[64];    /* replay window, RFC 3339 UTC */
    char secret[HUB_SECRET_SIZE]; /* a new secret, plaintext (create, rotate) */
    char *secret_sealed;
    subs_step vetted; /* what runs once the destination passed the SSRF check */
    struct subs_resolve *resolve;
    struct subs_probe *probe;
};

/* ------------------------------------------------------------ api_subs.c -- */

/* 1 after answering 503 when the process has no KEK (secrets can be
 * neither sealed nor opened), else 0. */
int hub_subs_kek_missing(struct subs_call *c);

/*
 * Parses a subscription object from PostgreSQL (text[0..len), borrowed) and
 * renders it for the API: destination.headers lists the header NAMES,
 * "secret" is `secret` (plaintext, may be NULL) or, with open_ss, the
 * opened "_ss", and the internal members are gone.  Returns it owned, or
 * NULL when malformed or out of memory (logged).
 */
json_t *hub_subs_load(struct hub *hub, const char *text, size_t len, const char *secret,
                      int open_ss);

/* Runs one statement with (tenant, object id) whose outcome goes to cb. */
void hub_subs_run_by_id(struct subs_call *c, const struct hub_sql *sql, hub_api_call_cb cb);

/* Room for a list statement's limit parameter as text. */
#define HUB_SUBS_LIMIT_TEXT 16

/*
 * Keeps a list request's page in c once its query was checked: answers 400
 * (errors, taken) and returns HUB_EINVAL, or 500 and HUB_ENOMEM; else sets
 * c->limit and c->after, writes the page size plus one (the row that tells
 * a next page exists) into limit_text, and returns 0.
 */
int hub_subs_page_keep(struct subs_call *c, const struct hub_api_page *page, json_t *errors,
                       char limit_text[HUB_SUBS_LIMIT_TEXT]);

/* ------------------------------------------------------ api_subs_input.c -- */

/* Releases what in holds; in is left zeroed. */
void hub_subs_input_free(struct subs_input *in);

/*
 * Validates a create (create = 1: required members, defaults) or PATCH body
 * into *in.  Adds one error per offending member to *errors; sets *oom on
 * allocation failure.  Borrows body.
 */
void hub_subs_check_input(struct hub *hub, json_t *body, int create, struct subs_input *in,
                          json_t **errors, int *oom);

/* Validates an event_types array (also replay's filter) into
 * in->event_types; same error and oom conventions. */
void hub_subs_check_event_types(json_t *v, struct subs_input *in, json_t **errors, int *oom);

/* The audit detail of a PATCH: {"fields": [member names]}, never values.
 * malloc'd JSON text, or NULL on OOM. */
char *hub_subs_patch_audit(json_t *body);

/* 1 when an action without input got no body or an empty JSON object and
 * a well-formed Idempotency-Key or none (in *idem), or 0 after answering
 * 400 (or 413). */
int hub_subs_action_input(h2o_req_t *req, h2o_iovec_t *idem);

/*
 * SPEC §11: unless private sinks are allowed, every address that url's host
 * resolves to must be public.  Runs next(c) (now, or from the DNS callback)
 * when the destination is acceptable; otherwise answers 400 or 503.  url
 * is borrowed for the call.
 */
void hub_subs_vet_destination(struct subs_call *c, const char *url, subs_step next);

/* Severs a running lookup from c (c is going away). */
void hub_subs_vet_detach(struct subs_call *c);

/* ---------------------------------------------------------- api_verify.c -- */

/* POST /v1/subscriptions/{id}/verify: a synchronous probe, answered with
 * the subscription and {"verification": {"ok", "status", "error"}}. */
void hub_subs_verify(struct subs_call *c);

/* The background probe of a subscription just created (c->in and the
 * plaintext c->secret, borrowed).  Never answers the request. */
void hub_subs_probe_created(struct subs_call *c);

/* The background probe after a PATCH changed the url; r is the patch
 * statement's row (hub_subs_patch_col).  Never answers the request. */
void hub_subs_probe_patched(struct subs_call *c, PGresult *r);

/* Severs a running /verify probe from c (c is going away). */
void hub_subs_probe_detach(struct subs_call *c);

/* ------------------------------------------------------ api_deliveries.c -- */

/* GET /v1/subscriptions/{id}/deliveries (?state=, paginated). */
void hub_subs_deliveries_list(struct subs_call *c);

/* GET /v1/deliveries (?subscription=, ?event_id=, ..., paginated): the
 * tenant's jobs across its subscriptions. */
void hub_deliveries_list(struct subs_call *c);

/* GET /v1/deliveries/{id}: the job with its attempts. */
void hub_subs_delivery_get(struct subs_call *c);

/* POST /v1/deliveries/{id}/redeliver: a dead job becomes due again. */
void hub_subs_redeliver(struct subs_call *c);

/* POST /v1/subscriptions/{id}/replay: new jobs for stored events. */
void hub_subs_replay(struct subs_call *c);

#endif
