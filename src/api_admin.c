/*
 * api_admin — /admin routes (see api_admin.h).
 *
 * Every route is the same small machine: validate the request completely in
 * memory, then one database transaction whose callback answers.  Writes
 * (tenant create/patch, key create/revoke) carry their audit row in the same
 * statement, so the change and its audit entry commit together.
 *
 * Admin POSTs honour Idempotency-Key through api_idem.h (scope "admin"):
 * a stored response younger than 24h is replayed as it was, otherwise the
 * creation runs and stores its response in the same statement.  Two
 * requests racing with one key: the loser's insert of the key collides (or
 * finds the tenant taken), and it looks the key up once more to replay the
 * winner's response.  Records stored before markers existed have no "_req"
 * and still replay.
 *
 * A new API key is shown once: the idempotency record keeps its response
 * with "key": null, because storing the plaintext would break "stored only
 * as SHA-256" (SPEC §5).  A replayed key creation therefore answers the same
 * status, id, tenant and date, without the key.
 */
#include "api_admin.h"

#include "dispatch.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_filters.h"
#include "api_dryrun.h"
#include "api_idem.h"
#include "api_stats.h"
#include "api_schemas.h"
#include "api_util.h"
#include "hub.h"
#include "log.h"
#include "policy.h"
#include "store_admin.h"
#include "store_console.h"
#include "util.h"

#define ADMIN_SCOPE "admin"
#define ADMIN_PREFIX "/admin"
#define ADMIN_MAX_SEGMENTS 4
/* A tenant API key: "shk_" + base64url of 32 random bytes (256 bits, so a
 * key cannot be guessed, and its SHA-256 alone can identify it). */
#define API_KEY_RAW 32
#define API_KEY_TEXT 48 /* "shk_" + 43 + NUL */

#define ID_RULE "must be a string matching [a-zA-Z0-9._-]{1,256}"
#define STATUS_RULE "must be \"active\" or \"inactive\""

/* What an admin call does; the creations' answers depend on it. */
enum admin_op {
    OP_TENANT_CREATE,
    OP_TENANT_GET,
    OP_TENANT_LIST,
    OP_TENANT_PATCH,
    OP_KEY_CREATE,
    OP_KEY_REVOKE,
    OP_QUARANTINE_LIST,
    OP_QUARANTINE_GET,
    OP_SUBS_LIST,
    OP_DELIVERY_LIST,
    OP_DELIVERY_GET,
};

/* One admin request waiting on the database.  Strings are owned (malloc'd)
 * and released by admin_call_free; the plaintext key is wiped. */
struct admin_call {
    struct hub_api_call call; /* first: api_util hands this pointer back */
    enum admin_op op;
    int limit;                /* lists: page size (one more row is fetched) */
    char *tenant_id;          /* the tenant of the path or body */
    char *object_id;          /* key id, quarantine id */
    char *status;             /* new status, or NULL */
    int quotas_set;           /* quotas given (possibly null) */
    char *quotas;             /* quotas as JSON text, NULL for SQL NULL */
    char *audit;              /* audit detail as JSON text */
    struct hub_api_idem idem; /* creations: the Idempotency-Key, if any */
    char *after;              /* lists: cursor value */
    char *reason;             /* quarantine filter */
    /* key creation: the plaintext (in the answer only) and its SHA-256
     * (stored, and what authentication looks up) */
    char api_key[API_KEY_TEXT];
    unsigned char key_hash[32];
};

/* on_free of every admin call (api_util.h): releases the strings and wipes
 * the plaintext key, which lives here between generation and answer. */
static void admin_call_free(struct hub_api_call *call) {
    struct admin_call *a = (struct admin_call *)call;

    free(a->tenant_id);
    free(a->object_id);
    free(a->status);
    free(a->quotas);
    free(a->audit);
    hub_api_idem_free(&a->idem);
    free(a->after);
    free(a->reason);
    OPENSSL_cleanse(a->api_key, sizeof(a->api_key));
    a->tenant_id = a->object_id = a->status = a->quotas = a->audit = NULL;
    a->after = a->reason = NULL;
}

/* A call tied to req (NULL after answering 500). */
static struct admin_call *admin_call_new(struct hub *hub, h2o_req_t *req, enum admin_op op) {
    struct admin_call *a = hub_api_call_new(hub, req, sizeof(*a), admin_call_free);
    if (a != NULL) {
        a->op = op;
    }
    return a;
}

/* 404 with what was not found as the detail. */
static void send_not_found(h2o_req_t *req, const char *what) {
    hub_api_send_problem(req, 404, what, NULL);
}

/* Answers JSON text that PostgreSQL rendered, re-serialised compactly by
 * jansson so that every answer (and every replay) has one byte format
 * (json_build_object spaces its output differently).
 * key, when given, fills the "key" member (a new API key, never stored). */
static void send_pg_object(h2o_req_t *req, int status, const char *text, size_t len,
                           const char *key) {
    json_t *obj = hub_api_pg_object(req, text, len);

    if (obj == NULL) {
        return;
    }
    json_object_del(obj, "_req"); /* a stored response's request marker */
    if (key != NULL) {
        json_object_set_new(obj, "key", json_string(key));
    }
    hub_api_send_json(req, status, obj);
    json_decref(obj);
}

/* Single-object answers: 200 with row 0, or 404 when there is no row. */
static void send_one_row(struct admin_call *a, const struct hub_pg_outcome *out, int index,
                         const char *missing) {
    h2o_req_t *req = a->call.req;
    PGresult *r = hub_api_found(req, out, index, missing);

    if (r == NULL) {
        return;
    }
    send_pg_object(req, 200, PQgetvalue(r, 0, HUB_ADMIN_OBJECT),
                   (size_t)PQgetlength(r, 0, HUB_ADMIN_OBJECT), NULL);
}

/* -------------------------------------------------------------- lists -- */

/* Lists are keyset-paginated (api_util.c): each statement takes its filters,
 * then the cursor's key, then limit + 1. */

/* Rows are (hub_admin_page_col); limit + 1 were asked for (run_list). */
static void send_page(struct admin_call *a, const struct hub_pg_outcome *out, const char *kind) {
    PGresult *r = out->results[0];

    if (out->status != HUB_PG_OK || r == NULL) {
        hub_api_send_db_error(a->call.req, out);
        return;
    }
    hub_api_send_page(a->call.req, r, a->limit, kind, HUB_ADMIN_PAGE_KEY, HUB_ADMIN_PAGE_OBJECT,
                      NULL, NULL);
}

/* The two lists' callbacks: only their cursor kind differs. */
static void tenant_list_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    send_page((struct admin_call *)call, out, "tenants");
}

static void quarantine_list_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    send_page((struct admin_call *)call, out, "quarantine");
}

/* Runs a list statement with params followed by the limit (+1). */
/* The filters (at most 7) are copied into one parameter array with the
 * limit last, which is where every list statement takes it. */
static void run_list(struct admin_call *a, const struct hub_sql *sql, hub_api_call_cb cb,
                     int nparams, const char **params) {
    const char *values[8];
    char limit[16];

    for (int i = 0; i < nparams; i++) {
        values[i] = params[i];
    }
    snprintf(limit, sizeof(limit), "%d", a->limit + 1);
    values[nparams] = limit;
    hub_api_call_query(&a->call, cb, sql, nparams + 1, values);
}

/*
 * The call of a list whose query passed validation: answers 400 (errors,
 * taken) or 500 and returns NULL, else returns the call with the page
 * kept (a list's answer is rendered in its statement's callback).
 */
static struct admin_call *list_call_new(struct hub *hub, h2o_req_t *req, enum admin_op op,
                                        const struct hub_api_page *page, json_t *errors) {
    struct admin_call *a;
    int oom = 0;

    if (errors != NULL) {
        hub_api_send_invalid(req, errors);
        return NULL;
    }
    a = admin_call_new(hub, req, op);
    if (a == NULL) {
        return NULL;
    }
    a->limit = page->limit;
    a->after = hub_api_strdup(page->after, &oom);
    if (oom) {
        hub_api_send_oom(req);
        return NULL;
    }
    return a;
}

/* GET /admin/tenants: the roster by id, paginated. */
static void tenant_list(struct hub *hub, h2o_req_t *req) {
    struct hub_api_page page;
    json_t *errors = NULL;
    struct admin_call *a;

    hub_api_page_parse(req, "tenants", &page, &errors);
    a = list_call_new(hub, req, OP_TENANT_LIST, &page, errors);
    if (a == NULL) {
        return;
    }
    run_list(a, &hub_sql_admin_tenant_list, tenant_list_done, 1, (const char *[]){a->after});
}

/* The quarantine reasons of SPEC §3.2 and §3.5, the only values ?reason= takes. */
static int quarantine_reason_valid(const char *s) {
    return strcmp(s, "invalid_envelope") == 0 || strcmp(s, "digest_conflict") == 0 ||
           strcmp(s, "too_large") == 0 || strcmp(s, "schema_violation") == 0 ||
           strcmp(s, "unknown_schema_version") == 0;
}

/* GET /admin/quarantine?tenant=&reason=: quarantined records, newest
 * first; a large value is left out of the list (store_admin.h). */
static void quarantine_list(struct hub *hub, h2o_req_t *req) {
    struct hub_api_page page;
    json_t *errors = NULL;
    const char *tenant = NULL, *reason = NULL;
    struct admin_call *a;
    int oom = 0;
    int r;

    hub_api_page_parse(req, "quarantine", &page, &errors);
    /* quarantine ids are bigints: another cursor value would fail the
     * statement's cast (500) instead of being refused (400) */
    if (page.after != NULL && !hub_api_positive_id(page.after, strlen(page.after))) {
        hub_api_errors_add(&errors, "cursor", "is not a cursor of this list");
    }
    /* Quarantined records may carry tenant ids that never passed validation,
     * so the filter takes any text (it only has to be storable). */
    r = hub_api_query_param(req, "tenant", &tenant);
    if (r < 0 || (r == 1 && (tenant[0] == '\0' || !hub_utf8_valid(tenant, strlen(tenant))))) {
        hub_api_errors_add(&errors, "tenant", "must be a non-empty UTF-8 string");
    }
    if (r != 1) {
        tenant = NULL;
    }
    r = hub_api_query_param(req, "reason", &reason);
    if (r < 0 || (r == 1 && !quarantine_reason_valid(reason))) {
        hub_api_errors_add(&errors, "reason",
                           "must be one of invalid_envelope, digest_conflict, too_large, "
                           "schema_violation, unknown_schema_version");
    }
    if (r != 1) {
        reason = NULL;
    }
    a = list_call_new(hub, req, OP_QUARANTINE_LIST, &page, errors);
    if (a == NULL) {
        return;
    }
    a->tenant_id = hub_api_strdup(tenant, &oom);
    a->reason = hub_api_strdup(reason, &oom);
    if (oom) {
        hub_api_send_oom(req);
        return;
    }
    run_list(a, &hub_sql_admin_quarantine_list, quarantine_list_done, 3,
             (const char *[]){a->tenant_id, a->reason, a->after});
}

/* ------------------------------------------------------- single objects -- */

/* GET /admin/tenants/{id} and GET /admin/quarantine/{id}. */
static void tenant_get_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    send_one_row((struct admin_call *)call, out, 0, "tenant not found");
}

static void quarantine_get_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    send_one_row((struct admin_call *)call, out, 0, "quarantined record not found");
}

/* One statement with one text parameter (an id from the path). */
/* The id is checked by the router (its syntax); whether it exists is the
 * statement's answer. */
static void run_get(struct hub *hub, h2o_req_t *req, enum admin_op op, const struct hub_sql *sql,
                    hub_api_call_cb cb, h2o_iovec_t id) {
    struct admin_call *a = admin_call_new(hub, req, op);
    int oom = 0;

    if (a == NULL) {
        return;
    }
    a->object_id = hub_api_strndup(id.base, id.len, &oom);
    if (oom) {
        hub_api_send_oom(req);
        return;
    }
    hub_api_call_query(&a->call, cb, sql, 1, (const char *[]){a->object_id});
}

/* The patched tenant (hub_admin_object_col), or 404. */
static void tenant_patch_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    hub_api_auth_forget(); /* its status or quota may have changed: not from the cache */
    send_one_row((struct admin_call *)call, out, 0, "tenant not found");
}

/* A tenant's status: "active" (its keys work, its events are accepted)
 * or "inactive". */
static int status_valid(const json_t *v) {
    const char *s = json_string_value(v);
    return s != NULL && (strcmp(s, "active") == 0 || strcmp(s, "inactive") == 0);
}

/* JSON text of v for a jsonb parameter; NULL for JSON null.  Sets *oom. */
static char *json_param(const json_t *v, int *oom) {
    char *s;
    if (v == NULL || json_is_null(v)) {
        return NULL;
    }
    s = json_dumps(v, HUB_API_JSON_FLAGS);
    if (s == NULL) {
        *oom = 1;
    }
    return s;
}

/*
 * PATCH /admin/tenants/{id} {"status", "quotas"}: either or both.  quotas
 * replaces the whole object (null removes it); the audit row records the
 * members as given.  One statement: the change and its audit commit
 * together, or neither does.
 */
static void tenant_patch(struct hub *hub, h2o_req_t *req, h2o_iovec_t id) {
    static const char *const allowed[] = {"status", "quotas", NULL};
    json_t *body = hub_api_read_json_object(req, HUB_API_MAX_BODY);
    json_t *errors = NULL, *status, *quotas, *audit = NULL;
    struct admin_call *a;
    int oom = 0;

    if (body == NULL) {
        return;
    }
    hub_api_reject_unknown_members(body, allowed, &errors);
    status = json_object_get(body, "status");
    quotas = json_object_get(body, "quotas");
    if (status != NULL && !status_valid(status)) {
        hub_api_errors_add(&errors, "status", STATUS_RULE);
    }
    hub_api_quotas_check(quotas, &errors);
    if (errors != NULL) {
        hub_api_send_invalid(req, errors);
        goto done;
    }
    /* {} is refused: a PATCH that changes nothing is more likely a client's
     * mistake, and would still be audited */
    if (status == NULL && quotas == NULL) {
        hub_api_send_problem(req, 400, "nothing to change: give status and/or quotas", NULL);
        goto done;
    }
    a = admin_call_new(hub, req, OP_TENANT_PATCH);
    if (a == NULL) {
        goto done;
    }
    /* The audit detail is the change itself: the members that were given. */
    audit = json_object();
    if (audit == NULL || json_object_update(audit, body) != 0) {
        oom = 1;
    }
    /* status NULL keeps the current one; quotas_set tells "quotas": null
     * (remove them) from no quotas member at all */
    a->tenant_id = hub_api_strndup(id.base, id.len, &oom);
    a->status = hub_api_strdup(json_string_value(status), &oom);
    a->quotas_set = quotas != NULL;
    a->quotas = json_param(quotas, &oom);
    a->audit = audit != NULL ? json_param(audit, &oom) : NULL;
    if (oom) {
        hub_api_send_oom(req);
        goto done;
    }
    hub_api_call_query(&a->call, tenant_patch_done, &hub_sql_admin_tenant_patch, 5,
                       (const char *[]){a->tenant_id, a->status, a->quotas_set ? "true" : "false",
                                        a->quotas, a->audit});

done:
    json_decref(audit);
    json_decref(body);
}

/* 204 when a key was revoked; 404 when absent or revoked already, so a
 * repeated DELETE does not tell the two apart. */
static void key_revoke_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    h2o_req_t *req = call->req;
    hub_api_auth_forget(); /* this process stops taking the key at once */

    if (hub_api_found(req, out, 0, "API key not found for this tenant") != NULL) {
        hub_api_send_no_content(req);
    }
}

/* DELETE /admin/tenants/{id}/api-keys/{key id}: the key stops working at
 * once (authentication reads revoked_at on every request). */
static void key_revoke(struct hub *hub, h2o_req_t *req, h2o_iovec_t tenant, h2o_iovec_t key_id) {
    struct admin_call *a;
    int oom = 0;

    /* ids that cannot exist are 404 without a round trip (and without a
     * failing ::uuid cast) */
    if (!hub_api_tenant_id_valid(tenant.base, tenant.len) ||
        !hub_api_uuid_valid(key_id.base, key_id.len)) {
        send_not_found(req, "API key not found for this tenant");
        return;
    }
    a = admin_call_new(hub, req, OP_KEY_REVOKE);
    if (a == NULL) {
        return;
    }
    a->tenant_id = hub_api_strndup(tenant.base, tenant.len, &oom);
    a->object_id = hub_api_strndup(key_id.base, key_id.len, &oom);
    if (oom) {
        hub_api_send_oom(req);
        return;
    }
    hub_api_call_query(&a->call, key_revoke_done, &hub_sql_admin_api_key_revoke, 2,
                       (const char *[]){a->tenant_id, a->object_id});
}

/* ------------------------------------------- creations (idempotent POSTs) -- */

/*
 * A creation (tenant, API key) runs:
 *
 *   tenant_create / key_create   validate, make the call
 *   post_start                   Idempotency-Key (api_idem.h): replay a
 *                                stored answer (post_replay), or
 *   post_execute                 one transaction: forget a stale record,
 *                                create, audit, store the record
 *   post_done                    201 (send_created), or the race's second
 *                                lookup, or 404 / 409
 */

/*
 * Answers a creation with the object PostgreSQL rendered: fresh from the
 * creating statement, or as the Idempotency-Key record stored it
 * (replayed).  A fresh tenant gets its Location; a fresh key its plaintext,
 * which exists only in this answer.
 */
static void send_created(struct admin_call *a, int status, const char *text, size_t len,
                         int replayed) {
    h2o_req_t *req = a->call.req;

    if (replayed) {
        hub_api_idem_mark_replayed(req);
    }
    /* a replayed 201 gets its Location too: the retry sees what the first
     * request saw */
    if (a->op == OP_TENANT_CREATE && status == 201) {
        char location[sizeof(ADMIN_PREFIX) + 16 + HUB_API_TENANT_ID_MAX];
        snprintf(location, sizeof(location), ADMIN_PREFIX "/tenants/%s", a->tenant_id);
        hub_api_add_header(req, "location", location);
    }
    send_pg_object(req, status, text, len, a->op == OP_KEY_CREATE && !replayed ? a->api_key : NULL);
}

/* The answer when the creation did not happen and nothing can be replayed:
 * a tenant id that is taken, or a race on the key whose winner did not
 * commit. */
static void send_not_created(struct admin_call *a) {
    char detail[64 + HUB_API_TENANT_ID_MAX];

    if (a->op == OP_TENANT_CREATE) {
        snprintf(detail, sizeof(detail), "tenant %s already exists", a->tenant_id);
        hub_api_send_problem(a->call.req, 409, detail, NULL);
    } else {
        hub_api_send_problem(a->call.req, 409,
                             "a concurrent request with this Idempotency-Key did not complete",
                             NULL);
    }
}

/*
 * The creation's outcome.  A failed transaction may be the race on the key
 * (hub_api_idem_collided replays the winner); no row means the tenant of a
 * new key does not exist (404), or a new tenant's id is taken: a retry of
 * ours that committed first is replayed by the second lookup, anything else
 * is 409.
 */
static void post_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct admin_call *a = (struct admin_call *)call;
    PGresult *r = out->results[hub_api_idem_first(call)];

    if (out->status != HUB_PG_OK) {
        if (!hub_api_idem_collided(call, out)) {
            hub_api_send_db_error(call->req, out);
        }
        return;
    }
    if (r == NULL || PQntuples(r) == 0) {
        if (a->op == OP_KEY_CREATE) {
            send_not_found(call->req, "tenant not found");
            return;
        }
        /* The tenant exists: maybe created by a concurrent request with our
         * key, whose response the second lookup then finds. */
        if (!hub_api_idem_relook(call)) {
            send_not_created(a);
        }
        return;
    }
    send_created(a, 201, PQgetvalue(r, 0, HUB_ADMIN_OBJECT),
                 (size_t)PQgetlength(r, 0, HUB_ADMIN_OBJECT), 0);
}

/* A new key: "shk_" + base64url(32 random bytes); only its SHA-256 is kept. */
static int make_api_key(struct admin_call *a) {
    unsigned char raw[API_KEY_RAW];
    unsigned int n = 0;
    int rc = -1;

    /* RAND_bytes is the CSPRNG; failing, no key is better than a weak one */
    if (RAND_bytes(raw, sizeof(raw)) != 1) {
        goto out;
    }
    memcpy(a->api_key, "shk_", 4);
    hub_base64url(raw, sizeof(raw), a->api_key + 4);
    /* the hash is what the database keeps and what authentication looks up
     * (hub_api_auth_tenant hashes the presented key the same way) */
    if (EVP_Digest(a->api_key, strlen(a->api_key), a->key_hash, &n, EVP_sha256(), NULL) != 1 ||
        n != sizeof(a->key_hash)) {
        goto out;
    }
    rc = 0;
out:
    OPENSSL_cleanse(raw, sizeof(raw));
    return rc;
}

/*
 * Runs the creation (no response stored under its key): one transaction
 * whose creating statement also writes the audit row and, with a key, the
 * idempotency record.  The key is generated only now, so a replay never
 * makes one that nobody sees.
 */
static void post_execute(struct hub_api_call *call) {
    struct admin_call *a = (struct admin_call *)call;
    struct hub_api_idem *idem = &a->idem;
    struct hub_pg_txn *txn;

    if (a->op == OP_KEY_CREATE && make_api_key(a) != 0) {
        hub_api_send_internal(a->call.req,
                              "cannot generate an API key (RAND_bytes or SHA-256 failed)",
                              "cannot generate a key");
        return;
    }
    txn = hub_api_idem_txn(&a->call, post_done);
    if (txn == NULL) {
        return;
    }
    if (a->op == OP_TENANT_CREATE) {
        hub_pg_txn_add(
            txn, &hub_sql_admin_tenant_create, 6,
            (const char *[]){a->tenant_id, a->status, a->quotas, a->audit, idem->key, idem->marker},
            NULL, NULL);
    } else {
        hub_pg_txn_add(
            txn, &hub_sql_admin_api_key_create, 4,
            (const char *[]){a->tenant_id, (const char *)a->key_hash, idem->key, idem->marker},
            (const int[]){0, (int)sizeof(a->key_hash), 0, 0}, (const int[]){0, 1, 0, 0});
    }
    hub_api_call_submit(&a->call, txn);
}

/* A stored response of this request: the same status and object, and for
 * a key creation no key (its plaintext was never stored). */
static void post_replay(struct hub_api_call *call, int status, const char *body, size_t len) {
    send_created((struct admin_call *)call, status, body, len, 1);
}

static void post_unfinished(struct hub_api_call *call) {
    send_not_created((struct admin_call *)call);
}

/* Admin records were stored before they kept a request marker: one without
 * a marker still replays (unmarked_same). */
static const struct hub_api_idem_ops post_idem = {
    .proceed = post_execute,
    .replay = post_replay,
    .unfinished = post_unfinished,
    .unmarked_same = 1,
};

/* Runs a validated creation under its Idempotency-Key (api_idem.h); the
 * admin's records share one scope, ADMIN_SCOPE, which the creating
 * statements write as a constant (store_admin.c). */
static void post_start(struct admin_call *a, h2o_iovec_t key) {
    const char *op = a->op == OP_TENANT_CREATE ? "tenant.create" : "api_key.create";

    hub_api_idem_start(&a->call, &a->idem, key, ADMIN_SCOPE, NULL, op, a->tenant_id, &post_idem);
}

/*
 * POST /admin/tenants {"id", "status", "quotas"}: a new tenant, "active"
 * unless said otherwise.  An existing id is 409 (the statement inserts
 * ON CONFLICT DO NOTHING), unless the request is a retry of the one that
 * created it (Idempotency-Key).
 */
static void tenant_create(struct hub *hub, h2o_req_t *req) {
    static const char *const allowed[] = {"id", "status", "quotas", NULL};
    json_t *body = hub_api_read_json_object(req, HUB_API_MAX_BODY);
    json_t *errors = NULL, *id, *status, *quotas, *audit = NULL;
    struct admin_call *a;
    h2o_iovec_t idem;
    int oom = 0;

    if (body == NULL) {
        return;
    }
    hub_api_reject_unknown_members(body, allowed, &errors);
    id = json_object_get(body, "id");
    status = json_object_get(body, "status");
    quotas = json_object_get(body, "quotas");
    if (id == NULL) {
        hub_api_errors_add(&errors, "id", "is required");
    } else if (!json_is_string(id) ||
               !hub_api_tenant_id_valid(json_string_value(id), json_string_length(id))) {
        hub_api_errors_add(&errors, "id", ID_RULE);
    }
    if (status != NULL && !json_is_null(status) && !status_valid(status)) {
        hub_api_errors_add(&errors, "status", STATUS_RULE);
    }
    hub_api_quotas_check(quotas, &errors);
    /* the key is checked with the body, so one 400 names both */
    hub_api_idem_read_key(req, &idem, &errors);
    if (errors != NULL) {
        hub_api_send_invalid(req, errors);
        goto done;
    }
    a = admin_call_new(hub, req, OP_TENANT_CREATE);
    if (a == NULL) {
        goto done;
    }
    a->tenant_id = hub_api_strdup(json_string_value(id), &oom);
    /* the audit detail records the status the tenant got, default included */
    a->status = hub_api_strdup(status_valid(status) ? json_string_value(status) : "active", &oom);
    a->quotas = json_param(quotas, &oom);
    audit = json_pack("{s:s, s:O?}", "status", a->status ? a->status : "active", "quotas", quotas);
    a->audit = audit != NULL ? json_param(audit, &oom) : NULL;
    if (oom || audit == NULL) {
        hub_api_send_oom(req);
        goto done;
    }
    post_start(a, idem);

done:
    json_decref(audit);
    json_decref(body);
}

/* POST /admin/tenants/{id}/api-keys: a new key for the tenant, shown in
 * this answer only; 404 when the tenant does not exist. */
static void key_create(struct hub *hub, h2o_req_t *req, h2o_iovec_t tenant) {
    static const char *const allowed[] = {NULL};
    json_t *errors = NULL;
    struct admin_call *a;
    h2o_iovec_t idem;
    int oom = 0;

    /* an id that cannot be a tenant's cannot have keys */
    if (!hub_api_tenant_id_valid(tenant.base, tenant.len)) {
        send_not_found(req, "tenant not found");
        return;
    }
    /* No members are defined; an empty body is fine, anything else must
     * still be a well-formed (empty) object. */
    if (req->entity.len > 0) {
        json_t *body = hub_api_read_json_object(req, HUB_API_MAX_BODY);
        if (body == NULL) {
            return;
        }
        hub_api_reject_unknown_members(body, allowed, &errors);
        json_decref(body);
    }
    hub_api_idem_read_key(req, &idem, &errors);
    if (errors != NULL) {
        hub_api_send_invalid(req, errors);
        return;
    }
    a = admin_call_new(hub, req, OP_KEY_CREATE);
    if (a == NULL) {
        return;
    }
    a->tenant_id = hub_api_strndup(tenant.base, tenant.len, &oom);
    if (oom) {
        hub_api_send_oom(req);
        return;
    }
    post_start(a, idem);
}

/* ----------------------------------------- console reads across tenants -- */

/* The operator's views of the tenant API's lists (store_console.h): the
 * same objects, any tenant, for the web console (docs/console.md). */

static void subs_list_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    send_page((struct admin_call *)call, out, "admin-subscriptions");
}

static void delivery_list_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    send_page((struct admin_call *)call, out, "admin-deliveries");
}

static void delivery_get_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    send_one_row((struct admin_call *)call, out, 0, "delivery not found");
}

/* ?tenant= of a console read: absent means every tenant.  Returns the
 * value (request pool) or NULL, adding an error when it is not an id. */
static const char *tenant_filter(h2o_req_t *req, json_t **errors) {
    const char *tenant = NULL;
    int r = hub_api_query_param(req, "tenant", &tenant);

    if (r < 0 || (r == 1 && !hub_api_tenant_id_valid(tenant, strlen(tenant)))) {
        hub_api_errors_add(errors, "tenant", ID_RULE);
    }
    return r == 1 ? tenant : NULL;
}

/* GET /admin/subscriptions?tenant=: subscriptions by id, of one tenant or
 * of all. */
static void subs_list(struct hub *hub, h2o_req_t *req) {
    struct hub_api_page page;
    json_t *errors = NULL;
    const char *tenant;
    struct admin_call *a;

    hub_api_page_parse(req, "admin-subscriptions", &page, &errors);
    if (page.after != NULL && !hub_api_uuid_valid(page.after, strlen(page.after))) {
        hub_api_errors_add(&errors, "cursor", "is not a cursor of this list");
    }
    tenant = tenant_filter(req, &errors);
    a = list_call_new(hub, req, OP_SUBS_LIST, &page, errors);
    if (a == NULL) {
        return;
    }
    /* the values borrow the request pool: the transaction copies them */
    run_list(a, &hub_sql_console_subs_list, subs_list_done, 2, (const char *[]){tenant, a->after});
}

/* GET /admin/deliveries?tenant=&subscription=&event_id=&state=&since=
 * &until=: jobs of every tenant newest first, filtered like the tenant's
 * list (api_filters.h); "what happened to event X" across tenants. */
static void delivery_list(struct hub *hub, h2o_req_t *req) {
    struct hub_api_page page;
    struct hub_deliv_filter f;
    json_t *errors = NULL;
    const char *tenant, *sub = NULL;
    struct admin_call *a;
    int r;

    hub_api_page_parse(req, "admin-deliveries", &page, &errors);
    if (page.after != NULL && !hub_api_positive_id(page.after, strlen(page.after))) {
        hub_api_errors_add(&errors, "cursor", "is not a cursor of this list");
    }
    tenant = tenant_filter(req, &errors);
    r = hub_api_query_param(req, "subscription", &sub);
    if (r < 0 || (r == 1 && !hub_api_uuid_valid(sub, strlen(sub)))) {
        hub_api_errors_add(&errors, "subscription", "must be a subscription id (a UUID)");
    }
    if (r != 1) {
        sub = NULL;
    }
    hub_deliv_filter_parse(req, 1, &f, &errors);
    a = list_call_new(hub, req, OP_DELIVERY_LIST, &page, errors);
    if (a == NULL) {
        return;
    }
    run_list(a, hub_console_deliveries_sql(f.event_id), delivery_list_done, 7,
             (const char *[]){tenant, sub, f.event_id, f.state, hub_deliv_filter_since(&f),
                              hub_deliv_filter_until(&f), a->after});
}

/* /admin/subscriptions and /admin/deliveries[/{id}]: read-only. */
static void route_console(struct hub *hub, h2o_req_t *req, h2o_iovec_t *s, int n) {
    int deliveries = hub_api_segment_is(s[0], "deliveries");

    if (n > (deliveries ? 2 : 1)) {
        send_not_found(req, "no such admin resource");
        return;
    }
    if (!hub_api_method_get(req)) {
        hub_api_send_method_not_allowed(req, "GET, HEAD");
        return;
    }
    if (!deliveries) {
        subs_list(hub, req);
    } else if (n == 1) {
        delivery_list(hub, req);
    } else if (!hub_api_positive_id(s[1].base, s[1].len)) {
        send_not_found(req, "delivery not found");
    } else {
        run_get(hub, req, OP_DELIVERY_GET, &hub_sql_console_delivery_get, delivery_get_done, s[1]);
    }
}

/* -------------------------------------------------------------- routing -- */

/* /admin/tenants[/{id}[/api-keys[/{key id}]]].  An id that cannot be a
 * tenant's is 404 before any database work. */
static void route_tenants(struct hub *hub, h2o_req_t *req, h2o_iovec_t *s, int n) {
    if (n == 1) {
        if (hub_api_method_get(req)) {
            tenant_list(hub, req);
        } else if (hub_api_method_is(req, "POST")) {
            tenant_create(hub, req);
        } else {
            hub_api_send_method_not_allowed(req, "GET, HEAD, POST");
        }
        return;
    }
    if (n == 2) {
        if (hub_api_method_get(req)) {
            if (!hub_api_tenant_id_valid(s[1].base, s[1].len)) {
                send_not_found(req, "tenant not found");
                return;
            }
            run_get(hub, req, OP_TENANT_GET, &hub_sql_admin_tenant_get, tenant_get_done, s[1]);
        } else if (hub_api_method_is(req, "PATCH")) {
            if (!hub_api_tenant_id_valid(s[1].base, s[1].len)) {
                send_not_found(req, "tenant not found");
                return;
            }
            tenant_patch(hub, req, s[1]);
        } else {
            hub_api_send_method_not_allowed(req, "GET, HEAD, PATCH");
        }
        return;
    }
    /* the tenant's figures, as GET /v1/stats gives them (api_stats.h) */
    if (n == 3 && hub_api_segment_is(s[2], "stats")) {
        if (hub_api_method_get(req)) {
            hub_api_stats_admin(hub, req, s[1]);
        } else {
            hub_api_send_method_not_allowed(req, "GET, HEAD");
        }
        return;
    }
    /* keys are reached through their tenant: a key id alone is not enough
     * to revoke it (the statement matches both) */
    if (n == 3 && hub_api_segment_is(s[2], "api-keys")) {
        if (hub_api_method_is(req, "POST")) {
            key_create(hub, req, s[1]);
        } else {
            hub_api_send_method_not_allowed(req, "POST");
        }
        return;
    }
    if (n == 4 && hub_api_segment_is(s[2], "api-keys")) {
        if (hub_api_method_is(req, "DELETE")) {
            key_revoke(hub, req, s[1], s[3]);
        } else {
            hub_api_send_method_not_allowed(req, "DELETE");
        }
        return;
    }
    send_not_found(req, "no such admin resource");
}

/* /admin/quarantine[/{id}]: read-only. */
static void route_quarantine(struct hub *hub, h2o_req_t *req, h2o_iovec_t *s, int n) {
    if (n > 2) {
        send_not_found(req, "no such admin resource");
        return;
    }
    if (!hub_api_method_get(req)) {
        hub_api_send_method_not_allowed(req, "GET, HEAD");
        return;
    }
    if (n == 1) {
        quarantine_list(hub, req);
        return;
    }
    if (!hub_api_positive_id(s[1].base, s[1].len)) {
        send_not_found(req, "quarantined record not found");
        return;
    }
    run_get(hub, req, OP_QUARANTINE_GET, &hub_sql_admin_quarantine_get, quarantine_get_done, s[1]);
}

/* GET /admin/breakers: open and half-open breakers of this process (SPEC §7.6,
 * breaker state is per process): {"items": [...]}.  With several hub
 * processes, each answers for itself; an operator asks each of them. */
static void route_breakers(struct hub *hub, h2o_req_t *req) {
    char *items;
    char *body;
    int len;

    if (!hub_api_method_get(req)) {
        hub_api_send_method_not_allowed(req, "GET, HEAD");
        return;
    }
    /* the dispatcher renders its own breakers (their state is its own) */
    items = hub_dispatch_breakers_json(hub->dispatch);
    if (items == NULL) {
        hub_api_send_oom(req);
        return;
    }
    len = asprintf(&body, "{\"items\":%s}", items);
    free(items);
    if (len < 0) {
        hub_api_send_oom(req);
        return;
    }
    hub_api_send_json_text(req, 200, body, (size_t)len);
    free(body);
}

/* GET /admin/policies: the current generation (SPEC §8) as the policy
 * module renders it: {"generation", "loaded_at", "dir", "policies"}. */
static void policies_list(struct hub *hub, h2o_req_t *req) {
    char *text = hub_policies_json(hub->policies);
    if (text == NULL) {
        hub_api_send_oom(req);
        return;
    }
    hub_api_send_json_text(req, 200, text, strlen(text));
    free(text);
}

/* A reload request waits on the policy module, not the database: the call
 * keeps what the reload reported until the answer (hub_api_call_wait). */
struct reload_call {
    struct hub_api_call call; /* first */
    const char *json;
    double seconds;
    struct hub_api_idem idem; /* the Idempotency-Key, if any (api_idem.h) */
};

/* The reload's report as the answer, with how long it took.  json is
 * borrowed from the policy module for the duration of its callback, and
 * this runs inside it (hub_api_call_wake). */
static void reload_answer(struct hub_api_call *call, void *arg) {
    struct reload_call *rc = (struct reload_call *)call;
    json_error_t jerr;
    json_t *body = rc->json != NULL ? json_loads(rc->json, 0, &jerr) : NULL;

    (void)arg;
    /* NULL json: the reload could not run at all (policy.h) */
    if (rc->json == NULL) {
        hub_api_send_problem(call->req, 503, "the policy reload could not run; retry later", NULL);
        return;
    }
    if (body == NULL) {
        hub_api_send_problem(call->req, 500, "the policy reload could not be reported", NULL);
        return;
    }
    json_object_set_new(body, "reload_seconds", json_real(rc->seconds));
    hub_api_idem_store_send(call, 200, body); /* stored first under a key */
    json_decref(body);
}

/* The policy module's callback (loop thread). */
static void reload_done(void *arg, const char *json, double seconds) {
    struct reload_call *rc = arg;
    rc->json = json;
    rc->seconds = seconds;
    hub_api_call_wake(&rc->call, reload_answer, NULL);
}

/* No answer is stored under the request's Idempotency-Key: reload. */
static void reload_proceed(struct hub_api_call *call) {
    /* the call outlives a client that hangs up during the reload: the
     * reload's callback always finds it */
    hub_api_call_wait(call);
    hub_policies_reload(call->hub->policies, reload_done, call);
}

static void reload_replay(struct hub_api_call *call, int status, const char *body, size_t len) {
    hub_api_idem_send_stored(call->req, status, body, len, 1);
}

static void reload_free(struct hub_api_call *call) {
    hub_api_idem_free(&((struct reload_call *)call)->idem);
}

static const struct hub_api_idem_ops reload_idem = {
    .proceed = reload_proceed,
    .replay = reload_replay,
};

/* POST /admin/policies/reload: answers once a generation that started after
 * the request is in use, with that generation (errors included).  Under an
 * Idempotency-Key a retry gets that answer again instead of reloading. */
static void policies_reload(struct hub *hub, h2o_req_t *req) {
    json_t *errors = NULL;
    h2o_iovec_t key;
    struct reload_call *rc;

    if (hub_api_idem_read_key(req, &key, &errors) != 0) {
        hub_api_send_invalid(req, errors);
        return;
    }
    rc = hub_api_call_new(hub, req, sizeof(*rc), reload_free);
    if (rc != NULL) {
        hub_api_idem_start(&rc->call, &rc->idem, key, ADMIN_SCOPE, NULL, "reload", NULL,
                           &reload_idem);
    }
}

/* /admin/policies and /admin/policies/reload. */
static void route_policies(struct hub *hub, h2o_req_t *req, h2o_iovec_t *s, int n) {
    if (n == 1) {
        if (!hub_api_method_get(req)) {
            hub_api_send_method_not_allowed(req, "GET, HEAD");
            return;
        }
        policies_list(hub, req);
        return;
    }
    if (n == 2 && hub_api_segment_is(s[1], "reload")) {
        if (!hub_api_method_is(req, "POST")) {
            hub_api_send_method_not_allowed(req, "POST");
            return;
        }
        policies_reload(hub, req);
        return;
    }
    if (n == 2 && hub_api_segment_is(s[1], "dry-run")) {
        hub_api_dryrun(hub, req);
        return;
    }
    send_not_found(req, "no such admin resource");
}

/* The entry point (api_admin.h): the token, then the first segment picks
 * the resource's router. */
void hub_api_admin_handle(struct hub *hub, h2o_req_t *req) {
    h2o_iovec_t segs[ADMIN_MAX_SEGMENTS];
    h2o_iovec_t token;
    int n;

    /* Authentication comes before routing: without the token nothing about
     * the admin API (not even which paths exist) is revealed. */
    if (hub->cfg.admin_token == NULL || hub->cfg.admin_token[0] == '\0') {
        hub_api_send_unauthorized(req, "the admin API is disabled (STREAMING_HUB_ADMIN_TOKEN "
                                       "is not set)");
        return;
    }
    if (!hub_api_bearer_token(req, &token) ||
        !hub_api_token_equals(hub->cfg.admin_token, token.base, token.len)) {
        hub_api_send_unauthorized(req, "a valid admin bearer token is required");
        return;
    }
    /* "/admin" itself has no segment: n 0 is 404 like an unknown path */
    n = hub_api_split_path(req->path_normalized, sizeof(ADMIN_PREFIX) - 1, segs,
                           ADMIN_MAX_SEGMENTS);
    if (n <= 0) {
        send_not_found(req, "no such admin resource");
        return;
    }
    if (hub_api_segment_is(segs[0], "tenants")) {
        route_tenants(hub, req, segs, n);
        return;
    }
    if (hub_api_segment_is(segs[0], "quarantine")) {
        route_quarantine(hub, req, segs, n);
        return;
    }
    if (hub_api_segment_is(segs[0], "subscriptions") || hub_api_segment_is(segs[0], "deliveries")) {
        route_console(hub, req, segs, n);
        return;
    }
    /* breakers and policies live in this process, not in the database */
    if (hub_api_segment_is(segs[0], "breakers") && n == 1) {
        route_breakers(hub, req);
        return;
    }
    if (hub_api_segment_is(segs[0], "policies")) {
        route_policies(hub, req, segs, n);
        return;
    }
    if (hub_api_segment_is(segs[0], "schemas")) {
        hub_api_schemas_admin(hub, req, segs, n); /* api_schemas.h */
        return;
    }
    send_not_found(req, "no such admin resource");
}
