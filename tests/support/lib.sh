# shellcheck shell=bash
#
# tests/support/lib.sh — sourced by every integration test (and the benchmarks).
#
# Starts and stops the real things an integration test needs: a private
# PostgreSQL 15, the external Kafka mock cluster (`streaming-hub kafka-mock`)
# and the hub itself (`streaming-hub serve`), all under one scratch directory
# $WORK that is removed on exit (keep it with HUB_TEST_KEEP=1).  Every process
# started here is killed on exit, whatever way the test ends.
#
# An integration script is a list of scenarios, one user-visible behaviour
# each, run by the scenario runner of scenario.sh (sourced at the end of this
# file; its header has the details):
#
#   source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
#
#   setup() {                                   # the shared services, once
#       pg_start; kafka_start --topic lerian.streaming.test:4
#       hub_shared STREAMING_HUB_MAX_EVENT_BYTES=2048
#   }
#
#   scenario_accepted_events_are_stored() {     # its own tenant and ids
#       local t accepted0 series='streaming_hub_ingest_records_total{verdict="accepted",reason=""}'
#       t=$(own_tenant)
#       accepted0=$(metric "$series")         # counters are shared: compare growth
#       produce --topic lerian.streaming.test --tenant "$t" --count 10
#       wait_sql 30 10 "SELECT count(*) FROM event_inbox WHERE tenant_id = '$t'" ||
#           fail "the 10 events were not stored"
#       assert_eq 10 "$(metric_delta "$series" "$accepted0")" "accepted counted"
#   }
#
#   scenarios_main "$@"
#
# Run one or more scenarios alone by name (shell patterns work too):
#
#   bash tests/integration/test_http_ingest.sh quota_429 'pull_*'
#   HUB_TEST_ONLY=quota_429 ctest --test-dir build -R integ.test_http_ingest
#   bash tests/integration/test_http_ingest.sh --list     # the spec, one name a line
#
# Each failed assertion prints "FAIL [scenario] message"; a scenario that
# fails does not stop the next ones; the run ends with the list of failed
# scenarios and one line "N passed, M failed", and exits non-zero when any
# assertion failed (or none passed).
#
# Knobs (environment):
#   HUB_BUILD_DIR   build directory holding streaming-hub and hub-produce
#                   (default <repo>/build; ctest sets it)
#   HUB_TEST_ONLY   scenarios to run (names or shell patterns, separated by
#                   spaces or commas); the command line's names win
#   HUB_TEST_PREPARE_JOBS how many prepare_* run at once (default 4)
#   HUB_TEST_KEEP=1 keep $WORK (logs, database, Kafka data dir) after the test
#   HUB_LOG_LEVEL   hub log level (default info)
#   ADMIN_TOKEN     admin bearer token given to the hub (default test-admin-token)
#   HUB_TEST_TIMEOUT seconds after which the test ends itself (cleanly); ctest
#                   sets it a little below the test's TIMEOUT

HUB_TEST_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# ---------------------------------------------------------------------------
# Set-up, assertions, summary
# ---------------------------------------------------------------------------

# Creates $WORK, installs the cleanup trap and resets the assertion record.
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
    # Assertions are recorded one line each in a file, so that those made in
    # a subshell (a scenario, a command substitution) count too, and printed
    # on the test's own stdout even from inside $(...).
    HUB_TEST_RECORD=$WORK/assertions
    : >"$HUB_TEST_RECORD"
    exec {HUB_TEST_OUT}>&1
    HUB_TEST_PIDS=()
    HUB_START_N=0
    HUB_PID=
    HUB_WRAPPER_PID=
    KAFKA_PID=
    PG_DATA=
    HUB_MAIN_PID=$$
    trap hub_test_cleanup EXIT
    trap 'fatal "interrupted (a signal, or HUB_TEST_TIMEOUT=${HUB_TEST_TIMEOUT:-} s elapsed)"' INT TERM
    # fatal in a subshell of the set-up asks the main shell to end the test
    trap 'hub_test_summary; exit 1' USR1
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

# pass MSG: records a passed assertion ("ok [scenario] MSG" inside the
# scenario runner, "ok - MSG" outside it).
pass() {
    local tag=${HUB_SCENARIO:+[$HUB_SCENARIO]}
    printf 'P\t%s\n' "${HUB_SCENARIO:-}" >>"${HUB_TEST_RECORD:-/dev/null}"
    printf 'ok %s %s\n' "${tag:--}" "$1" >&"${HUB_TEST_OUT:-1}"
}

# fail MSG: records a failed assertion (the test goes on), printed as
# "FAIL [scenario] MSG" (or "FAIL - MSG").
fail() {
    local tag=${HUB_SCENARIO:+[$HUB_SCENARIO]}
    printf 'F\t%s\n' "${HUB_SCENARIO:-}" >>"${HUB_TEST_RECORD:-/dev/null}"
    printf 'FAIL %s %s\n' "${tag:--}" "$1" >&"${HUB_TEST_OUT:-1}"
}

# fatal MSG: records a failure and ends what cannot go on: the current
# scenario inside the runner (the next one still runs), else the whole test
# (set-up could not be done).  Works from a command substitution too.
fatal() {
    fail "$1"
    hub_logs_tail
    if [[ -n ${HUB_SCENARIO_PID:-} ]]; then
        # end the scenario's subshell, wherever below it this runs
        [[ $BASHPID == "$HUB_SCENARIO_PID" ]] || kill -TERM "$HUB_SCENARIO_PID" 2>/dev/null
        exit 1
    fi
    if [[ $BASHPID != "${HUB_MAIN_PID:-$$}" ]]; then
        kill -USR1 "${HUB_MAIN_PID:-$$}" 2>/dev/null
        exit 1
    fi
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

# assert_match VALUE REGEX MSG: VALUE matches the extended regular expression.
assert_match() {
    if [[ $1 =~ $2 ]]; then
        pass "$3"
    else
        fail "$3: '${1:0:300}' does not match $2"
    fi
}

# poll_pause N: the pause before poll N+1 of a wait: 50 ms for the first
# ten (most awaited things take well under a second: a scenario should not
# wait 200 ms for each), 200 ms after that.
poll_pause() {
    if (($1 < 10)); then
        sleep 0.05
    else
        sleep 0.2
    fi
}

# wait_until TIMEOUT_SECONDS "shell condition": polls the condition (eval'd)
# (poll_pause); returns 0 as soon as it holds, 1 when the time is up.
wait_until() {
    local timeout=$1 cond=$2 n=0
    local deadline=$((SECONDS + timeout))
    while true; do
        if eval "$cond"; then
            return 0
        fi
        if ((SECONDS >= deadline)); then
            return 1
        fi
        poll_pause $((n++))
    done
}

# hub_test_counts [SCENARIO]: "PASSED FAILED" from the record, of one
# scenario or of the whole test.
hub_test_counts() {
    awk -F'\t' -v s="${1-}" -v all="${1+0}" '
        all != "0" || $2 == s { if ($1 == "P") p++; else if ($1 == "F") f++ }
        END { print p + 0, f + 0 }' "${HUB_TEST_RECORD:-/dev/null}"
}

# hub_test_summary: the one line "N passed, M failed" (after the list of
# failed scenarios, when there are any); sets HUB_TEST_PASSED/FAILED.
hub_test_summary() {
    local counts failed
    counts=$(hub_test_counts)
    HUB_TEST_PASSED=${counts% *}
    HUB_TEST_FAILED=${counts#* }
    failed=$(awk -F'\t' '$1 == "F" && !seen[$2]++ { printf "%s%s", n++ ? " " : "", ($2 == "" ? "-" : $2) }' \
        "${HUB_TEST_RECORD:-/dev/null}")
    if [[ -n $failed && ${HUB_SCENARIOS_RUN:-0} == 1 ]]; then
        printf 'failed scenarios: %s\n' "$failed"
    fi
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
    hub_state_load
    if [[ -n ${HUB_PID:-} ]]; then
        hub_stop
    fi
    if [[ -n ${KAFKA_PID:-} ]]; then
        kafka_stop
    fi
    hub_check_sanitizer_logs
    hub_check_log_lines
    local counts
    counts=$(hub_test_counts)
    if ((${counts#* } > 0)); then
        hub_logs_tail
    fi
    hub_test_summary
    if ((HUB_TEST_FAILED > 0 || HUB_TEST_PASSED == 0)); then
        exit 1
    fi
    exit 0
}

# track_pid PID: kill PID at exit if it is still running (also when tracked
# from a subshell: the list is kept in a file as well).
track_pid() {
    HUB_TEST_PIDS+=("$1")
    [[ -n ${WORK:-} && -d $WORK ]] && echo "$1" >>"$WORK/tracked.pids"
}

# The EXIT trap: kill everything this test started, stop PostgreSQL, remove $WORK.
hub_test_cleanup() {
    local rc=$? pid
    trap - EXIT
    hub_state_load
    local pids=("${HUB_PID:-}" "${HUB_WRAPPER_PID:-}" "${KAFKA_PID:-}" "${HUB_TEST_PIDS[@]}")
    if [[ -n ${WORK:-} && -f $WORK/tracked.pids ]]; then
        mapfile -t -O "${#pids[@]}" pids <"$WORK/tracked.pids"
    fi
    for pid in "${pids[@]}"; do
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

# held_session_start NAME SQL...: a psql session kept open on a fifo: the
# statements run as they are written; output in $WORK/NAME.out.  Sets
# HELD_FD (write more with `echo ... >&$HELD_FD`).
held_session_start() {
    local name=$1
    shift
    rm -f "$WORK/$name.in"
    mkfifo "$WORK/$name.in"
    psql -XAtq -v ON_ERROR_STOP=1 "$STREAMING_HUB_POSTGRES_DSN" <"$WORK/$name.in" \
        >"$WORK/$name.out" 2>&1 &
    track_pid $!
    exec {HELD_FD}>"$WORK/$name.in"
    printf '%s\n' "$@" >&"$HELD_FD"
}

# table_exists NAME: the table exists in the hub database (quietly false when
# the database is not reachable).
table_exists() {
    [[ $(psql_q "SELECT to_regclass('public.$1') IS NOT NULL" 2>/dev/null) == t ]]
}

# wait_sql TIMEOUT EXPECTED "SQL": waits (polling, poll_pause) until the
# query prints exactly EXPECTED; 0 when it did, 1 on timeout.  The query
# may not be reachable meanwhile (a restart): that is "not yet".
wait_sql() {
    local deadline=$((SECONDS + $1)) n=0
    while true; do
        [[ $(psql_q "$3" 2>/dev/null) == "$2" ]] && return 0
        ((SECONDS >= deadline)) && return 1
        poll_pause $((n++))
    done
}

# wait_sql_ge TIMEOUT MINIMUM "SQL": the same until the query's number is >= MINIMUM.
wait_sql_ge() {
    local deadline=$((SECONDS + $1)) v n=0
    while true; do
        v=$(psql_q "$3" 2>/dev/null)
        [[ $v =~ ^[0-9]+$ ]] && ((v >= $2)) && return 0
        ((SECONDS >= deadline)) && return 1
        poll_pause $((n++))
    done
}

# inbox_count [WHERE]: rows of event_inbox (matching the SQL condition);
# -1 when the database cannot be reached.
inbox_count() {
    psql_q "SELECT count(*) FROM event_inbox${1:+ WHERE $1}" 2>/dev/null || echo -1
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
#
# Each start runs `streaming-hub serve` under a small wrapper shell that
# writes the hub's pid to $WORK/hub.N.pid and, once it ends, its exit status
# to $WORK/hub.N.rc.  So any shell of the test (a scenario's subshell, the
# main one) can stop the hub and still check how it exited; $WORK/hub.state
# tells every shell which hub is the current one (hub_state_load).
# ---------------------------------------------------------------------------

# hub_state_save: writes the current hub's variables to $WORK/hub.state.
hub_state_save() {
    [[ -n ${WORK:-} && -d $WORK ]] || return 0
    {
        printf 'HUB_PID=%q\nHUB_WRAPPER_PID=%q\nHUB_URL=%q\n' \
            "${HUB_PID:-}" "${HUB_WRAPPER_PID:-}" "${HUB_URL:-}"
        printf 'HUB_LOG=%q\nHUB_START_N=%q\nHUB_RUNNING_ENV=%q\n' \
            "${HUB_LOG:-}" "${HUB_START_N:-0}" "${HUB_RUNNING_ENV:-}"
    } >"$WORK/hub.state.tmp" && mv -f "$WORK/hub.state.tmp" "$WORK/hub.state"
}

# hub_state_load: takes over the hub a subshell started or stopped.
hub_state_load() {
    if [[ -n ${WORK:-} && -f $WORK/hub.state ]]; then
        # shellcheck source=/dev/null
        source "$WORK/hub.state"
        export HUB_PID HUB_URL HUB_LOG
    fi
}

# hub_exit_status N: the exit status of hub start N, empty while it runs.
hub_exit_status() {
    cat "$WORK/hub.$1.rc" 2>/dev/null
}

# hub_start [--no-ready] [NAME=VALUE|-NAME ...]: starts `streaming-hub serve`
# in the background with the exported environment, the test defaults and then
# the given assignments (which win; -NAME leaves NAME unset).  Logs go to $WORK/hub.N.log (N counts starts).
# Waits up to 30 s for the "http listening" log line and /readyz = 200 (only
# for the log line with --no-ready); exports HUB_URL, HUB_PID and HUB_LOG.
# Fails the test on timeout.
hub_start() {
    local addr="" deadline code wait_ready=1 n i
    if [[ ${1:-} == --no-ready ]]; then
        wait_ready=0
        shift
    fi
    HUB_START_N=$((HUB_START_N + 1))
    n=$HUB_START_N
    HUB_LOG=$WORK/hub.$n.log
    HUB_RUNNING_ENV=$(printf '%q ' "$@")
    # -NAME drops NAME: the assignments before it and the inherited one
    local a assign=() drop=()
    for a in "$@"; do
        if [[ $a == -* ]]; then
            drop+=(-u "${a#-}")
            for i in "${!assign[@]}"; do
                [[ ${assign[$i]%%=*} == "${a#-}" ]] && unset 'assign[i]'
            done
        else
            assign+=("$a")
        fi
    done
    mkdir -p "$WORK/hub" "$WORK/policies"
    (
        cd "$WORK" || exit 1
        env "${drop[@]}" \
            STREAMING_HUB_HTTP_LISTEN_ADDR=127.0.0.1:0 \
            STREAMING_HUB_DATA_DIR="$WORK/hub" \
            STREAMING_HUB_POLICY_DIR="$WORK/policies" \
            STREAMING_HUB_ADMIN_TOKEN="$ADMIN_TOKEN" \
            STREAMING_HUB_KAFKA_SESSION_TIMEOUT=3s \
            STREAMING_HUB_LOG_LEVEL="${HUB_LOG_LEVEL:-info}" \
            "${assign[@]}" "$HUB_BIN" serve >>"$HUB_LOG" 2>&1 &
        echo $! >"$WORK/hub.$n.pid"
        wait $!
        echo $? >"$WORK/hub.$n.rc"
    ) >/dev/null 2>&1 &
    HUB_WRAPPER_PID=$!
    HUB_PID=
    deadline=$((SECONDS + 10))
    while [[ -z $HUB_PID ]]; do
        HUB_PID=$(cat "$WORK/hub.$n.pid" 2>/dev/null)
        [[ -n $HUB_PID ]] && break
        ((SECONDS < deadline)) || fatal "the hub's wrapper wrote no pid within 10 s"
        sleep 0.01
    done
    export HUB_PID HUB_LOG
    hub_state_save

    deadline=$((SECONDS + 30))
    while ((SECONDS < deadline)); do
        addr=$(grep -F '"msg":"http listening"' "$HUB_LOG" 2>/dev/null |
            grep -oE '"addr":"127\.0\.0\.1:[0-9]+"' | head -n1 | grep -oE '[0-9]+"$' | tr -d '"')
        [[ -n $addr ]] && break
        code=$(hub_exit_status "$n")
        if [[ -n $code ]]; then
            HUB_PID=
            hub_state_save
            fatal "hub exited during start-up (status $code)"
        fi
        sleep 0.05
    done
    [[ -n $addr ]] || fatal "hub did not log \"http listening\" within 30 s"
    export HUB_URL=http://127.0.0.1:$addr
    hub_state_save
    if ((!wait_ready)); then
        log "hub #$n listening at $HUB_URL (pid $HUB_PID)"
        return 0
    fi

    while ((SECONDS < deadline)); do
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$HUB_URL/readyz")
        [[ $code == 200 ]] && break
        if [[ -n $(hub_exit_status "$n") ]]; then
            HUB_PID=
            hub_state_save
            fatal "hub exited before it was ready"
        fi
        sleep 0.1
    done
    [[ $code == 200 ]] || {
        echo "readyz: $(curl -s --max-time 2 "$HUB_URL/readyz")" >&2
        fatal "hub not ready within 30 s (last /readyz status $code)"
    }
    log "hub #$n ready at $HUB_URL (pid $HUB_PID)"
}

# hub_wait_exit SECONDS: waits until the current hub process has ended and
# its wrapper recorded the exit status; 1 if still running.
hub_wait_exit() {
    wait_until "$1" "[[ -n \$(hub_exit_status $HUB_START_N) ]] || ! kill -0 $HUB_PID 2>/dev/null"
}

# hub_stop: SIGTERM, wait up to 30 s; still alive or a non-zero exit status
# is a failure.
hub_stop() {
    local pid=$HUB_PID rc
    [[ -n $pid ]] || return 0
    kill -TERM "$pid" 2>/dev/null
    if ! hub_wait_exit 30; then
        fail "hub still running 30 s after SIGTERM"
        kill -9 "$pid" 2>/dev/null
    fi
    # the wrapper writes the status right after the hub ended
    wait_until 5 "[[ -n \$(hub_exit_status $HUB_START_N) ]]" >/dev/null
    rc=$(hub_exit_status "$HUB_START_N")
    HUB_PID=
    HUB_RUNNING_ENV=
    hub_state_save
    if [[ $rc != 0 ]]; then
        fail "hub exited with status ${rc:-unknown} after SIGTERM (see $(basename "$HUB_LOG"))"
    fi
    log "hub stopped"
}

# hub_kill9: SIGKILL the hub (a crash); returns once it is gone.
hub_kill9() {
    local pid=$HUB_PID
    [[ -n $pid ]] || return 0
    kill -9 "$pid" 2>/dev/null
    hub_wait_exit 10 >/dev/null
    HUB_PID=
    HUB_RUNNING_ENV=
    hub_state_save
    log "hub killed (SIGKILL)"
}

# hub_alive: the hub process started last is still running.
hub_alive() {
    [[ -n ${HUB_PID:-} && -z $(hub_exit_status "$HUB_START_N") ]] && kill -0 "$HUB_PID" 2>/dev/null
}

# hub_shared [NAME=VALUE ...]: the hub configuration the scenarios of this
# script share, then starts it.  Before each scenario the runner calls
# hub_ensure, which brings this hub back if a scenario stopped it or ran
# another configuration.
hub_shared() {
    HUB_SHARED=1
    HUB_SHARED_ENV=("$@")
    # shellcheck disable=SC2119 # the shared configuration alone
    hub_ensure
}

# hub_start_shared [--no-ready]: starts the hub again with the shared
# configuration (after a crash, hub_kill9).
hub_start_shared() {
    hub_start "$@" "${HUB_SHARED_ENV[@]}"
}

# shellcheck disable=SC2120 # called without arguments too
# hub_ensure [NAME=VALUE ...]: makes sure the running hub has the shared
# configuration plus the given assignments (restarting it only when it has
# another one or is not running).  A scenario that needs another
# configuration calls it first thing.
hub_ensure() {
    local want
    want=$(printf '%q ' "${HUB_SHARED_ENV[@]}" "$@")
    hub_state_load
    if hub_alive && [[ $HUB_RUNNING_ENV == "$want" ]]; then
        return 0
    fi
    if hub_alive; then
        hub_stop
    fi
    hub_start "${HUB_SHARED_ENV[@]}" "$@"
}

# ---------------------------------------------------------------------------
# HTTP helpers
# ---------------------------------------------------------------------------

# The last answer of hub_curl/admin_curl is kept in ${HUB_HTTP_LAST}_body,
# _status and _headers: each scenario has files of its own (prepares may run
# at once); outside the runner they are $WORK/last_http_*.

# last_body: the body of the last hub_curl/admin_curl call.
last_body() {
    cat "${HUB_HTTP_LAST:-$WORK/last_http}_body" 2>/dev/null
}

# http_status: the status code of the last admin_curl/hub_curl call.
http_status() {
    cat "${HUB_HTTP_LAST:-$WORK/last_http}_status" 2>/dev/null || echo 000
}

# round_robin_config FILE N METHOD PATH KEY ID_PREFIX URL...: writes a curl
# config of N requests of KEY spread over the URLs in turn, for
# `curl --rate R/s -K FILE`, which then prints one status code a line.  A POST
# carries a binary-mode event with an empty object and the id ID_PREFIX<i>.
round_robin_config() {
    local file=$1 n=$2 method=$3 path=$4 key=$5 prefix=$6 i
    shift 6
    local urls=("$@")
    for ((i = 0; i < n; i++)); do
        printf '%s\n' "url = \"${urls[i % ${#urls[@]}]}$path\"" "request = \"$method\"" \
            "header = \"Authorization: Bearer $key\""
        if [[ $method == POST ]]; then
            printf '%s\n' 'header = "Content-Type: application/json"' 'header = "ce-specversion: 1.0"' \
                "header = \"ce-id: $prefix$i\"" 'header = "ce-source: /round-robin"' \
                'header = "ce-type: studio.lerian.quota.tested"' \
                'header = "ce-time: 2026-01-01T00:00:00Z"' 'data-binary = "{}"'
        fi
        printf '%s\n' 'output = "/dev/null"' 'write-out = "%{http_code}\n"'
        ((i + 1 < n)) && echo next
    done >"$file"
    return 0
}

# hub_curl METHOD PATH [BODY] [curl args...]: request to the hub; prints the
# body; the status is kept for http_status, the response headers for
# last_header.
hub_curl() {
    local method=$1 path=$2 body=${3:-}
    shift 2
    (($# > 0)) && shift
    local last=${HUB_HTTP_LAST:-$WORK/last_http}
    local args=(-s -X "$method" --max-time 30 -o "${last}_body"
        -D "${last}_headers" -w '%{http_code}' "$@")
    if [[ -n $body ]]; then
        args+=(-H 'Content-Type: application/json' --data-binary "$body")
    fi
    : >"${last}_headers"
    curl "${args[@]}" "$HUB_URL$path" >"${last}_status" 2>/dev/null ||
        echo 000 >"${last}_status"
    cat "${last}_body" 2>/dev/null
}

# admin_curl METHOD PATH [JSON] [curl args...]: admin API call with the admin bearer token.
admin_curl() {
    local method=$1 path=$2 body=${3:-}
    shift 2
    (($# > 0)) && shift
    hub_curl "$method" "$path" "$body" -H "Authorization: Bearer $ADMIN_TOKEN" "$@"
}

# last_header NAME: the value of response header NAME (any case) of the last
# hub_curl call, CR stripped; nothing when absent.
last_header() {
    grep -i "^$1:" "${HUB_HTTP_LAST:-$WORK/last_http}_headers" 2>/dev/null | head -n1 |
        sed -E 's/^[^:]*:[[:space:]]*//' | tr -d '\r' || true
}

# json_str NAME [JSON]: the first string member NAME of compact JSON (default:
# the last response body), unescaped no further; nothing when absent or not
# a string.  For the API's compact answers, without jq.
json_str() {
    local json=${2-$(last_body)}
    grep -oE "\"$1\":\"([^\"\\\\]|\\\\.)*\"" <<<"$json" | head -n1 |
        sed -E "s/^\"$1\":\"(.*)\"$/\\1/" || true
}

# json_raw NAME [JSON]: the first member NAME's raw value (null, a number, a
# boolean or a quoted string), as written.
json_raw() {
    local json=${2-$(last_body)}
    grep -oE "\"$1\":(null|true|false|-?[0-9]+(\\.[0-9]+)?|\"([^\"\\\\]|\\\\.)*\")" <<<"$json" |
        head -n1 | sed -E "s/^\"$1\"://" || true
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

# own_id [SUFFIX]: a name that belongs to the running scenario (its name,
# then -SUFFIX): for tenants, paths, sources and ids that no other scenario
# of the script uses.
own_id() {
    printf '%s%s' "${HUB_SCENARIO:-test}" "${1:+-$1}"
}

# own_tenant [SUFFIX] [STATUS]: creates the tenant $(own_id SUFFIX) and
# prints its id.
own_tenant() {
    local id
    id=$(own_id "${1:-}")
    tenant_create "$id" "${2:-active}"
    printf '%s\n' "$id"
}

# tenant_key TENANT: prints a new API key (shk_…) of TENANT; nothing on failure.
tenant_key() {
    admin_curl POST "/admin/tenants/$1/api-keys" | sed -n 's/.*"key":"\(shk_[^"]*\)".*/\1/p'
}

# own_tenant_key [SUFFIX]: creates the tenant $(own_id SUFFIX) and prints
# an API key of it (fatal without one).
own_tenant_key() {
    local id key
    id=$(own_tenant "${1:-}")
    key=$(tenant_key "$id")
    [[ $key == shk_* ]] || fatal "no API key for tenant $id"
    printf '%s\n' "$key"
}

# own_client [SUFFIX]: creates the tenant $(own_id SUFFIX) with an API key;
# sets TENANT and KEY (fatal without a key), the client most scenarios are.
# shellcheck disable=SC2034 # for the scenario that calls it
own_client() {
    TENANT=$(own_id "${1:-}")
    KEY=$(own_tenant_key "${1:-}")
}

# metric 'NAME{labels}': the value of that series on /metrics (exact match of
# the series as rendered, labels in the hub's order), or 0 when absent.
metric() {
    curl -s --max-time 10 "$HUB_URL/metrics" |
        awk -v n="$1" '$1 == n { v = $2; found = 1 } END { print (found ? v : 0) }'
}

# metric_delta 'NAME{labels}' BEFORE: how much the series grew since it read
# BEFORE (counters are shared by every scenario: each compares with its own
# reading taken first).
metric_delta() {
    awk -v a="$(metric "$1")" -v b="$2" 'BEGIN { print a - b }'
}

# ---------------------------------------------------------------------------
# CloudEvents header lists
# ---------------------------------------------------------------------------

# now3339: the current time, RFC 3339 with microseconds, UTC.
now3339() {
    date -u +%Y-%m-%dT%H:%M:%S.%6NZ
}

# headers_edit EDIT...: edits the array H of NAME=VALUE headers in place:
#   NAME=VALUE   replaces header NAME (or adds it)
#   -NAME        removes header NAME
#   +NAME=VALUE  appends another NAME header (a repeat)
headers_edit() {
    local edit name i replaced
    for edit in "$@"; do
        case $edit in
        -*)
            name=${edit#-}
            for i in "${!H[@]}"; do
                [[ ${H[$i]%%=*} == "$name" ]] && unset 'H[i]'
            done
            H=("${H[@]}")
            ;;
        +*)
            H+=("${edit#+}")
            ;;
        *)
            name=${edit%%=*}
            replaced=0
            for i in "${!H[@]}"; do
                if [[ ${H[$i]%%=*} == "$name" ]]; then
                    H[i]=$edit
                    replaced=1
                fi
            done
            ((replaced)) || H+=("$edit")
            ;;
        esac
    done
}

# shellcheck source=tests/support/scenario.sh
source "$(dirname "${BASH_SOURCE[0]}")/scenario.sh"
