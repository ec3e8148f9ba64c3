"""gguf_convert.py — write a Hugging Face checkpoint directory (unmask make-model output) as the GGUF
file llama.cpp's converter (convert_hf_to_gguf.py with gguf-py) writes for it, with gguf_write.py.
Its own code, following what the converter does (docs/gguf.md lists the facts):

  - architectures: LLaDAModelLM -> "llada", DreamModel -> "dream", LLaDAMoEModelLM -> "llada-moe";
  - tensor names: token_embd / output_norm / output and blk.N.{attn_norm, attn_q, attn_k, attn_v,
    attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down, attn_q_norm, attn_k_norm, ffn_gate_inp,
    ffn_{gate,up,down}_exps (the experts of a layer stacked in one [E, rows, cols] tensor)}; dims are
    written innermost first ([out, in] -> {in, out});
  - LLaDA's q and k rows are permuted per head (reshape(heads, 2, hd/2, cols).swapaxes(1, 2)): the
    interleaved rotary layout llama.cpp's LLaDA uses; Dream and LLaDA-MoE are written as they are;
  - tensor types: vectors and *_norm weights F32, the MoE router (ffn_gate_inp) F32, every other
    matrix the output type (f32 / f16 / bf16 / q8_0; a row length that is not a multiple of 32 falls
    back to F16 for q8_0); "q4_0" writes what llama-quantize --pure Q4_0 makes of an F32 file;
  - metadata: <arch>.block_count, context_length, embedding_length, feed_forward_length,
    attention.head_count(_kv), rope.freq_base, attention.layer_norm_rms_epsilon, vocab_size,
    rope.dimension_count, attention.causal = false, diffusion.shift_logits (LLaDA, LLaDA-MoE: false),
    the MoE counts, general.file_type / quantization_version / alignment;
  - tokenizer: tokenizer.ggml.model "gpt2", .pre, .tokens (ids 0..vocab_size-1, "[PADi]" for unused
    ids), .token_type (NORMAL 1, CONTROL 3 for special added tokens, USER_DEFINED 4 for the others,
    UNUSED 5), .merges ("a b"), the special ids (bos, eos, padding, unknown, mask from
    tokenizer_config.json's token strings, else config.json's ids), .add_bos_token, and
    tokenizer.chat_template.

Used by test_gguf.py and tests/cli/test_gguf_errors.sh.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_write as gw  # noqa: E402
from st_read import read_checkpoint_raw  # noqa: E402

NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5
FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "bf16": 32}   # llama.cpp's LLAMA_FTYPE_*


# ---------------------------------------------------------------- names

LLADA_TOP = {"model.transformer.wte.weight": "token_embd.weight", "model.transformer.ln_f.weight": "output_norm.weight",
             "model.transformer.ff_out.weight": "output.weight"}
LLADA_LAYER = {"attn_norm.weight": "attn_norm.weight", "q_proj.weight": "attn_q.weight", "k_proj.weight": "attn_k.weight",
               "v_proj.weight": "attn_v.weight", "attn_out.weight": "attn_output.weight", "ff_norm.weight": "ffn_norm.weight",
               "ff_proj.weight": "ffn_gate.weight", "up_proj.weight": "ffn_up.weight", "ff_out.weight": "ffn_down.weight"}
HF_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight"}
HF_LAYER = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
            "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
            "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
            "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.weight": "attn_output.weight",
            "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
            "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
            "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
            "mlp.gate.weight": "ffn_gate_inp.weight", "mlp.expert_bias": "exp_probs_b.bias",
            "shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
            "shared_expert.up_proj.weight": "ffn_up_shexp.weight",
            "shared_expert.down_proj.weight": "ffn_down_shexp.weight"}


def gguf_name(arch, name):
    """(GGUF name, layer) of a Hugging Face tensor name."""
    top, layer, prefix = (LLADA_TOP, LLADA_LAYER, "model.transformer.blocks.") if arch == "llada" else \
        (HF_TOP, HF_LAYER, "model.layers.")
    if name in top:
        return top[name], None
    if not name.startswith(prefix):
        raise KeyError(name)
    rest = name[len(prefix):]
    bid, _, suffix = rest.partition(".")
    return f"blk.{int(bid)}.{layer[suffix]}", int(bid)


def permute(w, n_head):
    """The converter's rotary-layout permutation of q / k rows (per head: halves interleaved)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---------------------------------------------------------------- tokenizer

def _token_str(v):
    if isinstance(v, dict):
        return v.get("content")
    return v


def read_vocab(d, vocab_size):
    """(tokens, types, merges, added {content: id}) as the converter's get_vocab_base builds them."""
    tj = os.path.join(d, "tokenizer.json")
    tc = json.load(open(os.path.join(d, "tokenizer_config.json")))
    added = {}       # content -> (id, special)
    if os.path.exists(tj):
        t = json.load(open(tj))
        vocab = dict(t["model"]["vocab"])
        merges = [m if isinstance(m, str) else " ".join(m) for m in t["model"]["merges"]]
        for a in t["added_tokens"]:
            added[a["content"]] = (a["id"], a.get("special", False))
    else:   # vocab.json + merges.txt + added_tokens.json (Qwen2 / Dream slow tokenizer)
        vocab = json.load(open(os.path.join(d, "vocab.json")))
        merges = [ln for i, ln in enumerate(open(os.path.join(d, "merges.txt"), encoding="utf-8").read().split("\n"))
                  if ln and not (i == 0 and ln.startswith("#version"))]
        dec = tc.get("added_tokens_decoder", {})
        for content, i in json.load(open(os.path.join(d, "added_tokens.json"))).items():
            added[content] = (i, dec.get(str(i), {}).get("special", False))
    rev = {i: s for s, i in vocab.items()}
    for s, (i, _) in added.items():
        rev[i] = s
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in rev:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        elif rev[i] in added:
            tokens.append(rev[i])
            types.append(CONTROL if added[rev[i]][1] else USER_DEFINED)
        else:
            tokens.append(rev[i])
            types.append(NORMAL)
    return tokens, types, merges, {s: i for s, (i, _) in added.items()}, tc


def special_ids(cfg, tc, added, vocab):
    """SpecialVocab: tokenizer_config.json's <x>_token strings found among the added tokens, else
    config.json's <x>_token_id."""
    out = {}
    for typ, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding"), ("mask", "mask")):
        s = _token_str(tc.get(f"{typ}_token"))
        i = added.get(s) if s is not None else None
        if i is None:
            i = cfg.get(f"{typ}_token_id")
        if isinstance(i, list):
            i = i[0] if i else None
        if isinstance(i, int) and 0 <= i < vocab:
            out[key] = i
    return out


# ---------------------------------------------------------------- conversion

def convert(src, dst, outtype="f32", pre=None, permute_qk=True, drop=(), extra_kv=(), alignment=None,
            override_types=None, version=3, vocab_only=False, drop_kv=(), set_kv=None, mutate=None, offset_fn=None):
    """Write src (a checkpoint directory) as dst.gguf. pre: tokenizer.ggml.pre (default: the family's
    llama.cpp name); permute_qk=False writes LLaDA's q / k unpermuted (a file the real converter never
    writes: for showing that the loader undoes the permutation); drop: GGUF tensor names left out;
    extra_kv: more (key, type, value) metadata; override_types: {GGUF name: ggml type id} forced;
    vocab_only: metadata only, no tensors (the converter's --vocab-only). For files a converter
    would not write (the bad-file tests): drop_kv: keys left out; set_kv: {key: (type, value)}
    replacing a key's value (or adding it); mutate(name, array) -> array: a tensor changed before
    it is encoded; offset_fn(i, offset) -> offset: tensor i's recorded data offset changed.
    Returns {GGUF name: (type, float64 values as stored, dims)} for the tests."""
    cfg = json.load(open(os.path.join(src, "config.json")))
    hf_arch = cfg["architectures"][0]
    arch = {"LLaDAModelLM": "llada", "DreamModel": "dream", "LLaDAMoEModelLM": "llada-moe"}[hf_arch]
    if arch == "llada":
        d, L, H = cfg["d_model"], cfg["n_layers"], cfg["n_heads"]
        KV, F, ctx = cfg.get("n_kv_heads", H), cfg["mlp_hidden_size"], cfg.get("max_sequence_length", 4096)
    else:
        d, L, H = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
        KV = cfg.get("num_key_value_heads", H)
        F = cfg.get("intermediate_size", cfg.get("dense_intermediate_size"))
        ctx = cfg["max_position_embeddings"]
    vocab = cfg["vocab_size"]
    w = gw.Writer()
    w.add("general.architecture", gw.STRING, arch)
    w.add("general.type", gw.STRING, "model")
    w.add("general.name", gw.STRING, os.path.basename(os.path.normpath(src)))
    w.add(f"{arch}.block_count", gw.U32, L)
    w.add(f"{arch}.context_length", gw.U32, ctx)
    w.add(f"{arch}.embedding_length", gw.U32, d)
    if F is not None:
        w.add(f"{arch}.feed_forward_length", gw.U32, F)
    w.add(f"{arch}.attention.head_count", gw.U32, H)
    w.add(f"{arch}.attention.head_count_kv", gw.U32, KV)
    w.add(f"{arch}.rope.freq_base", gw.F32, float(cfg["rope_theta"]))
    w.add(f"{arch}.attention.layer_norm_rms_epsilon", gw.F32, float(cfg["rms_norm_eps"]))
    if arch == "llada-moe":
        w.add(f"{arch}.expert_count", gw.U32, cfg["num_experts"])
        w.add(f"{arch}.expert_used_count", gw.U32, cfg["num_experts_per_tok"])
        w.add(f"{arch}.expert_feed_forward_length", gw.U32, cfg["expert_intermediate_size"])
    w.add("general.file_type", gw.U32, FILE_TYPE[outtype])
    if arch in ("llada", "llada-moe"):
        if arch == "llada":
            w.add(f"{arch}.vocab_size", gw.U32, vocab)
            w.add(f"{arch}.rope.dimension_count", gw.U32, d // H)
        w.add(f"{arch}.attention.causal", gw.BOOL, False)
        w.add("diffusion.shift_logits", gw.BOOL, False)
    else:
        w.add(f"{arch}.attention.causal", gw.BOOL, False)
    mask_id = cfg.get("mask_token_id")
    # tokenizer
    has_tok = os.path.exists(os.path.join(src, "tokenizer_config.json"))
    if has_tok:
        tokens, types, merges, added, tc = read_vocab(src, vocab)
        if mask_id is None:
            mask_id = added.get(_token_str(tc.get("mask_token")))
        w.add("tokenizer.ggml.model", gw.STRING, "gpt2")
        w.add("tokenizer.ggml.pre", gw.STRING, pre or {"llada": "bailingmoe", "dream": "qwen2", "llada-moe": "llada-moe"}[arch])
        w.add_array("tokenizer.ggml.tokens", gw.STRING, tokens)
        w.add_array("tokenizer.ggml.token_type", gw.I32, types)
        w.add_array("tokenizer.ggml.merges", gw.STRING, merges)
        for key, i in special_ids(cfg, tc, added, vocab).items():
            if key != "mask":
                w.add(f"tokenizer.ggml.{key}_token_id", gw.U32, i)
        w.add("tokenizer.ggml.add_bos_token", gw.BOOL, arch == "llada" or bool(tc.get("add_bos_token", False)))
        if isinstance(tc.get("chat_template"), str):
            w.add("tokenizer.chat_template", gw.STRING, tc["chat_template"])
    if mask_id is not None:
        w.add("tokenizer.ggml.mask_token_id", gw.U32, int(mask_id))
    w.add("general.quantization_version", gw.U32, 2)
    if alignment is not None:
        w.add("general.alignment", gw.U32, alignment)
    for k, t, v in extra_kv:
        w.add(k, t, v)
    # tensors
    src_t = {} if vocab_only else read_checkpoint_raw(src)
    experts = {}     # (layer, which) -> {expert: array}
    stored = {}
    out = []         # (GGUF name, float32 array in HF order)
    for name, (dt, a) in src_t.items():
        if ".mlp.experts." in name:
            pre_, _, rest = name.partition(".mlp.experts.")
            e, _, which = rest.partition(".")
            layer = int(pre_.split(".")[2])
            experts.setdefault((layer, which), {})[int(e)] = a
            continue
        g, _ = gguf_name(arch, name)
        a = np.asarray(a, dtype=np.float32)
        if arch == "llada" and permute_qk and g.endswith("attn_q.weight"):
            a = permute(a, H)
        if arch == "llada" and permute_qk and g.endswith("attn_k.weight"):
            a = permute(a, KV)
        out.append((g, a))
    for (layer, which), per in experts.items():
        g = f"blk.{layer}.ffn_{which.split('_')[0]}_exps.weight"
        out.append((g, np.stack([per[e] for e in sorted(per)]).astype(np.float32)))
    for g, a in sorted(out):
        if g in drop:
            continue
        if a.ndim <= 1 or g.endswith("_norm.weight") or g.endswith("ffn_gate_inp.weight") or not g.endswith(".weight"):
            t = gw.T_F32
        else:
            t = {"f32": gw.T_F32, "f16": gw.T_F16, "bf16": gw.T_BF16, "q8_0": gw.T_Q8_0, "q4_0": gw.T_Q4_0}[outtype]
            if t in (gw.T_Q8_0, gw.T_Q4_0) and a.shape[-1] % 32 != 0:
                t = gw.T_F16      # the converter's QuantError fallback
        if override_types and g in override_types:
            t = override_types[g]
        if mutate:
            a = np.asarray(mutate(g, a), dtype=np.float32)
        dims = list(reversed(a.shape))
        if t in gw.REFUSED_TYPES:   # only for refusal tests: zero blocks of the right size
            per_block, unit = gw.TYPE_BLOCK[t]
            data = bytes(a.size // per_block * unit)
        else:
            data = gw.encode(a, t)
        w.add_tensor(g, dims, t, data)
        if t in (gw.T_Q8_0, gw.T_Q4_0):
            vals = gw.dequantize(data, t, a.size).reshape(a.shape)
        elif t == gw.T_F16:
            vals = a.astype(np.float16).astype(np.float64)
        elif t == gw.T_BF16:
            vals = gw.bf16_to_f32(gw.to_bf16_bits(a)).astype(np.float64)
        else:
            vals = a.astype(np.float64)
        stored[g] = (t, vals, dims)
    w.kv = [kv for kv in w.kv if kv[0] not in drop_kv]
    for key, (t, v) in (set_kv or {}).items():
        at = None
        if isinstance(v, tuple):   # (element type, values): an array
            at, v = v
        w.kv = [kv for kv in w.kv if kv[0] != key] + [(key, t, v, at)]
    w.write(dst, version=version, alignment=alignment, offset_fn=offset_fn)
    return stored


def unpermute(w, n_head):
    """The inverse of permute(): rows back in Hugging Face order."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_tensors(stored, arch, cfg):
    """The stored GGUF values under their Hugging Face names, LLaDA's q / k rows put back, experts
    unstacked (float64): what a NumPy reference forward reads."""
    rev = {}
    top, layer, prefix = (LLADA_TOP, LLADA_LAYER, "model.transformer.blocks.") if arch == "llada" else \
        (HF_TOP, HF_LAYER, "model.layers.")
    for hf, g in top.items():
        rev[g] = hf
    out = {}
    for g, (_, vals, _) in stored.items():
        if g in rev:
            out[rev[g]] = vals
            continue
        _, bid, suffix = g.split(".", 2)
        if suffix.endswith("_exps.weight"):
            which = suffix.split("_")[1]
            for e in range(vals.shape[0]):
                out[f"model.layers.{bid}.mlp.experts.{e}.{which}_proj.weight"] = vals[e]
            continue
        hf = next(k for k, v in layer.items() if v == suffix)
        if arch == "llada" and suffix == "attn_q.weight":
            vals = unpermute(vals, cfg["n_heads"])
        if arch == "llada" and suffix == "attn_k.weight":
            vals = unpermute(vals, cfg.get("n_kv_heads", cfg["n_heads"]))
        out[f"{prefix}{bid}.{hf}"] = vals
    return out


if __name__ == "__main__":   # python3 gguf_convert.py SRC DST [outtype]
    convert(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "f32")
