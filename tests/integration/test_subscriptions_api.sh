#!/usr/bin/env bash
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
# replay, the audit log, the deliveries routes (jobs inserted with psql: the
# dispatcher is not what is tested here), and the SSRF guard at creation and
# https-only in production (second hub start).
#
# The hub runs with STREAMING_HUB_ROLE=ingest: every role serves the API, and
# this one has no dispatcher that would claim the jobs this test inserts.
# jq is not assumed: the API answers compact JSON, which grep and sed read.
#
# No `set -e`: lib.sh polls with commands that are expected to fail until the
# awaited thing appears; every check below is an explicit assertion instead.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
hub_test_init

KEK=$(head -c 32 /dev/urandom | base64 -w0)
HUB_BASE=(STREAMING_HUB_ROLE=ingest STREAMING_HUB_DELIVERY_TIMEOUT=5s)
HUB_ENV=("${HUB_BASE[@]}" STREAMING_HUB_KEK="$KEK")

pg_start
kafka_start --topic lerian.streaming.test:1
sink_start
hub_start "${HUB_ENV[@]}" STREAMING_HUB_ALLOW_PRIVATE_SINKS=true

PROBLEM='application/problem+json'
HDRS=$WORK/last_headers
SECRET_VALUE='s3cr3t-header-value'

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

# jstr NAME [JSON]: the first string member NAME of compact JSON (default: the
# last response body); prints nothing when absent or not a string.
jstr() {
    local json=${2:-$(cat "$WORK/last_http_body")}
    grep -oE "\"$1\":\"([^\"\\\\]|\\\\.)*\"" <<<"$json" | head -n1 |
        sed -E "s/^\"$1\":\"(.*)\"$/\\1/" || true
}

# jraw NAME [JSON]: the first member NAME's raw value (null, number, bool, string).
jraw() {
    local json=${2:-$(cat "$WORK/last_http_body")}
    grep -oE "\"$1\":(null|true|false|-?[0-9]+(\\.[0-9]+)?|\"([^\"\\\\]|\\\\.)*\")" <<<"$json" |
        head -n1 | sed -E "s/^\"$1\"://" || true
}

# header NAME: a response header of the last call (made with -D "$HDRS").
header() {
    grep -i "^$1:" "$HDRS" | head -n1 | sed -E 's/^[^:]*:[[:space:]]*//' | tr -d '\r' || true
}

# api KEY METHOD PATH [JSON] [curl args...]: tenant API call.
api() {
    local key=$1 method=$2 path=$3 body=${4:-}
    shift 3
    (($# > 0)) && shift
    hub_curl "$method" "$path" "$body" -D "$HDRS" -H "Authorization: Bearer $key" "$@"
}

# api_key TENANT: a new API key of TENANT.
api_key() {
    admin_curl POST "/admin/tenants/$1/api-keys" >/dev/null
    jstr key
}

# count PATTERN [JSON]: occurrences of a fixed string in the last body.
count() {
    local json=${2:-$(cat "$WORK/last_http_body")}
    grep -oF "$1" <<<"$json" | wc -l | tr -d ' '
}

# state_of KEY ID: the subscription's verification_state.
state_of() {
    api "$1" GET "/v1/subscriptions/$2" >/dev/null
    jstr verification_state
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

sub_body() {
    # sub_body URL [EXTRA_MEMBERS]
    printf '{"event_types":["transaction.posted","balance.*"],"destination":{"kind":"webhook","url":"%s","headers":{"X-Api-Key":"%s"}}%s}' \
        "$1" "$SECRET_VALUE" "${2:-}"
}

# ---------------------------------------------------------------------------
# tenants and keys
# ---------------------------------------------------------------------------

tenant_create acme
tenant_create globex
KEY=$(api_key acme)
OTHER=$(api_key globex)
assert_contains "$KEY" "shk_" "acme API key issued"
assert_contains "$OTHER" "shk_" "globex API key issued"

hub_curl GET /v1/subscriptions >/dev/null
assert_eq 401 "$(http_status)" "no key → 401"
api "shk_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA" GET /v1/subscriptions >/dev/null
assert_eq 401 "$(http_status)" "unknown key → 401"
api "$ADMIN_TOKEN" GET /v1/deliveries/1 >/dev/null
assert_eq 401 "$(http_status)" "the admin token is not a tenant key → 401"
hub_curl DELETE /v1/subscriptions/whatever/deep/path >/dev/null
assert_eq 401 "$(http_status)" "unknown path without a key → 401 (nothing revealed)"

# ---------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------

body=$(api "$KEY" POST /v1/subscriptions '{}')
assert_eq 400 "$(http_status)" "empty object → 400"
assert_contains "$(header content-type)" "$PROBLEM" "validation errors are problem+json"
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
assert_eq 0 "$(psql_q 'SELECT count(*) FROM subscriptions')" "nothing stored by refused requests"

# ---------------------------------------------------------------------------
# create, background probe, the probe request itself
# ---------------------------------------------------------------------------

# a policy file the hub has not loaded yet is unknown until a reload
echo 'return {}' >"$WORK/policies/shaper.lua"
api "$KEY" POST /v1/subscriptions "$(sub_body "$SINK_URL/echo/one/" ',"policy":"shaper"')" >/dev/null
assert_eq 400 "$(http_status)" "a policy file not loaded yet → 400"
admin_curl POST /admin/policies/reload >/dev/null
assert_eq 200 "$(http_status)" "policy reload → 200"
body=$(api "$KEY" POST /v1/subscriptions \
    "$(sub_body "$SINK_URL/echo/one/" ',"policy":"shaper","retry_schedule":["10s","1m"],"max_rate":12.5')")
assert_eq 201 "$(http_status)" "create → 201"
ID1=$(jstr id)
SECRET1=$(jstr secret)
assert_contains "$SECRET1" "whsec_" "the secret is whsec_…"
S1_B64=${SECRET1#whsec_}
assert_eq 32 "$(printf '%s' "$S1_B64" | base64 -d | wc -c | tr -d ' ')" "the secret is base64 of 32 bytes"
assert_eq "/v1/subscriptions/$ID1" "$(header location)" "Location of the new subscription"
assert_eq '"pending"' "$(jraw verification_state)" "a new subscription is pending"
assert_eq '"acme"' "$(jraw tenant_id)" "tenant_id"
assert_eq 1 "$(jraw schema_major)" "schema_major defaults to 1"
assert_eq '"unordered"' "$(jraw ordering)" "ordering defaults to unordered"
assert_eq true "$(jraw enabled)" "enabled defaults to true"
assert_eq 12.5 "$(jraw max_rate)" "max_rate"
assert_eq '"shaper"' "$(jraw policy)" "policy"
assert_contains "$body" '"retry_schedule":["10s","1m"]' "retry_schedule as given"
assert_contains "$body" '"event_types":["transaction.posted","balance.*"]' "event_types"
assert_contains "$body" '"headers":{"X-Api-Key":"***"}' "header values are redacted"
assert_eq 0 "$(count "$SECRET_VALUE")" "the header value is never returned"
assert_eq null "$(jraw disabled_reason)" "disabled_reason null"
[[ $ID1 =~ ^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$ ]] &&
    pass "the id is a UUIDv7" || fail "the id is not a UUIDv7: $ID1"

row=$(psql_q "SELECT secret_sealed LIKE 'v1:%', headers_sealed LIKE 'v1:%',
                     position('$SECRET_VALUE' IN headers_sealed) = 0,
                     position('${SECRET1#whsec_}' IN secret_sealed) = 0
                FROM subscriptions WHERE id = '$ID1'")
assert_eq "t|t|t|t" "$row" "secret and headers are sealed at rest"

if wait_until 20 "[[ \$(state_of '$KEY' '$ID1') == active ]]"; then
    pass "the background probe made /echo active"
else
    fail "verification_state of $ID1 is $(state_of "$KEY" "$ID1"), not active"
fi

assert_eq 1 "$(sink_count /echo/one/)" "one probe request reached the sink"
P=/echo/one/
assert_eq subscription.verification "$(sink_header $P x-lerian-event-type | nth 1)" "X-Lerian-Event-Type"
EVID=$(sink_header $P x-lerian-event-id | nth 1)
[[ $EVID =~ ^verify-[0-9a-f-]{36}$ ]] && pass "X-Lerian-Event-Id is verify-<uuid>" ||
    fail "X-Lerian-Event-Id: $EVID"
DELID=$(sink_header $P x-lerian-delivery-id | nth 1)
[[ $DELID =~ ^[0-9a-f]{8}-[0-9a-f]{4}-7 ]] && pass "X-Lerian-Delivery-Id is a UUIDv7" ||
    fail "X-Lerian-Delivery-Id: $DELID"
assert_eq acme "$(sink_header $P x-lerian-tenant-id | nth 1)" "X-Lerian-Tenant-Id"
assert_eq "$ID1" "$(sink_header $P x-lerian-subscription-id | nth 1)" "X-Lerian-Subscription-Id"
assert_eq 1 "$(sink_header $P x-lerian-attempt | nth 1)" "X-Lerian-Attempt"
assert_eq "$EVID" "$(sink_header $P webhook-id | nth 1)" "webhook-id = the event id"
assert_eq "$EVID" "$(sink_header $P ce-id | nth 1)" "ce-id = the event id"
assert_eq 1.0 "$(sink_header $P ce-specversion | nth 1)" "ce-specversion"
assert_eq /streaming-hub "$(sink_header $P ce-source | nth 1)" "ce-source"
assert_eq studio.lerian.subscription.verification "$(sink_header $P ce-type | nth 1)" "ce-type"
[[ $(sink_header $P ce-time | nth 1) =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z$ ]] &&
    pass "ce-time is RFC 3339" || fail "ce-time: $(sink_header $P ce-time | nth 1)"
assert_eq application/json "$(sink_header $P content-type | nth 1)" "Content-Type"
assert_contains "$(sink_header $P user-agent | nth 1)" "streaming-hub/" "User-Agent"
assert_eq "$SECRET_VALUE" "$(sink_header $P x-api-key | nth 1)" "the destination header is delivered"

BODY=$(sink_bodies $P | nth 1)
[[ $BODY =~ ^\{\"challenge\":\"[A-Za-z0-9_-]{32}\"\}$ ]] && pass "the probe body is a challenge" ||
    fail "probe body: $BODY"
CHALLENGE1=$(jstr challenge "$BODY")
TS=$(sink_header $P x-lerian-timestamp | nth 1)
assert_eq "$TS" "$(sink_header $P webhook-timestamp | nth 1)" "webhook-timestamp = X-Lerian-Timestamp"
now=$(date +%s)
((TS <= now && TS >= now - 60)) && pass "the timestamp is Unix seconds, recent" || fail "ts $TS"
K1=$(hexkey "$SECRET1")
assert_eq "$(lerian_sig "$K1" "$TS" "$BODY")" "$(sink_header $P x-lerian-signature | nth 1)" \
    "X-Lerian-Signature verifies with the secret (openssl)"
assert_eq "$(webhook_sig "$K1" "$EVID" "$TS" "$BODY")" "$(sink_header $P webhook-signature | nth 1)" \
    "webhook-signature verifies with the secret (openssl)"

# a failing destination
api "$KEY" POST /v1/subscriptions "$(sub_body "$SINK_URL/status/500/two/")" >/dev/null
assert_eq 201 "$(http_status)" "create a subscription pointing at /status/500 → 201"
ID2=$(jstr id)
if wait_until 20 "[[ \$(state_of '$KEY' '$ID2') == failed ]]"; then
    pass "the background probe made /status/500 failed"
else
    fail "verification_state of $ID2 is $(state_of "$KEY" "$ID2"), not failed"
fi

# the echo must contain the challenge: a plain 200 is not enough
api "$KEY" POST /v1/subscriptions "$(sub_body "$SINK_URL/ok/three/")" >/dev/null
ID3=$(jstr id)
if wait_until 20 "[[ \$(state_of '$KEY' '$ID3') == failed ]]"; then
    pass "a 2xx without the challenge in the body fails verification"
else
    fail "verification_state of $ID3 is $(state_of "$KEY" "$ID3"), not failed"
fi

assert_eq 3 "$(psql_q "SELECT count(*) FROM audit_log WHERE actor = 'tenant'
                         AND action = 'subscription.create' AND tenant_id = 'acme'")" \
    "creations are audited"

# ---------------------------------------------------------------------------
# get, list, tenant isolation
# ---------------------------------------------------------------------------

body=$(api "$KEY" GET "/v1/subscriptions/$ID1")
assert_eq 200 "$(http_status)" "GET one → 200"
assert_eq "$ID1" "$(jstr id)" "GET returns the subscription"
assert_eq 0 "$(count '"secret"')" "GET never shows the secret"
assert_contains "$body" '"headers":{"X-Api-Key":"***"}' "GET shows header names only"
api "$KEY" GET "/v1/subscriptions/$(tr 'a-f' 'A-F' <<<"$ID1")" >/dev/null
assert_eq 200 "$(http_status)" "an upper-case id finds it too"
api "$KEY" GET /v1/subscriptions/00000000-0000-7000-8000-000000000000 >/dev/null
assert_eq 404 "$(http_status)" "unknown id → 404"
api "$KEY" GET /v1/subscriptions/not-a-uuid >/dev/null
assert_eq 404 "$(http_status)" "malformed id → 404"

body=$(api "$KEY" GET '/v1/subscriptions?limit=2')
assert_eq 200 "$(http_status)" "list → 200"
assert_eq 2 "$(count '"verification_state"')" "limit=2 → 2 items"
assert_eq 0 "$(count '"secret"')" "lists never show secrets"
assert_contains "$body" "\"id\":\"$ID1\"" "creation order: the first subscription comes first"
CURSOR=$(jstr next_cursor)
assert_ne "" "$CURSOR" "a next_cursor is given"
body=$(api "$KEY" GET "/v1/subscriptions?limit=2&cursor=$CURSOR")
assert_eq 1 "$(count '"verification_state"')" "second page: the last item"
assert_contains "$body" "\"id\":\"$ID3\"" "second page holds the third subscription"
assert_eq null "$(jraw next_cursor)" "no page after the last"
body=$(api "$KEY" GET '/v1/subscriptions?limit=0&cursor=bogus!')
assert_eq 400 "$(http_status)" "bad limit and cursor → 400"
assert_contains "$body" '"field":"limit"' "limit named"
assert_contains "$body" '"field":"cursor"' "cursor named"

body=$(api "$OTHER" GET /v1/subscriptions)
assert_eq '200 {"items":[],"next_cursor":null}' "$(http_status) $body" "globex sees none of acme's"
for req in "GET /v1/subscriptions/$ID1" "PATCH /v1/subscriptions/$ID1" \
    "DELETE /v1/subscriptions/$ID1" "POST /v1/subscriptions/$ID1/verify" \
    "POST /v1/subscriptions/$ID1/rotate-secret" "GET /v1/subscriptions/$ID1/deliveries"; do
    read -r m p <<<"$req"
    data=""
    [[ $m == PATCH ]] && data='{"enabled":false}'
    api "$OTHER" "$m" "$p" "$data" >/dev/null
    assert_eq 404 "$(http_status)" "another tenant: $m {id}${p#/v1/subscriptions/$ID1} → 404"
done
assert_eq t "$(psql_q "SELECT enabled FROM subscriptions WHERE id = '$ID1'")" \
    "another tenant's PATCH changed nothing"

api "$KEY" PUT /v1/subscriptions '{}' >/dev/null
assert_eq "405 GET, HEAD, POST" "$(http_status) $(header allow)" "PUT /v1/subscriptions → 405"
api "$KEY" GET "/v1/subscriptions/$ID1/verify" >/dev/null
assert_eq "405 POST" "$(http_status) $(header allow)" "GET …/verify → 405"
api "$KEY" GET "/v1/subscriptions/$ID1/nothing" >/dev/null
assert_eq 404 "$(http_status)" "unknown sub-resource → 404"
api "$KEY" GET "/v1/subscriptions/$ID1/deliveries/x/y" >/dev/null
assert_eq 404 "$(http_status)" "a path of five segments → 404"
api "$KEY" GET "/v1/subscriptions//deliveries" >/dev/null
assert_eq 404 "$(http_status)" "an empty path segment → 404"

# ---------------------------------------------------------------------------
# patch
# ---------------------------------------------------------------------------

body=$(api "$KEY" PATCH "/v1/subscriptions/$ID1" \
    '{"max_rate":2.5,"ordering":"fifo","schema_major":2,"event_types":["*"],"retry_schedule":null,"policy":null}')
assert_eq 200 "$(http_status)" "PATCH → 200"
assert_eq 2.5 "$(jraw max_rate)" "max_rate changed"
assert_eq '"fifo"' "$(jraw ordering)" "ordering changed"
assert_eq 2 "$(jraw schema_major)" "schema_major changed"
assert_eq null "$(jraw retry_schedule)" "retry_schedule cleared"
assert_eq null "$(jraw policy)" "policy cleared"
assert_eq '"active"' "$(jraw verification_state)" "a PATCH without a url keeps the state"
assert_eq "*" "$(psql_q "SELECT string_agg(pattern, ',') FROM subscription_routes
                          WHERE subscription_id = '$ID1' AND schema_major = 2")" \
    "the routes follow event_types and schema_major"
api "$KEY" PATCH "/v1/subscriptions/$ID1" '{"enabled":false}' >/dev/null
assert_eq "false \"disabled\"" "$(jraw enabled) $(jraw disabled_reason)" "enabled:false → disabled"
api "$KEY" PATCH "/v1/subscriptions/$ID1" '{"enabled":true}' >/dev/null
assert_eq "true null" "$(jraw enabled) $(jraw disabled_reason)" \
    "enabled:true on an active subscription clears disabled_reason"
body=$(api "$KEY" PATCH "/v1/subscriptions/$ID1" '{"event_types":[],"id":"x","destination":{"kind":"x"}}')
assert_eq 400 "$(http_status)" "bad PATCH → 400"
assert_contains "$body" '"field":"event_types"' "event_types named"
assert_contains "$body" '"field":"id"' "read-only id named"
assert_contains "$body" '"field":"destination.kind"' "destination.kind named"
api "$KEY" PATCH "/v1/subscriptions/$ID1" '{}' >/dev/null
assert_eq 400 "$(http_status)" "empty PATCH → 400"
assert_eq 2 "$(psql_q "SELECT count(*) FROM audit_log WHERE action = 'subscription.update'
                         AND object_id = '$ID1' AND detail->'fields' ? 'enabled'")" \
    "updates are audited with the member names"

# a new url: pending, then probed in the background
body=$(api "$KEY" PATCH "/v1/subscriptions/$ID1" "{\"destination\":{\"url\":\"$SINK_URL/echo/one-b/\"}}")
assert_eq 200 "$(http_status)" "PATCH destination.url → 200"
assert_eq '"pending"' "$(jraw verification_state)" "a new url resets the state to pending"
assert_contains "$body" '"headers":{"X-Api-Key":"***"}' "the headers are kept"
if wait_until 20 "[[ \$(state_of '$KEY' '$ID1') == active ]]"; then
    pass "the new url is probed and active again"
else
    fail "after the url change $ID1 is $(state_of "$KEY" "$ID1")"
fi
assert_eq "$SECRET_VALUE" "$(sink_header /echo/one-b/ x-api-key | nth 1)" \
    "the probe of the new url carries the destination header"

# ---------------------------------------------------------------------------
# verify
# ---------------------------------------------------------------------------

body=$(api "$KEY" POST "/v1/subscriptions/$ID2/verify")
assert_eq 200 "$(http_status)" "verify a failing destination → 200"
assert_contains "$body" '"verification":{"ok":false,"status":500' "verification.ok false, status 500"
assert_eq '"failed"' "$(jraw verification_state)" "still failed"
api "$KEY" PATCH "/v1/subscriptions/$ID2" \
    "{\"enabled\":false,\"destination\":{\"url\":\"$SINK_URL/echo/two-b/\",\"headers\":{\"Authorization\":\"Bearer xyz\"}}}" >/dev/null
assert_eq 200 "$(http_status)" "re-point and disable"
psql_q "UPDATE subscriptions SET failure_first_at = now(), failure_last_at = now()
         WHERE id = '$ID2'" >/dev/null
body=$(api "$KEY" POST "/v1/subscriptions/$ID2/verify")
assert_eq 200 "$(http_status)" "verify a working destination → 200"
assert_contains "$body" '"verification":{"ok":true,"status":200,"error":null}' "verification.ok true"
assert_eq "\"active\" true null" "$(jraw verification_state) $(jraw enabled) $(jraw disabled_reason)" \
    "verify re-enables: active, enabled, no disabled_reason"
assert_contains "$body" '"headers":{"Authorization":"***"}' "replaced headers, redacted"
assert_eq "|" "$(psql_q "SELECT failure_first_at, failure_last_at FROM subscriptions WHERE id = '$ID2'")" \
    "verify clears the failure streak"
assert_eq "Bearer xyz" "$(sink_header /echo/two-b/ authorization | tail -n1)" \
    "the new destination header is delivered"

# ---------------------------------------------------------------------------
# rotate-secret
# ---------------------------------------------------------------------------

body=$(api "$KEY" POST "/v1/subscriptions/$ID1/rotate-secret" '{"grace":"8d"}')
assert_eq 400 "$(http_status)" "grace over 7d → 400"
assert_contains "$body" '"field":"grace"' "grace named"
body=$(api "$KEY" POST "/v1/subscriptions/$ID1/rotate-secret" '{"grace":"1h"}')
assert_eq 200 "$(http_status)" "rotate-secret → 200"
SECRET2=$(jstr secret)
assert_contains "$SECRET2" "whsec_" "a new secret is shown"
assert_ne "$SECRET1" "$SECRET2" "the new secret differs"
assert_eq "$ID1" "$(jstr id)" "the rotated subscription is returned"
row=$(psql_q "SELECT prev_secret_sealed IS NOT NULL,
                     prev_secret_until BETWEEN now() + interval '59 minutes'
                                           AND now() + interval '61 minutes'
                FROM subscriptions WHERE id = '$ID1'")
assert_eq "t|t" "$row" "the previous secret is kept for the grace"
assert_eq 1 "$(psql_q "SELECT count(*) FROM audit_log WHERE action = 'subscription.rotate_secret'
                         AND object_id = '$ID1' AND actor = 'tenant'")" "rotation is audited"

n0=$(sink_count /echo/one-b/)
body=$(api "$KEY" POST "/v1/subscriptions/$ID1/verify" '{}')
assert_contains "$body" '"ok":true' "verify after rotation succeeds"
P=/echo/one-b/
n=$((n0 + 1))
BODY=$(sink_bodies $P | nth $n)
TS=$(sink_header $P x-lerian-timestamp | nth $n)
EVID=$(sink_header $P webhook-id | nth $n)
K2=$(hexkey "$SECRET2")
assert_eq "$(lerian_sig "$K2" "$TS" "$BODY") $(lerian_sig "$K1" "$TS" "$BODY")" \
    "$(sink_header $P x-lerian-signature | nth $n)" "X-Lerian-Signature: new then previous secret"
assert_eq "$(webhook_sig "$K2" "$EVID" "$TS" "$BODY") $(webhook_sig "$K1" "$EVID" "$TS" "$BODY")" \
    "$(sink_header $P webhook-signature | nth $n)" "webhook-signature: new then previous secret"

api "$KEY" POST "/v1/subscriptions/$ID1/rotate-secret" '{"grace":"0s"}' >/dev/null
SECRET3=$(jstr secret)
assert_eq 200 "$(http_status)" "rotate with no grace → 200"
assert_eq "t" "$(psql_q "SELECT prev_secret_sealed IS NULL FROM subscriptions WHERE id = '$ID1'")" \
    "grace 0: the previous secret is dropped"
n0=$(sink_count $P)
api "$KEY" POST "/v1/subscriptions/$ID1/verify" >/dev/null
n=$((n0 + 1))
BODY=$(sink_bodies $P | nth $n)
TS=$(sink_header $P x-lerian-timestamp | nth $n)
assert_eq "$(lerian_sig "$(hexkey "$SECRET3")" "$TS" "$BODY")" \
    "$(sink_header $P x-lerian-signature | nth $n)" "one signature once the grace is over"

# default grace (24h) with an empty body
api "$KEY" POST "/v1/subscriptions/$ID3/rotate-secret" >/dev/null
assert_eq 200 "$(http_status)" "rotate without a body → 200"
assert_eq t "$(psql_q "SELECT prev_secret_until BETWEEN now() + interval '23 hours 59 minutes'
                                            AND now() + interval '24 hours 1 minute'
                         FROM subscriptions WHERE id = '$ID3'")" "the default grace is 24h"

# ---------------------------------------------------------------------------
# Idempotency-Key
# ---------------------------------------------------------------------------

IDEM_BODY=$(sub_body "$SINK_URL/echo/idem/")
api "$KEY" POST /v1/subscriptions "$IDEM_BODY" -H 'Idempotency-Key: create-1' >/dev/null
assert_eq 201 "$(http_status)" "create with Idempotency-Key → 201"
IDI=$(jstr id)
SECI=$(jstr secret)
api "$KEY" POST /v1/subscriptions "$IDEM_BODY" -H 'Idempotency-Key: create-1' >/dev/null
assert_eq 201 "$(http_status)" "replay → 201"
assert_eq "true" "$(header idempotent-replayed)" "the replay says so"
assert_eq "$IDI $SECI" "$(jstr id) $(jstr secret)" "the replay is the same subscription and secret"
assert_eq 1 "$(psql_q "SELECT count(*) FROM subscriptions WHERE url = '$SINK_URL/echo/idem/'")" \
    "only one subscription was created"
api "$KEY" POST /v1/subscriptions "$(sub_body "$SINK_URL/echo/idem-other/")" \
    -H 'Idempotency-Key: create-1' >/dev/null
assert_eq 409 "$(http_status)" "the same key with another body → 409"
api "$OTHER" POST /v1/subscriptions "$IDEM_BODY" -H 'Idempotency-Key: create-1' >/dev/null
assert_eq 201 "$(http_status)" "keys are per tenant: globex's create-1 is its own"
assert_ne "$IDI" "$(jstr id)" "globex got its own subscription"
assert_eq "t|t" "$(psql_q "SELECT body::json->>'secret' IS NULL, body::json->>'_ss' LIKE 'v1:%'
                            FROM idempotency_keys WHERE scope = 'tenant:acme' AND key = 'create-1'")" \
    "the stored response holds the secret sealed only"
assert_eq 0 "$(psql_q "SELECT count(*) FROM idempotency_keys WHERE position('${SECI#whsec_}' IN body) > 0")" \
    "the secret is nowhere in the idempotency store"
body=$(api "$KEY" POST /v1/subscriptions "$IDEM_BODY" -H 'Idempotency-Key: two words')
assert_eq 400 "$(http_status)" "an Idempotency-Key with a space → 400"
assert_contains "$body" '"field":"Idempotency-Key"' "the header is named"

api "$KEY" POST "/v1/subscriptions/$IDI/rotate-secret" '{"grace":"1m"}' -H 'Idempotency-Key: rot-1' >/dev/null
assert_eq 200 "$(http_status)" "rotate with Idempotency-Key → 200"
SECR=$(jstr secret)
api "$KEY" POST "/v1/subscriptions/$IDI/rotate-secret" '{"grace":"1m"}' -H 'Idempotency-Key: rot-1' >/dev/null
assert_eq "200 true $SECR" "$(http_status) $(header idempotent-replayed) $(jstr secret)" \
    "rotate replay: same secret, no second rotation"
assert_eq 1 "$(psql_q "SELECT count(*) FROM audit_log WHERE action = 'subscription.rotate_secret'
                         AND object_id = '$IDI'")" "rotated once"
api "$KEY" POST "/v1/subscriptions/$ID1/rotate-secret" '{"grace":"1m"}' -H 'Idempotency-Key: rot-1' >/dev/null
assert_eq 409 "$(http_status)" "a rotate key reused on another subscription → 409"

# ---------------------------------------------------------------------------
# deliveries
# ---------------------------------------------------------------------------

body=$(api "$KEY" GET "/v1/subscriptions/$ID1/deliveries")
assert_eq '200 {"items":[],"next_cursor":null}' "$(http_status) $body" "a new subscription has no deliveries"
api "$KEY" GET "/v1/subscriptions/$ID1/deliveries?state=lost" >/dev/null
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

job() { # job STATE SEQ [EXTRA_COLUMNS EXTRA_VALUES]
    psql_q "INSERT INTO delivery_jobs (subscription_id, tenant_id, event_seq, event_day, event_id,
                                       event_type, state, reason, attempt_count, next_attempt_at,
                                       lease_owner, lease_until, reclaims)
            VALUES ('$ID1', 'acme', $2, (now() AT TIME ZONE 'UTC')::date, 'ev-$2',
                    'transaction.posted', '$1', $3, $4, now() + interval '1 day',
                    $5, $6, $7) RETURNING id"
}
JOB_DEAD=$(job dead 1 "'exhausted'" 9 "'hub-x'" "now()" 5)
JOB_OK=$(job succeeded 2 NULL 1 NULL NULL 0)
JOB_PENDING=$(job pending 3 NULL 0 NULL NULL 0)
psql_q "INSERT INTO delivery_attempts (day, delivery_id, job_id, number, started_at, duration_ms,
                                       status, error, response_excerpt)
        VALUES ((now() AT TIME ZONE 'UTC')::date, '01938000-0000-7000-8000-000000000002',
                $JOB_DEAD, 2, now(), 31, 503, 'status', 'try later'),
               ((now() AT TIME ZONE 'UTC')::date, '01938000-0000-7000-8000-000000000001',
                $JOB_DEAD, 1, now() - interval '1 minute', 5000, NULL, 'timeout', NULL)" >/dev/null

body=$(api "$KEY" GET "/v1/subscriptions/$ID1/deliveries")
assert_eq 200 "$(http_status)" "list deliveries → 200"
assert_eq 3 "$(count '"event_type":"transaction.posted"')" "three jobs listed"
assert_eq "$JOB_PENDING" "$(jraw id)" "newest first"
assert_eq 0 "$(count '"attempts"')" "lists carry no attempts"
body=$(api "$KEY" GET "/v1/subscriptions/$ID1/deliveries?state=dead")
assert_eq 1 "$(count '"state":"dead"')" "state=dead filters"
assert_eq "$JOB_DEAD \"exhausted\" 9" "$(jraw id) $(jraw reason) $(jraw attempt_count)" \
    "the dead job with its reason and attempt count"
assert_contains "$body" "\"subscription_id\":\"$ID1\"" "subscription_id"
assert_contains "$body" '"event_id":"ev-1"' "event_id"
body=$(api "$KEY" GET "/v1/subscriptions/$ID1/deliveries?limit=2")
assert_eq 2 "$(count '"event_type"')" "limit=2"
CURSOR=$(jstr next_cursor)
body=$(api "$KEY" GET "/v1/subscriptions/$ID1/deliveries?limit=2&cursor=$CURSOR")
assert_eq "1 $JOB_DEAD null" "$(count '"event_type"') $(jraw id) $(jraw next_cursor)" \
    "the second page holds the oldest job"
api "$KEY" GET "/v1/subscriptions/$ID1/deliveries?cursor=$(jstr next_cursor "$(api "$KEY" GET '/v1/subscriptions?limit=1')")" >/dev/null
assert_eq 400 "$(http_status)" "a cursor of another list → 400"

body=$(api "$KEY" GET "/v1/deliveries/$JOB_DEAD")
assert_eq 200 "$(http_status)" "GET a delivery → 200"
assert_contains "$body" '"attempts":[{"delivery_id":"01938000-0000-7000-8000-000000000001","number":1,' \
    "attempts ordered by number"
assert_contains "$body" '"duration_ms":5000,"status":null,"error":"timeout","response_excerpt":null}' \
    "attempt fields (no response)"
assert_contains "$body" '"number":2,' "second attempt"
assert_contains "$body" '"status":503,"error":"status","response_excerpt":"try later"}' \
    "attempt fields (a response)"
api "$OTHER" GET "/v1/deliveries/$JOB_DEAD" >/dev/null
assert_eq 404 "$(http_status)" "another tenant's delivery → 404"
api "$OTHER" POST "/v1/deliveries/$JOB_DEAD/redeliver" >/dev/null
assert_eq 404 "$(http_status)" "another tenant cannot redeliver it"

body=$(api "$KEY" POST "/v1/deliveries/$JOB_PENDING/redeliver")
assert_eq 409 "$(http_status)" "redeliver a pending job → 409"
assert_contains "$body" "pending" "the 409 says the state"
api "$KEY" POST "/v1/deliveries/$JOB_OK/redeliver" >/dev/null
assert_eq 409 "$(http_status)" "redeliver a succeeded job → 409"
body=$(api "$KEY" POST "/v1/deliveries/$JOB_DEAD/redeliver")
assert_eq 200 "$(http_status)" "redeliver a dead job → 200"
assert_eq "\"pending\" null" "$(jraw state) $(jraw reason)" "pending again, reason cleared"
row=$(psql_q "SELECT state, reason IS NULL, lease_owner IS NULL, lease_until IS NULL,
                     next_attempt_at <= now(), reclaims, attempt_count
                FROM delivery_jobs WHERE id = $JOB_DEAD")
assert_eq "pending|t|t|t|t|0|9" "$row" "due now, lease and reclaims cleared, attempts kept"
api "$KEY" POST "/v1/deliveries/$JOB_DEAD/redeliver" >/dev/null
assert_eq 409 "$(http_status)" "redeliver twice → 409"
api "$KEY" GET "/v1/deliveries/$JOB_DEAD/redeliver" >/dev/null
assert_eq "405 POST" "$(http_status) $(header allow)" "GET …/redeliver → 405"

# ---------------------------------------------------------------------------
# delete
# ---------------------------------------------------------------------------

api "$KEY" DELETE "/v1/subscriptions/$ID1" >/dev/null
assert_eq 204 "$(http_status)" "DELETE → 204"
api "$KEY" GET "/v1/subscriptions/$ID1" >/dev/null
assert_eq 404 "$(http_status)" "deleted → 404"
api "$KEY" DELETE "/v1/subscriptions/$ID1" >/dev/null
assert_eq 404 "$(http_status)" "DELETE twice → 404"
assert_eq 0 "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$ID1'")" \
    "its jobs went with it"
assert_eq 1 "$(psql_q "SELECT count(*) FROM audit_log WHERE action = 'subscription.delete'
                         AND object_id = '$ID1'")" "deletion is audited"

# nothing secret in the logs
for s in "$SECRET_VALUE" "${SECRET1#whsec_}" "${SECRET2#whsec_}" "Bearer xyz" "$CHALLENGE1"; do
    assert_eq 0 "$(grep -cF -- "$s" "$HUB_LOG")" "the hub log never holds '${s:0:12}…'"
done

# ---------------------------------------------------------------------------
# SSRF and https in production (a second start)
# ---------------------------------------------------------------------------

# ---------------------------------------------------------------------------
# probes that outlive their request, and a stop with a probe in flight
# ---------------------------------------------------------------------------

api "$KEY" PATCH "/v1/subscriptions/$ID3" "{\"destination\":{\"url\":\"$SINK_URL/slow/1500/three-b/\"}}" >/dev/null
wait_until 20 "[[ \$(state_of '$KEY' '$ID3') == failed ]]" # /slow answers "ok": no challenge
api "$KEY" POST "/v1/subscriptions/$ID3/verify" '' --max-time 0.5 >/dev/null
assert_eq 000 "$(http_status)" "a client that hangs up during /verify gets nothing"
if wait_until 10 "[[ \$(psql_q \"SELECT count(*) FROM audit_log WHERE action = 'subscription.verify'
                                  AND object_id = '$ID3'\") == 1 ]]"; then
    pass "the probe still records its outcome after the client left"
else
    fail "no verify outcome recorded for $ID3 after the client left"
fi
hub_alive && pass "the hub survived the hang-up" || fail "the hub died"

api "$KEY" POST /v1/subscriptions "$(sub_body "$SINK_URL/hang/stop/")" >/dev/null
IDH=$(jstr id)
sink_wait 1 /hang/stop/ 10 || fail "the background probe of /hang did not start"
hub_stop # fails the test on a non-zero exit (or a sanitizer report, later)
assert_eq pending "$(psql_q "SELECT verification_state FROM subscriptions WHERE id = '$IDH'")" \
    "a probe cut short by a stop records nothing: still pending"

hub_start "${HUB_ENV[@]}" STREAMING_HUB_ALLOW_PRIVATE_SINKS=false STREAMING_HUB_ENV=production
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
api "$KEY" PATCH "/v1/subscriptions/$ID2" '{"destination":{"url":"https://127.0.0.1/x"}}' >/dev/null
assert_eq 400 "$(http_status)" "PATCH to a private url → 400"
assert_eq 4 "$(psql_q "SELECT count(*) FROM subscriptions WHERE tenant_id = 'acme'")" \
    "no subscription was added by the refused requests"

# the secrets still open after a restart with the same KEK
body=$(api "$KEY" GET "/v1/subscriptions/$ID2")
assert_contains "$body" '"headers":{"Authorization":"***"}' "headers still open after a restart"

hub_stop
hub_start "${HUB_BASE[@]}" STREAMING_HUB_ALLOW_PRIVATE_SINKS=true
body=$(api "$KEY" POST /v1/subscriptions "$(sub_body "$SINK_URL/echo/nokek/")")
assert_eq 503 "$(http_status)" "no KEK → 503"
assert_contains "$body" "STREAMING_HUB_KEK" "the 503 names STREAMING_HUB_KEK"
api "$KEY" POST "/v1/subscriptions/$ID2/verify" >/dev/null
assert_eq 503 "$(http_status)" "verify without a KEK → 503"
api "$KEY" GET "/v1/subscriptions/$ID2" >/dev/null
assert_eq "200 null" "$(http_status) $(jraw headers)" "without a KEK, header names are unknown (null)"

sink_stop
hub_test_done
