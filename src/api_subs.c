/*
 * api_subs — /v1/subscriptions and /v1/deliveries (see api_subs.h): the
 * entry point and routing, the request state, rendering a subscription,
 * and the subscription's own routes (create, list, get, PATCH, DELETE,
 * rotate-secret).  Validation, verification probes and deliveries live
 * beside it (api_subs_internal.h says which file does what).
 *
 * Every route follows the admin API's small machine (api_admin.c): the
 * tenant key is checked first (one database round trip), then the request
 * is validated completely in memory, then one transaction answers.  Three
 * routes have an extra asynchronous step:
 *
 *   - create and a PATCH of destination.url vet the destination against
 *     SSRF (SPEC §11, api_subs_input.c);
 *   - create and a url change start a background verification probe
 *     (api_verify.c);
 *   - /verify waits for a probe before it answers (api_verify.c).
 *
 * Secrets: the signing secret and the destination headers are sealed under
 * the KEK with the subscription id as AAD before they reach the database;
 * plaintext exists only in memory while a response or a probe is built, and
 * is wiped (OPENSSL_cleanse) where this module owns the buffer.  Logs carry
 * tenant and subscription ids, never a secret, header value or body.
 *
 * Idempotency-Key (create, rotate-secret here; verify, replay and
 * redeliver beside) is api_idem.h's, scoped "tenant:<tenant id>".  Unlike admin records, a stored
 * response keeps the secret SEALED (member "_ss"), so a replay shows the same secret without it
 * ever being at rest in clear; its marker ("_req") is required, so a key
 * reused for a different request is a 409.
 */
#include "api_subs.h"

#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_subs_internal.h"
#include "dispatch.h"
#include "hub.h"
#include "log.h"
#include "store_subs.h"
#include "util.h"
#include "uuid.h"
#include "webhook.h"

#define V1_PREFIX "/v1"
#define SUBS_PATH "/v1/subscriptions"
#define DELIV_PATH "/v1/deliveries"
#define MAX_SEGMENTS 4

#define GRACE_MAX_MS (7LL * 24 * 3600 * 1000)

#define NO_KEK_DETAIL                                                                              \
    "STREAMING_HUB_KEK is required to store or use subscription secrets; the operator must "       \
    "configure it"

/* ====================================================== request state ====== */

/* on_free of every subscription call: runs once the request is gone and
 * nothing is in flight, also when a DNS lookup or a probe still runs. */
static void subs_call_free(struct hub_api_call *call) {
    struct subs_call *c = (struct subs_call *)call;

    /* sever the weak links: a lookup or probe still running finds no one */
    hub_subs_vet_detach(c);
    hub_subs_probe_detach(c);
    hub_subs_input_free(&c->in);
    hub_api_idem_free(&c->idem);
    free(c->tenant_id);
    free(c->object_id);
    free(c->after);
    free(c->state);
    free(c->secret_sealed);
    OPENSSL_cleanse(c->secret, sizeof(c->secret));
    c->tenant_id = c->object_id = NULL;
    c->after = c->state = c->secret_sealed = NULL;
}

/* Asked before anything is validated against the database: without a KEK
 * no secret can be sealed or opened, so the request cannot succeed. */
int hub_subs_kek_missing(struct subs_call *c) {
    if (c->call.hub->has_kek) {
        return 0;
    }
    hub_api_send_problem(c->call.req, 503, NO_KEK_DETAIL, NULL);
    return 1;
}

/* Lower-case copy of a uuid from the path: sealed texts are bound to the
 * id as PostgreSQL prints it. */
static char *dup_uuid_lower(h2o_iovec_t s, int *oom) {
    char *d = hub_api_strndup(s.base, s.len, oom);
    for (char *p = d; p != NULL && *p != '\0'; p++) {
        if (*p >= 'A' && *p <= 'F') {
            *p = (char)(*p - 'A' + 'a');
        }
    }
    return d;
}

/* ========================================================== rendering ====== */

/*
 * Turns a subscription object from the database into the API's: fills
 * destination.headers with the header NAMES (values "***") from "_hs",
 * sets "secret" to `secret` (plaintext, may be NULL) or, when open_ss, to
 * the opened "_ss", and removes the internal members.  Modifies obj in
 * place; returns 0 or -1 (malformed).  Logs, without values, a row whose
 * sealed text does not open.
 */
static int subs_render(struct hub *hub, json_t *obj, const char *secret, int open_ss) {
    json_t *dest = json_object_get(obj, "destination");
    const char *id = json_string_value(json_object_get(obj, "id"));
    const char *hs = json_string_value(json_object_get(obj, "_hs"));
    json_t *names = NULL;

    if (id == NULL || !json_is_object(dest)) {
        return -1;
    }
    if (hs == NULL) {
        names = json_object();
    } else {
        json_t *plain = NULL;
        if (hub->has_kek && hub_webhook_open_headers(&hub->kek, id, hs, &plain) == 0) {
            const char *name;
            json_t *value;
            names = json_object();
            json_object_foreach(plain, name, value) {
                json_object_set_new(names, name, json_string("***"));
            }
            hub_webhook_headers_wipe(plain);
        } else {
            /* names unknown: null rather than an empty (false) list */
            hub_log(HUB_WARN, "cannot open the destination headers of a subscription (KEK?)",
                    HUB_LS("subscription", id));
            names = json_null();
        }
    }
    json_object_set_new(dest, "headers", names);
    if (secret != NULL) {
        json_object_set_new(obj, "secret", json_string(secret));
        /* only an idempotency record carries "_ss": a replay shows the secret
         * the first answer showed, opened now, never stored in clear */
    } else if (open_ss) {
        const char *ss = json_string_value(json_object_get(obj, "_ss"));
        unsigned char *pt = NULL;
        size_t len = 0;
        if (ss != NULL && hub->has_kek && hub_keyring_open(&hub->kek, ss, id, &pt, &len) == 0) {
            json_object_set_new(obj, "secret", json_stringn((const char *)pt, len));
            OPENSSL_cleanse(pt, len);
            free(pt);
        } else {
            json_object_set_new(obj, "secret", json_null());
        }
    }
    /* internal members never leave the API (store_subs.h) */
    json_object_del(obj, "_hs");
    json_object_del(obj, "_ss");
    json_object_del(obj, "_req");
    return 0;
}

/* Parse and render in one (contract in api_subs_internal.h): every
 * subscription that leaves the API goes through subs_render. */
json_t *hub_subs_load(struct hub *hub, const char *text, size_t len, const char *secret,
                      int open_ss) {
    json_t *obj = json_loadb(text, len, 0, NULL);

    if (obj == NULL || subs_render(hub, obj, secret, open_ss) != 0) {
        hub_log(HUB_ERROR, "database returned a malformed subscription object");
        json_decref(obj);
        return NULL;
    }
    return obj;
}

/* Answers status with the subscription in row 0 of r (a statement whose
 * first column is the object: hub_subs_object_col, hub_subs_patch_col). */
static void send_subscription(struct subs_call *c, int status, PGresult *r, const char *secret) {
    json_t *obj = hub_subs_load(c->call.hub, PQgetvalue(r, 0, HUB_SUBS_OBJECT),
                                (size_t)PQgetlength(r, 0, HUB_SUBS_OBJECT), secret, 0);

    if (obj == NULL) {
        hub_api_send_problem(c->call.req, 500, "malformed object from the database", NULL);
        return;
    }
    hub_api_send_json(c->call.req, status, obj);
    json_decref(obj);
}

/* A listed subscription as the API shows it (hub_api_item_fn; arg: hub). */
static json_t *subs_item(void *arg, const char *text, size_t len) {
    return hub_subs_load(arg, text, len, NULL, 0);
}

/* ======================================================== idempotency ====== */

/*
 * The subscription row a create or a rotation returned: its statement is
 * the stmt-th of the call's own (after the idempotency record's when there
 * is one).  Returns NULL after having answered: a collision on the
 * Idempotency-Key replays the other request's answer, a failure is a
 * database error, no row is `status` with `missing`.
 */
static PGresult *idem_written(struct subs_call *c, const struct hub_pg_outcome *out, int stmt,
                              int status, const char *missing) {
    PGresult *r = out->results[hub_api_idem_first(&c->call) + stmt];

    if (out->status != HUB_PG_OK) {
        if (!hub_api_idem_collided(&c->call, out)) {
            hub_api_send_db_error(c->call.req, out);
        }
        return NULL;
    }
    if (r == NULL || PQntuples(r) == 0) {
        hub_api_send_problem(c->call.req, status, missing, NULL);
        return NULL;
    }
    return r;
}

/* Replays a stored create or rotation: the same status and object, the
 * secret opened from its sealed copy ("_ss"). */
static void idem_replay(struct hub_api_call *call, int status, const char *text, size_t len) {
    h2o_req_t *req = call->req;
    json_t *obj = json_loadb(text, len, 0, NULL);

    if (obj == NULL || subs_render(call->hub, obj, NULL, 1) != 0) {
        json_decref(obj);
        hub_api_send_problem(req, 500, "malformed stored response", NULL);
        return;
    }
    hub_api_idem_mark_replayed(req);
    hub_api_send_json(req, status, obj);
    json_decref(obj);
}

static void create_proceed(struct hub_api_call *call);
static void rotate_proceed(struct hub_api_call *call);

/* Tenant records always carry their marker (unmarked_same 0), and a race
 * whose winner did not commit is the default 409 (unfinished NULL). */
static const struct hub_api_idem_ops create_idem = {
    .proceed = create_proceed,
    .replay = idem_replay,
};
static const struct hub_api_idem_ops rotate_idem = {
    .proceed = rotate_proceed,
    .replay = idem_replay,
};

/* ============================================================ create ======= */

/* The create committed (subscription, audit row, idempotency record):
 * start the background probe, then answer 201 with the secret, shown
 * this once, and the new subscription's Location.  No row: the tenant
 * holds its cap (409). */
static void create_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct subs_call *c = (struct subs_call *)call;
    char detail[160];
    PGresult *r;
    char location[sizeof(SUBS_PATH) + HUB_UUID_TEXT_SIZE + 1];

    snprintf(
        detail, sizeof(detail),
        "the tenant holds %lld subscriptions, its cap (STREAMING_HUB_TENANT_MAX_SUBSCRIPTIONS): "
        "delete one first",
        (long long)call->hub->cfg.tenant_max_subscriptions);
    /* statement 1: the tenant's lock is statement 0 */
    r = idem_written(c, out, 1, 409, detail);

    if (r == NULL) {
        return;
    }
    hub_log(HUB_INFO, "subscription created", HUB_LS("tenant", c->tenant_id),
            HUB_LS("subscription", c->object_id));
    /* the probe first: nothing of c is touched once the answer is sent */
    hub_subs_probe_created(c);
    snprintf(location, sizeof(location), SUBS_PATH "/%s", c->object_id);
    hub_api_add_header(call->req, "location", location);
    send_subscription(c, 201, r, c->secret);
}

/* Seals text under the KEK bound to the subscription id.  NULL on failure. */
static char *seal_text(struct hub *hub, const char *text, const char *id) {
    return hub_keyring_seal(&hub->kek, text, strlen(text), id);
}

/* Seals c->in.headers (if any) into c->in.headers_sealed.  Returns 0 or -1. */
static int seal_headers(struct subs_call *c) {
    char *text;

    if (c->in.headers == NULL) {
        return 0;
    }
    text = json_dumps(c->in.headers, JSON_COMPACT);
    if (text == NULL) {
        return -1;
    }
    c->in.headers_sealed = seal_text(c->call.hub, text, c->object_id);
    OPENSSL_cleanse(text, strlen(text));
    free(text);
    return c->in.headers_sealed != NULL ? 0 : -1;
}

/*
 * The destination passed vetting: makes the id (UUIDv7, so ids sort by
 * creation for pagination) and the secret, seals the secret and the
 * headers under that id, and runs the create with its idempotency record.
 * The seal needs the id as AAD, which is why the id is made here and not
 * by the database.
 */
static void create_execute(struct subs_call *c) {
    struct hub *hub = c->call.hub;
    char id[HUB_UUID_TEXT_SIZE];
    char cap[24];
    struct hub_pg_txn *txn;
    int oom = 0;

    if (hub_uuid7_text(id) != 0 || hub_secret_generate(c->secret, sizeof(c->secret)) != 0) {
        hub_api_send_internal(c->call.req, "cannot generate a subscription id or secret (CSPRNG)",
                              "cannot generate a secret");
        return;
    }
    c->object_id = hub_api_strdup(id, &oom);
    if (oom || (c->secret_sealed = seal_text(hub, c->secret, id)) == NULL || seal_headers(c) != 0) {
        hub_api_send_internal(c->call.req, "cannot seal a subscription secret",
                              "cannot seal the secret");
        return;
    }
    txn = hub_api_idem_txn(&c->call, create_done);
    if (txn == NULL) {
        return;
    }
    snprintf(cap, sizeof(cap), "%lld", (long long)hub->cfg.tenant_max_subscriptions);
    hub_pg_txn_add(txn, &hub_sql_subs_tenant_lock, 1, (const char *[]){c->tenant_id}, NULL, NULL);
    hub_pg_txn_add(txn, &hub_sql_subs_create, 16,
                   (const char *[]){c->object_id, c->tenant_id, c->in.event_types,
                                    c->in.schema_major, c->in.url, c->in.headers_sealed,
                                    c->secret_sealed, c->in.enabled ? "true" : "false",
                                    c->in.retry_schedule, c->in.policy, c->in.ordering,
                                    c->in.max_rate, c->idem.scope ? c->idem.scope : "",
                                    c->idem.marker ? c->idem.marker : "", c->idem.key, cap},
                   NULL, NULL);
    hub_api_call_submit(&c->call, txn);
}

/* No response is stored under the key: vet the destination, then create. */
static void create_proceed(struct hub_api_call *call) {
    struct subs_call *c = (struct subs_call *)call;

    hub_subs_vet_destination(c, c->in.url, create_execute);
}

/* POST /v1/subscriptions: validate everything, then the Idempotency-Key
 * (api_idem.h) decides between a replay and create_proceed. */
static void sub_create(struct subs_call *c) {
    struct hub *hub = c->call.hub;
    h2o_req_t *req = c->call.req;
    json_t *body = hub_api_read_json_object(req, HUB_API_MAX_BODY);
    json_t *errors = NULL;
    h2o_iovec_t idem;
    int oom = 0;

    if (body == NULL) {
        return;
    }
    hub_subs_check_input(hub, body, 1, &c->in, &errors, &oom);
    json_decref(body);
    hub_api_idem_read_key(req, &idem, &errors);
    if (hub_api_input_refused(req, errors, oom)) {
        return;
    }
    if (!hub_subs_kek_missing(c)) {
        hub_api_idem_start(&c->call, &c->idem, idem, HUB_SUBS_IDEM_SCOPE, c->tenant_id, "create",
                           NULL, &create_idem);
    }
}

/* ====================================================== get / list ========= */

/* GET /v1/subscriptions/{id}: the subscription without its secret. */
static void sub_get_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    PGresult *r = hub_api_found(call->req, out, 0, "subscription not found");

    if (r == NULL) {
        return;
    }
    send_subscription((struct subs_call *)call, 200, r, NULL);
}

void hub_subs_run_by_id(struct subs_call *c, const struct hub_sql *sql, hub_api_call_cb cb) {
    hub_api_call_query(&c->call, cb, sql, 2, (const char *[]){c->tenant_id, c->object_id});
}

/* Shared by the two lists (subscriptions, deliveries): the page lives in
 * the call because the answer is rendered in the statement's callback. */
int hub_subs_page_keep(struct subs_call *c, const struct hub_api_page *page, json_t *errors,
                       char limit_text[HUB_SUBS_LIMIT_TEXT]) {
    int oom = 0;

    if (errors != NULL) {
        hub_api_send_invalid(c->call.req, errors);
        return HUB_EINVAL;
    }
    c->limit = page->limit;
    c->after = hub_api_strdup(page->after, &oom);
    if (oom) {
        hub_api_send_oom(c->call.req);
        return HUB_ENOMEM;
    }
    snprintf(limit_text, HUB_SUBS_LIMIT_TEXT, "%d", c->limit + 1);
    return 0;
}

/* Rows are hub_subs_page_col, limit + 1 of them (hub_subs_page_keep). */
static void sub_list_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    if (out->status != HUB_PG_OK || out->results[0] == NULL) {
        hub_api_send_db_error(call->req, out);
        return;
    }
    hub_api_send_page(call->req, out->results[0], ((struct subs_call *)call)->limit,
                      "subscriptions", HUB_SUBS_PAGE_KEY, HUB_SUBS_PAGE_OBJECT, subs_item,
                      call->hub);
}

/* GET /v1/subscriptions: the tenant's subscriptions by id, paginated. */
static void sub_list(struct subs_call *c) {
    h2o_req_t *req = c->call.req;
    struct hub_api_page page;
    json_t *errors = NULL;
    char limit[HUB_SUBS_LIMIT_TEXT];

    hub_api_page_parse(req, "subscriptions", &page, &errors);
    /* the cursor goes to the database as a uuid: one that is not would
     * fail the statement (500) rather than be "not a cursor" (400) */
    if (page.after != NULL && !hub_api_uuid_valid(page.after, strlen(page.after))) {
        hub_api_errors_add(&errors, "cursor", "is not a cursor of this list");
    }
    if (hub_subs_page_keep(c, &page, errors, limit) != 0) {
        return;
    }
    hub_api_call_query(&c->call, sub_list_done, &hub_sql_subs_list, 3,
                       (const char *[]){c->tenant_id, c->after, limit});
}

/* ============================================================= patch ======= */

/* The row of a PATCH or DELETE: logged as `what` when there is one, else
 * answered (404, or the database error) and NULL. */
static PGresult *sub_changed(struct subs_call *c, const struct hub_pg_outcome *out,
                             const char *what) {
    PGresult *r = hub_api_found(c->call.req, out, 0, "subscription not found");

    if (r != NULL) {
        hub_log(HUB_INFO, what, HUB_LS("tenant", c->tenant_id),
                HUB_LS("subscription", c->object_id));
    }
    return r;
}

/* The patch's row (hub_subs_patch_col): a changed url starts a background
 * probe from the same row (its probe block), then the answer goes out. */
static void sub_patch_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct subs_call *c = (struct subs_call *)call;
    PGresult *r = sub_changed(c, out, "subscription updated");

    if (r == NULL) {
        return;
    }
    /* no job this process holds starts with what it read before */
    hub_dispatch_subscription_changed(call->hub->dispatch, PQgetvalue(r, 0, HUB_SUBS_PATCH_ID));
    if (PQgetvalue(r, 0, HUB_SUBS_PATCH_URL_CHANGED)[0] == 't') {
        hub_subs_probe_patched(c, r);
    }
    send_subscription(c, 200, r, NULL);
}

/* The url (if any) passed vetting: seal new headers and run the patch. */
static void patch_execute(struct subs_call *c) {
    struct subs_input *in = &c->in;

    if (in->headers_set && seal_headers(c) != 0) {
        hub_api_send_problem(c->call.req, 500, "cannot seal the destination headers", NULL);
        return;
    }
    /* "set" flags tell "given as null" from "not given" for the members
     * that may be null (store_subs.h) */
    hub_api_call_query(&c->call, sub_patch_done, &hub_sql_subs_patch, 16,
                       (const char *[]){c->tenant_id, c->object_id, in->event_types,
                                        in->schema_major, in->url,
                                        in->headers_set ? "true" : "false", in->headers_sealed,
                                        in->retry_set ? "true" : "false", in->retry_schedule,
                                        in->policy_set ? "true" : "false", in->policy, in->ordering,
                                        in->max_rate_set ? "true" : "false", in->max_rate,
                                        in->enabled < 0 ? NULL
                                        : in->enabled   ? "true"
                                                        : "false",
                                        in->audit});
}

/*
 * PATCH /v1/subscriptions/{id}: any writable member alone.  An empty body
 * is refused (400) rather than accepted as a no-op, which would still bump
 * updated_at and write an audit row for nothing.
 */
static void sub_patch(struct subs_call *c) {
    struct hub *hub = c->call.hub;
    h2o_req_t *req = c->call.req;
    json_t *body = hub_api_read_json_object(req, HUB_API_MAX_BODY);
    json_t *errors = NULL;
    int oom = 0;

    if (body == NULL) {
        return;
    }
    if (json_object_size(body) == 0) {
        json_decref(body);
        hub_api_send_problem(req, 400, "the body names no member to change", NULL);
        return;
    }
    hub_subs_check_input(hub, body, 0, &c->in, &errors, &oom);
    if (errors == NULL) {
        c->in.audit = hub_subs_patch_audit(body);
        oom |= c->in.audit == NULL;
    }
    json_decref(body);
    if (hub_api_input_refused(req, errors, oom)) {
        return;
    }
    /* new headers are sealed; a new url is probed with the opened secrets */
    if ((c->in.headers_set || c->in.url != NULL) && hub_subs_kek_missing(c)) {
        return;
    }
    if (c->in.url != NULL) {
        hub_subs_vet_destination(c, c->in.url, patch_execute);
    } else {
        patch_execute(c);
    }
}

/* ============================================================ delete ======= */

/* DELETE /v1/subscriptions/{id}: 204; its jobs go with it (cascade), and
 * none this process holds starts. */
static void sub_delete_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    PGresult *r = sub_changed((struct subs_call *)call, out, "subscription deleted");

    if (r != NULL) {
        hub_dispatch_subscription_changed(call->hub->dispatch, PQgetvalue(r, 0, 0));
        hub_api_send_no_content(call->req);
    }
}

/* ============================================================ rotate ======= */

/* The rotation committed: answer with the subscription and the new
 * secret (shown this once, like a create's). */
static void rotate_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct subs_call *c = (struct subs_call *)call;
    PGresult *r = idem_written(c, out, 0, 404, "subscription not found");

    if (r == NULL) {
        return;
    }
    hub_log(HUB_INFO, "subscription secret rotated", HUB_LS("tenant", c->tenant_id),
            HUB_LS("subscription", c->object_id), HUB_LI("grace_ms", c->grace_ms));
    send_subscription(c, 200, r, c->secret);
}

/* No response is stored under the key: a new secret, sealed, then one
 * statement that moves the current one to "previous" for its grace. */
static void rotate_proceed(struct hub_api_call *call) {
    struct subs_call *c = (struct subs_call *)call;
    struct hub_pg_txn *txn;
    char grace[24], audit[64];

    if (hub_secret_generate(c->secret, sizeof(c->secret)) != 0 ||
        (c->secret_sealed = seal_text(c->call.hub, c->secret, c->object_id)) == NULL) {
        hub_api_send_internal(c->call.req, "cannot generate or seal a subscription secret",
                              "cannot generate a secret");
        return;
    }
    snprintf(grace, sizeof(grace), "%lld", (long long)c->grace_ms);
    snprintf(audit, sizeof(audit), "{\"grace_ms\":%lld}", (long long)c->grace_ms);
    txn = hub_api_idem_txn(&c->call, rotate_done);
    if (txn == NULL) {
        return;
    }
    hub_pg_txn_add(txn, &hub_sql_subs_rotate, 8,
                   (const char *[]){c->tenant_id, c->object_id, c->secret_sealed, grace,
                                    c->idem.scope ? c->idem.scope : "", c->idem.key,
                                    c->idem.marker ? c->idem.marker : "", audit},
                   NULL, NULL);
    hub_api_call_submit(&c->call, txn);
}

/*
 * POST /v1/subscriptions/{id}/rotate-secret {"grace"}: a new secret; the
 * previous one keeps signing beside it for the grace (default
 * STREAMING_HUB_SECRET_GRACE, at most 7 days, "0" drops it at once), so
 * receivers can switch without losing a delivery.
 */
static void sub_rotate(struct subs_call *c) {
    static const char *const allowed[] = {"grace", NULL};
    h2o_req_t *req = c->call.req;
    json_t *errors = NULL;
    h2o_iovec_t idem;

    /* the body is optional: none rotates with the configured grace */
    c->grace_ms = c->call.hub->cfg.secret_grace_ms;
    if (req->entity.len > 0) {
        json_t *body = hub_api_read_json_object(req, HUB_API_MAX_BODY);
        json_t *g;
        if (body == NULL) {
            return;
        }
        hub_api_reject_unknown_members(body, allowed, &errors);
        g = json_object_get(body, "grace");
        if (g != NULL && !json_is_null(g)) {
            const char *s = json_string_value(g);
            int64_t ms = -1;
            /* a bare "0" is allowed: a duration without a unit, but unambiguous */
            if (s != NULL && strcmp(s, "0") == 0) {
                ms = 0;
            } else if (s == NULL || hub_duration_parse(s, &ms) != 0) {
                ms = -1;
            }
            if (ms < 0 || ms > GRACE_MAX_MS) {
                hub_api_errors_add(&errors, "grace",
                                   "must be a duration from 0 to 7d (e.g. \"24h\", \"0s\")");
            } else {
                c->grace_ms = ms;
            }
        }
        json_decref(body);
    }
    hub_api_idem_read_key(req, &idem, &errors);
    if (errors != NULL) {
        hub_api_send_invalid(req, errors);
        return;
    }
    if (!hub_subs_kek_missing(c)) {
        hub_api_idem_start(&c->call, &c->idem, idem, HUB_SUBS_IDEM_SCOPE, c->tenant_id, "rotate",
                           c->object_id, &rotate_idem);
    }
}

/* ============================================================ routing ====== */

/* The two routes that are one statement by id, named for the table. */
static void sub_get(struct subs_call *c) {
    hub_subs_run_by_id(c, &hub_sql_subs_get, sub_get_done);
}

static void sub_delete(struct subs_call *c) {
    hub_subs_run_by_id(c, &hub_sql_subs_delete, sub_delete_done);
}

/* The detail of a 404 on a path that routing could not serve. */
#define NO_SUCH_RESOURCE "no such resource"

/*
 * The routes: a path of `segments` segments under /v1 ("subscriptions",
 * "subscriptions/{id}", "subscriptions/{id}/<action>", and the same under
 * "deliveries") and a method.  GET also answers HEAD.
 */
struct subs_route {
    int subscriptions;  /* 1: under /v1/subscriptions, 0: /v1/deliveries */
    int segments;       /* 1 the collection, 2 one object, 3 an action on it */
    const char *action; /* segments 3: the action's name */
    const char *method;
    subs_step run;       /* the route, once the tenant is authenticated */
    const char *allow;   /* the Allow header of a 405 on this path */
    const char *missing; /* the detail of a 404 for an id that cannot exist */
};

/* Rows of one path are consecutive and share their Allow: a path matched
 * with another method is a 405 with the path's Allow.  The deliveries of a
 * subscription are under /v1/subscriptions but render as deliveries. */
#define SUB_ALLOW "GET, HEAD, PATCH, DELETE"

static const struct subs_route routes[] = {
    {1, 1, NULL, "GET", sub_list, "GET, HEAD, POST", NO_SUCH_RESOURCE},
    {1, 1, NULL, "POST", sub_create, "GET, HEAD, POST", NO_SUCH_RESOURCE},
    {1, 2, NULL, "GET", sub_get, SUB_ALLOW, NO_SUCH_RESOURCE},
    {1, 2, NULL, "PATCH", sub_patch, SUB_ALLOW, NO_SUCH_RESOURCE},
    {1, 2, NULL, "DELETE", sub_delete, SUB_ALLOW, NO_SUCH_RESOURCE},
    {1, 3, "verify", "POST", hub_subs_verify, "POST", NO_SUCH_RESOURCE},
    {1, 3, "rotate-secret", "POST", sub_rotate, "POST", NO_SUCH_RESOURCE},
    {1, 3, "replay", "POST", hub_subs_replay, "POST", NO_SUCH_RESOURCE},
    {1, 3, "deliveries", "GET", hub_subs_deliveries_list, "GET, HEAD", NO_SUCH_RESOURCE},
    {0, 1, NULL, "GET", hub_deliveries_list, "GET, HEAD", NO_SUCH_RESOURCE},
    {0, 2, NULL, "GET", hub_subs_delivery_get, "GET, HEAD", "delivery not found"},
    {0, 3, "redeliver", "POST", hub_subs_redeliver, "POST", "delivery not found"},
};

/* Runs the route once the tenant key was checked: answers what routing or
 * authentication refused, else hands the call to the route. */
static void subs_authed(struct hub_api_call *call, const char *tenant_id, int status) {
    struct subs_call *c = (struct subs_call *)call;
    h2o_req_t *req = call->req;
    int oom = 0;

    if (hub_api_route_answered(req, status, c->route_status, c->allow,
                               c->missing != NULL ? c->missing : NO_SUCH_RESOURCE)) {
        return;
    }
    c->tenant_id = hub_api_strdup(tenant_id, &oom);
    if (oom) {
        hub_api_send_oom(req);
        return;
    }
    if (c->run == NULL) { /* cannot happen: route_status was 0 */
        hub_api_send_problem(req, 404, NO_SUCH_RESOURCE, NULL);
        return;
    }
    c->run(c);
}

/* 1 when route r names the path s[0..n): its resource, depth and action. */
static int route_path_is(const struct subs_route *r, int subs, const h2o_iovec_t *s, int n) {
    if (r->subscriptions != subs || r->segments != n) {
        return 0;
    }
    return r->action == NULL || hub_api_segment_is(s[2], r->action);
}

/* GET routes also answer HEAD (hub_api_method_get). */
static int route_method_is(const h2o_req_t *req, const struct subs_route *r) {
    return strcmp(r->method, "GET") == 0 ? hub_api_method_get(req)
                                         : hub_api_method_is(req, r->method);
}

/*
 * Decides the route from the method and path segments (s[0] is
 * "subscriptions" or "deliveries").  What cannot be routed is answered
 * after authentication (route_status): 404 for an unknown path or an id
 * that cannot exist, 405 with Allow for a known path and another method.
 */
static void route(struct subs_call *c, h2o_iovec_t *s, int n, int *oom) {
    h2o_req_t *req = c->call.req;
    int subs = hub_api_segment_is(s[0], "subscriptions");
    const struct subs_route *path = NULL;

    c->route_status = 404;
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        if (!route_path_is(&routes[i], subs, s, n)) {
            continue;
        }
        path = &routes[i];
        if (route_method_is(req, path)) {
            c->run = path->run;
            c->missing = path->missing;
            break;
        }
    }
    if (path == NULL) {
        return; /* 404: no such path */
    }
    if (c->run == NULL) {
        c->route_status = 405;
        c->allow = path->allow;
        return;
    }
    if (n == 1) {
        c->route_status = 0;
        return;
    }
    /* the method is checked before the id: a 405 says nothing about ids */
    if (subs) {
        if (!hub_api_uuid_valid(s[1].base, s[1].len)) {
            return; /* 404: an id that cannot exist */
        }
        c->object_id = dup_uuid_lower(s[1], oom);
    } else {
        if (!hub_api_positive_id(s[1].base, s[1].len)) {
            return; /* job ids are bigint: anything else is not found */
        }
        c->object_id = hub_api_strndup(s[1].base, s[1].len, oom);
    }
    c->route_status = 0;
}

/* The entry point (api_subs.h): routes first, in memory, then
 * authenticates; the route's answer (404/405 included) comes from
 * subs_authed once the key was checked. */
int hub_api_subs_handle(struct hub *hub, h2o_req_t *req) {
    h2o_iovec_t segs[MAX_SEGMENTS];
    struct subs_call *c;
    int n, oom = 0;

    if (!hub_api_path_under(req->path_normalized, SUBS_PATH) &&
        !hub_api_path_under(req->path_normalized, DELIV_PATH)) {
        return 0; /* another /v1 module's, or nobody's */
    }
    c = hub_api_call_new(hub, req, sizeof(*c), subs_call_free);
    if (c == NULL) {
        return 1;
    }
    n = hub_api_split_path(req->path_normalized, sizeof(V1_PREFIX) - 1, segs, MAX_SEGMENTS);
    if (n > 0) {
        route(c, segs, n, &oom);
    } else {
        c->route_status = 404; /* "//", or too deep */
    }
    if (oom) {
        hub_api_send_oom(req);
        return 1;
    }
    /* the key first: without it nothing about these resources is revealed */
    hub_api_auth_tenant(&c->call, subs_authed);
    return 1;
}
