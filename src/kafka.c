/*
 * kafka — shared client configuration and the embedded mock cluster.
 */
#include "kafka.h"

#include <librdkafka/rdkafka_mock.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

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
    if (sasl && (rd_kafka_conf_set(conf, "sasl.mechanisms", cfg->kafka_scram_mechanism, err,
                                   errsz) ||
                 (cfg->kafka_scram_username &&
                  rd_kafka_conf_set(conf, "sasl.username", cfg->kafka_scram_username, err,
                                    errsz)) ||
                 (cfg->kafka_scram_password &&
                  rd_kafka_conf_set(conf, "sasl.password", cfg->kafka_scram_password, err,
                                    errsz)))) {
        goto fail;
    }
    if (cfg->kafka_ca_cert &&
        rd_kafka_conf_set(conf, "ssl.ca.location", cfg->kafka_ca_cert, err, errsz)) {
        goto fail;
    }
    return conf;

fail:
    rd_kafka_conf_destroy(conf);
    return NULL;
}

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

struct hub_kafka_mock {
    rd_kafka_t *rk; /* the client handle that hosts the cluster's threads */
    rd_kafka_mock_cluster_t *mcluster;
    char *bootstraps;
};

void hub_kafka_log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
    enum hub_log_level l = level <= 3 ? HUB_ERROR : level <= 4 ? HUB_WARN : HUB_DEBUG;

    (void)rk;
    hub_log(l, "librdkafka", HUB_LS("facility", fac), HUB_LS("detail", buf));
}

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
    if (hub_mkdir_p(data_dir) != 0) {
        hub_log(HUB_ERROR, "cannot create the data dir", HUB_LS("dir", data_dir));
        goto fail;
    }
    snprintf(path, sizeof(path), "%s/kafka.bootstrap", data_dir);
    snprintf(line, sizeof(line), "%s\n", mock->bootstraps);
    if (hub_write_file(path, line, strlen(line), 0644) != 0) {
        hub_log(HUB_ERROR, "cannot write the bootstrap file", HUB_LS("path", path));
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

static volatile sig_atomic_t mock_stop_requested;

static void mock_on_signal(int sig) {
    (void)sig;
    mock_stop_requested = 1;
}

int hub_kafka_mock_main(int argc, char **argv) {
    struct hub_kafka_topic_spec topics[64];
    size_t n_topics = 0;
    int brokers = 1;
    const char *data_dir = getenv("STREAMING_HUB_DATA_DIR");
    struct hub_kafka_mock *mock;

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
                    "list to $STREAMING_HUB_DATA_DIR/kafka.bootstrap (default ./var).\n");
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
    printf("%s\n", mock->bootstraps);
    fflush(stdout);
    signal(SIGINT, mock_on_signal);
    signal(SIGTERM, mock_on_signal);
    while (!mock_stop_requested) {
        pause();
    }
    hub_log(HUB_INFO, "embedded kafka stopping");
    hub_kafka_mock_stop(mock);
    return 0;
}
