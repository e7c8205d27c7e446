#!/usr/bin/env bash
# orderly on PostgreSQL through PgBouncer against orderly on the same server direct, in one
# run (docs/contract.md "When the storage is slow": a pooler in between changes nothing, and should cost little). One throwaway
# cluster, PgBouncer in front of it (scripts/pgbouncer.sh, pool_mode transaction unless
# POOL_MODE says session), one orderly on a database of its own through each path, both seeded
# by perf/orderly-setup.py; then, alternating (direct, pooled, direct, ...), new
# orders over 100 accounts and replays with perf/'s wrk scripts. Prints the medians,
# the ratios pooled/direct, both ledgers verified, and a one-line summary last.
# Usage: scripts/pooler-compare.sh [ORDERLY_BIN]   (default target/release/orderly)
# Env: RUNS (3) DURATION (10s) CONC (64) POOL_MODE (transaction) PERF (perf/ in this checkout)
#      AUTO_EXPLAIN (e.g. 40ms: the server logs the plan of every statement that took longer,
#      and the end prints how many, by statement; the server's log is kept as
#      AUTO_EXPLAIN_LOG, /tmp/pooler-compare-pg.log by default)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/orderly}
[[ -x $BIN ]] || { echo "pooler-compare: build it first: cargo build --release" >&2; exit 2; }
PERF=${PERF:-$(cd "$(dirname "$0")/../perf" && pwd)}
RUNS=${RUNS:-3}; DURATION=${DURATION:-10s}; CONC=${CONC:-64}; POOL_MODE=${POOL_MODE:-transaction}
command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk; } >&2

work=$(mktemp -d /tmp/orderly-pooler.XXXXXX)
pg_dir=$(mktemp -d /tmp/orderly-pooler-pg.XXXXXX)
bouncer_dir=$(mktemp -d /tmp/orderly-pooler-bouncer.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  bash scripts/pgbouncer.sh stop "$bouncer_dir" >/dev/null 2>&1 || true
  [[ -z ${AUTO_EXPLAIN:-} ]] || cp "$pg_dir/log" "${AUTO_EXPLAIN_LOG:-/tmp/pooler-compare-pg.log}" 2>/dev/null || true
  bash scripts/pg-cluster.sh stop "$pg_dir" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
pg=$(bash scripts/pg-cluster.sh start "$pg_dir" | tail -n 1)
if [[ -n ${AUTO_EXPLAIN:-} ]]; then # loaded by every session that starts from now on
  printf "session_preload_libraries = 'auto_explain'\nauto_explain.log_min_duration = '%s'\n" \
    "$AUTO_EXPLAIN" >>"$pg_dir/data/postgresql.conf"
  psql -X -q "$pg" -c "SELECT pg_reload_conf()" >/dev/null
fi
bouncer=$(bash scripts/pgbouncer.sh start "$bouncer_dir" "$pg" "$POOL_MODE" | tail -n 1)
psql -X -q "$pg" -c "CREATE DATABASE orderly_direct" -c "CREATE DATABASE orderly_pooled"

serve() { # name database-url -> "pid url"
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$BIN" serve --listen 127.0.0.1:"$port" --database-url "$2" --admin-token pooler-token \
    --rate-limit 100000000 --fulfillment-delay 1h >"$work/$1.log" 2>&1 &
  local pid=$!
  for _ in $(seq 300); do
    [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/healthz") = 200 ]] && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/$1.log" >&2; exit 2; }
    sleep 0.1
  done
  echo "$pid http://127.0.0.1:$port"
}
read -r direct_pid direct_url < <(serve direct "${pg%/postgres}/orderly_direct")
read -r pooled_pid pooled_url < <(serve pooled "${bouncer%/postgres}/orderly_pooled")
pids+=("$direct_pid" "$pooled_pid")
setup() { python3 "$PERF/orderly-setup.py" --url "$1" --admin-token pooler-token --keys-file "$work/$2-keys.txt" --accounts 100; }
direct_products=$(setup "$direct_url" direct)
pooled_products=$(setup "$pooled_url" pooled)

run() { # scenario path-name url products
  env BODY_SHAPE=orderly ORDER_PATH=/b2b/orders API_KEYS_FILE="$work/$2-keys.txt" PRODUCTS="$4" ACCOUNTS=100 \
    THREADS=2 wrk -t2 -c"$CONC" -d"$DURATION" --timeout 5s --latency -s "$PERF/wrk/$1.lua" "$3" 2>&1 |
    sed -n 's/^RESULT //p'
}
warm() { # path-name url products: every replay key sent once
  env BODY_SHAPE=orderly ORDER_PATH=/b2b/orders API_KEYS_FILE="$work/$1-keys.txt" PRODUCTS="$3" ACCOUNTS=100 \
    REPLAY_SEQ=1 THREADS=2 wrk -t2 -c"$CONC" -d6s --timeout 5s -s "$PERF/wrk/replay.lua" "$2" >/dev/null 2>&1
}
: >"$work/results"
for scenario in new_order replay; do
  if [[ $scenario = replay ]]; then
    warm direct "$direct_url" "$direct_products"
    warm pooled "$pooled_url" "$pooled_products"
  fi
  for r in $(seq "$RUNS"); do
    for path in direct pooled; do
      url=${path}_url; products=${path}_products
      sleep 1
      result=$(run "$scenario" "$path" "${!url}" "${!products}")
      echo "$scenario $path run=$r $result" | tee -a "$work/results" >&2
    done
  done
done

verify() { python3 "$PERF/orderly-setup.py" --url "$1" --keys-file "$work/$2-keys.txt" --verify | tail -n 1; }
direct_ledger=$(verify "$direct_url" direct)
pooled_ledger=$(verify "$pooled_url" pooled)
if [[ -n ${AUTO_EXPLAIN:-} ]]; then
  slow=$(sed -n 's/^[[:space:]]*Query Text: //p' "$pg_dir/log" | cut -c1-100 | sort | uniq -c | sort -rn || true)
  echo "statements over $AUTO_EXPLAIN (auto_explain; the log: ${AUTO_EXPLAIN_LOG:-/tmp/pooler-compare-pg.log}): $(printf '%s' "$slow" | awk '{n += $1} END {print n + 0}')"
  [[ -z $slow ]] || printf '%s\n' "$slow" | head -n 5 || true # head may close the pipe first
fi
python3 - "$work/results" "$direct_ledger" "$pooled_ledger" "$POOL_MODE" <<'PY'
import re, statistics, sys
path, direct_ledger, pooled_ledger, mode = sys.argv[1:5]
runs = {}
for line in open(path):
    scenario, which, _, *fields = line.split()
    values = dict(f.split("=", 1) for f in fields if "=" in f)
    runs.setdefault((scenario, which), []).append(values)
summary = []
print(f"orderly through PgBouncer ({mode} mode) against direct: medians of each path's runs")
print(f"{'scenario':10} {'direct/s':>10} {'pooled/s':>10} {'ratio':>7} {'d.p99ms':>8} {'p.p99ms':>8} errors d/p")
for scenario, label in (("new_order", "new"), ("replay", "replay")):
    d, p = runs[(scenario, "direct")], runs[(scenario, "pooled")]
    med = lambda rs, k: statistics.median(float(r.get(k, 0)) for r in rs)
    errors = lambda rs: sum(int(r.get("non2xx", 0)) + int(r.get("sockerr", 0)) for r in rs)
    ratio = med(p, "rps") / med(d, "rps") if med(d, "rps") else 0
    print(f"{label:10} {med(d,'rps'):10.0f} {med(p,'rps'):10.0f} {ratio:6.2f}x {med(d,'p99_ms'):8.2f} {med(p,'p99_ms'):8.2f} {errors(d)}/{errors(p)}")
    summary.append(f"{label} {ratio:.2f}x direct ({med(p,'rps'):.0f}/s vs {med(d,'rps'):.0f}/s)")
print("ledger direct:", direct_ledger)
print("ledger pooled:", pooled_ledger)
ok = direct_ledger.startswith("ledger ok") and pooled_ledger.startswith("ledger ok")
print("pooled " + " | ".join(summary) + (" | ledgers ok" if ok else " | ledger FAILED"))
sys.exit(0 if ok else 1)
PY
