#!/usr/bin/env bash
# Throughput/latency of POST /b2b/orders under wrk, printed as a Markdown table for docs/benchmarks.md.
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
# --instances N (with --database-url, before it or after): N servers on the one database, and one
# wrk per server at once, each with connections/N of the connections (rows with fewer
# connections than servers are left out); requests/s, errors and replays are summed over the N,
# p50/p99 are the worst of the N. "CPU busy" is each CPU's busy share during the run (/proc/stat),
# "orderly cores" the CPU time of the server processes over the run's length. BENCH_SERVER_CPUS / BENCH_WRK_CPUS: a CPU list for taskset
# (e.g. 1) to pin the servers / the load generators to.
# "errors" = non-200 answers + socket errors (connect/read/write/timeout); "replayed" = answers
# carrying Idempotency-Replayed: true. Finally every account's ledger (all pages) must sum to its
# balance; exits non-zero if not, or if any run had errors. Without ORDERLY_BIN it runs
# `cargo build --release` first. Full wrk output stays in the scratch dir with KEEP_WORK=1.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

DATABASE_URL=
INSTANCES=1
while [ $# -gt 0 ]; do
  case $1 in
    --database-url) DATABASE_URL=${2:?--database-url needs a URL}; shift 2 ;;
    --instances) INSTANCES=${2:?--instances needs a number}; shift 2 ;;
    *) echo "usage: bench.sh [--database-url URL] [--instances N]" >&2; exit 2 ;;
  esac
done
[ "$INSTANCES" -ge 1 ] || { echo "--instances must be at least 1" >&2; exit 2; }
[ "$INSTANCES" -eq 1 ] || [ -n "$DATABASE_URL" ] || {
  echo "--instances N > 1 needs --database-url (sled is one process)" >&2; exit 2; }
server_pin=()
[ -z "${BENCH_SERVER_CPUS:-}" ] || server_pin=(taskset -c "$BENCH_SERVER_CPUS")
wrk_pin=()
[ -z "${BENCH_WRK_CPUS:-}" ] || wrk_pin=(taskset -c "$BENCH_WRK_CPUS")
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
  engine=(--database-url "$(database_url "$DATABASE_URL" "$bench_db")")
fi
ORDERLY_WRAP=("${server_pin[@]}")
BASE_URLS=()
BENCH_PIDS=()
for i in $(seq 1 "$INSTANCES"); do
  # shellcheck disable=SC2086  # BENCH_SERVER_FLAGS is a list of flags
  start_server "$WORK/db" "$WORK/server-$i" "${engine[@]}" ${BENCH_SERVER_FLAGS:-}
  BASE_URLS+=("$BASE_URL")
  BENCH_PIDS+=("$SERVER_PID")
done
BASE_URL=${BASE_URLS[0]}
log "server(s) ${BENCH_PIDS[*]} at ${BASE_URLS[*]}; creating 100 accounts and a pool of 1000 orders"
"${CLIENT[@]}" setup --base "$BASE_URL" --token "$ADMIN_TOKEN" --accounts 100 --out "$WORK/accounts.tsv"
"${CLIENT[@]}" precreate --base "$BASE_URL" --accounts "$WORK/accounts.tsv" --count 1000 \
  --prefix pool --out "$WORK/pool.tsv"

# server_ticks: CPU time (user + system, in clock ticks) of the server processes so far.
server_ticks() {
  local pid total=0
  for pid in "${BENCH_PIDS[@]}"; do
    total=$(( total + $(awk '{ print $14 + $15 }' "/proc/$pid/stat" 2>/dev/null || echo 0) ))
  done
  echo "$total"
}

declare -A LABEL=([new]="a) new orders, 100 accounts" [hot]="b) new orders, 1 hot account"
                  [replay]="c) replays only" [mix]="d) 90% replay / 10% new")
run_id=$(date +%s)-$$
rows=()
errors_total=0
for mode in new hot replay mix; do
  for c in $CONNS; do
    [ "$c" -ge "$INSTANCES" ] || continue
    per=$(( c / INSTANCES ))
    t=$(( per < 2 ? 1 : 2 ))
    log "$mode, $c connections over $INSTANCES server(s), ${BENCH_SECONDS}s"
    wrk_pids=()
    cpu_before=$(grep '^cpu[0-9]' /proc/stat)
    server_before=$(server_ticks)
    for i in $(seq 1 "$INSTANCES"); do
      out=$WORK/wrk-$mode-$c-$i.txt
      timeout $((BENCH_SECONDS + 30)) "${wrk_pin[@]}" wrk -t"$t" -c"$per" -d"${BENCH_SECONDS}s" \
        --latency -s "$SCRIPTS_DIR/orders.lua" "${BASE_URLS[$((i - 1))]}/b2b/orders" \
        -- "$mode" "$WORK/accounts.tsv" "$WORK/pool.tsv" "b-$run_id-$mode-$c-$i" >"$out" 2>&1 &
      wrk_pids+=($!)
    done
    for i in $(seq 1 "$INSTANCES"); do
      out=$WORK/wrk-$mode-$c-$i.txt
      wait "${wrk_pids[$((i - 1))]}" || { cat "$out" >&2; die "wrk failed ($mode, $c, server $i)"; }
      grep -q '^RESULT ' "$out" || { cat "$out" >&2; die "no RESULT line from wrk"; }
    done
    cpu_busy=$(paste <(echo "$cpu_before") <(grep '^cpu[0-9]' /proc/stat) | awk '{
      n = (NF - 2) / 2; b0 = 0; t0 = 0; b1 = 0; t1 = 0
      for (i = 2; i <= n + 1; i++) { t0 += $i; t1 += $(i + n + 1) }
      idle0 = $5 + $6; idle1 = $(5 + n + 1) + $(6 + n + 1)
      printf "%s%s %.0f%%", (NR > 1 ? ", " : ""), $1, 100 * (1 - (idle1 - idle0) / (t1 - t0)) }')
    # Cores the server processes kept busy, on average over the run.
    server_cores=$(awk -v a="$server_before" -v b="$(server_ticks)" -v hz="$(getconf CLK_TCK)" \
      -v s="$BENCH_SECONDS" 'BEGIN { printf "%.2f", (b - a) / hz / s }')
    outs=("$WORK"/wrk-"$mode"-"$c"-*.txt)
    sum() { local f total=0; for f in "${outs[@]}"; do total=$(awk -v a="$total" -v b="$(result_field "$1" "$f")" 'BEGIN { print a + b }'); done; echo "$total"; }
    worst() { local f m=0; for f in "${outs[@]}"; do m=$(awk -v a="$m" -v b="$(result_field "$1" "$f")" 'BEGIN { print (b > a ? b : a) }'); done; echo "$m"; }
    req=$(sum requests)
    err=$(( $(sum non200) + $(sum sock_errors) ))
    errors_total=$((errors_total + err))
    replayed=$(awk -v r="$(sum replayed)" -v n="$req" 'BEGIN { printf "%.0f%%", n ? 100 * r / n : 0 }')
    rps=$(awk -v r="$(sum rps)" 'BEGIN { printf "%.1f", r }')
    rows+=("| ${LABEL[$mode]} | $c | $rps | $(worst p50_ms) | $(worst p99_ms) | $err | $replayed | $cpu_busy | $server_cores |")
  done
done

log "checking every account's ledger against its balance"
ledger_ok=1
"${CLIENT[@]}" verify --base "$BASE_URL" --accounts "$WORK/accounts.tsv" >"$WORK/verify.txt" || ledger_ok=0
cat "$WORK/verify.txt" >&2
for pid in "${BENCH_PIDS[@]}"; do stop_server "$pid"; done
if [ -n "$DATABASE_URL" ]; then
  psql "$DATABASE_URL" -qAt -c "DROP DATABASE IF EXISTS $bench_db WITH (FORCE)" >/dev/null || true
fi

echo
echo "POST /b2b/orders, ${BENCH_SECONDS}s per run, $(nproc) CPUs, wrk on the same host," \
  "$(date -u +%Y-%m-%d), $(basename "$ORDERLY") on $([ -n "$DATABASE_URL" ] && echo PostgreSQL || echo sled)," \
  "$INSTANCES server process(es)${BENCH_SERVER_CPUS:+ on CPU $BENCH_SERVER_CPUS}${BENCH_WRK_CPUS:+, wrk on CPU $BENCH_WRK_CPUS}"
echo
echo "| scenario | connections | requests/s | p50 ms | p99 ms | errors | replayed | CPU busy | orderly cores |"
echo "|---|---:|---:|---:|---:|---:|---:|---|---:|"
printf '%s\n' "${rows[@]}"
echo
tail -1 "$WORK/verify.txt"
[ "$ledger_ok" = 1 ] || die "ledger does not match the balance"
[ "$errors_total" -eq 0 ] || die "$errors_total errors during the runs"
