#!/usr/bin/env bash
# Verifies a webhook from orderly with openssl, for a look by hand (a receiver in production
# uses a Standard Webhooks library: verify.py).
#
#   bash verify.sh SECRET WEBHOOK_ID WEBHOOK_TIMESTAMP WEBHOOK_SIGNATURE BODY_FILE
#
# SECRET is the account's `whsec_...`; the three headers as received; BODY_FILE the raw body.
# Prints "verified" and exits 0 when one of the signatures matches and the timestamp is within
# 5 minutes of this machine's clock; exits 1 otherwise.
set -euo pipefail
secret=$1 id=$2 timestamp=$3 signatures=$4 body=$5

# The key is the bytes of the base64 after `whsec_`, given to openssl as hex.
key=$(printf %s "${secret#whsec_}" | base64 -d | od -An -v -tx1 | tr -d ' \n')
# The signed content: "{webhook-id}.{webhook-timestamp}." and then the body's exact bytes.
expected=$( { printf '%s.%s.' "$id" "$timestamp"; cat "$body"; } \
  | openssl dgst -sha256 -mac HMAC -macopt "hexkey:$key" -binary | base64)

now=$(date +%s)
if [ $((now - timestamp)) -gt 300 ] || [ $((timestamp - now)) -gt 300 ]; then
  echo "refused: webhook-timestamp is more than 5 minutes from now" >&2
  exit 1
fi
# Compared through one more HMAC under a key drawn now, so the comparison of the two values
# takes no time that depends on where they first differ (a constant-time comparison).
nonce=$(openssl rand -hex 32)
blind() { printf %s "$1" | openssl dgst -sha256 -mac HMAC -macopt "hexkey:$nonce" -hex | sed 's/.*= //'; }
want=$(blind "$expected")
# During a rotation's overlap the header holds two signatures, space-separated: either matches.
for signature in $signatures; do
  if [ "$(blind "${signature#v1,}")" = "$want" ]; then
    echo verified
    exit 0
  fi
done
echo "refused: no signature matches" >&2
exit 1
