#!/usr/bin/env bash
# fuzz.sh — build the libFuzzer targets in tests/fuzz/ with clang (ASan + UBSan) and run each for
# RUNS inputs (default 20000, fixed seed: repeatable) or, with FUZZ_SECONDS=N, for N seconds.
# FUZZ_ONLY=pattern builds and runs only the targets whose name contains pattern (e.g.
# FUZZ_ONLY=tokenizer); FUZZ_NORUN=1 only builds. A target's seed corpus in
# tests/fuzz/corpus/<name>/ (regression inputs of past findings) is run first, read-only; new
# inputs go to $FUZZ_DIR/corpus-<name>.
# Last, the HTTP byte-stream fuzzer (tests/adversarial/http_stream_fuzz.mjs: random splits and
# concatenations of valid and invalid requests on live connections, plain and TLS) runs against an
# ASan+UBSan build of the server in build-asan/ for FUZZ_SECONDS (default 300) each; any sanitizer
# report fails it. FUZZ_ONLY=http_stream runs only that.
# Needs clang and libclang-rt-dev (scripts/install-deps.sh does not install them: fuzzing is a
# developer tool, not part of the test command).
#
# Sources: every target gets COMMON below. A target needing more lists them in
# tests/fuzz/<name>.deps (space-separated paths); the word @core instead links the whole of src/
# (but main.c), compiled once with the same sanitizers into $FUZZ_DIR/core/libcore.a, plus its
# libraries — for targets that need a loaded model (api/, server/).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${FUZZ_DIR:-build-fuzz}"
mkdir -p "$OUT"
SAN="address,undefined"
CFLAGS="-g -O1 -std=gnu11 -D_GNU_SOURCE -Isrc -fno-sanitize-recover=undefined"
COMMON="src/util/log.c src/util/err.c src/util/fileio.c src/model/safetensors.c src/model/config.c src/model/checkpoint.c"
CORE_LIBS="$(pkg-config --libs jansson libwebsockets openblas openssl) -fopenmp -lpthread -lm"

# $OUT/core/libcore.a: src/**/*.c but main.c, rebuilt per file when the file or any header changed.
build_core() {
  local dir="$OUT/core" newest_h
  mkdir -p "$dir"
  newest_h=$(find src -name '*.h' -printf '%T@\n' | sort -n | tail -1)
  local objs=() todo=()
  while IFS= read -r src; do
    local obj="$dir/$(echo "${src#src/}" | tr / _).o"
    objs+=("$obj")
    if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] ||
       [ "$(stat -c %Y "$obj")" -lt "${newest_h%.*}" ]; then todo+=("$src:$obj"); fi
  done < <(find src -name '*.c' ! -path src/main.c | sort)
  if [ "${#todo[@]}" -gt 0 ]; then
    echo "fuzz: compiling ${#todo[@]} core sources"
    printf '%s\n' "${todo[@]}" | xargs -P "${FUZZ_JOBS:-2}" -I{} bash -c \
      'src=${1%%:*}; obj=${1#*:}; clang '"$CFLAGS"' -fsanitize=fuzzer-no-link,'"$SAN"' -fopenmp -Wno-pass-failed \
         -DUNMASK_SOURCE_DIR=\"$PWD\" $(pkg-config --cflags jansson libwebsockets openblas) -c "$src" -o "$obj"' _ {}
    rm -f "$dir/libcore.a"
  fi
  [ -f "$dir/libcore.a" ] || ar rcs "$dir/libcore.a" "${objs[@]}"
}

for t in tests/fuzz/fuzz_*.c; do
  name=$(basename "$t" .c)
  case "$name" in *"${FUZZ_ONLY:-}"*) ;; *) continue ;; esac
  extra=""
  [ -f "tests/fuzz/$name.deps" ] && extra=$(cat "tests/fuzz/$name.deps")
  if [[ " $extra " == *" @core "* ]]; then
    build_core
    clang $CFLAGS -fsanitize=fuzzer,$SAN -fopenmp -o "$OUT/$name" "$t" "$OUT/core/libcore.a" \
      $(pkg-config --cflags jansson) $CORE_LIBS
  else
    clang $CFLAGS -fsanitize=fuzzer,$SAN -o "$OUT/$name" "$t" $COMMON $extra $(pkg-config --cflags --libs jansson) -lm
  fi
  [ -n "${FUZZ_NORUN:-}" ] && continue
  mkdir -p "$OUT/corpus-$name"
  seeds=()
  [ -d "tests/fuzz/corpus/$name" ] && seeds=("tests/fuzz/corpus/$name")
  if [ -n "${FUZZ_SECONDS:-}" ]; then
    "$OUT/$name" -max_total_time="$FUZZ_SECONDS" -max_len=65536 -timeout=10 "$OUT/corpus-$name" "${seeds[@]}"
  else
    "$OUT/$name" -seed=1 -runs="${RUNS:-20000}" -max_len=65536 -timeout=10 "$OUT/corpus-$name" "${seeds[@]}"
  fi
done
case "http_stream" in *"${FUZZ_ONLY:-}"*)
  if [ -z "${FUZZ_NORUN:-}" ]; then
    BUILD_DIR=build-asan bash scripts/build.sh -DUNMASK_SANITIZE=ON -DUNMASK_CUDA=OFF
    mkdir -p "$OUT/asan"
    rm -f "$OUT"/asan/report.*
    for mode in "" --tls; do
      node tests/adversarial/http_stream_fuzz.mjs --bin build-asan/unmask --seconds "${FUZZ_SECONDS:-300}" \
        --seed "${FUZZ_SEED:-1}" --asan-log "$PWD/$OUT/asan/report" $mode
    done
  fi
  ;;
esac
echo "fuzz: all targets ran clean"
