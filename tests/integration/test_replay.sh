#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# Replay (SPEC §9): POST /v1/subscriptions/{id}/replay {"since","until","event_types"}
# makes new delivery jobs for stored events — also for events stored before the
# subscription existed — and re-arms finished ones; it honours the window and
# the event type filter, refuses bad input with 400 naming the field, is a 404
# for another tenant's subscription, is rate-limited per subscription (429 +
# Retry-After) and audited, and honours Idempotency-Key.
#
# Each scenario is a tenant of its own: six transaction and four balance
# events stored before its subscription exists (the window T0..T1), then
# one live event (stored and delivered in prepare_*, so that the waits of
# the scenarios overlap).
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"

TOPIC=lerian.streaming.replay

setup() {
    pg_start
    kafka_start --topic "$TOPIC":2
    sink_start
    hub_shared STREAMING_HUB_KEK="$(head -c 32 /dev/urandom | base64)" STREAMING_HUB_ALLOW_PRIVATE_SINKS=true
}

replay() { # replay KEY ID JSON [curl args] → body; status in $(http_status)
    hub_curl POST "/v1/subscriptions/$2/replay" "$3" -H "Authorization: Bearer $1" "${@:4}"
}
rfc3339() { date -u -d "@$1" +%Y-%m-%dT%H:%M:%S.%3NZ; }
# deliveries of produced events to PATH (the verification probe is not one)
delivered() { sink_header "$PATH_" x-lerian-event-id | grep -cE '^(early|late|bal)-'; }
# window: the replay window T0..T1 as JSON members
window() { printf '"since":"%s","until":"%s"' "$(rfc3339 "$T0")" "$(rfc3339 "$T1")"; }

# stored_window: the scenario's tenant with 6 transaction and 4 balance
# events stored before any subscription exists (nothing is delivered), a
# subscription to both types, and one live event after it, delivered.
# Sets and keeps TENANT KEY SUB PATH_ T0 T1.
stored_window() {
    own_client
    PATH_=/ok/$(own_id)/
    T0=$(date +%s.%N)
    produce --topic "$TOPIC" --tenant "$TENANT" --count 6 --id-prefix early- \
        --type studio.lerian.transaction.posted >/dev/null
    produce --topic "$TOPIC" --tenant "$TENANT" --count 4 --id-prefix bal- \
        --type studio.lerian.balance.updated >/dev/null
    wait_sql 30 10 "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT'" ||
        fatal "the early events were not stored"
    T1=$(date +%s.%N)
    sleep 1.1

    SUB=$(subscribe_at "$KEY" "$PATH_" 'transaction.*')
    psql_q "UPDATE subscriptions SET event_types = '{transaction.*,balance.*}' WHERE id = '$SUB'" >/dev/null
    produce --topic "$TOPIC" --tenant "$TENANT" --count 1 --id-prefix late- \
        --type studio.lerian.transaction.posted >/dev/null
    wait_until 30 '(( $(delivered) >= 1 ))' || fail "the live event was not delivered"
    keep TENANT KEY SUB PATH_ T0 T1
}

# first_replay: the early window, transaction events only (6 new jobs);
# waits until they are delivered.
first_replay() {
    replay "$KEY" "$SUB" "{$(window),\"event_types\":[\"transaction.posted\"]}" >/dev/null
    assert_eq 202 "$(http_status)" "replay of the early transaction events → 202"
    wait_until 30 '(( $(delivered) >= 7 ))' || fail "the replayed events were not delivered"
}

scenario_bad_replays_are_400_naming_the_field() {
    local other_key sub t0 t1
    own_client
    other_key=$(own_tenant_key other)
    sub=$(subscribe_at "$KEY" "/ok/$(own_id)/" 'transaction.*')
    t1=$(date +%s.%N)
    t0=$(awk -v t="$t1" 'BEGIN { printf "%.3f", t - 10 }')
    replay "$KEY" "$sub" '{}' >/dev/null
    assert_eq 400 "$(http_status)" "no since → 400"
    assert_contains "$(last_body)" '"field":"since"' "the 400 names since"
    replay "$KEY" "$sub" '{"since":"yesterday"}' >/dev/null
    assert_eq 400 "$(http_status)" "a malformed since → 400"
    replay "$KEY" "$sub" '{"since":"0000-01-01T00:00:00Z"}' >/dev/null
    assert_eq 400 "$(http_status)" "since in year 0000 (RFC 3339 has it, PostgreSQL does not) → 400"
    assert_contains "$(last_body)" '"field":"since"' "the 400 names since"
    replay "$KEY" "$sub" "{\"since\":\"$(rfc3339 "$t1")\",\"until\":\"$(rfc3339 "$t0")\"}" >/dev/null
    assert_eq 400 "$(http_status)" "until before since → 400"
    assert_contains "$(last_body)" '"field":"until"' "the 400 names until"
    replay "$KEY" "$sub" "{\"since\":\"$(rfc3339 "$t0")\",\"event_types\":[\"a.b.*\"]}" >/dev/null
    assert_eq 400 "$(http_status)" "a malformed event type → 400"
    replay "$KEY" "$sub" "{\"since\":\"$(rfc3339 "$t0")\",\"extra\":1}" >/dev/null
    assert_eq 400 "$(http_status)" "an unknown member → 400"
    replay "$other_key" "$sub" "{\"since\":\"$(rfc3339 "$t0")\"}" >/dev/null
    assert_eq 404 "$(http_status)" "another tenant's subscription → 404"
}

# the early window, transaction events only: 6 new jobs, delivered
prepare_a_replay_delivers_the_stored_events_of_its_window() {
    stored_window
}

scenario_a_replay_delivers_the_stored_events_of_its_window() {
    local body
    sleep 1
    assert_eq 1 "$(delivered)" "before the replay only the live event arrived"
    body=$(replay "$KEY" "$SUB" "{$(window),\"event_types\":[\"transaction.posted\"]}")
    assert_eq 202 "$(http_status)" "replay → 202"
    assert_contains "$body" '"events":6' "six stored events in the window match"
    assert_contains "$body" '"created":6' "six new jobs"
    assert_contains "$body" '"truncated":false' "not truncated"
    wait_until 30 '(( $(delivered) >= 7 ))' || fail "the replayed events were not delivered"
    sleep 1
    assert_eq 7 "$(delivered)" "exactly the six replayed events arrived (and the live one)"
    assert_eq 6 "$(sink_header "$PATH_" x-lerian-event-id | grep -c '^early-')" "the replayed ones are the early transaction events"
}

# A fifo subscription replayed over a window where one event has no job (it
# arrived while the subscription was disabled): the replay re-arms the two
# old jobs and makes the missing one with a higher id.  The head went by job
# id, so the window came out of order (fa, fc, fb); it goes by arrival
# sequence now (SPEC 3.3).
prepare_a_replay_keeps_a_fifo_subscription_in_arrival_order() {
    own_client
    PATH_=/ok/$(own_id)/
    SUB=$(subscribe_at "$KEY" "$PATH_" 'transaction.*' ',"ordering":"fifo"')
    T0=$(date +%s.%N)
    fifo_event fa
    wait_until 30 "sink_header '$PATH_' x-lerian-event-id | grep -q '^fa-'" || fatal "fa was not delivered"
    hub_curl PATCH "/v1/subscriptions/$SUB" '{"enabled":false}' -H "Authorization: Bearer $KEY" >/dev/null
    fifo_event fb
    wait_sql 30 1 "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id LIKE 'fb-%'" ||
        fatal "fb was not stored"
    hub_curl PATCH "/v1/subscriptions/$SUB" '{"enabled":true}' -H "Authorization: Bearer $KEY" >/dev/null
    fifo_event fc
    wait_until 30 "sink_header '$PATH_' x-lerian-event-id | grep -q '^fc-'" || fatal "fc was not delivered"
    T1=$(date +%s.%N)
    keep TENANT KEY SUB PATH_ T0 T1
}

fifo_event() { # fifo_event PREFIX: one transaction event PREFIX-0 of $TENANT
    produce --topic "$TOPIC" --tenant "$TENANT" --count 1 --id-prefix "$1-" \
        --type studio.lerian.transaction.posted >/dev/null
}

scenario_a_replay_keeps_a_fifo_subscription_in_arrival_order() {
    local body
    assert_eq "fa-0 fc-0" "$(sink_header "$PATH_" x-lerian-event-id | grep '^f' | paste -sd' ')" \
        "fb arrived while the subscription was disabled: no job"
    body=$(replay "$KEY" "$SUB" "{$(window)}")
    assert_eq 202 "$(http_status)" "replay → 202"
    assert_contains "$body" '"created":1' "one new job (fb)"
    assert_contains "$body" '"rearmed":2' "two re-armed (fa, fc)"
    wait_until 30 "(( \$(sink_header '$PATH_' x-lerian-event-id | grep -c '^f') >= 5 ))" ||
        fail "the replayed events were not delivered"
    assert_eq "fa-0 fb-0 fc-0" "$(sink_header "$PATH_" x-lerian-event-id | grep '^f' | tail -n 3 | paste -sd' ')" \
        "the replay went out in arrival order"
}

# rate limit, then the same window again with every type: the 6 delivered
# jobs are re-armed and the 4 balance events get new jobs; audited
prepare_a_replay_is_rate_limited_and_rearms_finished_jobs() {
    stored_window
}

scenario_a_replay_is_rate_limited_and_rearms_finished_jobs() {
    local ra body
    first_replay
    replay "$KEY" "$SUB" "{\"since\":\"$(rfc3339 "$T0")\"}" >/dev/null
    assert_eq 429 "$(http_status)" "a second replay at once → 429"
    curl -s -D "$WORK/replay_headers" -o /dev/null -X POST -H "Authorization: Bearer $KEY" \
        -H 'Content-Type: application/json' -d "{\"since\":\"$(rfc3339 "$T0")\"}" \
        "$HUB_URL/v1/subscriptions/$SUB/replay"
    ra=$(grep -i '^retry-after:' "$WORK/replay_headers" | tr -dc 0-9)
    [[ -n $ra && $ra -ge 1 && $ra -le 5 ]] && pass "429 carries Retry-After ($ra s)" ||
        fail "429 without a sensible Retry-After: '$ra'"
    sleep 5.5
    body=$(replay "$KEY" "$SUB" "{$(window)}")
    assert_eq 202 "$(http_status)" "replay after the interval → 202"
    assert_contains "$body" '"events":10' "ten stored events in the window"
    assert_contains "$body" '"created":4' "four new jobs (the balance events)"
    assert_contains "$body" '"rearmed":6' "six finished jobs re-armed"
    wait_until 30 '(( $(delivered) >= 17 ))' || fail "the second replay was not delivered"
    sleep 1
    assert_eq 17 "$(delivered)" "1 live + 6 + 10 replayed deliveries"

    assert_eq 2 "$(psql_q "SELECT count(*) FROM audit_log WHERE action = 'subscription.replay' AND object_id = '$SUB'")" \
        "each accepted replay is in the audit log"
    assert_eq 10 "$(psql_q "SELECT (detail->>'events')::int FROM audit_log WHERE action = 'subscription.replay' AND object_id = '$SUB' ORDER BY id DESC LIMIT 1")" \
        "the audit entry counts the events"
}

# the rate limit holds for replays sent at once: the audit row that is the
# limit became visible only at commit, so ten concurrent replays all passed
# it (ten 202s, ten audit rows, ten scans); they now wait for each other
prepare_concurrent_replays_pass_the_limit_once() {
    stored_window
}

scenario_concurrent_replays_pass_the_limit_once() {
    local i ok limited
    for i in $(seq 1 10); do
        curl -s -o /dev/null -w '%{http_code}\n' -X POST -H "Authorization: Bearer $KEY" \
            -H 'Content-Type: application/json' -d "{$(window)}" \
            "$HUB_URL/v1/subscriptions/$SUB/replay" >"$WORK/concurrent.$i" &
    done
    wait
    ok=$(cat "$WORK"/concurrent.* | grep -c '^202$')
    limited=$(cat "$WORK"/concurrent.* | grep -c '^429$')
    log "ten replays at once: $ok answered 202, $limited 429"
    assert_eq "1 9" "$ok $limited" "one replay runs, nine are rate-limited"
    assert_eq 1 "$(psql_q "SELECT count(*) FROM audit_log WHERE action = 'subscription.replay' AND object_id = '$SUB'")" \
        "one audit row"
    wait_until 30 '(( $(delivered) >= 11 ))' || fail "the replayed events were not delivered"
    sleep 1
    assert_eq 11 "$(delivered)" "the live event and the ten replayed ones, once each"
}

# a replay narrows what the subscription receives, never widens it: back to
# transaction.* only, a replay asking for every type takes the six
# transaction events of the window and not the four balance ones
prepare_a_replay_never_widens_the_subscription() {
    stored_window
}

scenario_a_replay_never_widens_the_subscription() {
    local body
    first_replay
    psql_q "UPDATE subscriptions SET event_types = '{transaction.*}' WHERE id = '$SUB'" >/dev/null
    sleep 5.5
    body=$(replay "$KEY" "$SUB" "{$(window),\"event_types\":[\"*\"]}")
    assert_eq 202 "$(http_status)" "replay asking for every type → 202"
    assert_contains "$body" '"events":6' "only the six events the subscription itself matches"
    assert_contains "$body" '"created":0' "no job for a type the subscription does not take"
}

# Idempotency-Key (SPEC §9): a retry of a replay under the same key gets
# the first answer byte for byte (not a 429, not a second replay); the key
# reused for another window is 409; a malformed key is 400 naming the header
prepare_a_replay_under_an_idempotency_key_runs_once() {
    stored_window
}

scenario_a_replay_under_an_idempotency_key_runs_once() {
    local first again bad
    first=$(replay "$KEY" "$SUB" "{$(window)}" -H 'Idempotency-Key: replay-1')
    assert_eq 202 "$(http_status)" "replay with a key → 202"
    assert_contains "$first" '"created":10' "ten jobs made"
    again=$(replay "$KEY" "$SUB" "{$(window)}" -H 'Idempotency-Key: replay-1')
    assert_eq "202 true" "$(http_status) $(last_header idempotent-replayed)" \
        "the same request again → the stored answer, within the rate limit's interval"
    assert_eq "$first" "$again" "byte for byte"
    replay "$KEY" "$SUB" "{\"since\":\"$(rfc3339 "$T0")\"}" -H 'Idempotency-Key: replay-1' >/dev/null
    assert_eq 409 "$(http_status)" "the key with another window → 409"
    bad=$(replay "$KEY" "$SUB" "{$(window)}" -H 'Idempotency-Key: a b')
    assert_eq 400 "$(http_status)" "a malformed key → 400"
    assert_contains "$bad" '"field":"Idempotency-Key"' "the header is named"
    assert_eq 1 "$(psql_q "SELECT count(*) FROM audit_log WHERE action = 'subscription.replay' AND object_id = '$SUB'")" \
        "replayed once"
    wait_until 30 '(( $(delivered) >= 11 ))' || fail "the replayed events were not delivered"
    sleep 1
    assert_eq 11 "$(delivered)" "each replayed event delivered once (and the live one)"
}

# other_list_within MS WHAT: another tenant's ($OTHER) list is answered 200
# within MS ms while WHAT.
other_list_within() {
    local start ms
    start=$(date +%s%N)
    hub_curl GET /v1/subscriptions "" -H "Authorization: Bearer $OTHER" >/dev/null
    ms=$((($(date +%s%N) - start) / 1000000))
    log "another tenant's list while $2: $(http_status) in $ms ms"
    assert_eq 200 "$(http_status)" "another tenant's request is answered"
    ((ms < $1)) || fail "another tenant's request waited $ms ms while $2 (limit $1)"
}

# One tenant's requests that wait in the database (here replays of one
# subscription, whose lock an operator's session holds) took every
# connection of the API pool: another tenant's request waited until they
# ended, seconds.  A tenant's API transactions now run one at a time per
# process, the rest waiting in its own queue (32, then 429)
prepare_one_tenants_waiting_requests_do_not_hold_the_api() {
    own_client
    SUB=$(subscribe_at "$KEY" "/ok/$(own_id)/" 'transaction.*')
    OTHER=$(own_tenant_key other)
    OTHERS=""
    for i in 1 2 3 4 5 6 7 8; do
        OTHERS+=" $(own_tenant_key "other$i")"
    done
    keep KEY SUB OTHER OTHERS
}

scenario_one_tenants_waiting_requests_do_not_hold_the_api() {
    local holder i ok key refused0
    psql_q "SELECT pg_advisory_lock(hashtextextended('subscription_replay:' || '$SUB', 0)), pg_sleep(6)" \
        >/dev/null &
    holder=$!
    sleep 0.5
    refused0=$(metric streaming_hub_api_tenant_refused_total)
    for i in $(seq 1 40); do
        curl -s -o "$WORK/held_body.$i" -w '%{http_code}\n' -X POST -H "Authorization: Bearer $KEY" \
            -H 'Content-Type: application/json' -d '{"since":"2000-01-01T00:00:00Z"}' \
            "$HUB_URL/v1/subscriptions/$SUB/replay" >"$WORK/held.$i" &
    done
    sleep 1
    other_list_within 1000 "40 replays wait"
    # eight other tenants, two requests each at once: none is pipelined
    # behind the connection the replay holds
    i=0
    for key in $OTHERS $OTHERS; do
        i=$((i + 1))
        curl -s -o /dev/null -w '%{http_code} %{time_total}\n' -H "Authorization: Bearer $key" \
            "$HUB_URL/v1/subscriptions" >"$WORK/other.$i" &
    done
    wait_until 8 "[[ \$(cat $WORK/other.* 2>/dev/null | wc -l) == 16 ]]" ||
        fail "the other tenants' sixteen requests were not all answered within 8 s"
    log "eight other tenants' sixteen at once: slowest $(sort -k2 -n "$WORK"/other.* | tail -n1)"
    assert_eq 16 "$(grep -c '^200 0\.' "$WORK"/other.* | awk -F: '{s += $2} END {print s}')" \
        "each of the sixteen answered 200 within a second"
    hub_curl GET /readyz >/dev/null
    assert_eq 200 "$(http_status)" "/readyz stays 200"
    assert_eq 32 "$(metric streaming_hub_api_tenant_waiting)" "the gauge shows the 32 waiting"
    assert_eq 7 "$(metric_delta streaming_hub_api_tenant_refused_total "$refused0")" \
        "and the counter the 7 refused"
    wait "$holder"
    wait
    log "the replays: $(sort "$WORK"/held.* | uniq -c | tr -s " \n" " ")"
    ok=$(cat "$WORK"/held.* | grep -c '^202$')
    assert_eq 1 "$ok" "one replay ran once the lock was released, the others were limited"
    assert_eq 7 "$(grep -l 'requests are waiting for the database' "$WORK"/held_body.* | wc -l)" \
        "one running and 32 waiting: the other 7 were refused at once"
}

# Four tenants whose replays wait on a lock held 5 s took the API pool's
# four connections, and every other tenant's request waited for the lock.
# A tenant's statements run at most STREAMING_HUB_API_STATEMENT_TIMEOUT (1
# s here): the four are answered 503 with Retry-After and give their
# connections back.
hub_env_a_tenants_waiting_statement_gives_its_connection_back() {
    echo STREAMING_HUB_API_STATEMENT_TIMEOUT=1s
}

prepare_a_tenants_waiting_statement_gives_its_connection_back() {
    local i key
    KEYS="" SUBS=""
    for i in 1 2 3 4; do
        key=$(own_tenant_key "slow$i")
        KEYS+=" $key"
        SUBS+=" $(subscribe_at "$key" "/ok/$(own_id)-$i/" 'transaction.*')"
    done
    OTHER=$(own_tenant_key other)
    keep KEYS SUBS OTHER
}

scenario_a_tenants_waiting_statement_gives_its_connection_back() {
    local locks="" holder i=0 sub key
    local -a keys
    read -ra keys <<<"$KEYS"
    for sub in $SUBS; do
        locks+="pg_advisory_lock(hashtextextended('subscription_replay:' || '$sub', 0)), "
    done
    psql_q "SELECT ${locks}pg_sleep(5)" >/dev/null &
    holder=$!
    sleep 0.5
    for sub in $SUBS; do
        key=${keys[i]}
        i=$((i + 1))
        curl -s -D "$WORK/slow_headers.$i" -o /dev/null -w '%{http_code} %{time_total}\n' -X POST \
            -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
            -d '{"since":"2000-01-01T00:00:00Z"}' "$HUB_URL/v1/subscriptions/$sub/replay" >"$WORK/slow.$i" &
    done
    sleep 0.3
    other_list_within 2000 "four tenants' replays wait on a lock"
    wait_until 5 "[[ \$(cat $WORK/slow.* 2>/dev/null | wc -l) == 4 ]]" ||
        fail "the four replays were not answered within 5 s"
    log "the four replays: $(sort "$WORK"/slow.* | tr '\n' ' ')"
    assert_eq 4 "$(grep -c '^503 [01]\.' "$WORK"/slow.* | awk -F: '{s += $2} END {print s}')" \
        "each waiting replay answered 503 within 2 s"
    assert_eq 4 "$(grep -il '^retry-after: 1' "$WORK"/slow_headers.* | wc -l)" "each with Retry-After"
    wait "$holder"
}

scenarios_main "$@"
