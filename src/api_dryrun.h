/*
 * api_dryrun — POST /admin/policies/dry-run (the policy workbench, SPEC §8):
 * a loaded policy, or Lua source sent with the request, run against a
 * tenant's stored events on the policy threads, under the limits of
 * delivery, without delivering anything and without counting toward a
 * trip.
 *
 * Request (JSON): "tenant" (required); "policy" (or its alias "name"): a
 * loaded policy, or "source": Lua text, or neither when "subscription"
 * names a subscription with a policy; "subscription" (optional): its
 * event types and schema major pick the "recent" events; "events":
 * "recent" (default) or an array of sequence numbers; "limit" (1..1000,
 * default 100); "attempt" and "status" (the failed attempt retry is asked
 * about; default 1 and 500).
 *
 * Answer 200: {"policy", "generation", "results": [{"sequence",
 * "event_id", "type", "stored_body", ...policy_test.h's result}],
 * "errors", "truncated"} — truncated when the events' payloads passed the
 * 8 MiB a dry-run reads (the list is cut there; the first event always
 * comes); 400 naming each bad field; 404 for an unknown subscription;
 * 422 problem+json when the source does not compile ("detail" holds the
 * compile error, "line" its line); 503 when the policy threads have too
 * much workbench work waiting.
 *
 * The route owns its state from the request until the last policy call is
 * back (the call outlives a client that hangs up); the loop only copies
 * rows, queues calls and renders the answer.
 */
#ifndef HUB_API_DRYRUN_H
#define HUB_API_DRYRUN_H

#include <h2o.h>

struct hub;

#define HUB_DRYRUN_LIMIT_MAX 1000
#define HUB_DRYRUN_LIMIT_DEFAULT 100

/* The route (the admin token was checked by the caller). */
void hub_api_dryrun(struct hub *hub, h2o_req_t *req);

#endif
