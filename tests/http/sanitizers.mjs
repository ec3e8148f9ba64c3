// sanitizers.mjs — the AddressSanitizer + UBSan build of unmask for the tests that run the server
// under it (restart_torture, damaged_store): where it is, the environment that makes every report
// land in a file and stop the process (ASan, UBSan, LeakSanitizer at exit), and the check that a
// run left no report. Never a skip: a missing build is an error saying how to build it.
//
// UNMASK_ASAN_BIN is set by tests/CMakeLists.txt (<build dir>-asan/unmask unless the build itself
// is sanitized); scripts/test.sh builds it before running the tests.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

// The ASan build: its path, checked to be there and to be instrumented (the ASan runtime answers
// ASAN_OPTIONS=help=1, and libasan and libubsan are linked), else an Error saying how to build it.
export function asanBin() {
  const bin = process.env.UNMASK_ASAN_BIN;
  const how = 'build it with: cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Release -DUNMASK_SANITIZE=ON -DUNMASK_CUDA=OFF ' +
    '&& cmake --build build-asan --target unmask -j2 (scripts/test.sh does this)';
  if (!bin) throw new Error(`UNMASK_ASAN_BIN is not set (run through ctest); ${how}`);
  if (!fs.existsSync(bin)) throw new Error(`the ASan build of unmask is missing: ${bin}; ${how}`);
  const help = spawnSync(bin, ['--version'], { encoding: 'utf8', env: { ...process.env, ASAN_OPTIONS: 'help=1' } });
  const ldd = spawnSync('ldd', [bin], { encoding: 'utf8' });
  if (!/Available flags for AddressSanitizer/.test(help.stdout + help.stderr) || !/libubsan/.test(ldd.stdout))
    throw new Error(`${bin} is not built with AddressSanitizer and UBSan; ${how}`);
  return bin;
}

// Environment for a sanitized server whose reports go to files dir/asan.<pid> (ASan, LeakSanitizer)
// and dir/ubsan.<pid> (UBSan), each stopping the process at the first error.
export function sanitizerEnv(dir) {
  fs.mkdirSync(dir, { recursive: true });
  return {
    ASAN_OPTIONS: `log_path=${path.join(dir, 'asan')}:halt_on_error=1:abort_on_error=1:detect_leaks=1:` +
      'detect_stack_use_after_return=0:allocator_may_return_null=0',
    UBSAN_OPTIONS: `log_path=${path.join(dir, 'ubsan')}:halt_on_error=1:print_stacktrace=1`,
  };
}

const REPORT = /ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|SUMMARY: (Address|UndefinedBehavior|Leak)Sanitizer/;

// Every sanitizer report: the files in dir and what the server printed (its log text), as one
// string per report ([] when clean).
export function sanitizerReports(dir, log = '') {
  const found = [];
  if (fs.existsSync(dir))
    for (const f of fs.readdirSync(dir).sort())
      if (/^(asan|ubsan)\./.test(f)) found.push(`${f}:\n${fs.readFileSync(path.join(dir, f), 'utf8').slice(0, 4000)}`);
  const m = log.match(REPORT);
  if (m) found.push(`in the server's output:\n${log.slice(Math.max(0, m.index - 200), m.index + 3800)}`);
  return found;
}
