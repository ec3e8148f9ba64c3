#!/usr/bin/env bash
# test_bench_profile.sh — `bench --decode --profile 1` on the CPU backend (per-op times from the
# host clock; src/backend/backend_prof.c): after the row, a table per decoder x cache with one line
# per op kind. Checks the calls per step against the model's shape (tiny preset: 2 layers — q/k/v
# with its norm, o-proj and down with their adds, gate/up with SwiGLU per layer, the LM head once,
# K and V stored per layer with the dual cache), that the ops' time is positive and within the
# wall time, and that a bad --profile value is a clear error.
set -u
BIN="${UNMASK_BIN:?UNMASK_BIN not set}"
TMP="${UNMASK_TEST_TMP:-/tmp}/test_bench_profile"
source "$(dirname "$0")/lib.sh"

"$BIN" make-model --out "$TMP/m" --preset tiny --quiet || { echo "make-model failed"; exit 1; }
if "$BIN" bench --decode --model "$TMP/m" --batch 2 --prompt 8 --gen 16 --block 8 --decoders threshold \
    --cache dual --profile 1 --threads 1 >"$TMP/out" 2>"$TMP/err"; then
    passed=$((passed + 1)); echo "PASS bench --decode --profile 1 runs"
else
    failed=$((failed + 1)); echo "FAIL bench --decode --profile 1: $(tail -3 "$TMP/err")"
fi
"$PY" - "$TMP/out" <<'PYEOF' && passed=$((passed + 1)) || failed=$((failed + 1))
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"profile: threshold, cache dual, batch 2, host loop \((\d+) steps, ([0-9.]+) ms/step wall\):\n(.*?)\n\n", text, re.S)
if not m:
    print("FAIL no profile table for threshold/dual/batch 2"); sys.exit(1)
wall = float(m.group(2))
rows = {}
for line in m.group(3).splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 5 and cells[0] not in ("op", "---") and not cells[0].startswith("-"):
        rows[cells[0]] = cells
want = {"rmsnorm+linear x3": 2, "linear+add": 4, "rmsnorm+linear+swiglu": 2, "attention": 2, "rmsnorm+linear": 1,
        "store_rows": 4, "rope": 4}
bad = [f"{op}: {rows[op][1] if op in rows else 'missing'} calls/step, want {n}" for op, n in want.items()
       if op not in rows or abs(float(rows[op][1]) - n) > 1e-9]
total = float(rows["(all ops)"][2]) if "(all ops)" in rows else -1
if not (0 < total <= wall * 1.001):   # the rest of a tiny model's step is the decoder's host work
    bad.append(f"ops {total} ms/step against {wall} ms/step wall")
if bad:
    print("FAIL " + "; ".join(bad)); sys.exit(1)
print(f"PASS profile: calls per step match the tiny model; ops {total:.3f} of {wall:.3f} ms/step wall")
PYEOF
expect_rc "profile: bad value" 2 "profile" -- "$BIN" bench --decode --model "$TMP/m" --profile x
finish
