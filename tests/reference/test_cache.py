"""test_cache.py — `unmask generate --cache ...` against the NumPy reference of the cached generators.

decode_ref.py implements the KV-cache strategies from their description (prefix: queries from the
block start to the end, keys = the cached prefix ++ fresh rows; dual: block rows only over the
cache with those rows replaced; vicinity: a window of prefix_look / after_look positions around
the block, after `warmup` cache-free steps; a refresh — full forward whose K/V become the cache —
when a block begins and every `refresh` steps). On f32 make-model checkpoints with MHA, GQA and
MQA attention the committed (position, token) lists of every step must equal the reference's for
prefix and dual with fixed steps (several gen/block/steps combinations incl. one step per block,
which the anchor generators crash on) and threshold decoding (no extra forward after the refresh
step finished a block), CFG on and off, temperature > 0, and an infill-free aligned layout.
Identities checked on our binary: vicinity widened to the whole canvas == none, vicinity 0/0 ==
dual, refresh every step == none (for every cached mode). A run of the caches that must differ
from `none` (so the comparisons could fail) is asserted too.
Prints one line per check and "N passed, N failed".
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_run import Reporter, generate, step_commits, tmp_dir  # noqa: E402
from cli_run import make_model as _make_model  # noqa: E402
from decode_ref import Decoder  # noqa: E402
from llada_ref import LLaDARef  # noqa: E402

TMP = tmp_dir("test_cache")
report = Reporter()


def make_model(name, args):
    return _make_model(TMP, name, args)


def cache_flags(kw):
    f = ["--cache", kw.get("cache", "none")]
    for k, flag in (("refresh", "--cache-refresh"), ("prefix_look", "--prefix-look"), ("after_look", "--after-look"),
                    ("warmup", "--warmup-steps")):
        if k in kw:
            f += [flag, kw[k]]
    return f


def compare(name, model_dir, dec, prompt, G, B, S, flags=(), **kw):
    """Our step commits vs the reference's; returns ours."""
    f = ["--gen-length", G, "--block-length", B] + (["--steps", S] if S else []) + list(flags) + cache_flags(kw)
    ev = generate(model_dir, prompt, f)
    ours = step_commits(ev)
    ref, _ = dec.generate(prompt, G, B, S, **kw)
    ref = [sorted(s) for s in ref]
    first = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
    ok = ours == ref
    report(ok, name, f"{len(ours)} steps identical" if ok else
           f"ours {len(ours)} steps, ref {len(ref)}; first difference at step {first}: "
           f"{ours[first] if first is not None else ''} vs {ref[first] if first is not None else ''}")
    done = ev[-1]
    committed = sum(len(s) for s in ours)
    report(done["type"] == "done" and done["usage"]["steps"] == len(ours) and committed == done["usage"]["committed"],
           f"{name}: usage", f"{done['usage']['steps']} steps, {committed} committed")
    return ours


def dec_for(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    V = cfg.get("embedding_size") or cfg["vocab_size"]
    ref = LLaDARef(model_dir)
    return Decoder(ref.forward, V, cfg["mask_token_id"], cfg["eos_token_id"], model=ref)


def initial_tau(dec, prompt, G, B):
    """A threshold between two first-block confidences: several commits per step, no ties at tau."""
    x = list(prompt) + [dec.mask] * G
    l = dec.logits(x, len(prompt), 0.0, False)
    c = sorted(dec.sample(l[p], 0.0, 0, 0, p, False)[1] for p in range(len(prompt), len(prompt) + B))
    return float((c[len(c) // 2 - 1] + c[len(c) // 2]) / 2)


def main():
    prompt = [3, 17, 99, 250, 7, 42, 300]
    models = [("MHA", make_model("mha", ["--preset", "tiny"])),
              ("GQA", make_model("gqa", ["--preset", "tiny", "--n-kv-heads", "2", "--seed", "5"])),
              ("MQA", make_model("mqa", ["--preset", "tiny", "--n-kv-heads", "1"]))]
    differs = 0
    for label, m in models:
        dec = dec_for(m)
        none = step_commits(generate(m, prompt, ["--gen-length", 24, "--block-length", 8, "--steps", 12]))
        for cache in ("prefix", "dual"):
            ours = compare(f"{label} {cache} G24 B8 S12", m, dec, prompt, 24, 8, 12, cache=cache)
            differs += ours != none
            compare(f"{label} {cache} G16 B4 S8 + CFG 1.5", m, dec, prompt, 16, 4, 8, ["--cfg-scale", 1.5],
                    cfg=1.5, cache=cache)
        tau = initial_tau(dec, prompt, 16, 8)
        for cache in ("prefix", "dual"):
            compare(f"{label} {cache} threshold tau {tau:.5f} G16 B8", m, dec, prompt, 16, 8, 0,
                    ["--decoder", "threshold", "--threshold", repr(tau)], decoder="threshold", threshold=tau,
                    cache=cache)
        compare(f"{label} vicinity P3 A5 warmup 3 G24 B8 S12", m, dec, prompt, 24, 8, 12, cache="vicinity",
                prefix_look=3, after_look=5, warmup=3)

    label, m = models[0]
    dec = dec_for(m)
    # fixed steps with one step per block: the refresh step commits the whole block, nothing after it
    ours = compare("MHA dual one step per block G16 B4 S4", m, dec, prompt, 16, 4, 4, cache="dual")
    report(len(ours) == 4 and all(len(s) == 4 for s in ours), "one step per block: exactly one forward per block",
           f"{[len(s) for s in ours]}")
    compare("MHA prefix one step per block G16 B4 S4", m, dec, prompt, 16, 4, 4, cache="prefix")
    # uneven quotas, several blocks, CFG + threshold, temperature > 0, aligned layout, refresh interval
    compare("MHA dual G24 B8 S9 (uneven quota)", m, dec, prompt, 24, 8, 9, cache="dual")
    tau = initial_tau(dec, prompt, 16, 8)
    compare("MHA dual threshold + CFG 2", m, dec, prompt, 16, 8, 0,
            ["--decoder", "threshold", "--threshold", repr(tau), "--cfg-scale", 2], decoder="threshold",
            threshold=tau, cfg=2.0, cache="dual")
    compare("MHA prefix T=0.8 seed 5", m, dec, prompt, 16, 8, 8, ["--temperature", 0.8, "--seed", 5],
            temperature=0.8, seed=5, cache="prefix")
    compare("MHA dual aligned layout threshold", m, dec, prompt, 21, 8, 0,
            ["--decoder", "threshold", "--threshold", repr(tau), "--block-layout", "aligned"],
            decoder="threshold", threshold=tau, layout="aligned", cache="dual")
    compare("MHA dual refresh every 2 steps G16 B8 S8", m, dec, prompt, 16, 8, 8, cache="dual", refresh=2)
    compare("MHA vicinity P2 A0 + CFG 1", m, dec, prompt, 16, 8, 8, ["--cfg-scale", 1], cfg=1.0,
            cache="vicinity", prefix_look=2)

    # threshold mode never runs a forward after a block is complete: steps == reference, and every
    # step commits at least one position
    tau_hi = 0.999
    ours = compare("MHA dual threshold 0.999 (one per step)", m, dec, prompt, 8, 4, 0,
                   ["--decoder", "threshold", "--threshold", tau_hi], decoder="threshold", threshold=tau_hi,
                   cache="dual")
    report(len(ours) == 8 and all(len(s) == 1 for s in ours), "threshold: no forward without a commit",
           f"{len(ours)} steps for 8 positions")

    # identities on our binary
    for label, m in models:
        base = ["--gen-length", 24, "--block-length", 8, "--steps", 12]
        none = step_commits(generate(m, prompt, base))
        wide = step_commits(generate(m, prompt, base + ["--cache", "vicinity", "--prefix-look", 1024,
                                                        "--after-look", 1024]))
        report(wide == none, f"{label}: vicinity widened to the whole canvas == none", f"{len(wide)} steps")
        v0 = step_commits(generate(m, prompt, base + ["--cache", "vicinity"]))
        dual = step_commits(generate(m, prompt, base + ["--cache", "dual"]))
        report(v0 == dual, f"{label}: vicinity 0/0 == dual", f"{len(v0)} steps")
        for cache in ("prefix", "dual", "vicinity"):
            r1 = step_commits(generate(m, prompt, base + ["--cache", cache, "--cache-refresh", 1]))
            report(r1 == none, f"{label}: {cache} refreshed every step == none", f"{len(r1)} steps")
        wu = step_commits(generate(m, prompt, base + ["--cache", "dual", "--warmup-steps", 1000]))
        report(wu == none, f"{label}: warmup over every step == none", f"{len(wu)} steps")
    report(differs > 0, "the caches change the output of some model (the comparisons can fail)",
           f"{differs} of {2 * len(models)} cached runs differ from none")

    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
