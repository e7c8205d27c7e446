# shellcheck shell=bash
# Shared helpers for bench.sh, crash-trials.sh and soak.sh (sourced, not run):
# finding the binary, installing wrk, a scratch directory, starting/stopping/killing servers,
# and an EXIT trap that stops every server and background job these scripts started.

SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(dirname "$SCRIPTS_DIR")
ADMIN_TOKEN=${ADMIN_TOKEN:-load-test-admin-token}
# shellcheck disable=SC2034  # used by the scripts that source this file
CLIENT=(python3 "$SCRIPTS_DIR/orderly_client.py")
SERVER_PIDS=()   # every server started (cleanup kills the live ones)
ORDERLY_WRAP=()  # a command the server is started under (disk-full.sh: a file-size limit)
BG_PIDS=()       # other background jobs (wrk, load clients)

log() { echo "[$(date +%T)] $*" >&2; }
die() { log "FAIL: $*"; exit 1; }

# ORDERLY: the binary. $ORDERLY_BIN if set, else a release build of this checkout.
resolve_bin() {
  if [ -n "${ORDERLY_BIN:-}" ]; then
    ORDERLY=$ORDERLY_BIN
  else
    log "building release binary (set ORDERLY_BIN to skip)"
    (cd "$REPO_DIR" && cargo build --release --quiet)
    ORDERLY=$REPO_DIR/target/release/orderly
  fi
  [ -x "$ORDERLY" ] || die "no executable at $ORDERLY"
}

ensure_wrk() {
  command -v wrk >/dev/null && return 0
  log "installing wrk"
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >&2
  command -v wrk >/dev/null || die "could not install wrk"
}

# WORK: a scratch directory, removed on exit unless KEEP_WORK=1 (or a check failed).
make_work() {
  WORK=$(mktemp -d /tmp/orderly-load.XXXXXX)
  KEEP_WORK=${KEEP_WORK:-0}
  trap cleanup EXIT
  trap 'exit 130' INT TERM
}

cleanup() {
  local rc=$? pid
  for pid in "${BG_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${SERVER_PIDS[@]}"; do
    kill -0 "$pid" 2>/dev/null || continue
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  # A filesystem mounted inside the scratch directory (disk-full.sh) goes before it does.
  # Bounded: a FUSE mount whose daemon stopped answering (LazyFS) would hold a plain umount;
  # then it is detached lazily.
  [ -z "${UNMOUNT:-}" ] || timeout 10 umount "$UNMOUNT" 2>/dev/null \
    || umount -l "$UNMOUNT" 2>/dev/null || true
  if [ "$rc" -ne 0 ] || [ "$KEEP_WORK" = 1 ]; then
    log "scratch directory kept: $WORK"
  else
    rm -rf "$WORK"
  fi
}

# start_server DATA_DIR LOG_PREFIX [extra serve flags...]
# Sets SERVER_PID and BASE_URL once the server printed its "listening on" line (<= 15 s).
start_server() {
  local data=$1 logp=$2
  shift 2
  "${ORDERLY_WRAP[@]}" "$ORDERLY" serve --listen 127.0.0.1:0 --data-dir "$data" --admin-token "$ADMIN_TOKEN" \
    --rate-limit 100000000 "$@" >"$logp.out" 2>"$logp.err" &
  SERVER_PID=$!
  SERVER_PIDS+=("$SERVER_PID")
  BASE_URL=
  for _ in $(seq 1 150); do
    BASE_URL=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$logp.out" 2>/dev/null | head -1 || true)
    [ -n "$BASE_URL" ] && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || { tail -20 "$logp.err" >&2; die "server exited at start"; }
    sleep 0.1
  done
  die "server did not report its address within 15 s"
}

# forget_pid PID: drop a finished server from SERVER_PIDS (so cleanup never signals a reused pid).
forget_pid() {
  local keep=() p
  for p in "${SERVER_PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  SERVER_PIDS=("${keep[@]}")
}

# stop_server PID: SIGTERM, wait up to 10 s, report the exit status (the contract says 0).
stop_server() {
  local pid=$1 rc=0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    log "WARN: server $pid still running 10 s after SIGTERM; killing it"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || rc=$?
  forget_pid "$pid"
  [ "$rc" -eq 0 ] || log "WARN: server exited with status $rc after SIGTERM (expected 0)"
  return 0
}

# crash_server PID: SIGKILL, no chance to flush.
crash_server() {
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  forget_pid "$1"
}

# database_url SERVER_URL NAME: the URL of database NAME on the PostgreSQL server of SERVER_URL.
database_url() {
  python3 -c 'import sys, urllib.parse as u; p = u.urlsplit(sys.argv[1]); print(u.urlunsplit(p._replace(path="/" + sys.argv[2])))' "$1" "$2"
}

# rss_kib PID: resident set size from /proc (0 when gone).
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

# result_field NAME FILE: value of NAME=... on the RESULT line orders.lua prints in done().
result_field() { grep '^RESULT ' "$2" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -1; }
