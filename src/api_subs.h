/*
 * api_subs — the tenant API of subscriptions and deliveries (SPEC §6, §9),
 * and the webhook request builder that verification probes use now and the
 * dispatcher will use for every delivery attempt (SPEC §7.2).
 *
 * Routes (tenant API key, "Authorization: Bearer shk_…", on every one):
 *
 *   POST   /v1/subscriptions                    create (201, secret shown once)
 *   GET    /v1/subscriptions                    list, by id, paginated
 *   GET    /v1/subscriptions/{id}               one
 *   PATCH  /v1/subscriptions/{id}               update writable members
 *   DELETE /v1/subscriptions/{id}               204
 *   POST   /v1/subscriptions/{id}/verify        synchronous probe
 *   POST   /v1/subscriptions/{id}/rotate-secret new secret, previous one kept for a grace
 *   GET    /v1/subscriptions/{id}/deliveries    jobs, newest first, ?state=
 *   GET    /v1/deliveries/{id}                  a job with its attempts
 *   POST   /v1/deliveries/{id}/redeliver        a dead job becomes due again
 *
 * Another tenant's object is 404; create and rotate-secret honour
 * Idempotency-Key (24h, scope "tenant:<tenant id>").
 */
#ifndef HUB_API_SUBS_H
#define HUB_API_SUBS_H

#include <h2o.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "crypto.h"
#include "sign.h"

struct hub;

/*
 * Answers a request whose path is under /v1/subscriptions or /v1/deliveries
 * and returns 1 (the answer may be sent later, from a database, DNS or
 * probe callback); returns 0 without touching req for any other path.
 * Authentication comes first: an unknown key is 401 whatever the path and
 * method.  Borrows hub and req.
 */
int hub_api_subs_handle(struct hub *hub, h2o_req_t *req);

/* ------------------------------------------------ webhook requests (§7.2) -- */

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
    const char *event_type;     /* X-Lerian-Event-Type, e.g. "transaction.posted" */
    const char *content_type;   /* Content-Type (datacontenttype); NULL = application/json */
    const char *traceparent;    /* forwarded as is when set (and free of control bytes) */
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
 * Returns 0 with *out filled (owned by the caller), or -1 (out of memory,
 * no key, a key OpenSSL refuses) with *out empty.
 */
int hub_webhook_build_headers(const struct hub_webhook_event *ev,
                              const struct hub_webhook_target *t, const void *body, size_t len,
                              struct hub_webhook_headers *out);

/* Wipes and frees the lines; h is left empty.  Safe on an empty h. */
void hub_webhook_headers_free(struct hub_webhook_headers *h);

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
 * Sealed texts are bound to the subscription id (AAD).  keys must hold
 * HUB_WEBHOOK_MAX_KEYS entries; the caller wipes them (OPENSSL_cleanse)
 * after use.  Returns 0 with *nkeys = 1 or 2, or -1 when the current secret
 * does not open (wrong KEK, tampered row).  A previous secret that does not
 * open is left out (*nkeys 1): the current one still signs.
 */
int hub_subs_open_keys(const struct hub_kek *kek, const char *subscription_id,
                       const char *secret_sealed, const char *prev_sealed, int prev_valid,
                       struct hub_sign_key *keys, size_t *nkeys);

/*
 * Opens a subscription's destination headers.  headers_sealed NULL means
 * none: *out is then an empty object.  Returns 0 with *out owned by the
 * caller (credentials: never log it), or -1 with *out NULL when the text
 * does not open or is not a JSON object.
 */
int hub_subs_open_headers(const struct hub_kek *kek, const char *subscription_id,
                          const char *headers_sealed, json_t **out);

/* Wipes the string values of a decrypted headers object (credentials) and
 * releases it.  headers must be owned by the caller alone (refcount 1), as
 * hub_subs_open_headers() hands it over.  NULL is fine. */
void hub_subs_headers_free(json_t *headers);

#endif
