#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# Lua policies end to end (SPEC §8, docs/policies.md): Kafka → hub → the
# recording sink on loopback, with the policy files in a directory this test
# owns ($WORK/pol).
#
# Covers:
#   - match: a content filter (ev.data.amount) delivers only the matching
#     events, deletes the other jobs and counts them; a match that raises is
#     a match (delivered) and is counted as a policy error.
#   - retry: a policy's table replaces the schedule; a function answering
#     false dead-letters at once (reason "policy"); a function that raises
#     falls back to the default curve (STREAMING_HUB_RETRY_SCHEDULE, short);
#     a policy without a retry table (or a function answering nil) leaves
#     the subscription's retry_schedule in force.
#   - shape: a table body is JSON-encoded with Content-Type application/json
#     and the extra headers; both signatures verify over the shaped body with
#     openssl; a shape header cannot replace the hub's own; a shape that
#     raises fails the attempt with policy_error, and after fixing the file
#     and POST /admin/policies/reload the retry delivers the shaped body.
#   - sandbox and limits: no io/require/os.execute/load/debug inside; an
#     infinite loop is stopped (kind timeout) until it trips (its later calls
#     answered without running, kind tripped), a memory bomb too (nomem),
#     the hub stays healthy and another subscription's deliveries continue
#     (test_policy_isolation.sh measures by how much).
#   - reload: a syntax error keeps the good version (last_error names file
#     and line, hash and generation unchanged, deliveries still use it);
#     SIGHUP reloads; reload metrics; a deleted file is gone; unknown or
#     never-compiled policy names are a 400 on field `policy`.
#   - reload under steady load: ~1000 events/s for 8 s while reloading 20
#     times between two valid versions: every event delivered exactly once,
#     no failed attempt, no policy error, both versions seen.
#   - `streaming-hub check-policies DIR`.
#
# The policy files are written once, before the hub starts; a scenario that
# changes or deletes a file is the only one that uses it.  Every scenario is
# a tenant of its own with subscriptions at sink paths of its own.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"

TOPIC=lerian.streaming.policies
ONE_S='["1s","1s","1s","1s","1s","1s","1s","1s","1s","1s","1s","1s"]'
TWO_S='["2s","2s","2s","2s","2s","2s","2s","2s","2s","2s","2s","2s"]'
FAST='["100ms","100ms","100ms","100ms","100ms","100ms","100ms","100ms","100ms","100ms","100ms","100ms"]'

# put_policy NAME < source: writes $POL/NAME.lua atomically (a reload never
# reads half a file; dot files are not policies).
put_policy() {
    cat >"$POL/.$1.tmp" && mv -f "$POL/.$1.tmp" "$POL/$1.lua"
}

steady_version() { # steady_version a|b
    put_policy steady <<EOF
-- version $1
return {
  shape = function(ev) return nil, { ["X-Version"] = "$1" } end,
}
EOF
}

# The policies of generation 1 (16 files).
write_policies() {
    put_policy filter_amount <<'EOF'
-- only transactions of 50000 or more
return {
  match = function(ev)
    return type(ev.data) == "table" and ev.data.amount >= 50000
  end,
}
EOF
    put_policy match_error <<'EOF'
return {
  match = function(ev) error("match exploded on " .. ev.id) end,
}
EOF
    put_policy retry_table <<'EOF'
return { retry = {"100ms", "100ms"} }
EOF
    put_policy retry_false <<'EOF'
return { retry = function(ctx) return false end }
EOF
    put_policy retry_error <<'EOF'
return { retry = function(ctx) error("retry exploded at attempt " .. ctx.attempt) end }
EOF
    put_policy retry_nil <<'EOF'
return { retry = function(ctx) return nil end }
EOF
    put_policy match_all <<'EOF'
return { match = function(ev) return true end }
EOF
    put_policy shape_table <<'EOF'
return {
  shape = function(ev)
    return { id = ev.id, seq = ev.data.seq, tenant = ev.tenant, shaped = true },
      { ["X-Shaped"] = "yes",
        ["X-Lerian-Event-Id"] = "forged-id",
        ["x-lerian-signature"] = "v1,sha256=00",
        ["webhook-signature"] = "v1,Zm9yZ2Vk",
        ["ce-id"] = "forged-ce",
        ["Host"] = "evil.example",
        ["Content-Length"] = "1",
        ["Connection"] = "close" }
  end,
}
EOF
    put_policy shape_broken <<'EOF'
return {
  shape = function(ev) error("shape exploded") end,
}
EOF
    # a message of bytes that are not UTF-8 (Lua strings are bytes): the
    # attempt table stores text, so the excerpt keeps the valid prefix
    put_policy shape_bytes <<'EOF'
return {
  shape = function(ev) error("bytes \255\254 end", 0) end,
}
EOF
    put_policy shape_loop <<'EOF'
return {
  shape = function(ev)
    local n = 0
    while true do n = n + 1 end
  end,
}
EOF
    put_policy shape_nomem <<'EOF'
return {
  shape = function(ev) return string.rep("x", 256 * 1024 * 1024) end,
}
EOF
    put_policy sandbox_probe <<'EOF'
return {
  shape = function(ev)
    return {
      io = type(io), require = type(require), execute = type(os and os.execute),
      getenv = type(os and os.getenv), load = type(load), loadstring = type(loadstring),
      dofile = type(dofile), debug = type(debug), ffi = type(ffi), jit = type(jit),
      package = type(package), dump = type(string.dump), time = type(os.time),
      json = type(json.encode),
    }
  end,
}
EOF
    put_policy versioned <<'EOF'
return {
  shape = function(ev) return nil, { ["X-Version"] = "v1" } end,
}
EOF
    put_policy ephemeral <<'EOF'
return {
  shape = function(ev) return "shaped by ephemeral" end,
}
EOF
    steady_version a
}

setup() {
    POL=$WORK/pol
    mkdir -p "$POL"
    write_policies
    pg_start
    kafka_start --topic "$TOPIC:4"
    sink_start
    # POLICY_WATCH=false: these scenarios count reloads, so only their own
    # requests may reload
    hub_shared STREAMING_HUB_KEK="$(head -c 32 /dev/urandom | base64)" \
        STREAMING_HUB_ALLOW_PRIVATE_SINKS=true STREAMING_HUB_POLICY_DIR="$POL" \
        STREAMING_HUB_POLICY_WATCH=false \
        STREAMING_HUB_RETRY_SCHEDULE=200ms,300ms,400ms STREAMING_HUB_DISPATCH_LEASE=5s \
        STREAMING_HUB_BREAKER_CONSECUTIVE_FAILURES=100000 STREAMING_HUB_BREAKER_MIN_ATTEMPTS=1000000 \
        STREAMING_HUB_DELIVERY_TIMEOUT=2s
}

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

# subscribe PATH EVENT_TYPE [EXTRA_JSON] → the created subscription (JSON), as KEY
subscribe() {
    hub_curl POST /v1/subscriptions \
        "{\"event_types\":[\"$2\"],\"destination\":{\"kind\":\"webhook\",\"url\":\"$SINK_URL$1\"}${3:-}}" \
        -H "Authorization: Bearer $KEY"
}

# activate ID: verified by hand once the background probe is over (sink
# paths other than /echo cannot answer the challenge)
activate() {
    wait_until 15 "[[ \$(subscription_state $1) != pending ]]" ||
        fail "the probe of $1 did not finish"
    psql_q "UPDATE subscriptions SET verification_state = 'active', enabled = true WHERE id = '$1'" >/dev/null
}

# mk NAME PATH EVENT_TYPE [EXTRA_JSON]: creates and activates subscription
# NAME of $TENANT at $SINK_URL PATH; its id in SUB[NAME], its secret in SECRET[NAME]
declare -A SUB SECRET
mk() {
    local out
    out=$(subscribe "$2" "$3" "${4:-}")
    if [[ $(http_status) != 201 ]]; then
        fatal "subscription $1 not created: $(http_status) ${out:0:400}"
    fi
    SUB[$1]=$(jq -r .id <<<"$out")
    SECRET[$1]=$(jq -r .secret <<<"$out")
    [[ ${SUB[$1]} =~ ^[0-9a-f-]{36}$ ]] || fatal "subscription $1 has no id"
    activate "${SUB[$1]}"
}

# ev TYPE COUNT PREFIX [more produce args]: events of $TENANT
ev() {
    local t=$1 n=$2 p=$3
    shift 3
    produce --topic "$TOPIC" --tenant "$TENANT" --count "$n" --id-prefix "$p" \
        --type "studio.lerian.$t" --payload-bytes 200 "$@" >/dev/null ||
        fail "produce $t failed"
}

# recs PATH_PREFIX EVENT_TYPE: the sink's records (JSON lines) of deliveries
# of that event type under that path (verification probes excluded).
recs() {
    jq -cR --arg p "$1" --arg t "$2" \
        'fromjson? | select((.path | startswith($p)) and .headers["x-lerian-event-type"] == $t)' \
        "$SINK_LOG"
}
nrecs() { recs "$@" | wc -l | tr -d ' '; }

# jobs_of NAME STATE: jobs of subscription NAME in STATE
jobs_of() {
    jobs_in "${SUB[$1]}" "$2"
}

perr() { # perr POLICY FUNCTION KIND
    metric "streaming_hub_policy_errors_total{policy=\"$1\",function=\"$2\",kind=\"$3\"}"
}

attempts_of() { # attempts_of NAME: "number|status|error" per attempt of the sub's jobs
    psql_q "SELECT a.number, coalesce(a.status::text, ''), coalesce(a.error, '')
              FROM delivery_attempts a JOIN delivery_jobs j ON j.id = a.job_id
             WHERE j.subscription_id = '${SUB[$1]}' ORDER BY j.id, a.number"
}

# own_path NAME: the scenario's sink path /ok/<scenario>-NAME/
own_path() {
    printf '/ok/%s/' "$(own_id "$1")"
}

# ---------------------------------------------------------------------------
# the policy directory
# ---------------------------------------------------------------------------

scenario_the_policy_files_are_loaded_at_start() {
    local pols
    pols=$(admin_curl GET /admin/policies)
    assert_eq 200 "$(http_status)" "GET /admin/policies"
    assert_eq "$POL" "$(jq -r .dir <<<"$pols")" "policies come from the test's directory"
    assert_eq 16 "$(jq '[.policies[] | select(.hash != null and .last_error == null)] | length' <<<"$pols")" \
        "all 16 policy files loaded at start"
    assert_eq '["match"]' "$(jq -c '.policies[] | select(.name == "filter_amount") | .functions' <<<"$pols")" \
        "functions lists what a file defines"
    hub_curl POST /admin/policies/reload >/dev/null
    assert_eq 401 "$(http_status)" "POST /admin/policies/reload without the admin token → 401"
}

# ---------------------------------------------------------------------------
# match
# ---------------------------------------------------------------------------

prepare_a_match_filter_delivers_only_matching_events() {
    own_client
    mk filter "$(own_path filter)" filter.amount ',"policy":"filter_amount"'
    FILTERED0=$(metric streaming_hub_policy_filtered_total)
    ev filter.amount 20 fa-
    keep TENANT KEY SUB FILTERED0
}

scenario_a_match_filter_delivers_only_matching_events() {
    local want_ids want_n got_ids resp
    want_ids=$(for i in $(seq 0 19); do
        awk -v i="$i" 'BEGIN { a = (i * 7919) % 100000 + (i % 100) / 100; if (a >= 50000) print "fa-" i }'
    done | sort)
    want_n=$(wc -l <<<"$want_ids" | tr -d ' ')
    log "filter: $want_n of 20 events have amount >= 50000"
    wait_until 30 "(( \$(metric streaming_hub_policy_filtered_total) - $FILTERED0 >= 20 - $want_n )) && [[ \$(jobs_of filter succeeded) == $want_n ]]" ||
        fail "filter: jobs not settled (succeeded $(jobs_of filter succeeded), filtered $(($(metric streaming_hub_policy_filtered_total) - FILTERED0)))"
    assert_eq 20 "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id LIKE 'fa-%'")" \
        "filter: all 20 events stored"
    sleep 0.5 # anything wrongly attempted would reach the sink now
    got_ids=$(recs "$(own_path filter)" filter.amount | jq -r '.headers["x-lerian-event-id"]' | sort)
    assert_eq "$want_ids" "$got_ids" "filter: exactly the events with amount >= 50000 reached the sink"
    assert_eq $((20 - want_n)) "$(metric_delta streaming_hub_policy_filtered_total "$FILTERED0")" \
        "filter: streaming_hub_policy_filtered_total counts the $((20 - want_n)) others"
    assert_eq "$want_n" "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '${SUB[filter]}'")" \
        "filter: the filtered jobs are gone from delivery_jobs"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM delivery_attempts a JOIN delivery_jobs j ON j.id = a.job_id WHERE j.subscription_id = '${SUB[filter]}' AND a.error IS NOT NULL")" \
        "filter: no failed attempt"
    resp=$(hub_curl GET "/v1/subscriptions/${SUB[filter]}/deliveries?limit=100" "" -H "Authorization: Bearer $KEY")
    assert_eq "$want_n" "$(jq '.items | length' <<<"$resp" 2>/dev/null)" \
        "filter: the deliveries API lists only the matching events"
}

prepare_a_match_that_raises_is_a_match() {
    own_client
    mk matcherr "$(own_path matcherr)" match.error ',"policy":"match_error"'
    ev match.error 5 me-
    keep SUB
}

scenario_a_match_that_raises_is_a_match() {
    wait_jobs "${SUB[matcherr]}" succeeded 5 20 || fail "match error: jobs not delivered"
    assert_eq 5 "$(nrecs "$(own_path matcherr)" match.error)" "match error: an error counts as a match, all 5 delivered"
    assert_eq 5 "$(perr match_error match error)" \
        'streaming_hub_policy_errors_total{policy="match_error",function="match",kind="error"} counts them'
    if grep -q '"policy call failed"' "$HUB_LOG" && grep '"policy call failed"' "$HUB_LOG" | grep -q 'match exploded'; then
        pass "match error: logged with the policy's message"
    else
        fail "match error: no 'policy call failed' log line with the error"
    fi
}

# ---------------------------------------------------------------------------
# retry
# ---------------------------------------------------------------------------

prepare_a_retry_table_replaces_the_schedule() {
    own_client
    mk rtable "/status/500/$(own_id)/" retry.table ',"policy":"retry_table"'
    ev retry.table 1 rt-
    keep SUB
}

scenario_a_retry_table_replaces_the_schedule() {
    wait_jobs "${SUB[rtable]}" dead 1 20 || fail "retry table: job not dead"
    assert_eq "exhausted|3" "$(psql_q "SELECT reason, attempt_count FROM delivery_jobs WHERE subscription_id = '${SUB[rtable]}'")" \
        'retry = {"100ms","100ms"}: dead after 3 attempts, reason exhausted (not the 4 of the default curve)'
    assert_eq 3 "$(nrecs "/status/500/$(own_id)/" retry.table)" "retry table: the sink saw 3 attempts"
}

prepare_a_retry_function_answering_false_dead_letters() {
    own_client
    mk rfalse "/status/500/$(own_id)/" retry.false ',"policy":"retry_false"'
    ev retry.false 1 rf-
    keep SUB
}

scenario_a_retry_function_answering_false_dead_letters() {
    wait_jobs "${SUB[rfalse]}" dead 1 20 || fail "retry false: job not dead"
    assert_eq "policy|1" "$(psql_q "SELECT reason, attempt_count FROM delivery_jobs WHERE subscription_id = '${SUB[rfalse]}'")" \
        "retry function returning false: dead after 1 attempt, reason policy"
    assert_eq 1 "$(nrecs "/status/500/$(own_id)/" retry.false)" "retry false: the sink saw 1 attempt"
}

prepare_a_retry_function_that_raises_falls_back_to_the_default_curve() {
    own_client
    mk rerror "/status/500/$(own_id)/" retry.error ',"policy":"retry_error"'
    ev retry.error 1 re-
    keep SUB
}

scenario_a_retry_function_that_raises_falls_back_to_the_default_curve() {
    local span
    wait_jobs "${SUB[rerror]}" dead 1 20 || fail "retry error: job not dead"
    assert_eq "exhausted|4" "$(psql_q "SELECT reason, attempt_count FROM delivery_jobs WHERE subscription_id = '${SUB[rerror]}'")" \
        "retry function that raises: the default curve (3 steps → 4 attempts), then dead exhausted"
    span=$(sink_ts "/status/500/$(own_id)/" | tail -n 4 | awk 'NR == 1 { f = $1 } { l = $1 } END { print l - f }')
    assert_le "$span" 3000 "retry error: the 4 attempts follow the 200/300/400 ms default curve (took ${span} ms)"
    assert_eq 4 "$(perr retry_error retry error)" \
        'streaming_hub_policy_errors_total{policy="retry_error",function="retry",kind="error"} = 4'
}

# policies without a retry table (match only; a retry function answering
# nil = "the schedule") keep the subscription's retry_schedule: 12 steps of
# 1s with full jitter, 13 attempts spread over seconds (the sum of 12
# uniform(0,1s] delays is under 2 s with probability 2^12/12! < 1e-5)
prepare_no_retry_table_keeps_the_subscription_schedule() {
    own_client
    mk schedmatch "/status/500/$(own_id match)/" sched.match ",\"policy\":\"match_all\",\"retry_schedule\":$ONE_S"
    mk schednil "/status/500/$(own_id nil)/" sched.nil ",\"policy\":\"retry_nil\",\"retry_schedule\":$ONE_S"
    ev sched.match 1 sm-
    ev sched.nil 1 sn-
    keep SUB
}

scenario_no_retry_table_keeps_the_subscription_schedule() {
    local k span
    for k in schedmatch schednil; do
        wait_jobs "${SUB[$k]}" dead 1 30 || fail "$k: job not dead"
        assert_eq "exhausted|13" "$(psql_q "SELECT reason, attempt_count FROM delivery_jobs WHERE subscription_id = '${SUB[$k]}'")" \
            "$k: the subscription's 12-step schedule → 13 attempts, dead exhausted"
        span=$(psql_q "SELECT (extract(epoch FROM max(a.started_at) - min(a.started_at)) * 1000)::int FROM delivery_attempts a JOIN delivery_jobs j ON j.id = a.job_id WHERE j.subscription_id = '${SUB[$k]}'")
        assert_ge "$span" 2000 "$k: the retries follow the subscription's retry_schedule (13 attempts over ${span} ms)"
    done
}

# ---------------------------------------------------------------------------
# shape
# ---------------------------------------------------------------------------

prepare_a_shaped_body_is_json_and_signed() {
    own_client
    mk shaped "$(own_path shaped)" shape.table ',"policy":"shape_table"'
    mk plain "$(own_path plain)" shape.table # control: same events, no policy
    # datacontenttype text/plain: so the shaped Content-Type is visibly the policy's
    ev shape.table 3 st- --extra-header ce-datacontenttype=text/plain
    keep TENANT SUB SECRET
}

scenario_a_shaped_body_is_json_and_signed() {
    local line ctl keyhex ts want
    wait_until 20 "[[ \$(jobs_of shaped succeeded) == 3 && \$(jobs_of plain succeeded) == 3 ]]" ||
        fail "shape: jobs not delivered"
    line=$(recs "$(own_path shaped)" shape.table | jq -c 'select(.headers["x-lerian-attempt"] == "1")' |
        grep -F '"ce-id":"st-1"' | head -n1)
    ctl=$(recs "$(own_path plain)" shape.table | grep -F '"ce-id":"st-1"' | head -n1)
    [[ -n $line && -n $ctl ]] || fail "shape: no record of st-1 (shaped: ${line:0:80}, control: ${ctl:0:80})"
    h() { jq -r --arg n "$1" '.headers[$n] // "(absent)"' <<<"$line"; }
    printf '%s' "$line" | jq -r .body_b64 | base64 -d >"$WORK/shaped.body"
    printf '%s' "$ctl" | jq -r .body_b64 | base64 -d >"$WORK/plain.body"
    assert_eq "{\"id\":\"st-1\",\"seq\":1,\"shaped\":true,\"tenant\":\"$TENANT\"}" "$(jq -cS . "$WORK/shaped.body" 2>&1)" \
        "shape: the sink got the JSON-encoded table"
    assert_eq "$(psql_q "SELECT convert_from(payload, 'UTF8') FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'st-1'")" \
        "$(cat "$WORK/plain.body")" "shape: a subscription without the policy still gets the stored payload"
    assert_eq text/plain "$(jq -r '.headers["content-type"]' <<<"$ctl")" \
        "control: Content-Type is the event's datacontenttype (text/plain)"
    assert_eq application/json "$(h content-type)" "shape: a table body is sent as application/json"
    assert_eq yes "$(h x-shaped)" "shape: the extra header arrives"
    assert_eq st-1 "$(h x-lerian-event-id)" "shape: an X-Lerian-Event-Id from the policy is dropped (the real one arrives)"
    assert_eq st-1 "$(h ce-id)" "shape: a ce-id from the policy is dropped"
    assert_eq st-1 "$(h webhook-id)" "shape: webhook-id is the real ce-id"
    assert_eq "${SINK_URL#http://}" "$(h host)" "shape: a Host header from the policy is dropped"
    assert_eq "$(jq -r '.headers.connection // "(absent)"' <<<"$ctl")" "$(h connection)" \
        "shape: a hop-by-hop Connection header from the policy is dropped"
    assert_eq "$(stat -c %s "$WORK/shaped.body")" "$(jq -r .body_len <<<"$line")" \
        "shape: a Content-Length from the policy is dropped (the whole body arrives)"
    keyhex=$(printf '%s' "${SECRET[shaped]#whsec_}" | base64 -d | od -An -tx1 | tr -d ' \n')
    ts=$(h x-lerian-timestamp)
    want=$({ printf 'v1:%s.' "$ts"; cat "$WORK/shaped.body"; } |
        openssl dgst -sha256 -mac HMAC -macopt "hexkey:$keyhex" | awk '{print $NF}')
    assert_eq "v1,sha256=$want" "$(h x-lerian-signature)" "shape: X-Lerian-Signature verifies over the shaped body (openssl)"
    want=$({ printf '%s.%s.' st-1 "$(h webhook-timestamp)"; cat "$WORK/shaped.body"; } |
        openssl dgst -sha256 -mac HMAC -macopt "hexkey:$keyhex" -binary | base64)
    assert_eq "v1,$want" "$(h webhook-signature)" "shape: webhook-signature verifies over the shaped body (openssl)"
}

# sandbox: nothing dangerous is reachable from a policy
prepare_the_sandbox_hides_what_is_dangerous() {
    own_client
    mk sandbox "$(own_path sandbox)" sandbox.probe ',"policy":"sandbox_probe"'
    ev sandbox.probe 1 sp-
    keep SUB
}

scenario_the_sandbox_hides_what_is_dangerous() {
    local sb
    wait_jobs "${SUB[sandbox]}" succeeded 1 20 || fail "sandbox probe not delivered"
    sb=$(recs "$(own_path sandbox)" sandbox.probe | head -n1 | jq -r .body_b64 | base64 -d | jq -cS . 2>&1)
    assert_eq '{"debug":"nil","dofile":"nil","dump":"nil","execute":"nil","ffi":"nil","getenv":"nil","io":"nil","jit":"nil","json":"function","load":"nil","loadstring":"nil","package":"nil","require":"nil","time":"function"}' \
        "$sb" "sandbox: no io, require, os.execute, os.getenv, load*, dofile, debug, ffi, jit, package, string.dump"
}

# a shape that raises fails the attempt with policy_error, nothing is sent;
# fixed and reloaded, the retry delivers the shaped body
prepare_a_shape_error_is_retried_until_the_policy_is_fixed() {
    own_client
    mk broken "$(own_path broken)" shape.broken ",\"policy\":\"shape_broken\",\"retry_schedule\":$TWO_S"
    ev shape.broken 1 sb-
    keep SUB
}

scenario_a_shape_error_is_retried_until_the_policy_is_fixed() {
    local rl att
    wait_until 20 "[[ \$(psql_q \"SELECT count(*) FROM delivery_attempts a JOIN delivery_jobs j ON j.id = a.job_id WHERE j.subscription_id = '${SUB[broken]}' AND a.error = 'policy_error'\") -ge 1 ]]" ||
        fail "shape error: no policy_error attempt"
    assert_contains "$(psql_q "SELECT a.response_excerpt FROM delivery_attempts a JOIN delivery_jobs j ON j.id = a.job_id WHERE j.subscription_id = '${SUB[broken]}' ORDER BY a.number LIMIT 1")" \
        "shape exploded" "shape error: the policy's message is in the attempt's response_excerpt"
    # full jitter may make the retry due at once: pending or already retrying
    assert_eq retrying "$(psql_q "SELECT CASE WHEN state IN ('pending', 'in_flight') THEN 'retrying' ELSE state::text END FROM delivery_jobs WHERE subscription_id = '${SUB[broken]}'")" \
        "shape error: the job is pending a retry or retrying (its retry_schedule has 12 steps of 2s)"
    assert_eq 0 "$(nrecs "$(own_path broken)" shape.broken)" "shape error: nothing (unshaped) was sent"
    put_policy shape_broken <<'EOF'
return {
  shape = function(ev) return { fixed = true, id = ev.id } end,
}
EOF
    rl=$(admin_curl POST /admin/policies/reload)
    assert_eq 200 "$(http_status)" "POST /admin/policies/reload after the fix → 200"
    assert_eq null "$(jq -c '.policies[] | select(.name == "shape_broken") | .last_error' <<<"$rl")" \
        "the fixed shape_broken loads"
    wait_until 40 "[[ \$(psql_q \"SELECT state FROM delivery_jobs WHERE subscription_id = '${SUB[broken]}'\") =~ ^(succeeded|dead)$ ]]"
    assert_eq "succeeded" "$(psql_q "SELECT state || coalesce(' ' || reason, '') FROM delivery_jobs WHERE subscription_id = '${SUB[broken]}'")" \
        "shape error → fix → reload: the retry succeeded"
    assert_eq '{"fixed":true,"id":"sb-0"}' "$(recs "$(own_path broken)" shape.broken | tail -n1 | jq -r .body_b64 | base64 -d | jq -cS . 2>&1)" \
        "shape error → fix → reload: the retry delivered the shaped body"
    att=$(attempts_of broken)
    assert_eq "200|" "$(tail -n1 <<<"$att" | cut -d'|' -f2,3)" "the last attempt succeeded (200, no error)"
    assert_eq 0 "$(head -n -1 <<<"$att" | grep -vc '||policy_error$')" \
        "every earlier attempt failed with policy_error and no HTTP status"
    assert_ge "$(perr shape_broken shape error)" 1 'streaming_hub_policy_errors_total{policy="shape_broken",function="shape",kind="error"}'
}

# an error message that is not UTF-8 is recorded (its valid prefix), and does
# not hold the outcome batches back
prepare_a_non_utf8_policy_error_is_recorded() {
    own_client
    mk bytes "$(own_path bytes)" shape.bytes ',"policy":"shape_bytes","retry_schedule":["100ms"]'
    ev shape.bytes 1 sy-
    keep SUB
}

scenario_a_non_utf8_policy_error_is_recorded() {
    wait_job_state "${SUB[bytes]}" dead 20 ||
        fail "non-UTF-8 policy error: the job did not reach dead after its one retry"
    assert_eq "2 policy_error|shape: shape_bytes.lua: bytes " "$(psql_q "SELECT count(*) || ' ' || min(a.error) || '|' || min(a.response_excerpt) FROM delivery_attempts a JOIN delivery_jobs j ON j.id = a.job_id WHERE j.subscription_id = '${SUB[bytes]}'")" \
        "non-UTF-8 policy error: both attempts recorded, the excerpt cut before the first bad byte"
}

# ---------------------------------------------------------------------------
# limits: an infinite loop and a memory bomb, beside a healthy subscription
# (produced in the body: the loops must be running while /healthz is asked)
# ---------------------------------------------------------------------------

scenario_a_loop_and_a_memory_bomb_are_stopped() {
    local nb_pid slowest r to tr
    own_client
    mk loop "$(own_path loop)" shape.loop ",\"policy\":\"shape_loop\",\"retry_schedule\":$FAST"
    mk nomem "$(own_path nomem)" shape.nomem ',"policy":"shape_nomem","retry_schedule":["100ms"]'
    mk neighbour "$(own_path neighbour)" neighbour.tick
    ev shape.loop 3 lp-
    ev shape.nomem 1 nm-
    produce --topic "$TOPIC" --tenant "$TENANT" --count 30 --id-prefix nb- \
        --type studio.lerian.neighbour.tick --payload-bytes 200 --rate 100 >/dev/null &
    nb_pid=$!
    # while the loops are being stopped, the HTTP API answers
    slowest=0
    for _ in 1 2 3 4 5; do
        r=$(curl -s -o /dev/null -w '%{http_code} %{time_total}' --max-time 5 "$HUB_URL/healthz")
        [[ ${r% *} == 200 ]] || fail "/healthz during the loops: $r"
        slowest=$(awk -v a="$slowest" -v b="${r#* }" 'BEGIN { print (b > a ? b : a) }')
        sleep 0.1
    done
    assert_le "$slowest" 1 "/healthz answers within 1 s while the loops are stopped (slowest ${slowest}s)"
    wait_jobs "${SUB[loop]}" dead 3 30 || fail "loop: jobs not dead ($(attempts_of loop | wc -l) attempts)"
    wait "$nb_pid" || fail "produce neighbour.tick failed"
    assert_eq "exhausted|13" "$(psql_q "SELECT DISTINCT reason || '|' || attempt_count FROM delivery_jobs WHERE subscription_id = '${SUB[loop]}'")" \
        "loop: each job stopped on every one of its 13 attempts, then dead"
    # 5 timeouts (STREAMING_HUB_POLICY_TRIP_FAILURES) trip it: the calls
    # after those (and any that were running then) are answered without running
    to=$(perr shape_loop shape timeout)
    tr=$(perr shape_loop shape tripped)
    assert_ge "$to" 5 "loop: the 5 timeouts that trip it (kind timeout: $to)"
    assert_le "$to" 8 "loop: once tripped its calls are not run (at most the 3 running then finish)"
    assert_eq 39 "$((to + tr))" \
        'streaming_hub_policy_errors_total{policy="shape_loop",function="shape",kind="timeout"|"tripped"} = 39 (every attempt)'
    assert_eq 1 "$(metric 'streaming_hub_policy_trips_total{policy="shape_loop"}')" "loop: tripped once"
    assert_eq tripped "$(admin_curl GET /admin/policies | jq -r '.policies[] | select(.name == "shape_loop") | .state')" \
        "loop: GET /admin/policies shows it tripped"
    assert_eq 39 "$(attempts_of loop | grep -c '||policy_error$')" "loop: all 39 attempts failed with policy_error"
    assert_contains "$(psql_q "SELECT a.response_excerpt FROM delivery_attempts a JOIN delivery_jobs j ON j.id = a.job_id WHERE j.subscription_id = '${SUB[loop]}' LIMIT 1")" \
        "deadline" "loop: the excerpt says the call ran past its deadline"
    assert_eq 0 "$(nrecs "$(own_path loop)" shape.loop)" "loop: nothing was sent"
    wait_jobs "${SUB[nomem]}" dead 1 20 || fail "nomem: job not dead"
    assert_eq 2 "$(perr shape_nomem shape nomem)" \
        'streaming_hub_policy_errors_total{policy="shape_nomem",function="shape",kind="nomem"} = 2'
    wait_jobs "${SUB[neighbour]}" succeeded 30 20 || fail "neighbour: not all delivered"
    assert_eq 30 "$(nrecs "$(own_path neighbour)" neighbour.tick)" "another subscription's 30 deliveries went on meanwhile"
    assert_eq 200 "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$HUB_URL/healthz")" "/healthz 200 after the loop"
    hub_alive && pass "the hub is still running" || fail "the hub died"
}

# ---------------------------------------------------------------------------
# reload: a broken file keeps its good version; SIGHUP; unknown policies
# ---------------------------------------------------------------------------

scenario_a_broken_reload_keeps_the_good_version_until_sighup() {
    local path before h1 g1 g0 err0 ok0 rl v last_error out after
    own_client
    path=$(own_path versioned)
    mk versioned "$path" versioned.tick ',"policy":"versioned"'
    ev versioned.tick 1 v1a-
    wait_jobs "${SUB[versioned]}" succeeded 1 20 || fail "versioned: first event not delivered"
    assert_eq v1 "$(recs "$path" versioned.tick | tail -n1 | jq -r '.headers["x-version"]')" \
        "versioned: v1 in use"
    before=$(admin_curl GET /admin/policies)
    h1=$(jq -r '.policies[] | select(.name == "versioned") | .hash' <<<"$before")
    g1=$(jq -r '.policies[] | select(.name == "versioned") | .generation' <<<"$before")
    g0=$(jq -r .generation <<<"$before")
    assert_eq "$(sha256sum "$POL/versioned.lua" | cut -d' ' -f1)" "$h1" "the hash is the file's SHA-256"
    err0=$(metric 'streaming_hub_policy_reloads_total{result="error"}')
    ok0=$(metric 'streaming_hub_policy_reloads_total{result="ok"}')
    put_policy versioned <<'EOF'
return {
  shape = function(ev)
    local x = = 1
    return nil, { ["X-Version"] = "broken" }
  end,
}
EOF
    put_policy never_ok <<'EOF'
return { match = function(ev) return true end, shap = function(ev) end }
EOF
    rl=$(admin_curl POST /admin/policies/reload)
    assert_eq 200 "$(http_status)" "reload over a broken file → 200"
    v=$(jq -c '.policies[] | select(.name == "versioned")' <<<"$rl")
    assert_eq $((g0 + 1)) "$(jq -r .generation <<<"$rl")" "the reload built the next generation"
    assert_eq "$h1" "$(jq -r .hash <<<"$v")" "broken reload: the hash is unchanged (the good version stays)"
    assert_eq "$g1" "$(jq -r .generation <<<"$v")" "broken reload: the policy's generation is unchanged"
    last_error=$(jq -r .last_error <<<"$v")
    [[ $last_error == versioned.lua:3:* ]] && pass "last_error names the file and line: $last_error" ||
        fail "last_error does not name versioned.lua:3: '$last_error'"
    assert_contains "$(jq -r '.policies[] | select(.name == "never_ok") | .last_error' <<<"$rl")" "shap" \
        "a file that never compiled is listed with its error (unknown field shap)"
    assert_eq null "$(jq -r '.policies[] | select(.name == "never_ok") | .hash' <<<"$rl")" \
        "... and no hash"
    is_number "$(jq -r .reload_seconds <<<"$rl")" && pass "reload_seconds: $(jq -r .reload_seconds <<<"$rl")" ||
        fail "no reload_seconds in the reload answer"
    assert_eq $((err0 + 1)) "$(metric 'streaming_hub_policy_reloads_total{result="error"}')" \
        'streaming_hub_policy_reloads_total{result="error"} counts the broken reload'
    ev versioned.tick 1 v1b-
    wait_jobs "${SUB[versioned]}" succeeded 2 20 || fail "versioned: event after the broken reload not delivered"
    assert_eq v1 "$(recs "$path" versioned.tick | grep -F '"v1b-0"' | jq -r '.headers["x-version"]')" \
        "after the broken reload deliveries still use the good version (v1)"
    if grep '"policy failed to load; its previous version stays"' "$HUB_LOG" | grep -q 'versioned.lua:3'; then
        pass "the broken file is logged with its line"
    else
        fail "no log line for the broken versioned.lua"
    fi

    # subscriptions naming policies that are not loaded
    out=$(subscribe "$(own_path x)" x.y ',"policy":"no_such_policy"')
    assert_eq 400 "$(http_status)" "a subscription naming an unknown policy → 400"
    assert_eq policy "$(jq -r '.errors[0].field' <<<"$out" 2>/dev/null)" "... naming the field policy"
    out=$(subscribe "$(own_path x)" x.y ',"policy":"never_ok"')
    assert_eq 400 "$(http_status)" "a subscription naming a policy that never compiled → 400"
    assert_eq policy "$(jq -r '.errors[0].field' <<<"$out" 2>/dev/null)" "... naming the field policy"
    assert_contains "$(jq -r '.errors[0].message' <<<"$out" 2>/dev/null)" "never_ok.lua" "... with the file's load error"

    # SIGHUP reloads: fix versioned (v2), drop never_ok
    put_policy versioned <<'EOF'
return {
  shape = function(ev) return nil, { ["X-Version"] = "v2" } end,
}
EOF
    rm -f "$POL/never_ok.lua"
    kill -HUP "$HUB_PID"
    wait_until 10 "(( \$(admin_curl GET /admin/policies | jq -r .generation) > $g0 + 1 ))" ||
        fail "SIGHUP did not build a new generation"
    after=$(admin_curl GET /admin/policies)
    v=$(jq -c '.policies[] | select(.name == "versioned")' <<<"$after")
    assert_eq "$(sha256sum "$POL/versioned.lua" | cut -d' ' -f1)" "$(jq -r .hash <<<"$v")" "SIGHUP: the fixed file is in use"
    assert_eq null "$(jq -r .last_error <<<"$v")" "SIGHUP: last_error cleared"
    assert_eq "$(jq -r .generation <<<"$after")" "$(jq -r .generation <<<"$v")" "SIGHUP: the policy's generation is the new one"
    assert_eq 0 "$(jq '[.policies[] | select(.name == "never_ok")] | length' <<<"$after")" \
        "deleted files are gone from the new generation"
    assert_eq $((ok0 + 1)) "$(metric 'streaming_hub_policy_reloads_total{result="ok"}')" \
        'streaming_hub_policy_reloads_total{result="ok"} counts the SIGHUP reload'
    assert_eq "$(jq -r .generation <<<"$after")" "$(metric streaming_hub_policy_generation)" \
        "streaming_hub_policy_generation"
    ev versioned.tick 1 v2-
    wait_jobs "${SUB[versioned]}" succeeded 3 20 || fail "versioned: event after SIGHUP not delivered"
    assert_eq v2 "$(recs "$path" versioned.tick | grep -F '"v2-0"' | jq -r '.headers["x-version"]')" \
        "after SIGHUP deliveries use v2"
}

# a subscription whose policy file was deleted: never sent unshaped, counted
scenario_a_deleted_policy_is_never_sent_unshaped() {
    local rl missing
    own_client
    mk ephemeral "$(own_path ephemeral)" ephemeral.tick ',"policy":"ephemeral","retry_schedule":["100ms"]'
    rm -f "$POL/ephemeral.lua"
    rl=$(admin_curl POST /admin/policies/reload)
    assert_eq 200 "$(http_status)" "reload without ephemeral.lua → 200"
    assert_eq 0 "$(jq '[.policies[] | select(.name == "ephemeral")] | length' <<<"$rl")" \
        "deleted files are gone from the new generation"
    ev ephemeral.tick 1 ep-
    wait_jobs "${SUB[ephemeral]}" dead 1 20 || fail "ephemeral: job not dead"
    assert_eq "2|2" "$(psql_q "SELECT count(*), count(*) FILTER (WHERE a.error = 'policy_error') FROM delivery_attempts a JOIN delivery_jobs j ON j.id = a.job_id WHERE j.subscription_id = '${SUB[ephemeral]}'")" \
        "policy deleted: both attempts fail with policy_error"
    assert_eq 0 "$(nrecs "$(own_path ephemeral)" ephemeral.tick)" "policy deleted: nothing is sent unshaped"
    missing=$(curl -s "$HUB_URL/metrics" | awk '$1 ~ /^streaming_hub_policy_errors_total[{]policy="ephemeral",.*kind="missing"[}]$/ { n += $2 } END { print n + 0 }')
    assert_eq 2 "$missing" 'streaming_hub_policy_errors_total{policy="ephemeral",kind="missing"} = 2'
}

# ---------------------------------------------------------------------------
# reload under steady load
# ---------------------------------------------------------------------------

scenario_reloads_under_steady_load_deliver_each_event_once() {
    local n=8000 errs0 t0 reload_secs=() i rl na nb path
    own_client
    path=$(own_path steady)
    mk steady "$path" steady.load ',"policy":"steady"'
    errs0=$(curl -s "$HUB_URL/metrics" | grep -c '^streaming_hub_policy_errors_total{policy="steady"')
    t0=$SECONDS
    produce_bg --topic "$TOPIC" --tenant "$TENANT" --count "$n" --id-prefix sl- \
        --type studio.lerian.steady.load --payload-bytes 200 --rate 1000
    for i in $(seq 1 20); do
        sleep 0.3
        if ((i % 2)); then steady_version b; else steady_version a; fi
        rl=$(admin_curl POST /admin/policies/reload)
        if [[ $(http_status) != 200 ]]; then
            fail "reload $i under load: status $(http_status)"
            continue
        fi
        reload_secs+=("$(jq -r .reload_seconds <<<"$rl")")
        [[ $(jq -r '.policies[] | select(.name == "steady") | .last_error' <<<"$rl") == null ]] ||
            fail "reload $i: steady did not load"
    done
    log "20 reloads under load done after $((SECONDS - t0)) s; reload_seconds: ${reload_secs[*]}"
    echo "# reload_seconds under load: ${reload_secs[*]}"
    wait "$PRODUCER_PID" || fail "the producer failed: $(cat "$PRODUCER_LOG")"
    log "producer: $(cat "$PRODUCER_LOG")"
    assert_eq 20 "${#reload_secs[@]}" "20 reloads under load answered"
    wait_jobs "${SUB[steady]}" succeeded "$n" 90 ||
        fail "steady: $(jobs_of steady succeeded) of $n jobs succeeded"
    log "steady: all delivered $((SECONDS - t0)) s after the producer started"
    sleep 0.5
    recs "$path" steady.load | jq -r '[.headers["x-lerian-event-id"], .headers["x-version"] // "none"] | @tsv' \
        >"$WORK/steady.tsv"
    assert_eq "$n" "$(wc -l <"$WORK/steady.tsv" | tr -d ' ')" "steady: the sink received exactly $n deliveries"
    assert_eq "$n" "$(cut -f1 "$WORK/steady.tsv" | sort -u | wc -l | tr -d ' ')" "steady: $n distinct event ids"
    assert_eq "$n" "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '${SUB[steady]}'")" "steady: $n jobs"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM delivery_attempts a JOIN delivery_jobs j ON j.id = a.job_id WHERE j.subscription_id = '${SUB[steady]}' AND a.error IS NOT NULL")" \
        "steady: no attempt failed"
    assert_eq "$n" "$(psql_q "SELECT sum(attempt_count) FROM delivery_jobs WHERE subscription_id = '${SUB[steady]}'")" \
        "steady: one attempt per job"
    na=$(awk -F'\t' '$2 == "a"' "$WORK/steady.tsv" | wc -l | tr -d ' ')
    nb=$(awk -F'\t' '$2 == "b"' "$WORK/steady.tsv" | wc -l | tr -d ' ')
    log "steady: X-Version a: $na, b: $nb"
    assert_eq "$n" "$((na + nb))" "steady: every delivery was shaped by one of the two versions"
    assert_ge "$na" 1 "steady: version a seen"
    assert_ge "$nb" 1 "steady: version b seen"
    assert_eq "$errs0" "$(curl -s "$HUB_URL/metrics" | grep -c '^streaming_hub_policy_errors_total{policy="steady"')" \
        "steady: no policy errors"
    assert_eq 200 "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$HUB_URL/healthz")" "/healthz 200 after the load"
}

# ---------------------------------------------------------------------------
# check-policies (on copies of files no scenario changes)
# ---------------------------------------------------------------------------

scenario_check_policies_names_the_broken_file() {
    local dir out rc
    dir=$WORK/check-$(own_id)
    mkdir -p "$dir"
    cp "$POL/filter_amount.lua" "$POL/match_all.lua" "$POL/sandbox_probe.lua" "$dir/"
    out=$("$HUB_BIN" check-policies "$dir" 2>&1)
    rc=$?
    assert_eq 0 "$rc" "check-policies on good files exits 0"
    assert_eq "3 policies OK" "$out" "check-policies says so"
    printf 'return {\n  match = function(ev)\n    return ev.data.amount >>= 3\n  end,\n}\n' >"$dir/bad.lua"
    out=$("$HUB_BIN" check-policies "$dir" 2>&1)
    rc=$?
    assert_ne 0 "$rc" "check-policies with a broken file exits non-zero ($rc)"
    assert_eq 1 "$(wc -l <<<"$out" | tr -d ' ')" "check-policies prints one line: $out"
    [[ $out == bad.lua:3:* ]] && pass "the line names the file and line" || fail "check-policies line: '$out'"
}

scenarios_main "$@"
