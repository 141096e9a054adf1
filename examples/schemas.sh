#!/usr/bin/env bash
# schemas.sh — register a schema for an event type, send one event that
# matches it and one that does not, and look at the quarantined one
# (docs/schemas.md).
#
# Start the hub first, in another terminal:
#   scripts/dev
# then, from the repository root:
#   examples/schemas.sh
# Needs curl.
set -euo pipefail
cd "$(dirname "$0")/.."
HUB=${HUB:-http://127.0.0.1:8080}
TOKEN=$(sed -n 's/^STREAMING_HUB_ADMIN_TOKEN=//p' var/dev.env)
TENANT=${TENANT:-acme}
field() { sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p"; }
admin() { curl -s -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' "$@"; }

admin -o /dev/null -d "{\"id\":\"$TENANT\"}" "$HUB/admin/tenants"
KEY=$(admin -X POST "$HUB/admin/tenants/$TENANT/api-keys" | field key)

echo "== register transaction.posted 1.0.0 for every tenant (the platform's schema)"
admin -X PUT --data-binary @- "$HUB/admin/schemas/transaction.posted/1.0.0" <<'EOF'
{"type": "object",
 "required": ["amount", "currency"],
 "properties": {
   "amount":   {"type": "integer", "minimum": 0},
   "currency": {"type": "string", "pattern": "^[A-Z]{3}$"}}}
EOF
echo
# a change made on this process is in use on every process within ~300 ms
sleep 0.5

post() { # post ID JSON: a binary-mode event of transaction.posted, major 1
    curl -s -w ' -> HTTP %{http_code}\n' -H "Authorization: Bearer $KEY" \
        -H 'Content-Type: application/json' -H ce-specversion:1.0 -H "ce-id:$1" \
        -H ce-source:/ledger -H ce-type:studio.lerian.transaction.posted \
        -H ce-schemaversion:1.0.0 -H "ce-time:$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
        -d "$2" "$HUB/v1/events"
}

echo "== a payload that matches: stored (202)"
post "tx-ok-$(date +%s%N)" '{"amount": 1200, "currency": "BRL"}'

echo "== amount as a string and a lower-case currency: quarantined (422, errors by JSON pointer)"
post "tx-bad-$(date +%s%N)" '{"amount": "1200", "currency": "brl"}'

echo "== the quarantine, with the evidence (schema version, digest, first errors)"
admin "$HUB/admin/quarantine?tenant=$TENANT&reason=schema_violation&limit=1"
echo

echo "== a breaking minor is refused (409 names each change)"
admin -X PUT -d '{"type":"object","required":["amount","currency","account"],"properties":{"amount":{"type":"integer","minimum":0},"currency":{"type":"string","pattern":"^[A-Z]{3}$"},"account":{"type":"string"}}}' \
    "$HUB/admin/schemas/transaction.posted/1.1.0"
echo
echo "== ... and is free as a new major"
admin -X PUT -d '{"type":"object","required":["amount","currency","account"],"properties":{"amount":{"type":"integer","minimum":0},"currency":{"type":"string","pattern":"^[A-Z]{3}$"},"account":{"type":"string"}}}' \
    "$HUB/admin/schemas/transaction.posted/2.0.0"
echo
echo "== what a consumer of $TENANT can fetch"
curl -s -H "Authorization: Bearer $KEY" "$HUB/v1/schemas"
echo
