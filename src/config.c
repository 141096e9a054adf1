/*
 * config — declarative table of STREAMING_HUB_* variables.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

enum hub_cfg_type {
    CFG_STRING,
    CFG_SECRET, /* a string that --help and logs never show */
    CFG_BOOL,
    CFG_INT,
    CFG_DOUBLE,
    CFG_DURATION,
    CFG_SIZE,
    CFG_SCHEDULE,
};

struct hub_cfg_var {
    const char *name; /* without the STREAMING_HUB_ prefix */
    enum hub_cfg_type type;
    const char *def;     /* default as text; NULL = unset */
    size_t offset;       /* into struct hub_config */
    double min, max;     /* accepted range for numbers/durations (ms) */
    const char *choices; /* '|'-separated allowed values for strings, or NULL */
    const char *help;
};

#define OFF(f) offsetof(struct hub_config, f)
#define H10 (10.0 * 3600 * 1000)
#define BIG 9.0e15
/* 30 days: the breaker's bound on its durations (breaker.c) */
#define D30 (30.0 * 24 * 3600 * 1000)

/* The one table.  Ranges are inclusive and in the variable's unit (ms for
 * durations, bytes for sizes). */
static const struct hub_cfg_var hub_cfg_vars[] = {
    {"ENV", CFG_STRING, "development", OFF(env), 0, 0, "development|production",
     "production refuses to start without KEK and admin token, or with private sinks allowed"},
    {"ROLE", CFG_STRING, "all", OFF(role), 0, 0, "all|ingest|delivery",
     "all, ingest (consume + store + match) or delivery (dispatch)"},
    {"POSTGRES_DSN", CFG_SECRET, NULL, OFF(postgres_dsn), 0, 0, NULL,
     "libpq connection string (required for serve)"},
    {"KAFKA_BROKERS", CFG_STRING, "embedded", OFF(kafka_brokers), 0, 0, NULL,
     "bootstrap list, or 'embedded' for the in-process mock cluster; set empty (as the "
     "container image does) it must be given for roles that ingest"},
    {"KAFKA_TOPICS", CFG_STRING, "^lerian\\.streaming\\..+", OFF(kafka_topics), 0, 0, NULL,
     "comma-separated topic list, or one regex starting with ^"},
    {"KAFKA_GROUP", CFG_STRING, "streaming-hub", OFF(kafka_group), 0, 0, NULL, "consumer group"},
    {"KAFKA_SCRAM_MECHANISM", CFG_STRING, NULL, OFF(kafka_scram_mechanism), 0, 0,
     "SCRAM-SHA-256|SCRAM-SHA-512", "SASL SCRAM mechanism (enables SASL)"},
    {"KAFKA_SCRAM_USERNAME", CFG_STRING, NULL, OFF(kafka_scram_username), 0, 0, NULL,
     "SASL SCRAM user name"},
    {"KAFKA_SCRAM_PASSWORD", CFG_SECRET, NULL, OFF(kafka_scram_password), 0, 0, NULL,
     "SASL SCRAM password"},
    {"KAFKA_TLS_ENABLED", CFG_BOOL, "false", OFF(kafka_tls_enabled), 0, 0, NULL,
     "TLS to the brokers"},
    {"KAFKA_CA_CERT", CFG_STRING, NULL, OFF(kafka_ca_cert), 0, 0, NULL,
     "path of the CA bundle for broker TLS"},
    {"KAFKA_SESSION_TIMEOUT", CFG_DURATION, "6s", OFF(kafka_session_timeout_ms), 3000, 300000, NULL,
     "consumer group session timeout (a crashed member is evicted after it)"},
    {"KAFKA_FETCH_WAIT", CFG_DURATION, "10ms", OFF(kafka_fetch_wait_ms), 1, 10000, NULL,
     "longest a fetch waits for data (fetch.wait.max.ms); brokers answer at once when data "
     "arrives, the mock cluster only after this wait"},
    {"HTTP_LISTEN_ADDR", CFG_STRING, "127.0.0.1:8080", OFF(http_listen_addr), 0, 0, NULL,
     "API, ingest, metrics and health listener (host:port)"},
    {"ADMIN_TOKEN", CFG_SECRET, NULL, OFF(admin_token), 0, 0, NULL, "bearer token for /admin/*"},
    {"KEK", CFG_SECRET, NULL, OFF(kek), 0, 0, NULL,
     "base64 of 32 bytes; wraps stored secrets (AES-256-GCM)"},
    {"DATA_DIR", CFG_STRING, "./var", OFF(data_dir), 0, 0, NULL,
     "embedded Kafka bootstrap file, dev PostgreSQL, dev secrets"},
    {"POLICY_DIR", CFG_STRING, "./policies", OFF(policy_dir), 0, 0, NULL, "Lua policy files"},
    {"POLICY_WATCH", CFG_BOOL, "true", OFF(policy_watch), 0, 0, NULL,
     "reload when files in POLICY_DIR change (incl. Kubernetes ConfigMap ..data swaps)"},
    {"DISPATCH_WORKERS", CFG_INT, "256", OFF(dispatch_workers), 1, 4096, NULL,
     "concurrent delivery attempts per process; each destination's share is capped "
     "(DISPATCH_ORIGIN_MAX, DISPATCH_TENANT_ORIGIN_MAX)"},
    {"DISPATCH_CLAIM_BATCH", CFG_INT, "16", OFF(dispatch_claim_batch), 1, 1000, NULL,
     "jobs claimed per lease query"},
    {"DISPATCH_LEASE", CFG_DURATION, "60s", OFF(dispatch_lease_ms), 1000, BIG, NULL,
     "lease length of a claimed job"},
    {"DELIVERY_TIMEOUT", CFG_DURATION, "30s", OFF(delivery_timeout_ms), 100, H10, NULL,
     "whole-attempt timeout (connect timeout 5s)"},
    {"POISON_THRESHOLD", CFG_INT, "5", OFF(poison_threshold), 1, 1000, NULL,
     "reclaims of an expired lease before a job is poison"},
    {"AUTODISABLE_ENABLED", CFG_BOOL, "true", OFF(autodisable_enabled), 0, 0, NULL,
     "kill switch for auto-disable"},
    {"AUTODISABLE_FAILURE_WINDOW", CFG_DURATION, "120h", OFF(autodisable_failure_window_ms), 0, BIG,
     NULL, "sustained-failure gate"},
    {"AUTODISABLE_FAILURE_SPREAD", CFG_DURATION, "12h", OFF(autodisable_failure_spread_ms), 0, BIG,
     NULL, "dispersion gate"},
    {"RETRY_SCHEDULE", CFG_SCHEDULE, "1m,5m,15m,1h,3h,6h,8h,10h", OFF(retry_schedule_ms), 1, H10,
     NULL, "default retry curve, 1-12 steps each in (0,10h], full jitter"},
    {"BREAKER_CONSECUTIVE_FAILURES", CFG_INT, "5", OFF(breaker_consecutive_failures), 1, 100000,
     NULL, "breaker trip: consecutive failures"},
    {"BREAKER_FAILURE_RATIO", CFG_DOUBLE, "0.5", OFF(breaker_failure_ratio), 0.01, 1, NULL,
     "breaker trip: failure ratio over the window"},
    {"BREAKER_MIN_ATTEMPTS", CFG_INT, "20", OFF(breaker_min_attempts), 1, 1000000, NULL,
     "breaker trip: attempts needed in the window before the ratio counts"},
    {"BREAKER_WINDOW", CFG_DURATION, "60s", OFF(breaker_window_ms), 100, D30, NULL,
     "breaker trip: ratio window (max 30d)"},
    {"BREAKER_OPEN", CFG_DURATION, "30s", OFF(breaker_open_ms), 10, D30, NULL,
     "open time before a half-open probe (max 30d)"},
    {"BREAKER_OPEN_MAX", CFG_DURATION, "10m", OFF(breaker_open_max_ms), 10, D30, NULL,
     "open time cap (doubling on each re-open; max 30d)"},
    {"SECRET_GRACE", CFG_DURATION, "24h", OFF(secret_grace_ms), 0, 7.0 * 24 * 3600 * 1000, NULL,
     "default grace of the previous secret after rotation (max 7d)"},
    {"POLICY_TIMEOUT", CFG_DURATION, "10ms", OFF(policy_timeout_ms), 1, 60000, NULL,
     "CPU deadline per Lua policy call"},
    {"POLICY_MEMORY", CFG_SIZE, "64MiB", OFF(policy_memory_bytes), 1 << 20, 16.0 * (1 << 30), NULL,
     "memory cap per Lua state"},
    {"DELIVERY_CA_FILE", CFG_STRING, NULL, OFF(delivery_ca_file), 0, 0, NULL,
     "PEM bundle that replaces the system CAs for https destinations (private PKI)"},
    {"ALLOW_PRIVATE_SINKS", CFG_BOOL, "false", OFF(allow_private_sinks), 0, 0, NULL,
     "allow loopback/private/link-local destinations"},
    {"PULL_RATE", CFG_INT, "100", OFF(pull_rate), 1, 1000000, NULL,
     "pull API requests per second per tenant, for the whole deployment (each process takes "
     "its share)"},
    {"PULL_BURST", CFG_INT, "200", OFF(pull_burst), 1, 1000000, NULL,
     "pull API burst per tenant, for the whole deployment"},
    {"API_STATEMENT_TIMEOUT", CFG_DURATION, "30s", OFF(api_statement_timeout_ms), 100, H10, NULL,
     "longest one database statement of a tenant's API request runs (a replay, a list); past "
     "it the request is answered 503 with Retry-After and the connection is free again"},
    {"MAINTENANCE_INTERVAL", CFG_DURATION, "1h", OFF(maintenance_interval_ms), 1000, 86400000.0,
     NULL,
     "how often partition upkeep runs (coming days' partitions, days past the retention); "
     "it waits at most 200 ms for a table lock and is retried at its next run"},
    {"EVENT_RETENTION", CFG_DURATION, "168h", OFF(event_retention_ms), 1000, BIG, NULL,
     "how long stored events (and so the dedup window) are kept at least, by whole UTC days"},
    {"MAX_EVENT_BYTES", CFG_INT, "1048576", OFF(max_event_bytes), 1, 64.0 * 1024 * 1024, NULL,
     "largest accepted payload"},
    {"SHUTDOWN_TIMEOUT", CFG_DURATION, "30s", OFF(shutdown_timeout_ms), 0, BIG, NULL,
     "drain budget on SIGTERM"},
    {"AUTO_MIGRATE", CFG_BOOL, "true", OFF(auto_migrate), 0, 0, NULL,
     "serve applies migrations at start"},
    {"LOG_LEVEL", CFG_STRING, "info", OFF(log_level), 0, 0, "debug|info|warn|error",
     "least severe level logged"},
    {"LOG_FORMAT", CFG_STRING, "json", OFF(log_format), 0, 0, "json|text",
     "json: one object per line on stderr"},
    {"INGEST_BATCH_MAX", CFG_INT, "1000", OFF(ingest_batch_max), 1, 100000, NULL,
     "most Kafka records stored in one transaction (the batches of the partitions it carries)"},
    {"INGEST_PG_CONNECTIONS", CFG_INT, "4", OFF(ingest_pg_connections), 1, 64, NULL,
     "database connections that write ingest batches in parallel"},
    {"INGEST_PARTITION_BATCHES", CFG_INT, "1", OFF(ingest_partition_batches), 1, 16, NULL,
     "batches of one Kafka partition in flight at once (stored in order, one connection)"},
    /* KEK rotation (SPEC §11, docs/deploy.md) */
    {"KEK_PREVIOUS", CFG_SECRET, NULL, OFF(kek_previous), 0, 0, NULL,
     "comma-separated previous KEKs (base64 of 32 bytes each, at most 7): they open secrets "
     "sealed before a rotation, never seal; `streaming-hub rekey` re-seals under the KEK"},
    {"REKEY_BATCH", CFG_INT, "500", OFF(rekey_batch), 1, 100000, NULL,
     "`streaming-hub rekey`: rows re-sealed per transaction"},
    /* ingest and the HTTP listener */
    {"READY_KAFKA_WINDOW", CFG_DURATION, "30s", OFF(ready_kafka_window_ms), 1000, 3600000, NULL,
     "/readyz turns 503 when the consumer has had no broker connection or no group "
     "membership for this long (ingest roles, once it first joined)"},
    {"HTTP_MAX_CONNECTIONS", CFG_INT, "1024", OFF(http_max_connections), 1, 1000000, NULL,
     "HTTP connections open at once; more wait in the listen backlog until one closes"},
    {"HTTP_BODY_BYTES", CFG_SIZE, "64MiB", OFF(http_body_bytes), 1 << 20, 64.0 * (1 << 30), NULL,
     "request bodies held at once (being received, or waiting to be stored); a body that "
     "does not fit is answered 503 with Retry-After before it is read (413 when it never can)"},
    {"INGEST_HTTP_QUEUE", CFG_INT, "1024", OFF(ingest_http_queue), 2, 1000000, NULL,
     "HTTP ingest requests in progress at once (one API key: half of them); more are "
     "answered 503 with Retry-After"},
    {"PULL_PAGE_BYTES", CFG_SIZE, "8MiB", OFF(pull_page_bytes), 64 * 1024, 1024.0 * 1024 * 1024,
     NULL,
     "most stored bytes (payloads + attributes) of one pull page; a page ends before the "
     "event that would pass it, a larger event comes alone"},
    {"PULL_HOLD_MAX", CFG_DURATION, "2s", OFF(pull_hold_max_ms), 1, 60000, NULL,
     "longest a pull waits for ingest transactions holding lower sequences; past it the page "
     "ends below them"},
    {"STATS_RETENTION", CFG_DURATION, "90d", OFF(stats_retention_ms), 3600000, BIG, NULL,
     "how long the per-tenant figures (GET /v1/stats) are kept, at least"},
    {"STATS_FLUSH_INTERVAL", CFG_DURATION, "1s", OFF(stats_flush_ms), 100, 60000, NULL,
     "how often each process writes its per-tenant counts (a crash loses at most this much)"},
    {"CLUSTER_HEARTBEAT", CFG_DURATION, "1s", OFF(cluster_heartbeat_ms), 100, 60000, NULL,
     "how often a process refreshes its hub_processes row (cluster-wide limits)"},
    {"CLUSTER_MEMBER_TIMEOUT", CFG_DURATION, "3s", OFF(cluster_member_timeout_ms), 300, 600000,
     NULL, "a process whose row is older than this no longer counts (must exceed the heartbeat)"},
    /* policy threads and tripping (issue 24) */
    {"POLICY_THREADS", CFG_INT, "0", OFF(policy_threads), 0, 256, NULL,
     "threads that run Lua policy calls (the loop never does); 0 = the number of cores"},
    {"POLICY_TRIP_FAILURES", CFG_INT, "5", OFF(policy_trip_failures), 0, 1000000, NULL,
     "policy calls stopped for time or memory within POLICY_TRIP_WINDOW that trip the policy "
     "(its calls answered as errors without running); 0 = never"},
    {"POLICY_TRIP_WINDOW", CFG_DURATION, "10s", OFF(policy_trip_window_ms), 1, BIG, NULL,
     "window of POLICY_TRIP_FAILURES"},
    {"POLICY_TRIP_COOLDOWN", CFG_DURATION, "60s", OFF(policy_trip_cooldown_ms), 1, BIG, NULL,
     "how long a tripped policy's calls are not run (a reload of its file clears it sooner)"},
    /* per-destination concurrency (src/dispatch_caps.h) */
    {"DISPATCH_ORIGIN_MAX", CFG_INT, "128", OFF(dispatch_origin_max), 1, 4096, NULL,
     "most delivery attempts in flight (and claimed) per destination origin "
     "(scheme://host:port), all tenants together, per process"},
    {"DISPATCH_TENANT_ORIGIN_MAX", CFG_INT, "64", OFF(dispatch_tenant_origin_max), 1, 4096, NULL,
     "most delivery attempts in flight (and claimed) of one tenant to one origin, per process; "
     "the pair's adaptive limit stays at or below it"},
    {"DISPATCH_TENANT_ORIGIN_START", CFG_INT, "16", OFF(dispatch_tenant_origin_start), 1, 4096,
     NULL,
     "adaptive limit of a (tenant, origin) pair not seen recently: it grows while the "
     "destination keeps up and the slots are in use, halves on a timeout, a refused "
     "connection, 429, 502, 503 or 504"},
    {"DISPATCH_SLOW_ANSWER", CFG_DURATION, "5s", OFF(dispatch_slow_answer_ms), 0, H10, NULL,
     "an answer that takes this long lowers its (tenant, origin) pair's adaptive limit by a "
     "tenth; 0: latency is not a signal"},
    {"DISPATCH_QUEUE_AHEAD", CFG_DURATION, "50ms", OFF(dispatch_queue_ahead_ms), 0, 60000, NULL,
     "a (tenant, origin) pair or origin at its cap keeps claimed jobs waiting for a slot only as "
     "many as its attempts free within this time (at most its cap): the run-ahead that keeps "
     "workers busy between claims; 0: none"},
    /* the schema registry (schema_registry.h) */
    {"SCHEMA_POLL", CFG_DURATION, "250ms", OFF(schema_poll_ms), 20, 10000, NULL,
     "how often a process checks the schema registry's generation (a schema registered on any "
     "process is used by every process within this plus a reload)"},
    /* operational events for tenants (src/opevents.h) */
    {"OPEVENTS", CFG_BOOL, "true", OFF(opevents_enabled), 0, 0, NULL,
     "publish hub.subscription.disabled, hub.delivery.dead and hub.policy.tripped CloudEvents "
     "(source streaming-hub) into the affected tenant's stream"},
    {"OPEVENTS_PER_MINUTE", CFG_INT, "6", OFF(opevents_per_minute), 1, 60000, NULL,
     "operational events of one type about one subscription, per minute at most (more are "
     "counted as limited and dropped)"},
    {"OPEVENTS_BURST", CFG_INT, "3", OFF(opevents_burst), 1, 1000, NULL,
     "operational events of one type about one subscription published at once before "
     "OPEVENTS_PER_MINUTE applies"},
    /* the delivery fast path (src/dispatch_fast.c) */
    {"DISPATCH_FAST_PATH", CFG_BOOL, "true", OFF(dispatch_fast_path), 0, 0, NULL,
     "role all: the ingest transaction leases to this process the jobs it can start at once "
     "(workers free, destination under its cap, breaker closed, not fifo, no max_rate) and "
     "hands them to the dispatcher with the event it holds; false: every job is claimed"},
    /* tenant API key cache (src/auth_cache.h) */
    {"AUTH_CACHE_TTL", CFG_DURATION, "1s", OFF(auth_cache_ttl_ms), 0, 1000, NULL,
     "how long a process answers a tenant API key from its last lookup: a key revoked, a "
     "tenant deactivated or a quota changed is seen by every process within it; 0ms: every "
     "request looks its key up"},
    /* HTTP ingest's shared transactions (ingest_http.c) */
    {"INGEST_HTTP_TXNS", CFG_INT, "4", OFF(ingest_http_txns), 1, 64, NULL,
     "HTTP ingest transactions in flight at once: two whenever requests wait, more only while "
     "enough requests wait to fill each"},
    /* per-scope caps of the schema registry (api_schemas.c, store_schemas.h) */
    {"SCHEMA_MAX_VERSIONS", CFG_INT, "200", OFF(schema_max_versions), 1, 100000, NULL,
     "live (not retired) schema versions one tenant, or the platform, may hold; a registration "
     "over it is refused with 409"},
    {"SCHEMA_MAX_BYTES", CFG_SIZE, "8MiB", OFF(schema_max_bytes), 1 << 10, 1.0 * (1 << 30), NULL,
     "bytes of live schema text (as stored: compact) one tenant, or the platform, may hold; a "
     "registration over it is refused with 409"},
    /* the subscriptions a tenant may hold (api_subs.c): each event of the
     * tenant's makes one job per matching subscription in the shared
     * ingest transaction */
    {"TENANT_MAX_SUBSCRIPTIONS", CFG_INT, "1000", OFF(tenant_max_subscriptions), 1, 1000000, NULL,
     "subscriptions one tenant may hold; a create over it is refused with 409"},
};

#define N_VARS (sizeof(hub_cfg_vars) / sizeof(hub_cfg_vars[0]))

/*
 * Defaults that differ when KAFKA_BROKERS is "embedded" (which the table
 * sets first).  The mock cluster answers a fetch only when its wait is over,
 * where a broker answers as soon as data arrives: embedded, a short wait
 * keeps ingest latency low (an idle fetch every 2 ms costs the mock little).
 */
static const struct {
    const char *name;
    const char *def;
} hub_cfg_embedded_defaults[] = {
    {"KAFKA_FETCH_WAIT", "2ms"},
};

/* The embedded-mode default of a variable, or NULL when it has none. */
static const char *cfg_embedded_default(const struct hub_cfg_var *v) {
    for (size_t i = 0; i < sizeof(hub_cfg_embedded_defaults) / sizeof(hub_cfg_embedded_defaults[0]);
         i++) {
        if (strcmp(hub_cfg_embedded_defaults[i].name, v->name) == 0) {
            return hub_cfg_embedded_defaults[i].def;
        }
    }
    return NULL;
}

/* The default of v given what is loaded so far. */
static const char *cfg_default(const struct hub_config *cfg, const struct hub_cfg_var *v) {
    const char *embedded = cfg_embedded_default(v);
    if (embedded != NULL && cfg->kafka_brokers != NULL &&
        strcmp(cfg->kafka_brokers, "embedded") == 0) {
        return embedded;
    }
    return v->def;
}

int hub_duration_parse(const char *s, int64_t *out_ms) {
    int64_t total = 0;
    const char *p = s;

    if (s == NULL || *s == '\0') {
        return -1;
    }
    while (*p != '\0') {
        int64_t n = 0;
        int64_t unit;
        if (!isdigit((unsigned char)*p)) {
            return -1;
        }
        while (isdigit((unsigned char)*p)) {
            if (n > (INT64_MAX - 9) / 10) {
                return -1;
            }
            n = n * 10 + (*p++ - '0');
        }
        if (p[0] == 'm' && p[1] == 's') {
            unit = 1;
            p += 2;
        } else if (*p == 's') {
            unit = 1000;
            p++;
        } else if (*p == 'm') {
            unit = 60 * 1000;
            p++;
        } else if (*p == 'h') {
            unit = 3600 * 1000;
            p++;
        } else if (*p == 'd') {
            unit = 24 * 3600 * 1000;
            p++;
        } else {
            return -1; /* a bare number is ambiguous: the unit is mandatory */
        }
        if (n > (INT64_MAX - total) / unit) {
            return -1;
        }
        total += n * unit;
    }
    *out_ms = total;
    return 0;
}

int hub_duration_list_parse(const char *s, int64_t *out_ms, size_t max) {
    size_t n = 0;
    const char *p = s;

    if (s == NULL || *s == '\0') {
        return -1;
    }
    for (;;) {
        char item[64];
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        /* tolerate spaces around items: "1m, 5m" is what people type */
        while (len > 0 && *p == ' ') {
            p++;
            len--;
        }
        while (len > 0 && p[len - 1] == ' ') {
            len--;
        }
        if (len == 0 || len >= sizeof(item) || n == max) {
            return -1;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        if (hub_duration_parse(item, &out_ms[n]) != 0) {
            return -1;
        }
        n++;
        if (comma == NULL) {
            break;
        }
        p = comma + 1;
    }
    return (int)n;
}

int hub_size_parse(const char *s, int64_t *out_bytes) {
    static const struct {
        const char *suffix;
        int64_t mult;
    } units[] = {{"", 1},          {"B", 1},       {"KiB", 1 << 10}, {"MiB", 1 << 20},
                 {"GiB", 1 << 30}, {"KB", 1000},   {"MB", 1000000},  {"GB", 1000000000},
                 {"K", 1 << 10},   {"M", 1 << 20}, {"G", 1 << 30}};
    char *end;
    long long n;

    if (s == NULL || !isdigit((unsigned char)*s)) {
        return -1;
    }
    errno = 0;
    n = strtoll(s, &end, 10);
    if (errno != 0 || n < 0) {
        return -1;
    }
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcmp(end, units[i].suffix) == 0) {
            if (n > INT64_MAX / units[i].mult) {
                return -1;
            }
            *out_bytes = n * units[i].mult;
            return 0;
        }
    }
    return -1;
}

static int cfg_parse_bool(const char *s, int *out) {
    if (strcmp(s, "true") == 0 || strcmp(s, "1") == 0 || strcmp(s, "yes") == 0 ||
        strcmp(s, "on") == 0) {
        *out = 1;
        return 0;
    }
    if (strcmp(s, "false") == 0 || strcmp(s, "0") == 0 || strcmp(s, "no") == 0 ||
        strcmp(s, "off") == 0) {
        *out = 0;
        return 0;
    }
    return -1;
}

static int cfg_choice_ok(const char *choices, const char *v) {
    size_t vlen = strlen(v);
    const char *p = choices;
    while (p != NULL && *p != '\0') {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == vlen && memcmp(p, v, len) == 0) {
            return 1;
        }
        p = bar ? bar + 1 : NULL;
    }
    return 0;
}

/* Applies one textual value to its field.  Returns 0, or -1 with err filled. */
static int cfg_apply(struct hub_config *cfg, const struct hub_cfg_var *v, const char *text,
                     char *err, size_t errsz) {
    char *base = (char *)cfg + v->offset;
    int64_t i64;
    double d;
    char *end;

    switch (v->type) {
    case CFG_STRING:
    case CFG_SECRET:
        if (v->choices != NULL && !cfg_choice_ok(v->choices, text)) {
            snprintf(err, errsz, "STREAMING_HUB_%s: must be one of %s", v->name, v->choices);
            return -1;
        }
        free(*(char **)base);
        *(char **)base = strdup(text);
        return *(char **)base ? 0 : -1;
    case CFG_BOOL:
        if (cfg_parse_bool(text, (int *)base) != 0) {
            snprintf(err, errsz, "STREAMING_HUB_%s: not a boolean (true/false)", v->name);
            return -1;
        }
        return 0;
    case CFG_INT:
        errno = 0;
        i64 = strtoll(text, &end, 10);
        if (errno != 0 || end == text || *end != '\0') {
            snprintf(err, errsz, "STREAMING_HUB_%s: not an integer", v->name);
            return -1;
        }
        goto check_range;
    case CFG_DURATION:
        if (hub_duration_parse(text, &i64) != 0) {
            snprintf(err, errsz, "STREAMING_HUB_%s: not a duration (e.g. 500ms, 30s, 2m, 1h30m)",
                     v->name);
            return -1;
        }
        goto check_range;
    case CFG_SIZE:
        if (hub_size_parse(text, &i64) != 0) {
            snprintf(err, errsz, "STREAMING_HUB_%s: not a size (e.g. 64MiB)", v->name);
            return -1;
        }
        goto check_range;
    case CFG_DOUBLE:
        errno = 0;
        d = strtod(text, &end);
        if (errno != 0 || end == text || *end != '\0' || !isfinite(d) || d < v->min || d > v->max) {
            snprintf(err, errsz, "STREAMING_HUB_%s: not a number in [%g, %g]", v->name, v->min,
                     v->max);
            return -1;
        }
        *(double *)base = d;
        return 0;
    case CFG_SCHEDULE: {
        int64_t steps[HUB_RETRY_MAX_STEPS];
        int n = hub_duration_list_parse(text, steps, HUB_RETRY_MAX_STEPS);
        if (n < 1) {
            snprintf(err, errsz, "STREAMING_HUB_%s: not a list of 1-%d durations", v->name,
                     HUB_RETRY_MAX_STEPS);
            return -1;
        }
        for (int k = 0; k < n; k++) {
            if (steps[k] < v->min || steps[k] > v->max) {
                snprintf(err, errsz, "STREAMING_HUB_%s: step %d is outside (0, 10h]", v->name,
                         k + 1);
                return -1;
            }
        }
        memcpy(cfg->retry_schedule_ms, steps, sizeof(int64_t) * (size_t)n);
        cfg->retry_schedule_len = (size_t)n;
        return 0;
    }
    }
    return -1;

check_range:
    if ((double)i64 < v->min || (double)i64 > v->max) {
        snprintf(err, errsz, "STREAMING_HUB_%s: %s is out of range", v->name, text);
        return -1;
    }
    *(int64_t *)base = i64;
    return 0;
}

int hub_config_load(struct hub_config *cfg, char *err, size_t errsz) {
    for (size_t i = 0; i < N_VARS; i++) {
        const struct hub_cfg_var *v = &hub_cfg_vars[i];
        char envname[96];
        const char *text;

        snprintf(envname, sizeof(envname), "STREAMING_HUB_%s", v->name);
        text = getenv(envname);
        if (text == NULL) {
            text = cfg_default(cfg, v);
        }
        if (text == NULL) {
            continue;
        }
        if (cfg_apply(cfg, v, text, err, errsz) != 0) {
            return -1;
        }
    }
    if (cfg->breaker_open_max_ms < cfg->breaker_open_ms) {
        snprintf(err, errsz,
                 "STREAMING_HUB_BREAKER_OPEN_MAX: must be >= STREAMING_HUB_BREAKER_OPEN");
        return -1;
    }
    if (cfg->kek_previous != NULL && cfg->kek == NULL) {
        snprintf(err, errsz, "STREAMING_HUB_KEK_PREVIOUS: set without STREAMING_HUB_KEK");
        return -1;
    }
    /* a live process must never look gone between two of its heartbeats */
    if (cfg->cluster_member_timeout_ms <= cfg->cluster_heartbeat_ms) {
        snprintf(err, errsz,
                 "STREAMING_HUB_CLUSTER_MEMBER_TIMEOUT: must be > STREAMING_HUB_CLUSTER_HEARTBEAT");
        return -1;
    }
    if (strcmp(cfg->env, "production") == 0) {
        if (cfg->kek == NULL) {
            snprintf(err, errsz, "STREAMING_HUB_KEK: required when STREAMING_HUB_ENV=production");
            return -1;
        }
        if (cfg->admin_token == NULL) {
            snprintf(err, errsz,
                     "STREAMING_HUB_ADMIN_TOKEN: required when STREAMING_HUB_ENV=production");
            return -1;
        }
        if (cfg->allow_private_sinks) {
            snprintf(err, errsz,
                     "STREAMING_HUB_ALLOW_PRIVATE_SINKS: must be false when "
                     "STREAMING_HUB_ENV=production");
            return -1;
        }
    }
    return 0;
}

int hub_config_load_cli(struct hub_config *cfg, const char *log_level) {
    char err[256];

    if (hub_config_load(cfg, err, sizeof(err)) != 0) {
        fprintf(stderr, "streaming-hub: %s\n", err);
        hub_config_free(cfg);
        return 2;
    }
    hub_log_init(log_level != NULL ? log_level : cfg->log_level, cfg->log_format);
    return 0;
}

void hub_config_free(struct hub_config *cfg) {
    for (size_t i = 0; i < N_VARS; i++) {
        const struct hub_cfg_var *v = &hub_cfg_vars[i];
        if (v->type == CFG_STRING || v->type == CFG_SECRET) {
            char **p = (char **)((char *)cfg + v->offset);
            free(*p);
            *p = NULL;
        }
    }
}

void hub_config_print_help(FILE *out) {
    static const char *type_names[] = {"string", "secret",   "bool", "int",
                                       "number", "duration", "size", "durations"};
    fprintf(out, "Environment variables (durations: 500ms, 30s, 2m, 1h30m):\n\n");
    for (size_t i = 0; i < N_VARS; i++) {
        const struct hub_cfg_var *v = &hub_cfg_vars[i];
        const char *embedded = cfg_embedded_default(v);
        fprintf(out, "  STREAMING_HUB_%-30s %-9s default: %s%s%s%s\n      %s\n", v->name,
                type_names[v->type], v->def ? v->def : "(unset)", embedded ? " (" : "",
                embedded ? embedded : "", embedded ? " with KAFKA_BROKERS=embedded)" : "", v->help);
    }
}
