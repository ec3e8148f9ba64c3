#!/usr/bin/env bash
# test_tokenize.sh — `unmask tokenize` / `detokenize` as a black box: usage and input errors give a
# clear message and a non-zero exit; a file round-trips; a 10 MB single "word" is tokenized in
# bounded memory (ulimit); the built-in tokenizer from make-model is found.
set -u
BIN="$UNMASK_BIN"
T="$UNMASK_TEST_TMP/cli-tokenize-$$"
rm -rf "$T" && mkdir -p "$T"
trap 'rm -rf "$T"' EXIT
fail=0
pass=0

expect() { # expect <description> <want exit: 0 | nonzero | N> <stderr regex or ""> -- cmd...
    local desc="$1" want="$2" re="$3"
    shift 4
    "$@" >"$T/out" 2>"$T/err"
    local rc=$?
    local ok=1
    if [ "$want" = nonzero ]; then [ $rc -ne 0 ] || ok=0; else [ $rc -eq "$want" ] || ok=0; fi
    if [ -n "$re" ] && ! grep -Eq -- "$re" "$T/err"; then ok=0; fi
    if [ $ok = 1 ]; then pass=$((pass + 1)); else
        fail=$((fail + 1))
        echo "FAIL: $desc (exit $rc, want $want, stderr: $(head -c 300 "$T/err"))"
    fi
}

"$BIN" make-model --out "$T/m" --quiet || { echo "FAIL: make-model"; exit 1; }
M="$T/m"

expect "no --model" 2 "--model DIR is required" -- "$BIN" tokenize --text hi
expect "unknown flag" 2 "unknown option" -- "$BIN" tokenize --model "$M" --bogus
expect "two inputs" 2 "only one of" -- "$BIN" tokenize --model "$M" --text a --file /dev/null
expect "dir without tokenizer" 1 "no tokenizer files" -- "$BIN" tokenize --model "$T" --text hi
mkdir -p "$T/bad" && echo '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}, "decoder": {"type": "ByteLevel"}}' >"$T/bad/tokenizer.json"
expect "merge with unknown token" 1 "tokenizer.json: merge 0 refers to a token not in the vocabulary" -- \
    "$BIN" tokenize --model "$T/bad" --text hi
echo '{"model": ' >"$T/bad/tokenizer.json"
expect "truncated tokenizer.json" 1 "tokenizer.json: invalid JSON" -- "$BIN" tokenize --model "$T/bad" --text hi
mkdir -p "$T/half" && echo '{}' >"$T/half/vocab.json"
expect "vocab.json without merges.txt" 1 "must both be present" -- "$BIN" tokenize --model "$T/half" --text hi
printf 'ok \xff\xfe bad' >"$T/invalid.txt"
expect "invalid UTF-8" 1 "not valid UTF-8 \\(byte 3\\)" -- "$BIN" tokenize --model "$M" --file "$T/invalid.txt"
expect "invalid UTF-8, --lossy" 0 "" -- "$BIN" tokenize --model "$M" --file "$T/invalid.txt" --lossy
expect "missing file" 1 "No such file" -- "$BIN" tokenize --model "$M" --file "$T/nope.txt"
echo '[{"role": "user", "content": "hi"}' >"$T/chat.json"
expect "bad chat JSON" 1 "invalid JSON" -- "$BIN" tokenize --model "$M" --chat "$T/chat.json"
echo '{"role": "user"}' >"$T/chat.json"
expect "chat not a list" 1 "expected an array" -- "$BIN" tokenize --model "$M" --chat "$T/chat.json"
echo '[{"content": "no role"}]' >"$T/chat.json"
expect "message without role" 1 "role" -- "$BIN" tokenize --model "$M" --chat "$T/chat.json"
expect "render without chat" 2 "--render needs --chat" -- "$BIN" tokenize --model "$M" --render
expect "detokenize: bad list" 2 "comma-separated integers" -- "$BIN" detokenize --model "$M" --ids 1,x,3
expect "detokenize: unknown id" 1 "is not a token id" -- "$BIN" detokenize --model "$M" --ids 1,99999999
expect "detokenize: negative id" 1 "is not a token id" -- "$BIN" detokenize --model "$M" --ids -1
expect "detokenize: no ids" 2 "required" -- "$BIN" detokenize --model "$M"

# chat through the built-in tokenizer: BOS, headers and EOT are single special tokens
echo '[{"role": "user", "content": "  Hello!  "}]' >"$T/chat.json"
"$BIN" tokenize --model "$M" --chat "$T/chat.json" --render >"$T/rendered"
printf '<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n' >"$T/want"
if cmp -s "$T/rendered" "$T/want"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: LLaDA chat rendering"; fi
ids=$("$BIN" tokenize --model "$M" --chat "$T/chat.json")
bos=$("$BIN" tokenize --model "$M" --text '<|startoftext|>')
case "$ids" in "$bos",*) pass=$((pass + 1)) ;; *) fail=$((fail + 1)); echo "FAIL: chat ids start with BOS ($ids)" ;; esac
"$BIN" detokenize --model "$M" --ids "$ids" >"$T/back"
if cmp -s "$T/back" "$T/want"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: chat ids decode to the rendering"; fi
"$BIN" detokenize --model "$M" --ids "$ids" --skip-special >"$T/back"
printf 'user\n\nHello!assistant\n\n' >"$T/want"
if cmp -s "$T/back" "$T/want"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: --skip-special"; fi

# --verbose: one id<TAB>piece per token
"$BIN" tokenize --model "$M" --text 'Hello world' --verbose >"$T/v"
if grep -Pq '^[0-9]+\tĠworld$' "$T/v"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: --verbose: $(cat "$T/v")"; fi

# round trip of a file with mixed content, via stdin
printf 'Tabs\tand  spaces \r\n中文 😀 e\xcc\x81 <|eot_id|> end\n' >"$T/mixed.txt"
ids=$("$BIN" tokenize --model "$M" <"$T/mixed.txt")
"$BIN" detokenize --model "$M" --ids "$ids" >"$T/back"
if cmp -s "$T/back" "$T/mixed.txt"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: stdin round trip"; fi

# a 10 MB single "word": finishes, in bounded memory (1 GiB of address space)
head -c 10000000 /dev/zero | tr '\0' 'a' >"$T/word.txt"
(ulimit -v 1048576 && "$BIN" tokenize --model "$M" --file "$T/word.txt" >"$T/ids") 2>"$T/err"
rc=$?
n=$(tr ',' '\n' <"$T/ids" | grep -c .)
if [ $rc -eq 0 ] && [ "$n" -gt 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: 10 MB word (rc $rc, $n ids, $(head -c 200 "$T/err"))"; fi
{ printf '['; tr -d '\n' <"$T/ids"; printf ']\n'; } >"$T/ids.jsonl"   # too long for argv: --jsonl
"$BIN" detokenize --model "$M" --jsonl "$T/ids.jsonl" >"$T/back"
{ printf '"'; cat "$T/word.txt"; printf '"\n'; } >"$T/want"
if cmp -s "$T/back" "$T/want"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: 10 MB word round trip"; fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
