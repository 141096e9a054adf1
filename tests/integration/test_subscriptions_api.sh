#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# The subscription and delivery API end to end (SPEC §6, §7.2, §9, §11): real
# HTTP against `streaming-hub serve`, a real PostgreSQL checked with psql and
# the recording sink (tests/support/sink.md) as the destination.
#
# Covers: tenant keys (401), validation errors naming each field, create (201,
# secret shown once, header values redacted, secrets sealed at rest), the
# background verification probe (active for /echo, failed for /status/500),
# the probe's headers and both signatures checked independently with the
# openssl CLI, destination headers delivered, list/get/patch/delete with
# pagination, another tenant's objects (404), /verify (re-enables), rotate-
# secret (two signatures in both headers during the grace), Idempotency-Key
# replay on every POST (bad keys 400 naming the header, only the key's own
# unique violation taken for a race), the audit log, the deliveries routes
# (jobs inserted with psql: the dispatcher is not what is tested here),
# verification as a gate for replay and redeliver (409 naming the state),
# the challenge found deep in a large body, and the SSRF guard at creation
# and https-only in production (a hub of its own), and no KEK (another).
#
# The hub runs with STREAMING_HUB_ROLE=ingest: every role serves the API, and
# this one has no dispatcher that would claim the jobs this test inserts.
# jq is not assumed: the API answers compact JSON, which grep and sed read.
# Every scenario works as tenants of its own, at sink paths of its own.
#
# No `set -e`: lib.sh polls with commands that are expected to fail until the
# awaited thing appears; every check below is an explicit assertion instead.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"

PROBLEM='application/problem+json'
SECRET_VALUE='s3cr3t-header-value'

setup() {
    pg_start
    kafka_start --topic lerian.streaming.test:1
    sink_start
    hub_shared STREAMING_HUB_ROLE=ingest STREAMING_HUB_DELIVERY_TIMEOUT=5s \
        STREAMING_HUB_KEK="$(head -c 32 /dev/urandom | base64 -w0)" \
        STREAMING_HUB_ALLOW_PRIVATE_SINKS=true
}

teardown() {
    sink_stop
}

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

# api KEY METHOD PATH [JSON] [curl args...]: tenant API call.
api() {
    local key=$1 method=$2 path=$3 body=${4:-}
    shift 3
    (($# > 0)) && shift
    hub_curl "$method" "$path" "$body" -H "Authorization: Bearer $key" "$@"
}

# count PATTERN [JSON]: occurrences of a fixed string in the last body.
count() {
    local json=${2:-$(last_body)}
    grep -oF "$1" <<<"$json" | wc -l | tr -d ' '
}

# state_of KEY ID: the subscription's verification_state.
state_of() {
    api "$1" GET "/v1/subscriptions/$2" >/dev/null
    json_str verification_state
}

# wait_state KEY ID STATE: waits up to 20 s for the background probe to
# bring subscription ID to STATE; 1 if it did not.
wait_state() {
    wait_until 20 "[[ \$(state_of '$1' '$2') == $3 ]]"
}

# hexkey SECRET: hex of the HMAC key of a whsec_ secret.
hexkey() {
    printf '%s' "${1#whsec_}" | base64 -d | od -An -tx1 | tr -d ' \n'
}

# lerian_sig HEXKEY TS BODY: "v1,sha256=<hex HMAC(key, "v1:" ts "." body)>".
lerian_sig() {
    printf 'v1,sha256=%s' "$(printf '%s' "v1:$2.$3" |
        openssl dgst -sha256 -mac HMAC -macopt "hexkey:$1" | sed 's/^.*= //')"
}

# webhook_sig HEXKEY ID TS BODY: "v1,<base64 HMAC(key, id "." ts "." body)>".
webhook_sig() {
    printf 'v1,%s' "$(printf '%s' "$2.$3.$4" |
        openssl dgst -sha256 -mac HMAC -macopt "hexkey:$1" -binary | base64 -w0)"
}

# nth N: line N of stdin.
nth() {
    sed -n "${1}p"
}

# sub_body URL [EXTRA_MEMBERS]: a subscription to transaction.posted and
# balance.* at URL with the destination header X-Api-Key.
sub_body() {
    printf '{"event_types":["transaction.posted","balance.*"],"destination":{"kind":"webhook","url":"%s","headers":{"X-Api-Key":"%s"}}%s}' \
        "$1" "$SECRET_VALUE" "${2:-}"
}

# sub_create KEY PATH [EXTRA_MEMBERS]: creates sub_body's subscription at
# $SINK_URL PATH as KEY; prints its id (fatal unless 201).  The answer stays
# the last body (its secret: json_str secret).
sub_create() {
    api "$1" POST /v1/subscriptions "$(sub_body "$SINK_URL$2" "${3:-}")" >/dev/null
    [[ $(http_status) == 201 ]] ||
        fatal "subscription at $2 not created: $(http_status) $(last_body | head -c 300)"
    json_str id
}

# probes_at PATH [verify]: verification probes recorded at PATH (all of
# them; with "verify", only those after the first, the background one).
probes_at() {
    local n
    n=$(sink_header "$1" x-lerian-event-type | grep -c '^subscription\.verification$')
    [[ ${2:-} == verify ]] && n=$((n - 1))
    echo "$n"
}

# own_policy NAME: a policy file NAME.lua that does nothing, loaded (reload).
own_policy() {
    echo 'return {}' >"$WORK/policies/$1.lua"
    admin_curl POST /admin/policies/reload >/dev/null
    [[ $(http_status) == 200 ]] || fatal "policy reload: $(http_status)"
}

# ---------------------------------------------------------------------------
# tenant keys
# ---------------------------------------------------------------------------

scenario_routes_need_a_tenant_key() {
    own_client
    assert_contains "$KEY" "shk_" "the tenant's API key issued"
    hub_curl GET /v1/subscriptions >/dev/null
    assert_eq 401 "$(http_status)" "no key → 401"
    api "shk_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA" GET /v1/subscriptions >/dev/null
    assert_eq 401 "$(http_status)" "unknown key → 401"
    api "$ADMIN_TOKEN" GET /v1/deliveries/1 >/dev/null
    assert_eq 401 "$(http_status)" "the admin token is not a tenant key → 401"
    hub_curl DELETE /v1/subscriptions/whatever/deep/path >/dev/null
    assert_eq 401 "$(http_status)" "unknown path without a key → 401 (nothing revealed)"
}

# ---------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------

scenario_invalid_subscriptions_are_400_naming_each_field() {
    local body f
    own_client
    body=$(api "$KEY" POST /v1/subscriptions '{}')
    assert_eq 400 "$(http_status)" "empty object → 400"
    assert_contains "$(last_header content-type)" "$PROBLEM" "validation errors are problem+json"
    assert_contains "$body" '"field":"event_types"' "missing event_types named"
    assert_contains "$body" '"field":"destination"' "missing destination named"

    body=$(api "$KEY" POST /v1/subscriptions \
        '{"event_types":["*.posted","bad*type","a.b.*","ok.type","ok.type",7,"Com.Example.Order","ping"],"destination":{"kind":"webhook","url":"https://example.com/h"}}')
    assert_eq 400 "$(http_status)" "bad event types → 400"
    for f in 'event_types[0]' 'event_types[1]' 'event_types[2]' 'event_types[4]' 'event_types[5]'; do
        assert_contains "$body" "\"field\":\"$f\"" "bad entry $f named"
    done
    for f in 'event_types[3]' 'event_types[6]' 'event_types[7]'; do
        assert_eq 0 "$(count "\"field\":\"$f\"")" "a valid entry ($f) is not named: any derived event type, e.g. a whole ce-type (SPEC §3.1)"
    done

    body=$(api "$KEY" POST /v1/subscriptions \
        '{"event_types":["*"],"destination":{"kind":"sqs","url":"ftp://example.com/x","headers":{"X-Lerian-Foo":"v","Host":"h","Bad Name":"x","X-Ok":5,"webhook-id":"x","Ce-Id":"x","X-Crlf":"a\r\nInjected: 1"},"extra":1}}')
    assert_eq 400 "$(http_status)" "bad destination → 400"
    for f in destination.kind destination.url destination.extra destination.headers.X-Lerian-Foo \
        destination.headers.Host 'destination.headers.Bad Name' destination.headers.X-Ok \
        destination.headers.webhook-id destination.headers.Ce-Id destination.headers.X-Crlf; do
        assert_contains "$body" "\"field\":\"$f\"" "$f named"
    done

    body=$(api "$KEY" POST /v1/subscriptions \
        '{"event_types":["*"],"schema_major":0,"destination":{"kind":"webhook","url":"http://user:pw@example.com/"},"retry_schedule":["0s","11h","abc"],"ordering":"lifo","max_rate":0,"policy":"nope","enabled":"yes","colour":"blue"}')
    assert_eq 400 "$(http_status)" "bad members → 400"
    for f in schema_major destination.url 'retry_schedule[0]' 'retry_schedule[1]' 'retry_schedule[2]' \
        ordering max_rate policy enabled colour; do
        assert_contains "$body" "\"field\":\"$f\"" "$f named"
    done
    assert_contains "$body" "unknown policy" "an unknown policy is called that"

    body=$(api "$KEY" POST /v1/subscriptions \
        '{"event_types":["*"],"destination":{"kind":"webhook","url":"http://example.com/"},"retry_schedule":["1s","1s","1s","1s","1s","1s","1s","1s","1s","1s","1s","1s","1s"],"policy":"../etc/passwd"}')
    assert_eq 400 "$(http_status)" "13 retry steps → 400"
    assert_contains "$body" '"field":"retry_schedule"' "retry_schedule length named"
    assert_contains "$body" '"field":"policy"' "a policy name with a path is refused"

    api "$KEY" POST /v1/subscriptions '{"event_types":' >/dev/null
    assert_eq 400 "$(http_status)" "malformed JSON → 400"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM subscriptions WHERE tenant_id = '$TENANT'")" \
        "nothing stored by refused requests"
}

# ---------------------------------------------------------------------------
# create, background probe, the probe request itself
# ---------------------------------------------------------------------------

# a policy file the hub has not loaded yet is unknown until a reload
scenario_a_policy_is_usable_once_reloaded() {
    local pol path
    own_client
    pol=$(own_id)
    path=/echo/$(own_id)/
    echo 'return {}' >"$WORK/policies/$pol.lua"
    api "$KEY" POST /v1/subscriptions "$(sub_body "$SINK_URL$path" ",\"policy\":\"$pol\"")" >/dev/null
    assert_eq 400 "$(http_status)" "a policy file not loaded yet → 400"
    admin_curl POST /admin/policies/reload >/dev/null
    assert_eq 200 "$(http_status)" "policy reload → 200"
    api "$KEY" POST /v1/subscriptions "$(sub_body "$SINK_URL$path" ",\"policy\":\"$pol\"")" >/dev/null
    assert_eq 201 "$(http_status)" "once reloaded the policy can be named → 201"
}

scenario_create_shows_the_secret_once_and_seals_it() {
    local pol path body id secret row
    own_client
    pol=$(own_id)
    own_policy "$pol"
    path=/echo/$(own_id)/
    body=$(api "$KEY" POST /v1/subscriptions \
        "$(sub_body "$SINK_URL$path" ",\"policy\":\"$pol\",\"retry_schedule\":[\"10s\",\"1m\"],\"max_rate\":12.5")")
    assert_eq 201 "$(http_status)" "create → 201"
    id=$(json_str id)
    secret=$(json_str secret)
    assert_contains "$secret" "whsec_" "the secret is whsec_…"
    assert_eq 32 "$(printf '%s' "${secret#whsec_}" | base64 -d | wc -c | tr -d ' ')" "the secret is base64 of 32 bytes"
    assert_eq "/v1/subscriptions/$id" "$(last_header location)" "Location of the new subscription"
    assert_eq '"pending"' "$(json_raw verification_state)" "a new subscription is pending"
    assert_eq "\"$TENANT\"" "$(json_raw tenant_id)" "tenant_id"
    assert_eq 1 "$(json_raw schema_major)" "schema_major defaults to 1"
    assert_eq '"unordered"' "$(json_raw ordering)" "ordering defaults to unordered"
    assert_eq true "$(json_raw enabled)" "enabled defaults to true"
    assert_eq 12.5 "$(json_raw max_rate)" "max_rate"
    assert_eq "\"$pol\"" "$(json_raw policy)" "policy"
    assert_contains "$body" '"retry_schedule":["10s","1m"]' "retry_schedule as given"
    assert_contains "$body" '"event_types":["transaction.posted","balance.*"]' "event_types"
    assert_contains "$body" '"headers":{"X-Api-Key":"***"}' "header values are redacted"
    assert_eq 0 "$(count "$SECRET_VALUE")" "the header value is never returned"
    assert_eq null "$(json_raw disabled_reason)" "disabled_reason null"
    assert_match "$id" '^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$' "the id is a UUIDv7"

    row=$(psql_q "SELECT secret_sealed LIKE 'v1:%', headers_sealed LIKE 'v1:%',
                         position('$SECRET_VALUE' IN headers_sealed) = 0,
                         position('${secret#whsec_}' IN secret_sealed) = 0
                    FROM subscriptions WHERE id = '$id'")
    assert_eq "t|t|t|t" "$row" "secret and headers are sealed at rest"
}

scenario_the_probe_verifies_an_echoing_destination() {
    local p id secret evid delid body ts now k
    own_client
    p=/echo/$(own_id)/
    id=$(sub_create "$KEY" "$p")
    secret=$(json_str secret)
    if wait_state "$KEY" "$id" active; then
        pass "the background probe made /echo active"
    else
        fail "verification_state of $id is $(state_of "$KEY" "$id"), not active"
    fi

    assert_eq 1 "$(sink_count "$p")" "one probe request reached the sink"
    assert_eq subscription.verification "$(sink_header "$p" x-lerian-event-type | nth 1)" "X-Lerian-Event-Type"
    evid=$(sink_header "$p" x-lerian-event-id | nth 1)
    assert_match "$evid" '^verify-[0-9a-f-]{36}$' "X-Lerian-Event-Id is verify-<uuid>"
    delid=$(sink_header "$p" x-lerian-delivery-id | nth 1)
    assert_match "$delid" '^[0-9a-f]{8}-[0-9a-f]{4}-7' "X-Lerian-Delivery-Id is a UUIDv7"
    assert_eq "$TENANT" "$(sink_header "$p" x-lerian-tenant-id | nth 1)" "X-Lerian-Tenant-Id"
    assert_eq "$id" "$(sink_header "$p" x-lerian-subscription-id | nth 1)" "X-Lerian-Subscription-Id"
    assert_eq 1 "$(sink_header "$p" x-lerian-attempt | nth 1)" "X-Lerian-Attempt"
    assert_eq "$evid" "$(sink_header "$p" webhook-id | nth 1)" "webhook-id = the event id"
    assert_eq "$evid" "$(sink_header "$p" ce-id | nth 1)" "ce-id = the event id"
    assert_eq 1.0 "$(sink_header "$p" ce-specversion | nth 1)" "ce-specversion"
    assert_eq /streaming-hub "$(sink_header "$p" ce-source | nth 1)" "ce-source"
    assert_eq studio.lerian.subscription.verification "$(sink_header "$p" ce-type | nth 1)" "ce-type"
    assert_match "$(sink_header "$p" ce-time | nth 1)" '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z$' "ce-time is RFC 3339"
    assert_eq application/json "$(sink_header "$p" content-type | nth 1)" "Content-Type"
    assert_contains "$(sink_header "$p" user-agent | nth 1)" "streaming-hub/" "User-Agent"
    assert_eq "$SECRET_VALUE" "$(sink_header "$p" x-api-key | nth 1)" "the destination header is delivered"

    body=$(sink_bodies "$p" | nth 1)
    assert_match "$body" '^\{"challenge":"[A-Za-z0-9_-]{32}"\}$' "the probe body is a challenge"
    ts=$(sink_header "$p" x-lerian-timestamp | nth 1)
    assert_eq "$ts" "$(sink_header "$p" webhook-timestamp | nth 1)" "webhook-timestamp = X-Lerian-Timestamp"
    now=$(date +%s)
    ((ts <= now && ts >= now - 60)) && pass "the timestamp is Unix seconds, recent" || fail "ts $ts"
    k=$(hexkey "$secret")
    assert_eq "$(lerian_sig "$k" "$ts" "$body")" "$(sink_header "$p" x-lerian-signature | nth 1)" \
        "X-Lerian-Signature verifies with the secret (openssl)"
    assert_eq "$(webhook_sig "$k" "$evid" "$ts" "$body")" "$(sink_header "$p" webhook-signature | nth 1)" \
        "webhook-signature verifies with the secret (openssl)"
}

scenario_the_probe_fails_a_destination_that_does_not_echo() {
    local id2 id3
    own_client
    # a failing destination
    api "$KEY" POST /v1/subscriptions "$(sub_body "$SINK_URL/status/500/$(own_id)/")" >/dev/null
    assert_eq 201 "$(http_status)" "create a subscription pointing at /status/500 → 201"
    id2=$(json_str id)
    if wait_state "$KEY" "$id2" failed; then
        pass "the background probe made /status/500 failed"
    else
        fail "verification_state of $id2 is $(state_of "$KEY" "$id2"), not failed"
    fi

    # the echo must contain the challenge: a plain 200 is not enough
    id3=$(sub_create "$KEY" "/ok/$(own_id)/")
    if wait_state "$KEY" "$id3" failed; then
        pass "a 2xx without the challenge in the body fails verification"
    else
        fail "verification_state of $id3 is $(state_of "$KEY" "$id3"), not failed"
    fi
}

# the challenge is looked for in the first 64 KiB of the body (SPEC: "the
# response body contains the challenge"), not only the first 1 KiB
scenario_the_probe_finds_the_challenge_deep_in_the_body() {
    local deep past
    own_client
    deep=$(sub_create "$KEY" "/echo-after/60000/$(own_id)/")
    past=$(sub_create "$KEY" "/echo-after/70000/$(own_id past)/")
    if wait_state "$KEY" "$deep" active; then
        pass "a challenge 60,000 bytes into the body verifies"
    else
        fail "a challenge 60,000 bytes into the body did not verify: $(state_of "$KEY" "$deep")"
    fi
    if wait_state "$KEY" "$past" failed; then
        pass "one past the first 64 KiB does not"
    else
        fail "a challenge past 64 KiB: $(state_of "$KEY" "$past")"
    fi
}

scenario_creations_are_audited() {
    own_client
    sub_create "$KEY" "/echo/$(own_id)/" >/dev/null
    sub_create "$KEY" "/status/500/$(own_id)/" >/dev/null
    sub_create "$KEY" "/ok/$(own_id)/" >/dev/null
    assert_eq 3 "$(psql_q "SELECT count(*) FROM audit_log WHERE actor = 'tenant'
                             AND action = 'subscription.create' AND tenant_id = '$TENANT'")" \
        "creations are audited"
}

# ---------------------------------------------------------------------------
# get, list, tenant isolation
# ---------------------------------------------------------------------------

scenario_get_and_list_in_creation_order() {
    local id1 id3 body cursor
    own_client
    id1=$(sub_create "$KEY" "/echo/$(own_id)/")
    sub_create "$KEY" "/status/500/$(own_id)/" >/dev/null
    id3=$(sub_create "$KEY" "/ok/$(own_id)/")

    body=$(api "$KEY" GET "/v1/subscriptions/$id1")
    assert_eq 200 "$(http_status)" "GET one → 200"
    assert_eq "$id1" "$(json_str id)" "GET returns the subscription"
    assert_eq 0 "$(count '"secret"')" "GET never shows the secret"
    assert_contains "$body" '"headers":{"X-Api-Key":"***"}' "GET shows header names only"
    api "$KEY" GET "/v1/subscriptions/$(tr 'a-f' 'A-F' <<<"$id1")" >/dev/null
    assert_eq 200 "$(http_status)" "an upper-case id finds it too"
    api "$KEY" GET /v1/subscriptions/00000000-0000-7000-8000-000000000000 >/dev/null
    assert_eq 404 "$(http_status)" "unknown id → 404"
    api "$KEY" GET /v1/subscriptions/not-a-uuid >/dev/null
    assert_eq 404 "$(http_status)" "malformed id → 404"

    body=$(api "$KEY" GET '/v1/subscriptions?limit=2')
    assert_eq 200 "$(http_status)" "list → 200"
    assert_eq 2 "$(count '"verification_state"')" "limit=2 → 2 items"
    assert_eq 0 "$(count '"secret"')" "lists never show secrets"
    assert_contains "$body" "\"id\":\"$id1\"" "creation order: the first subscription comes first"
    cursor=$(json_str next_cursor)
    assert_ne "" "$cursor" "a next_cursor is given"
    body=$(api "$KEY" GET "/v1/subscriptions?limit=2&cursor=$cursor")
    assert_eq 1 "$(count '"verification_state"')" "second page: the last item"
    assert_contains "$body" "\"id\":\"$id3\"" "second page holds the third subscription"
    assert_eq null "$(json_raw next_cursor)" "no page after the last"
    body=$(api "$KEY" GET '/v1/subscriptions?limit=0&cursor=bogus!')
    assert_eq 400 "$(http_status)" "bad limit and cursor → 400"
    assert_contains "$body" '"field":"limit"' "limit named"
    assert_contains "$body" '"field":"cursor"' "cursor named"
}

scenario_another_tenants_subscription_is_404() {
    local id1 other body req m p data
    own_client
    other=$(own_tenant_key other)
    id1=$(sub_create "$KEY" "/echo/$(own_id)/")
    body=$(api "$other" GET /v1/subscriptions)
    assert_eq '200 {"items":[],"next_cursor":null}' "$(http_status) $body" "another tenant sees none of the tenant's"
    for req in "GET /v1/subscriptions/$id1" "PATCH /v1/subscriptions/$id1" \
        "DELETE /v1/subscriptions/$id1" "POST /v1/subscriptions/$id1/verify" \
        "POST /v1/subscriptions/$id1/rotate-secret" "GET /v1/subscriptions/$id1/deliveries"; do
        read -r m p <<<"$req"
        data=""
        [[ $m == PATCH ]] && data='{"enabled":false}'
        api "$other" "$m" "$p" "$data" >/dev/null
        assert_eq 404 "$(http_status)" "another tenant: $m {id}${p#/v1/subscriptions/"$id1"} → 404"
    done
    assert_eq t "$(psql_q "SELECT enabled FROM subscriptions WHERE id = '$id1'")" \
        "another tenant's PATCH changed nothing"
}

scenario_other_methods_and_paths_are_405_or_404() {
    local id1
    own_client
    id1=$(sub_create "$KEY" "/echo/$(own_id)/")
    api "$KEY" PUT /v1/subscriptions '{}' >/dev/null
    assert_eq "405 GET, HEAD, POST" "$(http_status) $(last_header allow)" "PUT /v1/subscriptions → 405"
    api "$KEY" GET "/v1/subscriptions/$id1/verify" >/dev/null
    assert_eq "405 POST" "$(http_status) $(last_header allow)" "GET …/verify → 405"
    api "$KEY" GET "/v1/subscriptions/$id1/nothing" >/dev/null
    assert_eq 404 "$(http_status)" "unknown sub-resource → 404"
    api "$KEY" GET "/v1/subscriptions/$id1/deliveries/x/y" >/dev/null
    assert_eq 404 "$(http_status)" "a path of five segments → 404"
    api "$KEY" GET "/v1/subscriptions//deliveries" >/dev/null
    assert_eq 404 "$(http_status)" "an empty path segment → 404"
}

# ---------------------------------------------------------------------------
# patch
# ---------------------------------------------------------------------------

scenario_patch_changes_the_members_and_the_routes() {
    local pol id1 body
    own_client
    pol=$(own_id)
    own_policy "$pol"
    id1=$(sub_create "$KEY" "/echo/$(own_id)/" ",\"policy\":\"$pol\",\"retry_schedule\":[\"10s\",\"1m\"],\"max_rate\":12.5")
    wait_state "$KEY" "$id1" active || fail "the probe did not make $id1 active"
    body=$(api "$KEY" PATCH "/v1/subscriptions/$id1" \
        '{"max_rate":2.5,"ordering":"fifo","schema_major":2,"event_types":["*"],"retry_schedule":null,"policy":null}')
    assert_eq 200 "$(http_status)" "PATCH → 200"
    assert_eq 2.5 "$(json_raw max_rate)" "max_rate changed"
    assert_eq '"fifo"' "$(json_raw ordering)" "ordering changed"
    assert_eq 2 "$(json_raw schema_major)" "schema_major changed"
    assert_eq null "$(json_raw retry_schedule)" "retry_schedule cleared"
    assert_eq null "$(json_raw policy)" "policy cleared"
    assert_eq '"active"' "$(json_raw verification_state)" "a PATCH without a url keeps the state"
    assert_eq "*" "$(psql_q "SELECT string_agg(pattern, ',') FROM subscription_routes
                              WHERE subscription_id = '$id1' AND schema_major = 2")" \
        "the routes follow event_types and schema_major"
    api "$KEY" PATCH "/v1/subscriptions/$id1" '{"enabled":false}' >/dev/null
    assert_eq "false \"disabled\"" "$(json_raw enabled) $(json_raw disabled_reason)" "enabled:false → disabled"
    api "$KEY" PATCH "/v1/subscriptions/$id1" '{"enabled":true}' >/dev/null
    assert_eq "true null" "$(json_raw enabled) $(json_raw disabled_reason)" \
        "enabled:true on an active subscription clears disabled_reason"
    body=$(api "$KEY" PATCH "/v1/subscriptions/$id1" '{"event_types":[],"id":"x","destination":{"kind":"x"}}')
    assert_eq 400 "$(http_status)" "bad PATCH → 400"
    assert_contains "$body" '"field":"event_types"' "event_types named"
    assert_contains "$body" '"field":"id"' "read-only id named"
    assert_contains "$body" '"field":"destination.kind"' "destination.kind named"
    api "$KEY" PATCH "/v1/subscriptions/$id1" '{}' >/dev/null
    assert_eq 400 "$(http_status)" "empty PATCH → 400"
    assert_eq 2 "$(psql_q "SELECT count(*) FROM audit_log WHERE action = 'subscription.update'
                             AND object_id = '$id1' AND detail->'fields' ? 'enabled'")" \
        "updates are audited with the member names"
}

# a new url: pending, then probed in the background
scenario_a_new_url_is_probed_again() {
    local id1 body path
    own_client
    id1=$(sub_create "$KEY" "/echo/$(own_id)/")
    wait_state "$KEY" "$id1" active || fail "the probe did not make $id1 active"
    path=/echo/$(own_id b)/
    body=$(api "$KEY" PATCH "/v1/subscriptions/$id1" "{\"destination\":{\"url\":\"$SINK_URL$path\"}}")
    assert_eq 200 "$(http_status)" "PATCH destination.url → 200"
    assert_eq '"pending"' "$(json_raw verification_state)" "a new url resets the state to pending"
    assert_contains "$body" '"headers":{"X-Api-Key":"***"}' "the headers are kept"
    if wait_state "$KEY" "$id1" active; then
        pass "the new url is probed and active again"
    else
        fail "after the url change $id1 is $(state_of "$KEY" "$id1")"
    fi
    assert_eq "$SECRET_VALUE" "$(sink_header "$path" x-api-key | nth 1)" \
        "the probe of the new url carries the destination header"
}

# ---------------------------------------------------------------------------
# verify
# ---------------------------------------------------------------------------

scenario_verify_reports_the_probe_and_reenables() {
    local id2 body path
    own_client
    id2=$(sub_create "$KEY" "/status/500/$(own_id)/")
    wait_state "$KEY" "$id2" failed || fail "the probe did not make $id2 failed"
    body=$(api "$KEY" POST "/v1/subscriptions/$id2/verify" '{"force":true}')
    assert_eq 400 "$(http_status)" "verify takes no input → 400"
    assert_contains "$body" '"field":"force"' "the unknown member is named"
    body=$(api "$KEY" POST "/v1/subscriptions/$id2/verify" '{}' -H 'Idempotency-Key: two words')
    assert_eq 400 "$(http_status)" "an empty object with a malformed Idempotency-Key → 400"
    assert_contains "$body" '"field":"Idempotency-Key"' "the header is named"
    body=$(api "$KEY" POST "/v1/subscriptions/$id2/verify")
    assert_eq 200 "$(http_status)" "verify a failing destination → 200"
    assert_contains "$body" '"verification":{"ok":false,"status":500' "verification.ok false, status 500"
    assert_eq '"failed"' "$(json_raw verification_state)" "still failed"
    path=/echo/$(own_id b)/
    api "$KEY" PATCH "/v1/subscriptions/$id2" \
        "{\"enabled\":false,\"destination\":{\"url\":\"$SINK_URL$path\",\"headers\":{\"Authorization\":\"Bearer xyz\"}}}" >/dev/null
    assert_eq 200 "$(http_status)" "re-point and disable"
    psql_q "UPDATE subscriptions SET failure_first_at = now(), failure_last_at = now()
             WHERE id = '$id2'" >/dev/null
    body=$(api "$KEY" POST "/v1/subscriptions/$id2/verify")
    assert_eq 200 "$(http_status)" "verify a working destination → 200"
    assert_contains "$body" '"verification":{"ok":true,"status":200,"error":null}' "verification.ok true"
    assert_eq "\"active\" true null" "$(json_raw verification_state) $(json_raw enabled) $(json_raw disabled_reason)" \
        "verify re-enables: active, enabled, no disabled_reason"
    assert_contains "$body" '"headers":{"Authorization":"***"}' "replaced headers, redacted"
    assert_eq "|" "$(psql_q "SELECT failure_first_at, failure_last_at FROM subscriptions WHERE id = '$id2'")" \
        "verify clears the failure streak"
    assert_eq "Bearer xyz" "$(sink_header "$path" authorization | tail -n1)" \
        "the new destination header is delivered"
}

# ---------------------------------------------------------------------------
# rotate-secret
# ---------------------------------------------------------------------------

scenario_rotate_secret_signs_with_both_during_the_grace() {
    local p id1 secret1 secret2 secret3 body row n0 n ts evid k1 k2
    own_client
    p=/echo/$(own_id)/
    id1=$(sub_create "$KEY" "$p")
    secret1=$(json_str secret)
    wait_state "$KEY" "$id1" active || fail "the probe did not make $id1 active"
    k1=$(hexkey "$secret1")

    body=$(api "$KEY" POST "/v1/subscriptions/$id1/rotate-secret" '{"grace":"8d"}')
    assert_eq 400 "$(http_status)" "grace over 7d → 400"
    assert_contains "$body" '"field":"grace"' "grace named"
    body=$(api "$KEY" POST "/v1/subscriptions/$id1/rotate-secret" '{"grace":"1h"}')
    assert_eq 200 "$(http_status)" "rotate-secret → 200"
    secret2=$(json_str secret)
    assert_contains "$secret2" "whsec_" "a new secret is shown"
    assert_ne "$secret1" "$secret2" "the new secret differs"
    assert_eq "$id1" "$(json_str id)" "the rotated subscription is returned"
    row=$(psql_q "SELECT prev_secret_sealed IS NOT NULL,
                         prev_secret_until BETWEEN now() + interval '59 minutes'
                                               AND now() + interval '61 minutes'
                    FROM subscriptions WHERE id = '$id1'")
    assert_eq "t|t" "$row" "the previous secret is kept for the grace"
    assert_eq 1 "$(psql_q "SELECT count(*) FROM audit_log WHERE action = 'subscription.rotate_secret'
                             AND object_id = '$id1' AND actor = 'tenant'")" "rotation is audited"

    n0=$(sink_count "$p")
    body=$(api "$KEY" POST "/v1/subscriptions/$id1/verify" '{}')
    assert_contains "$body" '"ok":true' "verify after rotation succeeds"
    n=$((n0 + 1))
    body=$(sink_bodies "$p" | nth "$n")
    ts=$(sink_header "$p" x-lerian-timestamp | nth "$n")
    evid=$(sink_header "$p" webhook-id | nth "$n")
    k2=$(hexkey "$secret2")
    assert_eq "$(lerian_sig "$k2" "$ts" "$body") $(lerian_sig "$k1" "$ts" "$body")" \
        "$(sink_header "$p" x-lerian-signature | nth "$n")" "X-Lerian-Signature: new then previous secret"
    assert_eq "$(webhook_sig "$k2" "$evid" "$ts" "$body") $(webhook_sig "$k1" "$evid" "$ts" "$body")" \
        "$(sink_header "$p" webhook-signature | nth "$n")" "webhook-signature: new then previous secret"

    api "$KEY" POST "/v1/subscriptions/$id1/rotate-secret" '{"grace":"0s"}' >/dev/null
    secret3=$(json_str secret)
    assert_eq 200 "$(http_status)" "rotate with no grace → 200"
    assert_eq "t" "$(psql_q "SELECT prev_secret_sealed IS NULL FROM subscriptions WHERE id = '$id1'")" \
        "grace 0: the previous secret is dropped"
    n0=$(sink_count "$p")
    api "$KEY" POST "/v1/subscriptions/$id1/verify" >/dev/null
    n=$((n0 + 1))
    body=$(sink_bodies "$p" | nth "$n")
    ts=$(sink_header "$p" x-lerian-timestamp | nth "$n")
    assert_eq "$(lerian_sig "$(hexkey "$secret3")" "$ts" "$body")" \
        "$(sink_header "$p" x-lerian-signature | nth "$n")" "one signature once the grace is over"
}

# default grace (24h) with an empty body
scenario_rotate_secret_default_grace_is_24h() {
    local id3
    own_client
    id3=$(sub_create "$KEY" "/ok/$(own_id)/")
    api "$KEY" POST "/v1/subscriptions/$id3/rotate-secret" >/dev/null
    assert_eq 200 "$(http_status)" "rotate without a body → 200"
    assert_eq t "$(psql_q "SELECT prev_secret_until BETWEEN now() + interval '23 hours 59 minutes'
                                                AND now() + interval '24 hours 1 minute'
                             FROM subscriptions WHERE id = '$id3'")" "the default grace is 24h"
}

# ---------------------------------------------------------------------------
# Idempotency-Key
# ---------------------------------------------------------------------------

scenario_idempotency_key_replays_create_and_rotate() {
    local other idem_body idi seci secr id1 path
    own_client
    other=$(own_tenant_key other)
    id1=$(sub_create "$KEY" "/echo/$(own_id)/")
    path=$SINK_URL/echo/$(own_id idem)/
    idem_body=$(sub_body "$path")
    api "$KEY" POST /v1/subscriptions "$idem_body" -H 'Idempotency-Key: create-1' >/dev/null
    assert_eq 201 "$(http_status)" "create with Idempotency-Key → 201"
    idi=$(json_str id)
    seci=$(json_str secret)
    api "$KEY" POST /v1/subscriptions "$idem_body" -H 'Idempotency-Key: create-1' >/dev/null
    assert_eq 201 "$(http_status)" "replay → 201"
    assert_eq "true" "$(last_header idempotent-replayed)" "the replay says so"
    assert_eq "$idi $seci" "$(json_str id) $(json_str secret)" "the replay is the same subscription and secret"
    assert_eq 1 "$(psql_q "SELECT count(*) FROM subscriptions WHERE url = '$path'")" \
        "only one subscription was created"
    api "$KEY" POST /v1/subscriptions "$(sub_body "$SINK_URL/echo/$(own_id idem-other)/")" \
        -H 'Idempotency-Key: create-1' >/dev/null
    assert_eq 409 "$(http_status)" "the same key with another body → 409"
    api "$other" POST /v1/subscriptions "$idem_body" -H 'Idempotency-Key: create-1' >/dev/null
    assert_eq 201 "$(http_status)" "keys are per tenant: another tenant's create-1 is its own"
    assert_ne "$idi" "$(json_str id)" "the other tenant got its own subscription"
    assert_eq "t|t" "$(psql_q "SELECT body::json->>'secret' IS NULL, body::json->>'_ss' LIKE 'v1:%'
                                FROM idempotency_keys WHERE scope = 'tenant:$TENANT' AND key = 'create-1'")" \
        "the stored response holds the secret sealed only"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM idempotency_keys WHERE position('${seci#whsec_}' IN body) > 0")" \
        "the secret is nowhere in the idempotency store"
    body=$(api "$KEY" POST /v1/subscriptions "$idem_body" -H 'Idempotency-Key: two words')
    assert_eq 400 "$(http_status)" "an Idempotency-Key with a space → 400"
    assert_contains "$body" '"field":"Idempotency-Key"' "the header is named"

    api "$KEY" POST "/v1/subscriptions/$idi/rotate-secret" '{"grace":"1m"}' -H 'Idempotency-Key: rot-1' >/dev/null
    assert_eq 200 "$(http_status)" "rotate with Idempotency-Key → 200"
    secr=$(json_str secret)
    api "$KEY" POST "/v1/subscriptions/$idi/rotate-secret" '{"grace":"1m"}' -H 'Idempotency-Key: rot-1' >/dev/null
    assert_eq "200 true $secr" "$(http_status) $(last_header idempotent-replayed) $(json_str secret)" \
        "rotate replay: same secret, no second rotation"
    assert_eq 1 "$(psql_q "SELECT count(*) FROM audit_log WHERE action = 'subscription.rotate_secret'
                             AND object_id = '$idi'")" "rotated once"
    api "$KEY" POST "/v1/subscriptions/$id1/rotate-secret" '{"grace":"1m"}' -H 'Idempotency-Key: rot-1' >/dev/null
    assert_eq 409 "$(http_status)" "a rotate key reused on another subscription → 409"
}

# ---------------------------------------------------------------------------
# deliveries
# ---------------------------------------------------------------------------

# job SUB STATE SEQ [REASON ATTEMPTS LEASE_OWNER LEASE_UNTIL RECLAIMS]: a
# delivery job of $TENANT's subscription SUB inserted with psql; prints its id.
job() {
    psql_q "INSERT INTO delivery_jobs (subscription_id, tenant_id, event_seq, event_day, event_id,
                                       event_type, state, reason, attempt_count, next_attempt_at,
                                       lease_owner, lease_until, reclaims)
            VALUES ('$1', '$TENANT', $3, (now() AT TIME ZONE 'UTC')::date, 'ev-$3',
                    'transaction.posted', '$2', ${4:-NULL}, ${5:-0}, now() + interval '1 day',
                    ${6:-NULL}, ${7:-NULL}, ${8:-0}) RETURNING id"
}

scenario_deliveries_are_listed_shown_and_redelivered() {
    local id1 other body cursor job_dead job_ok job_pending row
    own_client
    other=$(own_tenant_key other)
    id1=$(sub_create "$KEY" "/echo/$(own_id)/")
    sub_create "$KEY" "/ok/$(own_id)/" >/dev/null
    # redeliver needs a verified subscription (the gate, SPEC §6)
    wait_state "$KEY" "$id1" active || fatal "the probe did not make $id1 active"
    body=$(api "$KEY" GET "/v1/subscriptions/$id1/deliveries")
    assert_eq '200 {"items":[],"next_cursor":null}' "$(http_status) $body" "a new subscription has no deliveries"
    api "$KEY" GET "/v1/subscriptions/$id1/deliveries?state=lost" >/dev/null
    assert_eq 400 "$(http_status)" "unknown state → 400"
    api "$KEY" GET /v1/subscriptions/00000000-0000-7000-8000-000000000000/deliveries >/dev/null
    assert_eq 404 "$(http_status)" "deliveries of an unknown subscription → 404"
    api "$KEY" GET /v1/deliveries/987654321 >/dev/null
    assert_eq 404 "$(http_status)" "unknown delivery → 404"
    api "$KEY" GET /v1/deliveries/abc >/dev/null
    assert_eq 404 "$(http_status)" "non-numeric delivery id → 404"
    for id in 0 007 1234567890123456789; do
        api "$KEY" GET "/v1/deliveries/$id" >/dev/null
        assert_eq 404 "$(http_status)" "delivery id $id (not 1..18 digits without a leading zero) → 404"
    done
    api "$KEY" POST /v1/deliveries/987654321/redeliver >/dev/null
    assert_eq 404 "$(http_status)" "redeliver an unknown delivery → 404"

    job_dead=$(job "$id1" dead 1 "'exhausted'" 9 "'hub-x'" "now()" 5)
    job_ok=$(job "$id1" succeeded 2 NULL 1)
    job_pending=$(job "$id1" pending 3)
    psql_q "INSERT INTO delivery_attempts (day, delivery_id, job_id, number, started_at, duration_ms,
                                           status, error, response_excerpt)
            VALUES ((now() AT TIME ZONE 'UTC')::date, '01938000-0000-7000-8000-000000000002',
                    $job_dead, 2, now(), 31, 503, 'status', 'try later'),
                   ((now() AT TIME ZONE 'UTC')::date, '01938000-0000-7000-8000-000000000001',
                    $job_dead, 1, now() - interval '1 minute', 5000, NULL, 'timeout', NULL)" >/dev/null

    body=$(api "$KEY" GET "/v1/subscriptions/$id1/deliveries")
    assert_eq 200 "$(http_status)" "list deliveries → 200"
    assert_eq 3 "$(count '"event_type":"transaction.posted"')" "three jobs listed"
    assert_eq "$job_pending" "$(json_raw id)" "newest first"
    assert_eq 0 "$(count '"attempts"')" "lists carry no attempts"
    body=$(api "$KEY" GET "/v1/subscriptions/$id1/deliveries?state=dead")
    assert_eq 1 "$(count '"state":"dead"')" "state=dead filters"
    assert_eq "$job_dead \"exhausted\" 9" "$(json_raw id) $(json_raw reason) $(json_raw attempt_count)" \
        "the dead job with its reason and attempt count"
    assert_contains "$body" "\"subscription_id\":\"$id1\"" "subscription_id"
    assert_contains "$body" '"event_id":"ev-1"' "event_id"
    body=$(api "$KEY" GET "/v1/subscriptions/$id1/deliveries?limit=2")
    assert_eq 2 "$(count '"event_type"')" "limit=2"
    cursor=$(json_str next_cursor)
    body=$(api "$KEY" GET "/v1/subscriptions/$id1/deliveries?limit=2&cursor=$cursor")
    assert_eq "1 $job_dead null" "$(count '"event_type"') $(json_raw id) $(json_raw next_cursor)" \
        "the second page holds the oldest job"
    api "$KEY" GET "/v1/subscriptions/$id1/deliveries?cursor=$(json_str next_cursor "$(api "$KEY" GET '/v1/subscriptions?limit=1')")" >/dev/null
    assert_eq 400 "$(http_status)" "a cursor of another list → 400"

    body=$(api "$KEY" GET "/v1/deliveries/$job_dead")
    assert_eq 200 "$(http_status)" "GET a delivery → 200"
    assert_contains "$body" '"attempts":[{"delivery_id":"01938000-0000-7000-8000-000000000001","number":1,' \
        "attempts ordered by number"
    assert_contains "$body" '"duration_ms":5000,"status":null,"error":"timeout","response_excerpt":null}' \
        "attempt fields (no response)"
    assert_contains "$body" '"number":2,' "second attempt"
    assert_contains "$body" '"status":503,"error":"status","response_excerpt":"try later"}' \
        "attempt fields (a response)"
    api "$other" GET "/v1/deliveries/$job_dead" >/dev/null
    assert_eq 404 "$(http_status)" "another tenant's delivery → 404"
    api "$other" POST "/v1/deliveries/$job_dead/redeliver" >/dev/null
    assert_eq 404 "$(http_status)" "another tenant cannot redeliver it"

    body=$(api "$KEY" POST "/v1/deliveries/$job_pending/redeliver")
    assert_eq 409 "$(http_status)" "redeliver a pending job → 409"
    assert_contains "$body" "pending" "the 409 says the state"
    api "$KEY" POST "/v1/deliveries/$job_ok/redeliver" >/dev/null
    assert_eq 409 "$(http_status)" "redeliver a succeeded job → 409"
    body=$(api "$KEY" POST "/v1/deliveries/$job_dead/redeliver")
    assert_eq 200 "$(http_status)" "redeliver a dead job → 200"
    assert_eq "\"pending\" null" "$(json_raw state) $(json_raw reason)" "pending again, reason cleared"
    row=$(psql_q "SELECT state, reason IS NULL, lease_owner IS NULL, lease_until IS NULL,
                         next_attempt_at <= now(), reclaims, attempt_count
                    FROM delivery_jobs WHERE id = $job_dead")
    assert_eq "pending|t|t|t|t|0|9" "$row" "due now, lease and reclaims cleared, attempts kept"
    api "$KEY" POST "/v1/deliveries/$job_dead/redeliver" >/dev/null
    assert_eq 409 "$(http_status)" "redeliver twice → 409"
    api "$KEY" GET "/v1/deliveries/$job_dead/redeliver" >/dev/null
    assert_eq "405 POST" "$(http_status) $(last_header allow)" "GET …/redeliver → 405"
}

# verification is a gate (SPEC §6): replay and redeliver on a subscription
# that is not verified are 409 naming its state and make nothing; on a
# verified but disabled one they make parked jobs
scenario_replay_and_redeliver_need_a_verified_subscription() {
    local id dead body
    own_client
    id=$(sub_create "$KEY" "/echo/$(own_id)/")
    wait_state "$KEY" "$id" active || fatal "the probe did not make $id active"
    dead=$(job "$id" dead 1 "'exhausted'" 9)
    # a destination that answers late and without the challenge: pending
    # for 2 s, then failed
    api "$KEY" PATCH "/v1/subscriptions/$id" "{\"destination\":{\"url\":\"$SINK_URL/slow/2000/$(own_id b)/\"}}" >/dev/null
    assert_eq 200 "$(http_status)" "re-point to a refusing destination"
    body=$(api "$KEY" POST "/v1/deliveries/$dead/redeliver")
    assert_eq 409 "$(http_status)" "redeliver while pending → 409"
    assert_contains "$body" 'verification_state is pending' "the 409 names the state"
    assert_eq "dead" "$(psql_q "SELECT state FROM delivery_jobs WHERE id = $dead")" "the job stays dead"
    wait_state "$KEY" "$id" failed || fail "the probe did not fail it"
    body=$(api "$KEY" POST "/v1/deliveries/$dead/redeliver")
    assert_eq 409 "$(http_status)" "redeliver while failed → 409"
    assert_contains "$body" 'verification_state is failed' "the 409 names the state"
    body=$(api "$KEY" POST "/v1/subscriptions/$id/replay" '{"since":"2020-01-01T00:00:00Z"}')
    assert_eq 409 "$(http_status)" "replay while failed → 409"
    assert_contains "$body" 'verification_state is failed' "the 409 names the state"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM audit_log WHERE action IN ('subscription.replay', 'delivery.redeliver')
                             AND tenant_id = '$TENANT'")" "nothing was replayed or redelivered"

    # verified again but disabled: the dead job comes back parked
    api "$KEY" PATCH "/v1/subscriptions/$id" "{\"enabled\":false,\"destination\":{\"url\":\"$SINK_URL/echo/$(own_id c)/\"}}" >/dev/null
    wait_state "$KEY" "$id" active || fail "the echoing url did not verify"
    body=$(api "$KEY" POST "/v1/deliveries/$dead/redeliver")
    assert_eq "200 \"parked\"" "$(http_status) $(json_raw state)" \
        "redeliver on a disabled verified subscription → 200, parked until enabled"
    api "$KEY" PATCH "/v1/subscriptions/$id" '{"enabled":true}' >/dev/null
    assert_eq pending "$(psql_q "SELECT state FROM delivery_jobs WHERE id = $dead")" "enabled: due again"
}

# Idempotency-Key on verify, redeliver (replay: test_replay.sh): the first
# answer replayed byte for byte with Idempotent-Replayed, the key reused
# for another request 409, a malformed key 400 naming the header
scenario_idempotency_key_on_verify_and_redeliver() {
    local id other dead1 dead2 first again bad
    own_client
    id=$(sub_create "$KEY" "/echo/$(own_id)/")
    other=$(sub_create "$KEY" "/echo/$(own_id other)/")
    wait_state "$KEY" "$id" active || fatal "the probe did not make $id active"

    first=$(api "$KEY" POST "/v1/subscriptions/$id/verify" '' -H 'Idempotency-Key: ver-1')
    assert_eq 200 "$(http_status)" "verify with a key → 200"
    assert_eq "" "$(last_header idempotent-replayed)" "a first answer is not marked replayed"
    again=$(api "$KEY" POST "/v1/subscriptions/$id/verify" '' -H 'Idempotency-Key: ver-1')
    assert_eq "200 true" "$(http_status) $(last_header idempotent-replayed)" "the same key → the stored answer"
    assert_eq "$first" "$again" "byte for byte"
    assert_eq 1 "$(probes_at "/echo/$(own_id)/" verify)" "no second probe was sent"
    api "$KEY" POST "/v1/subscriptions/$other/verify" '' -H 'Idempotency-Key: ver-1' >/dev/null
    assert_eq 409 "$(http_status)" "the key on another subscription → 409"
    for bad in 'two words' "$(head -c 256 /dev/zero | tr '\0' k)" $'caf\xc3\xa9'; do
        again=$(api "$KEY" POST "/v1/subscriptions/$id/verify" '' -H "Idempotency-Key: $bad")
        assert_eq 400 "$(http_status)" "verify with a malformed key ('${bad:0:12}') → 400"
        assert_contains "$again" '"field":"Idempotency-Key"' "the header is named"
    done

    dead1=$(job "$id" dead 1 "'exhausted'" 9)
    dead2=$(job "$id" dead 2 "'exhausted'" 9)
    first=$(api "$KEY" POST "/v1/deliveries/$dead1/redeliver" '' -H 'Idempotency-Key: red-1')
    assert_eq 200 "$(http_status)" "redeliver with a key → 200"
    again=$(api "$KEY" POST "/v1/deliveries/$dead1/redeliver" '' -H 'Idempotency-Key: red-1')
    assert_eq "200 true" "$(http_status) $(last_header idempotent-replayed)" \
        "the same key → the stored answer, not a 409 for a job no longer dead"
    assert_eq "$first" "$again" "byte for byte"
    assert_eq 1 "$(psql_q "SELECT count(*) FROM audit_log WHERE action = 'delivery.redeliver' AND object_id = '$dead1'")" \
        "redelivered once"
    api "$KEY" POST "/v1/deliveries/$dead2/redeliver" '' -H 'Idempotency-Key: red-1' >/dev/null
    assert_eq "409 dead" "$(http_status) $(psql_q "SELECT state FROM delivery_jobs WHERE id = $dead2")" \
        "the key on another job → 409, that job untouched"
    again=$(api "$KEY" POST "/v1/deliveries/$dead2/redeliver" '' -H 'Idempotency-Key: two words')
    assert_eq 400 "$(http_status)" "redeliver with a malformed key → 400"
    assert_contains "$again" '"field":"Idempotency-Key"' "the header is named"
    assert_eq dead "$(psql_q "SELECT state FROM delivery_jobs WHERE id = $dead2")" "and nothing happened"
}

# a unique violation that is not the Idempotency-Key's own (here an index
# an operator added) is the request's failure (500), not a key race
scenario_only_the_keys_own_conflict_is_a_key_race() {
    local id d1 d2 body
    own_client
    id=$(sub_create "$KEY" "/echo/$(own_id)/")
    wait_state "$KEY" "$id" active || fatal "the probe did not make $id active"
    d1=$(job "$id" dead 1 "'exhausted'" 9)
    d2=$(job "$id" dead 2 "'exhausted'" 9)
    psql_q "CREATE UNIQUE INDEX one_redeliver_per_tenant_test ON audit_log (tenant_id)
             WHERE action = 'delivery.redeliver' AND tenant_id = '$TENANT'" >/dev/null
    api "$KEY" POST "/v1/deliveries/$d1/redeliver" '' -H 'Idempotency-Key: k-1' >/dev/null
    assert_eq 200 "$(http_status)" "the first redeliver → 200"
    body=$(api "$KEY" POST "/v1/deliveries/$d2/redeliver" '' -H 'Idempotency-Key: k-2')
    assert_eq 500 "$(http_status)" "another constraint's 23505 → 500"
    assert_contains "$body" 'the database refused the request' "not taken for a concurrent request with the key"
    psql_q "DROP INDEX one_redeliver_per_tenant_test" >/dev/null
    api "$KEY" POST "/v1/deliveries/$d2/redeliver" '' -H 'Idempotency-Key: k-2' >/dev/null
    assert_eq 200 "$(http_status)" "the key was not used up by the failure"
}

# ---------------------------------------------------------------------------
# delete
# ---------------------------------------------------------------------------

scenario_delete_removes_the_subscription_and_its_jobs() {
    local id1
    own_client
    id1=$(sub_create "$KEY" "/echo/$(own_id)/")
    job "$id1" dead 1 "'exhausted'" 9 >/dev/null
    job "$id1" pending 2 >/dev/null
    api "$KEY" DELETE "/v1/subscriptions/$id1" >/dev/null
    assert_eq 204 "$(http_status)" "DELETE → 204"
    api "$KEY" GET "/v1/subscriptions/$id1" >/dev/null
    assert_eq 404 "$(http_status)" "deleted → 404"
    api "$KEY" DELETE "/v1/subscriptions/$id1" >/dev/null
    assert_eq 404 "$(http_status)" "DELETE twice → 404"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$id1'")" \
        "its jobs went with it"
    assert_eq 1 "$(psql_q "SELECT count(*) FROM audit_log WHERE action = 'subscription.delete'
                             AND object_id = '$id1'")" "deletion is audited"
}

hub_env_a_tenant_holds_at_most_its_cap_of_subscriptions() {
    echo STREAMING_HUB_TENANT_MAX_SUBSCRIPTIONS=3
}

# Each event of a tenant's makes a job per matching subscription inside the
# shared ingest transaction: a tenant holds at most
# STREAMING_HUB_TENANT_MAX_SUBSCRIPTIONS of them.  One more is 409 naming
# the cap, and writes nothing; six creates at once make exactly the room
# left; another tenant creates all along; a delete makes room again.
scenario_a_tenant_holds_at_most_its_cap_of_subscriptions() {
    local key_b id body i n pids=()
    own_client
    key_b=$(own_tenant_key b)
    id=$(sub_create "$KEY" "/echo/$(own_id 1)/")
    sub_create "$KEY" "/echo/$(own_id 2)/" >/dev/null
    sub_create "$KEY" "/echo/$(own_id 3)/" >/dev/null
    body=$(api "$KEY" POST /v1/subscriptions "$(sub_body "$SINK_URL/echo/$(own_id 4)/")")
    assert_eq 409 "$(http_status)" "a fourth is refused"
    assert_contains "$body" "STREAMING_HUB_TENANT_MAX_SUBSCRIPTIONS" "the problem names the cap: $body"
    assert_contains "$(last_header content-type)" "$PROBLEM" "as problem+json"
    assert_eq "3 3" "$(psql_q "SELECT count(*) FROM subscriptions WHERE tenant_id = '$TENANT'") $(psql_q "SELECT count(*) FROM audit_log WHERE action = 'subscription.create' AND tenant_id = '$TENANT'")" \
        "nothing written for it: three subscriptions, three audit rows"
    sub_create "$key_b" "/echo/$(own_id b)/" >/dev/null
    assert_eq 201 "$(http_status)" "another tenant creates"
    api "$KEY" DELETE "/v1/subscriptions/$id" >/dev/null
    assert_eq 204 "$(http_status)" "a delete"
    sub_create "$KEY" "/echo/$(own_id 5)/" >/dev/null
    assert_eq 201 "$(http_status)" "makes room for one more"
    # the other tenant's two left, six at once: exactly two are created
    for i in 1 2 3 4 5 6; do
        curl -s -o /dev/null -w '%{http_code}\n' -X POST -H "Authorization: Bearer $key_b" \
            -H 'Content-Type: application/json' --max-time 30 \
            -d "$(sub_body "$SINK_URL/echo/$(own_id "b$i")/")" "$HUB_URL/v1/subscriptions" \
            >"$WORK/cap-$i.status" &
        pids+=($!)
    done
    wait "${pids[@]}"
    n=$(cat "$WORK"/cap-*.status | grep -c '^201$')
    assert_eq "2 4" "$n $(cat "$WORK"/cap-*.status | grep -c '^409$')" "six at once: two created, four refused"
    assert_eq 3 "$(psql_q "SELECT count(*) FROM subscriptions WHERE tenant_id = '$(own_id b)'")" \
        "the other tenant holds its three"
}

# ---------------------------------------------------------------------------
# nothing secret in the logs
# ---------------------------------------------------------------------------

scenario_secrets_never_reach_the_log() {
    local p id secret1 secret2 challenge s
    own_client
    p=/echo/$(own_id)/
    id=$(sub_create "$KEY" "$p")
    secret1=$(json_str secret)
    wait_state "$KEY" "$id" active || fail "the probe did not make $id active"
    challenge=$(json_str challenge "$(sink_bodies "$p" | nth 1)")
    api "$KEY" POST "/v1/subscriptions/$id/rotate-secret" '{"grace":"1h"}' >/dev/null
    secret2=$(json_str secret)
    api "$KEY" PATCH "/v1/subscriptions/$id" \
        "{\"destination\":{\"url\":\"$SINK_URL$p\",\"headers\":{\"Authorization\":\"Bearer xyz\"}}}" >/dev/null
    api "$KEY" POST "/v1/subscriptions/$id/verify" >/dev/null
    assert_eq 200 "$(http_status)" "the subscription with all its secrets verified again"
    for s in "$SECRET_VALUE" "${secret1#whsec_}" "${secret2#whsec_}" "Bearer xyz" "$challenge"; do
        [[ -n $s ]] || fail "a secret to look for is empty"
        assert_eq 0 "$(grep -cF -- "$s" "$HUB_LOG")" "the hub log never holds '${s:0:12}…'"
    done
}

# ---------------------------------------------------------------------------
# probes that outlive their request, and a stop with a probe in flight
# ---------------------------------------------------------------------------

scenario_a_probe_outlives_a_client_that_hung_up() {
    local id3
    own_client
    id3=$(sub_create "$KEY" "/slow/1500/$(own_id)/")
    wait_state "$KEY" "$id3" failed # /slow answers "ok": no challenge
    api "$KEY" POST "/v1/subscriptions/$id3/verify" '' --max-time 0.5 >/dev/null
    assert_eq 000 "$(http_status)" "a client that hangs up during /verify gets nothing"
    if wait_sql 10 1 "SELECT count(*) FROM audit_log WHERE action = 'subscription.verify'
                        AND object_id = '$id3'"; then
        pass "the probe still records its outcome after the client left"
    else
        fail "no verify outcome recorded for $id3 after the client left"
    fi
    hub_alive && pass "the hub survived the hang-up" || fail "the hub died"
}

scenario_a_stop_cuts_a_probe_short() {
    local idh path
    own_client
    path=/hang/$(own_id)/
    idh=$(sub_create "$KEY" "$path")
    sink_wait 1 "$path" 10 || fail "the background probe of /hang did not start"
    hub_stop # fails the test on a non-zero exit (or a sanitizer report, later)
    assert_eq pending "$(psql_q "SELECT verification_state FROM subscriptions WHERE id = '$idh'")" \
        "a probe cut short by a stop records nothing: still pending"
}

# ---------------------------------------------------------------------------
# scenarios with a hub of their own configuration
# ---------------------------------------------------------------------------

# SSRF and https in production
scenario_production_refuses_private_and_plain_http_destinations() {
    local id2 url body
    own_client
    id2=$(sub_create "$KEY" "/echo/$(own_id)/")
    hub_ensure STREAMING_HUB_ALLOW_PRIVATE_SINKS=false STREAMING_HUB_ENV=production
    for url in https://127.0.0.1/x https://localhost:8443/x 'https://[::1]/x' https://10.1.2.3/x \
        https://169.254.169.254/latest 'https://[::ffff:127.0.0.1]/x' https://0x7f000001/x; do
        body=$(api "$KEY" POST /v1/subscriptions "$(sub_body "$url")")
        assert_eq 400 "$(http_status)" "private destination $url → 400"
        assert_contains "$body" '"field":"destination.url"' "  … naming destination.url"
        assert_contains "$body" "non-public address" "  … because of the address (SSRF guard)"
    done
    body=$(api "$KEY" POST /v1/subscriptions "$(sub_body "http://example.com/hook")")
    assert_eq 400 "$(http_status)" "http in production → 400"
    assert_contains "$body" "https" "the refusal asks for https"
    api "$KEY" PATCH "/v1/subscriptions/$id2" '{"destination":{"url":"https://127.0.0.1/x"}}' >/dev/null
    assert_eq 400 "$(http_status)" "PATCH to a private url → 400"
    assert_eq 1 "$(psql_q "SELECT count(*) FROM subscriptions WHERE tenant_id = '$TENANT'")" \
        "no subscription was added by the refused requests"

    # the secrets still open after a restart with the same KEK
    body=$(api "$KEY" GET "/v1/subscriptions/$id2")
    assert_contains "$body" '"headers":{"X-Api-Key":"***"}' "headers still open after a restart"
}

# The SSRF check's DNS lookups (libhub-slow-dns.so answers *.hang.test after
# 3 s, *.nxdomain.test and *.public.test at once): a tenant's host names
# whose servers never answer took libuv's two lookup threads, and every
# other tenant's create waited behind them (12 names: ~18 s).  The process
# now runs as many as libuv has threads for (8 of 16), a tenant 2 while
# fewer than half run, else 1 (the rest 503): one tenant's 12, then four
# tenants' 3 each, leave room for another's.  And a name that does not
# resolve reads as one that resolves to an internal address: the answers
# tell a tenant nothing of the names inside.
hub_env_host_lookups_that_hang_hold_no_other_tenant() {
    echo STREAMING_HUB_ALLOW_PRIVATE_SINKS=false LD_PRELOAD="$BUILD/libhub-slow-dns.so" \
        ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0"
}

# hang_creates KEY N TAG: N creates by KEY's tenant at once, in the
# background, to names that hang; their answers in $WORK/TAG.*
hang_creates() {
    local i
    for i in $(seq 1 "$2"); do
        curl -s -o "$WORK/$3_body.$i" -w '%{http_code}\n' -X POST \
            -H "Authorization: Bearer $1" -H 'Content-Type: application/json' \
            -d "$(sub_body "http://$3-$i.hang.test/hook")" "$HUB_URL/v1/subscriptions" \
            >"$WORK/$3.$i" &
    done
}

# another_create_is_quick KEY WHAT: KEY's tenant creates a subscription (a
# name that resolves at once) within a second
another_create_is_quick() {
    local start ms
    start=$(date +%s%N)
    api "$1" POST /v1/subscriptions "$(sub_body "http://hooks.public.test/x")" >/dev/null
    ms=$((($(date +%s%N) - start) / 1000000))
    log "another tenant's create while $2: $(http_status) in $ms ms"
    assert_eq 201 "$(http_status)" "another tenant's subscription is created ($2)"
    ((ms < 1000)) || fail "another tenant's create waited $ms ms ($2)"
}

scenario_host_lookups_that_hang_hold_no_other_tenant() {
    local other refused ran body internal k
    own_client
    other=$(own_tenant_key other)
    hang_creates "$KEY" 12 one
    sleep 0.5
    another_create_is_quick "$other" "one tenant's 12 lookups hang"
    wait
    refused=$(grep -l 'lookups are in progress' "$WORK"/one_body.* | wc -l)
    log "the hanging tenant's creates: $(sort "$WORK"/one.* | uniq -c | tr -s ' \n' ' ')"
    assert_eq 10 "$refused" "two of the tenant's lookups ran, ten were refused at once (503)"
    for k in 1 2 3 4; do
        hang_creates "$(own_tenant_key "h$k")" 3 "four$k"
    done
    sleep 0.5
    another_create_is_quick "$other" "four tenants' 12 lookups hang"
    wait
    ran=$(cat "$WORK"/four?.* | grep -c '^400$')
    log "four tenants' creates: $ran ran, $(cat "$WORK"/four?.* | grep -c '^503$') refused"
    assert_le "$ran" 7 "the four tenants' lookups left room for another tenant's"

    body=$(api "$KEY" POST /v1/subscriptions "$(sub_body "http://gone.nxdomain.test/x")")
    assert_eq 400 "$(http_status)" "a name that does not resolve → 400"
    internal=$(api "$KEY" POST /v1/subscriptions "$(sub_body "http://localhost/x")")
    assert_eq 400 "$(http_status)" "a name of an internal address → 400"
    assert_eq "$body" "$internal" "both answers read alike"
}

# An attempt (here the verification probe) to a name whose lookup hangs
# (libhub-slow-dns.so: 3 s) and that times out first (1 s): libcurl's
# cleanup of the transfer waited on the loop for its lookup thread, and
# the whole hub stopped answering for the rest of the lookup (~2 s).
hub_env_a_destination_whose_name_hangs_does_not_stall_the_hub() {
    echo STREAMING_HUB_DELIVERY_TIMEOUT=1s LD_PRELOAD="$BUILD/libhub-slow-dns.so" \
        ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0"
}

scenario_a_destination_whose_name_hangs_does_not_stall_the_hub() {
    local i worst=0 t
    own_client
    api "$KEY" POST /v1/subscriptions "$(sub_body "http://stall.hang.test/hook")" >/dev/null
    assert_eq 201 "$(http_status)" "created (no lookup: private sinks are allowed here)"
    for i in $(seq 1 30); do
        t=$(curl -s -o /dev/null -w '%{time_total}' "$HUB_URL/healthz")
        worst=$(awk -v a="$worst" -v b="$t" 'BEGIN { print (b > a ? b : a) }')
        sleep 0.1
    done
    log "the slowest /healthz while the probe's lookup hung: ${worst} s"
    assert_eq 1 "$(awk -v w="$worst" 'BEGIN { print (w < 0.3) }')" \
        "the loop answered within 300 ms throughout (slowest ${worst} s)"
}

scenario_without_a_kek_secrets_cannot_be_used() {
    local id2 body
    own_client
    id2=$(sub_create "$KEY" "/echo/$(own_id)/")
    hub_ensure -STREAMING_HUB_KEK
    body=$(api "$KEY" POST /v1/subscriptions "$(sub_body "$SINK_URL/echo/$(own_id nokek)/")")
    assert_eq 503 "$(http_status)" "no KEK → 503"
    assert_contains "$body" "STREAMING_HUB_KEK" "the 503 names STREAMING_HUB_KEK"
    api "$KEY" POST "/v1/subscriptions/$id2/verify" >/dev/null
    assert_eq 503 "$(http_status)" "verify without a KEK → 503"
    api "$KEY" GET "/v1/subscriptions/$id2" >/dev/null
    assert_eq "200 null" "$(http_status) $(json_raw headers)" "without a KEK, header names are unknown (null)"
}

scenarios_main "$@"
