#!/usr/bin/env bash
# run.sh — the adversarial battery, one command, bounded in time (a few minutes at scale 1):
#   bash tests/adversarial/run.sh [BIN] [SCALE]
# BIN: the unmask binary (default build/unmask; build-asan/unmask for a sanitizer run, see
# scripts/fuzz.sh). Runs battery.mjs (bad inputs, traversal, slowloris, WebSocket sessions, SSE,
# disconnect storms, resume cycles) plain and over TLS, then the byte-stream fuzzer
# (http_stream_fuzz.mjs) plain and over TLS for 60 s x SCALE each. Prints the summary tables that
# docs/reliability.md keeps; exits non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN="${1:-build/unmask}"
SCALE="${2:-1}"
[ -x "$BIN" ] || { echo "run.sh: $BIN is not an executable (build first: bash scripts/build.sh)"; exit 2; }
[ -d tests/node_modules ] || (cd tests && npm ci --no-audit --no-fund --loglevel=error)
rc=0
for mode in "" --tls; do
  node tests/adversarial/battery.mjs --bin "$BIN" --scale "$SCALE" $mode || rc=1
done
secs=$(awk "BEGIN { s = int(60 * $SCALE); print (s < 5 ? 5 : s) }")
for mode in "" --tls; do
  node tests/adversarial/http_stream_fuzz.mjs --bin "$BIN" --seconds "$secs" --seed 1 $mode || rc=1
done
exit $rc
