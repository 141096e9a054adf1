/*
 * Unit tests of the retry schedule (SPEC §7.3, §7.4): full-jitter bounds for
 * every step of the default curve, exhaustion after the 8th retry, the
 * distribution of delays, schedule validation, and Retry-After in all its
 * forms.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backoff.h"

#define MIN_MS (60 * 1000LL)
#define HOUR_MS (3600 * 1000LL)

/* Unix seconds from `date -u -d '<date>' +%s`. */
#define T_1994_11_06_084937 784111777LL
#define T_2024_03_01 1709251200LL
#define T_2000_03_01 951868800LL
#define T_2026_01_01 1767225600LL
#define T_2100_03_01 4107542400LL

/* A 64-bit LCG (Knuth's MMIX constants): deterministic, good enough high bits
 * for a distribution check, and independent of the code under test. */
static uint64_t lcg_next(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s;
}

static void test_default_curve(void **state) {
    (void)state;
    static const int64_t want[] = {1 * MIN_MS,  5 * MIN_MS,  15 * MIN_MS, 1 * HOUR_MS,
                                   3 * HOUR_MS, 6 * HOUR_MS, 8 * HOUR_MS, 10 * HOUR_MS};
    size_t n = 0;
    const int64_t *curve = hub_backoff_default(&n);

    assert_int_equal(n, 8);
    assert_memory_equal(curve, want, sizeof(want));
    assert_int_equal(hub_backoff_schedule_valid(curve, n), 1);
}

static void test_bounds_every_step(void **state) {
    (void)state;
    size_t n = 0;
    const int64_t *curve = hub_backoff_default(&n);

    for (size_t k = 1; k <= n; k++) {
        int64_t step = curve[k - 1];
        /* never 0: the smallest random value still waits 1 ms */
        assert_int_equal(hub_backoff_delay_ms(curve, n, (int)k, 0), 1);
        /* the largest reaches the step exactly, never beyond */
        assert_int_equal(hub_backoff_delay_ms(curve, n, (int)k, UINT64_MAX), step);
        /* the middle of the random range lands in the middle of the step */
        assert_int_equal(hub_backoff_delay_ms(curve, n, (int)k, UINT64_C(1) << 63), 1 + step / 2);
    }
}

static void test_exhaustion(void **state) {
    (void)state;
    size_t n = 0;
    const int64_t *curve = hub_backoff_default(&n);

    /* 9 attempts in all: the 8th failure still gets a retry, the 9th is dead */
    assert_true(hub_backoff_delay_ms(curve, n, 8, 12345) > 0);
    assert_int_equal(hub_backoff_delay_ms(curve, n, 9, 12345), -1);
    assert_int_equal(hub_backoff_delay_ms(curve, n, 100, 0), -1);
    /* no failure yet, or nonsense, has no delay */
    assert_int_equal(hub_backoff_delay_ms(curve, n, 0, 0), -1);
    assert_int_equal(hub_backoff_delay_ms(curve, n, -1, 0), -1);
    assert_int_equal(hub_backoff_delay_ms(NULL, 8, 1, 0), -1);
    assert_int_equal(hub_backoff_delay_ms(curve, 0, 1, 0), -1);

    /* a one-step override: one retry, then dead */
    int64_t one[] = {500};
    assert_int_equal(hub_backoff_delay_ms(one, 1, 1, UINT64_MAX), 500);
    assert_int_equal(hub_backoff_delay_ms(one, 1, 2, UINT64_MAX), -1);
}

static void test_distribution(void **state) {
    (void)state;
    enum { SAMPLES = 200000, BUCKETS = 10 };
    size_t n = 0;
    const int64_t *curve = hub_backoff_default(&n);
    uint64_t seed = 42;

    for (size_t k = 1; k <= n; k++) {
        int64_t step = curve[k - 1];
        double sum = 0;
        int64_t lo = INT64_MAX, hi = 0;
        long hist[BUCKETS] = {0};

        for (int i = 0; i < SAMPLES; i++) {
            int64_t d = hub_backoff_delay_ms(curve, n, (int)k, lcg_next(&seed));
            assert_true(d >= 1 && d <= step);
            sum += (double)d;
            lo = d < lo ? d : lo;
            hi = d > hi ? d : hi;
            hist[(d - 1) * BUCKETS / step]++;
        }
        /* uniform over (0, step]: mean step/2, the whole range is used */
        double mean = sum / SAMPLES;
        if (mean < 0.49 * (double)step || mean > 0.51 * (double)step) {
            fail_msg("step %lld: mean %.0f is not near half the step", (long long)step, mean);
        }
        assert_true(lo < step / 100);
        assert_true(hi > step - step / 100);
        for (int b = 0; b < BUCKETS; b++) {
            /* 20000 expected per bucket; +-5% is > 7 standard deviations */
            if (hist[b] < 19000 || hist[b] > 21000) {
                fail_msg("step %lld: bucket %d holds %ld samples", (long long)step, b, hist[b]);
            }
        }
    }
}

static void test_schedule_validation(void **state) {
    (void)state;
    int64_t s[13];
    for (int i = 0; i < 13; i++) {
        s[i] = MIN_MS;
    }
    assert_int_equal(hub_backoff_schedule_valid(s, 1), 1);
    assert_int_equal(hub_backoff_schedule_valid(s, 12), 1);
    assert_int_equal(hub_backoff_schedule_valid(s, 13), 0);
    assert_int_equal(hub_backoff_schedule_valid(s, 0), 0);
    assert_int_equal(hub_backoff_schedule_valid(NULL, 1), 0);

    s[3] = 10 * HOUR_MS; /* the longest step allowed */
    assert_int_equal(hub_backoff_schedule_valid(s, 12), 1);
    s[3] = 10 * HOUR_MS + 1;
    assert_int_equal(hub_backoff_schedule_valid(s, 12), 0);
    s[3] = 0;
    assert_int_equal(hub_backoff_schedule_valid(s, 12), 0);
    s[3] = -MIN_MS;
    assert_int_equal(hub_backoff_schedule_valid(s, 12), 0);
    s[3] = 1; /* 1 ms is in (0, 10h] */
    assert_int_equal(hub_backoff_schedule_valid(s, 12), 1);
}

static void test_unvalidated_steps_are_clamped(void **state) {
    (void)state;
    int64_t s[] = {0, -5, 100 * HOUR_MS};
    assert_int_equal(hub_backoff_delay_ms(s, 3, 1, UINT64_MAX), 1);
    assert_int_equal(hub_backoff_delay_ms(s, 3, 2, UINT64_MAX), 1);
    assert_int_equal(hub_backoff_delay_ms(s, 3, 3, UINT64_MAX), 10 * HOUR_MS);
}

static void test_retry_after_seconds(void **state) {
    (void)state;
    const int64_t now = T_2026_01_01 * 1000;

    assert_int_equal(hub_retry_after_ms("120", now), 120000);
    assert_int_equal(hub_retry_after_ms("0", now), 0);
    assert_int_equal(hub_retry_after_ms(" \t30 ", now), 30000);
    assert_int_equal(hub_retry_after_ms("007", now), 7000);
    assert_int_equal(hub_retry_after_ms("36000", now), 10 * HOUR_MS);
    assert_int_equal(hub_retry_after_ms("36001", now), 10 * HOUR_MS);
    assert_int_equal(hub_retry_after_ms("99999999999999999999999999999", now), 10 * HOUR_MS);

    static const char *bad[] = {"", "   ", "-5", "+5", "1.5", "12a", "a12", "1 2", "0x10", "1e3"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (hub_retry_after_ms(bad[i], now) != -1) {
            fail_msg("accepted Retry-After \"%s\"", bad[i]);
        }
    }
    assert_int_equal(hub_retry_after_ms(NULL, now), -1);
}

static void test_retry_after_dates(void **state) {
    (void)state;
    /* 90 s before the RFC's example instant, in each of the three forms */
    const int64_t now = (T_1994_11_06_084937 - 90) * 1000;

    assert_int_equal(hub_retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", now), 90000);
    assert_int_equal(hub_retry_after_ms("Sunday, 06-Nov-94 08:49:37 GMT", now), 90000);
    assert_int_equal(hub_retry_after_ms("Sun Nov  6 08:49:37 1994", now), 90000);
    assert_int_equal(hub_retry_after_ms("  Sun, 06 Nov 1994 08:49:37 GMT ", now), 90000);
    /* milliseconds of now count */
    assert_int_equal(hub_retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", now + 250), 89750);
    /* in the past: go now */
    assert_int_equal(hub_retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", now + 100000), 0);
    /* far future: capped at 10h */
    assert_int_equal(hub_retry_after_ms("Mon, 07 Nov 1994 08:49:37 GMT", now), 10 * HOUR_MS);

    /* calendar arithmetic across leap rules, checked against date(1) */
    assert_int_equal(hub_retry_after_ms("Fri, 01 Mar 2024 00:00:00 GMT", T_2024_03_01 * 1000 - 1),
                     1);
    assert_int_equal(
        hub_retry_after_ms("Thu, 29 Feb 2024 23:59:59 GMT", T_2024_03_01 * 1000 - 1500), 500);
    assert_int_equal(
        hub_retry_after_ms("Wed, 01 Mar 2000 00:00:00 GMT", T_2000_03_01 * 1000 - 5000), 5000);
    assert_int_equal(
        hub_retry_after_ms("Mon, 01 Mar 2100 00:00:00 GMT", T_2100_03_01 * 1000 - 5000), 5000);
    assert_int_equal(hub_retry_after_ms("Thu, 01 Jan 1970 00:00:00 GMT", 0), 0);
    assert_int_equal(hub_retry_after_ms("Thu, 01 Jan 1970 00:00:07 GMT", 0), 7000);
}

static void test_retry_after_rfc850_year(void **state) {
    (void)state;
    const int64_t now = T_2026_01_01 * 1000;

    /* "26" is this year */
    assert_int_equal(hub_retry_after_ms("Thursday, 01-Jan-26 00:00:30 GMT", now), 30000);
    /* "76" is at most 50 years ahead: 2076, in the future, capped */
    assert_int_equal(hub_retry_after_ms("Wednesday, 01-Jan-76 00:00:00 GMT", now), 10 * HOUR_MS);
    /* "77" would be 51 years ahead: it means 1977, in the past */
    assert_int_equal(hub_retry_after_ms("Saturday, 01-Jan-77 00:00:00 GMT", now), 0);
    assert_int_equal(hub_retry_after_ms("Sunday, 06-Nov-94 08:49:37 GMT", now), 0);
}

static void test_retry_after_bad_dates(void **state) {
    (void)state;
    const int64_t now = (T_1994_11_06_084937 - 90) * 1000;
    static const char *bad[] = {
        "Sun, 31 Nov 1994 08:49:37 GMT",    /* no 31 November */
        "Sun, 00 Nov 1994 08:49:37 GMT",    /* no day 0 */
        "Fri, 29 Feb 2023 00:00:00 GMT",    /* not a leap year */
        "Mon, 29 Feb 2100 00:00:00 GMT",    /* century, not a leap year */
        "Sun, 06 Nov 1994 24:00:00 GMT",    /* hour */
        "Sun, 06 Nov 1994 08:60:00 GMT",    /* minute */
        "Sun, 06 Nov 1994 08:49:61 GMT",    /* second */
        "Sun, 06 Nov 1994 08:49:37 UTC",    /* zone must be GMT */
        "Sun, 06 Nov 1994 08:49:37",        /* zone missing */
        "Sun, 06 Nov 1994 08:49:37 GMT x",  /* trailing junk */
        "Sun 06 Nov 1994 08:49:37 GMT",     /* comma missing */
        "sun, 06 Nov 1994 08:49:37 GMT",    /* names are case-sensitive */
        "Sun, 06 nov 1994 08:49:37 GMT",    /* names are case-sensitive */
        "Sun, 6 Nov 1994 08:49:37 GMT",     /* IMF day is two digits */
        "Sun, 06 Nov 94 08:49:37 GMT",      /* IMF year is four digits */
        "Sun, 06 Foo 1994 08:49:37 GMT",    /* month */
        "Sunday, 06-Nov-1994 08:49:37 GMT", /* RFC 850 year is two digits */
        "Sunday 06-Nov-94 08:49:37 GMT",    /* comma missing */
        "Sun Nov 6 08:49:37 1994",          /* asctime day is space-padded */
        "Sun Nov  6 08:49:37 94",           /* asctime year is four digits */
        "Sun Nov  6 08:49:37 1994 GMT",     /* asctime has no zone */
        "1994-11-06T08:49:37Z",             /* not an HTTP-date */
        "Sun, 06 Nov 1994 08:49:37 GMT\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (hub_retry_after_ms(bad[i], now) != -1) {
            fail_msg("accepted Retry-After \"%s\"", bad[i]);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_curve),
        cmocka_unit_test(test_bounds_every_step),
        cmocka_unit_test(test_exhaustion),
        cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_schedule_validation),
        cmocka_unit_test(test_unvalidated_steps_are_clamped),
        cmocka_unit_test(test_retry_after_seconds),
        cmocka_unit_test(test_retry_after_dates),
        cmocka_unit_test(test_retry_after_rfc850_year),
        cmocka_unit_test(test_retry_after_bad_dates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
