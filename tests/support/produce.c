/*
 * hub-produce — a librdkafka producer of CloudEvents (binary content mode) for
 * the integration tests and the ingest benchmark.
 *
 * Record i (i = --start .. --start + --count - 1) carries the headers
 *   ce-specversion=1.0, ce-id=<id-prefix><i>, ce-source, ce-type, ce-time (now,
 *   RFC 3339 UTC with microseconds), ce-tenantid=<tenant-prefix><i % tenants>,
 *   content-type=application/json, plus every --extra-header,
 * and a JSON object payload padded to about --payload-bytes bytes, or the exact
 * bytes of --payload-file.  The payload of record i depends only on i and the
 * options, so producing the same range twice yields byte-identical duplicates.
 *
 * It waits for every delivery report and prints one line
 *   produced N failed M seconds S rate R/s
 * to stdout.  Exit status: 0 when every record was acknowledged, 1 when some
 * failed, 2 on bad usage or setup errors.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <librdkafka/rdkafka.h>

#define MAX_EXTRA_HEADERS 32

struct extra_header {
    char *name;
    char *value;
};

struct options {
    char *bootstrap;
    const char *topic;
    long long count;
    long long tenants;
    const char *tenant_prefix;
    const char *tenant; /* fixed tenant id; overrides prefix/tenants */
    int partitions;
    size_t payload_bytes;
    const char *id_prefix;
    long long start;
    const char *source;
    const char *type;
    const char *prefix; /* "ce-" or "ce_" */
    double rate;
    struct extra_header extra[MAX_EXTRA_HEADERS];
    int n_extra;
    unsigned char *payload_file; /* owned; exact payload for every record */
    size_t payload_file_len;
    int use_payload_file;
    int key_tenant; /* record key = tenant id (default: no key) */
    int quiet;
};

/* Delivery report tallies, updated from rd_kafka_poll()/flush() on this thread. */
struct tally {
    long long ok;
    long long failed;
    int errors_printed;
};

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Writes the current UTC time as RFC 3339 with microseconds ("...T12:00:00.123456Z"). */
static void rfc3339_now(char *out, size_t outsz) {
    struct timespec ts;
    struct tm tm;
    char base[32];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, outsz, "%s.%06ldZ", base, ts.tv_nsec / 1000);
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: hub-produce --bootstrap LIST|--bootstrap-file FILE --topic T [options]\n"
            "  --count N            records to produce (default 1)\n"
            "  --start I            first record index (default 0)\n"
            "  --tenants K          tenant ids <tenant-prefix><i %% K> (default 1)\n"
            "  --tenant-prefix P    tenant id prefix (default \"t\")\n"
            "  --tenant ID          use this exact tenant id for every record\n"
            "  --partitions P       if > 0, record i goes to partition i %% P\n"
            "  --payload-bytes B    JSON payload padded to about B bytes (default 64)\n"
            "  --payload-file F     use the exact bytes of F as every payload\n"
            "  --id-prefix S        ce-id = S + i (default \"ev-\")\n"
            "  --source S           ce-source (default /test/producer)\n"
            "  --type T             ce-type (default studio.lerian.transaction.posted)\n"
            "  --prefix ce-|ce_     header spelling (default ce-)\n"
            "  --rate R             records per second, 0 = as fast as possible\n"
            "  --extra-header N=V   extra header on every record (repeatable)\n"
            "  --key-tenant         use the tenant id as record key (default: no key,\n"
            "                       records spread randomly unless --partitions)\n"
            "  --quiet              no progress on stderr\n");
}

/* Reads a whole file into a new buffer.  Returns 0 or -1 (message printed). */
static int read_file(const char *path, unsigned char **out, size_t *out_len) {
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    size_t len = 0, cap = 0;
    if (f == NULL) {
        fprintf(stderr, "hub-produce: %s: %s\n", path, strerror(errno));
        return -1;
    }
    for (;;) {
        size_t n;
        if (cap - len < 65536) {
            unsigned char *nb;
            cap = cap == 0 ? 65536 : cap * 2;
            nb = realloc(buf, cap);
            if (nb == NULL) {
                free(buf);
                fclose(f);
                fprintf(stderr, "hub-produce: out of memory\n");
                return -1;
            }
            buf = nb;
        }
        n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            break;
        }
    }
    if (ferror(f)) {
        fprintf(stderr, "hub-produce: %s: read error\n", path);
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    *out = buf;
    *out_len = len;
    return 0;
}

/* First line of a file, trimmed, as a new string; NULL on error. */
static char *read_first_line(const char *path) {
    unsigned char *buf;
    size_t len;
    char *s;
    size_t n = 0;
    if (read_file(path, &buf, &len) != 0) {
        return NULL;
    }
    while (n < len && buf[n] != '\n' && buf[n] != '\r') {
        n++;
    }
    s = malloc(n + 1);
    if (s != NULL) {
        memcpy(s, buf, n);
        s[n] = '\0';
    }
    free(buf);
    return s;
}

static int parse_ll(const char *arg, const char *what, long long min, long long *out) {
    char *end;
    long long v;
    errno = 0;
    v = strtoll(arg, &end, 10);
    if (errno != 0 || end == arg || *end != '\0' || v < min) {
        fprintf(stderr, "hub-produce: bad %s: %s\n", what, arg);
        return -1;
    }
    *out = v;
    return 0;
}

/* Parses argv into *o.  Returns 0, or 2 on a usage error (message printed). */
static int parse_options(int argc, char **argv, struct options *o) {
    enum {
        O_BOOTSTRAP = 256,
        O_BOOTSTRAP_FILE,
        O_TOPIC,
        O_COUNT,
        O_TENANTS,
        O_TENANT_PREFIX,
        O_TENANT,
        O_PARTITIONS,
        O_PAYLOAD_BYTES,
        O_ID_PREFIX,
        O_START,
        O_SOURCE,
        O_TYPE,
        O_PREFIX,
        O_RATE,
        O_EXTRA_HEADER,
        O_PAYLOAD_FILE,
        O_KEY_TENANT,
        O_QUIET,
        O_HELP,
    };
    static const struct option longopts[] = {
        {"bootstrap", required_argument, NULL, O_BOOTSTRAP},
        {"bootstrap-file", required_argument, NULL, O_BOOTSTRAP_FILE},
        {"topic", required_argument, NULL, O_TOPIC},
        {"count", required_argument, NULL, O_COUNT},
        {"tenants", required_argument, NULL, O_TENANTS},
        {"tenant-prefix", required_argument, NULL, O_TENANT_PREFIX},
        {"tenant", required_argument, NULL, O_TENANT},
        {"partitions", required_argument, NULL, O_PARTITIONS},
        {"payload-bytes", required_argument, NULL, O_PAYLOAD_BYTES},
        {"id-prefix", required_argument, NULL, O_ID_PREFIX},
        {"start", required_argument, NULL, O_START},
        {"source", required_argument, NULL, O_SOURCE},
        {"type", required_argument, NULL, O_TYPE},
        {"prefix", required_argument, NULL, O_PREFIX},
        {"rate", required_argument, NULL, O_RATE},
        {"extra-header", required_argument, NULL, O_EXTRA_HEADER},
        {"payload-file", required_argument, NULL, O_PAYLOAD_FILE},
        {"key-tenant", no_argument, NULL, O_KEY_TENANT},
        {"quiet", no_argument, NULL, O_QUIET},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    int c;
    long long v;

    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case O_BOOTSTRAP:
            free(o->bootstrap);
            o->bootstrap = strdup(optarg);
            break;
        case O_BOOTSTRAP_FILE:
            free(o->bootstrap);
            o->bootstrap = read_first_line(optarg);
            if (o->bootstrap == NULL) {
                return 2;
            }
            break;
        case O_TOPIC:
            o->topic = optarg;
            break;
        case O_COUNT:
            if (parse_ll(optarg, "--count", 0, &o->count) != 0) {
                return 2;
            }
            break;
        case O_TENANTS:
            if (parse_ll(optarg, "--tenants", 1, &o->tenants) != 0) {
                return 2;
            }
            break;
        case O_TENANT_PREFIX:
            o->tenant_prefix = optarg;
            break;
        case O_TENANT:
            o->tenant = optarg;
            break;
        case O_PARTITIONS:
            if (parse_ll(optarg, "--partitions", 0, &v) != 0 || v > 1000000) {
                return 2;
            }
            o->partitions = (int)v;
            break;
        case O_PAYLOAD_BYTES:
            if (parse_ll(optarg, "--payload-bytes", 0, &v) != 0) {
                return 2;
            }
            o->payload_bytes = (size_t)v;
            break;
        case O_ID_PREFIX:
            o->id_prefix = optarg;
            break;
        case O_START:
            if (parse_ll(optarg, "--start", 0, &o->start) != 0) {
                return 2;
            }
            break;
        case O_SOURCE:
            o->source = optarg;
            break;
        case O_TYPE:
            o->type = optarg;
            break;
        case O_PREFIX:
            if (strcmp(optarg, "ce-") != 0 && strcmp(optarg, "ce_") != 0) {
                fprintf(stderr, "hub-produce: --prefix must be ce- or ce_\n");
                return 2;
            }
            o->prefix = optarg;
            break;
        case O_RATE: {
            char *end;
            o->rate = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || o->rate < 0) {
                fprintf(stderr, "hub-produce: bad --rate: %s\n", optarg);
                return 2;
            }
            break;
        }
        case O_EXTRA_HEADER: {
            const char *eq = strchr(optarg, '=');
            if (eq == NULL || eq == optarg || o->n_extra == MAX_EXTRA_HEADERS) {
                fprintf(stderr, "hub-produce: bad --extra-header (NAME=VALUE): %s\n", optarg);
                return 2;
            }
            o->extra[o->n_extra].name = strndup(optarg, (size_t)(eq - optarg));
            o->extra[o->n_extra].value = strdup(eq + 1);
            o->n_extra++;
            break;
        }
        case O_PAYLOAD_FILE:
            free(o->payload_file);
            o->payload_file = NULL;
            if (read_file(optarg, &o->payload_file, &o->payload_file_len) != 0) {
                return 2;
            }
            o->use_payload_file = 1;
            break;
        case O_KEY_TENANT:
            o->key_tenant = 1;
            break;
        case O_QUIET:
            o->quiet = 1;
            break;
        case O_HELP:
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "hub-produce: unexpected argument: %s\n", argv[optind]);
        return 2;
    }
    if (o->bootstrap == NULL || o->bootstrap[0] == '\0' || o->topic == NULL) {
        usage(stderr);
        return 2;
    }
    return 0;
}

/*
 * Builds the JSON payload of record i into buf (capacity cap, at least 128):
 * {"seq":i,"amount":<cents>.<cc>,"pad":"xxx..."} with the pad sized so that the
 * whole object is about `target` bytes (never below the unpadded size).
 * Returns the length.
 */
static size_t make_payload(char *buf, size_t cap, long long i, size_t target) {
    int head = snprintf(buf, cap, "{\"seq\":%lld,\"amount\":%lld.%02lld,\"pad\":\"", i,
                        (i * 7919) % 100000, i % 100);
    size_t len = (size_t)head;
    size_t pad = 0;
    if (target > len + 2) {
        pad = target - len - 2;
    }
    if (len + pad + 3 > cap) {
        pad = cap - len - 3;
    }
    memset(buf + len, 'x', pad);
    len += pad;
    memcpy(buf + len, "\"}", 2);
    len += 2;
    buf[len] = '\0';
    return len;
}

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    struct tally *t = opaque;
    (void)rk;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        t->ok++;
    } else {
        t->failed++;
        if (t->errors_printed < 5) {
            fprintf(stderr, "hub-produce: delivery failed: %s\n", rd_kafka_err2str(m->err));
            t->errors_printed++;
        }
    }
}

static int conf_set(rd_kafka_conf_t *conf, const char *name, const char *value) {
    char errstr[512];
    if (rd_kafka_conf_set(conf, name, value, errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK) {
        fprintf(stderr, "hub-produce: %s=%s: %s\n", name, value, errstr);
        return -1;
    }
    return 0;
}

/* Adds one header; the name is "<prefix><attr>" when prefix is non-NULL. */
static void add_header(rd_kafka_headers_t *h, const char *prefix, const char *attr,
                       const char *value) {
    char name[256];
    if (prefix != NULL) {
        snprintf(name, sizeof(name), "%s%s", prefix, attr);
    } else {
        snprintf(name, sizeof(name), "%s", attr);
    }
    rd_kafka_header_add(h, name, -1, value, -1);
}

static void options_free(struct options *o) {
    free(o->bootstrap);
    free(o->payload_file);
    for (int k = 0; k < o->n_extra; k++) {
        free(o->extra[k].name);
        free(o->extra[k].value);
    }
}

int main(int argc, char **argv) {
    struct options o = {
        .count = 1,
        .tenants = 1,
        .tenant_prefix = "t",
        .payload_bytes = 64,
        .id_prefix = "ev-",
        .source = "/test/producer",
        .type = "studio.lerian.transaction.posted",
        .prefix = "ce-",
    };
    struct tally tally = {0, 0, 0};
    char errstr[512];
    rd_kafka_conf_t *conf;
    rd_kafka_t *rk;
    char *payload_buf = NULL;
    size_t payload_cap;
    long long produced = 0, i;
    double t0, elapsed;
    int rc;

    rc = parse_options(argc, argv, &o);
    if (rc != 0) {
        options_free(&o);
        return rc;
    }

    payload_cap = o.payload_bytes + 256;
    payload_buf = malloc(payload_cap);
    if (payload_buf == NULL) {
        fprintf(stderr, "hub-produce: out of memory\n");
        options_free(&o);
        return 2;
    }

    conf = rd_kafka_conf_new();
    /* Throughput-friendly batching: the ingest benchmark pushes ~30k 1 KiB
     * records per second through this tool. */
    if (conf_set(conf, "bootstrap.servers", o.bootstrap) != 0 ||
        conf_set(conf, "linger.ms", getenv("HUB_PRODUCE_LINGER_MS") ? getenv("HUB_PRODUCE_LINGER_MS") : "5") != 0 ||
        conf_set(conf, "batch.num.messages", "10000") != 0 ||
        conf_set(conf, "batch.size", "1048576") != 0 ||
        conf_set(conf, "queue.buffering.max.messages", "500000") != 0 ||
        conf_set(conf, "queue.buffering.max.kbytes", "1048576") != 0 ||
        conf_set(conf, "message.timeout.ms", "120000") != 0 ||
        conf_set(conf, "acks", "all") != 0) {
        rd_kafka_conf_destroy(conf);
        free(payload_buf);
        options_free(&o);
        return 2;
    }
    rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);
    rd_kafka_conf_set_opaque(conf, &tally);

    rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    if (rk == NULL) {
        fprintf(stderr, "hub-produce: %s\n", errstr);
        free(payload_buf);
        options_free(&o);
        return 2;
    }

    /* The first record would wait for the connection to the broker and the
     * topic's metadata: fetch them first, so that ce-time (taken as each
     * record is built) is within a few milliseconds of the broker's ack
     * from the first record on (the latency tests measure from it). */
    {
        rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, o.topic, NULL);
        const struct rd_kafka_metadata *md = NULL;
        if (rkt != NULL &&
            rd_kafka_metadata(rk, 0, rkt, &md, 10000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
            rd_kafka_metadata_destroy(md);
        }
        if (rkt != NULL) {
            rd_kafka_topic_destroy(rkt);
        }
    }
    t0 = now_seconds();
    for (i = o.start; i < o.start + o.count; i++) {
        char id[512], tenant[512], ts[64];
        const void *payload;
        size_t payload_len;
        rd_kafka_headers_t *hdrs;
        rd_kafka_resp_err_t err;
        int32_t partition = RD_KAFKA_PARTITION_UA;

        /* Pace to --rate: record n (counted from 0) is due at t0 + n / rate. */
        if (o.rate > 0) {
            double due = t0 + (double)(i - o.start) / o.rate;
            double wait = due - now_seconds();
            if (wait > 0.0005) {
                struct timespec ts_sleep;
                rd_kafka_poll(rk, 0);
                ts_sleep.tv_sec = (time_t)wait;
                ts_sleep.tv_nsec = (long)((wait - (double)ts_sleep.tv_sec) * 1e9);
                nanosleep(&ts_sleep, NULL);
            }
        }

        snprintf(id, sizeof(id), "%s%lld", o.id_prefix, i);
        if (o.tenant != NULL) {
            snprintf(tenant, sizeof(tenant), "%s", o.tenant);
        } else {
            snprintf(tenant, sizeof(tenant), "%s%lld", o.tenant_prefix, i % o.tenants);
        }
        rfc3339_now(ts, sizeof(ts));
        if (o.use_payload_file) {
            payload = o.payload_file;
            payload_len = o.payload_file_len;
        } else {
            payload_len = make_payload(payload_buf, payload_cap, i, o.payload_bytes);
            payload = payload_buf;
        }
        if (o.partitions > 0) {
            partition = (int32_t)(i % o.partitions);
        }

        hdrs = rd_kafka_headers_new(8 + (size_t)o.n_extra);
        add_header(hdrs, o.prefix, "specversion", "1.0");
        add_header(hdrs, o.prefix, "id", id);
        add_header(hdrs, o.prefix, "source", o.source);
        add_header(hdrs, o.prefix, "type", o.type);
        add_header(hdrs, o.prefix, "time", ts);
        add_header(hdrs, o.prefix, "tenantid", tenant);
        add_header(hdrs, NULL, "content-type", "application/json");
        for (int k = 0; k < o.n_extra; k++) {
            add_header(hdrs, NULL, o.extra[k].name, o.extra[k].value);
        }

        for (;;) {
            err = rd_kafka_producev(
                rk, RD_KAFKA_V_TOPIC(o.topic), RD_KAFKA_V_PARTITION(partition),
                RD_KAFKA_V_KEY(o.key_tenant ? tenant : NULL, o.key_tenant ? strlen(tenant) : 0),
                RD_KAFKA_V_VALUE((void *)payload, payload_len),
                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(hdrs),
                RD_KAFKA_V_END);
            if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                break;
            }
            /* Local queue full: serve delivery reports and try again. */
            rd_kafka_poll(rk, 50);
        }
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            /* On failure the headers were not taken over by librdkafka. */
            rd_kafka_headers_destroy(hdrs);
            tally.failed++;
            if (tally.errors_printed < 5) {
                fprintf(stderr, "hub-produce: produce failed: %s\n", rd_kafka_err2str(err));
                tally.errors_printed++;
            }
            continue;
        }
        produced++;
        if ((produced & 1023) == 0) {
            rd_kafka_poll(rk, 0);
        }
    }

    /* Wait for every outstanding delivery report. */
    while (rd_kafka_outq_len(rk) > 0) {
        rd_kafka_resp_err_t ferr = rd_kafka_flush(rk, 1000);
        if (ferr == RD_KAFKA_RESP_ERR__TIMED_OUT && !o.quiet) {
            fprintf(stderr, "hub-produce: waiting for %d delivery reports\n",
                    rd_kafka_outq_len(rk));
        }
    }
    elapsed = now_seconds() - t0;

    printf("produced %lld failed %lld seconds %.3f rate %.0f/s\n", tally.ok, tally.failed,
           elapsed, elapsed > 0 ? (double)tally.ok / elapsed : 0.0);
    fflush(stdout);

    rd_kafka_destroy(rk);
    free(payload_buf);
    options_free(&o);
    return tally.failed > 0 || tally.ok != o.count ? 1 : 0;
}
