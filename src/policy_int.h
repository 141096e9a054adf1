/*
 * policy_int — what the policy*.c files share (internal: only they include
 * it).  policy.h is the public face and says which file does what.
 *
 * A compiled version of a file (struct hub_policy) is shared: generations
 * and the jobs holding them point to it, any policy thread may call it.
 * Its Lua states (struct policy_state) are not: a call takes one from the
 * version's idle list, or builds a new one, and gives it back when done,
 * so a state is only ever used by one thread at a time.
 *
 * Which thread writes what:
 *   - the name, hash, source, limits and defs are written once by the
 *     compile and read-only afterwards;
 *   - the idle list, the state count and the hub.log limiter are under mu;
 *   - memory and the trip tags (trip_tags, all_until_ms) are atomics (a
 *     state's owner adds its growth after each call; the loop sets the
 *     trips, threads read them);
 *   - the trip records (trips_of, trips_none) belong to the loop
 *     (policy.c);
 *   - a state's fields belong to the thread running a call on it.
 */
#ifndef HUB_POLICY_INT_H
#define HUB_POLICY_INT_H

#include <lua.h>
#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "lbudget.h"
#include "policy.h"
#include "util.h"

/* Why a call was stopped: once set, no pcall inside the policy can catch
 * the error that unwinds it. */
enum policy_condemned { POLICY_ALIVE = 0, POLICY_CONDEMNED_TIMEOUT, POLICY_CONDEMNED_NOMEM };

struct policy_pool;

/* What the file's top level returned, as validated at load. */
struct policy_defs {
    int has_fn[HUB_POLICY_FN__COUNT];      /* a function (retry: or a table) */
    int64_t schedule[HUB_RETRY_MAX_STEPS]; /* retry as a table */
    size_t n_schedule;
};

/* Tenants with a trip record at once per policy version (struct
 * hub_policy), and a tenant id's longest (the API's). */
#define POLICY_TRIP_SLOTS 64
#define POLICY_TENANT_MAX 256

/* The allocator's cache of freed blocks (policy_sandbox.c): size classes
 * of 16 bytes up to 256, then four per power of two up to 4 KiB. */
#define POLICY_BLOCK_CLASSES 32
#define POLICY_BLOCK_MAX 4096

/* One Lua state of a version, used by one call at a time. */
struct policy_state {
    struct policy_state *next; /* the version's idle list */
    struct hub_policy *p;      /* the version it belongs to */
    lua_State *L;
    size_t used;      /* bytes the allocator has handed out */
    size_t cap;       /* ... and may hand out */
    size_t published; /* the part of used already added to p->memory */
    /* Blocks Lua freed, kept for its next allocations of their class: a
     * call allocates and frees the same few dozen small blocks (the event
     * table, its strings, ev.data, the shaped body), and a state moves
     * between policy threads, whose malloc arenas would otherwise pass the
     * blocks back and forth under their locks.  At most
     * POLICY_BLOCK_CACHE_BYTES (policy_sandbox.c); not counted in used. */
    void *blocks[POLICY_BLOCK_CLASSES];
    size_t cached;
    int64_t timeout_ns;
    /* The running call's clock (policy_sandbox.c: only the deadline
     * functions there read these). */
    uint64_t start_ns;     /* monotonic at arm; 0 outside a call */
    uint64_t start_cpu_ns; /* the thread's CPU clock at the call's first check */
    int checked;           /* the deadline was checked during the call */
    enum policy_condemned condemned;
    struct hub_lbudget budget;        /* the library functions' view of the deadline */
    int policy_code;                  /* policy code runs: large blocks need time */
    int ref_fn[HUB_POLICY_FN__COUNT]; /* registry refs of the functions, LUA_NOREF if absent */
    int ref_encode;                   /* json.encode, for shaped tables */
    int ref_decode;                   /* json.decode, for ev.data */
    int ref_ev_meta;                  /* metatable of ev (lazy data) */
    int ref_ev_last;                  /* the last ev built, and ... */
    uint64_t ev_last_serial;          /* ... its serial (0 = none) */
};

/* The loop's half of a tenant's trip record (the tag's slot). */
struct policy_trip {
    char tenant[POLICY_TENANT_MAX + 1];
    int64_t *fail_ms; /* ring of the last trip_failures failures (Unix ms) */
    int fail_n, fail_at;
    int64_t last_ms; /* its last failure */
};

struct hub_policy {
    atomic_int refs;
    char name[HUB_POLICY_NAME_MAX + 1];
    char hash[65];
    char *src; /* the source, for the states built later */
    size_t len;
    struct hub_policy_limits lim;
    struct policy_defs defs;

    uv_mutex_t mu;
    struct policy_state *idle; /* states no call is using */
    int n_states;              /* states built and not yet closed */
    double log_tokens;         /* hub.log rate limit */
    uint64_t log_last_ns;
    uint64_t log_dropped;

    atomic_size_t memory;          /* bytes of all states, as published */
    struct policy_pool *pool;      /* where the last unref sends it, or NULL */
    struct hub_policy *grave_next; /* the pool's list of versions to free */

    /* Tripping is per tenant (SPEC §8: one tenant's events that make the
     * policy overrun must not stop it for the others): a tenant's trip
     * record takes one of POLICY_TRIP_SLOTS slots while it has failures
     * within the window or a cool-down running.  Its tag is what the
     * policy threads read (policy_trip_until); the rest is the loop's
     * (policy.c).  The tenants that find every slot held by a cool-down
     * count their failures together (trips_none): trip_failures of them
     * within the window trip the version for every tenant (all_until_ms),
     * as so many tenants tripping it at once is the policy's fault. */
    struct policy_trip_tag {
        atomic_ullong owner;   /* policy_trip_owner() of its tenant; 0: free */
        atomic_llong until_ms; /* Unix ms; 0 or past: its calls run */
    } trip_tags[POLICY_TRIP_SLOTS];
    atomic_llong all_until_ms;
    struct policy_trip *trips_of;  /* POLICY_TRIP_SLOTS, made at the first failure */
    struct policy_trip trips_none; /* the failures of tenants that found no slot */
    uint64_t trips;                /* of all tenants */
    char *last_call_error;         /* of the last timeout or memory stop */
};

/* A tenant's tag owner: its id's hash, never 0 (NULL counts as ""). */
static inline uint64_t policy_trip_owner(const char *tenant) {
    return hub_fnv1a_str(tenant != NULL ? tenant : "") | 1;
}

/* Until when (Unix ms) calls of p for the tenant whose owner is `owner` are
 * not run: its own cool-down, or the version's; 0 when neither runs.  Any
 * thread. */
static inline int64_t policy_trip_until(const struct hub_policy *p, uint64_t owner,
                                        int64_t now_ms) {
    int64_t all = atomic_load(&p->all_until_ms), until = 0;

    for (int i = 0; i < POLICY_TRIP_SLOTS; i++) {
        if (atomic_load(&p->trip_tags[i].owner) == owner) {
            until = atomic_load(&p->trip_tags[i].until_ms);
            break;
        }
    }
    until = until > all ? until : all;
    return until > now_ms ? until : 0;
}

/* ------------------------------------------------- policy_sandbox.c -- */

/*
 * Builds a state of p from p->src: the sandbox, then the file's top level
 * under the limits, whose table is validated into *defs.  Returns the state
 * (not on the idle list) or NULL with a one-line message in err.  Any
 * thread; p's shared fields are not touched but for n_states and memory.
 */
struct policy_state *policy_state_new(struct hub_policy *p, struct policy_defs *defs, char *err,
                                      size_t errlen);

/* Closes the state and frees it; subtracts its bytes from p->memory. */
void policy_state_free(struct policy_state *s);

/* Adds what the state grew (or shrank) by since the last time to
 * p->memory. */
void policy_state_publish(struct policy_state *s);

/* Starts a call's deadline on the calling thread, and ends it. */
void policy_deadline_arm(struct policy_state *s);
void policy_deadline_disarm(struct policy_state *s);

/* The CPU time of the last call on s, on the calling thread, measured from
 * its first check; 0 for a call too short to have been checked.  Call
 * right after the call. */
int64_t policy_cpu_spent_ns(const struct policy_state *s);

/* Copies Lua's message for the error on top of the stack into err,
 * prefixed, naming the file when Lua's message does not. */
void policy_error_text(lua_State *L, const char *name, const char *prefix, char *err,
                       size_t errlen);

/* SHA-256 of src[0..len) as hex into out[65]. */
void policy_source_hash(const char *src, size_t len, char out[65]);

/*
 * Compiles a version of the file name (hash: of src, computed by the
 * caller): a copy of the source and its first state, which validates the
 * file and waits on the idle list for the first call.  Returns it with one
 * reference, or NULL with a one-line message in err.  Any thread.
 */
struct hub_policy *policy_compile(const char *name, const char *src, size_t len, const char *hash,
                                  const struct hub_policy_limits *lim, char *err, size_t errlen);

/* Closes every state and frees p: the last reference is gone. */
void policy_destroy(struct hub_policy *p);

/* ---------------------------------------------------- policy_call.c -- */

/* Runs the call on the calling thread (hub_policy_match/retry/shape as
 * the call says) and fills its results. */
void policy_call_run(struct hub_policy_call *c);

/* ---------------------------------------------------- policy_pool.c -- */

/*
 * Starts `threads` policy threads.  done(arg, call) runs on the loop for
 * each finished call, in the order they finished.  Returns NULL (logged)
 * when out of memory or when no thread starts.
 */
struct policy_pool *policy_pool_new(uv_loop_t *loop, int threads,
                                    void (*done)(void *arg, struct hub_policy_call *call),
                                    void *arg);

/* Queues a call under its key (round-robin between keys); loop thread.
 * The threads get the calls of a loop turn together, once its callbacks
 * are done (before the loop polls again). */
void policy_pool_submit(struct policy_pool *pool, struct hub_policy_call *call);

/* Calls waiting for a thread now, and the threads. */
size_t policy_pool_queued(struct policy_pool *pool);
int policy_pool_threads(const struct policy_pool *pool);

/* Takes a reference on the pool for a version that will send its last
 * unref there. */
void policy_pool_ref(struct policy_pool *pool);

/* Hands a version whose last reference is gone to a policy thread, which
 * destroys it.  Returns 0 when the threads have stopped: the caller
 * destroys it itself. */
int policy_pool_bury(struct policy_pool *pool, struct hub_policy *p);

/* Drops a version's reference on the pool (after its destroy). */
void policy_pool_unref(struct policy_pool *pool);

/* Stops and joins the threads (versions buried before are destroyed
 * first), closes the wakeup handle on the loop and drops the registry's
 * reference.  Loop thread; nothing may be queued any more. */
void policy_pool_stop(struct policy_pool *pool);

#endif
