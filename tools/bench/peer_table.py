#!/usr/bin/python3
"""peer_table.py — one table of unmask's decode steps beside the PyTorch peers': reads the output of
`unmask bench --decode` (its table rows) and of `torch_peer.py --decode --json` (JSON lines) from the
files given, in any order, and prints a markdown row per (cache mode, decoder, batch) that either
has: ms per step of unmask, of the strong (compiled) peer and of the eager peer, each peer's ms over
unmask's (> 1: unmask is faster), the strong peer's compile seconds and whether both peers committed
the same tokens. A missing number is "—" with the reason below the table (a skipped or failed run).
Knows nothing about how the numbers were made (scripts/gpu/run-checks.sh lease runs it).

usage: peer_table.py FILE...
"""
import json
import re
import sys

UNMASK_ROW = re.compile(r"^(low_confidence|threshold)\s+(none|dual|prefix)\s+(\d+)\s+(\d+)\s+\d+\s+[\d.]+\s+[\d.]+\s+"
                        r"[\d.]+\s+[\d.]+\s+([\d.]+)\s")


def peer_ms(r, peer):
    """The fastest dtype's ms/step of one peer in a torch_peer row, or None."""
    v = [x for k, x in r.items() if k.startswith(peer + "_") and k.endswith("_ms_per_step")]
    return min(v) if v else None


def main(files):
    unmask, peers, order = {}, {}, []
    for fn in files:
        try:
            text = open(fn).read()
        except OSError as e:
            print(f"peer_table: {fn}: {e.strerror}", file=sys.stderr)
            continue
        for ln in text.splitlines():
            m = UNMASK_ROW.match(ln)
            if m:
                key = (m.group(2), m.group(1), int(m.group(3)))
                unmask[key] = float(m.group(5))
                order.append(key)
            elif ln.startswith("{"):
                try:
                    r = json.loads(ln)
                except ValueError:
                    continue
                if r.get("mode") == "decode":
                    key = (r["cache"], r["decoder"], r["batch"])
                    peers[key] = r
                    order.append(key)
    if not order:
        print("peer_table: no unmask or peer decode rows in " + " ".join(files))
        return 1
    keys = sorted(set(order), key=lambda k: ({"dual": 0, "none": 1}.get(k[0], 2), k[1], k[2]))
    notes = {}   # reason -> the rows it concerns

    def note(key, why):
        notes.setdefault(why, []).append(f"{key[0]} {key[1]} batch {key[2]}")

    def cell(v):
        return "—" if v is None else f"{v:.1f}" if v >= 10 else f"{v:.2f}"

    def ratio(a, b):
        return "—" if a is None or not b else f"{a / b:.2f}×"

    print("| step | decoder | batch | unmask ms/step | compiled peer | eager peer | compiled / unmask | eager / unmask "
          "| compile s | same tokens |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for key in keys:
        cache, decoder, batch = key
        u = unmask.get(key)
        r = peers.get(key, {})
        s, e = peer_ms(r, "strong"), peer_ms(r, "eager")
        for peer in ("strong", "eager"):
            if r.get(peer + "_skipped"):
                note(key, f"{peer} peer skipped ({r[peer + '_skipped']})")
        how = r.get("strong_compiled")
        if s is not None and how and not how.startswith("reduce-overhead") and how != "default":
            note(key, f"the strong peer ran uncompiled: {how}")
        if r.get("strong_masks_left", 0) > 0:
            note(key, f"WRONG: the strong peer left {r['strong_masks_left']} masks in its decoded blocks")
        if r.get("strong_cudagraph_skips", 0) > 0:
            note(key, "inductor skipped CUDA graphs for some step (the peer's stderr says why)")
        if u is None:
            note(key, "no unmask row")
        if not r:
            note(key, "no peer row (the peer run ended before it)")
        step = "dual cache" if cache == "dual" else "no cache" if cache == "none" else cache
        same = {True: "yes", False: "no"}.get(r.get("same_tokens"), "—")
        comp = r.get("strong_compile_s")
        print(f"| {step} | {decoder} | {batch} | {cell(u)} | {cell(s)} | {cell(e)} | {ratio(s, u)} | {ratio(e, u)} "
              f"| {'—' if comp is None else f'{comp:.0f}'} | {same} |")
    for why, rows in notes.items():
        print(f"- {', '.join(rows)}: {why}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__.split("usage: ")[1].strip(), file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1:]))
