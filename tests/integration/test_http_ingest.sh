#!/usr/bin/env bash
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
# Retry-After, second hub start with PULL_RATE=1 PULL_BURST=3); the tenant
# ingest quota (quotas.ingest_rate / ingest_burst: 429 + Retry-After, batches
# charged per event, malformed quotas 400).
#
# No `set -e`: every check below is an explicit assertion.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"
hub_test_init

command -v jq >/dev/null || fatal "jq is required by this test"

M='streaming_hub_ingest_records_total'
PROBLEM='application/problem+json'
KEK=$(head -c 32 /dev/urandom | base64 -w0)
HUB_ENV=(STREAMING_HUB_KEK="$KEK" STREAMING_HUB_ALLOW_PRIVATE_SINKS=true
    STREAMING_HUB_MAX_EVENT_BYTES=2048)

pg_start
kafka_start --topic lerian.streaming.http:1
sink_start 0
hub_start "${HUB_ENV[@]}"

tenant_create acme
tenant_create other
tenant_create bulk
KEY=$(tenant_key acme)
OTHER_KEY=$(tenant_key other)
BULK_KEY=$(tenant_key bulk)
[[ -n $KEY && -n $OTHER_KEY && -n $BULK_KEY ]] || fatal "no tenant API keys"

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

now3339() {
    date -u +%Y-%m-%dT%H:%M:%S.%6NZ
}

# post KEY CONTENT_TYPE BODY [curl args...]: POST /v1/events with exactly that
# Content-Type ("-": none at all) and BODY's bytes ("-": no body, else a file
# is read when BODY starts with @); KEY "-" sends no Authorization.  Prints
# the response body (also in $WORK/last_http_body); status for http_status;
# response headers in $WORK/last_http_headers.  hub_curl is not used: it
# forces Content-Type: application/json on any body.
post() {
    local key=$1 ct=$2 body=$3
    shift 3
    local args=(-s -X POST --max-time 60 -o "$WORK/last_http_body" -D "$WORK/last_http_headers"
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
    curl "${args[@]}" "$@" "$HUB_URL/v1/events" >"$WORK/last_http_status" 2>/dev/null ||
        echo 000 >"$WORK/last_http_status"
    cat "$WORK/last_http_body" 2>/dev/null
}

# pull KEY PATH_AND_QUERY: GET as KEY ("-": none); body printed, status kept,
# response headers in $WORK/last_http_headers.
pull() {
    local args=(-s --max-time 30 -o "$WORK/last_http_body" -D "$WORK/last_http_headers"
        -w '%{http_code}')
    [[ $1 != - ]] && args+=(-H "Authorization: Bearer $1")
    curl "${args[@]}" "$HUB_URL$2" >"$WORK/last_http_status" 2>/dev/null ||
        echo 000 >"$WORK/last_http_status"
    cat "$WORK/last_http_body" 2>/dev/null
}

# resp_header NAME: the value of response header NAME of the last post/pull.
resp_header() {
    awk -v n="$(tr '[:upper:]' '[:lower:]' <<<"$1")" 'BEGIN { FS = ":" }
        { sub(/\r$/, "") }
        tolower($1) == n { v = substr($0, length($1) + 2); sub(/^[ \t]+/, "", v); print v; exit }' \
        "$WORK/last_http_headers" 2>/dev/null
}

# is_problem: the last answer is application/problem+json.
is_problem() {
    [[ $(resp_header content-type) == "$PROBLEM"* ]]
}

# assert_problem MSG: the last answer is problem+json.
assert_problem() {
    if is_problem; then
        pass "$1 is problem+json"
    else
        fail "$1: content type '$(resp_header content-type)', not $PROBLEM"
    fi
}

# ce ID [EDIT ...]: the header list H of a valid binary-mode event (source
# /http/bin, type studio.lerian.account.created, tenant acme), then each
# EDIT: NAME=VALUE replaces header NAME (or adds it), -NAME removes it.
ce() {
    local id=$1 edit name i replaced
    shift
    H=("ce-specversion=1.0" "ce-id=$id" "ce-source=/http/bin"
        "ce-type=studio.lerian.account.created" "ce-time=$(now3339)" "ce-tenantid=acme")
    for edit in "$@"; do
        if [[ $edit == -* ]]; then
            name=${edit#-}
            for i in "${!H[@]}"; do
                [[ ${H[$i]%%=*} == "$name" ]] && unset 'H[i]'
            done
            H=("${H[@]}")
        else
            name=${edit%%=*}
            replaced=0
            for i in "${!H[@]}"; do
                if [[ ${H[$i]%%=*} == "$name" ]]; then
                    H[i]=$edit
                    replaced=1
                fi
            done
            ((replaced)) || H+=("$edit")
        fi
    done
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
# studio.lerian.account.created, tenant acme, data {"n":1}) as compact JSON,
# after the jq expression JQ_EDIT (default: none).
structured() {
    jq -cn --arg id "$1" --arg t "$(now3339)" \
        "{specversion:\"1.0\", id:\$id, source:\"/http/structured\",
          type:\"studio.lerian.account.created\", time:\$t, tenantid:\"acme\", data:{n:1}}
         | ${2:-.}"
}

# verdict VERDICT REASON: one verdict counter.
verdict() {
    metric "$M{verdict=\"$1\",reason=\"$2\"}"
}

# inbox_count ID: rows of event_inbox with that event id (any tenant).
inbox_count() {
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

# fields: the "field" members of the last answer's errors[], sorted, space-separated.
fields() {
    jq -r '[.errors[]?.field] | sort | join(" ")' "$WORK/last_http_body" 2>/dev/null
}

# jqb EXPR: jq -r EXPR over the last answer's body.
jqb() {
    jq -r "$1" "$WORK/last_http_body" 2>/dev/null
}

# ---------------------------------------------------------------------------
# subscriptions first: acme takes transaction.* at /ok/http, other takes
# everything at /ok/other (both activated by hand: /ok does not echo the
# verification challenge)
# ---------------------------------------------------------------------------

SUB=$(subscribe_active "$KEY" "$(subscription_json 'transaction.*' "$SINK_URL/ok/http")") ||
    fail "the acme subscription's probe did not finish"
OSUB=$(subscribe_active "$OTHER_KEY" "$(subscription_json '*' "$SINK_URL/ok/other")") ||
    fail "the other subscription's probe did not finish"
PROBES=$(sink_count /ok/http)
OPROBES=$(sink_count /ok/other)

# ---------------------------------------------------------------------------
# 1. authentication: missing or unknown key → 401, nothing stored
# ---------------------------------------------------------------------------

ce auth-1
post_bin - application/json '{"x":1}' >/dev/null
assert_eq 401 "$(http_status)" "POST /v1/events without a key → 401"
post_bin shk_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA application/json '{"x":1}' >/dev/null
assert_eq 401 "$(http_status)" "POST /v1/events with an unknown key → 401"
post_bin "$ADMIN_TOKEN" application/json '{"x":1}' >/dev/null
assert_eq 401 "$(http_status)" "POST /v1/events with the admin token → 401"
assert_eq 0 "$(inbox_count auth-1)" "nothing stored without a valid key"

# ---------------------------------------------------------------------------
# 2. binary mode, accepted: exact bytes, committed before the answer
# ---------------------------------------------------------------------------

BIN1_BODY=$'{ "amount" : 1500,\t"memo":"caf\xc3\xa9", "n":[1, 2 ,3] }'
BIN1_HEX=$(printf '%s' "$BIN1_BODY" | od -An -tx1 -v | tr -d ' \n')
ce bin-1 ce-type=studio.lerian.transaction.posted ce-subject=a%20b%2Fc ce-myext=v1
body=$(post_bin "$KEY" application/json "$BIN1_BODY")
# immediately, no wait: the answer comes after the commit
stored=$(psql_q "SELECT tenant_id || '|' || source || '|' || encode(payload, 'hex') || '|' || (topic IS NULL)
                   || '|' || event_type || '|' || content_type || '|' || seq
                   FROM event_inbox WHERE event_id = 'bin-1'")
assert_eq 202 "$(http_status)" "binary mode event → 202"
assert_eq "bin-1|accepted|number" "$(jq -r '"\(.id)|\(.verdict)|\(.sequence | type)"' <<<"$body" 2>/dev/null)" \
    "202 body: id, verdict accepted, sequence as a JSON number"
BIN1_SEQ=$(jq -r '.sequence' <<<"$body" 2>/dev/null)
assert_eq "acme|/http/bin|$BIN1_HEX|true|transaction.posted|application/json|$BIN1_SEQ" "$stored" \
    "event_inbox has the row as soon as the 202 is read: key's tenant, exact payload bytes, no topic, the answered sequence"
assert_eq 1 "$(verdict accepted '')" "accepted counted in $M"

# no Content-Type: the datacontenttype is application/json
ce bin-noct ce-source=%2Fhttp%2Fpct
post_bin "$KEY" - '{"no":"content-type"}' >/dev/null
assert_eq 202 "$(http_status)" "binary mode without Content-Type → 202"
assert_eq "application/json|7b226e6f223a22636f6e74656e742d74797065227d|/http/pct" \
    "$(psql_q "SELECT content_type || '|' || encode(payload, 'hex') || '|' || source
                 FROM event_inbox WHERE event_id = 'bin-noct'")" \
    "no Content-Type: stored as application/json, body as the data; ce-source percent-decoded"

# a non-JSON content type is stored as given, bytes unchanged
ce bin-text
post_bin "$KEY" 'text/plain' 'hello' >/dev/null
assert_eq 202 "$(http_status)" "binary mode text/plain → 202"
assert_eq "text/plain|68656c6c6f" \
    "$(psql_q "SELECT content_type || '|' || encode(payload, 'hex') FROM event_inbox WHERE event_id = 'bin-text'")" \
    "text/plain body stored as the data with its content type"

# no ce-tenantid: the key's tenant
ce bin-notenant -ce-tenantid
post_bin "$KEY" application/json '{"t":0}' >/dev/null
assert_eq 202 "$(http_status)" "binary mode without ce-tenantid → 202"
assert_eq acme "$(psql_q "SELECT tenant_id FROM event_inbox WHERE event_id = 'bin-notenant'")" \
    "an event without tenantid is stored as the key's tenant"

# a tenantid that is not the key's → 403, nothing stored
q0=$(quarantine_total)
ce bin-wrongtenant ce-tenantid=other
post_bin "$KEY" application/json '{"t":1}' >/dev/null
assert_eq 403 "$(http_status)" "ce-tenantid of another tenant → 403"
assert_problem "the 403"
assert_eq "0|$q0" "$(inbox_count bin-wrongtenant)|$(quarantine_total)" \
    "nothing stored for another tenant's tenantid"

# the other tenant's own event (for isolation checks below)
ce oth-1 ce-tenantid=other
post_bin "$OTHER_KEY" application/json '{"other":true}' >/dev/null
assert_eq 202 "$(http_status)" "the other tenant posts its own event → 202"
OTH1_SEQ=$(jqb .sequence)

# ---------------------------------------------------------------------------
# 3. duplicate and digest conflict
# ---------------------------------------------------------------------------

ce bin-1 ce-type=studio.lerian.transaction.posted ce-subject=a%20b%2Fc ce-myext=v1
body=$(post_bin "$KEY" application/json "$BIN1_BODY")
assert_eq 200 "$(http_status)" "same key, same payload → 200"
assert_eq "bin-1|duplicate" "$(jq -r '"\(.id)|\(.verdict)"' <<<"$body" 2>/dev/null)" \
    "duplicate body: id and verdict duplicate"
assert_eq 1 "$(verdict duplicate '')" "duplicate counted"

ce bin-1 ce-type=studio.lerian.transaction.posted
post_bin "$KEY" application/json '{"amount":9999}' >/dev/null
assert_eq 409 "$(http_status)" "same key, different payload → 409"
assert_problem "the 409"
assert_eq "digest_conflict|acme|/http/bin|bin-1|true" \
    "$(psql_q "SELECT reason || '|' || tenant_id || '|' || source || '|' || event_id || '|' || (topic IS NULL)
                 FROM quarantine WHERE reason = 'digest_conflict'")" \
    "the conflict is quarantined (digest_conflict, with its key, no topic)"
assert_eq "1|$BIN1_HEX" "$(psql_q "SELECT count(*) || '|' || min(encode(payload, 'hex'))
                                     FROM event_inbox WHERE event_id = 'bin-1'")" \
    "the first stored event is kept, never overwritten"
assert_eq 1 "$(verdict quarantined digest_conflict)" "digest conflict counted"

# ---------------------------------------------------------------------------
# 4. invalid envelopes (binary) → 400 naming each attribute, quarantined
# ---------------------------------------------------------------------------

q0=$(quarantine_total)
invalid=0
# bad_bin MSG EXPECTED_FIELDS CONTENT_TYPE BODY: posts H, expects a 400 naming
# exactly EXPECTED_FIELDS and one more invalid_envelope row without a topic.
bad_bin() {
    post_bin "$KEY" "$3" "$4" >/dev/null
    assert_eq 400 "$(http_status)" "$1 → 400"
    is_problem || fail "$1: 400 content type '$(resp_header content-type)', not $PROBLEM"
    assert_eq "$2" "$(fields)" "$1: errors name $2"
    invalid=$((invalid + 1))
    if [[ $2 != *' '* ]]; then
        assert_eq "invalid_envelope|$2|true" "$(last_quarantine)" "$1: quarantined invalid_envelope, field $2, no topic"
    fi
}
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
assert_eq "$((q0 + invalid))" "$(quarantine_total)" "one quarantine row per invalid request"
assert_eq "$invalid" "$(psql_q "SELECT count(*) FROM quarantine WHERE reason = 'invalid_envelope' AND topic IS NULL")" \
    "every invalid request quarantined invalid_envelope with a NULL topic"
assert_eq "$invalid" "$(verdict quarantined invalid_envelope)" "invalid envelopes counted"
assert_eq 0 "$(psql_q "SELECT count(*) FROM event_inbox WHERE event_id LIKE 'bad-%' OR event_id LIKE 'unused%'")" \
    "no invalid event in event_inbox"

# too large: STREAMING_HUB_MAX_EVENT_BYTES=2048
BIG=$(head -c 3000 /dev/zero | tr '\0' 'a' | sed 's/^/{"big":"/; s/$/"}/')
ce big-1
post_bin "$KEY" application/json "$BIG" >/dev/null
assert_eq 413 "$(http_status)" "payload over STREAMING_HUB_MAX_EVENT_BYTES → 413"
assert_eq "too_large" "$(psql_q "SELECT reason FROM quarantine ORDER BY id DESC LIMIT 1")" \
    "the large event is quarantined too_large"
assert_eq 1 "$(verdict quarantined too_large)" "too_large counted"
assert_eq 0 "$(inbox_count big-1)" "the large event is not stored"

# ---------------------------------------------------------------------------
# 5. structured mode
# ---------------------------------------------------------------------------

ST1='{"specversion":"1.0","id":"st-1","source":"/http/structured","type":"studio.lerian.balance.updated","time":"2024-05-01T10:00:00.5+02:00","tenantid":"acme","subject":"s1","data":{"a": 1}}'
body=$(post "$KEY" application/cloudevents+json "$ST1")
assert_eq 202 "$(http_status)" "structured event → 202"
assert_eq "st-1|accepted|number" "$(jq -r '"\(.id)|\(.verdict)|\(.sequence | type)"' <<<"$body" 2>/dev/null)" \
    "structured 202 body"
assert_eq '{"a": 1}|application/json|balance.updated|true|acme' \
    "$(psql_q "SELECT convert_from(payload, 'UTF8') || '|' || content_type || '|' || event_type || '|'
                      || (event_time = '2024-05-01T08:00:00.5Z'::timestamptz) || '|' || tenant_id
                 FROM event_inbox WHERE event_id = 'st-1'")" \
    "structured payload is the data member exactly as written (space kept); time with offset"

post "$KEY" application/cloudevents+json \
    "$(structured st-b64 '.datacontenttype = "application/octet-stream" | del(.data) | .data_base64 = "aGVsbG8sIGJ5dGVzAAE="')" \
    >/dev/null
assert_eq 202 "$(http_status)" "structured event with data_base64 → 202"
assert_eq "68656c6c6f2c2062797465730001|application/octet-stream" \
    "$(psql_q "SELECT encode(payload, 'hex') || '|' || content_type FROM event_inbox WHERE event_id = 'st-b64'")" \
    "data_base64 stored decoded"

post "$KEY" 'Application/CloudEvents+JSON; charset=utf-8' "$(structured st-case)" >/dev/null
assert_eq 202 "$(http_status)" "media type compared case-insensitively, parameters ignored → structured, 202"
assert_eq '{"n":1}' "$(psql_q "SELECT convert_from(payload, 'UTF8') FROM event_inbox WHERE event_id = 'st-case'")" \
    "… and stored as a structured event (data member only)"

post "$KEY" application/cloudevents+json "$(structured st-notenant 'del(.tenantid)')" >/dev/null
assert_eq 202 "$(http_status)" "structured event without tenantid → 202"
assert_eq acme "$(psql_q "SELECT tenant_id FROM event_inbox WHERE event_id = 'st-notenant'")" \
    "stored as the key's tenant"

q0=$(quarantine_total)
post "$KEY" application/cloudevents+json "$(structured st-wrongtenant '.tenantid = "other"')" >/dev/null
assert_eq 403 "$(http_status)" "structured tenantid of another tenant → 403"
assert_problem "the 403"
assert_eq "0|$q0" "$(inbox_count st-wrongtenant)|$(quarantine_total)" "nothing stored"

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
assert_eq "$invalid" "$(verdict quarantined invalid_envelope)" "structured invalid envelopes counted"

post "$KEY" application/cloudevents+xml '<event/>' >/dev/null
assert_eq 415 "$(http_status)" "application/cloudevents+xml → 415"
post "$KEY" application/cloudevents-batch+xml '<events/>' >/dev/null
assert_eq 415 "$(http_status)" "application/cloudevents-batch+xml → 415"

# ---------------------------------------------------------------------------
# 6. batch mode
# ---------------------------------------------------------------------------

q0_id=$(psql_q "SELECT coalesce(max(id), 0) FROM quarantine")
# st-1 goes in as the very text posted above (its data with the space: a
# duplicate) and with other data (a conflict); the rest is built with jq.
b() { jq -cn --arg t "$(now3339)" "{specversion:\"1.0\", source:\"/http/batch\",
        type:\"studio.lerian.account.created\", time:\$t, $1}"; }
BATCH="[$(b 'id:"b-1", data:{n:1}'),
 $ST1,
 $(b 'id:"b-bad", tenantid:"acme", data:{}' | jq -c 'del(.type)'),
 $(b 'id:"b-x", tenantid:"other", data:{}'),
 ${ST1/'{"a": 1}'/'{"a": 2}'},
 $(b 'id:"b-2", tenantid:"acme", data_base64:"AAE=", datacontenttype:"application/octet-stream"')]"
body=$(post "$KEY" application/cloudevents-batch+json "$BATCH")
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
B1_SEQ=$(jq -r '.results[0].sequence' <<<"$body" 2>/dev/null)
B2_SEQ=$(jq -r '.results[5].sequence' <<<"$body" 2>/dev/null)
assert_eq "$B1_SEQ $B2_SEQ" "$(psql_q "SELECT string_agg(seq::text, ' ' ORDER BY event_id)
                                         FROM event_inbox WHERE source = '/http/batch'")" \
    "the accepted batch events are stored with the answered sequences, nothing else of the batch"
assert_ge "$B2_SEQ" "$((B1_SEQ + 1))" "batch events get arrival sequences in order"
assert_eq "0001|application/octet-stream" \
    "$(psql_q "SELECT encode(payload, 'hex') || '|' || content_type FROM event_inbox WHERE event_id = 'b-2'")" \
    "a batch member's data_base64 stored decoded"
assert_eq "digest_conflict invalid_envelope|type" \
    "$(psql_q "SELECT string_agg(reason || CASE WHEN reason = 'invalid_envelope'
                                               THEN '|' || coalesce(field, '') ELSE '' END, ' ' ORDER BY reason)
                 FROM quarantine WHERE id > $q0_id")" \
    "the batch quarantined its invalid event (field type) and its conflict, nothing for the 403"
invalid=$((invalid + 1))
assert_eq "$invalid|2|2" "$(verdict quarantined invalid_envelope)|$(verdict quarantined digest_conflict)|$(verdict duplicate '')" \
    "batch verdicts counted like single events"

body=$(post "$KEY" 'Application/CloudEvents-Batch+JSON; charset=utf-8' "[$(structured b-3)]")
assert_eq "207|202|b-3" "$(http_status)|$(jq -r '"\(.results[0].status)|\(.results[0].id)"' <<<"$body" 2>/dev/null)" \
    "batch media type compared case-insensitively, parameters ignored"

post "$KEY" application/cloudevents-batch+json '[]' >/dev/null
assert_eq 400 "$(http_status)" "an empty batch → 400"
post "$KEY" application/cloudevents-batch+json "$(structured b-obj)" >/dev/null
assert_eq 400 "$(http_status)" "a batch that is an object, not an array → 400"
assert_eq 0 "$(inbox_count b-obj)" "… nothing stored"
post "$KEY" application/cloudevents-batch+json '[{"specversion":"1.0",' >/dev/null
assert_eq 400 "$(http_status)" "a batch that is not JSON → 400"

# 1001 events → 400, nothing stored; 1000 events → 207, all stored
jq -cn --arg t "$(now3339)" '[range(1001) | {specversion:"1.0", id:"over-\(.)", source:"/http/over",
    type:"studio.lerian.account.created", time:$t, data:{i:.}}]' >"$WORK/over.json"
post "$BULK_KEY" application/cloudevents-batch+json "@$WORK/over.json" >/dev/null
assert_eq 400 "$(http_status)" "a batch of 1001 events → 400"
assert_eq 0 "$(psql_q "SELECT count(*) FROM event_inbox WHERE source = '/http/over'")" \
    "nothing of the 1001-event batch is stored"
jq -cn --arg t "$(now3339)" '[range(1000) | {specversion:"1.0", id:"bulk-\(.)", source:"/http/bulk",
    type:"studio.lerian.account.created", time:$t, data:{i:.}}]' >"$WORK/bulk.json"
t0=$SECONDS
body=$(post "$BULK_KEY" application/cloudevents-batch+json "@$WORK/bulk.json")
log "1000-event batch answered in $((SECONDS - t0)) s"
assert_eq 207 "$(http_status)" "a batch of 1000 events → 207"
assert_eq "1000|1000" "$(jq -r '"\(.results | length)|\([.results[] | select(.status == 202)] | length)"' <<<"$body" 2>/dev/null)" \
    "1000 results, all accepted"
assert_eq 1000 "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = 'bulk'")" \
    "the 1000 events are stored when the 207 is read"

# ---------------------------------------------------------------------------
# 7. delivery end to end: exactly the accepted transaction.* event of acme
# ---------------------------------------------------------------------------

sink_wait $((PROBES + 1)) /ok/http 30 || fail "bin-1 was not delivered"
sink_wait $((OPROBES + 1)) /ok/other 30 || fail "oth-1 was not delivered"
sleep 1
assert_eq $((PROBES + 1)) "$(sink_count /ok/http)" "one delivery to acme's transaction.* subscription"
assert_eq bin-1 "$(sink_header /ok/http x-lerian-event-id | grep -v '^$' | tail -n1)" "the delivered event is bin-1"
assert_eq "$BIN1_HEX" "$(sink_bodies /ok/http | tail -n1 | tr -d '\n' | od -An -tx1 -v | tr -d ' \n')" \
    "the delivered body is the exact posted bytes"
assert_eq transaction.posted "$(sink_header /ok/http x-lerian-event-type | tail -n1)" \
    "delivered with its event type"
assert_eq 1 "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$SUB'")" \
    "one job: duplicates, conflicts and invalid events make none"
assert_eq "$((OPROBES + 1))|oth-1" "$(sink_count /ok/other)|$(sink_header /ok/other x-lerian-event-id | tail -n1)" \
    "the other tenant's subscription gets only its own event"
assert_eq 1 "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$OSUB'")" \
    "one job for the other tenant's subscription"

# ---------------------------------------------------------------------------
# 8. pull: GET /v1/events and GET /v1/events/{seq}
# ---------------------------------------------------------------------------

pull - '/v1/events' >/dev/null
assert_eq 401 "$(http_status)" "GET /v1/events without a key → 401"

ACME_IDS=$(psql_q "SELECT string_agg(event_id, ' ' ORDER BY seq) FROM event_inbox WHERE tenant_id = 'acme'")
ACME_SEQS=$(psql_q "SELECT string_agg(seq::text, ' ' ORDER BY seq) FROM event_inbox WHERE tenant_id = 'acme'")
ACME_N=$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = 'acme'")
body=$(pull "$KEY" '/v1/events?after=0&limit=500')
assert_eq 200 "$(http_status)" "GET /v1/events → 200"
echo "$body" >"$WORK/acme_all.json"
assert_eq "$ACME_IDS" "$(jq -r '[.items[].id] | join(" ")' <<<"$body" 2>/dev/null)" \
    "the tenant's accepted events, ascending by sequence, nothing else"
assert_eq "$ACME_SEQS" "$(jq -r '[.items[].sequence | tostring] | join(" ")' <<<"$body" 2>/dev/null)" \
    "each item's sequence (a number) is its arrival sequence"
assert_eq "number|null" "$(jq -r '"\(.items[0].sequence | type)|\(.next_cursor)"' <<<"$body" 2>/dev/null)" \
    "sequence is a JSON number; next_cursor null on a page that is not full"
assert_eq 0 "$(jq '[.items[] | select(.tenantid != "acme")] | length' <<<"$body" 2>/dev/null)" \
    "no other tenant's event"

item() { jq -c --arg id "$1" '.items[] | select(.id == $id)' "$WORK/acme_all.json" 2>/dev/null; }
it=$(item bin-1)
assert_eq "$BIN1_SEQ|/http/bin|studio.lerian.transaction.posted|1.0|acme|transaction.posted|a b/c" \
    "$(jq -r '"\(.sequence)|\(.source)|\(.type)|\(.specversion)|\(.tenantid)|\(.event_type)|\(.subject)"' <<<"$it" 2>/dev/null)" \
    "bin-1 item: sequence, source, type, specversion, tenantid, event_type, subject percent-decoded"
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
    last=$(jq -r '.items[-1].sequence | tostring' <<<"$page")
    [[ $n == 2 && $cur == "string:$last" ]] || cursor_ok=0
    after=${cur#string:}
done
ids=$(tr -s ' ' <<<"$ids" | sed 's/^ //; s/ $//')
assert_eq "$ACME_IDS" "$ids" "paging with limit=2 and next_cursor returns every event once, in order"
assert_eq 1 "$cursor_ok" "a full page's next_cursor is its last sequence as a string"
assert_ge "$pages" "$(((ACME_N + 1) / 2))" "… over $pages pages"

body=$(pull "$KEY" "/v1/events?after=$BIN1_SEQ&limit=500")
assert_eq "$(jq -r --argjson s "$BIN1_SEQ" '[.items[] | select(.sequence > $s) | .id] | join(" ")' "$WORK/acme_all.json")" \
    "$(jq -r '[.items[].id] | join(" ")' <<<"$body" 2>/dev/null)" "after=<seq> gives the events after it only"

body=$(pull "$KEY" '/v1/events?type=transaction.*')
assert_eq "bin-1" "$(jq -r '[.items[].id] | join(" ")' <<<"$body" 2>/dev/null)" "type=transaction.* filter"
body=$(pull "$KEY" '/v1/events?type=balance.updated')
assert_eq "st-1" "$(jq -r '[.items[].id] | join(" ")' <<<"$body" 2>/dev/null)" "type=balance.updated filter"
body=$(pull "$KEY" '/v1/events?type=*&limit=500')
assert_eq "$ACME_IDS" "$(jq -r '[.items[].id] | join(" ")' <<<"$body" 2>/dev/null)" "type=* gives everything"
body=$(pull "$KEY" '/v1/events?type=nothing.here')
assert_eq "200|0|null" "$(http_status)|$(jq -r '"\(.items | length)|\(.next_cursor)"' <<<"$body" 2>/dev/null)" \
    "a type without events: an empty page"

# the other tenant sees only its own event
body=$(pull "$OTHER_KEY" '/v1/events?limit=500')
assert_eq "oth-1|other" "$(jq -r '[.items[] | "\(.id)|\(.tenantid)"] | join(" ")' <<<"$body" 2>/dev/null)" \
    "another tenant pulls only its own events"

# default limit 100, maximum 500 (the bulk tenant has 1000 events)
body=$(pull "$BULK_KEY" '/v1/events')
assert_eq "100|string" "$(jq -r '"\(.items | length)|\(.next_cursor | type)"' <<<"$body" 2>/dev/null)" \
    "default limit is 100, the full page has a next_cursor"
assert_eq "$(jq -r '.items[99].sequence | tostring' <<<"$body" 2>/dev/null)" "$(jq -r '.next_cursor' <<<"$body" 2>/dev/null)" \
    "next_cursor is the 100th item's sequence"
c=$(jq -r '.next_cursor' <<<"$body" 2>/dev/null)
body=$(pull "$BULK_KEY" "/v1/events?after=$c&limit=500")
assert_eq "500|bulk-100|bulk-599" "$(jq -r '"\(.items | length)|\(.items[0].id)|\(.items[-1].id)"' <<<"$body" 2>/dev/null)" \
    "limit=500 from the cursor: the next 500 events"

# empty parameters (SPEC §9 writes ?after=<seq>&limit=&type=) are absent ones
want=$(pull "$KEY" '/v1/events' | jq -c '[.items[].sequence]' 2>/dev/null)
got=$(pull "$KEY" '/v1/events?after=&limit=&type=' | jq -c '[.items[].sequence]' 2>/dev/null)
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
pull "$KEY" "/v1/events/$OTH1_SEQ" >/dev/null
assert_eq 404 "$(http_status)" "another tenant's sequence → 404"
pull "$KEY" "/v1/events/999999999" >/dev/null
assert_eq 404 "$(http_status)" "an unknown sequence → 404"
for s in abc 12abc -1 0; do # sequences are positive: anything else names no event
    pull "$KEY" "/v1/events/$s" >/dev/null
    assert_eq 404 "$(http_status)" "/v1/events/$s → 404"
done
pull - "/v1/events/$BIN1_SEQ" >/dev/null
assert_eq 401 "$(http_status)" "GET /v1/events/{seq} without a key → 401"

# ---------------------------------------------------------------------------
# 9. the tallies
# ---------------------------------------------------------------------------

assert_eq "$(psql_q "SELECT count(*) FROM event_inbox")" "$(verdict accepted '')" \
    "accepted counter equals the rows stored"
assert_eq 0 "$(psql_q "SELECT count(*) FROM event_inbox WHERE topic IS NOT NULL OR kafka_partition IS NOT NULL")" \
    "HTTP events carry no topic, partition or offset"
assert_eq 0 "$(psql_q "SELECT count(*) FROM quarantine WHERE topic IS NOT NULL")" \
    "HTTP quarantine rows carry no topic"

# ---------------------------------------------------------------------------
# 10. concurrent requests share transactions (ingest.c groups the requests
# that wait while others are stored): 39 clients at once, 10 events each,
# every event sent twice, then one of client 0's keys (stored first) with a
# payload of their own.  Each request gets its own verdict: 400 accepted, 400 duplicates,
# 40 conflicts, all stored exactly once.
# ---------------------------------------------------------------------------

concurrent_client() { # N: events cc-N-0..9 twice, then cc-0-N with a payload of its own
    local n=$1 i
    for i in 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9; do
        curl -s -o /dev/null -w '%{http_code}\n' -X POST -H "Authorization: Bearer $BULK_KEY" \
            -H 'Content-Type: application/json' -H ce-specversion:1.0 -H "ce-id:cc-$n-$i" \
            -H ce-source:/http/concurrent -H ce-type:studio.lerian.account.created \
            -H "ce-time:$(now3339)" --data-binary '{"n": 1}' "$HUB_URL/v1/events"
    done
    if ((n > 0)); then # cc-0-N was sent by client 0 with {"n": 1}
        curl -s -o /dev/null -w '%{http_code}\n' -X POST -H "Authorization: Bearer $BULK_KEY" \
            -H 'Content-Type: application/json' -H ce-specversion:1.0 -H "ce-id:cc-0-$((n % 10))" \
            -H ce-source:/http/concurrent -H ce-type:studio.lerian.account.created \
            -H "ce-time:$(now3339)" --data-binary "{\"n\": $((n + 100))}" "$HUB_URL/v1/events"
    fi
}
concurrent_client 0 >"$WORK/cc-0.codes" # first: the keys the others conflict with are stored
pids=()
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
assert_eq 400 "$(psql_q "SELECT count(*) FROM event_inbox WHERE source = '/http/concurrent'")" \
    "the 400 events are stored once each"
assert_eq 39 "$(psql_q "SELECT count(*) FROM quarantine WHERE source = '/http/concurrent' AND reason = 'digest_conflict'")" \
    "each conflicting request quarantined once"

# 2,000 events from 32 keep-alive connections at once (bench-raw-post, each
# request its own ce-id): all accepted and stored, in far fewer transactions
# than requests
cat >"$WORK/raw_headers" <<H
Authorization: Bearer $BULK_KEY
ce-specversion: 1.0
ce-source: /http/grouped
ce-type: studio.lerian.account.created
ce-time: 2026-01-01T00:00:00Z
H
txns0=$(metric streaming_hub_ingest_batch_seconds_count)
out=$(RAW_POST_HEADERS=$WORK/raw_headers RAW_POST_SEQ_HEADER=ce-id \
    "$BUILD/bench-raw-post" "$HUB_URL/v1/events" 2000 32 256 2>&1)
assert_eq 0 "$?" "2,000 concurrent events all answered 2xx ($out)"
txns=$(($(metric streaming_hub_ingest_batch_seconds_count) - txns0))
assert_eq 2000 "$(psql_q "SELECT count(*) FROM event_inbox WHERE source = '/http/grouped'")" \
    "the 2,000 concurrent events are stored once each"
assert_le "$txns" 1000 "the 2,000 requests shared transactions ($txns)"

# ---------------------------------------------------------------------------
# 11. the pull rate limit: PULL_RATE=1 PULL_BURST=3, per tenant
# ---------------------------------------------------------------------------

# SIGTERM while 64 connections keep posting: the hub exits cleanly (status
# 0), with nothing leaked in the sanitizer pass
sed -i 's#^ce-source: .*#ce-source: /http/shutdown#' "$WORK/raw_headers"
RAW_POST_HEADERS=$WORK/raw_headers RAW_POST_SEQ_HEADER=ce-id \
    "$BUILD/bench-raw-post" "$HUB_URL/v1/events" 20000 64 256 >/dev/null 2>&1 &
raw_pid=$!
sleep 0.5
hub_stop
wait "$raw_pid" 2>/dev/null # refused or cut off once the hub is gone: expected
assert_ge "$(psql_q "SELECT count(*) FROM event_inbox WHERE source = '/http/shutdown'")" 1 \
    "events were being stored when SIGTERM came"
hub_start "${HUB_ENV[@]}" STREAMING_HUB_PULL_RATE=1 STREAMING_HUB_PULL_BURST=3
codes=""
for _ in 1 2 3 4; do
    pull "$KEY" '/v1/events?limit=1' >/dev/null
    codes="$codes $(http_status)"
done
assert_eq " 200 200 200 429" "$codes" "burst of 3, the 4th quick pull → 429"
ra=$(resp_header retry-after)
if [[ $ra =~ ^[0-9]+$ ]] && ((ra >= 1)); then
    pass "429 carries Retry-After ($ra s)"
else
    fail "429 without an integer Retry-After >= 1: '$ra'"
fi
pull "$OTHER_KEY" '/v1/events?limit=1' >/dev/null
assert_eq 200 "$(http_status)" "another tenant is unaffected"
pull "$KEY" "/v1/events/$BIN1_SEQ" >/dev/null
assert_eq 429 "$(http_status)" "GET /v1/events/{seq} is limited by the same bucket"
[[ $ra =~ ^[0-9]+$ ]] && ((ra <= 5)) && sleep "$ra"
sleep 0.2
pull "$KEY" '/v1/events?limit=1' >/dev/null
assert_eq 200 "$(http_status)" "after Retry-After seconds the tenant may pull again"
post "$KEY" application/cloudevents+json "$(structured st-after-limit)" >/dev/null
assert_eq 202 "$(http_status)" "the pull limit does not limit ingest"


# ---------------------------------------------------------------------------
# 11b. an event type that is a whole ce-type (SPEC §3.1: not studio.lerian.*,
# no resourcetype/eventtype) can be subscribed to exactly and is delivered
# ---------------------------------------------------------------------------

PSUB=$(subscribe_active "$KEY" "$(subscription_json 'Com.Example.Ping' "$SINK_URL/ok/ping")") ||
    fail "the Com.Example.Ping subscription's probe did not finish"
pprobes=$(sink_count /ok/ping)
ce ping-1 ce-type=Com.Example.Ping
post_bin "$KEY" application/json '{"ping":1}' >/dev/null
assert_eq 202 "$(http_status)" "an event of type Com.Example.Ping → 202"
if wait_until 30 "(( \$(sink_count /ok/ping) > $pprobes ))"; then
    pass "the exact subscription to Com.Example.Ping got the event"
else
    fail "no delivery for the exact subscription to Com.Example.Ping ($PSUB)"
fi

# an id with a space and a '%' (sent percent-encoded, as the binding wants):
# X-Lerian-Event-Id and webhook-id carry the ce-id itself (SPEC §7.2), the
# ce-id header its percent-encoding
pprobes=$(sink_count /ok/ping)
ce 'pct%20id%25' ce-type=Com.Example.Ping
post_bin "$KEY" application/json '{"ping":2}' >/dev/null
assert_eq 202 "$(http_status)" "an event with id 'pct id%' → 202"
wait_until 30 "(( \$(sink_count /ok/ping) > $pprobes ))" || fail "no delivery of 'pct id%'"
assert_eq "pct id%|pct id%|pct%20id%25" \
    "$(sink_header /ok/ping x-lerian-event-id | tail -n1)|$(sink_header /ok/ping webhook-id | tail -n1)|$(sink_header /ok/ping ce-id | tail -n1)" \
    "X-Lerian-Event-Id and webhook-id are the ce-id; ce-id is percent-encoded"

# schemaversion 0.1.0 is valid semver with major 0 (SPEC §3.1: only an
# unparseable one is invalid): accepted, stored with schema major 0
ce sv0-1 ce-schemaversion=0.1.0
post_bin "$KEY" application/json '{"v":0}' >/dev/null
assert_eq "202|0" "$(http_status)|$(psql_q "SELECT schema_major FROM event_inbox WHERE event_id = 'sv0-1'")" \
    "schemaversion 0.1.0 → 202, schema major 0"

# ---------------------------------------------------------------------------
# 12. the tenant ingest quota (SPEC §4/§5: quotas.ingest_rate events per
# second, quotas.ingest_burst): 429 + Retry-After over it, nothing stored;
# a batch is charged its event count; malformed quotas are 400 naming them;
# other tenants and the pull API unaffected; a quota removed applies at once
# ---------------------------------------------------------------------------

admin_curl PATCH /admin/tenants/bulk '{"quotas":{"ingest_rate":"fast"}}' >/dev/null
assert_eq 400 "$(http_status)" "a quota that is not a number → 400"
admin_curl PATCH /admin/tenants/bulk '{"quotas":{"ingest_rate":0}}' >/dev/null
assert_eq 400 "$(http_status)" "a quota of 0 events/s → 400"
out=$(admin_curl PATCH /admin/tenants/bulk '{"quotas":{"ingest_rate":1,"ingest_burst":2.5}}')
assert_eq 400 "$(http_status)" "a fractional burst → 400"
assert_contains "$out" "quotas.ingest_burst" "the 400 names quotas.ingest_burst"
out=$(admin_curl POST /admin/tenants '{"id":"q-bad","quotas":{"ingest_rate":-1}}')
assert_eq 400 "$(http_status)" "creating a tenant with a negative quota → 400"
assert_contains "$out" "quotas.ingest_rate" "the 400 names quotas.ingest_rate"
admin_curl PATCH /admin/tenants/bulk '{"quotas":{"ingest_rate":1,"ingest_burst":3,"note":"kept"}}' >/dev/null
assert_eq 200 "$(http_status)" "bulk gets a quota of 1 event/s, burst 3"
assert_eq kept "$(psql_q "SELECT quotas->>'note' FROM tenants WHERE id = 'bulk'")" \
    "other members of quotas are kept as given"

# quota_post ID: one binary event of tenant bulk; prints the status
quota_post() {
    H=("ce-specversion=1.0" "ce-id=$1" "ce-source=/http/quota"
        "ce-type=studio.lerian.account.created" "ce-time=$(now3339)")
    post_bin "$BULK_KEY" application/json '{"q":1}' >/dev/null
    http_status
}
codes=""
for i in 1 2 3 4; do
    codes="$codes $(quota_post "q-$i")"
done
assert_eq " 202 202 202 429" "$codes" "burst of 3 events, the 4th at once → 429"
assert_problem "the quota's 429"
ra=$(resp_header retry-after)
if [[ $ra =~ ^[0-9]+$ ]] && ((ra >= 1 && ra <= 2)); then
    pass "the quota's 429 carries Retry-After ($ra s)"
else
    fail "the quota's 429 without Retry-After of 1-2 s: '$ra'"
fi
assert_eq 0 "$(inbox_count q-4)" "the refused event is not stored"
post "$OTHER_KEY" application/cloudevents+json "$(structured st-quota-other '.tenantid = "other"')" >/dev/null
assert_eq 202 "$(http_status)" "another tenant is not limited by bulk's quota"
pull "$BULK_KEY" '/v1/events?limit=1' >/dev/null
assert_eq 200 "$(http_status)" "the ingest quota does not limit pulls"
sleep "$ra"
sleep 0.2
assert_eq 202 "$(quota_post q-4)" "after Retry-After seconds the event is accepted"
assert_eq 1 "$(inbox_count q-4)" "and stored"

# a batch of 5 against a burst of 3: admitted while a token is left, then
# paid for: the next request waits ~4 s
admin_curl PATCH /admin/tenants/bulk '{"quotas":{"ingest_rate":1,"ingest_burst":3}}' >/dev/null
sleep 3 # the bucket refills to its burst
batch=$(for i in 1 2 3 4 5; do
    jq -cn --arg id "qb-$i" --arg t "$(now3339)" '{specversion:"1.0", id:$id, source:"/http/quota",
        type:"studio.lerian.account.created", time:$t, data:{n:1}}'
done | jq -cs .)
post "$BULK_KEY" application/cloudevents-batch+json "$batch" >/dev/null
assert_eq 207 "$(http_status)" "a batch of 5 with 3 tokens left is admitted"
assert_eq 5 "$(psql_q "SELECT count(*) FROM event_inbox WHERE event_id LIKE 'qb-%'")" \
    "all 5 stored"
assert_eq 429 "$(quota_post q-after-batch)" "the batch's 5 events were charged: the next is 429"
ra=$(resp_header retry-after)
if [[ $ra =~ ^[0-9]+$ ]] && ((ra >= 2 && ra <= 4)); then
    pass "Retry-After covers the batch's debt ($ra s)"
else
    fail "Retry-After after a batch of 5 at 1/s with burst 3 should be 2-4 s: '$ra'"
fi

admin_curl PATCH /admin/tenants/bulk '{"quotas":null}' >/dev/null
assert_eq 200 "$(http_status)" "the quota is removed"
codes=""
for i in 1 2 3 4 5; do
    codes="$codes $(quota_post "qn-$i")"
done
assert_eq " 202 202 202 202 202" "$codes" "without a quota nothing is limited"

hub_test_done
