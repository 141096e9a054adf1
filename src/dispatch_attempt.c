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
 * HTTP request; the result of every path goes to dispatch_outcome.c
 * (attempt_settle, attempt_end).
 *
 * Policy calls run on the policy threads, never here (policy.h): a job
 * with a policy hands its match, shape and retry calls to
 * hub_policies_submit() and goes on in policy_call_done() when the answer
 * is back on the loop, in the step after the call (after_match,
 * after_shape, attempt_end).  While it waits it holds its lease and counts
 * in d->inflight like an attempt in flight.  A match likely to be followed
 * by an attempt carries its shape along (policy_submit: one hand-off, not
 * two); the gate then uses that answer or drops it.
 *
 * dispatch_retry_delay() decides when a failed attempt is tried again: a
 * policy's retry function (its answer, asked before the outcome was
 * queued) or table, the subscription's schedule, the default curve.
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
#include "cluster.h"
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
 * wait: jobs deferred together are spread a token apart
 * (hub_bucket_take_queued), so a backlog is deferred about once per job,
 * not rewritten whole at every token.  No later than the longest retry
 * step, since a rate far below one a day would wait longer than a
 * timestamp can say.  The rate is the subscription's for the deployment:
 * each process that delivers runs its bucket at its share, as the cluster
 * limits do (hub_cluster_take); a burst below one token is one.
 */
static int64_t rate_take(struct hub_dispatch *d, const char *sub_id, double rate) {
    double share = rate / (double)hub_cluster_dispatchers(d->hub);
    double wait =
        hub_bucket_take_queued(&d->rates, sub_id, share, share > 1 ? share : 1, hub_now_ns());
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
    ev->checked_schema_version = j->schema_version;
    ev->traceparent = json_string_value(json_object_get(attrs, "traceparent"));
    ev->tracestate = json_string_value(json_object_get(attrs, "tracestate"));
    hub_webhook_extensions(attrs, ext, ext_max);
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
                       const struct hub_policy_shaped *extra, struct hub_webhook_headers *h) {
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
    if (extra != NULL && extra->n_headers > 0) {
        const char *name, *value;
        size_t pos = 0;
        if (dest == NULL) {
            dest = json_object();
        }
        while (dest != NULL && (name = hub_policy_shaped_next(extra, &pos, &value)) != NULL) {
            if (!hub_webhook_header_reserved(name, strlen(name))) {
                json_object_set_new(dest, name, json_string(value));
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

/*
 * What an attempt keeps from its start to its end: the event as the
 * request builder and the policies see it, the destination, and, for a job
 * with a policy, the call on the policy threads and the result of a failed
 * attempt while its retry call runs.  A job without a policy has it on the
 * C stack (its attempt never waits before the POST); a job with one has it
 * allocated and pointed to by j->ap until the job is freed.  Allocated
 * contexts are kept for reuse (attempt_ctx_new): at 4 KiB each, a malloc
 * and a free per policy job walked the allocator's bins and consolidated
 * chunks on every call (docs/performance.md, stop 35).
 */
struct attempt_ctx {
    struct job *j;
    struct attempt_ctx *spare_next; /* on d->spare_ctx */
    int heap;                       /* allocated: a job with a policy */
    json_t *attrs;                  /* the stored attributes, NULL when they are not JSON */
    struct hub_webhook_event wev;
    const char *ext[2 * 64 + 1];
    struct hub_policy_event pev;
    struct hub_url u;
    int url_ok;
    char err[512]; /* a missing policy's message */
    struct hub_policy_call call;
    /* the policy's retry answer, once known (dispatch_retry_delay reads it) */
    int retry_known;
    enum hub_policy_status retry_status;
    enum hub_policy_retry_action retry_action;
    int64_t retry_delay_ms;
    char retry_err[512];
    /* the failed attempt's HTTP result, copied while the retry call runs */
    int has_res;
    struct hub_httpc_response res;
    char res_error_text[128];
    char res_retry_after[128];
    char *res_excerpt;
};

static void attempt_gate(struct hub_dispatch *d, struct attempt_ctx *a);
static void attempt_send(struct hub_dispatch *d, struct attempt_ctx *a,
                         const struct hub_policy_shaped *shaped);
static void attempt_settle(struct hub_dispatch *d, struct attempt_ctx *a,
                           const struct hub_httpc_response *res);

/* Starts the context of j on the C stack: the fields a job without a
 * policy reads (the rest stays unused). */
static void attempt_ctx_init(struct attempt_ctx *a, struct job *j) {
    a->j = j;
    a->heap = 0;
    a->attrs = NULL;
    a->has_res = 0;
    a->res_excerpt = NULL;
    a->call.shaped_ahead = 0;
    memset(&a->call.shaped, 0, sizeof(a->call.shaped));
}

/* Spare contexts kept: the policy jobs in hand at once are about the
 * workers and a claim or two, and a context is only allocated for them.
 * None under AddressSanitizer, so that it still sees a context used after
 * its job ended. */
#if defined(__SANITIZE_ADDRESS__)
#define ATTEMPT_CTX_SPARE 0
#else
#define ATTEMPT_CTX_SPARE 256
#endif

/* A shaped request's buffer kept with a spare context: the bodies of one
 * subscription's deliveries are about the same size, and larger ones are
 * rare enough to allocate each time. */
#define ATTEMPT_SHAPED_KEEP (64 << 10)

/* A zeroed context for a job with a policy, a spare one when there is
 * (with the buffer of its last shaped request). */
static struct attempt_ctx *attempt_ctx_new(struct hub_dispatch *d) {
    struct attempt_ctx *a = d->spare_ctx;
    struct hub_policy_shaped shaped;

    if (a == NULL) {
        return calloc(1, sizeof(*a));
    }
    d->spare_ctx = a->spare_next;
    d->n_spare_ctx--;
    shaped = a->call.shaped;
    memset(a, 0, sizeof(*a));
    a->call.shaped = shaped;
    return a;
}

/* Releases what a holds (and a itself when allocated: kept as a spare
 * while there is room); the job no longer points to it. */
static void attempt_ctx_free(struct attempt_ctx *a) {
    json_decref(a->attrs);
    free(a->res_excerpt);
    if (a->heap) {
        struct hub_dispatch *d = a->j->d;
        a->j->ap = NULL;
#if ATTEMPT_CTX_SPARE > 0
        if (d->n_spare_ctx < ATTEMPT_CTX_SPARE) {
            if (a->call.shaped.cap > ATTEMPT_SHAPED_KEEP) {
                hub_policy_shaped_free(&a->call.shaped);
            }
            hub_policy_shaped_reset(&a->call.shaped);
            a->spare_next = d->spare_ctx;
            d->spare_ctx = a;
            d->n_spare_ctx++;
            return;
        }
#endif
        (void)d;
        hub_policy_shaped_free(&a->call.shaped);
        free(a);
    }
}

/* Counts a policy call that did not return normally, and logs it (at most
 * DISPATCH_POLICY_LOG_PER_S lines a second: a broken policy on a busy
 * subscription must not flood the log; the metric counts every one).  The
 * calls of a tripped policy are counted only: its trip was logged once. */
static void policy_failed(struct hub_dispatch *d, const struct job *j, enum hub_policy_fn fn,
                          enum hub_policy_status st, const char *err,
                          const struct hub_policy_call *c) {
    int64_t now_s = dispatch_unix_ms() / 1000;

    hub_policies_count_error(d->hub->policies, j->policy, fn, st);
    if (st == HUB_POLICY_TRIPPED) {
        return;
    }
    if (now_s != d->policy_log_s) {
        d->policy_log_s = now_s;
        d->policy_log_n = 0;
    }
    if (d->policy_log_n++ < DISPATCH_POLICY_LOG_PER_S) {
        /* how long the call ran on its thread, and waited for one */
        int64_t run_us =
            c != NULL && c->ended_ns ? (int64_t)(c->ended_ns - c->started_ns) / 1000 : 0;
        int64_t wait_us =
            c != NULL && c->started_ns ? (int64_t)(c->started_ns - c->queued_ns) / 1000 : 0;
        hub_log(HUB_WARN, "policy call failed", HUB_LS("policy", j->policy),
                HUB_LS("function", hub_policy_fn_str(fn)),
                HUB_LS("kind", hub_policy_status_str(st)), HUB_LS("error", err),
                HUB_LS("subscription", j->sub_id), HUB_LI("job", j->id), HUB_LI("run_us", run_us),
                HUB_LI("cpu_us", c != NULL ? c->cpu_ns / 1000 : 0), HUB_LI("wait_us", wait_us));
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
 * the job (and a). */
static void job_policy_error(struct hub_dispatch *d, struct attempt_ctx *a, const char *err) {
    struct job *j = a->j;
    j->local_error = "policy_error";
    /* a Lua message may hold any bytes (error(ev.body)), or be cut inside
     * a character: keep what the attempts table can store */
    j->local_excerpt = strndup(err, hub_utf8_prefix(err, strnlen(err, DISPATCH_EXCERPT)));
    attempt_settle(d, a, NULL);
}

/* A job rescheduled to `until` (Unix ms) without an attempt; `why` is
 * HUB_D_SHED or HUB_D_DEFERRED.  Takes the job (and a). */
static void job_postpone(struct hub_dispatch *d, struct attempt_ctx *a,
                         enum hub_delivery_outcome why, int64_t until) {
    struct job *j = a->j;
    int64_t now = dispatch_unix_ms();
    attempt_ctx_free(a);
    d->hub->metrics.deliveries[why]++;
    hub_stats_delayed(d->hub->stats, j->tenant, j->attrs, j->event_type); /* stats.h */
    dispatch_job_unattempted(d, j, "pending", until - now > 0 ? until - now : 1);
}

/* ------------------------------------------------------ policy calls -- */

static void policy_call_done(struct hub_policy_call *c);

/*
 * Hands fn of the job's policy to the policy threads.  Returns 1 when the
 * call is queued: the job waits for policy_call_done(), holding its lease
 * and counted in d->inflight as an attempt in flight (so the workers bound
 * the calls waiting too, and a drain waits for them).  Returns 0 when it
 * was answered at once (the function is absent, or the policy is tripped):
 * a->call holds the answer and the caller goes on.
 */
static int policy_submit(struct hub_dispatch *d, struct attempt_ctx *a, enum hub_policy_fn fn) {
    struct hub_policy_call *c = &a->call;
    const struct job *j = a->j;

    c->policy = j->pol;
    c->fn = fn;
    /* a match whose job will most likely be attempted (no rate to take, its
     * breaker not shedding) asks for the shape in the same visit: one
     * hand-off instead of two.  Should the gate then defer or shed the job
     * after all, the shaped request is dropped unsent (attempt_ctx_free). */
    c->shape_ahead = fn == HUB_POLICY_MATCH && j->max_rate <= 0 &&
                     hub_policy_has(j->pol, HUB_POLICY_SHAPE) &&
                     !hub_breaker_sheds(d->breakers, j->tenant, j->origin, dispatch_unix_ms());
    c->key = a->j->sub_id; /* within its tenant (c->ev.tenant), subscriptions take turns */
    c->ev = a->pev;
    c->cb = policy_call_done;
    c->arg = a;
    if (hub_policies_submit(d->hub->policies, c) != 0) {
        return 0;
    }
    d->inflight++;
    return 1;
}

/* Keeps the retry function's answer for dispatch_retry_delay(). */
static void retry_answer(struct attempt_ctx *a) {
    a->retry_known = 1;
    a->retry_status = a->call.status;
    a->retry_action = a->call.action;
    a->retry_delay_ms = a->call.delay_ms;
    snprintf(a->retry_err, sizeof(a->retry_err), "%s", a->call.err);
}

/* match answered: filter the job, or go on to the gate.  A failed match is
 * a match (SPEC §8: never lose an event). */
static void after_match(struct hub_dispatch *d, struct attempt_ctx *a) {
    struct hub_policy_call *c = &a->call;

    if (c->status != HUB_POLICY_OK) {
        policy_failed(d, a->j, HUB_POLICY_MATCH, c->status, c->err, c);
    } else if (!c->matched) {
        struct job *j = a->j;
        attempt_ctx_free(a);
        job_filtered(d, j);
        return;
    }
    attempt_gate(d, a);
}

/* shape answered: a failed shape fails the attempt with policy_error (the
 * policy may exist to keep the payload from the destination: never send it
 * unshaped); otherwise the request goes with what it made. */
static void after_shape(struct hub_dispatch *d, struct attempt_ctx *a) {
    struct hub_policy_call *c = &a->call;
    struct job *j = a->j;

    if (c->status != HUB_POLICY_OK) {
        policy_failed(d, j, HUB_POLICY_SHAPE, c->status, c->err, c);
        job_policy_error(d, a, c->err);
        return;
    }
    if (c->shaped.content_type != NULL) {
        a->wev.content_type = c->shaped.content_type;
    }
    if (c->shaped.body != NULL) {
        /* the signature covers the shaped body (SPEC §7.2); it stays in
         * the context, which outlives the request */
        j->payload = (const unsigned char *)c->shaped.body;
        j->payload_len = c->shaped.body_len;
    }
    attempt_send(d, a, &c->shaped);
}

/* The outcome of an attempt whose retry answer (or the absence of one) is
 * known: queued, and the job freed. */
static void attempt_end(struct hub_dispatch *d, struct attempt_ctx *a,
                        const struct hub_httpc_response *res) {
    struct job *j = a->j;
    dispatch_job_outcome(d, j, res);
    attempt_ctx_free(a);
    dispatch_job_free(j);
}

/* A call the policy threads answered (loop thread): the job goes on from
 * where it waited.  A worker may be free again, or the drain over. */
static void policy_call_done(struct hub_policy_call *c) {
    struct attempt_ctx *a = c->arg;
    struct hub_dispatch *d = a->j->d;

    d->inflight--;
    switch (c->fn) {
    case HUB_POLICY_MATCH:
        after_match(d, a);
        break;
    case HUB_POLICY_SHAPE:
        after_shape(d, a);
        break;
    default:
        retry_answer(a);
        attempt_end(d, a, a->has_res ? &a->res : NULL);
        break;
    }
    dispatch_pump(d);
    dispatch_maybe_done(d);
}

/*
 * Ends an attempt that went no further, or whose HTTP request is over (res
 * borrowed for the call; NULL when it failed before any HTTP).  A failed
 * attempt of a job whose policy has a retry function asks it first, on the
 * policy threads, with res copied meanwhile: the outcome needs its answer.
 */
static void attempt_settle(struct hub_dispatch *d, struct attempt_ctx *a,
                           const struct hub_httpc_response *res) {
    struct job *j = a->j;
    int success =
        res != NULL && res->error == HUB_HTTPC_OK && res->status >= 200 && res->status < 300;
    const int64_t *table = NULL;

    if (success || j->pol == NULL || !hub_policy_has(j->pol, HUB_POLICY_RETRY) ||
        hub_policy_retry_schedule(j->pol, &table) > 0) {
        attempt_end(d, a, res);
        return;
    }
    a->call.retry = (struct hub_policy_retry_ctx){
        .attempt = j->attempt_count + 1,
        .status = res != NULL ? (int)res->status : 0,
        .error = res != NULL && res->error != HUB_HTTPC_OK ? hub_httpc_error_str(res->error)
                 : res != NULL                             ? "status"
                                                           : j->local_error,
    };
    if (res != NULL) {
        a->has_res = 1;
        a->res = *res;
        snprintf(a->res_error_text, sizeof(a->res_error_text), "%s",
                 res->error_text ? res->error_text : "");
        a->res.error_text = res->error_text ? a->res_error_text : NULL;
        snprintf(a->res_retry_after, sizeof(a->res_retry_after), "%s",
                 res->retry_after ? res->retry_after : "");
        a->res.retry_after = res->retry_after ? a->res_retry_after : NULL;
        a->res_excerpt = res->excerpt_len > 0 ? strndup(res->excerpt, res->excerpt_len) : NULL;
        a->res.excerpt = a->res_excerpt;
        a->res.excerpt_len = a->res_excerpt != NULL ? res->excerpt_len : 0;
        res = &a->res;
    }
    if (policy_submit(d, a, HUB_POLICY_RETRY)) {
        return;
    }
    retry_answer(a); /* tripped: answered at once */
    attempt_end(d, a, res);
}

/* ---------------------------------------------------------- the steps -- */

/* httpc's callback: the attempt's HTTP request ended (res borrowed for the
 * call).  Reports it to the breaker, settles it (the outcome is queued and
 * the job freed, perhaps after its policy's retry call) and hands its
 * worker to the next queued job. */
static void attempt_done(void *arg, const struct hub_httpc_response *res) {
    struct job *j = arg;
    struct attempt_ctx local, *a = j->ap;
    struct hub_dispatch *d = j->d;
    int success = res->error == HUB_HTTPC_OK && res->status >= 200 && res->status < 300;

    if (a == NULL) {
        /* a job without a policy: its context lived on the C stack of the
         * start; what settling needs is the job alone */
        a = &local;
        attempt_ctx_init(a, j);
    }
    if (res->error == HUB_HTTPC_ABORTED) {
        /* a drain whose time is nearly up stopped waiting for the answer
         * (hub.c): no attempt, as a clean stop gives its leases back; the
         * job is attempted again (at least once), with no reclaim counted */
        if (j->breaker_probe) {
            hub_breaker_release(d->breakers, j->tenant, j->origin, dispatch_unix_ms());
        }
        d->inflight--;
        attempt_ctx_free(a);
        dispatch_job_unattempted(d, j, "pending", 0);
        dispatch_pump(d);
        dispatch_maybe_done(d);
        return;
    }
    dispatch_breaker_report(d, j, success);
    dispatch_slot_report(d, j, res); /* the destination's adaptive limit (dispatch_caps.h) */
    if (hub_log_enabled(HUB_DEBUG)) {
        hub_log(HUB_DEBUG, "delivery attempt", HUB_LS("tenant", j->tenant),
                HUB_LS("subscription", j->sub_id), HUB_LI("job", j->id),
                HUB_LS("delivery_id", j->delivery_id), HUB_LI("status", res->status),
                HUB_LS("error", success ? NULL : res->error_text));
    }
    d->inflight--;
    attempt_settle(d, a, res);
    dispatch_pump(d);
    dispatch_maybe_done(d);
}

/*
 * The signed POST of the attempt, with what shape made (NULL: no shape;
 * its body already in j->payload, borrowed from a).  The attempt
 * then lives in httpc until attempt_done(); a request httpc refuses at once
 * is a failed attempt like any other.
 */
static void attempt_send(struct hub_dispatch *d, struct attempt_ctx *a,
                         const struct hub_policy_shaped *shaped) {
    struct hub_webhook_headers h = {0};
    struct hub_httpc_request req;
    struct job *j = a->j;
    int rc;

    if (dispatch_stale_here(d, j)) {
        /* its subscription was disabled here after its lease was taken
         * (dispatch_int.h): given back unattempted, the outcome statement
         * parks it; a probe slot goes back to its breaker */
        if (j->breaker_probe) {
            hub_breaker_release(d->breakers, j->tenant, j->origin, dispatch_unix_ms());
        }
        attempt_ctx_free(a);
        dispatch_job_unattempted(d, j, "pending", 0);
        return;
    }
    rc = job_headers(j, &d->hub->kek, &a->wev, j->payload, j->payload_len, shaped, &h);
    /* the headers hold what they need of the attributes (and a job without
     * a policy leaves its context on this C stack once the POST is started) */
    json_decref(a->attrs);
    a->attrs = NULL;
    if (rc != 0) {
        hub_log(HUB_ERROR, "cannot open the subscription's secrets (wrong STREAMING_HUB_KEK?)",
                HUB_LS("subscription", j->sub_id), HUB_LI("job", j->id));
        attempt_settle(d, a, NULL);
        return;
    }
    req = (struct hub_httpc_request){
        .url = j->url,
        .parsed = a->url_ok ? &a->u : NULL,
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
        attempt_settle(d, a, &res);
    }
    /* httpc copied what it needs: the signed header lines go at once */
    hub_webhook_headers_free(&h);
}

/*
 * After match: the rate limit, the breaker, then the attempt proper (a
 * delivery id; a missing policy fails it; its policy's shape), or the job
 * is deferred or shed without one.
 */
static void attempt_gate(struct hub_dispatch *d, struct attempt_ctx *a) {
    struct job *j = a->j;
    int64_t retry_at = 0;

    if (j->max_rate > 0) {
        int64_t wait = rate_take(d, j->sub_id, j->max_rate);
        if (wait > 0) {
            /* over the rate: deferred, neither attempted nor a failure */
            job_postpone(d, a, HUB_D_DEFERRED, dispatch_unix_ms() + wait);
            return;
        }
    }
    /* open: shed, due again at retry_at without an attempt; half-open: this
     * attempt is the one probe, reported (or released) when it ends */
    switch (hub_breaker_check(d->breakers, j->tenant, j->origin, dispatch_unix_ms(), &retry_at)) {
    case HUB_BREAKER_SHED:
        job_postpone(d, a, HUB_D_SHED, retry_at);
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
        job_policy_error(d, a, a->err);
        return;
    }
    if (a->call.shaped_ahead) {
        /* shape ran with the match (policy_submit) */
        a->call.status = a->call.shape_status;
        after_shape(d, a);
        return;
    }
    if (j->pol != NULL && hub_policy_has(j->pol, HUB_POLICY_SHAPE)) {
        if (!policy_submit(d, a, HUB_POLICY_SHAPE)) {
            after_shape(d, a); /* tripped: answered at once */
        }
        return;
    }
    attempt_send(d, a, NULL);
}

/*
 * The attempt for one claimed job: its policy's match (first attempt only),
 * the rate limit, the breaker, its policy's shape, then the signed POST,
 * which attempt_done() ends.  Or it filters, defers, sheds or fails the job
 * without one.  A job without a policy gets that far before this returns;
 * a job with one waits for its calls on the policy threads in between (the
 * loop never runs Lua), and the steps go on in policy_call_done().
 */
void dispatch_attempt_start(struct hub_dispatch *d, struct job *j) {
    struct attempt_ctx local, *a = &local;
    json_error_t jerr;

    if (dispatch_stale_here(d, j)) {
        /* its subscription changed or was disabled since it was read: not
         * even its old policy or rate sees it (dispatch_int.h) */
        dispatch_job_unattempted(d, j, "pending", 0);
        return;
    }
    if (j->policy != NULL) {
        if ((a = attempt_ctx_new(d)) == NULL) {
            /* given back unattempted: the next claim tries again */
            dispatch_job_unattempted(d, j, "pending", 1000);
            return;
        }
        a->heap = 1;
        j->ap = a;
    } else {
        attempt_ctx_init(a, j);
    }
    a->j = j;
    /* breakers are per tenant and origin; a URL that does not parse is an
     * origin of its own (and httpc refuses the request, see attempt_send) */
    if ((a->url_ok = url_parse_cached(d, j->url, &a->u) == 0)) {
        snprintf(j->origin, sizeof(j->origin), "%s", a->u.origin);
    } else {
        snprintf(j->origin, sizeof(j->origin), "%s", j->url);
    }
    /* attrs is NULL when the stored attributes are not JSON: every
     * attribute then reads as absent */
    a->attrs = json_loads(j->attrs ? j->attrs : "{}", 0, &jerr);
    event_from_attrs(j, a->attrs, &a->wev, a->ext, sizeof(a->ext) / sizeof(a->ext[0]));
    if (j->policy == NULL) {
        attempt_gate(d, a);
        return;
    }
    policy_event(j, &a->wev, &a->pev);
    /* held until dispatch_job_free(): a reload meanwhile does not change
     * the policy under this job */
    j->gen = hub_policies_acquire(d->hub->policies);
    j->pol = hub_policy_gen_find(j->gen, j->policy);
    if (j->pol == NULL) {
        snprintf(a->err, sizeof(a->err), "policy '%s' is not loaded", j->policy);
        policy_failed(d, j, HUB_POLICY_SHAPE, HUB_POLICY_MISSING, a->err, NULL);
    }
    if (j->pol != NULL && j->attempt_count == 0 && hub_policy_has(j->pol, HUB_POLICY_MATCH)) {
        if (!policy_submit(d, a, HUB_POLICY_MATCH)) {
            after_match(d, a); /* tripped: answered at once */
        }
        return;
    }
    attempt_gate(d, a);
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
    } else if (j->ap != NULL && j->ap->retry_known) {
        /* the retry function ran on the policy threads before the outcome
         * was queued (attempt_settle): its answer */
        const struct attempt_ctx *a = j->ap;
        if (a->retry_status != HUB_POLICY_OK) {
            /* SPEC §8: a failing retry function means the default curve */
            policy_failed(d, j, HUB_POLICY_RETRY, a->retry_status, a->retry_err, &a->call);
            sched = cfg->retry_schedule_ms;
            nsched = cfg->retry_schedule_len;
        } else if (a->retry_action == HUB_POLICY_RETRY_DEAD) {
            *reason = "policy";
            return -1;
        } else if (a->retry_action == HUB_POLICY_RETRY_DELAY) {
            delay = a->retry_delay_ms;
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
    while (d->spare_ctx != NULL) {
        struct attempt_ctx *a = d->spare_ctx;
        d->spare_ctx = a->spare_next;
        hub_policy_shaped_free(&a->call.shaped);
        free(a);
    }
    d->n_spare_ctx = 0;
    hub_buckets_free(&d->rates);
    for (size_t i = 0; d->urls != NULL && i < URL_SLOTS; i++) {
        free(d->urls[i].text);
    }
    free(d->urls);
    d->urls = NULL;
}
