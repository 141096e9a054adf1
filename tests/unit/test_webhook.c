/*
 * Unit tests of the webhook request (SPEC §7.2) and the verification probe
 * (SPEC §6) as webhook.c builds them: the header set and its signatures
 * over the Standard Webhooks reference vector, what a subscription's
 * destination headers may and may not add, and a probe whose signature a
 * receiver can check with nothing but its secret.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <cmocka.h>

#include "error.h"
#include "webhook.h"

/* The Standard Webhooks specification's published example (as in
 * test_sign.c): the signature over REF_BODY is known independently. */
#define REF_SECRET "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
#define REF_ID "msg_p5jXN8AQM9LWM0D4loKWxJek"
#define REF_TS 1614265330
#define REF_BODY "{\"test\": 2432232314}"
#define REF_SIG "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
#define REF_LERIAN "v1,sha256=b0992e328012ca09538b1d90c0f0c21317c5a7da5b3e0da01478d3034aa4304b"

static void load_key(const char *secret, struct hub_sign_key *k) {
    memset(k, 0, sizeof(*k));
    assert_int_equal(hub_secret_key(secret, k->key, &k->len), 0);
}

/* The value of header `name` (case-insensitive) in h, or NULL; when it
 * appears more than once, the count goes to *times (may be NULL). */
static const char *header(const struct hub_webhook_headers *h, const char *name, int *times) {
    size_t nl = strlen(name);
    const char *found = NULL;
    int n = 0;

    for (size_t i = 0; i < h->n; i++) {
        const char *line = h->lines[i];
        if (strncasecmp(line, name, nl) == 0 && line[nl] == ':' && line[nl + 1] == ' ') {
            found = found != NULL ? found : line + nl + 2;
            n++;
        }
    }
    if (times != NULL) {
        *times = n;
    }
    return found;
}

/* The reference event to the reference key: every header a delivery has. */
static void build_reference(const json_t *dest, struct hub_webhook_headers *h) {
    struct hub_sign_key key;
    struct hub_webhook_event ev = {
        .id = REF_ID,
        .source = "/orders",
        .type = "com.example.order.created",
        .time = "2021-02-25T15:02:10Z",
        .subject = "order 42",
        .event_type = "order.created",
    };
    struct hub_webhook_target t = {
        .tenant_id = "acme",
        .subscription_id = "0190a5c8-0000-7000-8000-000000000001",
        .delivery_id = "0190a5c8-0000-7000-8000-000000000002",
        .attempt = 3,
        .keys = &key,
        .nkeys = 1,
        .unix_s = REF_TS,
        .dest_headers = dest,
    };

    load_key(REF_SECRET, &key);
    assert_int_equal(hub_webhook_build_headers(&ev, &t, REF_BODY, strlen(REF_BODY), h), 0);
}

static void test_reference_headers(void **state) {
    (void)state;
    struct hub_webhook_headers h;

    build_reference(NULL, &h);
    assert_string_equal(header(&h, "webhook-signature", NULL), REF_SIG);
    assert_string_equal(header(&h, "X-Lerian-Signature", NULL), REF_LERIAN);
    assert_string_equal(header(&h, "webhook-id", NULL), REF_ID);
    assert_string_equal(header(&h, "webhook-timestamp", NULL), "1614265330");
    assert_string_equal(header(&h, "X-Lerian-Timestamp", NULL), "1614265330");
    assert_string_equal(header(&h, "X-Lerian-Attempt", NULL), "3");
    assert_string_equal(header(&h, "X-Lerian-Tenant-Id", NULL), "acme");
    assert_string_equal(header(&h, "ce-specversion", NULL), "1.0");
    assert_string_equal(header(&h, "ce-tenantid", NULL), "acme");
    /* no content type given: the JSON default */
    assert_string_equal(header(&h, "Content-Type", NULL), "application/json");
    /* the binding's encoding: a space is %20 */
    assert_string_equal(header(&h, "ce-subject", NULL), "order%2042");
    assert_null(header(&h, "traceparent", NULL));
    hub_webhook_headers_free(&h);
    assert_null(h.lines);
    assert_int_equal(h.n, 0);
}

/* Destination headers are added; reserved names and values that could
 * split a header line never are, and cannot replace the hub's own. */
static void test_destination_headers(void **state) {
    (void)state;
    struct hub_webhook_headers h;
    json_t *dest =
        json_pack("{s:s, s:s, s:s, s:s}", "Authorization", "Bearer t0ken", "X-Lerian-Signature",
                  "forged", "Host", "evil.example", "X-Split", "a\r\nInjected: yes");
    int times = 0;

    assert_non_null(dest);
    build_reference(dest, &h);
    assert_string_equal(header(&h, "Authorization", NULL), "Bearer t0ken");
    assert_string_equal(header(&h, "X-Lerian-Signature", &times), REF_LERIAN);
    assert_int_equal(times, 1);
    assert_null(header(&h, "Host", NULL));
    assert_null(header(&h, "X-Split", NULL));
    assert_null(header(&h, "Injected", NULL));
    hub_webhook_headers_free(&h);
    json_decref(dest);
}

static void test_build_refuses(void **state) {
    (void)state;
    struct hub_sign_key key;
    struct hub_webhook_headers h = {0};
    struct hub_webhook_event ev = {
        .id = REF_ID, .source = "/s", .type = "t", .time = "x", .event_type = "t"};
    struct hub_webhook_target t = {.tenant_id = "acme",
                                   .subscription_id = "s",
                                   .delivery_id = "d",
                                   .attempt = 1,
                                   .keys = &key,
                                   .nkeys = 0};

    load_key(REF_SECRET, &key);
    /* no key: nothing could be signed */
    assert_int_equal(hub_webhook_build_headers(&ev, &t, "{}", 2, &h), HUB_EINVAL);
    assert_null(h.lines);
    t.nkeys = 1;
    ev.id = NULL;
    assert_int_equal(hub_webhook_build_headers(&ev, &t, "{}", 2, &h), HUB_EINVAL);
    assert_null(h.lines);
}

static void test_header_names(void **state) {
    (void)state;
    assert_true(hub_webhook_header_reserved("x-lerian-anything", 17));
    assert_true(hub_webhook_header_reserved("Webhook-Id", 10));
    assert_true(hub_webhook_header_reserved("CE-ID", 5));
    assert_true(hub_webhook_header_reserved("Content-Length", 14));
    assert_true(hub_webhook_header_reserved("connection", 10));
    assert_false(hub_webhook_header_reserved("Authorization", 13));
    assert_false(hub_webhook_header_reserved("X-Api-Key", 9));
    assert_true(hub_webhook_header_name_valid("X-Api-Key", 9));
    assert_false(hub_webhook_header_name_valid("X Api", 5));
    assert_false(hub_webhook_header_name_valid("", 0));
}

/*
 * A probe a receiver can verify with its secret alone: the body is
 * {"challenge": <32 base64url characters>}, the headers say what it is, and
 * webhook-signature is the Standard Webhooks signature over webhook-id,
 * webhook-timestamp and the body as sent.
 */
static void test_probe(void **state) {
    (void)state;
    struct hub_sign_key key;
    struct hub_webhook_probe p, q;
    struct hub_webhook_target t = {
        .tenant_id = "acme",
        .subscription_id = "0190a5c8-0000-7000-8000-000000000001",
        .delivery_id = "0190a5c8-0000-7000-8000-000000000003",
        .attempt = 1,
        .keys = &key,
        .nkeys = 1,
        .unix_s = 1, /* not read: a probe is stamped now */
    };
    char expect_body[64], sig[HUB_SIGN_WEBHOOK_SIZE];
    const char *id, *ts;
    long long now = (long long)time(NULL);

    load_key(REF_SECRET, &key);
    assert_int_equal(hub_webhook_build_probe(&t, &p), 0);
    assert_int_equal(strlen(p.challenge), 32);
    assert_int_equal(strspn(p.challenge, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                         "0123456789-_"),
                     32);
    snprintf(expect_body, sizeof(expect_body), "{\"challenge\":\"%s\"}", p.challenge);
    assert_string_equal(p.body, expect_body);
    assert_int_equal(p.body_len, strlen(expect_body));
    assert_string_equal(header(&p.headers, "ce-type", NULL),
                        "studio.lerian.subscription.verification");
    assert_string_equal(header(&p.headers, "ce-source", NULL), "/streaming-hub");
    assert_string_equal(header(&p.headers, "X-Lerian-Event-Type", NULL),
                        "subscription.verification");
    assert_string_equal(header(&p.headers, "X-Lerian-Attempt", NULL), "1");
    assert_string_equal(header(&p.headers, "Content-Type", NULL), "application/json");
    id = header(&p.headers, "webhook-id", NULL);
    ts = header(&p.headers, "webhook-timestamp", NULL);
    assert_non_null(id);
    assert_non_null(ts);
    assert_int_equal(strncmp(id, "verify-", 7), 0);
    assert_string_equal(header(&p.headers, "ce-id", NULL), id);
    assert_true(llabs(strtoll(ts, NULL, 10) - now) <= 5);
    assert_int_equal(hub_sign_webhook(key.key, key.len, id, strtoll(ts, NULL, 10), p.body,
                                      p.body_len, sig, sizeof(sig)),
                     47);
    assert_string_equal(header(&p.headers, "webhook-signature", NULL), sig);

    /* every probe has its own challenge and event id */
    assert_int_equal(hub_webhook_build_probe(&t, &q), 0);
    assert_string_not_equal(p.challenge, q.challenge);
    assert_string_not_equal(header(&q.headers, "webhook-id", NULL), id);
    hub_webhook_probe_free(&q);
    hub_webhook_probe_free(&p);
    assert_null(p.body);
    assert_null(p.headers.lines);
}

static void test_probe_without_key(void **state) {
    (void)state;
    struct hub_webhook_probe p;
    struct hub_webhook_target t = {
        .tenant_id = "acme", .subscription_id = "s", .delivery_id = "d", .attempt = 1, .nkeys = 0};

    assert_int_equal(hub_webhook_build_probe(&t, &p), HUB_EINVAL);
    assert_null(p.body);
    assert_null(p.headers.lines);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_headers),
        cmocka_unit_test(test_destination_headers),
        cmocka_unit_test(test_build_refuses),
        cmocka_unit_test(test_header_names),
        cmocka_unit_test(test_probe),
        cmocka_unit_test(test_probe_without_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
