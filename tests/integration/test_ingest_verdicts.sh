#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# Every ingest verdict and reason end to end through Kafka (SPEC §3.1, §3.2):
# records produced with hub-produce and hand-crafted with kcat reach the hub
# through the external mock cluster; the test checks the verdict counters,
# the stored inbox rows (exact payload bytes, derived event type, schema
# major), the quarantine evidence, the admin quarantine API, and that nothing
# of an unknown or inactive tenant is stored anywhere.
#
# Every scenario produces as tenants of its own; the verdict counters are
# shared, so each counts the verdicts its own records got (the growth since
# it started), and waits for them by that count.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"

TOPIC=lerian.streaming.test
TOPIC_V2=lerian.streaming.test.v2
M='streaming_hub_ingest_records_total'

setup() {
    F=$WORK/files
    make_files
    pg_start
    kafka_start --topic "$TOPIC:1" --topic "$TOPIC_V2:1"
    hub_shared STREAMING_HUB_MAX_EVENT_BYTES=2048
}

# make_files: the payloads the scenarios send, in $F.
make_files() {
    mkdir -p "$F"
    # A payload whose exact bytes (spacing, UTF-8, trailing newline) must survive.
    printf '{ "amount" : 1500,\t"currency":"BRL", "memo":"caf\xc3\xa9 \xe2\x98\x95", "n":[1, 2 ,3] }\n' \
        >"$F/exact.json"
    printf '{"v":2}' >"$F/small.json"
    printf '{"ok":true}' >"$F/ok.json"
    printf '{"broken": tru' >"$F/bad.json"
    head -c 3000 /dev/zero | tr '\0' 'a' | sed 's/^/{"big":"/; s/$/"}/' >"$F/big.json"
    printf '{"first":1}' >"$F/first.json"
    printf '{"second":2}' >"$F/second.json"
    printf '{"n":1e400,"s":"\\u00e9"}' >"$F/big-number.json" # well-formed, beyond a double
    printf '[1,2' >"$F/cut.json"
    printf '{"a":1}' >"$F/a1.json"
    printf '{"a":"\xff"}' >"$F/latin.json" # not UTF-8
}

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

# rec ID SOURCE [EDIT ...]: builds the header list H of a valid binary-mode
# record for tenant $TENANT, then applies each EDIT of headers_edit
# (NAME=VALUE replaces or adds, -NAME removes, +NAME=VALUE repeats).
rec() {
    local id=$1 source=$2
    shift 2
    H=("ce-specversion=1.0" "ce-id=$id" "ce-source=$source"
        "ce-type=studio.lerian.transaction.posted" "ce-time=$(now3339)"
        "ce-tenantid=$TENANT" "content-type=application/json")
    headers_edit "$@"
}

# send TOPIC FILE: produces the file's bytes as one record with headers H to
# partition 0 of TOPIC.
send() {
    local topic=$1 file=$2 h args=()
    for h in "${H[@]}"; do
        args+=(-H "$h")
    done
    kcat -P -b "$STREAMING_HUB_KAFKA_BROKERS" -t "$topic" -p 0 "${args[@]}" "$file" ||
        fail "kcat could not produce $file to $topic"
}

# produce_as ARGS...: hub-produce as $TENANT
produce_as() {
    produce --topic "$TOPIC" --tenant "$TENANT" "$@"
}

# Sum of every verdict counter.
verdict_total() {
    curl -s --max-time 10 "$HUB_URL/metrics" |
        awk -v n="$M" 'index($1, n "{") == 1 { s += $2 } END { print s + 0 }'
}

# verdict VERDICT REASON: one verdict counter.
verdict() {
    metric "$M{verdict=\"$1\",reason=\"$2\"}"
}

# counters_start: reads the counters this scenario compares with (growth()),
# and the verdict total wait_records counts from.
counters_start() {
    local v r
    EXPECTED_TOTAL=$(verdict_total)
    VERDICTS0=$EXPECTED_TOTAL
    declare -gA AT_START
    for v in accepted:'' duplicate:'' quarantined:invalid_envelope quarantined:too_large \
        quarantined:digest_conflict dropped:unknown_tenant dropped:inactive_tenant; do
        r=${v#*:}
        # shellcheck disable=SC2034 # read by growth
        AT_START[$v]=$(verdict "${v%%:*}" "$r")
    done
}

# growth VERDICT REASON: how many verdicts of that kind since counters_start.
growth() {
    local now
    now=$(verdict "$1" "$2")
    echo $((now - AT_START["$1:$2"]))
}

# wait_records N MSG: wait until N more records got a verdict.
wait_records() {
    EXPECTED_TOTAL=$((EXPECTED_TOTAL + $1))
    if ! wait_until 60 "[[ \$(verdict_total) -ge $EXPECTED_TOTAL ]]"; then
        fail "$2: only $(verdict_total) of $EXPECTED_TOTAL records got a verdict within 60 s"
    fi
}

# quarantine_row SOURCE: "reason|field" of the quarantine row whose headers
# carry that ce-source (found through the headers: an invalid envelope's
# columns may be empty).
quarantine_row() {
    psql_q "SELECT reason || '|' || coalesce(field, '') FROM quarantine
             WHERE headers::text LIKE '%$1\"%' ORDER BY id"
}

# ---------------------------------------------------------------------------
# accepted: exact bytes, derived event type, schema major
# ---------------------------------------------------------------------------

scenario_accepted_records_are_stored_byte_for_byte() {
    local out exact_md5
    TENANT=$(own_tenant)
    counters_start
    exact_md5=$(md5sum <"$F/exact.json" | cut -d' ' -f1)
    out=$(produce_as --count 3 --id-prefix pf- --source /test/exact --payload-file "$F/exact.json")
    assert_contains "$out" "produced 3 failed 0" "hub-produce: 3 exact-payload records"
    produce_as --count 20 --id-prefix gen- --payload-bytes 300 --source /test/gen >/dev/null ||
        fail "hub-produce gen-"
    # The CloudEvents Kafka binding's ce_ spelling.
    produce_as --count 2 --id-prefix us- --prefix ce_ --source /test/underscore >/dev/null ||
        fail "hub-produce ce_"
    wait_records 25 "hub-produce records"

    assert_eq 25 "$(growth accepted '')" "25 records accepted"
    assert_eq 25 "$(inbox_count "tenant_id = '$TENANT'")" "25 rows in event_inbox"
    assert_eq 3 "$(inbox_count "tenant_id = '$TENANT' AND source = '/test/exact' AND md5(payload) = '$exact_md5'")" \
        "stored payload bytes are exactly the produced bytes"
    assert_eq "$(od -An -tx1 -v "$F/exact.json" | tr -d ' \n')" \
        "$(psql_q "SELECT encode(payload, 'hex') FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'pf-0'")" \
        "payload of pf-0 byte for byte"
    assert_eq "transaction.posted|studio.lerian.transaction.posted|1|application/json|$TOPIC" \
        "$(psql_q "SELECT event_type, ce_type, schema_major, content_type, topic
                     FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'pf-1'")" \
        "event type derived from ce-type, schema major 1, topic kept"
    assert_eq 20 "$(inbox_count "tenant_id = '$TENANT' AND source = '/test/gen'
                                 AND length(payload) BETWEEN 290 AND 310
                                 AND convert_from(payload, 'UTF8')::jsonb ? 'seq'")" \
        "20 generated JSON payloads stored"
    assert_eq 2 "$(inbox_count "source = '/test/underscore' AND event_id IN ('us-0', 'us-1')
                                AND tenant_id = '$TENANT'")" \
        "ce_ header spelling accepted"
    assert_eq 0 "$(inbox_count "tenant_id = '$TENANT' AND (kafka_partition IS NULL
                                OR kafka_offset IS NULL OR topic IS NULL)")" \
        "every stored row has topic, partition and offset"
    assert_eq 25 "$(psql_q "SELECT count(DISTINCT seq) FROM event_inbox WHERE tenant_id = '$TENANT'")" \
        "every stored event has its own arrival sequence"
}

# Structured mode: the payload is the data member exactly as in the JSON
# text; schema major from the topic and schemaversion; event types derived.
scenario_structured_records_and_schema_majors() {
    TENANT=$(own_tenant)
    counters_start
    cat >"$WORK/structured.json" <<EOF
{"specversion":"1.0","id":"st-1","source":"/test/structured","type":"studio.lerian.ledger.balance.config-changed",
 "time":"2024-05-01T10:00:00.5+02:00","tenantid":"$TENANT","datacontenttype":"application/json",
 "data":{"k": [1, 2 ,3], "s":"x"}}
EOF
    H=("content-type=application/cloudevents+json")
    send "$TOPIC" "$WORK/structured.json"
    # ... and data_base64 ("hello, bytes\0\1" base64-encoded).
    cat >"$WORK/structured-b64.json" <<EOF
{"specversion":"1.0","id":"st-2","source":"/test/structured","type":"studio.lerian.file.uploaded",
 "time":"$(now3339)","tenantid":"$TENANT","datacontenttype":"application/octet-stream",
 "data_base64":"aGVsbG8sIGJ5dGVzAAE="}
EOF
    send "$TOPIC" "$WORK/structured-b64.json"

    # Topic .v2 suffix → schema major 2; schemaversion wins over the topic.
    rec v2-1 /test/schema
    send "$TOPIC_V2" "$F/small.json"
    rec sv-3 /test/schema ce-schemaversion=v3.1.0
    send "$TOPIC_V2" "$F/small.json"
    rec sv-1 /test/schema ce-schemaversion=1.4.2
    send "$TOPIC" "$F/small.json"
    # resourcetype + eventtype → event type; traceparent kept.
    rec rt-1 /test/rt ce-resourcetype=account ce-eventtype=frozen \
        traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
    send "$TOPIC" "$F/small.json"
    # A repeated header: the last one wins.
    rec rep-1 /test/repeat +ce-type=studio.lerian.account.created
    send "$TOPIC" "$F/small.json"
    wait_records 7 "structured/schema/repeat records"

    assert_eq 7 "$(growth accepted '')" "7 records accepted"
    assert_eq "balance.config-changed|application/json|t" \
        "$(psql_q "SELECT event_type, content_type,
                          event_time = '2024-05-01T08:00:00.5Z'::timestamptz
                     FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'st-1'")" \
        "structured mode accepted: event type, content type, time with offset"
    assert_eq '{"k": [1, 2 ,3], "s":"x"}' \
        "$(psql_q "SELECT convert_from(payload, 'UTF8') FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'st-1'")" \
        "structured mode payload is the data member exactly as received"
    assert_eq "68656c6c6f2c2062797465730001|application/octet-stream|file.uploaded" \
        "$(psql_q "SELECT encode(payload, 'hex'), content_type, event_type
                     FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'st-2'")" \
        "structured mode data_base64 is stored decoded"
    assert_eq "sv-1:1 sv-3:3 v2-1:2" \
        "$(psql_q "SELECT string_agg(event_id || ':' || schema_major, ' ' ORDER BY event_id)
                     FROM event_inbox WHERE tenant_id = '$TENANT' AND source = '/test/schema'")" \
        "schema major from the topic suffix and from schemaversion"
    assert_eq "account.frozen" \
        "$(psql_q "SELECT event_type FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'rt-1'")" \
        "event type = resourcetype.eventtype"
    assert_eq 1 "$(inbox_count "tenant_id = '$TENANT' AND event_id = 'rt-1'
                                AND headers::text LIKE '%4bf92f3577b34da6a3ce929d0e0e4736%'")" \
        "traceparent kept with the stored event"
    assert_eq "studio.lerian.account.created|account.created" \
        "$(psql_q "SELECT ce_type, event_type FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'rep-1'")" \
        "repeated header: the last one wins"
}

# ---------------------------------------------------------------------------
# quarantined: invalid_envelope (one record per field at fault), too_large
# ---------------------------------------------------------------------------

scenario_invalid_records_are_quarantined_naming_the_field() {
    local bad_md5
    TENANT=$(own_tenant)
    counters_start
    bad_md5=$(md5sum <"$F/bad.json" | cut -d' ' -f1)
    rec unused /test/bad/missing-id -ce-id
    send "$TOPIC" "$F/ok.json"
    rec bad-spec /test/bad/specversion ce-specversion=0.3
    send "$TOPIC" "$F/ok.json"
    rec bad-time /test/bad/time "ce-time=yesterday at noon"
    send "$TOPIC" "$F/ok.json"
    rec bad-ctl /test/bad/control $'ce-subject=bad\x01subject'
    send "$TOPIC" "$F/ok.json"
    rec bad-sv /test/bad/schemaversion ce-schemaversion=x
    send "$TOPIC" "$F/ok.json"
    rec bad-json /test/bad/json
    send "$TOPIC" "$F/bad.json"
    rec big-1 /test/bad/too-large
    send "$TOPIC" "$F/big.json"
    wait_records 7 "invalid records"

    assert_eq 6 "$(growth quarantined invalid_envelope)" "6 records quarantined invalid_envelope"
    assert_eq 1 "$(growth quarantined too_large)" "1 record quarantined too_large"
    assert_eq 0 "$(growth accepted '')" "invalid records were not accepted"

    assert_eq "invalid_envelope|id" "$(quarantine_row /test/bad/missing-id)" "missing id → field id"
    assert_eq "invalid_envelope|specversion" "$(quarantine_row /test/bad/specversion)" \
        "specversion 0.3 → field specversion"
    assert_eq "invalid_envelope|time" "$(quarantine_row /test/bad/time)" "bad time → field time"
    assert_eq "invalid_envelope|subject" "$(quarantine_row /test/bad/control)" \
        "control character in ce-subject → field subject"
    assert_eq "invalid_envelope|schemaversion" "$(quarantine_row /test/bad/schemaversion)" \
        "schemaversion x → field schemaversion"
    assert_eq "invalid_envelope|data" "$(quarantine_row /test/bad/json)" \
        "malformed JSON payload → field data"
    assert_eq "too_large|data" "$(quarantine_row /test/bad/too-large)" "3 KB payload → too_large, data"
    assert_eq "$bad_md5|$TOPIC|0|t" \
        "$(psql_q "SELECT md5(value), topic, kafka_partition, kafka_offset >= 0 FROM quarantine
                    WHERE headers::text LIKE '%/test/bad/json\"%'")" \
        "quarantine keeps the raw value, topic, partition and offset"
    assert_eq 0 "$(inbox_count "source LIKE '/test/bad/%'")" \
        "no invalid record in event_inbox"
}

# A record's headers were counted nowhere (the pending budget and
# librdkafka's count values) and parsed whole on the loop, then copied
# into JSON evidence: a producer's records of a few bytes could carry a
# megabyte of headers each.  Past 256 headers or 64 KiB they are
# quarantined too_large, field headers, their evidence left out; the
# partition goes on.
scenario_records_with_too_many_headers_are_quarantined() {
    local i extra=() big
    TENANT=$(own_tenant)
    counters_start
    for i in $(seq 1 300); do
        extra+=("+x-h$i=v$i")
    done
    rec many-hdrs /test/bad/many-headers "${extra[@]}"
    send "$TOPIC" "$F/ok.json"
    big=$(head -c 70000 /dev/zero | tr '\0' 'a')
    rec big-hdrs /test/bad/big-headers "+x-big=$big"
    send "$TOPIC" "$F/ok.json"
    rec after-hdrs /test/ok/after-headers
    send "$TOPIC" "$F/ok.json"
    wait_records 3 "records with too many headers"
    assert_eq 2 "$(growth quarantined too_large)" "both quarantined too_large"
    assert_eq "too_large|headers|[]" \
        "$(psql_q "SELECT reason || '|' || field || '|' || headers::text FROM quarantine
                    WHERE source = '/test/bad/many-headers'")" "300 headers: field headers, evidence left out"
    assert_eq "too_large|headers|[]" \
        "$(psql_q "SELECT reason || '|' || field || '|' || headers::text FROM quarantine
                    WHERE source = '/test/bad/big-headers'")" "70 KB of headers: the same"
    assert_eq 1 "$(inbox_count "source = '/test/ok/after-headers'")" "the next record is stored"
}

# ---------------------------------------------------------------------------
# dropped: unknown and inactive tenants leave no trace
# ---------------------------------------------------------------------------

scenario_unknown_and_inactive_tenants_leave_no_trace() {
    local ghost sleepy
    ghost=$(own_id ghost)
    sleepy=$(own_tenant sleepy inactive)
    counters_start
    produce --topic "$TOPIC" --tenant "$ghost" --count 2 --id-prefix ghost- --source /test/ghost \
        >/dev/null || fail "hub-produce ghost"
    produce --topic "$TOPIC" --tenant "$sleepy" --count 2 --id-prefix sleepy- --source /test/sleepy \
        >/dev/null || fail "hub-produce sleepy"
    wait_records 4 "unknown/inactive tenant records"

    assert_eq 2 "$(growth dropped unknown_tenant)" "2 records dropped unknown_tenant"
    assert_eq 2 "$(growth dropped inactive_tenant)" "2 records dropped inactive_tenant"
    assert_eq 0 "$(psql_q "SELECT (SELECT count(*) FROM event_inbox
                                    WHERE tenant_id IN ('$ghost', '$sleepy')
                                       OR source IN ('/test/ghost', '/test/sleepy'))
                         + (SELECT count(*) FROM quarantine
                                    WHERE tenant_id IN ('$ghost', '$sleepy')
                                       OR headers::text LIKE '%/test/ghost%'
                                       OR headers::text LIKE '%/test/sleepy%')")" \
        "nothing of an unknown or inactive tenant is stored"
}

# ---------------------------------------------------------------------------
# duplicate and digest_conflict
# ---------------------------------------------------------------------------

scenario_duplicates_are_absorbed_and_conflicts_quarantined() {
    TENANT=$(own_tenant)
    counters_start
    produce_as --count 3 --id-prefix pf- --source /test/exact --payload-file "$F/exact.json" \
        >/dev/null || fail "hub-produce pf-"
    wait_records 3 "pf-0..2"
    rec dup-1 /test/dup
    send "$TOPIC" "$F/first.json"
    wait_records 1 "dup-1"
    rec dup-1 /test/dup
    send "$TOPIC" "$F/first.json"
    wait_records 1 "dup-1 again"
    assert_eq 1 "$(growth duplicate '')" "same key, same payload → duplicate"
    # Replaying a whole range is absorbed the same way.
    produce_as --count 3 --id-prefix pf- --source /test/exact --payload-file "$F/exact.json" \
        >/dev/null || fail "hub-produce replay"
    wait_records 3 "replay of pf-0..2"
    assert_eq 4 "$(growth duplicate '')" "replayed records counted as duplicates"

    rec dup-1 /test/dup
    send "$TOPIC" "$F/second.json"
    wait_records 1 "dup-1 with another payload"
    assert_eq 1 "$(growth quarantined digest_conflict)" "same key, other payload → digest_conflict"
    assert_eq "1|7b226669727374223a317d" \
        "$(psql_q "SELECT count(*), min(encode(payload, 'hex')) FROM event_inbox
                    WHERE tenant_id = '$TENANT' AND source = '/test/dup' AND event_id = 'dup-1'")" \
        "the first stored event is kept, never overwritten"
    assert_eq "digest_conflict|$TENANT|/test/dup|dup-1|$(printf '{"second":2}' | md5sum | cut -d' ' -f1)" \
        "$(psql_q "SELECT reason, tenant_id, source, event_id, md5(value) FROM quarantine
                    WHERE reason = 'digest_conflict' AND tenant_id = '$TENANT'")" \
        "digest conflict quarantined with its key and the conflicting value"
    assert_eq 3 "$(inbox_count "tenant_id = '$TENANT' AND source = '/test/exact'")" \
        "replayed records not stored twice"
}

# ---------------------------------------------------------------------------
# the tally: every record gets exactly one verdict
# ---------------------------------------------------------------------------

scenario_every_record_gets_exactly_one_verdict() {
    local q0 stored
    TENANT=$(own_tenant)
    counters_start
    q0=$(psql_q "SELECT count(*) FROM quarantine")
    # 6 accepted, a duplicate, a conflict, an invalid envelope, one too
    # large, two of an unknown tenant: 12 records
    produce_as --count 5 --id-prefix tally- --source /test/tally >/dev/null || fail "hub-produce tally"
    wait_records 5 "the accepted records"
    rec dup-1 /test/tally-dup
    send "$TOPIC" "$F/first.json"
    send "$TOPIC" "$F/first.json"
    send "$TOPIC" "$F/second.json"
    rec bad-time /test/tally-bad "ce-time=yesterday at noon"
    send "$TOPIC" "$F/ok.json"
    rec big-1 /test/tally-big
    send "$TOPIC" "$F/big.json"
    produce --topic "$TOPIC" --tenant "$(own_id ghost)" --count 2 --id-prefix ghost- \
        --source /test/tally-ghost >/dev/null || fail "hub-produce ghost"
    wait_records 7 "the other records"
    sleep 1
    assert_eq 12 "$(($(verdict_total) - VERDICTS0))" "12 records, 12 verdicts"
    stored=$(psql_q "SELECT count(*) || '|' || count(DISTINCT (tenant_id, source, event_id))
                       FROM event_inbox WHERE tenant_id = '$TENANT'")
    assert_eq "6|6" "$stored" "6 events stored once each"
    assert_eq 6 "$(growth accepted '')" "6 accepted in all"
    assert_eq 3 "$(($(psql_q "SELECT count(*) FROM quarantine") - q0))" "3 quarantine rows"
}

# ---------------------------------------------------------------------------
# admin API: GET /admin/quarantine
# ---------------------------------------------------------------------------

scenario_the_admin_api_lists_and_filters_quarantine() {
    local body qid
    TENANT=$(own_tenant)
    counters_start
    rec q-dup /test/admin-dup
    send "$TOPIC" "$F/first.json"
    send "$TOPIC" "$F/second.json"
    rec q-time /test/admin-time "ce-time=yesterday at noon"
    send "$TOPIC" "$F/ok.json"
    rec q-big /test/admin-big
    send "$TOPIC" "$F/big.json"
    wait_records 4 "the records to quarantine"

    body=$(admin_curl GET '/admin/quarantine?limit=100')
    assert_eq 200 "$(http_status)" "GET /admin/quarantine → 200"
    assert_eq "$(psql_q "SELECT count(*) FROM quarantine")" "$(jq '.items | length' <<<"$body" 2>/dev/null)" \
        "GET /admin/quarantine lists every row"
    body=$(admin_curl GET "/admin/quarantine?tenant=$TENANT&reason=too_large")
    assert_eq "1 too_large data" "$(jq -r '[(.items | length), .items[0].reason, .items[0].field] |
                                            map(tostring) | join(" ")' <<<"$body" 2>/dev/null)" \
        "GET /admin/quarantine?reason=too_large"
    body=$(admin_curl GET "/admin/quarantine?tenant=$TENANT&reason=digest_conflict")
    assert_eq "1 q-dup" "$(jq -r '"\(.items | length) \(.items[0].event_id)"' <<<"$body" 2>/dev/null)" \
        "GET /admin/quarantine?tenant=…&reason=digest_conflict"
    qid=$(psql_q "SELECT id FROM quarantine WHERE headers::text LIKE '%/test/admin-time\"%'")
    body=$(admin_curl GET "/admin/quarantine/$qid")
    assert_eq "200 invalid_envelope time" \
        "$(http_status) $(jq -r '"\(.reason) \(.field)"' <<<"$body" 2>/dev/null)" \
        "GET /admin/quarantine/{id} returns the row"
    # Without the admin token: 401.
    hub_curl GET /admin/quarantine >/dev/null
    assert_eq 401 "$(http_status)" "GET /admin/quarantine without a token → 401"
}

# ---------------------------------------------------------------------------
# JSON grammar in bulk: PostgreSQL checks a batch's JSON payloads inside the
# insert; one bad payload fails it and the batch is checked row by row.  The
# records are produced while the hub is stopped, so that they come back as
# one batch: good and bad payloads, repeats of one key among them.  The
# counters are those of the hub started afterwards.
# ---------------------------------------------------------------------------

scenario_a_batch_with_bad_payloads_is_checked_row_by_row() {
    TENANT=$(own_tenant)
    hub_stop
    produce_as --count 3 --id-prefix mixa- --source /test/mix --payload-file "$F/a1.json" \
        >/dev/null || fail "hub-produce mixa"
    produce_as --count 2 --id-prefix mixcut- --source /test/mix --payload-file "$F/cut.json" \
        >/dev/null || fail "hub-produce mixcut"
    produce_as --count 2 --id-prefix mixbig- --source /test/mix --payload-file "$F/big-number.json" \
        >/dev/null || fail "hub-produce mixbig"
    produce_as --count 1 --id-prefix mixutf- --source /test/mix --payload-file "$F/latin.json" \
        >/dev/null || fail "hub-produce mixutf"
    # repeats of one key in the batch: same payload, a bad one, another good one
    rec mix-rep /test/mix
    send "$TOPIC" "$F/a1.json"
    send "$TOPIC" "$F/cut.json"
    send "$TOPIC" "$F/a1.json"
    send "$TOPIC" "$F/big-number.json"
    hub_start_shared
    EXPECTED_TOTAL=0
    wait_records 12 "the mixed batch"
    assert_eq "mix-rep mixa-0 mixa-1 mixa-2 mixbig-0 mixbig-1" \
        "$(psql_q "SELECT string_agg(event_id, ' ' ORDER BY event_id) FROM event_inbox
                    WHERE tenant_id = '$TENANT' AND source = '/test/mix'")" \
        "good payloads of a batch with bad ones are stored (1e400 is well-formed JSON)"
    assert_eq "mixcut-0:invalid JSON syntax mixcut-1:invalid JSON syntax mixutf-0:not UTF-8 mix-rep:invalid JSON syntax" \
        "$(psql_q "SELECT string_agg(event_id || ':' || substring(detail FROM '\((.*)\)$'), ' ' ORDER BY id)
                     FROM quarantine WHERE tenant_id = '$TENANT' AND source = '/test/mix'
                      AND reason = 'invalid_envelope'
                      AND field = 'data' AND detail LIKE 'payload is not well-formed JSON (%)'")" \
        "bad payloads quarantined (field data, the reason in words), a repeat's bad payload too"
    assert_eq 1 "$(verdict duplicate '')" "the repeat of mix-rep with its payload is a duplicate"
    assert_eq 1 "$(verdict quarantined digest_conflict)" "the repeat with another good payload conflicts"
    assert_eq 4 "$(verdict quarantined invalid_envelope)" "4 bad payloads in the batch"
    assert_eq 0 "$(metric streaming_hub_ingest_batch_failures_total)" \
        "a bad payload is bad input, not a failed batch"
}

# ---------------------------------------------------------------------------
# Partition upkeep refreshes a partition analyzed while empty once it has rows
# (migrations/0006): tomorrow's partition, analyzed now, gets a row; the
# upkeep function analyzes it again (an untouched empty one stays as it is).
# ---------------------------------------------------------------------------

scenario_partition_upkeep_analyzes_a_partition_that_got_rows() {
    local tenant part later
    tenant=$(own_tenant)
    part=$(psql_q "SELECT 'event_inbox_' || to_char((now() AT TIME ZONE 'UTC')::date + 1, 'YYYYMMDD')")
    later=$(psql_q "SELECT 'event_inbox_' || to_char((now() AT TIME ZONE 'UTC')::date + 2, 'YYYYMMDD')")
    psql_q "ANALYZE $part; ANALYZE $later" >/dev/null
    psql_q "INSERT INTO event_inbox (seq, day, tenant_id, source, event_id, ce_type, event_type,
                                     schema_major, event_time, content_type, headers, payload, digest)
            VALUES (nextval('event_seq'), (now() AT TIME ZONE 'UTC')::date + 1, '$tenant', '/test/stats',
                    'stats-0', 'x.y.v1', 'x.y', 1, now(), 'application/json', '{}', '{}', '\x00')" >/dev/null
    stats() { psql_q "SELECT reltuples::int FROM pg_class WHERE relname = '$1'"; }
    assert_eq "0 0" "$(stats "$part") $(stats "$later")" "both partitions recorded as empty"
    psql_q "SELECT hub_maintain_partitions('7 days')" >/dev/null
    assert_eq "1 0" "$(stats "$part") $(stats "$later")" \
        "upkeep analyzed the partition that has a row now, and only that one"
}

scenarios_main "$@"
