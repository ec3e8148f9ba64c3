// startup_options.test.mjs — what the process reads once at start, on the real server:
//   - the test hooks' variables (util/fault.h, docs/reliability.md "Test hooks"): a malformed value
//     is a clear start-up error naming the variable (exit 2, one line), not an abort and not a
//     silent "off"; every subcommand reads them (`logits` too, not only `serve`);
//   - the backend options that are settings rows (--cpu-pin, --cuda-fuse; docs/cpu-kernels.md,
//     docs/gpu.md): bad values are flag errors (flag or config file), and --cpu-pin on really
//     reaches the CPU backend: the compute pool's threads are pinned one per CPU, and with the
//     default (off) none is.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { BIN, TMP, startServer, makeModel, post, until } from './server.mjs';

const model = makeModel();
const DIR = path.join(TMP, 'startup_options');
fs.rmSync(DIR, { recursive: true, force: true });
fs.mkdirSync(DIR, { recursive: true });
const servers = [];
after(async () => {
  for (const s of servers) await s.stop();
});

const serve = (args, env = {}) =>
  spawnSync(BIN, ['serve', '--model', model, '--store', 'memory', '--host', '127.0.0.1', '--port', '0', ...args],
    { encoding: 'utf8', timeout: 30000, env: { ...process.env, ...env } });

// exit 2 (not a signal) and exactly one stderr line matching re
function refused(r, re) {
  assert.equal(r.signal, null, `no crash: ${r.stderr}`);
  assert.equal(r.status, 2, r.stderr);
  assert.equal(r.stderr.trim().split('\n').length, 1, r.stderr);
  assert.match(r.stderr, re);
}

test('a malformed UNMASK_FAULT_* variable stops any subcommand at start with the variable named', () => {
  refused(serve([], { UNMASK_FAULT_FORWARD_FAIL: 'seed=x' }),
    /^error: UNMASK_FAULT_FORWARD_FAIL=seed=x: expected rules seed=S\[,after=A\]\[,times=K\]/);
  refused(serve([], { UNMASK_FAULT_NCCL_INIT_RANK: 'one' }), /^error: UNMASK_FAULT_NCCL_INIT_RANK=one: expected a rank/);
  const npy = path.join(DIR, 'x.npy');
  const logits = (env) => spawnSync(BIN, ['logits', '--model', model, '--tokens', '1,2,3', '--out', npy],
    { encoding: 'utf8', timeout: 30000, env: { ...process.env, ...env } });
  refused(logits({ UNMASK_FAULT_CPU_TRIAL: 'avx9' }), /^error: UNMASK_FAULT_CPU_TRIAL=avx9: expected PATH or PATH:segv/);
  refused(logits({ UNMASK_FAULT_FORWARD_FAIL: 'seed=1,after=-1' }), /UNMASK_FAULT_FORWARD_FAIL=seed=1,after=-1/);
  // well-formed and empty values start normally
  const ok = logits({ UNMASK_FAULT_FORWARD_FAIL: '', UNMASK_FAULT_STORE_FAIL: path.join(DIR, 'absent') });
  assert.equal(ok.status, 0, ok.stderr);
  assert.match(ok.stderr, /TEST HOOK UNMASK_FAULT_STORE_FAIL: job-store writes fail while .*absent exists/);
});

test('--cpu-pin, --cuda-fuse and --cuda-skinny: bad values are flag errors, from flags and from the config file', () => {
  refused(serve(['--cpu-pin', 'maybe']), /--cpu-pin must be on or off, got 'maybe'/);
  refused(serve(['--cuda-fuse', 'fused']), /--cuda-fuse must be on or off, got 'fused'/);
  refused(serve(['--cuda-skinny', 'fast']), /--cuda-skinny must be on or off, got 'fast'/);
  const cfg = path.join(DIR, 'bad.json');
  fs.writeFileSync(cfg, JSON.stringify({ cuda_fuse: 'fused' }));
  refused(serve(['--config', cfg]), /"cuda_fuse" must be true or false/);
  const help = spawnSync(BIN, ['serve', '--help'], { encoding: 'utf8' });
  assert.match(help.stdout, /--cpu-pin on\|off .*\[off\]/);
  assert.match(help.stdout, /--cuda-fuse on\|off .*\[on\]/);
  assert.match(help.stdout, /--cuda-skinny on\|off .*\[off\]/);
  const logits = spawnSync(BIN, ['logits', '--model', model, '--tokens', '1,2', '--out', path.join(DIR, 'y.npy'),
    '--cpu-pin', 'yes'], { encoding: 'utf8' });
  refused(logits, /^error: --cpu-pin must be on or off, got 'yes'$/m);
});

// the CPUs each thread of pid may run on, as "0-1" / "1" strings
function threadCpus(pid) {
  const out = [];
  for (const t of fs.readdirSync(`/proc/${pid}/task`)) {
    try {
      const m = fs.readFileSync(`/proc/${pid}/task/${t}/status`, 'utf8').match(/^Cpus_allowed_list:\s*(\S+)$/m);
      if (m) out.push(m[1]);
    } catch { /* the thread ended meanwhile */ }
  }
  return out;
}
const single = (l) => /^\d+$/.test(l);

test('--cpu-pin on pins the CPU pool threads one per CPU; the default leaves them free', async (t) => {
  const allowed = fs.readFileSync('/proc/self/status', 'utf8').match(/^Cpus_allowed_list:\s*(\S+)$/m)[1];
  if (single(allowed)) {
    t.skip(`this process may run on one CPU only (${allowed}): pinning cannot be told apart`);
    return;
  }
  const gen = (srv) => post(`${srv.url}/v1/completions`, { prompt: 'pin', max_tokens: 8, block_length: 8, steps: 4 });
  const on = await startServer(['--threads', '2', '--cpu-pin', 'on'], { model });
  servers.push(on);
  assert.equal((await gen(on)).status, 200);
  const pinned = await until('a pinned pool thread', () => threadCpus(on.proc.pid).filter(single).length >= 1 && threadCpus(on.proc.pid));
  assert.ok(pinned.filter(single).length >= 1, pinned.join(' '));
  const off = await startServer(['--threads', '2'], { model });
  servers.push(off);
  assert.equal((await gen(off)).status, 200, 'a forward ran on the pool');
  const free = threadCpus(off.proc.pid);
  assert.deepEqual(free.filter(single), [], `no thread pinned without --cpu-pin: ${free.join(' ')}`);
});
