#!/usr/bin/env bash
# Where orderly's CPU goes under compare.sh's load: per scenario, per thread, per function.
# Usage: perf/profile.sh ORDERLY_BIN [SCENARIO...]   (scenarios: new hot replay mixed; all by default)
# Starts `ORDERLY_BIN serve` on a fresh data dir with compare.sh's flags, seeds it the same way
# (perf/orderly-setup.py, 100 accounts), and for each scenario runs wrk for DURATION while
# `perf record` samples the server at FREQ Hz on every thread. Prints, per scenario, the
# requests per second (lower than compare.sh's: the sampling costs a little), the share of the
# server's samples each kind of thread took and how many cores it kept busy (the writer, the
# commit thread, sled's flusher, the request threads...), and each busy thread's hottest functions (self time, no call graph:
# a release build keeps no frame pointers).
# Env: DURATION (10s) CONC (64) THREADS (2) ACCOUNTS (100) REPLAY_KEYS (1000) FREQ (499)
#      TOP (12 functions per thread kind) ORDERLY_ARGS (more flags for `serve`) KEEP=1
#      DATABASE_URL (serve on that PostgreSQL database instead of a fresh sled store)
#      WHOLE_MACHINE=1 (sample every process, PostgreSQL's and wrk's too, not the server alone)
# Exit: 0 when every scenario ran, 2 on a failure to run.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=${1:?usage: perf/profile.sh ORDERLY_BIN [SCENARIO...]}; shift
[[ -x $BIN ]] || { echo "profile: $BIN is not an executable" >&2; exit 2; }
SCENARIOS=("$@"); [[ ${#SCENARIOS[@]} -gt 0 ]] || SCENARIOS=(new hot replay mixed)
DURATION=${DURATION:-10s}; CONC=${CONC:-64}; THREADS=${THREADS:-2}; ACCOUNTS=${ACCOUNTS:-100}
REPLAY_KEYS=${REPLAY_KEYS:-1000}; FREQ=${FREQ:-499}; TOP=${TOP:-12}
export THREADS REPLAY_KEYS
command -v perf >/dev/null || { echo "profile: perf is not installed (apt-get install linux-perf)" >&2; exit 2; }
command -v wrk >/dev/null || { echo "profile: wrk is not installed (perf/compare.sh installs it)" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/orderly-profile.XXXXXX")
PID=""
cleanup() {
  [[ -n $PID ]] && kill -TERM "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  if [[ ${KEEP:-0} = 1 ]]; then echo "profile: kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
die() { echo "profile: $*" >&2; exit 2; }
secs() { case $1 in *m) echo $(( ${1%m} * 60 ));; *s) echo "${1%s}";; *) echo "$1";; esac; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

PORT=$(free_port)
TOKEN=perf-admin-$(python3 -c 'import secrets; print(secrets.token_hex(16))')
# shellcheck disable=SC2086
if [[ -n ${DATABASE_URL:-} ]]; then STORE=(--database-url "$DATABASE_URL"); else STORE=(--data-dir "$WORK/orderly-db"); fi
"$BIN" serve --listen 127.0.0.1:"$PORT" "${STORE[@]}" --admin-token "$TOKEN" \
  --rate-limit 100000000 --fulfillment-delay 1h ${ORDERLY_ARGS:-} >"$WORK/orderly.log" 2>&1 &
PID=$!
URL=http://127.0.0.1:$PORT
for _ in $(seq 300); do
  [[ $(curl -s -o /dev/null -w '%{http_code}' "$URL/healthz") = 200 ]] && break
  kill -0 "$PID" 2>/dev/null || break; sleep 0.1
done
[[ $(curl -s -o /dev/null -w '%{http_code}' "$URL/healthz") = 200 ]] \
  || { tail -n 20 "$WORK/orderly.log" >&2; die "orderly did not answer /healthz"; }
KEYS=$WORK/keys.txt
PRODUCTS=$(python3 "$HERE/orderly-setup.py" --url "$URL" --admin-token "$TOKEN" --keys-file "$KEYS" \
  --accounts "$ACCOUNTS") || die "orderly setup failed"
ENV=(BODY_SHAPE=orderly ORDER_PATH=/b2b/orders API_KEYS_FILE=$KEYS PRODUCTS=$PRODUCTS)

load() { # script accounts [more env]: one wrk run, its RESULT line
  local script=$1 accounts=$2; shift 2
  env "${ENV[@]}" ACCOUNTS="$accounts" "$@" timeout 120 wrk -t"$THREADS" -c"$CONC" -d"$DURATION" \
    --timeout 5s --latency -s "$HERE/wrk/$script.lua" "$URL" 2>&1 | grep '^RESULT'
}

for scenario in "${SCENARIOS[@]}"; do
  case $scenario in
    new) script=new_order accounts=$ACCOUNTS ;;
    hot) script=new_order accounts=1 ;;
    replay) script=replay accounts=$ACCOUNTS
      # every replay key used once first, as compare.sh's warm-up does
      env "${ENV[@]}" ACCOUNTS="$ACCOUNTS" REPLAY_SEQ=1 timeout 60 wrk -t"$THREADS" -c"$CONC" -d6s \
        --timeout 5s -s "$HERE/wrk/replay.lua" "$URL" >/dev/null 2>&1 ;;
    mixed) script=mixed accounts=$ACCOUNTS ;;
    *) die "unknown scenario $scenario (new hot replay mixed)" ;;
  esac
  sleep 1
  data=$WORK/$scenario.data
  [[ ${WHOLE_MACHINE:-0} = 1 ]] && TARGET=(-a) || TARGET=(-p "$PID")
  perf record -q -F "$FREQ" "${TARGET[@]}" -o "$data" 2>"$WORK/$scenario.perf.err" &
  perf_pid=$!
  result=$(load "$script" "$accounts")
  kill -INT "$perf_pid" 2>/dev/null; wait "$perf_pid" 2>/dev/null
  echo "== $scenario ($DURATION, $CONC connections): ${result:-wrk failed}"
  perf report -i "$data" --no-children -n --sort comm,sym --stdio -q 2>/dev/null \
    | python3 "$HERE/profile_summary.py" --top "$TOP" --freq "$FREQ" --seconds "$(secs "$DURATION")"
done
