#!/usr/bin/env bash
# Runs the README's first command exactly as written (read from README.md, not copied here),
# from the checkout, with its data directory and listen address moved by their environment
# variables so a developer's data/db and port 8080 are untouched. Waits for the printed demo
# key, places an order, replays it, stops the server and expects exit 0.
set -euo pipefail
cd "$(dirname "$0")/.."

command=$(bash scripts/readme-commands.sh 1)
echo "smoke: running the README's first command: $command"
scratch=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill -TERM -- "-$pid" 2>/dev/null
  wait 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
# setsid: the command gets a process group of its own, so stopping it stops whatever it
# started (cargo replaces itself with the binary on Unix, but the README may change).
ORDERLY_DATA_DIR="$scratch/db" ORDERLY_LISTEN=127.0.0.1:0 \
  setsid bash -c "$command" >"$scratch/out" 2>"$scratch/err" &
pid=$!
# cargo may have to build first: wait on the listening line while the command is alive.
deadline=$((SECONDS + 1200))
until grep -q '^orderly listening on ' "$scratch/out" 2>/dev/null; do
  kill -0 "$pid" 2>/dev/null || { echo "the command exited before listening"; tail -30 "$scratch/err"; exit 1; }
  [ "$SECONDS" -lt "$deadline" ] || { echo "no listening line within 20 minutes"; tail -30 "$scratch/err"; exit 1; }
  sleep 0.2
done
base=$(sed -n 's/^orderly listening on //p' "$scratch/out" | head -1)
key=$(grep -o 'gc_live_[0-9a-f]\{32\}' "$scratch/out" | head -1 || true)
[ -n "$key" ] || { echo "demo printed no partner key"; cat "$scratch/out" "$scratch/err"; exit 1; }
[ -d "$scratch/db" ] || { echo "the demo did not use ORDERLY_DATA_DIR"; exit 1; }
echo "smoke: listening on $base, demo key $key"
order='{"items":[{"productId":"prd_uc_660","quantity":2,"deliveryData":{"username":"@Player1"}}]}'
call() {
  curl -s -o "$scratch/body" -D "$scratch/headers" -w '%{http_code}' \
    -X POST "$base/b2b/orders" -H "X-Api-Key: $key" \
    -H 'Content-Type: application/json' -H 'X-Idempotency-Key: smoke-1' -d "$order"
}
first=$(call); first_body=$(cat "$scratch/body")
second=$(call); second_body=$(cat "$scratch/body")
[ "$first" = 200 ] && [ "$second" = 200 ] || { echo "order answered $first then $second"; cat "$scratch/body"; exit 1; }
[ "$first_body" = "$second_body" ] || { echo "the replay differs from the first answer"; exit 1; }
grep -qi '^idempotency-replayed: true' "$scratch/headers" || { echo "the replay lacks Idempotency-Replayed"; exit 1; }
echo "smoke: order 200, replay 200 with Idempotency-Replayed and the same body"
kill -TERM -- "-$pid"
rc=0
wait "$pid" || rc=$?
pid=
[ "$rc" = 0 ] || { echo "the server exited $rc after SIGTERM (expected 0)"; tail -20 "$scratch/err"; exit 1; }
echo "smoke: 1 passed, 0 failed"
