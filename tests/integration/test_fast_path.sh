#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# The delivery fast path (src/dispatch_fast.c): in role `all` the ingest
# transaction leases the jobs the dispatcher can start now and hands them
# over with the event it holds; everything else is claimed (SPEC §7.1).
#
# Jobs reach the dispatcher by one path or the other, counted in
# streaming_hub_dispatch_jobs_total{path}.  A fast-path job is leased like a
# claimed one: a SIGKILL while it is in flight loses nothing (its lease
# expires, it is reclaimed and counted, and attempted again).  A tenant
# whose destination is at its cap takes no fast path and holds no other
# tenant back; fifo subscriptions are always claimed.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"

TOPIC=lerian.streaming.fast
FAST='streaming_hub_dispatch_jobs_total{path="fast"}'
CLAIM='streaming_hub_dispatch_jobs_total{path="claim"}'
TYPE=studio.lerian.transaction.posted

setup() {
    pg_start
    kafka_start --topic "$TOPIC":4
    sink_start
    # a lease of 5 s covers a 2 s attempt and its outcome; a (tenant,
    # origin) pair takes at most 4 attempts at once
    hub_shared STREAMING_HUB_KEK="$(head -c 32 /dev/urandom | base64)" \
        STREAMING_HUB_ALLOW_PRIVATE_SINKS=true \
        STREAMING_HUB_DISPATCH_LEASE=5s STREAMING_HUB_DELIVERY_TIMEOUT=2s \
        STREAMING_HUB_DISPATCH_WORKERS=32 STREAMING_HUB_DISPATCH_CLAIM_BATCH=16 \
        STREAMING_HUB_DISPATCH_TENANT_ORIGIN_MAX=4 STREAMING_HUB_DISPATCH_TENANT_ORIGIN_START=4 \
        STREAMING_HUB_RETRY_SCHEDULE=200ms,500ms,1s STREAMING_HUB_SHUTDOWN_TIMEOUT=5s
}

# received PATH PREFIX: distinct ce-ids starting with PREFIX the sink got
# under PATH (the verification probe's are left out).
received() {
    sink_header "$1" x-lerian-event-id | grep "^$2" | sort -u | wc -l
}

scenario_fresh_events_take_the_fast_path() {
    local tenant key path sub fast0 claim0 fast claim
    tenant=$(own_tenant)
    key=$(tenant_key "$tenant")
    path=/ok/$(own_id)/
    sub=$(subscribe_at "$key" "$path" transaction.posted)
    fast0=$(metric "$FAST")
    claim0=$(metric "$CLAIM")
    produce --topic "$TOPIC" --tenant "$tenant" --count 40 --rate 40 --partitions 4 \
        --id-prefix fp- --type "$TYPE"
    wait_jobs "$sub" succeeded 40 30 || fail "not every job succeeded: $(job_states "$sub")"
    assert_eq 40 "$(received "$path" fp-)" "every event reached the sink"
    fast=$(metric_delta "$FAST" "$fast0")
    claim=$(metric_delta "$CLAIM" "$claim0")
    log "jobs by path: fast $fast, claim $claim"
    assert_ge "$fast" 30 "most jobs of a light stream were leased by their ingest transaction"
    assert_eq 40 "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$sub'
                             AND attempt_count = 1 AND reclaims = 0")" \
        "each job was attempted once, none reclaimed"
}

# Every job of this scenario is claimed (no fast path), a few at a time as
# a light stream stores them.  A claim that took everything due is dry: the
# next waits for jobs to be stored (the ingest's kick) or for its timer,
# not for an attempt to end (docs/performance.md, "Dry claims").  Claiming
# again at every attempt's end ran twenty claims per job here.  A job that
# waited in the queue past what its lease covers goes back and is claimed
# again, so a slow machine may claim a few jobs twice.
hub_env_a_claims_follow_the_stream_not_the_attempts() {
    echo STREAMING_HUB_DISPATCH_FAST_PATH=false
}

scenario_a_claims_follow_the_stream_not_the_attempts() {
    local tenant key path sub claims0 claimed0 fast0 claims claimed n=400
    tenant=$(own_tenant)
    key=$(tenant_key "$tenant")
    path=/ok/$(own_id)/
    sub=$(subscribe_at "$key" "$path" transaction.posted)
    claims0=$(metric streaming_hub_dispatch_claims_total)
    claimed0=$(metric "$CLAIM")
    fast0=$(metric "$FAST")
    produce --topic "$TOPIC" --tenant "$tenant" --count "$n" --rate 200 --partitions 4 \
        --id-prefix cs- --type "$TYPE"
    wait_jobs "$sub" succeeded "$n" 30 || fail "not every job succeeded: $(job_states "$sub")"
    claims=$(metric_delta streaming_hub_dispatch_claims_total "$claims0")
    claimed=$(metric_delta "$CLAIM" "$claimed0")
    log "$claims claims took $claimed jobs"
    assert_eq 0 "$(metric_delta "$FAST" "$fast0")" "no job took the fast path"
    assert_ge "$claimed" "$n" "every job was claimed"
    # about a claim per ingest transaction now (each wakes the claim), against
    # 8,554 claims for these 400 jobs before
    assert_le "$claims" $((2 * claimed)) "at most two claims per claimed job ($claims claims)"
}

scenario_fifo_jobs_are_always_claimed() {
    local tenant key path sub fast0
    tenant=$(own_tenant)
    key=$(tenant_key "$tenant")
    path=/ok/$(own_id)/
    sub=$(subscribe_at "$key" "$path" transaction.posted ',"ordering":"fifo"')
    fast0=$(metric "$FAST")
    produce --topic "$TOPIC" --tenant "$tenant" --count 10 --rate 20 --partitions 1 \
        --id-prefix ff- --type "$TYPE"
    wait_jobs "$sub" succeeded 10 30 || fail "not every fifo job succeeded: $(job_states "$sub")"
    assert_eq 0 "$(metric_delta "$FAST" "$fast0")" "no fifo job took the fast path"
    assert_eq "$(seq 0 9 | sed 's/^/ff-/' | tr '\n' ' ')" \
        "$(sink_header "$path" x-lerian-event-id | grep '^ff-' | tr '\n' ' ')" "fifo order kept"
}

scenario_sigkill_with_fast_path_jobs_in_flight_loses_nothing() {
    local tenant key path sub fast0 claim0 inflight
    tenant=$(own_tenant)
    key=$(tenant_key "$tenant")
    path=/slow/1500/$(own_id)/
    sub=$(subscribe_at "$key" "$path" transaction.posted)
    fast0=$(metric "$FAST")
    claim0=$(metric "$CLAIM")
    produce --topic "$TOPIC" --tenant "$tenant" --count 4 --rate 100 --partitions 4 \
        --id-prefix fk- --type "$TYPE"
    wait_sql 10 4 "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$sub'
                    AND state = 'in_flight' AND lease_owner IS NOT NULL" ||
        fail "the 4 jobs were not leased: $(job_states "$sub")"
    assert_eq 4 "$(metric_delta "$FAST" "$fast0")" "all 4 jobs were leased by their ingest transaction"
    assert_eq 0 "$(metric_delta "$CLAIM" "$claim0")" "... none by a claim"
    hub_kill9
    inflight=$(jobs_in "$sub" in_flight)
    log "$inflight jobs left in flight by the crash"
    assert_eq 4 "$inflight" "the crash left the fast-path jobs leased"
    hub_start_shared
    wait_jobs "$sub" succeeded 4 30 || fail "not every job succeeded after the restart: $(job_states "$sub")"
    assert_eq 4 "$(received "$path" fk-)" "every event reached the sink at least once"
    assert_eq 4 "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$sub' AND reclaims >= 1")" \
        "each expired lease was reclaimed and counted"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$sub' AND state = 'dead'")" \
        "none dead"
}

scenario_a_tenant_at_its_destination_cap_takes_no_fast_path() {
    local ta tb ka kb pa pb sa sb fast0 most t0
    ta=$(own_tenant a)
    tb=$(own_tenant b)
    ka=$(tenant_key "$ta")
    kb=$(tenant_key "$tb")
    pa=/hang/$(own_id a)/
    pb=/ok/$(own_id b)/
    sa=$(subscribe_at "$ka" "$pa" transaction.posted)
    sb=$(subscribe_at "$kb" "$pb" transaction.posted)
    # A's destination hangs: its pair fills its cap of 4 and its jobs wait
    produce --topic "$TOPIC" --tenant "$ta" --count 16 --rate 16 --partitions 1 \
        --id-prefix ca- --type "$TYPE"
    wait_sql 10 16 "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$sa'" ||
        fail "A's 16 jobs were not stored"
    most=$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$sa' AND state = 'in_flight'")
    log "A: $(job_states "$sa")"
    assert_le "$most" 5 "A holds about its cap of leases, not one per event ($most in flight)"
    # B, meanwhile, takes the fast path and is delivered at once
    fast0=$(metric "$FAST")
    t0=$SECONDS
    produce --topic "$TOPIC" --tenant "$tb" --count 10 --rate 50 --partitions 1 \
        --id-prefix cb- --type "$TYPE"
    wait_jobs "$sb" succeeded 10 10 || fail "B was held back: $(job_states "$sb")"
    assert_le $((SECONDS - t0)) 8 "B's events were delivered within seconds"
    assert_ge "$(metric_delta "$FAST" "$fast0")" 8 "B's jobs took the fast path"
    most=$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$sa' AND state = 'in_flight'")
    assert_le "$most" 5 "A still holds no more than its cap ($most in flight)"
    psql_q "UPDATE subscriptions SET enabled = false WHERE id = '$sa'" >/dev/null
}

# One tenant's broken destinations are its own: past 8 open breakers in
# the process the fast path was off for every tenant (until the breakers
# were forgotten, minutes later).  A's subscriptions to ten destinations
# that stop answering (ten origins: ten sinks, gone) open ten breakers;
# B's fresh events still take the fast path.
hub_env_another_tenants_open_breakers_leave_the_fast_path_on() {
    echo STREAMING_HUB_DELIVERY_TIMEOUT=1s
}

scenario_another_tenants_open_breakers_leave_the_fast_path_on() {
    local ta tb ka kb pb sb i port pids=() fast0 fast
    ta=$(own_tenant a)
    tb=$(own_tenant b)
    ka=$(tenant_key "$ta")
    kb=$(tenant_key "$tb")
    for i in $(seq 1 10); do
        "$BUILD/hub-sink" --listen 127.0.0.1:0 --record "$WORK/gone$i.jsonl" \
            --port-file "$WORK/gone$i.port" >>"$WORK/gone.log" 2>&1 &
        pids+=($!)
        track_pid $!
        wait_until 10 "[[ -s $WORK/gone$i.port ]]" || fatal "sink $i did not start"
        port=$(head -n1 "$WORK/gone$i.port" | tr -d '[:space:]')
        subscribe_active "$ka" "$(subscription_json transaction.posted "http://$port/ok/a$i")" >/dev/null ||
            fail "A's subscription $i was not verified"
    done
    kill "${pids[@]}"
    wait "${pids[@]}" 2>/dev/null
    produce --topic "$TOPIC" --tenant "$ta" --count 12 --rate 50 --partitions 1 \
        --id-prefix br- --type "$TYPE"
    wait_until 30 '(( $(metric streaming_hub_breakers_open) >= 10 ))' ||
        fail "A's breakers did not open: $(metric streaming_hub_breakers_open)"
    pb=/ok/$(own_id b)/
    sb=$(subscribe_at "$kb" "$pb" transaction.posted)
    fast0=$(metric "$FAST")
    produce --topic "$TOPIC" --tenant "$tb" --count 20 --rate 20 --partitions 1 \
        --id-prefix bo- --type "$TYPE"
    wait_jobs "$sb" succeeded 20 20 || fail "B's jobs did not succeed: $(job_states "$sb")"
    fast=$(metric_delta "$FAST" "$fast0")
    log "with $(metric streaming_hub_breakers_open) of A's breakers open, B's jobs on the fast path: $fast of 20"
    assert_ge "$fast" 15 "B's jobs take the fast path beside A's open breakers"
    psql_q "UPDATE subscriptions SET enabled = false WHERE tenant_id = '$ta'" >/dev/null
}

scenarios_main "$@"
