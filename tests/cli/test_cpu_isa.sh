#!/usr/bin/env bash
# test_cpu_isa.sh — UNMASK_CPU_ISA, the testing and benchmark knob that caps what the CPU probes
# report (docs/cpu-kernels.md): a capped path cannot be forced (one clear line, exit 2, naming the
# knob), `auto` then behaves as on a CPU without it (the bench header says what auto does: with
# avx2 the products are dispatched by shape; with baseline the logits are exactly the fp32 path's),
# and an unknown level is refused at start (impossible setup: an abort naming the variable). Levels
# this CPU does not have are named as not checked.
set -u
BIN="${UNMASK_BIN:?UNMASK_BIN not set}"
TMP="${UNMASK_TEST_TMP:-/tmp}/test_cpu_isa"
source "$(dirname "$0")/lib.sh"

"$BIN" make-model --out "$TMP/m" --preset tiny --quiet || { echo "make-model failed"; exit 1; }
TOK=1,17,300,42,7,99,250,3
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]]; }
header() {   # header ISA: the backend line of `bench` under UNMASK_CPU_ISA=ISA (empty: unset)
    env ${1:+UNMASK_CPU_ISA=$1} "$BIN" bench --model "$TMP/m" --seq 1 --reps 1 --warmup 0 | grep -m1 '^backend'
}
check_header() {   # check_header NAME ISA PATTERN
    local h
    h=$(header "$2")
    if [[ "$h" =~ $3 ]]; then
        passed=$((passed + 1)); echo "PASS $1: $h"
    else
        failed=$((failed + 1)); echo "FAIL $1: '$h' does not match /$3/"
    fi
}

if has avx512_bf16; then
    expect_rc "avx512bf16 hidden by UNMASK_CPU_ISA=avx2" 2 "cpu-kernels avx512bf16" "UNMASK_CPU_ISA=avx2 hides" -- \
        env UNMASK_CPU_ISA=avx2 "$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$TMP/x.npy" --cpu-kernels avx512bf16
    check_header "auto uncapped on this AVX512-BF16 CPU" "" "auto: (amx|avx512bf16) kernels for every product"
else
    echo "note: this CPU has no avx512_bf16: its cap is not checked here"
fi
if has avx2 && has fma; then
    check_header "auto on the AVX2 stand-in dispatches by shape" avx2 "auto: avx2 kernels up to [0-9]+ rows, fp32 above"
    ok "avx2 forced on the AVX2 stand-in" env UNMASK_CPU_ISA=avx2 "$BIN" logits --model "$TMP/m" --tokens "$TOK" \
        --out "$TMP/a.npy" --cpu-kernels avx2
    expect_rc "avx2 hidden by UNMASK_CPU_ISA=baseline" 2 "cpu-kernels avx2" "UNMASK_CPU_ISA=baseline hides AVX2" -- \
        env UNMASK_CPU_ISA=baseline "$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$TMP/x.npy" --cpu-kernels avx2
else
    echo "note: this CPU has no AVX2/FMA: the avx2 level is not checked here"
fi
check_header "auto on the baseline level is the fp32 path" baseline "cpu \(auto: fp32 kernels for every product; quantized weights: scalar\)"
ok "auto on the baseline level" env UNMASK_CPU_ISA=baseline "$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$TMP/b.npy"
ok "fp32 forced" "$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$TMP/f.npy" --cpu-kernels fp32
if cmp -s "$TMP/b.npy" "$TMP/f.npy"; then
    passed=$((passed + 1)); echo "PASS baseline auto gives the fp32 path's logits exactly"
else
    failed=$((failed + 1)); echo "FAIL baseline auto differs from --cpu-kernels fp32"
fi

# an unknown level: impossible setup, refused at start with the variable named (not a silent default)
env UNMASK_CPU_ISA=zen3 "$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$TMP/x.npy" >"$TMP/stdout" 2>"$TMP/stderr"
rc=$?
if [ $rc -ne 0 ] && grep -q "UNMASK_CPU_ISA=zen3: unknown level (baseline, avx2, avx512bf16, amx)" "$TMP/stderr" &&
    [ ! -s "$TMP/x.npy" ]; then
    passed=$((passed + 1)); echo "PASS unknown level refused (exit $rc): $(head -c 200 "$TMP/stderr")"
else
    failed=$((failed + 1)); echo "FAIL unknown level: exit $rc, stderr: $(head -c 300 "$TMP/stderr")"
fi
finish
