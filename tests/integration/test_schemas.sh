#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# The schema registry and validation at ingest (SPEC §3.5, docs/schemas.md).
#
# Covers: registering, fetching, listing and retiring versions (admin and
# tenant), digest / registered_at / who, idempotent re-registration, 409 for
# a changed body under the same version, 400 naming the schema pointer for
# a schema that is not draft-07 and for a malformed version, 409 naming each
# breaking change of a new minor (a new major is free), audit rows; HTTP
# ingest of a type with a schema: valid → 202 with the version recorded on
# the event, invalid → 422 with errors[] by pointer and a schema_violation
# quarantine row with evidence, a payload that is not JSON → 422 too; an
# unknown major accepted by default (counted) and quarantined by the type's
# setting; Kafka ingest quarantined the same way, a tenant off the roster
# or inactive dropped, not quarantined; the tenant's versions of a
# major hide the platform's, and never reach another tenant; a hostile
# payload does not hold up another tenant; a schema of 9,000 costly patterns
# is refused quickly with 400 naming the pattern; a big schema registers without
# holding up /healthz (the compile runs off the loop), tenants take turns
# at the compile (a burst of one never holds another, nor does a steady
# stream of two at a time; 429 past 8 waiting),
# and clients that hang
# up on theirs leave nothing behind; a tenant at its cap
# of live versions or bytes is refused with 409 naming it, and others are
# not; a reload compiles only new schemas (one registered beside 3 MiB of
# big ones is in use within 300 ms, and the 201 comes once it is);
# deliveries carry
# X-Lerian-Schema-Version; two processes: a schema registered on one
# validates on the other within 1 s.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/ingest_http.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/ingest_http.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"

TOPIC=lerian.streaming.schemas
# the event type ev_post's ce-type (studio.lerian.account.created) derives
TYPE=account.created
M='streaming_hub_ingest_records_total'
# the per-scope caps of the shared hub (low, so a scenario reaches them)
CAP_VERSIONS=30

# An account schema: an object with a required string id and a bounded
# integer amount.
SCHEMA_V1='{"type":"object","required":["id"],"properties":{"id":{"type":"string","pattern":"^acc-[0-9]+$"},"amount":{"type":"integer","minimum":0,"maximum":1000}}}'

setup() {
    pg_start
    kafka_start --topic "$TOPIC:2"
    sink_start
    hub_shared STREAMING_HUB_KEK="$(head -c 32 /dev/urandom | base64)" \
        STREAMING_HUB_ALLOW_PRIVATE_SINKS=true STREAMING_HUB_SCHEMA_POLL=100ms \
        STREAMING_HUB_SCHEMA_MAX_VERSIONS=$CAP_VERSIONS STREAMING_HUB_SCHEMA_MAX_BYTES=3MiB
}

# tput KEY TYPE VERSION BODY: PUT /v1/schemas/TYPE/VERSION as KEY's tenant.
tput() {
    hub_curl PUT "/v1/schemas/$2/$3" "$4" -H "Authorization: Bearer $1"
}

# ev_schema KEY ID DATA VERSION [more curl args]: ev_post with ce-schemaversion.
ev_schema() {
    local key=$1 id=$2 data=$3 version=$4
    shift 4
    ev_post "$key" "$id" "$data" /schemas -H "ce-schemaversion: $version" "$@"
}

# until_422 TRIES PAUSE ID_PREFIX: posts {"id":5} (invalid for SCHEMA_V1)
# as version 1.0.0 of $TENANT with $KEY until it is refused (422), at most
# TRIES times PAUSE apart; sets code (the last status) and ms (how long).
until_422() {
    local i start
    start=$(date +%s%N)
    code=0
    for i in $(seq 1 "$1"); do
        ev_schema "$KEY" "$3-$i" '{"id":5}' 1.0.0 >/dev/null
        code=$(http_status)
        [[ $code == 422 ]] && break
        sleep "$2"
    done
    ms=$((($(date +%s%N) - start) / 1000000))
}

scenario_registry_roundtrip() {
    local t body digest
    t=$(own_id t)
    body=$(admin_curl PUT "/admin/schemas/$t.created/1.0.0" "$SCHEMA_V1")
    assert_eq 201 "$(http_status)" "registered: $body"
    digest=$(json_str digest "$body")
    assert_match "$digest" '^sha256:[0-9a-f]{64}$' "the digest"
    assert_eq admin "$(json_str registered_by "$body")" "who"
    assert_eq platform "$(json_str scope "$body")" "scope"
    assert_match "$(json_str registered_at "$body")" '^20[0-9-]+T' "registered_at"
    # the same body again (another spacing, another member order) is the same version
    body=$(admin_curl PUT "/admin/schemas/$t.created/1.0.0" \
        '{ "properties": {"amount":{"maximum":1000,"minimum":0,"type":"integer"},"id":{"pattern":"^acc-[0-9]+$","type":"string"}}, "required":["id"], "type":"object"}')
    assert_eq 200 "$(http_status)" "re-registration is idempotent: $body"
    assert_eq "$digest" "$(json_str digest "$body")" "same digest"
    admin_curl PUT "/admin/schemas/$t.created/1.0.0" '{"type":"object"}' >/dev/null
    assert_eq 409 "$(http_status)" "a version is immutable"
    body=$(admin_curl GET "/admin/schemas/$t.created/1.0.0")
    assert_eq 200 "$(http_status)" "fetched"
    assert_contains "$body" '"pattern":"^acc-[0-9]+$"' "the schema itself"
    body=$(admin_curl GET /admin/schemas)
    assert_contains "$body" "\"event_type\":\"$t.created\"" "listed"
    admin_curl DELETE "/admin/schemas/$t.created/1.0.0" >/dev/null
    assert_eq 204 "$(http_status)" "retired"
    admin_curl GET "/admin/schemas/$t.created/1.0.0" >/dev/null
    assert_eq 404 "$(http_status)" "a retired version is gone"
    admin_curl DELETE "/admin/schemas/$t.created/1.0.0" >/dev/null
    assert_eq 404 "$(http_status)" "retired twice"
    assert_eq 2 "$(psql_q "SELECT count(*) FROM audit_log WHERE object_id = '$t.created/1.0.0'")" \
        "audited: register and retire"
}

scenario_bad_input() {
    local t body
    t=$(own_id t)
    body=$(admin_curl PUT "/admin/schemas/$t.x/1.0" '{"type":"object"}')
    assert_eq 400 "$(http_status)" "a version that is not semver: $body"
    body=$(admin_curl PUT "/admin/schemas/$t.x/1.0.0" '{"type":"object","properties":{"a":{"type":12}}}')
    assert_eq 400 "$(http_status)" "not draft-07: $body"
    assert_contains "$body" '/properties/a/type' "the pointer is named"
    body=$(admin_curl PUT "/admin/schemas/$t.x/1.0.0" '{"$ref":"#/definitions/missing"}')
    assert_eq 400 "$(http_status)" "an unresolvable \$ref: $body"
    admin_curl PUT "/admin/schemas/$t.x/1.0.0" 'not json' >/dev/null
    assert_eq 400 "$(http_status)" "a body that is not JSON"
    admin_curl PATCH "/admin/schemas/$t.x/1.0.0" '{}' >/dev/null
    assert_eq 405 "$(http_status)" "another method"
    hub_curl PUT "/v1/schemas/$t.x/1.0.0" '{}' >/dev/null
    assert_eq 401 "$(http_status)" "the tenant routes need a key"
}

scenario_compat_409() {
    local t body
    t=$(own_id t)
    admin_curl PUT "/admin/schemas/$t.x/1.0.0" "$SCHEMA_V1" >/dev/null
    assert_eq 201 "$(http_status)" "1.0.0"
    # a new optional property: compatible
    body=$(admin_curl PUT "/admin/schemas/$t.x/1.1.0" \
        '{"type":"object","required":["id"],"properties":{"id":{"type":"string","pattern":"^acc-[0-9]+$"},"amount":{"type":"integer","minimum":0,"maximum":1000},"note":{"type":"string"}}}')
    assert_eq 201 "$(http_status)" "an added optional property is a minor: $body"
    # a new required property and a narrowed bound: breaking
    body=$(admin_curl PUT "/admin/schemas/$t.x/1.2.0" \
        '{"type":"object","required":["id","currency"],"properties":{"id":{"type":"string","pattern":"^acc-[0-9]+$"},"amount":{"type":"integer","minimum":0,"maximum":10},"note":{"type":"string"},"currency":{"type":"string"}}}')
    assert_eq 409 "$(http_status)" "breaking changes: $body"
    assert_contains "$body" '"pointer":"/required' "the new required property named"
    assert_contains "$body" '/properties/amount/maximum' "the narrowed bound named"
    # the same under a new major is free
    admin_curl PUT "/admin/schemas/$t.x/2.0.0" \
        '{"type":"object","required":["id","currency"],"properties":{"currency":{"type":"string"}}}' >/dev/null
    assert_eq 201 "$(http_status)" "a new major is free"
}

# The registrant was recorded cut to 152 characters of the tenant's id
# ("tenant:" in 160 bytes): two tenants sharing those looked alike.
scenario_a_long_tenant_id_is_recorded_whole() {
    local t key
    t=lt-$(printf 'z%.0s' $(seq 1 253)) # 256 characters, the longest id
    tenant_create "$t" active
    key=$(tenant_key "$t")
    tput "$key" "$TYPE" 1.0.0 "$SCHEMA_V1" >/dev/null
    assert_eq 201 "$(http_status)" "a 256-character tenant's schema"
    assert_eq "tenant:$t" "$(json_str registered_by)" "registered_by names the whole id"
}

scenario_http_validation() {
    local body q0 seq
    own_client
    q0=$(metric "$M{verdict=\"quarantined\",reason=\"schema_violation\"}")
    tput "$KEY" "$TYPE" 1.0.0 "$SCHEMA_V1" >/dev/null
    assert_eq 201 "$(http_status)" "the tenant's own schema"
    assert_eq "tenant:$TENANT" "$(json_str registered_by)" "who"
    body=$(ev_schema "$KEY" ok-1 '{"id":"acc-1","amount":5}' 1.0.0)
    assert_eq 202 "$(http_status)" "a valid payload: $body"
    seq=$(json_raw sequence "$body")
    assert_eq 1.0.0 "$(psql_q "SELECT schema_version FROM event_inbox WHERE seq = $seq")" \
        "the version it was checked against is recorded with the event"
    body=$(ev_schema "$KEY" bad-1 '{"id":"nope","amount":5000}' 1.0.0)
    assert_eq 422 "$(http_status)" "an invalid payload: $body"
    assert_eq application/problem+json "$(last_header content-type)" "problem+json"
    assert_contains "$body" '"pointer":"/amount"' "errors[] by pointer (amount)"
    assert_contains "$body" '"pointer":"/id"' "errors[] by pointer (id)"
    assert_contains "$body" '"keyword":"maximum"' "the keyword"
    assert_eq 1 "$(psql_q "SELECT count(*) FROM quarantine WHERE tenant_id = '$TENANT'
        AND event_id = 'bad-1' AND reason = 'schema_violation'
        AND detail::jsonb #>> '{schema,version}' = '1.0.0'
        AND detail::jsonb #>> '{schema,digest}' LIKE 'sha256:%'
        AND jsonb_array_length(detail::jsonb -> 'errors') >= 2")" "quarantined with evidence"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'bad-1'")" \
        "not stored"
    body=$(ev_schema "$KEY" notjson-1 'not json at all' 1.0.0 -H 'Content-Type: text/plain')
    assert_eq 422 "$(http_status)" "a payload that is not JSON: $body"
    # under a JSON content type it keeps the verdict it has without schemas
    body=$(ev_schema "$KEY" notjson-2 '{"id": ' 1.0.0)
    assert_eq 400 "$(http_status)" "malformed JSON under application/json: $body"
    assert_eq 1 "$(psql_q "SELECT count(*) FROM quarantine WHERE tenant_id = '$TENANT'
        AND event_id = 'notjson-2' AND reason = 'invalid_envelope' AND field = 'data'")" \
        "quarantined invalid_envelope, field data"
    # exact version absent: the highest of the major
    ev_schema "$KEY" minor-1 '{"id":"acc-2"}' 1.7.3 >/dev/null
    assert_eq 202 "$(http_status)" "1.7.3 checked against 1.0.0"
    assert_eq 1.0.0 "$(psql_q "SELECT schema_version FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'minor-1'")" \
        "recorded as 1.0.0"
    assert_eq 2 "$(metric_delta "$M{verdict=\"quarantined\",reason=\"schema_violation\"}" "$q0")" \
        "counted by verdict and reason"
    # a batch: each event its own answer
    body=$(ev_batch "$KEY" "$(ev_json b-ok '{"id":"acc-3"}')" "$(ev_json b-bad '{"id":3}')")
    assert_eq 207 "$(http_status)" "batch"
    assert_contains "$body" '"status":422' "the bad element is 422"
    assert_contains "$body" '"status":202' "the good one stored"
}

# A producer's retry of an event stored before its type had a schema (its
# answer lost) is the stored event: a duplicate, as any retry is, not a 422
# that tells the producer it was refused while it is stored and delivered.
# The same key with another payload is the conflict it always was.
scenario_a_retry_of_a_stored_event_stays_a_duplicate() {
    local body
    own_client
    body=$(ev_schema "$KEY" early-1 '{"id":5}' 1.0.0)
    assert_eq 202 "$(http_status)" "stored before the type has a schema: $body"
    tput "$KEY" "$TYPE" 1.0.0 "$SCHEMA_V1" >/dev/null
    assert_eq 201 "$(http_status)" "then a schema it does not meet"
    until_422 50 0.1 probe
    assert_eq 422 "$code" "the schema is in use"
    body=$(ev_schema "$KEY" early-1 '{"id":5}' 1.0.0)
    assert_eq "200 duplicate" "$(http_status) $(json_str verdict "$body")" "the retry: $body"
    body=$(ev_schema "$KEY" early-1 '{"id":6}' 1.0.0)
    assert_eq 409 "$(http_status)" "the key with another payload: $body"
    assert_eq 1 "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'early-1'")" \
        "stored once"
}

# The validator reads a payload as PostgreSQL's json grammar does (integers
# beyond 64 bits, "\u0000" in strings), refuses repeated member names (it
# would check the last, a consumer may read the first), and an event's
# schemaversion spelled v1.0.0 or 1.0.0+build names 1.0.0 exactly.
scenario_payloads_and_versions_read_as_sent() {
    local body
    own_client
    tput "$KEY" "$TYPE" 1.0.0 '{"type":"object","required":["a"],"properties":{"amount":{"type":"integer","minimum":0}}}' >/dev/null
    assert_eq 201 "$(http_status)" "1.0.0 requires a"
    tput "$KEY" "$TYPE" 1.1.0 '{"type":"object","properties":{"amount":{"type":"integer","minimum":0}}}' >/dev/null
    assert_eq 201 "$(http_status)" "1.1.0 does not"
    body=$(ev_schema "$KEY" v-1 '{"amount":1}' v1.0.0)
    assert_eq 422 "$(http_status)" "schemaversion v1.0.0 is checked against 1.0.0: $body"
    body=$(ev_schema "$KEY" v-2 '{"amount":1}' 1.0.0+b7)
    assert_eq 422 "$(http_status)" "… and 1.0.0+b7 too: $body"
    ev_schema "$KEY" v-3 '{"amount":1}' V1.1.0 >/dev/null
    assert_eq 202 "$(http_status)" "V1.1.0 against 1.1.0"
    assert_eq 1.1.0 "$(psql_q "SELECT schema_version FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'v-3'")" \
        "… recorded as 1.1.0"
    body=$(ev_schema "$KEY" big-1 '{"amount":123456789012345678901234567890}' 1.1.0)
    assert_eq 202 "$(http_status)" "an integer beyond 64 bits is JSON: $body"
    body=$(ev_schema "$KEY" big-2 '{"amount":-123456789012345678901234567890}' 1.1.0)
    assert_eq 422 "$(http_status)" "… and is checked by value (minimum 0): $body"
    body=$(ev_schema "$KEY" nul-1 '{"amount":1,"note":"a\u0000b"}' 1.1.0)
    assert_eq 202 "$(http_status)" "a string holding \\u0000 is JSON: $body"
    body=$(ev_schema "$KEY" dup-1 '{"amount":"DROP","amount":5}' 1.1.0)
    assert_eq 422 "$(http_status)" "a payload repeating a member: $body"
    assert_contains "$body" "repeats a member name" "… says so"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'dup-1'")" \
        "… and is not stored"
}

# A minor is compared with the version below it, then inserted: another
# minor registered in between (here by another session holding the scope's
# lock, as a second process would) was not seen, and the new one went in
# unchecked against it (1.2.0 narrowing 1.1.0's enum).  The insert now
# requires the version below to be the one compared with: 409, send again.
scenario_a_minor_registered_meanwhile_is_not_skipped() {
    local lock fifo
    own_client
    tput "$KEY" "$TYPE" 1.0.0 '{"properties":{"kind":{"enum":["a"]}}}' >/dev/null
    assert_eq 201 "$(http_status)" "1.0.0: kind a"
    fifo=$WORK/schema-lock.fifo
    mkfifo "$fifo"
    (psql -XAtq "$STREAMING_HUB_POSTGRES_DSN" <"$fifo" >/dev/null 2>&1) &
    lock=$!
    track_pid "$lock"
    exec {fd}>"$fifo"
    printf "BEGIN;\nSELECT pg_advisory_xact_lock(hashtextextended('event_schemas:%s', 0));\n" "$TENANT" >&"$fd"
    wait_sql 10 1 "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
                    AND pid <> pg_backend_pid()" || fatal "the scope's lock was not taken"
    tput "$KEY" "$TYPE" 1.2.0 '{"properties":{"kind":{"enum":["a"]}}}' >"$WORK/put-120" &
    local put=$!
    # 1.2.0 is compared with 1.0.0 and waits for the lock; 1.1.0 (kind a or
    # b) is registered meanwhile
    wait_sql 10 1 "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
                    AND query LIKE '%pg_advisory_xact_lock%'" || fatal "1.2.0 did not reach the insert"
    printf "INSERT INTO event_schemas (tenant_id, event_type, version, major, minor, patch, schema, digest, registered_by)
            VALUES ('%s', '%s', '1.1.0', 1, 1, 0, '{\"properties\":{\"kind\":{\"enum\":[\"a\",\"b\"]}}}', 'x', 'test');\nCOMMIT;\n" \
        "$TENANT" "$TYPE" >&"$fd"
    exec {fd}>&-
    wait "$put"
    assert_eq 409 "$(http_status)" "1.2.0, checked against 1.0.0 while 1.1.0 went in → 409"
    assert_contains "$(cat "$WORK/put-120")" "send it again" "… saying to send it again"
    tput "$KEY" "$TYPE" 1.2.0 '{"properties":{"kind":{"enum":["a"]}}}' >/dev/null
    assert_eq 409 "$(http_status)" "sent again, it is compared with 1.1.0: kind b is lost → 409"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM event_schemas WHERE tenant_id = '$TENANT' AND version = '1.2.0'")" \
        "1.2.0 is not registered"
}

scenario_unknown_major() {
    local a0 q0 body
    own_client
    tput "$KEY" "$TYPE" 1.0.0 "$SCHEMA_V1" >/dev/null
    a0=$(metric 'streaming_hub_schema_checks_total{result="unknown_accepted"}')
    ev_schema "$KEY" v2-1 '{"anything":true}' 2.0.0 >/dev/null
    assert_eq 202 "$(http_status)" "an unknown major is accepted by default"
    assert_eq 1 "$(metric_delta 'streaming_hub_schema_checks_total{result="unknown_accepted"}' "$a0")" \
        "and counted"
    hub_curl PUT "/v1/schemas/$TYPE" '{"unknown_version":"quarantine"}' -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq 200 "$(http_status)" "the type's setting"
    body=$(hub_curl GET "/v1/schemas/$TYPE" "" -H "Authorization: Bearer $KEY")
    assert_contains "$body" '"settings":{"event_type":"account.created","scope":"tenant","unknown_version":"quarantine"' \
        "the type's list says which setting applies"
    hub_curl PUT "/v1/schemas/$TYPE" '{"unknown_version":"drop"}' -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq 400 "$(http_status)" "a setting that does not exist"
    q0=$(metric "$M{verdict=\"quarantined\",reason=\"unknown_schema_version\"}")
    body=$(ev_schema "$KEY" v2-2 '{"anything":true}' 2.0.0)
    assert_eq 422 "$(http_status)" "quarantined by the setting: $body"
    assert_eq 1 "$(psql_q "SELECT count(*) FROM quarantine WHERE tenant_id = '$TENANT' AND event_id = 'v2-2' AND reason = 'unknown_schema_version'")" \
        "quarantine row"
    assert_eq 1 "$(metric_delta "$M{verdict=\"quarantined\",reason=\"unknown_schema_version\"}" "$q0")" \
        "counted"
    # the tenant's own figures (GET /v1/stats) count it with its quarantines
    wait_until 20 "hub_curl GET /v1/stats '' -H 'Authorization: Bearer $KEY' >/dev/null;
        [[ \$(json_raw quarantined) == 1 && \$(json_raw accepted) == 1 ]]" &&
        pass "per-tenant figures: 1 accepted, 1 quarantined" ||
        fail "per-tenant figures: $(last_body)"
}

scenario_tenant_precedence_and_isolation() {
    local t2 key2 body
    own_client a
    t2=$(own_id b)
    key2=$(own_tenant_key b)
    # the platform's major 1 accepts strings only; tenant a has its own major 1
    admin_curl PUT "/admin/schemas/$(own_id p).t/1.0.0" '{"type":"string"}' >/dev/null
    admin_curl PUT "/admin/schemas/$TYPE/3.0.0" '{"type":"string"}' >/dev/null
    tput "$KEY" "$TYPE" 3.0.0 '{"type":"object"}' >/dev/null
    assert_eq 201 "$(http_status)" "tenant a's major 3"
    ev_schema "$KEY" p-1 '{"x":1}' 3.0.0 >/dev/null
    assert_eq 202 "$(http_status)" "tenant a: its own major 3 wins"
    TENANT=$t2 ev_schema "$key2" p-2 '{"x":1}' 3.0.0 >/dev/null
    assert_eq 422 "$(http_status)" "tenant b: the platform's major 3"
    TENANT=$t2 ev_schema "$key2" p-3 '"a string"' 3.0.0 >/dev/null
    assert_eq 202 "$(http_status)" "tenant b: valid for the platform's"
    # a tenant's schema of a type never applies to another tenant
    tput "$KEY" "$(own_id only).t" 1.0.0 '{"type":"string"}' >/dev/null
    body=$(hub_curl GET "/v1/schemas" "" -H "Authorization: Bearer $key2")
    assert_eq 200 "$(http_status)" "tenant b's list"
    [[ $body != *"$(own_id only).t"* ]] || fail "tenant b sees tenant a's schema: $body"
    hub_curl GET "/v1/schemas/$(own_id only).t/1.0.0" "" -H "Authorization: Bearer $key2" >/dev/null
    assert_eq 404 "$(http_status)" "nor fetches it"
    hub_curl GET "/v1/schemas/$TYPE/3.0.0" "" -H "Authorization: Bearer $key2" >/dev/null
    assert_eq 200 "$(http_status)" "tenant b fetches the platform's version it will be checked against"
    admin_curl DELETE "/admin/schemas/$TYPE/3.0.0" >/dev/null
}

scenario_kafka_quarantine() {
    local t
    t=$(own_tenant)
    admin_curl PUT "/admin/schemas/kafkaschema.tested/1.0.0" '{"type":"object","required":["id"]}' >/dev/null
    assert_eq 201 "$(http_status)" "registered"
    sleep 0.5 # the registry's poll (100 ms here)
    printf '{"no":"id"}' >"$WORK/kafka-bad.json"
    produce --topic "$TOPIC" --tenant "$t" --type studio.lerian.kafkaschema.tested \
        --count 3 --payload-file "$WORK/kafka-bad.json" --id-prefix "$(own_id)-"
    wait_sql 30 3 "SELECT count(*) FROM quarantine WHERE tenant_id = '$t' AND reason = 'schema_violation'" ||
        fail "the Kafka records were not quarantined schema_violation"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$t'")" "none stored"
}

# The roster gate comes before the schema's refusal (SPEC §3.2): a record
# of a tenant not on the roster, or inactive, is dropped and leaves no
# quarantine row, even when its payload fails a platform schema (which an
# active tenant's record, produced last, shows in force).
scenario_kafka_roster_before_schema() {
    local ghost inactive active u0 i0 s0
    ghost=$(own_id ghost)
    inactive=$(own_tenant inactive inactive)
    active=$(own_tenant active)
    admin_curl PUT "/admin/schemas/kafkaroster.tested/1.0.0" '{"type":"object","required":["id"]}' >/dev/null
    assert_eq 201 "$(http_status)" "registered"
    sleep 0.5 # the registry's poll (100 ms here)
    u0=$(metric "$M{verdict=\"dropped\",reason=\"unknown_tenant\"}")
    i0=$(metric "$M{verdict=\"dropped\",reason=\"inactive_tenant\"}")
    s0=$(metric "$M{verdict=\"quarantined\",reason=\"schema_violation\"}")
    printf '{"no":"id"}' >"$WORK/kafka-roster.json"
    produce --topic "$TOPIC" --tenant "$ghost" --type studio.lerian.kafkaroster.tested \
        --count 3 --payload-file "$WORK/kafka-roster.json" --id-prefix "$ghost-"
    produce --topic "$TOPIC" --tenant "$inactive" --type studio.lerian.kafkaroster.tested \
        --count 2 --payload-file "$WORK/kafka-roster.json" --id-prefix "$inactive-"
    produce --topic "$TOPIC" --tenant "$active" --type studio.lerian.kafkaroster.tested \
        --count 1 --payload-file "$WORK/kafka-roster.json" --id-prefix "$active-"
    wait_until 30 '(( $(metric_delta "$M{verdict=\"dropped\",reason=\"unknown_tenant\"}" "$u0") +
        $(metric_delta "$M{verdict=\"dropped\",reason=\"inactive_tenant\"}" "$i0") +
        $(metric_delta "$M{verdict=\"quarantined\",reason=\"schema_violation\"}" "$s0") >= 6 ))' ||
        fail "the six records got no verdict in 30 s"
    assert_eq 3 "$(metric_delta "$M{verdict=\"dropped\",reason=\"unknown_tenant\"}" "$u0")" \
        "the unknown tenant's records dropped unknown_tenant"
    assert_eq 2 "$(metric_delta "$M{verdict=\"dropped\",reason=\"inactive_tenant\"}" "$i0")" \
        "the inactive tenant's records dropped inactive_tenant"
    assert_eq 1 "$(metric_delta "$M{verdict=\"quarantined\",reason=\"schema_violation\"}" "$s0")" \
        "only the active tenant's record quarantined schema_violation (the schema is in force)"
    assert_eq "0 1" "$(psql_q "SELECT count(*) FROM quarantine WHERE tenant_id IN ('$ghost', '$inactive')") $(psql_q "SELECT count(*) FROM quarantine WHERE tenant_id = '$active'")" \
        "no quarantine row for the two, one for the active tenant"
}

scenario_hostile_does_not_stall_others() {
    local t2 key2 start ms evil deep batch i
    own_client a
    key2=$(own_tenant_key b)
    t2=$(own_id b)
    # catastrophic backtracking and deep nesting against a bounded validator
    tput "$KEY" "$TYPE" 1.0.0 '{"type":"object","properties":{"s":{"type":"string","pattern":"^(a+)+$"}}}' >/dev/null
    assert_eq 201 "$(http_status)" "a hostile pattern is registered"
    evil=$(printf 'a%.0s' $(seq 1 3000))b
    deep=$(printf '[%.0s' $(seq 1 3000))$(printf ']%.0s' $(seq 1 3000))
    for i in 1 2 3 4; do
        ev_post_bg "$WORK/evil-$i.out" "$KEY" "evil-$i" "{\"s\":\"$evil\"}" /schemas \
            -H 'ce-schemaversion: 1.0.0'
    done
    ev_post_bg "$WORK/deep.out" "$KEY" deep-1 "{\"s\":$deep}" /schemas -H 'ce-schemaversion: 1.0.0'
    # and a batch of 100 of them at once
    batch=""
    for i in $(seq 1 100); do
        batch+="${batch:+,}{\"specversion\":\"1.0\",\"id\":\"evil-b$i\",\"source\":\"/schemas\",\"type\":\"studio.lerian.account.created\",\"time\":\"$(now3339)\",\"schemaversion\":\"1.0.0\",\"data\":{\"s\":\"$evil\"}}"
    done
    printf '[%s]' "$batch" >"$WORK/evil-batch.json"
    curl -s -o "$WORK/evil-batch.out" -w '%{http_code}' --max-time 120 -X POST \
        -H "Authorization: Bearer $KEY" -H 'Content-Type: application/cloudevents-batch+json' \
        --data-binary "@$WORK/evil-batch.json" "$HUB_URL/v1/events" >"$WORK/evil-batch.status" &
    track_pid $!
    sleep 0.2
    start=$(date +%s%N)
    TENANT=$t2 ev_post "$key2" calm-1 '{"n":1}' >/dev/null
    ms=$((($(date +%s%N) - start) / 1000000))
    assert_eq 202 "$(http_status)" "the other tenant's event stored"
    assert_le "$ms" 2000 "and answered promptly (${ms} ms)"
    wait_until 60 "[[ -s $WORK/evil-batch.status && -s $WORK/deep.out ]]" ||
        fail "the hostile requests were not answered"
    assert_eq 207 "$(cat "$WORK/evil-batch.status")" "the hostile batch answered"
    assert_eq 100 "$(grep -o '"status":422' "$WORK/evil-batch.out" | wc -l)" \
        "each of its events quarantined (the regex bound is a violation, never a pass)"
    assert_contains "$(cat "$WORK/evil-1.out")" "422" "a hostile single event: 422"
    TENANT=$(own_id a) ev_schema "$KEY" after-1 '{"s":"aaa"}' 1.0.0 >/dev/null
    assert_eq 202 "$(http_status)" "the hostile tenant itself still works"
}

# big_schema FILE: writes an allowed but costly schema (0.6 MiB: 8,000
# properties, 250 of them with a pattern of counted repeats; ~70 ms to
# compile) to FILE.
big_schema() {
    awk 'BEGIN {
        printf "{\"type\":\"object\",\"properties\":{"
        for (i = 0; i < 8000; i++) {
            if (i) printf ","
            if (i < 250) printf "\"p%d\":{\"type\":\"string\",\"pattern\":\"^(?:[a-z]\\\\d?){1,20}$\"}", i
            else printf "\"p%d\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":%d,\"enum\":[1,2,3,4,%d]}", i, i, i
        }
        printf "}}"
    }' >"$1"
}

# The reported attack: 9,000 properties each with a pattern of nested
# counted repeats (a valid 0.6 MiB draft-07 schema that took seconds of CPU
# and ~480 MiB per process to compile) is refused with 400 naming the
# pattern over the compiled-size limit, and the hub's memory stays put.
scenario_hostile_schema_refused() {
    local start ms rss0 rss1 body
    own_client
    awk 'BEGIN {
        printf "{\"type\":\"object\",\"properties\":{"
        for (i = 0; i < 9000; i++)
            printf "%s\"p%d\":{\"type\":\"string\",\"pattern\":\"(?:(?:[a-z]\\\\d?){1,30}){1,30}\"}", (i ? "," : ""), i
        printf "}}"
    }' >"$WORK/hostile-schema.json"
    rss0=$(awk '/^VmRSS/ { print $2 }' "/proc/$HUB_PID/status")
    start=$(date +%s%N)
    body=$(hub_curl PUT "/v1/schemas/$TYPE/1.0.0" "" -H "Authorization: Bearer $KEY" \
        -H 'Content-Type: application/json' --data-binary "@$WORK/hostile-schema.json")
    ms=$((($(date +%s%N) - start) / 1000000))
    rss1=$(awk '/^VmRSS/ { print $2 }' "/proc/$HUB_PID/status")
    assert_eq 400 "$(http_status)" "refused (${ms} ms, RSS ${rss0} -> ${rss1} KiB)"
    assert_match "$body" '"pointer":"/properties/p[0-9]+/pattern"' "naming the pattern: ${body:0:300}"
    assert_contains "$body" "compiled patterns over" "and the limit"
    assert_le "$((rss1 - rss0))" 65536 "the hub's memory grew by under 64 MiB"
}

# Even under the validator's limits the most costly schema compiles in
# tens of milliseconds: three registered at once would hold every tenant's
# requests for a few hundred if the loop compiled them.
scenario_registration_compiles_off_the_loop() {
    local start ms put_ms worst=0 n=0 v
    own_client
    big_schema "$WORK/big-schema.json"
    start=$(date +%s%N)
    for v in 1 2 3; do
        curl -s -o "$WORK/big-put-$v.out" -w '%{http_code}' --max-time 60 -X PUT \
            -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
            --data-binary "@$WORK/big-schema.json" "$HUB_URL/v1/schemas/$TYPE/$v.0.0" \
            >"$WORK/big-put-$v.status" &
        track_pid $!
    done
    sleep 0.02
    # /healthz, over and over while the registrations run
    while [[ ! -s $WORK/big-put-1.status || ! -s $WORK/big-put-2.status ||
        ! -s $WORK/big-put-3.status ]] && ((n < 200)); do
        ms=$(curl -s -o /dev/null -w '%{time_total}' --max-time 10 "$HUB_URL/healthz")
        ms=$(awk -v t="$ms" 'BEGIN { printf "%d", t * 1000 }')
        ((ms > worst)) && worst=$ms
        n=$((n + 1))
    done
    wait_until 60 "[[ -s $WORK/big-put-1.status && -s $WORK/big-put-2.status && -s $WORK/big-put-3.status ]]" ||
        fail "the registrations were not answered"
    put_ms=$((($(date +%s%N) - start) / 1000000))
    for v in 1 2 3; do
        assert_eq 201 "$(cat "$WORK/big-put-$v.status")" \
            "big schema $v.0.0 registered: $(head -c 200 "$WORK/big-put-$v.out")"
    done
    assert_ge "$n" 1 "/healthz asked while they registered (${put_ms} ms)"
    assert_le "$worst" 100 "/healthz answered within 100 ms meanwhile (worst ${worst} ms of $n)"
}

# Registrations wait for the compile thread in one queue per tenant, and
# the tenants take turns: another tenant's registration waits for at most
# the one step running, not for a tenant's burst of 16 big ones; a tenant
# holds 8 waiting at most, and one more is refused 429 with Retry-After.
scenario_registrations_take_turns_across_tenants() {
    local key_b start ms v n201=0 n429=0 st # n201: compiled, 201 or 409
    own_client a
    key_b=$(own_tenant_key b)
    big_schema "$WORK/turns-schema.json"
    for v in $(seq 1 16); do
        curl -s -D "$WORK/turns-$v.head" -o /dev/null -w '%{http_code}' --max-time 60 -X PUT \
            -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
            --data-binary "@$WORK/turns-schema.json" "$HUB_URL/v1/schemas/turns.big$v/1.0.0" \
            >"$WORK/turns-$v.status" &
        track_pid $!
    done
    sleep 0.3 # every one of them read (each compiles in ~70 ms: the first few at most done)
    start=$(date +%s%N)
    tput "$key_b" turns.small 1.0.0 '{"type":"object"}' >/dev/null
    ms=$((($(date +%s%N) - start) / 1000000))
    assert_eq 201 "$(http_status)" "the other tenant's registration"
    assert_le "$ms" 400 "it waited for one step, not the burst (${ms} ms)"
    wait_until 60 '[[ $(cat "$WORK"/turns-*.status | wc -c) -ge 48 ]]' ||
        fail "the burst was not answered"
    for v in $(seq 1 16); do
        st=$(cat "$WORK/turns-$v.status")
        case $st in
        201 | 409) n201=$((n201 + 1)) ;; # compiled (409: the tenant's 3 MiB are full)
        429)
            n429=$((n429 + 1))
            assert_match "$(tr -d '\r' <"$WORK/turns-$v.head")" $'(^|\n)[Rr]etry-[Aa]fter: 1(\n|$)' \
                "a refusal carries Retry-After"
            ;;
        *) fail "registration $v answered $st" ;;
        esac
    done
    assert_ge "$n429" 1 "past 8 waiting the tenant's burst is refused 429 ($n201 answered, $n429 refused)"
    assert_ge "$n201" 9 "the running one and the 8 waiting were answered"
}

# A tenant that keeps two registrations going, each client sending the
# next as soon as the last is answered, never has more than one waiting:
# its scope must still wait its turn behind another tenant's, not come
# back as new ahead of it.
scenario_a_steady_tenant_does_not_starve_another() {
    local key_b start ms loop pids=()
    own_client a
    key_b=$(own_tenant_key b)
    big_schema "$WORK/steady-schema.json"
    for loop in 1 2; do
        (
            for v in $(seq 1 8); do
                curl -s -o /dev/null --max-time 60 -X PUT -H "Authorization: Bearer $KEY" \
                    -H 'Content-Type: application/json' --data-binary "@$WORK/steady-schema.json" \
                    "$HUB_URL/v1/schemas/steady.l$loop.v$v/1.0.0"
            done
        ) &
        track_pid $!
        pids+=($!)
    done
    sleep 0.3 # both clients going
    start=$(date +%s%N)
    tput "$key_b" steady.small 1.0.0 '{"type":"object"}' >/dev/null
    ms=$((($(date +%s%N) - start) / 1000000))
    assert_eq 201 "$(http_status)" "the other tenant's registration"
    assert_le "$ms" 400 "it took its turn (${ms} ms)"
    wait "${pids[@]}"
}

# Clients that hang up while their registrations wait for the threadpool
# leave nothing behind: the next registration is answered.
scenario_abandoned_registrations() {
    local v
    own_client
    big_schema "$WORK/gone-schema.json"
    for v in 1 2 3 4; do
        curl -s -o /dev/null --max-time 0.05 -X PUT -H "Authorization: Bearer $KEY" \
            -H 'Content-Type: application/json' --data-binary "@$WORK/gone-schema.json" \
            "$HUB_URL/v1/schemas/gone.big/$v.0.0" &
        track_pid $!
    done
    wait
    tput "$KEY" gone.small 1.0.0 '{"type":"object"}' >/dev/null
    assert_eq 201 "$(http_status)" "the next registration is answered"
    hub_alive || fail "the hub died"
}

# A tenant at a cap is refused with 409 naming it; retiring makes room;
# another tenant registers all along.
scenario_per_tenant_caps() {
    local key2 key3 i body
    own_client a
    key2=$(own_tenant_key b)
    key3=$(own_tenant_key c)
    for i in $(seq 1 "$CAP_VERSIONS"); do
        tput "$KEY" "cap.v$i" 1.0.0 '{"type":"object"}' >/dev/null
        [[ $(http_status) == 201 ]] || fail "version $i of $CAP_VERSIONS refused: $(last_body)"
    done
    body=$(tput "$KEY" cap.over 1.0.0 '{"type":"object"}')
    assert_eq 409 "$(http_status)" "one version over the cap"
    assert_contains "$body" "STREAMING_HUB_SCHEMA_MAX_VERSIONS" "the problem names the cap: $body"
    assert_contains "$(last_header content-type)" "application/problem+json" "problem+json"
    assert_contains "$body" "problem:conflict" "a conflict with what the tenant holds"
    tput "$key2" cap.other 1.0.0 '{"type":"object"}' >/dev/null
    assert_eq 201 "$(http_status)" "another tenant still registers"
    admin_curl PUT "/admin/schemas/$(own_id).platform/1.0.0" '{"type":"object"}' >/dev/null
    assert_eq 201 "$(http_status)" "and so does the platform"
    hub_curl DELETE /v1/schemas/cap.v1/1.0.0 "" -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq 204 "$(http_status)" "a version retired"
    tput "$KEY" cap.over 1.0.0 '{"type":"object"}' >/dev/null
    assert_eq 201 "$(http_status)" "makes room for one more"
    # bytes: 3 MiB of live text fits five of the 0.6 MiB schemas, not six
    big_schema "$WORK/cap-big.json"
    for i in 1 2 3 4 5 6; do
        hub_curl PUT "/v1/schemas/cap.big/$i.0.0" "" -H "Authorization: Bearer $key3" \
            -H 'Content-Type: application/json' --data-binary "@$WORK/cap-big.json" >/dev/null
        [[ $(http_status) == 201 ]] || break
    done
    assert_eq 6 "$i" "five big schemas registered"
    assert_eq 409 "$(http_status)" "the sixth is over the bytes cap"
    assert_contains "$(last_body)" "STREAMING_HUB_SCHEMA_MAX_BYTES" "the problem names it"
    tput "$key2" cap.other 2.0.0 '{"type":"object"}' >/dev/null
    assert_eq 201 "$(http_status)" "another tenant still registers"
}

# A reload compiles only the schemas no snapshot in use has: with 3 MiB of
# big schemas live (~70 ms each to compile), a new small one is in use
# within 300 ms of its registration, not after a compile of everything.
scenario_reload_reuses_compiled_schemas() {
    local key2 i ms code start
    own_client a
    key2=$(own_tenant_key b)
    big_schema "$WORK/reuse-big.json"
    for i in 1 2 3 4 5; do
        hub_curl PUT "/v1/schemas/reuse.big/$i.0.0" "" -H "Authorization: Bearer $key2" \
            -H 'Content-Type: application/json' --data-binary "@$WORK/reuse-big.json" >/dev/null
        assert_eq 201 "$(http_status)" "big schema $i registered"
    done
    sleep 1 # every reload of those done
    # the 201 comes once this process uses the new version: time both
    start=$(date +%s%N)
    tput "$KEY" "$TYPE" 1.0.0 "$SCHEMA_V1" >/dev/null
    assert_eq 201 "$(http_status)" "a small schema registered"
    until_422 1 0 reuse
    assert_eq 422 "$code" "the small schema is in use from the first event after the answer"
    ms=$((($(date +%s%N) - start) / 1000000))
    assert_le "$ms" 300 "within 300 ms of the request (${ms} ms)"
}

scenario_delivery_header() {
    local sub
    own_client
    sub=$(subscribe_at "$KEY" "/ok/$(own_id)" "$TYPE")
    [[ -n $sub ]] || return
    tput "$KEY" "$TYPE" 1.2.0 '{"type":"object"}' >/dev/null
    ev_schema "$KEY" d-1 '{"id":"x"}' 1.2.0 -H 'ce-dataschema: https://schemas.example/account/1.2.0' >/dev/null
    assert_eq 202 "$(http_status)" "stored"
    ev_post "$KEY" d-2 '{"id":"x"}' /schemas-other -H 'ce-type: studio.lerian.other.thing' >/dev/null
    sink_wait 1 "/ok/$(own_id)" 30 || fail "not delivered"
    assert_eq 1.2.0 "$(sink_header "/ok/$(own_id)" x-lerian-schema-version | head -n1)" \
        "X-Lerian-Schema-Version"
    assert_eq https://schemas.example/account/1.2.0 \
        "$(sink_header "/ok/$(own_id)" ce-dataschema | head -n1)" "dataschema forwarded"
}

# Two processes on one database: a schema registered through A is used by
# B within 1 s (B's poll, STREAMING_HUB_SCHEMA_POLL at its default 250 ms).
scenario_two_processes_within_1s() {
    local url_a url_b ms code t saved
    own_client
    t=$TENANT
    url_a=$HUB_URL
    saved=$(cat "$WORK/hub.state")
    # B: the default poll (250 ms), its own process on the same database
    hub_start -STREAMING_HUB_SCHEMA_POLL STREAMING_HUB_ROLE=ingest
    track_pid "$HUB_PID"
    track_pid "$HUB_WRAPPER_PID"
    url_b=$HUB_URL
    local pid_b=$HUB_PID
    printf '%s\n' "$saved" >"$WORK/hub.state"
    hub_state_load
    HUB_URL=$url_a
    hub_curl PUT "/v1/schemas/$TYPE/1.0.0" "$SCHEMA_V1" -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq 201 "$(http_status)" "registered on A"
    HUB_URL=$url_b TENANT=$t until_422 40 0.02 two
    assert_eq 422 "$code" "B validates with A's schema"
    assert_le "$ms" 1000 "within 1 s of the registration (${ms} ms)"
    kill "$pid_b" 2>/dev/null
}

scenarios_main "$@"
