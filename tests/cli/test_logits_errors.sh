#!/usr/bin/env bash
# test_logits_errors.sh — `unmask logits` on bad input: bad flags/lists, out-of-range ids and
# positions, and corrupt checkpoints made by editing make-model output (truncated file, absurd
# header size, unknown dtype, overlapping tensors, missing shard, bad config, missing tensor, wrong
# shape). Each must exit != 0 without a crash (no signal) and print exactly one stderr line that
# names the problem (and the file/tensor where there is one). A valid run must succeed.
set -u
BIN="${UNMASK_BIN:?UNMASK_BIN not set}"
TMP="${UNMASK_TEST_TMP:-/tmp}/test_logits_errors"
PY=/usr/bin/python3
rm -rf "$TMP"
mkdir -p "$TMP"
passed=0
failed=0

# expect NAME WANT_RC(any|1|2) PATTERN... -- CMD...  : exit != 0 (or == WANT_RC), rc < 128,
# exactly one stderr line, matching every (extended regex) PATTERN.
expect() {
    local name="$1" want="$2"
    shift 2
    local pats=()
    while [ "$1" != "--" ]; do pats+=("$1"); shift; done
    shift
    "$@" >"$TMP/stdout" 2>"$TMP/stderr"
    local rc=$? ok=1 why=""
    local lines
    lines=$(wc -l <"$TMP/stderr")
    if [ $rc -eq 0 ]; then ok=0; why="exit 0"; fi
    if [ $rc -ge 128 ]; then ok=0; why="crashed (rc $rc)"; fi
    if [ "$want" != any ] && [ $rc -ne "$want" ]; then ok=0; why="exit $rc, expected $want"; fi
    if [ "$lines" -ne 1 ]; then ok=0; why="$why; $lines stderr lines"; fi
    for p in "${pats[@]}"; do
        if ! grep -Eq -- "$p" "$TMP/stderr"; then ok=0; why="$why; no match for /$p/"; fi
    done
    if [ $ok -eq 1 ]; then
        passed=$((passed + 1))
        echo "PASS $name: $(head -c 200 "$TMP/stderr")"
    else
        failed=$((failed + 1))
        echo "FAIL $name: $why; stderr: $(head -c 400 "$TMP/stderr")"
    fi
}

# Rewrite a safetensors header with a Python expression over `h` (the parsed header dict), keeping
# the file's data section untouched. Usage: edit_header FILE 'python statements'
edit_header() {
    "$PY" - "$1" "$2" <<'EOF'
import json, sys
path, code = sys.argv[1], sys.argv[2]
raw = open(path, "rb").read()
n = int.from_bytes(raw[:8], "little")
h = json.loads(raw[8:8 + n])
exec(code)
text = json.dumps(h, separators=(",", ":")).encode()
if len(text) > n:
    raise SystemExit("edited header is longer than the original")
text += b" " * (n - len(text))
open(path, "wb").write(raw[:8] + text + raw[8 + n:])
EOF
}

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
expect "missing --model" 2 "required" -- "$BIN" logits --tokens 1,2 --out "$OUT"
expect "bad token list" 2 "--tokens" "1,x,3" -- "$BIN" logits --model "$GOOD" --tokens 1,x,3 --out "$OUT"
expect "empty token list" 2 "--tokens" -- "$BIN" logits --model "$GOOD" --tokens "" --out "$OUT"
expect "bad positions list" 2 "--positions" -- "$BIN" logits --model "$GOOD" --tokens 1,2 --positions 0,,1 --out "$OUT"
expect "key-valid length" 2 "--key-valid" "3 entries" -- "$BIN" logits --model "$GOOD" --tokens 1,2 --key-valid 1,1,0 --out "$OUT"
expect "key-valid value" 2 "--key-valid" "expected 0 or 1" -- "$BIN" logits --model "$GOOD" --tokens 1,2 --key-valid 1,2 --out "$OUT"
expect "negative threads" 2 "--threads" -- "$BIN" logits --model "$GOOD" --tokens 1,2 --threads -3 --out "$OUT"
expect "unknown flag" 2 "unknown option" -- "$BIN" logits --model "$GOOD" --tokens 1,2 --out "$OUT" --bogus 1

# ---- per-input range errors
expect "token id >= vocab" 2 "token id 99999" "vocabulary" -- "$BIN" logits --model "$GOOD" --tokens 1,99999 --out "$OUT"
expect "negative token id" 2 "token id -1" -- "$BIN" logits --model "$GOOD" --tokens -1,2 --out "$OUT"
expect "position out of range" 2 "position 7" "3-token" -- "$BIN" logits --model "$GOOD" --tokens 1,2,3 --positions 0,7 --out "$OUT"
LONG=$("$PY" -c 'print(",".join(["5"] * 1025))')
expect "sequence over max_seq" 2 "1025 tokens" "maximum is 1024" -- "$BIN" logits --model "$GOOD" --tokens "$LONG" --out "$OUT"
expect "unwritable --out" 1 "nonexistent-dir/x.npy" -- "$BIN" logits --model "$GOOD" --tokens 1,2 --out "$TMP/nonexistent-dir/x.npy"

# ---- checkpoint problems (runtime errors: exit 1)
expect "missing model dir" 1 "$TMP/no-such-model" -- "$BIN" logits --model "$TMP/no-such-model" --tokens 1 --out "$OUT"

M=$(fresh truncated)
"$PY" -c "import os,sys; p=sys.argv[1]; os.truncate(p, os.path.getsize(p)//2)" "$M/model.safetensors"
expect "truncated safetensors" 1 "model.safetensors" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh hugeheader)
"$PY" -c "import sys; f=open(sys.argv[1],'r+b'); f.write((10**15).to_bytes(8,'little'))" "$M/model.safetensors"
expect "header claims 10^15 bytes" 1 "model.safetensors" "header" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh baddtype)
edit_header "$M/model.safetensors" 'h["model.transformer.blocks.0.q_proj.weight"]["dtype"] = "Q4"'
expect "unknown dtype" 1 "model.safetensors" "Q4" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh i64dtype)
edit_header "$M/model.safetensors" 'h["model.transformer.blocks.1.ff_norm.weight"]["dtype"] = "I32"'
expect "known but unusable dtype" 1 "blocks.1.ff_norm.weight" "I32" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh overlap)
edit_header "$M/model.safetensors" '
t = h["model.transformer.blocks.0.k_proj.weight"]; b, e = t["data_offsets"]; t["data_offsets"] = [b - 64, e - 64]'
expect "overlapping tensors" 1 "model.safetensors" "overlap|hole|tile|contiguous" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh sharded --shards 3)
rm "$M/model-00002-of-00003.safetensors"
expect "missing shard" 1 "model-00002-of-00003.safetensors" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh zeroheads)
edit_config "$M" 'c["n_heads"] = 0'
expect "config n_heads 0" 1 "config.json" "n_heads" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh indivisible)
edit_config "$M" 'c["n_heads"] = 5; c["n_kv_heads"] = 5'
expect "d_model not divisible by n_heads" 1 "config.json" "d_model|n_heads" "divisible" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh missingtensor)
edit_header "$M/model.safetensors" 'h["model.transformer.blocks.1.up_prXj.weight"] = h.pop("model.transformer.blocks.1.up_proj.weight")'
expect "missing tensor" 1 "missing tensor" "blocks.1.up_proj.weight" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh wrongshape)
edit_header "$M/model.safetensors" 'h["model.transformer.blocks.0.v_proj.weight"]["shape"] = [32, 128]'
expect "wrong tensor shape" 1 "blocks.0.v_proj.weight" "shape \[32, 128\]" "expected \[64, 64\]" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

M=$(fresh badjson)
printf '{"d_model": 64,' >"$M/config.json"
expect "truncated config.json" 1 "config.json" -- "$BIN" logits --model "$M" --tokens 1 --out "$OUT"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
