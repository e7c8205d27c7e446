#!/usr/bin/env bash
# The alerts of deploy/alerts.yml hold against the real binary:
#   1. `promtool check rules` (the file is valid) and `promtool test rules` (each alert fires on
#      the series of deploy/alerts.test.yml that should fire it, and not on the others);
#   2. every metric name an alert's expression reads is one the binary exposes: a server on a
#      scratch sled store, its /metrics read, each `orderly_…` name of an expression looked up
#      among the families it lists (a counter's `_total` is its family's).
#
#   ORDERLY_BIN=path/to/orderly scripts/check-alerts.sh [RULES]   (default deploy/alerts.yml)
#
# promtool comes from Debian's `prometheus` package, installed here when it is missing.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

RULES=${1:-$REPO_DIR/deploy/alerts.yml}
TESTS=$(dirname "$RULES")/alerts.test.yml
if ! command -v promtool >/dev/null; then
  log "installing promtool (Debian's prometheus package)"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >&2
fi
promtool check rules "$RULES"
promtool test rules "$TESTS"

resolve_bin
make_work
start_server "$WORK/db" "$WORK/server"
curl -sf "$BASE_URL/metrics" -o "$WORK/metrics" || die "GET /metrics failed"
stop_server "$SERVER_PID"
python3 - "$RULES" "$WORK/metrics" <<'PY'
import re, sys
rules, scraped = open(sys.argv[1]).read(), open(sys.argv[2]).read()
families = set(re.findall(r"^# TYPE (\S+) ", scraped, re.M))
exprs = re.findall(r"^\s*expr:\s*(.+)$", rules, re.M)
used = sorted({n for e in exprs for n in re.findall(r"\borderly_[a-z0-9_]+", e)})
def family(name):
    for suffix in ("_total", "_bucket", "_sum", "_count", "_created"):
        if name.endswith(suffix) and name[: -len(suffix)] in families:
            return name[: -len(suffix)]
    return name if name in families else None
missing = [n for n in used if family(n) is None]
for n in missing:
    print(f"alerts: {n} is read by an alert but /metrics has no such metric")
print(f"alerts: {len(exprs)} expressions read {len(used)} metric names; "
      f"/metrics lists {len(families)} families; {len(missing)} missing")
sys.exit(1 if missing or not used else 0)
PY
