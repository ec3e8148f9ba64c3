#!/usr/bin/python3
"""evaluate.py — held-out evaluation of an exported checkpoint (the files unmask serves).

1. Masked-token accuracy at mask ratios 0.15 / 0.5 / 0.9 on windows of the held-out token stream
   (PyTorch on the checkpoint's weights; export parity is tested separately), against a unigram
   baseline (always the most frequent training token), plus the held-out diffusion loss.
2. Next-line completion with the real engine (`unmask generate`): held-out Python files are cut at
   line ends where the prefix parses and the true next line keeps it parseable; the prompt is the
   text before the cut (whole lines, at most --prompt-bytes), 32 tokens are generated. Metrics:
   exact match of the first generated line, and the fraction whose first line leaves the file
   parseable by `ast` up to that line end (a line that opens a block counts when an indented
   `pass` would complete it). Decoders: low_confidence with 32 / 16 / 8 steps (1 / 2 / 4 tokens per
   step) and threshold tau = 0.9 / 0.7, reporting tokens committed per step. Baseline: 32 tokens
   drawn from the unigram distribution.
3. Samples: un-cherry-picked completions and infills (the first N cut points of a seeded order),
   decoded with the checkpoint's own generation_config.json defaults, as Markdown.
"""
import argparse
import ast
import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from export import load_exported, unmask_bin  # noqa: E402

COMPLETION_DECODERS = [
    ("low_confidence, 32 steps", ["--decoder", "low_confidence", "--steps", "32"]),
    ("low_confidence, 16 steps", ["--decoder", "low_confidence", "--steps", "16"]),
    ("low_confidence, 8 steps", ["--decoder", "low_confidence", "--steps", "8"]),
    ("threshold 0.9", ["--decoder", "threshold", "--threshold", "0.9"]),
    ("threshold 0.7", ["--decoder", "threshold", "--threshold", "0.7"]),
]


# ---------------------------------------------------------------- tokenizer (decode only)

def byte_decoder():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class Detok:
    def __init__(self, model_dir):
        tj = json.load(open(os.path.join(model_dir, "tokenizer.json")))
        bd = byte_decoder()
        self.pieces = {}
        for s, i in tj["model"]["vocab"].items():
            self.pieces[i] = bytes(bd[ch] for ch in s)
        self.special = {a["id"] for a in tj["added_tokens"]}

    def __call__(self, ids):
        return b"".join(self.pieces.get(i, b"") for i in ids if i not in self.special).decode("utf-8", "replace")


# ---------------------------------------------------------------- 1. masked-token accuracy

@torch.no_grad()
def masked_accuracy(model, valid, unigram, mask_id, windows, L, seed=7):
    g = np.random.default_rng(seed)
    starts = np.linspace(0, len(valid) - L - 1, windows).astype(np.int64)
    top = int(np.argmax(unigram))
    out = {}
    for r in (0.15, 0.5, 0.9):
        hit = uhit = tot = 0
        for s0 in range(0, windows, 16):
            ids = torch.from_numpy(np.stack([valid[s:s + L].astype(np.int64) for s in starts[s0:s0 + 16]]))
            m = torch.zeros_like(ids, dtype=torch.bool)
            for i in range(ids.shape[0]):
                m[i, torch.from_numpy(g.permutation(L)[:int(round(r * L))])] = True
            logits = model(torch.where(m, torch.full_like(ids, mask_id), ids))
            logits[..., mask_id] = -float("inf")
            pred = logits.argmax(-1)
            hit += (pred[m] == ids[m]).sum().item()
            uhit += (ids[m] == top).sum().item()
            tot += m.sum().item()
        out[str(r)] = {"model": hit / tot, "unigram": uhit / tot, "positions": tot}
    return out


@torch.no_grad()
def heldout_loss(model, valid, mask_id, windows, L, seed=11):
    """The training objective (1/t-weighted masked CE per position) on fixed windows and t."""
    g = np.random.default_rng(seed)
    starts = np.linspace(0, len(valid) - L - 1, windows).astype(np.int64)
    tot = 0.0
    for s0 in range(0, windows, 16):
        ids = torch.from_numpy(np.stack([valid[s:s + L].astype(np.int64) for s in starts[s0:s0 + 16]]))
        B = ids.shape[0]
        t = torch.from_numpy((np.arange(s0, s0 + B) + 0.5) / windows * (1 - 1e-3) + 1e-3).float()
        m = torch.from_numpy(g.random(ids.shape)) < t[:, None]
        logits = model(torch.where(m, torch.full_like(ids, mask_id), ids))
        ce = torch.nn.functional.cross_entropy(logits[m], ids[m], reduction="none")
        w = (1 / t)[:, None].expand_as(ids)[m]
        tot += (ce * w).sum().item() / L
    return tot / windows


# ---------------------------------------------------------------- 2. completion

def parses(text):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ast.parse(text)
            return True
        except Exception:
            return False


def parses_or_opens_block(prefix, line):
    """prefix + line parses, or would with an indented `pass` after line (line opens a block)."""
    text = prefix + line + "\n"
    if parses(text):
        return True
    indent = len(line) - len(line.lstrip(" "))
    return line.rstrip().endswith(":") and parses(text + " " * (indent + 4) + "pass\n")


def cut_points(files, n, seed, prompt_bytes):
    """[(prefix, prompt, true_line)] at line ends, seeded order over (file, line)."""
    g = np.random.default_rng(seed)
    cands = []
    for fi, text in enumerate(files):
        lines = text.split("\n")
        for li in range(3, len(lines) - 1):
            if lines[li].strip():
                cands.append((fi, li))
    order = g.permutation(len(cands))
    out, per_file = [], {}
    for k in order:
        fi, li = cands[k]
        if per_file.get(fi, 0) >= 3:
            continue
        lines = files[fi].split("\n")
        prefix = "\n".join(lines[:li]) + "\n"
        true_line = lines[li]
        if not parses(prefix) or not parses_or_opens_block(prefix, true_line):
            continue
        start = li
        while start > 0 and len("\n".join(lines[start - 1:li])) + 1 <= prompt_bytes:
            start -= 1
        prompt = "\n".join(lines[start:li]) + "\n"
        out.append((prefix, prompt, true_line))
        per_file[fi] = per_file.get(fi, 0) + 1
        if len(out) == n:
            break
    return out


def generate(model_dir, prompt, flags, suffix=None):
    cmd = [unmask_bin(), "generate", "--model", model_dir, "--raw", "--prompt", prompt, "--json", "--threads", "1"]
    if suffix is not None:
        cmd += ["--suffix", suffix]
    r = subprocess.run(cmd + flags, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"generate failed ({r.returncode}): {r.stderr.strip()}")
    ev = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    done = ev[-1]
    committed = sum(len(e.get("commits", [])) for e in ev if e["type"] == "step")
    steps = sum(1 for e in ev if e["type"] == "step")
    return done["text"], committed, steps, done.get("timings", {}).get("decode_ms", 0.0)


def first_line(text):
    return text.split("\n", 1)[0]


def completion_eval(model_dir, cuts, unigram, detok, seed):
    res = {}
    base = ["--gen-length", "32", "--block-length", "32", "--cache", "none", "--temperature", "0"]
    for name, flags in COMPLETION_DECODERS:
        em = ok = committed = steps = 0
        ms = 0.0
        for prefix, prompt, true_line in cuts:
            text, c, s, t = generate(model_dir, prompt, base + flags)
            line = first_line(text)
            em += line.rstrip() == true_line.rstrip()
            ok += parses_or_opens_block(prefix, line)
            committed += c
            steps += s
            ms += t
        res[name] = {"exact_match": em / len(cuts), "parse_ok": ok / len(cuts), "tokens_per_step": committed / steps,
                     "steps_per_completion": steps / len(cuts), "decode_ms_per_completion": ms / len(cuts)}
        print(f"evaluate: {name}: {res[name]}", file=sys.stderr, flush=True)
    g = np.random.default_rng(seed)
    p = unigram / unigram.sum()
    em = ok = 0
    for prefix, prompt, true_line in cuts:
        line = first_line(detok(list(g.choice(len(p), size=32, p=p))))
        em += line.rstrip() == true_line.rstrip()
        ok += parses_or_opens_block(prefix, line)
    res["unigram baseline"] = {"exact_match": em / len(cuts), "parse_ok": ok / len(cuts)}
    res["ground truth"] = {"exact_match": 1.0,
                           "parse_ok": sum(parses_or_opens_block(a, c) for a, _, c in cuts) / len(cuts)}
    return res


# ---------------------------------------------------------------- 3. samples

def infill_points(files, n, seed):
    """[(prompt, middle, suffix)]: 1-3 whole lines removed from the middle of a held-out file."""
    g = np.random.default_rng(seed)
    out = []
    for fi in g.permutation(len(files)):
        lines = files[fi].split("\n")
        if len(lines) < 30:
            continue
        li = int(g.integers(10, len(lines) - 15))
        k = int(g.integers(1, 4))
        if not any(x.strip() for x in lines[li:li + k]):
            continue
        prompt = "\n".join(lines[max(0, li - 12):li]) + "\n"
        middle = "\n".join(lines[li:li + k]) + "\n"
        suffix = "\n".join(lines[li + k:li + k + 6]) + "\n"
        out.append((prompt, middle, suffix))
        if len(out) == n:
            break
    return out


def samples_markdown(model_dir, files, n_completion, n_infill, seed):
    parts = []
    cuts = cut_points(files, n_completion, seed + 100, 600)
    for i, (_, prompt, true_line) in enumerate(cuts):
        text, c, s, _ = generate(model_dir, prompt, ["--gen-length", "64", "--block-length", "32"])
        parts.append(f"### Completion {i + 1} ({c} tokens in {s} steps)\n\nPrompt (end):\n```python\n"
                     f"{tail_lines(prompt, 8)}```\nGenerated:\n```python\n{text}\n```\n")
    for i, (prompt, middle, suffix) in enumerate(infill_points(files, n_infill, seed + 200)):
        text, c, s, _ = generate(model_dir, prompt, ["--gen-length", "48", "--block-length", "48"], suffix=suffix)
        parts.append(f"### Infill {i + 1} ({c} positions in {s} steps)\n\nPrefix (end):\n```python\n"
                     f"{tail_lines(prompt, 6)}```\nSuffix (start):\n```python\n{head_lines(suffix, 3)}```\n"
                     f"Original middle:\n```python\n{middle}```\nGenerated middle:\n```python\n{text}\n```\n")
    return "\n".join(parts)


def tail_lines(s, n):
    return "\n".join(s.rstrip("\n").split("\n")[-n:]) + "\n"


def head_lines(s, n):
    return "\n".join(s.split("\n")[:n]) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="exported checkpoint directory")
    ap.add_argument("--tokens", default="models/train-work/tokens")
    ap.add_argument("--data", default="models/train-work/data")
    ap.add_argument("--out", required=True, help="eval JSON")
    ap.add_argument("--samples", help="write un-cherry-picked samples (Markdown) here")
    ap.add_argument("--windows", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--n-completion", type=int, default=150)
    ap.add_argument("--prompt-bytes", type=int, default=600)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    meta = json.load(open(os.path.join(args.tokens, "meta.json")))
    valid = np.load(os.path.join(args.tokens, "valid.npy"), mmap_mode="r")
    unigram = np.load(os.path.join(args.tokens, "unigram.npy")).astype(np.float64)
    model = load_exported(args.model)
    res = {"model": args.model, "params": model.n_params(), "heldout_tokens": int(len(valid)), "windows": args.windows}
    res["masked_accuracy"] = masked_accuracy(model, valid, unigram, meta["special"]["mask"], args.windows, args.seq_len)
    res["heldout_loss"] = heldout_loss(model, valid, meta["special"]["mask"], args.windows, args.seq_len)
    print(f"evaluate: masked accuracy {res['masked_accuracy']}, loss {res['heldout_loss']:.4f}", file=sys.stderr,
          flush=True)
    files = [json.loads(line) for line in open(os.path.join(args.data, "valid.jsonl"))]
    code = [f for f in files if parses(f)]
    detok = Detok(args.model)
    if args.n_completion:
        cuts = cut_points(code, args.n_completion, args.seed, args.prompt_bytes)
        res["completion"] = {"examples": len(cuts), "files": len(code), "gen_tokens": 32,
                             "results": completion_eval(args.model, cuts, unigram, detok, args.seed)}
    res["seconds"] = round(time.time() - t0, 1)
    with open(args.out, "w") as fp:
        json.dump(res, fp, indent=2)
    if args.samples:
        with open(args.samples, "w") as fp:
            fp.write(samples_markdown(args.model, code, 12, 8, args.seed))


if __name__ == "__main__":
    main()
