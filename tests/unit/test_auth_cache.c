/* auth_cache: hits within the TTL, misses after it or when off, what a
 * clear drops (lookups sent before it too), and a full table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "auth_cache.h"
#include "util.h"

#define MS 1000000ULL /* one millisecond in ns */

/* A key hash that differs from any other i. */
static void hash_of(unsigned i, unsigned char h[32]) {
    memset(h, 0, 32);
    memcpy(h, &i, sizeof(i));
    h[31] = 0x5a;
}

static struct hub_auth_entry entry(const char *tenant, double rate) {
    struct hub_auth_entry e;
    memset(&e, 0, sizeof(e));
    snprintf(e.tenant_id, sizeof(e.tenant_id), "%s", tenant);
    e.ingest_rate = rate;
    e.ingest_burst = rate;
    return e;
}

static void test_hit_within_the_ttl_only(void **state) {
    unsigned char h[32];
    struct hub_auth_entry e = entry("acme", 5.0), got;
    uint64_t t0 = hub_now_ns();
    (void)state;

    hub_auth_cache_clear();
    hash_of(1, h);
    t0 = hub_now_ns();
    hub_auth_cache_put(h, t0, 1000, &e);
    assert_int_equal(hub_auth_cache_get(h, t0 + 10 * MS, 1000, &got), 1);
    assert_string_equal(got.tenant_id, "acme");
    assert_true(got.ingest_rate == 5.0);
    /* a TTL counts from when the lookup STARTED */
    assert_int_equal(hub_auth_cache_get(h, t0 + 1000 * MS, 1000, &got), 0);
    /* and an expired entry is gone */
    assert_int_equal(hub_auth_cache_get(h, t0 + 10 * MS, 1000, &got), 0);
}

static void test_off_and_unknown_miss(void **state) {
    unsigned char h[32], other[32];
    struct hub_auth_entry e = entry("acme", 0.0), got;
    uint64_t t0;
    (void)state;

    hub_auth_cache_clear();
    hash_of(2, h);
    hash_of(3, other);
    t0 = hub_now_ns();
    hub_auth_cache_put(h, t0, 0, &e); /* off: nothing kept */
    assert_int_equal(hub_auth_cache_get(h, t0, 1000, &got), 0);
    hub_auth_cache_put(h, t0, 1000, &e);
    assert_int_equal(hub_auth_cache_get(h, t0, 0, &got), 0);
    assert_int_equal(hub_auth_cache_get(other, t0, 1000, &got), 0);
}

static void test_clear_drops_entries_and_older_lookups(void **state) {
    unsigned char h[32];
    struct hub_auth_entry e = entry("acme", 0.0), got;
    uint64_t before;
    (void)state;

    hub_auth_cache_clear();
    hash_of(4, h);
    before = hub_now_ns();
    hub_auth_cache_put(h, before, 1000, &e);
    hub_auth_cache_clear();
    assert_int_equal(hub_auth_cache_get(h, hub_now_ns(), 1000, &got), 0);
    /* a lookup sent before the clear answers after it: not kept */
    hub_auth_cache_put(h, before, 1000, &e);
    assert_int_equal(hub_auth_cache_get(h, hub_now_ns(), 1000, &got), 0);
    /* one sent after it is */
    hub_auth_cache_put(h, hub_now_ns(), 1000, &e);
    assert_int_equal(hub_auth_cache_get(h, hub_now_ns(), 1000, &got), 1);
}

static void test_full_table_keeps_working(void **state) {
    unsigned char h[32];
    struct hub_auth_entry e = entry("t", 0.0), got;
    uint64_t t0;
    (void)state;

    hub_auth_cache_clear();
    t0 = hub_now_ns();
    for (unsigned i = 0; i < 5000; i++) {
        hash_of(100 + i, h);
        hub_auth_cache_put(h, t0, 1000, &e);
        assert_int_equal(hub_auth_cache_get(h, t0, 1000, &got), 1);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hit_within_the_ttl_only),
        cmocka_unit_test(test_off_and_unknown_miss),
        cmocka_unit_test(test_clear_drops_entries_and_older_lookups),
        cmocka_unit_test(test_full_table_keeps_working),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
