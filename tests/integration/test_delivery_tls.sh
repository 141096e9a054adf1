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
NG=$WORK/nginx
mkdir -p "$NG/tmp"
for _ in 1 2 3 4 5 6 7 8; do
    PORT=$((20000 + RANDOM % 30000))
    port_in_use "$PORT" || break
done
cat >"$NG/nginx.conf" <<EOF
worker_processes 1;
daemon off;
master_process off;
pid $NG/nginx.pid;
error_log $NG/error.log warn;
events { worker_connections 256; }
http {
    client_body_temp_path $NG/tmp/body;
    proxy_temp_path $NG/tmp/proxy;
    fastcgi_temp_path $NG/tmp/fastcgi;
    uwsgi_temp_path $NG/tmp/uwsgi;
    scgi_temp_path $NG/tmp/scgi;
    log_format p '\$server_protocol \$uri \$http_x_lerian_event_id';
    access_log $NG/access.log p;
    server {
        listen 127.0.0.1:$PORT ssl http2;
        ssl_certificate $PKI/srv.pem;
        ssl_certificate_key $PKI/srv.key;
        location / { return 200 "ok"; }
    }
}
EOF
nginx -p "$NG" -c "$NG/nginx.conf" >>"$NG/stdout.log" 2>&1 &
track_pid $!
wait_until 10 "port_in_use $PORT" || { cat "$NG/error.log" >&2; fatal "nginx did not start"; }
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

# 2. a certificate for another name: the attempt fails with "tls"
produce --topic lerian.streaming.tls --tenant acme --count 1 --id-prefix name- \
    --type studio.lerian.tls.name >/dev/null
wait_until 30 "[[ \$(attempt_errors $BAD_ID) == tls:1 ]]" ||
    fail "a name mismatch did not fail with tls: '$(attempt_errors "$BAD_ID")'"
assert_eq 0 "$(requests /name)" "nothing reached the destination under the wrong name"

# 3. the hub without the test CA (the system bundle only): "tls" too
hub_stop
hub_start "${HUB_ENV[@]}"
UNTRUSTED_ID=$(subscribe_active "$KEY" "$(subscription_json tls.untrusted "https://localhost:$PORT/untrusted")") ||
    fail "the probe of the untrusted subscription did not finish"
produce --topic lerian.streaming.tls --tenant acme --count 1 --id-prefix unt- \
    --type studio.lerian.tls.untrusted >/dev/null
wait_until 30 "[[ \$(attempt_errors $UNTRUSTED_ID) == tls:1 ]]" ||
    fail "an unknown CA did not fail with tls: '$(attempt_errors "$UNTRUSTED_ID")'"
assert_eq 0 "$(requests /untrusted)" "nothing reached the destination without a trusted chain"

hub_test_done
