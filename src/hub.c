/*
 * hub — `serve`: wires the modules together on one libuv loop and runs it
 * until SIGINT/SIGTERM, then drains in reverse order of start.
 *
 * Start (hub_serve_with), each step failing the start with one log line:
 *
 *   configuration checks ──► policies compiled ──► the database prepared
 *   before the loop runs (connect, migrate, schema check, partitions, the
 *   midnight keys purged, the cluster joined) ──► the pools (API; ingest) ──► the embedded mock
 *   cluster when asked for ──► the consumer (ingest roles) ──► the HTTP
 *   client ──► the dispatcher (delivery roles, with a KEK) ──► the HTTP
 *   listener ──► signals, partition upkeep, the readiness probe
 *
 * Readiness (hub_ready, SPEC §9 /readyz) is computed on each request from
 * what the modules know: the pools' connections, the probe's last answer
 * (every HUB_READY_PROBE_MS on the API pool: the database answers, and
 * schema_migrations holds every migration this binary embeds), and the
 * consumer's health (ingest.h).  Nothing is cached in a "ready" flag that
 * could stay set when reality moves on.
 *
 * Drain (SIGTERM/SIGINT; a second signal stops at once), bounded by
 * STREAMING_HUB_SHUTDOWN_TIMEOUT (past it the process exits 1 and what was
 * in flight is replayed later):
 *
 *   draining: /readyz 503, new HTTP requests 503 (the listener stays open),
 *   the dispatcher claims nothing more and gives back what it has not
 *   started ──► the consumer stops, its batches in flight commit ──► the
 *   dispatcher waits for its attempts ──► the HTTP requests in flight are
 *   answered (hub_http_when_drained) ──► hub_finish: the listener closes,
 *   the pools close, the loop ends
 *
 * Attempts and probes still waiting for a destination's answer when most of
 * the budget is gone (drain_abort_ms) stop waiting: their jobs go back
 * unattempted, so a destination slower than the budget does not make the
 * drain exit 1 and leave its leases to expire.
 *
 * The pools close last because everything before them may still write:
 * a batch's commit, an attempt's outcome, an HTTP ingest transaction.
 */
#include "hub.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api_events.h"
#include "cluster.h"
#include "schema_registry.h"
#include "dispatch.h"
#include "http.h"
#include "httpc.h"
#include "ingest.h"
#include "kafka.h"
#include "log.h"
#include "migrate.h"
#include "opevents.h"
#include "pg.h"
#include "policy.h"
#include "policy_watch.h"
#include "stats.h"
#include "store.h"
#include "util.h"

/* Four: a tenant's API transactions run one at a time (api_util.h), so
 * others find a connection unless four tenants' statements wait at once */
#define HUB_API_PG_CONNECTIONS 4
/* In the first minutes of a UTC day partition upkeep runs every
 * HUB_DAYSTART_EVERY_MS: the new day's partition gets statistics once it has
 * rows (migrations/0006_partition_stats.sql). */
#define HUB_DAY_MS (86400 * 1000LL)
#define HUB_DAYSTART_WINDOW_MS (120 * 1000)
#define HUB_DAYSTART_EVERY_MS (10 * 1000)
#define HUB_DB_WAIT_SECONDS 60
/* The readiness probe: how often it asks the database, and how long it may
 * wait for an answer before the database counts as unreachable. */
#define HUB_READY_PROBE_MS 2000
#define HUB_READY_PROBE_STALL_NS (10 * 1000000000ULL)

/* The roles (STREAMING_HUB_ROLE): "all" is both. */
int hub_role_ingest(const struct hub *hub) {
    return strcmp(hub->cfg.role, "delivery") != 0;
}

int hub_role_delivery(const struct hub *hub) {
    return strcmp(hub->cfg.role, "ingest") != 0;
}

/* Every module of a role that does not run is NULL here; each figure
 * function takes NULL as "nothing". */
void hub_gauges(const struct hub *hub, struct hub_metrics_gauges *g) {
    memset(g, 0, sizeof(*g));
    g->kafka_partitions_assigned = hub_ingest_assigned(hub->ingest);
    g->ingest_partitions_paused = hub_ingest_paused(hub->ingest);
    g->ingest_records_pending = hub_ingest_pending(hub->ingest);
    g->pg_connections_up = (hub->pg ? hub_pg_connected(hub->pg) : 0) +
                           (hub->pg_ingest ? hub_pg_connected(hub->pg_ingest) : 0);
    g->pg_txns_pending = (int64_t)((hub->pg ? hub_pg_pending(hub->pg) : 0) +
                                   (hub->pg_ingest ? hub_pg_pending(hub->pg_ingest) : 0));
    g->jobs_due = hub->metrics.jobs_due;
    g->breakers_open = (int64_t)hub_dispatch_breakers_open(hub->dispatch);
    hub_http_figures(hub->http, g);
    g->ingest_http_waiting = (int64_t)hub_ingest_queue_waiting(hub);
    g->kafka_healthy = hub_ingest_healthy(hub->ingest);
}

/* The checks in the order an operator would look: draining first (the
 * process is leaving, whatever else holds), then the database, the schema,
 * the consumer. */
int hub_ready(const struct hub *hub, const char **why) {
    if (hub->draining) {
        *why = "draining";
        return 0;
    }
    if (hub->pg == NULL || hub_pg_connected(hub->pg) == 0 || hub->probe_failed ||
        (hub->probe_inflight && hub_now_ns() - hub->probe_sent_ns > HUB_READY_PROBE_STALL_NS)) {
        *why = "database unreachable";
        return 0;
    }
    if (!hub->migrations_current) {
        *why = "database schema is not current (run streaming-hub migrate)";
        return 0;
    }
    if (hub_role_ingest(hub) && !hub_ingest_ready(hub->ingest, why)) {
        return 0;
    }
    *why = NULL;
    return 1;
}

/* The probe's answer: the database is reachable when it answered, and the
 * schema current when it records every migration this binary embeds (a
 * newer binary's further ones do not matter: they are expand-only). */
static void ready_probe_done(void *arg, const struct hub_pg_outcome *out) {
    struct hub *hub = arg;
    PGresult *r = out->n_results > 0 ? out->results[0] : NULL;
    int current;

    hub->probe_inflight = 0;
    if (out->status != HUB_PG_OK || r == NULL || PQntuples(r) != 1) {
        if (!hub->probe_failed && !hub->draining) {
            hub_log(HUB_WARN, "readiness probe: the database did not answer",
                    HUB_LS("error", out->error));
        }
        hub->probe_failed = 1;
        return;
    }
    hub->probe_failed = 0;
    current = atoll(PQgetvalue(r, 0, HUB_SCHEMA_VERSIONS_COL_COUNT)) >= hub_migrations_count;
    if (current != hub->migrations_current) {
        hub_log(current ? HUB_INFO : HUB_ERROR,
                current ? "database schema is current again"
                        : "database schema is behind this binary (run streaming-hub migrate); "
                          "/readyz answers 503");
    }
    hub->migrations_current = current;
}

/* Asks the database for the migrations it records, unless the last probe
 * has not been answered yet (hub_ready counts how long that has lasted). */
static void ready_probe_cb(uv_timer_t *t) {
    struct hub *hub = t->data;
    const char *params[1] = {hub->schema_versions};
    struct hub_pg_txn *txn;

    if (hub->probe_inflight || hub->pg_ready == NULL || hub->schema_versions == NULL) {
        return;
    }
    txn = hub_pg_txn_new(hub->pg_ready, ready_probe_done, hub);
    if (txn == NULL) {
        return;
    }
    hub_pg_txn_add(txn, &hub_sql_schema_versions, 1, params, NULL, NULL);
    hub->probe_inflight = 1;
    hub->probe_sent_ns = hub_now_ns();
    hub_pg_txn_submit(txn);
}

/* The embedded migrations' names as a text[] literal ("{0001_roster.sql,
 * ...}": the names need no quoting).  malloc'd, NULL on OOM. */
static char *schema_versions_literal(void) {
    size_t len = 3;
    char *s, *p;

    for (int i = 0; i < hub_migrations_count; i++) {
        len += strlen(hub_migrations[i].name) + 1;
    }
    s = p = malloc(len);
    if (s == NULL) {
        return NULL;
    }
    *p++ = '{';
    for (int i = 0; i < hub_migrations_count; i++) {
        p += sprintf(p, "%s%s", i > 0 ? "," : "", hub_migrations[i].name);
    }
    *p++ = '}';
    *p = '\0';
    return s;
}

/* Connects, migrates (when allowed), checks the schema, creates the
 * partitions and joins the cluster, all before the loop starts: a hub that cannot reach its
 * database at start waits up to a minute, then gives up loudly. */
static int hub_prepare_database(struct hub *hub) {
    PGconn *conn = NULL;
    char retention[64];
    const char *params[1] = {retention};
    PGresult *r;
    int current;

    for (int i = 0; i < HUB_DB_WAIT_SECONDS; i++) {
        conn = hub_pg_connect_blocking(hub->cfg.postgres_dsn, "streaming-hub-start");
        if (conn != NULL) {
            break;
        }
        sleep(1);
    }
    if (conn == NULL) {
        return -1;
    }
    if (hub->cfg.auto_migrate && hub_migrate_apply(conn) < 0) {
        PQfinish(conn);
        return -1;
    }
    current = hub_migrate_current(conn);
    hub->migrations_current = current == 1;
    if (current != 1) {
        hub_log(HUB_ERROR, "database schema is not current; run `streaming-hub migrate` or set "
                           "STREAMING_HUB_AUTO_MIGRATE=true");
        PQfinish(conn);
        return -1;
    }
    snprintf(retention, sizeof(retention), "%lld milliseconds",
             (long long)hub->cfg.event_retention_ms);
    r = PQexecParams(conn, hub_sql_maintain_partitions.text, 1, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        hub_log(HUB_ERROR, "cannot create inbox partitions",
                HUB_LS("error", PQresultErrorMessage(r)));
        PQclear(r);
        PQfinish(conn);
        return -1;
    }
    PQclear(r);
    /* the hourly upkeep's other half; a failure only leaves keys for later */
    r = PQexec(conn, hub_sql_purge_midnight_keys.text);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        hub_log(HUB_WARN, "cannot purge the midnight dedup keys",
                HUB_LS("error", PQresultErrorMessage(r)));
    }
    PQclear(r);
    /* the share of the cluster-wide limits is known before the first request */
    if (hub_cluster_join(hub, conn) != 0) {
        PQfinish(conn);
        return -1;
    }
    PQfinish(conn);
    return 0;
}

/* Upkeep that failed is only logged: the next run (an hour later, or ten
 * seconds at a day's start) does the same work again. */
static void maintenance_done(void *arg, const struct hub_pg_outcome *out) {
    if (out->status != HUB_PG_OK) {
        hub_log(HUB_WARN, "partition maintenance failed", HUB_LS("error", out->error));
    }
}

/* When partition upkeep runs next, from now (unix ms): every
 * STREAMING_HUB_MAINTENANCE_INTERVAL (hourly), at the start of each UTC
 * day, and every HUB_DAYSTART_EVERY_MS in its first minutes (unless the
 * interval is shorter). */
static uint64_t maintenance_next_ms(int64_t now, int64_t every_ms) {
    int64_t into_day = now % HUB_DAY_MS;
    int64_t to_next_day = HUB_DAY_MS - into_day;

    if (into_day < HUB_DAYSTART_WINDOW_MS && HUB_DAYSTART_EVERY_MS < every_ms) {
        return HUB_DAYSTART_EVERY_MS;
    }
    return (uint64_t)(to_next_day < every_ms ? to_next_day : every_ms);
}

static void maintenance_cb(uv_timer_t *t);

static void maintenance_arm(struct hub *hub) {
    uv_timer_start(&hub->maintenance, maintenance_cb,
                   maintenance_next_ms(hub_unix_us() / 1000, hub->cfg.maintenance_interval_ms), 0);
}

/* Creates the coming days' partitions, drops the ones past the retention,
 * and analyzes a partition recorded as empty that has rows now; purges the
 * midnight keys apart, so that a partition lock not granted in time (its
 * run is only put off: partitions are made three days ahead) leaves the
 * purge alone. */
static void maintenance_cb(uv_timer_t *t) {
    struct hub *hub = t->data;
    char retention[64];
    const char *params[1] = {retention};
    struct hub_pg_txn *txn;

    maintenance_arm(hub);
    snprintf(retention, sizeof(retention), "%lld milliseconds",
             (long long)hub->cfg.event_retention_ms);
    if ((txn = hub_pg_txn_new(hub->pg, maintenance_done, hub)) != NULL) {
        hub_pg_txn_add(txn, &hub_sql_maintain_lock_timeout, 0, NULL, NULL, NULL);
        hub_pg_txn_add(txn, &hub_sql_maintain_partitions, 1, params, NULL, NULL);
        hub_pg_txn_submit(txn);
    }
    if ((txn = hub_pg_txn_new(hub->pg, maintenance_done, hub)) != NULL) {
        hub_pg_txn_add(txn, &hub_sql_purge_midnight_keys, 0, NULL, NULL, NULL);
        hub_pg_txn_submit(txn);
    }
}

/* Closes h unless it is closing already (hub_finish may meet handles the
 * start never got to, or a second signal's path). */
static void hub_close_handle(uv_handle_t *h) {
    if (!uv_is_closing(h)) {
        uv_close(h, NULL);
    }
}

/* A pool's closed callback: nothing to do but exist, as hub_pg_close
 * frees the pool itself; the loop's end is what hub_serve waits for. */
static void hub_pg_closed(void *arg) {
    (void)arg;
}

/*
 * Last step of the drain: everything that talks to the database is done.
 * Closes in the order nothing is left pointing at what went before it: the
 * listener (its idle connections are shut down: nothing is owed to them),
 * the HTTP client, the pools (a transaction still queued fails with
 * HUB_PG_ECLOSED), the watcher and the timers, then frees what the handles
 * borrowed.  The loop then ends by itself once every close callback ran.
 */
static void hub_finish(struct hub *hub) {
    if (hub->http) {
        hub_http_stop(hub->http);
        hub->http = NULL;
    }
    hub_stats_stop(hub);   /* the last counts, then its own connection closes */
    hub_cluster_stop(hub); /* the other processes take this one's share */
    hub_schemas_stop(hub);
    if (hub->httpc) {
        hub_httpc_close(hub->httpc);
        hub->httpc = NULL;
    }
    /* the pools free themselves once their handles are closed */
    if (hub->pg_ingest) {
        hub_pg_close(hub->pg_ingest, hub_pg_closed, hub);
        hub->pg_ingest = NULL;
    }
    if (hub->pg) {
        hub_pg_close(hub->pg, hub_pg_closed, hub);
        hub->pg = NULL;
    }
    if (hub->pg_ready) {
        hub_pg_close(hub->pg_ready, hub_pg_closed, hub);
        hub->pg_ready = NULL;
    }
    hub_policy_watch_stop(hub->policy_watch);
    hub->policy_watch = NULL;
    uv_timer_stop(&hub->maintenance);
    uv_timer_stop(&hub->drain_deadline);
    uv_timer_stop(&hub->drain_abort);
    uv_timer_stop(&hub->ready_probe);
    hub_close_handle((uv_handle_t *)&hub->ingest_turn);
    hub_close_handle((uv_handle_t *)&hub->maintenance);
    hub_close_handle((uv_handle_t *)&hub->drain_deadline);
    hub_close_handle((uv_handle_t *)&hub->drain_abort);
    hub_close_handle((uv_handle_t *)&hub->ready_probe);
    hub_close_handle((uv_handle_t *)&hub->sig_int);
    hub_close_handle((uv_handle_t *)&hub->sig_term);
    hub_close_handle((uv_handle_t *)&hub->sig_hup);
    hub_opevents_stop(hub);
    /* after the dispatcher: no job holds a generation any more */
    hub_policies_free(hub->policies);
    hub->policies = NULL;
    hub_api_events_free(hub);
    /* HTTP ingest requests still waiting get 503; the queue goes once its
     * transactions have failed with the pools */
    hub_ingest_queue_release(hub);
}

/* The HTTP requests in flight are answered (and the HTTP ingest
 * transactions of clients that hung up are over): the pools may close. */
static void hub_http_drained(void *arg) {
    hub_finish(arg);
}

/* The last step before hub_finish: wait for the HTTP requests in flight,
 * which the listener has refused new ones beside since the drain began. */
static void hub_wait_http(struct hub *hub) {
    if (hub->http != NULL) {
        hub_http_when_drained(hub->http, hub_http_drained, hub);
    } else {
        hub_finish(hub);
    }
}

static void hub_dispatch_stopped(void *arg) {
    struct hub *hub = arg;
    hub->dispatch = NULL;
    hub_log(HUB_INFO, "dispatcher drained");
    hub_wait_http(hub);
}

/* Ingest drains first (its batches create jobs), then the dispatcher, then
 * the HTTP requests still in flight (which drained beside them). */
static void hub_ingest_stopped(void *arg) {
    struct hub *hub = arg;
    hub->ingest = NULL;
    hub_log(HUB_INFO, "ingest drained");
    if (hub->dispatch) {
        hub_dispatch_stop(hub->dispatch, hub_dispatch_stopped, hub);
    } else {
        hub_wait_http(hub);
    }
}

/* STREAMING_HUB_SHUTDOWN_TIMEOUT passed with work in flight: exit 1.  What
 * was not committed is replayed (Kafka from the committed offsets, HTTP
 * clients retry, leases expire), so this is safe, only not clean. */
static void drain_deadline_cb(uv_timer_t *t) {
    struct hub *hub = t->data;
    hub_log(HUB_ERROR, "drain deadline passed; exiting with work in flight (it will be replayed)",
            HUB_LI("timeout_ms", hub->cfg.shutdown_timeout_ms));
    hub->exit_code = 1;
    uv_stop(hub->loop);
}

/* Time the drain keeps, past the abort, for the outcomes of what it
 * stopped waiting for to be written: a quarter of the budget, at most 5 s. */
static uint64_t drain_abort_ms(int64_t timeout_ms) {
    int64_t keep = timeout_ms / 4 < 5000 ? timeout_ms / 4 : 5000;
    return (uint64_t)(timeout_ms - keep);
}

/* Most of the drain's budget is gone: requests still waiting for a
 * destination's answer (attempts, verification probes) would keep it past
 * its deadline and exit 1 with their leases left to expire (each counted as
 * a reclaim toward poison).  They end now, unanswered: their jobs go back
 * unattempted, as a clean stop gives its leases back, and are attempted
 * again later (at least once). */
static void drain_abort_cb(uv_timer_t *t) {
    struct hub *hub = t->data;
    size_t n = hub_httpc_inflight(hub->httpc);

    if (n > 0) {
        hub_log(HUB_WARN,
                "drain: no longer waiting for destinations' answers; their jobs go back "
                "unattempted",
                HUB_LI("requests", (int64_t)n));
        hub_httpc_abort(hub->httpc);
    }
}

/*
 * The first signal starts the drain (see the top of this file for its
 * steps); why names the signal for the log.  Everything after this runs
 * from the modules' own completion callbacks: ingest stopped ──► the
 * dispatcher stopped ──► the HTTP requests answered ──► hub_finish.  The
 * deadline timer bounds the whole of it.
 */
static void hub_begin_drain(struct hub *hub, const char *why) {
    if (hub->draining) {
        /* a second signal: stop at once; in-flight work is replayed later,
         * and the exit status says the drain was cut short */
        hub_log(HUB_WARN, "second signal: stopping now");
        hub->exit_code = 1;
        uv_stop(hub->loop);
        return;
    }
    hub->draining = 1;
    hub_log(HUB_INFO, "draining", HUB_LS("signal", why));
    uv_timer_start(&hub->drain_deadline, drain_deadline_cb, (uint64_t)hub->cfg.shutdown_timeout_ms,
                   0);
    uv_timer_start(&hub->drain_abort, drain_abort_cb, drain_abort_ms(hub->cfg.shutdown_timeout_ms),
                   0);
    /* at once: /readyz says draining, new requests are answered 503, the
     * listener stays open for them; no new attempt starts */
    hub_http_drain(hub->http);
    if (hub->dispatch) {
        hub_dispatch_quiesce(hub->dispatch);
    }
    if (hub->ingest) {
        hub_ingest_stop(hub->ingest, hub_ingest_stopped, hub);
    } else {
        hub_ingest_stopped(hub);
    }
}

/* SIGHUP reloads the policies (not while draining: the generations are
 * being released); SIGTERM and SIGINT drain. */
static void signal_cb(uv_signal_t *s, int signum) {
    struct hub *hub = s->data;
    if (signum == SIGHUP) {
        if (!hub->draining && hub->policies != NULL) {
            hub_log(HUB_INFO, "SIGHUP: reloading policies");
            hub_policies_reload(hub->policies, NULL, NULL);
        }
        return;
    }
    hub_begin_drain(hub, signum == SIGINT ? "SIGINT" : "SIGTERM");
}

/* The `dev` command's banner (stdout, not a log line): where everything
 * listens and the admin token to try it with. */
static void print_banner(const struct hub *hub) {
    /* the address bound, which differs from the configured one with port 0 */
    const char *addr =
        hub->http != NULL ? hub_http_bound_addr(hub->http) : hub->cfg.http_listen_addr;

    fprintf(stdout,
            "\n  streaming-hub %s (dev)\n\n"
            "  HTTP API      http://%s\n"
            "  Kafka         %s   (also in %s/kafka.bootstrap)\n"
            "  PostgreSQL    %s\n"
            "  Admin token   %s\n"
            "  Console       http://%s/console/   (sign in with the admin token)\n"
            "  Destinations  %s\n\n"
            "  Try: curl -H 'Authorization: Bearer %s' http://%s/admin/tenants\n"
            "  Ctrl-C stops everything.\n\n",
            HUB_VERSION, addr, hub->brokers, hub->cfg.data_dir, hub->cfg.postgres_dsn,
            hub->cfg.admin_token ? hub->cfg.admin_token : "(none)", addr,
            hub->cfg.allow_private_sinks
                ? "loopback and private addresses allowed (dev default; `serve` refuses them)"
                : "public addresses only (STREAMING_HUB_ALLOW_PRIVATE_SINKS=false)",
            hub->cfg.admin_token ? hub->cfg.admin_token : "", addr);
    fflush(stdout);
}

int hub_serve_with(struct hub_config *cfg, int banner) {
    struct hub *hub = calloc(1, sizeof(*hub));
    int rc = 1;

    if (hub == NULL) {
        return 1;
    }
    hub->cfg = *cfg;
    memset(cfg, 0, sizeof(*cfg)); /* the hub owns the strings now */
    hub->loop = uv_default_loop();
    /* SIGHUP reloads the policies once the loop runs; until then (a start
     * waits up to a minute for its database) its default action would end
     * the process that an operator only asked to reload */
    signal(SIGHUP, SIG_IGN);

    if (hub->cfg.postgres_dsn == NULL) {
        fprintf(stderr, "streaming-hub: STREAMING_HUB_POSTGRES_DSN: required for serve\n");
        rc = 2;
        goto fail_cfg;
    }
    /* empty, as the container image sets it: no embedded cluster by accident */
    if (hub_role_ingest(hub) && hub->cfg.kafka_brokers[0] == '\0') {
        fprintf(stderr,
                "streaming-hub: STREAMING_HUB_KAFKA_BROKERS: required for role %s "
                "(a bootstrap list host:port,..., or 'embedded')\n",
                hub->cfg.role);
        rc = 2;
        goto fail_cfg;
    }
    if (hub->cfg.kek != NULL) {
        char kerr[160];
        const char *previous = hub->cfg.kek_previous; /* open only (crypto.h) */
        if (hub_keyring_parse(hub->cfg.kek, previous, &hub->kek, kerr, sizeof(kerr)) != 0) {
            fprintf(stderr, "streaming-hub: %s\n", kerr);
            rc = 2;
            goto fail_cfg;
        }
        hub->has_kek = 1;
    } else {
        hub_log(HUB_WARN, "STREAMING_HUB_KEK is not set: subscriptions cannot be created");
    }
    if (hub->cfg.admin_token == NULL) {
        hub_log(HUB_WARN, "STREAMING_HUB_ADMIN_TOKEN is not set: the admin API answers 401");
    }
    {
        struct hub_policy_limits lim = hub_policy_limits_from(&hub->cfg);
        hub->policies = hub_policies_new(hub->loop, hub->cfg.policy_dir, &lim);
        if (hub->policies == NULL || hub_opevents_start(hub) != 0) {
            goto fail_cfg;
        }
    }
    if (hub_prepare_database(hub) != 0) {
        goto fail_cfg;
    }

    /* Two pools: ingest writes in big pipelined transactions that would
     * make API requests wait behind them; the API pool also carries
     * maintenance and the dispatcher's upkeep (reclaims, samples). */
    hub->pg = hub_pg_new(hub->loop, hub->cfg.postgres_dsn, HUB_API_PG_CONNECTIONS,
                         "streaming-hub-api", NULL);
    if (hub->pg == NULL) {
        goto fail_cfg;
    }
    /* one transaction per connection: pipelined, another tenant's request
     * would wait behind a statement that waits (api_util.h) */
    hub_pg_set_max_inflight(hub->pg, 1);
    /* the probe on a connection of its own: queued behind API work, it
     * would turn /readyz 503 whenever a tenant's statements wait */
    hub->pg_ready = hub_pg_new(hub->loop, hub->cfg.postgres_dsn, 1, "streaming-hub-ready", NULL);
    if (hub->pg_ready == NULL) {
        hub_pg_close(hub->pg, NULL, NULL);
        uv_run(hub->loop, UV_RUN_DEFAULT);
        goto fail_cfg;
    }
    /* every role: HTTP ingest runs in the delivery role too, and no batch
     * is checked (or stored) before the registry's first load */
    hub_schemas_start(hub);
    /* the ingest writers, in every role: the delivery role serves HTTP
     * ingest too (two connections there), and on the API pool, one
     * transaction a connection, its groups would take the connections
     * every tenant's API requests need */
    hub->pg_ingest = hub_pg_new(hub->loop, hub->cfg.postgres_dsn,
                                hub_role_ingest(hub) || hub->cfg.ingest_pg_connections < 2
                                    ? (int)hub->cfg.ingest_pg_connections
                                    : 2,
                                "streaming-hub-ingest", HUB_PG_GENERIC_PLANS);
    if (hub->pg_ingest == NULL) {
        goto fail_pg;
    }
    if (hub_role_ingest(hub)) {
        /* the embedded cluster runs in this process, on librdkafka's
         * threads: it lives as long as the hub and is stopped after the loop */
        if (strcmp(hub->cfg.kafka_brokers, "embedded") == 0) {
            hub->mock = hub_kafka_mock_start(1, hub->cfg.data_dir, NULL, 0);
            if (hub->mock == NULL) {
                goto fail_pg;
            }
            hub->brokers = strdup(hub_kafka_mock_bootstraps(hub->mock));
        } else {
            hub->brokers = strdup(hub->cfg.kafka_brokers);
        }
        if (hub_ingest_start(hub, &hub->ingest) != 0) {
            goto fail_kafka;
        }
    }
    {
        struct hub_httpc_options hopt = {
            .allow_private = hub->cfg.allow_private_sinks,
            .excerpt_bytes = 1024,
            .max_body_bytes = 1 << 20,
            /* keep-alive for every worker's connection, to several destinations */
            .cached_connections =
                hub->cfg.dispatch_workers * 4 > 64 ? (long)hub->cfg.dispatch_workers * 4 : 64,
            .user_agent = "streaming-hub/" HUB_VERSION,
            .ca_file = hub->cfg.delivery_ca_file,
        };
        hub->httpc = hub_httpc_new(hub->loop, &hopt);
        if (hub->httpc == NULL) {
            goto fail_ingest;
        }
    }
    if (hub_role_delivery(hub)) {
        if (!hub->has_kek) {
            hub_log(HUB_WARN, "no STREAMING_HUB_KEK: the dispatcher is not started");
        } else if (hub_dispatch_start(hub, &hub->dispatch) != 0) {
            goto fail_ingest;
        }
    }
    /* the listener last: /readyz and the API answer only once everything
     * they report on or call into exists */
    if (hub_http_start(hub, &hub->http) != 0) {
        goto fail_ingest;
    }

    hub_cluster_start(hub); /* last: nothing after them can fail */
    hub_stats_start(hub);
    /* signals and timers: SIGTERM/SIGINT drain, SIGHUP reloads the
     * policies; partition upkeep hourly (and at each UTC day's start); the
     * readiness probe, whose first answer comes HUB_READY_PROBE_MS in (the
     * start-up check above already found the schema current) */
    uv_signal_init(hub->loop, &hub->sig_int);
    uv_signal_init(hub->loop, &hub->sig_term);
    uv_signal_init(hub->loop, &hub->sig_hup);
    hub->sig_int.data = hub->sig_term.data = hub->sig_hup.data = hub;
    uv_signal_start(&hub->sig_int, signal_cb, SIGINT);
    uv_signal_start(&hub->sig_term, signal_cb, SIGTERM);
    uv_signal_start(&hub->sig_hup, signal_cb, SIGHUP);
    uv_check_init(hub->loop, &hub->ingest_turn);
    hub->ingest_turn.data = hub;
    uv_timer_init(hub->loop, &hub->maintenance);
    uv_timer_init(hub->loop, &hub->drain_deadline);
    uv_timer_init(hub->loop, &hub->drain_abort);
    uv_timer_init(hub->loop, &hub->ready_probe);
    hub->maintenance.data = hub->drain_deadline.data = hub->drain_abort.data = hub;
    hub->ready_probe.data = hub;
    maintenance_arm(hub);
    hub->schema_versions = schema_versions_literal();
    uv_timer_start(&hub->ready_probe, ready_probe_cb, HUB_READY_PROBE_MS, HUB_READY_PROBE_MS);
    if (hub->cfg.policy_watch) {
        hub->policy_watch = hub_policy_watch_start(hub->loop, hub->cfg.policy_dir, hub->policies);
    }

    hub_log(HUB_INFO, "streaming-hub started", HUB_LS("version", HUB_VERSION),
            HUB_LS("role", hub->cfg.role), HUB_LS("env", hub->cfg.env));
    if (banner) {
        print_banner(hub);
    }
    /* runs until the drain has closed every handle (or the deadline, or a
     * second signal, stopped the loop) */
    uv_run(hub->loop, UV_RUN_DEFAULT);
    rc = hub->exit_code;
    if (hub->ingest != NULL || hub->http != NULL || hub->dispatch != NULL) {
        /* the drain deadline cut things short: exit without tidying up */
        hub_log(HUB_INFO, "stopped");
        return rc;
    }
    uv_run(hub->loop, UV_RUN_DEFAULT); /* let close callbacks run */
    uv_loop_close(hub->loop);
    hub_kafka_mock_stop(hub->mock);
    free(hub->brokers);
    free(hub->schema_versions);
    hub_config_free(&hub->cfg);
    free(hub);
    hub_log(HUB_INFO, "stopped");
    return rc;

    /* The unwind of a failed start, in reverse order of the steps above:
     * what was started last is undone first. */
fail_ingest:
    if (hub->ingest || hub->dispatch || hub->httpc) {
        /* unreachable in practice: ingest stops asynchronously; exit instead */
        return 1;
    }
fail_kafka:
    hub_kafka_mock_stop(hub->mock);
    free(hub->brokers);
fail_pg:
    hub_schemas_stop(hub);
    if (hub->pg_ingest) {
        hub_pg_close(hub->pg_ingest, NULL, NULL);
    }
    hub_pg_close(hub->pg_ready, NULL, NULL);
    hub_pg_close(hub->pg, NULL, NULL);
    uv_run(hub->loop, UV_RUN_DEFAULT);
fail_cfg:
    hub_cluster_stop(hub); /* joined, never started: its row ages out */
    hub_opevents_stop(hub);
    hub_policies_free(hub->policies);
    hub_config_free(&hub->cfg);
    free(hub);
    return rc;
}

/* `serve` without the dev banner: the command the Deployments run. */
int hub_serve(struct hub_config *cfg) {
    return hub_serve_with(cfg, 0);
}
