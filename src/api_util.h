/*
 * api_util — what every JSON API route needs (SPEC §9): reading a JSON body
 * under a size cap, problem+json errors (RFC 9457), bearer tokens compared in
 * constant time, opaque pagination cursors, query-string parameters, and the
 * "request waiting on the database" object that survives a client hanging up.
 *
 * Everything here runs on the loop thread.  Functions that take an
 * h2o_req_t borrow it for the duration of the call; anything they allocate
 * "from the request" lives in req->pool and goes away with the request.
 *
 * Problem types are URNs of the form "urn:streaming-hub:problem:<slug>" with
 * slugs bad-request, validation, unauthorized, forbidden, not-found,
 * method-not-allowed, conflict, too-large, unsupported-media-type,
 * too-many-requests, internal, unavailable.
 */
#ifndef HUB_API_UTIL_H
#define HUB_API_UTIL_H

#include <h2o.h>
#include <jansson.h>
#include <stddef.h>

#include "error.h"
#include "pg.h"

struct api_turns;

struct hub;
struct hub_http;

/* Largest JSON request body of the API; bigger ones are 413. */
#define HUB_API_MAX_BODY (1024 * 1024)
/* ?limit= of list routes. */
#define HUB_API_LIMIT_DEFAULT 100
#define HUB_API_LIMIT_MAX 500
/* Longest tenant id (SPEC §5). */
#define HUB_API_TENANT_ID_MAX 256

/* How the API writes JSON: compact, and reals with 15 significant digits
 * (DBL_DIG) — every decimal a human typed with up to 15 digits comes back
 * exactly as typed ("0.1", not jansson's default "0.10000000000000001"). */
#define HUB_API_JSON_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(15))

/* ------------------------------------------------------------ responses -- */

/* Answers status with body serialised as compact JSON (application/json).
 * Borrows body. */
void hub_api_send_json(h2o_req_t *req, int status, const json_t *body);

/* Answers status with text, which must already be JSON.  The bytes are
 * copied into the request before this returns. */
void hub_api_send_json_text(h2o_req_t *req, int status, const char *text, size_t len);

/* Answers 204 No Content. */
void hub_api_send_no_content(h2o_req_t *req);

/*
 * Answers an application/problem+json error: type, title, status, detail and,
 * when errors is given, "errors": [{"field", "message"}, ...].  Takes errors
 * (may be NULL).  detail may be NULL (then the title is repeated).
 */
void hub_api_send_problem(h2o_req_t *req, int status, const char *detail, json_t *errors);

/* The problem object hub_api_send_problem sends (takes errors), for a
 * response that carries several (HTTP ingest's batch mode).  NULL on OOM. */
json_t *hub_api_problem(int status, const char *detail, json_t *errors);

/* 400 for validation failures: detail lists each {"field","message"} of
 * errors (taken).  errors must hold at least one entry. */
void hub_api_send_invalid(h2o_req_t *req, json_t *errors);

/* 500 "out of memory". */
void hub_api_send_oom(h2o_req_t *req);

/* 500 with detail, after logging why (an error line for the operator: the
 * hub, not the client, is at fault). */
void hub_api_send_internal(h2o_req_t *req, const char *why, const char *detail);

/* 401 with "WWW-Authenticate: Bearer". */
void hub_api_send_unauthorized(h2o_req_t *req, const char *detail);

/* 405 with "Allow: <allow>" (e.g. "GET, POST"). */
void hub_api_send_method_not_allowed(h2o_req_t *req, const char *allow);

/*
 * Answers a failed database transaction: 503 (with Retry-After) when the
 * connection was lost or the pool is closing, 500 when a statement failed.
 * Logs the request path, the SQLSTATE and PostgreSQL's primary message —
 * never a body, token or key.
 */
void hub_api_send_db_error(h2o_req_t *req, const struct hub_pg_outcome *out);

/* Appends {"field", "message"} to *errors, creating the array on first use.
 * Out of memory only loses the entry. */
void hub_api_errors_add(json_t **errors, const char *field, const char *message);

/* The end of a request's validation: answers 400 with errors (taken) when
 * there are any, else 500 when oom is set, and returns 1; returns 0 when
 * the request goes on. */
int hub_api_input_refused(h2o_req_t *req, json_t *errors, int oom);

/*
 * The row a single-object route asked for: returns out->results[index] when
 * the transaction succeeded and that statement returned a row, else answers
 * (hub_api_send_db_error, or 404 with `missing` as the detail) and returns
 * NULL.
 */
PGresult *hub_api_found(h2o_req_t *req, const struct hub_pg_outcome *out, int index,
                        const char *missing);

/*
 * Parses an object PostgreSQL rendered as JSON text (text[0..len),
 * borrowed).  Returns it (owned by the caller), or NULL after logging and
 * answering 500 when it does not parse.
 */
json_t *hub_api_pg_object(h2o_req_t *req, const char *text, size_t len);

/* Adds a response header (name in lower case); the value is copied. */
void hub_api_add_header(h2o_req_t *req, const char *name, const char *value);

/* ------------------------------------------------------------- requests -- */

/* 1 when the request method is `method` (exact, e.g. "GET"). */
int hub_api_method_is(const h2o_req_t *req, const char *method);

/* 1 for GET and HEAD: GET routes also answer HEAD (h2o leaves the body out). */
int hub_api_method_get(const h2o_req_t *req);

/*
 * Splits req->path after its first prefix_len bytes (the route's prefix,
 * e.g. "/v1") into at most max segments.  Returns the count, or HUB_EINVAL when
 * there are more or one is empty ("//"); a trailing "/" is allowed.  The
 * segments point into the path (borrowed).
 */
int hub_api_split_path(h2o_iovec_t path, size_t prefix_len, h2o_iovec_t *segs, int max);

/* 1 when path is `prefix` itself or lies under "prefix/". */
int hub_api_path_under(h2o_iovec_t path, const char *prefix);

/* 1 when path segment seg is exactly s. */
int hub_api_segment_is(h2o_iovec_t seg, const char *s);

/* 1 when s[0..len) is a positive decimal int64 without a leading zero and
 * with at most 18 digits ("1".."999999999999999999"): a job or record id. */
int hub_api_positive_id(const char *s, size_t len);

/* Finds request header `name` (lower case).  Returns 1 and points *value
 * into the request (borrowed, not NUL-terminated), or 0 when absent. */
int hub_api_header(const h2o_req_t *req, const char *name, h2o_iovec_t *value);

/*
 * Parses the request body as one JSON object (duplicate members refused).
 * Returns it (owned by the caller), or NULL after having answered 413 (over
 * max_bytes), or 400 (empty, malformed, or not an object).
 */
json_t *hub_api_read_json_object(h2o_req_t *req, size_t max_bytes);

/*
 * Adds one error per member of obj whose name is not in allowed (a
 * NULL-terminated list).  Returns the number of unknown members.
 */
int hub_api_reject_unknown_members(const json_t *obj, const char *const *allowed, json_t **errors);

/*
 * Finds query parameter `name` (percent-decoded, '+' is a space; the last
 * occurrence wins).  Returns 1 and a NUL-terminated value allocated from the
 * request pool, 0 when absent or empty ("?name=" or "?name": SPEC §9 writes
 * optional filters that way), HUB_EINVAL when its encoding is malformed or decodes
 * to a NUL byte.
 */
int hub_api_query_param(h2o_req_t *req, const char *name, const char **value);

/* 1 when s[0..len) is a valid tenant id: [a-zA-Z0-9._-]{1,256}, not "." or "..". */
int hub_api_tenant_id_valid(const char *s, size_t len);

/* 1 when s[0..len) is a canonical textual UUID (8-4-4-4-12 hex digits). */
int hub_api_uuid_valid(const char *s, size_t len);

/*
 * Copies of request text for a route's state: strndup/strdup that leave NULL
 * as NULL and set *oom when memory runs out, so that a route copies all it
 * needs and checks once.
 */
char *hub_api_strndup(const char *s, size_t len, int *oom);
char *hub_api_strdup(const char *s, int *oom);

/* -------------------------------------------------------------- paging -- */

/* A list request's ?limit= and ?cursor=. */
struct hub_api_page {
    int limit;         /* 1..HUB_API_LIMIT_MAX */
    const char *after; /* decoded cursor value (request pool), NULL for the first page */
};

/*
 * Reads ?limit= (default HUB_API_LIMIT_DEFAULT) and ?cursor= (must have been
 * made by hub_api_cursor_encode with the same kind).  Returns 0, or HUB_EINVAL after
 * adding a "limit" or "cursor" entry to *errors.
 */
int hub_api_page_parse(h2o_req_t *req, const char *kind, struct hub_api_page *page,
                       json_t **errors);

/*
 * Makes an opaque cursor: base64url of "<kind>:<value>", so that a cursor of
 * one list is refused by another.  Returns a malloc'd string (caller frees)
 * or NULL on OOM.
 */
char *hub_api_cursor_encode(const char *kind, const char *value);

/* Reverses hub_api_cursor_encode.  Returns the value (request pool) or NULL
 * when the cursor is malformed or of another kind. */
const char *hub_api_cursor_decode(h2o_req_t *req, const char *kind, const char *cursor);

/* Turns one listed object's JSON text (borrowed) into its API item; returns
 * it owned, or NULL when it is malformed or memory ran out. */
typedef json_t *(*hub_api_item_fn)(void *arg, const char *text, size_t len);

/*
 * Answers 200 with one page of a list, {"items": [...], "next_cursor"}.
 * r holds the rows of a list statement asked for limit + 1 rows: up to
 * limit become items (column obj_col through item(arg, ...), or parsed as
 * they are when item is NULL); one more row means there is a next page,
 * whose cursor (of `kind`) carries column key_col of the last item shown.
 * Answers 500 when an item is malformed or memory runs out.  Borrows r.
 */
void hub_api_send_page(h2o_req_t *req, PGresult *r, int limit, const char *kind, int key_col,
                       int obj_col, hub_api_item_fn item, void *arg);

/* --------------------------------------------------------------- auth -- */

/*
 * Extracts the token of "Authorization: Bearer <token>" (scheme is
 * case-insensitive).  Returns 1 and points *token into the request
 * (borrowed), or 0 when the header is absent or not a bearer token.
 */
int hub_api_bearer_token(const h2o_req_t *req, h2o_iovec_t *token);

/*
 * 1 when presented equals expected.  Both are hashed with SHA-256 first and
 * the digests compared with CRYPTO_memcmp, so neither the contents nor the
 * length of the secret leak through timing.  expected NULL or "" never
 * matches.
 */
int hub_api_token_equals(const char *expected, const char *presented, size_t presented_len);

/* ------------------------------------------------ requests on the database -- */

struct hub_api_call;
struct hub_api_idem;

/* Runs when the call's transaction completed AND the request is still there.
 * It may answer, or start another transaction on the same call. */
typedef void (*hub_api_call_cb)(struct hub_api_call *call, const struct hub_pg_outcome *out);

/*
 * A tenant's quotas (SPEC §5) are a JSON object; the hub reads two members
 * and keeps any other as given:
 *   "ingest_rate"   events per second over POST /v1/events, a number in
 *                   (0, HUB_QUOTA_MAX]; absent or null: no quota
 *   "ingest_burst"  events admitted at once, an integer in [1,
 *                   HUB_QUOTA_MAX]; default max(1, ingest_rate)
 * Adds an error naming the member ("quotas.ingest_rate") to *errors for
 * each that is malformed; quotas NULL or JSON null is no quota.
 */
#define HUB_QUOTA_MAX 1000000
void hub_api_quotas_check(const json_t *quotas, json_t **errors);

/*
 * Tenant authentication result.  status is 200 with tenant_id set (borrowed
 * for the callback), or 401 / 500 / 503 with tenant_id NULL; the callback
 * then answers (hub_api_send_unauthorized, or hub_api_send_problem).
 */
typedef void (*hub_api_auth_cb)(struct hub_api_call *call, const char *tenant_id, int status);

/*
 * The state of one request waiting on the database.  A route embeds it as
 * the FIRST member of its own state struct.  The request may disappear while
 * a transaction is in flight (client gone, server stopping): then `req`
 * becomes NULL, the route's callback is not called, and the state is freed
 * when the transaction completes.  Otherwise the state lives until h2o
 * disposes of the request.  Either way on_free (may be NULL) runs first and
 * must release what the route put in its state (not the state itself).
 */
struct hub_api_call {
    h2o_req_t *req;  /* NULL once the request is gone */
    struct hub *hub; /* borrowed */
    void (*on_free)(struct hub_api_call *call);
    hub_api_call_cb on_result;
    hub_api_auth_cb on_auth;
    int in_flight;   /* a transaction is pending */
    int in_callback; /* a callback is running: freeing waits for it */
    /* The tenant's ingest quota as authentication read it (SPEC §5,
     * hub_api_quotas_check): events per second and burst, 0 when none. */
    double ingest_rate;
    double ingest_burst;
    /* The key's SHA-256 and when its lookup started, for auth_cache.h. */
    unsigned char auth_hash[32];
    uint64_t auth_started_ns;
    /* The route's Idempotency-Key state once hub_api_idem_start found a
     * key (api_idem.h); borrowed from the route's own state, else NULL. */
    struct hub_api_idem *idem;
    /* The tenant authentication found ("" before, and for the operator's
     * calls): its transactions take turns with the tenant's other calls
     * (api_util.c, "A tenant's turns") */
    char tenant[HUB_API_TENANT_ID_MAX + 1];
    struct api_turns *turns;     /* the tenant's, while running or waiting */
    struct hub_pg_txn *turn_txn; /* waiting for a turn */
    struct hub_api_call *turn_next;
    int turn_held; /* in its callback, still holding the turn it ran in */
};

/*
 * Allocates a zeroed state of `size` bytes (>= sizeof(struct hub_api_call))
 * tied to req as described above.  Returns it, or NULL after answering 500
 * (out of memory).
 */
void *hub_api_call_new(struct hub *hub, h2o_req_t *req, size_t size,
                       void (*on_free)(struct hub_api_call *call));

/*
 * Starts a transaction on the API pool whose completion runs cb.  Returns
 * it, or NULL after answering 503 when the database is unavailable (no pool,
 * no live connection) or out of memory, or 429 when the call's tenant has
 * HUB_API_TENANT_WAITING_MAX transactions waiting for their turn.  Add
 * statements with hub_pg_txn_add, then hub_api_call_submit.
 *
 * A tenant's transactions run HUB_API_TENANT_RUNNING at a time per process,
 * the others waiting in its own queue: however long its statements take
 * (a replay, a scan, a lock), the pool keeps connections for every other
 * tenant (SPEC §11).
 */
#define HUB_API_TENANT_RUNNING 1
#define HUB_API_TENANT_WAITING_MAX 32
struct hub_pg_txn *hub_api_call_txn(struct hub_api_call *call, hub_api_call_cb cb);

/* Submits txn.  cb may run before this returns (pool closing, out of
 * memory), so the caller must not touch call afterwards. */
void hub_api_call_submit(struct hub_api_call *call, struct hub_pg_txn *txn);

/*
 * The common case of the two above: one statement with nparams text
 * parameters (copied) as a transaction of its own, whose outcome goes to
 * cb.  Answers 503 itself when no transaction can start.  The caller must
 * not touch call afterwards.
 */
void hub_api_call_query(struct hub_api_call *call, hub_api_call_cb cb, const struct hub_sql *sql,
                        int nparams, const char *const *values);

/*
 * For calls that wait on something other than the database (a policy
 * reload): hub_api_call_wait() marks the call as waiting, so it outlives its
 * request; hub_api_call_wake() ends the wait, runs cb(call, arg) only when
 * the request is still there, and frees the call when it is not.
 */
void hub_api_call_wait(struct hub_api_call *call);
void hub_api_call_wake(struct hub_api_call *call, void (*cb)(struct hub_api_call *call, void *arg),
                       void *arg);

/*
 * Authenticates the request's tenant API key ("Authorization: Bearer shk_…"):
 * SHA-256 of the key, looked up among unrevoked keys of active tenants, or
 * found in this process's cache of recent lookups (auth_cache.h: at most
 * STREAMING_HUB_AUTH_CACHE_TTL old, so a revocation anywhere is seen within it).
 * Runs cb once with the tenant id or an error status (see hub_api_auth_cb);
 * on success the tenant's ingest quota is in call->ingest_rate/_burst;
 * cb may run before this returns (malformed or missing key: no database
 * round trip).  cb is not run if the request goes away meanwhile.
 */
void hub_api_auth_tenant(struct hub_api_call *call, hub_api_auth_cb cb);

/* Empties this process's cache of key lookups: call it once a key, a
 * tenant's status or its quota changed (other processes see the change
 * within STREAMING_HUB_AUTH_CACHE_TTL). */
void hub_api_auth_forget(void);

/*
 * The prologue of a tenant route once its key was checked: answers a failed
 * authentication (401 for a bad key, the status with its reason otherwise),
 * then a route_status decided from the path before authentication (405 with
 * "Allow: allow", any other with `missing` as the detail).  Returns 1 when it
 * answered, 0 when the route goes on (status 200, route_status 0).
 */
int hub_api_route_answered(h2o_req_t *req, int status, int route_status, const char *allow,
                           const char *missing);

#endif
