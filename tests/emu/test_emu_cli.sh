#!/usr/bin/env bash
# test_emu_cli.sh — the full CLI on the CUDA emulator (UNMASK_EMU_BIN = unmask-emu, whose
# --device cuda:N runs src/backend/cuda and kernels/ on the CPU):
#   - logits --device cuda:0 vs --device cpu on tiny make-model checkpoints (bf16 with GQA + key
#     padding; f32; f16 in 3 shards — the latter two through the device-side bf16 conversion):
#     relative L2 error <= 2e-2 (bf16 activations vs f32) and the same argmax on every row that is not
#     a near-tie (CPU top-2 gap > 2 x that row's largest |cuda - cpu|), with most rows decisive;
#     the same for Dream, LLaDA-MoE and LLaDA2 (block-causal) presets, and a generate on each;
#     cuda:1 of UNMASK_EMU_DEVICES=2 gives the same bytes as cuda:0;
#   - generate --device cuda:0 exits 0 with a done event and no mask left, for the device-resident
#     loop and the host loop; at temperature 0 both loops see the same device logits, so their tokens
#     must be identical (bf16 vs the CPU's f32 can flip near-ties, so no token check against cpu);
#   - bench --device cuda:0 (the decode-step bench) runs and prints a row per batch with 16 steps,
#     with the compute floor from its measured matmul rate, and with --profile 1 a per-op table;
#     bench --decode --device cuda:0 prints its rows with the device loop's steps and graph replays;
#     with --profile 1 and the dual cache, its per-op table and more staged index arrays reused than copied
#     and the device memory in use (non-zero, below the device's total); q|k|v and gate|up joined, one
#     product each (the default) or not (UNMASK_CUDA_PACK): said by the bench, the same logits bit for bit;
#   - serve --gpus 0,1 on two emulated devices: 6 concurrent completions, each 24 tokens;
#   - host-side error paths (exit != 0, no abort): UNMASK_EMU_MEM_BYTES below the backend's own buffers
#     -> "not enough free device memory", room for those but not the weights -> "does not fit",
#     UNMASK_EMU_DEVICES=0 -> "no CUDA device", cuda:1 of one device -> "only 1".
set -u
BIN="${UNMASK_EMU_BIN:?UNMASK_EMU_BIN not set (build with UNMASK_CUDA_EMU=ON)}"
PY=/usr/bin/python3
TMP="${UNMASK_TEST_TMP:-/tmp}/emu_cli.$$"
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL $*"; }

"$BIN" make-model --out "$TMP/m" --quiet --n-heads 4 --n-kv-heads 2 || { echo "make-model failed"; echo "0 passed, 1 failed"; exit 1; }

# ---------------------------------------------------------------- logits
TOK=1,17,300,42,7,99,250,3,8,400,12,77,5,6,200,31
VALID=1,1,1,1,1,1,1,1,1,1,1,1,1,1,0,0
COMPARE="${UNMASK_SOURCE_DIR:-$(dirname "$0")/../..}/tests/gpu/compare_logits.py"
# bf16 (GQA, key padding); f32 and sharded f16 checkpoints go through the device-side conversion
"$BIN" make-model --out "$TMP/m_f32" --quiet --dtype f32 --seed 3 &&
"$BIN" make-model --out "$TMP/m_f16" --quiet --dtype f16 --shards 3 --seed 4 || bad "make-model f32/f16 failed"
# logits_parity NAME [logits flags...]: logits of $TMP/NAME on cpu and cuda:0 (l_NAME_cpu/cuda.npy), compared
logits_parity() {
    local m=$1 d out
    shift
    for d in cpu cuda:0; do
        if ! "$BIN" logits --model "$TMP/$m" --tokens "$TOK" "$@" --out "$TMP/l_${m}_${d%%:*}.npy" \
            --device "$d" > "$TMP/logits.log" 2>&1; then
            bad "logits $m --device $d failed: $(tail -3 "$TMP/logits.log")"
        fi
    done
    if out=$("$PY" "$COMPARE" "$TMP/l_${m}_cpu.npy" "$TMP/l_${m}_cuda.npy" 2>&1); then
        ok
        echo "logits $m cuda:0 vs cpu: $out"
    else
        bad "logits $m cuda:0 vs cpu: $out"
    fi
}
for m in m m_f32 m_f16; do logits_parity "$m" --key-valid "$VALID"; done

# the other model families on the CUDA backend: Dream (Qwen2: q/k/v biases, GQA), LLaDA-MoE
# (routed experts, QK-norm) and LLaDA2 (sigmoid group-limited routing, shared expert, partial rotary)
# with block-causal attention (--block-length 4); the LLaDA2 control compares the CUDA block-causal
# logits with the CPU's full attention, which must differ (block_length reaches the CUDA attention)
for fam in dream-tiny lladamoe-tiny llada2-tiny; do
    "$BIN" make-model --out "$TMP/$fam" --preset "$fam" --quiet || { bad "make-model --preset $fam failed"; continue; }
    extra=(); [ "$fam" = llada2-tiny ] && extra=(--block-length 4)
    logits_parity "$fam" "${extra[@]}"
    if "$BIN" generate --model "$TMP/$fam" --prompt-ids 1,2,3,4,5 --gen-length 16 --block-length 8 --device cuda:0 \
        --json > "$TMP/gen_$fam.jsonl" 2> "$TMP/gen_$fam.err" &&
        "$PY" -c '
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
done = [e for e in ev if e.get("type") == "done"]
assert len(done) == 1 and done[0]["error"] is None, done
assert any(e.get("type") == "step" and e["commits"] for e in ev), "no step committed anything"
' "$TMP/gen_$fam.jsonl" 2>> "$TMP/gen_$fam.err"; then
        ok
    else
        bad "generate $fam --device cuda:0: $(tail -5 "$TMP/gen_$fam.err")"
    fi
done
"$BIN" logits --model "$TMP/llada2-tiny" --tokens "$TOK" --out "$TMP/l_llada2_full_cpu.npy" --device cpu > "$TMP/logits.log" 2>&1 ||
    bad "logits llada2-tiny (full attention) failed: $(tail -3 "$TMP/logits.log")"
if "$PY" "$COMPARE" "$TMP/l_llada2_full_cpu.npy" "$TMP/l_llada2-tiny_cuda.npy" > /dev/null 2>&1; then
    bad "llada2-tiny: CUDA logits with --block-length 4 match full attention (block-causal mask not applied on CUDA)"
else
    ok
fi

# a second emulated device computes the same logits bit for bit (device selection per thread, cuBLAS
# handle of the right device)
if UNMASK_EMU_DEVICES=2 "$BIN" logits --model "$TMP/m" --tokens "$TOK" --key-valid "$VALID" --out "$TMP/l_dev1.npy" \
    --device cuda:1 > "$TMP/logits_dev1.log" 2>&1 && cmp -s "$TMP/l_m_cuda.npy" "$TMP/l_dev1.npy"; then
    ok
else
    bad "logits --device cuda:1 (UNMASK_EMU_DEVICES=2) differs from cuda:0 or failed: $(tail -3 "$TMP/logits_dev1.log")"
fi

# ---------------------------------------------------------------- generate
for loop in on off; do
    if "$BIN" generate --model "$TMP/m" --prompt-ids 1,2,3,4,5 --gen-length 24 --block-length 8 --device cuda:0 \
        --device-loop "$loop" --json > "$TMP/gen_$loop.jsonl" 2> "$TMP/gen_$loop.err"; then
        ok
    else
        bad "generate --device cuda:0 --device-loop $loop: $(tail -5 "$TMP/gen_$loop.err")"
    fi
done
if out=$("$PY" - "$TMP/gen_on.jsonl" "$TMP/gen_off.jsonl" <<'EOF'
import json, sys
def final(path):
    ev = [json.loads(l) for l in open(path) if l.strip()]
    done = [e for e in ev if e.get("type") == "done"]
    assert len(done) == 1, f"{path}: {len(done)} done events"
    d = done[0]
    assert d["error"] is None and d["usage"]["completion_tokens"] == 24, d
    steps = [e for e in ev if e.get("type") == "step"]
    assert steps and steps[-1]["progress"]["masks_left"] == 0, "masks left"
    ids = {}
    for e in steps:
        for c in e["commits"]:
            assert c["pos"] not in ids, f"position {c['pos']} committed twice"
            ids[c["pos"]] = c["id"]
    assert len(ids) == 24, f"{len(ids)} positions committed"
    return ids
a, b = final(sys.argv[1]), final(sys.argv[2])
same = sum(a[p] == b[p] for p in a)
print(f"device loop vs host loop: {same}/24 tokens identical")
sys.exit(0 if a == b else 1)
EOF
); then ok; echo "generate cuda:0: $out"; else bad "generate cuda:0: $out"; fi

# ---------------------------------------------------------------- bench (timings meaningless here)
# the GPU decode-step bench runs its whole path: events, copy bandwidth, CUDA graph steps
if "$BIN" bench --model "$TMP/m" --device cuda:0 --batch 1,2 --gen 16 --block 8 --bw-mib 4 --peak-n 64 > "$TMP/bench.out" 2> "$TMP/bench.err" &&
    [ "$(grep -cE '^\| +[12] \| +[0-9]+ \| +16 \|' "$TMP/bench.out")" = 2 ] &&
    grep -qE '^bf16 matmul [0-9]+ TFLOP/s \(64\^3, measured\)' "$TMP/bench.out" &&
    # the compute-floor column (9th) is filled from the measured rate
    [ "$(awk -F'|' '/^\| +[12] \|/ && $10 + 0 > 0' "$TMP/bench.out" | wc -l)" = 2 ]; then
    ok
else
    bad "bench --device cuda:0: $(tail -5 "$TMP/bench.out" "$TMP/bench.err")"
fi

# --profile 1: each batch again op by op, timed with the device's events (src/backend/backend_prof.c)
if "$BIN" bench --model "$TMP/m" --device cuda:0 --batch 1 --gen 16 --block 8 --bw-mib 4 --peak-n 0 --profile 1 \
        > "$TMP/bprof.out" 2> "$TMP/bprof.err" &&
    grep -qE '^profile, batch 1 \(16 steps launched op by op' "$TMP/bprof.out" &&
    grep -qE '^\| attention \| [0-9.]+ \| [0-9.]*[1-9][0-9.]* \|' "$TMP/bprof.out" &&
    grep -qE '^\| decode_sample \| 1\.0 \|' "$TMP/bprof.out"; then
    ok
else
    bad "bench --device cuda:0 --profile 1: $(tail -8 "$TMP/bprof.out" "$TMP/bprof.err")"
fi

# bench --decode --device cuda:0: the engine's split (device-resident loop for what it supports,
# KV cache modes included) — a row per decoder x cache, and the device loop really ran the steps
if "$BIN" bench --decode --device cuda:0 --model "$TMP/m" --batch 2 --gen 16 --block 8 --prompt 6 \
    --decoders low_confidence,threshold --cache none,dual > "$TMP/bench_decode.out" 2> "$TMP/bench_decode.err" &&
    [ "$(grep -cE '^(low_confidence|threshold) +(none|dual) +2 ' "$TMP/bench_decode.out")" = 4 ] &&
    grep -qE '^device loop: [1-9][0-9]* steps, [1-9][0-9]* graph captures, [1-9][0-9]* replays' "$TMP/bench_decode.out" &&
    grep -qE '^device memory in use after the rows: 0\.[0-9]*[1-9][0-9]* GiB of [1-9][0-9.]* GiB' "$TMP/bench_decode.out"; then
    ok
else
    bad "bench --decode --device cuda:0: $(tail -8 "$TMP/bench_decode.out" "$TMP/bench_decode.err")"
fi

# bench --decode --device cuda:0 --profile 1 with the dual cache: the per-op table (RoPE + KV store and
# add + RMSNorm as the fused ops, --cuda-fuse on by default) and the staged index arrays per step;
# every layer stages the same sequence starts / positions / slot pointers, so most stagings reuse an
# earlier copy (cuda_stage's memo) — more reused than copied
if "$BIN" bench --decode --device cuda:0 --model "$TMP/m" --batch 2 --gen 16 --block 8 --prompt 6 \
    --decoders threshold --cache dual --profile 1 > "$TMP/bdprof.out" 2> "$TMP/bdprof.err" &&
    grep -qE '^profile: threshold, cache dual, batch 2, host loop' "$TMP/bdprof.out" &&
    grep -qE '^\| rope\+store_kv \| ' "$TMP/bdprof.out" && grep -qE '^\| add\+rmsnorm \| ' "$TMP/bdprof.out" &&
    awk '/^host index arrays staged for the ops:/ { c = $8; r = $11; found = 1 } END { exit !(found && r > c && c > 0) }' "$TMP/bdprof.out"; then
    ok
else
    bad "bench --decode --device cuda:0 --profile 1 (staging reuse): $(grep -E 'staged for|store_kv|add\+rmsnorm' "$TMP/bdprof.out"; tail -3 "$TMP/bdprof.err")"
fi

# --cuda-fuse (rope + KV store, add + RMSNorm as one kernel each, or their single kernels): a bad value
# is a flag error; on and off give the same logits bit for bit
"$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$TMP/fuse.npy" --device cuda:0 --cuda-fuse maybe > /dev/null 2> "$TMP/fuse.err"
rc=$?
if [ $rc -ne 2 ] || ! grep -q "^error: --cuda-fuse must be on or off, got 'maybe'$" "$TMP/fuse.err"; then
    bad "--cuda-fuse maybe: rc $rc: $(cat "$TMP/fuse.err")"
else
    ok
fi
if "$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$TMP/fuse_on.npy" --device cuda:0 --cuda-fuse on > /dev/null 2> "$TMP/fuse.err" &&
    "$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$TMP/fuse_off.npy" --device cuda:0 --cuda-fuse off > /dev/null 2>> "$TMP/fuse.err" &&
    cmp -s "$TMP/fuse_on.npy" "$TMP/fuse_off.npy"; then
    ok
else
    bad "--cuda-fuse on / off: $(tail -3 "$TMP/fuse.err"; cmp "$TMP/fuse_on.npy" "$TMP/fuse_off.npy")"
fi

# gpu_gemm_bench (what a lease runs first: a broken bench wastes device time) at toy sizes: a row per
# product, path and weight type, the joined ones included
GB="$(dirname "$BIN")/gpu_gemm_bench_emu"
if "$GB" --d 32 --ffn 64 --vocab 64 --rows 1 --reps 1 --bw-mib 4 > "$TMP/gb.out" 2> "$TMP/gb.err" &&
    [ "$(grep -c '^| ' "$TMP/gb.out")" = 28 ] && grep -q '^| q|k|v joined | 1 | bf16 | cuBLAS | ' "$TMP/gb.out" &&
    grep -q '^| gate|up joined + swiglu | 1 | bf16 | skinny | ' "$TMP/gb.out"; then
    ok
else
    bad "gpu_gemm_bench_emu: $(tail -5 "$TMP/gb.out" "$TMP/gb.err")"
fi

# UNMASK_CUDA_PACK (q|k|v and gate|up each joined into one weight and one product — the default, for a
# model without biases or QK-norm, unquantized MLPs — or only one of them, or none): the bench says which
# ran; every choice gives the same logits bit for bit on the emulator (cuBLAS's summation order on a GPU
# may differ); an unknown value stops the process with a message
if grep -qx 'joined weights, one product each: q|k|v, gate|up (UNMASK_CUDA_PACK=none: separate)' "$TMP/bench_decode.out" &&
    UNMASK_CUDA_PACK=none "$BIN" bench --decode --device cuda:0 --model "$TMP/m" --batch 1 --gen 8 --block 8 --prompt 4 \
        --decoders low_confidence --cache none > "$TMP/bd_split.out" 2> "$TMP/bd_split.err" &&
    grep -qE '^low_confidence +none +1 ' "$TMP/bd_split.out" && ! grep -q '^joined weights' "$TMP/bd_split.out"; then
    ok
else
    bad "UNMASK_CUDA_PACK in bench --decode: $(grep 'joined' "$TMP/bench_decode.out" "$TMP/bd_split.out"; tail -3 "$TMP/bd_split.err")"
fi
"$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$TMP/pack_all.npy" --device cuda:0 > /dev/null 2> "$TMP/pack.err"
for mode in qkv gate_up none; do
    if UNMASK_CUDA_PACK=$mode "$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$TMP/pack_$mode.npy" --device cuda:0 \
            > /dev/null 2>> "$TMP/pack.err" && cmp -s "$TMP/pack_all.npy" "$TMP/pack_$mode.npy"; then
        ok
    else
        bad "UNMASK_CUDA_PACK=$mode vs all: $(tail -3 "$TMP/pack.err"; cmp "$TMP/pack_all.npy" "$TMP/pack_$mode.npy")"
    fi
done
UNMASK_CUDA_PACK=split "$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$TMP/pack_bad.npy" --device cuda:0 > /dev/null 2> "$TMP/pack_bad.err"
rc=$?
if [ $rc -eq 0 ] || ! grep -q 'UNMASK_CUDA_PACK=split: expected all (the default), qkv, gate_up or none' "$TMP/pack_bad.err"; then
    bad "UNMASK_CUDA_PACK=split: rc $rc: $(tail -3 "$TMP/pack_bad.err")"
else
    ok
fi

# --cuda-skinny (the products of <= 64 rows on the weight-streaming kernel, or bf16 on cuBLAS): a bad
# value is a flag error; on and off agree as two GPU paths do (compare_logits.py: rel <= 2e-2, same
# argmax on decisive rows)
"$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$TMP/sk.npy" --device cuda:0 --cuda-skinny fast > /dev/null 2> "$TMP/sk.err"
rc=$?
if [ $rc -ne 2 ] || ! grep -q "^error: --cuda-skinny must be on or off, got 'fast'$" "$TMP/sk.err"; then
    bad "--cuda-skinny fast: rc $rc: $(cat "$TMP/sk.err")"
else
    ok
fi
if "$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$TMP/sk_on.npy" --device cuda:0 --cuda-skinny on > /dev/null 2> "$TMP/sk.err" &&
    "$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$TMP/sk_off.npy" --device cuda:0 --cuda-skinny off > /dev/null 2>> "$TMP/sk.err" &&
    "$PY" "$COMPARE" "$TMP/sk_off.npy" "$TMP/sk_on.npy" > "$TMP/sk.cmp"; then
    ok
else
    bad "--cuda-skinny on / off: $(cat "$TMP/sk.cmp"; tail -3 "$TMP/sk.err")"
fi

# FP8 weights on the emulated GPU (the skinny kernel's FP8 paths, docs/gpu.md): a checkpoint stored in
# FP8 with 128 x 128 block scales (make-model --fp8) against the CPU, which dequantizes it on the host
# (compare_logits.py); --quant fp8 of the bf16 checkpoint (per output channel, quantized on the
# device) against its bf16 logits: the E4M3 rounding of every weight (relative L2 ~5e-2 on these
# random weights; a wrong scale is O(1)), the argmax kept on decisive rows; and a device-loop decode
# with FP8 weights (dual cache, graphs)
if "$BIN" make-model --out "$TMP/m8" --quiet --n-heads 4 --n-kv-heads 2 --fp8 &&
    "$BIN" logits --model "$TMP/m8" --tokens "$TOK" --out "$TMP/f8_cpu.npy" > /dev/null 2> "$TMP/f8.err" &&
    "$BIN" logits --model "$TMP/m8" --tokens "$TOK" --out "$TMP/f8_gpu.npy" --device cuda:0 > /dev/null 2>> "$TMP/f8.err" &&
    "$PY" "$COMPARE" "$TMP/f8_cpu.npy" "$TMP/f8_gpu.npy" > "$TMP/f8.cmp"; then
    ok
else
    bad "FP8 checkpoint on cuda:0 vs CPU: $(cat "$TMP/f8.cmp" 2>/dev/null; tail -3 "$TMP/f8.err")"
fi
if "$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$TMP/q8_gpu.npy" --device cuda:0 --quant fp8 > /dev/null 2> "$TMP/q8.err" &&
    "$BIN" logits --model "$TMP/m" --tokens "$TOK" --out "$TMP/b16_gpu.npy" --device cuda:0 > /dev/null 2>> "$TMP/q8.err" &&
    out=$("$PY" - "$TMP/b16_gpu.npy" "$TMP/q8_gpu.npy" <<'EOF2'
import sys
import numpy as np
a, b = np.load(sys.argv[1]).astype(np.float64), np.load(sys.argv[2]).astype(np.float64)
rel = np.linalg.norm(b - a) / np.linalg.norm(a)
top2 = np.sort(a, axis=1)[:, -2:]
decisive = top2[:, 1] - top2[:, 0] > 2 * np.abs(b - a).max(axis=1)
agree = np.argmax(a, axis=1) == np.argmax(b, axis=1)
print(f"rel {rel:.3g}, decisive {decisive.sum()}, agree {agree[decisive].sum()}")
sys.exit(0 if 1e-3 < rel < 0.1 and agree[decisive].all() else 1)
EOF2
    ); then
    ok
else
    bad "--quant fp8 on cuda:0 vs bf16: ${out:-} $(tail -3 "$TMP/q8.err")"
fi
if "$BIN" bench --decode --device cuda:0 --model "$TMP/m" --batch 2 --gen 16 --block 8 --prompt 6 --decoders threshold \
    --cache dual --quant fp8 > "$TMP/bd8.out" 2> "$TMP/bd8.err" &&
    grep -qE '^threshold +dual +2 +[1-9]' "$TMP/bd8.out" && grep -qE '^device loop: [1-9][0-9]* steps, [1-9][0-9]* graph captures' "$TMP/bd8.out"; then
    ok
else
    bad "bench --decode --device cuda:0 --quant fp8: $(tail -4 "$TMP/bd8.out" "$TMP/bd8.err")"
fi

# ---------------------------------------------------------------- serve on two emulated GPUs
# two engines (one per device), concurrent completions batched by the engines' device loops
SERVE_PID=
stop_server() { if [ -n "$SERVE_PID" ]; then kill "$SERVE_PID" 2>/dev/null; wait "$SERVE_PID" 2>/dev/null; SERVE_PID=; fi; }
trap 'stop_server; rm -rf "$TMP"' EXIT
UNMASK_EMU_DEVICES=2 "$BIN" serve --store memory --model "$TMP/m" --port 0 --gpus 0,1 > "$TMP/serve.out" 2> "$TMP/serve.err" &
SERVE_PID=$!
URL=
for _ in $(seq 1 300); do   # polls the server's own output for its URL, then for "model ready"
    URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$TMP/serve.out" | head -1)
    [ -n "$URL" ] && grep -q "model ready" "$TMP/serve.err" && break
    kill -0 "$SERVE_PID" 2>/dev/null || break
    sleep 0.1
done
if [ -n "$URL" ] && grep -q "2 engines" "$TMP/serve.err"; then
    if out=$("$PY" - "$URL" <<'EOF'
import json, sys, threading, urllib.request
url = sys.argv[1] + "/v1/completions"
res = [None] * 6
def go(i):
    body = json.dumps({"prompt": f"hello {i}", "max_tokens": 24}).encode()
    req = urllib.request.Request(url, body, {"content-type": "application/json"})
    res[i] = json.load(urllib.request.urlopen(req, timeout=120))
ts = [threading.Thread(target=go, args=(i,)) for i in range(6)]
[t.start() for t in ts]
[t.join() for t in ts]
good = sum(r is not None and r["usage"]["completion_tokens"] == 24 and r["choices"][0]["finish_reason"] == "length"
           for r in res)
print(f"{good}/6 completions with 24 tokens")
sys.exit(0 if good == 6 else 1)
EOF
    ); then ok; echo "serve --gpus 0,1: $out"; else bad "serve --gpus 0,1: $out $(tail -5 "$TMP/serve.err")"; fi
else
    bad "serve --gpus 0,1 (UNMASK_EMU_DEVICES=2) did not come up: $(tail -5 "$TMP/serve.err")"
fi
stop_server

# ---------------------------------------------------------------- host-side error paths
expect() { # name, needle, env... cmd...: fails cleanly (exit 1..127, no abort) naming the needle
    local name="$1" needle="$2"; shift 2
    local out rc; out=$(env "$@" 2>&1); rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && printf '%s' "$out" | grep -qF -- "$needle"; then ok; else bad "$name: rc=$rc out=$out"; fi
}
expect no-room "not enough free device memory" UNMASK_EMU_MEM_BYTES=100000000 "$BIN" logits --model "$TMP/m" --tokens 1,2,3 --out "$TMP/x.npy" --device cuda:0
expect no-fit "does not fit" UNMASK_EMU_MEM_BYTES=300000000 "$BIN" logits --model "$TMP/m" --tokens 1,2,3 --out "$TMP/x.npy" --device cuda:0
expect no-device "no CUDA device" UNMASK_EMU_DEVICES=0 "$BIN" logits --model "$TMP/m" --tokens 1,2,3 --out "$TMP/x.npy" --device cuda:0
expect out-of-range "only 1 CUDA device" UNMASK_EMU_DEVICES=1 "$BIN" generate --model "$TMP/m" --prompt-ids 1,2 --gen-length 4 --block-length 4 --device cuda:1

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
