"""gguf_write.py — an independent GGUF writer for the tests, written from the GGUF specification
(ggml's docs/gguf.md), and NumPy implementations of the Q8_0 / Q4_0 block quantization it defines.

File layout (little-endian): magic "GGUF", u32 version, u64 tensor count, u64 metadata count, the
metadata {string key, u32 value type, value}, the tensor infos {string name, u32 rank, u64 dims
(innermost first), u32 type, u64 offset}, padding to the alignment (general.alignment, default 32),
then the data section, each tensor at an aligned offset from its start. A string is a u64 length and
its bytes; an array is a u32 element type, a u64 count and the elements.

Knows nothing about models (gguf_convert.py does) and nothing of unmask's C code: the tests compare
what unmask reads from these files with what they were written from.
"""
import struct

import numpy as np

# metadata value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B", U64: "<Q",
        I64: "<q", F64: "<d"}

# tensor types (ggml type ids) and their (elements, bytes) per block
T_F32, T_F16, T_Q4_0, T_Q8_0, T_Q4_K, T_Q6_K, T_BF16 = 0, 1, 2, 8, 12, 14, 30
TYPE_BLOCK = {T_F32: (1, 4), T_F16: (1, 2), T_Q4_0: (32, 18), T_Q8_0: (32, 34), T_Q4_K: (256, 144),
              T_Q6_K: (256, 210), T_BF16: (1, 2)}
TYPE_NAME = {T_F32: "F32", T_F16: "F16", T_Q4_0: "Q4_0", T_Q8_0: "Q8_0", T_Q4_K: "Q4_K", T_Q6_K: "Q6_K",
             T_BF16: "BF16"}
# Types the writer cannot encode, for refusal tests only (zero bytes of the type's block size): the
# spec's id, name and (elements, bytes) per block.
REFUSED_TYPES = {3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 10: ("Q2_K", 256, 84),
                 11: ("Q3_K", 256, 110), 13: ("Q5_K", 256, 176), 16: ("IQ2_XXS", 256, 66), 20: ("IQ4_NL", 32, 18),
                 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 28: ("F64", 1, 8), 35: ("TQ2_0", 256, 66),
                 39: ("MXFP4", 32, 17)}
for _id, (_name, _el, _by) in REFUSED_TYPES.items():
    TYPE_BLOCK[_id] = (_el, _by)
    TYPE_NAME[_id] = _name
REFUSED_TYPES.update({T_Q4_K: ("Q4_K", 256, 144), T_Q6_K: ("Q6_K", 256, 210)})


def _str(s):
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def _value(vtype, v):
    if vtype == STRING:
        return _str(v)
    return struct.pack(_FMT[vtype], v)


class Writer:
    """Collects metadata and tensors, then serializes them (to_bytes / write)."""

    def __init__(self):
        self.kv = []        # (key, type, value, element type)
        self.tensors = []   # (name, dims innermost first, type, data bytes)

    def add(self, key, vtype, value, arr_type=None):
        self.kv.append((key, vtype, value, arr_type))

    def add_array(self, key, arr_type, values):
        self.kv.append((key, ARRAY, list(values), arr_type))

    def add_tensor(self, name, dims, ttype, data):
        """dims innermost first (GGUF order); data: the raw bytes of the tensor."""
        self.tensors.append((name, list(dims), ttype, bytes(data)))

    def metadata_bytes(self):
        out = []
        for key, vtype, value, at in self.kv:
            out.append(_str(key) + struct.pack("<I", vtype))
            if vtype == ARRAY:
                out.append(struct.pack("<IQ", at, len(value)))
                if at == STRING:
                    out.extend(_str(v) for v in value)
                else:
                    out.append(np.asarray(value, dtype=np.dtype(_FMT[at])).tobytes())
            else:
                out.append(_value(vtype, value))
        return b"".join(out)

    def to_bytes(self, version=3, alignment=None, offset_fn=None):
        """The file. alignment: the data alignment to use (default: general.alignment if set, else 32);
        offset_fn(i, offset) -> the offset recorded for tensor i (for corrupt files; default: its own)."""
        if alignment is None:
            alignment = next((v for k, t, v, _ in self.kv if k == "general.alignment"), 32)
        head = [b"GGUF", struct.pack("<IQQ", version, len(self.tensors), len(self.kv)), self.metadata_bytes()]
        offset = 0
        infos, datas = [], []
        for name, dims, ttype, data in self.tensors:
            rec = offset_fn(len(infos), offset) if offset_fn else offset
            infos.append(_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) +
                         struct.pack("<IQ", ttype, rec))
            pad = (-len(data)) % alignment
            datas.append(data + b"\0" * pad)
            offset += len(data) + pad
        head.extend(infos)
        h = b"".join(head)
        h += b"\0" * ((-len(h)) % alignment)
        return h + b"".join(datas)

    def write(self, path, **kw):
        with open(path, "wb") as f:
            f.write(self.to_bytes(**kw))


# ---------------------------------------------------------------- element and block types

def to_bf16_bits(x):
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return r.astype(np.uint16)


def bf16_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _roundf(v):
    """C roundf: halves away from zero (np.round rounds them to even)."""
    return np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))


def quantize_q8_0(x):
    """rows of float32 (last dim a multiple of 32) -> Q8_0 bytes: per block an f16 scale d = max|x| / 127
    and 32 int8 round(x / d)."""
    x = np.asarray(x, dtype=np.float32)
    b = x.reshape(-1, 32)
    amax = np.max(np.abs(b), axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = _roundf((b * inv[:, None]).astype(np.float32)).astype(np.int8)
    out = np.zeros((b.shape[0], 34), dtype=np.uint8)
    out[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def quantize_q4_0(x):
    """rows of float32 -> Q4_0 bytes: per block d = (the value of largest magnitude) / -8 and 32 4-bit
    q = min(15, trunc(x / d + 8.5)), element j in the low nibble of byte j, element j + 16 in its high nibble."""
    x = np.asarray(x, dtype=np.float32)
    b = x.reshape(-1, 32)
    idx = np.argmax(np.abs(b), axis=1)                 # first of the largest magnitudes
    vmax = b[np.arange(b.shape[0]), idx]
    d = (vmax / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (b * inv[:, None]).astype(np.float32) + np.float32(8.5)
    q = np.minimum(15, np.trunc(v).astype(np.int8)).astype(np.uint8)
    out = np.zeros((b.shape[0], 18), dtype=np.uint8)
    out[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    return out.tobytes()


def dequantize(data, ttype, n):
    """Q8_0 / Q4_0 bytes of n elements -> float64."""
    if ttype == T_Q8_0:
        a = np.frombuffer(data, dtype=np.uint8).reshape(-1, 34)
        d = a[:, 0:2].copy().view(np.float16).astype(np.float64)
        q = a[:, 2:].view(np.int8).astype(np.float64)
        return (d * q).reshape(n)
    if ttype == T_Q4_0:
        a = np.frombuffer(data, dtype=np.uint8).reshape(-1, 18)
        d = a[:, 0:2].copy().view(np.float16).astype(np.float64)
        qs = a[:, 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64) - 8
        return (d * q).reshape(n)
    raise ValueError(f"dequantize: type {ttype}")


def encode(x, ttype):
    """float32 array (rows last) -> the bytes of a tensor of ttype."""
    x = np.asarray(x, dtype=np.float32)
    if ttype == T_F32:
        return x.astype("<f4").tobytes()
    if ttype == T_F16:
        return x.astype("<f2").tobytes()
    if ttype == T_BF16:
        return to_bf16_bits(x).astype("<u2").tobytes()
    if ttype == T_Q8_0:
        return quantize_q8_0(x)
    if ttype == T_Q4_0:
        return quantize_q4_0(x)
    raise ValueError(f"encode: type {ttype}")
