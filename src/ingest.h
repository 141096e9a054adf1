/*
 * ingest — reads CloudEvents from Kafka and decides their verdicts (SPEC §3).
 *
 * A librdkafka consumer in a consumer group, served on the hub's loop: the
 * consumer queue signals a pipe that a uv_poll_t watches, so records are
 * taken on the loop thread and nothing here needs a lock.
 *
 * Records are grouped per partition.  Each partition has at most one batch
 * in flight to PostgreSQL (one transaction); its offset is committed only
 * after that transaction committed.  Records that arrive meanwhile wait in
 * the partition's pending list and form the next batch; a partition with too
 * much pending work, or whose batch keeps failing, is paused so memory stays
 * bounded while the other partitions go on.
 */
#ifndef HUB_INGEST_H
#define HUB_INGEST_H

struct hub;
struct hub_ingest;

/*
 * Creates the consumer for hub->brokers / hub->cfg and subscribes it.
 * Returns 0 and stores *out, or -1 (logged).  Borrows hub until freed.
 */
int hub_ingest_start(struct hub *hub, struct hub_ingest **out);

/*
 * Stops taking records, lets in-flight batches finish (their offsets are
 * committed), then leaves the group and frees everything.  done_cb runs on
 * the loop once that is complete.
 */
void hub_ingest_stop(struct hub_ingest *ing, void (*done_cb)(void *arg), void *arg);

/* 1 once the consumer joined its group (an assignment, even empty, arrived). */
int hub_ingest_ready(const struct hub_ingest *ing);

/* Figures for gauges. */
int hub_ingest_assigned(const struct hub_ingest *ing);
int hub_ingest_paused(const struct hub_ingest *ing);
long hub_ingest_pending(const struct hub_ingest *ing);

#endif
