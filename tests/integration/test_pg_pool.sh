#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# The database pool (src/pg.c) against a real PostgreSQL:
# - its lanes (hub_pg_lane: a Kafka partition's batches): a transaction
#   submitted behind another of its lane runs only if that one committed,
#   also when it waited in the queue until the one before had failed and
#   left the lane empty;
# - a DSN of two hosts whose first refuses: the pool connects to the second
#   (libpq's socket for it usually has the number of the one it closed).
# pg_pool_probe prints "ok ..." / "FAIL ...: why" per check; every line
# becomes an assertion here, and the row T2 would insert is counted.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"

setup() {
    pg_start
}

scenario_lanes_keep_their_order_and_a_refusing_host_is_passed() {
    local probe=$BUILD/pg_pool_probe line rc
    [[ -x $probe ]] || fatal "probe not found: $probe (build the pg_pool_probe target)"
    # the second DSN: a first host that refuses (port 1: nothing listens),
    # then the real one
    "$probe" "$STREAMING_HUB_POSTGRES_DSN" \
        "host=127.0.0.1,127.0.0.1 port=1,$PGPORT dbname=hub user=postgres" \
        >"$WORK/probe.out" 2>"$WORK/probe.err"
    rc=$?
    while IFS= read -r line; do
        case $line in
            "ok "*) pass "pg: ${line#ok }" ;;
            "FAIL "*) fail "pg: ${line#FAIL }" ;;
        esac
    done <"$WORK/probe.out"
    assert_eq 0 "$rc" "the probe exited 0 ($(tail -n 3 "$WORK/probe.err" | tr '\n' ' '))"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM pg_pool_probe")" "T2 inserted nothing"
}

scenarios_main "$@"
