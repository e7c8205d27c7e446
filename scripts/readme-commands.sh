#!/usr/bin/env bash
# Prints line N (1 or 2) of the README's first code block, its trailing comment removed:
# line 1 is the demo command and line 2 the test command. demo-smoke.sh and .ci/run run what
# this prints, so a change to either README line is what CI runs next.
#
#   bash scripts/readme-commands.sh 1   # cargo run --release -- serve --demo
set -euo pipefail
n=${1:?usage: readme-commands.sh 1|2}
readme="$(dirname "$0")/../README.md"
line=$(awk -v n="$n" '
  /^```/ { if (inside) exit; inside = 1; next }
  inside && ++seen == n { print; exit }
' "$readme")
line=${line%%#*}
line=$(printf '%s' "$line" | sed -E 's/[[:space:]]+$//')
[ -n "$line" ] || { echo "README.md: no line $n in the first code block" >&2; exit 1; }
printf '%s\n' "$line"
