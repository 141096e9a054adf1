/*
 * pg — asynchronous PostgreSQL pool on libuv (see pg.h for the model).
 *
 * Per connection we keep a ring of "expectations": what the server owes us,
 * in order (a prepare's result, a query's result, a pipeline sync).  Reading
 * results is then a matter of matching each PGresult to the head of the ring,
 * which keeps pipelining of several transactions per connection simple.
 */
#include "pg.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"

#define PG_MAX_INFLIGHT 8 /* transactions in flight per connection */
#define PG_BACKOFF_MIN_MS 100
#define PG_BACKOFF_MAX_MS 5000

/* Results a never-run transaction answers with (see txn_complete). */
#define HUB_PG_NO_RESULTS 8

struct pg_stmt {
    const struct hub_sql *sql;
    int nparams;
    int result_format;
    int owned; /* values[i] are separate malloc'd buffers (hub_pg_txn_add_owned) */
    char **values;
    int *lengths;
    int *formats;
};

struct hub_pg_txn {
    struct hub_pg *pg;
    hub_pg_cb cb;
    void *arg;
    struct pg_stmt *stmts;
    int n_stmts;
    int cap_stmts;
    int oom;
    PGresult **results;
    PGresult *error_result; /* the failing result, owned via results[] or here */
    char error_text[256];
    struct hub_pg_txn *next; /* pool queue */
};

/* EXP_SETUP: a statement of our own ahead of one of the transaction's
 * (its result is dropped, its error fails the transaction). */
enum pg_expect_kind { EXP_PREPARE, EXP_SETUP, EXP_QUERY, EXP_SYNC };

struct pg_expect {
    enum pg_expect_kind kind;
    struct hub_pg_txn *txn;
    int stmt;
};

enum pg_conn_state { C_DOWN, C_CONNECTING, C_UP, C_CLOSED };

struct pg_poll {
    uv_poll_t handle;
    struct pg_conn *conn;
    int fd;
    int events;
};

struct pg_conn {
    struct hub_pg *pg;
    int index;
    enum pg_conn_state state;
    PGconn *conn;
    struct pg_poll *poll;
    uv_timer_t retry;
    int64_t backoff_ms;
    const struct hub_sql **prepared;
    size_t n_prepared;
    size_t cap_prepared;
    struct pg_expect *exp;
    size_t exp_head; /* ring of expectations */
    size_t exp_len;
    size_t exp_cap;
    int inflight; /* transactions sent and not completed */
    int want_write;
    int logged_down; /* log the first failure of a streak only */
};

struct hub_pg {
    uv_loop_t *loop;
    char *dsn;
    char *name;
    char *options; /* PG_OPTIONS plus the pool's own settings */
    struct pg_conn *conns;
    int nconns;
    struct hub_pg_txn *queue_head;
    struct hub_pg_txn *queue_tail;
    size_t queued;
    int closing;
    int pending_closes;
    void (*closed_cb)(void *arg);
    void *closed_arg;
};

static void pg_conn_start(struct pg_conn *c);
static void pg_conn_lost(struct pg_conn *c, const char *why);
static void pg_pump(struct hub_pg *pg);
static void pg_poll_cb(uv_poll_t *handle, int status, int events);

/* ---------------------------------------------------------------- txns -- */

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
            txn->oom = 1;
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

    /* One block per statement: pointer array, lengths, formats, then bytes. */
    for (int i = 0; i < nparams; i++) {
        if (values[i] != NULL) {
            size_t len = (formats && formats[i]) ? (size_t)lengths[i] : strlen(values[i]);
            total += len + 1;
        }
    }
    p = malloc(sizeof(char *) * (size_t)nparams + 2 * sizeof(int) * (size_t)nparams + total + 1);
    if (p == NULL) {
        txn->oom = 1;
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
    for (int i = 0; i < nparams; i++) {
        free(values[i]);
    }
    txn->oom = 1;
    return -1;
}

int hub_pg_txn_add(struct hub_pg_txn *txn, const struct hub_sql *sql, int nparams,
                   const char *const *values, const int *lengths, const int *formats) {
    return txn_add(txn, sql, nparams, values, lengths, formats, 0);
}

int hub_pg_txn_add_binary(struct hub_pg_txn *txn, const struct hub_sql *sql, int nparams,
                          const char *const *values, const int *lengths, const int *formats) {
    return txn_add(txn, sql, nparams, values, lengths, formats, 1);
}

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

/* Runs the callback and frees the transaction. */
static void txn_complete(struct hub_pg_txn *txn, enum hub_pg_status status, const char *error) {
    struct hub_pg_outcome out;
    const char *sqlstate = "";
    /* A transaction that never ran has no results: callers that read one
     * before looking at the status (results[1] of a two-statement API call)
     * read NULL here.  Longer transactions (a load: one statement per day)
     * read theirs through n_results, which is 0 then. */
    static PGresult *const no_results[HUB_PG_NO_RESULTS] = {NULL};

    if (status == HUB_PG_OK && txn->error_result != NULL) {
        status = HUB_PG_ESTMT;
    }
    if (status == HUB_PG_ESTMT && txn->error_result != NULL) {
        const char *s = PQresultErrorField(txn->error_result, PG_DIAG_SQLSTATE);
        const char *m = PQresultErrorField(txn->error_result, PG_DIAG_MESSAGE_PRIMARY);
        sqlstate = s ? s : "";
        snprintf(txn->error_text, sizeof(txn->error_text), "%s", m ? m : "statement failed");
        error = txn->error_text;
    }
    out.status = status;
    out.results = txn->results ? txn->results : no_results;
    out.n_results = txn->results ? txn->n_stmts : 0;
    out.error = status == HUB_PG_OK ? NULL : (error ? error : "failed");
    out.sqlstate = sqlstate;
    txn->cb(txn->arg, &out);
    txn_free(txn);
}

void hub_pg_txn_submit(struct hub_pg_txn *txn) {
    struct hub_pg *pg = txn->pg;

    if (txn->oom) {
        txn_complete(txn, HUB_PG_ESTMT, "out of memory building the transaction");
        return;
    }
    if (pg->closing) {
        txn_complete(txn, HUB_PG_ECLOSED, "database pool is closing");
        return;
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

static int exp_push(struct pg_conn *c, enum pg_expect_kind kind, struct hub_pg_txn *txn,
                    int stmt) {
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

static struct pg_expect *exp_front(struct pg_conn *c) {
    return c->exp_len ? &c->exp[c->exp_head] : NULL;
}

static void exp_pop(struct pg_conn *c) {
    c->exp_head = (c->exp_head + 1) % c->exp_cap;
    c->exp_len--;
}

static int prepared_has(struct pg_conn *c, const struct hub_sql *sql) {
    for (size_t i = 0; i < c->n_prepared; i++) {
        if (c->prepared[i] == sql) {
            return 1;
        }
    }
    return 0;
}

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

static void prepared_remove(struct pg_conn *c, const struct hub_sql *sql) {
    for (size_t i = 0; i < c->n_prepared; i++) {
        if (c->prepared[i] == sql) {
            c->prepared[i] = c->prepared[--c->n_prepared];
            return;
        }
    }
}

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
    if (c->poll != NULL && c->poll->fd != fd) {
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

static void pg_retry_cb(uv_timer_t *t) {
    struct pg_conn *c = t->data;
    if (c->state == C_DOWN && !c->pg->closing) {
        pg_conn_start(c);
    }
}

static void pg_conn_schedule_retry(struct pg_conn *c) {
    int64_t delay = c->backoff_ms;

    c->state = C_DOWN;
    /* jitter in [delay/2, delay] so that N hubs do not reconnect in lockstep */
    delay = delay / 2 + (int64_t)(rand() % (int)(delay / 2 + 1));
    c->backoff_ms = c->backoff_ms * 2 > PG_BACKOFF_MAX_MS ? PG_BACKOFF_MAX_MS : c->backoff_ms * 2;
    uv_timer_start(&c->retry, pg_retry_cb, (uint64_t)delay, 0);
}

/* Fails what this connection owed and schedules a reconnect. */
static void pg_conn_lost(struct pg_conn *c, const char *reason) {
    char why[256];

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
    c->inflight = 0;
    if (c->pg->closing) {
        c->state = C_CLOSED;
        return;
    }
    pg_conn_schedule_retry(c);
}

/*
 * Connection keywords.  "options" comes before "dbname" so that options in
 * the operator's DSN win: libpq keeps the last value of a repeated keyword.
 * JIT is off: its compile cost (~50 ms measured, seconds on a cold start)
 * lands on short OLTP statements whose estimated cost crosses
 * jit_above_cost once a table is large — a claim on a 1M-job backlog took
 * 900 ms instead of 10.
 */
#define PG_OPTIONS "-c jit=off"
#define PG_CUSTOM_PLAN_SQL "SELECT set_config('plan_cache_mode', 'force_custom_plan', true)"

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

void hub_pg_log_notices(PGconn *conn) {
    if (conn != NULL) {
        PQsetNoticeReceiver(conn, notice_cb, NULL);
    }
}

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

/* Advances a non-blocking connect. */
static void pg_conn_connecting(struct pg_conn *c) {
    switch (PQconnectPoll(c->conn)) {
    case PGRES_POLLING_FAILED: {
        char msg[256];
        snprintf(msg, sizeof(msg), "%s", PQerrorMessage(c->conn));
        msg[strcspn(msg, "\n")] = '\0';
        pg_conn_lost(c, msg);
        return;
    }
    case PGRES_POLLING_OK:
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
        pg_pump(c->pg);
        return;
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

/* Reads every result available and completes transactions whose sync
 * arrived.  Returns -1 when the connection was lost. */
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
                pg_conn_lost(c, "protocol out of step (expected a pipeline sync)");
                return -1;
            }
            struct hub_pg_txn *txn = e->txn;
            exp_pop(c);
            c->inflight--;
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
        if (e->kind == EXP_SETUP) {
            if (st == PGRES_FATAL_ERROR && e->txn->error_result == NULL) {
                e->txn->error_result = r;
            } else {
                PQclear(r);
            }
            continue;
        }
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
        /* EXP_QUERY */
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
    return 0;
}

static int pg_conn_flush(struct pg_conn *c) {
    int r = PQflush(c->conn);
    if (r < 0) {
        pg_conn_lost(c, "write to the database failed");
        return -1;
    }
    c->want_write = r == 1;
    return pg_conn_watch(c, UV_READABLE | (c->want_write ? UV_WRITABLE : 0));
}

static void pg_poll_cb(uv_poll_t *handle, int status, int events) {
    struct pg_poll *p = handle->data;
    struct pg_conn *c = p->conn;

    if (c->poll != p) {
        return; /* a stale handle being closed */
    }
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
        if (c->state == C_UP && PQstatus(c->conn) == CONNECTION_BAD) {
            pg_conn_lost(c, "connection closed by the server");
            return;
        }
    }
    pg_pump(c->pg);
}

/* Sends one transaction on c.  Returns -1 if the connection was lost. */
static int pg_conn_send(struct pg_conn *c, struct hub_pg_txn *txn) {
    txn->results = calloc((size_t)(txn->n_stmts ? txn->n_stmts : 1), sizeof(PGresult *));
    if (txn->results == NULL) {
        txn_complete(txn, HUB_PG_ESTMT, "out of memory");
        return 0;
    }
    c->inflight++;
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
    if (PQpipelineSync(c->conn) != 1 || exp_push(c, EXP_SYNC, txn, -1) != 0) {
        goto fail;
    }
    return pg_conn_flush(c);

fail:
    /* Make sure the sync entry exists so that pg_conn_lost completes txn. */
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

/* Hands queued transactions to the least loaded connections with room. */
static void pg_pump(struct hub_pg *pg) {
    while (pg->queue_head != NULL) {
        struct pg_conn *best = NULL;
        for (int i = 0; i < pg->nconns; i++) {
            struct pg_conn *c = &pg->conns[i];
            if (c->state == C_UP && c->inflight < PG_MAX_INFLIGHT &&
                (best == NULL || c->inflight < best->inflight)) {
                best = c;
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
        pg_conn_send(best, txn);
    }
}

/* ---------------------------------------------------------------- pool -- */

struct hub_pg *hub_pg_new(uv_loop_t *loop, const char *dsn, int nconns, const char *name,
                          const char *options) {
    struct hub_pg *pg = calloc(1, sizeof(*pg));

    if (pg == NULL) {
        return NULL;
    }
    pg->loop = loop;
    pg->dsn = strdup(dsn);
    pg->name = strdup(name);
    if (asprintf(&pg->options, "%s %s", PG_OPTIONS, options ? options : "") < 0) {
        pg->options = NULL;
    }
    pg->nconns = nconns;
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

int hub_pg_connected(const struct hub_pg *pg) {
    int n = 0;
    for (int i = 0; i < pg->nconns; i++) {
        n += pg->conns[i].state == C_UP;
    }
    return n;
}

size_t hub_pg_pending(const struct hub_pg *pg) {
    size_t n = pg->queued;
    for (int i = 0; i < pg->nconns; i++) {
        n += (size_t)pg->conns[i].inflight;
    }
    return n;
}

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
    free(pg);
}

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
