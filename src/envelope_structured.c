/*
 * envelope_structured — structured mode: one CloudEvent as a JSON document
 * (application/cloudevents+json, SPEC §3.1, §4), and batch mode's split of
 * a JSON array of them.
 *
 * The members of the document are the attributes; `data` is the payload
 * exactly as it appears in the received text (located byte for byte, since
 * jansson does not report positions), `data_base64` a binary payload.
 * Headers other than content-type and the plain trace headers are ignored,
 * as the bindings prescribe for structured mode.  Every JSON value is parsed
 * by jansson; the code here only steps over punctuation and whitespace of a
 * text jansson has already accepted.
 */
#include <jansson.h>
#include <limits.h>
#include <stdalign.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envelope_int.h"
#include "util.h"

/* jansson flags for parsing one value out of a longer text (see locate_data_span). */
#define JSON_LOAD_ONE                                                                              \
    (JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL)

/*
 * jansson flags for a whole document.  JSON_ALLOW_NUL: "\u0000" is legal
 * JSON; attribute values are checked apart.  JSON_DECODE_INT_AS_REAL:
 * integers beyond 64 bits (big amounts in data) are legal JSON too, and
 * jansson would refuse them as "too big integer"; the payload is taken from
 * the text, so how numbers decode does not matter except for Integer
 * extensions (take_member).
 */
#define JSON_LOAD_DOCUMENT (JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL)

static size_t skip_json_ws(const char *s, size_t len, size_t i) {
    while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) {
        i++;
    }
    return i;
}

/* ------------------------------------------------------------------------- */
/* Byte-exact spans                                                          */
/* ------------------------------------------------------------------------- */

/*
 * SPEC §3.1 wants the payload to be the `data` member "exactly as it appears
 * in the received JSON text", and jansson does not report member positions.
 * It does report, with JSON_DISABLE_EOF_CHECK, how many bytes one value
 * used.  So, on a text jansson has already accepted as a whole object, this
 * walks the top-level members letting jansson parse each key and each value
 * and only steps over the ", : { }" punctuation and JSON whitespace itself.
 * Every JSON value is still parsed by jansson; nothing here decides validity.
 * The last "data" member wins, as it does in jansson's object.
 * Returns 0 with [*start, *end) or -1 when not found (caller treats as a bug).
 */
static int locate_data_span(const char *text, size_t len, size_t *start, size_t *end) {
    bool found = false;
    json_error_t jerr;
    size_t i = skip_json_ws(text, len, 0);

    if (i >= len || text[i] != '{') {
        return -1;
    }
    i++;
    for (;;) {
        i = skip_json_ws(text, len, i);
        if (i >= len) {
            return -1;
        }
        if (text[i] == '}') {
            break;
        }
        json_t *key = json_loadb(text + i, len - i, JSON_LOAD_ONE, &jerr);
        if (!json_is_string(key) || jerr.position <= 0) {
            json_decref(key);
            return -1;
        }
        bool is_data =
            json_string_length(key) == 4 && memcmp(json_string_value(key), "data", 4) == 0;
        json_decref(key);
        i = skip_json_ws(text, len, i + (size_t)jerr.position);
        if (i >= len || text[i] != ':') {
            return -1;
        }
        i = skip_json_ws(text, len, i + 1);
        json_t *v = json_loadb(text + i, len - i, JSON_LOAD_ONE, &jerr);
        if (v == NULL || jerr.position <= 0) {
            json_decref(v);
            return -1;
        }
        json_decref(v);
        if (is_data) {
            *start = i;
            *end = i + (size_t)jerr.position;
            found = true;
        }
        i = skip_json_ws(text, len, i + (size_t)jerr.position);
        if (i < len && text[i] == ',') {
            i++;
            continue;
        }
        if (i < len && text[i] == '}') {
            break;
        }
        return -1;
    }
    return found ? 0 : -1;
}

/*
 * See envelope.h.  The whole text is parsed first, so that the walk below
 * only runs on a valid array and the element count is known before the
 * spans are allocated.
 */
long hub_envelope_batch_split(const void *value, size_t len, size_t max, size_t **spans) {
    const char *text = value;
    json_error_t jerr;
    json_t *all;
    size_t n = 0;
    size_t i;

    *spans = NULL;
    if (text == NULL || len > INT_MAX / 2 || memchr(text, '\0', len) != NULL) {
        return -1; /* a raw NUL is never JSON (see parse_document) */
    }
    all = json_loadb(text, len, JSON_LOAD_DOCUMENT, &jerr);
    if (!json_is_array(all) || json_array_size(all) > max) {
        json_decref(all);
        return -1;
    }
    if (json_array_size(all) > 0) {
        *spans = malloc(sizeof(**spans) * 2 * json_array_size(all));
        if (*spans == NULL) {
            json_decref(all);
            return -1;
        }
    }
    json_decref(all);
    /* As in locate_data_span: jansson measures each element, this only
     * steps over "[ , ]" and whitespace of a text jansson accepted whole. */
    i = skip_json_ws(text, len, 0) + 1; /* past '[' */
    for (;;) {
        i = skip_json_ws(text, len, i);
        if (i >= len || text[i] == ']') {
            break;
        }
        json_t *v = json_loadb(text + i, len - i, JSON_LOAD_ONE, &jerr);
        if (v == NULL || jerr.position <= 0 || *spans == NULL) {
            json_decref(v);
            break;
        }
        json_decref(v);
        (*spans)[2 * n] = i;
        (*spans)[2 * n + 1] = i + (size_t)jerr.position;
        n++;
        i = skip_json_ws(text, len, i + (size_t)jerr.position);
        if (i < len && text[i] == ',') {
            i++;
        }
    }
    return (long)n;
}

/* ------------------------------------------------------------------------- */
/* The document and its members                                              */
/* ------------------------------------------------------------------------- */

/*
 * The structured format the content-type header names: only
 * application/cloudevents+json is taken here (a batch is split by the
 * caller first, hub_envelope_batch_split).  Also refuses a value too large
 * for jansson's int positions.  Returns 0 or -1.
 */
static int check_format(struct parse_ctx *ctx, size_t value_len) {
    const struct hub_header *ct = &ctx->headers[ctx->plain_content_type - 1];
    const char *ctv = ct->value;
    size_t ctlen = ctv != NULL ? ct->value_len : 0;
    size_t end = 0;

    /* The media type without its parameters. */
    while (end < ctlen && ctv[end] != ';' && ctv[end] != ' ' && ctv[end] != '\t') {
        end++;
    }
    if (name_eq(ctv, end, "application/cloudevents-batch+json", 34)) {
        return env_fail(ctx->err, HUB_ENVELOPE_INVALID, "", 0,
                        "batch mode is not accepted here; split the batch into events first");
    }
    if (!name_eq(ctv, end, "application/cloudevents+json", 28)) {
        return env_fail(ctx->err, HUB_ENVELOPE_INVALID, "", 0,
                        "unsupported structured content type (only application/cloudevents+json)");
    }
    /* jansson reports positions as int; nothing that large is a sane event. */
    if (value_len > INT_MAX / 2) {
        return env_fail(ctx->err, HUB_ENVELOPE_TOO_LARGE, "data", 4,
                        "structured event of %zu bytes is too large", value_len);
    }
    return 0;
}

/*
 * Plain traceparent/tracestate headers, taken before the members so that
 * members of the same name override them (the event is the JSON document).
 * Never percent-decoded: they are not CloudEvents attribute headers.
 * Returns 0 or -1.
 */
static int take_trace_headers(struct parse_ctx *ctx) {
    if (ctx->plain_traceparent != NO_HEADER &&
        env_take_header_value(ctx, ctx->plain_traceparent, false, "traceparent", 11,
                              &ctx->val[A_TRACEPARENT]) != 0) {
        return -1;
    }
    if (ctx->plain_tracestate != NO_HEADER &&
        env_take_header_value(ctx, ctx->plain_tracestate, false, "tracestate", 10,
                              &ctx->val[A_TRACESTATE]) != 0) {
        return -1;
    }
    return 0;
}

/* Parses value[0..value_len) into ctx->root, which must be a JSON object.
 * Returns 0 or -1 (ctx->root may then hold a non-object; the caller frees it). */
static int parse_document(struct parse_ctx *ctx, const void *value, size_t value_len) {
    json_error_t jerr;

    if (value_len > 0 && memchr(value, '\0', value_len) != NULL) {
        /* A raw NUL is never JSON, but jansson 2.14 skips one that follows a
         * literal or a number ({"a":true<NUL>} parses): refused first. */
        return env_fail(ctx->err, HUB_ENVELOPE_INVALID, "", 0,
                        "structured event is not valid JSON (raw NUL byte)");
    }
    ctx->root = json_loadb(value != NULL ? value : "", value != NULL ? value_len : 0,
                           JSON_LOAD_DOCUMENT, &jerr);
    if (ctx->root == NULL && json_error_code(&jerr) == json_error_out_of_memory) {
        return env_fail_nomem(ctx); /* not the document's fault: parsed again later */
    }
    if (ctx->root == NULL) {
        return env_fail(ctx->err, HUB_ENVELOPE_INVALID, "", 0,
                        "structured event is not valid JSON (line %d, column %d)", jerr.line,
                        jerr.column);
    }
    if (!json_is_object(ctx->root)) {
        return env_fail(ctx->err, HUB_ENVELOPE_INVALID, "", 0,
                        "structured event must be a JSON object");
    }
    return 0;
}

/*
 * Turns one member value into an attribute string.  Dedicated attributes
 * must be JSON strings.  Extensions may also be a JSON integer (CloudEvents
 * Integer, 32-bit) or boolean: those are CloudEvents types whose canonical
 * string form is what binary mode would carry, so the event looks the same
 * whichever mode it came in.  Because the document is decoded with integers
 * as reals, an integral number written 5.0 or 5e0 is taken as 5 too.  JSON
 * null means "absent".  Returns 1 when absent, 0 when stored (in the arena),
 * -1 on error.
 */
static int take_member(struct parse_ctx *ctx, const char *name, size_t name_len, json_t *v,
                       bool extension, struct str *out) {
    char num[16];
    const char *p;
    size_t n;

    if (json_is_null(v)) {
        return 1;
    }
    if (json_is_string(v)) {
        p = json_string_value(v);
        n = json_string_length(v);
    } else if (extension && json_is_boolean(v)) {
        p = json_is_true(v) ? "true" : "false";
        n = strlen(p);
    } else if (extension && json_is_real(v) && json_real_value(v) >= INT32_MIN &&
               json_real_value(v) <= INT32_MAX &&
               json_real_value(v) == (double)(int32_t)json_real_value(v)) {
        /* The document is parsed with JSON_DECODE_INT_AS_REAL (JSON_LOAD_DOCUMENT). */
        n = (size_t)snprintf(num, sizeof(num), "%d", (int)(int32_t)json_real_value(v));
        p = num;
    } else {
        return env_fail(ctx->err, HUB_ENVELOPE_INVALID, name, name_len,
                        extension ? "%.*s must be a string, a boolean or a 32-bit integer"
                                  : "%.*s must be a JSON string",
                        FIELD_PRINT_LEN(name_len), name);
    }
    /* A JSON string may hold "\u0000" or "\n": attribute values may not. */
    const char *problem = env_text_problem((const unsigned char *)p, n);
    if (problem != NULL) {
        return env_fail(ctx->err, HUB_ENVELOPE_INVALID, name, name_len, "%.*s %s",
                        FIELD_PRINT_LEN(name_len), name, problem);
    }
    out->p = env_arena_strndup(&ctx->arena, p, n);
    if (out->p == NULL) {
        return env_fail_nomem(ctx);
    }
    out->n = n;
    return 0;
}

/*
 * One member other than data/data_base64: a dedicated attribute into
 * ctx->val, anything else appended to ctx->extensions (sized by the caller
 * for every member).  A null member is absent and leaves both alone.
 * Returns 0 or -1.
 */
static int take_attribute(struct parse_ctx *ctx, const char *key, size_t key_len, json_t *member) {
    if (!env_attr_name_valid(key, key_len)) {
        return env_fail(ctx->err, HUB_ENVELOPE_INVALID, key, key_len,
                        "attribute name must match [a-z0-9]+");
    }
    /* Member names are case-sensitive; a valid one is lower-case already,
     * so the lookup's case folding changes nothing. */
    enum attr_id a = env_lookup_attr(key, key_len);
    struct str v = {NULL, 0};
    int rc = take_member(ctx, key, key_len, member, a == A_COUNT, &v);
    if (rc != 0) {
        return rc < 0 ? -1 : 0;
    }
    if (a != A_COUNT) {
        ctx->val[a] = v;
        return 0;
    }
    char *name = env_arena_strndup(&ctx->arena, key, key_len);
    if (name == NULL) {
        return env_fail_nomem(ctx);
    }
    ctx->extensions[ctx->n_extensions].name = name;
    ctx->extensions[ctx->n_extensions].value = v.p;
    ctx->n_extensions++;
    return 0;
}

static int hub_attr_cmp(const void *a, const void *b) {
    return strcmp(((const struct hub_attr *)a)->name, ((const struct hub_attr *)b)->name);
}

/*
 * Walks the members of ctx->root: data and data_base64 are set apart in
 * *data / *data_b64 (borrowed from ctx->root; NULL when absent or null),
 * every other member becomes an attribute.  Then sorts the extensions and
 * sets the effective content type.  Returns 0 or -1.
 */
static int take_members(struct parse_ctx *ctx, json_t **data, json_t **data_b64) {
    size_t n_members = json_object_size(ctx->root);
    const char *key;
    size_t key_len;
    json_t *member;

    ctx->extensions = env_arena_alloc(&ctx->arena, n_members * sizeof(*ctx->extensions),
                                      alignof(struct hub_attr));
    if (ctx->extensions == NULL && n_members > 0) {
        return env_fail_nomem(ctx);
    }
    json_object_keylen_foreach(ctx->root, key, key_len, member) {
        if (key_len == 4 && memcmp(key, "data", 4) == 0) {
            *data = json_is_null(member) ? NULL : member;
        } else if (key_len == 11 && memcmp(key, "data_base64", 11) == 0) {
            *data_b64 = json_is_null(member) ? NULL : member;
        } else if (take_attribute(ctx, key, key_len, member) != 0) {
            return -1;
        }
    }
    if (ctx->n_extensions > 1) {
        qsort(ctx->extensions, ctx->n_extensions, sizeof(*ctx->extensions), hub_attr_cmp);
    }
    if (ctx->val[A_DATACONTENTTYPE].p != NULL) {
        ctx->content_type = ctx->val[A_DATACONTENTTYPE];
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* The payload                                                               */
/* ------------------------------------------------------------------------- */

/*
 * Decodes RFC 4648 base64 (padding optional, no whitespace) into the
 * arena as the payload.  Checks the size against the limit before
 * allocating.  Returns 0 or -1.
 */
static int take_data_base64(struct parse_ctx *ctx, const char *s, size_t len) {
    size_t out_len;
    if (hub_base64_decoded_len(s, len, &out_len) != 0) {
        return env_fail(ctx->err, HUB_ENVELOPE_INVALID, "data_base64", 11,
                        "data_base64 is not valid base64");
    }
    if (out_len > ctx->max_bytes) {
        return env_fail(ctx->err, HUB_ENVELOPE_TOO_LARGE, "data", 4,
                        "payload of %zu bytes exceeds the limit of %zu bytes", out_len,
                        ctx->max_bytes);
    }
    unsigned char *out = env_arena_alloc(&ctx->arena, out_len + 1, 1);
    if (out == NULL) {
        return env_fail_nomem(ctx);
    }
    size_t n;
    if (hub_base64_decode(s, len, 0, out, out_len, &n) != 0) {
        return env_fail(ctx->err, HUB_ENVELOPE_INVALID, "data_base64", 11,
                        "data_base64 is not valid base64");
    }
    out[n] = '\0';
    ctx->payload = out;
    ctx->payload_len = n;
    return 0;
}

/*
 * The `data` member (borrowed from ctx->root) as the payload, copied into
 * the arena: a string under a non-JSON content type is the data itself
 * (JSON event format §3.1); anything else is the member's exact bytes in
 * value[0..value_len), which jansson has parsed.  Returns 0 or -1.
 */
static int take_data(struct parse_ctx *ctx, const void *value, size_t value_len, json_t *data) {
    bool json_ct = ctx->content_type.p == NULL ||
                   hub_media_type_is_json(ctx->content_type.p, ctx->content_type.n);
    const char *src;
    size_t n;

    if (json_is_string(data) && !json_ct) {
        src = json_string_value(data);
        n = json_string_length(data);
    } else {
        size_t start = 0;
        size_t stop = 0;
        if (locate_data_span(value, value_len, &start, &stop) != 0) {
            return env_fail(ctx->err, HUB_ENVELOPE_INVALID, "data", 4,
                            "internal error: could not locate the data member");
        }
        src = (const char *)value + start;
        n = stop - start;
        /* jansson parsed this exact span as one JSON value. */
        ctx->payload_checked_json = true;
    }
    if (n > ctx->max_bytes) {
        return env_fail(ctx->err, HUB_ENVELOPE_TOO_LARGE, "data", 4,
                        "payload of %zu bytes exceeds the limit of %zu bytes", n, ctx->max_bytes);
    }
    /* Copied so that a structured payload never depends on the record value (envelope.h). */
    char *copy = env_arena_strndup(&ctx->arena, src, n);
    if (copy == NULL) {
        return env_fail_nomem(ctx);
    }
    ctx->payload = (const unsigned char *)copy;
    ctx->payload_len = n;
    return 0;
}

/* The payload from data, data_base64 (mutually exclusive) or neither.
 * Returns 0 or -1. */
static int take_payload(struct parse_ctx *ctx, const void *value, size_t value_len, json_t *data,
                        json_t *data_b64) {
    if (data != NULL && data_b64 != NULL) {
        return env_fail(ctx->err, HUB_ENVELOPE_INVALID, "data", 4,
                        "data and data_base64 are mutually exclusive");
    }
    if (data_b64 != NULL) {
        if (!json_is_string(data_b64)) {
            return env_fail(ctx->err, HUB_ENVELOPE_INVALID, "data_base64", 11,
                            "data_base64 must be a JSON string");
        }
        return take_data_base64(ctx, json_string_value(data_b64), json_string_length(data_b64));
    }
    if (data == NULL) {
        /* No data at all is a CloudEvent without payload, not a malformed JSON payload. */
        ctx->payload = (const unsigned char *)"";
        ctx->payload_len = 0;
        ctx->payload_absent = true;
        return 0;
    }
    return take_data(ctx, value, value_len, data);
}

/*
 * See envelope_int.h.  The steps run in this order because the first
 * refusal is the one reported: the format and size, the trace headers,
 * the JSON text, the members in document order, then the payload.
 */
int env_take_structured(struct parse_ctx *ctx, const void *value, size_t value_len) {
    json_t *data = NULL;
    json_t *data_b64 = NULL;

    if (check_format(ctx, value_len) != 0 || take_trace_headers(ctx) != 0 ||
        parse_document(ctx, value, value_len) != 0 || take_members(ctx, &data, &data_b64) != 0) {
        return -1;
    }
    return take_payload(ctx, value, value_len, data, data_b64);
}
