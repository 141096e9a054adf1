/*
 * api_subs_input — what a subscription request may contain (see
 * api_subs_internal.h): the members of a create or PATCH body, checked
 * completely in memory before anything reaches the database, and the
 * destination's SSRF vetting (SPEC §11), the one check that needs the
 * network (a DNS lookup on the loop).
 *
 * Validation reports every offending member at once ({"field", "message"}
 * entries, api_util.h), so a client fixes a request in one round trip.
 * Plaintext destination headers are credentials: they are kept only in
 * subs_input.headers, wiped by hub_subs_input_free, never logged.
 *
 * Valid members are kept in struct subs_input as the text the statements
 * take (JSON array text, decimal numbers, "true"/"false" decided by the
 * route), so a route passes them straight as parameters; a member that was
 * not given stays NULL (or -1), which the statements read as "unchanged".
 */
#include "api_subs_internal.h"

#include <math.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backoff.h"
#include "hub.h"
#include "log.h"
#include "netguard.h"
#include "policy.h"
#include "util.h"
#include "webhook.h"

#define EVENT_TYPES_MAX 64
#define EVENT_TYPE_LEN_MAX 256
#define URL_LEN_MAX 2048
#define HEADERS_MAX 32
#define HEADER_VALUE_MAX 4096

#define EVENT_TYPE_RULE                                                                            \
    "must be an event type (no control characters, no '*'), <resource>.* with a one-segment "      \
    "resource, or *"
#define HEADER_VALUE_RULE                                                                          \
    "must be a non-empty string of at most 4096 bytes without control characters"

/* A DNS lookup of the SSRF vetting.  It runs on libuv's thread pool and
 * always ends in its callback, so it is an object of its own that outlives
 * its call if need be (the call's on_free severs the link). */
struct subs_resolve {
    uv_getaddrinfo_t req;
    struct subs_call *owner;   /* NULL once the call is gone */
    struct vet_tenant *tenant; /* its count of lookups running */
};

/*
 * Lookups running, per tenant and in the process.  libuv runs them on at
 * most half of its thread pool (UV_THREADPOOL_SIZE, which main.c raises to
 * 16 unless set: 8 at once), first come first served, and one that hangs
 * (a name in a zone whose servers never answer) holds its thread for the
 * resolver's timeouts, 10 s and more: without a bound, one tenant's names
 * queued every other tenant's subscription changes behind them.  The
 * process runs at most as many as libuv has threads for (vet_cap), so a
 * lookup admitted never queues; a tenant runs one, and a second only while
 * fewer than half of those run.  So a tenant with none running finds room
 * unless that many tenants' lookups hang at once; past the bounds a
 * lookup is refused with 503 and Retry-After.  A slot is held until its
 * lookup ends, also when its client has gone.
 */
#define VET_SLOTS 64
struct vet_tenant {
    int running;
    char id[HUB_API_TENANT_ID_MAX + 1];
};
static struct vet_tenant vet_tenants[VET_SLOTS]; /* loop thread only */
static int vet_running;

/* The lookups libuv runs at once: half its pool, as libuv sizes the pool
 * (1 to 1024 threads, 4 by default; up to VET_SLOTS). */
static int vet_cap(void) {
    static int cap;
    const char *v;
    int n;

    if (cap == 0) {
        v = getenv("UV_THREADPOOL_SIZE");
        n = v != NULL ? atoi(v) : 4;
        n = n < 1 ? 1 : n > 1024 ? 1024 : n;
        cap = (n + 1) / 2 < VET_SLOTS ? (n + 1) / 2 : VET_SLOTS;
    }
    return cap;
}

/* The tenant's count with room for one more lookup, or NULL when it or the
 * process has none. */
static struct vet_tenant *vet_take(const char *tenant) {
    struct vet_tenant *t = NULL, *free_slot = NULL;
    int cap = vet_cap();

    if (vet_running >= cap || strlen(tenant) >= sizeof(t->id)) {
        return NULL;
    }
    for (int i = 0; i < VET_SLOTS && t == NULL; i++) {
        if (vet_tenants[i].running > 0 && strcmp(vet_tenants[i].id, tenant) == 0) {
            t = &vet_tenants[i];
        } else if (vet_tenants[i].running == 0 && free_slot == NULL) {
            free_slot = &vet_tenants[i];
        }
    }
    if (t == NULL) {
        t = free_slot; /* fewer than cap <= VET_SLOTS run: one is free */
        strcpy(t->id, tenant);
    }
    if (t->running >= 2 || (t->running == 1 && vet_running >= cap / 2)) {
        return NULL;
    }
    t->running++;
    vet_running++;
    return t;
}

static void vet_give(struct vet_tenant *t) {
    t->running--;
    vet_running--;
}

/* ====================================================== the input ====== */

/* The plaintext headers are wiped before they are freed (credentials); the
 * other members hold nothing secret.  The sealed headers are ciphertext. */
void hub_subs_input_free(struct subs_input *in) {
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

/* STREAMING_HUB_ENV=production tightens what a destination may be
 * (https only, SPEC §11). */
static int env_production(const struct hub *hub) {
    return hub->cfg.env != NULL && strcmp(hub->cfg.env, "production") == 0;
}

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

/*
 * The event_types member: 1..64 valid, distinct entries (event_type_error).
 * Kept as compact JSON array text, the form the statements take
 * (store_subs.h); an invalid array keeps nothing, so *in never holds half
 * of a member.
 */
void hub_subs_check_event_types(json_t *v, struct subs_input *in, json_t **errors, int *oom) {
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
        /* quadratic, but over at most EVENT_TYPES_MAX entries; a duplicate
         * would make the subscription match one event type twice */
        for (size_t j = 0; j < i; j++) {
            if (json_equal(e, json_array_get(v, j))) {
                hub_api_errors_add(errors, field, "is a duplicate");
                bad = 1;
                break;
            }
        }
    }
    /* kept in the client's order: the object shows it back as written */
    if (!bad) {
        in->event_types = json_dumps(v, JSON_COMPACT);
        if (in->event_types == NULL) {
            *oom = 1;
        }
    }
}

/* schema_major: an integer from 1 to 2^31 - 1 (the column is an int),
 * kept as decimal text for the statement. */
static void check_schema_major(json_t *v, struct subs_input *in, json_t **errors, int *oom) {
    char num[24];

    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 2147483647) {
        hub_api_errors_add(errors, "schema_major", "must be an integer >= 1");
        return;
    }
    snprintf(num, sizeof(num), "%lld", (long long)json_integer_value(v));
    in->schema_major = hub_api_strdup(num, oom);
}

/*
 * destination.url: an absolute http(s) URL that hub_url_parse accepts (no
 * credentials, no fragment), at most URL_LEN_MAX bytes, https in
 * production.  Only the syntax here: where it resolves is
 * hub_subs_vet_destination's job, after validation.
 */
static void check_url(struct hub *hub, json_t *v, struct subs_input *in, json_t **errors,
                      int *oom) {
    struct hub_url u;
    const char *s = json_string_value(v);

    /* strlen differs from the JSON length when the string holds a NUL */
    if (s == NULL || json_string_length(v) == 0 || json_string_length(v) > URL_LEN_MAX ||
        strlen(s) != json_string_length(v) || hub_url_parse(s, &u) != 0) {
        hub_api_errors_add(errors, "destination.url",
                           "must be an absolute http(s) URL of at most 2048 characters, "
                           "without credentials or fragment");
        return;
    }
    /* http stays allowed outside production, for local sinks */
    if (env_production(hub) && strcmp(u.scheme, "https") != 0) {
        hub_api_errors_add(errors, "destination.url", "must use https in production");
        return;
    }
    in->url = hub_api_strdup(s, oom);
}

/*
 * destination.headers: null (none) or an object of at most HEADERS_MAX
 * headers, each a valid, non-reserved name (webhook.h) with a non-empty
 * value free of control bytes.  Kept as a deep copy of the plaintext,
 * sealed later under the subscription id (which a create does not know
 * yet).  headers_set records that the member was given, even as null.
 */
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
        /* the name in the error is cut at the longest valid one: a longer
         * name is refused anyway, and an error must not echo a megabyte */
        snprintf(field, sizeof(field), "destination.headers.%.*s", HUB_WEBHOOK_HEADER_NAME_MAX,
                 name);
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
        /* a value that could split or fold a header line never reaches one */
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
    /* {} is stored as no headers: NULL here, like null */
    if (!bad && json_object_size(v) > 0) {
        in->headers = json_deep_copy(v);
        if (in->headers == NULL) {
            *oom = 1;
        }
    }
}

/* destination: {"kind": "webhook", "url", "headers"}.  A create needs kind
 * and url; a PATCH may give any of them alone. */
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
    /* unknown members are named by their path, "destination.x" */
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

/*
 * retry_schedule: null (the hub's default schedule) or 1..12 durations,
 * each in (0, 10h], that together form a schedule the backoff module
 * accepts.  Kept as JSON array text; retry_set records that it was given.
 */
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
    /* the schedule as a whole only once each step is fine: the steps'
     * errors are the ones a client can act on */
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

/* policy: null (none) or the name of a policy this process has loaded
 * (SPEC §8).  policy_set records that it was given. */
static void check_policy(struct hub *hub, json_t *v, struct subs_input *in, json_t **errors,
                         int *oom) {
    in->policy_set = 1;
    if (json_is_null(v)) {
        return;
    }
    const char *why = NULL;
    /* the name's syntax first: a malformed name is told the rule, not
     * merely "unknown policy" */
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

/* max_rate: null (no limit) or deliveries per second above 0, kept as
 * decimal text for the statement's float8. */
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
    /* an integer as written (%.17g would round a huge one); a real as
     * %.17g, whose text reads back as the very same double */
    if (json_is_integer(v)) {
        snprintf(num, sizeof(num), "%lld", (long long)json_integer_value(v));
    } else {
        snprintf(num, sizeof(num), "%.17g", d);
    }
    in->max_rate = hub_api_strdup(num, oom);
}

/*
 * Validates a create (create = 1) or PATCH body into *in (the contract is
 * in api_subs_internal.h).  Every member is checked even after an error,
 * so that one 400 lists them all.  A create fills the defaults of SPEC §6
 * (schema_major 1, ordering "unordered", enabled true); a PATCH leaves what
 * was not given NULL or -1, which the statement reads as "unchanged".
 */
void hub_subs_check_input(struct hub *hub, json_t *body, int create, struct subs_input *in,
                          json_t **errors, int *oom) {
    static const char *const allowed[] = {"event_types",    "schema_major", "destination",
                                          "retry_schedule", "policy",       "ordering",
                                          "max_rate",       "enabled",      NULL};
    const char *key;
    json_t *v;

    /* -1: not given (a PATCH keeps the current value) */
    in->enabled = -1;
    /* read-only members (id, verification_state, ...) are refused by name
     * like unknown ones: a client learns that its change did not apply */
    json_object_foreach(body, key, v) {
        int known = 0;
        for (const char *const *a = allowed; *a != NULL; a++) {
            known |= strcmp(key, *a) == 0;
        }
        if (!known) {
            hub_api_errors_add(errors, key, "unknown or read-only member");
        }
    }
    /* event_types and destination have no default: they say what to
     * deliver, and where */
    if ((v = json_object_get(body, "event_types")) != NULL) {
        hub_subs_check_event_types(v, in, errors, oom);
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
    /* ordering and enabled are simple enough to check in line */
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

/* Audit detail of a PATCH: the names of the members it sets, never values
 * (headers are credentials, a url may carry a token).  Called only on a
 * body that passed validation, so every name is one of ours. */
char *hub_subs_patch_audit(json_t *body) {
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
    /* destination's members one by one: the audit says which part changed */
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

/* An action that takes no input (verify, redeliver) accepts no body or an
 * empty JSON object (clients that always send "{}" work), and an optional
 * Idempotency-Key, read into *idem (len 0: none).  Returns 1, or 0 after
 * having answered 400 (or 413). */
int hub_subs_action_input(h2o_req_t *req, h2o_iovec_t *idem) {
    static const char *const allowed[] = {NULL};
    json_t *errors = NULL;
    json_t *body;

    /* no body at all is the common case: nothing to parse */
    if (req->entity.len != 0) {
        body = hub_api_read_json_object(req, HUB_API_MAX_BODY);
        if (body == NULL) {
            return 0;
        }
        hub_api_reject_unknown_members(body, allowed, &errors);
        json_decref(body);
    }
    if (errors == NULL) {
        hub_api_idem_read_key(req, idem, &errors);
    }
    if (errors != NULL) {
        hub_api_send_invalid(req, errors);
        return 0;
    }
    return 1;
}

/* ========================================================= SSRF vetting == */

/* The 400 of a destination that is not public, and of a host name that
 * does not resolve: one text, so that a tenant learns nothing of the names
 * inside the network (an internal name that exists read differently from
 * one that does not).  It names the setting, so that an operator testing
 * against a local sink knows what to change. */
#define SSRF_MESSAGE                                                                               \
    "does not resolve, or resolves to a loopback, private, link-local or otherwise non-public "    \
    "address (STREAMING_HUB_ALLOW_PRIVATE_SINKS is false)"

/* 400 with one error on destination.url. */
static void send_url_error(h2o_req_t *req, const char *message) {
    json_t *errors = NULL;
    hub_api_errors_add(&errors, "destination.url", message);
    hub_api_send_invalid(req, errors);
}

/*
 * The lookup's outcome (libuv callback, loop thread).  Refused when ANY
 * address is blocked, not only the first: the connection may use any of
 * them.  A name that does not exist (or has no A/AAAA record) is the
 * client's mistake, 400 as a blocked one is (SSRF_MESSAGE); any other
 * failure is the resolver's, 503.  The lookup object and its slot are
 * given back here whoever still waits.
 */
static void resolve_done(uv_getaddrinfo_t *r, int status, struct addrinfo *res) {
    struct subs_resolve *rs = r->data;
    struct subs_call *c = rs->owner;
    int blocked = 0, usable = 0;

    /* counted before the status is looked at: res is freed right after */
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
    vet_give(rs->tenant);
    free(rs);
    /* a call that still owns the lookup is alive, and so is its request:
     * the call is freed when the request goes, as nothing is in flight */
    if (c == NULL) {
        return; /* the request is gone */
    }
    c->resolve = NULL;
    if (status == UV_EAI_NONAME || status == UV_EAI_NODATA || (status == 0 && usable == 0)) {
        send_url_error(c->call.req, SSRF_MESSAGE);
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
 * Deliveries and probes check again when they connect (SPEC §11: the vetted
 * address is pinned); this check refuses a bad destination at once, with
 * an error the client can act on.
 */
void hub_subs_vet_destination(struct subs_call *c, const char *url, subs_step next) {
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
    /* an IP literal is vetted as it is, without a DNS lookup (and its
     * round trip through libuv's thread pool); brackets off for IPv6 */
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
    if ((rs->tenant = vet_take(c->tenant_id)) == NULL) {
        free(rs);
        h2o_add_header(&c->call.req->pool, &c->call.req->res.headers, H2O_TOKEN_RETRY_AFTER, NULL,
                       H2O_STRLIT("1"));
        hub_api_send_problem(c->call.req, 503,
                             "too many destination host lookups are in progress; retry later",
                             NULL);
        return;
    }
    /* both families: the connection may use either */
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rs->req.data = rs;
    rs->owner = c;
    /* the weak link both ways: the lookup knows its call until the call
     * goes (hub_subs_vet_detach), the call its lookup until it ends */
    c->vetted = next;
    rc = uv_getaddrinfo(hub->loop, &rs->req, resolve_done, host, NULL, &hints);
    if (rc != 0) {
        vet_give(rs->tenant);
        free(rs);
        hub_log(HUB_WARN, "cannot start a DNS lookup", HUB_LS("error", uv_strerror(rc)));
        hub_api_send_problem(c->call.req, 503, "cannot resolve the destination host now", NULL);
        return;
    }
    c->resolve = rs;
}

/* From the call's on_free: the lookup, still running, then finds no owner
 * and only frees itself. */
void hub_subs_vet_detach(struct subs_call *c) {
    if (c->resolve != NULL) {
        c->resolve->owner = NULL;
        c->resolve = NULL;
    }
}
