#!/usr/bin/env bash
# Deliveries over TLS (SPEC §7.1, §11): HTTP/2 negotiated by ALPN with an
# https destination, certificate verification always on — a certificate for
# another name, or from a CA the hub does not trust, fails the attempt with
# error "tls" and nothing reaches the destination.  The destination is a real
# nginx (ssl + http2) with a certificate from a CA made here; the hub trusts
# that CA through STREAMING_HUB_DELIVERY_CA_FILE.
set -uo pipefail
source "$(dirname "$0")/../support/lib.sh"
source "$(dirname "$0")/../support/delivery.sh"
source "$(dirname "$0")/../support/nginx.sh"
hub_test_init

# --- a CA, and a certificate for "localhost" only ----------------------------
PKI=$WORK/pki
mkdir -p "$PKI"
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$PKI/ca.key" -out "$PKI/ca.pem" -days 2 \
    -subj "/CN=streaming-hub test CA" 2>/dev/null || fatal "cannot make the CA"
openssl req -newkey rsa:2048 -nodes -keyout "$PKI/srv.key" -out "$PKI/srv.csr" \
    -subj "/CN=localhost" 2>/dev/null || fatal "cannot make the server key"
printf 'subjectAltName=DNS:localhost\n' >"$PKI/ext.cnf"
openssl x509 -req -in "$PKI/srv.csr" -CA "$PKI/ca.pem" -CAkey "$PKI/ca.key" -CAcreateserial \
    -out "$PKI/srv.pem" -days 2 -extfile "$PKI/ext.cnf" 2>/dev/null || fatal "cannot sign the certificate"

# --- nginx: TLS + HTTP/2, logging the protocol of every request --------------
nginx_run "ssl http2" \
    "ssl_certificate $PKI/srv.pem; ssl_certificate_key $PKI/srv.key;
    location / { return 200 \"ok\"; }" \
    "log_format p '\$server_protocol \$uri \$http_x_lerian_event_id'; access_log $WORK/nginx/access.log p;"
NG=$NGINX_DIR
PORT=$NGINX_PORT
: >"$NG/access.log"
# requests PATH [ID_PREFIX]: requests nginx logged for PATH (whose event id
# starts with ID_PREFIX: the verification probe is not an event delivery)
requests() { grep -c " $1 ${2:-}" "$NG/access.log" 2>/dev/null || true; }

KEK=$(head -c 32 /dev/urandom | base64)
pg_start
kafka_start --topic lerian.streaming.tls:2
HUB_ENV=(STREAMING_HUB_KEK="$KEK" STREAMING_HUB_ALLOW_PRIVATE_SINKS=true
    STREAMING_HUB_RETRY_SCHEDULE=1h STREAMING_HUB_DELIVERY_TIMEOUT=5s)
hub_start "${HUB_ENV[@]}" STREAMING_HUB_DELIVERY_CA_FILE="$PKI/ca.pem"

tenant_create acme
KEY=$(tenant_key acme)
[[ -n $KEY ]] || fatal "no API key"
# nginx cannot echo the challenge: the subscriptions are activated by hand
OK_ID=$(subscribe_active "$KEY" "$(subscription_json tls.ok "https://localhost:$PORT/ok")") ||
    fail "the probe of the TLS subscription did not finish"
BAD_ID=$(subscribe_active "$KEY" "$(subscription_json tls.name "https://127.0.0.1:$PORT/name")") ||
    fail "the probe of the wrong-name subscription did not finish"
attempt_errors() { # ID → "error:count ..." of its attempts
    psql_q "SELECT coalesce(string_agg(e || ':' || n, ' ' ORDER BY e), '') FROM (
              SELECT coalesce(a.error, 'none') e, count(*) n FROM delivery_attempts a
                JOIN delivery_jobs j ON j.id = a.job_id WHERE j.subscription_id = '$1' GROUP BY 1) x"
}

# 1. trusted CA, matching name: delivered, over HTTP/2
produce --topic lerian.streaming.tls --tenant acme --count 5 --id-prefix ok- \
    --type studio.lerian.tls.ok >/dev/null
wait_until 30 "(( \$(requests /ok ok-) >= 5 ))" || fail "the TLS deliveries did not arrive"
sleep 1
assert_eq 5 "$(requests /ok ok-)" "five deliveries reached the TLS destination"
assert_eq 5 "$(grep ' /ok ok-' "$NG/access.log" | grep -c '^HTTP/2.0 ')" "all of them over HTTP/2 (ALPN)"
wait_until 10 "[[ \$(attempt_errors $OK_ID) == none:5 ]]" ||
    fail "the TLS attempts are not all recorded as successes: $(attempt_errors "$OK_ID")"

# expect_refused ID TYPE PATH WHY: one event of TYPE for subscription ID
# (destination PATH) fails its attempt with "tls" and never arrives
expect_refused() {
    produce --topic lerian.streaming.tls --tenant acme --count 1 --id-prefix "$2-" \
        --type "studio.lerian.tls.$2" >/dev/null
    wait_until 30 "[[ \$(attempt_errors $1) == tls:1 ]]" ||
        fail "$4 did not fail with tls: '$(attempt_errors "$1")'"
    assert_eq 0 "$(requests "$3")" "nothing reached the destination: $4"
}

# 2. a certificate for another name
expect_refused "$BAD_ID" name /name "a name mismatch"

# 3. the hub without the test CA (the system bundle only)
hub_stop
hub_start "${HUB_ENV[@]}"
UNTRUSTED_ID=$(subscribe_active "$KEY" "$(subscription_json tls.untrusted "https://localhost:$PORT/untrusted")") ||
    fail "the probe of the untrusted subscription did not finish"
expect_refused "$UNTRUSTED_ID" untrusted /untrusted "an unknown CA"

hub_test_done
