/*
 * webhook — the delivery request of SPEC §7.2, owned in one place: opening a
 * subscription's sealed signing secrets and destination headers, the header
 * set (X-Lerian-*, Standard Webhooks, the event's ce-* attributes, trace
 * headers), and the signatures over the exact body sent.  The dispatcher
 * builds every attempt with it and the subscription API every verification
 * probe, so a probe is signed exactly as a delivery is.
 *
 * Plaintext secrets and credentials exist only in memory for one request:
 * keys are wiped by the caller, headers objects by hub_webhook_headers_wipe,
 * header lines by hub_webhook_headers_free.
 */
#ifndef HUB_WEBHOOK_H
#define HUB_WEBHOOK_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "crypto.h"
#include "sign.h"

/* Signing keys per request: the current secret and the previous one while
 * it is within its grace period. */
#define HUB_WEBHOOK_MAX_KEYS 2

/*
 * The event a webhook request carries.  Everything is borrowed for the
 * duration of hub_webhook_build_headers().  Values are HTTP-binding encoded
 * by the builder (CloudEvents HTTP binding §3.1.3.2: space, '"', '%' and
 * bytes outside printable ASCII are percent-encoded), so any stored
 * attribute is safe to pass.
 */
struct hub_webhook_event {
    const char *id;             /* ce-id: also X-Lerian-Event-Id and webhook-id */
    const char *source;         /* ce-source */
    const char *type;           /* ce-type */
    const char *time;           /* ce-time, RFC 3339 */
    const char *subject;        /* ce-subject, or NULL */
    const char *schema_version; /* ce-schemaversion, or NULL */
    const char *dataschema;     /* ce-dataschema, or NULL */
    /* X-Lerian-Schema-Version: the registered version the payload was
     * checked against (SPEC §3.5), or NULL */
    const char *checked_schema_version;
    const char *event_type;   /* X-Lerian-Event-Type, e.g. "transaction.posted" */
    const char *content_type; /* Content-Type (datacontenttype); NULL = application/json */
    const char *traceparent;  /* forwarded as is when set (and free of control bytes) */
    const char *tracestate;
    /* extension attributes: name, value, name, value, ..., NULL; names must
     * be [a-z0-9]+ and not a standard attribute, others are skipped.  May be NULL. */
    const char *const *extensions;
};

/* Who the request is for and how it is signed.  Borrowed for the call. */
struct hub_webhook_target {
    const char *tenant_id;           /* X-Lerian-Tenant-Id, ce-tenantid */
    const char *subscription_id;     /* X-Lerian-Subscription-Id */
    const char *delivery_id;         /* X-Lerian-Delivery-Id: a new UUIDv7 per attempt */
    int attempt;                     /* X-Lerian-Attempt, 1-based */
    const struct hub_sign_key *keys; /* 1..HUB_WEBHOOK_MAX_KEYS, current first */
    size_t nkeys;
    int64_t unix_s; /* X-Lerian-Timestamp / webhook-timestamp */
    /* The subscription's destination headers, decrypted (a JSON object of
     * strings), or NULL.  Reserved names (hub_webhook_header_reserved) and
     * values with control bytes are skipped, never sent. */
    const json_t *dest_headers;
};

/* The request's header lines, "Name: value", NULL-terminated (the shape
 * hub_httpc_request.headers takes).  Owned; release with
 * hub_webhook_headers_free(), which wipes them (credentials). */
struct hub_webhook_headers {
    char **lines;
    size_t n;
};

/*
 * Builds every header of one webhook request over body[0..len): Content-Type,
 * User-Agent, the X-Lerian-* set (X-Lerian-Signature and the Standard
 * Webhooks webhook-id/-timestamp/-signature computed with every key of t,
 * space-separated, over the body exactly as it will be sent), the ce-*
 * attributes (ce-specversion 1.0), traceparent/tracestate, then the
 * destination headers.  webhook-id is the encoded ce-id, and the signature
 * covers exactly that header value, so Standard Webhooks verifiers work.
 *
 * Returns 0 with *out filled (owned by the caller), or with *out empty
 * HUB_EINVAL (no key, or more than HUB_WEBHOOK_MAX_KEYS; no event id),
 * HUB_ECRYPTO (a key OpenSSL refuses) or HUB_ENOMEM.
 */
int hub_webhook_build_headers(const struct hub_webhook_event *ev,
                              const struct hub_webhook_target *t, const void *body, size_t len,
                              struct hub_webhook_headers *out);

/* Wipes and frees the lines; h is left empty.  Safe on an empty h. */
void hub_webhook_headers_free(struct hub_webhook_headers *h);

/*
 * The extension attributes of a stored event's attribute object attrs: its
 * string members that are not CloudEvents context attributes (nor the
 * hub's tenantid, nor distributed tracing's), into ext as name, value, ...,
 * NULL, at most ext_max entries with the NULL (ext_max >= 1).  The strings
 * are borrowed from attrs.  Delivery (the ce-* headers and the policy's
 * ev.extensions) and the policy dry-run read them here, so both see the
 * same set.
 */
void hub_webhook_extensions(const json_t *attrs, const char **ext, size_t ext_max);

/* The challenge of a verification probe as text: base64url of 24 random
 * bytes (32 characters) and its NUL. */
#define HUB_WEBHOOK_CHALLENGE_SIZE 33

/* A verification probe's request (SPEC §6).  Owned by the caller; release
 * with hub_webhook_probe_free(). */
struct hub_webhook_probe {
    char challenge[HUB_WEBHOOK_CHALLENGE_SIZE]; /* a passing response body contains it */
    char *body;                                 /* {"challenge":"<challenge>"} */
    size_t body_len;
    struct hub_webhook_headers headers; /* as a delivery's (credentials) */
};

/*
 * Builds the verification probe for target t: a POST of a fresh random
 * challenge, {"challenge":"..."}, with every header of a delivery
 * (hub_webhook_build_headers) for a synthetic event: ce-id
 * "verify-<UUIDv7>", ce-source "/streaming-hub", ce-type
 * "studio.lerian.subscription.verification", X-Lerian-Event-Type
 * "subscription.verification", application/json.  The probe is stamped
 * with the current time: t->unix_s is not read, and ce-time is the same
 * instant with milliseconds.  t is borrowed for the call.
 *
 * Returns 0 with *out filled, or with *out empty HUB_ECRYPTO (no
 * randomness), HUB_ENOMEM, or what hub_webhook_build_headers returned.
 */
int hub_webhook_build_probe(const struct hub_webhook_target *t, struct hub_webhook_probe *out);

/* Wipes and frees what p holds; p is left empty.  Safe on an empty p. */
void hub_webhook_probe_free(struct hub_webhook_probe *p);

/* The longest destination header name a subscription may set. */
#define HUB_WEBHOOK_HEADER_NAME_MAX 128

/* 1 when name[0..len) may name a destination header: a non-empty RFC 9110
 * token of at most HUB_WEBHOOK_HEADER_NAME_MAX bytes (reserved or not). */
int hub_webhook_header_name_valid(const char *name, size_t len);

/*
 * 1 when a destination header name must never be set by a subscription:
 * the hub's own headers (X-Lerian-*, webhook-*, ce-*, traceparent,
 * tracestate, User-Agent, Content-Type) and those the transport owns (Host,
 * Content-Length, Transfer-Encoding, and the hop-by-hop Connection,
 * Keep-Alive, Proxy-Connection, TE, Trailer, Upgrade, Expect).
 * Case-insensitive; name[0..len) is borrowed.
 */
int hub_webhook_header_reserved(const char *name, size_t len);

/*
 * Opens a subscription's signing keys: the current secret (secret_sealed)
 * and, when prev_valid and prev_sealed is not NULL, the previous one.
 * Sealed texts are bound to the subscription id (AAD) and open with any
 * key of the ring (current or previous KEK).  keys must hold
 * HUB_WEBHOOK_MAX_KEYS entries; the caller wipes them (OPENSSL_cleanse)
 * after use.  Returns 0 with *nkeys = 1 or 2, or HUB_ECRYPTO when the
 * current secret does not open (wrong KEK, tampered row).  A previous
 * secret that does not open is left out (*nkeys 1): the current one still
 * signs.
 */
int hub_webhook_open_keys(const struct hub_keyring *kek, const char *subscription_id,
                          const char *secret_sealed, const char *prev_sealed, int prev_valid,
                          struct hub_sign_key *keys, size_t *nkeys);

/*
 * Opens a subscription's destination headers (with any key of the ring).
 * headers_sealed NULL means
 * none: *out is then an empty object.  Returns 0 with *out owned by the
 * caller (credentials: never log it), or with *out NULL HUB_ECRYPTO (the
 * text does not open), HUB_EINVAL (it is not a JSON object) or HUB_ENOMEM.
 */
int hub_webhook_open_headers(const struct hub_keyring *kek, const char *subscription_id,
                             const char *headers_sealed, json_t **out);

/* Wipes the string values of a decrypted headers object (credentials) and
 * releases it.  headers must be owned by the caller alone (refcount 1), as
 * hub_webhook_open_headers() hands it over.  NULL is fine. */
void hub_webhook_headers_wipe(json_t *headers);

#endif
