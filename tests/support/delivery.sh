# shellcheck shell=bash
#
# tests/support/delivery.sh — webhook subscriptions and their delivery jobs,
# for the tests that deliver to the recording sink (sink.sh).
#
# Source it after lib.sh (it uses admin_curl, psql_q, wait_until, wait_sql,
# fatal and $HUB_URL).  jq is not assumed: the API answers compact JSON, read
# with sed.  Sink paths that fail on purpose cannot echo the verification
# challenge, so their subscriptions are activated by hand (subscription_activate).
#
#   KEY=$(own_tenant_key)
#   ID=$(subscribe_at "$KEY" "/status/500/$(own_id)/" transaction.posted)
#   wait_job_state "$ID" dead || fail "the job is not dead: $(job_states "$ID")"

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

# subscribe_at KEY PATH TYPE [EXTRA]: a webhook subscription of KEY's tenant
# to TYPE at $SINK_URL PATH, activated by hand once its probe is over (the
# sink's failing paths cannot echo the challenge); prints the id (fatal
# without one; a probe that does not finish is a failure).
subscribe_at() {
    local id
    id=$(subscribe_active "$1" "$(subscription_json "$3" "$SINK_URL$2" "${4:-}")") ||
        fail "the probe of the subscription at $2 did not finish"
    echo "$id"
}

# jobs_in SUB STATE: how many jobs of subscription SUB are in STATE.
jobs_in() {
    psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$1' AND state = '$2'"
}

# job_states SUB: "state:count ..." of SUB's jobs (for failure messages).
job_states() {
    psql_q "SELECT coalesce(string_agg(state || ':' || n, ' ' ORDER BY state), 'none')
              FROM (SELECT state, count(*) n FROM delivery_jobs
                     WHERE subscription_id = '$1' GROUP BY state) x"
}

# wait_jobs SUB STATE N [TIMEOUT]: waits (default 20 s) until exactly N jobs
# of SUB are in STATE; 1 on timeout.
wait_jobs() {
    wait_sql "${4:-20}" "$3" \
        "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$1' AND state = '$2'"
}

# wait_job_state SUB STATE [TIMEOUT]: waits (default 20 s) until the one job
# of SUB is in STATE; 1 on timeout.
wait_job_state() {
    wait_sql "${3:-20}" "$2" "SELECT state FROM delivery_jobs WHERE subscription_id = '$1'"
}
