#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# Out of memory is a transient failure, never a verdict (issue 23 item 7):
# the test binary streaming-hub-faults (tests/support/faults.c) makes chosen
# allocations fail while it runs, and every record still ends with exactly
# one verdict, the one it would have had:
#
#   - a Kafka record that cannot enter its partition's queue is read again
#     (the partition is sought back to it), and no offset is committed past
#     it: every event is stored once, none lost;
#   - a Kafka record whose headers or envelope cannot be read fails the
#     batch, which is retried: stored, not quarantined, counted once;
#   - an array of a statement that cannot be built fails the transaction
#     as a whole, never committing it without that statement: the Kafka
#     batch is retried, the HTTP request answered 503 with nothing stored;
#   - an HTTP event whose envelope cannot be parsed is answered 503 (alone
#     in a batch: that element only), nothing stored or quarantined, and a
#     retry is stored.
#
# The hub runs without a KEK (no dispatcher) and flushes its per-tenant
# counts (which build arrays too) once a minute, past any scenario: ingest is
# the only user of the fault points, so a test arms exactly the allocation it
# means.
#
# No `set -e`: every check below is an explicit assertion.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/ingest_http.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/ingest_http.sh"

TOPIC=lerian.streaming.faults
M='streaming_hub_ingest_records_total'

setup() {
    command -v jq >/dev/null || fatal "jq is required by this test"
    [[ -x $BUILD/streaming-hub-faults ]] || fatal "no $BUILD/streaming-hub-faults (build first)"
    pg_start
    kafka_start --topic "$TOPIC:2"
    FAULTS=$WORK/faults
    mkdir -p "$FAULTS"
    HUB_BIN=$BUILD/streaming-hub-faults
    hub_shared STREAMING_HUB_TEST_FAULTS_DIR="$FAULTS" STREAMING_HUB_STATS_FLUSH_INTERVAL=60s
}

# arm POINT SPEC: the next calls at POINT fail as SPEC says ("N", or
# "PASS FAIL"); disarm POINT: none does.
arm() {
    echo "$2" >"$FAULTS/$1"
}

disarm() {
    rm -f "$FAULTS/$1"
}

# injected POINT: faults injected at POINT so far (the hub's log).
injected() {
    grep -F '"msg":"test fault injected"' "$HUB_LOG" | grep -c "\"point\":\"$1\""
}

# produce_own N PREFIX: N events of the scenario's tenant over both partitions.
produce_own() {
    produce --topic "$TOPIC" --tenant "$(own_id)" --count "$1" --id-prefix "$2" --partitions 2 ||
        fail "producing $1 events failed"
}

# stored_once N PREFIX: the N events are each stored once, nothing of the
# tenant quarantined.
stored_once() {
    local t
    t=$(own_id)
    wait_sql 30 "$1" "SELECT count(*) FROM event_inbox WHERE tenant_id = '$t' AND event_id LIKE '$2%'" ||
        fail "only $(inbox_count "tenant_id = '$t'") of $1 events stored"
    assert_eq "$1" "$(psql_q "SELECT count(DISTINCT event_id) FROM event_inbox WHERE tenant_id = '$t' AND event_id LIKE '$2%'")" \
        "all $1 events are stored, once each"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM quarantine WHERE tenant_id = '$t' OR tenant_id IS NULL")" \
        "nothing quarantined"
}

scenario_kafka_record_not_taken_is_read_again() {
    local r0 acc0 i0
    tenant_create "$(own_id)" >/dev/null
    r0=$(metric streaming_hub_ingest_kafka_refetches_total)
    acc0=$(metric "$M{verdict=\"accepted\",reason=\"\"}")
    i0=$(injected kafka_take)
    arm kafka_take "5 3" # the 6th record taken fails, and twice more when read again
    produce_own 60 take-
    stored_once 60 take-
    assert_eq 3 "$(($(injected kafka_take) - i0))" "three records could not be taken"
    assert_ge "$(metric_delta streaming_hub_ingest_kafka_refetches_total "$r0")" 1 \
        "counted in streaming_hub_ingest_kafka_refetches_total"
    assert_eq 60 "$(metric_delta "$M{verdict=\"accepted\",reason=\"\"}" "$acc0")" "60 accepted, counted once each"
    grep -qF 'kafka record not taken (out of memory)' "$HUB_LOG" && pass "logged" || fail "not logged"
    disarm kafka_take
    # the committed offsets never passed a record not stored: a new hub
    # reads nothing again (no duplicate verdict)
    hub_stop
    hub_start_shared
    sleep 3
    assert_eq 0 "$(metric "$M{verdict=\"duplicate\",reason=\"\"}")" "a new hub reads no record twice"
    assert_eq 60 "$(inbox_count "tenant_id = '$(own_id)'")" "... and stores nothing more"
}

scenario_kafka_headers_out_of_memory_is_retried() {
    local acc0 q0
    tenant_create "$(own_id)" >/dev/null
    acc0=$(metric "$M{verdict=\"accepted\",reason=\"\"}")
    q0=$(metric "$M{verdict=\"quarantined\",reason=\"invalid_envelope\"}")
    arm kafka_headers 1
    produce_own 20 hdr-
    stored_once 20 hdr-
    assert_eq 1 "$(injected kafka_headers)" "one record's headers could not be read"
    assert_eq 20 "$(metric_delta "$M{verdict=\"accepted\",reason=\"\"}" "$acc0")" "20 accepted, counted once each"
    assert_eq 0 "$(metric_delta "$M{verdict=\"quarantined\",reason=\"invalid_envelope\"}" "$q0")" \
        "none counted invalid"
    disarm kafka_headers
}

scenario_kafka_envelope_out_of_memory_is_retried() {
    local acc0
    tenant_create "$(own_id)" >/dev/null
    acc0=$(metric "$M{verdict=\"accepted\",reason=\"\"}")
    arm envelope_alloc "3 2"
    produce_own 20 env-
    stored_once 20 env-
    assert_eq 20 "$(metric_delta "$M{verdict=\"accepted\",reason=\"\"}" "$acc0")" "20 accepted, counted once each"
    disarm envelope_alloc
}

scenario_kafka_array_out_of_memory_fails_the_transaction() {
    local f0
    tenant_create "$(own_id)" >/dev/null
    f0=$(metric streaming_hub_ingest_batch_failures_total)
    arm pg_array 1
    produce_own 20 arr-
    stored_once 20 arr-
    assert_ge "$(metric_delta streaming_hub_ingest_batch_failures_total "$f0")" 1 \
        "the batch whose array could not be built failed (and was retried)"
    disarm pg_array
}

scenario_http_envelope_out_of_memory_is_503() {
    own_client
    arm envelope_alloc 1
    ev_post "$KEY" oom-1 >/dev/null
    assert_eq 503 "$(http_status)" "an event the API could not parse for lack of memory: 503"
    assert_match "$(last_header retry-after)" '^[0-9]+$' "... with Retry-After"
    assert_eq "0 0" "$(psql_q "SELECT (SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT'),
                                      (SELECT count(*) FROM quarantine WHERE tenant_id = '$TENANT')" | tr '|' ' ')" \
        "nothing stored, nothing quarantined"
    ev_post "$KEY" oom-1 >/dev/null
    assert_eq 202 "$(http_status)" "the retry is stored"
    arm envelope_alloc "1 1"
    ev_batch "$KEY" "$(ev_json ob-1)" "$(ev_json ob-2)" "$(ev_json ob-3)" >/dev/null
    assert_eq 207 "$(http_status)" "a batch whose second event could not be parsed: 207"
    assert_eq "202 503 202" "$(last_body | jq -r '[.results[].status] | join(" ")')" \
        "... that element 503, the others stored"
    assert_eq "ob-1 ob-3" "$(psql_q "SELECT string_agg(event_id, ' ' ORDER BY event_id) FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id LIKE 'ob-%'")" \
        "... and only those stored"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM quarantine WHERE tenant_id = '$TENANT'")" "nothing quarantined"
    disarm envelope_alloc
}

scenario_http_array_out_of_memory_is_503_nothing_stored() {
    own_client
    arm pg_array 1
    ev_post "$KEY" arr-1 >/dev/null
    assert_eq 503 "$(http_status)" "a request whose statement could not be built: 503"
    assert_match "$(last_header retry-after)" '^[0-9]+$' "... with Retry-After"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT'")" "nothing stored"
    disarm pg_array
    ev_post "$KEY" arr-1 >/dev/null
    assert_eq 202 "$(http_status)" "the retry is stored"
}

scenarios_main "$@"
