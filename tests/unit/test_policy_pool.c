/*
 * Unit tests of the policy threads and of tripping (src/policy.h,
 * src/policy_pool.c, src/policy.c): calls submitted on a loop run on the
 * policy threads and come back on the loop; keys take turns; a policy whose
 * calls keep timing out is tripped (answered without running, shown in the
 * admin JSON and the metrics, told to the hook) until its cool-down ends or
 * a reload; a call holds its version across a reload; and the deadline
 * counts the calling thread's CPU time, with a wall-clock backstop.
 *
 * Every test runs under a watchdog, so a call that never comes back fails
 * the run instead of hanging it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <uv.h>

#include "policy.h"
#include "policy_int.h" /* POLICY_TRIP_SLOTS */

#define MIB (1024 * 1024)
#define WATCHDOG_S 30
#define WATCHDOG_MSG "test_policy_pool: watchdog: a test ran past 30 s\n"

#include "policy_test.h"

/* -------------------------------------------------------------- helpers -- */

static void remove_file(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    unlink(path);
}

static const char QUICK[] =
    "return {\n"
    "  match = function(ev) return ev.id ~= 'no' end,\n"
    "  shape = function(ev) return 'shaped ' .. ev.id, {['X-Id'] = ev.id} end,\n"
    "  retry = function(ctx) return ctx.attempt < 3 and '2s' or false end,\n"
    "}\n";
static const char SPIN[] = "return { match = function(ev) while true do end end }\n";
static const char SHAPE_ONLY[] = "return { shape = function(ev) return nil end }\n";
static const char SHAPE_SPIN[] = "return { match = function(ev) return true end,\n"
                                 "         shape = function(ev) while true do end end }\n";

/* A registry over a fresh directory of the three policies above, on a
 * private loop. */
struct fixture {
    char dir[64];
    uv_loop_t loop;
    struct hub_policies *ps;
    struct hub_policy_gen *gen;
};

static void fixture_start(struct fixture *f, const struct hub_policy_limits *lim) {
    snprintf(f->dir, sizeof(f->dir), "/tmp/test_policy_pool.XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    write_file(f->dir, "quick.lua", QUICK);
    write_file(f->dir, "spin.lua", SPIN);
    write_file(f->dir, "shape_only.lua", SHAPE_ONLY);
    write_file(f->dir, "shape_spin.lua", SHAPE_SPIN);
    assert_int_equal(uv_loop_init(&f->loop), 0);
    f->ps = hub_policies_new(&f->loop, f->dir, lim);
    assert_non_null(f->ps);
    f->gen = hub_policies_acquire(f->ps);
}

static struct hub_policy *fixture_policy(struct fixture *f, const char *name) {
    struct hub_policy *p = hub_policy_gen_find(f->gen, name);
    assert_non_null(p);
    return p;
}

static void fixture_stop(struct fixture *f) {
    hub_policy_gen_release(f->gen);
    hub_policies_free(f->ps);
    /* the threads' wakeup handle closes on the loop */
    uv_run(&f->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&f->loop), 0);
    remove_file(f->dir, "quick.lua");
    remove_file(f->dir, "spin.lua");
    remove_file(f->dir, "shape_only.lua");
    remove_file(f->dir, "shape_spin.lua");
    remove_file(f->dir, "gen.lua");
    assert_int_equal(rmdir(f->dir), 0);
}

/* One call of a test, and the order the completions came in. */
struct order {
    int n;
    const char *keys[64];
};

struct tcall {
    struct hub_policy_call c;
    struct order *order;
    char id[32];
    int done;
    int on_loop_thread; /* cb ran on the thread that runs the loop */
};

static pthread_t loop_thread;

static void tcall_cb(struct hub_policy_call *c) {
    struct tcall *t = c->arg;
    t->done = 1;
    t->on_loop_thread = pthread_equal(pthread_self(), loop_thread);
    if (t->order != NULL && t->order->n < 64) {
        t->order->keys[t->order->n++] = c->key;
    }
}

/* Fills t for fn of p under key, with ev.id = id. */
static void tcall_init(struct tcall *t, struct hub_policy *p, enum hub_policy_fn fn,
                       const char *key, const char *id, struct order *order) {
    memset(t, 0, sizeof(*t));
    snprintf(t->id, sizeof(t->id), "%s", id);
    t->order = order;
    t->c.policy = p;
    t->c.fn = fn;
    t->c.key = key;
    t->c.ev.id = t->id;
    t->c.ev.tenant = "acme";
    t->c.ev.body = "{}";
    t->c.ev.body_len = 2;
    t->c.retry.attempt = 1;
    t->c.retry.status = 503;
    t->c.retry.error = "status";
    t->c.cb = tcall_cb;
    t->c.arg = t;
}

/* Runs the loop until every one of n calls is done. */
static void run_until_done(uv_loop_t *loop, struct tcall *t, size_t n) {
    for (;;) {
        size_t left = 0;
        for (size_t i = 0; i < n; i++) {
            left += !t[i].done;
        }
        if (left == 0) {
            return;
        }
        uv_run(loop, UV_RUN_ONCE);
    }
}

static void assert_contains(const char *haystack, const char *needle) {
    if (haystack == NULL || strstr(haystack, needle) == NULL) {
        fail_msg("\"%s\" does not contain \"%s\"", haystack ? haystack : "(null)", needle);
    }
}

/* The admin JSON's entry for policy name, as a new reference. */
static json_t *admin_entry(struct hub_policies *ps, const char *name) {
    char *text = hub_policies_json(ps);
    json_t *root = json_loads(text, 0, NULL), *arr, *v, *found = NULL;
    size_t i;

    free(text);
    assert_non_null(root);
    arr = json_object_get(root, "policies");
    json_array_foreach(arr, i, v) {
        if (strcmp(json_string_value(json_object_get(v, "name")), name) == 0) {
            found = json_incref(v);
        }
    }
    json_decref(root);
    assert_non_null(found);
    return found;
}

static char *metrics_text(struct hub_policies *ps) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    hub_policies_metrics_render(ps, f);
    fclose(f);
    return buf;
}

static void reload_cb(void *arg, const char *json, double seconds) {
    (void)seconds;
    assert_non_null(json);
    *(int *)arg = 1;
}

static void reload_and_wait(struct fixture *f) {
    int done = 0;
    hub_policies_reload(f->ps, reload_cb, &done);
    while (!done) {
        uv_run(&f->loop, UV_RUN_ONCE);
    }
    hub_policy_gen_release(f->gen);
    f->gen = hub_policies_acquire(f->ps);
}

/* ---------------------------------------------------------------- calls -- */

/* Calls run on the policy threads and come back on the loop, with the
 * results the synchronous functions give; a function the policy does not
 * define is answered at once. */
static void test_calls_come_back_on_the_loop(void **state) {
    (void)state;
    struct hub_policy_limits lim = {.timeout_ms = 50, .memory_bytes = 16 * MIB, .threads = 2};
    struct fixture f;
    struct tcall t[4], absent;
    char *m;

    loop_thread = pthread_self();
    fixture_start(&f, &lim);
    tcall_init(&t[0], fixture_policy(&f, "quick"), HUB_POLICY_MATCH, "s1", "yes", NULL);
    tcall_init(&t[1], fixture_policy(&f, "quick"), HUB_POLICY_MATCH, "s1", "no", NULL);
    tcall_init(&t[2], fixture_policy(&f, "quick"), HUB_POLICY_SHAPE, "s2", "e7", NULL);
    tcall_init(&t[3], fixture_policy(&f, "quick"), HUB_POLICY_RETRY, "s3", "r", NULL);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(hub_policies_submit(f.ps, &t[i].c), 0);
        assert_false(t[i].done); /* never before submit returns */
    }
    run_until_done(&f.loop, t, 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(t[i].c.status, HUB_POLICY_OK);
        assert_true(t[i].on_loop_thread);
        assert_true(t[i].c.started_ns >= t[i].c.queued_ns);
        assert_true(t[i].c.ended_ns >= t[i].c.started_ns);
    }
    assert_int_equal(t[0].c.matched, 1);
    assert_int_equal(t[1].c.matched, 0);
    assert_non_null(t[2].c.shaped.body);
    assert_memory_equal(t[2].c.shaped.body, "shaped e7", 9);
    assert_string_equal(hub_policy_shaped_header(&t[2].c.shaped, "X-Id"), "e7");
    hub_policy_shaped_free(&t[2].c.shaped);
    assert_int_equal(t[3].c.action, HUB_POLICY_RETRY_DELAY);
    assert_int_equal(t[3].c.delay_ms, 2000);

    /* shape_only has no match: the neutral answer, at once, no callback */
    tcall_init(&absent, fixture_policy(&f, "shape_only"), HUB_POLICY_MATCH, "s1", "x", NULL);
    assert_int_equal(hub_policies_submit(f.ps, &absent.c), 1);
    assert_int_equal(absent.c.status, HUB_POLICY_OK);
    assert_int_equal(absent.c.matched, 1);
    tcall_init(&absent, fixture_policy(&f, "shape_only"), HUB_POLICY_RETRY, "s1", "x", NULL);
    assert_int_equal(hub_policies_submit(f.ps, &absent.c), 1);
    assert_int_equal(absent.c.action, HUB_POLICY_RETRY_SCHEDULE);
    assert_false(absent.done);

    m = metrics_text(f.ps);
    assert_contains(m, "streaming_hub_policy_threads 2\n");
    assert_contains(m, "streaming_hub_policy_calls_in_flight 0\n");
    assert_contains(m, "streaming_hub_policy_queue_seconds_count 4\n");
    assert_contains(m, "streaming_hub_policy_call_seconds_count 4\n");
    free(m);
    fixture_stop(&f);
}

/* Six calls of acme's that each run into the deadline, under keys[i], on
 * one thread, then a quick call under key "b" of tenant b_tenant: checks
 * that it finished among the first three (the call running and one more
 * at most went before it), and the statuses. */
static void quick_call_waits_little(const char *const keys[6], const char *b_tenant) {
    struct hub_policy_limits lim = {.timeout_ms = 20, .memory_bytes = 16 * MIB, .threads = 1};
    struct fixture f;
    struct tcall t[7];
    struct order order = {0};
    int b_at = -1;

    loop_thread = pthread_self();
    fixture_start(&f, &lim);
    for (int i = 0; i < 6; i++) {
        tcall_init(&t[i], fixture_policy(&f, "spin"), HUB_POLICY_MATCH, keys[i], "spin", &order);
        assert_int_equal(hub_policies_submit(f.ps, &t[i].c), 0);
    }
    tcall_init(&t[6], fixture_policy(&f, "quick"), HUB_POLICY_MATCH, "b", "yes", &order);
    t[6].c.ev.tenant = b_tenant;
    assert_int_equal(hub_policies_submit(f.ps, &t[6].c), 0);
    run_until_done(&f.loop, t, 7);
    for (int i = 0; i < order.n; i++) {
        if (strcmp(order.keys[i], "b") == 0) {
            b_at = i;
        }
    }
    if (b_at < 0 || b_at > 2) {
        fail_msg("b's call (tenant %s) finished %d-th, after %d of acme's", b_tenant, b_at + 1,
                 b_at);
    }
    for (int i = 0; i < 6; i++) {
        assert_int_equal(t[i].c.status, HUB_POLICY_TIMEOUT); /* tripping is off */
    }
    assert_int_equal(t[6].c.status, HUB_POLICY_OK);
    fixture_stop(&f);
}

/* Keys take turns: with one thread busy on key a's backlog of calls that
 * each run into the deadline, key b's call waits for at most the call
 * running and one more of a's. */
static void test_keys_take_turns(void **state) {
    const char *keys[6] = {"a", "a", "a", "a", "a", "a"};
    (void)state;
    quick_call_waits_little(keys, "acme");
}

/* Tenants take turns before their subscriptions do: one tenant's calls
 * under six subscriptions (keys) did go round with six turns to another
 * tenant's one, so a tenant with many subscriptions whose calls run long
 * delayed every other tenant's by one call each. */
static void test_tenants_take_turns(void **state) {
    const char *keys[6] = {"a0", "a1", "a2", "a3", "a4", "a5"};
    (void)state;
    quick_call_waits_little(keys, "other");
}

/* ------------------------------------------------------------- tripping -- */

struct trip_seen {
    int n;
    char policy[64];
    char tenant[64]; /* "*": every tenant */
    int64_t until_ms;
    char last_error[512];
};

static void on_trip(void *arg, const char *policy, const char *tenant, int64_t until_ms,
                    const char *last_error) {
    struct trip_seen *s = arg;
    s->n++;
    snprintf(s->policy, sizeof(s->policy), "%s", policy);
    snprintf(s->tenant, sizeof(s->tenant), "%s", tenant != NULL ? tenant : "*");
    s->until_ms = until_ms;
    snprintf(s->last_error, sizeof(s->last_error), "%s", last_error ? last_error : "");
}

/* A match call with shape_ahead runs the shape in the same visit when the
 * match says yes (and only then); a shape that runs into its deadline that
 * way counts toward tripping like a shape call of its own. */
static void test_shape_rides_with_match(void **state) {
    (void)state;
    struct hub_policy_limits lim = {.timeout_ms = 10,
                                    .memory_bytes = 16 * MIB,
                                    .threads = 1,
                                    .trip_failures = 2,
                                    .trip_window_ms = 10000,
                                    .trip_cooldown_ms = 60000};
    struct fixture f;
    struct tcall t[3];
    json_t *e;

    loop_thread = pthread_self();
    fixture_start(&f, &lim);
    tcall_init(&t[0], fixture_policy(&f, "quick"), HUB_POLICY_MATCH, "s1", "yes", NULL);
    tcall_init(&t[1], fixture_policy(&f, "quick"), HUB_POLICY_MATCH, "s1", "no", NULL);
    tcall_init(&t[2], fixture_policy(&f, "quick"), HUB_POLICY_MATCH, "s1", "plain", NULL);
    t[0].c.shape_ahead = t[1].c.shape_ahead = 1;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(hub_policies_submit(f.ps, &t[i].c), 0);
    }
    run_until_done(&f.loop, t, 3);
    assert_int_equal(t[0].c.status, HUB_POLICY_OK);
    assert_int_equal(t[0].c.matched, 1);
    assert_int_equal(t[0].c.shaped_ahead, 1);
    assert_int_equal(t[0].c.shape_status, HUB_POLICY_OK);
    assert_non_null(t[0].c.shaped.body);
    assert_memory_equal(t[0].c.shaped.body, "shaped yes", 10);
    assert_string_equal(hub_policy_shaped_header(&t[0].c.shaped, "X-Id"), "yes");
    hub_policy_shaped_free(&t[0].c.shaped);
    /* turned down: no shape */
    assert_int_equal(t[1].c.matched, 0);
    assert_int_equal(t[1].c.shaped_ahead, 0);
    assert_null(t[1].c.shaped.body);
    /* not asked: no shape */
    assert_int_equal(t[2].c.matched, 1);
    assert_int_equal(t[2].c.shaped_ahead, 0);
    assert_null(t[2].c.shaped.body);

    /* a runaway shape: match's answer stands, the shape's is its own */
    for (int i = 0; i < 2; i++) {
        tcall_init(&t[i], fixture_policy(&f, "shape_spin"), HUB_POLICY_MATCH, "s2", "x", NULL);
        t[i].c.shape_ahead = 1;
        assert_int_equal(hub_policies_submit(f.ps, &t[i].c), 0);
        run_until_done(&f.loop, &t[i], 1);
        assert_int_equal(t[i].c.status, HUB_POLICY_OK);
        assert_int_equal(t[i].c.matched, 1);
        assert_int_equal(t[i].c.shaped_ahead, 1);
        assert_int_equal(t[i].c.shape_status, HUB_POLICY_TIMEOUT);
        assert_contains(t[i].c.err, "shape: shape_spin.lua: ran past its 10 ms deadline");
        assert_null(t[i].c.shaped.body);
    }
    e = admin_entry(f.ps, "shape_spin");
    assert_string_equal(json_string_value(json_object_get(e, "state")), "tripped");
    json_decref(e);
    fixture_stop(&f);
}

/* trip_failures timeouts within the window trip the policy: its calls are
 * answered without running (queued ones too), it shows in the admin JSON
 * and the metrics, the hook hears of it once; a reload clears it. */
static void test_timeouts_trip_the_policy_until_a_reload(void **state) {
    (void)state;
    struct hub_policy_limits lim = {.timeout_ms = 10,
                                    .memory_bytes = 16 * MIB,
                                    .threads = 1,
                                    .trip_failures = 3,
                                    .trip_window_ms = 10000,
                                    .trip_cooldown_ms = 60000};
    struct fixture f;
    struct tcall t[8], once;
    struct trip_seen seen = {0};
    int timeouts = 0, tripped = 0;
    json_t *e;
    char *m;
    double t0;

    loop_thread = pthread_self();
    fixture_start(&f, &lim);
    hub_policies_on_trip(f.ps, on_trip, &seen);
    for (int i = 0; i < 8; i++) {
        tcall_init(&t[i], fixture_policy(&f, "spin"), HUB_POLICY_MATCH, "a", "spin", NULL);
        assert_int_equal(hub_policies_submit(f.ps, &t[i].c), 0);
    }
    run_until_done(&f.loop, t, 8);
    for (int i = 0; i < 8; i++) {
        timeouts += t[i].c.status == HUB_POLICY_TIMEOUT;
        tripped += t[i].c.status == HUB_POLICY_TRIPPED;
        if (t[i].c.status == HUB_POLICY_TRIPPED) {
            assert_contains(t[i].c.err, "spin.lua: tripped until");
            assert_contains(t[i].c.err, "deadline"); /* the last error it names */
            assert_true(t[i].c.ended_ns - t[i].c.started_ns < 5000000); /* not run */
        }
    }
    /* the calls already running when it tripped still count as timeouts */
    if (timeouts < 3 || timeouts > 5 || tripped != 8 - timeouts) {
        fail_msg(
            "%d timeouts and %d tripped, want 3 (4, 5: one running) timeouts, the rest tripped",
            timeouts, tripped);
    }
    assert_int_equal(seen.n, 1);
    assert_string_equal(seen.policy, "spin");
    assert_string_equal(seen.tenant, "acme");
    assert_true(seen.until_ms > (int64_t)(time(NULL) + 50) * 1000);
    assert_contains(seen.last_error, "deadline");

    /* a call submitted now is answered at once */
    tcall_init(&once, fixture_policy(&f, "spin"), HUB_POLICY_MATCH, "a", "spin", NULL);
    t0 = now_ms();
    assert_int_equal(hub_policies_submit(f.ps, &once.c), 1);
    assert_true(now_ms() - t0 < 5.0);
    assert_int_equal(once.c.status, HUB_POLICY_TRIPPED);
    assert_int_equal(once.c.matched, 1);
    assert_contains(once.c.err, "match: spin.lua: tripped until");
    /* ... for its tenant: another tenant's calls of it still run (SPEC §8:
     * one tenant's events that make it overrun stop it for the others) */
    tcall_init(&once, fixture_policy(&f, "spin"), HUB_POLICY_MATCH, "b", "spin", NULL);
    once.c.ev.tenant = "other";
    assert_int_equal(hub_policies_submit(f.ps, &once.c), 0);
    run_until_done(&f.loop, &once, 1);
    assert_int_equal(once.c.status, HUB_POLICY_TIMEOUT);
    /* ... and another policy's calls run */
    tcall_init(&once, fixture_policy(&f, "quick"), HUB_POLICY_MATCH, "a", "no", NULL);
    assert_int_equal(hub_policies_submit(f.ps, &once.c), 0);
    run_until_done(&f.loop, &once, 1);
    assert_int_equal(once.c.matched, 0);

    e = admin_entry(f.ps, "spin");
    assert_string_equal(json_string_value(json_object_get(e, "state")), "tripped");
    assert_true(json_is_string(json_object_get(e, "tripped_until")));
    assert_int_equal(json_integer_value(json_object_get(e, "trips")), 1);
    assert_int_equal(json_array_size(json_object_get(e, "tripped_tenants")), 1);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(e, "tripped_tenants"), 0), "tenant")),
                        "acme");
    assert_contains(json_string_value(json_object_get(e, "last_call_error")), "deadline");
    assert_true(json_is_null(json_object_get(e, "last_error"))); /* the load's */
    json_decref(e);
    e = admin_entry(f.ps, "quick");
    assert_string_equal(json_string_value(json_object_get(e, "state")), "ok");
    json_decref(e);
    m = metrics_text(f.ps);
    assert_contains(m, "streaming_hub_policy_trips_total{policy=\"spin\"} 1\n");
    assert_contains(m, "streaming_hub_policies_tripped 1\n");
    free(m);

    /* a reload clears it: the calls run (and time out) again */
    reload_and_wait(&f);
    e = admin_entry(f.ps, "spin");
    assert_string_equal(json_string_value(json_object_get(e, "state")), "ok");
    assert_true(json_is_null(json_object_get(e, "tripped_until")));
    json_decref(e);
    tcall_init(&once, fixture_policy(&f, "spin"), HUB_POLICY_MATCH, "a", "spin", NULL);
    assert_int_equal(hub_policies_submit(f.ps, &once.c), 0);
    run_until_done(&f.loop, &once, 1);
    assert_int_equal(once.c.status, HUB_POLICY_TIMEOUT);
    m = metrics_text(f.ps);
    assert_contains(m, "streaming_hub_policies_tripped 0\n");
    free(m);
    fixture_stop(&f);
}

/* Each tenant trips on its own; once every trip slot holds a cool-down,
 * the tenants without one count together, and trip it for every tenant
 * (a policy that overruns for that many is at fault, not their events). */
static void test_trips_are_per_tenant_until_too_many(void **state) {
    (void)state;
    struct hub_policy_limits lim = {.timeout_ms = 10,
                                    .memory_bytes = 16 * MIB,
                                    .threads = 1,
                                    .trip_failures = 2,
                                    .trip_window_ms = 10000,
                                    .trip_cooldown_ms = 60000};
    struct fixture f;
    struct tcall t;
    struct trip_seen seen = {0};
    char tenant[POLICY_TRIP_SLOTS + 3][16];
    json_t *e;

    loop_thread = pthread_self();
    fixture_start(&f, &lim);
    hub_policies_on_trip(f.ps, on_trip, &seen);
    /* 64 tenants trip it, each with its two timeouts; a 65th's timeout and
     * a 66th's (no slot left for either) count together: the second of
     * them trips it for every tenant, not the first */
    for (int i = 0; i < POLICY_TRIP_SLOTS + 2; i++) {
        int own = i < POLICY_TRIP_SLOTS ? 2 : 1;
        snprintf(tenant[i], sizeof(tenant[i]), "t%d", i);
        for (int k = 0; k < own; k++) {
            tcall_init(&t, fixture_policy(&f, "spin"), HUB_POLICY_MATCH, tenant[i], "spin", NULL);
            t.c.ev.tenant = tenant[i];
            assert_int_equal(hub_policies_submit(f.ps, &t.c), 0);
            run_until_done(&f.loop, &t, 1);
            assert_int_equal(t.c.status, HUB_POLICY_TIMEOUT); /* never stopped by another's */
        }
        assert_int_equal(
            seen.n, i < POLICY_TRIP_SLOTS ? i + 1 : POLICY_TRIP_SLOTS + (i > POLICY_TRIP_SLOTS));
        if (i < POLICY_TRIP_SLOTS) {
            assert_string_equal(seen.tenant, tenant[i]);
        }
    }
    assert_string_equal(seen.tenant, "*");
    snprintf(tenant[POLICY_TRIP_SLOTS + 2], sizeof(tenant[0]), "fresh");
    tcall_init(&t, fixture_policy(&f, "spin"), HUB_POLICY_MATCH, "fresh", "spin", NULL);
    t.c.ev.tenant = tenant[POLICY_TRIP_SLOTS + 2];
    assert_int_equal(hub_policies_submit(f.ps, &t.c), 1);
    assert_int_equal(t.c.status, HUB_POLICY_TRIPPED);
    e = admin_entry(f.ps, "spin");
    assert_int_equal(json_array_size(json_object_get(e, "tripped_tenants")), POLICY_TRIP_SLOTS + 1);
    assert_int_equal(json_integer_value(json_object_get(e, "trips")), POLICY_TRIP_SLOTS + 1);
    json_decref(e);
    fixture_stop(&f);
}

/* After the cool-down the calls run again, and it takes trip_failures
 * fresh failures to trip it again; failures further apart than the window
 * never trip it. */
static void test_cooldown_ends_and_window_slides(void **state) {
    (void)state;
    struct hub_policy_limits lim = {.timeout_ms = 10,
                                    .memory_bytes = 16 * MIB,
                                    .threads = 2,
                                    .trip_failures = 2,
                                    .trip_window_ms = 150,
                                    .trip_cooldown_ms = 200};
    struct fixture f;
    struct tcall t[2], once;
    struct trip_seen seen = {0};

    loop_thread = pthread_self();
    fixture_start(&f, &lim);
    hub_policies_on_trip(f.ps, on_trip, &seen);
    /* two failures 300 ms apart: outside the window */
    for (int i = 0; i < 2; i++) {
        tcall_init(&once, fixture_policy(&f, "spin"), HUB_POLICY_MATCH, "a", "spin", NULL);
        assert_int_equal(hub_policies_submit(f.ps, &once.c), 0);
        run_until_done(&f.loop, &once, 1);
        assert_int_equal(once.c.status, HUB_POLICY_TIMEOUT);
        usleep(300 * 1000);
    }
    assert_int_equal(seen.n, 0);
    /* two at once: tripped */
    for (int i = 0; i < 2; i++) {
        tcall_init(&t[i], fixture_policy(&f, "spin"), HUB_POLICY_MATCH, "a", "spin", NULL);
        assert_int_equal(hub_policies_submit(f.ps, &t[i].c), 0);
    }
    run_until_done(&f.loop, t, 2);
    assert_int_equal(seen.n, 1);
    tcall_init(&once, fixture_policy(&f, "spin"), HUB_POLICY_MATCH, "a", "spin", NULL);
    assert_int_equal(hub_policies_submit(f.ps, &once.c), 1);
    /* past the cool-down: it runs again */
    usleep(250 * 1000);
    tcall_init(&once, fixture_policy(&f, "spin"), HUB_POLICY_MATCH, "a", "spin", NULL);
    assert_int_equal(hub_policies_submit(f.ps, &once.c), 0);
    run_until_done(&f.loop, &once, 1);
    assert_int_equal(once.c.status, HUB_POLICY_TIMEOUT);
    assert_int_equal(seen.n, 1); /* one failure since: not tripped again yet */
    fixture_stop(&f);
}

/* --------------------------------------------------------- generations -- */

/* A call holds the version it was submitted with: after a reload that
 * changes the file, a call on the old generation's version still runs the
 * old code, one on the new the new; the old version is freed when its
 * generation is released (ASan checks the frees). */
static void test_calls_keep_their_generation(void **state) {
    (void)state;
    struct hub_policy_limits lim = {.timeout_ms = 50, .memory_bytes = 16 * MIB, .threads = 2};
    struct fixture f;
    struct hub_policy_gen *old;
    struct tcall t[2];

    loop_thread = pthread_self();
    fixture_start(&f, &lim);
    write_file(f.dir, "gen.lua", "return { shape = function(ev) return 'v1' end }\n");
    reload_and_wait(&f);
    old = hub_policies_acquire(f.ps);
    write_file(f.dir, "gen.lua", "return { shape = function(ev) return 'v2' end }\n");
    reload_and_wait(&f);
    assert_true(hub_policy_gen_number(f.gen) > hub_policy_gen_number(old));
    tcall_init(&t[0], hub_policy_gen_find(old, "gen"), HUB_POLICY_SHAPE, "s", "e1", NULL);
    tcall_init(&t[1], fixture_policy(&f, "gen"), HUB_POLICY_SHAPE, "s", "e1", NULL);
    assert_int_equal(hub_policies_submit(f.ps, &t[0].c), 0);
    assert_int_equal(hub_policies_submit(f.ps, &t[1].c), 0);
    run_until_done(&f.loop, t, 2);
    assert_memory_equal(t[0].c.shaped.body, "v1", 2);
    assert_memory_equal(t[1].c.shaped.body, "v2", 2);
    hub_policy_shaped_free(&t[0].c.shaped);
    hub_policy_shaped_free(&t[1].c.shaped);
    hub_policy_gen_release(old);
    fixture_stop(&f);
}

/* ------------------------------------------------------------ deadline -- */

struct busy {
    pthread_t th;
    volatile int stop;
};

static void *busy_main(void *arg) {
    struct busy *b = arg;
    while (!b->stop) {
    }
    return NULL;
}

/* Pins the calling thread to CPU 0 and starts n threads spinning there. */
static void crowd_cpu0(struct busy *b, int n, cpu_set_t *saved) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    assert_int_equal(pthread_getaffinity_np(pthread_self(), sizeof(*saved), saved), 0);
    assert_int_equal(pthread_setaffinity_np(pthread_self(), sizeof(one), &one), 0);
    for (int i = 0; i < n; i++) {
        pthread_attr_t attr;
        b[i].stop = 0;
        pthread_attr_init(&attr);
        pthread_attr_setaffinity_np(&attr, sizeof(one), &one);
        assert_int_equal(pthread_create(&b[i].th, &attr, busy_main, &b[i]), 0);
        pthread_attr_destroy(&attr);
    }
}

static void uncrowd(struct busy *b, int n, const cpu_set_t *saved) {
    for (int i = 0; i < n; i++) {
        b[i].stop = 1;
        pthread_join(b[i].th, NULL);
    }
    pthread_setaffinity_np(pthread_self(), sizeof(*saved), saved);
}

static const char COUNT[] = "return { match = function(ev)\n"
                            "  for i = 1, tonumber(ev.id) do end\n"
                            "  return true\n"
                            "end }\n";

/*
 * A call that needs about a third of its deadline in CPU time succeeds on a
 * thread that shares its core with two spinning threads, so that it takes
 * longer than the deadline on the clock: the deadline counts CPU time.
 * A run proves it only when the call took longer than its deadline on the
 * clock and less than the wall-clock backstop (4 deadlines): stopped there,
 * the deadline counted wall time, and the test fails.  A run outside that
 * window (the machine's own load can starve the core past the backstop)
 * says nothing either way and is tried again, a few times, then skipped.
 */
static void test_deadline_counts_cpu_time(void **state) {
    (void)state;
    struct hub_policy_limits lim = {.timeout_ms = 20, .memory_bytes = 16 * MIB};
    char err[512], id[32];
    struct hub_policy *p =
        hub_policy_compile("count", COUNT, strlen(COUNT), &lim, err, sizeof(err));
    struct hub_policy_event ev = {.id = id, .body = "{}", .body_len = 2};
    double deadline = (double)lim.timeout_ms, backstop = 4.0 * deadline;
    struct busy b[2];
    cpu_set_t saved;
    double c0, t0, cpu, wall, per_iter;
    int matched = 0, proved = 0;
    enum hub_policy_status st;

    assert_non_null(p);
    /* calibrate: iterations per ms of CPU, alone */
    snprintf(id, sizeof(id), "%d", 200000);
    c0 = thread_cpu_ms();
    assert_int_equal(hub_policy_match(p, &ev, &matched, err, sizeof(err)), HUB_POLICY_OK);
    per_iter = (thread_cpu_ms() - c0) / 200000.0;
    /* ~7 ms of CPU: about 20 ms on the clock with a third of the core */
    snprintf(id, sizeof(id), "%.0f", 7.0 / per_iter);

    for (int run = 0; run < 8 && !proved; run++) {
        crowd_cpu0(b, 2, &saved);
        t0 = now_ms();
        c0 = thread_cpu_ms();
        st = hub_policy_match(p, &ev, &matched, err, sizeof(err));
        cpu = thread_cpu_ms() - c0;
        wall = now_ms() - t0;
        uncrowd(b, 2, &saved);
        printf("policy: a call of %.1f ms CPU took %.1f ms on a core shared with 2 spinning "
               "threads (deadline %.0f ms, backstop %.0f ms): %s\n",
               cpu, wall, deadline, backstop, hub_policy_status_str(st));
        if (wall <= deadline || wall >= backstop) {
            continue; /* no proof either way */
        }
        if (st != HUB_POLICY_OK) {
            fail_msg("a %.1f ms CPU call over %.1f ms of wall time was stopped: %s", cpu, wall,
                     err);
        }
        proved = 1;
    }
    hub_policy_unref(p);
    if (!proved) {
        printf("policy: the machine never gave the call a run between its deadline and the "
               "backstop on the clock: not proved here\n");
        skip();
    }
}

/* A call that gets almost no CPU (eight spinning threads on its core) is
 * still stopped by the wall-clock backstop, a few deadlines in: once it has
 * run 4 deadlines on the clock and used a quarter of its deadline in CPU
 * time, whichever comes last. */
static void test_deadline_wall_backstop(void **state) {
    (void)state;
    struct hub_policy_limits lim = {.timeout_ms = 10, .memory_bytes = 16 * MIB};
    char err[512];
    struct hub_policy *p = hub_policy_compile("spin", SPIN, strlen(SPIN), &lim, err, sizeof(err));
    struct hub_policy_event ev = {.id = "e1", .body = "{}", .body_len = 2};
    struct busy b[8];
    cpu_set_t saved;
    double t0, c0, cpu, wall;
    int matched = 0;
    enum hub_policy_status st;

    assert_non_null(p);
    crowd_cpu0(b, 8, &saved);
    t0 = now_ms();
    c0 = thread_cpu_ms();
    st = hub_policy_match(p, &ev, &matched, err, sizeof(err));
    cpu = thread_cpu_ms() - c0;
    wall = now_ms() - t0;
    uncrowd(b, 8, &saved);
    printf("policy: a runaway call given ~1/9 of a core was stopped after %.1f ms (%.1f ms CPU), "
           "deadline %lld ms\n",
           wall, cpu, (long long)lim.timeout_ms);
    assert_int_equal(st, HUB_POLICY_TIMEOUT);
    /* past both, the next check stops it: well past both, the backstop
     * failed (the scheduler's slices come on top of the wall time, a few
     * checks' worth of work on top of the CPU time) */
    if (wall > 4.0 * (double)lim.timeout_ms + 60.0 && cpu > (double)lim.timeout_ms / 4.0 + 2.0) {
        fail_msg("stopped after %.1f ms of wall time and %.1f ms of CPU, past the backstop", wall,
                 cpu);
    }
    hub_policy_unref(p);
}

/* A reload that cannot read the directory (moved away while it is
 * replaced) keeps the loaded policies: it published an empty generation,
 * and every subscription naming a policy failed its attempts. */
static void test_unreadable_directory_keeps_the_policies(void **state) {
    (void)state;
    struct hub_policy_limits lim = {.timeout_ms = 50, .memory_bytes = 16 * MIB, .threads = 1};
    struct fixture f;
    char moved[80];
    char *m;

    fixture_start(&f, &lim);
    snprintf(moved, sizeof(moved), "%s.moved", f.dir);
    assert_int_equal(rename(f.dir, moved), 0);
    reload_and_wait(&f);
    assert_non_null(hub_policy_gen_find(f.gen, "quick"));
    m = metrics_text(f.ps);
    assert_contains(m, "streaming_hub_policy_reloads_total{result=\"error\"} 1");
    free(m);
    m = hub_policies_json(f.ps);
    assert_contains(m, "\"reload_error\":\"cannot read the policy directory");
    free(m);
    assert_int_equal(rename(moved, f.dir), 0);
    reload_and_wait(&f);
    assert_non_null(hub_policy_gen_find(f.gen, "quick"));
    m = hub_policies_json(f.ps);
    assert_contains(m, "\"reload_error\":null");
    free(m);
    fixture_stop(&f);
}

#define T(f) cmocka_unit_test_setup_teardown(f, watchdog_arm, watchdog_disarm)

int main(void) {
    const struct CMUnitTest tests[] = {
        T(test_calls_come_back_on_the_loop),
        T(test_keys_take_turns),
        T(test_tenants_take_turns),
        T(test_shape_rides_with_match),
        T(test_timeouts_trip_the_policy_until_a_reload),
        T(test_trips_are_per_tenant_until_too_many),
        T(test_cooldown_ends_and_window_slides),
        T(test_calls_keep_their_generation),
        T(test_deadline_counts_cpu_time),
        T(test_deadline_wall_backstop),
        T(test_unreadable_directory_keeps_the_policies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
