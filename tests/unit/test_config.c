/*
 * Unit tests: duration/size parsing and configuration errors (SPEC §2.2).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config.h"

static void test_duration_units(void **state) {
    int64_t ms = -1;
    (void)state;
    assert_int_equal(hub_duration_parse("500ms", &ms), 0);
    assert_int_equal(ms, 500);
    assert_int_equal(hub_duration_parse("30s", &ms), 0);
    assert_int_equal(ms, 30000);
    assert_int_equal(hub_duration_parse("2m", &ms), 0);
    assert_int_equal(ms, 120000);
    assert_int_equal(hub_duration_parse("120h", &ms), 0);
    assert_int_equal(ms, 120LL * 3600 * 1000);
    assert_int_equal(hub_duration_parse("1h30m", &ms), 0);
    assert_int_equal(ms, 90LL * 60 * 1000);
    assert_int_equal(hub_duration_parse("1m30s250ms", &ms), 0);
    assert_int_equal(ms, 90250);
    assert_int_equal(hub_duration_parse("0s", &ms), 0);
    assert_int_equal(ms, 0);
}

static void test_duration_malformed(void **state) {
    static const char *const bad[] = {"",    "10",   "s",   "1x",  "-1s", "1.5s", " 1s",
                                      "1s ", "1hh",  "m1",  "1m-", "1 s", "ms",
                                      "99999999999999999999h"};
    int64_t ms = 42;
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(hub_duration_parse(bad[i], &ms), -1);
    }
    assert_int_equal(ms, 42); /* untouched on error */
    assert_int_equal(hub_duration_parse(NULL, &ms), -1);
}

static void test_duration_list(void **state) {
    int64_t out[12];
    (void)state;
    assert_int_equal(hub_duration_list_parse("1m,5m,15m,1h,3h,6h,8h,10h", out, 12), 8);
    assert_int_equal(out[0], 60000);
    assert_int_equal(out[7], 36000000);
    assert_int_equal(hub_duration_list_parse("10s, 1m", out, 12), 2);
    assert_int_equal(out[1], 60000);
    assert_int_equal(hub_duration_list_parse("1s,,2s", out, 12), -1);
    assert_int_equal(hub_duration_list_parse("1s,2s,", out, 12), -1);
    assert_int_equal(hub_duration_list_parse("1s,2s,3s", out, 2), -1);
}

static void test_size(void **state) {
    int64_t b;
    (void)state;
    assert_int_equal(hub_size_parse("64MiB", &b), 0);
    assert_int_equal(b, 64LL << 20);
    assert_int_equal(hub_size_parse("1048576", &b), 0);
    assert_int_equal(b, 1048576);
    assert_int_equal(hub_size_parse("2KB", &b), 0);
    assert_int_equal(b, 2000);
    assert_int_equal(hub_size_parse("12XB", &b), -1);
    assert_int_equal(hub_size_parse("MiB", &b), -1);
}

static void clear_env(void) {
    unsetenv("STREAMING_HUB_DISPATCH_LEASE");
    unsetenv("STREAMING_HUB_DISPATCH_WORKERS");
    unsetenv("STREAMING_HUB_RETRY_SCHEDULE");
    unsetenv("STREAMING_HUB_ENV");
    unsetenv("STREAMING_HUB_ROLE");
    unsetenv("STREAMING_HUB_AUTODISABLE_ENABLED");
    unsetenv("STREAMING_HUB_BREAKER_FAILURE_RATIO");
    unsetenv("STREAMING_HUB_KAFKA_BROKERS");
    unsetenv("STREAMING_HUB_KAFKA_FETCH_WAIT");
}

static void test_defaults(void **state) {
    struct hub_config cfg = {0};
    char err[256] = "";
    (void)state;
    clear_env();
    assert_int_equal(hub_config_load(&cfg, err, sizeof(err)), 0);
    assert_string_equal(cfg.kafka_brokers, "embedded");
    assert_string_equal(cfg.kafka_topics, "^lerian\\.streaming\\..+");
    assert_string_equal(cfg.http_listen_addr, "127.0.0.1:8080");
    assert_int_equal(cfg.dispatch_workers, 256);
    assert_int_equal(cfg.dispatch_lease_ms, 60000);
    assert_int_equal(cfg.retry_schedule_len, 8);
    assert_int_equal(cfg.retry_schedule_ms[7], 10LL * 3600 * 1000);
    assert_int_equal(cfg.policy_memory_bytes, 64LL << 20);
    assert_int_equal(cfg.max_event_bytes, 1048576);
    assert_int_equal(cfg.autodisable_enabled, 1);
    assert_int_equal(cfg.allow_private_sinks, 0);
    assert_true(cfg.breaker_failure_ratio > 0.49 && cfg.breaker_failure_ratio < 0.51);
    hub_config_free(&cfg);
}

/* Tests shorten the tunables (SPEC §2.2): a retention of seconds is taken. */
static void test_short_retention(void **state) {
    struct hub_config cfg = {0};
    char err[256] = "";
    (void)state;
    clear_env();
    setenv("STREAMING_HUB_EVENT_RETENTION", "10s", 1);
    assert_int_equal(hub_config_load(&cfg, err, sizeof(err)), 0);
    assert_int_equal(cfg.event_retention_ms, 10000);
    hub_config_free(&cfg);
    unsetenv("STREAMING_HUB_EVENT_RETENTION");
}

/* A malformed value stops start-up with one line naming the variable. */
static void expect_error(const char *name, const char *value, const char *needle) {
    struct hub_config cfg = {0};
    char err[256] = "";
    clear_env();
    setenv(name, value, 1);
    assert_int_equal(hub_config_load(&cfg, err, sizeof(err)), -1);
    assert_non_null(strstr(err, name));
    if (needle) {
        assert_non_null(strstr(err, needle));
    }
    assert_null(strchr(err, '\n'));
    hub_config_free(&cfg);
    unsetenv(name);
}

static void test_errors_name_the_variable(void **state) {
    (void)state;
    expect_error("STREAMING_HUB_DISPATCH_LEASE", "sixty", "duration");
    expect_error("STREAMING_HUB_DISPATCH_LEASE", "60", "duration");
    expect_error("STREAMING_HUB_DISPATCH_WORKERS", "8x", "integer");
    expect_error("STREAMING_HUB_DISPATCH_WORKERS", "0", "range");
    expect_error("STREAMING_HUB_RETRY_SCHEDULE", "1m,11h", "outside");
    expect_error("STREAMING_HUB_RETRY_SCHEDULE", "1m,2m,3m,4m,5m,6m,7m,8m,9m,10m,11m,12m,13m",
                 NULL);
    expect_error("STREAMING_HUB_ROLE", "everything", "all|ingest|delivery");
    expect_error("STREAMING_HUB_AUTODISABLE_ENABLED", "maybe", "boolean");
    expect_error("STREAMING_HUB_BREAKER_FAILURE_RATIO", "1.5", NULL);
    /* the breaker takes durations up to 30 days: past that the dispatcher
     * did not start, with "out of memory" and no variable named */
    expect_error("STREAMING_HUB_BREAKER_WINDOW", "31d", "range");
    expect_error("STREAMING_HUB_BREAKER_OPEN_MAX", "31d", "range");
}

static void test_production_requirements(void **state) {
    struct hub_config cfg = {0};
    char err[256] = "";
    (void)state;
    clear_env();
    setenv("STREAMING_HUB_ENV", "production", 1);
    unsetenv("STREAMING_HUB_KEK");
    assert_int_equal(hub_config_load(&cfg, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "STREAMING_HUB_KEK"));
    hub_config_free(&cfg);
    unsetenv("STREAMING_HUB_ENV");
}

static void test_valid_overrides(void **state) {
    struct hub_config cfg = {0};
    char err[256] = "";
    (void)state;
    clear_env();
    setenv("STREAMING_HUB_DISPATCH_LEASE", "1m30s", 1);
    setenv("STREAMING_HUB_RETRY_SCHEDULE", "10s,1m", 1);
    setenv("STREAMING_HUB_ROLE", "ingest", 1);
    assert_int_equal(hub_config_load(&cfg, err, sizeof(err)), 0);
    assert_int_equal(cfg.dispatch_lease_ms, 90000);
    assert_int_equal(cfg.retry_schedule_len, 2);
    assert_int_equal(cfg.retry_schedule_ms[0], 10000);
    assert_string_equal(cfg.role, "ingest");
    hub_config_free(&cfg);
    clear_env();
}

/* A default that depends on the mode: KAFKA_FETCH_WAIT with the mock. */
static void test_embedded_defaults(void **state) {
    struct hub_config cfg = {0};
    char err[256] = "";
    (void)state;
    clear_env();
    assert_int_equal(hub_config_load(&cfg, err, sizeof(err)), 0);
    assert_int_equal(cfg.kafka_fetch_wait_ms, 2); /* embedded by default */
    hub_config_free(&cfg);
    memset(&cfg, 0, sizeof(cfg));
    setenv("STREAMING_HUB_KAFKA_BROKERS", "kafka-1:9092", 1);
    assert_int_equal(hub_config_load(&cfg, err, sizeof(err)), 0);
    assert_int_equal(cfg.kafka_fetch_wait_ms, 10);
    hub_config_free(&cfg);
    memset(&cfg, 0, sizeof(cfg));
    unsetenv("STREAMING_HUB_KAFKA_BROKERS");
    setenv("STREAMING_HUB_KAFKA_FETCH_WAIT", "25ms", 1); /* set wins in either mode */
    assert_int_equal(hub_config_load(&cfg, err, sizeof(err)), 0);
    assert_int_equal(cfg.kafka_fetch_wait_ms, 25);
    hub_config_free(&cfg);
    clear_env();
}

/* The pull, per-tenant figures and membership tunables: defaults, and a
 * member timeout that must exceed the heartbeat (else a live process would
 * look gone between two of its heartbeats). */
static void test_pull_stats_cluster(void **state) {
    struct hub_config cfg = {0};
    char err[256] = "";
    (void)state;
    clear_env();
    assert_int_equal(hub_config_load(&cfg, err, sizeof(err)), 0);
    assert_int_equal(cfg.pull_page_bytes, 8LL << 20);
    assert_int_equal(cfg.pull_hold_max_ms, 2000);
    assert_int_equal(cfg.stats_retention_ms, 90LL * 24 * 3600 * 1000);
    assert_int_equal(cfg.stats_flush_ms, 1000);
    assert_int_equal(cfg.cluster_heartbeat_ms, 1000);
    assert_int_equal(cfg.cluster_member_timeout_ms, 3000);
    hub_config_free(&cfg);
    memset(&cfg, 0, sizeof(cfg));
    setenv("STREAMING_HUB_CLUSTER_MEMBER_TIMEOUT", "1s", 1);
    assert_int_equal(hub_config_load(&cfg, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "STREAMING_HUB_CLUSTER_MEMBER_TIMEOUT"));
    hub_config_free(&cfg);
    unsetenv("STREAMING_HUB_CLUSTER_MEMBER_TIMEOUT");
    expect_error("STREAMING_HUB_PULL_PAGE_BYTES", "1KiB", NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_duration_units),
        cmocka_unit_test(test_duration_malformed),
        cmocka_unit_test(test_duration_list),
        cmocka_unit_test(test_size),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_short_retention),
        cmocka_unit_test(test_errors_name_the_variable),
        cmocka_unit_test(test_production_requirements),
        cmocka_unit_test(test_valid_overrides),
        cmocka_unit_test(test_embedded_defaults),
        cmocka_unit_test(test_pull_stats_cluster),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
