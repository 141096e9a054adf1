/*
 * api_idem — Idempotency-Key on the API's state-changing POSTs (see
 * api_idem.h).
 *
 * The records live in one table, idempotency_keys (scope, key, status,
 * body), written only by the creating statements themselves so that a
 * response and its record commit together or not at all.  This file does
 * the rest: lookups, the request marker, and deciding between replay,
 * conflict and running the request.
 */
#include "api_idem.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_util.h"
#include "error.h"
#include "log.h"
#include "store_admin.h"
#include "util.h"

/* The lookup transaction: the purge, then the lookup (its result index). */
#define LOOKUP_RESULT 1

/* The primary key (scope, key) of idempotency_keys (migrations/0001). */
#define IDEM_KEY_CONSTRAINT "idempotency_keys_pkey"

/* Reads, never stores: the key is copied only once the request is valid
 * (hub_api_idem_start), so a refused request leaves nothing behind. */
int hub_api_idem_read_key(const h2o_req_t *req, h2o_iovec_t *key, json_t **errors) {
    if (!hub_api_header(req, "idempotency-key", key)) {
        key->base = NULL;
        key->len = 0;
        return 0;
    }
    if (key->len == 0 || key->len > HUB_API_IDEM_KEY_MAX) {
        goto bad;
    }
    /* visible ASCII, as a header value can carry it without quoting or
     * folding: a key reads the same in logs, audit and the database */
    for (size_t i = 0; i < key->len; i++) {
        if (key->base[i] < 0x21 || key->base[i] > 0x7e) {
            goto bad;
        }
    }
    return 0;
bad:
    hub_api_errors_add(errors, "Idempotency-Key", "must be 1 to 255 visible ASCII characters");
    return HUB_EINVAL;
}

/*
 * "<op>:<object>:<SHA-256 hex of the request body>", ":<object>" left out
 * when object is NULL.  The digest covers the body bytes as sent: a retry
 * sends the same bytes, a different request (another body, operation or
 * object) makes another marker.  Returns malloc'd text, or NULL.
 */
static char *request_marker(const h2o_req_t *req, const char *op, const char *object) {
    unsigned char digest[32];
    char hex[65];
    unsigned int dn = 0;
    size_t need = strlen(op) + 1 + (object != NULL ? strlen(object) + 1 : 0) + sizeof(hex);
    char *m;

    if (EVP_Digest(req->entity.base != NULL ? req->entity.base : "", req->entity.len, digest, &dn,
                   EVP_sha256(), NULL) != 1 ||
        (m = malloc(need)) == NULL) {
        return NULL;
    }
    hub_hex(digest, sizeof(digest), hex);
    if (object != NULL) {
        snprintf(m, need, "%s:%s:%s", op, object, hex);
    } else {
        snprintf(m, need, "%s:%s", op, hex);
    }
    return m;
}

/* "<scope>" or "<scope>:<id>", malloc'd; NULL on OOM. */
static char *scope_text(const char *scope, const char *id) {
    size_t need = strlen(scope) + 1 + (id != NULL ? strlen(id) + 1 : 0);
    char *s = malloc(need);

    if (s != NULL) {
        snprintf(s, need, id != NULL ? "%s:%s" : "%s", scope, id);
    }
    return s;
}

/*
 * 1 when the stored response (parsed; NULL when it does not parse) was
 * made by the request that idem describes.  One without a marker counts as
 * ops->unmarked_same; so does one that does not parse, which the route's
 * renderer then refuses (500).
 */
static int same_request(const struct hub_api_idem *idem, const json_t *stored) {
    const char *marker = json_string_value(json_object_get(stored, "_req"));

    if (marker == NULL) {
        return idem->ops->unmarked_same;
    }
    return strcmp(marker, idem->marker) == 0;
}

static void lookup(struct hub_api_call *call);

/* The lookup's outcome: replay, refuse, or run the request (api_idem.h). */
static void looked(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct hub_api_idem *idem = call->idem;
    PGresult *r = out->results[LOOKUP_RESULT];

    if (out->status != HUB_PG_OK || r == NULL) {
        hub_api_send_db_error(call->req, out);
        return;
    }
    if (PQntuples(r) == 1) {
        const char *body = PQgetvalue(r, 0, HUB_IDEM_LOOKUP_BODY);
        size_t len = (size_t)PQgetlength(r, 0, HUB_IDEM_LOOKUP_BODY);
        json_t *stored = json_loadb(body, len, 0, NULL);
        int same = same_request(idem, stored), parsed = stored != NULL;

        json_decref(stored);
        if (!same && !parsed) {
            /* markers required and unreadable: the server's fault, not a
             * conflict with the client's earlier request */
            hub_api_send_problem(call->req, 500, "malformed stored response", NULL);
            return;
        }
        if (!same) {
            hub_api_send_problem(call->req, 409,
                                 "this Idempotency-Key was already used for a different request",
                                 NULL);
            return;
        }
        idem->ops->replay(call, atoi(PQgetvalue(r, 0, HUB_IDEM_LOOKUP_STATUS)), body, len);
        return;
    }
    if (idem->relooked) {
        /* the winner of a race rolled back, or is still running */
        if (idem->ops->unfinished != NULL) {
            idem->ops->unfinished(call);
        } else {
            hub_api_send_problem(call->req, 409,
                                 "a concurrent request with this Idempotency-Key did not complete",
                                 NULL);
        }
        return;
    }
    idem->ops->proceed(call);
}

/* One transaction: purge a few expired records (so the table stays small
 * without a timer), then look the key up. */
static void lookup(struct hub_api_call *call) {
    struct hub_api_idem *idem = call->idem;
    struct hub_pg_txn *txn = hub_api_call_txn(call, looked);

    if (txn == NULL) {
        return;
    }
    hub_pg_txn_add(txn, &hub_sql_idem_purge, 0, NULL, NULL, NULL);
    hub_pg_txn_add(txn, &hub_sql_idem_lookup, 2, (const char *[]){idem->scope, idem->key}, NULL,
                   NULL);
    hub_api_call_submit(call, txn);
}

/* The marker is made now, from the body as received: a retry sends the
 * same bytes, and the creating statement stores this marker with the
 * response.  call->idem is set only with a key, so every other helper
 * here is a no-op for a request without one. */
void hub_api_idem_start(struct hub_api_call *call, struct hub_api_idem *idem, h2o_iovec_t key,
                        const char *scope, const char *scope_id, const char *op, const char *object,
                        const struct hub_api_idem_ops *ops) {
    int oom = 0;

    idem->ops = ops;
    if (key.base == NULL) {
        ops->proceed(call);
        return;
    }
    idem->key = hub_api_strndup(key.base, key.len, &oom);
    idem->scope = scope_text(scope, scope_id);
    idem->marker = request_marker(call->req, op, object);
    if (oom || idem->scope == NULL || idem->marker == NULL) {
        hub_api_send_oom(call->req);
        return;
    }
    call->idem = idem;
    lookup(call);
}

struct hub_pg_txn *hub_api_idem_txn(struct hub_api_call *call, hub_api_call_cb cb) {
    const struct hub_api_idem *idem = call->idem;
    struct hub_pg_txn *txn = hub_api_call_txn(call, cb);

    /* an expired record of this key would make the creation's insert of a
     * new one collide: the key may be used again after 24h */
    if (txn != NULL && idem != NULL && idem->key != NULL) {
        hub_pg_txn_add(txn, &hub_sql_idem_forget_stale, 2, (const char *[]){idem->scope, idem->key},
                       NULL, NULL);
    }
    return txn;
}

/* Mirrors hub_api_idem_txn: one statement before the creating one, or
 * none. */
int hub_api_idem_first(const struct hub_api_call *call) {
    return call->idem != NULL && call->idem->key != NULL ? 1 : 0;
}

/* Also for a creation that found its object taken without a collision
 * (the admin API's tenant id, ON CONFLICT DO NOTHING). */
int hub_api_idem_relook(struct hub_api_call *call) {
    struct hub_api_idem *idem = call->idem;

    /* once only: a second miss is answered by ops->unfinished, never looped */
    if (idem == NULL || idem->key == NULL || idem->relooked) {
        return 0;
    }
    idem->relooked = 1;
    lookup(call);
    return 1;
}

/* 23505 is unique_violation.  Only one on the record's own key (the
 * primary key of idempotency_keys) is a race on the Idempotency-Key: the
 * second lookup then tells, replaying what it finds or answering
 * ops->unfinished.  Any other unique violation is the request's own
 * failure, and the caller answers it like any statement error, as it does
 * without a key. */
int hub_api_idem_collided(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    return out->status == HUB_PG_ESTMT && strcmp(out->sqlstate, "23505") == 0 &&
           out->constraint != NULL && strcmp(out->constraint, IDEM_KEY_CONSTRAINT) == 0 &&
           hub_api_idem_relook(call);
}

/* The header name lower case (HTTP/2); clients read it case-insensitively. */
void hub_api_idem_mark_replayed(h2o_req_t *req) {
    hub_api_add_header(req, "idempotent-replayed", "true");
}

/* One rendering for the first answer and its replays: parsed, "_req"
 * dropped, dumped by the same code, so the bytes are the same. */
void hub_api_idem_send_stored(h2o_req_t *req, int status, const char *text, size_t len,
                              int replayed) {
    json_t *obj = json_loadb(text, len, 0, NULL);

    if (!json_is_object(obj)) {
        json_decref(obj);
        hub_api_send_problem(req, 500, "malformed stored response", NULL);
        return;
    }
    json_object_del(obj, "_req");
    if (replayed) {
        hub_api_idem_mark_replayed(req);
    }
    hub_api_send_json(req, status, obj);
    json_decref(obj);
}

/* The record of hub_api_idem_store_send was written (or not): the
 * answer, rendered from the stored text as a replay would be. */
static void stored(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct hub_api_idem *idem = call->idem;

    if (out->status != HUB_PG_OK) {
        if (hub_api_idem_collided(call, out)) {
            return; /* the winner's answer is replayed */
        }
        hub_log(HUB_WARN, "an Idempotency-Key record could not be stored; a retry will run again",
                HUB_LS("error", out->error));
    }
    hub_api_idem_send_stored(call->req, idem->status, idem->body, strlen(idem->body), 0);
}

void hub_api_idem_store_send(struct hub_api_call *call, int status, json_t *body) {
    struct hub_api_idem *idem = call->idem;
    struct hub_pg_txn *txn;
    char code[16];

    /* without a key there is nothing to store: answer as any route does */
    if (idem == NULL || idem->key == NULL) {
        hub_api_send_json(call->req, status, body);
        return;
    }
    /* the marker goes into the stored body; the answer is made from that
     * text, so that it and its replays are the same bytes */
    if (json_object_set_new(body, "_req", json_string(idem->marker)) != 0 ||
        (idem->body = json_dumps(body, JSON_COMPACT)) == NULL) {
        hub_api_send_oom(call->req);
        return;
    }
    json_object_del(body, "_req");
    idem->status = status;
    snprintf(code, sizeof(code), "%d", status);
    /* like a creation's transaction (hub_api_idem_txn): an expired record
     * of the key goes first, or the insert would collide with it */
    txn = hub_api_call_txn(call, stored);
    if (txn == NULL) {
        return;
    }
    hub_pg_txn_add(txn, &hub_sql_idem_forget_stale, 2, (const char *[]){idem->scope, idem->key},
                   NULL, NULL);
    hub_pg_txn_add(txn, &hub_sql_idem_store, 4,
                   (const char *[]){idem->scope, idem->key, code, idem->body}, NULL, NULL);
    hub_api_call_submit(call, txn);
}

/* From the route's on_free; the route's state, not idem, is freed there. */
void hub_api_idem_free(struct hub_api_idem *idem) {
    free(idem->key);
    free(idem->scope);
    free(idem->marker);
    free(idem->body);
    idem->key = idem->scope = idem->marker = idem->body = NULL;
}
