#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*
# Operational events for tenants (SPEC §10, docs/operational-events.md), end
# to end: Kafka → hub → PostgreSQL → the recording sink.
#
#   - a delivery that goes dead publishes hub.delivery.dead (source
#     streaming-hub, subject the subscription) into its tenant's stream:
#     stored like any event and delivered to the tenant's subscription that
#     asks for hub.*;
#   - a 410 disables a subscription and publishes hub.subscription.disabled;
#     the disabled subscription, which asks for hub.* itself, never gets it;
#   - a policy that trips publishes hub.policy.tripped to the tenants whose
#     subscriptions use it;
#   - isolation: another tenant's hub.* subscription gets nothing of these,
#     and nothing is stored in its stream;
#   - the rate limit: a subscription whose jobs keep dying publishes at most
#     the burst (3) within a few seconds, the rest counted as limited;
#   - STREAMING_HUB_OPEVENTS=false publishes nothing;
#   - a last attempt whose outcome the lease fence refuses (the job was
#     handed to another holder meanwhile) publishes no hub.delivery.dead.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"

TOPIC=lerian.streaming.opevents
ONE='"retry_schedule":["100ms"]'

setup() {
    POL=$WORK/pol
    mkdir -p "$POL"
    printf 'return { match = function(ev) while true do end end }\n' >"$POL/spin.lua"
    pg_start
    kafka_start --topic "$TOPIC:2"
    sink_start
    hub_shared STREAMING_HUB_KEK="$(head -c 32 /dev/urandom | base64)" \
        STREAMING_HUB_ALLOW_PRIVATE_SINKS=true STREAMING_HUB_POLICY_DIR="$POL" \
        STREAMING_HUB_POLICY_WATCH=false STREAMING_HUB_POLICY_TRIP_FAILURES=2 \
        STREAMING_HUB_BREAKER_CONSECUTIVE_FAILURES=100000 STREAMING_HUB_BREAKER_MIN_ATTEMPTS=1000000 \
        STREAMING_HUB_AUTODISABLE_FAILURE_WINDOW=1h STREAMING_HUB_DELIVERY_TIMEOUT=2s
}

# opev_bodies PATH TYPE: bodies delivered at PATH (prefix) with that event type
opev_bodies() {
    jq -cR --arg p "$1" --arg t "$2" \
        'fromjson? | select((.path | startswith($p)) and .headers["x-lerian-event-type"] == $t)
         | .body_b64 | @base64d | fromjson' "$SINK_LOG"
}
hub_deliveries() { # hub_deliveries PATH: deliveries of hub.* events at PATH (prefix)
    jq -cR --arg p "$1" 'fromjson? | select((.path | startswith($p))
        and (.headers["x-lerian-event-type"] // "" | startswith("hub.")))' "$SINK_LOG" | wc -l | tr -d ' '
}
stored_opev() { # stored_opev TENANT [TYPE]: operational events in TENANT's stream
    psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$1' AND source = 'streaming-hub'
            AND ce_type LIKE '${2:-hub.%}'"
}
ev() { # ev TENANT COUNT PREFIX
    produce --topic "$TOPIC" --tenant "$1" --count "$2" --id-prefix "$3" >/dev/null ||
        fail "produce failed"
}

scenario_dead_and_disabled_reach_only_their_tenant() {
    local a b ka kb w f g wb out
    a=$(own_tenant a)
    b=$(own_tenant b)
    ka=$(tenant_key "$a")
    kb=$(tenant_key "$b")
    w=$(subscribe_at "$ka" "/ok/w-$a" 'hub.*')
    f=$(subscribe_at "$ka" "/status/500/f-$a" transaction.posted ",$ONE")
    g=$(subscribe_active "$ka" \
        "{\"event_types\":[\"transaction.posted\",\"hub.*\"],\"destination\":{\"kind\":\"webhook\",\"url\":\"$SINK_URL/gone/g-$a\"},$ONE}")
    wb=$(subscribe_at "$kb" "/ok/w-$b" '*')
    ev "$a" 1 "dd-$a-"
    wait_until 30 "[[ \$(opev_bodies /ok/w-$a hub.delivery.dead | jq -r .subscription_id | grep -c $f) -ge 1 ]]" ||
        fail "no hub.delivery.dead about the failing subscription reached the watcher"
    wait_until 30 "[[ \$(opev_bodies /ok/w-$a hub.subscription.disabled | jq -r .subscription_id | grep -c $g) -ge 1 ]]" ||
        fail "no hub.subscription.disabled about the gone subscription reached the watcher"
    out=$(opev_bodies "/ok/w-$a" hub.subscription.disabled | head -n1)
    assert_eq "gone" "$(jq -r .reason <<<"$out")" "disabled: reason gone"
    out=$(opev_bodies "/ok/w-$a" hub.delivery.dead | jq -c "select(.subscription_id == \"$f\")" | head -n1)
    assert_eq "exhausted" "$(jq -r .reason <<<"$out")" "dead: reason exhausted"
    assert_eq "transaction.posted" "$(jq -r .event_type <<<"$out")" "dead: the event's type"
    assert_eq "dd-${a}-0" "$(jq -r .event_id <<<"$out")" "dead: the event's id"
    assert_eq "streaming-hub" "$(jq -rR --arg p "/ok/w-$a" 'fromjson? | select((.path | startswith($p))
        and .headers["x-lerian-event-type"] == "hub.delivery.dead") | .headers["ce-source"]' "$SINK_LOG" |
        sort -u)" "source streaming-hub"
    assert_eq "$(psql_q "SELECT enabled FROM subscriptions WHERE id = '$g'")" "f" "g is disabled"
    assert_ge "$(stored_opev "$a")" 2 "stored in the tenant's stream like any event"
    assert_eq "$f" "$(psql_q "SELECT headers->>'subject' FROM event_inbox WHERE tenant_id = '$a'
        AND ce_type = 'hub.delivery.dead' AND convert_from(payload, 'UTF8') LIKE '%$f%' LIMIT 1")" "subject: the subscription"
    sleep 1
    assert_eq 0 "$(opev_bodies "/gone/g-$a" hub.subscription.disabled | wc -l | tr -d ' ')" \
        "the disabled subscription never gets the event about itself"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM delivery_jobs j JOIN event_inbox e ON e.seq = j.event_seq
        WHERE j.subscription_id = '$g' AND e.source = 'streaming-hub'")" "nor a job for it"
    assert_eq 0 "$(stored_opev "$b")" "nothing in the other tenant's stream"
    assert_eq 0 "$(hub_deliveries "/ok/w-$b")" "nothing delivered to the other tenant"
    : "$wb"
}

scenario_policy_trip_tells_its_tenants() {
    local a b ka kb w p wb
    a=$(own_tenant a)
    b=$(own_tenant b)
    ka=$(tenant_key "$a")
    kb=$(tenant_key "$b")
    w=$(subscribe_at "$ka" "/ok/tw-$a" hub.policy.tripped)
    p=$(subscribe_at "$ka" "/ok/tp-$a" transaction.posted ',"policy":"spin"')
    wb=$(subscribe_at "$kb" "/ok/tw-$b" 'hub.*')
    ev "$a" 4 "tp-$a-"
    wait_until 30 "[[ \$(opev_bodies /ok/tw-$a hub.policy.tripped | wc -l) -ge 1 ]]" ||
        fail "no hub.policy.tripped reached the tenant's watcher"
    local out
    out=$(opev_bodies "/ok/tw-$a" hub.policy.tripped | head -n1)
    assert_eq "spin" "$(jq -r .policy <<<"$out")" "names the policy"
    assert_eq "$p" "$(jq -r .subscription_id <<<"$out")" "and the subscription"
    assert_match "$(jq -r .tripped_until <<<"$out")" '^20[0-9-]+T' "and until when"
    sleep 1
    assert_eq 0 "$(stored_opev "$b")" "the other tenant (no subscription on spin) is not told"
    : "$w $wb"
}

scenario_rate_limited_per_subscription() {
    local a ka w f n limited0
    a=$(own_tenant)
    ka=$(tenant_key "$a")
    limited0=$(metric 'streaming_hub_opevents_total{type="hub.delivery.dead",result="limited"}')
    w=$(subscribe_at "$ka" "/ok/rw-$a" 'hub.*')
    f=$(subscribe_at "$ka" "/status/500/rf-$a" transaction.posted ",$ONE")
    ev "$a" 12 "rl-$a-"
    wait_sql 30 12 "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$f' AND state = 'dead'" ||
        fail "the 12 jobs did not die"
    sleep 1
    n=$(stored_opev "$a" hub.delivery.dead)
    log "hub.delivery.dead stored for 12 dead jobs: $n"
    assert_ge "$n" 3 "the burst is published"
    assert_le "$n" 4 "the rest is held back by the rate limit ($n)"
    assert_ge "$(metric_delta 'streaming_hub_opevents_total{type="hub.delivery.dead",result="limited"}' "$limited0")" 8 \
        "and counted as limited"
    : "$w"
}

# The job's lease changes hands while its last attempt is in flight
# against a slow sink (as when another hub reclaimed it): the outcome is
# fenced out, the job stays the new holder's, and the tenant is told of no
# dead delivery (it is published from the committed outcome only).
scenario_a_fenced_out_dead_outcome_publishes_nothing() {
    local a ka w f job dead0 failed0
    a=$(own_tenant)
    ka=$(tenant_key "$a")
    w=$(subscribe_at "$ka" "/ok/fw-$a" 'hub.*')
    # 3 s answers against the 2 s delivery timeout: every attempt fails, the
    # second (last, one retry) goes dead
    f=$(subscribe_at "$ka" "/slow/3000/ff-$a" transaction.posted ",$ONE")
    dead0=$(metric 'streaming_hub_deliveries_total{outcome="dead"}')
    failed0=$(metric 'streaming_hub_deliveries_total{outcome="failed"}')
    ev "$a" 1 "fen-$a-"
    wait_sql 30 1 "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$f'
                    AND state = 'in_flight' AND attempt_count = 1" ||
        fail "the last attempt did not start"
    job=$(psql_q "SELECT id FROM delivery_jobs WHERE subscription_id = '$f'")
    psql_q "UPDATE delivery_jobs SET lease_owner = 'another-hub#1',
                                     lease_until = now() + interval '1 hour' WHERE id = $job" >/dev/null
    # the attempt times out after 2 s; its outcome is then written (or not)
    sleep 4
    assert_ge "$(metric_delta 'streaming_hub_deliveries_total{outcome="failed"}' "$failed0")" 2 \
        "both attempts failed and were counted"
    assert_eq 0 "$(metric_delta 'streaming_hub_deliveries_total{outcome="dead"}' "$dead0")" \
        "the fenced-out outcome counted no dead delivery"
    assert_eq "in_flight another-hub#1 1" \
        "$(psql_q "SELECT state || ' ' || lease_owner || ' ' || attempt_count FROM delivery_jobs WHERE id = $job")" \
        "the fence kept the job as the new holder left it"
    assert_eq 0 "$(stored_opev "$a" hub.delivery.dead)" "no hub.delivery.dead stored"
    assert_eq 0 "$(hub_deliveries "/ok/fw-$a")" "none delivered to the tenant's watcher"
    : "$w"
}

hub_env_disabled_by_configuration() { echo STREAMING_HUB_OPEVENTS=false; }
scenario_disabled_by_configuration() {
    local a ka f
    a=$(own_tenant)
    ka=$(tenant_key "$a")
    subscribe_at "$ka" "/ok/ow-$a" 'hub.*' >/dev/null
    f=$(subscribe_at "$ka" "/status/500/of-$a" transaction.posted ",$ONE")
    ev "$a" 1 "off-$a-"
    wait_sql 30 1 "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$f' AND state = 'dead'" ||
        fail "the job did not die"
    sleep 1
    assert_eq 0 "$(stored_opev "$a")" "OPEVENTS=false: nothing published"
}

scenarios_main "$@"
