#!/usr/bin/env bash
# test_quant.sh — --quant bf16|q8_0|q4_0|fp8 from the command line: a bad name, q8_0 / q4_0 on a GPU
# (not supported there yet) and fp8 on the CPU (CUDA only) are refused with one clear line and exit 2
# on serve, generate, logits, bench, bench --decode and bench --device, before any GPU is opened or
# any weight uploaded (so this runs without one); an FP8 checkpoint decodes with --quant q8_0; quantized
# decodes run to the end with every KV cache mode (none, prefix, dual) on LLaDA, Dream, LLaDA-MoE and
# LLaDA2 (its exact block cache), and through --tp 2; the benchmarks' headers name the weights;
# `unmask quantize` refuses what it cannot quantize.
set -u
BIN="${UNMASK_BIN:?UNMASK_BIN not set}"
TMP="${UNMASK_TEST_TMP:-/tmp}/test_quant_cli"
source "$(dirname "$0")/lib.sh"

"$BIN" make-model --out "$TMP/m" --preset tiny --quiet || { echo "make-model failed"; exit 1; }
M="$TMP/m"

# ---------------------------------------------------------------- refusals
expect_rc "logits --quant int4" 2 "--quant: unknown weight type 'int4'" "bf16, q8_0, q4_0" -- \
    "$BIN" logits --model "$M" --tokens 1,2,3 --out "$TMP/x.npy" --quant int4
expect_rc "generate --quant Q8" 2 "--quant: unknown weight type 'Q8'" -- \
    "$BIN" generate --model "$M" --prompt-ids 1,2 --gen-length 4 --block-length 4 --quant Q8
expect_rc "bench --quant q2_k" 2 "--quant: unknown weight type 'q2_k'" -- \
    "$BIN" bench --model "$M" --seq 4 --quant q2_k
expect_rc "bench --decode --quant fp8" 2 "--quant fp8 needs a CUDA device \(Hopper FP8 weights\); on the CPU use q8_0 or q4_0" -- \
    "$BIN" bench --decode --model "$M" --gen 4 --block 4 --quant fp8
expect_rc "logits --quant fp8 (CPU)" 2 "--quant fp8 needs a CUDA device" -- \
    "$BIN" logits --model "$M" --tokens 1,2,3 --out "$TMP/x.npy" --quant fp8
expect_rc "generate --quant fp8 (CPU)" 2 "--quant fp8 needs a CUDA device" -- \
    "$BIN" generate --model "$M" --prompt-ids 1,2 --gen-length 4 --block-length 4 --quant fp8
expect_rc "bench --quant fp8 (CPU)" 2 "--quant fp8 needs a CUDA device" -- \
    "$BIN" bench --model "$M" --seq 4 --quant fp8
expect_rc "serve --quant fp8 (CPU)" 2 "--quant fp8 needs a CUDA device" -- "$BIN" serve --model "$M" --port 0 --quant fp8
expect_rc "serve --quant q5_0" 2 "quant" "q5_0" -- "$BIN" serve --model "$M" --port 0 --quant q5_0
for q in q8_0 q4_0; do
    expect_rc "logits --device cuda --quant $q" 2 "--quant $q: GPUs have no kernels for quantized weights" "bf16" -- \
        "$BIN" logits --model "$M" --tokens 1,2,3 --out "$TMP/x.npy" --device cuda --quant $q
    expect_rc "generate --device cuda:0 --quant $q" 2 "GPUs have no kernels for quantized weights" -- \
        "$BIN" generate --model "$M" --prompt-ids 1,2 --gen-length 4 --block-length 4 --device cuda:0 --quant $q
    expect_rc "bench --decode --device cuda --quant $q" 2 "GPUs have no kernels for quantized weights" -- \
        "$BIN" bench --decode --model "$M" --gen 4 --block 4 --device cuda --quant $q
    expect_rc "bench --device cuda:0 --quant $q" 2 "GPUs have no kernels for quantized weights" -- \
        "$BIN" bench --device cuda:0 --model "$M" --quant $q
    expect_rc "serve --device cuda:0 --quant $q" 2 "GPUs have no kernels for quantized weights" -- \
        "$BIN" serve --model "$M" --port 0 --device cuda:0 --quant $q
done

# ---------------------------------------------------------------- unmask quantize
"$PY" -c "import numpy as np; np.save('$TMP/w40.npy', np.ones((3, 40), np.float32)); \
np.save('$TMP/w64.npy', np.ones((3, 64), np.float32)); np.save('$TMP/x.npy', np.ones((2, 32), np.float32))"
expect_rc "quantize: columns not whole blocks" 2 "cols a multiple of 32" -- \
    "$BIN" quantize --in "$TMP/w40.npy" --type q8_0 --out "$TMP/b.bin"
expect_rc "quantize --type bf16" 2 "--type must be q8_0 or q4_0" -- \
    "$BIN" quantize --in "$TMP/w64.npy" --type bf16 --out "$TMP/b.bin"
expect_rc "quantize --type fp8" 2 "--type fp8: quantize writes the CPU's Q8_0 / Q4_0 blocks" -- \
    "$BIN" quantize --in "$TMP/w64.npy" --type fp8 --out "$TMP/b.bin"
expect_rc "quantize: x of other width" 1 "--x must be \[n, 64\]" -- \
    "$BIN" quantize --in "$TMP/w64.npy" --type q4_0 --x "$TMP/x.npy" --y "$TMP/y.npy"
expect_rc "quantize: missing file" 1 "--in: .*nope.npy" -- \
    "$BIN" quantize --in "$TMP/nope.npy" --type q4_0 --out "$TMP/b.bin"

# ---------------------------------------------------------------- quantized decodes
# generate --json to the end: exit 0, the weights quantized (the loader's line) and a done event after
# gen_length committed tokens
decode_ok() {   # NAME MODEL GEN BLOCK [flags]
    local name=$1 model=$2 gen=$3 block=$4
    shift 4
    if "$BIN" generate --model "$model" --prompt-ids 5,6,7,8 --gen-length "$gen" --block-length "$block" --json \
        --threads 2 "$@" >"$TMP/gen.out" 2>"$TMP/stderr" && grep -q "weights quantized to q" "$TMP/stderr" &&
        "$PY" - "$TMP/gen.out" "$gen" <<'PYEOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
done = [e for e in ev if e["type"] == "done"]
commits = sum(len(e["commits"]) for e in ev if e["type"] == "step")
sys.exit(0 if len(done) == 1 and commits == int(sys.argv[2]) else 1)
PYEOF
    then
        passed=$((passed + 1)); echo "PASS $name"
    else
        failed=$((failed + 1)); echo "FAIL $name: $(tail -c 300 "$TMP/stderr") $(tail -c 300 "$TMP/gen.out")"
    fi
}
"$BIN" make-model --out "$TMP/dream" --preset dream-tiny --quiet || { echo "make-model failed"; exit 1; }
"$BIN" make-model --out "$TMP/moe" --preset lladamoe-tiny --quiet || { echo "make-model failed"; exit 1; }
"$BIN" make-model --out "$TMP/l2" --preset llada2-tiny --quiet || { echo "make-model failed"; exit 1; }
"$BIN" make-model --out "$TMP/fp8" --preset tiny --fp8 --quiet || { echo "make-model failed"; exit 1; }
"$BIN" make-model --out "$TMP/l2fp8" --preset llada2-tiny --fp8 --quiet || { echo "make-model failed"; exit 1; }
for q in q8_0 q4_0; do
    for c in none prefix dual; do
        decode_ok "llada $q --cache $c" "$M" 16 8 --quant $q --cache $c
    done
    decode_ok "dream $q --cache dual" "$TMP/dream" 16 8 --quant $q --cache dual
    decode_ok "lladamoe $q --cache dual" "$TMP/moe" 16 8 --quant $q --cache dual
    decode_ok "llada2 $q --cache dual (exact block cache)" "$TMP/l2" 64 32 --quant $q --cache dual
    decode_ok "llada $q --tp 2" "$M" 16 8 --quant $q --tp 2
    decode_ok "lladamoe $q --tp 2" "$TMP/moe" 16 8 --quant $q --tp 2
    decode_ok "llada FP8 checkpoint $q --cache dual" "$TMP/fp8" 16 8 --quant $q --cache dual
    decode_ok "llada2 FP8 checkpoint $q --tp 2" "$TMP/l2fp8" 64 32 --quant $q --tp 2
done

# ---------------------------------------------------------------- the benchmarks say what they ran
ok "bench --quant q4_0" "$BIN" bench --model "$M" --seq 8 --reps 1 --threads 2 --quant q4_0
if grep -q "weights quantized to q4_0" "$TMP/stdout"; then
    passed=$((passed + 1)); echo "PASS bench header names q4_0"
else
    failed=$((failed + 1)); echo "FAIL bench header: $(head -3 "$TMP/stdout")"
fi
ok "bench --decode --quant q8_0" "$BIN" bench --decode --model "$M" --gen 8 --block 8 --batch 1 --decoders threshold \
    --cache dual --threads 2 --quant q8_0
if grep -q "q8_0 weights" "$TMP/stdout"; then
    passed=$((passed + 1)); echo "PASS bench --decode header names q8_0"
else
    failed=$((failed + 1)); echo "FAIL bench --decode header: $(head -3 "$TMP/stdout")"
fi
finish
