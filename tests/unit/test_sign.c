/*
 * Unit tests of webhook signing (SPEC §7.2): the Standard Webhooks reference
 * vector, the Lerian signature against values computed independently with the
 * openssl CLI, rotation (two keys, two entries, in order), secret parsing and
 * generation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sign.h"

/* The Standard Webhooks specification's published example. */
#define REF_SECRET "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
#define REF_ID "msg_p5jXN8AQM9LWM0D4loKWxJek"
#define REF_TS 1614265330
#define REF_BODY "{\"test\": 2432232314}"
#define REF_SIG "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

/*
 * Lerian signature of REF_BODY at REF_TS under the reference key, produced
 * outside this code base with:
 *   K=$(printf 'MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw' | base64 -d | od -An -tx1 | tr -d ' \n')
 *   printf 'v1:1614265330.{"test": 2432232314}' \
 *     | openssl dgst -sha256 -mac HMAC -macopt hexkey:$K
 */
#define REF_LERIAN "v1,sha256=b0992e328012ca09538b1d90c0f0c21317c5a7da5b3e0da01478d3034aa4304b"

/*
 * A second key for rotation: the 32 bytes 0x00..0x1f.  Expected values from:
 *   K2=000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
 *   printf 'msg_p5jXN8AQM9LWM0D4loKWxJek.1614265330.{"test": 2432232314}' \
 *     | openssl dgst -sha256 -mac HMAC -macopt hexkey:$K2 -binary | base64
 *   printf 'v1:1614265330.{"test": 2432232314}' | openssl dgst -sha256 -mac HMAC -macopt hexkey:$K2
 *   printf 'v1:0.' | openssl dgst -sha256 -mac HMAC -macopt hexkey:$K2
 */
#define KEY2_SECRET "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
#define KEY2_SIG "v1,O4Gjv1HqPqsMrjmczoggs/sWA8gZD0VyHG+fLh4+ktI="
#define KEY2_LERIAN "v1,sha256=e367090c2ccfff47811df29462854ccac9f124e610b3662c90f7a4e8e5611a7d"
#define KEY2_LERIAN_EMPTY_AT_0                                                                     \
    "v1,sha256=dbc1932fa8818161416aa445c97ef8b4ad4b85340cc2bdf713163e6c4c42328a"

static void load_key(const char *secret, struct hub_sign_key *k) {
    memset(k, 0, sizeof(*k));
    assert_int_equal(hub_secret_key(secret, k->key, &k->len), 0);
}

static void test_reference_vector(void **state) {
    (void)state;
    struct hub_sign_key k;
    char out[HUB_SIGN_WEBHOOK_SIZE];

    load_key(REF_SECRET, &k);
    assert_int_equal(k.len, 24);
    size_t n = hub_sign_webhook(k.key, k.len, REF_ID, REF_TS, REF_BODY, strlen(REF_BODY), out,
                                sizeof(out));
    assert_int_equal(n, strlen(REF_SIG));
    assert_string_equal(out, REF_SIG);
}

static void test_lerian_independent_value(void **state) {
    (void)state;
    struct hub_sign_key k;
    char out[HUB_SIGN_LERIAN_SIZE];

    load_key(REF_SECRET, &k);
    size_t n = hub_sign_lerian(k.key, k.len, REF_TS, REF_BODY, strlen(REF_BODY), out, sizeof(out));
    assert_int_equal(n, strlen(REF_LERIAN));
    assert_string_equal(out, REF_LERIAN);

    /* empty body, timestamp 0, body pointer NULL */
    load_key(KEY2_SECRET, &k);
    assert_int_equal(k.len, 32);
    n = hub_sign_lerian(k.key, k.len, 0, NULL, 0, out, sizeof(out));
    assert_int_equal(n, strlen(KEY2_LERIAN_EMPTY_AT_0));
    assert_string_equal(out, KEY2_LERIAN_EMPTY_AT_0);
}

static void test_signature_depends_on_every_part(void **state) {
    (void)state;
    struct hub_sign_key k;
    char a[HUB_SIGN_WEBHOOK_SIZE], b[HUB_SIGN_WEBHOOK_SIZE];
    const char *body = REF_BODY;
    size_t len = strlen(body);

    load_key(REF_SECRET, &k);
    assert_true(hub_sign_webhook(k.key, k.len, REF_ID, REF_TS, body, len, a, sizeof(a)) > 0);
    assert_true(hub_sign_webhook(k.key, k.len, "msg_other", REF_TS, body, len, b, sizeof(b)) > 0);
    assert_string_not_equal(a, b);
    assert_true(hub_sign_webhook(k.key, k.len, REF_ID, REF_TS + 1, body, len, b, sizeof(b)) > 0);
    assert_string_not_equal(a, b);
    assert_true(hub_sign_webhook(k.key, k.len, REF_ID, REF_TS, body, len - 1, b, sizeof(b)) > 0);
    assert_string_not_equal(a, b);
}

static void test_rotation_two_entries_in_order(void **state) {
    (void)state;
    struct hub_sign_key keys[2];
    char wh[HUB_SIGN_HEADER_SIZE(HUB_SIGN_WEBHOOK_SIZE, 2)];
    char le[HUB_SIGN_HEADER_SIZE(HUB_SIGN_LERIAN_SIZE, 2)];

    load_key(KEY2_SECRET, &keys[0]); /* the new secret first */
    load_key(REF_SECRET, &keys[1]);  /* the previous one, within its grace */
    size_t n = hub_sign_headers(keys, 2, REF_ID, REF_TS, REF_BODY, strlen(REF_BODY), wh, sizeof(wh),
                                le, sizeof(le));
    assert_int_equal(n, 2);
    assert_string_equal(wh, KEY2_SIG " " REF_SIG);
    assert_string_equal(le, KEY2_LERIAN " " REF_LERIAN);

    /* a single key gives a single entry, no trailing space */
    n = hub_sign_headers(&keys[1], 1, REF_ID, REF_TS, REF_BODY, strlen(REF_BODY), wh, sizeof(wh),
                         le, sizeof(le));
    assert_int_equal(n, 1);
    assert_string_equal(wh, REF_SIG);
    assert_string_equal(le, REF_LERIAN);
}

static void test_headers_refuse_short_buffers(void **state) {
    (void)state;
    struct hub_sign_key keys[2];
    char wh[HUB_SIGN_HEADER_SIZE(HUB_SIGN_WEBHOOK_SIZE, 2)];
    char le[HUB_SIGN_HEADER_SIZE(HUB_SIGN_LERIAN_SIZE, 2)];

    load_key(KEY2_SECRET, &keys[0]);
    load_key(REF_SECRET, &keys[1]);
    /* one byte short of two entries: no half-signed header */
    assert_int_equal(
        hub_sign_headers(keys, 2, REF_ID, REF_TS, "x", 1, wh, sizeof(wh) - 1, le, sizeof(le)), 0);
    assert_string_equal(wh, "");
    assert_string_equal(le, "");
    assert_int_equal(
        hub_sign_headers(keys, 2, REF_ID, REF_TS, "x", 1, wh, sizeof(wh), le, sizeof(le) - 1), 0);
    assert_int_equal(
        hub_sign_headers(keys, 0, REF_ID, REF_TS, "x", 1, wh, sizeof(wh), le, sizeof(le)), 0);
    /* an invalid key anywhere in the list refuses the whole header */
    keys[1].len = 0;
    assert_int_equal(
        hub_sign_headers(keys, 2, REF_ID, REF_TS, "x", 1, wh, sizeof(wh), le, sizeof(le)), 0);
    assert_string_equal(wh, "");

    char small[HUB_SIGN_WEBHOOK_SIZE - 1];
    assert_int_equal(
        hub_sign_webhook(keys[0].key, keys[0].len, REF_ID, REF_TS, "x", 1, small, sizeof(small)),
        0);
    char small2[HUB_SIGN_LERIAN_SIZE - 1];
    assert_int_equal(
        hub_sign_lerian(keys[0].key, keys[0].len, REF_TS, "x", 1, small2, sizeof(small2)), 0);
}

static void test_secret_key_forms(void **state) {
    (void)state;
    unsigned char key[HUB_SIGN_KEY_MAX], bare[HUB_SIGN_KEY_MAX];
    size_t len = 99, blen = 0;

    /* with and without the prefix, the same key */
    assert_int_equal(hub_secret_key(REF_SECRET, key, &len), 0);
    assert_int_equal(hub_secret_key("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", bare, &blen), 0);
    assert_int_equal(len, 24);
    assert_int_equal(blen, 24);
    assert_memory_equal(key, bare, 24);
    assert_int_equal(key[0], 0x31);
    assert_int_equal(key[23], 0xb0);

    /* padding optional: 32 bytes with and without the trailing '=' */
    assert_int_equal(hub_secret_key(KEY2_SECRET, key, &len), 0);
    assert_int_equal(len, 32);
    assert_int_equal(hub_secret_key("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8", key, &len), 0);
    assert_int_equal(len, 32);
    assert_int_equal(key[31], 0x1f);

    /* 64 bytes is the most a key may be */
    char big[6 + 90];
    memcpy(big, "whsec_", 6);
    memset(big + 6, 'A', 88); /* 88 chars = 66 bytes */
    big[6 + 88] = '\0';
    assert_int_equal(hub_secret_key(big, key, &len), -1);
    big[6 + 84] = '\0'; /* 84 chars = 63 bytes */
    assert_int_equal(hub_secret_key(big, key, &len), 0);
    assert_int_equal(len, 63);
    memcpy(big + 6 + 84, "AA==", 5); /* 64 bytes */
    assert_int_equal(hub_secret_key(big, key, &len), 0);
    assert_int_equal(len, 64);
}

static void test_malformed_secret_refused(void **state) {
    (void)state;
    static const char *bad[] = {
        "",
        "whsec_",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS!",   /* not base64 */
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS",    /* 31 chars: non-zero unused bits */
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw ",  /* whitespace */
        "whsec_MfKQ9r8GKYqrTwjUPD8I LPZIo2LaLaSw",  /* whitespace inside */
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwA",  /* 33 chars: a lone last character */
        "whsec_AA=A",                               /* padding in the middle */
        "whsec_AAA==",                              /* too much padding */
        "whsec_AB==",                               /* non-zero unused bits */
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw==", /* padding after a full quantum */
        "whsec_-_-_",                               /* base64url is not the standard alphabet */
        "WHSEC_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",   /* the prefix is case-sensitive */
    };
    unsigned char key[HUB_SIGN_KEY_MAX];
    size_t len;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        len = 7;
        memset(key, 0xAA, sizeof(key));
        if (hub_secret_key(bad[i], key, &len) != -1) {
            fail_msg("accepted malformed secret \"%s\"", bad[i]);
        }
        assert_int_equal(len, 0);
        /* nothing of a half-decoded key is left behind */
        for (size_t j = 0; j < sizeof(key); j++) {
            assert_int_equal(key[j], 0);
        }
    }
    assert_int_equal(hub_secret_key(NULL, key, &len), -1);
}

static void test_generated_secrets(void **state) {
    (void)state;
    char a[HUB_SECRET_SIZE], b[HUB_SECRET_SIZE];
    unsigned char ka[HUB_SIGN_KEY_MAX], kb[HUB_SIGN_KEY_MAX];
    size_t la = 0, lb = 0;

    assert_int_equal(hub_secret_generate(a, sizeof(a)), 0);
    assert_int_equal(hub_secret_generate(b, sizeof(b)), 0);
    assert_int_equal(strlen(a), HUB_SECRET_SIZE - 1);
    assert_int_equal(strncmp(a, "whsec_", 6), 0);
    assert_string_not_equal(a, b);
    assert_int_equal(hub_secret_key(a, ka, &la), 0);
    assert_int_equal(hub_secret_key(b, kb, &lb), 0);
    assert_int_equal(la, 32);
    assert_int_equal(lb, 32);
    assert_memory_not_equal(ka, kb, 32);

    /* too small a buffer is refused, not truncated */
    char small[HUB_SECRET_SIZE - 1];
    assert_int_equal(hub_secret_generate(small, sizeof(small)), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_vector),
        cmocka_unit_test(test_lerian_independent_value),
        cmocka_unit_test(test_signature_depends_on_every_part),
        cmocka_unit_test(test_rotation_two_entries_in_order),
        cmocka_unit_test(test_headers_refuse_short_buffers),
        cmocka_unit_test(test_secret_key_forms),
        cmocka_unit_test(test_malformed_secret_refused),
        cmocka_unit_test(test_generated_secrets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
