"""test_fp8.py — FP8 checkpoints (the common layout: E4M3 matrices with F32 weight_scale_inv 128 x 128
block scales) written by `unmask make-model --fp8` and run on the CPU, against NumPy.

1. The writer: make-model --fp8 --weights on chosen f32 values (a block holding every midpoint between
   neighbouring E4M3 values, subnormals, ties at zero, values one float either side) gives exactly
   the scales (amax / 448 per block, the partial blocks at the edges included) and the codes (round
   to nearest even of value / scale) an encoder written here from the OCP definition gives.
2. The loader: `unmask logits` (fp32 kernels) on FP8 checkpoints of every family (LLaDA with
   dimensions that are not multiples of 128, Dream, LLaDA-MoE, LLaDA2 with its fused q|k|v whose k
   and v start inside a block) equals the NumPy references reading the same files, which decode the
   FP8 bytes and apply the block scales themselves (st_read.py): max rel err <= 1e-4 against the
   documented CPU storage (fp8 x scale in f32, rounded to bf16), <= 1e-2 against the exact values (measured 2-6e-3: the bf16 storage),
   and the scales matter (the reference without them is far off). --tp 2 (slices cutting blocks)
   gives the same logits; --quant q8_0 on an FP8 checkpoint runs and stays close.
3. Errors: an FP8 matrix without its weight_scale_inv, or with a scale tensor of the wrong shape, is
   refused at load naming the tensor; --quant fp8 on the CPU is refused (exit 2).
Prints one line per check and "N passed, N failed".
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_read  # noqa: E402
from cli_run import BIN, Reporter, logits, rel_err, tmp_dir  # noqa: E402
from dream_ref import DreamRef  # noqa: E402
from llada_ref import LLaDARef  # noqa: E402
from moe_ref import MoERef  # noqa: E402

TMP = tmp_dir("test_fp8")
report = Reporter()
FP8 = st_read.fp8_e4m3_values()


def encode_e4m3(x):
    """float32 -> E4M3 codes from the definition: the nearest finite value (ties to the even code),
    saturating at +-448, the sign kept."""
    x = np.asarray(x, dtype=np.float32)
    pos = FP8[:0x7F]                     # codes 0x00 .. 0x7e, increasing
    a = np.abs(x.astype(np.float64))
    hi = np.clip(np.searchsorted(pos, a), 1, 0x7E)
    lo = hi - 1
    dlo, dhi = a - pos[lo], pos[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(a >= pos[0x7E], 0x7E, code)
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def write_safetensors(path, tensors):
    """tensors: {name: float32 array}: an F32 safetensors file."""
    header, off, blobs = {}, 0, []
    for k in sorted(tensors):
        b = np.ascontiguousarray(tensors[k], dtype="<f4").tobytes()
        header[k] = {"dtype": "F32", "shape": list(tensors[k].shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def raw_tensors(model_dir):
    """{name: (dtype, bytes, shape)} of a single-file checkpoint, the bytes as stored."""
    buf = open(os.path.join(model_dir, "model.safetensors"), "rb").read()
    n = int.from_bytes(buf[:8], "little")
    hdr = json.loads(buf[8:8 + n])
    return {k: (v["dtype"], buf[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], v["shape"])
            for k, v in hdr.items() if k != "__metadata__"}


def make(name, args):
    out = os.path.join(TMP, name)
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([BIN, "make-model", "--out", out, "--quiet", "--dtype", "f32"] + list(args), check=True)
    return out


def run_logits(model_dir, tokens, extra=()):
    out = os.path.join(TMP, "err.npy")
    return subprocess.run([BIN, "logits", "--model", model_dir, "--tokens", ",".join(map(str, tokens)), "--out", out,
                           "--threads", "2"] + list(extra), capture_output=True, text=True)


# ---------------------------------------------------------------- 1. the writer, against the definition

DIMS = ["--no-tokenizer", "--d-model", "192", "--n-heads", "3", "--n-layers", "2", "--ffn", "336", "--vocab", "300"]
base = make("f32", DIMS)
raw = st_read.read_checkpoint_raw(base)
vals = {k: a.astype(np.float32).copy() for k, (_, a) in raw.items()}
q = vals["model.transformer.blocks.0.q_proj.weight"]
pos = FP8[:0x7F]
mids = ((pos[:-1] + pos[1:]) / 2).astype(np.float32)
special = np.concatenate([pos.astype(np.float32), mids, np.nextafter(mids, np.float32(0)),
                          np.nextafter(mids, np.float32(np.inf)), np.float32([2.0**-10, 3 * 2.0**-10, 2.0**-12, 0.0])])
special = np.concatenate([special, -special])
q[:, :128] = np.clip(q[:, :128], -1.0, 1.0)
q[0, 0] = 448.0                                  # block (0, 0): amax 448, scale exactly 1
q[1:1 + (len(special) + 127) // 128, :128].flat[:len(special)] = special
write_safetensors(os.path.join(TMP, "chosen.safetensors"), vals)
fp8_dir = make("fp8_chosen", DIMS + ["--fp8", "--weights", os.path.join(TMP, "chosen.safetensors")])
got = raw_tensors(fp8_dir)
n_fp8 = bad_codes = bad_scales = 0
for k, (dt, b, shape) in got.items():
    if dt != "F8_E4M3":
        continue
    n_fp8 += 1
    x = vals[k]
    R, C = x.shape
    gr, gc = -(-R // 128), -(-C // 128)
    amax = np.zeros((gr, gc), np.float32)
    for i in range(gr):
        for j in range(gc):
            amax[i, j] = np.max(np.abs(x[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]))
    want_s = np.where(amax > 0, amax / np.float32(448), np.float32(1)).astype(np.float32)
    s = np.frombuffer(got[k + "_scale_inv"][1], "<f4").reshape(got[k + "_scale_inv"][2])
    bad_scales += int(s.shape != want_s.shape or np.any(s != want_s))
    full = np.repeat(np.repeat(want_s, 128, 0), 128, 1)[:R, :C]
    want_c = encode_e4m3((x / full).astype(np.float32))
    codes = np.frombuffer(b, np.uint8).reshape(R, C)
    bad_codes += int(np.count_nonzero(codes != want_c))
report(n_fp8 == 14 and bad_scales == 0, "make-model --fp8 block scales = amax / 448",
       f"{n_fp8} FP8 matrices, {bad_scales} with other scales")
report(bad_codes == 0, "make-model --fp8 codes = round to nearest even (the definition)",
       f"{bad_codes} codes differ; {len(special)} chosen values incl. every midpoint")
names = set(got)
report("model.transformer.wte.weight" in names and got["model.transformer.wte.weight"][0] == "F32" and
       got["model.transformer.ff_out.weight"][0] == "F32" and got["model.transformer.blocks.0.attn_norm.weight"][0] == "F32",
       "embedding, LM head and norms stay --dtype")
with open(os.path.join(fp8_dir, "config.json")) as f:
    qc = json.load(f).get("quantization_config", {})
report(qc.get("quant_method") == "fp8" and qc.get("fmt") == "e4m3" and qc.get("weight_block_size") == [128, 128],
       "config.json quantization_config", json.dumps(qc))


# ---------------------------------------------------------------- 2. the loader, every family

def check_family(name, model_dir, ref_of, T, seed, extra_ref=()):
    toks = np.random.default_rng(seed).integers(0, 300, size=T)
    ours = logits(TMP, model_dir, toks)
    r = run_logits(model_dir, toks[:4], ["--cpu-kernels", "fp32"])
    report(r.returncode == 0 and "FP8 weight tensors" in r.stderr and "dequantized on the host" in r.stderr,
           f"{name}: the load says the FP8 weights are dequantized on the CPU", r.stderr.strip()[-160:])
    st_read.FP8_BF16 = True
    stored = ref_of(model_dir).forward(toks, *extra_ref)
    st_read.FP8_BF16 = False
    exact = ref_of(model_dir).forward(toks, *extra_ref)
    e1, e2 = rel_err(ours, stored), rel_err(ours, exact)
    report(e1 <= 1e-4 and e2 <= 1e-2, f"{name} FP8 checkpoint logits",
           f"max rel err {e1:.2e} vs fp8 x scale stored as bf16 (tol 1e-4), {e2:.2e} vs exact fp8 x scale (tol 1e-2)")
    return toks, ours


def no_scales(ref_cls):
    """The reference with the block scales ignored (every scale 1): the scales must matter."""
    def make_ref(model_dir):
        keep = st_read.dequantize_fp8

        def unscaled(raw, block):
            raw = {k: ((dt, np.ones_like(a)) if k.endswith("_scale_inv") else (dt, a)) for k, (dt, a) in raw.items()}
            return keep(raw, block)
        st_read.dequantize_fp8 = unscaled
        try:
            return ref_cls(model_dir)
        finally:
            st_read.dequantize_fp8 = keep
    return make_ref


ll = make("llada_fp8", DIMS + ["--fp8", "--seed", "3"])
toks, ours = check_family("llada d192 / ffn 336", ll, LLaDARef, 37, 1)
with np.errstate(over="ignore"):   # unscaled weights are far too large: exp overflows to inf, harmlessly
    e = rel_err(ours, no_scales(LLaDARef)(ll).forward(toks))
report(e > 1e-1, "llada the block scales matter", f"rel diff to the reference without them {e:.2e}")
tp2 = logits(TMP, ll, toks, ["--tp", "3"])   # attn_out / ff_out columns 64 / 112 per rank, ff_proj rows 112
report(rel_err(tp2, ours) <= 1e-5, "llada FP8 --tp 3 (slices starting inside blocks)",
       f"max rel diff to --tp 1 {rel_err(tp2, ours):.2e}")
q8 = logits(TMP, ll, toks, ["--quant", "q8_0"])
st_read.FP8_BF16 = False
exact = LLaDARef(ll).forward(toks)
report(rel_err(q8, exact) <= 3e-2 and rel_err(q8, exact) > 0, "llada --quant q8_0 on an FP8 checkpoint",
       f"max rel err vs exact fp8 x scale {rel_err(q8, exact):.2e} (tol 3e-2)")

dr = make("dream_fp8", ["--preset", "dream-tiny", "--fp8"])
check_family("dream-tiny", dr, DreamRef, 29, 2)
lm = make("lladamoe_fp8", ["--preset", "lladamoe-tiny", "--fp8", "--moe-ffn", "160"])
check_family("lladamoe-tiny (experts of 160)", lm, MoERef, 33, 3)
l2 = make("llada2_fp8", ["--preset", "llada2-tiny", "--fp8"])
toks, ours = check_family("llada2-tiny (fused q|k|v: k, v start inside a block)", l2, MoERef, 40, 4, (32,))
tp2 = logits(TMP, l2, toks, ["--tp", "2"])
report(rel_err(tp2, ours) <= 1e-5, "llada2 FP8 --tp 2", f"max rel diff to --tp 1 {rel_err(tp2, ours):.2e}")


# ---------------------------------------------------------------- 3. errors

def rewrite(src_dir, name, edit):
    """A copy of checkpoint src_dir whose tensors went through edit({name: (dtype, bytes, shape)})."""
    out = os.path.join(TMP, name)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(src_dir, out)
    path = os.path.join(out, "model.safetensors")
    t = raw_tensors(out)
    edit(t)
    header, off, blobs = {}, 0, []
    for k in sorted(t):
        dt, b, shape = t[k]
        header[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))
    return out


VICTIM = "model.transformer.blocks.1.up_proj.weight"
missing = rewrite(ll, "no_scale", lambda t: t.pop(VICTIM + "_scale_inv"))
r = run_logits(missing, [1, 2, 3])
report(r.returncode == 1 and f"'{VICTIM}' is F8_E4M3 but its block scales '{VICTIM}_scale_inv' are missing" in r.stderr,
       "an FP8 matrix without weight_scale_inv is refused naming it", f"rc {r.returncode}: {r.stderr.strip()[-200:]}")


def wrong_shape(t):
    dt, b, shape = t[VICTIM + "_scale_inv"]   # [3, 2] -> [2, 3]: same size, other shape
    t[VICTIM + "_scale_inv"] = (dt, b, [shape[1], shape[0]])


bad = rewrite(ll, "bad_scale", wrong_shape)
r = run_logits(bad, [1, 2, 3])
report(r.returncode == 1 and f"FP8 block scales '{VICTIM}_scale_inv' have shape [2, 3], expected [3, 2]" in r.stderr,
       "a weight_scale_inv of the wrong shape is refused naming it", f"rc {r.returncode}: {r.stderr.strip()[-200:]}")
r = run_logits(ll, [1, 2, 3], ["--quant", "fp8"])
report(r.returncode == 2 and "--quant fp8 needs a CUDA device" in r.stderr and "q8_0 or q4_0" in r.stderr,
       "--quant fp8 on the CPU is refused (exit 2)", f"rc {r.returncode}: {r.stderr.strip()[-200:]}")

sys.exit(report.finish())
