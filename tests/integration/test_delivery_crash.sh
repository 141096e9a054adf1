#!/usr/bin/env bash
# At-least-once delivery across crashes (SPEC §7, §7.1, §7.5).
#
# One tenant, one verified subscription (the sink's /echo path answers the
# probe's challenge and echoes every delivery), 20,000 small events produced
# on a 4-partition topic.  While deliveries are in progress the hub is killed
# with SIGKILL twice and started again with the same environment; leases of
# the attempts it had in flight expire (DISPATCH_LEASE=3s) and are reclaimed.
#
# Then: exactly 20,000 delivery jobs, all succeeded, none dead; every ce-id
# ev-0 .. ev-19999 reached the sink at least once (duplicates are allowed by
# at-least-once and are counted in the log).
set -uo pipefail
source "$(dirname "$0")/../support/lib.sh"
source "$(dirname "$0")/../support/sink.sh"
source "$(dirname "$0")/../support/delivery.sh"
hub_test_init

N=20000
KEK=$(head -c 32 /dev/urandom | base64)
HUB_ENV=(STREAMING_HUB_KEK="$KEK" STREAMING_HUB_ALLOW_PRIVATE_SINKS=true
    STREAMING_HUB_DISPATCH_LEASE=3s STREAMING_HUB_DISPATCH_WORKERS=32
    STREAMING_HUB_DISPATCH_CLAIM_BATCH=64 STREAMING_HUB_RETRY_SCHEDULE=200ms,500ms,1s
    STREAMING_HUB_DELIVERY_TIMEOUT=5s STREAMING_HUB_SHUTDOWN_TIMEOUT=5s)
TOPIC=lerian.streaming.crash
pg_start
kafka_start --topic $TOPIC:4
sink_start
hub_start "${HUB_ENV[@]}"

tenant_create acme
ACME_KEY=$(tenant_key acme)
[[ -n $ACME_KEY ]] || fatal "no tenant API key"
s=$(subscription_create "$ACME_KEY" "$(subscription_json transaction.posted "$SINK_URL/echo/crash")")
SUB_ID=$(json_field id "$s")
[[ -n $SUB_ID ]] || fatal "subscription not created: $s"
subscription_wait_verified "$SUB_ID" ||
    fatal "the background probe did not verify the /echo destination"
pass "subscription verified by its probe"

q() { psql_q "$1"; }
delivered() { sink_count /echo/crash; }
states() { q "SELECT coalesce(string_agg(state || ':' || n, ' ' ORDER BY state), 'none') FROM (SELECT state, count(*) n FROM delivery_jobs GROUP BY state) x"; }

produce_bg --topic $TOPIC --tenant acme --count $N --payload-bytes 64 --rate 4000 \
    --partitions 4 --id-prefix ev- --type studio.lerian.transaction.posted
t_start=$SECONDS

# two crashes while deliveries are in progress, with progress in between
for round in 1 2; do
    base=$(delivered)
    wait_until 30 "(( \$(delivered) >= $base + 1500 ))" ||
        fail "round $round: deliveries made no progress before the crash ($(delivered) received)"
    log "round $round: $(delivered) requests received, jobs: $(states)"
    hub_kill9
    inflight=$(q "SELECT count(*) FROM delivery_jobs WHERE state = 'in_flight'")
    log "round $round: $inflight jobs left in flight by the crash"
    hub_start "${HUB_ENV[@]}"
done
assert_ge "$(grep -c '"msg":"http listening"' "$WORK"/hub.*.log | awk -F: '{ s += $NF } END { print s }')" 3 \
    "the hub was started three times (two SIGKILLs)"

wait_until 60 "! kill -0 $PRODUCER_PID 2>/dev/null" || fail "the producer did not finish"
wait "$PRODUCER_PID" 2>/dev/null
assert_eq 0 "$?" "hub-produce exited cleanly"

wait_until 60 "[[ \$(q \"SELECT count(*) FROM delivery_jobs WHERE state = 'succeeded'\") == $N ]]" ||
    fail "not every job succeeded within 60 s: $(states)"
log "all done after $((SECONDS - t_start)) s: $(states)"

assert_eq $N "$(q "SELECT count(*) FROM event_inbox WHERE tenant_id = 'acme'")" "$N events stored once each"
assert_eq $N "$(q "SELECT count(*) FROM delivery_jobs")" "exactly $N delivery jobs (one per event)"
assert_eq $N "$(q "SELECT count(*) FROM delivery_jobs WHERE state = 'succeeded' AND subscription_id = '$SUB_ID'")" \
    "all $N jobs succeeded"
assert_eq 0 "$(q "SELECT count(*) FROM delivery_jobs WHERE state = 'dead'")" "no job dead"
assert_eq $N "$(q "SELECT count(DISTINCT event_id) FROM delivery_jobs")" "one job per ce-id"

# every produced ce-id reached the sink at least once
seq 0 $((N - 1)) | sed 's/^/ev-/' | LC_ALL=C sort >"$WORK/expected.ids"
sink_header /echo/crash x-lerian-event-id | grep '^ev-' >"$WORK/received.all"
LC_ALL=C sort -u "$WORK/received.all" >"$WORK/received.ids"
missing=$(LC_ALL=C comm -23 "$WORK/expected.ids" "$WORK/received.ids" | wc -l)
unexpected=$(LC_ALL=C comm -13 "$WORK/expected.ids" "$WORK/received.ids" | wc -l)
total=$(wc -l <"$WORK/received.all")
dups=$((total - $(wc -l <"$WORK/received.ids")))
assert_eq 0 "$missing" "every ce-id ev-0..ev-$((N - 1)) was received at least once ($missing missing$( ((missing > 0)) &&
    printf ', e.g. %s' "$(LC_ALL=C comm -23 "$WORK/expected.ids" "$WORK/received.ids" | head -n 5 | tr '\n' ' ')"))"
assert_eq 0 "$unexpected" "no ce-id the producer did not send"
log "sink received $total deliveries for $N events: $dups duplicates (allowed: at-least-once)"
assert_ge "$dups" 0 "duplicates counted: $dups"
assert_eq 0 "$(sink_header /echo/crash x-lerian-subscription-id | grep -vc "^$SUB_ID\$")" \
    "every delivery names the subscription"
# a duplicate is a re-attempt of a job whose lease was reclaimed after a crash
assert_ge "$(q "SELECT count(*) FROM delivery_jobs WHERE reclaims > 0")" "$( ((dups > 0)) && echo 1 || echo 0)" \
    "duplicates come from reclaimed leases"

hub_test_done
