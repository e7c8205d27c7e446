#!/usr/bin/env bash
# Does orderly keep its speed, size, memory and restart time as its store grows to about a
# million orders? Prints a Markdown table for docs/benchmarks.md.
#
#   ORDERLY_BIN=path/to/orderly scripts/scale.sh [--database-url URL] [--one-line]
#
# The orders are those partners send (scripts/orders.lua's default: 1 to 3 lines with
# deliveryData and an externalOrderId, about 300 bytes, as perf/wrk sends); --one-line places
# the light body older figures were taken with, for comparisons with them only.
#
# On a fresh store (a sled data dir, or with --database-url a fresh database of that PostgreSQL
# server, dropped afterwards): 100 accounts with a balance of 10^12 and products priced 1, then
#   1. new orders over the 100 accounts, MEASURE_SECONDS (10) at CONNS (64): the empty figure;
#   2. FILL_SECONDS (150) more of the same: the fill;
#   3. step 1 again: the full figure;
#   4. the store's size (`du` of the data dir, or pg_database_size) over the orders stored, the
#      server's resident memory now and at its peak (VmRSS, VmHWM); on sled also the bytes the
#      server wrote per order in steps 1 and 3 (/proc/PID/io: passed to write calls, and sent to
#      the disk);
#   4b. ROUNDS (3) rounds, each new orders on a fresh store of a server of its own, then on the
#      full store, MEASURE_SECONDS each: their medians and each round's ratio. The host's speed
#      drifts by more than the store costs between step 1 and step 3, minutes apart; a ratio
#      of measures seconds apart, taken in turns, does not carry that drift;
#   5. kill -9, start again on the same store, and the time to the first /readyz 200;
#   6. every account's ledger against its balance;
#   7. sled only, with COPY=1 and --database-url: the server stopped, `orderly copy` of the store
#      into a fresh database, its wall time and peak resident memory (/usr/bin/time).
# PROFILE=1 records `perf record -g` of the server during steps 1, 3 and 4b (files kept in the
# scratch dir, which is then kept). SERVE_FLAGS adds serve flags.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

DATABASE_URL=
while [ $# -gt 0 ]; do
  case $1 in
    --database-url) DATABASE_URL=${2:?--database-url needs a URL}; shift 2 ;;
    --one-line) export ORDER_BODY=one-line; shift ;;
    *) echo "usage: scale.sh [--database-url URL] [--one-line]" >&2; exit 2 ;;
  esac
done
FILL_SECONDS=${FILL_SECONDS:-150}
MEASURE_SECONDS=${MEASURE_SECONDS:-10}
CONNS=${CONNS:-64}
resolve_bin
ensure_wrk
make_work
[ "${PROFILE:-0}" = 1 ] && KEEP_WORK=1

psql_admin() { PGOPTIONS="-c client_min_messages=warning" psql "$DATABASE_URL" -qAt -v ON_ERROR_STOP=1 "$@"; }

engine=() scale_db= copy_db= round_db=
if [ -n "$DATABASE_URL" ]; then
  scale_db=orderly_scale_$$
  psql_admin -c "DROP DATABASE IF EXISTS $scale_db" -c "CREATE DATABASE $scale_db" >/dev/null
  engine=(--database-url "$(database_url "$DATABASE_URL" "$scale_db")")
fi
# The databases this run made, whatever ended it; cleanup then sees the run's own status.
drop_databases() {
  [ -z "$scale_db" ] || psql_admin -c "DROP DATABASE IF EXISTS $scale_db WITH (FORCE)" >/dev/null || true
  [ -z "$round_db" ] || psql_admin -c "DROP DATABASE IF EXISTS $round_db WITH (FORCE)" >/dev/null || true
  [ -z "$copy_db" ] || PGOPTIONS="-c client_min_messages=warning" psql "$COPY_DATABASE_URL" -qAt \
    -c "DROP DATABASE IF EXISTS $copy_db WITH (FORCE)" >/dev/null || true
}
trap 'rc=$?; drop_databases; (exit "$rc"); cleanup' EXIT

# shellcheck disable=SC2086  # SERVE_FLAGS is a list of flags
serve_flags=(--fulfillment-delay 1h ${SERVE_FLAGS:-})
start_server "$WORK/db" "$WORK/server" "${engine[@]}" "${serve_flags[@]}"
log "server $SERVER_PID at $BASE_URL; creating 100 accounts"
"${CLIENT[@]}" setup --base "$BASE_URL" --token "$ADMIN_TOKEN" --accounts 100 --out "$WORK/accounts.tsv"

# io_counts PID: the bytes the process passed to write calls (wchar) and those it sent to the
# disk (write_bytes, whole pages), so far.
io_counts() { awk '/^(wchar|write_bytes):/ { printf "%s ", $2 }' "/proc/$1/io"; }
# new_orders LABEL SECONDS: wrk new orders over the accounts; leaves wrk's output and the server's
# writes during it (io_counts before and after) in WORK.
run_id=$(date +%s)-$$
new_orders() {
  local label=$1 secs=$2 perf_pid= io_before
  io_before=$(io_counts "$SERVER_PID")
  if [ "${PROFILE:-0}" = 1 ] && [ "$label" != fill ]; then
    perf record -g -F 499 -p "$SERVER_PID" -o "$WORK/perf-$label.data" -- sleep "$secs" \
      >"$WORK/perf-$label.log" 2>&1 &
    perf_pid=$!
  fi
  timeout $((secs + 30)) wrk -t2 -c"$CONNS" -d"${secs}s" --latency -s "$SCRIPTS_DIR/orders.lua" \
    "$BASE_URL/b2b/orders" -- new "${ACCOUNTS_TSV:-$WORK/accounts.tsv}" - "s-$run_id-$label" >"$WORK/wrk-$label.txt" 2>&1 \
    || { cat "$WORK/wrk-$label.txt" >&2; die "wrk failed ($label)"; }
  [ -z "$perf_pid" ] || wait "$perf_pid" || true
  echo "$io_before $(io_counts "$SERVER_PID")" >"$WORK/io-$label.txt"
  grep -q '^RESULT ' "$WORK/wrk-$label.txt" || { cat "$WORK/wrk-$label.txt" >&2; die "no RESULT from wrk ($label)"; }
  local bad=$(( $(result_field non200 "$WORK/wrk-$label.txt") + $(result_field sock_errors "$WORK/wrk-$label.txt") ))
  [ "$bad" -eq 0 ] || die "$bad errors during $label"
}
orders_placed=0
placed() { orders_placed=$(( orders_placed + $(result_field requests "$WORK/wrk-$1.txt") )); }

log "new orders on the empty store, ${MEASURE_SECONDS}s"
new_orders empty "$MEASURE_SECONDS"; placed empty
log "filling for ${FILL_SECONDS}s"
new_orders fill "$FILL_SECONDS"; placed fill
log "new orders on the full store (${orders_placed} orders), ${MEASURE_SECONDS}s"
new_orders full "$MEASURE_SECONDS"; placed full

if [ -n "$DATABASE_URL" ]; then
  bytes=$(psql_admin -c "SELECT pg_database_size('$scale_db')")
else
  bytes=$(du -sb "$WORK/db" | cut -f1)
fi
rss_now=$(rss_kib "$SERVER_PID")
rss_peak=$(awk '/^VmHWM:/ {print $2}' "/proc/$SERVER_PID/status")

# Step 4b. The full server stays up (and its cache warm) while each round's empty store is
# measured on a server of its own, then stopped and removed.
ROUNDS=${ROUNDS:-3}
full_pid=$SERVER_PID full_url=$BASE_URL after_size=0
for r in $(seq 1 "$ROUNDS"); do
  round_engine=()
  if [ -n "$DATABASE_URL" ]; then
    round_db=orderly_scale_${$}_round
    psql_admin -c "DROP DATABASE IF EXISTS $round_db" -c "CREATE DATABASE $round_db" >/dev/null
    round_engine=(--database-url "$(database_url "$DATABASE_URL" "$round_db")")
  fi
  start_server "$WORK/round-db" "$WORK/round-$r" "${round_engine[@]}" "${serve_flags[@]}"
  "${CLIENT[@]}" setup --base "$BASE_URL" --token "$ADMIN_TOKEN" --accounts 100 --out "$WORK/round-accounts.tsv"
  log "round $r: new orders on a fresh store, ${MEASURE_SECONDS}s"
  ACCOUNTS_TSV=$WORK/round-accounts.tsv new_orders "round-$r-empty" "$MEASURE_SECONDS"
  stop_server "$SERVER_PID"
  rm -rf "$WORK/round-db"
  [ -z "$round_db" ] || { psql_admin -c "DROP DATABASE $round_db WITH (FORCE)" >/dev/null; round_db=; }
  SERVER_PID=$full_pid BASE_URL=$full_url
  log "round $r: new orders on the full store, ${MEASURE_SECONDS}s"
  new_orders "round-$r-full" "$MEASURE_SECONDS"
  after_size=$(( after_size + $(result_field requests "$WORK/wrk-round-$r-full.txt") ))
done

log "kill -9 and restart"
crash_server "$SERVER_PID"
restart_started=$(date +%s.%N)
start_server "$WORK/db" "$WORK/server-2" "${engine[@]}" "${serve_flags[@]}"
ready=0
for _ in $(seq 1 600); do
  if curl -sf -o /dev/null "$BASE_URL/readyz"; then ready=1; break; fi
  sleep 0.05
done
[ "$ready" = 1 ] || die "no /readyz 200 within 30 s of the restart"
restart_s=$(awk -v a="$restart_started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')

log "checking every account's ledger against its balance"
"${CLIENT[@]}" verify --base "$BASE_URL" --accounts "$WORK/accounts.tsv" >"$WORK/verify.txt" \
  || { cat "$WORK/verify.txt" >&2; die "ledger does not match the balance"; }
stop_server "$SERVER_PID"

copy_row=
if [ "${COPY:-0}" = 1 ]; then
  [ -n "${COPY_DATABASE_URL:-}" ] || die "COPY=1 needs COPY_DATABASE_URL (a PostgreSQL maintenance URL)"
  [ -z "$DATABASE_URL" ] || die "COPY=1 copies a sled store: run without --database-url"
  copy_db=orderly_scale_copy_$$
  PGOPTIONS="-c client_min_messages=warning" psql "$COPY_DATABASE_URL" -qAt -v ON_ERROR_STOP=1 \
    -c "DROP DATABASE IF EXISTS $copy_db" -c "CREATE DATABASE $copy_db" >/dev/null
  copy_url=$(database_url "$COPY_DATABASE_URL" "$copy_db")
  log "orderly copy into $copy_db"
  /usr/bin/time -f '%e %M' -o "$WORK/copy.time" "$ORDERLY" copy --from-data-dir "$WORK/db" \
    --to-database-url "$copy_url" >"$WORK/copy.out" 2>&1 || { tail "$WORK/copy.out" >&2; die "orderly copy failed"; }
  read -r copy_s copy_kib <"$WORK/copy.time"
  copy_row="| \`orderly copy\` of the store: wall time, peak resident memory | ${copy_s} s, $((copy_kib / 1024)) MiB |"
fi

fig() { result_field "$1" "$WORK/wrk-$2.txt"; }
echo
echo "orderly at scale, $(date -u +%Y-%m-%d), $(basename "$ORDERLY") on" \
  "${ORDER_BODY:-partner} orders," \
  "$([ -n "$DATABASE_URL" ] && echo PostgreSQL || echo sled), $(nproc) CPUs, wrk -c$CONNS on the same host," \
  "fill ${FILL_SECONDS}s, measures ${MEASURE_SECONDS}s"
echo
echo "| measure | figure |"
echo "|---|---:|"
# Orders stored: the ledger's entries less the 100 credits (wrk counts only the answers it read).
stored=$(( $(sed -n 's/^ledger check: [0-9]* accounts, \([0-9]*\) ledger entries.*/\1/p' "$WORK/verify.txt") - 100 ))
echo "| orders stored (100 accounts) | $stored |"
echo "| new orders/s, empty store (p99 ms) | $(fig rps empty) ($(fig p99_ms empty)) |"
echo "| new orders/s, full store (p99 ms) | $(fig rps full) ($(fig p99_ms full)) |"
echo "| full / empty | $(awk -v a="$(fig rps empty)" -v b="$(fig rps full)" 'BEGIN { printf "%.2fx", b / a }') |"
if [ "$ROUNDS" -gt 0 ]; then
  rounds=()
  for r in $(seq 1 "$ROUNDS"); do rounds+=("$(fig rps "round-$r-empty")" "$(fig rps "round-$r-full")"); done
  # Each round's ratio, then the medians of the fresh and the full figures.
  read -r per_round med_empty med_full <<<"$(python3 -c '
import statistics, sys
v = [float(x) for x in sys.argv[1:]]
fresh, full = v[0::2], v[1::2]
print(",".join("%.2fx" % (b / a) for a, b in zip(fresh, full)),
      "%.1f" % statistics.median(fresh), "%.1f" % statistics.median(full))' "${rounds[@]}")"
  echo "| in turns, $ROUNDS rounds: new orders/s, fresh store, full store (medians) | $med_empty, $med_full |"
  echo "| in turns: full / empty (medians; each round) | $(awk -v a="$med_empty" -v b="$med_full" 'BEGIN { printf "%.2fx", b / a }') (${per_round//,/, }) |"
fi
# The size was taken before the rounds: the orders they placed on the full store are not in it
# (wrk's count of them misses at most the CONNS answers in flight when each round ended).
sized=$(( stored - after_size ))
echo "| store size, bytes per order | $((bytes / 1024 / 1024)) MiB, $((bytes / sized)) |"
# sled's writes are the server's own; PostgreSQL's are its processes'.
written() {
  local a_w a_b b_w b_b n
  read -r a_w a_b b_w b_b <"$WORK/io-$1.txt"
  n=$(fig requests "$1")
  echo "$(( (b_w - a_w) / n )), $(( (b_b - a_b) / n ))"
}
[ -n "$DATABASE_URL" ] || echo "| bytes written per order, empty store, full store: passed to write calls, to the disk | $(written empty); $(written full) |"
echo "| resident memory at the end, peak | $((rss_now / 1024)) MiB, $((rss_peak / 1024)) MiB |"
echo "| kill -9 to /readyz 200 | ${restart_s} s |"
[ -z "$copy_row" ] || echo "$copy_row"
echo
tail -1 "$WORK/verify.txt"
[ "${PROFILE:-0}" != 1 ] || echo "profiles: $WORK/perf-empty.data $WORK/perf-full.data"
