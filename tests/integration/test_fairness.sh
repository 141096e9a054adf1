#!/usr/bin/env bash
# Fairness (SPEC §7.1): a tenant with 20,000 due jobs against a slow sink does
# not delay another tenant's fresh event by more than a second.
#
# "heavy" subscribes to a destination that takes 200 ms per request and gets
# 20,000 events: with 8 workers that backlog lasts minutes.  Then "light" gets
# one event; the time from its job's creation (the ingest commit) to the start
# of its attempt must stay under 1 s, three times over.
set -uo pipefail
source "$(dirname "$0")/../support/lib.sh"
source "$(dirname "$0")/../support/sink.sh"
source "$(dirname "$0")/../support/delivery.sh"
hub_test_init

KEK=$(head -c 32 /dev/urandom | base64)
pg_start
kafka_start --topic lerian.streaming.fair:4
sink_start
hub_start STREAMING_HUB_KEK="$KEK" STREAMING_HUB_ALLOW_PRIVATE_SINKS=true \
    STREAMING_HUB_BREAKER_CONSECUTIVE_FAILURES=1000 STREAMING_HUB_BREAKER_MIN_ATTEMPTS=1000

tenant_create heavy
tenant_create light
subscribe() { # subscribe TENANT PATH → id, verified by hand
    subscribe_active "$(tenant_key "$1")" "$(subscription_json '*' "$SINK_URL$2")"
}
HEAVY_ID=$(subscribe heavy /slow/200/heavy)
LIGHT_ID=$(subscribe light /ok/light)

produce --topic lerian.streaming.fair --tenant heavy --count 20000 --id-prefix h- \
    --payload-bytes 64 >/dev/null
wait_until 60 "[[ \$(psql_q \"SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$HEAVY_ID'\") == 20000 ]]" ||
    fatal "the heavy backlog was not created"
wait_until 10 '(( $(sink_count /slow/200/heavy) >= 16 ))' >/dev/null
log "heavy backlog: $(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$HEAVY_ID' AND state = 'pending'") jobs pending"

# light_event N WHAT: produces light's event N and checks that its attempt
# started within a second of its job's creation (the ingest commit).
light_event() {
    local delay
    produce --topic lerian.streaming.fair --tenant light --count 1 --id-prefix "l$1-" >/dev/null
    wait_until 10 "[[ \$(psql_q \"SELECT state FROM delivery_jobs WHERE subscription_id = '$LIGHT_ID' AND event_id = 'l$1-0'\") == succeeded ]]" ||
        fail "light's event $1 was not delivered within 10 s"
    delay=$(psql_q "SELECT round(extract(epoch FROM a.started_at - j.created_at) * 1000)
                      FROM delivery_jobs j JOIN delivery_attempts a ON a.job_id = j.id
                     WHERE j.subscription_id = '$LIGHT_ID' AND j.event_id = 'l$1-0'")
    assert_le "$delay" 1000 "light's event $1 attempted ${delay} ms after its job was created ($2)"
}
for i in 1 2 3; do
    light_event "$i" "heavy backlog pending"
done
assert_ge "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$HEAVY_ID' AND state = 'pending'")" 15000 \
    "the heavy backlog was still there all along"

# ---------------------------------------------------------------------------
# More tenants with due jobs than one claim offers: a claim takes a window of
# 4 × its batch from the rotation.  With a batch of 2 (a window of 8), 12 more
# tenants with backlogs to slow destinations join heavy: every one of them is
# served within a few rotations, and light's fresh event still starts within
# the second.
# ---------------------------------------------------------------------------
hub_stop
hub_start STREAMING_HUB_KEK="$KEK" STREAMING_HUB_ALLOW_PRIVATE_SINKS=true \
    STREAMING_HUB_BREAKER_CONSECUTIVE_FAILURES=1000 STREAMING_HUB_BREAKER_MIN_ATTEMPTS=1000 \
    STREAMING_HUB_DISPATCH_CLAIM_BATCH=2
MANY=()
for m in $(seq 0 11); do
    tenant_create "m$m"
    MANY+=("'$(subscribe "m$m" "/slow/200/m$m")'")
    produce --topic lerian.streaming.fair --tenant "m$m" --count 30 --id-prefix "m$m-" \
        --payload-bytes 64 >/dev/null
done
IN_MANY=$(IFS=,; echo "${MANY[*]}")
wait_until 30 "[[ \$(psql_q \"SELECT count(*) FROM delivery_jobs WHERE subscription_id IN ($IN_MANY)\") == 360 ]]" ||
    fatal "the 12 tenants' backlogs were not created"
wait_until 15 "[[ \$(psql_q \"SELECT count(DISTINCT j.subscription_id) FROM delivery_jobs j
                                JOIN delivery_attempts a ON a.job_id = j.id
                               WHERE j.subscription_id IN ($IN_MANY)\") == 12 ]]" ||
    fail "not every one of 12 tenants beyond the claim window was served"
pass "13 tenants with backlogs, a claim window of 8: all 12 new tenants served"
light_event 4 "14 tenants, a claim window of 8"

hub_test_done
