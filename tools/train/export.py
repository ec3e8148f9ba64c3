#!/usr/bin/python3
"""export.py — a train.py checkpoint -> an unmask checkpoint directory, through `unmask make-model`.

The trained tensors are written as one F32 safetensors file (checkpoint names, LLaDA layout) and
`unmask make-model --weights` turns them into the checkpoint with the same writer, config.json and
tokenizer handling as every other make-model checkpoint (--dtype bf16 for the bundled model, f32
for exact comparisons). generation_config.json then gets the decoding defaults the server reads
(docs/decode.md): threshold decoding, dual KV cache, greedy. The model is a base (pre-trained only)
model, so the chat template the tokenizer files carry is dropped from tokenizer_config.json unless
--keep-chat-template: clients (the browser UI) then offer completion and infilling, not chat.

Also usable as a library: load_exported(dir) -> an LLaDA model with a checkpoint's weights.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import st_io  # noqa: E402
from model import LLaDA, ModelConfig  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))

GENERATION_DEFAULTS = {"decoder": "threshold", "threshold": 0.9, "cache": "dual", "block_length": 32,
                       "max_new_tokens": 128, "temperature": 0.0}


def unmask_bin():
    return os.environ.get("UNMASK_BIN") or os.path.join(ROOT, "build", "unmask")


def load_train_checkpoint(path):
    ck = torch.load(path, map_location="cpu")
    cfg = ModelConfig(**ck["config"])
    model = LLaDA(cfg)
    model.load_state_dict(ck["model"])
    model.eval()
    return model, ck


def export(model, tokenizer_dir, out, dtype="bf16", generation=None, extra_generation=None, keep_chat_template=False):
    c = model.config
    with tempfile.TemporaryDirectory() as tmp:
        w = os.path.join(tmp, "weights.safetensors")
        st_io.write_f32(w, {k: v.numpy() for k, v in model.checkpoint_tensors().items()})
        subprocess.run([unmask_bin(), "make-model", "--out", out, "--quiet", "--weights", w, "--tokenizer", tokenizer_dir,
                        "--dtype", dtype, "--d-model", str(c.d_model), "--n-layers", str(c.n_layers),
                        "--n-heads", str(c.n_heads), "--n-kv-heads", str(c.n_kv_heads), "--ffn", str(c.ffn_hidden),
                        "--max-seq", str(c.max_seq), "--rope-theta", repr(float(c.rope_theta))], check=True)
    if not keep_chat_template:
        tc = os.path.join(out, "tokenizer_config.json")
        with open(tc) as fp:
            cfg = json.load(fp)
        cfg.pop("chat_template", None)
        with open(tc, "w") as fp:
            json.dump(cfg, fp, indent=2)
            fp.write("\n")
    path = os.path.join(out, "generation_config.json")
    with open(path) as fp:
        g = json.load(fp)
    g.update(GENERATION_DEFAULTS if generation is None else generation)
    g.update(extra_generation or {})
    with open(path, "w") as fp:
        json.dump(g, fp, indent=2)
        fp.write("\n")


def load_exported(model_dir):
    """An LLaDA (float32) with the weights of an unmask checkpoint directory (single file)."""
    with open(os.path.join(model_dir, "config.json")) as fp:
        cj = json.load(fp)
    cfg = ModelConfig(vocab_rows=cj["embedding_size"], d_model=cj["d_model"], n_layers=cj["n_layers"],
                      n_heads=cj["n_heads"], n_kv_heads=cj["n_kv_heads"], ffn_hidden=cj["mlp_hidden_size"],
                      max_seq=cj["max_sequence_length"], rope_theta=cj["rope_theta"], rms_eps=cj["rms_norm_eps"])
    model = LLaDA(cfg)
    tensors = st_io.read(os.path.join(model_dir, "model.safetensors"))
    state = {k[len("model."):]: torch.from_numpy(v) for k, v in tensors.items()}
    model.load_state_dict(state)
    model.eval()
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", default="models/train-work/run/ckpt.pt")
    ap.add_argument("--tokenizer", default="models/train-work/tokens/tokenizer")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--keep-chat-template", action="store_true", help="keep the LLaDA chat template (chat-tuned models)")
    args = ap.parse_args()
    model, ck = load_train_checkpoint(args.ckpt)
    export(model, args.tokenizer, args.out, args.dtype, keep_chat_template=args.keep_chat_template)
    print(f"export: {args.out}: step {ck['step']}, {model.n_params() / 1e6:.2f}M parameters, {args.dtype}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
