/*
 * schema_registry — this process's copy of the schema registry (SPEC §3.5):
 * every live schema version, compiled, and the per-type settings, as one
 * immutable snapshot per generation.
 *
 * The tables (migration 0016) carry a generation that every change bumps.
 * The registry polls it on a connection of its own every
 * STREAMING_HUB_SCHEMA_POLL_MS; when it moved, it loads the rows, compiles
 * the schemas on the libuv threadpool (never on the loop) and swaps the new
 * snapshot in.  So a change made on any process is used by every process
 * within a poll interval plus a load (well under a second).  A change made
 * through this process's API pokes the poll at once.
 *
 * A snapshot is reference counted: ingest takes one (hub_schemas_acquire)
 * for the records of a batch, hands it to a worker thread that validates
 * against it, and releases it from any thread; the old snapshot is freed by
 * whoever releases it last.  A schema that no longer compiles (a validator
 * upgrade) is left out of its snapshot and logged once per generation.
 *
 * Loop thread, but for hub_schema_set_* / hub_schemas_release, which any
 * thread may call on a snapshot it holds.
 */
#ifndef HUB_SCHEMA_REGISTRY_H
#define HUB_SCHEMA_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

struct hub;
struct hub_jschema;
struct hub_schemas;
struct hub_schema_set;

/* Longest version text accepted ("MAJOR.MINOR.PATCH", each <= 9 digits). */
#define HUB_SCHEMA_VERSION_MAX 32

/* One live version in a snapshot (borrowed from its snapshot). */
struct hub_schema_entry {
    const char *scope; /* tenant id, or "" for the platform */
    const char *type;  /* the event type */
    char version[HUB_SCHEMA_VERSION_MAX];
    int major, minor, patch;
    char digest[65]; /* hex SHA-256 of the stored text */
    struct hub_jschema *compiled;
};

/* What an event of a type gets (hub_schema_set_pick). */
enum hub_schema_pick {
    HUB_SCHEMA_NONE = 0,           /* the type has no schema: unchanged */
    HUB_SCHEMA_CHECK,              /* check against *entry */
    HUB_SCHEMA_UNKNOWN_ACCEPT,     /* its major has none: accepted (counted) */
    HUB_SCHEMA_UNKNOWN_QUARANTINE, /* its major has none: quarantined */
};

/*
 * Parses "MAJOR.MINOR.PATCH" (non-negative decimals without leading zeros,
 * no pre-release or build part).  Returns 0 with the three numbers, or
 * HUB_EINVAL.
 */
int hub_schema_version_parse(const char *s, int *major, int *minor, int *patch);

/* Starts the registry: its connection, the first load at once.  Logged and
 * left out (every type then unchecked) only when memory runs out. */
void hub_schemas_start(struct hub *hub);

/* Stops polling and closes the connection; the snapshot in use is released
 * (workers still holding it keep it alive). */
void hub_schemas_stop(struct hub *hub);

/* Polls now instead of at the next tick: this process's API changed the
 * registry. */
void hub_schemas_poke(struct hub *hub);

/*
 * Polls now, and runs cb(arg) on the loop once a poll that started after
 * this call has ended: every change committed before the call is then in
 * the snapshot in use (unless that poll or load failed, which is logged).
 * The API answers a change only then, so an event sent to this process
 * right after the answer is checked against it.  Runs cb before returning
 * when there is no registry, and from hub_schemas_stop when it stops
 * first.  Returns 0, or HUB_ENOMEM (cb is not called).
 */
int hub_schemas_after_reload(struct hub *hub, void (*cb)(void *arg), void *arg);

/*
 * 1 once the first snapshot is in use (ingest checks nothing before: it
 * waits, see hub_schemas_when_ready), or when the registry is not running.
 */
int hub_schemas_ready(const struct hub *hub);

/* Runs cb(arg) on the loop once the first snapshot is in use (at once,
 * before this returns, when it already is).  Returns 0 or HUB_ENOMEM. */
int hub_schemas_when_ready(struct hub *hub, void (*cb)(void *arg), void *arg);

/* Forgets the waits of hub_schemas_when_ready() registered with arg: their
 * callback will not run (a stopping ingest releases the batch itself). */
void hub_schemas_cancel_wait(struct hub *hub, void *arg);

/* The snapshot in use, with a reference the caller releases; NULL when the
 * registry holds no schema at all (nothing to check). */
struct hub_schema_set *hub_schemas_acquire(struct hub *hub);

/* Drops a reference from any thread; NULL is ignored. */
void hub_schemas_release(struct hub_schema_set *set);

/* The snapshot's generation. */
uint64_t hub_schema_set_generation(const struct hub_schema_set *set);

/*
 * What an event of (tenant, event_type) whose schemaversion is `version`
 * (NULL: absent) and whose derived major is `major` gets: the tenant's
 * versions of that major if it has any, else the platform's; among them
 * the exact version, else the highest of the major.  *entry is set for
 * HUB_SCHEMA_CHECK (borrowed from set).
 */
enum hub_schema_pick hub_schema_set_pick(const struct hub_schema_set *set, const char *tenant,
                                         const char *event_type, const char *version, int major,
                                         const struct hub_schema_entry **entry);

#endif
