#!/usr/bin/env bash
# The console in a real browser: installs Debian's chromium and chromium-driver and Python's
# selenium (pinned) when missing, then runs scripts/console_browser.py against the release
# binary. Where the browser cannot be installed it says so plainly and skips.
#
#   ORDERLY_BIN=target/release/orderly SHOTS_DIR=/tmp/shots bash scripts/console-browser.sh
set -euo pipefail
cd "$(dirname "$0")/.."

SELENIUM_VERSION=4.51.0
if ! [ -x /usr/bin/chromium ] || ! [ -x /usr/bin/chromedriver ]; then
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } >&2; then
    echo "console browser test SKIPPED: Debian's chromium and chromium-driver could not be installed"
    exit 0
  fi
fi
venv=${SELENIUM_VENV:-target/selenium-venv}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/pip" show -q "selenium==$SELENIUM_VERSION" >/dev/null 2>&1; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "selenium==$SELENIUM_VERSION"
fi
bin=${ORDERLY_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release --quiet
  bin=target/release/orderly
fi
export ORDERLY_BIN=$bin
export SHOTS_DIR=${SHOTS_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/orderly-console-shots.XXXXXX")}
"$venv/bin/python" scripts/console_browser.py
