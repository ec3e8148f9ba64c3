"""st_read.py — a minimal, independent safetensors reader for the NumPy reference tests.

Written from docs/model-spec.md §3 (8-byte little-endian header length, JSON header,
data_offsets relative to the byte buffer after the header). Returns float64 arrays for F32, BF16
(uint16 << 16 viewed as float32) and F16; other dtypes raise. Knows nothing about model layouts.
"""
import json
import os

import numpy as np


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


def read_checkpoint(model_dir):
    """All tensors of a checkpoint directory (single file or index + shards), as float64."""
    return {k: a.astype(np.float64) for k, (_, a) in read_checkpoint_raw(model_dir).items()}
