#!/usr/bin/env bash
# The torture runs of CI: each engine for a fixed budget, with a fixed seed (a run any
# change must keep passing) and one drawn at random and printed (new interleavings every time;
# a failure prints its seed and its history replays it).
#   torture/ci.sh [ORDERLY_BIN]      (default target/release/orderly; builds the harness)
# Env: DURATION (3m, sled: its default faults need 2m40s with LazyFS, 3m with rolling-upgrade
#      too), PG_DURATION (4m20s, PostgreSQL: its default faults need 3m50s, 4m20s with
#      rolling-upgrade), SEED (1), LAZYFS_BIN (power-loss and disk-stall; SKIPPED
#      without it), OLD_BIN (an earlier orderly build: rolling-upgrade; SKIPPED without it),
#      DATABASE_URL (a maintenance URL; default: a throwaway cluster per run)
# Exits 1 when any run found a violation, 2 when a run could not run.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/orderly}
DURATION=${DURATION:-3m}
PG_DURATION=${PG_DURATION:-4m20s}
SEED=${SEED:-1}
cargo build --release --quiet -p orderly-torture || exit 2
T=target/release/orderly-torture
pg=()
[ -n "${DATABASE_URL:-}" ] && pg=(--database-url "$DATABASE_URL")
old=()
[ -n "${OLD_BIN:-}" ] && old=(--old-bin "$OLD_BIN")
random_seed=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
status=0
run() {
  local duration=$1
  shift
  echo "== orderly-torture --duration $duration $*"
  "$T" --bin "$BIN" --duration "$duration" "${old[@]}" "$@"
  local rc=$?
  [ "$rc" -gt "$status" ] && status=$rc
  return 0
}
run "$DURATION" --engine sled --seed "$SEED"
run "$DURATION" --engine sled --seed "$random_seed"
run "$PG_DURATION" --engine postgres --instances 2 --seed "$SEED" "${pg[@]}"
run "$PG_DURATION" --engine postgres --instances 3 --seed "$random_seed" "${pg[@]}"
exit "$status"
