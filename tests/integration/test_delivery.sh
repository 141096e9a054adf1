#!/usr/bin/env bash
# Delivery engine end to end: Kafka → hub → the recording sink on loopback.
#
# Covers: matching (exact, resource.*, other tenant, disabled), the signed
# request of SPEC §7.2 (body bytes unchanged, X-Lerian-* and ce-* headers, a
# consumer-side HMAC check with openssl for both signature schemes, the
# destination credential header), retries then success, exhaustion to dead,
# 410 disabling the subscription, circuit-breaker shedding, the deliveries API
# and the metrics.  Durations are shortened through the environment; the
# breaker (per tenant and origin: every sink path shares one origin) is kept
# out of the way here.  A backlog of 1,200 jobs due at once is drained with
# each job attempted, recorded and received once.
set -uo pipefail
source "$(dirname "$0")/../support/lib.sh"
source "$(dirname "$0")/../support/sink.sh"
source "$(dirname "$0")/../support/delivery.sh"
hub_test_init

KEK=$(head -c 32 /dev/urandom | base64)
pg_start
kafka_start --topic lerian.streaming.delivery:4
sink_start
hub_start STREAMING_HUB_KEK="$KEK" STREAMING_HUB_ALLOW_PRIVATE_SINKS=true \
    STREAMING_HUB_RETRY_SCHEDULE=200ms,300ms,400ms STREAMING_HUB_DISPATCH_LEASE=5s \
    STREAMING_HUB_BREAKER_CONSECUTIVE_FAILURES=1000 STREAMING_HUB_BREAKER_MIN_ATTEMPTS=1000 \
    STREAMING_HUB_DELIVERY_TIMEOUT=2s

tenant_create acme
tenant_create other
ACME_KEY=$(tenant_key acme)
OTHER_KEY=$(tenant_key other)
[[ -n $ACME_KEY && -n $OTHER_KEY ]] || fatal "no tenant API keys"

# activate ID: marks a subscription verified by hand once its background probe
# has failed (the sink paths that fail on purpose cannot echo the challenge)
activate() { subscription_activate "$1" || fail "the probe of $1 did not finish"; }

# 1. a verified subscription (the probe echoes the challenge)
S_OK=$(subscription_create "$ACME_KEY" "{\"event_types\":[\"transaction.*\"],\"destination\":{\"kind\":\"webhook\",\"url\":\"$SINK_URL/echo/ok\",\"headers\":{\"X-Api-Key\":\"sekrit-123\"}}}")
OK_ID=$(json_field id "$S_OK")
OK_SECRET=$(json_field secret "$S_OK")
[[ -n $OK_ID && $OK_SECRET == whsec_* ]] || fatal "subscription not created: $S_OK"
subscription_wait_verified "$OK_ID" ||
    fail "the background probe did not verify the /echo destination"

# 2. destinations that fail in known ways, activated by hand
mk() { # mk PATH EVENT_TYPE [EXTRA_JSON] → id
    local s
    s=$(subscription_create "$ACME_KEY" "$(subscription_json "$2" "$SINK_URL$1" "${3:-}")")
    json_field id "$s"
}
FLAKY_ID=$(mk /flaky/3/a flaky.happened) # the probe takes the first 503
DEAD_ID=$(mk /status/500/dead dead.happened ',"retry_schedule":["100ms","100ms"]')
GONE_ID=$(mk /gone/x gone.happened)
OFF_ID=$(mk /ok/off transaction.posted)
for id in "$FLAKY_ID" "$DEAD_ID" "$GONE_ID"; do
    [[ -n $id ]] || fatal "a subscription was not created"
    activate "$id"
done
# OFF stays pending (never verified): it must match nothing
OTHER_SUB=$(subscription_create "$OTHER_KEY" "$(subscription_json '*' "$SINK_URL/ok/other")")
activate "$(json_field id "$OTHER_SUB")"

# 3. events
produce --topic lerian.streaming.delivery --tenant acme --count 20 --id-prefix tx- \
    --type studio.lerian.transaction.posted --payload-bytes 300 >/dev/null
produce --topic lerian.streaming.delivery --tenant acme --count 1 --id-prefix fl- \
    --type studio.lerian.flaky.happened >/dev/null
produce --topic lerian.streaming.delivery --tenant acme --count 1 --id-prefix dd- \
    --type studio.lerian.dead.happened >/dev/null
produce --topic lerian.streaming.delivery --tenant acme --count 1 --id-prefix gg- \
    --type studio.lerian.gone.happened >/dev/null

delivered() { grep -c '"x-lerian-event-type":"transaction.posted"' "$SINK_LOG" 2>/dev/null || true; }
wait_until 30 '(( $(delivered) >= 20 ))' || fail "expected 20 deliveries, got $(delivered)"
assert_eq 20 "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$OK_ID' AND state = 'succeeded'")" \
    "20 jobs succeeded for the verified subscription"
assert_eq 0 "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$OFF_ID'")" \
    "a subscription that is not verified matches nothing"
assert_eq 0 "$(grep '"path":"/ok/other"' "$SINK_LOG" | grep -c '"x-lerian-tenant-id":"acme"')" \
    "another tenant's subscription receives nothing of acme's"

# 4. the request itself, checked like a consumer would
line=$(grep '"x-lerian-event-id":"tx-0"' "$SINK_LOG" | head -n1)
hdr() { sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p" <<<"$line"; }
body=$(sed -n 's/.*"body_b64":"\([^"]*\)".*/\1/p' <<<"$line" | base64 -d)
stored=$(psql_q "SELECT convert_from(payload, 'UTF8') FROM event_inbox WHERE event_id = 'tx-0'")
assert_eq "$stored" "$body" "body = the stored payload bytes"
assert_eq transaction.posted "$(hdr x-lerian-event-type)" "X-Lerian-Event-Type is the event type"
assert_eq acme "$(hdr x-lerian-tenant-id)" "X-Lerian-Tenant-Id"
assert_eq "$OK_ID" "$(hdr x-lerian-subscription-id)" "X-Lerian-Subscription-Id"
assert_eq 1 "$(hdr x-lerian-attempt)" "X-Lerian-Attempt"
assert_eq tx-0 "$(hdr webhook-id)" "webhook-id = ce-id"
assert_eq tx-0 "$(hdr ce-id)" "ce-id header"
assert_eq 1.0 "$(hdr ce-specversion)" "ce-specversion header"
assert_eq studio.lerian.transaction.posted "$(hdr ce-type)" "ce-type header"
assert_eq application/json "$(hdr content-type)" "Content-Type = datacontenttype"
assert_eq sekrit-123 "$(hdr x-api-key)" "destination credential header delivered"
assert_contains "$(hdr user-agent)" "streaming-hub/" "User-Agent"
[[ $(hdr x-lerian-delivery-id) =~ ^[0-9a-f]{8}-[0-9a-f]{4}-7 ]] && pass "X-Lerian-Delivery-Id is a UUIDv7" ||
    fail "X-Lerian-Delivery-Id is not a UUIDv7: $(hdr x-lerian-delivery-id)"
ts=$(hdr x-lerian-timestamp)
keyhex=$(printf '%s' "${OK_SECRET#whsec_}" | base64 -d | od -An -tx1 | tr -d ' \n')
want_lerian=$(printf 'v1:%s.%s' "$ts" "$body" | openssl dgst -sha256 -mac HMAC -macopt "hexkey:$keyhex" | awk '{print $NF}')
assert_eq "v1,sha256=$want_lerian" "$(hdr x-lerian-signature)" "X-Lerian-Signature verifies with openssl"
want_std=$(printf '%s.%s.%s' tx-0 "$(hdr webhook-timestamp)" "$body" |
    openssl dgst -sha256 -mac HMAC -macopt "hexkey:$keyhex" -binary | base64)
assert_eq "v1,$want_std" "$(hdr webhook-signature)" "webhook-signature (Standard Webhooks) verifies with openssl"
if grep -q 'sekrit-123' "$HUB_LOG"; then fail "a credential reached the log"; else pass "no credential in the log"; fi

# 5. retries then success: /flaky/3 fails three times (the probe took one),
#    so deliveries fail twice and the third attempt succeeds
wait_until 20 "[[ \$(psql_q \"SELECT state FROM delivery_jobs WHERE subscription_id = '$FLAKY_ID'\") == succeeded ]]" ||
    fail "flaky job did not succeed"
assert_eq 3 "$(psql_q "SELECT attempt_count FROM delivery_jobs WHERE subscription_id = '$FLAKY_ID'")" "3 attempts"
assert_eq 3 "$(psql_q "SELECT count(*) FROM delivery_attempts a JOIN delivery_jobs j ON j.id = a.job_id WHERE j.subscription_id = '$FLAKY_ID'")" \
    "every attempt recorded"
assert_eq "503,503,200" "$(psql_q "SELECT string_agg(status::text, ',' ORDER BY number) FROM delivery_attempts a JOIN delivery_jobs j ON j.id = a.job_id WHERE j.subscription_id = '$FLAKY_ID'")" \
    "attempt statuses in order"
assert_eq 3 "$(sink_header /flaky/3/a x-lerian-attempt | tail -n1)" "X-Lerian-Attempt counts up"

# 6. exhaustion: 2-step schedule → 3 attempts, then dead
wait_until 20 "[[ \$(psql_q \"SELECT state FROM delivery_jobs WHERE subscription_id = '$DEAD_ID'\") == dead ]]" ||
    fail "exhausted job is not dead"
assert_eq "exhausted|3" "$(psql_q "SELECT reason, attempt_count FROM delivery_jobs WHERE subscription_id = '$DEAD_ID'")" \
    "dead with reason exhausted after 3 attempts"
job=$(psql_q "SELECT id FROM delivery_jobs WHERE subscription_id = '$DEAD_ID'")
resp=$(curl -s -H "Authorization: Bearer $ACME_KEY" "$HUB_URL/v1/deliveries/$job")
assert_contains "$resp" '"state":"dead"' "GET /v1/deliveries/{id} shows the dead job"
assert_contains "$resp" '"attempts":[' "... with its attempts"

# 6a. a malformed schedule stored behind the API's back (SPEC §7.4): the
#     default curve (here 200ms,300ms,400ms → 4 attempts) decides each
#     failure's retry or exhaustion, each counted; the delivery never fails
#     for it
BADS_ID=$(mk /status/500/badsched badsched.happened)
activate "$BADS_ID"
psql_q "UPDATE subscriptions SET retry_schedule = '{abc,0s}' WHERE id = '$BADS_ID'" >/dev/null
fallbacks0=$(metric streaming_hub_retry_schedule_fallbacks_total)
produce --topic lerian.streaming.delivery --tenant acme --count 1 --id-prefix badsched- \
    --type studio.lerian.badsched.happened >/dev/null
wait_until 20 "[[ \$(psql_q \"SELECT state FROM delivery_jobs WHERE subscription_id = '$BADS_ID'\") == dead ]]" ||
    fail "the job with a malformed stored schedule is not dead"
assert_eq "exhausted|4" "$(psql_q "SELECT reason, attempt_count FROM delivery_jobs WHERE subscription_id = '$BADS_ID'")" \
    "a malformed stored schedule falls back to the default curve: 4 attempts"
assert_eq 4 "$(($(metric streaming_hub_retry_schedule_fallbacks_total) - fallbacks0))" \
    "each of its 4 failures (3 retries, then exhaustion) counted in streaming_hub_retry_schedule_fallbacks_total"
assert_eq 1 "$(grep -c 'malformed retry_schedule' "$HUB_LOG")" "one warning (at most one a minute)"

# 6b. an attempt number already recorded (an operator lowered attempt_count by
#     hand): the outcome batch fails once on the attempts' key, the dispatcher
#     switches to the statement that probes for it, and the outcome lands
psql_q "UPDATE delivery_jobs SET attempt_count = 2 WHERE id = $job" >/dev/null
curl -s -o /dev/null -X POST -H "Authorization: Bearer $ACME_KEY" "$HUB_URL/v1/deliveries/$job/redeliver"
wait_until 20 "grep -q 'outcomes now probe for it first' \"\$HUB_LOG\"" ||
    fail "no switch to the probing outcome statement"
wait_until 20 "[[ \$(psql_q \"SELECT state || '|' || attempt_count FROM delivery_jobs WHERE id = $job\") == 'dead|3' ]]" ||
    fail "the outcome of the redelivered job did not land: $(psql_q "SELECT state, attempt_count FROM delivery_jobs WHERE id = $job")"
assert_eq 3 "$(psql_q "SELECT count(*) FROM delivery_attempts WHERE job_id = $job")" \
    "the duplicate attempt number is not recorded twice; the outcome still lands"

# 6c. an outcome the database refuses (here a trigger refuses the attempts of
#     one subscription) is written alone and dropped; the outcomes beside it
#     land, and once the refusal is gone the job, reclaimed, succeeds
REFUSED_ID=$(mk /ok/refused refused.tested)
BESIDE_ID=$(mk /ok/beside beside.tested)
activate "$REFUSED_ID"
activate "$BESIDE_ID"
psql_q "CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS \$\$
        BEGIN
            IF EXISTS (SELECT 1 FROM delivery_jobs WHERE id = NEW.job_id
                                                     AND subscription_id = '$REFUSED_ID') THEN
                RAISE EXCEPTION 'refused by the test';
            END IF;
            RETURN NEW;
        END \$\$;
        CREATE TRIGGER test_refuse BEFORE INSERT ON delivery_attempts
            FOR EACH ROW EXECUTE FUNCTION test_refuse()" >/dev/null
produce --topic lerian.streaming.delivery --tenant acme --count 1 --id-prefix rf- \
    --type studio.lerian.refused.tested >/dev/null &
refused_producer=$!
produce --topic lerian.streaming.delivery --tenant acme --count 40 --id-prefix bs- \
    --type studio.lerian.beside.tested >/dev/null
wait "$refused_producer"
wait_until 20 "[[ \$(psql_q \"SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$BESIDE_ID' AND state = 'succeeded'\") == 40 ]]" ||
    fail "outcomes beside a refused one did not land: $(psql_q "SELECT state, count(*) FROM delivery_jobs WHERE subscription_id = '$BESIDE_ID' GROUP BY 1")"
wait_until 20 "grep -q 'a delivery outcome cannot be recorded' \"\$HUB_LOG\"" ||
    fail "the refused outcome was not reported"
assert_eq "0 false" "$(psql_q "SELECT j.attempt_count || ' ' || (j.state = 'succeeded') FROM delivery_jobs j WHERE j.subscription_id = '$REFUSED_ID'")" \
    "the refused outcome's job is not settled meanwhile"
psql_q "DROP TRIGGER test_refuse ON delivery_attempts; DROP FUNCTION test_refuse()" >/dev/null
wait_until 30 "[[ \$(psql_q \"SELECT state FROM delivery_jobs WHERE subscription_id = '$REFUSED_ID'\") == succeeded ]]" ||
    fail "the refused job did not succeed once the refusal was gone"
assert_ge "$(psql_q "SELECT reclaims FROM delivery_jobs WHERE subscription_id = '$REFUSED_ID'")" 1 \
    "it came back through a reclaim of its expired lease"

# 7. 410 Gone disables the subscription
wait_until 20 "[[ \$(psql_q \"SELECT disabled_reason FROM subscriptions WHERE id = '$GONE_ID'\") == gone ]]" ||
    fail "410 did not disable the subscription"
assert_eq f "$(psql_q "SELECT enabled FROM subscriptions WHERE id = '$GONE_ID'")" "enabled=false after 410"
assert_eq parked "$(psql_q "SELECT state FROM delivery_jobs WHERE subscription_id = '$GONE_ID'")" \
    "its job is parked, not attempted again"

# 8. fifo: one in flight, a failing head blocks the ones behind it
FIFO_ID=$(mk /flaky/3/fifo fifo.tested ',"ordering":"fifo"') # probe takes one 503
activate "$FIFO_ID"
produce --topic lerian.streaming.delivery --tenant acme --count 5 --id-prefix ff- \
    --type studio.lerian.fifo.tested --partitions 1 >/dev/null
wait_until 20 "[[ \$(psql_q \"SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$FIFO_ID' AND state = 'succeeded'\") == 5 ]]" ||
    fail "fifo jobs not all delivered"
order=$(grep '"path":"/flaky/3/fifo"' "$SINK_LOG" | grep -o '"x-lerian-event-id":"ff-[0-9]*"' |
    sed 's/.*"\(ff-[0-9]*\)"/\1/' | tr '\n' ' ')
assert_eq "ff-0 ff-0 ff-0 ff-1 ff-2 ff-3 ff-4 " "$order" "fifo: the head is retried until it succeeds, then the rest in order"

# 9. max_rate: deferred over the rate, not failed
RATE_ID=$(mk /ok/rate rate.tested ',"max_rate":5')
activate "$RATE_ID"
produce --topic lerian.streaming.delivery --tenant acme --count 20 --id-prefix rt- \
    --type studio.lerian.rate.tested >/dev/null
wait_until 30 "[[ \$(psql_q \"SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$RATE_ID' AND state = 'succeeded'\") == 20 ]]" ||
    fail "rate-limited jobs not all delivered"
span=$(grep '"path":"/ok/rate"' "$SINK_LOG" | grep '"x-lerian-event-type":"rate.tested"' |
    sed -n 's/^{"ts_ms":\([0-9]*\).*/\1/p' | sort -n | awk 'NR == 1 { f = $1 } { l = $1 } END { print l - f }')
assert_ge "$span" 2500 "20 deliveries at max_rate 5/s take at least 2.5 s (took ${span} ms)"
assert_ge "$(metric 'streaming_hub_deliveries_total{outcome="deferred"}')" 1 "deferred counted"
assert_eq 0 "$(psql_q "SELECT count(*) FROM delivery_attempts a JOIN delivery_jobs j ON j.id = a.job_id WHERE j.subscription_id = '$RATE_ID' AND a.status <> 200")" \
    "deferral is not a failed attempt"

# 9b. a rate far below one a day: the first job goes, the next waits no
# longer than the longest retry step (10 h) instead of a delay no timestamp
# holds, which made every outcome batch carrying it fail (the later
# sections need the outcomes to flow)
SLOW_ID=$(mk /ok/slowrate slowrate.tested ',"max_rate":1e-13')
activate "$SLOW_ID"
produce --topic lerian.streaming.delivery --tenant acme --count 2 --id-prefix sr- \
    --type studio.lerian.slowrate.tested --partitions 1 >/dev/null
wait_until 20 "[[ \$(psql_q \"SELECT count(*) FILTER (WHERE state = 'succeeded') || '/' || count(*) FILTER (WHERE state = 'pending' AND attempt_count = 0 AND next_attempt_at > now() + interval '9 hours') FROM delivery_jobs WHERE subscription_id = '$SLOW_ID'\") == 1/1 ]]" ||
    fail "max_rate 1e-13: not one job delivered and one deferred"
assert_eq t "$(psql_q "SELECT max(next_attempt_at) <= now() + interval '10 hours' FROM delivery_jobs WHERE subscription_id = '$SLOW_ID'")" \
    "max_rate 1e-13: deferred by 10 h at most"

# stored_events PREFIX COUNT TYPE BYTES: produces COUNT events of acme with
# ids PREFIX-n and waits until they are stored
stored_events() {
    produce --topic lerian.streaming.delivery --tenant acme --count "$2" --id-prefix "$1-" \
        --type "studio.lerian.$3" --payload-bytes "$4" >/dev/null
    wait_until 30 "[[ \$(psql_q \"SELECT count(*) FROM event_inbox WHERE event_id LIKE '$1-%'\") == $2 ]]"
}
# backlog_jobs SUB PREFIX: a due job of SUB for each stored event PREFIX-n, all
# at once (a backlog, not matching as events arrive)
backlog_jobs() {
    psql_q "INSERT INTO delivery_jobs (subscription_id, tenant_id, event_seq, event_day, event_id, event_type)
            SELECT '$1', tenant_id, seq, day, event_id, event_type FROM event_inbox
             WHERE event_id LIKE '$2-%'" >/dev/null
}
# backlog_delivered SUB COUNT: waits until COUNT jobs of SUB succeeded
backlog_delivered() {
    wait_until 60 "[[ \$(psql_q \"SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$1' AND state = 'succeeded'\") == $2 ]]"
}
job_states() { psql_q "SELECT state, count(*) FROM delivery_jobs WHERE subscription_id = '$1' GROUP BY 1"; }
# sink_event_ids PATH PREFIX: the event id of each request the sink got at PATH
# whose id starts with PREFIX-
sink_event_ids() { sink_header "$1" X-Lerian-Event-Id | grep "^$2-"; }

# 10. a backlog whose events are stored under two days: after a full claim
#     the next one leaves its lookups to the load, which reads each day's
#     partition with a statement of its own; every job is delivered
stored_events dy 48 days.tested 100 || fail "the two-day events were not stored"
psql_q "UPDATE event_inbox SET day = day - 1 WHERE event_id LIKE 'dy-%' AND seq % 2 = 0" >/dev/null
DAYS_ID=$(mk /ok/days days.tested)
activate "$DAYS_ID"
backlog_jobs "$DAYS_ID" dy
assert_eq 2 "$(psql_q "SELECT count(DISTINCT event_day) FROM delivery_jobs WHERE subscription_id = '$DAYS_ID'")" \
    "the backlog's events are under two days"
backlog_delivered "$DAYS_ID" 48 ||
    fail "jobs of a two-day backlog were not all delivered: $(job_states "$DAYS_ID")"
assert_eq 48 "$(sink_event_ids /ok/days dy | sort -u | wc -l)" \
    "the sink received each of the 48 events"
assert_eq 0 "$(psql_q "SELECT sum(reclaims) FROM delivery_jobs WHERE subscription_id = '$DAYS_ID'")" \
    "none waited for its lease to expire (every loaded job went out)"

# 10b. a backlog of 1,200 jobs due at once, drained by consecutive full
#     claims (each leaving its lookups to the load, each tenant's next claim
#     starting at its floor): no job is claimed twice, each goes out once
stored_events bl 1200 backlog.tested 64 || fail "the backlog's events were not stored"
BACKLOG_ID=$(mk /ok/backlog backlog.tested)
activate "$BACKLOG_ID"
backlog_jobs "$BACKLOG_ID" bl
backlog_delivered "$BACKLOG_ID" 1200 ||
    fail "the backlog was not delivered: $(job_states "$BACKLOG_ID")"
assert_eq "1200×1" "$(psql_q "SELECT string_agg(n || '×' || attempt_count, ' ') FROM (SELECT attempt_count, count(*) n FROM delivery_jobs WHERE subscription_id = '$BACKLOG_ID' GROUP BY 1) x")" \
    "each backlog job was attempted once"
assert_eq 1200 "$(psql_q "SELECT count(*) FROM delivery_attempts a JOIN delivery_jobs j ON j.id = a.job_id WHERE j.subscription_id = '$BACKLOG_ID'")" \
    "one attempt recorded per backlog job"
assert_eq "1200 1200" "$(sink_event_ids /ok/backlog bl | sort | uniq -c | awk '{n++; t+=$1} END {print n, t}')" \
    "the sink received each of the 1,200 events once"

# 11. metrics
assert_ge "$(metric 'streaming_hub_deliveries_total{outcome="succeeded"}')" 21 "succeeded counted"
assert_ge "$(metric 'streaming_hub_deliveries_total{outcome="failed"}')" 5 "failed counted"
assert_ge "$(metric 'streaming_hub_deliveries_total{outcome="dead"}')" 1 "dead counted"

hub_test_done
