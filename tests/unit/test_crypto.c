/*
 * Unit tests of secrets at rest (SPEC §11): KEK parsing and key ids, seal/open
 * round trips, refusal of every kind of tampering, AAD binding, KEK rotation,
 * the key ring of current and previous KEKs, and a value sealed by an
 * independent AES-GCM implementation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/evp.h>

#include "crypto.h"
#include "util.h"

/* The 32 bytes 0x00..0x1f; id from `printf '\x00...\x1f' | openssl dgst -sha256`. */
#define KEK_A "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
#define KEK_A_ID "630dcd2966c43366"
/* 32 bytes of 0xff; id from python3 hashlib.sha256(bytes([0xff]*32)). */
#define KEK_B "//////////////////////////////////////////8="
#define KEK_B_ID "af9613760f72635f"

/*
 * Sealed by Python's `cryptography` (AESGCM, not OpenSSL's EVP API as used by
 * crypto.c) under KEK_A with nonce 0x64..0x6f and AAD "sub-123":
 *   AESGCM(bytes(range(32))).encrypt(bytes(range(100,112)), b"X-Api-Key: s3cr3t", b"sub-123")
 * then "v1:" + kid + ":" + base64(nonce + ciphertext_and_tag).
 */
#define FOREIGN_SEALED                                                                             \
    "v1:630dcd2966c43366:ZGVmZ2hpamtsbW5vEDafFhDEHftHWH+b6QYYzjahBPe+KhoNCwlcA8BeK+Z4"

static void parse(const char *b64, struct hub_kek *k) {
    assert_int_equal(hub_kek_parse(b64, k), 0);
}

/* Opens and expects success with the given plaintext. */
static void expect_open(const struct hub_kek *keks, size_t n, const char *sealed, const char *aad,
                        const void *want, size_t wantlen) {
    unsigned char *pt = NULL;
    size_t len = 0;
    assert_int_equal(hub_open(keks, n, sealed, aad, &pt, &len), 0);
    assert_non_null(pt);
    assert_int_equal(len, wantlen);
    if (wantlen > 0) {
        assert_memory_equal(pt, want, wantlen);
    }
    assert_int_equal(pt[len], '\0');
    free(pt);
}

/* Opens and expects refusal, with the outputs cleared. */
static void expect_refused(const struct hub_kek *keks, size_t n, const char *sealed,
                           const char *aad) {
    unsigned char *pt = (unsigned char *)"junk";
    size_t len = 42;
    if (hub_open(keks, n, sealed, aad, &pt, &len) != -1) {
        fail_msg("opened \"%s\"", sealed);
    }
    assert_null(pt);
    assert_int_equal(len, 0);
}

/*
 * Returns a malloc'd copy of sealed with one byte of the decoded payload
 * (nonce || ciphertext || tag) XOR-ed with 0x01 at offset `at` (negative:
 * from the end).  Re-encoded properly, so only the bytes change and the
 * refusal must come from authentication, not from the base64 parser.
 */
static char *flip_byte(const char *sealed, long at) {
    const char *b64 = strrchr(sealed, ':') + 1;
    size_t hdr = (size_t)(b64 - sealed), b64len = strlen(b64);
    unsigned char *raw = malloc(b64len);
    assert_non_null(raw);
    int n = EVP_DecodeBlock(raw, (const unsigned char *)b64, (int)b64len);
    assert_true(n > 0);
    /* EVP_DecodeBlock counts padding as zero bytes */
    size_t rawlen = (size_t)n - (b64[b64len - 1] == '=') - (b64[b64len - 2] == '=');
    size_t pos = at >= 0 ? (size_t)at : rawlen - (size_t)(-at);
    assert_true(pos < rawlen);
    raw[pos] ^= 0x01;
    char *enc = hub_base64(raw, rawlen);
    assert_non_null(enc);
    char *out = malloc(hdr + strlen(enc) + 1);
    assert_non_null(out);
    memcpy(out, sealed, hdr);
    strcpy(out + hdr, enc);
    free(enc);
    free(raw);
    return out;
}

static void test_kek_parse_and_id(void **state) {
    (void)state;
    struct hub_kek a, b;

    parse(KEK_A, &a);
    parse(KEK_B, &b);
    assert_string_equal(a.id, KEK_A_ID);
    assert_string_equal(b.id, KEK_B_ID);
    assert_int_equal(a.key[0], 0x00);
    assert_int_equal(a.key[31], 0x1f);
    /* padding is optional */
    parse("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8", &b);
    assert_string_equal(b.id, KEK_A_ID);
}

static void test_kek_malformed_refused(void **state) {
    (void)state;
    static const char *bad[] = {
        "",
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==",   /* 31 bytes */
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",   /* 33 bytes */
        "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n", /* trailing newline */
        " AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",  /* leading space */
        "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh*=",   /* bad character */
        "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh9=",   /* non-zero unused bits */
        "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8==",  /* too much padding */
        "not base64 at all",
    };
    struct hub_kek k;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(&k, 0xAA, sizeof(k));
        if (hub_kek_parse(bad[i], &k) != -1) {
            fail_msg("accepted KEK \"%s\"", bad[i]);
        }
        /* nothing of a half-decoded key is left behind */
        for (size_t j = 0; j < sizeof(k.key); j++) {
            assert_int_equal(k.key[j], 0);
        }
    }
    assert_int_equal(hub_kek_parse(NULL, &k), -1);
}

static void test_round_trip(void **state) {
    (void)state;
    struct hub_kek k;
    static const unsigned char bin[] = {'a', 0, 'b', 0xff, 0};
    const char *secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    parse(KEK_A, &k);
    char *s = hub_seal(&k, secret, strlen(secret), "sub-1");
    assert_non_null(s);
    /* the format other tools and operators rely on */
    assert_int_equal(strncmp(s, "v1:" KEK_A_ID ":", 20), 0);
    /* 12 + 38 + 16 = 66 bytes -> 88 base64 characters */
    assert_int_equal(strlen(s), 20 + 88);
    assert_null(strstr(s, "MfKQ9r8G"));
    expect_open(&k, 1, s, "sub-1", secret, strlen(secret));
    free(s);

    /* binary with NULs, no aad */
    s = hub_seal(&k, bin, sizeof(bin), NULL);
    assert_non_null(s);
    expect_open(&k, 1, s, NULL, bin, sizeof(bin));
    expect_open(&k, 1, s, "", bin, sizeof(bin)); /* NULL and "" are the same aad */
    free(s);

    /* empty plaintext still authenticates */
    s = hub_seal(&k, NULL, 0, "sub-1");
    assert_non_null(s);
    expect_open(&k, 1, s, "sub-1", "", 0);
    expect_refused(&k, 1, s, "sub-2");
    free(s);
}

static void test_opens_value_sealed_elsewhere(void **state) {
    (void)state;
    struct hub_kek k;
    const char *want = "X-Api-Key: s3cr3t";

    parse(KEK_A, &k);
    expect_open(&k, 1, FOREIGN_SEALED, "sub-123", want, strlen(want));
    expect_refused(&k, 1, FOREIGN_SEALED, "sub-124");
}

static void test_tampering_refused(void **state) {
    (void)state;
    struct hub_kek k[2];
    const char *pt = "credential";

    parse(KEK_A, &k[0]);
    parse(KEK_B, &k[1]);
    char *s = hub_seal(&k[0], pt, strlen(pt), "sub-1");
    assert_non_null(s);
    expect_open(k, 2, s, "sub-1", pt, strlen(pt));

    char *t = flip_byte(s, 0); /* nonce */
    expect_refused(k, 2, t, "sub-1");
    free(t);
    t = flip_byte(s, 11); /* last nonce byte */
    expect_refused(k, 2, t, "sub-1");
    free(t);
    t = flip_byte(s, 12); /* first ciphertext byte */
    expect_refused(k, 2, t, "sub-1");
    free(t);
    t = flip_byte(s, -17); /* last ciphertext byte */
    expect_refused(k, 2, t, "sub-1");
    free(t);
    t = flip_byte(s, -1); /* tag */
    expect_refused(k, 2, t, "sub-1");
    free(t);
    t = flip_byte(s, -16); /* first tag byte */
    expect_refused(k, 2, t, "sub-1");
    free(t);

    /* kid naming the other (known) KEK: right format, wrong key */
    t = strdup(s);
    assert_non_null(t);
    memcpy(t + 3, KEK_B_ID, 16);
    expect_refused(k, 2, t, "sub-1");
    /* kid naming no KEK at all */
    memcpy(t + 3, "0123456789abcdef", 16);
    expect_refused(k, 2, t, "sub-1");
    free(t);

    /* truncated: tag cut short */
    t = strdup(s);
    assert_non_null(t);
    t[strlen(t) - 4] = '\0';
    expect_refused(k, 2, t, "sub-1");
    free(t);
    free(s);
}

static void test_wrong_aad_refused(void **state) {
    (void)state;
    struct hub_kek k;
    parse(KEK_A, &k);

    char *s = hub_seal(&k, "x", 1, "sub-1");
    assert_non_null(s);
    expect_refused(&k, 1, s, "sub-2");
    expect_refused(&k, 1, s, "sub-1 ");
    expect_refused(&k, 1, s, NULL);
    free(s);

    s = hub_seal(&k, "x", 1, NULL);
    assert_non_null(s);
    expect_refused(&k, 1, s, "sub-1");
    free(s);
}

static void test_seals_differ(void **state) {
    (void)state;
    struct hub_kek k;
    parse(KEK_A, &k);

    char *a = hub_seal(&k, "same", 4, "sub-1");
    char *b = hub_seal(&k, "same", 4, "sub-1");
    assert_non_null(a);
    assert_non_null(b);
    assert_string_not_equal(a, b);
    /* and the nonces specifically differ (first 16 base64 chars = 12 bytes) */
    assert_memory_not_equal(a + 20, b + 20, 16);
    free(a);
    free(b);
}

static void test_rotation(void **state) {
    (void)state;
    struct hub_kek old_kek, new_kek;
    parse(KEK_A, &old_kek);
    parse(KEK_B, &new_kek);

    char *before = hub_seal(&old_kek, "old secret", 10, "sub-1");
    char *after = hub_seal(&new_kek, "new secret", 10, "sub-1");
    assert_non_null(before);
    assert_non_null(after);

    /* current first, previous second: both generations open */
    struct hub_kek list[2] = {new_kek, old_kek};
    expect_open(list, 2, before, "sub-1", "old secret", 10);
    expect_open(list, 2, after, "sub-1", "new secret", 10);
    /* once the old KEK is dropped, data it sealed no longer opens */
    expect_refused(&new_kek, 1, before, "sub-1");
    expect_refused(list, 0, after, "sub-1");
    free(before);
    free(after);
}

static void test_malformed_sealed_refused(void **state) {
    (void)state;
    struct hub_kek k;
    parse(KEK_A, &k);
    static const char *bad[] = {
        "",
        "v1:",
        "v1:" KEK_A_ID,
        "v1:" KEK_A_ID ":",
        "v2:" KEK_A_ID ":ZGVmZ2hpamtsbW5vEDafFhDEHftHWH+b6QYYzjahBPe+KhoNCwlcA8BeK+Z4",
        "v1:630DCD2966C43366:ZGVmZ2hpamtsbW5vEDafFhDEHftHWH+b6QYYzjahBPe+KhoNCwlcA8BeK+Z4",
        "v1:630dcd2966c4336:ZGVmZ2hpamtsbW5vEDafFhDEHftHWH+b6QYYzjahBPe+KhoNCwlcA8BeK+Z4",
        "v1:" KEK_A_ID "ZGVmZ2hpamtsbW5vEDafFhDEHftHWH+b6QYYzjahBPe+KhoNCwlcA8BeK+Z4",
        "v1:" KEK_A_ID ":ZGVmZ2hpamtsbW5vEDafFhDEHftHWH+b6QYYzjahBPe+KhoNCwlcA8BeK+Z4 ",
        "v1:" KEK_A_ID ":ZGVmZ2hpamtsbW5vEDafFhDEHftHWH+b6QYYzjahBPe+KhoNCwlcA8BeK+Z4==",
        "v1:" KEK_A_ID ":ZGVmZ2hpamtsbW5vEDafFhDEHftHWH+b6QYYzjahBPe+KhoNCwlcA8BeK+Z!",
        "v1:" KEK_A_ID ":AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", /* 27 bytes: no room for a tag */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        expect_refused(&k, 1, bad[i], "sub-123");
    }
    unsigned char *pt;
    size_t len;
    assert_int_equal(hub_open(&k, 1, NULL, NULL, &pt, &len), -1);
    assert_int_equal(hub_open(NULL, 1, FOREIGN_SEALED, "sub-123", &pt, &len), -1);
}

/* The key ring of STREAMING_HUB_KEK + STREAMING_HUB_KEK_PREVIOUS: the
 * current key seals, every key opens, duplicates are dropped, and a bad
 * entry is named by its position without showing a key. */
static void test_keyring(void **state) {
    (void)state;
    struct hub_keyring ring;
    char err[160];
    struct hub_kek a;
    char *old_seal, *new_seal;
    unsigned char *pt;
    size_t len;

    parse(KEK_A, &a);
    old_seal = hub_seal(&a, "old secret", 10, "sub-1");
    assert_non_null(old_seal);

    /* B current, A previous (blanks around entries, A twice, B again) */
    assert_int_equal(
        hub_keyring_parse(KEK_B, " " KEK_A " ," KEK_A "," KEK_B, &ring, err, sizeof(err)), 0);
    assert_int_equal(ring.n, 2);
    assert_string_equal(ring.keys[0].id, KEK_B_ID);
    assert_string_equal(ring.keys[1].id, KEK_A_ID);
    new_seal = hub_keyring_seal(&ring, "new secret", 10, "sub-1");
    assert_non_null(new_seal);
    assert_true(strncmp(new_seal, "v1:" KEK_B_ID ":", 20) == 0);
    assert_true(hub_keyring_is_current(&ring, new_seal));
    assert_false(hub_keyring_is_current(&ring, old_seal));
    assert_false(hub_keyring_is_current(&ring, "v1:" KEK_B_ID));
    assert_false(hub_keyring_is_current(&ring, NULL));
    assert_int_equal(hub_keyring_open(&ring, old_seal, "sub-1", &pt, &len), 0);
    assert_memory_equal(pt, "old secret", 10);
    free(pt);
    assert_int_equal(hub_keyring_open(&ring, new_seal, "sub-1", &pt, &len), 0);
    free(pt);
    assert_int_equal(hub_keyring_open(&ring, old_seal, "sub-2", &pt, &len), -1);

    /* B alone: A's seal no longer opens */
    assert_int_equal(hub_keyring_parse(KEK_B, "", &ring, err, sizeof(err)), 0);
    assert_int_equal(ring.n, 1);
    assert_int_equal(hub_keyring_open(&ring, old_seal, "sub-1", &pt, &len), -1);
    assert_int_equal(hub_keyring_parse(KEK_B, NULL, &ring, err, sizeof(err)), 0);

    /* errors name the variable and the entry, never a key */
    assert_int_equal(hub_keyring_parse("nope", KEK_A, &ring, err, sizeof(err)), -1);
    assert_string_equal(err, "STREAMING_HUB_KEK: not base64 of 32 bytes");
    assert_int_equal(hub_keyring_parse(KEK_B, KEK_A ",,", &ring, err, sizeof(err)), -1);
    assert_string_equal(err, "STREAMING_HUB_KEK_PREVIOUS: entry 2 is not base64 of 32 bytes");
    assert_int_equal(hub_keyring_parse(KEK_B, KEK_A ",AAAA", &ring, err, sizeof(err)), -1);
    assert_string_equal(err, "STREAMING_HUB_KEK_PREVIOUS: entry 2 is not base64 of 32 bytes");
    assert_int_equal(ring.n, 0); /* wiped */
    free(old_seal);
    free(new_seal);
}

/* More than 7 previous keys are refused (the ring holds 8). */
static void test_keyring_full(void **state) {
    (void)state;
    struct hub_keyring ring;
    char err[160], list[1024] = "";
    unsigned char key[32];

    for (int i = 1; i <= 8; i++) {
        char *b64;
        memset(key, i, sizeof(key));
        b64 = hub_base64(key, sizeof(key));
        assert_non_null(b64);
        strcat(list, i > 1 ? "," : "");
        strcat(list, b64);
        free(b64);
        if (i == 7) {
            assert_int_equal(hub_keyring_parse(KEK_A, list, &ring, err, sizeof(err)), 0);
            assert_int_equal(ring.n, 8);
        }
    }
    assert_int_equal(hub_keyring_parse(KEK_A, list, &ring, err, sizeof(err)), -1);
    assert_string_equal(err, "STREAMING_HUB_KEK_PREVIOUS: more than 7 keys");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kek_parse_and_id),
        cmocka_unit_test(test_kek_malformed_refused),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_opens_value_sealed_elsewhere),
        cmocka_unit_test(test_tampering_refused),
        cmocka_unit_test(test_wrong_aad_refused),
        cmocka_unit_test(test_seals_differ),
        cmocka_unit_test(test_rotation),
        cmocka_unit_test(test_malformed_sealed_refused),
        cmocka_unit_test(test_keyring),
        cmocka_unit_test(test_keyring_full),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
