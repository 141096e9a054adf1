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
    HUB_V__COUNT
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
    uint64_t ingest_batch_failures; /* partition batches that failed and were retried */
    uint64_t ingest_commit_failures; /* offset commits refused by the broker */
    uint64_t http_requests;
    uint64_t deliveries[HUB_D__COUNT];
    struct hub_histogram delivery_attempt_seconds;
    uint64_t subscriptions_auto_disabled;
    uint64_t policy_filtered; /* jobs a policy's match turned down */
    uint64_t retry_schedule_fallbacks; /* malformed stored schedules replaced by the default */
    int64_t jobs_due; /* sampled by the dispatcher (capped) */
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
};

/* Writes the Prometheus text exposition of m and g to out. */
void hub_metrics_render(const struct hub_metrics *m, const struct hub_metrics_gauges *g,
                        FILE *out);

#endif
