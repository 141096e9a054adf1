/*
 * envelope_int — what the parts of the envelope parser share (internal).
 *
 * Included only by src/envelope*.c; nothing here is public API (envelope.h
 * is).  One parse is one struct parse_ctx on hub_envelope_parse's stack, and
 * the parts hand it to each other in this order:
 *
 *   envelope.c            sets the context up, runs the steps, fills the event
 *   envelope_binary.c     env_classify_headers (both modes: the content-type
 *                         header decides the mode), then env_take_binary
 *   envelope_structured.c env_take_structured (instead of env_take_binary)
 *   envelope_attrs.c      env_validate_attributes, env_check_json_payload,
 *                         env_derive_event_type, env_build_attrs_json
 *
 * Ownership: every string a step stores in the context lives in ctx->arena,
 * which the event takes over on success and hub_envelope_parse frees on
 * failure.  ctx->ext_refs (malloc'd scratch) and ctx->root (a jansson
 * reference) belong to the context and are released by hub_envelope_parse
 * either way.  A step that fails has filled *ctx->err and returns -1; the
 * caller only unwinds.
 */
#ifndef HUB_ENVELOPE_INT_H
#define HUB_ENVELOPE_INT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "envelope.h"

/* ------------------------------------------------------------------------- */
/* Arena (envelope.c)                                                        */
/* ------------------------------------------------------------------------- */

struct arena_block;

/* The blocks every string of one event lives in; hub_event_free releases them. */
struct arena {
    struct arena_block *head; /* current bump block; the rest of the list is full */
};

/* n bytes aligned to `align` (a power of two <= alignof(max_align_t)), owned
 * by the arena; NULL when out of memory. */
void *env_arena_alloc(struct arena *a, size_t n, size_t align);

/* A NUL-terminated copy of p[0..n) owned by the arena; NULL when out of memory. */
char *env_arena_strndup(struct arena *a, const void *p, size_t n);

/* Frees every block; leaves the arena empty and reusable. */
void env_arena_free(struct arena *a);

/* ------------------------------------------------------------------------- */
/* Attributes and the parse context                                          */
/* ------------------------------------------------------------------------- */

/* Attributes with a dedicated field in struct hub_event. */
enum attr_id {
    A_SPECVERSION,
    A_ID,
    A_SOURCE,
    A_TYPE,
    A_TIME,
    A_TENANTID,
    A_SUBJECT,
    A_SCHEMAVERSION,
    A_DATACONTENTTYPE,
    A_DATASCHEMA,
    A_RESOURCETYPE,
    A_EVENTTYPE,
    /*
     * traceparent/tracestate are the CloudEvents distributed-tracing extension:
     * they arrive as plain `traceparent` headers or as ce-traceparent.  Giving
     * them a slot (instead of listing them as extensions) keeps one value per
     * name, so attrs_json never has two different "traceparent" keys.
     */
    A_TRACEPARENT,
    A_TRACESTATE,
    A_COUNT
};

/* Lower-case name of each dedicated attribute, and its length. */
struct attr_name {
    const char *name;
    size_t len;
};
extern const struct attr_name env_attr_names[A_COUNT];

/* A materialised attribute value: NUL-terminated, in the arena. */
struct str {
    const char *p; /* NULL when absent */
    size_t n;
};

/* A ce-* header that is not a known attribute (binary mode; defined there). */
struct ext_ref;

/* Printed length of a field name in messages (names are not NUL-terminated). */
#define FIELD_PRINT_LEN(n) ((int)((n) < 64 ? (n) : 64))

/* No header index: slots store index + 1 so that 0 means "absent". */
#define NO_HEADER 0

struct parse_ctx {
    enum hub_envelope_mode mode;
    const struct hub_header *headers; /* borrowed for the parse */
    size_t n_headers;
    size_t max_bytes; /* limits->max_event_bytes, or the SPEC default */
    struct arena arena;
    struct hub_envelope_error *err; /* the caller's (or a scratch one) */

    /* binary mode: index + 1 of the last header of each attribute */
    size_t ce_slot[A_COUNT];
    size_t plain_content_type; /* also read by hub_envelope_parse to pick the mode */
    size_t plain_traceparent;
    size_t plain_tracestate;
    struct ext_ref *ext_refs; /* malloc'd scratch, freed before returning */
    size_t n_ext_refs;

    struct str val[A_COUNT];
    struct str content_type; /* effective: datacontenttype, content-type or the default */
    bool content_type_from_header;
    struct hub_attr *extensions; /* in the arena, sorted by name once taken */
    size_t n_extensions;

    const unsigned char *payload; /* the record value (binary) or the arena (structured) */
    size_t payload_len;
    bool payload_checked_json;   /* payload is known to be well-formed JSON already */
    bool payload_absent;         /* structured event without data: no JSON check */
    bool payload_json_unchecked; /* must be JSON; its grammar is left to the caller */
    json_t *root;                /* structured mode: the parsed CloudEvent */

    struct hub_envelope_issues *issues;  /* limits->issues: collect every refusal */
    bool refused;                        /* validation refused something */
    struct hub_envelope_error first_err; /* ...and this first */
};

/* ------------------------------------------------------------------------- */
/* Shared helpers (inline: a few instructions each, on every byte of a name) */
/* ------------------------------------------------------------------------- */

static inline unsigned char ascii_lower(unsigned char c) {
    return (c >= 'A' && c <= 'Z') ? (unsigned char)(c + ('a' - 'A')) : c;
}

static inline bool is_digit(unsigned char c) {
    return c >= '0' && c <= '9';
}

static inline bool is_alpha(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* Case-insensitive (ASCII) equality of a length-delimited name with a
 * lower-case literal. */
static inline bool name_eq(const char *name, size_t len, const char *lit, size_t lit_len) {
    if (len != lit_len) {
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        if (ascii_lower((unsigned char)name[i]) != (unsigned char)lit[i]) {
            return false;
        }
    }
    return true;
}

/* Case-insensitive prefix test on a length-delimited string. */
static inline bool prefix_ieq(const char *s, size_t len, const char *lit, size_t lit_len) {
    return len >= lit_len && name_eq(s, lit_len, lit, lit_len);
}

/* ------------------------------------------------------------------------- */
/* Errors and lookups (envelope.c)                                           */
/* ------------------------------------------------------------------------- */

/*
 * Fills *err and returns -1.  The field is copied with non-printable bytes
 * replaced by '?' (it may come from an attacker-chosen header name and ends
 * up in logs and problem+json bodies); messages never quote attribute
 * values or payload bytes, only names and lengths.
 */
int env_fail(struct hub_envelope_error *err, enum hub_envelope_reason reason, const char *field,
             size_t field_len, const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* env_fail() for one of the dedicated attributes (reason "invalid_envelope"). */
int env_fail_attr(struct parse_ctx *ctx, enum attr_id id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* env_fail() for an allocation that failed; returns -1. */
int env_fail_nomem(struct parse_ctx *ctx);

/* Dedicated attribute named by a (case-insensitive) spelling, or A_COUNT. */
enum attr_id env_lookup_attr(const char *name, size_t len);

/* ------------------------------------------------------------------------- */
/* Binary mode: headers (envelope_binary.c)                                  */
/* ------------------------------------------------------------------------- */

/*
 * One pass over ctx->headers, in both modes: remembers the last header of
 * each attribute and of content-type/traceparent/tracestate, and collects
 * the other ce-* headers in ctx->ext_refs.  Returns 0, or -1 (out of memory).
 */
int env_classify_headers(struct parse_ctx *ctx);

/*
 * Copies header `slot` (index + 1) into the arena as ctx-owned text in *out,
 * percent-decoded when `decode` (HTTP binding), refused unless UTF-8 without
 * control characters; errors name field[0..field_len).  Returns 0 or -1.
 * Structured mode uses it for the plain trace headers.
 */
int env_take_header_value(struct parse_ctx *ctx, size_t slot, bool decode, const char *field,
                          size_t field_len, struct str *out);

/*
 * Binary mode: attributes, content type and extensions from the classified
 * headers; the payload is value[0..value_len) itself, borrowed (zero-copy).
 * Returns 0 or -1.
 */
int env_take_binary(struct parse_ctx *ctx, const void *value, size_t value_len);

/* ------------------------------------------------------------------------- */
/* Structured mode (envelope_structured.c)                                   */
/* ------------------------------------------------------------------------- */

/*
 * Structured mode: attributes, extensions and the payload from the JSON
 * CloudEvent value[0..value_len) (borrowed for the call; the payload is
 * copied into the arena).  Leaves the parsed document in ctx->root.
 * Returns 0 or -1.
 */
int env_take_structured(struct parse_ctx *ctx, const void *value, size_t value_len);

/* ------------------------------------------------------------------------- */
/* Attribute checks and derivations (envelope_attrs.c)                       */
/* ------------------------------------------------------------------------- */

/* NULL when s[0..len) is UTF-8 without control characters, else what is wrong. */
const char *env_text_problem(const unsigned char *s, size_t len);

/* CloudEvents attribute naming, [a-z0-9]+ (callers lower-case header names). */
bool env_attr_name_valid(const char *s, size_t len);

/*
 * The SPEC §3.1 table in a fixed order; fills ev->time_us and
 * ev->schema_major.  With ctx->issues every refusal is collected before
 * returning -1 with the first in *ctx->err.  Returns 0 or -1.
 */
int env_validate_attributes(struct parse_ctx *ctx, const char *topic, struct hub_event *ev);

/* Refuses a payload that cannot be JSON under a JSON content type and
 * flags the rest for the caller's grammar check.  Returns 0 or -1. */
int env_check_json_payload(struct parse_ctx *ctx);

/* ev->event_type (SPEC §3.1), in the arena.  Returns 0 or -1. */
int env_derive_event_type(struct parse_ctx *ctx, struct hub_event *ev);

/* ev->attrs_json and its length: every attribute kept, in the arena.
 * Returns 0 or -1. */
int env_build_attrs_json(struct parse_ctx *ctx, struct hub_event *ev);

#endif
