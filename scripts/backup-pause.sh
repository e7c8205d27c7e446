#!/usr/bin/env bash
# What a backup costs the shop on the sled engine, and what a restore and a copy of it cost:
# a server with N orders (default 100,000), then GET /admin/backup while one client keeps
# placing orders. Prints (one JSON object each) the backup's size and time, the longest wait
# and the p99 of the orders placed during it against a quiet p99, the server's resident memory
# before and at its peak; then the peak resident memory of `orderly restore` of that backup
# and, when ORDERLY_COPY_DATABASE_URL names an empty PostgreSQL database, of `orderly copy`
# of the stopped data directory into it.
#
#   ORDERLY_BIN=target/release/orderly ORDERS=100000 scripts/backup-pause.sh
#
# DATA_DIR=DIR measures on a data directory kept from an earlier run (KEEP_WORK=1 keeps it),
# placing no more orders first (filling a million takes some minutes).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
resolve_bin
make_work
data=${DATA_DIR:-$WORK/db}
orders=${ORDERS:-100000}
[ -z "${DATA_DIR:-}" ] || orders=0
start_server "$data" "$WORK/server" --fulfillment-delay 1h
"${CLIENT[@]}" setup --base "$BASE_URL" --token "$ADMIN_TOKEN" --accounts 1 --out "$WORK/accounts.tsv"
api_key=$(cut -f2 "$WORK/accounts.tsv")
"${CLIENT[@]}" backup-pause --base "$BASE_URL" --api-key "$api_key" --token "$ADMIN_TOKEN" \
  --server-pid "$SERVER_PID" --orders "$orders" --prefix "bp-$$"
curl -sSf -o "$WORK/orderly.backup" -H "Authorization: Bearer $ADMIN_TOKEN" "$BASE_URL/admin/backup"
grep "backup: walked" "$WORK/server.err" >&2 || true
stop_server "$SERVER_PID"

# peak_rss NAME COMMAND...: runs COMMAND under /usr/bin/time, prints its figures as JSON.
peak_rss() {
  local name=$1 started ended kib
  shift
  started=$(date +%s.%N)
  /usr/bin/time -v -o "$WORK/$name.time" "$@" > "$WORK/$name.out" 2> "$WORK/$name.err" \
    || { cat "$WORK/$name.err" >&2; die "$name failed"; }
  ended=$(date +%s.%N)
  kib=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$WORK/$name.time")
  printf '{"command": "%s", "seconds": %.1f, "peakRssMiB": %.1f, "progressLines": %d, "records": %s}\n' \
    "$name" "$(echo "$ended - $started" | bc)" "$(echo "$kib / 1024" | bc -l)" \
    "$(wc -l < "$WORK/$name.err")" "$(cat "$WORK/$name.out")"
}
peak_rss restore "$ORDERLY" restore --from "$WORK/orderly.backup" --data-dir "$WORK/restored"
if [ -n "${ORDERLY_COPY_DATABASE_URL:-}" ]; then
  peak_rss copy "$ORDERLY" copy --from-data-dir "$data" --to-database-url "$ORDERLY_COPY_DATABASE_URL"
fi
