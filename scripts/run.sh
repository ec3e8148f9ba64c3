#!/usr/bin/env bash
# run.sh — THE run command: install build dependencies, build, and start `unmask serve` on the
# bundled model: models/unmask-code-13m, a small masked-diffusion code model in the exact LLaDA
# layout trained by tools/train/ (its MODEL.md). UNMASK_MODEL=DIR serves another checkpoint; a
# directory without config.json gets a random `make-model --preset demo` checkpoint first.
# Extra arguments go to `unmask serve` (e.g. --port 9000).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --runtime-only
bash scripts/build.sh
MODEL_DIR="${UNMASK_MODEL:-models/unmask-code-13m}"
if [ ! -f "$MODEL_DIR/config.json" ]; then
  echo "run: creating a random demo model in $MODEL_DIR"
  ./build/unmask make-model --preset demo --out "$MODEL_DIR"
fi
exec ./build/unmask serve --model "$MODEL_DIR" "$@"
