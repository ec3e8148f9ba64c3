#!/usr/bin/python3
"""compare_logits.py CPU.npy CUDA.npy — CUDA logits against the CPU backend's on the same tokens:
relative L2 error <= 2e-2 (bf16 activations vs f32), the same argmax on every decisive row (CPU
top-2 gap > 2 x that row's largest |cuda - cpu|), and at least half the rows decisive. Prints one
line; exit status 0 when all hold. Used by tests/emu/test_emu_cli.sh (CUDA emulator) and
scripts/gpu/run-checks.sh parity (real GPU)."""
import sys
import numpy as np
c = np.load(sys.argv[1]).astype(np.float64)
g = np.load(sys.argv[2]).astype(np.float64)
assert c.shape == g.shape, f"shapes {c.shape} vs {g.shape}"
rel = np.linalg.norm(g - c) / np.linalg.norm(c)
err = np.abs(g - c).max(axis=1)
top2 = np.sort(c, axis=1)[:, -2:]
gap = top2[:, 1] - top2[:, 0]
decisive = gap > 2 * err
agree = np.argmax(c, axis=1) == np.argmax(g, axis=1)
print(f"rel {rel:.3g}, decisive rows {decisive.sum()}/{len(c)}, argmax agree on decisive {agree[decisive].sum()}, "
      f"on all {agree.sum()}")
ok = rel <= 2e-2 and agree[decisive].all() and decisive.sum() >= len(c) // 2
sys.exit(0 if ok else 1)
