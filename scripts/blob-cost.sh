#!/usr/bin/env bash
# What large values stored cost the small orders after them, on the sled engine: new small
# orders (wrk, 64 connections, scripts/orders.lua "new") on an empty store, then again once
# LARGE orders with 300 KB of delivery data each are stored (sled keeps each such value in files
# of its own under blobs/), RUNS times each; prints each run's orders/s, the medians and their
# ratio (the contract: within a tenth of the empty store's).
#
#   ORDERLY_BIN=target/release/orderly LARGE=10000 RUNS=3 SECONDS_EACH=10 scripts/blob-cost.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
LARGE=${LARGE:-10000}
RUNS=${RUNS:-3}
SECONDS_EACH=${SECONDS_EACH:-10}
ensure_wrk
resolve_bin
make_work
start_server "$WORK/db" "$WORK/server" --fulfillment-delay 1h
"${CLIENT[@]}" setup --base "$BASE_URL" --token "$ADMIN_TOKEN" --accounts 100 --out "$WORK/accounts.tsv"
"${CLIENT[@]}" precreate --base "$BASE_URL" --accounts "$WORK/accounts.tsv" --count 1000 \
  --prefix pool --out "$WORK/pool.tsv"

# small_orders LABEL: RUNS runs of new small orders; prints each and the median's orders/s.
small_orders() {
  local label=$1 run out rates=()
  for run in $(seq 1 "$RUNS"); do
    out=$WORK/wrk-$label-$run.txt
    timeout $((SECONDS_EACH + 30)) wrk -t2 -c64 -d"${SECONDS_EACH}s" --latency \
      -s "$SCRIPTS_DIR/orders.lua" "$BASE_URL/b2b/orders" \
      -- new "$WORK/accounts.tsv" "$WORK/pool.tsv" "bc-$label-$run" >"$out" 2>&1 \
      || { cat "$out" >&2; die "wrk failed"; }
    rates+=("$(result_field rps "$out")")
    [ "$(result_field non200 "$out")" = 0 ] || die "non-200 answers in $label run $run"
  done
  printf '%s\n' "${rates[@]}" | sort -g | awk -v l="$label" '{ r[NR] = $1 } END {
    printf "%s: runs", l; for (i = 1; i <= NR; i++) printf " %.0f", r[i]; printf ", median %.0f/s\n", r[int((NR + 1) / 2)] }'
}

empty=$(small_orders empty)
echo "$empty"
api_key=$(head -1 "$WORK/accounts.tsv" | cut -f2)
started=$(date +%s)
"${CLIENT[@]}" large-fill --base "$BASE_URL" --api-key "$api_key" --count "$LARGE" --prefix "large-$$"
echo "stored $LARGE large orders in $(( $(date +%s) - started )) s; blobs/ holds $(ls "$WORK/db/blobs" | wc -l) files"
full=$(small_orders "with-$LARGE-large")
echo "$full"
awk -v a="${empty##*median }" -v b="${full##*median }" 'BEGIN { printf "ratio: %.2fx\n", b / a }'
stop_server "$SERVER_PID"
