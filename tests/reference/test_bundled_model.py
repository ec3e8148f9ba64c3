#!/usr/bin/python3
"""test_bundled_model.py — the trained model that ships in models/unmask-code-13m (tools/train/):
its files are complete (bf16 safetensors <= 60 MB, config / tokenizer / generation config with
threshold decoding and the dual cache, no chat template: a base model); computed in fp32
(`--cpu-kernels fp32`), `unmask logits` equals the PyTorch model's (tools/train/model.py) within
1e-3 relative, for the bf16 checkpoint and for its weights exported in f32 through
`unmask make-model --weights`; the default bf16 kernels (activations rounded to bf16) stay within
3e-2 with the same argmax almost everywhere; it predicts masked tokens
of unseen code (the training pipeline's own sources) far better than always guessing the text's most frequent
token, and greedy generation from an unseen code prompt is deterministic (two runs compared, per
decoder and KV cache mode) and reads as Python (keywords, no single token repeated throughout).
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import torch

SRC = os.environ.get("UNMASK_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MODEL = os.path.join(SRC, "models", "unmask-code-13m")
sys.path.insert(0, os.path.join(SRC, "tools", "train"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_run import BIN, Reporter, tmp_dir  # noqa: E402
from export import export, load_exported  # noqa: E402

PROMPT = '''import json
import os


def load_settings(path, defaults=None):
    """Read a JSON settings file and fill in the missing keys from defaults."""
    settings = dict(defaults or {})
    if not os.path.exists(path):
        return settings
'''
PY_WORDS = re.compile(r"\b(return|self|if|else|for|in|not|None|is|def|import|with|and|or|True|False)\b")


def tokenize(text):
    out = subprocess.run([BIN, "tokenize", "--model", MODEL, "--text", text, "--no-special"], check=True,
                         capture_output=True, text=True).stdout.strip()
    return [int(x) for x in out.split(",")]


def logits(ids, path, model_dir=MODEL, kernels="auto"):
    subprocess.run([BIN, "logits", "--model", model_dir, "--tokens", ",".join(map(str, ids)), "--out", path,
                    "--threads", "1", "--cpu-kernels", kernels], check=True)
    return np.load(path)


def generate(flags):
    r = subprocess.run([BIN, "generate", "--model", MODEL, "--raw", "--prompt", PROMPT, "--json", "--threads", "1",
                        "--gen-length", "48"] + flags, check=True, capture_output=True, text=True)
    ev = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    steps = [sorted((c["pos"], c["id"]) for c in e["commits"]) for e in ev if e["type"] == "step"]
    return ev[-1]["text"], steps


def main():
    rep = Reporter()
    tmp = tmp_dir("bundled_model")
    names = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors",
             "MODEL.md", "loss_curve.png"]
    missing = [n for n in names if not os.path.exists(os.path.join(MODEL, n))]
    rep(not missing, "files present", f"missing {missing}" if missing else MODEL)
    if missing:
        return rep.finish()
    size = os.path.getsize(os.path.join(MODEL, "model.safetensors"))
    with open(os.path.join(MODEL, "model.safetensors"), "rb") as fp:
        n = int.from_bytes(fp.read(8), "little")
        header = json.loads(fp.read(n))
    dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    rep(size <= 60e6 and dtypes == {"BF16"}, "weights: bf16 safetensors <= 60 MB", f"{size / 1e6:.1f} MB, {dtypes}")
    cfg = json.load(open(os.path.join(MODEL, "config.json")))
    gen = json.load(open(os.path.join(MODEL, "generation_config.json")))
    tcfg = json.load(open(os.path.join(MODEL, "tokenizer_config.json")))
    rep(cfg["model_type"] == "llada" and gen.get("decoder") == "threshold" and gen.get("cache") == "dual" and
        "chat_template" not in tcfg, "config: LLaDA layout, threshold decoding, dual cache, base model (no chat template)")

    model = load_exported(MODEL)
    ids = tokenize(PROMPT)[:40]
    with torch.no_grad():
        p = model(torch.tensor([ids])).numpy()[0]
    f32 = os.path.join(tmp, "f32")
    export(model, MODEL, f32, dtype="f32")
    for name, d in (("bf16 checkpoint", MODEL), ("its f32 export", f32)):
        c = logits(ids, os.path.join(tmp, "l32.npy"), d, "fp32")
        err = float(np.abs(c - p).max() / np.abs(p).max())
        rep(c.shape == p.shape and err <= 1e-3, f"{name}, fp32 compute: unmask logits == PyTorch (<= 1e-3 relative)",
            f"{len(ids)} tokens, relative error {err:.2e}")
    c = logits(ids, os.path.join(tmp, "l16.npy"))
    err = float(np.abs(c - p).max() / np.abs(p).max())
    agree = float(np.mean(c.argmax(-1) == p.argmax(-1)))
    rep(err <= 3e-2 and agree >= 0.9, "bf16 checkpoint, default bf16 kernels: close to PyTorch, same argmax",
        f"relative error {err:.2e}, argmax agreement {agree:.0%}")

    # masked-token prediction on unseen code (the training pipeline's own sources, not in its corpus):
    # every 7th token of 256-token windows masked, against always guessing each window's most
    # frequent token
    mask = cfg["mask_token_id"]
    hit = guess = total = 0
    for f in ("train.py", "evaluate.py", "export.py", "gather_data.py"):
        src = tokenize(open(os.path.join(SRC, "tools", "train", f)).read())
        for w0 in range(0, min(len(src), 1024), 256):
            w = src[w0:w0 + 256]
            pos = list(range(3, len(w), 7))
            masked = set(pos)
            lg = logits([mask if i in masked else t for i, t in enumerate(w)], os.path.join(tmp, "m.npy"))
            lg[:, mask] = -np.inf
            vals, counts = np.unique(np.array(w), return_counts=True)
            hit += sum(int(lg[i].argmax() == w[i]) for i in pos)
            guess += sum(int(w[i] == vals[counts.argmax()]) for i in pos)
            total += len(pos)
    acc, top = hit / total, guess / total
    rep(acc >= 0.1 and acc >= 3 * top, "masked tokens of unseen code: well above the most-frequent-token guess",
        f"accuracy {acc:.3f} vs {top:.3f} at {total} positions")

    for name, flags in (("threshold, no cache", []), ("threshold, dual cache", ["--cache", "dual"]),
                        ("low_confidence", ["--decoder", "low_confidence", "--steps", "48"])):
        t1, s1 = generate(flags)
        t2, s2 = generate(flags)
        words = set(PY_WORDS.findall(t1))
        toks = tokenize(t1) if t1 else []
        most = max(np.unique(toks, return_counts=True)[1]) / len(toks) if toks else 1.0
        rep(t1 == t2 and s1 == s2, f"greedy generation is deterministic ({name})", repr(t1[:120]))
        rep(len(words) >= 2 and most < 0.5, f"generated text reads as Python ({name})",
            f"keywords {sorted(words)}, most frequent token {most:.0%} of {len(toks)}")
    return rep.finish()


if __name__ == "__main__":
    sys.exit(main())
