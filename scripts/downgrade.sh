#!/usr/bin/env bash
# A downgrade that works (docs/operations.md "Downgrading"): a store made by this build, backed
# up by this build (GET /admin/backup), restored by an earlier build into an empty directory and
# served by it: every order placed replays byte for byte, every ledger sums to its balance.
#
#   ORDERLY_BIN=path/to/new OLD_BIN=path/to/earlier scripts/downgrade.sh [ORDERS]
#                                                        (default 10000 orders over 8 accounts)
#
# The earlier build cannot open a store this one created (compressed pages, docs/operations.md
# "Upgrades"); the backup format is the same across versions, which is the route. Prints each
# step's time and the counts; exits 1 when a key does not replay or a ledger does not sum.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

ORDERS=${1:-10000}
OLD_BIN=${OLD_BIN:?OLD_BIN: an earlier orderly build}
[ -x "$OLD_BIN" ] || die "no executable at $OLD_BIN"
resolve_bin
make_work

log "this build: $("$ORDERLY" --version); the earlier: $("$OLD_BIN" --version)"
start_server "$WORK/new" "$WORK/new" --fulfillment-delay 1h
"${CLIENT[@]}" setup --base "$BASE_URL" --token "$ADMIN_TOKEN" --accounts 8 --out "$WORK/accounts"
started=$(date +%s)
"${CLIENT[@]}" place --base "$BASE_URL" --accounts "$WORK/accounts" --count "$ORDERS" \
  --prefix down --out "$WORK/placed"
log "$ORDERS orders placed by this build in $(( $(date +%s) - started )) s"
curl -sf -H "Authorization: Bearer $ADMIN_TOKEN" "$BASE_URL/admin/backup" -o "$WORK/orderly.backup" \
  || die "GET /admin/backup failed"
stop_server "$SERVER_PID"
log "backup by this build: $(wc -c <"$WORK/orderly.backup") bytes; $(tail -c 300 "$WORK/orderly.backup" | grep -o '"counts":{[^}]*}')"

# The earlier build refuses this build's store (the reason the route exists)...
if "$OLD_BIN" stats --data-dir "$WORK/new" >"$WORK/old-stats.out" 2>"$WORK/old-stats.err"; then
  log "note: the earlier build opened this build's store"
else
  log "the earlier build refuses this build's store: $(head -c 200 "$WORK/old-stats.err" | tr '\n' ' ')"
fi
# ...and restores its backup.
started=$(date +%s)
"$OLD_BIN" restore --from "$WORK/orderly.backup" --data-dir "$WORK/old" >"$WORK/restore.out" 2>"$WORK/restore.err" \
  || { cat "$WORK/restore.err" >&2; die "the earlier build's restore failed"; }
log "restored by the earlier build in $(( $(date +%s) - started )) s: $(tail -1 "$WORK/restore.out")"
ORDERLY=$OLD_BIN
start_server "$WORK/old" "$WORK/old" --fulfillment-delay 1h
started=$(date +%s)
"${CLIENT[@]}" replay-check --base "$BASE_URL" --placed "$WORK/placed"
"${CLIENT[@]}" verify --base "$BASE_URL" --accounts "$WORK/accounts"
log "checked on the earlier build in $(( $(date +%s) - started )) s"
stop_server "$SERVER_PID"
log "downgrade: $ORDERS orders, every key replayed byte for byte, every ledger whole"
