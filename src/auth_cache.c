/*
 * auth_cache — recently authenticated tenant API keys (see auth_cache.h for
 * the staleness bound and who may call what).
 *
 * An open-addressing table of AUTH_CACHE_MAX slots, indexed by the first
 * bytes of the key's SHA-256 (already uniform: no further hashing), probed
 * linearly.  Deleting from such a table needs tombstones; instead an expired
 * entry is only ever replaced, and a full table is swept or emptied, which
 * keeps every operation short and the code small.
 */
#include "auth_cache.h"

#include <string.h>

#include "util.h"

#define AUTH_CACHE_MAX 1024 /* slots; a power of two */
#define AUTH_CACHE_PROBE 8  /* slots looked at per operation */

struct auth_slot {
    unsigned char hash[32];
    uint64_t expires_ns; /* 0: empty */
    struct hub_auth_entry e;
};

static struct auth_slot slots[AUTH_CACHE_MAX];
/* When the cache was last emptied: a lookup sent before that may have read
 * what the change replaced, and is not kept. */
static uint64_t cleared_ns;

/* The first slot to probe for hash: its first four bytes, already uniform
 * (SHA-256), masked to the table. */
static size_t slot_of(const unsigned char hash[32]) {
    uint32_t h;

    memcpy(&h, hash, sizeof(h));
    return h & (AUTH_CACHE_MAX - 1);
}

void hub_auth_cache_clear(void) {
    memset(slots, 0, sizeof(slots));
    cleared_ns = hub_now_ns();
}

int hub_auth_cache_get(const unsigned char hash[32], uint64_t now_ns, int64_t ttl_ms,
                       struct hub_auth_entry *out) {
    size_t i = slot_of(hash);

    if (ttl_ms <= 0) {
        return 0; /* off: the caller looks the key up */
    }
    for (int p = 0; p < AUTH_CACHE_PROBE; p++, i = (i + 1) & (AUTH_CACHE_MAX - 1)) {
        struct auth_slot *s = &slots[i];
        if (s->expires_ns == 0 || memcmp(s->hash, hash, sizeof(s->hash)) != 0) {
            continue;
        }
        if (now_ns >= s->expires_ns) {
            s->expires_ns = 0; /* stale: the next lookup refreshes it */
            return 0;
        }
        *out = s->e;
        return 1;
    }
    return 0;
}

/* Empties every slot whose entry expired by now_ns; returns how many. */
static size_t sweep(uint64_t now_ns) {
    size_t n = 0;

    for (size_t i = 0; i < AUTH_CACHE_MAX; i++) {
        if (slots[i].expires_ns != 0 && now_ns >= slots[i].expires_ns) {
            slots[i].expires_ns = 0;
            n++;
        }
    }
    return n;
}

void hub_auth_cache_put(const unsigned char hash[32], uint64_t started_ns, int64_t ttl_ms,
                        const struct hub_auth_entry *e) {
    uint64_t ttl_ns = ttl_ms > 0 ? (uint64_t)ttl_ms * 1000 * 1000 : 0;
    uint64_t now_ns = hub_now_ns();
    struct auth_slot *free_slot = NULL;
    size_t i = slot_of(hash);

    if (ttl_ns == 0 || memchr(e->tenant_id, '\0', sizeof(e->tenant_id)) == NULL ||
        started_ns + ttl_ns <= now_ns || started_ns <= cleared_ns) {
        return; /* disabled, no room for the id, stale already, or read before a change */
    }
    for (int pass = 0; pass < 2 && free_slot == NULL; pass++) {
        for (int p = 0; p < AUTH_CACHE_PROBE; p++, i = (i + 1) & (AUTH_CACHE_MAX - 1)) {
            struct auth_slot *s = &slots[i];
            /* the key's own slot first (a refresh), else the first free or
             * expired one along the probe */
            if (s->expires_ns != 0 && memcmp(s->hash, hash, sizeof(s->hash)) == 0) {
                free_slot = s;
                break;
            }
            if (free_slot == NULL && (s->expires_ns == 0 || now_ns >= s->expires_ns)) {
                free_slot = s;
            }
        }
        if (free_slot == NULL && sweep(now_ns) == 0) {
            /* every slot live: more keys in use within one TTL than the
             * table holds; start again rather than grow (not a change:
             * lookups in flight stay good) */
            memset(slots, 0, sizeof(slots));
        }
        i = slot_of(hash);
    }
    if (free_slot == NULL) {
        return;
    }
    memcpy(free_slot->hash, hash, sizeof(free_slot->hash));
    free_slot->e = *e;
    free_slot->expires_ns = started_ns + ttl_ns;
}
