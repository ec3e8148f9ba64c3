#!/usr/bin/env bash
# pack.sh — run HERE before borrowing a GPU machine: builds the CUDA binaries (unmask, gpu_parity and
# the device suites, sm_90, against this machine's Debian libraries) in BUILD_DIR [build] and packs
# them with .deps (scripts/gpu/prepare-deps.sh, run if missing) into .gpucarry/bundle.tar.xz, which
# the device `run` tool carries (carry: [".gpucarry"]; the tracked tree plus .deps unpacked would
# exceed its 64 MiB). run-checks.sh unpacks it into .deps/ and build-gpu/ and skips its own build,
# which saves minutes of a 15-minute lease; if the binaries do not run there it builds as before.
# Prints the bundle's size and what will travel.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD_DIR=${BUILD_DIR:-build}
BINS=(unmask gpu_parity gpu_gemm_bench test_device_loop_gpu test_moe_device_gpu test_device_robust_gpu tests/test_cpu_gemm cpu_kernels_bench)
[ -d .deps/usr/lib ] || bash scripts/gpu/prepare-deps.sh
grep -q "^CMAKE_CUDA_COMPILER:[A-Z]*=/" "$BUILD_DIR/CMakeCache.txt" 2>/dev/null ||
  { echo "pack: $BUILD_DIR is not a CUDA build (configure with nvcc on the PATH)"; exit 1; }
cmake --build "$BUILD_DIR" -j"$(nproc)" $(for b in "${BINS[@]}"; do printf -- '--target %s ' "$(basename "$b")"; done) >/dev/null
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build-gpu"
for b in "${BINS[@]}"; do cp "$BUILD_DIR/$b" "$stage/build-gpu/"; done
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src kernels tests || echo +changes) built $(date -u +%FT%TZ)" \
  > "$stage/build-gpu/.prebuilt"
ln -s "$ROOT/.deps" "$stage/.deps"
mkdir -p .gpucarry
tar -C "$stage" -cf - --dereference .deps build-gpu | xz -T0 -6 > .gpucarry/bundle.tar.xz
echo "pack: .gpucarry/bundle.tar.xz $(du -h .gpucarry/bundle.tar.xz | cut -f1) ($(cat "$stage/build-gpu/.prebuilt"));" \
  "tracked tree $(git ls-files -z | xargs -0 stat -c '%s' | awk '{s+=$1} END {printf "%.1f MiB", s/1048576}')"
