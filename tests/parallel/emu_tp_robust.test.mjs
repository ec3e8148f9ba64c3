// emu_tp_robust.test.mjs — multi-node tensor parallelism must fail loudly and stop promptly, never
// hang or answer garbage (docs/parallel.md, "Robustness"), on the CUDA emulator (`unmask-emu`, two
// `serve` processes meeting over 127.0.0.1 and the emulated NCCL in POSIX shared memory):
//   - setup fingerprint: node 1 started with a different --max-seq / --max-batch, or a copy of the
//     checkpoint with another config.json value or other weight bytes, is refused at the rendezvous:
//     BOTH nodes exit 1 within seconds with one line naming the difference;
//   - SIGTERM on node 0 while it waits for node 1 (rendezvous), and on node 1 while it retries
//     connecting to an absent node 0: each exits 0 within 2 s saying it stopped before the group
//     formed (the wait would otherwise last the 120 s bootstrap timeout);
//   - SIGTERM on node 1 of a serving group: node 1 asks node 0 over the liveness link to stop; node 0
//     drains and exits 0 naming node 1 and the signal, node 1 exits 0 after node 0's stop message;
//   - one failed NCCL init (UNMASK_FAULT_NCCL_INIT_RANK, off by default): the other ranks abort
//     their pending non-blocking ncclCommInitRankConfig instead of waiting for the failed rank; the
//     failing rank's message is reported (single process --tp 2, and on node 1 of two nodes).
// Skipped, with the reason, in builds without the emulator.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, describe, test } from 'node:test';
import { SRC, TMP, serverReady, tinyModel } from '../protocol/harness.mjs';
import { NO_EMU, freePort, killAll, sanitizerReports, spawnEmu } from './emu_harness.mjs';

const MODEL = tinyModel('emu-tp');
const CFG = JSON.parse(fs.readFileSync(path.join(MODEL, 'config.json'), 'utf8'));
const WEB = path.join(SRC, 'web');

after(killAll);

// every node here has one emulated GPU unless the case says otherwise
const spawnNode = (args, env = {}) => spawnEmu(args, { UNMASK_EMU_DEVICES: '1', ...env });

const node0Args = (dist, extra = []) => ['serve', '--store', 'memory', '--model', MODEL, '--host', '127.0.0.1', '--port', '0', '--web-root', WEB,
  '--threads', '1', ...dist, '--node-rank', '0', ...extra];
const node1Args = (dist, extra = [], model = MODEL) => ['serve', '--store', 'memory', '--model', model, '--threads', '1', ...dist,
  '--node-rank', '1', ...extra];

async function distArgs(tp = 2) {
  return ['--tp', String(tp), '--nnodes', '2', '--dist-init-addr', `127.0.0.1:${await freePort()}`, '--gpus', '0'];
}

// node 0 and node 1 with the given extra flags / model; both must exit 1 quickly; returns them
async function refused(extra0, extra1, model1 = MODEL) {
  const dist = await distArgs();
  const t0 = Date.now();
  const n0 = spawnNode(node0Args(dist, extra0));
  const n1 = spawnNode(node1Args(dist, extra1, model1));
  const [r0, r1] = await Promise.all([n0.exitWithin(60000), n1.exitWithin(60000)]);
  const secs = (Date.now() - t0) / 1000;
  assert.equal(r0.code, 1, `node 0: ${n0.stderr}`);
  assert.equal(r1.code, 1, `node 1: ${n1.stderr}`);
  assert.ok(secs < 20, `refused in ${secs} s`);
  return { n0, n1 };
}

// a copy of the tiny checkpoint, edited by fn(dir)
function modelCopy(name, fn) {
  const dir = path.join(TMP, `emu-tp-robust-${process.pid}-${name}`);
  fs.rmSync(dir, { recursive: true, force: true });
  fs.cpSync(MODEL, dir, { recursive: true });
  fn(dir);
  return dir;
}

describe('multi-node tensor parallelism: robustness (emulated GPUs)', { skip: NO_EMU }, () => {
  test('fingerprint: a different --max-seq on node 1 fails both nodes with one line naming it', async () => {
    const { n0, n1 } = await refused([], ['--max-seq', '64']);
    const line = `node 1 has --max-seq 64, node 0 has ${CFG.max_sequence_length}`;
    assert.match(n0.stderr, new RegExp(`^error: engine 0 \\(tp 2\\): bootstrap: ${line}$`, 'm'));
    assert.match(n1.stderr, new RegExp(`^error: bootstrap: node 0 refused node 1: ${line}$`, 'm'));
  });

  test('fingerprint: --max-batch and --tp', async () => {
    const { n0 } = await refused(['--max-batch', '4'], ['--max-batch', '2']);
    assert.match(n0.stderr, /node 1 has --max-batch 2, node 0 has 4/);
    // node 1 --tp 4 with two GPUs: same nnodes, different tp and ranks per node
    const addr = `127.0.0.1:${await freePort()}`;
    const n0b = spawnNode(node0Args(['--tp', '2', '--nnodes', '2', '--dist-init-addr', addr, '--gpus', '0']));
    const n1b = spawnNode(node1Args(['--tp', '4', '--nnodes', '2', '--dist-init-addr', addr, '--gpus', '0,1']),
      { UNMASK_EMU_DEVICES: '2' });
    const [r0, r1] = await Promise.all([n0b.exitWithin(60000), n1b.exitWithin(60000)]);
    assert.equal(r0.code, 1, n0b.stderr);
    assert.equal(r1.code, 1, n1b.stderr);
    assert.match(n0b.stderr, /node 1 has --tp 4, node 0 has 2; node 1 has GPUs per node \(--gpus\/--device\) 2, node 0 has 1/);
  });

  test('fingerprint: a checkpoint copy with another config.json value', async () => {
    const dir = modelCopy('cfg', (d) => {
      const c = JSON.parse(fs.readFileSync(path.join(d, 'config.json'), 'utf8'));
      c.rope_theta = (c.rope_theta ?? 10000) * 2;
      fs.writeFileSync(path.join(d, 'config.json'), JSON.stringify(c));
    });
    const { n0, n1 } = await refused([], [], dir);
    const want = `node 1's model differs \\(config.json rope_theta ${(CFG.rope_theta ?? 10000) * 2} vs ${CFG.rope_theta ?? 10000} on node 0\\)`;
    assert.match(n0.stderr, new RegExp(want));
    assert.match(n1.stderr, new RegExp(want));
    fs.rmSync(dir, { recursive: true, force: true });
  });

  test('fingerprint: a checkpoint copy whose last weight byte differs (same shapes, same header)', async () => {
    const dir = modelCopy('w', (d) => {
      const f = path.join(d, 'model.safetensors');
      const b = fs.readFileSync(f);
      b[b.length - 1] ^= 0x01;
      fs.writeFileSync(f, b);
    });
    const { n0 } = await refused([], [], dir);
    assert.match(n0.stderr, /node 1's model differs \(weights \(safetensors headers, file sizes or sampled bytes\)\)/);
    assert.doesNotMatch(n0.stderr, /config\.json|tensors vs|tensor names/);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  test('SIGTERM on node 0 during the rendezvous: exits 0 within 2 s, naming the node it waited for', async () => {
    const n0 = spawnNode(node0Args(await distArgs()));
    await n0.waitFor(/bootstrap: node 0 listening on port \d+ for 1 node/);
    const t0 = Date.now();
    n0.proc.kill('SIGTERM');
    const r = await n0.exitWithin(30000);
    const secs = (Date.now() - t0) / 1000;
    assert.deepEqual(r, { code: 0, signal: null }, n0.stderr);
    assert.ok(secs < 2, `exited ${secs} s after SIGTERM`);
    assert.match(n0.stderr, /stopped before the tensor-parallel group formed: engine 0 \(tp 2\): bootstrap: interrupted by SIGTERM while waiting for node 1 to connect \(1 of 2 nodes joined\)/);
  });

  test('SIGTERM on node 1 while node 0 is absent: exits 0 within 2 s', async () => {
    const n1 = spawnNode(node1Args(await distArgs()));
    await n1.waitFor(/node 1 of 2 joining the tensor-parallel group/);
    const t0 = Date.now();
    n1.proc.kill('SIGTERM');
    const r = await n1.exitWithin(30000);
    const secs = (Date.now() - t0) / 1000;
    assert.deepEqual(r, { code: 0, signal: null }, n1.stderr);
    assert.ok(secs < 2, `exited ${secs} s after SIGTERM`);
    assert.match(n1.stdout, /node 1: stopped before the group formed \(bootstrap: node 1: interrupted by SIGTERM while connecting to node 0 at 127\.0\.0\.1:\d+\)/);
  });

  test('SIGTERM on node 1 of a serving group stops the whole group cleanly', async () => {
    const dist = await distArgs();
    const n1 = spawnNode(node1Args(dist));
    const n0 = spawnNode(node0Args(dist));
    try {
      // serving: /health 200
      await serverReady(n0.proc, () => n0.stdout, () => n0.stderr, n0.exited, { name: 'node 0', readyMs: 60000 });
      n1.proc.kill('SIGTERM');
      const [r0, r1] = await Promise.all([n0.exitWithin(30000), n1.exitWithin(30000)]);
      assert.deepEqual(r0, { code: 0, signal: null }, n0.stderr);
      assert.deepEqual(r1, { code: 0, signal: null }, n1.stderr);
      assert.match(n0.stderr, /tensor parallel: node 1 received SIGTERM and asked to stop the group: stopping/);
      assert.doesNotMatch(n0.stderr, /disconnected/);
      assert.match(n1.stdout, /node 1: stopped by SIGTERM: node 0 stopped the group; exiting/);
    } finally {
      n0.proc.kill('SIGKILL');
      n1.proc.kill('SIGKILL');
    }
  });
});

describe('one failed NCCL init does not hang the group (emulated NCCL, UNMASK_FAULT_NCCL_INIT_RANK)', { skip: NO_EMU }, () => {
  for (const bad of [1, 0]) {
    test(`serve --gpus 0,1 --tp 2, rank ${bad}'s init fails: exit 1 at once with rank ${bad}'s message`, async () => {
      const t0 = Date.now();
      // the emulated NCCL would make the healthy rank wait 60 s for the missing one (its own timeout)
      const s = spawnNode(['serve', '--store', 'memory', '--model', MODEL, '--host', '127.0.0.1', '--port', '0', '--web-root', WEB,
        '--threads', '1', '--gpus', '0,1', '--tp', '2'], { UNMASK_EMU_DEVICES: '2', UNMASK_FAULT_NCCL_INIT_RANK: String(bad) });
      const r = await s.exitWithin(60000);
      const secs = (Date.now() - t0) / 1000;
      assert.equal(r.code, 1, s.stderr);
      assert.ok(secs < 30, `took ${secs} s`);   // typically 0.2 s; margin for a loaded CI machine
      assert.match(s.stderr, new RegExp(`^error: engine 0 \\(tp 2\\): rank ${bad} \\(cuda:${bad}\\): NCCL rank ${bad} of 2 on cuda:${bad}: injected init failure \\(UNMASK_FAULT_NCCL_INIT_RANK=${bad}\\)$`, 'm'));
      assert.deepEqual(fs.readdirSync('/dev/shm').filter((f) => f.startsWith(`umk-nccl-${s.proc.pid}-`)), []);
    });
  }
  for (const bad of [1, 0]) {
    test(`two nodes, rank ${bad}'s init fails on node ${bad}: both exit 1 at once, both name rank ${bad}`, async () => {
      const dist = await distArgs();
      const fault = { UNMASK_FAULT_NCCL_INIT_RANK: String(bad) };
      const t0 = Date.now();
      const n0 = spawnNode(node0Args(dist), bad === 0 ? fault : {});
      const n1 = spawnNode(node1Args(dist), bad === 1 ? fault : {});
      const [r0, r1] = await Promise.all([n0.exitWithin(60000), n1.exitWithin(60000)]);
      const secs = (Date.now() - t0) / 1000;
      assert.equal(r0.code, 1, n0.stderr);
      assert.equal(r1.code, 1, n1.stderr);
      // without the message over the link, the healthy node waits out the 10 s liveness grace and
      // then only says "node N disconnected"
      assert.ok(secs < 8, `took ${secs} s`);   // typically 0.2 s; stays below the 10 s grace
      const inj = `rank ${bad} \\(cuda:0\\): NCCL rank ${bad} of 2 on cuda:0: injected init failure \\(UNMASK_FAULT_NCCL_INIT_RANK=${bad}\\)`;
      const [failed, healthy] = bad === 0 ? [n0, n1] : [n1, n0];
      assert.match(failed.stderr, new RegExp(`^error: (engine 0 \\(tp 2\\): )?${inj}$`, 'm'));
      assert.match(healthy.stderr, new RegExp(`^error: (engine 0 \\(tp 2\\): )?node ${bad}: ${inj}$`, 'm'));
      assert.doesNotMatch(healthy.stderr, /disconnected/);
      assert.deepEqual(fs.readdirSync('/dev/shm').filter((f) => f.startsWith(`umk-nccl-${n0.proc.pid}-`)), []);
    });
  }
});

describe('children', { skip: NO_EMU }, () => {
  test('no sanitizer report from any child process', () => {
    assert.deepEqual(sanitizerReports, []);
  });
});
