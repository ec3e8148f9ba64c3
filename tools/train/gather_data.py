#!/usr/bin/python3
"""gather_data.py — build the training corpus from what a Debian machine already has.

Sources (read-only, nothing downloaded):
  code   Python source: the standard library (/usr/lib/python3.11) and Debian's Python packages
         (/usr/lib/python3/dist-packages). Kept only when the file is UTF-8, parses with `ast`,
         is at most 256 KB and is not mostly long data lines.
  prose  English documentation: man pages (/usr/share/man/man1..8, roff turned into plain text
         here) and README / NEWS / *.txt / *.md / *.rst files under /usr/share/doc.
Documents are deduplicated by content (trailing whitespace ignored) and split into train / valid
BY FILE: a file goes to valid when a hash of its content falls in the held-out fraction, so no
part of a held-out file is ever trained on.

Output in --out (not committed; the default is the ignored models/train-work/data):
  train.jsonl, valid.jsonl   one JSON string per document (a file's text)
  manifest.tsv               split, kind, bytes, sha256[:16], path  for every kept file
  tokenizer_sample.txt       a deterministic sample of the train split for the BPE trainer
  stats.json                 counts and bytes per split and kind
Deterministic: same machine contents -> same output.
"""
import argparse
import ast
import gzip
import hashlib
import json
import os
import re
import sys
import warnings

CODE_ROOTS = ["/usr/lib/python3.11", "/usr/lib/python3/dist-packages"]
MAN_ROOT = "/usr/share/man"
DOC_ROOT = "/usr/share/doc"
MAX_FILE_BYTES = 256 * 1024
PACKAGE_CAP_BYTES = 4_000_000   # per dist-packages package (sympy alone would be a fifth of the code)
MAN_FAMILY_CAP = 20             # man pages per command family (gcloud ships ~18000 of them)


# ---------------------------------------------------------------- code

def python_ok(text):
    """A Python file is kept when it parses and is not mostly data (long lines)."""
    lines = text.split("\n")
    if len(lines) < 3:
        return False
    long_lines = sum(1 for ln in lines if len(ln) > 200)
    if long_lines > 0.05 * len(lines):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ast.parse(text)
        except Exception:  # SyntaxError, ValueError (NUL bytes), RecursionError
            return False
    return True


def walk_sorted(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        if "__pycache__" in dirnames:
            dirnames.remove("__pycache__")
        for f in sorted(filenames):
            yield os.path.join(dirpath, f)


def read_text(path, limit=MAX_FILE_BYTES):
    try:
        if os.path.islink(path) or os.path.getsize(path) > limit:
            return None
        with open(path, "rb") as fp:
            raw = fp.read()
        if path.endswith(".gz"):
            raw = gzip.decompress(raw)
            if len(raw) > limit * 4:
                return None
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None


# ---------------------------------------------------------------- man pages (roff -> text)

ROFF_ESCAPES = [
    (re.compile(r"\\f\[[A-Za-z]*\]|\\f\([A-Za-z]{2}|\\f[A-Za-z0-9]"), ""),
    (re.compile(r"\\s[+-]?\d+"), ""),
    (re.compile(r"\\\(em|\\\[em\]"), "--"),
    (re.compile(r"\\\(en|\\\[en\]"), "-"),
    (re.compile(r"\\\(aq|\\\[aq\]"), "'"),
    (re.compile(r"\\\(dq|\\\[dq\]|\\\(lq|\\\(rq|\\\[lq\]|\\\[rq\]"), '"'),
    (re.compile(r"\\\(bu|\\\[bu\]"), "*"),
    (re.compile(r"\\\(co|\\\[co\]"), "(c)"),
    (re.compile(r"\\\(ti|\\\[ti\]|\\\(ap"), "~"),
    (re.compile(r"\\\(ha|\\\[ha\]|\\\(ua"), "^"),
    (re.compile(r"\\\(ga|\\\[ga\]"), "`"),
    (re.compile(r"\\\(rs|\\\[rs\]|\\e"), "\\\\"),
    (re.compile(r"\\\(..|\\\[[^\]]*\]"), ""),
    (re.compile(r"\\\*\(..|\\\*\[[^\]]*\]|\\\*."), ""),
    (re.compile(r"\\[-]"), "-"),
    (re.compile(r"\\[&|^%:)]"), ""),
    (re.compile(r"\\ "), " "),
    (re.compile(r"\\c$"), ""),
    (re.compile(r"\\n\(..|\\n\[[^\]]*\]|\\n."), ""),
    (re.compile(r"\\[hvwl]'[^']*'"), ""),
    (re.compile(r"\\\\"), "\\\\"),
]
MAN_FONT_MACROS = {"B", "I", "BR", "RB", "BI", "IB", "IR", "RI", "SM", "SB"}


def roff_inline(s):
    for rx, rep in ROFF_ESCAPES:
        s = rx.sub(rep, s)
    return s.replace("\\\\", "\\")


def roff_args(rest):
    out, cur, q = [], "", False
    for ch in rest:
        if ch == '"':
            q = not q
        elif ch in " \t" and not q:
            if cur:
                out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        out.append(cur)
    return out


def man_to_text(src):
    """Plain text of a man(7) page: headings, paragraphs joined into lines, .nf blocks kept.
    mdoc pages and pages that only source others (.so) give None."""
    if re.search(r"^\.(Dd|Sh)\b", src, re.M) or re.match(r"\s*\.so\s", src):
        return None
    out, para, nofill = [], [], False

    def flush():
        if para:
            out.append(" ".join(para))
            para.clear()

    for line in src.split("\n"):
        if line.startswith(('.\\"', "'\\\"", '\\"')):
            continue
        if line.startswith((".", "'")):
            parts = line[1:].strip().split(None, 1)
            if not parts:
                continue
            mac, rest = parts[0], parts[1] if len(parts) > 1 else ""
            if mac in ("SH", "SS"):
                flush()
                out.append("")
                out.append(roff_inline(" ".join(roff_args(rest))))
            elif mac in ("PP", "P", "LP", "TP", "IP", "HP", "sp", "br", "RS", "RE", "in", "ti"):
                flush()
                if mac == "IP" and rest:
                    a = roff_args(rest)
                    if a and a[0] not in ("\\(bu", "\\[bu]", "-", "*"):
                        para.append(roff_inline(a[0]))
            elif mac == "nf" or mac == "EX":
                flush()
                nofill = True
            elif mac == "fi" or mac == "EE":
                nofill = False
            elif mac in MAN_FONT_MACROS:
                a = roff_args(rest)
                sep = "" if len(mac) == 2 else " "
                txt = roff_inline(sep.join(a))
                (out.append(txt) if nofill else para.append(txt))
            elif mac in ("UR", "MT"):
                para.append(roff_inline(rest))
            # every other request (TH, ds, de, ie, if, ...) is dropped
            continue
        txt = roff_inline(line)
        if nofill:
            out.append(txt)
        elif txt.strip():
            para.append(txt.strip())
        else:
            flush()
    flush()
    text = "\n".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"
    return text if len(text) >= 400 else None


def english_ok(text):
    """Mostly ASCII letters and spaces: drops non-English pages that sit in the C locale folders."""
    if len(text) < 400:
        return False
    ascii_letters = sum(1 for c in text[:20000] if c.isascii() and (c.isalpha() or c == " "))
    return ascii_letters > 0.7 * min(len(text), 20000)


DOC_NAME = re.compile(r"^(README|NEWS|TODO|THANKS|FAQ|USAGE|HACKING|CONTRIBUTING)([._-].*)?$|\.(txt|md|rst)(\.gz)?$",
                      re.I)


# ---------------------------------------------------------------- main

def content_key(text):
    norm = "\n".join(ln.rstrip() for ln in text.strip().split("\n"))
    return hashlib.sha256(norm.encode("utf-8")).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="models/train-work/data")
    ap.add_argument("--valid-percent", type=float, default=2.0, help="held-out files, in percent [2]")
    ap.add_argument("--prose-fraction", type=float, default=0.2,
                    help="cap prose at this fraction of all bytes (man pages are plentiful) [0.2]")
    ap.add_argument("--max-files", type=int, default=0, help="stop after this many files per kind (tests) [0 = all]")
    ap.add_argument("--tokenizer-sample-mb", type=float, default=6.0)
    ap.add_argument("--code-root", action="append", help="override the code roots (tests)")
    ap.add_argument("--no-prose", action="store_true", help="code only (tests)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    seen = set()
    docs = []   # (kind, path, text, key)

    def add(kind, path, text):
        key = content_key(text)
        if key in seen:
            return False
        seen.add(key)
        docs.append((kind, path, text, key))
        return True

    n_code = 0
    per_package = {}
    for root in args.code_root or CODE_ROOTS:
        for path in walk_sorted(root):
            if not path.endswith(".py") or (args.max_files and n_code >= args.max_files):
                continue
            rel = os.path.relpath(path, root)
            package = (root, rel.split(os.sep)[0]) if "dist-packages" in root else (root, "")
            if package[1] and per_package.get(package, 0) >= PACKAGE_CAP_BYTES:
                continue
            text = read_text(path)
            if text is not None and python_ok(text) and add("code", path, text):
                n_code += 1
                per_package[package] = per_package.get(package, 0) + len(text.encode())
    code_bytes = sum(len(d[2].encode()) for d in docs)
    print(f"gather: {n_code} Python files, {code_bytes / 1e6:.1f} MB", file=sys.stderr)

    prose = []
    if not args.no_prose:
        families = {}
        for sec in range(1, 9):
            d = os.path.join(MAN_ROOT, f"man{sec}")
            if not os.path.isdir(d):
                continue
            for path in walk_sorted(d):
                family = re.split(r"[-_.]", os.path.basename(path))[0]
                families[family] = families.get(family, 0) + 1
                if families[family] > MAN_FAMILY_CAP:
                    continue
                raw = read_text(path)
                text = man_to_text(raw) if raw else None
                if text and english_ok(text):
                    prose.append(("man", path, text))
        for path in walk_sorted(DOC_ROOT):
            name = os.path.basename(path)
            if not DOC_NAME.search(name) or "copyright" in name or "changelog" in name.lower():
                continue
            text = read_text(path)
            if text and english_ok(text):
                prose.append(("doc", path, text))
        # cap prose bytes: keep a deterministic subset chosen by content hash
        cap = args.prose_fraction / (1 - args.prose_fraction) * code_bytes
        prose.sort(key=lambda p: hashlib.sha256(p[2].encode()).hexdigest())
        total = 0
        for kind, path, text in prose:
            if args.max_files and sum(1 for d in docs if d[0] != "code") >= args.max_files:
                break
            b = len(text.encode())
            if total + b > cap:
                continue
            if add(kind, path, text):
                total += b
        print(f"gather: {len(docs) - n_code} prose files, {total / 1e6:.1f} MB", file=sys.stderr)

    def split_of(key):
        return "valid" if int(key[:8], 16) % 10000 < args.valid_percent * 100 else "train"

    # a tiny corpus (tests) might put no file in valid: hold out the first code file then
    if len(docs) > 1 and not any(split_of(d[3]) == "valid" for d in docs):
        forced = docs[0][3]
    else:
        forced = None
    stats = {}
    with open(os.path.join(args.out, "train.jsonl"), "w") as ftr, \
         open(os.path.join(args.out, "valid.jsonl"), "w") as fva, \
         open(os.path.join(args.out, "manifest.tsv"), "w") as fman:
        for kind, path, text, key in docs:
            split = "valid" if key == forced else split_of(key)
            (fva if split == "valid" else ftr).write(json.dumps(text) + "\n")
            nb = len(text.encode())
            fman.write(f"{split}\t{kind}\t{nb}\t{key[:16]}\t{path}\n")
            s = stats.setdefault(split, {}).setdefault(kind, {"files": 0, "bytes": 0})
            s["files"] += 1
            s["bytes"] += nb
    # tokenizer sample: whole train documents in hash order until the budget is reached
    budget = int(args.tokenizer_sample_mb * 1e6)
    train_docs = sorted((d for d in docs if d[3] != forced and split_of(d[3]) == "train"), key=lambda d: d[3])
    with open(os.path.join(args.out, "tokenizer_sample.txt"), "w") as fs:
        used = 0
        for kind, path, text, key in train_docs:
            if used >= budget:
                break
            fs.write(text + "\n")
            used += len(text.encode()) + 1
    with open(os.path.join(args.out, "stats.json"), "w") as fp:
        json.dump(stats, fp, indent=2, sort_keys=True)
    print(json.dumps(stats), file=sys.stderr)


if __name__ == "__main__":
    main()
