#!/usr/bin/env bash
# How long writes wait while a backup is taken on the sled engine: a server with N orders
# (default 100,000), then GET /admin/backup while one client keeps placing orders; prints the
# backup's size and time, the longest wait of an order placed while the cut was taken, and the
# server's resident memory before and at its peak during the backup.
#
#   ORDERLY_BIN=target/release/orderly ORDERS=100000 scripts/backup-pause.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
resolve_bin
make_work
start_server "$WORK/db" "$WORK/server" --fulfillment-delay 1h
"${CLIENT[@]}" setup --base "$BASE_URL" --token "$ADMIN_TOKEN" --accounts 1 --out "$WORK/accounts.tsv"
api_key=$(cut -f2 "$WORK/accounts.tsv")
"${CLIENT[@]}" backup-pause --base "$BASE_URL" --api-key "$api_key" --token "$ADMIN_TOKEN" \
  --server-pid "$SERVER_PID" --orders "${ORDERS:-100000}" --prefix "bp-$$"
stop_server "$SERVER_PID"
