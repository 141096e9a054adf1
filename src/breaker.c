/*
 * breaker — circuit breakers per (tenant, origin): a chained hash table of
 * small state machines, each with a fixed ring of outcome buckets.
 */
#include "breaker.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* Buckets per window: the sliding window advances in steps of window/60
 * (1 s with the default 60 s window), at a cost of 480 bytes per breaker. */
#define RING 60
#define INITIAL_SLOTS 64
/* Upper bound for every duration in the config: keeps sums like
 * 2 * window + open_max far from overflow. */
#define CFG_MAX_MS (30LL * 24 * 3600 * 1000)

enum state { ST_CLOSED, ST_OPEN, ST_HALF_OPEN };

static const char *const STATE_NAME[] = {"closed", "open", "half_open"};

struct breaker {
    struct breaker *next; /* hash chain */
    /* open and half-open: in its tenant's list of them, and the first of
     * each tenant's in the list of those firsts (hub_breakers.open_head) */
    struct breaker *onext, *oprev;
    struct breaker *gnext, *gprev;
    int64_t tag; /* the caller's (hub_breaker_tag), when tagged */
    int tagged;
    uint64_t hash;
    enum state state;
    int consecutive;      /* failures in a row, across states */
    int64_t opened_at_ms; /* start of the current open period */
    int64_t retry_at_ms;  /* open: probe due; half-open: shed jobs due */
    int64_t probe_at_ms;  /* half-open: when the probe was let through */
    int64_t open_ms;      /* length of the current (or last) open period */
    int64_t last_ms;      /* last check or report: idleness */
    int64_t head;         /* index (time / bucket width) of the newest bucket */
    uint32_t attempts[RING];
    uint32_t failures[RING];
    size_t tenant_len;
    size_t origin_len;
    char key[]; /* tenant NUL origin NUL */
};

struct hub_breakers {
    struct hub_breaker_cfg cfg;
    int64_t bucket_ms;
    struct breaker **slots;
    size_t nslots; /* a power of two */
    size_t count;
    size_t nopen;              /* open + half-open */
    struct breaker *open_head; /* ... the first of each tenant's (gnext) */
    int64_t next_full_sweep_ms;
};

/* FNV-1a over tenant, a NUL separator, origin. */
static uint64_t key_hash(const char *tenant, size_t tlen, const char *origin, size_t olen) {
    uint64_t h = 0xcbf29ce484222325u;
    const uint64_t prime = 0x100000001b3u;
    for (size_t i = 0; i < tlen; i++) {
        h = (h ^ (unsigned char)tenant[i]) * prime;
    }
    h *= prime; /* the separator: ("ab","c") and ("a","bc") differ */
    for (size_t i = 0; i < olen; i++) {
        h = (h ^ (unsigned char)origin[i]) * prime;
    }
    return h;
}

/* The chain slot of a hash. */
static struct breaker **slot_of(const struct hub_breakers *b, uint64_t hash) {
    /* fold the high bits in: FNV's low bits alone mix poorly */
    return &b->slots[(hash ^ (hash >> 32)) & (b->nslots - 1)];
}

/* Index of the bucket holding time now_ms (times before 0 clamp to bucket 0). */
static int64_t bucket_of(const struct hub_breakers *b, int64_t now_ms) {
    return now_ms > 0 ? now_ms / b->bucket_ms : 0;
}

/* 1 when e and f are breakers of one tenant. */
static int same_tenant(const struct breaker *e, const struct breaker *f) {
    return e->tenant_len == f->tenant_len && memcmp(e->key, f->key, e->tenant_len) == 0;
}

/* Puts f in the list of tenants' firsts in the place of `was` (NULL: at its
 * head). */
static void firsts_put(struct hub_breakers *b, struct breaker *f, struct breaker *was) {
    f->gprev = was != NULL ? was->gprev : NULL;
    f->gnext = was != NULL ? was->gnext : b->open_head;
    if (f->gnext != NULL) {
        f->gnext->gprev = f;
    }
    if (f->gprev != NULL) {
        f->gprev->gnext = f;
    } else {
        b->open_head = f;
    }
}

/* Lists e among the open ones: second in its tenant's list (found by a
 * scan of the tenants with open breakers, once per opening), or as its
 * tenant's first. */
static void open_link(struct hub_breakers *b, struct breaker *e) {
    struct breaker *f = b->open_head;

    while (f != NULL && !same_tenant(f, e)) {
        f = f->gnext;
    }
    e->gnext = e->gprev = NULL;
    if (f == NULL) {
        e->onext = e->oprev = NULL;
        firsts_put(b, e, NULL);
        return;
    }
    e->oprev = f;
    e->onext = f->onext;
    if (e->onext != NULL) {
        e->onext->oprev = e;
    }
    f->onext = e;
}

static void open_unlink(struct hub_breakers *b, struct breaker *e) {
    if (e->oprev != NULL) { /* not its tenant's first */
        e->oprev->onext = e->onext;
        if (e->onext != NULL) {
            e->onext->oprev = e->oprev;
        }
    } else if (e->onext != NULL) { /* the next of its tenant's is first now */
        e->onext->oprev = NULL;
        firsts_put(b, e->onext, e);
    } else { /* its tenant's last */
        if (e->gprev != NULL) {
            e->gprev->gnext = e->gnext;
        } else {
            b->open_head = e->gnext;
        }
        if (e->gnext != NULL) {
            e->gnext->gprev = e->gprev;
        }
    }
    e->onext = e->oprev = e->gnext = e->gprev = NULL;
}

/* Changes state, keeping the open gauge and the open lists in step. */
static void set_state(struct hub_breakers *b, struct breaker *e, enum state to) {
    if (e->state == ST_CLOSED && to != ST_CLOSED) {
        b->nopen++;
        open_link(b, e);
    } else if (e->state != ST_CLOSED && to == ST_CLOSED) {
        b->nopen--;
        open_unlink(b, e);
    }
    e->state = to;
}

/* Forgets every outcome: statistics belong to one closed period. */
static void ring_clear(struct breaker *e) {
    memset(e->attempts, 0, sizeof(e->attempts));
    memset(e->failures, 0, sizeof(e->failures));
}

/*
 * Moves the ring forward to the bucket of now_ms, zeroing the buckets that
 * fell out of the window.  A clock that goes backwards keeps counting into
 * the newest bucket rather than corrupting older ones.
 */
static void ring_advance(const struct hub_breakers *b, struct breaker *e, int64_t now_ms) {
    int64_t cur = bucket_of(b, now_ms);

    if (cur <= e->head) {
        return;
    }
    if (cur - e->head >= RING) {
        ring_clear(e);
    } else {
        for (int64_t i = e->head + 1; i <= cur; i++) {
            e->attempts[i % RING] = 0;
            e->failures[i % RING] = 0;
        }
    }
    e->head = cur;
}

/* Opens (or re-opens) for open_ms from now.  The ring is left alone: it is
 * not consulted until the breaker closes, and closing clears it. */
static void trip(struct hub_breakers *b, struct breaker *e, int64_t open_ms, int64_t now_ms) {
    set_state(b, e, ST_OPEN);
    e->open_ms = open_ms;
    e->opened_at_ms = now_ms;
    e->retry_at_ms = now_ms + open_ms;
}

/* 1 when the closed breaker's counters call for a trip. */
static int should_trip(const struct hub_breakers *b, const struct breaker *e) {
    uint64_t attempts = 0, failures = 0;

    if (e->consecutive >= b->cfg.consecutive_failures) {
        return 1;
    }
    for (int i = 0; i < RING; i++) {
        attempts += e->attempts[i];
        failures += e->failures[i];
    }
    return attempts >= (uint64_t)b->cfg.min_attempts &&
           (double)failures >= b->cfg.failure_ratio * (double)attempts;
}

/* The pair's breaker, or NULL.  Both strings are borrowed for the call. */
static struct breaker *find(const struct hub_breakers *b, const char *tenant, const char *origin) {
    size_t tlen = strlen(tenant), olen = strlen(origin);
    uint64_t h = key_hash(tenant, tlen, origin, olen);

    for (struct breaker *e = *slot_of(b, h); e != NULL; e = e->next) {
        if (e->hash == h && e->tenant_len == tlen && e->origin_len == olen &&
            memcmp(e->key, tenant, tlen) == 0 && memcmp(e->key + tlen + 1, origin, olen) == 0) {
            return e;
        }
    }
    return NULL;
}

/*
 * Removes breakers nobody needs (see breaker.h).  Under pressure (the table
 * is full) closed breakers idle for two windows go even if they carry a
 * failure streak: losing a stale streak is better than not tracking a new
 * pair at all.
 */
static void sweep(struct hub_breakers *b, int64_t now_ms, int pressure) {
    int64_t idle_closed = 2 * b->cfg.window_ms;
    int64_t idle_open = 2 * b->cfg.window_ms + b->cfg.open_max_ms;

    for (size_t i = 0; i < b->nslots; i++) {
        struct breaker **pp = &b->slots[i];
        while (*pp != NULL) {
            struct breaker *e = *pp;
            int64_t idle = now_ms - e->last_ms;
            int drop = e->state == ST_CLOSED
                           ? idle >= idle_closed && (pressure || e->consecutive == 0)
                           : idle >= idle_open;
            if (drop) {
                *pp = e->next;
                set_state(b, e, ST_CLOSED);
                b->count--;
                free(e);
            } else {
                pp = &e->next;
            }
        }
    }
}

/* Doubles the chain array; on allocation failure keeps the old one (longer chains). */
static void grow(struct hub_breakers *b) {
    size_t n = b->nslots * 2;
    struct breaker **slots = calloc(n, sizeof(*slots));
    struct breaker **old = b->slots;
    size_t oldn = b->nslots;

    if (slots == NULL) {
        return;
    }
    b->slots = slots;
    b->nslots = n;
    for (size_t i = 0; i < oldn; i++) {
        struct breaker *e = old[i];
        while (e != NULL) {
            struct breaker *next = e->next;
            struct breaker **s = slot_of(b, e->hash);
            e->next = *s;
            *s = e;
            e = next;
        }
    }
    free(old);
}

/* Finds the pair's breaker or creates a closed one; NULL when the table is
 * full of breakers in use, or memory runs out. */
static struct breaker *find_or_add(struct hub_breakers *b, const char *tenant, const char *origin,
                                   int64_t now_ms) {
    struct breaker *e = find(b, tenant, origin);
    size_t tlen, olen;

    if (e != NULL) {
        return e;
    }
    if (b->count >= b->cfg.max_breakers) {
        /* a full sweep is O(table): when one frees nothing, wait a window
         * before trying again instead of sweeping on every report */
        if (now_ms < b->next_full_sweep_ms) {
            return NULL;
        }
        sweep(b, now_ms, 1);
        if (b->count >= b->cfg.max_breakers) {
            b->next_full_sweep_ms = now_ms + b->cfg.window_ms;
            return NULL;
        }
    }
    tlen = strlen(tenant);
    olen = strlen(origin);
    e = calloc(1, sizeof(*e) + tlen + olen + 2);
    if (e == NULL) {
        return NULL;
    }
    e->hash = key_hash(tenant, tlen, origin, olen);
    e->state = ST_CLOSED;
    e->open_ms = b->cfg.open_ms;
    e->head = bucket_of(b, now_ms);
    e->last_ms = now_ms;
    e->tenant_len = tlen;
    e->origin_len = olen;
    memcpy(e->key, tenant, tlen + 1);
    memcpy(e->key + tlen + 1, origin, olen + 1);
    if (b->count >= b->nslots) {
        grow(b);
    }
    struct breaker **s = slot_of(b, e->hash);
    e->next = *s;
    *s = e;
    b->count++;
    return e;
}

struct hub_breakers *hub_breakers_new(const struct hub_breaker_cfg *cfg) {
    static const struct hub_breaker_cfg defaults = HUB_BREAKER_CFG_DEFAULT;
    struct hub_breakers *b;

    if (cfg == NULL) {
        cfg = &defaults;
    }
    if (cfg->consecutive_failures < 1 || !(cfg->failure_ratio > 0 && cfg->failure_ratio <= 1) ||
        cfg->min_attempts < 1 || cfg->window_ms < 1 || cfg->window_ms > CFG_MAX_MS ||
        cfg->open_ms < 1 || cfg->open_max_ms < cfg->open_ms || cfg->open_max_ms > CFG_MAX_MS) {
        return NULL;
    }
    b = calloc(1, sizeof(*b));
    if (b == NULL) {
        goto fail_table;
    }
    b->cfg = *cfg;
    if (b->cfg.max_breakers == 0) {
        b->cfg.max_breakers = HUB_BREAKERS_DEFAULT_MAX;
    }
    /* round up so the ring spans at least the whole window */
    b->bucket_ms = (cfg->window_ms + RING - 1) / RING;
    b->nslots = INITIAL_SLOTS;
    b->slots = calloc(b->nslots, sizeof(*b->slots));
    if (b->slots == NULL) {
        goto fail_slots;
    }
    return b;
fail_slots:
    free(b);
fail_table:
    return NULL;
}

void hub_breakers_free(struct hub_breakers *b) {
    if (b == NULL) {
        return;
    }
    for (size_t i = 0; i < b->nslots; i++) {
        struct breaker *e = b->slots[i];
        while (e != NULL) {
            struct breaker *next = e->next;
            free(e);
            e = next;
        }
    }
    free(b->slots);
    free(b);
}

enum hub_breaker_verdict hub_breaker_check(struct hub_breakers *b, const char *tenant,
                                           const char *origin, int64_t now_ms,
                                           int64_t *retry_at_ms) {
    struct breaker *e;
    int64_t at = now_ms;
    enum hub_breaker_verdict v = HUB_BREAKER_ALLOW;

    if (b == NULL || tenant == NULL || origin == NULL) {
        goto done;
    }
    e = find(b, tenant, origin);
    if (e == NULL) {
        goto done; /* never failed, or not tracked: closed */
    }
    e->last_ms = now_ms;
    switch (e->state) {
    case ST_CLOSED:
        break;
    case ST_OPEN:
        if (now_ms >= e->retry_at_ms) {
            set_state(b, e, ST_HALF_OPEN);
            e->probe_at_ms = now_ms;
            /* the jobs shed behind the probe come back one base open time
             * later: about when an attempt that hangs times out */
            e->retry_at_ms = now_ms + b->cfg.open_ms;
            v = HUB_BREAKER_PROBE;
        } else {
            at = e->retry_at_ms;
            v = HUB_BREAKER_SHED;
        }
        break;
    case ST_HALF_OPEN:
        if (now_ms - e->probe_at_ms >= b->cfg.open_max_ms) {
            /* the probe never reported (its worker died): without this the
             * pair would be shed forever */
            e->probe_at_ms = now_ms;
            e->retry_at_ms = now_ms + b->cfg.open_ms;
            v = HUB_BREAKER_PROBE;
        } else {
            /* never hand out a time in the past: the job would come straight
             * back and spin while the probe is slow */
            if (e->retry_at_ms <= now_ms) {
                e->retry_at_ms = now_ms + b->cfg.open_ms;
            }
            at = e->retry_at_ms;
            v = HUB_BREAKER_SHED;
        }
        break;
    }
done:
    if (retry_at_ms != NULL) {
        *retry_at_ms = at;
    }
    return v;
}

int hub_breaker_sheds(const struct hub_breakers *b, const char *tenant, const char *origin,
                      int64_t now_ms) {
    const struct breaker *e;

    if (b == NULL || tenant == NULL || origin == NULL || (e = find(b, tenant, origin)) == NULL) {
        return 0;
    }
    /* the cases of hub_breaker_check that answer SHED */
    return (e->state == ST_OPEN && now_ms < e->retry_at_ms) ||
           (e->state == ST_HALF_OPEN && now_ms - e->probe_at_ms < b->cfg.open_max_ms);
}

void hub_breaker_report(struct hub_breakers *b, const char *tenant, const char *origin, int success,
                        int probe, int64_t now_ms) {
    struct breaker *e;

    if (b == NULL || tenant == NULL || origin == NULL) {
        return;
    }
    e = find_or_add(b, tenant, origin, now_ms);
    if (e == NULL) {
        return; /* not tracked: see breaker.h */
    }
    e->last_ms = now_ms;
    if (success) {
        e->consecutive = 0;
    } else if (e->consecutive < INT_MAX) {
        e->consecutive++;
    }
    switch (e->state) {
    case ST_CLOSED:
        ring_advance(b, e, now_ms);
        e->attempts[e->head % RING]++;
        if (!success) {
            e->failures[e->head % RING]++;
        }
        /* evaluated on successes too: the attempt that reaches min_attempts
         * may be a success and still leave the ratio at the threshold */
        if (should_trip(b, e)) {
            trip(b, e, b->cfg.open_ms, now_ms);
        }
        break;
    case ST_HALF_OPEN:
        if (!probe) {
            break; /* an attempt that started before the trip: the probe decides */
        }
        if (success) {
            /* a closed period starts afresh: the outcomes that tripped the
             * breaker must not trip it again.  The next trip from closed
             * starts at the base open time again (see the ST_CLOSED case). */
            set_state(b, e, ST_CLOSED);
            ring_clear(e);
            e->head = bucket_of(b, now_ms);
        } else {
            int64_t next =
                e->open_ms > b->cfg.open_max_ms / 2 ? b->cfg.open_max_ms : 2 * e->open_ms;
            trip(b, e, next, now_ms);
        }
        break;
    case ST_OPEN:
        /* an attempt that started before the trip: the probe decides */
        break;
    }
}

void hub_breaker_release(struct hub_breakers *b, const char *tenant, const char *origin,
                         int64_t now_ms) {
    struct breaker *e;

    if (b == NULL || tenant == NULL || origin == NULL) {
        return;
    }
    e = find(b, tenant, origin);
    if (e != NULL && e->state == ST_HALF_OPEN) {
        set_state(b, e, ST_OPEN);
        e->retry_at_ms = now_ms;
        e->last_ms = now_ms;
    }
}

size_t hub_breakers_list(struct hub_breakers *b, int64_t now_ms, hub_breakers_list_cb cb,
                         void *arg) {
    size_t n = 0;

    if (b == NULL) {
        return 0;
    }
    sweep(b, now_ms, 0);
    for (size_t i = 0; i < b->nslots; i++) {
        for (const struct breaker *e = b->slots[i]; e != NULL; e = e->next) {
            if (e->state == ST_CLOSED) {
                continue;
            }
            if (cb != NULL) {
                cb(arg, e->key, e->key + e->tenant_len + 1, STATE_NAME[e->state], e->opened_at_ms,
                   e->retry_at_ms, e->consecutive);
            }
            n++;
        }
    }
    return n;
}

size_t hub_breakers_open_hint(const struct hub_breakers *b) {
    return b != NULL ? b->nopen : 0;
}

void hub_breaker_tag(struct hub_breakers *b, const char *tenant, const char *origin, int64_t tag) {
    struct breaker *e = b != NULL ? find(b, tenant, origin) : NULL;

    if (e != NULL) {
        e->tag = tag;
        e->tagged = 1;
    }
}

size_t hub_breakers_each_open(const struct hub_breakers *b, size_t per_tenant,
                              hub_breakers_open_cb cb, void *arg) {
    size_t n = 0;

    for (const struct breaker *f = b != NULL ? b->open_head : NULL; f != NULL; f = f->gnext) {
        size_t k = 0, seen = 0;
        /* untagged ones are passed over, but count toward the visit's
         * bound: the walk never grows with a tenant's breakers */
        for (const struct breaker *e = f; e != NULL && k < per_tenant && seen < 2 * per_tenant;
             e = e->onext, seen++) {
            if (e->tagged) {
                cb(arg, e->key, e->key + e->tenant_len + 1, e->tag);
                k++;
            }
        }
        n += k;
    }
    return n;
}

size_t hub_breakers_open_count(struct hub_breakers *b, int64_t now_ms) {
    if (b == NULL) {
        return 0;
    }
    sweep(b, now_ms, 0);
    return b->nopen;
}
