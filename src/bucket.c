/*
 * bucket — token buckets in a chained hash table keyed by string.
 */
#include "bucket.h"

#include <stdlib.h>
#include <string.h>

#include "chains.h"
#include "util.h"

/* The table starts with this many chains and doubles when it holds twice as
 * many buckets as chains, so a chain stays short however many keys come. */
#define BUCKET_SLOTS_MIN 256
/* Full buckets are dropped once the table holds this many (and then again
 * each time it has doubled since the last sweep). */
#define BUCKET_SWEEP_MIN 4096
/* Waits the queued take spreads at most: past it (a rate of a few a month)
 * the wait is the caller's to cap, and nanoseconds would overflow. */
#define BUCKET_QUEUE_MAX_S 1e6

struct bucket {
    struct hub_chain link; /* first: the table's chain and the key's hash */
    double tokens;
    double rate;  /* tokens per second */
    double burst; /* the most it holds */
    uint64_t at_ns;
    uint64_t queued_until_ns; /* hub_bucket_take_queued: the last wait handed out ends then */
    char key[];
};

struct hub_buckets {
    struct hub_chain **slots; /* each chain's entries are struct bucket */
    size_t nslots;            /* a power of two */
    size_t count;
    size_t sweep_at;
};

static double refill(struct bucket *b, uint64_t now) {
    double t = b->tokens + (double)(now - b->at_ns) / 1e9 * b->rate;
    b->tokens = t < b->burst ? t : b->burst;
    b->at_ns = now;
    return b->tokens;
}

/* Drops the buckets that are full again; the next sweep waits until the
 * table has doubled, so sweeping costs O(1) per insert however many of the
 * buckets stay partly drained. */
static void sweep(struct hub_buckets *t, uint64_t now) {
    for (size_t i = 0; i < t->nslots; i++) {
        struct hub_chain **pp = &t->slots[i];
        while (*pp != NULL) {
            struct bucket *b = (struct bucket *)*pp;
            if (refill(b, now) >= b->burst && b->queued_until_ns <= now) {
                *pp = b->link.next;
                free(b);
                t->count--;
            } else {
                pp = &b->link.next;
            }
        }
    }
    t->sweep_at = t->count * 2 > BUCKET_SWEEP_MIN ? t->count * 2 : BUCKET_SWEEP_MIN;
}

static struct hub_buckets *table_new(void) {
    struct hub_buckets *t = calloc(1, sizeof(*t));

    if (t == NULL || (t->slots = calloc(BUCKET_SLOTS_MIN, sizeof(*t->slots))) == NULL) {
        free(t);
        return NULL;
    }
    t->nslots = BUCKET_SLOTS_MIN;
    t->sweep_at = BUCKET_SWEEP_MIN;
    return t;
}

/* key's bucket in *table, made (full) when new; NULL out of memory. */
static struct bucket *bucket_get(struct hub_buckets **table, const char *key, double burst,
                                 uint64_t now_ns) {
    struct hub_buckets *t = *table;
    uint64_t h = hub_fnv1a_str(key);
    struct bucket *b;

    if (t == NULL && (t = *table = table_new()) == NULL) {
        return NULL;
    }
    for (b = (struct bucket *)t->slots[h & (t->nslots - 1)]; b != NULL;
         b = (struct bucket *)b->link.next) {
        if (b->link.hash == h && strcmp(b->key, key) == 0) {
            break;
        }
    }
    if (b == NULL) {
        size_t len = strlen(key);
        if (t->count >= t->sweep_at) {
            sweep(t, now_ns);
        }
        if (t->count >= t->nslots * 2) {
            hub_chains_grow(&t->slots, &t->nslots); /* out of memory: longer chains */
        }
        if ((b = malloc(sizeof(*b) + len + 1)) == NULL) {
            return NULL;
        }
        memcpy(b->key, key, len + 1);
        b->link.hash = h;
        b->tokens = burst;
        b->at_ns = now_ns;
        b->queued_until_ns = 0;
        b->link.next = t->slots[h & (t->nslots - 1)];
        t->slots[h & (t->nslots - 1)] = &b->link;
        t->count++;
    }
    return b;
}

double hub_bucket_take(struct hub_buckets **table, const char *key, double rate, double burst,
                       double cost, uint64_t now_ns) {
    struct bucket *b = bucket_get(table, key, burst, now_ns);

    if (b == NULL) {
        return 0;
    }
    b->rate = rate;
    b->burst = burst;
    if (refill(b, now_ns) < 1.0) {
        return (1.0 - b->tokens) / rate;
    }
    b->tokens -= cost;
    return 0;
}

double hub_bucket_take_queued(struct hub_buckets **table, const char *key, double rate,
                              double burst, uint64_t now_ns) {
    struct bucket *b = bucket_get(table, key, burst, now_ns);
    double wait;
    uint64_t at;

    if (b == NULL) {
        return 0;
    }
    b->rate = rate;
    b->burst = burst;
    if (refill(b, now_ns) >= 1.0) {
        b->tokens -= 1.0;
        return 0;
    }
    /* the next token, or one interval after the last wait handed out */
    wait = (1.0 - b->tokens) / rate;
    if (!(wait < BUCKET_QUEUE_MAX_S) || !(1.0 / rate < BUCKET_QUEUE_MAX_S)) {
        return wait; /* beyond any deferral (the caller caps it): nothing to spread */
    }
    at = now_ns + (uint64_t)(wait * 1e9);
    if (b->queued_until_ns + (uint64_t)(1e9 / rate) > at) {
        at = b->queued_until_ns + (uint64_t)(1e9 / rate);
    }
    b->queued_until_ns = at;
    return (double)(at - now_ns) / 1e9;
}

void hub_buckets_free(struct hub_buckets **table) {
    struct hub_buckets *t = *table;

    if (t != NULL) {
        hub_chains_free(t->slots, t->nslots);
        free(t);
        *table = NULL;
    }
}
