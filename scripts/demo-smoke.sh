#!/usr/bin/env bash
# Runs the README's first command in a scratch copy of data/ and places one order with the
# printed demo key, so "it works on a fresh machine exactly as written" is checked, not hoped.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --quiet
scratch=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$scratch"' EXIT
mkdir -p "$scratch/data" && cp data/demo.json "$scratch/data/"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
(cd "$scratch" && exec "$OLDPWD/target/release/orderly" serve --demo --listen "127.0.0.1:$port" >"$scratch/out" 2>"$scratch/err") &
pid=$!
for _ in $(seq 1 50); do
  curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break
  sleep 0.2
done
key=$(grep -o 'gc_live_[0-9a-f]\{32\}' "$scratch/out" | head -1)
[ -n "$key" ] || { echo "demo printed no partner key"; cat "$scratch/out" "$scratch/err"; exit 1; }
order='{"items":[{"productId":"prd_uc_660","quantity":2,"deliveryData":{"username":"@Player1"}}]}'
call() {
  curl -s -o "$scratch/body" -D "$scratch/headers" -w '%{http_code}' \
    -X POST "http://127.0.0.1:$port/b2b/orders" -H "X-Api-Key: $key" \
    -H 'Content-Type: application/json' -H 'X-Idempotency-Key: smoke-1' -d "$order"
}
first=$(call); first_body=$(cat "$scratch/body")
second=$(call); second_body=$(cat "$scratch/body")
[ "$first" = 200 ] && [ "$second" = 200 ] || { echo "order answered $first then $second"; cat "$scratch/body"; exit 1; }
[ "$first_body" = "$second_body" ] || { echo "the replay differs from the first answer"; exit 1; }
grep -qi '^idempotency-replayed: true' "$scratch/headers" || { echo "the replay lacks Idempotency-Replayed"; exit 1; }
echo "smoke: 1 passed, 0 failed"
