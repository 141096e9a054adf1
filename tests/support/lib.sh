# shellcheck shell=bash
#
# tests/support/lib.sh — sourced by every integration test.
#
# Starts and stops the real things an integration test needs: a private
# PostgreSQL 15, the external Kafka mock cluster (`streaming-hub kafka-mock`)
# and the hub itself (`streaming-hub serve`), all under one scratch directory
# $WORK that is removed on exit (keep it with HUB_TEST_KEEP=1).  Every process
# started here is killed on exit, whatever way the test ends.
#
# A test looks like:
#
#   source "$(dirname "$0")/../support/lib.sh"
#   hub_test_init
#   pg_start; kafka_start --topic lerian.streaming.test:4; hub_start
#   tenant_create acme
#   produce --topic lerian.streaming.test --tenant acme --count 10
#   wait_until 30 '[[ $(psql_q "SELECT count(*) FROM event_inbox") == 10 ]]' || fail "..."
#   assert_eq 10 "$(metric 'streaming_hub_ingest_records_total{verdict="accepted",reason=""}')" "..."
#   hub_test_done
#
# Knobs (environment):
#   HUB_BUILD_DIR   build directory holding streaming-hub and hub-produce
#                   (default <repo>/build; ctest sets it)
#   HUB_TEST_KEEP=1 keep $WORK (logs, database, Kafka data dir) after the test
#   HUB_LOG_LEVEL   hub log level (default info)
#   ADMIN_TOKEN     admin bearer token given to the hub (default test-admin-token)
#   HUB_TEST_TIMEOUT seconds after which the test ends itself (cleanly); ctest
#                   sets it a little below the test's TIMEOUT

HUB_TEST_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# ---------------------------------------------------------------------------
# Set-up, assertions, summary
# ---------------------------------------------------------------------------

# Creates $WORK, installs the cleanup trap and resets the assertion counters.
hub_test_init() {
    set -u
    set -o pipefail
    HUB_TEST_NAME=$(basename "$0" .sh)
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/hub-${HUB_TEST_NAME}.XXXXXX")
    # The postgres user must be able to reach $WORK/pg.
    chmod 755 "$WORK"
    export WORK
    BUILD=${HUB_BUILD_DIR:-$HUB_TEST_REPO/build}
    HUB_BIN=$BUILD/streaming-hub
    HUB_PRODUCE=$BUILD/hub-produce
    export BUILD HUB_BIN HUB_PRODUCE
    ADMIN_TOKEN=${ADMIN_TOKEN:-test-admin-token}
    export ADMIN_TOKEN
    HUB_TEST_PASSED=0
    HUB_TEST_FAILED=0
    HUB_TEST_PIDS=()
    HUB_START_N=0
    HUB_PID=
    KAFKA_PID=
    PG_DATA=
    trap hub_test_cleanup EXIT
    trap 'fatal "interrupted (a signal, or HUB_TEST_TIMEOUT=${HUB_TEST_TIMEOUT:-} s elapsed)"' INT TERM
    # Watchdog: end the test with SIGTERM (so the EXIT trap still cleans up)
    # before the runner's own timeout would SIGKILL it and leak the daemonised
    # PostgreSQL.  Its output goes nowhere so it never holds ctest's pipe.
    if [[ ${HUB_TEST_TIMEOUT:-0} -gt 0 ]]; then
        (sleep "$HUB_TEST_TIMEOUT" && kill -TERM $$) >/dev/null 2>&1 &
        track_pid $!
    fi
    if [[ ! -x $HUB_BIN ]]; then
        fatal "hub binary not found: $HUB_BIN (build first: scripts/build)"
    fi
    log "work dir $WORK, binary $HUB_BIN"
}

# log MSG...: a timestamped progress line on stderr.
log() {
    printf '[%s %s] %s\n' "$(date +%H:%M:%S)" "${HUB_TEST_NAME:-test}" "$*" >&2
}

pass() {
    HUB_TEST_PASSED=$((HUB_TEST_PASSED + 1))
    printf 'ok - %s\n' "$1"
}

# fail MSG: records a failed assertion (the test goes on).
fail() {
    HUB_TEST_FAILED=$((HUB_TEST_FAILED + 1))
    printf 'FAIL - %s\n' "$1"
}

# fatal MSG: records a failure and ends the test now (set-up could not be done).
fatal() {
    fail "$1"
    hub_logs_tail
    hub_test_summary
    exit 1
}

# assert_eq EXPECTED ACTUAL MSG
assert_eq() {
    if [[ "$1" == "$2" ]]; then
        pass "$3"
    else
        fail "$3: expected '$1', got '$2'"
    fi
}

# assert_ne UNEXPECTED ACTUAL MSG
assert_ne() {
    if [[ "$1" != "$2" ]]; then
        pass "$3"
    else
        fail "$3: got '$2'"
    fi
}

# is_number X: X is a (possibly negative, possibly fractional) decimal number.
is_number() {
    [[ $1 =~ ^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]]
}

# assert_ge ACTUAL MINIMUM MSG: ACTUAL >= MINIMUM (numbers).
assert_ge() {
    if is_number "$1" && is_number "$2" && awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; then
        pass "$3"
    else
        fail "$3: expected >= $2, got '$1'"
    fi
}

# assert_le ACTUAL MAXIMUM MSG: ACTUAL <= MAXIMUM (numbers).
assert_le() {
    if is_number "$1" && is_number "$2" && awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; then
        pass "$3"
    else
        fail "$3: expected <= $2, got '$1'"
    fi
}

# assert_contains HAYSTACK NEEDLE MSG
assert_contains() {
    if [[ "$1" == *"$2"* ]]; then
        pass "$3"
    else
        fail "$3: '$2' not found in '${1:0:500}'"
    fi
}

# wait_until TIMEOUT_SECONDS "shell condition": polls the condition (eval'd)
# every 0.2 s; returns 0 as soon as it holds, 1 when the time is up.
wait_until() {
    local timeout=$1 cond=$2
    local deadline=$((SECONDS + timeout))
    while true; do
        if eval "$cond"; then
            return 0
        fi
        if ((SECONDS >= deadline)); then
            return 1
        fi
        sleep 0.2
    done
}

hub_test_summary() {
    printf '%d passed, %d failed\n' "$HUB_TEST_PASSED" "$HUB_TEST_FAILED"
}

# Prints the tail of the newest hub log (and the Kafka mock's), for failures.
hub_logs_tail() {
    local f
    for f in "${HUB_LOG:-}" "${WORK:-/nonexistent}/kafka.log"; do
        if [[ -n $f && -s $f ]]; then
            echo "----- last 40 lines of $f" >&2
            tail -n 40 "$f" >&2
            echo "-----" >&2
        fi
    done
}

# Sanitizer reports in any log of this test are failures: the hub and the
# mock are the same binary, built with ASan+UBSan in the sanitizer pass.
hub_check_sanitizer_logs() {
    local f
    for f in "$WORK"/hub.*.log "$WORK"/kafka.log; do
        [[ -f $f ]] || continue
        if grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$f"; then
            fail "sanitizer report in $(basename "$f")"
            grep -m1 -A30 -E 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$f" >&2
        fi
    done
}

# Every line the hub and the mock write is one JSON object (SPEC §10), the
# lines of librdkafka and of PostgreSQL's notices included.  Sanitizer
# reports are left to hub_check_sanitizer_logs.
hub_check_log_lines() {
    local f bad
    command -v jq >/dev/null || return 0
    for f in "$WORK"/hub.*.log "$WORK"/kafka.log; do
        [[ -s $f ]] || continue
        grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$f" && continue
        bad=$(jq -Rr '. as $l | (try (fromjson | type) catch "none") | if . == "object" then empty else $l end' "$f" 2>/dev/null | head -n 3)
        if [[ -n $bad ]]; then
            fail "$(basename "$f") has lines that are not JSON objects: ${bad:0:300}"
        fi
    done
}

# hub_test_done: stops the hub and the mock cleanly (checking their exit
# status), checks the logs for sanitizer reports, prints exactly one summary
# line "N passed, M failed" and exits non-zero when M > 0 or N == 0.
hub_test_done() {
    if [[ -n ${HUB_PID:-} ]]; then
        hub_stop
    fi
    if [[ -n ${KAFKA_PID:-} ]]; then
        kafka_stop
    fi
    hub_check_sanitizer_logs
    hub_check_log_lines
    if ((HUB_TEST_FAILED > 0)); then
        hub_logs_tail
    fi
    hub_test_summary
    if ((HUB_TEST_FAILED > 0 || HUB_TEST_PASSED == 0)); then
        exit 1
    fi
    exit 0
}

# track_pid PID: kill PID at exit if it is still running.
track_pid() {
    HUB_TEST_PIDS+=("$1")
}

# The EXIT trap: kill everything this test started, stop PostgreSQL, remove $WORK.
hub_test_cleanup() {
    local rc=$? pid
    trap - EXIT
    for pid in "${HUB_PID:-}" "${KAFKA_PID:-}" "${HUB_TEST_PIDS[@]}"; do
        if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
            pkill -9 -P "$pid" 2>/dev/null
            kill -9 "$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
        fi
    done
    if [[ -n ${PG_DATA:-} && -f $PG_DATA/postmaster.pid ]]; then
        pg_ctl_as_postgres stop -D "$PG_DATA" -m immediate -w >/dev/null 2>&1
    fi
    if [[ -n ${WORK:-} && -d $WORK ]]; then
        if [[ ${HUB_TEST_KEEP:-0} == 1 ]]; then
            echo "kept work dir: $WORK" >&2
        else
            rm -rf "$WORK"
        fi
    fi
    exit "$rc"
}

# ---------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------

PG_BINDIR=/usr/lib/postgresql/15/bin

# Runs a PostgreSQL tool as the postgres user (initdb and the server refuse
# root), from a directory that user can read.
pg_as_postgres() {
    (cd "$WORK" && runuser -u postgres -- "$@")
}

pg_ctl_as_postgres() {
    pg_as_postgres "$PG_BINDIR/pg_ctl" "$@"
}

# port_in_use PORT: something accepts TCP connections on 127.0.0.1:PORT.
port_in_use() {
    timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# random_port: a port to listen on, below the kernel's ephemeral range
# (ip_local_port_range starts at 32768 by default), so that no outgoing
# connection of a busy benchmark can hold it.  Callers still retry on a bind
# failure: something else may listen there.
random_port() {
    local low
    low=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)
    ((${low:-0} > 12000)) || low=32768
    echo $((10000 + RANDOM % (low - 10000)))
}

# pg_start: the first call creates a private cluster in $WORK/pg on a free
# loopback port and the database "hub"; later calls start the same cluster
# again (same port, same data).  Exports PGPORT and STREAMING_HUB_POSTGRES_DSN.
pg_start() {
    local port
    if [[ -z ${PG_DATA:-} ]]; then
        mkdir -p "$WORK/pg"
        chown postgres: "$WORK/pg"
        PG_DATA=$WORK/pg/data
        if ! pg_as_postgres "$PG_BINDIR/initdb" -D "$PG_DATA" -A trust -U postgres --no-sync \
            -E UTF8 --no-locale >"$WORK/pg/initdb.log" 2>&1; then
            cat "$WORK/pg/initdb.log" >&2
            fatal "initdb failed"
        fi
        cat >>"$PG_DATA/postgresql.conf" <<EOF
# streaming-hub integration test settings
listen_addresses = '127.0.0.1'
unix_socket_directories = '$WORK/pg'
max_connections = 100
fsync = on
synchronous_commit = on
full_page_writes = on
logging_collector = off
log_min_messages = warning
${PG_EXTRA_CONF:-}
EOF
        for _ in 1 2 3 4 5 6 7 8; do
            port=$(random_port)
            port_in_use "$port" && continue
            echo "port = $port" >>"$PG_DATA/postgresql.conf"
            if pg_ctl_as_postgres start -D "$PG_DATA" -w -t 60 -l "$WORK/pg/server.log" \
                >/dev/null 2>&1; then
                PGPORT=$port
                break
            fi
            # Lost a race for the port (or worse): look at the log, try another.
            tail -n 5 "$WORK/pg/server.log" >&2
        done
        [[ -n ${PGPORT:-} ]] || fatal "could not start PostgreSQL (see $WORK/pg/server.log)"
        export PGPORT
        psql -XAtq -v ON_ERROR_STOP=1 "host=127.0.0.1 port=$PGPORT dbname=postgres user=postgres" \
            -c 'CREATE DATABASE hub' || fatal "could not create database hub"
        export STREAMING_HUB_POSTGRES_DSN="host=127.0.0.1 port=$PGPORT dbname=hub user=postgres"
        log "PostgreSQL up on 127.0.0.1:$PGPORT"
    else
        pg_ctl_as_postgres start -D "$PG_DATA" -w -t 60 -l "$WORK/pg/server.log" >/dev/null ||
            fatal "could not restart PostgreSQL (see $WORK/pg/server.log)"
        log "PostgreSQL started again on 127.0.0.1:$PGPORT"
    fi
}

# pg_stop: fast shutdown (disconnects every client, checkpoints).
pg_stop() {
    pg_ctl_as_postgres stop -D "$PG_DATA" -m fast -w -t 60 >/dev/null ||
        fail "PostgreSQL did not stop"
    log "PostgreSQL stopped"
}

# pg_restart [DOWN_SECONDS]: stop (fast), stay down DOWN_SECONDS (default 0),
# start again on the same port and data directory.
pg_restart() {
    pg_stop
    sleep "${1:-0}"
    pg_start
}

# psql_q "SQL": runs SQL against the hub database, prints the result
# unaligned, tuples only (columns separated by '|').  Returns psql's status.
psql_q() {
    psql -XAtq -v ON_ERROR_STOP=1 "$STREAMING_HUB_POSTGRES_DSN" -c "$1"
}

# table_exists NAME: the table exists in the hub database (quietly false when
# the database is not reachable).
table_exists() {
    [[ $(psql_q "SELECT to_regclass('public.$1') IS NOT NULL" 2>/dev/null) == t ]]
}

# ---------------------------------------------------------------------------
# Kafka (external mock cluster: `streaming-hub kafka-mock`)
# ---------------------------------------------------------------------------

# kafka_start [--brokers N] [--topic NAME:PARTITIONS ...]: starts the mock
# cluster with its data dir in $WORK/kafka, waits for its bootstrap list and
# exports STREAMING_HUB_KAFKA_BROKERS and KAFKA_PID.  Not persisted: stopping
# it loses every record.
kafka_start() {
    local bootstrap_file=$WORK/kafka/kafka.bootstrap bootstrap=""
    mkdir -p "$WORK/kafka"
    rm -f "$bootstrap_file"
    # stdout is the bootstrap list (SPEC §2.1), stderr the log
    (cd "$WORK" && STREAMING_HUB_DATA_DIR=$WORK/kafka exec "$HUB_BIN" kafka-mock "$@") \
        >>"$WORK/kafka.out" 2>>"$WORK/kafka.log" &
    KAFKA_PID=$!
    export KAFKA_PID
    local deadline=$((SECONDS + 30))
    while ((SECONDS < deadline)); do
        if [[ -s $bootstrap_file ]]; then
            bootstrap=$(head -n1 "$bootstrap_file" | tr -d '[:space:]')
            [[ -n $bootstrap ]] && break
        fi
        if ! kill -0 "$KAFKA_PID" 2>/dev/null; then
            KAFKA_PID=
            tail -n 30 "$WORK/kafka.log" >&2
            fatal "kafka-mock exited during start-up"
        fi
        sleep 0.1
    done
    [[ -n $bootstrap ]] || {
        tail -n 30 "$WORK/kafka.log" >&2
        fatal "kafka-mock wrote no bootstrap list within 30 s"
    }
    export STREAMING_HUB_KAFKA_BROKERS=$bootstrap
    log "kafka-mock up at $bootstrap (pid $KAFKA_PID)"
}

# kafka_stop: SIGTERM, wait up to 15 s; a non-zero exit is a failure.
kafka_stop() {
    local pid=$KAFKA_PID rc
    [[ -n $pid ]] || return 0
    kill -TERM "$pid" 2>/dev/null
    if ! wait_until 15 "! kill -0 $pid 2>/dev/null"; then
        fail "kafka-mock still running 15 s after SIGTERM"
        kill -9 "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
    rc=$?
    KAFKA_PID=
    if ((rc != 0)); then
        fail "kafka-mock exited with status $rc after SIGTERM"
    fi
}

# produce ARGS...: runs hub-produce against the mock cluster (foreground).
produce() {
    "$HUB_PRODUCE" --bootstrap "$STREAMING_HUB_KAFKA_BROKERS" --quiet "$@"
}

# produce_bg ARGS...: the same in the background; sets PRODUCER_PID (tracked
# for cleanup) and PRODUCER_LOG (its output).
produce_bg() {
    PRODUCER_LOG=$WORK/produce.$RANDOM.log
    "$HUB_PRODUCE" --bootstrap "$STREAMING_HUB_KAFKA_BROKERS" --quiet "$@" >"$PRODUCER_LOG" 2>&1 &
    PRODUCER_PID=$!
    track_pid "$PRODUCER_PID"
}

# ---------------------------------------------------------------------------
# The hub
# ---------------------------------------------------------------------------

# hub_start [--no-ready] [NAME=VALUE ...]: starts `streaming-hub serve` in the
# background with the exported environment, the test defaults and then the
# given assignments (which win).  Logs go to $WORK/hub.N.log (N counts starts).
# Waits up to 30 s for the "http listening" log line and /readyz = 200 (only
# for the log line with --no-ready); exports HUB_URL, HUB_PID and HUB_LOG.
# Fails the test on timeout.
hub_start() {
    local addr="" deadline code wait_ready=1
    if [[ ${1:-} == --no-ready ]]; then
        wait_ready=0
        shift
    fi
    HUB_START_N=$((HUB_START_N + 1))
    HUB_LOG=$WORK/hub.$HUB_START_N.log
    mkdir -p "$WORK/hub" "$WORK/policies"
    (cd "$WORK" && exec env \
        STREAMING_HUB_HTTP_LISTEN_ADDR=127.0.0.1:0 \
        STREAMING_HUB_DATA_DIR="$WORK/hub" \
        STREAMING_HUB_POLICY_DIR="$WORK/policies" \
        STREAMING_HUB_ADMIN_TOKEN="$ADMIN_TOKEN" \
        STREAMING_HUB_KAFKA_SESSION_TIMEOUT=3s \
        STREAMING_HUB_LOG_LEVEL="${HUB_LOG_LEVEL:-info}" \
        "$@" "$HUB_BIN" serve) >>"$HUB_LOG" 2>&1 &
    HUB_PID=$!
    export HUB_PID HUB_LOG

    deadline=$((SECONDS + 30))
    while ((SECONDS < deadline)); do
        addr=$(grep -F '"msg":"http listening"' "$HUB_LOG" 2>/dev/null |
            grep -oE '"addr":"127\.0\.0\.1:[0-9]+"' | head -n1 | grep -oE '[0-9]+"$' | tr -d '"')
        [[ -n $addr ]] && break
        if ! kill -0 "$HUB_PID" 2>/dev/null; then
            wait "$HUB_PID" 2>/dev/null
            code=$?
            HUB_PID=
            fatal "hub exited during start-up (status $code)"
        fi
        sleep 0.1
    done
    [[ -n $addr ]] || fatal "hub did not log \"http listening\" within 30 s"
    export HUB_URL=http://127.0.0.1:$addr
    if ((!wait_ready)); then
        log "hub #$HUB_START_N listening at $HUB_URL (pid $HUB_PID)"
        return 0
    fi

    while ((SECONDS < deadline)); do
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$HUB_URL/readyz")
        [[ $code == 200 ]] && break
        if ! kill -0 "$HUB_PID" 2>/dev/null; then
            HUB_PID=
            fatal "hub exited before it was ready"
        fi
        sleep 0.2
    done
    [[ $code == 200 ]] || {
        echo "readyz: $(curl -s --max-time 2 "$HUB_URL/readyz")" >&2
        fatal "hub not ready within 30 s (last /readyz status $code)"
    }
    log "hub #$HUB_START_N ready at $HUB_URL (pid $HUB_PID)"
}

# hub_stop: SIGTERM, wait up to 30 s; still alive or a non-zero exit status
# is a failure.
hub_stop() {
    local pid=$HUB_PID rc
    [[ -n $pid ]] || return 0
    kill -TERM "$pid" 2>/dev/null
    if ! wait_until 30 "! kill -0 $pid 2>/dev/null"; then
        fail "hub still running 30 s after SIGTERM"
        kill -9 "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
    rc=$?
    HUB_PID=
    if ((rc != 0)); then
        fail "hub exited with status $rc after SIGTERM (see $(basename "$HUB_LOG"))"
    fi
    log "hub stopped"
}

# hub_kill9: SIGKILL the hub (a crash), reap it.
hub_kill9() {
    local pid=$HUB_PID
    [[ -n $pid ]] || return 0
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    HUB_PID=
    log "hub killed (SIGKILL)"
}

# hub_alive: the hub process started last is still running.
hub_alive() {
    [[ -n ${HUB_PID:-} ]] && kill -0 "$HUB_PID" 2>/dev/null
}

# ---------------------------------------------------------------------------
# HTTP helpers
# ---------------------------------------------------------------------------

# http_status: the status code of the last admin_curl/hub_curl call.
http_status() {
    cat "$WORK/last_http_status" 2>/dev/null || echo 000
}

# hub_curl METHOD PATH [BODY] [curl args...]: request to the hub; prints the
# body; the status is kept for http_status.
hub_curl() {
    local method=$1 path=$2 body=${3:-}
    shift 2
    (($# > 0)) && shift
    local args=(-s -X "$method" --max-time 30 -o "$WORK/last_http_body"
        -w '%{http_code}' "$@")
    if [[ -n $body ]]; then
        args+=(-H 'Content-Type: application/json' --data-binary "$body")
    fi
    curl "${args[@]}" "$HUB_URL$path" >"$WORK/last_http_status" 2>/dev/null ||
        echo 000 >"$WORK/last_http_status"
    cat "$WORK/last_http_body" 2>/dev/null
}

# admin_curl METHOD PATH [JSON]: admin API call with the admin bearer token.
admin_curl() {
    hub_curl "$1" "$2" "${3:-}" -H "Authorization: Bearer $ADMIN_TOKEN"
}

# tenant_create ID [STATUS]: adds a tenant to the roster (default active).
tenant_create() {
    local id=$1 status=${2:-active} out code
    out=$(admin_curl POST /admin/tenants "{\"id\":\"$id\",\"status\":\"$status\"}")
    code=$(http_status)
    if [[ $code == 201 ]]; then
        pass "tenant $id ($status) created"
    else
        fail "create tenant $id: status $code, body ${out:0:300}"
    fi
}

# metric 'NAME{labels}': the value of that series on /metrics (exact match of
# the series as rendered, labels in the hub's order), or 0 when absent.
metric() {
    curl -s --max-time 10 "$HUB_URL/metrics" |
        awk -v n="$1" '$1 == n { v = $2; found = 1 } END { print (found ? v : 0) }'
}
