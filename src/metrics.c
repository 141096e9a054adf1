/*
 * metrics — Prometheus text exposition.
 */
#include "metrics.h"

/* Seconds; tuned for database batches and HTTP attempts (1 ms .. 30 s). */
static const double hist_bounds[HUB_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                     0.25,  0.5,    1,     2.5,  5,     10,   30};

void hub_verdict_labels(enum hub_verdict v, const char **verdict, const char **reason) {
    static const char *const names[HUB_V__COUNT][2] = {
        {"accepted", ""},
        {"duplicate", ""},
        {"dropped", "unknown_tenant"},
        {"dropped", "inactive_tenant"},
        {"quarantined", "invalid_envelope"},
        {"quarantined", "digest_conflict"},
        {"quarantined", "too_large"},
        {"quarantined", "schema_violation"},
        {"quarantined", "unknown_schema_version"},
    };
    *verdict = names[v][0];
    *reason = names[v][1];
}

void hub_histogram_observe(struct hub_histogram *h, double seconds) {
    int i = 0;
    while (i < HUB_HIST_BUCKETS && seconds > hist_bounds[i]) {
        i++;
    }
    h->counts[i]++;
    h->sum += seconds;
    h->count++;
}

static void render_histogram(FILE *out, const char *name, const char *help,
                             const struct hub_histogram *h) {
    uint64_t cum = 0;
    fprintf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < HUB_HIST_BUCKETS; i++) {
        cum += h->counts[i];
        fprintf(out, "%s_bucket{le=\"%g\"} %llu\n", name, hist_bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[HUB_HIST_BUCKETS];
    fprintf(out, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
            (unsigned long long)cum, name, h->sum, name, (unsigned long long)h->count);
}

static void render_scalar(FILE *out, const char *name, const char *type, const char *help,
                          long long v) {
    fprintf(out, "# HELP %s %s\n# TYPE %s %s\n%s %lld\n", name, help, name, type, name, v);
}

/* The pull horizon, per-tenant figures and cluster membership: the
 * counters and gauges as a table, then the histogram, the labelled
 * counter and the one gauge in seconds. */
static void render_p3(const struct hub_metrics *m, FILE *out) {
    static const char *const routes[HUB_API_INVALID__COUNT] = {"pull", "stats"};
    const struct {
        const char *name, *type, *help;
        long long v;
    } rows[] = {
        {"streaming_hub_pull_holdback_timeouts_total", "counter",
         "Pulls answered below a horizon still held after STREAMING_HUB_PULL_HOLD_MAX.",
         (long long)m->pull_holdback_timeouts},
        {"streaming_hub_pull_horizon_lag", "gauge",
         "Sequences allocated above the pull horizon when it was last taken.", m->pull_horizon_lag},
        {"streaming_hub_pull_pages_byte_capped_total", "counter",
         "Pull pages that ended early at STREAMING_HUB_PULL_PAGE_BYTES.",
         (long long)m->pull_pages_byte_capped},
        {"streaming_hub_stats_flushes_total", "counter",
         "Writes of this process's per-tenant counts that committed.", (long long)m->stats_flushes},
        {"streaming_hub_stats_flush_errors_total", "counter",
         "Writes of per-tenant counts that failed.", (long long)m->stats_flush_errors},
        {"streaming_hub_stats_counts_lost_total", "counter",
         "Per-tenant counts dropped rather than risk counting them twice.",
         (long long)m->stats_counts_lost},
        {"streaming_hub_verification_probes_refused_total", "counter",
         "Verification probes not sent: their tenant had as many in flight as it may.",
         (long long)m->verify_probes_refused},
        {"streaming_hub_api_tenant_waiting", "gauge",
         "API transactions waiting for their tenant's turn (a tenant's run one at a time).",
         m->api_turns_waiting},
        {"streaming_hub_api_tenant_refused_total", "counter",
         "API requests answered 429: their tenant had 32 transactions waiting for its turn.",
         (long long)m->api_turns_refused},
        {"streaming_hub_cluster_processes", "gauge",
         "Live hub processes the pull rate and ingest quotas are shared by.", m->cluster_processes},
    };

    render_histogram(out, "streaming_hub_pull_holdback_seconds",
                     "Time a pull waited for ingest transactions holding lower sequences.",
                     &m->pull_holdback_seconds);
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        render_scalar(out, rows[i].name, rows[i].type, rows[i].help, rows[i].v);
    }
    fprintf(out,
            "# HELP streaming_hub_pull_holdback_oldest_seconds Age of the oldest pull horizon "
            "still held back, at the last check.\n"
            "# TYPE streaming_hub_pull_holdback_oldest_seconds gauge\n"
            "streaming_hub_pull_holdback_oldest_seconds %.3f\n"
            "# HELP streaming_hub_api_invalid_requests_total Requests refused as bad input, by "
            "route.\n"
            "# TYPE streaming_hub_api_invalid_requests_total counter\n",
            (double)m->pull_holdback_oldest_ms / 1000.0);
    for (int r = 0; r < HUB_API_INVALID__COUNT; r++) {
        fprintf(out, "streaming_hub_api_invalid_requests_total{route=\"%s\"} %llu\n", routes[r],
                (unsigned long long)m->api_invalid[r]);
    }
}

/* The schema registry's generation and the schema step's results. */
static void render_schemas(const struct hub_metrics *m, FILE *out) {
    static const char *const results[HUB_SCHEMA_CHECK__COUNT] = {
        "valid", "invalid", "not_json", "limit", "unknown_accepted", "unknown_quarantined",
    };

    render_scalar(out, "streaming_hub_schema_generation", "gauge",
                  "Generation of the schema registry this process uses.", m->schema_generation);
    fprintf(out, "# HELP streaming_hub_schema_checks_total Events of types with registered "
                 "schemas, by what the schema step found.\n"
                 "# TYPE streaming_hub_schema_checks_total counter\n");
    for (int r = 0; r < HUB_SCHEMA_CHECK__COUNT; r++) {
        fprintf(out, "streaming_hub_schema_checks_total{result=\"%s\"} %llu\n", results[r],
                (unsigned long long)m->schema_checks[r]);
    }
}

/* The delivery fast path (dispatch_fast.c): jobs by how they reached the
 * dispatcher. */
static void render_fast_path(const struct hub_metrics *m, FILE *out) {
    fprintf(out,
            "# HELP streaming_hub_dispatch_jobs_total Delivery jobs handed to this process's "
            "dispatcher, by path: fast (leased by the ingest transaction that stored the event) "
            "or claim.\n# TYPE streaming_hub_dispatch_jobs_total counter\n"
            "streaming_hub_dispatch_jobs_total{path=\"fast\"} %llu\n"
            "streaming_hub_dispatch_jobs_total{path=\"claim\"} %llu\n"
            "# HELP streaming_hub_dispatch_claims_total Claim transactions this process's "
            "dispatcher ran (each leases up to a batch of due jobs).\n"
            "# TYPE streaming_hub_dispatch_claims_total counter\n"
            "streaming_hub_dispatch_claims_total %llu\n",
            (unsigned long long)m->dispatch_jobs_fast, (unsigned long long)m->dispatch_jobs_claimed,
            (unsigned long long)m->dispatch_claims);
}

void hub_metrics_render(const struct hub_metrics *m, const struct hub_metrics_gauges *g,
                        FILE *out) {
    fprintf(out, "# HELP streaming_hub_ingest_records_total Records by ingest verdict.\n"
                 "# TYPE streaming_hub_ingest_records_total counter\n");
    for (int v = 0; v < HUB_V__COUNT; v++) {
        const char *verdict, *reason;
        hub_verdict_labels((enum hub_verdict)v, &verdict, &reason);
        fprintf(out, "streaming_hub_ingest_records_total{verdict=\"%s\",reason=\"%s\"} %llu\n",
                verdict, reason, (unsigned long long)m->ingest_records[v]);
    }
    render_histogram(out, "streaming_hub_ingest_batch_seconds",
                     "Time to store one partition batch (database transaction).",
                     &m->ingest_batch_seconds);
    render_histogram(out, "streaming_hub_ingest_record_age_seconds",
                     "Age of a record when the hub takes it from the consumer (its Kafka "
                     "timestamp to now): the broker and fetch share of the ingest latency.",
                     &m->ingest_record_age_seconds);
    render_scalar(out, "streaming_hub_ingest_batch_failures_total", "counter",
                  "Partition batches that failed to store and were retried.",
                  (long long)m->ingest_batch_failures);
    render_scalar(out, "streaming_hub_ingest_commit_failures_total", "counter",
                  "Offset commits refused by the broker (replays are absorbed by dedup).",
                  (long long)m->ingest_commit_failures);
    render_scalar(out, "streaming_hub_kafka_partitions_assigned", "gauge",
                  "Kafka partitions assigned to this process.", g->kafka_partitions_assigned);
    render_scalar(out, "streaming_hub_ingest_partitions_paused", "gauge",
                  "Partitions paused for backpressure or retry.", g->ingest_partitions_paused);
    render_scalar(out, "streaming_hub_ingest_records_pending", "gauge",
                  "Records consumed and not yet committed.", g->ingest_records_pending);
    render_scalar(out, "streaming_hub_pg_connections_up", "gauge",
                  "Database connections currently usable.", g->pg_connections_up);
    render_scalar(out, "streaming_hub_pg_transactions_pending", "gauge",
                  "Database transactions queued or in flight.", g->pg_txns_pending);
    static const char *const outcomes[HUB_D__COUNT] = {"succeeded", "failed", "shed",
                                                       "dead",      "poison", "deferred"};
    fprintf(out, "# HELP streaming_hub_deliveries_total Delivery outcomes.\n"
                 "# TYPE streaming_hub_deliveries_total counter\n");
    for (int d = 0; d < HUB_D__COUNT; d++) {
        fprintf(out, "streaming_hub_deliveries_total{outcome=\"%s\"} %llu\n", outcomes[d],
                (unsigned long long)m->deliveries[d]);
    }
    render_histogram(out, "streaming_hub_delivery_attempt_seconds",
                     "Duration of one delivery attempt.", &m->delivery_attempt_seconds);
    render_scalar(out, "streaming_hub_policy_filtered_total", "counter",
                  "Jobs dropped before their first attempt because a policy's match said no.",
                  (long long)m->policy_filtered);
    render_scalar(out, "streaming_hub_retry_schedule_fallbacks_total", "counter",
                  "Failed attempts whose retry (or exhaustion) the default curve decided "
                  "because the subscription's stored retry_schedule was malformed.",
                  (long long)m->retry_schedule_fallbacks);
    render_scalar(out, "streaming_hub_subscriptions_auto_disabled_total", "counter",
                  "Subscriptions disabled because their destination stayed broken.",
                  (long long)m->subscriptions_auto_disabled);
    render_scalar(out, "streaming_hub_jobs_due", "gauge",
                  "Delivery jobs due now (sampled, capped at 100000).", m->jobs_due);
    render_scalar(out, "streaming_hub_breakers_open", "gauge",
                  "Open and half-open circuit breakers of this process.", g->breakers_open);
    render_scalar(out, "streaming_hub_http_requests_total", "counter",
                  "HTTP requests served by the API listener.", (long long)m->http_requests);
    /* ingest and the HTTP listener */
    static const char *const refusals[HUB_HTTP_REFUSED__COUNT] = {
        "too_large", "body_bytes", "ingest_queue", "ingest_key_share", "draining"};
    fprintf(out, "# HELP streaming_hub_http_refused_total HTTP requests refused by the "
                 "listener's limits (413 before the body, or 503 with Retry-After).\n"
                 "# TYPE streaming_hub_http_refused_total counter\n");
    for (int r = 0; r < HUB_HTTP_REFUSED__COUNT; r++) {
        fprintf(out, "streaming_hub_http_refused_total{reason=\"%s\"} %llu\n", refusals[r],
                (unsigned long long)m->http_refused[r]);
    }
    render_scalar(out, "streaming_hub_http_accept_paused_total", "counter",
                  "Times the listener stopped accepting at STREAMING_HUB_HTTP_MAX_CONNECTIONS "
                  "(new connections wait in the backlog).",
                  (long long)m->http_accept_paused);
    render_scalar(out, "streaming_hub_http_connections", "gauge", "Open HTTP connections.",
                  g->http_connections);
    render_scalar(out, "streaming_hub_http_body_bytes", "gauge",
                  "Bytes of request bodies held (received, announced, or held by HTTP "
                  "ingest), counted against STREAMING_HUB_HTTP_BODY_BYTES.",
                  g->http_body_bytes);
    render_scalar(out, "streaming_hub_http_ingest_requests", "gauge",
                  "HTTP ingest requests in progress, counted against "
                  "STREAMING_HUB_INGEST_HTTP_QUEUE.",
                  g->http_ingest_requests);
    render_scalar(out, "streaming_hub_ingest_http_waiting", "gauge",
                  "HTTP ingest requests waiting for a database transaction.",
                  g->ingest_http_waiting);
    render_scalar(out, "streaming_hub_kafka_healthy", "gauge",
                  "1 while the consumer has a broker connection and its group membership.",
                  g->kafka_healthy);
    render_scalar(out, "streaming_hub_ingest_kafka_refetches_total", "counter",
                  "Kafka records fetched again because one could not be taken for lack of "
                  "memory (no offset is committed past it).",
                  (long long)m->ingest_kafka_refetches);
    render_p3(m, out);
    render_schemas(m, out);
    render_fast_path(m, out);
}

void hub_histogram_render(FILE *out, const char *name, const char *help,
                          const struct hub_histogram *h) {
    render_histogram(out, name, help, h);
}

/* Per-destination concurrency (dispatch_caps.c).  The +Inf bucket is the
 * last of counts[], so one pass writes every bucket line. */
void hub_histogram_render_series(FILE *out, const char *name, const char *labels,
                                 const struct hub_histogram *h) {
    unsigned long long below = 0;
    char le[32];

    for (int i = 0; i <= HUB_HIST_BUCKETS; i++) {
        below += h->counts[i];
        if (i < HUB_HIST_BUCKETS) {
            snprintf(le, sizeof(le), "%g", hist_bounds[i]);
        }
        fprintf(out, "%s_bucket{%s,le=\"%s\"} %llu\n", name, labels,
                i < HUB_HIST_BUCKETS ? le : "+Inf", below);
    }
    fprintf(out, "%s_sum{%s} %.6f\n%s_count{%s} %llu\n", name, labels, h->sum, name, labels,
            (unsigned long long)h->count);
}
