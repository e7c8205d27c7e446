#!/usr/bin/env bash
# A webhook secret's rotation, verified by a library no one here wrote: the official Standard
# Webhooks Python package (pinned, from PyPI) checks a delivery made during the overlap with
# the old and with the new secret, and a redelivery after it with the new one alone. Then the
# verification examples of docs/api.md (docs/webhooks/verify.py and verify.sh) run against a
# real delivery of each event type, and each body is validated against /openapi.json's
# webhooks (jsonschema, pinned).
#
#   bash scripts/webhook-rotation.sh          # builds the release binary unless ORDERLY_BIN is set
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${SW_VENV:-target/standardwebhooks-venv}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/pip" show -q standardwebhooks jsonschema >/dev/null 2>&1; then
  python3 -m venv "$venv"
  # The library and what it pulls in, pinned.
  "$venv/bin/pip" install -q standardwebhooks==1.0.0 httpx==0.28.1 attrs==26.1.0 \
    python-dateutil==4.0.0 Deprecated==1.3.1 types-python-dateutil==2.9.0.20261116 \
    jsonschema==4.23.0 referencing==0.35.1 jsonschema-specifications==2024.10.1 rpds-py==0.22.3
fi

bin=${ORDERLY_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release --quiet
  bin=target/release/orderly
fi
bin=$(realpath "$bin")

scratch=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$scratch"; }
trap cleanup EXIT
admin=rotation-admin-token
"$bin" serve --data-dir "$scratch/db" --listen 127.0.0.1:0 --admin-token "$admin" \
  --allow-private-callbacks --fulfillment-delay 200ms --webhook-secret-overlap 2s \
  >"$scratch/out" 2>"$scratch/err" &
pid=$!
for _ in $(seq 1 100); do
  grep -q '^orderly listening on ' "$scratch/out" 2>/dev/null && break
  sleep 0.1
done
base=$(sed -n 's/^orderly listening on //p' "$scratch/out" | head -1)
[ -n "$base" ] || { echo "orderly did not start"; tail -20 "$scratch/err"; exit 1; }
timeout 60 "$venv/bin/python" scripts/webhook_rotation.py "$base" "$admin"
timeout 120 "$venv/bin/python" scripts/webhook_examples.py "$base" "$admin"
