/*
 * sidecar — a module's own database connection and timers, and closing
 * them together.
 *
 * The pull horizon (pull_horizon.c), the per-tenant counts (stats.c) and
 * the cluster heartbeat (cluster.c) each run small statements on a
 * connection of their own, so that they never queue behind API or ingest
 * work, and each must close that connection and its timers before it frees
 * itself.  A struct hub_sidecar is embedded in its owner; the owner frees
 * itself in the `closed` callback, once every handle is closed.
 *
 * Loop thread only.
 */
#ifndef HUB_SIDECAR_H
#define HUB_SIDECAR_H

#include <uv.h>

struct hub;
struct hub_pg;

#define HUB_SIDECAR_TIMERS_MAX 2

struct hub_sidecar {
    struct hub_pg *pg;                        /* one connection */
    uv_timer_t timer[HUB_SIDECAR_TIMERS_MAX]; /* their data is the owner */
    int n_timers;
    int closing; /* hub_sidecar_close ran */
    int pending; /* handles still closing */
    void (*closed)(void *owner);
    void *owner;
};

/*
 * Opens a pool of one connection named `name` (application_name) and
 * n_timers (<= HUB_SIDECAR_TIMERS_MAX) timers whose data is owner.
 * Returns 0, or HUB_ENOMEM with nothing to close.
 */
int hub_sidecar_open(struct hub_sidecar *sc, struct hub *hub, const char *name, int n_timers,
                     void *owner);

/*
 * Stops and closes the timers and the pool: transactions still queued or in
 * flight fail (ECLOSED, ECONN) through their callbacks, possibly before
 * this returns.  closed(owner) runs once everything is closed; the owner
 * may free itself (and sc with it) there.  A second call does nothing.
 */
void hub_sidecar_close(struct hub_sidecar *sc, void (*closed)(void *owner));

#endif
