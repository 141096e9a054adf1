/*
 * Unit tests of the policy workbench's result (src/policy_test.h): what
 * hub_policy_try_run() reports for each function, the result object of the
 * dry-run contract, bodies that are not UTF-8, and the line an error names.
 * The command and the endpoint are tested end to end by
 * tests/integration/test_policy_workbench.sh.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <jansson.h>

/* by its path: tests/unit/policy_test.h (the unit tests' watchdog) has the
 * same name and comes first on this directory's include path */
#include "../../src/policy_test.h"

#define MIB (1024 * 1024)

static const struct hub_policy_limits lim = {.timeout_ms = 50, .memory_bytes = 16 * MIB};

static struct hub_policy *compile(const char *src) {
    char err[512];
    struct hub_policy *p = hub_policy_compile("wb", src, strlen(src), &lim, err, sizeof(err));
    if (p == NULL) {
        fail_msg("compile: %s", err);
    }
    return p;
}

static struct hub_policy_event event(const char *body) {
    return (struct hub_policy_event){.id = "e1",
                                     .source = "/s",
                                     .type = "studio.lerian.transaction.posted",
                                     .event_type = "transaction.posted",
                                     .tenant = "acme",
                                     .content_type = "application/json",
                                     .schema_major = 1,
                                     .body = body,
                                     .body_len = strlen(body)};
}

/* match false, shape with a header, retry as a delay: all three reported,
 * and the JSON carries them in the contract's members. */
static void test_all_three_functions(void **state) {
    struct hub_policy *p =
        compile("return { match = function(ev) return ev.data.n > 5 end,"
                " shape = function(ev) return {n = ev.data.n}, {['X-K'] = 'v'} end,"
                " retry = function(ctx) return ctx.status == 503 and 7 or nil end }");
    struct hub_policy_event ev = event("{\"n\":1}");
    struct hub_policy_retry_ctx rc = {.attempt = 2, .status = 503, .error = "status"};
    struct hub_policy_try t;
    json_t *o;

    (void)state;
    hub_policy_try_run(p, &ev, &rc, &t);
    assert_int_equal(t.err_fn, -1);
    assert_int_equal(t.matched, 0);
    assert_int_equal(t.action, HUB_POLICY_RETRY_DELAY);
    assert_int_equal(t.delay_ms, 7000);
    assert_true(t.memory_bytes > 0);
    o = hub_policy_try_json(&t, "wb", &rc, ev.body, ev.body_len);
    assert_non_null(o);
    assert_true(json_is_false(json_object_get(o, "match")));
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "shape"), "body")),
                        "{\"n\":1}");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_object_get(o, "shape"), "headers"), "X-K")),
                        "v");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(o, "retry"), "delay_ms")),
                     7000);
    assert_true(json_is_null(json_object_get(o, "error")));
    json_decref(o);
    hub_policy_try_free(&t);
    hub_policy_unref(p);
}

/* A retry table: the step for the attempt, its upper bound; past the table
 * the job would be dead. */
static void test_schedule_steps_and_dead(void **state) {
    struct hub_policy *p = compile("return { retry = {'10s', '1m'} }");
    struct hub_policy_event ev = event("{}");
    struct hub_policy_retry_ctx rc = {.attempt = 2, .status = 500, .error = "status"};
    struct hub_policy_try t;
    json_t *o;

    (void)state;
    hub_policy_try_run(p, &ev, &rc, &t);
    assert_int_equal(t.action, HUB_POLICY_RETRY_SCHEDULE);
    assert_int_equal(t.delay_ms, 60000);
    assert_int_equal(t.from_policy, 1);
    hub_policy_try_free(&t);
    rc.attempt = 3;
    hub_policy_try_run(p, &ev, &rc, &t);
    assert_int_equal(t.action, HUB_POLICY_RETRY_DEAD);
    o = hub_policy_try_json(&t, "wb", &rc, ev.body, ev.body_len);
    assert_true(json_is_null(json_object_get(json_object_get(o, "retry"), "delay_ms")));
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "retry"), "action")),
                        "dead");
    /* no match and no shape: matched, and the stored body would be sent */
    assert_true(json_is_true(json_object_get(o, "match")));
    assert_true(json_is_null(json_object_get(o, "shape")));
    json_decref(o);
    hub_policy_try_free(&t);
    hub_policy_unref(p);
}

/* The first error is reported with its function, kind and line; match is
 * null then, and a runaway is a timeout. */
static void test_errors_name_function_kind_and_line(void **state) {
    struct hub_policy *p = compile("return {\n"
                                   "  match = function(ev)\n"
                                   "    return ev.data.missing.x\n"
                                   "  end,\n"
                                   "  shape = function(ev) while true do end end,\n"
                                   "}\n");
    struct hub_policy_event ev = event("{}");
    struct hub_policy_retry_ctx rc = {.attempt = 1, .status = 500, .error = "status"};
    struct hub_policy_try t;
    json_t *o, *e;

    (void)state;
    hub_policy_try_run(p, &ev, &rc, &t);
    assert_int_equal(t.err_fn, HUB_POLICY_MATCH);
    assert_int_equal(t.st[HUB_POLICY_SHAPE], HUB_POLICY_TIMEOUT);
    o = hub_policy_try_json(&t, "wb", &rc, ev.body, ev.body_len);
    e = json_object_get(o, "error");
    assert_string_equal(json_string_value(json_object_get(e, "function")), "match");
    assert_string_equal(json_string_value(json_object_get(e, "kind")), "error");
    assert_int_equal(json_integer_value(json_object_get(e, "line")), 3);
    assert_true(json_is_null(json_object_get(o, "match")));
    assert_true(json_is_null(json_object_get(o, "shape")));
    json_decref(o);
    hub_policy_try_free(&t);
    hub_policy_unref(p);
}

/* Bodies are text, or base64 with "<key>_encoding" when not UTF-8. */
static void test_body_encoding(void **state) {
    json_t *o = json_object();
    static const char bin[] = {'\xff', '\x00', 'a'};

    (void)state;
    assert_int_equal(hub_policy_body_set(o, "body", "h\xc3\xa9", 3), 0);
    assert_string_equal(json_string_value(json_object_get(o, "body")), "h\xc3\xa9");
    assert_null(json_object_get(o, "body_encoding"));
    assert_int_equal(hub_policy_body_set(o, "stored_body", bin, sizeof(bin)), 0);
    assert_string_equal(json_string_value(json_object_get(o, "stored_body")), "/wBh");
    assert_string_equal(json_string_value(json_object_get(o, "stored_body_encoding")), "base64");
    json_decref(o);
}

static void test_error_line(void **state) {
    (void)state;
    assert_int_equal(hub_policy_error_line("match: wb.lua:12: boom", "wb"), 12);
    assert_int_equal(hub_policy_error_line("error(\"wb.lua: no\") wb.lua:4: x", "wb"), 4);
    assert_int_equal(hub_policy_error_line("shape: wb.lua: ran past its deadline", "wb"), 0);
    assert_int_equal(hub_policy_error_line("other.lua:3: x", "wb"), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_three_functions),
        cmocka_unit_test(test_schedule_steps_and_dead),
        cmocka_unit_test(test_errors_name_function_kind_and_line),
        cmocka_unit_test(test_body_encoding),
        cmocka_unit_test(test_error_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
