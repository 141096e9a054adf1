/*
 * dispatch_attempt — one attempt of one claimed job (see dispatch_int.h for
 * the parts and who owns a job when).
 *
 * dispatch_attempt_start() walks a job through, in this order: its policy's
 * match (first attempt only: a job turned down is filtered), the
 * subscription's max_rate (over it: deferred), the breaker of its tenant
 * and origin (open: shed), its policy's shape, the request of SPEC §7.2
 * (webhook.h: secrets opened, headers built and signed over the body as
 * sent) and the POST through httpc.  Each step may end the job without an
 * HTTP request; the result of every path goes to dispatch_outcome.c.
 *
 * dispatch_retry_delay() decides when a failed attempt is tried again: a
 * policy's retry function or table, the subscription's schedule, the
 * default curve.
 */
#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "breaker.h"
#include "bucket.h"
#include "dispatch_int.h"
#include "hub.h"
#include "log.h"
#include "netguard.h"
#include "policy.h"
#include "sign.h"
#include "stats.h"
#include "webhook.h"

#define DISPATCH_EXCERPT 1024 /* a policy error's message, as an excerpt */
/* A retry function may keep a job going past its schedule, up to the
 * longest schedule the API accepts. */
#define DISPATCH_POLICY_MAX_ATTEMPTS (1 + HUB_RETRY_MAX_STEPS)
#define DISPATCH_POLICY_LOG_PER_S 10 /* policy failure log lines (all are counted) */

/* A destination URL as hub_url_parse() saw it (url_parse_cached). */
#define URL_SLOTS 128

struct url_slot {
    char *text; /* owned; NULL = free */
    int ok;     /* hub_url_parse() accepted it */
    struct hub_url u;
    long path_at; /* u.path is text + path_at, or static when -1 */
};

/* 64 random bits for the retry jitter; rand() when the CSPRNG fails. */
static uint64_t rand64(void) {
    uint64_t r = 0;
    if (RAND_bytes((unsigned char *)&r, sizeof(r)) != 1) {
        r = ((uint64_t)rand() << 32) ^ (uint64_t)rand();
    }
    return r;
}

/*
 * hub_url_parse() of a destination, remembered by its text: a URL is parsed
 * once, not for each attempt (libcurl's URL API and its copies were a
 * measurable share of the dispatcher's CPU; docs/performance.md, "Notes
 * moved out of the dispatcher's code").  The result depends on the text
 * alone.  Returns 0 or -1 as hub_url_parse() does; on return out->path
 * points into url, as if url had been parsed.
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

/* The attributes the request header builder takes, from the stored event's
 * attribute object (borrowed from attrs until it is released).  The
 * extension attributes go to ext as name, value, ..., NULL (at most ext_max
 * entries with the NULL); standard attributes are not extensions. */
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

/* The event as policies see it, from the header builder's view of it
 * (borrowed from j and wev); serial numbers it among this dispatcher's
 * policy events. */
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
 * Builds the request headers of SPEC §7.2 with the builder the verification
 * probe uses (webhook.h), over body[0..len) as it will be sent.  extra is
 * what a shape policy added (reserved names are dropped: policy headers can
 * never replace the hub's own).  Returns 0, or -1 when the secrets cannot be
 * opened (wrong KEK): the attempt then fails.
 */
static int job_headers(const struct job *j, const struct hub_keyring *kek,
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
        .unix_s = dispatch_unix_ms() / 1000,
        .dest_headers = dest,
    };
    rc = hub_webhook_build_headers(ev, &t, body, len, h);
    /* plaintext secrets live for this one request only (webhook.h) */
    OPENSSL_cleanse(keys, sizeof(keys));
    hub_webhook_headers_wipe(dest);
    return rc;
}

/* Counts a policy call that did not return normally, and logs it (at most
 * DISPATCH_POLICY_LOG_PER_S lines a second: a broken policy on a busy
 * subscription must not flood the log; the metric counts every one). */
static void policy_failed(struct hub_dispatch *d, const struct job *j, enum hub_policy_fn fn,
                          enum hub_policy_status st, const char *err) {
    int64_t now_s = dispatch_unix_ms() / 1000;

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

/* A job whose policy's match turned it down: deleted, never attempted.
 * Takes j. */
static void job_filtered(struct hub_dispatch *d, struct job *j) {
    d->hub->metrics.policy_filtered++;
    dispatch_job_unattempted(d, j, "filtered", 0);
}

/* Fails the attempt before any HTTP (SPEC §8: error policy_error, retried
 * as any failure); the message goes where a response excerpt would.  Takes
 * j. */
static void job_policy_error(struct hub_dispatch *d, struct job *j, const char *err) {
    j->local_error = "policy_error";
    /* a Lua message may hold any bytes (error(ev.body)), or be cut inside
     * a character: keep what the attempts table can store */
    j->local_excerpt = strndup(err, hub_utf8_prefix(err, strnlen(err, DISPATCH_EXCERPT)));
    dispatch_job_outcome(d, j, NULL);
    dispatch_job_free(j);
}

/* A job rescheduled to `until` (Unix ms) without an attempt; `why` is
 * HUB_D_SHED or HUB_D_DEFERRED.  Takes j. */
static void job_postpone(struct hub_dispatch *d, struct job *j, enum hub_delivery_outcome why,
                         int64_t until) {
    int64_t now = dispatch_unix_ms();
    d->hub->metrics.deliveries[why]++;
    hub_stats_delayed(d->hub->stats, j->tenant, j->attrs, j->event_type); /* stats.h */
    dispatch_job_unattempted(d, j, "pending", until - now > 0 ? until - now : 1);
}

/* httpc's callback: the attempt's HTTP request ended (res borrowed for the
 * call).  Reports it to the breaker, queues its outcome, frees the job and
 * hands its worker to the next queued job. */
static void attempt_done(void *arg, const struct hub_httpc_response *res) {
    struct job *j = arg;
    struct hub_dispatch *d = j->d;
    int success = res->error == HUB_HTTPC_OK && res->status >= 200 && res->status < 300;

    dispatch_breaker_report(d, j, success);
    dispatch_job_outcome(d, j, res);
    if (hub_log_enabled(HUB_DEBUG)) {
        hub_log(HUB_DEBUG, "delivery attempt", HUB_LS("tenant", j->tenant),
                HUB_LS("subscription", j->sub_id), HUB_LI("job", j->id),
                HUB_LS("delivery_id", j->delivery_id), HUB_LI("status", res->status),
                HUB_LS("error", success ? NULL : res->error_text));
    }
    d->inflight--;
    dispatch_job_free(j);
    dispatch_pump(d);
    dispatch_maybe_done(d);
}

/*
 * The attempt for one claimed job: its policy's match (first attempt only),
 * the rate limit, the breaker, its policy's shape, then the signed POST,
 * which attempt_done() ends.  Or it filters, defers, sheds or fails the job
 * without one, and the job is freed before this returns.
 */
void dispatch_attempt_start(struct hub_dispatch *d, struct job *j) {
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

    /* breakers are per tenant and origin; a URL that does not parse is an
     * origin of its own (and httpc refuses the request, see below) */
    if ((url_ok = url_parse_cached(d, j->url, &u) == 0)) {
        snprintf(j->origin, sizeof(j->origin), "%s", u.origin);
    } else {
        snprintf(j->origin, sizeof(j->origin), "%s", j->url);
    }
    /* attrs is NULL when the stored attributes are not JSON: every
     * attribute then reads as absent */
    attrs = json_loads(j->attrs ? j->attrs : "{}", 0, &jerr);
    event_from_attrs(j, attrs, &wev, ext, sizeof(ext) / sizeof(ext[0]));
    policy_event(j, &wev, &pev);
    if (j->policy != NULL) {
        /* held until dispatch_job_free(): a reload meanwhile does not
         * change the policy under this job */
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
            job_postpone(d, j, HUB_D_DEFERRED, dispatch_unix_ms() + wait);
            return;
        }
    }
    /* open: shed, due again at retry_at without an attempt; half-open: this
     * attempt is the one probe, reported (or released) when it ends */
    switch (hub_breaker_check(d->breakers, j->tenant, j->origin, dispatch_unix_ms(), &retry_at)) {
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
    /* from here on it is an attempt (SPEC §7.2: a new delivery id each),
     * counted as one by its outcome even when it fails before any HTTP */
    if (hub_uuid7_text(j->delivery_id) != 0) {
        snprintf(j->delivery_id, sizeof(j->delivery_id), "00000000-0000-7000-8000-000000000000");
    }
    j->started_unix_ms = dispatch_unix_ms();
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
        dispatch_job_outcome(d, j, NULL);
        dispatch_job_free(j);
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
        /* refused at once (a URL that does not parse, out of memory): a
         * failed attempt like any other (retried), and a probe gives its
         * breaker slot back */
        struct hub_httpc_response res = {.error = HUB_HTTPC_PROTOCOL,
                                         .error_text = "request refused"};
        d->inflight--;
        if (j->breaker_probe) {
            hub_breaker_release(d->breakers, j->tenant, j->origin, dispatch_unix_ms());
        }
        dispatch_job_outcome(d, j, &res);
        dispatch_job_free(j);
    }
    /* httpc copied what it needs: the signed header lines go at once */
    hub_webhook_headers_free(&h);
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
 * The delay before the next attempt of a failed one (contract in
 * dispatch_int.h).  A policy's retry table replaces the schedule; its retry
 * function decides alone, up to DISPATCH_POLICY_MAX_ATTEMPTS attempts.
 */
int64_t dispatch_retry_delay(struct hub_dispatch *d, const struct job *j,
                             const struct hub_httpc_response *res, const char **reason) {
    struct hub_config *cfg = &d->hub->cfg;
    const int64_t *sched = j->n_schedule ? j->schedule : cfg->retry_schedule_ms;
    size_t nsched = j->n_schedule ? j->n_schedule : cfg->retry_schedule_len;
    int failed = j->attempt_count + 1; /* the number of the attempt that failed */
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

/* Once stopped (dispatch.c): the caches live as long as the dispatcher. */
void dispatch_attempt_free(struct hub_dispatch *d) {
    hub_buckets_free(&d->rates);
    for (size_t i = 0; d->urls != NULL && i < URL_SLOTS; i++) {
        free(d->urls[i].text);
    }
    free(d->urls);
    d->urls = NULL;
}
