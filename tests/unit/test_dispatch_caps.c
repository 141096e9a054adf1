/*
 * Unit tests of the per-destination slots (dispatch_caps.h, SPEC §7.1):
 * the caps per (tenant, origin) lane and per origin across tenants as a
 * claim books them, slots held from the claim to the job's end, the lanes'
 * adaptive limits (slow start, halving on overload once per round trip, a
 * tenth off on a slow answer, growth only while the slots are in use, one
 * tenant's overload leaving another's lane to the same origin alone), which
 * answers are overloads, the
 * run-ahead of jobs waiting for a slot, forgetting idle entries, and the
 * metrics' names.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dispatch_caps.h"

#define T0 1000000LL
#define O1 111
#define O2 222

/* A table: caps per origin and per lane, a lane's start limit; answers of
 * 1 s or more are slow; a run-ahead of 50 ms. */
static struct hub_caps *caps_new(int origin_max, int lane_max, int start) {
    struct hub_caps_cfg cfg = {.origin_max = origin_max,
                               .tenant_origin_max = lane_max,
                               .start = start,
                               .slow_ms = 1000,
                               .ahead_ms = 50};
    struct hub_caps *c = hub_caps_new(&cfg);
    assert_non_null(c);
    return c;
}

/* Holds and starts n slots of (tenant, origin); returns the lane. */
static struct hub_cap_lane *run(struct hub_caps *c, const char *tenant, int64_t origin, int n,
                                uint32_t *epoch) {
    struct hub_cap_lane *l = NULL;
    for (int i = 0; i < n; i++) {
        l = hub_caps_hold(c, tenant, origin, T0);
        assert_non_null(l);
        assert_int_equal(hub_caps_ready(c, l), 1);
        hub_caps_start(c, l, T0, T0, epoch);
    }
    return l;
}

/* The lane's limit (3) and the origin's cap (4) bound what one claim books,
 * across the origin's lanes; a new claim books again from what is held. */
static void test_offer_books_lane_and_origin(void **state) {
    (void)state;
    struct hub_caps *c = caps_new(4, 8, 3);

    assert_int_equal(hub_caps_offer(c, "a", O1, 10, 1, 0, T0), 3);
    assert_int_equal(hub_caps_offer(c, "a", O1, 10, 1, 0, T0), 0);
    assert_int_equal(hub_caps_offer(c, "b", O1, 10, 1, 0, T0), 1); /* the origin's 4th */
    assert_int_equal(hub_caps_full(c, "b", O1, 1), 1);
    assert_int_equal(hub_caps_offer(c, "b", O2, 2, 1, 0, T0), 2); /* another origin */
    /* claim 2: nothing held, everything free again */
    assert_int_equal(hub_caps_full(c, "a", O1, 2), 0);
    assert_int_equal(hub_caps_offer(c, "a", O1, 2, 2, 0, T0), 2);
    /* held slots count: 3 held by a leave a 4th slot for b only */
    for (int i = 0; i < 3; i++) {
        assert_non_null(hub_caps_hold(c, "a", O1, T0));
    }
    assert_int_equal(hub_caps_offer(c, "a", O1, 5, 3, 0, T0), 0);
    assert_int_equal(hub_caps_offer(c, "b", O1, 5, 3, 0, T0), 1);
    /* a shedding lane is offered whatever its cap, and books nothing */
    assert_int_equal(hub_caps_offer(c, "a", O1, 5, 3, 1, T0), 5);
    hub_caps_free(c);
}

/* hub_caps_each_full lists the origins a tenant's fifo heads must wait for:
 * its own full lanes, and origins full for everyone. */
static void collect(void *arg, int64_t origin) {
    int64_t *out = arg;
    out[out[0] + 1] = origin;
    out[0]++;
}

static void test_each_full(void **state) {
    (void)state;
    struct hub_caps *c = caps_new(4, 8, 3);
    int64_t got[8] = {0};

    for (int i = 0; i < 3; i++) {
        hub_caps_hold(c, "a", O1, T0);
    }
    hub_caps_hold(c, "b", O2, T0);
    hub_caps_each_full(c, "a", 1, collect, got);
    assert_int_equal(got[0], 1);
    assert_int_equal(got[1], O1);
    memset(got, 0, sizeof(got));
    hub_caps_each_full(c, "b", 1, collect, got);
    assert_int_equal(got[0], 0); /* b's lane to O1 has room under the origin's 4 */
    hub_caps_hold(c, "b", O1, T0);
    hub_caps_each_full(c, "b", 1, collect, got);
    assert_int_equal(got[0], 1);
    assert_int_equal(got[1], O1);
    hub_caps_free(c);
}

/* Successes while the lane's slots are in use grow its limit by one each
 * (slow start) up to tenant_origin_max; with few in use it does not grow. */
static void test_slow_start_while_in_use(void **state) {
    (void)state;
    struct hub_caps *c = caps_new(100, 8, 4);
    uint32_t e;
    struct hub_cap_lane *l = run(c, "a", O1, 1, &e);

    hub_caps_name(c, l, "http://x:80");
    /* 1 of 4 held: not in use enough to grow */
    hub_caps_report(c, l, e, HUB_CAPS_OK, 10, T0);
    assert_true(hub_caps_limit(c, "a", O1) == 4);
    run(c, "b", O1, 4, &e); /* another tenant's slots do not count */
    hub_caps_report(c, l, e, HUB_CAPS_OK, 10, T0);
    assert_true(hub_caps_limit(c, "a", O1) == 4);
    run(c, "a", O1, 3, &e); /* 4 of 4 held */
    for (int i = 0; i < 10; i++) {
        hub_caps_report(c, l, e, HUB_CAPS_OK, 10, T0);
    }
    assert_true(hub_caps_limit(c, "a", O1) == 8); /* tenant_origin_max */
    assert_string_equal(hub_caps_origin_name(c, O1), "http://x:80");
    hub_caps_free(c);
}

/* An overload halves the lane's limit once for all the attempts that
 * started before it; one started after it halves it again, and from then
 * on the limit grows by one per round trip (1/limit per success).  Another
 * tenant's lane to the same origin keeps its limit. */
static void test_overload_halves_once_per_round_trip(void **state) {
    (void)state;
    struct hub_caps *c = caps_new(100, 8, 4);
    uint32_t e0, e1;
    struct hub_cap_lane *l = run(c, "a", O1, 3, &e0);

    hub_caps_report(c, l, e0, HUB_CAPS_OVERLOAD, 3000, T0);
    assert_true(hub_caps_limit(c, "a", O1) == 2);
    hub_caps_report(c, l, e0, HUB_CAPS_OVERLOAD, 3000, T0);
    hub_caps_report(c, l, e0, HUB_CAPS_OVERLOAD, 3000, T0);
    assert_true(hub_caps_limit(c, "a", O1) == 2);
    assert_int_equal(hub_caps_offer(c, "b", O1, 10, 1, 0, T0), 4);
    for (int i = 0; i < 3; i++) {
        hub_caps_release(c, l, 1, T0);
    }
    run(c, "a", O1, 1, &e1);
    assert_int_not_equal(e0, e1);
    hub_caps_report(c, l, e1, HUB_CAPS_OVERLOAD, 3000, T0);
    assert_true(hub_caps_limit(c, "a", O1) == 1);
    hub_caps_report(c, l, e1, HUB_CAPS_OVERLOAD, 3000, T0 + 1);
    assert_true(hub_caps_limit(c, "a", O1) == 1); /* this round trip counted already */
    /* past ssthresh: one slot per round trip */
    hub_caps_report(c, l, e1, HUB_CAPS_OK, 10, T0 + 2);
    assert_true(hub_caps_limit(c, "a", O1) == 2);
    hub_caps_report(c, l, e1, HUB_CAPS_OK, 10, T0 + 3);
    assert_true(hub_caps_limit(c, "a", O1) == 2.5);
    /* neutral results move nothing */
    hub_caps_report(c, l, e1, HUB_CAPS_NEUTRAL, 10, T0 + 4);
    assert_true(hub_caps_limit(c, "a", O1) == 2.5);
    hub_caps_free(c);
}

/* An answer slower than slow_ms takes a tenth off (once per round trip);
 * a slow but quick enough one does not. */
static void test_slow_answer(void **state) {
    (void)state;
    struct hub_caps *c = caps_new(100, 8, 4);
    uint32_t e;
    struct hub_cap_lane *l = run(c, "a", O1, 1, &e);

    for (int i = 0; i < 20; i++) {
        hub_caps_report(c, l, e, HUB_CAPS_OK, 300, T0 + i); /* steady 300 ms */
    }
    assert_true(hub_caps_limit(c, "a", O1) == 4);
    hub_caps_report(c, l, e, HUB_CAPS_OK, 2000, T0 + 100);
    hub_caps_report(c, l, e, HUB_CAPS_OK, 2000, T0 + 101);
    assert_true(hub_caps_limit(c, "a", O1) > 3.5 && hub_caps_limit(c, "a", O1) < 3.7);
    hub_caps_free(c);
}

/* A lane whose attempts in flight fill its cap keeps claimed jobs waiting
 * only by its run-ahead: none before an attempt ended, then as many as it
 * frees within 50 ms (at most its cap), fewer as its attempts get slower;
 * beyond that a job is to be given back.  The origin's cap holds too. */
static void test_ready_and_run_ahead(void **state) {
    (void)state;
    struct hub_caps *c = caps_new(100, 8, 4);
    uint32_t e;
    struct hub_cap_lane *l = run(c, "a", O1, 4, &e);
    struct hub_cap_lane *x = hub_caps_hold(c, "a", O1, T0);
    int inflight, held;

    assert_int_equal(hub_caps_ready(c, x), 0);
    assert_int_equal(hub_caps_waiting_over(c, x), 1); /* nothing answered yet */
    assert_int_equal(hub_caps_offer(c, "a", O1, 10, 1, 0, T0), 0);
    hub_caps_release(c, x, 0, T0);
    /* attempts of 10 ms: 4 slots free up 20 times in 50 ms; the cap bounds it */
    hub_caps_report(c, l, e, HUB_CAPS_NEUTRAL, 10, T0);
    assert_int_equal(hub_caps_offer(c, "a", O1, 10, 2, 0, T0), 4);
    for (int i = 0; i < 4; i++) {
        hub_caps_hold(c, "a", O1, T0);
    }
    assert_int_equal(hub_caps_waiting_over(c, l), 0);
    x = hub_caps_hold(c, "a", O1, T0);
    assert_int_equal(hub_caps_waiting_over(c, x), 1);
    hub_caps_release(c, x, 0, T0);
    /* attempts of about 200 ms: no slot frees within 50 ms */
    hub_caps_report(c, l, e, HUB_CAPS_NEUTRAL, 1000, T0);
    assert_int_equal(hub_caps_waiting_over(c, l), 1);
    hub_caps_counts(c, O1, &inflight, &held);
    assert_int_equal(inflight, 4);
    assert_int_equal(held, 8);
    /* a started job ends: one waiting job may start */
    hub_caps_release(c, l, 1, T0);
    assert_int_equal(hub_caps_ready(c, l), 1);
    /* the origin's cap: b's lane has room, the origin none */
    c = (hub_caps_free(c), caps_new(2, 8, 4));
    run(c, "a", O2, 2, &e);
    x = hub_caps_hold(c, "b", O2, T0);
    assert_int_equal(hub_caps_ready(c, x), 0);
    hub_caps_free(c);
}

/* One tenant's lanes together hold at most tenant_max attempts (the
 * dispatcher's workers but a reserve): its hanging destinations on many
 * origins cannot take every worker.  At the bound its lanes are neither
 * ready nor offered, another tenant's are; an attempt that ends frees one.
 * A tenant goes with its last lane. */
static void test_tenant_bound(void **state) {
    (void)state;
    struct hub_caps_cfg cfg = {
        .origin_max = 100, .tenant_origin_max = 8, .start = 4, .ahead_ms = 50, .tenant_max = 5};
    struct hub_caps *c = hub_caps_new(&cfg);
    uint32_t e;
    struct hub_cap_lane *l, *x;

    assert_non_null(c);
    l = run(c, "a", O1, 3, &e);
    run(c, "a", O2, 2, &e); /* 5 of a's in flight, over two origins */
    x = hub_caps_hold(c, "a", O2, T0);
    assert_int_equal(hub_caps_ready(c, x), 0);
    assert_int_equal(hub_caps_offer(c, "a", O1, 10, 1, 0, T0), 0);
    assert_int_equal(hub_caps_full(c, "a", O1, 1), 1);
    assert_int_equal(hub_caps_offer(c, "b", O1, 10, 1, 0, T0), 4);
    run(c, "b", O1, 1, &e);
    hub_caps_release(c, l, 1, T0); /* one of a's attempts ends */
    assert_int_equal(hub_caps_ready(c, x), 1);
    hub_caps_release(c, x, 0, T0);
    hub_caps_free(c);
}

/* Starts attempts of the tenant on its own origins (one lane each, 8 at
 * most a lane) while it may; returns how many started. */
static int start_while_ready(struct hub_caps *c, const char *tenant, int64_t origin0) {
    uint32_t e;
    int n = 0;

    for (int64_t o = origin0;; o++) {
        for (int i = 0; i < 8; i++) {
            struct hub_cap_lane *l = hub_caps_hold(c, tenant, o, T0);
            assert_non_null(l);
            if (!hub_caps_ready(c, l)) {
                hub_caps_release(c, l, 0, T0);
                return n;
            }
            hub_caps_start(c, l, T0, T0, &e);
            n++;
        }
    }
}

/* Two tenants whose destinations hang each took what the other left: a
 * tenant could hold all the workers but the reserve (56 of 64), and a
 * second one the reserve, so a third tenant's events waited for their
 * timeouts.  Each tenant now leaves free as many workers as it holds (the
 * reserve at most): 56, then 4, 2, 1, and the fifth takes the last one; a
 * tenant with nothing in flight starts while any is free, and an offer
 * (the claim's run-ahead) is not cut by it. */
static void test_tenants_leave_workers_to_the_next(void **state) {
    (void)state;
    struct hub_caps_cfg cfg = {.origin_max = 100,
                               .tenant_origin_max = 8,
                               .start = 8,
                               .ahead_ms = 50,
                               .tenant_max = 56,
                               .workers = 64};
    struct hub_caps *c = hub_caps_new(&cfg);
    struct hub_cap_lane *x;

    assert_non_null(c);
    assert_int_equal(start_while_ready(c, "a", 1000), 56);
    assert_int_equal(start_while_ready(c, "b", 2000), 4);
    assert_int_equal(hub_caps_offer(c, "b", 2999, 8, 1, 0, T0), 8);
    x = hub_caps_hold(c, "b", 2999, T0);
    assert_int_equal(hub_caps_ready(c, x), 0); /* held back for the others... */
    assert_int_equal(hub_caps_room(c, x), 1);  /* ... not for its destination */
    hub_caps_release(c, x, 0, T0);
    assert_int_equal(start_while_ready(c, "c", 3000), 2);
    assert_int_equal(start_while_ready(c, "d", 4000), 1);
    x = hub_caps_hold(c, "f", 6000, T0);
    assert_int_equal(hub_caps_ready(c, x), 1); /* one worker left: f holds none */
    assert_int_equal(start_while_ready(c, "e", 5000), 1);
    assert_int_equal(hub_caps_ready(c, x), 0); /* none left */
    hub_caps_release(c, x, 0, T0);
    hub_caps_free(c);
}

/* The dispatcher's own run-ahead (ahead_floor) lets a fast lane keep more
 * waiting than its cap, so that a claim is not cut to what the workers
 * leave of the cap; a slow lane still keeps only what it frees in 50 ms. */
static void test_run_ahead_floor(void **state) {
    (void)state;
    struct hub_caps_cfg cfg = {
        .origin_max = 100, .tenant_origin_max = 8, .start = 4, .ahead_ms = 50, .ahead_floor = 12};
    struct hub_caps *c = hub_caps_new(&cfg);
    uint32_t e;
    struct hub_cap_lane *l;

    assert_non_null(c);
    l = run(c, "a", O1, 4, &e);
    /* attempts of 1 ms: 4 + 12 slots, 4 of them in flight */
    hub_caps_report(c, l, e, HUB_CAPS_NEUTRAL, 1, T0);
    assert_int_equal(hub_caps_offer(c, "a", O1, 100, 1, 0, T0), 12);
    /* attempts of 150 ms: one of 4 slots frees in 50 ms, the floor aside */
    for (int i = 0; i < 30; i++) {
        hub_caps_report(c, l, e, HUB_CAPS_NEUTRAL, 150, T0);
    }
    assert_int_equal(hub_caps_offer(c, "a", O1, 100, 2, 0, T0), 1);
    hub_caps_free(c);
}

/* Idle entries holding nothing are forgotten (an origin's limit with it);
 * the busiest named origins show by name in the metrics, the rest as
 * other, with the wait histogram. */
static void test_sweep_and_metrics(void **state) {
    (void)state;
    struct hub_caps *c = caps_new(100, 8, 4);
    uint32_t e;
    struct hub_cap_lane *l = run(c, "a", O1, 2, &e);
    char *text = NULL;
    size_t len = 0;
    FILE *f;

    hub_caps_report(c, l, e, HUB_CAPS_OVERLOAD, 3000, T0);
    hub_caps_name(c, l, "http://busy:80");
    run(c, "b", O2, 1, &e); /* never named */
    hub_caps_sweep(c, T0 + 1);
    f = open_memstream(&text, &len);
    hub_caps_metrics_render(c, f);
    fclose(f);
    assert_non_null(
        strstr(text, "streaming_hub_dispatch_origin_inflight{origin=\"http://busy:80\"} 2"));
    assert_non_null(strstr(text, "streaming_hub_dispatch_origin_inflight{origin=\"other\"} 1"));
    assert_non_null(
        strstr(text, "streaming_hub_dispatch_origin_limit{origin=\"http://busy:80\"} 2"));
    assert_non_null(
        strstr(text, "streaming_hub_dispatch_slot_wait_seconds_count{origin=\"other\"} 3"));
    free(text);
    /* released and idle: forgotten, the limit back to the start */
    hub_caps_release(c, l, 1, T0);
    hub_caps_release(c, l, 1, T0);
    hub_caps_sweep(c, T0 + 11 * 60000);
    assert_true(hub_caps_limit(c, "a", O1) == 4);
    assert_null(hub_caps_origin_name(c, O1));
    hub_caps_free(c);
}

/* Which answers are overloads: the ones that say the host is out of
 * capacity, not a webhook's error about its request (a 500 on one path
 * must not throttle the tenant's other paths on the host). */
static void test_status_signal(void **state) {
    static const struct {
        long status;
        enum hub_caps_signal signal;
    } cases[] = {
        {200, HUB_CAPS_OK},       {204, HUB_CAPS_OK},       {302, HUB_CAPS_OK},
        {400, HUB_CAPS_OK},       {410, HUB_CAPS_OK},       {429, HUB_CAPS_OVERLOAD},
        {502, HUB_CAPS_OVERLOAD}, {503, HUB_CAPS_OVERLOAD}, {504, HUB_CAPS_OVERLOAD},
        {500, HUB_CAPS_NEUTRAL},  {501, HUB_CAPS_NEUTRAL},  {599, HUB_CAPS_NEUTRAL},
    };
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(hub_caps_status_signal(cases[i].status), cases[i].signal);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offer_books_lane_and_origin),
        cmocka_unit_test(test_each_full),
        cmocka_unit_test(test_slow_start_while_in_use),
        cmocka_unit_test(test_overload_halves_once_per_round_trip),
        cmocka_unit_test(test_slow_answer),
        cmocka_unit_test(test_ready_and_run_ahead),
        cmocka_unit_test(test_tenant_bound),
        cmocka_unit_test(test_tenants_leave_workers_to_the_next),
        cmocka_unit_test(test_run_ahead_floor),
        cmocka_unit_test(test_sweep_and_metrics),
        cmocka_unit_test(test_status_signal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
