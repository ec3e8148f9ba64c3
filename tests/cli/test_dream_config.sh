#!/usr/bin/env bash
# test_dream_config.sh — Dream-layout checkpoints (make-model --preset dream-tiny) with a broken
# config.json or tensor set: each must make `unmask logits` exit != 0 without a crash and print
# exactly one stderr line naming the key or tensor; the intact checkpoint (and the same config
# with only model_type, no architectures list) must load. Bad Dream decode parameters (alg_temp,
# eps, an unknown decoder) are refused by `unmask generate` naming the parameter.
set -u
BIN="${UNMASK_BIN:?UNMASK_BIN not set}"
TMP="${UNMASK_TEST_TMP:-/tmp}/test_dream_config"
source "$(dirname "$0")/lib.sh"

BASE="$TMP/base"
"$BIN" make-model --out "$BASE" --preset dream-tiny --quiet --dtype f32 || { echo "FAIL make-model"; echo "0 passed, 1 failed"; exit 1; }
ok "intact dream-tiny loads" "$BIN" logits --model "$BASE" --tokens 1,2,3 --out "$TMP/o.npy"

variant() { config_variant "$1" "$2" "$BASE"; }   # variant NAME 'python over c' -> an edited copy of BASE

d=$(variant model_type_only 'del c["architectures"]')
ok "model_type Dream without architectures loads" "$BIN" logits --model "$d" --tokens 1,2,3 --out "$TMP/o.npy"
d=$(variant no_hidden 'del c["hidden_size"]')
expect "missing hidden_size" "config.json" "hidden_size" -- "$BIN" logits --model "$d" --tokens 1,2 --out "$TMP/o.npy"
d=$(variant gqa 'c["num_key_value_heads"] = 3')
expect "heads not divisible by kv heads" "num_attention_heads 4 is not divisible by num_key_value_heads 3" -- \
    "$BIN" logits --model "$d" --tokens 1,2 --out "$TMP/o.npy"
d=$(variant heads 'c["num_attention_heads"] = 5; c["num_key_value_heads"] = 5')
expect "hidden_size not divisible by heads" "hidden_size 64 is not divisible by num_attention_heads 5" -- \
    "$BIN" logits --model "$d" --tokens 1,2 --out "$TMP/o.npy"
d=$(variant act 'c["hidden_act"] = "gelu"')
expect "unsupported hidden_act" "hidden_act 'gelu' is not supported" -- "$BIN" logits --model "$d" --tokens 1,2 --out "$TMP/o.npy"
d=$(variant rope_scaling 'c["rope_scaling"] = {"type": "yarn", "factor": 4.0}')
expect "rope_scaling refused" "rope_scaling" -- "$BIN" logits --model "$d" --tokens 1,2 --out "$TMP/o.npy"
d=$(variant sliding 'c["use_sliding_window"] = True')
expect "sliding window refused" "use_sliding_window" -- "$BIN" logits --model "$d" --tokens 1,2 --out "$TMP/o.npy"
d=$(variant mask 'c["mask_token_id"] = c["vocab_size"] + 5')
expect "mask_token_id outside the embedding" "mask_token_id [0-9]+ is outside" -- \
    "$BIN" logits --model "$d" --tokens 1,2 --out "$TMP/o.npy"
d=$(variant nomask 'del c["mask_token_id"]')
expect "mask_token_id required" "mask_token_id is required" -- "$BIN" logits --model "$d" --tokens 1,2 --out "$TMP/o.npy"
d=$(variant vocab 'c["vocab_size"] = c["vocab_size"] + 64')
expect "vocab_size != embedding rows" "model.embed_tokens.weight' has shape" -- \
    "$BIN" logits --model "$d" --tokens 1,2 --out "$TMP/o.npy"
d=$(variant tied 'c["tie_word_embeddings"] = True')
ok "tie_word_embeddings true ignores lm_head.weight" "$BIN" logits --model "$d" --tokens 1,2 --out "$TMP/o.npy"

# a missing bias tensor: renamed in the safetensors header (same length, data left in place)
d="$TMP/nobias"
rm -rf "$d"
cp -r "$BASE" "$d"
edit_header "$d/model.safetensors" 'h["model.layers.1.self_attn.k_proj.bixs"] = h.pop("model.layers.1.self_attn.k_proj.bias")'
expect "missing k_proj bias" "missing tensor 'model.layers.1.self_attn.k_proj.bias'" -- \
    "$BIN" logits --model "$d" --tokens 1,2 --out "$TMP/o.npy"

expect "alg_temp out of range" "alg_temp must be between 0" -- \
    "$BIN" generate --model "$BASE" --prompt-ids 1,2,3 --decoder entropy --alg-temp -1 --gen-length 8
expect "eps out of range" "eps must be in \(0, 1\)" -- \
    "$BIN" generate --model "$BASE" --prompt-ids 1,2,3 --decoder entropy --eps 1.5 --gen-length 8
expect "unknown decoder names the Dream ones" "entropy" -- \
    "$BIN" generate --model "$BASE" --prompt-ids 1,2,3 --decoder nope --gen-length 8

finish
