/*
 * metrics — counters, gauges and histograms rendered as Prometheus text.
 *
 * Updated only on the loop thread, so plain integers suffice.  Label sets are
 * fixed enums: tenant ids never become labels (bounded cardinality).
 */
#ifndef HUB_METRICS_H
#define HUB_METRICS_H

#include <stdint.h>
#include <stdio.h>

enum hub_verdict {
    HUB_V_ACCEPTED = 0,
    HUB_V_DUPLICATE,
    HUB_V_DROPPED_UNKNOWN_TENANT,
    HUB_V_DROPPED_INACTIVE_TENANT,
    HUB_V_QUARANTINED_INVALID,
    HUB_V_QUARANTINED_CONFLICT,
    HUB_V_QUARANTINED_TOO_LARGE,
    HUB_V_QUARANTINED_SCHEMA,         /* the payload failed its registered schema (SPEC §3.5) */
    HUB_V_QUARANTINED_UNKNOWN_SCHEMA, /* its major has no schema; the type says quarantine */
    HUB_V__COUNT
};

/* What the schema step found for one event (streaming_hub_schema_checks_total). */
enum hub_schema_check {
    HUB_SCHEMA_CHECK_VALID = 0,        /* passed its schema */
    HUB_SCHEMA_CHECK_INVALID,          /* failed it (quarantined schema_violation) */
    HUB_SCHEMA_CHECK_NOT_JSON,         /* not JSON (quarantined schema_violation) */
    HUB_SCHEMA_CHECK_LIMIT,            /* stopped at a work bound (quarantined schema_violation) */
    HUB_SCHEMA_CHECK_UNKNOWN_ACCEPTED, /* no schema for its major: accepted by setting */
    HUB_SCHEMA_CHECK_UNKNOWN_QUARANTINED, /* ... quarantined by setting */
    HUB_SCHEMA_CHECK__COUNT
};

enum hub_delivery_outcome {
    HUB_D_SUCCEEDED = 0,
    HUB_D_FAILED,
    HUB_D_SHED,
    HUB_D_DEAD,
    HUB_D_POISON,
    HUB_D_DEFERRED,
    HUB_D__COUNT
};

/* Requests the HTTP listener refused to protect the process (http_limits.c),
 * by reason: streaming_hub_http_refused_total{reason}. */
enum hub_http_refusal {
    HUB_HTTP_REFUSED_TOO_LARGE = 0, /* "too_large": Content-Length over the largest body, 413
                                     * before the body is read */
    HUB_HTTP_REFUSED_BODY_BYTES,    /* "body_bytes": the bodies held at once at their cap, 503 */
    HUB_HTTP_REFUSED_INGEST_QUEUE,  /* "ingest_queue": HTTP ingest requests at their bound, 503 */
    HUB_HTTP_REFUSED_INGEST_SHARE,  /* "ingest_key_share": one API key holds half of them, 503 */
    HUB_HTTP_REFUSED_DRAINING,      /* "draining": SIGTERM received, 503 */
    HUB_HTTP_REFUSED__COUNT
};
/* Routes whose refused bad input is counted (streaming_hub_api_invalid_requests_total). */
enum hub_api_invalid_route {
    HUB_API_INVALID_PULL = 0,
    HUB_API_INVALID_STATS,
    HUB_API_INVALID__COUNT
};

#define HUB_HIST_BUCKETS 14

struct hub_histogram {
    uint64_t counts[HUB_HIST_BUCKETS + 1]; /* last one is +Inf */
    double sum;
    uint64_t count;
};

struct hub_metrics {
    uint64_t ingest_records[HUB_V__COUNT];
    struct hub_histogram ingest_batch_seconds;
    struct hub_histogram ingest_record_age_seconds; /* produce (record timestamp) → consumed */
    uint64_t ingest_batch_failures;  /* partition batches that failed and were retried */
    uint64_t ingest_commit_failures; /* offset commits refused by the broker */
    uint64_t http_requests;
    uint64_t deliveries[HUB_D__COUNT];
    struct hub_histogram delivery_attempt_seconds;
    uint64_t subscriptions_auto_disabled;
    uint64_t policy_filtered;          /* jobs a policy's match turned down */
    uint64_t retry_schedule_fallbacks; /* malformed stored schedules replaced by the default */
    int64_t jobs_due;                  /* sampled by the dispatcher (capped) */
    /* ingest and the HTTP listener */
    uint64_t http_refused[HUB_HTTP_REFUSED__COUNT];
    uint64_t http_accept_paused;     /* times the listener stopped accepting at its cap */
    uint64_t ingest_kafka_refetches; /* records re-read from Kafka after running out of memory */
    /* pull pages (api_events_pull.c, pull_horizon.c): each pull's wait for
     * its horizon; pulls answered below a horizon still held; sequences
     * allocated above the horizon and the age of the oldest horizon still
     * held, as last seen; pages ended early by STREAMING_HUB_PULL_PAGE_BYTES */
    struct hub_histogram pull_holdback_seconds;
    uint64_t pull_holdback_timeouts;
    int64_t pull_horizon_lag;
    int64_t pull_holdback_oldest_ms;
    uint64_t pull_pages_byte_capped;
    /* refused bad input by route, and when each route last logged one */
    uint64_t api_invalid[HUB_API_INVALID__COUNT];
    uint64_t api_invalid_logged_ns[HUB_API_INVALID__COUNT];
    /* per-tenant figures (stats.c): rollup writes that committed, that
     * failed, and counts dropped (an outcome unknown, or out of memory) */
    uint64_t stats_flushes;
    uint64_t stats_flush_errors;
    uint64_t stats_counts_lost;
    /* verification probes not sent: their tenant had as many in flight as
     * it may (api_verify.c) */
    uint64_t verify_probes_refused;
    /* API transactions of a tenant waiting for its turn (api_util.c), and
     * requests refused 429 because 32 already were */
    int64_t api_turns_waiting;
    uint64_t api_turns_refused;
    /* cluster membership (cluster.c): live processes sharing the limits */
    int64_t cluster_processes;
    /* the schema registry (schema_registry.c, ingest_schema.c): the
     * generation in use, and payloads checked by result */
    int64_t schema_generation;
    uint64_t schema_checks[HUB_SCHEMA_CHECK__COUNT];
    /* delivery jobs handed to the dispatcher's queue: leased by the ingest
     * transaction (dispatch_fast.c), or by a claim */
    uint64_t dispatch_jobs_fast;
    uint64_t dispatch_jobs_claimed;
    uint64_t dispatch_claims; /* claim statements sent (tenant samples not counted) */
};

/* verdict and reason labels of a verdict ("accepted", ""), ("dropped", "unknown_tenant")... */
void hub_verdict_labels(enum hub_verdict v, const char **verdict, const char **reason);

void hub_histogram_observe(struct hub_histogram *h, double seconds);

/* Gauges that the owner computes at render time. */
struct hub_metrics_gauges {
    int64_t kafka_partitions_assigned;
    int64_t ingest_partitions_paused;
    int64_t ingest_records_pending;
    int64_t pg_connections_up;
    int64_t pg_txns_pending;
    int64_t jobs_due;
    int64_t breakers_open;
    /* ingest and the HTTP listener */
    int64_t http_connections;
    int64_t http_body_bytes;      /* request bodies held, as counted against their cap */
    int64_t http_ingest_requests; /* HTTP ingest requests in progress */
    int64_t ingest_http_waiting;  /* of them, waiting for a transaction */
    int64_t kafka_healthy;        /* 1: broker connection and group membership now */
};

/* Writes the Prometheus text exposition of m and g to out. */
void hub_metrics_render(const struct hub_metrics *m, const struct hub_metrics_gauges *g, FILE *out);

/* Writes one histogram (HELP, TYPE, buckets, sum, count) for a module that
 * keeps its own (the policy registry). */
void hub_histogram_render(FILE *out, const char *name, const char *help,
                          const struct hub_histogram *h);

/* Per-destination concurrency (dispatch_caps.c): one labelled series of a
 * histogram, its _bucket, _sum and _count lines without HELP and TYPE;
 * labels is the label text without braces (`origin="..."`, escaped). */
void hub_histogram_render_series(FILE *out, const char *name, const char *labels,
                                 const struct hub_histogram *h);

#endif
