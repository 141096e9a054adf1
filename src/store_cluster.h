/*
 * store_cluster — the SQL of process membership (cluster.h): the
 * hub_processes table of migration 0012.  Parameters are text; results
 * are text.  The statement objects are static and compared by address by
 * pg.c.
 */
#ifndef HUB_STORE_CLUSTER_H
#define HUB_STORE_CLUSTER_H

#include "pg.h"

/*
 * The heartbeat: upserts this process's row (seen now), drops rows not
 * seen for an hour (crashed processes), and counts the live ones.
 *   $1 id (text, unique per process)  $2 role  $3 host  $4 pid (int4)
 *   $5 member timeout (ms, int8): rows seen within it are live
 * One row: HUB_CLUSTER_COL_LIVE, the live processes, this one included
 * (int8 text, >= 1); HUB_CLUSTER_COL_DISPATCHERS, those of them that
 * deliver (roles all and delivery), this one included if it does.
 */
#define HUB_SQL_CLUSTER_HEARTBEAT_NPARAMS 5
extern const struct hub_sql hub_sql_cluster_heartbeat;
enum hub_cluster_heartbeat_col { HUB_CLUSTER_COL_LIVE, HUB_CLUSTER_COL_DISPATCHERS };

/* $1 id: deletes this process's row (a clean stop).  No rows. */
#define HUB_SQL_CLUSTER_LEAVE_NPARAMS 1
extern const struct hub_sql hub_sql_cluster_leave;

#endif
