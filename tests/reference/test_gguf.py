"""test_gguf.py — `--model FILE.gguf`: make-model checkpoints written as GGUF the way llama.cpp's
converter writes them (gguf_convert.py, an independent writer from the GGUF spec) give what the
safetensors directories give.

Forward: `unmask logits` on the GGUF file equals the directory's bit for bit when every matrix has
the same dtype in both (f32 -> F32, bf16 -> BF16, f16 -> F16; vectors are F32 in GGUF, which the
backends read as the same values), for llada (tiny, GQA, tied head), dream (tiny, tied) and llada-moe
(tiny, with a leading dense layer and an expert bias), on the fp32 CPU kernels and — but the MoE
router, which the converter always stores F32 — the default ones; tensor parallel too. A file
whose LLaDA q/k rows are NOT permuted (not what the converter writes) must differ: the loader
undoes the permutation.
Tokenizer: `unmask tokenize` / `detokenize` / chat rendering from the GGUF metadata equal the
directory's tokenizer files on a corpus, for the three built-in tokenizers and for the real
Dream-7B vocabulary (tests/fixtures, 151k tokens, a vocabulary-only GGUF); an unknown
tokenizer.ggml.pre falls back on the architecture's split with a warning.
Generation: `unmask generate` from the GGUF file (mask / eos ids from the metadata) equals the
directory's, from token ids, a text prompt and a chat message (GGUF files carry no
generation_config.json: Dream's decoder is named on the command line).
Prints one line per check and "N passed, N failed".
"""
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_convert as gc  # noqa: E402
import gguf_write as gw  # noqa: E402
from cli_run import BIN, Reporter, tmp_dir  # noqa: E402

TMP = tmp_dir("test_gguf")
report = Reporter()


def make(name, preset, dtype, args=()):
    out = os.path.join(TMP, name)
    subprocess.run([BIN, "make-model", "--out", out, "--preset", preset, "--quiet", "--dtype", dtype] + list(args),
                   check=True)
    return out


def logits(model, tokens, kernels="fp32", extra=()):
    out = os.path.join(TMP, "out.npy")
    if os.path.exists(out):
        os.remove(out)
    cmd = [BIN, "logits", "--model", model, "--tokens", ",".join(map(str, tokens)), "--out", out, "--threads", "2",
           "--cpu-kernels", kernels] + list(extra)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return np.load(out)


def same(a, b):
    return a.shape == b.shape and np.array_equal(a, b)


TOKENS = [int(t) for t in np.random.default_rng(3).integers(0, 1300, size=23)]

# ---------------------------------------------------------------- forward, bit for bit

CASES = [  # name, preset, make-model args
    ("llada tiny", "tiny", []),
    ("llada GQA 2:1", "tiny", ["--n-kv-heads", "2", "--seed", "5"]),
    ("llada tied head", "tiny", ["--weight-tying", "--seed", "6"]),
    ("dream tiny", "dream-tiny", []),
    ("dream tied head", "dream-tiny", ["--weight-tying", "--seed", "7"]),
    ("llada-moe tiny", "lladamoe-tiny", []),
    ("llada-moe dense layer 0 + expert bias", "lladamoe-tiny", ["--first-dense", "1", "--expert-bias", "1", "--n-layers", "3"]),
]
for name, preset, args in CASES:
    for dtype in ("f32", "bf16", "f16"):
        tag = f"{name} {dtype}".replace(" ", "_").replace(":", "").replace("+", "")
        d = make(tag, preset, dtype, args)
        g = d + ".gguf"
        gc.convert(d, g, dtype)
        kernels = ["fp32"] if (preset.startswith("lladamoe") and dtype == "bf16") else ["fp32", "auto"]
        for k in kernels:
            a, b = logits(d, TOKENS, k), logits(g, TOKENS, k)
            report(same(a, b), f"logits {name}, {dtype} -> GGUF {dtype.upper()}, {k} kernels",
                   f"max |diff| {float(np.max(np.abs(a - b))) if a.shape == b.shape else 'shape'}")

# a bf16 checkpoint converted with --outtype f32: the same values, so identical on the fp32 kernels
d = os.path.join(TMP, "llada_tiny_bf16")
gc.convert(d, os.path.join(TMP, "bf16_as_f32.gguf"), "f32")
report(same(logits(d, TOKENS), logits(os.path.join(TMP, "bf16_as_f32.gguf"), TOKENS)),
       "logits llada tiny, bf16 -> GGUF F32, fp32 kernels")

d = os.path.join(TMP, "llada_tiny_f32")
a = logits(d, TOKENS, extra=["--tp", "2"])
b = logits(d + ".gguf", TOKENS, extra=["--tp", "2"])
report(same(a, b), "logits llada tiny --tp 2 (row slices of the un-permuted q/k)")
d = os.path.join(TMP, "dream_tiny_f32")
report(same(logits(d, TOKENS, extra=["--tp", "2"]), logits(d + ".gguf", TOKENS, extra=["--tp", "2"])),
       "logits dream tiny --tp 2")

# the loader undoes the converter's q/k permutation: a file without it is a different model
d = os.path.join(TMP, "llada_GQA_21_f32")
raw = os.path.join(TMP, "unpermuted.gguf")
gc.convert(d, raw, "f32", permute_qk=False)
a, b = logits(d, TOKENS), logits(raw, TOKENS)
rel = float(np.max(np.abs(a - b)) / np.max(np.abs(a)))
report(rel > 1e-2, "q/k permutation is undone (a file without it differs)", f"rel diff {rel:.2e}")

# ---------------------------------------------------------------- tokenizer

CORPUS = [
    "Hello world! It's a test, isn't it? We'LL see; they'D say 'RE.",
    "  leading spaces\tand\ttabs\n\nnewlines\r\n and trailing   ",
    "digits 1 12 123 1234 12345 3.14159 0x1F 1,000,000",
    "naïve café résumé — “quotes” ‘single’ … ellipsis",
    "decomposed e\u0301 and composed \u00e9; Å vs A\u030a",
    "中文字符和日本語のテキスト, 한국어 텍스트",
    "emoji 😀🎉👍🏽 and symbols ∑∫√ ≤≥ → ⇒",
    "special tokens inline: <|endoftext|> <|mask|> <|mdm_mask|> <|im_start|>user<|im_end|> <|eot_id|> <role>",
    "code: def f(x):\n    return x ** 2  # comment\n\tif (a && b) { c++; }",
    "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "a" * 300 + " " + "ab" * 100,
    "",
]


def tokenize_lines(model, lines, extra=()):
    path = os.path.join(TMP, "corpus.jsonl")
    with open(path, "w") as f:
        for s in lines:
            f.write(json.dumps(s) + "\n")
    r = subprocess.run([BIN, "tokenize", "--model", model, "--jsonl", path] + list(extra), capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def check_tokenizer(name, model_dir, gguf):
    a, b = tokenize_lines(model_dir, CORPUS), tokenize_lines(gguf, CORPUS)
    report(a[0] == 0 and b[0] == 0 and a[1] == b[1] and a[1].count("\n") == len(CORPUS),
           f"tokenize {name}: GGUF == tokenizer files ({len(CORPUS)} texts)", b[2].strip()[:200])
    a, b = tokenize_lines(model_dir, CORPUS, ["--no-special"]), tokenize_lines(gguf, CORPUS, ["--no-special"])
    report(a[0] == 0 and a[1] == b[1], f"tokenize {name} --no-special: GGUF == tokenizer files")
    ids = ",".join(a[1].splitlines()[7].split(",")[:40])
    r1 = subprocess.run([BIN, "detokenize", "--model", model_dir, "--ids", ids], capture_output=True, text=True)
    r2 = subprocess.run([BIN, "detokenize", "--model", gguf, "--ids", ids], capture_output=True, text=True)
    report(r1.returncode == 0 and r1.stdout == r2.stdout, f"detokenize {name}: GGUF == tokenizer files")


def check_chat(name, model_dir, gguf):
    msgs = os.path.join(TMP, "msgs.json")
    with open(msgs, "w") as f:
        json.dump([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "  What is 2+2?  "},
                   {"role": "assistant", "content": "4"}, {"role": "user", "content": "and <|eot_id|> 3+3?"}], f)
    out = []
    for m in (model_dir, gguf):
        r = subprocess.run([BIN, "tokenize", "--model", m, "--chat", msgs, "--render"], capture_output=True, text=True)
        i = subprocess.run([BIN, "tokenize", "--model", m, "--chat", msgs], capture_output=True, text=True)
        out.append((r.returncode, r.stdout, i.returncode, i.stdout))
    report(out[0][0] == 0 and out[0][1] and out[0][1:] == out[1][1:], f"chat template {name}: GGUF == tokenizer_config.json",
           repr(out[1][1][:80]))


for name, tag in (("llada tiny", "llada_tiny_f32"), ("dream tiny", "dream_tiny_f32"), ("llada-moe tiny", "llada-moe_tiny_f32")):
    d = os.path.join(TMP, tag)
    check_tokenizer(name, d, d + ".gguf")
    check_chat(name, d, d + ".gguf")

# the real Dream-7B vocabulary (vocab.json + merges.txt + added tokens), as a vocabulary-only GGUF
FIX = os.path.join(os.environ.get("UNMASK_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                   "tests", "fixtures", "dream-7b-instruct")
dv = os.path.join(TMP, "dream7b-vocab.gguf")
gc.convert(FIX, dv, vocab_only=True)
check_tokenizer("Dream-7B vocabulary (151k tokens)", FIX, dv)
check_chat("Dream-7B", FIX, dv)

# an unknown tokenizer.ggml.pre: the architecture's split, with a warning
d = os.path.join(TMP, "llada_tiny_f32")
odd = os.path.join(TMP, "oddpre.gguf")
gc.convert(d, odd, "f32", pre="some-future-name")
a, b = tokenize_lines(d, CORPUS), tokenize_lines(odd, CORPUS)
report(a[1] == b[1] and "some-future-name" in b[2], "unknown tokenizer.ggml.pre: the llada family's split, warned",
       b[2].strip()[:160])

# ---------------------------------------------------------------- generation


def generate(model, flags):
    cmd = [BIN, "generate", "--model", model, "--json", "--threads", "1", "--cpu-kernels", "fp32"] + flags
    r = subprocess.run(cmd, capture_output=True, text=True)
    ev = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    for e in ev:
        e.pop("timings", None)   # wall-clock times
    return r.returncode, ev, r.stderr


chat = os.path.join(TMP, "hello.json")
with open(chat, "w") as f:
    json.dump([{"role": "user", "content": "hello there"}], f)
# A GGUF file carries no generation_config.json: Dream's (alg "origin") is given as a flag.
for name, tag, dec in (("llada tiny", "llada_tiny_bf16", []), ("dream tiny", "dream_tiny_bf16", ["--decoder", "origin"]),
                       ("llada-moe tiny", "llada-moe_tiny_bf16", [])):
    d = os.path.join(TMP, tag)
    for what, flags in (("prompt ids", ["--prompt-ids", "5,6,7,8,9", "--gen-length", "16", "--steps", "8"]),
                        ("text prompt", ["--prompt", "The quick brown fox", "--gen-length", "16", "--steps", "8"]),
                        ("chat message", ["--messages", chat, "--gen-length", "16", "--steps", "8"])):
        ra, ea, sa = generate(d, flags + dec)
        rb, eb, sb = generate(d + ".gguf", flags + dec)
        report(ra == 0 and rb == 0 and ea == eb and len(ea) > 2, f"generate {name} from {what}: GGUF == directory",
               sb.strip()[:200])

sys.exit(report.finish())
