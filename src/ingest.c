/*
 * ingest — the records both ingest paths hand to the batch writer, and what
 * is read from a Kafka record for them: its headers, its position, and the
 * evidence its quarantine row keeps (see ingest.h and ingest_batch.h).
 *
 * A record's Kafka message (hub_ingest_rec.msg) stays untouched from the
 * consumer to the batch's end: the parsed event points into its payload,
 * and the quarantine evidence is read from it only for the few records
 * refused, when their row is written.
 */
#include "ingest.h"

#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"
#include "fault.h"
#include "ingest_batch.h"
#include "util.h"

/* Headers a record may carry before reading them costs a malloc. */
#define INGEST_STACK_HEADERS 32

/* Used by both paths: the Kafka record's headers (headers_evidence below)
 * and the HTTP request's (api_events.c), so operators see one shape. */
char *hub_ingest_headers_evidence(const struct hub_header *h, size_t n) {
    json_t *arr = json_array();
    char *out;

    for (size_t i = 0; arr != NULL && i < n; i++) {
        json_t *o = json_object();
        /* jsonb holds text only: bytes that are not UTF-8 go in base64 */
        if (hub_utf8_valid(h[i].name, h[i].name_len)) {
            json_object_set_new(o, "name", json_stringn(h[i].name, h[i].name_len));
        } else {
            char *b = hub_base64(h[i].name, h[i].name_len);
            json_object_set_new(o, "name_b64", json_string(b ? b : ""));
            free(b);
        }
        if (h[i].value == NULL) {
            json_object_set_new(o, "value", json_null());
        } else if (hub_utf8_valid(h[i].value, h[i].value_len)) {
            json_object_set_new(o, "value", json_stringn(h[i].value, h[i].value_len));
        } else {
            char *b = hub_base64(h[i].value, h[i].value_len);
            json_object_set_new(o, "value_b64", json_string(b ? b : ""));
            free(b);
        }
        json_array_append_new(arr, o);
    }
    /* compact: the text is stored as is in a jsonb column, or logged */
    out = arr != NULL ? json_dumps(arr, JSON_COMPACT) : NULL;
    json_decref(arr);
    return out;
}

/*
 * A Kafka record's headers as an array: stack[0..cap) when they fit, else
 * malloc'd (the caller frees it when it is not stack).  The names and
 * values are borrowed from m.  Returns NULL on OOM.
 */
static struct hub_header *msg_headers(const rd_kafka_message_t *m, struct hub_header *stack,
                                      size_t cap, size_t *n) {
    rd_kafka_headers_t *hdrs = NULL;
    struct hub_header *h = stack;
    const char *name;
    const void *val;
    size_t size;

    *n = 0;
    if (rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        return h;
    }
    /* most records carry a handful of ce- headers: the stack array fits */
    if (rd_kafka_header_cnt(hdrs) > cap) {
        h = malloc(sizeof(*h) * rd_kafka_header_cnt(hdrs));
        if (h == NULL) {
            return NULL;
        }
    }
    for (size_t k = 0; rd_kafka_header_get_all(hdrs, k, &name, &val, &size) == 0; k++) {
        h[(*n)++] = (struct hub_header){name, strlen(name), val, val ? size : 0};
    }
    return h;
}

/* JSON evidence of a Kafka record's headers for the quarantine table
 * (malloc'd; NULL on OOM). */
static char *headers_evidence(const rd_kafka_message_t *m) {
    struct hub_header stack[INGEST_STACK_HEADERS];
    size_t n;
    struct hub_header *h = msg_headers(m, stack, INGEST_STACK_HEADERS, &n);
    char *out = h != NULL ? hub_ingest_headers_evidence(h, n) : NULL;

    if (h != stack) {
        free(h);
    }
    return out;
}

/* The value of a header as text when it is storable, else NULL (evidence of
 * the claimed tenant/source/id for operators browsing the quarantine).
 * Values over 1 KiB or not UTF-8 are left out: the full headers are in the
 * row's headers evidence anyway.  Returns malloc'd text. */
static char *header_text(const rd_kafka_message_t *m, const char *attr) {
    rd_kafka_headers_t *hdrs = NULL;
    const char *name;
    const void *val;
    size_t size;
    char *found = NULL;

    if (rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        return NULL;
    }
    for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &val, &size) == 0; i++) {
        if ((strncasecmp(name, "ce-", 3) == 0 || strncasecmp(name, "ce_", 3) == 0) &&
            strcasecmp(name + 3, attr) == 0 && val != NULL && size <= 1024 &&
            hub_utf8_valid(val, size)) {
            free(found);
            found = strndup(val, size); /* last one wins, as in the parser */
        }
    }
    return found;
}

/* Out of memory is not the record's fault: it is not refused (that would
 * quarantine it for good), only left unparsed for the batch's next try. */
size_t hub_ingest_msg_header_bytes(const void *msg, size_t *n) {
    const rd_kafka_message_t *m = msg;
    rd_kafka_headers_t *hdrs = NULL;
    const char *name;
    const void *val;
    size_t size, bytes = 0, k = 0;

    if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        for (; rd_kafka_header_get_all(hdrs, k, &name, &val, &size) == 0; k++) {
            bytes += strlen(name) + (val != NULL ? size : 0);
        }
    }
    if (n != NULL) {
        *n = k;
    }
    return bytes;
}

/* 1 when the record's headers pass the bounds of ingest.h. */
static int msg_headers_over(const rd_kafka_message_t *m) {
    size_t n, bytes = hub_ingest_msg_header_bytes(m, &n);
    return n > HUB_EVENT_HEADERS_MAX || bytes > HUB_EVENT_HEADER_BYTES_MAX;
}

int ingest_rec_parse_kafka(struct hub_ingest_rec *r, const struct hub_envelope_limits *lim) {
    const rd_kafka_message_t *m = r->msg;
    struct hub_header stack[INGEST_STACK_HEADERS];
    size_t nh = 0;
    struct hub_header *h;

    if (msg_headers_over(m)) {
        r->ok = 0;
        memset(&r->err, 0, sizeof(r->err));
        r->err.reason = HUB_ENVELOPE_TOO_LARGE;
        snprintf(r->err.field, sizeof(r->err.field), "headers");
        snprintf(r->err.message, sizeof(r->err.message),
                 "the record's headers are over %d or %d bytes in all", HUB_EVENT_HEADERS_MAX,
                 HUB_EVENT_HEADER_BYTES_MAX);
        return 0;
    }
    h = hub_fault("kafka_headers") ? NULL : msg_headers(m, stack, INGEST_STACK_HEADERS, &nh);

    if (h == NULL) {
        r->ok = 0;
        memset(&r->err, 0, sizeof(r->err));
        r->err.reason = HUB_ENVELOPE_NOMEM;
        snprintf(r->err.message, sizeof(r->err.message), "out of memory reading headers");
        return HUB_ENOMEM;
    }
    /* binary mode or structured, as the record says (SPEC §3.1) */
    r->ok = hub_envelope_parse(HUB_ENVELOPE_KAFKA, h, nh, m->payload, m->len,
                               rd_kafka_topic_name(m->rkt), lim, &r->ev, &r->err) == 0;
    if (h != stack) {
        free(h);
    }
    return !r->ok && r->err.reason == HUB_ENVELOPE_NOMEM ? HUB_ENOMEM : 0;
}

/* Read for every record the insert carries: no allocation, the topic name
 * is librdkafka's own string.  An HTTP record has no position (its
 * quarantine row and inbox row carry NULLs). */
void ingest_rec_pos(const struct hub_ingest_rec *r, struct hub_store_kafka_pos *pos) {
    const rd_kafka_message_t *m = r->msg;

    if (m == NULL) { /* HTTP ingest */
        *pos = (struct hub_store_kafka_pos){NULL, 0, 0};
        return;
    }
    *pos = (struct hub_store_kafka_pos){rd_kafka_topic_name(m->rkt), m->partition, m->offset};
}

/* The evidence is read late, only for the few records refused: a valid
 * record never pays for its headers' JSON. */
void ingest_rec_evidence(const struct hub_ingest_rec *r, struct hub_store_quarantine_row *row,
                         struct ingest_evidence *ev) {
    const rd_kafka_message_t *m = r->msg;

    memset(row, 0, sizeof(*row));
    memset(ev, 0, sizeof(*ev));
    ingest_rec_pos(r, &row->pos);
    if (r->ok) {
        /* a valid envelope (a digest conflict): its own key */
        row->tenant_id = r->ev.tenant;
        row->source = r->ev.source;
        row->event_id = r->ev.id;
    } else if (m == NULL) {
        /* HTTP: the API read what the event claimed */
        row->tenant_id = r->claimed_tenant;
        row->source = r->claimed_source;
        row->event_id = r->claimed_id;
    } else {
        /* Kafka: the ce- headers, when they are storable text */
        row->tenant_id = ev->owned[0] = header_text(m, "tenantid");
        row->source = ev->owned[1] = header_text(m, "source");
        row->event_id = ev->owned[2] = header_text(m, "id");
    }
    if (m == NULL) {
        row->headers_json = r->headers_json;
        row->value = r->value;
        row->value_len = r->value_len;
    } else {
        /* headers past the bounds are left out ([]; the row's detail says
         * why): a megabyte of them would become a megabyte of JSON, per
         * record, on the loop */
        row->headers_json = ev->owned[3] = msg_headers_over(m) ? strdup("[]") : headers_evidence(m);
        row->value = m->payload;
        row->value_len = m->len;
    }
}

/* Frees what ingest_rec_evidence made; ev is empty after (safe twice). */
void ingest_evidence_free(struct ingest_evidence *ev) {
    for (size_t k = 0; k < sizeof(ev->owned) / sizeof(ev->owned[0]); k++) {
        free(ev->owned[k]);
        ev->owned[k] = NULL;
    }
}
