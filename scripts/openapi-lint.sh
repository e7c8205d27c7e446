#!/usr/bin/env bash
# A linter nobody here wrote, as a partner's tooling would run it: Redocly CLI (pinned, from
# npm) with its recommended rules, against the /openapi.json a release server serves; then the
# same tool renders that document into one browsable HTML page, the API reference
# (API_REFERENCE, default target/api-reference.html; nothing tracked).
#
#   bash scripts/openapi-lint.sh            # builds the release binary unless ORDERLY_BIN is set
set -euo pipefail
cd "$(dirname "$0")/.."

REDOCLY_VERSION=2.77.0
tools=${REDOCLY_DIR:-target/redocly}
if [ ! -x "$tools/node_modules/.bin/redocly" ] \
  || [ "$("$tools/node_modules/.bin/redocly" --version 2>/dev/null | tail -1)" != "$REDOCLY_VERSION" ]; then
  mkdir -p "$tools"
  npm install --prefix "$tools" --no-audit --no-fund --silent "@redocly/cli@$REDOCLY_VERSION" >&2
fi

bin=${ORDERLY_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release --quiet
  bin=target/release/orderly
fi
scratch=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$scratch"' EXIT
"$bin" serve --listen 127.0.0.1:0 --data-dir "$scratch/db" >"$scratch/out" 2>"$scratch/err" &
pid=$!
for _ in $(seq 1 100); do
  grep -q '^orderly listening on ' "$scratch/out" 2>/dev/null && break
  sleep 0.1
done
base=$(sed -n 's/^orderly listening on //p' "$scratch/out" | head -1)
[ -n "$base" ] || { cat "$scratch/err"; echo "the server did not start"; exit 1; }
curl -sf "$base/openapi.json" -o "$scratch/openapi.json"
"$tools/node_modules/.bin/redocly" lint --format=summary "$scratch/openapi.json" 2>&1 \
  | grep -v '[║╔╚]'
reference=${API_REFERENCE:-target/api-reference.html}
mkdir -p "$(dirname "$reference")"
"$tools/node_modules/.bin/redocly" build-docs "$scratch/openapi.json" -o "$reference" >/dev/null 2>&1 \
  || { echo "redocly build-docs failed"; exit 1; }
echo "the API reference, rendered from /openapi.json: $reference ($(wc -c <"$reference") bytes)"
