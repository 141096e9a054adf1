#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# Delivery engine end to end: Kafka → hub → the recording sink on loopback.
#
# Covers: matching (exact, resource.*, other tenant, disabled), the signed
# request of SPEC §7.2 (body bytes unchanged, X-Lerian-* and ce-* headers, a
# consumer-side HMAC check with openssl for both signature schemes, the
# destination credential header), retries then success, exhaustion to dead,
# 410 disabling the subscription (and dropping its queued jobs at once, on a
# hub of its own), circuit-breaker shedding, the deliveries API
# and the metrics.  Durations are shortened through the environment; the
# breaker (per tenant and origin: every sink path shares one origin) is kept
# out of the way here.  A backlog of 1,200 jobs due at once is drained with
# each job attempted, recorded and received once.
#
# Each scenario is a tenant of its own with subscriptions at sink paths of
# its own; most produce their events in prepare_* (all before the first
# check, so that their retries overlap), the backlogs and the refused
# outcome in their own bodies, one after the other.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"

TOPIC=lerian.streaming.delivery

setup() {
    pg_start
    kafka_start --topic "$TOPIC:4"
    sink_start
    hub_shared STREAMING_HUB_KEK="$(head -c 32 /dev/urandom | base64)" \
        STREAMING_HUB_ALLOW_PRIVATE_SINKS=true \
        STREAMING_HUB_RETRY_SCHEDULE=200ms,300ms,400ms STREAMING_HUB_DISPATCH_LEASE=5s \
        STREAMING_HUB_BREAKER_CONSECUTIVE_FAILURES=1000 STREAMING_HUB_BREAKER_MIN_ATTEMPTS=1000 \
        STREAMING_HUB_DELIVERY_TIMEOUT=2s
}

# events TYPE PREFIX COUNT [hub-produce args...]: COUNT events of $TENANT of
# type studio.lerian.TYPE with ids PREFIXn.
events() {
    produce --topic "$TOPIC" --tenant "$TENANT" --count "$3" --id-prefix "$2" \
        --type "studio.lerian.$1" "${@:4}" >/dev/null || fail "produce $1 failed"
}

# attempts_sql SUB WHAT [CONDITION]: SELECT WHAT over SUB's attempts.
attempts_sql() {
    psql_q "SELECT $2 FROM delivery_attempts a JOIN delivery_jobs j ON j.id = a.job_id
             WHERE j.subscription_id = '$1'${3:+ AND $3}"
}

# ---------------------------------------------------------------------------
# matching
# ---------------------------------------------------------------------------

prepare_matching_delivers_to_verified_subscriptions_only() {
    local s other_key
    own_client
    OK_PATH=/echo/$(own_id)/
    s=$(subscription_create "$KEY" "$(subscription_json 'transaction.*' "$SINK_URL$OK_PATH")")
    OK_ID=$(json_field id "$s")
    [[ -n $OK_ID ]] || fatal "subscription not created: $s"
    subscription_wait_verified "$OK_ID" ||
        fail "the background probe did not verify the /echo destination"
    # OFF stays pending (never verified): it must match nothing
    s=$(subscription_create "$KEY" "$(subscription_json transaction.posted "$SINK_URL/ok/$(own_id off)/")")
    OFF_ID=$(json_field id "$s")
    [[ -n $OFF_ID ]] || fatal "subscription not created: $s"
    other_key=$(own_tenant_key other)
    OTHER_PATH=/ok/$(own_id other)/
    subscribe_at "$other_key" "$OTHER_PATH" '*' >/dev/null
    events transaction.posted tx- 20 --payload-bytes 300
    keep TENANT OK_ID OK_PATH OFF_ID OTHER_PATH
}

scenario_matching_delivers_to_verified_subscriptions_only() {
    delivered() { sink_header "$OK_PATH" x-lerian-event-type | grep -c '^transaction.posted$'; }
    wait_until 30 '(( $(delivered) >= 20 ))' || fail "expected 20 deliveries, got $(delivered)"
    assert_eq 20 "$(jobs_in "$OK_ID" succeeded)" "20 jobs succeeded for the verified subscription"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$OFF_ID'")" \
        "a subscription that is not verified matches nothing"
    assert_eq 0 "$(sink_header "$OTHER_PATH" x-lerian-tenant-id | grep -c "^$TENANT\$")" \
        "another tenant's subscription receives nothing of the tenant's"
}

# ---------------------------------------------------------------------------
# the request itself, checked like a consumer would
# ---------------------------------------------------------------------------

prepare_the_request_is_signed_as_a_consumer_checks_it() {
    local s
    own_client
    OK_PATH=/echo/$(own_id)/
    s=$(subscription_create "$KEY" "{\"event_types\":[\"transaction.*\"],\"destination\":{\"kind\":\"webhook\",\"url\":\"$SINK_URL$OK_PATH\",\"headers\":{\"X-Api-Key\":\"sekrit-123\"}}}")
    OK_ID=$(json_field id "$s")
    OK_SECRET=$(json_field secret "$s")
    [[ -n $OK_ID && $OK_SECRET == whsec_* ]] || fatal "subscription not created: $s"
    subscription_wait_verified "$OK_ID" ||
        fail "the background probe did not verify the /echo destination"
    events transaction.posted tx- 1 --payload-bytes 300
    keep TENANT OK_ID OK_SECRET OK_PATH
}

scenario_the_request_is_signed_as_a_consumer_checks_it() {
    local line body stored ts keyhex want_lerian want_std
    wait_until 30 "grep -F '\"path\":\"$OK_PATH\"' \"\$SINK_LOG\" | grep -q '\"x-lerian-event-id\":\"tx-0\"'" ||
        fail "tx-0 was not delivered"
    line=$(grep -F "\"path\":\"$OK_PATH\"" "$SINK_LOG" | grep '"x-lerian-event-id":"tx-0"' | head -n1)
    hdr() { sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p" <<<"$line"; }
    body=$(sed -n 's/.*"body_b64":"\([^"]*\)".*/\1/p' <<<"$line" | base64 -d)
    stored=$(psql_q "SELECT convert_from(payload, 'UTF8') FROM event_inbox
                      WHERE tenant_id = '$TENANT' AND event_id = 'tx-0'")
    assert_eq "$stored" "$body" "body = the stored payload bytes"
    assert_eq transaction.posted "$(hdr x-lerian-event-type)" "X-Lerian-Event-Type is the event type"
    assert_eq "$TENANT" "$(hdr x-lerian-tenant-id)" "X-Lerian-Tenant-Id"
    assert_eq "$OK_ID" "$(hdr x-lerian-subscription-id)" "X-Lerian-Subscription-Id"
    assert_eq 1 "$(hdr x-lerian-attempt)" "X-Lerian-Attempt"
    assert_eq tx-0 "$(hdr webhook-id)" "webhook-id = ce-id"
    assert_eq tx-0 "$(hdr ce-id)" "ce-id header"
    assert_eq 1.0 "$(hdr ce-specversion)" "ce-specversion header"
    assert_eq studio.lerian.transaction.posted "$(hdr ce-type)" "ce-type header"
    assert_eq application/json "$(hdr content-type)" "Content-Type = datacontenttype"
    assert_eq sekrit-123 "$(hdr x-api-key)" "destination credential header delivered"
    assert_contains "$(hdr user-agent)" "streaming-hub/" "User-Agent"
    assert_match "$(hdr x-lerian-delivery-id)" '^[0-9a-f]{8}-[0-9a-f]{4}-7' "X-Lerian-Delivery-Id is a UUIDv7"
    ts=$(hdr x-lerian-timestamp)
    keyhex=$(printf '%s' "${OK_SECRET#whsec_}" | base64 -d | od -An -tx1 | tr -d ' \n')
    want_lerian=$(printf 'v1:%s.%s' "$ts" "$body" | openssl dgst -sha256 -mac HMAC -macopt "hexkey:$keyhex" | awk '{print $NF}')
    assert_eq "v1,sha256=$want_lerian" "$(hdr x-lerian-signature)" "X-Lerian-Signature verifies with openssl"
    want_std=$(printf '%s.%s.%s' tx-0 "$(hdr webhook-timestamp)" "$body" |
        openssl dgst -sha256 -mac HMAC -macopt "hexkey:$keyhex" -binary | base64)
    assert_eq "v1,$want_std" "$(hdr webhook-signature)" "webhook-signature (Standard Webhooks) verifies with openssl"
    if grep -q 'sekrit-123' "$HUB_LOG"; then fail "a credential reached the log"; else pass "no credential in the log"; fi
}

# ---------------------------------------------------------------------------
# retries, exhaustion, a malformed stored schedule
# ---------------------------------------------------------------------------

# /flaky/3 fails three times (the probe took one), so deliveries fail twice
# and the third attempt succeeds
prepare_retries_then_success() {
    own_client
    FLAKY_PATH=/flaky/3/$(own_id)/
    FLAKY_ID=$(subscribe_at "$KEY" "$FLAKY_PATH" flaky.happened) # the probe takes the first 503
    events flaky.happened fl- 1
    keep FLAKY_ID FLAKY_PATH
}

scenario_retries_then_success() {
    wait_job_state "$FLAKY_ID" succeeded || fail "flaky job did not succeed"
    assert_eq 3 "$(psql_q "SELECT attempt_count FROM delivery_jobs WHERE subscription_id = '$FLAKY_ID'")" "3 attempts"
    assert_eq 3 "$(attempts_sql "$FLAKY_ID" 'count(*)')" "every attempt recorded"
    assert_eq "503,503,200" "$(attempts_sql "$FLAKY_ID" "string_agg(status::text, ',' ORDER BY number)")" \
        "attempt statuses in order"
    assert_eq 3 "$(sink_header "$FLAKY_PATH" x-lerian-attempt | tail -n1)" "X-Lerian-Attempt counts up"
}

# a 2-step schedule → 3 attempts, then dead
prepare_exhaustion_makes_the_job_dead() {
    own_client
    DEAD_ID=$(subscribe_at "$KEY" "/status/500/$(own_id)/" dead.happened ',"retry_schedule":["100ms","100ms"]')
    events dead.happened dd- 1
    keep KEY DEAD_ID
}

scenario_exhaustion_makes_the_job_dead() {
    local job resp
    wait_job_state "$DEAD_ID" dead || fail "exhausted job is not dead"
    assert_eq "exhausted|3" "$(psql_q "SELECT reason, attempt_count FROM delivery_jobs WHERE subscription_id = '$DEAD_ID'")" \
        "dead with reason exhausted after 3 attempts"
    job=$(psql_q "SELECT id FROM delivery_jobs WHERE subscription_id = '$DEAD_ID'")
    resp=$(curl -s -H "Authorization: Bearer $KEY" "$HUB_URL/v1/deliveries/$job")
    assert_contains "$resp" '"state":"dead"' "GET /v1/deliveries/{id} shows the dead job"
    assert_contains "$resp" '"attempts":[' "... with its attempts"
}

# a malformed schedule stored behind the API's back (SPEC §7.4): the default
# curve (here 200ms,300ms,400ms → 4 attempts) decides each failure's retry or
# exhaustion, each counted; the delivery never fails for it
prepare_a_malformed_stored_schedule_falls_back_to_the_default() {
    own_client
    BADS_ID=$(subscribe_at "$KEY" "/status/500/$(own_id)/" badsched.happened)
    psql_q "UPDATE subscriptions SET retry_schedule = '{abc,0s}' WHERE id = '$BADS_ID'" >/dev/null
    FALLBACKS0=$(metric streaming_hub_retry_schedule_fallbacks_total)
    events badsched.happened badsched- 1
    keep BADS_ID FALLBACKS0
}

scenario_a_malformed_stored_schedule_falls_back_to_the_default() {
    wait_job_state "$BADS_ID" dead || fail "the job with a malformed stored schedule is not dead"
    assert_eq "exhausted|4" "$(psql_q "SELECT reason, attempt_count FROM delivery_jobs WHERE subscription_id = '$BADS_ID'")" \
        "a malformed stored schedule falls back to the default curve: 4 attempts"
    assert_eq 4 "$(metric_delta streaming_hub_retry_schedule_fallbacks_total "$FALLBACKS0")" \
        "each of its 4 failures (3 retries, then exhaustion) counted in streaming_hub_retry_schedule_fallbacks_total"
    assert_eq 1 "$(grep -c 'malformed retry_schedule' "$HUB_LOG")" "one warning (at most one a minute)"
}

# an attempt number already recorded (an operator lowered attempt_count by
# hand): the outcome batch fails once on the attempts' key, the dispatcher
# switches to the statement that probes for it, and the outcome lands
prepare_a_recorded_attempt_number_does_not_stop_the_outcome() {
    own_client
    SUB=$(subscribe_at "$KEY" "/status/500/$(own_id)/" dead.happened ',"retry_schedule":["100ms","100ms"]')
    events dead.happened dd- 1
    keep KEY SUB
}

scenario_a_recorded_attempt_number_does_not_stop_the_outcome() {
    local job
    wait_job_state "$SUB" dead || fail "the job to redeliver is not dead"
    job=$(psql_q "SELECT id FROM delivery_jobs WHERE subscription_id = '$SUB'")
    psql_q "UPDATE delivery_jobs SET attempt_count = 2 WHERE id = $job" >/dev/null
    curl -s -o /dev/null -X POST -H "Authorization: Bearer $KEY" "$HUB_URL/v1/deliveries/$job/redeliver"
    wait_until 20 "grep -q 'outcomes now probe for it first' \"\$HUB_LOG\"" ||
        fail "no switch to the probing outcome statement"
    wait_sql 20 'dead|3' "SELECT state || '|' || attempt_count FROM delivery_jobs WHERE id = $job" ||
        fail "the outcome of the redelivered job did not land: $(psql_q "SELECT state, attempt_count FROM delivery_jobs WHERE id = $job")"
    assert_eq 3 "$(psql_q "SELECT count(*) FROM delivery_attempts WHERE job_id = $job")" \
        "the duplicate attempt number is not recorded twice; the outcome still lands"
}

# ---------------------------------------------------------------------------
# 410, fifo, max_rate
# ---------------------------------------------------------------------------

prepare_410_gone_disables_the_subscription() {
    own_client
    GONE_ID=$(subscribe_at "$KEY" "/gone/$(own_id)/" gone.happened)
    events gone.happened gg- 1
    keep GONE_ID
}

scenario_410_gone_disables_the_subscription() {
    wait_sql 20 gone "SELECT disabled_reason FROM subscriptions WHERE id = '$GONE_ID'" ||
        fail "410 did not disable the subscription"
    assert_eq f "$(psql_q "SELECT enabled FROM subscriptions WHERE id = '$GONE_ID'")" "enabled=false after 410"
    assert_eq parked "$(psql_q "SELECT state FROM delivery_jobs WHERE subscription_id = '$GONE_ID'")" \
        "its job is parked, not attempted again"
}

# fifo: one in flight, a failing head blocks the ones behind it
prepare_fifo_retries_the_head_before_the_rest() {
    own_client
    FIFO_PATH=/flaky/3/$(own_id)/
    FIFO_ID=$(subscribe_at "$KEY" "$FIFO_PATH" fifo.tested ',"ordering":"fifo"') # probe takes one 503
    events fifo.tested ff- 5 --partitions 1
    keep FIFO_ID FIFO_PATH
}

scenario_fifo_retries_the_head_before_the_rest() {
    local order
    wait_jobs "$FIFO_ID" succeeded 5 || fail "fifo jobs not all delivered"
    order=$(sink_header "$FIFO_PATH" x-lerian-event-id | grep '^ff-' | tr '\n' ' ')
    assert_eq "ff-0 ff-0 ff-0 ff-1 ff-2 ff-3 ff-4 " "$order" "fifo: the head is retried until it succeeds, then the rest in order"
}

# A job whose stored event is gone (retention dropped its day while the job
# waited, parked or retrying) was left leased by the claim: reclaimed
# POISON_THRESHOLD times a lease apart, then dead as poison, with its fifo
# subscription stalled behind it all along.  It is dead at once now, reason
# "expired", and the next job goes.
prepare_a_job_whose_event_expired_is_dead_at_once() {
    own_client
    # the probe takes the first 503, ex-0's attempt the second; then 200s
    EXP_PATH=/flaky/2/$(own_id)/
    EXP_ID=$(subscribe_at "$KEY" "$EXP_PATH" expired.tested ',"ordering":"fifo","retry_schedule":["1h"]')
    events expired.tested ex- 3 --partitions 1
    wait_sql 20 1 "SELECT attempt_count FROM delivery_jobs WHERE subscription_id = '$EXP_ID' AND event_id = 'ex-0'" ||
        fatal "ex-0 was not attempted"
    keep TENANT KEY EXP_ID EXP_PATH
}

scenario_a_job_whose_event_expired_is_dead_at_once() {
    local order
    # what retention does to ex-0's day while it waits for its retry, for
    # that one event alone; then its retry is due
    psql_q "DELETE FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'ex-0'" >/dev/null
    psql_q "UPDATE delivery_jobs SET next_attempt_at = now() WHERE subscription_id = '$EXP_ID' AND event_id = 'ex-0'" >/dev/null
    wait_jobs "$EXP_ID" succeeded 2 20 || fail "the jobs behind the expired one were not delivered: $(job_states "$EXP_ID")"
    assert_eq "dead|expired|1|0" "$(psql_q "SELECT state, reason, attempt_count, reclaims FROM delivery_jobs
                                            WHERE subscription_id = '$EXP_ID' AND event_id = 'ex-0'")" \
        "the job whose event expired: dead, expired, no second attempt, never reclaimed"
    order=$(sink_header "$EXP_PATH" x-lerian-event-id | grep '^ex-' | tr '\n' ' ')
    assert_eq "ex-0 ex-1 ex-2 " "$order" "the fifo subscription's next jobs went in order"
}

# max_rate: deferred over the rate, not failed
prepare_max_rate_defers_without_failing() {
    own_client
    RATE_PATH=/ok/$(own_id)/
    RATE_ID=$(subscribe_at "$KEY" "$RATE_PATH" rate.tested ',"max_rate":5')
    DEFERRED0=$(metric 'streaming_hub_deliveries_total{outcome="deferred"}')
    events rate.tested rt- 20
    keep RATE_ID RATE_PATH DEFERRED0
}

scenario_max_rate_defers_without_failing() {
    local span
    wait_jobs "$RATE_ID" succeeded 20 30 || fail "rate-limited jobs not all delivered"
    span=$(grep -F "\"path\":\"$RATE_PATH\"" "$SINK_LOG" | grep '"x-lerian-event-type":"rate.tested"' |
        sed -n 's/^{"ts_ms":\([0-9]*\).*/\1/p' | sort -n | awk 'NR == 1 { f = $1 } { l = $1 } END { print l - f }')
    assert_ge "$span" 2500 "20 deliveries at max_rate 5/s take at least 2.5 s (took ${span} ms)"
    assert_ge "$(metric_delta 'streaming_hub_deliveries_total{outcome="deferred"}' "$DEFERRED0")" 1 "deferred counted"
    assert_eq 0 "$(attempts_sql "$RATE_ID" 'count(*)' 'a.status <> 200')" \
        "deferral is not a failed attempt"
}

# A backlog over max_rate was deferred whole at every token (each job the
# same wait, all back together, all but one deferred again): 60 jobs at
# 2/s, over 5 s, about 600 deferrals and outcome writes.  Deferrals are
# spread a token apart, so each job is deferred about once.
prepare_a_rate_limited_backlog_is_deferred_about_once_per_job() {
    own_client
    BACKLOG_ID=$(subscribe_at "$KEY" "/ok/$(own_id)/" backlog.tested ',"max_rate":2')
    events backlog.tested bl- 60
    keep BACKLOG_ID KEY
}

scenario_a_rate_limited_backlog_is_deferred_about_once_per_job() {
    local delayed delivered
    sleep 5
    delivered=$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$BACKLOG_ID' AND state = 'succeeded'")
    sleep 1.5 # the per-tenant figures are written every second
    delayed=$(hub_curl GET /v1/stats "" -H "Authorization: Bearer $KEY" | jq -r '.delayed')
    log "60 jobs at max_rate 2/s: $delivered delivered and $delayed deferrals after about 5 s"
    assert_ge "$delivered" 5 "they are delivered meanwhile"
    assert_le "$delayed" 120 "each job deferred about once (at most twice), not at every token"
}

# a rate far below one a day: the first job goes, the next waits no longer
# than the longest retry step (10 h) instead of a delay no timestamp holds,
# which made every outcome batch carrying it fail
prepare_a_tiny_max_rate_defers_10h_at_most() {
    own_client
    SLOW_ID=$(subscribe_at "$KEY" "/ok/$(own_id)/" slowrate.tested ',"max_rate":1e-13')
    events slowrate.tested sr- 2 --partitions 1
    keep SLOW_ID
}

scenario_a_tiny_max_rate_defers_10h_at_most() {
    wait_sql 20 1/1 "SELECT count(*) FILTER (WHERE state = 'succeeded') || '/' || count(*) FILTER (WHERE state = 'pending' AND attempt_count = 0 AND next_attempt_at > now() + interval '9 hours') FROM delivery_jobs WHERE subscription_id = '$SLOW_ID'" ||
        fail "max_rate 1e-13: not one job delivered and one deferred"
    assert_eq t "$(psql_q "SELECT max(next_attempt_at) <= now() + interval '10 hours' FROM delivery_jobs WHERE subscription_id = '$SLOW_ID'")" \
        "max_rate 1e-13: deferred by 10 h at most"
}

# ---------------------------------------------------------------------------
# metrics: the outcomes of the scenario's own deliveries are counted
# ---------------------------------------------------------------------------

prepare_deliveries_are_counted_by_outcome() {
    own_client
    OK_SUB=$(subscribe_at "$KEY" "/ok/$(own_id)/" 'transaction.*')
    FLAKY_SUB=$(subscribe_at "$KEY" "/flaky/3/$(own_id)/" flaky.happened)
    DEAD_SUB=$(subscribe_at "$KEY" "/status/500/$(own_id)/" dead.happened ',"retry_schedule":["100ms","100ms"]')
    SUCCEEDED0=$(metric 'streaming_hub_deliveries_total{outcome="succeeded"}')
    FAILED0=$(metric 'streaming_hub_deliveries_total{outcome="failed"}')
    DEAD0=$(metric 'streaming_hub_deliveries_total{outcome="dead"}')
    events transaction.posted tx- 20
    events flaky.happened fl- 1
    events dead.happened dd- 1
    keep OK_SUB FLAKY_SUB DEAD_SUB SUCCEEDED0 FAILED0 DEAD0
}

scenario_deliveries_are_counted_by_outcome() {
    wait_jobs "$OK_SUB" succeeded 20 30 || fail "the 20 events were not delivered: $(job_states "$OK_SUB")"
    wait_job_state "$FLAKY_SUB" succeeded || fail "the flaky job did not succeed"
    wait_job_state "$DEAD_SUB" dead || fail "the exhausted job is not dead"
    # 20 + 1 successes; 2 (flaky) + 3 (exhausted) failed attempts; 1 dead
    assert_ge "$(metric_delta 'streaming_hub_deliveries_total{outcome="succeeded"}' "$SUCCEEDED0")" 21 "succeeded counted"
    assert_ge "$(metric_delta 'streaming_hub_deliveries_total{outcome="failed"}' "$FAILED0")" 5 "failed counted"
    # dead is counted once the outcome statement committed it, which the
    # database may show a moment before the hub has read its answer
    wait_until 5 "(( \$(metric_delta 'streaming_hub_deliveries_total{outcome=\"dead\"}' $DEAD0) >= 1 ))" ||
        fail "dead not counted: $(metric_delta 'streaming_hub_deliveries_total{outcome="dead"}' "$DEAD0")"
}

# ---------------------------------------------------------------------------
# an outcome the database refuses (here a trigger refuses the attempts of one
# subscription) is written alone and dropped; the outcomes beside it land,
# and once the refusal is gone the job, reclaimed, succeeds
# ---------------------------------------------------------------------------

scenario_a_refused_outcome_does_not_hold_the_others() {
    local refused_id beside_id refused_producer
    own_client
    refused_id=$(subscribe_at "$KEY" "/ok/$(own_id refused)/" refused.tested)
    beside_id=$(subscribe_at "$KEY" "/ok/$(own_id beside)/" beside.tested)
    psql_q "CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS \$\$
            BEGIN
                IF NEW.subscription_id = '$refused_id' THEN
                    RAISE EXCEPTION 'refused by the test';
                END IF;
                RETURN NEW;
            END \$\$;
            CREATE TRIGGER test_refuse BEFORE UPDATE ON delivery_jobs
                FOR EACH ROW WHEN (NEW.attempt_count > OLD.attempt_count)
                EXECUTE FUNCTION test_refuse()" >/dev/null
    events refused.tested rf- 1 &
    refused_producer=$!
    events beside.tested bs- 40
    wait "$refused_producer"
    wait_jobs "$beside_id" succeeded 40 ||
        fail "outcomes beside a refused one did not land: $(job_states "$beside_id")"
    wait_until 20 "grep -q 'a delivery outcome cannot be recorded' \"\$HUB_LOG\"" ||
        fail "the refused outcome was not reported"
    assert_eq "0 false" "$(psql_q "SELECT j.attempt_count || ' ' || (j.state = 'succeeded') FROM delivery_jobs j WHERE j.subscription_id = '$refused_id'")" \
        "the refused outcome's job is not settled meanwhile"
    psql_q "DROP TRIGGER test_refuse ON delivery_jobs; DROP FUNCTION test_refuse()" >/dev/null
    wait_job_state "$refused_id" succeeded 30 ||
        fail "the refused job did not succeed once the refusal was gone"
    assert_ge "$(psql_q "SELECT reclaims FROM delivery_jobs WHERE subscription_id = '$refused_id'")" 1 \
        "it came back through a reclaim of its expired lease"
}

# ---------------------------------------------------------------------------
# backlogs: jobs inserted all at once for events already stored (not
# matched as they arrive)
# ---------------------------------------------------------------------------

# stored_events PREFIX COUNT TYPE BYTES: produces COUNT events of $TENANT
# with ids PREFIX-n and waits until they are stored
stored_events() {
    events "$3" "$1-" "$2" --payload-bytes "$4"
    wait_sql 30 "$2" "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id LIKE '$1-%'"
}

# backlog_jobs SUB PREFIX: a due job of SUB for each stored event PREFIX-n of
# $TENANT, all at once
backlog_jobs() {
    psql_q "INSERT INTO delivery_jobs (subscription_id, tenant_id, event_seq, event_day, event_id, event_type)
            SELECT '$1', tenant_id, seq, day, event_id, event_type FROM event_inbox
             WHERE tenant_id = '$TENANT' AND event_id LIKE '$2-%'" >/dev/null
}

# sink_event_ids PATH PREFIX: the event id of each request the sink got at
# PATH whose id starts with PREFIX-
sink_event_ids() { sink_header "$1" X-Lerian-Event-Id | grep "^$2-"; }

# a backlog whose events are stored under two days: after a full claim the
# next one leaves its lookups to the load, which reads each day's partition
# with a statement of its own; every job is delivered
scenario_a_backlog_over_two_days_is_delivered() {
    local days_id path
    own_client
    stored_events dy 48 days.tested 100 || fail "the two-day events were not stored"
    psql_q "UPDATE event_inbox SET day = day - 1
             WHERE tenant_id = '$TENANT' AND event_id LIKE 'dy-%' AND seq % 2 = 0" >/dev/null
    path=/ok/$(own_id)/
    days_id=$(subscribe_at "$KEY" "$path" days.tested)
    backlog_jobs "$days_id" dy
    assert_eq 2 "$(psql_q "SELECT count(DISTINCT event_day) FROM delivery_jobs WHERE subscription_id = '$days_id'")" \
        "the backlog's events are under two days"
    wait_jobs "$days_id" succeeded 48 60 ||
        fail "jobs of a two-day backlog were not all delivered: $(job_states "$days_id")"
    assert_eq 48 "$(sink_event_ids "$path" dy | sort -u | wc -l)" \
        "the sink received each of the 48 events"
    assert_eq 0 "$(psql_q "SELECT sum(reclaims) FROM delivery_jobs WHERE subscription_id = '$days_id'")" \
        "none waited for its lease to expire (every loaded job went out)"
}

# a backlog of 1,200 jobs due at once, drained by consecutive full claims
# (each leaving its lookups to the load, each tenant's next claim starting at
# its floor): no job is claimed twice, each goes out once
scenario_a_backlog_of_1200_goes_out_once_each() {
    local backlog_id path
    own_client
    stored_events bl 1200 backlog.tested 64 || fail "the backlog's events were not stored"
    path=/ok/$(own_id)/
    backlog_id=$(subscribe_at "$KEY" "$path" backlog.tested)
    backlog_jobs "$backlog_id" bl
    wait_jobs "$backlog_id" succeeded 1200 60 ||
        fail "the backlog was not delivered: $(job_states "$backlog_id")"
    assert_eq "1200×1" "$(psql_q "SELECT string_agg(n || '×' || attempt_count, ' ') FROM (SELECT attempt_count, count(*) n FROM delivery_jobs WHERE subscription_id = '$backlog_id' GROUP BY 1) x")" \
        "each backlog job was attempted once"
    assert_eq 1200 "$(attempts_sql "$backlog_id" 'count(*)')" \
        "one attempt recorded per backlog job"
    assert_eq "1200 1200" "$(sink_event_ids "$path" bl | sort | uniq -c | awk '{n++; t+=$1} END {print n, t}')" \
        "the sink received each of the 1,200 events once"
}

# Stored attributes without source, type or time (written around the ingest,
# which requires them: '{}', or not an object) go out without those ce-*
# headers; the dispatcher read them as NULL strings and took the process
# down (found in review).
scenario_stored_attributes_missing_do_not_crash_the_dispatcher() {
    local sub_id path
    own_client
    stored_events na 2 attrs.missing 64 || fail "the events were not stored"
    psql_q "UPDATE event_inbox SET headers = CASE WHEN event_id LIKE '%0' THEN '{}'::jsonb
                                                  ELSE '\"text\"'::jsonb END
             WHERE tenant_id = '$TENANT' AND event_id LIKE 'na-%'" >/dev/null
    path=/ok/$(own_id)/
    sub_id=$(subscribe_at "$KEY" "$path" attrs.missing)
    backlog_jobs "$sub_id" na
    wait_jobs "$sub_id" succeeded 2 30 || fail "not delivered: $(job_states "$sub_id")"
    hub_alive || fail "the hub died (status $(hub_exit_status "$HUB_START_N"))"
    # the verification probe's is the only one (its own source)
    assert_eq 0 "$(sink_header "$path" ce-source | grep -vc '^/streaming-hub$')" \
        "no ce-source header where none is stored"
}

# A 410 drops the subscription's jobs waiting in the dispatcher's queue at
# once, each with an outcome record of its own: with more of them than the
# records had room for, the records move, and the attempt's own record must
# not be read after that (it was: a use-after-free, found in review).  A hub
# of its own with 2 workers and claims of up to 200, the fast path off: once
# the (tenant, origin) lane has seen the sink answer (the warm-up), one claim
# takes most of the burst, and all but two of its jobs wait in the queue
# when the first 410 comes back.
hub_env_410_drops_the_queued_backlog_at_once() {
    echo STREAMING_HUB_DISPATCH_WORKERS=2 STREAMING_HUB_DISPATCH_CLAIM_BATCH=200 \
        STREAMING_HUB_DISPATCH_FAST_PATH=false
}

scenario_410_drops_the_queued_backlog_at_once() {
    local warm_id gone_id gpath claimed0 claimed probes attempts
    own_client
    warm_id=$(subscribe_at "$KEY" "/ok/$(own_id warm)/" warm.up)
    gpath=/gone/$(own_id)/
    gone_id=$(subscribe_at "$KEY" "$gpath" gone.burst)
    events warm.up wu- 40 --partitions 1
    wait_jobs "$warm_id" succeeded 40 || fail "warm-up not delivered: $(job_states "$warm_id")"
    claimed0=$(metric 'streaming_hub_dispatch_jobs_total{path="claim"}')
    probes=$(sink_count "$gpath") # the verification probe's
    events gone.burst gb- 300 --partitions 1
    wait_sql 20 gone "SELECT disabled_reason FROM subscriptions WHERE id = '$gone_id'" ||
        fail "410 did not disable the subscription"
    wait_jobs "$gone_id" parked 300 || fail "not every job parked: $(job_states "$gone_id")"
    hub_alive || fail "the hub died (status $(hub_exit_status "$HUB_START_N"))"
    claimed=$(($(metric 'streaming_hub_dispatch_jobs_total{path="claim"}') - claimed0))
    assert_ge "$claimed" 100 "most of the burst was claimed before the disable ($claimed jobs)"
    # the two workers' attempts, and those of claims made before the disable
    # committed: not one each of the 300
    attempts=$(($(sink_count "$gpath") - probes))
    assert_le "$attempts" 8 "the queued jobs went back unattempted ($attempts attempts of 300 jobs)"
}

scenarios_main "$@"
