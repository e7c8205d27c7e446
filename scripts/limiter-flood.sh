#!/usr/bin/env bash
# What a flood of unauthenticated clients costs partner orders on PostgreSQL (contract §17:
# unauthenticated traffic costs the database bounded work). One throwaway cluster, one
# instance with --trusted-proxies 127.0.0.1/32; partner orders (perf/'s wrk
# new_order.lua, 16 connections) run quiet, then again while 2,000 connections send one
# unauthenticated request a second each, each request from the next of 2,000 distinct
# X-Forwarded-For addresses (scripts/wrk/flood.lua). Prints both runs, the ratios, the 500s,
# and the database's transactions a second (pg_stat_database) and the limiter's statements a
# second (orderly_rate_limit_statements_total) in each phase.
# Usage: scripts/limiter-flood.sh [ORDERLY_BIN]   (default target/release/orderly)
# Env: DURATION (10s) CONC (16) FLOOD_CONC (2000) FLOOD_CLIENTS (2000) PERF (perf/ in this checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/orderly}
[[ -x $BIN ]] || { echo "limiter-flood: build it first: cargo build --release" >&2; exit 2; }
PERF=${PERF:-$(cd "$(dirname "$0")/../perf" && pwd)}
[[ -f $PERF/wrk/new_order.lua ]] || { echo "limiter-flood: no $PERF/wrk/new_order.lua" >&2; exit 2; }
DURATION=${DURATION:-10s}; CONC=${CONC:-16}; FLOOD_CONC=${FLOOD_CONC:-2000}
export FLOOD_CLIENTS=${FLOOD_CLIENTS:-2000}
command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk; } >&2
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true # 2,000 sockets each side

work=$(mktemp -d /tmp/orderly-flood.XXXXXX)
pg_dir=$(mktemp -d /tmp/orderly-flood-pg.XXXXXX) # its own: the cluster runs as postgres
server=""; flood=""
cleanup() {
  [[ -n $flood ]] && kill "$flood" 2>/dev/null || true
  [[ -n $server ]] && { kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true; }
  bash scripts/pg-cluster.sh stop "$pg_dir" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
pg=$(bash scripts/pg-cluster.sh start "$pg_dir" | tail -n 1)
psql -X -q "$pg" -c "CREATE DATABASE orderly_flood"
db=${pg%/postgres}/orderly_flood
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
token=flood-$(python3 -c 'import secrets; print(secrets.token_hex(8))')
"$BIN" serve --listen 127.0.0.1:"$port" --database-url "$db" --admin-token "$token" \
  --trusted-proxies 127.0.0.1/32 --rate-limit 100000000 --fulfillment-delay 1h \
  >"$work/server.log" 2>&1 &
server=$!
url=http://127.0.0.1:$port
for _ in $(seq 300); do
  [[ $(curl -s -o /dev/null -w '%{http_code}' "$url/healthz") = 200 ]] && break; sleep 0.1
done
products=$(python3 "$PERF/orderly-setup.py" --url "$url" --admin-token "$token" \
  --keys-file "$work/keys.txt" --accounts 100)

commits() { psql -X -qAt "$db" -c "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"; }
statements() { curl -s "$url/metrics" | awk '$1 == "orderly_rate_limit_statements_total" {print $2}'; }
secs=${DURATION%s}
orders() { # label -> RESULT line, and the phase's database and limiter rates
  local c0 s0 out c1 s1
  c0=$(commits); s0=$(statements)
  out=$(env BODY_SHAPE=orderly ORDER_PATH=/b2b/orders API_KEYS_FILE="$work/keys.txt" PRODUCTS="$products" \
    THREADS=2 wrk -t2 -c"$CONC" -d"$DURATION" --timeout 5s --latency -s "$PERF/wrk/new_order.lua" "$url" 2>&1)
  c1=$(commits); s1=$(statements)
  echo "$1 $(printf '%s\n' "$out" | grep '^RESULT') db_xacts_per_s=$(( (c1 - c0) / secs ))" \
    "limiter_statements_per_s=$(( (${s1%.*} - ${s0%.*}) / secs ))"
}

quiet=$(orders quiet)
echo "$quiet"
wrk -t2 -c"$FLOOD_CONC" -d$(( secs + 15 ))s --timeout 10s -s scripts/wrk/flood.lua "$url" >"$work/flood.out" 2>&1 &
flood=$!
sleep 5 # every flood connection open and sending
flooded=$(orders flooded)
echo "$flooded"
wait "$flood" || true; flood=""
grep '^FLOOD' "$work/flood.out" || tail -n 3 "$work/flood.out"
python3 "$PERF/orderly-setup.py" --url "$url" --keys-file "$work/keys.txt" --verify
field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<<"$2"; }
python3 - "$(field rps "$quiet")" "$(field p99_ms "$quiet")" "$(field rps "$flooded")" \
  "$(field p99_ms "$flooded")" "$(field non2xx "$flooded")" <<'PY'
import sys
q_rps, q_p99, f_rps, f_p99, f_errors = map(float, sys.argv[1:])
print(f"summary: quiet {q_rps:.0f}/s p99 {q_p99:.1f} ms; flooded {f_rps:.0f}/s p99 {f_p99:.1f} ms; "
      f"p99 {f_p99 / q_p99:.2f}x (goal <= 2x), throughput {f_rps / q_rps:.2f}x (goal >= 0.8x), "
      f"non-2xx orders {f_errors:.0f} (goal 0)")
PY
