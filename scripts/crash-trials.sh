#!/usr/bin/env bash
# kill -9 under load: does every acknowledged order survive, exactly once?
#
#   ORDERLY_BIN=path/to/orderly scripts/crash-trials.sh [--database-url URL] [N]
#                                                   (N trials, default 3)
#
# With --database-url (a maintenance URL of a PostgreSQL server: postgres://user@host:port/db)
# each trial runs on a fresh database of that server instead of a fresh sled data dir; the
# restart after the kill uses the same database.
#
# Each trial: a server on a fresh data dir; one account (balance 10^12), a key, product prd_bench
# (price 1); 16 client threads send new orders with unique keys plus ~20% replays of keys already
# acknowledged (checked live), logging every key sent and every key that got a 200 with its order
# id. Between 0.5 and 3 s into the load the server gets SIGKILL. It is restarted on the same data
# dir, and orderly_client.py crash-verify checks through the API:
#   - every acknowledged key replays (same key + body) with Idempotency-Replayed: true to the same
#     order id, and that order is in GET /b2b/orders (otherwise it counts as lost);
#   - the orders that exist are exactly the acknowledged ones plus "committed-unacked" ones (keys
#     in flight at the kill whose replay now says Idempotency-Replayed); no orphan orders;
#   - after replaying every key sent, every key replays to one order and the order count equals
#     the number of distinct keys sent;
#   - the ledger sums to the balance, and the balance is the credit minus one per order.
# Prints one line per trial and finally "N trials, K lost"; exits non-zero if K > 0 or any check
# failed. Without ORDERLY_BIN it runs `cargo build --release` first.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

DATABASE_URL=
if [ "${1:-}" = --database-url ]; then
  DATABASE_URL=${2:?--database-url needs a URL}
  shift 2
fi
N=${1:-3}
CREDIT=1000000000000

# trial_db NAME: a fresh database on the server of $DATABASE_URL; prints its URL.
trial_db() {
  PGOPTIONS="-c client_min_messages=warning" psql "$DATABASE_URL" -qAt -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $1" -c "CREATE DATABASE $1" >/dev/null
  database_url "$DATABASE_URL" "$1"
}
resolve_bin
make_work

lost_total=0
failed=0
for i in $(seq 1 "$N"); do
  dir=$WORK/trial-$i
  mkdir -p "$dir"
  engine=()
  if [ -n "$DATABASE_URL" ]; then
    engine=(--database-url "$(trial_db "orderly_crash_$$_$i")")
  fi
  start_server "$dir/db" "$dir/server-1" "${engine[@]}"
  "${CLIENT[@]}" setup --base "$BASE_URL" --token "$ADMIN_TOKEN" --accounts 1 --balance "$CREDIT" \
    --out "$dir/accounts.tsv"
  api_key=$(cut -f2 "$dir/accounts.tsv")

  "${CLIENT[@]}" crash-load --base "$BASE_URL" --api-key "$api_key" --dir "$dir" \
    --prefix "t$i-$$" --threads 16 --seconds 8 &
  load_pid=$!
  BG_PIDS+=("$load_pid")
  kill_ms=$((500 + RANDOM % 2501))
  sleep "$(printf '%d.%03d' $((kill_ms / 1000)) $((kill_ms % 1000)))"
  crash_server "$SERVER_PID"
  wait "$load_pid" || die "load client failed in trial $i"
  BG_PIDS=()

  start_server "$dir/db" "$dir/server-2" "${engine[@]}"
  if result=$("${CLIENT[@]}" crash-verify --base "$BASE_URL" --api-key "$api_key" --dir "$dir" \
    --credit "$CREDIT"); then verdict=ok; else verdict=FAILED; failed=1; KEEP_WORK=1; fi
  stop_server "$SERVER_PID"
  lost=$(cat "$dir/lost" 2>/dev/null || echo 1)
  lost_total=$((lost_total + lost))
  echo "trial $i: kill -9 at ${kill_ms} ms: $verdict: $result"
  if [ -n "$DATABASE_URL" ] && [ "$verdict" = ok ]; then
    psql "$DATABASE_URL" -qAt -c "DROP DATABASE IF EXISTS orderly_crash_$$_$i WITH (FORCE)" >/dev/null || true
  fi
done

echo "$N trials, $lost_total lost"
[ "$lost_total" -eq 0 ] && [ "$failed" -eq 0 ]
