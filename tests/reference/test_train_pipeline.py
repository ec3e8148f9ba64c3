#!/usr/bin/python3
"""test_train_pipeline.py — tools/train/ end to end on a tiny configuration, in seconds, so the
pipeline cannot rot: gather_data.py (the repository's own Python files as the corpus), prepare.py
(the project's BPE trainer through `unmask make-model --tokenizer-only`, `unmask tokenize`),
train.py (the loss falls; an interrupted run resumed from its checkpoint ends bit-identical to an
uninterrupted one), export.py (through `unmask make-model --weights`: `unmask logits` on the
exported checkpoint matches the PyTorch model within 1e-3 relative, in f32 and in bf16), and
evaluate.py (runs and reports every metric).
"""
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

SRC = os.environ.get("UNMASK_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TRAIN = os.path.join(SRC, "tools", "train")
sys.path.insert(0, TRAIN)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_run import BIN, Reporter, tmp_dir  # noqa: E402
from export import load_exported, load_train_checkpoint  # noqa: E402

PY = sys.executable
TINY = ["--d-model", "64", "--n-layers", "2", "--n-heads", "2", "--ffn", "128", "--seq-len", "64", "--batch", "8",
        "--lr", "1e-2", "--warmup", "5", "--log-every", "1", "--eval-every", "20", "--eval-windows", "8",
        "--save-every", "10", "--long-seq", "128", "--long-frac", "0.1", "--max-seq", "128", "--seed", "3",
        "--local-heads=-1,1;1"]


def run(args, **kw):
    env = dict(os.environ, UNMASK_BIN=BIN)
    r = subprocess.run([PY] + args, capture_output=True, text=True, env=env, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r


def rel_err(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def logits_parity(rep, name, model_dir, ids):
    out = os.path.join(model_dir, "logits.npy")
    # the fp32 CPU kernels: the reference path (the bf16 kernels round activations: test_cpu_kernels.py)
    subprocess.run([BIN, "logits", "--model", model_dir, "--tokens", ",".join(map(str, ids)), "--out", out,
                    "--threads", "1", "--cpu-kernels", "fp32"], check=True)
    c = np.load(out)
    with torch.no_grad():
        p = load_exported(model_dir)(torch.tensor([ids])).numpy()[0]
    e = rel_err(c, p)
    rep(c.shape == p.shape and e <= 1e-3, name, f"shape {c.shape}, max |diff| / max |logit| = {e:.2e}")


def main():
    rep = Reporter()
    tmp = tmp_dir("train_pipeline")
    shutil.rmtree(tmp)
    os.makedirs(tmp)
    data, tokens = os.path.join(tmp, "data"), os.path.join(tmp, "tokens")
    run([os.path.join(TRAIN, "gather_data.py"), "--out", data, "--no-prose", "--valid-percent", "20",
         "--code-root", os.path.join(SRC, "tools"), "--code-root", os.path.join(SRC, "tests", "reference")])
    stats = json.load(open(os.path.join(data, "stats.json")))
    rep(stats["train"]["code"]["files"] > 3 and stats["valid"]["code"]["files"] >= 1, "gather: train and held-out files",
        json.dumps(stats))
    run([os.path.join(TRAIN, "prepare.py"), "--data", data, "--out", tokens, "--merges", "300"])
    meta = json.load(open(os.path.join(tokens, "meta.json")))
    tj = json.load(open(os.path.join(tokens, "tokenizer", "tokenizer.json")))
    added = {a["content"] for a in tj["added_tokens"]}
    rep({"<|mdm_mask|>", "<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"} <= added and
        len(tj["model"]["merges"]) == 300, "tokenizer: 300 merges, mask / EOS / FIM special tokens",
        f"{meta['n_vocab']} ids")
    train = np.load(os.path.join(tokens, "train.npy"))
    rep(train.dtype == np.uint16 and (train == meta["special"]["eos"]).sum() == meta["train"]["docs"],
        "token stream: one EOS after every document", f"{len(train)} tokens")

    a, b = os.path.join(tmp, "run_a"), os.path.join(tmp, "run_b")
    run([os.path.join(TRAIN, "train.py"), "--tokens", tokens, "--out", a, "--steps", "40"] + TINY)
    log = [json.loads(x) for x in open(os.path.join(a, "log.jsonl"))]
    losses = [e["loss"] for e in log if "loss" in e]
    ce = [e["ce"] for e in log if "ce" in e]   # mean CE over masked positions (the loss without 1/t)
    evals = [e for e in log if "eval_loss" in e]
    first, last = ce[0], np.mean(ce[-10:])
    rep(len(losses) == 40 and all(math.isfinite(x) for x in losses) and first > math.log(meta["n_vocab"]) - 0.5 and
        last < first - 0.5, "train: the masked-diffusion loss falls",
        f"masked CE at step 1 {first:.3f} (ln V = {math.log(meta['n_vocab']):.3f}), last 10 steps {last:.3f}")
    rep(len(evals) == 2 and all(k in evals[-1] for k in ("eval_acc@0.15", "eval_acc@0.5", "eval_acc@0.9")),
        "train: periodic held-out evaluation", json.dumps(evals[-1]))
    run([os.path.join(TRAIN, "train.py"), "--tokens", tokens, "--out", b, "--steps", "40", "--stop-after", "17"] + TINY)
    run([os.path.join(TRAIN, "train.py"), "--tokens", tokens, "--out", b, "--steps", "40", "--resume"] + TINY)
    ma, _ = load_train_checkpoint(os.path.join(a, "ckpt.pt"))
    mb, ck = load_train_checkpoint(os.path.join(b, "ckpt.pt"))
    same = all(torch.equal(x, y) for x, y in zip(ma.state_dict().values(), mb.state_dict().values()))
    rep(same and ck["step"] == 40, "train: stopped at 17 + resumed == uninterrupted, bit for bit", f"step {ck['step']}")

    ids = [int(x) for x in np.load(os.path.join(tokens, "valid.npy"))[:24]]
    for dtype in ("f32", "bf16"):
        out = os.path.join(tmp, f"export_{dtype}")
        run([os.path.join(TRAIN, "export.py"), "--ckpt", os.path.join(a, "ckpt.pt"), "--tokenizer",
             os.path.join(tokens, "tokenizer"), "--out", out, "--dtype", dtype])
        cj = json.load(open(os.path.join(out, "config.json")))
        gc = json.load(open(os.path.join(out, "generation_config.json")))
        rep(cj["d_model"] == 64 and cj["n_layers"] == 2 and cj["mask_token_id"] == meta["special"]["mask"] and
            cj["embedding_size"] % 64 == 0 and gc["decoder"] == "threshold" and gc["cache"] == "dual",
            f"export {dtype}: config.json / generation_config.json")
        logits_parity(rep, f"export {dtype}: unmask logits == PyTorch (<= 1e-3 relative)", out, ids)
    with torch.no_grad():   # the f32 export holds exactly the trained weights
        p_ck = ma(torch.tensor([ids])).numpy()
        p_ex = load_exported(os.path.join(tmp, "export_f32"))(torch.tensor([ids])).numpy()
    rep(np.array_equal(p_ck, p_ex), "export f32: the checkpoint's weights, unchanged")

    ev = os.path.join(tmp, "eval.json")
    run([os.path.join(TRAIN, "evaluate.py"), "--model", os.path.join(tmp, "export_bf16"), "--tokens", tokens,
         "--data", data, "--out", ev, "--windows", "8", "--seq-len", "64", "--n-completion", "2", "--prompt-bytes", "150"])
    e = json.load(open(ev))
    res = e.get("completion", {}).get("results", {})
    rep(set(e["masked_accuracy"]) == {"0.15", "0.5", "0.9"} and len(res) == 7 and
        all(res[k]["tokens_per_step"] >= 1 for k in res if "tokens_per_step" in res[k]),
        "evaluate: masked accuracy, completion metrics, tokens per step", json.dumps(res)[:300])
    return rep.finish()


if __name__ == "__main__":
    sys.exit(main())
