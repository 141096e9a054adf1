/*
 * Unit tests of the circuit breaker (SPEC §7.6): tripping by consecutive
 * failures and by failure ratio over the sliding window, shedding with a
 * retry time, exactly one half-open probe, closing and re-opening with the
 * doubling open time, independence of (tenant, origin) pairs, the admin
 * listing, and bounded memory.
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

#include "breaker.h"

#define SEC 1000LL
#define T0 (1000 * SEC) /* an arbitrary monotonic start */
#define ORIGIN "https://hooks.example.com:443"

static struct hub_breakers *new_default(void) {
    struct hub_breakers *b = hub_breakers_new(NULL);
    assert_non_null(b);
    return b;
}

static enum hub_breaker_verdict check(struct hub_breakers *b, const char *tenant, int64_t now,
                                      int64_t *retry_at) {
    return hub_breaker_check(b, tenant, ORIGIN, now, retry_at);
}

static void fail_n(struct hub_breakers *b, const char *tenant, int n, int64_t now) {
    for (int i = 0; i < n; i++) {
        hub_breaker_report(b, tenant, ORIGIN, 0, 0, now);
    }
}

/* Trips the acme breaker at `now` with 5 failures; asserts it is open. */
static void trip_at(struct hub_breakers *b, int64_t now) {
    int64_t at = 0;
    fail_n(b, "acme", 5, now);
    assert_int_equal(check(b, "acme", now, &at), HUB_BREAKER_SHED);
}

static void test_consecutive_failures(void **state) {
    (void)state;
    struct hub_breakers *b = new_default();
    int64_t at = 0;

    /* unknown pair: closed */
    assert_int_equal(check(b, "acme", T0, &at), HUB_BREAKER_ALLOW);
    assert_int_equal(at, T0);

    /* 4 failures then a success: the streak resets */
    fail_n(b, "acme", 4, T0);
    assert_int_equal(check(b, "acme", T0, NULL), HUB_BREAKER_ALLOW);
    hub_breaker_report(b, "acme", ORIGIN, 1, 0, T0 + 1);
    fail_n(b, "acme", 4, T0 + 2);
    assert_int_equal(check(b, "acme", T0 + 2, NULL), HUB_BREAKER_ALLOW);
    assert_int_equal(hub_breakers_open_count(b, T0 + 2), 0);

    /* the 5th in a row trips it */
    hub_breaker_report(b, "acme", ORIGIN, 0, 0, T0 + 3);
    assert_int_equal(check(b, "acme", T0 + 4, &at), HUB_BREAKER_SHED);
    assert_int_equal(at, T0 + 3 + 30 * SEC);
    assert_int_equal(hub_breakers_open_count(b, T0 + 4), 1);
    hub_breakers_free(b);
}

/* Reports `pairs` (failure, success) pairs one second apart from t;
 * fail_first chooses the order inside each pair.  Returns the next time. */
static int64_t interleave(struct hub_breakers *b, int pairs, int fail_first, int64_t t) {
    for (int i = 0; i < pairs; i++) {
        hub_breaker_report(b, "acme", ORIGIN, !fail_first, 0, t);
        t += SEC;
        hub_breaker_report(b, "acme", ORIGIN, fail_first, 0, t);
        t += SEC;
    }
    return t;
}

static void test_ratio_trips_at_min_attempts(void **state) {
    (void)state;
    for (int fail_first = 0; fail_first <= 1; fail_first++) {
        struct hub_breakers *b = new_default();
        /* 19 attempts, 50% failed: below min_attempts, still closed */
        int64_t t = interleave(b, 9, fail_first, T0);
        hub_breaker_report(b, "acme", ORIGIN, !fail_first, 0, t);
        assert_int_equal(check(b, "acme", t, NULL), HUB_BREAKER_ALLOW);
        /* the 20th attempt (a success when fail_first) reaches 10/20 = 0.5 */
        t += SEC;
        hub_breaker_report(b, "acme", ORIGIN, fail_first, 0, t);
        assert_int_equal(check(b, "acme", t, NULL), HUB_BREAKER_SHED);
        hub_breakers_free(b);
    }
}

static void test_ratio_threshold(void **state) {
    (void)state;
    struct hub_breakers *b = new_default();
    int64_t t = T0;

    /* 9 failures, 11 successes, never 2 failures in a row: 0.45 */
    for (int i = 0; i < 20; i++, t += SEC) {
        hub_breaker_report(b, "acme", ORIGIN, i % 2 == 1 || i >= 18, 0, t);
    }
    assert_int_equal(check(b, "acme", t, NULL), HUB_BREAKER_ALLOW);
    hub_breaker_report(b, "acme", ORIGIN, 0, 0, t); /* 10/21 < 0.5 */
    assert_int_equal(check(b, "acme", t, NULL), HUB_BREAKER_ALLOW);
    hub_breaker_report(b, "acme", ORIGIN, 1, 0, t);
    hub_breaker_report(b, "acme", ORIGIN, 0, 0, t); /* 11/23 < 0.5 */
    assert_int_equal(check(b, "acme", t, NULL), HUB_BREAKER_ALLOW);
    hub_breaker_report(b, "acme", ORIGIN, 0, 0, t); /* 12/24 = 0.5 */
    assert_int_equal(check(b, "acme", t, NULL), HUB_BREAKER_SHED);
    hub_breakers_free(b);
}

static void test_ratio_window_slides(void **state) {
    (void)state;
    struct hub_breakers *b = new_default();

    /* 10 attempts, half failed, then a pause longer than the 60 s window */
    interleave(b, 5, 1, T0);
    /* 10 more of the same much later: only 10 attempts are in the window */
    int64_t t = interleave(b, 5, 1, T0 + 100 * SEC);
    assert_int_equal(check(b, "acme", t, NULL), HUB_BREAKER_ALLOW);
    /* 10 more within the window: 20 attempts, 10 failed */
    t = interleave(b, 5, 1, t);
    assert_int_equal(check(b, "acme", t, NULL), HUB_BREAKER_SHED);
    hub_breakers_free(b);

    /* the same 20 attempts spread over 80 s never reach 20 within 60 s */
    b = new_default();
    t = T0;
    for (int i = 0; i < 20; i++, t += 4 * SEC) {
        hub_breaker_report(b, "acme", ORIGIN, i % 2, 0, t);
    }
    assert_int_equal(check(b, "acme", t, NULL), HUB_BREAKER_ALLOW);
    hub_breakers_free(b);
}

static void test_shed_while_open(void **state) {
    (void)state;
    struct hub_breakers *b = new_default();
    int64_t at = 0;

    trip_at(b, T0);
    for (int64_t t = T0; t < T0 + 30 * SEC; t += 999) {
        at = 0;
        assert_int_equal(check(b, "acme", t, &at), HUB_BREAKER_SHED);
        assert_int_equal(at, T0 + 30 * SEC);
    }
    assert_int_equal(check(b, "acme", T0 + 30 * SEC - 1, &at), HUB_BREAKER_SHED);
    hub_breakers_free(b);
}

static void test_exactly_one_probe(void **state) {
    (void)state;
    struct hub_breakers *b = new_default();
    int64_t at = 0, t = T0 + 30 * SEC;

    trip_at(b, T0);
    assert_int_equal(check(b, "acme", t, &at), HUB_BREAKER_PROBE);
    assert_int_equal(at, t);
    /* while the probe is in flight everything else is shed, to a later time */
    for (int i = 0; i < 100; i++) {
        assert_int_equal(check(b, "acme", t + i * 100, &at), HUB_BREAKER_SHED);
        assert_true(at > t + i * 100);
    }
    /* a slow probe never yields a retry time in the past */
    assert_int_equal(check(b, "acme", t + 45 * SEC, &at), HUB_BREAKER_SHED);
    assert_true(at > t + 45 * SEC);
    hub_breakers_free(b);
}

static void test_probe_success_closes(void **state) {
    (void)state;
    struct hub_breakers *b = new_default();
    int64_t at = 0, t = T0 + 30 * SEC;

    trip_at(b, T0);
    assert_int_equal(check(b, "acme", t, NULL), HUB_BREAKER_PROBE);
    hub_breaker_report(b, "acme", ORIGIN, 1, 1, t + 200);
    assert_int_equal(check(b, "acme", t + 201, NULL), HUB_BREAKER_ALLOW);
    assert_int_equal(check(b, "acme", t + 202, NULL), HUB_BREAKER_ALLOW);
    assert_int_equal(hub_breakers_open_count(b, t + 202), 0);
    assert_int_equal(hub_breakers_list(b, t + 202, NULL, NULL), 0);

    /* closing starts afresh: 4 failures do not trip, the 5th does, for the base 30 s */
    fail_n(b, "acme", 4, t + 300);
    assert_int_equal(check(b, "acme", t + 300, NULL), HUB_BREAKER_ALLOW);
    hub_breaker_report(b, "acme", ORIGIN, 0, 0, t + 400);
    assert_int_equal(check(b, "acme", t + 400, &at), HUB_BREAKER_SHED);
    assert_int_equal(at, t + 400 + 30 * SEC);
    hub_breakers_free(b);
}

static void test_close_forgets_the_window(void **state) {
    (void)state;
    struct hub_breakers *b = new_default();

    /* trip by ratio: 20 attempts, 10 failed, within 20 s */
    int64_t t = interleave(b, 10, 1, T0);
    assert_int_equal(check(b, "acme", t, NULL), HUB_BREAKER_SHED);
    /* the probe succeeds while those 20 attempts are still inside the window */
    t += 30 * SEC;
    assert_int_equal(check(b, "acme", t, NULL), HUB_BREAKER_PROBE);
    hub_breaker_report(b, "acme", ORIGIN, 1, 1, t);
    /* one failure after closing is 1 of 1, not 11 of 22 */
    hub_breaker_report(b, "acme", ORIGIN, 0, 0, t + 1);
    assert_int_equal(check(b, "acme", t + 2, NULL), HUB_BREAKER_ALLOW);
    hub_breakers_free(b);
}

static void test_probe_failure_doubles_up_to_max(void **state) {
    (void)state;
    struct hub_breakers *b = new_default();
    /* 30s, then 60s, 120s, 240s, 480s, capped at 600s */
    static const int64_t open_s[] = {30, 60, 120, 240, 480, 600, 600};
    int64_t t = T0, at = 0;

    trip_at(b, t);
    for (size_t i = 0; i < sizeof(open_s) / sizeof(open_s[0]); i++) {
        /* still shed 1 ms before the open time is over */
        assert_int_equal(check(b, "acme", t + open_s[i] * SEC - 1, &at), HUB_BREAKER_SHED);
        assert_int_equal(at, t + open_s[i] * SEC);
        t += open_s[i] * SEC;
        assert_int_equal(check(b, "acme", t, NULL), HUB_BREAKER_PROBE);
        t += 500; /* the probe takes 500 ms and fails */
        hub_breaker_report(b, "acme", ORIGIN, 0, 1, t);
    }
    /* a success resets the open time to 30 s for the next trip */
    t += 600 * SEC;
    assert_int_equal(check(b, "acme", t, NULL), HUB_BREAKER_PROBE);
    hub_breaker_report(b, "acme", ORIGIN, 1, 1, t);
    trip_at(b, t);
    assert_int_equal(check(b, "acme", t, &at), HUB_BREAKER_SHED);
    assert_int_equal(at, t + 30 * SEC);
    hub_breakers_free(b);
}

static void test_lost_probe_is_replaced(void **state) {
    (void)state;
    struct hub_breakers *b = new_default();
    int64_t t = T0 + 30 * SEC;

    trip_at(b, T0);
    assert_int_equal(check(b, "acme", t, NULL), HUB_BREAKER_PROBE);
    /* the probe never reports (its worker died) */
    assert_int_equal(check(b, "acme", t + 600 * SEC - 1, NULL), HUB_BREAKER_SHED);
    assert_int_equal(check(b, "acme", t + 600 * SEC, NULL), HUB_BREAKER_PROBE);
    assert_int_equal(check(b, "acme", t + 600 * SEC + 1, NULL), HUB_BREAKER_SHED);
    hub_breakers_free(b);
}

static void test_released_probe(void **state) {
    (void)state;
    struct hub_breakers *b = new_default();
    int64_t at = 0, t = T0 + 30 * SEC;

    trip_at(b, T0);
    assert_int_equal(check(b, "acme", t, NULL), HUB_BREAKER_PROBE);
    /* the probe failed before reaching the destination: the next due job
     * probes at once, and the open time did not double */
    hub_breaker_release(b, "acme", ORIGIN, t + 5);
    assert_int_equal(hub_breakers_open_count(b, t + 5), 1);
    assert_int_equal(check(b, "acme", t + 6, NULL), HUB_BREAKER_PROBE);
    assert_int_equal(check(b, "acme", t + 7, NULL), HUB_BREAKER_SHED);
    hub_breaker_report(b, "acme", ORIGIN, 0, 1, t + 8);
    assert_int_equal(check(b, "acme", t + 9, &at), HUB_BREAKER_SHED);
    assert_int_equal(at, t + 8 + 60 * SEC);
    /* releasing a closed, an open or an unknown pair changes nothing */
    hub_breaker_release(b, "acme", ORIGIN, t + 10);
    assert_int_equal(check(b, "acme", t + 11, &at), HUB_BREAKER_SHED);
    assert_int_equal(at, t + 8 + 60 * SEC);
    hub_breaker_release(b, "nobody", ORIGIN, t + 10);
    assert_int_equal(check(b, "nobody", t + 11, NULL), HUB_BREAKER_ALLOW);
    hub_breakers_free(b);
}

static void test_straggler_reports_while_open(void **state) {
    (void)state;
    struct hub_breakers *b = new_default();
    int64_t at = 0;

    trip_at(b, T0);
    /* attempts that started before the trip finish after it: no effect on state */
    hub_breaker_report(b, "acme", ORIGIN, 1, 0, T0 + SEC);
    hub_breaker_report(b, "acme", ORIGIN, 0, 0, T0 + 2 * SEC);
    assert_int_equal(check(b, "acme", T0 + 3 * SEC, &at), HUB_BREAKER_SHED);
    assert_int_equal(at, T0 + 30 * SEC);
    hub_breakers_free(b);
}

static void test_pairs_are_independent(void **state) {
    (void)state;
    struct hub_breakers *b = new_default();

    trip_at(b, T0);
    /* another tenant, same origin */
    assert_int_equal(check(b, "globex", T0, NULL), HUB_BREAKER_ALLOW);
    /* same tenant, another origin */
    assert_int_equal(hub_breaker_check(b, "acme", "https://other.example.com:443", T0, NULL),
                     HUB_BREAKER_ALLOW);
    /* the key is the pair, not the concatenation */
    fail_n(b, "ab", 5, T0);
    assert_int_equal(check(b, "ab", T0, NULL), HUB_BREAKER_SHED);
    hub_breaker_report(b, "a", "b" ORIGIN, 0, 0, T0);
    assert_int_equal(hub_breaker_check(b, "a", "b" ORIGIN, T0, NULL), HUB_BREAKER_ALLOW);
    /* failures of another pair do not reset this one's streak */
    fail_n(b, "globex", 4, T0);
    hub_breaker_report(b, "initech", ORIGIN, 1, 0, T0);
    hub_breaker_report(b, "globex", ORIGIN, 0, 0, T0);
    assert_int_equal(check(b, "globex", T0, NULL), HUB_BREAKER_SHED);
    hub_breakers_free(b);
}

static void test_many_pairs(void **state) {
    (void)state;
    struct hub_breakers *b = new_default();
    char tenant[32];

    /* enough pairs to grow the table several times */
    for (int i = 0; i < 3000; i++) {
        snprintf(tenant, sizeof(tenant), "tenant-%d", i);
        hub_breaker_report(b, tenant, ORIGIN, i != 1234, 0, T0);
    }
    fail_n(b, "tenant-1234", 4, T0);
    for (int i = 0; i < 3000; i++) {
        snprintf(tenant, sizeof(tenant), "tenant-%d", i);
        assert_int_equal(check(b, tenant, T0, NULL),
                         i == 1234 ? HUB_BREAKER_SHED : HUB_BREAKER_ALLOW);
    }
    assert_int_equal(hub_breakers_open_count(b, T0), 1);
    hub_breakers_free(b);
}

struct listed {
    int n;
    char tenant[4][32];
    char origin[4][64];
    char state[4][16];
    int64_t opened_at[4], retry_at[4];
    int consecutive[4];
};

static void collect(void *arg, const char *tenant, const char *origin, const char *st,
                    int64_t opened_at_ms, int64_t retry_at_ms, int consecutive_failures) {
    struct listed *l = arg;
    assert_true(l->n < 4);
    snprintf(l->tenant[l->n], sizeof(l->tenant[0]), "%s", tenant);
    snprintf(l->origin[l->n], sizeof(l->origin[0]), "%s", origin);
    snprintf(l->state[l->n], sizeof(l->state[0]), "%s", st);
    l->opened_at[l->n] = opened_at_ms;
    l->retry_at[l->n] = retry_at_ms;
    l->consecutive[l->n] = consecutive_failures;
    l->n++;
}

static void test_listing(void **state) {
    (void)state;
    struct hub_breakers *b = new_default();
    struct listed l;

    trip_at(b, T0);                   /* acme: open */
    fail_n(b, "globex", 5, T0 + SEC); /* globex: open, then probing */
    assert_int_equal(check(b, "globex", T0 + 31 * SEC, NULL), HUB_BREAKER_PROBE);
    hub_breaker_report(b, "initech", ORIGIN, 0, 0, T0); /* initech: closed */

    memset(&l, 0, sizeof(l));
    assert_int_equal(hub_breakers_list(b, T0 + 31 * SEC, collect, &l), 2);
    assert_int_equal(l.n, 2);
    int a = strcmp(l.tenant[0], "acme") == 0 ? 0 : 1, g = 1 - a;
    assert_string_equal(l.tenant[a], "acme");
    assert_string_equal(l.origin[a], ORIGIN);
    assert_string_equal(l.state[a], "open");
    assert_int_equal(l.opened_at[a], T0);
    assert_int_equal(l.retry_at[a], T0 + 30 * SEC);
    assert_int_equal(l.consecutive[a], 5);
    assert_string_equal(l.tenant[g], "globex");
    assert_string_equal(l.state[g], "half_open");
    assert_int_equal(l.opened_at[g], T0 + SEC);
    assert_int_equal(l.consecutive[g], 5);
    assert_int_equal(hub_breakers_open_count(b, T0 + 31 * SEC), 2);

    /* the probe succeeds: only acme is left */
    hub_breaker_report(b, "globex", ORIGIN, 1, 1, T0 + 32 * SEC);
    memset(&l, 0, sizeof(l));
    assert_int_equal(hub_breakers_list(b, T0 + 32 * SEC, collect, &l), 1);
    assert_string_equal(l.tenant[0], "acme");
    hub_breakers_free(b);
}

/* The open list the fast path reads (hub_breakers_each_open): only open and
 * half-open breakers given a tag, a tenant's side by side whatever order
 * they opened in, at most per_tenant of each, with the tags kept; a breaker
 * that closes leaves it. */
struct open_seen {
    int n;
    char tenant[16][16];
    int64_t tag[16];
};

static void open_collect(void *arg, const char *tenant, const char *origin, int64_t tag) {
    struct open_seen *s = arg;
    (void)origin;
    snprintf(s->tenant[s->n], sizeof(s->tenant[0]), "%s", tenant);
    s->tag[s->n++] = tag;
}

static void test_open_list(void **state) {
    (void)state;
    struct hub_breakers *b = new_default();
    const char *origins[4] = {"http://a:1", "http://b:1", "http://c:1", "http://d:1"};
    struct open_seen s;

    /* acme opens two, globex one, acme two more, initech stays closed */
    for (int i = 0; i < 4; i++) {
        const char *tenant = i == 2 ? "globex" : "acme";
        for (int k = 0; k < 5; k++) {
            hub_breaker_report(b, tenant, origins[i], 0, 0, T0);
        }
        hub_breaker_tag(b, tenant, origins[i], 100 + i);
    }
    for (int k = 0; k < 5; k++) {
        hub_breaker_report(b, "acme", "http://e:1", 0, 0, T0); /* never tagged */
    }
    hub_breaker_report(b, "initech", ORIGIN, 0, 0, T0);
    hub_breaker_tag(b, "nobody", ORIGIN, 7); /* no breaker: nothing */

    memset(&s, 0, sizeof(s));
    assert_int_equal(hub_breakers_each_open(b, 16, open_collect, &s), 4); /* not the untagged */
    for (int i = 1, runs = 1; i < s.n; i++) {
        runs += strcmp(s.tenant[i], s.tenant[i - 1]) != 0;
        assert_true(runs <= 2); /* acme's three together, globex's one */
    }
    memset(&s, 0, sizeof(s));
    assert_int_equal(hub_breakers_each_open(b, 2, open_collect, &s), 3);
    for (int i = 0, acme = 0; i < s.n; i++) {
        acme += strcmp(s.tenant[i], "acme") == 0;
        assert_true(acme <= 2);
        if (strcmp(s.tenant[i], "globex") == 0) {
            assert_int_equal(s.tag[i], 102);
        }
    }
    /* globex's probe succeeds: it closes and leaves the list */
    assert_int_equal(hub_breaker_check(b, "globex", origins[2], T0 + 31 * SEC, NULL),
                     HUB_BREAKER_PROBE);
    hub_breaker_report(b, "globex", origins[2], 1, 1, T0 + 31 * SEC);
    memset(&s, 0, sizeof(s));
    assert_int_equal(hub_breakers_each_open(b, 16, open_collect, &s), 3);
    for (int i = 0; i < s.n; i++) {
        assert_string_equal(s.tenant[i], "acme");
        assert_true(s.tag[i] >= 100 && s.tag[i] <= 103);
    }
    hub_breakers_free(b);
}

/* The walk visits about per_tenant of each tenant's open breakers, not all
 * of them: the fast path runs it for every ingest transaction, and one
 * tenant with thousands of broken destinations made each walk thousands of
 * nodes long.  Closing a tenant's first open breaker keeps the rest
 * listed. */
static void count_open(void *arg, const char *tenant, const char *origin, int64_t tag) {
    (void)tenant;
    (void)origin;
    (void)tag;
    (*(int *)arg)++;
}

static void test_open_walk_is_per_tenant(void **state) {
    (void)state;
    struct hub_breakers *b = new_default();
    char origin[64];
    struct timespec t0, t1;
    double ms;
    int n = 0;

    for (int i = 0; i < 5000; i++) {
        snprintf(origin, sizeof(origin), "http://a%d:1", i);
        for (int k = 0; k < 5; k++) {
            hub_breaker_report(b, "acme", origin, 0, 0, T0);
        }
        /* origin ids are any 64-bit value but 0 (half are negative): a
         * negative one was taken for no tag, and never blocked */
        hub_breaker_tag(b, "acme", origin, -(i + 1));
    }
    for (int k = 0; k < 5; k++) {
        hub_breaker_report(b, "globex", ORIGIN, 0, 0, T0);
    }
    hub_breaker_tag(b, "globex", ORIGIN, 9);
    assert_int_equal(hub_breakers_each_open(b, 8, count_open, &n), 9);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < 1000; r++) {
        hub_breakers_each_open(b, 8, count_open, &n);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    print_message("breaker: 1,000 walks beside 5,000 open breakers of one tenant: %.2f ms\n", ms);
    assert_true(ms < 5.0); /* 5M node visits when it walked them all: 27 ms here */

    /* acme's first open breaker (the one opened first) closes: its next
     * is listed first now, and the walk still finds eight of acme's */
    assert_int_equal(hub_breaker_check(b, "acme", "http://a0:1", T0 + 31 * SEC, NULL),
                     HUB_BREAKER_PROBE);
    hub_breaker_report(b, "acme", "http://a0:1", 1, 1, T0 + 31 * SEC);
    n = 0;
    assert_int_equal(hub_breakers_each_open(b, 8, count_open, &n), 9);
    assert_int_equal(hub_breakers_open_hint(b), 5000);
    hub_breakers_free(b);
}

/* While half-open only the probe's outcome decides: an attempt that started
 * before the trip and ends while the probe is out (a slow destination, a
 * delivery timeout longer than the open time) neither closes nor re-opens
 * the breaker; its report only moves the failure streak. */
static void test_only_the_probe_decides(void **state) {
    (void)state;
    struct hub_breakers *b = new_default();
    int64_t at = 0, t = T0 + 30 * SEC;
    struct listed l;

    trip_at(b, T0);
    assert_int_equal(check(b, "acme", t, NULL), HUB_BREAKER_PROBE);
    hub_breaker_report(b, "acme", ORIGIN, 1, 0, t + 100); /* a straggler's success */
    assert_int_equal(check(b, "acme", t + 101, NULL), HUB_BREAKER_SHED);
    memset(&l, 0, sizeof(l));
    assert_int_equal(hub_breakers_list(b, t + 101, collect, &l), 1);
    assert_string_equal(l.state[0], "half_open");
    hub_breaker_report(b, "acme", ORIGIN, 0, 0, t + 200); /* a straggler's failure */
    memset(&l, 0, sizeof(l));
    assert_int_equal(hub_breakers_list(b, t + 201, collect, &l), 1);
    assert_string_equal(l.state[0], "half_open");
    assert_int_equal(l.consecutive[0], 1);
    /* the probe's failure re-opens it for twice the time, from its report */
    hub_breaker_report(b, "acme", ORIGIN, 0, 1, t + 300);
    assert_int_equal(check(b, "acme", t + 301, &at), HUB_BREAKER_SHED);
    assert_int_equal(at, t + 300 + 60 * SEC);
    /* and the next probe's success closes it, whatever a straggler said */
    t += 300 + 60 * SEC;
    assert_int_equal(check(b, "acme", t, NULL), HUB_BREAKER_PROBE);
    hub_breaker_report(b, "acme", ORIGIN, 0, 0, t + 1);
    hub_breaker_report(b, "acme", ORIGIN, 1, 1, t + 2);
    assert_int_equal(check(b, "acme", t + 3, NULL), HUB_BREAKER_ALLOW);
    hub_breakers_free(b);
}

static void test_forgotten_when_nobody_waits(void **state) {
    (void)state;
    struct hub_breakers *b = new_default();

    trip_at(b, T0);
    /* its jobs are gone: no check or report for 2 windows + open_max */
    assert_int_equal(hub_breakers_open_count(b, T0 + 719 * SEC), 1);
    assert_int_equal(hub_breakers_open_count(b, T0 + 720 * SEC), 0);
    assert_int_equal(hub_breakers_list(b, T0 + 720 * SEC, NULL, NULL), 0);
    assert_int_equal(check(b, "acme", T0 + 720 * SEC, NULL), HUB_BREAKER_ALLOW);

    /* a closed breaker with a failure streak is kept, however idle */
    fail_n(b, "globex", 4, T0);
    assert_int_equal(hub_breakers_open_count(b, T0 + 3600 * SEC), 0);
    hub_breaker_report(b, "globex", ORIGIN, 0, 0, T0 + 3600 * SEC);
    assert_int_equal(check(b, "globex", T0 + 3600 * SEC, NULL), HUB_BREAKER_SHED);
    hub_breakers_free(b);
}

static void test_bounded_table(void **state) {
    (void)state;
    struct hub_breaker_cfg cfg = HUB_BREAKER_CFG_DEFAULT;
    cfg.max_breakers = 4;
    struct hub_breakers *b = hub_breakers_new(&cfg);
    char tenant[16];
    assert_non_null(b);

    for (int i = 0; i < 4; i++) {
        snprintf(tenant, sizeof(tenant), "t%d", i);
        hub_breaker_report(b, tenant, ORIGIN, 0, 0, T0); /* each with a 1-failure streak */
    }
    /* full of breakers in use: a 5th pair is not tracked, and so never trips */
    fail_n(b, "new", 5, T0 + SEC);
    assert_int_equal(check(b, "new", T0 + SEC, NULL), HUB_BREAKER_ALLOW);
    /* two windows later the idle ones give way, even with their streaks */
    fail_n(b, "new", 5, T0 + 121 * SEC);
    assert_int_equal(check(b, "new", T0 + 121 * SEC, NULL), HUB_BREAKER_SHED);
    hub_breakers_free(b);
}

static void test_config_validation(void **state) {
    (void)state;
    struct hub_breaker_cfg ok = HUB_BREAKER_CFG_DEFAULT, c;
    struct hub_breakers *b = hub_breakers_new(&ok);
    assert_non_null(b);
    hub_breakers_free(b);
    hub_breakers_free(NULL);

    c = ok, c.consecutive_failures = 0;
    assert_null(hub_breakers_new(&c));
    c = ok, c.failure_ratio = 0;
    assert_null(hub_breakers_new(&c));
    c = ok, c.failure_ratio = 1.5;
    assert_null(hub_breakers_new(&c));
    c = ok, c.min_attempts = 0;
    assert_null(hub_breakers_new(&c));
    c = ok, c.window_ms = 0;
    assert_null(hub_breakers_new(&c));
    c = ok, c.open_ms = 0;
    assert_null(hub_breakers_new(&c));
    c = ok, c.open_max_ms = c.open_ms - 1;
    assert_null(hub_breakers_new(&c));

    /* shortened settings, as tests of the whole hub use them */
    c = ok, c.consecutive_failures = 2, c.open_ms = 100, c.open_max_ms = 250, c.window_ms = 10;
    b = hub_breakers_new(&c);
    assert_non_null(b);
    int64_t at = 0;
    fail_n(b, "acme", 2, 0);
    assert_int_equal(check(b, "acme", 1, &at), HUB_BREAKER_SHED);
    assert_int_equal(at, 100);
    assert_int_equal(check(b, "acme", 100, NULL), HUB_BREAKER_PROBE);
    hub_breaker_report(b, "acme", ORIGIN, 0, 1, 110);
    assert_int_equal(check(b, "acme", 111, &at), HUB_BREAKER_SHED);
    assert_int_equal(at, 310);
    assert_int_equal(check(b, "acme", 310, NULL), HUB_BREAKER_PROBE);
    hub_breaker_report(b, "acme", ORIGIN, 0, 1, 320);
    assert_int_equal(check(b, "acme", 321, &at), HUB_BREAKER_SHED);
    assert_int_equal(at, 570); /* 400 capped at 250 */
    hub_breakers_free(b);
}

/* hub_breaker_sheds answers what a check would, without handing out the
 * probe: closed and unknown pairs do not shed, an open one does until its
 * probe is due, a half-open one while its probe is out. */
static void test_sheds_is_a_question(void **state) {
    (void)state;
    struct hub_breakers *b = new_default();

    assert_int_equal(hub_breaker_sheds(b, "acme", ORIGIN, T0), 0);
    trip_at(b, T0);
    assert_int_equal(hub_breaker_sheds(b, "acme", ORIGIN, T0 + 1), 1);
    assert_int_equal(hub_breaker_sheds(b, "other", ORIGIN, T0 + 1), 0);
    /* the probe is due: not shed, and asking twice does not take it */
    assert_int_equal(hub_breaker_sheds(b, "acme", ORIGIN, T0 + 30 * SEC), 0);
    assert_int_equal(hub_breaker_sheds(b, "acme", ORIGIN, T0 + 30 * SEC), 0);
    assert_int_equal(check(b, "acme", T0 + 30 * SEC, NULL), HUB_BREAKER_PROBE);
    assert_int_equal(hub_breaker_sheds(b, "acme", ORIGIN, T0 + 31 * SEC), 1);
    hub_breaker_report(b, "acme", ORIGIN, 1, 1, T0 + 32 * SEC);
    assert_int_equal(hub_breaker_sheds(b, "acme", ORIGIN, T0 + 33 * SEC), 0);
    hub_breakers_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sheds_is_a_question),
        cmocka_unit_test(test_consecutive_failures),
        cmocka_unit_test(test_ratio_trips_at_min_attempts),
        cmocka_unit_test(test_ratio_threshold),
        cmocka_unit_test(test_ratio_window_slides),
        cmocka_unit_test(test_shed_while_open),
        cmocka_unit_test(test_exactly_one_probe),
        cmocka_unit_test(test_probe_success_closes),
        cmocka_unit_test(test_close_forgets_the_window),
        cmocka_unit_test(test_probe_failure_doubles_up_to_max),
        cmocka_unit_test(test_lost_probe_is_replaced),
        cmocka_unit_test(test_released_probe),
        cmocka_unit_test(test_straggler_reports_while_open),
        cmocka_unit_test(test_only_the_probe_decides),
        cmocka_unit_test(test_pairs_are_independent),
        cmocka_unit_test(test_many_pairs),
        cmocka_unit_test(test_listing),
        cmocka_unit_test(test_open_list),
        cmocka_unit_test(test_open_walk_is_per_tenant),
        cmocka_unit_test(test_forgotten_when_nobody_waits),
        cmocka_unit_test(test_bounded_table),
        cmocka_unit_test(test_config_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
