/*
 * api_verify — verification probes of the subscription API (SPEC §6; see
 * api_subs_internal.h).
 *
 * A probe proves that a destination is the subscriber's: a signed POST of a
 * random challenge (built by webhook.c exactly as a delivery is signed) that
 * the destination must echo in a 2xx body.  Two kinds:
 *
 *   background  after a create or a url change; records "active" or
 *               "failed" only while the subscription is still "pending"
 *               with the url probed, and answers nobody;
 *   verify      POST /v1/subscriptions/{id}/verify; records the outcome
 *               (success re-enables the subscription) and answers with it.
 *
 * Only a recorded success makes a subscription deliverable (SPEC §6): until
 * then its jobs stay parked and nothing is sent to the destination but the
 * probe.  Every recorded transition is audited ("subscription.verification",
 * store_subs.c).  /verify honours Idempotency-Key (api_idem.h): the record
 * is written by the statement that records the outcome, so a retry gets the
 * first answer (byte for byte) instead of probing again.
 *
 * The challenge is looked for in the first PROBE_BODY_MAX bytes of the
 * response body (httpc keeps that much for a probe): "the response body
 * contains the challenge", for a destination that echoes it inside a
 * larger document.
 *
 * A probe outlives its request if need be (the client hangs up, the server
 * stops): struct subs_probe owns copies of everything it needs and has a
 * weak link to the waiting call, which the call's on_free severs
 * (hub_subs_probe_detach).  It always records its outcome; it answers only
 * if someone still waits.  It keeps no plaintext: the opened keys and
 * headers live only while the request is built.
 */
#include "api_subs_internal.h"

#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hub.h"
#include "httpc.h"
#include "log.h"
#include "store_admin.h"
#include "store_subs.h"
#include "uuid.h"
#include "webhook.h"

#define PROBE_CONNECT_TIMEOUT_MS 5000
/* How much of a probe's response body is searched for the challenge. */
#define PROBE_BODY_MAX (64 * 1024)
#define NO_HTTPC_DETAIL "outgoing HTTP is not available in this process; retry later"

enum probe_mode { PROBE_BACKGROUND, PROBE_VERIFY };

/* A verification probe in flight.  Owns copies of everything it needs
 * after the request is gone; no plaintext secret or header value. */
struct subs_probe {
    struct hub *hub;
    enum probe_mode mode;
    struct subs_call *owner; /* PROBE_VERIFY: the waiting request, NULL once gone */
    char sub_id[HUB_UUID_TEXT_SIZE];
    char delivery_id[HUB_UUID_TEXT_SIZE];
    char *tenant_id;
    char *url;
    char *idem_scope;  /* PROBE_VERIFY with an Idempotency-Key: the record's */
    char *idem_key;    /* scope, key and request marker (api_idem.h), NULL */
    char *idem_marker; /* without a key */
    char challenge[HUB_WEBHOOK_CHALLENGE_SIZE];
    int ok;
    long status; /* 0: no response */
    char *error;
    /* hub->probes, the probes in flight, from the request's start */
    struct subs_probe *prev, *next;
    int listed;
};

/* Probes in flight per tenant, and per process: a probe holds a connection
 * and a 64 KiB excerpt for up to DELIVERY_TIMEOUT, and nothing else bounds
 * how many a tenant starts (each PATCH of a URL, each create), at a
 * destination that never answers or at someone else's. */
#define PROBE_TENANT_MAX 8
#define PROBE_PROCESS_MAX 256

/* ============================================================= probes ====== */

/* 1 when tenant may start another probe (PROBE_TENANT_MAX,
 * PROBE_PROCESS_MAX); the list is at most PROBE_PROCESS_MAX long. */
static int probe_room(const struct hub *hub, const char *tenant) {
    size_t n = 0;

    if (hub->n_probes >= PROBE_PROCESS_MAX) {
        return 0;
    }
    for (const struct subs_probe *q = hub->probes; q != NULL; q = q->next) {
        n += strcmp(q->tenant_id, tenant) == 0;
    }
    return n < PROBE_TENANT_MAX;
}

static void probe_list(struct subs_probe *p) {
    struct hub *hub = p->hub;

    p->prev = NULL;
    p->next = hub->probes;
    if (hub->probes != NULL) {
        hub->probes->prev = p;
    }
    hub->probes = p;
    hub->n_probes++;
    p->listed = 1;
}

static void probe_unlist(struct subs_probe *p) {
    struct hub *hub = p->hub;

    if (!p->listed) {
        return;
    }
    if (p->prev != NULL) {
        p->prev->next = p->next;
    } else {
        hub->probes = p->next;
    }
    if (p->next != NULL) {
        p->next->prev = p->prev;
    }
    hub->n_probes--;
    p->listed = 0;
}

/* Frees a probe and what it owns; its owner's link must be gone already. */
static void probe_free(struct subs_probe *p) {
    probe_unlist(p);
    free(p->tenant_id);
    free(p->url);
    free(p->idem_scope);
    free(p->idem_key);
    free(p->idem_marker);
    free(p->error);
    free(p);
}

/* The "verification" member of a /verify answer. */
static json_t *probe_outcome_json(const struct subs_probe *p) {
    return json_pack("{s:b, s:o, s:o}", "ok", p->ok, "status",
                     p->status > 0 ? json_integer(p->status) : json_null(), "error",
                     p->error != NULL ? json_string(p->error) : json_null());
}

/* Answers the waiting /verify request, if any, from the recorded outcome. */
static void probe_answer(struct subs_probe *p, const struct hub_pg_outcome *out) {
    struct subs_call *c = p->owner;
    /* after the lock timeout's statement and the stale record's */
    int first = p->idem_key != NULL ? 2 : 1;
    h2o_req_t *req;
    PGresult *r;
    json_t *obj;

    if (c == NULL || c->call.req == NULL) {
        return;
    }
    /* detach first: answering may dispose of the request, and the call with it */
    c->probe = NULL;
    p->owner = NULL;
    req = c->call.req;
    if (out == NULL) {
        hub_api_send_problem(req, 503, "the database is unavailable; retry later", NULL);
        return;
    }
    if (out->status != HUB_PG_OK) {
        /* a concurrent /verify with this key recorded first: its answer */
        if (!hub_api_idem_collided(&c->call, out)) {
            hub_api_send_db_error(req, out);
        }
        return;
    }
    r = out->results[first];
    if (r == NULL || PQntuples(r) == 0) {
        hub_api_send_problem(req, 409,
                             "the subscription was changed or deleted during verification; "
                             "retry",
                             NULL);
        return;
    }
    obj = hub_subs_load(p->hub, PQgetvalue(r, 0, HUB_SUBS_OBJECT),
                        (size_t)PQgetlength(r, 0, HUB_SUBS_OBJECT), NULL, 0);
    if (obj == NULL || json_object_set_new(obj, "verification", probe_outcome_json(p)) != 0) {
        json_decref(obj);
        hub_api_send_problem(req, 500, "malformed object from the database", NULL);
        return;
    }
    hub_api_send_json(req, 200, obj);
    json_decref(obj);
}

/* The outcome's transaction completed: a /verify probe answers from it; a
 * background probe only logs what did not apply (a failure, or a
 * subscription that changed meanwhile: its own probe decides).  The probe
 * ends here. */
static void probe_recorded(void *arg, const struct hub_pg_outcome *out) {
    struct subs_probe *p = arg;

    if (p->mode == PROBE_VERIFY) {
        probe_answer(p, out);
    } else if (out->status != HUB_PG_OK) {
        hub_log(HUB_WARN, "cannot record a verification outcome", HUB_LS("tenant", p->tenant_id),
                HUB_LS("subscription", p->sub_id), HUB_LS("error", out->error));
    } else if (out->results[1] == NULL || PQntuples(out->results[1]) == 0) {
        /* (results[0] is the lock timeout's) */
        hub_log(HUB_INFO, "verification outcome ignored: the subscription changed meanwhile",
                HUB_LS("tenant", p->tenant_id), HUB_LS("subscription", p->sub_id));
    }
    probe_free(p);
}

/* Stores the outcome (background: only if nothing changed meanwhile;
 * /verify: the full re-enabling update), then answers whoever waits. */
static void probe_record(struct subs_probe *p) {
    struct hub *hub = p->hub;
    const char *okv = p->ok ? "true" : "false";
    struct hub_pg_txn *txn;

    hub_log(p->ok ? HUB_INFO : HUB_WARN, "verification probe", HUB_LS("tenant", p->tenant_id),
            HUB_LS("subscription", p->sub_id), HUB_LS("delivery_id", p->delivery_id),
            HUB_LS("outcome", p->ok ? "ok" : "failed"), HUB_LI("status", p->status),
            HUB_LS("error", p->error != NULL ? p->error : ""),
            HUB_LS("mode", p->mode == PROBE_VERIFY ? "verify" : "background"));
    /* The probe's own transaction, not the call's: it records even when
     * the request is gone, and queues while the database reconnects. */
    if (hub->pg == NULL || (txn = hub_pg_txn_new(hub->pg, probe_recorded, p)) == NULL) {
        if (p->mode == PROBE_VERIFY) {
            probe_answer(p, NULL);
        }
        probe_free(p);
        return;
    }
    /* both are audited; a background result is guarded by the url (and
     * "pending") instead of answering anyone (store_subs.h) */
    hub_pg_txn_add(txn, &hub_sql_subs_outcome_lock_timeout, 0, NULL, NULL, NULL);
    if (p->mode == PROBE_VERIFY) {
        char audit[64];
        json_t *v = probe_outcome_json(p);
        char *vtext = v != NULL ? json_dumps(v, JSON_COMPACT) : NULL;
        json_decref(v);
        snprintf(audit, sizeof(audit), "{\"ok\":%s,\"status\":%ld}", okv, p->status);
        if (p->idem_key != NULL) {
            /* an expired record of the key would make the insert collide */
            hub_pg_txn_add(txn, &hub_sql_idem_forget_stale, 2,
                           (const char *[]){p->idem_scope, p->idem_key}, NULL, NULL);
        }
        /* out of memory vtext is NULL, the statement fails (the record's
         * body is NOT NULL when there is a key) or stores no member */
        hub_pg_txn_add(txn, &hub_sql_subs_verify_result, 9,
                       (const char *[]){p->tenant_id, p->sub_id, okv, p->url, audit, p->idem_scope,
                                        p->idem_key, p->idem_marker, vtext},
                       NULL, NULL);
        free(vtext);
    } else {
        char audit[48];
        if (p->status > 0) {
            snprintf(audit, sizeof(audit), "{\"status\":%ld}", p->status);
        } else {
            snprintf(audit, sizeof(audit), "{\"status\":null}");
        }
        hub_pg_txn_add(txn, &hub_sql_subs_probe_result, 4,
                       (const char *[]){p->sub_id, okv, p->url, audit}, NULL, NULL);
    }
    hub_pg_txn_submit(txn);
}

/* Records a failure; the text (ours or libcurl's) is kept to printable
 * ASCII so that it always makes valid JSON and a clean log line. */
static void probe_fail(struct subs_probe *p, const char *error) {
    p->ok = 0;
    free(p->error);
    p->error = strdup(error);
    for (char *q = p->error; q != NULL && *q != '\0'; q++) {
        if ((unsigned char)*q < 0x20 || (unsigned char)*q > 0x7e) {
            *q = '?';
        }
    }
}

/*
 * The probe could not run at all (the HTTP client is closing, out of
 * memory): that says nothing about the destination, so nothing is
 * recorded — a background probe leaves the subscription "pending", and
 * /verify answers 503.
 */
static void probe_abandon(struct subs_probe *p, const char *why) {
    struct subs_call *c = p->owner;

    hub_log(HUB_WARN, "verification probe abandoned", HUB_LS("tenant", p->tenant_id),
            HUB_LS("subscription", p->sub_id), HUB_LS("error", why));
    if (c != NULL && c->call.req != NULL) {
        c->probe = NULL;
        p->owner = NULL;
        hub_api_send_problem(c->call.req, 503, "the verification probe could not run; retry", NULL);
    }
    probe_free(p);
}

/*
 * The destination answered (or not): ok only for a 2xx whose body contains
 * the challenge within its first PROBE_BODY_MAX bytes (what httpc kept: the
 * probe asks for that much).  A failure of the HTTP client itself says
 * nothing about the destination: abandoned.
 */
static void probe_http_done(void *arg, const struct hub_httpc_response *res) {
    struct subs_probe *p = arg;
    char why[160];

    if (res->error == HUB_HTTPC_INTERNAL || res->error == HUB_HTTPC_ABORTED) {
        /* the destination told nothing: the state stays as it is */
        probe_abandon(p, res->error_text != NULL ? res->error_text : "internal");
        return;
    }
    /* status 0: no HTTP answer at all (refused, timed out, TLS) */
    p->status = res->error == HUB_HTTPC_OK ? res->status : 0;
    if (res->error != HUB_HTTPC_OK) {
        snprintf(why, sizeof(why), "%s%s%.120s", hub_httpc_error_str(res->error),
                 res->error_text != NULL ? ": " : "",
                 res->error_text != NULL ? res->error_text : "");
        probe_fail(p, why);
    } else if (res->status < 200 || res->status > 299) {
        snprintf(why, sizeof(why), "the destination answered %ld, not 2xx", res->status);
        probe_fail(p, why);
    } else if (res->excerpt == NULL ||
               memmem(res->excerpt, res->excerpt_len, p->challenge, strlen(p->challenge)) == NULL) {
        probe_fail(p, "the response body does not contain the challenge");
    } else {
        p->ok = 1;
    }
    probe_record(p);
}

/* What a probe needs; all borrowed for probe_start(). */
struct probe_args {
    enum probe_mode mode;
    struct subs_call *owner; /* PROBE_VERIFY */
    const char *tenant_id;
    const char *sub_id;
    const char *url;
    const struct hub_api_idem *idem; /* PROBE_VERIFY: the request's key, or NULL */
    const json_t *headers;           /* plaintext, or NULL */
    const struct hub_sign_key *keys;
    size_t nkeys;
};

/*
 * Sends a verification probe (SPEC §6): the request webhook.c builds for
 * the subscription's keys and headers.  The outcome is recorded (and
 * /verify answered) from the HTTP callback; a request that cannot even
 * start is abandoned (probe_abandon).  hub->httpc must be set.  Returns 0,
 * or -1 after answering 500 (out of memory; nothing started).
 */
static int probe_start(struct hub *hub, const struct probe_args *a) {
    struct subs_probe *p;
    struct hub_webhook_probe wp = {0};
    struct hub_webhook_target t;
    struct hub_httpc_request hr;
    int oom = 0, rc;

    if (!probe_room(hub, a->tenant_id)) {
        hub->metrics.verify_probes_refused++;
        if (a->mode == PROBE_VERIFY && a->owner != NULL && a->owner->call.req != NULL) {
            hub_api_add_header(a->owner->call.req, "Retry-After", "1");
            hub_api_send_problem(a->owner->call.req, 429,
                                 "this tenant's verification probes in flight are at their limit "
                                 "(their destinations are slow to answer); retry later",
                                 NULL);
        } else {
            hub_log(
                HUB_INFO,
                "verification probe not sent: the tenant's probes in flight are at their "
                "limit; the subscription stays pending until POST /v1/subscriptions/{id}/verify",
                HUB_LS("tenant", a->tenant_id), HUB_LS("subscription", a->sub_id));
        }
        return 0;
    }
    p = calloc(1, sizeof(*p));
    if (p == NULL) {
        goto fail;
    }
    p->hub = hub;
    p->mode = a->mode;
    /* copies: the probe outlives its arguments (the call, the row) */
    p->tenant_id = hub_api_strdup(a->tenant_id, &oom);
    p->url = hub_api_strdup(a->url, &oom);
    if (a->idem != NULL && a->idem->key != NULL) {
        p->idem_scope = hub_api_strdup(a->idem->scope, &oom);
        p->idem_key = hub_api_strdup(a->idem->key, &oom);
        p->idem_marker = hub_api_strdup(a->idem->marker, &oom);
    }
    snprintf(p->sub_id, sizeof(p->sub_id), "%s", a->sub_id);
    /* its own delivery id, as every attempt has (SPEC §7.2): the log line
     * of the outcome names it, and so does the destination's request */
    if (oom || hub_uuid7_text(p->delivery_id) != 0) {
        goto fail;
    }
    memset(&t, 0, sizeof(t));
    t.tenant_id = a->tenant_id;
    t.subscription_id = a->sub_id;
    t.delivery_id = p->delivery_id;
    t.attempt = 1;
    t.keys = a->keys;
    t.nkeys = a->nkeys;
    t.dest_headers = a->headers;
    if (hub_webhook_build_probe(&t, &wp) != 0) {
        goto fail;
    }
    memcpy(p->challenge, wp.challenge, sizeof(p->challenge));
    memset(&hr, 0, sizeof(hr));
    hr.url = a->url;
    hr.headers = (const char *const *)wp.headers.lines;
    hr.body = wp.body;
    hr.body_len = wp.body_len;
    hr.timeout_ms = hub->cfg.delivery_timeout_ms;
    hr.connect_timeout_ms = PROBE_CONNECT_TIMEOUT_MS;
    hr.excerpt_bytes = PROBE_BODY_MAX;
    if (a->mode == PROBE_VERIFY && a->owner != NULL) {
        p->owner = a->owner;
        a->owner->probe = p;
    }
    /* in flight from here: unlisted when freed (probe_abandon if it cannot start) */
    probe_list(p);
    /* the module copies the request: the lines (credentials) go at once */
    rc = hub_httpc_post(hub->httpc, &hr, probe_http_done, p);
    hub_webhook_probe_free(&wp);
    if (rc != 0) {
        probe_abandon(p, "the request could not be started");
    }
    return 0;

fail:
    hub_webhook_probe_free(&wp);
    if (p != NULL) {
        probe_free(p);
    }
    hub_log(HUB_ERROR, "cannot build a verification probe", HUB_LS("subscription", a->sub_id));
    if (a->owner != NULL && a->owner->call.req != NULL) {
        a->owner->probe = NULL;
        hub_api_send_oom(a->owner->call.req);
    }
    return -1;
}

/* A background probe of a subscription just created or re-pointed; does
 * nothing (the state stays "pending") without an HTTP client. */
static void probe_background(struct hub *hub, const struct probe_args *a) {
    if (hub->httpc == NULL) {
        hub_log(HUB_WARN,
                "no outgoing HTTP client: the subscription stays pending until "
                "POST /v1/subscriptions/{id}/verify",
                HUB_LS("tenant", a->tenant_id), HUB_LS("subscription", a->sub_id));
        return;
    }
    probe_start(hub, a);
}

/*
 * Opens the sealed secrets and headers of a subscription row (the
 * hub_subs_probe_col block starting at column `block`) and sends the probe
 * of the given mode.  Both current and previous secret sign while the
 * previous one is in its grace, exactly as a delivery would be signed.
 * Returns 0, or -1 when they do not open (no KEK, or another one sealed
 * them): then nothing is sent.  The plaintext is wiped before returning:
 * the probe has its request built by then.
 */
static int probe_row(struct subs_call *c, PGresult *r, int block, enum probe_mode mode) {
    struct hub *hub = c->call.hub;
    struct hub_sign_key keys[HUB_WEBHOOK_MAX_KEYS];
    size_t nkeys = 0;
    json_t *headers = NULL;
    int hs_col = block + HUB_SUBS_PROBE_HEADERS_SEALED;
    int prev_col = block + HUB_SUBS_PROBE_PREV_SECRET_SEALED;
    const char *hs = PQgetisnull(r, 0, hs_col) ? NULL : PQgetvalue(r, 0, hs_col);
    const char *prev = PQgetisnull(r, 0, prev_col) ? NULL : PQgetvalue(r, 0, prev_col);
    int prev_valid = PQgetvalue(r, 0, block + HUB_SUBS_PROBE_PREV_VALID)[0] == 't';
    struct probe_args a;

    if (!hub->has_kek ||
        hub_webhook_open_keys(&hub->kek, c->object_id,
                              PQgetvalue(r, 0, block + HUB_SUBS_PROBE_SECRET_SEALED), prev,
                              prev_valid, keys, &nkeys) != 0 ||
        hub_webhook_open_headers(&hub->kek, c->object_id, hs, &headers) != 0) {
        OPENSSL_cleanse(keys, sizeof(keys));
        return -1;
    }
    memset(&a, 0, sizeof(a));
    a.mode = mode;
    a.owner = mode == PROBE_VERIFY ? c : NULL;
    a.tenant_id = c->tenant_id;
    a.sub_id = c->object_id;
    a.url = PQgetvalue(r, 0, block + HUB_SUBS_PROBE_URL);
    a.idem = mode == PROBE_VERIFY ? &c->idem : NULL;
    a.headers = headers;
    a.keys = keys;
    a.nkeys = nkeys;
    if (mode == PROBE_VERIFY) {
        probe_start(hub, &a);
    } else {
        probe_background(hub, &a);
    }
    hub_webhook_headers_wipe(headers);
    OPENSSL_cleanse(keys, sizeof(keys));
    return 0;
}

/* A url change commits before its probe: a probe failure is logged (the
 * subscription stays "pending") and never fails the PATCH. */
void hub_subs_probe_patched(struct subs_call *c, PGresult *r) {
    if (probe_row(c, r, HUB_SUBS_PATCH_PROBE, PROBE_BACKGROUND) != 0) {
        hub_log(HUB_ERROR, "cannot open a subscription's secrets to probe it (KEK?)",
                HUB_LS("tenant", c->tenant_id), HUB_LS("subscription", c->object_id));
    }
}

void hub_subs_probe_created(struct subs_call *c) {
    struct hub_sign_key key;

    /* the secret is still in plaintext here: no need to open the sealed one */
    if (hub_secret_key(c->secret, key.key, &key.len) == 0) {
        struct probe_args a;
        memset(&a, 0, sizeof(a));
        a.mode = PROBE_BACKGROUND;
        a.tenant_id = c->tenant_id;
        a.sub_id = c->object_id;
        a.url = c->in.url;
        a.headers = c->in.headers;
        a.keys = &key;
        a.nkeys = 1;
        probe_background(c->call.hub, &a);
    }
    OPENSSL_cleanse(&key, sizeof(key));
}

/* From the call's on_free: the probe still records; it just answers no
 * one. */
void hub_subs_probe_detach(struct subs_call *c) {
    if (c->probe != NULL) {
        c->probe->owner = NULL;
        c->probe = NULL;
    }
}

/* ============================================================ /verify ====== */

/* The row to probe (hub_subs_probe_load_col): 404 when absent; 500 when
 * its secrets do not open with this KEK (an operator's problem, logged). */
static void verify_loaded(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct subs_call *c = (struct subs_call *)call;
    PGresult *r = hub_api_found(call->req, out, 0, "subscription not found");

    if (r != NULL && probe_row(c, r, HUB_SUBS_PROBE_LOAD_PROBE, PROBE_VERIFY) != 0) {
        hub_log(HUB_ERROR, "cannot open a subscription's secrets (was the KEK changed?)",
                HUB_LS("tenant", c->tenant_id), HUB_LS("subscription", c->object_id));
        hub_api_send_problem(call->req, 500,
                             "the subscription's secrets do not open with the configured "
                             "STREAMING_HUB_KEK",
                             NULL);
    }
}

/* No answer is stored under the key: load the row and probe. */
static void verify_proceed(struct hub_api_call *call) {
    struct subs_call *c = (struct subs_call *)call;

    hub_subs_run_by_id(c, &hub_sql_subs_probe_load, verify_loaded);
}

/* A stored /verify answer: the subscription as it was then, with its
 * "verification" member, rendered as the first answer was. */
static void verify_replay(struct hub_api_call *call, int status, const char *text, size_t len) {
    json_t *obj = hub_subs_load(call->hub, text, len, NULL, 0);

    if (obj == NULL) {
        hub_api_send_problem(call->req, 500, "malformed stored response", NULL);
        return;
    }
    hub_api_idem_mark_replayed(call->req);
    hub_api_send_json(call->req, status, obj);
    json_decref(obj);
}

static const struct hub_api_idem_ops verify_idem = {
    .proceed = verify_proceed,
    .replay = verify_replay,
};

/* POST .../verify: no input but an optional Idempotency-Key; needs the KEK
 * (to open the secrets) and an HTTP client (to send the probe) before it
 * reads anything. */
void hub_subs_verify(struct subs_call *c) {
    h2o_iovec_t idem;

    if (!hub_subs_action_input(c->call.req, &idem)) {
        return;
    }
    if (hub_subs_kek_missing(c)) {
        return;
    }
    if (c->call.hub->httpc == NULL) {
        hub_api_send_problem(c->call.req, 503, NO_HTTPC_DETAIL, NULL);
        return;
    }
    hub_api_idem_start(&c->call, &c->idem, idem, HUB_SUBS_IDEM_SCOPE, c->tenant_id, "verify",
                       c->object_id, &verify_idem);
}
