/*
 * kafka — librdkafka configuration shared by every client of the hub, and
 * the embedded mock cluster (STREAMING_HUB_KAFKA_BROKERS=embedded and the
 * `kafka-mock` command).
 */
#ifndef HUB_KAFKA_H
#define HUB_KAFKA_H

#include <librdkafka/rdkafka.h>
#include <stddef.h>

#include "config.h"

/*
 * A new client configuration with bootstrap.servers = brokers and the
 * SCRAM/TLS settings of cfg.  Returns owned conf, or NULL with err filled.
 */
rd_kafka_conf_t *hub_kafka_conf_new(const struct hub_config *cfg, const char *brokers, char *err,
                                    size_t errsz);

/* librdkafka's log callback: its lines as the hub's JSON log lines (errors
 * and warnings as such, notices and below at debug).  Without it librdkafka
 * prints its own format on stderr. */
void hub_kafka_log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf);

/* Subscription list from STREAMING_HUB_KAFKA_TOPICS: one regex (starting with
 * '^') or a comma-separated list.  Returns owned list, NULL when empty. */
rd_kafka_topic_partition_list_t *hub_kafka_topic_list(const char *topics);

struct hub_kafka_mock;

/* A topic to create up front: "name:partitions". */
struct hub_kafka_topic_spec {
    const char *name;
    int partitions;
};

/*
 * Starts librdkafka's mock cluster with `brokers` brokers on loopback and
 * creates the given topics; writes the bootstrap list (one line) to
 * <data_dir>/kafka.bootstrap.  Returns NULL (logged) on failure.
 * Mock limits: each partition keeps only a few MiB (older records are dropped
 * silently), nothing is persisted, no transactions.
 */
struct hub_kafka_mock *hub_kafka_mock_start(int brokers, const char *data_dir,
                                            const struct hub_kafka_topic_spec *topics,
                                            size_t n_topics);

/* The bootstrap list ("127.0.0.1:port,..."), owned by the mock. */
const char *hub_kafka_mock_bootstraps(const struct hub_kafka_mock *mock);

void hub_kafka_mock_stop(struct hub_kafka_mock *mock);

/* The `kafka-mock` command: runs the cluster until SIGINT/SIGTERM. */
int hub_kafka_mock_main(int argc, char **argv);

#endif
