/*
 * pg_pool_probe — drives src/pg.c's lanes (hub_pg_lane) against a real
 * PostgreSQL and checks the promise of pg.h: a transaction submitted while
 * another of its lane is queued or in flight runs only if that one
 * committed, however long it waits for a connection.
 *
 *   pg_pool_probe DSN [DSN2]
 *
 * DSN2 (optional) names two hosts, the first refusing connections: libpq
 * gives the first up and opens a socket for the second, which usually gets
 * the same descriptor number; the pool must still watch it (a query on a
 * pool of DSN2 must come back).
 *
 * One connection, whose statements PostgreSQL runs in the order sent.  Eight
 * fillers (pg_sleep 0.1 s) take its eight slots; then T1 (lane L, fails:
 * 1/0), eight X (no lane) and T2 (lane L, inserts a row) wait in the queue.
 * As the fillers end, T1 and seven X take their slots; T1 ends (failed)
 * before the eighth X is sent, so T2 reaches the head of the queue with
 * nothing of its lane in flight, and goes when the first X ends.  T2 must
 * fail with
 * HUB_PG_LANE_SQLSTATE and insert nothing (test_pg_pool.sh counts the
 * rows): on the build before, the lane had nothing in flight by then, so T2
 * went unchecked and committed.
 *
 * Prints "ok <what>" or "FAIL <what>: <why>" per check; exits 0 only when
 * every check passed (2 on bad usage or a stuck loop).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "pg.h"

#define PROBE_WATCHDOG_MS 30000

struct done {
    int calls;
    enum hub_pg_status status;
    char sqlstate[8];
    char error[160];
};

static int failures;

static void check(int ok, const char *what, const char *why) {
    printf(ok ? "ok %s\n" : "FAIL %s: %s\n", what, why);
    failures += !ok;
}

static void on_done(void *arg, const struct hub_pg_outcome *out) {
    struct done *d = arg;
    d->calls++;
    d->status = out->status;
    snprintf(d->sqlstate, sizeof(d->sqlstate), "%s", out->sqlstate ? out->sqlstate : "");
    snprintf(d->error, sizeof(d->error), "%s", out->error ? out->error : "");
}

static void watchdog_cb(uv_timer_t *t) {
    (void)t;
    printf("FAIL watchdog: nothing finished within %d ms\n", PROBE_WATCHDOG_MS);
    exit(2);
}

/* Runs the loop until every done[0..n) was called. */
static void wait_all(uv_loop_t *loop, struct done *d, size_t n) {
    for (;;) {
        size_t k = 0;
        while (k < n && d[k].calls > 0) {
            k++;
        }
        if (k == n) {
            return;
        }
        uv_run(loop, UV_RUN_ONCE);
    }
}

static void submit(struct hub_pg *pg, const struct hub_sql *sql, struct hub_pg_lane *lane,
                   struct done *d) {
    struct hub_pg_txn *txn = hub_pg_txn_new(pg, on_done, d);
    if (txn == NULL) {
        exit(2);
    }
    hub_pg_txn_add(txn, sql, 0, NULL, NULL, NULL);
    if (lane != NULL) {
        hub_pg_txn_lane(txn, lane);
    }
    hub_pg_txn_submit(txn);
}

int main(int argc, char **argv) {
    static const struct hub_sql create = {"probe_create",
                                          "CREATE TABLE IF NOT EXISTS pg_pool_probe (n int)", 0};
    static const struct hub_sql truncate = {"probe_truncate", "TRUNCATE pg_pool_probe", 0};
    static const struct hub_sql sleep = {"probe_sleep", "SELECT pg_sleep(0.1)", 0};
    static const struct hub_sql fail = {"probe_fail", "SELECT 1 / 0", 0};
    static const struct hub_sql plain = {"probe_plain", "SELECT 1", 0};
    static const struct hub_sql insert = {"probe_insert", "INSERT INTO pg_pool_probe VALUES (2)",
                                          0};
    uv_loop_t loop;
    uv_timer_t watchdog;
    struct hub_pg *pg;
    struct hub_pg_lane lane;
    struct done first = {0}, fillers[8], t1 = {0}, x[8], t2 = {0};
    struct hub_pg_txn *txn;
    char why[256];

    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: pg_pool_probe DSN [DSN2]\n");
        return 2;
    }
    memset(fillers, 0, sizeof(fillers));
    memset(x, 0, sizeof(x));
    memset(&lane, 0, sizeof(lane));
    uv_loop_init(&loop);
    uv_timer_init(&loop, &watchdog);
    uv_timer_start(&watchdog, watchdog_cb, PROBE_WATCHDOG_MS, 0);
    uv_unref((uv_handle_t *)&watchdog);
    if ((pg = hub_pg_new(&loop, argv[1], 1, "pg-lane-probe", NULL)) == NULL) {
        return 2;
    }
    /* the connection is up and the table empty before the slots fill */
    if ((txn = hub_pg_txn_new(pg, on_done, &first)) == NULL) {
        return 2;
    }
    hub_pg_txn_add(txn, &create, 0, NULL, NULL, NULL);
    hub_pg_txn_add(txn, &truncate, 0, NULL, NULL, NULL);
    hub_pg_txn_submit(txn);
    wait_all(&loop, &first, 1);
    check(first.status == HUB_PG_OK, "the probe's table is ready", first.error);

    for (int i = 0; i < 8; i++) {
        submit(pg, &sleep, NULL, &fillers[i]);
    }
    submit(pg, &fail, &lane, &t1);
    for (int i = 0; i < 8; i++) {
        submit(pg, &plain, NULL, &x[i]);
    }
    submit(pg, &insert, &lane, &t2);
    wait_all(&loop, fillers, 8);
    wait_all(&loop, &t1, 1);
    wait_all(&loop, x, 8);
    wait_all(&loop, &t2, 1);

    check(t1.status == HUB_PG_ESTMT && strcmp(t1.sqlstate, "22012") == 0, "T1 (lane, 1/0) failed",
          t1.error);
    check(x[0].status == HUB_PG_OK && x[7].status == HUB_PG_OK, "the X (no lane) ran", x[7].error);
    snprintf(why, sizeof(why), "status %d sqlstate '%s' error '%s'", (int)t2.status, t2.sqlstate,
             t2.error);
    check(t2.status == HUB_PG_ESTMT && strcmp(t2.sqlstate, HUB_PG_LANE_SQLSTATE) == 0,
          "T2, submitted behind T1 on its lane, failed with it", why);

    hub_pg_close(pg, NULL, NULL);

    if (argc == 3) {
        struct done q = {0};
        struct hub_pg *pg2 = hub_pg_new(&loop, argv[2], 1, "pg-lane-probe-2", NULL);
        if (pg2 == NULL) {
            return 2;
        }
        submit(pg2, &plain, NULL, &q);
        wait_all(&loop, &q, 1);
        check(q.status == HUB_PG_OK, "a pool whose first host refuses connects to the second",
              q.error);
        hub_pg_close(pg2, NULL, NULL);
    }
    uv_close((uv_handle_t *)&watchdog, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    return failures == 0 ? 0 : 1;
}
