/*
 * api_idem — Idempotency-Key on the API's state-changing POSTs (SPEC §9),
 * one helper for the admin API (tenant and key creation, policy reload) and
 * the tenant API (subscription creation, secret rotation, verify, replay,
 * redeliver).  POST /v1/events is the exception: each event's own key
 * already makes it idempotent.
 *
 * A request with a key goes through these steps, on the loop thread:
 *
 *   1. hub_api_idem_start() makes the record's scope and the request's
 *      marker, then looks the key up (purging a few expired records);
 *   2. a record younger than 24h made by the same request (its "_req"
 *      marker) is answered again by ops->replay; one made by a different
 *      request is 409; with none, ops->proceed runs the request;
 *   3. the request's transaction starts with hub_api_idem_forget_stale()
 *      (an expired record of the key would make the insert collide) and its
 *      creating statement stores the response with the record, so both
 *      commit together (store_admin.c, store_subs.c);
 *   4. two requests racing with one key: the loser's insert collides
 *      (hub_api_idem_collided()), it looks the key up once more and replays
 *      the winner's response; when nothing is stored even then,
 *      ops->unfinished answers.
 *
 * Without a key, hub_api_idem_start() runs ops->proceed at once.  A route
 * embeds struct hub_api_idem in its call state and releases it with
 * hub_api_idem_free() from its on_free.
 */
#ifndef HUB_API_IDEM_H
#define HUB_API_IDEM_H

#include <h2o.h>
#include <jansson.h>
#include <stddef.h>

#include "api_util.h"
#include "pg.h"

/* Longest Idempotency-Key header value. */
#define HUB_API_IDEM_KEY_MAX 255

/* What a route does at each outcome of a lookup.  Every function gets the
 * call whose hub_api_idem_start() started the lookup (request present). */
struct hub_api_idem_ops {
    /* No response is stored under the key: run the request. */
    void (*proceed)(struct hub_api_call *call);
    /* A response of this very request is stored: answer it again.  body
     * (the stored JSON text, may still be malformed) is borrowed for the
     * call; the route adds hub_api_idem_mark_replayed() when it answers. */
    void (*replay)(struct hub_api_call *call, int status, const char *body, size_t len);
    /* Looked up again after a collision and still nothing is stored.  NULL
     * answers 409 "a concurrent request with this Idempotency-Key did not
     * complete". */
    void (*unfinished)(struct hub_api_call *call);
    /* 1: a stored response without a "_req" marker counts as this request's
     * (the admin API stored some before it kept markers); 0: it is refused
     * like another request's. */
    int unmarked_same;
};

/* The Idempotency-Key state of one request.  Strings are owned. */
struct hub_api_idem {
    char *key;    /* the Idempotency-Key, NULL when the request has none */
    char *scope;  /* whose keys: "admin", "tenant:<id>" */
    char *marker; /* the request that makes the record (see hub_api_idem_start) */
    int relooked; /* looked up a second time after a collision */
    int status;   /* hub_api_idem_store_send: the answer being stored ... */
    char *body;   /* ... and its text (with "_req") */
    const struct hub_api_idem_ops *ops;
};

/*
 * Reads the Idempotency-Key header: 1..HUB_API_IDEM_KEY_MAX visible ASCII
 * characters.  Returns 0 (key->base NULL when absent; otherwise pointing
 * into the request, borrowed), or HUB_EINVAL after adding an
 * "Idempotency-Key" entry to *errors.
 */
int hub_api_idem_read_key(const h2o_req_t *req, h2o_iovec_t *key, json_t **errors);

/*
 * Runs a creation under key (from hub_api_idem_read_key; base NULL: none).
 * With a key, fills idem: the key, the scope "<scope>" or
 * "<scope>:<scope_id>", and the marker "<op>:<object>:<SHA-256 hex of the
 * body>" (":<object>" left out when object is NULL), so that a key reused
 * for another request is told apart from a retry of the same one; sets
 * call->idem and starts the lookup.  Without one, runs ops->proceed(call).
 * Answers 500 itself when memory runs out.  ops must outlive the call
 * (a static table).
 */
void hub_api_idem_start(struct hub_api_call *call, struct hub_api_idem *idem, h2o_iovec_t key,
                        const char *scope, const char *scope_id, const char *op, const char *object,
                        const struct hub_api_idem_ops *ops);

/*
 * Opens the transaction of a creation (hub_api_call_txn, outcome to cb)
 * and, when the request has a key, adds its first statement: forgetting a
 * stale record of the key.  Add the creating statement, then submit.
 * Returns NULL after answering, like hub_api_call_txn.
 */
struct hub_pg_txn *hub_api_idem_txn(struct hub_api_call *call, hub_api_call_cb cb);

/* The index of the creating statement's result in the outcome of
 * hub_api_idem_txn's transaction: 1 after the stale record's, else 0. */
int hub_api_idem_first(const struct hub_api_call *call);

/* Starts the second lookup of a request whose creation found the key taken
 * (or its object created meanwhile), once: returns 1 when it did (the
 * lookup's outcome answers), 0 without a key or after a second lookup. */
int hub_api_idem_relook(struct hub_api_call *call);

/* 1 after starting the second lookup when out failed on a unique
 * violation of the record's key (23505 on idempotency_keys_pkey: a
 * concurrent request stored this key first, and our whole transaction
 * rolled back), else 0 and the caller answers out (another constraint's
 * 23505 is the request's own failure). */
int hub_api_idem_collided(struct hub_api_call *call, const struct hub_pg_outcome *out);

/* Adds "Idempotent-Replayed: true" to a replayed answer. */
void hub_api_idem_mark_replayed(h2o_req_t *req);

/*
 * Answers status with a JSON object whose text[0..len) (borrowed) is a
 * record's body as the creating statement stored it, or the same object
 * without the record's members: "_req" is removed, and with replayed the
 * answer says it is a replay.  A route whose first answer and replay both
 * go through here answers them byte for byte alike.  500 when the text is
 * not a JSON object.
 */
void hub_api_idem_send_stored(h2o_req_t *req, int status, const char *text, size_t len,
                              int replayed);

/*
 * For a request whose change is not a database write (a policy reload):
 * answers status with body (borrowed), after storing it under the request's
 * key when it has one (hub_sql_idem_store), so that a retry gets it again.
 * Two requests racing with one key: the loser answers the winner's stored
 * answer.  Storing that fails otherwise is logged and the answer still
 * goes out (the change was made; a retry makes it again).
 */
void hub_api_idem_store_send(struct hub_api_call *call, int status, json_t *body);

/* Releases idem's strings; idem is left empty.  Safe on an empty one. */
void hub_api_idem_free(struct hub_api_idem *idem);

#endif
