"""test_dream.py — Dream-layout checkpoints (`make-model --preset dream-tiny`) against dream_ref.py.

Forward: `unmask logits` (raw rows, before the decode layer's shift) vs the NumPy Qwen2 forward,
max|ours - ref| / max|ref| <= 1e-4 on f32 weights: the preset (GQA 2:1, untied head), a tied head over
3 shards with an index, MHA, and 2 tensor-parallel ranks. The q/k/v biases must matter (the reference without them is far off).
Decoders: `unmask generate --decoder origin|maskgit_plus|topk_margin|entropy --json` step by step
(every step's commits, empty ones included) vs dream_generate for several steps / gen_length
combinations at temperature 0 and alg_temp 0, with alg_temp > 0, temperature > 0 (seeded), top-k, and
blockwise. Prints one line per check and "N passed, N failed".
"""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_run import BIN, Reporter, generate, logits, make_preset, rel_err, step_commits, tmp_dir  # noqa: E402
from dream_ref import DreamRef, dream_generate, torch_linspace_f32  # noqa: E402

TMP = tmp_dir("test_dream")
report = Reporter()


# ---------------------------------------------------------------- forward

def check_forward(name, model_dir, T, seed):
    ref = DreamRef(model_dir)
    V = ref.cfg["vocab_size"]
    tokens = np.random.default_rng(seed).integers(0, V, size=T)
    want = ref.forward(tokens)
    ours = logits(TMP, model_dir, tokens)
    if ours.shape != want.shape:
        report(False, f"forward {name}", f"shape {ours.shape}, expected {want.shape}")
        return None
    err = rel_err(ours, want)
    report(err <= 1e-4, f"forward {name}", f"max rel err {err:.2e} (T={T})")
    return tokens, ours, ref


preset = make_preset(TMP, "tiny", "dream-tiny", [])
res = check_forward("dream-tiny (GQA 2:1, untied)", preset, 37, 1)
if res:
    tokens, ours, ref = res
    nob = DreamRef(preset, zero_bias=True).forward(tokens)
    err = rel_err(ours, nob)
    report(err > 1e-2, "forward q/k/v biases matter", f"rel diff without biases {err:.2e}")
    # tensor parallel: each rank holds its heads' slice of the q/k/v biases
    out = os.path.join(TMP, "tp2.npy")
    r = subprocess.run([BIN, "logits", "--model", preset, "--tokens", ",".join(map(str, tokens)), "--out", out,
                        "--tp", "2", "--threads", "1", "--cpu-kernels", "fp32"], capture_output=True, text=True)
    if r.returncode != 0:
        report(False, "forward --tp 2", r.stderr.strip())
    else:
        err = rel_err(np.load(out).astype(np.float64), ref.forward(tokens))
        report(err <= 1e-4, "forward --tp 2 (bias slices)", f"max rel err {err:.2e}")
tied = make_preset(TMP, "tied", "dream-tiny", ["--weight-tying", "--shards", "3", "--n-heads", "8", "--n-kv-heads", "8", "--seed", "7"])
report(os.path.exists(os.path.join(tied, "model.safetensors.index.json")), "tied checkpoint is sharded with an index")
check_forward("tied head, 3 shards, MHA", tied, 20, 2)

# ---------------------------------------------------------------- the schedule

ts = torch_linspace_f32(1.0, 1e-3, 9)
report(ts[0] == np.float32(1.0) and ts[-1] == np.float32(1e-3) and np.all(np.diff(ts) < 0),
       "linspace(1, eps, steps+1) endpoints", f"{ts.tolist()}")

# ---------------------------------------------------------------- decoders

ref = DreamRef(preset)
V = ref.cfg["vocab_size"]
MASK = ref.cfg["mask_token_id"]
prompt = [int(t) for t in np.random.default_rng(5).integers(0, 1300, size=6)]


def check_decode(name, gen_length, steps, alg, flags=(), **kw):
    ev = generate(preset, prompt, ["--decoder", alg, "--gen-length", gen_length, "--steps", steps] + list(flags))
    ours = step_commits(ev)
    want, _ = dream_generate(ref.forward, prompt, gen_length, steps, alg, MASK, V, **kw)
    n_empty = sum(1 for c in want if not c)
    ok = ours == want
    detail = f"{len(want)} steps, {n_empty} without commits"
    if not ok:
        for i, (a, b) in enumerate(zip(ours, want)):
            if a != b:
                detail += f"; first difference at step {i}: ours {a}, reference {b}"
                break
        else:
            detail += f"; {len(ours)} steps, reference {len(want)}"
    report(ok, f"decode {name}", detail)
    return ev


for alg in ("maskgit_plus", "topk_margin", "entropy"):
    for G, S in ((16, 16), (16, 5), (12, 12), (24, 7)):
        check_decode(f"{alg} G={G} S={S}", G, S, alg)
for G, S in ((16, 16), (16, 6)):
    check_decode(f"origin G={G} S={S} seed 3", G, S, "origin", ["--seed", 3], seed=3)
check_decode("entropy alg_temp 0.5 seed 4", 16, 8, "entropy", ["--alg-temp", 0.5, "--seed", 4], alg_temp=0.5, seed=4)
check_decode("maskgit_plus temperature 0.7 seed 9", 12, 6, "maskgit_plus", ["--temperature", 0.7, "--seed", 9],
             temperature=0.7, seed=9)
check_decode("topk_margin top-k 5", 16, 8, "topk_margin", ["--top-k", 5], top_k=5)
check_decode("entropy eps 0.1", 16, 8, "entropy", ["--eps", 0.1], eps=0.1)
check_decode("maskgit_plus blockwise B=8", 24, 12, "maskgit_plus", ["--block-length", 8, "--no-stop-at-eos"],
             block_length=8)

# the shift is real: reading each position's own row instead gives a different generation
noshift = dream_generate(lambda x: np.concatenate([ref.forward(x)[1:], ref.forward(x)[-1:]], axis=0), prompt, 16,
                         16, "entropy", MASK, V)[0]
ev = generate(preset, prompt, ["--decoder", "entropy", "--gen-length", 16, "--steps", 16])
report(step_commits(ev) != noshift, "decode reads shifted rows", "an unshifted reading would differ")

# origin is random even at temperature 0: different seeds, different schedules
a = step_commits(generate(preset, prompt, ["--decoder", "origin", "--gen-length", 16, "--steps", 8, "--seed", 1]))
b = step_commits(generate(preset, prompt, ["--decoder", "origin", "--gen-length", 16, "--steps", 8, "--seed", 2]))
report(a != b, "origin depends on the seed")

sys.exit(report.finish())
