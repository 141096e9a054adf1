/*
 * webhook — the delivery request of SPEC §7.2 (see webhook.h).
 *
 * Three parts: the header set of one request (hub_webhook_build_headers,
 * with the verification probe built on it), the rules for destination
 * header names, and opening what a subscription keeps sealed (secrets,
 * destination headers).  Everything is pure computation on the caller's
 * thread; the only state is the caller's.
 *
 * Secrets: header lines may hold destination credentials and are wiped
 * when freed; opened keys and headers belong to the caller, who wipes them
 * (the dispatcher after each attempt, the API after each probe).
 */
#include "webhook.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"
#include "util.h"
#include "uuid.h"

/* The synthetic event of a verification probe (SPEC §6): its own type
 * and the hub as its source, so a receiver tells it from the events it
 * subscribed to. */
#define PROBE_EVENT_TYPE "subscription.verification"
#define PROBE_CE_TYPE "studio.lerian.subscription.verification"
#define PROBE_CE_SOURCE "/streaming-hub"
#define PROBE_CHALLENGE_RAW 24 /* random bytes: base64url gives 32 characters */

/* Names a subscription may never set (see webhook.h): the hub's own
 * headers, those the transport (libcurl) computes, and the hop-by-hop ones
 * that would change how the connection behaves.  The prefixes reserve
 * whole families, present and future. */
static const char *const reserved_exact[] = {
    "traceparent",  "tracestate",        "user-agent", "host",       "content-length",
    "content-type", "transfer-encoding", "connection", "keep-alive", "proxy-connection",
    "te",           "trailer",           "upgrade",    "expect",     NULL,
};
static const char *const reserved_prefix[] = {"x-lerian-", "webhook-", "ce-", NULL};

/* Exact names, then prefixes; case-insensitive, as header names are
 * (RFC 9110 §5.1). */
int hub_webhook_header_reserved(const char *name, size_t len) {
    for (const char *const *p = reserved_exact; *p != NULL; p++) {
        if (strlen(*p) == len && strncasecmp(name, *p, len) == 0) {
            return 1;
        }
    }
    for (const char *const *p = reserved_prefix; *p != NULL; p++) {
        size_t pl = strlen(*p);
        if (len >= pl && strncasecmp(name, *p, pl) == 0) {
            return 1;
        }
    }
    return 0;
}

/* A token (RFC 9110 §5.6.2): no separators, spaces or controls, so a
 * name can neither split a line nor smuggle a second header. */
int hub_webhook_header_name_valid(const char *s, size_t len) {
    return len <= HUB_WEBHOOK_HEADER_NAME_MAX && hub_http_token(s, len);
}

/* The lines being built: grown by doubling, kept NULL-terminated (the
 * shape hub_httpc_request.headers takes); oom sticks once set, so a build
 * checks it once at the end rather than after every line. */
struct line_list {
    char **v;
    size_t n, cap;
    int oom;
};

/* Appends "name: value" (copied). */
static void lines_add(struct line_list *l, const char *name, const char *value) {
    size_t nl = strlen(name), vl = strlen(value);
    char *line;

    if (l->oom) {
        return;
    }
    /* room for the new line and the NULL after it */
    if (l->n + 2 > l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 32;
        char **v = realloc(l->v, cap * sizeof(*v));
        if (v == NULL) {
            l->oom = 1;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    line = malloc(nl + 2 + vl + 1);
    if (line == NULL) {
        l->oom = 1;
        return;
    }
    memcpy(line, name, nl);
    memcpy(line + nl, ": ", 2);
    memcpy(line + nl + 2, value, vl + 1);
    l->v[l->n++] = line;
    l->v[l->n] = NULL;
}

/*
 * CloudEvents HTTP binding §3.1.3.2: space, '"', '%' and every byte outside
 * printable ASCII are percent-encoded (UTF-8 bytes one by one).  Returns a
 * malloc'd string or NULL on OOM.
 */
static char *ce_encode(const char *s) {
    static const char hex[] = "0123456789ABCDEF";
    size_t len = strlen(s);
    char *out = malloc(3 * len + 1), *o = out;

    if (out == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        /* 0x20 included: a space would be trimmed or split by receivers */
        if (c <= 0x20 || c >= 0x7f || c == '"' || c == '%') {
            *o++ = '%';
            *o++ = hex[c >> 4];
            *o++ = hex[c & 0x0f];
        } else {
            *o++ = (char)c;
        }
    }
    *o = '\0';
    return out;
}

/* An event id as X-Lerian-Event-Id and webhook-id carry it: as is when
 * every byte is printable ASCII and it neither starts nor ends with a space,
 * else percent-encoded like ce-id.  Owned, NULL when out of memory. */
static char *id_header_value(const char *id) {
    size_t len = strlen(id);
    int plain = len > 0 && id[0] != ' ' && id[len - 1] != ' ';

    for (size_t i = 0; plain && i < len; i++) {
        plain = (unsigned char)id[i] >= 0x20 && (unsigned char)id[i] < 0x7f;
    }
    /* most ids are plain: the header then reads exactly as the producer's
     * ce-id, which receivers use to deduplicate */
    return plain ? strdup(id) : ce_encode(id);
}

/* Adds "name: <encoded value>". */
static void lines_add_encoded(struct line_list *l, const char *name, const char *value) {
    char *enc;

    if (value == NULL) {
        return; /* absent: stored attributes written around the ingest may lack any */
    }
    enc = ce_encode(value);
    if (enc == NULL) {
        l->oom = 1;
        return;
    }
    lines_add(l, name, enc);
    free(enc);
}

/* Wipes each line before freeing it (credentials), then the array. */
static void lines_wipe(char **v, size_t n) {
    for (size_t i = 0; i < n; i++) {
        OPENSSL_cleanse(v[i], strlen(v[i]));
        free(v[i]);
    }
    free(v);
}

/* Leaves h empty, so a second call is harmless. */
void hub_webhook_extensions(const json_t *attrs, const char **ext, size_t ext_max) {
    static const char *const standard[] = {"specversion",
                                           "id",
                                           "source",
                                           "type",
                                           "time",
                                           "subject",
                                           "dataschema",
                                           "schemaversion",
                                           "datacontenttype",
                                           "tenantid",
                                           "traceparent",
                                           "tracestate"};
    const char *name;
    json_t *value;
    size_t n = 0;

    json_object_foreach((json_t *)attrs, name, value) {
        int is_standard = 0;
        for (size_t k = 0; k < sizeof(standard) / sizeof(standard[0]); k++) {
            is_standard |= strcmp(name, standard[k]) == 0;
        }
        if (!is_standard && json_is_string(value) && n + 2 < ext_max) {
            ext[n++] = name;
            ext[n++] = json_string_value(value);
        }
    }
    ext[n] = NULL;
}

void hub_webhook_headers_free(struct hub_webhook_headers *h) {
    if (h->lines != NULL) {
        lines_wipe(h->lines, h->n);
    }
    h->lines = NULL;
    h->n = 0;
}

/* Standard attributes, which an "extension" may not shadow. */
static int ce_standard_attribute(const char *name) {
    static const char *const std[] = {
        "specversion",   "id",         "source",          "type", "time", "subject", "tenantid",
        "schemaversion", "dataschema", "datacontenttype", NULL};
    for (const char *const *p = std; *p != NULL; p++) {
        if (strcmp(name, *p) == 0) {
            return 1;
        }
    }
    return 0;
}

/* CloudEvents attribute names are [a-z0-9]+ (spec §3.1.1); a stored
 * extension that breaks that, or shadows a standard attribute, is not
 * sent rather than sent under a name a receiver would misread. */
static int ce_extension_name_valid(const char *name) {
    if (name[0] == '\0') {
        return 0;
    }
    for (const char *p = name; *p != '\0'; p++) {
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9'))) {
            return 0;
        }
    }
    return !ce_standard_attribute(name);
}

/*
 * The order is fixed (content, identity, signatures, CloudEvents
 * attributes, trace context, destination headers): the destination's come
 * last and a reserved name is never added, so nothing a subscription sets
 * can shadow a header the hub computed.
 */
int hub_webhook_build_headers(const struct hub_webhook_event *ev,
                              const struct hub_webhook_target *t, const void *body, size_t len,
                              struct hub_webhook_headers *out) {
    char wsig[HUB_SIGN_HEADER_SIZE(HUB_SIGN_WEBHOOK_SIZE, HUB_WEBHOOK_MAX_KEYS)];
    char lsig[HUB_SIGN_HEADER_SIZE(HUB_SIGN_LERIAN_SIZE, HUB_WEBHOOK_MAX_KEYS)];
    char num[32];
    struct line_list l = {0};
    const char *ct = ev->content_type != NULL ? ev->content_type : "application/json";
    char *msg_id = NULL;

    out->lines = NULL;
    out->n = 0;
    if (t->nkeys == 0 || t->nkeys > HUB_WEBHOOK_MAX_KEYS || ev->id == NULL) {
        return HUB_EINVAL;
    }
    /* The signed id is the header value exactly as sent: the ce-id itself
     * (SPEC §7.2) when it is printable ASCII without edge spaces (which a
     * receiver would trim), else its percent-encoding (as in ce-id). */
    msg_id = id_header_value(ev->id);
    if (msg_id == NULL) {
        return HUB_ENOMEM;
    }
    if (hub_sign_headers(t->keys, t->nkeys, msg_id, t->unix_s, body, len, wsig, sizeof(wsig), lsig,
                         sizeof(lsig)) != t->nkeys) {
        free(msg_id);
        return HUB_ECRYPTO;
    }
    /* a stored content type is a validated media type; anything else falls back */
    lines_add(&l, "Content-Type",
              hub_http_value_safe(ct, strlen(ct)) && ct[0] != '\0' ? ct
                                                                   : "application/octet-stream");
    /* identity: who sends, which event, which delivery attempt, for whom */
    lines_add(&l, "User-Agent", "streaming-hub/" HUB_VERSION);
    lines_add(&l, "X-Lerian-Event-Id", msg_id);
    lines_add_encoded(&l, "X-Lerian-Delivery-Id", t->delivery_id);
    lines_add_encoded(&l, "X-Lerian-Event-Type", ev->event_type);
    if (ev->checked_schema_version != NULL) {
        lines_add_encoded(&l, "X-Lerian-Schema-Version", ev->checked_schema_version);
    }
    lines_add_encoded(&l, "X-Lerian-Tenant-Id", t->tenant_id);
    lines_add_encoded(&l, "X-Lerian-Subscription-Id", t->subscription_id);
    snprintf(num, sizeof(num), "%d", t->attempt);
    lines_add(&l, "X-Lerian-Attempt", num);
    snprintf(num, sizeof(num), "%lld", (long long)t->unix_s);
    lines_add(&l, "X-Lerian-Timestamp", num);
    /* both signature schemes over the same id, timestamp and body; with two
     * keys (a rotation's grace) each header has two entries */
    lines_add(&l, "X-Lerian-Signature", lsig);
    lines_add(&l, "webhook-id", msg_id);
    lines_add(&l, "webhook-timestamp", num);
    lines_add(&l, "webhook-signature", wsig);
    /* the event's own attributes (CloudEvents HTTP binding, binary mode):
     * the body is the data, the attributes travel as ce-* headers */
    lines_add(&l, "ce-specversion", "1.0");
    lines_add_encoded(&l, "ce-id", ev->id);
    lines_add_encoded(&l, "ce-source", ev->source);
    lines_add_encoded(&l, "ce-type", ev->type);
    lines_add_encoded(&l, "ce-time", ev->time);
    if (ev->subject != NULL) {
        lines_add_encoded(&l, "ce-subject", ev->subject);
    }
    lines_add_encoded(&l, "ce-tenantid", t->tenant_id);
    if (ev->schema_version != NULL) {
        lines_add_encoded(&l, "ce-schemaversion", ev->schema_version);
    }
    if (ev->dataschema != NULL) {
        lines_add_encoded(&l, "ce-dataschema", ev->dataschema);
    }
    /* extension attributes are name/value pairs ending with a NULL name */
    for (const char *const *x = ev->extensions; x != NULL && x[0] != NULL && x[1] != NULL; x += 2) {
        char name[3 + 64 + 1];
        if (strlen(x[0]) > 64 || !ce_extension_name_valid(x[0])) {
            continue;
        }
        snprintf(name, sizeof(name), "ce-%s", x[0]);
        lines_add_encoded(&l, name, x[1]);
    }
    /* W3C trace context travels verbatim (its values contain spaces and
     * commas); one with control bytes is dropped rather than encoded. */
    if (ev->traceparent != NULL && hub_http_value_safe(ev->traceparent, strlen(ev->traceparent))) {
        lines_add(&l, "traceparent", ev->traceparent);
    }
    if (ev->tracestate != NULL && hub_http_value_safe(ev->tracestate, strlen(ev->tracestate))) {
        lines_add(&l, "tracestate", ev->tracestate);
    }
    /* the destination's own headers last (credentials), checked again here
     * because the dispatcher may add a shape policy's headers to them */
    if (t->dest_headers != NULL && json_is_object(t->dest_headers)) {
        const char *name;
        json_t *value;
        json_object_foreach((json_t *)t->dest_headers, name, value) {
            const char *v = json_string_value(value);
            size_t nl = strlen(name);
            if (v == NULL || v[0] == '\0' || !hub_webhook_header_name_valid(name, nl) ||
                hub_webhook_header_reserved(name, nl) || !hub_http_value_safe(v, strlen(v))) {
                continue; /* validated at the API; old or foreign rows are not trusted */
            }
            lines_add(&l, name, v);
        }
    }
    free(msg_id);
    if (l.oom) {
        if (l.v != NULL) {
            lines_wipe(l.v, l.n);
        }
        return HUB_ENOMEM;
    }
    out->lines = l.v;
    out->n = l.n;
    return 0;
}

/* ============================================================= probes ====== */

/*
 * A probe is a delivery in every respect but its event: the same builder
 * signs it with the same keys and adds the same destination headers, so a
 * receiver that verifies a probe verifies deliveries the same way.  *out
 * is zeroed first, so it is safe to free whatever this returns.
 */
int hub_webhook_build_probe(const struct hub_webhook_target *t, struct hub_webhook_probe *out) {
    unsigned char raw[PROBE_CHALLENGE_RAW];
    char event_uuid[HUB_UUID_TEXT_SIZE], event_id[8 + HUB_UUID_TEXT_SIZE], ce_time[64];
    struct hub_webhook_event ev;
    struct hub_webhook_target stamped = *t;
    json_t *body_json;
    int64_t us;
    int rc;

    memset(out, 0, sizeof(*out));
    /* the challenge must be unguessable: a destination passes only by
     * echoing what it received, not by answering 2xx to anything */
    if (RAND_bytes(raw, sizeof(raw)) != 1 || hub_uuid7_text(event_uuid) != 0) {
        return HUB_ECRYPTO;
    }
    hub_base64url(raw, sizeof(raw), out->challenge);
    /* an id no producer's event can have, and a new one per probe so that a
     * receiver deduplicating by webhook-id still answers each */
    snprintf(event_id, sizeof(event_id), "verify-%s", event_uuid);
    body_json = json_pack("{s:s}", "challenge", out->challenge);
    out->body = body_json != NULL ? json_dumps(body_json, JSON_COMPACT) : NULL;
    json_decref(body_json);
    if (out->body == NULL) {
        return HUB_ENOMEM;
    }
    /* the body is kept as sent: the signatures cover exactly these bytes */
    out->body_len = strlen(out->body);
    memset(&ev, 0, sizeof(ev));
    ev.id = event_id;
    ev.source = PROBE_CE_SOURCE;
    ev.type = PROBE_CE_TYPE;
    ev.event_type = PROBE_EVENT_TYPE;
    ev.content_type = "application/json";
    /* one clock reading: the signed timestamp and ce-time agree */
    us = hub_unix_us();
    hub_rfc3339(us, 3, ce_time, sizeof(ce_time));
    ev.time = ce_time;
    stamped.unix_s = us / 1000000;
    rc = hub_webhook_build_headers(&ev, &stamped, out->body, out->body_len, &out->headers);
    if (rc != 0) {
        hub_webhook_probe_free(out);
    }
    return rc;
}

/* The challenge stays readable: it is no secret, and the caller may
 * still compare a response against it. */
void hub_webhook_probe_free(struct hub_webhook_probe *p) {
    hub_webhook_headers_free(&p->headers);
    free(p->body);
    p->body = NULL;
    p->body_len = 0;
}

/* ============================================================ secrets ====== */

/* Opens one sealed secret into its HMAC key. */
/* The subscription id is the seal's AAD: a sealed secret copied to another
 * subscription's row does not open there. */
static int open_key(const struct hub_keyring *kek, const char *id, const char *sealed,
                    struct hub_sign_key *key) {
    unsigned char *pt = NULL;
    size_t len = 0;
    int rc;

    if (sealed == NULL || hub_keyring_open(kek, sealed, id, &pt, &len) != 0) {
        return HUB_ECRYPTO;
    }
    rc = hub_secret_key((const char *)pt, key->key, &key->len);
    OPENSSL_cleanse(pt, len);
    free(pt);
    return rc == 0 ? 0 : HUB_ECRYPTO;
}

/* The previous secret is optional: one that does not open is left out,
 * as the current one still signs and must not be held up by it. */
int hub_webhook_open_keys(const struct hub_keyring *kek, const char *subscription_id,
                          const char *secret_sealed, const char *prev_sealed, int prev_valid,
                          struct hub_sign_key *keys, size_t *nkeys) {
    *nkeys = 0;
    if (open_key(kek, subscription_id, secret_sealed, &keys[0]) != 0) {
        return HUB_ECRYPTO;
    }
    *nkeys = 1;
    if (prev_valid && prev_sealed != NULL &&
        open_key(kek, subscription_id, prev_sealed, &keys[1]) == 0) {
        *nkeys = 2;
    }
    return 0;
}

/* The plaintext buffer is wiped as soon as jansson has parsed it: from
 * then on the only copy is the object handed to the caller. */
int hub_webhook_open_headers(const struct hub_keyring *kek, const char *subscription_id,
                             const char *headers_sealed, json_t **out) {
    unsigned char *pt = NULL;
    size_t len = 0;
    json_t *obj;

    *out = NULL;
    /* none is an empty object, so callers iterate without a special case */
    if (headers_sealed == NULL) {
        *out = json_object();
        return *out != NULL ? 0 : HUB_ENOMEM;
    }
    if (hub_keyring_open(kek, headers_sealed, subscription_id, &pt, &len) != 0) {
        return HUB_ECRYPTO;
    }
    obj = json_loadb((const char *)pt, len, 0, NULL);
    OPENSSL_cleanse(pt, len);
    free(pt);
    if (obj == NULL || !json_is_object(obj)) {
        json_decref(obj);
        return HUB_EINVAL;
    }
    *out = obj;
    return 0;
}

/* Names are not wiped: they are not secret (the API shows them). */
void hub_webhook_headers_wipe(json_t *headers) {
    const char *name;
    json_t *value;

    if (headers == NULL) {
        return;
    }
    /* jansson owns the bytes and frees them as they are: wipe them first */
    json_object_foreach(headers, name, value) {
        if (json_is_string(value)) {
            OPENSSL_cleanse((char *)json_string_value(value), json_string_length(value));
        }
    }
    json_decref(headers);
}
