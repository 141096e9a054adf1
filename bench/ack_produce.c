/*
 * bench-ack-produce — a paced CloudEvents producer that records when the
 * broker acknowledged each record, for bench/latency-1p.
 *
 *   bench-ack-produce BOOTSTRAP_FILE TOPIC PARTITION COUNT RATE TENANT ID_PREFIX
 *                     PAYLOAD_BYTES OUT
 *
 * Produces COUNT records at RATE per second to one partition (binary mode:
 * ce- headers, a JSON payload of about PAYLOAD_BYTES), linger 0, acks=all.
 * A thread of its own serves the delivery reports as they come (the
 * producing loop sleeps between records), so each acknowledgement is stamped
 * within a poll of its arrival.  OUT gets one line per acknowledged record:
 * "<ce-id> <ack time, Unix seconds with microseconds>".
 */
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Wall-clock time in Unix µs (the sink logs wall-clock receipt times). */
static int64_t unix_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Monotonic seconds: the pacing clock (the wall clock may step). */
static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int64_t *acks; /* ack time of record i, 0 until acknowledged */
static atomic_int done;

/* Delivery report: the broker acknowledged (or refused) record i. */
static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    (void)rk;
    (void)opaque;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        acks[(intptr_t)m->_private] = unix_us();
    }
}

/* Serves delivery reports until the producing loop is over. */
static void *poller(void *arg) {
    rd_kafka_t *rk = arg;
    while (!atomic_load(&done)) {
        rd_kafka_poll(rk, 1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    char bootstrap[512] = "", errstr[512], id[128], ts[64], *payload;
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_t *rk;
    pthread_t th;
    FILE *f, *out;
    long long count, i;
    double rate, t0;
    size_t plen;

    if (argc != 10) {
        fprintf(stderr, "usage: bench-ack-produce BOOTSTRAP_FILE TOPIC PARTITION COUNT RATE "
                        "TENANT ID_PREFIX PAYLOAD_BYTES OUT\n");
        return 2;
    }
    /* the mock cluster's bootstrap list, as kafka_start wrote it */
    if ((f = fopen(argv[1], "r")) == NULL || fgets(bootstrap, sizeof(bootstrap), f) == NULL) {
        fprintf(stderr, "bench-ack-produce: cannot read %s\n", argv[1]);
        return 1;
    }
    fclose(f);
    bootstrap[strcspn(bootstrap, "\r\n")] = '\0';
    count = atoll(argv[4]);
    rate = atof(argv[5]);
    plen = (size_t)atol(argv[8]);
    acks = calloc((size_t)count + 1, sizeof(*acks));
    payload = malloc(plen + 32);
    if (acks == NULL || payload == NULL) {
        return 1;
    }
    /* a JSON object padded to about plen bytes */
    snprintf(payload, plen + 32, "{\"pad\":\"");
    memset(payload + 8, 'x', plen > 10 ? plen - 10 : 0);
    snprintf(payload + 8 + (plen > 10 ? plen - 10 : 0), 4, "\"}");
    /* linger 0: the producer's own batching delay is not the hub's latency;
     * acks=all: the acknowledgement is the broker's, as the bench times */
    if (rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, errstr, sizeof(errstr)) ||
        rd_kafka_conf_set(conf, "linger.ms", "0", errstr, sizeof(errstr)) ||
        rd_kafka_conf_set(conf, "acks", "all", errstr, sizeof(errstr))) {
        fprintf(stderr, "bench-ack-produce: %s\n", errstr);
        return 1;
    }
    rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);
    if ((rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr))) == NULL) {
        fprintf(stderr, "bench-ack-produce: %s\n", errstr);
        return 1;
    }
    /* the reports are served on their own thread from here on: the loop
     * below sleeps between records, and a report served only when it
     * wakes would be stamped late */
    pthread_create(&th, NULL, poller, rk);
    t0 = mono_s();
    for (i = 0; i < count; i++) {
        double wait = t0 + (double)i / rate - mono_s();
        time_t now;
        struct tm tm;
        rd_kafka_headers_t *h = rd_kafka_headers_new(8);
        /* record i is due at t0 + i / rate: a late record is not made up
         * for by a burst of the next ones, only by not sleeping */
        if (wait > 0) {
            struct timespec s = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
            nanosleep(&s, NULL);
        }
        snprintf(id, sizeof(id), "%s%lld", argv[7], i);
        now = time(NULL);
        gmtime_r(&now, &tm);
        strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", &tm);
        /* binary mode: the attributes as ce- headers, the payload as the value */
        rd_kafka_header_add(h, "ce-specversion", -1, "1.0", -1);
        rd_kafka_header_add(h, "ce-id", -1, id, -1);
        rd_kafka_header_add(h, "ce-source", -1, "/bench/ack", -1);
        rd_kafka_header_add(h, "ce-type", -1, "studio.lerian.transaction.posted", -1);
        rd_kafka_header_add(h, "ce-time", -1, ts, -1);
        rd_kafka_header_add(h, "ce-tenantid", -1, argv[6], -1);
        rd_kafka_header_add(h, "content-type", -1, "application/json", -1);
        if (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(argv[2]), RD_KAFKA_V_PARTITION(atoi(argv[3])),
                              RD_KAFKA_V_VALUE(payload, strlen(payload)),
                              RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(h),
                              RD_KAFKA_V_OPAQUE((void *)(intptr_t)i),
                              RD_KAFKA_V_END) != RD_KAFKA_RESP_ERR_NO_ERROR) {
            rd_kafka_headers_destroy(h);
        }
    }
    /* every record acknowledged (or given up) before the list is written */
    rd_kafka_flush(rk, 10000);
    atomic_store(&done, 1);
    pthread_join(th, NULL);
    rd_kafka_destroy(rk);
    /* unacknowledged records are left out: the bench counts the samples */
    if ((out = fopen(argv[9], "w")) == NULL) {
        return 1;
    }
    for (i = 0; i < count; i++) {
        if (acks[i] != 0) {
            fprintf(out, "%s%lld %lld.%06lld\n", argv[7], i, (long long)(acks[i] / 1000000),
                    (long long)(acks[i] % 1000000));
        }
    }
    fclose(out);
    return 0;
}
