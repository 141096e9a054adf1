# shellcheck shell=bash
#
# tests/support/sink.sh — the recording HTTP sink for delivery tests.
#
# Source it after lib.sh (it uses $WORK, $BUILD, track_pid, log, fail, fatal
# and wait_until).  hub-sink (tests/support/sink.c, documented in sink.md)
# answers by path — /ok, /status/C, /retry-after/C/S, /gone, /slow/MS, /hang,
# /echo, /flaky/N, /fail-until/UNIX_MS, /redirect, /big, /garbage, /reset, ...
# with anything after the prefix ignored — and records every request as one
# JSON line in $SINK_LOG, keys in a fixed order, so plain awk/grep read it
# (neither jq nor python3 is assumed).
#
#   source "$(dirname "$0")/../support/lib.sh"
#   source "$(dirname "$0")/../support/sink.sh"
#   hub_test_init
#   sink_start
#   ... destination "$SINK_URL/ok/acme" ...
#   wait_until 30 '(( $(sink_count /ok/acme) >= 1 ))' || fail "no delivery to /ok/acme"
#   assert_eq transaction.posted "$(sink_header /ok/acme x-lerian-event-type | head -n1)" "type"
#   sink_stop
#
# Knobs: HUB_SINK  the sink binary (default $BUILD/hub-sink)

# sink_start [PORT]: starts hub-sink on 127.0.0.1:PORT (default 0: a free
# port; pass "${SINK_URL##*:}" to come back on the same port after sink_stop),
# recording to $WORK/sink.jsonl (appended across restarts), its own log in
# $WORK/sink.log.  Waits up to 10 s for the port file; exports SINK_URL
# (http://127.0.0.1:PORT), SINK_LOG and SINK_PID.
sink_start() {
    local port=${1:-0} port_file=$WORK/sink.port addr="" deadline
    local bin=${HUB_SINK:-$BUILD/hub-sink}
    [[ -x $bin ]] || fatal "sink binary not found: $bin (build the hub-sink target)"
    SINK_LOG=$WORK/sink.jsonl
    rm -f "$port_file"
    "$bin" --listen "127.0.0.1:$port" --record "$SINK_LOG" --port-file "$port_file" \
        >>"$WORK/sink.log" 2>&1 &
    SINK_PID=$!
    track_pid "$SINK_PID"
    deadline=$((SECONDS + 10))
    while ((SECONDS < deadline)); do
        if [[ -s $port_file ]]; then
            addr=$(head -n1 "$port_file" | tr -d '[:space:]')
            [[ -n $addr ]] && break
        fi
        if ! kill -0 "$SINK_PID" 2>/dev/null; then
            SINK_PID=
            tail -n 20 "$WORK/sink.log" >&2
            fatal "hub-sink exited during start-up"
        fi
        sleep 0.05
    done
    [[ -n $addr ]] || fatal "hub-sink wrote no port file within 10 s"
    export SINK_URL=http://$addr SINK_LOG SINK_PID
    log "hub-sink up at $SINK_URL (pid $SINK_PID)"
}

# sink_stop: SIGTERM, wait up to 10 s; still alive, a non-zero exit status or
# a sanitizer report in $WORK/sink.log is a failure.  The record file stays.
sink_stop() {
    local pid=${SINK_PID:-} rc
    local san='ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:'
    [[ -n $pid ]] || return 0
    kill -TERM "$pid" 2>/dev/null
    if ! wait_until 10 "! kill -0 $pid 2>/dev/null"; then
        fail "hub-sink still running 10 s after SIGTERM"
        kill -9 "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
    rc=$?
    SINK_PID=
    if ((rc != 0)); then
        fail "hub-sink exited with status $rc after SIGTERM (see sink.log)"
    fi
    if grep -qE "$san" "$WORK/sink.log" 2>/dev/null; then
        fail "sanitizer report in sink.log"
        grep -m1 -A30 -E "$san" "$WORK/sink.log" >&2
    fi
    log "hub-sink stopped"
}

# The awk below reads a record line by position: "path" is the first
# ',"path":"' (only ts_ms and method come before it), the body is anchored at
# the end of the line, and the headers object lies between the two.  Inside
# JSON strings every '"' is escaped, so none of these markers can be faked by
# a header value or a path.
# shellcheck disable=SC2016 # awk source, nothing to expand
_SINK_AWK_LIB='
function sink_path_ok(line,   i) {
    i = index(line, ",\"path\":\"")
    return i > 0 && index(substr(line, i + 9), prefix) == 1
}
function sink_body_at(line) {
    return match(line, "\"body_b64\":\"[A-Za-z0-9+/=]*\",\"body_len\":[0-9]+,\"http_version\":\"[0-9.]+\"[}]$")
}
function sink_b64(line,   m) {
    if (!sink_body_at(line)) return ""
    m = substr(line, RSTART + 12)
    return substr(m, 1, index(m, "\"") - 1)
}
# Value of header `name` (lower case) in line, JSON-unescaped; found = 0 when absent.
function sink_hval(line, name,   hs, region, k, i, c, out, n) {
    found = 0
    hs = index(line, ",\"headers\":{")
    if (!hs || !sink_body_at(line)) return ""
    region = substr(line, hs + 11, RSTART - (hs + 11))
    k = index(region, "{\"" name "\":\"")
    if (!k) k = index(region, ",\"" name "\":\"")
    if (!k) return ""
    found = 1
    out = ""
    n = length(region)
    for (i = k + length(name) + 5; i <= n; i++) {
        c = substr(region, i, 1)
        if (c == "\"") break
        if (c == "\\") {
            i++
            c = substr(region, i, 1)
            if (c == "n") c = "\n"
            else if (c == "t") c = "\t"
            else if (c == "r") c = "\r"
            else if (c == "b") c = "\b"
            else if (c == "f") c = "\f"
            else if (c == "u") { c = "\\u" substr(region, i + 1, 4); i += 4 }
        }
        out = out c
    }
    return out
}
'

# sink_count [PATH_PREFIX]: number of recorded requests whose path (query
# excluded) starts with PATH_PREFIX (all of them without one).  /_count is
# never recorded.
sink_count() {
    if [[ ! -f ${SINK_LOG:-} ]]; then
        echo 0
        return 0
    fi
    SINK_PREFIX=${1:-} awk "$_SINK_AWK_LIB"'
        BEGIN { prefix = ENVIRON["SINK_PREFIX"] }
        sink_path_ok($0) { n++ }
        END { print n + 0 }' "$SINK_LOG"
}

# sink_wait N PATH_PREFIX [TIMEOUT_SECONDS]: waits (default 30 s) until at
# least N requests under PATH_PREFIX were recorded; 0 when they were, 1 on timeout.
sink_wait() {
    wait_until "${3:-30}" "(( \$(sink_count '$2') >= $1 ))"
}

# sink_bodies PATH_PREFIX: the decoded bodies of the matching requests, in
# arrival order, each followed by a newline (an empty body gives an empty
# line; a body holding newlines spans several lines).
sink_bodies() {
    local b64
    [[ -f ${SINK_LOG:-} ]] || return 0
    SINK_PREFIX=${1:-} awk "$_SINK_AWK_LIB"'
        BEGIN { prefix = ENVIRON["SINK_PREFIX"] }
        sink_path_ok($0) { print sink_b64($0) }' "$SINK_LOG" |
        while IFS= read -r b64; do
            printf '%s' "$b64" | base64 -d
            printf '\n'
        done
}

# sink_header PATH_PREFIX NAME: the value of header NAME (any case) of each
# matching request that has it, one per line, in arrival order.  Repeated
# headers come joined with ", " as recorded.
sink_header() {
    [[ -f ${SINK_LOG:-} ]] || return 0
    SINK_PREFIX=${1:-} SINK_HEADER=$2 awk "$_SINK_AWK_LIB"'
        BEGIN { prefix = ENVIRON["SINK_PREFIX"]; name = tolower(ENVIRON["SINK_HEADER"]) }
        sink_path_ok($0) { v = sink_hval($0, name); if (found) print v }' "$SINK_LOG"
}

# sink_ts PATH_PREFIX: ts_ms (Unix milliseconds at receipt) of each matching
# request, one per line — for spacing checks (Retry-After, backoff).
sink_ts() {
    [[ -f ${SINK_LOG:-} ]] || return 0
    SINK_PREFIX=${1:-} awk "$_SINK_AWK_LIB"'
        BEGIN { prefix = ENVIRON["SINK_PREFIX"] }
        sink_path_ok($0) { s = substr($0, 10); print substr(s, 1, index(s, ",") - 1) }' "$SINK_LOG"
}

# sink_event_ts PATH_PREFIX IDS: ts_ms of each matching request that carries
# an event whose id starts with IDS (the verification probe aside).
sink_event_ts() {
    paste -d, <(sink_header "$1" x-lerian-event-id) <(sink_ts "$1") |
        awk -F, -v ids="$2" 'index($1, ids) == 1 { print $2 }'
}
