# lib.sh — shared by the tests/cli checks of one-line errors (sourced, not a test itself; the
# caller sets BIN and TMP first): the pass/fail counters, expect_rc / expect (the command must fail
# without a crash and print exactly one stderr line matching every pattern), ok (the command must
# succeed), config_variant (a copy of a checkpoint with its config.json edited by Python statements
# over `c`), edit_header (a safetensors header edited by Python statements over `h`, the data left
# untouched), finish (the summary line and the exit status).
PY=/usr/bin/python3
rm -rf "$TMP"
mkdir -p "$TMP"
passed=0
failed=0

# expect_rc NAME WANT_RC(any|1|2) PATTERN... -- CMD...  : exit != 0 (or == WANT_RC), rc < 128,
# exactly one stderr line, matching every (extended regex) PATTERN.
expect_rc() {
    local name="$1" want="$2"
    shift 2
    local pats=()
    while [ "$1" != "--" ]; do pats+=("$1"); shift; done
    shift
    "$@" >"$TMP/stdout" 2>"$TMP/stderr"
    local rc=$? ok=1 why=""
    local lines
    lines=$(wc -l <"$TMP/stderr")
    if [ $rc -eq 0 ]; then ok=0; why="exit 0"; fi
    if [ $rc -ge 128 ]; then ok=0; why="crashed (rc $rc)"; fi
    if [ "$want" != any ] && [ $rc -ne "$want" ]; then ok=0; why="exit $rc, expected $want"; fi
    if [ "$lines" -ne 1 ]; then ok=0; why="$why; $lines stderr lines"; fi
    for p in "${pats[@]}"; do
        if ! grep -Eq -- "$p" "$TMP/stderr"; then ok=0; why="$why; no match for /$p/"; fi
    done
    if [ $ok -eq 1 ]; then
        passed=$((passed + 1))
        echo "PASS $name: $(head -c 200 "$TMP/stderr")"
    else
        failed=$((failed + 1))
        echo "FAIL $name: $why; stderr: $(head -c 400 "$TMP/stderr")"
    fi
}

# expect NAME PATTERN... -- CMD... : expect_rc with any non-zero exit status.
expect() {
    local name="$1"
    shift
    expect_rc "$name" any "$@"
}

# ok NAME CMD... : the command exits 0.
ok() {
    local name="$1"
    shift
    if "$@" >"$TMP/stdout" 2>"$TMP/stderr"; then
        passed=$((passed + 1))
        echo "PASS $name"
    else
        failed=$((failed + 1))
        echo "FAIL $name: exit $?; stderr: $(head -c 400 "$TMP/stderr")"
    fi
}

# config_variant NAME 'python statements over c (config dict)' SRC_DIR -> prints a copy of SRC_DIR
# ($TMP/NAME) with the edited config.json
config_variant() {
    local d="$TMP/$1"
    rm -rf "$d"
    cp -r "$3" "$d"
    "$PY" - "$d/config.json" "$2" <<'PYEOF'
import json, sys
path, code = sys.argv[1], sys.argv[2]
c = json.load(open(path))
exec(code)
json.dump(c, open(path, "w"))
PYEOF
    echo "$d"
}

# edit_header FILE 'python statements over h (the parsed header dict)': rewrites a safetensors
# header in place, keeping the file's data section untouched (the new header must not be longer).
edit_header() {
    "$PY" - "$1" "$2" <<'PYEOF'
import json, sys
path, code = sys.argv[1], sys.argv[2]
raw = open(path, "rb").read()
n = int.from_bytes(raw[:8], "little")
h = json.loads(raw[8:8 + n])
exec(code)
text = json.dumps(h, separators=(",", ":")).encode()
if len(text) > n:
    raise SystemExit("edited header is longer than the original")
text += b" " * (n - len(text))
open(path, "wb").write(raw[:8] + text + raw[8 + n:])
PYEOF
}

# finish: the summary line the test runner reads, and the exit status.
finish() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}
