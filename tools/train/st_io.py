"""st_io.py — write an F32 safetensors file and read F32/BF16 ones back (docs/model-spec.md §3:
8-byte little-endian header size, JSON header, data_offsets relative to the data section, tensors
tiling the data in order). Only what export.py and evaluate.py need."""
import json

import numpy as np


def write_f32(path, tensors):
    """tensors: {name: array-like}; written in name order as little-endian float32."""
    header, blobs, at = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(np.asarray(tensors[name], dtype="<f4"))
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + a.nbytes]}
        blobs.append(a.tobytes())
        at += a.nbytes
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as fp:
        fp.write(len(h).to_bytes(8, "little"))
        fp.write(h)
        for b in blobs:
            fp.write(b)


def read(path):
    """{name: float32 ndarray} for F32 / BF16 / F16 tensors."""
    with open(path, "rb") as fp:
        raw = fp.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        buf = raw[8 + n + b:8 + n + e]
        if info["dtype"] == "F32":
            a = np.frombuffer(buf, dtype="<f4")
        elif info["dtype"] == "BF16":
            a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "F16":
            a = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        else:
            raise ValueError(f"{path}: {name}: unsupported dtype {info['dtype']}")
        out[name] = a.reshape(info["shape"]).copy()
    return out
