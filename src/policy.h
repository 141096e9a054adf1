/*
 * policy — sandboxed Lua policies (SPEC §8): compile, run with limits on a
 * pool of policy threads, trip the ones that keep failing, and hot-reload
 * them as generations.
 *
 * A policy is $STREAMING_HUB_POLICY_DIR/<name>.lua returning a table with
 * optional `match`, `retry` and `shape`.  Each compiled version of a file
 * (struct hub_policy) owns one or more Lua states, each with its own
 * allocator and memory cap, the JIT switched off (count hooks do not fire
 * in compiled traces) and a count hook that enforces a per-call deadline in
 * the calling thread's CPU time, with a wall-clock backstop.  Policy code
 * sees only the environment lua/sandbox.lua builds: no io, os.execute,
 * require, load*, dofile, debug, ffi, jit, string.dump or bytecode, and no
 * way to the real string metatable.  The library functions that could run
 * long in C, where the hook never fires (patterns, string.rep,
 * table.concat, table.insert, json), are the hub's own versions that the
 * deadline stops (lpattern.h, lbulk.h, ljson.h).
 *
 * Files, by job:
 *   policy_sandbox.c  a state: allocator, hook, the deadline, the sandbox,
 *                     the file's top level; compiling a version
 *   policy_call.c     one call on a state of a version (match, retry,
 *                     shape) and its results: the synchronous entry points
 *   policy_pool.c     the policy threads, the per-subscription fair queue,
 *                     completions back on the loop
 *   policy.c          directory scans, generations, the registry, reload,
 *                     tripping, GET /admin/policies, metrics
 *
 * States and threads: the loop never runs Lua (generation 1 is compiled by
 * hub_policies_new(), before the loop runs; reloads compile on the libuv
 * threadpool).  Dispatch hands a call to
 * hub_policies_submit(); one of STREAMING_HUB_POLICY_THREADS threads runs
 * it on a state of the version (a state is used by one call at a time;
 * a version compiles more states, lazily, when calls of it run on several
 * threads at once), and the result comes back on the loop.  Calls wait in
 * one queue per fairness key (the subscription); tenants (ev.tenant) are
 * served round-robin, and each tenant's keys in its turns, so a tenant's
 * backlog delays another tenant's call by at most one call per thread.
 *
 * Generations (Varnish's vcl.load/vcl.use): the registry publishes an
 * immutable, reference-counted generation mapping names to versions.  A job
 * takes a reference when its attempt starts and releases it when its
 * outcome is recorded, so it finishes on the generation it started with
 * (its calls hold no reference of their own: the job outlives them).  The
 * last release frees the generation; a version is freed with the last
 * generation that holds it, its states closed on a policy thread.
 *
 * Threads: hub_policy_compile(), hub_policy_check_dir(), the calls
 * (hub_policy_match/retry/shape) and hub_policy_ref/unref are thread-safe;
 * everything named hub_policies_* runs on the loop thread only.
 */
#ifndef HUB_POLICY_H
#define HUB_POLICY_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

#define HUB_POLICY_NAME_MAX 64
#define HUB_POLICY_FILE_MAX (1 << 20) /* source bytes */
#define HUB_POLICY_BODY_MAX (4 << 20) /* a shaped body */
#define HUB_POLICY_HEADERS_MAX 32     /* headers a shape may add */
#define HUB_POLICY_HEADER_VALUE_MAX 8192

struct hub_policy;
struct hub_policy_gen;
struct hub_policies;

struct hub_config;

struct hub_policy_limits {
    int64_t timeout_ms;  /* deadline per call, in the calling thread's CPU time */
    size_t memory_bytes; /* per Lua state */
    /* The registry's (hub_policies_new); compile and check ignore them. */
    int threads;              /* policy threads; 0: the number of cores */
    int trip_failures;        /* timeouts or memory stops that trip a policy; 0: never */
    int64_t trip_window_ms;   /* ... within this window */
    int64_t trip_cooldown_ms; /* how long a tripped policy's calls are not run */
};

/* The limits the configuration sets (STREAMING_HUB_POLICY_*). */
struct hub_policy_limits hub_policy_limits_from(const struct hub_config *cfg);

enum hub_policy_fn {
    HUB_POLICY_MATCH = 0,
    HUB_POLICY_RETRY,
    HUB_POLICY_SHAPE,
    HUB_POLICY_FN__COUNT
};

/* The result of one call (HAProxy's hlua result enum). */
enum hub_policy_status {
    HUB_POLICY_OK = 0,
    HUB_POLICY_ERROR,      /* the function raised an error */
    HUB_POLICY_TIMEOUT,    /* it ran past the deadline and was stopped */
    HUB_POLICY_NOMEM,      /* it hit the state's memory cap */
    HUB_POLICY_BAD_RETURN, /* it returned the wrong type, or too much */
    HUB_POLICY_MISSING,    /* the subscription names a policy that is not loaded */
    HUB_POLICY_TRIPPED,    /* the policy is tripped: answered without running */
    HUB_POLICY_STATUS__COUNT
};

/* "match", "retry", "shape" */
const char *hub_policy_fn_str(enum hub_policy_fn fn);

/* "ok", "error", "timeout", "nomem", "bad_return", "missing", "tripped" */
const char *hub_policy_status_str(enum hub_policy_status s);

/* 1 when s is a valid policy name: [A-Za-z0-9_-]{1,64}. */
int hub_policy_name_valid(const char *s, size_t len);

/* ------------------------------------------------------- one policy ---- */

/*
 * Compiles a policy from source text src[0..len) in a new sandboxed state:
 * runs the chunk (under the limits) and validates the table it returns.
 * name is the policy name (messages say "<name>.lua:<line>: ...").
 * Returns a policy with one reference, or NULL with a one-line message in
 * err naming the file and, when Lua knows it, the line.  Thread-safe (each
 * call makes its own state).
 */
struct hub_policy *hub_policy_compile(const char *name, const char *src, size_t len,
                                      const struct hub_policy_limits *lim, char *err,
                                      size_t errlen);

void hub_policy_ref(struct hub_policy *p);
void hub_policy_unref(struct hub_policy *p); /* frees the states with the last reference */

const char *hub_policy_name(const struct hub_policy *p);
/* SHA-256 of the source, hex. */
const char *hub_policy_hash(const struct hub_policy *p);
/* Whether the policy defines the function (retry: a function or a table). */
int hub_policy_has(const struct hub_policy *p, enum hub_policy_fn fn);
/* Bytes the version's states hold, all together, as of their last calls. */
size_t hub_policy_memory(const struct hub_policy *p);

/* The event a hook sees (ev).  Everything is borrowed for the call. */
struct hub_policy_event {
    const char *id, *source, *type, *event_type, *tenant, *subject, *time;
    const char *schema_version, *content_type;
    int schema_major;
    const char *const *extensions; /* name, value, ..., NULL; may be NULL */
    const void *body;
    size_t body_len;
    /* Non-zero and unique per job attempt: calls with the same serial on the
     * same policy share one ev table, so match and shape decode ev.data once.
     * 0 builds a fresh ev for every call. */
    uint64_t serial;
};

/*
 * Runs match(ev) on the calling thread, on a state of p that no other call
 * uses meanwhile (the synchronous entry point: the policy threads, tests and
 * tools; never the loop).  On HUB_POLICY_OK, *matched is the truth of its result;
 * on any other status the caller treats the event as matched (SPEC §8: an
 * error never loses an event) and err holds a message naming the file,
 * line and function.  A policy without match returns OK with *matched = 1.
 */
enum hub_policy_status hub_policy_match(struct hub_policy *p, const struct hub_policy_event *ev,
                                        int *matched, char *err, size_t errlen);

enum hub_policy_retry_action {
    HUB_POLICY_RETRY_SCHEDULE =
        0,                  /* use the schedule (the policy's table, or the subscription's) */
    HUB_POLICY_RETRY_DELAY, /* retry after *delay_ms, clamped to [1 ms, 10h] */
    HUB_POLICY_RETRY_DEAD,  /* dead-letter now */
};

/* What retry(ctx) sees: the attempt that just failed. */
struct hub_policy_retry_ctx {
    int attempt;       /* 1-based number of the failed attempt */
    int status;        /* HTTP status, 0 = none */
    const char *error; /* error class ("status", "timeout", "connect", ...), or NULL */
};

/*
 * Runs the retry function.  On OK, *action says what to do (and *delay_ms
 * for a delay).  Any other status means: use the default curve (SPEC §8).
 * A policy whose retry is a table, or has none, returns OK with
 * HUB_POLICY_RETRY_SCHEDULE; see hub_policy_retry_schedule().
 */
enum hub_policy_status hub_policy_retry(struct hub_policy *p,
                                        const struct hub_policy_retry_ctx *ctx,
                                        enum hub_policy_retry_action *action, int64_t *delay_ms,
                                        char *err, size_t errlen);

/* A policy's retry table, validated at load (1..12 steps, each in
 * (0, 10h]): stores the steps in *steps (borrowed from p) and returns the
 * count, or returns 0 with *steps untouched when retry is not a table. */
size_t hub_policy_retry_schedule(const struct hub_policy *p, const int64_t **steps);

/*
 * A shaped request, in one buffer: shape runs on a policy thread and its
 * result is read and dropped on the loop, so one block crosses between
 * them, not one per header; and a caller that keeps the struct for its
 * next call (the dispatcher's attempt contexts) reuses the buffer.  Owned
 * by the caller: zeroed before its first use, released with
 * hub_policy_shaped_free().
 */
struct hub_policy_shaped {
    const char *body; /* NULL: the body is unchanged; else body_len bytes */
    size_t body_len;
    const char *content_type; /* NULL: unchanged (application/json when body came from a table) */
    size_t n_headers;         /* extra headers (names as returned): hub_policy_shaped_next() */
    /* private: body, content type and headers, in one buffer */
    char *buf;
    size_t len, cap;
    size_t headers_at, headers_end; /* the headers' bytes */
};

/* Empties s, keeping its buffer for the next result. */
void hub_policy_shaped_reset(struct hub_policy_shaped *s);
void hub_policy_shaped_free(struct hub_policy_shaped *s);

/* The extra headers one by one, in the order shape's table gave them:
 * *pos starts at 0; returns the next name (its value in *value), or NULL
 * after the last. */
const char *hub_policy_shaped_next(const struct hub_policy_shaped *s, size_t *pos,
                                   const char **value);

/* The value of the extra header named name (as returned, exact case), or
 * NULL. */
const char *hub_policy_shaped_header(const struct hub_policy_shaped *s, const char *name);

/*
 * Runs shape(ev).  A string result is the new body; a table is JSON-encoded
 * (Content-Type application/json); nil keeps the body.  The optional second
 * result is a table of extra headers (string names and values, at most
 * HUB_POLICY_HEADERS_MAX, no control bytes); a "Content-Type" there sets the
 * content type.  Which headers may be sent is the caller's business.  On
 * any status but OK, *out is empty and the attempt fails with policy_error.
 * A policy without shape returns OK with *out empty.  *out is zeroed or
 * holds an earlier result, whose buffer is reused.
 */
enum hub_policy_status hub_policy_shape(struct hub_policy *p, const struct hub_policy_event *ev,
                                        struct hub_policy_shaped *out, char *err, size_t errlen);

/* --------------------------------------------------------- generations -- */

/* The policy named name in gen, or NULL (borrowed while gen is held). */
struct hub_policy *hub_policy_gen_find(const struct hub_policy_gen *gen, const char *name);

/* Generation number (1 for the first load). */
uint64_t hub_policy_gen_number(const struct hub_policy_gen *gen);

void hub_policy_gen_release(struct hub_policy_gen *gen); /* NULL is a no-op */

/*
 * Loads every <name>.lua in dir (names that are not valid policy names are
 * reported and skipped), calling report(arg, file, message) for each
 * problem.  Returns the number of files that loaded, or -1 when dir cannot
 * be read.  What check-policies runs; nothing is kept.
 */
int hub_policy_check_dir(const char *dir, const struct hub_policy_limits *lim,
                         void (*report)(void *arg, const char *file, const char *message),
                         void *arg);

/* ------------------------------------------------------------ registry -- */

/*
 * Makes the registry, starts lim->threads policy threads and loads dir
 * synchronously as generation 1 (a missing directory is an empty
 * generation, logged).  Borrows loop until freed.  Returns NULL only when
 * out of memory or when no thread could be started.
 */
struct hub_policies *hub_policies_new(uv_loop_t *loop, const char *dir,
                                      const struct hub_policy_limits *lim);

/*
 * Stops reloading, drops the registry's reference to the current
 * generation and stops the policy threads, once every caller is gone (no
 * call may be queued or running: the dispatcher has stopped).  A reload
 * still compiling finishes on the threadpool first, and the threads' wakeup
 * handle closes on the loop: the loop keeps running until both are done.
 * NULL is a no-op.
 */
void hub_policies_free(struct hub_policies *ps);

/* The current generation, with a reference for the caller (never NULL). */
struct hub_policy_gen *hub_policies_acquire(struct hub_policies *ps);

/*
 * Starts a reload: the directory is read and compiled on the threadpool
 * beside the current generation, which is replaced on the loop when it is
 * done.  Requests made while a reload runs coalesce into one more reload
 * after it (the files may have changed after it read them).  cb, when not
 * NULL, is called on the loop once a reload that started after this call
 * has been published, with the new generation's admin JSON (borrowed for
 * the call; NULL when the reload could not run) and its duration.  Every
 * policy of the new generation starts untripped.
 */
void hub_policies_reload(struct hub_policies *ps,
                         void (*cb)(void *arg, const char *json, double seconds), void *arg);

/*
 * 1 when a subscription may name it: the current generation has a loaded
 * version of name.  Otherwise 0 and *why says "unknown" or the load error.
 */
int hub_policies_usable(struct hub_policies *ps, const char *name, const char **why);

/* GET /admin/policies: {"generation", "loaded_at", "dir", "policies": [...]}, malloc'd.
 * Each loaded policy has its trip record: "state" ("ok" or "tripped"),
 * "tripped_until" (or null), "trips" and "last_call_error" (or null). */
char *hub_policies_json(struct hub_policies *ps);

/* Counts one failed or stopped call (streaming_hub_policy_errors_total). */
void hub_policies_count_error(struct hub_policies *ps, const char *policy, enum hub_policy_fn fn,
                              enum hub_policy_status status);

/* Writes the policy metrics (errors, trips, reloads, generation, the
 * threads' queue) in Prometheus text. */
void hub_policies_metrics_render(const struct hub_policies *ps, FILE *out);

/* ------------------------------------------------- calls off the loop -- */

/*
 * One policy call run on a policy thread.  The caller owns it (usually
 * embedded in what it keeps for the job) and fills the first group; the
 * result group is valid in cb.  Everything the call points to is borrowed
 * until cb: the version (the caller holds the generation that holds it),
 * the key and the event's strings.
 */
struct hub_policy_call {
    struct hub_policy *policy;
    enum hub_policy_fn fn;
    const char *key;            /* fairness key within ev.tenant's turns: the subscription id */
    struct hub_policy_event ev; /* match, shape */
    struct hub_policy_retry_ctx retry;        /* retry */
    void (*cb)(struct hub_policy_call *call); /* on the loop; may free the call */
    void *arg;
    /* The workbench's own work (hub_policies_submit_dry): when set, the
     * policy thread runs run(call) instead of fn, with policy possibly
     * NULL; the call is never noted for tripping. */
    void (*run)(struct hub_policy_call *call);
    /* With fn MATCH: when the match answers yes, run the policy's shape in
     * the same visit (one hand-off instead of two).  Its answer then goes
     * to shape_status, shaped and err, and shaped_ahead is set; match's
     * status is OK. */
    int shape_ahead;

    /* results, as the synchronous functions give them */
    enum hub_policy_status status;
    int matched;
    int shaped_ahead;
    enum hub_policy_status shape_status;
    enum hub_policy_retry_action action;
    int64_t delay_ms;
    struct hub_policy_shaped shaped; /* the caller's to free (hub_policy_shaped_free); its
                                      * buffer is kept from one call to the next */
    char err[512];
    uint64_t queued_ns, started_ns, ended_ns; /* monotonic: submitted, run, done */
    int64_t cpu_ns; /* CPU time it used when it ran long enough to be measured (past its
                     * first deadline check, a few microseconds in), else 0 */

    struct hub_policy_call *next; /* the pool's queues */
};

/*
 * Submits a call.  Returns 0 when it is queued for a policy thread: cb then
 * runs on the loop once it is done (never before this returns).  Returns 1
 * when it was answered at once, without running and without cb: the policy
 * does not define the function (the neutral answer, status OK), or it is
 * tripped (status HUB_POLICY_TRIPPED, err says until when and why).  A call
 * that times out or runs out of memory counts toward tripping its policy.
 */
int hub_policies_submit(struct hub_policies *ps, struct hub_policy_call *call);

/*
 * Queues a workbench call (call->run set; policy, fn and ev unused by the
 * registry) for a policy thread, under call->key like a delivery's call, so
 * a dry-run takes turns with the subscriptions and never holds the loop.
 * It runs even when its policy is tripped, and what it does never counts
 * toward a trip.  Returns 0 (cb runs on the loop once it is done), or
 * HUB_EAGAIN when HUB_POLICY_DRY_MAX workbench calls are already waiting.
 */
#define HUB_POLICY_DRY_MAX 4096
int hub_policies_submit_dry(struct hub_policies *ps, struct hub_policy_call *call);

/* How many more workbench calls hub_policies_submit_dry() would take now. */
size_t hub_policies_dry_room(const struct hub_policies *ps);

/* The limits the registry compiles and runs policies under. */
struct hub_policy_limits hub_policies_limits(const struct hub_policies *ps);

/*
 * Sets the function called on the loop when a policy trips (NULL: none):
 * with the policy's name, the tenant it tripped for (NULL: every tenant),
 * the end of its cool-down (Unix ms) and the error of the call that tripped
 * it, all borrowed for the call.  Runs after the trip is logged and
 * counted; it must not call back into the registry.
 */
void hub_policies_on_trip(struct hub_policies *ps,
                          void (*cb)(void *arg, const char *policy, const char *tenant,
                                     int64_t until_ms, const char *last_error),
                          void *arg);

#endif
