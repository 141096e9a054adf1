#!/usr/bin/env bash
# Auto-disable (SPEC §7.7), end to end: Kafka → hub → the recording sink.
#
# A failure streak per subscription records its first and last failure since
# the last success.  With STREAMING_HUB_AUTODISABLE_ENABLED=true the hub
# disables a subscription (enabled=false, disabled_reason auto_disabled, an
# audit row, a log line, a metric) once the streak is BOTH sustained
# (now - first >= WINDOW) and dispersed (last - first >= SPREAD).
#
#   run 1  WINDOW=3s SPREAD=2s:
#          a) an always-failing destination (/status/500) is auto-disabled,
#             verification_state untouched, its jobs parked, no more attempts;
#          a') the same for a destination that never answers (/hang: each
#             attempt is in flight for the 2s timeout), so attempts are still
#             in flight when it is disabled: their failures must park the
#             jobs, not reschedule them;
#          d) a destination failing until a deadline (/fail-until) is
#             auto-disabled, then (past the deadline) re-enabled with PATCH
#             {"enabled":true}: parked jobs resume and succeed, disabled_reason
#             is cleared and the success clears the streak.
#   run 2  WINDOW=1h SPREAD=1s: only the dispersion gate holds → never disabled.
#   run 3  WINDOW=1s SPREAD=1h: only the sustained gate holds → never disabled.
#   run 4  AUTODISABLE_ENABLED=false, gates that would fire → never disabled,
#          and a 410 does not disable either.
#
# The breaker (per tenant and origin: every sink path shares one origin) is
# kept out of the way with high thresholds.
set -uo pipefail
source "$(dirname "$0")/../support/lib.sh"
source "$(dirname "$0")/../support/sink.sh"
source "$(dirname "$0")/../support/delivery.sh"
hub_test_init

KEK=$(head -c 32 /dev/urandom | base64)
STEPS=1500ms,1500ms,1500ms,1500ms,1500ms,1500ms,1500ms,1500ms,1500ms,1500ms,1500ms,1500ms
BASE_ENV=(STREAMING_HUB_KEK="$KEK" STREAMING_HUB_ALLOW_PRIVATE_SINKS=true
    STREAMING_HUB_RETRY_SCHEDULE=$STEPS STREAMING_HUB_DISPATCH_LEASE=5s
    STREAMING_HUB_BREAKER_CONSECUTIVE_FAILURES=1000 STREAMING_HUB_BREAKER_MIN_ATTEMPTS=1000
    STREAMING_HUB_DELIVERY_TIMEOUT=2s STREAMING_HUB_SHUTDOWN_TIMEOUT=3s
    STREAMING_HUB_DISPATCH_WORKERS=32)
TOPIC=lerian.streaming.autodisable
pg_start
kafka_start --topic $TOPIC:4
sink_start
hub_start "${BASE_ENV[@]}" STREAMING_HUB_AUTODISABLE_ENABLED=true \
    STREAMING_HUB_AUTODISABLE_FAILURE_WINDOW=3s STREAMING_HUB_AUTODISABLE_FAILURE_SPREAD=2s
RUN1_LOG=$HUB_LOG

tenant_create acme
ACME_KEY=$(tenant_key acme)
[[ -n $ACME_KEY ]] || fatal "no tenant API key"

q() { psql_q "$1"; }
sub_field() { q "SELECT $2 FROM subscriptions WHERE id = '$1'"; }
jobs_in() { q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$1' AND state = '$2'"; }
# subscribe PATH TYPE → id, verified by hand once its background probe ended
# (the failing paths cannot echo the challenge)
subscribe() {
    local id
    id=$(subscribe_active "$ACME_KEY" "$(subscription_json "$2" "$SINK_URL$1")") ||
        fatal "the probe of $id did not finish"
    echo "$id"
}
# patch ID JSON → prints the response body; status in $(http_status)
patch() {
    hub_curl PATCH "/v1/subscriptions/$1" "$2" -H "Authorization: Bearer $ACME_KEY"
}
# events TYPE PREFIX COUNT RATE: produce in the background
events() {
    produce_bg --topic $TOPIC --tenant acme --count "$3" --rate "$4" --id-prefix "$2" \
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

# --- run 1 (a): always failing → auto-disabled ----------------------------------
H_ID=$(subscribe /hang/h slow.fails) # each attempt is in flight for the 2s timeout
deadline_ms=$(($(date +%s%3N) + 11000))
A_ID=$(subscribe /status/500/a always.fails)
D_ID=$(subscribe "/fail-until/$deadline_ms/d" recovers.later)
events always.fails a- 30 5
events recovers.later d- 10 5
events slow.fails h- 6 5

wait_until 15 "[[ \$(sub_field $A_ID enabled) == f ]]" || fail "the always-failing subscription was not auto-disabled"
took=$(q "SELECT round(extract(epoch FROM (SELECT max(at) FROM audit_log WHERE object_id = '$A_ID') - failure_first_at)::numeric, 2) FROM subscriptions WHERE id = '$A_ID'")
assert_ge "$took" 3 "auto-disable came no earlier than WINDOW after the first failure (3s; took ${took}s)"
assert_eq "false|auto_disabled|active" "$(sub_field "$A_ID" "enabled || '|' || coalesce(disabled_reason, '') || '|' || verification_state")" \
    "enabled=false, disabled_reason auto_disabled, verification_state untouched"
assert_eq t "$(sub_field "$A_ID" "failure_last_at - failure_first_at >= interval '2 s'")" \
    "the streak was dispersed (last - first >= SPREAD) when it fired"
assert_eq 1 "$(q "SELECT count(*) FROM audit_log WHERE action = 'subscription.auto_disable' AND object_id = '$A_ID' AND tenant_id = 'acme'")" \
    "one audit_log row subscription.auto_disable"
assert_contains "$(q "SELECT detail::text FROM audit_log WHERE action = 'subscription.auto_disable' AND object_id = '$A_ID'")" \
    failure_first_at "the audit detail carries the streak"
if grep 'auto-disabled' "$RUN1_LOG" | grep -q "$A_ID"; then
    pass "log line 'auto-disabled' names the subscription"
else
    fail "no 'auto-disabled' log line for $A_ID"
fi
resp=$(curl -s -H "Authorization: Bearer $ACME_KEY" "$HUB_URL/v1/subscriptions/$A_ID")
assert_contains "$resp" '"disabled_reason":"auto_disabled"' "GET shows disabled_reason auto_disabled"
assert_contains "$resp" '"enabled":false' "GET shows enabled false"
sleep 0.5 # outcomes of attempts in flight at the moment of disabling land
wait_until 3 "(( \$(jobs_in $A_ID in_flight) == 0 ))" >/dev/null
attempts=$(sink_count /status/500/a)
sleep 3
assert_eq "$attempts" "$(sink_count /status/500/a)" "no further attempts reach the sink after auto-disable"
assert_ge "$(jobs_in "$A_ID" parked)" 1 "its remaining jobs are parked"
assert_eq 0 "$(q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$A_ID' AND state NOT IN ('parked', 'dead')")" \
    "no job of the disabled subscription is pending or in flight ($(q "SELECT string_agg(state || ':' || n, ' ') FROM (SELECT state, count(*) n FROM delivery_jobs WHERE subscription_id = '$A_ID' GROUP BY state) x"))"

# --- run 1 (d): fails until a deadline → auto-disabled, then PATCH enabled:true --
wait_until 10 "[[ \$(sub_field $D_ID disabled_reason) == auto_disabled ]]" ||
    fail "the /fail-until subscription was not auto-disabled before its deadline"
assert_ge "$(metric streaming_hub_subscriptions_auto_disabled_total)" 2 "streaming_hub_subscriptions_auto_disabled_total counts both"
assert_eq active "$(sub_field "$D_ID" verification_state)" "verification_state untouched (d)"
parked_d=$(jobs_in "$D_ID" parked)
assert_ge "$parked_d" 1 "the /fail-until subscription's jobs are parked ($parked_d)"
# wait for the destination to recover
while (($(date +%s%3N) < deadline_ms + 300)); do sleep 0.2; done
assert_eq 0 "$(sink_ts "/fail-until/$deadline_ms/d" | awk -v d="$deadline_ms" '$1 >= d { n++ } END { print n + 0 }')" \
    "no attempt reached the recovered destination while it was disabled"
body=$(patch "$D_ID" '{"enabled":true}')
assert_eq 200 "$(http_status)" "PATCH {\"enabled\":true} accepted"
assert_contains "$body" '"enabled":true' "PATCH answers enabled true"
assert_contains "$body" '"disabled_reason":null' "PATCH answers disabled_reason null"
wait_until 15 "(( \$(jobs_in $D_ID succeeded) == 10 ))" ||
    fail "parked jobs did not resume and succeed after PATCH enabled:true ($(q "SELECT string_agg(state || ':' || n, ' ') FROM (SELECT state, count(*) n FROM delivery_jobs WHERE subscription_id = '$D_ID' GROUP BY state) x"))"
assert_eq "true|" "$(sub_field "$D_ID" "enabled || '|' || coalesce(disabled_reason, '')")" "enabled again, disabled_reason cleared"
assert_eq "true|true" "$(sub_field "$D_ID" "(failure_first_at IS NULL) || '|' || (failure_last_at IS NULL)")" \
    "a success clears the streak (failure_first_at/failure_last_at NULL)"

# --- run 1 (a'): attempts still in flight when the subscription is disabled ------
# /hang: every attempt stays in flight for the 2s delivery timeout, so when one
# failure disables the subscription others are still in flight; their failures
# must not bring the jobs back to pending (they are parked, never attempted).
wait_until 15 "[[ \$(sub_field $H_ID disabled_reason) == auto_disabled ]]" ||
    fail "the /hang subscription was not auto-disabled"
h_dis_ms=$(q "SELECT (extract(epoch FROM max(at)) * 1000)::bigint FROM audit_log WHERE object_id = '$H_ID' AND action = 'subscription.auto_disable'")
wait_until 4 "(( \$(jobs_in $H_ID in_flight) == 0 ))" >/dev/null
sleep 3
late=$(sink_ts /hang/h | awk -v d="${h_dis_ms:-0}" '$1 > d + 200 { n++ } END { print n + 0 }')
assert_eq 0 "$late" "no attempt starts after auto-disable, even for jobs that were in flight ($late started later; jobs: $(q "SELECT string_agg(state || ':' || attempt_count, ' ' ORDER BY id) FROM delivery_jobs WHERE subscription_id = '$H_ID'"))"
assert_eq 0 "$(q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$H_ID' AND state NOT IN ('parked', 'dead')")" \
    "jobs in flight at the disable end up parked"

# --- run 2 (b): only the dispersion gate holds ----------------------------------
hub_stop
hub_start "${BASE_ENV[@]}" STREAMING_HUB_AUTODISABLE_ENABLED=true \
    STREAMING_HUB_AUTODISABLE_FAILURE_WINDOW=1h STREAMING_HUB_AUTODISABLE_FAILURE_SPREAD=1s
B_ID=$(subscribe /status/500/b only.dispersed)
events only.dispersed b- 30 5
never_disabled "$B_ID" /status/500/b 6 "dispersed but not sustained (WINDOW=1h SPREAD=1s)"
assert_eq t "$(sub_field "$B_ID" "failure_last_at - failure_first_at >= interval '1 s'")" \
    "the streak is dispersed (last - first >= 1s) and open"
patch "$B_ID" '{"enabled":false}' >/dev/null
assert_eq disabled "$(sub_field "$B_ID" disabled_reason)" "PATCH enabled:false → disabled_reason disabled"
assert_eq 0 "$(metric streaming_hub_subscriptions_auto_disabled_total)" "run 2: nothing auto-disabled"

# --- run 3 (b'): only the sustained gate holds ----------------------------------
hub_stop
hub_start "${BASE_ENV[@]}" STREAMING_HUB_AUTODISABLE_ENABLED=true \
    STREAMING_HUB_AUTODISABLE_FAILURE_WINDOW=1s STREAMING_HUB_AUTODISABLE_FAILURE_SPREAD=1h
S_ID=$(subscribe /status/500/s only.sustained)
events only.sustained s- 30 5
never_disabled "$S_ID" /status/500/s 6 "sustained but not dispersed (WINDOW=1s SPREAD=1h)"
assert_eq t "$(sub_field "$S_ID" "now() - failure_first_at >= interval '1 s'")" "the streak is sustained (now - first >= 1s)"
patch "$S_ID" '{"enabled":false}' >/dev/null
assert_eq 0 "$(metric streaming_hub_subscriptions_auto_disabled_total)" "run 3: nothing auto-disabled"

# --- run 4 (c): kill switch off --------------------------------------------------
hub_stop
hub_start "${BASE_ENV[@]}" STREAMING_HUB_AUTODISABLE_ENABLED=false \
    STREAMING_HUB_AUTODISABLE_FAILURE_WINDOW=1s STREAMING_HUB_AUTODISABLE_FAILURE_SPREAD=500ms
K_ID=$(subscribe /status/500/k kill.switch)
G_ID=$(subscribe /gone/k gone.ignored)
events kill.switch k- 30 5
events gone.ignored g- 3 5
never_disabled "$K_ID" /status/500/k 6 "kill switch off: gates that would fire do not disable"
assert_eq t "$(sub_field "$K_ID" "now() - failure_first_at >= interval '1 s' AND failure_last_at - failure_first_at >= interval '500 ms'")" \
    "both gates hold on the recorded streak"
assert_ge "$(sink_count /gone/k)" 4 "410 answers were received ($(sink_count /gone/k) attempts)"
assert_eq "true|" "$(sub_field "$G_ID" "enabled || '|' || coalesce(disabled_reason, '')")" \
    "kill switch off: 410 does not disable the subscription"
assert_eq 0 "$(jobs_in "$G_ID" parked)" "kill switch off: the 410 subscription's jobs are not parked"
assert_eq 0 "$(metric streaming_hub_subscriptions_auto_disabled_total)" "run 4: nothing auto-disabled"
assert_eq 0 "$(q "SELECT count(*) FROM audit_log WHERE object_id IN ('$B_ID', '$S_ID', '$K_ID', '$G_ID') AND action IN ('subscription.auto_disable', 'subscription.disable')")" \
    "no disable audit row for runs 2-4"
patch "$K_ID" '{"enabled":false}' >/dev/null
patch "$G_ID" '{"enabled":false}' >/dev/null

hub_test_done
