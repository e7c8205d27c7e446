#!/usr/bin/env bash
# Throughput and p99 against connections, orderly beside the ceiling server, as SVG.
#
#   ORDERLY_BIN=target/release/orderly scripts/plot-bench.sh [OUT_DIR]      (default docs/bench)
#   env: CONNS ("1 16 64"), RUNS (1), DURATION (5s): passed to perf/compare.sh
#        PLOT_ONLY=1: skip the runs and redraw from the JSON already in OUT_DIR
#
# For each connection count it runs compare.sh (the harness: ceiling and orderly back to back,
# ledger verified) with SUMMARY_JSON=OUT_DIR/compare-c<N>.json, then draws with gnuplot:
#   OUT_DIR/throughput.svg  requests/s per scenario (new, hot, replay, mixed), both servers,
#                           and /echo beside the replays
#   OUT_DIR/p99.svg         the p99 latency of the same runs
# Needs gnuplot (Debian: gnuplot-nox; installed here when missing) and python3.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
OUT=${1:-$ROOT/docs/bench}
CONNS=${CONNS:-1 16 64}
COMPARE=${COMPARE:-$ROOT/perf/compare.sh}
mkdir -p "$OUT"

if [[ ${PLOT_ONLY:-0} != 1 ]]; then
  BIN=${ORDERLY_BIN:-$ROOT/target/release/orderly}
  [[ -x $BIN ]] || { echo "plot-bench: build first (cargo build --release) or set ORDERLY_BIN" >&2; exit 2; }
  for c in $CONNS; do
    echo "plot-bench: compare.sh at $c connections" >&2
    # wrk needs at least one connection per thread.
    threads=$(( c < 2 ? 1 : 2 ))
    CONC=$c THREADS=$threads RUNS=${RUNS:-1} DURATION=${DURATION:-5s} \
      SUMMARY_JSON="$OUT/compare-c$c.json" "$COMPARE" "$BIN" | tail -n 1
  done
fi

if ! command -v gnuplot >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gnuplot-nox; } >&2
fi

DATA=$(mktemp -d)
trap 'rm -rf "$DATA"' EXIT
# One data file per scenario: connections, ceiling rps, orderly rps, ceiling p99, orderly p99
# (for the replays, the /echo figures in two more columns).
python3 - "$OUT" "$DATA" $CONNS <<'PY'
import json, sys
out, data, conns = sys.argv[1], sys.argv[2], [int(c) for c in sys.argv[3:]]
for name in ("new", "hot", "replay", "mixed"):
    with open(f"{data}/{name}.dat", "w") as f:
        f.write("# conns ceiling_rps orderly_rps ceiling_p99_ms orderly_p99_ms echo_rps echo_p99_ms\n")
        for c in conns:
            s = json.load(open(f"{out}/compare-c{c}.json"))
            r, e = s[name], s["replay_vs_echo"]
            f.write("%d %.0f %.0f %.2f %.2f %.0f %.2f\n" % (
                c, r["ceiling"], r["orderly"], r["ceiling_p99_ms"], r["orderly_p99_ms"],
                e["echo"], e["echo_p99_ms"]))
PY

draw() { # file title column-of-ceiling column-of-orderly column-of-echo ylabel
  local file=$1 title=$2 cc=$3 oc=$4 ec=$5 ylabel=$6
  gnuplot <<GP
set terminal svg size 960,640 dynamic noenhanced font "sans,12" background "#ffffff"
set output "$OUT/$file"
set multiplot layout 2,2 title "$title (compare.sh: ceiling FLUSH_MODE=group FSYNC=1; orderly default flags)"
set logscale x 2
set xrange [0.8:90]
set xtics ($(echo "$CONNS" | sed 's/\([0-9]*\)/"\1" \1/g; s/ "/, "/g'))
set xlabel "connections"
set ylabel "$ylabel"
set key top left
set grid
set yrange [0:*]
do for [s in "new hot replay mixed"] {
  set title s
  if (s eq "replay") {
    plot "$DATA/".s.".dat" using 1:$cc with linespoints lw 2 title "ceiling", \
         "" using 1:$oc with linespoints lw 2 title "orderly", \
         "" using 1:$ec with linespoints lw 1 dt 2 title "/echo"
  } else {
    plot "$DATA/".s.".dat" using 1:$cc with linespoints lw 2 title "ceiling", \
         "" using 1:$oc with linespoints lw 2 title "orderly"
  }
}
unset multiplot
GP
}
draw throughput.svg "Requests per second" 2 3 6 "requests/s"
draw p99.svg "p99 latency" 4 5 7 "p99 (ms)"
echo "plot-bench: wrote $OUT/throughput.svg and $OUT/p99.svg" >&2
