/*
 * policy — sandboxed Lua policies (SPEC §8): compile, run with limits, and
 * hot-reload as generations.
 *
 * A policy is $STREAMING_HUB_POLICY_DIR/<name>.lua returning a table with
 * optional `match`, `retry` and `shape`.  Each compiled policy owns one Lua
 * state: its own allocator with a memory cap, the JIT switched off (count
 * hooks do not fire in compiled traces) and a count hook that enforces a
 * per-call deadline.  Policy code sees only the environment lua/sandbox.lua
 * builds: no io, os.execute, require, load*, dofile, debug, ffi, jit,
 * string.dump or bytecode, and no way to the real string metatable.  The
 * library functions that could run long in C, where the hook never fires
 * (patterns, string.rep, table.concat, table.insert, json), are the hub's
 * own versions that the deadline stops (lpattern.h, lbulk.h, ljson.h).
 *
 * States and threads: one state per policy per loaded version, run on the
 * loop thread of the process that owns the job.  Independent states mean a
 * memory bomb or a leak in one policy never affects another, and a reload
 * compiles new states beside the old ones on the threadpool.  A call can
 * block the loop for at most STREAMING_HUB_POLICY_TIMEOUT (10 ms by
 * default); typical calls take a few microseconds.
 *
 * Generations (Varnish's vcl.load/vcl.use): the registry publishes an
 * immutable, reference-counted generation mapping names to policies.  A job
 * takes a reference when it is claimed and releases it when its outcome is
 * recorded, so it finishes on the generation it started with; the last
 * release frees the generation, and a policy is freed with the last
 * generation that holds it.  A file that fails to compile keeps its previous
 * version in the new generation.
 *
 * Everything except hub_policy_compile() and hub_policy_scan_dir() runs on
 * the loop thread only.
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

struct hub_policy_limits {
    int64_t timeout_ms;  /* CPU deadline per call (wall clock of the calling thread) */
    size_t memory_bytes; /* per Lua state */
};

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
    HUB_POLICY_STATUS__COUNT
};

/* "match", "retry", "shape" */
const char *hub_policy_fn_str(enum hub_policy_fn fn);

/* "ok", "error", "timeout", "nomem", "bad_return", "missing" */
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
void hub_policy_unref(struct hub_policy *p); /* frees the state with the last reference */

const char *hub_policy_name(const struct hub_policy *p);
/* SHA-256 of the source, hex. */
const char *hub_policy_hash(const struct hub_policy *p);
/* Whether the policy defines the function (retry: a function or a table). */
int hub_policy_has(const struct hub_policy *p, enum hub_policy_fn fn);
/* Bytes the policy's state holds now. */
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
 * Runs match(ev).  On HUB_POLICY_OK, *matched is the truth of its result;
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

/* A shaped request.  Owned by the caller; release with
 * hub_policy_shaped_free(). */
struct hub_policy_shaped {
    char *body; /* NULL: the body is unchanged */
    size_t body_len;
    char *content_type; /* NULL: unchanged (application/json when body came from a table) */
    json_t *headers;    /* object of extra headers (names as returned), or NULL */
};

void hub_policy_shaped_free(struct hub_policy_shaped *s);

/*
 * Runs shape(ev).  A string result is the new body; a table is JSON-encoded
 * (Content-Type application/json); nil keeps the body.  The optional second
 * result is a table of extra headers (string names and values, at most
 * HUB_POLICY_HEADERS_MAX, no control bytes); a "Content-Type" there sets the
 * content type.  Which headers may be sent is the caller's business.  On
 * any status but OK, *out is empty and the attempt fails with policy_error.
 * A policy without shape returns OK with *out empty.
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
 * Makes the registry and loads dir synchronously as generation 1 (a missing
 * directory is an empty generation, logged).  Borrows loop until freed.
 * Returns NULL only when out of memory.
 */
struct hub_policies *hub_policies_new(uv_loop_t *loop, const char *dir,
                                      const struct hub_policy_limits *lim);

/*
 * Stops reloading and drops the registry's reference to the current
 * generation; generations still held by jobs live on until released.  A
 * reload still compiling finishes on the threadpool first (the loop keeps
 * running until it does).  NULL is a no-op.
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
 * the call; NULL when the reload could not run) and its duration.
 */
void hub_policies_reload(struct hub_policies *ps,
                         void (*cb)(void *arg, const char *json, double seconds), void *arg);

/*
 * 1 when a subscription may name it: the current generation has a loaded
 * version of name.  Otherwise 0 and *why says "unknown" or the load error.
 */
int hub_policies_usable(struct hub_policies *ps, const char *name, const char **why);

/* GET /admin/policies: {"generation", "loaded_at", "dir", "policies": [...]}, malloc'd. */
char *hub_policies_json(struct hub_policies *ps);

/* Counts one failed or stopped call (streaming_hub_policy_errors_total). */
void hub_policies_count_error(struct hub_policies *ps, const char *policy, enum hub_policy_fn fn,
                              enum hub_policy_status status);

/* Writes the policy metrics (errors, reloads, generation) in Prometheus text. */
void hub_policies_metrics_render(const struct hub_policies *ps, FILE *out);

#endif
