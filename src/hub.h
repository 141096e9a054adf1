/*
 * hub — the one context that every module hangs off (no other global
 * mutable state, see log.h for the single documented exception).
 *
 * All fields are owned by the hub and touched only on the loop thread.
 */
#ifndef HUB_HUB_H
#define HUB_HUB_H

#include <uv.h>

#include "config.h"
#include "crypto.h"
#include "metrics.h"

struct hub_pg;
struct hub_ingest;
struct hub_kafka_mock;
struct hub_http;
struct hub_httpc;
struct hub_dispatch;
struct hub_buckets;
struct hub_ingest_queue;
struct hub_pull_horizon;
struct hub_stats;
struct hub_cluster;
struct hub_schemas;
struct subs_probe;
struct pull_held;

struct hub {
    uv_loop_t *loop;
    struct hub_config cfg; /* owned; loaded before hub_serve() */
    struct hub_metrics metrics;
    struct hub_pg *pg;           /* API and maintenance pool */
    struct hub_pg *pg_ready;     /* the readiness probe's one connection */
    struct hub_pg *pg_ingest;    /* ingest writers (separate so ingest never waits on the API) */
    struct hub_ingest *ingest;   /* NULL for the delivery role */
    struct hub_kafka_mock *mock; /* embedded Kafka, when KAFKA_BROKERS=embedded */
    struct hub_http *http;
    struct hub_httpc *httpc;               /* outgoing HTTP (verification probes, deliveries) */
    struct hub_dispatch *dispatch;         /* NULL for the ingest role */
    struct hub_policies *policies;         /* Lua policies (SPEC §8), reloaded on SIGHUP */
    struct hub_policy_watch *policy_watch; /* reloads them on file changes, or NULL */
    struct hub_buckets *pull_buckets;      /* pull API rate limits (api_events.c) */
    struct hub_buckets *ingest_buckets;    /* tenant ingest quotas (api_events.c) */
    struct hub_ingest_queue *ingest_queue; /* HTTP ingest requests (ingest.c) */
    struct hub_keyring kek;                /* STREAMING_HUB_KEK (+ _PREVIOUS), when has_kek */
    struct hub_pull_horizon *pull_horizon; /* pull pages' horizon (pull_horizon.c), lazily */
    struct hub_stats *stats;               /* per-tenant counts (stats.c) */
    struct hub_cluster *cluster;           /* process membership (cluster.c) */
    struct hub_schemas *schemas;           /* the schema registry (schema_registry.c) */
    struct hub_opevents *opevents;         /* operational events (opevents.c), or NULL */
    struct subs_probe *probes;             /* verification probes in flight (api_verify.c) */
    struct pull_held *pull_held;           /* pull pages not yet sent, by tenant (pull pages) */
    size_t n_probes;
    int has_kek;
    char *brokers;          /* resolved bootstrap list */
    int migrations_current; /* schema is at the version this binary expects */
    int draining;           /* SIGTERM/SIGINT received */
    int exit_code;
    uv_signal_t sig_int;
    uv_signal_t sig_term;
    uv_signal_t sig_hup;
    uv_check_t ingest_turn; /* starts the waiting HTTP ingest requests' groups once a loop
                             * turn's requests are all in (ingest_http.c) */
    uv_timer_t maintenance; /* partition upkeep */
    uv_timer_t drain_deadline;
    uv_timer_t drain_abort; /* stops waiting for answers of attempts and probes still out */
    /* the readiness probe (hub_ready): the database answers, the schema is
     * current; every HUB_READY_PROBE_MS on the API pool */
    uv_timer_t ready_probe;
    char *schema_versions; /* the embedded migrations as a text[] literal */
    int probe_inflight;
    uint64_t probe_sent_ns;
    int probe_failed; /* the last probe did not get its answer */
};

/*
 * Runs `serve` with an already-loaded configuration until SIGINT/SIGTERM.
 * Returns the process exit code.
 */
int hub_serve(struct hub_config *cfg);

/* hub_serve, printing the dev banner once everything listens. */
int hub_serve_with(struct hub_config *cfg, int banner);

/* Process role predicates (STREAMING_HUB_ROLE). */
int hub_role_ingest(const struct hub *hub);
int hub_role_delivery(const struct hub *hub);

/* Fills the render-time gauges from the live modules. */
void hub_gauges(const struct hub *hub, struct hub_metrics_gauges *g);

/*
 * 1 when /readyz should answer 200; otherwise 0 and *why says which check
 * failed (SPEC §9): draining; the database unreachable (no connection up,
 * or the readiness probe failed or got no answer for 10 s); the schema not
 * at this binary's migrations (checked at start and by every probe); for
 * ingest roles, the consumer not yet in its group or without broker or
 * group for STREAMING_HUB_READY_KAFKA_WINDOW (hub_ingest_ready).  Each
 * check recovers by itself.
 */
int hub_ready(const struct hub *hub, const char **why);

#endif
