#!/usr/bin/python3
"""greedy_compare.py A.jsonl B.jsonl — two `unmask generate --json` runs of the same prompt and decode
options side by side (e.g. bf16 and FP8 weights at temperature 0): the final token at every generated
position (from the step events' commits), the share of positions with the same token, the first
step whose commits differ, and both texts. Not a test: prints, asserts nothing."""
import json
import sys


def load(path):
    final, steps, text = {}, [], ""
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            ev = json.loads(line)
            if ev.get("type") == "step":
                c = sorted((x["pos"], x["id"]) for x in ev.get("commits", []))
                steps.append(c)
                for p, i in c:
                    final[p] = i
            elif ev.get("type") == "done":
                text = ev.get("text", "")
    return final, steps, text


a, sa, ta = load(sys.argv[1])
b, sb, tb = load(sys.argv[2])
pos = sorted(set(a) | set(b))
same = sum(1 for p in pos if a.get(p) == b.get(p))
first = next((i for i, (x, y) in enumerate(zip(sa, sb)) if x != y), None)
print(f"same token at {same}/{len(pos)} positions ({100.0 * same / max(len(pos), 1):.1f}%); "
      f"steps {len(sa)} / {len(sb)}; first differing step: {first if first is not None else 'none'}")
print(f"A: {ta[:200]!r}")
print(f"B: {tb[:200]!r}")
