/*
 * envelope_binary — binary mode: CloudEvents attributes carried as headers
 * (SPEC §3.1; the Kafka and HTTP protocol bindings).
 *
 * Kafka records carry ce-<attr> or ce_<attr> headers with raw values; HTTP
 * requests carry ce-<attr> headers whose values are percent-decoded.  The
 * content-type header is datacontenttype, and plain traceparent/tracestate
 * headers compete with their ce- spellings.  When a name repeats, the last
 * header wins.  The payload is the record value itself, never copied.
 *
 * Header classification also runs for structured mode: the content-type
 * header it finds is what selects the mode (envelope.c), and structured
 * mode takes the plain trace headers through env_take_header_value.
 */
#include <stdalign.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "envelope_int.h"
#include "util.h"

/* A ce-* header that is not a known attribute, before dedup (binary mode). */
struct ext_ref {
    const char *name; /* after the prefix, as spelled */
    size_t name_len;
    size_t index; /* position in the header array: the last one wins */
};

/*
 * One pass over the headers: remembers the last header of each attribute
 * (index + 1) and collects every other ce-* header in ctx->ext_refs (a
 * scratch array sized on first use).  In HTTP mode only "ce-" is a prefix;
 * "ce_foo" is then an unrelated header and ignored.
 */
int env_classify_headers(struct parse_ctx *ctx) {
    for (size_t i = 0; i < ctx->n_headers; i++) {
        const struct hub_header *h = &ctx->headers[i];
        const char *name = h->name;
        size_t len = name != NULL ? h->name_len : 0;

        /* Header names are case-insensitive in both bindings; "ce_" is the
         * Kafka binding's alternative to "ce-". */
        if (len >= 3 && ascii_lower((unsigned char)name[0]) == 'c' &&
            ascii_lower((unsigned char)name[1]) == 'e' &&
            (name[2] == '-' || (name[2] == '_' && ctx->mode == HUB_ENVELOPE_KAFKA))) {
            enum attr_id a = env_lookup_attr(name + 3, len - 3);
            if (a != A_COUNT) {
                ctx->ce_slot[a] = i + 1;
                continue;
            }
            if (ctx->ext_refs == NULL) {
                /* Sized for the worst case once, so the scan stays O(n). */
                ctx->ext_refs = malloc((ctx->n_headers - i) * sizeof(*ctx->ext_refs));
                if (ctx->ext_refs == NULL) {
                    return env_fail_nomem(ctx);
                }
            }
            ctx->ext_refs[ctx->n_ext_refs++] = (struct ext_ref){name + 3, len - 3, i};
        } else if (name_eq(name, len, "content-type", 12)) {
            ctx->plain_content_type = i + 1;
        } else if (name_eq(name, len, "traceparent", 11)) {
            ctx->plain_traceparent = i + 1;
        } else if (name_eq(name, len, "tracestate", 10)) {
            ctx->plain_tracestate = i + 1;
        }
    }
    return 0;
}

/*
 * See envelope_int.h.  The HTTP binding's percent-decoding turns any "%XX"
 * into the byte XX; a '%' not followed by two hex digits is refused.
 */
int env_take_header_value(struct parse_ctx *ctx, size_t slot, bool decode, const char *field,
                          size_t field_len, struct str *out) {
    const struct hub_header *h = &ctx->headers[slot - 1];
    const unsigned char *in = h->value;
    size_t len = in != NULL ? h->value_len : 0;

    if (len == SIZE_MAX) {
        return env_fail_nomem(ctx);
    }
    /* Decoding only shrinks, so len + 1 bytes hold either result. */
    char *buf = env_arena_alloc(&ctx->arena, len + 1, 1);
    if (buf == NULL) {
        return env_fail_nomem(ctx);
    }
    size_t n = 0;
    if (decode) {
        for (size_t i = 0; i < len; i++) {
            if (in[i] != '%') {
                buf[n++] = (char)in[i];
                continue;
            }
            int hi = len - i >= 3 ? hub_hex_value(in[i + 1]) : -1;
            int lo = len - i >= 3 ? hub_hex_value(in[i + 2]) : -1;
            if (hi < 0 || lo < 0) {
                return env_fail(ctx->err, HUB_ENVELOPE_INVALID, field, field_len,
                                "%.*s has a malformed percent-encoding", FIELD_PRINT_LEN(field_len),
                                field);
            }
            buf[n++] = (char)(hi * 16 + lo);
            i += 2;
        }
    } else if (len > 0) {
        memcpy(buf, in, len);
        n = len;
    }
    buf[n] = '\0';

    /* Checked after decoding: "%00" or "%0A" must not smuggle a control byte in. */
    const char *problem = env_text_problem((const unsigned char *)buf, n);
    if (problem != NULL) {
        return env_fail(ctx->err, HUB_ENVELOPE_INVALID, field, field_len, "%.*s %s",
                        FIELD_PRINT_LEN(field_len), field, problem);
    }
    out->p = buf;
    out->n = n;
    return 0;
}

/* Case-insensitive equality of two extension ref names. */
static bool ext_ref_same_name(const struct ext_ref *x, const struct ext_ref *y) {
    if (x->name_len != y->name_len) {
        return false;
    }
    for (size_t i = 0; i < x->name_len; i++) {
        if (ascii_lower((unsigned char)x->name[i]) != ascii_lower((unsigned char)y->name[i])) {
            return false;
        }
    }
    return true;
}

/* qsort order of extension refs: lower-cased name, then header position. */
static int ext_ref_cmp(const void *a, const void *b) {
    const struct ext_ref *x = a;
    const struct ext_ref *y = b;
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;

    for (size_t i = 0; i < n; i++) {
        unsigned char cx = ascii_lower((unsigned char)x->name[i]);
        unsigned char cy = ascii_lower((unsigned char)y->name[i]);
        if (cx != cy) {
            return cx < cy ? -1 : 1;
        }
    }
    if (x->name_len != y->name_len) {
        return x->name_len < y->name_len ? -1 : 1;
    }
    return x->index < y->index ? -1 : (x->index > y->index ? 1 : 0);
}

/*
 * Extensions of binary mode: sort the refs so that equal names are adjacent
 * with the last header of each name last, keep that one, and check the name
 * ([a-z0-9]+, after lower-casing since header names are case-insensitive)
 * and the value.  The result, in the arena, is sorted by name.  Returns 0
 * or -1.
 */
static int take_binary_extensions(struct parse_ctx *ctx) {
    size_t n = ctx->n_ext_refs;

    if (n == 0) {
        return 0;
    }
    qsort(ctx->ext_refs, n, sizeof(*ctx->ext_refs), ext_ref_cmp);

    /* A ref wins when the next one has another name; count winners to size the array. */
    size_t unique = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + 1 == n || !ext_ref_same_name(&ctx->ext_refs[i], &ctx->ext_refs[i + 1])) {
            unique++;
        }
    }
    ctx->extensions =
        env_arena_alloc(&ctx->arena, unique * sizeof(*ctx->extensions), alignof(struct hub_attr));
    if (ctx->extensions == NULL) {
        return env_fail_nomem(ctx);
    }

    bool decode = ctx->mode == HUB_ENVELOPE_HTTP;
    for (size_t i = 0; i < n; i++) {
        const struct ext_ref *r = &ctx->ext_refs[i];
        if (i + 1 < n && ext_ref_same_name(r, &ctx->ext_refs[i + 1])) {
            continue; /* a later header of the same name wins */
        }
        char *name = env_arena_strndup(&ctx->arena, r->name, r->name_len);
        if (name == NULL) {
            return env_fail_nomem(ctx);
        }
        for (size_t k = 0; k < r->name_len; k++) {
            name[k] = (char)ascii_lower((unsigned char)name[k]);
        }
        if (!env_attr_name_valid(name, r->name_len)) {
            return env_fail(ctx->err, HUB_ENVELOPE_INVALID, name, r->name_len,
                            "extension attribute name must match [a-z0-9]+");
        }
        /* "data" is the payload's member in the JSON format: an extension of
         * that name could not be carried in structured mode. */
        if (strcmp(name, "data") == 0) {
            return env_fail(ctx->err, HUB_ENVELOPE_INVALID, "data", 4,
                            "\"data\" is reserved and cannot be an extension attribute");
        }
        struct str v;
        if (env_take_header_value(ctx, r->index + 1, decode, name, r->name_len, &v) != 0) {
            return -1;
        }
        ctx->extensions[ctx->n_extensions].name = name;
        ctx->extensions[ctx->n_extensions].value = v.p;
        ctx->n_extensions++;
    }
    return 0;
}

/*
 * See envelope_int.h.  Dedicated attributes are taken in enum order, then
 * the content type, then the extensions: the first refusal names the
 * attribute at fault, so this order is part of the observable behaviour.
 */
int env_take_binary(struct parse_ctx *ctx, const void *value, size_t value_len) {
    bool decode = ctx->mode == HUB_ENVELOPE_HTTP;

    for (int a = 0; a < A_COUNT; a++) {
        size_t slot = ctx->ce_slot[a];
        /* A plain traceparent/tracestate header competes with its ce- spelling. */
        bool plain = false;
        if (a == A_TRACEPARENT && ctx->plain_traceparent > slot) {
            slot = ctx->plain_traceparent;
            plain = true;
        } else if (a == A_TRACESTATE && ctx->plain_tracestate > slot) {
            slot = ctx->plain_tracestate;
            plain = true;
        }
        if (slot == NO_HEADER) {
            continue;
        }
        /* Only ce- values are percent-encoded by the HTTP binding; plain headers are not. */
        if (env_take_header_value(ctx, slot, decode && !plain, env_attr_names[a].name,
                                  env_attr_names[a].len, &ctx->val[a]) != 0) {
            return -1;
        }
    }

    if (ctx->val[A_DATACONTENTTYPE].p != NULL) {
        ctx->content_type = ctx->val[A_DATACONTENTTYPE];
    } else if (ctx->plain_content_type != NO_HEADER) {
        /* The binding maps datacontenttype to the content-type header. */
        if (env_take_header_value(ctx, ctx->plain_content_type, false, "datacontenttype", 15,
                                  &ctx->content_type) != 0) {
            return -1;
        }
        ctx->content_type_from_header = true;
    }

    if (take_binary_extensions(ctx) != 0) {
        return -1;
    }

    /* A NULL value is an empty payload; ev->payload itself is never NULL. */
    static const unsigned char empty[1] = {0};
    ctx->payload = value != NULL ? value : empty;
    ctx->payload_len = value != NULL ? value_len : 0;
    return 0;
}
