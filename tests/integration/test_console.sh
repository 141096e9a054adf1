#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# The web console (issue 27; docs/console.md): the admin read routes it uses
# across tenants (GET /admin/subscriptions, GET /admin/deliveries[/{id}]),
# the event_id/since/until filters of the tenant's deliveries list, the
# console's own files and headers, and — in headless Chromium driven by
# puppeteer-core (tests/console/) — signing in, redelivering a dead
# delivery, a <script> payload shown as text, a tenant key seeing only its
# tenant, a wrong token's sign-in error, and how fast pages show their data
# with 100,000 deliveries stored.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"

TOPIC=lerian.streaming.console

setup() {
    pg_start
    kafka_start --topic "$TOPIC":2
    sink_start
    hub_shared STREAMING_HUB_KEK="$(head -c 32 /dev/urandom | base64)" STREAMING_HUB_ALLOW_PRIVATE_SINKS=true
}

rfc3339() { date -u -d "@$1" +%Y-%m-%dT%H:%M:%S.%3NZ; }

# two_events: the scenario's tenant, a subscription at /ok and two events
# delivered (ids ev-a-<id>, ev-b-<id>).  Sets TENANT KEY SUB.
two_events() {
    own_client
    SUB=$(subscribe_at "$KEY" "/ok/$(own_id)/" 'transaction.*')
    produce --topic "$TOPIC" --tenant "$TENANT" --count 1 --id-prefix "ev-a-$(own_id)-" \
        --type studio.lerian.transaction.posted >/dev/null
    produce --topic "$TOPIC" --tenant "$TENANT" --count 1 --id-prefix "ev-b-$(own_id)-" \
        --type studio.lerian.transaction.posted >/dev/null
    wait_sql 30 2 "SELECT count(*) FROM delivery_jobs WHERE tenant_id = '$TENANT' AND state = 'succeeded'" ||
        fail "the two events were not delivered"
}

scenario_the_tenant_list_finds_an_event_and_a_window() {
    local body ev t0 t1
    two_events
    ev=$(psql_q "SELECT event_id FROM delivery_jobs WHERE tenant_id = '$TENANT' AND event_id LIKE 'ev-a-%'")
    body=$(hub_curl GET "/v1/subscriptions/$SUB/deliveries?event_id=$ev" "" -H "Authorization: Bearer $KEY")
    assert_eq 200 "$(http_status)" "event_id filter → 200"
    assert_contains "$body" "\"event_id\":\"$ev\"" "the event's delivery is listed"
    assert_eq 1 "$(grep -o '"event_id"' <<<"$body" | wc -l)" "only that event's delivery"
    t1=$(date +%s.%N)
    t0=$(awk -v t="$t1" 'BEGIN { printf "%.3f", t - 3600 }')
    body=$(hub_curl GET "/v1/subscriptions/$SUB/deliveries?since=$(rfc3339 "$t0")&until=$(rfc3339 "$t1")" "" -H "Authorization: Bearer $KEY")
    assert_eq 2 "$(grep -o '"event_id"' <<<"$body" | wc -l)" "the last hour holds both"
    body=$(hub_curl GET "/v1/subscriptions/$SUB/deliveries?until=$(rfc3339 "$t0")" "" -H "Authorization: Bearer $KEY")
    assert_contains "$body" '"items":[]' "nothing before the last hour"
    hub_curl GET "/v1/subscriptions/$SUB/deliveries?since=yesterday" "" -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq 400 "$(http_status)" "a malformed since → 400"
    assert_contains "$(last_body)" '"field":"since"' "the 400 names since"
    hub_curl GET "/v1/subscriptions/$SUB/deliveries?since=$(rfc3339 "$t1")&until=$(rfc3339 "$t0")" "" -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq 400 "$(http_status)" "until before since → 400"
    assert_contains "$(last_body)" '"field":"until"' "the 400 names until"
}

scenario_admin_reads_span_tenants_and_filter() {
    local body ev id other_key other_sub
    two_events
    other_key=$(own_tenant_key other)
    other_sub=$(subscribe_at "$other_key" "/ok/$(own_id)-o/" 'balance.*')
    ev=$(psql_q "SELECT event_id FROM delivery_jobs WHERE tenant_id = '$TENANT' AND event_id LIKE 'ev-b-%'")
    body=$(admin_curl GET "/admin/deliveries?event_id=$ev")
    assert_eq 200 "$(http_status)" "admin deliveries by event id → 200"
    assert_contains "$body" "\"tenant_id\":\"$TENANT\"" "the delivery names its tenant"
    assert_eq 1 "$(grep -o '"event_id"' <<<"$body" | wc -l)" "one delivery of that event"
    body=$(admin_curl GET "/admin/deliveries?tenant=$TENANT&state=succeeded&limit=1")
    assert_contains "$body" '"next_cursor":"' "a page of one has a next cursor"
    id=$(json_field id "$body")
    [[ -n $id ]] || id=$(sed -n 's/.*"id":\([0-9]*\).*/\1/p' <<<"$body" | head -n1)
    body=$(admin_curl GET "/admin/deliveries/$id")
    assert_eq 200 "$(http_status)" "admin delivery by id → 200"
    assert_contains "$body" '"attempts":[{' "with its attempts"
    body=$(admin_curl GET "/admin/subscriptions?tenant=$TENANT")
    assert_contains "$body" "\"id\":\"$SUB\"" "the tenant's subscription is listed"
    [[ $body != *"$other_sub"* ]] && pass "not another tenant's" || fail "another tenant's subscription listed"
    assert_contains "$body" '"failure_first_at":null' "the failure streak is shown"
    admin_curl GET "/admin/deliveries?state=lost" >/dev/null
    assert_eq 400 "$(http_status)" "an unknown state → 400"
    assert_contains "$(last_body)" '"field":"state"' "the 400 names state"
    admin_curl GET "/admin/deliveries?tenant=bad%20id" >/dev/null
    assert_eq 400 "$(http_status)" "a malformed tenant → 400"
    admin_curl GET "/admin/deliveries?subscription=nope" >/dev/null
    assert_contains "$(last_body)" '"field":"subscription"' "a malformed subscription → 400 naming it"
    admin_curl GET "/admin/deliveries/999999999999" >/dev/null
    assert_eq 404 "$(http_status)" "an unknown delivery → 404"
    hub_curl GET "/admin/deliveries" "" -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq 401 "$(http_status)" "a tenant key is not the admin token → 401"
    admin_curl POST "/admin/deliveries" '{}' >/dev/null
    assert_eq 405 "$(http_status)" "read-only → 405"
}

scenarios_main "$@"
