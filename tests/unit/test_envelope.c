/*
 * Unit tests of the envelope parser (SPEC §3.1, §4): every validation rule
 * with a passing and a failing case, asserting the exact reason and field a
 * user would see in quarantine or in a 400 problem+json.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "envelope.h"

#define MAX_HEADERS 64
#define NAME_CAP 64

/* One record under construction: headers, value, topic, mode and limits. */
struct msg {
    struct hub_header h[MAX_HEADERS];
    char names[MAX_HEADERS][NAME_CAP];
    size_t n;
    const char *value;
    size_t value_len;
    const char *topic;
    enum hub_envelope_mode mode;
    struct hub_envelope_limits limits;
};

/* Appends a header (repeats allowed: that is how last-one-wins is tested). */
static void add_n(struct msg *m, const char *name, const void *value, size_t len) {
    assert_true(m->n < MAX_HEADERS);
    snprintf(m->names[m->n], NAME_CAP, "%s", name);
    m->h[m->n].name = m->names[m->n];
    m->h[m->n].name_len = strlen(name);
    m->h[m->n].value = value;
    m->h[m->n].value_len = len;
    m->n++;
}

static void add(struct msg *m, const char *name, const char *value) {
    add_n(m, name, value, strlen(value));
}

/* Removes every header spelled exactly `name`. */
static void del(struct msg *m, const char *name) {
    size_t out = 0;
    for (size_t i = 0; i < m->n; i++) {
        if (strcmp(m->names[i], name) != 0) {
            memmove(m->names[out], m->names[i], NAME_CAP);
            m->h[out] = m->h[i];
            m->h[out].name = m->names[out];
            out++;
        }
    }
    m->n = out;
}

/* Replaces (or adds) header `name` with a NUL-terminated value. */
static void put_n(struct msg *m, const char *name, const void *value, size_t len) {
    del(m, name);
    add_n(m, name, value, len);
}

static void put(struct msg *m, const char *name, const char *value) {
    put_n(m, name, value, strlen(value));
}

/* A valid Kafka binary-mode record with prefix "ce-" or "ce_" and a JSON payload. */
static void base_with(struct msg *m, const char *prefix) {
    char name[NAME_CAP];
    static const char *const attrs[][2] = {
        {"specversion", "1.0"},           {"id", "evt-1"},
        {"source", "//ledger/acme"},      {"type", "studio.lerian.transaction.posted"},
        {"time", "2024-05-01T10:00:00Z"}, {"tenantid", "acme"},
    };

    memset(m, 0, sizeof(*m));
    for (size_t i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++) {
        snprintf(name, sizeof(name), "%s%s", prefix, attrs[i][0]);
        add(m, name, attrs[i][1]);
    }
    m->value = "{\"amount\":100}";
    m->value_len = strlen(m->value);
    m->mode = HUB_ENVELOPE_KAFKA;
    m->limits.max_event_bytes = 1048576;
}

static void base(struct msg *m) {
    base_with(m, "ce-");
}

static void set_value(struct msg *m, const char *value) {
    m->value = value;
    m->value_len = value != NULL ? strlen(value) : 0;
}

static int run(const struct msg *m, struct hub_event *ev, struct hub_envelope_error *err) {
    return hub_envelope_parse(m->mode, m->h, m->n, m->value, m->value_len, m->topic, &m->limits, ev,
                              err);
}

/* Parses and fails the test with the parser's own words when it refuses. */
static void expect_ok(const struct msg *m, struct hub_event *ev) {
    struct hub_envelope_error err;
    if (run(m, ev, &err) != 0) {
        fail_msg("refused: field '%s': %s", err.field, err.message);
    }
    assert_int_equal(err.reason, HUB_ENVELOPE_OK);
}

/* Expects a refusal with this reason and field; the event must be left empty. */
static void expect_refused(const struct msg *m, enum hub_envelope_reason reason,
                           const char *field) {
    struct hub_event ev;
    struct hub_envelope_error err;
    memset(&ev, 0xab, sizeof(ev));
    if (run(m, &ev, &err) == 0) {
        hub_event_free(&ev);
        fail_msg("accepted, expected %s on field '%s'", hub_envelope_reason_str(reason), field);
    }
    if (err.reason != reason || strcmp(err.field, field) != 0) {
        fail_msg("got %s on '%s' (%s), expected %s on '%s'", hub_envelope_reason_str(err.reason),
                 err.field, err.message, hub_envelope_reason_str(reason), field);
    }
    assert_true(err.message[0] != '\0');
    assert_null(ev.arena_);
    assert_null(ev.id);
    assert_null(ev.payload);
}

static void expect_invalid(const struct msg *m, const char *field) {
    expect_refused(m, HUB_ENVELOPE_INVALID, field);
}

/* Parses a record that differs from base() by one header. */
static void expect_header_ok(const char *name, const char *value) {
    struct msg m;
    struct hub_event ev;
    base(&m);
    put(&m, name, value);
    expect_ok(&m, &ev);
    hub_event_free(&ev);
}

static void expect_header_invalid(const char *name, const char *value, const char *field) {
    struct msg m;
    base(&m);
    put(&m, name, value);
    expect_invalid(&m, field);
}

/* A string of n copies of c (freed by the caller). */
static char *repeat(char c, size_t n) {
    char *s = malloc(n + 1);
    assert_non_null(s);
    memset(s, c, n);
    s[n] = '\0';
    return s;
}

static const char *ext_value(const struct hub_event *ev, const char *name) {
    for (size_t i = 0; i < ev->n_extensions; i++) {
        if (strcmp(ev->extensions[i].name, name) == 0) {
            return ev->extensions[i].value;
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------------- */
/* Binary mode basics                                                        */
/* ------------------------------------------------------------------------- */

static void test_minimal_binary_event(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    base(&m);
    expect_ok(&m, &ev);

    assert_string_equal(ev.specversion, "1.0");
    assert_string_equal(ev.id, "evt-1");
    assert_string_equal(ev.source, "//ledger/acme");
    assert_string_equal(ev.type, "studio.lerian.transaction.posted");
    assert_string_equal(ev.time, "2024-05-01T10:00:00Z");
    assert_true(ev.time_us == INT64_C(1714557600000000));
    assert_string_equal(ev.tenant, "acme");
    assert_null(ev.subject);
    assert_null(ev.schema_version);
    assert_string_equal(ev.content_type, "application/json");
    assert_null(ev.dataschema);
    assert_null(ev.resourcetype);
    assert_null(ev.eventtype);
    assert_null(ev.traceparent);
    assert_null(ev.tracestate);
    assert_string_equal(ev.event_type, "transaction.posted");
    assert_int_equal(ev.schema_major, 1);
    assert_int_equal(ev.n_extensions, 0);
    assert_int_equal(ev.structured, 0);
    assert_int_equal(ev.payload_len, m.value_len);
    assert_string_equal(ev.attrs_json, "{\"datacontenttype\":\"application/json\",\"id\":\"evt-1\","
                                       "\"source\":\"//ledger/acme\",\"specversion\":\"1.0\","
                                       "\"tenantid\":\"acme\",\"time\":\"2024-05-01T10:00:00Z\","
                                       "\"type\":\"studio.lerian.transaction.posted\"}");
    assert_int_equal(ev.attrs_json_len, strlen(ev.attrs_json));
    hub_event_free(&ev);
    assert_null(ev.arena_);
    assert_null(ev.id);
}

static void test_binary_payload_is_zero_copy_and_digest(void **state) {
    (void)state;
    static const unsigned char abc_sha256[32] = {0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea,
                                                 0x41, 0x41, 0x40, 0xde, 0x5d, 0xae, 0x22, 0x23,
                                                 0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c,
                                                 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
    char value[] = "abc";
    struct msg m;
    struct hub_event ev;
    base(&m);
    put(&m, "content-type", "text/plain");
    m.value = value;
    m.value_len = 3;
    expect_ok(&m, &ev);
    assert_ptr_equal(ev.payload, (const unsigned char *)value);
    assert_int_equal(ev.payload_len, 3);
    assert_memory_equal(ev.digest, abc_sha256, 32);
    assert_string_equal(ev.content_type, "text/plain");
    hub_event_free(&ev);
}

static void test_empty_payload_digest(void **state) {
    (void)state;
    static const unsigned char empty_sha256[32] = {0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14,
                                                   0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9, 0x24,
                                                   0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b, 0x93, 0x4c,
                                                   0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55};
    struct msg m;
    struct hub_event ev;
    base(&m);
    put(&m, "ce-datacontenttype", "application/octet-stream");
    set_value(&m, NULL);
    expect_ok(&m, &ev);
    assert_non_null(ev.payload);
    assert_int_equal(ev.payload_len, 0);
    assert_memory_equal(ev.digest, empty_sha256, 32);
    hub_event_free(&ev);
}

static void test_underscore_prefix_kafka(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    base_with(&m, "ce_");
    add(&m, "ce_subject", "acct/1");
    add(&m, "ce_myext", "v");
    expect_ok(&m, &ev);
    assert_string_equal(ev.id, "evt-1");
    assert_string_equal(ev.subject, "acct/1");
    assert_string_equal(ext_value(&ev, "myext"), "v");
    hub_event_free(&ev);
}

static void test_underscore_prefix_ignored_in_http(void **state) {
    (void)state;
    struct msg m;
    base_with(&m, "ce_");
    m.mode = HUB_ENVELOPE_HTTP;
    expect_invalid(&m, "specversion");
}

static void test_header_names_case_insensitive(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    base(&m);
    del(&m, "ce-id");
    del(&m, "ce-type");
    add(&m, "CE-ID", "upper");
    add(&m, "Ce_Type", "com.example.thing");
    add(&m, "CE-MyExt", "x");
    add(&m, "Content-Type", "application/json; charset=utf-8");
    expect_ok(&m, &ev);
    assert_string_equal(ev.id, "upper");
    assert_string_equal(ev.type, "com.example.thing");
    assert_string_equal(ext_value(&ev, "myext"), "x");
    assert_string_equal(ev.content_type, "application/json; charset=utf-8");
    hub_event_free(&ev);
}

static void test_last_header_wins(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    base(&m);
    add(&m, "ce_id", "second");
    add(&m, "ce-id", "third");
    add(&m, "ce-zz", "first");
    add(&m, "ce-aa", "a1");
    add(&m, "CE_ZZ", "last");
    /* An earlier header with a control character is overridden, so harmless. */
    add(&m, "ce-subject", "bad\x01");
    add(&m, "ce-subject", "good");
    expect_ok(&m, &ev);
    assert_string_equal(ev.id, "third");
    assert_string_equal(ev.subject, "good");
    assert_int_equal(ev.n_extensions, 2);
    assert_string_equal(ev.extensions[0].name, "aa");
    assert_string_equal(ev.extensions[0].value, "a1");
    assert_string_equal(ev.extensions[1].name, "zz");
    assert_string_equal(ev.extensions[1].value, "last");
    hub_event_free(&ev);
}

static void test_unrelated_headers_ignored(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    base(&m);
    add(&m, "x-binary", "\x01\x02\xff");
    add(&m, "cex-id", "nope");
    add(&m, "c", "short");
    add_n(&m, "", "", 0);
    add_n(&m, "x-null", NULL, 0);
    expect_ok(&m, &ev);
    assert_string_equal(ev.id, "evt-1");
    assert_int_equal(ev.n_extensions, 0);
    hub_event_free(&ev);
}

static void test_failed_parse_leaves_event_empty_and_free_is_safe(void **state) {
    (void)state;
    struct hub_event ev;
    memset(&ev, 0, sizeof(ev));
    hub_event_free(&ev);
    hub_event_free(&ev);
    hub_event_free(NULL);

    struct msg m;
    base(&m);
    put(&m, "ce-specversion", "0.3");
    expect_invalid(&m, "specversion");
}

static void test_null_error_pointer_and_limits(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    base(&m);
    /* NULL limits use the SPEC default (1 MiB); NULL err is allowed. */
    assert_int_equal(
        hub_envelope_parse(m.mode, m.h, m.n, m.value, m.value_len, NULL, NULL, &ev, NULL), 0);
    hub_event_free(&ev);
    assert_int_equal(
        hub_envelope_parse(m.mode, NULL, 0, m.value, m.value_len, NULL, NULL, &ev, NULL), -1);
}

static void test_reason_strings(void **state) {
    (void)state;
    assert_string_equal(hub_envelope_reason_str(HUB_ENVELOPE_INVALID), "invalid_envelope");
    assert_string_equal(hub_envelope_reason_str(HUB_ENVELOPE_TOO_LARGE), "too_large");
}

/* ------------------------------------------------------------------------- */
/* Required attributes and lengths                                           */
/* ------------------------------------------------------------------------- */

static void test_required_attributes(void **state) {
    (void)state;
    static const char *const required[] = {"specversion", "id",   "source",
                                           "type",        "time", "tenantid"};
    for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
        char name[NAME_CAP];
        struct msg m;
        base(&m);
        snprintf(name, sizeof(name), "ce-%s", required[i]);
        del(&m, name);
        expect_invalid(&m, required[i]);
        /* and present but empty */
        base(&m);
        put(&m, name, "");
        expect_invalid(&m, required[i]);
    }
}

static void test_specversion_exact(void **state) {
    (void)state;
    expect_header_invalid("ce-specversion", "1", "specversion");
    expect_header_invalid("ce-specversion", "1.0 ", "specversion");
    expect_header_invalid("ce-specversion", "1.01", "specversion");
    expect_header_ok("ce-specversion", "1.0");
}

/* The attribute at `name` accepts max bytes and refuses max + 1. */
static void check_length_limit(const char *name, const char *field, char fill, size_t max) {
    char *ok = repeat(fill, max);
    char *too_long = repeat(fill, max + 1);
    expect_header_ok(name, ok);
    expect_header_invalid(name, too_long, field);
    free(ok);
    free(too_long);
}

static void test_length_limits(void **state) {
    (void)state;
    check_length_limit("ce-id", "id", 'i', 256);
    check_length_limit("ce-source", "source", 's', 1024);
    check_length_limit("ce-type", "type", 't', 256);
    check_length_limit("ce-tenantid", "tenantid", 'a', 256);
    check_length_limit("ce-subject", "subject", 'x', 1024);
}

static void test_length_counts_bytes_not_characters(void **state) {
    (void)state;
    /* 128 two-byte characters = 256 bytes: ok; one more ASCII byte: refused. */
    char ok[300];
    size_t n = 0;
    for (int i = 0; i < 128; i++) {
        ok[n++] = '\xc3';
        ok[n++] = '\xa9';
    }
    ok[n] = '\0';
    expect_header_ok("ce-id", ok);
    ok[n] = 'x';
    ok[n + 1] = '\0';
    expect_header_invalid("ce-id", ok, "id");
}

static void test_subject_optional_but_not_empty(void **state) {
    (void)state;
    expect_header_ok("ce-subject", "account/42");
    expect_header_invalid("ce-subject", "", "subject");
}

static void test_source_uri_reference(void **state) {
    (void)state;
    expect_header_ok("ce-source", "https://ledger.example.com/v1/orgs/1?x=y#frag");
    expect_header_ok("ce-source", "/ledger/acme");
    expect_header_ok("ce-source", "urn:uuid:6e8bc430-9c3a-11d9-9669-0800200c9a66");
    expect_header_ok("ce-source", "ledger");
    expect_header_ok("ce-source", "https://x/a%20b");
    expect_header_ok("ce-source", "mailto:ops@example.com");
    expect_header_invalid("ce-source", "has space", "source");
    expect_header_invalid("ce-source", "https://x/<y>", "source");
    expect_header_invalid("ce-source", "https://x/{y}", "source");
    expect_header_invalid("ce-source", "https://x/a\"b", "source");
    expect_header_invalid("ce-source", "https://x/%zz", "source");
    expect_header_invalid("ce-source", "https://x/%4", "source");
    expect_header_invalid("ce-source", "1abc:foo", "source");
    expect_header_invalid("ce-source", ":foo", "source");
    expect_header_invalid("ce-source", "a#b#c", "source");
    expect_header_invalid("ce-source", "https://x/caf\xc3\xa9", "source");
    expect_header_invalid("ce-source", "https://x\\y", "source");
}

static void test_type_any_reverse_dns(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    base(&m);
    put(&m, "ce-type", "com.github.pull_request.opened");
    expect_ok(&m, &ev);
    assert_string_equal(ev.event_type, "com.github.pull_request.opened");
    hub_event_free(&ev);
}

static void test_tenantid_syntax(void **state) {
    (void)state;
    expect_header_ok("ce-tenantid", "Acme_1.eu-West");
    expect_header_invalid("ce-tenantid", "acme corp", "tenantid");
    expect_header_invalid("ce-tenantid", "acme/1", "tenantid");
    expect_header_invalid("ce-tenantid", "acm\xc3\xa9", "tenantid");
    expect_header_invalid("ce-tenantid", "acme:1", "tenantid");
}

/* ------------------------------------------------------------------------- */
/* time                                                                      */
/* ------------------------------------------------------------------------- */

static void expect_time(const char *s, int64_t want) {
    int64_t got = 0;
    if (hub_rfc3339_parse(s, strlen(s), &got) != 0) {
        fail_msg("'%s' refused", s);
    }
    if (got != want) {
        fail_msg("'%s': got %lld, want %lld", s, (long long)got, (long long)want);
    }
}

static void expect_bad_time(const char *s) {
    int64_t got = 0;
    if (hub_rfc3339_parse(s, strlen(s), &got) == 0) {
        fail_msg("'%s' accepted", s);
    }
}

static void test_rfc3339_values(void **state) {
    (void)state;
    expect_time("1970-01-01T00:00:00Z", 0);
    expect_time("2024-02-29T12:00:00Z", INT64_C(1709208000000000));
    expect_time("2024-02-29T12:00:00.123456789+05:30", INT64_C(1709188200123456));
    expect_time("2024-02-29t12:00:00.123456z", INT64_C(1709208000123456));
    expect_time("1969-12-31T23:59:59.5Z", INT64_C(-500000));
    expect_time("2016-12-31T23:59:60Z", INT64_C(1483228800000000));
    expect_time("0000-01-01T00:00:00Z", INT64_C(-62167219200000000));
    expect_time("9999-12-31T23:59:59.999999-23:59", INT64_C(253402387139999999));
    expect_time("2000-02-29T00:00:00-00:00", INT64_C(951782400000000));
    expect_time("2024-01-01T00:00:00.1234567890123456789Z", INT64_C(1704067200123456));
}

static void test_rfc3339_refusals(void **state) {
    (void)state;
    expect_bad_time("2023-02-29T00:00:00Z");
    expect_bad_time("1900-02-29T00:00:00Z");
    expect_bad_time("2024-04-31T00:00:00Z");
    expect_bad_time("2024-13-01T00:00:00Z");
    expect_bad_time("2024-00-01T00:00:00Z");
    expect_bad_time("2024-01-00T00:00:00Z");
    expect_bad_time("2024-01-01T24:00:00Z");
    expect_bad_time("2024-01-01T00:60:00Z");
    expect_bad_time("2024-01-01T00:00:61Z");
    expect_bad_time("2024-01-01 00:00:00Z");
    expect_bad_time("2024-01-01T00:00:00");
    expect_bad_time("2024-01-01T00:00:00+24:00");
    expect_bad_time("2024-01-01T00:00:00+05:60");
    expect_bad_time("2024-01-01T00:00:00+0530");
    expect_bad_time("2024-01-01T00:00:00+05:3");
    expect_bad_time("2024-01-01T00:00:00.Z");
    expect_bad_time("2024-01-01T00:00:00ZZ");
    expect_bad_time("2024-1-01T00:00:00Z");
    expect_bad_time("2024-01-01");
    expect_bad_time("");
    expect_bad_time("20x4-01-01T00:00:00Z");
    expect_bad_time("2024-01-01T00:00:00Z ");
}

static void test_time_attribute(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    base(&m);
    put(&m, "ce-time", "2024-02-29T23:59:59.123456789+05:30");
    expect_ok(&m, &ev);
    assert_string_equal(ev.time, "2024-02-29T23:59:59.123456789+05:30");
    assert_true(ev.time_us == INT64_C(1709231399123456));
    hub_event_free(&ev);
    expect_header_invalid("ce-time", "2023-02-29T10:00:00Z", "time");
    expect_header_invalid("ce-time", "yesterday", "time");
}

/* ------------------------------------------------------------------------- */
/* schemaversion and topic                                                   */
/* ------------------------------------------------------------------------- */

static int major_of(const char *s) {
    return hub_schema_major_parse(s, strlen(s));
}

static void test_schema_major_parse(void **state) {
    (void)state;
    assert_int_equal(major_of("1.0.0"), 1);
    assert_int_equal(major_of("v2.1.0"), 2);
    assert_int_equal(major_of("1"), 1);
    assert_int_equal(major_of("v2"), 2);
    assert_int_equal(major_of("1.2"), 1);
    assert_int_equal(major_of("V3"), 3);
    assert_int_equal(major_of("12.0.1-rc.1+build.7"), 12);
    assert_int_equal(major_of("0.9.1"), 0);
    assert_int_equal(major_of("x"), -1);
    assert_int_equal(major_of("1.x"), -1);
    assert_int_equal(major_of("v"), -1);
    assert_int_equal(major_of(""), -1);
    assert_int_equal(major_of("01"), -1);
    assert_int_equal(major_of("1.02.0"), -1);
    assert_int_equal(major_of("1.2.3.4"), -1);
    assert_int_equal(major_of("1.0-rc"), -1);
    assert_int_equal(major_of("1.0.0-"), -1);
    assert_int_equal(major_of("1.0.0-01"), -1);
    assert_int_equal(major_of("1.0."), -1);
    assert_int_equal(major_of("v 1"), -1);
    assert_int_equal(major_of("99999999999"), -1);
    assert_int_equal(hub_schema_major_parse(NULL, 0), -1);
    /* only the given length counts */
    assert_int_equal(hub_schema_major_parse("2.0.0garbage", 5), 2);
}

static void expect_schema_major(const char *schemaversion, const char *topic, int want) {
    struct msg m;
    struct hub_event ev;
    base(&m);
    if (schemaversion != NULL) {
        put(&m, "ce-schemaversion", schemaversion);
    }
    m.topic = topic;
    expect_ok(&m, &ev);
    assert_int_equal(ev.schema_major, want);
    if (schemaversion != NULL) {
        assert_string_equal(ev.schema_version, schemaversion);
    }
    hub_event_free(&ev);
}

static void test_schema_major_of_event(void **state) {
    (void)state;
    expect_schema_major("v2.1.0", NULL, 2);
    /* major 0 is valid semver (SPEC §3.1): stored, matched by nothing */
    expect_schema_major("0.9.1", "lerian.streaming.ledger_transaction.posted.v2", 0);
    expect_schema_major("v0", NULL, 0);
    expect_schema_major("3", "lerian.streaming.ledger_transaction.posted.v2", 3);
    expect_schema_major(NULL, "lerian.streaming.ledger_transaction.posted.v2", 2);
    expect_schema_major(NULL, "lerian.streaming.ledger_transaction.posted.v12", 12);
    expect_schema_major(NULL, "lerian.streaming.ledger_transaction.posted", 1);
    expect_schema_major(NULL, "lerian.streaming.ledger_transaction.posted.v0", 1);
    expect_schema_major(NULL, "lerian.streaming.ledger_transaction.posted.v", 1);
    expect_schema_major(NULL, "lerian.streaming.posted_v2", 1);
    expect_schema_major(NULL, "lerian.streaming.posted.v2x", 1);
    expect_schema_major(NULL, NULL, 1);
    assert_int_equal(hub_topic_schema_major("a.v99999999999"), 0);
    assert_int_equal(hub_topic_schema_major(".v7"), 7);
}

static void test_schemaversion_refusals(void **state) {
    (void)state;
    expect_header_invalid("ce-schemaversion", "x", "schemaversion");
    expect_header_invalid("ce-schemaversion", "1.x", "schemaversion");
    expect_header_invalid("ce-schemaversion", "v", "schemaversion");
    expect_header_invalid("ce-schemaversion", "", "schemaversion");
}

/* ------------------------------------------------------------------------- */
/* event type                                                                */
/* ------------------------------------------------------------------------- */

static void expect_event_type(const char *type, const char *rt, const char *et, const char *want) {
    struct msg m;
    struct hub_event ev;
    base(&m);
    put(&m, "ce-type", type);
    if (rt != NULL) {
        add(&m, "ce-resourcetype", rt);
    }
    if (et != NULL) {
        add(&m, "ce-eventtype", et);
    }
    expect_ok(&m, &ev);
    assert_string_equal(ev.event_type, want);
    hub_event_free(&ev);
}

static void test_event_type_derivation(void **state) {
    (void)state;
    expect_event_type("studio.lerian.transaction.posted", NULL, NULL, "transaction.posted");
    expect_event_type("studio.lerian.ledger.balance.config-changed", NULL, NULL,
                      "balance.config-changed");
    expect_event_type("studio.lerian.heartbeat", NULL, NULL, "heartbeat");
    expect_event_type("com.example.order.created", NULL, NULL, "com.example.order.created");
    expect_event_type("studio.lerianx.a.b", NULL, NULL, "studio.lerianx.a.b");
    expect_event_type("studio.lerian.", NULL, NULL, "studio.lerian.");
    expect_event_type("studio.lerian.ledger.balance.config-changed", "account", "created",
                      "account.created");
    expect_event_type("com.example.x", "balance", "config-changed", "balance.config-changed");
    /* only one of the pair: the ce-type rule applies */
    expect_event_type("studio.lerian.transaction.posted", "account", NULL, "transaction.posted");
    expect_event_type("studio.lerian.transaction.posted", NULL, "created", "transaction.posted");
}

static void test_event_type_derive_truncates(void **state) {
    (void)state;
    char out[8];
    size_t n =
        hub_event_type_derive("studio.lerian.transaction.posted", NULL, NULL, out, sizeof(out));
    assert_int_equal(n, strlen("transaction.posted"));
    assert_string_equal(out, "transac");
    assert_int_equal(hub_event_type_derive("a.b", NULL, NULL, NULL, 0), 3);
    n = hub_event_type_derive(NULL, "ledger", "posted", out, sizeof(out));
    assert_int_equal(n, 13);
    assert_string_equal(out, "ledger.");
}

static void test_resourcetype_eventtype_not_empty(void **state) {
    (void)state;
    expect_header_invalid("ce-resourcetype", "", "resourcetype");
    expect_header_invalid("ce-eventtype", "", "eventtype");
}

/* ------------------------------------------------------------------------- */
/* datacontenttype, dataschema, JSON payloads, size                          */
/* ------------------------------------------------------------------------- */

static void test_datacontenttype_media_types(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    static const char *const good[] = {
        "application/json; charset=utf-8",
        "application/vnd.lerian.ledger+json;v=2",
        "text/plain",
        "text/plain;charset=\"utf-8\"",
        "multipart/form-data; boundary=\"a b;c\\\"d\"",
        "application/octet-stream",
    };
    static const char *const bad[] = {
        "json",
        "text/",
        "/plain",
        "text/plain;",
        "text/plain; charset",
        "text/plain; a=\"b",
        "text /plain",
        "text/plain x",
        "text/pl@in",
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        base(&m);
        put(&m, "ce-datacontenttype", good[i]);
        expect_ok(&m, &ev);
        assert_string_equal(ev.content_type, good[i]);
        hub_event_free(&ev);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        base(&m);
        put(&m, "ce-datacontenttype", bad[i]);
        expect_invalid(&m, "datacontenttype");
    }
}

static void test_content_type_header_fallback(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    base(&m);
    add(&m, "content-type", "text/csv");
    set_value(&m, "a,b\n1,2\n");
    expect_ok(&m, &ev);
    assert_string_equal(ev.content_type, "text/csv");
    assert_non_null(strstr(ev.attrs_json, "\"datacontenttype\":\"text/csv\""));
    hub_event_free(&ev);

    /* ce-datacontenttype takes precedence over the transport header */
    base(&m);
    add(&m, "content-type", "text/csv");
    add(&m, "ce-datacontenttype", "application/json");
    expect_ok(&m, &ev);
    assert_string_equal(ev.content_type, "application/json");
    hub_event_free(&ev);

    base(&m);
    add(&m, "content-type", "not a media type");
    expect_invalid(&m, "datacontenttype");
}

static void test_dataschema(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    base(&m);
    add(&m, "ce-dataschema", "https://schemas.lerian.studio/ledger/v2.json");
    expect_ok(&m, &ev);
    assert_string_equal(ev.dataschema, "https://schemas.lerian.studio/ledger/v2.json");
    hub_event_free(&ev);
    expect_header_ok("ce-dataschema", "urn:lerian:schema:tx:2");
    expect_header_invalid("ce-dataschema", "/schemas/v2.json", "dataschema");
    expect_header_invalid("ce-dataschema", "", "dataschema");
    expect_header_invalid("ce-dataschema", "https://x/a b", "dataschema");
}

/*
 * A JSON content type requires a well-formed JSON payload (SPEC §3.1).  The
 * parser refuses what it can see cheaply (empty, a raw NUL byte) and flags
 * the rest for the caller, whose PostgreSQL checks the grammar in bulk (the
 * ingest integration test covers well-formed and malformed payloads end to
 * end); a non-JSON type is never flagged.
 */
static void test_json_payload_flagged(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    static const char *const payloads[] = {
        "{\"a\":[1,2,{\"b\":null}]}", "\"just a string\"", "{", "not json", "\xff",
    };
    for (size_t i = 0; i < sizeof(payloads) / sizeof(payloads[0]); i++) {
        base(&m);
        set_value(&m, payloads[i]);
        expect_ok(&m, &ev);
        assert_int_equal(ev.json_unchecked, 1);
        hub_event_free(&ev);
    }
    /* a raw NUL byte is never JSON: refused here */
    base(&m);
    m.value = "{\"a\":true\0}";
    m.value_len = 10;
    expect_invalid(&m, "data");
}

static void test_json_content_type_variants(void **state) {
    (void)state;
    static const char *const json_types[] = {
        "application/json",
        "APPLICATION/JSON; charset=utf-8",
        "text/json",
        "application/vnd.lerian+json",
        "application/problem+json ; x=1",
    };
    struct msg m;
    struct hub_event ev;
    for (size_t i = 0; i < sizeof(json_types) / sizeof(json_types[0]); i++) {
        base(&m);
        put(&m, "ce-datacontenttype", json_types[i]);
        set_value(&m, "{broken");
        expect_ok(&m, &ev);
        assert_int_equal(ev.json_unchecked, 1);
        hub_event_free(&ev);
    }
    /* not JSON: anything goes, nothing to check */
    base(&m);
    put(&m, "ce-datacontenttype", "application/jsonx");
    set_value(&m, "{broken");
    expect_ok(&m, &ev);
    assert_int_equal(ev.json_unchecked, 0);
    hub_event_free(&ev);
}

static void test_empty_payload_with_json_type(void **state) {
    (void)state;
    struct msg m;
    base(&m);
    set_value(&m, "");
    expect_invalid(&m, "data");
    base(&m);
    set_value(&m, NULL);
    expect_invalid(&m, "data");
}

static void test_too_large(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    base(&m);
    put(&m, "ce-datacontenttype", "text/plain");
    set_value(&m, "0123456789");
    m.limits.max_event_bytes = 10;
    expect_ok(&m, &ev);
    hub_event_free(&ev);
    set_value(&m, "0123456789A");
    expect_refused(&m, HUB_ENVELOPE_TOO_LARGE, "data");
}

/* ------------------------------------------------------------------------- */
/* Control characters, UTF-8, extensions                                     */
/* ------------------------------------------------------------------------- */

static void test_control_characters_refused(void **state) {
    (void)state;
    expect_header_invalid("ce-id",
                          "a\x01"
                          "b",
                          "id");
    expect_header_invalid("ce-id", "a\x1f", "id");
    expect_header_invalid("ce-id", "a\x7f", "id");
    expect_header_invalid("ce-subject", "line\nbreak", "subject");
    expect_header_invalid("ce-subject", "tab\there", "subject");
    expect_header_invalid("ce-type", "\rtype", "type");
    expect_header_invalid("ce-myext", "x\x01", "myext");
    expect_header_invalid("ce-myext", "x\x1f", "myext");
    expect_header_invalid("ce-myext", "x\x7f", "myext");
    expect_header_invalid("traceparent", "00-\x01", "traceparent");
    /* an embedded NUL byte inside the value */
    struct msg m;
    base(&m);
    put_n(&m, "ce-id", "ab\0cd", 5);
    expect_invalid(&m, "id");
}

static void test_utf8(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    base(&m);
    add(&m, "ce-subject", "conta/a\xc3\xa7\xc3\xa3o/\xe2\x82\xac/\xf0\x9f\x92\xb8");
    add(&m, "ce-note", "\xe6\x97\xa5\xe6\x9c\xac");
    expect_ok(&m, &ev);
    assert_string_equal(ev.subject, "conta/a\xc3\xa7\xc3\xa3o/\xe2\x82\xac/\xf0\x9f\x92\xb8");
    assert_string_equal(ext_value(&ev, "note"), "\xe6\x97\xa5\xe6\x9c\xac");
    assert_non_null(strstr(ev.attrs_json, "\"note\":\"\xe6\x97\xa5\xe6\x9c\xac\""));
    hub_event_free(&ev);

    expect_header_invalid("ce-subject", "\xff", "subject");
    expect_header_invalid("ce-subject", "\xc0\xaf", "subject");         /* overlong '/' */
    expect_header_invalid("ce-subject", "\xe2\x82", "subject");         /* truncated */
    expect_header_invalid("ce-subject", "\xed\xa0\x80", "subject");     /* surrogate */
    expect_header_invalid("ce-subject", "\xf4\x90\x80\x80", "subject"); /* > U+10FFFF */
    expect_header_invalid("ce-subject", "a\x80", "subject");            /* lone continuation */
    expect_header_invalid("ce-myext", "\xc3", "myext");
}

static void test_extension_names(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    base(&m);
    add(&m, "ce-partitionkey", "acct-1");
    add(&m, "ce-Sequence2", "7");
    add(&m, "ce-abc", "");
    expect_ok(&m, &ev);
    assert_int_equal(ev.n_extensions, 3);
    assert_string_equal(ev.extensions[0].name, "abc");
    assert_string_equal(ev.extensions[0].value, "");
    assert_string_equal(ev.extensions[1].name, "partitionkey");
    assert_string_equal(ev.extensions[2].name, "sequence2");
    assert_non_null(strstr(ev.attrs_json, "\"partitionkey\":\"acct-1\""));
    assert_non_null(strstr(ev.attrs_json, "\"sequence2\":\"7\""));
    hub_event_free(&ev);

    expect_header_invalid("ce-my-ext", "v", "my-ext");
    expect_header_invalid("ce-my_ext", "v", "my_ext");
    expect_header_invalid("ce-", "v", "");
    expect_header_invalid("ce-caf\xc3\xa9", "v", "caf??");
    expect_header_invalid("ce-data", "v", "data");
}

static void test_many_headers(void **state) {
    (void)state;
    /* Thousands of extension headers, half of them repeats: linear-ish and correct. */
    enum { N = 4000 };
    struct hub_header *h = calloc(N + 6, sizeof(*h));
    char(*names)[16] = calloc(N, sizeof(*names));
    assert_non_null(h);
    assert_non_null(names);
    struct msg m;
    base(&m);
    memcpy(h, m.h, m.n * sizeof(*h));
    for (size_t i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "ce-x%zu", i % (N / 2));
        h[m.n + i].name = names[i];
        h[m.n + i].name_len = strlen(names[i]);
        h[m.n + i].value = i < N / 2 ? "old" : "new";
        h[m.n + i].value_len = 3;
    }
    struct hub_event ev;
    struct hub_envelope_error err;
    int rc = hub_envelope_parse(HUB_ENVELOPE_KAFKA, h, m.n + N, m.value, m.value_len, NULL,
                                &m.limits, &ev, &err);
    if (rc != 0) {
        fail_msg("%s: %s", err.field, err.message);
    }
    assert_int_equal(ev.n_extensions, N / 2);
    for (size_t i = 0; i < ev.n_extensions; i++) {
        assert_string_equal(ev.extensions[i].value, "new");
        if (i > 0) {
            assert_true(strcmp(ev.extensions[i - 1].name, ev.extensions[i].name) < 0);
        }
    }
    json_error_t jerr;
    json_t *attrs = json_loadb(ev.attrs_json, ev.attrs_json_len, 0, &jerr);
    assert_non_null(attrs);
    assert_int_equal(json_object_size(attrs), 7 + N / 2);
    json_decref(attrs);
    hub_event_free(&ev);
    free(names);
    free(h);
}

static void test_trace_headers_kept(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    base(&m);
    add(&m, "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    add(&m, "TraceState", "congo=t61rcWkgMzE");
    expect_ok(&m, &ev);
    assert_string_equal(ev.traceparent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    assert_string_equal(ev.tracestate, "congo=t61rcWkgMzE");
    assert_int_equal(ev.n_extensions, 0);
    assert_non_null(strstr(ev.attrs_json, "\"tracestate\":\"congo=t61rcWkgMzE\""));
    assert_non_null(strstr(ev.attrs_json, "\"traceparent\":\"00-4bf92f35"));
    hub_event_free(&ev);

    /* the ce- spelling of the tracing extension fills the same slot, last one wins */
    base(&m);
    add(&m, "traceparent", "plain");
    add(&m, "ce-traceparent", "extension");
    expect_ok(&m, &ev);
    assert_string_equal(ev.traceparent, "extension");
    assert_int_equal(ev.n_extensions, 0);
    hub_event_free(&ev);
}

static void test_all_attributes_in_attrs_json(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    base(&m);
    add(&m, "ce-subject", "acct/\"1\"");
    add(&m, "ce-schemaversion", "2.0.0");
    add(&m, "ce-dataschema", "https://s/x");
    add(&m, "ce-resourcetype", "transaction");
    add(&m, "ce-eventtype", "posted");
    add(&m, "ce-zeta", "z");
    add(&m, "tracestate", "a=b");
    expect_ok(&m, &ev);
    assert_string_equal(ev.attrs_json,
                        "{\"datacontenttype\":\"application/json\","
                        "\"dataschema\":\"https://s/x\",\"eventtype\":\"posted\","
                        "\"id\":\"evt-1\",\"resourcetype\":\"transaction\","
                        "\"schemaversion\":\"2.0.0\",\"source\":\"//ledger/acme\","
                        "\"specversion\":\"1.0\",\"subject\":\"acct/\\\"1\\\"\","
                        "\"tenantid\":\"acme\",\"time\":\"2024-05-01T10:00:00Z\","
                        "\"tracestate\":\"a=b\",\"type\":\"studio.lerian.transaction.posted\","
                        "\"zeta\":\"z\"}");
    hub_event_free(&ev);
}

/* ------------------------------------------------------------------------- */
/* HTTP binding                                                              */
/* ------------------------------------------------------------------------- */

static void test_http_percent_decoding(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    base(&m);
    m.mode = HUB_ENVELOPE_HTTP;
    add(&m, "ce-subject", "a%20b%C3%A9%25%22");
    add(&m, "ce-myext", "%e2%82%ac");
    add(&m, "traceparent", "00-%41");
    expect_ok(&m, &ev);
    assert_string_equal(ev.subject, "a b\xc3\xa9%\"");
    assert_string_equal(ext_value(&ev, "myext"), "\xe2\x82\xac");
    /* a plain header is not a CloudEvents attribute value: no decoding */
    assert_string_equal(ev.traceparent, "00-%41");
    hub_event_free(&ev);

    /* the same value in Kafka mode stays as it is */
    base(&m);
    add(&m, "ce-subject", "a%20b");
    expect_ok(&m, &ev);
    assert_string_equal(ev.subject, "a%20b");
    hub_event_free(&ev);
}

static void test_http_bad_percent_and_utf8(void **state) {
    (void)state;
    static const char *const bad[] = {"%zz", "abc%", "%4", "%E9", "%C3%28", "%00", "%0A", "%7F"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct msg m;
        base(&m);
        m.mode = HUB_ENVELOPE_HTTP;
        add(&m, "ce-subject", bad[i]);
        expect_invalid(&m, "subject");
    }
    struct msg m;
    base(&m);
    m.mode = HUB_ENVELOPE_HTTP;
    add(&m, "ce-myext", "%ff");
    expect_invalid(&m, "myext");
}

/* ------------------------------------------------------------------------- */
/* Structured mode                                                           */
/* ------------------------------------------------------------------------- */

#define CE_JSON_ATTRS                                                                              \
    "\"specversion\":\"1.0\",\"id\":\"s-1\",\"source\":\"/ledger\","                               \
    "\"type\":\"studio.lerian.ledger.balance.config-changed\","                                    \
    "\"time\":\"2024-05-01T10:00:00.5-03:00\",\"tenantid\":\"acme\""

static void structured(struct msg *m, const char *json) {
    memset(m, 0, sizeof(*m));
    add(m, "content-type", "application/cloudevents+json; charset=utf-8");
    set_value(m, json);
    m->mode = HUB_ENVELOPE_KAFKA;
    m->limits.max_event_bytes = 1048576;
}

static void expect_structured_payload(const char *json, const char *want) {
    struct msg m;
    struct hub_event ev;
    structured(&m, json);
    expect_ok(&m, &ev);
    assert_int_equal(ev.structured, 1);
    if (ev.payload_len != strlen(want) || memcmp(ev.payload, want, ev.payload_len) != 0) {
        fail_msg("payload '%.*s', want '%s'", (int)ev.payload_len, ev.payload, want);
    }
    hub_event_free(&ev);
}

static void test_structured_attributes(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    structured(&m, "{" CE_JSON_ATTRS ",\"subject\":\"s\",\"ext1\":\"x\",\"count\":5,"
                   "\"flag\":true,\"traceparent\":\"tp\",\"nothing\":null,\"data\":{\"a\":1}}");
    add(&m, "ce-id", "header-ignored");
    add(&m, "tracestate", "ts=1");
    m.topic = "lerian.streaming.ledger_balance.config_changed.v3";
    expect_ok(&m, &ev);
    assert_int_equal(ev.structured, 1);
    assert_string_equal(ev.id, "s-1");
    assert_string_equal(ev.source, "/ledger");
    assert_string_equal(ev.subject, "s");
    assert_string_equal(ev.event_type, "balance.config-changed");
    assert_int_equal(ev.schema_major, 3);
    assert_true(ev.time_us == INT64_C(1714568400500000));
    assert_string_equal(ev.content_type, "application/json");
    assert_string_equal(ev.traceparent, "tp");
    assert_string_equal(ev.tracestate, "ts=1");
    assert_int_equal(ev.n_extensions, 3);
    assert_string_equal(ev.extensions[0].name, "count");
    assert_string_equal(ev.extensions[0].value, "5");
    assert_string_equal(ev.extensions[1].name, "ext1");
    assert_string_equal(ev.extensions[2].name, "flag");
    assert_string_equal(ev.extensions[2].value, "true");
    assert_int_equal(ev.payload_len, 7);
    assert_memory_equal(ev.payload, "{\"a\":1}", 7);
    /* structured payloads live in the arena, not in the record value */
    assert_true(ev.payload < (const unsigned char *)m.value ||
                ev.payload >= (const unsigned char *)m.value + m.value_len);
    hub_event_free(&ev);
}

static void test_structured_data_exact_bytes(void **state) {
    (void)state;
    /* numbers, spacing and escapes are kept exactly as sent (SPEC §3.1) */
    expect_structured_payload("{" CE_JSON_ATTRS ", \"data\" : {\"amount\": 0.1, \"l\":[1 , 2e3],"
                              " \"s\":\"\\u00e9\\/\"} }",
                              "{\"amount\": 0.1, \"l\":[1 , 2e3], \"s\":\"\\u00e9\\/\"}");
    expect_structured_payload("{\"data\":12345678901234567890123," CE_JSON_ATTRS "}",
                              "12345678901234567890123");
    expect_structured_payload("{" CE_JSON_ATTRS ",\"data\":[]}", "[]");
    expect_structured_payload("{" CE_JSON_ATTRS ",\"data\":false}", "false");
    /* a string under a JSON type is a JSON string payload, quotes included */
    expect_structured_payload("{" CE_JSON_ATTRS ",\"data\":\"hi\\n\"}", "\"hi\\n\"");
    /* duplicate member: the last one wins, as in the parsed object */
    expect_structured_payload("{\"data\":1," CE_JSON_ATTRS ",\"data\":2}", "2");
    /* an escaped key still names data */
    expect_structured_payload("{" CE_JSON_ATTRS ",\"d\\u0061ta\":{\"k\":true}}", "{\"k\":true}");
    /* a nested "data" is not the top-level member */
    expect_structured_payload("{" CE_JSON_ATTRS ",\"data\":{\"data\":3},\"subject\":\"data\"}",
                              "{\"data\":3}");
}

static void test_structured_string_and_base64(void **state) {
    (void)state;
    expect_structured_payload(
        "{" CE_JSON_ATTRS ",\"datacontenttype\":\"text/plain\",\"data\":\"caf\\u00e9 \\\"x\\\"\"}",
        "caf\xc3\xa9 \"x\"");
    struct msg m;
    struct hub_event ev;
    structured(&m, "{" CE_JSON_ATTRS ",\"datacontenttype\":\"application/octet-stream\","
                   "\"data_base64\":\"AAEC/w==\"}");
    expect_ok(&m, &ev);
    assert_int_equal(ev.payload_len, 4);
    assert_memory_equal(ev.payload, "\x00\x01\x02\xff", 4);
    hub_event_free(&ev);

    expect_structured_payload("{" CE_JSON_ATTRS ",\"data_base64\":\"eyJhIjoxfQ\"}", "{\"a\":1}");
    expect_structured_payload("{" CE_JSON_ATTRS ",\"datacontenttype\":\"text/plain\","
                              "\"data_base64\":\"\"}",
                              "");
    /* data parsed with the event is JSON already; base64 under a JSON type
     * must still decode to JSON, which is the caller's to check */
    structured(&m, "{" CE_JSON_ATTRS ",\"data\":{\"a\":1}}");
    expect_ok(&m, &ev);
    assert_int_equal(ev.json_unchecked, 0);
    hub_event_free(&ev);
    structured(&m, "{" CE_JSON_ATTRS ",\"data_base64\":\"bm90IGpzb24=\"}");
    expect_ok(&m, &ev);
    assert_int_equal(ev.json_unchecked, 1);
    hub_event_free(&ev);
    structured(&m, "{" CE_JSON_ATTRS ",\"data_base64\":\"AA=A\"}");
    expect_invalid(&m, "data_base64");
    structured(&m, "{" CE_JSON_ATTRS ",\"data_base64\":\"A\"}");
    expect_invalid(&m, "data_base64");
    structured(&m, "{" CE_JSON_ATTRS ",\"data_base64\":\"AA AA\"}");
    expect_invalid(&m, "data_base64");
    structured(&m, "{" CE_JSON_ATTRS ",\"data_base64\":5}");
    expect_invalid(&m, "data_base64");
    structured(&m, "{" CE_JSON_ATTRS ",\"data\":1,\"data_base64\":\"AA==\"}");
    expect_invalid(&m, "data");
}

static void test_structured_without_data(void **state) {
    (void)state;
    expect_structured_payload("{" CE_JSON_ATTRS "}", "");
    expect_structured_payload("{" CE_JSON_ATTRS ",\"data\":null}", "");
}

static void test_structured_refusals(void **state) {
    (void)state;
    struct msg m;
    structured(&m, "{" CE_JSON_ATTRS ",\"subject\":5}");
    expect_invalid(&m, "subject");
    structured(&m, "{\"specversion\":\"1.0\",\"id\":42,\"source\":\"/x\"}");
    expect_invalid(&m, "id");
    structured(&m, "{" CE_JSON_ATTRS ",\"ratio\":1.5}");
    expect_invalid(&m, "ratio");
    structured(&m, "{" CE_JSON_ATTRS ",\"big\":4294967296}");
    expect_invalid(&m, "big");
    structured(&m, "{" CE_JSON_ATTRS ",\"obj\":{}}");
    expect_invalid(&m, "obj");
    structured(&m, "{" CE_JSON_ATTRS ",\"BadName\":\"x\"}");
    expect_invalid(&m, "BadName");
    structured(&m, "{" CE_JSON_ATTRS ",\"ctl\":\"a\\u0001\"}");
    expect_invalid(&m, "ctl");
    structured(&m, "{" CE_JSON_ATTRS ",\"id2\":\"a\\u0000b\"}");
    expect_invalid(&m, "id2");
    structured(&m, "{\"specversion\":\"1.0\"");
    expect_invalid(&m, "");
    structured(&m, "[1,2]");
    expect_invalid(&m, "");
    structured(&m, "{" CE_JSON_ATTRS ",\"flag\":true\0,\"data\":1}");
    m.value_len = strlen(m.value) + 1 + strlen(",\"data\":1}");
    expect_invalid(&m, "");
    structured(&m, "");
    expect_invalid(&m, "");
    structured(&m, "{" CE_JSON_ATTRS ",\"data\":{\"a\":1}} trailing");
    expect_invalid(&m, "");
    structured(&m, "{" CE_JSON_ATTRS ",\"specversion\":\"0.3\"}");
    expect_invalid(&m, "specversion");
    structured(&m, "{" CE_JSON_ATTRS ",\"time\":\"2023-02-29T00:00:00Z\"}");
    expect_invalid(&m, "time");

    structured(&m, "[{" CE_JSON_ATTRS "}]");
    put(&m, "content-type", "application/cloudevents-batch+json");
    expect_invalid(&m, "");
    structured(&m, "<event/>");
    put(&m, "content-type", "application/cloudevents+xml");
    expect_invalid(&m, "");
}

static void test_structured_too_large(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    structured(&m, "{" CE_JSON_ATTRS ",\"data\":[1,2,3,4]}");
    m.limits.max_event_bytes = 9;
    expect_ok(&m, &ev);
    hub_event_free(&ev);
    m.limits.max_event_bytes = 8;
    expect_refused(&m, HUB_ENVELOPE_TOO_LARGE, "data");
    structured(&m, "{" CE_JSON_ATTRS ",\"data_base64\":\"AAECAwQ=\"}");
    put(&m, "content-type", "application/cloudevents+json");
    m.limits.max_event_bytes = 4;
    expect_refused(&m, HUB_ENVELOPE_TOO_LARGE, "data");
}

static void test_structured_detection_prefix(void **state) {
    (void)state;
    /* Case-insensitive, and binary mode stays binary for any other type. */
    struct msg m;
    struct hub_event ev;
    structured(&m, "{" CE_JSON_ATTRS "}");
    put(&m, "Content-Type", "Application/CloudEvents+JSON");
    del(&m, "content-type");
    expect_ok(&m, &ev);
    assert_int_equal(ev.structured, 1);
    hub_event_free(&ev);
}

/* HTTP ingest (SPEC §4): the key's tenant fills a missing tenantid, and
 * never replaces one the event carries (the API compares them). */
static void test_default_tenant(void **state) {
    (void)state;
    struct msg m;
    struct hub_event ev;
    base(&m);
    m.mode = HUB_ENVELOPE_HTTP;
    del(&m, "ce-tenantid");
    expect_invalid(&m, "tenantid");
    m.limits.default_tenant = "key-tenant";
    expect_ok(&m, &ev);
    assert_string_equal(ev.tenant, "key-tenant");
    assert_non_null(strstr(ev.attrs_json, "\"tenantid\":\"key-tenant\""));
    hub_event_free(&ev);
    add(&m, "ce-tenantid", "own");
    expect_ok(&m, &ev);
    assert_string_equal(ev.tenant, "own");
    hub_event_free(&ev);
}

/* HTTP ingest names every attribute at fault (SPEC §4); the error reported
 * is still the first, as without a collector. */
static void test_issues_collected(void **state) {
    (void)state;
    struct msg m;
    struct hub_envelope_error err;
    struct hub_event ev;
    struct hub_envelope_issues issues;
    base(&m);
    put(&m, "ce-specversion", "0.3");
    del(&m, "ce-id");
    put(&m, "ce-time", "noon");
    put(&m, "ce-tenantid", "a b");
    expect_invalid(&m, "specversion"); /* no collector: the first only */
    m.limits.issues = &issues;
    assert_int_equal(run(&m, &ev, &err), -1);
    assert_string_equal(err.field, "specversion");
    assert_int_equal(issues.n, 4);
    assert_string_equal(issues.item[0].field, "specversion");
    assert_string_equal(issues.item[1].field, "id");
    assert_string_equal(issues.item[2].field, "time");
    assert_string_equal(issues.item[3].field, "tenantid");
    assert_string_equal(issues.item[2].message, "time must be an RFC 3339 date-time");
    base(&m);
    m.limits.issues = &issues;
    expect_ok(&m, &ev); /* a valid event leaves the collector empty */
    assert_int_equal(issues.n, 0);
    hub_event_free(&ev);
}

/* Splits text and checks the spans against the expected element texts. */
static void expect_split(const char *text, size_t max, long n, const char *const *elems) {
    size_t *spans = NULL;
    long got = hub_envelope_batch_split(text, strlen(text), max, &spans);
    assert_int_equal(got, n);
    for (long i = 0; i < n; i++) {
        size_t len = spans[2 * i + 1] - spans[2 * i];
        assert_int_equal(len, strlen(elems[i]));
        assert_memory_equal(text + spans[2 * i], elems[i], len);
    }
    if (n <= 0) {
        assert_null(spans);
    }
    free(spans);
}

static void test_batch_split(void **state) {
    (void)state;
    const char *const three[] = {"{\"a\": [1, {\"b\": \"]\"}]}", "7", "\"x,y\""};
    expect_split(" [ {\"a\": [1, {\"b\": \"]\"}]} ,7,\n\"x,y\" ] ", 10, 3, three);
    expect_split("[]", 10, 0, NULL);
    expect_split(" [ ] ", 10, 0, NULL);
    expect_split("[1,2,3]", 2, -1, NULL);    /* over the cap */
    expect_split("{\"a\":1}", 10, -1, NULL); /* not an array */
    expect_split("[1,", 10, -1, NULL);       /* not JSON */
    expect_split("", 10, -1, NULL);
    size_t *spans = NULL;
    assert_int_equal(hub_envelope_batch_split("[1]\0", 4, 10, &spans), -1); /* raw NUL */
    assert_int_equal(hub_envelope_batch_split(NULL, 0, 10, &spans), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_minimal_binary_event),
        cmocka_unit_test(test_binary_payload_is_zero_copy_and_digest),
        cmocka_unit_test(test_empty_payload_digest),
        cmocka_unit_test(test_underscore_prefix_kafka),
        cmocka_unit_test(test_underscore_prefix_ignored_in_http),
        cmocka_unit_test(test_header_names_case_insensitive),
        cmocka_unit_test(test_last_header_wins),
        cmocka_unit_test(test_unrelated_headers_ignored),
        cmocka_unit_test(test_failed_parse_leaves_event_empty_and_free_is_safe),
        cmocka_unit_test(test_null_error_pointer_and_limits),
        cmocka_unit_test(test_reason_strings),
        cmocka_unit_test(test_required_attributes),
        cmocka_unit_test(test_specversion_exact),
        cmocka_unit_test(test_length_limits),
        cmocka_unit_test(test_length_counts_bytes_not_characters),
        cmocka_unit_test(test_subject_optional_but_not_empty),
        cmocka_unit_test(test_source_uri_reference),
        cmocka_unit_test(test_type_any_reverse_dns),
        cmocka_unit_test(test_tenantid_syntax),
        cmocka_unit_test(test_rfc3339_values),
        cmocka_unit_test(test_rfc3339_refusals),
        cmocka_unit_test(test_time_attribute),
        cmocka_unit_test(test_schema_major_parse),
        cmocka_unit_test(test_schema_major_of_event),
        cmocka_unit_test(test_schemaversion_refusals),
        cmocka_unit_test(test_event_type_derivation),
        cmocka_unit_test(test_event_type_derive_truncates),
        cmocka_unit_test(test_resourcetype_eventtype_not_empty),
        cmocka_unit_test(test_datacontenttype_media_types),
        cmocka_unit_test(test_content_type_header_fallback),
        cmocka_unit_test(test_dataschema),
        cmocka_unit_test(test_json_payload_flagged),
        cmocka_unit_test(test_json_content_type_variants),
        cmocka_unit_test(test_empty_payload_with_json_type),
        cmocka_unit_test(test_too_large),
        cmocka_unit_test(test_control_characters_refused),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_extension_names),
        cmocka_unit_test(test_many_headers),
        cmocka_unit_test(test_trace_headers_kept),
        cmocka_unit_test(test_all_attributes_in_attrs_json),
        cmocka_unit_test(test_http_percent_decoding),
        cmocka_unit_test(test_http_bad_percent_and_utf8),
        cmocka_unit_test(test_structured_attributes),
        cmocka_unit_test(test_structured_data_exact_bytes),
        cmocka_unit_test(test_structured_string_and_base64),
        cmocka_unit_test(test_structured_without_data),
        cmocka_unit_test(test_structured_refusals),
        cmocka_unit_test(test_structured_too_large),
        cmocka_unit_test(test_structured_detection_prefix),
        cmocka_unit_test(test_default_tenant),
        cmocka_unit_test(test_batch_split),
        cmocka_unit_test(test_issues_collected),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
