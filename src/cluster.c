/*
 * cluster — membership by heartbeat, and the bucket split (see cluster.h).
 */
#include "cluster.h"

#include <libpq-fe.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "bucket.h"
#include "hub.h"
#include "log.h"
#include "pg.h"
#include "sidecar.h"
#include "store_cluster.h"
#include "util.h"

/* How long a clean stop waits for its row to be deleted. */
#define CLUSTER_LEAVE_MS 2000

struct hub_cluster {
    struct hub *hub; /* NULL once stopping: callbacks then touch nothing of the hub */
    /* one connection; timer 0 is the heartbeat, then the leave's deadline */
    struct hub_sidecar side;
    char id[128]; /* host/pid/random */
    char host[64];
    char pid[16];
    int live;        /* processes seen at the last heartbeat (>= 1) */
    int dispatchers; /* ... of which deliver (>= 1) */
    int beating;     /* a heartbeat is in flight */
    int failing;     /* heartbeats are failing (logged once until one works) */
    int started;     /* the sidecar is open (hub_cluster_start) */
};

/* ------------------------------------------------------------ heartbeat -- */

static void heartbeat_send(struct hub_cluster *cl);

/* The heartbeat's parameters (timeout: the buffer for the member timeout). */
static void heartbeat_params(const struct hub_cluster *cl, const struct hub_config *cfg,
                             char timeout[24], const char **params) {
    snprintf(timeout, 24, "%lld", (long long)cfg->cluster_member_timeout_ms);
    params[0] = cl->id;
    params[1] = cfg->role;
    params[2] = cl->host;
    params[3] = cl->pid;
    params[4] = timeout;
}

/* The heartbeat timer (one shot, re-armed by each send). */
static void heartbeat_cb(uv_timer_t *t) {
    heartbeat_send(t->data);
}

/* The heartbeat's count of processes that deliver, at least one (a
 * process asking for it delivers). */
static int counted_dispatchers(const PGresult *r) {
    int n = atoi(PQgetvalue(r, 0, HUB_CLUSTER_COL_DISPATCHERS));
    return n < 1 ? 1 : n;
}

/* A heartbeat came back: the live count, kept until the next one works. */
static void heartbeat_done(void *arg, const struct hub_pg_outcome *out) {
    struct hub_cluster *cl = arg;
    PGresult *r = out->n_results > 0 ? out->results[0] : NULL;

    cl->beating = 0;
    if (cl->hub == NULL) {
        return; /* stopping */
    }
    if (out->status != HUB_PG_OK || r == NULL || PQntuples(r) != 1) {
        if (!cl->failing) {
            cl->failing = 1;
            hub_log(HUB_WARN, "cluster heartbeat failed; keeping the last process count",
                    HUB_LI("processes", cl->live), HUB_LS("error", out->error));
        }
        return;
    }
    int live = atoi(PQgetvalue(r, 0, HUB_CLUSTER_COL_LIVE));
    if (live < 1) {
        live = 1;
    }
    cl->dispatchers = counted_dispatchers(r);
    if (live != cl->live || cl->failing) {
        hub_log(HUB_INFO, "cluster membership", HUB_LS("process", cl->id),
                HUB_LI("processes", live));
    }
    cl->failing = 0;
    cl->live = live;
    cl->hub->metrics.cluster_processes = live;
}

/* Sends one heartbeat unless the last is still out (the database is slow:
 * no pile-up), and arms the next. */
static void heartbeat_send(struct hub_cluster *cl) {
    const struct hub_config *cfg = &cl->hub->cfg;
    char timeout[24];
    const char *params[HUB_SQL_CLUSTER_HEARTBEAT_NPARAMS];
    struct hub_pg_txn *txn;

    uv_timer_start(&cl->side.timer[0], heartbeat_cb, (uint64_t)cfg->cluster_heartbeat_ms, 0);
    if (cl->beating) {
        return;
    }
    txn = hub_pg_txn_new(cl->side.pg, heartbeat_done, cl);
    if (txn == NULL) {
        return;
    }
    heartbeat_params(cl, cfg, timeout, params);
    hub_pg_txn_add(txn, &hub_sql_cluster_heartbeat, HUB_SQL_CLUSTER_HEARTBEAT_NPARAMS, params, NULL,
                   NULL);
    cl->beating = 1;
    hub_pg_txn_submit(txn);
}

/* ------------------------------------------------------------ lifecycle -- */

int hub_cluster_join(struct hub *hub, PGconn *conn) {
    struct hub_cluster *cl = calloc(1, sizeof(*cl));
    const char *params[HUB_SQL_CLUSTER_HEARTBEAT_NPARAMS];
    char timeout[24];
    unsigned char r[6];
    char rhex[13];
    PGresult *res;

    if (cl == NULL) {
        hub_log(HUB_ERROR, "out of memory joining the cluster");
        return -1;
    }
    cl->hub = hub;
    snprintf(cl->host, sizeof(cl->host), "hub");
    gethostname(cl->host, sizeof(cl->host) - 1);
    snprintf(cl->pid, sizeof(cl->pid), "%d", (int)getpid());
    RAND_bytes(r, sizeof(r));
    hub_hex(r, sizeof(r), rhex);
    /* unique per process start: a restarted process is a new member, and
     * its old row ages out */
    snprintf(cl->id, sizeof(cl->id), "%s/%s/%s", cl->host, cl->pid, rhex);
    heartbeat_params(cl, &hub->cfg, timeout, params);
    res = PQexecParams(conn, hub_sql_cluster_heartbeat.text, HUB_SQL_CLUSTER_HEARTBEAT_NPARAMS,
                       NULL, params, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
        hub_log(HUB_ERROR, "cannot join the cluster (hub_processes)",
                HUB_LS("error", PQresultErrorMessage(res)));
        PQclear(res);
        free(cl);
        return -1;
    }
    cl->live = atoi(PQgetvalue(res, 0, HUB_CLUSTER_COL_LIVE));
    if (cl->live < 1) {
        cl->live = 1;
    }
    cl->dispatchers = counted_dispatchers(res);
    PQclear(res);
    hub_log(HUB_INFO, "cluster membership", HUB_LS("process", cl->id),
            HUB_LI("processes", cl->live));
    hub->cluster = cl;
    hub->metrics.cluster_processes = cl->live;
    return 0;
}

/* The sidecar (one connection, the heartbeat timer); the next heartbeat
 * one period after the join's. */
void hub_cluster_start(struct hub *hub) {
    struct hub_cluster *cl = hub->cluster;

    if (hub_sidecar_open(&cl->side, hub, "streaming-hub-cluster", 1, cl) != 0) {
        /* the share stays the join's count */
        hub_log(HUB_ERROR, "out of memory: the process count is not refreshed",
                HUB_LI("processes", cl->live));
        return;
    }
    cl->started = 1;
    uv_update_time(hub->loop); /* the start ran outside the loop: its clock is behind */
    uv_timer_start(&cl->side.timer[0], heartbeat_cb, (uint64_t)hub->cfg.cluster_heartbeat_ms, 0);
}

/* The sidecar is closed: nothing refers to the state any more. */
static void cluster_closed(void *owner) {
    free(owner);
}

/* Closes the timer and the pool (failing a leave still out). */
static void cluster_close(struct hub_cluster *cl) {
    hub_sidecar_close(&cl->side, cluster_closed);
}

/* The leave's deadline, or the leave is over (0 ms): close, failing a
 * delete still out (the row then ages out). */
static void leave_deadline_cb(uv_timer_t *t) {
    cluster_close(t->data);
}

/* Either way the row goes: deleted now, or aged out.  The pool is closed
 * from the timer, not from inside its own callback. */
static void leave_done(void *arg, const struct hub_pg_outcome *out) {
    struct hub_cluster *cl = arg;

    (void)out;
    if (!cl->side.closing) {
        uv_timer_start(&cl->side.timer[0], leave_deadline_cb, 0, 0);
    }
}

void hub_cluster_stop(struct hub *hub) {
    struct hub_cluster *cl = hub->cluster;
    const char *params[HUB_SQL_CLUSTER_LEAVE_NPARAMS];
    struct hub_pg_txn *txn;

    if (cl == NULL) {
        return;
    }
    hub->cluster = NULL;
    if (!cl->started) {
        free(cl); /* a start that failed after the join: the row ages out */
        return;
    }
    cl->hub = NULL;
    params[0] = cl->id;
    txn = hub_pg_txn_new(cl->side.pg, leave_done, cl);
    if (txn == NULL) {
        cluster_close(cl);
        return;
    }
    /* the other processes take our share at their next heartbeat */
    hub_pg_txn_add(txn, &hub_sql_cluster_leave, HUB_SQL_CLUSTER_LEAVE_NPARAMS, params, NULL, NULL);
    uv_timer_start(&cl->side.timer[0], leave_deadline_cb, CLUSTER_LEAVE_MS, 0);
    hub_pg_txn_submit(txn);
}

/* ---------------------------------------------------------------- split -- */

int hub_cluster_size(const struct hub *hub) {
    return hub->cluster != NULL ? hub->cluster->live : 1;
}

int hub_cluster_dispatchers(const struct hub *hub) {
    return hub->cluster != NULL ? hub->cluster->dispatchers : 1;
}

double hub_cluster_take(struct hub *hub, struct hub_buckets **table, const char *key, double rate,
                        double burst, double cost) {
    double n = (double)hub_cluster_size(hub);
    double share = burst / n;

    /* a share below one token would admit nothing: each process keeps at
     * least one, so the whole burst can exceed the configured one by at
     * most N - 1 tokens when it is smaller than N */
    return hub_bucket_take(table, key, rate / n, share < 1.0 ? 1.0 : share, cost, hub_now_ns());
}
