"""cli_run.py — what the reference tests share: running the real `unmask` binary (make-model,
logits, generate --json), reading its step events, and a PASS/FAIL line reporter. Knows nothing about the
reference algorithms (decode_ref.py) or the model (llada_ref.py).
"""
import json
import os
import subprocess

import numpy as np

BIN = os.environ.get("UNMASK_BIN", "unmask")


def tmp_dir(name):
    d = os.path.join(os.environ.get("UNMASK_TEST_TMP", "/tmp"), name)
    os.makedirs(d, exist_ok=True)
    return d


class Reporter:
    """One line per check ("PASS name: detail"), counts for the final "N passed, N failed"."""

    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, ok, name, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)

    def finish(self):
        print(f"{self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0


def make_model(tmp, name, args):
    """An f32 make-model checkpoint without tokenizer in tmp/name."""
    out = os.path.join(tmp, name)
    subprocess.run([BIN, "make-model", "--out", out, "--no-tokenizer", "--quiet", "--dtype", "f32"] + args,
                   check=True)
    return out


def make_preset(tmp, name, preset, args=()):
    """An f32 make-model checkpoint of `preset` (with its tokenizer) in tmp/name."""
    out = os.path.join(tmp, name)
    subprocess.run([BIN, "make-model", "--out", out, "--preset", preset, "--quiet", "--dtype", "f32"] + list(args),
                   check=True)
    return out


def logits(tmp, model_dir, tokens, extra=()):
    """`unmask logits` on token ids (2 threads, the fp32 CPU kernels), extra flags appended: float64
    [rows, vocab]. The output goes through tmp/out.npy."""
    out = os.path.join(tmp, "out.npy")
    if os.path.exists(out):
        os.remove(out)
    cmd = [BIN, "logits", "--model", model_dir, "--tokens", ",".join(map(str, tokens)), "--out", out,
           "--threads", "2", "--cpu-kernels", "fp32"] + [str(f) for f in extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return np.load(out).astype(np.float64)


def rel_err(ours, ref):
    """Largest absolute difference over the largest reference magnitude."""
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def generate(model_dir, prompt, flags):
    """`unmask generate --json` on token ids: the list of events. On the fp32 CPU kernels, the reference
    path: the bf16 kernels round activations, which can flip a near-tie the NumPy reference decides."""
    cmd = [BIN, "generate", "--model", model_dir, "--prompt-ids", ",".join(map(str, prompt)), "--json",
           "--threads", "1", "--cpu-kernels", "fp32"] + [str(f) for f in flags]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def step_commits(events):
    """Per step event, its commits as sorted (pos, id) pairs."""
    return [sorted((c["pos"], c["id"]) for c in e["commits"]) for e in events if e["type"] == "step"]
