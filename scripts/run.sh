#!/usr/bin/env bash
# run.sh — THE run command: install build dependencies, build the server binary (only build/unmask:
# no tests, emulator or benchmarks; quietly, the log in build/run-build.log), and start `unmask
# serve` on the bundled model: models/unmask-code-13m, a small masked-diffusion code model in the
# exact LLaDA layout trained by tools/train/ (its MODEL.md). UNMASK_MODEL=DIR serves another
# checkpoint; a directory without config.json gets a random `make-model --preset demo` checkpoint
# first. Extra arguments go to `unmask serve` (e.g. --port 9000, or --host 0.0.0.0 to be reachable
# from other machines). On a terminal the server prints the URL to open last, once the model is ready.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --runtime-only
BUILD_DIR="${BUILD_DIR:-build}"
mkdir -p "$BUILD_DIR"
LOG="$BUILD_DIR/run-build.log"
t0=$(date +%s)
printf 'run: building %s/unmask (a first build takes a few minutes) ... ' "$BUILD_DIR"
if ! { cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release && cmake --build "$BUILD_DIR" -j"$(nproc)" --target unmask; } >"$LOG" 2>&1; then
  echo "failed"
  tail -n 30 "$LOG"
  echo "run: the build failed; the whole log is $LOG"
  exit 1
fi
echo "done in $(($(date +%s) - t0)) s"
MODEL_DIR="${UNMASK_MODEL:-models/unmask-code-13m}"
if [ ! -f "$MODEL_DIR/config.json" ]; then
  echo "run: creating a random demo model in $MODEL_DIR"
  "./$BUILD_DIR/unmask" make-model --preset demo --out "$MODEL_DIR"
fi
exec "./$BUILD_DIR/unmask" serve --model "$MODEL_DIR" "$@"
