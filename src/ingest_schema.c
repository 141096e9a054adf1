/*
 * ingest_schema — the schema step of the batch writer (SPEC §3.5; see
 * ingest_batch.h): each valid record of a type with registered schemas is
 * checked against the schema of its schemaversion, on the libuv threadpool,
 * before the batch's transaction is built.
 *
 *   ingest_batch_submit ─► ingest_schema_start (loop): pick each record's
 *     schema from the registry's snapshot (schema_registry.h); records of
 *     types without schemas are not touched, and a batch with none of
 *     them goes on at once; an unknown major is settled here by its
 *     type's setting
 *   ─► check_work (a threadpool thread): parse each picked payload with
 *     jansson and validate it (jschema.h, bounded work); a failure writes
 *     the record's verdict and evidence
 *   ─► check_done (loop): counts, releases the snapshot ─►
 *     ingest_batch_schema_done, which refuses the quarantined records and
 *     submits the batch again.
 *
 * The records belong to the batch writer throughout; the thread writes
 * only the records of its job, which the loop does not touch until
 * check_done.  A hostile payload or schema costs at most the validator's
 * work bound (jschema.h), and a batch waits only for its own records.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "error.h"
#include "hub.h"
#include "ingest_batch.h"
#include "jschema.h"
#include "log.h"
#include "schema_registry.h"

/* Errors the evidence keeps (SPEC §3.5: "the first errors"). */
#define SCHEMA_EVIDENCE_ERRORS 5

/* One record to check. */
struct check_item {
    struct hub_ingest_rec *r;
    const struct hub_schema_entry *e; /* borrowed from the job's snapshot */
    enum hub_schema_check result;     /* set by the thread */
};

/* A batch's checks on their way through the threadpool. */
struct check_job {
    uv_work_t work;
    struct ingest_batch *b;
    struct hub_schema_set *set; /* a reference, released in check_done */
    size_t n;
    struct check_item items[];
};

/* The evidence is the record's until its owner frees the record (the HTTP
 * answer reads it after the batch is stored). */
void ingest_rec_schema_free(struct hub_ingest_rec *r) {
    free(r->schema_evidence);
    r->schema_evidence = NULL;
}

/* ------------------------------------------------------------ evidence -- */

/* The evidence's "schema" member: what the payload was checked against. */
static json_t *evidence_schema(const struct hub_schema_entry *e) {
    char digest[80];

    snprintf(digest, sizeof(digest), "sha256:%s", e->digest);
    return json_pack("{s:s, s:s, s:s, s:s}", "event_type", e->type, "version", e->version, "digest",
                     digest, "scope", e->scope[0] ? "tenant" : "platform");
}

/* Sets r's verdict and evidence {"schema": ..., "errors": [...],
 * "total_errors": n} (evidence NULL on OOM: the quarantine row then says
 * only the reason). */
static void evidence_set(struct hub_ingest_rec *r, const struct hub_schema_entry *e, json_t *errors,
                         size_t total) {
    json_t *doc =
        json_pack("{s:o, s:o, s:I}", "schema", evidence_schema(e), "errors",
                  errors != NULL ? errors : json_array(), "total_errors", (json_int_t)total);

    r->verdict = HUB_V_QUARANTINED_SCHEMA;
    ingest_rec_schema_free(r);
    if (doc != NULL) {
        r->schema_evidence = json_dumps(doc, JSON_COMPACT);
        json_decref(doc);
    }
}

/* One error as the evidence and problem+json write it. */
static json_t *error_one(const char *pointer, const char *keyword, const char *message) {
    /* the same members as hub_jschema_result_json's */
    return json_pack("{s:s, s:s, s:s}", "pointer", pointer, "keyword", keyword, "message", message);
}

/* ------------------------------------------------------ the thread part -- */

/*
 * The payload as the validator sees it.  Everything PostgreSQL's json
 * grammar takes parses: "\u0000" in strings, and integers beyond 64 bits
 * (read again as reals: the validator compares numbers by value, and the
 * stored bytes are the text).  Repeated member names are refused (jansson's
 * json_error_duplicate_key): the validator would see the last and a
 * consumer may read the first.
 */
static json_t *payload_load(const struct hub_event *ev, json_error_t *jerr) {
    const size_t flags = JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES;
    json_t *doc = json_loadb((const char *)ev->payload, ev->payload_len, flags, jerr);

    if (doc == NULL && json_error_code(jerr) == json_error_numeric_overflow) {
        doc = json_loadb((const char *)ev->payload, ev->payload_len,
                         flags | JSON_DECODE_INT_AS_REAL, jerr);
    }
    return doc;
}

/* Checks one record (a threadpool thread). */
static void check_one(struct check_item *it) {
    struct hub_ingest_rec *r = it->r;
    const struct hub_event *ev = &r->ev;
    struct hub_jschema_result res;
    json_error_t jerr;
    json_t *doc;
    json_t *errors;
    int rc;

    doc = payload_load(ev, &jerr);
    if (doc == NULL && ev->json_unchecked && json_error_code(&jerr) != json_error_duplicate_key) {
        /* under a JSON content type a payload that is not JSON keeps the
         * verdict it has without schemas: an invalid envelope (field data) */
        r->verdict = HUB_V_QUARANTINED_INVALID;
        r->err.reason = HUB_ENVELOPE_INVALID;
        snprintf(r->err.field, sizeof(r->err.field), "data");
        snprintf(r->err.message, sizeof(r->err.message), "payload is not well-formed JSON (%.120s)",
                 jerr.text);
        it->result = HUB_SCHEMA_CHECK_NOT_JSON;
        return;
    }
    if (doc == NULL) {
        char msg[192];
        int repeats = json_error_code(&jerr) == json_error_duplicate_key;
        snprintf(msg, sizeof(msg), "%s: %s",
                 repeats ? "payload repeats a member name" : "payload is not JSON", jerr.text);
        errors = json_array();
        json_array_append_new(errors, error_one("", "json", msg));
        evidence_set(r, it->e, errors, 1);
        it->result = repeats ? HUB_SCHEMA_CHECK_INVALID : HUB_SCHEMA_CHECK_NOT_JSON;
        return;
    }
    rc = hub_jschema_validate(it->e->compiled, doc, &res);
    json_decref(doc);
    if (rc == 0 && res.valid) {
        snprintf(r->schema_version, sizeof(r->schema_version), "%s", it->e->version);
        it->result = HUB_SCHEMA_CHECK_VALID;
        return;
    }
    if (rc == HUB_ERANGE) {
        /* a bound stopped it: never accepted unchecked */
        errors = json_array();
        json_array_append_new(errors, error_one("", "limit",
                                                "validation stopped at its work bound (depth, "
                                                "steps or regex cost)"));
        evidence_set(r, it->e, errors, 1);
        it->result = HUB_SCHEMA_CHECK_LIMIT;
        return;
    }
    if (rc != 0) { /* out of memory: the same as a bound, the payload is not accepted */
        errors = json_array();
        json_array_append_new(errors, error_one("", "limit", "validation ran out of memory"));
        evidence_set(r, it->e, errors, 1);
        it->result = HUB_SCHEMA_CHECK_LIMIT;
        return;
    }
    if (res.nerrors > SCHEMA_EVIDENCE_ERRORS) {
        res.nerrors = SCHEMA_EVIDENCE_ERRORS;
    }
    errors = hub_jschema_result_json(&res);
    evidence_set(r, it->e, errors, res.total_errors);
    it->result = HUB_SCHEMA_CHECK_INVALID;
}

/* The threadpool's side: the job's records, one after the other (a batch's
 * checks are one work item, so a batch holds one thread at a time and the
 * other batches' items find the others free). */
static void check_work(uv_work_t *w) {
    struct check_job *job = w->data;

    for (size_t i = 0; i < job->n; i++) {
        check_one(&job->items[i]);
    }
}

/* Back on the loop: count, release, hand the batch back. */
static void check_done(uv_work_t *w, int status) {
    struct check_job *job = w->data;
    struct ingest_batch *b = job->b;

    (void)status;
    for (size_t i = 0; i < job->n; i++) {
        b->hub->metrics.schema_checks[job->items[i].result]++;
    }
    hub_schemas_release(job->set);
    free(job);
    ingest_batch_schema_done(b);
}

/* --------------------------------------------------------- the loop part -- */

/* An unknown major quarantined by its type's setting: the evidence says
 * which major and version the event claimed. */
static void unknown_quarantine(struct hub_ingest_rec *r) {
    json_t *doc = json_pack("{s:s, s:s?, s:i, s:s}", "event_type", r->ev.event_type,
                            "schemaversion", r->ev.schema_version, "major", r->ev.schema_major,
                            "message", "no registered schema for this major of the event type");

    r->verdict = HUB_V_QUARANTINED_UNKNOWN_SCHEMA;
    ingest_rec_schema_free(r);
    if (doc != NULL) {
        r->schema_evidence = json_dumps(doc, JSON_COMPACT);
        json_decref(doc);
    }
}

/* The registry's first snapshot is in: the batch goes through the writer
 * again, and so through the step. */
static void resume_ready(void *arg) {
    struct ingest_batch *b = arg;

    b->in_step = INGEST_STEP_NONE;
    ingest_batch_submit(b);
}

int ingest_schema_start(struct ingest_batch *b) {
    struct hub *hub = b->hub;
    struct hub_schema_set *set;
    struct check_job *job;
    size_t want = 0;
    size_t quarantined = 0;

    if (!hub_schemas_ready(hub)) {
        /* nothing is checked before the registry is known: the batch waits
         * for it (the database is what both need) */
        if (hub_schemas_when_ready(hub, resume_ready, b) != 0) {
            return HUB_ENOMEM;
        }
        b->in_step = INGEST_STEP_WAITING;
        return 1;
    }
    set = hub_schemas_acquire(hub);
    if (set == NULL) {
        return 0; /* no schema registered at all: types pass as before */
    }
    /* first the picks: most batches have no record of a type with schemas,
     * and go on at once without a job or a thread */
    for (size_t i = 0; i < b->n; i++) {
        struct hub_ingest_rec *r = &b->recs[i];
        const struct hub_schema_entry *e;
        if (!r->schema_want) {
            continue;
        }
        switch (hub_schema_set_pick(set, r->ev.tenant, r->ev.event_type, r->ev.schema_version,
                                    r->ev.schema_major, &e)) {
        case HUB_SCHEMA_CHECK:
            want++;
            break;
        case HUB_SCHEMA_UNKNOWN_ACCEPT:
            hub->metrics.schema_checks[HUB_SCHEMA_CHECK_UNKNOWN_ACCEPTED]++;
            r->schema_want = 0;
            break;
        case HUB_SCHEMA_UNKNOWN_QUARANTINE:
            hub->metrics.schema_checks[HUB_SCHEMA_CHECK_UNKNOWN_QUARANTINED]++;
            unknown_quarantine(r);
            quarantined++;
            break;
        default: /* a type without schemas: unchanged */
            r->schema_want = 0;
            break;
        }
    }
    if (want == 0) {
        hub_schemas_release(set);
        if (quarantined == 0) {
            return 0;
        }
        ingest_batch_schema_done(b);
        return 1;
    }
    job = malloc(sizeof(*job) + want * sizeof(job->items[0]));
    if (job == NULL) {
        /* a record is never stored unchecked: the batch is tried again */
        hub_schemas_release(set);
        return HUB_ENOMEM;
    }
    job->b = b;
    job->set = set;
    job->n = 0;
    for (size_t i = 0; i < b->n && job->n < want; i++) {
        struct hub_ingest_rec *r = &b->recs[i];
        const struct hub_schema_entry *e;
        if (r->schema_want && r->verdict != HUB_V_QUARANTINED_UNKNOWN_SCHEMA &&
            hub_schema_set_pick(set, r->ev.tenant, r->ev.event_type, r->ev.schema_version,
                                r->ev.schema_major, &e) == HUB_SCHEMA_CHECK) {
            job->items[job->n].r = r;
            job->items[job->n].e = e;
            job->items[job->n].result = HUB_SCHEMA_CHECK_VALID;
            job->n++;
        }
    }
    job->work.data = job;
    if (uv_queue_work(hub->loop, &job->work, check_work, check_done) != 0) {
        hub_schemas_release(set);
        free(job);
        return HUB_ENOMEM;
    }
    b->in_step = INGEST_STEP_CHECKING;
    return 1;
}
