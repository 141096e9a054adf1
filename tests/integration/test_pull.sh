#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# The pull API under concurrency and at size (SPEC §9, issues 23 and 24):
#
# - gap-free pages: a page never returns an event while an event with a
#   lower sequence may still commit.  Deterministic: a psql session holds an
#   ingest-like transaction (the pull hold, a lower nextval, its row) open
#   while a higher sequence commits through HTTP ingest; the page leaves the
#   higher one out until the session commits.  The same through the hub's
#   own ingest statement: an HTTP event blocked on a key a session holds
#   keeps a later Kafka event out of the page until it is stored.  An
#   unrelated long transaction (idle in transaction, a long statement)
#   holds nothing back.
#   Stochastic: Kafka ingest over 8 partitions plus 16 HTTP clients while a
#   consumer follows next_cursor: it sees every stored event exactly once,
#   in order;
# - items keep the producer's `sequence` extension; the hub's sequence is
#   `hubsequence`;
# - GET /v1/events/{seq} refuses garbage, overflow and trailing bytes (400
#   naming seq); bad input costs no pull token; 405 Allow lists HEAD;
# - pages are capped in bytes (STREAMING_HUB_PULL_PAGE_BYTES): a page ends
#   before the event that would pass the cap, next_cursor stays exact, a
#   larger event comes alone; attributes count as sent, not as stored
#   compressed;
# - 24 concurrent pulls of limit=500 over 1 MiB events keep the hub's peak
#   RSS (VmHWM) under 512 MiB, every pull 200, and a cursor walk still sees
#   every event once.
#
# The pull hold's key is HUB_PULL_HOLD_KEY of src/store_events.h.
# Run one alone: bash tests/integration/test_pull.sh pull_waits_for_a_lower_sequence
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"

HOLD_KEY=8316025777593609324
HOLD_OBJID=1886743660 # the key's low 32 bits, as pg_locks shows them
TOPIC=lerian.streaming.pull

setup() {
    command -v jq >/dev/null || fatal "jq is required by this test"
    pg_start
    kafka_start --topic "$TOPIC:8"
    hub_shared STREAMING_HUB_PULL_RATE=100000 STREAMING_HUB_PULL_BURST=100000 \
        STREAMING_HUB_PULL_HOLD_MAX=1s
}

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

# pull PATH_AND_QUERY: GET as $KEY; body printed, status kept.
pull() {
    hub_curl GET "$1" "" -H "Authorization: Bearer $KEY"
}

# post_event ID [SOURCE] [CURL ARGS...]: one binary-mode event of $TENANT as
# $KEY (body EV_BODY, default {"n":1}, "@FILE" reads a file; Content-Type
# EV_CT, default application/json); prints the answer.
post_event() {
    local id=$1 source=${2:-/pull/test} last=${HUB_HTTP_LAST:-$WORK/last_http}
    shift $(($# < 2 ? $# : 2))
    curl -s -X POST --max-time 60 -o "${last}_body" -w '%{http_code}' \
        -H "Authorization: Bearer $KEY" -H "Content-Type: ${EV_CT:-application/json}" \
        -H 'ce-specversion: 1.0' -H "ce-id: $id" -H "ce-source: $source" \
        -H 'ce-type: studio.lerian.pull.tested' -H "ce-time: $(now3339)" "$@" \
        --data-binary "${EV_BODY:-{\"n\":1\}}" "$HUB_URL/v1/events" >"${last}_status" 2>/dev/null ||
        echo 000 >"${last}_status"
    cat "${last}_body"
}

# fields: the "field" members of the last answer's errors[], sorted.
fields() {
    last_body | jq -r '[.errors[]?.field] | sort | join(" ")' 2>/dev/null
}

# ids_after SEQ: the ids of the last page's items.
page_ids() {
    last_body | jq -r '[.items[].id] | join(" ")' 2>/dev/null
}

# walk AFTER LIMIT: follows next_cursor from AFTER until it is null; prints
# "<hubsequence> <id>" per item; fails on a status other than 200.
walk() {
    local after=$1 limit=$2 page n=0
    while ((n++ < 10000)); do
        page=$(pull "/v1/events?after=$after&limit=$limit")
        [[ $(http_status) == 200 ]] || {
            fail "walk: page after=$after answered $(http_status)"
            return 1
        }
        jq -r '.items[] | "\(.hubsequence) \(.id)"' <<<"$page"
        after=$(jq -r '.next_cursor // empty' <<<"$page")
        [[ -n $after ]] || return 0
    done
}

# ---------------------------------------------------------------------------
# gap-free pages
# ---------------------------------------------------------------------------

# An ingest transaction still open with a lower sequence holds the page
# below it: the higher, committed event shows only once the lower one did.
scenario_pull_waits_for_a_lower_sequence_still_in_flight() {
    local seq0 held after t0 ms timeouts0
    own_client
    post_event before >/dev/null
    assert_eq 202 "$(http_status)" "an event before"
    seq0=$(last_body | jq -r .sequence)
    held_session_start held "BEGIN;" "SELECT pg_advisory_xact_lock_shared($HOLD_KEY);" \
        "INSERT INTO event_inbox (seq, day, tenant_id, source, event_id, ce_type, event_type,
             schema_major, event_time, content_type, headers, payload, digest)
         VALUES (nextval('event_seq'), (now() AT TIME ZONE 'UTC')::date, '$TENANT', '/pull/held',
             'held', 'studio.lerian.pull.tested', 'pull.tested', 1, now(), 'application/json',
             '{\"id\":\"held\",\"source\":\"/pull/held\"}', '{}', '\\x00') RETURNING seq;"
    wait_until 10 "grep -qE '^[0-9]+$' '$WORK/held.out'" || fatal "the held session did not insert"
    held=$(grep -E '^[0-9]+$' "$WORK/held.out" | head -n1)
    post_event after >/dev/null
    assert_eq 202 "$(http_status)" "a higher sequence commits through HTTP ingest meanwhile"
    after=$(last_body | jq -r .sequence)
    assert_ge "$after" "$((held + 1))" "… above the held one ($held < $after)"

    timeouts0=$(metric streaming_hub_pull_holdback_timeouts_total)
    t0=$(date +%s%3N)
    pull "/v1/events?after=$seq0" >/dev/null
    ms=$(($(date +%s%3N) - t0))
    assert_eq "200|" "$(http_status)|$(page_ids)" \
        "while the lower sequence may still commit, the page does not show the higher one"
    assert_le "$ms" 3000 "… answered within PULL_HOLD_MAX (1 s) and a margin (${ms} ms)"
    assert_ge "$(metric_delta streaming_hub_pull_holdback_timeouts_total "$timeouts0")" 1 \
        "… counted as a pull answered below a held horizon"
    pull "/v1/events/$after" >/dev/null
    assert_eq 200 "$(http_status)" "the committed event itself is readable by sequence"

    echo "COMMIT;" >&"$HELD_FD"
    exec {HELD_FD}>&-
    wait_until 10 "[[ \$(psql_q \"SELECT count(*) FROM event_inbox WHERE event_id = 'held'\") == 1 ]]" ||
        fail "the held session did not commit"
    pull "/v1/events?after=$seq0" >/dev/null
    assert_eq "200|held after" "$(http_status)|$(page_ids)" \
        "once it committed, the page shows both, in sequence order"
    assert_eq "$held $after" "$(last_body | jq -r '[.items[].hubsequence] | join(" ")')" \
        "… with their sequences"
}

# The same through the hub's own ingest statement: an HTTP event whose key a
# psql session holds uncommitted waits on it inside the hub's transaction,
# after that transaction took the hold and its sequence.  A Kafka event
# committed meanwhile has a higher sequence: the page leaves it out until the
# HTTP event's transaction ends (fails if the statement stopped taking the
# hold before its nextval).
scenario_ingest_statement_holds_pulls_below_its_sequence() {
    local seq0 blocked page
    own_client
    post_event before >/dev/null
    seq0=$(last_body | jq -r .sequence)
    held_session_start key "BEGIN;" \
        "INSERT INTO event_inbox (seq, day, tenant_id, source, event_id, ce_type, event_type,
             schema_major, event_time, content_type, headers, payload, digest)
         VALUES (nextval('event_seq'), (now() AT TIME ZONE 'UTC')::date, '$TENANT', '/pull/test',
             'blocked', 'studio.lerian.pull.tested', 'pull.tested', 1, now(), 'application/json',
             '{\"id\":\"blocked\",\"source\":\"/pull/test\"}', '{}', '\\x00') RETURNING seq;"
    wait_until 10 "grep -qE '^[0-9]+$' '$WORK/key.out'" || fatal "the session did not insert"
    HUB_HTTP_LAST=$WORK/blocked post_event blocked >/dev/null &
    blocked=$!
    track_pid "$blocked"
    wait_until 10 "[[ \$(psql_q \"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = $HOLD_OBJID AND granted\") -ge 1 ]]" ||
        fail "the hub's ingest transaction did not take the hold"
    produce --topic "$TOPIC" --tenant "$TENANT" --count 1 --id-prefix kafka- --source /pull/kafka >/dev/null ||
        fatal "produce failed"
    wait_sql 20 1 "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'kafka-0'" ||
        fatal "the Kafka event was not stored"
    assert_eq 1 "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'WITH b AS%'")" \
        "the hub's HTTP event waits in its ingest statement on the session's key"
    page=$(pull "/v1/events?after=$seq0")
    assert_eq "200|" "$(http_status)|$(jq -r '[.items[].id] | join(" ")' <<<"$page")" \
        "the committed Kafka event (a higher sequence) is not shown while the HTTP one may commit"
    echo "ROLLBACK;" >&"$HELD_FD"
    exec {HELD_FD}>&-
    wait "$blocked"
    assert_eq 202 "$(cat "$WORK/blocked_status")" "once the session rolled back, the HTTP event is stored"
    pull "/v1/events?after=$seq0" >/dev/null
    assert_eq "200|blocked kafka-0" "$(http_status)|$(page_ids)" \
        "then the page shows both, the HTTP event's lower sequence first"
}

# A lower sequence that rolls back frees the page the same way.
scenario_pull_passes_a_lower_sequence_rolled_back() {
    local seq0
    own_client
    post_event before >/dev/null
    seq0=$(last_body | jq -r .sequence)
    held_session_start rb "BEGIN;" "SELECT pg_advisory_xact_lock_shared($HOLD_KEY);" \
        "SELECT nextval('event_seq');"
    wait_until 10 "grep -qE '^[0-9]+$' '$WORK/rb.out'" || fatal "the session took no sequence"
    post_event after >/dev/null
    pull "/v1/events?after=$seq0" >/dev/null
    assert_eq "200|" "$(http_status)|$(page_ids)" "held: the page stops below the open transaction"
    echo "ROLLBACK;" >&"$HELD_FD"
    exec {HELD_FD}>&-
    sleep 0.3
    pull "/v1/events?after=$seq0" >/dev/null
    assert_eq "200|after" "$(http_status)|$(page_ids)" \
        "rolled back: the page goes on past its sequence"
}

# Only ingest transactions hold pulls back: an idle transaction holding an
# xid and a snapshot, and a long statement, do not.
scenario_unrelated_long_transactions_hold_nothing_back() {
    local seq0 t0 ms
    own_client
    post_event before >/dev/null
    seq0=$(last_body | jq -r .sequence)
    held_session_start idle "BEGIN ISOLATION LEVEL REPEATABLE READ;" "SELECT txid_current();" \
        "SELECT count(*) FROM event_inbox;"
    local idle_fd=$HELD_FD
    held_session_start busy "SELECT pg_sleep(30);"
    local busy_fd=$HELD_FD
    wait_until 10 "[[ \$(psql_q \"SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'\") -ge 1 ]]" ||
        fail "no idle transaction"
    post_event after >/dev/null
    t0=$(date +%s%3N)
    pull "/v1/events?after=$seq0" >/dev/null
    ms=$(($(date +%s%3N) - t0))
    assert_eq "200|after" "$(http_status)|$(page_ids)" \
        "with a transaction idle and a statement running, the page shows the new event"
    assert_le "$ms" 500 "… at once (${ms} ms; PULL_HOLD_MAX is 1 s)"
    echo "ROLLBACK;" >&"$idle_fd"
    exec {idle_fd}>&- {busy_fd}>&-
    psql_q "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(30)%'" >/dev/null
}

# Kafka over 8 partitions (about 600 records/s for 10 s) and 16 HTTP clients
# (rounds of 300 events for 10 s) store events while a consumer follows
# next_cursor at the tail (limit 37, so that pages end anywhere): it sees
# every stored event exactly once, in order.
scenario_follower_sees_every_event_once_in_order() {
    local kafka=6000 rounds=10 per_round=300 total seen dup order r bad=0
    own_client
    cat >"$WORK/follow_headers" <<H
Authorization: Bearer $KEY
Content-Type: application/json
ce-specversion: 1.0
ce-source: /pull/http
ce-type: studio.lerian.pull.tested
ce-time: 2026-01-01T00:00:00Z
H
    : >"$WORK/follow.seen"
    local t0=$SECONDS
    (
        after=0 idle=0 pulls=0 deadline=$((SECONDS + 240))
        # one jq per page: the items, then "next <cursor> <count> <last>"
        while ((idle < 20 && SECONDS < deadline)); do
            curl -s --max-time 30 -H "Authorization: Bearer $KEY" \
                "$HUB_URL/v1/events?after=$after&limit=37" |
                jq -r '(.items[] | "\(.hubsequence) \(.id)"),
                       "next \(.next_cursor // "-") \(.items | length) \(.items[-1].hubsequence // "-")"' \
                    >"$WORK/follow.page" 2>/dev/null || continue
            pulls=$((pulls + 1))
            grep -v '^next ' "$WORK/follow.page" >>"$WORK/follow.seen"
            read -r _ next n last < <(grep '^next ' "$WORK/follow.page")
            if [[ $next != - ]]; then
                after=$next
            elif [[ $last != - ]]; then
                after=$last
            fi
            # once every event is stored, a run of empty pages ends it
            if [[ -f $WORK/follow.done && $n == 0 ]]; then
                idle=$((idle + 1))
                sleep 0.05
            fi
        done
        echo "$pulls" >"$WORK/follow.pulls"
    ) &
    local follower=$!
    track_pid "$follower"
    produce --topic "$TOPIC" --tenant "$TENANT" --count "$kafka" --partitions 8 --rate 600 \
        --id-prefix "k-" --source /pull/kafka >"$WORK/follow.produce" 2>&1 &
    local producer=$!
    track_pid "$producer"
    for r in $(seq 1 "$rounds"); do
        # RAW_POST_SEQ_HEADER ids are <pid>-<n>: each round its own
        RAW_POST_HEADERS=$WORK/follow_headers RAW_POST_SEQ_HEADER=ce-id \
            "$BUILD/bench-raw-post" "$HUB_URL/v1/events" "$per_round" 16 64 \
            >>"$WORK/follow.post" 2>&1 || bad=$((bad + 1))
        sleep 0.7
    done
    assert_eq 0 "$bad" "16 HTTP clients: every one of $((rounds * per_round)) events answered 2xx"
    wait "$producer"
    assert_eq 0 "$?" "the producer's $kafka records were acknowledged"
    wait_sql 60 "$((kafka + rounds * per_round))" \
        "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT'" ||
        fail "not every event was stored"
    touch "$WORK/follow.done"
    wait "$follower"
    total=$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT'")
    seen=$(wc -l <"$WORK/follow.seen")
    dup=$(awk '{print $1}' "$WORK/follow.seen" | sort | uniq -d | wc -l)
    order=$(awk 'NR > 1 && $1 <= prev { bad++ } { prev = $1 } END { print bad + 0 }' "$WORK/follow.seen")
    assert_eq "$total" "$seen" "the follower saw $seen items for $total stored events"
    assert_eq 0 "$dup" "… none twice"
    assert_eq 0 "$order" "… in increasing sequence order"
    psql_q "SELECT seq FROM event_inbox WHERE tenant_id = '$TENANT' ORDER BY seq" >"$WORK/follow.want"
    assert_eq "" "$(awk '{print $1}' "$WORK/follow.seen" | sort -n | comm -3 "$WORK/follow.want" - |
        head -n 20 | paste -sd ' ')" "… exactly the stored sequences (none missing, none extra)"
    # what the poller's own backend cost PostgreSQL over the hub's life
    local poller ticks
    poller=$(psql_q "SELECT pid FROM pg_stat_activity WHERE application_name = 'streaming-hub-pull'")
    ticks=$(awk '{print $14 + $15}' "/proc/$poller/stat" 2>/dev/null)
    log "follower: $seen events in $(cat "$WORK/follow.pulls") pulls over $((SECONDS - t0)) s;" \
        "holdback $(metric streaming_hub_pull_holdback_seconds_sum) s over" \
        "$(metric streaming_hub_pull_holdback_seconds_count) waits; the poller's backend" \
        "used ${ticks:-?} ticks of CPU ($(getconf CLK_TCK)/s)"
}

# ---------------------------------------------------------------------------
# the items and the routes
# ---------------------------------------------------------------------------

scenario_producer_sequence_extension_is_kept() {
    local seq it
    own_client
    post_event ext-1 /pull/ext -H 'ce-sequence: producer-7' -H 'ce-hubsequence: 5' >/dev/null
    assert_eq 202 "$(http_status)" "an event with a sequence extension"
    seq=$(last_body | jq -r .sequence)
    it=$(pull "/v1/events/$seq")
    assert_eq "producer-7|$seq|number" "$(jq -r '"\(.sequence)|\(.hubsequence)|\(.hubsequence | type)"' <<<"$it")" \
        "the producer's sequence is kept; the hub's is hubsequence"
    it=$(pull "/v1/events?after=$((seq - 1))&limit=1")
    assert_eq "producer-7|$seq" "$(jq -r '.items[0] | "\(.sequence)|\(.hubsequence)"' <<<"$it")" \
        "… in a list too (a producer's hubsequence is the hub's name: replaced)"
}

scenario_seq_path_must_be_a_sequence() {
    local s invalid0
    own_client
    invalid0=$(metric 'streaming_hub_api_invalid_requests_total{route="pull"}')
    for s in abc 12abc 1.5 -1 +1 '%201' 9223372036854775808 99999999999999999999999; do
        pull "/v1/events/$s" >/dev/null
        assert_eq "400|seq" "$(http_status)|$(fields)" "/v1/events/$s → 400 naming seq"
    done
    pull "/v1/events/9223372036854775807" >/dev/null
    assert_eq 404 "$(http_status)" "the largest int8 is a sequence: 404, not found"
    assert_eq 8 "$(metric_delta 'streaming_hub_api_invalid_requests_total{route="pull"}' "$invalid0")" \
        "each refusal counted"
    hub_curl GET "/v1/events/abc" >/dev/null
    assert_eq 401 "$(http_status)" "without a key: 401 first"
}

scenario_allow_lists_head() {
    own_client
    hub_curl DELETE /v1/events "" -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq "405|GET, HEAD, POST" "$(http_status)|$(last_header allow)" "/v1/events: Allow lists HEAD"
    hub_curl PUT /v1/events/1 "" -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq "405|GET, HEAD" "$(http_status)|$(last_header allow)" "/v1/events/{seq}: Allow lists HEAD"
    hub_curl HEAD /v1/events "" -I -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq "200|application/json" "$(http_status)|$(last_header content-type)" "HEAD /v1/events → 200"
    hub_curl GET /v1/events/1/more "" -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq 404 "$(http_status)" "/v1/events/1/more → 404"
}

hub_env_bad_input_costs_no_pull_token() {
    echo STREAMING_HUB_PULL_RATE=1 STREAMING_HUB_PULL_BURST=2
}

scenario_bad_input_costs_no_pull_token() {
    local codes=""
    own_client
    # type=%FF is not UTF-8: PostgreSQL would refuse it (it was a 500, found
    # in review)
    for q in 'limit=0' 'after=x' 'limit=501' 'after=-1' 'type=%FF'; do
        pull "/v1/events?$q" >/dev/null
        codes="$codes $(http_status)"
    done
    pull "/v1/events/abc" >/dev/null
    codes="$codes $(http_status)"
    assert_eq " 400 400 400 400 400 400" "$codes" "bad requests are 400 (validated before the bucket)"
    codes=""
    for _ in 1 2 3; do
        pull "/v1/events?limit=1" >/dev/null
        codes="$codes $(http_status)"
    done
    assert_eq " 200 200 429" "$codes" "the burst of 2 is intact after them"
}

# ---------------------------------------------------------------------------
# bytes
# ---------------------------------------------------------------------------

hub_env_pages_are_capped_in_bytes() {
    echo STREAMING_HUB_PULL_PAGE_BYTES=64KiB STREAMING_HUB_PULL_RATE=100000 \
        STREAMING_HUB_PULL_BURST=100000
}

# 20 KiB events: three fit in a 64 KiB page; a 100 KiB one comes alone.
scenario_pages_are_capped_in_bytes() {
    local i body sizes want got capped0
    own_client
    { printf '"'; head -c 20000 /dev/zero | tr '\0' 'a'; printf '"'; } >"$WORK/cap.json"
    { printf '"'; head -c 100000 /dev/zero | tr '\0' 'b'; printf '"'; } >"$WORK/cap-big.json"
    for i in 1 2 3 4 5 6 7; do
        EV_BODY=@$WORK/cap.json post_event "cap-$i" /pull/cap >/dev/null
    done
    EV_BODY=@$WORK/cap-big.json post_event cap-big /pull/cap >/dev/null
    for i in 8 9; do
        EV_BODY=@$WORK/cap.json post_event "cap-$i" /pull/cap >/dev/null
    done
    assert_eq 202 "$(http_status)" "ten events of 20 KiB and one of 100 KiB stored"
    want=$(psql_q "SELECT string_agg(event_id, ' ' ORDER BY seq) FROM event_inbox WHERE tenant_id = '$TENANT'")
    capped0=$(metric streaming_hub_pull_pages_byte_capped_total)
    pull "/v1/events?limit=500" >/dev/null
    assert_eq "200|cap-1 cap-2 cap-3" "$(http_status)|$(page_ids)" \
        "a page ends before the event that would pass 64 KiB"
    assert_eq "$(last_body | jq -r '.items[-1].hubsequence | tostring')" "$(last_body | jq -r .next_cursor)" \
        "… and its next_cursor is its last sequence"
    sizes=""
    after=0
    got=""
    while :; do
        pull "/v1/events?after=$after&limit=500" >/dev/null
        [[ $(http_status) == 200 ]] || break
        sizes="$sizes $(last_body | jq '.items | length')"
        got="$got $(page_ids)"
        after=$(last_body | jq -r '.next_cursor // empty')
        [[ -n $after ]] || break
    done
    assert_eq " 3 3 1 1 2" "$sizes" "pages of 3, 3, the 100 KiB event alone, then the rest"
    assert_eq "$want" "$(tr -s ' ' <<<"$got" | sed 's/^ //')" "the walk sees every event once, in order"
    assert_ge "$(metric_delta streaming_hub_pull_pages_byte_capped_total "$capped0")" 3 \
        "pages ended by the cap are counted"
}

hub_env_a_page_counts_attributes_as_they_go_out() {
    hub_env_pages_are_capped_in_bytes
}

# Events with a 30 KB extension attribute of one repeated letter: PostgreSQL
# stores each event's attributes compressed to a few hundred bytes, and the
# cap counted that, so all six went out in one 64 KiB page (~180 KB; found in
# review).  The cap counts the attributes as the text that goes out: two
# events a page.
scenario_a_page_counts_attributes_as_they_go_out() {
    local i code sizes after
    own_client
    for i in 1 2 3 4 5 6; do
        {
            printf '{"specversion":"1.0","id":"att-%s","source":"/pull/att","type":"studio.lerian.pull.tested","time":"%s","bigext":"' \
                "$i" "$(now3339)"
            head -c 30000 /dev/zero | tr '\0' 'c'
            printf '","datacontenttype":"application/json","data":{"n":%s}}' "$i"
        } >"$WORK/att.json"
        code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $KEY" \
            -H 'Content-Type: application/cloudevents+json' --data-binary @"$WORK/att.json" \
            "$HUB_URL/v1/events")
        [[ $code == 2* ]] || fail "event att-$i: status $code"
    done
    assert_eq 6 "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT'
                             AND pg_column_size(headers) < 4000 AND octet_length(headers::text) > 30000")" \
        "six events stored with 30 KB of attributes, compressed"
    sizes=""
    after=0
    while :; do
        pull "/v1/events?after=$after&limit=500" >/dev/null
        [[ $(http_status) == 200 ]] || break
        sizes="$sizes $(last_body | jq '.items | length')"
        after=$(last_body | jq -r '.next_cursor // empty')
        [[ -n $after ]] || break
    done
    assert_eq " 2 2 2" "$sizes" "pages of two events of 30 KB attributes under a 64 KiB cap"
}

# Pages a client does not read stay in memory until it does (an 8 MiB page
# fills the socket's buffers and waits): at the pull rate a tenant could pin
# gigabytes.  A tenant's pages not yet read are bounded to 32 pages' worth
# (256 MiB): past that its pulls are 429, another tenant's are not, and once
# the clients go the tenant pulls again.
scenario_pages_not_read_are_bounded_per_tenant() {
    local i wave fds=() other_key code
    own_client
    { printf '"'; head -c 1048574 /dev/zero | tr '\0' 'k'; printf '"'; } >"$WORK/held.json"
    for i in $(seq 1 9); do
        EV_BODY=@$WORK/held.json post_event "held-$i" /pull/held >/dev/null
        [[ $(http_status) == 202 ]] || fail "event held-$i: $(http_status)"
    done
    # forty pages of ~7 MiB (seven events each) are over the 256 MiB.  A
    # tenant's transactions take turns (api_util.h), 32 waiting at most:
    # sent in two waves of twenty, the second once the first has read its
    # pages, none is refused for waiting
    for wave in 1 2; do
        for i in $(seq 1 20); do
            exec {fd}<>"/dev/tcp/127.0.0.1/${HUB_URL##*:}"
            fds+=("$fd")
            printf 'GET /v1/events?after=0&limit=500 HTTP/1.1\r\nHost: hub\r\nAuthorization: Bearer %s\r\n\r\n' \
                "$KEY" >&"$fd"
        done
        sleep 0.5
        wait_until 60 "[[ \$(metric streaming_hub_api_tenant_waiting) == 0 ]]" ||
            fail "wave $wave of the pulls still waits for its turns"
    done
    wait_until 30 "[[ \$(pull '/v1/events?after=0&limit=1' >/dev/null; http_status) == 429 ]]"
    assert_eq 429 "$(http_status)" "with 40 pages of ~7 MiB unread, the tenant's next pull → 429"
    assert_contains "$(last_body)" "pages not yet read" "… refused for the pages not read, not for waiting turns"
    assert_match "$(last_header retry-after)" '^[0-9]+$' "… with Retry-After"
    other_key=$(own_tenant_key other)
    code=$(KEY=$other_key pull "/v1/events?limit=1" >/dev/null; http_status)
    assert_eq 200 "$code" "another tenant's pull meanwhile → 200"
    for fd in "${fds[@]}"; do
        exec {fd}>&-
    done
    wait_until 10 "[[ \$(pull '/v1/events?after=0&limit=1' >/dev/null; http_status) == 200 ]]" ||
        fail "the tenant's pulls stayed refused once its clients were gone"
    pass "once the clients went, the tenant pulls again"
}

hub_env_concurrent_big_pulls_keep_memory_bounded() {
    echo STREAMING_HUB_PULL_PAGE_BYTES=8MiB STREAMING_HUB_PULL_RATE=100000 \
        STREAMING_HUB_PULL_BURST=100000
}

# 24 pulls of limit=500 at once over 64 events of 1 MiB (half JSON, half
# binary, so half the bytes go out as base64): peak RSS < 512 MiB.
scenario_concurrent_big_pulls_keep_memory_bounded() {
    local i pids=() bad=0 rss0 hwm want got n
    own_client
    head -c 1048576 /dev/urandom >"$WORK/big.bin"
    { printf '"'; head -c 1048574 /dev/zero | tr '\0' 'j'; printf '"'; } >"$WORK/big.json"
    # stored eight at a time (the order of their sequences does not matter:
    # the walk below compares with the stored order)
    for i in $(seq 1 64); do
        if ((i % 2)); then
            HUB_HTTP_LAST=$WORK/bigpost.$i EV_BODY=@$WORK/big.json \
                post_event "big-$i" /pull/big >/dev/null &
        else
            HUB_HTTP_LAST=$WORK/bigpost.$i EV_BODY=@$WORK/big.bin EV_CT=application/octet-stream \
                post_event "big-$i" /pull/big >/dev/null &
        fi
        ((i % 8)) || wait
    done
    wait
    for i in $(seq 1 64); do
        [[ $(cat "$WORK/bigpost.${i}_status") == 202 ]] || bad=$((bad + 1))
    done
    assert_eq 0 "$bad" "64 events of 1 MiB stored"
    rss0=$(awk '/^VmRSS/ {print $2}' "/proc/$HUB_PID/status")
    echo 5 >"/proc/$HUB_PID/clear_refs" 2>/dev/null # the peak from here on
    for i in $(seq 1 24); do
        curl -s --max-time 120 -o "$WORK/bigpull.$i" -w '%{http_code}' \
            -H "Authorization: Bearer $KEY" "$HUB_URL/v1/events?after=0&limit=500" \
            >"$WORK/bigpull.$i.status" &
        pids+=($!)
    done
    # another tenant meanwhile: its event stored, its pull answered
    local other_key other_ms t0
    other_key=$(own_tenant_key other)
    t0=$(date +%s%3N)
    KEY=$other_key post_event other-1 /pull/other >/dev/null
    local other_post
    other_post=$(http_status)
    KEY=$other_key pull "/v1/events?limit=10" >/dev/null
    other_ms=$(($(date +%s%3N) - t0))
    assert_eq "202|200|other-1" "$other_post|$(http_status)|$(page_ids)" \
        "another tenant, during the 24 big pulls: its event stored and pulled"
    for i in "${pids[@]}"; do
        wait "$i"
    done
    hwm=$(awk '/^VmHWM/ {print $2}' "/proc/$HUB_PID/status")
    log "the other tenant's post and pull took ${other_ms} ms during the big pulls"
    assert_le "$other_ms" 5000 "… within 5 s (${other_ms} ms; the big pulls take longer)"
    bad=0
    for i in $(seq 1 24); do
        [[ $(cat "$WORK/bigpull.$i.status") == 200 ]] || bad=$((bad + 1))
    done
    assert_eq 0 "$bad" "all 24 concurrent pulls answered 200"
    n=$(jq '.items | length' "$WORK/bigpull.1")
    assert_ge "$n" 1 "each page holds what fits in 8 MiB ($n events)"
    assert_le "$n" 8 "… not 500"
    log "24 concurrent pulls of limit=500 over 1 MiB events: VmRSS before ${rss0} kB, VmHWM $hwm kB"
    assert_le "$hwm" $((512 * 1024)) "the hub's peak RSS stayed under 512 MiB ($((hwm / 1024)) MiB)"
    want=$(psql_q "SELECT string_agg(seq || ' ' || event_id, ',' ORDER BY seq) FROM event_inbox WHERE tenant_id = '$TENANT'")
    got=$(walk 0 500 | paste -sd ',')
    assert_eq "$want" "$got" "a cursor walk sees every 1 MiB event once, in order"
}

scenarios_main "$@"
