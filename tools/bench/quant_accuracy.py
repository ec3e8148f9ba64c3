#!/usr/bin/python3
"""quant_accuracy.py — logits of quantized weights against the fp32 path, and the bundled model's
held-out masked-token accuracy per weight type (docs/perf.md, "Quantized weights").

  logits   for each model directory: one canvas of --seq tokens (seeded random ids, a quarter of
           them the mask id), `unmask logits` with --cpu-kernels fp32 --quant bf16 as the reference
           (the checkpoint's weights widened to fp32, fp32 products: the path the reference tests
           check against NumPy float64), then each --quant type on the default kernels. Prints the
           max relative error max|d| / max|ref|, the RMS relative error ||d|| / ||ref||, and the
           argmax agreement overall and on decisive rows (the reference's top-2 gap >= --gap
           logit units).
  masked   the masked-token accuracy of tools/train/evaluate.py (same windows, same seeded masks,
           argmax over all but the mask id) with the logits of `unmask logits --quant Q` instead of
           PyTorch's; needs the held-out token stream (--valid valid.npy, as tools/train/prepare.py
           writes it). Every window runs every type before the next, so the types see identical
           inputs.

--device cuda:N runs every `unmask logits` there; the logits reference is then that device's bf16
path (`--quant bf16`), e.g. FP8 weights against bf16 on a GPU.

Not a test: prints tables, asserts nothing.
usage: quant_accuracy.py --unmask BIN logits --models DIR[,DIR...] [--seq 64] [--quant bf16,q8_0,q4_0]
       quant_accuracy.py --unmask BIN masked --model DIR --valid valid.npy [--windows 256] [--seq-len 256]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def run_logits(binary, model, tokens, extra, threads):
    with tempfile.NamedTemporaryFile(suffix=".npy", delete=False) as f:
        path = f.name
    try:
        subprocess.run([binary, "logits", "--model", model, "--tokens", ",".join(str(int(t)) for t in tokens),
                        "--out", path, "--threads", str(threads)] + extra, check=True, capture_output=True)
        return np.load(path).astype(np.float64)
    finally:
        os.unlink(path)


def config_ids(binary, model):
    """(vocab size, mask id): the config's mask_token_id, else the tokenizer's id of its mask token"""
    with open(os.path.join(model, "config.json")) as f:
        c = json.load(f)
    vocab = c.get("vocab_size") or c.get("embedding_size")
    mask = c.get("mask_token_id")
    if mask is None:
        with open(os.path.join(model, "special_tokens_map.json")) as f:
            tok = json.load(f)["mask_token"]
        tok = tok["content"] if isinstance(tok, dict) else tok
        out = subprocess.run([binary, "tokenize", "--model", model, "--text", tok], check=True, capture_output=True,
                             text=True).stdout.replace(",", " ").split()
        assert len(out) == 1, f"{model}: mask token {tok!r} is not one token"
        mask = int(out[0])
    return int(vocab), int(mask)


def dev_args(a):
    return ["--device", a.device] if a.device else []


def cmd_logits(a):
    quants = a.quant.split(",")
    rng = np.random.default_rng(a.seed)
    print(f"| model | weights | max rel err | RMS rel err | argmax agree (all) | argmax agree (decisive, gap >= {a.gap}) |")
    print("|---|---|---|---|---|---|")
    for model in a.models.split(","):
        vocab, mask = config_ids(a.unmask, model)
        tokens = rng.integers(0, min(vocab, mask), size=a.seq)
        tokens[rng.permutation(a.seq)[:a.seq // 4]] = mask
        ref_args = ["--device", a.device, "--quant", "bf16"] if a.device else ["--cpu-kernels", "fp32", "--quant", "bf16"]
        ref = run_logits(a.unmask, model, tokens, ref_args, a.threads)
        top2 = np.sort(ref, axis=1)[:, -2:]
        decisive = top2[:, 1] - top2[:, 0] >= a.gap
        for q in quants:
            ours = run_logits(a.unmask, model, tokens, dev_args(a) + ["--quant", q], a.threads)
            d = ours - ref
            agree = np.argmax(ours, axis=1) == np.argmax(ref, axis=1)
            print(f"| {os.path.basename(model.rstrip('/'))} | {q} | {np.max(np.abs(d)) / np.max(np.abs(ref)):.2e} | "
                  f"{np.linalg.norm(d) / np.linalg.norm(ref):.2e} | {int(agree.sum())}/{len(agree)} | "
                  f"{int(agree[decisive].sum())}/{int(decisive.sum())} |", flush=True)


def cmd_masked(a):
    quants = a.quant.split(",")
    valid = np.load(a.valid, mmap_mode="r")
    _, mask_id = config_ids(a.unmask, a.model)
    L, windows = a.seq_len, a.windows
    starts = np.linspace(0, len(valid) - L - 1, windows).astype(np.int64)
    g = np.random.default_rng(7)   # one generator for every ratio's masks, as evaluate.py draws them
    for r in (0.15, 0.5, 0.9):
        hit = {q: 0 for q in quants}
        tot = 0
        for s in starts:
            ids = valid[s:s + L].astype(np.int64)
            m = np.zeros(L, dtype=bool)
            m[g.permutation(L)[:int(round(r * L))]] = True
            x = np.where(m, mask_id, ids)
            for q in quants:
                lg = run_logits(a.unmask, a.model, x, dev_args(a) + ["--quant", q], a.threads)
                lg[:, mask_id] = -np.inf
                hit[q] += int((np.argmax(lg, axis=1)[m] == ids[m]).sum())
            tot += int(m.sum())
        print(f"mask ratio {r}: " + ", ".join(f"{q} {100 * hit[q] / tot:.2f}%" for q in quants) +
              f" ({tot} positions, {windows} windows of {L})", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--unmask", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quant", default="bf16,q8_0,q4_0")
    ap.add_argument("--device", default=None, help="cuda:N: every logits call there, reference = its bf16 path")
    sub = ap.add_subparsers(dest="cmd", required=True)
    lo = sub.add_parser("logits")
    lo.add_argument("--models", required=True)
    lo.add_argument("--seq", type=int, default=64)
    lo.add_argument("--seed", type=int, default=5)
    lo.add_argument("--gap", type=float, default=0.1)
    ma = sub.add_parser("masked")
    ma.add_argument("--model", required=True)
    ma.add_argument("--valid", required=True)
    ma.add_argument("--windows", type=int, default=256)
    ma.add_argument("--seq-len", type=int, default=256)
    a = ap.parse_args()
    cmd_logits(a) if a.cmd == "logits" else cmd_masked(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
