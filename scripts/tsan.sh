#!/usr/bin/env bash
# tsan.sh — ThreadSanitizer run: build into build-tsan/ (GCC, -fsanitize=thread, CPU only), then run
# the server suites (protocol/, http/, browser/) and the threaded unit tests against that binary.
# Reports go to $TSAN_DIR/report.<pid> (default /tmp/tsan); the script lists them and exits 1 if any.
#
# OpenMP: libgomp is not TSan-instrumented, so its barriers are invisible and every parallel region
# would be reported as a race between the team's threads. OMP_THREAD_LIMIT=1 (which, unlike
# OMP_NUM_THREADS, also caps our num_threads() clauses) runs each region on the calling thread
# only: no libgomp worker threads, no false reports, and none of our code suppressed.
# TSan also slows the forward pass ~10x, so a few timing-bound tests may time out here; read the
# reports, not only ctest's verdict. TSAN_TESTS= overrides the ctest -R regex.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build-tsan}"
TSAN_DIR="${TSAN_DIR:-/tmp/tsan}"
TSAN_TESTS="${TSAN_TESTS:-protocol/|http/|browser/|parallel/tp_serve|unit/test_decode|unit/test_comm_local|unit/test_model_tp}"

BUILD_DIR="$BUILD_DIR" bash scripts/build.sh -DUNMASK_CUDA=OFF -DCMAKE_C_FLAGS="-fsanitize=thread -g -O2" \
  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread || exit 1

mkdir -p "$TSAN_DIR"
rm -f "$TSAN_DIR"/report.*
export OMP_NUM_THREADS=1 OMP_THREAD_LIMIT=1
export TSAN_OPTIONS="log_path=$TSAN_DIR/report halt_on_error=0 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
(cd "$BUILD_DIR" && ctest -R "$TSAN_TESTS" -j"${JOBS:-4}" --output-on-failure)
ctest_rc=$?

shopt -s nullglob
reports=("$TSAN_DIR"/report.*)
echo "tsan: ctest exit $ctest_rc; ${#reports[@]} report file(s) in $TSAN_DIR"
if ((${#reports[@]})); then
  grep -h '^SUMMARY' "${reports[@]}" | sort | uniq -c | sort -rn
  exit 1
fi
exit 0
