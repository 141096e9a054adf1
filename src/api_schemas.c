/*
 * api_schemas — the registry's admin and tenant routes (see api_schemas.h).
 *
 * Both families share one state and one set of handlers; they differ in
 * the scope ('' for the platform, the tenant id for a tenant) and in who
 * the audit row names.  A registration takes two round trips: what the
 * version must be compared with (hub_sql_schema_prior), then the insert.
 */
#include "api_schemas.h"

#include <jansson.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "api_util.h"
#include "error.h"
#include "hub.h"
#include "jschema.h"
#include "log.h"
#include "schema_registry.h"
#include "store_schemas.h"

#define SCHEMAS_ADMIN_PREFIX "/admin"
#define SCHEMAS_V1_PATH "/v1/schemas"
#define SCHEMAS_MAX_SEGMENTS 4
/* The longest event type a route takes (the envelope's own limit is
 * larger; a schema's type is a name, not a payload). */
#define SCHEMAS_TYPE_MAX 200

enum schemas_op {
    OP_LIST,         /* GET /schemas or /schemas/{type} */
    OP_SETTINGS_PUT, /* PUT /schemas/{type} */
    OP_PUT,          /* PUT /schemas/{type}/{version} */
    OP_GET,          /* GET /schemas/{type}/{version} */
    OP_DELETE,       /* DELETE /schemas/{type}/{version} */
};

struct schemas_call {
    struct hub_api_call call; /* first: api_util hands this pointer back */
    enum schemas_op op;
    int route_status;  /* a tenant route's answer decided before authentication */
    const char *allow; /* ... its Allow header when 405 */
    int tenant;        /* a /v1 route */
    char *scope;       /* '' or the tenant id */
    char *who;         /* the audit actor */
    char *type;        /* NULL: every type (a list) */
    char *version;
    int major, minor, patch;
    json_t *schema;    /* PUT: the body */
    char *schema_text; /* PUT: its stored text (compact, keys sorted) */
    char *setting;     /* PUT settings: "accept" | "quarantine" */
    /* PUT: the parse and compile on the threadpool, and what they found */
    uv_work_t work;
    uv_work_cb work_cb; /* the step to run (put_compile_work, compat_work) */
    int *work_rc;       /* ... where it leaves its result */
    void (*answer)(struct hub_api_call *call, void *arg); /* ... what follows on the loop */
    struct schemas_call *queued; /* next in the queue of steps waiting for their turn */
    char *body;                  /* a copy of the request body: the request may go meanwhile */
    size_t body_len;
    int compile_rc;
    char body_error[256]; /* set when the body is not a JSON object */
    struct hub_jschema_error compile_err;
    /* PUT: the comparison with the version below, on the threadpool too */
    char *prev_text;    /* the stored text of the version below */
    char *prev_version; /* its number */
    int compat_rc;
    json_t *changes;    /* the breaking changes found */
    json_t *registered; /* PUT, settings: the object answered once in use */
    int answer_status;  /* ... with this status (204: no body) */
};

/* on_free: what the route put in its state (api_util.h). */
static void schemas_call_free(struct hub_api_call *call) {
    struct schemas_call *c = (struct schemas_call *)call;

    free(c->scope);
    free(c->who);
    free(c->type);
    free(c->version);
    json_decref(c->schema);
    free(c->schema_text);
    free(c->setting);
    free(c->body);
    free(c->prev_text);
    free(c->prev_version);
    json_decref(c->changes);
    json_decref(c->registered);
}

/* 1 when s[0..len) is an event type a route takes: 1..200 of
 * [A-Za-z0-9._-], the tenant ids' alphabet (safe in paths and logs). */
static int type_valid(const char *s, size_t len) {
    return len <= SCHEMAS_TYPE_MAX && hub_api_tenant_id_valid(s, len);
}

/* ------------------------------------------------------------ answers -- */

/* A statement's rows of objects as {"schemas": [...]}. */
/* A list's rows are objects built by the statement: parsed and put in one
 * array (at most 1,000: the statement's limit). */
static void list_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    PGresult *r = out->n_results > 0 ? out->results[0] : NULL;
    json_t *items;
    json_t *body;

    if (out->status != HUB_PG_OK || r == NULL) {
        hub_api_send_db_error(call->req, out);
        return;
    }
    items = json_array();
    body = json_pack("{s:o}", "schemas", items);
    for (int i = 0; body != NULL && i < PQntuples(r); i++) {
        json_t *one = hub_api_pg_object(call->req, PQgetvalue(r, i, HUB_SCHEMA_OBJECT_COL),
                                        (size_t)PQgetlength(r, i, HUB_SCHEMA_OBJECT_COL));
        if (one == NULL) {
            json_decref(body);
            return; /* answered 500 */
        }
        json_array_append_new(items, one);
    }
    /* a type's list also says what an unknown major of it gets */
    r = out->n_results > 1 ? out->results[1] : NULL;
    if (body != NULL && r != NULL) {
        json_t *set =
            PQntuples(r) > 0
                ? hub_api_pg_object(call->req, PQgetvalue(r, 0, HUB_SCHEMA_OBJECT_COL),
                                    (size_t)PQgetlength(r, 0, HUB_SCHEMA_OBJECT_COL))
                : json_pack("{s:s, s:s}", "unknown_version", "accept", "scope", "default");
        if (set == NULL) {
            json_decref(body);
            return; /* answered 500 */
        }
        json_object_set_new(body, "settings", set);
    }
    if (body == NULL) {
        hub_api_send_oom(call->req);
        return;
    }
    hub_api_send_json(call->req, 200, body);
    json_decref(body);
}

/* The first statement of the transaction that found a row answers with it
 * (a tenant's fetch: its own version, else the platform's). */
static void send_first_object(struct hub_api_call *call, const struct hub_pg_outcome *out,
                              int status, const char *missing) {
    if (out->status != HUB_PG_OK) {
        hub_api_send_db_error(call->req, out);
        return;
    }
    for (int i = 0; i < out->n_results; i++) {
        PGresult *r = out->results[i];
        if (r != NULL && PQntuples(r) > 0) {
            json_t *obj = hub_api_pg_object(call->req, PQgetvalue(r, 0, HUB_SCHEMA_OBJECT_COL),
                                            (size_t)PQgetlength(r, 0, HUB_SCHEMA_OBJECT_COL));
            if (obj != NULL) {
                hub_api_send_json(call->req, status, obj);
                json_decref(obj);
            }
            return;
        }
    }
    hub_api_send_problem(call->req, 404, missing, NULL);
}

/* A fetch: 200 with the version (the tenant's, else the platform's), or 404. */
static void get_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    send_first_object(call, out, 200, "no such schema version");
}

/* The change is in this process's registry (or the reload failed, which
 * the registry logged): the answer kept for then. */
static void put_answer(struct hub_api_call *call, void *arg) {
    struct schemas_call *c = (struct schemas_call *)call;
    (void)arg;

    if (c->answer_status == 204) {
        hub_api_send_no_content(call->req);
    } else {
        hub_api_send_json(call->req, c->answer_status, c->registered);
    }
}

/* hub_schemas_after_reload's callback: the wait ends (freeing the call
 * when its request went away meanwhile). */
static void put_in_use(void *arg) {
    struct schemas_call *c = arg;

    hub_api_call_wake(&c->call, put_answer, NULL);
}

/* Answers status (with c->registered unless 204) once this process's
 * registry has the change just committed: a request sent here right after
 * the answer sees it. */
static void answer_in_use(struct schemas_call *c, int status) {
    c->answer_status = status;
    hub_api_call_wait(&c->call);
    if (hub_schemas_after_reload(c->call.hub, put_in_use, c) != 0) {
        hub_schemas_poke(c->call.hub);
        put_in_use(c);
    }
}

/* answer_in_use with the object in column col of r's first row (parsed
 * and re-rendered compact, as every answer); 500 when it does not parse. */
static void answer_object_in_use(struct schemas_call *c, PGresult *r, int col, int status) {
    c->registered =
        hub_api_pg_object(c->call.req, PQgetvalue(r, 0, col), (size_t)PQgetlength(r, 0, col));
    if (c->registered == NULL) {
        hub_schemas_poke(c->call.hub); /* answered: the change still loads */
        return;
    }
    answer_in_use(c, status);
}

/* The settings are stored: answered once this process uses them, the
 * others at their next poll. */
static void settings_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct schemas_call *c = (struct schemas_call *)call;
    PGresult *r = hub_api_found(call->req, out, 0, "the settings were not stored");

    if (r == NULL) {
        return;
    }
    answer_object_in_use(c, r, HUB_SCHEMA_OBJECT_COL, 200);
}

/* A retirement: 204 once this process no longer uses the version, or 404
 * when no live version had that number. */
static void delete_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    if (hub_api_found(call->req, out, 0, "no such schema version") != NULL) {
        answer_in_use((struct schemas_call *)call, 204);
    }
}

/* ------------------------------------------------------- registration -- */

/*
 * The insert came back (the transaction's second statement; the first took
 * the scope's lock): 201 with the new version, or 409 naming the cap the
 * scope is at.  A unique violation means another request registered the
 * same version between our two round trips, which is a 409 like any other
 * taken version.
 */
static void put_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct schemas_call *c = (struct schemas_call *)call;
    const struct hub_config *cfg = &call->hub->cfg;
    const char *who = c->tenant ? "tenant" : "scope";
    PGresult *r = out->n_results > 1 ? out->results[1] : NULL;
    char detail[256];

    if (out->status == HUB_PG_ESTMT && out->sqlstate != NULL &&
        strcmp(out->sqlstate, "23505") == 0) {
        hub_api_send_problem(call->req, 409,
                             "this version was registered meanwhile; versions are immutable", NULL);
        return;
    }
    if (out->status != HUB_PG_OK || r == NULL || PQntuples(r) != 1) {
        hub_api_send_db_error(call->req, out);
        return;
    }
    if (!PQgetisnull(r, 0, HUB_SCHEMA_PUT_COL_OBJECT)) {
        /* an event sent here right after the 201 is checked against it */
        answer_object_in_use(c, r, HUB_SCHEMA_PUT_COL_OBJECT, 201);
        return;
    }
    if (PQgetvalue(r, 0, HUB_SCHEMA_PUT_COL_PRIOR_CHANGED)[0] == 't') {
        /* another minor of the major was registered (or retired) while this
         * one was compared with the version below: compared again, it may
         * not be compatible */
        hub_api_send_problem(call->req, 409,
                             "another version of this major was registered or retired while this "
                             "one was checked against the version below it; send it again",
                             NULL);
        return;
    }
    /* over a cap: name the one that refused it, and what the scope holds */
    long long n = strtoll(PQgetvalue(r, 0, HUB_SCHEMA_PUT_COL_LIVE_VERSIONS), NULL, 10);
    long long bytes = strtoll(PQgetvalue(r, 0, HUB_SCHEMA_PUT_COL_LIVE_BYTES), NULL, 10);
    if (n >= cfg->schema_max_versions) {
        snprintf(detail, sizeof(detail),
                 "this %s holds %lld live schema versions, the most allowed "
                 "(STREAMING_HUB_SCHEMA_MAX_VERSIONS = %lld): retire one first",
                 who, n, (long long)cfg->schema_max_versions);
    } else {
        snprintf(detail, sizeof(detail),
                 "this %s holds %lld bytes of live schema text; with this schema (%zu bytes) it "
                 "would pass the most allowed (STREAMING_HUB_SCHEMA_MAX_BYTES = %lld): retire "
                 "versions first",
                 who, bytes, strlen(c->schema_text), (long long)cfg->schema_max_bytes);
    }
    /* a conflict with the scope's state, not a fault of the schema */
    hub_api_send_problem(call->req, 409, detail, NULL);
}

/* The breaking changes (a JSON array from hub_jschema_compat) as the
 * problem's errors[]: each names its pointer in "field". */
static json_t *changes_errors(const json_t *changes) {
    json_t *errors = NULL;
    size_t i;
    json_t *ch;

    json_array_foreach(changes, i, ch) {
        char msg[512];
        const char *ptr = json_string_value(json_object_get(ch, "pointer"));
        snprintf(msg, sizeof(msg), "%s: %s",
                 json_string_value(json_object_get(ch, "rule")) ?: "breaking change",
                 json_string_value(json_object_get(ch, "reason")) ?: "");
        hub_api_errors_add(&errors, ptr != NULL ? ptr : "", msg);
        if (errors != NULL) { /* the change's own members stay as given */
            json_t *last = json_array_get(errors, json_array_size(errors) - 1);
            json_object_set(last, "pointer", json_object_get(ch, "pointer"));
            json_object_set(last, "rule", json_object_get(ch, "rule"));
        }
    }
    return errors;
}

/*
 * Registration steps on the threadpool run one at a time per process: the
 * threadpool also checks every tenant's events against their schemas, and
 * one tenant's burst of large registrations must not take all its threads.
 * The steps waiting for their turn queue by scope (a tenant, or the
 * platform), and the scopes take turns, a step each.  A scope that just
 * had its turn goes to the back of the round, and stays there, even with
 * nothing left waiting, until its turn comes round again; a scope new to
 * the round goes first.  So a tenant's burst of costly registrations waits
 * behind itself (another tenant's registration waits for the step
 * running, never for the burst), and a tenant that keeps sending them one
 * at a time cannot come back as new ahead of the others.  A scope holds at
 * most SCHEMAS_WAIT_MAX steps waiting (those of clients that left count
 * until their turn skips them, using no thread); one more registration is
 * refused 429 before its body is copied.  Loop-only state, so file-static.
 */
#define SCHEMAS_WORK_MAX 1
#define SCHEMAS_WAIT_MAX 8

/* A scope's waiting steps, in the ring of the scopes that have some or
 * just had their turn. */
struct work_scope {
    struct work_scope *next; /* the next scope in the ring */
    struct schemas_call *head, *tail;
    size_t n;
    char scope[]; /* '' or the tenant id */
};

static int work_running;
static struct work_scope *work_last; /* the ring's last scope: its next has the turn */

static struct work_scope *work_scope_find(const char *scope) {
    struct work_scope *w = work_last;
    if (w == NULL) {
        return NULL;
    }
    do {
        w = w->next;
        if (strcmp(w->scope, scope) == 0) {
            return w;
        }
    } while (w != work_last);
    return NULL;
}

/* The number of c's scope's steps waiting for their turn. */
static size_t work_waiting(const struct schemas_call *c) {
    const struct work_scope *w = work_scope_find(c->scope);
    return w != NULL ? w->n : 0;
}

/* Queues c behind its scope's waiting steps; a scope new to the ring has
 * the next turn.  Returns 0, or -1 when out of memory. */
static int work_queue(struct schemas_call *c) {
    struct work_scope *w = work_scope_find(c->scope);
    if (w == NULL) {
        size_t len = strlen(c->scope) + 1;
        if ((w = calloc(1, sizeof(*w) + len)) == NULL) {
            return -1;
        }
        memcpy(w->scope, c->scope, len);
        if (work_last == NULL) {
            w->next = w;
            work_last = w;
        } else {
            w->next = work_last->next; /* right after the last: next in turn */
            work_last->next = w;
        }
    }
    c->queued = NULL;
    if (w->tail != NULL) {
        w->tail->queued = c;
    } else {
        w->head = c;
    }
    w->tail = c;
    w->n++;
    return 0;
}

/* Takes the first waiting step of the scope whose turn it is, and moves the
 * scope to the back of the round; a scope whose turn comes with nothing
 * waiting leaves the ring.  NULL when none waits. */
static struct schemas_call *work_next(void) {
    while (work_last != NULL) {
        struct work_scope *w = work_last->next;
        struct schemas_call *c = w->head;
        if (c != NULL) {
            w->head = c->queued;
            if (w->head == NULL) {
                w->tail = NULL;
            }
            w->n--;
            work_last = w; /* its next step waits for a whole round */
            return c;
        }
        if (w == work_last) {
            work_last = NULL; /* it was the only scope */
        } else {
            work_last->next = w->next;
        }
        free(w);
    }
    return NULL;
}

static void work_done(uv_work_t *w, int status);

/* Starts c's step on the threadpool.  A call whose request went away
 * meanwhile skips it, taking no thread: its end runs at once, as
 * cancelled, which frees the call. */
static void work_start(struct schemas_call *c) {
    if (c->call.req != NULL &&
        uv_queue_work(c->call.hub->loop, &c->work, c->work_cb, work_done) == 0) {
        work_running++;
        return;
    }
    *c->work_rc = HUB_ECANCELED;
    hub_api_call_wake(&c->call, c->answer, NULL);
}

/* Starts waiting steps while the threadpool may take one. */
static void work_pump(void) {
    struct schemas_call *next;

    while (work_running < SCHEMAS_WORK_MAX && (next = work_next()) != NULL) {
        work_start(next);
    }
}

/* Runs work(c) on the threadpool when its turn comes, leaving its result
 * in *rc, then answer(c) on the loop if the request is still there; the
 * call waits meanwhile (hub_api_call_wait).  Returns 0, or -1 when out of
 * memory (nothing started; the caller answers). */
static int work_submit(struct schemas_call *c, uv_work_cb work, int *rc,
                       void (*answer)(struct hub_api_call *call, void *arg)) {
    c->work.data = c;
    c->work_cb = work;
    c->work_rc = rc;
    c->answer = answer;
    if (work_queue(c) != 0) {
        return -1;
    }
    hub_api_call_wait(&c->call);
    work_pump();
    return 0;
}

/* A step ended (or was skipped): the next waiting one starts, and the
 * call's wait ends (freeing it when its request went away meanwhile). */
static void work_done(uv_work_t *w, int status) {
    struct schemas_call *c = w->data;

    work_running--;
    work_pump();
    if (status != 0) {
        *c->work_rc = HUB_ECANCELED; /* the loop is closing */
    }
    hub_api_call_wake(&c->call, c->answer, NULL);
}

/* The insert, under the scope's lock and caps (put_done answers). */
static void put_insert(struct schemas_call *c) {
    struct hub_api_call *call = &c->call;
    char maj[12], min[12], pat[12];
    snprintf(maj, sizeof(maj), "%d", c->major);
    snprintf(min, sizeof(min), "%d", c->minor);
    snprintf(pat, sizeof(pat), "%d", c->patch);
    char max_n[24], max_bytes[24];
    snprintf(max_n, sizeof(max_n), "%lld", (long long)call->hub->cfg.schema_max_versions);
    snprintf(max_bytes, sizeof(max_bytes), "%lld", (long long)call->hub->cfg.schema_max_bytes);
    const char *p[HUB_SQL_SCHEMA_PUT_NPARAMS] = {c->scope, c->type,   c->version,     maj,
                                                 min,      pat,       c->schema_text, c->who,
                                                 max_n,    max_bytes, c->prev_version};
    /* the lock first: the caps count what committed registrations left */
    struct hub_pg_txn *txn = hub_api_call_txn(call, put_done);
    if (txn == NULL) {
        return;
    }
    hub_pg_txn_add(txn, &hub_sql_schema_scope_lock, HUB_SQL_SCHEMA_SCOPE_LOCK_NPARAMS, p, NULL,
                   NULL);
    hub_pg_txn_add(txn, &hub_sql_schema_put, HUB_SQL_SCHEMA_PUT_NPARAMS, p, NULL, NULL);
    hub_api_call_submit(call, txn);
}

/* On a threadpool thread: parses the version below and compares the new
 * schema with it (as costly as a compile for a large schema). */
static void compat_work(uv_work_t *w) {
    struct schemas_call *c = w->data;
    json_t *old = json_loads(c->prev_text, 0, NULL);

    c->compat_rc = old != NULL ? hub_jschema_compat(old, c->schema, &c->changes) : HUB_EINVAL;
    json_decref(old);
}

/* Back on the loop with the request still there: 409 naming each breaking
 * change, or the insert. */
static void compat_answered(struct hub_api_call *call, void *arg) {
    struct schemas_call *c = (struct schemas_call *)call;
    (void)arg;

    if (c->compat_rc == HUB_ENOMEM) {
        hub_api_send_oom(call->req);
        return;
    }
    if (c->compat_rc == HUB_ECANCELED) {
        hub_api_send_problem(call->req, 503, "the hub is stopping; retry later", NULL);
        return;
    }
    if (c->compat_rc == 0 && json_array_size(c->changes) > 0) {
        char detail[256];
        snprintf(detail, sizeof(detail),
                 "%s breaks compatibility with %s, the version below it in major %d: "
                 "publish it as a new major instead",
                 c->version, c->prev_version, c->major);
        hub_api_send_problem(call->req, 409, detail, changes_errors(c->changes));
        return;
    }
    /* compat_rc != 0: the stored version no longer parses as a schema; the
     * new one is compiled and valid, so it is accepted (and logged) */
    if (c->compat_rc != 0) {
        hub_log(HUB_WARN, "a stored schema could not be compared; registering the new one",
                HUB_LS("event_type", c->type), HUB_LS("version", c->prev_version));
    }
    put_insert(c);
}

/* What the version is compared with came back: the same version already
 * there (200 when identical, 409 when not), the version below it to
 * compare with on the threadpool (compat_answered goes on), or the insert. */
static void prior_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct schemas_call *c = (struct schemas_call *)call;
    PGresult *r = out->n_results > 0 ? out->results[0] : NULL;
    const char *prev = NULL;
    const char *prev_version = NULL;
    int oom = 0;

    if (out->status != HUB_PG_OK || r == NULL) {
        hub_api_send_db_error(call->req, out);
        return;
    }
    for (int i = 0; i < PQntuples(r); i++) {
        const char *kind = PQgetvalue(r, i, HUB_SCHEMA_PRIOR_COL_KIND);
        if (strcmp(kind, "same") == 0) {
            const char *text = PQgetvalue(r, i, HUB_SCHEMA_PRIOR_COL_SCHEMA);
            if (strcmp(text, c->schema_text) == 0) {
                /* a retry of the same registration: the stored version */
                const char *p[HUB_SQL_SCHEMA_GET_NPARAMS] = {c->scope, c->type, c->version};
                hub_api_call_query(call, get_done, &hub_sql_schema_get, HUB_SQL_SCHEMA_GET_NPARAMS,
                                   p);
                return;
            }
            hub_api_send_problem(call->req, 409,
                                 "this version is registered with a different schema; versions "
                                 "are immutable (register a new version, or retire this one "
                                 "first)",
                                 NULL);
            return;
        }
        prev = PQgetvalue(r, i, HUB_SCHEMA_PRIOR_COL_SCHEMA);
        prev_version = PQgetvalue(r, i, HUB_SCHEMA_PRIOR_COL_VERSION);
    }
    if (prev == NULL) {
        put_insert(c);
        return;
    }
    c->prev_text = hub_api_strdup(prev, &oom);
    c->prev_version = hub_api_strdup(prev_version, &oom);
    if (oom) {
        hub_api_send_oom(call->req);
        return;
    }
    if (work_submit(c, compat_work, &c->compat_rc, compat_answered) != 0) {
        hub_api_send_oom(call->req);
    }
}

/*
 * On a threadpool thread: parses the body of a registration, compiles it
 * only to see that it can be (the registries compile their own copies), and
 * renders its stored text.  The call is waiting (hub_api_call_wait), so
 * nothing on the loop touches c meanwhile.
 */
static void put_compile_work(uv_work_t *w) {
    struct schemas_call *c = w->data;
    struct hub_jschema *compiled = NULL;
    json_error_t jerr;

    /* the checks of hub_api_read_json_object, which must run on the loop */
    c->schema = json_loadb(c->body, c->body_len, JSON_REJECT_DUPLICATES, &jerr);
    if (c->schema == NULL || !json_is_object(c->schema)) {
        if (c->schema == NULL) {
            snprintf(c->body_error, sizeof(c->body_error),
                     "malformed JSON at line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
        } else {
            snprintf(c->body_error, sizeof(c->body_error),
                     "the request body must be a JSON object");
        }
        c->compile_rc = HUB_EINVAL;
        return;
    }
    c->compile_rc = hub_jschema_compile(c->schema, NULL, &compiled, &c->compile_err);
    hub_jschema_free(compiled);
    if (c->compile_rc == 0) {
        /* the stored text: compact with sorted keys, so one schema has one
         * digest whatever the spacing or member order it was sent with */
        c->schema_text = json_dumps(c->schema, JSON_COMPACT | JSON_SORT_KEYS);
        if (c->schema_text == NULL) {
            c->compile_rc = HUB_ENOMEM;
        }
    }
}

/* Back on the loop with the request still there: answers a schema that
 * does not compile (400 naming the schema pointer, 500), or asks what the
 * version must be compared with. */
static void put_compiled(struct hub_api_call *call, void *arg) {
    struct schemas_call *c = (struct schemas_call *)call;
    h2o_req_t *req = call->req;
    const struct hub_jschema_error *err = &c->compile_err;
    (void)arg;

    if (c->compile_rc == HUB_ENOMEM) {
        hub_api_send_oom(req);
        return;
    }
    if (c->compile_rc == HUB_ECANCELED) {
        hub_api_send_problem(req, 503, "the hub is stopping; retry later", NULL);
        return;
    }
    if (c->body_error[0] != '\0') {
        hub_api_send_problem(req, 400, c->body_error, NULL);
        return;
    }
    if (c->compile_rc != 0) {
        json_t *errors = NULL;
        char field[HUB_JSCHEMA_POINTER_MAX + 8];
        snprintf(field, sizeof(field), "schema%s", err->pointer);
        hub_api_errors_add(&errors, field, err->message);
        if (errors != NULL) {
            json_object_set_new(json_array_get(errors, 0), "pointer", json_string(err->pointer));
        }
        hub_api_send_problem(req, 400, "the body is not a usable draft-07 JSON Schema", errors);
        return;
    }
    char maj[12], min[12], pat[12];
    snprintf(maj, sizeof(maj), "%d", c->major);
    snprintf(min, sizeof(min), "%d", c->minor);
    snprintf(pat, sizeof(pat), "%d", c->patch);
    const char *p[HUB_SQL_SCHEMA_PRIOR_NPARAMS] = {c->scope, c->type, c->version, maj, min, pat};
    hub_api_call_query(call, prior_done, &hub_sql_schema_prior, HUB_SQL_SCHEMA_PRIOR_NPARAMS, p);
}

/*
 * Takes the body of a registration and parses and compiles it on the libuv
 * threadpool: even under the validator's limits a large schema costs tens
 * of milliseconds to parse and as many to compile, which the loop (every
 * tenant's requests) must not wait for.  Returns 0 with the call waiting
 * (put_compiled continues), or answers (413, 400, 429, 500) and returns -1.
 */
static int put_read(struct schemas_call *c) {
    h2o_req_t *req = c->call.req;
    char detail[96];

    if (req->entity.len > HUB_API_MAX_BODY) {
        snprintf(detail, sizeof(detail), "the request body is larger than %d bytes",
                 HUB_API_MAX_BODY);
        hub_api_send_problem(req, 413, detail, NULL);
        return -1;
    }
    if (req->entity.base == NULL || req->entity.len == 0) {
        hub_api_send_problem(req, 400, "a JSON object is required as the request body", NULL);
        return -1;
    }
    if (work_waiting(c) >= SCHEMAS_WAIT_MAX) {
        snprintf(detail, sizeof(detail),
                 "%d registrations of this scope are waiting to be compiled; retry later",
                 SCHEMAS_WAIT_MAX);
        hub_api_add_header(req, "Retry-After", "1");
        hub_api_send_problem(req, 429, detail, NULL);
        return -1;
    }
    c->body = malloc(req->entity.len);
    if (c->body == NULL) {
        hub_api_send_oom(req);
        return -1;
    }
    memcpy(c->body, req->entity.base, req->entity.len);
    c->body_len = req->entity.len;
    if (work_submit(c, put_compile_work, &c->compile_rc, put_compiled) != 0) {
        hub_api_send_oom(req);
        return -1;
    }
    return 0;
}

/* PUT settings: {"unknown_version": "accept" | "quarantine"}. */
static int settings_read(struct schemas_call *c) {
    static const char *const allowed[] = {"unknown_version", NULL};
    json_t *body = hub_api_read_json_object(c->call.req, HUB_API_MAX_BODY);
    json_t *errors = NULL;
    const char *v;
    int oom = 0;

    if (body == NULL) {
        return -1;
    }
    hub_api_reject_unknown_members(body, allowed, &errors);
    v = json_string_value(json_object_get(body, "unknown_version"));
    if (v == NULL || (strcmp(v, "accept") != 0 && strcmp(v, "quarantine") != 0)) {
        hub_api_errors_add(&errors, "unknown_version", "must be \"accept\" or \"quarantine\"");
    } else {
        c->setting = hub_api_strdup(v, &oom);
    }
    json_decref(body);
    return hub_api_input_refused(c->call.req, errors, oom) ? -1 : 0;
}

/* ------------------------------------------------------------ routing -- */

/* Runs the call's operation (its scope and who are set). */
static void schemas_run(struct schemas_call *c) {
    struct hub_api_call *call = &c->call;

    switch (c->op) {
    case OP_LIST: {
        const char *p[HUB_SQL_SCHEMA_LIST_NPARAMS] = {c->scope, c->type,
                                                      c->tenant ? "true" : "false"};
        struct hub_pg_txn *txn = hub_api_call_txn(call, list_done);
        if (txn == NULL) {
            return;
        }
        hub_pg_txn_add(txn, &hub_sql_schema_list, HUB_SQL_SCHEMA_LIST_NPARAMS, p, NULL, NULL);
        if (c->type != NULL) { /* one type's list: its settings too */
            hub_pg_txn_add(txn, &hub_sql_schema_settings_get, HUB_SQL_SCHEMA_SETTINGS_GET_NPARAMS,
                           p, NULL, NULL);
        }
        hub_api_call_submit(call, txn);
        return;
    }
    case OP_GET: {
        const char *p[HUB_SQL_SCHEMA_GET_NPARAMS] = {c->scope, c->type, c->version};
        const char *pp[HUB_SQL_SCHEMA_GET_NPARAMS] = {"", c->type, c->version};
        struct hub_pg_txn *txn = hub_api_call_txn(call, get_done);
        if (txn == NULL) {
            return;
        }
        hub_pg_txn_add(txn, &hub_sql_schema_get, HUB_SQL_SCHEMA_GET_NPARAMS, p, NULL, NULL);
        if (c->tenant) { /* what it will receive: the platform's when it has none */
            hub_pg_txn_add(txn, &hub_sql_schema_get, HUB_SQL_SCHEMA_GET_NPARAMS, pp, NULL, NULL);
        }
        hub_api_call_submit(call, txn);
        return;
    }
    case OP_DELETE: {
        const char *p[HUB_SQL_SCHEMA_RETIRE_NPARAMS] = {c->scope, c->type, c->version, c->who};
        hub_api_call_query(call, delete_done, &hub_sql_schema_retire, HUB_SQL_SCHEMA_RETIRE_NPARAMS,
                           p);
        return;
    }
    case OP_SETTINGS_PUT: {
        const char *p[HUB_SQL_SCHEMA_SETTINGS_PUT_NPARAMS] = {c->scope, c->type, c->setting,
                                                              c->who};
        if (settings_read(c) != 0) {
            return;
        }
        p[2] = c->setting;
        hub_api_call_query(call, settings_done, &hub_sql_schema_settings_put,
                           HUB_SQL_SCHEMA_SETTINGS_PUT_NPARAMS, p);
        return;
    }
    case OP_PUT:
        /* answered, or continues in put_compiled once compiled */
        (void)put_read(c);
        return;
    }
}

/*
 * Decides the operation from the method and segs (segs[0] is "schemas"):
 * returns 0 with c's op, type and version set, or the status to answer
 * (404, 405 with *allow, 400 for a malformed type or version with
 * *detail).
 */
static int schemas_route(struct schemas_call *c, const h2o_iovec_t *segs, int n, const char **allow,
                         const char **detail) {
    h2o_req_t *req = c->call.req;
    int oom = 0;

    *allow = NULL;
    *detail = NULL;
    if (n < 1 || n > 3) {
        return 404;
    }
    if (n >= 2) {
        if (!type_valid(segs[1].base, segs[1].len)) {
            *detail = "the event type must be 1 to 200 of A-Z a-z 0-9 . _ -";
            return 400;
        }
        c->type = hub_api_strndup(segs[1].base, segs[1].len, &oom);
    }
    if (n == 3) {
        c->version = hub_api_strndup(segs[2].base, segs[2].len, &oom);
        if (c->version != NULL &&
            hub_schema_version_parse(c->version, &c->major, &c->minor, &c->patch) != 0) {
            *detail = "the version must be semver MAJOR.MINOR.PATCH (e.g. 1.2.0)";
            return 400;
        }
    }
    if (oom) {
        return 500;
    }
    if (n == 3) {
        *allow = "GET, HEAD, PUT, DELETE";
        c->op = hub_api_method_get(req)            ? OP_GET
                : hub_api_method_is(req, "PUT")    ? OP_PUT
                : hub_api_method_is(req, "DELETE") ? OP_DELETE
                                                   : (enum schemas_op) - 1;
    } else if (n == 2) {
        *allow = "GET, HEAD, PUT";
        c->op = hub_api_method_get(req)         ? OP_LIST
                : hub_api_method_is(req, "PUT") ? OP_SETTINGS_PUT
                                                : (enum schemas_op) - 1;
    } else {
        *allow = "GET, HEAD";
        c->op = hub_api_method_get(req) ? OP_LIST : (enum schemas_op) - 1;
    }
    return (int)c->op < 0 ? 405 : 0;
}

/* Answers a route status decided before the operation ran. */
static void send_route_status(h2o_req_t *req, int status, const char *allow, const char *detail) {
    if (status == 405) {
        hub_api_send_method_not_allowed(req, allow);
    } else if (status == 500) {
        hub_api_send_oom(req);
    } else {
        hub_api_send_problem(req, status, detail != NULL ? detail : "no such resource", NULL);
    }
}

/* The admin token was checked by api_admin.c: the platform's scope. */
void hub_api_schemas_admin(struct hub *hub, h2o_req_t *req, const h2o_iovec_t *segs, int n) {
    struct schemas_call *c = hub_api_call_new(hub, req, sizeof(*c), schemas_call_free);
    const char *allow, *detail;
    int status;
    int oom = 0;

    if (c == NULL) {
        return;
    }
    if ((status = schemas_route(c, segs, n, &allow, &detail)) != 0) {
        send_route_status(req, status, allow, detail);
        return;
    }
    c->scope = hub_api_strdup("", &oom);
    c->who = hub_api_strdup("admin", &oom);
    if (oom) {
        hub_api_send_oom(req);
        return;
    }
    schemas_run(c);
}

/* The tenant's key is checked: the route's status, or the operation in
 * the tenant's scope. */
static void tenant_authed(struct hub_api_call *call, const char *tenant_id, int status) {
    struct schemas_call *c = (struct schemas_call *)call;
    char who[sizeof("tenant:") + HUB_API_TENANT_ID_MAX];
    int oom = 0;

    if (status != 200) {
        hub_api_route_answered(call->req, status, 0, NULL, NULL);
        return;
    }
    if (c->route_status != 0) {
        send_route_status(call->req, c->route_status, c->allow, NULL);
        return;
    }
    snprintf(who, sizeof(who), "tenant:%s", tenant_id);
    c->scope = hub_api_strdup(tenant_id, &oom);
    c->who = hub_api_strdup(who, &oom);
    if (oom) {
        hub_api_send_oom(call->req);
        return;
    }
    schemas_run(c);
}

/* The route is decided before authentication and answered after it (a
 * 404 or 405 reveals nothing to a caller without a key). */
int hub_api_schemas_handle(struct hub *hub, h2o_req_t *req) {
    h2o_iovec_t segs[SCHEMAS_MAX_SEGMENTS];
    struct schemas_call *c;
    const char *detail = NULL;
    int n;

    if (!hub_api_path_under(req->path_normalized, SCHEMAS_V1_PATH)) {
        return 0;
    }
    if ((c = hub_api_call_new(hub, req, sizeof(*c), schemas_call_free)) == NULL) {
        return 1;
    }
    c->tenant = 1;
    /* segments after "/v1": "schemas", then type and version */
    n = hub_api_split_path(req->path_normalized, sizeof("/v1") - 1, segs, SCHEMAS_MAX_SEGMENTS);
    c->route_status = n < 0 ? 404 : schemas_route(c, segs, n, &c->allow, &detail);
    if (c->route_status == 400) {
        /* a malformed name says nothing about any tenant: answered at once */
        hub_api_send_problem(req, 400, detail, NULL);
        return 1;
    }
    hub_api_auth_tenant(&c->call, tenant_authed);
    return 1;
}

/* ---------------------------------------------------- the ingest answer -- */

void hub_api_schema_answer(int violation, const char *evidence, int *status, const char **detail,
                           json_t **errors) {
    json_t *doc = evidence != NULL ? json_loads(evidence, 0, NULL) : NULL;
    json_t *list = json_object_get(doc, "errors");
    size_t i;
    json_t *e;

    *status = 422;
    *errors = NULL;
    if (!violation) {
        *detail = "the event's schema major has no registered schema and its type's setting "
                  "quarantines such events (unknown_schema_version); the event is quarantined";
        hub_api_errors_add(errors, "schemaversion",
                           "no registered schema for this major of the event type");
        json_decref(doc);
        return;
    }
    *detail = "the payload does not match the registered schema of its event type and version "
              "(schema_violation); the event is quarantined";
    json_array_foreach(list, i, e) {
        const char *ptr = json_string_value(json_object_get(e, "pointer"));
        const char *msg = json_string_value(json_object_get(e, "message"));
        char field[300];
        json_t *last;
        snprintf(field, sizeof(field), "data%s", ptr != NULL ? ptr : "");
        hub_api_errors_add(errors, field, msg != NULL ? msg : "does not match the schema");
        if (*errors != NULL && (last = json_array_get(*errors, json_array_size(*errors) - 1))) {
            json_object_set(last, "pointer", json_object_get(e, "pointer"));
            json_object_set(last, "keyword", json_object_get(e, "keyword"));
        }
    }
    if (*errors != NULL && (e = json_object_get(doc, "schema")) != NULL) {
        /* which schema judged it: the first error carries it for clients
         * that read only errors[] */
        json_object_set(json_array_get(*errors, 0), "schema", e);
    }
    if (*errors == NULL) {
        hub_api_errors_add(errors, "data", "does not match the registered schema");
    }
    json_decref(doc);
}
