/*
 * config — the hub's configuration, read from STREAMING_HUB_* environment
 * variables through one declarative table (name, type, default, help).
 *
 * The table in config.c is the single source of truth: parsing, validation,
 * defaults and `streaming-hub serve --help` are all generated from it.
 */
#ifndef HUB_CONFIG_H
#define HUB_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define HUB_RETRY_MAX_STEPS 12

struct hub_config {
    char *env;  /* development | production */
    char *role; /* all | ingest | delivery */
    char *postgres_dsn;
    char *kafka_brokers;
    char *kafka_topics;
    char *kafka_group;
    char *kafka_scram_mechanism;
    char *kafka_scram_username;
    char *kafka_scram_password;
    int kafka_tls_enabled;
    char *kafka_ca_cert;
    int64_t kafka_session_timeout_ms;
    int64_t kafka_fetch_wait_ms;
    char *http_listen_addr;
    char *admin_token;
    char *kek; /* base64 of 32 bytes */
    char *data_dir;
    char *policy_dir;
    int policy_watch; /* reload on changes in policy_dir (policy_watch.h) */
    int64_t dispatch_workers;
    int64_t dispatch_claim_batch;
    int64_t dispatch_lease_ms;
    int64_t delivery_timeout_ms;
    int64_t poison_threshold;
    int autodisable_enabled;
    int64_t autodisable_failure_window_ms;
    int64_t autodisable_failure_spread_ms;
    int64_t retry_schedule_ms[HUB_RETRY_MAX_STEPS];
    size_t retry_schedule_len;
    int64_t breaker_consecutive_failures;
    double breaker_failure_ratio;
    int64_t breaker_min_attempts;
    int64_t breaker_window_ms;
    int64_t breaker_open_ms;
    int64_t breaker_open_max_ms;
    int64_t secret_grace_ms;
    int64_t policy_timeout_ms;
    int64_t policy_memory_bytes;
    int allow_private_sinks;
    char *delivery_ca_file;
    int64_t pull_rate;
    int64_t pull_burst;
    int64_t event_retention_ms;
    int64_t max_event_bytes;
    int64_t shutdown_timeout_ms;
    int auto_migrate;
    char *log_level;
    char *log_format;
    int64_t ingest_batch_max;      /* records of one partition per transaction */
    int64_t ingest_pg_connections; /* database connections used by ingest */
    int64_t ingest_http_txns;      /* HTTP ingest transactions in flight at most */
    char *kek_previous;            /* previous KEKs, comma-separated (open only) */
    int64_t rekey_batch;           /* rekey: rows re-sealed per transaction */
    /* batches of one Kafka partition in flight at once (ingest_kafka.c) */
    int64_t ingest_partition_batches;
    /* ingest and the HTTP listener */
    int64_t ready_kafka_window_ms; /* /readyz: consumer without broker or group for this long */
    int64_t http_max_connections;  /* accepted at once; more wait in the backlog */
    int64_t http_body_bytes;       /* request bodies held at once */
    int64_t ingest_http_queue;     /* HTTP ingest requests in progress at once */
    /* pull pages, per-tenant figures, cluster membership (pull_horizon.h,
     * stats.h, cluster.h) */
    int64_t pull_page_bytes;           /* a pull page's stored bytes at most */
    int64_t pull_hold_max_ms;          /* longest a pull waits for its horizon */
    int64_t api_statement_timeout_ms;  /* a tenant's API statements run at most this long */
    int64_t maintenance_interval_ms;   /* partition upkeep period */
    int64_t stats_retention_ms;        /* hourly rollups kept this long */
    int64_t stats_flush_ms;            /* counts written this often */
    int64_t cluster_heartbeat_ms;      /* membership row refreshed this often */
    int64_t cluster_member_timeout_ms; /* a row older than this is a process gone */
    /* policy threads and tripping */
    int64_t policy_threads;          /* threads running policy calls; 0 = the cores */
    int64_t policy_trip_failures;    /* timeouts/memory stops that trip a policy; 0 = never */
    int64_t policy_trip_window_ms;   /* ... within this window */
    int64_t policy_trip_cooldown_ms; /* calls of a tripped policy are not run this long */
    /* per-destination concurrency (dispatch_caps.h) */
    int64_t dispatch_origin_max;          /* slots per origin, all tenants */
    int64_t dispatch_tenant_origin_max;   /* slots per (tenant, origin) */
    int64_t dispatch_tenant_origin_start; /* adaptive limit of a new (tenant, origin) */
    int64_t dispatch_slow_answer_ms;      /* an answer this slow lowers it */
    int64_t dispatch_queue_ahead_ms;      /* run-ahead of a pair at its cap */
    /* the schema registry (schema_registry.h) */
    int64_t schema_poll_ms; /* the registry's generation checked this often */
    /* operational events for tenants (opevents.h) */
    int opevents_enabled;
    int64_t opevents_per_minute; /* per subscription and type */
    int64_t opevents_burst;
    /* the delivery fast path (dispatch_fast.c) */
    int dispatch_fast_path;
    /* tenant API key cache (src/auth_cache.h) */
    int64_t auth_cache_ttl_ms; /* how stale an authentication may be; 0 = off */
    /* per-scope caps of the schema registry (api_schemas.c) */
    int64_t schema_max_versions;      /* live versions per tenant or the platform */
    int64_t schema_max_bytes;         /* bytes of live schema text per tenant or the platform */
    int64_t tenant_max_subscriptions; /* subscriptions per tenant (api_subs.c) */
};

/*
 * Fills *cfg from the environment (getenv), applying defaults.
 *
 * On a malformed value returns -1 and writes one line naming the variable into
 * err (errsz bytes); *cfg then holds whatever was parsed and must still be
 * released with hub_config_free().  Returns 0 on success.
 */
int hub_config_load(struct hub_config *cfg, char *err, size_t errsz);

/*
 * hub_config_load for a command-line entry point: on a malformed value it
 * prints the one line naming the variable to stderr, releases *cfg and
 * returns 2 (the exit code for a usage error); on success it starts logging
 * at log_level (NULL: the configured level) and returns 0.
 */
int hub_config_load_cli(struct hub_config *cfg, const char *log_level);

/* Releases the strings owned by cfg; safe on a zeroed or partly loaded cfg. */
void hub_config_free(struct hub_config *cfg);

/* Prints every variable with its type, default and help (for --help). */
void hub_config_print_help(FILE *out);

/*
 * Parses a duration: a sequence of <digits><unit> with unit one of ms, s, m,
 * h (e.g. "500ms", "30s", "1h30m").  Returns 0 and stores milliseconds in
 * *out_ms, or -1 when malformed or when it overflows.
 */
int hub_duration_parse(const char *s, int64_t *out_ms);

/* Parses a comma-separated list of durations into out (at most max).
 * Returns the count (>= 1) or -1 when malformed or too long. */
int hub_duration_list_parse(const char *s, int64_t *out_ms, size_t max);

/* Parses a byte size: digits with an optional KiB/MiB/GiB/KB/MB/GB/B suffix.
 * Returns 0 or -1. */
int hub_size_parse(const char *s, int64_t *out_bytes);

#endif
