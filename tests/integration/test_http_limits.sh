#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# What one client may take of the HTTP listener (issue 24 item 5; SPEC §11:
# bad input never stalls other tenants).  Each limit is tested for the
# client that meets it and for another tenant, who must not notice:
#
#   - a request whose Content-Length passes the largest body is answered
#     413 (problem+json) before its body is read: counted, not quarantined;
#   - the bytes of request bodies held at once are capped
#     (STREAMING_HUB_HTTP_BODY_BYTES): one tenant's concurrent large bodies
#     beyond the cap are answered 503 with Retry-After before they are
#     read, while another tenant's small events still get in;
#   - HTTP ingest requests in progress are bounded
#     (STREAMING_HUB_INGEST_HTTP_QUEUE), one API key to half of them: over
#     either, 503 with Retry-After, nothing stored, counted, logged once;
#     another tenant's requests are still admitted and stored;
#   - connections are capped (STREAMING_HUB_HTTP_MAX_CONNECTIONS): at the
#     cap the listener stops accepting, so a new connection waits in the
#     backlog (its client sees no answer yet, never a reset) until one
#     closes; established connections of another tenant keep working.
#
# No `set -e`: every check below is an explicit assertion.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/ingest_http.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/ingest_http.sh"

REFUSED='streaming_hub_http_refused_total'

setup() {
    command -v jq >/dev/null || fatal "jq is required by this test"
    pg_start
    kafka_start --topic lerian.streaming.limits:1
    hub_shared
}

hub_port() {
    echo "${HUB_URL##*:}"
}

# raw_open: a connection of our own to the hub; sets RAW_FD.
raw_open() {
    exec {RAW_FD}<>"/dev/tcp/127.0.0.1/$(hub_port)"
}

# raw_request FD METHOD PATH [HEADER...]: one HTTP/1.1 request without a
# body on the connection FD; prints the answer's status code (000 when
# none came within 5 s) and keeps the connection for the next one.
raw_request() {
    local fd=$1 method=$2 path=$3 line status len=0
    shift 3
    {
        printf '%s %s HTTP/1.1\r\nHost: hub\r\n' "$method" "$path"
        for line in "$@"; do
            printf '%s\r\n' "$line"
        done
        printf '\r\n'
    } >&"$fd"
    IFS= read -r -t 5 status <&"$fd" || {
        echo 000
        return
    }
    while IFS= read -r -t 5 line <&"$fd"; do
        line=${line%$'\r'}
        [[ -z $line ]] && break
        if [[ ${line,,} == content-length:* ]]; then
            len=${line#*:}
            len=${len// /}
        fi
    done
    ((len > 0)) && IFS= read -r -N "$len" -t 5 _ <&"$fd"
    status=${status#HTTP/1.1 }
    echo "${status%% *}"
}

# ---------------------------------------------------------------------------
# 413 before the body
# ---------------------------------------------------------------------------

scenario_content_length_over_the_limit_is_413_before_the_body() {
    local q0 r0 answer other_key t0
    own_client
    other_key=$(own_tenant_key other)
    q0=$(psql_q "SELECT count(*) FROM quarantine")
    r0=$(metric "$REFUSED{reason=\"too_large\"}")
    raw_open
    t0=$(date +%s%3N)
    # the head announces 100 MB; not one byte of the body is sent
    printf 'POST /v1/events HTTP/1.1\r\nHost: hub\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nce-specversion: 1.0\r\nce-id: big-1\r\nce-source: /limits\r\nce-type: studio.lerian.account.created\r\nce-time: %s\r\nContent-Length: 104857600\r\n\r\n' \
        "$KEY" "$(now3339)" >&"$RAW_FD"
    answer=$(timeout 5 cat <&"$RAW_FD" | tr -d '\r')
    exec {RAW_FD}>&-
    assert_match "$(head -n1 <<<"$answer")" '^HTTP/1.1 413' "413 without the body being sent ($(($(date +%s%3N) - t0)) ms)"
    assert_contains "$answer" "content-type: application/problem+json" "... as problem+json"
    assert_contains "$answer" '"status":413' "... whose status is 413"
    assert_eq 1 "$(metric_delta "$REFUSED{reason=\"too_large\"}" "$r0")" \
        "counted in $REFUSED{reason=\"too_large\"}"
    assert_eq "$q0" "$(psql_q "SELECT count(*) FROM quarantine")" "nothing quarantined (there is nothing to keep)"
    TENANT=$(own_id other) ev_post "$other_key" small-1 >/dev/null
    assert_eq 202 "$(http_status)" "another tenant's event right after: 202"
    # an event that passes MAX_EVENT_BYTES once read keeps today's too_large quarantine
    head -c 1100000 /dev/zero | tr '\0' 'a' >"$WORK/big-body"
    curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $KEY" \
        -H 'Content-Type: application/octet-stream' -H 'ce-specversion: 1.0' -H 'ce-id: big-2' \
        -H 'ce-source: /limits' -H 'ce-type: studio.lerian.account.created' -H "ce-time: $(now3339)" \
        -H 'Expect:' --data-binary "@$WORK/big-body" "$HUB_URL/v1/events" >"$WORK/big-2.code"
    assert_eq 413 "$(cat "$WORK/big-2.code")" "a payload over MAX_EVENT_BYTES within the body cap: 413 once read"
    assert_eq too_large "$(psql_q "SELECT reason FROM quarantine WHERE event_id = 'big-2'")" \
        "... and quarantined too_large, as before"
}

# ---------------------------------------------------------------------------
# the bodies held at once
# ---------------------------------------------------------------------------

hub_env_bodies_held_at_once_are_capped() {
    echo STREAMING_HUB_HTTP_BODY_BYTES=3MiB
}

scenario_bodies_held_at_once_are_capped() {
    local other_key n r0 codes small out ok503 ra
    own_client
    other_key=$(own_tenant_key other)
    r0=$(metric "$REFUSED{reason=\"body_bytes\"}")
    printf '{"pad":"%s"}' "$(head -c 900000 /dev/zero | tr '\0' 'a')" >"$WORK/body-900k"
    # eight bodies of 900 KB, each sent at 150 KB/s (6 s): they announce
    # 7.2 MB where 3 MiB may be held
    for n in $(seq 1 8); do
        (curl -s -o "$WORK/bc-$n.body" -D "$WORK/bc-$n.headers" -w '%{http_code}\n' -X POST \
            -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
            -H 'ce-specversion: 1.0' -H "ce-id: big-$n" -H 'ce-source: /limits' \
            -H 'ce-type: studio.lerian.account.created' -H "ce-time: $(now3339)" \
            -H 'Expect:' --limit-rate 150k --max-time 60 --data-binary "@$WORK/body-900k" \
            "$HUB_URL/v1/events" >"$WORK/bc-$n.code") &
        track_pid $!
        sleep 0.1
    done
    sleep 1
    assert_ge "$(metric streaming_hub_http_body_bytes)" 1000000 \
        "the bodies arriving are counted held ($(metric streaming_hub_http_body_bytes) bytes)"
    # another tenant's small events, while the large ones arrive
    small=""
    for n in $(seq 1 5); do
        TENANT=$(own_id other) ev_post "$other_key" "small-$n" >/dev/null
        small="$small $(http_status)"
    done
    assert_eq " 202 202 202 202 202" "$small" "another tenant's small events get in meanwhile"
    wait_until 60 "[[ \$(cat $WORK/bc-*.code 2>/dev/null | wc -w) == 8 ]]" ||
        fail "not every large body was answered"
    codes=$(cat "$WORK"/bc-*.code | tr ' ' '\n' | sort | uniq -c | awk '{ printf "%s:%s ", $2, $1 }')
    log "large bodies: $codes"
    ok503=$(grep -l '^503$' "$WORK"/bc-*.code 2>/dev/null | wc -l)
    assert_ge "$ok503" 1 "large bodies beyond the cap are answered 503 ($codes)"
    assert_ge "$(grep -l '^202$' "$WORK"/bc-*.code | wc -l)" 2 "the large bodies within the cap are stored"
    assert_eq 8 "$(cat "$WORK"/bc-*.code | grep -cE '^(202|503)$')" "every large body was answered 202 or 503"
    for out in $(grep -l '^503$' "$WORK"/bc-*.code); do
        ra=$(grep -i '^retry-after:' "${out%.code}.headers" | tr -d '\r' | awk '{ print $2 }')
        [[ $ra =~ ^[0-9]+$ ]] || fail "a 503 without Retry-After (${out##*/})"
    done
    assert_eq "$ok503" "$(metric_delta "$REFUSED{reason=\"body_bytes\"}" "$r0")" \
        "each counted in $REFUSED{reason=\"body_bytes\"}"
    assert_eq "$(grep -l '^202$' "$WORK"/bc-*.code | wc -l)" \
        "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id LIKE 'big-%'")" \
        "what was refused is not stored, what was answered 202 is"
}

# ---------------------------------------------------------------------------
# HTTP ingest requests in progress
# ---------------------------------------------------------------------------

hub_env_ingest_requests_in_progress_are_bounded() {
    echo STREAMING_HUB_INGEST_HTTP_QUEUE=8
}

scenario_ingest_requests_in_progress_are_bounded() {
    local a b c n rq0 rs0 codes
    a=$(own_tenant_key a)
    b=$(own_tenant_key b)
    c=$(own_tenant_key c)
    rq0=$(metric "$REFUSED{reason=\"ingest_queue\"}")
    rs0=$(metric "$REFUSED{reason=\"ingest_key_share\"}")
    inbox_lock
    # tenant a: 10 at once; its key holds at most half of the 8
    for n in $(seq 1 10); do
        TENANT=$(own_id a) ev_post_bg "$WORK/iq-a-$n" "$a" "a-$n"
    done
    wait_until 10 "[[ \$(ls $WORK/iq-a-? $WORK/iq-a-?? 2>/dev/null | wc -l) == 6 ]]" ||
        fail "tenant a's requests beyond its share were not refused at once"
    assert_eq 4 "$(hub_ingest_inflight)" "tenant a holds 4 requests in progress (half of 8)"
    codes=$(cat "$WORK"/iq-a-? "$WORK"/iq-a-?? 2>/dev/null | awk '{ print $1 }' | sort | uniq -c | awk '{ printf "%s:%s ", $2, $1 }')
    assert_eq "503:6 " "$codes" "its other 6 are answered 503 at once"
    assert_eq 6 "$(metric_delta "$REFUSED{reason=\"ingest_key_share\"}" "$rs0")" \
        "counted in $REFUSED{reason=\"ingest_key_share\"}"
    # tenant b does not notice: its requests are admitted
    for n in 1 2 3; do
        TENANT=$(own_id b) ev_post_bg "$WORK/iq-b-$n" "$b" "b-$n"
    done
    wait_until 10 '[[ $(hub_ingest_inflight) == 7 ]]' || fail "tenant b's requests were not admitted"
    # tenant c: one more fills the 8, the next finds them full
    TENANT=$(own_id c) ev_post_bg "$WORK/iq-c-1" "$c" c-1
    wait_until 10 '[[ $(hub_ingest_inflight) == 8 ]]' || fail "tenant c's first request was not admitted"
    TENANT=$(own_id c) ev_post "$c" c-2 >/dev/null
    assert_eq 503 "$(http_status)" "with 8 in progress the next request is 503"
    assert_match "$(last_header retry-after)" '^[0-9]+$' "... with Retry-After"
    assert_eq 1 "$(metric_delta "$REFUSED{reason=\"ingest_queue\"}" "$rq0")" \
        "counted in $REFUSED{reason=\"ingest_queue\"}"
    inbox_unlock
    wait_until 20 "[[ -s $WORK/iq-b-1 && -s $WORK/iq-b-2 && -s $WORK/iq-b-3 && -s $WORK/iq-c-1 ]]" ||
        fail "the admitted requests were not answered"
    assert_eq "202 202 202" "$(cut -d' ' -f1 "$WORK"/iq-b-? | tr '\n' ' ' | sed 's/ $//')" \
        "tenant b's requests are all stored (202)"
    assert_eq 4 "$(cat "$WORK"/iq-a-? "$WORK"/iq-a-?? | awk '$1 == 202' | wc -l)" "tenant a's 4 admitted are stored"
    assert_eq "4 3 1" "$(psql_q "SELECT count(*) FILTER (WHERE tenant_id = '$(own_id a)'),
                                       count(*) FILTER (WHERE tenant_id = '$(own_id b)'),
                                       count(*) FILTER (WHERE tenant_id = '$(own_id c)')
                                  FROM event_inbox" | tr '|' ' ')" "nothing refused is stored"
    assert_eq 1 "$(grep -F '"msg":"http request refused' "$HUB_LOG" | grep -c '"reason":"ingest_key_share"')" \
        "6 refusals of a key, one log line"
}

hub_env_a_trailing_slash_is_the_same_ingest_route() {
    echo STREAMING_HUB_INGEST_HTTP_QUEUE=8
}

# POST /v1/events/ is routed as ingest, but the admission counted only the
# exact path: with a trailing slash a key's requests took no slot, outside
# the queue bound and the key's share.
scenario_a_trailing_slash_is_the_same_ingest_route() {
    local a n codes held
    a=$(own_tenant_key a)
    inbox_lock
    for n in $(seq 1 6); do
        EV_PATH=/v1/events/ TENANT=$(own_id a) ev_post_bg "$WORK/ts-$n" "$a" "ts-$n"
    done
    # in progress and refused add up to the six (a request still on its way
    # counts in neither yet)
    wait_until 10 "(( \$(ls $WORK/ts-? 2>/dev/null | wc -l) + \$(hub_ingest_inflight) == 6 ))" ||
        fail "the requests beyond the key's share were not refused at once"
    held=$(hub_ingest_inflight)
    assert_le "$held" 4 "the key holds at most 4 requests in progress (half of 8): $held"
    codes=$(cat "$WORK"/ts-? 2>/dev/null | awk '{ print $1 }' | sort | uniq -c | awk '{ printf "%s:%s ", $2, $1 }')
    assert_eq "503:$((6 - held)) " "$codes" "its other $((6 - held)) are answered 503 at once"
    inbox_unlock
    wait_until 20 "[[ \$(cat $WORK/ts-? | awk '\$1 == 202' | wc -l) == $held ]]" ||
        fail "the admitted requests were not stored"
}

# A head with a Transfer-Encoding is read as chunked whatever its
# Content-Length says; the budget took the Content-Length (10^12 here) as
# the body to come, and refused every other client's body until the
# connection closed (10 s, renewed by a new one: no key needed).
scenario_a_chunked_head_reserves_nothing_of_the_budget() {
    local fd held
    own_client
    exec {fd}<>"/dev/tcp/127.0.0.1/$(hub_port)"
    printf 'POST /v1/events HTTP/1.1\r\nHost: hub\r\nTransfer-Encoding: chunked\r\nContent-Length: 1000000000000\r\n\r\n' >&"$fd"
    sleep 0.5
    held=$(metric streaming_hub_http_body_bytes)
    assert_le "${held%.*}" 1048576 "the head with a huge Content-Length holds no budget ($held bytes)"
    ev_post "$KEY" chunked-1 >/dev/null
    assert_eq 202 "$(http_status)" "another client's event meanwhile is stored"
    exec {fd}>&-
}

# An event's headers are copied into its quarantine evidence; over HTTP/2 a
# repeated header costs its client one byte (HPACK), so one request could
# make the hub build gigabytes.  Past 256 such headers or 64 KiB: 431,
# nothing stored, no quota spent; within them the event is stored.  (curl
# cannot send the HPACK form: HTTP/1.1 shows the bound; h2o itself refuses
# more than 100 headers over HTTP/1.)
scenario_an_events_headers_are_bounded() {
    local args=() big n
    own_client
    big=$(head -c 3000 /dev/zero | tr '\0' 'a')
    for n in $(seq 1 25); do
        args+=(-H "ce-big$n: $big")
    done
    ev_post "$KEY" hdr-1 '{"n":1}' /limits "${args[@]}" >/dev/null
    assert_eq 431 "$(http_status)" "75 KB of ce- headers → 431"
    assert_contains "$(last_header content-type)" application/problem+json "… as problem+json"
    args=()
    for n in $(seq 1 20); do
        args+=(-H "ce-big$n: $big")
    done
    ev_post "$KEY" hdr-3 '{"n":1}' /limits "${args[@]}" >/dev/null
    assert_eq 202 "$(http_status)" "60 KB of them → 202"
    assert_eq "0 1" "$(psql_q "SELECT count(*) FILTER (WHERE event_id = 'hdr-1'),
                                      count(*) FILTER (WHERE event_id = 'hdr-3')
                                 FROM event_inbox WHERE tenant_id = '$TENANT'" | tr '|' ' ')" \
        "the refused are not stored, the last is"
}

hub_env_a_client_that_hangs_up_keeps_its_slot_until_its_events_are_stored() {
    echo STREAMING_HUB_INGEST_HTTP_QUEUE=8
}

# Four requests of tenant a wait on the locked inbox; their clients give up
# after a second.  Their events are still in the ingest queue, so their
# slots stay taken: a's fifth request is refused (its key holds its half of
# the 8).  On the build before, the slots went with the requests, and one key
# could queue without bound by hanging up (found in review).  Tenant b is
# admitted meanwhile.
scenario_a_client_that_hangs_up_keeps_its_slot_until_its_events_are_stored() {
    local a b n
    a=$(own_tenant_key a)
    b=$(own_tenant_key b)
    inbox_lock
    for n in 1 2 3 4; do
        TENANT=$(own_id a) ev_post_bg "$WORK/hu-a-$n" "$a" "hu-a-$n" '{"n":1}' /answers \
            --max-time 1
    done
    wait_until 10 "[[ \$(cat $WORK/hu-a-? 2>/dev/null | wc -l) == 4 ]]" ||
        fail "the four clients did not give up"
    assert_eq "000 000 000 000" "$(cut -d' ' -f1 "$WORK"/hu-a-? | tr '\n' ' ' | sed 's/ $//')" \
        "the four clients gave up waiting"
    assert_eq 4 "$(hub_ingest_inflight)" "their four requests are still in progress"
    TENANT=$(own_id a) ev_post "$a" hu-a-5 >/dev/null
    assert_eq 503 "$(http_status)" "a's fifth request finds its key's half taken"
    TENANT=$(own_id b) ev_post_bg "$WORK/hu-b-1" "$b" hu-b-1
    wait_until 10 '[[ $(hub_ingest_inflight) == 5 ]]' || fail "tenant b's request was not admitted"
    inbox_unlock
    wait_until 20 "[[ -s $WORK/hu-b-1 ]]" || fail "tenant b's request was not answered"
    assert_eq 202 "$(cut -d' ' -f1 "$WORK/hu-b-1")" "tenant b's event is stored"
    wait_until 20 '[[ $(hub_ingest_inflight) == 0 ]]' || fail "the slots were not given back"
    assert_eq 4 "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$(own_id a)'")" \
        "the four events whose clients left are stored"
}

# ---------------------------------------------------------------------------
# connections
# ---------------------------------------------------------------------------

hub_env_connections_are_capped() {
    echo STREAMING_HUB_HTTP_MAX_CONNECTIONS=4
}

scenario_connections_are_capped() {
    local b_fd idle=() n p0 pid code
    own_client
    p0=$(metric streaming_hub_http_accept_paused_total)
    # tenant b's keep-alive connection, open before the cap is reached
    raw_open
    b_fd=$RAW_FD
    assert_eq 200 "$(raw_request "$b_fd" GET /healthz)" "tenant b's connection answers"
    # three idle connections fill the cap of 4 (b's is the fourth)
    for n in 1 2 3; do
        raw_open
        idle+=("$RAW_FD")
    done
    sleep 0.3
    curl -s -o /dev/null -w '%{http_code}' --max-time 10 "$HUB_URL/healthz" >"$WORK/cap.code" &
    pid=$!
    track_pid "$pid"
    sleep 1.5
    [[ ! -s $WORK/cap.code ]] && kill -0 "$pid" 2>/dev/null &&
        pass "a fifth connection waits in the backlog (no answer, no reset)" ||
        fail "a fifth connection was answered at the cap: $(cat "$WORK/cap.code")"
    assert_eq 200 "$(raw_request "$b_fd" GET /healthz)" \
        "tenant b's established connection keeps working at the cap"
    code=$(raw_request "$b_fd" GET /v1/subscriptions "Authorization: Bearer $KEY")
    assert_eq 200 "$code" "... for the API too"
    n=${idle[0]}
    exec {n}>&-
    wait "$pid"
    assert_eq 200 "$(cat "$WORK/cap.code")" "once a connection closes the waiting one is served"
    # (a metric read is a connection too: only now is there room for one)
    assert_ge "$(metric_delta streaming_hub_http_accept_paused_total "$p0")" 1 \
        "counted in streaming_hub_http_accept_paused_total"
    for n in "${idle[@]:1}"; do
        exec {n}>&-
    done
    exec {b_fd}>&-
    grep -qF 'http connection cap reached' "$HUB_LOG" && pass "the cap is logged" || fail "the cap is not logged"
}

scenarios_main "$@"
