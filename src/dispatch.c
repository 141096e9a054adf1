/*
 * dispatch — claims, attempts and outcomes (see dispatch.h).
 *
 * The SQL it runs is in store_dispatch.c.
 *
 * The cycle: a claim query leases a batch of due jobs and reads what their
 * attempts need (subscriptions, sealed secrets, the stored events), or, in
 * a backlog, leaves that to a load query on another connection while the
 * next claim runs; each job becomes one httpc POST; each finished
 * attempt becomes an outcome in a queue that is written in batches (one
 * transaction for many outcomes), so the dispatcher never waits on the
 * database between attempts.
 */
#include "dispatch.h"

#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "backoff.h"
#include "breaker.h"
#include "bucket.h"
#include "crypto.h"
#include "httpc.h"
#include "hub.h"
#include "log.h"
#include "netguard.h"
#include "pg.h"
#include "policy.h"
#include "sign.h"
#include "store.h"
#include "store_dispatch.h"
#include "util.h"
#include "uuid.h"
#include "webhook.h"

#define DISPATCH_IDLE_MS 50 /* claim poll when nothing was due */
/* The tenants a claim rotates through are sampled every DISPATCH_TENANTS_MS,
 * and sooner (not before DISPATCH_TENANTS_MIN_MS) once new jobs were stored
 * or a claim came back short: a tenant's first due job waits at most that
 * long for its turn (SPEC §7.1 allows a second). */
#define DISPATCH_TENANTS_MS 100
#define DISPATCH_TENANTS_MIN_MS 10
#define DISPATCH_TENANTS_MAX 100000
/* A claim offers the next (4 × its batch) sampled tenants of the rotation:
 * with a share of at least two jobs each, that fills a batch even when most
 * of them ran dry since the sample. */
#define DISPATCH_WINDOW_BATCHES 4
/* Tenant floors (struct due_tenant): how far behind its oldest claimed job
 * a tenant's next claim starts, and how often every claim starts from the
 * beginning again. */
#define DISPATCH_FLOOR_MARGIN_US 100000
#define DISPATCH_FLOOR_RESET_MS 1000
#define DISPATCH_FLUSH_MS 5    /* outcome batching window */
#define DISPATCH_FLUSH_MAX 256 /* outcomes per transaction */
#define DISPATCH_OUT_CONNECTIONS 2
/* The longest a job is put off without an attempt (max_rate deferral), and
 * the longest delay an outcome carries to the database: the longest step a
 * retry schedule may have (SPEC §7.4). */
#define DISPATCH_DEFER_MAX_MS (10LL * 3600 * 1000)
/* What a lease must leave after an attempt's timeout for its outcome's write. */
#define DISPATCH_OUTCOME_MARGIN_MS 2000

#define DISPATCH_EXCERPT 1024
#define DISPATCH_MAX_BODY (1 << 20)
#define DISPATCH_DUE_SAMPLE_MS 5000
/* A retry function may keep a job going past its schedule, up to the
 * longest schedule the API accepts. */
#define DISPATCH_POLICY_MAX_ATTEMPTS (1 + HUB_RETRY_MAX_STEPS)
#define DISPATCH_POLICY_LOG_PER_S 10 /* policy failure log lines (all are counted) */

/* ---------------------------------------------------------------- types -- */

/* Which claim handed a job out, and when its result arrived. */
struct claim_stamp {
    int64_t ms;
    uint64_t serial; /* the lease owner is "<owner>#<serial>" */
};

struct job {
    struct hub_dispatch *d;
    int64_t id;
    char sub_id[40];
    char *tenant;
    char *event_id;
    char *event_type;
    char *url;
    char *content_type;
    char *attrs;            /* event attributes (JSON text) */
    unsigned char *payload; /* the stored event's, or shaped_body */
    size_t payload_len;
    char *shaped_body; /* a policy's body, owned */
    char *headers_sealed;
    char *secret_sealed;
    char *prev_secret_sealed;
    int64_t schedule[HUB_RETRY_MAX_STEPS];
    size_t n_schedule;
    int schedule_malformed; /* a stored schedule that is not one: n_schedule 0 */
    int attempt_count;      /* before this attempt */
    double max_rate;        /* deliveries per second, 0 = unlimited */
    int schema_major;
    char *policy;               /* the subscription's policy name, or NULL */
    struct hub_policy_gen *gen; /* held from claim to outcome (SPEC §8: a job
                                 * finishes on the generation it started with) */
    struct hub_policy *pol;     /* policy in gen, NULL when not loaded */
    const char *local_error;    /* an attempt that failed before any HTTP */
    char *local_excerpt;
    char origin[300];
    struct claim_stamp claim;
    char delivery_id[HUB_UUID_TEXT_SIZE];
    int64_t started_unix_ms;
    int breaker_probe; /* the breaker let this attempt through as its probe */
};

struct outcome {
    int64_t id;
    uint64_t claim; /* serial of the claim that leased the job */
    const char *state;
    const char *reason;
    int64_t delay_ms;
    int attempted;
    int success;
    char delivery_id[40];
    int64_t started_unix_ms;
    int duration_ms;
    int status; /* 0 = none */
    char error[32];
    char *excerpt;
    char sub_id[40];
};

/* A destination URL as hub_url_parse() saw it (url_parse_cached). */
#define URL_SLOTS 128

struct url_slot {
    char *text; /* owned; NULL = free */
    int ok;     /* hub_url_parse() accepted it */
    struct hub_url u;
    long path_at; /* u.path is text + path_at, or static when -1 */
};

struct hub_dispatch {
    struct hub *hub;
    struct hub_pg *pg_claim;   /* one connection: claims, one at a time */
    struct hub_pg *pg_load;    /* one connection: the claimed jobs' loads */
    struct hub_pg *pg_out;     /* outcome batches */
    struct hub_buckets *rates; /* max_rate buckets per subscription (SPEC §7.9) */
    struct url_slot *urls;     /* URL_SLOTS, allocated at the first attempt */
    char owner[96];
    uint64_t claim_serial;                /* of the claim in flight, or of the last one */
    uint64_t schedule_fallback_logged_ms; /* loop time of the last such warning */
    struct hub_breakers *breakers;
    uv_timer_t claim_timer;
    uv_timer_t flush_timer;
    uv_timer_t reclaim_timer;
    uv_timer_t sample_timer;
    int claiming;
    int kicked;            /* new jobs were stored while a claim was in flight */
    int flushing;          /* outcome transactions in flight (at most DISPATCH_OUT_CONNECTIONS) */
    int aux_inflight;      /* reclaim and sampling queries not answered yet */
    char last_tenant[260]; /* rotation point of the tenant round-robin */
    char window_last[260]; /* last tenant offered to the claim in flight, "" = all were */
    struct due_tenant *tenants; /* tenants with due jobs at the last sample, by strcmp */
    size_t n_tenants;
    int64_t floors_ms;  /* when the floors were last cleared */
    int64_t tenants_ms; /* when they were sampled */
    int tenants_dirty;  /* new jobs or a short claim since */
    size_t claim_asked; /* the batch asked for by the claim in flight */
    int claim_full;     /* the last claim came back full; the one after it leaves
                         * its lookups to the load (see claim_done) */
    size_t inflight;
    size_t loading; /* claimed jobs whose load is in flight */
    /* Claimed jobs waiting for a worker: claims run ahead of the workers so
     * that none waits on the database between attempts.  Popped round-robin
     * across tenants, so a tenant's queued backlog cannot hold another's job
     * back by more than one rotation. */
    struct job **queue;
    size_t n_queue;
    size_t cap_queue;
    char pop_tenant[260]; /* the tenant popped last */
    struct outcome *outcomes;
    size_t n_outcomes;
    size_t cap_outcomes;
    int outcomes_checked; /* hub_sql_dispatch_outcomes_checked since a duplicate attempt key */
    size_t flush_single;  /* outcomes to write one per transaction (after a batch failed) */
    uint64_t ev_serial;   /* numbers each job's policy event (hub_policy_event.serial) */
    int64_t policy_log_s; /* policy failure log lines: the current second ... */
    int policy_log_n;     /* ... and how many were written in it */
    int stopping;
    int open_handles;
    void (*done_cb)(void *arg);
    void *done_arg;
};

/*
 * A tenant of the claim's rotation.  Its floor is where the claim starts
 * reading its due jobs: a claim takes the oldest due jobs first, so none
 * older than the ones it took is left, except jobs another dispatcher had
 * locked (its transaction may roll back) and jobs committed after the
 * claim's snapshot with an older next_attempt_at (transactions that took
 * now() earlier, or a subscription enabled again).  The floor stays
 * DISPATCH_FLOOR_MARGIN_US behind the oldest job claimed, which covers the
 * latter for any transaction shorter than that, and all floors are cleared
 * every DISPATCH_FLOOR_RESET_MS, which bounds how long any such job waits.
 */
struct due_tenant {
    char *id;
    int fifo;          /* had open fifo jobs at the sample */
    int64_t floor_us;  /* 0: none (the claim passes -infinity) */
    int64_t oldest_us; /* scratch of claim_floors */
};

static void dispatch_claim(struct hub_dispatch *d);
static void dispatch_pump(struct hub_dispatch *d);
static void queue_drop_subscription(struct hub_dispatch *d, const char *sub_id);
static void dispatch_flush(struct hub_dispatch *d);
static void claim_timer_cb(uv_timer_t *t);
static void dispatch_maybe_done(struct hub_dispatch *d);

static int64_t unix_ms(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

static uint64_t rand64(void) {
    uint64_t r = 0;
    if (RAND_bytes((unsigned char *)&r, sizeof(r)) != 1) {
        r = ((uint64_t)rand() << 32) ^ (uint64_t)rand();
    }
    return r;
}

static void job_free(struct job *j) {
    free(j->shaped_body);
    free(j->local_excerpt);
    hub_policy_gen_release(j->gen);
    free(j);
}

/* ------------------------------------------------------------- outcomes -- */

static struct outcome *outcome_push(struct hub_dispatch *d) {
    if (d->n_outcomes == d->cap_outcomes) {
        size_t cap = d->cap_outcomes ? d->cap_outcomes * 2 : 64;
        struct outcome *o = realloc(d->outcomes, sizeof(*o) * cap);
        if (o == NULL) {
            return NULL;
        }
        d->outcomes = o;
        d->cap_outcomes = cap;
    }
    struct outcome *o = &d->outcomes[d->n_outcomes++];
    memset(o, 0, sizeof(*o));
    return o;
}

static void flush_timer_cb(uv_timer_t *t) {
    dispatch_flush(t->data);
}

static void schedule_flush(struct hub_dispatch *d) {
    if (d->flushing < DISPATCH_OUT_CONNECTIONS && !uv_is_active((uv_handle_t *)&d->flush_timer)) {
        uv_timer_start(&d->flush_timer, flush_timer_cb,
                       d->n_outcomes >= DISPATCH_FLUSH_MAX ? 0 : DISPATCH_FLUSH_MS, 0);
    }
}

/* One outcome transaction: owns the outcomes it carries. */
struct flush {
    struct hub_dispatch *d;
    struct outcome *o;
    size_t n;
};

/* Puts a failed batch's outcomes back at the front of the queue. */
static void flush_requeue(struct hub_dispatch *d, struct flush *f) {
    struct outcome *o = realloc(d->outcomes, sizeof(*o) * (d->n_outcomes + f->n));
    if (o == NULL) {
        /* the leases expire and the jobs are reclaimed */
        for (size_t i = 0; i < f->n; i++) {
            free(f->o[i].excerpt);
        }
        return;
    }
    memmove(o + f->n, o, sizeof(*o) * d->n_outcomes);
    memcpy(o, f->o, sizeof(*o) * f->n);
    d->outcomes = o;
    d->n_outcomes += f->n;
    d->cap_outcomes = d->n_outcomes;
}

/* 1 for a statement error that says nothing about the rows: a deadlock, a
 * serialization failure, a lock or statement timeout, resources or the
 * connection running out, an operator's cancel.  Retried as they are. */
static int sqlstate_transient(const char *s) {
    return strncmp(s, "40", 2) == 0 || strncmp(s, "53", 2) == 0 || strncmp(s, "08", 2) == 0 ||
           strncmp(s, "57", 2) == 0 || strcmp(s, "55P03") == 0 || s[0] == '\0';
}

static void flush_done(void *arg, const struct hub_pg_outcome *out) {
    struct flush *f = arg;
    struct hub_dispatch *d = f->d;

    d->flushing--;
    if (out->status == HUB_PG_ESTMT && f->n == 1 && !sqlstate_transient(out->sqlstate) &&
        !(strcmp(out->sqlstate, "23505") == 0 && !d->outcomes_checked)) {
        /* The one outcome the statement refuses: dropped, or it would be
         * retried forever with every outcome queued behind it.  Its job
         * keeps our lease until that expires; then it is reclaimed and
         * attempted again (at least once still holds). */
        hub_log(HUB_ERROR, "a delivery outcome cannot be recorded; its job will be reclaimed",
                HUB_LI("job", f->o[0].id), HUB_LS("subscription", f->o[0].sub_id),
                HUB_LS("state", f->o[0].state), HUB_LS("error", out->error));
        d->flush_single -= d->flush_single > 0;
        free(f->o[0].excerpt);
        free(f->o);
        free(f);
        schedule_flush(d);
        dispatch_maybe_done(d);
        return;
    }
    if (out->status != HUB_PG_OK) {
        /* keep them and try again; leases protect the jobs meanwhile */
        hub_log(HUB_WARN, "delivery outcomes not recorded, retrying", HUB_LS("error", out->error),
                HUB_LI("outcomes", (int64_t)f->n));
        if (out->status == HUB_PG_ESTMT && strcmp(out->sqlstate, "23505") == 0 &&
            !d->outcomes_checked) {
            /* an attempt number already recorded (store_dispatch.c, a:) */
            d->outcomes_checked = 1;
            hub_log(HUB_WARN, "an attempt was already recorded under its number (was a job's "
                              "attempt_count lowered by hand?); outcomes now probe for it first");
        } else if (out->status == HUB_PG_ESTMT && !sqlstate_transient(out->sqlstate)) {
            /* one of them (or its subscription) makes the statement fail:
             * write them one at a time, so that only that one is held back */
            d->flush_single = d->flush_single > f->n ? d->flush_single : f->n;
        }
        flush_requeue(d, f);
        free(f->o);
        free(f);
        uv_timer_stop(&d->flush_timer);
        uv_timer_start(&d->flush_timer, flush_timer_cb, 500, 0);
        return;
    }
    d->flush_single -= d->flush_single < f->n ? d->flush_single : f->n;
    /* auto-disabled subscriptions come back from the last statement */
    if (out->n_results >= 1) {
        PGresult *r = out->results[out->n_results - 1];
        int rows = r ? PQntuples(r) : 0;
        /* only hub_sql_dispatch_autodisable returns columns */
        for (int i = 0; i < rows && PQnfields(r) == HUB_AUTODISABLE_NCOLS; i++) {
            const char *sub_id = PQgetvalue(r, i, HUB_AUTODISABLE_SUB_ID);
            d->hub->metrics.subscriptions_auto_disabled++;
            queue_drop_subscription(d, sub_id);
            hub_log(HUB_WARN, "subscription auto-disabled: its destination kept failing",
                    HUB_LS("subscription", sub_id),
                    HUB_LS("tenant", PQgetvalue(r, i, HUB_AUTODISABLE_TENANT)),
                    HUB_LI("failure_window_ms", d->hub->cfg.autodisable_failure_window_ms),
                    HUB_LI("failure_spread_ms", d->hub->cfg.autodisable_failure_spread_ms));
        }
    }
    for (size_t i = 0; i < f->n; i++) {
        free(f->o[i].excerpt);
    }
    free(f->o);
    free(f);
    if (d->n_outcomes > 0) {
        schedule_flush(d);
    }
    dispatch_maybe_done(d);
}

static int outcome_gone(const struct outcome *o) {
    return o->attempted && o->status == 410;
}

static int outcome_failed(const struct outcome *o) {
    return o->attempted && !o->success;
}

/*
 * The subscription ids of the batch's outcomes that pick() selects, as a
 * binary uuid[] parameter in *value (malloc'd; NULL when none was picked or
 * on OOM) of *len bytes; repeats are harmless to "= ANY".  Returns how many
 * it holds.
 */
static size_t batch_sub_ids(const struct flush *f, int (*pick)(const struct outcome *),
                            char **value, int *len) {
    struct hub_pgarr a;
    size_t n = 0, first = 0;

    *value = NULL;
    while (first < f->n && !pick(&f->o[first])) {
        first++;
    }
    if (first == f->n) {
        return 0; /* the usual case (every attempt succeeded): no array to build */
    }
    hub_pgarr_init(&a, 2950 /* uuid */);
    for (size_t i = first; i < f->n; i++) {
        unsigned char u[HUB_UUID_BYTES];
        if (pick(&f->o[i]) && hub_uuid_parse(f->o[i].sub_id, strlen(f->o[i].sub_id), u) == 0) {
            hub_pgarr_add(&a, u, sizeof(u));
            n++;
        }
    }
    *value = hub_pgarr_take(&a, len);
    return *value != NULL ? n : 0;
}

/* Writes up to DISPATCH_FLUSH_MAX queued outcomes in one transaction; up to
 * DISPATCH_OUT_CONNECTIONS such transactions run at once. */
static void dispatch_flush(struct hub_dispatch *d) {
    /* the arrays of hub_sql_dispatch_outcomes: $1..$13, then $15 (claim serials) */
    static const uint32_t oids[14] = {
        HUB_OID_INT8, HUB_OID_TEXT,        HUB_OID_TEXT,  HUB_OID_INT8, 16 /* bool */,
        HUB_OID_TEXT, HUB_OID_TIMESTAMPTZ, HUB_OID_INT4,  HUB_OID_INT4, HUB_OID_TEXT,
        HUB_OID_TEXT, HUB_OID_TEXT,        16 /* bool */, HUB_OID_INT8,
    };
    struct hub_pgarr a[14];
    char *values[14];
    int lengths[14];
    size_t max = d->flush_single > 0 ? 1 : DISPATCH_FLUSH_MAX;
    size_t n = d->n_outcomes < max ? d->n_outcomes : max;
    struct hub_pg_txn *txn;
    struct flush *f;
    int rc = 0;

    if (d->flushing >= DISPATCH_OUT_CONNECTIONS || n == 0) {
        return;
    }
    f = calloc(1, sizeof(*f));
    if (f == NULL || (f->o = malloc(sizeof(*f->o) * n)) == NULL) {
        free(f);
        uv_timer_start(&d->flush_timer, flush_timer_cb, 500, 0);
        return;
    }
    /* the batch takes the outcomes out of the queue */
    f->d = d;
    f->n = n;
    memcpy(f->o, d->outcomes, sizeof(*f->o) * n);
    memmove(d->outcomes, d->outcomes + n, sizeof(*d->outcomes) * (d->n_outcomes - n));
    d->n_outcomes -= n;
    for (int k = 0; k < 14; k++) {
        hub_pgarr_init(&a[k], oids[k]);
    }
    for (size_t i = 0; i < n; i++) {
        const struct outcome *o = &f->o[i];
        char t = o->attempted ? 1 : 0, s = o->success ? 1 : 0;
        hub_pgarr_add_i64(&a[0], o->id);
        hub_pgarr_add_text(&a[1], o->state);
        hub_pgarr_add_text(&a[2], o->reason);
        hub_pgarr_add_i64(&a[3], o->delay_ms < DISPATCH_DEFER_MAX_MS ? o->delay_ms
                                                                     : DISPATCH_DEFER_MAX_MS);
        hub_pgarr_add(&a[4], &t, 1);
        hub_pgarr_add_text(&a[5], o->attempted ? o->delivery_id : NULL);
        hub_pgarr_add_ts(&a[6], o->started_unix_ms * 1000);
        hub_pgarr_add_i32(&a[7], o->duration_ms);
        if (o->status > 0) {
            hub_pgarr_add_i32(&a[8], o->status);
        } else {
            hub_pgarr_add(&a[8], NULL, 0);
        }
        hub_pgarr_add_text(&a[9], o->error[0] ? o->error : NULL);
        hub_pgarr_add_text(&a[10], o->excerpt);
        hub_pgarr_add_text(&a[11], o->sub_id);
        hub_pgarr_add(&a[12], &s, 1);
        hub_pgarr_add_i64(&a[13], (int64_t)o->claim);
    }
    for (int k = 0; k < 14; k++) {
        values[k] = hub_pgarr_take(&a[k], &lengths[k]);
        rc |= values[k] == NULL;
    }
    txn = rc ? NULL : hub_pg_txn_new(d->pg_out, flush_done, f);
    if (txn == NULL) {
        for (int k = 0; k < 14; k++) {
            free(values[k]);
        }
        flush_requeue(d, f);
        free(f->o);
        free(f);
        uv_timer_start(&d->flush_timer, flush_timer_cb, 500, 0);
        return;
    } else {
        char *v[15];
        int l[15];
        memcpy(v, values, sizeof(values[0]) * 13);
        memcpy(l, lengths, sizeof(lengths[0]) * 13);
        v[13] = strdup(d->owner);
        l[13] = (int)strlen(d->owner);
        v[14] = values[13];
        l[14] = lengths[13];
        hub_pg_txn_add_owned(txn,
                             d->outcomes_checked ? &hub_sql_dispatch_outcomes_checked
                                                 : &hub_sql_dispatch_outcomes,
                             15, v, l);
    }
    if (d->hub->cfg.autodisable_enabled) {
        /* 410 disables at once, but only while auto-disable is allowed */
        char *gv[1];
        int gl[1];
        if (batch_sub_ids(f, outcome_gone, &gv[0], &gl[0]) > 0) {
            hub_pg_txn_add_owned(txn, &hub_sql_dispatch_gone, 1, gv, gl);
        } else {
            free(gv[0]);
        }
        /* the gates are checked at every recorded failure (SPEC §7.7) */
        if (batch_sub_ids(f, outcome_failed, &gv[0], &gl[0]) > 0) {
            char window[32], spread[32];
            const char *params[3] = {window, spread, gv[0]};
            const int plen[3] = {0, 0, gl[0]}, pfmt[3] = {0, 0, 1};
            snprintf(window, sizeof(window), "%lld",
                     (long long)d->hub->cfg.autodisable_failure_window_ms);
            snprintf(spread, sizeof(spread), "%lld",
                     (long long)d->hub->cfg.autodisable_failure_spread_ms);
            hub_pg_txn_add(txn, &hub_sql_dispatch_autodisable, 3, params, plen, pfmt);
        }
        free(gv[0]);
    }
    d->flushing++;
    hub_pg_txn_submit(txn);
    if (d->n_outcomes > 0) {
        schedule_flush(d); /* a second batch on the other connection */
    }
}

/* ------------------------------------------------------------- attempts -- */

/* The attributes the request header builder takes, from the stored event's
 * attribute object (borrowed from attrs until it is released). */
static void event_from_attrs(const struct job *j, const json_t *attrs, struct hub_webhook_event *ev,
                             const char **ext, size_t ext_max) {
    static const char *const standard[] = {"specversion",
                                           "id",
                                           "source",
                                           "type",
                                           "time",
                                           "subject",
                                           "dataschema",
                                           "schemaversion",
                                           "datacontenttype",
                                           "tenantid",
                                           "traceparent",
                                           "tracestate"};
    const char *name;
    json_t *value;
    size_t n = 0;

    memset(ev, 0, sizeof(*ev));
    ev->id = j->event_id;
    ev->event_type = j->event_type;
    ev->content_type = j->content_type;
    ev->source = json_string_value(json_object_get(attrs, "source"));
    ev->type = json_string_value(json_object_get(attrs, "type"));
    ev->time = json_string_value(json_object_get(attrs, "time"));
    ev->subject = json_string_value(json_object_get(attrs, "subject"));
    ev->schema_version = json_string_value(json_object_get(attrs, "schemaversion"));
    ev->dataschema = json_string_value(json_object_get(attrs, "dataschema"));
    ev->traceparent = json_string_value(json_object_get(attrs, "traceparent"));
    ev->tracestate = json_string_value(json_object_get(attrs, "tracestate"));
    json_object_foreach((json_t *)attrs, name, value) {
        int is_standard = 0;
        for (size_t k = 0; k < sizeof(standard) / sizeof(standard[0]); k++) {
            is_standard |= strcmp(name, standard[k]) == 0;
        }
        if (!is_standard && json_is_string(value) && n + 2 < ext_max) {
            ext[n++] = name;
            ext[n++] = json_string_value(value);
        }
    }
    ext[n] = NULL;
    ev->extensions = ext;
}

/*
 * Builds the request headers of SPEC §7.2 with the builder the verification
 * probe uses (webhook.h), over body[0..len) as it will be sent.  extra is
 * what a shape policy added (reserved names are dropped: policy headers can
 * never replace the hub's own).  Returns 0, or -1 when the secrets cannot be
 * opened (wrong KEK): the attempt then fails.
 */
static int job_headers(const struct job *j, const struct hub_kek *kek,
                       const struct hub_webhook_event *ev, const void *body, size_t len,
                       const json_t *extra, struct hub_webhook_headers *h) {
    struct hub_sign_key keys[HUB_WEBHOOK_MAX_KEYS];
    size_t nkeys = 0;
    struct hub_webhook_target t;
    json_t *dest = NULL;
    int rc;

    if (hub_webhook_open_keys(kek, j->sub_id, j->secret_sealed, j->prev_secret_sealed,
                              j->prev_secret_sealed != NULL, keys, &nkeys) != 0) {
        return -1;
    }
    if (hub_webhook_open_headers(kek, j->sub_id, j->headers_sealed, &dest) != 0) {
        OPENSSL_cleanse(keys, sizeof(keys));
        return -1;
    }
    if (extra != NULL) {
        const char *name;
        json_t *value;
        if (dest == NULL) {
            dest = json_object();
        }
        json_object_foreach((json_t *)extra, name, value) {
            if (dest != NULL && !hub_webhook_header_reserved(name, strlen(name))) {
                json_object_set(dest, name, value);
            }
        }
    }
    t = (struct hub_webhook_target){
        .tenant_id = j->tenant,
        .subscription_id = j->sub_id,
        .delivery_id = j->delivery_id,
        .attempt = j->attempt_count + 1,
        .keys = keys,
        .nkeys = nkeys,
        .unix_s = unix_ms() / 1000,
        .dest_headers = dest,
    };
    rc = hub_webhook_build_headers(ev, &t, body, len, h);
    OPENSSL_cleanse(keys, sizeof(keys));
    hub_webhook_headers_wipe(dest);
    return rc;
}

/* Counts a policy call that did not return normally, and logs it (at most
 * DISPATCH_POLICY_LOG_PER_S lines a second: a broken policy on a busy
 * subscription must not flood the log; the metric counts every one). */
static void policy_failed(struct hub_dispatch *d, const struct job *j, enum hub_policy_fn fn,
                          enum hub_policy_status st, const char *err) {
    int64_t now_s = unix_ms() / 1000;

    hub_policies_count_error(d->hub->policies, j->policy, fn, st);
    if (now_s != d->policy_log_s) {
        d->policy_log_s = now_s;
        d->policy_log_n = 0;
    }
    if (d->policy_log_n++ < DISPATCH_POLICY_LOG_PER_S) {
        hub_log(HUB_WARN, "policy call failed", HUB_LS("policy", j->policy),
                HUB_LS("function", hub_policy_fn_str(fn)),
                HUB_LS("kind", hub_policy_status_str(st)), HUB_LS("error", err),
                HUB_LS("subscription", j->sub_id), HUB_LI("job", j->id));
    }
}

/* A failure whose retry (or exhaustion) the default curve decides because
 * the subscription's stored schedule is malformed: counted, and logged at
 * most once a minute. */
static void schedule_fallback(struct hub_dispatch *d, const struct job *j) {
    uint64_t now = uv_now(d->hub->loop);

    d->hub->metrics.retry_schedule_fallbacks++;
    if (d->schedule_fallback_logged_ms == 0 || now - d->schedule_fallback_logged_ms >= 60000) {
        d->schedule_fallback_logged_ms = now;
        hub_log(HUB_WARN, "malformed retry_schedule: the default curve times the retry",
                HUB_LS("subscription", j->sub_id), HUB_LI("job", j->id));
    }
}

/*
 * The delay before the next attempt of a job whose attempt just failed
 * (SPEC §7.4, §8): a policy's retry function or table first, then the
 * subscription's schedule, then the default curve.  Returns the delay in
 * ms, or -1 when the job is dead (*reason says why).
 */
static int64_t job_retry_delay(struct hub_dispatch *d, const struct job *j,
                               const struct hub_httpc_response *res, const char **reason) {
    struct hub_config *cfg = &d->hub->cfg;
    const int64_t *sched = j->n_schedule ? j->schedule : cfg->retry_schedule_ms;
    size_t nsched = j->n_schedule ? j->n_schedule : cfg->retry_schedule_len;
    int failed = j->attempt_count + 1;
    int64_t delay;

    const int64_t *table = NULL;
    size_t ntable = j->pol != NULL ? hub_policy_retry_schedule(j->pol, &table) : 0;

    *reason = "exhausted";
    if (ntable > 0) {
        sched = table;
        nsched = ntable;
    } else if (j->pol != NULL && hub_policy_has(j->pol, HUB_POLICY_RETRY)) {
        struct hub_policy_retry_ctx ctx = {
            .attempt = failed,
            .status = res != NULL ? (int)res->status : 0,
            .error = res != NULL && res->error != HUB_HTTPC_OK ? hub_httpc_error_str(res->error)
                     : res != NULL                             ? "status"
                                                               : j->local_error,
        };
        enum hub_policy_retry_action action;
        char err[512];
        enum hub_policy_status st =
            hub_policy_retry(j->pol, &ctx, &action, &delay, err, sizeof(err));
        if (st != HUB_POLICY_OK) {
            /* SPEC §8: a failing retry function means the default curve */
            policy_failed(d, j, HUB_POLICY_RETRY, st, err);
            sched = cfg->retry_schedule_ms;
            nsched = cfg->retry_schedule_len;
        } else if (action == HUB_POLICY_RETRY_DEAD) {
            *reason = "policy";
            return -1;
        } else if (action == HUB_POLICY_RETRY_DELAY) {
            return failed < DISPATCH_POLICY_MAX_ATTEMPTS ? delay : -1;
        }
    }
    if (sched == cfg->retry_schedule_ms && j->schedule_malformed) {
        schedule_fallback(d, j);
    }
    return hub_backoff_delay_ms(sched, nsched, failed, rand64());
}

/*
 * Settles a job without an attempt and frees it: given back or rescheduled
 * ("pending" after delay_ms: released, deferred, shed) or dropped by its
 * policy ("filtered").  Nothing is counted as an attempt or a failure.
 */
static void outcome_unattempted(struct hub_dispatch *d, int64_t id, const char *sub_id,
                                uint64_t claim, const char *state, int64_t delay_ms) {
    struct outcome *o = outcome_push(d);
    if (o != NULL) { /* else the lease expires and the job is reclaimed */
        o->id = id;
        o->claim = claim;
        o->state = state;
        o->delay_ms = delay_ms;
        o->started_unix_ms = unix_ms();
        snprintf(o->sub_id, sizeof(o->sub_id), "%s", sub_id);
        schedule_flush(d);
    }
}

static void job_unattempted(struct hub_dispatch *d, struct job *j, const char *state,
                            int64_t delay_ms) {
    outcome_unattempted(d, j->id, j->sub_id, j->claim.serial, state, delay_ms);
    job_free(j);
}

/* A job rescheduled to `until` (Unix ms) without an attempt; `why` is
 * HUB_D_SHED or HUB_D_DEFERRED. */
static void job_postpone(struct hub_dispatch *d, struct job *j, enum hub_delivery_outcome why,
                         int64_t until) {
    int64_t now = unix_ms();
    d->hub->metrics.deliveries[why]++;
    job_unattempted(d, j, "pending", until - now > 0 ? until - now : 1);
}

/* Records an attempt's result (res NULL: it failed before any HTTP). */
static void job_outcome(struct hub_dispatch *d, struct job *j,
                        const struct hub_httpc_response *res) {
    struct outcome *o = outcome_push(d);
    int success =
        res != NULL && res->error == HUB_HTTPC_OK && res->status >= 200 && res->status < 300;

    if (o == NULL) {
        return; /* OOM: the lease expires and the job is reclaimed */
    }
    o->id = j->id;
    o->claim = j->claim.serial;
    snprintf(o->sub_id, sizeof(o->sub_id), "%s", j->sub_id);
    o->started_unix_ms = j->started_unix_ms ? j->started_unix_ms : unix_ms();
    o->attempted = 1;
    o->success = success;
    snprintf(o->delivery_id, sizeof(o->delivery_id), "%s", j->delivery_id);
    if (res != NULL) {
        o->duration_ms = (int)res->duration_ms;
        o->status = (int)res->status;
        if (res->error != HUB_HTTPC_OK) {
            snprintf(o->error, sizeof(o->error), "%s", hub_httpc_error_str(res->error));
        } else if (!success) {
            snprintf(o->error, sizeof(o->error), "status");
        }
        if (res->excerpt_len > 0) {
            /* the text part of the excerpt: it may end inside a character
             * cut at the byte limit, or the body may not be text at all */
            size_t n = hub_utf8_prefix(res->excerpt, res->excerpt_len);
            o->excerpt = n > 0 ? strndup(res->excerpt, n) : NULL;
        }
        hub_histogram_observe(&d->hub->metrics.delivery_attempt_seconds,
                              (double)res->duration_ms / 1000.0);
    } else {
        /* failed before any HTTP: a policy error, or secrets that do not open */
        if (j->breaker_probe) {
            hub_breaker_release(d->breakers, j->tenant, j->origin, unix_ms());
        }
        snprintf(o->error, sizeof(o->error), "%s", j->local_error ? j->local_error : "signing");
        o->excerpt = j->local_excerpt;
        j->local_excerpt = NULL;
    }
    if (success) {
        o->state = "succeeded";
        d->hub->metrics.deliveries[HUB_D_SUCCEEDED]++;
    } else {
        const char *dead_reason = "exhausted";
        int64_t delay = job_retry_delay(d, j, res, &dead_reason);
        if (res != NULL && (res->status == 429 || res->status == 503) && res->retry_after) {
            int64_t ra = hub_retry_after_ms(res->retry_after, unix_ms());
            if (ra > 0 && delay >= 0 && ra > delay) {
                delay = ra; /* no earlier than Retry-After (capped at 10h there) */
            }
        }
        d->hub->metrics.deliveries[HUB_D_FAILED]++;
        if (delay < 0) {
            o->state = "dead";
            o->reason = dead_reason;
            d->hub->metrics.deliveries[HUB_D_DEAD]++;
        } else {
            o->state = "pending";
            o->delay_ms = delay;
        }
        if (res != NULL && res->status == 410 && d->hub->cfg.autodisable_enabled) {
            queue_drop_subscription(d, j->sub_id); /* it is being disabled */
        }
    }
    schedule_flush(d);
}

static void attempt_done(void *arg, const struct hub_httpc_response *res) {
    struct job *j = arg;
    struct hub_dispatch *d = j->d;
    int success = res->error == HUB_HTTPC_OK && res->status >= 200 && res->status < 300;

    hub_breaker_report(d->breakers, j->tenant, j->origin, success, unix_ms());
    job_outcome(d, j, res);
    if (hub_log_enabled(HUB_DEBUG)) {
        hub_log(HUB_DEBUG, "delivery attempt", HUB_LS("tenant", j->tenant),
                HUB_LS("subscription", j->sub_id), HUB_LI("job", j->id),
                HUB_LS("delivery_id", j->delivery_id), HUB_LI("status", res->status),
                HUB_LS("error", success ? NULL : res->error_text));
    }
    d->inflight--;
    job_free(j);
    dispatch_pump(d);
    dispatch_maybe_done(d);
}

/*
 * hub_url_parse() of a destination, remembered by its text: a URL is parsed
 * once, not for each attempt (libcurl's URL API and its copies were 2% of
 * the dispatcher's CPU).  The result depends on the text alone.  On return
 * out->path points into url, as if url had been parsed.
 */
static int url_parse_cached(struct hub_dispatch *d, const char *url, struct hub_url *out) {
    struct url_slot *s;

    if (d->urls == NULL && (d->urls = calloc(URL_SLOTS, sizeof(*d->urls))) == NULL) {
        return hub_url_parse(url, out);
    }
    s = &d->urls[hub_fnv1a_str(url) % URL_SLOTS];
    if (s->text == NULL || strcmp(s->text, url) != 0) {
        char *text = strdup(url);
        if (text == NULL) {
            return hub_url_parse(url, out);
        }
        free(s->text);
        s->text = text;
        s->ok = hub_url_parse(text, &s->u) == 0;
        s->path_at = -1;
        if (s->ok) {
            /* the path is the URL's tail, or a static "/" when it has none */
            size_t tl = strlen(text), pl = strlen(s->u.path);
            s->path_at = pl <= tl && strcmp(text + tl - pl, s->u.path) == 0 ? (long)(tl - pl) : -1;
        }
    }
    *out = s->u;
    if (s->path_at >= 0) {
        out->path = url + s->path_at;
    }
    return s->ok ? 0 : -1;
}

/*
 * Takes one token of the subscription's bucket (a second's worth of burst,
 * at least one).  Returns 0 when the attempt may go, or the milliseconds to
 * wait for the next token: no later than the longest retry step, since a
 * rate far below one a day would wait longer than a timestamp can say.
 */
static int64_t rate_take(struct hub_dispatch *d, const char *sub_id, double rate) {
    double wait = hub_bucket_take(&d->rates, sub_id, rate, rate > 1 ? rate : 1, 1.0, hub_now_ns());
    double wait_ms = wait * 1000.0;

    if (wait <= 0.0) {
        return 0;
    }
    return wait_ms < (double)DISPATCH_DEFER_MAX_MS ? (int64_t)wait_ms + 1 : DISPATCH_DEFER_MAX_MS;
}

/* A job whose policy's match turned it down: deleted, never attempted. */
static void job_filtered(struct hub_dispatch *d, struct job *j) {
    d->hub->metrics.policy_filtered++;
    job_unattempted(d, j, "filtered", 0);
}

/* Fails the attempt before any HTTP (SPEC §8: error policy_error, retried
 * as any failure); the message goes where a response excerpt would. */
static void job_policy_error(struct hub_dispatch *d, struct job *j, const char *err) {
    j->local_error = "policy_error";
    /* a Lua message may hold any bytes (error(ev.body)), or be cut inside
     * a character: keep what the attempts table can store */
    j->local_excerpt = strndup(err, hub_utf8_prefix(err, strnlen(err, DISPATCH_EXCERPT)));
    job_outcome(d, j, NULL);
    job_free(j);
}

/* The event as policies see it, from the header builder's view of it. */
static void policy_event(const struct job *j, const struct hub_webhook_event *wev,
                         struct hub_policy_event *ev) {
    *ev = (struct hub_policy_event){
        .id = j->event_id,
        .source = wev->source,
        .type = wev->type,
        .event_type = j->event_type,
        .tenant = j->tenant,
        .subject = wev->subject,
        .time = wev->time,
        .schema_version = wev->schema_version,
        .content_type = j->content_type,
        .schema_major = j->schema_major,
        .extensions = wev->extensions,
        .body = j->payload,
        .body_len = j->payload_len,
        .serial = ++j->d->ev_serial,
    };
}

/*
 * Starts the attempt for one claimed job: its policy's match (first attempt
 * only), the rate limit, the breaker, its policy's shape, then the signed
 * POST.  Or it filters, defers, sheds or fails the job without one.
 */
static void job_start(struct hub_dispatch *d, struct job *j) {
    struct hub_webhook_headers h = {0};
    struct hub_webhook_event wev;
    struct hub_policy_event pev;
    struct hub_policy_shaped shaped = {0};
    const char *ext[2 * 64 + 1];
    struct hub_url u;
    struct hub_httpc_request req;
    int64_t retry_at = 0;
    json_t *attrs;
    json_error_t jerr;
    char err[512];
    int rc, url_ok;

    if ((url_ok = url_parse_cached(d, j->url, &u) == 0)) {
        snprintf(j->origin, sizeof(j->origin), "%s", u.origin);
    } else {
        snprintf(j->origin, sizeof(j->origin), "%s", j->url);
    }
    attrs = json_loads(j->attrs ? j->attrs : "{}", 0, &jerr);
    event_from_attrs(j, attrs, &wev, ext, sizeof(ext) / sizeof(ext[0]));
    policy_event(j, &wev, &pev);
    if (j->policy != NULL) {
        j->gen = hub_policies_acquire(d->hub->policies);
        j->pol = hub_policy_gen_find(j->gen, j->policy);
        if (j->pol == NULL) {
            snprintf(err, sizeof(err), "policy '%s' is not loaded", j->policy);
            policy_failed(d, j, HUB_POLICY_SHAPE, HUB_POLICY_MISSING, err);
        }
    }
    if (j->pol != NULL && j->attempt_count == 0 && hub_policy_has(j->pol, HUB_POLICY_MATCH)) {
        int matched = 1;
        enum hub_policy_status st = hub_policy_match(j->pol, &pev, &matched, err, sizeof(err));
        if (st != HUB_POLICY_OK) {
            /* SPEC §8: an error counts as a match (never lose an event) */
            policy_failed(d, j, HUB_POLICY_MATCH, st, err);
        } else if (!matched) {
            json_decref(attrs);
            job_filtered(d, j);
            return;
        }
    }
    if (j->max_rate > 0) {
        int64_t wait = rate_take(d, j->sub_id, j->max_rate);
        if (wait > 0) {
            /* over the rate: deferred, neither attempted nor a failure */
            json_decref(attrs);
            job_postpone(d, j, HUB_D_DEFERRED, unix_ms() + wait);
            return;
        }
    }
    switch (hub_breaker_check(d->breakers, j->tenant, j->origin, unix_ms(), &retry_at)) {
    case HUB_BREAKER_SHED:
        json_decref(attrs);
        job_postpone(d, j, HUB_D_SHED, retry_at);
        return;
    case HUB_BREAKER_PROBE:
        j->breaker_probe = 1;
        break;
    case HUB_BREAKER_ALLOW:
        break;
    }
    if (hub_uuid7_text(j->delivery_id) != 0) {
        snprintf(j->delivery_id, sizeof(j->delivery_id), "00000000-0000-7000-8000-000000000000");
    }
    j->started_unix_ms = unix_ms();
    if (j->policy != NULL && j->pol == NULL) {
        /* the policy may have shaped the body: never send it unshaped */
        json_decref(attrs);
        job_policy_error(d, j, err);
        return;
    }
    if (j->pol != NULL && hub_policy_has(j->pol, HUB_POLICY_SHAPE)) {
        enum hub_policy_status st = hub_policy_shape(j->pol, &pev, &shaped, err, sizeof(err));
        if (st != HUB_POLICY_OK) {
            policy_failed(d, j, HUB_POLICY_SHAPE, st, err);
            json_decref(attrs);
            job_policy_error(d, j, err);
            return;
        }
        if (shaped.content_type != NULL) {
            wev.content_type = shaped.content_type;
        }
        if (shaped.body != NULL) {
            /* the signature covers the shaped body (SPEC §7.2) */
            free(j->shaped_body);
            j->shaped_body = shaped.body;
            j->payload = (unsigned char *)shaped.body;
            j->payload_len = shaped.body_len;
            shaped.body = NULL;
        }
    }
    rc = job_headers(j, &d->hub->kek, &wev, j->payload, j->payload_len, shaped.headers, &h);
    hub_policy_shaped_free(&shaped);
    json_decref(attrs);
    if (rc != 0) {
        hub_log(HUB_ERROR, "cannot open the subscription's secrets (wrong STREAMING_HUB_KEK?)",
                HUB_LS("subscription", j->sub_id), HUB_LI("job", j->id));
        job_outcome(d, j, NULL);
        job_free(j);
        return;
    }
    req = (struct hub_httpc_request){
        .url = j->url,
        .parsed = url_ok ? &u : NULL,
        .headers = (const char *const *)h.lines,
        .body = j->payload,
        .body_len = j->payload_len,
        .timeout_ms = d->hub->cfg.delivery_timeout_ms,
        .connect_timeout_ms = 5000,
    };
    d->inflight++;
    if (hub_httpc_post(d->hub->httpc, &req, attempt_done, j) != 0) {
        struct hub_httpc_response res = {.error = HUB_HTTPC_PROTOCOL,
                                         .error_text = "request refused"};
        d->inflight--;
        if (j->breaker_probe) {
            hub_breaker_release(d->breakers, j->tenant, j->origin, unix_ms());
        }
        job_outcome(d, j, &res);
        job_free(j);
    }
    hub_webhook_headers_free(&h);
}

/* Gives a claimed job back without an attempt and without counting a
 * reclaim: its lease is cleared and it is due again at once. */
static void job_release(struct hub_dispatch *d, struct job *j) {
    job_unattempted(d, j, "pending", 0);
}

static int queue_push(struct hub_dispatch *d, struct job *j) {
    if (d->n_queue == d->cap_queue) {
        size_t cap = d->cap_queue ? d->cap_queue * 2 : 64;
        struct job **q = realloc(d->queue, sizeof(*q) * cap);
        if (q == NULL) {
            return -1;
        }
        d->queue = q;
        d->cap_queue = cap;
    }
    d->queue[d->n_queue++] = j;
    return 0;
}

/* A subscription this process just disabled (auto-disable, 410): its queued
 * jobs go back unattempted — the outcome write parks them — so that no
 * attempt starts after the disable. */
static void queue_drop_subscription(struct hub_dispatch *d, const char *sub_id) {
    size_t kept = 0;
    for (size_t i = 0; i < d->n_queue; i++) {
        struct job *j = d->queue[i];
        if (strcmp(j->sub_id, sub_id) == 0) {
            job_release(d, j);
        } else {
            d->queue[kept++] = j;
        }
    }
    d->n_queue = kept;
}

/* The next job round-robin across tenants: the oldest queued job of the
 * first tenant after the one popped last (wrapping around). */
static struct job *queue_pop(struct hub_dispatch *d) {
    size_t best = 0;
    int best_wrapped = 2;
    struct job *j;

    for (size_t i = 0; i < d->n_queue; i++) {
        const char *t = d->queue[i]->tenant ? d->queue[i]->tenant : "";
        int wrapped = strcmp(t, d->pop_tenant) <= 0;
        if (wrapped < best_wrapped ||
            (wrapped == best_wrapped &&
             strcmp(t, d->queue[best]->tenant ? d->queue[best]->tenant : "") < 0)) {
            best = i;
            best_wrapped = wrapped;
        }
    }
    j = d->queue[best];
    memmove(d->queue + best, d->queue + best + 1, sizeof(*d->queue) * (d->n_queue - best - 1));
    d->n_queue--;
    snprintf(d->pop_tenant, sizeof(d->pop_tenant), "%s", j->tenant ? j->tenant : "");
    return j;
}

/* How long a claimed job may wait in the queue and still start: its lease
 * must cover the whole attempt and the outcome's write after it.  A lease
 * not longer than the attempt timeout plus that margin cannot (the start
 * warns); then half the lease, as the attempt may outlive it anyway. */
static int64_t dispatch_start_budget_ms(const struct hub_config *cfg) {
    int64_t budget = cfg->dispatch_lease_ms - cfg->delivery_timeout_ms - DISPATCH_OUTCOME_MARGIN_MS;
    return budget > 0 ? budget : cfg->dispatch_lease_ms / 2;
}

/*
 * Starts queued jobs while workers are free, then claims more.  A job that
 * waited in the queue past dispatch_start_budget_ms() is given back rather
 * than started: its lease must not run out during the attempt (another
 * dispatcher would take it, and the expiry would count as a reclaim).
 */
static void dispatch_pump(struct hub_dispatch *d) {
    size_t workers = (size_t)d->hub->cfg.dispatch_workers;
    int64_t stale_ms = dispatch_start_budget_ms(&d->hub->cfg);

    if (d->stopping) {
        /* a claim that was in flight when the stop came: give it all back */
        while (d->n_queue > 0) {
            job_release(d, d->queue[--d->n_queue]);
        }
        return;
    }
    while (!d->stopping && d->inflight < workers && d->n_queue > 0) {
        struct job *j = queue_pop(d);
        if (unix_ms() - j->claim.ms > stale_ms) {
            job_release(d, j);
            continue;
        }
        job_start(d, j); /* may finish at once (filtered, deferred, shed) */
    }
    dispatch_claim(d);
}

/* --------------------------------------------------------------- claims -- */

/*
 * Where a job's columns come from: its row of the claim, its subscription's
 * row and its event's row, of the load or of the claim itself (all binary).
 * Column k of a source is column base + k of its result: k of enum
 * hub_claim_col, hub_load_sub_col and hub_load_event_col; the base is 0 in
 * the load's results, HUB_CLAIM_SUB and HUB_CLAIM_EVENT in a claim that did
 * the lookups itself.
 */
enum { ROWS_CLAIM, ROWS_SUB, ROWS_EVENT, ROWS_N };
struct job_rows {
    PGresult *r[ROWS_N];
    int i[ROWS_N];
    int base[ROWS_N];
};

/* The value of column col of source src (NULL for SQL NULL). */
static const char *rows_value(const struct job_rows *x, int src, int col, size_t *len) {
    col += x->base[src];
    if (PQgetisnull(x->r[src], x->i[src], col)) {
        return NULL;
    }
    *len = (size_t)PQgetlength(x->r[src], x->i[src], col);
    return PQgetvalue(x->r[src], x->i[src], col);
}

/*
 * A job from its rows, in one allocation with its text columns and its
 * payload: a dozen malloc and free calls per job were 10% of the
 * dispatcher's CPU.  NULL when out of memory.
 */
static struct job *job_from_rows(struct hub_dispatch *d, const struct job_rows *x,
                                 struct claim_stamp claim) {
    enum { N_TEXT = 10 };
    static const struct {
        int src, col;
        size_t off;
    } text[N_TEXT] = {
        {ROWS_CLAIM, HUB_CLAIM_TENANT, offsetof(struct job, tenant)},
        {ROWS_CLAIM, HUB_CLAIM_EVENT_ID, offsetof(struct job, event_id)},
        {ROWS_CLAIM, HUB_CLAIM_EVENT_TYPE, offsetof(struct job, event_type)},
        {ROWS_SUB, HUB_LOAD_SUB_URL, offsetof(struct job, url)},
        {ROWS_SUB, HUB_LOAD_SUB_HEADERS_SEALED, offsetof(struct job, headers_sealed)},
        {ROWS_SUB, HUB_LOAD_SUB_SECRET_SEALED, offsetof(struct job, secret_sealed)},
        {ROWS_SUB, HUB_LOAD_SUB_PREV_SECRET_SEALED, offsetof(struct job, prev_secret_sealed)},
        {ROWS_SUB, HUB_LOAD_SUB_POLICY, offsetof(struct job, policy)},
        {ROWS_EVENT, HUB_LOAD_EVENT_CONTENT_TYPE, offsetof(struct job, content_type)},
        {ROWS_EVENT, HUB_LOAD_EVENT_ATTRS, offsetof(struct job, attrs)},
    };
    size_t need = sizeof(struct job), len = 0;
    const char *payload = rows_value(x, ROWS_EVENT, HUB_LOAD_EVENT_PAYLOAD, &len);
    const char *v;
    struct job *j;
    char *p;

    need += len + 1;
    for (int k = 0; k < N_TEXT; k++) {
        need += rows_value(x, text[k].src, text[k].col, &len) ? len + 1 : 0;
    }
    if ((j = calloc(1, need)) == NULL) {
        return NULL;
    }
    p = (char *)(j + 1);
    for (int k = 0; k < N_TEXT; k++) {
        if ((v = rows_value(x, text[k].src, text[k].col, &len)) != NULL) {
            memcpy(p, v, len);
            p[len] = '\0';
            *(char **)((char *)j + text[k].off) = p;
            p += len + 1;
        }
    }
    /* a bytea in binary: its bytes (in text format it came as hex, twice
     * its size, to be encoded by the server and decoded here) */
    j->payload = (unsigned char *)p;
    if (payload != NULL) {
        rows_value(x, ROWS_EVENT, HUB_LOAD_EVENT_PAYLOAD, &j->payload_len);
        memcpy(p, payload, j->payload_len);
    }
    j->d = d;
    j->id = atoll(rows_value(x, ROWS_CLAIM, HUB_CLAIM_ID, &len));
    snprintf(j->sub_id, sizeof(j->sub_id), "%s", rows_value(x, ROWS_CLAIM, HUB_CLAIM_SUB_ID, &len));
    j->attempt_count = atoi(rows_value(x, ROWS_CLAIM, HUB_CLAIM_ATTEMPT_COUNT, &len));
    if ((v = rows_value(x, ROWS_SUB, HUB_LOAD_SUB_RETRY_SCHEDULE, &len)) != NULL) {
        int n = hub_duration_list_parse(v, j->schedule, HUB_RETRY_MAX_STEPS);
        /* a malformed schedule falls back to the default curve, counted
         * when a retry uses it (SPEC §7.4) */
        j->n_schedule = n > 0 && hub_backoff_schedule_valid(j->schedule, (size_t)n) ? (size_t)n : 0;
        j->schedule_malformed = j->n_schedule == 0;
    }
    j->max_rate = (v = rows_value(x, ROWS_SUB, HUB_LOAD_SUB_MAX_RATE, &len)) != NULL ? atof(v) : 0;
    j->schema_major =
        (v = rows_value(x, ROWS_EVENT, HUB_LOAD_EVENT_SCHEMA_MAJOR, &len)) != NULL ? atoi(v) : 0;
    j->claim = claim;
    return j;
}

/* ---------------------------------------------------------------- loads -- */

/* A claim's jobs between their lease and the queue. */
struct load {
    struct hub_dispatch *d;
    PGresult *claim; /* a copy of the claim's result */
    struct claim_stamp stamp;
    int days; /* event statements: one per day of the batch */
};

/* A subscription id and its row (of the claim or of the load). */
struct sub_row {
    const char *id;
    int row;
};

static int sub_row_cmp(const void *a, const void *b) {
    return strcmp(((const struct sub_row *)a)->id, ((const struct sub_row *)b)->id);
}

/* Rows of r by their subscription id (column col), sorted; NULL on OOM. */
static struct sub_row *sub_rows_sorted(PGresult *r, int col) {
    int n = PQntuples(r);
    struct sub_row *s = malloc(sizeof(*s) * (size_t)(n > 0 ? n : 1));
    if (s != NULL) {
        for (int i = 0; i < n; i++) {
            s[i].id = PQgetvalue(r, i, col);
            s[i].row = i;
        }
        qsort(s, (size_t)n, sizeof(*s), sub_row_cmp);
    }
    return s;
}

/* Gives a claim's jobs back unattempted (no reclaim counted). */
static void load_release(struct hub_dispatch *d, PGresult *claim, uint64_t serial) {
    for (int i = 0; i < PQntuples(claim); i++) {
        outcome_unattempted(d, atoll(PQgetvalue(claim, i, HUB_CLAIM_ID)),
                            PQgetvalue(claim, i, HUB_CLAIM_SUB_ID), serial, "pending", 0);
    }
}

/* Makes a job of x and queues it (out of memory, the lease expires and the
 * job is reclaimed later). */
static void queue_job(struct hub_dispatch *d, const struct job_rows *x, struct claim_stamp claim) {
    struct job *j = job_from_rows(d, x, claim);
    if (j != NULL && queue_push(d, j) != 0) {
        job_free(j);
    }
}

/* Queues the jobs of one day's events of a load (see load_done). */
static void load_events(struct hub_dispatch *d, const struct load *l, PGresult *subs,
                        const struct sub_row *by_id, PGresult *evs) {
    int rows = PQntuples(l->claim);

    for (int e = 0; evs != NULL && e < PQntuples(evs); e++) {
        struct job_rows x = {{l->claim, subs, evs},
                             {atoi(PQgetvalue(evs, e, HUB_LOAD_EVENT_KEY)) - 1, 0, e},
                             {0, 0, 0}};
        struct sub_row key, *s;
        if (x.i[ROWS_CLAIM] < 0 || x.i[ROWS_CLAIM] >= rows) {
            continue;
        }
        key.id = PQgetvalue(l->claim, x.i[ROWS_CLAIM], HUB_CLAIM_SUB_ID);
        s = bsearch(&key, by_id, (size_t)PQntuples(subs), sizeof(*by_id), sub_row_cmp);
        if (s == NULL) {
            continue;
        }
        x.i[ROWS_SUB] = s->row;
        queue_job(d, &x, l->stamp);
    }
}

static void load_done(void *arg, const struct hub_pg_outcome *out) {
    struct load *l = arg;
    struct hub_dispatch *d = l->d;
    int rows = PQntuples(l->claim);
    PGresult *subs = out->n_results == 1 + l->days ? out->results[0] : NULL;
    struct sub_row *by_id = NULL;

    d->loading -= (size_t)rows;
    if (out->status != HUB_PG_OK || subs == NULL ||
        (by_id = sub_rows_sorted(subs, HUB_LOAD_SUB_ID)) == NULL) {
        hub_log(HUB_WARN, "claimed jobs could not be loaded: released",
                HUB_LS("error", out->status != HUB_PG_OK ? out->error : "out of memory"),
                HUB_LI("jobs", rows));
        load_release(d, l->claim, l->stamp.serial);
    } else {
        /* a job whose event is gone (its partition dropped) has no row and
         * stays leased: it is reclaimed, and dead as poison in the end; one
         * whose subscription is gone went with it */
        for (int k = 1; k <= l->days; k++) {
            load_events(d, l, subs, by_id, out->results[k]);
        }
    }
    free(by_id);
    PQclear(l->claim);
    free(l);
    dispatch_pump(d); /* stopping: the loaded jobs go back at once */
    dispatch_maybe_done(d);
}

/* Queues the jobs of a claim that looked up what their attempts need. */
static void claim_jobs(struct hub_dispatch *d, PGresult *r, int rows, struct claim_stamp stamp) {
    for (int i = 0; i < rows; i++) {
        struct job_rows x = {{r, r, r}, {i, i, i}, {0, HUB_CLAIM_SUB, HUB_CLAIM_EVENT}};
        size_t len;
        /* a job whose event is gone (its partition dropped) stays leased: it
         * is reclaimed, and dead as poison in the end */
        if (rows_value(&x, ROWS_EVENT, HUB_LOAD_EVENT_KEY, &len) == NULL ||
            rows_value(&x, ROWS_SUB, HUB_LOAD_SUB_ID, &len) == NULL) {
            continue;
        }
        queue_job(d, &x, stamp);
    }
}

/*
 * Reads what the attempts of a claim's jobs need (hub_sql_dispatch_load_*) on the load
 * connection.  The claim connection is free for the next claim meanwhile:
 * the claim is the one step of the cycle that runs one at a time, and the
 * lookups were a third of it.
 */
/* Adds the event statement of the claim rows (r) whose day is day. */
static int load_add_day(struct hub_pg_txn *txn, PGresult *r, const int *row_day, int rows,
                        int day) {
    static const int formats[3] = {1, 1, 0};
    struct hub_pgarr seqs, ords;
    const char *params[3];
    int lengths[3] = {0, 0, 0};
    char text[16];
    int rc;

    hub_pgarr_init(&seqs, HUB_OID_INT8);
    hub_pgarr_init(&ords, HUB_OID_INT4);
    for (int i = 0; i < rows; i++) {
        if (row_day[i] == day) {
            hub_pgarr_add_i64(&seqs, atoll(PQgetvalue(r, i, HUB_CLAIM_EVENT_SEQ)));
            hub_pgarr_add_i32(&ords, i + 1);
        }
    }
    snprintf(text, sizeof(text), "%d", day);
    params[0] = hub_pgarr_finish(&seqs, &lengths[0]);
    params[1] = hub_pgarr_finish(&ords, &lengths[1]);
    params[2] = text;
    rc =
        params[0] != NULL && params[1] != NULL
            ? hub_pg_txn_add_binary(txn, &hub_sql_dispatch_load_events, 3, params, lengths, formats)
            : -1;
    hub_pgarr_free(&seqs);
    hub_pgarr_free(&ords);
    return rc;
}

static void dispatch_load(struct hub_dispatch *d, PGresult *r, int rows, struct claim_stamp stamp) {
    static const int formats[1] = {1};
    struct load *l = calloc(1, sizeof(*l));
    struct sub_row *by_id = sub_rows_sorted(r, HUB_CLAIM_SUB_ID);
    int *row_day = malloc(sizeof(*row_day) * (size_t)(rows > 0 ? rows : 1));
    struct hub_pgarr subs;
    const char *sub_ids;
    int sub_len, ok;
    struct hub_pg_txn *txn = NULL;

    if (l == NULL || by_id == NULL || row_day == NULL ||
        (l->claim = PQcopyResult(r, PG_COPYRES_ATTRS | PG_COPYRES_TUPLES)) == NULL) {
        hub_log(HUB_WARN, "claimed jobs could not be loaded: released",
                HUB_LS("error", "out of memory"), HUB_LI("jobs", rows));
        load_release(d, r, stamp.serial);
        free(l);
        free(by_id);
        free(row_day);
        return;
    }
    l->d = d;
    l->stamp = stamp;
    hub_pgarr_init(&subs, HUB_OID_TEXT);
    for (int i = 0; i < rows; i++) {
        if (i == 0 || strcmp(by_id[i].id, by_id[i - 1].id) != 0) {
            hub_pgarr_add_text(&subs, by_id[i].id);
        }
        row_day[i] = atoi(PQgetvalue(r, i, HUB_CLAIM_EVENT_DAY));
    }
    sub_ids = hub_pgarr_finish(&subs, &sub_len);
    ok = sub_ids != NULL && (txn = hub_pg_txn_new(d->pg_load, load_done, l)) != NULL &&
         hub_pg_txn_add_binary(txn, &hub_sql_dispatch_load_subscriptions, 1, &sub_ids, &sub_len,
                               formats) == 0;
    /* one statement per day, at the day's first row (a batch has one day,
     * two around midnight: the scan back stops at once) */
    for (int i = 0; ok && i < rows; i++) {
        int first = 1;
        for (int k = 0; k < i && first; k++) {
            first = row_day[k] != row_day[i];
        }
        if (first) {
            ok = load_add_day(txn, r, row_day, rows, row_day[i]) == 0;
            l->days++;
        }
    }
    hub_pgarr_free(&subs);
    free(by_id);
    free(row_day);
    if (txn == NULL) {
        load_release(d, l->claim, l->stamp.serial);
        PQclear(l->claim);
        free(l);
        return;
    }
    /* a statement that could not be added fails the transaction at submit
     * (or leaves it short of l->days results): load_done then releases the
     * jobs */
    d->loading += (size_t)rows;
    hub_pg_txn_submit(txn); /* load_done runs, whatever happens */
}

/* A claim or tenant sample failed (the database is away): try again soon. */
static void claim_failed(struct hub_dispatch *d, const char *msg, const char *error) {
    hub_log(HUB_WARN, msg, HUB_LS("error", error));
    if (!d->stopping) {
        uv_timer_start(&d->claim_timer, claim_timer_cb, 500, 0);
    }
    dispatch_maybe_done(d);
}

static int due_tenant_cmp(const void *key, const void *elem) {
    return strcmp(key, ((const struct due_tenant *)elem)->id);
}

/* Raises each tenant's floor to DISPATCH_FLOOR_MARGIN_US behind the oldest
 * unordered job this claim took from it (fifo heads come from their own
 * index and are not read from a floor). */
static void claim_floors(struct hub_dispatch *d, PGresult *r, int rows) {
    /* pass 0 resets the tenants' scratch, 1 finds their oldest job, 2 moves
     * their floors */
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < rows; i++) {
            struct due_tenant *t;
            int64_t at;
            if (PQgetvalue(r, i, HUB_CLAIM_FIFO)[0] == 't' || PQgetisnull(r, i, HUB_CLAIM_DUE_US)) {
                continue;
            }
            t = bsearch(PQgetvalue(r, i, HUB_CLAIM_TENANT), d->tenants, d->n_tenants,
                        sizeof(*d->tenants), due_tenant_cmp);
            if (t == NULL) {
                continue;
            }
            at = atoll(PQgetvalue(r, i, HUB_CLAIM_DUE_US));
            if (pass == 0) {
                t->oldest_us = INT64_MAX;
            } else if (pass == 1) {
                t->oldest_us = at < t->oldest_us ? at : t->oldest_us;
            } else if (t->oldest_us - DISPATCH_FLOOR_MARGIN_US > t->floor_us) {
                t->floor_us = t->oldest_us - DISPATCH_FLOOR_MARGIN_US;
            }
        }
    }
}

static void claim_done(void *arg, const struct hub_pg_outcome *out) {
    struct hub_dispatch *d = arg;
    PGresult *r = out->n_results > 0 ? out->results[0] : NULL;
    int rows = r ? PQntuples(r) : 0;
    /* one claim at a time: the one that just returned is the last sent */
    struct claim_stamp stamp = {unix_ms(), d->claim_serial};

    d->claiming = 0;
    if ((size_t)rows < d->claim_asked) {
        d->tenants_dirty = 1; /* some tenant ran dry (or one is missing) */
    }
    if (out->status != HUB_PG_OK) {
        claim_failed(d, "claim failed", out->error);
        return;
    }
    /* the next claim's rotation starts after the furthest tenant served now */
    {
        char cursor[260];
        const char *best = NULL;
        snprintf(cursor, sizeof(cursor), "%s", d->last_tenant);
        for (int i = 0; i < rows; i++) {
            const char *t = PQgetvalue(r, i, HUB_CLAIM_TENANT);
            int wrapped = strcmp(t, cursor) <= 0;
            int best_wrapped = best != NULL && strcmp(best, cursor) <= 0;
            if (best == NULL || wrapped > best_wrapped ||
                (wrapped == best_wrapped && strcmp(t, best) > 0)) {
                best = t;
            }
        }
        if ((size_t)rows < d->claim_asked && d->window_last[0] != '\0') {
            /* the batch did not fill: every tenant of the window had its
             * turn, the next claim offers the next window */
            best = d->window_last;
        }
        if (best != NULL) {
            snprintf(d->last_tenant, sizeof(d->last_tenant), "%s", best);
        }
    }
    claim_floors(d, r, rows);
    if (rows > 0 && !d->claim_full) { /* this claim did the lookups itself */
        claim_jobs(d, r, rows, stamp);
    } else if (rows > 0) {
        dispatch_load(d, r, rows, stamp);
    }
    /* a full batch means a backlog: the next claim leaves the lookups to
     * the load, so that claims follow each other sooner; a short one means
     * the dispatcher keeps up, and one round trip is the latency */
    d->claim_full = (size_t)rows >= d->claim_asked;
    dispatch_pump(d);
    /* rows (or a kick) mean more may be due: claim again at once */
    if (!d->stopping) {
        uv_timer_start(&d->claim_timer, claim_timer_cb,
                       rows > 0 || d->kicked ? 0 : DISPATCH_IDLE_MS, 0);
    }
    d->kicked = 0;
    dispatch_maybe_done(d);
}

static void tenants_free(struct hub_dispatch *d) {
    for (size_t i = 0; i < d->n_tenants; i++) {
        free(d->tenants[i].id);
    }
    free(d->tenants);
    d->tenants = NULL;
    d->n_tenants = 0;
}

static int tenant_cmp(const void *a, const void *b) {
    return strcmp(((const struct due_tenant *)a)->id, ((const struct due_tenant *)b)->id);
}

static void tenants_done(void *arg, const struct hub_pg_outcome *out) {
    struct hub_dispatch *d = arg;
    PGresult *r = out->n_results > 0 ? out->results[0] : NULL;
    int rows = r ? PQntuples(r) : 0;

    d->claiming = 0;
    if (out->status != HUB_PG_OK) {
        claim_failed(d, "tenant sample failed", out->error);
        return;
    }
    {
        struct due_tenant *old = d->tenants;
        size_t n_old = d->n_tenants;
        d->tenants = rows > 0 ? calloc((size_t)rows, sizeof(*d->tenants)) : NULL;
        d->n_tenants = 0;
        for (int i = 0; d->tenants != NULL && i < rows; i++) {
            char *t = strdup(PQgetvalue(r, i, HUB_DUE_TENANTS_ID));
            if (t != NULL) {
                d->tenants[d->n_tenants].fifo = PQgetvalue(r, i, HUB_DUE_TENANTS_FIFO)[0] == 't';
                d->tenants[d->n_tenants++].id = t;
            }
        }
        /* strcmp order, whatever the database's collation: claim_done moves
         * the rotation point by strcmp */
        if (d->n_tenants > 1) {
            qsort(d->tenants, d->n_tenants, sizeof(*d->tenants), tenant_cmp);
        }
        /* the floors outlive the sample (both lists are in strcmp order) */
        for (size_t i = 0, k = 0; i < d->n_tenants && k < n_old;) {
            int c = strcmp(d->tenants[i].id, old[k].id);
            if (c == 0) {
                d->tenants[i].floor_us = old[k].floor_us;
            }
            i += c <= 0;
            k += c >= 0;
        }
        for (size_t k = 0; k < n_old; k++) {
            free(old[k].id);
        }
        free(old);
    }
    d->tenants_ms = unix_ms();
    d->tenants_dirty = d->kicked; /* a kick during the sample may be a new tenant */
    d->kicked = 0;
    if (!d->stopping) {
        uv_timer_start(&d->claim_timer, claim_timer_cb, d->n_tenants > 0 ? 0 : DISPATCH_IDLE_MS, 0);
    }
    dispatch_maybe_done(d);
}

/* Samples the tenants with due jobs (hub_sql_dispatch_due_tenants); the
 * claim follows. */
static void dispatch_sample_tenants(struct hub_dispatch *d) {
    char limit[16];
    const char *params[1] = {limit};
    struct hub_pg_txn *txn = hub_pg_txn_new(d->pg_claim, tenants_done, d);

    if (txn == NULL) {
        return;
    }
    snprintf(limit, sizeof(limit), "%d", DISPATCH_TENANTS_MAX);
    hub_pg_txn_add(txn, &hub_sql_dispatch_due_tenants, 1, params, NULL, NULL);
    d->claiming = 1;
    hub_pg_txn_submit(txn);
}

/*
 * Keeps up to WORKERS + 2 × CLAIM_BATCH jobs in hand (one claim at a time),
 * claiming in batches of CLAIM_BATCH, and not less than half of one unless
 * workers are idle: the queue must outlast a claim's round trip.
 */
static void dispatch_claim(struct hub_dispatch *d) {
    size_t workers = (size_t)d->hub->cfg.dispatch_workers;
    size_t batch = (size_t)d->hub->cfg.dispatch_claim_batch;
    size_t held = d->inflight + d->n_queue + d->loading;
    size_t target = workers + 2 * batch;
    size_t free_slots = target > held ? target - held : 0;
    int64_t age = unix_ms() - d->tenants_ms;
    char lease[32], limit[16], per_tenant[16];
    char owner[sizeof(d->owner) + 24];
    const char *params[7] = {owner, lease, limit, per_tenant, NULL, NULL, NULL};
    int lengths[7] = {0, 0, 0, 0, 0, 0, 0};
    const int formats[7] = {0, 0, 0, 0, 1, 1, 1};
    struct hub_pgarr tenants, floors, fifo;
    int64_t now = unix_ms();
    size_t first = 0, window, share;
    int any_fifo = 0;
    struct hub_pg_txn *txn;
    /* the four forms of the claim, by [fifo arm][lookups] */
    static const struct hub_sql *const forms[2][2] = {
        {&hub_sql_dispatch_claim, &hub_sql_dispatch_claim_lookup},
        {&hub_sql_dispatch_claim_fifo, &hub_sql_dispatch_claim_fifo_lookup},
    };

    if (d->claiming || d->stopping || free_slots == 0 || d->hub->httpc == NULL) {
        return;
    }
    if (free_slots < (batch + 1) / 2 && held >= workers) {
        return; /* every worker has a job: wait for room for a real batch */
    }
    if (d->n_tenants == 0 || age >= DISPATCH_TENANTS_MS || age < 0 ||
        (d->tenants_dirty && age >= DISPATCH_TENANTS_MIN_MS)) {
        dispatch_sample_tenants(d);
        return;
    }
    if (batch > free_slots) {
        batch = free_slots;
    }
    /* rotation: start after the tenant served last */
    while (first < d->n_tenants && strcmp(d->tenants[first].id, d->last_tenant) <= 0) {
        first++;
    }
    if (now - d->floors_ms >= DISPATCH_FLOOR_RESET_MS || now < d->floors_ms) {
        for (size_t i = 0; i < d->n_tenants; i++) {
            d->tenants[i].floor_us = 0;
        }
        d->floors_ms = now;
    }
    /* a window of the rotation, not every sampled tenant: a claim costs
     * what its batch needs however many tenants have due jobs */
    window = d->n_tenants < DISPATCH_WINDOW_BATCHES * batch ? d->n_tenants
                                                            : DISPATCH_WINDOW_BATCHES * batch;
    hub_pgarr_init(&tenants, HUB_OID_TEXT);
    hub_pgarr_init(&floors, HUB_OID_TIMESTAMPTZ);
    hub_pgarr_init(&fifo, HUB_OID_BOOL);
    for (size_t i = 0; i < window; i++) {
        const struct due_tenant *t = &d->tenants[(first + i) % d->n_tenants];
        hub_pgarr_add_text(&tenants, t->id);
        hub_pgarr_add_bool(&fifo, t->fifo);
        any_fifo |= t->fifo;
        if (t->floor_us > 0) {
            hub_pgarr_add_ts(&floors, t->floor_us);
        } else {
            hub_pgarr_add_i64(&floors, INT64_MIN); /* binary timestamptz -infinity */
        }
    }
    params[4] = hub_pgarr_finish(&tenants, &lengths[4]);
    params[5] = hub_pgarr_finish(&floors, &lengths[5]);
    params[6] = hub_pgarr_finish(&fifo, &lengths[6]);
    snprintf(d->window_last, sizeof(d->window_last), "%s",
             window < d->n_tenants ? d->tenants[(first + window - 1) % d->n_tenants].id : "");
    /* each tenant offers up to twice its fair share, so that a batch still
     * fills when some have less, and at least two jobs: a tenant's turn
     * costs the claim about as much as a job (a share of one made the
     * 100-tenant claim 50% dearer per job than the one-tenant claim); a
     * lone tenant may fill the batch alone */
    share = (2 * batch + window - 1) / window;
    share = share < 2 ? 2 : share;
    share = share > batch ? batch : share;
    snprintf(lease, sizeof(lease), "%lld", (long long)d->hub->cfg.dispatch_lease_ms);
    snprintf(limit, sizeof(limit), "%zu", batch);
    snprintf(per_tenant, sizeof(per_tenant), "%zu", share);
    txn = params[4] != NULL && params[5] != NULL && params[6] != NULL
              ? hub_pg_txn_new(d->pg_claim, claim_done, d)
              : NULL;
    if (txn != NULL) {
        d->claim_serial++;
        snprintf(owner, sizeof(owner), "%s#%llu", d->owner, (unsigned long long)d->claim_serial);
        hub_pg_txn_add_binary(txn, forms[any_fifo][!d->claim_full], 7, params, lengths, formats);
        d->claiming = 1;
        d->claim_asked = batch;
        hub_pg_txn_submit(txn);
    }
    hub_pgarr_free(&tenants);
    hub_pgarr_free(&floors);
    hub_pgarr_free(&fifo);
}

static void claim_timer_cb(uv_timer_t *t) {
    dispatch_claim(t->data);
}

static void reclaim_done(void *arg, const struct hub_pg_outcome *out) {
    struct hub_dispatch *d = arg;
    PGresult *r = out->n_results > 0 ? out->results[0] : NULL;
    int rows = (out->status == HUB_PG_OK && r) ? PQntuples(r) : 0;

    d->aux_inflight--;
    for (int i = 0; i < rows; i++) {
        int dead = strcmp(PQgetvalue(r, i, HUB_RECLAIM_STATE), "dead") == 0;
        if (dead) {
            d->hub->metrics.deliveries[HUB_D_POISON]++;
        }
        hub_log(dead ? HUB_WARN : HUB_INFO,
                dead ? "job is poison: its lease expired too often" : "expired lease reclaimed",
                HUB_LS("job", PQgetvalue(r, i, HUB_RECLAIM_JOB_ID)));
    }
    dispatch_maybe_done(d);
}

static void reclaim_timer_cb(uv_timer_t *t) {
    struct hub_dispatch *d = t->data;
    char threshold[16];
    const char *params[1] = {threshold};
    struct hub_pg_txn *txn = hub_pg_txn_new(d->hub->pg, reclaim_done, d);

    if (txn == NULL) {
        return;
    }
    snprintf(threshold, sizeof(threshold), "%lld", (long long)d->hub->cfg.poison_threshold);
    hub_pg_txn_add(txn, &hub_sql_dispatch_reclaim, 1, params, NULL, NULL);
    d->aux_inflight++;
    hub_pg_txn_submit(txn);
}

static void sample_done(void *arg, const struct hub_pg_outcome *out) {
    struct hub_dispatch *d = arg;
    d->aux_inflight--;
    if (out->status == HUB_PG_OK && out->n_results > 0 && out->results[0] &&
        PQntuples(out->results[0]) == 1) {
        d->hub->metrics.jobs_due = atoll(PQgetvalue(out->results[0], 0, HUB_DUE_SAMPLE_COUNT));
    }
    dispatch_maybe_done(d);
}

static void sample_timer_cb(uv_timer_t *t) {
    struct hub_dispatch *d = t->data;
    struct hub_pg_txn *txn = hub_pg_txn_new(d->hub->pg, sample_done, d);
    if (txn != NULL) {
        hub_pg_txn_add(txn, &hub_sql_dispatch_due_sample, 0, NULL, NULL, NULL);
        d->aux_inflight++;
        hub_pg_txn_submit(txn);
    }
}

/* ------------------------------------------------------------ lifecycle -- */

int hub_dispatch_start(struct hub *hub, struct hub_dispatch **out) {
    struct hub_dispatch *d = calloc(1, sizeof(*d));
    struct hub_breaker_cfg bcfg = HUB_BREAKER_CFG_DEFAULT;
    const char *dsn = hub->cfg.postgres_dsn;
    char host[64] = "hub";
    unsigned char r[6];
    char rhex[13];
    uint64_t lease = (uint64_t)hub->cfg.dispatch_lease_ms;

    if (d == NULL) {
        return -1;
    }
    d->hub = hub;
    gethostname(host, sizeof(host) - 1);
    RAND_bytes(r, sizeof(r));
    hub_hex(r, sizeof(r), rhex);
    snprintf(d->owner, sizeof(d->owner), "%s/%d/%s", host, (int)getpid(), rhex);

    bcfg.consecutive_failures = (int)hub->cfg.breaker_consecutive_failures;
    bcfg.failure_ratio = hub->cfg.breaker_failure_ratio;
    bcfg.min_attempts = (int)hub->cfg.breaker_min_attempts;
    bcfg.window_ms = hub->cfg.breaker_window_ms;
    bcfg.open_ms = hub->cfg.breaker_open_ms;
    bcfg.open_max_ms = hub->cfg.breaker_open_max_ms;
    d->breakers = hub_breakers_new(&bcfg);
    /* Claims and outcome writes have connections of their own: a claim
     * never queues behind a batch of outcomes or an API request.  A claim's
     * commit need not wait for the disk: should the database lose it in a
     * crash, the job is simply pending again (at least once), and the
     * outcome of an attempt, committed synchronously, flushes the WAL up to
     * and past the claim it follows. */
    d->pg_claim = hub_pg_new(hub->loop, dsn, 1, "streaming-hub-claim",
                             HUB_DISPATCH_PG_OPTIONS " -c synchronous_commit=off");
    d->pg_load = hub_pg_new(hub->loop, dsn, 1, "streaming-hub-load", HUB_DISPATCH_PG_OPTIONS);
    d->pg_out = hub_pg_new(hub->loop, dsn, DISPATCH_OUT_CONNECTIONS, "streaming-hub-outcomes",
                           HUB_DISPATCH_PG_OPTIONS);
    if (d->breakers == NULL || d->pg_claim == NULL || d->pg_load == NULL || d->pg_out == NULL) {
        if (d->pg_claim != NULL) {
            hub_pg_close(d->pg_claim, NULL, NULL);
        }
        if (d->pg_load != NULL) {
            hub_pg_close(d->pg_load, NULL, NULL);
        }
        if (d->pg_out != NULL) {
            hub_pg_close(d->pg_out, NULL, NULL);
        }
        hub_breakers_free(d->breakers);
        free(d);
        return -1;
    }
    uv_timer_init(hub->loop, &d->claim_timer);
    uv_timer_init(hub->loop, &d->flush_timer);
    uv_timer_init(hub->loop, &d->reclaim_timer);
    uv_timer_init(hub->loop, &d->sample_timer);
    d->claim_timer.data = d->flush_timer.data = d->reclaim_timer.data = d->sample_timer.data = d;
    d->open_handles = 4;
    uv_timer_start(&d->claim_timer, claim_timer_cb, 0, 0);
    uv_timer_start(&d->reclaim_timer, reclaim_timer_cb, 1000, lease / 4 > 1000 ? lease / 4 : 1000);
    uv_timer_start(&d->sample_timer, sample_timer_cb, 1000, DISPATCH_DUE_SAMPLE_MS);
    if (hub->cfg.dispatch_lease_ms - hub->cfg.delivery_timeout_ms <= DISPATCH_OUTCOME_MARGIN_MS) {
        hub_log(HUB_WARN,
                "STREAMING_HUB_DISPATCH_LEASE is not 2s longer than "
                "STREAMING_HUB_DELIVERY_TIMEOUT: a slow attempt can outlive its lease, and "
                "its job is then reclaimed and attempted again meanwhile",
                HUB_LI("lease_ms", hub->cfg.dispatch_lease_ms),
                HUB_LI("timeout_ms", hub->cfg.delivery_timeout_ms));
    }
    hub_log(HUB_INFO, "dispatcher started", HUB_LS("owner", d->owner),
            HUB_LI("workers", hub->cfg.dispatch_workers),
            HUB_LI("claim_batch", hub->cfg.dispatch_claim_batch));
    *out = d;
    return 0;
}

static void dispatch_handle_closed(uv_handle_t *h) {
    struct hub_dispatch *d = h->data;
    if (--d->open_handles > 0) {
        return;
    }
    void (*cb)(void *) = d->done_cb;
    void *arg = d->done_arg;
    hub_breakers_free(d->breakers);
    hub_buckets_free(&d->rates);
    for (size_t i = 0; d->urls != NULL && i < URL_SLOTS; i++) {
        free(d->urls[i].text);
    }
    free(d->urls);
    for (size_t i = 0; i < d->n_outcomes; i++) {
        free(d->outcomes[i].excerpt);
    }
    tenants_free(d);
    free(d->queue);
    free(d->outcomes);
    free(d);
    if (cb) {
        cb(arg);
    }
}

/* Once stopping: no attempt in flight, no claim, every outcome written. */
static void dispatch_maybe_done(struct hub_dispatch *d) {
    if (!d->stopping || d->inflight > 0 || d->n_queue > 0 || d->claiming || d->loading > 0 ||
        d->flushing || d->aux_inflight > 0 || d->open_handles < 4) {
        return;
    }
    if (d->n_outcomes > 0) {
        dispatch_flush(d);
        return;
    }
    hub_pg_close(d->pg_claim, NULL, NULL);
    hub_pg_close(d->pg_load, NULL, NULL);
    hub_pg_close(d->pg_out, NULL, NULL);
    d->pg_claim = d->pg_load = d->pg_out = NULL;
    uv_close((uv_handle_t *)&d->claim_timer, dispatch_handle_closed);
    uv_close((uv_handle_t *)&d->flush_timer, dispatch_handle_closed);
    uv_close((uv_handle_t *)&d->reclaim_timer, dispatch_handle_closed);
    uv_close((uv_handle_t *)&d->sample_timer, dispatch_handle_closed);
}

void hub_dispatch_stop(struct hub_dispatch *d, void (*done_cb)(void *arg), void *arg) {
    d->stopping = 1;
    d->done_cb = done_cb;
    d->done_arg = arg;
    uv_timer_stop(&d->claim_timer);
    uv_timer_stop(&d->reclaim_timer);
    uv_timer_stop(&d->sample_timer);
    if (d->inflight > 0 || d->n_queue > 0) {
        hub_log(HUB_INFO, "dispatcher draining", HUB_LI("attempts_in_flight", (int64_t)d->inflight),
                HUB_LI("jobs_released", (int64_t)d->n_queue));
    }
    dispatch_pump(d); /* claimed but not started: back to the table, no reclaim counted */
    dispatch_maybe_done(d);
}

void hub_dispatch_kick(struct hub_dispatch *d) {
    if (d == NULL || d->stopping) {
        return;
    }
    d->tenants_dirty = 1; /* perhaps a tenant the sample has not seen */
    if (d->claiming) {
        d->kicked = 1;
        return;
    }
    uv_timer_start(&d->claim_timer, claim_timer_cb, 0, 0);
}

size_t hub_dispatch_inflight(const struct hub_dispatch *d) {
    return d ? d->inflight : 0;
}

size_t hub_dispatch_breakers_open(struct hub_dispatch *d) {
    return d ? hub_breakers_open_count(d->breakers, unix_ms()) : 0;
}

static void breaker_json_cb(void *arg, const char *tenant, const char *origin, const char *state,
                            int64_t opened_at_ms, int64_t retry_at_ms, int consecutive_failures) {
    json_t *o = json_object();
    json_object_set_new(o, "tenant_id", json_string(tenant));
    json_object_set_new(o, "origin", json_string(origin));
    json_object_set_new(o, "state", json_string(state));
    json_object_set_new(o, "opened_at_ms", json_integer(opened_at_ms));
    json_object_set_new(o, "retry_at_ms", json_integer(retry_at_ms));
    json_object_set_new(o, "consecutive_failures", json_integer(consecutive_failures));
    json_array_append_new(arg, o);
}

char *hub_dispatch_breakers_json(struct hub_dispatch *d) {
    json_t *arr = json_array();
    char *text;
    if (d != NULL) {
        hub_breakers_list(d->breakers, unix_ms(), breaker_json_cb, arr);
    }
    text = json_dumps(arr, JSON_COMPACT);
    json_decref(arr);
    return text;
}
