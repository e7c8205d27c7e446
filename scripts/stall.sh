#!/usr/bin/env bash
# A storage that stops answering under full load, as an operator meets it (docs/contract.md "When the storage is slow"), on either
# engine, one instance, 64 connections of new orders (perf/'s wrk new_order.lua, 100
# accounts, wrk's own timeout 30 s):
#   postgres  one throwaway cluster whose every COMMIT waits for a synchronous standby that
#             does not exist (synchronous_standby_names = 'nobody', then reset)
#   sled      the data directory on LazyFS (scripts/lazyfs.sh), whose process is stopped
#             (SIGSTOP: every read, write and fsync on it waits), then continued
#   quiet   QUIET seconds of orders: the baseline
#   stall   STALL seconds of orders while every COMMIT waits: the slowest answer (wrk's max,
#           to be at most the deadline + 1 s), the answers that were not 200 (500 or 503),
#           resident memory before and at its highest, when /readyz turned 503
#   back    the setting reset, orders again at once, same process: when /readyz turned 200,
#           the phase's throughput
#   stop    a second stall under load, then SIGTERM: how long the process took to end, its
#           exit status (1: writes were left waiting), what it logged
# then every account's ledger is checked against its balance (nothing charged twice, nothing
# half-written). Prints one line per phase and a summary line last.
# Usage: scripts/stall.sh postgres|sled [ORDERLY_BIN]   (default target/release/orderly)
# Env: QUIET (10) STALL (60) BACK (10) CONC (64) DEADLINE (10s) PERF (perf/ in this checkout)
#      LAZYFS_BIN (sled: a built LazyFS; else scripts/lazyfs.sh builds one in the scratch dir)
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE=${1:?usage: stall.sh postgres|sled [ORDERLY_BIN]}
BIN=${2:-target/release/orderly}
[[ -x $BIN ]] || { echo "stall: build it first: cargo build --release" >&2; exit 2; }
PERF=${PERF:-$(cd "$(dirname "$0")/../perf" && pwd)}
QUIET=${QUIET:-10}; STALL=${STALL:-60}; BACK=${BACK:-10}; CONC=${CONC:-64}; DEADLINE=${DEADLINE:-10s}
command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk; } >&2

work=$(mktemp -d /tmp/orderly-stall.XXXXXX)
pg_dir=""; fs_dir=""; lazyfs=""
server=""; sampler=""
cleanup() {
  [[ -n $sampler ]] && kill "$sampler" 2>/dev/null || true
  [[ -n $lazyfs ]] && kill -CONT "$lazyfs" 2>/dev/null || true
  [[ -n $server ]] && { kill -KILL "$server" 2>/dev/null; wait "$server" 2>/dev/null || true; }
  [[ -n $pg_dir ]] && { bash scripts/pg-cluster.sh stop "$pg_dir" >/dev/null 2>&1 || true; }
  [[ -n $fs_dir ]] && bash scripts/lazyfs.sh umount "$fs_dir"
  rm -rf "$work"
}
trap cleanup EXIT
case $ENGINE in
  postgres)
    pg_dir=$(mktemp -d /tmp/orderly-stall-pg.XXXXXX)
    pg=$(bash scripts/pg-cluster.sh start "$pg_dir" | tail -n 1)
    psql -X -q "$pg" -c "CREATE DATABASE orderly_stall"
    storage=(--database-url "${pg%/postgres}/orderly_stall")
    ;;
  sled)
    fs_dir=$work/lazyfs
    lazyfs_bin=${LAZYFS_BIN:-$(bash scripts/lazyfs.sh build "$work/lazyfs-build")}
    lazyfs=$(bash scripts/lazyfs.sh mount "$lazyfs_bin" "$fs_dir")
    storage=(--data-dir "$fs_dir/mnt/db")
    ;;
  *) echo "usage: stall.sh postgres|sled [ORDERLY_BIN]" >&2; exit 2 ;;
esac
stall() { # on | off
  case $ENGINE:$1 in
    postgres:on) psql -X -q "$pg" -c "ALTER SYSTEM SET synchronous_standby_names = 'nobody'" ;;
    postgres:off) psql -X -q "$pg" -c "ALTER SYSTEM RESET synchronous_standby_names" ;;
    sled:on) kill -STOP "$lazyfs" ;;
    sled:off) kill -CONT "$lazyfs" ;;
  esac
  [[ $ENGINE = postgres ]] && psql -X -qAt "$pg" -c "SELECT pg_reload_conf()" >/dev/null
  return 0
}

start_server() {
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$BIN" serve --listen 127.0.0.1:"$port" "${storage[@]}" --admin-token stall-token \
    --rate-limit 100000000 --fulfillment-delay 1h --request-deadline "$DEADLINE" \
    >>"$work/server.log" 2>&1 &
  server=$!
  url=http://127.0.0.1:$port
  for _ in $(seq 300); do
    [[ $(curl -s -o /dev/null -w '%{http_code}' "$url/healthz") = 200 ]] && return 0; sleep 0.1
  done
  echo "stall: the server did not start" >&2; exit 2
}
start_server
products=$(python3 "$PERF/orderly-setup.py" --url "$url" --admin-token stall-token \
  --keys-file "$work/keys.txt" --accounts 100)

# Every fifth of a second: the time, resident KiB, /readyz and /healthz statuses (000: no
# answer within a second), the oldest commit in flight and the writes waiting (/metrics).
started=$(date +%s.%N)
sample() {
  while kill -0 "$server" 2>/dev/null; do
    local now rss ready health m
    now=$(date +%s.%N)
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$server/status" 2>/dev/null || echo 0)
    ready=$(curl -s -m 1 -o /dev/null -w '%{http_code}' "$url/readyz" || true)
    health=$(curl -s -m 1 -o /dev/null -w '%{http_code}' "$url/healthz" || true)
    m=$(curl -s -m 1 "$url/metrics" | awk '$1 == "orderly_oldest_commit_in_flight_seconds" {o=$2} $1 == "orderly_pending_writes" {p=$2} END {print o+0, p+0}' || true)
    echo "$(awk -v n="$now" -v s="$started" 'BEGIN {printf "%.2f", n - s}') $rss $ready $health $m" >>"$work/samples"
    sleep 0.2
  done
}
sample & sampler=$!
since() { awk -v n="$(date +%s.%N)" -v s="$started" 'BEGIN {printf "%.2f", n - s}'; }
orders() { # seconds -> wrk's RESULT line and the count of each status
  env BODY_SHAPE=orderly ORDER_PATH=/b2b/orders API_KEYS_FILE="$work/keys.txt" PRODUCTS="$products" \
    PERF_WRK="$PERF/wrk/" THREADS=2 wrk -t2 -c"$CONC" -d"$1s" --timeout 30s --latency \
    -s scripts/wrk/stall.lua "$url" 2>&1 | grep '^RESULT\|^STATUSES' | sed 's/^RESULT //; s/^STATUSES /statuses=/' |
    tr '\n' ' '
}
# The first sample at or after time $1 whose field $2 equals $3, as its time.
first_sample() { awk -v t="$1" -v f="$2" -v v="$3" '$1 >= t && $f == v {print $1; exit}' "$work/samples"; }
max_rss_between() { awk -v a="$1" -v b="$2" '$1 >= a && $1 <= b && $2 > m {m=$2} END {print m+0}' "$work/samples"; }

echo "quiet: $(orders "$QUIET")"
rss_before=$(awk '/^VmRSS:/ {print $2}' "/proc/$server/status")
stall on; t_stall=$(since)
stall_result=$(orders "$STALL")
stall off; t_back=$(since)
rss_peak=$(max_rss_between "$t_stall" "$t_back")
unready=$(first_sample "$t_stall" 3 503)
unready=$(python3 -c "print(f'{${unready:-nan} - $t_stall:.1f}')")
echo "stall: $stall_result rss_before_kib=$rss_before rss_peak_kib=$rss_peak readyz_503_after_s=$unready" \
  "healthz_non200=$(awk -v a="$t_stall" -v b="$t_back" '$1 >= a && $1 <= b && $4 != 200' "$work/samples" | wc -l)"
back_result=$(orders "$BACK")
ready=$(first_sample "$t_back" 3 200)
echo "back: $back_result readyz_200_after_s=$(python3 -c "print(f'{${ready:-nan} - $t_back:.1f}')")"

# A stop while the storage stalls.
stall on
orders 30 >/dev/null & load=$!
sleep 5
t_term=$(date +%s.%N)
kill -TERM "$server"
code=0; wait "$server" || code=$?
took=$(python3 -c "print(f'{$(date +%s.%N) - $t_term:.1f}')")
server=""
kill "$load" 2>/dev/null || true; wait "$load" 2>/dev/null || true
stall off
echo "stop: sigterm_to_exit_s=$took exit_status=$code logged=\"$(grep -o 'stopped with .*\|storage flushed.*' "$work/server.log" | tail -1)\""

# Every ledger against its balance, on a fresh start of the same database.
start_server
ledgers=$(python3 "$PERF/orderly-setup.py" --url "$url" --keys-file "$work/keys.txt" --verify | tail -n 1)
echo "ledgers: $ledgers"
max_ms=$(echo "$stall_result" | sed -n 's/.*max_ms=\([0-9.]*\).*/\1/p')
limit_ms=$(python3 -c "import re; d='$DEADLINE'; s=float(re.sub('[^0-9.]','',d)) * (0.001 if d.endswith('ms') else 1); print(int(s * 1000 + 1000))")
echo "stall summary ($ENGINE): slowest answer ${max_ms} ms (limit ${limit_ms})," \
  "memory +$(( (rss_peak - rss_before) / 1024 )) MiB, readyz 503 ${unready} s into the stall," \
  "SIGTERM to exit ${took} s (status $code), $ledgers"
# The goals of docs/contract.md "When the storage is slow": each missed one is named, and the exit status is 1.
failed=()
python3 -c "import sys; sys.exit(0 if float('${max_ms:-inf}') <= $limit_ms else 1)" \
  || failed+=("an answer came ${max_ms} ms after its request, past the deadline + 1 s")
[[ $(echo "$stall_result" | sed -n 's/.*timeouts=\([0-9]*\).*/\1/p') = 0 ]] \
  || failed+=("requests got no answer at all within 30 s")
others=$(echo "$stall_result" | grep -o 'statuses=.*' | tr ' ' '\n' | sed 's/^statuses=//' | grep -v '^$' | grep -v '^500:\|^503:' || true)
[[ -z $others ]] || failed+=("answers other than 500 and 503 in the stall: $(echo $others)")
(( rss_peak - rss_before < 100 * 1024 )) || failed+=("memory grew by more than 100 MiB in the stall")
python3 -c "import sys; sys.exit(0 if float('$unready') <= 5 else 1)" \
  || failed+=("/readyz was not 503 within 5 s of the stall ($unready)")
python3 -c "import sys; sys.exit(0 if float('$(python3 -c "print(f'{${ready:-nan} - $t_back:.1f}')")') <= 5 else 1)" \
  || failed+=("/readyz was not 200 within 5 s of the storage's return")
python3 -c "import sys; sys.exit(0 if float('$took') <= 30 else 1)" \
  || failed+=("SIGTERM took ${took} s")
[[ $ledgers = "ledger ok"* ]] || failed+=("a ledger does not sum to its balance")
if [[ ${#failed[@]} -gt 0 ]]; then
  printf 'stall: FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "stall ($ENGINE): every goal met"
