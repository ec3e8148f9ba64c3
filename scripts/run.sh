#!/usr/bin/env bash
# run.sh — THE run command: install build dependencies, build, create the bundled model (a small
# random checkpoint in the exact LLaDA layout, made by `unmask make-model`) if it is missing, and
# start `unmask serve` on it. Extra arguments go to `unmask serve` (e.g. --port 9000).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --runtime-only
bash scripts/build.sh
MODEL_DIR="${UNMASK_MODEL:-models/bundled}"
if [ ! -f "$MODEL_DIR/config.json" ]; then
  echo "run: creating the bundled model in $MODEL_DIR"
  ./build/unmask make-model --preset demo --out "$MODEL_DIR"
fi
exec ./build/unmask serve --model "$MODEL_DIR" "$@"
