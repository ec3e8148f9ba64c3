"""test_quant.py — 8- and 4-bit weights (`--quant q8_0|q4_0`, `unmask quantize`) against NumPy code
written from the GGUF / ggml definitions of Q8_0 and Q4_0 (not from the C code):

  Q8_0: blocks of 32; d = max|x| / 127 (float32), q = round-half-away(x / d) as int8; bytes: d as
        IEEE half (little-endian), then the 32 quants.
  Q4_0: blocks of 32; m = the value of largest magnitude (the first one; +0.0 for a block of zeros),
        d = m / -8,
        q = min(15, trunc(x * (1/d) + 8.5)) in [0, 15]; bytes: d as half, then 16 bytes, byte j =
        q[j] | q[j + 16] << 4.
  Products (docs/cpu-kernels.md): activations quantized per row block of 32 to int8 with a float32
  scale max|x| / 127 (round to nearest even), y = sum over blocks of dw * dx * (the block's integer
  dot product).

Checks:
  1. `unmask quantize --out` writes exactly the spec's bytes (random rows, zero rows, exact ties and
     equal maxima, wide ranges), both types;
  2. `unmask quantize --x` (y = x . W^T on the CPU's quantized kernels) equals the spec product to
     float32 accumulation (<= 1e-5 relative), on every int8 kernel family this CPU has
     (UNMASK_CPU_QKERNELS; one it lacks is skipped, saying why);
  3. `unmask logits --quant` of dense models equals a NumPy forward whose matrices are the spec's
     quantized weights and whose products quantize their activations (relative error a small
     fraction of the quantization's own effect, which is measured against the fp32 reference);
  4. `unmask logits --quant q8_0 --tp 2` equals --tp 1 (a split on block boundaries: only the
     partial sums' order differs), and --tp 4 (a split inside blocks: each rank's slice quantized
     on its own) stays within the quantization's own error.
Prints one line per check and "N passed, N failed".
"""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_run import BIN, Reporter, make_model, rel_err, tmp_dir  # noqa: E402
from llada_ref import LLaDARef  # noqa: E402

TMP = tmp_dir("test_quant")
report = Reporter()


# ---------------------------------------------------------------- the spec, in NumPy

def round_half_away(v):
    """C roundf of float32 values (exact in float64)."""
    v = v.astype(np.float64)
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def spec_quantize(w, kind):
    """w float32 [R, C] (C % 32 == 0) -> (bytes [R, C/32 * block bytes] uint8, dequantized float64 [R, C],
    per-block scales float64 [R, C/32], integer quants [R, C/32, 32])."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    R, C = w.shape
    b = w.reshape(R, C // 32, 32)
    if kind == "q8_0":
        amax = np.abs(b).max(axis=-1)
        d = (amax / np.float32(127)).astype(np.float32)
        inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
        q = round_half_away((b * inv[..., None]).astype(np.float32)).astype(np.int8)
        payload = q.view(np.uint8)
        qi = q.astype(np.int64)
    else:
        idx = np.argmax(np.abs(b), axis=-1)   # the first of equal magnitudes
        m = np.take_along_axis(b, idx[..., None], axis=-1)[..., 0]
        m = np.where(np.abs(m) > 0, m, np.float32(0.0))   # no |x| above 0: the scan keeps its start, +0.0
        d = (m / np.float32(-8)).astype(np.float32)
        inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
        v = ((b * inv[..., None]).astype(np.float32) + np.float32(8.5)).astype(np.float32)
        qu = np.minimum(15, np.trunc(v.astype(np.float64))).astype(np.uint8)
        payload = (qu[..., :16] | (qu[..., 16:] << 4)).astype(np.uint8)
        qi = qu.astype(np.int64) - 8
    d16 = d.astype("<f2")
    blocks = np.concatenate([d16.view(np.uint8).reshape(R, C // 32, 2), payload], axis=-1)
    dw = d16.astype(np.float64)
    deq = (qi * dw[..., None]).reshape(R, C)
    return blocks.reshape(R, -1), deq, dw, qi


def quant_act(x):
    """Activations [T, C] -> (int quants [T, B, 32], scales [T, B]) of the padded rows (B = ceil(C / 32))."""
    T, C = x.shape
    kpad = (C + 31) // 32 * 32
    xp = np.zeros((T, kpad), dtype=np.float32)
    xp[:, :C] = x
    b = xp.reshape(T, kpad // 32, 32)
    amax = np.abs(b).max(axis=-1)
    d = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    q = np.rint((b * inv[..., None]).astype(np.float32)).astype(np.int64)
    return q, d.astype(np.float64)


def spec_product(x, wq, dw):
    """y [T, R] = sum_b dw[r, b] dx[t, b] (qx[t, b] . wq[r, b]) in float64."""
    qx, dx = quant_act(x)
    dots = np.einsum("tbk,rbk->trb", qx, wq)
    return np.einsum("trb,tb,rb->tr", dots.astype(np.float64), dx, dw)


# ---------------------------------------------------------------- 1-2: unmask quantize

def npy_path(name):
    return os.path.join(TMP, name)


def test_quantize_cli():
    rng = np.random.default_rng(7)
    R, C = 67, 256
    w = rng.standard_normal((R, C)).astype(np.float32) * np.exp(rng.uniform(-6, 3, size=(R, 1))).astype(np.float32)
    w[3] = 0                                   # a zero row: scale 0
    w[5, :32] = np.float32(1.0)                # equal magnitudes: Q4_0 takes the first
    w[5, 7] = np.float32(-1.0)
    w[6] = np.round(w[6] * 4) / 4              # coarse values: x / d lands on halves (ties) more often
    w[7, 40:72] = np.linspace(-127, 127, 32, dtype=np.float32) / 127 * 3.5   # exact .5 multiples of d
    x = rng.standard_normal((9, C)).astype(np.float32)
    np.save(npy_path("w.npy"), w)
    np.save(npy_path("x.npy"), x)
    # many exact ties and equal maxima: small integers over 4, and blocks of zeros of either sign
    ties = (rng.integers(-20, 21, size=(600, 512)) / 4).astype(np.float32)
    ties[7, :64] = -0.0
    ties[8, :32] = 0.0
    np.save(npy_path("ties.npy"), ties)
    for kind in ["q8_0", "q4_0"]:
        out = npy_path(f"{kind}_ties.bin")
        subprocess.run([BIN, "quantize", "--in", npy_path("ties.npy"), "--type", kind, "--out", out], check=True)
        ours, want = np.fromfile(out, dtype=np.uint8), spec_quantize(ties, kind)[0].reshape(-1)
        nbad = int(np.sum(ours != want)) if ours.size == want.size else -1
        report(nbad == 0, f"{kind} bytes, ties", f"600 x 512 values in steps of 1/4 and zero blocks: {nbad} of "
               f"{want.size} bytes differ from the spec")
    for kind in ["q8_0", "q4_0"]:
        out = npy_path(f"{kind}.bin")
        subprocess.run([BIN, "quantize", "--in", npy_path("w.npy"), "--type", kind, "--out", out], check=True)
        ours = np.fromfile(out, dtype=np.uint8)
        want, _, dw, wq = spec_quantize(w, kind)
        same = ours.size == want.size and np.array_equal(ours, want.reshape(-1))
        nbad = int(np.sum(ours != want.reshape(-1))) if ours.size == want.size else -1
        report(same, f"{kind} bytes", f"{R} rows x {C // 32} blocks, {want.size} bytes; {nbad} differ from the spec")
        ref = spec_product(x, wq, dw)
        for fam in ["scalar", "avx2", "avxvnni", "avx512vnni"]:
            y_path = npy_path("y.npy")
            if os.path.exists(y_path):
                os.remove(y_path)
            r = subprocess.run([BIN, "quantize", "--in", npy_path("w.npy"), "--type", kind, "--x", npy_path("x.npy"),
                                "--y", y_path, "--threads", "2"], capture_output=True, text=True,
                               env=dict(os.environ, UNMASK_CPU_QKERNELS=fam))
            if r.returncode != 0 and "lacks" in r.stderr:
                print(f"SKIP {kind} product on {fam}: {r.stderr.strip().splitlines()[-1]}", flush=True)
                continue
            if r.returncode != 0:
                report(False, f"{kind} product on {fam}", r.stderr.strip())
                continue
            y = np.load(y_path).astype(np.float64)
            mag = np.abs(np.einsum("tbk,rbk->trb", *[quant_act(x)[0], wq])).max()
            err = rel_err(y, ref)
            report(err <= 1e-5 and mag > 0, f"{kind} product on {fam}", f"9 x {R} outputs, max rel err {err:.2e} "
                   "(tol 1e-5)")


# ---------------------------------------------------------------- 3: whole models

class QMatrix:
    """A weight matrix quantized by the spec whose products quantize their activations: `h @ w.T`."""
    __array_ufunc__ = None   # numpy defers `ndarray @ QMatrix` to QMatrix.__rmatmul__

    def __init__(self, w, kind):
        R, C = w.shape
        kpad = (C + 31) // 32 * 32
        wp = np.zeros((R, kpad), dtype=np.float32)
        wp[:, :C] = w
        _, _, self.dw, self.wq = spec_quantize(wp, kind)

    @property
    def T(self):
        return self

    def __rmatmul__(self, h):
        return spec_product(np.asarray(h), self.wq, self.dw)


MATRICES = ["q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out"]


def quantized_ref(model_dir, kind):
    ref = LLaDARef(model_dir)
    for name in list(ref.w):
        short = name.split(".")[-2]
        if (".blocks." in name and short in MATRICES) or name == "model.transformer.ff_out.weight":
            ref.w[name] = QMatrix(ref.w[name], kind)
    return ref


def logits(model_dir, tokens, extra):
    out = npy_path("logits.npy")
    if os.path.exists(out):
        os.remove(out)
    cmd = [BIN, "logits", "--model", model_dir, "--tokens", ",".join(map(str, tokens)), "--out", out,
           "--threads", "2"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return np.load(out).astype(np.float64)


def test_models():
    models = [
        ("d128 GQA 4/2, ffn 352", make_model(TMP, "gqa", ["--d-model", "128", "--n-heads", "4", "--n-kv-heads", "2",
                                                           "--n-layers", "2", "--ffn", "352", "--vocab", "500"]), 40),
        ("odd sizes d96/3 heads, ffn 200 (padded blocks)",
         make_model(TMP, "odd", ["--d-model", "96", "--n-heads", "3", "--n-layers", "2", "--ffn", "200",
                                 "--vocab", "300"]), 33),
    ]
    for name, m, T in models:
        tokens = np.random.default_rng(T).integers(0, 300, size=T)
        fp32 = LLaDARef(m).forward(tokens)
        for kind, tol in [("q8_0", 1e-4), ("q4_0", 1e-4)]:
            ours = logits(m, tokens, ["--quant", kind, "--cpu-kernels", "fp32"])
            sim = quantized_ref(m, kind).forward(tokens)
            e_sim, e_fp = rel_err(ours, sim), rel_err(ours, fp32)
            q_effect = rel_err(sim, fp32)
            report(e_sim <= tol and e_sim < 0.2 * q_effect, f"{kind} {name}",
                   f"T={T} max rel err vs the spec's quantized forward {e_sim:.2e} (tol {tol:g} and < 1/5 of the "
                   f"quantization's own effect {q_effect:.2e}); vs fp32 {e_fp:.2e}")


# ---------------------------------------------------------------- 4: tensor parallel

def test_tp():
    # heads 4 x head_dim 32 and ffn 256: 2 ranks split every matrix on block boundaries, 4 ranks the
    # attention output's 128 inputs into 32 each (aligned) and the MLP's 256 into 64 (aligned) ...
    aligned = make_model(TMP, "tp", ["--d-model", "128", "--n-heads", "4", "--n-layers", "2", "--ffn", "256",
                                     "--vocab", "400"])
    # ... and here ffn 176 / 2 = 88 inputs per rank: blocks cut inside (each rank pads its own slice)
    cut = make_model(TMP, "tp_cut", ["--d-model", "64", "--n-heads", "2", "--n-layers", "2", "--ffn", "176",
                                     "--vocab", "400"])
    tokens = np.random.default_rng(5).integers(0, 400, size=48)
    for kind in ["q8_0", "q4_0"]:
        one = logits(aligned, tokens, ["--quant", kind])
        two = logits(aligned, tokens, ["--quant", kind, "--tp", "2"])
        e = rel_err(two, one)
        report(e <= 1e-4, f"{kind} --tp 2 vs --tp 1 (block-aligned split)", f"max rel err {e:.2e} (tol 1e-4)")
        one = logits(cut, tokens, ["--quant", kind])
        two = logits(cut, tokens, ["--quant", kind, "--tp", "2"])
        fp32 = LLaDARef(cut).forward(tokens)
        e, q_effect = rel_err(two, one), rel_err(one, fp32)
        report(e <= 2 * q_effect, f"{kind} --tp 2 vs --tp 1 (split inside blocks)",
               f"max rel err {e:.2e}, within twice the quantization's effect {q_effect:.2e}")


def main():
    test_quantize_cli()
    test_models()
    test_tp()
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
