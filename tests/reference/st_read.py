"""st_read.py — a minimal, independent safetensors reader for the NumPy reference tests.

Written from docs/model-spec.md §3 (8-byte little-endian header length, JSON header,
data_offsets relative to the byte buffer after the header). Returns float64 arrays for F32, BF16
(uint16 << 16 viewed as float32), F16 and F8_E4M3 (decoded by fp8_e4m3_values, written from the OCP
FP8 definition); other dtypes raise. read_checkpoint dequantizes an FP8 checkpoint (the common
layout: X.weight in F8_E4M3 times its X.weight_scale_inv block scales, config.json's
weight_block_size, 128 x 128 when absent). Knows nothing about model layouts otherwise.
"""
import json
import os

import numpy as np


def fp8_e4m3_values():
    """The 256 E4M3 ("fn") codes as float64, from the definition: sign, 4 exponent bits (bias 7), 3
    mantissa bits; exponent 0 is subnormal (m x 2^-9); S.1111.111 is NaN; no infinities."""
    code = np.arange(256)
    s, e, m = code >> 7, (code >> 3) & 15, code & 7
    v = np.where(e == 0, np.ldexp(m.astype(np.float64), -9), np.ldexp((8 + m).astype(np.float64), e - 10))
    v = np.where(s == 1, -v, v)
    v[(e == 15) & (m == 7)] = np.nan
    return v


def bf16_round(a):
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32)


# How FP8 matrices are dequantized: the value fp8 x scale (in float32), and with FP8_BF16 = True that
# value rounded to bfloat16 (what the CPU backend stores: docs/gpu.md, FP8 weights).
FP8_BF16 = False


def read_file_raw(path):
    """{name: (dtype string, np.ndarray of its own dtype: F32 / F16, BF16 as the float32 values it
    holds; shaped)} for every tensor in one .safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        buf = raw[base + begin:base + end]
        shape = tuple(info["shape"])
        dt = info["dtype"]
        if dt == "F32":
            a = np.frombuffer(buf, dtype="<f4")
        elif dt == "F16":
            a = np.frombuffer(buf, dtype="<f2")
        elif dt == "BF16":
            a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif dt == "F8_E4M3":   # the unscaled values (read_checkpoint applies the block scales)
            a = fp8_e4m3_values().astype(np.float32)[np.frombuffer(buf, dtype=np.uint8)]
        else:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dt}")
        out[name] = (dt, a.reshape(shape))
    return out


def read_file(path):
    """Return {name: np.ndarray(float64)} for every tensor in one .safetensors file."""
    return {k: a.astype(np.float64) for k, (_, a) in read_file_raw(path).items()}


def read_checkpoint_raw(model_dir):
    """All tensors of a checkpoint directory (single file or index + shards), as read_file_raw."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    tensors = {}
    for s in shards:
        part = read_file_raw(os.path.join(model_dir, s))
        for k in part:
            if k in tensors:
                raise ValueError(f"tensor {k} appears in two shards")
        tensors.update(part)
    return tensors


def fp8_block(model_dir):
    """config.json's quantization_config.weight_block_size, or 128 x 128."""
    with open(os.path.join(model_dir, "config.json")) as f:
        q = json.load(f).get("quantization_config") or {}
    return tuple(q.get("weight_block_size") or (128, 128))


def dequantize_fp8(raw, block):
    """raw (read_checkpoint_raw) with every F8_E4M3 matrix X multiplied by its X_scale_inv blocks
    (element [i, j] times scale[i // block[0], j // block[1]], in float32) and the scale tensors
    dropped."""
    out = {}
    for k, (dt, a) in raw.items():
        if k.endswith("_scale_inv") and raw.get(k[:-len("_scale_inv")], ("",))[0] == "F8_E4M3":
            continue
        if dt == "F8_E4M3":
            s = raw[k + "_scale_inv"][1].astype(np.float32)
            full = np.repeat(np.repeat(s, block[0], axis=0), block[1], axis=1)[:a.shape[0], :a.shape[1]]
            a = (a * full).astype(np.float32)
            if FP8_BF16:
                a = bf16_round(a)
            dt = "F32"
        out[k] = (dt, a)
    return out


def read_checkpoint(model_dir):
    """All tensors of a checkpoint directory (single file or index + shards), as float64; FP8
    matrices dequantized (dequantize_fp8)."""
    raw = dequantize_fp8(read_checkpoint_raw(model_dir), fp8_block(model_dir))
    return {k: a.astype(np.float64) for k, (_, a) in raw.items()}
