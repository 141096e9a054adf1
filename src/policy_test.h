/*
 * policy_test — the policy workbench (SPEC §2.1, §8): runs a policy's
 * match, shape and retry against one event and says what each would do,
 * without delivering anything.
 *
 * Two users share it:
 *   - `streaming-hub policy-test FILE [EVENT_FILE...] [--attempt N --status
 *     CODE]` (hub_policy_test_main), offline, on the calling thread;
 *   - POST /admin/policies/dry-run (api_dryrun.c), which runs
 *     hub_policy_try_run() on a policy thread, one event per call.
 * Both produce the same result object (hub_policy_try_json), so what the
 * command prints and what the endpoint answers cannot drift apart.
 *
 * The calls go through the synchronous entry points of policy.h: the same
 * sandbox, deadline and memory cap as delivery.  Nothing here notes a
 * failure for tripping: that is done only by the registry's completion of
 * delivery calls (policy.c).
 */
#ifndef HUB_POLICY_TEST_H
#define HUB_POLICY_TEST_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "policy.h"

/* What the three functions did for one event.  Owned by the caller;
 * release with hub_policy_try_free(). */
struct hub_policy_try {
    enum hub_policy_status st[HUB_POLICY_FN__COUNT]; /* per function */
    int ran[HUB_POLICY_FN__COUNT];                   /* the policy defines it (retry: a function) */
    int matched;                                     /* match's truth (1 on error: SPEC §8) */
    struct hub_policy_shaped shaped;                 /* shape's request when it ran and was OK */
    enum hub_policy_retry_action action;
    int64_t delay_ms;    /* the delay, or the schedule step (jitter draws 1..step); -1: dead */
    int from_policy;     /* the schedule step is the policy's retry table */
    int err_fn;          /* function of the first error, or -1 */
    char err[512];       /* its message: "<fn>: <name>.lua:<line>: ..." */
    int64_t cpu_us;      /* CPU time of the three calls on the calling thread */
    size_t memory_bytes; /* bytes the policy's states hold after the calls */
};

/*
 * Runs match, shape and retry of p on ev (and rctx for retry) on the
 * calling thread, never the loop.  Any thread; p is borrowed.  A function
 * the policy does not define gives the neutral answer (matched, body
 * unchanged, the schedule).  A policy without a retry table takes its step
 * from the default curve (backoff.h), as a subscription without a
 * retry_schedule would.
 */
void hub_policy_try_run(struct hub_policy *p, const struct hub_policy_event *ev,
                        const struct hub_policy_retry_ctx *rctx, struct hub_policy_try *out);

void hub_policy_try_free(struct hub_policy_try *t);

/*
 * The line an error message names for the policy file name ("<name>.lua:12:"
 * gives 12), or 0 when it names none (a timeout, a bad return value).
 */
int hub_policy_error_line(const char *msg, const char *name);

/*
 * The result object of the dry-run contract for t (returned owned, NULL on
 * out of memory): "match" (true/false, null on error), "shape" ({"body",
 * "headers"} — "body_encoding": "base64" when the body is not UTF-8 — or
 * null when the policy has no shape or it failed), "retry" ({"attempt",
 * "status", "delay_ms" (null when dead), "action"}), "error" (null or
 * {"function", "kind", "message", "line"}), "cpu_us", "memory_bytes".
 * stored_body (the event's body, for "shape.body" when shape kept it) is
 * borrowed.
 */
json_t *hub_policy_try_json(const struct hub_policy_try *t, const char *name,
                            const struct hub_policy_retry_ctx *rctx, const void *stored_body,
                            size_t stored_len);

/* A body as the contract carries it: text when it is UTF-8, else base64 with
 * "<key>_encoding": "base64" set on obj.  Returns 0, or -1 on out of memory. */
int hub_policy_body_set(json_t *obj, const char *key, const void *body, size_t len);

/* `streaming-hub policy-test ...`: argv after the command.  Returns the exit
 * status: 0 when every event ran without error, 1 on any error, 2 on usage. */
int hub_policy_test_main(int argc, char **argv);

#endif
