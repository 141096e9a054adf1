/*
 * api_admin — /admin routes (see api_admin.h).
 *
 * Every route is the same small machine: validate the request completely in
 * memory, then one database transaction whose callback answers.  Writes
 * (tenant create/patch, key create/revoke) carry their audit row in the same
 * statement, so the change and its audit entry commit together.
 *
 * Admin POSTs honour Idempotency-Key: a first transaction looks the key up
 * (and purges a few expired records); when a response younger than 24h is
 * stored it is replayed as it was, otherwise the creation runs and stores its
 * response in the same statement.  Two requests racing with one key: the
 * loser's insert of the key collides (or finds the tenant taken), and it
 * looks the key up once more to replay the winner's response.
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

#include "api_idem.h"
#include "api_util.h"
#include "hub.h"
#include "log.h"
#include "policy.h"
#include "store_admin.h"
#include "util.h"

#define ADMIN_SCOPE "admin"
#define ADMIN_PREFIX "/admin"
#define ADMIN_MAX_SEGMENTS 4
#define API_KEY_RAW 32
#define API_KEY_TEXT 48 /* "shk_" + 43 + NUL */

#define ID_RULE "must be a string matching [a-zA-Z0-9._-]{1,256}"
#define STATUS_RULE "must be \"active\" or \"inactive\""

enum admin_op {
    OP_TENANT_CREATE,
    OP_TENANT_GET,
    OP_TENANT_LIST,
    OP_TENANT_PATCH,
    OP_KEY_CREATE,
    OP_KEY_REVOKE,
    OP_QUARANTINE_LIST,
    OP_QUARANTINE_GET,
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
    char api_key[API_KEY_TEXT];
    unsigned char key_hash[32];
};

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

static struct admin_call *admin_call_new(struct hub *hub, h2o_req_t *req, enum admin_op op) {
    struct admin_call *a = hub_api_call_new(hub, req, sizeof(*a), admin_call_free);
    if (a != NULL) {
        a->op = op;
    }
    return a;
}

static void send_not_found(h2o_req_t *req, const char *what) {
    hub_api_send_problem(req, 404, what, NULL);
}

/* Answers JSON text that PostgreSQL rendered, re-serialised compactly by
 * jansson so that every answer (and every replay) has one byte format.
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

static void tenant_list_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    send_page((struct admin_call *)call, out, "tenants");
}

static void quarantine_list_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    send_page((struct admin_call *)call, out, "quarantine");
}

/* Runs a list statement with params followed by the limit (+1). */
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

static void tenant_list(struct hub *hub, h2o_req_t *req) {
    struct hub_api_page page;
    json_t *errors = NULL;
    struct admin_call *a;
    int oom = 0;

    if (hub_api_page_parse(req, "tenants", &page, &errors) != 0) {
        hub_api_send_invalid(req, errors);
        return;
    }
    a = admin_call_new(hub, req, OP_TENANT_LIST);
    if (a == NULL) {
        return;
    }
    a->limit = page.limit;
    a->after = hub_api_strdup(page.after, &oom);
    if (oom) {
        hub_api_send_oom(req);
        return;
    }
    run_list(a, &hub_sql_admin_tenant_list, tenant_list_done, 1, (const char *[]){a->after});
}

static int quarantine_reason_valid(const char *s) {
    return strcmp(s, "invalid_envelope") == 0 || strcmp(s, "digest_conflict") == 0 ||
           strcmp(s, "too_large") == 0;
}

static void quarantine_list(struct hub *hub, h2o_req_t *req) {
    struct hub_api_page page;
    json_t *errors = NULL;
    const char *tenant = NULL, *reason = NULL;
    struct admin_call *a;
    int oom = 0;
    int r;

    hub_api_page_parse(req, "quarantine", &page, &errors);
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
                           "must be one of invalid_envelope, digest_conflict, too_large");
    }
    if (r != 1) {
        reason = NULL;
    }
    if (errors != NULL) {
        hub_api_send_invalid(req, errors);
        return;
    }
    a = admin_call_new(hub, req, OP_QUARANTINE_LIST);
    if (a == NULL) {
        return;
    }
    a->limit = page.limit;
    a->tenant_id = hub_api_strdup(tenant, &oom);
    a->reason = hub_api_strdup(reason, &oom);
    a->after = hub_api_strdup(page.after, &oom);
    if (oom) {
        hub_api_send_oom(req);
        return;
    }
    run_list(a, &hub_sql_admin_quarantine_list, quarantine_list_done, 3,
             (const char *[]){a->tenant_id, a->reason, a->after});
}

/* ------------------------------------------------------- single objects -- */

static void tenant_get_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    send_one_row((struct admin_call *)call, out, 0, "tenant not found");
}

static void quarantine_get_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    send_one_row((struct admin_call *)call, out, 0, "quarantined record not found");
}

/* One statement with one text parameter (an id from the path). */
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

static void tenant_patch_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    send_one_row((struct admin_call *)call, out, 0, "tenant not found");
}

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

static void key_revoke_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    h2o_req_t *req = call->req;

    if (hub_api_found(req, out, 0, "API key not found for this tenant") != NULL) {
        hub_api_send_no_content(req);
    }
}

static void key_revoke(struct hub *hub, h2o_req_t *req, h2o_iovec_t tenant, h2o_iovec_t key_id) {
    struct admin_call *a;
    int oom = 0;

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

    if (RAND_bytes(raw, sizeof(raw)) != 1) {
        goto out;
    }
    memcpy(a->api_key, "shk_", 4);
    hub_base64url(raw, sizeof(raw), a->api_key + 4);
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

static void key_create(struct hub *hub, h2o_req_t *req, h2o_iovec_t tenant) {
    static const char *const allowed[] = {NULL};
    json_t *errors = NULL;
    struct admin_call *a;
    h2o_iovec_t idem;
    int oom = 0;

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

/* -------------------------------------------------------------- routing -- */

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
 * breaker state is per process). */
static void route_breakers(struct hub *hub, h2o_req_t *req) {
    char *items;
    char *body;
    int len;

    if (!h2o_memis(req->method.base, req->method.len, H2O_STRLIT("GET")) &&
        !h2o_memis(req->method.base, req->method.len, H2O_STRLIT("HEAD"))) {
        hub_api_send_method_not_allowed(req, "GET, HEAD");
        return;
    }
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

/* GET /admin/policies: the current generation (SPEC §8). */
static void policies_list(struct hub *hub, h2o_req_t *req) {
    char *text = hub_policies_json(hub->policies);
    if (text == NULL) {
        hub_api_send_oom(req);
        return;
    }
    hub_api_send_json_text(req, 200, text, strlen(text));
    free(text);
}

struct reload_call {
    struct hub_api_call call; /* first */
    const char *json;
    double seconds;
};

static void reload_answer(struct hub_api_call *call, void *arg) {
    struct reload_call *rc = (struct reload_call *)call;
    json_error_t jerr;
    json_t *body = rc->json != NULL ? json_loads(rc->json, 0, &jerr) : NULL;

    (void)arg;
    if (rc->json == NULL) {
        hub_api_send_problem(call->req, 503, "the policy reload could not run; retry later", NULL);
        return;
    }
    if (body == NULL) {
        hub_api_send_problem(call->req, 500, "the policy reload could not be reported", NULL);
        return;
    }
    json_object_set_new(body, "reload_seconds", json_real(rc->seconds));
    hub_api_send_json(call->req, 200, body);
    json_decref(body);
}

static void reload_done(void *arg, const char *json, double seconds) {
    struct reload_call *rc = arg;
    rc->json = json;
    rc->seconds = seconds;
    hub_api_call_wake(&rc->call, reload_answer, NULL);
}

/* POST /admin/policies/reload: answers once a generation that started after
 * the request is in use, with that generation (errors included). */
static void policies_reload(struct hub *hub, h2o_req_t *req) {
    struct reload_call *rc = hub_api_call_new(hub, req, sizeof(*rc), NULL);
    if (rc == NULL) {
        return;
    }
    hub_api_call_wait(&rc->call);
    hub_policies_reload(hub->policies, reload_done, rc);
}

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
    send_not_found(req, "no such admin resource");
}

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
    if (hub_api_segment_is(segs[0], "breakers") && n == 1) {
        route_breakers(hub, req);
        return;
    }
    if (hub_api_segment_is(segs[0], "policies")) {
        route_policies(hub, req, segs, n);
        return;
    }
    send_not_found(req, "no such admin resource");
}
