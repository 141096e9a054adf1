/*
 * auth_cache — tenant API keys this process authenticated recently, so that
 * a burst of requests with one key costs one database lookup, not one each
 * (HTTP ingest of single-event requests: README "How ingest works").
 *
 * Staleness bound: an entry is kept for at most the cache's TTL
 * (STREAMING_HUB_AUTH_CACHE_TTL, default 1 s) counted from when its lookup
 * STARTED, so the row it copied was read after that instant.  A key revoked,
 * a tenant deactivated or a quota changed by any process is therefore seen
 * by every process at most one TTL after that change committed.  The process
 * that makes such a change clears its own cache at once
 * (hub_auth_cache_clear), and drops the answers of lookups sent before.
 * Only successful lookups are kept: an unknown or revoked key always costs
 * a lookup (and is never remembered as valid).
 *
 * Owned by the process; used only from the loop thread that answers HTTP
 * requests (no locking).  Bounded: at most AUTH_CACHE_MAX entries; when it
 * is full the expired ones go, else all of them.
 */
#ifndef HUB_AUTH_CACHE_H
#define HUB_AUTH_CACHE_H

#include <stdint.h>

/* What a successful lookup found: the tenant and its ingest quota
 * (0 = none), as hub_api_auth_tenant hands them to its caller. */
struct hub_auth_entry {
    char tenant_id[257]; /* NUL-terminated; HUB_API_TENANT_ID_MAX (256) + 1 */
    double ingest_rate;
    double ingest_burst;
};

/*
 * Looks up the SHA-256 `hash` of a presented key at monotonic time now_ns,
 * with the configured ttl_ms (0: the cache is off, always a miss).  Returns
 * 1 and copies the entry into *out when a live entry exists, else 0 (and
 * drops an expired one).
 */
int hub_auth_cache_get(const unsigned char hash[32], uint64_t now_ns, int64_t ttl_ms,
                       struct hub_auth_entry *out);

/*
 * Remembers, until started_ns + ttl_ms, a successful lookup of `hash` that
 * STARTED at monotonic time started_ns (not when it answered: the row may
 * have changed in between).  Nothing with ttl_ms 0.  Copies *e.  Out of
 * room: see above.
 */
void hub_auth_cache_put(const unsigned char hash[32], uint64_t started_ns, int64_t ttl_ms,
                        const struct hub_auth_entry *e);

/* Forgets every entry: this process changed a key, a tenant's status or its
 * quota, and must not answer from what it read before. */
void hub_auth_cache_clear(void);

#endif
