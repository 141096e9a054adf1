#!/usr/bin/env bash
# shellcheck disable=SC2317 # the runner (scenario.sh) calls scenario_*
# The tenant API key cache (src/auth_cache.h; issue 26 item 4): each process
# answers a key from its last lookup for at most STREAMING_HUB_AUTH_CACHE_TTL
# (default and maximum 1 s), so a key revoked or a tenant deactivated through
# ANY process stops working on EVERY process within that time, and at once
# on the process that made the change.
#
# Three `serve` processes on one database: A takes the admin calls, B the
# tenant's events, C too with the cache off (STREAMING_HUB_AUTH_CACHE_TTL=0ms).  B keeps the key hot (an event every 50 ms) while A
# revokes it; B must refuse it within the TTL plus a margin for the machine
# (a request in flight, a loaded CI runner): 1,500 ms.
#
# Run one alone: bash tests/integration/test_auth_cache.sh a_revoked_key_stops_on_every_process
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/ingest_http.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/ingest_http.sh"

LIMIT_MS=1500 # the TTL (1 s) and a margin

setup() {
    pg_start
    kafka_start --topic lerian.streaming.auth:1
    # B first: lib.sh's HUB_URL/HUB_PID then stay A's, for admin_curl
    hub_start STREAMING_HUB_DATA_DIR="$WORK/hub-b"
    B_URL=$HUB_URL
    B_PID=$HUB_PID
    track_pid "$HUB_PID"
    track_pid "$HUB_WRAPPER_PID"
    # C: the cache off
    hub_start STREAMING_HUB_DATA_DIR="$WORK/hub-c" STREAMING_HUB_AUTH_CACHE_TTL=0ms
    C_URL=$HUB_URL
    C_PID=$HUB_PID
    track_pid "$HUB_PID"
    track_pid "$HUB_WRAPPER_PID"
    hub_start
    A_URL=$HUB_URL
    export A_URL B_URL B_PID C_URL C_PID
}

teardown() {
    stop_pid "$B_PID"
    stop_pid "$C_PID"
}

# stop_pid PID: SIGTERM to a hub other than lib.sh's own, and its end.
stop_pid() {
    kill -TERM "$1" 2>/dev/null
    wait_until 30 "! kill -0 $1 2>/dev/null" || kill -9 "$1" 2>/dev/null
}

# on URL KEY ID: POST one event to that process; prints the status.
on() {
    local url=$1 key=$2 id=$3
    HUB_URL=$url ev_post "$key" "$id" >/dev/null
    http_status
}

# refused_within URL KEY PREFIX: posts every 50 ms to URL until 401; prints
# the milliseconds from the call to the first 401 (99999 if none in 10 s).
refused_within() {
    local url=$1 key=$2 prefix=$3 t0 i=0 code
    t0=$(date +%s%3N)
    while (($(date +%s%3N) - t0 < 10000)); do
        i=$((i + 1))
        code=$(on "$url" "$key" "$prefix-$i")
        if [[ $code == 401 ]]; then
            echo $(($(date +%s%3N) - t0))
            return 0
        fi
        sleep 0.05
    done
    echo 99999
}

# keep_hot URL KEY PREFIX: posts every 50 ms in the background (the pid in
# HOT_PID) so that URL's cache holds KEY when the change comes.
keep_hot() {
    local url=$1 key=$2 prefix=$3
    (
        i=0
        while :; do
            i=$((i + 1))
            HUB_URL=$url HUB_HTTP_LAST=$WORK/hot ev_post "$key" "$prefix-$i" >/dev/null
            sleep 0.05
        done
    ) &
    HOT_PID=$!
    track_pid "$HOT_PID"
}

scenario_a_revoked_key_stops_on_every_process() {
    local key_id ms
    own_client
    assert_eq 202 "$(on "$B_URL" "$KEY" warm-1)" "B takes the key"
    assert_eq 202 "$(on "$A_URL" "$KEY" warm-2)" "A takes the key"
    key_id=$(psql_q "SELECT id FROM tenant_api_keys WHERE tenant_id = '$TENANT'")
    [[ $key_id =~ ^[0-9a-f-]{36}$ ]] || fatal "no key id for $TENANT"
    keep_hot "$B_URL" "$KEY" hot
    sleep 0.3
    admin_curl DELETE "/admin/tenants/$TENANT/api-keys/$key_id" >/dev/null
    assert_eq 204 "$(http_status)" "A revokes the key"
    ms=$(refused_within "$B_URL" "$KEY" b)
    assert_eq 401 "$(on "$A_URL" "$KEY" a-after)" "A refuses it at once (its own cache cleared)"
    kill "$HOT_PID" 2>/dev/null
    assert_le "$ms" "$LIMIT_MS" "B refuses the revoked key within the 1 s TTL and a margin (${ms} ms)"
    assert_eq 401 "$(on "$B_URL" "$KEY" b-later)" "... and keeps refusing it"
}

scenario_a_deactivated_tenant_stops_on_every_process() {
    local ms
    own_client
    assert_eq 202 "$(on "$B_URL" "$KEY" warm-1)" "B takes the key"
    keep_hot "$B_URL" "$KEY" hot
    sleep 0.3
    admin_curl PATCH "/admin/tenants/$TENANT" '{"status":"inactive"}' >/dev/null
    assert_eq 200 "$(http_status)" "A deactivates the tenant"
    ms=$(refused_within "$B_URL" "$KEY" b)
    assert_eq 401 "$(on "$A_URL" "$KEY" a-after)" "A refuses its key at once"
    kill "$HOT_PID" 2>/dev/null
    assert_le "$ms" "$LIMIT_MS" "B refuses the inactive tenant's key within the TTL and a margin (${ms} ms)"
}

scenario_with_the_cache_off_a_revocation_is_seen_at_once() {
    local key_id
    own_client
    assert_eq 202 "$(on "$C_URL" "$KEY" warm-1)" "C (cache off) takes the key"
    key_id=$(psql_q "SELECT id FROM tenant_api_keys WHERE tenant_id = '$TENANT'")
    admin_curl DELETE "/admin/tenants/$TENANT/api-keys/$key_id" >/dev/null
    assert_eq 204 "$(http_status)" "A revokes the key"
    assert_eq 401 "$(on "$C_URL" "$KEY" c-after)" "C refuses it on the next request"
}

scenarios_main "$@"
