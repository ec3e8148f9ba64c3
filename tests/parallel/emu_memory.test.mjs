// emu_memory.test.mjs — memory sizing and data-parallel replicas on the CUDA emulator (unmask-emu:
// the real CUDA backend code on emulated GPUs; UNMASK_EMU_MEM_BYTES = each GPU's memory,
// UNMASK_EMU_DEVICES = how many). The server checks the fit BEFORE uploading any weight: with too
// little memory `serve --device cuda:0` fails its start with one clear line (weights, activations,
// free memory in GiB) and exit code 1 — never a crash or an OOM half-way; the activations come from
// 2 x --max-batch x --max-seq (CFG doubles a request's canvas), so the same card fails --max-batch 512 yet runs --max-batch 512 with
// --max-seq 64; `--gpus 0,1` on two emulated GPUs serves as two replicas. (--tp on emulated GPUs,
// with the emulator's NCCL: emu_tp.test.mjs.)

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { test } from 'node:test';
import { SRC, startServer, tinyModel } from '../protocol/harness.mjs';
import { EMU, NO_EMU } from './emu_harness.mjs';

const MODEL = tinyModel('emu-memory');
const MiB = 1 << 20;

// `unmask-emu serve` with the emulator's environment; resolves once GET /health says 200
const startEmu = (extra, env) =>
  startServer({ model: MODEL, extra, env, bin: EMU, name: 'unmask-emu', readyMs: 60000, stopGraceMs: 20000 });

// a server start expected to fail: exit code + stderr (bounded: it must not hang either)
function serveFails(mem, extra) {
  const r = spawnSync(EMU, ['serve', '--store', 'memory', '--model', MODEL, '--host', '127.0.0.1', '--port', '0', '--web-root',
    path.join(SRC, 'web'), '--device', 'cuda:0', ...extra], {
    encoding: 'utf8', timeout: 60000, env: { ...process.env, UNMASK_EMU_MEM_BYTES: String(mem), UNMASK_EMU_DEVICES: '1' },
  });
  return r;
}

function gib(msg, what) {
  const m = msg.match(new RegExp(`${what} ([0-9.]+) GiB`));
  assert.ok(m, `"${what} N GiB" in: ${msg}`);
  return Number(m[1]);
}

test('too little GPU memory: a clear "does not fit" error before any upload, exit 1', { skip: NO_EMU }, () => {
  const r = serveFails(400 * MiB, []);
  assert.equal(r.status, 1, `exit code; stderr: ${r.stderr}`);
  assert.equal(r.signal, null, 'not killed by a signal (no crash)');
  const line = r.stderr.split('\n').find((l) => l.startsWith('error: '));
  assert.ok(line, `an error line: ${r.stderr}`);
  assert.match(line, /^error: engine 0 \(--max-batch 8 x --max-seq 1024\): model does not fit on cuda:0 \(.*\): needs [0-9.]+ GiB \(weights [0-9.]+ GiB bf16 \+ activations [0-9.]+ GiB \+ [0-9.]+ GiB reserve\) but [0-9.]+ GiB of 0\.39 GiB are free; the activations include [0-9.]+ GiB of KV caches for 16384 positions$/);
  assert.doesNotMatch(r.stderr, /uploading weights/, 'nothing was uploaded');
  assert.doesNotMatch(r.stderr, /fatal|CUDA_CHECK/, 'no abort');
});

test('activations are sized from --max-batch x --max-seq', { skip: NO_EMU }, async () => {
  const mem = 1024 * MiB;
  const big = serveFails(mem, ['--max-batch', '512']);
  assert.equal(big.status, 1, `--max-batch 512 must not fit in 1 GiB; stderr: ${big.stderr}`);
  assert.match(big.stderr, /--max-batch 512 x --max-seq 1024\): model does not fit/);
  // the largest step: 512 slots x 1024 tokens, doubled because a classifier-free-guidance request
  // (cfg_scale > 0) forwards its unconditional canvas too: 1048576 tokens x (2*64 + 2*64 + 2*64 +
  // 2*176 + 176: gate|up joined, their product twice the MLP width) bf16 elements = 1.78 GiB, + one
  // LM-head chunk. (Sized for 524288 tokens, a full batch of
  // CFG requests would outgrow what the check guaranteed and abort on a GPU allocation.) Every one
  // of those canvas positions may hold a KV cache too (any request may ask for one): 2 layers x K,V x
  // 64 x bf16 = 512 bytes each, 0.5 GiB, counted in the activations.
  const act = gib(big.stderr, 'activations');
  assert.ok(act >= 2.28 && act < 2.40, `activations ${act} GiB for 2 x 524288 tokens of the tiny model + KV`);
  assert.match(big.stderr, /the activations include 0\.50 GiB of KV caches for 1048576 positions/);
  // the same batch with --max-seq 64 fits and serves
  const srv = await startEmu(['--device', 'cuda:0', '--max-batch', '512', '--max-seq', '64'],
    { UNMASK_EMU_MEM_BYTES: String(mem), UNMASK_EMU_DEVICES: '1' });
  try {
    assert.match(srv.stderr, /cuda:0: [0-9.]+ GiB weights \+ [0-9.]+ GiB activations \(65536 tokens per forward; [0-9.]+ GiB of it KV caches for 65536 positions\) fit/);
    assert.equal((await srv.stats()).topology.max_seq, 64);
  } finally {
    assert.equal((await srv.stop()).code, 0);
  }
});

test('--gpus 0,1 on two emulated GPUs: two replicas answer', { skip: NO_EMU }, async () => {
  const srv = await startEmu(['--gpus', '0,1'], { UNMASK_EMU_MEM_BYTES: String(1024 * MiB), UNMASK_EMU_DEVICES: '2' });
  try {
    const st = await srv.stats();
    assert.deepEqual(st.topology, { devices: 'cuda:0,cuda:1', replicas: 2, tp: 1, nnodes: 1, max_seq: 1024 });
    assert.equal(st.scheduler.engines, 2);
    const body = { prompt: [5, 6, 7], max_tokens: 8, block_length: 8, steps: 2, temperature: 0 };
    const rs = await Promise.all([0, 1, 2].map(() => fetch(`${srv.base}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
    }).then(async (r) => ({ status: r.status, json: await r.json() }))));
    for (const r of rs) {
      assert.equal(r.status, 200, JSON.stringify(r.json));
      assert.equal(r.json.choices[0].finish_reason, 'length');
      assert.equal(r.json.usage.completion_tokens, 8);
    }
    // both replicas hold the same model: the same prompt gives the same answer at temperature 0
    assert.equal(new Set(rs.map((r) => r.json.choices[0].text)).size, 1);
    assert.match(srv.stderr, /loaded .* 2 replicas x tp 1/);
  } finally {
    assert.equal((await srv.stop()).code, 0);
  }
});
