#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# The drain covers HTTP ingest (SPEC §13, issue 23 item 6): on SIGTERM
# /readyz answers 503 at once, the listener stays open and new requests are
# answered 503 with Retry-After (and Connection: close), the requests in
# flight finish (stored, or 503), and only then do the pools close; the
# process exits 0 within STREAMING_HUB_SHUTDOWN_TIMEOUT.
#
#   - one request held in flight (the inbox locked) when SIGTERM comes is
#     answered 202 once the lock goes, after new ones were refused;
#   - under load (24 clients posting as fast as they can, each request a
#     new event): every request sent gets an answer (202 or 503, never a
#     reset or an empty reply), every event answered 202 is in the inbox,
#     and the hub exits 0.
#
# No `set -e`: every check below is an explicit assertion.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/ingest_http.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/ingest_http.sh"

setup() {
    command -v jq >/dev/null || fatal "jq is required by this test"
    pg_start
    kafka_start --topic lerian.streaming.drain:1
    hub_shared STREAMING_HUB_SHUTDOWN_TIMEOUT=20s
}

readyz() {
    curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$HUB_URL/readyz"
}

# sigterm_at_ms: sends SIGTERM to the hub; prints when (epoch ms).
sigterm() {
    kill -TERM "$HUB_PID"
    date +%s%3N
}

# hub_exit_code SECONDS: waits for the hub started last to exit; prints
# its exit status ("" if it did not).
hub_exit_code() {
    hub_wait_exit "$1" >/dev/null
    wait_until 5 "[[ -n \$(hub_exit_status $HUB_START_N) ]]" >/dev/null
    hub_exit_status "$HUB_START_N"
}

scenario_request_in_flight_finishes_new_ones_are_refused() {
    local t0 code rc out
    own_client
    inbox_lock
    ev_post_bg "$WORK/df-held" "$KEY" held-1 '{"d":1}'
    wait_until 10 '[[ $(hub_ingest_inflight) == 1 ]]' || fail "the held request is not in flight"
    t0=$(sigterm)
    code=$(readyz)
    assert_eq 503 "$code" "/readyz answers 503 at once after SIGTERM ($(($(date +%s%3N) - t0)) ms)"
    ev_post "$KEY" new-1 >/dev/null
    assert_eq 503 "$(http_status)" "a new ingest request while draining: 503 (the listener is open)"
    assert_match "$(last_header retry-after)" '^[0-9]+$' "... with Retry-After"
    assert_eq close "$(last_header connection)" "... and Connection: close"
    hub_curl GET /v1/subscriptions "" -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq 503 "$(http_status)" "any other new API request: 503 too"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'new-1'")" \
        "the refused event is not stored"
    sleep 1
    [[ -z $(hub_exit_status "$HUB_START_N") ]] && pass "the hub waits for the request in flight" ||
        fail "the hub exited with a request in flight"
    inbox_unlock
    wait_until 10 "[[ -s $WORK/df-held ]]" || fail "the held request got no answer"
    out=$(cat "$WORK/df-held")
    assert_eq 202 "${out%% *}" "the request in flight when SIGTERM came is answered 202"
    assert_eq 1 "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'held-1'")" \
        "... and its event is stored"
    rc=$(hub_exit_code 20)
    assert_eq 0 "$rc" "the hub exits 0"
    grep -qF '"msg":"http drained"' "$HUB_LOG" && pass "log: http drained" || fail "no \"http drained\" in the log"
    hub_state_load
    HUB_PID=
    hub_state_save
}

# client N: posts events drain-N-1, drain-N-2, ... one after the other (a
# new connection each), until the hub answers anything but 202 or stops
# answering; one line per request: "id http_code curl_exit".
client() {
    local n=$1 i=0 code rc
    while :; do
        i=$((i + 1))
        code=$(curl -s -X POST --max-time 30 -o /dev/null -w '%{http_code}' \
            -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
            -H 'ce-specversion: 1.0' -H "ce-id: drain-$n-$i" -H 'ce-source: /drain' \
            -H 'ce-type: studio.lerian.account.created' -H "ce-time: $(now3339)" \
            -H "ce-tenantid: $TENANT" --data-binary '{"l":1}' "$HUB_URL/v1/events")
        rc=$?
        echo "drain-$n-$i $code $rc"
        [[ $code == 202 ]] || break
    done
}

scenario_sigterm_under_load_answers_every_request() {
    local pids=() n t0 code rc lines bad stored ok202
    own_client
    for n in $(seq 1 24); do
        client "$n" >"$WORK/dl-$n.out" &
        pids+=($!)
    done
    wait_until 30 '[[ $(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '"'$TENANT'"'") -ge 200 ]]' ||
        fail "the clients did not get going"
    t0=$(sigterm)
    code=$(readyz)
    assert_eq 503 "$code" "/readyz 503 at once under load ($(($(date +%s%3N) - t0)) ms)"
    for n in "${pids[@]}"; do
        wait "$n"
    done
    rc=$(hub_exit_code 25)
    assert_eq 0 "$rc" "the hub exits 0 after SIGTERM under load"
    lines=$(cat "$WORK"/dl-*.out)
    bad=$(awk '$2 != 202 && $2 != 503 && !($2 == "000" && $3 == 7)' <<<"$lines" | head -n 5)
    # 000 with curl's exit 7: the connect was refused, the listener being
    # closed once the drain was over (the event was never sent).  A reset or
    # an empty reply (exit 52, 56) to a request sent would be a loss.
    assert_eq "" "$bad" "every request sent was answered 202 or 503 (no reset, no empty reply)"
    log "refused connects after the exit: $(awk '$3 == 7' <<<"$lines" | wc -l)"
    ok202=$(awk '$2 == 202 { print $1 }' <<<"$lines" | sort)
    stored=$(psql_q "SELECT event_id FROM event_inbox WHERE tenant_id = '$TENANT'" | sort)
    assert_eq "$(wc -l <<<"$ok202")" "$(comm -12 <(echo "$ok202") <(echo "$stored") | wc -l)" \
        "every event answered 202 ($(wc -l <<<"$ok202")) is in the inbox"
    assert_ge "$(awk '$2 == 503' <<<"$lines" | wc -l)" 1 "clients were told 503 while draining"
    log "drain under load: $(wc -l <<<"$ok202") stored, $(awk '$2 == 503' <<<"$lines" | wc -l) refused"
    hub_state_load
    HUB_PID=
    hub_state_save
}

scenarios_main "$@"
