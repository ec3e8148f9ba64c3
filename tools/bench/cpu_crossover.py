#!/usr/bin/python3
"""cpu_crossover.py — where one CPU kernel path overtakes another: runs `cpu_kernels_bench --only gemm`
for two paths (default fp32 and avx2), interleaved round by round (A B A B ...), keeps each (path,
product, M)'s minimum, and prints per product the ms of both, their ratio and the row count from
which the second path is never faster than the first again (the crossover cpu_dispatch.c uses,
docs/cpu-kernels.md "Dispatch by shape"). Not a test.

  --isa avx2    runs the bench as on an AVX2-only CPU: UNMASK_CPU_ISA=avx2 and OPENBLAS_CORETYPE=Haswell
                (an emulation on whatever CPU this is: its caches, clock and memory stay this CPU's)
usage: cpu_crossover.py --bench BIN [--paths fp32,avx2] [--threads 2] [--rounds 3] [--cold 1]
       [--ms 1,16,32,...] [--d 768 --ffn 2048 --vocab 8192] [--isa avx2]
"""
import argparse
import os
import re
import subprocess
import sys

ROW = re.compile(r"^\s+(\S.*?\S)\s+(\d+)\s+([\d.]+)\s+([\d.]+)")


def run(a, path, env):
    cmd = [a.bench, "--only", "gemm", "--path", path, "--threads", str(a.threads), "--reps", str(a.reps),
           "--cold", str(a.cold), "--ms", a.ms, "--d", str(a.d), "--ffn", str(a.ffn), "--vocab", str(a.vocab)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    rows, head = {}, ""
    for ln in out.splitlines():
        if ln.startswith("path "):
            head = ln
        m = ROW.match(ln)
        if m:
            rows[(m.group(1), int(m.group(2)))] = float(m.group(3))
    if not rows:
        sys.exit(f"{path}: no rows ({head or out.strip()[:200]})")
    return rows, head


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--paths", default="fp32,avx2")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cold", type=int, default=1)
    ap.add_argument("--ms", default="1,8,16,32,48,64,96,128,192,256,384,512,1024")
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--isa", default="")
    a = ap.parse_args()
    env = dict(os.environ)
    if a.isa:
        env["UNMASK_CPU_ISA"] = a.isa
        if a.isa == "avx2":
            env["OPENBLAS_CORETYPE"] = "Haswell"
    pa, pb = a.paths.split(",")
    best = {pa: {}, pb: {}}
    heads = {}
    for rnd in range(a.rounds):
        for p in (pa, pb):
            rows, heads[p] = run(a, p, env)
            for k, v in rows.items():
                best[p][k] = min(best[p].get(k, 1e30), v)
        print(f"round {rnd + 1} done", file=sys.stderr, flush=True)
    print(f"# {heads[pa]}\n# {heads[pb]}\n# {a.rounds} interleaved rounds, min ms; {a.threads} threads, cold {a.cold}")
    ops = []
    for op, _ in best[pa]:
        if op not in ops:
            ops.append(op)
    for op in ops:
        ms = sorted(m for o, m in best[pa] if o == op and (o, m) in best[pb])
        # crossover: the smallest M from which pb is slower than pa at every larger measured M
        cross = None
        for m in reversed(ms):
            if best[pb][(op, m)] > best[pa][(op, m)]:
                cross = m
            else:
                break
        print(f"\n{op}: {pb} slower than {pa} from M = {cross if cross else 'never (measured)'}")
        print(f"| M | {pa} ms | {pb} ms | {pa} / {pb} |")
        print("|---:|---:|---:|---:|")
        for m in ms:
            x, y = best[pa][(op, m)], best[pb][(op, m)]
            print(f"| {m} | {x:.3f} | {y:.3f} | {x / y:.2f} |")


if __name__ == "__main__":
    main()
