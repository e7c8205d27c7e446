#!/usr/bin/env bash
# sled 0.34.7's own test suites against vendor/sled, and orderly's tests of its changes to
# sled (README.md), each bounded by `timeout`. Prints each suite's counts, the splits the
# split tests saw (and how many were append splits), and one closing line.
#
#   bash vendor/sled-suites/run.sh          CI: about 3 minutes on 2 cores, debug build
#   LONG=1 bash vendor/sled-suites/run.sh   upstream's full crash-recovery cycles, more kills
#
# CARGO_TARGET_DIR is honoured (defaults to the repository's target/).
set -uo pipefail
cd "$(dirname "$0")"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$(cd ../.. && pwd)/target}
export CARGO_TERM_COLOR=never
# The stores go to memory when it can hold them: the crash tests fsync thousands of times.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi
if [ "${LONG:-0}" = 1 ]; then
  export SLED_CRASH_CYCLES=100 PROPTEST_CASES=64 QUICKCHECK_TESTS=200
  limit=1800
else
  export SLED_CRASH_CYCLES=12 PROPTEST_CASES=8
  limit=240
fi

started=$(date +%s)
timeout -k 10 600 cargo build --tests --quiet || { echo "sled-suites: the build failed"; exit 1; }
built=$(date +%s)
echo "sled-suites: built in $((built - started)) s"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed_suites=()
# Suites that failed without a count of their own (a timeout, a crash of the harness).
uncounted=0
# suite NAME ARGS...: one test target, its summary line kept.
suite() {
  local name=$1 t0 rc
  shift
  t0=$(date +%s)
  timeout -k 10 "$limit" cargo test --quiet --test "$name" -- "$@" >"$log.$name" 2>&1
  rc=$?
  cat "$log.$name" >>"$log"
  local summary
  summary=$(grep -E '^test result:' "$log.$name" | tail -1)
  [ "$rc" = 124 ] && summary="TIMED OUT after $limit s"
  [ -z "$summary" ] && [ "$rc" = 0 ] && summary="ok (its own harness)"
  [ -z "$summary" ] && summary="exit $rc"
  echo "$name ($(($(date +%s) - t0)) s): $summary"
  if [ "$rc" != 0 ]; then
    failed_suites+=("$name")
    grep -qE '^test result:.* [1-9][0-9]* failed' "$log.$name" || uncounted=$((uncounted + 1))
    grep -E -B2 -A12 "panicked at" "$log.$name" | grep -vE '^\s+([0-9]+: |at )' | head -40
  fi
  rm -f "$log.$name"
}

# Upstream's suites (tests/test_*.rs, tests/tree, tests/common).
suite test_tree
suite test_tree_failpoints
suite test_log
suite test_space_leaks
suite test_quiescent
suite test_crash_recovery
# orderly's (README.md): --nocapture for the SPLITS lines.
suite append_split --nocapture
suite concurrent_split --nocapture
suite queue_merge --nocapture
suite split_crash --nocapture
suite kill_model --nocapture
suite leaf_splits
suite run_split

# (--quiet prints a dot per test, without a newline: the lines may follow dots.)
grep -oE '(SPLIT-CRASH|KILL-MODEL) .*' "$log" | cut -c1-200
awk '/SPLITS test=/{sub(/.*SPLITS /, ""); for(i=1;i<=NF;i++){split($i,kv,"="); if(kv[1]=="splits")s+=kv[2]; if(kv[1]=="append")a+=kv[2]; if(kv[1]=="merges")m+=kv[2]}} END {if (s>0) printf "splits seen by the split tests: %d, append splits %d (%.0f %%), merges %d\n", s, a, 100*a/s, m}' "$log"
passed=$(grep -oE '[0-9]+ passed' "$log" | awk '{s+=$1} END {print s+0}')
failed=$(grep -oE '[0-9]+ failed' "$log" | awk '{s+=$1} END {print s+0}')
failed=$((failed + uncounted))
ignored=$(grep -oE '[0-9]+ ignored' "$log" | awk '{s+=$1} END {print s+0}')
# test_crash_recovery has its own harness (four tests, no summary line): one when it passes.
if [[ " ${failed_suites[*]:-} " != *" test_crash_recovery "* ]]; then passed=$((passed + 1)); fi
echo "sled-suites: ran in $(($(date +%s) - built)) s after the build; suites failing: ${failed_suites[*]:-none}"
echo "sled-suites: $ignored ignored"
echo "sled-suites: $passed passed, $failed failed"
[ ${#failed_suites[@]} = 0 ]
