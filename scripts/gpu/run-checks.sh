#!/usr/bin/env bash
# run-checks.sh — run ON THE GPU MACHINE (an H100/H200 lent through the device `run` tool, with
# carry: [".deps"] prepared here by scripts/gpu/prepare-deps.sh). One command does everything:
#     bash scripts/gpu/run-checks.sh            (= all)
# or one stage per call: build | parity | sanitize | bench | all. `all` can exceed the tool's
# 10-minute limit: prefer one call per stage (each stage builds what it needs on a fresh machine).
#   build     configure CMake against .deps (pkg-config sysroot, OpenSSL root, LD_LIBRARY_PATH) and
#             build unmask, gpu_parity and the unit tests into build-gpu/ (kept between calls on a warm
#             machine); run the C unit tests (CPU numerics + the CUDA init test with a real device)
#   parity    tests/gpu/gpu_parity: every op, attention variant, the sampling / decoder kernels and a
#             whole forward on CUDA vs the CPU backend on make-model bf16 checkpoints, temperature-0
#             decodes (graph vs direct, teacher-forced vs CPU, free-running); then
#             tests/device/test_device_loop (engine's device-resident loop == host loop, events);
#             logits of the Dream / LLaDA-MoE / LLaDA2 presets vs the CPU (tests/gpu/compare_logits.py)
#   sanitize  compute-sanitizer memcheck (and racecheck) on gpu_parity --quick
#   bench     unmask bench --device cuda:0 on an 8B-shaped bf16 model (make-model --preset 8b, in
#             /tmp, reused while the machine stays warm) at batch 1/8/32, gen 256, block 32:
#             ms/step, tokens/s, HBM floor; then bench --decode --device cuda:0 (no cache / dual cache +
#             threshold, prompt 256) beside the PyTorch peer tools/bench/torch_peer.py --device cuda
#             (UNMASK_BENCH_PEER=0 skips that part)
# Logs go to $OUT (the run tool brings them back) or build-gpu/logs/. Exit status != 0 if any stage failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
STAGE=${1:-all}
DEPS=$ROOT/.deps
ARCH=x86_64-linux-gnu
BUILD=$ROOT/build-gpu
LOGS=${OUT:-$BUILD/logs}
MODEL8B=${UNMASK_8B_DIR:-/tmp/unmask-8b}
mkdir -p "$LOGS"
fail=0

if [ ! -d "$DEPS/usr/lib/$ARCH" ]; then
  echo "run-checks: $DEPS missing: run scripts/gpu/prepare-deps.sh on the dev machine and carry .deps"
  exit 1
fi
export PATH="$DEPS/usr/bin:/usr/local/cuda/bin:$PATH"
export LD_LIBRARY_PATH="$DEPS/usr/lib/$ARCH:$DEPS/usr/lib/$ARCH/openblas-pthread:${LD_LIBRARY_PATH:-}"
export PKG_CONFIG_LIBDIR="$DEPS/usr/lib/$ARCH/pkgconfig:$DEPS/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$DEPS"
export CMAKE_PREFIX_PATH="$DEPS/usr"
export UNMASK_TEST_TMP=/tmp/unmask-gpu-tmp
mkdir -p "$UNMASK_TEST_TMP"

stage() { echo; echo "==================== $* ===================="; }

configure() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  # warnings are enforced by CI (Debian's gcc); a newer compiler on the device image must not stop
  # the checks, so -Werror is off here
  # the CPU CUDA emulator (tests/emu) is for CI machines without a GPU: not built here
  if ! cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DUNMASK_WERROR=OFF -DUNMASK_CUDA_EMU=OFF -DPKG_CONFIG_EXECUTABLE="$DEPS/usr/bin/pkgconf" \
        -DOPENSSL_ROOT_DIR="$DEPS/usr" -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" >"$LOGS/configure.log" 2>&1; then
    tail -30 "$LOGS/configure.log"; echo "run-checks: configure FAILED"; return 1
  fi
  grep -E "unmask:" "$LOGS/configure.log"
}

# build targets ($@ empty: everything)
build_targets() {
  local t=()
  for x in "$@"; do t+=(--target "$x"); done
  if ! cmake --build "$BUILD" -j"$(nproc)" "${t[@]}" >"$LOGS/build.log" 2>&1; then
    grep -E "error|Error" "$LOGS/build.log" | head -30; echo "run-checks: build FAILED"; return 1
  fi
  echo "build ok ${*:-(all targets)}"
}

# each stage works on a fresh machine too (a lent machine stays warm only ~30 s after a call)
# (incremental when the machine still has build-gpu/ from an earlier call)
ensure_built() {
  if [ -f "$BUILD/CMakeCache.txt" ]; then build_targets unmask gpu_parity test_device_loop_gpu; return; fi
  stage "build unmask + gpu_parity + test_device_loop_gpu ($(nvcc --version | tail -1))"
  configure && build_targets unmask gpu_parity test_device_loop_gpu
}

do_build() {
  stage "build ($(nvcc --version | tail -1))"
  configure && build_targets || return 1
  stage "unit tests (C)"
  (cd "$BUILD" && ctest -R "^unit/" --output-on-failure -j8 >"$LOGS/unit.log" 2>&1)
  local rc=$?
  tail -4 "$LOGS/unit.log"
  return $rc
}

do_parity() {
  ensure_built || return 1
  stage "gpu_parity"
  "$BUILD/gpu_parity" --tmp "$UNMASK_TEST_TMP" 2>&1 | tee "$LOGS/parity.log" | grep -E "FAIL|gpu_parity|argmax|decode|teacher|free-running"
  local rc=${PIPESTATUS[0]}
  stage "device-resident loop vs host loop through decode/decode_device.h (tests/device/test_device_loop.c)"
  UNMASK_TEST_DEVICE=cuda:0 "$BUILD/test_device_loop_gpu" >"$LOGS/device_loop.log" 2>&1 || rc=$((rc ? rc : 1))
  grep -E "FAIL|passed" "$LOGS/device_loop.log" | tail -5
  stage "model families: logits --device cuda:0 vs cpu (Dream, LLaDA-MoE, LLaDA2 block-causal)"
  local TOK=1,17,300,42,7,99,250,3,8,400,12,77,5,6,200,31 fam d extra
  for fam in dream-tiny lladamoe-tiny llada2-tiny; do
    "$BUILD/unmask" make-model --out "$UNMASK_TEST_TMP/$fam" --preset "$fam" --quiet || { rc=1; continue; }
    extra=(); [ "$fam" = llada2-tiny ] && extra=(--block-length 4)
    for d in cpu cuda:0; do
      "$BUILD/unmask" logits --model "$UNMASK_TEST_TMP/$fam" --tokens "$TOK" "${extra[@]}" \
        --out "$UNMASK_TEST_TMP/l_${fam}_${d%%:*}.npy" --device "$d" >>"$LOGS/families.log" 2>&1 || rc=1
    done
    echo -n "$fam: "
    python3 "$ROOT/tests/gpu/compare_logits.py" "$UNMASK_TEST_TMP/l_${fam}_cpu.npy" "$UNMASK_TEST_TMP/l_${fam}_cuda.npy" || rc=1
  done
  return $rc
}

do_sanitize() {
  ensure_built || return 1
  stage "compute-sanitizer memcheck + racecheck (gpu_parity --quick)"
  local rc=0
  compute-sanitizer --tool memcheck --error-exitcode 99 "$BUILD/gpu_parity" --quick --tmp "$UNMASK_TEST_TMP" \
    >"$LOGS/memcheck.log" 2>&1 || rc=$?
  grep -E "ERROR SUMMARY|gpu_parity:" "$LOGS/memcheck.log" | tail -3
  compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 99 "$BUILD/gpu_parity" --quick \
    --tmp "$UNMASK_TEST_TMP" >"$LOGS/racecheck.log" 2>&1 || rc=$((rc ? rc : $?))
  grep -E "RACECHECK SUMMARY|ERROR SUMMARY|gpu_parity:" "$LOGS/racecheck.log" | tail -3
  [ $rc -eq 0 ] && echo "sanitizers clean" || echo "run-checks: sanitizer reported errors (see memcheck.log / racecheck.log)"
  return $rc
}

do_bench() {
  ensure_built || return 1
  stage "bench: 8B-shaped bf16 model, batch 1/8/32, gen 256, block 32"
  if [ ! -f "$MODEL8B/config.json" ]; then
    echo "writing $MODEL8B (make-model --preset 8b, ~16 GB)"
    "$BUILD/unmask" make-model --out "$MODEL8B" --preset 8b --quiet || return 1
  fi
  "$BUILD/unmask" bench --device cuda:0 --model "$MODEL8B" --batch 1,8,32 --gen 256 --block 32 2>&1 |
    tee "$LOGS/bench.log"
  local rc=${PIPESTATUS[0]}
  [ "${UNMASK_BENCH_PEER:-1}" = 1 ] || return $rc
  # the same decodes side by side with the PyTorch peer (tools/bench/torch_peer.py: eager bf16, SDPA):
  # the reference decode (no cache, one token per step) and Fast-dLLM's dual cache + threshold 0.9,
  # prompt 256, gen 256, block 32, the first 2 blocks timed
  stage "bench: unmask vs PyTorch peer, no-cache low_confidence and dual-cache threshold"
  "$BUILD/unmask" bench --decode --device cuda:0 --model "$MODEL8B" --batch 1,8,32 --prompt 256 --gen 256 \
    --block 32 --max-blocks 2 --decoders low_confidence --cache none 2>&1 | tee "$LOGS/bench_decode_none.log" || rc=1
  "$BUILD/unmask" bench --decode --device cuda:0 --model "$MODEL8B" --batch 1,8,32 --prompt 256 --gen 256 \
    --block 32 --max-blocks 2 --decoders threshold --threshold 0.9 --cache dual 2>&1 |
    tee "$LOGS/bench_decode_dual.log" || rc=1
  if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    python3 "$ROOT/tools/bench/torch_peer.py" --device cuda --model "$MODEL8B" --decode --batch 1,8,32 --prompt 256 \
      --gen 256 --block 32 --max-blocks 2 --reps 1 --cache none --decoder low_confidence 2>&1 | tee "$LOGS/peer_none.log"
    python3 "$ROOT/tools/bench/torch_peer.py" --device cuda --model "$MODEL8B" --decode --batch 1,8,32 --prompt 256 \
      --gen 256 --block 32 --max-blocks 2 --reps 1 --cache dual --decoder threshold --threshold 0.9 2>&1 |
      tee "$LOGS/peer_dual.log"
  else
    echo "run-checks: no PyTorch with CUDA here: the peer rows are missing"
  fi
  return $rc
}

run() { "$@" || { echo "run-checks: stage $1 FAILED"; fail=1; }; }
case "$STAGE" in
  build) run do_build ;;
  parity) run do_parity ;;
  sanitize) run do_sanitize ;;
  bench) run do_bench ;;
  all)
    if do_build; then run do_parity; run do_sanitize; run do_bench; else fail=1; fi ;;
  *) echo "usage: run-checks.sh [all|build|parity|sanitize|bench]"; exit 2 ;;
esac
echo
[ $fail -eq 0 ] && echo "run-checks: ALL OK ($STAGE)" || echo "run-checks: FAILURES ($STAGE)"
exit $fail
