/*
 * sidecar — a module's own connection and timers (see sidecar.h).
 */
#include "sidecar.h"

#include "error.h"
#include "hub.h"
#include "pg.h"

int hub_sidecar_open(struct hub_sidecar *sc, struct hub *hub, const char *name, int n_timers,
                     void *owner) {
    sc->pg = hub_pg_new(hub->loop, hub->cfg.postgres_dsn, 1, name, NULL);
    if (sc->pg == NULL) {
        return HUB_ENOMEM;
    }
    sc->n_timers = n_timers < HUB_SIDECAR_TIMERS_MAX ? n_timers : HUB_SIDECAR_TIMERS_MAX;
    sc->owner = owner;
    for (int i = 0; i < sc->n_timers; i++) {
        uv_timer_init(hub->loop, &sc->timer[i]);
        sc->timer[i].data = owner;
    }
    return 0;
}

/* One handle (a timer, or the pool) is closed; the last one hands the
 * owner its `closed` callback, after which sc may be gone. */
static void sidecar_one_closed(struct hub_sidecar *sc) {
    if (--sc->pending == 0) {
        sc->closed(sc->owner);
    }
}

static void sidecar_timer_closed(uv_handle_t *h) {
    sidecar_one_closed(h->data);
}

static void sidecar_pool_closed(void *arg) {
    sidecar_one_closed(arg);
}

void hub_sidecar_close(struct hub_sidecar *sc, void (*closed)(void *owner)) {
    if (sc->closing) {
        return;
    }
    sc->closing = 1;
    sc->closed = closed;
    /* the timers and the pool, counted before any of them can complete */
    sc->pending = sc->n_timers + 1;
    for (int i = 0; i < sc->n_timers; i++) {
        uv_timer_stop(&sc->timer[i]);
        sc->timer[i].data = sc; /* no timer callback runs any more */
        uv_close((uv_handle_t *)&sc->timer[i], sidecar_timer_closed);
    }
    hub_pg_close(sc->pg, sidecar_pool_closed, sc);
}
