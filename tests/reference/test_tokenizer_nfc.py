#!/usr/bin/python3
"""test_tokenizer_nfc.py — the tokenizer's NFC normalizer against Python's unicodedata (an
independent implementation over the same Unicode version as the generated tables).

A tokenizer.json with an NFC normalizer and byte-level BPE is lossless apart from normalization,
so detokenize(tokenize(s)) must equal unicodedata.normalize('NFC', s) for every string: all
code points of planes 0-1 in order, random sequences of starters and combining marks, Hangul
jamo runs and canonical-reordering cases.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import unicodedata

BIN = os.environ["UNMASK_BIN"]
TMP = os.path.join(os.environ["UNMASK_TEST_TMP"], "nfc-%d" % os.getpid())


def run(args, **kw):
    r = subprocess.run([BIN] + args, capture_output=True, **kw)
    if r.returncode != 0:
        sys.exit("unmask %s failed: %s" % (args[0], r.stderr.decode(errors="replace")))
    return r.stdout


def main():
    os.makedirs(TMP, exist_ok=True)
    model = os.path.join(TMP, "model")
    run(["make-model", "--out", model, "--quiet"])
    with open(os.path.join(model, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    tj["normalizer"] = {"type": "NFC"}
    tj["added_tokens"] = []
    tdir = os.path.join(TMP, "nfc-tokenizer")
    os.makedirs(tdir, exist_ok=True)
    with open(os.path.join(tdir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f)

    cps = [c for c in range(0x20000) if not 0xD800 <= c < 0xE000]
    texts = ["".join(chr(c) for c in cps[i:i + 64]) for i in range(0, len(cps), 64)]
    marks = [c for c in range(0x300, 0x370)] + [0x0323, 0x0338, 0x05B0, 0x0E48, 0x093C, 0x3099, 0x309A, 0x1DCE]
    starters = [ord(c) for c in "aeiouAEOUnNcCsSzZyYwWkKαωΑιυεηοАеиуКガか"] + [0x1100, 0x1161, 0x11A8, 0xAC00, 0x0B47,
                                                                            0x0B3E, 0x0DD9, 0x0DCF, 0x212B, 0x2126]
    rng = random.Random(1234)
    for _ in range(3000):
        s = []
        for _ in range(rng.randint(1, 8)):
            s.append(chr(rng.choice(starters)))
            s.extend(chr(rng.choice(marks)) for _ in range(rng.randint(0, 4)))
        texts.append("".join(s))
    for _ in range(500):  # Hangul jamo runs: L V T combinations
        texts.append("".join(chr(rng.choice([rng.randint(0x1100, 0x1112), rng.randint(0x1161, 0x1175),
                                             rng.randint(0x11A8, 0x11C2), 0xAC00 + rng.randint(0, 11171)]))
                             for _ in range(rng.randint(1, 10))))

    src = os.path.join(TMP, "texts.jsonl")
    with open(src, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps(t) + "\n")
    ids = run(["tokenize", "--model", tdir, "--jsonl", src]).decode().split("\n")[:-1]
    idf = os.path.join(TMP, "ids.jsonl")
    with open(idf, "w") as f:
        for line in ids:
            f.write("[" + line + "]\n")
    back = [json.loads(l) for l in run(["detokenize", "--model", tdir, "--jsonl", idf]).decode().split("\n")[:-1]]
    assert len(back) == len(texts), (len(back), len(texts))
    bad = 0
    for t, b in zip(texts, back):
        want = unicodedata.normalize("NFC", t)
        if b != want:
            bad += 1
            if bad <= 5:
                print("MISMATCH for %r:\n  ours %r\n  want %r" % (t[:40], b[:40], want[:40]))
    print("%d strings, %d mismatches (Unicode %s)" % (len(texts), bad, unicodedata.unidata_version))
    shutil.rmtree(TMP, ignore_errors=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
