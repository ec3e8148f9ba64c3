#!/usr/bin/python3
"""test_torch_peer.py — the PyTorch peers of the benchmarks (tools/bench/torch_peer.py) compute what
unmask computes: on make-model checkpoints (tiny: separate LM head, full attention; and tiny with 2
key/value heads and the embedding as LM head), `torch_peer.py --check` passes for the eager and the
strong peer (logits within 1e-4 of `unmask logits --cpu-kernels fp32`, and both peers' decodes —
no cache and dual cache, low_confidence and threshold — commit the same tokens); the decode benchmark
runs both peers end to end on the CPU (both cache modes in one process, a row per mode and batch,
timings, the same tokens); bad arguments exit 2 with a message.
Runs on the CPU with Debian's python3-torch (the strong peer uncompiled where torch has no
torch.compile; the rows say which).
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_run import BIN, Reporter, make_preset, tmp_dir  # noqa: E402

SRC = os.environ.get("UNMASK_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PEER = [sys.executable, os.path.join(SRC, "tools", "bench", "torch_peer.py"), "--threads", "2"]


def run(args):
    return subprocess.run(PEER + args, capture_output=True, text=True, timeout=600)


def main():
    rep = Reporter()

    def ok(cond, name, detail):   # the detail only when it failed
        rep(cond, name, "" if cond else detail)
    tmp = tmp_dir("torch_peer")
    models = {"tiny": make_preset(tmp, "peer_tiny", "tiny"),
              "tiny gqa tied": make_preset(tmp, "peer_gqa", "tiny", ["--n-kv-heads", "2", "--weight-tying"])}

    for name, model in models.items():
        p = run(["--model", model, "--check", BIN, "--prompt", "16", "--gen", "32", "--block", "16"])
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("check ")]
        ok(p.returncode == 0, f"{name}: --check exits 0", f"rc {p.returncode}: {p.stdout[-600:]} {p.stderr[-600:]}")
        for peer in ("eager", "strong"):
            ln = [x for x in lines if x.startswith(f"check {peer}:")]
            ok(len(ln) == 1 and ln[0].endswith(": ok"), f"{name}: {peer} logits == unmask's", ln[0] if ln else p.stdout)
        dec = [x for x in lines if x.startswith("check decode")]
        ok(len(dec) == 4 and all(x.endswith(": ok") for x in dec),
           f"{name}: eager and strong decodes commit the same tokens (none/dual x low_confidence/threshold)",
           "; ".join(dec) or p.stdout)
        # the threshold case commits several positions in some step (fewer forwards than positions)
        thr = [x for x in dec if " threshold " in x]
        ok(bool(thr) and all("eager 32 " not in x for x in thr), f"{name}: the threshold decode commits "
           "several positions per step", "; ".join(thr))

    p = run(["--model", models["tiny"], "--decode", "--peer", "both", "--cache", "dual,none", "--decoder",
             "threshold,low_confidence", "--max-blocks", "2,1", "--batch", "1,2", "--prompt", "16", "--gen", "32",
             "--block", "16", "--reps", "1", "--dtype", "fp32", "--json"])
    rows = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    ok(p.returncode == 0 and len(rows) == 4, "decode bench: a row per cache mode and batch",
       f"rc {p.returncode}, {len(rows)} rows: {p.stderr[-600:]}")
    for r in rows:
        what = f"decode bench cache {r.get('cache')} batch {r.get('batch')}"
        steps = 32 if r.get("cache") == "dual" else 16
        ok(r.get("eager_fp32_ms_per_step", 0) > 0 and r.get("strong_fp32_ms_per_step", 0) > 0
           and r.get("eager_steps") == steps and r.get("strong_steps") == steps,
           f"{what}: both peers timed over the same forwards", json.dumps(r))
        ok(r.get("same_tokens") is True and r.get("strong_masks_left") == 0,
           f"{what}: both peers commit the same tokens, every position", json.dumps(r))
        ok("strong_compiled" in r and "strong_compile_s" in r, f"{what}: says whether / how long it compiled",
           json.dumps(r))

    # --profile: one more strong decode under torch.profiler, its ops' time per step on stderr
    q = run(["--model", models["tiny"], "--decode", "--peer", "strong", "--cache", "dual", "--decoder", "threshold",
             "--max-blocks", "1", "--batch", "1", "--prompt", "16", "--gen", "32", "--block", "16", "--reps", "1",
             "--dtype", "fp32", "--profile"])
    prof = [x for x in q.stderr.splitlines() if "profile, strong peer, cache dual, batch 1" in x]
    ops = [x for x in q.stderr.splitlines() if " ms/step " in x and "calls/step" in x]
    ok(q.returncode == 0 and len(prof) == 1 and " 16 steps, " in prof[0] and len(ops) >= 5,
       "--profile: the strong peer's ops per step (16 steps, five or more ops)", q.stderr[-800:])

    # the lease's table: unmask's `bench --decode` rows beside both peers' rows, one line per shape
    logs = []
    for cache, dec, mb in (("dual", "threshold", "2"), ("none", "low_confidence", "1")):
        u = subprocess.run([BIN, "bench", "--decode", "--model", models["tiny"], "--batch", "1,2", "--prompt", "16",
                            "--gen", "32", "--block", "16", "--max-blocks", mb, "--decoders", dec, "--threshold", "0.9",
                            "--cache", cache, "--threads", "2"], capture_output=True, text=True, timeout=300)
        logs.append(os.path.join(tmp, f"unmask_{cache}.log"))
        with open(logs[-1], "w") as f:
            f.write(u.stdout)
    with open(os.path.join(tmp, "peers.jsonl"), "w") as f:
        f.write(p.stdout)
    t = subprocess.run([sys.executable, os.path.join(SRC, "tools", "bench", "peer_table.py")] + logs +
                       [os.path.join(tmp, "peers.jsonl")], capture_output=True, text=True, timeout=60)
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in t.stdout.splitlines()
             if ln.startswith("| dual cache") or ln.startswith("| no cache")]
    ok(t.returncode == 0 and len(cells) == 4, "peer table: a line per cache mode and batch", t.stdout + t.stderr)
    for c in cells:
        try:
            u_ms, s_ms, e_ms = float(c[3]), float(c[4]), float(c[5])
            # unmask prints ms/step to 0.1 ms: the ratio is checked where that is precise enough
            good = u_ms >= 0 and s_ms > 0 and e_ms > 0 and c[9] == "yes" and \
                (u_ms < 1 or abs(float(c[6].rstrip("×")) - s_ms / u_ms) <= 0.01 * s_ms / u_ms + 0.01)
        except (ValueError, IndexError):
            good = False
        ok(good, f"peer table {c[0]} batch {c[2] if len(c) > 2 else '?'}: unmask, compiled and eager ms/step, "
           "compiled / unmask, same tokens", " | ".join(c))

    for bad, what in ((["--cache", "fast"], "--cache"), (["--decoder", "greedy"], "--decoder"),
                      (["--cache", "dual,none", "--max-blocks", "1,2,3"], "--max-blocks"),
                      (["--check", BIN, "--device", "cuda"], "--check")):
        p = run(["--model", models["tiny"]] + bad)
        ok(p.returncode == 2 and what in p.stderr, f"bad {' '.join(bad)}: exit 2 naming {what}",
           f"rc {p.returncode}: {p.stderr[-300:]}")
    return rep.finish()


if __name__ == "__main__":
    sys.exit(main())
