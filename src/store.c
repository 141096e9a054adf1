/*
 * store — schema upkeep SQL (see store.h).
 */
#include "store.h"

/* Run hourly by the hub and once at start (hub.c), blocking or pooled. */
const struct hub_sql hub_sql_maintain_partitions = {
    "maintain_partitions",
    "SELECT hub_maintain_partitions($1::interval)",
    0,
};
