/*
 * dispatch_caps — slots per destination origin and per (tenant, origin)
 * lane, and each lane's adaptive limit (see dispatch_caps.h).
 *
 * Two chained hash tables share one set of helpers (struct cap_entry heads
 * both kinds of entry): origins by id, lanes by (tenant, origin id).  A lane
 * points to its origin, which counts its lanes and cannot be forgotten
 * before them.
 */
#include "dispatch_caps.h"

#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "util.h"

#define CAPS_SLOTS 64 /* initial chains of each table */
/* Forgetting: a lane (its limit) holding nothing after this long idle, so
 * that a destination that pauses between bursts keeps what was learnt about
 * it; an origin (its name) once it has no lane and has been idle a minute. */
#define CAPS_LANE_IDLE_MS (10 * 60000)
#define CAPS_ORIGIN_IDLE_MS 60000
/* A named origin idle this long gives its name slot back. */
#define CAPS_NAMED_IDLE_MS 60000
#define CAPS_SLOW_CUT 0.9 /* a slow answer takes a tenth off */
#define CAPS_OVERLOAD_CUT 0.5
/* Weight of a new attempt's duration in the smoothed duration: about the
 * last ten attempts count, so a destination that slows down is seen within
 * a round trip or two of its slots. */
#define CAPS_EWMA 0.2

/* The head of every table entry. */
struct cap_entry {
    struct cap_entry *next;
    uint64_t hash;
};

struct cap_table {
    struct cap_entry **slots;
    size_t nslots; /* a power of two */
    size_t count;
};

struct cap_origin {
    struct cap_entry e; /* first: the table hands entries back as this */
    int64_t id;
    double limits;    /* the sum of its lanes' limits (the metrics' limit) */
    int held;         /* slots held by claimed jobs, started or not */
    int inflight;     /* ... of which started */
    int lanes;        /* lanes pointing here */
    double ewma_ms;   /* smoothed duration of its attempts; 0 before the first */
    int64_t last_ms;  /* last hold, start, report or release */
    uint64_t started; /* attempts started: how busy it is, for the names */
    uint64_t started_at_sweep;
    uint64_t busy; /* starts between the last two sweeps */
    int named;     /* metrics name slot, or -1 */
    uint64_t booked_serial;
    int booked; /* slots booked by the claim being built (booked_serial) */
    char name[HUB_CAPS_NAME_MAX];
};

/* A tenant with lanes: its attempts in flight over all of them. */
struct cap_tenant {
    struct cap_entry e;
    int inflight;
    int lanes; /* lanes pointing here */
    char name[];
};

struct hub_cap_lane {
    struct cap_entry e;
    struct cap_origin *origin;
    struct cap_tenant *t;
    double limit;    /* current cap, 1 .. tenant_origin_max */
    double ssthresh; /* slow start below it, one slot per round trip above */
    uint32_t epoch;  /* decreases so far: see hub_caps_report */
    double ewma_ms;  /* smoothed duration of its attempts; 0 before the first */
    int held;        /* slots held by claimed jobs, started or not */
    int inflight;    /* ... of which started */
    int64_t last_ms;
    uint64_t booked_serial;
    int booked;
    char tenant[];
};

struct hub_caps {
    struct hub_caps_cfg cfg;
    int inflight; /* attempts started and not ended, every lane's */
    struct cap_table origins;
    struct cap_table lanes;
    struct cap_table tenants;
    /* metrics: the named origins' wait histograms by name slot, the
     * others' summed; a slot's histogram starts again when it is given to
     * another origin (a new series), "other" only grows */
    struct cap_origin *named[HUB_CAPS_NAMED];
    struct hub_histogram wait_named[HUB_CAPS_NAMED];
    struct hub_histogram wait_other;
};

/* ----------------------------------------------------------------- tables -- */

/* The chain of a hash: FNV's low bits alone mix poorly, so the high half is
 * folded in. */
static struct cap_entry **table_slot(const struct cap_table *t, uint64_t hash) {
    return &t->slots[(hash ^ (hash >> 32)) & (t->nslots - 1)];
}

/* An empty table of CAPS_SLOTS chains.  Returns 0, or -1 out of memory. */
static int table_init(struct cap_table *t) {
    t->nslots = CAPS_SLOTS;
    t->count = 0;
    t->slots = calloc(t->nslots, sizeof(*t->slots));
    return t->slots != NULL ? 0 : -1;
}

/* Links e (its hash set) into t, doubling the chains first when t is as
 * full as it has chains (a failed doubling keeps the old, longer chains). */
static void table_add(struct cap_table *t, struct cap_entry *e) {
    struct cap_entry **s;

    if (t->count >= t->nslots) {
        size_t n = t->nslots * 2;
        struct cap_entry **grown = calloc(n, sizeof(*grown));
        if (grown != NULL) {
            struct cap_table old = *t;
            t->slots = grown;
            t->nslots = n;
            for (size_t i = 0; i < old.nslots; i++) {
                for (struct cap_entry *x = old.slots[i], *next; x != NULL; x = next) {
                    next = x->next;
                    s = table_slot(t, x->hash);
                    x->next = *s;
                    *s = x;
                }
            }
            free(old.slots);
        }
    }
    s = table_slot(t, e->hash);
    e->next = *s;
    *s = e;
    t->count++;
}

/* Frees every entry of t for which drop(entry, arg) says 1 (NULL drop: all). */
static void table_prune(struct cap_table *t, int (*drop)(struct cap_entry *, void *), void *arg) {
    for (size_t i = 0; i < t->nslots; i++) {
        struct cap_entry **pp = &t->slots[i];
        while (*pp != NULL) {
            struct cap_entry *e = *pp;
            if (drop == NULL || drop(e, arg)) {
                *pp = e->next;
                t->count--;
                free(e);
            } else {
                pp = &e->next;
            }
        }
    }
}

/* The keys' hashes: an origin by its id (itself a hash, but of text the
 * database chose), a lane by its tenant (NUL included, so that no tenant
 * id runs into the origin's bytes) and its origin. */
static uint64_t origin_hash(int64_t id) {
    return hub_fnv1a(HUB_FNV1A_BASIS, &id, sizeof(id));
}

static uint64_t lane_hash(const char *tenant, int64_t origin) {
    return hub_fnv1a(hub_fnv1a(HUB_FNV1A_BASIS, tenant, strlen(tenant) + 1), &origin,
                     sizeof(origin));
}

/* The origin's entry, or NULL. */
static struct cap_origin *origin_find(const struct hub_caps *c, int64_t id) {
    uint64_t h = origin_hash(id);
    for (struct cap_entry *e = *table_slot(&c->origins, h); e != NULL; e = e->next) {
        if (e->hash == h && ((struct cap_origin *)e)->id == id) {
            return (struct cap_origin *)e;
        }
    }
    return NULL;
}

/* The lane's entry, or NULL.  tenant is borrowed for the call. */
static struct hub_cap_lane *lane_find(const struct hub_caps *c, const char *tenant,
                                      int64_t origin) {
    uint64_t h = lane_hash(tenant, origin);
    for (struct cap_entry *e = *table_slot(&c->lanes, h); e != NULL; e = e->next) {
        struct hub_cap_lane *l = (struct hub_cap_lane *)e;
        if (e->hash == h && l->origin->id == origin && strcmp(l->tenant, tenant) == 0) {
            return l;
        }
    }
    return NULL;
}

/* The tenant's entry, made when new.  NULL when out of memory. */
static struct cap_tenant *tenant_get(struct hub_caps *c, const char *tenant) {
    uint64_t h = hub_fnv1a_str(tenant);
    struct cap_tenant *t;
    size_t len;

    for (struct cap_entry *e = *table_slot(&c->tenants, h); e != NULL; e = e->next) {
        if (e->hash == h && strcmp(((struct cap_tenant *)e)->name, tenant) == 0) {
            return (struct cap_tenant *)e;
        }
    }
    len = strlen(tenant);
    if ((t = calloc(1, sizeof(*t) + len + 1)) != NULL) {
        memcpy(t->name, tenant, len + 1);
        t->e.hash = h;
        table_add(&c->tenants, &t->e);
    }
    return t;
}

/* The origin's entry, made when new.  NULL when out of memory. */
static struct cap_origin *origin_get(struct hub_caps *c, int64_t id, int64_t now_ms) {
    struct cap_origin *o = origin_find(c, id);

    if (o == NULL && (o = calloc(1, sizeof(*o))) != NULL) {
        o->e.hash = origin_hash(id);
        o->id = id;
        o->named = -1;
        o->last_ms = now_ms;
        table_add(&c->origins, &o->e);
    }
    return o;
}

/* The lane's entry, made when new (at the start limit).  NULL when out of
 * memory. */
static struct hub_cap_lane *lane_get(struct hub_caps *c, const char *tenant, int64_t origin,
                                     int64_t now_ms) {
    struct hub_cap_lane *l = lane_find(c, tenant, origin);
    struct cap_origin *o;
    struct cap_tenant *t;
    size_t tlen;

    if (l != NULL || (o = origin_get(c, origin, now_ms)) == NULL ||
        (t = tenant_get(c, tenant)) == NULL) {
        return l;
    }
    tlen = strlen(tenant);
    if ((l = calloc(1, sizeof(*l) + tlen + 1)) == NULL) {
        return NULL;
    }
    memcpy(l->tenant, tenant, tlen + 1);
    l->e.hash = lane_hash(tenant, origin);
    l->origin = o;
    l->t = t;
    t->lanes++;
    l->limit = c->cfg.start;
    l->ssthresh = c->cfg.tenant_origin_max;
    l->last_ms = now_ms;
    o->lanes++;
    o->limits += l->limit;
    table_add(&c->lanes, &l->e);
    return l;
}

/* -------------------------------------------------------------- the caps -- */

/* The lane's cap now: its adaptive limit, in whole slots (the limit grows
 * by fractions of a slot past slow start). */
static int lane_cap(const struct hub_cap_lane *l) {
    return (int)l->limit;
}

/*
 * How many claimed jobs may wait for a slot of a lane (or origin) whose
 * attempts in flight fill its cap: those it will start within ahead_ms,
 * as far as its attempts' smoothed duration tells (cap slots free up every
 * ewma_ms), and never more than the cap or the dispatcher's own run-ahead
 * (ahead_floor), whichever is larger.  Nothing before the first attempt
 * ended: a destination that never answers keeps nothing waiting.  This is
 * the queue's run-ahead, so that workers do not wait for the next claim's
 * round trip; every job kept there expects to start within ahead_ms.
 *
 * The floor matters when the workers, not the cap, bound a destination (a
 * cap of 16 with 8 workers): bounded by its cap alone, the lane offered
 * each claim only what 8 attempts left of 32 slots, often half a batch,
 * where the queue before the caps kept two whole batches ahead.
 */
static int ahead(const struct hub_caps *c, int cap, double ewma_ms) {
    double n;
    int most = cap > c->cfg.ahead_floor ? cap : c->cfg.ahead_floor;

    if (ewma_ms <= 0 || c->cfg.ahead_ms <= 0) {
        return 0;
    }
    n = (double)cap * (double)c->cfg.ahead_ms / (ewma_ms > 1 ? ewma_ms : 1);
    return n < most ? (int)n : most;
}

/* The most slots the lane, and its origin, may hold: their cap of attempts
 * in flight and the jobs that may wait for them. */
static int lane_room(const struct hub_caps *c, const struct hub_cap_lane *l) {
    return lane_cap(l) + ahead(c, lane_cap(l), l->ewma_ms);
}

static int origin_room(const struct hub_caps *c, const struct cap_origin *o) {
    return c->cfg.origin_max + ahead(c, c->cfg.origin_max, o->ewma_ms);
}

/*
 * What the claim `serial` booked for an entry so far (*at, *n are its
 * booking fields; an older serial's bookings read as 0 and are dropped).
 * A claim books the room it offers, because its lanes are offered before
 * any of their jobs is held: two lanes of one origin in the same claim
 * must not both be offered the origin's last slots.
 */
static int booked(uint64_t *at, int *n, uint64_t serial) {
    if (*at != serial) {
        *at = serial;
        *n = 0;
    }
    return *n;
}

struct hub_caps *hub_caps_new(const struct hub_caps_cfg *cfg) {
    struct hub_caps *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        return NULL;
    }
    /* the caps are at least one slot: a destination is never shut out
     * (the breaker is what stops sending to one) */
    c->cfg = *cfg;
    c->cfg.origin_max = c->cfg.origin_max > 0 ? c->cfg.origin_max : 1;
    c->cfg.tenant_origin_max = c->cfg.tenant_origin_max > 0 ? c->cfg.tenant_origin_max : 1;
    if (c->cfg.start < 1 || c->cfg.start > c->cfg.tenant_origin_max) {
        c->cfg.start = c->cfg.start < 1 ? 1 : c->cfg.tenant_origin_max;
    }
    if (table_init(&c->origins) != 0 || table_init(&c->lanes) != 0 ||
        table_init(&c->tenants) != 0) {
        free(c->origins.slots);
        free(c->lanes.slots);
        free(c);
        return NULL;
    }
    return c;
}

void hub_caps_free(struct hub_caps *c) {
    if (c == NULL) {
        return;
    }
    /* lanes first: an origin and a tenant must outlive the lanes pointing
     * to them */
    table_prune(&c->lanes, NULL, NULL);
    table_prune(&c->origins, NULL, NULL);
    table_prune(&c->tenants, NULL, NULL);
    free(c->lanes.slots);
    free(c->origins.slots);
    free(c->tenants.slots);
    free(c);
}

/* 1 when the lane's tenant has all the attempts in flight it may
 * (cfg.tenant_max): none of its jobs can start before one of them ends. */
static int tenant_at_max(const struct hub_caps *c, const struct hub_cap_lane *l) {
    return c->cfg.tenant_max > 0 && l->t->inflight >= c->cfg.tenant_max;
}

/* 1 when the lane's tenant, starting one more attempt, leaves as many
 * workers free as it then holds, or the reserve (hub_caps_ready).  Only
 * where attempts start: a claim or a fast-path offer runs ahead of free
 * workers by design, and its jobs wait for this in the queue. */
static int tenant_leaves_enough(const struct hub_caps *c, const struct hub_cap_lane *l) {
    int reserve = c->cfg.workers - c->cfg.tenant_max;
    int held = l->t->inflight;

    if (c->cfg.tenant_max <= 0 || reserve <= 0) {
        return 1;
    }
    return c->cfg.workers - c->inflight - 1 >= (held < reserve ? held : reserve);
}

/* A lane's offer is the least of its own room and its origin's, both net of
 * what this claim booked already; the booking makes it count for the
 * lanes offered after it. */
int hub_caps_offer(struct hub_caps *c, const char *tenant, int64_t origin, int want,
                   uint64_t serial, int shed, int64_t now_ms) {
    struct hub_cap_lane *l;
    struct cap_origin *o;
    int room, left;

    /* shed jobs end before the next claim: they need no room; and out of
     * memory a cap is no reason to stop delivering */
    if (shed || want <= 0 || (l = lane_get(c, tenant, origin, now_ms)) == NULL) {
        return want > 0 ? want : 0;
    }
    if (tenant_at_max(c, l)) {
        return 0; /* its jobs would only wait for the tenant's attempts to end */
    }
    o = l->origin;
    room = lane_room(c, l) - l->held - booked(&l->booked_serial, &l->booked, serial);
    left = origin_room(c, o) - o->held - booked(&o->booked_serial, &o->booked, serial);
    room = room < left ? room : left;
    room = room < want ? room : want;
    if (room <= 0) {
        return 0;
    }
    l->booked += room;
    o->booked += room;
    return room;
}

/* 1 when the lane's (or its origin's) slots are all held or booked, or
 * its tenant has all the attempts in flight it may. */
static int lane_full(const struct hub_caps *c, struct hub_cap_lane *l, uint64_t serial) {
    struct cap_origin *o = l->origin;
    return tenant_at_max(c, l) ||
           l->held + booked(&l->booked_serial, &l->booked, serial) >= lane_room(c, l) ||
           o->held + booked(&o->booked_serial, &o->booked, serial) >= origin_room(c, o);
}

int hub_caps_full(struct hub_caps *c, const char *tenant, int64_t origin, uint64_t serial) {
    struct hub_cap_lane *l = lane_find(c, tenant, origin);
    struct cap_origin *o;

    if (l != NULL) {
        return lane_full(c, l, serial);
    }
    /* a lane not seen yet holds nothing: only its origin can be full */
    o = origin_find(c, origin);
    return o != NULL &&
           o->held + booked(&o->booked_serial, &o->booked, serial) >= origin_room(c, o);
}

/* Every origin is asked, not only the tenant's lanes: an origin full for
 * everyone holds back a fifo head of a tenant that never sent it anything.
 * Origins are few (those in use in the last minutes). */
void hub_caps_each_full(struct hub_caps *c, const char *tenant, uint64_t serial,
                        void (*cb)(void *arg, int64_t origin), void *arg) {
    for (size_t i = 0; i < c->origins.nslots; i++) {
        for (struct cap_entry *e = c->origins.slots[i]; e != NULL; e = e->next) {
            struct cap_origin *o = (struct cap_origin *)e;
            if (hub_caps_full(c, tenant, o->id, serial)) {
                cb(arg, o->id);
            }
        }
    }
}

/* A claimed job's slot, counted from the claim's result on (not only once
 * it starts), so that the next claim, sent while this one's jobs are
 * loaded and queued, does not offer the same room again. */
struct hub_cap_lane *hub_caps_hold(struct hub_caps *c, const char *tenant, int64_t origin,
                                   int64_t now_ms) {
    struct hub_cap_lane *l = lane_get(c, tenant, origin, now_ms);

    if (l != NULL) {
        l->held++;
        l->origin->held++;
        l->last_ms = l->origin->last_ms = now_ms;
    }
    return l;
}

/* The caps bound attempts in flight: jobs held beyond them are the
 * run-ahead, which waits (see ahead()). */
int hub_caps_room(const struct hub_caps *c, const struct hub_cap_lane *l) {
    return l->inflight < lane_cap(l) && l->origin->inflight < c->cfg.origin_max &&
           !tenant_at_max(c, l);
}

int hub_caps_ready(const struct hub_caps *c, const struct hub_cap_lane *l) {
    return hub_caps_room(c, l) && tenant_leaves_enough(c, l);
}

/* Held and not started: waiting in the queue (or being loaded).  The
 * run-ahead is recomputed from the latest durations, so a destination that
 * slowed down sends back what it can no longer start soon. */
int hub_caps_waiting_over(const struct hub_caps *c, const struct hub_cap_lane *l) {
    const struct cap_origin *o = l->origin;
    return l->held - l->inflight > ahead(c, lane_cap(l), l->ewma_ms) ||
           o->held - o->inflight > ahead(c, c->cfg.origin_max, o->ewma_ms);
}

void hub_caps_start(struct hub_caps *c, struct hub_cap_lane *l, int64_t due_unix_ms,
                    int64_t now_unix_ms, uint32_t *epoch) {
    struct cap_origin *o = l->origin;
    double waited = (double)(now_unix_ms - due_unix_ms) / 1000.0;

    l->inflight++;
    l->t->inflight++;
    o->inflight++;
    o->started++;
    c->inflight++;
    l->last_ms = o->last_ms = now_unix_ms;
    /* the decrease this attempt's failure may cause is the next one */
    *epoch = l->epoch;
    hub_histogram_observe(o->named >= 0 ? &c->wait_named[o->named] : &c->wait_other,
                          waited > 0 ? waited : 0);
}

/* Sets the lane's limit (kept within 1 .. tenant_origin_max), and its
 * origin's sum with it. */
static void limit_set(const struct hub_caps *c, struct hub_cap_lane *l, double limit) {
    limit = limit < 1 ? 1 : limit > c->cfg.tenant_origin_max ? c->cfg.tenant_origin_max : limit;
    l->origin->limits += limit - l->limit;
    l->limit = limit;
}

/* Multiplies the limit by cut, once per round trip: epoch is the lane's
 * epoch when the attempt started. */
static void limit_cut(const struct hub_caps *c, struct hub_cap_lane *l, uint32_t epoch,
                      double cut) {
    if (epoch != l->epoch) {
        return; /* started before the last decrease: that one counted it */
    }
    limit_set(c, l, l->limit * cut);
    l->ssthresh = l->limit;
    l->epoch++;
}

enum hub_caps_signal hub_caps_status_signal(long status) {
    if (status == 429 || status == 502 || status == 503 || status == 504) {
        return HUB_CAPS_OVERLOAD;
    }
    return status >= 500 ? HUB_CAPS_NEUTRAL : HUB_CAPS_OK;
}

void hub_caps_report(struct hub_caps *c, struct hub_cap_lane *l, uint32_t epoch,
                     enum hub_caps_signal signal, int64_t latency_ms, int64_t now_ms) {
    struct cap_origin *o = l->origin;
    /* libcurl counts whole milliseconds: a loopback answer may take "0" */
    double ms = latency_ms > 0 ? (double)latency_ms : 0.5;

    o->last_ms = l->last_ms = now_ms;
    /* what a slot of the lane (of the origin) is held for: the queue's run-ahead */
    l->ewma_ms = l->ewma_ms > 0 ? (1 - CAPS_EWMA) * l->ewma_ms + CAPS_EWMA * ms : ms;
    o->ewma_ms = o->ewma_ms > 0 ? (1 - CAPS_EWMA) * o->ewma_ms + CAPS_EWMA * ms : ms;
    switch (signal) {
    case HUB_CAPS_OVERLOAD:
        limit_cut(c, l, epoch, CAPS_OVERLOAD_CUT);
        break;
    case HUB_CAPS_OK:
        if (c->cfg.slow_ms > 0 && latency_ms >= c->cfg.slow_ms) {
            /* answered, but so late that it is on its way to a timeout */
            limit_cut(c, l, epoch, CAPS_SLOW_CUT);
        } else if (2 * l->held >= (int)l->limit) {
            /* grow only while the slots are in use: a destination that is
             * sent little proves nothing about a larger limit */
            limit_set(c, l, l->limit + (l->limit < l->ssthresh ? 1.0 : 1.0 / l->limit));
        }
        break;
    case HUB_CAPS_NEUTRAL:
        break;
    }
}

/* Nothing is freed here: an entry holding nothing is forgotten by the
 * sweep once idle, so that a lane keeps its limit between bursts. */
void hub_caps_release(struct hub_caps *c, struct hub_cap_lane *l, int started, int64_t now_ms) {
    if (l == NULL) {
        return;
    }
    l->held--;
    l->origin->held--;
    if (started) {
        l->inflight--;
        l->t->inflight--;
        l->origin->inflight--;
        c->inflight--;
    }
    l->last_ms = l->origin->last_ms = now_ms;
}

/* The name is the C parser's (hub_url.origin), the database only knows the
 * id: what breakers are keyed by, and what operators read in the metrics. */
void hub_caps_name(struct hub_caps *c, struct hub_cap_lane *l, const char *name) {
    struct cap_origin *o = l->origin;
    size_t n = strnlen(name, sizeof(o->name) - 1);

    memcpy(o->name, name, n);
    o->name[n] = '\0';
    /* a free name slot is taken at once; the busier ones are sorted out by
     * hub_caps_sweep */
    for (int k = 0; k < HUB_CAPS_NAMED && o->named < 0 && n > 0; k++) {
        if (c->named[k] == NULL) {
            c->named[k] = o;
            o->named = k;
            memset(&c->wait_named[k], 0, sizeof(c->wait_named[k]));
        }
    }
}

const char *hub_caps_lane_name(const struct hub_cap_lane *l) {
    return l->origin->name;
}

/* The claim asks by origin id, before any job of the lane is made: the
 * name is known once any job of the origin was. */
const char *hub_caps_origin_name(struct hub_caps *c, int64_t origin) {
    struct cap_origin *o = origin_find(c, origin);
    return o != NULL && o->name[0] != '\0' ? o->name : NULL;
}

/* A lane never seen has the start limit: what its first claim is offered. */
double hub_caps_limit(struct hub_caps *c, const char *tenant, int64_t origin) {
    struct hub_cap_lane *l = lane_find(c, tenant, origin);
    return l != NULL ? l->limit : c->cfg.start;
}

/* The most attempts the origin may have in flight now: its lanes' limits,
 * up to its cap. */
static long long origin_limit(const struct hub_caps *c, const struct cap_origin *o) {
    return o->limits < c->cfg.origin_max ? (long long)o->limits : c->cfg.origin_max;
}

/* For the tests: what the metrics show of an origin, named or not. */
void hub_caps_counts(struct hub_caps *c, int64_t origin, int *inflight, int *held) {
    struct cap_origin *o = origin_find(c, origin);
    *inflight = o != NULL ? o->inflight : 0;
    *held = o != NULL ? o->held : 0;
}

/* ------------------------------------------------------------ upkeep -- */

/* What the sweep's table_prune callbacks need. */
struct sweep_ctx {
    struct hub_caps *c;
    int64_t now_ms;
};

/* A lane holding nothing and idle for CAPS_LANE_IDLE_MS goes, its limit
 * with it (its origin's sum and count follow). */
static int lane_idle(struct cap_entry *e, void *arg) {
    struct sweep_ctx *x = arg;
    struct hub_cap_lane *l = (struct hub_cap_lane *)e;
    if (l->held > 0 || x->now_ms - l->last_ms < CAPS_LANE_IDLE_MS) {
        return 0;
    }
    l->origin->lanes--;
    l->origin->limits -= l->limit;
    l->t->lanes--;
    return 1;
}

/* A tenant goes with its last lane. */
static int tenant_idle(struct cap_entry *e, void *arg) {
    (void)arg;
    return ((struct cap_tenant *)e)->lanes == 0;
}

/* An origin goes once no lane points to it and it has been idle a while;
 * its metrics name slot is freed for another. */
static int origin_idle(struct cap_entry *e, void *arg) {
    struct sweep_ctx *x = arg;
    struct cap_origin *o = (struct cap_origin *)e;
    if (o->held > 0 || o->lanes > 0 || x->now_ms - o->last_ms < CAPS_ORIGIN_IDLE_MS) {
        return 0;
    }
    if (o->named >= 0) {
        x->c->named[o->named] = NULL;
    }
    return 1;
}

/*
 * The names: an origin idle for CAPS_NAMED_IDLE_MS gives its slot back;
 * free slots go to the busiest unnamed origins (by attempts started since
 * the last sweep), and the least busy named one gives way to an unnamed one
 * at least twice as busy (so that names do not flap between origins of
 * about the same load: every change starts a new series).  A name is only
 * given to an origin whose name is known (hub_caps_name).
 */
static void names_pick(struct hub_caps *c, int64_t now_ms) {
    for (size_t i = 0; i < c->origins.nslots; i++) {
        for (struct cap_entry *e = c->origins.slots[i]; e != NULL; e = e->next) {
            struct cap_origin *o = (struct cap_origin *)e;
            o->busy = o->started - o->started_at_sweep;
            o->started_at_sweep = o->started;
            if (o->named >= 0 && o->held == 0 && now_ms - o->last_ms >= CAPS_NAMED_IDLE_MS) {
                c->named[o->named] = NULL;
                o->named = -1;
            }
        }
    }
    /* one promotion per turn, the busiest unnamed origin into a free slot or
     * over the least busy named one, until none qualifies */
    for (;;) {
        struct cap_origin *best = NULL;
        int slot = -1;
        for (size_t i = 0; i < c->origins.nslots; i++) {
            for (struct cap_entry *e = c->origins.slots[i]; e != NULL; e = e->next) {
                struct cap_origin *o = (struct cap_origin *)e;
                if (o->named < 0 && o->name[0] != '\0' && o->busy > 0 &&
                    (best == NULL || o->busy > best->busy)) {
                    best = o;
                }
            }
        }
        for (int k = 0; best != NULL && k < HUB_CAPS_NAMED; k++) {
            if (c->named[k] == NULL) {
                slot = k;
                break;
            }
            if (slot < 0 || c->named[k]->busy < c->named[slot]->busy) {
                slot = k;
            }
        }
        if (best == NULL || (c->named[slot] != NULL && best->busy < 2 * c->named[slot]->busy + 1)) {
            return;
        }
        if (c->named[slot] != NULL) {
            c->named[slot]->named = -1;
        }
        c->named[slot] = best;
        best->named = slot;
        memset(&c->wait_named[slot], 0, sizeof(c->wait_named[slot]));
    }
}

void hub_caps_sweep(struct hub_caps *c, int64_t now_ms) {
    struct sweep_ctx x = {c, now_ms};

    table_prune(&c->lanes, lane_idle, &x);
    table_prune(&c->origins, origin_idle, &x);
    table_prune(&c->tenants, tenant_idle, NULL);
    names_pick(c, now_ms);
}

/* ----------------------------------------------------------- metrics -- */

/* The label text origin="<name>", escaped for the exposition format. */
static void origin_label(const char *name, char *out, size_t outsz) {
    size_t n = 0;
    static const char head[] = "origin=\"";

    memcpy(out, head, sizeof(head) - 1);
    n = sizeof(head) - 1;
    for (const char *p = name; *p != '\0' && n + 4 < outsz; p++) {
        if (*p == '"' || *p == '\\' || *p == '\n') {
            out[n++] = '\\';
            out[n++] = *p == '\n' ? 'n' : *p;
        } else {
            out[n++] = *p;
        }
    }
    out[n++] = '"';
    out[n] = '\0';
}

void hub_caps_metrics_render(const struct hub_caps *c, FILE *out) {
    static const char *const gauges[2][2] = {
        {"streaming_hub_dispatch_origin_inflight",
         "Delivery attempts in flight per destination origin (the busiest by name, the rest "
         "summed as other)."},
        {"streaming_hub_dispatch_origin_limit",
         "Current cap of attempts in flight per destination origin: its tenants' adaptive "
         "limits summed, up to STREAMING_HUB_DISPATCH_ORIGIN_MAX (other: summed over the "
         "origins not named)."},
    };
    static const char wait_name[] = "streaming_hub_dispatch_slot_wait_seconds";
    char label[HUB_CAPS_NAME_MAX * 2 + 16]; /* every byte of a name may need an escape */
    long long other[2] = {0, 0};

    if (c == NULL) {
        return;
    }
    /* the origins not named, summed: the label set stays bounded however
     * many destinations the tenants have */
    for (size_t i = 0; i < c->origins.nslots; i++) {
        for (const struct cap_entry *e = c->origins.slots[i]; e != NULL; e = e->next) {
            const struct cap_origin *o = (const struct cap_origin *)e;
            if (o->named < 0) {
                other[0] += o->inflight;
                other[1] += origin_limit(c, o);
            }
        }
    }
    for (int g = 0; g < 2; g++) {
        fprintf(out, "# HELP %s %s\n# TYPE %s gauge\n", gauges[g][0], gauges[g][1], gauges[g][0]);
        for (int k = 0; k < HUB_CAPS_NAMED; k++) {
            const struct cap_origin *o = c->named[k];
            if (o != NULL) {
                origin_label(o->name, label, sizeof(label));
                fprintf(out, "%s{%s} %lld\n", gauges[g][0], label,
                        g == 0 ? (long long)o->inflight : origin_limit(c, o));
            }
        }
        fprintf(out, "%s{origin=\"other\"} %lld\n", gauges[g][0], other[g]);
    }
    fprintf(out,
            "# HELP %s Time a delivery job waited from due to the start of its attempt, per "
            "destination origin (the busiest by name, the rest as other).\n# TYPE %s histogram\n",
            wait_name, wait_name);
    for (int k = 0; k < HUB_CAPS_NAMED; k++) {
        if (c->named[k] != NULL) {
            origin_label(c->named[k]->name, label, sizeof(label));
            hub_histogram_render_series(out, wait_name, label, &c->wait_named[k]);
        }
    }
    hub_histogram_render_series(out, wait_name, "origin=\"other\"", &c->wait_other);
}

/* ------------------------------------------------------------ fast path -- */

/* The caps alone, without the run-ahead: a job the fast path leases starts
 * at once, so it takes only what a lane and its origin have left under
 * their caps of attempts (a lane or origin whose held slots fill its cap
 * takes none: its jobs wait for the claim, which offers it only when it
 * has room).  Lanes and origins are the ones in use lately. */
void hub_caps_each_room(const struct hub_caps *c,
                        void (*cb)(void *arg, const char *tenant, int64_t origin, int room),
                        void *arg) {
    for (size_t i = 0; i < c->origins.nslots; i++) {
        for (struct cap_entry *e = c->origins.slots[i]; e != NULL; e = e->next) {
            const struct cap_origin *o = (const struct cap_origin *)e;
            int room = c->cfg.origin_max - o->held;
            cb(arg, NULL, o->id, room > 0 ? room : 0);
        }
    }
    for (size_t i = 0; i < c->lanes.nslots; i++) {
        for (struct cap_entry *e = c->lanes.slots[i]; e != NULL; e = e->next) {
            const struct hub_cap_lane *l = (const struct hub_cap_lane *)e;
            /* a tenant at its bound takes nothing on its lanes (its lanes
             * not seen yet still get the start room) */
            int room = tenant_at_max(c, l) ? 0 : lane_cap(l) - l->held;
            cb(arg, l->tenant, l->origin->id, room > 0 ? room : 0);
        }
    }
}
