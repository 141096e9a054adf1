# shellcheck shell=bash
#
# tests/support/delivery.sh — tenant API keys and webhook subscriptions for the
# tests that deliver to the recording sink (sink.sh).
#
# Source it after lib.sh (it uses admin_curl, psql_q, wait_until, fatal and
# $HUB_URL).  jq is not assumed: the API answers compact JSON, read with sed.
# Sink paths that fail on purpose cannot echo the verification challenge, so
# their subscriptions are activated by hand (subscription_activate).
#
#   KEY=$(tenant_key acme)
#   ID=$(subscribe_active "$KEY" "$(subscription_json transaction.posted "$SINK_URL/status/500/a")")

# tenant_key TENANT: prints a new API key (shk_…) of TENANT; nothing on failure.
tenant_key() {
    admin_curl POST "/admin/tenants/$1/api-keys" | sed -n 's/.*"key":"\(shk_[^"]*\)".*/\1/p'
}

# json_field NAME JSON: the string member NAME of compact JSON (the last if repeated), or nothing.
json_field() {
    sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p" <<<"$2" | head -n1
}

# subscription_json TYPE URL [EXTRA]: a webhook subscription body, EXTRA (',"k":v') at top level.
subscription_json() {
    printf '{"event_types":["%s"],"destination":{"kind":"webhook","url":"%s"}%s}' "$1" "$2" "${3:-}"
}

# subscription_create KEY JSON: POST /v1/subscriptions as KEY's tenant; prints the response body.
subscription_create() {
    curl -s -X POST -H "Authorization: Bearer $1" -H 'Content-Type: application/json' \
        -d "$2" "$HUB_URL/v1/subscriptions"
}

# subscription_state ID: the subscription's verification_state, read with psql.
subscription_state() {
    psql_q "SELECT verification_state FROM subscriptions WHERE id = '$1'"
}

# subscription_wait_verified ID: waits up to 20 s for its probe to make ID active; 1 if not.
subscription_wait_verified() {
    wait_until 20 "[[ \$(subscription_state $1) == active ]]"
}

# subscription_activate ID: waits up to 10 s for ID to leave pending, forces active (1: timeout).
subscription_activate() {
    local rc=0
    wait_until 10 "[[ \$(subscription_state $1) != pending ]]" || rc=1
    psql_q "UPDATE subscriptions SET verification_state = 'active' WHERE id = '$1'" >/dev/null
    return "$rc"
}

# subscribe_active KEY JSON: creates (fatal without an id), activates, prints the id; 1: timeout.
subscribe_active() {
    local s id rc=0
    s=$(subscription_create "$1" "$2")
    id=$(json_field id "$s")
    [[ -n $id ]] || fatal "subscription not created: $s"
    subscription_activate "$id" || rc=1
    echo "$id"
    return "$rc"
}
