"""test_forward.py — `unmask logits` (CPU forward) against the independent NumPy reference.

For several checkpoint shapes written by `unmask make-model --no-tokenizer` (odd head count, GQA,
a long sequence, weight tying over 3 shards, f16, bf16) it compares our logits with llada_ref.py:
max|ours - ref| / max|ref| <= 1e-4 where the weights are f32/f16, argmax agreement (plus the
measured error, bounded loosely) for bf16. Also checks that --positions returns exactly the
matching rows of the full output (to fp32 rounding) and that --key-valid padding matches the reference's padded
result (and really changes the logits). All on the fp32 kernel path (--cpu-kernels fp32, the reference); the
bf16 kernel paths are test_cpu_kernels.py's. Prints one line per check and "N passed, N failed".
"""
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llada_ref import LLaDARef  # noqa: E402

BIN = os.environ.get("UNMASK_BIN", "unmask")
TMP = os.path.join(os.environ.get("UNMASK_TEST_TMP", "/tmp"), "test_forward")
os.makedirs(TMP, exist_ok=True)

passed = failed = 0


def report(ok, name, detail):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)


def make_model(name, args):
    out = os.path.join(TMP, name)
    subprocess.run([BIN, "make-model", "--out", out, "--no-tokenizer", "--quiet"] + args, check=True)
    return out


def logits(model_dir, tokens, positions=None, key_valid=None, threads=2):
    out = os.path.join(TMP, "out.npy")
    if os.path.exists(out):
        os.remove(out)
    cmd = [BIN, "logits", "--model", model_dir, "--tokens", ",".join(map(str, tokens)), "--out", out,
           "--threads", str(threads), "--cpu-kernels", "fp32"]
    if positions is not None:
        cmd += ["--positions", ",".join(map(str, positions))]
    if key_valid is not None:
        cmd += ["--key-valid", ",".join(map(str, key_valid))]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"unmask logits failed ({r.returncode}): {r.stderr.strip()}")
    a = np.load(out)
    assert a.dtype == np.float32 and a.ndim == 2, (a.dtype, a.shape)
    return a


def rel_err(ours, ref):
    return float(np.max(np.abs(ours.astype(np.float64) - ref)) / np.max(np.abs(ref)))


def n_rows(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    return c.get("embedding_size") or c["vocab_size"]


def compare(name, model_dir, T, tol=1e-4, bf16=False, seed=0):
    rng = np.random.default_rng(seed)
    V = n_rows(model_dir)
    tokens = rng.integers(0, V, size=T)
    ref = LLaDARef(model_dir).forward(tokens)
    ours = logits(model_dir, tokens)
    if ours.shape != ref.shape:
        report(False, name, f"shape {ours.shape}, expected {ref.shape}")
        return
    err = rel_err(ours, ref)
    if not bf16:
        report(err <= tol, name, f"T={T} max rel err {err:.3e} (tol {tol:.0e})")
        return
    # bf16 weights: argmax must agree wherever the reference's top-2 gap is not within noise
    top2 = np.sort(ref, axis=1)[:, -2:]
    gap = top2[:, 1] - top2[:, 0]
    noise = 10 * np.max(np.abs(ours - ref))
    clear = gap > noise
    agree = np.argmax(ours, axis=1) == np.argmax(ref, axis=1)
    ok = bool(np.all(agree[clear])) and clear.sum() >= T // 2 and err <= 1e-3
    report(ok, name, f"T={T} argmax agrees on {int(agree[clear].sum())}/{int(clear.sum())} clear rows "
           f"({int(agree.sum())}/{T} overall), max rel err {err:.3e}")


def main():
    # 1. odd head count: d_model 96 / 3 heads (head_dim 32)
    m_odd = make_model("odd_heads", ["--dtype", "f32", "--d-model", "96", "--n-heads", "3", "--n-layers", "2",
                                     "--ffn", "160", "--vocab", "300"])
    compare("f32 d96/3 heads", m_odd, 37)
    # 2. GQA 8 heads / 2 kv heads, non-default rope theta
    m_gqa = make_model("gqa", ["--dtype", "f32", "--d-model", "128", "--n-heads", "8", "--n-kv-heads", "2",
                               "--n-layers", "2", "--ffn", "192", "--vocab", "256", "--rope-theta", "10000"])
    compare("f32 GQA 8/2 heads", m_gqa, 50)
    # 3. a long sequence
    m_long = make_model("long", ["--dtype", "f32", "--preset", "tiny", "--vocab", "512"])
    compare("f32 tiny long sequence", m_long, 400)
    # 4. weight tying over a 3-shard checkpoint
    m_tied = make_model("tied_shards", ["--dtype", "f32", "--d-model", "64", "--n-heads", "4", "--n-layers", "3",
                                        "--ffn", "128", "--vocab", "200", "--weight-tying", "--shards", "3"])
    compare("f32 weight tying, 3 shards", m_tied, 20)
    # 5. f16 weights (exact in f32, so the f32 tolerance applies)
    m_f16 = make_model("f16", ["--dtype", "f16", "--d-model", "64", "--n-heads", "2", "--n-layers", "2",
                               "--ffn", "96", "--vocab", "300"])
    compare("f16 weights", m_f16, 33)
    # 6. bf16 weights
    m_bf16 = make_model("bf16", ["--dtype", "bf16", "--preset", "tiny", "--vocab", "512"])
    compare("bf16 tiny", m_bf16, 64, bf16=True)

    # 7. --positions returns the matching rows of the full output. The hidden states are computed
    # identically; only the LM-head GEMM runs with a different row count, and OpenBLAS's blocking
    # depends on it, so equality is up to fp32 rounding (a wrong row would differ by O(1)).
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, n_rows(m_odd), size=37)
    full = logits(m_odd, tokens)
    scale = float(np.max(np.abs(full)))
    pos = [5, 0, 36, 5, 17]
    sub = logits(m_odd, tokens, positions=pos)
    d = float(np.max(np.abs(sub - full[pos]))) / scale if sub.shape == (len(pos), full.shape[1]) else np.inf
    report(d <= 2e-6, "--positions rows", f"shape {sub.shape}, max rel diff to full rows {d:.3e} (tol 2e-6)")
    sub1 = logits(m_odd, tokens, positions=[36], threads=1)
    d = float(np.max(np.abs(sub1 - full[[36]]))) / scale if sub1.shape == (1, full.shape[1]) else np.inf
    report(d <= 2e-6, "--positions single row, 1 thread", f"max rel diff to full row {d:.3e} (tol 2e-6)")
    nearest = min(float(np.max(np.abs(full[i] - full[36]))) for i in range(36)) / scale
    report(nearest > 1e-2, "rows are distinguishable", f"closest other row differs by {nearest:.3e}")

    # 8. --key-valid: padding keys excluded for every query, as in the reference
    T = 50
    tokens = np.random.default_rng(8).integers(0, n_rows(m_gqa), size=T)
    kv = np.ones(T, dtype=int)
    kv[40:] = 0
    kv[[3, 17]] = 0
    ref_pad = LLaDARef(m_gqa).forward(tokens, key_valid=kv)
    ref_nopad = LLaDARef(m_gqa).forward(tokens)
    ours_pad = logits(m_gqa, tokens, key_valid=kv)
    err = rel_err(ours_pad, ref_pad)
    change = rel_err(ours_pad, ref_nopad)
    report(err <= 1e-4 and change > 1e-2, "--key-valid padding",
           f"max rel err vs padded reference {err:.3e} (tol 1e-4); differs from unpadded by {change:.3e}")
    ours_ones = logits(m_gqa, tokens, key_valid=[1] * T)
    report(rel_err(ours_ones, ref_nopad) <= 1e-4, "--key-valid all ones",
           f"max rel err vs unpadded reference {rel_err(ours_ones, ref_nopad):.3e}")

    # 9. thread count does not change results beyond fp32 noise
    a1 = logits(m_long, np.arange(300) % 512, threads=1)
    a2 = logits(m_long, np.arange(300) % 512, threads=2)
    d = rel_err(a1, a2.astype(np.float64))
    report(d <= 1e-5, "threads 1 vs 2", f"max rel diff {d:.3e}")

    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
