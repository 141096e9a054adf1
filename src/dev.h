/*
 * dev — `streaming-hub dev`: a private PostgreSQL under the data dir (a
 * child process, stopped on exit), the embedded Kafka cluster, migrations,
 * and a generated admin token and KEK kept in <data dir>/dev.env.
 */
#ifndef HUB_DEV_H
#define HUB_DEV_H

int hub_dev_main(int argc, char **argv);

#endif
