#!/usr/bin/env bash
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
# STREAMING_HUB_POISON_THRESHOLD reclaims the job is dead with reason poison.
set -uo pipefail
source "$(dirname "$0")/../support/lib.sh"
source "$(dirname "$0")/../support/sink.sh"
source "$(dirname "$0")/../support/delivery.sh"
hub_test_init

KEK=$(head -c 32 /dev/urandom | base64)
HUB_ENV=(STREAMING_HUB_KEK="$KEK" STREAMING_HUB_ALLOW_PRIVATE_SINKS=true
    STREAMING_HUB_RETRY_SCHEDULE=100ms,100ms,100ms,100ms,100ms,100ms,100ms,100ms,100ms,100ms,100ms,100ms
    STREAMING_HUB_BREAKER_CONSECUTIVE_FAILURES=3 STREAMING_HUB_BREAKER_OPEN=1s
    STREAMING_HUB_BREAKER_OPEN_MAX=2s STREAMING_HUB_DISPATCH_LEASE=2s
    STREAMING_HUB_DELIVERY_TIMEOUT=5s STREAMING_HUB_POISON_THRESHOLD=3)
pg_start
kafka_start --topic lerian.streaming.breaker:2
sink_start
hub_start "${HUB_ENV[@]}"

tenant_create acme
tenant_create beta
ACME_KEY=$(tenant_key acme)
BETA_KEY=$(tenant_key beta)
subscribe() { # subscribe KEY PATH TYPE → id (verified by hand once the probe ended)
    subscribe_active "$1" "$(subscription_json "$3" "$SINK_URL$2")"
}

# --- breaker -----------------------------------------------------------------
until_ms=$(( $(date +%s%3N) + 6000 ))
A_ID=$(subscribe "$ACME_KEY" "/fail-until/$until_ms/acme" breaker.tested)
B_ID=$(subscribe "$BETA_KEY" "/ok/beta" breaker.tested)
produce --topic lerian.streaming.breaker --tenant acme --count 10 --id-prefix a- \
    --type studio.lerian.breaker.tested >/dev/null
produce --topic lerian.streaming.breaker --tenant beta --count 10 --id-prefix b- \
    --type studio.lerian.breaker.tested >/dev/null

wait_until 10 '(( $(metric "streaming_hub_deliveries_total{outcome=\"shed\"}") > 0 ))' ||
    fail "no job was shed while the destination kept failing"
breakers=$(admin_curl GET /admin/breakers)
assert_contains "$breakers" '"tenant_id":"acme"' "GET /admin/breakers lists the open breaker"
assert_contains "$breakers" "\"origin\":\"http://127.0.0.1:${SINK_URL##*:}\"" "... keyed by origin"
assert_ge "$(metric streaming_hub_breakers_open)" 1 "streaming_hub_breakers_open gauge"
wait_until 15 "[[ \$(psql_q \"SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$B_ID' AND state = 'succeeded'\") == 10 ]]" ||
    fail "beta's deliveries to the same origin were held back by acme's breaker"
before_recovery=$(grep -c '"path":"/fail-until/' "$SINK_LOG")
assert_le "$before_recovery" 40 "shedding kept attempts down while open ($before_recovery attempts)"

# recovery: after until_ms the probe succeeds and everything goes through
wait_until 40 "[[ \$(psql_q \"SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$A_ID' AND state = 'succeeded'\") == 10 ]]" ||
    fail "acme's events were not all delivered after the destination recovered"
assert_eq 0 "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$A_ID' AND state = 'dead'")" \
    "shed jobs are not counted as attempts: none exhausted"

# --- poison ------------------------------------------------------------------
P_ID=$(subscribe "$ACME_KEY" "/hang/poison" poison.tested)
produce --topic lerian.streaming.breaker --tenant acme --count 1 --id-prefix p- \
    --type studio.lerian.poison.tested >/dev/null
for round in 1 2 3 4; do
    # wait until the attempt is in flight at the sink, then kill the hub mid-attempt
    want=$round
    wait_until 20 "(( \$(sink_count /hang/poison) >= $want + 1 ))" >/dev/null ||
        log "round $round: no attempt reached the sink"
    state=$(psql_q "SELECT state || ':' || reclaims FROM delivery_jobs WHERE subscription_id = '$P_ID'")
    log "round $round: job $state"
    [[ $state == dead:* ]] && break
    hub_kill9
    sleep 2.5 # the lease (2s) expires
    hub_start "${HUB_ENV[@]}"
    wait_until 10 "[[ \$(psql_q \"SELECT state FROM delivery_jobs WHERE subscription_id = '$P_ID'\") != in_flight ]]" >/dev/null
done
wait_until 20 "[[ \$(psql_q \"SELECT state FROM delivery_jobs WHERE subscription_id = '$P_ID'\") == dead ]]" ||
    fail "the job never became poison"
assert_eq "dead|poison|3" "$(psql_q "SELECT state, reason, reclaims FROM delivery_jobs WHERE subscription_id = '$P_ID'")" \
    "dead with reason poison after 3 reclaims"
attempts=$(sink_count /hang/poison)
sleep 3
assert_eq "$attempts" "$(sink_count /hang/poison)" "a poison job is never attempted again"

hub_test_done
