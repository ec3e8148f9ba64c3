#!/usr/bin/env bash
# test_bench_serve.sh — `unmask bench --serve` starts its own server with its own job store (in
# memory), so it runs beside an `unmask serve` that holds the default SQLite store of the same
# working directory; a server that cannot start is reported in its own words, not as a guess.
set -u
BIN="${UNMASK_BIN:?UNMASK_BIN not set}"
TMP="${UNMASK_TEST_TMP:-/tmp}/test_bench_serve"
source "$(dirname "$0")/lib.sh"

"$BIN" make-model --out "$TMP/m" --preset tiny --quiet || { echo "make-model failed"; exit 1; }
cd "$TMP" || exit 1
# a server on the default store (./unmask-data/jobs.db), as `scripts/run.sh` leaves one running
"$BIN" serve --model "$TMP/m" --host 127.0.0.1 --port 0 --threads 1 >"$TMP/serve.log" 2>&1 &
SRV=$!
trap 'kill "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null' EXIT
for _ in $(seq 1 1200); do   # until it listens (or exits): up to 2 min on a loaded machine
    grep -q "listening on" "$TMP/serve.log" && break
    kill -0 "$SRV" 2>/dev/null || break
    sleep 0.1
done
if grep -q "listening on" "$TMP/serve.log" && grep -q "SQLite" "$TMP/serve.log"; then
    passed=$((passed + 1)); echo "PASS a server holds the default SQLite store of $TMP"
else
    failed=$((failed + 1)); echo "FAIL the first server did not start: $(tail -3 "$TMP/serve.log")"
fi

if timeout 600 "$BIN" bench --serve --model "$TMP/m" --clients 1 --requests 1 --gen-length 8 --block-length 8 \
    --threads 1 >"$TMP/out" 2>"$TMP/err" && grep -q "tokens/s:" "$TMP/out"; then
    passed=$((passed + 1)); echo "PASS bench --serve runs beside it"
else
    failed=$((failed + 1)); echo "FAIL bench --serve beside a running server: $(tail -3 "$TMP/err")"
fi

"$BIN" bench --serve --model "$TMP/m" --clients 1 --requests 1 --threads 5000 >"$TMP/out" 2>"$TMP/err"
rc=$?
if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q "the server did not start; it said:" "$TMP/err" &&
    grep -q -- "--threads must be in \[0, 1024\], got 5000" "$TMP/err"; then
    passed=$((passed + 1)); echo "PASS a server that cannot start: its own error is shown"
else
    failed=$((failed + 1)); echo "FAIL a server that cannot start (rc $rc): $(cat "$TMP/err")"
fi
finish
