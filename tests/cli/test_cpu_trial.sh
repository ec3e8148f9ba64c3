#!/usr/bin/env bash
# test_cpu_trial.sh — the CPU kernel paths are tried once before use: a virtual CPU can report
# AVX512-BF16 or AMX in cpuid and XCR0 and still fault on the first instruction (SIGILL; seen on a
# lent GPU machine's AMX). UNMASK_FAULT_CPU_TRIAL=PATH makes that path's trial fault on purpose:
# forcing the path must then fail with one clear line (not a crash), and `auto` must fall back to
# what the CPU has next and give the same logits as that (after AMX: forcing avx512bf16; after
# AVX512-BF16: auto as on an AVX2-only CPU, UNMASK_CPU_ISA=avx2, which dispatches by shape). PATH:segv fakes the other signal
# Linux sends when it cannot enable a state component on first use (SIGSEGV). Run for each bf16 path this CPU
# has; a path the CPU lacks is named as not checked here (its trial never runs on such a CPU).
set -u
BIN="${UNMASK_BIN:?UNMASK_BIN not set}"
TMP="${UNMASK_TEST_TMP:-/tmp}/test_cpu_trial"
source "$(dirname "$0")/lib.sh"

"$BIN" make-model --out "$TMP/m" --preset tiny --quiet || { echo "make-model failed"; exit 1; }
TOK=1,17,300,42,7,99,250,3
logits() {   # logits OUT [flags]: logits of TOK into OUT
    local out=$1
    shift
    "$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$out" "$@"
}
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]]; }

checked=0
# path  cpuid flag(s)  what auto falls back to when this one faults (a path, or isa=LEVEL: auto under
# UNMASK_CPU_ISA=LEVEL)
for row in "avx512bf16 avx512_bf16 isa=avx2" "amx amx_bf16 avx512bf16"; do
    read -r path flag next <<<"$row"
    if ! has "$flag"; then
        echo "note: this CPU has no $flag: the $path trial is not checked here"
        continue
    fi
    checked=$((checked + 1))
    ok "$path: runs when its trial passes" logits "$TMP/$path.npy" --cpu-kernels "$path"
    expect_rc "$path: forced after a faulting trial is a clear error" 2 "cpu-kernels $path" "SIGILL" -- \
        env UNMASK_FAULT_CPU_TRIAL="$path" "$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$TMP/x.npy" \
        --cpu-kernels "$path"
    expect_rc "$path: forced after a trial that segfaults is a clear error" 2 "cpu-kernels $path" "SIGSEGV" -- \
        env UNMASK_FAULT_CPU_TRIAL="$path:segv" "$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$TMP/x.npy" \
        --cpu-kernels "$path"
    ok "$path: auto after a faulting trial runs" env UNMASK_FAULT_CPU_TRIAL="$path" "$BIN" logits --model "$TMP/m" \
        --tokens "$TOK" --out "$TMP/auto_$path.npy"
    if [[ "$next" == isa=* ]]; then
        ok "$path: reference run of auto on UNMASK_CPU_ISA=${next#isa=}" env UNMASK_CPU_ISA="${next#isa=}" \
            "$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$TMP/next_$path.npy"
    else
        ok "$path: reference run on $next" logits "$TMP/next_$path.npy" --cpu-kernels "$next"
    fi
    if cmp -s "$TMP/auto_$path.npy" "$TMP/next_$path.npy"; then
        passed=$((passed + 1)); echo "PASS $path: auto fell back to $next (identical logits)"
    else
        failed=$((failed + 1)); echo "FAIL $path: auto after the fault differs from --cpu-kernels $next"
    fi
done
[ $checked -gt 0 ] || echo "note: no bf16 path on this CPU: only the fp32 path exists and nothing is tried"
ok "fp32 never tried: runs with every trial faulting" env UNMASK_FAULT_CPU_TRIAL=fp32 "$BIN" logits --model "$TMP/m" \
    --tokens "$TOK" --out "$TMP/fp32.npy" --cpu-kernels fp32
finish
