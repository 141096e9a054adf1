#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# KEK rotation (SPEC §11: secrets are sealed "with a key id, so the KEK can
# be rotated"; the procedure is docs/deploy.md's "KEK rotation"), end to end
# against a real PostgreSQL, the mock cluster and the recording sink:
#
#   1. secrets sealed under K1 (a subscription with destination headers, a
#      rotated secret still in its grace, an idempotency record of the
#      create); deliveries signed and carrying the header;
#   2. the hub restarted with K2 current and K1 previous: the old seals
#      still open (deliveries signed the same way, the create's replay shows
#      the same secret), new seals use K2;
#   3. `streaming-hub rekey` while that hub serves: nothing is left under
#      K1, a second run finds nothing to do;
#   4. the hub restarted with K2 alone: everything still works.
#
# And the refusals: a rekey whose keys open nothing writes nothing and
# exits 1; a malformed STREAMING_HUB_KEK_PREVIOUS stops `serve` and `rekey`
# with exit 2 and a line naming the entry (never a key).
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"

TOPIC=lerian.streaming.kek
K1=$(head -c 32 /dev/urandom | base64 -w0)
K2=$(head -c 32 /dev/urandom | base64 -w0)
K3=$(head -c 32 /dev/urandom | base64 -w0)

setup() {
    pg_start
    kafka_start --topic "$TOPIC:1"
    sink_start
    hub_shared STREAMING_HUB_KEK="$K1" STREAMING_HUB_ALLOW_PRIVATE_SINKS=true \
        STREAMING_HUB_RETRY_SCHEDULE=200ms,300ms,400ms STREAMING_HUB_DELIVERY_TIMEOUT=2s
}

# rekey KEK [PREVIOUS]: runs `streaming-hub rekey` with those keys; its
# stdout in $WORK/rekey.out, stderr in $WORK/rekey.err; returns its status.
rekey() {
    env STREAMING_HUB_KEK="$1" ${2:+STREAMING_HUB_KEK_PREVIOUS="$2"} STREAMING_HUB_REKEY_BATCH=2 \
        "$HUB_BIN" rekey >"$WORK/rekey.out" 2>"$WORK/rekey.err"
}

# under KID: how many stored values are sealed under key id KID (each
# sealed column of a subscription, each "_ss"/"_hs" of an idempotency
# record counts one).
under() {
    psql_q "SELECT (SELECT count(*) FILTER (WHERE secret_sealed LIKE 'v1:$1:%')
                         + count(*) FILTER (WHERE headers_sealed LIKE 'v1:$1:%')
                         + count(*) FILTER (WHERE prev_secret_sealed LIKE 'v1:$1:%')
                      FROM subscriptions)
                 + (SELECT count(*) FILTER (WHERE body::json->>'_ss' LIKE 'v1:$1:%')
                         + count(*) FILTER (WHERE body::json->>'_hs' LIKE 'v1:$1:%')
                      FROM idempotency_keys)"
}

# signed_ok PATH SECRET: 1 when the last request at PATH carries an
# X-Lerian-Signature entry that SECRET's key makes for its body (openssl).
signed_ok() {
    local hex ts body sig want
    hex=$(printf '%s' "${2#whsec_}" | base64 -d | od -An -tx1 | tr -d ' \n')
    ts=$(sink_header "$1" x-lerian-timestamp | tail -n1)
    body=$(sink_bodies "$1" | tail -n1)
    sig=$(sink_header "$1" x-lerian-signature | tail -n1)
    want=$(printf '%s' "v1:$ts.$body" | openssl dgst -sha256 -mac HMAC -macopt "hexkey:$hex" | sed 's/^.*= //')
    grep -qF "v1,sha256=$want" <<<"$sig" && echo 1 || echo 0
}

# create_1: POST /v1/subscriptions as $KEY under Idempotency-Key create-1:
# a subscription to transaction.* at $P with the header X-Api-Key.
create_1() {
    hub_curl POST /v1/subscriptions \
        "{\"event_types\":[\"transaction.*\"],\"destination\":{\"kind\":\"webhook\",\"url\":\"$SINK_URL$P\",\"headers\":{\"X-Api-Key\":\"k-one\"}}}" \
        -H "Authorization: Bearer $KEY" -H 'Idempotency-Key: create-1'
}

# deliver N: one event of $TENANT; waits for the Nth delivery at $P.
deliver() {
    produce --topic "$TOPIC" --tenant "$TENANT" --count 1 --id-prefix "ev$1-" \
        --type studio.lerian.transaction.posted >/dev/null || fail "produce failed"
    wait_until 30 "(( \$(sink_header $P x-lerian-event-type | grep -c '^transaction.posted\$') >= $1 ))" ||
        fail "delivery $1 did not arrive"
}

scenario_a_rotation_from_one_kek_to_another() {
    local sub secret created again k1id k2id body
    own_client
    P=/echo/$(own_id)/
    # 1. under K1: a subscription with a header, created under an
    # Idempotency-Key, then its secret rotated with a grace (two seals)
    created=$(create_1)
    assert_eq 201 "$(http_status)" "created under K1"
    sub=$(json_str id "$created")
    subscription_wait_verified "$sub" || fatal "the probe did not verify it"
    hub_curl POST "/v1/subscriptions/$sub/rotate-secret" '{"grace":"1h"}' -H "Authorization: Bearer $KEY" >/dev/null
    secret=$(json_str secret)
    [[ $secret == whsec_* ]] || fatal "rotate-secret: $(http_status)"
    k1id=$(psql_q "SELECT split_part(secret_sealed, ':', 2) FROM subscriptions WHERE id = '$sub'")
    assert_eq 5 "$(under "$k1id")" \
        "secret, previous secret, headers and the create's record (secret, headers) sealed under K1"
    deliver 1
    assert_eq "1 k-one" "$(signed_ok "$P" "$secret") $(sink_header "$P" x-api-key | tail -n1)" \
        "under K1: signed with the secret, the header delivered"

    # 2. K2 current, K1 previous: old seals open, new ones are K2's
    hub_ensure STREAMING_HUB_KEK="$K2" STREAMING_HUB_KEK_PREVIOUS="$K1"
    deliver 2
    assert_eq "1 k-one" "$(signed_ok "$P" "$secret") $(sink_header "$P" x-api-key | tail -n1)" \
        "K2 + previous K1: still signed with the same secret, the header delivered"
    again=$(create_1)
    assert_eq "201 true" "$(http_status) $(last_header idempotent-replayed)" "the create's replay"
    assert_eq "$(json_str secret "$created")" "$(json_str secret "$again")" "shows the secret sealed under K1"
    body=$(hub_curl GET "/v1/subscriptions/$sub" '' -H "Authorization: Bearer $KEY")
    assert_contains "$body" '"headers":{"X-Api-Key":"***"}' "the header names open"
    hub_curl POST "/v1/subscriptions/$sub/rotate-secret" '{"grace":"1h"}' -H "Authorization: Bearer $KEY" >/dev/null
    secret=$(json_str secret)
    k2id=$(psql_q "SELECT split_part(secret_sealed, ':', 2) FROM subscriptions WHERE id = '$sub'")
    assert_ne "$k1id" "$k2id" "a new secret is sealed under K2"
    assert_eq 4 "$(under "$k1id")" "the previous secret, the headers and the record are still K1's"

    # 3. rekey while that hub serves (batches of 2 rows)
    rekey "$K2" "$K1"
    assert_eq 0 "$?" "rekey exits 0: $(tail -n2 "$WORK/rekey.err")"
    assert_contains "$(cat "$WORK/rekey.out")" "1 subscriptions and 1 idempotency records re-sealed under KEK $k2id; 0 and 0 still" \
        "it says what it did"
    assert_eq "0 5" "$(under "$k1id") $(under "$k2id")" "nothing is left under K1"
    rekey "$K2" "$K1"
    assert_eq 0 "$?" "a second run exits 0"
    assert_contains "$(cat "$WORK/rekey.out")" "0 subscriptions and 0 idempotency records re-sealed" \
        "and finds nothing to do"
    deliver 3
    assert_eq 1 "$(signed_ok "$P" "$secret")" "deliveries go on during and after the rekey"

    # 4. K2 alone
    hub_ensure STREAMING_HUB_KEK="$K2"
    deliver 4
    assert_eq "1 k-one" "$(signed_ok "$P" "$secret") $(sink_header "$P" x-api-key | tail -n1)" \
        "K2 alone: signed, the header delivered"
    again=$(create_1)
    assert_eq "$(json_str secret "$created")" "$(json_str secret "$again")" \
        "the re-sealed record still replays the first secret"
    hub_curl POST "/v1/subscriptions/$sub/verify" '' -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq '200 true' "$(http_status) $(json_raw ok)" "/verify opens the secrets and the headers"
    assert_eq 0 "$(grep -c 'cannot open' "$HUB_LOG")" "no secret failed to open"

    # a rekey with keys that open nothing (K3, no previous) writes nothing
    rekey "$K3"
    assert_eq 1 "$?" "a rekey whose keys open nothing exits 1"
    assert_contains "$(cat "$WORK/rekey.err")" "do not open with any configured KEK" "and says why"
    assert_eq 5 "$(under "$k2id")" "nothing was written"
}

scenario_malformed_previous_keys_stop_the_commands() {
    local out rc
    out=$(env STREAMING_HUB_KEK="$K2" STREAMING_HUB_KEK_PREVIOUS="$K1,not-a-key" "$HUB_BIN" rekey 2>&1)
    rc=$?
    assert_eq 2 "$rc" "rekey with a malformed previous key → exit 2"
    assert_contains "$out" "STREAMING_HUB_KEK_PREVIOUS: entry 2 is not base64 of 32 bytes" "names the entry"
    out=$(env STREAMING_HUB_KEK="$K2" STREAMING_HUB_KEK_PREVIOUS="$K1,not-a-key" \
        STREAMING_HUB_HTTP_LISTEN_ADDR=127.0.0.1:0 timeout 20 "$HUB_BIN" serve 2>&1)
    rc=$?
    assert_eq 2 "$rc" "serve with a malformed previous key → exit 2"
    assert_contains "$out" "STREAMING_HUB_KEK_PREVIOUS: entry 2" "names the entry"
    assert_eq 0 "$(grep -cF -- "$K1" <<<"$out")" "and shows no key"
    out=$(env -u STREAMING_HUB_KEK STREAMING_HUB_KEK_PREVIOUS="$K1" "$HUB_BIN" rekey 2>&1)
    assert_eq 2 "$?" "previous keys without a KEK → exit 2"
}

scenarios_main "$@"
