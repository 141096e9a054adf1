#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# HTTP ingest and pull (SPEC §4, §9; verdicts and storage as in §3.1–3.3):
# POST /v1/events in binary mode (ce-* headers, percent-decoded; the body is
# the data; Content-Type is the datacontenttype), structured mode
# (application/cloudevents+json, the data member stored exactly as written)
# and batch mode (application/cloudevents-batch+json → 207, one result per
# event, in order), then GET /v1/events and GET /v1/events/{seq}.
#
# Covers: tenant keys (401); media types compared case-insensitively with
# their parameters ignored, other cloudevents+ types → 415; the key's tenant
# (a different tenantid → 403, nothing stored; none → the key's tenant); the
# results (202 with the arrival sequence, 200 duplicate, 409 digest conflict
# quarantined, 400 naming each offending attribute quarantined
# invalid_envelope with no topic, 413 quarantined too_large); the row in
# event_inbox as soon as the 202 is read; the verdict counters; one delivery
# end to end (exact body bytes) and no job for what was not accepted; batch
# limits (empty, not an array, 1000 vs 1001 events); the pull API (items in
# arrival order, cursors, default and maximum limit, type filter, data vs
# data_base64, another tenant's events never shown, bad parameters → 400
# naming them, one event by sequence) and its per-tenant token bucket (429 +
# Retry-After, a hub with PULL_RATE=1 PULL_BURST=3); the tenant ingest quota
# (quotas.ingest_rate / ingest_burst: 429 + Retry-After, batches charged per
# event, malformed quotas 400).
#
# Every scenario posts as tenants of its own ($(own_id ...)); the verdict
# counters are shared, so each reads them before and compares the growth.
# Run one alone: bash tests/integration/test_http_ingest.sh quota_429
#
# No `set -e`: every check below is an explicit assertion.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"

M='streaming_hub_ingest_records_total'
PROBLEM='application/problem+json'
BIN1_BODY=$'{ "amount" : 1500,\t"memo":"caf\xc3\xa9", "n":[1, 2 ,3] }'
BIN1_HEX=$(printf '%s' "$BIN1_BODY" | od -An -tx1 -v | tr -d ' \n')

setup() {
    command -v jq >/dev/null || fatal "jq is required by this test"
    pg_start
    kafka_start --topic lerian.streaming.http:1
    sink_start 0
    hub_shared STREAMING_HUB_KEK="$(head -c 32 /dev/urandom | base64 -w0)" \
        STREAMING_HUB_ALLOW_PRIVATE_SINKS=true STREAMING_HUB_MAX_EVENT_BYTES=2048
}

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

# post KEY CONTENT_TYPE BODY [curl args...]: POST /v1/events with exactly that
# Content-Type ("-": none at all) and BODY's bytes ("-": no body, else a file
# is read when BODY starts with @); KEY "-" sends no Authorization.  Prints
# the response body (also for last_body); status for http_status;
# response headers for last_header.  hub_curl is not used: it forces
# Content-Type: application/json on any body.
post() {
    local key=$1 ct=$2 body=$3 last=${HUB_HTTP_LAST:-$WORK/last_http}
    shift 3
    local args=(-s -X POST --max-time 60 -o "${last}_body" -D "${last}_headers"
        -w '%{http_code}')
    [[ $key != - ]] && args+=(-H "Authorization: Bearer $key")
    if [[ $ct == - ]]; then
        args+=(-H 'Content-Type:')
    else
        args+=(-H "Content-Type: $ct")
    fi
    if [[ $body == @* ]]; then
        args+=(--data-binary "$body")
    elif [[ $body != - ]]; then
        printf '%s' "$body" >"$WORK/req_body"
        args+=(--data-binary "@$WORK/req_body")
    fi
    curl "${args[@]}" "$@" "$HUB_URL/v1/events" >"${last}_status" 2>/dev/null ||
        echo 000 >"${last}_status"
    cat "${last}_body" 2>/dev/null
}

# pull KEY PATH_AND_QUERY: GET as KEY ("-": none); body printed, status kept,
# response headers for last_header.
pull() {
    local last=${HUB_HTTP_LAST:-$WORK/last_http}
    local args=(-s --max-time 30 -o "${last}_body" -D "${last}_headers" -w '%{http_code}')
    [[ $1 != - ]] && args+=(-H "Authorization: Bearer $1")
    curl "${args[@]}" "$HUB_URL$2" >"${last}_status" 2>/dev/null ||
        echo 000 >"${last}_status"
    cat "${last}_body" 2>/dev/null
}

# is_problem: the last answer is application/problem+json.
is_problem() {
    [[ $(last_header content-type) == "$PROBLEM"* ]]
}

# assert_problem MSG: the last answer is problem+json.
assert_problem() {
    if is_problem; then
        pass "$1 is problem+json"
    else
        fail "$1: content type '$(last_header content-type)', not $PROBLEM"
    fi
}

# ce ID [EDIT ...]: the header list H of a valid binary-mode event (source
# /http/bin, type studio.lerian.account.created, tenant $TENANT, which
# own_client sets), then each EDIT of headers_edit (NAME=VALUE replaces or
# adds, -NAME removes).
ce() {
    H=("ce-specversion=1.0" "ce-id=$1" "ce-source=/http/bin"
        "ce-type=studio.lerian.account.created" "ce-time=$(now3339)" "ce-tenantid=$TENANT")
    shift
    headers_edit "$@"
}

# post_bin KEY CONTENT_TYPE BODY: post with the headers of H.
post_bin() {
    local h args=()
    for h in "${H[@]}"; do
        args+=(-H "${h%%=*}: ${h#*=}")
    done
    post "$1" "$2" "$3" "${args[@]}"
}

# structured ID [JQ_EDIT]: a structured event (source /http/structured, type
# studio.lerian.account.created, tenant $TENANT, data {"n":1}) as compact
# JSON, after the jq expression JQ_EDIT (default: none).
structured() {
    jq -cn --arg id "$1" --arg t "$(now3339)" --arg tenant "$TENANT" \
        "{specversion:\"1.0\", id:\$id, source:\"/http/structured\",
          type:\"studio.lerian.account.created\", time:\$t, tenantid:\$tenant, data:{n:1}}
         | ${2:-.}"
}

# st1: the structured event st-1 of $TENANT exactly as posted (its data
# member written with a space, a time with an offset).
st1() {
    printf '{"specversion":"1.0","id":"st-1","source":"/http/structured","type":"studio.lerian.balance.updated","time":"2024-05-01T10:00:00.5+02:00","tenantid":"%s","subject":"s1","data":{"a": 1}}' \
        "$TENANT"
}

# post_bin1: posts bin-1 of $TENANT (BIN1_BODY, transaction.posted, a
# percent-encoded subject, an extension); prints the answer.
post_bin1() {
    ce bin-1 ce-type=studio.lerian.transaction.posted ce-subject=a%20b%2Fc ce-myext=v1
    post_bin "$KEY" application/json "$BIN1_BODY"
}

# verdict VERDICT REASON: one verdict counter.
verdict() {
    metric "$M{verdict=\"$1\",reason=\"$2\"}"
}

# id_count ID: rows of event_inbox with that event id (any tenant).
id_count() {
    psql_q "SELECT count(*) FROM event_inbox WHERE event_id = '$1'"
}

# last_quarantine: "reason|field|topic is null" of the newest quarantine row.
last_quarantine() {
    psql_q "SELECT reason || '|' || coalesce(field, '') || '|' || (topic IS NULL)
              FROM quarantine ORDER BY id DESC LIMIT 1"
}

quarantine_total() {
    psql_q "SELECT count(*) FROM quarantine"
}

# quarantine_max_id: the newest quarantine row's id (0 when none).
quarantine_max_id() {
    psql_q "SELECT coalesce(max(id), 0) FROM quarantine"
}

# fields: the "field" members of the last answer's errors[], sorted, space-separated.
fields() {
    last_body | jq -r '[.errors[]?.field] | sort | join(" ")' 2>/dev/null
}

# jqb EXPR: jq -r EXPR over the last answer's body.
jqb() {
    last_body | jq -r "$1" 2>/dev/null
}

# raw_headers FILE SOURCE: the header file of bench-raw-post for events of
# $KEY's tenant with that ce-source.
raw_headers() {
    cat >"$1" <<H
Authorization: Bearer $KEY
ce-specversion: 1.0
ce-source: $2
ce-type: studio.lerian.account.created
ce-time: 2026-01-01T00:00:00Z
H
}

# ---------------------------------------------------------------------------
# authentication
# ---------------------------------------------------------------------------

scenario_events_need_a_tenant_key() {
    own_client
    ce auth-1
    post_bin - application/json '{"x":1}' >/dev/null
    assert_eq 401 "$(http_status)" "POST /v1/events without a key → 401"
    post_bin shk_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA application/json '{"x":1}' >/dev/null
    assert_eq 401 "$(http_status)" "POST /v1/events with an unknown key → 401"
    post_bin "$ADMIN_TOKEN" application/json '{"x":1}' >/dev/null
    assert_eq 401 "$(http_status)" "POST /v1/events with the admin token → 401"
    assert_eq 0 "$(id_count auth-1)" "nothing stored without a valid key"
}

# ---------------------------------------------------------------------------
# binary mode
# ---------------------------------------------------------------------------

scenario_binary_event_is_stored_before_the_202() {
    local body stored seq accepted0
    own_client
    accepted0=$(verdict accepted '')
    body=$(post_bin1)
    # immediately, no wait: the answer comes after the commit
    stored=$(psql_q "SELECT tenant_id || '|' || source || '|' || encode(payload, 'hex') || '|' || (topic IS NULL)
                       || '|' || event_type || '|' || content_type || '|' || seq
                       FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'bin-1'")
    assert_eq 202 "$(http_status)" "binary mode event → 202"
    assert_eq "bin-1|accepted|number" "$(jq -r '"\(.id)|\(.verdict)|\(.sequence | type)"' <<<"$body" 2>/dev/null)" \
        "202 body: id, verdict accepted, sequence as a JSON number"
    seq=$(jq -r '.sequence' <<<"$body" 2>/dev/null)
    assert_eq "$TENANT|/http/bin|$BIN1_HEX|true|transaction.posted|application/json|$seq" "$stored" \
        "event_inbox has the row as soon as the 202 is read: key's tenant, exact payload bytes, no topic, the answered sequence"
    assert_eq 1 "$(metric_delta "$M{verdict=\"accepted\",reason=\"\"}" "$accepted0")" "accepted counted in $M"
}

scenario_binary_content_type_is_the_datacontenttype() {
    own_client
    # no Content-Type: the datacontenttype is application/json
    ce bin-noct ce-source=%2Fhttp%2Fpct
    post_bin "$KEY" - '{"no":"content-type"}' >/dev/null
    assert_eq 202 "$(http_status)" "binary mode without Content-Type → 202"
    assert_eq "application/json|7b226e6f223a22636f6e74656e742d74797065227d|/http/pct" \
        "$(psql_q "SELECT content_type || '|' || encode(payload, 'hex') || '|' || source
                     FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'bin-noct'")" \
        "no Content-Type: stored as application/json, body as the data; ce-source percent-decoded"

    # a non-JSON content type is stored as given, bytes unchanged
    ce bin-text
    post_bin "$KEY" 'text/plain' 'hello' >/dev/null
    assert_eq 202 "$(http_status)" "binary mode text/plain → 202"
    assert_eq "text/plain|68656c6c6f" \
        "$(psql_q "SELECT content_type || '|' || encode(payload, 'hex') FROM event_inbox
                    WHERE tenant_id = '$TENANT' AND event_id = 'bin-text'")" \
        "text/plain body stored as the data with its content type"
}

scenario_event_without_tenantid_is_the_keys_tenant() {
    own_client
    ce bin-notenant -ce-tenantid
    post_bin "$KEY" application/json '{"t":0}' >/dev/null
    assert_eq 202 "$(http_status)" "binary mode without ce-tenantid → 202"
    assert_eq "$TENANT" "$(psql_q "SELECT tenant_id FROM event_inbox WHERE event_id = 'bin-notenant'")" \
        "an event without tenantid is stored as the key's tenant"

    post "$KEY" application/cloudevents+json "$(structured st-notenant 'del(.tenantid)')" >/dev/null
    assert_eq 202 "$(http_status)" "structured event without tenantid → 202"
    assert_eq "$TENANT" "$(psql_q "SELECT tenant_id FROM event_inbox WHERE event_id = 'st-notenant'")" \
        "stored as the key's tenant"
}

scenario_another_tenants_tenantid_is_403() {
    local q0 other
    own_client
    other=$(own_tenant other)
    # binary: a tenantid that is not the key's → 403, nothing stored
    q0=$(quarantine_total)
    ce bin-wrongtenant ce-tenantid="$other"
    post_bin "$KEY" application/json '{"t":1}' >/dev/null
    assert_eq 403 "$(http_status)" "ce-tenantid of another tenant → 403"
    assert_problem "the 403"
    assert_eq "0|$q0" "$(id_count bin-wrongtenant)|$(quarantine_total)" \
        "nothing stored for another tenant's tenantid"

    # structured
    q0=$(quarantine_total)
    post "$KEY" application/cloudevents+json "$(structured st-wrongtenant ".tenantid = \"$other\"")" >/dev/null
    assert_eq 403 "$(http_status)" "structured tenantid of another tenant → 403"
    assert_problem "the 403"
    assert_eq "0|$q0" "$(id_count st-wrongtenant)|$(quarantine_total)" "nothing stored"
}

# ---------------------------------------------------------------------------
# duplicate and digest conflict
# ---------------------------------------------------------------------------

scenario_duplicate_is_200_and_conflict_409() {
    local body dup0 conflict0
    own_client
    post_bin1 >/dev/null
    assert_eq 202 "$(http_status)" "bin-1 stored first → 202"
    dup0=$(verdict duplicate '')
    conflict0=$(verdict quarantined digest_conflict)

    body=$(post_bin1)
    assert_eq 200 "$(http_status)" "same key, same payload → 200"
    assert_eq "bin-1|duplicate" "$(jq -r '"\(.id)|\(.verdict)"' <<<"$body" 2>/dev/null)" \
        "duplicate body: id and verdict duplicate"
    assert_eq 1 "$(metric_delta "$M{verdict=\"duplicate\",reason=\"\"}" "$dup0")" "duplicate counted"

    ce bin-1 ce-type=studio.lerian.transaction.posted
    post_bin "$KEY" application/json '{"amount":9999}' >/dev/null
    assert_eq 409 "$(http_status)" "same key, different payload → 409"
    assert_problem "the 409"
    assert_eq "digest_conflict|$TENANT|/http/bin|bin-1|true" \
        "$(psql_q "SELECT reason || '|' || tenant_id || '|' || source || '|' || event_id || '|' || (topic IS NULL)
                     FROM quarantine WHERE reason = 'digest_conflict' AND tenant_id = '$TENANT'")" \
        "the conflict is quarantined (digest_conflict, with its key, no topic)"
    assert_eq "1|$BIN1_HEX" "$(psql_q "SELECT count(*) || '|' || min(encode(payload, 'hex'))
                                         FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'bin-1'")" \
        "the first stored event is kept, never overwritten"
    assert_eq 1 "$(metric_delta "$M{verdict=\"quarantined\",reason=\"digest_conflict\"}" "$conflict0")" \
        "digest conflict counted"
}

# ---------------------------------------------------------------------------
# invalid envelopes → 400 naming each attribute, quarantined; too large → 413
# ---------------------------------------------------------------------------

# bad_bin MSG EXPECTED_FIELDS CONTENT_TYPE BODY: posts H, expects a 400 naming
# exactly EXPECTED_FIELDS and one more invalid_envelope row without a topic;
# counts the request in INVALID.
bad_bin() {
    post_bin "$KEY" "$3" "$4" >/dev/null
    assert_eq 400 "$(http_status)" "$1 → 400"
    is_problem || fail "$1: 400 content type '$(last_header content-type)', not $PROBLEM"
    assert_eq "$2" "$(fields)" "$1: errors name $2"
    INVALID=$((INVALID + 1))
    if [[ $2 != *' '* ]]; then
        assert_eq "invalid_envelope|$2|true" "$(last_quarantine)" "$1: quarantined invalid_envelope, field $2, no topic"
    fi
}

scenario_invalid_binary_envelope_is_400_quarantined() {
    local q0 q0_id invalid0
    own_client
    q0=$(quarantine_total)
    q0_id=$(quarantine_max_id)
    invalid0=$(verdict quarantined invalid_envelope)
    INVALID=0
    ce unused -ce-id
    bad_bin "missing ce-id" id application/json '{"ok":true}'
    ce bad-spec ce-specversion=0.3
    bad_bin "ce-specversion 0.3" specversion application/json '{"ok":true}'
    ce bad-time "ce-time=yesterday at noon"
    bad_bin "bad ce-time" time application/json '{"ok":true}'
    ce bad-json
    bad_bin "malformed JSON payload" data application/json '{"broken": tru'
    ce bad-json-ct
    bad_bin "malformed JSON payload, JSON type with parameters" data 'application/json; charset=utf-8' '[1,2'
    ce bad-utf8 ce-subject=x%FFy
    bad_bin "ce-subject not UTF-8 once percent-decoded" subject application/json '{"ok":true}'
    ce unused2 -ce-id "ce-time=not a time"
    bad_bin "missing ce-id and bad ce-time" "id time" application/json '{"ok":true}'
    assert_eq "$((q0 + INVALID))" "$(quarantine_total)" "one quarantine row per invalid request"
    assert_eq "$INVALID" "$(psql_q "SELECT count(*) FROM quarantine WHERE reason = 'invalid_envelope'
                                      AND topic IS NULL AND id > $q0_id")" \
        "every invalid request quarantined invalid_envelope with a NULL topic"
    assert_eq "$INVALID" "$(metric_delta "$M{verdict=\"quarantined\",reason=\"invalid_envelope\"}" "$invalid0")" \
        "invalid envelopes counted"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM event_inbox WHERE event_id LIKE 'bad-%' OR event_id LIKE 'unused%'")" \
        "no invalid event in event_inbox"
}

scenario_event_over_max_event_bytes_is_413() {
    local big large0
    own_client
    large0=$(verdict quarantined too_large)
    # STREAMING_HUB_MAX_EVENT_BYTES=2048
    big=$(head -c 3000 /dev/zero | tr '\0' 'a' | sed 's/^/{"big":"/; s/$/"}/')
    ce big-1
    post_bin "$KEY" application/json "$big" >/dev/null
    assert_eq 413 "$(http_status)" "payload over STREAMING_HUB_MAX_EVENT_BYTES → 413"
    assert_eq "too_large" "$(psql_q "SELECT reason FROM quarantine ORDER BY id DESC LIMIT 1")" \
        "the large event is quarantined too_large"
    assert_eq 1 "$(metric_delta "$M{verdict=\"quarantined\",reason=\"too_large\"}" "$large0")" "too_large counted"
    assert_eq 0 "$(id_count big-1)" "the large event is not stored"
}

# ---------------------------------------------------------------------------
# structured mode
# ---------------------------------------------------------------------------

scenario_structured_event_is_stored_as_written() {
    local body
    own_client
    body=$(post "$KEY" application/cloudevents+json "$(st1)")
    assert_eq 202 "$(http_status)" "structured event → 202"
    assert_eq "st-1|accepted|number" "$(jq -r '"\(.id)|\(.verdict)|\(.sequence | type)"' <<<"$body" 2>/dev/null)" \
        "structured 202 body"
    assert_eq "{\"a\": 1}|application/json|balance.updated|true|$TENANT" \
        "$(psql_q "SELECT convert_from(payload, 'UTF8') || '|' || content_type || '|' || event_type || '|'
                          || (event_time = '2024-05-01T08:00:00.5Z'::timestamptz) || '|' || tenant_id
                     FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'st-1'")" \
        "structured payload is the data member exactly as written (space kept); time with offset"

    post "$KEY" application/cloudevents+json \
        "$(structured st-b64 '.datacontenttype = "application/octet-stream" | del(.data) | .data_base64 = "aGVsbG8sIGJ5dGVzAAE="')" \
        >/dev/null
    assert_eq 202 "$(http_status)" "structured event with data_base64 → 202"
    assert_eq "68656c6c6f2c2062797465730001|application/octet-stream" \
        "$(psql_q "SELECT encode(payload, 'hex') || '|' || content_type FROM event_inbox
                    WHERE tenant_id = '$TENANT' AND event_id = 'st-b64'")" \
        "data_base64 stored decoded"

    post "$KEY" 'Application/CloudEvents+JSON; charset=utf-8' "$(structured st-case)" >/dev/null
    assert_eq 202 "$(http_status)" "media type compared case-insensitively, parameters ignored → structured, 202"
    assert_eq '{"n":1}' "$(psql_q "SELECT convert_from(payload, 'UTF8') FROM event_inbox
                                   WHERE tenant_id = '$TENANT' AND event_id = 'st-case'")" \
        "… and stored as a structured event (data member only)"
}

scenario_invalid_structured_envelope_is_400_quarantined() {
    local q0 invalid0 invalid=0
    own_client
    invalid0=$(verdict quarantined invalid_envelope)
    post "$KEY" application/cloudevents+json "$(structured unused3 'del(.id)')" >/dev/null
    assert_eq 400 "$(http_status)" "structured event without id → 400"
    assert_eq id "$(fields)" "… naming id"
    invalid=$((invalid + 1))
    assert_eq "invalid_envelope|id|true" "$(last_quarantine)" "… quarantined invalid_envelope with no topic"

    post "$KEY" application/cloudevents+json "$(structured st-badtime '.time = "noon" | .specversion = "0.3"')" >/dev/null
    assert_eq 400 "$(http_status)" "structured event with bad time and specversion → 400"
    assert_eq "specversion time" "$(fields)" "… naming both"
    invalid=$((invalid + 1))

    q0=$(quarantine_total)
    post "$KEY" application/cloudevents+json '{"specversion":"1.0",' >/dev/null
    assert_eq 400 "$(http_status)" "structured body that is not JSON → 400"
    assert_problem "the 400 for a body that is not JSON"
    invalid=$((invalid + 1))
    assert_eq "$((q0 + 1))|invalid_envelope" "$(quarantine_total)|$(psql_q "SELECT reason FROM quarantine ORDER BY id DESC LIMIT 1")" \
        "… quarantined invalid_envelope"
    assert_eq "$invalid" "$(metric_delta "$M{verdict=\"quarantined\",reason=\"invalid_envelope\"}" "$invalid0")" \
        "structured invalid envelopes counted"
}

scenario_other_cloudevents_media_types_are_415() {
    own_client
    post "$KEY" application/cloudevents+xml '<event/>' >/dev/null
    assert_eq 415 "$(http_status)" "application/cloudevents+xml → 415"
    post "$KEY" application/cloudevents-batch+xml '<events/>' >/dev/null
    assert_eq 415 "$(http_status)" "application/cloudevents-batch+xml → 415"
}

# ---------------------------------------------------------------------------
# batch mode
# ---------------------------------------------------------------------------

# b MEMBERS: a batch member of source /http/batch with these jq members.
b() {
    jq -cn --arg t "$(now3339)" "{specversion:\"1.0\", source:\"/http/batch\",
        type:\"studio.lerian.account.created\", time:\$t, $1}"
}

scenario_batch_is_207_with_one_result_per_event() {
    local other q0_id body batch b1_seq b2_seq invalid0 conflict0 dup0
    own_client
    other=$(own_tenant other)
    # st-1 goes in first, then in the batch as the very text posted (its data
    # with the space: a duplicate) and with other data (a conflict)
    post "$KEY" application/cloudevents+json "$(st1)" >/dev/null
    assert_eq 202 "$(http_status)" "st-1 stored before the batch → 202"
    q0_id=$(quarantine_max_id)
    invalid0=$(verdict quarantined invalid_envelope)
    conflict0=$(verdict quarantined digest_conflict)
    dup0=$(verdict duplicate '')
    batch="[$(b 'id:"b-1", data:{n:1}'),
 $(st1),
 $(b "id:\"b-bad\", tenantid:\"$TENANT\", data:{}" | jq -c 'del(.type)'),
 $(b "id:\"b-x\", tenantid:\"$other\", data:{}"),
 $(st1 | sed 's/{"a": 1}/{"a": 2}/'),
 $(b "id:\"b-2\", tenantid:\"$TENANT\", data_base64:\"AAE=\", datacontenttype:\"application/octet-stream\"")]"
    body=$(post "$KEY" application/cloudevents-batch+json "$batch")
    assert_eq 207 "$(http_status)" "batch → 207"
    assert_eq "202 200 400 403 409 202" "$(jq -r '[.results[].status] | map(tostring) | join(" ")' <<<"$body" 2>/dev/null)" \
        "one result per event, in order, each with its own status"
    assert_eq "b-1|accepted|number" "$(jq -r '.results[0] | "\(.id)|\(.verdict)|\(.sequence | type)"' <<<"$body" 2>/dev/null)" \
        "an accepted result is the single-event body plus its status"
    assert_eq "st-1|duplicate" "$(jq -r '.results[1] | "\(.id)|\(.verdict)"' <<<"$body" 2>/dev/null)" \
        "the duplicate result"
    assert_eq "type|400" "$(jq -r '.results[2] | "\([.errors[]?.field] | join(" "))|\(.status)"' <<<"$body" 2>/dev/null)" \
        "the invalid result is a problem naming type"
    assert_eq "true true true" "$(jq -r '[.results[2, 3, 4] | has("title") and has("type")] | map(tostring) | join(" ")' <<<"$body" 2>/dev/null)" \
        "the 400, 403 and 409 results carry the problem members"
    b1_seq=$(jq -r '.results[0].sequence' <<<"$body" 2>/dev/null)
    b2_seq=$(jq -r '.results[5].sequence' <<<"$body" 2>/dev/null)
    assert_eq "$b1_seq $b2_seq" "$(psql_q "SELECT string_agg(seq::text, ' ' ORDER BY event_id)
                                             FROM event_inbox WHERE source = '/http/batch'
                                              AND tenant_id IN ('$TENANT', '$other')")" \
        "the accepted batch events are stored with the answered sequences, nothing else of the batch"
    assert_ge "$b2_seq" "$((b1_seq + 1))" "batch events get arrival sequences in order"
    assert_eq "0001|application/octet-stream" \
        "$(psql_q "SELECT encode(payload, 'hex') || '|' || content_type FROM event_inbox
                    WHERE tenant_id = '$TENANT' AND event_id = 'b-2'")" \
        "a batch member's data_base64 stored decoded"
    assert_eq "digest_conflict invalid_envelope|type" \
        "$(psql_q "SELECT string_agg(reason || CASE WHEN reason = 'invalid_envelope'
                                                   THEN '|' || coalesce(field, '') ELSE '' END, ' ' ORDER BY reason)
                     FROM quarantine WHERE id > $q0_id")" \
        "the batch quarantined its invalid event (field type) and its conflict, nothing for the 403"
    assert_eq "1|1|1" "$(metric_delta "$M{verdict=\"quarantined\",reason=\"invalid_envelope\"}" "$invalid0")|$(metric_delta "$M{verdict=\"quarantined\",reason=\"digest_conflict\"}" "$conflict0")|$(metric_delta "$M{verdict=\"duplicate\",reason=\"\"}" "$dup0")" \
        "batch verdicts counted like single events"
}

scenario_batch_media_type_and_limits() {
    local body t0
    own_client
    body=$(post "$KEY" 'Application/CloudEvents-Batch+JSON; charset=utf-8' "[$(structured b-3)]")
    assert_eq "207|202|b-3" "$(http_status)|$(jq -r '"\(.results[0].status)|\(.results[0].id)"' <<<"$body" 2>/dev/null)" \
        "batch media type compared case-insensitively, parameters ignored"

    post "$KEY" application/cloudevents-batch+json '[]' >/dev/null
    assert_eq 400 "$(http_status)" "an empty batch → 400"
    post "$KEY" application/cloudevents-batch+json "$(structured b-obj)" >/dev/null
    assert_eq 400 "$(http_status)" "a batch that is an object, not an array → 400"
    assert_eq 0 "$(id_count b-obj)" "… nothing stored"
    post "$KEY" application/cloudevents-batch+json '[{"specversion":"1.0",' >/dev/null
    assert_eq 400 "$(http_status)" "a batch that is not JSON → 400"

    # 1001 events → 400, nothing stored; 1000 events → 207, all stored
    jq -cn --arg t "$(now3339)" '[range(1001) | {specversion:"1.0", id:"over-\(.)", source:"/http/over",
        type:"studio.lerian.account.created", time:$t, data:{i:.}}]' >"$WORK/over.json"
    post "$KEY" application/cloudevents-batch+json "@$WORK/over.json" >/dev/null
    assert_eq 400 "$(http_status)" "a batch of 1001 events → 400"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM event_inbox WHERE source = '/http/over'")" \
        "nothing of the 1001-event batch is stored"
    jq -cn --arg t "$(now3339)" '[range(1000) | {specversion:"1.0", id:"bulk-\(.)", source:"/http/bulk",
        type:"studio.lerian.account.created", time:$t, data:{i:.}}]' >"$WORK/bulk.json"
    t0=$SECONDS
    body=$(post "$KEY" application/cloudevents-batch+json "@$WORK/bulk.json")
    log "1000-event batch answered in $((SECONDS - t0)) s"
    assert_eq 207 "$(http_status)" "a batch of 1000 events → 207"
    assert_eq "1000|1000" "$(jq -r '"\(.results | length)|\([.results[] | select(.status == 202)] | length)"' <<<"$body" 2>/dev/null)" \
        "1000 results, all accepted"
    assert_eq 1000 "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND source = '/http/bulk'")" \
        "the 1000 events are stored when the 207 is read"
}

# ---------------------------------------------------------------------------
# delivery end to end: exactly the accepted transaction.* event
# ---------------------------------------------------------------------------

scenario_accepted_event_is_delivered_with_its_exact_bytes() {
    local other other_key path opath sub osub probes oprobes
    own_client
    other=$(own_tenant other)
    other_key=$(tenant_key "$other")
    path=/ok/$(own_id)/
    opath=/ok/$(own_id other)/
    # the tenant takes transaction.*, the other tenant everything (both
    # activated by hand: /ok does not echo the verification challenge)
    sub=$(subscribe_active "$KEY" "$(subscription_json 'transaction.*' "$SINK_URL$path")") ||
        fail "the tenant's subscription's probe did not finish"
    osub=$(subscribe_active "$other_key" "$(subscription_json '*' "$SINK_URL$opath")") ||
        fail "the other subscription's probe did not finish"
    probes=$(sink_count "$path")
    oprobes=$(sink_count "$opath")

    post_bin1 >/dev/null
    assert_eq 202 "$(http_status)" "bin-1 (transaction.posted) → 202"
    # a duplicate, a conflict and an invalid event of the same type: no job
    post_bin1 >/dev/null
    assert_eq 200 "$(http_status)" "its duplicate → 200"
    ce bin-1 ce-type=studio.lerian.transaction.posted
    post_bin "$KEY" application/json '{"amount":9999}' >/dev/null
    assert_eq 409 "$(http_status)" "its conflict → 409"
    ce bad-tx ce-type=studio.lerian.transaction.posted "ce-time=yesterday at noon"
    post_bin "$KEY" application/json '{"ok":true}' >/dev/null
    assert_eq 400 "$(http_status)" "an invalid transaction.posted → 400"
    TENANT=$other ce oth-1
    post_bin "$other_key" application/json '{"other":true}' >/dev/null
    assert_eq 202 "$(http_status)" "the other tenant posts its own event → 202"

    sink_wait $((probes + 1)) "$path" 30 || fail "bin-1 was not delivered"
    sink_wait $((oprobes + 1)) "$opath" 30 || fail "oth-1 was not delivered"
    sleep 1
    assert_eq $((probes + 1)) "$(sink_count "$path")" "one delivery to the tenant's transaction.* subscription"
    assert_eq bin-1 "$(sink_header "$path" x-lerian-event-id | grep -v '^$' | tail -n1)" "the delivered event is bin-1"
    assert_eq "$BIN1_HEX" "$(sink_bodies "$path" | tail -n1 | tr -d '\n' | od -An -tx1 -v | tr -d ' \n')" \
        "the delivered body is the exact posted bytes"
    assert_eq transaction.posted "$(sink_header "$path" x-lerian-event-type | tail -n1)" \
        "delivered with its event type"
    assert_eq 1 "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$sub'")" \
        "one job: duplicates, conflicts and invalid events make none"
    assert_eq "$((oprobes + 1))|oth-1" "$(sink_count "$opath")|$(sink_header "$opath" x-lerian-event-id | tail -n1)" \
        "the other tenant's subscription gets only its own event"
    assert_eq 1 "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$osub'")" \
        "one job for the other tenant's subscription"
}

# ---------------------------------------------------------------------------
# pull: GET /v1/events and GET /v1/events/{seq}
# ---------------------------------------------------------------------------

# post_pull_sample: $TENANT's events for the pull checks, in this order:
# bin-1 (transaction.posted), bin-noct, bin-text (text/plain), bin-notenant,
# st-1 (balance.updated), st-b64 (octet-stream), st-case, st-notenant, and
# the batch b-1, b-2; sets BIN1_SEQ.
post_pull_sample() {
    local body
    body=$(post_bin1)
    BIN1_SEQ=$(jq -r '.sequence' <<<"$body" 2>/dev/null)
    ce bin-noct ce-source=%2Fhttp%2Fpct
    post_bin "$KEY" - '{"no":"content-type"}' >/dev/null
    ce bin-text
    post_bin "$KEY" 'text/plain' 'hello' >/dev/null
    ce bin-notenant -ce-tenantid
    post_bin "$KEY" application/json '{"t":0}' >/dev/null
    post "$KEY" application/cloudevents+json "$(st1)" >/dev/null
    post "$KEY" application/cloudevents+json \
        "$(structured st-b64 '.datacontenttype = "application/octet-stream" | del(.data) | .data_base64 = "aGVsbG8sIGJ5dGVzAAE="')" \
        >/dev/null
    post "$KEY" 'Application/CloudEvents+JSON; charset=utf-8' "$(structured st-case)" >/dev/null
    post "$KEY" application/cloudevents+json "$(structured st-notenant 'del(.tenantid)')" >/dev/null
    post "$KEY" application/cloudevents-batch+json "[$(b 'id:"b-1", data:{n:1}'),
        $(b "id:\"b-2\", tenantid:\"$TENANT\", data_base64:\"AAE=\", datacontenttype:\"application/octet-stream\"")]" \
        >/dev/null
    assert_eq 10 "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT'")" \
        "the 10 events to pull are stored"
}

scenario_pull_lists_the_tenants_events_in_order() {
    local other other_key oth1_seq ids_all seqs_all n_all body it ids after pages cursor_ok page n cur last want got l a s
    own_client
    other=$(own_tenant other)
    other_key=$(tenant_key "$other")
    post_pull_sample
    TENANT=$other ce oth-1
    post_bin "$other_key" application/json '{"other":true}' >/dev/null
    oth1_seq=$(jqb .sequence)

    pull - '/v1/events' >/dev/null
    assert_eq 401 "$(http_status)" "GET /v1/events without a key → 401"

    ids_all=$(psql_q "SELECT string_agg(event_id, ' ' ORDER BY seq) FROM event_inbox WHERE tenant_id = '$TENANT'")
    seqs_all=$(psql_q "SELECT string_agg(seq::text, ' ' ORDER BY seq) FROM event_inbox WHERE tenant_id = '$TENANT'")
    n_all=$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT'")
    body=$(pull "$KEY" '/v1/events?after=0&limit=500')
    assert_eq 200 "$(http_status)" "GET /v1/events → 200"
    echo "$body" >"$WORK/pull_all.json"
    assert_eq "$ids_all" "$(jq -r '[.items[].id] | join(" ")' <<<"$body" 2>/dev/null)" \
        "the tenant's accepted events, ascending by sequence, nothing else"
    assert_eq "$seqs_all" "$(jq -r '[.items[].hubsequence | tostring] | join(" ")' <<<"$body" 2>/dev/null)" \
        "each item's hubsequence (a number) is its arrival sequence"
    assert_eq "number|null" "$(jq -r '"\(.items[0].hubsequence | type)|\(.next_cursor)"' <<<"$body" 2>/dev/null)" \
        "hubsequence is a JSON number; next_cursor null on a page that is not full"
    assert_eq 0 "$(jq --arg t "$TENANT" '[.items[] | select(.tenantid != $t)] | length' <<<"$body" 2>/dev/null)" \
        "no other tenant's event"

    item() { jq -c --arg id "$1" '.items[] | select(.id == $id)' "$WORK/pull_all.json" 2>/dev/null; }
    it=$(item bin-1)
    assert_eq "$BIN1_SEQ|/http/bin|studio.lerian.transaction.posted|1.0|$TENANT|transaction.posted|a b/c" \
        "$(jq -r '"\(.hubsequence)|\(.source)|\(.type)|\(.specversion)|\(.tenantid)|\(.event_type)|\(.subject)"' <<<"$it" 2>/dev/null)" \
        "bin-1 item: hubsequence, source, type, specversion, tenantid, event_type, subject percent-decoded"
    assert_eq "$(printf '%s' "$BIN1_BODY" | jq -c .)" "$(jq -c '.data' <<<"$it" 2>/dev/null)" \
        "a JSON payload is embedded as JSON in data"
    assert_eq "false|true" "$(jq -r '"\(has("data_base64"))|\(.time | type == "string" and length > 0)"' <<<"$it" 2>/dev/null)" \
        "no data_base64 beside data; time present"
    assert_eq "aGVsbG8=|false" "$(item bin-text | jq -r '"\(.data_base64)|\(has("data"))"' 2>/dev/null)" \
        "a text/plain payload comes as data_base64"
    assert_eq "aGVsbG8sIGJ5dGVzAAE=" "$(item st-b64 | jq -r '.data_base64' 2>/dev/null)" \
        "an octet-stream payload comes as data_base64"
    assert_eq '{"a":1}|s1|balance.updated' "$(item st-1 | jq -r '"\(.data | tojson)|\(.subject)|\(.event_type)"' 2>/dev/null)" \
        "structured st-1 as pulled"

    # paging with limit=2 until next_cursor is null gives every event once, in order
    ids="" after=0 pages=0 cursor_ok=1
    while ((pages < 50)); do
        page=$(pull "$KEY" "/v1/events?after=$after&limit=2")
        [[ $(http_status) == 200 ]] || {
            fail "page after=$after: status $(http_status)"
            break
        }
        pages=$((pages + 1))
        ids="$ids $(jq -r '[.items[].id] | join(" ")' <<<"$page")"
        n=$(jq '.items | length' <<<"$page")
        cur=$(jq -r 'if .next_cursor == null then "null" else (.next_cursor | type) + ":" + (.next_cursor | tostring) end' <<<"$page")
        [[ $cur == null ]] && break
        last=$(jq -r '.items[-1].hubsequence | tostring' <<<"$page")
        [[ $n == 2 && $cur == "string:$last" ]] || cursor_ok=0
        after=${cur#string:}
    done
    ids=$(tr -s ' ' <<<"$ids" | sed 's/^ //; s/ $//')
    assert_eq "$ids_all" "$ids" "paging with limit=2 and next_cursor returns every event once, in order"
    assert_eq 1 "$cursor_ok" "a full page's next_cursor is its last sequence as a string"
    assert_ge "$pages" "$(((n_all + 1) / 2))" "… over $pages pages"

    body=$(pull "$KEY" "/v1/events?after=$BIN1_SEQ&limit=500")
    assert_eq "$(jq -r --argjson s "$BIN1_SEQ" '[.items[] | select(.hubsequence > $s) | .id] | join(" ")' "$WORK/pull_all.json")" \
        "$(jq -r '[.items[].id] | join(" ")' <<<"$body" 2>/dev/null)" "after=<seq> gives the events after it only"

    body=$(pull "$KEY" '/v1/events?type=transaction.*')
    assert_eq "bin-1" "$(jq -r '[.items[].id] | join(" ")' <<<"$body" 2>/dev/null)" "type=transaction.* filter"
    body=$(pull "$KEY" '/v1/events?type=balance.updated')
    assert_eq "st-1" "$(jq -r '[.items[].id] | join(" ")' <<<"$body" 2>/dev/null)" "type=balance.updated filter"
    body=$(pull "$KEY" '/v1/events?type=*&limit=500')
    assert_eq "$ids_all" "$(jq -r '[.items[].id] | join(" ")' <<<"$body" 2>/dev/null)" "type=* gives everything"
    body=$(pull "$KEY" '/v1/events?type=nothing.here')
    assert_eq "200|0|null" "$(http_status)|$(jq -r '"\(.items | length)|\(.next_cursor)"' <<<"$body" 2>/dev/null)" \
        "a type without events: an empty page"

    # the other tenant sees only its own event
    body=$(pull "$other_key" '/v1/events?limit=500')
    assert_eq "oth-1|$other" "$(jq -r '[.items[] | "\(.id)|\(.tenantid)"] | join(" ")' <<<"$body" 2>/dev/null)" \
        "another tenant pulls only its own events"

    # empty parameters (SPEC §9 writes ?after=<seq>&limit=&type=) are absent ones
    want=$(pull "$KEY" '/v1/events' | jq -c '[.items[].hubsequence]' 2>/dev/null)
    got=$(pull "$KEY" '/v1/events?after=&limit=&type=' | jq -c '[.items[].hubsequence]' 2>/dev/null)
    assert_eq "200|$want" "$(http_status)|$got" "?after=&limit=&type= lists as no parameters do"
    # bad parameters
    for l in 0 501 abc -1; do
        pull "$KEY" "/v1/events?limit=$l" >/dev/null
        assert_eq "400|limit" "$(http_status)|$(fields)" "limit=$l → 400 naming limit"
    done
    for a in abc -5 1.5; do
        pull "$KEY" "/v1/events?after=$a" >/dev/null
        assert_eq "400|after" "$(http_status)|$(fields)" "after=$a → 400 naming after"
    done
    assert_problem "a bad parameter"

    # one event by sequence
    body=$(pull "$KEY" "/v1/events/$BIN1_SEQ")
    assert_eq 200 "$(http_status)" "GET /v1/events/{seq} → 200"
    assert_eq "$(jq -cS . <<<"$it")" "$(jq -cS . <<<"$body" 2>/dev/null)" "the same object as in the list"
    pull "$KEY" "/v1/events/$oth1_seq" >/dev/null
    assert_eq 404 "$(http_status)" "another tenant's sequence → 404"
    pull "$KEY" "/v1/events/999999999" >/dev/null
    assert_eq 404 "$(http_status)" "an unknown sequence → 404"
    pull "$KEY" "/v1/events/0" >/dev/null
    assert_eq 404 "$(http_status)" "/v1/events/0 → 404 (sequences start at 1)"
    for s in abc 12abc -1 99999999999999999999; do # not a sequence at all: bad input
        pull "$KEY" "/v1/events/$s" >/dev/null
        assert_eq "400|seq" "$(http_status)|$(fields)" "/v1/events/$s → 400 naming seq"
    done
    pull - "/v1/events/$BIN1_SEQ" >/dev/null
    assert_eq 401 "$(http_status)" "GET /v1/events/{seq} without a key → 401"
}

scenario_pull_default_limit_100_maximum_500() {
    local body c
    own_client
    # the tenant has 1000 events
    jq -cn --arg t "$(now3339)" '[range(1000) | {specversion:"1.0", id:"bulk-\(.)", source:"/http/bulk",
        type:"studio.lerian.account.created", time:$t, data:{i:.}}]' >"$WORK/bulk.json"
    post "$KEY" application/cloudevents-batch+json "@$WORK/bulk.json" >/dev/null
    assert_eq 207 "$(http_status)" "the tenant's 1000 events → 207"
    body=$(pull "$KEY" '/v1/events')
    assert_eq "100|string" "$(jq -r '"\(.items | length)|\(.next_cursor | type)"' <<<"$body" 2>/dev/null)" \
        "default limit is 100, the full page has a next_cursor"
    assert_eq "$(jq -r '.items[99].hubsequence | tostring' <<<"$body" 2>/dev/null)" "$(jq -r '.next_cursor' <<<"$body" 2>/dev/null)" \
        "next_cursor is the 100th item's sequence"
    c=$(jq -r '.next_cursor' <<<"$body" 2>/dev/null)
    body=$(pull "$KEY" "/v1/events?after=$c&limit=500")
    assert_eq "500|bulk-100|bulk-599" "$(jq -r '"\(.items | length)|\(.items[0].id)|\(.items[-1].id)"' <<<"$body" 2>/dev/null)" \
        "limit=500 from the cursor: the next 500 events"
}

# ---------------------------------------------------------------------------
# the tallies
# ---------------------------------------------------------------------------

scenario_accepted_counter_equals_the_rows_stored() {
    local accepted0 rows0
    own_client
    accepted0=$(verdict accepted '')
    rows0=$(inbox_count)
    # accepted, duplicate, conflict, invalid, too large, batch with all of them
    post_bin1 >/dev/null
    post_bin1 >/dev/null
    ce bin-1 ce-type=studio.lerian.transaction.posted
    post_bin "$KEY" application/json '{"amount":9999}' >/dev/null
    ce tally-bad "ce-time=yesterday at noon"
    post_bin "$KEY" application/json '{"ok":true}' >/dev/null
    ce tally-big
    post_bin "$KEY" application/json "$(head -c 3000 /dev/zero | tr '\0' 'a' | sed 's/^/"/; s/$/"/')" >/dev/null
    post "$KEY" application/cloudevents-batch+json "[$(structured tally-1), $(structured tally-2),
        $(structured tally-1), $(structured tally-3 'del(.id)'), $(structured tally-2 '.data = {n:2}')]" >/dev/null
    assert_eq 207 "$(http_status)" "a mixed batch → 207"
    assert_eq "$(($(inbox_count) - rows0))" "$(metric_delta "$M{verdict=\"accepted\",reason=\"\"}" "$accepted0")" \
        "accepted counter equals the rows stored"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM event_inbox WHERE topic IS NOT NULL OR kafka_partition IS NOT NULL")" \
        "HTTP events carry no topic, partition or offset"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM quarantine WHERE topic IS NOT NULL")" \
        "HTTP quarantine rows carry no topic"
}

# ---------------------------------------------------------------------------
# concurrent requests share transactions (ingest.c groups the requests that
# wait while others are stored)
# ---------------------------------------------------------------------------

# concurrent_client N: events cc-N-0..9 twice, then cc-0-N with a payload of
# its own; prints each answer's status.
concurrent_client() {
    local n=$1 i
    for i in 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9; do
        curl -s -o /dev/null -w '%{http_code}\n' -X POST -H "Authorization: Bearer $KEY" \
            -H 'Content-Type: application/json' -H ce-specversion:1.0 -H "ce-id:cc-$n-$i" \
            -H ce-source:/http/concurrent -H ce-type:studio.lerian.account.created \
            -H "ce-time:$(now3339)" --data-binary '{"n": 1}' "$HUB_URL/v1/events"
    done
    if ((n > 0)); then # cc-0-N was sent by client 0 with {"n": 1}
        curl -s -o /dev/null -w '%{http_code}\n' -X POST -H "Authorization: Bearer $KEY" \
            -H 'Content-Type: application/json' -H ce-specversion:1.0 -H "ce-id:cc-0-$((n % 10))" \
            -H ce-source:/http/concurrent -H ce-type:studio.lerian.account.created \
            -H "ce-time:$(now3339)" --data-binary "{\"n\": $((n + 100))}" "$HUB_URL/v1/events"
    fi
}

# 39 clients at once, 10 events each, every event sent twice, then one of
# client 0's keys (stored first) with a payload of their own.  Each request
# gets its own verdict: 400 accepted, 400 duplicates, 39 conflicts, all
# stored exactly once.
scenario_concurrent_requests_each_get_their_own_verdict() {
    local pids=() n pid codes
    own_client
    concurrent_client 0 >"$WORK/cc-0.codes" # first: the keys the others conflict with are stored
    for n in $(seq 1 39); do
        concurrent_client "$n" >"$WORK/cc-$n.codes" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do
        wait "$pid"
    done
    codes=$(cat "$WORK"/cc-*.codes | sort | uniq -c | awk '{ printf "%s:%s ", $2, $1 }')
    assert_eq "200:400 202:400 409:39 " "$codes" \
        "40 concurrent clients: each request has its own verdict (202 once per event, 200 for the repeat, 409 for another payload)"
    assert_eq 400 "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND source = '/http/concurrent'")" \
        "the 400 events are stored once each"
    assert_eq 39 "$(psql_q "SELECT count(*) FROM quarantine WHERE tenant_id = '$TENANT' AND source = '/http/concurrent'
                              AND reason = 'digest_conflict'")" \
        "each conflicting request quarantined once"
}

# 2,000 events from 32 keep-alive connections at once (bench-raw-post, each
# request its own ce-id): all accepted and stored, in far fewer transactions
# than requests
scenario_concurrent_posts_share_transactions() {
    local txns0 txns out
    own_client
    raw_headers "$WORK/raw_headers" /http/grouped
    txns0=$(metric streaming_hub_ingest_batch_seconds_count)
    out=$(RAW_POST_HEADERS=$WORK/raw_headers RAW_POST_SEQ_HEADER=ce-id \
        "$BUILD/bench-raw-post" "$HUB_URL/v1/events" 2000 32 256 2>&1)
    assert_eq 0 "$?" "2,000 concurrent events all answered 2xx ($out)"
    txns=$(($(metric streaming_hub_ingest_batch_seconds_count) - txns0))
    assert_eq 2000 "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND source = '/http/grouped'")" \
        "the 2,000 concurrent events are stored once each"
    assert_le "$txns" 1000 "the 2,000 requests shared transactions ($txns)"
}

# ---------------------------------------------------------------------------
# event types and ids as delivered
# ---------------------------------------------------------------------------

# An event type that is a whole ce-type (SPEC §3.1: not studio.lerian.*, no
# resourcetype/eventtype) can be subscribed to exactly and is delivered.
scenario_whole_ce_type_can_be_subscribed_and_delivered() {
    local path psub pprobes
    own_client
    path=/ok/$(own_id)/
    psub=$(subscribe_active "$KEY" "$(subscription_json 'Com.Example.Ping' "$SINK_URL$path")") ||
        fail "the Com.Example.Ping subscription's probe did not finish"
    pprobes=$(sink_count "$path")
    ce ping-1 ce-type=Com.Example.Ping
    post_bin "$KEY" application/json '{"ping":1}' >/dev/null
    assert_eq 202 "$(http_status)" "an event of type Com.Example.Ping → 202"
    if sink_wait $((pprobes + 1)) "$path" 30; then
        pass "the exact subscription to Com.Example.Ping got the event"
    else
        fail "no delivery for the exact subscription to Com.Example.Ping ($psub)"
    fi
}

# An id with a space and a '%' (sent percent-encoded, as the binding wants):
# X-Lerian-Event-Id and webhook-id carry the ce-id itself (SPEC §7.2), the
# ce-id header its percent-encoding.
scenario_percent_encoded_id_is_delivered_decoded() {
    local path pprobes
    own_client
    path=/ok/$(own_id)/
    subscribe_active "$KEY" "$(subscription_json 'Com.Example.Ping' "$SINK_URL$path")" >/dev/null ||
        fail "the Com.Example.Ping subscription's probe did not finish"
    pprobes=$(sink_count "$path")
    ce 'pct%20id%25' ce-type=Com.Example.Ping
    post_bin "$KEY" application/json '{"ping":2}' >/dev/null
    assert_eq 202 "$(http_status)" "an event with id 'pct id%' → 202"
    sink_wait $((pprobes + 1)) "$path" 30 || fail "no delivery of 'pct id%'"
    assert_eq "pct id%|pct id%|pct%20id%25" \
        "$(sink_header "$path" x-lerian-event-id | tail -n1)|$(sink_header "$path" webhook-id | tail -n1)|$(sink_header "$path" ce-id | tail -n1)" \
        "X-Lerian-Event-Id and webhook-id are the ce-id; ce-id is percent-encoded"
}

# schemaversion 0.1.0 is valid semver with major 0 (SPEC §3.1: only an
# unparseable one is invalid): accepted, stored with schema major 0
scenario_schemaversion_0_is_schema_major_0() {
    own_client
    ce sv0-1 ce-schemaversion=0.1.0
    post_bin "$KEY" application/json '{"v":0}' >/dev/null
    assert_eq "202|0" "$(http_status)|$(psql_q "SELECT schema_major FROM event_inbox
                                                WHERE tenant_id = '$TENANT' AND event_id = 'sv0-1'")" \
        "schemaversion 0.1.0 → 202, schema major 0"
}

# ---------------------------------------------------------------------------
# the tenant ingest quota (SPEC §4/§5: quotas.ingest_rate events per second,
# quotas.ingest_burst): 429 + Retry-After over it, nothing stored; a batch is
# charged its event count; malformed quotas are 400 naming them; other
# tenants and the pull API unaffected; a quota removed applies at once
# ---------------------------------------------------------------------------

# quota_post ID: one binary event of $TENANT without a tenantid; prints the status
quota_post() {
    H=("ce-specversion=1.0" "ce-id=$1" "ce-source=/http/quota"
        "ce-type=studio.lerian.account.created" "ce-time=$(now3339)")
    post_bin "$KEY" application/json '{"q":1}' >/dev/null
    http_status
}

# quota ID JSON: PATCH /admin/tenants/ID {"quotas":JSON}; prints the answer.
quota() {
    admin_curl PATCH "/admin/tenants/$1" "{\"quotas\":$2}"
}

scenario_malformed_quotas_are_400() {
    local out
    own_client
    quota "$TENANT" '{"ingest_rate":"fast"}' >/dev/null
    assert_eq 400 "$(http_status)" "a quota that is not a number → 400"
    quota "$TENANT" '{"ingest_rate":0}' >/dev/null
    assert_eq 400 "$(http_status)" "a quota of 0 events/s → 400"
    out=$(quota "$TENANT" '{"ingest_rate":1,"ingest_burst":2.5}')
    assert_eq 400 "$(http_status)" "a fractional burst → 400"
    assert_contains "$out" "quotas.ingest_burst" "the 400 names quotas.ingest_burst"
    out=$(admin_curl POST /admin/tenants "{\"id\":\"$(own_id bad)\",\"quotas\":{\"ingest_rate\":-1}}")
    assert_eq 400 "$(http_status)" "creating a tenant with a negative quota → 400"
    assert_contains "$out" "quotas.ingest_rate" "the 400 names quotas.ingest_rate"
}

scenario_quota_429() {
    local codes i ra other other_key
    own_client
    other=$(own_tenant other)
    other_key=$(tenant_key "$other")
    quota "$TENANT" '{"ingest_rate":1,"ingest_burst":3,"note":"kept"}' >/dev/null
    assert_eq 200 "$(http_status)" "the tenant gets a quota of 1 event/s, burst 3"
    assert_eq kept "$(psql_q "SELECT quotas->>'note' FROM tenants WHERE id = '$TENANT'")" \
        "other members of quotas are kept as given"
    codes=""
    for i in 1 2 3 4; do
        codes="$codes $(quota_post "q-$i")"
    done
    assert_eq " 202 202 202 429" "$codes" "burst of 3 events, the 4th at once → 429"
    assert_problem "the quota's 429"
    ra=$(last_header retry-after)
    if [[ $ra =~ ^[0-9]+$ ]] && ((ra >= 1 && ra <= 2)); then
        pass "the quota's 429 carries Retry-After ($ra s)"
    else
        fail "the quota's 429 without Retry-After of 1-2 s: '$ra'"
    fi
    assert_eq 0 "$(id_count q-4)" "the refused event is not stored"
    TENANT=$other post "$other_key" application/cloudevents+json \
        "$(TENANT=$other structured st-quota-other)" >/dev/null
    assert_eq 202 "$(http_status)" "another tenant is not limited by the tenant's quota"
    pull "$KEY" '/v1/events?limit=1' >/dev/null
    assert_eq 200 "$(http_status)" "the ingest quota does not limit pulls"
    [[ $ra =~ ^[0-9]+$ ]] && ((ra <= 5)) && sleep "$ra"
    sleep 0.2
    assert_eq 202 "$(quota_post q-4)" "after Retry-After seconds the event is accepted"
    assert_eq 1 "$(id_count q-4)" "and stored"
}

# a batch of 5 against a burst of 3: admitted while a token is left, then
# paid for: the next request waits ~4 s
scenario_quota_charges_a_batch_per_event() {
    local batch ra
    own_client
    quota "$TENANT" '{"ingest_rate":1,"ingest_burst":3}' >/dev/null
    assert_eq 200 "$(http_status)" "the tenant gets a quota of 1 event/s, burst 3"
    batch=$(for i in 1 2 3 4 5; do
        jq -cn --arg id "qb-$i" --arg t "$(now3339)" '{specversion:"1.0", id:$id, source:"/http/quota",
            type:"studio.lerian.account.created", time:$t, data:{n:1}}'
    done | jq -cs .)
    post "$KEY" application/cloudevents-batch+json "$batch" >/dev/null
    assert_eq 207 "$(http_status)" "a batch of 5 with 3 tokens left is admitted"
    assert_eq 5 "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id LIKE 'qb-%'")" \
        "all 5 stored"
    assert_eq 429 "$(quota_post q-after-batch)" "the batch's 5 events were charged: the next is 429"
    ra=$(last_header retry-after)
    if [[ $ra =~ ^[0-9]+$ ]] && ((ra >= 2 && ra <= 4)); then
        pass "Retry-After covers the batch's debt ($ra s)"
    else
        fail "Retry-After after a batch of 5 at 1/s with burst 3 should be 2-4 s: '$ra'"
    fi
}

scenario_quota_removed_applies_at_once() {
    local codes i
    own_client
    quota "$TENANT" '{"ingest_rate":1,"ingest_burst":3}' >/dev/null
    codes=""
    for i in 1 2 3 4; do
        codes="$codes $(quota_post "qd-$i")"
    done
    assert_eq " 202 202 202 429" "$codes" "with the quota the 4th event at once → 429"
    quota "$TENANT" null >/dev/null
    assert_eq 200 "$(http_status)" "the quota is removed"
    codes=""
    for i in 1 2 3 4 5; do
        codes="$codes $(quota_post "qn-$i")"
    done
    assert_eq " 202 202 202 202 202" "$codes" "without a quota nothing is limited"
}

# ---------------------------------------------------------------------------
# scenarios with a hub of their own (they stop or reconfigure it)
# ---------------------------------------------------------------------------

# SIGTERM while 64 connections keep posting: the hub exits cleanly (status
# 0, checked by hub_stop), with nothing leaked in the sanitizer pass
scenario_sigterm_while_posting_exits_cleanly() {
    local raw_pid
    own_client
    raw_headers "$WORK/raw_headers" /http/shutdown
    RAW_POST_HEADERS=$WORK/raw_headers RAW_POST_SEQ_HEADER=ce-id \
        "$BUILD/bench-raw-post" "$HUB_URL/v1/events" 20000 64 256 >/dev/null 2>&1 &
    raw_pid=$!
    track_pid "$raw_pid"
    sleep 0.5
    hub_stop
    wait "$raw_pid" 2>/dev/null # refused or cut off once the hub is gone: expected
    assert_ge "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND source = '/http/shutdown'")" 1 \
        "events were being stored when SIGTERM came"
}

# Creating or dropping a day's partition locks its parent: the periodic
# upkeep waited behind any reader of the inbox (a pg_dump, a long replay)
# with no bound, and every ingest queued behind it for as long as the
# reader read.  It now waits at most 200 ms for the lock and tries again at
# its next run (every second here; hourly by default).
hub_env_partition_upkeep_never_holds_ingest() {
    echo STREAMING_HUB_MAINTENANCE_INTERVAL=1s
}

scenario_partition_upkeep_never_holds_ingest() {
    local far holder start ms worst=0 i
    own_client
    far=event_inbox_$(date -u -d '+3 days' +%Y%m%d)
    psql_q "DROP TABLE IF EXISTS $far" >/dev/null # the upkeep has a partition to make
    psql_q "BEGIN; SELECT 1 FROM event_inbox LIMIT 1; SELECT pg_sleep(5); COMMIT" >/dev/null &
    holder=$!
    sleep 1.2 # the upkeep has run into the reader's lock
    for i in 1 2 3 4 5; do
        ce "upkeep-$i"
        start=$(date +%s%N)
        post_bin "$KEY" application/json '{"n":1}' >/dev/null
        ms=$((($(date +%s%N) - start) / 1000000))
        assert_eq 202 "$(http_status)" "event $i accepted while a reader holds the inbox"
        ((ms > worst)) && worst=$ms
        sleep 0.3
    done
    log "slowest of five events beside a 5-s reader and the upkeep: $worst ms"
    assert_le "$worst" 1000 "no event waited for the reader behind the upkeep ($worst ms)"
    wait "$holder"
    wait_until 10 "[[ \$(psql_q \"SELECT to_regclass('$far') IS NOT NULL\") == t ]]" ||
        fail "the upkeep did not make $far once the reader was done"
    pass "the upkeep made $far once the reader was done"
}

# the pull rate limit: PULL_RATE=1 PULL_BURST=3, per tenant
hub_env_pull_rate_limit_429() {
    echo STREAMING_HUB_PULL_RATE=1 STREAMING_HUB_PULL_BURST=3
}

scenario_pull_rate_limit_429() {
    local other_key codes ra seq
    own_client
    other_key=$(own_tenant_key other)
    ce pr-1
    seq=$(post_bin "$KEY" application/json '{"p":1}' | jq -r '.sequence' 2>/dev/null)
    assert_eq 202 "$(http_status)" "an event to pull → 202"
    codes=""
    for _ in 1 2 3 4; do
        pull "$KEY" '/v1/events?limit=1' >/dev/null
        codes="$codes $(http_status)"
    done
    assert_eq " 200 200 200 429" "$codes" "burst of 3, the 4th quick pull → 429"
    ra=$(last_header retry-after)
    if [[ $ra =~ ^[0-9]+$ ]] && ((ra >= 1)); then
        pass "429 carries Retry-After ($ra s)"
    else
        fail "429 without an integer Retry-After >= 1: '$ra'"
    fi
    pull "$other_key" '/v1/events?limit=1' >/dev/null
    assert_eq 200 "$(http_status)" "another tenant is unaffected"
    pull "$KEY" "/v1/events/$seq" >/dev/null
    assert_eq 429 "$(http_status)" "GET /v1/events/{seq} is limited by the same bucket"
    [[ $ra =~ ^[0-9]+$ ]] && ((ra <= 5)) && sleep "$ra"
    sleep 0.2
    pull "$KEY" '/v1/events?limit=1' >/dev/null
    assert_eq 200 "$(http_status)" "after Retry-After seconds the tenant may pull again"
    post "$KEY" application/cloudevents+json "$(structured st-after-limit)" >/dev/null
    assert_eq 202 "$(http_status)" "the pull limit does not limit ingest"
}

scenarios_main "$@"
