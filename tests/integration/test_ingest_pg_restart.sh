#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# The database goes away for 3 s in the middle of a stream (SPEC §3.3): the hub
# keeps running, reports not-ready while PostgreSQL is down, retries the failed
# partition batches, and in the end has stored each of the 20000 events exactly
# once.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"

TOPIC=lerian.streaming.pgrestart
N=20000

setup() {
    pg_start
    kafka_start --topic "$TOPIC:4"
    hub_shared
}

readyz() {
    curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$HUB_URL/readyz"
}

# The tenants are hub-produce's own t0..t4 (--tenants 5): this script's only
# scenario owns them.
scenario_every_event_is_stored_once_across_a_database_outage() {
    local i producer before not_ready down_until alive_throughout deadline
    for i in 0 1 2 3 4; do
        tenant_create "t$i" >/dev/null
    done

    # ≈ 6.7 s of events at 3000/s.
    produce_bg --topic "$TOPIC" --count "$N" --tenants 5 --payload-bytes 512 --rate 3000
    producer=$PRODUCER_PID

    wait_until 30 "[[ \$(inbox_count) -ge 4000 ]]" || fail "hub did not store 4000 events within 30 s"
    before=$(inbox_count)
    pg_stop
    # While the database is down the hub stays up and says it is not ready.
    not_ready=0
    down_until=$((SECONDS + 3))
    while ((SECONDS < down_until)); do
        [[ $(readyz) != 200 ]] && not_ready=1
        hub_alive || break
        sleep 0.2
    done
    assert_eq 1 "$not_ready" "/readyz is not 200 while PostgreSQL is down"
    assert_eq 0 "$(hub_alive; echo $?)" "hub alive while PostgreSQL is down"
    pg_start
    log "PostgreSQL was down with $before events stored"

    alive_throughout=1
    deadline=$((SECONDS + 180))
    while (($(inbox_count) < N && SECONDS < deadline)); do
        hub_alive || alive_throughout=0
        sleep 0.5
    done
    wait "$producer"
    assert_eq 0 $? "producer finished"
    assert_contains "$(cat "$PRODUCER_LOG")" "produced $N failed 0" "producer: $N acknowledged"
    sleep 2

    assert_eq "$N" "$(inbox_count)" "count(*) = $N"
    assert_eq "$N" "$(psql_q "SELECT count(DISTINCT (tenant_id, source, event_id)) FROM event_inbox")" \
        "$N distinct keys: no duplicates"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM generate_series(0, $N - 1) g
                            LEFT JOIN event_inbox e ON e.event_id = 'ev-' || g
                            WHERE e.event_id IS NULL")" \
        "every produced ce-id is stored"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM quarantine")" "nothing quarantined"
    assert_eq 1 "$alive_throughout" "hub process stayed alive throughout"
    hub_alive
    assert_eq 0 $? "hub still running at the end"
    wait_until 30 '[[ $(readyz) == 200 ]]'
    assert_eq 200 "$(readyz)" "/readyz 200 after PostgreSQL came back"
    log "batch failures during the outage: $(metric streaming_hub_ingest_batch_failures_total)"
}

scenarios_main "$@"
