"""test_decode.py — `unmask generate --json` against the independent NumPy decode reference.

On f32 `make-model` checkpoints (so near-ties between confidences are not an issue) the committed
(position, token) sets of every step must equal decode_ref.py's for: low_confidence with several
(gen_length, block_length, steps) combinations (even and uneven per-step quotas), CFG on and off,
the random decoder, temperature > 0 (Gumbel noise from the documented rng keying), threshold,
factor, hierarchy (A5: local maxima of mask runs, tau_low gate, tau_high) and credit (A6) decoders, the aligned block layout, logits_eos_inf, and EOS early stop. Also checks the
event-stream invariants: every generated position committed exactly once, blocks in order, block
texts concatenate to the done text, usage counts, and seeds (same seed -> same output, different
seed -> different output). Prints one line per check and "N passed, N failed".
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_run import BIN, Reporter, generate, step_commits, tmp_dir  # noqa: E402
from cli_run import make_model as _make_model  # noqa: E402
from decode_ref import Decoder  # noqa: E402
from llada_ref import LLaDARef  # noqa: E402

TMP = tmp_dir("test_decode")
report = Reporter()
REPL = "\ufffd"


def make_model(name, args):
    return _make_model(TMP, name, args)


def check_invariants(name, events, n_prompt, gen_length):
    steps = [e for e in events if e["type"] == "step"]
    blocks = [e for e in events if e["type"] == "block"]
    done = [e for e in events if e["type"] == "done"]
    ok = len(done) == 1 and events[-1]["type"] == "done"
    seen = {}
    for e in steps:
        for c in e["commits"]:
            seen[c["pos"]] = seen.get(c["pos"], 0) + 1
            ok = ok and c["index"] == c["pos"] - n_prompt and 0 <= c["index"] < gen_length
    ok = ok and all(v == 1 for v in seen.values())
    ok = ok and [b["block"] for b in blocks] == list(range(len(blocks)))
    ok = ok and [e["step"] for e in steps] == list(range(len(steps)))
    d = done[0] if done else {}
    ok = ok and "".join(b["text"] for b in blocks) == d.get("text")
    u = d.get("usage", {})
    ok = ok and u.get("steps") == len(steps) and u.get("committed") == len(seen) and u.get("prompt_tokens") == n_prompt
    if d.get("finish_reason") == "length":
        ok = ok and len(seen) == gen_length and u.get("completion_tokens") == gen_length
    report(ok, f"{name}: event invariants", f"{len(steps)} steps, {len(blocks)} blocks, {len(seen)} committed, "
           f"finish {d.get('finish_reason')}")


def initial_confidences(dec, prompt, G, B):
    x = list(prompt) + [dec.mask] * G
    l = dec.logits(x, len(prompt), 0.0, False)
    return [dec.sample(l[p], 0.0, 0, 0, p, False)[1] for p in range(len(prompt), len(prompt) + B)]


def compare(name, model_dir, dec, prompt, G, B, S, flags=(), **kw):
    flags = ["--gen-length", G, "--block-length", B] + (["--steps", S] if S else []) + list(flags)
    ev = generate(model_dir, prompt, flags)
    ours = step_commits(ev)
    ref, _ = dec.generate(prompt, G, B, S, **kw)
    ref = [sorted(s) for s in ref]
    first_diff = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
    ok = ours == ref
    detail = f"{len(ours)} steps identical" if ok else \
        f"ours {len(ours)} steps, ref {len(ref)}; first difference at step {first_diff}: " \
        f"{ours[first_diff] if first_diff is not None else ''} vs {ref[first_diff] if first_diff is not None else ''}"
    report(ok, name, detail)
    check_invariants(name, ev, len(prompt), G)
    return ev


def detok_lines(model_dir, id_lists, skip_special):
    """Texts of several id lists through `unmask detokenize --jsonl` (the tokenizer's own decode)."""
    path = os.path.join(TMP, "ids.jsonl")
    with open(path, "w") as f:
        for ids in id_lists:
            f.write(json.dumps(ids) + "\n")
    cmd = [BIN, "detokenize", "--model", model_dir, "--jsonl", path] + (["--skip-special"] if skip_special else [])
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return [json.loads(line) for line in r.stdout.splitlines()]


def text_checks():
    """With a tokenizer: block texts concatenate to the done text, which is exactly the tokenizer's
    decode of the generated ids before the first EOS/EOT (special tokens skipped) — so no text after
    EOS; per-position pieces are the token's own text; positions after a committed EOS carry no text."""
    mt = os.path.join(TMP, "tok_f32")
    subprocess.run([BIN, "make-model", "--out", mt, "--quiet", "--dtype", "f32"], check=True)
    if not os.path.exists(os.path.join(mt, "tokenizer.json")):
        report(False, "make-model wrote a tokenizer")
        return
    with open(os.path.join(mt, "config.json")) as f:
        c = json.load(f)
    with open(os.path.join(mt, "tokenizer.json")) as f:
        tj = json.load(f)
    added = {t["content"]: t["id"] for t in tj.get("added_tokens", [])}
    specials = {t["id"]: t["content"] for t in tj.get("added_tokens", []) if t.get("special")}
    stops = {c["eos_token_id"], added.get("<|eot_id|>", -1)}
    # prompts: --prompt goes through the chat template (unless --raw), --messages too
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}]
    mpath = os.path.join(TMP, "msgs.json")
    upath = os.path.join(TMP, "user.json")
    with open(mpath, "w") as f:
        json.dump(msgs, f)
    with open(upath, "w") as f:
        json.dump(msgs[1:], f)

    def n_tok(args):
        r = subprocess.run([BIN, "tokenize", "--model", mt] + args, capture_output=True, text=True, check=True)
        return len(r.stdout.strip().split(","))

    def n_prompt(args):
        r = subprocess.run([BIN, "generate", "--model", mt, "--gen-length", "4", "--block-length", "4", "--json",
                            "--threads", "1"] + args, capture_output=True, text=True, check=True)
        return json.loads(r.stdout.splitlines()[-1])["usage"]["prompt_tokens"]
    got = (n_prompt(["--messages", mpath]), n_prompt(["--prompt", msgs[1]["content"]]),
           n_prompt(["--prompt", msgs[1]["content"], "--raw"]))
    want = (n_tok(["--chat", mpath]), n_tok(["--chat", upath]), n_tok(["--text", msgs[1]["content"]]))
    report(got == want and want[1] > want[2], "prompt: --messages / --prompt (chat template) / --raw token counts",
           f"{got} vs tokenize {want}")
    runs = []
    for seed in range(30):
        ev = generate(mt, [5, 6, 7, 8], ["--gen-length", 128, "--block-length", 32, "--steps", 16,
                                         "--temperature", 1.0, "--seed", seed])
        ids = {cm["index"]: cm["id"] for e in ev if e["type"] == "step" for cm in e["commits"]}
        has_eos = any(t in stops for t in ids.values())
        if not runs or (has_eos and not any(r[2] for r in runs)):
            runs.append((seed, ev, has_eos))
        if len(runs) == 2:
            break
    report(any(r[2] for r in runs), "text: a run with EOS/EOT found", str([(r[0], r[2]) for r in runs]))
    for seed, ev, has_eos in runs:
        steps = [e for e in ev if e["type"] == "step"]
        ids = {cm["index"]: cm["id"] for e in steps for cm in e["commits"]}
        gen = [ids[i] for i in sorted(ids)]
        first = next((i for i, t in enumerate(gen) if t in stops), len(gen))
        done = ev[-1]
        blocks = "".join(e["text"] for e in ev if e["type"] == "block")
        want, = detok_lines(mt, [gen[:first]], True)
        report(blocks == done["text"] == want and len(want) > 0, f"text (seed {seed}, EOS {has_eos}): block texts == "
               "done text == tokenizer decode of the ids before the first EOS",
               f"{len(want)} chars, first EOS at {first if first < len(gen) else None}")
        report(done["usage"]["completion_tokens"] == first and
               done["finish_reason"] == ("stop" if has_eos else "length"), f"text (seed {seed}): usage and finish",
               f"{done['usage']['completion_tokens']} completion tokens, {done['finish_reason']}")
        # per-position pieces
        eos_known = None
        singles, expect_idx, bad_after = [], [], 0
        for e in steps:
            for cm in e["commits"]:
                if cm["id"] in stops and (eos_known is None or cm["pos"] < eos_known):
                    eos_known = cm["pos"]
            for cm in e["commits"]:
                if eos_known is not None and cm["pos"] > eos_known:
                    bad_after += cm["text"] != ""
                elif cm["id"] in specials:
                    bad_after += cm["text"] != specials[cm["id"]] or not cm["special"]
                else:
                    singles.append(cm)
        texts = detok_lines(mt, [[cm["id"]] for cm in singles], False)
        mism = [(cm["id"], cm["text"], t) for cm, t in zip(singles, texts) if cm["text"] != t]
        report(not mism and bad_after == 0, f"text (seed {seed}): pieces are the tokens' own text, empty after EOS",
               f"{len(singles)} pieces checked ({sum(REPL in cm['text'] for cm in singles)} with U+FFFD), "
               f"{len(mism)} mismatches {mism[:3]}, {bad_after} bad after EOS/special")


def main():
    m = make_model("tiny_f32", ["--preset", "tiny"])
    with open(os.path.join(m, "config.json")) as f:
        cfg = json.load(f)
    V = cfg.get("embedding_size") or cfg["vocab_size"]
    ref_model = LLaDARef(m)
    dec = Decoder(ref_model.forward, V, cfg["mask_token_id"], cfg["eos_token_id"])
    prompt = [3, 17, 99, 250, 7, 42, 300]

    # low_confidence, temperature 0
    compare("low_confidence G16 B8 S8 (2/step)", m, dec, prompt, 16, 8, 8)
    compare("low_confidence G24 B8 S24 (1/step)", m, dec, prompt, 24, 8, 24)
    compare("low_confidence G24 B8 S6 (4/step)", m, dec, prompt, 24, 8, 6)
    compare("low_confidence G12 B12 S5 (uneven quota 3,3,2,2,2)", m, dec, prompt, 12, 12, 5)
    compare("low_confidence G16 B4 S8 + CFG 1.5", m, dec, prompt, 16, 4, 8, ["--cfg-scale", 1.5], cfg=1.5)
    compare("low_confidence logits_eos_inf", m, dec, prompt, 16, 8, 8, ["--logits-eos-inf"], logits_eos_inf=True)
    # randomness: temperature (Gumbel) and the random decoder
    compare("low_confidence T=0.8 seed 5", m, dec, prompt, 16, 8, 8, ["--temperature", 0.8, "--seed", 5],
            temperature=0.8, seed=5)
    compare("random decoder seed 9", m, dec, prompt, 16, 8, 8, ["--decoder", "random", "--seed", 9],
            decoder="random", seed=9)
    # threshold / factor: tiny random models are unconfident (~1/V), so tau and f are derived from
    # the median confidence of the first block on the initial canvas: several commits per step
    confs = initial_confidences(dec, prompt, 16, 8)
    sc = sorted(confs)
    tau = float((sc[len(sc) // 2 - 1] + sc[len(sc) // 2]) / 2)   # between two values: no ties at tau
    compare(f"threshold tau {tau:.5f} G16 B8", m, dec, prompt, 16, 8, 0, ["--decoder", "threshold",
            "--threshold", repr(tau)], decoder="threshold", threshold=tau)
    compare(f"threshold tau {tau:.5f} + CFG 2", m, dec, prompt, 16, 8, 0,
            ["--decoder", "threshold", "--threshold", repr(tau), "--cfg-scale", 2],
            decoder="threshold", threshold=tau, cfg=2.0)
    ev = compare("threshold tau 0.9 (one per step)", m, dec, prompt, 8, 4, 0,
                 ["--decoder", "threshold", "--threshold", 0.9], decoder="threshold", threshold=0.9)
    report(all(len(e["commits"]) == 1 for e in ev if e["type"] == "step"), "threshold 0.9 commits 1 per step")
    f = 3.0 * (1.0 - tau)   # c(2) >= 1 - f/3 passes for the upper half
    ev = compare(f"factor f={f:.5f}", m, dec, prompt, 16, 8, 0, ["--decoder", "factor", "--factor", repr(f)],
                 decoder="factor", factor=f)
    report(any(len(e["commits"]) >= 2 for e in ev if e["type"] == "step" and e["progress"]["block_masks_left"] > 0),
           "factor commits several positions in some step")
    # hierarchy (A5): tau_high above every initial confidence, so the first steps commit only local
    # maxima of mask runs and later ones (confidences grow as the block fills) also positions above
    # tau_high; tau_low at the median gates some local maxima. tau_high 0.9: local maxima only.
    hi_t = float(sc[-1] + (sc[-1] - sc[0]) / 4)
    ev = compare(f"hierarchy tau_high {hi_t:.5f} G16 B8", m, dec, prompt, 16, 8, 0,
                 ["--decoder", "hierarchy", "--threshold", repr(hi_t)], decoder="hierarchy", threshold=hi_t)
    st = [e for e in ev if e["type"] == "step"]
    below = sum(1 for e in st for c in e["commits"] if c["confidence"] <= hi_t and len(e["commits"]) >= 2)
    above = sum(1 for e in st for c in e["commits"] if c["confidence"] > hi_t)
    report(below > 0 and above > 0, "hierarchy commits local maxima below tau_high and positions above it",
           f"{below} below (in multi-commit steps), {above} above")
    ev_lo = compare(f"hierarchy tau_high {hi_t:.5f} tau_low {tau:.5f}", m, dec, prompt, 16, 8, 0,
                    ["--decoder", "hierarchy", "--threshold", repr(hi_t), "--low-threshold", repr(tau)],
                    decoder="hierarchy", threshold=hi_t, low_threshold=tau)
    report(step_commits(ev_lo) != step_commits(ev), "hierarchy: tau_low changes the schedule",
           f"{[len(x) for x in step_commits(ev_lo)]} vs {[len(x) for x in step_commits(ev)]} commits per step")
    ev = compare("hierarchy tau_high 0.9 (local maxima only)", m, dec, prompt, 16, 8, 0,
                 ["--decoder", "hierarchy", "--threshold", 0.9], decoder="hierarchy", threshold=0.9)
    report(any(len(e["commits"]) >= 2 for e in ev if e["type"] == "step"),
           "hierarchy tau_high 0.9 commits several local maxima in some step")
    compare(f"hierarchy tau_high {tau:.5f} + CFG 1.5, T=0.7 seed 4", m, dec, prompt, 16, 8, 0,
            ["--decoder", "hierarchy", "--threshold", repr(tau), "--cfg-scale", 1.5, "--temperature", 0.7,
             "--seed", 4], decoder="hierarchy", threshold=tau, cfg=1.5, temperature=0.7, seed=4)
    # credit (A6): the credit raises the confidences of repeated argmaxes, so tau is taken above
    # every initial confidence (more so with a larger alpha)
    c_t = float(1.3 * sc[-1])
    ev = compare(f"credit tau {c_t:.5f} (alpha 0.7 gamma 0.2 beta 0.8)", m, dec, prompt, 16, 8, 0,
                 ["--decoder", "credit", "--threshold", repr(c_t)], decoder="credit", threshold=c_t)
    report(any(len(e["commits"]) >= 2 for e in ev if e["type"] == "step"), "credit commits several in some step")
    c_t3 = float(3.0 * sc[-1])
    compare(f"credit tau {c_t3:.5f} alpha 3 gamma 0.5 beta 0.5", m, dec, prompt, 24, 8, 0,
            ["--decoder", "credit", "--threshold", repr(c_t3), "--credit-alpha", 3, "--credit-gamma", 0.5,
             "--credit-decay", 0.5], decoder="credit", threshold=c_t3, credit_alpha=3.0, credit_gamma=0.5,
            credit_decay=0.5)
    compare(f"credit tau {tau:.5f} T=0.8 seed 6", m, dec, prompt, 16, 8, 0,
            ["--decoder", "credit", "--threshold", repr(tau), "--temperature", 0.8, "--seed", 6],
            decoder="credit", threshold=tau, temperature=0.8, seed=6)
    a0 = step_commits(generate(m, prompt, ["--gen-length", 16, "--block-length", 8, "--decoder", "credit",
                                           "--credit-alpha", 0, "--threshold", repr(tau)]))
    t0 = step_commits(generate(m, prompt, ["--gen-length", 16, "--block-length", 8, "--decoder", "threshold",
                                           "--threshold", repr(tau)]))
    report(a0 == t0, "credit with credit_alpha 0 == threshold decoder", f"{len(a0)} vs {len(t0)} steps")
    compare("aligned layout threshold B8 (prompt 7)", m, dec, prompt, 21, 8, 0,
            ["--decoder", "threshold", "--threshold", repr(tau), "--block-layout", "aligned"],
            decoder="threshold", threshold=tau, layout="aligned")
    ev = generate(m, prompt, ["--gen-length", 21, "--block-length", 8, "--block-layout", "aligned"])
    blocks = [(b["start"], b["end"]) for b in ev if b["type"] == "block"]
    report(blocks == [(0, 1), (1, 9), (9, 17), (17, 21)], "aligned layout block bounds", str(blocks))

    # EOS: a 16-id vocabulary (64 embedding rows) makes EOS likely; the run stops at the end of the
    # block holding the first EOS and counts only the tokens before it
    m16 = make_model("v16_f32", ["--preset", "tiny", "--vocab", "16", "--seed", "7"])
    with open(os.path.join(m16, "config.json")) as f:
        c16 = json.load(f)
    d16 = Decoder(LLaDARef(m16).forward, c16.get("embedding_size") or c16["vocab_size"], c16["mask_token_id"],
                  c16["eos_token_id"])
    eos = c16["eos_token_id"]
    p16 = [1, 2, 3]
    # find a seed whose first EOS lies before the last block (our binary only: fast), then compare
    # that run step by step with the reference, with and without the early stop
    chosen = None
    for seed in range(40):
        ev = generate(m16, p16, ["--gen-length", 64, "--block-length", 8, "--steps", 64, "--temperature", 1.0,
                                 "--seed", seed, "--no-stop-at-eos"])
        ids = {c["index"]: c["id"] for e in ev if e["type"] == "step" for c in e["commits"]}
        first = min((i for i, t in ids.items() if t == eos), default=None)
        if first is not None and first < 40:
            chosen = (seed, first)
            break
    report(chosen is not None, "a seed with an early EOS exists", str(chosen))
    if chosen:
        seed, first = chosen
        flags = ["--temperature", 1.0, "--seed", seed]
        ev = compare(f"EOS stop (seed {seed})", m16, d16, p16, 64, 8, 64, flags, temperature=1.0, seed=seed)
        canvas = {c["index"]: c["id"] for e in ev if e["type"] == "step" for c in e["commits"]}
        d = ev[-1]
        blk_end = (first // 8 + 1) * 8
        ok = d["finish_reason"] == "stop" and d["usage"]["completion_tokens"] == first
        ok = ok and max(canvas) == blk_end - 1 and len(canvas) == blk_end
        ok = ok and [b["block"] for b in ev if b["type"] == "block"][-1] == first // 8
        after = [c for e in ev if e["type"] == "step" for c in e["commits"] if c["index"] > first and c["text"]]
        report(ok and not after, f"EOS early stop semantics (seed {seed})",
               f"first EOS at {first}, decoded up to {max(canvas) + 1} of 64, completion_tokens "
               f"{d['usage']['completion_tokens']}, finish {d['finish_reason']}")
        ev2 = compare(f"EOS no-stop (seed {seed})", m16, d16, p16, 64, 8, 64, flags + ["--no-stop-at-eos"],
                      temperature=1.0, seed=seed, stop_at_eos=False)
        d2 = ev2[-1]
        report(d2["finish_reason"] == "stop" and d2["usage"]["committed"] == 64 and
               d2["usage"]["completion_tokens"] == first, f"EOS with --no-stop-at-eos (seed {seed})",
               f"committed {d2['usage']['committed']}, completion_tokens {d2['usage']['completion_tokens']}")

    text_checks()

    # seeds
    base = ["--gen-length", 16, "--block-length", 8, "--steps", 8, "--temperature", 1.0]
    a = step_commits(generate(m, prompt, base + ["--seed", 11]))
    b = step_commits(generate(m, prompt, base + ["--seed", 11]))
    c = step_commits(generate(m, prompt, base + ["--seed", 12]))
    report(a == b, "same seed -> identical output")
    report(a != c, "different seed -> different output")

    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
