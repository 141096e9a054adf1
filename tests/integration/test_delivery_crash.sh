#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
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
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"

N=20000
TOPIC=lerian.streaming.crash

setup() {
    pg_start
    kafka_start --topic "$TOPIC":4
    sink_start
    hub_shared STREAMING_HUB_KEK="$(head -c 32 /dev/urandom | base64)" \
        STREAMING_HUB_ALLOW_PRIVATE_SINKS=true \
        STREAMING_HUB_DISPATCH_LEASE=3s STREAMING_HUB_DISPATCH_WORKERS=32 \
        STREAMING_HUB_DISPATCH_CLAIM_BATCH=64 STREAMING_HUB_RETRY_SCHEDULE=200ms,500ms,1s \
        STREAMING_HUB_DELIVERY_TIMEOUT=5s STREAMING_HUB_SHUTDOWN_TIMEOUT=5s
}

# A drain whose destination does not answer within its budget (attempts
# time out after 30 s, the drain has 4): the attempts still out stop
# waiting when most of the budget is gone, their jobs go back unattempted
# (no attempt, no reclaim), and the process exits 0.  It exited 1 at the
# deadline with the leases left to expire, each then counted as a reclaim
# toward poison.
hub_env_a_drain_stops_waiting_for_a_destination_that_hangs() {
    echo STREAMING_HUB_DELIVERY_TIMEOUT=30s STREAMING_HUB_SHUTDOWN_TIMEOUT=4s
}

scenario_a_drain_stops_waiting_for_a_destination_that_hangs() {
    local path sub t0
    own_client
    path=/hang/$(own_id)/
    # verified at a destination that answers, then pointed at one that
    # hangs behind the API's back (its probe would hang too)
    sub=$(subscribe_at "$KEY" "/ok/$(own_id)/" 'transaction.*')
    psql_q "UPDATE subscriptions SET url = '$SINK_URL$path' WHERE id = '$sub'" >/dev/null
    produce --topic "$TOPIC" --tenant "$TENANT" --count 3 --id-prefix hang- \
        --type studio.lerian.transaction.posted >/dev/null || fail "produce failed"
    wait_until 20 "(( \$(sink_count $path) >= 3 ))" || fail "the attempts did not reach the destination"
    t0=$(date +%s%3N)
    hub_stop # a failure unless the hub exits 0
    log "the drain took $(($(date +%s%3N) - t0)) ms (budget 4 s)"
    assert_eq "3 0 0" "$(psql_q "SELECT count(*), sum(attempt_count), sum(reclaims) FROM delivery_jobs
        WHERE subscription_id = '$sub' AND state = 'pending' AND lease_owner IS NULL" | tr '|' ' ')" \
        "the three jobs are pending again, unleased, with no attempt and no reclaim counted"
}

scenario_every_event_is_delivered_across_two_sigkills() {
    local tenant key path s sub_id t_start round base inflight missing unexpected total dups stored
    tenant=$(own_id)
    key=$(own_tenant_key)
    path=/echo/$(own_id)/
    s=$(subscription_create "$key" "$(subscription_json transaction.posted "$SINK_URL$path")")
    sub_id=$(json_field id "$s")
    [[ -n $sub_id ]] || fatal "subscription not created: $s"
    subscription_wait_verified "$sub_id" ||
        fatal "the background probe did not verify the /echo destination"
    pass "subscription verified by its probe"

    delivered() { sink_count "$path"; }
    states() { job_states "$sub_id"; }

    produce_bg --topic "$TOPIC" --tenant "$tenant" --count "$N" --payload-bytes 64 --rate 4000 \
        --partitions 4 --id-prefix ev- --type studio.lerian.transaction.posted
    t_start=$SECONDS

    # two crashes while deliveries are in progress, with progress in between
    for round in 1 2; do
        base=$(delivered)
        wait_until 30 "(( \$(delivered) >= $base + 1500 ))" ||
            fail "round $round: deliveries made no progress before the crash ($(delivered) received)"
        log "round $round: $(delivered) requests received, jobs: $(states)"
        hub_kill9
        inflight=$(jobs_in "$sub_id" in_flight)
        log "round $round: $inflight jobs left in flight by the crash"
        hub_start_shared
    done
    assert_ge "$(grep -c '"msg":"http listening"' "$WORK"/hub.*.log | awk -F: '{ s += $NF } END { print s }')" 3 \
        "the hub was started three times (two SIGKILLs)"

    wait_until 60 "! kill -0 $PRODUCER_PID 2>/dev/null" || fail "the producer did not finish"
    wait "$PRODUCER_PID" 2>/dev/null
    assert_eq 0 "$?" "hub-produce exited cleanly"

    wait_jobs "$sub_id" succeeded "$N" 60 || fail "not every job succeeded within 60 s: $(states)"
    log "all done after $((SECONDS - t_start)) s: $(states)"

    stored=$(inbox_count "tenant_id = '$tenant'")
    assert_eq "$N" "$stored" "$N events stored once each"
    if ((stored != N)); then
        # where each partition's stored offsets stop: a tail never stored, or a gap
        log "stored per partition (partition|first offset|last offset|count): $(psql_q "SELECT string_agg(p, ' ' ORDER BY kafka_partition) FROM (SELECT kafka_partition, kafka_partition || '|' || min(kafka_offset) || '|' || max(kafka_offset) || '|' || count(*) AS p FROM event_inbox WHERE tenant_id = '$tenant' GROUP BY kafka_partition) x")"
        log "verdicts counted for the tenant (accepted|duplicates|quarantined|dropped): $(psql_q "SELECT sum(accepted) || '|' || sum(duplicates) || '|' || sum(quarantined) || '|' || sum(dropped) FROM tenant_stats_hourly WHERE tenant_id = '$tenant'"); quarantine rows: $(psql_q "SELECT count(*) FROM quarantine")"
        # where each hub started each partition, and what went wrong
        grep -H 'consumption starts\|given up\|not contiguous\|partitions \(assigned\|revoked\)\|"level":"\(warn\|error\)"' \
            "$WORK"/hub.*.log | tail -n 60
    fi
    assert_eq "$N" "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE tenant_id = '$tenant'")" \
        "exactly $N delivery jobs (one per event)"
    assert_eq "$N" "$(jobs_in "$sub_id" succeeded)" "all $N jobs succeeded"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE tenant_id = '$tenant' AND state = 'dead'")" "no job dead"
    assert_eq "$N" "$(psql_q "SELECT count(DISTINCT event_id) FROM delivery_jobs WHERE tenant_id = '$tenant'")" \
        "one job per ce-id"

    # every produced ce-id reached the sink at least once
    seq 0 $((N - 1)) | sed 's/^/ev-/' | LC_ALL=C sort >"$WORK/expected.ids"
    sink_header "$path" x-lerian-event-id | grep '^ev-' >"$WORK/received.all"
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
    assert_eq 0 "$(sink_header "$path" x-lerian-subscription-id | grep -vc "^$sub_id\$")" \
        "every delivery names the subscription"
    # a duplicate is a re-attempt of a job whose lease was reclaimed after a crash
    assert_ge "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE tenant_id = '$tenant' AND reclaims > 0")" \
        "$( ((dups > 0)) && echo 1 || echo 0)" "duplicates come from reclaimed leases"
}

scenarios_main "$@"
