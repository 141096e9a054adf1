#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# The admin API and the operations endpoints end to end (SPEC §5, §9, §10):
# real HTTP against `streaming-hub serve`, a real PostgreSQL checked with psql.
# Covers the admin token (401), the tenant roster (create, duplicate,
# validation with errors[], get, patch, pagination with opaque cursors),
# tenant API keys (shown once, stored as SHA-256, revoked), Idempotency-Key
# replay (also on POST /admin/policies/reload), the quarantine API, the audit log, problem+json 404/405/413,
# /healthz, /readyz, /metrics, and a clean SIGTERM with connections open.
#
# The hub runs with STREAMING_HUB_ROLE=delivery: every role serves the API,
# and this one needs no Kafka to be ready.  jq is not assumed: the API
# answers compact JSON, which grep and sed can read.  Every scenario names
# the tenants it creates after itself (own_id).
#
# No `set -e`: lib.sh polls with commands that are expected to fail until
# the awaited thing appears (hub_start greps its log), so errexit would end
# the test there.  Every check below is an explicit assertion instead.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"

PROBLEM='application/problem+json'

setup() {
    pg_start
    # The reload scenario counts reloads: only the API may reload here.
    hub_shared STREAMING_HUB_ROLE=delivery STREAMING_HUB_POLICY_WATCH=false
}

# ---------------------------------------------------------------------------
# operations endpoints
# ---------------------------------------------------------------------------

scenario_health_readiness_and_metrics() {
    local body
    body=$(hub_curl GET /healthz)
    assert_eq '200 {"status":"ok"}' "$(http_status) $body" "GET /healthz → 200 ok"
    body=$(hub_curl GET /readyz)
    assert_eq '200 {"status":"ready"}' "$(http_status) $body" "GET /readyz → 200 ready"
    hub_curl POST /healthz '{}' >/dev/null
    assert_eq "405 GET, HEAD" "$(http_status) $(last_header allow)" "POST /healthz → 405 with Allow"

    body=$(hub_curl GET /metrics)
    assert_eq 200 "$(http_status)" "GET /metrics → 200"
    assert_contains "$(last_header content-type)" "text/plain; version=0.0.4" "metrics content type"
    assert_contains "$body" 'streaming_hub_ingest_records_total{verdict="accepted",reason=""}' \
        "/metrics has streaming_hub_ingest_records_total"
    assert_ge "$(metric streaming_hub_http_requests_total)" 4 "HTTP requests are counted"
}

# ---------------------------------------------------------------------------
# the admin token
# ---------------------------------------------------------------------------

scenario_admin_routes_need_the_admin_token() {
    local body
    body=$(hub_curl GET /admin/tenants)
    assert_eq 401 "$(http_status)" "no token → 401"
    assert_eq "$PROBLEM" "$(last_header content-type)" "401 is problem+json"
    assert_contains "$(last_header www-authenticate)" "Bearer" "401 carries WWW-Authenticate: Bearer"
    assert_eq 401 "$(json_raw status "$body")" "problem status member"
    hub_curl GET /admin/tenants "" -H "Authorization: Bearer wrong-$ADMIN_TOKEN" >/dev/null
    assert_eq 401 "$(http_status)" "wrong token → 401"
    hub_curl GET /admin/tenants "" -H "Authorization: Basic $(printf 'a:b' | base64)" >/dev/null
    assert_eq 401 "$(http_status)" "not a bearer token → 401"
    hub_curl GET /admin/no-such-thing >/dev/null
    assert_eq 401 "$(http_status)" "unknown admin path without a token → 401 (auth before routing)"
    hub_curl GET /admin/tenants "" -H "authorization: bearer $ADMIN_TOKEN" >/dev/null
    assert_eq 200 "$(http_status)" "the Bearer scheme is case-insensitive"
}

# ---------------------------------------------------------------------------
# tenants: create, duplicate, validation
# ---------------------------------------------------------------------------

scenario_tenant_create_and_validation() {
    local t t1 t2 body ts long ok256
    t=$(own_id)
    t1=$(own_id t1)
    t2=$(own_id t2)
    body=$(admin_curl POST /admin/tenants "{\"id\":\"$t\"}")
    assert_eq 201 "$(http_status)" "POST /admin/tenants → 201"
    assert_eq "$t active null" "$(json_str id "$body") $(json_str status "$body") $(json_raw quotas "$body")" \
        "created tenant: id, default status active, quotas null"
    assert_contains "$body" '"created_at":"' "created tenant has created_at"
    ts=$(json_str created_at "$body")
    assert_match "$ts" '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z$' "created_at is RFC 3339 UTC"
    assert_eq "/admin/tenants/$t" "$(last_header location)" "201 has Location"
    assert_eq active "$(psql_q "SELECT status FROM tenants WHERE id = '$t'")" "tenant stored"

    admin_curl POST /admin/tenants "{\"id\":\"$t\",\"status\":\"inactive\"}" >/dev/null
    assert_eq "409 $PROBLEM" "$(http_status) $(last_header content-type)" "duplicate id → 409 problem"

    body=$(admin_curl POST /admin/tenants '{"id":"bad id!"}')
    assert_eq 400 "$(http_status)" "invalid id → 400"
    assert_contains "$body" '"errors":[{"field":"id"' "invalid id: errors[] names id"
    long=$(printf 'x%.0s' $(seq 1 257))
    admin_curl POST /admin/tenants "{\"id\":\"$long\"}" >/dev/null
    assert_eq 400 "$(http_status)" "257-character id → 400"
    # path segments h2o resolves: no /admin/tenants/{id} request could reach them
    for c in '.|400' '..|400' '...|201'; do
        admin_curl POST /admin/tenants "{\"id\":\"${c%|*}\"}" >/dev/null
        assert_eq "${c#*|}" "$(http_status)" "id \"${c%|*}\" → ${c#*|}"
    done
    ok256=$(printf 'y%.0s' $(seq 1 256))
    admin_curl POST /admin/tenants "{\"id\":\"$ok256\"}" >/dev/null
    assert_eq 201 "$(http_status)" "256-character id → 201"
    body=$(admin_curl POST /admin/tenants '{"status":"active"}')
    assert_eq 400 "$(http_status)" "missing id → 400"
    assert_contains "$body" '"field":"id","message":"is required"' "missing id is named"
    body=$(admin_curl POST /admin/tenants "{\"id\":\"$t1\",\"status\":\"paused\"}")
    assert_eq 400 "$(http_status)" "bad status → 400"
    assert_contains "$body" '"field":"status"' "bad status is named"
    body=$(admin_curl POST /admin/tenants "{\"id\":\"$t1\",\"colour\":\"red\",\"size\":1}")
    assert_eq 400 "$(http_status)" "unknown member → 400"
    assert_contains "$body" '"field":"colour","message":"unknown member"' "unknown member colour named"
    assert_contains "$body" '"field":"size"' "unknown member size named"
    assert_contains "$(json_str detail "$body")" "colour" "detail names the unknown member"
    body=$(admin_curl POST /admin/tenants "{\"id\":\"$t1\",")
    assert_eq "400 $PROBLEM" "$(http_status) $(last_header content-type)" "malformed JSON → 400 problem"
    assert_contains "$(json_str detail "$body")" "malformed JSON" "malformed JSON detail"
    admin_curl POST /admin/tenants "[\"$t1\"]" >/dev/null
    assert_eq 400 "$(http_status)" "a JSON array body → 400"
    admin_curl POST /admin/tenants "{\"id\":\"$t1\",\"id\":\"$t2\"}" >/dev/null
    assert_eq 400 "$(http_status)" "duplicate members → 400"
    admin_curl POST /admin/tenants '' >/dev/null
    assert_eq 400 "$(http_status)" "empty body → 400"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM tenants WHERE id IN ('$t1', '$t2')")" \
        "nothing stored by refused requests"
}

# Bodies over 1 MiB are refused.
scenario_a_body_over_1_mib_is_413() {
    local code
    head -c $((1024 * 1024 + 10)) /dev/zero | tr '\0' ' ' >"$WORK/big.json"
    code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $ADMIN_TOKEN" \
        -H 'Content-Type: application/json' --data-binary "@$WORK/big.json" "$HUB_URL/admin/tenants")
    assert_eq 413 "$code" "a body over 1 MiB → 413"
}

# ---------------------------------------------------------------------------
# tenants: get, patch, audit
# ---------------------------------------------------------------------------

scenario_tenant_get_and_patch_are_audited() {
    local t body created
    t=$(own_id)
    admin_curl POST /admin/tenants "{\"id\":\"$t\"}" >/dev/null
    assert_eq 201 "$(http_status)" "the tenant to patch is created"
    admin_curl GET "/admin/tenants/$(own_id nope)" >/dev/null
    assert_eq "404 $PROBLEM" "$(http_status) $(last_header content-type)" "GET absent tenant → 404 problem"
    body=$(admin_curl GET "/admin/tenants/$t")
    assert_eq "200 $t active" "$(http_status) $(json_str id "$body") $(json_str status "$body")" \
        "GET /admin/tenants/{id} → 200"
    created=$(json_str created_at "$body")

    sleep 0.01
    body=$(admin_curl PATCH "/admin/tenants/$t" '{"status":"inactive"}')
    assert_eq "200 inactive" "$(http_status) $(json_str status "$body")" "PATCH status → 200 inactive"
    assert_eq "$created" "$(json_str created_at "$body")" "PATCH keeps created_at"
    [[ $(json_str updated_at "$body") > $created ]] && pass "PATCH bumps updated_at" ||
        fail "PATCH bumps updated_at: $(json_str updated_at "$body") vs $created"
    assert_eq inactive "$(psql_q "SELECT status FROM tenants WHERE id = '$t'")" "status stored"
    body=$(admin_curl PATCH "/admin/tenants/$t" '{"quotas":{"ingest_per_second":100}}')
    assert_eq 200 "$(http_status)" "PATCH quotas → 200"
    assert_contains "$body" '"quotas":{"ingest_per_second":100}' "quotas returned"
    assert_eq "inactive" "$(json_str status "$body")" "PATCH quotas leaves status alone"
    body=$(admin_curl PATCH "/admin/tenants/$t" '{"quotas":{"ratio":0.1,"burst":2.5e3}}')
    assert_contains "$body" '"ratio":0.1' "fractional quota returned as typed"
    assert_eq "0.1" "$(psql_q "SELECT quotas->>'ratio' FROM tenants WHERE id = '$t'")" \
        "fractional quota stored as typed"
    body=$(admin_curl PATCH "/admin/tenants/$t" '{"status":"active","quotas":null}')
    assert_eq "200 active null" "$(http_status) $(json_str status "$body") $(json_raw quotas "$body")" \
        "PATCH status and quotas null"
    body=$(admin_curl PATCH "/admin/tenants/$t" '{"status":"gone"}')
    assert_eq 400 "$(http_status)" "PATCH bad status → 400"
    assert_contains "$body" '"field":"status"' "PATCH bad status named"
    admin_curl PATCH "/admin/tenants/$t" '{"id":"other"}' >/dev/null
    assert_eq 400 "$(http_status)" "PATCH id → 400 (unknown member)"
    admin_curl PATCH "/admin/tenants/$t" '{}' >/dev/null
    assert_eq 400 "$(http_status)" "PATCH nothing → 400"
    admin_curl PATCH "/admin/tenants/$(own_id nope)" '{"status":"active"}' >/dev/null
    assert_eq 404 "$(http_status)" "PATCH absent tenant → 404"
    assert_eq "tenant.create,tenant.update,tenant.update,tenant.update,tenant.update" \
        "$(psql_q "SELECT string_agg(action, ',' ORDER BY id) FROM audit_log
                   WHERE tenant_id = '$t' AND actor = 'admin'")" \
        "audit rows for create and each successful patch"
}

# ---------------------------------------------------------------------------
# tenants: list and pagination (of every tenant in the roster)
# ---------------------------------------------------------------------------

scenario_tenant_list_pages_with_opaque_cursors() {
    local expected n body seen=() cursor="" pages=0 path items bad
    tenant_create "$(own_id alpha)"
    admin_curl POST /admin/tenants "{\"id\":\"$(own_id beta)\",\"status\":\"inactive\"}" >/dev/null
    admin_curl POST /admin/tenants "{\"id\":\"$(own_id gamma)\",\"quotas\":{\"a\":1}}" >/dev/null
    assert_eq 201 "$(http_status)" "create with quotas → 201"
    expected=$(psql_q "SELECT string_agg(id, ' ' ORDER BY id) FROM tenants")
    n=$(psql_q "SELECT count(*) FROM tenants")
    while :; do
        path='/admin/tenants?limit=1'
        [[ -n $cursor ]] && path+="&cursor=$cursor"
        body=$(admin_curl GET "$path")
        [[ $(http_status) == 200 ]] || {
            fail "list page: status $(http_status)"
            break
        }
        pages=$((pages + 1))
        items=$(grep -oE '"id":"[^"]*"' <<<"$body" | wc -l)
        ((items == 1)) || fail "page $pages holds $items items"
        seen+=("$(json_str id "$body")")
        cursor=$(json_str next_cursor "$body")
        if [[ -z $cursor ]]; then
            assert_contains "$body" '"next_cursor":null' "last page has next_cursor null"
            break
        fi
        ((pages < n + 1)) || {
            fail "pagination does not end"
            break
        }
    done
    assert_eq "$expected" "${seen[*]}" "limit=1 pages walk every tenant once, in id order"
    body=$(admin_curl GET /admin/tenants)
    assert_eq "200 null" "$(http_status) $(json_raw next_cursor "$body")" "default limit: one page"
    assert_eq "$n" "$(grep -oE '"created_at"' <<<"$body" | wc -l)" "default page holds the $n tenants"
    for bad in 'limit=0' 'limit=501' 'limit=abc' 'cursor=%%%' 'cursor=bm9wZQ'; do
        body=$(admin_curl GET "/admin/tenants?$bad")
        assert_eq 400 "$(http_status)" "list with $bad → 400"
        assert_contains "$body" "\"field\":\"${bad%%=*}\"" "list with $bad names ${bad%%=*}"
    done
    admin_curl GET '/admin/tenants?limit=500' >/dev/null
    assert_eq 200 "$(http_status)" "limit=500 → 200"
}

# ---------------------------------------------------------------------------
# tenant API keys
# ---------------------------------------------------------------------------

scenario_api_keys_are_shown_once_and_revoked() {
    local t other body key key_id
    t=$(own_tenant)
    other=$(own_tenant other inactive)
    body=$(admin_curl POST "/admin/tenants/$t/api-keys")
    assert_eq 201 "$(http_status)" "POST api-keys → 201"
    key=$(json_str key "$body")
    key_id=$(json_str id "$body")
    assert_match "$key" '^shk_[A-Za-z0-9_-]{43}$' "key is shk_ + 43 base64url characters"
    assert_match "$key_id" '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' "key id is a uuid"
    assert_eq "$t" "$(json_str tenant_id "$body")" "key tenant_id"
    assert_contains "$body" '"created_at":"' "key created_at"
    assert_eq no-store "$(last_header cache-control)" "key answer is not cacheable"
    assert_eq "$(printf %s "$key" | sha256sum | cut -d' ' -f1)" \
        "$(psql_q "SELECT encode(key_hash, 'hex') FROM tenant_api_keys WHERE id = '$key_id'")" \
        "stored key_hash = SHA-256 of the key"
    assert_eq 0 "$(psql_q "SELECT (SELECT count(*) FROM idempotency_keys
                                    WHERE position('$key' in body) > 0)
                                 + (SELECT count(*) FROM audit_log
                                    WHERE position('$key' in coalesce(detail::text, '')) > 0)")" \
        "the key text is stored nowhere"
    body=$(admin_curl POST "/admin/tenants/$t/api-keys")
    assert_ne "$key" "$(json_str key "$body")" "a second key differs"
    admin_curl POST "/admin/tenants/$(own_id nope)/api-keys" >/dev/null
    assert_eq 404 "$(http_status)" "key for an absent tenant → 404"
    admin_curl POST "/admin/tenants/$t/api-keys" '{"label":"x"}' >/dev/null
    assert_eq 400 "$(http_status)" "key create with an unknown member → 400"
    admin_curl GET "/admin/tenants/$t/api-keys" >/dev/null
    assert_eq "405 POST" "$(http_status) $(last_header allow)" "GET api-keys → 405 with Allow"

    admin_curl DELETE "/admin/tenants/$t/api-keys/$key_id" >/dev/null
    assert_eq 204 "$(http_status)" "DELETE key → 204"
    assert_eq t "$(psql_q "SELECT revoked_at IS NOT NULL FROM tenant_api_keys WHERE id = '$key_id'")" \
        "revoked_at set"
    admin_curl DELETE "/admin/tenants/$t/api-keys/$key_id" >/dev/null
    assert_eq 404 "$(http_status)" "DELETE revoked key again → 404"
    admin_curl DELETE "/admin/tenants/$other/api-keys/$key_id" >/dev/null
    assert_eq 404 "$(http_status)" "DELETE another tenant's key → 404"
    admin_curl DELETE "/admin/tenants/$t/api-keys/not-a-uuid" >/dev/null
    assert_eq 404 "$(http_status)" "DELETE with an invalid uuid → 404"
    assert_eq "api_key.create:2 api_key.revoke:1" \
        "$(psql_q "SELECT string_agg(action || ':' || n, ' ' ORDER BY action) FROM (
                     SELECT action, count(*) AS n FROM audit_log
                      WHERE tenant_id = '$t' AND action LIKE 'api_key.%' GROUP BY action) s")" \
        "audit rows for key create and revoke"
}

# ---------------------------------------------------------------------------
# Idempotency-Key
# ---------------------------------------------------------------------------

scenario_idempotency_key_replays_the_answer() {
    local idem1 idem2 first again k1 k2
    idem1=$(own_id idem1)
    idem2=$(own_id idem2)
    first=$(admin_curl POST /admin/tenants "{\"id\":\"$idem1\"}" -H 'Idempotency-Key: k-1')
    assert_eq 201 "$(http_status)" "POST with Idempotency-Key → 201"
    again=$(admin_curl POST /admin/tenants "{\"id\":\"$idem1\"}" -H 'Idempotency-Key: k-1')
    assert_eq 201 "$(http_status)" "replay → same status 201 (not 409)"
    assert_eq "$first" "$again" "replay → byte-identical body"
    assert_eq true "$(last_header idempotent-replayed)" "replay is marked Idempotent-Replayed"
    admin_curl POST /admin/tenants "{\"id\":\"$(own_id idem-other)\"}" -H 'Idempotency-Key: k-1' >/dev/null
    assert_eq 409 "$(http_status)" "same key, other body → 409 (not the other request's answer)"
    assert_eq "1 0 1" "$(psql_q "SELECT (SELECT count(*) FROM tenants WHERE id = '$idem1'),
                                        (SELECT count(*) FROM tenants WHERE id = '$(own_id idem-other)'),
                                        (SELECT count(*) FROM audit_log WHERE tenant_id = '$idem1')" |
        tr '|' ' ')" "the replay created nothing and audited nothing"
    assert_eq "201" "$(psql_q "SELECT status FROM idempotency_keys WHERE scope = 'admin'
                               AND key = 'k-1'")" "idempotency record stored"

    # An expired record (older than 24h) is ignored: the key works again.
    psql_q "UPDATE idempotency_keys SET created_at = now() - interval '25 hours' WHERE key = 'k-1'"
    admin_curl POST /admin/tenants "{\"id\":\"$idem2\"}" -H 'Idempotency-Key: k-1' >/dev/null
    assert_eq 201 "$(http_status)" "an expired Idempotency-Key runs the request again"
    assert_eq 1 "$(psql_q "SELECT count(*) FROM tenants WHERE id = '$idem2'")" "…and creates"

    k1=$(admin_curl POST "/admin/tenants/$idem1/api-keys" '' -H 'Idempotency-Key: key-1')
    assert_eq 201 "$(http_status)" "key create with Idempotency-Key → 201"
    k2=$(admin_curl POST "/admin/tenants/$idem1/api-keys" '' -H 'Idempotency-Key: key-1')
    assert_eq "201 $(json_str id "$k1") null" "$(http_status) $(json_str id "$k2") $(json_raw key "$k2")" \
        "key replay: same id, key not shown twice"
    assert_eq 1 "$(psql_q "SELECT count(*) FROM tenant_api_keys WHERE tenant_id = '$idem1'")" \
        "key replay created one key only"
    admin_curl POST "/admin/tenants/$idem2/api-keys" '' -H 'Idempotency-Key: key-1' >/dev/null
    assert_eq "409 0" "$(http_status) $(psql_q "SELECT count(*) FROM tenant_api_keys WHERE tenant_id = '$idem2'")" \
        "the same key for another tenant's api-keys → 409, nothing created"
    admin_curl POST /admin/tenants "{\"id\":\"$(own_id idem3)\"}" \
        -H "Idempotency-Key: $(printf 'k%.0s' $(seq 1 256))" >/dev/null
    assert_eq 400 "$(http_status)" "an Idempotency-Key over 255 characters → 400"
}

# Each keyed request purges expired keys first.  With no index on
# created_at (migration 0022) a purge that found none, the steady state,
# read the whole table: a day of every tenant's keys, per request.
scenario_the_idempotency_purge_reads_an_index() {
    local stats ins0 seq0 seq1 i
    psql_q "INSERT INTO idempotency_keys (scope, key, status, body)
            SELECT 'purge-test', 'k' || g, 201, '{}' FROM generate_series(1, 50000) g" >/dev/null
    psql_q "ANALYZE idempotency_keys" >/dev/null
    stats="SELECT n_tup_ins || ' ' || seq_tup_read FROM pg_stat_user_tables WHERE relname = 'idempotency_keys'"
    sleep 1.2 # the insert's own figures reach the view within a second
    read -r ins0 seq0 <<<"$(psql_q "$stats")"
    for i in 1 2 3; do
        admin_curl POST /admin/tenants "{\"id\":\"$(own_id "purge-$i")\"}" -H "Idempotency-Key: purge-$i" >/dev/null
        assert_eq 201 "$(http_status)" "keyed request $i → 201"
    done
    # the three records are in the figures: the purges before them are too.
    # A backend sends its figures at the end of a transaction at most once a
    # second, else 10 s after it goes idle: a request each poll ends one on
    # the API connections, which sends them
    wait_until 10 "admin_curl GET /admin/tenants >/dev/null; (( \$(psql_q \"$stats\" | cut -d' ' -f1) >= ins0 + 3 ))" ||
        fail "the table's figures did not move"
    read -r _ seq1 <<<"$(psql_q "$stats")"
    log "rows read by sequential scans of idempotency_keys over three keyed requests: $((seq1 - seq0))"
    assert_le $((seq1 - seq0)) 1000 "the purges read an index, not the 50,000 rows"
    psql_q "DELETE FROM idempotency_keys WHERE scope = 'purge-test'" >/dev/null
}

# a policy reload changes no row, but its answer is stored after the fact:
# a retry under the key gets it again (and does not reload)
scenario_a_policy_reload_under_an_idempotency_key_runs_once() {
    local first again name
    name=$(own_id)
    first=$(admin_curl POST /admin/policies/reload '' -H "Idempotency-Key: $name-1")
    assert_eq 200 "$(http_status)" "reload with Idempotency-Key → 200"
    echo 'return {}' >"$WORK/policies/${name//-/_}.lua"
    again=$(admin_curl POST /admin/policies/reload '' -H "Idempotency-Key: $name-1")
    assert_eq "200 true" "$(http_status) $(last_header idempotent-replayed)" "the same key → the stored answer"
    assert_eq "$first" "$again" "byte for byte"
    assert_eq 0 "$(admin_curl GET /admin/policies | grep -c "${name//-/_}")" "and no reload: the new file is not loaded"
    admin_curl POST /admin/policies/reload '' -H "Idempotency-Key: $name-2" >/dev/null
    assert_eq 200 "$(http_status)" "another key reloads"
    assert_eq 1 "$(admin_curl GET /admin/policies | grep -c "${name//-/_}")" "the new file is loaded"
    admin_curl POST /admin/tenants "{\"id\":\"$name\"}" -H "Idempotency-Key: $name-1" >/dev/null
    assert_eq 409 "$(http_status)" "the reload's key on another POST → 409"
    again=$(admin_curl POST /admin/policies/reload '' -H 'Idempotency-Key: two words')
    assert_eq 400 "$(http_status)" "a malformed key → 400"
    assert_contains "$again" '"field":"Idempotency-Key"' "the header is named"
}

# ---------------------------------------------------------------------------
# quarantine (the only scenario of this script that quarantines anything)
# ---------------------------------------------------------------------------

scenario_quarantine_records_are_listed_and_shown() {
    local t body qid got cursor
    t=$(own_id)
    body=$(admin_curl GET /admin/quarantine)
    assert_eq '200 {"items":[],"next_cursor":null}' "$(http_status) $body" "empty quarantine list"
    admin_curl GET /admin/quarantine/1 >/dev/null
    assert_eq 404 "$(http_status)" "absent quarantine record → 404"
    admin_curl GET /admin/quarantine/abc >/dev/null
    assert_eq 404 "$(http_status)" "non-numeric quarantine id → 404"
    body=$(admin_curl GET '/admin/quarantine?tenant=&reason=')
    assert_eq '200 {"items":[],"next_cursor":null}' "$(http_status) $body" \
        "empty filters (?tenant=&reason=, as SPEC §9 writes them) are no filters"
    body=$(admin_curl GET '/admin/quarantine?reason=bogus')
    assert_eq 400 "$(http_status)" "unknown reason filter → 400"
    assert_contains "$body" '"field":"reason"' "reason filter named"

    qid=$(psql_q "INSERT INTO quarantine (reason, field, detail, tenant_id, source, event_id, topic,
                                          kafka_partition, kafka_offset, headers, value)
                  VALUES ('invalid_envelope', 'time', 'not RFC 3339', '$t', '/src', 'e-1',
                          'lerian.streaming.test', 3, 42, '{\"ce-id\":\"e-1\"}',
                          decode(repeat('00ff', 100), 'hex'))
                  RETURNING id")
    psql_q "INSERT INTO quarantine (reason, tenant_id, headers) VALUES ('too_large', '$(own_id other)', '{}')" \
        >/dev/null
    body=$(admin_curl GET "/admin/quarantine/$qid")
    got="$(http_status) $(json_str reason "$body") $(json_str field "$body") $(json_str tenant_id "$body")"
    got+=" $(json_raw partition "$body") $(json_raw offset "$body") $(json_raw value_size "$body")"
    assert_eq "200 invalid_envelope time $t 3 42 200" "$got" \
        "GET /admin/quarantine/{id} → the record"
    assert_contains "$body" '"headers":{"ce-id":"e-1"}' "headers are JSON"
    assert_eq "$(for _ in $(seq 1 100); do printf '\x00\xff'; done | base64 -w0)" \
        "$(json_str value_base64 "$body")" "value_base64 is the raw value, one line"
    body=$(admin_curl GET '/admin/quarantine?limit=1')
    assert_eq "200 too_large" "$(http_status) $(json_str reason "$body")" "list is newest first"
    cursor=$(json_str next_cursor "$body")
    body=$(admin_curl GET "/admin/quarantine?limit=1&cursor=$cursor")
    assert_eq "invalid_envelope null" "$(json_str reason "$body") $(json_raw next_cursor "$body")" \
        "second page holds the older record and ends"
    body=$(admin_curl GET "/admin/quarantine?tenant=$t&reason=invalid_envelope")
    assert_eq "200 e-1" "$(http_status) $(json_str event_id "$body")" "filter by tenant and reason"
    body=$(admin_curl GET '/admin/quarantine?tenant=nobody')
    assert_eq '{"items":[],"next_cursor":null}' "$body" "filter matching nothing"
    admin_curl GET "/admin/tenants?cursor=$cursor" >/dev/null
    assert_eq 400 "$(http_status)" "a quarantine cursor is refused by the tenant list"

    # header evidence over 64 KiB (a Kafka record's headers may be a
    # megabyte) is left out of a list page, as a large value is: 500 of
    # them made a page of hundreds of megabytes
    qid=$(psql_q "INSERT INTO quarantine (reason, tenant_id, headers)
                  VALUES ('invalid_envelope', '$(own_id big)', jsonb_build_array(jsonb_build_object(
                      'name', 'ce-pad', 'value', repeat('a', 200000))))
                  RETURNING id")
    body=$(admin_curl GET "/admin/quarantine?tenant=$(own_id big)")
    assert_eq "200 null" "$(http_status) $(json_raw headers "$body")" "a list item leaves 200 KB of headers out"
    assert_ge "$(json_raw headers_size "$body")" 200000 "… and says how big they are"
    body=$(admin_curl GET "/admin/quarantine/$qid")
    assert_contains "$body" "$(printf 'a%.0s' $(seq 1 1000))" "GET of the record has them whole"
}

# ---------------------------------------------------------------------------
# routing: 404 / 405 everywhere else
# ---------------------------------------------------------------------------

scenario_unknown_routes_are_404_and_wrong_methods_405() {
    local body
    admin_curl GET /admin/nothing-here >/dev/null
    assert_eq "404 $PROBLEM" "$(http_status) $(last_header content-type)" \
        "unknown admin path → 404 problem"
    admin_curl DELETE /admin/tenants >/dev/null
    assert_eq "405 GET, HEAD, POST" "$(http_status) $(last_header allow)" "DELETE /admin/tenants → 405"
    admin_curl POST /admin/quarantine '{}' >/dev/null
    assert_eq "405 GET, HEAD" "$(http_status) $(last_header allow)" "POST /admin/quarantine → 405"
    body=$(hub_curl GET /nothing)
    assert_eq "404 $PROBLEM" "$(http_status) $(last_header content-type)" "unknown path → 404 problem"
    assert_contains "$body" '"type":"urn:streaming-hub:problem:not-found"' "problem type"
    hub_curl GET /v1/subscriptions >/dev/null
    assert_eq 401 "$(http_status)" "/v1 without a tenant key → 401"
}

# ---------------------------------------------------------------------------
# transport: HTTP/1.1 with keep-alive, no h2c
# ---------------------------------------------------------------------------

# h2c was on: h2o 2.2 buffers an HTTP/2 stream's body where the body budget
# does not see it (60 streams of 1 MB held 60 MB, the gauge read 0), so
# the listener speaks HTTP/1.1 only; an upgrade request is served as 1.1
scenario_keep_alive_and_http1_only() {
    local conns out
    conns=$(curl -s -o /dev/null -o /dev/null -w '%{num_connects} ' \
        "$HUB_URL/healthz" "$HUB_URL/healthz")
    assert_eq "1 0 " "$conns" "HTTP/1.1 keep-alive reuses the connection"
    if curl -V | grep -q HTTP2; then
        out=$(curl -s --http2 -w ' %{http_version}' "$HUB_URL/healthz")
        assert_eq '{"status":"ok"} 1.1' "$out" "an h2c upgrade request is answered over HTTP/1.1"
        out=$(curl -s --http2-prior-knowledge -w '%{http_version}' "$HUB_URL/healthz")
        assert_eq 0 "${out:-0}" "HTTP/2 with prior knowledge gets no HTTP/2 answer"
    fi
}

# ---------------------------------------------------------------------------
# requests stuck on the database: a client giving up, then SIGTERM
# ---------------------------------------------------------------------------

# lock_tenants SECONDS: holds an exclusive lock on tenants in the background,
# so admin reads wait on the database meanwhile.
lock_tenants() {
    psql -XAtq "$STREAMING_HUB_POSTGRES_DSN" -c "BEGIN; LOCK TABLE tenants IN ACCESS EXCLUSIVE
        MODE; SELECT pg_sleep($1); COMMIT" >/dev/null 2>&1 &
    track_pid $!
    wait_sql 5 1 "SELECT count(*) FROM pg_locks l JOIN pg_class c
        ON c.oid = l.relation WHERE c.relname = 'tenants' AND l.mode = 'AccessExclusiveLock'
        AND l.granted" || fail "could not lock tenants"
}

# The client hangs up while its request waits: the answer has nowhere to go.
scenario_abandoned_requests_do_not_stop_the_hub() {
    local t gone1
    t=$(own_tenant)
    lock_tenants 3
    curl -s -o /dev/null -w '%{http_code}' --max-time 1 -H "Authorization: Bearer $ADMIN_TOKEN" \
        "$HUB_URL/admin/tenants" >"$WORK/gone1" &
    gone1=$!
    wait "$gone1"
    assert_eq 000 "$(cat "$WORK/gone1")" "a client gave up waiting (HTTP/1.1)"
    wait_until 5 "[[ \$(admin_curl GET /admin/tenants/$t >/dev/null; http_status) == 200 ]]"
    assert_eq 200 "$(http_status)" "the hub serves on after abandoned requests"
}

# A second SIGTERM stops at once, with a request still waiting on the
# database: the exit status says the drain was cut short (it was 0).
scenario_a_second_sigterm_cuts_the_drain_short_and_says_so() {
    local pid=$HUB_PID
    lock_tenants 3
    curl -s -o /dev/null --max-time 10 -H "Authorization: Bearer $ADMIN_TOKEN" \
        "$HUB_URL/admin/tenants" &
    track_pid $!
    sleep 0.3
    kill -TERM "$pid"
    sleep 0.3
    kill -TERM "$pid"
    hub_wait_exit 10 || fail "the hub still runs after a second SIGTERM"
    wait_until 5 "[[ -n \$(hub_exit_status $HUB_START_N) ]]" >/dev/null
    assert_eq 1 "$(hub_exit_status "$HUB_START_N")" "a drain cut short by a second SIGTERM exits 1"
    HUB_PID=
    HUB_RUNNING_ENV=
    hub_state_save
}

# SIGTERM with connections open: one idle, one mid-request, one waiting on
# the database.  The hub must still exit 0, without a sanitizer report (the
# logs are checked at the end), and without dying of SIGPIPE answering a
# closed socket.
scenario_sigterm_with_connections_open_exits_0() {
    local port
    port=${HUB_URL##*:}
    exec 3<>"/dev/tcp/127.0.0.1/$port"
    exec 4<>"/dev/tcp/127.0.0.1/$port"
    printf 'GET /healthz HTTP/1.1\r\nHost: x\r\n' >&4
    lock_tenants 3
    curl -s -o /dev/null --max-time 10 -H "Authorization: Bearer $ADMIN_TOKEN" \
        "$HUB_URL/admin/tenants" &
    track_pid $!
    sleep 0.3
    hub_stop # a failure unless the hub exits 0 within 30 s
    assert_eq 0 "$(hub_exit_status "$HUB_START_N")" "the hub exits 0 on SIGTERM with connections open"
}

scenarios_main "$@"
