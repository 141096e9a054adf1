/*
 * Out of memory is never a verdict, and never a partial write (issue 23):
 *   - the envelope parser reports an allocation failure as
 *     HUB_ENVELOPE_NOMEM ("out_of_memory"), not as an invalid envelope, and
 *     the same record parses once memory is back;
 *   - a PostgreSQL array that ran out of memory marks its transaction
 *     failed: submit completes it with HUB_PG_ENOMEM, sending nothing, also
 *     the statements added before it.
 * This file defines hub_fault() (src/fault.h), which replaces the hub's
 * no-op at link time: `fail_next[point]` calls at a point fail.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <uv.h>

#include "envelope.h"
#include "error.h"
#include "fault.h"
#include "pg.h"
#include "pg_array.h"

/* How many of the next calls fail, per point this test uses. */
static int fail_envelope;
static int fail_array;

int hub_fault(const char *point) {
    int *left = strcmp(point, "envelope_alloc") == 0 ? &fail_envelope
                : strcmp(point, "pg_array") == 0     ? &fail_array
                                                     : NULL;
    if (left == NULL || *left <= 0) {
        return 0;
    }
    (*left)--;
    return 1;
}

/* A valid binary-mode Kafka record's headers. */
static const struct hub_header headers[] = {
    {"ce-specversion", 14, "1.0", 3},
    {"ce-id", 5, "oom-1", 5},
    {"ce-source", 9, "/oom", 4},
    {"ce-type", 7, "studio.lerian.account.created", 29},
    {"ce-time", 7, "2026-01-01T00:00:00Z", 20},
    {"ce-tenantid", 11, "acme", 4},
    {"content-type", 12, "application/json", 16},
};

static int parse(struct hub_event *ev, struct hub_envelope_error *err) {
    static const char payload[] = "{\"n\":1}";
    return hub_envelope_parse(HUB_ENVELOPE_KAFKA, headers, sizeof(headers) / sizeof(headers[0]),
                              payload, sizeof(payload) - 1, "lerian.streaming.t", NULL, ev, err);
}

static void test_envelope_out_of_memory_is_not_a_verdict(void **state) {
    struct hub_event ev;
    struct hub_envelope_error err;
    (void)state;

    fail_envelope = 1;
    assert_int_equal(parse(&ev, &err), -1);
    assert_int_equal(err.reason, HUB_ENVELOPE_NOMEM);
    assert_string_equal(hub_envelope_reason_str(err.reason), "out_of_memory");
    assert_null(ev.id); /* nothing to free */
    /* the same record, memory back: a valid event */
    assert_int_equal(parse(&ev, &err), 0);
    assert_string_equal(ev.id, "oom-1");
    hub_event_free(&ev);
}

/* The outcome a transaction completed with. */
struct seen {
    int calls;
    enum hub_pg_status status;
    int n_results;
    char error[128];
};

static void txn_cb(void *arg, const struct hub_pg_outcome *out) {
    struct seen *s = arg;
    s->calls++;
    s->status = out->status;
    s->n_results = out->n_results;
    snprintf(s->error, sizeof(s->error), "%s", out->error ? out->error : "");
}

static const struct hub_sql sql_a = {"oom_test_a", "SELECT 1", 0};
static const struct hub_sql sql_b = {"oom_test_b", "SELECT $1::int4[]", 0};

static void test_array_out_of_memory_fails_the_transaction(void **state) {
    uv_loop_t loop;
    struct hub_pg *pg;
    struct hub_pg_txn *txn;
    struct hub_pgarr a;
    struct seen seen = {0};
    (void)state;

    uv_loop_init(&loop);
    /* a pool that never connects: nothing here may be sent anyway */
    pg = hub_pg_new(&loop, "host=/nonexistent-socket-dir dbname=none", 1, "oom-test", NULL);
    assert_non_null(pg);
    txn = hub_pg_txn_new(pg, txn_cb, &seen);
    assert_non_null(txn);
    assert_int_equal(hub_pg_txn_add(txn, &sql_a, 0, NULL, NULL, NULL), 0);
    fail_array = 1; /* the array's first buffer */
    hub_pgarr_init(&a, HUB_OID_INT4);
    hub_pgarr_add_i32(&a, 7);
    assert_int_equal(hub_pgarr_txn_add(txn, &sql_b, &a, 1), HUB_ENOMEM);
    hub_pg_txn_submit(txn);
    /* completed at once, inside submit, without a connection */
    assert_int_equal(seen.calls, 1);
    assert_int_equal(seen.status, HUB_PG_ENOMEM);
    assert_int_equal(seen.n_results, 0);
    assert_non_null(strstr(seen.error, "out of memory"));
    hub_pg_close(pg, NULL, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_envelope_out_of_memory_is_not_a_verdict),
        cmocka_unit_test(test_array_out_of_memory_fails_the_transaction),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
