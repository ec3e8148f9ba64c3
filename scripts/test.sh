#!/usr/bin/env bash
# test.sh — THE test command: install dependencies, build (and the ASan + UBSan server beside it),
# run every test (unit, NumPy reference, CLI, protocol, browser), print "N passed, N failed" and
# exit non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh || exit 1
bash scripts/build.sh || exit 1
BUILD_DIR="${BUILD_DIR:-build}"
# The server built with AddressSanitizer + UBSan, for the tests that run it under the sanitizers
# (http/restart_torture, http/damaged_store: UNMASK_ASAN_BIN in tests/CMakeLists.txt): only the
# unmask target, CUDA off. Not needed when the build above is itself sanitized.
if ! grep -q '^UNMASK_SANITIZE:BOOL=ON' "$BUILD_DIR/CMakeCache.txt"; then
  ASAN_DIR="${BUILD_DIR%/}-asan"
  cmake -S . -B "$ASAN_DIR" -DCMAKE_BUILD_TYPE=Release -DUNMASK_SANITIZE=ON -DUNMASK_CUDA=OFF >/dev/null || exit 1
  cmake --build "$ASAN_DIR" --target unmask -j"$(nproc)" || exit 1
fi
rm -rf "$BUILD_DIR/test-tmp" && mkdir -p "$BUILD_DIR/test-tmp"
log="$BUILD_DIR/ctest.log"
(cd "$BUILD_DIR" && ctest --output-on-failure -j"$(nproc)" "$@") 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
summary=$(grep -E "tests passed, [0-9]+ tests? failed out of [0-9]+" "$log" | tail -1)
total=$(echo "$summary" | sed -E 's/.*out of ([0-9]+).*/\1/')
failed=$(echo "$summary" | sed -E 's/.*passed, ([0-9]+) tests? failed.*/\1/')
if [ -z "$total" ] || [ -z "$summary" ]; then
  echo "0 passed, 1 failed"
  exit 1
fi
echo "$((total - failed)) passed, ${failed} failed"
[ "$rc" -eq 0 ] && [ "$failed" -eq 0 ]
