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

CONSOLE_DIR=$HUB_TEST_REPO/tests/console

setup() {
    # puppeteer-core, as tests/console/package-lock.json pins it
    "$CONSOLE_DIR/npm-install" || fatal "cannot install tests/console's npm packages"
    # the sanitizer build answers slower: its pages get 4 times the bound
    # (not `| grep -q`: under pipefail, ldd killed by SIGPIPE would fail)
    PAGE_MAX_MS=300
    if [[ $(ldd "$HUB_BIN" 2>/dev/null) == *libasan* ]]; then
        PAGE_MAX_MS=$((4 * PAGE_MAX_MS))
        log "sanitizer build: pages bound ${PAGE_MAX_MS} ms"
    fi
    [[ -x ${CHROMIUM:-/usr/bin/chromium} ]] || fatal "no Chromium at /usr/bin/chromium (scripts/install-deps installs it)"
    pg_start
    kafka_start --topic "$TOPIC":2
    sink_start
    hub_shared STREAMING_HUB_KEK="$(head -c 32 /dev/urandom | base64)" STREAMING_HUB_ALLOW_PRIVATE_SINKS=true
}

rfc3339() { date -u -d "@$1" +%Y-%m-%dT%H:%M:%S.%3NZ; }

# drive CHECK [VAR=value...]: runs one check of tests/console/drive.mjs in
# headless Chromium; its "ok"/"FAIL" lines become this test's assertions,
# its "figure" lines are logged.
drive() {
    local check=$1 out line
    shift
    out=$WORK/drive-$check-$$.out
    env HUB_URL="$HUB_URL" "$@" timeout 120 node "$CONSOLE_DIR/drive.mjs" "$check" >"$out" 2>&1
    while IFS= read -r line; do
        case $line in
        ok\ *) pass "${line#ok }" ;;
        FAIL\ *) fail "${line#FAIL }" ;;
        figure\ *) log "console: ${line#figure }" ;;
        *) [[ -n $line ]] && log "drive: $line" ;;
        esac
    done <"$out"
    grep -qE '^(ok|FAIL) ' "$out" || fail "drive $check printed no result: $(tail -n 5 "$out")"
}

# two_events_of [SUFFIX]: the tenant $(own_id SUFFIX), a subscription at
# /ok and two events delivered (ids ev-a-<id>..., ev-b-<id>...).  Sets
# TENANT KEY SUB.
two_events_of() {
    own_client "${1:-}"
    SUB=$(subscribe_at "$KEY" "/ok/$TENANT/" 'transaction.*')
    produce --topic "$TOPIC" --tenant "$TENANT" --count 1 --id-prefix "ev-a-$TENANT-" \
        --type studio.lerian.transaction.posted >/dev/null
    produce --topic "$TOPIC" --tenant "$TENANT" --count 1 --id-prefix "ev-b-$TENANT-" \
        --type studio.lerian.transaction.posted >/dev/null
    wait_sql 30 2 "SELECT count(*) FROM delivery_jobs WHERE tenant_id = '$TENANT' AND state = 'succeeded'" ||
        fail "the two events were not delivered"
}
two_events() { two_events_of ""; }

# First, while no other scenario has made a tenant: every operator screen
# renders on a hub with no tenants, subscriptions or events.
scenario_console_works_with_an_empty_hub() {
    assert_eq 0 "$(psql_q 'SELECT count(*) FROM tenants')" "the hub has no tenants yet"
    drive empty_hub TOKEN="$ADMIN_TOKEN"
}

scenario_console_files_carry_strict_headers() {
    local body etag
    body=$(hub_curl GET /console/)
    assert_eq 200 "$(http_status)" "/console/ → 200"
    assert_match "$(last_header content-type)" '^text/html' "served as HTML"
    assert_contains "$(last_header content-security-policy)" "script-src 'self';" "scripts from the hub only"
    assert_contains "$(last_header content-security-policy)" "frame-ancestors 'none'" "never framed (CSP)"
    assert_eq DENY "$(last_header x-frame-options)" "X-Frame-Options: DENY"
    assert_eq nosniff "$(last_header x-content-type-options)" "nosniff"
    [[ $(grep -c '<script' <<<"$body") == "$(grep -c '<script type="module" src=' <<<"$body")" ]] &&
        pass "no inline script in index.html" || fail "index.html has an inline script"
    hub_curl GET /console/app.js >/dev/null
    assert_match "$(last_header content-type)" '^text/javascript' "modules served as JavaScript"
    etag=$(last_header etag)
    assert_match "$etag" '^"[0-9a-f]{32}"$' "with an ETag"
    hub_curl GET /console/app.js "" -H "If-None-Match: $etag" >/dev/null
    assert_eq 304 "$(http_status)" "an unchanged module → 304"
    hub_curl GET /console >/dev/null
    assert_eq 301 "$(http_status)" "/console → 301"
    assert_eq /console/ "$(last_header location)" "to /console/"
    hub_curl GET /console/nope.js >/dev/null
    assert_eq 404 "$(http_status)" "an unknown file → 404"
    assert_eq DENY "$(last_header x-frame-options)" "the 404 carries the headers too"
    hub_curl POST /console/ '{}' >/dev/null
    assert_eq 405 "$(http_status)" "POST → 405"
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

# GET /v1/deliveries (SPEC §9): the tenant's deliveries across its
# subscriptions, by event id through the event's stored copies (migration
# 0017); another tenant's event of the same id stays that tenant's.
scenario_the_tenant_wide_list_spans_subscriptions_not_tenants() {
    local body ev sub2 other_key other_tenant cursor seen=0 page=0
    own_client
    SUB=$(subscribe_at "$KEY" "/ok/$TENANT/a/" 'transaction.*')
    sub2=$(subscribe_at "$KEY" "/ok/$TENANT/b/" 'transaction.*')
    other_tenant=$(own_id other)
    other_key=$(own_tenant_key other)
    subscribe_at "$other_key" "/ok/$other_tenant/" 'transaction.*' >/dev/null
    # the same event ids for both tenants: ev-shared-<scenario>-0, -1
    ev="ev-shared-$(own_id)-"
    produce --topic "$TOPIC" --tenant "$TENANT" --count 2 --id-prefix "$ev" \
        --type studio.lerian.transaction.posted >/dev/null
    produce --topic "$TOPIC" --tenant "$other_tenant" --count 2 --id-prefix "$ev" \
        --type studio.lerian.transaction.posted >/dev/null
    wait_sql 30 6 "SELECT count(*) FROM delivery_jobs WHERE event_id LIKE '$ev%' AND state = 'succeeded'" ||
        fail "the events were not delivered"
    ev=$(psql_q "SELECT min(event_id) FROM delivery_jobs WHERE tenant_id = '$TENANT'")

    body=$(hub_curl GET "/v1/deliveries" "" -H "Authorization: Bearer $KEY")
    assert_eq 200 "$(http_status)" "GET /v1/deliveries → 200"
    assert_eq 4 "$(grep -o '"event_id"' <<<"$body" | wc -l)" "both subscriptions' deliveries (2 events × 2)"
    assert_contains "$body" "\"subscription_id\":\"$sub2\"" "the second subscription's too"
    [[ $body != *"\"tenant_id\":\"$other_tenant\""* ]] && pass "not the other tenant's" ||
        fail "the other tenant's deliveries are listed: ${body:0:300}"
    body=$(hub_curl GET "/v1/deliveries?event_id=$ev" "" -H "Authorization: Bearer $KEY")
    assert_eq 2 "$(grep -o "\"event_id\":\"$ev\"" <<<"$body" | wc -l)" "by event id: its delivery to each subscription"
    [[ $body != *"$other_tenant"* ]] && pass "by event id: not the other tenant's event of the same id" ||
        fail "the other tenant's event of the same id is listed"
    body=$(hub_curl GET "/v1/deliveries?event_id=$ev&subscription=$sub2" "" -H "Authorization: Bearer $KEY")
    assert_eq 1 "$(grep -o '"event_id"' <<<"$body" | wc -l)" "by event id and subscription: one"
    body=$(hub_curl GET "/v1/subscriptions/$sub2/deliveries?event_id=$ev" "" -H "Authorization: Bearer $KEY")
    assert_eq 1 "$(grep -o "\"event_id\":\"$ev\"" <<<"$body" | wc -l)" "the subscription's list finds it too"
    body=$(hub_curl GET "/v1/deliveries?event_id=$ev&state=dead" "" -H "Authorization: Bearer $KEY")
    assert_contains "$body" '"items":[]' "by event id and another state: none"
    body=$(admin_curl GET "/admin/deliveries?event_id=$ev")
    assert_eq 3 "$(grep -o '"event_id"' <<<"$body" | wc -l)" "the operator sees both tenants' deliveries of that id"

    # a cursor walk sees each delivery once
    cursor=""
    while ((page < 10)); do
        body=$(hub_curl GET "/v1/deliveries?limit=1${cursor:+&cursor=$cursor}" "" -H "Authorization: Bearer $KEY")
        seen=$((seen + $(grep -o '"event_id"' <<<"$body" | wc -l)))
        page=$((page + 1))
        cursor=$(sed -n 's/.*"next_cursor":"\([^"]*\)".*/\1/p' <<<"$body")
        [[ -n $cursor ]] || break
    done
    assert_eq 4 "$seen" "a walk of pages of one sees the 4 deliveries once each"

    hub_curl GET "/v1/deliveries?subscription=nope" "" -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq 400 "$(http_status)" "a malformed subscription → 400"
    assert_contains "$(last_body)" '"field":"subscription"' "the 400 names it"
    hub_curl GET "/v1/deliveries?cursor=zzz" "" -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq 400 "$(http_status)" "a foreign cursor → 400"
    hub_curl GET "/v1/deliveries" >/dev/null
    assert_eq 401 "$(http_status)" "no key → 401"
    hub_curl POST "/v1/deliveries" '{}' -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq 405 "$(http_status)" "POST → 405"
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

scenario_a_wrong_token_shows_a_sign_in_error() {
    drive wrong_token
}

# A destination that fails until a moment 4 s ahead: the job dies on its
# two quick attempts; after that moment a redeliver from the console
# succeeds.
scenario_a_tenant_redelivers_a_dead_delivery_in_the_browser() {
    local sub job until_ms
    own_client
    until_ms=$(($(date +%s%3N) + 4000))
    sub=$(subscribe_at "$KEY" "/fail-until/$until_ms/$(own_id)/" 'transaction.*' ',"retry_schedule":["100ms"]')
    produce --topic "$TOPIC" --tenant "$TENANT" --count 1 --id-prefix "dead-$(own_id)-" \
        --type studio.lerian.transaction.posted >/dev/null
    wait_sql 30 1 "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$sub' AND state = 'dead'" ||
        fail "the job did not die"
    job=$(psql_q "SELECT id FROM delivery_jobs WHERE subscription_id = '$sub'")
    wait_until 10 "(( \$(date +%s%3N) > $until_ms ))"
    drive redeliver TOKEN="$KEY" DELIVERY="$job"
    assert_eq succeeded "$(psql_q "SELECT state FROM delivery_jobs WHERE id = $job")" "the job succeeded"
}

scenario_markup_in_a_response_shows_as_text() {
    local job
    two_events
    job=$(psql_q "SELECT id FROM delivery_jobs WHERE tenant_id = '$TENANT' ORDER BY id LIMIT 1")
    # delivery_attempts is a view (migration 0014): a success lives on its
    # job, the other attempts in delivery_attempt_rows
    local markup='<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
    psql_q "UPDATE delivery_attempt_rows SET response_excerpt = \$m\$$markup\$m\$ WHERE job_id = $job;
            UPDATE delivery_jobs SET success_excerpt = \$m\$$markup\$m\$
             WHERE id = $job AND success_delivery_id IS NOT NULL" >/dev/null
    drive script_as_text TOKEN="$KEY" DELIVERY="$job"
}

scenario_a_tenant_key_sees_only_its_tenant() {
    local key_a other_job other_event
    two_events
    key_a=$KEY
    two_events_of other
    other_job=$(psql_q "SELECT id FROM delivery_jobs WHERE tenant_id = '$TENANT' ORDER BY id LIMIT 1")
    other_event=$(psql_q "SELECT event_id FROM delivery_jobs WHERE id = $other_job")
    drive tenant_only TOKEN="$key_a" OTHER="$SUB $other_job $other_event"
}

# The dry-run screen is the client of POST /admin/policies/dry-run (the
# policy workbench); without that endpoint in this build there is nothing
# to drive.
scenario_the_dry_run_screen_runs_a_policy_over_stored_events() {
    admin_curl POST /admin/policies/dry-run '{}' >/dev/null
    if [[ $(http_status) == 404 ]]; then
        pass "no dry-run endpoint in this build: the screen's check is left out"
        return
    fi
    two_events
    drive dry_run TOKEN="$ADMIN_TOKEN" TENANT="$TENANT" ${CONSOLE_SHOTS_DIR:+SHOT_DIR="$CONSOLE_SHOTS_DIR"}
}

# 100,000 deliveries of one tenant seeded with SQL (1 in 100 dead, with
# three attempts each), then each page loaded three times in Chromium; the
# best load of each must show its data under 300 ms from navigation start.
# With CONSOLE_SHOTS_DIR set, screenshots of the main screens are written
# there (docs/console/ holds the committed ones).
scenario_pages_show_data_within_300ms_with_100000_deliveries() {
    local ev dead pages
    own_client
    SUB=$(subscribe_at "$KEY" "/ok/$(own_id)/" 'transaction.*')
    psql_q "INSERT INTO delivery_jobs (subscription_id, tenant_id, event_seq, event_day, event_id,
                event_type, state, reason, attempt_count, created_at, updated_at, next_attempt_at)
            SELECT '$SUB', '$TENANT', g, current_date, 'seed-' || g, 'studio.lerian.transaction.posted',
                   CASE WHEN g % 100 = 0 THEN 'dead' ELSE 'succeeded' END,
                   CASE WHEN g % 100 = 0 THEN 'exhausted' END,
                   CASE WHEN g % 100 = 0 THEN 3 ELSE 1 END,
                   now() - (100000 - g) * interval '1 second', now(), now()
              FROM generate_series(1, 100000) g" >/dev/null
    psql_q "INSERT INTO delivery_attempts (day, delivery_id, job_id, number, started_at, duration_ms,
                status, error, response_excerpt)
            SELECT current_date, gen_random_uuid(), j.id, n, j.created_at + n * interval '1 second',
                   40 + n, 503, 'http_status', '{\"error\":\"unavailable\"}'
              FROM delivery_jobs j, generate_series(1, 3) n
             WHERE j.tenant_id = '$TENANT' AND j.state = 'dead'" >/dev/null
    psql_q "ANALYZE delivery_jobs; ANALYZE delivery_attempt_rows" >/dev/null
    assert_ge "$(psql_q "SELECT count(*) FROM delivery_jobs")" 100000 "100,000 deliveries stored"
    ev=seed-77777
    dead=$(psql_q "SELECT id FROM delivery_jobs WHERE tenant_id = '$TENANT' AND state = 'dead' ORDER BY id DESC LIMIT 1")
    pages="overview|#/overview|overview tenants|#/tenants|tenants
        subscriptions|#/subscriptions?tenant=$TENANT|subscriptions
        deliveries-of-tenant|#/deliveries?tenant=$TENANT|deliveries
        deliveries-dead|#/deliveries?state=dead|deliveries
        deliveries-by-event|#/deliveries?event_id=$ev|deliveries
        deliveries-last-hour|#/deliveries?tenant=$TENANT&since=$(rfc3339 $(($(date +%s) - 3600)))|deliveries
        delivery|#/delivery/$dead|delivery
        quarantine|#/quarantine|quarantine policies|#/policies|policies"
    # empty lists count as data shown for quarantine and policies: the
    # timing is what this scenario checks there
    drive timing TOKEN="$ADMIN_TOKEN" MAX_MS="$PAGE_MAX_MS" PAGES="$pages"
    drive timing TOKEN="$KEY" MAX_MS="$PAGE_MAX_MS" PAGES="tenant-overview|#/overview|overview
        tenant-deliveries|#/deliveries|deliveries
        tenant-deliveries-dead|#/deliveries?state=dead|deliveries
        tenant-deliveries-by-event|#/deliveries?event_id=$ev|deliveries
        tenant-delivery|#/delivery/$dead|delivery"
    if [[ -n ${CONSOLE_SHOTS_DIR:-} ]]; then
        drive screenshots TOKEN="$ADMIN_TOKEN" SHOT_DIR="$CONSOLE_SHOTS_DIR" SHOTS="overview.png|#/overview|overview
            tenants.png|#/tenants|tenants subscriptions.png|#/subscriptions|subscriptions
            deliveries.png|#/deliveries?state=dead|deliveries delivery.png|#/delivery/$dead|delivery
            quarantine.png|#/quarantine|quarantine policies.png|#/policies|policies dryrun.png|#/dryrun|dryrun"
        drive screenshots TOKEN=wrong SHOT_DIR="$CONSOLE_SHOTS_DIR" SIGNIN_SHOT=signin.png
    fi
}

scenarios_main "$@"
