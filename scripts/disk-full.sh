#!/usr/bin/env bash
# A full disk stops the server, and nothing acknowledged is lost (docs/contract.md "5. Failures", second rule).
#
#   ORDERLY_BIN=path/to/orderly scripts/disk-full.sh        (as root)
#
# The data directory lives on a small tmpfs (where mounting is refused, the server runs under a
# file-size limit with SIGXFSZ ignored, so its writes fail with EFBIG the same way; never a skip).
# Orders go in until the first refusal; the same request is sent again under the first refused
# key (it must not get a 200), and the process must exit with status 1 within 5 s of that first
# refusal. Then the disk grows (or the limit goes), the server restarts on the same data and
# orderly_client.py crash-verify checks: every acknowledged key replays to its order, every key
# that was refused is wholly there (replays) or wholly absent (a first use now), no orphan order,
# and the ledger sums to the balance, which is the credit less one per order.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

CREDIT=1000000000000
SMALL_KIB=${SMALL_KIB:-6144}
resolve_bin
make_work

disk=$WORK/disk
mkdir -p "$disk"
# DISK_FULL_MODE=ulimit forces the fallback (to test it where mounting works).
if [ "${DISK_FULL_MODE:-tmpfs}" = tmpfs ] \
  && mount -t tmpfs -o size=${SMALL_KIB}k orderly-disk-full "$disk" 2>/dev/null; then
  mode=tmpfs
  UNMOUNT=$disk
  log "disk: a ${SMALL_KIB} KiB tmpfs"
else
  # ulimit -f counts 1 KiB blocks; with SIGXFSZ ignored, writes past it fail with EFBIG.
  mode=ulimit
  ORDERLY_WRAP=(bash -c "trap '' XFSZ; ulimit -f $SMALL_KIB; exec \"\$0\" \"\$@\"")
  log "disk: a ${SMALL_KIB} KiB file-size limit"
fi

start_server "$disk/db" "$WORK/server-1" --cache-mb 16 --fulfillment-delay 1h
"${CLIENT[@]}" setup --base "$BASE_URL" --token "$ADMIN_TOKEN" --accounts 1 --balance "$CREDIT" \
  --out "$WORK/accounts.tsv"
api_key=$(cut -f2 "$WORK/accounts.tsv")

fill=$("${CLIENT[@]}" fill-disk --base "$BASE_URL" --api-key "$api_key" --dir "$WORK" \
  --prefix "df-$$") || die "a request under a refused key got a 200 while the disk was full: $fill"
log "filled: $fill"

# The process must stop by itself, with status 1, within 5 s of the first refusal.
first=$(cat "$WORK/first_failure")
rc=
while :; do
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    wait "$SERVER_PID" && rc=0 || rc=$?
    break
  fi
  awk -v f="$first" -v n="$(date +%s.%N)" 'BEGIN { exit !(n - f > 5.0) }' && break
  sleep 0.05
done
stopped_after=$(awk -v f="$first" -v n="$(date +%s.%N)" 'BEGIN { printf "%.2f", n - f }')
[ -n "$rc" ] || { grep -i 'storage' "$WORK/server-1.err" | tail -3 >&2; die "still running 5 s after the first refusal"; }
forget_pid "$SERVER_PID"
[ "$rc" -eq 1 ] || die "exit status $rc after the storage failure (expected 1)"
grep -q 'storage failed' "$WORK/server-1.err" || die "the log does not say why it stopped"
log "stopped with status 1, ${stopped_after} s after the first refusal; log: $(grep -m1 'storage failed' "$WORK/server-1.err" | cut -c1-160)"

# A bigger disk (or no limit), and the same data.
if [ "$mode" = tmpfs ]; then
  mount -o remount,size=256m "$disk"
fi
ORDERLY_WRAP=()
start_server "$disk/db" "$WORK/server-2" --fulfillment-delay 1h
verdict=$("${CLIENT[@]}" crash-verify --base "$BASE_URL" --api-key "$api_key" --dir "$WORK" \
  --credit "$CREDIT") || { KEEP_WORK=1; die "after the restart: $verdict"; }
stop_server "$SERVER_PID"
echo "disk full ($mode): exit 1 after ${stopped_after} s; after restart: $verdict"
