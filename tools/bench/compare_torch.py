#!/usr/bin/python3
"""compare_torch.py — unmask's CPU forward and dual-cache decode against the PyTorch peer
(torch_peer.py) on the same checkpoint, interleaved in one run, as docs/perf.md reports them.

For every shape and every round it runs `unmask bench` (optionally a second, baseline unmask binary
too) and then the peer, one after the other, so a load change on a shared machine hits all of them;
each number is the minimum over rounds of each run's own minimum over --reps. Prints a markdown table:
ms of each and the ratios (lower is better for unmask / torch).

  forward: --seq 1,32,256,1024 --batch 1,8          (logits for every row, as `unmask bench`)
  decode:  --decode --gen 128 --block 32 --batch 1,8 [--max-blocks N] [--cache dual|none]
           (low_confidence; both sides use the same cache mode)
  baseline: --base BIN (another build, its default kernels) and/or --base-kernels K (the baseline
           runs with --cpu-kernels K; without --base, the same --unmask binary: e.g. today's fp32
           path against auto)
  --isa avx2: every run as on an AVX2-only CPU: UNMASK_CPU_ISA=avx2 for unmask, OPENBLAS_CORETYPE=Haswell
           for OpenBLAS, ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2 for PyTorch — an
           emulation on this CPU (its caches, clock and memory stay this CPU's)
usage: compare_torch.py --unmask BIN [--base BIN] [--base-kernels K] --model DIR [--threads N] [--rounds 3]
       [--reps 2] [--kernels auto] [--torch-dtype both] [--isa avx2] [--quant bf16,q8_0,q4_0]

--quant LIST runs unmask once per weight type of the list (`--quant`, one column each, interleaved
with the rest) and prints each one's speed-up over PyTorch (PyTorch ms / unmask ms). The int8
kernel family follows UNMASK_CPU_QKERNELS; PyTorch's vector ISA ATEN_CPU_CAPABILITY (both are
inherited from the environment; --isa avx2 sets them).
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


ENV = dict(os.environ)   # every run's environment (--isa adds the caps)


def unmask_forward(binary, model, L, B, threads, reps, kernels, quant=""):
    cmd = [binary, "bench", "--model", model, "--seq", str(L), "--batch", str(B), "--threads", str(threads),
           "--reps", str(reps), "--warmup", "1"]
    if kernels:
        cmd += ["--cpu-kernels", kernels]
    if quant:
        cmd += ["--quant", quant]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=ENV).stdout
    row = [ln for ln in out.splitlines() if re.match(rf"\s+{L}\s+{B}\s", ln)][-1].split()
    return float(row[4])   # min ms


def unmask_decode(binary, model, B, a, kernels, quant=""):
    cmd = [binary, "bench", "--decode", "--model", model, "--batch", str(B), "--gen", str(a.gen), "--block",
           str(a.block), "--prompt", str(a.prompt), "--decoders", "low_confidence", "--cache", a.cache,
           "--threads", str(a.threads), "--reps", str(a.reps)]
    if a.max_blocks:
        cmd += ["--max-blocks", str(a.max_blocks)]
    if kernels:
        cmd += ["--cpu-kernels", kernels]
    if quant:
        cmd += ["--quant", quant]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=ENV).stdout
    row = [ln for ln in out.splitlines() if ln.startswith("low_confidence")][-1].split()
    return float(row[9])   # ms/step


def peer(model, a, extra):
    cmd = [sys.executable, os.path.join(HERE, "torch_peer.py"), "--model", model, "--threads", str(a.threads),
           "--reps", str(a.reps), "--dtype", a.torch_dtype, "--json"] + extra
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=ENV).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return r["best_ms"], r["best"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--unmask", required=True)
    ap.add_argument("--base")
    ap.add_argument("--base-kernels", default="")
    ap.add_argument("--isa", default="", choices=["", "avx2"])
    ap.add_argument("--cache", default="dual", choices=["dual", "none"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seq", default="1,32,256,1024")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--kernels", default="")
    ap.add_argument("--torch-dtype", default="both", choices=["fp32", "bf16", "both"])
    ap.add_argument("--decode", action="store_true")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--max-blocks", type=int, default=0)
    ap.add_argument("--quant", default="", help="comma-separated weight types, one unmask column each")
    a = ap.parse_args()
    if a.isa == "avx2":
        ENV.update(UNMASK_CPU_ISA="avx2", OPENBLAS_CORETYPE="Haswell", ATEN_CPU_CAPABILITY="avx2",
                   ONEDNN_MAX_CPU_ISA="AVX2", DNNL_MAX_CPU_ISA="AVX2", UNMASK_CPU_QKERNELS="avx2")
    if a.quant:
        return main_quant(a)
    if a.base_kernels and not a.base:
        a.base = a.unmask
    batches = [int(b) for b in a.batch.split(",")]
    shapes = [(B, None) for B in batches] if a.decode else \
        [(B, int(L)) for B in batches for L in a.seq.split(",")]
    best = {}
    for rnd in range(a.rounds):
        for B, L in shapes:
            r = best.setdefault((B, L), {"unmask": 1e30, "base": 1e30, "torch": 1e30, "dtype": "?"})
            if a.decode:
                r["unmask"] = min(r["unmask"], unmask_decode(a.unmask, a.model, B, a, a.kernels))
                if a.base:
                    r["base"] = min(r["base"], unmask_decode(a.base, a.model, B, a, a.base_kernels))
                t, dt = peer(a.model, a, ["--decode", "--batch", str(B), "--gen", str(a.gen), "--block", str(a.block),
                                          "--prompt", str(a.prompt), "--max-blocks", str(a.max_blocks),
                                          "--cache", a.cache])
            else:
                r["unmask"] = min(r["unmask"], unmask_forward(a.unmask, a.model, L, B, a.threads, a.reps, a.kernels))
                if a.base:
                    r["base"] = min(r["base"], unmask_forward(a.base, a.model, L, B, a.threads, a.reps, a.base_kernels))
                t, dt = peer(a.model, a, ["--seq", str(L), "--batch", str(B)])
            if t < r["torch"]:
                r["torch"], r["dtype"] = t, dt
            print(f"round {rnd + 1}: batch {B} {'decode' if a.decode else f'seq {L}'}: {r}", file=sys.stderr,
                  flush=True)
    unit = "ms/step" if a.decode else "ms"
    head = "| batch | " + ("" if a.decode else "seq | ") + f"unmask {unit} | "
    head += f"baseline {unit} | " if a.base else ""
    head += f"PyTorch {unit} (dtype) | unmask / PyTorch |" + (" baseline / PyTorch | speed-up |" if a.base else "")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for (B, L), r in best.items():
        row = f"| {B} | " + ("" if a.decode else f"{L} | ") + f"{r['unmask']:.1f} | "
        row += f"{r['base']:.1f} | " if a.base else ""
        row += f"{r['torch']:.1f} ({r['dtype']}) | {r['unmask'] / max(r['torch'], 1e-3):.2f} |"
        if a.base:
            row += f" {r['base'] / max(r['torch'], 1e-3):.2f} | {r['base'] / max(r['unmask'], 1e-3):.1f}x |"
        print(row)


def main_quant(a):
    """One unmask column per --quant type, interleaved with PyTorch in every round."""
    quants = a.quant.split(",")
    batches = [int(b) for b in a.batch.split(",")]
    shapes = [(B, None) for B in batches] if a.decode else [(B, int(L)) for B in batches for L in a.seq.split(",")]
    best = {}
    for rnd in range(a.rounds):
        for B, L in shapes:
            r = best.setdefault((B, L), dict({q: 1e30 for q in quants}, torch=1e30, dtype="?"))
            for q in quants:
                t = unmask_decode(a.unmask, a.model, B, a, a.kernels, q) if a.decode else \
                    unmask_forward(a.unmask, a.model, L, B, a.threads, a.reps, a.kernels, q)
                r[q] = min(r[q], t)
            extra = ["--decode", "--batch", str(B), "--gen", str(a.gen), "--block", str(a.block), "--prompt",
                     str(a.prompt), "--max-blocks", str(a.max_blocks)] if a.decode else ["--seq", str(L), "--batch",
                                                                                            str(B)]
            t, dt = peer(a.model, a, extra)
            if t < r["torch"]:
                r["torch"], r["dtype"] = t, dt
            print(f"round {rnd + 1}: batch {B} {'decode' if a.decode else f'seq {L}'}: {r}", file=sys.stderr,
                  flush=True)
    unit = "ms/step" if a.decode else "ms"
    head = "| batch | " + ("" if a.decode else "seq | ") + "".join(f"unmask {q} {unit} | " for q in quants)
    head += f"PyTorch {unit} (dtype) | " + "".join(f"{q}: PyTorch / unmask | " for q in quants)
    print(head.rstrip())
    print("|" + "---|" * (head.count("|") - 1))
    for (B, L), r in best.items():
        row = f"| {B} | " + ("" if a.decode else f"{L} | ") + "".join(f"{r[q]:.1f} | " for q in quants)
        row += f"{r['torch']:.1f} ({r['dtype']}) | " + "".join(f"{r['torch'] / max(r[q], 1e-3):.2f}x | " for q in quants)
        print(row.rstrip())


if __name__ == "__main__":
    main()
