/*
 * pg — asynchronous PostgreSQL on the libuv loop.
 *
 * A pool of libpq connections, each a small state machine driven by a
 * uv_poll_t on PQsocket(): non-blocking connect (PQconnectPoll), pipeline
 * mode, lazily prepared named statements, reconnect with jittered backoff.
 *
 * The unit of work is a transaction: one or more statements sent back to
 * back in pipeline mode and closed by a single Sync, so PostgreSQL runs them
 * in one implicit transaction (all commit or none do) at the cost of one
 * network round trip.  Several transactions may be in flight on one
 * connection; each completes with its own callback, in submission order per
 * connection.
 *
 * Everything here runs on the loop thread.
 */
#ifndef HUB_PG_H
#define HUB_PG_H

#include <libpq-fe.h>
#include <stddef.h>
#include <uv.h>

/* A named SQL text.  Statements are static objects compared by address; each
 * connection prepares a statement the first time it runs it.
 *
 * plan_each_time: send the text with every execution (unnamed statement) so
 * PostgreSQL plans it for the actual parameters, whatever the session's
 * plan_cache_mode.  For statements whose best plan depends on them, e.g. the
 * ingest insert of a big batch, where the generic plan of a prepared
 * statement costs PostgreSQL more CPU per row.
 *
 * Prepared statements follow the session's plan_cache_mode.  Under "auto",
 * PostgreSQL keeps planning a statement for every execution whenever the
 * generic plan looks costlier than the custom ones, as it does for
 * statements over unnest($n::type[]) arrays, whose planning then costs more
 * than their run.  Pools that run such statements pass
 * HUB_PG_GENERIC_PLANS (hub_pg_new).
 *
 * The figures behind both: docs/performance.md, "Notes moved out of the
 * ingest code (issue 22)". */
#define HUB_PG_GENERIC_PLANS "-c plan_cache_mode=force_generic_plan"

struct hub_sql {
    const char *name;
    const char *text;
    int plan_each_time;
};

enum hub_pg_status {
    HUB_PG_OK = 0,
    HUB_PG_ESTMT = -1,   /* a statement failed; the transaction rolled back */
    HUB_PG_ECONN = -2,   /* connection lost while in flight: outcome unknown */
    HUB_PG_ECLOSED = -3, /* the pool is closing; never sent */
    HUB_PG_ENOMEM = -4,  /* never sent: it could not be built (out of memory, or
                          * hub_pg_txn_fail); transient, nothing was written */
};

struct hub_pg_outcome {
    enum hub_pg_status status;
    PGresult *const *results; /* results[i] for statement i; NULL when it did not run.  When
                               * the transaction never reached the server (n_results 0),
                               * results[0..7] read as NULL */
    int n_results;
    const char *error;    /* first line of the error when status != OK */
    const char *sqlstate; /* SQLSTATE when status == HUB_PG_ESTMT, else "" */
    /* the constraint an ESTMT names (a 23505's, say), else "" or NULL */
    const char *constraint;
};

/* 1 when a statement error (the outcome's sqlstate) says nothing about the
 * rows, so the same transaction may succeed when sent again: a deadlock, a
 * serialization failure, a lock or statement timeout, resources or the
 * connection running out, an operator's cancel (and "": no SQLSTATE). */
int hub_pg_sqlstate_transient(const char *sqlstate);

/* Called once per transaction on the loop thread.  The results belong to the
 * pool and are cleared when the callback returns. */
typedef void (*hub_pg_cb)(void *arg, const struct hub_pg_outcome *out);

struct hub_pg;
struct hub_pg_txn;

/*
 * Creates a pool of nconns connections to dsn and starts connecting.
 * `name` appears in logs and as application_name; `options` (may be NULL)
 * adds server settings for this pool's sessions ("-c name=value ...").
 * Returns NULL on OOM.
 */
struct hub_pg *hub_pg_new(uv_loop_t *loop, const char *dsn, int nconns, const char *name,
                          const char *options);

/* Fails every queued and in-flight transaction with HUB_PG_ECLOSED/ECONN,
 * closes the connections, and frees the pool once every handle is closed;
 * closed_cb (may be NULL) runs then. */
void hub_pg_close(struct hub_pg *pg, void (*closed_cb)(void *arg), void *arg);

/*
 * At most n transactions in flight on each connection (1..8; 8 by
 * default).  Pipelining puts a transaction behind the ones sent before it on
 * its connection: a pool whose transactions may wait long in the server (a
 * lock, a long scan) and whose others must not wait behind them takes 1,
 * and the rest wait in the pool's queue for a connection that is free.
 */
void hub_pg_set_max_inflight(struct hub_pg *pg, int n);

/* A notification's payload (hub_pg_listen), or NULL: the listening session
 * is new, and what was notified while none listened is lost. */
typedef void (*hub_pg_notify_cb)(void *arg, const char *payload);

/*
 * The pool's first connection LISTENs on channel (an identifier, not
 * quoted) from its next connect on, before any transaction: cb(arg,
 * payload) runs on the loop for each notification it reads, and cb(arg,
 * NULL) each time the listening session is lost and each time a new
 * session's LISTEN has committed (or failed: the session is kept, deaf,
 * and a warning logged).  Notifications are read with the connection's
 * results, each handed over before the transaction whose answer came
 * after it completes, and whenever the connection is idle.  Call it right
 * after hub_pg_new, before the loop runs.  Returns 0, or -1 on OOM.
 */
int hub_pg_listen(struct hub_pg *pg, const char *channel, hub_pg_notify_cb cb, void *arg);

/* Number of connections currently usable. */
int hub_pg_connected(const struct hub_pg *pg);

/* Transactions waiting for a connection plus those in flight. */
size_t hub_pg_pending(const struct hub_pg *pg);

/* Starts a transaction; cb runs exactly once, after submit. */
struct hub_pg_txn *hub_pg_txn_new(struct hub_pg *pg, hub_pg_cb cb, void *arg);

/*
 * Appends a statement.  values/lengths/formats follow PQexecParams (lengths
 * and formats may be NULL for all-text parameters; a NULL value is SQL NULL).
 * Parameter bytes are copied; the caller's buffers may go away at once.
 * Returns 0, or -1 on OOM (the transaction will then fail at submit).
 */
int hub_pg_txn_add(struct hub_pg_txn *txn, const struct hub_sql *sql, int nparams,
                   const char *const *values, const int *lengths, const int *formats);

/* Like hub_pg_txn_add but the results come back in binary format. */
int hub_pg_txn_add_binary(struct hub_pg_txn *txn, const struct hub_sql *sql, int nparams,
                          const char *const *values, const int *lengths, const int *formats);

/*
 * Like hub_pg_txn_add (binary parameters) but takes ownership of the value
 * buffers instead of copying them: each values[i] must come from malloc and
 * is freed with the transaction, also when this call fails (returns -1).
 * Saves a copy of large parameters such as a batch's payload array.
 */
int hub_pg_txn_add_owned(struct hub_pg_txn *txn, const struct hub_sql *sql, int nparams,
                         char **values, const int *lengths);

/*
 * Marks txn failed: submit then completes it at once with HUB_PG_ENOMEM
 * and `why` as its error, sending nothing.  For a builder that could not
 * add one of its statements (an array that ran out of memory): running the
 * others alone would commit part of what the caller meant as one
 * transaction.  why is a static string.
 */
void hub_pg_txn_fail(struct hub_pg_txn *txn, const char *why);

/* Queues the transaction; it runs on the next connection with room. */
void hub_pg_txn_submit(struct hub_pg_txn *txn);

/*
 * A lane: transactions that must commit in the order they were submitted
 * (a Kafka partition's batches, several in flight).  While one of its
 * transactions is queued or in flight, the next goes behind it on the same
 * connection, where PostgreSQL runs them one after the other, and runs only
 * if the one just before it committed: a session setting the previous one
 * sets as its last statement (undone when it rolls back) is checked by the
 * next one's first statement, so a transaction behind one that rolled back
 * fails too (HUB_PG_ESTMT, sqlstate HUB_PG_LANE_SQLSTATE, before it wrote
 * anything).  A lane with nothing in flight takes any connection.
 *
 * A transaction still queued when one before it on its lane fails is
 * failed the same way, unsent (the lane may be empty by the time it gets a
 * connection, and no check would then stop it).
 *
 * The owner embeds it zeroed and keeps it until none of its transactions
 * is left (their callbacks have run); it deciding what may be submitted
 * once one failed (a transaction submitted to an idle lane is not checked
 * against the failed one).  Members are pg.c's.
 */
struct hub_pg_lane {
    int id;         /* names its session setting; assigned on first use */
    int conn;       /* the connection its transactions in flight are on */
    int queued;     /* submitted, not yet sent */
    int sent;       /* sent, not yet completed */
    long long last; /* the serial the last one sent sets */
    unsigned fails; /* its transactions that did not commit, queued or sent */
};

/* What a transaction fails with when the one before it on its lane did not
 * commit (division_by_zero, as the check raises it). */
#define HUB_PG_LANE_SQLSTATE "22012"

/* Puts txn (not yet submitted) on lane, which it borrows until its
 * callback has run. */
void hub_pg_txn_lane(struct hub_pg_txn *txn, struct hub_pg_lane *lane);

/* Bounds each statement of txn (not yet submitted) to ms milliseconds
 * (statement_timeout, local to the transaction): past it the statement
 * fails with SQLSTATE 57014, which hub_pg_sqlstate_transient counts as
 * transient.  0 leaves the session's setting. */
void hub_pg_txn_timeout(struct hub_pg_txn *txn, int64_t ms);

/* Routes the server's notices and warnings on conn (may be NULL) to the
 * hub's log (SPEC §10: one JSON object per line on stderr). */
void hub_pg_log_notices(PGconn *conn);

/* Opens a blocking connection (for migrate/dev/tests before the loop runs).
 * Returns NULL and logs on failure. */
PGconn *hub_pg_connect_blocking(const char *dsn, const char *name);

#endif
