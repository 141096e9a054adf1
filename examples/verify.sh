#!/usr/bin/env bash
# verify.sh SECRET WEBHOOK_ID TIMESTAMP BODY_FILE [SIGNATURE]
#
# Computes the Standard Webhooks signature streaming-hub puts in
# webhook-signature ("v1,<base64 HMAC-SHA256(key, id.timestamp.body)>", key =
# base64-decoded part of the whsec_ secret) and, given SIGNATURE (the header
# value), says whether one of its entries matches.  The reference vector:
#   printf '{"test": 2432232314}' >b.json
#   examples/verify.sh whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw msg_p5jXN8AQM9LWM0D4loKWxJek 1614265330 b.json
#   → v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=
set -euo pipefail
(($# >= 4)) || { sed -n '2,12p' "$0" >&2; exit 2; }
key_hex=$(printf '%s' "${1#whsec_}" | base64 -d | od -An -tx1 | tr -d ' \n')
sig="v1,$( { printf '%s.%s.' "$2" "$3"; cat "$4"; } |
    openssl dgst -sha256 -mac HMAC -macopt "hexkey:$key_hex" -binary | base64)"
echo "$sig"
if (($# >= 5)); then
    for entry in $5; do
        [[ $entry == "$sig" ]] && { echo "valid"; exit 0; }
    done
    echo "INVALID" >&2
    exit 1
fi
