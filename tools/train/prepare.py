#!/usr/bin/python3
"""prepare.py — tokenizer + token streams for train.py, with unmask's own tools.

1. `unmask make-model --tokenizer-only --tokenizer-corpus tokenizer_sample.txt --merges N`: the
   project's byte-level BPE trainer (src/text/bpe_train.c) with LLaDA's special tokens and the
   infilling markers, written as tokenizer.json / tokenizer_config.json.
2. `unmask tokenize --jsonl`: every document of train.jsonl / valid.jsonl to ids (special-token
   strings inside documents are plain text: --no-special).
3. train.npy / valid.npy: uint16 token streams, documents in a seeded shuffled order, each followed
   by <|endoftext|>; valid_docs.npy holds [start, end) of every held-out document in valid.npy.
   meta.json: vocabulary size, special ids, token counts, bytes per token.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def unmask_bin():
    return os.environ.get("UNMASK_BIN") or os.path.join(ROOT, "build", "unmask")


def special_ids(tok_dir):
    with open(os.path.join(tok_dir, "tokenizer.json")) as fp:
        tj = json.load(fp)
    added = {a["content"]: a["id"] for a in tj["added_tokens"]}
    n_vocab = max(max(tj["model"]["vocab"].values()), max(added.values())) + 1
    return n_vocab, {"bos": added["<|startoftext|>"], "eos": added["<|endoftext|>"],
                     "eot": added["<|eot_id|>"], "mask": added["<|mdm_mask|>"]}


def tokenize_jsonl(tok_dir, path):
    out = subprocess.run([unmask_bin(), "tokenize", "--model", tok_dir, "--jsonl", path, "--no-special"],
                         check=True, capture_output=True, text=True).stdout
    return [np.array([int(x) for x in line.split(",")] if line else [], dtype=np.int64)
            for line in out.split("\n")[:-1]]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="models/train-work/data", help="gather_data.py output")
    ap.add_argument("--out", default="models/train-work/tokens")
    ap.add_argument("--merges", type=int, default=8000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    tok_dir = os.path.join(args.out, "tokenizer")
    os.makedirs(tok_dir, exist_ok=True)
    subprocess.run([unmask_bin(), "make-model", "--tokenizer-only", "--quiet", "--out", tok_dir,
                    "--tokenizer-corpus", os.path.join(args.data, "tokenizer_sample.txt"),
                    "--merges", str(args.merges)], check=True)
    n_vocab, sp = special_ids(tok_dir)
    assert n_vocab < 65536, "uint16 streams"
    meta = {"n_vocab": n_vocab, "special": sp, "merges": args.merges}
    rng = np.random.default_rng(args.seed)
    for split in ("train", "valid"):
        path = os.path.join(args.data, f"{split}.jsonl")
        docs = tokenize_jsonl(tok_dir, path)
        n_bytes = sum(len(json.loads(line).encode()) for line in open(path))
        order = rng.permutation(len(docs)) if split == "train" else np.arange(len(docs))
        parts, bounds, at = [], [], 0
        for i in order:
            parts.append(docs[i])
            parts.append(np.array([sp["eos"]], dtype=np.int64))
            bounds.append((at, at + len(docs[i])))
            at += len(docs[i]) + 1
        stream = np.concatenate(parts).astype(np.uint16)
        np.save(os.path.join(args.out, f"{split}.npy"), stream)
        if split == "valid":
            np.save(os.path.join(args.out, "valid_docs.npy"), np.array(bounds, dtype=np.int64))
        n_tok = int(sum(len(d) for d in docs))
        meta[split] = {"docs": len(docs), "tokens": n_tok, "bytes": n_bytes,
                       "bytes_per_token": round(n_bytes / max(n_tok, 1), 3)}
        print(f"prepare: {split}: {len(docs)} documents, {n_tok} tokens, "
              f"{n_bytes / max(n_tok, 1):.2f} bytes/token", file=sys.stderr)
    counts = np.bincount(np.load(os.path.join(args.out, "train.npy")).astype(np.int64), minlength=n_vocab)
    np.save(os.path.join(args.out, "unigram.npy"), counts)
    with open(os.path.join(args.out, "meta.json"), "w") as fp:
        json.dump(meta, fp, indent=2)


if __name__ == "__main__":
    main()
