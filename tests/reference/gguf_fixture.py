"""gguf_fixture.py — tests/fixtures/gguf/vectors.gguf: a small GGUF file written by gguf_write.py for
the C unit test tests/unit/test_gguf.c, which parses it and checks util/quant.c against it.

It holds one metadata key of every value type (and arrays of integers and strings), a float32
tensor "x" [48 rows, 64 columns] whose rows include the quantizers' edge cases (an all-zero block,
halves that C's roundf rounds away from zero, the largest magnitude negative, two largest
magnitudes of opposite sign, values that reach the Q4_0 clamp, scales below the f16 range and past
it), and "x.q8_0" / "x.q4_0": the same rows quantized by gguf_write.py's NumPy quantizers.
test_gguf_quant.py checks that running this script reproduces the committed file byte for byte.

Usage: python3 gguf_fixture.py [OUT]  (default: the committed path)
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_write as gw  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PATH = os.path.join(ROOT, "tests", "fixtures", "gguf", "vectors.gguf")


def vectors():
    """The float32 rows [48, 64]."""
    rng = np.random.default_rng(2024)
    x = rng.standard_normal((48, 64)).astype(np.float32)
    x[1, :32] = 0                                   # an all-zero block
    x[2, :32] = np.arange(32, dtype=np.float32) - 15.5   # x / d lands on halves: d = 16.5 / 127
    x[2, 0] = -127.0                                # ... with d = 1: exact halves below
    x[2, 1:9] = [2.5, -2.5, 3.5, -3.5, 0.5, -0.5, 126.5, -126.5]
    x[3, :32] = rng.standard_normal(32) * 0.1
    x[3, 7] = -4.0                                  # the largest magnitude is negative
    x[4, :32] = rng.standard_normal(32) * 0.1
    x[4, 3], x[4, 20] = 2.0, -2.0                   # two largest magnitudes, opposite signs: the first wins
    x[5, :32] = np.linspace(-1, 1, 32)              # Q4_0: the clamp at 15 (x / d + 8.5 reaches 16.5)
    x[6, :32] = rng.standard_normal(32) * 1e-7      # scales below the f16 normal range
    x[7, :32] = rng.standard_normal(32) * 1e7       # scales past the f16 range (inf)
    x[8, 32:] = 1e-30                               # tiny but non-zero
    return x


def build():
    w = gw.Writer()
    w.add("general.architecture", gw.STRING, "vectors")
    w.add("test.u8", gw.U8, 200)
    w.add("test.i8", gw.I8, -100)
    w.add("test.u16", gw.U16, 60000)
    w.add("test.i16", gw.I16, -30000)
    w.add("test.u32", gw.U32, 4000000000)
    w.add("test.i32", gw.I32, -2000000000)
    w.add("test.f32", gw.F32, 0.15625)
    w.add("test.bool", gw.BOOL, True)
    w.add("test.string", gw.STRING, "naïve ✓")
    w.add("test.u64", gw.U64, 2 ** 63 + 5)
    w.add("test.i64", gw.I64, -(2 ** 40))
    w.add("test.f64", gw.F64, -2.5e-300)
    w.add_array("test.ints", gw.I32, [3, -1, 7])
    w.add_array("test.strings", gw.STRING, ["a", "", "bc d"])
    w.add("general.alignment", gw.U32, 64)
    x = vectors()
    w.add_tensor("x", [64, 48], gw.T_F32, gw.encode(x, gw.T_F32))
    with np.errstate(over="ignore"):
        w.add_tensor("x.q8_0", [64, 48], gw.T_Q8_0, gw.encode(x, gw.T_Q8_0))
        w.add_tensor("x.q4_0", [64, 48], gw.T_Q4_0, gw.encode(x, gw.T_Q4_0))
    return w.to_bytes()


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else PATH
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "wb") as f:
        f.write(build())
