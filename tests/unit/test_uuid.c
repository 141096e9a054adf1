/*
 * Unit tests of UUIDv7 generation (RFC 9562 §5.7, §6.2): version and variant
 * bits, the 48-bit timestamp, strict ordering of ids made within one
 * millisecond (and across a clock that steps back), the counter rollover,
 * the text form and its parsing back, and that two ids never collide.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "uuid.h"

#define T0 INT64_C(1733150000123) /* 2024-12-02T14:33:20.123Z */
#define N_SAME_MS 10000

static void assert_version_variant(const unsigned char u[HUB_UUID_BYTES]) {
    assert_int_equal(u[6] >> 4, 7); /* version 7 */
    assert_int_equal(u[8] >> 6, 2); /* variant 10 (RFC 9562) */
}

static void test_layout(void **state) {
    struct hub_uuid7_gen g = {0};
    unsigned char u[HUB_UUID_BYTES];

    (void)state;
    assert_int_equal(hub_uuid7_next(&g, T0, u), 0);
    assert_version_variant(u);
    assert_true(hub_uuid7_unix_ms(u) == T0);
    /* the timestamp is big-endian in the first 6 bytes */
    assert_int_equal(u[0], (T0 >> 40) & 0xff);
    assert_int_equal(u[5], T0 & 0xff);
    /* a fresh millisecond seeds the counter with its top bit clear */
    assert_int_equal(u[6] & 0x08, 0);
}

static void test_monotonic_same_ms(void **state) {
    struct hub_uuid7_gen g = {0};
    unsigned char prev[HUB_UUID_BYTES], cur[HUB_UUID_BYTES];

    (void)state;
    assert_int_equal(hub_uuid7_next(&g, T0, prev), 0);
    for (int i = 0; i < N_SAME_MS; i++) {
        assert_int_equal(hub_uuid7_next(&g, T0, cur), 0);
        assert_version_variant(cur);
        assert_true(hub_uuid7_unix_ms(cur) == T0);
        assert_true(memcmp(prev, cur, HUB_UUID_BYTES) < 0);
        memcpy(prev, cur, HUB_UUID_BYTES);
    }
}

static void test_text_sorts_like_bytes(void **state) {
    struct hub_uuid7_gen g = {0};
    unsigned char a[HUB_UUID_BYTES], b[HUB_UUID_BYTES];
    char ta[HUB_UUID_TEXT_SIZE], tb[HUB_UUID_TEXT_SIZE];

    (void)state;
    /* several ids per millisecond, across millisecond boundaries */
    for (int i = 0; i < 150; i++) {
        int64_t ms = T0 + i / 3;
        assert_int_equal(hub_uuid7_next(&g, ms, a), 0);
        assert_int_equal(hub_uuid7_next(&g, ms, b), 0);
        hub_uuid_format(a, ta);
        hub_uuid_format(b, tb);
        assert_true(strcmp(ta, tb) < 0);
    }
}

static void test_clock_steps_back(void **state) {
    struct hub_uuid7_gen g = {0};
    unsigned char a[HUB_UUID_BYTES], b[HUB_UUID_BYTES];

    (void)state;
    assert_int_equal(hub_uuid7_next(&g, T0, a), 0);
    assert_int_equal(hub_uuid7_next(&g, T0 - 5000, b), 0);
    assert_true(memcmp(a, b, HUB_UUID_BYTES) < 0);
    assert_true(hub_uuid7_unix_ms(b) == T0); /* the last timestamp is kept */
    /* a later millisecond starts a new counter */
    assert_int_equal(hub_uuid7_next(&g, T0 + 1, a), 0);
    assert_true(memcmp(b, a, HUB_UUID_BYTES) < 0);
    assert_true(hub_uuid7_unix_ms(a) == T0 + 1);
}

static void test_counter_rollover(void **state) {
    /* A counter at its maximum: the next id moves the timestamp on by 1 ms
     * rather than wrapping below the previous id. */
    struct hub_uuid7_gen g = {T0, (UINT64_C(1) << 42) - 1};
    unsigned char u[HUB_UUID_BYTES];

    (void)state;
    assert_int_equal(hub_uuid7_next(&g, T0, u), 0);
    assert_true(hub_uuid7_unix_ms(u) == T0 + 1);
    assert_version_variant(u);
    assert_int_equal(u[6] & 0x0f, 0);
    assert_int_equal(u[7], 0);
}

static int is_hex_lower(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

static void test_text_form(void **state) {
    char t[HUB_UUID_TEXT_SIZE], prev[HUB_UUID_TEXT_SIZE];
    struct timespec ts;
    int64_t now_ms, id_ms;
    unsigned char raw[HUB_UUID_BYTES];

    (void)state;
    clock_gettime(CLOCK_REALTIME, &ts);
    now_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    assert_int_equal(hub_uuid7_text(t), 0);
    assert_int_equal(strlen(t), 36);
    for (int i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            assert_int_equal(t[i], '-');
        } else {
            assert_true(is_hex_lower(t[i]));
        }
    }
    assert_int_equal(t[14], '7');           /* version digit */
    assert_non_null(strchr("89ab", t[19])); /* variant digit */
    /* the timestamp is the real clock (within a minute) */
    for (int i = 0, o = 0; i < 36; o++) {
        unsigned int byte = 0;
        if (t[i] == '-') {
            i++;
        }
        assert_int_equal(sscanf(t + i, "%2x", &byte), 1);
        raw[o] = (unsigned char)byte;
        i += 2;
    }
    id_ms = hub_uuid7_unix_ms(raw);
    assert_true(id_ms >= now_ms - 60000 && id_ms <= now_ms + 60000);
    /* consecutive calls on one thread are ordered as text too */
    memcpy(prev, t, sizeof(t));
    for (int i = 0; i < 1000; i++) {
        assert_int_equal(hub_uuid7_text(t), 0);
        assert_true(strcmp(prev, t) < 0);
        memcpy(prev, t, sizeof(t));
    }
}

static void test_format_known_bytes(void **state) {
    static const unsigned char in[HUB_UUID_BYTES] = {0x01, 0x93, 0x87, 0x5a, 0x2b, 0x3c,
                                                     0x7d, 0x4e, 0x8f, 0x50, 0x61, 0x72,
                                                     0x83, 0x94, 0xa5, 0xb6};
    char t[HUB_UUID_TEXT_SIZE];

    (void)state;
    hub_uuid_format(in, t);
    assert_string_equal(t, "0193875a-2b3c-7d4e-8f50-61728394a5b6");
    assert_true(hub_uuid7_unix_ms(in) == INT64_C(0x0193875a2b3c));
}

static void test_parse(void **state) {
    static const char *const bad[] = {
        "",
        "0193875a-2b3c-7d4e-8f50-61728394a5b",   /* short */
        "0193875a-2b3c-7d4e-8f50-61728394a5b6a", /* long */
        "0193875a2b3c-7d4e-8f50-61728394a5b6-",  /* dash misplaced */
        "0193875a-2b3c-7d4e-8f50-61728394a5bg",  /* not hex */
        "0193875a-2b3c-7d4e-8f50 61728394a5b6",
    };
    unsigned char u[HUB_UUID_BYTES], v[HUB_UUID_BYTES];
    char t[HUB_UUID_TEXT_SIZE];

    (void)state;
    assert_int_equal(hub_uuid_parse("0193875A-2B3C-7D4E-8F50-61728394A5B6", 36, u), 0);
    hub_uuid_format(u, t);
    assert_string_equal(t, "0193875a-2b3c-7d4e-8f50-61728394a5b6");
    for (int i = 0; i < 100; i++) {
        assert_int_equal(hub_uuid7_text(t), 0);
        assert_int_equal(hub_uuid_parse(t, strlen(t), v), 0);
        hub_uuid_format(v, t);
        assert_int_equal(hub_uuid_parse(t, strlen(t), u), 0);
        assert_memory_equal(u, v, HUB_UUID_BYTES);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(hub_uuid_parse(bad[i], strlen(bad[i]), u), -1);
    }
}

static void test_distinct_generators_do_not_collide(void **state) {
    /* Two processes minting in the same millisecond: random seeds and the
     * random low 32 bits keep their ids apart. */
    struct hub_uuid7_gen g1 = {0}, g2 = {0};
    unsigned char a[HUB_UUID_BYTES], b[HUB_UUID_BYTES];

    (void)state;
    for (int i = 0; i < 1000; i++) {
        assert_int_equal(hub_uuid7_next(&g1, T0, a), 0);
        assert_int_equal(hub_uuid7_next(&g2, T0, b), 0);
        assert_true(memcmp(a, b, HUB_UUID_BYTES) != 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_monotonic_same_ms),
        cmocka_unit_test(test_text_sorts_like_bytes),
        cmocka_unit_test(test_clock_steps_back),
        cmocka_unit_test(test_counter_rollover),
        cmocka_unit_test(test_text_form),
        cmocka_unit_test(test_format_known_bytes),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_distinct_generators_do_not_collide),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
