#!/usr/bin/env bash
# test_make_model.sh — `unmask make-model`: nested output directories are created, bad options are
# usage errors (exit 2) naming the option, every preset/dtype/shard layout loads back and computes.
set -u
BIN="${UNMASK_BIN:?}"
TMP="${UNMASK_TEST_TMP:-/tmp}/make_model.$$"
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
ok()  { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
expect() { # name, want-rc, needle, cmd...
    local name="$1" want="$2" needle="$3"; shift 3
    local out rc; out=$("$@" 2>&1); rc=$?
    if [ "$rc" = "$want" ] && { [ -z "$needle" ] || printf '%s' "$out" | grep -qF -- "$needle"; }; then ok; else bad "$name: rc=$rc out=$out"; fi
}
expect nested 0 "" "$BIN" make-model --out "$TMP/a/b/c" --quiet
[ -f "$TMP/a/b/c/model.safetensors" ] && [ -f "$TMP/a/b/c/tokenizer.json" ] && ok || bad "nested: files missing"
expect preset 2 "--preset must be" "$BIN" make-model --out "$TMP/x" --preset huge
expect dtype 2 "--dtype must be" "$BIN" make-model --out "$TMP/x" --dtype int8
expect heads 2 "not divisible by n-heads" "$BIN" make-model --out "$TMP/x" --d-model 100 --n-heads 3
expect kv 2 "not divisible by n-kv-heads" "$BIN" make-model --out "$TMP/x" --n-heads 4 --n-kv-heads 3
expect notdir 1 "cannot create directory" "$BIN" make-model --out "$TMP/a/b/c/model.safetensors/x"
expect noout 2 "--out DIR is required" "$BIN" make-model
for layout in "--dtype f32" "--dtype f16 --shards 3" "--weight-tying --no-tokenizer" "--preset demo"; do
    d="$TMP/m$pass"
    # shellcheck disable=SC2086
    if "$BIN" make-model --out "$d" --quiet $layout && "$BIN" logits --model "$d" --tokens 1,2,3 --out "$d/l.npy" 2>/dev/null; then
        ok
    else
        bad "layout '$layout' does not load and compute"
    fi
done
# same seed -> same bytes; another seed -> other weights
"$BIN" make-model --out "$TMP/s1" --quiet --seed 7 && "$BIN" make-model --out "$TMP/s2" --quiet --seed 7 &&
"$BIN" make-model --out "$TMP/s3" --quiet --seed 8 || bad "seeded make-model failed"
cmp -s "$TMP/s1/model.safetensors" "$TMP/s2/model.safetensors" && ok || bad "same seed differs"
cmp -s "$TMP/s1/model.safetensors" "$TMP/s3/model.safetensors" && bad "different seeds equal" || ok
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
