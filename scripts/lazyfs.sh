#!/usr/bin/env bash
# LazyFS (MIT, github.com/dsrhaslab/lazyfs): a FUSE file system that keeps written data until it is
# fsynced and drops the rest on `lazyfs::clear-cache` (a power cut on demand); stopped with
# SIGSTOP, it is a disk that stops answering. Built from a copy of its sources in a scratch
# directory (nothing in this checkout or in the source tree is written).
#   scripts/lazyfs.sh build DIR       copies the sources to DIR/src, installs Debian's build
#                                     packages when missing, builds; prints the binary's path
#   scripts/lazyfs.sh mount BIN DIR   mounts DIR/mnt over DIR/root (faults FIFO DIR/faults.fifo),
#                                     in the background; prints the LazyFS process's pid
#   scripts/lazyfs.sh umount DIR      unmounts DIR/mnt (continuing a stopped LazyFS first)
# Env: LAZYFS_SRC (LazyFS's source tree, needed by build: exit 3 without it, which CI reports as
# SKIPPED), LAZYFS_CACHE (1gb: unsynced data it may hold)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:?usage: lazyfs.sh build DIR | mount BIN DIR | umount DIR}

case $cmd in
  build)
    dir=${2:?usage: lazyfs.sh build DIR}
    src=${LAZYFS_SRC:-}
    [ -n "$src" ] && [ -d "$src/lazyfs" ] \
      || { echo "lazyfs: no LazyFS sources (set LAZYFS_SRC to its source tree; now: '${src}')" >&2; exit 3; }
    missing=()
    for pkg in cmake g++ libfuse3-dev fuse3 libtoml11-dev libspdlog-dev; do
      dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >&2
    fi
    mkdir -p "$dir"
    rm -rf "$dir/src"
    cp -r "$src" "$dir/src"
    rm -rf "$dir/src/libs/libpcache/build" "$dir/src/lazyfs/build"
    (cd "$dir/src/libs/libpcache" && ./build.sh) >"$dir/build.log" 2>&1 \
      || { tail -30 "$dir/build.log" >&2; exit 1; }
    (cd "$dir/src/lazyfs" && ./build.sh) >>"$dir/build.log" 2>&1 \
      || { tail -30 "$dir/build.log" >&2; exit 1; }
    echo "$dir/src/lazyfs/build/lazyfs"
    ;;
  mount)
    bin=${2:?usage: lazyfs.sh mount BIN DIR}
    dir=${3:?usage: lazyfs.sh mount BIN DIR}
    mkdir -p "$dir/mnt" "$dir/root"
    cat >"$dir/config.toml" <<TOML
[faults]
fifo_path="$dir/faults.fifo"
[cache]
apply_eviction=false
[cache.simple]
custom_size="${LAZYFS_CACHE:-1gb}"
blocks_per_page=1
[filesystem]
log_all_operations=false
logfile="$dir/lazyfs.log"
TOML
    "$bin" "$dir/mnt" --config-path "$dir/config.toml" -o allow_other -o modules=subdir \
      -o "subdir=$dir/root" -f >"$dir/lazyfs.out" 2>&1 &
    pid=$!
    for _ in $(seq 100); do
      if mountpoint -q "$dir/mnt" && [ -p "$dir/faults.fifo" ]; then
        echo "$pid"
        exit 0
      fi
      kill -0 "$pid" 2>/dev/null || { cat "$dir/lazyfs.out" >&2; exit 1; }
      sleep 0.1
    done
    echo "lazyfs: not mounted within 10 s" >&2
    exit 1
    ;;
  umount)
    dir=${2:?usage: lazyfs.sh umount DIR}
    pkill -CONT -f "lazyfs $dir/mnt" 2>/dev/null || true
    fusermount3 -u "$dir/mnt" 2>/dev/null || umount -l "$dir/mnt" 2>/dev/null || true
    ;;
  *)
    echo "usage: lazyfs.sh build DIR | mount BIN DIR | umount DIR" >&2
    exit 2
    ;;
esac
