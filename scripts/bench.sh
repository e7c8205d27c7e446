#!/usr/bin/env bash
# Throughput/latency of POST /b2b/orders under wrk, printed as a Markdown table for BENCHMARKS.md.
#
#   ORDERLY_BIN=path/to/orderly BENCH_SECONDS=10 scripts/bench.sh [--database-url URL]
#
# With --database-url (a maintenance URL of a PostgreSQL server) the server runs on a fresh
# database of that server (dropped afterwards) instead of a sled data dir.
#
# Starts a server on a scratch data dir (127.0.0.1, random port), creates 100 accounts with a
# balance of 10^12, one product priced 1, and a pool of 1000 existing orders (one per key). Then,
# at 1, 16 and 64 connections (wrk -t2, or -t1 for one connection), BENCH_SECONDS each:
#   a) new orders, unique keys, spread over the 100 accounts
#   b) new orders, unique keys, all on one account (hot balance row)
#   c) replays only: the 1000 pool keys round-robin
#   d) 90% replays of pool keys, 10% new orders
# BENCH_SERVER_FLAGS adds serve flags (e.g. "--fulfillment-delay 1h").
# "errors" = non-200 answers + socket errors (connect/read/write/timeout); "replayed" = answers
# carrying Idempotency-Replayed: true. Finally every account's ledger (all pages) must sum to its
# balance; exits non-zero if not, or if any run had errors. Without ORDERLY_BIN it runs
# `cargo build --release` first. Full wrk output stays in the scratch dir with KEEP_WORK=1.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

DATABASE_URL=
if [ "${1:-}" = --database-url ]; then
  DATABASE_URL=${2:?--database-url needs a URL}
  shift 2
fi
BENCH_SECONDS=${BENCH_SECONDS:-10}
CONNS=${BENCH_CONNS:-"1 16 64"}
resolve_bin
ensure_wrk
make_work

engine=()
if [ -n "$DATABASE_URL" ]; then
  bench_db=orderly_bench_$$
  PGOPTIONS="-c client_min_messages=warning" psql "$DATABASE_URL" -qAt -v ON_ERROR_STOP=1 \
    -c "DROP DATABASE IF EXISTS $bench_db" -c "CREATE DATABASE $bench_db" >/dev/null
  engine=(--database-url "$(python3 -c 'import sys, urllib.parse as u; p = u.urlsplit(sys.argv[1]); print(u.urlunsplit(p._replace(path="/" + sys.argv[2])))' "$DATABASE_URL" "$bench_db")")
fi
# shellcheck disable=SC2086  # BENCH_SERVER_FLAGS is a list of flags
start_server "$WORK/db" "$WORK/server" "${engine[@]}" ${BENCH_SERVER_FLAGS:-}
log "server $SERVER_PID at $BASE_URL; creating 100 accounts and a pool of 1000 orders"
"${CLIENT[@]}" setup --base "$BASE_URL" --token "$ADMIN_TOKEN" --accounts 100 --out "$WORK/accounts.tsv"
"${CLIENT[@]}" precreate --base "$BASE_URL" --accounts "$WORK/accounts.tsv" --count 1000 \
  --prefix pool --out "$WORK/pool.tsv"

declare -A LABEL=([new]="a) new orders, 100 accounts" [hot]="b) new orders, 1 hot account"
                  [replay]="c) replays only" [mix]="d) 90% replay / 10% new")
run_id=$(date +%s)-$$
rows=()
errors_total=0
for mode in new hot replay mix; do
  for c in $CONNS; do
    t=$(( c < 2 ? 1 : 2 ))
    out=$WORK/wrk-$mode-$c.txt
    log "$mode, $c connections, ${BENCH_SECONDS}s"
    timeout $((BENCH_SECONDS + 30)) wrk -t"$t" -c"$c" -d"${BENCH_SECONDS}s" --latency \
      -s "$SCRIPTS_DIR/orders.lua" "$BASE_URL/b2b/orders" \
      -- "$mode" "$WORK/accounts.tsv" "$WORK/pool.tsv" "b-$run_id-$mode-$c" >"$out" 2>&1 \
      || { cat "$out" >&2; die "wrk failed ($mode, $c)"; }
    grep -q '^RESULT ' "$out" || { cat "$out" >&2; die "no RESULT line from wrk"; }
    req=$(result_field requests "$out")
    err=$(( $(result_field non200 "$out") + $(result_field sock_errors "$out") ))
    errors_total=$((errors_total + err))
    replayed=$(awk -v r="$(result_field replayed "$out")" -v n="$req" \
      'BEGIN { printf "%.0f%%", n ? 100 * r / n : 0 }')
    rows+=("| ${LABEL[$mode]} | $c | $(result_field rps "$out") | $(result_field p50_ms "$out") \
| $(result_field p99_ms "$out") | $err | $replayed |")
  done
done

log "checking every account's ledger against its balance"
ledger_ok=1
"${CLIENT[@]}" verify --base "$BASE_URL" --accounts "$WORK/accounts.tsv" >"$WORK/verify.txt" || ledger_ok=0
cat "$WORK/verify.txt" >&2
stop_server "$SERVER_PID"
if [ -n "$DATABASE_URL" ]; then
  psql "$DATABASE_URL" -qAt -c "DROP DATABASE IF EXISTS $bench_db WITH (FORCE)" >/dev/null || true
fi

echo
echo "POST /b2b/orders, ${BENCH_SECONDS}s per run, $(nproc) CPUs, wrk on the same host," \
  "$(date -u +%Y-%m-%d), $(basename "$ORDERLY") on $([ -n "$DATABASE_URL" ] && echo PostgreSQL || echo sled)"
echo
echo "| scenario | connections | requests/s | p50 ms | p99 ms | errors | replayed |"
echo "|---|---:|---:|---:|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
echo
tail -1 "$WORK/verify.txt"
[ "$ledger_ok" = 1 ] || die "ledger does not match the balance"
[ "$errors_total" -eq 0 ] || die "$errors_total errors during the runs"
