"""test_moe_tp.py — expert + tensor parallelism of the MoE families (docs/parallel.md "Mixture of
experts") against one rank and against the NumPy reference (moe_ref.py).

Every rank holds a range of each MoE layer's experts (uneven ranges too: 6 experts over 4 ranks),
a 1/W slice of the shared expert's width and of the attention heads (LLaDA2's fused query_key_value
split per head), routes every token itself and adds its partial sum into one all-reduce per layer;
the ranks are CPU threads over the local comm (`--tp N`), which is what CI can run.
Checks: `unmask logits --tp N` == `--tp 1` (max rel diff <= 1e-5: only the all-reduce's summation
order differs) and == the NumPy reference (<= 1e-4), with the argmax of every row identical —
LLaDA-MoE with an expert bias at tp 2 and 4, LLaDA2 at tp 2 and (4 KV heads) 4, block-causal at the
model's block and a per-request `--block-length` (broadcast to the followers); `unmask generate
--tp N` commits exactly the tokens of `--tp 1` in every step — LLaDA2 with the exact block KV cache
and a chunked prefill (cache slots mirrored on every rank, cache-only forwards), threshold,
hierarchy_block and joint_threshold decoders, and LLaDA-MoE. Greedy identity is sound here: the
logits differ by ~1e-7 relative and the test models' choices are separated by far more (the same
argument as tests/parallel/tp_serve.test.mjs, whose check the logits comparison above repeats).
Prints one line per check and "N passed, N failed".
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_run import Reporter, generate, logits, make_preset, rel_err, step_commits, tmp_dir  # noqa: E402
from moe_ref import MoERef  # noqa: E402

TMP = tmp_dir("test_moe_tp")
report = Reporter()


lm = make_preset(TMP, "lladamoe", "lladamoe-tiny", ["--experts", "6", "--expert-bias", "1", "--seed", "7"])
l2 = make_preset(TMP, "llada2", "llada2-tiny")
l2kv = make_preset(TMP, "llada2_kv4", "llada2-tiny", ["--n-kv-heads", "4", "--seed", "9"])
toks = [int(t) for t in np.random.default_rng(5).integers(0, 1300, size=41)]

# ---------------------------------------------------------------- logits
for name, mdir, tps, blocks in (("lladamoe (6 experts, bias)", lm, (2, 4), ((0, None),)),
                                ("llada2", l2, (2,), ((32, None), (8, 8))),
                                ("llada2 (4 kv heads)", l2kv, (2, 4), ((32, None), (5, 5)))):
    ref = MoERef(mdir)
    for ref_blk, flag in blocks:   # the reference's block size; the --block-length flag (None: the model's)
        extra = [] if flag is None else ["--block-length", str(flag)]
        one = logits(TMP, mdir, toks, ["--tp", 1] + list(extra))
        want = ref.forward(np.array(toks), block=ref_blk)
        for tp in tps:
            got = logits(TMP, mdir, toks, ["--tp", tp] + list(extra))
            e1, er = rel_err(got, one), rel_err(got, want)
            same = bool(np.all(got.argmax(axis=1) == one.argmax(axis=1)))
            label = f"{name} --tp {tp}" + (f" --block-length {flag}" if flag else "")
            report(e1 <= 1e-5 and er <= 1e-4 and same, f"logits {label} == --tp 1 == reference",
                   f"max rel diff vs tp 1 {e1:.1e}, vs NumPy {er:.1e}, argmax {'same' if same else 'DIFFERS'}")

# ---------------------------------------------------------------- generation
runs = [
    ("llada2 low_confidence, exact block KV, chunked prefill", l2, (2,),
     ["--gen-length", 24, "--block-length", 8, "--steps-per-block", 4, "--cache", "dual", "--prefill-chunk", 8]),
    ("llada2 threshold, no cache", l2, (2,),
     ["--gen-length", 24, "--block-length", 8, "--steps-per-block", 4, "--decoder", "threshold", "--threshold", 0.012]),
    ("llada2 hierarchy_block, exact block KV", l2kv, (2, 4),
     ["--gen-length", 24, "--block-length", 8, "--decoder", "hierarchy_block", "--sub-block-length", 4,
      "--threshold", 0.012, "--cache", "dual"]),
    ("llada2 joint_threshold", l2, (2,),
     ["--gen-length", 16, "--block-length", 8, "--decoder", "joint_threshold", "--threshold", 0.011,
      "--max-post-steps", 3]),
    ("lladamoe low_confidence, dual cache", lm, (2, 4),
     ["--gen-length", 16, "--block-length", 8, "--steps", 8, "--cache", "dual"]),
]
for name, mdir, tps, flags in runs:
    one = step_commits(generate(mdir, toks, flags + ["--tp", 1]))
    for tp in tps:
        got = step_commits(generate(mdir, toks, flags + ["--tp", tp]))
        detail = f"{len(got)} steps, {sum(map(len, got))} commits"
        for i, (a, b) in enumerate(zip(got, one)):
            if a != b:
                detail += f"; first difference at step {i}: tp {tp} {a}, tp 1 {b}"
                break
        report(got == one and len(one) > 0, f"generate {name} --tp {tp} == --tp 1", detail)

sys.exit(report.finish())
