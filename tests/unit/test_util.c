/*
 * Unit tests of the base64 codecs in util.c, which the KEK, webhook secrets,
 * sealed texts (strict), structured-mode data_base64 and API cursors (URL
 * alphabet) all go through: round trips of every length through both
 * alphabets, the padding rules, the strict mode's one spelling per value,
 * the output bound, and the length a size check reads before decoding.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "util.h"

/* Decodes text (NUL-terminated) with flags into out; returns the length or -1. */
static long decode(const char *text, unsigned flags, unsigned char *out, size_t outsz) {
    size_t n = 0;
    if (hub_base64_decode(text, strlen(text), flags, out, outsz, &n) != 0) {
        return -1;
    }
    return (long)n;
}

static void test_round_trips(void **state) {
    unsigned char raw[64], back[64];
    char url[100];

    (void)state;
    for (size_t i = 0; i < sizeof(raw); i++) {
        raw[i] = (unsigned char)(i * 37 + 251); /* every byte value class, '+' and '/' too */
    }
    for (size_t len = 0; len <= sizeof(raw); len++) {
        char *std = hub_base64(raw, len);
        assert_non_null(std);
        assert_int_equal(strlen(std) % 4, 0);
        assert_int_equal(decode(std, HUB_B64_STRICT, back, sizeof(back)), (long)len);
        size_t want = 0;
        assert_int_equal(hub_base64_decoded_len(std, strlen(std), &want), 0);
        assert_int_equal(want, len);
        assert_memory_equal(back, raw, len);
        free(std);

        size_t n = hub_base64url(raw, len, url);
        assert_int_equal(n, strlen(url));
        assert_null(strpbrk(url, "+/="));
        assert_int_equal(decode(url, HUB_B64_URL | HUB_B64_STRICT, back, sizeof(back)), (long)len);
        assert_memory_equal(back, raw, len);
    }
}

static void test_alphabets(void **state) {
    unsigned char out[8];

    (void)state;
    /* 0xfb 0xff: "+/8=" in the standard alphabet, "-_8" in the URL one */
    assert_int_equal(decode("+/8=", 0, out, sizeof(out)), 2);
    assert_int_equal(out[0], 0xfb);
    assert_int_equal(out[1], 0xff);
    assert_int_equal(decode("-_8", HUB_B64_URL, out, sizeof(out)), 2);
    assert_int_equal(out[0], 0xfb);
    assert_int_equal(decode("-_8", 0, out, sizeof(out)), -1);
    assert_int_equal(decode("+/8", HUB_B64_URL, out, sizeof(out)), -1);
    assert_true(hub_base64url_char('-') && hub_base64url_char('_') && hub_base64url_char('z'));
    assert_false(hub_base64url_char('+') || hub_base64url_char('/') || hub_base64url_char('='));
}

static void test_padding(void **state) {
    unsigned char out[8];
    size_t n;

    (void)state;
    assert_int_equal(decode("", 0, out, sizeof(out)), 0);
    assert_int_equal(decode("QQ==", 0, out, sizeof(out)), 1);
    assert_int_equal(decode("QQ", 0, out, sizeof(out)), 1);
    assert_int_equal(decode("QUI=", 0, out, sizeof(out)), 2);
    assert_int_equal(decode("QUI", 0, out, sizeof(out)), 2);
    /* padding only where it completes a quantum, and no more of it */
    assert_int_equal(decode("QQ=", 0, out, sizeof(out)), -1);
    assert_int_equal(decode("QQ===", 0, out, sizeof(out)), -1);
    assert_int_equal(decode("Q===", 0, out, sizeof(out)), -1);
    assert_int_equal(decode("====", 0, out, sizeof(out)), -1);
    assert_int_equal(decode("QQ==QQ==", 0, out, sizeof(out)), -1);
    /* a lone character cannot carry a byte */
    assert_int_equal(decode("Q", 0, out, sizeof(out)), -1);
    assert_int_equal(hub_base64_decoded_len("QUJDQ", 5, &n), -1);
    assert_int_equal(decode("QUJDQ", 0, out, sizeof(out)), -1);
    /* no whitespace, no NUL */
    assert_int_equal(decode("QU JD", 0, out, sizeof(out)), -1);
    assert_int_equal(decode("QUJD\n", 0, out, sizeof(out)), -1);
    assert_int_equal(hub_base64_decode("QU\0D", 4, 0, out, sizeof(out), &n), -1);
}

static void test_strict(void **state) {
    unsigned char out[8];

    (void)state;
    /* "QR==" and "QQ==" both carry 'A' (0x41); only "QQ==" leaves the
     * unused bits zero */
    assert_int_equal(decode("QR==", 0, out, sizeof(out)), 1);
    assert_int_equal(out[0], 'A');
    assert_int_equal(decode("QR==", HUB_B64_STRICT, out, sizeof(out)), -1);
    assert_int_equal(decode("QQ==", HUB_B64_STRICT, out, sizeof(out)), 1);
    assert_int_equal(decode("QUJ=", HUB_B64_STRICT, out, sizeof(out)), -1);
    assert_int_equal(decode("QUI=", HUB_B64_STRICT, out, sizeof(out)), 2);
}

static void test_bound(void **state) {
    unsigned char out[3];

    (void)state;
    assert_int_equal(decode("QUJD", 0, out, 3), 3);
    assert_memory_equal(out, "ABC", 3);
    assert_int_equal(decode("QUJDRA==", 0, out, 3), -1);
    assert_int_equal(decode("QUJD", 0, out, 2), -1);
}

/* The published FNV-1a 64 test vectors, and a key hashed part by part
 * equals the same bytes hashed at once. */
static void test_fnv1a(void **state) {
    (void)state;
    assert_true(hub_fnv1a_str("") == 0xcbf29ce484222325ULL);
    assert_true(hub_fnv1a_str("a") == 0xaf63dc4c8601ec8cULL);
    assert_true(hub_fnv1a_str("foobar") == 0x85944171f73967e8ULL);
    assert_true(hub_fnv1a(hub_fnv1a(HUB_FNV1A_BASIS, "foo", 3), "bar", 3) ==
                hub_fnv1a_str("foobar"));
}

static void test_http_token(void **state) {
    (void)state;
    assert_true(hub_http_token("X-Api-Key", 9));
    assert_true(hub_http_token("!#$%&'*+-.^_`|~09az", 19));
    assert_false(hub_http_token("", 0));
    assert_false(hub_http_token("X Key", 5));
    assert_false(hub_http_token("X:Key", 5));
    assert_false(hub_http_token("X\0Key", 5));
    assert_false(hub_http_token("caf\xc3\xa9", 5));
    assert_true(hub_http_value_safe("a b\tc\xc3\xa9", 7));
    assert_true(hub_http_value_safe("", 0));
    assert_false(hub_http_value_safe("a\r\nX-Evil: 1", 14));
    assert_false(hub_http_value_safe("a\0b", 3));
    assert_false(hub_http_value_safe("a\x7f", 2));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trips), cmocka_unit_test(test_alphabets),
        cmocka_unit_test(test_padding),     cmocka_unit_test(test_strict),
        cmocka_unit_test(test_bound),       cmocka_unit_test(test_fnv1a),
        cmocka_unit_test(test_http_token),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
