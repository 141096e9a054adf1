#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# Limits that hold across processes (SPEC §13; issue 23 item 9): three
# `serve` processes (roles all, all, delivery) on one database and one
# consumer group share the pull rate (STREAMING_HUB_PULL_RATE/BURST) and a
# tenant's ingest quota (quotas.ingest_rate/burst): each process counts the
# live ones (hub_processes, migration 0012) and charges its buckets at 1/N.
#
# Covers: membership (each process sees 3); with requests spread
# round-robin over the three for 10 s, a tenant gets within 10% of its
# configured rate plus one burst, for pulls and for HTTP ingest, while
# another tenant at a modest rate is never refused; a subscription's
# max_rate holds for the deployment (each delivering process takes 1/3);
# a process that stops
# cleanly leaves at once, one that is killed ages out within the member
# timeout, one that starts joins within a heartbeat; a process that starts
# while the others' rows cannot be written yet charges its share from its
# first request (it joins before it serves).
#
# Run one alone: bash tests/integration/test_cluster_limits.sh pull_rate_holds_across_processes
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"

TOPIC=lerian.streaming.cluster
RATE=20
BURST=10
SECONDS_RUN=10
EXTRA_ENV=()

setup() {
    command -v jq >/dev/null || fatal "jq is required by this test"
    pg_start
    kafka_start --topic "$TOPIC:3"
    sink_start
    CLUSTER_ENV=(STREAMING_HUB_PULL_RATE=$RATE STREAMING_HUB_PULL_BURST=$BURST
        STREAMING_HUB_ALLOW_PRIVATE_SINKS=true
        STREAMING_HUB_CLUSTER_HEARTBEAT=500ms STREAMING_HUB_CLUSTER_MEMBER_TIMEOUT=2s
        STREAMING_HUB_KEK="$(head -c 32 /dev/urandom | base64 -w0)")
    hub_shared "${CLUSTER_ENV[@]}"
    extra_start x2 all
    extra_start x3 delivery
    # the scenarios read every process's URL from here
    printf '%s\n' "$HUB_URL" "$(cat "$WORK/x2.url")" "$(cat "$WORK/x3.url")" >"$WORK/urls"
}

teardown() {
    extra_stop x2
    extra_stop x3
}

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

# extra_start NAME ROLE: another `serve` process of the same deployment, log
# $WORK/hub.NAME.log, URL in $WORK/NAME.url, pid in $WORK/NAME.pid; waits
# for /readyz.  EXTRA_ENV (an array, optional) adds or overrides variables.
extra_start() {
    local name=$1 role=$2 addr="" code deadline skip
    mkdir -p "$WORK/hub-$name" "$WORK/policies"
    # the log is appended across starts: only this start's lines count
    skip=$(($(cat "$WORK/hub.$name.log" 2>/dev/null | wc -l) + 1))
    rm -f "$WORK/$name.pid" "$WORK/$name.rc"
    # a wrapper, as lib.sh's hub_start: any shell can stop the process and
    # read its exit status from $WORK/NAME.rc
    (
        cd "$WORK" || exit 1
        env STREAMING_HUB_HTTP_LISTEN_ADDR=127.0.0.1:0 STREAMING_HUB_DATA_DIR="$WORK/hub-$name" \
            STREAMING_HUB_POLICY_DIR="$WORK/policies" STREAMING_HUB_ADMIN_TOKEN="$ADMIN_TOKEN" \
            STREAMING_HUB_KAFKA_SESSION_TIMEOUT=3s STREAMING_HUB_LOG_LEVEL="${HUB_LOG_LEVEL:-info}" \
            STREAMING_HUB_ROLE="$role" "${CLUSTER_ENV[@]}" "${EXTRA_ENV[@]}" "$HUB_BIN" serve >>"$WORK/hub.$name.log" 2>&1 &
        echo $! >"$WORK/$name.pid"
        wait $!
        echo $? >"$WORK/$name.rc"
    ) >/dev/null 2>&1 &
    track_pid $!
    wait_until 10 "[[ -s '$WORK/$name.pid' ]]" || fatal "process $name wrote no pid"
    track_pid "$(cat "$WORK/$name.pid")"
    deadline=$((SECONDS + 30))
    while [[ -z $addr ]] && ((SECONDS < deadline)); do
        addr=$(tail -n "+$skip" "$WORK/hub.$name.log" 2>/dev/null | grep -F '"msg":"http listening"' |
            grep -oE '"addr":"127\.0\.0\.1:[0-9]+"' | head -n1 | grep -oE '[0-9]+"$' | tr -d '"')
        sleep 0.05
    done
    [[ -n $addr ]] || fatal "process $name did not listen within 30 s"
    echo "http://127.0.0.1:$addr" >"$WORK/$name.url"
    while ((SECONDS < deadline)); do
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$addr/readyz")
        [[ $code == 200 ]] && break
        sleep 0.1
    done
    [[ $code == 200 ]] || fatal "process $name not ready within 30 s"
    log "process $name ($role) ready at http://127.0.0.1:$addr"
}

# extra_stop NAME: SIGTERM; a non-zero exit or a process still there after
# 30 s is a failure.
extra_stop() {
    local pid rc
    pid=$(cat "$WORK/$1.pid" 2>/dev/null) || return 0
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid"
    wait_until 30 "[[ -s '$WORK/$1.rc' ]]" || fail "process $1 still running 30 s after SIGTERM"
    rc=$(cat "$WORK/$1.rc" 2>/dev/null)
    [[ $rc == 0 ]] || fail "process $1 exited with status ${rc:-unknown} after SIGTERM"
}

# processes URL: the live processes that process counts (its gauge).
processes() {
    curl -s --max-time 5 "$1/metrics" |
        awk '$1 == "streaming_hub_cluster_processes" { print $2 }'
}

# all_see N: every process of $WORK/urls (that answers) counts N.
all_see() {
    local u
    while read -r u; do
        [[ $(processes "$u") == "$1" ]] || return 1
    done <"$WORK/urls"
}

# round_robin FILE RATE METHOD PATH KEY: a curl config (round_robin_config)
# of RATE x SECONDS_RUN requests spread over the processes in turn.
round_robin() {
    local urls
    mapfile -t urls <"$WORK/urls"
    round_robin_config "$1" $(($2 * SECONDS_RUN)) "$3" "$4" "$5" rr- "${urls[@]}"
}

# within ADMITTED MS WHAT: ADMITTED is within 10% of RATE x the run's
# duration (MS, measured: a loaded machine stretches the nominal
# SECONDS_RUN, and the buckets refill for as long as it lasts), plus one
# burst above.
within() {
    local want=$((RATE * $2 / 1000))
    log "$3: $1 admitted in $2 ms (${SECONDS_RUN} s nominal): want $want, +10%, + burst $BURST"
    assert_ge "$1" $((want * 9 / 10)) "$3: $1 admitted in $2 ms, at least 90% of ${want}"
    assert_le "$1" $((want * 11 / 10 + BURST)) "$3: … at most 110% of ${want} plus one burst ($BURST)"
}

# ---------------------------------------------------------------------------
# scenarios
# ---------------------------------------------------------------------------

scenario_every_process_counts_three() {
    wait_until 10 all_see\ 3 || fail "not every process counts 3: $(while read -r u; do processes "$u"; done <"$WORK/urls" | paste -sd ' ')"
    pass "each of the three processes (all, all, delivery) counts 3 live processes"
    assert_eq 3 "$(psql_q "SELECT count(*) FROM hub_processes WHERE seen_at > now() - interval '2 seconds'")" \
        "hub_processes has their three rows"
    assert_eq "all,all,delivery" "$(psql_q "SELECT string_agg(role, ',' ORDER BY role) FROM hub_processes")" \
        "… with their roles"
}

scenario_pull_rate_holds_across_processes() {
    local other_key ok limited other_bad t0 ms
    own_client
    other_key=$(own_tenant_key other)
    wait_until 10 all_see\ 3 || fail "not every process counts 3"
    round_robin "$WORK/pull.cfg" 60 GET "/v1/events?limit=1" "$KEY"
    round_robin "$WORK/other.cfg" 6 GET "/v1/events?limit=1" "$other_key"
    curl -s --rate 6/s -K "$WORK/other.cfg" >"$WORK/other.codes" 2>/dev/null &
    local other=$!
    t0=$(date +%s%3N)
    curl -s --rate 60/s -K "$WORK/pull.cfg" >"$WORK/pull.codes" 2>/dev/null
    ms=$(($(date +%s%3N) - t0))
    wait "$other"
    ok=$(grep -c '^200$' "$WORK/pull.codes")
    limited=$(grep -c '^429$' "$WORK/pull.codes")
    log "pulls round-robin over 3 processes at 60/s for ${SECONDS_RUN} s: $ok answered 200, $limited 429 (PULL_RATE $RATE, PULL_BURST $BURST)"
    assert_eq $((60 * SECONDS_RUN)) $((ok + limited)) "every pull answered 200 or 429"
    within "$ok" "$ms" "PULL_RATE=$RATE across 3 processes"
    other_bad=$(grep -vc '^200$' "$WORK/other.codes")
    assert_eq 0 "$other_bad" "another tenant pulling at 6/s meanwhile was never refused"
}

scenario_ingest_quota_holds_across_processes() {
    local ok limited stored other_tenant other_key other_bad t0 ms
    own_client
    other_key=$(own_tenant_key other)
    other_tenant=$(own_id other)
    for t in "$TENANT" "$other_tenant"; do
        admin_curl PATCH "/admin/tenants/$t" "{\"quotas\":{\"ingest_rate\":$RATE,\"ingest_burst\":$BURST}}" >/dev/null
        assert_eq 200 "$(http_status)" "$t's quota: $RATE events/s, burst $BURST"
    done
    wait_until 10 all_see\ 3 || fail "not every process counts 3"
    round_robin "$WORK/post.cfg" 60 POST /v1/events "$KEY"
    round_robin "$WORK/other-post.cfg" 6 POST /v1/events "$other_key"
    curl -s --rate 6/s -K "$WORK/other-post.cfg" >"$WORK/other-post.codes" 2>/dev/null &
    local other=$!
    t0=$(date +%s%3N)
    curl -s --rate 60/s -K "$WORK/post.cfg" >"$WORK/post.codes" 2>/dev/null
    ms=$(($(date +%s%3N) - t0))
    wait "$other"
    other_bad=$(grep -vc '^202$' "$WORK/other-post.codes")
    assert_eq 0 "$other_bad" "another tenant with the same quota sending 6/s meanwhile: every event 202"
    ok=$(grep -c '^202$' "$WORK/post.codes")
    limited=$(grep -c '^429$' "$WORK/post.codes")
    log "events round-robin over 3 processes at 60/s for ${SECONDS_RUN} s: $ok accepted, $limited 429 (ingest_rate $RATE, ingest_burst $BURST)"
    assert_eq $((60 * SECONDS_RUN)) $((ok + limited)) "every event answered 202 or 429"
    within "$ok" "$ms" "quotas.ingest_rate=$RATE across 3 processes"
    stored=$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT'")
    assert_eq "$ok" "$stored" "exactly the accepted events are stored"
}

# A subscription's max_rate is the deployment's (SPEC §7.9), but each of the
# three processes that deliver ran its bucket at the whole rate: the
# destination got up to three times it.  Each runs its share now (1/3 here,
# a third of the burst each).
scenario_max_rate_holds_across_processes() {
    local path first n
    own_client
    path=/ok/$(own_id)/
    wait_until 10 all_see\ 3 || fail "not every process counts 3"
    subscribe_at "$KEY" "$path" 'transaction.*' ',"max_rate":10' >/dev/null
    produce --topic "$TOPIC" --tenant "$TENANT" --count 200 --id-prefix mr- >/dev/null
    wait_until 20 "[[ -n \$(sink_event_ts '$path' mr- | head -n1) ]]" || fail "no event was delivered"
    first=$(sink_event_ts "$path" mr- | sort -n | head -n1)
    sleep 3.5
    n=$(sink_event_ts "$path" mr- | awk -v t=$((first + 3000)) '$1 < t { n++ } END { print n + 0 }')
    log "max_rate 10/s over three delivering processes: $n delivered in the first 3 s"
    # 10/s x 3 s plus one burst (10), and room for a heartbeat late under
    # load (a process that counts two others for a moment runs at 1/2);
    # each process at the whole rate sent 75-97
    assert_le "$n" 50 "at most 10/s x 3 s plus one burst (10), with a margin: $n"
    assert_ge "$n" 10 "and at least a third of that went out: $n"
}

scenario_processes_leave_and_join() {
    local pid
    wait_until 10 all_see\ 3 || fail "not every process counts 3"
    extra_stop x3
    head -n 2 "$WORK/urls" >"$WORK/urls.2"
    wait_until 3 "URLS=\$WORK/urls.2 all_see_in 2" || fail "after a clean stop the others do not count 2"
    pass "a process that stops cleanly is gone for the others within a heartbeat"
    extra_start x3 delivery
    printf '%s\n' "$(cat "$WORK/urls.2")" "$(cat "$WORK/x3.url")" >"$WORK/urls"
    wait_until 5 all_see\ 3 || fail "the restarted process did not join"
    pass "a process that starts joins within a heartbeat"
    pid=$(cat "$WORK/x3.pid")
    kill -9 "$pid"
    wait_until 6 "URLS=\$WORK/urls.2 all_see_in 2" || fail "a killed process still counts"
    pass "a killed process ages out within the member timeout (2 s)"
    extra_start x3 delivery
    printf '%s\n' "$(cat "$WORK/urls.2")" "$(cat "$WORK/x3.url")" >"$WORK/urls"
    wait_until 5 all_see\ 3 || fail "the process did not join again"
}

# A process that starts while the membership table is locked (heartbeats
# held up) must not count itself alone and admit the whole deployment's
# burst: it joins before it serves.  Its member timeout is long here, so
# that the others' rows, not refreshed while the lock lasts, still count.
scenario_a_process_that_starts_charges_its_share_at_once() {
    local other_key u seen ok lock
    own_client
    other_key=$(own_tenant_key other)
    wait_until 10 all_see\ 3 || fail "not every process counts 3"
    extra_stop x3
    head -n 2 "$WORK/urls" >"$WORK/urls.2"
    wait_until 3 "URLS=\$WORK/urls.2 all_see_in 2" || fail "after a clean stop the others do not count 2"
    # rows of processes killed by other scenarios, which the long member
    # timeout below would count
    psql_q "DELETE FROM hub_processes WHERE seen_at < now() - interval '2 seconds'" >/dev/null
    psql -XAtq "$STREAMING_HUB_POSTGRES_DSN" -c "BEGIN; LOCK TABLE hub_processes IN EXCLUSIVE MODE;
        SELECT pg_sleep(3); COMMIT" >/dev/null 2>&1 &
    lock=$!
    track_pid $lock
    wait_sql 5 1 "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
        WHERE c.relname = 'hub_processes' AND l.mode = 'ExclusiveLock' AND l.granted" ||
        fail "could not lock hub_processes"
    EXTRA_ENV=(STREAMING_HUB_CLUSTER_MEMBER_TIMEOUT=60s)
    extra_start x3 delivery
    EXTRA_ENV=()
    u=$(cat "$WORK/x3.url")
    seen=$(processes "$u")
    round_robin_config "$WORK/x3-burst.cfg" $((BURST + 5)) GET "/v1/events?limit=1" "$KEY" b- "$u"
    ok=$(curl -s -K "$WORK/x3-burst.cfg" 2>/dev/null | grep -c '^200$')
    log "the new process counted $seen at its first request and admitted $ok of $((BURST + 5)) pulls at once (PULL_BURST $BURST over 3)"
    assert_eq 3 "$seen" "the new process counts 3 from its first request"
    # its share: a third of the burst, plus what refills while the pulls run
    assert_le "$ok" $((BURST / 3 + 2)) "… and admits its share of the burst, not the whole"
    HUB_URL=$u hub_curl GET "/v1/events?limit=1" "" -H "Authorization: Bearer $other_key" >/dev/null
    assert_eq 200 "$(http_status)" "another tenant's pull on the new process meanwhile is answered"
    wait "$lock"
    # as the other scenarios expect it: the member timeout of the others
    extra_stop x3
    extra_start x3 delivery
    printf '%s\n' "$(cat "$WORK/urls.2")" "$(cat "$WORK/x3.url")" >"$WORK/urls"
    wait_until 5 all_see\ 3 || fail "the three processes do not count 3 again"
}

# all_see_in N: as all_see, over the URLs of the file $URLS.
all_see_in() {
    local u
    while read -r u; do
        [[ $(processes "$u") == "$1" ]] || return 1
    done <"$URLS"
}

scenarios_main "$@"
