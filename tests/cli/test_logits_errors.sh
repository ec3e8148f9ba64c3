#!/usr/bin/env bash
# test_logits_errors.sh — `unmask logits` on bad input: bad flags/lists, out-of-range ids and
# positions, and corrupt checkpoints made by editing make-model output (truncated file, absurd
# header size, unknown dtype, overlapping tensors, missing shard, bad config, missing tensor, wrong
# shape). Each must exit != 0 without a crash (no signal) and print exactly one stderr line that
# names the problem (and the file/tensor where there is one). A valid run must succeed.
set -u
BIN="${UNMASK_BIN:?UNMASK_BIN not set}"
TMP="${UNMASK_TEST_TMP:-/tmp}/test_logits_errors"
source "$(dirname "$0")/lib.sh"

# Rewrite config.json with a Python statement over `c`.
edit_config() {
    "$PY" - "$1/config.json" "$2" <<'EOF'
import json, sys
path, code = sys.argv[1], sys.argv[2]
c = json.load(open(path))
exec(code)
json.dump(c, open(path, "w"), indent=2)
EOF
}

fresh() {   # fresh NAME [make-model args]: a tiny f32 model copy to corrupt
    local d="$TMP/$1"
    shift
    "$BIN" make-model --out "$d" --no-tokenizer --quiet --dtype f32 "$@" || { echo "make-model failed"; exit 1; }
    echo "$d"
}

GOOD=$(fresh good)
OUT="$TMP/out.npy"

# sanity: the untouched model works and writes a .npy
if "$BIN" logits --model "$GOOD" --tokens 1,2,3 --out "$OUT" 2>"$TMP/stderr" && [ -s "$OUT" ] &&
    head -c 6 "$OUT" | grep -q NUMPY; then
    passed=$((passed + 1)); echo "PASS valid model writes a .npy"
else
    failed=$((failed + 1)); echo "FAIL valid model: $(cat "$TMP/stderr")"
fi

# ---- flags and lists (usage errors: exit 2)
expect_rc "missing --model" 2 "required" -- "$BIN" logits --tokens 1,2 --out "$OUT"
expect_rc "bad token list" 2 "--tokens" "1,x,3" -- "$BIN" logits --model "$GOOD" --tokens 1,x,3 --out "$OUT"
expect_rc "empty token list" 2 "--tokens" -- "$BIN" logits --model "$GOOD" --tokens "" --out "$OUT"
expect_rc "bad positions list" 2 "--positions" -- "$BIN" logits --model "$GOOD" --tokens 1,2 --positions 0,,1 --out "$OUT"
expect_rc "key-valid length" 2 "--key-valid" "3 entries" -- "$BIN" logits --model "$GOOD" --tokens 1,2 --key-valid 1,1,0 --out "$OUT"
expect_rc "key-valid value" 2 "--key-valid" "expected 0 or 1" -- "$BIN" logits --model "$GOOD" --tokens 1,2 --key-valid 1,2 --out "$OUT"
expect_rc "negative threads" 2 "--threads" -- "$BIN" logits --model "$GOOD" --tokens 1,2 --threads -3 --out "$OUT"
expect_rc "unknown flag" 2 "unknown option" -- "$BIN" logits --model "$GOOD" --tokens 1,2 --out "$OUT" --bogus 1

# ---- per-input range errors
expect_rc "token id >= vocab" 2 "token id 99999" "vocabulary" -- "$BIN" logits --model "$GOOD" --tokens 1,99999 --out "$OUT"
expect_rc "negative token id" 2 "token id -1" -- "$BIN" logits --model "$GOOD" --tokens -1,2 --out "$OUT"
expect_rc "position out of range" 2 "position 7" "3-token" -- "$BIN" logits --model "$GOOD" --tokens 1,2,3 --positions 0,7 --out "$OUT"
LONG=$("$PY" -c 'print(",".join(["5"] * 1025))')
expect_rc "sequence over max_seq" 2 "1025 tokens" "maximum is 1024" -- "$BIN" logits --model "$GOOD" --tokens "$LONG" --out "$OUT"
expect_rc "unwritable --out" 1 "nonexistent-dir/x.npy" -- "$BIN" logits --model "$GOOD" --tokens 1,2 --out "$TMP/nonexistent-dir/x.npy"

# ---- checkpoint problems (runtime errors: exit 1)
expect_rc "missing model dir" 1 "$TMP/no-such-model" -- "$BIN" logits --model "$TMP/no-such-model" --tokens 1 --out "$OUT"

M=$(fresh truncated)
"$PY" -c "import os,sys; p=sys.argv[1]; os.truncate(p, os.path.getsize(p)//2)" "$M/model.safetensors"
expect_rc "truncated safetensors" 1 "model.safetensors" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh hugeheader)
"$PY" -c "import sys; f=open(sys.argv[1],'r+b'); f.write((10**15).to_bytes(8,'little'))" "$M/model.safetensors"
expect_rc "header claims 10^15 bytes" 1 "model.safetensors" "header" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh baddtype)
edit_header "$M/model.safetensors" 'h["model.transformer.blocks.0.q_proj.weight"]["dtype"] = "Q4"'
expect_rc "unknown dtype" 1 "model.safetensors" "Q4" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh i64dtype)
edit_header "$M/model.safetensors" 'h["model.transformer.blocks.1.ff_norm.weight"]["dtype"] = "I32"'
expect_rc "known but unusable dtype" 1 "blocks.1.ff_norm.weight" "I32" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh overlap)
edit_header "$M/model.safetensors" '
t = h["model.transformer.blocks.0.k_proj.weight"]; b, e = t["data_offsets"]; t["data_offsets"] = [b - 64, e - 64]'
expect_rc "overlapping tensors" 1 "model.safetensors" "overlap|hole|tile|contiguous" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh sharded --shards 3)
rm "$M/model-00002-of-00003.safetensors"
expect_rc "missing shard" 1 "model-00002-of-00003.safetensors" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh zeroheads)
edit_config "$M" 'c["n_heads"] = 0'
expect_rc "config n_heads 0" 1 "config.json" "n_heads" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh indivisible)
edit_config "$M" 'c["n_heads"] = 5; c["n_kv_heads"] = 5'
expect_rc "d_model not divisible by n_heads" 1 "config.json" "d_model|n_heads" "divisible" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh missingtensor)
edit_header "$M/model.safetensors" 'h["model.transformer.blocks.1.up_prXj.weight"] = h.pop("model.transformer.blocks.1.up_proj.weight")'
expect_rc "missing tensor" 1 "missing tensor" "blocks.1.up_proj.weight" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh wrongshape)
edit_header "$M/model.safetensors" 'h["model.transformer.blocks.0.v_proj.weight"]["shape"] = [32, 128]'
expect_rc "wrong tensor shape" 1 "blocks.0.v_proj.weight" "shape \[32, 128\]" "expected \[64, 64\]" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh badjson)
printf '{"d_model": 64,' >"$M/config.json"
expect_rc "truncated config.json" 1 "config.json" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

finish
