#!/usr/bin/env bash
# A power cut right after sled removes a blob file, on vendor/sled (ORDERLY-PATCHES.md, change
# 9): src/bin/blob-writer.rs makes one version of a large value durable, then writes newer ones
# without syncing; LazyFS is killed (its unsynced data lost) right after the first removal of a
# file under blobs/, mounted again on what it had synced, and the store must open and hold a
# whole version of the key. As published, sled removed the durable version's file while the
# newer version was still unsynced: the store came back without the key.
#
#   LAZYFS_BIN=path/to/lazyfs bash vendor/sled-suites/blob-cut.sh [TRIALS]   (default 5)
#
# LazyFS comes from scripts/lazyfs.sh build. CARGO_TARGET_DIR is honoured (default: the
# repository's target/). Prints a line per trial and `blob-cut: N trials, K failed`.
set -euo pipefail
cd "$(dirname "$0")"
trials=${1:-5}
lazyfs_sh=$(cd ../.. && pwd)/scripts/lazyfs.sh
[ -n "${LAZYFS_BIN:-}" ] || { echo "blob-cut: set LAZYFS_BIN (scripts/lazyfs.sh build DIR prints it)" >&2; exit 2; }
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$(cd ../.. && pwd)/target}
timeout -k 10 600 cargo build --quiet --bin blob-writer
writer=$CARGO_TARGET_DIR/debug/blob-writer

work=$(mktemp -d /tmp/blob-cut.XXXXXX)
lazy_pid=
writer_pid=
cleanup() {
  [ -z "$writer_pid" ] || kill -KILL "$writer_pid" 2>/dev/null || true
  [ -z "$lazy_pid" ] || bash "$lazyfs_sh" umount "$dir" 2>/dev/null || true
  [ -z "$lazy_pid" ] || kill -KILL "$lazy_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# wait_for SECONDS COMMAND...: polls COMMAND every 0.1 s until it succeeds; status 1 at the end.
wait_for() {
  local tries=$(($1 * 10))
  shift
  for _ in $(seq "$tries"); do "$@" && return 0; sleep 0.1; done
  return 1
}
lazyfs_gone() { ! kill -0 "$lazy_pid" 2>/dev/null; }

failed=0
for i in $(seq "$trials"); do
  dir=$work/trial-$i
  lazy_pid=$(bash "$lazyfs_sh" mount "$LAZYFS_BIN" "$dir")
  "$writer" write "$dir/mnt/store" >"$dir/writer.out" 2>&1 &
  writer_pid=$!
  wait_for 30 grep -q "durable 1" "$dir/writer.out" \
    || { cat "$dir/writer.out" >&2; echo "blob-cut: trial $i: version 1 not durable within 30 s" >&2; exit 1; }
  timeout 10 bash -c 'echo "lazyfs::crash::timing=after::op=unlink::from_rgx=.*/blobs/.*" >"$1"' \
    _ "$dir/faults.fifo" || { echo "blob-cut: LazyFS did not take the crash command" >&2; exit 1; }
  wait_for 60 lazyfs_gone \
    || { echo "blob-cut: trial $i: no blob file removed within 60 s" >&2; exit 1; }
  written=$(grep -c "^written" "$dir/writer.out" || true)
  kill -KILL "$writer_pid" 2>/dev/null || true
  wait "$writer_pid" 2>/dev/null || true
  writer_pid=
  wait "$lazy_pid" 2>/dev/null || true
  bash "$lazyfs_sh" umount "$dir"
  lazy_pid=$(bash "$lazyfs_sh" mount "$LAZYFS_BIN" "$dir")
  if result=$(timeout 60 "$writer" check "$dir/mnt/store" 2>"$dir/check.err"); then
    echo "blob-cut: trial $i: cut after $((written + 1)) versions, at the first blob removed: $result"
  else
    failed=$((failed + 1))
    [ -n "$result" ] || result="FAILED: the store did not open: $(grep -m1 -E "panicked|Error" "$dir/check.err" || tail -1 "$dir/check.err")"
    echo "blob-cut: trial $i: cut after $((written + 1)) versions, at the first blob removed: $result"
  fi
  bash "$lazyfs_sh" umount "$dir"
  kill -KILL "$lazy_pid" 2>/dev/null || true
  wait "$lazy_pid" 2>/dev/null || true
  lazy_pid=
done
echo "blob-cut: $trials trials, $failed failed"
[ "$failed" -eq 0 ]
