/*
 * api_subs — /v1/subscriptions and /v1/deliveries (see api_subs.h).
 *
 * Every route follows the admin API's small machine (api_admin.c): the
 * tenant key is checked first (one database round trip), then the request
 * is validated completely in memory, then one transaction answers.  Three
 * routes have an extra asynchronous step:
 *
 *   - create and a PATCH of destination.url vet the destination against
 *     SSRF (SPEC §11): unless private sinks are allowed, the host is
 *     resolved with uv_getaddrinfo on the loop and refused when ANY address
 *     is blocked by netguard (an IP literal is checked as it is);
 *   - create and a url change start a background verification probe;
 *   - /verify waits for a probe before it answers.
 *
 * DNS lookups and probes may outlive the request (the client hangs up, the
 * server stops): they are separate objects with a weak link to the waiting
 * call, which the call's on_free severs.  A probe always records its
 * outcome; it answers only if someone still waits.
 *
 * Secrets: the signing secret and the destination headers are sealed under
 * the KEK with the subscription id as AAD before they reach the database;
 * plaintext exists only in memory while a response or a probe is built, and
 * is wiped (OPENSSL_cleanse) where this module owns the buffer.  Logs carry
 * tenant and subscription ids, never a secret, header value or body.
 *
 * Idempotency-Key (create, rotate-secret) follows api_admin.c: look the key
 * up, replay a stored response younger than 24h, otherwise run and store
 * the response in the same statement.  Unlike admin keys, the stored record
 * keeps the secret SEALED (member "_ss"), so a replay shows the same secret
 * without it ever being at rest in clear; a marker ("_req": operation and
 * SHA-256 of the body) makes a key reused for a different request a 409.
 */
#include "api_subs.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "api_util.h"
#include "backoff.h"
#include "config.h"
#include "envelope.h"
#include "hub.h"
#include "httpc.h"
#include "log.h"
#include "policy.h"
#include "netguard.h"
#include "store_admin.h"
#include "store_subs.h"
#include "util.h"
#include "uuid.h"
#include "webhook.h"

#define V1_PREFIX "/v1"
#define SUBS_PATH "/v1/subscriptions"
#define DELIV_PATH "/v1/deliveries"
#define MAX_SEGMENTS 4
#define IDEM_SCOPE_PREFIX "tenant:"

#define EVENT_TYPES_MAX 64
#define EVENT_TYPE_LEN_MAX 256
#define URL_LEN_MAX 2048
#define HEADERS_MAX 32
#define HEADER_VALUE_MAX 4096
#define GRACE_MAX_MS (7LL * 24 * 3600 * 1000)
#define PROBE_CONNECT_TIMEOUT_MS 5000
#define REPLAY_MAX_EVENTS 100000 /* per call */
#define REPLAY_INTERVAL_MS 5000  /* between two replays of one subscription */
#define CHALLENGE_RAW 24
#define CHALLENGE_TEXT 33 /* base64url of 24 bytes = 32 characters + NUL */

#define PROBE_EVENT_TYPE "subscription.verification"
#define PROBE_CE_TYPE "studio.lerian.subscription.verification"
#define PROBE_CE_SOURCE "/streaming-hub"

#define EVENT_TYPE_RULE                                                                            \
    "must be an event type (no control characters, no '*'), <resource>.* with a one-segment "      \
    "resource, or *"
#define HEADER_VALUE_RULE                                                                          \
    "must be a non-empty string of at most 4096 bytes without control characters"
#define NO_KEK_DETAIL                                                                              \
    "STREAMING_HUB_KEK is required to store or use subscription secrets; the operator must "       \
    "configure it"
#define NO_HTTPC_DETAIL "outgoing HTTP is not available in this process; retry later"

/* ====================================================== request state ====== */

enum subs_op {
    OP_NONE, /* no route matched (route_status says why) */
    OP_SUB_CREATE,
    OP_SUB_LIST,
    OP_SUB_GET,
    OP_SUB_PATCH,
    OP_SUB_DELETE,
    OP_SUB_VERIFY,
    OP_SUB_ROTATE,
    OP_SUB_REPLAY,
    OP_DELIV_LIST,
    OP_DELIV_GET,
    OP_DELIV_REDELIVER,
};

struct subs_call;
typedef void (*subs_step)(struct subs_call *c);

/* A DNS lookup of the SSRF vetting; outlives its call if need be. */
struct subs_resolve {
    uv_getaddrinfo_t req;
    struct subs_call *owner; /* NULL once the call is gone */
};

struct subs_probe;

/* The validated members of a create or PATCH body.  Strings are owned. */
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

/* One request waiting on the database, DNS or a probe. */
struct subs_call {
    struct hub_api_call call; /* first: api_util hands this pointer back */
    enum subs_op op;
    int route_status;  /* 0, or 404/405 decided before authentication */
    const char *allow; /* 405: the Allow header */
    char *tenant_id;
    char *object_id; /* subscription id (lower-case uuid) or job id */
    struct subs_input in;
    char *idem_key;
    char *idem_scope;
    char *idem_req;
    int relooked;
    int limit;
    char *after;
    char *state;
    int64_t grace_ms;
    char since[64], until[64];    /* replay window, RFC 3339 UTC */
    char secret[HUB_SECRET_SIZE]; /* a new secret, plaintext (create, rotate) */
    char *secret_sealed;
    subs_step vetted; /* what runs once the destination passed the SSRF check */
    struct subs_resolve *resolve;
    struct subs_probe *probe;
};

/* A verification probe (SPEC §6).  Owns copies of everything it needs after
 * the request is gone; no plaintext secret or header value is kept. */
enum probe_mode { PROBE_BACKGROUND, PROBE_VERIFY };

struct subs_probe {
    struct hub *hub;
    enum probe_mode mode;
    struct subs_call *owner; /* PROBE_VERIFY: the waiting request, NULL once gone */
    char sub_id[HUB_UUID_TEXT_SIZE];
    char delivery_id[HUB_UUID_TEXT_SIZE];
    char *tenant_id;
    char *url;
    char *headers_sealed; /* the guard of the background result */
    char challenge[CHALLENGE_TEXT];
    int ok;
    long status; /* 0: no response */
    char *error;
};

static void input_free(struct subs_input *in) {
    free(in->event_types);
    free(in->schema_major);
    free(in->url);
    hub_webhook_headers_wipe(in->headers);
    free(in->headers_sealed);
    free(in->retry_schedule);
    free(in->policy);
    free(in->ordering);
    free(in->max_rate);
    free(in->audit);
    memset(in, 0, sizeof(*in));
}

static void subs_call_free(struct hub_api_call *call) {
    struct subs_call *c = (struct subs_call *)call;

    /* sever the weak links: a lookup or probe still running finds no one */
    if (c->resolve != NULL) {
        c->resolve->owner = NULL;
        c->resolve = NULL;
    }
    if (c->probe != NULL) {
        c->probe->owner = NULL;
        c->probe = NULL;
    }
    input_free(&c->in);
    free(c->tenant_id);
    free(c->object_id);
    free(c->idem_key);
    free(c->idem_scope);
    free(c->idem_req);
    free(c->after);
    free(c->state);
    free(c->secret_sealed);
    OPENSSL_cleanse(c->secret, sizeof(c->secret));
    c->tenant_id = c->object_id = c->idem_key = c->idem_scope = c->idem_req = NULL;
    c->after = c->state = c->secret_sealed = NULL;
}

static int kek_missing(struct subs_call *c) {
    if (c->call.hub->has_kek) {
        return 0;
    }
    hub_api_send_problem(c->call.req, 503, NO_KEK_DETAIL, NULL);
    return 1;
}

static int env_production(const struct hub *hub) {
    return hub->cfg.env != NULL && strcmp(hub->cfg.env, "production") == 0;
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

/* Wall clock: Unix seconds, and RFC 3339 UTC with milliseconds in out. */
static int64_t now_rfc3339(char *out, size_t outsz) {
    int64_t us = hub_unix_us();
    hub_rfc3339(us, 3, out, outsz);
    return us / 1000000;
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
    } else if (open_ss) {
        const char *ss = json_string_value(json_object_get(obj, "_ss"));
        unsigned char *pt = NULL;
        size_t len = 0;
        if (ss != NULL && hub->has_kek && hub_open(&hub->kek, 1, ss, id, &pt, &len) == 0) {
            json_object_set_new(obj, "secret", json_stringn((const char *)pt, len));
            OPENSSL_cleanse(pt, len);
            free(pt);
        } else {
            json_object_set_new(obj, "secret", json_null());
        }
    }
    json_object_del(obj, "_hs");
    json_object_del(obj, "_ss");
    json_object_del(obj, "_req");
    return 0;
}

/* Parses a subscription object from PostgreSQL and renders it; NULL when
 * malformed or out of memory (logged). */
static json_t *subs_load(struct hub *hub, const char *text, size_t len, const char *secret,
                         int open_ss) {
    json_t *obj = json_loadb(text, len, 0, NULL);

    if (obj == NULL || subs_render(hub, obj, secret, open_ss) != 0) {
        hub_log(HUB_ERROR, "database returned a malformed subscription object");
        json_decref(obj);
        return NULL;
    }
    return obj;
}

/* Answers status with the subscription row text (column 0 of r, row 0). */
static void send_subscription(struct subs_call *c, int status, PGresult *r, const char *secret) {
    json_t *obj =
        subs_load(c->call.hub, PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0), secret, 0);

    if (obj == NULL) {
        hub_api_send_problem(c->call.req, 500, "malformed object from the database", NULL);
        return;
    }
    hub_api_send_json(c->call.req, status, obj);
    json_decref(obj);
}

/* Answers a delivery object as PostgreSQL rendered it (re-serialised). */
static void send_pg_object(h2o_req_t *req, int status, const char *text, size_t len) {
    json_t *obj = json_loadb(text, len, 0, NULL);

    if (obj == NULL) {
        hub_log(HUB_ERROR, "database returned malformed JSON");
        hub_api_send_problem(req, 500, "malformed object from the database", NULL);
        return;
    }
    hub_api_send_json(req, status, obj);
    json_decref(obj);
}

/* Rows (key, object) of r starting at column `col`; limit + 1 were asked
 * for, so one more row than the limit means there is a next page. */
static void send_page(struct subs_call *c, PGresult *r, const char *kind, int subscriptions) {
    h2o_req_t *req = c->call.req;
    int n = PQntuples(r);
    int shown = n > c->limit ? c->limit : n;
    json_t *items = json_array(), *body = NULL;
    char *cursor = NULL;

    if (items == NULL) {
        goto fail;
    }
    for (int i = 0; i < shown; i++) {
        const char *text = PQgetvalue(r, i, 1);
        size_t len = (size_t)PQgetlength(r, i, 1);
        json_t *it = subscriptions ? subs_load(c->call.hub, text, len, NULL, 0)
                                   : json_loadb(text, len, 0, NULL);
        if (it == NULL || json_array_append_new(items, it) != 0) {
            goto fail;
        }
    }
    if (n > c->limit) {
        cursor = hub_api_cursor_encode(kind, PQgetvalue(r, shown - 1, 0));
        if (cursor == NULL) {
            goto fail;
        }
    }
    body = json_pack("{s:o, s:o}", "items", items, "next_cursor",
                     cursor != NULL ? json_string(cursor) : json_null());
    items = NULL; /* json_pack's "o" took it, also on failure */
    if (body == NULL) {
        goto fail;
    }
    hub_api_send_json(req, 200, body);
    json_decref(body);
    free(cursor);
    return;
fail:
    json_decref(items);
    free(cursor);
    hub_api_send_problem(req, 500, "out of memory rendering the list", NULL);
}

/* ========================================================= validation ====== */

/*
 * NULL when s is a valid event_types entry, else the rule it breaks.  An
 * exact entry may be any event type the envelope can derive (SPEC §3.1:
 * `<resource>.<event>`, or else the whole ce-type, such as
 * `com.example.Order` or `ping`), so it only excludes control characters
 * and '*'; a wildcard is `<resource>.*` with a one-segment resource, or `*`.
 */
static const char *event_type_error(const char *s, size_t len) {
    size_t end = len;

    if (len == 0 || len > EVENT_TYPE_LEN_MAX) {
        return "must be 1 to 256 characters";
    }
    if (len == 1 && s[0] == '*') {
        return NULL;
    }
    if (len >= 3 && s[len - 1] == '*' && s[len - 2] == '.') {
        end = len - 2; /* the resource, compared with the type's first segment */
    }
    for (size_t i = 0; i < end; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch == 0x7f || ch == '*' || (end < len && ch == '.')) {
            return EVENT_TYPE_RULE;
        }
    }
    return NULL;
}

static void check_event_types(json_t *v, struct subs_input *in, json_t **errors, int *oom) {
    char field[48];
    size_t n;
    int bad = 0;

    if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > EVENT_TYPES_MAX) {
        hub_api_errors_add(errors, "event_types", "must be an array of 1 to 64 event types");
        return;
    }
    n = json_array_size(v);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(v, i);
        const char *why;
        snprintf(field, sizeof(field), "event_types[%zu]", i);
        if (!json_is_string(e)) {
            hub_api_errors_add(errors, field, EVENT_TYPE_RULE);
            bad = 1;
            continue;
        }
        why = event_type_error(json_string_value(e), json_string_length(e));
        if (why != NULL) {
            hub_api_errors_add(errors, field, why);
            bad = 1;
            continue;
        }
        for (size_t j = 0; j < i; j++) {
            if (json_equal(e, json_array_get(v, j))) {
                hub_api_errors_add(errors, field, "is a duplicate");
                bad = 1;
                break;
            }
        }
    }
    if (!bad) {
        in->event_types = json_dumps(v, JSON_COMPACT);
        if (in->event_types == NULL) {
            *oom = 1;
        }
    }
}

static void check_schema_major(json_t *v, struct subs_input *in, json_t **errors, int *oom) {
    char num[24];

    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 2147483647) {
        hub_api_errors_add(errors, "schema_major", "must be an integer >= 1");
        return;
    }
    snprintf(num, sizeof(num), "%lld", (long long)json_integer_value(v));
    in->schema_major = hub_api_strdup(num, oom);
}

static void check_url(struct hub *hub, json_t *v, struct subs_input *in, json_t **errors,
                      int *oom) {
    struct hub_url u;
    const char *s = json_string_value(v);

    if (s == NULL || json_string_length(v) == 0 || json_string_length(v) > URL_LEN_MAX ||
        strlen(s) != json_string_length(v) || hub_url_parse(s, &u) != 0) {
        hub_api_errors_add(errors, "destination.url",
                           "must be an absolute http(s) URL of at most 2048 characters, "
                           "without credentials or fragment");
        return;
    }
    if (env_production(hub) && strcmp(u.scheme, "https") != 0) {
        hub_api_errors_add(errors, "destination.url", "must use https in production");
        return;
    }
    in->url = hub_api_strdup(s, oom);
}

static void check_headers(json_t *v, struct subs_input *in, json_t **errors, int *oom) {
    char field[32 + HUB_WEBHOOK_HEADER_NAME_MAX];
    const char *name;
    json_t *value;
    int bad = 0;

    in->headers_set = 1;
    if (json_is_null(v)) {
        return;
    }
    if (!json_is_object(v) || json_object_size(v) > HEADERS_MAX) {
        hub_api_errors_add(errors, "destination.headers",
                           "must be an object of at most 32 string values, or null");
        return;
    }
    json_object_foreach(v, name, value) {
        size_t nl = strlen(name);
        const char *other;
        json_t *ov;
        snprintf(field, sizeof(field), "destination.headers.%.*s", HUB_WEBHOOK_HEADER_NAME_MAX, name);
        if (!hub_webhook_header_name_valid(name, nl)) {
            hub_api_errors_add(errors, field,
                               "is not a valid header name (RFC 9110 token, "
                               "at most 128 characters)");
            bad = 1;
            continue;
        }
        if (hub_webhook_header_reserved(name, nl)) {
            hub_api_errors_add(errors, field, "is reserved: the hub or the transport sets it");
            bad = 1;
            continue;
        }
        if (!json_is_string(value) || json_string_length(value) == 0 ||
            json_string_length(value) > HEADER_VALUE_MAX ||
            strlen(json_string_value(value)) != json_string_length(value) ||
            !hub_http_value_safe(json_string_value(value), json_string_length(value))) {
            hub_api_errors_add(errors, field, HEADER_VALUE_RULE);
            bad = 1;
            continue;
        }
        /* header names are case-insensitive: "X-Key" and "x-key" collide */
        json_object_foreach(v, other, ov) {
            if (other == name) {
                break;
            }
            if (strcasecmp(other, name) == 0) {
                hub_api_errors_add(errors, field, "repeats another header name (case-insensitive)");
                bad = 1;
                break;
            }
        }
    }
    if (!bad && json_object_size(v) > 0) {
        in->headers = json_deep_copy(v);
        if (in->headers == NULL) {
            *oom = 1;
        }
    }
}

static void check_destination(struct hub *hub, json_t *v, struct subs_input *in, int create,
                              json_t **errors, int *oom) {
    static const char *const allowed[] = {"kind", "url", "headers", NULL};
    json_t *kind, *url, *headers;
    const char *key;
    json_t *member;

    if (!json_is_object(v)) {
        hub_api_errors_add(errors, "destination",
                           "must be an object {\"kind\": \"webhook\", \"url\", \"headers\"}");
        return;
    }
    json_object_foreach(v, key, member) {
        int known = 0;
        char field[96];
        for (const char *const *a = allowed; *a != NULL; a++) {
            known |= strcmp(key, *a) == 0;
        }
        if (!known) {
            snprintf(field, sizeof(field), "destination.%.64s", key);
            hub_api_errors_add(errors, field, "unknown member");
        }
    }
    kind = json_object_get(v, "kind");
    url = json_object_get(v, "url");
    headers = json_object_get(v, "headers");
    if (kind == NULL && create) {
        hub_api_errors_add(errors, "destination.kind", "is required (\"webhook\")");
    } else if (kind != NULL &&
               (!json_is_string(kind) || strcmp(json_string_value(kind), "webhook") != 0)) {
        hub_api_errors_add(errors, "destination.kind", "must be \"webhook\"");
    }
    if (url == NULL && create) {
        hub_api_errors_add(errors, "destination.url", "is required");
    } else if (url != NULL) {
        check_url(hub, url, in, errors, oom);
    }
    if (headers != NULL) {
        check_headers(headers, in, errors, oom);
    }
}

static void check_retry_schedule(json_t *v, struct subs_input *in, json_t **errors, int *oom) {
    int64_t steps[HUB_BACKOFF_MAX_STEPS];
    size_t n;
    int bad = 0;
    char field[48];

    in->retry_set = 1;
    if (json_is_null(v)) {
        return;
    }
    if (!json_is_array(v) || json_array_size(v) == 0 ||
        json_array_size(v) > HUB_BACKOFF_MAX_STEPS) {
        hub_api_errors_add(errors, "retry_schedule",
                           "must be null or an array of 1 to 12 durations (\"30s\", \"5m\")");
        return;
    }
    n = json_array_size(v);
    for (size_t i = 0; i < n; i++) {
        const char *s = json_string_value(json_array_get(v, i));
        snprintf(field, sizeof(field), "retry_schedule[%zu]", i);
        if (s == NULL || hub_duration_parse(s, &steps[i]) != 0 || steps[i] <= 0 ||
            steps[i] > HUB_BACKOFF_STEP_MAX_MS) {
            hub_api_errors_add(errors, field,
                               "must be a duration greater than 0 and at most 10h (e.g. \"90s\")");
            bad = 1;
        }
    }
    if (!bad && !hub_backoff_schedule_valid(steps, n)) {
        hub_api_errors_add(errors, "retry_schedule", "is not a valid schedule");
        bad = 1;
    }
    if (!bad) {
        in->retry_schedule = json_dumps(v, JSON_COMPACT);
        if (in->retry_schedule == NULL) {
            *oom = 1;
        }
    }
}

static void check_policy(struct hub *hub, json_t *v, struct subs_input *in, json_t **errors,
                         int *oom) {
    in->policy_set = 1;
    if (json_is_null(v)) {
        return;
    }
    const char *why = NULL;
    if (!json_is_string(v) || !hub_policy_name_valid(json_string_value(v), json_string_length(v))) {
        hub_api_errors_add(errors, "policy", "must be null or a name matching [a-zA-Z0-9_-]{1,64}");
        return;
    }
    /* only a policy this process has loaded: a file that exists but does
     * not compile is refused with its error */
    if (!hub_policies_usable(hub->policies, json_string_value(v), &why)) {
        char msg[600];
        snprintf(msg, sizeof(msg), "%s%s",
                 strcmp(why, "unknown policy") == 0 ? "" : "policy failed to load: ", why);
        hub_api_errors_add(errors, "policy", msg);
        return;
    }
    in->policy = hub_api_strdup(json_string_value(v), oom);
}

static void check_max_rate(json_t *v, struct subs_input *in, json_t **errors, int *oom) {
    char num[40];
    double d;

    in->max_rate_set = 1;
    if (json_is_null(v)) {
        return;
    }
    d = json_number_value(v);
    if (!json_is_number(v) || !isfinite(d) || d <= 0) {
        hub_api_errors_add(errors, "max_rate",
                           "must be null or a number of deliveries per second > 0");
        return;
    }
    if (json_is_integer(v)) {
        snprintf(num, sizeof(num), "%lld", (long long)json_integer_value(v));
    } else {
        snprintf(num, sizeof(num), "%.17g", d);
    }
    in->max_rate = hub_api_strdup(num, oom);
}

/*
 * Validates a create (create = 1) or PATCH body into *in.  Adds one error
 * per offending member to *errors; sets *oom on allocation failure.
 */
static void check_input(struct hub *hub, json_t *body, int create, struct subs_input *in,
                        json_t **errors, int *oom) {
    static const char *const allowed[] = {"event_types",    "schema_major", "destination",
                                          "retry_schedule", "policy",       "ordering",
                                          "max_rate",       "enabled",      NULL};
    const char *key;
    json_t *v;

    in->enabled = -1;
    json_object_foreach(body, key, v) {
        int known = 0;
        for (const char *const *a = allowed; *a != NULL; a++) {
            known |= strcmp(key, *a) == 0;
        }
        if (!known) {
            hub_api_errors_add(errors, key, "unknown or read-only member");
        }
    }
    if ((v = json_object_get(body, "event_types")) != NULL) {
        check_event_types(v, in, errors, oom);
    } else if (create) {
        hub_api_errors_add(errors, "event_types", "is required");
    }
    if ((v = json_object_get(body, "schema_major")) != NULL) {
        check_schema_major(v, in, errors, oom);
    } else if (create) {
        in->schema_major = hub_api_strdup("1", oom);
    }
    if ((v = json_object_get(body, "destination")) != NULL) {
        check_destination(hub, v, in, create, errors, oom);
    } else if (create) {
        hub_api_errors_add(errors, "destination", "is required");
    }
    if ((v = json_object_get(body, "retry_schedule")) != NULL) {
        check_retry_schedule(v, in, errors, oom);
    }
    if ((v = json_object_get(body, "policy")) != NULL) {
        check_policy(hub, v, in, errors, oom);
    }
    if ((v = json_object_get(body, "ordering")) != NULL) {
        const char *s = json_string_value(v);
        if (s == NULL || (strcmp(s, "unordered") != 0 && strcmp(s, "fifo") != 0)) {
            hub_api_errors_add(errors, "ordering", "must be \"unordered\" or \"fifo\"");
        } else {
            in->ordering = hub_api_strdup(s, oom);
        }
    } else if (create) {
        in->ordering = hub_api_strdup("unordered", oom);
    }
    if ((v = json_object_get(body, "max_rate")) != NULL) {
        check_max_rate(v, in, errors, oom);
    }
    if ((v = json_object_get(body, "enabled")) != NULL) {
        if (!json_is_boolean(v)) {
            hub_api_errors_add(errors, "enabled", "must be true or false");
        } else {
            in->enabled = json_is_true(v);
        }
    } else if (create) {
        in->enabled = 1;
    }
}

/* Sets up the Idempotency-Key state: scope "tenant:<id>" and the request
 * marker "<op>:<SHA-256 of the body>".  Returns 0 or -1 (OOM). */
static int idem_prepare(struct subs_call *c, h2o_iovec_t key, const char *op) {
    size_t need;
    int oom = 0;

    if (key.base == NULL) {
        return 0;
    }
    c->idem_key = hub_api_strndup(key.base, key.len, &oom);
    need = sizeof(IDEM_SCOPE_PREFIX) + strlen(c->tenant_id);
    c->idem_scope = malloc(need);
    if (c->idem_scope != NULL) {
        snprintf(c->idem_scope, need, IDEM_SCOPE_PREFIX "%s", c->tenant_id);
    }
    c->idem_req = hub_api_request_marker(c->call.req, op, c->object_id);
    return oom || c->idem_scope == NULL || c->idem_req == NULL ? -1 : 0;
}

/* ========================================================= SSRF vetting == */

#define SSRF_MESSAGE                                                                               \
    "resolves to a loopback, private, link-local or otherwise non-public address "                 \
    "(STREAMING_HUB_ALLOW_PRIVATE_SINKS is false)"

static void send_url_error(h2o_req_t *req, const char *message) {
    json_t *errors = NULL;
    hub_api_errors_add(&errors, "destination.url", message);
    hub_api_send_invalid(req, errors);
}

static void resolve_done(uv_getaddrinfo_t *r, int status, struct addrinfo *res) {
    struct subs_resolve *rs = r->data;
    struct subs_call *c = rs->owner;
    int blocked = 0, usable = 0;

    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET || ai->ai_family == AF_INET6) {
            usable++;
        }
        if (hub_netguard_blocked(ai->ai_addr)) {
            blocked = 1; /* fails closed on odd families too */
        }
    }
    if (res != NULL) {
        uv_freeaddrinfo(res);
    }
    free(rs);
    if (c == NULL) {
        return; /* the request is gone */
    }
    c->resolve = NULL;
    if (status == UV_EAI_NONAME || status == UV_EAI_NODATA || (status == 0 && usable == 0)) {
        send_url_error(c->call.req, "the host name does not resolve");
        return;
    }
    if (status != 0) {
        hub_log(HUB_WARN, "cannot resolve a destination host", HUB_LS("tenant", c->tenant_id),
                HUB_LS("error", uv_strerror(status)));
        hub_api_send_problem(c->call.req, 503,
                             "cannot resolve the destination host now; retry later", NULL);
        return;
    }
    if (blocked) {
        send_url_error(c->call.req, SSRF_MESSAGE);
        return;
    }
    c->vetted(c);
}

/*
 * SPEC §11 at creation: unless private sinks are allowed, every address the
 * url's host resolves to must be public.  Runs `next` (now or from the DNS
 * callback) when the destination is acceptable; otherwise answers.
 */
static void vet_destination(struct subs_call *c, const char *url, subs_step next) {
    struct hub *hub = c->call.hub;
    struct hub_url u;
    struct sockaddr_storage ss;
    char host[sizeof(u.host)];
    size_t hl;
    struct addrinfo hints;
    struct subs_resolve *rs;
    int rc;

    if (hub->cfg.allow_private_sinks) {
        next(c);
        return;
    }
    if (hub_url_parse(url, &u) != 0) {
        send_url_error(c->call.req, "is not a valid URL");
        return;
    }
    /* an IP literal is vetted as it is, without DNS */
    hl = strlen(u.host);
    if (hl >= 2 && u.host[0] == '[' && u.host[hl - 1] == ']') {
        memcpy(host, u.host + 1, hl - 2);
        host[hl - 2] = '\0';
    } else {
        memcpy(host, u.host, hl + 1);
    }
    memset(&ss, 0, sizeof(ss));
    if (uv_ip4_addr(host, u.port, (struct sockaddr_in *)&ss) == 0 ||
        uv_ip6_addr(host, u.port, (struct sockaddr_in6 *)&ss) == 0) {
        if (hub_netguard_blocked((const struct sockaddr *)&ss)) {
            send_url_error(c->call.req, SSRF_MESSAGE);
            return;
        }
        next(c);
        return;
    }
    rs = calloc(1, sizeof(*rs));
    if (rs == NULL) {
        hub_api_send_oom(c->call.req);
        return;
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rs->req.data = rs;
    rs->owner = c;
    c->vetted = next;
    rc = uv_getaddrinfo(hub->loop, &rs->req, resolve_done, host, NULL, &hints);
    if (rc != 0) {
        free(rs);
        hub_log(HUB_WARN, "cannot start a DNS lookup", HUB_LS("error", uv_strerror(rc)));
        hub_api_send_problem(c->call.req, 503, "cannot resolve the destination host now", NULL);
        return;
    }
    c->resolve = rs;
}

/* ============================================================= probes ====== */

static void probe_free(struct subs_probe *p) {
    free(p->tenant_id);
    free(p->url);
    free(p->headers_sealed);
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
        hub_api_send_db_error(req, out);
        return;
    }
    r = out->results[0];
    if (r == NULL || PQntuples(r) == 0) {
        hub_api_send_problem(req, 409,
                             "the subscription was changed or deleted during verification; "
                             "retry",
                             NULL);
        return;
    }
    obj = subs_load(p->hub, PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0), NULL, 0);
    if (obj == NULL || json_object_set_new(obj, "verification", probe_outcome_json(p)) != 0) {
        json_decref(obj);
        hub_api_send_problem(req, 500, "malformed object from the database", NULL);
        return;
    }
    hub_api_send_json(req, 200, obj);
    json_decref(obj);
}

static void probe_recorded(void *arg, const struct hub_pg_outcome *out) {
    struct subs_probe *p = arg;

    if (p->mode == PROBE_VERIFY) {
        probe_answer(p, out);
    } else if (out->status != HUB_PG_OK) {
        hub_log(HUB_WARN, "cannot record a verification outcome", HUB_LS("tenant", p->tenant_id),
                HUB_LS("subscription", p->sub_id), HUB_LS("error", out->error));
    } else if (out->results[0] == NULL || PQntuples(out->results[0]) == 0) {
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
    if (hub->pg == NULL || (txn = hub_pg_txn_new(hub->pg, probe_recorded, p)) == NULL) {
        if (p->mode == PROBE_VERIFY) {
            probe_answer(p, NULL);
        }
        probe_free(p);
        return;
    }
    if (p->mode == PROBE_VERIFY) {
        char audit[64];
        snprintf(audit, sizeof(audit), "{\"ok\":%s,\"status\":%ld}", okv, p->status);
        hub_pg_txn_add(txn, &hub_sql_subs_verify_result, 5,
                       (const char *[]){p->tenant_id, p->sub_id, okv, p->url, audit}, NULL, NULL);
    } else {
        hub_pg_txn_add(txn, &hub_sql_subs_probe_result, 4,
                       (const char *[]){p->sub_id, okv, p->url, p->headers_sealed}, NULL, NULL);
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

static void probe_http_done(void *arg, const struct hub_httpc_response *res) {
    struct subs_probe *p = arg;
    char why[160];

    if (res->error == HUB_HTTPC_INTERNAL) {
        probe_abandon(p, res->error_text != NULL ? res->error_text : "internal");
        return;
    }
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
    const char *headers_sealed;
    const json_t *headers; /* plaintext, or NULL */
    const struct hub_sign_key *keys;
    size_t nkeys;
};

/*
 * Sends a verification probe (SPEC §6): a signed POST of
 * {"challenge":"<random>"} with the headers of a delivery.  The outcome is
 * recorded (and /verify answered) from the HTTP callback; a request that
 * cannot even start is abandoned (probe_abandon).  hub->httpc must be set.
 * Returns 0, or -1 after answering 500 (out of memory; nothing started).
 */
static int probe_start(struct hub *hub, const struct probe_args *a) {
    struct subs_probe *p = calloc(1, sizeof(*p));
    unsigned char raw[CHALLENGE_RAW];
    char event_uuid[HUB_UUID_TEXT_SIZE], event_id[8 + HUB_UUID_TEXT_SIZE], ce_time[64];
    json_t *body_json = NULL;
    char *body = NULL;
    struct hub_webhook_headers hdrs = {0};
    struct hub_webhook_event ev;
    struct hub_webhook_target t;
    struct hub_httpc_request hr;
    int oom = 0;

    if (p == NULL) {
        goto fail;
    }
    p->hub = hub;
    p->mode = a->mode;
    p->tenant_id = hub_api_strdup(a->tenant_id, &oom);
    p->url = hub_api_strdup(a->url, &oom);
    p->headers_sealed = hub_api_strdup(a->headers_sealed, &oom);
    snprintf(p->sub_id, sizeof(p->sub_id), "%s", a->sub_id);
    if (oom || RAND_bytes(raw, sizeof(raw)) != 1 || hub_uuid7_text(p->delivery_id) != 0 ||
        hub_uuid7_text(event_uuid) != 0) {
        goto fail;
    }
    hub_base64url(raw, sizeof(raw), p->challenge);
    snprintf(event_id, sizeof(event_id), "verify-%s", event_uuid);
    body_json = json_pack("{s:s}", "challenge", p->challenge);
    body = body_json != NULL ? json_dumps(body_json, JSON_COMPACT) : NULL;
    if (body == NULL) {
        goto fail;
    }
    memset(&ev, 0, sizeof(ev));
    ev.id = event_id;
    ev.source = PROBE_CE_SOURCE;
    ev.type = PROBE_CE_TYPE;
    ev.event_type = PROBE_EVENT_TYPE;
    ev.content_type = "application/json";
    memset(&t, 0, sizeof(t));
    t.unix_s = now_rfc3339(ce_time, sizeof(ce_time));
    ev.time = ce_time;
    t.tenant_id = a->tenant_id;
    t.subscription_id = a->sub_id;
    t.delivery_id = p->delivery_id;
    t.attempt = 1;
    t.keys = a->keys;
    t.nkeys = a->nkeys;
    t.dest_headers = a->headers;
    if (hub_webhook_build_headers(&ev, &t, body, strlen(body), &hdrs) != 0) {
        goto fail;
    }
    memset(&hr, 0, sizeof(hr));
    hr.url = a->url;
    hr.headers = (const char *const *)hdrs.lines;
    hr.body = body;
    hr.body_len = strlen(body);
    hr.timeout_ms = hub->cfg.delivery_timeout_ms;
    hr.connect_timeout_ms = PROBE_CONNECT_TIMEOUT_MS;
    if (a->mode == PROBE_VERIFY && a->owner != NULL) {
        p->owner = a->owner;
        a->owner->probe = p;
    }
    /* the module copies the request: the lines (credentials) go at once */
    if (hub_httpc_post(hub->httpc, &hr, probe_http_done, p) != 0) {
        hub_webhook_headers_free(&hdrs);
        free(body);
        json_decref(body_json);
        probe_abandon(p, "the request could not be started");
        return 0;
    }
    hub_webhook_headers_free(&hdrs);
    free(body);
    json_decref(body_json);
    return 0;

fail:
    hub_webhook_headers_free(&hdrs);
    free(body);
    json_decref(body_json);
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
 * Opens the sealed secrets and headers of a subscription row (columns col to
 * col + 4: url, sealed headers, sealed secret, previous sealed secret, whether
 * the previous one still signs) and sends the probe of the given mode.
 * Returns 0, or -1 when they do not open (no KEK, or another one sealed
 * them): then nothing is sent.
 */
static int probe_row(struct subs_call *c, PGresult *r, int col, enum probe_mode mode) {
    struct hub *hub = c->call.hub;
    struct hub_sign_key keys[HUB_WEBHOOK_MAX_KEYS];
    size_t nkeys = 0;
    json_t *headers = NULL;
    const char *hs = PQgetisnull(r, 0, col + 1) ? NULL : PQgetvalue(r, 0, col + 1);
    const char *prev = PQgetisnull(r, 0, col + 3) ? NULL : PQgetvalue(r, 0, col + 3);
    struct probe_args a;

    if (!hub->has_kek ||
        hub_webhook_open_keys(&hub->kek, c->object_id, PQgetvalue(r, 0, col + 2), prev,
                           PQgetvalue(r, 0, col + 4)[0] == 't', keys, &nkeys) != 0 ||
        hub_webhook_open_headers(&hub->kek, c->object_id, hs, &headers) != 0) {
        OPENSSL_cleanse(keys, sizeof(keys));
        return -1;
    }
    memset(&a, 0, sizeof(a));
    a.mode = mode;
    a.owner = mode == PROBE_VERIFY ? c : NULL;
    a.tenant_id = c->tenant_id;
    a.sub_id = c->object_id;
    a.url = PQgetvalue(r, 0, col);
    a.headers_sealed = hs;
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

/* Starts the background probe after a url change (row: patch statement,
 * url in column 2). */
static void probe_after_patch(struct subs_call *c, PGresult *r) {
    if (probe_row(c, r, 2, PROBE_BACKGROUND) != 0) {
        hub_log(HUB_ERROR, "cannot open a subscription's secrets to probe it (KEK?)",
                HUB_LS("tenant", c->tenant_id), HUB_LS("subscription", c->object_id));
    }
}

/* ======================================================== idempotency ====== */

static void idem_lookup(struct subs_call *c);
static void create_vet(struct subs_call *c);
static void rotate_execute(struct subs_call *c);

/* What runs when no response is stored under the key. */
static void idem_proceed(struct subs_call *c) {
    if (c->op == OP_SUB_CREATE) {
        create_vet(c);
    } else {
        rotate_execute(c);
    }
}

/* Runs a create or a rotation (op names it in the idempotency record): after
 * the lookup of its Idempotency-Key when the request has one, at once
 * otherwise. */
static void idem_start(struct subs_call *c, h2o_iovec_t key, const char *op) {
    if (idem_prepare(c, key, op) != 0) {
        hub_api_send_oom(c->call.req);
    } else if (c->idem_key != NULL) {
        idem_lookup(c);
    } else {
        idem_proceed(c);
    }
}

/* Replays a stored response: the same status and object, the secret opened
 * from its sealed copy. */
static void idem_replay(struct subs_call *c, int status, const char *text, size_t len) {
    h2o_req_t *req = c->call.req;
    json_t *obj = json_loadb(text, len, 0, NULL);
    const char *marker = json_string_value(json_object_get(obj, "_req"));

    if (obj == NULL) {
        hub_api_send_problem(req, 500, "malformed stored response", NULL);
        return;
    }
    if (marker == NULL || strcmp(marker, c->idem_req) != 0) {
        json_decref(obj);
        hub_api_send_problem(req, 409,
                             "this Idempotency-Key was already used for a different request", NULL);
        return;
    }
    if (subs_render(c->call.hub, obj, NULL, 1) != 0) {
        json_decref(obj);
        hub_api_send_problem(req, 500, "malformed stored response", NULL);
        return;
    }
    hub_api_add_header(req, "idempotent-replayed", "true");
    hub_api_send_json(req, status, obj);
    json_decref(obj);
}

static void idem_looked(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct subs_call *c = (struct subs_call *)call;
    PGresult *r = out->results[1];

    if (out->status != HUB_PG_OK || r == NULL) {
        hub_api_send_db_error(call->req, out);
        return;
    }
    if (PQntuples(r) == 1) {
        idem_replay(c, atoi(PQgetvalue(r, 0, 0)), PQgetvalue(r, 0, 1),
                    (size_t)PQgetlength(r, 0, 1));
        return;
    }
    if (c->relooked) {
        hub_api_send_problem(call->req, 409,
                             "a concurrent request with this Idempotency-Key did not complete",
                             NULL);
        return;
    }
    idem_proceed(c);
}

static void idem_lookup(struct subs_call *c) {
    struct hub_pg_txn *txn = hub_api_call_txn(&c->call, idem_looked);

    if (txn == NULL) {
        return;
    }
    hub_pg_txn_add(txn, &hub_sql_admin_idem_purge, 0, NULL, NULL, NULL);
    hub_pg_txn_add(txn, &hub_sql_admin_idem_lookup, 2, (const char *[]){c->idem_scope, c->idem_key},
                   NULL, NULL);
    hub_api_call_submit(&c->call, txn);
}

/* A unique violation on the idempotency record: a concurrent request with
 * our key won; replay its response.  Returns 1 when handled. */
static int idem_collided(struct subs_call *c, const struct hub_pg_outcome *out) {
    if (out->status == HUB_PG_ESTMT && strcmp(out->sqlstate, "23505") == 0 && c->idem_key != NULL &&
        !c->relooked) {
        c->relooked = 1;
        idem_lookup(c);
        return 1;
    }
    return 0;
}

/* ============================================================ create ======= */

/*
 * The subscription row a create or a rotation returned (the statement after
 * the idempotency record's when there is one).  Returns NULL after having
 * answered: a collision on the Idempotency-Key replays the other request's
 * answer, a failure is a database error, no row is `status` with `missing`.
 */
static PGresult *idem_written(struct subs_call *c, const struct hub_pg_outcome *out, int status,
                              const char *missing) {
    PGresult *r = out->results[c->idem_key != NULL ? 1 : 0];

    if (out->status != HUB_PG_OK) {
        if (!idem_collided(c, out)) {
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

static void create_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct subs_call *c = (struct subs_call *)call;
    PGresult *r = idem_written(c, out, 500, "the subscription was not stored");
    struct hub_sign_key key;
    char location[sizeof(SUBS_PATH) + HUB_UUID_TEXT_SIZE + 1];

    if (r == NULL) {
        return;
    }
    hub_log(HUB_INFO, "subscription created", HUB_LS("tenant", c->tenant_id),
            HUB_LS("subscription", c->object_id));
    /* the probe first: nothing of c is touched once the answer is sent */
    if (hub_secret_key(c->secret, key.key, &key.len) == 0) {
        struct probe_args a;
        memset(&a, 0, sizeof(a));
        a.mode = PROBE_BACKGROUND;
        a.tenant_id = c->tenant_id;
        a.sub_id = c->object_id;
        a.url = c->in.url;
        a.headers_sealed = c->in.headers_sealed;
        a.headers = c->in.headers;
        a.keys = &key;
        a.nkeys = 1;
        probe_background(call->hub, &a);
    }
    OPENSSL_cleanse(&key, sizeof(key));
    snprintf(location, sizeof(location), SUBS_PATH "/%s", c->object_id);
    hub_api_add_header(call->req, "location", location);
    send_subscription(c, 201, r, c->secret);
}

/* Seals text under the KEK bound to the subscription id.  NULL on failure. */
static char *seal_text(struct hub *hub, const char *text, const char *id) {
    return hub_seal(&hub->kek, text, strlen(text), id);
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

static void create_execute(struct subs_call *c) {
    struct hub *hub = c->call.hub;
    char id[HUB_UUID_TEXT_SIZE];
    struct hub_pg_txn *txn;
    int oom = 0;

    if (hub_uuid7_text(id) != 0 || hub_secret_generate(c->secret, sizeof(c->secret)) != 0) {
        hub_log(HUB_ERROR, "cannot generate a subscription id or secret (CSPRNG)");
        hub_api_send_problem(c->call.req, 500, "cannot generate a secret", NULL);
        return;
    }
    c->object_id = hub_api_strdup(id, &oom);
    if (oom || (c->secret_sealed = seal_text(hub, c->secret, id)) == NULL || seal_headers(c) != 0) {
        hub_log(HUB_ERROR, "cannot seal a subscription secret");
        hub_api_send_problem(c->call.req, 500, "cannot seal the secret", NULL);
        return;
    }
    txn = hub_api_call_txn(&c->call, create_done);
    if (txn == NULL) {
        return;
    }
    if (c->idem_key != NULL) {
        /* an expired record of this key would make the insert collide */
        hub_pg_txn_add(txn, &hub_sql_admin_idem_forget_stale, 2,
                       (const char *[]){c->idem_scope, c->idem_key}, NULL, NULL);
    }
    hub_pg_txn_add(txn, &hub_sql_subs_create, 15,
                   (const char *[]){c->object_id, c->tenant_id, c->in.event_types,
                                    c->in.schema_major, c->in.url, c->in.headers_sealed,
                                    c->secret_sealed, c->in.enabled ? "true" : "false",
                                    c->in.retry_schedule, c->in.policy, c->in.ordering,
                                    c->in.max_rate, c->idem_scope ? c->idem_scope : "",
                                    c->idem_req ? c->idem_req : "", c->idem_key},
                   NULL, NULL);
    hub_api_call_submit(&c->call, txn);
}

static void create_vet(struct subs_call *c) {
    vet_destination(c, c->in.url, create_execute);
}

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
    check_input(hub, body, 1, &c->in, &errors, &oom);
    json_decref(body);
    hub_api_idempotency_key(req, &idem, &errors);
    if (errors != NULL) {
        hub_api_send_invalid(req, errors);
        return;
    }
    if (oom) {
        hub_api_send_oom(req);
        return;
    }
    if (!kek_missing(c)) {
        idem_start(c, idem, "create");
    }
}

/* ====================================================== get / list ========= */

static void sub_get_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    PGresult *r = hub_api_found(call->req, out, 0, "subscription not found");

    if (r == NULL) {
        return;
    }
    send_subscription((struct subs_call *)call, 200, r, NULL);
}

/* One statement with (tenant, object id). */
static void run_by_id(struct subs_call *c, const struct hub_sql *sql, hub_api_call_cb cb) {
    struct hub_pg_txn *txn = hub_api_call_txn(&c->call, cb);

    if (txn == NULL) {
        return;
    }
    hub_pg_txn_add(txn, sql, 2, (const char *[]){c->tenant_id, c->object_id}, NULL, NULL);
    hub_api_call_submit(&c->call, txn);
}

static void sub_list_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    if (out->status != HUB_PG_OK || out->results[0] == NULL) {
        hub_api_send_db_error(call->req, out);
        return;
    }
    send_page((struct subs_call *)call, out->results[0], "subscriptions", 1);
}

static void sub_list(struct subs_call *c) {
    h2o_req_t *req = c->call.req;
    struct hub_api_page page;
    json_t *errors = NULL;
    struct hub_pg_txn *txn;
    char limit[16];
    int oom = 0;

    hub_api_page_parse(req, "subscriptions", &page, &errors);
    if (page.after != NULL && !hub_api_uuid_valid(page.after, strlen(page.after))) {
        hub_api_errors_add(&errors, "cursor", "is not a cursor of this list");
    }
    if (errors != NULL) {
        hub_api_send_invalid(req, errors);
        return;
    }
    c->limit = page.limit;
    c->after = hub_api_strdup(page.after, &oom);
    if (oom) {
        hub_api_send_oom(req);
        return;
    }
    txn = hub_api_call_txn(&c->call, sub_list_done);
    if (txn == NULL) {
        return;
    }
    snprintf(limit, sizeof(limit), "%d", c->limit + 1);
    hub_pg_txn_add(txn, &hub_sql_subs_list, 3, (const char *[]){c->tenant_id, c->after, limit},
                   NULL, NULL);
    hub_api_call_submit(&c->call, txn);
}

/* ============================================================= patch ======= */

static void sub_patch_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct subs_call *c = (struct subs_call *)call;
    PGresult *r = hub_api_found(call->req, out, 0, "subscription not found");

    if (r == NULL) {
        return;
    }
    hub_log(HUB_INFO, "subscription updated", HUB_LS("tenant", c->tenant_id),
            HUB_LS("subscription", c->object_id));
    if (PQgetvalue(r, 0, 1)[0] == 't') {
        probe_after_patch(c, r);
    }
    send_subscription(c, 200, r, NULL);
}

static void patch_execute(struct subs_call *c) {
    struct subs_input *in = &c->in;
    struct hub_pg_txn *txn;

    if (in->headers_set && seal_headers(c) != 0) {
        hub_api_send_problem(c->call.req, 500, "cannot seal the destination headers", NULL);
        return;
    }
    txn = hub_api_call_txn(&c->call, sub_patch_done);
    if (txn == NULL) {
        return;
    }
    hub_pg_txn_add(txn, &hub_sql_subs_patch, 16,
                   (const char *[]){c->tenant_id, c->object_id, in->event_types, in->schema_major,
                                    in->url, in->headers_set ? "true" : "false", in->headers_sealed,
                                    in->retry_set ? "true" : "false", in->retry_schedule,
                                    in->policy_set ? "true" : "false", in->policy, in->ordering,
                                    in->max_rate_set ? "true" : "false", in->max_rate,
                                    in->enabled < 0 ? NULL
                                    : in->enabled   ? "true"
                                                    : "false",
                                    in->audit},
                   NULL, NULL);
    hub_api_call_submit(&c->call, txn);
}

/* Audit detail of a PATCH: the names of the members it sets, never values
 * (headers are credentials, a url may carry a token). */
static char *patch_audit(json_t *body) {
    json_t *fields = json_array(), *detail;
    json_t *dest = json_object_get(body, "destination");
    const char *key;
    json_t *v;
    char *text;

    json_object_foreach(body, key, v) {
        if (strcmp(key, "destination") != 0) {
            json_array_append_new(fields, json_string(key));
        }
    }
    if (json_is_object(dest)) {
        json_object_foreach(dest, key, v) {
            char name[64];
            snprintf(name, sizeof(name), "destination.%s", key);
            json_array_append_new(fields, json_string(name));
        }
    }
    detail = json_pack("{s:o}", "fields", fields);
    text = detail != NULL ? json_dumps(detail, JSON_COMPACT) : NULL;
    json_decref(detail);
    return text;
}

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
    check_input(hub, body, 0, &c->in, &errors, &oom);
    if (errors == NULL) {
        c->in.audit = patch_audit(body);
        oom |= c->in.audit == NULL;
    }
    json_decref(body);
    if (errors != NULL) {
        hub_api_send_invalid(req, errors);
        return;
    }
    if (oom) {
        hub_api_send_oom(req);
        return;
    }
    /* new headers are sealed; a new url is probed with the opened secrets */
    if ((c->in.headers_set || c->in.url != NULL) && kek_missing(c)) {
        return;
    }
    if (c->in.url != NULL) {
        vet_destination(c, c->in.url, patch_execute);
    } else {
        patch_execute(c);
    }
}

/* ============================================================ delete ======= */

static void sub_delete_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct subs_call *c = (struct subs_call *)call;
    PGresult *r = hub_api_found(call->req, out, 0, "subscription not found");

    if (r == NULL) {
        return;
    }
    hub_log(HUB_INFO, "subscription deleted", HUB_LS("tenant", c->tenant_id),
            HUB_LS("subscription", c->object_id));
    hub_api_send_no_content(call->req);
}

/* ============================================================ verify ======= */

static void verify_loaded(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct subs_call *c = (struct subs_call *)call;
    PGresult *r = hub_api_found(call->req, out, 0, "subscription not found");

    if (r != NULL && probe_row(c, r, 1, PROBE_VERIFY) != 0) {
        hub_log(HUB_ERROR, "cannot open a subscription's secrets (was the KEK changed?)",
                HUB_LS("tenant", c->tenant_id), HUB_LS("subscription", c->object_id));
        hub_api_send_problem(call->req, 500,
                             "the subscription's secrets do not open with the configured "
                             "STREAMING_HUB_KEK",
                             NULL);
    }
}

/* An action that takes no input accepts no body or an empty JSON object.
 * Returns 1, or 0 after having answered 400 (or 413). */
static int body_absent_or_empty(h2o_req_t *req) {
    static const char *const allowed[] = {NULL};
    json_t *errors = NULL;
    json_t *body;

    if (req->entity.len == 0) {
        return 1;
    }
    body = hub_api_read_json_object(req, HUB_API_MAX_BODY);
    if (body == NULL) {
        return 0;
    }
    hub_api_reject_unknown_members(body, allowed, &errors);
    json_decref(body);
    if (errors != NULL) {
        hub_api_send_invalid(req, errors);
        return 0;
    }
    return 1;
}

static void sub_verify(struct subs_call *c) {
    if (!body_absent_or_empty(c->call.req)) {
        return;
    }
    if (kek_missing(c)) {
        return;
    }
    if (c->call.hub->httpc == NULL) {
        hub_api_send_problem(c->call.req, 503, NO_HTTPC_DETAIL, NULL);
        return;
    }
    run_by_id(c, &hub_sql_subs_probe_load, verify_loaded);
}

/* ============================================================ rotate ======= */

static void rotate_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct subs_call *c = (struct subs_call *)call;
    PGresult *r = idem_written(c, out, 404, "subscription not found");

    if (r == NULL) {
        return;
    }
    hub_log(HUB_INFO, "subscription secret rotated", HUB_LS("tenant", c->tenant_id),
            HUB_LS("subscription", c->object_id), HUB_LI("grace_ms", c->grace_ms));
    send_subscription(c, 200, r, c->secret);
}

static void rotate_execute(struct subs_call *c) {
    struct hub_pg_txn *txn;
    char grace[24], audit[64];

    if (hub_secret_generate(c->secret, sizeof(c->secret)) != 0 ||
        (c->secret_sealed = seal_text(c->call.hub, c->secret, c->object_id)) == NULL) {
        hub_log(HUB_ERROR, "cannot generate or seal a subscription secret");
        hub_api_send_problem(c->call.req, 500, "cannot generate a secret", NULL);
        return;
    }
    txn = hub_api_call_txn(&c->call, rotate_done);
    if (txn == NULL) {
        return;
    }
    snprintf(grace, sizeof(grace), "%lld", (long long)c->grace_ms);
    snprintf(audit, sizeof(audit), "{\"grace_ms\":%lld}", (long long)c->grace_ms);
    if (c->idem_key != NULL) {
        hub_pg_txn_add(txn, &hub_sql_admin_idem_forget_stale, 2,
                       (const char *[]){c->idem_scope, c->idem_key}, NULL, NULL);
    }
    hub_pg_txn_add(txn, &hub_sql_subs_rotate, 8,
                   (const char *[]){c->tenant_id, c->object_id, c->secret_sealed, grace,
                                    c->idem_scope ? c->idem_scope : "", c->idem_key,
                                    c->idem_req ? c->idem_req : "", audit},
                   NULL, NULL);
    hub_api_call_submit(&c->call, txn);
}

static void sub_rotate(struct subs_call *c) {
    static const char *const allowed[] = {"grace", NULL};
    h2o_req_t *req = c->call.req;
    json_t *errors = NULL;
    h2o_iovec_t idem;

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
    hub_api_idempotency_key(req, &idem, &errors);
    if (errors != NULL) {
        hub_api_send_invalid(req, errors);
        return;
    }
    if (!kek_missing(c)) {
        idem_start(c, idem, "rotate");
    }
}

/* ======================================================== deliveries ======= */

static const char *const job_states[] = {"pending", "in_flight", "succeeded",
                                         "dead",    "parked",    NULL};

static void deliv_list_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    PGresult *exists = out->results[0];

    if (out->status != HUB_PG_OK || exists == NULL || out->results[1] == NULL) {
        hub_api_send_db_error(call->req, out);
        return;
    }
    if (PQntuples(exists) == 0) {
        hub_api_send_problem(call->req, 404, "subscription not found", NULL);
        return;
    }
    send_page((struct subs_call *)call, out->results[1], "deliveries", 0);
}

static void deliv_list(struct subs_call *c) {
    h2o_req_t *req = c->call.req;
    struct hub_api_page page;
    json_t *errors = NULL;
    const char *state = NULL;
    struct hub_pg_txn *txn;
    char limit[16];
    int oom = 0, r;

    hub_api_page_parse(req, "deliveries", &page, &errors);
    if (page.after != NULL && !hub_api_positive_id(page.after, strlen(page.after))) {
        hub_api_errors_add(&errors, "cursor", "is not a cursor of this list");
    }
    r = hub_api_query_param(req, "state", &state);
    if (r == 1) {
        int known = 0;
        for (const char *const *s = job_states; *s != NULL; s++) {
            known |= strcmp(state, *s) == 0;
        }
        if (!known) {
            r = -1;
        }
    }
    if (r < 0) {
        hub_api_errors_add(&errors, "state",
                           "must be one of pending, in_flight, succeeded, dead, parked");
    }
    if (errors != NULL) {
        hub_api_send_invalid(req, errors);
        return;
    }
    c->limit = page.limit;
    c->after = hub_api_strdup(page.after, &oom);
    c->state = r == 1 ? hub_api_strdup(state, &oom) : NULL;
    if (oom) {
        hub_api_send_oom(req);
        return;
    }
    txn = hub_api_call_txn(&c->call, deliv_list_done);
    if (txn == NULL) {
        return;
    }
    snprintf(limit, sizeof(limit), "%d", c->limit + 1);
    hub_pg_txn_add(txn, &hub_sql_subs_exists, 2, (const char *[]){c->tenant_id, c->object_id}, NULL,
                   NULL);
    hub_pg_txn_add(txn, &hub_sql_deliveries_list, 5,
                   (const char *[]){c->tenant_id, c->object_id, c->state, c->after, limit}, NULL,
                   NULL);
    hub_api_call_submit(&c->call, txn);
}

static void deliv_get_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    PGresult *r = hub_api_found(call->req, out, 0, "delivery not found");

    if (r == NULL) {
        return;
    }
    send_pg_object(call->req, 200, PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0));
}

static void redeliver_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct subs_call *c = (struct subs_call *)call;
    PGresult *r = out->results[0], *st = out->results[1];
    char detail[128];

    if (out->status != HUB_PG_OK || r == NULL || st == NULL) {
        hub_api_send_db_error(call->req, out);
        return;
    }
    if (PQntuples(r) == 1) {
        hub_log(HUB_INFO, "delivery redelivered on request", HUB_LS("tenant", c->tenant_id),
                HUB_LS("job", c->object_id));
        send_pg_object(call->req, 200, PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0));
        return;
    }
    if (PQntuples(st) == 0) {
        hub_api_send_problem(call->req, 404, "delivery not found", NULL);
        return;
    }
    snprintf(detail, sizeof(detail), "only a dead delivery can be redelivered; this one is %.20s",
             PQgetvalue(st, 0, 0));
    hub_api_send_problem(call->req, 409, detail, NULL);
}

static void deliv_redeliver(struct subs_call *c) {
    struct hub_pg_txn *txn;

    if (!body_absent_or_empty(c->call.req)) {
        return;
    }
    txn = hub_api_call_txn(&c->call, redeliver_done);
    if (txn == NULL) {
        return;
    }
    hub_pg_txn_add(txn, &hub_sql_delivery_redeliver, 2,
                   (const char *[]){c->tenant_id, c->object_id}, NULL, NULL);
    hub_pg_txn_add(txn, &hub_sql_delivery_state, 2, (const char *[]){c->tenant_id, c->object_id},
                   NULL, NULL);
    hub_api_call_submit(&c->call, txn);
}

/* ============================================================ replay ======= */

static void replay_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct subs_call *c = (struct subs_call *)call;
    PGresult *r = out->n_results > 0 ? out->results[0] : NULL;
    json_t *body;
    int64_t events, created, rearmed;

    if (out->status != HUB_PG_OK || r == NULL || PQntuples(r) != 1) {
        hub_api_send_db_error(call->req, out);
        return;
    }
    if (strcmp(PQgetvalue(r, 0, 0), "0") == 0) {
        hub_api_send_problem(call->req, 404, "subscription not found", NULL);
        return;
    }
    if (!PQgetisnull(r, 0, 1)) {
        /* one replay per subscription per REPLAY_INTERVAL_MS */
        hub_api_add_header(call->req, "Retry-After", PQgetvalue(r, 0, 1));
        hub_api_send_problem(call->req, 429,
                             "a replay of this subscription ran moments ago; retry later", NULL);
        return;
    }
    events = atoll(PQgetvalue(r, 0, 2));
    created = atoll(PQgetvalue(r, 0, 3));
    rearmed = atoll(PQgetvalue(r, 0, 4));
    hub_log(HUB_INFO, "subscription replay", HUB_LS("tenant", c->tenant_id),
            HUB_LS("subscription", c->object_id), HUB_LI("events", events),
            HUB_LI("created", created), HUB_LI("rearmed", rearmed));
    body = json_pack(
        "{s:s, s:s, s:s, s:I, s:I, s:I, s:b, s:o}", "subscription_id", c->object_id, "since",
        c->since, "until", c->until, "events", (json_int_t)events, "created", (json_int_t)created,
        "rearmed", (json_int_t)rearmed, "truncated", events >= REPLAY_MAX_EVENTS, "next_since",
        events >= REPLAY_MAX_EVENTS && !PQgetisnull(r, 0, 5) ? json_string(PQgetvalue(r, 0, 5))
                                                             : json_null());
    if (body == NULL) {
        hub_api_send_oom(call->req);
        return;
    }
    hub_api_send_json(call->req, 202, body);
    json_decref(body);
}

/*
 * POST /v1/subscriptions/{id}/replay {"since", "until", "event_types"}: new
 * jobs for the tenant's stored events received in [since, until) that the
 * subscription's event types (or the given ones) and schema major match;
 * jobs that exist already and finished (succeeded or dead) are re-armed,
 * pending ones are left alone.  At most REPLAY_MAX_EVENTS events per call
 * ("truncated" and "next_since" say where to continue), one call per
 * subscription per REPLAY_INTERVAL_MS (429 + Retry-After), audited.
 */
/* A replay bound: an RFC 3339 string PostgreSQL can read back as text once
 * formatted, so not before 0001-01-01 (RFC 3339 allows year 0000, which
 * PostgreSQL's text input refuses).  Returns 1 with *us set, or 0. */
static int replay_time(const json_t *v, int64_t *us) {
    static const int64_t year1_us = INT64_C(-62135596800000000); /* 0001-01-01T00:00:00Z */
    return json_is_string(v) &&
           hub_rfc3339_parse(json_string_value(v), json_string_length(v), us) == 0 &&
           *us >= year1_us;
}

static void sub_replay(struct subs_call *c) {
    static const char *const allowed[] = {"since", "until", "event_types", NULL};
    h2o_req_t *req = c->call.req;
    json_t *errors = NULL, *body, *v;
    int64_t since_us = 0, until_us = 0;
    int oom = 0;
    char interval[24], max[24];
    struct hub_pg_txn *txn;

    body = hub_api_read_json_object(req, HUB_API_MAX_BODY);
    if (body == NULL) {
        return;
    }
    hub_api_reject_unknown_members(body, allowed, &errors);
    v = json_object_get(body, "since");
    if (!replay_time(v, &since_us)) {
        hub_api_errors_add(&errors, "since", "required: an RFC 3339 time from year 1 on");
    }
    v = json_object_get(body, "until");
    if (v == NULL || json_is_null(v)) {
        until_us = hub_unix_us();
    } else if (!replay_time(v, &until_us)) {
        hub_api_errors_add(&errors, "until", "must be an RFC 3339 time from year 1 on");
    }
    if (errors == NULL && since_us >= until_us) {
        hub_api_errors_add(&errors, "until", "must be after since");
    }
    v = json_object_get(body, "event_types");
    if (v != NULL && !json_is_null(v)) {
        check_event_types(v, &c->in, &errors, &oom);
    }
    json_decref(body);
    if (errors != NULL) {
        hub_api_send_invalid(req, errors);
        return;
    }
    if (oom) {
        hub_api_send_oom(req);
        return;
    }
    hub_rfc3339(since_us, 6, c->since, sizeof(c->since));
    hub_rfc3339(until_us, 6, c->until, sizeof(c->until));
    txn = hub_api_call_txn(&c->call, replay_done);
    if (txn == NULL) {
        return;
    }
    snprintf(interval, sizeof(interval), "%d", REPLAY_INTERVAL_MS);
    snprintf(max, sizeof(max), "%d", REPLAY_MAX_EVENTS);
    hub_pg_txn_add(txn, &hub_sql_subs_replay, 7,
                   (const char *[]){c->tenant_id, c->object_id, c->since, c->until,
                                    c->in.event_types, interval, max},
                   NULL, NULL);
    hub_api_call_submit(&c->call, txn);
}

/* ============================================================ routing ====== */

static void subs_authed(struct hub_api_call *call, const char *tenant_id, int status) {
    struct subs_call *c = (struct subs_call *)call;
    h2o_req_t *req = call->req;
    int oom = 0;

    if (hub_api_route_answered(req, status, c->route_status, c->allow,
                               c->op == OP_DELIV_GET || c->op == OP_DELIV_REDELIVER
                                   ? "delivery not found"
                                   : "no such resource")) {
        return;
    }
    c->tenant_id = hub_api_strdup(tenant_id, &oom);
    if (oom) {
        hub_api_send_oom(req);
        return;
    }
    switch (c->op) {
    case OP_SUB_CREATE:
        sub_create(c);
        break;
    case OP_SUB_LIST:
        sub_list(c);
        break;
    case OP_SUB_GET:
        run_by_id(c, &hub_sql_subs_get, sub_get_done);
        break;
    case OP_SUB_PATCH:
        sub_patch(c);
        break;
    case OP_SUB_DELETE:
        run_by_id(c, &hub_sql_subs_delete, sub_delete_done);
        break;
    case OP_SUB_VERIFY:
        sub_verify(c);
        break;
    case OP_SUB_ROTATE:
        sub_rotate(c);
        break;
    case OP_DELIV_LIST:
        deliv_list(c);
        break;
    case OP_DELIV_GET:
        run_by_id(c, &hub_sql_delivery_get, deliv_get_done);
        break;
    case OP_DELIV_REDELIVER:
        deliv_redeliver(c);
        break;
    case OP_SUB_REPLAY:
        sub_replay(c);
        break;
    case OP_NONE:
        hub_api_send_problem(req, 404, "no such resource", NULL);
        break;
    }
}

/* Decides the operation from the method and path segments (s[0] is
 * "subscriptions" or "deliveries"); sets route_status 404/405 otherwise. */
static void route(struct subs_call *c, h2o_iovec_t *s, int n, int *oom) {
    h2o_req_t *req = c->call.req;
    int subs = hub_api_segment_is(s[0], "subscriptions");

#define ROUTE_405(allow_text)                                                                      \
    do {                                                                                           \
        c->route_status = 405;                                                                     \
        c->allow = (allow_text);                                                                   \
        return;                                                                                    \
    } while (0)

    c->route_status = 404;
    if (subs && n == 1) {
        c->route_status = 0;
        if (hub_api_method_get(req)) {
            c->op = OP_SUB_LIST;
        } else if (hub_api_method_is(req, "POST")) {
            c->op = OP_SUB_CREATE;
        } else {
            ROUTE_405("GET, HEAD, POST");
        }
        return;
    }
    if (n < 2 || n > 3) {
        return;
    }
    if (subs) {
        const char *allow;
        if (n == 2) {
            allow = "GET, HEAD, PATCH, DELETE";
            c->op = hub_api_method_get(req)            ? OP_SUB_GET
                    : hub_api_method_is(req, "PATCH")  ? OP_SUB_PATCH
                    : hub_api_method_is(req, "DELETE") ? OP_SUB_DELETE
                                                       : OP_NONE;
        } else if (hub_api_segment_is(s[2], "verify")) {
            allow = "POST";
            c->op = hub_api_method_is(req, "POST") ? OP_SUB_VERIFY : OP_NONE;
        } else if (hub_api_segment_is(s[2], "rotate-secret")) {
            allow = "POST";
            c->op = hub_api_method_is(req, "POST") ? OP_SUB_ROTATE : OP_NONE;
        } else if (hub_api_segment_is(s[2], "replay")) {
            allow = "POST";
            c->op = hub_api_method_is(req, "POST") ? OP_SUB_REPLAY : OP_NONE;
        } else if (hub_api_segment_is(s[2], "deliveries")) {
            allow = "GET, HEAD";
            c->op = hub_api_method_get(req) ? OP_DELIV_LIST : OP_NONE;
        } else {
            return;
        }
        if (c->op == OP_NONE) {
            ROUTE_405(allow);
        }
        if (!hub_api_uuid_valid(s[1].base, s[1].len)) {
            return; /* 404: an id that cannot exist */
        }
        c->object_id = dup_uuid_lower(s[1], oom);
        c->route_status = 0;
        return;
    }
    /* deliveries */
    if (n == 2) {
        if (!hub_api_method_get(req)) {
            ROUTE_405("GET, HEAD");
        }
        c->op = OP_DELIV_GET;
    } else if (hub_api_segment_is(s[2], "redeliver")) {
        if (!hub_api_method_is(req, "POST")) {
            ROUTE_405("POST");
        }
        c->op = OP_DELIV_REDELIVER;
    } else {
        return;
    }
    if (!hub_api_positive_id(s[1].base, s[1].len)) {
        return; /* job ids are bigint: anything else is not found */
    }
    c->object_id = hub_api_strndup(s[1].base, s[1].len, oom);
    c->route_status = 0;
#undef ROUTE_405
}

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
