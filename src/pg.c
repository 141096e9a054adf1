/*
 * pg — asynchronous PostgreSQL pool on libuv (see pg.h for the model).
 *
 * Per connection we keep a ring of "expectations": what the server owes us,
 * in order (a prepare's result, a query's result, a pipeline sync).  Reading
 * results is then a matter of matching each PGresult to the head of the ring,
 * which keeps pipelining of several transactions per connection simple.
 *
 * A transaction's life:
 *
 *   hub_pg_txn_new ──► hub_pg_txn_add* (parameters copied or taken)
 *   ──► hub_pg_txn_submit: the pool's queue ──► pg_pump: the least loaded
 *   connection that is up and has room ──► pg_conn_send: every statement
 *   and one Sync, pipelined ──► pg_conn_read: results matched to the ring
 *   ──► the Sync arrives: txn_complete runs the callback and frees it.
 *
 *   The connection lost meanwhile: every transaction it owed completes with
 *   HUB_PG_ECONN (the outcome is unknown: it may have committed) and the
 *   connection reconnects after a jittered backoff.
 *
 * A connection's states: C_DOWN (waiting to retry) ──► C_CONNECTING
 * (PQconnectPoll) ──► C_UP (pipeline mode) ──► C_DOWN on any error, or
 * C_CLOSED once the pool closes.
 */
#include "pg.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"

/* Transactions in flight per connection.  They are pipelined: each one's
 * results come after those of every transaction sent before it on the same
 * connection, so a slow one delays the others behind it. */
#define PG_MAX_INFLIGHT 8
/* Reconnect delays per connection: doubling from the minimum after each
 * failed attempt, up to the maximum, jittered (pg_conn_schedule_retry). */
#define PG_BACKOFF_MIN_MS 100
#define PG_BACKOFF_MAX_MS 5000

/* Results a never-run transaction answers with (see txn_complete). */
#define HUB_PG_NO_RESULTS 8
/* The error of a transaction that could not be built. */
#define PG_OOM_BUILDING "out of memory building the transaction"
/* The error of a lane transaction failed unsent (pg_conn_send); txn_complete
 * knows it by its address. */
static const char pg_lane_failed[] = "the transaction before it on its lane did not commit";

/* One statement of a transaction, with its parameters.  values, lengths
 * and formats live in one malloc'd block (values is its start); the
 * parameter bytes follow in the same block, unless `owned`. */
struct pg_stmt {
    const struct hub_sql *sql;
    int nparams;
    int result_format; /* 0 text, 1 binary (hub_pg_txn_add_binary) */
    int owned;         /* values[i] are separate malloc'd buffers (hub_pg_txn_add_owned) */
    char **values;
    int *lengths;
    int *formats;
};

/* A transaction: built by the caller, owned by the pool from submit until
 * txn_complete() frees it after the callback. */
struct hub_pg_txn {
    struct hub_pg *pg;
    hub_pg_cb cb;
    void *arg;
    struct pg_stmt *stmts;
    int n_stmts;
    int cap_stmts;
    const char *failed;     /* building it failed (why): submit completes it at once */
    PGresult **results;     /* one per statement, allocated when it is sent */
    PGresult *error_result; /* the failing result, owned via results[] or here */
    char error_text[256];
    struct hub_pg_txn *next; /* pool queue */
    /* its lane (hub_pg_txn_lane), or NULL; counted in lane->queued while
     * queued, in lane->sent once sent */
    struct hub_pg_lane *lane;
    int lane_state;      /* LANE_NONE, LANE_QUEUED or LANE_SENT */
    int lane_check;      /* sent behind another of its lane: the check ran first */
    int lane_behind;     /* submitted while another of its lane was queued or in flight */
    unsigned lane_fails; /* lane->fails then: one more since, and it must not run */
    /* the parameters of the check and the mark (pg_conn_send) */
    char lane_name[32], lane_prev[24], lane_self[24];
    char timeout[24]; /* hub_pg_txn_timeout's, "<ms>ms"; empty: none */
};

enum { LANE_NONE = 0, LANE_QUEUED, LANE_SENT };

/* EXP_SETUP: a statement of our own ahead of one of the transaction's
 * (its result is dropped, its error fails the transaction). */
enum pg_expect_kind { EXP_PREPARE, EXP_SETUP, EXP_QUERY, EXP_SYNC };

/* One thing the server owes a connection, in the order it was sent. */
struct pg_expect {
    enum pg_expect_kind kind;
    struct hub_pg_txn *txn;
    int stmt; /* the statement's index in txn; -1 for EXP_SYNC */
};

enum pg_conn_state { C_DOWN, C_CONNECTING, C_UP, C_CLOSED };

/* The poll handle of one socket.  Separate from the connection because
 * libpq may change sockets while connecting: the old handle is closed (and
 * freed in its close callback) while a new one watches the new socket. */
struct pg_poll {
    uv_poll_t handle;
    struct pg_conn *conn;
    int fd;
    int events;
};

/* One connection of the pool, embedded in hub_pg.conns. */
struct pg_conn {
    struct hub_pg *pg;
    int index; /* in pg->conns, for logs */
    enum pg_conn_state state;
    PGconn *conn;
    struct pg_poll *poll;
    uv_timer_t retry;   /* the reconnect timer */
    int64_t backoff_ms; /* the next reconnect delay, doubling up to PG_BACKOFF_MAX_MS */
    /* statements prepared on this session (compared by address); emptied
     * on reconnect, since a new session has none */
    const struct hub_sql **prepared;
    size_t n_prepared;
    size_t cap_prepared;
    /* ring of expectations: exp[exp_head] is the oldest, exp_len of
     * exp_cap slots are used */
    struct pg_expect *exp;
    size_t exp_head;
    size_t exp_len;
    size_t exp_cap;
    int inflight; /* transactions sent and not completed */
    /* libpq still holds bytes to send: the poll watches for writability
     * too until pg_conn_flush has sent them all */
    int want_write;
    int logged_down; /* log the first failure of a streak only */
};

/* The pool.  Transactions wait in the queue until a connection has room. */
struct hub_pg {
    uv_loop_t *loop;
    char *dsn;
    char *name;
    char *options;         /* PG_OPTIONS plus the pool's own settings */
    struct pg_conn *conns; /* nconns of them */
    int nconns;
    /* submitted, not yet sent: a FIFO through hub_pg_txn.next */
    struct hub_pg_txn *queue_head;
    struct hub_pg_txn *queue_tail;
    size_t queued;
    int closing;           /* hub_pg_close ran: nothing new is accepted */
    int max_inflight;      /* per connection: PG_MAX_INFLIGHT, or hub_pg_set_max_inflight's */
    int lanes;             /* lane ids handed out */
    long long lane_serial; /* the last serial a lane's transaction set */
    int pending_closes;    /* retry timers still closing; the pool is freed at 0 */
    void (*closed_cb)(void *arg);
    void *closed_arg;
    /* hub_pg_listen: the first connection's LISTEN, and who hears it */
    struct hub_sql listen_sql; /* text NULL: none */
    char *listen_text;
    hub_pg_notify_cb listen_cb;
    void *listen_arg;
};

static void pg_conn_start(struct pg_conn *c);
static void pg_conn_lost(struct pg_conn *c, const char *why);
static void pg_pump(struct hub_pg *pg);
static int pg_conn_send(struct pg_conn *c, struct hub_pg_txn *txn);
static void pg_poll_cb(uv_poll_t *handle, int status, int events);

/* ---------------------------------------------------------------- txns -- */

/* An empty transaction; nothing happens until hub_pg_txn_submit.  NULL on
 * OOM (the caller then has no callback to wait for). */
struct hub_pg_txn *hub_pg_txn_new(struct hub_pg *pg, hub_pg_cb cb, void *arg) {
    struct hub_pg_txn *txn = calloc(1, sizeof(*txn));
    if (txn == NULL) {
        return NULL;
    }
    txn->pg = pg;
    txn->cb = cb;
    txn->arg = arg;
    return txn;
}

/* Appends sql with a copy of its parameters (see hub_pg_txn_add); a
 * failure marks txn, which then fails at submit.  Returns 0 or -1. */
static int txn_add(struct hub_pg_txn *txn, const struct hub_sql *sql, int nparams,
                   const char *const *values, const int *lengths, const int *formats,
                   int result_format) {
    struct pg_stmt *st;
    size_t total = 0;
    char *p;

    if (txn->n_stmts == txn->cap_stmts) {
        int cap = txn->cap_stmts ? txn->cap_stmts * 2 : 4;
        struct pg_stmt *s = realloc(txn->stmts, sizeof(*s) * (size_t)cap);
        if (s == NULL) {
            hub_pg_txn_fail(txn, PG_OOM_BUILDING);
            return -1;
        }
        txn->stmts = s;
        txn->cap_stmts = cap;
    }
    st = &txn->stmts[txn->n_stmts];
    memset(st, 0, sizeof(*st));
    st->sql = sql;
    st->nparams = nparams;
    st->result_format = result_format;

    /* One block per statement: pointer array, lengths, formats, then bytes.
     * A text parameter is measured with strlen; every copy gets a NUL so
     * that libpq may read text values as C strings. */
    for (int i = 0; i < nparams; i++) {
        if (values[i] != NULL) {
            size_t len = (formats && formats[i]) ? (size_t)lengths[i] : strlen(values[i]);
            total += len + 1;
        }
    }
    p = malloc(sizeof(char *) * (size_t)nparams + 2 * sizeof(int) * (size_t)nparams + total + 1);
    if (p == NULL) {
        hub_pg_txn_fail(txn, PG_OOM_BUILDING);
        return -1;
    }
    st->values = (char **)p;
    st->lengths = (int *)(p + sizeof(char *) * (size_t)nparams);
    st->formats = st->lengths + nparams;
    p = (char *)(st->formats + nparams);
    for (int i = 0; i < nparams; i++) {
        int binary = formats ? formats[i] : 0;
        st->formats[i] = binary;
        if (values[i] == NULL) {
            st->values[i] = NULL;
            st->lengths[i] = 0;
            continue;
        }
        size_t len = binary ? (size_t)lengths[i] : strlen(values[i]);
        memcpy(p, values[i], len);
        p[len] = '\0';
        st->values[i] = p;
        st->lengths[i] = (int)len;
        p += len + 1;
    }
    txn->n_stmts++;
    return 0;
}

/* Like txn_add, but the statement keeps the caller's buffers (freed by
 * txn_free): the block holds only the pointer, length and format arrays. */
int hub_pg_txn_add_owned(struct hub_pg_txn *txn, const struct hub_sql *sql, int nparams,
                         char **values, const int *lengths) {
    struct pg_stmt *st;
    char *p;

    if (txn->n_stmts == txn->cap_stmts) {
        int cap = txn->cap_stmts ? txn->cap_stmts * 2 : 4;
        struct pg_stmt *s = realloc(txn->stmts, sizeof(*s) * (size_t)cap);
        if (s == NULL) {
            goto fail;
        }
        txn->stmts = s;
        txn->cap_stmts = cap;
    }
    p = malloc(sizeof(char *) * (size_t)nparams + 2 * sizeof(int) * (size_t)nparams + 1);
    if (p == NULL) {
        goto fail;
    }
    st = &txn->stmts[txn->n_stmts++];
    memset(st, 0, sizeof(*st));
    st->sql = sql;
    st->nparams = nparams;
    st->owned = 1;
    st->values = (char **)p;
    st->lengths = (int *)(p + sizeof(char *) * (size_t)nparams);
    st->formats = st->lengths + nparams;
    for (int i = 0; i < nparams; i++) {
        st->values[i] = values[i];
        st->lengths[i] = lengths[i];
        st->formats[i] = 1;
    }
    return 0;

fail:
    /* the buffers were handed over: free them here, as the contract says */
    for (int i = 0; i < nparams; i++) {
        free(values[i]);
    }
    hub_pg_txn_fail(txn, PG_OOM_BUILDING);
    return -1;
}

/* The two public forms of txn_add: text or binary results. */
int hub_pg_txn_add(struct hub_pg_txn *txn, const struct hub_sql *sql, int nparams,
                   const char *const *values, const int *lengths, const int *formats) {
    return txn_add(txn, sql, nparams, values, lengths, formats, 0);
}

int hub_pg_txn_add_binary(struct hub_pg_txn *txn, const struct hub_sql *sql, int nparams,
                          const char *const *values, const int *lengths, const int *formats) {
    return txn_add(txn, sql, nparams, values, lengths, formats, 1);
}

/* Frees txn with its statements, parameters (owned ones too) and results. */
static void txn_free(struct hub_pg_txn *txn) {
    for (int i = 0; i < txn->n_stmts; i++) {
        if (txn->stmts[i].owned) {
            for (int k = 0; k < txn->stmts[i].nparams; k++) {
                free(txn->stmts[i].values[k]);
            }
        }
        free(txn->stmts[i].values);
        if (txn->results != NULL && txn->results[i] != NULL) {
            PQclear(txn->results[i]);
        }
    }
    if (txn->error_result != NULL) {
        PQclear(txn->error_result);
    }
    free(txn->results);
    free(txn->stmts);
    free(txn);
}

/* Runs the callback and frees the transaction.  status is what the pool
 * knows; a statement's error result turns OK into HUB_PG_ESTMT, with its
 * SQLSTATE and message.  error (may be NULL) is the text of a failure that
 * has no result. */
static void txn_complete(struct hub_pg_txn *txn, enum hub_pg_status status, const char *error) {
    struct hub_pg_outcome out;
    const char *sqlstate = "", *constraint = "";
    /* A transaction that never ran has no results: callers that read one
     * before looking at the status (results[1] of a two-statement API call)
     * read NULL here.  Longer transactions (a load: one statement per day)
     * read theirs through n_results, which is 0 then. */
    static PGresult *const no_results[HUB_PG_NO_RESULTS] = {NULL};

    int in_lane = txn->lane != NULL && txn->lane_state != LANE_NONE;

    if (txn->lane != NULL) {
        txn->lane->queued -= txn->lane_state == LANE_QUEUED;
        txn->lane->sent -= txn->lane_state == LANE_SENT;
        txn->lane_state = LANE_NONE;
    }
    if (status == HUB_PG_OK && txn->error_result != NULL) {
        status = HUB_PG_ESTMT;
    }
    if (in_lane && status != HUB_PG_OK) {
        txn->lane->fails++; /* those submitted behind it must not run (pg_conn_send) */
    }
    if (status == HUB_PG_ESTMT && txn->error_result != NULL) {
        const char *s = PQresultErrorField(txn->error_result, PG_DIAG_SQLSTATE);
        const char *m = PQresultErrorField(txn->error_result, PG_DIAG_MESSAGE_PRIMARY);
        const char *c = PQresultErrorField(txn->error_result, PG_DIAG_CONSTRAINT_NAME);
        sqlstate = s ? s : "";
        constraint = c ? c : "";
        snprintf(txn->error_text, sizeof(txn->error_text), "%s",
                 txn->lane_check && strcmp(sqlstate, HUB_PG_LANE_SQLSTATE) == 0
                     ? pg_lane_failed
                     : (m ? m : "statement failed"));
        error = txn->error_text;
    } else if (status == HUB_PG_ESTMT && error == pg_lane_failed) {
        sqlstate = HUB_PG_LANE_SQLSTATE; /* as the check would have failed it */
    }
    out.status = status;
    out.results = txn->results ? txn->results : no_results;
    out.n_results = txn->results ? txn->n_stmts : 0;
    out.error = status == HUB_PG_OK ? NULL : (error ? error : "failed");
    out.sqlstate = sqlstate;
    out.constraint = constraint;
    txn->cb(txn->arg, &out);
    txn_free(txn);
}

/* The first reason wins: it names the step that failed first. */
void hub_pg_txn_fail(struct hub_pg_txn *txn, const char *why) {
    if (txn->failed == NULL) {
        txn->failed = why != NULL ? why : PG_OOM_BUILDING;
    }
}

/* Failures known before sending (OOM while building, a closing pool)
 * complete the transaction at once, inside this call. */
void hub_pg_txn_submit(struct hub_pg_txn *txn) {
    struct hub_pg *pg = txn->pg;

    if (txn->failed != NULL) {
        txn_complete(txn, HUB_PG_ENOMEM, txn->failed);
        return;
    }
    if (pg->closing) {
        txn_complete(txn, HUB_PG_ECLOSED, "database pool is closing");
        return;
    }
    if (txn->lane != NULL) {
        struct hub_pg_lane *lane = txn->lane;
        if (lane->id == 0) {
            lane->id = ++pg->lanes;
        }
        txn->lane_behind = lane->queued > 0 || lane->sent > 0;
        txn->lane_fails = lane->fails;
        /* behind the lane's transactions in flight, on their connection,
         * unless some still wait in the queue (they go first) */
        if (lane->queued == 0 && lane->sent > 0 && pg->conns[lane->conn].state == C_UP) {
            pg_conn_send(&pg->conns[lane->conn], txn);
            return;
        }
        lane->queued++;
        txn->lane_state = LANE_QUEUED;
    }
    txn->next = NULL;
    if (pg->queue_tail) {
        pg->queue_tail->next = txn;
    } else {
        pg->queue_head = txn;
    }
    pg->queue_tail = txn;
    pg->queued++;
    pg_pump(pg);
}

/* --------------------------------------------------------- connections -- */

/* Appends an expectation to c's ring, growing it (by copying into a new
 * array from the head, so the ring is contiguous again).  Returns 0 or -1. */
static int exp_push(struct pg_conn *c, enum pg_expect_kind kind, struct hub_pg_txn *txn, int stmt) {
    if (c->exp_len == c->exp_cap) {
        size_t cap = c->exp_cap ? c->exp_cap * 2 : 64;
        struct pg_expect *e = malloc(sizeof(*e) * cap);
        if (e == NULL) {
            return -1;
        }
        for (size_t i = 0; i < c->exp_len; i++) {
            e[i] = c->exp[(c->exp_head + i) % c->exp_cap];
        }
        free(c->exp);
        c->exp = e;
        c->exp_cap = cap;
        c->exp_head = 0;
    }
    c->exp[(c->exp_head + c->exp_len) % c->exp_cap] = (struct pg_expect){kind, txn, stmt};
    c->exp_len++;
    return 0;
}

/* The oldest expectation, or NULL when the server owes c nothing. */
static struct pg_expect *exp_front(struct pg_conn *c) {
    return c->exp_len ? &c->exp[c->exp_head] : NULL;
}

/* Drops the oldest expectation (the caller checked there is one). */
static void exp_pop(struct pg_conn *c) {
    c->exp_head = (c->exp_head + 1) % c->exp_cap;
    c->exp_len--;
}

/* The prepared-statement list of a session: a few dozen statements at
 * most, so a linear scan is enough. */
static int prepared_has(struct pg_conn *c, const struct hub_sql *sql) {
    for (size_t i = 0; i < c->n_prepared; i++) {
        if (c->prepared[i] == sql) {
            return 1;
        }
    }
    return 0;
}

/* Records sql as prepared on this session, once its Prepare is sent (a
 * failed Prepare removes it again).  Returns 0 or -1 on OOM. */
static int prepared_add(struct pg_conn *c, const struct hub_sql *sql) {
    if (c->n_prepared == c->cap_prepared) {
        size_t cap = c->cap_prepared ? c->cap_prepared * 2 : 16;
        const struct hub_sql **p = realloc(c->prepared, sizeof(*p) * cap);
        if (p == NULL) {
            return -1;
        }
        c->prepared = p;
        c->cap_prepared = cap;
    }
    c->prepared[c->n_prepared++] = sql;
    return 0;
}

/* Forgets sql on this session (order does not matter: swap with the last). */
static void prepared_remove(struct pg_conn *c, const struct hub_sql *sql) {
    for (size_t i = 0; i < c->n_prepared; i++) {
        if (c->prepared[i] == sql) {
            c->prepared[i] = c->prepared[--c->n_prepared];
            return;
        }
    }
}

/* A poll handle closed: its struct pg_poll can go. */
static void poll_close_cb(uv_handle_t *h) {
    free(h->data);
}

/* Points the poll handle at the connection's current socket with `events`.
 * libpq may switch sockets during connect, so a changed fd gets a new handle. */
static int pg_conn_watch(struct pg_conn *c, int events) {
    int fd = PQsocket(c->conn);

    if (fd < 0) {
        return -1;
    }
    /* a new socket: libpq opens one per address it tries while connecting,
     * and the next usually has the number of the one it just closed, which
     * epoll dropped with it while libuv still counts it watched */
    if (c->poll != NULL && (c->poll->fd != fd || c->state == C_CONNECTING)) {
        uv_poll_stop(&c->poll->handle);
        uv_close((uv_handle_t *)&c->poll->handle, poll_close_cb);
        c->poll = NULL;
    }
    if (c->poll == NULL) {
        struct pg_poll *p = calloc(1, sizeof(*p));
        if (p == NULL) {
            return -1;
        }
        if (uv_poll_init(c->pg->loop, &p->handle, fd) != 0) {
            free(p);
            return -1;
        }
        p->handle.data = p;
        p->conn = c;
        p->fd = fd;
        c->poll = p;
    }
    if (c->poll->events != events || !uv_is_active((uv_handle_t *)&c->poll->handle)) {
        c->poll->events = events;
        uv_poll_start(&c->poll->handle, events, pg_poll_cb);
    }
    return 0;
}

/* Closes c's socket watch and its libpq connection; what the server owed
 * is left to the caller (pg_conn_lost). */
static void pg_conn_teardown(struct pg_conn *c) {
    if (c->poll != NULL) {
        uv_poll_stop(&c->poll->handle);
        uv_close((uv_handle_t *)&c->poll->handle, poll_close_cb);
        c->poll = NULL;
    }
    if (c->conn != NULL) {
        PQfinish(c->conn);
        c->conn = NULL;
    }
    c->n_prepared = 0;
    c->want_write = 0;
}

/* The reconnect timer: connect again unless the pool is closing. */
static void pg_retry_cb(uv_timer_t *t) {
    struct pg_conn *c = t->data;
    if (c->state == C_DOWN && !c->pg->closing) {
        pg_conn_start(c);
    }
}

/* Marks c down and arms its reconnect after the current backoff, which
 * doubles for the next time (reset once a connect succeeds). */
static void pg_conn_schedule_retry(struct pg_conn *c) {
    int64_t delay = c->backoff_ms;

    c->state = C_DOWN;
    /* jitter in [delay/2, delay] so that N hubs do not reconnect in lockstep */
    delay = delay / 2 + (int64_t)(rand() % (int)(delay / 2 + 1));
    c->backoff_ms = c->backoff_ms * 2 > PG_BACKOFF_MAX_MS ? PG_BACKOFF_MAX_MS : c->backoff_ms * 2;
    uv_timer_start(&c->retry, pg_retry_cb, (uint64_t)delay, 0);
}

/* Fails what this connection owed and schedules a reconnect (or marks it
 * closed when the pool is closing).  Every transaction with a Sync in the
 * ring completes with HUB_PG_ECONN: it was sent, so it may have committed,
 * and its owner must treat the outcome as unknown.  Logs the first loss of
 * a streak only. */
static void pg_conn_lost(struct pg_conn *c, const char *reason) {
    char why[256]; /* one line: the log and the callbacks' error text */
    /* the listening session is gone: what is notified until the next one
     * listens is lost (hub_pg_listen) */
    int deaf = c->state == C_UP && c->index == 0 && c->pg->listen_sql.text != NULL;

    /* `reason` may point into the PGconn freed below: keep a copy. */
    snprintf(why, sizeof(why), "%s", reason ? reason : "unknown error");
    why[strcspn(why, "\n")] = '\0';
    /* Not usable from here on: callbacks run below may submit new work. */
    c->state = C_DOWN;
    if (!c->logged_down) {
        hub_log(HUB_WARN, "database connection lost", HUB_LS("pool", c->pg->name),
                HUB_LI("conn", c->index), HUB_LS("error", why));
        c->logged_down = 1;
    }
    pg_conn_teardown(c);
    while (c->exp_len > 0) {
        struct pg_expect e = *exp_front(c);
        exp_pop(c);
        if (e.kind == EXP_SYNC) {
            c->inflight--;
            txn_complete(e.txn, HUB_PG_ECONN, why);
        }
    }
    /* every transaction it owed was completed above */
    c->inflight = 0;
    if (c->pg->closing) {
        c->state = C_CLOSED;
        return;
    }
    pg_conn_schedule_retry(c);
    if (deaf) {
        c->pg->listen_cb(c->pg->listen_arg, NULL);
    }
}

/*
 * Connection keywords.  "options" comes before "dbname" so that options in
 * the operator's DSN win: libpq keeps the last value of a repeated keyword.
 * JIT is off: its compile cost lands on short OLTP statements whose
 * estimated cost crosses jit_above_cost once a table is large (figures:
 * docs/performance.md, "Notes moved out of the ingest code (issue 22)").
 * PG_CUSTOM_PLAN_SQL runs ahead of a plan_each_time statement: `true` makes
 * the setting local to the transaction.
 */
#define PG_OPTIONS "-c jit=off"
#define PG_CUSTOM_PLAN_SQL "SELECT set_config('plan_cache_mode', 'force_custom_plan', true)"
#define PG_TIMEOUT_SQL "SELECT set_config('statement_timeout', $1, true)"
/* A lane's mark and check (hub_pg_lane): $1 the lane's setting, $2 a
 * serial.  The mark is a session setting (false: not local), which
 * PostgreSQL undoes with the transaction that set it if that one rolls
 * back; the check divides by zero unless the mark it expects is there. */
#define PG_LANE_MARK_SQL "SELECT set_config($1, $2, false)"
#define PG_LANE_CHECK_SQL "SELECT 1 / (current_setting($1, true) IS NOT DISTINCT FROM $2)::int"

/* Notices and warnings from the server as JSON log lines (libpq would print
 * them raw on stderr): WARNING as a warning, the rest (NOTICE, such as
 * "relation … already exists, skipping") at debug. */
static void notice_cb(void *arg, const PGresult *r) {
    const char *sev = PQresultErrorField(r, PG_DIAG_SEVERITY_NONLOCALIZED);
    const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);

    (void)arg;
    hub_log(sev != NULL && strcmp(sev, "WARNING") == 0 ? HUB_WARN : HUB_DEBUG, "database notice",
            HUB_LS("severity", sev ? sev : ""), HUB_LS("detail", msg ? msg : ""));
}

int hub_pg_sqlstate_transient(const char *s) {
    return strncmp(s, "40", 2) == 0 || strncmp(s, "53", 2) == 0 || strncmp(s, "08", 2) == 0 ||
           strncmp(s, "57", 2) == 0 || strcmp(s, "55P03") == 0 || s[0] == '\0';
}

/* Installs notice_cb on conn; the pool's connections and the blocking ones
 * all do, so no server message reaches stderr unformatted. */
void hub_pg_log_notices(PGconn *conn) {
    if (conn != NULL) {
        PQsetNoticeReceiver(conn, notice_cb, NULL);
    }
}

/* Starts a non-blocking connect; its steps run from pg_poll_cb.  A
 * failure to even start goes through pg_conn_lost (a retry). */
static void pg_conn_start(struct pg_conn *c) {
    const char *keys[] = {"options", "dbname", "application_name", NULL};
    const char *vals[] = {c->pg->options, c->pg->dsn, c->pg->name, NULL};

    c->conn = PQconnectStartParams(keys, vals, 1);
    if (c->conn == NULL || PQstatus(c->conn) == CONNECTION_BAD) {
        pg_conn_lost(c, c->conn ? PQerrorMessage(c->conn) : "out of memory");
        return;
    }
    hub_pg_log_notices(c->conn);
    PQsetnonblocking(c->conn, 1);
    c->state = C_CONNECTING;
    if (pg_conn_watch(c, UV_WRITABLE) != 0) {
        pg_conn_lost(c, "cannot watch the database socket");
    }
}

/* The LISTEN of a new session committed: the listener hears NULL, as
 * notifications sent while no session listened are lost.  A session that
 * cannot listen (a server without LISTEN, or a proxy that refuses it) is
 * kept: the pool's own work goes on, deaf, and the warning says so; the
 * transactions sent behind the LISTEN have their own Sync and are not
 * touched by its failure. */
static void pg_listen_done(void *arg, const struct hub_pg_outcome *out) {
    struct hub_pg *pg = arg;

    if (pg->closing || out->status == HUB_PG_ECONN) {
        return; /* the loss said so already; the next session listens again */
    }
    if (out->status != HUB_PG_OK) {
        hub_log(HUB_WARN, "cannot listen for notifications; going on without them",
                HUB_LS("pool", pg->name), HUB_LS("error", out->error));
    }
    pg->listen_cb(pg->listen_arg, NULL);
}

/* Sends the pool's LISTEN on c, ahead of everything else on the new
 * session.  Returns -1 when the connection was lost. */
static int pg_conn_listen(struct pg_conn *c) {
    struct hub_pg_txn *txn = hub_pg_txn_new(c->pg, pg_listen_done, c->pg);

    if (txn == NULL) {
        pg_conn_lost(c, "out of memory");
        return -1;
    }
    hub_pg_txn_add(txn, &c->pg->listen_sql, 0, NULL, NULL, NULL);
    if (txn->failed != NULL) {
        txn_complete(txn, HUB_PG_ECONN, txn->failed); /* the loss below says it */
        pg_conn_lost(c, "out of memory");
        return -1;
    }
    return pg_conn_send(c, txn);
}

/* Advances a non-blocking connect: PQconnectPoll says which way to wait
 * next.  Once up, the connection enters pipeline mode and takes queued
 * transactions at once. */
static void pg_conn_connecting(struct pg_conn *c) {
    switch (PQconnectPoll(c->conn)) {
    case PGRES_POLLING_FAILED: {
        /* copy the message: pg_conn_lost frees the PGconn it lives in */
        char msg[256];
        snprintf(msg, sizeof(msg), "%s", PQerrorMessage(c->conn));
        msg[strcspn(msg, "\n")] = '\0';
        pg_conn_lost(c, msg);
        return;
    }
    case PGRES_POLLING_OK:
        /* pipeline mode for the whole session: every transaction is sent
         * as statements + Sync without waiting for earlier results */
        if (PQenterPipelineMode(c->conn) != 1) {
            pg_conn_lost(c, "cannot enter pipeline mode");
            return;
        }
        c->state = C_UP;
        c->backoff_ms = PG_BACKOFF_MIN_MS;
        if (c->logged_down) {
            hub_log(HUB_INFO, "database connection restored", HUB_LS("pool", c->pg->name),
                    HUB_LI("conn", c->index));
        }
        c->logged_down = 0;
        if (pg_conn_watch(c, UV_READABLE) != 0) {
            pg_conn_lost(c, "cannot watch the database socket");
            return;
        }
        if (c->index == 0 && c->pg->listen_sql.text != NULL && pg_conn_listen(c) != 0) {
            return;
        }
        pg_pump(c->pg);
        return;
    /* not done yet: wait for the direction libpq asks for */
    case PGRES_POLLING_READING:
        if (pg_conn_watch(c, UV_READABLE) != 0) {
            pg_conn_lost(c, "cannot watch the database socket");
        }
        return;
    default:
        if (pg_conn_watch(c, UV_WRITABLE) != 0) {
            pg_conn_lost(c, "cannot watch the database socket");
        }
        return;
    }
}

/* Hands the notifications read so far to the pool's listener (hub_pg_listen).
 * Returns -1 when the connection was lost meanwhile. */
static int pg_conn_notifies(struct pg_conn *c) {
    PGnotify *n;

    while (c->state == C_UP && (n = PQnotifies(c->conn)) != NULL) {
        if (c->pg->listen_cb != NULL && !c->pg->closing) {
            c->pg->listen_cb(c->pg->listen_arg, n->extra);
        }
        PQfreemem(n);
    }
    return c->state == C_UP ? 0 : -1;
}

/* Reads every result available and completes transactions whose sync
 * arrived.  Returns -1 when the connection was lost.
 *
 * Each statement's results end with a NULL from PQgetResult, which moves
 * the ring on; a failed statement keeps its first error result (the one
 * txn_complete reports), and the statements after it in the same
 * transaction answer PGRES_PIPELINE_ABORTED until the Sync. */
static int pg_conn_read(struct pg_conn *c) {
    if (PQconsumeInput(c->conn) == 0) {
        char msg[256];
        snprintf(msg, sizeof(msg), "%s", PQerrorMessage(c->conn));
        msg[strcspn(msg, "\n")] = '\0';
        pg_conn_lost(c, msg);
        return -1;
    }
    while (c->exp_len > 0 && !PQisBusy(c->conn)) {
        struct pg_expect *e = exp_front(c);
        PGresult *r = PQgetResult(c->conn);
        ExecStatusType st;

        if (e->kind == EXP_SYNC) {
            if (r == NULL) {
                break; /* the sync has not arrived yet */
            }
            st = PQresultStatus(r);
            PQclear(r);
            if (st != PGRES_PIPELINE_SYNC) {
                /* the ring and the server disagree: nothing read from here
                 * on can be matched to its transaction */
                pg_conn_lost(c, "protocol out of step (expected a pipeline sync)");
                return -1;
            }
            struct hub_pg_txn *txn = e->txn;
            exp_pop(c);
            c->inflight--;
            /* a notification the server sent before this Sync's answer
             * goes first: it may say that what the transaction read has
             * changed since (hub_pg_listen).  Committed either way. */
            pg_conn_notifies(c);
            txn_complete(txn, HUB_PG_OK, NULL);
            if (c->state != C_UP) {
                return -1; /* the callback's new work lost the connection */
            }
            continue;
        }
        if (r == NULL) {
            exp_pop(c); /* this statement is done */
            continue;
        }
        st = PQresultStatus(r);
        /* our own setting ahead of a statement: only its failure matters */
        if (e->kind == EXP_SETUP) {
            if (st == PGRES_FATAL_ERROR && e->txn->error_result == NULL) {
                e->txn->error_result = r;
            } else {
                PQclear(r);
            }
            continue;
        }
        /* a Prepare: success has nothing to keep */
        if (e->kind == EXP_PREPARE) {
            if (st != PGRES_COMMAND_OK) {
                /* not prepared after all: the next use must prepare again */
                prepared_remove(c, e->txn->stmts[e->stmt].sql);
                if (st == PGRES_FATAL_ERROR && e->txn->error_result == NULL) {
                    e->txn->error_result = r;
                    r = NULL;
                }
            }
            if (r != NULL) {
                PQclear(r);
            }
            continue;
        }
        /* EXP_QUERY: keep the last result (a statement yields one; a
         * second would replace the first), or the first error */
        if (st == PGRES_FATAL_ERROR) {
            if (e->txn->error_result == NULL) {
                e->txn->error_result = r;
            } else {
                PQclear(r);
            }
        } else if (st == PGRES_PIPELINE_ABORTED) {
            PQclear(r);
        } else {
            if (e->txn->results[e->stmt] != NULL) {
                PQclear(e->txn->results[e->stmt]);
            }
            e->txn->results[e->stmt] = r;
        }
    }
    return pg_conn_notifies(c);
}

/* Sends what libpq has buffered; watches for writability while some is
 * left.  Returns -1 when the connection was lost. */
static int pg_conn_flush(struct pg_conn *c) {
    int r = PQflush(c->conn);
    if (r < 0) {
        pg_conn_lost(c, "write to the database failed");
        return -1;
    }
    c->want_write = r == 1;
    return pg_conn_watch(c, UV_READABLE | (c->want_write ? UV_WRITABLE : 0));
}

/* The socket is ready: connect steps, or write what is buffered and read
 * what arrived; then hand the connection more work. */
static void pg_poll_cb(uv_poll_t *handle, int status, int events) {
    struct pg_poll *p = handle->data;
    struct pg_conn *c = p->conn;

    if (c->poll != p) {
        return; /* a stale handle being closed */
    }
    /* while connecting, any readiness is PQconnectPoll's to interpret */
    if (c->state == C_CONNECTING) {
        pg_conn_connecting(c);
        return;
    }
    if (c->state != C_UP) {
        return;
    }
    if (status < 0) {
        pg_conn_lost(c, uv_strerror(status));
        return;
    }
    if ((events & UV_WRITABLE) && pg_conn_flush(c) != 0) {
        return;
    }
    if (events & UV_READABLE) {
        if (pg_conn_read(c) != 0 || c->state != C_UP) {
            return;
        }
        /* libpq marked the connection bad while reading (the server ended
         * the session) */
        if (c->state == C_UP && PQstatus(c->conn) == CONNECTION_BAD) {
            pg_conn_lost(c, "connection closed by the server");
            return;
        }
    }
    pg_pump(c->pg);
}

/* Sends one transaction on c: each statement (prepared first if this
 * session has not seen it, or sent as text after the custom-plan setting
 * when plan_each_time), then the Sync that ends the implicit transaction.
 * c owns txn from here.  Returns -1 if the connection was lost. */
static int pg_conn_send(struct pg_conn *c, struct hub_pg_txn *txn) {
    /* one before it on its lane failed while it waited in the queue: the lane
     * may be empty now, so no check would stop it; it fails as the check
     * would have failed it, unsent */
    if (txn->lane != NULL && txn->lane_behind && txn->lane_fails != txn->lane->fails) {
        txn_complete(txn, HUB_PG_ESTMT, pg_lane_failed);
        return 0;
    }
    /* at least one slot: an empty transaction still has a results array */
    txn->results = calloc((size_t)(txn->n_stmts ? txn->n_stmts : 1), sizeof(PGresult *));
    if (txn->results == NULL) {
        txn_complete(txn, HUB_PG_ENOMEM, "out of memory"); /* never sent: transient */
        return 0;
    }
    c->inflight++;
    if (txn->lane != NULL) {
        /* counted before anything can fail: pg_conn_lost completes it */
        struct hub_pg_lane *lane = txn->lane;
        txn->lane_check = lane->sent > 0;
        snprintf(txn->lane_name, sizeof(txn->lane_name), "hub.lane_%d", lane->id);
        snprintf(txn->lane_prev, sizeof(txn->lane_prev), "%lld", lane->last);
        snprintf(txn->lane_self, sizeof(txn->lane_self), "%lld", ++c->pg->lane_serial);
        lane->last = c->pg->lane_serial;
        lane->conn = c->index;
        lane->queued -= txn->lane_state == LANE_QUEUED;
        lane->sent++;
        txn->lane_state = LANE_SENT;
    }
    if (txn->timeout[0] != '\0') {
        const char *v[1] = {txn->timeout};
        if (PQsendQueryParams(c->conn, PG_TIMEOUT_SQL, 1, NULL, v, NULL, NULL, 0) != 1 ||
            exp_push(c, EXP_SETUP, txn, 0) != 0) {
            goto fail;
        }
    }
    /* behind another transaction of its lane: first the check that it
     * committed (its mark is there) */
    if (txn->lane_check) {
        const char *v[2] = {txn->lane_name, txn->lane_prev};
        if (PQsendQueryParams(c->conn, PG_LANE_CHECK_SQL, 2, NULL, v, NULL, NULL, 0) != 1 ||
            exp_push(c, EXP_SETUP, txn, 0) != 0) {
            goto fail;
        }
    }
    /* libpq only buffers here; pg_conn_flush sends it all at the end, so a
     * transaction is one write however many statements it holds */
    for (int i = 0; i < txn->n_stmts; i++) {
        struct pg_stmt *st = &txn->stmts[i];
        if (st->sql->plan_each_time) {
            /* a custom plan, also on a pool whose sessions force generic
             * ones; until the end of this transaction only */
            if (PQsendQueryParams(c->conn, PG_CUSTOM_PLAN_SQL, 0, NULL, NULL, NULL, NULL, 0) != 1 ||
                exp_push(c, EXP_SETUP, txn, i) != 0) {
                goto fail;
            }
            if (PQsendQueryParams(c->conn, st->sql->text, st->nparams, NULL,
                                  (const char *const *)st->values, st->lengths, st->formats,
                                  st->result_format) != 1 ||
                exp_push(c, EXP_QUERY, txn, i) != 0) {
                goto fail;
            }
            continue;
        }
        /* the Prepare and the first execution travel in the same pipeline:
         * no extra round trip for a statement's first use on a session */
        if (!prepared_has(c, st->sql)) {
            if (PQsendPrepare(c->conn, st->sql->name, st->sql->text, 0, NULL) != 1 ||
                prepared_add(c, st->sql) != 0 || exp_push(c, EXP_PREPARE, txn, i) != 0) {
                goto fail;
            }
        }
        if (PQsendQueryPrepared(c->conn, st->sql->name, st->nparams,
                                (const char *const *)st->values, st->lengths, st->formats,
                                st->result_format) != 1 ||
            exp_push(c, EXP_QUERY, txn, i) != 0) {
            goto fail;
        }
    }
    /* a lane's mark: set only if the transaction commits */
    if (txn->lane != NULL) {
        const char *v[2] = {txn->lane_name, txn->lane_self};
        if (PQsendQueryParams(c->conn, PG_LANE_MARK_SQL, 2, NULL, v, NULL, NULL, 0) != 1 ||
            exp_push(c, EXP_SETUP, txn, 0) != 0) {
            goto fail;
        }
    }
    if (PQpipelineSync(c->conn) != 1 || exp_push(c, EXP_SYNC, txn, -1) != 0) {
        goto fail;
    }
    return pg_conn_flush(c);

fail:
    /* libpq refused to queue (the connection broke) or the ring could not
     * grow: the connection is unusable from here.
     * Make sure the sync entry exists so that pg_conn_lost completes txn. */
    if (c->exp_len == 0 || c->exp[(c->exp_head + c->exp_len - 1) % c->exp_cap].txn != txn ||
        c->exp[(c->exp_head + c->exp_len - 1) % c->exp_cap].kind != EXP_SYNC) {
        if (exp_push(c, EXP_SYNC, txn, -1) != 0) {
            c->inflight--;
            txn_complete(txn, HUB_PG_ECONN, "out of memory");
        }
    }
    pg_conn_lost(c, PQerrorMessage(c->conn));
    return -1;
}

/* Hands queued transactions to the least loaded connections with room
 * (fewer than the pool's max_inflight in flight); what finds none waits
 * for the next completion or connect. */
static void pg_pump(struct hub_pg *pg) {
    while (pg->queue_head != NULL) {
        struct pg_conn *best = NULL;
        struct hub_pg_lane *lane = pg->queue_head->lane;
        if (lane != NULL && lane->sent > 0 && pg->conns[lane->conn].state == C_UP) {
            /* behind its lane's transactions in flight, on their connection
             * (over PG_MAX_INFLIGHT: a lane holds few).  Elsewhere, while
             * that connection is being lost, its check fails: never out of
             * order. */
            best = &pg->conns[lane->conn];
        } else {
            for (int i = 0; i < pg->nconns; i++) {
                struct pg_conn *c = &pg->conns[i];
                if (c->state == C_UP && c->inflight < pg->max_inflight &&
                    (best == NULL || c->inflight < best->inflight)) {
                    best = c;
                }
            }
        }
        if (best == NULL) {
            return;
        }
        struct hub_pg_txn *txn = pg->queue_head;
        pg->queue_head = txn->next;
        if (pg->queue_head == NULL) {
            pg->queue_tail = NULL;
        }
        pg->queued--;
        /* a lost connection completes txn itself (HUB_PG_ECONN) and drops
         * out of the choice: the loop goes on with the others */
        pg_conn_send(best, txn);
    }
}

int hub_pg_listen(struct hub_pg *pg, const char *channel, hub_pg_notify_cb cb, void *arg) {
    char *text = NULL;

    if (asprintf(&text, "LISTEN %s", channel) < 0) {
        return -1;
    }
    free(pg->listen_text);
    pg->listen_text = text;
    pg->listen_sql = (struct hub_sql){"pg_listen", text, 0};
    pg->listen_cb = cb;
    pg->listen_arg = arg;
    return 0;
}

void hub_pg_set_max_inflight(struct hub_pg *pg, int n) {
    pg->max_inflight = n >= 1 && n <= PG_MAX_INFLIGHT ? n : PG_MAX_INFLIGHT;
}

void hub_pg_txn_lane(struct hub_pg_txn *txn, struct hub_pg_lane *lane) {
    txn->lane = lane;
}

void hub_pg_txn_timeout(struct hub_pg_txn *txn, int64_t ms) {
    if (ms > 0) {
        snprintf(txn->timeout, sizeof(txn->timeout), "%lldms", (long long)ms);
    } else {
        txn->timeout[0] = '\0';
    }
}

/* ---------------------------------------------------------------- pool -- */

/* Every connection starts connecting at once; transactions submitted
 * before any is up wait in the queue. */
struct hub_pg *hub_pg_new(uv_loop_t *loop, const char *dsn, int nconns, const char *name,
                          const char *options) {
    struct hub_pg *pg = calloc(1, sizeof(*pg));

    if (pg == NULL) {
        return NULL;
    }
    pg->loop = loop;
    pg->dsn = strdup(dsn);
    pg->name = strdup(name);
    /* PG_OPTIONS first: a pool's own setting of the same name wins */
    if (asprintf(&pg->options, "%s %s", PG_OPTIONS, options ? options : "") < 0) {
        pg->options = NULL;
    }
    pg->nconns = nconns;
    pg->max_inflight = PG_MAX_INFLIGHT;
    pg->conns = calloc((size_t)nconns, sizeof(*pg->conns));
    if (pg->dsn == NULL || pg->name == NULL || pg->options == NULL || pg->conns == NULL) {
        free(pg->dsn);
        free(pg->name);
        free(pg->options);
        free(pg->conns);
        free(pg);
        return NULL;
    }
    for (int i = 0; i < nconns; i++) {
        struct pg_conn *c = &pg->conns[i];
        c->pg = pg;
        c->index = i;
        c->backoff_ms = PG_BACKOFF_MIN_MS;
        uv_timer_init(loop, &c->retry);
        c->retry.data = c;
        pg_conn_start(c);
    }
    return pg;
}

/* Gauges (metrics and readiness). */
int hub_pg_connected(const struct hub_pg *pg) {
    int n = 0;
    for (int i = 0; i < pg->nconns; i++) {
        n += pg->conns[i].state == C_UP;
    }
    return n;
}

/* Queued plus in flight: the backlog a caller would wait behind. */
size_t hub_pg_pending(const struct hub_pg *pg) {
    size_t n = pg->queued;
    for (int i = 0; i < pg->nconns; i++) {
        n += (size_t)pg->conns[i].inflight;
    }
    return n;
}

/* One connection's retry timer closed; the last one frees the pool, after
 * the closed_cb of hub_pg_close. */
static void pg_timer_closed(uv_handle_t *h) {
    struct pg_conn *c = h->data;
    struct hub_pg *pg = c->pg;

    if (--pg->pending_closes > 0) {
        return;
    }
    for (int i = 0; i < pg->nconns; i++) {
        free(pg->conns[i].prepared);
        free(pg->conns[i].exp);
    }
    if (pg->closed_cb) {
        pg->closed_cb(pg->closed_arg);
    }
    free(pg->conns);
    free(pg->dsn);
    free(pg->name);
    free(pg->options);
    free(pg->listen_text);
    free(pg);
}

/* Queued transactions fail with HUB_PG_ECLOSED (never sent), in-flight ones
 * with HUB_PG_ECONN through pg_conn_lost; their callbacks run inside this
 * call.  The pool itself goes once every retry timer has closed. */
void hub_pg_close(struct hub_pg *pg, void (*closed_cb)(void *arg), void *arg) {
    pg->closing = 1;
    pg->closed_cb = closed_cb;
    pg->closed_arg = arg;
    while (pg->queue_head != NULL) {
        struct hub_pg_txn *txn = pg->queue_head;
        pg->queue_head = txn->next;
        pg->queued--;
        txn_complete(txn, HUB_PG_ECLOSED, "database pool is closing");
    }
    pg->queue_tail = NULL;
    /* the pool is freed when the last retry timer's close callback runs,
     * after every poll handle's close was requested (pg_conn_teardown) */
    pg->pending_closes = pg->nconns;
    for (int i = 0; i < pg->nconns; i++) {
        struct pg_conn *c = &pg->conns[i];
        if (c->state == C_UP || c->state == C_CONNECTING) {
            c->logged_down = 1; /* closing on purpose: no warning */
            pg_conn_lost(c, "database pool is closing");
        }
        c->state = C_CLOSED;
        uv_timer_stop(&c->retry);
        uv_close((uv_handle_t *)&c->retry, pg_timer_closed);
    }
}

/* The same connection keywords as a pool's, with PG_OPTIONS only (no
 * per-pool settings); used before the loop runs (migrate, dev, start-up
 * partition upkeep). */
PGconn *hub_pg_connect_blocking(const char *dsn, const char *name) {
    const char *keys[] = {"options", "dbname", "application_name", NULL};
    const char *vals[] = {PG_OPTIONS, dsn, name, NULL};
    PGconn *conn = PQconnectdbParams(keys, vals, 1);

    hub_pg_log_notices(conn);
    if (conn == NULL || PQstatus(conn) != CONNECTION_OK) {
        char msg[256];
        snprintf(msg, sizeof(msg), "%s", conn ? PQerrorMessage(conn) : "out of memory");
        msg[strcspn(msg, "\n")] = '\0';
        hub_log(HUB_ERROR, "cannot connect to the database", HUB_LS("error", msg));
        PQfinish(conn);
        return NULL;
    }
    return conn;
}
