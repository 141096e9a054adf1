/*
 * http_limits — what one client may take of the process through the HTTP
 * listener (see http_int.h for where each limit sits on a request's way in).
 *
 * h2o 2.2 reads a request's whole body before any handler runs, so a limit
 * on bodies has to act before that: h2o refuses a body whose Content-Length
 * is over globalconf.max_request_entity_size as soon as the head is parsed,
 * without reading it, with a 413 of its own.  This file keeps that number
 * at what may still be taken: before every loop turn (a uv_prepare) it
 * counts the bytes of bodies held — each connection's input buffer, with
 * the Content-Length its request head announces for a body still arriving,
 * plus what HTTP ingest holds for requests being stored — and sets the
 * limit to the room left under STREAMING_HUB_HTTP_BODY_BYTES.  A filter on
 * the host's fallback path (where h2o's own refusals go) then rewrites
 * h2o's 413: still 413 (problem+json) when the body is over the largest a
 * route takes or the cap itself, 503 with Retry-After when it would fit
 * once others are done.  Every request whose head arrives in the same turn
 * is checked against the same room: the total can pass the cap by the
 * bodies admitted in one turn (documented in docs/configuration.md).
 *
 * Large bodies may not take the last eighth of the room (at least 256
 * KiB): small requests (up to 64 KiB) keep getting in while one client's
 * large bodies fill the rest.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api_events.h"
#include "api_util.h"
#include "hub.h"
#include "http_int.h"
#include "ingest.h"
#include "log.h"
#include "util.h"

/* Bodies up to this size may use the whole room; larger ones leave the
 * reserve below to them. */
#define HTTP_SMALL_BODY (64 * 1024)
#define HTTP_RESERVE_MIN (256 * 1024)
/* The longest request head parsed for its Content-Length.  h2o takes heads
 * up to H2O_MAX_REQLEN (~400 KiB); a longer one's body is counted only as it
 * arrives.  Scanning further would cost every loop turn that much per
 * connection whose head is not complete. */
#define HTTP_HEAD_MAX (16 * 1024)
/* A refusal (and the connection cap) is logged at most this often per reason. */
#define HTTP_LOG_WINDOW_MS (60 * 1000)

/* ------------------------------------------------------------ logging -- */

static const char *const refusal_names[HUB_HTTP_REFUSED__COUNT] = {
    "too_large", "body_bytes", "ingest_queue", "ingest_key_share", "draining"};

/* 1 when slot (a refusal, or the cap at HUB_HTTP_REFUSED__COUNT) may log now. */
static int log_due(struct hub_http *http, int slot) {
    uint64_t now = hub_now_ns() / 1000000;

    if (http->logged_ms[slot] != 0 && now - http->logged_ms[slot] < HTTP_LOG_WINDOW_MS) {
        return 0;
    }
    http->logged_ms[slot] = now;
    return 1;
}

void http_limits_refused(struct hub_http *http, enum hub_http_refusal why, const char *detail) {
    http->hub->metrics.http_refused[why]++;
    if (log_due(http, why)) {
        hub_log(HUB_WARN, "http request refused (logged once a minute per reason)",
                HUB_LS("reason", refusal_names[why]), HUB_LS("detail", detail),
                HUB_LI("refused_total", (int64_t)http->hub->metrics.http_refused[why]));
    }
}

void http_send_unavailable(h2o_req_t *req, const char *detail) {
    hub_api_add_header(req, "retry-after", "1");
    hub_api_send_problem(req, 503, detail, NULL);
}

/* ---------------------------------------------------- connection cap -- */

/* At the cap the listener simply does not accept: libuv stops watching it
 * until uv_accept, so connections wait in the kernel's backlog (their
 * clients see a slow connect, never a reset) and are taken one by one as
 * others close. */
int http_limits_accept_ok(struct hub_http *http) {
    if (http->n_conns < http->max_conns) {
        return 1;
    }
    if (!http->accept_pending) {
        http->accept_pending = 1;
        http->hub->metrics.http_accept_paused++;
        if (log_due(http, HUB_HTTP_REFUSED__COUNT)) {
            hub_log(HUB_WARN,
                    "http connection cap reached: new connections wait in the backlog "
                    "(logged once a minute)",
                    HUB_LI("connections", (int64_t)http->n_conns));
        }
    }
    return 0;
}

void http_limits_conn_closed(struct hub_http *http) {
    if (http->accept_pending && !http->stopping && http->n_conns < http->max_conns) {
        http->accept_pending = 0;
        http_accept(http);
    }
}

/* -------------------------------------------------------- body budget -- */

/*
 * What the request head at the start of in[0..len) announces: the head's
 * bytes plus its Content-Length (at most body_max + 1: a larger body is
 * refused with 413 before it is read), or 0 when the head is not complete
 * yet or carries none.  A head with a Transfer-Encoding announces nothing:
 * h2o reads such a body as chunked whatever Content-Length says, and it
 * counts as it arrives (a Content-Length of 10^12 beside it reserved the
 * whole budget and refused every other client's body).  A plain scan: h2o
 * parses the head properly; this only reads a number out of it.
 */
static size_t head_announces(const char *in, size_t len, size_t body_max) {
    size_t n = len < HTTP_HEAD_MAX ? len : HTTP_HEAD_MAX;
    const char *end = memmem(in, n, "\r\n\r\n", 4);
    static const char cl_name[] = "\ncontent-length:", te_name[] = "\ntransfer-encoding:";
    size_t head, cl = 0;
    int has_cl = 0;

    if (end == NULL) {
        return 0;
    }
    head = (size_t)(end - in) + 4;
    for (const char *p = in; p + sizeof(cl_name) - 1 < end; p++) {
        if (*p != '\n') {
            continue;
        }
        if (strncasecmp(p, te_name, sizeof(te_name) - 1) == 0) {
            return 0;
        }
        if (!has_cl && strncasecmp(p, cl_name, sizeof(cl_name) - 1) == 0) {
            const char *v = p + sizeof(cl_name) - 1;
            while (v < end && (*v == ' ' || *v == '\t')) {
                v++;
            }
            while (v < end && *v >= '0' && *v <= '9' && cl <= body_max) {
                cl = cl * 10 + (size_t)(*v++ - '0');
            }
            has_cl = 1;
        }
    }
    return has_cl ? head + (cl <= body_max ? cl : body_max + 1) : 0;
}

/* The bytes a connection holds or is about to: its input buffer, or the
 * whole request its head announces while the body is arriving.  The head
 * is parsed again only when the buffer moved (h2o consumed a request or
 * grew the buffer). */
static size_t conn_body_bytes(struct http_conn *c) {
    const h2o_buffer_t *in = c->sock != NULL ? c->sock->input : NULL;

    if (in == NULL || in->size == 0) {
        c->head_of = NULL;
        return 0;
    }
    if (c->head_of != in->bytes) {
        c->head_total = head_announces(in->bytes, in->size, c->http->body_max);
        /* an incomplete head is parsed again next time */
        c->head_of = c->head_total > 0 ? in->bytes : NULL;
    }
    return in->size > c->head_total ? in->size : c->head_total;
}

/* Room for large bodies: what is left once the reserve of small ones is
 * kept.  The largest body that can ever get in is http->body_cap minus it. */
static size_t reserve_of(const struct hub_http *http) {
    size_t r = http->body_cap / 8;
    return r > HTTP_RESERVE_MIN ? r : HTTP_RESERVE_MIN;
}

/* Before every loop turn: the bodies held now, and the largest body h2o may
 * take next (max_request_entity_size).  O(connections), which the
 * connection cap bounds. */
static void budget_cb(uv_prepare_t *p) {
    struct hub_http *http = p->data;
    size_t held = hub_ingest_queue_bytes(http->hub);
    size_t room, small, large, reserve = reserve_of(http);

    /* a body being received counts whole from its head on (what it will
     * take), a body being stored twice (h2o's buffer and the API's copy) */
    for (struct http_conn *c = http->conns; c != NULL; c = c->next) {
        held += conn_body_bytes(c);
    }
    http->body_bytes = held;
    room = http->body_cap > held ? http->body_cap - held : 0;
    small = room < HTTP_SMALL_BODY ? room : HTTP_SMALL_BODY;
    large = room > reserve ? room - reserve : 0;
    if (large > http->body_max) {
        large = http->body_max;
    }
    http->config.max_request_entity_size = large > small ? large : small;
}

/*
 * The fallback path's filter: h2o's own answers to a request it refused
 * before routing it.  A 413 is h2o's body check (over max_request_entity_
 * size); it becomes a problem+json 413 when the body could never be taken,
 * or a 503 with Retry-After when it was refused for want of room now.
 * Other answers (h2o's 400 for a malformed head) pass unchanged.
 */
struct body_swap {
    h2o_ostream_t super;
    h2o_iovec_t body;
};

static void body_swap_send(h2o_ostream_t *self, h2o_req_t *req, h2o_iovec_t *bufs, size_t bufcnt,
                           h2o_send_state_t state) {
    struct body_swap *s = (struct body_swap *)self;

    /* h2o_send_inline sends its text in one final call; HEAD sends none */
    h2o_ostream_send_next(&s->super, req, bufcnt > 0 ? &s->body : NULL, bufcnt > 0 ? 1 : 0, state);
}

static void fallback_setup(h2o_filter_t *self, h2o_req_t *req, h2o_ostream_t **slot) {
    struct hub_http *http = ((struct http_filter *)self)->http;
    h2o_socket_t *sock;
    size_t announced = 0, never;
    int status;
    const char *detail;
    json_t *p;
    char *text;
    struct body_swap *swap;

    if (req->res.status != 413) {
        h2o_setup_next_ostream(req, slot);
        return;
    }
    /* the head is still at the start of the connection's input */
    sock = req->conn->callbacks->get_socket != NULL ? req->conn->callbacks->get_socket(req->conn)
                                                    : NULL;
    if (sock != NULL && sock->input != NULL) {
        size_t total = head_announces(sock->input->bytes, sock->input->size, http->body_max);
        const char *end = memmem(
            sock->input->bytes,
            sock->input->size < HTTP_HEAD_MAX ? sock->input->size : HTTP_HEAD_MAX, "\r\n\r\n", 4);
        announced = total > 0 && end != NULL ? total - (size_t)(end - sock->input->bytes) - 4 : 0;
    }
    /* the largest body that can ever get in: over it, waiting cannot help */
    never = http->body_cap - reserve_of(http);
    never = never < http->body_max ? never : http->body_max;
    if (announced > never || (announced == 0 && http->config.max_request_entity_size >= never)) {
        status = 413;
        detail = "the request body is too large";
        http_limits_refused(http, HUB_HTTP_REFUSED_TOO_LARGE, detail);
    } else {
        status = 503;
        detail = "too many request bodies are held at once; retry later";
        http_limits_refused(http, HUB_HTTP_REFUSED_BODY_BYTES, detail);
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_RETRY_AFTER, NULL, H2O_STRLIT("1"));
    }
    p = hub_api_problem(status, detail, NULL);
    text = p != NULL ? json_dumps(p, HUB_API_JSON_FLAGS) : NULL;
    json_decref(p);
    if (text != NULL) {
        /* h2o's text/plain header is the only one set: replaced */
        for (size_t i = 0; i < req->res.headers.size; i++) {
            if (req->res.headers.entries[i].name == &H2O_TOKEN_CONTENT_TYPE->buf) {
                req->res.headers.entries[i].value =
                    h2o_iovec_init(H2O_STRLIT("application/problem+json"));
            }
        }
        req->res.status = status;
        req->res.reason = status == 413 ? "Payload Too Large" : "Service Unavailable";
        swap = (struct body_swap *)h2o_add_ostream(req, sizeof(*swap), slot);
        swap->super.do_send = body_swap_send;
        swap->body = h2o_strdup(&req->pool, text, strlen(text));
        req->res.content_length = swap->body.len;
        free(text);
        slot = &swap->super.next;
    }
    h2o_setup_next_ostream(req, slot);
}

/* The routes' filter: while draining, every answer closes its connection,
 * so that clients take their next request elsewhere. */
static void routes_setup(h2o_filter_t *self, h2o_req_t *req, h2o_ostream_t **slot) {
    struct hub_http *http = ((struct http_filter *)self)->http;

    if (http->draining) {
        req->http1_is_persistent = 0;
    }
    h2o_setup_next_ostream(req, slot);
}

/* ---------------------------------------------- requests in progress -- */

/* An HTTP ingest request's slot: released by the last of its request's
 * mark and the calls that took it (hub_http_ingest_hold). */
struct http_ingest_hold {
    struct http_ingest_slots *slots;
    uint64_t key; /* the API key's hash */
    int refs;
};

/* The in-flight mark of a request, freed by h2o with the request's pool. */
struct inflight_mark {
    struct hub_http *http;
    struct http_ingest_hold *hold; /* ingest requests; NULL for the others */
};

/* The slot of key in the table (its own, or the free one to take). */
static struct http_keycount *key_slot(struct http_ingest_slots *s, uint64_t key) {
    size_t i = (size_t)key & (s->keys_cap - 1);

    while (s->keys[i].key != 0 && s->keys[i].key != key) {
        i = (i + 1) & (s->keys_cap - 1);
    }
    return &s->keys[i];
}

/* Drops one of key's requests; a key at zero leaves the table, the
 * entries after it moved back so that no probe sequence breaks. */
static void key_release(struct http_ingest_slots *s, uint64_t key) {
    struct http_keycount *e = key_slot(s, key);
    size_t i, j;

    if (e->key == 0 || --e->n > 0) {
        return;
    }
    i = (size_t)(e - s->keys);
    e->key = 0;
    for (j = (i + 1) & (s->keys_cap - 1); s->keys[j].key != 0; j = (j + 1) & (s->keys_cap - 1)) {
        size_t home = (size_t)s->keys[j].key & (s->keys_cap - 1);
        /* moves back unless its home lies cyclically in (i, j] */
        if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
            s->keys[i] = s->keys[j];
            s->keys[j].key = 0;
            i = j;
        }
    }
}

void http_ingest_slots_unref(struct http_ingest_slots *s) {
    if (s != NULL && --s->refs == 0) {
        free(s->keys);
        free(s);
    }
}

struct http_ingest_hold *hub_http_ingest_hold(struct hub_http *http) {
    struct http_ingest_hold *h = http != NULL ? http->routing : NULL;

    if (h != NULL) {
        h->refs++;
    }
    return h;
}

void hub_http_ingest_release(struct http_ingest_hold *h) {
    if (h == NULL || --h->refs > 0) {
        return;
    }
    h->slots->live--;
    key_release(h->slots, h->key);
    http_ingest_slots_unref(h->slots);
    free(h);
}

static void inflight_dispose(void *p) {
    struct inflight_mark *m = p;
    struct hub_http *http = m->http;

    http->inflight--;
    if (http->routing == m->hold) {
        http->routing = NULL; /* answered while it was routed */
    }
    hub_http_ingest_release(m->hold);
}

/* The API key's hash (never 0): requests without one share a slot. */
static uint64_t request_key(const h2o_req_t *req) {
    h2o_iovec_t token;
    uint64_t h = HUB_FNV1A_BASIS;

    if (hub_api_bearer_token(req, &token)) {
        h = hub_fnv1a(h, token.base, token.len);
    }
    return h != 0 ? h : 1;
}

int http_limits_admit(struct hub_http *http, h2o_req_t *req, int ingest) {
    struct http_ingest_slots *s = http->ingest;
    struct inflight_mark *m;
    struct http_ingest_hold *hold = NULL;
    struct http_keycount *e = NULL;
    uint64_t key = 0;

    http->routing = NULL;
    /* the bound first (everyone's), then the key's share: a key over its
     * share is told so even when the bound has room */
    if (ingest) {
        size_t share = s->max / 2;
        key = request_key(req);
        if (s->live >= s->max) {
            http_limits_refused(http, HUB_HTTP_REFUSED_INGEST_QUEUE,
                                "HTTP ingest requests in progress are at their bound");
            http_send_unavailable(req, "too many ingest requests are in progress; retry later");
            return 1;
        }
        e = key_slot(s, key);
        if (e->key != 0 && e->n >= share) {
            http_limits_refused(http, HUB_HTTP_REFUSED_INGEST_SHARE,
                                "one API key holds half of the HTTP ingest requests in progress");
            http_send_unavailable(req, "this API key has too many ingest requests in progress; "
                                       "retry later");
            return 1;
        }
        if ((hold = malloc(sizeof(*hold))) == NULL) {
            http_send_unavailable(req, "out of memory; retry later");
            return 1;
        }
        hold->slots = s;
        hold->key = key;
        hold->refs = 1; /* the mark's */
        s->refs++;
        e->key = key;
        e->n++;
        s->live++;
    }
    /* h2o_mem_alloc_shared aborts rather than returning NULL, like all of h2o */
    m = h2o_mem_alloc_shared(&req->pool, sizeof(*m), inflight_dispose);
    m->http = http;
    m->hold = hold;
    http->inflight++;
    http->routing = hold;
    return 0;
}

/* ------------------------------------------------------- set-up -- */

/* The key table holds at most ingest_max keys (one per request in
 * progress): twice that keeps it at most half full.  The filters are h2o's
 * (freed with its configuration), the prepare handle ours (closed by
 * http_limits_stop). */
int http_limits_init(struct hub_http *http, h2o_hostconf_t *host, h2o_pathconf_t *path) {
    const struct hub_config *cfg = &http->hub->cfg;
    struct http_filter *f;

    http->max_conns = (size_t)cfg->http_max_connections;
    http->body_cap = (size_t)cfg->http_body_bytes;
    http->body_max = hub_api_events_max_body(cfg);
    if ((http->ingest = calloc(1, sizeof(*http->ingest))) == NULL) {
        return HUB_ENOMEM;
    }
    http->ingest->refs = 1; /* the server's */
    http->ingest->max = (size_t)cfg->ingest_http_queue;
    http->ingest->keys_cap = 16;
    while (http->ingest->keys_cap < http->ingest->max * 2) {
        http->ingest->keys_cap *= 2;
    }
    http->ingest->keys = calloc(http->ingest->keys_cap, sizeof(*http->ingest->keys));
    if (http->ingest->keys == NULL) {
        return HUB_ENOMEM;
    }
    f = (struct http_filter *)h2o_create_filter(path, sizeof(*f));
    f->super.on_setup_ostream = routes_setup;
    f->http = http;
    f = (struct http_filter *)h2o_create_filter(&host->fallback_path, sizeof(*f));
    f->super.on_setup_ostream = fallback_setup;
    f->http = http;
    uv_prepare_init(http->hub->loop, &http->budget);
    http->budget.data = http;
    uv_prepare_start(&http->budget, budget_cb);
    budget_cb(&http->budget);
    return 0;
}

void http_limits_stop(struct hub_http *http) {
    uv_prepare_stop(&http->budget);
    uv_close((uv_handle_t *)&http->budget, NULL);
}
