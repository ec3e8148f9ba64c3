#!/usr/bin/env bash
# test_devices.sh — --device / --gpus parsing for serve, generate and logits: unknown devices are
# refused with a message naming the device and exit code != 0, before any model work starts.
set -u
BIN="${UNMASK_BIN:?}"
TMP="${UNMASK_TEST_TMP:-/tmp}/devices.$$"
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
check() { # name, expected rc (nonzero = any nonzero), needle, command...
    local name="$1" want="$2" needle="$3"; shift 3
    local out rc
    out=$("$@" 2>&1); rc=$?
    if { [ "$want" = nonzero ] && [ "$rc" -ne 0 ]; } || [ "$rc" = "$want" ]; then
        if printf '%s' "$out" | grep -qF -- "$needle"; then pass=$((pass+1)); return; fi
    fi
    fail=$((fail+1)); echo "FAIL $name: rc=$rc out=$out"
}
"$BIN" make-model --out "$TMP/m" --quiet || { echo "make-model failed"; echo "0 passed, 1 failed"; exit 1; }
check serve-tpu 2 "'tpu:0' is not a GPU" "$BIN" serve --model "$TMP/m" --port 0 --device tpu:0
check serve-gpus-bad 2 "'cuda:x' is not a GPU" "$BIN" serve --model "$TMP/m" --port 0 --gpus x
check serve-empty 2 "--device must not be empty" "$BIN" serve --model "$TMP/m" --port 0 --device ""
check generate-tpu nonzero "unknown device 'tpu'" "$BIN" generate --model "$TMP/m" --prompt-ids 1,2 --gen-length 4 --block-length 4 --device tpu
check logits-tpu nonzero "unknown device 'npu:1'" "$BIN" logits --model "$TMP/m" --tokens 1,2 --out "$TMP/x.npy" --device npu:1
check generate-cpu 0 '"type":"done"' "$BIN" generate --model "$TMP/m" --prompt-ids 1,2 --gen-length 4 --block-length 4 --device cpu --json
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
