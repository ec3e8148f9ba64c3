#!/usr/bin/env bash
# test_moe_config.sh — LLaDA-MoE and LLaDA2 checkpoints (make-model --preset lladamoe-tiny /
# llada2-tiny) with a broken config.json or tensor set: each must make `unmask logits` exit != 0
# without a crash and print exactly one stderr line naming the key or tensor; the intact checkpoints
# (and LLaDA-MoE's config with model_type "llada" and no architectures list) must load. Also the
# shape presets (shrunk), the --tp refusal of a width that does not divide, and LLaDA2 decode parameters (block_layout llada,
# steps_per_block range, logits --block-length).
set -u
BIN="${UNMASK_BIN:?UNMASK_BIN not set}"
TMP="${UNMASK_TEST_TMP:-/tmp}/test_moe_config"
source "$(dirname "$0")/lib.sh"

LM="$TMP/lm"
L2="$TMP/l2"
"$BIN" make-model --out "$LM" --preset lladamoe-tiny --quiet --dtype f32 || { echo "FAIL make-model"; echo "0 passed, 1 failed"; exit 1; }
"$BIN" make-model --out "$L2" --preset llada2-tiny --quiet --dtype f32 || { echo "FAIL make-model"; echo "0 passed, 1 failed"; exit 1; }
ok "intact lladamoe-tiny loads" "$BIN" logits --model "$LM" --tokens 1,2,3 --out "$TMP/o.npy"
ok "intact llada2-tiny loads" "$BIN" logits --model "$L2" --tokens 1,2,3 --out "$TMP/o.npy"

variant() { config_variant "$@"; }   # variant NAME 'python over c' SRC -> an edited copy of SRC

L() { "$BIN" logits --model "$1" --tokens 1,2 --out "$TMP/o.npy"; }

# LLaDA-MoE
d=$(variant lm_no_arch 'del c["architectures"]' "$LM")
ok "model_type llada without architectures and without d_model loads as LLaDA-MoE" L "$d"
d=$(variant lm_prf 'c["partial_rotary_factor"] = -1' "$LM")
expect "partial_rotary_factor -1 refused" "partial_rotary_factor' is -1" -- L "$d"
d=$(variant lm_prf_missing 'del c["partial_rotary_factor"]' "$LM")
expect "partial_rotary_factor missing" "missing required key 'partial_rotary_factor'" "default -1" -- L "$d"
d=$(variant lm_shared 'c["shared_expert_intermediate_size"] = -1' "$LM")
expect "shared_expert_intermediate_size -1 refused" "shared_expert_intermediate_size" "null for no shared expert" -- L "$d"
d=$(variant lm_shared_missing 'del c["shared_expert_intermediate_size"]' "$LM")
expect "shared_expert_intermediate_size missing" "missing key 'shared_expert_intermediate_size'" -- L "$d"
d=$(variant lm_shared_on 'c["shared_expert_intermediate_size"] = 32' "$LM")
expect "shared expert configured, tensors missing" "missing tensor 'model.layers.0.shared_expert.gate_proj.weight'" -- L "$d"
d=$(variant lm_theta 'del c["rope_theta"]' "$LM")
expect "rope_theta missing" "missing required key 'rope_theta'" -- L "$d"
d=$(variant lm_topk 'c["num_experts_per_tok"] = 9' "$LM")
expect "top-k above experts" "num_experts_per_tok 9 is larger than num_experts 8" -- L "$d"
d=$(variant lm_freq 'c["moe_layer_freq"] = [1, 0]' "$LM")
expect "dense layer after a MoE layer" "moe_layer_freq.1. is 0 after a MoE layer" -- L "$d"
d=$(variant lm_bias 'c["moe_router_enable_expert_bias"] = True' "$LM")
expect "expert bias enabled but missing" "missing tensor 'model.layers.0.mlp.expert_bias'" -- L "$d"
d=$(variant lm_clip 'c["clip_qkv"] = 8.0' "$LM")
expect "clip_qkv refused" "clip_qkv" -- L "$d"
d=$(variant lm_attn_bias 'c["attention_bias"] = True' "$LM")
expect "attention_bias refused" "'attention_bias': true is not supported" -- L "$d"
d=$(variant lm_experts 'c["num_experts"] = 16' "$LM")
expect "num_experts disagrees with the router" "model.layers.0.mlp.gate.weight' has shape .8, 64., expected .16, 64." -- L "$d"

# LLaDA2
d=$(variant l2_group 'c["n_group"] = 3' "$L2")
expect "experts not divisible by n_group" "num_experts 8 is not divisible by n_group 3" -- L "$d"
d=$(variant l2_topk_group 'c["topk_group"] = 3' "$L2")
expect "topk_group above n_group" "topk_group 3 is larger than n_group 2" -- L "$d"
d=$(variant l2_pergroup 'c["n_group"] = 8; c["topk_group"] = 1' "$L2")
expect "one expert per group" "fewer than 2 experts per group" -- L "$d"
d=$(variant l2_k 'c["num_experts_per_tok"] = 5' "$L2")
expect "top-k above the kept groups' experts" "num_experts_per_tok 5 is larger than the 4 experts" -- L "$d"
d=$(variant l2_use_bias 'del c["use_bias"]' "$L2")
expect "use_bias missing (class default true)" "'use_bias' must be false" -- L "$d"
d=$(variant l2_qkv_bias 'c["use_qkv_bias"] = True' "$L2")
expect "use_qkv_bias refused" "'use_qkv_bias': true is not supported" -- L "$d"
d=$(variant l2_rotary 'c["rotary_dim"] = 16' "$L2")
expect "rotary_dim disagrees with partial_rotary_factor" "rotary_dim' disagrees" -- L "$d"
d=$(variant l2_score 'c["score_function"] = "softmax"' "$L2")
expect "score_function softmax refused" "score_function 'softmax' is not supported" -- L "$d"
d=$(variant l2_dense 'c["first_k_dense_replace"] = 9' "$L2")
expect "first_k_dense_replace above layers" "first_k_dense_replace 9 is larger than num_hidden_layers 3" -- L "$d"
d=$(variant l2_dense2 'c["first_k_dense_replace"] = 2' "$L2")
expect "dense layer where the checkpoint has experts" "missing tensor 'model.layers.1.mlp.gate_proj.weight'" -- L "$d"
d=$(variant l2_noqk 'c["use_qk_norm"] = False' "$L2")
ok "use_qk_norm false loads" L "$d"
d=$(variant l2_nobias 'c["moe_router_enable_expert_bias"] = False' "$L2")
expect "expert bias present but not enabled" "exists but config.json does not set moe_router_enable_expert_bias" -- L "$d"

# a missing expert tensor: renamed in the safetensors header (same length)
d="$TMP/noexpert"
rm -rf "$d"
cp -r "$L2" "$d"
edit_header "$d/model.safetensors" 'h["model.layers.2.mlp.experts.7.up_proj.weighx"] = h.pop("model.layers.2.mlp.experts.7.up_proj.weight")'
expect "missing expert tensor" "missing tensor 'model.layers.2.mlp.experts.7.up_proj.weight'" -- L "$d"

# the shape presets' configs, shrunk (two layers, 16 experts, small width) so they are quick to write
for preset in lladamoe-7b llada2-mini llada2-flash; do
    if "$BIN" make-model --out "$TMP/$preset" --preset "$preset" --quiet --no-tokenizer --n-layers 2 --experts 16 --experts-per-tok 4 \
        --d-model 256 --vocab 1000 --first-dense 1 >"$TMP/stdout" 2>"$TMP/stderr"; then
        ok "$preset preset shape (shrunk) loads" L "$TMP/$preset"
    else
        failed=$((failed + 1))
        echo "FAIL $preset preset: $(head -c 300 "$TMP/stderr")"
    fi
done

# --moe-ffn sets every expert's SwiGLU size (and the shared expert's); dense presets refuse it
if "$BIN" make-model --out "$TMP/moeffn" --preset llada2-tiny --quiet --moe-ffn 48 >"$TMP/stdout" 2>"$TMP/stderr" &&
    python3 -c "import json,sys; c=json.load(open('$TMP/moeffn/config.json')); sys.exit(0 if c['moe_intermediate_size'] == 48 else 1)"; then
    ok "--moe-ffn 48 written as moe_intermediate_size" L "$TMP/moeffn"
else
    failed=$((failed + 1))
    echo "FAIL --moe-ffn: $(head -c 300 "$TMP/stderr")"
fi
expect "--moe-ffn on a dense preset" "need a MoE preset" -- "$BIN" make-model --out "$TMP/denseffn" --preset tiny --moe-ffn 48

expect "--tp not dividing a MoE model's heads / shared expert" "--tp 3: expert/tensor parallelism needs n_heads .* and the shared expert width .* divisible by 3" -- \
    "$BIN" logits --model "$L2" --tokens 1,2 --out "$TMP/o.npy" --tp 3
expect "block_layout llada on a block-causal model" "block_layout must be aligned" -- \
    "$BIN" generate --model "$L2" --prompt-ids 1,2,3 --gen-length 8 --block-layout llada
expect "steps_per_block out of range" "steps_per_block must be between 0" -- \
    "$BIN" generate --model "$L2" --prompt-ids 1,2,3 --gen-length 8 --steps-per-block -1
expect "logits --block-length negative" "block-length must be >= 0" -- \
    "$BIN" logits --model "$L2" --tokens 1,2 --out "$TMP/o.npy" --block-length -2

finish
