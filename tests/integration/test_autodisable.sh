#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# Auto-disable (SPEC §7.7), end to end: Kafka → hub → the recording sink.
#
# A failure streak per subscription records its first and last failure since
# the last success.  With STREAMING_HUB_AUTODISABLE_ENABLED=true the hub
# disables a subscription (enabled=false, disabled_reason auto_disabled, an
# audit row, a log line, a metric) once the streak is BOTH sustained
# (now - first >= WINDOW) and dispersed (last - first >= SPREAD).
#
#   shared hub  WINDOW=3s SPREAD=2s:
#          - an always-failing destination (/status/500) is auto-disabled,
#            verification_state untouched, its jobs parked, no more attempts;
#          - the same for a destination that never answers (/hang: each
#            attempt is in flight for the 2s timeout), so attempts are still
#            in flight when it is disabled: their failures must park the
#            jobs, not reschedule them;
#          - a busy stream (events arriving while it is disabled, so ingest
#            transactions lease jobs of it for the fast path as the disable
#            commits): none of its jobs is attempted once the hub knows;
#          - a destination that refuses connections (nothing listens on its
#            port) is auto-disabled; once it is disabled the destination
#            recovers (a sink starts on that port), and nothing reaches it
#            until PATCH {"enabled":true}: then parked jobs resume and
#            succeed, disabled_reason is cleared and the success clears the
#            streak.
#   "No attempt after the disable" is measured against the hub's own record
#   of it: the log line written once the disabling transaction committed,
#   and each attempt's start (its delivery id is a UUIDv7 made as the
#   attempt starts, on the same clock), so neither the machine's load nor
#   the time the transaction took moves it.  A failed scenario prints its
#   subscription's state, jobs, attempts and hub log lines (diagnose).
#   a hub of its own  WINDOW=1h SPREAD=1s: only the dispersion gate holds → never disabled.
#   a hub of its own  WINDOW=1s SPREAD=1h: only the sustained gate holds → never disabled.
#   a hub of its own  AUTODISABLE_ENABLED=false, gates that would fire → never
#          disabled, and a 410 does not disable either.
#
# The breaker (per tenant and origin: every sink path shares one origin) is
# kept out of the way with thresholds at their maximum: the busy stream's
# 700 events fail ~1,000 times within the 3 s window, and a breaker opened
# then would hold every attempt (and so the disable) for its open time.
# Each scenario is a tenant of
# its own; the three on the shared hub start their streams in prepare_*.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"

TOPIC=lerian.streaming.autodisable
STEPS=1500ms,1500ms,1500ms,1500ms,1500ms,1500ms,1500ms,1500ms,1500ms,1500ms,1500ms,1500ms
AUTO_DISABLED=streaming_hub_subscriptions_auto_disabled_total

setup() {
    pg_start
    kafka_start --topic "$TOPIC":4
    sink_start
    hub_shared STREAMING_HUB_KEK="$(head -c 32 /dev/urandom | base64)" \
        STREAMING_HUB_ALLOW_PRIVATE_SINKS=true \
        STREAMING_HUB_RETRY_SCHEDULE=$STEPS STREAMING_HUB_DISPATCH_LEASE=5s \
        STREAMING_HUB_BREAKER_CONSECUTIVE_FAILURES=100000 STREAMING_HUB_BREAKER_MIN_ATTEMPTS=1000000 \
        STREAMING_HUB_DELIVERY_TIMEOUT=2s STREAMING_HUB_SHUTDOWN_TIMEOUT=3s \
        STREAMING_HUB_DISPATCH_WORKERS=32 STREAMING_HUB_AUTODISABLE_ENABLED=true \
        STREAMING_HUB_AUTODISABLE_FAILURE_WINDOW=3s STREAMING_HUB_AUTODISABLE_FAILURE_SPREAD=2s
}

q() { psql_q "$1"; }
sub_field() { q "SELECT $2 FROM subscriptions WHERE id = '$1'"; }
job_counts() { q "SELECT string_agg(state || ':' || n, ' ') FROM (SELECT state, count(*) n FROM delivery_jobs WHERE subscription_id = '$1' GROUP BY state) x"; }

# subscribe PATH TYPE → id of $KEY's subscription, verified by hand once its
# background probe ended (the failing paths cannot echo the challenge)
subscribe() {
    local id
    id=$(subscribe_active "$KEY" "$(subscription_json "$2" "$SINK_URL$1")") ||
        fatal "the probe of $id did not finish"
    echo "$id"
}

# patch ID JSON → prints the response body; status in $(http_status)
patch() {
    hub_curl PATCH "/v1/subscriptions/$1" "$2" -H "Authorization: Bearer $KEY"
}

# diagnose ID PATH [SINK_LOG]: on stderr, what a failed check of subscription
# ID (its attempts under PATH) needs to be understood from CI's output alone:
# the subscription's streak, its audit rows, when the hub learned of its
# disable, its jobs, its last attempts and the hub's log lines naming it.
diagnose() {
    local id=$1 path=$2 sink_log=${3:-$SINK_LOG}
    log "diagnose $id ($path):"
    log "  subscription: $(sub_field "$id" "'enabled=' || enabled || ' reason=' || coalesce(disabled_reason, '-')
        || ' first=' || coalesce(failure_first_at::text, '-') || ' last=' || coalesce(failure_last_at::text, '-')")"
    log "  audit: $(q "SELECT string_agg(action || ' at ' || at::text, '; ' ORDER BY at) FROM audit_log WHERE object_id = '$id'")"
    log "  hub logged the disable at (unix ms): $(disabled_ms "$id")"
    log "  jobs (state/attempts/lease): $(q "SELECT string_agg(state || '/' || attempt_count || '/' || coalesce(lease_owner, '-'), ' ' ORDER BY id)
        FROM delivery_jobs WHERE subscription_id = '$id'")"
    log "  last attempts (started_ms #attempt event arrived_ms):"
    SINK_LOG=$sink_log attempts_after "$path" 0 | tail -n 12 | while read -r l; do log "    $l"; done
    grep -h "$id" "$WORK"/hub.*.log 2>/dev/null | tail -n 8 | while read -r l; do log "  hub: $l"; done
}

# failed_in_scenario: how many assertions of the current scenario failed so far.
failed_in_scenario() {
    grep -c "^F	${HUB_SCENARIO:-}\$" "${HUB_TEST_RECORD:-/dev/null}"
}

# events TYPE PREFIX COUNT RATE: produce $TENANT's events in the background
events() {
    produce_bg --topic "$TOPIC" --tenant "$TENANT" --count "$3" --rate "$4" --id-prefix "$2" \
        --type "studio.lerian.$1"
}

# never_disabled ID SINK_PATH SECONDS MSG: failures keep being recorded for SECONDS and
# the subscription stays enabled all along
never_disabled() {
    local id=$1 path=$2 secs=$3 msg=$4 before after
    before=$(sink_count "$path")
    if wait_until "$secs" "[[ \$(sub_field $id enabled) != t ]]"; then
        fail "$msg: disabled ($(sub_field "$id" disabled_reason))"
    else
        pass "$msg: still enabled after ${secs}s"
    fi
    after=$(sink_count "$path")
    assert_ge "$((after - before))" 5 "$msg: failures kept coming meanwhile ($((after - before)) attempts)"
}

# no_disable_audit ID...: no (auto) disable audit row for these subscriptions
no_disable_audit() {
    local ids
    ids=$(printf "'%s'," "$@")
    assert_eq 0 "$(q "SELECT count(*) FROM audit_log WHERE object_id IN (${ids%,}) AND action IN ('subscription.auto_disable', 'subscription.disable')")" \
        "no disable audit row"
}

# disabled_ms ID: when the hub learned that its outcome statement disabled ID
# (Unix ms of its "auto-disabled" log line, written once the transaction
# committed); empty while there is no such line.
disabled_ms() {
    local ts
    ts=$(grep -h 'auto-disabled' "$WORK"/hub.*.log 2>/dev/null | grep "$1" | head -n1 |
        sed -n 's/.*"ts":"\([^"]*\)".*/\1/p')
    [[ -n $ts ]] && date -u -d "$ts" +%s%3N
}

# attempts_after PATH MS: the attempts recorded under PATH that the hub
# started after MS (Unix ms), one "started_ms #attempt event_id arrived_ms"
# a line.  An attempt's start is its delivery id's time (a UUIDv7, made as
# the attempt starts, on the hub's clock), not its arrival here: a loaded
# machine may take a while to carry a request started in time.
attempts_after() {
    paste -d ' ' <(sink_header "$1" x-lerian-delivery-id) <(sink_header "$1" x-lerian-attempt) \
        <(sink_header "$1" x-lerian-event-id) <(sink_ts "$1") | awk -v after="$2" '
        function hex(s,   i, v) {
            v = 0
            for (i = 1; i <= length(s); i++) v = v * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1
            return v
        }
        { id = $1; gsub("-", "", id); ms = hex(tolower(substr(id, 1, 12))) }
        ms > after + 0 { printf "%.0f #%s %s %s\n", ms, $2, $3, $4 }'
}

# no_attempt_after_disable ID PATH: asserts that no attempt of ID under PATH
# started after the hub logged that it disabled ID (waits for the line).
no_attempt_after_disable() {
    local dis_ms late
    wait_until 5 "[[ -n \$(disabled_ms $1) ]]" >/dev/null || fail "no 'auto-disabled' log line for $1"
    dis_ms=$(disabled_ms "$1")
    late=$(attempts_after "$2" "${dis_ms:-0}")
    assert_eq 0 "$(printf '%s' "$late" | grep -c .)" \
        "no attempt starts after the hub logged the disable (at ${dis_ms:-?}; later: $(printf '%s' "$late" | head -n 5 | tr '\n' ';'))"
}

# disabled_and_settled ID WHAT: waits (20s) for ID's auto-disable, then (10s)
# for its jobs in flight at that moment to settle; a failure names WHAT.
disabled_and_settled() {
    wait_until 20 "[[ \$(sub_field $1 disabled_reason) == auto_disabled ]]" ||
        fail "$2 was not auto-disabled ($(job_counts "$1"))"
    wait_until 10 "(( \$(jobs_in $1 in_flight) == 0 ))" >/dev/null ||
        fail "jobs of $2 still in flight 10s after the disable ($(job_counts "$1"))"
}

# ---------------------------------------------------------------------------
# the shared hub: WINDOW=3s SPREAD=2s
# ---------------------------------------------------------------------------

prepare_an_always_failing_destination_is_auto_disabled() {
    own_client
    A_PATH=/status/500/$(own_id)/
    A_ID=$(subscribe "$A_PATH" always.fails)
    DISABLED0=$(metric "$AUTO_DISABLED")
    events always.fails a- 30 5
    keep TENANT KEY A_ID A_PATH DISABLED0
}

scenario_an_always_failing_destination_is_auto_disabled() {
    local took resp attempts
    wait_until 15 "[[ \$(sub_field $A_ID enabled) == f ]]" || fail "the always-failing subscription was not auto-disabled"
    took=$(q "SELECT round(extract(epoch FROM (SELECT max(at) FROM audit_log WHERE object_id = '$A_ID') - failure_first_at)::numeric, 2) FROM subscriptions WHERE id = '$A_ID'")
    assert_ge "$took" 3 "auto-disable came no earlier than WINDOW after the first failure (3s; took ${took}s)"
    assert_eq "false|auto_disabled|active" "$(sub_field "$A_ID" "enabled || '|' || coalesce(disabled_reason, '') || '|' || verification_state")" \
        "enabled=false, disabled_reason auto_disabled, verification_state untouched"
    assert_eq t "$(sub_field "$A_ID" "failure_last_at - failure_first_at >= interval '2 s'")" \
        "the streak was dispersed (last - first >= SPREAD) when it fired"
    assert_eq 1 "$(q "SELECT count(*) FROM audit_log WHERE action = 'subscription.auto_disable' AND object_id = '$A_ID' AND tenant_id = '$TENANT'")" \
        "one audit_log row subscription.auto_disable"
    assert_contains "$(q "SELECT detail::text FROM audit_log WHERE action = 'subscription.auto_disable' AND object_id = '$A_ID'")" \
        failure_first_at "the audit detail carries the streak"
    if grep 'auto-disabled' "$HUB_LOG" | grep -q "$A_ID"; then
        pass "log line 'auto-disabled' names the subscription"
    else
        fail "no 'auto-disabled' log line for $A_ID"
    fi
    assert_ge "$(metric_delta "$AUTO_DISABLED" "$DISABLED0")" 1 "$AUTO_DISABLED counts it"
    resp=$(curl -s -H "Authorization: Bearer $KEY" "$HUB_URL/v1/subscriptions/$A_ID")
    assert_contains "$resp" '"disabled_reason":"auto_disabled"' "GET shows disabled_reason auto_disabled"
    assert_contains "$resp" '"enabled":false' "GET shows enabled false"
    no_attempt_after_disable "$A_ID" "$A_PATH"
    # outcomes of attempts in flight at the moment of disabling land
    wait_until 10 "(( \$(jobs_in $A_ID in_flight) == 0 ))" >/dev/null ||
        fail "jobs still in flight 10s after the disable ($(job_counts "$A_ID"))"
    attempts=$(sink_count "$A_PATH")
    sleep 3
    assert_eq "$attempts" "$(sink_count "$A_PATH")" "no further attempts reach the sink after auto-disable"
    assert_ge "$(jobs_in "$A_ID" parked)" 1 "its remaining jobs are parked"
    # Its stream still runs at the disable: an ingest transaction whose
    # matching saw the subscription enabled commits its jobs after the disable
    # has parked the others, so they stay pending (never claimed while the
    # subscription is disabled; the no-attempt checks above hold for them).
    assert_eq 0 "$(q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$A_ID' AND state NOT IN ('parked', 'dead', 'pending')")" \
        "no job of the disabled subscription is in flight ($(job_counts "$A_ID"))"
    (($(failed_in_scenario) == 0)) || diagnose "$A_ID" "$A_PATH"
}

# refuses connections → auto-disabled; the destination recovers while the
# subscription is disabled (nothing may reach it), then PATCH enabled:true.
# The recovery is the test's move, made once the disable happened: a
# deadline fixed in advance assumed the stream's first delivery within a few
# seconds, which a loaded machine does not keep (deliveries began up to 8s
# late, and the disable then came after the deadline).
prepare_a_recovered_destination_is_enabled_again() {
    local tries=0
    own_client
    D_PORT=$(random_port)
    while port_in_use "$D_PORT" && ((++tries < 20)); do D_PORT=$(random_port); done
    D_PATH=/ok/$(own_id)/
    D_ID=$(subscribe_active "$KEY" "$(subscription_json recovers.later "http://127.0.0.1:$D_PORT$D_PATH")") ||
        fatal "the probe of $D_ID did not finish"
    DISABLED0=$(metric "$AUTO_DISABLED")
    events recovers.later d- 10 5
    keep KEY D_ID D_PATH D_PORT DISABLED0
}

# recovered_sink_start: the destination comes back: a sink listening on
# $D_PORT, recording to $D_LOG; sets D_SINK (its pid).
recovered_sink_start() {
    D_LOG=$WORK/sink.recovered.jsonl
    "${HUB_SINK:-$BUILD/hub-sink}" --listen "127.0.0.1:$D_PORT" --record "$D_LOG" \
        --port-file "$WORK/sink.recovered.port" >>"$WORK/sink.recovered.log" 2>&1 &
    D_SINK=$!
    track_pid "$D_SINK"
    wait_until 10 "[[ -s $WORK/sink.recovered.port ]]" ||
        fatal "the recovered destination did not start on port $D_PORT ($(tail -n 3 "$WORK/sink.recovered.log"))"
}

scenario_a_recovered_destination_is_enabled_again() {
    local parked_d body
    disabled_and_settled "$D_ID" "the refused destination's subscription"
    assert_ge "$(metric_delta "$AUTO_DISABLED" "$DISABLED0")" 1 "$AUTO_DISABLED counts it"
    assert_eq active "$(sub_field "$D_ID" verification_state)" "verification_state untouched (d)"
    parked_d=$(jobs_in "$D_ID" parked)
    assert_ge "$parked_d" 1 "the refused destination's jobs are parked ($(job_counts "$D_ID"))"
    recovered_sink_start
    # more than a retry step (1.5s) with the destination up: a job retried
    # or claimed while disabled would reach it
    sleep 2.5
    assert_eq 0 "$(SINK_LOG=$D_LOG sink_count "$D_PATH")" \
        "no attempt reached the recovered destination while it was disabled"
    body=$(patch "$D_ID" '{"enabled":true}')
    assert_eq 200 "$(http_status)" "PATCH {\"enabled\":true} accepted"
    assert_contains "$body" '"enabled":true' "PATCH answers enabled true"
    assert_contains "$body" '"disabled_reason":null' "PATCH answers disabled_reason null"
    wait_jobs "$D_ID" succeeded 10 20 ||
        fail "parked jobs did not resume and succeed after PATCH enabled:true ($(job_counts "$D_ID"))"
    assert_eq "true|" "$(sub_field "$D_ID" "enabled || '|' || coalesce(disabled_reason, '')")" "enabled again, disabled_reason cleared"
    assert_eq "true|true" "$(sub_field "$D_ID" "(failure_first_at IS NULL) || '|' || (failure_last_at IS NULL)")" \
        "a success clears the streak (failure_first_at/failure_last_at NULL)"
    (($(failed_in_scenario) == 0)) || diagnose "$D_ID" "$D_PATH" "$D_LOG"
    kill "$D_SINK" 2>/dev/null
    wait "$D_SINK" 2>/dev/null
}

# Enabled again by PATCH {"enabled":true}, a subscription kept the failure
# streak that disabled it: its next failure (one timeout, one 500) found a
# streak far past the window and the spread and disabled it again at once.
# Enabling it starts a new streak, as a successful /verify does.
prepare_a_subscription_enabled_again_starts_a_new_streak() {
    own_client
    R_PATH=/status/500/$(own_id)/
    R_ID=$(subscribe "$R_PATH" again.fails)
    keep TENANT KEY R_ID R_PATH
}

scenario_a_subscription_enabled_again_starts_a_new_streak() {
    q "UPDATE subscriptions SET enabled = false, disabled_reason = 'auto_disabled',
              failure_first_at = now() - interval '1 hour', failure_last_at = now() - interval '1 minute'
        WHERE id = '$R_ID'" >/dev/null
    patch "$R_ID" '{"enabled":true}' >/dev/null
    assert_eq 200 "$(http_status)" "PATCH {\"enabled\":true} accepted"
    assert_eq "true|true" "$(sub_field "$R_ID" "(failure_first_at IS NULL) || '|' || (failure_last_at IS NULL)")" \
        "enabling it again clears the old streak"
    events again.fails r- 1 10
    # the attempt's row and the streak's update commit together
    wait_sql 10 1 "SELECT count(*) FROM delivery_attempts a JOIN delivery_jobs j ON j.id = a.job_id
                    WHERE j.subscription_id = '$R_ID'" || fail "no attempt was recorded"
    assert_eq "true|" "$(sub_field "$R_ID" "enabled || '|' || coalesce(disabled_reason, '')")" \
        "its next failure starts a new streak and does not disable it"
}

# /hang: every attempt stays in flight for the 2s delivery timeout, so when one
# failure disables the subscription others are still in flight; their failures
# must not bring the jobs back to pending (they are parked, never attempted).
prepare_attempts_in_flight_at_the_disable_end_up_parked() {
    own_client
    H_PATH=/hang/$(own_id)/
    H_ID=$(subscribe "$H_PATH" slow.fails) # each attempt is in flight for the 2s timeout
    events slow.fails h- 6 5
    keep H_ID H_PATH
}

scenario_attempts_in_flight_at_the_disable_end_up_parked() {
    # the attempts in flight at the disable end (2s timeout), and any retry
    # they wrongly asked for would be due one step (1.5s) later
    disabled_and_settled "$H_ID" "the /hang subscription"
    sleep 3
    no_attempt_after_disable "$H_ID" "$H_PATH"
    assert_eq 0 "$(q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$H_ID' AND state NOT IN ('parked', 'dead')")" \
        "jobs in flight at the disable end up parked ($(job_counts "$H_ID"))"
    (($(failed_in_scenario) == 0)) || diagnose "$H_ID" "$H_PATH"
}

# A busy stream to a failing destination: events keep arriving while the
# subscription is disabled, and the ingest transactions in flight then
# (their statement read the subscription still enabled) lease jobs of it
# for the fast path, committed after the disable.  None of them may be
# attempted once the hub knows it disabled the subscription.
prepare_jobs_leased_at_the_disable_are_not_attempted() {
    own_client
    F_PATH=/status/500/$(own_id)/
    F_ID=$(subscribe "$F_PATH" busy.fails)
    events busy.fails f- 700 140
    keep F_ID F_PATH
}

scenario_jobs_leased_at_the_disable_are_not_attempted() {
    # the jobs leased at the disable come back (their outcomes land)
    disabled_and_settled "$F_ID" "the busy subscription"
    no_attempt_after_disable "$F_ID" "$F_PATH"
    (($(failed_in_scenario) == 0)) || diagnose "$F_ID" "$F_PATH"
}

# ---------------------------------------------------------------------------
# hubs of their own: one gate only, or the kill switch off
# ---------------------------------------------------------------------------

hub_env_only_dispersed_is_never_disabled() {
    echo STREAMING_HUB_AUTODISABLE_FAILURE_WINDOW=1h STREAMING_HUB_AUTODISABLE_FAILURE_SPREAD=1s
}

scenario_only_dispersed_is_never_disabled() {
    local b_id path body
    own_client
    path=/status/500/$(own_id)/
    b_id=$(subscribe "$path" only.dispersed)
    events only.dispersed b- 30 5
    never_disabled "$b_id" "$path" 6 "dispersed but not sustained (WINDOW=1h SPREAD=1s)"
    assert_eq t "$(sub_field "$b_id" "failure_last_at - failure_first_at >= interval '1 s'")" \
        "the streak is dispersed (last - first >= 1s) and open"
    body=$(patch "$b_id" '{"enabled":false}')
    assert_eq disabled "$(sub_field "$b_id" disabled_reason)" \
        "PATCH enabled:false → disabled_reason disabled (PATCH answered $(http_status) $body)"
    assert_eq 0 "$(metric "$AUTO_DISABLED")" "run 2: nothing auto-disabled"
    no_disable_audit "$b_id"
}

hub_env_only_sustained_is_never_disabled() {
    echo STREAMING_HUB_AUTODISABLE_FAILURE_WINDOW=1s STREAMING_HUB_AUTODISABLE_FAILURE_SPREAD=1h
}

scenario_only_sustained_is_never_disabled() {
    local s_id path
    own_client
    path=/status/500/$(own_id)/
    s_id=$(subscribe "$path" only.sustained)
    events only.sustained s- 30 5
    never_disabled "$s_id" "$path" 6 "sustained but not dispersed (WINDOW=1s SPREAD=1h)"
    assert_eq t "$(sub_field "$s_id" "now() - failure_first_at >= interval '1 s'")" "the streak is sustained (now - first >= 1s)"
    patch "$s_id" '{"enabled":false}' >/dev/null
    assert_eq 0 "$(metric "$AUTO_DISABLED")" "run 3: nothing auto-disabled"
    no_disable_audit "$s_id"
}

hub_env_the_kill_switch_off_disables_nothing() {
    echo STREAMING_HUB_AUTODISABLE_ENABLED=false \
        STREAMING_HUB_AUTODISABLE_FAILURE_WINDOW=1s STREAMING_HUB_AUTODISABLE_FAILURE_SPREAD=500ms
}

scenario_the_kill_switch_off_disables_nothing() {
    local k_id g_id path gpath
    own_client
    path=/status/500/$(own_id)/
    gpath=/gone/$(own_id)/
    k_id=$(subscribe "$path" kill.switch)
    g_id=$(subscribe "$gpath" gone.ignored)
    events kill.switch k- 30 5
    events gone.ignored g- 3 5
    never_disabled "$k_id" "$path" 6 "kill switch off: gates that would fire do not disable"
    assert_eq t "$(sub_field "$k_id" "now() - failure_first_at >= interval '1 s' AND failure_last_at - failure_first_at >= interval '500 ms'")" \
        "both gates hold on the recorded streak"
    assert_ge "$(sink_count "$gpath")" 4 "410 answers were received ($(sink_count "$gpath") attempts)"
    assert_eq "true|" "$(sub_field "$g_id" "enabled || '|' || coalesce(disabled_reason, '')")" \
        "kill switch off: 410 does not disable the subscription"
    assert_eq 0 "$(jobs_in "$g_id" parked)" "kill switch off: the 410 subscription's jobs are not parked"
    assert_eq 0 "$(metric "$AUTO_DISABLED")" "run 4: nothing auto-disabled"
    no_disable_audit "$k_id" "$g_id"
    patch "$k_id" '{"enabled":false}' >/dev/null
    patch "$g_id" '{"enabled":false}' >/dev/null
}

# After a failure: the hubs' warnings and errors (but the expected probe
# failures and disables), for a CI log that shows nothing else of them.
teardown() {
    grep -q '^F' "$HUB_TEST_RECORD" || return 0
    log "hub warnings and errors (last 20):"
    grep -h '"level":"\(warn\|error\)"' "$WORK"/hub.*.log 2>/dev/null |
        grep -v '"verification probe"\|auto-disabled' | tail -n 20 >&2
}

scenarios_main "$@"
