/*
 * pull_horizon — snapshots, the poller and the waits (see pull_horizon.h).
 *
 * A wait joins `next`, the pulls for the next snapshot.  A snapshot (the
 * sequence, then the holders) is sent when none is in flight; the waits
 * that came before it was sent go with it and become a round.  A round
 * without holders resolves at once; the others queue, oldest first, until
 * the poller finds all of one round's holders gone.  Rounds are taken in
 * order, so their sequences rise: resolving a round resolves every older
 * one with it.
 */
#include "pull_horizon.h"

#include <libpq-fe.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "error.h"
#include "hub.h"
#include "log.h"
#include "pg.h"
#include "sidecar.h"
#include "store_events.h"
#include "util.h"

/* The poller's pace while rounds wait: a little above a round trip, far
 * below an ingest transaction (docs/performance.md has the figures). */
#define HORIZON_POLL_MS 1
/* Rounds kept waiting at most; past it new pulls join the newest round
 * (its snapshot is older than they are, which is safe, only less fresh). */
#define HORIZON_ROUNDS_MAX 64
/* The most holders a snapshot keeps: far above the ingest connections of
 * any deployment; a longer list would be a sign of misuse, and is cut. */
#define HORIZON_HOLDERS_MAX 512

/* One pull waiting. */
struct waiter {
    hub_pull_horizon_cb cb;
    void *arg;
    uint64_t since_ns; /* when it started waiting (the holdback histogram) */
    struct waiter *next;
};

/* A snapshot whose holders may still be running. */
struct round {
    int64_t seq; /* S: the sequence's last value when it was taken */
    char **vx;   /* V: the holders' virtual transaction ids */
    size_t n_vx;
    uint64_t taken_ns;   /* when the snapshot came back */
    struct waiter *wait; /* the pulls it answers */
    struct round *next;  /* a newer round */
    uint64_t serial;     /* order of creation (poll_done) */
};

struct hub_pull_horizon {
    struct hub *hub;
    struct hub_pg *pg;       /* one connection: snapshots and polls */
    struct hub_sidecar side; /* one connection; timer 0 ticks every HORIZON_POLL_MS while
                              * anything waits */
    int64_t resolved;        /* every seq <= resolved is final */
    struct waiter *next;     /* waits for the next snapshot */
    struct waiter *sent;     /* waits of the snapshot in flight */
    int snapshot_inflight;   /* a snapshot transaction is out */
    int poll_inflight;       /* a poll transaction is out */
    uint64_t serials;        /* rounds made so far */
    uint64_t poll_serial;    /* the newest round the poll in flight asked about */
    struct round *rounds;    /* oldest first */
    struct round *last;
    size_t n_rounds;
    uint64_t logged_ns; /* the last expiry warning */
    int closing;
};

/* ---------------------------------------------------------- the waiters -- */

/* Answers a list of waits with horizon h and frees them. */
static void answer(struct hub_pull_horizon *z, struct waiter *w, int64_t h) {
    uint64_t now = hub_now_ns();

    while (w != NULL) {
        struct waiter *next = w->next;
        if (h >= 0) {
            hub_histogram_observe(&z->hub->metrics.pull_holdback_seconds,
                                  (double)(now - w->since_ns) / 1e9);
        }
        w->cb(w->arg, h);
        free(w);
        w = next;
    }
}

static void round_free(struct round *r) {
    for (size_t i = 0; i < r->n_vx; i++) {
        free(r->vx[i]);
    }
    free(r->vx);
    free(r);
}

/* Resolves the rounds from the oldest up to and including `upto` with the
 * horizon `h` (no lower than the one resolved), answering their waits. */
static void resolve_upto(struct hub_pull_horizon *z, struct round *upto, int64_t h) {
    if (h > z->resolved) {
        z->resolved = h;
    }
    while (z->rounds != NULL) {
        struct round *r = z->rounds;
        int last = r == upto;
        z->rounds = r->next;
        z->n_rounds--;
        if (z->rounds == NULL) {
            z->last = NULL;
        }
        answer(z, r->wait, z->resolved);
        round_free(r);
        if (last) {
            break;
        }
    }
}

/* ------------------------------------------------------- text[] values -- */

/* 1 when s is a virtual transaction id as pg_locks writes it ("5/123"):
 * only such text goes back into an array literal. */
static int vxid_valid(const char *s, size_t n) {
    size_t slash = 0;

    for (size_t i = 0; i < n; i++) {
        if (s[i] == '/') {
            slash++;
        } else if (s[i] < '0' || s[i] > '9') {
            return 0;
        }
    }
    return n > 2 && n < 32 && slash == 1;
}

/*
 * Splits a text[] rendered by PostgreSQL ("{5/2,4/7}", elements never
 * quoted for vxids) into *out (malloc'd strings).  Returns the count, or
 * HUB_ENOMEM.  Elements that are not vxids are skipped.
 */
static long vxids_parse(const char *text, char ***out) {
    size_t len = strlen(text);
    size_t n = 0;
    char **v;

    *out = NULL;
    if (len < 2 || text[0] != '{' || text[len - 1] != '}' || len == 2) {
        return 0;
    }
    v = calloc(HORIZON_HOLDERS_MAX, sizeof(*v));
    if (v == NULL) {
        return HUB_ENOMEM;
    }
    for (const char *p = text + 1; p < text + len - 1 && n < HORIZON_HOLDERS_MAX;) {
        const char *end = memchr(p, ',', (size_t)(text + len - 1 - p));
        size_t el = end != NULL ? (size_t)(end - p) : (size_t)(text + len - 1 - p);
        if (vxid_valid(p, el)) {
            v[n] = strndup(p, el);
            if (v[n] == NULL) {
                for (size_t i = 0; i < n; i++) {
                    free(v[i]);
                }
                free(v);
                return HUB_ENOMEM;
            }
            n++;
        }
        p += el + 1;
    }
    *out = v;
    return (long)n;
}

/* 1 when vx is an element of the text[] `still` ("{5/2,4/7}"). */
static int vxid_in(const char *still, const char *vx) {
    size_t n = strlen(vx);

    for (const char *p = strstr(still, vx); p != NULL; p = strstr(p + 1, vx)) {
        /* whole elements only: "5/2" is not in "{15/2,5/21}" */
        if ((p[-1] == '{' || p[-1] == ',') && (p[n] == ',' || p[n] == '}')) {
            return 1;
        }
    }
    return 0;
}

/* ----------------------------------------------------------- the poller -- */

static void snapshot_send(struct hub_pull_horizon *z);
static void poll_send(struct hub_pull_horizon *z);

/* 1 while anything waits: a round, the snapshot in flight, or pulls for
 * the next one. */
static int waiting(const struct hub_pull_horizon *z) {
    return z->rounds != NULL || z->sent != NULL || z->next != NULL;
}

/* Takes out of *list the waits that started before cutoff_ns (oldest
 * first, so they are a prefix) and answers them with the resolved horizon. */
static size_t expire_waits(struct hub_pull_horizon *z, struct waiter **list, uint64_t cutoff_ns) {
    struct waiter *old = NULL, **tail = &old;
    size_t n = 0;

    while (*list != NULL && (*list)->since_ns <= cutoff_ns) {
        struct waiter *w = *list;
        *list = w->next;
        w->next = NULL;
        *tail = w;
        tail = &w->next;
        n++;
    }
    answer(z, old, z->resolved);
    return n;
}

/*
 * What has waited STREAMING_HUB_PULL_HOLD_MAX gets the resolved horizon:
 * rounds whose holders still run (a stuck ingest transaction, or a session
 * holding the lock), and waits whose snapshot has not come back (the
 * poller's connection is down).  Also refreshes the oldest-hold gauge.
 */
static void expire(struct hub_pull_horizon *z) {
    uint64_t now = hub_now_ns();
    uint64_t max_ns = (uint64_t)z->hub->cfg.pull_hold_max_ms * 1000000ULL;
    struct round *upto = NULL;
    size_t expired = 0;

    for (struct round *r = z->rounds; r != NULL && now - r->taken_ns >= max_ns; r = r->next) {
        upto = r;
        for (struct waiter *w = r->wait; w != NULL; w = w->next) {
            expired++;
        }
    }
    if (upto != NULL) {
        resolve_upto(z, upto, z->resolved); /* not advanced: its holders still run */
    }
    if (now > max_ns) {
        expired += expire_waits(z, &z->sent, now - max_ns);
        expired += expire_waits(z, &z->next, now - max_ns);
    }
    if (expired > 0) {
        /* at most one line a minute: a stuck holder keeps expiring rounds */
        if (z->logged_ns == 0 || now - z->logged_ns > 60ULL * 1000000000ULL) {
            z->logged_ns = now;
            hub_log(HUB_WARN,
                    "pulls answered below a horizon still held: an ingest transaction (or a "
                    "session holding the pull hold) ran past STREAMING_HUB_PULL_HOLD_MAX, or "
                    "the database did not answer",
                    HUB_LI("pulls", (int64_t)expired));
        }
        z->hub->metrics.pull_holdback_timeouts += expired;
    }
    z->hub->metrics.pull_holdback_oldest_ms =
        z->rounds != NULL ? (int64_t)((now - z->rounds->taken_ns) / 1000000ULL) : 0;
}

/* Every HORIZON_POLL_MS while anything waits: the deadlines, then a poll
 * unless one is out. */
static void tick_cb(uv_timer_t *t) {
    struct hub_pull_horizon *z = t->data;

    expire(z);
    if (z->rounds != NULL && !z->poll_inflight) {
        poll_send(z);
    }
    if (!waiting(z)) {
        uv_timer_stop(&z->side.timer[0]);
    }
}

/* Starts the ticks when something waits. */
static void tick_start(struct hub_pull_horizon *z) {
    if (!z->closing && waiting(z) && !uv_is_active((uv_handle_t *)&z->side.timer[0])) {
        uv_timer_start(&z->side.timer[0], tick_cb, HORIZON_POLL_MS, HORIZON_POLL_MS);
    }
}

/* The poll came back: the newest round none of whose holders is left
 * resolves, with every older one.  A failed poll is simply sent again at
 * the next tick; the deadline bounds the wait. */
static void poll_done(void *arg, const struct hub_pg_outcome *out) {
    struct hub_pull_horizon *z = arg;
    PGresult *r = out->n_results > 0 ? out->results[0] : NULL;
    struct round *free_upto = NULL;

    z->poll_inflight = 0;
    if (z->closing || out->status != HUB_PG_OK || r == NULL || PQntuples(r) != 1) {
        return;
    }
    const char *still = PQgetvalue(r, 0, HUB_PULL_STILL_COL_VXIDS);
    /* Only the rounds the poll asked about: a round made while it was out
     * (its snapshot queued ahead of it on the connection) has holders the
     * poll never looked for, and their absence from `still` says nothing. */
    for (struct round *rd = z->rounds; rd != NULL && rd->serial <= z->poll_serial; rd = rd->next) {
        int held = 0;
        for (size_t i = 0; i < rd->n_vx && !held; i++) {
            held = vxid_in(still, rd->vx[i]);
        }
        if (!held) {
            free_upto = rd; /* keep looking: a newer one may be free too */
        }
    }
    if (free_upto != NULL) {
        resolve_upto(z, free_upto, free_upto->seq);
    }
}

/* One poll: which of the holders of every waiting round still hold. */
static void poll_send(struct hub_pull_horizon *z) {
    size_t len = 3;
    char *list;
    char *p;
    struct hub_pg_txn *txn;

    for (struct round *r = z->rounds; r != NULL; r = r->next) {
        for (size_t i = 0; i < r->n_vx; i++) {
            len += strlen(r->vx[i]) + 1;
        }
    }
    list = malloc(len);
    txn = list != NULL ? hub_pg_txn_new(z->side.pg, poll_done, z) : NULL;
    if (txn == NULL) {
        free(list);
        return; /* the next tick tries again */
    }
    /* the union of the rounds' holders as a text[] literal; repeats are
     * harmless to "= ANY" */
    p = list;
    *p++ = '{';
    for (struct round *r = z->rounds; r != NULL; r = r->next) {
        for (size_t i = 0; i < r->n_vx; i++) {
            size_t n = strlen(r->vx[i]);
            if (p > list + 1) {
                *p++ = ',';
            }
            memcpy(p, r->vx[i], n);
            p += n;
        }
    }
    *p++ = '}';
    *p = '\0';
    const char *params[HUB_SQL_PULL_STILL_NPARAMS] = {list};
    hub_pg_txn_add(txn, &hub_sql_pull_still, HUB_SQL_PULL_STILL_NPARAMS, params, NULL, NULL);
    free(list); /* copied by the transaction */
    z->poll_inflight = 1;
    z->poll_serial = z->serials;
    hub_pg_txn_submit(txn);
}

/* --------------------------------------------------------- the snapshot -- */

/* The snapshot came back: its waits become a round, resolved at once
 * when nothing held the hold. */
static void snapshot_done(void *arg, const struct hub_pg_outcome *out) {
    struct hub_pull_horizon *z = arg;
    struct waiter *w = z->sent;
    PGresult *rs = out->n_results > 0 ? out->results[0] : NULL;
    PGresult *rh = out->n_results > 1 ? out->results[1] : NULL;
    struct round *r;
    long n;

    z->snapshot_inflight = 0;
    z->sent = NULL;
    if (z->closing) {
        answer(z, w, -1);
        return;
    }
    if (out->status != HUB_PG_OK || rs == NULL || rh == NULL || PQntuples(rs) != 1 ||
        PQntuples(rh) != 1) {
        /* the database did not answer: the horizon resolved so far is
         * still safe (the page's own query will tell the client if the
         * database is gone) */
        answer(z, w, z->resolved);
        snapshot_send(z);
        return;
    }
    r = calloc(1, sizeof(*r));
    n = r != NULL ? vxids_parse(PQgetvalue(rh, 0, HUB_PULL_HOLDERS_COL_VXIDS), &r->vx) : HUB_ENOMEM;
    if (n < 0) {
        free(r);
        answer(z, w, z->resolved);
        snapshot_send(z);
        return;
    }
    r->n_vx = (size_t)n;
    r->serial = ++z->serials;
    r->seq = strtoll(PQgetvalue(rs, 0, HUB_PULL_SEQ_COL_LAST), NULL, 10);
    r->taken_ns = hub_now_ns();
    r->wait = w;
    z->hub->metrics.pull_horizon_lag = r->seq > z->resolved ? r->seq - z->resolved : 0;
    /* queued behind the older rounds even when free: resolving it resolves
     * them too, and their holders (a subset of its own or gone) are */
    if (z->last != NULL) {
        z->last->next = r;
    } else {
        z->rounds = r;
    }
    z->last = r;
    z->n_rounds++;
    if (r->n_vx == 0) {
        resolve_upto(z, r, r->seq);
    }
    snapshot_send(z);
    tick_start(z);
}

/* Sends a snapshot for the waits in `next`, unless one is in flight (its
 * callback sends the next).  With HORIZON_ROUNDS_MAX rounds waiting, the
 * waits join the newest round instead. */
static void snapshot_send(struct hub_pull_horizon *z) {
    struct hub_pg_txn *txn;

    if (z->next == NULL || z->snapshot_inflight || z->closing) {
        return;
    }
    if (z->n_rounds >= HORIZON_ROUNDS_MAX) {
        struct waiter **tail = &z->last->wait;
        while (*tail != NULL) {
            tail = &(*tail)->next;
        }
        *tail = z->next;
        z->next = NULL;
        return;
    }
    txn = hub_pg_txn_new(z->side.pg, snapshot_done, z);
    if (txn == NULL) {
        struct waiter *w = z->next;
        z->next = NULL;
        answer(z, w, z->resolved);
        return;
    }
    /* two statements in this order: the sequence, then the holders */
    hub_pg_txn_add(txn, &hub_sql_pull_seq, 0, NULL, NULL, NULL);
    hub_pg_txn_add(txn, &hub_sql_pull_holders, 0, NULL, NULL, NULL);
    z->sent = z->next;
    z->next = NULL;
    z->snapshot_inflight = 1;
    hub_pg_txn_submit(txn);
}

/* ------------------------------------------------------------ lifecycle -- */

/* The state, created on the first pull with a connection of its own (so
 * that polls never queue behind API statements).  NULL on OOM. */
static struct hub_pull_horizon *horizon_get(struct hub *hub) {
    struct hub_pull_horizon *z = hub->pull_horizon;

    if (z != NULL) {
        return z->closing ? NULL : z;
    }
    z = calloc(1, sizeof(*z));
    if (z == NULL) {
        return NULL;
    }
    z->hub = hub;
    if (hub_sidecar_open(&z->side, hub, "streaming-hub-pull", 1, z) != 0) {
        free(z);
        return NULL;
    }
    hub->pull_horizon = z;
    return z;
}

int hub_pull_horizon_wait(struct hub *hub, hub_pull_horizon_cb cb, void *arg) {
    struct hub_pull_horizon *z = horizon_get(hub);
    struct waiter *w;

    if (z == NULL || (w = calloc(1, sizeof(*w))) == NULL) {
        return HUB_ENOMEM;
    }
    w->cb = cb;
    w->arg = arg;
    w->since_ns = hub_now_ns();
    /* newest last, so that pulls are answered in the order they came */
    struct waiter **tail = &z->next;
    while (*tail != NULL) {
        tail = &(*tail)->next;
    }
    *tail = w;
    snapshot_send(z);
    tick_start(z);
    return 0;
}

/* The sidecar is closed: nothing refers to the state any more. */
static void horizon_closed(void *owner) {
    free(owner);
}

void hub_pull_horizon_free(struct hub *hub) {
    struct hub_pull_horizon *z = hub->pull_horizon;

    if (z == NULL) {
        return;
    }
    hub->pull_horizon = NULL;
    z->closing = 1;
    answer(z, z->next, -1);
    z->next = NULL;
    while (z->rounds != NULL) {
        struct round *r = z->rounds;
        z->rounds = r->next;
        answer(z, r->wait, -1);
        round_free(r);
    }
    z->last = NULL;
    /* a snapshot in flight fails as the pool closes: its callback answers
     * its waits with -1 (closing is set) */
    hub_sidecar_close(&z->side, horizon_closed);
}
