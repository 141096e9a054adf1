# shellcheck shell=bash
#
# tests/support/ingest_http.sh — HTTP ingest from a test (SPEC §4), on top of
# lib.sh: binary-mode events, batches, and many concurrent posters.
#
#   own_client                                   # TENANT and KEY (lib.sh)
#   ev_post "$KEY" ev-1 '{"n":1}'                # one binary event → 202
#   ev_batch "$KEY" "$(ev_json a-1)" "$(ev_json a-2 '{"n":2}')"   # → 207
#   assert_eq 202 "$(http_status)" "stored"
#
# The answers go where lib.sh's hub_curl puts them (last_body, http_status,
# last_header).

# ev_post KEY ID [DATA] [SOURCE] [curl args...]: POST /v1/events in binary
# mode (Content-Type application/json, ce-* headers; tenant $TENANT, type
# studio.lerian.account.created, source /answers unless given); prints the
# answer's body.  EV_PATH (default /v1/events) is the path posted to.
ev_post() {
    local key=$1 id=$2 data=${3:-'{"n":1}'} source=${4:-/answers}
    (($# > 4)) && shift 4 || shift $#
    local last=${HUB_HTTP_LAST:-$WORK/last_http}
    printf '%s' "$data" >"${last}_req"
    curl -s -X POST --max-time 60 -o "${last}_body" -D "${last}_headers" -w '%{http_code}' \
        -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
        -H 'ce-specversion: 1.0' -H "ce-id: $id" -H "ce-source: $source" \
        -H 'ce-type: studio.lerian.account.created' -H "ce-time: $(now3339)" \
        -H "ce-tenantid: $TENANT" --data-binary "@${last}_req" "$@" \
        "$HUB_URL${EV_PATH:-/v1/events}" >"${last}_status" 2>/dev/null || echo 000 >"${last}_status"
    cat "${last}_body" 2>/dev/null
}

# ev_json ID [DATA] [SOURCE]: one structured event of $TENANT as compact JSON.
ev_json() {
    local data=${2:-'{"n":1}'}
    printf '{"specversion":"1.0","id":"%s","source":"%s","type":"studio.lerian.account.created","time":"%s","tenantid":"%s","data":%s}' \
        "$1" "${3:-/answers}" "$(now3339)" "$TENANT" "$data"
}

# ev_batch KEY EVENT_JSON...: POST the events as one batch
# (application/cloudevents-batch+json); prints the answer's body (207).
ev_batch() {
    local key=$1 last=${HUB_HTTP_LAST:-$WORK/last_http} body
    shift
    body=$(
        IFS=,
        printf '[%s]' "$*"
    )
    printf '%s' "$body" >"${last}_req"
    curl -s -X POST --max-time 60 -o "${last}_body" -D "${last}_headers" -w '%{http_code}' \
        -H "Authorization: Bearer $key" -H 'Content-Type: application/cloudevents-batch+json' \
        --data-binary "@${last}_req" "$HUB_URL/v1/events" >"${last}_status" 2>/dev/null ||
        echo 000 >"${last}_status"
    cat "${last}_body" 2>/dev/null
}

# in_bg OUT CMD ARGS...: runs ev_post or ev_batch (CMD) in the background;
# its "status body" goes to OUT once answered.  Sets POST_PID (tracked).
in_bg() {
    local out=$1
    shift
    (
        HUB_HTTP_LAST=$out.http
        body=$("$@")
        printf '%s %s\n' "$(cat "$out.http_status")" "$body" >"$out.tmp" && mv "$out.tmp" "$out"
    ) &
    POST_PID=$!
    track_pid "$POST_PID"
}

# ev_post_bg OUT KEY ID [DATA] [SOURCE] [curl args...]: ev_post in the
# background (in_bg).
ev_post_bg() {
    in_bg "$1" ev_post "${@:2}"
}

# ev_batch_bg OUT KEY EVENT_JSON...: ev_batch in the background (in_bg).
ev_batch_bg() {
    in_bg "$1" ev_batch "${@:2}"
}

# hub_ingest_inflight: HTTP ingest requests in progress (the hub's gauge).
hub_ingest_inflight() {
    metric streaming_hub_http_ingest_requests
}

# inbox_lock: holds an exclusive lock on event_inbox in a psql session of
# its own (every ingest insert then waits) until inbox_unlock; sets
# LOCK_PID.  Waits until the lock is held.
inbox_lock() {
    mkfifo "$WORK/lock.fifo.$$" 2>/dev/null || true
    (psql -XAtq "$STREAMING_HUB_POSTGRES_DSN" <"$WORK/lock.fifo.$$" >/dev/null 2>&1) &
    LOCK_PID=$!
    track_pid "$LOCK_PID"
    exec {LOCK_FD}>"$WORK/lock.fifo.$$"
    printf 'BEGIN;\nLOCK TABLE event_inbox IN EXCLUSIVE MODE;\nSELECT 1;\n' >&"$LOCK_FD"
    wait_sql 10 1 "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                    WHERE c.relname = 'event_inbox' AND l.mode = 'ExclusiveLock' AND l.granted" ||
        fatal "could not lock event_inbox"
}

# inbox_unlock: ends inbox_lock's transaction.
inbox_unlock() {
    printf 'COMMIT;\n' >&"$LOCK_FD"
    exec {LOCK_FD}>&-
    wait "$LOCK_PID" 2>/dev/null
    rm -f "$WORK/lock.fifo.$$"
}
