/*
 * api_events_pull — the pull API (SPEC §9): GET /v1/events?after=&limit=&type=
 * and GET /v1/events/{seq} (see api_events.h).
 *
 * A list request goes: authentication, validation (400 naming the field),
 * the tenant's pull bucket (429), the pull horizon (pull_horizon.h: the
 * highest sequence no uncommitted event lies below), then one statement
 * (store_events.h) bounded by the horizon, `limit` and the page byte cap.
 * One event by sequence skips the horizon: a committed event is final.
 *
 * The answer is built in one buffer: each row's attributes become a small
 * JSON text (the stored object plus "hubsequence" and "event_type"), the
 * payload is copied once, straight from the result into its place (or
 * base64-encoded there), and the buffer goes to h2o as it is.  So a page
 * costs its result plus one copy of its bytes while it is sent, and the
 * byte cap bounds both.
 */
#include <jansson.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_events.h"
#include "api_events_int.h"
#include "api_util.h"
#include "envelope.h"
#include "hub.h"
#include "log.h"
#include "pull_horizon.h"
#include "store_events.h"
#include "util.h"

#define V1_PREFIX "/v1"
#define MAX_SEGMENTS 3
/* The member that carries the hub's arrival sequence in each item: an
 * extension-legal name (lower-case letters), so items stay valid
 * CloudEvents; a producer's own "sequence" extension is kept as sent. */
#define HUB_SEQUENCE_MEMBER "hubsequence"
/* Longest ?type= (an event type or a pattern). */
#define TYPE_MAX 256

enum pull_op {
    PULL_LIST,
    PULL_ONE,
};

/* One pull request (api_util.h's call machinery). */
struct pull_call {
    struct hub_api_call call; /* first: see api_util.h */
    enum pull_op op;
    int route_status;  /* 0, or 400 / 404 / 405 to answer once authenticated */
    const char *allow; /* for 405 */
    int64_t seq;       /* PULL_ONE */
    int64_t after;     /* PULL_LIST */
    int limit;         /* PULL_LIST */
    const char *type;  /* PULL_LIST, request pool; NULL: every type */
    char *tenant;      /* the key's tenant */
    int64_t horizon;   /* PULL_LIST, once taken */
};

static void pull_call_free(struct hub_api_call *call) {
    free(((struct pull_call *)call)->tenant);
}

/* ----------------------------------------------------------- bad input -- */

/*
 * Parses a sequence: 1 to 19 decimal digits (no sign, no spaces, nothing
 * after them) whose value fits an int64.  Returns 0 with *out set, or
 * HUB_EINVAL for anything else: garbage, overflow, trailing bytes.
 */
static int parse_seq(const char *s, size_t n, int64_t *out) {
    uint64_t v = 0;

    if (n == 0 || n > 19) {
        return HUB_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned d = (unsigned char)s[i] - '0';
        if (d > 9 || v > ((uint64_t)INT64_MAX - d) / 10) {
            return HUB_EINVAL;
        }
        v = v * 10 + d;
    }
    *out = (int64_t)v;
    return 0;
}

/* Counts a refused request and logs it, at most one line a minute (a
 * client looping on a bad request must not flood the log). */
static void count_invalid(struct pull_call *c, const char *field) {
    struct hub_metrics *m = &c->call.hub->metrics;
    uint64_t now = hub_now_ns();
    uint64_t *last = &m->api_invalid_logged_ns[HUB_API_INVALID_PULL];

    m->api_invalid[HUB_API_INVALID_PULL]++;
    if (*last == 0 || now - *last > 60ULL * 1000000000ULL) {
        *last = now;
        hub_log(HUB_INFO, "pull request refused (bad input; logged once a minute)",
                HUB_LS("tenant", c->tenant ? c->tenant : ""), HUB_LS("field", field));
    }
}

/* 400 naming `field` (counted). */
static void send_invalid(struct pull_call *c, const char *field, const char *message) {
    json_t *errors = NULL;

    count_invalid(c, field);
    hub_api_errors_add(&errors, field, message);
    hub_api_send_invalid(c->call.req, errors);
}

/* ------------------------------------------------------------ rendering -- */

/* A big-endian int8 as PostgreSQL's binary format sends it. */
static int64_t be64(const char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) {
        v = (v << 8) | (unsigned char)p[i];
    }
    return (int64_t)v;
}

/* One row as it will be written: its attributes' text and its data. */
struct item {
    char *attrs; /* malloc'd JSON object text, with the hub's members */
    size_t attrs_len;
    const char *data; /* the payload, in the result */
    size_t data_len;
    int json_data; /* spliced as "data"; else "data_base64" when not empty */
};

/*
 * Prepares row `row` of r: the stored attributes (always an object)
 * with "hubsequence" and "event_type" set; a producer attribute of either
 * name is replaced (hubsequence is reserved to the hub).  Returns 0, or -1
 * (out of memory, or a damaged row: 500 either way).
 */
static int item_prepare(PGresult *r, int row, struct item *it) {
    const char *ct = PQgetvalue(r, row, HUB_EVENTS_COL_CONTENT_TYPE);
    json_t *o = json_loadb(PQgetvalue(r, row, HUB_EVENTS_COL_HEADERS),
                           (size_t)PQgetlength(r, row, HUB_EVENTS_COL_HEADERS), 0, NULL);

    memset(it, 0, sizeof(*it));
    it->data = PQgetvalue(r, row, HUB_EVENTS_COL_PAYLOAD);
    it->data_len = (size_t)PQgetlength(r, row, HUB_EVENTS_COL_PAYLOAD);
    it->json_data =
        it->data_len > 0 &&
        hub_media_type_is_json(ct, (size_t)PQgetlength(r, row, HUB_EVENTS_COL_CONTENT_TYPE));
    if (!json_is_object(o)) {
        json_decref(o);
        return -1;
    }
    json_object_set_new(o, HUB_SEQUENCE_MEMBER,
                        json_integer(be64(PQgetvalue(r, row, HUB_EVENTS_COL_SEQ))));
    json_object_set_new(o, "event_type",
                        json_stringn(PQgetvalue(r, row, HUB_EVENTS_COL_EVENT_TYPE),
                                     (size_t)PQgetlength(r, row, HUB_EVENTS_COL_EVENT_TYPE)));
    it->attrs = json_dumps(o, HUB_API_JSON_FLAGS);
    json_decref(o);
    if (it->attrs == NULL) {
        return -1;
    }
    it->attrs_len = strlen(it->attrs);
    return 0;
}

/* The bytes item_write writes. */
static size_t item_size(const struct item *it) {
    if (it->json_data) {
        return it->attrs_len + sizeof(",\"data\":") - 1 + it->data_len;
    }
    if (it->data_len > 0) {
        return it->attrs_len + sizeof(",\"data_base64\":\"\"") - 1 + 4 * ((it->data_len + 2) / 3);
    }
    return it->attrs_len;
}

/* Writes the item at p (item_size(it) bytes, plus one for base64's NUL,
 * which the next write covers); returns the end.  "...}" becomes
 * "...,"data":<payload>}": a JSON payload exactly as stored. */
static char *item_write(const struct item *it, char *p) {
    if (!it->json_data && it->data_len == 0) {
        memcpy(p, it->attrs, it->attrs_len);
        return p + it->attrs_len;
    }
    memcpy(p, it->attrs, it->attrs_len - 1);
    p += it->attrs_len - 1;
    if (it->json_data) {
        p = (char *)memcpy(p, ",\"data\":", 8) + 8;
        p = (char *)memcpy(p, it->data, it->data_len) + it->data_len;
    } else {
        p = (char *)memcpy(p, ",\"data_base64\":\"", 16) + 16;
        p +=
            EVP_EncodeBlock((unsigned char *)p, (const unsigned char *)it->data, (int)it->data_len);
        *p++ = '"';
    }
    *p++ = '}';
    return p;
}

/*
 * Bytes of pages a tenant's requests hold until their clients have read
 * them: a page is freed once sent, and a client that stops reading (a
 * connection never read) keeps it, up to
 * PULL_PAGE_BYTES (8 MiB) each, at the pull rate: gigabytes in seconds.
 * Past PULL_HELD_PAGES pages' worth (256 MiB by default; a consumer's
 * parallel pulls stay far below) a tenant's pulls are answered 429.
 * One entry per tenant with pages out; few at once, so a list.
 */
#define PULL_HELD_PAGES 32

struct pull_held {
    struct pull_held *next;
    size_t bytes;
    int pages;
    char tenant[];
};

static struct pull_held *held_find(struct hub *hub, const char *tenant) {
    struct pull_held *h = hub->pull_held;
    while (h != NULL && strcmp(h->tenant, tenant) != 0) {
        h = h->next;
    }
    return h;
}

/* 1 when the tenant's pages out are at their bound. */
static int held_full(struct hub *hub, const char *tenant) {
    const struct pull_held *h = held_find(hub, tenant);
    return h != NULL && h->bytes >= PULL_HELD_PAGES * (size_t)hub->cfg.pull_page_bytes;
}

/* Answers 429 when the tenant's pages not yet read are at their bound:
 * checked at admission, and again once the page's rows are in (a burst of
 * pulls admitted at once would otherwise all build their pages).  Returns 1
 * when it answered. */
static int held_refused(struct hub_api_call *call) {
    if (!held_full(call->hub, ((struct pull_call *)call)->tenant)) {
        return 0;
    }
    hub_events_send_over_rate(call->req, 1,
                              "this tenant's pages not yet read by their clients are at their "
                              "bound; read them, then retry");
    return 1;
}

/* The page's buffer, freed with the request's pool, and what it counts
 * against its tenant. */
struct page_ref {
    char *body;
    struct hub *hub;
    struct pull_held *held; /* NULL: not counted (out of memory) */
    size_t len;
};

static void page_ref_dispose(void *p) {
    struct page_ref *ref = p;
    struct pull_held *h = ref->held;

    free(ref->body);
    if (h != NULL) {
        h->bytes -= ref->len;
        if (--h->pages == 0) {
            struct pull_held **pp = &ref->hub->pull_held;
            while (*pp != h) {
                pp = &(*pp)->next;
            }
            *pp = h->next;
            free(h);
        }
    }
}

/* Counts len bytes against tenant until the page is sent; NULL out of
 * memory (not counted). */
static struct pull_held *held_add(struct hub *hub, const char *tenant, size_t len) {
    struct pull_held *h = held_find(hub, tenant);

    if (h == NULL) {
        size_t n = strlen(tenant);
        if ((h = calloc(1, sizeof(*h) + n + 1)) == NULL) {
            return NULL;
        }
        memcpy(h->tenant, tenant, n + 1);
        h->next = hub->pull_held;
        hub->pull_held = h;
    }
    h->bytes += len;
    h->pages++;
    return h;
}

/* Answers 200 with body (malloc'd; taken: freed with the request), as
 * application/json, without copying it, counted against tenant until it
 * is sent.  HEAD gets the headers only. */
static void send_owned(struct hub *hub, const char *tenant, h2o_req_t *req, char *body,
                       size_t len) {
    static h2o_generator_t generator = {NULL, NULL};
    struct page_ref *ref = h2o_mem_alloc_shared(&req->pool, sizeof(*ref), page_ref_dispose);
    h2o_iovec_t buf = h2o_iovec_init(body, len);

    ref->body = body;
    ref->hub = hub;
    ref->len = len;
    ref->held = held_add(hub, tenant, len);
    req->res.status = 200;
    req->res.reason = "OK";
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL,
                   H2O_STRLIT("application/json"));
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL,
                   H2O_STRLIT("no-store"));
    req->res.content_length = len;
    h2o_start_response(req, &generator);
    if (hub_api_method_is(req, "HEAD")) {
        h2o_send(req, NULL, 0, H2O_SEND_STATE_FINAL);
    } else {
        h2o_send(req, &buf, 1, H2O_SEND_STATE_FINAL);
    }
}

/*
 * Renders rows [0, n) of r into one malloc'd buffer: the items joined by
 * commas between `head` and `tail`.  Returns it (length in *len), or NULL
 * (out of memory, a damaged row).
 */
static char *render(PGresult *r, int n, const char *head, const char *tail, size_t *len) {
    struct item *items = calloc((size_t)n + 1, sizeof(*items));
    size_t size = strlen(head) + strlen(tail) + 1;
    char *body = NULL;
    int ok = items != NULL;

    for (int i = 0; ok && i < n; i++) {
        ok = item_prepare(r, i, &items[i]) == 0;
        size += ok ? item_size(&items[i]) + 1 : 0;
    }
    if (ok && (body = malloc(size)) != NULL) {
        char *p = stpcpy(body, head);
        for (int i = 0; i < n; i++) {
            if (i > 0) {
                *p++ = ',';
            }
            p = item_write(&items[i], p);
        }
        p = stpcpy(p, tail);
        *len = (size_t)(p - body);
    }
    for (int i = 0; items != NULL && i < n; i++) {
        free(items[i].attrs);
    }
    free(items);
    return body;
}

/* ------------------------------------------------------------ answering -- */

/* GET /v1/events/{seq}: the event, or 404 (absent, or another tenant's). */
static void pull_one_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    PGresult *r = hub_api_found(call->req, out, 0, "event not found");
    char *body;
    size_t len = 0;

    if (r == NULL || held_refused(call)) {
        return;
    }
    body = render(r, 1, "", "", &len);
    if (body == NULL) {
        hub_api_send_oom(call->req);
        return;
    }
    send_owned(call->hub, ((struct pull_call *)call)->tenant, call->req, body, len);
}

/*
 * GET /v1/events: {"items": [...], "next_cursor"}.  A page that may have
 * more after it has a next cursor, its last sequence: a full page (the
 * statement does not fetch a row more to find out, so the last page may
 * come back empty), or one the byte cap ended.  A page that stops below
 * the horizon or at the newest event has none; a consumer following the
 * stream goes on from its last item's hubsequence.
 */
static void pull_list_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct pull_call *c = (struct pull_call *)call;
    PGresult *r = out->results[0];
    int rows = r != NULL ? PQntuples(r) : 0;
    int64_t scanned;
    char tail[64];
    char *body;
    size_t len = 0;

    if (out->status != HUB_PG_OK) {
        hub_api_send_db_error(call->req, out);
        return;
    }
    scanned = rows > 0 ? be64(PQgetvalue(r, 0, HUB_EVENTS_COL_SCANNED)) : 0;
    if (rows > 0 && rows < scanned) {
        call->hub->metrics.pull_pages_byte_capped++;
    }
    if (rows > 0 && (scanned == c->limit || rows < scanned)) {
        snprintf(tail, sizeof(tail), "],\"next_cursor\":\"%lld\"}",
                 (long long)be64(PQgetvalue(r, rows - 1, HUB_EVENTS_COL_SEQ)));
    } else {
        snprintf(tail, sizeof(tail), "],\"next_cursor\":null}");
    }
    if (held_refused(call)) {
        return;
    }
    body = render(r, rows, "{\"items\":[", tail, &len);
    if (body == NULL) {
        hub_api_send_oom(call->req);
        return;
    }
    send_owned(call->hub, c->tenant, call->req, body, len);
}

/* The horizon is known (the call was woken): the page's statement. */
static void pull_list_query(struct hub_api_call *call, void *arg) {
    struct pull_call *c = (struct pull_call *)call;
    char after[24], limit[16], horizon[24], cap[24];
    const char *params[HUB_SQL_EVENTS_LIST_NPARAMS] = {c->tenant, after,   limit,
                                                       c->type,   horizon, cap};
    struct hub_pg_txn *txn;

    (void)arg;
    if (c->horizon < 0) {
        hub_api_send_problem(call->req, 503, "the server is shutting down", NULL);
        return;
    }
    snprintf(after, sizeof(after), "%lld", (long long)c->after);
    snprintf(limit, sizeof(limit), "%d", c->limit);
    snprintf(horizon, sizeof(horizon), "%lld", (long long)c->horizon);
    snprintf(cap, sizeof(cap), "%lld", (long long)call->hub->cfg.pull_page_bytes);
    txn = hub_api_call_txn(call, pull_list_done);
    if (txn == NULL) {
        return;
    }
    /* binary results: payloads come back as their bytes (store_events.h) */
    hub_pg_txn_add_binary(txn, &hub_sql_events_list, HUB_SQL_EVENTS_LIST_NPARAMS, params, NULL,
                          NULL);
    hub_api_call_submit(call, txn);
}

/* pull_horizon.h's callback: wakes the call (freed if its request is gone). */
static void pull_horizon_cb(void *arg, int64_t horizon) {
    struct pull_call *c = arg;

    c->horizon = horizon;
    hub_api_call_wake(&c->call, pull_list_query, NULL);
}

/* GET /v1/events: ?after=, ?limit=, ?type= (absent or empty: the
 * defaults).  Returns 0, or answers 400 and returns HUB_EINVAL. */
static int list_params(struct pull_call *c) {
    h2o_req_t *req = c->call.req;
    json_t *errors = NULL;
    const char *after = NULL, *limit = NULL, *type = NULL;
    int64_t n = HUB_API_LIMIT_DEFAULT;
    const char *bad = NULL;

    /* the pull API's cursor is the plain seq (SPEC §9: ?after=<seq>), not
     * an opaque api_util cursor: a consumer keeps its position as a number */
    if (hub_api_query_param(req, "after", &after) < 0 ||
        (after != NULL && parse_seq(after, strlen(after), &c->after) != 0)) {
        hub_api_errors_add(&errors, "after", "after must be a sequence (0 or more)");
        bad = "after";
    }
    if (hub_api_query_param(req, "limit", &limit) < 0 ||
        (limit != NULL &&
         (parse_seq(limit, strlen(limit), &n) != 0 || n < 1 || n > HUB_API_LIMIT_MAX))) {
        hub_api_errors_add(&errors, "limit", "limit must be an integer from 1 to 500");
        bad = bad ? bad : "limit";
    }
    if (hub_api_query_param(req, "type", &type) < 0 || (type != NULL && strlen(type) > TYPE_MAX)) {
        hub_api_errors_add(&errors, "type",
                           "type must be an event type or a pattern "
                           "(resource.*, *) of at most 256 bytes");
        bad = bad ? bad : "type";
    }
    if (errors != NULL) {
        count_invalid(c, bad);
        hub_api_send_invalid(req, errors);
        return HUB_EINVAL;
    }
    c->limit = (int)n; /* pull_list_done tells a full page by it */
    c->type = type;
    return 0;
}

/* Both routes, once authenticated: the input first (a malformed request
 * costs no token), then the tenant's pull bucket, then the page. */
static void pull_start(struct pull_call *c) {
    h2o_req_t *req = c->call.req;
    const struct hub_config *cfg = &c->call.hub->cfg;
    int wait;

    if (c->op == PULL_LIST && list_params(c) != 0) {
        return;
    }
    if (held_refused(&c->call)) {
        return;
    }
    wait = hub_events_rate_take(c->call.hub, &c->call.hub->pull_buckets, c->tenant,
                                (double)cfg->pull_rate, (double)cfg->pull_burst, 1.0);
    if (wait > 0) {
        hub_events_send_over_rate(req, wait, "over the pull rate of this tenant; retry later");
        return;
    }
    if (c->op == PULL_ONE) {
        char seq[24];
        const char *params[HUB_SQL_EVENTS_ONE_NPARAMS] = {c->tenant, seq};
        struct hub_pg_txn *txn = hub_api_call_txn(&c->call, pull_one_done);
        if (txn == NULL) {
            return;
        }
        snprintf(seq, sizeof(seq), "%lld", (long long)c->seq);
        hub_pg_txn_add_binary(txn, &hub_sql_events_one, HUB_SQL_EVENTS_ONE_NPARAMS, params, NULL,
                              NULL);
        hub_api_call_submit(&c->call, txn);
        return;
    }
    /* the call outlives its request while it waits (api_util.h) */
    hub_api_call_wait(&c->call);
    if (hub_pull_horizon_wait(c->call.hub, pull_horizon_cb, c) != 0) {
        c->horizon = -1;
        hub_api_call_wake(&c->call, pull_list_query, NULL);
    }
}

/* --------------------------------------------------------------- routing -- */

static void pull_authed(struct hub_api_call *call, const char *tenant_id, int status) {
    struct pull_call *c = (struct pull_call *)call;
    h2o_req_t *req = call->req;

    if (status == 200) {
        c->tenant = strdup(tenant_id);
        if (c->tenant == NULL) {
            hub_api_send_oom(req);
            return;
        }
    }
    if (status == 200 && c->route_status == 400) {
        send_invalid(c, "seq", "seq must be a sequence: decimal digits within 64 bits");
        return;
    }
    if (hub_api_route_answered(req, status, c->route_status, c->allow, "event not found")) {
        return;
    }
    pull_start(c);
}

/* /v1/events (GET, HEAD) and /v1/events/{seq} (GET, HEAD; other methods
 * 405 with the same Allow as the subscription routes').  The path segment
 * is parsed here; a bad one is answered 400 once authenticated. */
int hub_api_events_pull_handle(struct hub *hub, h2o_req_t *req) {
    h2o_iovec_t s[MAX_SEGMENTS];
    struct pull_call *c;
    int n = hub_api_split_path(req->path_normalized, sizeof(V1_PREFIX) - 1, s, MAX_SEGMENTS);

    if (n == 1 && !hub_api_method_get(req)) {
        return 0; /* POST /v1/events (ingest), or its 405 */
    }
    c = hub_api_call_new(hub, req, sizeof(*c), pull_call_free);
    if (c == NULL) {
        return 1;
    }
    if (n == 1) {
        c->op = PULL_LIST;
    } else if (n != 2) {
        c->route_status = 404;
    } else if (!hub_api_method_get(req)) {
        c->route_status = 405;
        c->allow = "GET, HEAD";
    } else {
        c->op = PULL_ONE;
        c->route_status = parse_seq(s[1].base, s[1].len, &c->seq) == 0 ? 0 : 400;
    }
    hub_api_auth_tenant(&c->call, pull_authed);
    return 1;
}
