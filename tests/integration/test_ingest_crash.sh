#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# Crash safety of ingest (SPEC §3.3): the hub is killed with SIGKILL twice
# while 20000 events stream in over 8 partitions — once 2 s into the stream,
# once while the restarted hub catches up on the backlog.  After the last
# restart every event is stored exactly once — zero lost, zero stored twice —
# with its own tenant, partition and payload, each partition in partition
# order.  kafka-mock keeps running (it is not persisted), so the replays come
# from the committed offsets.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"

TOPIC=lerian.streaming.crash
N=20000

setup() {
    pg_start
    kafka_start --topic "$TOPIC:8"
    hub_shared
}

# hub_kill9_when_progress BASE: kills the hub as soon as more than BASE
# events are stored (30 s at most).
hub_kill9_when_progress() {
    local base=$1 deadline=$((SECONDS + 30))
    while (($(inbox_count) <= base && SECONDS < deadline)); do
        sleep 0.05
    done
    hub_kill9
}

# The tenants are hub-produce's own t0..t9 (--tenants 10): this script's only
# scenario owns them.
scenario_every_event_is_stored_once_across_two_sigkills() {
    local i producer before before2
    for i in $(seq 0 9); do
        tenant_create "t$i" >/dev/null
    done
    assert_eq 10 "$(psql_q "SELECT count(*) FROM tenants WHERE status = 'active'")" "10 tenants"

    # 1 KiB events, t0..t9, record i on partition i % 8, 4000/s (≈ 5 s).
    produce_bg --topic "$TOPIC" --count "$N" --tenants 10 --payload-bytes 1024 --rate 4000 \
        --partitions 8
    producer=$PRODUCER_PID

    sleep 2
    before=$(inbox_count)
    hub_kill9
    log "first kill: $before events stored"

    # Second crash while the next hub catches up on the backlog: start it
    # without waiting for readiness and kill it as soon as it has stored
    # anything more.
    hub_start_shared --no-ready
    hub_kill9_when_progress "$before"
    before2=$(inbox_count)
    log "second kill: $before2 events stored"
    assert_ge "$before2" "$((before + 1))" "the restarted hub made progress before the second kill"
    hub_start_shared

    wait "$producer"
    assert_eq 0 $? "producer finished"
    assert_contains "$(cat "$PRODUCER_LOG")" "produced $N failed 0" "producer: $N acknowledged"

    if ! wait_until 180 "[[ \$(inbox_count) -ge $N ]]"; then
        fail "only $(inbox_count) of $N events stored within 180 s"
    fi
    # Give replays a moment to show up as (wrong) extra rows, if any.
    sleep 2

    assert_eq "$N" "$(inbox_count)" "count(*) = $N"
    assert_eq "$N" "$(psql_q "SELECT count(DISTINCT (tenant_id, source, event_id)) FROM event_inbox")" \
        "$N distinct (tenant, source, id): nothing stored twice"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM generate_series(0, $N - 1) g
                            LEFT JOIN event_inbox e ON e.event_id = 'ev-' || g
                            WHERE e.event_id IS NULL")" \
        "every produced ce-id ev-0..ev-$((N - 1)) is stored"
    assert_eq "$N" "$(inbox_count "event_id LIKE 'ev-%'")" "no unexpected ids"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM event_inbox
                            WHERE tenant_id <> 't' || (substr(event_id, 4)::int % 10)
                               OR kafka_partition <> substr(event_id, 4)::int % 8
                               OR length(payload) NOT BETWEEN 1000 AND 1050")" \
        "tenant, partition and payload of every event are the produced ones"
    assert_eq "$N" "$(psql_q "SELECT count(DISTINCT seq) FROM event_inbox")" \
        "every event has its own arrival sequence"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM (
                             SELECT seq, lag(seq) OVER (PARTITION BY kafka_partition
                                                        ORDER BY kafka_offset) AS prev
                               FROM event_inbox) x WHERE prev > seq")" \
        "each partition stored in partition order"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM quarantine")" "nothing quarantined"
    assert_eq 200 "$(curl -s -o /dev/null -w '%{http_code}' "$HUB_URL/readyz")" "ready at the end"
}

scenarios_main "$@"
