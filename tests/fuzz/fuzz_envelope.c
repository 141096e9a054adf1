/*
 * libFuzzer target for hub_envelope_parse() and its pure helpers.
 *
 * Input framing (text, so seeds are readable; any bytes are allowed):
 *
 *   - Lines up to the first empty line are headers; a line ends at '\n'
 *     (a '\r' before it stays part of the line, so CRs reach the parser).
 *   - "name: value" -> one header.  The name ends at the first ':'; one
 *     space after the colon is dropped; the rest, any bytes, is the value.
 *   - A line without ':' is a header with that name and a NULL value.
 *   - Directive lines start with '@' and are not headers:
 *       @http        HTTP binding mode (default: Kafka)
 *       @topic=T     the Kafka topic (default: none, NULL)
 *       @max=N       limits.max_event_bytes (default 1048576)
 *       @tenant=T    limits.default_tenant (HTTP ingest: the API key's tenant)
 *   - Everything after the empty line is the record value; with no empty
 *     line there is no value at all (NULL, length 0).
 *
 * Every header name, header value and the record value are copied into
 * their own exactly-sized heap blocks, so AddressSanitizer catches a read
 * one byte past any of them (they are not NUL-terminated).
 *
 * On success the target checks the invariants callers rely on (strings
 * present and bounded, payload and digest consistent, attrs_json is a JSON
 * object, extensions sorted and well named, a JSON payload has no raw NUL
 * and is flagged for its grammar check unless a structured event carried it
 * parsed); on failure that the event was left empty and a reason was given.
 * Any violation aborts, which libFuzzer reports as a crash.
 *
 * Each input is parsed a second time with a collector of every refusal
 * (HTTP ingest's), which must not change the verdict or the error.
 *
 * The value is also handed to hub_envelope_batch_split (batch mode, SPEC
 * §4): every span it reports must be in bounds, in order, one whole JSON
 * value, and as many as the elements of the array jansson reads.
 *
 * FUZZ_ENVELOPE_VERBOSE=1 prints each input's verdict (handy when writing
 * seeds: ./fuzz_envelope -runs=0 tests/fixtures/corpus/envelope).
 */
#include <jansson.h>
#include <openssl/sha.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "envelope.h"

#define FUZZ_MAX_HEADERS 4096

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);          \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Exact-size heap copy (malloc(0) avoided so that the pointer is never NULL by accident). */
static void *copy_exact(const uint8_t *p, size_t n) {
    void *c = malloc(n > 0 ? n : 1);
    if (c == NULL) {
        abort();
    }
    if (n > 0) {
        memcpy(c, p, n);
    }
    return c;
}

/* Exact-size NUL-terminated copy (an embedded NUL simply ends the string early). */
static char *copy_cstr(const void *p, size_t n) {
    char *c = malloc(n + 1);
    if (c == NULL) {
        abort();
    }
    if (n > 0) {
        memcpy(c, p, n);
    }
    c[n] = '\0';
    return c;
}

static int is_json_type(const char *ct) {
    size_t end = strcspn(ct, ";");
    while (end > 0 && (ct[end - 1] == ' ' || ct[end - 1] == '\t')) {
        end--;
    }
    if ((end == 16 && strncasecmp(ct, "application/json", 16) == 0) ||
        (end == 9 && strncasecmp(ct, "text/json", 9) == 0)) {
        return 1;
    }
    const char *slash = memchr(ct, '/', end);
    return slash != NULL && (size_t)(ct + end - slash) > 5 &&
           strncasecmp(ct + end - 5, "+json", 5) == 0;
}

static void check_event(const struct hub_event *ev, const void *value, size_t value_len,
                        size_t max_bytes) {
    CHECK(ev->arena_ != NULL);
    CHECK(ev->specversion != NULL && strcmp(ev->specversion, "1.0") == 0);
    CHECK(ev->id != NULL && strlen(ev->id) >= 1 && strlen(ev->id) <= 256);
    CHECK(ev->source != NULL && strlen(ev->source) >= 1 && strlen(ev->source) <= 1024);
    CHECK(ev->type != NULL && strlen(ev->type) >= 1 && strlen(ev->type) <= 256);
    CHECK(ev->tenant != NULL && strlen(ev->tenant) >= 1 && strlen(ev->tenant) <= 256);
    CHECK(ev->subject == NULL || (strlen(ev->subject) >= 1 && strlen(ev->subject) <= 1024));
    CHECK(ev->content_type != NULL && ev->event_type != NULL);
    CHECK(ev->schema_major >= 0);

    int64_t t = 0;
    CHECK(ev->time != NULL && hub_rfc3339_parse(ev->time, strlen(ev->time), &t) == 0);
    CHECK(t == ev->time_us);
    if (ev->schema_version != NULL) {
        CHECK(hub_schema_major_parse(ev->schema_version, strlen(ev->schema_version)) ==
              ev->schema_major);
    }

    CHECK(ev->payload != NULL);
    CHECK(ev->payload_len <= max_bytes);
    if (!ev->structured && value != NULL) {
        CHECK(ev->payload == value && ev->payload_len == value_len);
    }
    unsigned char digest[32];
    SHA256(ev->payload, ev->payload_len, digest);
    CHECK(memcmp(digest, ev->digest, 32) == 0);

    for (size_t i = 0; i < ev->n_extensions; i++) {
        const char *name = ev->extensions[i].name;
        CHECK(name[0] != '\0' &&
              strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789") == strlen(name));
        CHECK(ev->extensions[i].value != NULL);
        if (i > 0) {
            CHECK(strcmp(ev->extensions[i - 1].name, name) < 0);
        }
    }

    json_error_t jerr;
    CHECK(ev->attrs_json != NULL && strlen(ev->attrs_json) == ev->attrs_json_len);
    json_t *attrs = json_loadb(ev->attrs_json, ev->attrs_json_len, 0, &jerr);
    CHECK(json_is_object(attrs));
    CHECK(json_is_string(json_object_get(attrs, "id")));
    /* attrs_json is written by hand: it must be exactly jansson's encoding. */
    char *again = json_dumps(attrs, JSON_COMPACT | JSON_SORT_KEYS);
    CHECK(again != NULL && strcmp(again, ev->attrs_json) == 0);
    free(again);
    CHECK(json_object_size(attrs) == ev->n_extensions + 6 + (ev->subject != NULL) +
                                         (ev->schema_version != NULL) + (ev->dataschema != NULL) +
                                         (ev->resourcetype != NULL) + (ev->eventtype != NULL) +
                                         (ev->traceparent != NULL) + (ev->tracestate != NULL) + 1);
    json_decref(attrs);

    if (is_json_type(ev->content_type) && ev->payload_len > 0) {
        CHECK(memchr(ev->payload, '\0', ev->payload_len) == NULL);
        if (!ev->json_unchecked) { /* a structured event's data, parsed with it */
            CHECK(ev->structured);
            json_t *doc =
                json_loadb((const char *)ev->payload, ev->payload_len,
                           JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &jerr);
            CHECK(doc != NULL);
            json_decref(doc);
        }
    } else {
        CHECK(!ev->json_unchecked); /* only a JSON payload has a grammar to check */
    }
}

/* Batch mode's splitter against jansson's own reading of the array. */
static void check_batch_split(const void *value, size_t len) {
    enum { MAX = 64 };
    size_t *spans = NULL;
    long n = hub_envelope_batch_split(value, len, MAX, &spans);
    json_t *all = value != NULL && memchr(value, '\0', len) == NULL
                      ? json_loadb(value, len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, NULL)
                      : NULL;

    if (!json_is_array(all) || json_array_size(all) > MAX) {
        CHECK(n == -1 && spans == NULL);
    } else {
        CHECK(n == (long)json_array_size(all));
        for (long i = 0; i < n; i++) {
            size_t start = spans[2 * i], end = spans[2 * i + 1];
            CHECK(start < end && end <= len);
            CHECK(i == 0 || start > spans[2 * i - 1]);
            json_error_t jerr;
            json_t *one =
                json_loadb((const char *)value + start, end - start,
                           JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &jerr);
            CHECK(one != NULL);
            CHECK(json_equal(one, json_array_get(all, (size_t)i)));
            json_decref(one);
        }
    }
    json_decref(all);
    free(spans);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct hub_header headers[FUZZ_MAX_HEADERS];
    size_t n = 0;
    enum hub_envelope_mode mode = HUB_ENVELOPE_KAFKA;
    char *topic = NULL;
    char *tenant = NULL;
    struct hub_envelope_limits limits = {1048576, NULL};
    void *value = NULL;
    size_t value_len = 0;
    size_t pos = 0;

    while (pos < size) {
        const uint8_t *line = data + pos;
        const uint8_t *nl = memchr(line, '\n', size - pos);
        size_t len = nl != NULL ? (size_t)(nl - line) : size - pos;
        pos += len + (nl != NULL ? 1 : 0);
        if (len == 0) {
            value_len = size - pos;
            value = copy_exact(data + pos, value_len);
            break;
        }
        if (line[0] == '@') {
            if (len == 5 && memcmp(line, "@http", 5) == 0) {
                mode = HUB_ENVELOPE_HTTP;
            } else if (len >= 7 && memcmp(line, "@topic=", 7) == 0 && topic == NULL) {
                topic = copy_cstr(line + 7, len - 7);
            } else if (len >= 8 && memcmp(line, "@tenant=", 8) == 0 && tenant == NULL) {
                tenant = copy_cstr(line + 8, len - 8);
                limits.default_tenant = tenant;
            } else if (len >= 5 && memcmp(line, "@max=", 5) == 0) {
                size_t max = 0;
                for (size_t i = 5; i < len && i < 5 + 9 && line[i] >= '0' && line[i] <= '9'; i++) {
                    max = max * 10 + (size_t)(line[i] - '0');
                }
                limits.max_event_bytes = max;
            }
            continue;
        }
        if (n == FUZZ_MAX_HEADERS) {
            continue;
        }
        const uint8_t *colon = memchr(line, ':', len);
        size_t name_len = colon != NULL ? (size_t)(colon - line) : len;
        headers[n].name = copy_exact(line, name_len);
        headers[n].name_len = name_len;
        if (colon != NULL) {
            size_t off = name_len + 1;
            if (off < len && line[off] == ' ') {
                off++;
            }
            headers[n].value = copy_exact(line + off, len - off);
            headers[n].value_len = len - off;
        } else {
            headers[n].value = NULL;
            headers[n].value_len = 0;
        }
        n++;
    }

    static int verbose = -1;
    if (verbose < 0) {
        verbose = getenv("FUZZ_ENVELOPE_VERBOSE") != NULL;
    }
    struct hub_event ev;
    struct hub_envelope_error err;
    int rc = hub_envelope_parse(mode, headers, n, value, value_len, topic, &limits, &ev, &err);
    if (verbose) {
        fprintf(stderr, "verdict: %s field='%s' %s\n",
                rc == 0 ? "ok" : hub_envelope_reason_str(err.reason), rc == 0 ? "" : err.field,
                rc == 0 ? (ev.event_type != NULL ? ev.event_type : "") : err.message);
    }
    if (rc == 0) {
        CHECK(err.reason == HUB_ENVELOPE_OK);
        check_event(&ev, value, value_len, limits.max_event_bytes);
        hub_event_free(&ev);
        CHECK(ev.arena_ == NULL);
    } else {
        CHECK(err.reason == HUB_ENVELOPE_INVALID || err.reason == HUB_ENVELOPE_TOO_LARGE);
        CHECK(err.message[0] != '\0');
        CHECK(memchr(err.field, '\0', sizeof(err.field)) != NULL);
        CHECK(strstr(err.message, "internal error") == NULL);
        CHECK(ev.arena_ == NULL && ev.id == NULL && ev.payload == NULL);
    }

    /* A collector of every refusal changes nothing about the verdict, and
     * its first entry is the error reported. */
    struct hub_envelope_issues issues;
    struct hub_envelope_limits collecting = limits;
    struct hub_event ev2;
    struct hub_envelope_error err2;
    collecting.issues = &issues;
    int rc2 =
        hub_envelope_parse(mode, headers, n, value, value_len, topic, &collecting, &ev2, &err2);
    CHECK(rc2 == rc && err2.reason == err.reason);
    CHECK(strcmp(err2.field, err.field) == 0 && strcmp(err2.message, err.message) == 0);
    CHECK(issues.n <= HUB_ENVELOPE_MAX_ISSUES);
    CHECK(rc != 0 || issues.n == 0);
    CHECK(issues.n == 0 || (strcmp(issues.item[0].field, err.field) == 0 &&
                            strcmp(issues.item[0].message, err.message) == 0));
    if (rc2 == 0) {
        hub_event_free(&ev2);
    }

    check_batch_split(value, value_len);

    /* The pure helpers, straight on the value bytes. */
    int64_t us;
    (void)hub_rfc3339_parse(value, value != NULL ? value_len : 0, &us);
    int major = hub_schema_major_parse(value, value != NULL ? value_len : 0);
    CHECK(major >= -1);
    char *s = copy_cstr(value, value_len);
    CHECK(hub_topic_schema_major(s) >= 0);
    char out[16];
    size_t full = hub_event_type_derive(s, n > 0 ? s : NULL, n > 1 ? s : NULL, out, sizeof(out));
    CHECK(strlen(out) == (full < sizeof(out) ? full : sizeof(out) - 1));
    free(s);

    for (size_t i = 0; i < n; i++) {
        free((void *)headers[i].name);
        free((void *)headers[i].value);
    }
    free(value);
    free(topic);
    free(tenant);
    return 0;
}
