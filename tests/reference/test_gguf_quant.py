"""test_gguf_quant.py — GGUF files with Q8_0 / Q4_0 weights (what llama.cpp's converter writes with
--outtype q8_0, and llama-quantize --pure Q4_0 makes), written by the tests' own NumPy quantizers
(gguf_write.py), reach the backend's quantized kernels as they are.

- The unit-test fixture tests/fixtures/gguf/vectors.gguf (util/quant.c vs the NumPy quantizers,
  tests/unit/test_gguf.c) is what gguf_fixture.py writes, byte for byte.
- `unmask logits` on a quantized GGUF file against the NumPy references (llada_ref, dream_ref,
  moe_ref: float64) run on the dequantized weights of that same file: the only difference left is
  the kernels' 8-bit activations, so the error bound is tight; and against the f32 checkpoint the
  file was made from (the quantization error): relative error and argmax agreement on decisive rows.
- Mixed files: Dream's 176-wide down projections fall back to F16 (the converter's rule for rows
  that are not whole blocks), the MoE router stays F32, stacked quantized experts become views.
- Tensor parallel on quantized weights (whole-block column slices) equals one rank up to an 8-bit
  activation step; a split that would cut a block is refused with a message.
Bounds are empirical with margin (random weights); MoE rows may route differently once activations
are 8-bit (near-tied experts), so 90% of their rows must be within the bound.
Prints one line per check and "N passed, N failed".
"""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_convert as gc  # noqa: E402
import gguf_fixture  # noqa: E402
import gguf_write as gw  # noqa: E402
from cli_run import BIN, Reporter, rel_err, tmp_dir  # noqa: E402
from dream_ref import DreamRef  # noqa: E402
from llada_ref import LLaDARef  # noqa: E402
from moe_ref import MoERef  # noqa: E402

TMP = tmp_dir("test_gguf_quant")
report = Reporter()

with open(gguf_fixture.PATH, "rb") as f:
    committed = f.read()
report(gguf_fixture.build() == committed, "tests/fixtures/gguf/vectors.gguf is what gguf_fixture.py writes")


def make(name, preset, args=()):
    out = os.path.join(TMP, name)
    subprocess.run([BIN, "make-model", "--out", out, "--preset", preset, "--quiet", "--dtype", "f32"] + list(args),
                   check=True)
    return out


def logits(model, tokens, extra=()):
    out = os.path.join(TMP, "out.npy")
    if os.path.exists(out):
        os.remove(out)
    cmd = [BIN, "logits", "--model", model, "--tokens", ",".join(map(str, tokens)), "--out", out, "--threads", "2"] + \
        list(extra)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return np.load(out).astype(np.float64)


def decisive_agreement(ours, ref):
    """argmax agreement over the rows whose reference top-2 margin is at least 10% of its logit range."""
    s = np.sort(ref, axis=1)
    keep = (s[:, -1] - s[:, -2]) >= 0.1 * (s[:, -1] - s[:, 0])
    if not keep.any():
        return 1.0, 0
    return float(np.mean(ours[keep].argmax(1) == ref[keep].argmax(1))), int(keep.sum())


TOKENS = [int(t) for t in np.random.default_rng(11).integers(0, 1300, size=24)]
# (name, preset, make-model args, reference class, arch, tolerances {type: (vs dequantized ref, vs f32 ckpt)})
CASES = [
    ("llada", "tiny", ["--d-model", "128", "--ffn", "320", "--n-heads", "4", "--n-kv-heads", "2"], LLaDARef, "llada"),
    ("dream", "dream-tiny", [], DreamRef, "dream"),
    ("llada-moe", "lladamoe-tiny", ["--first-dense", "1", "--n-layers", "3", "--expert-bias", "1"], MoERef, "llada-moe"),
]
TOL = {"q8_0": (2e-2, 4e-2, 0.9), "q4_0": (2e-2, 4e-1, 0.6)}   # vs dequantized ref, vs f32, decisive argmax


def row_errors(ours, ref):
    """Per row: max |ours - ref| over the largest reference magnitude."""
    return np.max(np.abs(ours - ref), axis=1) / np.max(np.abs(ref))


def within(ours, ref, tol, moe):
    """(ok, detail). Dense models: every row within tol. MoE: a token whose experts are nearly tied
    may route differently once activations are 8-bit (a discontinuity, not an error of the file):
    90% of the rows within tol."""
    r = row_errors(ours, ref)
    if not moe:
        return float(r.max()) <= tol, f"max rel err {r.max():.2e}"
    frac = float(np.mean(r <= tol))
    return frac >= 0.9, f"{frac:.0%} of rows within {tol:g} (median {np.median(r):.2e}, max {r.max():.2e})"

for name, preset, args, Ref, arch in CASES:
    d = make(name, preset, args)
    f32 = logits(d, TOKENS)
    for qt in ("q8_0", "q4_0"):
        g = os.path.join(TMP, f"{name}.{qt}.gguf")
        stored = gc.convert(d, g, qt)
        types = {gw.TYPE_NAME[t] for t, _, _ in stored.values()}
        ours = logits(g, TOKENS)
        ref = Ref(d)
        ref.w = gc.hf_tensors(stored, arch, ref.cfg)
        want = ref.forward(np.array(TOKENS))
        t1, t2, t3 = TOL[qt]
        ok1, det1 = within(ours, want, t1, arch == "llada-moe")
        ok2, det2 = within(ours, f32, t2, arch == "llada-moe")
        agree, n = decisive_agreement(ours, f32)
        report(ok1, f"{name} {qt.upper()} GGUF vs NumPy on its dequantized weights",
               f"{det1} (8-bit activations), types {sorted(types)}")
        report(ok2 and agree >= t3, f"{name} {qt.upper()} GGUF vs the f32 checkpoint",
               f"{det2}, argmax agreement {agree:.2f} on {n} decisive rows")

# mixed files as the converter writes them
types = {g: gw.TYPE_NAME[t] for g, (t, _, _) in gc.convert(os.path.join(TMP, "dream"), os.path.join(TMP, "x.gguf"),
                                                             "q8_0").items()}
report(types["blk.0.ffn_down.weight"] == "F16" and types["blk.0.ffn_up.weight"] == "Q8_0",
       "dream q8_0: 176-wide rows fall back to F16 beside Q8_0", str({k: v for k, v in types.items() if "blk.0" in k}))
types = {g: gw.TYPE_NAME[t] for g, (t, _, _) in gc.convert(os.path.join(TMP, "llada-moe"), os.path.join(TMP, "x.gguf"),
                                                             "q8_0").items()}
report(types["blk.1.ffn_gate_inp.weight"] == "F32" and types["blk.1.ffn_up_exps.weight"] == "Q8_0",
       "llada-moe q8_0: router F32, stacked experts Q8_0")

# tensor parallel: whole-block slices
g = os.path.join(TMP, "llada.q8_0.gguf")
one, two = logits(g, TOKENS), logits(g, TOKENS, ["--tp", "2"])
# the ranks' partial sums add up in another order; an 8-bit activation near a rounding boundary can
# then land one step away, so the bound is a quantization step's, not float rounding's
report(rel_err(two, one) <= 1e-2, "llada Q8_0 --tp 2 == one rank up to one activation step",
       f"max rel err {rel_err(two, one):.2e}")
tiny = make("tiny", "tiny")
gq = os.path.join(TMP, "tiny.q8_0.gguf")
gc.convert(tiny, gq, "q8_0")
r = subprocess.run([BIN, "logits", "--model", gq, "--tokens", "1,2,3", "--out", os.path.join(TMP, "o.npy"), "--tp", "4"],
                   capture_output=True, text=True)
report(r.returncode not in (0,) and r.returncode < 128 and "split into 16 per rank" in r.stderr and "Q8_0" in r.stderr,
       "--tp 4 on 64-wide Q8_0 rows: refused (a slice would cut a block)", r.stderr.strip()[:200])

# --quant on GGUF files: float matrices are quantized at load exactly as a directory's are; stored
# Q8_0 / Q4_0 matrices are never requantized (another --quant is refused naming the tensor)
gb = os.path.join(TMP, "llada.f32.gguf")
gc.convert(os.path.join(TMP, "llada"), gb, "f32")
for qt in ("q8_0", "q4_0"):
    from_dir = logits(os.path.join(TMP, "llada"), TOKENS, ["--quant", qt])
    from_gguf = logits(gb, TOKENS, ["--quant", qt])
    report(np.array_equal(from_dir, from_gguf), f"--quant {qt} on an F32 GGUF == the same weights' directory",
           f"max abs diff {np.max(np.abs(from_dir - from_gguf)):.3e}")
same = logits(g, TOKENS, ["--quant", "q8_0"])
report(np.array_equal(same, logits(g, TOKENS)), "--quant q8_0 on a Q8_0 GGUF: the stored blocks as they are")
r = subprocess.run([BIN, "logits", "--model", g, "--tokens", "1,2,3", "--out", os.path.join(TMP, "o.npy"),
                    "--quant", "q4_0"], capture_output=True, text=True)
report(r.returncode not in (0,) and r.returncode < 128 and "stored as Q8_0" in r.stderr and "never requantized" in r.stderr,
       "--quant q4_0 on a Q8_0 GGUF: refused naming the tensor and both types", r.stderr.strip()[:240])

sys.exit(report.finish())
