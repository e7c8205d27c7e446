#!/usr/bin/env bash
# Power loss on the sled engine: does every acknowledged order survive a power cut, byte for
# byte, with large values mixed in? And does a restore that said it finished survive one?
#
#   LAZYFS_BIN=path/to/lazyfs ORDERLY_BIN=path/to/orderly scripts/power-loss.sh [N]
#                                   (N order trials, default 5; LazyFS from scripts/lazyfs.sh build)
#   VALUES=medium ...               every order 3-8 KiB (its answer and rows as large: sled's
#                                   pages of them pass its blob threshold at 33 rows)
#   CUT=blob-unlink ...             the power cut comes the moment sled removes a blob file (the
#                                   page it held was rewritten elsewhere), the first removal
#                                   after 0.5 to 3 s of load:
#                                   LazyFS is killed right after that unlink, which it passed to
#                                   the disk at once, and is mounted again on what it had synced.
#                                   A store must never need a removed file to recover.
#
# The data directories live on a LazyFS mount: written data stays in LazyFS's memory until it
# is fsynced, and `lazyfs::clear-cache` drops the rest, as a power cut does.
#
# Each order trial: a server on a fresh data dir on the mount; 16 client threads send new
# orders (10% of them prd_large with 300 KB of delivery data, which sled keeps in files of
# their own) and replays; between 0.5 and 3 s in, kill -9, then clear-cache; restart on the same
# directory, and orderly_client.py crash-verify: every acknowledged key replays to its order
# and to the same bytes, no order without its key, every ledger sums to its balance.
#
# Then the restore trials, on the last trial's server: its backup restored onto the mount,
# (a) killed at a random instant and the cache cleared: the target is absent, and the next
# restore works; (b) left to finish, then the cache cleared: the restored directory serves
# every acknowledged key as the original did.
# Prints a line per trial and "N trials, K lost"; exits non-zero on any loss or failed check.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
N=${1:-5}
CREDIT=1000000000000
load_flags=()
case "${CUT:-random}" in
  random) ;;
  # The server answers 500 for the moment between the disk's end and its kill: honest errors.
  blob-unlink) load_flags=(--storage-may-fail) ;;
  *) die "CUT is random (default) or blob-unlink" ;;
esac
case "${VALUES:-mixed}" in
  mixed) ratios=(--large-ratio 0.1) ;;
  medium) ratios=(--medium-ratio 1) ;;
  *) die "VALUES is mixed (default) or medium" ;;
esac
[ -n "${LAZYFS_BIN:-}" ] || die "set LAZYFS_BIN (scripts/lazyfs.sh build DIR prints it)"
[ -e /dev/fuse ] || die "no /dev/fuse: LazyFS cannot mount here"
resolve_bin
make_work

# mount_lazyfs: a fresh LazyFS mount (the first, or the next after one died).
mounts=0
mount_lazyfs() {
  mounts=$((mounts + 1))
  lazy=$WORK/lazy-$mounts
  lazy_pid=$(bash "$SCRIPTS_DIR/lazyfs.sh" mount "$LAZYFS_BIN" "$lazy")
  BG_PIDS=("$lazy_pid")
  UNMOUNT=$lazy/mnt
}
mount_lazyfs

# remount_lazyfs: the mount unmounted (aborted first if it stopped answering), its LazyFS
# gone, and a fresh one.
remount_lazyfs() {
  bash "$SCRIPTS_DIR/lazyfs.sh" umount "$lazy"
  kill -KILL "$lazy_pid" 2>/dev/null || true
  wait "$lazy_pid" 2>/dev/null || true
  rm -rf "$lazy" 2>/dev/null || true
  mount_lazyfs
}

# lazyfs_died WHEN: LazyFS itself is gone (a crash of the tool, or the OOM killer): says so with
# its last lines, rather than wait forever on a FIFO nobody reads; the caller decides.
lazyfs_died() {
  kill -0 "$lazy_pid" 2>/dev/null && return 1
  log "LazyFS (pid $lazy_pid) died $1; its last lines:"
  tail -n 15 "$lazy/lazyfs.out" >&2 || true
  { dmesg 2>/dev/null | grep -iE 'out of memory|killed process' | tail -n 3; } >&2 || true
  return 0
}

# fuse_abort: fails every request waiting on this LazyFS mount (ENOTCONN), which is what frees
# a process stuck in the kernel on a LazyFS that stopped answering: no signal can.
fuse_abort() {
  local conn
  [ -n "$(ls -A /sys/fs/fuse/connections 2>/dev/null)" ] \
    || mount -t fusectl none /sys/fs/fuse/connections 2>/dev/null || true
  # The connection is the mount's minor device number (read without touching the mount).
  conn=$(awk -v m="$lazy/mnt" '$5 == m { split($3, d, ":"); print d[2] }' /proc/self/mountinfo)
  if [ -n "$conn" ] && [ -e "/sys/fs/fuse/connections/$conn/abort" ]; then
    echo 1 >"/sys/fs/fuse/connections/$conn/abort"
  fi
}

# kill_server PID: kill -9, reaped within 15 s. Status 3 when it could not die because LazyFS
# stopped answering the requests it waits on (seen once in CI, at the tenth trial, LazyFS at
# 1.3 GB): the mount's connection is then aborted, which frees it, and the trial is LazyFS's.
kill_server() {
  local pid=$1 state
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 150); do
    state=$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null || echo gone)
    if [ "$state" = Z ] || [ "$state" = gone ]; then
      wait "$pid" 2>/dev/null || true
      forget_pid "$pid"
      return 0
    fi
    sleep 0.1
  done
  log "the killed server still waits on LazyFS 15 s later: LazyFS stopped answering; aborting its mount"
  fuse_abort
  wait "$pid" 2>/dev/null || true
  forget_pid "$pid"
  return 3
}

# power_cut: what was not fsynced is gone (waits for LazyFS to say so, <= 30 s). Status 3 when
# LazyFS is gone; every wait here is bounded (a write to the FIFO blocks when nobody reads it).
power_cut() {
  local before
  lazyfs_died "before a power cut" && return 3
  before=$(grep -c "cache is cleared" "$lazy/lazyfs.out" || true)
  timeout 10 bash -c 'echo "lazyfs::clear-cache" >"$1"' _ "$lazy/faults.fifo" || {
    lazyfs_died "while asked for a power cut" && return 3
    die "LazyFS did not take the power cut command within 10 s"
  }
  for _ in $(seq 300); do
    [ "$(grep -c "cache is cleared" "$lazy/lazyfs.out" || true)" -gt "$before" ] && return 0
    lazyfs_died "during a power cut" && return 3
    sleep 0.1
  done
  die "LazyFS did not clear its cache within 30 s"
}

# cut_at_blob_unlink: kills LazyFS right after the next unlink of a file under a `blobs/`
# directory (its unsynced data lost, as in a power cut), and waits up to 8 s for it; prints the
# milliseconds waited. Status 1 when no blob file was removed in that time, 3 when LazyFS died
# of something else (the tool failed, not orderly).
cut_at_blob_unlink() {
  local started=$EPOCHREALTIME
  lazyfs_died "before the cut was armed" && return 3
  timeout 10 bash -c 'echo "lazyfs::crash::timing=after::op=unlink::from_rgx=.*/blobs/.*" >"$1"' \
    _ "$lazy/faults.fifo" || return 3
  for _ in $(seq 80); do
    if ! kill -0 "$lazy_pid" 2>/dev/null; then
      wait "$lazy_pid" 2>/dev/null || true
      grep -q "Triggered fault condition (op=unlink" "$lazy/lazyfs.out" || return 3
      echo $(((${EPOCHREALTIME/./} - ${started/./}) / 1000))
      return 0
    fi
    sleep 0.1
  done
  return 1
}

# remount_same_root: the dead LazyFS's mount taken down and a new LazyFS mounted on the same
# directory, over what the dead one had synced.
remount_same_root() {
  bash "$SCRIPTS_DIR/lazyfs.sh" umount "$lazy"
  lazy_pid=$(bash "$SCRIPTS_DIR/lazyfs.sh" mount "$LAZYFS_BIN" "$lazy")
  BG_PIDS=("$lazy_pid")
  UNMOUNT=$lazy/mnt
}

random_pause() {
  local ms=$((500 + RANDOM % 2501))
  sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
  echo "$ms"
}

# verify DIR LABEL: crash-verify of the load recorded in DIR against the server at $BASE_URL;
# prints "LABEL: ok|FAILED: ..." and adds its losses to lost_total.
verify() {
  local dir=$1 label=$2 result verdict=ok lost
  result=$("${CLIENT[@]}" crash-verify --base "$BASE_URL" --api-key "$api_key" --dir "$dir" \
    --credit "$CREDIT") || { verdict=FAILED; failed=1; KEEP_WORK=1; }
  lost=$(cat "$dir/lost" 2>/dev/null || echo 1)
  lost_total=$((lost_total + lost))
  echo "$label: $verdict: $result"
}

# tool_failed_retry WHAT: LazyFS failed, not orderly (WHAT says how): once per run, the trial
# runs again on a fresh mount.
tool_failed_retry() {
  [ "$retried" -eq 0 ] || die "LazyFS failed a second time; the trials cannot go on"
  retried=1
  wait "$load_pid" || true
  remount_lazyfs
  echo "trial $i: $1 (not a result about orderly); run again on a fresh mount"
}

lost_total=0
failed=0
retried=0
i=1
while [ "$i" -le "$N" ]; do
  dir=$WORK/trial-$i
  rm -rf "$dir"
  mkdir -p "$dir"
  data=$lazy/mnt/trial-$i
  start_server "$data" "$dir/server-1"
  "${CLIENT[@]}" setup --base "$BASE_URL" --token "$ADMIN_TOKEN" --accounts 1 --balance "$CREDIT" \
    --out "$dir/accounts.tsv"
  api_key=$(cut -f2 "$dir/accounts.tsv")
  "${CLIENT[@]}" crash-load --base "$BASE_URL" --api-key "$api_key" --dir "$dir" \
    --prefix "p$i-$$" --threads 16 --seconds 8 "${ratios[@]}" "${load_flags[@]}" &
  load_pid=$!
  BG_PIDS+=("$load_pid")
  if [ "${CUT:-random}" = blob-unlink ]; then
    armed_ms=$(random_pause)
    cut_status=0
    cut_ms=$(cut_at_blob_unlink) || cut_status=$?
    if [ "$cut_status" = 3 ]; then
      kill_server "$SERVER_PID" || true
      tool_failed_retry "LazyFS died of something else than the cut"
      continue
    fi
    [ "$cut_status" = 0 ] || die "trial $i: no blob file was removed within 8 s"
    cut="power cut right after a blob file's unlink, at $((armed_ms + cut_ms)) ms"
    kill_server "$SERVER_PID" || true
    wait "$load_pid" || die "load client failed in trial $i"
    remount_same_root
  else
    kill_ms=$(random_pause)
    tool_failed=0
    kill_server "$SERVER_PID" || tool_failed=1
    if [ "$tool_failed" = 1 ] || ! power_cut; then
      tool_failed_retry "LazyFS died or stopped answering under it"
      continue
    fi
    cut="kill -9 and power cut at ${kill_ms} ms"
    wait "$load_pid" || die "load client failed in trial $i"
  fi
  BG_PIDS=("$lazy_pid")

  start_server "$data" "$dir/server-2"
  verify "$dir" "trial $i: $cut"
  if [ "$i" -lt "$N" ]; then
    stop_server "$SERVER_PID"
    # Each trial on a mount of its own: LazyFS keeps what it cached of the trials before.
    remount_lazyfs
  fi
  i=$((i + 1))
done

# The restore trials, from the last trial's server (still running): its backup, off the mount.
backup=$WORK/orderly.backup
curl -sSf -o "$backup" -H "Authorization: Bearer $ADMIN_TOKEN" "$BASE_URL/admin/backup"
stop_server "$SERVER_PID"
restored=$lazy/mnt/restored

"$ORDERLY" restore --from "$backup" --data-dir "$restored" >"$WORK/restore-1.out" 2>&1 &
restore_pid=$!
sleep "0.$((RANDOM % 10))"
kill -KILL "$restore_pid" 2>/dev/null || true
restore_status=0
wait "$restore_pid" 2>/dev/null || restore_status=$?
power_cut || die "LazyFS died during the restore trials"
if [ "$restore_status" = 0 ]; then
  # A small backup can be restored before the kill: then nothing was killed, and the next
  # restore needs an empty target.
  echo "restore finished before its kill: no killed restore this run (the target is complete)"
  rm -rf "$restored"
elif [ -n "$(ls -A "$restored" 2>/dev/null)" ]; then
  echo "restore killed, then a power cut: FAILED: the target holds $(ls -A "$restored" | head -3)"
  failed=1
else
  echo "restore killed, then a power cut: ok: the target is absent"
fi

"$ORDERLY" restore --from "$backup" --data-dir "$restored" >"$WORK/restore-2.out" 2>"$WORK/restore-2.err" \
  || { cat "$WORK/restore-2.err" >&2; die "the restore after a killed one failed"; }
power_cut || die "LazyFS died during the restore trials"
start_server "$restored" "$WORK/restored"
verify "$WORK/trial-$N" "restore finished, then a power cut"
stop_server "$SERVER_PID"

echo "$N trials and a restore, $lost_total lost"
[ "$failed" -eq 0 ] && [ "$lost_total" -eq 0 ]
