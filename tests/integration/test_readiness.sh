#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# /readyz tracks reality (SPEC §9, issue 23 item 5): 503 while the
# database is unreachable, while the schema is behind the binary, and (an
# ingest role) once the consumer has been without its brokers or its group
# for STREAMING_HUB_READY_KAFKA_WINDOW (3 s here); back to 200 by itself
# when they return.  Before its first join a consumer is not ready; a member
# with no partition (more members than partitions) is.  Events produced
# while the brokers were gone are stored once they are back.
#
# The brokers are taken down and brought back with kafka-mock's SIGUSR1 and
# SIGUSR2 (same port, same records); the last scenario stops the mock
# cluster altogether.
#
# No `set -e`: every check below is an explicit assertion.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"

TOPIC=lerian.streaming.ready
WINDOW_S=3

setup() {
    pg_start
    kafka_start --topic "$TOPIC:1"
    hub_shared STREAMING_HUB_READY_KAFKA_WINDOW=${WINDOW_S}s
}

# readyz [URL]: /readyz's status code (000 when nothing answers).
readyz() {
    curl -s -o /dev/null -w '%{http_code}' --max-time 2 "${1:-$HUB_URL}/readyz"
}

# readyz_why: the detail of /readyz's answer.
readyz_why() {
    curl -s --max-time 2 "$HUB_URL/readyz" | jq -r '.detail // .status' 2>/dev/null
}

# seconds_until STATUS TIMEOUT: polls /readyz until it answers STATUS;
# prints the seconds it took (with ms), or "never".
seconds_until() {
    local t0 deadline
    t0=$(date +%s%3N)
    deadline=$((t0 + $2 * 1000))
    while (($(date +%s%3N) < deadline)); do
        if [[ $(readyz) == "$1" ]]; then
            awk -v ms=$(($(date +%s%3N) - t0)) 'BEGIN { printf "%.1f\n", ms / 1000 }'
            return 0
        fi
        sleep 0.1
    done
    echo never
}

# A start waits up to a minute for its database.  A SIGHUP meanwhile (the
# runbook's policy reload) ended the process: its default action, before
# the loop's handler is installed.
scenario_a_sighup_while_starting_does_not_stop_it() {
    local pid
    rm -f "$WORK/early.pid" "$WORK/early.rc"
    (
        env STREAMING_HUB_POSTGRES_DSN="postgresql://hub@127.0.0.1:1/none?connect_timeout=1" \
            STREAMING_HUB_HTTP_LISTEN_ADDR=127.0.0.1:0 STREAMING_HUB_DATA_DIR="$WORK/early" \
            "$HUB_BIN" serve >>"$WORK/hub.early.log" 2>&1 &
        echo $! >"$WORK/early.pid"
        wait $!
        echo $? >"$WORK/early.rc"
    ) >/dev/null 2>&1 &
    track_pid $!
    wait_until 10 "[[ -s '$WORK/early.pid' ]]" || fatal "the process wrote no pid"
    pid=$(cat "$WORK/early.pid")
    track_pid "$pid"
    sleep 1
    kill -HUP "$pid"
    sleep 1
    kill -0 "$pid" 2>/dev/null && pass "a SIGHUP while it waits for its database does not stop it" ||
        fail "the process ended on SIGHUP while starting (status $(cat "$WORK/early.rc" 2>/dev/null))"
    kill -TERM "$pid" 2>/dev/null
    wait_until 10 "[[ -s '$WORK/early.rc' ]]" || fail "the process did not end on SIGTERM"
}

scenario_brokers_gone_turn_readyz_503_after_the_window_and_back() {
    local t n0
    tenant_create "$(own_id)" >/dev/null
    assert_eq 200 "$(readyz)" "ready with its brokers and its group"
    kill -USR1 "$KAFKA_PID"
    sleep 1
    assert_eq 200 "$(readyz)" "still ready 1 s after the brokers went (the window is ${WINDOW_S} s)"
    t=$(seconds_until 503 20)
    [[ $t != never ]] && pass "503 once the brokers have been gone for the window (after $t s)" ||
        fail "/readyz never turned 503 with every broker down"
    assert_contains "$(readyz_why)" "Kafka" "the 503 says why: $(readyz_why)"
    assert_eq 0 "$(metric streaming_hub_kafka_healthy)" "streaming_hub_kafka_healthy is 0"
    n0=$(inbox_count "tenant_id = '$(own_id)'")
    kill -USR2 "$KAFKA_PID"
    t=$(seconds_until 200 40)
    [[ $t != never ]] && pass "ready again by itself once the brokers are back (after $t s)" ||
        fail "/readyz did not recover after the brokers came back: $(readyz_why)"
    assert_eq 1 "$(metric streaming_hub_kafka_healthy)" "streaming_hub_kafka_healthy is 1 again"
    produce --topic "$TOPIC" --tenant "$(own_id)" --count 5 --id-prefix back- ||
        fail "producing after the brokers came back failed"
    wait_sql 30 $((n0 + 5)) "SELECT count(*) FROM event_inbox WHERE tenant_id = '$(own_id)'" &&
        pass "events produced after the recovery are stored" || fail "events not stored after the recovery"
}

scenario_database_stop_turns_readyz_503_and_back() {
    local t
    assert_eq 200 "$(readyz)" "ready"
    pg_stop
    t=$(seconds_until 503 10)
    [[ $t != never ]] && pass "503 when the database stops (after $t s)" ||
        fail "/readyz stayed 200 with the database stopped"
    assert_eq "database unreachable" "$(readyz_why)" "the 503 says why"
    assert_eq 200 "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$HUB_URL/healthz")" \
        "/healthz stays 200 (alive)"
    pg_start
    t=$(seconds_until 200 30)
    [[ $t != never ]] && pass "ready again by itself once the database is back (after $t s)" ||
        fail "/readyz did not recover after the database came back: $(readyz_why)"
}

scenario_schema_behind_turns_readyz_503_and_back() {
    local t last
    last=$(psql_q "SELECT max(version) FROM schema_migrations")
    psql_q "DELETE FROM schema_migrations WHERE version = '$last'" >/dev/null
    t=$(seconds_until 503 10)
    [[ $t != never ]] && pass "503 when the database's schema is behind the binary (after $t s)" ||
        fail "/readyz stayed 200 with a migration missing"
    assert_contains "$(readyz_why)" "schema is not current" "the 503 says why"
    psql_q "INSERT INTO schema_migrations (version) VALUES ('$last')" >/dev/null
    t=$(seconds_until 200 10)
    [[ $t != never ]] && pass "ready again once the migration is recorded (after $t s)" ||
        fail "/readyz did not recover: $(readyz_why)"
}

# A second hub in the same group on a one-partition topic: one of the two
# members has no partition, and both are ready.
scenario_member_without_partitions_is_ready() {
    local log=$WORK/hub-member.log addr url code
    (cd "$WORK" && exec env STREAMING_HUB_HTTP_LISTEN_ADDR=127.0.0.1:0 \
        STREAMING_HUB_DATA_DIR="$WORK/hub-member" STREAMING_HUB_POLICY_DIR="$WORK/policies" \
        STREAMING_HUB_KAFKA_SESSION_TIMEOUT=3s STREAMING_HUB_KAFKA_TOPICS="$TOPIC" \
        STREAMING_HUB_READY_KAFKA_WINDOW=${WINDOW_S}s "$HUB_BIN" serve) >>"$log" 2>&1 &
    local pid=$!
    track_pid "$pid"
    wait_until 30 "grep -q '\"msg\":\"http listening\"' $log" || fatal "the second hub did not listen"
    addr=$(grep -F '"msg":"http listening"' "$log" | grep -oE '127\.0\.0\.1:[0-9]+' | head -n1)
    url=http://$addr
    wait_until 30 "[[ \$(readyz $url) == 200 ]]" && pass "the second member becomes ready" ||
        fail "the second member never became ready"
    wait_until 30 "[[ \$(( \$(curl -s $url/metrics | awk '\$1 == \"streaming_hub_kafka_partitions_assigned\" { print \$2 }') + \$(metric streaming_hub_kafka_partitions_assigned) )) == 1 ]]" ||
        fail "the topic's one partition is not assigned to exactly one of the two"
    sleep $((WINDOW_S + 2))
    code="$(readyz "$url") $(readyz)"
    assert_eq "200 200" "$code" "both members ready after the window, the one without a partition too"
    kill -TERM "$pid"
    wait "$pid"
    assert_eq 0 "$?" "the second member exits 0"
}

# A consumer that has not joined its group yet is not ready.
scenario_not_ready_before_the_first_join() {
    hub_stop
    hub_start_shared --no-ready
    assert_eq 503 "$(readyz)" "503 right after start, before the group is joined"
    assert_contains "$(readyz_why)" "not joined" "the 503 says why"
    wait_until 30 '[[ $(readyz) == 200 ]]' && pass "ready once joined" || fail "never ready"
}

# The mock cluster stopped altogether (last: the cluster is not started
# again, and the main shell's kafka_stop then finds it gone): the same 503
# after the window, and the hub still drains and exits 0 without it.
scenario_kafka_stopped_turns_readyz_503() {
    local t
    assert_eq 200 "$(readyz)" "ready"
    kill -TERM "$KAFKA_PID"
    wait_until 15 "! kill -0 $KAFKA_PID 2>/dev/null" || fail "the mock cluster did not stop"
    t=$(seconds_until 503 30)
    [[ $t != never ]] && pass "503 once the stopped cluster has been gone for the window (after $t s)" ||
        fail "/readyz never turned 503 with the cluster stopped"
    hub_stop
}

scenarios_main "$@"
