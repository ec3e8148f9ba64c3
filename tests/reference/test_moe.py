"""test_moe.py — the MoE families (`make-model --preset lladamoe-tiny | llada2-tiny`) against moe_ref.py.

Forward: `unmask logits` vs the NumPy forward, max|ours - ref| / max|ref| <= 1e-4 on f32 weights:
LLaDA-MoE without and with an expert bias, over 3 shards with an index; LLaDA2 with its default
block-causal attention (block 32), `--block-length 8` and `--block-length 0` (bidirectional). Each rule
must matter — the reference with that rule broken is far off: LLaDA-MoE's biased weights, LLaDA2's
group limit, expert bias, QK-norm, partial rotary, block-causal mask — and routing must differ per
token. Generation: `unmask generate` on llada2-tiny vs llada2_generate (the official LLaDA2 generate):
commits step by step and the output tokens, for low_confidence and threshold decoders, several
steps-per-block / block sizes / prompt lengths (prompt tails inside the first block, the last block
running past gen_length), and an EOS stop; the exact block KV cache with its chunked prompt prefill
(several chunk sizes, refills) gives the same commits. Prints one line per check and "N passed, N failed".
"""
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_run import BIN, Reporter, generate, logits, make_preset, rel_err, step_commits, tmp_dir  # noqa: E402
from moe_ref import MoERef, hierarchy_block_generate, llada2_generate, llada2_generate_joint  # noqa: E402

TMP = tmp_dir("test_moe")
report = Reporter()


def tokens_for(model_dir, T, seed):
    with open(os.path.join(model_dir, "config.json")) as f:
        V = json.load(f)["vocab_size"]
    return np.random.default_rng(seed).integers(0, min(V, 1300), size=T)


def distinct_routes(ref):
    """Distinct expert sets per MoE layer of the reference's last forward (the fewest over layers)."""
    return min(len({tuple(sorted(r)) for r in layer}) for layer in ref.route_log)


# ---------------------------------------------------------------- LLaDA-MoE forward

lm = make_preset(TMP, "lladamoe", "lladamoe-tiny")
toks = tokens_for(lm, 40, 1)
ref = MoERef(lm)
want = ref.forward(toks)
ours = logits(TMP, lm, toks)
report(rel_err(ours, want) <= 1e-4, "lladamoe-tiny forward", f"max rel err {rel_err(ours, want):.2e} (T=40)")
report(distinct_routes(ref) >= 5, "lladamoe routing differs per token", f"{distinct_routes(ref)} distinct expert sets")
e = rel_err(ours, MoERef(lm, qk_norm=False).forward(toks))
report(e > 1e-2, "lladamoe QK-norm matters", f"rel diff without it {e:.2e}")

lmb = make_preset(TMP, "lladamoe_bias", "lladamoe-tiny", ["--expert-bias", "1", "--shards", "3", "--seed", "5"])
report(os.path.exists(os.path.join(lmb, "model.safetensors.index.json")), "lladamoe sharded with an index")
toks = tokens_for(lmb, 33, 2)
ref = MoERef(lmb)
want = ref.forward(toks)
ours = logits(TMP, lmb, toks)
report(rel_err(ours, want) <= 1e-4, "lladamoe expert bias forward", f"max rel err {rel_err(ours, want):.2e}")
e = rel_err(ours, MoERef(lmb, bias_in_weights=False).forward(toks))
report(e > 1e-3, "lladamoe biased values are the weights", f"rel diff with unbiased weights {e:.2e}")
e = rel_err(ours, MoERef(lmb, no_bias=True).forward(toks))
report(e > 1e-3, "lladamoe expert bias matters", f"rel diff without bias {e:.2e}")

# ---------------------------------------------------------------- LLaDA2 forward

l2 = make_preset(TMP, "llada2", "llada2-tiny")
toks = tokens_for(l2, 45, 3)
ref = MoERef(l2)
for blk, flag in ((32, []), (8, ["--block-length", "8"]), (0, ["--block-length", "0"]), (5, ["--block-length", "5"])):
    want = ref.forward(toks, block=blk)
    ours = logits(TMP, l2, toks, flag)
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

# ---------------------------------------------------------------- LLaDA2 generation (official generate)

with open(os.path.join(l2, "config.json")) as f:
    c2 = json.load(f)
with open(os.path.join(l2, "tokenizer.json")) as f:
    added = {t["content"]: t["id"] for t in json.load(f)["added_tokens"]}
MASK, EOS = added["<|mask|>"], added["<|endoftext|>"]
ref = MoERef(l2)


def run_gen(model_dir, prompt, G, B, spb, decoder, tau=None, extra=()):
    flags = ["--gen-length", G, "--block-length", B, "--steps-per-block", spb, "--decoder", decoder]
    if tau is not None:
        flags += ["--threshold", tau]
    return generate(model_dir, prompt, flags + list(extra))


def gen_tokens(events, P):
    """Generated-region tokens from the step events (commits past gen_length are never reported)."""
    out = {}
    for e in events:
        if e["type"] == "step":
            for c in e["commits"]:
                out[c["pos"] - P] = c["id"]
    return [out[i] for i in sorted(out)]


def check_gen(name, model_dir, r, prompt, G, B, spb, decoder, tau, eos=EOS, extra=()):
    ev = run_gen(model_dir, prompt, G, B, spb, decoder, tau, extra)
    want_out, want_log = llada2_generate(r, np.array(prompt), G, B, spb, 2.0 if tau is None else tau, MASK, eos)
    got_log = step_commits(ev)
    P = len(prompt)
    # the reference's commits past gen_length are decoded but never reported
    want_rep = [[(p_, t) for p_, t in st if p_ < P + G] for st in want_log]
    done = [e for e in ev if e["type"] == "done"][0]
    got_out = gen_tokens(ev, P)
    if eos in got_out:
        got_out = got_out[:got_out.index(eos) + 1]
    ok = got_log == want_rep and got_out == want_out
    detail = f"{len(got_log)} steps, {len(got_out)} tokens, finish {done['finish_reason']}"
    if not ok:
        for i, (a, b) in enumerate(zip(got_log, want_rep)):
            if a != b:
                detail += f"; first difference at step {i}: ours {a}, reference {b}"
                break
        else:
            detail += f"; steps ours {len(got_log)} vs reference {len(want_rep)}, out {got_out} vs {want_out}"
    report(ok, name, detail)
    return ev, want_out


V = c2["vocab_size"]
rng = np.random.default_rng(11)
prompts = {n: [int(t) for t in rng.integers(0, 1300, size=n)] for n in (5, 12, 16, 21)}
cases = [  # (prompt length, gen_length, B, steps per block, decoder, tau)
    (5, 20, 8, 4, "low_confidence", None),     # prompt tail in block 0, last block past gen_length
    (12, 20, 8, 3, "low_confidence", None),    # B % steps != 0: uneven quotas
    (16, 17, 8, 8, "low_confidence", None),    # prompt ends on a block boundary
    (21, 13, 4, 2, "low_confidence", None),
    (5, 20, 8, 4, "threshold", 0.012),         # some steps commit every c > tau, others the quota
    (12, 24, 8, 8, "threshold", 0.011),
    (21, 19, 16, 5, "threshold", 0.0125),
    (5, 9, 8, 20, "low_confidence", None),     # steps capped at gen_length
]
first = None
for P, G, B, spb, dec, tau in cases:
    ev, out = check_gen(f"llada2 generate P={P} G={G} B={B} steps/block={spb} {dec}" + (f" tau={tau}" if tau else ""),
                        l2, ref, prompts[P], G, B, spb, dec, tau)
    if first is None:
        first = out

# the threshold rule: strictly above tau, and quota from the block length (a partial first block)
ev = run_gen(l2, prompts[5], 20, 8, 4, "low_confidence")
first_block = [e for e in ev if e["type"] == "step" and e["block"] == 0]
report(len(first_block) == 2 and len(first_block[0]["commits"]) == 2,
       "quota comes from the block length (3 masks, B 8, 4 steps: 2 then 1)",
       f"{[len(e['commits']) for e in first_block]}")

# EOS: a copy whose eos_token_id is a token the greedy run produces in its second block
eos_dir = os.path.join(TMP, "llada2_eos")
subprocess.run(["rm", "-rf", eos_dir], check=True)
subprocess.run(["cp", "-r", l2, eos_dir], check=True)
eos_tok = int(first[9])
c2e = dict(c2, eos_token_id=eos_tok)
with open(os.path.join(eos_dir, "config.json"), "w") as f:
    json.dump(c2e, f)
ev, out = check_gen("llada2 generate stops after the block holding EOS", eos_dir, MoERef(eos_dir), prompts[5], 20, 8, 4,
                    "low_confidence", None, eos=eos_tok)
done = [e for e in ev if e["type"] == "done"][0]
blocks = [e for e in ev if e["type"] == "block"]
report(done["finish_reason"] == "stop" and len(blocks) < 3 and out[-1] == eos_tok,
       "EOS: finish stop, later blocks skipped, output cut after EOS",
       f"finish {done['finish_reason']}, {len(blocks)} blocks, {len(out)} tokens")

# exact block KV cache: identical commits to recomputing the prefix every step
for dec, tau in (("low_confidence", None), ("threshold", 0.012)):
    a = step_commits(run_gen(l2, prompts[12], 24, 8, 4, dec, tau))
    b = step_commits(run_gen(l2, prompts[12], 24, 8, 4, dec, tau, ["--cache", "dual"]))
    report(a == b, f"exact block KV (--cache dual) == no cache, {dec}", f"{len(a)} steps")

# chunked prompt prefill of the exact block KV cache: a 45-token prompt (the first decoded block
# starts at 40) prefilled block by block, 16 rows (two blocks) at a time, in one forward
# (--prefill-chunk 0) or a chunk larger than the prompt — and with refills inside the generation
# (--cache-refresh 3) — all give the reference's commits
p45 = [int(t) for t in np.random.default_rng(12).integers(0, 1300, size=45)]
for dec, tau in (("low_confidence", None), ("threshold", 0.012)):
    ev, _ = check_gen(f"llada2 generate P=45 G=24 B=8 steps/block=4 {dec}", l2, ref, p45, 24, 8, 4, dec, tau)
    a = step_commits(ev)
    for extra in (["--prefill-chunk", 8], ["--prefill-chunk", 20], ["--prefill-chunk", 0], ["--prefill-chunk", 1000],
                  ["--prefill-chunk", 8, "--cache-refresh", 3]):
        b = step_commits(run_gen(l2, p45, 24, 8, 4, dec, tau, ["--cache", "dual"] + extra))
        report(a == b, f"chunked prefill {' '.join(map(str, extra))} == no cache, {dec}", f"{len(a)} steps")

# JointThreshold (LLaDA2.1 token editing): mask-to-token over tau, token-to-token over tau_edit,
# max_post edit-only steps; every forward compared, the ones that write nothing included
for P, G, B, tau, tau_e, post in ((5, 20, 8, 0.012, 0.0, 3), (12, 24, 8, 0.011, 0.02, 16), (21, 13, 4, 0.5, 0.0, 0)):
    ev = generate(l2, prompts[P], ["--gen-length", G, "--block-length", B, "--decoder", "joint_threshold", "--threshold", tau,
                                   "--edit-threshold", tau_e, "--max-post-steps", post])
    want_out, want_log = llada2_generate_joint(ref, np.array(prompts[P]), G, B, tau, tau_e, post, MASK, EOS)
    want_rep = [sorted((p_, t) for p_, t in st if p_ < P + G) for st in want_log]
    got_log = step_commits(ev)
    got_out = gen_tokens(ev, P)
    if EOS in got_out:
        got_out = got_out[:got_out.index(EOS) + 1]
    revised = sum(1 for e in ev if e["type"] == "step" for c in e["commits"] if c.get("revised"))
    revised_ok = all(c.get("previous") is not None for e in ev if e["type"] == "step" for c in e["commits"] if c.get("revised"))
    done = [e for e in ev if e["type"] == "done"][0]
    detail = f"{len(got_log)} steps (reference {len(want_rep)}), {revised} revised commits"
    for i, (a, b) in enumerate(zip(got_log, want_rep)):
        if a != b:
            detail += f"; first difference at step {i}: ours {a}, reference {b}"
            break
    report(got_log == want_rep and got_out == want_out and done["usage"]["steps"] == len(want_rep) and revised_ok and
           (tau_e > 0 or post == 0 or revised > 0),
           f"joint_threshold P={P} G={G} B={B} tau={tau} tau_edit={tau_e} max_post={post}", detail)

# HierarchyBlock (Fast-dLLM v2 sub-blocks, token shift, inherited first token): every step's commits and
# the output vs the reference — prompt tails inside the first block (no inheritance there), a prompt
# ending on a block boundary (the first block inherits from the prompt's last row), sub-blocks that do
# not divide the block, token_shift 0, an EOS stop; with the exact block KV cache and a chunked
# prefill (the window then starts at the previous block's last row) the commits stay the same
hb_cases = [  # (prompt, gen_length, B, sub-block, tau, token_shift, eos)
    (prompts[5], 20, 8, 4, 0.012, 1, EOS),
    (prompts[16], 17, 8, 3, 0.011, 1, EOS),     # P % B == 0: the first block inherits
    (p45, 24, 8, 8, 0.0125, 1, EOS),
    (prompts[21], 19, 16, 5, 0.9, 1, EOS),      # tau 0.9: one position per step (top-1)
    (prompts[12], 20, 8, 4, 0.012, 0, EOS),
    (prompts[5], 20, 8, 4, 0.012, 1, eos_tok),  # EOS stop (the token the first run produced)
]
for prompt, G, B, sub, tau, shift, eos in hb_cases:
    mdir = l2 if eos == EOS else eos_dir
    flags = ["--gen-length", G, "--block-length", B, "--decoder", "hierarchy_block", "--sub-block-length", sub,
             "--threshold", tau, "--token-shift", shift]
    ev = generate(mdir, prompt, flags)
    r = ref if eos == EOS else MoERef(eos_dir)
    want_out, want_log = hierarchy_block_generate(r, np.array(prompt), G, B, sub, tau, MASK, eos, token_shift=shift)
    P = len(prompt)
    want_rep = [[(p_, t) for p_, t in st if p_ < P + G] for st in want_log]
    got_log = step_commits(ev)
    got_out = gen_tokens(ev, P)
    if eos in got_out:
        got_out = got_out[:got_out.index(eos) + 1]
    detail = f"{len(got_log)} steps (reference {len(want_rep)}), {len(got_out)} tokens"
    for i, (a, b) in enumerate(zip(got_log, want_rep)):
        if a != b:
            detail += f"; first difference at step {i}: ours {a}, reference {b}"
            break
    name = f"hierarchy_block P={P} G={G} B={B} sub={sub} tau={tau} token_shift={shift}" + (" eos" if eos != EOS else "")
    widest = max(len(st) for st in got_log)   # tau 0.9 on an untrained model: top-1 only, else several
    report(got_log == want_rep and got_out == want_out and (widest == 1) == (tau == 0.9), name, detail)
    if eos == EOS and shift:
        for extra in (["--cache", "dual"], ["--cache", "dual", "--prefill-chunk", 8]):
            b = step_commits(generate(mdir, prompt, flags + extra))
            report(b == got_log, f"{name}: {' '.join(map(str, extra))} == no cache", f"{len(b)} steps")

# token editing with the exact block KV cache: edits stay inside the active block, whose rows every
# step recomputes, so the cache changes nothing
jt = ["--gen-length", 24, "--block-length", 8, "--decoder", "joint_threshold", "--threshold", 0.011, "--max-post-steps", 4]
a = step_commits(generate(l2, prompts[12], jt))
b = step_commits(generate(l2, prompts[12], jt + ["--cache", "dual"]))
report(a == b, "joint_threshold: exact block KV (--cache dual) == no cache", f"{len(a)} steps")

sys.exit(report.finish())
