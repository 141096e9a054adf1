#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# The database pool's lanes (src/pg.c, hub_pg_lane: a Kafka partition's
# batches) against a real PostgreSQL: a transaction submitted behind another
# of its lane runs only if that one committed, also when it waited in the
# queue until the one before had failed and left the lane empty.
# pg_lane_probe prints "ok ..." / "FAIL ...: why" per check; every line
# becomes an assertion here, and the row T2 would insert is counted.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"

setup() {
    pg_start
}

scenario_a_queued_transaction_does_not_pass_a_failed_one_of_its_lane() {
    local probe=$BUILD/pg_lane_probe line rc
    [[ -x $probe ]] || fatal "probe not found: $probe (build the pg_lane_probe target)"
    "$probe" "$STREAMING_HUB_POSTGRES_DSN" >"$WORK/probe.out" 2>"$WORK/probe.err"
    rc=$?
    while IFS= read -r line; do
        case $line in
            "ok "*) pass "pg: ${line#ok }" ;;
            "FAIL "*) fail "pg: ${line#FAIL }" ;;
        esac
    done <"$WORK/probe.out"
    assert_eq 0 "$rc" "the probe exited 0 ($(tail -n 3 "$WORK/probe.err" | tr '\n' ' '))"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM pg_lane_probe")" "T2 inserted nothing"
}

scenarios_main "$@"
