#!/usr/bin/env bash
# test_gguf_errors.sh — `--model FILE.gguf` on bad files: GGUF files written by the tests' own writer
# (tests/reference/gguf_convert.py) from a make-model checkpoint, then damaged — truncated, wrong
# magic, unsupported versions, big-endian, unsupported tensor types (K-quants), tensors of the wrong
# shape or missing or unknown, metadata of the wrong type or missing, an unsupported architecture or
# tokenizer, misaligned or overlapping data, duplicate keys. Each must fail without a crash and print
# exactly one stderr line naming the file and the problem: `logits` / `tokenize` exit 1 (a bad
# checkpoint, as for safetensors), `serve` exits 2 before listening. The valid file must work with
# logits, generate, tokenize, bench and serve's check.
set -u
BIN="${UNMASK_BIN:?UNMASK_BIN not set}"
TMP="${UNMASK_TEST_TMP:-/tmp}/test_gguf_errors"
source "$(dirname "$0")/lib.sh"
REF="$(cd "$(dirname "$0")/../reference" && pwd)"

"$BIN" make-model --out "$TMP/src" --preset tiny --dtype f32 --quiet || { echo "make-model failed"; exit 1; }

# gguf NAME 'python keyword arguments of gguf_convert.convert' : writes $TMP/NAME.gguf
gguf() {
    "$PY" - "$REF" "$TMP/src" "$TMP/$1.gguf" "$2" <<'EOF' || { echo "writing $1.gguf failed"; exit 1; }
import sys
sys.path.insert(0, sys.argv[1])
import gguf_convert as gc
import gguf_write as gw
kw = eval("dict(" + sys.argv[4] + ")", {"gw": gw})
gc.convert(sys.argv[2], sys.argv[3], **kw)
EOF
    echo "$TMP/$1.gguf"
}
OUT="$TMP/out.npy"
run_logits() { "$BIN" logits --model "$1" --tokens 1,2,3 --out "$OUT" --threads 1; }

GOOD=$(gguf good "outtype='f32'")
ok "valid GGUF: logits" run_logits "$GOOD"
ok "valid GGUF: generate" "$BIN" generate --model "$GOOD" --prompt "hello" --gen-length 8 --steps 4 --threads 1
ok "valid GGUF: tokenize" "$BIN" tokenize --model "$GOOD" --text "hello world"
ok "valid GGUF: bench" "$BIN" bench --model "$GOOD" --seq 8 --reps 1 --threads 1

# ---- the container
F="$TMP/truncated.gguf"
head -c $(( $(stat -c %s "$GOOD") / 2 )) "$GOOD" >"$F"
expect_rc "truncated in the data" 1 "truncated\.gguf: tensor '.*' \(.* bytes at data offset .*\) ends past the end of the file.*\(truncated\?\)" -- run_logits "$F"
head -c 100 "$GOOD" >"$F"
expect_rc "truncated in the header" 1 "truncated\.gguf: header claims [0-9]+ metadata entries and [0-9]+ tensors, more than the 100-byte file can hold \(truncated\?\)" -- run_logits "$F"
head -c 2000 "$GOOD" >"$F"
expect_rc "truncated in the metadata" 1 "truncated\.gguf: key 'tokenizer\.ggml\.tokens': an array of 1344 strings does not fit in the [0-9]+ bytes left \(truncated\?\)" -- run_logits "$F"
AT=$(grep -obUa "token_embd.weight" "$GOOD" | head -1 | cut -d: -f1)
head -c $((AT + 10)) "$GOOD" >"$F"
expect_rc "truncated in the tensor infos" 1 "truncated\.gguf: a tensor name needs 17 bytes at offset $AT but the file has 10 left \(truncated\?\)" -- run_logits "$F"
F="$TMP/magic.gguf"
{ printf 'GGUX'; tail -c +5 "$GOOD"; } >"$F"
expect_rc "wrong magic" 1 "magic\.gguf: not a GGUF file \(it does not start with the bytes \"GGUF\"\)" -- run_logits "$F"
cp "$F" "$TMP/magic.bin"
expect_rc "wrong magic, not named .gguf" 1 "magic\.bin is a file, not a model directory or a GGUF file" -- run_logits "$TMP/magic.bin"
F="$TMP/v1.gguf"
{ printf 'GGUF\001\000\000\000'; tail -c +9 "$GOOD"; } >"$F"
expect_rc "version 1" 1 "v1\.gguf: GGUF version 1 is not supported \(only 2 and 3\)" -- run_logits "$F"
F="$TMP/v4.gguf"
{ printf 'GGUF\004\000\000\000'; tail -c +9 "$GOOD"; } >"$F"
expect_rc "version 4" 1 "v4\.gguf: GGUF version 4 is not supported \(only 2 and 3\)" -- run_logits "$F"
F="$TMP/be.gguf"
{ printf 'GGUF\000\000\000\003'; tail -c +9 "$GOOD"; } >"$F"
expect_rc "big-endian" 1 "be\.gguf: big-endian GGUF file \(version 3 byte-swapped\); unmask reads little-endian GGUF only" -- run_logits "$F"
V2=$(gguf v2 "version=2")
ok "version 2 reads like version 3" run_logits "$V2"
F=$(gguf misaligned "offset_fn=lambda i, o: o + 4 if i == 3 else o")
expect_rc "misaligned tensor offset" 1 "misaligned\.gguf: tensor '.*' has offset [0-9]+, not a multiple of the alignment 32" -- run_logits "$F"
F=$(gguf overlap "offset_fn=lambda i, o: 0 if i == 5 else o")
expect_rc "overlapping tensors" 1 "overlap\.gguf: tensor '.*' overlaps tensor '.*'" -- run_logits "$F"
F=$(gguf align3 "set_kv={'general.alignment': (gw.U32, 48)}")
expect_rc "alignment not a power of two" 1 "align3\.gguf: general\.alignment is 48, not a power of two" -- run_logits "$F"
F=$(gguf dupkey "extra_kv=[('llada.block_count', gw.U32, 2)]")
expect_rc "duplicate key" 1 "dupkey\.gguf: metadata key 'llada\.block_count' appears twice" -- run_logits "$F"

# ---- tensor types, shapes, names
F=$(gguf q4k64 "override_types={'blk.0.attn_q.weight': gw.T_Q4_K}")
expect_rc "K-quant rows shorter than its block" 1 "q4k64\.gguf: tensor 'blk\.0\.attn_q\.weight' has rows of 64 elements, not a multiple of the Q4_K block of 256" -- run_logits "$F"
"$BIN" make-model --out "$TMP/wide" --preset tiny --dtype f32 --d-model 256 --n-heads 4 --ffn 512 --quiet || exit 1
F="$TMP/q4k.gguf"
"$PY" - "$REF" "$TMP/wide" "$F" <<'EOF' || exit 1
import sys
sys.path.insert(0, sys.argv[1])
import gguf_convert as gc, gguf_write as gw
gc.convert(sys.argv[2], sys.argv[3], "f32", override_types={"blk.0.attn_q.weight": gw.T_Q4_K})
EOF
expect_rc "K-quant tensor" 1 "q4k\.gguf: tensor blk\.0\.attn_q\.weight has type Q4_K, which unmask does not support; supported: F32, F16, BF16, Q8_0, Q4_0" -- run_logits "$F"
F="$TMP/q6k.gguf"
"$PY" - "$REF" "$TMP/wide" "$F" <<'EOF' || exit 1
import sys
sys.path.insert(0, sys.argv[1])
import gguf_convert as gc, gguf_write as gw
gc.convert(sys.argv[2], sys.argv[3], "q8_0", override_types={"output.weight": gw.T_Q6_K})
EOF
expect_rc "Q6_K LM head (llama-quantize's default for output.weight)" 1 "q6k\.gguf: tensor output\.weight has type Q6_K, which unmask does not support; supported: F32, F16, BF16, Q8_0, Q4_0" -- run_logits "$F"
# every other type of the spec (K-quants, I-quants, the older block types, integers, F64): one file
# each, refused naming the tensor and the type
"$PY" - "$REF" "$TMP/wide" "$TMP" <<'EOF' >"$TMP/refused_types" || exit 1
import sys
sys.path.insert(0, sys.argv[1])
import gguf_convert as gc, gguf_write as gw
for tid, (name, _, _) in sorted(gw.REFUSED_TYPES.items()):
    gc.convert(sys.argv[2], f"{sys.argv[3]}/type-{name}.gguf", "f32", override_types={"blk.1.ffn_down.weight": tid})
    print(name)
EOF
[ "$(wc -l <"$TMP/refused_types")" -ge 15 ] || { echo "FAIL: the writer made $(wc -l <"$TMP/refused_types") refused-type files"; exit 1; }
while read -r T; do
    expect_rc "type $T refused" 1 "type-$T\\.gguf: tensor blk\\.1\\.ffn_down\\.weight has type $T, which unmask does not support; supported: F32, F16, BF16, Q8_0, Q4_0" -- run_logits "$TMP/type-$T.gguf"
done <"$TMP/refused_types"
expect_rc "serve, K-quant: refused before listening" 2 "--model: .*type-Q5_K\\.gguf: tensor blk\\.1\\.ffn_down\\.weight has type Q5_K" -- "$BIN" serve --model "$TMP/type-Q5_K.gguf" --port 0 --host 127.0.0.1

F=$(gguf shape "mutate=lambda n, a: a[:32] if n == 'blk.0.attn_v.weight' else a")
expect_rc "wrong tensor shape" 1 "shape\.gguf: tensor 'blk\.0\.attn_v\.weight' has shape \{64, 32\}, expected \{64, 64\}" -- run_logits "$F"
F=$(gguf rank "mutate=lambda n, a: a.reshape(-1) if n == 'blk.1.ffn_up.weight' else a")
expect_rc "wrong tensor rank" 1 "rank\.gguf: tensor 'blk\.1\.ffn_up\.weight' has 1 dimensions, expected 2" -- run_logits "$F"
F=$(gguf missing "drop=['blk.1.ffn_up.weight']")
expect_rc "missing tensor" 1 "missing\.gguf: missing tensor 'blk\.1\.ffn_up\.weight'" -- run_logits "$F"
F=$(gguf noembd "drop=['token_embd.weight']")
expect_rc "missing embedding" 1 "noembd\.gguf: missing tensor 'token_embd\.weight'" -- run_logits "$F"
F=$(gguf layer9 "set_kv={'llada.block_count': (gw.U32, 1)}")
expect_rc "tensor of a layer past block_count" 1 "layer9\.gguf: tensor 'blk\.1\..*' is not part of the llada architecture as unmask reads it" -- run_logits "$F"

# ---- metadata
F=$(gguf strcount "set_kv={'llada.block_count': (gw.STRING, 'two')}")
expect_rc "block_count of type string" 1 "strcount\.gguf: key 'llada\.block_count' has type string, expected an integer" -- run_logits "$F"
F=$(gguf arrkv "set_kv={'llada.attention.head_count_kv': (gw.ARRAY, (gw.I32, [4, 4]))}")
expect_rc "per-layer head_count_kv array" 1 "arrkv\.gguf: key 'llada\.attention\.head_count_kv' is an array of i32, expected an integer" -- run_logits "$F"
F=$(gguf floateps "set_kv={'llada.attention.layer_norm_rms_epsilon': (gw.STRING, '1e-5')}")
expect_rc "rms epsilon of type string" 1 "floateps\.gguf: key 'llada\.attention\.layer_norm_rms_epsilon' has type string, expected a number" -- run_logits "$F"
F=$(gguf noembdlen "drop_kv=['llada.embedding_length']")
expect_rc "missing embedding_length" 1 "noembdlen\.gguf: missing required key 'llada\.embedding_length'" -- run_logits "$F"
F=$(gguf heads "set_kv={'llada.attention.head_count_kv': (gw.U32, 3)}")
expect_rc "heads not divisible by kv heads" 1 "heads\.gguf: llada\.attention\.head_count 4 is not divisible by llada\.attention\.head_count_kv 3" -- run_logits "$F"
F=$(gguf llama "set_kv={'general.architecture': (gw.STRING, 'llama')}")
expect_rc "unsupported architecture" 1 "llama\.gguf: architecture 'llama' is not supported \(GGUF files of llada, dream and llada-moe are; llama\.cpp's converter writes no LLaDA2 architecture\)" -- run_logits "$F"
F=$(gguf split "set_kv={'split.no': (gw.U16, 0), 'split.count': (gw.U16, 3)}")
expect_rc "one part of a split file" 1 "split\.gguf: one part of a GGUF file split in 3 \(split\.count\); merge the parts into one file first \(llama\.cpp: llama-gguf-split --merge\)" -- run_logits "$F"
F=$(gguf noarch "drop_kv=['general.architecture']")
expect_rc "no architecture" 1 "noarch\.gguf: missing required key 'general\.architecture'" -- run_logits "$F"
F=$(gguf yarn "set_kv={'llada.rope.scaling.type': (gw.STRING, 'yarn')}")
expect_rc "rope scaling" 1 "yarn\.gguf: llada\.rope\.scaling\.type 'yarn' is not supported \(only none\)" -- run_logits "$F"
F=$(gguf causal "set_kv={'llada.attention.causal': (gw.BOOL, True)}")
expect_rc "causal attention" 1 "causal\.gguf: llada\.attention\.causal is true: unmask runs diffusion models with bidirectional attention" -- run_logits "$F"
F=$(gguf spm "set_kv={'tokenizer.ggml.model': (gw.STRING, 'llama')}")
expect_rc "SentencePiece tokenizer" 1 "spm\.gguf: tokenizer\.ggml\.model 'llama' is not supported \(only gpt2, the byte-level BPE\)" -- run_logits "$F"
F=$(gguf toks "set_kv={'tokenizer.ggml.tokens': (gw.STRING, 'abc')}")
expect_rc "token list of type string" 1 "toks\.gguf: key 'tokenizer\.ggml\.tokens' has type string, expected an array of strings" -- run_logits "$F"
F=$(gguf types "set_kv={'tokenizer.ggml.token_type': (gw.ARRAY, (gw.I32, [1, 1]))}")
expect_rc "token types of the wrong length" 1 "types\.gguf: tokenizer\.ggml\.token_type has 2 entries, tokenizer\.ggml\.tokens 1344" -- run_logits "$F"
F=$(gguf merge "set_kv={'tokenizer.ggml.merges': (gw.ARRAY, (gw.STRING, ['zz qq']))}")
expect_rc "merge of unknown tokens" 1 "merge\.gguf: tokenizer\.ggml: merge 0 refers to a token not in the vocabulary" -- run_logits "$F"
F=$(gguf mask "set_kv={'tokenizer.ggml.mask_token_id': (gw.U32, 99999)}")
expect_rc "mask id outside the embedding" 1 "mask\.gguf: tokenizer\.ggml\.mask_token_id 99999 is outside the 1344-row embedding" -- run_logits "$F"
F=$(gguf tmpl "set_kv={'tokenizer.chat_template': (gw.STRING, '{% for m in messages %}{{ m.content }')}")
expect_rc "broken chat template" 1 "tmpl\.gguf: tokenizer\.chat_template" -- run_logits "$F"

# ---- the other commands on a bad file
F="$TMP/truncated.gguf"
head -c $(( $(stat -c %s "$GOOD") / 2 )) "$GOOD" >"$F"
expect_rc "tokenize, truncated" 1 "truncated\.gguf: .*truncated" -- "$BIN" tokenize --model "$F" --text hi
expect_rc "serve, truncated: refused before listening" 2 "--model: .*truncated\.gguf: .*truncated" -- "$BIN" serve --model "$F" --port 0 --host 127.0.0.1
F="$TMP/llama.gguf"
expect_rc "serve, unsupported architecture" 2 "--model: .*llama\.gguf: architecture 'llama' is not supported" -- "$BIN" serve --model "$F" --port 0 --host 127.0.0.1

finish
