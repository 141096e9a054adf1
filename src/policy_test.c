/*
 * policy_test — one event through a policy's three functions, as a result
 * object, and the `policy-test` command (see policy_test.h).
 *
 * What it runs is what delivery runs: the synchronous entry points of
 * policy.h on a state of the compiled version, under its deadline and
 * memory cap.  Two things differ, on purpose:
 *   - shape runs whatever match answered, so the operator sees what would
 *     be sent for an event the policy turns down too;
 *   - retry is always asked (about the attempt and status given), and the
 *     schedule step is reported as its upper bound: delivery draws the delay
 *     uniformly in 1..step (backoff.h), which a test cannot show as one number.
 *
 * The command reads its limits from the environment like check-policies,
 * so a file that passes here passes a reload of the hub next to it.
 */
#include "policy_test.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backoff.h"
#include "config.h"
#include "envelope.h"
#include "util.h"

/* A shaped body longer than this is cut in the command's text output (the
 * JSON output always carries all of it). */
#define TEST_PRINT_BODY_MAX 4096
#define TEST_EXT_MAX 64 /* extension attributes handed to a policy */

/* The calling thread's CPU clock, in microseconds. */
static int64_t thread_cpu_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Records the first error of the three calls. */
static void note_error(struct hub_policy_try *t, enum hub_policy_fn fn, const char *err) {
    if (t->err_fn < 0) {
        t->err_fn = (int)fn;
        snprintf(t->err, sizeof(t->err), "%s", err);
    }
}

/* The step the schedule gives for the failed attempt: the policy's table
 * when it has one, else the default curve.  -1 when the attempts are
 * exhausted (the job would be dead). */
static int64_t schedule_step(struct hub_policy *p, int attempt, int *from_policy) {
    const int64_t *steps;
    size_t n = hub_policy_retry_schedule(p, &steps);

    *from_policy = n > 0;
    if (n == 0) {
        steps = hub_backoff_default(&n);
    }
    /* UINT64_MAX draws the full step: the upper bound of the jitter */
    return hub_backoff_delay_ms(steps, n, attempt, UINT64_MAX);
}

void hub_policy_try_run(struct hub_policy *p, const struct hub_policy_event *ev,
                        const struct hub_policy_retry_ctx *rctx, struct hub_policy_try *out) {
    char err[512];
    /* the thread's CPU clock, not the wall: on a policy thread shared with
     * deliveries, waiting for the core is not the policy's cost */
    int64_t cpu0 = thread_cpu_us();

    memset(out, 0, sizeof(*out));
    out->err_fn = -1;
    out->ran[HUB_POLICY_MATCH] = hub_policy_has(p, HUB_POLICY_MATCH);
    out->ran[HUB_POLICY_SHAPE] = hub_policy_has(p, HUB_POLICY_SHAPE);
    out->ran[HUB_POLICY_RETRY] = hub_policy_has(p, HUB_POLICY_RETRY) &&
                                 hub_policy_retry_schedule(p, &(const int64_t *){0}) == 0;

    err[0] = '\0';
    out->st[HUB_POLICY_MATCH] = hub_policy_match(p, ev, &out->matched, err, sizeof(err));
    if (out->st[HUB_POLICY_MATCH] != HUB_POLICY_OK) {
        note_error(out, HUB_POLICY_MATCH, err);
    }
    /* shape runs whatever match said: the workbench shows what it would
     * send, and a match error is a match anyway (SPEC §8) */
    err[0] = '\0';
    out->st[HUB_POLICY_SHAPE] = hub_policy_shape(p, ev, &out->shaped, err, sizeof(err));
    if (out->st[HUB_POLICY_SHAPE] != HUB_POLICY_OK) {
        note_error(out, HUB_POLICY_SHAPE, err);
    }
    err[0] = '\0';
    out->st[HUB_POLICY_RETRY] =
        hub_policy_retry(p, rctx, &out->action, &out->delay_ms, err, sizeof(err));
    if (out->st[HUB_POLICY_RETRY] != HUB_POLICY_OK) {
        /* a failed retry uses the default curve (SPEC §8) */
        note_error(out, HUB_POLICY_RETRY, err);
        out->action = HUB_POLICY_RETRY_SCHEDULE;
    }
    if (out->action == HUB_POLICY_RETRY_SCHEDULE) {
        out->delay_ms = schedule_step(p, rctx->attempt, &out->from_policy);
        if (out->delay_ms < 0) {
            out->action = HUB_POLICY_RETRY_DEAD;
        }
    } else if (out->action == HUB_POLICY_RETRY_DEAD) {
        out->delay_ms = -1;
    }
    out->cpu_us = thread_cpu_us() - cpu0;
    /* all the version's states: a loaded policy shares them with delivery,
     * so this is what the policy holds, not what this event added */
    out->memory_bytes = hub_policy_memory(p);
}

void hub_policy_try_free(struct hub_policy_try *t) {
    hub_policy_shaped_free(&t->shaped);
}

/* Lua names the chunk "<name>.lua" (policy_sandbox.c), and a runtime
 * error's message may quote another "<name>.lua:" before the one with a
 * number (error(msg) with a message that names the file): the first one
 * followed by a digit is the line. */
int hub_policy_error_line(const char *msg, const char *name) {
    char pat[HUB_POLICY_NAME_MAX + 8];
    const char *at;
    size_t n;

    if (msg == NULL || name == NULL) {
        return 0;
    }
    n = (size_t)snprintf(pat, sizeof(pat), "%s.lua:", name);
    for (at = strstr(msg, pat); at != NULL; at = strstr(at + 1, pat)) {
        if (isdigit((unsigned char)at[n])) {
            return atoi(at + n);
        }
    }
    return 0;
}

int hub_policy_body_set(json_t *obj, const char *key, const void *body, size_t len) {
    char enc[64];
    char *b64;
    int rc;

    if (hub_utf8_valid(body, len)) {
        return json_object_set_new(obj, key, json_stringn(len ? body : "", len));
    }
    if ((b64 = hub_base64(body, len)) == NULL) {
        return -1;
    }
    rc = json_object_set_new(obj, key, json_string(b64));
    free(b64);
    snprintf(enc, sizeof(enc), "%s_encoding", key);
    return rc != 0 ? -1 : json_object_set_new(obj, enc, json_string("base64"));
}

/* The "shape" member: the request shape would send, or null.  The headers
 * are the policy's extra headers plus the Content-Type it set; the hub's
 * own (signatures, X-Lerian-*) are not shown: they do not depend on the
 * policy, and a shape header can never replace them (dispatch_attempt.c). */
static json_t *shape_json(const struct hub_policy_try *t, const void *stored, size_t stored_len) {
    const struct hub_policy_shaped *sh = &t->shaped;
    const char *name, *value;
    size_t pos = 0;
    json_t *o, *h;

    if (!t->ran[HUB_POLICY_SHAPE] || t->st[HUB_POLICY_SHAPE] != HUB_POLICY_OK) {
        return json_null();
    }
    o = json_object();
    h = json_object();
    if (o == NULL || h == NULL) {
        json_decref(o);
        json_decref(h);
        return NULL;
    }
    while ((name = hub_policy_shaped_next(sh, &pos, &value)) != NULL) {
        json_object_set_new(h, name, json_string(value));
    }
    if (sh->content_type != NULL) {
        json_object_set_new(h, "Content-Type", json_string(sh->content_type));
    }
    json_object_set_new(o, "headers", h);
    /* a nil body keeps the stored one: show what would be sent */
    if (sh->body != NULL ? hub_policy_body_set(o, "body", sh->body, sh->body_len)
                         : hub_policy_body_set(o, "body", stored, stored_len)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *hub_policy_try_json(const struct hub_policy_try *t, const char *name,
                            const struct hub_policy_retry_ctx *rctx, const void *stored_body,
                            size_t stored_len) {
    static const char *const actions[] = {"schedule", "delay", "dead"};
    json_t *o = json_object(), *retry = json_object(), *shape, *err = json_null();
    int match_ok = t->st[HUB_POLICY_MATCH] == HUB_POLICY_OK;

    shape = shape_json(t, stored_body, stored_len);
    if (o == NULL || retry == NULL || shape == NULL) {
        json_decref(o);
        json_decref(retry);
        json_decref(shape);
        return NULL;
    }
    json_object_set_new(o, "match", match_ok ? json_boolean(t->matched) : json_null());
    json_object_set_new(o, "shape", shape);
    json_object_set_new(retry, "attempt", json_integer(rctx->attempt));
    json_object_set_new(retry, "status", json_integer(rctx->status));
    json_object_set_new(retry, "delay_ms",
                        t->delay_ms >= 0 ? json_integer(t->delay_ms) : json_null());
    json_object_set_new(retry, "action", json_string(actions[t->action]));
    if (t->action == HUB_POLICY_RETRY_SCHEDULE) {
        json_object_set_new(retry, "schedule", json_string(t->from_policy ? "policy" : "default"));
    }
    json_object_set_new(o, "retry", retry);
    if (t->err_fn >= 0) {
        int line = hub_policy_error_line(t->err, name);
        err = json_pack("{s:s, s:s, s:s, s:o}", "function",
                        hub_policy_fn_str((enum hub_policy_fn)t->err_fn), "kind",
                        hub_policy_status_str(t->st[t->err_fn]), "message", t->err, "line",
                        line > 0 ? json_integer(line) : json_null());
    }
    json_object_set_new(o, "error", err != NULL ? err : json_null());
    json_object_set_new(o, "cpu_us", json_integer(t->cpu_us));
    json_object_set_new(o, "memory_bytes", json_integer((json_int_t)t->memory_bytes));
    return o;
}

/* ----------------------------------------------------------- the command -- */

static void test_usage(FILE *out) {
    fprintf(out,
            "usage: streaming-hub policy-test FILE [EVENT_FILE...] [--attempt N] [--status CODE]"
            " [--json]\n\n"
            "Runs the policy FILE's match, shape and retry against each event, in the sandbox\n"
            "and limits of delivery (STREAMING_HUB_POLICY_TIMEOUT, _MEMORY), and prints what\n"
            "each would do.  An EVENT_FILE is a structured-mode CloudEvent (JSON, as\n"
            "application/cloudevents+json) or {\"headers\": {\"ce-id\": ...}, \"body\": \"...\"}\n"
            "for binary mode; an event without tenantid gets tenant \"policy-test\".\n"
            "retry is asked about --attempt (default 1) failing with --status (default 500).\n"
            "--json prints one dry-run result object per event instead.\n"
            "Exit status: 0 when everything ran, 1 on any error, 2 on usage.\n");
}

/* The name of a policy file: its base name without ".lua". */
static void file_policy_name(const char *path, char *out, size_t outsz) {
    const char *base = strrchr(path, '/');
    size_t n;

    base = base != NULL ? base + 1 : path;
    n = strlen(base);
    if (n > 4 && strcmp(base + n - 4, ".lua") == 0) {
        n -= 4;
    }
    snprintf(out, outsz, "%.*s", (int)(n < outsz ? n : outsz - 1), base);
}

/*
 * Prints a policy message as "PATH:LINE: message" when it names a line of
 * the file (the message's own "<name>.lua:<line>:" dropped), else as
 * "PATH: message".
 */
static void print_error(FILE *out, const char *path, const char *name, const char *msg) {
    int line = hub_policy_error_line(msg, name);
    char pat[HUB_POLICY_NAME_MAX + 32];
    const char *at;

    if (line > 0) {
        snprintf(pat, sizeof(pat), "%s.lua:%d:", name, line);
        if ((at = strstr(msg, pat)) != NULL) {
            fprintf(out, "%s:%d: %.*s%s\n", path, line, (int)(at - msg), msg,
                    at + strlen(pat) + (at[strlen(pat)] == ' '));
            return;
        }
        fprintf(out, "%s:%d: %s\n", path, line, msg);
        return;
    }
    fprintf(out, "%s: %s\n", path, msg);
}

/*
 * Reads an event file into ev: a binary-mode object ({"headers", "body"})
 * or a structured-mode CloudEvent, told apart by a "headers" object without
 * "specversion" beside it (a structured event has its attributes at the top
 * level).  Both go through the envelope parser in Kafka mode (raw values,
 * ce- or ce_ names), so an event that passes here passes ingest.
 * or a structured-mode CloudEvent.  Returns 0, or -1 after printing why.
 * A binary event's payload points into *keep (the parsed file), which the
 * caller releases with json_decref after the event.
 */
static int read_event(const char *path, const struct hub_envelope_limits *lim, struct hub_event *ev,
                      json_t **keep) {
    struct hub_header hs[64];
    struct hub_envelope_error perr = {0};
    size_t len = 0, n = 0;
    char *text = hub_read_file(path, &len);
    json_t *doc = NULL, *headers, *body;
    json_error_t jerr;
    const char *name;
    json_t *v;
    int rc = -1;

    if (text == NULL) {
        fprintf(stderr, "%s: cannot be read\n", path);
        return -1;
    }
    doc = json_loadb(text, len, 0, &jerr);
    if (doc == NULL) {
        fprintf(stderr, "%s:%d: not JSON: %s\n", path, jerr.line, jerr.text);
        goto done;
    }
    headers = json_object_get(doc, "headers");
    body = json_object_get(doc, "body");
    if (json_is_object(headers) && json_object_get(doc, "specversion") == NULL) {
        /* binary mode: ce-* headers and the body as the data */
        json_object_foreach(headers, name, v) {
            if (!json_is_string(v) || n == sizeof(hs) / sizeof(hs[0])) {
                fprintf(stderr, "%s: headers.%s: must be a string (at most 64 headers)\n", path,
                        name);
                goto done;
            }
            hs[n++] = (struct hub_header){name, strlen(name), json_string_value(v),
                                          json_string_length(v)};
        }
        if (body != NULL && !json_is_string(body)) {
            fprintf(stderr, "%s: body: must be a string\n", path);
            goto done;
        }
        rc = hub_envelope_parse(HUB_ENVELOPE_KAFKA, hs, n, body ? json_string_value(body) : "",
                                body ? json_string_length(body) : 0, NULL, lim, ev, &perr);
    } else {
        static const char ct[] = "application/cloudevents+json";
        hs[0] = (struct hub_header){"content-type", 12, ct, sizeof(ct) - 1};
        rc = hub_envelope_parse(HUB_ENVELOPE_KAFKA, hs, 1, text, len, NULL, lim, ev, &perr);
    }
    if (rc != 0) {
        fprintf(stderr, "%s: not a valid CloudEvent: %s%s%s\n", path, perr.field,
                perr.field[0] ? ": " : "", perr.message);
    }
done:
    *keep = doc;
    free(text);
    return rc == 0 ? 0 : -1;
}

/* Prints one result as text: one line per function, then the cost, then
 * each error.  Bodies longer than TEST_PRINT_BODY_MAX are cut here only:
 * --json carries them whole. */
static void print_result(const char *policy_path, const char *name, const char *event_path,
                         const struct hub_event *e, const struct hub_policy_try *t,
                         const struct hub_policy_retry_ctx *rctx) {
    const struct hub_policy_shaped *sh = &t->shaped;

    printf("%s: id=%s type=%s event_type=%s tenant=%s\n", event_path, e->id, e->type, e->event_type,
           e->tenant);
    if (!t->ran[HUB_POLICY_MATCH]) {
        printf("  match: true (no match function)\n");
    } else if (t->st[HUB_POLICY_MATCH] == HUB_POLICY_OK) {
        printf("  match: %s\n", t->matched ? "true" : "false");
    } else {
        printf("  match: %s (treated as a match)\n",
               hub_policy_status_str(t->st[HUB_POLICY_MATCH]));
    }
    if (!t->ran[HUB_POLICY_SHAPE]) {
        printf("  shape: none (the stored body is sent)\n");
    } else if (t->st[HUB_POLICY_SHAPE] != HUB_POLICY_OK) {
        printf("  shape: %s (the attempt would fail with policy_error)\n",
               hub_policy_status_str(t->st[HUB_POLICY_SHAPE]));
    } else {
        const char *b = sh->body != NULL ? sh->body : (const char *)e->payload;
        size_t n = sh->body != NULL ? sh->body_len : e->payload_len;
        printf("  shape: body%s (%zu bytes): %.*s%s\n", sh->body != NULL ? "" : " unchanged", n,
               (int)(n > TEST_PRINT_BODY_MAX ? TEST_PRINT_BODY_MAX : n), b,
               n > TEST_PRINT_BODY_MAX ? "..." : "");
        if (sh->content_type != NULL) {
            printf("  shape: header Content-Type: %s\n", sh->content_type);
        }
        const char *k, *v;
        size_t pos = 0;
        while ((k = hub_policy_shaped_next(sh, &pos, &v)) != NULL) {
            printf("  shape: header %s: %s\n", k, v);
        }
    }
    printf("  retry: attempt %d, status %d: ", rctx->attempt, rctx->status);
    if (t->action == HUB_POLICY_RETRY_DEAD) {
        printf("dead-letter\n");
    } else if (t->action == HUB_POLICY_RETRY_DELAY) {
        printf("retry in %lld ms (the policy's retry function)\n", (long long)t->delay_ms);
    } else {
        printf("retry within %lld ms (the %s schedule, jittered)\n", (long long)t->delay_ms,
               t->from_policy ? "policy's" : "default");
    }
    printf("  used: %lld us CPU, %zu bytes of Lua memory\n", (long long)t->cpu_us, t->memory_bytes);
    for (int fn = 0; fn < HUB_POLICY_FN__COUNT; fn++) {
        if (t->st[fn] != HUB_POLICY_OK) {
            printf("  error: ");
            fflush(stdout);
            /* the first error's message is kept; the others are named */
            if (fn == t->err_fn) {
                print_error(stdout, policy_path, name, t->err);
            } else {
                printf("%s: %s\n", hub_policy_fn_str((enum hub_policy_fn)fn),
                       hub_policy_status_str(t->st[fn]));
            }
        }
    }
}

/* A policy event borrowing e's strings; ext holds the extensions list.
 * serial stays 0: every call builds its own ev table, as nothing is
 * shared between the files' events. */
static void event_view(const struct hub_event *e, const char **ext, size_t ext_max,
                       struct hub_policy_event *pe) {
    size_t n = 0;

    for (size_t i = 0; i < e->n_extensions && n + 2 < ext_max; i++) {
        ext[n++] = e->extensions[i].name;
        ext[n++] = e->extensions[i].value;
    }
    ext[n] = NULL;
    *pe = (struct hub_policy_event){
        .id = e->id,
        .source = e->source,
        .type = e->type,
        .event_type = e->event_type,
        .tenant = e->tenant,
        .subject = e->subject,
        .time = e->time,
        .schema_version = e->schema_version,
        .content_type = e->content_type,
        .schema_major = e->schema_major,
        .extensions = ext,
        .body = e->payload,
        .body_len = e->payload_len,
    };
}

/* Reads "--name VALUE" as an int in [lo, hi]; -1 after printing why. */
static int int_option(const char *opt, const char *value, int lo, int hi, int *out) {
    char *end;
    long v;

    if (value == NULL) {
        fprintf(stderr, "streaming-hub policy-test: %s needs a value\n", opt);
        return -1;
    }
    v = strtol(value, &end, 10);
    if (*value == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "streaming-hub policy-test: %s must be an integer in [%d, %d]\n", opt, lo,
                hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int hub_policy_test_main(int argc, char **argv) {
    struct hub_policy_retry_ctx rctx = {.attempt = 1, .status = 500, .error = "status"};
    struct hub_config cfg = {0};
    struct hub_policy_limits lim;
    struct hub_envelope_limits elim = {.default_tenant = "policy-test"};
    const char *policy_path = NULL;
    const char **events = calloc((size_t)argc + 1, sizeof(*events));
    char name[HUB_POLICY_NAME_MAX + 1], err[512];
    struct hub_policy *p = NULL;
    size_t src_len = 0, n_events = 0;
    char *src = NULL;
    int json = 0, failed = 0;

    if (events == NULL) {
        return 1;
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            test_usage(stdout);
            free(events);
            return 0;
        }
        if (strcmp(a, "--attempt") == 0 || strcmp(a, "--status") == 0) {
            int *dst = a[2] == 'a' ? &rctx.attempt : &rctx.status;
            if (int_option(a, i + 1 < argc ? argv[i + 1] : NULL, a[2] == 'a' ? 1 : 0,
                           a[2] == 'a' ? 1000 : 599, dst) != 0) {
                free(events);
                return 2;
            }
            i++;
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "streaming-hub policy-test: unknown option %s\n", a);
            test_usage(stderr);
            free(events);
            return 2;
        } else if (policy_path == NULL) {
            policy_path = a;
        } else {
            events[n_events++] = a;
        }
    }
    if (policy_path == NULL) {
        test_usage(stderr);
        free(events);
        return 2;
    }
    /* status 0 is "no response": the error class is the connection's (the
     * retry ctx of SPEC §8 has no status then) */
    rctx.error = rctx.status > 0 ? "status" : "connect";
    if (hub_config_load_cli(&cfg, "error") != 0) {
        free(events);
        return 2;
    }
    lim = (struct hub_policy_limits){cfg.policy_timeout_ms, (size_t)cfg.policy_memory_bytes};
    elim.max_event_bytes = (size_t)cfg.max_event_bytes;
    hub_config_free(&cfg);

    file_policy_name(policy_path, name, sizeof(name));
    if ((src = hub_read_file(policy_path, &src_len)) == NULL) {
        fprintf(stderr, "%s: cannot be read\n", policy_path);
        free(events);
        return 1;
    }
    p = hub_policy_compile(name, src, src_len, &lim, err, sizeof(err));
    free(src);
    if (p == NULL) {
        print_error(stderr, policy_path, name, err);
        free(events);
        return 1;
    }
    if (!json) {
        printf("%s: policy %s (sha256 %.12s), defines:%s%s%s\n", policy_path, name,
               hub_policy_hash(p), hub_policy_has(p, HUB_POLICY_MATCH) ? " match" : "",
               hub_policy_has(p, HUB_POLICY_SHAPE) ? " shape" : "",
               hub_policy_has(p, HUB_POLICY_RETRY) ? " retry" : "");
    }
    /* every file runs even after a failure: one run shows all the errors */
    for (size_t i = 0; i < n_events; i++) {
        struct hub_event e = {0};
        struct hub_policy_event pe;
        struct hub_policy_try t;
        const char *ext[TEST_EXT_MAX + 1];
        json_t *keep = NULL;

        if (read_event(events[i], &elim, &e, &keep) != 0) {
            json_decref(keep);
            failed = 1;
            continue;
        }
        event_view(&e, ext, TEST_EXT_MAX + 1, &pe);
        hub_policy_try_run(p, &pe, &rctx, &t);
        if (json) {
            json_t *o = hub_policy_try_json(&t, name, &rctx, e.payload, e.payload_len);
            char *s;
            json_object_set_new(o, "file", json_string(events[i]));
            s = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
            if (s != NULL) {
                printf("%s\n", s);
            }
            free(s);
            json_decref(o);
        } else {
            print_result(policy_path, name, events[i], &e, &t, &rctx);
        }
        failed |= t.err_fn >= 0;
        hub_policy_try_free(&t);
        hub_event_free(&e);
        json_decref(keep);
    }
    hub_policy_unref(p);
    free(events);
    return failed ? 1 : 0;
}
