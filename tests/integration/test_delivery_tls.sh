#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# Deliveries over TLS (SPEC §7.1, §11): HTTP/2 negotiated by ALPN with an
# https destination, certificate verification always on — a certificate for
# another name, or from a CA the hub does not trust, fails the attempt with
# error "tls" and nothing reaches the destination.  The destination is a real
# nginx (ssl + http2) with a certificate from a CA made here; the hub trusts
# that CA through STREAMING_HUB_DELIVERY_CA_FILE (but for the scenario of a
# hub with the system bundle only).
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"
# shellcheck source=tests/support/nginx.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/nginx.sh"

TOPIC=lerian.streaming.tls

# make_pki: a CA, and a certificate for "localhost" only, in $PKI.
make_pki() {
    PKI=$WORK/pki
    mkdir -p "$PKI"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$PKI/ca.key" -out "$PKI/ca.pem" -days 2 \
        -subj "/CN=streaming-hub test CA" 2>/dev/null || fatal "cannot make the CA"
    openssl req -newkey rsa:2048 -nodes -keyout "$PKI/srv.key" -out "$PKI/srv.csr" \
        -subj "/CN=localhost" 2>/dev/null || fatal "cannot make the server key"
    printf 'subjectAltName=DNS:localhost\n' >"$PKI/ext.cnf"
    openssl x509 -req -in "$PKI/srv.csr" -CA "$PKI/ca.pem" -CAkey "$PKI/ca.key" -CAcreateserial \
        -out "$PKI/srv.pem" -days 2 -extfile "$PKI/ext.cnf" 2>/dev/null || fatal "cannot sign the certificate"
}

setup() {
    make_pki
    # nginx: TLS + HTTP/2, logging the protocol of every request
    nginx_run "ssl http2" \
        "ssl_certificate $PKI/srv.pem; ssl_certificate_key $PKI/srv.key;
        location / { return 200 \"ok\"; }" \
        "log_format p '\$server_protocol \$uri \$http_x_lerian_event_id'; access_log $WORK/nginx/access.log p;"
    : >"$NGINX_DIR/access.log"
    pg_start
    kafka_start --topic "$TOPIC":2
    hub_shared STREAMING_HUB_KEK="$(head -c 32 /dev/urandom | base64)" \
        STREAMING_HUB_ALLOW_PRIVATE_SINKS=true \
        STREAMING_HUB_RETRY_SCHEDULE=1h STREAMING_HUB_DELIVERY_TIMEOUT=5s \
        STREAMING_HUB_DELIVERY_CA_FILE="$PKI/ca.pem"
}

# requests PATH [ID_PREFIX]: requests nginx logged for PATH (whose event id
# starts with ID_PREFIX: the verification probe is not an event delivery)
requests() { grep -c " $1 ${2:-}" "$NGINX_DIR/access.log" 2>/dev/null || true; }

attempt_errors() { # ID → "error:count ..." of its attempts
    psql_q "SELECT coalesce(string_agg(e || ':' || n, ' ' ORDER BY e), '') FROM (
              SELECT coalesce(a.error, 'none') e, count(*) n FROM delivery_attempts a
                JOIN delivery_jobs j ON j.id = a.job_id WHERE j.subscription_id = '$1' GROUP BY 1) x"
}

# tls_subscription HOST TYPE: $KEY's subscription to tls.TYPE at
# https://HOST:PORT/<scenario>; nginx cannot echo the challenge: activated by
# hand.  Prints the id.
tls_subscription() {
    subscribe_active "$KEY" "$(subscription_json "tls.$2" "https://$1:$NGINX_PORT/$(own_id)")" ||
        fail "the probe of the $2 subscription did not finish"
}

# expect_refused ID TYPE WHY: one event of tls.TYPE for subscription ID
# fails its attempt with "tls" and never arrives
expect_refused() {
    produce --topic "$TOPIC" --tenant "$TENANT" --count 1 --id-prefix "$2-" \
        --type "studio.lerian.tls.$2" >/dev/null
    wait_until 30 "[[ \$(attempt_errors $1) == tls:1 ]]" ||
        fail "$3 did not fail with tls: '$(attempt_errors "$1")'"
    assert_eq 0 "$(requests "/$(own_id)")" "nothing reached the destination: $3"
}

# trusted CA, matching name: delivered, over HTTP/2
scenario_a_trusted_certificate_delivers_over_http2() {
    local ok_id path
    own_client
    path=/$(own_id)
    ok_id=$(tls_subscription localhost ok)
    produce --topic "$TOPIC" --tenant "$TENANT" --count 5 --id-prefix ok- \
        --type studio.lerian.tls.ok >/dev/null
    wait_until 30 "(( \$(requests $path ok-) >= 5 ))" || fail "the TLS deliveries did not arrive"
    sleep 1
    assert_eq 5 "$(requests "$path" ok-)" "five deliveries reached the TLS destination"
    assert_eq 5 "$(grep " $path ok-" "$NGINX_DIR/access.log" | grep -c '^HTTP/2.0 ')" "all of them over HTTP/2 (ALPN)"
    if wait_until 10 "[[ \$(attempt_errors $ok_id) == none:5 ]]"; then
        pass "the TLS attempts are recorded as successes"
    else
        fail "the TLS attempts are not all recorded as successes: $(attempt_errors "$ok_id")"
    fi
}

# a certificate for another name
scenario_a_certificate_for_another_name_fails_with_tls() {
    own_client
    expect_refused "$(tls_subscription 127.0.0.1 name)" name "a name mismatch"
}

# the hub without the test CA (the system bundle only)
hub_env_an_unknown_ca_fails_with_tls() {
    echo -STREAMING_HUB_DELIVERY_CA_FILE
}

scenario_an_unknown_ca_fails_with_tls() {
    own_client
    expect_refused "$(tls_subscription localhost untrusted)" untrusted "an unknown CA"
}

# A destination that offers only finite-field Diffie-Hellman (DHE) picks the
# modulus, up to 10,000 bits, and each handshake's two exponentiations ran
# on the hub's loop: a tenant's server could take half a second of it per
# attempt.  Attempts now offer ECDHE only (TLS 1.2 and up, EC groups), and
# such a server fails the attempt with "tls".
scenario_a_destination_offering_only_dhe_fails_with_tls() {
    local port sub tries=0
    own_client
    while :; do
        port=$(random_port)
        openssl s_server -accept "$port" -cert "$PKI/srv.pem" -key "$PKI/srv.key" -no_tls1_3 \
            -cipher DHE-RSA-AES128-GCM-SHA256 -www >"$WORK/dhe.log" 2>&1 &
        track_pid $!
        wait_until 5 "port_in_use $port" >/dev/null && break
        tries=$((tries + 1))
        ((tries < 5)) || fatal "openssl s_server did not start: $(cat "$WORK/dhe.log")"
    done
    sub=$(subscribe_active "$KEY" "$(subscription_json tls.dhe "https://localhost:$port/$(own_id)")") ||
        fail "the probe of the dhe subscription did not finish"
    produce --topic "$TOPIC" --tenant "$TENANT" --count 1 --id-prefix dhe- \
        --type studio.lerian.tls.dhe >/dev/null
    wait_until 30 "[[ -n \$(attempt_errors $sub) ]]" || fail "no attempt was made"
    assert_eq tls:1 "$(attempt_errors "$sub")" "a DHE-only destination fails the attempt with tls"
}

scenarios_main "$@"
