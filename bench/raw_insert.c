/*
 * raw_insert — the raw limit for bench/ingest: inbox-shaped rows written by a
 * plain single-connection client in 500-row `unnest` batches into the same
 * event_inbox table the hub writes (same indexes, same partitions).
 *
 * usage: raw_insert DSN ROWS PAYLOAD_BYTES
 * prints: "raw_insert rows N seconds S rate R/s"
 */
#include <libpq-fe.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store.h"
#include "util.h"

#define BATCH 500

static const char *const insert_sql =
    "INSERT INTO event_inbox (seq, day, tenant_id, source, event_id, ce_type, event_type,"
    " schema_major, event_time, content_type, headers, payload, digest)"
    " SELECT nextval('event_seq'), (now() AT TIME ZONE 'UTC')::date, u.*"
    "   FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int4[],"
    "               $7::timestamptz[], $8::text[], $9::jsonb[], $10::bytea[], $11::bytea[])"
    "     AS u(tenant_id, source, event_id, ce_type, event_type, schema_major, event_time,"
    "          content_type, headers, payload, digest)"
    " ON CONFLICT (tenant_id, source, event_id, day) DO NOTHING";

int main(int argc, char **argv) {
    static const uint32_t oids[11] = {HUB_OID_TEXT, HUB_OID_TEXT,  HUB_OID_TEXT, HUB_OID_TEXT,
                                      HUB_OID_TEXT, HUB_OID_INT4,  HUB_OID_TIMESTAMPTZ,
                                      HUB_OID_TEXT, HUB_OID_JSONB, HUB_OID_BYTEA,
                                      HUB_OID_BYTEA};
    PGconn *conn;
    long rows, payload_bytes;
    char *payload;
    uint64_t t0;
    double secs;
    unsigned run = (unsigned)time(NULL);

    if (argc != 4) {
        fprintf(stderr, "usage: raw_insert DSN ROWS PAYLOAD_BYTES\n");
        return 2;
    }
    rows = atol(argv[2]);
    payload_bytes = atol(argv[3]);
    conn = PQconnectdb(argv[1]);
    if (PQstatus(conn) != CONNECTION_OK) {
        fprintf(stderr, "raw_insert: %s", PQerrorMessage(conn));
        return 1;
    }
    payload = malloc((size_t)payload_bytes + 64);
    t0 = hub_now_ns();
    for (long done = 0; done < rows; done += BATCH) {
        struct hub_pgarr a[11];
        const char *values[11];
        int lengths[11], formats[11];
        long n = rows - done < BATCH ? rows - done : BATCH;
        PGresult *r;

        for (int k = 0; k < 11; k++) {
            hub_pgarr_init(&a[k], oids[k]);
        }
        for (long i = done; i < done + n; i++) {
            char tenant[32], id[64], headers[512];
            unsigned char digest[32];
            int len = snprintf(payload, (size_t)payload_bytes + 64,
                               "{\"seq\":%ld,\"amount\":%ld,\"pad\":\"", i, i * 7 % 10000);
            while (len < payload_bytes - 2) {
                payload[len++] = 'x';
            }
            payload[len++] = '"';
            payload[len++] = '}';
            snprintf(tenant, sizeof(tenant), "t%ld", i % 1000);
            snprintf(id, sizeof(id), "raw-%u-%ld", run, i);
            int hl = snprintf(headers, sizeof(headers),
                              "{\"specversion\":\"1.0\",\"id\":\"%s\",\"source\":\"/bench/raw\","
                              "\"type\":\"studio.lerian.transaction.posted\",\"time\":"
                              "\"2026-01-01T00:00:00.000000Z\",\"tenantid\":\"%s\","
                              "\"datacontenttype\":\"application/json\"}",
                              id, tenant);
            SHA256((unsigned char *)payload, (size_t)len, digest);
            hub_pgarr_add_text(&a[0], tenant);
            hub_pgarr_add_text(&a[1], "/bench/raw");
            hub_pgarr_add_text(&a[2], id);
            hub_pgarr_add_text(&a[3], "studio.lerian.transaction.posted");
            hub_pgarr_add_text(&a[4], "transaction.posted");
            hub_pgarr_add_i32(&a[5], 1);
            hub_pgarr_add_ts(&a[6], 1767225600LL * 1000000);
            hub_pgarr_add_text(&a[7], "application/json");
            hub_pgarr_add_jsonb(&a[8], headers, (size_t)hl);
            hub_pgarr_add(&a[9], payload, (size_t)len);
            hub_pgarr_add(&a[10], digest, 32);
        }
        for (int k = 0; k < 11; k++) {
            values[k] = hub_pgarr_finish(&a[k], &lengths[k]);
            formats[k] = 1;
        }
        r = PQexecParams(conn, insert_sql, 11, NULL, values, lengths, formats, 0);
        if (PQresultStatus(r) != PGRES_COMMAND_OK) {
            fprintf(stderr, "raw_insert: %s", PQresultErrorMessage(r));
            return 1;
        }
        PQclear(r);
        for (int k = 0; k < 11; k++) {
            hub_pgarr_free(&a[k]);
        }
    }
    secs = (double)(hub_now_ns() - t0) / 1e9;
    printf("raw_insert rows %ld seconds %.3f rate %.0f/s\n", rows, secs, (double)rows / secs);
    free(payload);
    PQfinish(conn);
    return 0;
}
