#!/usr/bin/env bash
# A client no one here wrote: validates /openapi.json with openapi-spec-validator, then runs
# schemathesis (both pinned, from PyPI) against a running orderly with the demo data, a valid
# API key, the admin token and an idempotency key supplied. It fails on any 5xx and on any
# response that contradicts the document.
#
#   bash scripts/schemathesis.sh            # builds the release binary unless ORDERLY_BIN is set
#   ST_MAX_EXAMPLES=50 bash scripts/schemathesis.sh
set -euo pipefail
cd "$(dirname "$0")/.."

SCHEMATHESIS_VERSION=4.32.5
VALIDATOR_VERSION=0.7.2
venv=${ST_VENV:-target/schemathesis-venv}
if [ ! -x "$venv/bin/st" ] || ! "$venv/bin/pip" show -q "schemathesis==$SCHEMATHESIS_VERSION" >/dev/null 2>&1; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "schemathesis==$SCHEMATHESIS_VERSION" "openapi-spec-validator==$VALIDATOR_VERSION"
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
mkdir -p "$scratch/data" && cp data/demo.json "$scratch/data/"
admin=st-admin-token
(cd "$scratch" && exec "$bin" serve --demo --listen 127.0.0.1:0 --admin-token "$admin" \
   --rate-limit 100000000 --provider-secret acmepay=st-secret >"$scratch/out" 2>"$scratch/err") &
pid=$!
for _ in $(seq 1 100); do
  grep -q '^orderly listening on ' "$scratch/out" 2>/dev/null && break
  sleep 0.1
done
base=$(sed -n 's/^orderly listening on //p' "$scratch/out" | head -1)
[ -n "$base" ] || { echo "orderly did not start"; cat "$scratch/err"; exit 1; }
key=$(grep -o 'gc_live_[0-9a-f]\{32\}' "$scratch/out" | head -1)

curl -sf "$base/openapi.json" -o "$scratch/openapi.json"
"$venv/bin/openapi-spec-validator" "$scratch/openapi.json"

# From the scratch directory: schemathesis writes its cache (.schemathesis/) into the working
# directory, and nothing CI writes belongs in the checkout.
venv=$(realpath "$venv")
(cd "$scratch" && "$venv/bin/st" run "$base/openapi.json" \
  --header "X-Api-Key: $key" \
  --header "Authorization: Bearer $admin" \
  --header "X-Idempotency-Key: schemathesis-run-1" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance \
  --max-examples "${ST_MAX_EXAMPLES:-25}" \
  --seed "${ST_SEED:-20261130}" \
  --request-timeout 10 \
  --workers 2 \
  --no-color \
  --warnings off)
