#!/usr/bin/env bash
# What a flood of unauthenticated clients costs partner orders (docs/contract.md "6. Many instances": unauthenticated
# traffic costs the database bounded work). One instance with --trusted-proxies 127.0.0.1/32,
# on a throwaway PostgreSQL cluster (ENGINE=postgres, the default) or on sled (ENGINE=sled);
# partner orders (perf/'s wrk new_order.lua, 16 connections) run quiet, then again while 2,000
# connections send one request a second each that never authenticates, each request from the
# next of 2,000 distinct X-Forwarded-For addresses (scripts/wrk/flood.lua), with no API key,
# one made-up key, or a new made-up key each time (FLOOD_KEY=none|fixed|random). Prints both
# runs, the ratios, the 500s, and per phase: the database's transactions a second
# (pg_stat_database), the limiter's statements a second, API keys looked up in the database a
# second (orderly_api_key_reads_total), and the CPU orderly spent a second; then the flood's
# requests a second and orderly's CPU per flood request (what the flood added, over what the
# quiet phase's orders cost).
# Usage: scripts/limiter-flood.sh [ORDERLY_BIN]   (default target/release/orderly)
# Env: ENGINE (postgres) FLOOD_KEY (none) DURATION (10s) CONC (16) FLOOD_CONC (2000)
#      FLOOD_CLIENTS (2000) PERF (perf/ in this checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/orderly}
[[ -x $BIN ]] || { echo "limiter-flood: build it first: cargo build --release" >&2; exit 2; }
PERF=${PERF:-$(cd "$(dirname "$0")/../perf" && pwd)}
[[ -f $PERF/wrk/new_order.lua ]] || { echo "limiter-flood: no $PERF/wrk/new_order.lua" >&2; exit 2; }
DURATION=${DURATION:-10s}; CONC=${CONC:-16}; FLOOD_CONC=${FLOOD_CONC:-2000}
ENGINE=${ENGINE:-postgres}
export FLOOD_CLIENTS=${FLOOD_CLIENTS:-2000} FLOOD_KEY=${FLOOD_KEY:-none}
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
if [[ $ENGINE = postgres ]]; then
  pg=$(bash scripts/pg-cluster.sh start "$pg_dir" | tail -n 1)
  psql -X -q "$pg" -c "CREATE DATABASE orderly_flood"
  db=${pg%/postgres}/orderly_flood
  store=(--database-url "$db")
else
  store=(--data-dir "$work/db")
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
token=flood-$(python3 -c 'import secrets; print(secrets.token_hex(8))')
"$BIN" serve --listen 127.0.0.1:"$port" "${store[@]}" --admin-token "$token" \
  --trusted-proxies 127.0.0.1/32 --rate-limit 100000000 --fulfillment-delay 1h \
  >"$work/server.log" 2>&1 &
server=$!
url=http://127.0.0.1:$port
for _ in $(seq 300); do
  [[ $(curl -s -o /dev/null -w '%{http_code}' "$url/healthz") = 200 ]] && break; sleep 0.1
done
products=$(python3 "$PERF/orderly-setup.py" --url "$url" --admin-token "$token" \
  --keys-file "$work/keys.txt" --accounts 100)

commits() {
  if [[ $ENGINE = postgres ]]; then
    psql -X -qAt "$db" -c "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
  else echo 0; fi
}
counter() { curl -s "$url/metrics" | awk -v n="$1" '$1 == n {printf "%d", $2; found=1} END {if (!found) print 0}'; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$server/stat"; }
secs=${DURATION%s}
hz=$(getconf CLK_TCK)
orders() { # label -> RESULT line, and the phase's database, limiter, key lookup and CPU rates
  local c0 s0 k0 t0 out c1 s1 k1 t1
  c0=$(commits); s0=$(counter orderly_rate_limit_statements_total)
  k0=$(counter orderly_api_key_reads_total); t0=$(cpu_ticks)
  out=$(env BODY_SHAPE=orderly ORDER_PATH=/b2b/orders API_KEYS_FILE="$work/keys.txt" PRODUCTS="$products" \
    THREADS=2 wrk -t2 -c"$CONC" -d"$DURATION" --timeout 5s --latency -s "$PERF/wrk/new_order.lua" "$url" 2>&1)
  c1=$(commits); s1=$(counter orderly_rate_limit_statements_total)
  k1=$(counter orderly_api_key_reads_total); t1=$(cpu_ticks)
  echo "$1 $(printf '%s\n' "$out" | grep '^RESULT') db_xacts_per_s=$(( (c1 - c0) / secs ))" \
    "limiter_statements_per_s=$(( (s1 - s0) / secs )) key_reads_per_s=$(( (k1 - k0) / secs ))" \
    "cpu_ms_per_s=$(( (t1 - t0) * 1000 / hz / secs ))"
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
flood_requests=$(sed -n 's/^FLOOD requests=\([0-9]*\).*/\1/p' "$work/flood.out")
python3 "$PERF/orderly-setup.py" --url "$url" --keys-file "$work/keys.txt" --verify
field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<<"$2"; }
python3 - "$(field rps "$quiet")" "$(field p99_ms "$quiet")" "$(field rps "$flooded")" \
  "$(field p99_ms "$flooded")" "$(field non2xx "$flooded")" "$(field cpu_ms_per_s "$quiet")" \
  "$(field cpu_ms_per_s "$flooded")" "${flood_requests:-0}" "$(( secs + 15 ))" \
  "$(field key_reads_per_s "$flooded")" "$(field db_xacts_per_s "$quiet")" \
  "$(field db_xacts_per_s "$flooded")" "$(field limiter_statements_per_s "$quiet")" \
  "$(field limiter_statements_per_s "$flooded")" "$ENGINE" "$FLOOD_KEY" <<'PY'
import sys
(q_rps, q_p99, f_rps, f_p99, f_errors, q_cpu, f_cpu, flood_n, flood_s, reads, q_x, f_x, q_lim,
 f_lim) = map(float, sys.argv[1:15])
engine, key = sys.argv[15:17]
flood_rps = flood_n / flood_s if flood_s else 0
# What the flood added: the flooded phase's CPU less what its orders cost at the quiet rate.
added_ms = f_cpu - q_cpu * (f_rps / q_rps if q_rps else 0)
per_flood_us = added_ms * 1000 / flood_rps if flood_rps else 0
per_100 = reads * 100 / flood_rps if flood_rps else 0
# The database's transactions the flood added: the flooded phase's, less its orders' at the
# quiet phase's rate per order, less the limiter's own statements (which the rule allows).
ratio = f_rps / q_rps if q_rps else 0
extra = max(0.0, f_x - q_x * ratio - max(0.0, f_lim - q_lim * ratio))
extra_per_100 = extra * 100 / flood_rps if flood_rps else 0
print(f"summary ({engine}, flood key {key}): quiet {q_rps:.0f}/s p99 {q_p99:.1f} ms; "
      f"flooded {f_rps:.0f}/s p99 {f_p99:.1f} ms; p99 {f_p99 / q_p99:.2f}x (goal <= 2x), "
      f"throughput {f_rps / q_rps:.2f}x (goal >= 0.8x), non-2xx orders {f_errors:.0f} (goal 0); "
      f"flood {flood_rps:.0f} requests/s; per 100 of them: database transactions beyond the "
      f"orders' and the limiter's {extra_per_100:.2f} (goal <= 1), API key lookups {per_100:.2f}; "
      f"orderly CPU {per_flood_us:.0f} us per flood request")
PY
