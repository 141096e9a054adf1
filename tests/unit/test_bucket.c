/* bucket: admission, refill, burst, debt after a large charge, many keys. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "bucket.h"

#define S 1000000000ULL /* one second in ns */

static void test_burst_then_rate(void **state) {
    struct hub_buckets *t = NULL;
    uint64_t now = 5 * S;
    (void)state;

    /* a new bucket starts full: the burst passes at once, the next waits */
    for (int i = 0; i < 3; i++) {
        assert_true(hub_bucket_take(&t, "acme", 2.0, 3.0, 1.0, now) == 0.0);
    }
    double wait = hub_bucket_take(&t, "acme", 2.0, 3.0, 1.0, now);
    assert_true(wait > 0.49 && wait < 0.51);
    /* half a second later one token is back, and only one */
    now += S / 2;
    assert_true(hub_bucket_take(&t, "acme", 2.0, 3.0, 1.0, now) == 0.0);
    assert_true(hub_bucket_take(&t, "acme", 2.0, 3.0, 1.0, now) > 0.0);
    /* another key has a bucket of its own */
    assert_true(hub_bucket_take(&t, "other", 2.0, 3.0, 1.0, now) == 0.0);
    /* refill never passes the burst */
    now += 100 * S;
    for (int i = 0; i < 3; i++) {
        assert_true(hub_bucket_take(&t, "acme", 2.0, 3.0, 1.0, now) == 0.0);
    }
    assert_true(hub_bucket_take(&t, "acme", 2.0, 3.0, 1.0, now) > 0.0);
    hub_buckets_free(&t);
    assert_null(t);
}

/* A charge larger than the burst is admitted once and leaves a debt that
 * the following charges wait out. */
static void test_debt(void **state) {
    struct hub_buckets *t = NULL;
    uint64_t now = S;
    (void)state;

    assert_true(hub_bucket_take(&t, "k", 1.0, 3.0, 5.0, now) == 0.0);
    double wait = hub_bucket_take(&t, "k", 1.0, 3.0, 1.0, now);
    assert_true(wait > 2.99 && wait < 3.01); /* tokens at -2: three seconds to one */
    hub_buckets_free(&t);
}

/* Refusals of the queued take are spread a token apart: at 2/s, three
 * refused at once wait 0.5, 1 and 1.5 s; the first back takes its token,
 * and one refused then queues after the third. */
static void test_queued(void **state) {
    struct hub_buckets *t = NULL;
    uint64_t now = S;
    double w[3];
    (void)state;

    assert_true(hub_bucket_take_queued(&t, "k", 2.0, 1.0, now) == 0.0);
    for (int i = 0; i < 3; i++) {
        w[i] = hub_bucket_take_queued(&t, "k", 2.0, 1.0, now);
        assert_true(w[i] > 0.5 * (i + 1) - 0.01 && w[i] < 0.5 * (i + 1) + 0.01);
    }
    now += S / 2;
    assert_true(hub_bucket_take_queued(&t, "k", 2.0, 1.0, now) == 0.0);
    double late = hub_bucket_take_queued(&t, "k", 2.0, 1.0, now);
    assert_true(late > 1.49 && late < 1.51); /* at 2.0 s: after the third's 1.5 s */
    hub_buckets_free(&t);
}

/* Thousands of keys: each keeps its own state through growth and sweeps. */
static void test_many_keys(void **state) {
    struct hub_buckets *t = NULL;
    char key[32];
    uint64_t now = S;
    (void)state;

    for (int i = 0; i < 20000; i++) {
        snprintf(key, sizeof(key), "sub-%d", i);
        assert_true(hub_bucket_take(&t, key, 1.0, 1.0, 1.0, now) == 0.0);
    }
    for (int i = 0; i < 20000; i += 997) {
        snprintf(key, sizeof(key), "sub-%d", i);
        assert_true(hub_bucket_take(&t, key, 1.0, 1.0, 1.0, now) > 0.0);
    }
    hub_buckets_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_burst_then_rate),
        cmocka_unit_test(test_debt),
        cmocka_unit_test(test_queued),
        cmocka_unit_test(test_many_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
