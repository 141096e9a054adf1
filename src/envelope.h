/*
 * envelope — CloudEvents envelope parsing and validation (SPEC §3.1, §4).
 *
 * Turns the headers and value of one Kafka record (or one HTTP request in the
 * CloudEvents HTTP binding) into a validated struct hub_event, or into a
 * precise reason why it is not one.  Pure code: no I/O, no allocation beyond
 * the event's own arena, safe to call from any thread.
 */
#ifndef HUB_ENVELOPE_H
#define HUB_ENVELOPE_H

#include <stddef.h>
#include <stdint.h>

/* One header as it arrived.  Names are compared case-insensitively; values
 * are raw bytes (not NUL-terminated).  Borrowed for the duration of the call. */
struct hub_header {
    const char *name;
    size_t name_len;
    const void *value;
    size_t value_len;
};

enum hub_envelope_mode {
    HUB_ENVELOPE_KAFKA = 0, /* ce-/ce_ headers, raw values */
    HUB_ENVELOPE_HTTP = 1,  /* ce- headers, values percent-decoded per the HTTP binding */
};

/* Why a record was refused by the parser.  Order is stable (used as metric labels). */
enum hub_envelope_reason {
    HUB_ENVELOPE_OK = 0,
    HUB_ENVELOPE_INVALID = 1,   /* reason "invalid_envelope" */
    HUB_ENVELOPE_TOO_LARGE = 2, /* reason "too_large" */
    HUB_ENVELOPE_NOMEM = 3,     /* not a verdict: memory ran out while parsing.  Transient:
                                 * the record is parsed again later, never quarantined */
};

struct hub_envelope_error {
    enum hub_envelope_reason reason;
    char field[64];    /* the attribute at fault ("id", "time", "data", ...), "" if none */
    char message[192]; /* human readable, never contains payload bytes */
};

/* One extension attribute or forwarded header (traceparent/tracestate). */
struct hub_attr {
    const char *name; /* lower-case, without the ce-/ce_ prefix */
    const char *value;
};

/*
 * A validated event.  Every string is NUL-terminated and lives in the event's
 * own arena; hub_event_free() releases all of it.  Optional attributes that
 * were absent are NULL.
 */
struct hub_event {
    const char *specversion;     /* "1.0" */
    const char *id;              /* ce-id */
    const char *source;          /* ce-source */
    const char *type;            /* ce-type (CloudEvents type) */
    const char *time;            /* ce-time as received (RFC 3339) */
    int64_t time_us;             /* ce-time as Unix microseconds (UTC) */
    const char *tenant;          /* ce-tenantid */
    const char *subject;         /* NULL when absent */
    const char *schema_version;  /* NULL when absent */
    const char *content_type;    /* datacontenttype / content-type, default application/json */
    const char *dataschema;      /* NULL when absent */
    const char *resourcetype;    /* NULL when absent */
    const char *eventtype;       /* NULL when absent */
    const char *traceparent;     /* NULL when absent */
    const char *tracestate;      /* NULL when absent */
    const char *event_type;      /* derived, SPEC §3.1 "event type" */
    int schema_major;            /* derived, >= 1 */
    struct hub_attr *extensions; /* other ce-* attributes, sorted by name */
    size_t n_extensions;
    const char *attrs_json; /* JSON object of every attribute kept (for storage) */
    size_t attrs_json_len;
    const unsigned char *payload; /* the event data; points into the record value
                                     (binary mode) or into the arena (structured) */
    size_t payload_len;
    unsigned char digest[32]; /* SHA-256 of the payload bytes */
    /*
     * 1 when the payload must be well-formed JSON (a JSON content type, SPEC
     * §3.1) and its grammar has not been checked: the caller checks it (and
     * clears it once it has).
     * Ingest has PostgreSQL's JSON parser do it inside the insert statement,
     * several times faster than building a jansson document per event
     * (migrations/0004_json_check.sql).  Empty payloads and raw NUL bytes are
     * refused here; a structured event's data was parsed with the event.
     */
    int json_unchecked;
    int structured; /* 1 when parsed from structured mode */
    void *arena_;   /* private */
};

/* Every attribute validation refused in one event, when the caller asks
 * (HTTP ingest's 400 names each, SPEC §4).  The first is also the one
 * hub_envelope_error reports. */
#define HUB_ENVELOPE_MAX_ISSUES 16
struct hub_envelope_issues {
    size_t n;
    struct {
        char field[64];
        char message[192];
    } item[HUB_ENVELOPE_MAX_ISSUES];
};

struct hub_envelope_limits {
    size_t max_event_bytes; /* STREAMING_HUB_MAX_EVENT_BYTES */
    /* HTTP ingest: the API key's tenant, taken as tenantid when the event
     * carries none (SPEC §4: the tenant is the key's).  NULL for Kafka. */
    const char *default_tenant;
    /* When set, validation goes on past the first refused attribute and
     * records each here (reset by every parse).  Refusals before validation
     * (header bytes, JSON syntax, size) still end the parse at once. */
    struct hub_envelope_issues *issues;
};

/*
 * Parses and validates one record.
 *
 * headers/n_headers, value/value_len and topic are borrowed for the call; in
 * binary mode ev->payload keeps pointing into `value`, so the caller keeps the
 * value alive as long as it uses ev.  topic may be NULL (HTTP ingest).
 *
 * Returns 0 and fills *ev (release with hub_event_free), or returns -1, fills
 * *err and leaves *ev empty (nothing to free).
 */
int hub_envelope_parse(enum hub_envelope_mode mode, const struct hub_header *headers,
                       size_t n_headers, const void *value, size_t value_len, const char *topic,
                       const struct hub_envelope_limits *limits, struct hub_event *ev,
                       struct hub_envelope_error *err);

/*
 * Batch mode (application/cloudevents-batch+json, SPEC §4): finds the
 * elements of the JSON array text value[0..len) so that each can be parsed
 * as one structured event from its exact bytes.  Returns the element count
 * and stores *spans (malloc'd: start and end offset of element i at
 * [2i] and [2i+1]; NULL when the array is empty), or returns -1 when the
 * text is not a JSON array, has more than max elements, or memory ran out.
 */
long hub_envelope_batch_split(const void *value, size_t len, size_t max, size_t **spans);

/* Releases everything hub_envelope_parse allocated; safe on a zeroed event. */
void hub_event_free(struct hub_event *ev);

/* Metric/quarantine label of a reason: "invalid_envelope", "too_large"
 * ("out_of_memory" for HUB_ENVELOPE_NOMEM, which is never stored). */
const char *hub_envelope_reason_str(enum hub_envelope_reason reason);

/*
 * Derives the event type (SPEC §3.1) from ce-type and the optional
 * resourcetype/eventtype pair.  Writes a NUL-terminated string into out
 * (truncated to outsz) and returns its full length.
 */
size_t hub_event_type_derive(const char *ce_type, const char *resourcetype, const char *eventtype,
                             char *out, size_t outsz);

/* Parses a schemaversion ("1.0.0", "v2.1.0", "1", "v2").  Returns the major
 * (>= 0) or -1 when it is not a valid version. */
int hub_schema_major_parse(const char *s, size_t len);

/* Schema major carried by a topic's ".vN" suffix, or 0 when there is none. */
int hub_topic_schema_major(const char *topic);

/* 1 when media type s[0..len) (parameters allowed) is JSON: application/json,
 * text/json or any "+json" suffix (SPEC §3.1). */
int hub_media_type_is_json(const char *s, size_t len);

/* Parses RFC 3339 (fractions and offsets allowed) into Unix microseconds.
 * Returns 0 on success, HUB_EINVAL (error.h) when malformed. */
int hub_rfc3339_parse(const char *s, size_t len, int64_t *out_us);

#endif
