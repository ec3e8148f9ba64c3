#!/usr/bin/env bash
# test_run_script.sh — the README's run command, scripts/run.sh, on a fresh copy of the repository:
# it builds only the server binary (no tests, emulator, parity or benchmark binaries), prints one
# progress line instead of the build's output, and starts the server on the bundled model, which
# answers /health. The server is stopped at the end, also on failure.
set -u
SRC="${UNMASK_SOURCE_DIR:?}"
TMP="${UNMASK_TEST_TMP:-/tmp}/test_run_script"
rm -rf "$TMP"
mkdir -p "$TMP/repo"
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "PASS $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

# a fresh copy: the files a clone of the working tree would have (tracked + new, not ignored)
(cd "$SRC" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$TMP/repo")
[ -f "$TMP/repo/scripts/run.sh" ] && ok "copied" || bad "copy"

OUT="$TMP/out.txt"
(cd "$TMP/repo" && exec bash scripts/run.sh --host 127.0.0.1 --port 0 --threads 1) >"$OUT" 2>&1 &
PID=$!
cleanup() { kill "$PID" 2>/dev/null; pkill -P "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; }
trap cleanup EXIT

# wait for the URL line (the build comes first), as long as run.sh is alive
url=""
while kill -0 "$PID" 2>/dev/null; do
  url=$(sed -n 's/^unmask: listening on \(http:[^ ]*\).*/\1/p' "$OUT")
  [ -n "$url" ] && break
  sleep 0.5   # polling the output file for the URL line
done
[ -n "$url" ] && ok "server started: $url" || { bad "no URL printed; output:"; cat "$OUT"; }

if [ -n "$url" ]; then
  body=""
  for _ in $(seq 1 300); do   # the model loads in the background: /health turns 200
    body=$(curl -fsS "${url}health" 2>/dev/null) && break
    sleep 0.2
  done
  [[ "$body" == *ok* || "$body" == *ready* ]] && ok "/health answers: $body" || bad "/health: '$body'"
fi

B="$TMP/repo/build"
[ -x "$B/unmask" ] && ok "build/unmask built" || bad "build/unmask missing"
others=$(find "$B" -maxdepth 2 -type f -perm -u+x \( -name 'test_*' -o -name 'unmask-emu' -o -name 'gpu_parity*' -o -name '*_emu' \) | head -5)
[ -z "$others" ] && ok "nothing else built" || bad "other binaries were built: $others"
before=$(sed -n '/^unmask: listening/q;p' "$OUT" | wc -l)
[ "$before" -le 4 ] && ok "quiet: $before lines before the URL" || { bad "$before lines before the URL:"; head -20 "$OUT"; }
grep -q '^run: building .* done in' "$OUT" && ok "one progress line" || bad "no progress line"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
