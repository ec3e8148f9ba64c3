#!/usr/bin/env bash
# test_include_cycles.sh — the modules of src/ include each other without cycles (a module is x.c +
# x.h; headers without a .c fold into their users): tools/include_cycles.py prints any strongly
# connected component and exits 1. Layers are folders; within one, types sit below the parts that
# use them and entry points above.
set -u
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
out=$(cd "$ROOT" && /usr/bin/python3 tools/include_cycles.py 2>&1)
rc=$?
echo "$out"
if [ $rc -eq 0 ] && [[ "$out" == *"0 cycles"* ]]; then
    echo "1 passed, 0 failed"
    exit 0
fi
echo "0 passed, 1 failed"
exit 1
