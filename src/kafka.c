/*
 * kafka — shared client configuration and the embedded mock cluster (see
 * kafka.h).
 *
 * The mock cluster is librdkafka's own (rdkafka_mock.h): brokers on
 * loopback ports, run by the threads of a client handle made only to host
 * them.  It speaks the Kafka protocol, so the hub's consumer, kcat and the
 * test producer talk to it as to a real cluster.  `streaming-hub
 * kafka-mock` runs one in the foreground for tests and demos; tests take
 * its brokers down and bring them back with SIGUSR1 and SIGUSR2 (readiness
 * tests: the cluster keeps its port and its records meanwhile, which
 * stopping and starting it again would not).
 */
#include "kafka.h"

#include <errno.h>
#include <librdkafka/rdkafka_mock.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

/* The security protocol follows from the two settings: SASL (a SCRAM
 * mechanism set) and/or TLS; neither is librdkafka's PLAINTEXT default. */
rd_kafka_conf_t *hub_kafka_conf_new(const struct hub_config *cfg, const char *brokers, char *err,
                                    size_t errsz) {
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    const char *protocol = NULL;
    int sasl = cfg->kafka_scram_mechanism != NULL;

    if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, errsz) ||
        rd_kafka_conf_set(conf, "client.id", "streaming-hub", err, errsz)) {
        goto fail;
    }
    if (sasl && cfg->kafka_tls_enabled) {
        protocol = "SASL_SSL";
    } else if (sasl) {
        protocol = "SASL_PLAINTEXT";
    } else if (cfg->kafka_tls_enabled) {
        protocol = "SSL";
    }
    if (protocol && rd_kafka_conf_set(conf, "security.protocol", protocol, err, errsz)) {
        goto fail;
    }
    /* the user name and password are optional to librdkafka (an OAuth or
     * Kerberos set-up would not use them); SCRAM brokers refuse without */
    if (sasl &&
        (rd_kafka_conf_set(conf, "sasl.mechanisms", cfg->kafka_scram_mechanism, err, errsz) ||
         (cfg->kafka_scram_username &&
          rd_kafka_conf_set(conf, "sasl.username", cfg->kafka_scram_username, err, errsz)) ||
         (cfg->kafka_scram_password &&
          rd_kafka_conf_set(conf, "sasl.password", cfg->kafka_scram_password, err, errsz)))) {
        goto fail;
    }
    /* without a CA file librdkafka verifies brokers against the system
     * bundle */
    if (cfg->kafka_ca_cert &&
        rd_kafka_conf_set(conf, "ssl.ca.location", cfg->kafka_ca_cert, err, errsz)) {
        goto fail;
    }
    return conf;

fail:
    rd_kafka_conf_destroy(conf);
    return NULL;
}

/* A regex is librdkafka's own subscription syntax (a topic name starting
 * with '^'); a list is split on commas and blanks. */
rd_kafka_topic_partition_list_t *hub_kafka_topic_list(const char *topics) {
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(4);
    char *copy, *save = NULL;

    if (topics == NULL || *topics == '\0') {
        rd_kafka_topic_partition_list_destroy(l);
        return NULL;
    }
    if (topics[0] == '^') {
        rd_kafka_topic_partition_list_add(l, topics, RD_KAFKA_PARTITION_UA);
        return l;
    }
    copy = strdup(topics);
    for (char *t = strtok_r(copy, ", ", &save); t != NULL; t = strtok_r(NULL, ", ", &save)) {
        rd_kafka_topic_partition_list_add(l, t, RD_KAFKA_PARTITION_UA);
    }
    free(copy);
    if (l->cnt == 0) {
        rd_kafka_topic_partition_list_destroy(l);
        return NULL;
    }
    return l;
}

/* The embedded cluster: owned by hub_kafka_mock_start's caller until
 * hub_kafka_mock_stop. */
struct hub_kafka_mock {
    rd_kafka_t *rk; /* the client handle that hosts the cluster's threads */
    rd_kafka_mock_cluster_t *mcluster;
    char *bootstraps;
};

/* syslog levels: 0-3 are errors, 4 warnings, the rest (notice, info,
 * debug) are librdkafka's chatter, kept for debug. */
void hub_kafka_log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
    enum hub_log_level l = level <= 3 ? HUB_ERROR : level <= 4 ? HUB_WARN : HUB_DEBUG;

    (void)rk;
    hub_log(l, "librdkafka", HUB_LS("facility", fac), HUB_LS("detail", buf));
}

/*
 * Steps: the host handle, the cluster, the topics asked for (replicated on
 * up to three brokers), then the bootstrap file, which is how other
 * processes find the cluster.  A failing step logs why, with errno for the
 * file system ones, and undoes the others (hub_kafka_mock_stop is safe on
 * a half-made mock).
 */
struct hub_kafka_mock *hub_kafka_mock_start(int brokers, const char *data_dir,
                                            const struct hub_kafka_topic_spec *topics,
                                            size_t n_topics) {
    struct hub_kafka_mock *mock = calloc(1, sizeof(*mock));
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    char err[256], path[4096], line[1024];

    if (mock == NULL) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    rd_kafka_conf_set(conf, "client.id", "streaming-hub-mock", err, sizeof(err));
    rd_kafka_conf_set_log_cb(conf, hub_kafka_log_cb);
    mock->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    if (mock->rk == NULL) {
        hub_log(HUB_ERROR, "embedded kafka: cannot create host handle", HUB_LS("error", err));
        rd_kafka_conf_destroy(conf);
        free(mock);
        return NULL;
    }
    mock->mcluster = rd_kafka_mock_cluster_new(mock->rk, brokers);
    if (mock->mcluster == NULL) {
        hub_log(HUB_ERROR, "embedded kafka: cannot start the mock cluster");
        goto fail;
    }
    for (size_t i = 0; i < n_topics; i++) {
        rd_kafka_resp_err_t e = rd_kafka_mock_topic_create(
            mock->mcluster, topics[i].name, topics[i].partitions, brokers < 3 ? brokers : 3);
        if (e) {
            hub_log(HUB_ERROR, "embedded kafka: cannot create topic",
                    HUB_LS("topic", topics[i].name), HUB_LS("error", rd_kafka_err2str(e)));
            goto fail;
        }
    }
    mock->bootstraps = strdup(rd_kafka_mock_cluster_bootstraps(mock->mcluster));
    /* the data dir may be on a read-only root (the container image): the
     * log line then names the cause, not only the path */
    errno = 0;
    if (hub_mkdir_p(data_dir) != 0) {
        /* errno names the cause: "Read-only file system" for a data dir on a
         * read-only root (STREAMING_HUB_DATA_DIR must point at a writable one) */
        hub_log(HUB_ERROR, "cannot create the data dir", HUB_LS("dir", data_dir),
                HUB_LI("errno", errno),
                HUB_LS("error", errno != 0 ? strerror(errno) : "path empty or too long"));
        goto fail;
    }
    snprintf(path, sizeof(path), "%s/kafka.bootstrap", data_dir);
    snprintf(line, sizeof(line), "%s\n", mock->bootstraps);
    errno = 0;
    if (hub_write_file(path, line, strlen(line), 0644) != 0) {
        hub_log(HUB_ERROR, "cannot write the bootstrap file", HUB_LS("path", path),
                HUB_LI("errno", errno), HUB_LS("error", errno != 0 ? strerror(errno) : "failed"));
        goto fail;
    }
    hub_log(HUB_INFO, "embedded kafka started", HUB_LS("bootstrap", mock->bootstraps),
            HUB_LS("bootstrap_file", path), HUB_LI("brokers", brokers));
    return mock;

fail:
    hub_kafka_mock_stop(mock);
    return NULL;
}

const char *hub_kafka_mock_bootstraps(const struct hub_kafka_mock *mock) {
    return mock->bootstraps;
}

/* The cluster goes before its host handle: its threads run on it. */
void hub_kafka_mock_stop(struct hub_kafka_mock *mock) {
    if (mock == NULL) {
        return;
    }
    if (mock->mcluster) {
        rd_kafka_mock_cluster_destroy(mock->mcluster);
    }
    rd_kafka_destroy(mock->rk);
    free(mock->bootstraps);
    free(mock);
}

/* The kafka-mock command's signal flags: the handler only sets them, the
 * main loop of hub_kafka_mock_main acts. */
static volatile sig_atomic_t mock_stop_requested;
/* SIGUSR1 takes every broker down, SIGUSR2 brings them back (tests of
 * readiness: the cluster keeps its port and its records meanwhile). */
static volatile sig_atomic_t mock_down_requested;
static volatile sig_atomic_t mock_up_requested;

static void mock_on_signal(int sig) {
    if (sig == SIGUSR1) {
        mock_down_requested = 1;
    } else if (sig == SIGUSR2) {
        mock_up_requested = 1;
    } else {
        mock_stop_requested = 1;
    }
}

/* Every broker of the mock down (connections closed, new ones refused) or up. */
static void mock_set_brokers(struct hub_kafka_mock *mock, int brokers, int up) {
    for (int id = 1; id <= brokers; id++) {
        rd_kafka_resp_err_t e = up ? rd_kafka_mock_broker_set_up(mock->mcluster, id)
                                   : rd_kafka_mock_broker_set_down(mock->mcluster, id);
        if (e) {
            hub_log(HUB_WARN, "embedded kafka: cannot change a broker's state",
                    HUB_LI("broker", id), HUB_LS("error", rd_kafka_err2str(e)));
        }
    }
    hub_log(HUB_INFO, up ? "embedded kafka: brokers up" : "embedded kafka: brokers down",
            HUB_LI("brokers", brokers));
}

/*
 * `streaming-hub kafka-mock [--brokers N] [--topic NAME:PARTITIONS]...`:
 * prints the bootstrap list on stdout (and writes it to the data dir), then
 * waits for signals: SIGINT/SIGTERM stop it (exit 0), SIGUSR1 takes every
 * broker down, SIGUSR2 brings them back.  Exit 2 on bad arguments, 1 when
 * the cluster cannot start.
 */
int hub_kafka_mock_main(int argc, char **argv) {
    struct hub_kafka_topic_spec topics[64];
    size_t n_topics = 0;
    int brokers = 1;
    const char *data_dir = getenv("STREAMING_HUB_DATA_DIR");
    struct hub_kafka_mock *mock;

    /* arguments: --brokers N (1..16), and any number of --topic NAME:N to
     * create up front (the mock creates others on first use, with four
     * partitions) */
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--brokers") == 0 && i + 1 < argc) {
            brokers = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--topic") == 0 && i + 1 < argc && n_topics < 64) {
            char *spec = argv[++i];
            char *colon = strrchr(spec, ':');
            int parts = colon ? atoi(colon + 1) : 4;
            if (colon) {
                *colon = '\0';
            }
            if (*spec == '\0' || parts < 1) {
                fprintf(stderr, "kafka-mock: --topic wants NAME:PARTITIONS\n");
                return 2;
            }
            topics[n_topics++] = (struct hub_kafka_topic_spec){spec, parts};
        } else {
            fprintf(stderr,
                    "usage: streaming-hub kafka-mock [--brokers N] [--topic NAME:PARTITIONS]...\n"
                    "Runs librdkafka's mock cluster in the foreground and writes its bootstrap\n"
                    "list to $STREAMING_HUB_DATA_DIR/kafka.bootstrap (default ./var).\n"
                    "SIGUSR1 takes every broker down, SIGUSR2 brings them back up.\n");
            return 2;
        }
    }
    if (brokers < 1 || brokers > 16) {
        fprintf(stderr, "kafka-mock: --brokers must be 1..16\n");
        return 2;
    }
    mock = hub_kafka_mock_start(brokers, data_dir ? data_dir : "./var", topics, n_topics);
    if (mock == NULL) {
        return 1;
    }
    /* stdout is the bootstrap list alone (SPEC §2.1): a script reads it */
    printf("%s\n", mock->bootstraps);
    fflush(stdout);
    /* the signals stay blocked but inside sigsuspend, so none arrives
     * between a look at the flags and the wait */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGUSR1);
    sigaddset(&block, SIGUSR2);
    sigprocmask(SIG_BLOCK, &block, &old);
    signal(SIGINT, mock_on_signal);
    signal(SIGTERM, mock_on_signal);
    signal(SIGUSR1, mock_on_signal);
    signal(SIGUSR2, mock_on_signal);
    /* Each broker-state request is served on this thread, outside the
     * handler: librdkafka's mock calls are not async-signal-safe. */
    while (!mock_stop_requested) {
        if (!mock_down_requested && !mock_up_requested) {
            sigsuspend(&old);
        }
        if (mock_down_requested) {
            mock_down_requested = 0;
            mock_set_brokers(mock, brokers, 0);
        }
        if (mock_up_requested) {
            mock_up_requested = 0;
            mock_set_brokers(mock, brokers, 1);
        }
    }
    hub_log(HUB_INFO, "embedded kafka stopping");
    hub_kafka_mock_stop(mock);
    return 0;
}
