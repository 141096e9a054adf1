#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# Circuit breaker (SPEC §7.6) and poison jobs (SPEC §7.5), end to end.
#
# Breaker: a destination that fails until a given moment trips the breaker of
# (tenant, origin) after 3 consecutive failures; due jobs are then shed
# without attempts; GET /admin/breakers lists it; once the destination
# recovers, the half-open probe succeeds and every event is delivered.
# Another tenant's deliveries to the same origin are not shed.
#
# Poison: a destination that never answers while the hub is killed with
# SIGKILL mid-attempt, again and again, leaves leases that expire; after
# STREAMING_HUB_POISON_THRESHOLD reclaims the job is dead with reason poison,
# and a hub.delivery.dead event says so in the tenant's stream.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"

TOPIC=lerian.streaming.breaker

setup() {
    pg_start
    kafka_start --topic "$TOPIC":2
    sink_start
    hub_shared STREAMING_HUB_KEK="$(head -c 32 /dev/urandom | base64)" \
        STREAMING_HUB_ALLOW_PRIVATE_SINKS=true \
        STREAMING_HUB_RETRY_SCHEDULE=100ms,100ms,100ms,100ms,100ms,100ms,100ms,100ms,100ms,100ms,100ms,100ms \
        STREAMING_HUB_BREAKER_CONSECUTIVE_FAILURES=3 STREAMING_HUB_BREAKER_OPEN=1s \
        STREAMING_HUB_BREAKER_OPEN_MAX=2s STREAMING_HUB_DISPATCH_LEASE=2s \
        STREAMING_HUB_DELIVERY_TIMEOUT=5s STREAMING_HUB_POISON_THRESHOLD=3
}

scenario_an_open_breaker_sheds_until_the_destination_recovers() {
    local acme beta beta_key until_ms a_path a_id b_id shed0 breakers before_recovery
    acme=$(own_id)
    KEY=$(own_tenant_key)
    beta=$(own_id beta)
    beta_key=$(own_tenant_key beta)
    until_ms=$(($(date +%s%3N) + 6000))
    a_path=/fail-until/$until_ms/$(own_id)/
    a_id=$(subscribe_at "$KEY" "$a_path" breaker.tested)
    b_id=$(subscribe_at "$beta_key" "/ok/$beta/" breaker.tested)
    shed0=$(metric 'streaming_hub_deliveries_total{outcome="shed"}')
    produce --topic "$TOPIC" --tenant "$acme" --count 10 --id-prefix a- \
        --type studio.lerian.breaker.tested >/dev/null
    produce --topic "$TOPIC" --tenant "$beta" --count 10 --id-prefix b- \
        --type studio.lerian.breaker.tested >/dev/null

    wait_until 10 "(( \$(metric_delta 'streaming_hub_deliveries_total{outcome=\"shed\"}' $shed0) > 0 ))" ||
        fail "no job was shed while the destination kept failing"
    breakers=$(admin_curl GET /admin/breakers)
    assert_contains "$breakers" "\"tenant_id\":\"$acme\"" "GET /admin/breakers lists the open breaker"
    assert_contains "$breakers" "\"origin\":\"http://127.0.0.1:${SINK_URL##*:}\"" "... keyed by origin"
    assert_ge "$(metric streaming_hub_breakers_open)" 1 "streaming_hub_breakers_open gauge"
    wait_jobs "$b_id" succeeded 10 15 ||
        fail "beta's deliveries to the same origin were held back by acme's breaker"
    before_recovery=$(sink_count "$a_path")
    assert_le "$before_recovery" 40 "shedding kept attempts down while open ($before_recovery attempts)"

    # recovery: after until_ms the probe succeeds and everything goes through
    wait_jobs "$a_id" succeeded 10 40 ||
        fail "acme's events were not all delivered after the destination recovered"
    assert_eq 0 "$(jobs_in "$a_id" dead)" "shed jobs are not counted as attempts: none exhausted"
}

scenario_a_job_whose_attempts_crash_the_hub_becomes_poison() {
    local tenant key path p_id round state attempts
    tenant=$(own_id)
    key=$(own_tenant_key)
    path=/hang/$(own_id)/
    p_id=$(subscribe_at "$key" "$path" poison.tested)
    produce --topic "$TOPIC" --tenant "$tenant" --count 1 --id-prefix p- \
        --type studio.lerian.poison.tested >/dev/null
    for round in 1 2 3 4; do
        # wait until the attempt is in flight at the sink, then kill the hub mid-attempt
        sink_wait $((round + 1)) "$path" 20 || log "round $round: no attempt reached the sink"
        state=$(psql_q "SELECT state || ':' || reclaims FROM delivery_jobs WHERE subscription_id = '$p_id'")
        log "round $round: job $state"
        [[ $state == dead:* ]] && break
        hub_kill9
        sleep 2.5 # the lease (2s) expires
        hub_start_shared
        wait_until 10 "[[ \$(psql_q \"SELECT state FROM delivery_jobs WHERE subscription_id = '$p_id'\") != in_flight ]]" >/dev/null
    done
    wait_job_state "$p_id" dead || fail "the job never became poison"
    assert_eq "dead|poison|3" "$(psql_q "SELECT state, reason, reclaims FROM delivery_jobs WHERE subscription_id = '$p_id'")" \
        "dead with reason poison after 3 reclaims"
    attempts=$(sink_count "$path")
    sleep 3
    assert_eq "$attempts" "$(sink_count "$path")" "a poison job is never attempted again"
    # SPEC §10: the tenant hears of it like of any other dead delivery
    wait_sql 10 1 "SELECT count(*) FROM event_inbox WHERE tenant_id = '$tenant'
        AND source = 'streaming-hub' AND ce_type = 'hub.delivery.dead'
        AND convert_from(payload, 'UTF8')::jsonb @> '{\"reason\": \"poison\", \"subscription_id\": \"$p_id\"}'" ||
        fail "no hub.delivery.dead with reason poison in the tenant's stream"
}

scenarios_main "$@"
