#!/usr/bin/env bash
# Soak: a steady, modest order load for a long time; does memory or disk grow without bound?
#
#   ORDERLY_BIN=path/to/orderly scripts/soak.sh [SECONDS]     (default 600)
#   env: SOAK_CONNS (4), SOAK_DELAY_MS (10: pause per connection between requests, so at most
#        SOAK_CONNS*1000/SOAK_DELAY_MS requests/s), SOAK_SAMPLE (30: seconds per sample),
#        SOAK_CACHE_MB (64: sled's page-cache size)
#
# Starts a server with --idempotency-ttl 60s --sweep-interval 15s --cache-mb $SOAK_CACHE_MB and 10 accounts
# (balance 10^12). wrk (one thread per connection) runs orders.lua in soak mode: 9 in 10
# requests replay one of that connection's last 200 orders (well inside the TTL), 1 in 10 is a
# new order with a fresh key. The load runs in SOAK_SAMPLE-second wrk segments; after each, the
# server's VmRSS and `du -sk` of the data dir are sampled and a Markdown table row printed.
# At the end every account's ledger must sum to its balance; exits non-zero if not, or if any
# request failed or a replay of a live key was answered as a new order ("stale").
# Without ORDERLY_BIN it runs `cargo build --release` first.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

SOAK_SECONDS=${1:-600}
CONNS=${SOAK_CONNS:-4}
DELAY_MS=${SOAK_DELAY_MS:-10}
SAMPLE=${SOAK_SAMPLE:-30}
resolve_bin
ensure_wrk
make_work

CACHE_MB=${SOAK_CACHE_MB:-64}
start_server "$WORK/db" "$WORK/server" --idempotency-ttl 60s --sweep-interval 15s --cache-mb "$CACHE_MB"
"${CLIENT[@]}" setup --base "$BASE_URL" --token "$ADMIN_TOKEN" --accounts 10 --out "$WORK/accounts.tsv"
log "server $SERVER_PID at $BASE_URL; soaking ${SOAK_SECONDS}s with $CONNS connections"

row() {  # elapsed requests non200 rps p99
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$1" \
    "$(awk -v k="$(rss_kib "$SERVER_PID")" 'BEGIN { printf "%.1f", k / 1024 }')" \
    "$(awk -v k="$(du -sk "$WORK/db" | cut -f1)" 'BEGIN { printf "%.1f", k / 1024 }')" "$2" "$3" "$4" "$5"
}

echo "Soak: ${SOAK_SECONDS}s, $CONNS connections, ${DELAY_MS} ms pause per request, 90% replay;" \
  "--idempotency-ttl 60s --sweep-interval 15s --cache-mb $CACHE_MB; $(nproc) CPUs, $(date -u +%Y-%m-%d)"
echo
echo "| elapsed s | RSS MiB | data dir MiB | requests so far | errors so far | req/s (last segment) | p99 ms (last segment) |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
row 0 0 0 - -

elapsed=0 requests=0 errors=0 stale=0 replayed=0 seg=0
while [ "$elapsed" -lt "$SOAK_SECONDS" ]; do
  seg=$((seg + 1))
  len=$(( SOAK_SECONDS - elapsed < SAMPLE ? SOAK_SECONDS - elapsed : SAMPLE ))
  out=$WORK/wrk-$seg.txt
  timeout $((len + 30)) wrk -t"$CONNS" -c"$CONNS" -d"${len}s" --latency -s "$SCRIPTS_DIR/orders.lua" \
    "$BASE_URL/b2b/orders" -- soak "$WORK/accounts.tsv" - "s-$$-$seg" "$DELAY_MS" >"$out" 2>&1 \
    || { cat "$out" >&2; die "wrk failed in segment $seg"; }
  grep -q '^RESULT ' "$out" || { cat "$out" >&2; die "no RESULT line from wrk"; }
  elapsed=$((elapsed + len))
  requests=$((requests + $(result_field requests "$out")))
  errors=$((errors + $(result_field non200 "$out") + $(result_field sock_errors "$out")))
  stale=$((stale + $(result_field stale "$out")))
  replayed=$((replayed + $(result_field replayed "$out")))
  kill -0 "$SERVER_PID" 2>/dev/null || die "server died"
  row "$elapsed" "$requests" "$errors" "$(result_field rps "$out")" "$(result_field p99_ms "$out")"
done

echo
ok=1
"${CLIENT[@]}" verify --base "$BASE_URL" --accounts "$WORK/accounts.tsv" || ok=0
echo "answers with Idempotency-Replayed: $replayed of $requests; replays answered as new orders (stale): $stale"
stop_server "$SERVER_PID"
echo
echo "rows per keyspace after the run (orderly stats): orders, ledger and events are permanent;"
echo "the idempotency rows live --idempotency-ttl and are swept every --sweep-interval"
echo
echo "| keyspace | rows |"
echo "|---|---:|"
"$ORDERLY" stats --data-dir "$WORK/db" | awk -F'\t' '{ printf "| %s | %s |\n", $1, $2 }'
[ "$ok" = 1 ] || die "ledger does not match the balance"
[ "$errors" -eq 0 ] || die "$errors failed requests"
[ "$stale" -eq 0 ] || die "$stale replays of live keys created new orders"
