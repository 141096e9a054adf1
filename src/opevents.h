/*
 * opevents — operational events for tenants (SPEC §10): when one of a
 * tenant's subscriptions is disabled (410 Gone, auto-disable), a delivery
 * goes dead, or the policy a subscription names is tripped, the hub
 * publishes its own CloudEvent into that tenant's stream:
 *
 *   type   hub.subscription.disabled | hub.delivery.dead | hub.policy.tripped
 *   source streaming-hub
 *   subject the subscription id
 *   data   what happened (docs/operational-events.md)
 *
 * Each is stored exactly as an HTTP-ingested event of the tenant
 * (hub_ingest_store: same validation, dedup, sequence, matching, delivery
 * jobs in the same transaction), so the tenant's subscriptions that name
 * those types (exactly, "hub.*" or "*") get it, and the pull API shows it.
 * Matching admits only enabled subscriptions, so a disabled subscription
 * never receives the event about itself.  A dead delivery of an
 * operational event publishes nothing: a subscription that fails on them
 * cannot feed itself.
 *
 * Rate limit: per (subscription, type), STREAMING_HUB_OPEVENTS_PER_MINUTE
 * with a burst of STREAMING_HUB_OPEVENTS_BURST; what is over it is counted
 * (streaming_hub_opevents_total{result="limited"}) and dropped, so a broken
 * endpoint cannot flood its tenant.  Publishing is best effort: an event
 * that cannot be stored is counted as failed and logged, never retried.
 *
 * Loop thread only.  The hooks are no-ops before hub_opevents_start() and
 * after hub_opevents_stop(), or when STREAMING_HUB_OPEVENTS is false.
 */
#ifndef HUB_OPEVENTS_H
#define HUB_OPEVENTS_H

#include <stdint.h>
#include <stdio.h>

struct hub;

enum hub_opevent_type {
    HUB_OPEV_SUB_DISABLED = 0,
    HUB_OPEV_DELIVERY_DEAD,
    HUB_OPEV_POLICY_TRIPPED,
    HUB_OPEV__COUNT
};

enum hub_opevent_result {
    HUB_OPEV_PUBLISHED = 0, /* stored (accepted or a duplicate) */
    HUB_OPEV_LIMITED,       /* over the subscription's rate: dropped */
    HUB_OPEV_FAILED,        /* could not be built or stored */
    HUB_OPEV_RESULT__COUNT
};

/* Starts publishing (after hub->policies exists: its trips are hooked).
 * Returns 0, or HUB_ENOMEM. */
int hub_opevents_start(struct hub *hub);

/* Stops publishing and frees the state; events being stored finish on
 * their own.  Safe when never started. */
void hub_opevents_stop(struct hub *hub);

/* A subscription was disabled; reason "gone" (410) or "auto_disabled".
 * Strings borrowed for the call. */
void hub_opevents_disabled(struct hub *hub, const char *tenant, const char *subscription,
                           const char *reason);

/* A delivery job went dead (reason "exhausted", "policy", "gone", ...).
 * Strings borrowed for the call. */
void hub_opevents_dead(struct hub *hub, const char *tenant, const char *subscription,
                       int64_t job_id, const char *event_id, const char *event_type,
                       const char *reason);

/* Writes streaming_hub_opevents_total{type,result}. */
void hub_opevents_metrics_render(const struct hub *hub, FILE *out);

#endif
