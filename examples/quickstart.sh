#!/usr/bin/env bash
# quickstart.sh — one event from Kafka to a verified webhook receiver.
#
# Start the hub first, in another terminal (dev mode allows the loopback
# receiver this script starts):
#   scripts/dev
# then, from the repository root:
#   examples/quickstart.sh
# Needs curl, kcat (installed by scripts/install-deps) and node (receiver.js).
set -euo pipefail
cd "$(dirname "$0")/.."
HUB=${HUB:-http://127.0.0.1:8080}
PORT=${PORT:-9000}
TOKEN=$(sed -n 's/^STREAMING_HUB_ADMIN_TOKEN=//p' var/dev.env)
BOOTSTRAP=$(cat var/kafka.bootstrap)
TENANT=${TENANT:-acme}
field() { sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p"; }

curl -s -o /dev/null -H "Authorization: Bearer $TOKEN" -d "{\"id\":\"$TENANT\"}" "$HUB/admin/tenants"
KEY=$(curl -s -X POST -H "Authorization: Bearer $TOKEN" "$HUB/admin/tenants/$TENANT/api-keys" | field key)
echo "tenant $TENANT, API key ${KEY:0:12}…"

# the secret is only known once the subscription exists, and the receiver
# must be up to answer the verification probe: create, then start, then verify
SUB=$(curl -s -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
    -d "{\"event_types\":[\"transaction.*\"],\"destination\":{\"kind\":\"webhook\",\"url\":\"http://127.0.0.1:$PORT/hook\"}}" \
    "$HUB/v1/subscriptions")
ID=$(field id <<<"$SUB")
SECRET=$(field secret <<<"$SUB")
echo "subscription $ID"
WEBHOOK_SECRET=$SECRET node examples/receiver.js "$PORT" &
RECEIVER=$!
trap 'kill $RECEIVER 2>/dev/null' EXIT
sleep 1
curl -s -X POST -H "Authorization: Bearer $KEY" "$HUB/v1/subscriptions/$ID/verify" | grep -o '"verification_state":"[a-z]*"'

echo '{"amount": 1200, "currency": "BRL"}' | kcat -P -b "$BOOTSTRAP" -t lerian.streaming.ledger \
    -H ce-specversion=1.0 -H "ce-id=tx-$(date +%s%N)" -H ce-source=/ledger \
    -H ce-type=studio.lerian.transaction.posted -H "ce-time=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    -H "ce-tenantid=$TENANT" -H content-type=application/json
echo "event produced; waiting for the delivery (the consumer group's first join takes ~3 s)"

# the same kind of event over HTTP (binary mode): answered once it is stored
curl -s -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
    -H ce-specversion:1.0 -H "ce-id:tx-http-$(date +%s%N)" -H ce-source:/ledger \
    -H ce-type:studio.lerian.transaction.posted -H "ce-time:$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    -d '{"amount": 800, "currency": "BRL"}' "$HUB/v1/events"
echo
sleep 6
