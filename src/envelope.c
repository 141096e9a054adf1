/*
 * envelope — CloudEvents envelope parsing and validation (SPEC §3.1, §4):
 * the entry point, the arena, the errors and what every mode shares.
 *
 * One call turns the headers and value of a record into a validated
 * struct hub_event or into a precise refusal (reason + attribute at fault).
 *
 * Shape of a parse (the parts are listed in envelope_int.h):
 *
 *   1. classify headers (envelope_binary.c): ce-<attr> / ce_<attr> (Kafka
 *      only) / content-type / traceparent / tracestate; everything else is
 *      ignored.  Only the index of the last header of each attribute is
 *      remembered (last one wins), so the scan is O(n); extensions are
 *      sorted once (O(n log n)) to apply the same rule without a quadratic
 *      search.
 *   2. materialise the winning values into the event's arena, NUL-terminated,
 *      after HTTP percent-decoding, refusing control characters and bad UTF-8.
 *      In structured mode (envelope_structured.c) the values come from the
 *      members of the JSON CloudEvent instead.
 *   3. extract the payload and check its size, validate every attribute in a
 *      fixed order (so the reported field is deterministic), check that a JSON
 *      payload is well-formed, then derive event type, schema major,
 *      attrs_json (envelope_attrs.c) and the SHA-256 digest (here).
 *
 * Everything the event points to lives in one arena (a list of malloc'd
 * blocks with a bump pointer); hub_event_free() releases the list.  Header
 * values are never assumed to be NUL-terminated and every index is checked
 * against its length: this function is fuzzed (tests/fuzz/fuzz_envelope.c).
 */
#include "envelope.h"

#include <openssl/sha.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envelope_int.h"
#include "fault.h"

/* SPEC §2.2 default of STREAMING_HUB_MAX_EVENT_BYTES, used when limits is NULL. */
#define ENVELOPE_DEFAULT_MAX_EVENT_BYTES ((size_t)1048576)

#define DEFAULT_CONTENT_TYPE "application/json"

/* ------------------------------------------------------------------------- */
/* Arena                                                                     */
/* ------------------------------------------------------------------------- */

/*
 * Small events (the common case: a dozen short attributes plus attrs_json)
 * fit in one block, so a parse costs one malloc for all its strings.
 */
#define ARENA_BLOCK_SIZE 1024 /* most events fit in one block: keeps in-flight batches small */

struct arena_block {
    struct arena_block *next;
    size_t cap;
    size_t used;
    max_align_t data[]; /* max_align_t elements keep every block start aligned */
};

/*
 * See envelope_int.h.  Large requests get a block of their own, linked
 * behind the head so the head keeps serving small ones.
 */
void *env_arena_alloc(struct arena *a, size_t n, size_t align) {
    struct arena_block *b = a->head;

    if (b != NULL) {
        size_t off = (b->used + align - 1) & ~(align - 1);
        if (off <= b->cap && b->cap - off >= n) {
            b->used = off + n;
            return (char *)b->data + off;
        }
    }
    if (n > SIZE_MAX - sizeof(struct arena_block) - ARENA_BLOCK_SIZE) {
        return NULL;
    }
    if (n > ARENA_BLOCK_SIZE / 4) {
        struct arena_block *big = hub_fault("envelope_alloc") ? NULL : malloc(sizeof(*big) + n);
        if (big == NULL) {
            return NULL;
        }
        big->cap = n;
        big->used = n;
        if (b != NULL) {
            big->next = b->next;
            b->next = big;
        } else {
            big->next = NULL;
            a->head = big;
        }
        return big->data;
    }
    struct arena_block *nb =
        hub_fault("envelope_alloc") ? NULL : malloc(sizeof(*nb) + ARENA_BLOCK_SIZE);
    if (nb == NULL) {
        return NULL;
    }
    nb->cap = ARENA_BLOCK_SIZE;
    nb->used = n;
    nb->next = b;
    a->head = nb;
    return nb->data;
}

/* Copies n bytes into the arena and NUL-terminates them; NULL when out of memory. */
char *env_arena_strndup(struct arena *a, const void *p, size_t n) {
    if (n == SIZE_MAX) {
        return NULL;
    }
    char *s = env_arena_alloc(a, n + 1, 1);
    if (s == NULL) {
        return NULL;
    }
    if (n > 0) {
        memcpy(s, p, n);
    }
    s[n] = '\0';
    return s;
}

void env_arena_free(struct arena *a) {
    struct arena_block *b = a->head;
    while (b != NULL) {
        struct arena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
}

/* ------------------------------------------------------------------------- */
/* Attribute names and errors                                                */
/* ------------------------------------------------------------------------- */

const struct attr_name env_attr_names[A_COUNT] = {
    [A_SPECVERSION] = {"specversion", 11},
    [A_ID] = {"id", 2},
    [A_SOURCE] = {"source", 6},
    [A_TYPE] = {"type", 4},
    [A_TIME] = {"time", 4},
    [A_TENANTID] = {"tenantid", 8},
    [A_SUBJECT] = {"subject", 7},
    [A_SCHEMAVERSION] = {"schemaversion", 13},
    [A_DATACONTENTTYPE] = {"datacontenttype", 15},
    [A_DATASCHEMA] = {"dataschema", 10},
    [A_RESOURCETYPE] = {"resourcetype", 12},
    [A_EVENTTYPE] = {"eventtype", 9},
    [A_TRACEPARENT] = {"traceparent", 11},
    [A_TRACESTATE] = {"tracestate", 10},
};

enum attr_id env_lookup_attr(const char *name, size_t len) {
    for (int a = 0; a < A_COUNT; a++) {
        if (name_eq(name, len, env_attr_names[a].name, env_attr_names[a].len)) {
            return (enum attr_id)a;
        }
    }
    return A_COUNT;
}

int env_fail(struct hub_envelope_error *err, enum hub_envelope_reason reason, const char *field,
             size_t field_len, const char *fmt, ...) {
    size_t n = 0;

    err->reason = reason;
    if (field != NULL) {
        for (size_t i = 0; i < field_len && n + 1 < sizeof(err->field); i++) {
            unsigned char c = (unsigned char)field[i];
            err->field[n++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
        }
    }
    err->field[n] = '\0';

    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    return -1;
}

int env_fail_attr(struct parse_ctx *ctx, enum attr_id id, const char *fmt, ...) {
    char msg[sizeof(ctx->err->message)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return env_fail(ctx->err, HUB_ENVELOPE_INVALID, env_attr_names[id].name, env_attr_names[id].len,
                    "%s", msg);
}

int env_fail_nomem(struct parse_ctx *ctx) {
    /* a reason of its own: the record is not at fault, the caller retries */
    return env_fail(ctx->err, HUB_ENVELOPE_NOMEM, "", 0,
                    "out of memory while parsing the envelope");
}

const char *hub_envelope_reason_str(enum hub_envelope_reason reason) {
    switch (reason) {
    case HUB_ENVELOPE_OK:
        return "ok";
    case HUB_ENVELOPE_INVALID:
        return "invalid_envelope";
    case HUB_ENVELOPE_TOO_LARGE:
        return "too_large";
    case HUB_ENVELOPE_NOMEM:
        return "out_of_memory";
    }
    return "invalid_envelope";
}

/* ------------------------------------------------------------------------- */
/* Entry points                                                              */
/* ------------------------------------------------------------------------- */

/* Sets the context up for one parse; the error is the caller's, already cleared. */
static void ctx_init(struct parse_ctx *ctx, enum hub_envelope_mode mode,
                     const struct hub_header *headers, size_t n_headers,
                     const struct hub_envelope_limits *limits, struct hub_envelope_error *err) {
    memset(ctx, 0, sizeof(*ctx));
    /* Any mode but HTTP is Kafka's: an out-of-range value selects nothing new. */
    ctx->mode = mode == HUB_ENVELOPE_HTTP ? HUB_ENVELOPE_HTTP : HUB_ENVELOPE_KAFKA;
    ctx->headers = headers;
    ctx->n_headers = headers != NULL ? n_headers : 0;
    ctx->max_bytes = limits != NULL ? limits->max_event_bytes : ENVELOPE_DEFAULT_MAX_EVENT_BYTES;
    ctx->err = err;
    ctx->issues = limits != NULL ? limits->issues : NULL;
    if (ctx->issues != NULL) {
        ctx->issues->n = 0;
    }
}

/*
 * Picks the mode from the content-type header (application/cloudevents...
 * is structured, SPEC §4) and takes the attributes and the payload in it.
 * Sets *structured.  Returns 0 or -1 with *ctx->err filled.
 */
static int take_values(struct parse_ctx *ctx, const void *value, size_t value_len,
                       bool *structured) {
    const struct hub_header *ct =
        ctx->plain_content_type != NO_HEADER ? &ctx->headers[ctx->plain_content_type - 1] : NULL;
    *structured = ct != NULL && ct->name != NULL && ct->value != NULL &&
                  prefix_ieq(ct->value, ct->value_len, "application/cloudevents", 23);
    if (*structured) {
        return env_take_structured(ctx, value, value_len);
    }
    /* Cheapest refusal first: the record value is the payload. */
    if (value_len > ctx->max_bytes) {
        return env_fail(ctx->err, HUB_ENVELOPE_TOO_LARGE, "data", 4,
                        "payload of %zu bytes exceeds the limit of %zu bytes", value_len,
                        ctx->max_bytes);
    }
    return env_take_binary(ctx, value, value_len);
}

/* HTTP ingest: the API key's tenant stands in for an absent tenantid (SPEC §4). */
static int take_default_tenant(struct parse_ctx *ctx, const struct hub_envelope_limits *limits) {
    if (ctx->val[A_TENANTID].p != NULL || limits == NULL || limits->default_tenant == NULL) {
        return 0;
    }
    size_t n = strlen(limits->default_tenant);
    ctx->val[A_TENANTID].p = env_arena_strndup(&ctx->arena, limits->default_tenant, n);
    if (ctx->val[A_TENANTID].p == NULL) {
        return env_fail_nomem(ctx);
    }
    ctx->val[A_TENANTID].n = n;
    return 0;
}

/*
 * Hands a validated context over to *ev: the attribute strings, the
 * extensions, the payload and its digest, and the arena that owns them
 * (the context no longer frees it).  default_ct: the content type is the
 * default literal, copied here so that every string of the event is in its
 * arena.  Returns 0, or -1 when out of memory (ev untouched but for fields
 * the caller zeroes on failure anyway).
 */
static int fill_event(struct parse_ctx *ctx, bool default_ct, bool structured,
                      struct hub_event *ev) {
    /* Where each dedicated attribute lands; datacontenttype is the effective
     * content type (ctx->content_type), set apart below. */
    const char **field[A_COUNT] = {[A_SPECVERSION] = &ev->specversion,
                                   [A_ID] = &ev->id,
                                   [A_SOURCE] = &ev->source,
                                   [A_TYPE] = &ev->type,
                                   [A_TIME] = &ev->time,
                                   [A_TENANTID] = &ev->tenant,
                                   [A_SUBJECT] = &ev->subject,
                                   [A_SCHEMAVERSION] = &ev->schema_version,
                                   [A_DATASCHEMA] = &ev->dataschema,
                                   [A_RESOURCETYPE] = &ev->resourcetype,
                                   [A_EVENTTYPE] = &ev->eventtype,
                                   [A_TRACEPARENT] = &ev->traceparent,
                                   [A_TRACESTATE] = &ev->tracestate};

    if (default_ct) {
        ctx->content_type.p =
            env_arena_strndup(&ctx->arena, DEFAULT_CONTENT_TYPE, sizeof(DEFAULT_CONTENT_TYPE) - 1);
        if (ctx->content_type.p == NULL) {
            return env_fail_nomem(ctx);
        }
    }
    for (int a = 0; a < A_COUNT; a++) {
        if (field[a] != NULL) {
            *field[a] = ctx->val[a].p;
        }
    }
    ev->content_type = ctx->content_type.p;
    ev->extensions = ctx->n_extensions > 0 ? ctx->extensions : NULL;
    ev->n_extensions = ctx->n_extensions;
    ev->payload = ctx->payload;
    ev->payload_len = ctx->payload_len;
    ev->json_unchecked = ctx->payload_json_unchecked ? 1 : 0;
    SHA256(ctx->payload, ctx->payload_len, ev->digest);
    ev->structured = structured ? 1 : 0;
    ev->arena_ = ctx->arena.head;
    return 0;
}

/*
 * See envelope.h.  Steps: classify headers, take values (binary, after its
 * size gate, or structured), default tenant and content type, validate,
 * check a JSON payload, derive, hand over.  Every failure lands in the
 * single unwind below, which frees the arena and the scratch array and
 * leaves *ev zeroed.
 */
int hub_envelope_parse(enum hub_envelope_mode mode, const struct hub_header *headers,
                       size_t n_headers, const void *value, size_t value_len, const char *topic,
                       const struct hub_envelope_limits *limits, struct hub_event *ev,
                       struct hub_envelope_error *err) {
    struct hub_envelope_error scratch_err;
    struct parse_ctx ctx;
    bool structured = false;

    if (err == NULL) {
        err = &scratch_err;
    }
    memset(err, 0, sizeof(*err));
    if (ev == NULL) {
        return env_fail(err, HUB_ENVELOPE_INVALID, "", 0, "no event to fill");
    }
    memset(ev, 0, sizeof(*ev));
    ctx_init(&ctx, mode, headers, n_headers, limits, err);
    if (value == NULL) {
        value_len = 0;
    }

    if (env_classify_headers(&ctx) != 0 || take_values(&ctx, value, value_len, &structured) != 0 ||
        take_default_tenant(&ctx, limits) != 0) {
        goto fail;
    }
    /* The default is validated and stored like a received content type;
     * fill_event copies it into the arena with the event's other strings. */
    bool default_ct = ctx.content_type.p == NULL;
    if (default_ct) {
        ctx.content_type.p = DEFAULT_CONTENT_TYPE;
        ctx.content_type.n = sizeof(DEFAULT_CONTENT_TYPE) - 1;
    }

    if (env_validate_attributes(&ctx, topic, ev) != 0 || env_check_json_payload(&ctx) != 0 ||
        env_derive_event_type(&ctx, ev) != 0 || env_build_attrs_json(&ctx, ev) != 0 ||
        fill_event(&ctx, default_ct, structured, ev) != 0) {
        goto fail;
    }
    json_decref(ctx.root);
    free(ctx.ext_refs);
    return 0;

fail:
    json_decref(ctx.root);
    free(ctx.ext_refs);
    ctx.ext_refs = NULL;
    env_arena_free(&ctx.arena);
    memset(ev, 0, sizeof(*ev));
    return -1;
}

void hub_event_free(struct hub_event *ev) {
    if (ev == NULL) {
        return;
    }
    struct arena a = {ev->arena_};
    env_arena_free(&a);
    memset(ev, 0, sizeof(*ev));
}
