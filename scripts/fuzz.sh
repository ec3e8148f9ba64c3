#!/usr/bin/env bash
# fuzz.sh — build the libFuzzer targets in tests/fuzz/ with clang (ASan + UBSan) and run each for
# RUNS inputs (default 20000, fixed seed: repeatable) or, with FUZZ_SECONDS=N, for N seconds.
# Needs clang and libclang-rt-dev (scripts/install-deps.sh does not install them: fuzzing is a
# developer tool, not part of the test command).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${FUZZ_DIR:-build-fuzz}"
mkdir -p "$OUT"
CFLAGS="-g -O1 -std=gnu11 -D_GNU_SOURCE -Isrc -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined"
COMMON="src/util/log.c src/util/err.c src/util/fileio.c src/model/safetensors.c src/model/config.c src/model/checkpoint.c"
for t in tests/fuzz/fuzz_*.c; do
  name=$(basename "$t" .c)
  extra=""
  [ -f "tests/fuzz/$name.deps" ] && extra=$(cat "tests/fuzz/$name.deps")
  clang $CFLAGS -o "$OUT/$name" "$t" $COMMON $extra $(pkg-config --cflags --libs jansson) -lm
  mkdir -p "$OUT/corpus-$name"
  if [ -n "${FUZZ_SECONDS:-}" ]; then
    "$OUT/$name" -max_total_time="$FUZZ_SECONDS" -max_len=65536 "$OUT/corpus-$name"
  else
    "$OUT/$name" -seed=1 -runs="${RUNS:-20000}" -max_len=65536 "$OUT/corpus-$name"
  fi
done
echo "fuzz: all targets ran clean"
