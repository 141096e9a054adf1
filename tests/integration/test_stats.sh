#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# Per-tenant figures (SPEC §9, §10; issue 23 item 8):
# GET /v1/stats?since=&until=&group_by=source|event_type and
# GET /admin/tenants/{id}/stats, from hourly rollups the hub keeps as it goes.
#
# Covers: ingest verdicts counted per tenant, source and event type
# (accepted, duplicates, quarantined — the tenant a refused record claims —,
# dropped for an inactive tenant); delivery outcomes (delivered, retried
# attempts, dead, delayed by max_rate, replayed jobs); groups largest first;
# another tenant's counts never shown; the window widened to whole hours;
# bad windows, group_by and unknown tenants answered with problem+json
# naming the field (counted); counts written at a clean stop, never twice;
# the hours past STATS_RETENTION purged; a tenant's sources capped per hour
# ("(other)"); and the answer time for a tenant with 1,000,000 events
# (rollups seeded in SQL) within 50 ms; an event type too long for a
# stats key refused at ingest, other tenants' figures unaffected.
#
# Run one alone: bash tests/integration/test_stats.sh bad_input_is_400_naming_the_field
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"

TOPIC=lerian.streaming.stats
COUNTERS="accepted duplicates quarantined dropped delivered delayed retried dead replayed"

setup() {
    command -v jq >/dev/null || fatal "jq is required by this test"
    pg_start
    kafka_start --topic "$TOPIC:4"
    sink_start
    hub_shared STREAMING_HUB_KEK="$(head -c 32 /dev/urandom | base64 -w0)" \
        STREAMING_HUB_ALLOW_PRIVATE_SINKS=true STREAMING_HUB_STATS_FLUSH_INTERVAL=200ms \
        STREAMING_HUB_BREAKER_CONSECUTIVE_FAILURES=1000 STREAMING_HUB_BREAKER_MIN_ATTEMPTS=1000
}

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

# stats QUERY: GET /v1/stats?QUERY as $KEY; body printed, status kept.
stats() {
    hub_curl GET "/v1/stats${1:+?$1}" "" -H "Authorization: Bearer $KEY"
}

# figures [JSON]: the counters of an answer (default: the last), "name=n ...".
figures() {
    jq -r --arg names "$COUNTERS" '. as $o | [$names | split(" ")[] | "\(.)=\($o[.])"] | join(" ")' \
        <<<"${1-$(last_body)}" 2>/dev/null
}

# group KEY [JSON]: the counters of the group KEY of an answer.
group() {
    local g
    g=$(jq -c --arg k "$1" '.groups[] | select(.key == $k)' <<<"${2-$(last_body)}" 2>/dev/null)
    figures "${g:-{\}}"
}

# wait_stats QUERY JQ_CONDITION [SECONDS]: polls GET /v1/stats?QUERY until
# the condition holds on its answer (default 20 s); 1 on timeout.
wait_stats() {
    local deadline=$((SECONDS + ${3:-20})) n=0
    while :; do
        stats "$1" >/dev/null
        [[ $(jq -r "$2" <<<"$(last_body)" 2>/dev/null) == true ]] && return 0
        ((SECONDS >= deadline)) && return 1
        poll_pause $((n++))
    done
}

# post_event ID SOURCE TYPE [BODY] [CURL ARGS...]: one binary-mode JSON event
# of $TENANT as $KEY; status kept.
post_event() {
    local last=${HUB_HTTP_LAST:-$WORK/last_http}
    curl -s -X POST --max-time 30 -o "${last}_body" -w '%{http_code}' \
        -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
        -H 'ce-specversion: 1.0' -H "ce-id: $1" -H "ce-source: $2" \
        -H "ce-type: studio.lerian.$3" "${@:5}" --data-binary "${4:-{\"n\":1\}}" \
        "$HUB_URL/v1/events" >"${last}_status" 2>/dev/null || echo 000 >"${last}_status"
}

zero() {
    local c out=""
    for c in $COUNTERS; do
        out="$out $c=0"
    done
    echo "${out# }"
}

# counters NAME=N...: the figures line with these counters set, the rest 0.
counters() {
    local line
    line=$(zero)
    for kv in "$@"; do
        line=$(sed -E "s/(^| )${kv%%=*}=[0-9]+/\\1$kv/" <<<"$line")
    done
    echo "$line"
}

# ---------------------------------------------------------------------------
# what is counted
# ---------------------------------------------------------------------------

scenario_ingest_verdicts_are_counted_by_source_and_type() {
    local t now other_key inactive
    own_client
    now=$(now3339)
    for i in 1 2 3; do
        post_event "a-$i" /src/a x.created '{"n":1}' -H "ce-time: $now"
    done
    post_event b-1 /src/b y.updated '{"n":1}' -H "ce-time: $now"
    post_event b-2 /src/b y.updated '{"n":1}' -H "ce-time: $now"
    post_event a-1 /src/a x.created '{"n":1}' -H "ce-time: $now"
    assert_eq 200 "$(http_status)" "a duplicate"
    post_event a-1 /src/a x.created '{"n":2}' -H "ce-time: $now"
    assert_eq 409 "$(http_status)" "a digest conflict (quarantined)"
    post_event bad-1 /src/a x.created '{"n":1}'
    assert_eq 400 "$(http_status)" "an event without ce-time (quarantined, claiming /src/a)"
    produce --topic "$TOPIC" --tenant "$TENANT" --count 4 --id-prefix k- --source /src/k \
        --type studio.lerian.k.made >/dev/null || fail "produce failed"
    inactive=$(own_tenant inactive inactive)
    produce --topic "$TOPIC" --tenant "$inactive" --count 2 --id-prefix i- --source /src/i \
        --type studio.lerian.k.made >/dev/null || fail "produce failed"

    wait_stats "" '.accepted == 9 and .quarantined == 2' ||
        fail "the figures did not reach 9 accepted, 2 quarantined: $(last_body)"
    assert_eq "200|$(counters accepted=9 duplicates=1 quarantined=2)" "$(http_status)|$(figures)" \
        "totals: 9 accepted (5 HTTP, 4 Kafka), 1 duplicate, 2 quarantined"
    assert_eq "$TENANT|[]" "$(jq -r '"\(.tenant)|\(.groups | tojson)"' <<<"$(last_body)")" \
        "the key's tenant; no groups without group_by"

    stats group_by=source >/dev/null
    assert_eq "/src/a /src/k /src/b" "$(jq -r '[.groups[].key] | join(" ")' <<<"$(last_body)")" \
        "by source, largest first"
    assert_eq "$(counters accepted=3 duplicates=1 quarantined=2)" "$(group /src/a)" \
        "/src/a: 3 accepted, the duplicate, the conflict and the invalid event it claims"
    assert_eq "$(counters accepted=4)" "$(group /src/k)" "/src/k: the 4 Kafka events"
    stats group_by=event_type >/dev/null
    assert_eq "$(counters accepted=3 duplicates=1 quarantined=1)" "$(group x.created)" \
        "by event type: x.created"
    assert_eq "$(counters quarantined=1)" "$(group "")" \
        "an event refused before its type was known: key \"\""

    admin_curl GET "/admin/tenants/$TENANT/stats?group_by=source" >/dev/null
    assert_eq "200|$(counters accepted=9 duplicates=1 quarantined=2)|3" \
        "$(http_status)|$(figures)|$(jq '.groups | length' <<<"$(last_body)")" \
        "the admin route answers the same"
    admin_curl GET "/admin/tenants/$inactive/stats" >/dev/null
    wait_until 10 "admin_curl GET /admin/tenants/$inactive/stats | jq -e '.dropped == 2' >/dev/null" ||
        fail "the inactive tenant's records were not counted as dropped: $(last_body)"
    pass "an inactive tenant's records are its dropped"

    other_key=$(own_tenant_key other)
    KEY=$other_key stats >/dev/null
    assert_eq "$(zero)" "$(figures)" "another tenant sees none of it"
}

scenario_delivery_outcomes_are_counted() {
    local ok fail rate t0
    own_client
    ok=$(subscribe_at "$KEY" "/ok/$(own_id)/" d.ok)
    fail=$(subscribe_at "$KEY" "/status/500/$(own_id)/" d.fail ',"retry_schedule":["100ms","100ms"]')
    rate=$(subscribe_at "$KEY" "/ok/$(own_id rate)/" d.rate ',"max_rate":3')
    t0=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)
    produce --topic "$TOPIC" --tenant "$TENANT" --count 3 --id-prefix ok- --type studio.lerian.d.ok \
        --source /src/d >/dev/null
    produce --topic "$TOPIC" --tenant "$TENANT" --count 1 --id-prefix f- --type studio.lerian.d.fail \
        --source /src/d >/dev/null
    produce --topic "$TOPIC" --tenant "$TENANT" --count 6 --id-prefix r- --type studio.lerian.d.rate \
        --source /src/d >/dev/null
    wait_jobs "$ok" succeeded 3 || fail "d.ok not delivered: $(job_states "$ok")"
    wait_job_state "$fail" dead || fail "d.fail not dead: $(job_states "$fail")"
    wait_jobs "$rate" succeeded 6 30 || fail "d.rate not delivered: $(job_states "$rate")"
    hub_curl POST "/v1/subscriptions/$ok/replay" "{\"since\":\"$t0\"}" \
        -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq 202 "$(http_status)" "a replay of the 3 d.ok events"
    wait_stats "group_by=event_type" '.delivered == 12 and .replayed == 3 and .dead == 1 and .accepted == 11' 30 ||
        fail "the delivery figures did not settle: $(last_body)"
    # the dead job's hub.delivery.dead (docs/operational-events.md) is an
    # event of the tenant's stream too, counted under its own type
    assert_eq "200|accepted=11 duplicates=0 quarantined=0 dropped=0 delivered=12" \
        "$(http_status)|$(figures | cut -d' ' -f1-5)" \
        "10 events and the operational one; 12 deliveries (3 + 6, and the 3 replayed)"
    assert_eq "accepted=1" "$(group hub.delivery.dead | cut -d' ' -f1)" \
        "the operational event counted under its own type"
    assert_eq "retried=2 dead=1 replayed=3" "$(figures | cut -d' ' -f7-9)" \
        "the failing job: 2 retries then dead; 3 jobs replayed"
    assert_ge "$(jq -r .delayed <<<"$(last_body)")" 1 "max_rate 3/s put some of 6 off (delayed)"
    assert_eq "accepted=1 duplicates=0 quarantined=0 dropped=0 delivered=0 delayed=0 retried=2 dead=1" \
        "$(group d.fail | cut -d' ' -f1-8)" "by event type: d.fail's attempts and death"
    assert_eq "accepted=3 duplicates=0 quarantined=0 dropped=0 delivered=6" \
        "$(group d.ok | cut -d' ' -f1-5)" "d.ok: delivered twice over (live, then replayed)"
    assert_eq 3 "$(jq -r '.groups[] | select(.key == "") | .replayed' <<<"$(last_body)")" \
        "replayed jobs are counted under the key \"\" (a replay counts jobs, not sources)"
}

# ---------------------------------------------------------------------------
# the window and bad input
# ---------------------------------------------------------------------------

scenario_the_window_is_whole_hours() {
    local h
    own_client
    h=$(($(date +%s) / 3600))
    # each hour in the daily rollup too, as the flush writes them: between
    # 00:00 and 01:00 UTC the default window holds all of yesterday, which
    # the query reads from the daily table
    for k in 1 2 3 4; do
        psql_q "INSERT INTO tenant_stats_hourly (tenant_id, hour, source, event_type, accepted)
                VALUES ('$TENANT', to_timestamp($(((h - k) * 3600))), '/w', 'w.t', $((10 ** k)));
                INSERT INTO tenant_stats_daily AS s (tenant_id, day, source, event_type, accepted)
                VALUES ('$TENANT', (to_timestamp($(((h - k) * 3600))) AT TIME ZONE 'UTC')::date, '/w', 'w.t',
                        $((10 ** k)))
                ON CONFLICT (tenant_id, day, source, event_type)
                DO UPDATE SET accepted = s.accepted + excluded.accepted" >/dev/null
    done
    stats "since=$(date -u -d "@$(((h - 3) * 3600 + 1800))" +%Y-%m-%dT%H:%M:%SZ)&until=$(date -u -d "@$(((h - 1) * 3600 + 600))" +%Y-%m-%dT%H:%M:%S.5Z)" >/dev/null
    assert_eq "200|$(date -u -d "@$(((h - 3) * 3600))" +%Y-%m-%dT%H:00:00Z)|$(date -u -d "@$((h * 3600))" +%Y-%m-%dT%H:00:00Z)|1110" \
        "$(http_status)|$(jq -r '"\(.since)|\(.until)|\(.accepted)"' <<<"$(last_body)")" \
        "since is truncated to its hour, until raised to the next: hours h-3 .. h-1"
    stats "since=$(date -u -d "@$(((h - 4) * 3600))" +%Y-%m-%dT%H:%M:%S%%2B00:00)&until=$(date -u -d "@$(((h - 3) * 3600))" +%Y-%m-%dT%H:%M:%SZ)" >/dev/null
    assert_eq "200|10000" "$(http_status)|$(jq -r .accepted <<<"$(last_body)")" \
        "an until on the hour stays; an offset (+00:00) is read"
    stats >/dev/null
    assert_eq "200|11110" "$(http_status)|$(jq -r .accepted <<<"$(last_body)")" \
        "without a window: the last 24 hours"
}

scenario_bad_input_is_400_naming_the_field() {
    local invalid0 q
    own_client
    invalid0=$(metric 'streaming_hub_api_invalid_requests_total{route="stats"}')
    stats "since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z" >/dev/null
    assert_eq "400|since" "$(http_status)|$(jq -r '[.errors[].field] | join(" ")' <<<"$(last_body)")" \
        "since after until → 400 naming since"
    assert_contains "$(last_header content-type)" application/problem+json "… as problem+json"
    for q in since=yesterday since=2026-13-01T00:00:00Z until=2026-01-01 'until=2026-01-01T00:00:00'; do
        stats "$q" >/dev/null
        assert_eq "400|${q%%=*}" "$(http_status)|$(jq -r '[.errors[].field] | join(" ")' <<<"$(last_body)")" \
            "$q → 400 naming ${q%%=*}"
    done
    for q in group_by=tenant group_by=SOURCE 'group_by=source,event_type'; do
        stats "$q" >/dev/null
        assert_eq "400|group_by" "$(http_status)|$(jq -r '[.errors[].field] | join(" ")' <<<"$(last_body)")" \
            "$q → 400 naming group_by"
    done
    assert_eq 8 "$(metric_delta 'streaming_hub_api_invalid_requests_total{route="stats"}' "$invalid0")" \
        "each refusal counted"
    admin_curl GET /admin/tenants/no-such-tenant/stats >/dev/null
    assert_eq "404|tenant" "$(http_status)|$(jq -r '[.errors[].field] | join(" ")' <<<"$(last_body)")" \
        "admin: an unknown tenant → 404 naming tenant"
    assert_contains "$(last_header content-type)" application/problem+json "… as problem+json"
    admin_curl GET '/admin/tenants/bad%20id/stats' >/dev/null
    assert_eq "404|tenant" "$(http_status)|$(jq -r '[.errors[].field] | join(" ")' <<<"$(last_body)")" \
        "admin: a tenant id that cannot be one → 404 naming tenant"
    admin_curl POST "/admin/tenants/$TENANT/stats" '{}' >/dev/null
    assert_eq "405|GET, HEAD" "$(http_status)|$(last_header allow)" "admin: POST → 405"
    hub_curl GET /v1/stats >/dev/null
    assert_eq 401 "$(http_status)" "no key → 401"
    hub_curl POST /v1/stats '{}' -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq "405|GET, HEAD" "$(http_status)|$(last_header allow)" "POST /v1/stats → 405"
    hub_curl GET /v1/stats/more "" -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq 404 "$(http_status)" "/v1/stats/more → 404"
}

# An event type as long as the attributes allowed (resourcetype.eventtype
# had no bound) was a 202, and its stats key one the database refuses (a
# btree row is at most 2,704 bytes): the flush put the counts back and
# failed again at every turn, so no tenant's figures were written again.
# The derived event type is bounded as a ce-type is; another tenant's
# figures keep coming.
scenario_a_long_event_type_stops_no_figures() {
    local long other_key now
    own_client
    now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    other_key=$(own_tenant_key other)
    long=$(head -c 9000 /dev/urandom | base64 -w0 | tr -d '+/=' | head -c 8000)
    post_event long-1 /long thing.made '{"n":1}' -H "ce-resourcetype: $long" -H 'ce-eventtype: made' \
        -H "ce-time: $now"
    assert_eq 400 "$(http_status)" "an event whose resourcetype.eventtype is 8,005 bytes → 400"
    assert_contains "$(last_body)" "must be at most 256 bytes" "… saying the event type's bound"
    post_event long-2 /long thing.made '{"n":1}' -H "ce-resourcetype: ${long:0:200}" -H "ce-eventtype: ${long:0:55}" \
        -H "ce-time: $now"
    assert_eq 202 "$(http_status)" "one of exactly 256 bytes → 202"
    KEY=$other_key post_event other-1 /other thing.done '{"n":1}' -H "ce-time: $now"
    assert_eq 202 "$(http_status)" "another tenant's event → 202"
    KEY=$other_key wait_stats "" '.accepted == 1' 10 ||
        fail "the other tenant's figures were not written: $(last_body)"
    wait_stats "group_by=event_type" '.accepted == 1' 10 ||
        fail "the 256-byte event type's figures were not written: $(last_body)"
    pass "both tenants' figures are written"
}

# A Kafka record the parser refuses counts for the tenant it claims, which
# nothing checked: 1,200 records claiming 1,200 made-up tenants started
# 1,200 tenants' entries in the table every tenant's counts share (200,000
# entries, then everyone's new counts are lost).  Such claims start at most
# 1,000 tenants an hour; a tenant's own HTTP events (the key's tenant) and
# tenants already counted are not held to it.
scenario_made_up_tenants_do_not_fill_the_figures() {
    local lost0 prefix
    own_client
    prefix="fake-$(own_id)-"
    # the tenant has figures this hour (a valid event from Kafka)
    produce --topic "$TOPIC" --tenant "$TENANT" --count 1 --id-prefix real- >/dev/null ||
        fail "produce failed"
    wait_stats "" '.accepted == 1' 20 || fail "the tenant's valid event was not counted"
    lost0=$(metric streaming_hub_stats_counts_lost_total)
    produce --topic "$TOPIC" --count 1200 --tenants 1200 --tenant-prefix "$prefix" \
        --id-prefix fake- --extra-header ce-specversion=0.3 >/dev/null || fail "produce failed"
    wait_sql 60 1200 "SELECT count(*) FROM quarantine WHERE tenant_id LIKE '$prefix%'" ||
        fail "the 1,200 records were not quarantined"
    wait_until 10 "(( \$(metric_delta streaming_hub_stats_counts_lost_total $lost0) >= 200 ))" ||
        fail "no count was held back: $(metric_delta streaming_hub_stats_counts_lost_total "$lost0")"
    pass "1,200 made-up tenants: at least 200 counts not kept ($(metric_delta streaming_hub_stats_counts_lost_total "$lost0"))"
    # after them: the tenant's own refused records, from Kafka (it has
    # figures already) and over HTTP (the key's tenant), still count
    produce --topic "$TOPIC" --tenant "$TENANT" --count 1 --id-prefix real-bad- \
        --extra-header ce-specversion=0.3 >/dev/null || fail "produce failed"
    post_event bad-time /refused thing.made '{"n":1}' -H 'ce-time: yesterday'
    assert_eq 400 "$(http_status)" "a real tenant's event refused over HTTP → 400"
    wait_stats "" '.quarantined == 2' 20 || fail "its refusals were not counted: $(last_body)"
    pass "… and both its refusals (Kafka, HTTP) counted for it, past the made-up tenants"
}

# 1,200 sources in one hour: a process keeps 1,000 apart, the rest are
# "(other)"; the groups are at most 100, largest first.
scenario_sources_are_capped_per_tenant_and_hour() {
    own_client
    for part in 0 1; do
        jq -cn --arg t "$(now3339)" --argjson p "$part" '[range(600) | {specversion:"1.0",
            id:"cap-\($p)-\(.)", source:"/cap/\($p)/\(.)", type:"studio.lerian.cap.tested",
            time:$t, data:{i:.}}]' >"$WORK/cap.json"
        curl -s -o /dev/null -H "Authorization: Bearer $KEY" \
            -H 'Content-Type: application/cloudevents-batch+json' \
            --data-binary "@$WORK/cap.json" "$HUB_URL/v1/events"
    done
    wait_stats "group_by=source" '.accepted == 1200' || fail "the 1,200 events were not counted"
    assert_eq "100|(other)|200" \
        "$(jq -r '"\(.groups | length)|\(.groups[0].key)|\(.groups[0].accepted)"' <<<"$(last_body)")" \
        "100 groups; the 200 sources past the cap counted together under (other), largest"
    assert_eq 1001 "$(psql_q "SELECT count(*) FROM tenant_stats_hourly WHERE tenant_id = '$TENANT'")" \
        "the rollup holds 1,001 rows for the tenant's hour, not 1,200"
}

# ---------------------------------------------------------------------------
# durability
# ---------------------------------------------------------------------------

hub_env_counts_are_written_at_stop_never_twice() {
    echo STREAMING_HUB_STATS_FLUSH_INTERVAL=60s
}

scenario_counts_are_written_at_stop_never_twice() {
    local i
    own_client
    for i in 1 2 3 4 5; do
        post_event "s-$i" /src/s s.made '{"n":1}' -H "ce-time: $(now3339)"
    done
    assert_eq 0 "$(psql_q "SELECT count(*) FROM tenant_stats_hourly WHERE tenant_id = '$TENANT'")" \
        "with a 60 s flush interval nothing is written yet"
    hub_stop
    assert_eq 5 "$(psql_q "SELECT coalesce(sum(accepted), 0) FROM tenant_stats_hourly WHERE tenant_id = '$TENANT'")" \
        "a clean stop writes the last counts"
    hub_start_shared STREAMING_HUB_STATS_FLUSH_INTERVAL=200ms
    sleep 0.6
    hub_stop
    assert_eq 5 "$(psql_q "SELECT coalesce(sum(accepted), 0) FROM tenant_stats_hourly WHERE tenant_id = '$TENANT'")" \
        "… once: another start and stop add nothing"
}

hub_env_hours_past_the_retention_are_purged() {
    echo STREAMING_HUB_STATS_RETENTION=48h
}

scenario_hours_past_the_retention_are_purged() {
    own_client
    psql_q "INSERT INTO tenant_stats_hourly (tenant_id, hour, source, event_type, accepted) VALUES
            ('$TENANT', date_trunc('hour', now()) - interval '50 hours', '/old', 'o.t', 1),
            ('$TENANT', date_trunc('hour', now()) - interval '40 hours', '/new', 'o.t', 1)" >/dev/null
    hub_stop
    hub_start_shared STREAMING_HUB_STATS_RETENTION=48h
    wait_sql 10 /new "SELECT string_agg(source, ',') FROM tenant_stats_hourly WHERE tenant_id = '$TENANT'" ||
        fail "the purge at start did not drop the 50-hour-old row: $(psql_q "SELECT string_agg(source, ',') FROM tenant_stats_hourly WHERE tenant_id = '$TENANT'")"
    pass "at start, hours older than STATS_RETENTION (48h) are purged, the others kept"
}

# ---------------------------------------------------------------------------
# cost
# ---------------------------------------------------------------------------

# A tenant with 1,080,000 events over 90 days, 20 sources x 5 event types,
# every hour: 216,000 hourly rollup rows and 9,100 daily ones (more keys
# than a real tenant of that volume would have; the answer reads about
# 11,000 of them whatever the volume).  Eleven answers of each kind, median
# and max reported.
scenario_answer_time_for_a_million_events() {
    local q times med max since
    own_client
    psql_q "INSERT INTO tenant_stats_hourly (tenant_id, hour, source, event_type, accepted,
                delivered, retried)
            SELECT '$TENANT', date_trunc('hour', now()) - h * interval '1 hour', '/src/' || s,
                   't' || t || '.made', 5, 4, (h + s + t) % 2
              FROM generate_series(0, 2159) h, generate_series(1, 20) s, generate_series(1, 5) t" >/dev/null
    # the daily rollups the hub's flush writes beside the hourly ones
    psql_q "INSERT INTO tenant_stats_daily
            SELECT tenant_id, (hour AT TIME ZONE 'UTC')::date, source, event_type, sum(accepted),
                   sum(duplicates), sum(quarantined), sum(dropped), sum(delivered), sum(delayed),
                   sum(retried), sum(dead), sum(replayed)
              FROM tenant_stats_hourly WHERE tenant_id = '$TENANT' GROUP BY 1, 2, 3, 4" >/dev/null
    # as autovacuum leaves tables in steady state: without it the first
    # answers set the hint bits of the fresh rows and pay their writes
    psql_q "VACUUM ANALYZE tenant_stats_hourly" >/dev/null
    psql_q "VACUUM ANALYZE tenant_stats_daily" >/dev/null
    since=$(date -u -d '-90 days' +%Y-%m-%dT%H:%M:%SZ)
    stats "since=$since" >/dev/null
    assert_ge "$(jq -r .accepted <<<"$(last_body)")" 1000000 \
        "the tenant has $(jq -r .accepted <<<"$(last_body)") events over 90 days"
    for q in "since=$since" "since=$since&group_by=source" "since=$since&group_by=event_type"; do
        times=$(for _ in $(seq 1 11); do
            curl -s -o /dev/null -w '%{time_total}\n' -H "Authorization: Bearer $KEY" "$HUB_URL/v1/stats?$q"
        done | sort -n)
        med=$(sed -n 6p <<<"$times" | awk '{printf "%d", $1 * 1000}')
        max=$(tail -n1 <<<"$times" | awk '{printf "%d", $1 * 1000}')
        log "GET /v1/stats?$q (1,080,000 events, 216,000 hourly rows): median $med ms, max $max ms"
        assert_le "$med" 50 "answer time (median of 11) ${med} ms ≤ 50 ms for ${q#*&}"
    done
}

scenarios_main "$@"
